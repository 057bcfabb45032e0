//! What a receive costs a consumer that is caught up (the receive after
//! every ack, every idle poll): one read-only statement inside pgque, no
//! transaction id, no row written; and what an ack runs. Counted from the
//! plans of the nested statements (auto_explain) and the transaction's own
//! table statistics, on a real server.
mod events_util;
use events_util::*;
use pgque_pg_test::postgres::Client;

/// The nested statements (inside pgque's functions) of what ran since
/// the last call: the logged plans whose query text is not `top`.
fn nested(logged: &Plans, top: &str) -> Vec<String> {
    let mut l = logged.lock().unwrap();
    let out = l
        .iter()
        .filter(|m| m.contains("Query Text:") && !m.contains(top))
        .cloned()
        .collect();
    l.clear();
    out
}

/// Rows the current transaction inserted, updated or deleted in pgque's tables.
fn rows_written(c: &mut Client) -> i64 {
    i64s(
        c,
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::int8 \
           FROM pg_stat_xact_user_tables WHERE schemaname = 'pgque'",
    )
}

#[test]
fn caught_up_receive_is_one_read_only_statement() {
    let db = manual_db("ev_recv_cost");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c'); \
         SELECT pgque.register_consumer('q', 'pgq_c')",
    )
    .unwrap();
    let id = send(&mut c, "q", "1");
    assert_eq!(drain(&mut c, "q", "c", 10), vec![id]);
    let (mut t, logged) = explained(&db);

    // caught up: the receive after the ack finds nothing
    let top = "FROM pgque.receive('q', 'c')";
    t.batch_execute("BEGIN").unwrap();
    logged.lock().unwrap().clear();
    let rows = t.query(&format!("SELECT msg_id {top}"), &[]).unwrap();
    assert!(rows.is_empty(), "nothing new");
    let ran = nested(&logged, top);
    assert_eq!(ran.len(), 1, "one statement inside receive, ran: {ran:#?}");
    let xid: Option<String> = t
        .query_one("SELECT pg_current_xact_id_if_assigned()::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(xid, None, "a caught-up receive takes no transaction id");
    assert_eq!(rows_written(&mut t), 0, "and writes no row");
    t.batch_execute("COMMIT").unwrap();

    // PgQ's next_batch, caught up, is the same single statement
    let b: i64 = i64s(&mut c, "SELECT pgque.next_batch('q', 'pgq_c')");
    c.query_one("SELECT pgque.finish_batch($1)", &[&b]).unwrap();
    let top = "pgque.next_batch('q', 'pgq_c')";
    logged.lock().unwrap().clear();
    let b: Option<i64> = t.query_one(&format!("SELECT {top}"), &[]).unwrap().get(0);
    assert_eq!(b, None);
    assert_eq!(nested(&logged, top).len(), 1, "next_batch, caught up");

    // a new tick: the same call opens the batch (the locked path), and a
    // second receive before the ack returns that batch again
    let id2 = send(&mut c, "q", "2");
    tick(&mut c, "q");
    let (b1, ids) = recv(&mut t, "q", "c", 10);
    assert_eq!(ids, vec![id2]);
    let (b1_again, ids_again) = recv(&mut t, "q", "c", 10);
    assert_eq!(
        (b1_again, ids_again),
        (b1, vec![id2]),
        "the open batch, whole"
    );

    // ack: the batch looked up, the subscription locked, the done row
    // inserted unless one exists (the re-check and the insert are one)
    logged.lock().unwrap().clear();
    let top = "SELECT pgque.ack(";
    let n: i32 = t
        .query_one(&format!("{top}{})", b1.unwrap()), &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    assert_eq!(nested(&logged, top).len(), 3, "ack's statements");
    let n: i32 = t
        .query_one(&format!("{top}{})", b1.unwrap()), &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "a second ack finds the batch finished");
    assert_eq!(recv(&mut t, "q", "c", 10), (None, vec![]));
}

#[test]
fn receive_errors_keep_their_order() {
    let db = manual_db("ev_recv_errs");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('q')").unwrap();
    let code = |c: &mut Client, sql: &str| {
        c.query(sql, &[])
            .unwrap_err()
            .code()
            .map(|s| s.code().to_string())
    };
    // unknown queue before a bad consumer name, as before
    assert_eq!(
        code(&mut c, "SELECT * FROM pgque.receive('nope', 'a#b')").as_deref(),
        Some("42704")
    );
    assert_eq!(
        code(&mut c, "SELECT * FROM pgque.receive('q', 'a#b')").as_deref(),
        Some("42602")
    );
    assert_eq!(
        code(&mut c, "SELECT * FROM pgque.receive('q', 'nobody')").as_deref(),
        Some("42704")
    );
    assert_eq!(
        code(&mut c, "SELECT pgque.next_batch('q', 'nobody')").as_deref(),
        Some("42704")
    );
    // unsubscribed: the consumer is gone, not caught up
    c.batch_execute("SELECT pgque.subscribe('q', 'c')").unwrap();
    assert_eq!(recv(&mut c, "q", "c", 10), (None, vec![]));
    c.batch_execute("SELECT pgque.unsubscribe('q', 'c')")
        .unwrap();
    assert_eq!(
        code(&mut c, "SELECT * FROM pgque.receive('q', 'c')").as_deref(),
        Some("42704")
    );
}

/// Opening a batch whose next tick is more than max_return events ahead
/// (the start of a big range) finds the range's end in the tick index from
/// the consumer's position on: the ticks the queue keeps from before it
/// are not read, however many there are.
#[test]
fn opening_a_big_range_reads_no_older_ticks() {
    let db = manual_db("ev_recv_ticks");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c')")
        .unwrap();
    for i in 0..300 {
        send(&mut c, "q", &i.to_string());
        tick(&mut c, "q");
    }
    assert_eq!(drain(&mut c, "q", "c", 1000).len(), 300);
    let ids = send_many(&mut c, "q", 50);
    tick(&mut c, "q");

    let (mut t, plans) = explained(&db);
    plans.lock().unwrap().clear();
    let (_, got) = recv(&mut t, "q", "c", 10);
    assert_eq!(got, ids[..10].to_vec(), "the first cut of the range");
    let plans = plans.lock().unwrap();
    let read = rows_read_from(&plans, " on tick_p");
    assert!(
        read <= 20,
        "opening the batch read {read} tick rows (the queue keeps 302 ticks); plans:\n{}",
        plans.join("\n")
    );
    // The btree checks a bound on a later index column entry by entry: only
    // a bound on (seq, id) together starts the backward scan at the
    // consumer's position instead of walking every older tick (rows the
    // counts above do not show: the index rejects them itself).
    let far = plans
        .iter()
        .flat_map(|p| p.lines())
        .filter(|l| l.contains("Index Cond:") && l.contains("t1.tick_event_seq + "))
        .collect::<Vec<_>>();
    assert!(
        !far.is_empty(),
        "the range's end is looked up:\n{}",
        plans.join("\n")
    );
    for l in far {
        assert!(
            l.contains("ROW(tick_event_seq, tick_id) > ROW(t1.tick_event_seq, t1.tick_id)"),
            "the scan for the range's end starts at the consumer's tick: {l}"
        );
    }
}
