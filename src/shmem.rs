//! Shared memory of the background workers: which database has a worker,
//! its pid, stop requests, wake-ups, each duty's counters for status(), and
//! the worker pool's demand (crate::pool): databases without a process that
//! want one now (a producer committed) or at a known time (their next duty).
//!
//! One LWLock guards the whole table. It is taken briefly: by a worker when it
//! starts, stops or records a duty run, by status(), and by a committing
//! producer that wakes its database's worker.
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock};
use std::sync::atomic::{AtomicBool, Ordering};

/// Databases that can have a worker at the same time.
pub const MAX_DBS: usize = 64;
/// Duties per worker (see worker::duties).
pub const MAX_DUTIES: usize = 8;
/// Bytes of the last error message kept per duty.
pub const ERR_LEN: usize = 192;
/// Recently dropped databases, remembered so a worker restarted by the
/// postmaster does not try to connect to a database that is gone.
const DROPPED: usize = 16;
/// Databases a worker found without the extension, or switched off by
/// stop(), with when: the launcher leaves each alone for UNWANTED_TTL_US
/// (start(), which CREATE EXTENSION runs, starts a worker itself and clears
/// the mark). Without these marks the launcher started a worker in every
/// such database on every scan, and with more of them than free worker
/// slots it stopped at the first refusal: the databases after them in
/// pg_database never got a worker after a restart. A role with CREATEDB
/// makes databases without pgque at will: each one past the marks kept is
/// probed again on every scan (a worker process started and gone), taking
/// slots from the databases that have pgque. So the marks are many (32 KiB
/// of shared memory), and a new one takes a free or lapsed place, else the
/// oldest mark's: only past UNWANTED live marks is any database probed
/// again before its TTL. A cluster with more databases without pgque than
/// that names its pgque databases in pgque.databases (docs/operations.md).
const UNWANTED: usize = 2048;
/// How long the launcher leaves an unwanted database alone (10 minutes).
pub const UNWANTED_TTL_US: i64 = 600 * 1_000_000;
/// Databases the pool can keep track of without a process (crate::pool).
pub const DEMAND: usize = 1024;

#[derive(Copy, Clone)]
pub struct DutyStat {
    pub runs: u64,
    pub failures: u64,
    pub consecutive_failures: u32,
    /// TimestampTz (microseconds since 2000-01-01) of the last start, 0 = never.
    pub last_run: i64,
    pub last_ok: i64,
    pub last_failure: i64,
    /// Duration of the last run in microseconds.
    pub last_duration_us: u64,
    pub err_len: u16,
    pub err: [u8; ERR_LEN],
}

impl DutyStat {
    const EMPTY: DutyStat = DutyStat {
        runs: 0,
        failures: 0,
        consecutive_failures: 0,
        last_run: 0,
        last_ok: 0,
        last_failure: 0,
        last_duration_us: 0,
        err_len: 0,
        err: [0; ERR_LEN],
    };

    pub fn last_error(&self) -> Option<String> {
        (self.err_len > 0)
            .then(|| String::from_utf8_lossy(&self.err[..self.err_len as usize]).into_owned())
    }
}

#[derive(Copy, Clone)]
pub struct DbSlot {
    /// 0 = free.
    pub db_oid: u32,
    pub pid: i32,
    pub started_at: i64,
    /// Set by DROP/RENAME DATABASE handling and stop(): exit cleanly (status 0).
    pub stop_requested: bool,
    /// Set by a committing producer; the worker ticks at once when it sees it.
    pub wake_pending: bool,
    /// TimestampTz since which the worker is idle (sleeping until its next
    /// due duty, worker::dbworker); 0 while it runs on its active cadences.
    pub idle_since: i64,
    /// Set (while idle) by a commit that changed when a duty is due without
    /// being a producer (a dispatch's new lease, a retry): re-read duty_due().
    pub recheck: bool,
    /// The worker parks (park_worker): it is leaving; commits ask the
    /// launcher for a new worker, which may take the slot over.
    pub parking: bool,
    /// TimestampTz of the last commit that claimed jobs here (note_busy):
    /// a database whose consumers work is busy even while no producer's
    /// commit wakes the worker, and keeps its process (dbworker).
    pub busy_at: i64,
    /// Set by a producer's commit into an event queue a consumer waits on
    /// (src/waiters.rs): tick now, not after the coalescing window.
    pub tick_demand: bool,
    /// TimestampTz of the earliest job lease a dispatch handed out while
    /// the worker was idle and that it has not yet rescued (0: none): the
    /// idle worker wakes then for job_maint, without re-reading duty_due()
    /// after every dispatch.
    pub lease_due: i64,
    pub duties: [DutyStat; MAX_DUTIES],
}

