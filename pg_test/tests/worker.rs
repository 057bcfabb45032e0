//! The background worker, on a real server with pgque preloaded: it appears
//! for databases with the extension only, survives a failing duty, follows
//! SIGHUP, comes back after pg_terminate_backend, and gets out of the way of
//! DROP DATABASE, DROP EXTENSION and stop().
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Tests that count a duty's rate run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn worker_pid(admin: &mut Client, db: &str) -> Option<i32> {
    admin
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgque worker' AND datname = $1",
            &[&db],
        )
        .unwrap()
        .map(|r| r.get(0))
}

/// Waits until the worker of `db` is past its start-up (it has run the
/// ticker once). A worker that started before CREATE EXTENSION committed
/// waits up to 10 s for it; dropping the extension in that window is not what
/// these tests are about.
fn wait_running(db: &TestDb) {
    let mut c = db.connect();
    let ok = wait_until(Duration::from_secs(15), || {
        c.query_opt(
            "SELECT 1 FROM pgque.status() WHERE component = 'duty:ticker' AND detail NOT LIKE 'runs=0 %'",
            &[],
        )
        .ok()
        .flatten()
        .is_some()
    });
    assert!(
        ok,
        "the worker of {} did not start its duties within 15 s",
        db.name
    );
}

fn wait_worker(admin: &mut Client, db: &str, timeout: Duration) -> Option<i32> {
    let mut pid = None;
    wait_until(timeout, || {
        pid = worker_pid(admin, db);
        pid.is_some()
    });
    pid
}

/// Replaces the worker's duty functions in `db` with instrumented ones:
/// ticker() counts its runs in a table, maint() raises. Lets the tests watch
/// the worker's scheduling without depending on what the real duties do.
fn instrument_duties(c: &mut Client) {
    c.batch_execute(
        r#"
        DO $$
        DECLARE f regprocedure;
        BEGIN
          FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                   WHERE p.pronamespace = 'pgque'::regnamespace
                     AND p.proname IN ('ticker', 'maint') AND p.pronargs = 0
          LOOP
            EXECUTE format('ALTER EXTENSION pgque DROP FUNCTION %s', f);
            EXECUTE format('DROP FUNCTION %s', f);
          END LOOP;
        END $$;
        CREATE TABLE public.ticker_runs (at timestamptz NOT NULL DEFAULT clock_timestamp());
        CREATE FUNCTION pgque.ticker() RETURNS bigint LANGUAGE sql AS
          $$ INSERT INTO public.ticker_runs DEFAULT VALUES; SELECT 1::bigint $$;
        CREATE FUNCTION pgque.maint() RETURNS int LANGUAGE plpgsql AS
          $$ BEGIN RAISE EXCEPTION 'maint is broken on purpose'; END $$;
        "#,
    )
    .unwrap();
}

fn ticker_runs_in(c: &mut Client, window: Duration) -> i64 {
    let before: i64 = c
        .query_one("SELECT count(*) FROM public.ticker_runs", &[])
        .unwrap()
        .get(0);
    std::thread::sleep(window);
    let after: i64 = c
        .query_one("SELECT count(*) FROM public.ticker_runs", &[])
        .unwrap()
        .get(0);
    after - before
}

