//! Waking this database's worker when a transaction that produced work commits.
use crate::shmem;
use pgrx::pg_sys;
use std::sync::atomic::{AtomicBool, Ordering};

/// This backend asked for a wake-up in the current transaction.
static PENDING: AtomicBool = AtomicBool::new(false);
/// This backend's start() asked for a worker in the current transaction.
static SPAWN_PENDING: AtomicBool = AtomicBool::new(false);
/// This backend changed when a duty is due (a lease, a retry) in the current transaction.
static RECHECK_PENDING: AtomicBool = AtomicBool::new(false);
/// This backend claimed jobs in the current transaction.
static BUSY_PENDING: AtomicBool = AtomicBool::new(false);
/// The transaction callback is registered once per backend.
static REGISTERED: AtomicBool = AtomicBool::new(false);

fn register() {
    if !REGISTERED.swap(true, Ordering::Relaxed) {
        unsafe { pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut()) };
    }
}

/// Asks that this database's pgque worker be woken when the current
/// transaction commits (not before: it must see the committed rows). Cheap to
/// call many times per transaction; a no-op without shared_preload_libraries.
pub fn at_commit() {
    if !shmem::available() {
        return;
    }
    register();
    PENDING.store(true, Ordering::Relaxed);
}

/// Asks for this database's worker when the current transaction commits
/// (start(), also run by CREATE EXTENSION): launched before the commit, the
/// worker could read the setting start() switched on as still off, take it
/// as a verdict and leave, marking the database unwanted (seen under load in
/// the upgrade test). Nothing happens if the transaction aborts.
pub fn spawn_at_commit() {
    if !shmem::available() {
        return;
    }
    register();
    SPAWN_PENDING.store(true, Ordering::Relaxed);
}

/// Asks that an idle worker of this database re-read pgque.duty_due() when
/// the current transaction commits: for changes that make a duty due sooner
/// without being a producer's send (dispatch's leases, event retries). An
/// active worker is left alone (it runs those duties on its cadences).
pub fn recheck_at_commit() {
    if !shmem::available() {
        return;
    }
    register();
    RECHECK_PENDING.store(true, Ordering::Relaxed);
}

/// Notes, when the current transaction commits, that this database is busy
/// (a consumer claimed jobs): its worker keeps its process against
/// databases with nothing to do (dbworker), though no producer's commit
/// wakes it. A parked database is left to recheck_at_commit's request.
pub fn busy_at_commit() {
    if !shmem::available() {
        return;
    }
    register();
    BUSY_PENDING.store(true, Ordering::Relaxed);
}

/// Wakes the worker of the current database now: sets its wake flag and its
/// latch; a database without a worker process asks the pool for one.
pub fn wake_now() {
    if !shmem::available() {
        return;
    }
    let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
    match shmem::set_wake(db) {
        shmem::Wake::Signal(pid) => set_latch_of(pid),
        shmem::Wake::Pending => {}
        shmem::Wake::NoWorker => want_worker(db),
    }
}

/// Asks the launcher for a worker for `db` (which has no process).
fn want_worker(db: u32) {
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    if let Some(launcher) = shmem::want_worker(db, now) {
        set_latch_of(launcher);
    }
}

/// Sets the process latch of backend `pid` (a pgque worker of this server).
pub fn set_latch_of(pid: i32) {
    unsafe {
        let proc_ = pg_sys::BackendPidGetProc(pid);
        if !proc_.is_null() {
            pg_sys::SetLatch(&raw mut (*proc_).procLatch);
        }
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_xact_event(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_COMMIT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT => {
            if SPAWN_PENDING.swap(false, Ordering::Relaxed) {
                let db = unsafe { pg_sys::MyDatabaseId };
                shmem::unmark_unwanted(db.to_u32());
                // the launcher starts it, within the pool's bound
                if !shmem::serving(db.to_u32()) {
                    want_worker(db.to_u32());
                }
            }
            if PENDING.swap(false, Ordering::Relaxed) {
                wake_now();
            }
            if BUSY_PENDING.swap(false, Ordering::Relaxed) {
                let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
                shmem::note_busy(db, unsafe { pg_sys::GetCurrentTimestamp() });
            }
            if RECHECK_PENDING.swap(false, Ordering::Relaxed) {
                let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
                if let Some(pid) = shmem::request_recheck(db) {
                    set_latch_of(pid);
                } else if !shmem::serving(db) {
                    // a parked database: its new due time needs a worker to read it
                    want_worker(db);
                }
            }
        }
        pg_sys::XactEvent::XACT_EVENT_ABORT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT => {
            PENDING.store(false, Ordering::Relaxed);
            SPAWN_PENDING.store(false, Ordering::Relaxed);
            RECHECK_PENDING.store(false, Ordering::Relaxed);
            BUSY_PENDING.store(false, Ordering::Relaxed);
        }
        _ => {}
    }
}
