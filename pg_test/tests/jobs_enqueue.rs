//! Job enqueue across real sessions: lane FIFO under concurrent producers that
//! commit in interleaved order, and NOTIFY once per queue per committed
//! transaction (never before commit, never on rollback).
use pgque_pg_test::postgres::fallible_iterator::FallibleIterator;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::Mutex;
use std::time::Duration;

/// CREATE EXTENSION creates the cluster-wide roles if missing; two first
/// installs racing on a fresh cluster collide on pg_authid, so this file's
/// tests create their databases one at a time.
static CREATE: Mutex<()> = Mutex::new(());

fn new_db(name: &str) -> TestDb {
    let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    TestDb::new(name)
}

fn backend_pid(c: &mut Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

/// True when session `pid` waits on an advisory lock (a lane lock).
fn waits_on_lane(obs: &mut Client, pid: i32) -> bool {
    obs.query_one(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted
                         AND locktype = 'advisory' AND objsubid = 25196)",
        &[&pid],
    )
    .unwrap()
    .get(0)
}

fn enqueue_sql(queue: &str, tag: &str, n: usize, priority: i16) -> String {
    let kinds: Vec<String> = (1..=n).map(|i| format!("'{tag}{i}'")).collect();
    let args: Vec<&str> = (0..n).map(|_| "'{}'").collect();
    let prios: Vec<String> = (0..n).map(|_| priority.to_string()).collect();
    format!(
        "SELECT count(*) FROM pgque.enqueue_ready_rows('{queue}', ARRAY[{}], ARRAY[{}]::jsonb[], ARRAY[{}]::smallint[])",
        kinds.join(","),
        args.join(","),
        prios.join(",")
    )
}

