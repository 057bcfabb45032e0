//! pgque: a queue that lives inside PostgreSQL.
//!
//! Module map, in layers: each module imports only its own layer and those
//! below it, and the graph has no cycle (`scripts/layers.py`, run by
//! `make lint`; docs/design/layers.md).
//!
//! 0. shared by everything:
//!    - `gucs`    every `pgque.*` setting with typed accessors
//!    - `error`   errors with SQLSTATEs, name validation
//!    - `datum`   SQL argument types (jsonb as text, arrays as one datum), intervals
//!    - `jsontext` jsonb's text, written as jsonb_out writes it
//!    - `materialize` set-returning functions in materialize mode
//!    - `headers` trace-context headers of jobs and events: the check, the schema probes
//!    - `shmem`   shared state of the background workers (status, wake-ups)
//!    - `pool`    the rules of the worker pool's demand table (kept in shmem)
//!    - `waiters` backends waiting inside the server for work, and the waiting loop
//!    - `wake`    a committing transaction wakes its database's worker and waiters
//!    - `locks`   pgque's own transaction locks, which other roles cannot take
//! 1. the engines:
//!    - `log`     the event log: queues, ticks, batches, cuts, slots, retries, rotation
//!    - `jobs::log` the job log: append-only lanes, dispatch, release, rotation
//! 2. the SQL API over them:
//!    - `api`     the PgQue-compatible event API: send / receive / ack / nack, slots, dlq ...
//!    - `jobs`    job queues: enqueue, dispatch, lifecycle, flows, rate limits, sweeps
//!    - `schedules` periodic jobs: the cron grammar and the run_schedules duty
//!    - `explorer` the dashboard's SQL views of jobs and events
//! 3. what runs and reads everything:
//!    - `worker`  the launcher and the per-database worker loop (thin: calls duty functions)
//!    - `metrics` pgque.metrics(): the figures pgque-web exports to Prometheus
//!    - `admin`   start/stop/status/version
//!
//! SQL install order (pgrx places each file by its `requires`):
//!   1. sql/00_bootstrap.sql   schema objects every module needs: roles, pgque.message type
//!   2. sql/10_event_log.sql   event-queue tables            (src/log/mod.rs)
//!   3. sql/15_slots.sql       partition slots: N and leases (src/log/slots.rs)
//!   4. sql/20_idempotency.sql send_idem's key ledger        (src/api/idem.rs)
//!   5. sql/21_delayed.sql     send_at's delayed events      (src/api/delayed.rs)
//!   6. sql/30_jobs.sql        job-queue tables              (src/jobs/mod.rs)
//!      sql/31_job_log.sql     the job log                   (src/jobs/log/)
//!      sql/32_schedules.sql   periodic jobs                 (src/schedules/)
//!      sql/33_rate_limits.sql token buckets               (src/jobs/rate.rs)
//!   7. the #[pg_extern] functions (and the view partition_slot_status)
//!   8. sql/99_finalize.sql    grants, revokes, worker start (runs last)
use pgrx::prelude::*;

pub mod admin;
pub mod api;
pub mod datum;
pub mod error;
pub mod explorer;
pub mod gucs;
pub mod headers;
pub mod jobs;
pub mod jsontext;
pub mod locks;
pub mod log;
pub mod materialize;
pub mod metrics;
pub mod pool;
pub mod schedules;
pub mod shmem;
pub mod waiters;
pub mod wake;
pub mod worker;

#[cfg(any(test, feature = "pg_test"))]
mod test_util;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/00_bootstrap.sql", name = "bootstrap", bootstrap);
extension_sql_file!("../sql/99_finalize.sql", name = "finalize", finalize);

/// Called by PostgreSQL when the library loads (at server start with
/// `shared_preload_libraries`, or on first use in a backend otherwise).
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // pgrx's panic hook captures a backtrace whenever RUST_BACKTRACE is set
    // in the server's environment and sends it in the error's DETAIL: to
    // every client, pgque's internals with it. RUST_LIB_BACKTRACE takes
    // precedence for Backtrace::capture(), which reads it once: off before
    // the first capture in this process (and in every process the
    // postmaster forks after loading us).
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
    gucs::init();
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        shmem::init();
        waiters::init();
        worker::init();
    }
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'pgque'"]
    }
}
