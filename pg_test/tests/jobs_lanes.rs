//! What a writer can make the job side hold (DESIGN.md 25, docs/operations.md
//! "What a writer can make the server hold"), over real connections as roles
//! that hold only pgque_writer (producers) and pgque_reader (workers):
//! - lanes per queue are bounded (pgque.job_lanes_per_queue, which a writer
//!   cannot change); jobs of lanes past the bound are stored in pgque.jobs
//!   and dispatch still hands every job out in (priority, id) order;
//! - a dispatch locks only the lanes that have work, however many lanes its
//!   queue has;
//! - the log's rotation takes one barrier, no lane lock, and truncates while
//!   several sessions dispatch without pause, losing and repeating nothing;
//! - `enqueue(..., depends_on)` by a writer refuses a parent of another
//!   queue (42501) and changes nothing.
//!
//! Every test stops its database's pgque worker first, so rotation and
//! maintenance run only where the test runs them.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static CREATE: Mutex<()> = Mutex::new(());

/// The low 16 bits of a lane's dispatch-lock class (1785684580), as
/// pg_locks shows pgque's locks (src/locks.rs: objsubid).
const DISPATCH_LOCK_SUBID: i32 = 0x6264;

/// A fresh database with its worker stopped, and the roles the tests use:
/// `lanes_writer` (only pgque_writer), `lanes_worker` (only pgque_reader),
/// `lanes_rw` (both).
fn new_db(name: &str) -> TestDb {
    let db = {
        let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        let db = TestDb::new(name);
        let mut su = db.connect();
        for (role, attrs) in [
            ("lanes_writer", "LOGIN IN ROLE pgque_writer"),
            ("lanes_worker", "LOGIN IN ROLE pgque_reader"),
            ("lanes_rw", "LOGIN IN ROLE pgque_writer, pgque_reader"),
        ] {
            su.batch_execute(&format!(
                "DO $$ BEGIN CREATE ROLE {role} {attrs}; \
                 EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
            ))
            .unwrap();
        }
        db
    };
    stop_worker(&mut db.connect());
    db
}

