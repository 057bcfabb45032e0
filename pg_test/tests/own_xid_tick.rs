//! A tick taken by a transaction that itself wrote events (create_queue +
//! send in one transaction, a manual tick after a send, maint_retry_events
//! moving retries back and ticking) must count that transaction as still
//! running, also when a later transaction has committed meanwhile (the
//! snapshot's xmax is then beyond our xid, and pg_current_snapshot() does not
//! list our own xid as in progress). Otherwise the events look committed
//! before the tick and no batch ever delivers them. Found by the bad-input
//! fixture (create_queue + send in one transaction) under parallel tests.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;

/// Commits a transaction with an xid from another session, so xids later
/// than the open transaction's have committed.
fn commit_a_later_xid(db: &TestDb) {
    db.connect()
        .batch_execute("SELECT pg_current_xact_id()")
        .unwrap();
}

fn receive_ids(c: &mut Client, q: &str) -> (Option<i64>, Vec<i64>, Vec<Option<i32>>) {
    let rows = c
        .query(
            "SELECT msg_id, batch_id, retry_count FROM pgque.receive($1, 'c', 100)",
            &[&q],
        )
        .unwrap();
    (
        rows.first().map(|r| r.get(1)),
        rows.iter().map(|r| r.get(0)).collect(),
        rows.iter().map(|r| r.get(2)).collect(),
    )
}

fn manual_db(name: &str) -> TestDb {
    let db = TestDb::new(name);
    stop_worker(&mut db.connect());
    db
}

#[test]
fn events_sent_in_the_transaction_that_created_the_queue_are_delivered() {
    let db = manual_db("own_xid_create");
    let mut a = db.connect();
    a.batch_execute("BEGIN; SELECT pg_current_xact_id()")
        .unwrap();
    commit_a_later_xid(&db);
    a.batch_execute(
        "SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c'); \
         SELECT pgque.send('q', 'x'::text); COMMIT",
    )
    .unwrap();
    a.batch_execute("SELECT pgque.force_tick('q')").unwrap();
    let (_, ids, _) = receive_ids(&mut a, "q");
    assert_eq!(ids.len(), 1, "the event sent with create_queue was skipped");
}

#[test]
fn a_tick_after_a_send_in_the_same_transaction_does_not_swallow_it() {
    let db = manual_db("own_xid_tick");
    let mut a = db.connect();
    a.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c')")
        .unwrap();
    a.batch_execute("BEGIN; SELECT pgque.send('q', 'x'::text)")
        .unwrap();
    commit_a_later_xid(&db);
    a.batch_execute("SELECT pgque.force_tick('q'); COMMIT")
        .unwrap();
    a.batch_execute("SELECT pgque.force_tick('q')").unwrap();
    let mut all = vec![];
    loop {
        let (b, ids, _) = receive_ids(&mut a, "q");
        let Some(b) = b else { break };
        all.extend(ids);
        a.query_one("SELECT pgque.ack($1)", &[&b]).unwrap();
    }
    assert_eq!(all.len(), 1, "the event sent before the tick was skipped");
}

#[test]
fn retries_moved_back_by_maint_are_redelivered() {
    let db = manual_db("own_xid_retry");
    let mut a = db.connect();
    a.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c')")
        .unwrap();
    a.batch_execute("SELECT pgque.send('q', 'x'::text)")
        .unwrap();
    a.batch_execute("SELECT pgque.force_tick('q')").unwrap();
    let (b, ids, _) = receive_ids(&mut a, "q");
    assert_eq!(ids.len(), 1);
    let b = b.unwrap();
    a.query_one(
        "SELECT pgque.nack($1, m, '0 seconds') FROM pgque.receive('q', 'c', 100) m",
        &[&b],
    )
    .unwrap();
    a.query_one("SELECT pgque.ack($1)", &[&b]).unwrap();
    // maint_retry_events in a transaction during which a later xid commits.
    a.batch_execute("BEGIN; SELECT pg_current_xact_id()")
        .unwrap();
    commit_a_later_xid(&db);
    let moved: i32 = a
        .query_one("SELECT pgque.maint_retry_events()", &[])
        .unwrap()
        .get(0);
    assert_eq!(moved, 1);
    a.batch_execute("COMMIT").unwrap();
    a.batch_execute("SELECT pgque.force_tick('q')").unwrap();
    let (_, again, retry) = receive_ids(&mut a, "q");
    assert_eq!(again, ids, "the retried event was never redelivered");
    assert_eq!(retry, vec![Some(1)]);
}
