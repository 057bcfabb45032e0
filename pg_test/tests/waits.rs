//! The waiting forms (DESIGN.md 26, docs/waits.md): receive(q, c, n, wait),
//! receive_with_headers(q, c, n, wait) and next_batch_wait(q, c, wait) sleep
//! inside the server until a tick gives the consumer a batch.
//!
//! What is asserted: a waiter is woken by a producer's commit (not by a
//! rollback) long before its wait ends, and shows in pg_stat_activity as
//! waiting (wait_event_type Extension), not as a busy query; a cancel and
//! statement_timeout end it with 57014; a transaction with an xid, or in
//! REPEATABLE READ, does not sleep; bad arguments are refused with their
//! SQLSTATEs; pgque.max_wait caps the wait; a waiting consumer asks for its
//! tick at once instead of after the coalescing window; a client killed
//! mid-wait leaves no backend behind; the wait works through PgBouncer in
//! transaction mode.
mod events_util;
use events_util::*;
use pgque_pg_test::postgres::{Client, NoTls};
use pgque_pg_test::*;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long a test waiter asks to wait: far beyond every wake-up asserted.
const LONG: &str = "8 seconds";

/// metrics()' count of backends of this database waiting now.
fn waiting_now(c: &mut Client) -> f64 {
    c.query_one(
        "SELECT value FROM pgque.metrics() WHERE name = 'pgque_waiting_consumers'",
        &[],
    )
    .unwrap()
    .get(0)
}

fn setup(c: &mut Client, q: &str) {
    c.batch_execute(&format!(
        "SELECT pgque.create_queue('{q}'); SELECT pgque.subscribe('{q}', 'c')"
    ))
    .unwrap();
}

/// Runs a waiting receive in a thread: (elapsed, msg ids).
fn spawn_receive(
    db: &str,
    q: &str,
    wait: &str,
) -> std::thread::JoinHandle<(Duration, Vec<i64>, i32)> {
    let (db, q, wait) = (db.to_string(), q.to_string(), wait.to_string());
    std::thread::spawn(move || {
        let mut c = connect_to(&db);
        let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        let t = Instant::now();
        let rows = c
            .query(
                "SELECT msg_id FROM pgque.receive($1, 'c', 100, $2::text::interval)",
                &[&q, &wait],
            )
            .unwrap();
        (t.elapsed(), rows.iter().map(|r| r.get(0)).collect(), pid)
    })
}

/// The wait event of the backend running a waiting receive on `q`, once it
/// sleeps (None if none is seen within 5 s).
fn waiter_event(c: &mut Client, q: &str) -> Option<(String, String)> {
    let mut found = None;
    wait_until(Duration::from_secs(5), || {
        let r = c
            .query(
                "SELECT wait_event_type, wait_event FROM pg_stat_activity \
                  WHERE query LIKE '%pgque.receive(%' AND query NOT LIKE '%pg_stat_activity%' \
                    AND datname = current_database() AND state = 'active' \
                    AND wait_event_type = 'Extension'",
                &[],
            )
            .unwrap();
        found = r.first().map(|r| (r.get(0), r.get(1)));
        let _ = q;
        found.is_some()
    });
    found
}

#[test]
fn a_commit_wakes_a_waiter_and_a_rollback_does_not() {
    let db = new_db("wait_commit");
    let mut c = db.connect();
    setup(&mut c, "w");
    let waiter = spawn_receive(&db.name, "w", LONG);
    let ev = waiter_event(&mut c, "w").expect("the waiter sleeps in an Extension wait event");
    assert_eq!(ev.0, "Extension");
    assert_eq!(waiting_now(&mut c), 1.0, "metrics() counts the waiter");
    // a rolled-back send wakes nothing that returns
    c.batch_execute("BEGIN; SELECT pgque.send('w', 'lost'); ROLLBACK")
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiter.is_finished(), "a rollback ended the wait");
    let t = Instant::now();
    let id: i64 = c
        .query_one("SELECT pgque.send('w', 'kept')", &[])
        .unwrap()
        .get(0);
    let (elapsed, ids, _) = waiter.join().unwrap();
    let after_send = t.elapsed();
    assert_eq!(ids, vec![id], "the waiter got the committed event only");
    assert!(
        after_send < Duration::from_secs(3),
        "woken {after_send:?} after the commit (wait {LONG})"
    );
    assert!(elapsed < Duration::from_secs(7), "{elapsed:?}");
    eprintln!("waiting receive returned {after_send:?} after the producer's commit");
}

