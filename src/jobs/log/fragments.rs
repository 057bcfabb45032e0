//! SQL text shared by the job log's statements and the SQL API's: macros,
//! because the statements are built with `concat!`, which takes literals.
//! Used as `crate::refill!` / `crate::dispatch_queues!`.

/// The head of every dispatch statement (src/jobs/dispatch.rs's and the job log's,
/// src/jobs/log/dispatch.rs): `qs`, the call's queues ($1) that are not
/// paused, in array order (`pos`), with the lease to give ($4, or the
/// queue's).
#[macro_export]
macro_rules! dispatch_queues {
    () => {
        r#"
WITH RECURSIVE
qs AS MATERIALIZED (
    SELECT jq.queue_name, jq.mode, COALESCE($4::interval, jq.lease) AS lease, u.pos
    FROM unnest($1::text[]) WITH ORDINALITY AS u(name, pos)
    JOIN pgque.job_queues jq ON jq.queue_name = u.name
    WHERE NOT jq.paused
),"#
    };
}

/// The tokens of bucket row `$b` (columns `$jobs`, `$per`, `$burst`,
/// `tokens`, `refilled_at`) at statement_timestamp(), as float8.
#[macro_export]
macro_rules! refill {
    ($b:ident, $jobs:ident, $per:ident, $burst:ident) => {
        concat!(
            "LEAST(",
            stringify!($b),
            ".",
            stringify!($burst),
            "::float8, ",
            stringify!($b),
            ".tokens + ",
            stringify!($b),
            ".",
            stringify!($jobs),
            "::float8 * GREATEST(0, EXTRACT(EPOCH FROM statement_timestamp() - ",
            stringify!($b),
            ".refilled_at))::float8 / EXTRACT(EPOCH FROM ",
            stringify!($b),
            ".",
            stringify!($per),
            ")::float8)"
        )
    };
}
