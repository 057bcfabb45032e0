//! A worker killed with SIGKILL: PostgreSQL treats it as a crash, resets shared
//! memory and restarts every process; the launcher then finds the database
//! again and its worker comes back. In a file of its own because the crash
//! restart drops every other connection to the server.
use pgque_pg_test::*;
use std::time::Duration;

fn worker_pid(db: &str) -> Option<i32> {
    let mut admin = match pgque_pg_test::postgres::Client::connect(
        &conninfo("postgres", "postgres"),
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
    let db = TestDb::new("crash_worker");
    let mut pid = None;
    assert!(wait_until(Duration::from_secs(5), || {
        pid = worker_pid(&db.name);
        pid.is_some()
    }));
    let pid = pid.unwrap();
    let st = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let mut new_pid = None;
    assert!(
        wait_until(Duration::from_secs(30), || {
            new_pid = worker_pid(&db.name);
            new_pid.is_some_and(|p| p != pid)
        }),
        "no worker within 30 s of kill -9 of the old one"
    );
    // And the database works after recovery.
    let mut c = db.connect();
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
