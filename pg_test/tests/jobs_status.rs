//! job_queue_status (what pgque.metrics() reports for job queues) counts the
//! job log by its rows' job counts (`n` of claims and done rows), not by
//! unpacking jobs. Across real sessions with real commits (producers,
//! dispatchers completing whole claims, parts of claims and single jobs,
//! failures retried until the jobs are dead, abandoned leases rescued,
//! rotation truncating segments), every figure it shows must equal a recount
//! from the raw rows (pgque.all_jobs, which unpacks every job, and the done
//! rows' job-id arrays for the completed count), read in the same statement,
//! at every check while the load runs and after it.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static CREATE: Mutex<()> = Mutex::new(());

/// A fresh database with its worker stopped (the test runs the duties).
fn new_db(name: &str) -> TestDb {
    let db = {
        let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        TestDb::new(name)
    };
    stop_worker(&mut db.connect());
    db
}

/// job_queue_status as all_jobs counts it (0.4.0's definition of the view).
const REFERENCE: &str = "SELECT q.queue_name, q.mode, q.paused,
        count(j.id) FILTER (WHERE j.state = 'scheduled'),
        count(j.id) FILTER (WHERE j.state = 'ready'),
        count(j.id) FILTER (WHERE j.state = 'running'),
        count(j.id) FILTER (WHERE j.state = 'completed'),
        count(j.id) FILTER (WHERE j.state = 'failed'),
        count(j.id) FILTER (WHERE j.state = 'cancelled'),
        now() - min(j.run_at) FILTER (WHERE j.state = 'ready'),
        count(DISTINCT (j.priority, j.shard)) FILTER (WHERE j.state IN ('waiting', 'scheduled', 'ready', 'running')),
        count(j.id) FILTER (WHERE j.state = 'waiting')
    FROM pgque.job_queues q LEFT JOIN pgque.all_jobs j ON j.queue = q.queue_name
    GROUP BY q.queue_name, q.mode, q.paused";

/// One statement (one snapshot): how many rows of job_queue_status differ
/// from the recount (all_jobs, with `completed` recounted from the raw done
/// rows' job-id arrays, see below); whether its `completed` also equals
/// all_jobs'; and the figures (scheduled/ready/running/completed/failed) of
/// queue `cs`, shown and recounted.
///
/// all_jobs lists a job only while its log row exists, but a job's claim
/// and done rows can be in a later segment than its log row: once the log
/// row's segment is truncated, the job is gone from all_jobs and still
/// counted completed by job_queue_status (as it was before 0.7.0 counted
/// them by their arrays), until the done row's segment goes too.
fn compare(c: &mut Client) -> (i64, bool, String) {
    let r = c
        .query_one(
            &format!(
                "WITH v AS MATERIALIZED (SELECT * FROM pgque.job_queue_status),
                      r (queue_name, mode, paused, scheduled, ready, running, completed, failed,
                         cancelled, oldest_ready_age, lanes, waiting) AS MATERIALIZED ({REFERENCE}),
                      done AS MATERIALIZED (
                          SELECT l.queue, count(*) AS n
                          FROM pgque.job_done d
                          JOIN pgque.job_claims c ON c.claim_id = d.claim_id
                          JOIN pgque.job_lanes l ON l.lane_id = c.lane_id
                          CROSS JOIN LATERAL unnest(d.job_ids) AS j(id)
                          WHERE d.kind = 'c' AND c.state <> 's'
                          GROUP BY l.queue),
                      raw AS MATERIALIZED (
                          SELECT r.queue_name, r.mode, r.paused, r.scheduled, r.ready, r.running,
                                 COALESCE((SELECT done.n FROM done WHERE done.queue = r.queue_name), 0)
                                 + (SELECT count(*) FROM pgque.jobs s
                                    WHERE s.queue = r.queue_name AND s.state = 'completed') AS completed,
                                 r.failed, r.cancelled, r.oldest_ready_age, r.lanes, r.waiting
                          FROM r)
                 SELECT (SELECT count(*) FROM ((SELECT * FROM raw EXCEPT SELECT * FROM v)
                                               UNION ALL (SELECT * FROM v EXCEPT SELECT * FROM raw)) d),
                        NOT EXISTS (SELECT 1 FROM v JOIN r USING (queue_name) WHERE v.completed <> r.completed),
                        (SELECT concat_ws('/', scheduled, ready, running, completed, failed)
                           FROM v WHERE queue_name = 'cs')
                          || ' (recount ' || (SELECT concat_ws('/', scheduled, ready, running, completed, failed)
                                               FROM raw WHERE queue_name = 'cs')
                          || ', all_jobs completed ' || (SELECT completed FROM r WHERE queue_name = 'cs') || ')'"
            ),
            &[],
        )
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// (scheduled, ready, running, completed, failed) of queue `cs`.
fn figures(c: &mut Client) -> [i64; 5] {
    let r = c
        .query_one(
            "SELECT scheduled, ready, running, completed, failed FROM pgque.job_queue_status
             WHERE queue_name = 'cs'",
            &[],
        )
        .unwrap();
    [r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)]
}

