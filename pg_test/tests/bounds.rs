//! What a role with only pgque's group roles can make the server hold, and
//! names that would cross another queue's path (docs/operations.md, "What a
//! writer can make the server hold"): consumers per event queue are bounded
//! by a superuser-only setting, and an event queue and a job queue never
//! share a NOTIFY channel.
mod sec_util;
use pgque_pg_test::*;
use sec_util::*;

/// A pgque_reader registers consumers, slots and cooperative members up to
/// pgque.max_consumers_per_queue and no further (54000, nothing made), and
/// cannot raise the setting itself.
#[test]
fn consumers_per_queue_are_bounded_for_a_reader() {
    let _g = serial();
    let db = TestDb::new("bounds_consumers");
    let mut su = connect_to("postgres");
    ensure_role(&mut su, "bound_reader", "LOGIN");
    su.batch_execute("GRANT pgque_reader TO bound_reader")
        .unwrap();
    let mut c = db.connect();
    stop_worker(&mut c);
    // an administrator's partitioned consumers (readers subscribe only with
    // an N that one of those made the slot indexes for): 4 + 2 consumers
    c.batch_execute(
        "SELECT pgque.create_queue('q'); SELECT pgque.create_queue('other'); \
         SELECT pgque.subscribe_partitioned('q', 'a4', 4); \
         SELECT pgque.subscribe_partitioned('q', 'a2', 2); \
         ALTER DATABASE bounds_consumers SET pgque.max_consumers_per_queue = 10",
    )
    .unwrap();
    let mut r = db.connect_as("bound_reader");
    let count = |c: &mut pgque_pg_test::postgres::Client| -> i64 {
        c.query_one(
            "SELECT count(*) FROM pgque.subscription s JOIN pgque.queue q ON q.queue_id = s.sub_queue \
             WHERE q.queue_name = 'q'",
            &[],
        )
        .unwrap()
        .get(0)
    };
    let refused = |r: Result<u64, pgque_pg_test::postgres::Error>| -> String {
        let e = r.unwrap_err();
        assert_eq!(
            e.code().map(|s| s.code()),
            Some("54000"),
            "{:?}",
            e.as_db_error()
        );
        e.as_db_error().map(|d| d.message().to_string()).unwrap()
    };
    assert_eq!(count(&mut c), 6);
    // the setting is the superuser's
    assert_eq!(
        sqlstate(r.batch_execute("SET pgque.max_consumers_per_queue = 100000")),
        "42501"
    );
    for i in 0..2 {
        r.execute(
            "SELECT pgque.register_consumer('q', $1)",
            &[&format!("c{i}")],
        )
        .unwrap();
    }
    // a partitioned consumer of 4 slots is 4 consumers: 8 + 4 > 10
    refused(r.execute("SELECT pgque.subscribe_partitioned('q', 'p', 4)", &[]));
    assert_eq!(
        count(&mut c),
        8,
        "nothing of the refused partitioned consumer stays"
    );
    r.execute("SELECT pgque.subscribe_partitioned('q', 'p', 2)", &[])
        .unwrap();
    // subscribing it again adds nothing, so it is not refused
    r.execute("SELECT pgque.subscribe_partitioned('q', 'p', 2)", &[])
        .unwrap();
    assert_eq!(count(&mut c), 10);
    let msg = refused(r.execute("SELECT pgque.register_consumer('q', 'one_more')", &[]));
    assert!(msg.contains("pgque.max_consumers_per_queue (10)"), "{msg}");
    refused(r.execute("SELECT pgque.register_subconsumer('q', 'grp', 'm1')", &[]));
    assert_eq!(count(&mut c), 10);
    // the bound is per queue, and room comes back with an unregister
    r.execute("SELECT pgque.register_consumer('other', 'c0')", &[])
        .unwrap();
    r.execute("SELECT pgque.unregister_consumer('q', 'c0')", &[])
        .unwrap();
    r.execute("SELECT pgque.register_consumer('q', 'one_more')", &[])
        .unwrap();
    assert_eq!(count(&mut c), 10);
}