fn duty_status(c: &mut Client, duty: &str) -> (String, String) {
    let r = c
        .query_one(
            "SELECT status, detail FROM pgque.status() WHERE component = $1",
            &[&format!("duty:{duty}")],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

#[test]
fn worker_appears_only_where_the_extension_is() {
    let mut admin = connect_to("postgres");
    let with = TestDb::new("wk_with");
    let without = TestDb::without_extension("wk_without");
    let start = Instant::now();
    assert!(
        wait_worker(&mut admin, &with.name, Duration::from_secs(3)).is_some(),
        "no worker for a database with pgque"
    );
    println!(
        "worker appeared {:?} after CREATE EXTENSION returned",
        start.elapsed()
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        worker_pid(&mut admin, &without.name),
        None,
        "a database without pgque got a worker"
    );
    // The worker reports itself in status().
    let mut c = with.connect();
    let (st, detail): (String, String) = {
        let r = c
            .query_one(
                "SELECT status, detail FROM pgque.status() WHERE component = 'worker'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(st, "running", "{detail}");
    // CREATE EXTENSION in the second database: it gets a worker too.
    without
        .connect()
        .batch_execute("CREATE EXTENSION pgque")
        .unwrap();
    assert!(wait_worker(&mut admin, &without.name, Duration::from_secs(3)).is_some());
}

#[test]
fn failing_duty_does_not_stop_the_others() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let db = TestDb::new("wk_failing");
    let mut c = db.connect();
    instrument_duties(&mut c);
    // The ticker keeps running (100 ms cadence) although maint fails every time.
    let runs = ticker_runs_in(&mut c, Duration::from_secs(2));
    assert!(
        runs >= 8,
        "ticker ran {runs} times in 2 s next to a failing maint"
    );
    let (st, detail) = duty_status(&mut c, "maint");
    assert_eq!(st, "failing", "{detail}");
    assert!(detail.contains("maint is broken on purpose"), "{detail}");
    let (st, detail) = duty_status(&mut c, "ticker");
    assert_eq!(st, "ok", "{detail}");
    // The failure is logged once per distinct message, not per attempt, and it
    // backs off: far fewer maint attempts than its 1 s cadence would make.
    let mut admin = connect_to("postgres");
    let pid = worker_pid(&mut admin, &db.name).expect("worker still running");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        worker_pid(&mut admin, &db.name),
        Some(pid),
        "the worker restarted: a failing duty took it down"
    );
    let (_, detail) = duty_status(&mut c, "maint");
    let failures: u64 = detail
        .split_whitespace()
        .find_map(|w| w.strip_prefix("failures="))
        .and_then(|n| n.parse().ok())
        .expect("failures= in detail");
    assert!(
        (2..=6).contains(&failures),
        "maint attempted {failures} times in ~6 s: backoff not applied ({detail})"
    );
    // The server log has the failure once, although it happened several times.
    let log = std::fs::read_to_string(format!("{}/server.log", pgdata())).unwrap_or_default();
    let logged = log
        .lines()
        .filter(|l| l.contains("wk_failing: duty maint failed: maint is broken on purpose"))
        .count();
    assert_eq!(
        logged, 1,
        "a repeating duty error must be logged once, found {logged} lines"
    );
    // Repair it: the next run succeeds and the status says so.
    c.batch_execute(
        "CREATE OR REPLACE FUNCTION pgque.maint() RETURNS int LANGUAGE sql AS $$ SELECT 0 $$",
    )
    .unwrap();
    assert!(wait_until(Duration::from_secs(20), || duty_status(
        &mut c, "maint"
    )
    .0 == "ok"));
}

/// On a private cluster: ALTER SYSTEM changes the cadence of every database
/// of its server, and other test binaries share the test server.
#[test]
fn sighup_changes_the_cadence() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cl = Cluster::start_new("sighup", "");
    let mut c = cl.create_db("wk_sighup");
    instrument_duties(&mut c);
    std::thread::sleep(Duration::from_millis(500));
    let slow = ticker_runs_in(&mut c, Duration::from_secs(2));
    let mut admin = cl.connect("postgres");
    admin
        .batch_execute("ALTER SYSTEM SET pgque.tick_period_ms = 20")
        .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let fast = ticker_runs_in(&mut c, Duration::from_secs(2));
    println!("ticker runs in 2 s: {slow} at 100 ms, {fast} at 20 ms");
    assert!((10..=30).contains(&slow), "at 100 ms: {slow} runs in 2 s");
    assert!(
        fast >= 3 * slow,
        "at 20 ms: {fast} runs in 2 s vs {slow} at 100 ms"
    );
}

#[test]
fn terminated_worker_comes_back() {
    let db = TestDb::new("wk_terminate");
    let mut admin = connect_to("postgres");
    let pid = wait_worker(&mut admin, &db.name, Duration::from_secs(3)).expect("worker");
    let ok: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap()
        .get(0);
    assert!(ok);
    let mut new_pid = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            new_pid = worker_pid(&mut admin, &db.name);
            new_pid.is_some_and(|p| p != pid)
        }),
        "no worker within 10 s of pg_terminate_backend"
    );
}

