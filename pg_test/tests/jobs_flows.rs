//! Flows across real sessions: the completions of a child's last two
//! parents racing each other make it ready exactly once; a parent failing
//! while its sibling completes cancels the child exactly once; a parent
//! whose lease lapsed is rescued and its child still waits for it.
//!
//! Every test stops its database's pgque worker first, so the rescue runs
//! only where the test runs it.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

static CREATE: Mutex<()> = Mutex::new(());

fn new_db(name: &str) -> TestDb {
    let db = {
        let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        TestDb::new(name)
    };
    stop_worker(&mut db.connect());
    db
}

/// Enqueues p1, p2 -> c (p1 with `p1_attempts`); returns (p1, p2, c) ids.
fn two_parents(c: &mut Client, queue: &str, p1_attempts: i32) -> (i64, i64, i64) {
    let jobs = format!(
        r#"[{{"key": "p1", "kind": "k", "max_attempts": {p1_attempts}}},
            {{"key": "p2", "kind": "k"}},
            {{"key": "c", "kind": "k", "depends_on": ["p1", "p2"]}}]"#
    );
    let rows = c
        .query(
            "SELECT key, job_id FROM pgque.enqueue_flow($1, $2::text::jsonb)",
            &[&queue, &jobs],
        )
        .unwrap();
    let id = |k: &str| -> i64 {
        rows.iter()
            .find(|r| r.get::<_, String>(0) == k)
            .unwrap()
            .get(1)
    };
    (id("p1"), id("p2"), id("c"))
}

