//! Idle workers (issue 23), on a private cluster with idle mode on (the
//! default; the shared server switches it off, run.sh): a database with
//! queues but nothing to do runs at most one transaction a second, its
//! worker says it is idle, and the first send after the idle period reaches
//! a consumer at once, as does a delayed event due while it sleeps.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::time::{Duration, Instant};

fn xact_commit(admin: &mut Client, db: &str) -> i64 {
    admin
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .unwrap();
    admin
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = $1",
            &[&db],
        )
        .unwrap()
        .get(0)
}

fn worker_detail(c: &mut Client) -> String {
    c.query_one(
        "SELECT status || ': ' || detail FROM pgque.status() WHERE component = 'worker'",
        &[],
    )
    .unwrap()
    .get(0)
}

/// Receives from queue q as consumer c until a batch with an event comes
/// (acking it) or `timeout` passes; the events' payloads.
fn receive_within(c: &mut Client, timeout: Duration) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let rows = c
            .query(
                "SELECT batch_id, payload FROM pgque.receive('q', 'c', 100)",
                &[],
            )
            .unwrap();
        if let Some(r) = rows.first() {
            let b: i64 = r.get(0);
            c.execute("SELECT pgque.ack($1)", &[&b]).unwrap();
            return rows.iter().map(|r| r.get(1)).collect();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    vec![]
}

#[test]
fn idle_database_costs_at_most_a_transaction_a_second_and_wakes_at_once() {
    let cl = Cluster::start_new("idle", "pgque.idle_after = 1000");
    let db = "idle_a";
    let mut c = cl.create_db(db);
    // Three event queues (one with a consumer) and two job queues, idle.
    c.batch_execute(
        "SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c');
         SELECT pgque.create_queue('q2'); SELECT pgque.create_queue('q3');
         SELECT pgque.create_job_queue('j1'); SELECT pgque.create_job_queue('j2');",
    )
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || worker_detail(&mut c)
            .contains("idle since")),
        "the worker never went idle: {}",
        worker_detail(&mut c)
    );
    // Only the worker's transactions count: this session leaves the
    // database and the counters are read from another one.
    drop(c);
    let mut admin = cl.connect("postgres");
    std::thread::sleep(Duration::from_millis(1500));
    let window = Duration::from_secs(20);
    let before = xact_commit(&mut admin, db);
    std::thread::sleep(window);
    let after = xact_commit(&mut admin, db);
    let n = after - before;
    eprintln!("idle database: {n} transactions in {} s", window.as_secs());
    let mut c = cl.connect(db);
    assert!(
        n <= window.as_secs() as i64,
        "an idle database ran {n} transactions in {window:?}; duty_due: {:?}; status: {:?}",
        c.query("SELECT duty, due_in FROM pgque.duty_due()", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, Option<f64>>(1)))
            .collect::<Vec<_>>(),
        c.query("SELECT component, detail FROM pgque.status()", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect::<Vec<_>>()
    );
    // Not a counter that never moves: the idle worker still looks (every
    // pgque.idle_check_interval, 5 s) and flushes its counters.
    assert!(n >= 1, "no transaction of the worker was counted");

    // The first send after the idle period is delivered at once (a
    // functional bound; benches/ measure the latency).
    assert!(worker_detail(&mut c).contains("idle since"));
    let mut p = cl.connect(db);
    let t0 = Instant::now();
    p.execute("SELECT pgque.send('q', 'first'::text)", &[])
        .unwrap();
    let got = receive_within(&mut c, Duration::from_secs(2));
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    eprintln!("first send after idle: received after {ms:.1} ms");
    assert_eq!(got, vec!["first".to_string()], "not delivered within 2 s");

    // A delayed event due while the worker sleeps: delivered on time
    // (duty_due() tells the worker when), although no commit wakes it then.
    assert!(
        wait_until(Duration::from_secs(20), || worker_detail(&mut c)
            .contains("idle since")),
        "the worker did not go idle again"
    );
    let sent = Instant::now();
    p.execute(
        "SELECT pgque.send_at('q', 't', 'later'::text, clock_timestamp() + interval '3 seconds')",
        &[],
    )
    .unwrap();
    let due: f64 = c
        .query_one(
            "SELECT due_in FROM pgque.duty_due() WHERE duty = 'delayed'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!((0.0..=3.0).contains(&due), "delayed due in {due} s");
    // send_at does not make the worker active (it asks it to look again)
    assert!(wait_until(Duration::from_secs(3), || worker_detail(&mut c)
        .contains("idle since")));
    let got = receive_within(&mut c, Duration::from_secs(10));
    let after_s = sent.elapsed().as_secs_f64();
    assert_eq!(
        got,
        vec!["later".to_string()],
        "delayed event not delivered"
    );
    eprintln!("delayed event due 3 s after its send: received {after_s:.2} s after the send");
    // send_at asks the idle worker to read duty_due() again: it wakes at
    // deliver_at, not at its next idle check (5 s).
    assert!(
        (2.9..=4.5).contains(&after_s),
        "delayed event due 3 s after its send received after {after_s:.2} s"
    );
}

