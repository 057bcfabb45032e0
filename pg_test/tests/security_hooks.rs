//! DROP DATABASE and friends (docs/operations.md, "Threat model"): refused on
//! privileges, they leave the worker alone; cancelled while pgque waits for
//! the worker to leave, they leave it running.
mod sec_util;
use pgque_pg_test::*;
use sec_util::*;
use std::time::Duration;

#[test]
fn security_refused_database_statements_leave_the_worker_alone() {
    let _g = serial();
    ensure_role(&mut connect_to("postgres"), "sec_nobody", "LOGIN");
    let db = TestDb::new("sec_hook");
    let mut su = connect_to("postgres");
    let before = wait_worker(&mut su, "sec_hook");
    let mut n = connect_as("postgres", "sec_nobody");
    for sql in [
        "DROP DATABASE sec_hook",
        "ALTER DATABASE sec_hook RENAME TO sec_hook_renamed",
        "CREATE DATABASE sec_hook_copy TEMPLATE sec_hook",
    ] {
        assert_eq!(failure(n.batch_execute(sql)).0, "42501", "{sql}");
    }
    let mut nd = db.connect_as("sec_nobody");
    assert_eq!(failure(nd.batch_execute("DROP EXTENSION pgque")).0, "42501");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        worker_pid(&mut su, "sec_hook"),
        Some(before),
        "refused statements stopped (or restarted) the worker"
    );
}

#[test]
fn security_a_drop_database_cancelled_while_the_worker_leaves_keeps_the_worker() {
    let _g = serial();
    let db = TestDb::new("sec_cancel");
    let mut su = connect_to("postgres");
    // statement_timeout fires while pgque waits (10 ms steps) for the
    // worker to leave; when it fires earlier, the worker was not touched and
    // the attempt is repeated
    let mut stopped_once = false;
    for _ in 0..20 {
        let before = wait_worker(&mut su, &db.name);
        su.batch_execute("SET statement_timeout = '1ms'").unwrap();
        let r = failure(su.batch_execute("DROP DATABASE sec_cancel"));
        while su.batch_execute("RESET statement_timeout").is_err() {}
        assert_eq!(r.0, "57014", "{}", r.1);
        let back = wait_until(Duration::from_secs(15), || {
            worker_pid(&mut su, &db.name).is_some()
        });
        assert!(
            back,
            "a cancelled DROP DATABASE left the database without its worker"
        );
        if worker_pid(&mut su, &db.name) != Some(before) {
            stopped_once = true;
            break;
        }
    }
    assert!(
        stopped_once,
        "the timeout never fired while the worker was stopping"
    );
}
