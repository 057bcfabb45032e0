//! PgQue's API beyond DESIGN.md section 1 (section 11), where commits, ticks
//! or other sessions are needed: ticker_loop, uninstall, the owner-only
//! insert_event_bulk, maint_deliver_delayed, and the observability functions
//! over a queue with real traffic.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::time::Duration;

fn one_i64(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// A login role of this database's test, member of `grant`.
fn role(c: &mut Client, name: &str, grant: &str) {
    c.batch_execute(&format!(
        "DO $$ BEGIN CREATE ROLE {name} LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$; \
         GRANT {grant} TO {name}"
    ))
    .unwrap();
}

#[test]
fn ticker_loop_ticks_and_commits_until_cancelled() {
    let db = TestDb::new("ticker_loop");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute(
        "SELECT pgque.create_queue('tl'); SELECT pgque.subscribe('tl', 'c'); \
         SELECT pgque.set_tick_period_ms(20)",
    )
    .unwrap();
    let mut looper = db.connect();
    let pid: i32 = looper
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let h = std::thread::spawn(move || looper.batch_execute("CALL pgque.ticker_loop()"));
    // Events sent while the loop runs are ticked by it (no worker here), and
    // its ticks are committed: another session reads them.
    c.batch_execute("SELECT pgque.send('tl', 'one'::text)")
        .unwrap();
    let got = wait_until(Duration::from_secs(10), || {
        !c.query("SELECT 1 FROM pgque.receive('tl', 'c', 10)", &[])
            .unwrap()
            .is_empty()
    });
    assert!(got, "ticker_loop ticked the queue");
    let ticks = one_i64(
        &mut c,
        "SELECT count(*) FROM pgque.tick WHERE tick_queue = 1",
    );
    assert!(ticks >= 2, "{ticks} ticks");
    assert!(!h.is_finished(), "ticker_loop runs until cancelled");
    c.query_one("SELECT pg_cancel_backend($1)", &[&pid])
        .unwrap();
    let r = h.join().unwrap();
    assert_eq!(sqlstate(r), "57014", "cancelled");
}

#[test]
fn uninstall_is_for_the_owner_and_removes_everything() {
    let db = TestDb::new("uninstall");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('uq'); SELECT pgque.send('uq', 'x'::text)")
        .unwrap();
    let admin = format!("{}_admin", db.name);
    role(&mut c, &admin, "pgque_admin");
    let mut a = db.connect_as(&admin);
    assert_eq!(
        sqlstate(a.batch_execute("SELECT pgque.uninstall()")),
        "42501"
    );
    c.batch_execute("SELECT pgque.uninstall()").unwrap();
    let left = one_i64(
        &mut c,
        "SELECT (SELECT count(*) FROM pg_extension WHERE extname = 'pgque') \
              + (SELECT count(*) FROM pg_namespace WHERE nspname = 'pgque')",
    );
    assert_eq!(left, 0, "extension and schema are gone");
    // And it can be installed again.
    c.batch_execute("CREATE EXTENSION pgque; SELECT pgque.create_queue('uq')")
        .unwrap();
}

#[test]
fn insert_event_bulk_is_for_the_owner_only_and_its_events_are_delivered() {
    let db = TestDb::new("bulk");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('bq'); SELECT pgque.subscribe('bq', 'c')")
        .unwrap();
    for (r, grant) in [("writer", "pgque_writer"), ("admin", "pgque_admin")] {
        let name = format!("{}_{r}", db.name);
        role(&mut c, &name, grant);
        let mut x = db.connect_as(&name);
        assert_eq!(
            sqlstate(x.batch_execute("SELECT pgque.insert_event_bulk('bq', 't', ARRAY['a'])")),
            "42501",
            "{grant} may not call insert_event_bulk"
        );
    }
    let ids: Vec<i64> = c
        .query_one(
            "SELECT pgque.insert_event_bulk('bq', 't', ARRAY['a', 'b'])",
            &[],
        )
        .unwrap()
        .get(0);
    c.batch_execute("SELECT pgque.force_tick('bq')").unwrap();
    let got: Vec<(i64, String)> = c
        .query(
            "SELECT msg_id, payload FROM pgque.receive('bq', 'c', 10) ORDER BY msg_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        got,
        vec![(ids[0], "a".to_string()), (ids[1], "b".to_string())]
    );
}

#[test]
fn maint_deliver_delayed_promotes_due_delayed_events() {
    let db = TestDb::new("deliver_delayed");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute(
        "SELECT pgque.create_queue('dq'); SELECT pgque.subscribe('dq', 'c'); \
         SELECT pgque.send_at('dq', 't', 'later'::text, clock_timestamp() + interval '300 ms')",
    )
    .unwrap();
    assert_eq!(
        one_i64(&mut c, "SELECT pgque.maint_deliver_delayed()"),
        0,
        "not due yet"
    );
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(one_i64(&mut c, "SELECT pgque.maint_deliver_delayed()"), 1);
    c.batch_execute("SELECT pgque.force_tick('dq')").unwrap();
    let n = c
        .query("SELECT 1 FROM pgque.receive('dq', 'c', 10)", &[])
        .unwrap()
        .len();
    assert_eq!(n, 1);
}

#[test]
fn observability_reports_depth_lag_batches_throughput_and_errors() {
    let db = TestDb::new("observe");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute(
        "SELECT pgque.create_queue('oq'); SELECT pgque.subscribe('oq', 'fast'); \
         SELECT pgque.subscribe('oq', 'slow'); SELECT pgque.set_queue_config('oq', 'max_retries', '0')",
    )
    .unwrap();
    c.batch_execute("SELECT pgque.send_batch('oq', ARRAY['a', 'b', 'c'])")
        .unwrap();
    c.batch_execute("SELECT pgque.force_tick('oq')").unwrap();
    c.batch_execute("SELECT pgque.send_batch('oq', ARRAY['d', 'e'])")
        .unwrap();
    c.batch_execute("SELECT pgque.force_tick('oq')").unwrap();
    // fast reads all five, dead-letters one and acks; slow keeps its batch open.
    let b1: i64 = one_i64(
        &mut c,
        "SELECT batch_id FROM pgque.receive('oq', 'fast', 100) LIMIT 1",
    );
    c.batch_execute(&format!(
        "SELECT pgque.nack({b1}, m, '0', 'bad') FROM pgque.receive('oq', 'fast', 100) m LIMIT 1; \
         SELECT pgque.ack({b1})"
    ))
    .unwrap();
    let bs: i64 = one_i64(
        &mut c,
        "SELECT batch_id FROM pgque.receive('oq', 'slow', 100) LIMIT 1",
    );

    let r = c
        .query_one(
            "SELECT depth, consumers, dlq_count, last_tick_id IS NOT NULL, ticker_paused, cur_table \
               FROM pgque.queue_stats() WHERE queue_name = 'oq'",
            &[],
        )
        .unwrap();
    assert_eq!(r.get::<_, i64>(0), 5, "slow has all 5 events ahead");
    assert_eq!(r.get::<_, i32>(1), 2);
    assert_eq!(r.get::<_, i64>(2), 1);
    assert!(r.get::<_, bool>(3));
    assert!(!r.get::<_, bool>(4));

    let cs: Vec<(String, i64, bool, Option<i64>)> = c
        .query(
            "SELECT consumer_name, pending_events, batch_active, batch_id FROM pgque.consumer_stats() \
              WHERE queue_name = 'oq' ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        cs,
        vec![
            ("fast".to_string(), 0, false, None),
            ("slow".to_string(), 5, true, Some(bs))
        ]
    );

    let inf: Vec<(String, i64, i64)> = c
        .query(
            "SELECT consumer_name, batch_id, estimated_events FROM pgque.in_flight('oq')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(inf, vec![("slow".to_string(), bs, 5)]);

    let events = one_i64(
        &mut c,
        "SELECT coalesce(sum(events), 0)::int8 FROM pgque.throughput('oq', '1 hour', '1 minute')",
    );
    assert_eq!(events, 5, "throughput sums the ticks' events");
    let dead = one_i64(
        &mut c,
        "SELECT sum(dead_letters)::int8 FROM pgque.error_rate('oq', '1 hour', '1 minute')",
    );
    assert_eq!(dead, 1);

    let stuck: Vec<String> = c
        .query("SELECT consumer_name FROM pgque.stuck_consumers('0') WHERE queue_name = 'oq' ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(stuck.contains(&"slow".to_string()), "{stuck:?}");
    let none = c
        .query(
            "SELECT 1 FROM pgque.stuck_consumers('1 hour') WHERE queue_name = 'oq'",
            &[],
        )
        .unwrap()
        .len();
    assert_eq!(none, 0);

    let depth: String = c
        .query_one(
            "SELECT metric_value::text FROM pgque.otel_metrics() \
              WHERE metric_name = 'pgque.queue.depth' AND labels = '{\"queue\": \"oq\"}'::jsonb",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(depth, "5");
    let pending: String = c
        .query_one(
            "SELECT metric_value::text FROM pgque.otel_metrics() \
              WHERE metric_name = 'pgque.consumer.pending_events' \
                AND labels = '{\"queue\": \"oq\", \"consumer\": \"slow\"}'::jsonb",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(pending, "5");

    let checks: Vec<(String, String)> = c
        .query("SELECT check_name, status FROM pgque.queue_health() WHERE queue_name IN ('oq', 'system') ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for want in [
        ("consumer_lag:fast", "ok"),
        ("consumer_lag:slow", "ok"),
        ("dlq_health", "ok"),
        ("rotation_health", "ok"),
        ("ticker_running", "ok"),
        ("worker", "critical"),
    ] {
        assert!(
            checks.contains(&(want.0.to_string(), want.1.to_string())),
            "{want:?} in {checks:?}"
        );
    }
    // The reader role may call them; the writer may not.
    let reader = format!("{}_reader", db.name);
    role(&mut c, &reader, "pgque_reader");
    let mut rd = db.connect_as(&reader);
    rd.batch_execute("SELECT * FROM pgque.queue_stats(); SELECT * FROM pgque.in_flight('oq')")
        .unwrap();
    let writer = format!("{}_writer", db.name);
    role(&mut c, &writer, "pgque_writer");
    let mut w = db.connect_as(&writer);
    assert_eq!(
        sqlstate(w.batch_execute("SELECT * FROM pgque.queue_stats()")),
        "42501"
    );
}