/// (id, token) of the ready jobs among `ids`, dispatched by `c`.
fn dispatch(c: &mut Client, queue: &str, lease: &str) -> Vec<(i64, i64)> {
    c.query(
        "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY[$1], 100, 'w', $2::text::interval) ORDER BY job_id",
        &[&queue, &lease],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

fn state(c: &mut Client, id: i64) -> String {
    c.query_one("SELECT state FROM pgque.get_job($1)", &[&id])
        .unwrap()
        .get(0)
}

/// How many job_events rows name `id` with `event`.
fn events(c: &mut Client, id: i64, event: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pgque.job_history WHERE job_id = $1 AND event = $2",
        &[&id, &event],
    )
    .unwrap()
    .get(0)
}

/// Runs `a` and `b` (each a statement with the job and token as $1, $2)
/// in two sessions, started at once (each its own transaction: the one
/// that reaches the child's row second waits for the other's commit).
fn race(db: &TestDb, a: (&'static str, i64, i64), b: (&'static str, i64, i64)) {
    let bar = Arc::new(Barrier::new(2));
    let hs: Vec<_> = [a, b]
        .into_iter()
        .map(|(sql, id, tok)| {
            let bar = bar.clone();
            let mut s = db.connect();
            std::thread::spawn(move || {
                bar.wait();
                s.execute(sql, &[&id, &tok]).unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn jobs_flow_last_two_parents_completing_at_once_ready_the_child_once() {
    let db = new_db("jflow_race");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('fr')")
        .unwrap();
    for round in 0..15 {
        let (p1, p2, child) = two_parents(&mut c, "fr", 25);
        let got = dispatch(&mut c, "fr", "1 hour");
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![p1, p2]);
        // the second completer blocks on the child's row until the first
        // commits, then sees the last parent done: exactly one readies it
        race(
            &db,
            ("SELECT pgque.complete($1, $2)", got[0].0, got[0].1),
            ("SELECT pgque.complete($1, $2)", got[1].0, got[1].1),
        );
        assert_eq!(state(&mut c, child), "ready", "round {round}");
        assert_eq!(
            events(&mut c, child, "promoted"),
            1,
            "round {round}: readied once"
        );
        let next = dispatch(&mut c, "fr", "1 hour");
        assert_eq!(
            next.iter().map(|g| g.0).collect::<Vec<_>>(),
            vec![child],
            "round {round}"
        );
        let ok: bool = c
            .query_one("SELECT pgque.complete($1, $2)", &[&next[0].0, &next[0].1])
            .unwrap()
            .get(0);
        assert!(ok);
    }
}

#[test]
fn jobs_flow_a_parent_failing_while_its_sibling_completes_cancels_the_child_once() {
    let db = new_db("jflow_fail_race");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('ff')")
        .unwrap();
    for round in 0..10 {
        let (p1, p2, child) = two_parents(&mut c, "ff", 1);
        let got = dispatch(&mut c, "ff", "1 hour");
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![p1, p2]);
        race(
            &db,
            ("SELECT pgque.fail($1, $2, 'boom')", got[0].0, got[0].1),
            ("SELECT pgque.complete($1, $2)", got[1].0, got[1].1),
        );
        assert_eq!(
            (state(&mut c, p1), state(&mut c, p2), state(&mut c, child)),
            ("failed".into(), "completed".into(), "cancelled".into()),
            "round {round}"
        );
        assert_eq!(events(&mut c, child, "cancelled"), 1, "round {round}");
        assert_eq!(events(&mut c, child, "promoted"), 0, "round {round}");
        assert!(dispatch(&mut c, "ff", "1 hour").is_empty(), "round {round}");
    }
}

#[test]
fn jobs_flow_a_lapsed_parent_is_rescued_and_its_child_waits_for_it() {
    let db = new_db("jflow_rescue");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('fl')")
        .unwrap();
    // p1 may try twice, p2 once
    let (p1, p2, child) = two_parents(&mut c, "fl", 2);
    c.execute(
        "UPDATE pgque.jobs SET max_attempts = 1 WHERE id = $1",
        &[&p2],
    )
    .unwrap();
    let got = dispatch(&mut c, "fl", "1 second");
    assert_eq!(got.len(), 2);
    std::thread::sleep(Duration::from_millis(1500));
    let rescued: i32 = c
        .query_one("SELECT pgque.rescue_expired_leases()", &[])
        .unwrap()
        .get(0);
    assert_eq!(rescued, 2);
    // p1 is ready for its second attempt; p2 failed on its last one, which
    // cancels the child
    assert_eq!(state(&mut c, p1), "ready");
    assert_eq!(state(&mut c, p2), "failed");
    assert_eq!(state(&mut c, child), "cancelled");
    // a flow whose lapsed parent comes back: the child waits, then runs
    let (q1, q2, child2) = two_parents(&mut c, "fl", 2);
    let mut got = dispatch(&mut c, "fl", "1 second");
    got.retain(|g| g.0 == q1 || g.0 == q2);
    let ok: bool = c
        .query_one("SELECT pgque.complete($1, $2)", &[&got[1].0, &got[1].1])
        .unwrap()
        .get(0);
    assert!(ok);
    std::thread::sleep(Duration::from_millis(1500));
    c.query_one("SELECT pgque.rescue_expired_leases()", &[])
        .unwrap();
    assert_eq!(state(&mut c, q1), "ready");
    assert_eq!(state(&mut c, child2), "waiting");
    // the stale worker's late completion is refused; the new attempt's counts
    let late: bool = c
        .query_one("SELECT pgque.complete($1, $2)", &[&got[0].0, &got[0].1])
        .unwrap()
        .get(0);
    assert!(!late);
    assert_eq!(state(&mut c, child2), "waiting");
    let again: Vec<(i64, i64)> = dispatch(&mut c, "fl", "1 hour")
        .into_iter()
        .filter(|g| g.0 == q1)
        .collect();
    let ok: bool = c
        .query_one("SELECT pgque.complete($1, $2)", &[&again[0].0, &again[0].1])
        .unwrap()
        .get(0);
    assert!(ok);
    assert_eq!(state(&mut c, child2), "ready");
}

/// A writer that names another queue's jobs in `enqueue(..., depends_on)`
/// and keeps its transaction open holds up nothing there: that queue's
/// dispatch of the parent's lane and the parent's completion go through at
/// once (each under a 2 s statement_timeout), and the job_maint run after
/// the writer's commit links the child, which the parent's end then makes
/// ready. The array is capped (54000).
#[test]
fn depends_on_holds_up_nothing_in_the_parents_queue() {
    let db = new_db("flows_dep_nolock");
    let mut adm = db.connect();
    adm.batch_execute(
        "SELECT pgque.create_job_queue('theirs'); SELECT pgque.create_job_queue('mine');
         SELECT pgque.enqueue('theirs', 'running-parent');
         SELECT pgque.enqueue('theirs', 'ready-parent');",
    )
    .unwrap();
    let running = dispatch(&mut adm, "theirs", "1 hour");
    assert_eq!(running.len(), 2);
    let (p_run, p_tok) = running[0];
    let (p_other, p_other_tok) = running[1];
    adm.batch_execute("SELECT pgque.enqueue('theirs', 'later')")
        .unwrap();

    let mut writer = db.connect();
    writer.batch_execute("BEGIN").unwrap();
    let child: i64 = writer
        .query_one(
            "SELECT pgque.enqueue('mine', 'child', depends_on => ARRAY[$1, $2]::bigint[])",
            &[&p_run, &p_other],
        )
        .unwrap()
        .get(0);
    // ... and stays open. Their queue's work goes on meanwhile.
    let mut them = db.connect();
    them.batch_execute("SET statement_timeout = '2s'").unwrap();
    let got = dispatch(&mut them, "theirs", "1 hour");
    assert_eq!(got.len(), 1, "the parents' lane dispatches");
    let done: bool = them
        .query_one("SELECT pgque.complete($1, $2)", &[&p_other, &p_other_tok])
        .unwrap()
        .get(0);
    assert!(
        done,
        "a parent completes while the writer's transaction is open"
    );
    let too_many = them.query_one(
        "SELECT pgque.enqueue('mine', 'k', depends_on => array_fill($1::bigint, ARRAY[10001]))",
        &[&p_run],
    );
    assert_eq!(sqlstate(too_many), "54000");
    writer.batch_execute("COMMIT").unwrap();

    // linked by the duty, it waits for the running parent only
    assert_eq!(state(&mut adm, child), "waiting");
    adm.batch_execute("SELECT pgque.job_maint()").unwrap();
    let links: i64 = adm
        .query_one("SELECT count(*) FROM pgque.job_links", &[])
        .unwrap()
        .get(0);
    assert_eq!(links, 0, "job_maint linked the child");
    assert_eq!(state(&mut adm, child), "waiting");
    let done: bool = them
        .query_one("SELECT pgque.complete($1, $2)", &[&p_run, &p_tok])
        .unwrap()
        .get(0);
    assert!(done);
    assert_eq!(state(&mut adm, child), "ready");
}
