//! pgque's ProcessUtility hook runs for every utility statement of every
//! database of the server (the library is preloaded). The errors those
//! statements raise must reach the client exactly as PostgreSQL raised them:
//! a DO block's or a procedure's CONTEXT, the table, column and constraint
//! names drivers map errors with, DETAIL and HINT as written (no Rust
//! backtrace appended), the SQLSTATE. A database without the extension and
//! one with it both see them whole.
use pgque_pg_test::postgres::error::DbError;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;

fn db_error(c: &mut Client, sql: &str) -> DbError {
    let e = c.batch_execute(sql).expect_err(sql);
    e.as_db_error()
        .unwrap_or_else(|| panic!("{sql}: not a server error: {e}"))
        .clone()
}

fn check(c: &mut Client) {
    // RAISE in a DO block: every field it sets, and its context
    let e = db_error(
        c,
        "DO $$ BEGIN RAISE EXCEPTION 'boom' USING DETAIL = 'd', HINT = 'h', ERRCODE = 'P0001',
                 SCHEMA = 'sch', TABLE = 'tbl', COLUMN = 'col', CONSTRAINT = 'con', DATATYPE = 'typ';
               END $$",
    );
    assert_eq!(e.code().code(), "P0001");
    assert_eq!(e.message(), "boom");
    assert_eq!(e.detail(), Some("d"), "DETAIL as written");
    assert_eq!(e.hint(), Some("h"));
    assert_eq!(e.schema(), Some("sch"));
    assert_eq!(e.table(), Some("tbl"));
    assert_eq!(e.column(), Some("col"));
    assert_eq!(e.constraint(), Some("con"));
    assert_eq!(e.datatype(), Some("typ"));
    assert!(
        e.where_().is_some_and(|w| w.contains("inline_code_block")),
        "CONTEXT: {:?}",
        e.where_()
    );

    // a unique violation inside a procedure (CALL is a utility statement)
    c.batch_execute(
        "DROP TABLE IF EXISTS ue_u CASCADE;
         CREATE TABLE ue_u (a int CONSTRAINT ue_u_a_key UNIQUE);
         INSERT INTO ue_u VALUES (1);
         CREATE OR REPLACE PROCEDURE ue_p() LANGUAGE sql AS $$ INSERT INTO ue_u VALUES (1) $$;",
    )
    .unwrap();
    let e = db_error(c, "CALL ue_p()");
    assert_eq!(e.code().code(), "23505");
    assert_eq!(e.constraint(), Some("ue_u_a_key"));
    assert_eq!(e.table(), Some("ue_u"));
    assert_eq!(e.detail(), Some("Key (a)=(1) already exists."));
    assert!(
        e.where_().is_some_and(|w| w.contains("ue_p")),
        "CONTEXT: {:?}",
        e.where_()
    );

    // DROP with dependents: DETAIL and HINT
    c.batch_execute("CREATE VIEW ue_v AS SELECT * FROM ue_u")
        .unwrap();
    let e = db_error(c, "DROP TABLE ue_u");
    assert_eq!(e.code().code(), "2BP01");
    assert_eq!(e.detail(), Some("view ue_v depends on table ue_u"));
    assert_eq!(
        e.hint(),
        Some("Use DROP ... CASCADE to drop the dependent objects too.")
    );
    c.batch_execute("DROP TABLE ue_u CASCADE; DROP PROCEDURE ue_p()")
        .unwrap();
}

#[test]
fn utility_errors_reach_the_client_whole_with_and_without_the_extension() {
    let with = TestDb::new("ue_with");
    check(&mut with.connect());
    let without = TestDb::without_extension("ue_without");
    check(&mut without.connect());
}

/// A server started with RUST_BACKTRACE=1 in its environment (a common
/// setting in a developer's shell or a container image) sends no Rust
/// backtrace to clients: not for an error pgque raises itself, nor for one
/// PostgreSQL raises inside pgque's code (a statement timeout in the middle
/// of a call).
#[test]
fn no_rust_backtrace_reaches_a_client_when_the_server_has_rust_backtrace_set() {
    // the private cluster's postmaster inherits this process's environment
    std::env::set_var("RUST_BACKTRACE", "1");
    let cl = Cluster::start_new("backtrace", "");
    let mut c = cl.create_db("bt");
    c.batch_execute("SELECT pgque.create_job_queue('jq')")
        .unwrap();
    let raised = db_error(&mut c, "SELECT pgque.send('no_such_queue', 'x'::text)");
    assert_eq!(raised.code().code(), "42704");
    // a lock another session holds makes pgque's own statement time out
    let mut holder = cl.connect("bt");
    holder
        .batch_execute("BEGIN; LOCK TABLE pgque.job_queues IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    c.batch_execute("SET lock_timeout = '200ms'").unwrap();
    let timed_out = db_error(&mut c, "SELECT pgque.enqueue('jq', 'k')");
    assert_eq!(timed_out.code().code(), "55P03");
    holder.batch_execute("ROLLBACK").unwrap();
    for e in [raised, timed_out] {
        let detail = e.detail().unwrap_or("");
        assert!(
            !detail.contains("backtrace")
                && !detail.contains("pgque::")
                && detail.lines().count() <= 2,
            "a backtrace in DETAIL: {detail}"
        );
    }
}
