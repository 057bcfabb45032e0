//! Waking this database's worker, and the backends waiting inside the server
//! (src/waiters.rs), when a transaction that produced work commits.
use crate::shmem;
use crate::waiters::{self, Key};
use pgrx::pg_sys;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// Queues kept per transaction for the waiters' wake-ups; a transaction
/// touching more wakes every waiter of their kind (one look each).
const QUEUES_KEPT: usize = 16;

/// The queues the current transaction touched, for one kind of wake-up.
#[derive(Default)]
struct Touched {
    ids: Vec<i32>,
    overflow: bool,
}

impl Touched {
    fn add(&mut self, id: i32) {
        if !self.overflow && !self.ids.contains(&id) {
            if self.ids.len() == QUEUES_KEPT {
                self.overflow = true;
            } else {
                self.ids.push(id);
            }
        }
    }
}

thread_local! {
    /// Event queues this transaction sent to: a waiter on one asks for a tick now.
    static SENT: RefCell<Touched> = RefCell::new(Touched::default());
    /// Event queues this transaction ticked: their waiters look again.
    static TICKED: RefCell<Touched> = RefCell::new(Touched::default());
    /// Job queues (name keys) this transaction made work in: their waiting
    /// dispatchers look again (overflow: every job waiter).
    static JOBS: RefCell<Touched> = RefCell::new(Touched::default());
}

/// This backend asked for a wake-up in the current transaction.
static PENDING: AtomicBool = AtomicBool::new(false);
/// This backend's start() asked for a worker in the current transaction.
static SPAWN_PENDING: AtomicBool = AtomicBool::new(false);
/// This backend changed when a duty is due (a lease, a retry) in the current transaction.
static RECHECK_PENDING: AtomicBool = AtomicBool::new(false);
/// This backend claimed jobs in the current transaction.
static BUSY_PENDING: AtomicBool = AtomicBool::new(false);
/// The earliest lease this transaction's dispatches handed out (TimestampTz; 0: none).
static LEASE_DUE: AtomicI64 = AtomicI64::new(0);
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

/// at_commit for a send into event queue `queue_id`: when the transaction
/// commits and a consumer waits on that queue, the worker ticks at once.
pub fn sent_at_commit(queue_id: i32) {
    at_commit();
    if shmem::available() {
        SENT.with(|t| t.borrow_mut().add(queue_id));
    }
}

/// Wakes the waiters of event queue `queue_id` when the current transaction
/// (which ticked it) commits.
pub fn ticked_at_commit(queue_id: i32) {
    if !shmem::available() {
        return;
    }
    register();
    TICKED.with(|t| t.borrow_mut().add(queue_id));
}

/// Wakes the dispatchers waiting on job queue `queue` when the current
/// transaction commits (it enqueued ready jobs there). The worker is not
/// woken: ready jobs need no duty.
pub fn jobs_at_commit(queue: &str) {
    if !shmem::available() {
        return;
    }
    register();
    if let Key::Jobs(k) = waiters::job_queue_key(queue) {
        JOBS.with(|t| t.borrow_mut().add(k));
    }
}

/// Wakes every waiting dispatcher of this database when the current
/// transaction commits: it made jobs ready in queues it does not name one
/// by one (the worker's promotions and lease rescues, a flow's children).
pub fn all_jobs_at_commit() {
    if !shmem::available() {
        return;
    }
    register();
    JOBS.with(|t| t.borrow_mut().overflow = true);
}

/// Asks this database's worker for a tick now (a consumer starts to wait on
/// a queue with events no tick covers yet): not after the coalescing window.
pub fn demand_tick_now() {
    if !shmem::available() {
        return;
    }
    match shmem::demand_tick(my_db()) {
        shmem::Wake::Signal(pid) => set_latch_of(pid),
        shmem::Wake::Pending => {}
        shmem::Wake::NoWorker => want_worker(my_db()),
    }
}

/// After a commit: wakes the waiters of what the transaction touched, and
/// asks the worker for a tick when a consumer waits on a queue sent to.
/// (Runs at every commit of a backend that registered the callback: three
/// empty thread-locals when nothing was touched.)
fn wake_waiters() {
    let sent = SENT.with(|t| std::mem::take(&mut *t.borrow_mut()));
    let ticked = TICKED.with(|t| std::mem::take(&mut *t.borrow_mut()));
    let jobs = JOBS.with(|t| std::mem::take(&mut *t.borrow_mut()));
    if jobs.overflow {
        waiters::wake_all_jobs();
    } else {
        for k in &jobs.ids {
            waiters::wake(Key::Jobs(*k));
        }
    }
    for q in &ticked.ids {
        waiters::wake(Key::Events(*q));
    }
    if ticked.overflow {
        waiters::wake_all_events();
    }
    let demanded = sent.overflow && waiters::waiting(my_db()).1 > 0
        || sent
            .ids
            .iter()
            .any(|q| waiters::has_waiters(Key::Events(*q)));
    if demanded {
        demand_tick_now();
    }
}

fn forget_touched() {
    SENT.with(|t| *t.borrow_mut() = Touched::default());
    TICKED.with(|t| *t.borrow_mut() = Touched::default());
    JOBS.with(|t| *t.borrow_mut() = Touched::default());
}

fn my_db() -> u32 {
    unsafe { pg_sys::MyDatabaseId }.to_u32()
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

/// Tells an idle worker of this database, when the current transaction
/// commits, that a job lease expires at `at` (TimestampTz): it wakes then to
/// rescue it. Only a lease earlier than every one it knows of wakes it now,
/// so a stream of dispatches costs the idle worker nothing per dispatch (it
/// used to re-read pgque.duty_due(), ~4 ms of CPU, after each).
pub fn lease_due_at_commit(at: i64) {
    if !shmem::available() {
        return;
    }
    register();
    let cur = LEASE_DUE.load(Ordering::Relaxed);
    if cur == 0 || at < cur {
        LEASE_DUE.store(at, Ordering::Relaxed);
    }
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
            wake_waiters();
            if BUSY_PENDING.swap(false, Ordering::Relaxed) {
                let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
                shmem::note_busy(db, unsafe { pg_sys::GetCurrentTimestamp() });
            }
            let lease = LEASE_DUE.swap(0, Ordering::Relaxed);
            if lease != 0 {
                let db = my_db();
                if let Some(pid) = shmem::note_lease_due(db, lease) {
                    set_latch_of(pid);
                } else if !shmem::serving(db) {
                    // a parked database: its new due time needs a worker to read it
                    want_worker(db);
                }
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
            LEASE_DUE.store(0, Ordering::Relaxed);
            forget_touched();
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touched_keeps_each_queue_once_then_overflows() {
        let mut t = Touched::default();
        t.add(1);
        t.add(1);
        assert_eq!(t.ids, vec![1]);
        for q in 2..=QUEUES_KEPT as i32 {
            t.add(q);
        }
        assert_eq!(t.ids.len(), QUEUES_KEPT);
        assert!(!t.overflow);
        t.add(1000);
        assert!(
            t.overflow,
            "one queue past the kept ones wakes every waiter"
        );
        assert_eq!(t.ids.len(), QUEUES_KEPT);
    }
}