/// The lane's jobs in dispatch order (priority, id: ready_seq = id at enqueue), as kinds.
fn lane_order(c: &mut Client, queue: &str) -> Vec<String> {
    c.query(
        "SELECT kind FROM pgque.all_jobs WHERE queue = $1 AND state = 'ready' ORDER BY priority, id",
        &[&queue],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[test]
fn jobs_lane_fifo_follows_commit_order_under_concurrent_producers() {
    let db = new_db("jobs_lane_fifo");
    let mut admin = db.connect();
    admin
        .batch_execute("SELECT pgque.create_job_queue('lf')")
        .unwrap();

    // Round 1: A takes the lane first; B, which starts later, waits for A's
    // commit, then gets ids after all of A's.
    let mut a = db.connect();
    a.batch_execute("BEGIN").unwrap();
    a.batch_execute(&enqueue_sql("lf", "a", 3, 0)).unwrap();
    let mut b = db.connect();
    let b_pid = backend_pid(&mut b);
    let b_thread = std::thread::spawn(move || {
        b.batch_execute(&enqueue_sql("lf", "b", 3, 0)).unwrap();
        b
    });
    assert!(
        wait_until(Duration::from_secs(10), || waits_on_lane(&mut admin, b_pid)),
        "B should wait on the lane lock A holds"
    );
    // Another lane of the same queue is not blocked meanwhile.
    let mut c = db.connect();
    c.batch_execute(&enqueue_sql("lf", "c", 2, 1)).unwrap();
    // Nothing of A or B is visible yet; C's is.
    assert_eq!(lane_order(&mut admin, "lf"), vec!["c1", "c2"]);
    std::thread::sleep(Duration::from_millis(200));
    assert!(waits_on_lane(&mut admin, b_pid), "B must still wait");
    a.batch_execute("COMMIT").unwrap();
    let _b = b_thread.join().unwrap();
    assert_eq!(
        lane_order(&mut admin, "lf"),
        vec!["a1", "a2", "a3", "b1", "b2", "b3", "c1", "c2"]
    );

    // Round 2, the interleaving that breaks naive id order: D begins first and
    // enqueues into another lane (taking ids), E then enqueues into lane 5
    // and commits, D enqueues into lane 5 afterwards and commits last. Lane 5
    // must dispatch E's jobs first (E committed first), then D's.
    let mut d = db.connect();
    d.batch_execute("BEGIN").unwrap();
    d.batch_execute(&enqueue_sql("lf", "dx", 1, 7)).unwrap();
    let mut e = db.connect();
    e.batch_execute("BEGIN").unwrap();
    e.batch_execute(&enqueue_sql("lf", "e", 2, 5)).unwrap();
    // D now wants lane 5 while E holds it: it waits for E's commit.
    let d_pid = backend_pid(&mut d);
    let d_thread = std::thread::spawn(move || {
        d.batch_execute(&enqueue_sql("lf", "d", 2, 5)).unwrap();
        d
    });
    assert!(wait_until(Duration::from_secs(10), || waits_on_lane(
        &mut admin, d_pid
    )));
    e.batch_execute("COMMIT").unwrap();
    let mut d = d_thread.join().unwrap();
    d.batch_execute("COMMIT").unwrap();
    let lane5: Vec<String> = admin
        .query(
            "SELECT kind FROM pgque.all_jobs WHERE queue = 'lf' AND priority = 5 ORDER BY id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(lane5, vec!["e1", "e2", "d1", "d2"]);
}

fn drain_notifications(c: &mut Client, wait: Duration) -> Vec<(String, String)> {
    // A round trip makes the client read whatever the server has sent.
    c.batch_execute("SELECT 1").unwrap();
    let mut out = Vec::new();
    let mut n = c.notifications();
    let mut it = n.timeout_iter(wait);
    while let Ok(Some(note)) = it.next() {
        out.push((note.channel().to_string(), note.payload().to_string()));
    }
    out
}

#[test]
fn jobs_notify_once_per_queue_per_committed_transaction() {
    let db = new_db("jobs_notify");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT pgque.create_job_queue('nq'); SELECT pgque.create_job_queue('nq2');
             SELECT pgque.create_job_queue('nq3');",
        )
        .unwrap();
    let mut listener = db.connect();
    listener
        .batch_execute("LISTEN pgque_jobs_nq; LISTEN pgque_jobs_nq2; LISTEN pgque_jobs_nq3")
        .unwrap();
    let mut p = db.connect();
    let short = Duration::from_millis(300);

    // Several enqueues into two queues in one transaction: nothing before
    // commit, then one notification per queue.
    p.batch_execute("BEGIN").unwrap();
    p.batch_execute(&enqueue_sql("nq", "a", 3, 0)).unwrap();
    p.batch_execute("SELECT pgque.enqueue('nq', 'single')")
        .unwrap();
    p.batch_execute(&enqueue_sql("nq", "b", 2, 3)).unwrap();
    p.batch_execute(&enqueue_sql("nq2", "c", 2, 0)).unwrap();
    assert!(drain_notifications(&mut listener, short).is_empty());
    p.batch_execute("COMMIT").unwrap();
    let mut got = drain_notifications(&mut listener, Duration::from_secs(2));
    got.sort();
    assert_eq!(
        got,
        vec![
            ("pgque_jobs_nq".to_string(), String::new()),
            ("pgque_jobs_nq2".to_string(), String::new())
        ]
    );

    // A rolled-back enqueue notifies nobody.
    p.batch_execute("BEGIN").unwrap();
    p.batch_execute(&enqueue_sql("nq", "r", 2, 0)).unwrap();
    p.batch_execute("ROLLBACK").unwrap();
    assert!(drain_notifications(&mut listener, short).is_empty());

    // A batch of only future jobs wakes no dispatcher (nothing is ready yet).
    p.batch_execute(
        "SELECT * FROM pgque.enqueue_ready_rows('nq3', ARRAY['s'], ARRAY['{}']::jsonb[],
                 run_at => ARRAY[now() + interval '1 hour'])",
    )
    .unwrap();
    assert!(drain_notifications(&mut listener, short).is_empty());

    // An autocommit enqueue: exactly one.
    p.batch_execute(&enqueue_sql("nq3", "x", 5, 0)).unwrap();
    assert_eq!(
        drain_notifications(&mut listener, Duration::from_secs(2)),
        vec![("pgque_jobs_nq3".to_string(), String::new())]
    );

    // A failed attempt that is ready again at once wakes dispatchers too.
    let r = p
        .query_one(
            "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['nq3'], 1, 'w')",
            &[],
        )
        .unwrap();
    let (id, tok): (i64, i64) = (r.get(0), r.get(1));
    assert!(drain_notifications(&mut listener, short).is_empty());
    let state: String = p
        .query_one(
            "SELECT pgque.fail($1, $2, 'boom', now() - interval '1 second')",
            &[&id, &tok],
        )
        .unwrap()
        .get(0);
    assert_eq!(state, "ready");
    assert_eq!(
        drain_notifications(&mut listener, Duration::from_secs(2)),
        vec![("pgque_jobs_nq3".to_string(), String::new())]
    );
}

#[test]
fn jobs_writer_role_enqueues_but_cannot_administer() {
    let db = new_db("jobs_roles");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT pgque.create_job_queue('rq');
             DO $$ BEGIN
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jobs_test_writer') THEN
                 CREATE ROLE jobs_test_writer LOGIN;
               END IF;
             END $$;
             GRANT pgque_writer TO jobs_test_writer;",
        )
        .unwrap();
    let mut w = db.connect_as("jobs_test_writer");
    let n: i64 = w
        .query_one(&enqueue_sql("rq", "w", 2, 0), &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
    assert_eq!(
        sqlstate(w.batch_execute("SELECT pgque.create_job_queue('other')")),
        "42501"
    );
    assert_eq!(
        sqlstate(w.batch_execute("SELECT pgque.set_job_queue_config('rq', 'paused', 'true')")),
        "42501"
    );
    assert_eq!(sqlstate(w.batch_execute("DELETE FROM pgque.jobs")), "42501");
}

#[test]
fn jobs_statements_survive_drop_and_create_extension_in_one_session() {
    let db = new_db("jobs_recreate");
    let mut c = db.connect();
    for round in 0..2 {
        c.batch_execute("SELECT pgque.create_job_queue('rc')")
            .unwrap();
        let n: i64 = c
            .query_one(&enqueue_sql("rc", "r", 3, 0), &[])
            .unwrap()
            .get(0);
        assert_eq!(n, 3, "round {round}");
        let got = c
            .query(
                "SELECT job_id FROM pgque.dispatch(ARRAY['rc'], 10, 'w')",
                &[],
            )
            .unwrap();
        assert_eq!(got.len(), 3, "round {round}");
        // Same session: the kept plans of the old extension must not be used.
        c.batch_execute("DROP EXTENSION pgque; CREATE EXTENSION pgque")
            .unwrap();
    }
}