#[test]
fn drop_database_and_drop_extension_stop_the_worker() {
    let mut admin = connect_to("postgres");
    let db = TestDb::new("wk_dropdb");
    wait_worker(&mut admin, &db.name, Duration::from_secs(3)).expect("worker");
    wait_running(&db);
    // Without the hook this fails: "database is being accessed by other users".
    admin
        .batch_execute(&format!("DROP DATABASE {}", db.name))
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(worker_pid(&mut admin, &db.name), None);

    let db = TestDb::new("wk_dropext");
    wait_worker(&mut admin, &db.name, Duration::from_secs(3)).expect("worker");
    wait_running(&db);
    db.connect().batch_execute("DROP EXTENSION pgque").unwrap();
    assert!(wait_until(Duration::from_secs(4), || worker_pid(
        &mut admin, &db.name
    )
    .is_none()));
    // Renaming a database with a worker works, and the worker follows it.
    let db = TestDb::new("wk_rename");
    wait_worker(&mut admin, &db.name, Duration::from_secs(3)).expect("worker");
    admin
        .batch_execute("DROP DATABASE IF EXISTS wk_renamed")
        .unwrap();
    admin
        .batch_execute("ALTER DATABASE wk_rename RENAME TO wk_renamed")
        .unwrap();
    assert!(wait_worker(&mut admin, "wk_renamed", Duration::from_secs(3)).is_some());
    admin.batch_execute("DROP DATABASE wk_renamed").unwrap();
    // A DROP DATABASE that fails (a session is still connected) keeps the
    // database's worker, which the hook starts again, and its error is the
    // server's, whole.
    let db = TestDb::new("wk_dropfail");
    wait_worker(&mut admin, &db.name, Duration::from_secs(3)).expect("worker");
    wait_running(&db);
    let held = db.connect();
    let e = admin
        .batch_execute(&format!("DROP DATABASE {}", db.name))
        .unwrap_err();
    let e = e.as_db_error().expect("a server error");
    assert_eq!(e.code().code(), "55006", "{e:?}");
    assert!(
        e.detail().is_some_and(|d| d.contains("other session")),
        "{e:?}"
    );
    assert!(wait_worker(&mut admin, &db.name, Duration::from_secs(5)).is_some());
    drop(held);
}

#[test]
fn stop_and_start_switch_the_worker() {
    let mut admin = connect_to("postgres");
    let db = TestDb::new("wk_stopstart");
    wait_worker(&mut admin, &db.name, Duration::from_secs(3)).expect("worker");
    let mut c = db.connect();
    let was_on: bool = c.query_one("SELECT pgque.stop()", &[]).unwrap().get(0);
    assert!(was_on);
    assert!(wait_until(Duration::from_secs(3), || worker_pid(
        &mut admin, &db.name
    )
    .is_none()));
    let st: String = c
        .query_one(
            "SELECT status FROM pgque.status() WHERE component = 'worker'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(st, "stopped");
    let started: bool = c.query_one("SELECT pgque.start()", &[]).unwrap().get(0);
    assert!(started);
    assert!(wait_worker(&mut admin, &db.name, Duration::from_secs(3)).is_some());
}

/// start() in a transaction that stays open: the worker must come up once it
/// commits. start() used to launch the worker at once; the worker read the
/// setting as still off, left and marked the database unwanted, so no worker
/// came back until the mark expired (a flaky upgrade test under load). It
/// is now launched when start()'s transaction commits.
#[test]
fn a_worker_started_by_an_uncommitted_start_waits_for_its_commit() {
    let mut admin = connect_to("postgres");
    let db = TestDb::new("wk_slowstart");
    wait_worker(&mut admin, &db.name, Duration::from_secs(3)).expect("worker");
    let mut c = db.connect();
    stop_worker(&mut c);
    let mut tx = c.transaction().unwrap();
    let started: bool = tx.query_one("SELECT pgque.start()", &[]).unwrap().get(0);
    assert!(started);
    // the new worker has read worker_config several times by now
    std::thread::sleep(Duration::from_millis(1500));
    tx.commit().unwrap();
    assert!(
        wait_worker(&mut admin, &db.name, Duration::from_secs(5)).is_some(),
        "the worker did not start after start() committed"
    );
}

/// Makes database `with_pgque` (with the extension) beside the cluster's
/// others, restarts the cluster (fresh shared memory: the launcher knows
/// nothing) and waits up to `timeout` for with_pgque's worker. Returns a
/// connection to `postgres` and whether the worker came.
fn restart_and_wait_for_with_pgque(cl: &Cluster, timeout: Duration) -> (Client, bool) {
    drop(cl.create_db("with_pgque"));
    cl.stop_immediate();
    cl.start();
    let mut admin = cl.connect("postgres");
    let got = wait_until(timeout, || {
        admin
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgque worker' \
                   AND datname = 'with_pgque'",
                &[],
            )
            .unwrap()
            .is_some()
    });
    (admin, got)
}

