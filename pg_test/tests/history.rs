//! The history rollup (sql/36_history.sql): the worker's `history` duty
//! writes a row per queue and minute that pgque.read_history returns, a
//! minute is written once, and trimming keeps the table to its bound.
use pgque_pg_test::*;
use std::time::Duration;

#[test]
fn history_the_worker_writes_a_row_per_queue_and_minute() {
    let db = TestDb::new("history_worker");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('hq'); SELECT pgque.subscribe('hq', 'c'); \
         SELECT pgque.send_batch('hq', 't', ARRAY['a', 'b', 'c']); \
         SELECT pgque.create_job_queue('hj'); SELECT pgque.enqueue('hj', 'k')",
    )
    .unwrap();
    // Due at once (queues exist, this minute has no row), or at the next
    // minute when the worker wrote this one before the queues existed.
    let ok = wait_until(Duration::from_secs(80), || {
        c.query_one(
            "SELECT count(DISTINCT (kind, queue)) FROM pgque.read_history('1 hour')",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
            == 2
    });
    assert!(ok, "no history rows from the worker");
    let r = c
        .query_one(
            "SELECT depth, total FROM pgque.read_history('1 hour') WHERE kind = 'job' AND queue = 'hj' \
             ORDER BY bucket DESC LIMIT 1",
            &[],
        )
        .unwrap();
    assert_eq!(r.get::<_, Option<i64>>(0), Some(1), "one ready job");
    assert_eq!(r.get::<_, i64>(1), 0, "no job completed");
    let total: i64 = c
        .query_one(
            "SELECT total FROM pgque.read_history('1 hour') WHERE kind = 'event' AND queue = 'hq' \
             ORDER BY bucket DESC LIMIT 1",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(total, 3, "three events sent");
    // The duty ran through the worker: status() shows it, duty_due() knows
    // it is not due again before the next minute.
    let detail: String = c
        .query_one(
            "SELECT detail FROM pgque.status() WHERE component = 'duty:history'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(!detail.starts_with("runs=0 "), "{detail}");
    let due: Option<f64> = c
        .query_one(
            "SELECT due_in FROM pgque.duty_due() WHERE duty = 'history'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(due.is_some_and(|d| d <= 60.0), "{due:?}");
    // A reader may read the history, not write it.
    c.batch_execute(
        "DROP ROLE IF EXISTS history_reader; CREATE ROLE history_reader LOGIN IN ROLE pgque_reader",
    )
    .unwrap();
    let mut r = db.connect_as("history_reader");
    assert!(r
        .query("SELECT * FROM pgque.read_history('6 hours')", &[])
        .is_ok());
    assert_eq!(
        sqlstate(r.query("SELECT pgque.maint_history()", &[])),
        "42501"
    );
    assert_eq!(
        sqlstate(r.query("SELECT * FROM pgque.metric_history", &[])),
        "42501"
    );
    drop(r);
    c.batch_execute("DROP OWNED BY history_reader; DROP ROLE history_reader")
        .unwrap();
}

#[test]
fn history_a_minute_is_written_once_and_trimming_keeps_the_bound() {
    let db = TestDb::new("history_trim");
    let mut c = db.connect();
    stop_worker(&mut c);
    // The counts below hold within one minute: start early in one.
    wait_until(Duration::from_secs(15), || {
        c.query_one("SELECT extract(second FROM clock_timestamp()) < 45", &[])
            .unwrap()
            .get::<_, bool>(0)
    });
    c.batch_execute(
        "SELECT pgque.create_queue('hq'); \
         SELECT pgque.send_batch('hq', 't', ARRAY(SELECT g::text FROM generate_series(1, 120) g)); \
         DELETE FROM pgque.metric_history; \
         -- five hours of an earlier run, the newest a minute ago at total 0
         INSERT INTO pgque.metric_history (bucket, kind, queue, total, per_second, depth, lag_seconds) \
         SELECT date_trunc('minute', now()) - g * interval '1 minute', 'e', 'hq', 0, 0, 0, 0 \
           FROM generate_series(1, 300) g",
    )
    .unwrap();
    let n: i64 = c
        .query_one("SELECT pgque.maint_history('1 hour')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "one queue, one row");
    let r = c
        .query_one(
            "SELECT count(*), min(bucket) >= date_trunc('minute', now()) - interval '1 hour', \
                    max(bucket) = date_trunc('minute', now()) \
               FROM pgque.metric_history",
            &[],
        )
        .unwrap();
    assert_eq!(r.get::<_, i64>(0), 61, "the last hour and this minute");
    assert!(r.get::<_, bool>(1) && r.get::<_, bool>(2));
    // 120 events since the row a minute before: 2 per second.
    let (total, rate): (i64, f64) = c
        .query_one(
            "SELECT total, per_second FROM pgque.metric_history WHERE bucket = date_trunc('minute', now())",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(total, 120);
    assert!((rate - 2.0).abs() < 1e-9, "{rate}");
    // This minute again: nothing written, nothing changed.
    assert_eq!(
        c.query_one("SELECT pgque.maint_history('1 hour')", &[])
            .unwrap()
            .get::<_, i64>(0),
        0
    );
    let n: i64 = c
        .query_one("SELECT count(*) FROM pgque.metric_history", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 61);
    // read_history returns the range asked for, in queue then time order.
    let n: i64 = c
        .query_one("SELECT count(*) FROM pgque.read_history('10 minutes')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 11);
    // A run with a shorter bound trims to it (this minute is written
    // already: it only trims).
    c.query_one("SELECT pgque.maint_history('5 minutes')", &[])
        .unwrap();
    let n: i64 = c
        .query_one("SELECT count(*) FROM pgque.metric_history", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 6, "rows kept with a bound of 5 minutes");
}
