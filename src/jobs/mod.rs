//! Job queues: competing-consumer work items with their own state.
//!
//! - `channel`   `job_channel`: the NOTIFY channel of a job queue
//! - `stmt`      the per-backend cache of prepared statements every hot path uses
//! - `queues`    job queue and actor administration
//! - `enqueue`   `enqueue_ready_rows` / `enqueue`: a whole batch in one statement
//! - `dispatch`  `dispatch`: claim up to `limit` ready jobs in one call
//! - `jobrows`   dispatch's result rows, handed over in one call as datums
//! - `outcomes`  enqueue_ready_rows' result rows, handed over in one call
//! - `lifecycle` complete / fail / heartbeat / snooze / cancel / retry_job
//! - `flows`     enqueue_flow, depends_on: waiting jobs, their release and cancellation
//! - `outputs`   job outputs and progress: the jsonb arguments, caps, set_progress
//! - `sweeps`    lease rescue, promotion, event retention, pruning, ANALYZE
//! - `log`       the job log: ordinary jobs as batch rows, claims and done rows
//! - `rate`      rate limits: token buckets per queue and per actor
//!
//! The tables are in `sql/30_jobs.sql` (pgque.jobs and the control tables)
//! and `sql/31_job_log.sql` (the log); user documentation in `docs/job-queues.md`.
use pgrx::prelude::*;

pub mod args;
pub mod channel;
pub mod dispatch;
pub mod dispatch_wait;
pub mod enqueue;
pub mod flows;
pub mod lifecycle;
pub mod log;
pub mod outputs;
pub mod queues;
pub mod rate;
pub mod sweeps;

extension_sql_file!(
    "../../sql/30_jobs.sql",
    name = "jobs",
    requires = ["bootstrap"]
);
extension_sql_file!(
    "../../sql/31_job_log.sql",
    name = "job_log",
    requires = ["jobs"]
);
extension_sql_file!(
    "../../sql/32_flows.sql",
    name = "flows",
    requires = ["job_log"]
);

/// Advisory-lock class of a whole job queue: enqueue holds it shared, drop
/// takes it exclusive. (Two-key advisory locks: class, hashtext(queue).)
pub const QUEUE_LOCK_CLASS: i32 = 0x6A6F_6271; // "jobq"
/// Advisory-lock class of a lane (queue, priority, shard): held from the
/// moment a transaction takes ids in the lane until it commits.
pub const LANE_LOCK_CLASS: i32 = crate::locks::LANE_CLASS; // "jobl"

/// The job states, as stored.
pub const STATES: [&str; 7] = [
    "waiting",
    "scheduled",
    "ready",
    "running",
    "completed",
    "failed",
    "cancelled",
];

#[cfg(any(test, feature = "pg_test"))]
mod headers_tests;
#[cfg(any(test, feature = "pg_test"))]
mod rate_tests;
#[cfg(any(test, feature = "pg_test"))]
pub(crate) mod tests;