impl DbSlot {
    const EMPTY: DbSlot = DbSlot {
        db_oid: 0,
        pid: 0,
        started_at: 0,
        stop_requested: false,
        wake_pending: false,
        idle_since: 0,
        recheck: false,
        parking: false,
        busy_at: 0,
        tick_demand: false,
        lease_due: 0,
        duties: [DutyStat::EMPTY; MAX_DUTIES],
    };
}

/// The pool's shortage as the launcher last saw it (crate::pool): for
/// status(), metrics() and the launcher's WARNING.
#[derive(Copy, Clone, Default, Debug, PartialEq, Eq)]
pub struct PoolShort {
    /// TimestampTz since which databases have waited for a worker process
    /// the pool could not start (PostgreSQL had no free slot, or
    /// pgque.max_workers were running); 0: not short.
    pub since: i64,
    /// Databases waiting at the launcher's last look.
    pub waiting: u32,
    /// Of them, those with work now (a producer's commit, a turn).
    pub wanted: u32,
}

#[derive(Copy, Clone)]
pub struct Workers {
    pub launcher_pid: i32,
    pub slots: [DbSlot; MAX_DBS],
    /// The pool's demand table: one entry per database without a process.
    pub demand: [crate::pool::Demand; DEMAND],
    /// TimestampTz since which a database has waited for a worker the pool
    /// could not start (0: none waits); workers give their process back then.
    pub pool_waiting_since: i64,
    /// As pool_waiting_since, for databases with work now (wanted): only
    /// these make a busy worker give its process after its turn.
    pub pool_wanted_since: i64,
    pub pool_short: PoolShort,
    dropped: [u32; DROPPED],
    dropped_next: usize,
    unwanted: [(u32, i64); UNWANTED],
}

impl Default for Workers {
    fn default() -> Self {
        Workers {
            launcher_pid: 0,
            slots: [DbSlot::EMPTY; MAX_DBS],
            demand: [crate::pool::Demand::EMPTY; DEMAND],
            pool_waiting_since: 0,
            pool_wanted_since: 0,
            pool_short: PoolShort {
                since: 0,
                waiting: 0,
                wanted: 0,
            },
            dropped: [0; DROPPED],
            dropped_next: 0,
            unwanted: [(0, 0); UNWANTED],
        }
    }
}

unsafe impl PGRXSharedMemory for Workers {}

pub static WORKERS: PgLwLock<Workers> = unsafe { PgLwLock::new(c"pgque_workers") };

/// True in processes of a server that preloaded pgque (set in the postmaster
/// during `_PG_init`, inherited by every forked backend).
static AVAILABLE: AtomicBool = AtomicBool::new(false);

/// Requests the shared memory; only valid while shared_preload_libraries loads.
pub fn init() {
    pg_shmem_init!(WORKERS);
    AVAILABLE.store(true, Ordering::Relaxed);
}

/// Whether pgque was preloaded, so the workers and this table exist.
pub fn available() -> bool {
    AVAILABLE.load(Ordering::Relaxed)
}

/// Outcome of a worker's attempt to take the slot of its database.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// The slot's index, and whether the worker is a due start: the pool's
    /// entry it took was left by a worker that parked (pool::Demand::due_only).
    Claimed(usize, bool),
    /// Another live worker serves this database.
    Busy,
    /// Every slot is in use.
    Full,
}

