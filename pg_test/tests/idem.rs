//! send_idem with real sessions: concurrent producers of one key, rollback,
//! expiry, GC of the key ledger, and its dead tuples over 100,000 sends.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// A database with a queue `q` and the worker off (GC runs only when called).
fn setup(name: &str) -> TestDb {
    let db = TestDb::new(name);
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute("SELECT pgque.create_queue('q')").unwrap();
    db
}

fn send_idem(c: &mut Client, key: &str, ttl: &str) -> (i64, bool) {
    let r = c
        .query_one(
            "SELECT event_id, deduped FROM pgque.send_idem('q', 'effect', '{\"n\": 1}'::jsonb, $1, $2::text::interval)",
            &[&key, &ttl],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

fn events_in_queue(c: &mut Client) -> i64 {
    let qid: i32 = c
        .query_one(
            "SELECT queue_id FROM pgque.queue WHERE queue_name = 'q'",
            &[],
        )
        .unwrap()
        .get(0);
    c.query_one(&format!("SELECT count(*) FROM pgque.event_{qid}"), &[])
        .unwrap()
        .get(0)
}

#[test]
fn simultaneous_producers_of_one_key_make_one_event() {
    let db = setup("idem_race");
    let n = 8;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let mut c = db.connect();
            let b = barrier.clone();
            std::thread::spawn(move || {
                b.wait();
                send_idem(&mut c, "migrate:tenant-1:v7", "1 hour")
            })
        })
        .collect();
    let results: Vec<(i64, bool)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let first = results[0].0;
    assert!(
        results.iter().all(|r| r.0 == first),
        "every caller gets the one event id: {results:?}"
    );
    assert_eq!(
        results.iter().filter(|r| !r.1).count(),
        1,
        "exactly one caller sent: {results:?}"
    );
    assert_eq!(events_in_queue(&mut db.connect()), 1);
}

