//! After a server restart and after a crash restart (issue 30, item 1), a
//! database's worker comes back as the resident worker the README promises
//! (`pgque.worker_idle_exit = 0`, a free pool), not as a "due start" that
//! parks whenever it is idle and is started again for every due duty.
//! Idle mode on (the default; the shared server switches it off), each
//! scenario on a private cluster, the two side by side (the test threads of
//! this binary) so the minute each watches is paid once.
use pgque_pg_test::postgres::{Client, NoTls};
use pgque_pg_test::*;
use std::time::{Duration, Instant};

/// How long the worker's pid must stay the same while the database is idle:
/// long enough for idle ticks (ticker_idle_period) and the housekeeping of
/// pgque.idle_maint_period (60 s) to come due, each of which started a new
/// process when the worker parked.
const WATCH: Duration = Duration::from_secs(60);

fn worker_pid(cl: &Cluster, db: &str) -> Option<i32> {
    // None while the server restarts
    let mut admin = Client::connect(&cl.conninfo("postgres"), NoTls).ok()?;
    admin
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgque worker' AND datname = $1",
            &[&db],
        )
        .ok()
        .flatten()
        .map(|r| r.get(0))
}

fn worker_row(c: &mut Client) -> (String, String) {
    let r = c
        .query_one(
            "SELECT status, detail FROM pgque.status() WHERE component = 'worker'",
            &[],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

/// A database with an event queue (a consumer), a job queue and a
/// schedule: every kind of duty has something to come due.
fn setup(cl: &Cluster, db: &str) {
    let mut c = cl.create_db(db);
    c.batch_execute(
        "SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c');
         SELECT pgque.set_queue_config('q', 'ticker_idle_period', '5 seconds');
         SELECT pgque.create_job_queue('j');
         SELECT pgque.send('q', 'before'::text);",
    )
    .unwrap();
}

/// Waits for the worker to come back after `old` (a pid, or None), then
/// checks that one process serves the database for WATCH while it is idle,
/// says so in status(), and delivers a send at once afterwards.
fn worker_stays(cl: &Cluster, db: &str, old: Option<i32>, what: &str) {
    let mut pid = None;
    assert!(
        wait_until(Duration::from_secs(30), || {
            pid = worker_pid(cl, db);
            pid.is_some() && pid != old
        }),
        "{what}: no worker within 30 s:\n{}",
        cl.log_tail(30)
    );
    let pid = pid.unwrap();
    let mut c = cl.connect(db);
    assert!(
        wait_until(Duration::from_secs(20), || worker_row(&mut c)
            .1
            .contains("idle since")),
        "{what}: the worker never went idle: {:?}",
        worker_row(&mut c)
    );
    let start = Instant::now();
    let mut seen = vec![pid];
    while start.elapsed() < WATCH {
        std::thread::sleep(Duration::from_millis(500));
        let now = worker_pid(cl, db);
        if now != Some(*seen.last().unwrap()) {
            seen.push(now.unwrap_or(0));
        }
        let (status, _) = worker_row(&mut c);
        assert_eq!(
            (status.as_str(), now),
            ("running", Some(pid)),
            "{what}: after {:?} of idleness the worker is not the same process \
             (pids seen, 0 = none: {seen:?}):\n{}",
            start.elapsed(),
            cl.log_tail(20)
        );
    }
    eprintln!("{what}: worker {pid} stayed for {WATCH:?} of idleness");
    // and it still serves the database at once
    c.execute("SELECT pgque.send('q', 'after'::text)", &[])
        .unwrap();
    let mut got: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !got.contains(&"after".to_string()) && Instant::now() < deadline {
        let rows = c
            .query(
                "SELECT batch_id, payload FROM pgque.receive('q', 'c', 100)",
                &[],
            )
            .unwrap();
        if let Some(r) = rows.first() {
            let b: i64 = r.get(0);
            got.extend(rows.iter().map(|r| r.get::<_, String>(1)));
            c.execute("SELECT pgque.ack($1)", &[&b]).unwrap();
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert_eq!(
        got,
        vec!["before", "after"],
        "{what}: events after the restart"
    );
}

#[test]
fn after_a_server_restart_the_worker_stays_resident() {
    let cl = Cluster::start_new("restart_resident", "pgque.idle_after = 1000");
    let db = "restart_resident";
    setup(&cl, db);
    let old = worker_pid(&cl, db);
    cl.restart();
    worker_stays(&cl, db, old, "pg_ctl restart");
}

#[test]
fn after_a_crash_restart_the_worker_stays_resident() {
    let cl = Cluster::start_new("crash_resident", "pgque.idle_after = 1000");
    let db = "crash_resident";
    setup(&cl, db);
    let old = worker_pid(&cl, db);
    // kill -9 of an ordinary backend: the postmaster resets shared memory
    // and restarts every process (crash recovery).
    let mut victim = cl.connect(db);
    let vpid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    kill9(vpid);
    drop(victim);
    assert!(
        wait_until(Duration::from_secs(30), || {
            std::fs::read_to_string(format!("{}/server.log", cl.dir))
                .unwrap_or_default()
                .contains("all server processes terminated; reinitializing")
        }),
        "the kill was not a crash restart:\n{}",
        cl.log_tail(30)
    );
    worker_stays(&cl, db, old, "kill -9 of a backend");
}
