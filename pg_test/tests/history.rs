//! The history rollup (sql/36_history.sql): the worker's `history` duty
//! writes a row per queue and minute that pgque.read_history returns, a
//! minute is written once, and the three pieces rotate by TRUNCATE (no
//! row deleted or updated) within the retention's bounds.
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
fn history_a_minute_is_written_once_and_per_second_spans_the_pieces() {
    let db = TestDb::new("history_once");
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
         TRUNCATE pgque.metric_history; \
         -- five hours of an earlier run in piece 0, the newest a minute ago at total 0
         INSERT INTO pgque.metric_history (bucket, kind, queue, total, per_second, depth, lag_seconds, seg) \
         SELECT date_trunc('minute', now()) - g * interval '1 minute', 'e', 'hq', 0, 0, 0, 0, 0 \
           FROM generate_series(1, 300) g",
    )
    .unwrap();
    let n: i64 = c
        .query_one("SELECT pgque.maint_history('1 hour')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "one queue, one row");
    // Piece 0 spans more than half the retention: the row went to piece 1
    // (empty), and piece 0's rows, an hour old or newer among them, stay.
    let r = c
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE seg = 1), max(bucket) = date_trunc('minute', now()) \
               FROM pgque.metric_history",
            &[],
        )
        .unwrap();
    assert_eq!(r.get::<_, i64>(0), 301);
    assert_eq!(r.get::<_, i64>(1), 1);
    assert!(r.get::<_, bool>(2));
    // 120 events since the row a minute before (in the other piece): 2 per second.
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
    assert_eq!(n, 301);
    // read_history returns the range asked for, in queue then time order,
    // across the pieces.
    let n: i64 = c
        .query_one("SELECT count(*) FROM pgque.read_history('10 minutes')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 11);
}

/// Ten hours of minutes written with a 20-minute retention: the pieces
/// rotate every ten minutes or so, by TRUNCATE; no row is ever deleted or
/// updated (the pieces' statistics show no delete, update or dead tuple),
/// every minute of the retention is kept and nothing older than 1.5 times
/// it is.
#[test]
fn history_rotates_by_truncate_and_leaves_no_dead_tuples() {
    let db = TestDb::new("history_rotate");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute(
        "SELECT pgque.create_queue('hq'); SELECT pgque.create_job_queue('hj'); \
         TRUNCATE pgque.metric_history",
    )
    .unwrap();
    let base: std::time::SystemTime = c
        .query_one("SELECT date_trunc('minute', now())", &[])
        .unwrap()
        .get(0);
    let minutes = 600u32;
    let mut rotations = 0;
    let mut piece: Option<i16> = None;
    for g in (0..=minutes).rev() {
        let at = base - Duration::from_secs(60 * g as u64);
        if g % 97 == 0 {
            c.execute(
                "SELECT pgque.send('hq', 't', 'x'), pgque.enqueue('hj', 'k')",
                &[],
            )
            .unwrap();
        }
        let n: i64 = c
            .query_one("SELECT pgque.maint_history('20 minutes', $1)", &[&at])
            .unwrap()
            .get(0);
        assert_eq!(n, 2, "minute -{g}: one row per queue");
        let now: i16 = c
            .query_one(
                "SELECT seg FROM pgque.metric_history ORDER BY bucket DESC LIMIT 1",
                &[],
            )
            .unwrap()
            .get(0);
        if piece.is_some_and(|p| p != now) {
            rotations += 1;
        }
        piece = Some(now);
    }
    // 600 minutes in spans of at least 10: about 55 switches.
    assert!((45..=61).contains(&rotations), "{rotations} rotations");
    let r = c
        .query_one(
            "SELECT count(*), min(bucket), \
                    count(DISTINCT bucket) FILTER (WHERE bucket >= $1::timestamptz - interval '20 minutes') \
               FROM pgque.metric_history",
            &[&base],
        )
        .unwrap();
    let kept: i64 = r.get(0);
    let oldest: std::time::SystemTime = r.get(1);
    assert_eq!(
        r.get::<_, i64>(2),
        21,
        "every minute of the retention is kept"
    );
    assert!(
        oldest >= base - Duration::from_secs(30 * 60),
        "a row older than 1.5 times the retention is left: {:?}",
        base.duration_since(oldest)
    );
    assert!(kept < 2 * 31 + 2, "{kept} rows kept");
    // read_history reads across the pieces: each row of its range once.
    let (read, stored): (i64, i64) = c
        .query_one(
            "SELECT (SELECT count(*) FROM pgque.read_history('20 minutes')), \
                    (SELECT count(*) FROM pgque.metric_history \
                      WHERE bucket >= date_trunc('minute', now() - interval '20 minutes'))",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(read, stored);
    assert!(read >= 2 * 19, "{read}");
    // Rows left only by TRUNCATE: the pieces' statistics.
    flush_stats(&mut c);
    let rows = c
        .query(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, n_dead_tup \
               FROM pg_stat_user_tables WHERE schemaname = 'pgque' \
                AND relname LIKE 'metric\\_history\\__' ORDER BY relname",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), 3);
    let mut inserted = 0;
    for r in &rows {
        let name: String = r.get(0);
        inserted += r.get::<_, i64>(1);
        assert_eq!(
            (r.get::<_, i64>(2), r.get::<_, i64>(3), r.get::<_, i64>(4)),
            (0, 0, 0),
            "{name}: updates, deletes, dead tuples"
        );
    }
    // (the worker may have written a minute before it was stopped)
    assert!(
        inserted >= 2 * (minutes as i64 + 1),
        "{inserted} rows written"
    );
    assert!(inserted > kept * 5);
}

/// A reader holding the piece that is due to go does not make the duty
/// wait: the minute is written to the current piece, and the rotation
/// happens at a later minute once the reader is gone.
#[test]
fn history_rotation_does_not_wait_for_a_reader() {
    let db = TestDb::new("history_reader");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute(
        "SELECT pgque.create_queue('hq'); TRUNCATE pgque.metric_history; \
         -- piece 1 current since 20 minutes, piece 2 expired (an hour old)
         INSERT INTO pgque.metric_history (bucket, kind, queue, total, seg) \
         SELECT date_trunc('minute', now()) - g * interval '1 minute', 'e', 'hq', 0, 1 \
           FROM generate_series(3, 20) g; \
         INSERT INTO pgque.metric_history (bucket, kind, queue, total, seg) \
         SELECT date_trunc('minute', now()) - g * interval '1 minute', 'e', 'hq', 0, 2 \
           FROM generate_series(60, 70) g",
    )
    .unwrap();
    let mut r = db.connect();
    r.batch_execute("BEGIN; SELECT count(*) FROM pgque.metric_history_2")
        .unwrap();
    let t = std::time::Instant::now();
    let n: i64 = c
        .query_one(
            "SELECT pgque.maint_history('30 minutes', now() - interval '2 minutes')",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(n, 1);
    let seg = |c: &mut postgres::Client| -> (i16, i64) {
        let r = c
            .query_one(
                "SELECT (SELECT seg FROM pgque.metric_history ORDER BY bucket DESC LIMIT 1), \
                        (SELECT count(*) FROM pgque.metric_history_2)",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(seg(&mut c), (1, 11), "written to piece 1; piece 2 kept");
    r.batch_execute("COMMIT").unwrap();
    let n: i64 = c
        .query_one(
            "SELECT pgque.maint_history('30 minutes', now() - interval '1 minute')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    assert_eq!(seg(&mut c), (2, 1), "piece 2 truncated and current");
}