/// A dispatch while the worker is idle tells it, through shared memory, when
/// the lease it handed out expires (wake::lease_due_at_commit): the worker
/// rescues the job then, though it re-reads duty_due() only every
/// idle_check_interval (here an hour) and housekeeps every idle_maint_period
/// (ten minutes). It used to re-read duty_due() after every dispatch.
#[test]
fn an_idle_worker_rescues_a_lease_dispatched_while_it_slept() {
    let cl = Cluster::start_new(
        "idle_lease",
        "pgque.idle_after = 500\npgque.idle_check_interval = 3600\npgque.idle_maint_period = 600\n\
         track_functions = 'all'",
    );
    let mut c = cl.create_db("idle_lease");
    c.batch_execute(
        "SELECT pgque.create_job_queue('jl');
         SELECT pgque.enqueue('jl', 'k', '{}'::jsonb);",
    )
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || worker_detail(&mut c)
            .contains("idle")),
        "the worker went idle: {}",
        worker_detail(&mut c)
    );
    // let its first idle look (duty_due) pass: from now on only the note wakes it
    std::thread::sleep(Duration::from_millis(700));
    let job: i64 = c
        .query_one(
            "SELECT job_id FROM pgque.dispatch(ARRAY['jl'], 1, 'w', '2 seconds')",
            &[],
        )
        .unwrap()
        .get(0);
    let t = Instant::now();
    let rescued = wait_until(Duration::from_secs(20), || {
        c.query_one("SELECT state FROM pgque.jobs WHERE id = $1", &[&job])
            .map(|r| r.get::<_, String>(0) != "running")
            .unwrap_or(false)
    });
    let e = t.elapsed();
    eprintln!("lease of 2 s rescued by the idle worker {e:?} after the dispatch");
    assert!(rescued, "the expired lease was not rescued");
    assert!(e < Duration::from_secs(6), "rescued after {e:?}");

    // A stream of dispatches with later leases costs the idle worker no
    // duty_due() each (counted by track_functions).
    let duty_due_calls = |c: &mut Client| -> i64 {
        c.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
        c.query_one(
            "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_user_functions \
              WHERE schemaname = 'pgque' AND funcname = 'duty_due'",
            &[],
        )
        .unwrap()
        .get(0)
    };
    assert!(
        wait_until(Duration::from_secs(10), || worker_detail(&mut c)
            .contains("idle")),
        "idle again"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let before = duty_due_calls(&mut c);
    for _ in 0..20 {
        c.batch_execute(
            "SELECT pgque.enqueue('jl', 'k', '{}'::jsonb); \
             SELECT * FROM pgque.dispatch(ARRAY['jl'], 1, 'w', '60 seconds')",
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let after = duty_due_calls(&mut c);
    eprintln!(
        "duty_due() calls over 20 dispatches while idle: {}",
        after - before
    );
    assert!(
        after - before <= 3,
        "the idle worker re-read duty_due() {} times for 20 dispatches",
        after - before
    );
}