/// After a restart only the launcher starts workers. With more databases
/// without pgque ahead of one with it (in pg_database order) than free
/// worker slots, the launcher used to fill the slots with workers that find
/// no extension and leave, give up at the first refusal, and start over from
/// the top on its next scan a minute later: the database with pgque never
/// got its worker. It now remembers where pgque is not wanted and scans again
/// within a second when it ran out of slots.
#[test]
fn databases_without_pgque_do_not_starve_one_with_it() {
    // 6 slots: the launcher, the logical replication launcher, 4 free
    let cl = Cluster::start_new("starve", "max_worker_processes = 6");
    let mut admin = cl.connect("postgres");
    for i in 0..10 {
        admin
            .batch_execute(&format!("CREATE DATABASE plain_{i}"))
            .unwrap();
    }
    drop(admin);
    let started = Instant::now();
    let (_admin, got) = restart_and_wait_for_with_pgque(&cl, Duration::from_secs(20));
    assert!(
        got,
        "no worker for with_pgque after {:?}; server log:\n{}",
        started.elapsed(),
        cl.log_tail(30)
    );
}

/// A role with CREATEDB makes hundreds of databases without pgque. The
/// launcher probes each once (a worker that finds no extension and leaves)
/// and then leaves it alone for its TTL: 300 such databases, more than the
/// 256 marks it used to keep, are not probed again on the next scans (the
/// overflowed ones were, every scan, each a process taking a slot), and
/// the one database with pgque gets its worker. The probes are counted by
/// the transactions they run in those databases (autovacuum off, so
/// nothing else connects there).
#[test]
fn hundreds_of_databases_without_pgque_are_probed_once() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cl = Cluster::start_new(
        "manydbs",
        "max_worker_processes = 10\nautovacuum = off\npgque.launcher_rescan_interval = 2\n",
    );
    let mut admin = cl.connect("postgres");
    for i in 0..300 {
        admin
            .batch_execute(&format!("CREATE DATABASE junk_{i}"))
            .unwrap();
    }
    drop(admin);
    let (mut admin, got) = restart_and_wait_for_with_pgque(&cl, Duration::from_secs(120));
    assert!(
        got,
        "no worker for with_pgque; server log:\n{}",
        cl.log_tail(30)
    );
    let probes = |c: &mut Client| -> (i64, i64) {
        c.query_one(
            "SELECT coalesce(sum(xact_commit + xact_rollback), 0)::int8, \
                    count(*) FILTER (WHERE xact_commit + xact_rollback > 0) \
               FROM pg_stat_database WHERE datname LIKE 'junk\\_%'",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .unwrap()
    };
    // the first round: every junk database probed once, then quiet
    let mut last = (-1, 0);
    let settled = wait_until(Duration::from_secs(120), || {
        std::thread::sleep(Duration::from_millis(1500));
        let now = probes(&mut admin);
        let quiet = now == last && now.1 == 300;
        last = now;
        quiet
    });
    assert!(
        settled,
        "probing did not settle: {last:?} (transactions, databases probed)"
    );
    // three more scans (2 s apart): no junk database is probed again
    std::thread::sleep(Duration::from_secs(7));
    let after = probes(&mut admin);
    assert_eq!(after, last, "junk databases probed again within their TTL");
}

