//! The worker pool (issue 23): more databases than worker processes. On a
//! private cluster with max_worker_processes = 8 (6 for pgque's database
//! workers beside its launcher and PostgreSQL's logical replication
//! launcher), 20 databases each get their events
//! delivered, their delayed events promoted and their scheduled jobs made
//! ready; with pgque.max_workers = 3, 9 databases sending at once all get
//! their events delivered while no more than 3 workers ever run.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn workers_running(admin: &mut Client) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgque worker'",
            &[],
        )
        .unwrap()
        .get(0)
}

/// Receives from queue q as consumer c until `want` events came or
/// `timeout` passed; the payloads received.
fn receive_n(c: &mut Client, want: usize, timeout: Duration) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        let rows = c
            .query(
                "SELECT batch_id, payload FROM pgque.receive('q', 'c', 1000)",
                &[],
            )
            .unwrap();
        if let Some(r) = rows.first() {
            let b: i64 = r.get(0);
            got.extend(rows.iter().map(|r| r.get::<_, String>(1)));
            c.execute("SELECT pgque.ack($1)", &[&b]).unwrap();
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    got
}

fn setup_db(cl: &Cluster, db: &str) -> Client {
    let mut c = cl.create_db(db);
    c.batch_execute(
        "SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c');
         SELECT pgque.create_job_queue('j');",
    )
    .unwrap();
    c
}