fn pid_alive(pid: i32) -> bool {
    // Signal 0 checks existence; a worker that crashed leaves no slot behind
    // (shared memory is reset on a crash restart), but a pid can be stale if the
    // slot holder exited without its exit callback (it always runs on proc_exit).
    pid > 0 && unsafe { libc_kill(pid, 0) } == 0
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

pub fn send_signal(pid: i32, sig: i32) {
    if pid > 0 {
        unsafe {
            libc_kill(pid, sig);
        }
    }
}

/// Takes the slot for `db_oid` for the calling process.
pub fn claim(db_oid: u32, pid: i32, now: i64) -> Claim {
    let mut w = WORKERS.exclusive();
    if let Some(s) = w.slots.iter().find(|s| s.db_oid == db_oid) {
        if s.pid != pid && !s.parking && pid_alive(s.pid) {
            return Claim::Busy;
        }
    }
    // Its own slot (a parked one keeps the duty counters), else a free one,
    // else the one parked longest (its database has no process).
    let parked = w
        .slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.pid == 0 || !pid_alive(s.pid))
        .min_by_key(|(_, s)| s.started_at)
        .map(|(i, _)| i);
    let idx = match w.slots.iter().position(|s| s.db_oid == db_oid) {
        Some(i) => i,
        None => match w.slots.iter().position(|s| s.db_oid == 0).or(parked) {
            Some(i) => i,
            None => return Claim::Full,
        },
    };
    let due_only = crate::pool::forget(&mut w.demand, db_oid).is_some_and(|d| d.due_only());
    let keep = w.slots[idx].db_oid == db_oid;
    let duties = if keep {
        w.slots[idx].duties
    } else {
        [DutyStat::EMPTY; MAX_DUTIES]
    };
    w.slots[idx] = DbSlot {
        db_oid,
        pid,
        started_at: now,
        duties,
        ..DbSlot::EMPTY
    };
    Claim::Claimed(idx, due_only)
}

/// Frees the slot if `pid` still holds it (a restarted worker starts its
/// duty counters afresh). A worker that parked (park_worker) keeps the slot
/// marked parking, with its pid and the database's counters: the launcher
/// counts it against the pool's bound until the process is gone
/// (reap_parked), and the database's next worker takes the slot over.
/// Returns the launcher's pid then, to look again.
pub fn release(idx: usize, pid: i32) -> Option<i32> {
    let mut w = WORKERS.exclusive();
    if w.slots[idx].pid != pid {
        return None;
    }
    if w.slots[idx].parking {
        w.slots[idx].idle_since = 0;
        Some(w.launcher_pid)
    } else {
        w.slots[idx] = DbSlot::EMPTY;
        None
    }
}

/// For the launcher: marks the slots of parked workers whose process has
/// exited as free of a process (pid 0, counters kept). Returns whether a
/// parking worker is still exiting (the launcher looks again shortly).
pub fn reap_parked() -> bool {
    let mut w = WORKERS.exclusive();
    let mut exiting = false;
    for s in w.slots.iter_mut().filter(|s| s.parking && s.pid > 0) {
        if pid_alive(s.pid) {
            exiting = true;
        } else {
            s.pid = 0;
            s.parking = false;
        }
    }
    exiting
}

/// Records that `db_oid` wants a worker at TimestampTz `due_at` (the
/// launcher's first look at a database). False when the demand table is full.
pub fn want_at(db_oid: u32, due_at: i64) -> bool {
    let mut w = WORKERS.exclusive();
    crate::pool::put(&mut w.demand, db_oid, due_at, None)
}

/// A worker gives its process back to the pool (crate::pool): in one step
/// under the lock, its database's next need goes into the demand table (a
/// worker at `due_at`, or at once with `wanted`) and its slot is marked
/// parking, so a producer committing from then on asks the launcher for a
/// worker instead of signalling this one (release() frees the slot as the
/// process exits). Refused (false) when a wake-up, a recheck or a stop
/// request is pending and the worker is not `wanted` back anyway, or the
/// demand table is full: it keeps its process.
pub fn park_worker(idx: usize, pid: i32, due_at: i64, wanted: bool, now: i64) -> bool {
    let mut w = WORKERS.exclusive();
    let s = w.slots[idx];
    if s.pid != pid || s.stop_requested || (!wanted && (s.wake_pending || s.recheck)) {
        return false;
    }
    if !crate::pool::put(&mut w.demand, s.db_oid, due_at, wanted.then_some(now)) {
        return false;
    }
    if let Some(d) = w.demand.iter_mut().find(|d| d.db_oid == s.db_oid) {
        d.parked = true;
    }
    let slot = &mut w.slots[idx];
    slot.parking = true;
    slot.wake_pending = false;
    slot.recheck = false;
    true
}