#[test]
fn next_batch_wait_and_receive_with_headers_wait_too() {
    let db = new_db("wait_forms");
    let mut c = db.connect();
    setup(&mut c, "f");
    let name = db.name.clone();
    let nb = std::thread::spawn(move || {
        let mut w = connect_to(&name);
        let t = Instant::now();
        let b: Option<i64> = w
            .query_one("SELECT pgque.next_batch_wait('f', 'c', '8 s')", &[])
            .unwrap()
            .get(0);
        let ids: Vec<i64> = w
            .query(
                "SELECT ev_id FROM pgque.get_batch_events($1)",
                &[&b.expect("a batch")],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        w.execute("SELECT pgque.finish_batch($1)", &[&b.unwrap()])
            .unwrap();
        (t.elapsed(), ids)
    });
    std::thread::sleep(Duration::from_millis(400));
    let id: i64 = c
        .query_one("SELECT pgque.send('f', 'x')", &[])
        .unwrap()
        .get(0);
    let (elapsed, ids) = nb.join().unwrap();
    assert_eq!(ids, vec![id]);
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");

    c.batch_execute("SELECT pgque.subscribe('f', 'h')").unwrap();
    let name = db.name.clone();
    let rh = std::thread::spawn(move || {
        let mut w = connect_to(&name);
        w.query(
            "SELECT msg_id, headers::text FROM pgque.receive_with_headers('f', 'h', 10, '8 s')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, Option<String>>(1)))
        .collect::<Vec<_>>()
    });
    std::thread::sleep(Duration::from_millis(400));
    let id: i64 = c
        .query_one(
            "SELECT pgque.send('f', 'ev', 'y'::text, NULL::text, '{\"traceparent\": \"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\"}'::jsonb)",
            &[],
        )
        .unwrap()
        .get(0);
    let got = rh.join().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, id);
    assert!(got[0].1.as_deref().unwrap_or("").contains("traceparent"));
}

#[test]
fn cancel_and_statement_timeout_end_a_wait() {
    let db = new_db("wait_cancel");
    let mut c = db.connect();
    setup(&mut c, "x");
    c.batch_execute("SET statement_timeout = '300ms'").unwrap();
    let t = Instant::now();
    let r = c.query("SELECT * FROM pgque.receive('x', 'c', 10, '8 s')", &[]);
    assert_eq!(sqlstate(r), "57014");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    c.batch_execute("RESET statement_timeout").unwrap();

    let token = c.cancel_token();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        token.cancel_query(NoTls).unwrap();
    });
    let t = Instant::now();
    let r = c.query("SELECT * FROM pgque.receive('x', 'c', 10, '8 s')", &[]);
    canceller.join().unwrap();
    assert_eq!(sqlstate(r), "57014");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // the cancelled waiter gave its shared-memory slot back
    assert_eq!(waiting_now(&mut c), 0.0, "a cancelled wait left its slot");
    // the session goes on, and its waiter slot is free: a new wait works
    let r = c
        .query("SELECT * FROM pgque.receive('x', 'c', 10, '100 ms')", &[])
        .unwrap();
    assert!(r.is_empty());
}

