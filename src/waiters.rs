//! Backends that wait inside the server for work: the waiting forms of
//! receive, next_batch and dispatch (DESIGN.md 26, docs/waits.md).
//!
//! A waiter registers the queues it waits on in a shared-memory table, then
//! sleeps on its own process latch. Whoever makes the work visible sets the
//! latches of that queue's waiters right after its commit (wake.rs): the
//! ticker after a tick of an event queue, a producer after an enqueue into a
//! job queue. A producer's commit into an event queue that has waiters asks
//! the worker for a tick at once (shmem::demand_tick) instead of after the
//! coalescing window: nobody waits, and batches grow with the load; somebody
//! waits, and a tick follows each commit within the worker's reaction time.
//!
//! What a sleeping statement holds: its statement's snapshot, so its xmin
//! holds back vacuum's horizon and the rotation of pgque's tables for as long
//! as it sleeps. That is why every wait is capped by pgque.max_wait (10 s by
//! default). It holds no lock and no transaction id: a call whose transaction
//! has an id returns at once, as one in REPEATABLE READ or SERIALIZABLE
//! (whose snapshot could never show new work).
use crate::gucs;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Backends that can wait at the same time; one more waits by polling.
pub const MAX_WAITERS: usize = 1024;
/// Queues one waiter can name; a dispatch over more waits on every job
/// queue of its database.
pub const MAX_KEYS: usize = 8;
/// The longest a waiter sleeps between two looks at its client connection.
const CLIENT_CHECK: Duration = Duration::from_secs(1);
/// How often a waiter that found no room in the table (or runs without
/// shared_preload_libraries) looks again.
const POLL: Duration = Duration::from_millis(10);

/// What a waiter waits for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Key {
    /// A tick of the event queue with this queue_id.
    Events(i32),
    /// Work in the job queue of this name hash (job_queue_key): an enqueue,
    /// a job made ready again.
    Jobs(i32),
    /// Any job queue of the database (a dispatch over more than MAX_KEYS).
    AnyJobs,
}

/// The key of job queue `name`: a hash of the name (dispatch and enqueue
/// both have it; a collision only wakes a waiter that finds nothing).
pub fn job_queue_key(name: &str) -> Key {
    // FNV-1a, 32 bits
    let h = name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    });
    Key::Jobs(h as i32)
}

impl Key {
    fn code(self) -> u64 {
        match self {
            Key::Events(q) => (1 << 32) | q as u32 as u64,
            Key::Jobs(q) => (2 << 32) | q as u32 as u64,
            Key::AnyJobs => 3 << 32,
        }
    }

    fn matches(self, stored: u64) -> bool {
        stored == self.code() || (matches!(self, Key::Jobs(_)) && stored == Key::AnyJobs.code())
    }
}

#[derive(Copy, Clone)]
struct Slot {
    /// 0: free.
    pid: i32,
    db: u32,
    /// The waiter's process latch (in shared memory, as PostgreSQL's own
    /// walreceiver keeps one): a wake-up costs no ProcArray lookup. A latch
    /// of a backend gone is at worst a spurious wake-up of its successor.
    latch: usize,
    nkeys: u8,
    keys: [u64; MAX_KEYS],
}

impl Slot {
    const EMPTY: Slot = Slot {
        pid: 0,
        db: 0,
        latch: 0,
        nkeys: 0,
        keys: [0; MAX_KEYS],
    };
}

#[derive(Copy, Clone)]
pub struct Registry {
    slots: [Slot; MAX_WAITERS],
    /// One past the highest slot ever used: wake-ups scan no further.
    high: usize,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            slots: [Slot::EMPTY; MAX_WAITERS],
            high: 0,
        }
    }
}

unsafe impl PGRXSharedMemory for Registry {}

static REGISTRY: PgLwLock<Registry> = unsafe { PgLwLock::new(c"pgque_waiters") };
static AVAILABLE: AtomicBool = AtomicBool::new(false);
static EXIT_HOOK: AtomicBool = AtomicBool::new(false);

/// Requests the shared memory; only valid while shared_preload_libraries loads.
pub fn init() {
    pg_shmem_init!(REGISTRY);
    AVAILABLE.store(true, Ordering::Relaxed);
}

fn available() -> bool {
    AVAILABLE.load(Ordering::Relaxed)
}