/// The ticker runs of `public.ticker_runs` (instrument_duties) at or after
/// `t0`, as seconds after it.
fn ticker_runs_since(c: &mut Client, t0: f64) -> Vec<f64> {
    c.query(
        "SELECT extract(epoch FROM at)::float8 - $1 FROM public.ticker_runs \
          WHERE extract(epoch FROM at)::float8 >= $1 ORDER BY at",
        &[&t0],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

fn server_epoch(c: &mut Client) -> f64 {
    c.query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .unwrap()
        .get(0)
}

/// pgque.tick_coalesce_ms: a producer's commit after a quiet window is
/// ticked at once (a lone send never waits for the window), and a stream of
/// commits closer together than the window shares one tick per window, the
/// last commit's tick deferred to the window's end rather than dropped. The
/// periodic tick is an hour away here, so every tick counted is a commit's.
#[test]
fn commits_within_the_coalescing_window_share_a_tick() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cl = Cluster::start_new(
        "coalesce",
        "pgque.tick_coalesce_ms = 400\npgque.tick_period_ms = 60000\n",
    );
    let mut c = cl.create_db("wk_coalesce");
    instrument_duties(&mut c);
    c.batch_execute("SELECT pgque.create_queue('co')").unwrap();
    let mut p = cl.connect("wk_coalesce");
    // the worker's first pass ran every duty: let the window pass
    std::thread::sleep(Duration::from_millis(1500));

    // a lone send: its tick comes well before the 400 ms window
    let t0 = server_epoch(&mut c);
    p.execute("SELECT pgque.send('co', 'lone'::text)", &[])
        .unwrap();
    let mut runs = vec![];
    wait_until(Duration::from_secs(5), || {
        runs = ticker_runs_since(&mut c, t0);
        !runs.is_empty()
    });
    assert!(!runs.is_empty(), "no tick for a lone send within 5 s");
    assert!(
        runs[0] < 0.25,
        "a lone send waited {:.3} s for its tick",
        runs[0]
    );

    // a burst: 60 commits 20 ms apart (1.2 s) after another quiet window
    std::thread::sleep(Duration::from_millis(1000));
    let t1 = server_epoch(&mut c);
    let mut last: f64 = 0.0;
    for i in 0..60 {
        // the send's time, just before its commit
        last = p
            .query_one(
                "SELECT extract(epoch FROM clock_timestamp())::float8 - $2 \
                   FROM pgque.send('co', $1::text)",
                &[&i.to_string(), &t1],
            )
            .unwrap()
            .get(0);
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let runs = ticker_runs_since(&mut c, t1);
    println!("burst of 60 commits over {last:.2} s: ticks at {runs:?}");
    // one tick per 400 ms window at most: ~4 over 1.2 s, +1 for the edges;
    // the bound follows how long the burst really took (on a loaded machine
    // the 60 sends spread over more windows), never near the 60 that a tick
    // per commit would make
    let most = (last / 0.4).ceil() as usize + 1;
    assert!(
        (2..=most).contains(&runs.len()),
        "{} ticks for 60 commits over {last:.2} s at a 400 ms window",
        runs.len()
    );
    for w in runs.windows(2) {
        assert!(w[1] - w[0] >= 0.39, "two ticks {:.3} s apart", w[1] - w[0]);
    }
    // the burst's last commit is ticked after it committed (deferred to the
    // window's end, not dropped)
    let end = *runs.last().unwrap();
    assert!(
        end > last && end <= last + 0.6,
        "last tick at {end:.3} s, the last send at {last:.3} s"
    );
}
