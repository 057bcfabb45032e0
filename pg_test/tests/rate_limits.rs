//! Rate limits across real sessions (src/jobs/rate.rs): 4 dispatchers in
//! tight loops never start more than the token bucket allows in any window,
//! per queue (the job log) and per actor (pgque.jobs); the jobs held back
//! keep their order; and the bucket table stays bounded under a held xmin.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

static CREATE: Mutex<()> = Mutex::new(());

fn new_db(name: &str) -> TestDb {
    let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    TestDb::new(name)
}

fn enqueue(c: &mut Client, queue: &str, n: i32, actor: Option<&str>) {
    c.query_one(
        "SELECT count(*) FROM pgque.enqueue_ready_rows($1,
             (SELECT array_agg('k' || i ORDER BY i) FROM generate_series(1, $2) i),
             (SELECT array_agg('{}'::jsonb) FROM generate_series(1, $2) i),
             actors => (SELECT array_agg($3::text) FROM generate_series(1, $2) i))",
        &[&queue, &n, &actor],
    )
    .unwrap();
}

/// A dispatch call that claimed jobs: its transaction time (s), which is
/// the statement time dispatch refills the bucket at; when it ended (s),
/// after which it cannot have read the bucket; the jobs.
type Call = (f64, f64, Vec<i64>);

/// 4 sessions dispatch from `queue` (up to 3 jobs a call, autocommit) for
/// `secs`; returns every call that claimed jobs, by start time.
fn hammer(db: &TestDb, queue: &str, secs: u64) -> Vec<Call> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for w in 0..4 {
        let mut c = db.connect();
        let stop = stop.clone();
        let queue = queue.to_string();
        threads.push(std::thread::spawn(move || {
            let mut calls = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = c
                    .query_one(
                        "SELECT extract(epoch FROM now())::float8,
                                COALESCE(array_agg(d.job_id), '{}'),
                                extract(epoch FROM clock_timestamp())::float8
                         FROM pgque.dispatch(ARRAY[$1], 3, $2) d",
                        &[&queue, &format!("w{w}")],
                    )
                    .unwrap();
                let ids: Vec<i64> = r.get(1);
                if !ids.is_empty() {
                    calls.push((r.get::<_, f64>(0), r.get::<_, f64>(2), ids));
                }
            }
            calls
        }));
    }
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<Call> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    all
}

/// The calls that started in any window [t_i, t_j] took at most
/// burst + rate * (e - t_i) jobs, e the latest end among them: a call
/// refills the bucket up to its own start or, when it waited for the lock,
/// up to the start of the call it waited for, which is before its end.
/// Returns the jobs started.
fn check_windows(calls: &[Call], rate: f64, burst: f64) -> usize {
    for i in 0..calls.len() {
        let mut n = 0usize;
        let mut end = f64::MIN;
        for j in i..calls.len() {
            n += calls[j].2.len();
            end = end.max(calls[j].1);
            let allowed = burst + rate * (end - calls[i].0);
            assert!(
                n as f64 <= allowed + 1e-6,
                "{n} jobs started in {:.3} s; the bucket allows {allowed:.2}",
                end - calls[i].0
            );
        }
    }
    calls.iter().map(|c| c.2.len()).sum()
}

#[test]
fn rate_limit_holds_per_window_under_4_dispatchers() {
    let db = new_db("rate_queue");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('rl')")
        .unwrap();
    enqueue(&mut c, "rl", 2000, None);
    // 20 per second, bursts of 5
    c.batch_execute("SELECT pgque.set_rate_limit('rl', 20, '1 second', 5)")
        .unwrap();
    let calls = hammer(&db, "rl", 4);
    let started = check_windows(&calls, 20.0, 5.0);
    // ... and the limit is what holds them back, not a stall: at least 3 of
    // the 4 seconds' worth started
    assert!(started >= 60, "only {started} jobs started in 4 s");
    // held-back jobs keep their order: what started is the queue's head
    assert_head(&mut c, "rl", &calls);
    eprintln!("queue limit: {started} jobs in {} calls", calls.len());
}