/// Event queue `jobs_x` and job queue `x` would share `pgque_jobs_x`; a long
/// job queue name's channel is its md5, which an event queue could spell
/// too. Whichever comes second is refused (42710), in either order.
#[test]
fn an_event_queue_and_a_job_queue_never_share_a_notify_channel() {
    let db = TestDb::new("bounds_channels");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute("SELECT pgque.create_job_queue('x'); SELECT pgque.create_queue('y')")
        .unwrap();
    assert_eq!(
        sqlstate(c.execute("SELECT pgque.create_queue('jobs_x')", &[])),
        "42710"
    );
    // "jobs_y" is an event queue's channel away from job queue "y"
    c.execute("SELECT pgque.create_queue('jobs_y')", &[])
        .unwrap();
    assert_eq!(
        sqlstate(c.execute("SELECT pgque.create_job_queue('y')", &[])),
        "42710"
    );
    let long = "l".repeat(55);
    c.execute("SELECT pgque.create_job_queue($1)", &[&long])
        .unwrap();
    let channel: String = c
        .query_one("SELECT pgque.job_channel($1)", &[&long])
        .unwrap()
        .get(0);
    let spelled = channel.strip_prefix("pgque_").unwrap().to_string();
    assert!(
        spelled.starts_with("jobs_") && spelled.len() == 37,
        "{spelled}"
    );
    assert_eq!(
        sqlstate(c.execute("SELECT pgque.create_queue($1)", &[&spelled])),
        "42710"
    );
    // names that merely look alike are fine, and nothing refused was made
    c.batch_execute("SELECT pgque.create_queue('jobs'); SELECT pgque.create_queue('jobsx')")
        .unwrap();
    let made: Vec<String> = c
        .query(
            "SELECT queue_name FROM pgque.queue ORDER BY queue_name COLLATE \"C\"",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(made, ["jobs", "jobs_y", "jobsx", "y"]);
    let jobs: Vec<String> = c
        .query(
            "SELECT queue_name FROM pgque.job_queues ORDER BY queue_name COLLATE \"C\"",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(jobs, [long.as_str(), "x"]);
}

/// A producer's transaction takes a lane lock per queue and priority it
/// enqueues into, held to commit: at most 4 x max_locks_per_transaction
/// (256 here) of them, past which the enqueue says 54000 and the
/// transaction keeps nothing, rather than filling the cluster's lock table.
#[test]
fn a_transactions_lane_locks_are_bounded_for_a_writer() {
    let _g = serial();
    let db = TestDb::new("bounds_lane_locks");
    let mut su = connect_to("postgres");
    ensure_role(&mut su, "bound_writer", "LOGIN");
    su.batch_execute("GRANT pgque_writer TO bound_writer")
        .unwrap();
    let mut c = db.connect();
    stop_worker(&mut c);
    let per_xact: i32 = c
        .query_one(
            "SELECT 4 * current_setting('max_locks_per_transaction')::int",
            &[],
        )
        .unwrap()
        .get(0);
    c.batch_execute("SELECT pgque.create_job_queue('a'); SELECT pgque.create_job_queue('b')")
        .unwrap();
    let mut w = db.connect_as("bound_writer");
    let jobs = |c: &mut pgque_pg_test::postgres::Client| -> i64 {
        c.query_one("SELECT count(*) FROM pgque.all_jobs", &[])
            .unwrap()
            .get(0)
    };
    // as many lanes as allowed, over two queues and two statements
    let half = per_xact / 2;
    let mut tx = w.transaction().unwrap();
    for q in ["a", "b"] {
        tx.execute(
            "SELECT pgque.enqueue($1, 'k', '{}'::jsonb, p) FROM generate_series(-$2::int, $2::int - 1) p",
            &[&q, &(half / 2)],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    assert_eq!(jobs(&mut c), (2 * (half / 2) * 2) as i64);
    // one more distinct priority than allowed, in one transaction: refused
    let before = jobs(&mut c);
    let mut tx = w.transaction().unwrap();
    tx.execute(
        "SELECT pgque.enqueue('a', 'k', '{}'::jsonb, p) FROM generate_series(-$1::int, $1::int - 1) p",
        &[&half],
    )
    .unwrap();
    let e = tx
        .execute("SELECT pgque.enqueue('b', 'k', '{}'::jsonb, 999)", &[])
        .unwrap_err();
    assert_eq!(
        e.code().map(|s| s.code()),
        Some("54000"),
        "{:?}",
        e.as_db_error()
    );
    let msg = e.as_db_error().map(|d| d.message().to_string()).unwrap();
    assert!(msg.contains("job lane locks"), "{msg}");
    drop(tx);
    assert_eq!(jobs(&mut c), before, "the refused transaction kept nothing");
    // the next transaction starts from nothing
    w.execute("SELECT pgque.enqueue('b', 'k', '{}'::jsonb, 999)", &[])
        .unwrap();
    assert_eq!(jobs(&mut c), before + 1);
}

/// enqueue_flow takes a lane's lock with the same lock as enqueue (pgque's
/// own tag, not pg_advisory_xact_lock's, which no other statement took), so
/// a flow's ready jobs wait for an open enqueue into their lane and ids stay
/// in commit order within the lane.
#[test]
fn enqueue_flow_waits_for_an_open_enqueue_into_its_lane() {
    let db = TestDb::new("bounds_flow_lane");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute("SELECT pgque.create_job_queue('fl')")
        .unwrap();
    let mut a = db.connect();
    let mut tx = a.transaction().unwrap();
    tx.execute("SELECT pgque.enqueue('fl', 'k', '{}'::jsonb)", &[])
        .unwrap();
    let mut b = db.connect();
    b.batch_execute("SET statement_timeout = '700ms'").unwrap();
    let flow = "SELECT * FROM pgque.enqueue_flow('fl', '[{\"key\": \"a\", \"kind\": \"k\"}]')";
    assert_eq!(
        sqlstate(b.execute(flow, &[])),
        "57014",
        "the flow did not wait for the lane"
    );
    tx.commit().unwrap();
    b.execute(flow, &[]).unwrap();
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM pgque.all_jobs WHERE queue = 'fl'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
}