/// Whether `db_oid` has a worker process that is not leaving.
pub fn serving(db_oid: u32) -> bool {
    WORKERS
        .share()
        .slots
        .iter()
        .any(|s| s.db_oid == db_oid && s.pid > 0 && !s.parking)
}

/// The pids of the workers that are idle (they park at once when the pool
/// waits for a process: the launcher sets their latches).
pub fn idle_worker_pids() -> Vec<i32> {
    WORKERS
        .share()
        .slots
        .iter()
        .filter(|s| s.pid > 0 && s.idle_since > 0)
        .map(|s| s.pid)
        .collect()
}

/// Asks for a worker for `db_oid` (which has none) now: a producer committed
/// there, or a commit made a duty due sooner. Returns the launcher's pid to
/// signal when this made the request (not when one was pending already).
/// The shared lock only, in the common case of a request already pending.
pub fn want_worker(db_oid: u32, now: i64) -> Option<i32> {
    {
        let w = WORKERS.share();
        if crate::pool::is_wanted(&w.demand, db_oid)
            || w.unwanted
                .iter()
                .any(|u| u.0 == db_oid && now - u.1 < UNWANTED_TTL_US)
        {
            return None;
        }
    }
    let mut w = WORKERS.exclusive();
    if crate::pool::is_wanted(&w.demand, db_oid) {
        return None;
    }
    crate::pool::put(&mut w.demand, db_oid, 0, Some(now));
    (w.launcher_pid > 0).then_some(w.launcher_pid)
}

/// Drops the pool's record of `db_oid` (dropped, or found to want no worker).
pub fn forget_demand(db_oid: u32) {
    let mut w = WORKERS.exclusive();
    let _ = crate::pool::forget(&mut w.demand, db_oid);
}

/// The pool's entry for `db_oid`, if it has no process (for status()).
pub fn demand_of(db_oid: u32) -> Option<crate::pool::Demand> {
    let w = WORKERS.share();
    w.demand.iter().find(|d| d.db_oid == db_oid).copied()
}

/// For the launcher: the demand table, and how many workers run now.
pub fn pool_view() -> (Vec<crate::pool::Demand>, usize) {
    let w = WORKERS.share();
    let running = w
        .slots
        .iter()
        .filter(|s| s.db_oid != 0 && s.pid > 0)
        .count();
    (
        w.demand.iter().filter(|d| d.db_oid != 0).copied().collect(),
        running,
    )
}

/// Notes that the launcher asked PostgreSQL for a worker for `db_oid` at `now`.
pub fn mark_starting(db_oid: u32, now: i64) {
    let mut w = WORKERS.exclusive();
    if let Some(d) = w.demand.iter_mut().find(|d| d.db_oid == db_oid) {
        d.starting_at = now;
    }
}

/// Sets (a TimestampTz) or clears (0) the pool's waiting mark, keeping the
/// earliest time while databases go on waiting.
pub fn set_pool_waiting(since: i64) {
    let mut w = WORKERS.exclusive();
    if since == 0 || w.pool_waiting_since == 0 {
        w.pool_waiting_since = since;
    }
}

/// Since when (TimestampTz) a database waits for a worker; 0: none waits.
pub fn pool_waiting_since() -> i64 {
    WORKERS.share().pool_waiting_since
}

/// Sets (a TimestampTz) or clears (0) the mark of a database with work
/// waiting for a process, keeping the earliest time while it goes on.
pub fn set_pool_wanted(since: i64) {
    let mut w = WORKERS.exclusive();
    if since == 0 || w.pool_wanted_since == 0 {
        w.pool_wanted_since = since;
    }
}

/// Since when (TimestampTz) a database with work waits for a worker; 0: none.
pub fn pool_wanted_since() -> i64 {
    WORKERS.share().pool_wanted_since
}

