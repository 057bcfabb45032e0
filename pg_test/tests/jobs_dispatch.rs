//! Job dispatch across real sessions: per-actor capacity and identity
//! single-flight hold with concurrent dispatchers whose transactions
//! overlap; lane FIFO seen through dispatch with concurrent producers.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static CREATE: Mutex<()> = Mutex::new(());

fn new_db(name: &str) -> TestDb {
    let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    TestDb::new(name)
}

/// Runs `dispatchers` sessions for `run_for`: each repeatedly, in one
/// transaction, dispatches up to 5 jobs, holds them 30 ms (so transactions
/// overlap), commits, then completes them. A monitor samples how many jobs of
/// `watch_sql` run at once; returns (max seen, jobs dispatched).
fn hammer(
    db: &TestDb,
    queue: &str,
    dispatchers: usize,
    run_for: Duration,
    watch_sql: &str,
) -> (i64, i64) {
    let stop = Arc::new(AtomicBool::new(false));
    let dispatched = Arc::new(AtomicI64::new(0));
    let mut threads = Vec::new();
    for w in 0..dispatchers {
        let mut c = db.connect();
        let stop = stop.clone();
        let dispatched = dispatched.clone();
        let queue = queue.to_string();
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut tx = c.transaction().unwrap();
                let rows = tx
                    .query(
                        "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY[$1], 5, $2)",
                        &[&queue, &format!("w{w}")],
                    )
                    .unwrap();
                std::thread::sleep(Duration::from_millis(30));
                tx.commit().unwrap();
                dispatched.fetch_add(rows.len() as i64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
                let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                let toks: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
                if !ids.is_empty() {
                    c.query_one("SELECT pgque.complete_many($1, $2)", &[&ids, &toks])
                        .unwrap();
                }
            }
        }));
    }
    let mut mon = db.connect();
    let start = Instant::now();
    let mut max_seen = 0i64;
    while start.elapsed() < run_for {
        let n: i64 = mon.query_one(watch_sql, &[]).unwrap().get(0);
        max_seen = max_seen.max(n);
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    (max_seen, dispatched.load(Ordering::Relaxed))
}

fn enqueue(c: &mut Client, queue: &str, n: i32, actor: Option<&str>, identity: Option<&str>) {
    c.query_one(
        "SELECT count(*) FROM pgque.enqueue_ready_rows($1,
             (SELECT array_agg('k' || i ORDER BY i) FROM generate_series(1, $2) i),
             (SELECT array_agg('{}'::jsonb) FROM generate_series(1, $2) i),
             actors => (SELECT array_agg($3::text) FROM generate_series(1, $2) i),
             identity_keys => (SELECT array_agg($4::text) FROM generate_series(1, $2) i))",
        &[&queue, &n, &actor, &identity],
    )
    .unwrap();
}

#[test]
fn jobs_actor_capacity_holds_under_concurrent_dispatchers() {
    let db = new_db("jobs_capacity");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_job_queue('cap');
         SELECT pgque.set_actor_capacity('acme', 3);",
    )
    .unwrap();
    enqueue(&mut c, "cap", 400, Some("acme"), None);
    enqueue(&mut c, "cap", 400, Some("free"), None);
    let (max_seen, dispatched) = hammer(
        &db,
        "cap",
        4,
        Duration::from_secs(3),
        "SELECT count(*) FROM pgque.jobs WHERE actor = 'acme' AND state = 'running'",
    );
    assert!(
        max_seen <= 3,
        "acme had {max_seen} jobs running at once (cap 3)"
    );
    assert!(
        max_seen >= 1,
        "acme never ran: the test did not exercise the cap"
    );
    assert!(dispatched > 20, "only {dispatched} jobs dispatched");
    // The counter agrees with the jobs once everyone is done.
    let (counter, actual): (i32, i64) = {
        let r = c
            .query_one(
                "SELECT (SELECT running FROM pgque.job_actors WHERE actor = 'acme'),
                        (SELECT count(*) FROM pgque.jobs WHERE actor = 'acme' AND state = 'running')",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(counter as i64, actual);
    assert_eq!(actual, 0);
}

#[test]
fn jobs_identity_single_flight_under_concurrent_dispatchers() {
    let db = new_db("jobs_identity");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('idq')")
        .unwrap();
    enqueue(&mut c, "idq", 200, None, Some("user:42"));
    enqueue(&mut c, "idq", 200, None, None);
    let (max_seen, dispatched) = hammer(
        &db,
        "idq",
        4,
        Duration::from_secs(3),
        "SELECT count(*) FROM pgque.jobs WHERE identity_key = 'user:42' AND state = 'running'",
    );
    assert!(max_seen <= 1, "{max_seen} jobs of one identity ran at once");
    assert!(dispatched > 20, "only {dispatched} jobs dispatched");
    let left: i64 = c
        .query_one("SELECT count(*) FROM pgque.job_running_identities", &[])
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

#[test]
fn jobs_dispatch_order_follows_lane_commit_order() {
    let db = new_db("jobs_dispatch_fifo");
    let mut admin = db.connect();
    admin
        .batch_execute("SELECT pgque.create_job_queue('df')")
        .unwrap();
    // Producer A takes the lane and holds it; B's batch waits, then commits
    // after A. Dispatch must return A's jobs first, then B's, each in order.
    let mut a = db.connect();
    a.batch_execute("BEGIN").unwrap();
    a.batch_execute(
        "SELECT count(*) FROM pgque.enqueue_ready_rows('df', ARRAY['a1','a2','a3'], ARRAY['{}','{}','{}']::jsonb[])",
    )
    .unwrap();
    let mut b = db.connect();
    let b_thread = std::thread::spawn(move || {
        b.batch_execute(
            "SELECT count(*) FROM pgque.enqueue_ready_rows('df', ARRAY['b1','b2'], ARRAY['{}','{}']::jsonb[])",
        )
        .unwrap();
    });
    std::thread::sleep(Duration::from_millis(300));
    // Nothing is dispatchable before A commits.
    let none = admin
        .query("SELECT kind FROM pgque.dispatch(ARRAY['df'], 10, 'w')", &[])
        .unwrap();
    assert!(none.is_empty());
    a.batch_execute("COMMIT").unwrap();
    b_thread.join().unwrap();
    let kinds: Vec<String> = admin
        .query("SELECT kind FROM pgque.dispatch(ARRAY['df'], 10, 'w')", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(kinds, vec!["a1", "a2", "a3", "b1", "b2"]);
}