#[test]
fn job_status_under_concurrent_completers_retries_and_rotation_equals_a_recount() {
    let db = new_db("jstatus_concurrent");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('cs')")
        .unwrap();
    let producing = Arc::new(AtomicBool::new(true));
    let workers_left = Arc::new(AtomicUsize::new(3));
    let deadline = Instant::now() + Duration::from_secs(120);
    // producers: batches of 20 jobs of at most 2 attempts, for 4 s
    let mut producers = Vec::new();
    for p in 0..2 {
        let mut pc = db.connect();
        producers.push(std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(4);
            while Instant::now() < until {
                pc.batch_execute(&format!(
                    "SELECT count(*) FROM pgque.enqueue_ready_rows('cs',
                         array_fill('p{p}'::text, ARRAY[20]), array_fill('{{}}'::jsonb, ARRAY[20]),
                         max_attempts => array_fill(2, ARRAY[20]))"
                ))
                .unwrap();
                std::thread::sleep(Duration::from_millis(15));
            }
        }));
    }
    // workers: dispatch up to 25 jobs; per job by id % 10: 0 fails (retried
    // once, then dead), 1 completes alone, 2 is left running under its
    // hour-long lease; the rest complete together. Every 6th dispatch is
    // abandoned under a 200 ms lease, for the rescue.
    let mut ws = Vec::new();
    for w in 0..3 {
        let mut wc = db.connect();
        let producing = producing.clone();
        let left = workers_left.clone();
        ws.push(std::thread::spawn(move || {
            let mut calls = 0usize;
            let mut idle = 0;
            while Instant::now() < deadline {
                calls += 1;
                let lease = if calls.is_multiple_of(6) { "200 ms" } else { "1 hour" };
                let jobs: Vec<(i64, i64)> = wc
                    .query(
                        "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['cs'], 25, $1, $2::text::interval)",
                        &[&format!("w{w}"), &lease],
                    )
                    .unwrap()
                    .iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect();
                if jobs.is_empty() {
                    if !producing.load(Ordering::SeqCst) {
                        idle += 1;
                        // rescued and retried jobs come back after the
                        // rescue runs: give them a few rounds
                        if idle > 20 {
                            break;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(25));
                    continue;
                }
                idle = 0;
                if lease == "200 ms" {
                    continue;
                }
                let (mut ids, mut toks) = (vec![], vec![]);
                for &(id, tok) in &jobs {
                    match id % 10 {
                        0 => {
                            wc.execute(
                                "SELECT pgque.fail($1, $2, 'boom', clock_timestamp())",
                                &[&id, &tok],
                            )
                            .unwrap();
                        }
                        1 => {
                            wc.execute("SELECT pgque.complete($1, $2)", &[&id, &tok])
                                .unwrap();
                        }
                        2 => {}
                        _ => {
                            ids.push(id);
                            toks.push(tok);
                        }
                    }
                }
                if !ids.is_empty() {
                    wc.execute("SELECT pgque.complete_many($1, $2)", &[&ids, &toks])
                        .unwrap();
                }
            }
            left.fetch_sub(1, Ordering::SeqCst);
            calls
        }));
    }
    // this thread: the duties (rescue, promotion, rotation with truncation
    // of every sealed segment it can), and the comparison, until the
    // workers stop
    let mut rot = db.connect();
    rot.batch_execute("SET pgque.job_log_rotation_period = 0")
        .unwrap();
    let (mut checks, mut truncated, mut rescued) = (0, 0, 0i64);
    let mut seen_running = false;
    // checks where completed was above all_jobs' (after truncations)
    let mut apart = 0;
    while workers_left.load(Ordering::SeqCst) > 0 {
        assert!(Instant::now() < deadline, "the load did not finish");
        if !producers.is_empty() && producers.iter().all(|t| t.is_finished()) {
            producers.drain(..).for_each(|t| t.join().unwrap());
            producing.store(false, Ordering::SeqCst);
        }
        rescued += rot
            .query_one("SELECT pgque.rescue_expired_leases()", &[])
            .unwrap()
            .get::<_, i32>(0) as i64;
        rescued += rot
            .query_one("SELECT rescued FROM pgque.job_maint()", &[])
            .unwrap()
            .get::<_, i32>(0) as i64;
        let t: Option<i16> = rot
            .query_one("SELECT truncated FROM pgque.rotate_job_log()", &[])
            .unwrap()
            .get(0);
        truncated += t.is_some() as usize;
        rot.batch_execute(
            "UPDATE pgque.job_log_segments SET sealed_at = now() - interval '2 days'
             WHERE sealed_at IS NOT NULL",
        )
        .unwrap();
        let (diff, same_completed, shown) = compare(&mut c);
        assert_eq!(diff, 0, "check {checks}: job_queue_status {shown}");
        // until a segment is truncated, all_jobs agrees on completed too
        assert!(
            same_completed || truncated > 0,
            "check {checks} (no truncation yet): job_queue_status {shown}"
        );
        apart += !same_completed as usize;
        seen_running |= figures(&mut c)[2] > 0;
        checks += 1;
        std::thread::sleep(Duration::from_millis(30));
    }
    let calls: usize = ws.into_iter().map(|t| t.join().unwrap()).sum();
    // the last abandoned leases and retries, settled
    std::thread::sleep(Duration::from_millis(250));
    rot.batch_execute("SELECT pgque.rescue_expired_leases(); SELECT * FROM pgque.job_maint()")
        .unwrap();
    let (diff, _, shown) = compare(&mut c);
    assert_eq!(diff, 0, "after the load: job_queue_status {shown}");
    let [_, _, running, completed, failed] = figures(&mut c);
    println!(
        "{checks} checks during {calls} dispatches; {truncated} truncations, {rescued} rescued; \
         {apart} checks with completed jobs whose log row was truncated; at the end {shown}"
    );
    assert!(checks >= 3, "only {checks} checks ran during the load");
    assert!(truncated >= 1, "no segment was truncated");
    assert!(rescued >= 1, "no abandoned lease was rescued");
    assert!(seen_running && running > 0, "no job was counted running");
    assert!(completed > 0, "no job was counted completed");
    assert!(failed > 0, "no job was counted failed (dead)");
    // the counts the view sums are the rows' own
    let wrong: i64 = c
        .query_one(
            "SELECT (SELECT count(*) FROM pgque.job_claims WHERE n IS DISTINCT FROM cardinality(job_ids))
                  + (SELECT count(*) FROM pgque.job_done WHERE n IS DISTINCT FROM cardinality(job_ids))",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        wrong, 0,
        "claim and done rows whose n is not their job count"
    );
}
