//! send_at with real sessions and the background worker: delayed events
//! appear no earlier than deliver_at and promptly after, in deliver_at order,
//! exactly once even from a transaction that commits late, and their storage
//! takes no dead tuples.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::time::{Duration, Instant};

fn setup(name: &str, worker: bool) -> TestDb {
    let db = TestDb::new(name);
    let mut c = db.connect();
    if !worker {
        stop_worker(&mut c);
    }
    c.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c')")
        .unwrap();
    db
}

/// Receives and acks one batch: (payloads, server clock at receive).
fn receive(c: &mut Client) -> Vec<String> {
    let rows = c
        .query(
            "SELECT payload, batch_id FROM pgque.receive('q', 'c', 1000)",
            &[],
        )
        .unwrap();
    if let Some(r) = rows.first() {
        let b: i64 = r.get(1);
        c.execute("SELECT pgque.ack($1)", &[&b]).unwrap();
    }
    rows.iter().map(|r| r.get(0)).collect()
}

#[test]
fn delayed_event_arrives_at_its_time_not_before() {
    let db = setup("dl_timing", true);
    let mut c = db.connect();
    let r = c
        .query_one(
            "SELECT pgque.send_at('q', 't', 'later'::text, clock_timestamp() + interval '1.5 seconds'), \
                    extract(epoch FROM clock_timestamp() + interval '1.5 seconds')::float8",
            &[],
        )
        .unwrap();
    let id: i64 = r.get(0);
    let due: f64 = r.get::<_, f64>(1);
    let start = Instant::now();
    let mut got_at = None;
    while start.elapsed() < Duration::from_secs(6) {
        let rows = c
            .query("SELECT msg_id, extract(epoch FROM clock_timestamp())::float8, batch_id FROM pgque.receive('q', 'c')", &[])
            .unwrap();
        if let Some(r) = rows.first() {
            assert_eq!(
                r.get::<_, i64>(0),
                id,
                "the delivered event carries the id send_at returned"
            );
            got_at = Some(r.get::<_, f64>(1));
            let b: i64 = r.get(2);
            c.execute("SELECT pgque.ack($1)", &[&b]).unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let got_at = got_at.expect("the delayed event was not delivered within 6 s");
    let late = got_at - due;
    println!("delivered {late:.3} s after deliver_at");
    assert!(late >= 0.0, "delivered {:.3} s before deliver_at", -late);
    // Promotion cadence (100 ms) + a tick + polling (20 ms) + slack for a busy machine.
    assert!(late < 0.8, "delivered {late:.3} s after deliver_at");
}

#[test]
fn delayed_events_come_in_deliver_at_order() {
    let db = setup("dl_order", true);
    let mut c = db.connect();
    // Sent in the order 3, 1, 2; due 300 ms apart.
    for (p, ms) in [("third", 900), ("first", 300), ("second", 600)] {
        c.execute(
            "SELECT pgque.send_at('q', 't', $1::text, clock_timestamp() + $2::int * interval '1 millisecond')",
            &[&p, &ms],
        )
        .unwrap();
    }
    let mut seen = vec![];
    let start = Instant::now();
    while seen.len() < 3 && start.elapsed() < Duration::from_secs(6) {
        seen.extend(receive(&mut c));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(seen, vec!["first", "second", "third"]);
}

#[test]
fn past_deliver_at_is_immediate_and_bad_input_is_refused() {
    let db = setup("dl_past", false);
    let mut c = db.connect();
    c.execute(
        "SELECT pgque.send_at('q', 't', 'now'::text, now() - interval '1 hour')",
        &[],
    )
    .unwrap();
    c.execute("SELECT pgque.force_tick('q')", &[]).unwrap();
    assert_eq!(receive(&mut c), vec!["now"]);
    for (sql, code) in [
        ("SELECT pgque.send_at('q', 't', 'x'::text, NULL)", "22004"),
        (
            "SELECT pgque.send_at('q', 't', 'x'::text, 'infinity')",
            "22023",
        ),
        (
            "SELECT pgque.send_at('q', 't', 'x'::text, '-infinity')",
            "22023",
        ),
        (
            "SELECT pgque.send_at('nope', 't', 'x'::text, now())",
            "42704",
        ),
        ("SELECT pgque.send_at('q', NULL, 'x'::text, now())", "22004"),
    ] {
        assert_eq!(sqlstate(c.query(sql, &[])), code, "{sql}");
    }
    let n: i64 = c
        .query_one("SELECT count(*) FROM pgque.delayed_event", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[test]
fn late_committing_delayed_send_is_delivered_once() {
    let db = setup("dl_latecommit", false);
    let mut c1 = db.connect();
    let mut c = db.connect();
    c1.batch_execute("BEGIN").unwrap();
    c1.execute("SELECT pgque.send_at('q', 't', 'late'::text, clock_timestamp() + interval '100 milliseconds')", &[])
        .unwrap();
    // Another delayed event becomes due and is promoted while c1 is open.
    c.execute("SELECT pgque.send_at('q', 't', 'early'::text, clock_timestamp() + interval '50 milliseconds')", &[])
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let n: i64 = c
        .query_one("SELECT pgque.maint_delayed()", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "only the committed event is promoted");
    c1.batch_execute("COMMIT").unwrap();
    let mut seen = vec![];
    for _ in 0..5 {
        c.execute("SELECT pgque.maint_delayed()", &[]).unwrap();
        c.execute("SELECT pgque.force_tick('q')", &[]).unwrap();
        seen.extend(receive(&mut c));
    }
    seen.sort();
    assert_eq!(
        seen,
        vec!["early", "late"],
        "each delayed event exactly once"
    );
}

#[test]
fn delayed_storage_takes_no_dead_tuples_across_rotations() {
    let db = setup("dl_bloat", false);
    let mut c = db.connect();
    c.batch_execute("SET pgque.ledger_rotation_period = '1s'")
        .unwrap();
    let start = Instant::now();
    let mut delivered = 0usize;
    let mut sent = 0usize;
    while start.elapsed() < Duration::from_secs(8) {
        c.execute(
            "SELECT count(pgque.send_at('q', 't', 'x'::text, clock_timestamp() + interval '200 milliseconds')) \
               FROM generate_series(1, 200)",
            &[],
        )
        .unwrap();
        sent += 200;
        std::thread::sleep(Duration::from_millis(100));
        c.execute("SELECT pgque.maint_delayed()", &[]).unwrap();
        c.execute("SELECT pgque.force_tick('q')", &[]).unwrap();
        delivered += receive(&mut c).len();
    }
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        c.execute("SELECT pgque.maint_delayed()", &[]).unwrap();
        c.execute("SELECT pgque.force_tick('q')", &[]).unwrap();
        delivered += receive(&mut c).len();
        std::thread::sleep(Duration::from_millis(1100));
    }
    assert_eq!(delivered, sent, "every delayed event delivered once");
    let held: i64 = c
        .query_one("SELECT count(*) FROM pgque.delayed_event", &[])
        .unwrap()
        .get(0);
    flush_stats(&mut c);
    let dead: i64 = c
        .query_one(
            "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables \
              WHERE schemaname = 'pgque' AND relname LIKE 'delayed\\_event\\_p%'",
            &[],
        )
        .unwrap()
        .get(0);
    println!("{sent} delayed events through rotating storage: {held} rows held at the end, {dead} dead tuples");
    assert_eq!(dead, 0);
    assert!(
        held < sent as i64 / 2,
        "storage was not truncated: {held} of {sent} rows still held"
    );
}