/// Records the launcher's view of the shortage (`since` 0: not short; an
/// earlier `since` is kept while the shortage lasts).
pub fn set_pool_short(since: i64, waiting: u32, wanted: u32) {
    let mut w = WORKERS.exclusive();
    let keep = if since != 0 && w.pool_short.since != 0 {
        w.pool_short.since
    } else {
        since
    };
    w.pool_short = PoolShort {
        since: keep,
        waiting,
        wanted,
    };
}

/// The pool's shortage as the launcher last saw it.
pub fn pool_short() -> PoolShort {
    WORKERS.share().pool_short
}

/// How many databases the pool serves: with a process, or parked (their
/// entries in the demand table), counted once each.
pub fn pool_databases() -> usize {
    let w = WORKERS.share();
    let mut oids: Vec<u32> = w
        .slots
        .iter()
        .filter(|s| s.db_oid != 0 && (s.pid > 0 || s.parking))
        .map(|s| s.db_oid)
        .chain(w.demand.iter().filter(|d| d.db_oid != 0).map(|d| d.db_oid))
        .collect();
    oids.sort_unstable();
    oids.dedup();
    oids.len()
}

/// How often at most a committing consumer writes busy_at (note_busy).
const BUSY_NOTE_US: i64 = 100_000;

/// Notes at `now` that a commit claimed jobs in `db_oid` (slot busy_at).
/// Every claiming commit calls this, so the common case (noted within
/// BUSY_NOTE_US) takes only the shared lock.
pub fn note_busy(db_oid: u32, now: i64) {
    {
        let w = WORKERS.share();
        match w.slots.iter().find(|s| s.db_oid == db_oid && s.pid > 0) {
            Some(s) if now - s.busy_at >= BUSY_NOTE_US => {}
            _ => return,
        }
    }
    let mut w = WORKERS.exclusive();
    if let Some(s) = w.slots.iter_mut().find(|s| s.db_oid == db_oid && s.pid > 0) {
        s.busy_at = s.busy_at.max(now);
    }
}

/// When a commit last claimed jobs in the database of slot `idx`.
pub fn busy_at(idx: usize) -> i64 {
    WORKERS.share().slots[idx].busy_at
}

/// The slot index and pid of the worker of `db_oid`, if one is running.
pub fn find(db_oid: u32) -> Option<(usize, i32)> {
    let w = WORKERS.share();
    w.slots
        .iter()
        .position(|s| s.db_oid == db_oid && s.pid > 0)
        .map(|i| (i, w.slots[i].pid))
}

/// A copy of the slot of `db_oid` (for status()).
pub fn snapshot(db_oid: u32) -> Option<DbSlot> {
    let w = WORKERS.share();
    w.slots.iter().find(|s| s.db_oid == db_oid).copied()
}

pub fn launcher_pid() -> i32 {
    WORKERS.share().launcher_pid
}

pub fn set_launcher_pid(pid: i32) {
    WORKERS.exclusive().launcher_pid = pid;
}

/// Asks the worker of `db_oid` to exit cleanly; returns its pid if it had one.
pub fn request_stop(db_oid: u32) -> Option<i32> {
    let mut w = WORKERS.exclusive();
    let s = w
        .slots
        .iter_mut()
        .find(|s| s.db_oid == db_oid && s.pid > 0)?;
    s.stop_requested = true;
    Some(s.pid)
}

pub fn stop_requested(idx: usize) -> bool {
    WORKERS.share().slots[idx].stop_requested
}

/// What set_wake found.
pub enum Wake {
    /// The worker's flag was clear and is now set: signal this pid.
    Signal(i32),
    /// The flag was set already: the worker will run anyway, no second signal.
    Pending,
    /// The database has no worker process.
    NoWorker,
}

/// Sets the wake flag of the worker of `db_oid`. Every committing producer
/// calls this, so the common case (flag already set) takes only the shared
/// lock.
pub fn set_wake(db_oid: u32) -> Wake {
    {
        let w = WORKERS.share();
        let Some(s) = w
            .slots
            .iter()
            .find(|s| s.db_oid == db_oid && s.pid > 0 && !s.parking)
        else {
            return Wake::NoWorker;
        };
        if s.wake_pending {
            return Wake::Pending;
        }
    }
    let mut w = WORKERS.exclusive();
    let Some(s) = w
        .slots
        .iter_mut()
        .find(|s| s.db_oid == db_oid && s.pid > 0 && !s.parking)
    else {
        return Wake::NoWorker;
    };
    s.wake_pending = true;
    Wake::Signal(s.pid)
}