fn worker_state(c: &mut Client) -> String {
    c.query_one(
        "SELECT status FROM pgque.status() WHERE component = 'worker'",
        &[],
    )
    .unwrap()
    .get(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn twenty_databases_are_served_by_eight_worker_slots() {
    let cl = Cluster::start_new(
        "pool20",
        "max_worker_processes = 8\npgque.idle_after = 500\npgque.worker_idle_exit = 2",
    );
    let n = 20;
    let names: Vec<String> = (0..n).map(|i| format!("pool_{i:02}")).collect();
    let mut conns: Vec<Client> = names.iter().map(|d| setup_db(&cl, d)).collect();
    let mut admin = cl.connect("postgres");

    // Idle databases give their processes back: within a few seconds most
    // are parked, none holds a slot for long.
    assert!(
        wait_until(Duration::from_secs(30), || workers_running(&mut admin) <= 2),
        "idle databases kept {} workers; log:\n{}",
        workers_running(&mut admin),
        cl.log_tail(30)
    );
    let mut parked = 0;
    for c in conns.iter_mut() {
        parked += (worker_state(c) == "parked") as usize;
    }
    assert!(parked >= n - 2, "only {parked} of {n} databases parked");

    // A send in each database, one after another, reaches its consumer: the
    // commit asks the launcher for a worker, which ticks.
    let mut lat = Vec::new();
    for (i, c) in conns.iter_mut().enumerate() {
        let t0 = Instant::now();
        c.execute("SELECT pgque.send('q', $1::text)", &[&format!("e{i}")])
            .unwrap();
        let got = receive_n(c, 1, Duration::from_secs(10));
        lat.push(t0.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(
            got,
            vec![format!("e{i}")],
            "database {} got nothing",
            names[i]
        );
    }
    // Of the 8 slots the launcher and PostgreSQL's logical replication
    // launcher hold two: every 7th send found the 6 others held by workers
    // that had just delivered, and waited for one to go idle
    // (pgque.idle_after) and park.
    let (mut free, mut waited): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
    for (i, l) in lat.iter().enumerate() {
        if i % 6 == 5 {
            waited.push(*l)
        } else {
            free.push(*l)
        }
    }
    free.sort_by(f64::total_cmp);
    waited.sort_by(f64::total_cmp);
    eprintln!(
        "send -> receive in a parked database, {n} databases, 8 worker slots: \
         with a slot free p50 {:.1} ms, max {:.1} ms; \
         waiting for a slot p50 {:.1} ms, max {:.1} ms",
        percentile(&free, 0.5),
        percentile(&free, 1.0),
        percentile(&waited, 0.5),
        percentile(&waited, 1.0)
    );

    // The same with every database sending at once (more than the 7 slots
    // PostgreSQL has left): each database's event arrives.
    for (i, c) in conns.iter_mut().enumerate() {
        c.execute("SELECT pgque.send('q', $1::text)", &[&format!("f{i}")])
            .unwrap();
    }
    for (i, c) in conns.iter_mut().enumerate() {
        let got = receive_n(c, 1, Duration::from_secs(30));
        assert_eq!(
            got,
            vec![format!("f{i}")],
            "database {} got nothing; log:\n{}",
            names[i],
            cl.log_tail(30)
        );
    }

    // Duties whose time is known in advance run in parked databases: a
    // delayed event and a scheduled job, due in 3 s, with no commit then.
    for c in conns.iter_mut() {
        c.batch_execute(
            "SELECT pgque.send_at('q', 't', 'later'::text, clock_timestamp() + interval '3 seconds');
             SELECT pgque.enqueue('j', 'k', '{}'::jsonb, run_at => clock_timestamp() + interval '3 seconds');",
        )
        .unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    for (i, c) in conns.iter_mut().enumerate() {
        let got = receive_n(c, 1, Duration::from_secs(20));
        assert_eq!(
            got,
            vec!["later".to_string()],
            "delayed event of {} not delivered",
            names[i]
        );
        assert!(
            wait_until(Duration::from_secs(20), || c
                .query_one(
                    "SELECT count(*) FROM pgque.dispatch(ARRAY['j'], 10, 'w')",
                    &[]
                )
                .unwrap()
                .get::<_, i64>(0)
                == 1),
            "scheduled job of {} never became ready",
            names[i]
        );
    }
    // Every database's duties ran: status() shows the counters its last
    // worker left, parked or not.
    for (i, c) in conns.iter_mut().enumerate() {
        let runs: i64 = c
            .query_one(
                "SELECT count(*) FROM pgque.status()
                  WHERE component = 'duty:ticker' AND detail NOT LIKE 'runs=0 %'",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(runs, 1, "no ticker runs recorded in {}", names[i]);
    }
    assert!(
        !cl.log_tail(400)
            .contains("no free background worker slot for database"),
        "a database was refused a worker instead of waiting its turn"
    );
}

#[test]
fn busy_databases_take_turns_within_max_workers() {
    let cl = Cluster::start_new(
        "pool_busy",
        "pgque.max_workers = 3\npgque.idle_after = 500\npgque.worker_turn = 2",
    );
    let n = 9;
    let names: Vec<String> = (0..n).map(|i| format!("busy_{i}")).collect();
    // Counts the worker processes from the start, installs included.
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicI64::new(0));
    let sampler = {
        let (stop, most) = (stop.clone(), most.clone());
        let mut admin = cl.connect("postgres");
        std::thread::spawn(move || {
            let mut worst = String::new();
            while !stop.load(Ordering::Relaxed) {
                let n = workers_running(&mut admin);
                if n > most.fetch_max(n, Ordering::Relaxed) {
                    worst = format!(
                        "{:?}",
                        admin
                            .query(
                                "SELECT pid, datname FROM pg_stat_activity
                                  WHERE backend_type = 'pgque worker'",
                                &[]
                            )
                            .unwrap()
                            .iter()
                            .map(|r| (r.get::<_, i32>(0), r.get::<_, Option<String>>(1)))
                            .collect::<Vec<_>>()
                    );
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            worst
        })
    };
    for d in &names {
        setup_db(&cl, d);
    }
    // Every database sends an event every 50 ms for 12 s: all of them busy.
    let sent_per_db = 240;
    let producers: Vec<_> = names
        .iter()
        .map(|d| {
            let mut p = cl.connect(d);
            std::thread::spawn(move || {
                for k in 0..sent_per_db {
                    p.execute("SELECT pgque.send('q', $1::text)", &[&k.to_string()])
                        .unwrap();
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        })
        .collect();
    let consumers: Vec<_> = names
        .iter()
        .map(|d| {
            let mut c = cl.connect(d);
            std::thread::spawn(move || receive_n(&mut c, sent_per_db, Duration::from_secs(90)))
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    for (i, c) in consumers.into_iter().enumerate() {
        let got = c.join().unwrap();
        let want: Vec<String> = (0..sent_per_db).map(|k| k.to_string()).collect();
        assert_eq!(
            got.len(),
            want.len(),
            "database {} received {} of {sent_per_db}; log:\n{}",
            names[i],
            got.len(),
            cl.log_tail(30)
        );
        assert_eq!(got, want, "database {}: order or content", names[i]);
    }
    stop.store(true, Ordering::Relaxed);
    let worst = sampler.join().unwrap();
    let most = most.load(Ordering::Relaxed);
    eprintln!("{n} busy databases, pgque.max_workers = 3: at most {most} workers ran");
    assert!(
        most <= 3,
        "{most} workers ran at once with pgque.max_workers = 3: {worst}"
    );
    assert!(
        cl.log_tail(2000)
            .contains("gives its process to a waiting database"),
        "no busy worker gave its turn"
    );
}

/// DROP / RENAME / CREATE DATABASE ... TEMPLATE need a database unused:
/// for a parked one the pool must not start a worker there meanwhile, and
/// afterwards the renamed database and the copy are served again.
#[test]
fn a_parked_database_can_be_copied_renamed_and_dropped() {
    let cl = Cluster::start_new(
        "pool_ddl",
        "pgque.idle_after = 300\npgque.worker_idle_exit = 1",
    );
    let mut c = setup_db(&cl, "ddl_src");
    assert!(
        wait_until(Duration::from_secs(20), || worker_state(&mut c) == "parked"),
        "ddl_src never parked: {}",
        worker_state(&mut c)
    );
    drop(c);
    let mut admin = cl.connect("postgres");
    // (one statement at a time: CREATE DATABASE refuses a transaction block)
    // A command that finds a session still connecting to the database (the
    // worker the previous command restarted, on a loaded machine) fails
    // with 55006 after PostgreSQL's 5 s wait, as it would for any client
    // connecting then (docs/operations.md, "DROP DATABASE and friends"): an
    // administrator runs it again, and so does this test, twice at most.
    let run = |admin: &mut Client, sql: &str| {
        for attempt in 1..=3 {
            match admin.batch_execute(sql) {
                Ok(()) => return,
                Err(e) if attempt < 3 && e.code().map(|c| c.code()) == Some("55006") => {
                    eprintln!("{sql}: 55006 on attempt {attempt}, again");
                }
                Err(e) => panic!("{sql}: {e:?}; log:\n{}", cl.log_tail(20)),
            }
        }
    };
    // After a command that restarts the database's worker, the next one
    // waits for that worker to have connected: a session that is still
    // connecting when RENAME or DROP takes the database's lock waits for
    // that lock while being counted as a user, so the command fails after
    // 5 s ('being accessed by other users'), for any connecting client.
    let settled = |admin: &mut Client, db: &str| {
        wait_until(Duration::from_secs(3), || {
            admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE backend_type = 'pgque worker' AND datname = $1",
                    &[&db],
                )
                .unwrap()
                .get::<_, i64>(0)
                > 0
        });
    };
    for _ in 0..3 {
        run(&mut admin, "CREATE DATABASE ddl_copy TEMPLATE ddl_src");
        settled(&mut admin, "ddl_src");
        run(&mut admin, "ALTER DATABASE ddl_src RENAME TO ddl_moved");
        settled(&mut admin, "ddl_moved");
        run(&mut admin, "ALTER DATABASE ddl_moved RENAME TO ddl_src");
        settled(&mut admin, "ddl_src");
        run(&mut admin, "DROP DATABASE ddl_copy");
    }
    run(&mut admin, "CREATE DATABASE ddl_copy TEMPLATE ddl_src");
    settled(&mut admin, "ddl_src");
    run(&mut admin, "ALTER DATABASE ddl_src RENAME TO ddl_moved");
    // Both are served: a send in each reaches its consumer.
    for db in ["ddl_copy", "ddl_moved"] {
        let mut c = cl.connect(db);
        c.execute("SELECT pgque.send('q', $1::text)", &[&db])
            .unwrap();
        let got = receive_n(&mut c, 1, Duration::from_secs(10));
        assert_eq!(got, vec![db.to_string()], "{db} was not served");
    }
    admin.batch_execute("DROP DATABASE ddl_copy").unwrap();
}

/// The worker process of database `db` (pg_stat_activity), if it has one.
fn worker_pid_of(admin: &mut Client, db: &str) -> Option<i32> {
    admin
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgque worker' AND datname = $1",
            &[&db],
        )
        .unwrap()
        .map(|r| r.get(0))
}

/// Issue 35: a busy database must keep its worker when the pool is short.
/// max_worker_processes = 8 leaves 6 slots (pgque's launcher and
/// PostgreSQL's logical replication launcher take two); a session's
/// parallel queries take every slot that frees, 7 idle databases with pgque
/// come due every few seconds (idle ticks), the launcher probes new
/// databases without pgque as they appear. Neither the due ones nor the
/// probes may take the busy database's process: its worker keeps the same
/// pid, first while a producer sends (active), then while only its
/// consumers claim jobs (idle by producers, busy by claims), its events
/// arrive promptly, its ticker keeps running; status(), metrics() and a
/// WARNING say the pool is short.
#[test]
fn a_busy_database_keeps_its_worker_when_the_pool_is_short() {
    let cl = Cluster::start_new(
        "pool_short",
        "max_worker_processes = 8\npgque.idle_after = 1000\npgque.worker_turn = 2\n\
         pgque.launcher_rescan_interval = 2\nmax_parallel_workers = 8\n\
         log_min_messages = warning",
    );
    let mut admin = cl.connect("postgres");
    for i in 0..3 {
        admin
            .batch_execute(&format!("CREATE DATABASE plain_{i}"))
            .unwrap();
    }
    for i in 0..7 {
        let mut c = setup_db(&cl, &format!("idle_{i}"));
        // an idle tick every 2 s: a parked database comes due that often
        c.batch_execute("SELECT pgque.set_queue_config('q', 'ticker_idle_period', '2 seconds')")
            .unwrap();
    }
    let mut busy = setup_db(&cl, "busy");
    // a backlog the job consumers drain for the whole test
    busy.batch_execute(
        "SELECT pgque.enqueue('j', 'k', '{}'::jsonb) FROM generate_series(1, 30000)",
    )
    .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let sending = Arc::new(AtomicBool::new(true));
    // Producer: an event every 10 ms while `sending`, its send time as payload.
    let producer = {
        let (stop, sending) = (stop.clone(), sending.clone());
        let mut p = cl.connect("busy");
        std::thread::spawn(move || {
            let mut sent = 0i64;
            while !stop.load(Ordering::Relaxed) {
                if sending.load(Ordering::Relaxed) {
                    p.execute(
                        "SELECT pgque.send('q', (extract(epoch FROM clock_timestamp()) * 1000)::text)",
                        &[],
                    )
                    .unwrap();
                    sent += 1;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            sent
        })
    };
    // Consumer: send -> receive latencies (ms).
    let consumer = {
        let stop = stop.clone();
        let mut c = cl.connect("busy");
        std::thread::spawn(move || {
            let mut lat: Vec<f64> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let rows = c
                    .query(
                        "SELECT batch_id, payload,
                                extract(epoch FROM clock_timestamp()) * 1000 - payload::float8
                           FROM pgque.receive('q', 'c', 1000)",
                        &[],
                    )
                    .unwrap();
                if let Some(r) = rows.first() {
                    let b: i64 = r.get(0);
                    lat.extend(rows.iter().map(|r| r.get::<_, f64>(2)));
                    c.execute("SELECT pgque.ack($1)", &[&b]).unwrap();
                } else {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            lat
        })
    };
    // Job consumer: claims and completes 20 jobs every 20 ms.
    let jobs = {
        let stop = stop.clone();
        let mut c = cl.connect("busy");
        std::thread::spawn(move || {
            let mut done = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let n: i32 = c
                    .query_one(
                        "SELECT coalesce(pgque.complete_many(array_agg(d.job_id), array_agg(d.lease_token)), 0)
                           FROM pgque.dispatch(ARRAY['j'], 20, 'w') d",
                        &[],
                    )
                    .unwrap()
                    .get(0);
                done += n as i64;
                std::thread::sleep(Duration::from_millis(20));
            }
            done
        })
    };
    assert!(
        wait_until(Duration::from_secs(20), || worker_pid_of(
            &mut admin, "busy"
        )
        .is_some()),
        "the busy database got no worker; log:\n{}",
        cl.log_tail(30)
    );
    // Parallel queries in a database without pgque take every slot that frees.
    let hog = {
        let stop = stop.clone();
        let mut h = cl.connect("plain_0");
        h.batch_execute(
            "CREATE TABLE t AS SELECT g FROM generate_series(1, 200000) g;
             SET max_parallel_workers_per_gather = 8; SET parallel_setup_cost = 0;
             SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
             SET parallel_leader_participation = off",
        )
        .unwrap();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                h.batch_execute("SELECT count(*) FROM t WHERE pg_sleep(0.00002) IS NOT NULL")
                    .unwrap();
            }
        })
    };
    let ticks = |c: &mut Client| -> i64 {
        c.query_one(
            "SELECT substring(detail FROM 'runs=([0-9]+)')::int8 FROM pgque.status()
              WHERE component = 'duty:ticker'",
            &[],
        )
        .unwrap()
        .get(0)
    };
    let pid0 = worker_pid_of(&mut admin, "busy").unwrap();
    let ticks0 = ticks(&mut busy);
    let (mut samples, mut held, mut short_seen, mut gauge_seen) = (0, 0, false, false);
    let t0 = Instant::now();
    let mut created = 0;
    while t0.elapsed() < Duration::from_secs(24) {
        if t0.elapsed() >= Duration::from_secs(12) {
            // the second half: only the job consumers work
            sending.store(false, Ordering::Relaxed);
        }
        if created < 2 && t0.elapsed() >= Duration::from_secs(4 + 6 * created) {
            // new databases without pgque: the launcher probes them
            admin
                .batch_execute(&format!("CREATE DATABASE probe_{created}"))
                .unwrap();
            created += 1;
        }
        samples += 1;
        held += (worker_pid_of(&mut admin, "busy") == Some(pid0)) as usize;
        short_seen |= busy
            .query_opt(
                "SELECT 1 FROM pgque.status() WHERE component = 'worker_pool' AND status = 'short'",
                &[],
            )
            .unwrap()
            .is_some();
        gauge_seen |= busy
            .query_one(
                "SELECT coalesce(max(value), 0) FROM pgque.metrics() WHERE name = 'pgque_worker_pool_short'",
                &[],
            )
            .unwrap()
            .get::<_, f64>(0)
            == 1.0;
        std::thread::sleep(Duration::from_millis(200));
    }
    let ticks1 = ticks(&mut busy);
    stop.store(true, Ordering::Relaxed);
    let sent = producer.join().unwrap();
    let mut lat = consumer.join().unwrap();
    let done = jobs.join().unwrap();
    hog.join().unwrap();
    lat.sort_by(f64::total_cmp);
    let log = cl.log_tail(3000);
    eprintln!(
        "pool short: busy worker held in {held} of {samples} samples; {sent} events sent, {} received, \
         p50 {:.1} ms, p99 {:.1} ms; {done} jobs done; ticker runs {ticks0} -> {ticks1}",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
    assert_eq!(
        held,
        samples,
        "the busy database's worker {pid0} lost its process; log:\n{}",
        cl.log_tail(60)
    );
    assert!(
        !log.contains("for database busy: gives its process"),
        "the busy database gave its process to a database without work"
    );
    // every event sent arrived (sending stopped 12 s before the end)
    assert!(
        lat.len() as i64 == sent,
        "{} of {sent} events received",
        lat.len()
    );
    assert!(
        percentile(&lat, 0.5) < 100.0,
        "send -> receive p50 {:.1} ms",
        percentile(&lat, 0.5)
    );
    assert!(done >= 5_000, "only {done} jobs completed");
    assert!(ticks1 > ticks0 + 50, "ticker runs {ticks0} -> {ticks1}");
    assert!(short_seen, "status() never showed the pool short");
    assert!(
        gauge_seen,
        "metrics() never showed pgque_worker_pool_short = 1"
    );
    assert!(
        log.contains("WARNING:  pgque worker pool is short"),
        "no WARNING about the short pool; log:\n{}",
        cl.log_tail(40)
    );
}
