//! Starting a database worker: the dynamic background worker and the bits of
//! its argument that say why it was started.
use pgrx::bgworkers::{BackgroundWorkerBuilder, BgWorkerStartTime};
use pgrx::prelude::*;

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