fn my_db() -> u32 {
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// Sets the latch at `latch` (a PGPROC's procLatch in shared memory).
fn set_latch(latch: usize) {
    if latch != 0 {
        unsafe { pg_sys::SetLatch(latch as *mut pg_sys::Latch) };
    }
}

/// Wakes every backend of this database waiting on `key`; returns how many.
/// Called after the commit that made the work visible (wake.rs).
pub fn wake(key: Key) -> usize {
    wake_where(|k| key.matches(k))
}

/// Wakes every waiter of this database on an event queue (a transaction
/// ticked more queues than wake.rs keeps).
pub fn wake_all_events() -> usize {
    wake_where(|k| k >> 32 == 1)
}

/// Wakes every waiter of this database on a job queue.
pub fn wake_all_jobs() -> usize {
    wake_where(|k| k >> 32 >= 2)
}

fn wake_where(hit: impl Fn(u64) -> bool) -> usize {
    if !available() {
        return 0;
    }
    let db = my_db();
    // SetLatch outside the lock for the first 64; more waiters on one
    // queue are woken under it.
    let mut latches = [0usize; 64];
    let mut n = 0;
    let mut woken = 0;
    {
        let r = REGISTRY.share();
        for s in &r.slots[..r.high] {
            if s.pid != 0 && s.db == db && s.keys[..s.nkeys as usize].iter().any(|k| hit(*k)) {
                if n == latches.len() {
                    set_latch(s.latch);
                } else {
                    latches[n] = s.latch;
                    n += 1;
                }
                woken += 1;
            }
        }
    }
    latches[..n].iter().for_each(|l| set_latch(*l));
    woken
}

/// Whether a backend of this database waits on `key`.
pub fn has_waiters(key: Key) -> bool {
    if !available() {
        return false;
    }
    let db = my_db();
    let r = REGISTRY.share();
    r.slots[..r.high].iter().any(|s| {
        s.pid != 0 && s.db == db && s.keys[..s.nkeys as usize].iter().any(|k| key.matches(*k))
    })
}

/// Backends of database `db` waiting now, and of them those on event queues.
pub fn waiting(db: u32) -> (u32, u32) {
    if !available() {
        return (0, 0);
    }
    let r = REGISTRY.share();
    let mut all = 0;
    let mut events = 0;
    for s in r.slots[..r.high]
        .iter()
        .filter(|s| s.pid != 0 && s.db == db)
    {
        all += 1;
        if s.keys[..s.nkeys as usize].iter().any(|k| k >> 32 == 1) {
            events += 1;
        }
    }
    (all, events)
}

/// Removes every slot of this process (a FATAL exit skips the guard's Drop).
unsafe extern "C-unwind" fn forget_me(_code: i32, _arg: pg_sys::Datum) {
    let pid = unsafe { pg_sys::MyProcPid };
    let mut r = REGISTRY.exclusive();
    let high = r.high;
    r.slots[..high]
        .iter_mut()
        .filter(|s| s.pid == pid)
        .for_each(|s| *s = Slot::EMPTY);
}

/// A registered waiter; its slot is freed on drop (also when an ERROR
/// unwinds through the wait).
struct Registered(usize);

impl Drop for Registered {
    fn drop(&mut self) {
        let mut r = REGISTRY.exclusive();
        r.slots[self.0] = Slot::EMPTY;
        while r.high > 0 && r.slots[r.high - 1].pid == 0 {
            r.high -= 1;
        }
    }
}

/// Takes a slot for this backend waiting on `keys`; None when the table is
/// full (the caller polls instead).
fn register(keys: &[Key]) -> Option<Registered> {
    if !available() {
        return None;
    }
    if !EXIT_HOOK.swap(true, Ordering::Relaxed) {
        unsafe { pg_sys::before_shmem_exit(Some(forget_me), pg_sys::Datum::from(0usize)) };
    }
    let mut codes = [0u64; MAX_KEYS];
    let nkeys = if keys.len() > MAX_KEYS {
        // more queues than a slot names: every job queue of the database
        codes[0] = Key::AnyJobs.code();
        1
    } else {
        keys.iter()
            .enumerate()
            .for_each(|(i, k)| codes[i] = k.code());
        keys.len()
    };
    let slot = Slot {
        pid: unsafe { pg_sys::MyProcPid },
        db: my_db(),
        latch: unsafe { &raw mut (*pg_sys::MyProc).procLatch } as usize,
        nkeys: nkeys as u8,
        keys: codes,
    };
    let mut r = REGISTRY.exclusive();
    let i = r.slots.iter().position(|s| s.pid == 0)?;
    r.slots[i] = slot;
    r.high = r.high.max(i + 1);
    Some(Registered(i))
}

/// The `wait` argument of the waiting forms, capped by pgque.max_wait:
/// 22004 NULL, 22023 negative or infinite.
pub fn wait_arg(wait: Option<pgrx::datum::Interval>) -> Duration {
    let iv = crate::error::required(wait, "wait");
    crate::datum::check_nonnegative_interval(&iv, "wait");
    let us = (crate::datum::interval_ms(&iv) * 1000.0).min(u64::MAX as f64) as u64;
    Duration::from_micros(us).min(gucs::max_wait())
}

/// Whether this transaction may sleep: no transaction id (a sleeping writer
/// would hold its locks and its xid), and a snapshot per statement (READ
/// COMMITTED: in REPEATABLE READ or SERIALIZABLE nothing new can ever show).
pub fn may_sleep() -> bool {
    unsafe {
        pg_sys::GetTopTransactionIdIfAny() == pg_sys::InvalidTransactionId
            && pg_sys::XactIsoLevel < pg_sys::XACT_REPEATABLE_READ as i32
    }
}

/// Runs `f` with a fresh snapshot as the active one: the read-only SPI
/// statements of the engine use the active snapshot, and the calling
/// statement's cannot see what committed while this backend slept.
fn with_fresh_snapshot<R>(f: impl FnOnce() -> R) -> R {
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    let r = f();
    unsafe { pg_sys::PopActiveSnapshot() };
    r
}

unsafe extern "C" {
    /// libpq/pqcomm.c (PostgreSQL 14+), which pgrx does not bind: false
    /// when the client's socket is closed. It never raises.
    fn pq_check_connection() -> bool;
}

/// Sleeps on this backend's latch for at most `d`, then handles interrupts:
/// a cancel, statement_timeout, a terminate end the call here with their
/// usual errors, postmaster death ends the process, and a client that went
/// away ends its backend as client_connection_check_interval would.
fn sleep(d: Duration) {
    let ms = d.as_millis().clamp(1, CLIENT_CHECK.as_millis()) as std::ffi::c_long;
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            ms,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
        if !pg_sys::MyProcPort.is_null() && !pq_check_connection() {
            pg_sys::ClientConnectionLost = 1;
            pg_sys::InterruptPending = 1;
        }
    }
    pg_sys::check_for_interrupts!();
}