/// Asks the worker of `db_oid` for a tick now (a consumer waits for one):
/// sets its wake and demand flags. Signal when the worker must be woken
/// (also when a wake is pending: the worker may be sleeping out the
/// coalescing window), Pending when both flags were already set.
pub fn demand_tick(db_oid: u32) -> Wake {
    let mut w = WORKERS.exclusive();
    let Some(s) = w
        .slots
        .iter_mut()
        .find(|s| s.db_oid == db_oid && s.pid > 0 && !s.parking)
    else {
        return Wake::NoWorker;
    };
    if s.wake_pending && s.tick_demand {
        return Wake::Pending;
    }
    s.wake_pending = true;
    s.tick_demand = true;
    Wake::Signal(s.pid)
}

/// Reads the tick-demand flag of slot `idx` without clearing it.
pub fn tick_demanded(idx: usize) -> bool {
    WORKERS.share().slots[idx].tick_demand
}

/// Reads and clears the tick-demand flag of slot `idx`.
pub fn take_tick_demand(idx: usize) -> bool {
    if !WORKERS.share().slots[idx].tick_demand {
        return false;
    }
    let mut w = WORKERS.exclusive();
    std::mem::replace(&mut w.slots[idx].tick_demand, false)
}

/// Reads the wake flag of slot `idx` without clearing it.
pub fn wake_pending(idx: usize) -> bool {
    WORKERS.share().slots[idx].wake_pending
}

/// Reads and clears the wake flag of slot `idx`.
pub fn take_wake(idx: usize) -> bool {
    let mut w = WORKERS.exclusive();
    std::mem::replace(&mut w.slots[idx].wake_pending, false)
}

/// Records that the worker of slot `idx` went idle at `since` (0: active again).
pub fn set_idle(idx: usize, since: i64) {
    let mut w = WORKERS.exclusive();
    w.slots[idx].idle_since = since;
    w.slots[idx].recheck = false;
}

/// Asks the idle worker of `db_oid` to re-read when its duties are due;
/// returns its pid to signal, or None when it has no worker, the worker is
/// active (it reads the tables on its own cadences) or was asked already.
/// Only the shared lock in the common (active) case.
pub fn request_recheck(db_oid: u32) -> Option<i32> {
    {
        let w = WORKERS.share();
        let s = w.slots.iter().find(|s| s.db_oid == db_oid && s.pid > 0)?;
        if s.idle_since == 0 || s.recheck {
            return None;
        }
    }
    let mut w = WORKERS.exclusive();
    let s = w
        .slots
        .iter_mut()
        .find(|s| s.db_oid == db_oid && s.pid > 0)?;
    if s.idle_since == 0 || s.recheck {
        return None;
    }
    s.recheck = true;
    Some(s.pid)
}

/// Records that a job lease of `db_oid` expires at `at` (TimestampTz):
/// returns the worker's pid to wake when it is idle and `at` is before
/// every lease expiry it knows of; None otherwise (an active worker rescues
/// on its cadence, and reads duty_due() when it goes idle).
pub fn note_lease_due(db_oid: u32, at: i64) -> Option<i32> {
    let known = |s: &DbSlot| s.idle_since == 0 || (s.lease_due != 0 && s.lease_due <= at);
    {
        let w = WORKERS.share();
        let s = w.slots.iter().find(|s| s.db_oid == db_oid && s.pid > 0)?;
        if known(s) {
            return None;
        }
    }
    let mut w = WORKERS.exclusive();
    let s = w
        .slots
        .iter_mut()
        .find(|s| s.db_oid == db_oid && s.pid > 0)?;
    if known(s) {
        return None;
    }
    s.lease_due = at;
    Some(s.pid)
}

/// The earliest unrescued lease expiry note_lease_due recorded for slot
/// `idx` (0: none).
pub fn lease_due(idx: usize) -> i64 {
    WORKERS.share().slots[idx].lease_due
}

