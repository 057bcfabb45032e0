//! Job outputs, progress and cancellation across real sessions and the job
//! log's rotation: an output lives exactly as long as its job (its log
//! segment, or its pgque.jobs row), progress survives the evacuation of a
//! running claim, and a cancel committed by an admin session is what the
//! worker's session sees on its next call.
//!
//! Every test stops its database's pgque worker first, so rotation and
//! pruning happen only where the test runs them.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::Mutex;
use std::time::{Duration, Instant};

static CREATE: Mutex<()> = Mutex::new(());

fn new_db(name: &str) -> TestDb {
    let db = {
        let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        TestDb::new(name)
    };
    stop_worker(&mut db.connect());
    db
}

/// `rotate_job_log()` until it is not busy (up to 10 s): (switched, truncated, evacuated).
fn rotate(c: &mut Client) -> (bool, Option<i16>, i32) {
    let start = Instant::now();
    loop {
        let r = c
            .query_one("SELECT * FROM pgque.rotate_job_log()", &[])
            .unwrap();
        if !r.get::<_, bool>(3) || start.elapsed() > Duration::from_secs(10) {
            return (r.get(0), r.get(1), r.get(2));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// state, output, progress and store of a job as get_job shows it ("none"
/// when there is no such job).
fn shown(c: &mut Client, id: i64) -> String {
    c.query_opt(
        "SELECT state || ' ' || COALESCE(output::text, '-') || ' ' || COALESCE(progress::text, '-')
                || ' ' || stored_in FROM pgque.get_job($1)",
        &[&id],
    )
    .unwrap()
    .map(|r| r.get(0))
    .unwrap_or_else(|| "none".into())
}

fn call_bool(c: &mut Client, sql: &str, id: i64, token: i64) -> bool {
    c.query_one(sql, &[&id, &token]).unwrap().get(0)
}

#[test]
fn jobs_outputs_live_as_long_as_their_job() {
    let db = new_db("jout_retention");
    let mut c = db.connect();
    c.batch_execute(
        "SET pgque.job_log_rotation_period = 0;
         SELECT pgque.create_job_queue('rq');
         SELECT count(*) FROM pgque.enqueue_ready_rows('rq', ARRAY['a', 'b'], ARRAY['{}', '{}']::jsonb[]);",
    )
    .unwrap();
    let rows = c
        .query(
            "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['rq'], 2, 'w', interval '1 hour')",
            &[],
        )
        .unwrap();
    let (a, ta): (i64, i64) = (rows[0].get(0), rows[0].get(1));
    let (b, tb): (i64, i64) = (rows[1].get(0), rows[1].get(1));
    assert!(call_bool(
        &mut c,
        "SELECT pgque.complete($1, $2, '{\"r\": \"a\"}')",
        a,
        ta
    ));
    assert!(call_bool(
        &mut c,
        "SELECT pgque.set_progress($1, $2, '{\"p\": 1}')",
        b,
        tb
    ));
    assert_eq!(shown(&mut c, a), r#"completed {"r": "a"} - log"#);
    // sealed, within retention: the output is still there
    assert_eq!(rotate(&mut c), (true, None, 0), "seal segment 0");
    assert_eq!(shown(&mut c, a), r#"completed {"r": "a"} - log"#);
    assert_eq!(shown(&mut c, b), r#"running - {"p": 1} log"#);
    // past retention: segment 0 is truncated with a's done row; b, still
    // running, is evacuated into pgque.jobs with its progress
    c.batch_execute(
        "UPDATE pgque.job_log_segments SET sealed_at = now() - interval '400 days' WHERE seg = 0",
    )
    .unwrap();
    let (_, truncated, evacuated) = rotate(&mut c);
    assert_eq!((truncated, evacuated), (Some(0), 1));
    assert_eq!(shown(&mut c, a), "none", "a's output went with its job");
    assert_eq!(shown(&mut c, b), r#"running - {"p": 1} jobs"#);
    // b completes under its old token, in pgque.jobs, with an output that
    // is pruned with the job
    assert!(call_bool(
        &mut c,
        "SELECT pgque.complete($1, $2, '\"b\"')",
        b,
        tb
    ));
    assert_eq!(shown(&mut c, b), r#"completed "b" {"p": 1} jobs"#);
    c.batch_execute("SELECT pgque.prune_jobs()").unwrap();
    assert_eq!(
        shown(&mut c, b),
        r#"completed "b" {"p": 1} jobs"#,
        "kept within retention"
    );
    c.execute(
        "UPDATE pgque.jobs SET finished_at = now() - interval '400 days' WHERE id = $1",
        &[&b],
    )
    .unwrap();
    c.batch_execute("SELECT pgque.prune_jobs()").unwrap();
    assert_eq!(shown(&mut c, b), "none", "b's output went with its job");
}

#[test]
fn jobs_a_cancel_from_another_session_is_seen_by_the_worker() {
    let db = new_db("jout_cancel");
    let mut admin = db.connect();
    let mut worker = db.connect();
    admin
        .batch_execute(
            "SELECT pgque.create_job_queue('cq');
             SELECT count(*) FROM pgque.enqueue_ready_rows('cq', ARRAY['a', 'b'], ARRAY['{}', '{}']::jsonb[]);",
        )
        .unwrap();
    let rows = worker
        .query(
            "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['cq'], 2, 'w', interval '1 hour')",
            &[],
        )
        .unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    let toks: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
    assert!(call_bool(
        &mut worker,
        "SELECT pgque.set_progress($1, $2, '1')",
        ids[0],
        toks[0]
    ));
    let cancelled: bool = admin
        .query_one("SELECT pgque.cancel($1)", &[&ids[0]])
        .unwrap()
        .get(0);
    assert!(cancelled);
    let beat: Vec<i64> = worker
        .query(
            "SELECT job_id FROM pgque.heartbeat($1, $2, interval '1 minute') ORDER BY 1",
            &[&ids, &toks],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        beat,
        vec![ids[1]],
        "the heartbeat leaves the cancelled job out"
    );
    assert!(!call_bool(
        &mut worker,
        "SELECT pgque.set_progress($1, $2, '2')",
        ids[0],
        toks[0]
    ));
    assert!(!call_bool(
        &mut worker,
        "SELECT pgque.complete($1, $2, '\"late\"')",
        ids[0],
        toks[0]
    ));
    assert!(call_bool(
        &mut worker,
        "SELECT pgque.complete($1, $2, '\"ok\"')",
        ids[1],
        toks[1]
    ));
    assert_eq!(shown(&mut admin, ids[0]), "cancelled - 1 jobs");
    assert_eq!(shown(&mut admin, ids[1]), r#"completed "ok" - log"#);
}
