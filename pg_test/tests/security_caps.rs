//! Unbounded inputs (docs/operations.md, "Threat model"): made-up lease
//! tokens take no locks, and arrays and event counts have caps (54000).
mod sec_util;
use pgque_pg_test::*;
use sec_util::*;

#[test]
fn security_made_up_tokens_take_no_locks_and_arrays_are_capped() {
    let _g = serial();
    let db = TestDb::new("sec_caps");
    let mut su = db.connect();
    ensure_role(&mut su, "sec_reader", "LOGIN IN ROLE pgque_reader");
    su.batch_execute(
        "GRANT pgque_reader TO sec_reader; SELECT pgque.create_job_queue('cq'); \
                      SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c')",
    )
    .unwrap();
    let mut r = db.connect_as("sec_reader");
    r.batch_execute("BEGIN").unwrap();
    let done: i32 = r
        .query_one(
            "SELECT pgque.complete_many(ARRAY(SELECT g FROM generate_series(1, 5000) g)::bigint[], \
                                        ARRAY(SELECT g FROM generate_series(1, 5000) g)::bigint[])",
            &[],
        )
        .unwrap()
        .get(0);
    let held: i64 = r
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
            &[],
        )
        .unwrap()
        .get(0);
    r.batch_execute("ROLLBACK").unwrap();
    assert_eq!(done, 0);
    assert_eq!(held, 0, "complete_many of made-up tokens took {held} locks");

    let over = "ARRAY(SELECT g FROM generate_series(1, 10001) g)::bigint[]";
    for sql in [
        format!("SELECT pgque.complete_many({over}, {over})"),
        format!("SELECT * FROM pgque.heartbeat({over}, {over}, '1 minute')"),
    ] {
        assert_eq!(failure(r.batch_execute(&sql)).0, "54000", "{sql}");
    }
    // max_return above the cap is taken as the cap (PgQue's clients pass
    // 2147483647 for "all"): the call runs, and returns at most 100,000.
    let n: i64 = r
        .query_one(
            "SELECT count(*) FROM pgque.receive('q', 'c', 2147483647)",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(n <= 100_000, "receive returned {n} events");
    assert_eq!(
        failure(r.batch_execute("SET pgque.batch_max_events = 100001")).0,
        "22023"
    );
    r.batch_execute("SET pgque.batch_max_events = 100000")
        .unwrap();
}