/// Forgets slot `idx`'s lease expiry: job_maint is about to run (a dispatch
/// after this records its lease again).
pub fn clear_lease_due(idx: usize) {
    if WORKERS.share().slots[idx].lease_due != 0 {
        WORKERS.exclusive().slots[idx].lease_due = 0;
    }
}

/// Reads and clears the recheck flag of slot `idx`.
pub fn take_recheck(idx: usize) -> bool {
    if !WORKERS.share().slots[idx].recheck {
        return false;
    }
    let mut w = WORKERS.exclusive();
    std::mem::replace(&mut w.slots[idx].recheck, false)
}

pub fn mark_dropped(db_oid: u32) {
    let mut w = WORKERS.exclusive();
    let i = w.dropped_next % DROPPED;
    w.dropped[i] = db_oid;
    w.dropped_next = i + 1;
}

pub fn unmark_dropped(db_oid: u32) {
    let mut w = WORKERS.exclusive();
    for d in w.dropped.iter_mut() {
        if *d == db_oid {
            *d = 0;
        }
    }
}

pub fn is_dropped(db_oid: u32) -> bool {
    WORKERS.share().dropped.contains(&db_oid)
}

/// Remembers (at `now`, a TimestampTz) that `db_oid` wants no worker.
pub fn mark_unwanted(db_oid: u32, now: i64) {
    let mut w = WORKERS.exclusive();
    if let Some(u) = w.unwanted.iter_mut().find(|u| u.0 == db_oid) {
        u.1 = now;
        return;
    }
    // a free or lapsed place, else the oldest mark (the first to lapse)
    let mut pick = 0;
    for (i, u) in w.unwanted.iter().enumerate() {
        if u.0 == 0 || now - u.1 >= UNWANTED_TTL_US {
            pick = i;
            break;
        }
        if u.1 < w.unwanted[pick].1 {
            pick = i;
        }
    }
    w.unwanted[pick] = (db_oid, now);
}

/// Forgets the mark of `db_oid` (start() wants a worker there).
pub fn unmark_unwanted(db_oid: u32) {
    let mut w = WORKERS.exclusive();
    for u in w.unwanted.iter_mut() {
        if u.0 == db_oid {
            *u = (0, 0);
        }
    }
}

/// Forgets every mark (the launcher re-reads pgque.databases and looks again).
pub fn clear_unwanted() {
    let mut w = WORKERS.exclusive();
    w.unwanted = [(0, 0); UNWANTED];
}

/// Whether `db_oid` was found to want no worker less than
/// UNWANTED_TTL_US before `now`.
pub fn is_unwanted(db_oid: u32, now: i64) -> bool {
    WORKERS
        .share()
        .unwanted
        .iter()
        .any(|u| u.0 == db_oid && now - u.1 < UNWANTED_TTL_US)
}

/// Records the start of a duty run.
pub fn duty_started(idx: usize, duty: usize, now: i64) {
    let mut w = WORKERS.exclusive();
    w.slots[idx].duties[duty].last_run = now;
}

/// Records the end of a duty run: success, or the error message.
pub fn duty_finished(idx: usize, duty: usize, now: i64, duration_us: u64, error: Option<&str>) {
    let mut w = WORKERS.exclusive();
    let d = &mut w.slots[idx].duties[duty];
    d.runs += 1;
    d.last_duration_us = duration_us;
    match error {
        None => {
            d.last_ok = now;
            d.consecutive_failures = 0;
        }
        Some(msg) => {
            d.failures += 1;
            d.consecutive_failures += 1;
            d.last_failure = now;
            let bytes = truncate_utf8(msg, ERR_LEN);
            d.err[..bytes.len()].copy_from_slice(bytes);
            d.err_len = bytes.len() as u16;
        }
    }
}

/// The longest prefix of `s` that fits in `max` bytes without splitting a char.
pub fn truncate_utf8(s: &str, max: usize) -> &[u8] {
    if s.len() <= max {
        return s.as_bytes();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

#[cfg(test)]
mod tests {
    use super::truncate_utf8;

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_utf8("abc", 10), b"abc");
        assert_eq!(truncate_utf8("abcdef", 4), b"abcd");
        // "ж" is two bytes: cutting at 3 must not split the second one.
        assert_eq!(truncate_utf8("жжж", 3), "ж".as_bytes());
    }
}