#[test]
fn a_transaction_with_an_xid_or_repeatable_read_does_not_sleep() {
    let db = new_db("wait_xid");
    let mut c = db.connect();
    setup(&mut c, "t");
    for begin in [
        "BEGIN; SELECT pg_current_xact_id()",
        "BEGIN ISOLATION LEVEL REPEATABLE READ",
        "BEGIN ISOLATION LEVEL SERIALIZABLE",
    ] {
        c.batch_execute(begin).unwrap();
        let t = Instant::now();
        let r = c
            .query("SELECT * FROM pgque.receive('t', 'c', 10, '5 s')", &[])
            .unwrap();
        assert!(r.is_empty());
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{begin}: slept {:?}",
            t.elapsed()
        );
        c.batch_execute("ROLLBACK").unwrap();
    }
    // in READ COMMITTED without an xid it does sleep
    let t = Instant::now();
    c.query("SELECT * FROM pgque.receive('t', 'c', 10, '600 ms')", &[])
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(550),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn bad_wait_arguments_are_refused() {
    let db = new_db("wait_bad");
    let mut c = db.connect();
    setup(&mut c, "b");
    for (sql, state) in [
        ("SELECT * FROM pgque.receive('b', 'c', 10, NULL)", "22004"),
        ("SELECT * FROM pgque.receive('b', 'c', 10, '-1 s')", "22023"),
        (
            "SELECT * FROM pgque.receive('b', 'c', 10, 'infinity')",
            "22023",
        ),
        ("SELECT * FROM pgque.receive('b', 'c', 0, '1 s')", "22023"),
        (
            "SELECT * FROM pgque.receive('nope', 'c', 10, '1 s')",
            "42704",
        ),
        (
            "SELECT * FROM pgque.receive('b', 'nobody', 10, '1 s')",
            "42704",
        ),
        ("SELECT pgque.next_batch_wait('b', 'c', NULL)", "22004"),
        ("SELECT pgque.next_batch_wait('nope', 'c', '1 s')", "42704"),
    ] {
        if sql.contains("infinity") && major() < 17 {
            continue; // infinite intervals exist from PostgreSQL 17 on
        }
        assert_eq!(sqlstate(c.query(sql, &[])), state, "{sql}");
    }
    // the three-argument forms are PgQue's, unchanged
    let n: i64 = c
        .query_one("SELECT count(*) FROM pgque.receive('b', 'c', 10)", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

/// A private cluster with a long coalescing window (so a tick on demand is
/// told from a coalesced one) and a short cap.
fn demand_cluster(name: &str) -> (Cluster, Client) {
    let cl = Cluster::start_new(
        name,
        "pgque.tick_coalesce_ms = 1000\npgque.tick_period_ms = 60000\npgque.max_wait = 1500ms",
    );
    let mut c = cl.create_db(name);
    setup(&mut c, "d");
    (cl, c)
}

#[test]
fn a_waiting_consumer_gets_its_tick_at_once_and_the_cap_holds() {
    let (cl, mut c) = demand_cluster("wait_demand");
    // the cap: an 8 s wait ends after pgque.max_wait
    let t = Instant::now();
    let r = c
        .query("SELECT * FROM pgque.receive('d', 'c', 10, '8 s')", &[])
        .unwrap();
    assert!(r.is_empty());
    let e = t.elapsed();
    assert!(
        e >= Duration::from_millis(1400) && e < Duration::from_secs(5),
        "capped wait took {e:?}"
    );
    // Sends at 20/s for 3 s: a polling consumer would see one tick per
    // coalescing window (1 s); a waiting one asks for a tick per commit.
    let conninfo = cl.conninfo("wait_demand");
    let producer = std::thread::spawn(move || {
        let mut p = Client::connect(&conninfo, NoTls).unwrap();
        let start = Instant::now();
        for i in 0..60u64 {
            let due = start + Duration::from_millis(50 * i);
            if let Some(d) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            p.execute("SELECT pgque.send('d', 'x')", &[]).unwrap();
        }
    });
    let mut lat = vec![];
    let deadline = Instant::now() + Duration::from_secs(20);
    while lat.len() < 60 && Instant::now() < deadline {
        let rows = c
            .query(
                "SELECT batch_id, (extract(epoch FROM clock_timestamp() - created_at) * 1000)::float8 \
                   FROM pgque.receive('d', 'c', 100, '1 s')",
                &[],
            )
            .unwrap();
        if let Some(r) = rows.first() {
            let b: i64 = r.get(0);
            lat.extend(rows.iter().map(|r| r.get::<_, f64>(1)));
            ack(&mut c, b);
        }
    }
    producer.join().unwrap();
    assert_eq!(lat.len(), 60, "every event arrived");
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let p50 = lat[lat.len() / 2];
    eprintln!(
        "waiting consumer, 1 s coalescing window: p50 {p50:.1} ms, max {:.1} ms",
        lat[lat.len() - 1]
    );
    // With coalesced ticks only, p50 would be about half the window (500 ms).
    assert!(p50 < 200.0, "p50 {p50:.1} ms: no tick on demand");
}

/// Finds the backend running `needle` on `db`.
fn backend_of(c: &mut Client, needle: &str) -> Option<i32> {
    c.query(
        "SELECT pid FROM pg_stat_activity WHERE query LIKE $1 AND pid <> pg_backend_pid()",
        &[&format!("%{needle}%")],
    )
    .unwrap()
    .first()
    .map(|r| r.get(0))
}

#[test]
fn a_client_killed_mid_wait_leaves_no_backend() {
    let (cl, mut c) = demand_cluster("wait_kill");
    c.batch_execute("ALTER SYSTEM SET pgque.max_wait = '30s'")
        .unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut psql = Command::new(format!("{}/psql", cl.bindir))
        .args([
            "-X",
            "-h",
            &cl.dir,
            "-p",
            &cl.port.to_string(),
            "-U",
            "postgres",
        ])
        .args(["-d", "wait_kill", "-c"])
        .arg("SELECT * FROM pgque.receive('d', 'c', 10, '25 s') /* killme */")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut pid = None;
    wait_until(Duration::from_secs(5), || {
        pid = backend_of(&mut c, "killme */");
        pid.is_some()
    });
    let pid = pid.expect("the waiting backend");
    psql.kill().unwrap();
    let _ = psql.wait();
    let t = Instant::now();
    let gone = wait_until(Duration::from_secs(5), || {
        c.query("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .unwrap()
            .is_empty()
    });
    assert!(gone, "backend {pid} still there after its client died");
    eprintln!(
        "the backend of a killed client ended {:?} after the kill",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // nothing left behind: its slot is free, and a new waiter is woken as before
    assert_eq!(
        waiting_now(&mut c),
        0.0,
        "the killed client's slot is still taken"
    );
    let conninfo = cl.conninfo("wait_kill");
    let w = std::thread::spawn(move || {
        let mut w = Client::connect(&conninfo, NoTls).unwrap();
        let t = Instant::now();
        let n = w
            .query("SELECT * FROM pgque.receive('d', 'c', 10, '10 s')", &[])
            .unwrap()
            .len();
        (n, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    c.execute("SELECT pgque.send('d', 'x')", &[]).unwrap();
    let (n, e) = w.join().unwrap();
    assert_eq!(n, 1);
    assert!(e < Duration::from_secs(5), "{e:?}");
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A PgBouncer in transaction mode in front of the test server (Debian's
/// /usr/sbin/pgbouncer; scripts/setup.sh installs it); killed on drop.
struct Bouncer {
    child: std::process::Child,
    port: u16,
    dir: String,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        stop_bouncer(&self.dir);
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Stops the PgBouncer whose pidfile is in `dir` (runuser's child outlives
/// a kill of runuser), and waits until it has gone.
fn stop_bouncer(dir: &str) {
    let Ok(pid) = std::fs::read_to_string(format!("{dir}/bouncer.pid")) else {
        return;
    };
    let pid = pid.trim().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    wait_until(Duration::from_secs(5), || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
}

fn start_bouncer(db: &str) -> Bouncer {
    let listen = 56400 + (major() as u16);
    let dir = format!("/tmp/pgque_bouncer_{}", major());
    stop_bouncer(&dir); // one a killed earlier run left behind
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ini = format!(
        "[databases]\n{db} = host={host} port={pgport} dbname={db}\n\
         [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n\
         auth_type = trust\nauth_file = {dir}/users.txt\npool_mode = transaction\n\
         default_pool_size = 4\nmax_client_conn = 50\nlogfile = {dir}/bouncer.log\n\
         pidfile = {dir}/bouncer.pid\nignore_startup_parameters = application_name,extra_float_digits\n",
        host = host(),
        pgport = port(),
    );
    std::fs::write(format!("{dir}/pgbouncer.ini"), ini).unwrap();
    std::fs::write(format!("{dir}/users.txt"), "\"postgres\" \"\"\n").unwrap();
    let mut cmd = if is_root() {
        let _ = Command::new("chown")
            .args(["-R", "postgres", &dir])
            .status();
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "/usr/sbin/pgbouncer"]);
        c
    } else {
        Command::new("/usr/sbin/pgbouncer")
    };
    let child = cmd
        .arg(format!("{dir}/pgbouncer.ini"))
        .spawn()
        .expect("start pgbouncer (apt-get install pgbouncer)");
    let b = Bouncer {
        child,
        port: listen,
        dir,
    };
    let up = wait_until(Duration::from_secs(10), || {
        Client::connect(&b.conninfo(db), NoTls).is_ok()
    });
    assert!(up, "pgbouncer did not come up");
    b
}

impl Bouncer {
    fn conninfo(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }
}

#[test]
fn a_wait_through_pgbouncer_in_transaction_mode() {
    let db = new_db("wait_bouncer");
    let mut c = db.connect();
    setup(&mut c, "p");
    let b = start_bouncer(&db.name);
    let conninfo = b.conninfo(&db.name);
    let waiter = std::thread::spawn(move || {
        // simple query protocol, as transaction-mode poolers want
        let mut w = Client::connect(&conninfo, NoTls).unwrap();
        let t = Instant::now();
        let msgs = w
            .simple_query("SELECT msg_id FROM pgque.receive('p', 'c', 10, '8 s')")
            .unwrap();
        let rows = msgs
            .iter()
            .filter(|m| matches!(m, pgque_pg_test::postgres::SimpleQueryMessage::Row(_)))
            .count();
        (rows, t.elapsed())
    });
    assert!(
        waiter_event(&mut c, "p").is_some(),
        "the waiter sleeps behind PgBouncer"
    );
    let t = Instant::now();
    c.execute("SELECT pgque.send('p', 'through the pooler')", &[])
        .unwrap();
    let (rows, _) = waiter.join().unwrap();
    assert_eq!(rows, 1);
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
}

#[test]
fn dispatch_wait_is_woken_by_an_enqueue() {
    let db = new_db("wait_dispatch");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('jw')")
        .unwrap();
    assert_eq!(
        sqlstate(c.query(
            "SELECT * FROM pgque.dispatch_wait(ARRAY['nope'], 10, 'w', '5 s')",
            &[]
        )),
        "42704",
        "an unknown queue is refused before any wait"
    );
    let name = db.name.clone();
    let waiter = std::thread::spawn(move || {
        let mut w = connect_to(&name);
        let t = Instant::now();
        let ids: Vec<i64> = w
            .query(
                "SELECT job_id FROM pgque.dispatch_wait(ARRAY['jw'], 10, 'w1', '8 s') /* dw */",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        (ids, t.elapsed())
    });
    let slept = wait_until(Duration::from_secs(5), || {
        !c.query(
            "SELECT 1 FROM pg_stat_activity WHERE query LIKE '%/* dw */%' \
               AND wait_event_type = 'Extension' AND pid <> pg_backend_pid()",
            &[],
        )
        .unwrap()
        .is_empty()
    });
    assert!(slept, "the dispatcher sleeps in an Extension wait event");
    let t = Instant::now();
    let id: i64 = c
        .query_one("SELECT pgque.enqueue('jw', 'k', '{}'::jsonb)", &[])
        .unwrap()
        .get(0);
    let (ids, _) = waiter.join().unwrap();
    assert_eq!(ids, vec![id], "the waiter claimed the enqueued job");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // the claim is a real one: its lease fences complete
    let (job, token): (i64, i64) = {
        c.execute("SELECT pgque.enqueue('jw', 'k', '{}'::jsonb)", &[])
            .unwrap();
        let r = c
            .query_one(
                "SELECT job_id, lease_token FROM pgque.dispatch_wait(ARRAY['jw'], 1, 'w2', '2 s')",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    let done: bool = c
        .query_one("SELECT pgque.complete($1, $2)", &[&job, &token])
        .unwrap()
        .get(0);
    assert!(done);
    // nothing left: the wait ends empty after its time
    let t = Instant::now();
    let n = c
        .query(
            "SELECT * FROM pgque.dispatch_wait(ARRAY['jw'], 1, 'w', '400 ms')",
            &[],
        )
        .unwrap()
        .len();
    assert_eq!(n, 0);
    assert!(
        t.elapsed() >= Duration::from_millis(350),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn dispatch_wait_on_a_blocked_queue_does_not_spin() {
    let db = new_db("wait_blocked");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_job_queue('jb');
         SELECT pgque.set_actor_capacity('acme', 1);
         SELECT pgque.enqueue('jb', 'k', '{}'::jsonb, actor => 'acme');
         SELECT pgque.enqueue('jb', 'k', '{}'::jsonb, actor => 'acme');",
    )
    .unwrap();
    let first = c
        .query(
            "SELECT * FROM pgque.dispatch_wait(ARRAY['jb'], 10, 'w', '1 s')",
            &[],
        )
        .unwrap();
    assert_eq!(first.len(), 1, "the actor's capacity admits one");
    // the second job is there but cannot be admitted: calls return, but
    // not in a busy loop
    let t = Instant::now();
    let mut calls = 0;
    while t.elapsed() < Duration::from_secs(1) {
        let n = c
            .query(
                "SELECT * FROM pgque.dispatch_wait(ARRAY['jb'], 10, 'w', '1 s')",
                &[],
            )
            .unwrap()
            .len();
        assert_eq!(n, 0, "capacity 1 holds");
        calls += 1;
    }
    eprintln!("{calls} dispatch_wait calls in 1 s on a blocked queue");
    assert!(calls <= 40, "{calls} calls in a second: a busy loop");
}

#[test]
fn ack_receive_acks_and_opens_the_next_batch_in_one_call() {
    let db = manual_db("ack_receive");
    let mut c = db.connect();
    setup(&mut c, "a");
    // (each statement its own transaction: a tick in the senders' own
    // transaction would not cover their events)
    for s in [
        "SELECT pgque.send('a', 'x1')",
        "SELECT pgque.send('a', 'x2')",
        "SELECT pgque.ticker()",
    ] {
        c.batch_execute(s).unwrap();
    }
    let (b1, first) = recv(&mut c, "a", "c", 10);
    let b1 = b1.expect("a first batch");
    assert_eq!(first.len(), 2);
    for s in ["SELECT pgque.send('a', 'x3')", "SELECT pgque.ticker()"] {
        c.batch_execute(s).unwrap();
    }
    let rows = c
        .query(
            "SELECT msg_id, batch_id, payload FROM pgque.ack_receive($1, 10)",
            &[&b1],
        )
        .unwrap();
    assert_eq!(rows.len(), 1, "the next batch, with the third event");
    assert_eq!(rows[0].get::<_, String>(2), "x3");
    let b2: i64 = rows[0].get(1);
    assert_ne!(b2, b1);
    // b1 is finished: acking it again finds nothing
    let again: i32 = c.query_one("SELECT pgque.ack($1)", &[&b1]).unwrap().get(0);
    assert_eq!(again, 0);
    // the last batch acked, nothing new: empty, and the consumer is caught up
    let rows = c
        .query("SELECT * FROM pgque.ack_receive($1)", &[&b2])
        .unwrap();
    assert!(rows.is_empty());
    assert_eq!(recv(&mut c, "a", "c", 10).1, Vec::<i64>::new());
    assert_eq!(
        sqlstate(c.query("SELECT * FROM pgque.ack_receive(987654321)", &[])),
        "42704"
    );
}

#[test]
fn a_waiting_slot_wakes_for_its_own_keys_only() {
    let db = new_db("wait_slot");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('pw'); SELECT pgque.subscribe_partitioned('pw', 'pc', 4);",
    )
    .unwrap();
    let k: i32 = c
        .query_one("SELECT pgque.partition_slot('key-a', 4)", &[])
        .unwrap()
        .get(0);
    // a key of another slot
    let other: String = (0..100)
        .map(|i| format!("key-{i}"))
        .find(|key| {
            c.query_one("SELECT pgque.partition_slot($1, 4)", &[key])
                .unwrap()
                .get::<_, i32>(0)
                != k
        })
        .unwrap();
    c.execute("SELECT pgque.claim_slot('pw', 'pc', $1, 'w1')", &[&k])
        .unwrap();
    let name = db.name.clone();
    let waiter = std::thread::spawn(move || {
        let mut w = connect_to(&name);
        let t = Instant::now();
        let payloads: Vec<String> = w
            .query(
                "SELECT payload FROM pgque.receive_partitioned('pw', 'pc', $1, 4, 'w1', 10, '8 s') /* slotwait */",
                &[&k],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        (payloads, t.elapsed())
    });
    let slept = wait_until(Duration::from_secs(5), || {
        !c.query(
            "SELECT 1 FROM pg_stat_activity WHERE query LIKE '%/* slotwait */%' \
               AND wait_event_type = 'Extension' AND pid <> pg_backend_pid()",
            &[],
        )
        .unwrap()
        .is_empty()
    });
    assert!(
        slept,
        "the slot's consumer sleeps in an Extension wait event"
    );
    // another slot's event is ticked and wakes it, but it is not its batch
    c.execute(
        "SELECT pgque.send('pw', 't', 'not mine'::text, $1::text)",
        &[&other],
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert!(!waiter.is_finished(), "another slot's event ended the wait");
    let t = Instant::now();
    c.execute(
        "SELECT pgque.send('pw', 't', 'mine'::text, 'key-a'::text)",
        &[],
    )
    .unwrap();
    let (payloads, _) = waiter.join().unwrap();
    assert_eq!(payloads, vec!["mine".to_string()]);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}
