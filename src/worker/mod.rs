//! The background workers.
//!
//! - `launcher`: one static worker per server. At start, and every
//!   `pgque.launcher_rescan_interval`, it looks for connectable databases
//!   whose worker is missing; a database without the extension sees that
//!   worker look and leave at once. It starts workers within the pool's
//!   bound (`pool`): any number of databases share pgque.max_workers
//!   processes, a database holding one only while it has work.
//! - `dbworker`: one per database with the extension and work to do. It
//!   runs the duties of `duties` (each a SQL function) on their cadences in
//!   short transactions.
//! - `hooks`: DROP / RENAME DATABASE (and CREATE DATABASE ... TEMPLATE) stop
//!   the database's worker first, since they need it gone.
//! - `wake`: a committing producer wakes its database's worker; a committing
//!   start() launches it.
//!
//! CREATE EXTENSION calls pgque.start(), which asks the launcher for a
//! worker when its transaction commits (wake::spawn_at_commit), so a new
//! database with pgque gets its worker at once, not a rescan later.
use pgrx::bgworkers::{BackgroundWorkerBuilder, BgWorkerStartTime};
use pgrx::prelude::*;

pub mod dbworker;
pub mod due;
pub mod duties;
pub mod hooks;
pub mod launcher;
pub mod pool;
pub mod wake;

/// Bit of the worker's argument (above the 32-bit database oid) that asks it
/// to wait for the extension to be installed.
pub const AWAIT_INSTALL: u64 = 1 << 32;
/// Bit of the worker's argument: started by the pool for a database
/// without a process that is due, not wanted (no install wait). It is a due
/// start (one pass of what is due, then it parks when idle) only when the
/// pool's entry was left by a worker that parked (shmem::Claim::Claimed);
/// the launcher's first look at a database gets a worker that stays.
pub const DUE_START: u64 = 1 << 33;

/// Why a database worker is started.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// A producer committed, start() ran (also in CREATE EXTENSION), or the
    /// database needs its worker back: the worker waits a few seconds for
    /// the extension to become visible (start()'s transaction may have
    /// created it).
    Wanted,
    /// A duty came due in a database without a process (pool.rs), or the
    /// launcher looks at a database it does not know yet (after a server
    /// start or a crash, every database): no install wait; a database
    /// without the extension is left alone for a while.
    Due,
}

/// Registers the launcher and the utility hook; called from `_PG_init` while
/// shared_preload_libraries is being processed.
pub fn init() {
    launcher::register();
    hooks::install();
}

/// Starts a worker for `db_oid` (a dynamic background worker). It is a no-op
/// for a database that already has one: the newcomer sees the slot taken and
/// leaves. A worker that is wanted waits a few seconds for the extension
/// to appear; one started for a due duty, in a database lacking the
/// extension, leaves at once.
/// Returns false when PostgreSQL has no free worker slot (max_worker_processes).
pub fn spawn_db_worker(db_oid: pg_sys::Oid, how: Start) -> bool {
    let name = format!("pgque worker {}", db_oid.to_u32());
    let arg = db_oid.to_u32() as u64
        | match how {
            Start::Wanted => AWAIT_INSTALL,
            Start::Due => DUE_START,
        };
    BackgroundWorkerBuilder::new(&name)
        .set_type("pgque worker")
        .set_library("pgque")
        .set_function("pgque_db_worker_main")
        .set_argument(Some(pg_sys::Datum::from(arg)))
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(crate::gucs::worker_restart()))
        .load_dynamic()
        .is_ok()
}