#[test]
fn second_producer_waits_for_the_first_and_gets_its_id() {
    let db = setup("idem_wait");
    let mut c1 = db.connect();
    c1.batch_execute("BEGIN").unwrap();
    let (id1, dup) = send_idem(&mut c1, "k", "1 hour");
    assert!(!dup);
    let mut c2 = db.connect();
    let h = std::thread::spawn(move || send_idem(&mut c2, "k", "1 hour"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !h.is_finished(),
        "the second producer must wait for the first claim's outcome"
    );
    c1.batch_execute("COMMIT").unwrap();
    assert_eq!(h.join().unwrap(), (id1, true));
}

#[test]
fn rolled_back_claim_leaves_the_key_free() {
    let db = setup("idem_rollback");
    let mut c1 = db.connect();
    // Alone: a rollback leaves nothing behind.
    c1.batch_execute("BEGIN").unwrap();
    send_idem(&mut c1, "k1", "1 hour");
    c1.batch_execute("ROLLBACK").unwrap();
    let (_, dup) = send_idem(&mut db.connect(), "k1", "1 hour");
    assert!(!dup);
    // With a waiter: the waiter takes the key when the first rolls back.
    c1.batch_execute("BEGIN").unwrap();
    let (id_rolled_back, _) = send_idem(&mut c1, "k2", "1 hour");
    let mut c2 = db.connect();
    let h = std::thread::spawn(move || send_idem(&mut c2, "k2", "1 hour"));
    std::thread::sleep(Duration::from_millis(200));
    c1.batch_execute("ROLLBACK").unwrap();
    let (id2, dup) = h.join().unwrap();
    assert!(!dup);
    assert_ne!(id2, id_rolled_back);
    assert_eq!(events_in_queue(&mut db.connect()), 2);
    let claims: i64 = db
        .connect()
        .query_one("SELECT count(*) FROM pgque.idem_key", &[])
        .unwrap()
        .get(0);
    assert_eq!(claims, 2);
}

#[test]
fn expiry_frees_the_key() {
    let db = setup("idem_expiry");
    let mut c = db.connect();
    let (first, _) = send_idem(&mut c, "k", "1 second");
    assert_eq!(send_idem(&mut c, "k", "1 second"), (first, true));
    std::thread::sleep(Duration::from_millis(1200));
    let (second, dup) = send_idem(&mut c, "k", "1 hour");
    assert!(!dup);
    assert_ne!(second, first);
}

#[test]
fn bad_input_gets_specific_sqlstates_and_changes_nothing() {
    let db = setup("idem_bad");
    let mut c = db.connect();
    let cases: &[(&str, &str)] = &[
        (
            "SELECT * FROM pgque.send_idem('q', 't', 'x'::text, NULL)",
            "22004",
        ),
        (
            "SELECT * FROM pgque.send_idem('q', 't', 'x'::text, '')",
            "22023",
        ),
        (
            "SELECT * FROM pgque.send_idem('q', 't', 'x'::text, 'k', '0 seconds')",
            "22023",
        ),
        (
            "SELECT * FROM pgque.send_idem('q', 't', 'x'::text, 'k', '-1 hour')",
            "22023",
        ),
        (
            "SELECT * FROM pgque.send_idem('q', 't', 'x'::text, 'k', NULL)",
            "22004",
        ),
        (
            "SELECT * FROM pgque.send_idem('nope', 't', 'x'::text, 'k')",
            "42704",
        ),
        (
            "SELECT * FROM pgque.send_idem(NULL, 't', 'x'::text, 'k')",
            "22004",
        ),
        (
            "SELECT * FROM pgque.send_idem('q', NULL, 'x'::text, 'k')",
            "22004",
        ),
        (
            "SELECT * FROM pgque.send_idem('q', 't', 'not json'::text::jsonb, 'k')",
            "22P02",
        ),
    ];
    for (sql, code) in cases {
        assert_eq!(&sqlstate(c.query(*sql, &[])), code, "{sql}");
    }
    if major() >= 17 {
        let r = c.query(
            "SELECT * FROM pgque.send_idem('q', 't', 'x'::text, 'k', 'infinity'::interval)",
            &[],
        );
        assert_eq!(sqlstate(r), "22023");
    }
    let over_long = "k".repeat(1025);
    assert_eq!(
        sqlstate(c.query(
            "SELECT * FROM pgque.send_idem('q', 't', 'x'::text, $1)",
            &[&over_long]
        )),
        "22023"
    );
    assert_eq!(events_in_queue(&mut c), 0);
    let claims: i64 = c
        .query_one("SELECT count(*) FROM pgque.idem_key", &[])
        .unwrap()
        .get(0);
    assert_eq!(claims, 0);
}

/// Runs maint_idem() with a 1 s rotation period until `done` or 15 s pass.
fn gc_until(c: &mut Client, mut done: impl FnMut(&mut Client) -> bool) -> bool {
    c.batch_execute("SET pgque.ledger_rotation_period = '1s'")
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        c.batch_execute("SELECT pgque.maint_idem()").unwrap();
        if done(c) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    false
}

#[test]
fn gc_removes_expired_keys_and_nothing_live() {
    let db = setup("idem_gc");
    let mut c = db.connect();
    let (live_id, _) = send_idem(&mut c, "live", "1 hour");
    for i in 0..100 {
        send_idem(&mut c, &format!("short-{i}"), "1 second");
    }
    let ok = gc_until(&mut c, |c| {
        let n: i64 = c
            .query_one("SELECT count(*) FROM pgque.idem_key", &[])
            .unwrap()
            .get(0);
        n == 1
    });
    assert!(
        ok,
        "GC did not bring the ledger down to the one live key within 15 s"
    );
    // The live key survived (copied forward) and still deduplicates.
    assert_eq!(send_idem(&mut c, "live", "1 hour"), (live_id, true));
    // The expired ones can be claimed anew.
    let (_, dup) = send_idem(&mut c, "short-5", "1 hour");
    assert!(!dup);
}

#[test]
fn hundred_thousand_rolling_keys_leave_no_dead_tuples() {
    let db = setup("idem_bloat");
    let mut c = db.connect();
    c.batch_execute("SET pgque.ledger_rotation_period = '1s'")
        .unwrap();
    let start = Instant::now();
    let mut max_rows = 0i64;
    for batch in 0..100 {
        c.execute(
            "SELECT count(*) FROM generate_series(1, 1000) g, \
               LATERAL pgque.send_idem('q', 'effect', 'x'::text, 'key-' || ($1::int * 1000 + g), '1 second')",
            &[&batch],
        )
        .unwrap();
        c.batch_execute("SELECT pgque.maint_idem()").unwrap();
        let n: i64 = c
            .query_one("SELECT count(*) FROM pgque.idem_key", &[])
            .unwrap()
            .get(0);
        max_rows = max_rows.max(n);
    }
    let secs = start.elapsed().as_secs_f64();
    let rate = 100_000.0 / secs;
    flush_stats(&mut c);
    let dead: i64 = c
        .query_one(
            "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables \
              WHERE schemaname = 'pgque' AND relname LIKE 'idem\\_key\\_p%'",
            &[],
        )
        .unwrap()
        .get(0);
    println!("100k send_idem in {secs:.1} s ({rate:.0}/s): ledger peak {max_rows} rows, {dead} dead tuples");
    // Bound: no DELETE or UPDATE touches the ledger (new keys, TRUNCATE for GC).
    assert_eq!(dead, 0, "dead tuples in the key ledger");
    // Size bound: a key lives 1 s, and a piece is truncated at most ~4 rotation
    // periods (4 s) after it stopped taking claims, so the ledger holds at most
    // what ~6 s of sends claim — not the 100,000 sent in all.
    let bound = (rate * 6.0) as i64 + 2_000;
    assert!(
        max_rows <= bound.min(100_000),
        "ledger peaked at {max_rows} rows (bound {bound})"
    );
}
