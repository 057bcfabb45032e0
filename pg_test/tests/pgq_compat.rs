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

// ---- issue #35 / #30: the PgQue adapter's and clients' contracts ------------

fn one_i32(c: &mut Client, sql: &str) -> i32 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// PgQ's rotation steps: step 1 per queue, step 2 in a later transaction,
/// both returning 0 (PgQ's "no need to call again at once").
#[test]
fn maint_rotate_tables_steps_follow_pgq() {
    let db = TestDb::new("rotate_steps");
    let mut c = db.connect();
    stop_worker(&mut c);
    // (no consumer yet: one that has not read past the last switch holds
    // rotation back)
    c.batch_execute("SELECT pgque.create_queue('rq')").unwrap();
    let state = |c: &mut Client| -> (i32, bool) {
        let r = c
            .query_one(
                "SELECT queue_cur_table, queue_switch_step2 IS NOT NULL FROM pgque.queue \
                  WHERE queue_name = 'rq'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    // Nothing due: both 0, nothing changes.
    assert_eq!(
        one_i32(&mut c, "SELECT pgque.maint_rotate_tables_step2()"),
        0
    );
    let (t0, s2) = state(&mut c);
    assert!(s2, "step 2 of the creation is recorded");
    assert_eq!(
        one_i32(&mut c, "SELECT pgque.maint_rotate_tables_step1('rq')"),
        0
    );
    assert_eq!(
        state(&mut c),
        (t0, true),
        "rotation period not over: no switch"
    );
    // Period over (as PgQ's own test does it): step 1 switches; step 2 in the
    // same transaction leaves the switch pending, in the next one records it.
    c.batch_execute("UPDATE pgque.queue SET queue_rotation_period = '0' WHERE queue_name = 'rq'")
        .unwrap();
    let mut tx = c.transaction().unwrap();
    assert_eq!(
        tx.query_one("SELECT pgque.maint_rotate_tables_step1('rq')", &[])
            .unwrap()
            .get::<_, i32>(0),
        0
    );
    assert_eq!(
        tx.query_one("SELECT pgque.maint_rotate_tables_step2()", &[])
            .unwrap()
            .get::<_, i32>(0),
        0
    );
    tx.commit().unwrap();
    let (t1, s2) = state(&mut c);
    assert_eq!(t1, (t0 + 1) % 3, "step 1 switched tables");
    assert!(
        !s2,
        "step 2 in step 1's transaction does not record the switch"
    );
    assert_eq!(
        one_i32(&mut c, "SELECT pgque.maint_rotate_tables_step2()"),
        0
    );
    assert_eq!(state(&mut c), (t1, true), "step 2 recorded the switch");
    // Events sent after the switch are delivered as usual.
    // (one statement a transaction: a tick sees only committed sends)
    for sql in [
        "SELECT pgque.subscribe('rq', 'c')",
        "SELECT pgque.send('rq', 'after'::text)",
        "SELECT pgque.force_tick('rq')",
    ] {
        c.batch_execute(sql).unwrap();
    }
    let n = one_i64(&mut c, "SELECT count(*) FROM pgque.receive('rq', 'c', 10)");
    assert_eq!(n, 1);
    assert_eq!(
        sqlstate(c.query_one("SELECT pgque.maint_rotate_tables_step1('nope')", &[])),
        "42704"
    );
    assert_eq!(
        sqlstate(c.query_one("SELECT pgque.maint_rotate_tables_step1(NULL)", &[])),
        "22004"
    );
}

type InfoRow = (
    String,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    bool,
);

/// (consumer_name, last_tick, current_batch, next_tick, pending_events,
/// lag IS NOT NULL) of get_consumer_info's rows for `args`.
fn info(c: &mut Client, args: &str) -> Vec<InfoRow> {
    c.query(
        &format!(
            "SELECT consumer_name, last_tick, current_batch, next_tick, pending_events, lag IS NOT NULL \
               FROM pgque.get_consumer_info({args})"
        ),
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
    .collect()
}

/// PgQue's get_consumer_info for a cooperative consumer: the member's batch
/// moved the shared position on, the member row (`consumer.member`) shows it.
#[test]
fn get_consumer_info_of_a_cooperative_consumer_is_pgques() {
    let db = TestDb::new("coop_info");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute(
        "SELECT pgque.create_queue('iq'); SELECT pgque.subscribe('iq', 'c'); \
         SELECT pgque.register_subconsumer('iq', 'c', 'sub_0', true); \
         SELECT pgque.register_subconsumer('iq', 'c', 'sub_1'); \
         SELECT pgque.send_batch('iq', 'default', array(SELECT '{}' FROM generate_series(1, 1000))::text[])",
    )
    .unwrap();
    let t0 = one_i64(&mut c, "SELECT max(tick_id) FROM pgque.tick");
    let t1 = one_i64(&mut c, "SELECT pgque.force_tick('iq')");
    let r = c
        .query_one(
            "SELECT * FROM pgque.next_batch_custom('iq', 'c', 'sub_0', NULL, NULL, NULL)",
            &[],
        )
        .unwrap();
    let (b, prev, next): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
    assert_eq!((prev, next), (t0, t1));
    let parent = ("c".to_string(), Some(t1), None, None, Some(0), true);
    let member0 = (
        "c.sub_0".to_string(),
        Some(t0),
        Some(b),
        Some(t1),
        Some(1000),
        true,
    );
    let member1 = ("c.sub_1".to_string(), None, None, None, None, false);
    assert_eq!(
        info(&mut c, "'iq'"),
        vec![parent.clone(), member0.clone(), member1.clone()]
    );
    assert_eq!(info(&mut c, "'iq', 'c'"), vec![parent.clone()]);
    assert_eq!(info(&mut c, "'iq', 'c.sub_0'"), vec![member0]);
    assert_eq!(
        info(&mut c, "").len(),
        3,
        "get_consumer_info() lists members too"
    );
    assert_eq!(info(&mut c, "'iq', 'c.sub_1'"), vec![member1]);
    assert_eq!(
        sqlstate(c.query(
            "SELECT * FROM pgque.get_consumer_info('iq', 'c.nobody')",
            &[]
        )),
        "42704"
    );
    // Finished: the member row has no batch, the parent is where it was.
    c.query_one("SELECT pgque.finish_batch($1)", &[&b]).unwrap();
    let rows = info(&mut c, "'iq'");
    assert_eq!(rows[0], parent);
    assert_eq!(&rows[1].0, "c.sub_0");
    assert_eq!(
        (rows[1].1, rows[1].2, rows[1].3, rows[1].4),
        (None, None, None, None)
    );
    // A plain consumer's row is unchanged: its open batch is its own.
    for sql in [
        "SELECT pgque.subscribe('iq', 'plain')",
        "SELECT pgque.send('iq', 'x'::text)",
        "SELECT pgque.force_tick('iq')",
    ] {
        c.batch_execute(sql).unwrap();
    }
    let pb = one_i64(&mut c, "SELECT pgque.next_batch('iq', 'plain')");
    let rows = info(&mut c, "'iq', 'plain'");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].2, Some(pb));
    assert_eq!(rows[0].4, Some(1));
}

/// PgQue's TypeScript suite, "unsubscribeSubconsumer batchHandling=1 routes
/// through retry", through the SQL its client sends: the open batch's events
/// go to the retry queue (one row here), and the call returns 1.
#[test]
fn unsubscribe_subconsumer_with_batch_handling_retries_the_open_batch() {
    let db = TestDb::new("coop_unsub");
    let mut c = db.connect();
    stop_worker(&mut c);
    // setupTestQueue, then the cooperative tests' unsubscribe of the normal consumer.
    c.batch_execute(
        "SELECT pgque.create_queue('uq'); SELECT pgque.subscribe('uq', 'c'); \
         SELECT pgque.unsubscribe('uq', 'c')",
    )
    .unwrap();
    assert_eq!(
        one_i32(
            &mut c,
            "SELECT pgque.subscribe_subconsumer('uq', 'c', 'worker-flush')"
        ),
        1
    );
    // A second member keeps 'c' cooperative once worker-flush has gone.
    c.batch_execute("SELECT pgque.subscribe_subconsumer('uq', 'c', 'worker-2')")
        .unwrap();
    // send, then advanceQueue (force_next_tick, ticker), each its own transaction
    for sql in [
        "SELECT pgque.send('uq', 't', '{\"i\": 1}'::jsonb)",
        "SELECT pgque.force_next_tick('uq')",
        "SELECT pgque.ticker()",
    ] {
        c.batch_execute(sql).unwrap();
    }
    let msgs = c
        .query(
            "SELECT msg_id, batch_id FROM pgque.receive_coop('uq', 'c', 'worker-flush', 100)",
            &[],
        )
        .unwrap();
    assert_eq!(msgs.len(), 1);
    let (ev, b): (i64, i64) = (msgs[0].get(0), msgs[0].get(1));
    // The default refuses while the batch is open.
    assert_eq!(
        sqlstate(c.query_one(
            "SELECT pgque.unsubscribe_subconsumer('uq', 'c', 'worker-flush')",
            &[]
        )),
        "55000"
    );
    let removed = one_i32(
        &mut c,
        "SELECT pgque.unsubscribe_subconsumer('uq', 'c', 'worker-flush', 1) AS unsubscribe_subconsumer",
    );
    assert_eq!(removed, 1);
    let retry = c
        .query_one(
            "SELECT count(*)::text AS count FROM pgque.retry_queue rq \
               JOIN pgque.queue q ON q.queue_id = rq.ev_queue WHERE q.queue_name = $1",
            &[&"uq"],
        )
        .unwrap()
        .get::<_, String>(0);
    assert_eq!(retry, "1");
    // PgQue's event_retry(batch, event, 60): due in a minute, retry count 1,
    // owned by the consumer; the batch is finished, the member gone.
    let (id, retries, due_s): (i64, i32, f64) = {
        let r = c
            .query_one(
                "SELECT ev_id, ev_retry, extract(epoch FROM ev_retry_after - now())::float8 \
                   FROM pgque.retry_queue",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!((id, retries), (ev, 1));
    assert!((55.0..=61.0).contains(&due_s), "due in {due_s} s");
    let acked: i32 = c.query_one("SELECT pgque.ack($1)", &[&b]).unwrap().get(0);
    assert_eq!(acked, 0, "the batch was finished");
    assert_eq!(
        one_i64(
            &mut c,
            "SELECT count(*) FROM pgque.subscription WHERE sub_consumer = 'worker-flush'"
        ),
        0
    );
    // Due now: maint moves it back and the consumer gets it again.
    for sql in [
        "UPDATE pgque.retry_queue SET ev_retry_after = now()",
        "SELECT pgque.maint_retry_events()",
        "SELECT pgque.force_tick('uq')",
    ] {
        c.batch_execute(sql).unwrap();
    }
    let again = c
        .query(
            "SELECT msg_id, retry_count FROM pgque.receive_coop('uq', 'c', 'worker-2', 100)",
            &[],
        )
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        (again[0].get::<_, i64>(0), again[0].get::<_, Option<i32>>(1)),
        (ev, Some(1))
    );
    // Past max_retries the event is dead-lettered instead, with PgQue's reason.
    c.batch_execute("SELECT pgque.set_queue_config('uq', 'max_retries', '1')")
        .unwrap();
    assert_eq!(
        one_i32(
            &mut c,
            "SELECT pgque.unsubscribe_subconsumer('uq', 'c', 'worker-2', 1)"
        ),
        1
    );
    let dl = c
        .query_one(
            "SELECT count(*), min(dl_reason) FROM pgque.dead_letter WHERE ev_id = $1",
            &[&ev],
        )
        .unwrap();
    assert_eq!(
        (
            dl.get::<_, i64>(0),
            dl.get::<_, Option<String>>(1).as_deref()
        ),
        (1, Some("subconsumer unregistered"))
    );
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pgque.retry_queue"), 0);
}

/// The SQL PgQue's benchmark adapter drives (hardbyte/
/// postgresql-job-queue-benchmarking, pgque-bench/main.py), statement by
/// statement, each in its own transaction (the adapter's connections are
/// autocommit): two replicas' setup (subconsumer mode), the producer's
/// send_batch / send, the ticker task's ticker(queue), the maint tasks'
/// maint() and maint_rotate_tables_step2(), each replica's
/// next_batch_custom -> get_batch_events -> finish_batch loop, the depth
/// poller's get_consumer_info(queue, consumer), the nack-always mode, and
/// the shutdown's unregister_subconsumer(..., 1).
#[test]
fn pgque_benchmark_adapter_sql_runs_as_on_pgque() {
    let db = TestDb::new("adapter");
    let mut c = db.connect();
    stop_worker(&mut c); // the adapter ticks and maintains by itself
    const Q: &str = "long_horizon_bench";
    const C: &str = "bench_consumer";
    let subs = ["sub_0", "sub_1"];
    // setup_queue, once per replica: create_queue and subscribe are
    // idempotent (0 the second time, no UniqueViolation to absorb), the
    // conversion to cooperative too.
    for (i, sub) in subs.iter().enumerate() {
        let created: i32 = c
            .query_one("SELECT pgque.create_queue($1)", &[&Q])
            .unwrap()
            .get(0);
        assert_eq!(created, (i == 0) as i32);
        let subscribed: i32 = c
            .query_one("SELECT pgque.subscribe($1, $2)", &[&Q, &C])
            .unwrap()
            .get(0);
        assert_eq!(subscribed, (i == 0) as i32);
        let reg: i32 = c
            .query_one(
                "SELECT pgque.register_subconsumer($1, $2, $3, true)",
                &[&Q, &C, sub],
            )
            .unwrap()
            .get(0);
        assert_eq!(reg, 1);
        for (param, value) in [
            ("ticker_max_count", "200"),
            ("ticker_max_lag", "100 milliseconds"),
            ("ticker_idle_period", "500 milliseconds"),
        ] {
            c.query_one(
                "SELECT pgque.set_queue_config($1, $2, $3)",
                &[&Q, &param, &value],
            )
            .unwrap();
        }
    }
    let again: i32 = c
        .query_one(
            "SELECT pgque.register_subconsumer($1, $2, $3, true)",
            &[&Q, &C, &"sub_0"],
        )
        .unwrap()
        .get(0);
    assert_eq!(again, 0, "a replica restart registers nothing new");

    let produce = |c: &mut Client, seq: &mut i64, n: usize| -> Vec<i64> {
        let payloads: Vec<String> = (0..n)
            .map(|_| {
                *seq += 1;
                format!(
                    "{{\"seq\": {seq}, \"created_at\": \"2026-01-01T00:00:00.000Z\", \"padding\": \"{}\"}}",
                    "x".repeat(192)
                )
            })
            .collect();
        if n == 1 {
            vec![c
                .query_one("SELECT pgque.send($1, $2::text)", &[&Q, &payloads[0]])
                .unwrap()
                .get(0)]
        } else {
            c.query_one(
                "SELECT pgque.send_batch($1, $2, $3::text[])",
                &[&Q, &"default", &payloads],
            )
            .unwrap()
            .get(0)
        }
    };
    // One replica's consumer_task iteration: the batch's event ids, or None.
    let consume = |c: &mut Client, sub: &str| -> Option<Vec<i64>> {
        let b: Option<i64> = c
            .query_one(
                "SELECT batch_id FROM pgque.next_batch_custom(\
                 $1, $2, $3, '0 ms'::interval, 1, '0 ms'::interval)",
                &[&Q, &C, &sub],
            )
            .unwrap()
            .get(0);
        let b = b?;
        let rows = c
            .query(
                "SELECT ev_id, ev_data FROM pgque.get_batch_events($1)",
                &[&b],
            )
            .unwrap();
        for r in &rows {
            let data: String = r.get(1);
            assert!(data.starts_with("{\"seq\": "), "{data}");
        }
        let done: i32 = c
            .query_one("SELECT pgque.finish_batch($1)", &[&b])
            .unwrap()
            .get(0);
        assert_eq!(done, 1);
        Some(rows.iter().map(|r| r.get(0)).collect())
    };
    let depth = |c: &mut Client| -> i64 {
        let row = c
            .query_opt(
                "SELECT pending_events FROM pgque.get_consumer_info($1, $2)",
                &[&Q, &C],
            )
            .unwrap()
            .expect("the parent consumer's row");
        row.get::<_, Option<i64>>(0).unwrap_or(0)
    };

    let mut seq = 0;
    let mut sent = vec![];
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..6 {
        // 128-event batches, one single send: past ticker_max_count (200),
        // so the ticker task's ticker(queue) ticks.
        sent.extend(produce(&mut c, &mut seq, 128));
        sent.extend(produce(&mut c, &mut seq, 128));
        sent.extend(produce(&mut c, &mut seq, 1));
        assert!(depth(&mut c) >= 257, "the depth poller sees the backlog");
        let t: Option<i64> = c
            .query_one("SELECT pgque.ticker($1)", &[&Q])
            .unwrap()
            .get(0);
        assert!(t.is_some(), "ticker(queue) ticked past ticker_max_count");
        // maint task and maint_step2 task, each on its own connection.
        c.query_one("SELECT pgque.maint()", &[]).unwrap();
        let s2: i32 = c
            .query_one("SELECT pgque.maint_rotate_tables_step2()", &[])
            .unwrap()
            .get(0);
        assert_eq!(s2, 0);
        // Both replicas poll; whichever gets the tick's batch takes it.
        for sub in subs.iter().cycle().skip(round % 2).take(2) {
            if let Some(ids) = consume(&mut c, sub) {
                for id in ids {
                    assert!(seen.insert(id), "event {id} delivered twice");
                }
            }
        }
        assert_eq!(depth(&mut c), 0, "consumed up to the last tick");
        // Nothing new: both replicas get NULL (and wait for a NOTIFY).
        for sub in subs {
            assert!(consume(&mut c, sub).is_none());
        }
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), sent);
    // get_consumer_info(queue): the consumer and its two replicas.
    let names: Vec<String> = c
        .query(
            "SELECT consumer_name FROM pgque.get_consumer_info($1)",
            &[&Q],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        names,
        [
            "bench_consumer",
            "bench_consumer.sub_0",
            "bench_consumer.sub_1"
        ]
    );

    // WORKER_FAIL_MODE=nack-always: max_retries 0, every event nacked with
    // a message built from its id: straight to the dead letters.
    c.query_one(
        "SELECT pgque.set_queue_config($1, 'max_retries', '0')",
        &[&Q],
    )
    .unwrap();
    let nacked = produce(&mut c, &mut seq, 128);
    c.query_one("SELECT pgque.force_tick($1)", &[&Q]).unwrap();
    let b: i64 = c
        .query_one(
            "SELECT batch_id FROM pgque.next_batch_custom(\
             $1, $2, $3, '0 ms'::interval, 1, '0 ms'::interval)",
            &[&Q, &C, &"sub_0"],
        )
        .unwrap()
        .get(0);
    let rows = c
        .query(
            "SELECT ev_id, ev_data FROM pgque.get_batch_events($1)",
            &[&b],
        )
        .unwrap();
    assert_eq!(rows.len(), nacked.len());
    for r in &rows {
        let ev: i64 = r.get(0);
        let rc: i32 = c
            .query_one(
                "SELECT pgque.nack($1, ROW($2::bigint, $3::bigint, NULL::text, NULL::text, \
                        NULL::int4, NULL::timestamptz, NULL::text, NULL::text, NULL::text, \
                        NULL::text)::pgque.message, '0 seconds'::interval, \
                        'WORKER_FAIL_MODE=nack-always') AS rc",
                &[&b, &ev, &b],
            )
            .unwrap()
            .get(0);
        assert_eq!(rc, 1);
    }
    c.query_one("SELECT pgque.finish_batch($1)", &[&b]).unwrap();
    let dead = one_i64(
        &mut c,
        "SELECT count(*) FROM pgque.dead_letter WHERE dl_reason = 'WORKER_FAIL_MODE=nack-always'",
    );
    assert_eq!(dead, nacked.len() as i64);

    // Shutdown: each replica releases its in-flight batch (sub_1 holds one).
    sent = produce(&mut c, &mut seq, 5);
    c.query_one("SELECT pgque.force_tick($1)", &[&Q]).unwrap();
    let held: Option<i64> = c
        .query_one(
            "SELECT batch_id FROM pgque.next_batch_custom(\
             $1, $2, $3, '0 ms'::interval, 1, '0 ms'::interval)",
            &[&Q, &C, &"sub_1"],
        )
        .unwrap()
        .get(0);
    assert!(held.is_some());
    c.query_one(
        "SELECT pgque.set_queue_config($1, 'max_retries', '5')",
        &[&Q],
    )
    .unwrap();
    for sub in subs {
        let n: i32 = c
            .query_one(
                "SELECT pgque.unregister_subconsumer($1, $2, $3, 1)",
                &[&Q, &C, &sub],
            )
            .unwrap()
            .get(0);
        assert_eq!(n, 1);
    }
    let retried: Vec<i64> = c
        .query("SELECT ev_id FROM pgque.retry_queue ORDER BY ev_id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(retried, sent, "the in-flight batch went to retry");
    let names = one_i64(
        &mut c,
        "SELECT count(*) FROM pgque.get_consumer_info('long_horizon_bench')",
    );
    assert_eq!(names, 1, "the consumer stays, a normal consumer again");
}
