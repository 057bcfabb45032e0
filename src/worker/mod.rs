//! The background workers.
//!
//! - `launcher`: one static worker per server. At start, and every
//!   `pgque.launcher_rescan_interval`, it starts a database worker for each
//!   connectable database whose worker is missing; a database without the
//!   extension sees that worker look and leave at once.
//! - `dbworker`: one per database with the extension. It runs the duties of
//!   `duties` (each a SQL function) on their cadences in short transactions.
//! - `hooks`: DROP / RENAME DATABASE (and CREATE DATABASE ... TEMPLATE) stop
//!   the database's worker first, since they need it gone.
//! - `wake`: a committing producer wakes its database's worker; a committing
//!   start() launches it.
//!
//! CREATE EXTENSION calls pgque.start(), which starts the worker when its
//! transaction commits (wake::spawn_at_commit), so a new database with pgque
//! gets its worker within a second, not a rescan later.
use pgrx::bgworkers::{BackgroundWorkerBuilder, BgWorkerStartTime};
use pgrx::prelude::*;

pub mod dbworker;
pub mod due;
pub mod duties;
pub mod hooks;
pub mod launcher;
pub mod wake;

/// Bit of the worker's argument (above the 32-bit database oid) that asks it
/// to wait for the extension to be installed.
pub const AWAIT_INSTALL: u64 = 1 << 32;

/// Registers the launcher and the utility hook; called from `_PG_init` while
/// shared_preload_libraries is being processed.
pub fn init() {
    launcher::register();
    hooks::install();
}

/// Starts a worker for `db_oid` (a dynamic background worker). It is a no-op
/// for a database that already has one: the newcomer sees the slot taken and
/// leaves. With `await_install` (start()) the worker waits a few seconds for
/// the extension to appear; without, a database lacking the extension sees
/// it leave at once.
/// Returns false when PostgreSQL has no free worker slot (max_worker_processes).
pub fn spawn_db_worker(db_oid: pg_sys::Oid, await_install: bool) -> bool {
    let name = format!("pgque worker {}", db_oid.to_u32());
    let arg = db_oid.to_u32() as u64 | if await_install { AWAIT_INSTALL } else { 0 };
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