/// One look of a waiting call: what it returns, or the queues to wait on
/// (and, with `Retry`, the longest to sleep before looking again).
pub enum Look<T> {
    Found(T),
    Wait(Vec<Key>),
    Retry(Vec<Key>, Duration),
}

/// The waiting loop of every waiting form: `look` runs once at once, then
/// again (with a fresh snapshot) after each wake-up, until it finds
/// something, the wait (already capped) is over, or its transaction took an
/// id (`look` wrote: an empty batch finished, say); returns its last Found,
/// or None. `on_wait` runs once, when the first look found nothing and the
/// backend is registered: the event forms ask for a tick there.
pub fn wait_for<T>(
    wait: Duration,
    mut look: impl FnMut() -> Look<T>,
    on_wait: impl FnOnce(&[Key]),
) -> Option<T> {
    let deadline = Instant::now() + wait;
    let mut first = look();
    let mut guard: Option<Registered> = None;
    let mut polling = false;
    let mut on_wait = Some(on_wait);
    loop {
        let (keys, retry) = match first {
            Look::Found(v) => return Some(v),
            Look::Wait(keys) => (keys, None),
            Look::Retry(keys, d) => (keys, Some(d)),
        };
        let now = Instant::now();
        if now >= deadline || !may_sleep() {
            return None;
        }
        if guard.is_none() && !polling {
            guard = register(&keys);
            polling = guard.is_none();
            if let Some(f) = on_wait.take() {
                f(&keys);
            }
            if guard.is_some() {
                // Look again before sleeping: what committed between the
                // first look and the registration woke nobody.
                first = with_fresh_snapshot(&mut look);
                continue;
            }
        }
        let mut left = deadline - now;
        if polling {
            left = left.min(POLL);
        }
        if let Some(d) = retry {
            left = left.min(d);
        }
        sleep(left);
        first = with_fresh_snapshot(&mut look);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_each_kind_are_distinct() {
        assert_ne!(Key::Events(7).code(), Key::Jobs(7).code());
        assert_ne!(Key::Jobs(0).code(), Key::AnyJobs.code());
        assert_eq!(Key::Events(-1).code() >> 32, 1);
    }

    #[test]
    fn a_job_wake_reaches_a_waiter_on_every_job_queue_but_not_an_event_one() {
        let any = Key::AnyJobs.code();
        assert!(Key::Jobs(42).matches(any));
        assert!(!Key::Events(42).matches(any));
        assert!(Key::Jobs(42).matches(Key::Jobs(42).code()));
        assert!(!Key::Jobs(42).matches(Key::Jobs(43).code()));
        assert!(!Key::Events(42).matches(Key::Jobs(42).code()));
    }

    #[test]
    fn job_queue_keys_follow_the_name() {
        assert_eq!(job_queue_key("orders"), job_queue_key("orders"));
        assert_ne!(job_queue_key("orders"), job_queue_key("order"));
        // FNV-1a of the empty string is its offset basis
        assert_eq!(job_queue_key(""), Key::Jobs(0x811c_9dc5u32 as i32));
    }
}