/// One enqueue_ready_rows call of one job per priority in `prios` (in that
/// order), kinds `<prefix>.<i>`; returns the ids in input order.
fn enqueue_prios(c: &mut Client, queue: &str, prefix: &str, prios: &[i16]) -> Vec<i64> {
    let prios = prios.to_vec();
    c.query(
        "SELECT job_id FROM pgque.enqueue_ready_rows($1,
             (SELECT array_agg($2 || '.' || i ORDER BY i) FROM generate_series(1, cardinality($3::smallint[])) i),
             (SELECT array_agg(jsonb_build_object('i', i) ORDER BY i) FROM generate_series(1, cardinality($3::smallint[])) i),
             $3::smallint[])
         ORDER BY ord",
        &[&queue, &prefix, &prios],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// `dispatch(ARRAY[queue], limit, worker)`: (id, priority, lease token) in
/// dispatch order.
fn dispatch(c: &mut Client, queue: &str, limit: i32) -> Vec<(i64, i16, i64)> {
    c.query(
        "SELECT job_id, priority, lease_token FROM pgque.dispatch(ARRAY[$1], $2, 'w')",
        &[&queue, &limit],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn complete(c: &mut Client, jobs: &[(i64, i16, i64)]) -> i32 {
    let ids: Vec<i64> = jobs.iter().map(|j| j.0).collect();
    let toks: Vec<i64> = jobs.iter().map(|j| j.2).collect();
    c.query_one("SELECT pgque.complete_many($1, $2)", &[&ids, &toks])
        .unwrap()
        .get(0)
}

fn count(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// This session's locks of lanes' dispatch class (pgque's own advisory locks).
fn lane_locks(c: &mut Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' \
         AND objsubid = $1::int",
        &[&DISPATCH_LOCK_SUBID],
    )
    .unwrap()
    .get(0)
}

/// A writer enqueueing into more (priority) lanes than the bound gets the
/// bound: lanes up to pgque.job_lanes_per_queue (64) are made, a batch that
/// would need one more is stored in pgque.jobs whole, a batch of existing
/// lanes still goes to the log. A worker then dispatching the queue in
/// small calls gets every job once, in (priority, id) order across both
/// stores. The writer cannot raise the bound (42501).
#[test]
fn jobs_lanes_past_the_bound_go_to_pgque_jobs_in_dispatch_order() {
    let db = new_db("jlanes_bound");
    let mut su = db.connect();
    su.batch_execute("SELECT pgque.create_job_queue('lq')")
        .unwrap();
    let mut w = db.connect_as("lanes_writer");
    let mut all: Vec<i64> = vec![];
    // lanes 1..40, then 41..63: with priority 0's lane, 64 lanes
    all.extend(enqueue_prios(
        &mut w,
        "lq",
        "a",
        &(1..=40).collect::<Vec<_>>(),
    ));
    all.extend(enqueue_prios(
        &mut w,
        "lq",
        "b",
        &(41..=63).collect::<Vec<_>>(),
    ));
    let lanes = |su: &mut Client| {
        count(
            su,
            "SELECT count(*) FROM pgque.job_lanes WHERE queue = 'lq'",
        )
    };
    assert_eq!(lanes(&mut su), 64);
    // priorities across the whole range, some twice, in a scrambled order
    // (under 4 x max_locks_per_transaction distinct ones: one transaction's
    // lane locks are bounded, bounds.rs): new lanes are needed, so the whole
    // batch is stored in pgque.jobs
    let mut wide: Vec<i16> = (-1000..=1000).step_by(25).collect();
    wide.extend((-30..=70).rev());
    let c_ids = enqueue_prios(&mut w, "lq", "c", &wide);
    all.extend(&c_ids);
    // existing lanes only: the log
    let d_ids = enqueue_prios(&mut w, "lq", "d", &[0, 5, 5, 7, 63]);
    all.extend(&d_ids);
    // one new lane alone, then with an existing one
    let e_ids = enqueue_prios(&mut w, "lq", "e", &[500]);
    all.extend(&e_ids);
    all.extend(enqueue_prios(&mut w, "lq", "f", &[500, 0]));
    assert_eq!(lanes(&mut su), 64, "the bound held");
    let stored = |su: &mut Client, ids: &[i64], store: &str| -> i64 {
        let ids = ids.to_vec();
        su.query_one(
            "SELECT count(*) FROM pgque.all_jobs WHERE id = ANY ($1) AND stored_in = $2",
            &[&ids, &store],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!(stored(&mut su, &c_ids, "jobs"), c_ids.len() as i64);
    assert_eq!(stored(&mut su, &d_ids, "log"), d_ids.len() as i64);
    assert_eq!(stored(&mut su, &e_ids, "jobs"), 1);

    let expected: Vec<(i16, i64)> = {
        let mut v: Vec<(i16, i64)> = su
            .query(
                "SELECT priority::smallint, id FROM pgque.all_jobs WHERE queue = 'lq'",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        v.sort();
        v
    };
    assert_eq!(expected.len(), all.len());
    let mut worker = db.connect_as("lanes_worker");
    let mut got: Vec<(i16, i64)> = vec![];
    for limit in [1, 17, 3, 50, 2, 101].iter().cycle() {
        let batch = dispatch(&mut worker, "lq", *limit);
        if batch.is_empty() {
            break;
        }
        assert_eq!(complete(&mut worker, &batch), batch.len() as i32);
        got.extend(batch.iter().map(|j| (j.1, j.0)));
    }
    assert_eq!(got.len(), expected.len(), "every job once");
    assert!(
        got == expected,
        "dispatch order is (priority, id) across both stores; first difference at {:?}",
        got.iter().zip(&expected).position(|(a, b)| a != b)
    );
    assert_eq!(
        sqlstate(w.batch_execute("SET pgque.job_lanes_per_queue = 5000")),
        "42501",
        "a writer raised the lane bound"
    );
}

/// A queue with 64 lanes, all handed out but two: a dispatch holds the
/// dispatch locks of those two lanes only (counted in pg_locks inside its
/// transaction), one lane's work locks one lane, and a dispatch of the
/// empty queue locks none.
#[test]
fn jobs_lanes_dispatch_locks_only_lanes_with_work() {
    let db = new_db("jlanes_locks");
    let mut su = db.connect();
    su.batch_execute("SELECT pgque.create_job_queue('lk')")
        .unwrap();
    let mut w = db.connect_as("lanes_writer");
    enqueue_prios(&mut w, "lk", "a", &(0..64).collect::<Vec<_>>());
    assert_eq!(
        count(
            &mut su,
            "SELECT count(*) FROM pgque.job_lanes WHERE queue = 'lk'"
        ),
        64
    );
    let mut worker = db.connect_as("lanes_worker");
    let first = dispatch(&mut worker, "lk", 100);
    assert_eq!(first.len(), 64);
    complete(&mut worker, &first);

    let locked_dispatch = |worker: &mut Client, limit: i32| -> (usize, i64, i64) {
        worker.batch_execute("BEGIN").unwrap();
        let got = dispatch(worker, "lk", limit);
        let lanes = lane_locks(worker);
        let all = count(
            worker,
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'",
        );
        worker.batch_execute("COMMIT").unwrap();
        complete(worker, &got);
        (got.len(), lanes, all)
    };
    enqueue_prios(&mut w, "lk", "b", &[17]);
    enqueue_prios(&mut w, "lk", "c", &[42, 42]);
    let (n, lanes, all) = locked_dispatch(&mut worker, 10);
    assert_eq!(n, 3);
    assert_eq!(lanes, 2, "the two lanes with work, not the queue's 64");
    assert!(
        all <= 3,
        "{all} advisory locks: the lanes and the rotation barrier"
    );
    enqueue_prios(&mut w, "lk", "d", &[63]);
    let (n, lanes, _) = locked_dispatch(&mut worker, 10);
    assert_eq!((n, lanes), (1, 1));
    let (n, lanes, all) = locked_dispatch(&mut worker, 10);
    assert_eq!(
        (n, lanes),
        (0, 0),
        "an empty queue's dispatch locks no lane"
    );
    assert!(all <= 1, "{all} advisory locks");
}

/// Four sessions enqueue and dispatch without pause across a queue's 64
/// lanes while a fifth rotates the job log (period 0, every sealed segment
/// due): three truncations happen within 30 s, no rotation holds a lane's
/// lock, and every job is handed out exactly once.
#[test]
fn jobs_lanes_rotation_truncates_under_constant_dispatch_without_lane_locks() {
    let db = new_db("jlanes_rotation");
    let mut su = db.connect();
    su.batch_execute("SELECT pgque.create_job_queue('rq')")
        .unwrap();
    let mut w = db.connect_as("lanes_writer");
    let mut produced: Vec<i64> = enqueue_prios(&mut w, "rq", "a", &(0..64).collect::<Vec<_>>());
    let dispatched = Arc::new(Mutex::new(vec![]));
    {
        let mut worker = db.connect_as("lanes_worker");
        let got = dispatch(&mut worker, "rq", 100);
        complete(&mut worker, &got);
        dispatched.lock().unwrap().extend(got.iter().map(|j| j.0));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = vec![];
    for t in 0..4i16 {
        let name = db.name.clone();
        let stop = stop.clone();
        let dispatched = dispatched.clone();
        threads.push(std::thread::spawn(move || {
            let mut w = connect_as(&name, "lanes_writer");
            let mut worker = connect_as(&name, "lanes_worker");
            let mut mine = vec![];
            let mut i = 0i16;
            while !stop.load(Ordering::SeqCst) {
                let p = (t * 16 + i) % 64;
                i += 1;
                mine.extend(enqueue_prios(&mut w, "rq", "l", &[p, p, (p + 1) % 64]));
                let got = dispatch(&mut worker, "rq", 50);
                complete(&mut worker, &got);
                dispatched.lock().unwrap().extend(got.iter().map(|j| j.0));
            }
            mine
        }));
    }
    let mut rot = db.connect();
    rot.batch_execute("SET pgque.job_log_rotation_period = 0")
        .unwrap();
    let start = Instant::now();
    let (mut runs, mut truncations, mut busy) = (0, 0, 0);
    while truncations < 3 && start.elapsed() < Duration::from_secs(30) {
        rot.batch_execute("BEGIN").unwrap();
        let r = rot
            .query_one("SELECT truncated, busy FROM pgque.rotate_job_log()", &[])
            .unwrap();
        let lanes = lane_locks(&mut rot);
        rot.batch_execute("COMMIT").unwrap();
        assert_eq!(lanes, 0, "the rotation took lanes' locks");
        runs += 1;
        truncations += r.get::<_, Option<i16>>(0).is_some() as i32;
        busy += r.get::<_, bool>(1) as i32;
        rot.batch_execute(
            "UPDATE pgque.job_log_segments SET sealed_at = now() - interval '2 days'
             WHERE sealed_at IS NOT NULL",
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = start.elapsed();
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        produced.extend(t.join().unwrap());
    }
    println!(
        "rotation under constant dispatch: {runs} runs, {truncations} truncations, {busy} busy, {elapsed:?}"
    );
    assert!(
        truncations >= 3,
        "{truncations} truncations in {elapsed:?} ({runs} runs, {busy} busy)"
    );
    // what the sessions left is handed out now, once
    let mut worker = db.connect_as("lanes_worker");
    loop {
        let got = dispatch(&mut worker, "rq", 500);
        if got.is_empty() {
            break;
        }
        complete(&mut worker, &got);
        dispatched.lock().unwrap().extend(got.iter().map(|j| j.0));
    }
    let dispatched = dispatched.lock().unwrap();
    let unique: HashSet<i64> = dispatched.iter().copied().collect();
    assert_eq!(unique.len(), dispatched.len(), "a job was handed out twice");
    let produced: HashSet<i64> = produced.into_iter().collect();
    assert_eq!(unique, produced, "every job handed out");
}

/// `enqueue(..., depends_on)` by a role with only pgque_writer: a parent of
/// the child's own queue is accepted; a parent of another queue is refused
/// with 42501, before anything is written (no job, edge or link, and the
/// parent stays in the job log). A role that can also see every queue's
/// jobs (pgque_reader) may name it.
#[test]
fn jobs_lanes_depends_on_refuses_a_writer_another_queues_parent() {
    let db = new_db("jlanes_deps");
    let mut su = db.connect();
    su.batch_execute(
        "SELECT pgque.create_job_queue('theirs'); SELECT pgque.create_job_queue('mine')",
    )
    .unwrap();
    let theirs: i64 = su
        .query_one("SELECT pgque.enqueue('theirs', 'parent')", &[])
        .unwrap()
        .get(0);
    let mut w = db.connect_as("lanes_writer");
    let own: i64 = w
        .query_one("SELECT pgque.enqueue('mine', 'own-parent')", &[])
        .unwrap()
        .get(0);
    let snapshot = |su: &mut Client| -> (i64, i64, i64, String) {
        let r = su
            .query_one(
                "SELECT (SELECT count(*) FROM pgque.all_jobs WHERE queue = 'mine'),
                        (SELECT count(*) FROM pgque.job_deps),
                        (SELECT count(*) FROM pgque.job_links),
                        (SELECT stored_in FROM pgque.all_jobs WHERE id = $1)",
                &[&theirs],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2), r.get(3))
    };
    let before = snapshot(&mut su);
    assert_eq!(before.3, "log");
    for parents in [vec![theirs], vec![own, theirs]] {
        let r = w.query_one(
            "SELECT pgque.enqueue('mine', 'child', depends_on => $1::bigint[])",
            &[&parents],
        );
        assert_eq!(sqlstate(r), "42501", "parents {parents:?}");
        assert_eq!(
            snapshot(&mut su),
            before,
            "a refused depends_on changed something"
        );
    }
    // the same refusal inside the writer's transaction leaves it aborted,
    // and its rollback leaves nothing either
    w.batch_execute("BEGIN").unwrap();
    let r = w.query_one(
        "SELECT pgque.enqueue('mine', 'child', depends_on => ARRAY[$1]::bigint[])",
        &[&theirs],
    );
    assert_eq!(sqlstate(r), "42501");
    w.batch_execute("ROLLBACK").unwrap();
    assert_eq!(snapshot(&mut su), before);
    // its own queue's job is a parent it may name
    let child: i64 = w
        .query_one(
            "SELECT pgque.enqueue('mine', 'child', depends_on => ARRAY[$1]::bigint[])",
            &[&own],
        )
        .unwrap()
        .get(0);
    assert!(child > 0);
    // a role that sees every queue's jobs may build a pipeline across queues
    let mut rw = db.connect_as("lanes_rw");
    let across: i64 = rw
        .query_one(
            "SELECT pgque.enqueue('mine', 'across', depends_on => ARRAY[$1]::bigint[])",
            &[&theirs],
        )
        .unwrap()
        .get(0);
    assert!(across > 0);
}