#[test]
fn actor_rate_limit_holds_per_window_under_4_dispatchers() {
    let db = new_db("rate_actor");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_job_queue('ra');
         SELECT pgque.set_actor_rate_limit('acme', 20, '1 second', 5);",
    )
    .unwrap();
    enqueue(&mut c, "ra", 2000, Some("acme"));
    let calls = hammer(&db, "ra", 4);
    let started = check_windows(&calls, 20.0, 5.0);
    assert!(started >= 60, "only {started} jobs started in 4 s");
    assert_head(&mut c, "ra", &calls);
    eprintln!("actor limit: {started} jobs in {} calls", calls.len());
}

/// 4 sessions dispatch `actor`'s jobs from `queue` (up to 3 a call) for
/// `secs`, each holding what it got for `hold` before completing it, so
/// that the actor's capacity `cap` binds as well as the rate limit. Each
/// call is a transaction that, after dispatch, reads the actor's `running`
/// and its running jobs: dispatch locked and updated the actor's row, so no
/// other start can commit in between and the figures include every earlier
/// one; both must stay within `cap`. Returns the calls that claimed jobs.
fn hammer_with_capacity(
    db: &TestDb,
    queue: &str,
    actor: &str,
    cap: i32,
    secs: u64,
    hold: Duration,
) -> Vec<Call> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for w in 0..4 {
        let mut c = db.connect();
        let stop = stop.clone();
        let (queue, actor) = (queue.to_string(), actor.to_string());
        threads.push(std::thread::spawn(move || {
            let mut calls = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let mut t = c.transaction().unwrap();
                let r = t
                    .query_one(
                        "SELECT extract(epoch FROM now())::float8,
                                COALESCE(array_agg(d.job_id), '{}'),
                                COALESCE(array_agg(d.lease_token), '{}'),
                                extract(epoch FROM clock_timestamp())::float8
                         FROM pgque.dispatch(ARRAY[$1], 3, $2) d",
                        &[&queue, &format!("w{w}")],
                    )
                    .unwrap();
                let ids: Vec<i64> = r.get(1);
                let tokens: Vec<i64> = r.get(2);
                if ids.is_empty() {
                    t.commit().unwrap();
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                let seen = t
                    .query_one(
                        "SELECT a.running,
                                (SELECT count(*)::int FROM pgque.all_jobs j
                                 WHERE j.queue = $1 AND j.actor = $2 AND j.state = 'running')
                         FROM pgque.job_actors a WHERE a.actor = $2",
                        &[&queue, &actor],
                    )
                    .unwrap();
                let (running, jobs_running): (i32, i32) = (seen.get(0), seen.get(1));
                t.commit().unwrap();
                assert!(
                    running <= cap && jobs_running <= cap,
                    "after a dispatch: running {running}, running jobs {jobs_running}; capacity {cap}"
                );
                calls.push((r.get::<_, f64>(0), r.get::<_, f64>(3), ids.clone()));
                std::thread::sleep(hold);
                let done: i32 = c
                    .query_one("SELECT pgque.complete_many($1, $2)", &[&ids, &tokens])
                    .unwrap()
                    .get(0);
                assert_eq!(done as usize, ids.len());
            }
            calls
        }));
    }
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<Call> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    all
}

/// The jobs `calls` started are the first ones of `queue` (held-back jobs
/// keep their order).
fn assert_head(c: &mut Client, queue: &str, calls: &[Call]) {
    let mut ids: Vec<i64> = calls.iter().flat_map(|c| c.2.clone()).collect();
    ids.sort_unstable();
    let head: Vec<i64> = c
        .query(
            "SELECT id FROM pgque.all_jobs WHERE queue = $1 ORDER BY id LIMIT $2",
            &[&queue, &(ids.len() as i64)],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, head);
}

