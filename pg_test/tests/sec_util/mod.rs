//! Helpers shared by the security_* tests.
#![allow(dead_code)]
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The tests of one binary run one at a time (some change cluster-wide roles).
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Creates role `name` (with `attrs`) unless it exists. Roles are cluster-wide
/// and test binaries run side by side: a concurrent CREATE ROLE of the same
/// name fails with unique_violation, which means the role is there too.
pub fn ensure_role(c: &mut Client, name: &str, attrs: &str) {
    c.batch_execute(&format!(
        "DO $$ BEGIN CREATE ROLE {name} {attrs}; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    ))
    .unwrap();
}

/// The SQLSTATE and message of a failed statement ("" when it succeeded).
pub fn failure(r: Result<(), pgque_pg_test::postgres::Error>) -> (String, String) {
    match r {
        Ok(()) => (String::new(), String::new()),
        Err(e) => match e.as_db_error() {
            Some(d) => (d.code().code().to_string(), d.message().to_string()),
            None => ("?".into(), e.to_string()),
        },
    }
}

pub fn worker_pid(c: &mut Client, db: &str) -> Option<i32> {
    c.query_opt(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgque worker' AND datname = $1",
        &[&db],
    )
    .unwrap()
    .map(|r| r.get(0))
}

pub fn wait_worker(c: &mut Client, db: &str) -> i32 {
    let mut pid = None;
    wait_until(Duration::from_secs(15), || {
        pid = worker_pid(c, db);
        pid.is_some()
    });
    pid.unwrap_or_else(|| panic!("no pgque worker in {db}"))
}

pub fn extension_installed(c: &mut Client) -> bool {
    c.query_one(
        "SELECT count(*) FROM pg_extension WHERE extname = 'pgque'",
        &[],
    )
    .unwrap()
    .get::<_, i64>(0)
        == 1
}
