//! A worker killed with SIGKILL: PostgreSQL treats it as a crash, resets shared
//! memory and restarts every process; the launcher then finds the database
//! again and its worker comes back. On a private cluster: the crash restart
//! drops every connection to its server, and the other test binaries share
//! the test server at the same time.
use pgque_pg_test::*;
use std::time::Duration;

fn worker_pid(cl: &Cluster, db: &str) -> Option<i32> {
    let mut admin = match pgque_pg_test::postgres::Client::connect(
        &cl.conninfo("postgres"),
        pgque_pg_test::postgres::NoTls,
    ) {
        Ok(c) => c,
        Err(_) => return None, // the server is restarting
    };
    admin
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgque worker' AND datname = $1",
            &[&db],
        )
        .ok()
        .flatten()
        .map(|r| r.get(0))
}

#[test]
fn sigkilled_worker_comes_back_after_crash_recovery() {
    let cl = Cluster::start_new("crash_worker", "");
    drop(cl.create_db("crash_worker"));
    let mut pid = None;
    assert!(wait_until(Duration::from_secs(5), || {
        pid = worker_pid(&cl, "crash_worker");
        pid.is_some()
    }));
    let pid = pid.unwrap();
    kill9(pid);
    let mut new_pid = None;
    assert!(
        wait_until(Duration::from_secs(30), || {
            new_pid = worker_pid(&cl, "crash_worker");
            new_pid.is_some_and(|p| p != pid)
        }),
        "no worker within 30 s of kill -9 of the old one:\n{}",
        cl.log_tail(30)
    );
    let log = std::fs::read_to_string(format!("{}/server.log", cl.dir)).unwrap_or_default();
    assert!(
        log.contains("terminated by signal 9") && log.contains("reinitializing"),
        "the kill was not a crash restart:\n{}",
        cl.log_tail(30)
    );
    // And the database works after recovery.
    let mut c = cl.connect("crash_worker");
    let same: bool = c
        .query_one(
            "SELECT pgque.version() = extversion FROM pg_extension WHERE extname = 'pgque'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        same,
        "the library and the installed extension disagree after recovery"
    );
}