/// A queue rate limit, an actor rate limit and the actor's capacity at once,
/// 4 dispatchers: no window starts more than the tighter bucket allows, the
/// actor never runs more than its capacity, and what started is the head.
#[test]
fn rate_limits_and_capacity_together_under_4_dispatchers() {
    let db = new_db("rate_cap");
    let mut c = db.connect();
    // queue: 20 per second, bursts of 5; actor: 30 per second, bursts of 8
    // (the queue's bucket is the tighter one; the actor's is debited too);
    // capacity 4 with jobs held 150 ms caps starts near 4 / 0.15 s = 27/s
    c.batch_execute(
        "SELECT pgque.create_job_queue('rcap');
         SELECT pgque.set_rate_limit('rcap', 20, '1 second', 5);
         SELECT pgque.set_actor_rate_limit('acme', 30, '1 second', 8);
         SELECT pgque.set_actor_capacity('acme', 4);",
    )
    .unwrap();
    enqueue(&mut c, "rcap", 2000, Some("acme"));
    let calls = hammer_with_capacity(&db, "rcap", "acme", 4, 4, Duration::from_millis(150));
    let started = check_windows(&calls, 20.0, 5.0);
    assert!(started >= 40, "only {started} jobs started in 4 s");
    assert_head(&mut c, "rcap", &calls);
    // every start was debited from both buckets: the actor's bucket holds
    // what its refill gave minus the starts, never more than its burst
    let (running, tokens): (i32, f64) = {
        let r = c
            .query_one(
                "SELECT running, tokens FROM pgque.job_actors WHERE actor = 'acme'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(running, 0, "every job was completed");
    assert!((0.0..=8.0).contains(&tokens), "actor tokens {tokens}");
    eprintln!(
        "queue + actor limits and capacity: {started} jobs in {} calls",
        calls.len()
    );
}

/// The bucket is written once per dispatch that takes jobs, in place (HOT).
/// Under a held snapshot no version can be pruned, so the table grows by at
/// most one row version per such dispatch; once the snapshot is gone, the
/// page is pruned and reused and the table stops growing. On a private
/// cluster: on the shared server another test's open transaction (held_xmin
/// holds one for 20 s) keeps the versions unprunable in the second phase too.
#[test]
fn rate_limit_bucket_stays_bounded_under_a_held_xmin() {
    let cl = Cluster::start_new("rate_xmin", "");
    let mut c = cl.create_db("rate_xmin");
    c.batch_execute(
        "SELECT pgque.create_job_queue('rx');
         SELECT pgque.set_rate_limit('rx', 1000000, '1 second');",
    )
    .unwrap();
    enqueue(&mut c, "rx", 3000, None);
    let size = |c: &mut Client| -> i64 {
        c.query_one("SELECT pg_relation_size('pgque.job_rate_limits')", &[])
            .unwrap()
            .get(0)
    };
    let dispatch = |c: &mut Client, n: usize| {
        for _ in 0..n {
            let got: i64 = c
                .query_one(
                    "SELECT count(*) FROM pgque.dispatch(ARRAY['rx'], 1, 'w')",
                    &[],
                )
                .unwrap()
                .get(0);
            assert_eq!(got, 1);
        }
    };
    let mut holder = cl.connect("rate_xmin");
    holder
        .batch_execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pgque.job_queues",
        )
        .unwrap();
    dispatch(&mut c, 1000);
    let held = size(&mut c);
    // 1000 versions of a ~70-byte row: about 9 pages, never more than 1000
    // versions' worth
    assert!(
        held <= 16 * 8192,
        "bucket table is {held} bytes after 1000 dispatches"
    );
    holder.batch_execute("COMMIT").unwrap();
    // let (auto)vacuum or pruning reclaim, then dispatch much more
    c.batch_execute("VACUUM pgque.job_rate_limits").unwrap();
    dispatch(&mut c, 1500);
    let after = size(&mut c);
    assert!(
        after <= held,
        "bucket table grew from {held} to {after} bytes without a held snapshot"
    );
    let hot: i64 = c
        .query_one(
            "SELECT n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'job_rate_limits'",
            &[],
        )
        .map(|r| r.get(0))
        .unwrap_or(-1);
    eprintln!("bucket table: {held} bytes held, {after} bytes after; hot updates {hot}");
}
