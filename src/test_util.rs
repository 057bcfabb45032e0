//! Helpers every in-server test module uses (`#[pg_test]`s run in one
//! transaction that is rolled back). Only in test builds.
use pgrx::prelude::*;

/// Runs `sql`; panics with the statement on an error.
pub fn run(sql: &str) {
    Spi::run(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The first column of the first row of `sql`.
pub fn one<T: pgrx::FromDatum + pgrx::IntoDatum>(sql: &str) -> Option<T> {
    Spi::get_one::<T>(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// A count query's result (0 for NULL).
pub fn count(sql: &str) -> i64 {
    one::<i64>(sql).unwrap_or(0)
}

/// SQLSTATE raised by `sql` (run in a subtransaction, so its effects are
/// rolled back), or "ok".
pub fn sqlstate(sql: &str) -> String {
    let missing = one::<bool>(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_proc
                            WHERE proname = 'sqlstate_of' AND pronamespace = pg_my_temp_schema())",
    );
    if missing == Some(true) {
        run("CREATE FUNCTION pg_temp.sqlstate_of(q text) RETURNS text
             LANGUAGE plpgsql AS $$
             BEGIN EXECUTE q; RETURN 'ok';
             EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $$");
    }
    Spi::get_one_with_args::<String>("SELECT pg_temp.sqlstate_of($1)", &[sql.into()])
        .unwrap()
        .unwrap()
}
