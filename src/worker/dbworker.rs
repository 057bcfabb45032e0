//! The per-database worker: runs the duties of `duties::DUTIES` on their
//! cadences, each in a short transaction of its own, and never holds a
//! transaction (or snapshot) across its sleep.
//!
//! Idle mode: after pgque.idle_after without a producer's wake-up the worker
//! stops running duties on their cadences. It reads pgque.duty_due() (when
//! each duty next has work: the next delayed event, retry, scheduled job,
//! lease expiry, schedule slot, idle tick, piece switch) and sleeps until the
//! soonest, or pgque.idle_check_interval at most (to see DROP EXTENSION and
//! consumers' progress), running the housekeeping duties every
//! pgque.idle_maint_period. A producer's commit sets its latch (wake.rs) and
//! puts it back on the active cadences at once; a dispatch or a retry, which
//! make a duty due sooner without a send, asks it to read duty_due() again.
//!
//! The pool (pool.rs): an idle worker parks (writes when its next duty is
//! due into shared memory and exits, the launcher starts a worker again
//! then or at a producer's commit) when another database waits for a
//! process, or after pgque.worker_idle_exit if that is set; a busy one
//! parks for its turn after pgque.worker_turn while another database with work waits. A worker
//! started for a due duty of a database its last worker parked is idle from
//! the start: it runs what is due and parks again. A worker whose database's
//! consumers claim jobs is busy though idle (no producer wakes it), and
//! parks only as a busy one does.
//!
//! Exit status tells the postmaster whether to restart it: 0 (no restart) when
//! it parks, when it is not wanted here (no extension, stop(), pgque.enabled off, database
//! being dropped or not in pgque.databases, another worker already serves the
//! database); 1 (restart after pgque.worker_restart_time) when it was
//! terminated by a signal, so `pg_terminate_backend` is followed by a restart.
use super::duties::{self, DUTIES};
use super::launcher::allowed;
use crate::{gucs, shmem};
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// How long a new worker waits for the CREATE EXTENSION that started it to commit.
const INSTALL_WAIT: Duration = Duration::from_secs(10);
/// How often the worker re-checks that it is still wanted.
const RECHECK: Duration = Duration::from_secs(1);
/// An idle worker parks only when its next duty is at least this far away
/// (a process started again sooner costs more than one that sleeps), or a
/// database with work waits for its process.
const PARK_MIN_SLEEP: Duration = Duration::from_secs(2);
/// A busy worker parks for its turn only after a database with work has
/// waited this long (TimestampTz microseconds): not for a wait the launcher
/// ends itself.
const TURN_WAIT_US: i64 = 1_000_000;

/// A database whose consumers claimed jobs within this long (TimestampTz
/// microseconds) is busy (shmem::note_busy).
const BUSY_WINDOW_US: i64 = 2_000_000;

/// Whether a busy worker's turn is over: a database with work (a
/// producer's commit, a consumer's claim, start()) has waited for a
/// process for TURN_WAIT_US and this worker has had its process for
/// pgque.worker_turn. A database that is only due, or that the launcher
/// merely looks at, never ends a turn: it waits for an idle worker to park
/// or a slot to free.
fn turn_over(claimed_at: Instant) -> bool {
    let waiting = shmem::pool_wanted_since();
    waiting != 0
        && now_ts() - waiting >= TURN_WAIT_US
        && claimed_at.elapsed() >= gucs::worker_turn()
}

fn now_ts() -> i64 {
    unsafe { pg_sys::GetCurrentTimestamp() }
}

// proc_exit never returns, but only some versions' bindings say so.
#[allow(unreachable_code)]
fn exit_clean() -> ! {
    unsafe { pg_sys::proc_exit(0) };
    unreachable!("proc_exit returned")
}

/// Runs `f` in a transaction of its own. An ERROR inside is caught, the
/// transaction is rolled back and the message returned; the worker goes on.
fn in_transaction<R>(
    f: impl FnOnce() -> R + std::panic::UnwindSafe + std::panic::RefUnwindSafe,
) -> Result<R, String> {
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let result = PgTryBuilder::new(move || {
        let r = f();
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        }
        Ok(r)
    })
    .catch_others(|e| {
        Err(match e {
            CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => {
                format!(
                    "{} (SQLSTATE {})",
                    r.message(),
                    crate::error::sqlstate(r.sql_error_code())
                )
            }
            CaughtError::RustPanic { ereport, .. } => ereport.message().to_string(),
        })
    })
    .execute();
    if result.is_err() {
        unsafe {
            // As PostgreSQL's own error recovery does: no interrupts while aborting.
            pg_sys::InterruptHoldoffCount += 1;
            pg_sys::AbortCurrentTransaction();
            pg_sys::InterruptHoldoffCount -= 1;
        }
    }
    result
}

/// The worker's settings row: whether start() (not stop()) was the last
/// word, and set_tick_period_ms()'s period. to_jsonb: the column exists from
/// 0.7.0 on, and the library may run against a schema not updated yet. Every
/// name is qualified, operators included, though the session's search_path
/// is pinned too (pin_session): this statement is not inside a pinned
/// function, and it runs as superuser.
const WORKER_CONFIG_SQL: &str = "SELECT w.worker_enabled, \
     (pg_catalog.to_jsonb(w) OPERATOR(pg_catalog.->>) 'tick_period_ms'::pg_catalog.text)::pg_catalog.int4 \
     FROM pgque.worker_config w";

/// Reads WORKER_CONFIG_SQL and applies its tick period; returns whether the
/// worker is enabled (None: no row). An ERROR propagates.
fn read_worker_config() -> pgrx::spi::Result<Option<bool>> {
    let (enabled, period) = Spi::get_two::<bool, i32>(WORKER_CONFIG_SQL)?;
    duties::set_tick_period_override(period);
    Ok(enabled)
}

/// Whether this database wants its worker: the extension is installed and
/// pgque.start() (not stop()) was the last word. None: the extension is absent.
fn wanted_here() -> Option<bool> {
    in_transaction(|| {
        let ext = unsafe { pg_sys::get_extension_oid(c"pgque".as_ptr(), true) };
        if ext == pg_sys::InvalidOid {
            return None;
        }
        read_worker_config().ok()?
    })
    .ok()
    .flatten()
}

/// Session settings the worker runs with, whatever `ALTER DATABASE ... SET`
/// or `ALTER ROLE ... SET` say: the worker is a superuser session in a
/// database whose owner (or, before PostgreSQL 15, anyone who can connect)
/// can create objects in `public` and set the database's search_path. With
/// `pg_catalog, pg_temp` no name it runs resolves to an object a role other
/// than a superuser created; pgque's own functions pin their own path on top.
/// The others keep an owner's settings from breaking or stalling the duties
/// (a 1 ms statement_timeout, read-only or serializable transactions by
/// default). Set at PGC_S_SESSION, as SET would: above the database's and
/// role's settings, and below nothing, so a function's SET clause still
/// applies inside it.
const PINNED_SETTINGS: [(&std::ffi::CStr, &std::ffi::CStr); 6] = [
    (c"search_path", c"pg_catalog, pg_temp"),
    (c"statement_timeout", c"0"),
    (c"idle_in_transaction_session_timeout", c"0"),
    (c"default_transaction_isolation", c"read committed"),
    (c"default_transaction_read_only", c"off"),
    (c"lock_timeout", duties::DUTY_LOCK_TIMEOUT),
];

/// Applies PINNED_SETTINGS to this session (outside any transaction, so
/// no abort undoes them). Run right after connecting, before any statement.
fn pin_session() {
    for (name, value) in PINNED_SETTINGS {
        unsafe {
            pg_sys::SetConfigOption(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_SUSET,
                pg_sys::GucSource::PGC_S_SESSION,
            );
        }
    }
}

/// The name of this worker's database (a catalog lookup: needs a transaction).
fn database_name() -> String {
    in_transaction(|| unsafe {
        let p = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        if p.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    })
    .unwrap_or_default()
}

unsafe extern "C-unwind" fn release_slot(_code: i32, arg: pg_sys::Datum) {
    let idx = arg.value();
    if let Some(launcher) = shmem::release(idx, unsafe { pg_sys::MyProcPid }) {
        // parked: the pool has a process free
        crate::wake::set_latch_of(launcher);
    }
}

/// Per-duty scheduling state kept by the worker (the shared counters live in shmem).
struct Schedule {
    next_due: Instant,
    last_start: Option<Instant>,
    consecutive_failures: u32,
    /// Logged once per distinct message, not once per failure.
    last_logged_error: Option<String>,
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pgque_db_worker_main(arg: pg_sys::Datum) {
    let db_oid = (arg.value() as u64 & 0xFFFF_FFFF) as u32;
    let await_install = arg.value() as u64 & super::spawn::AWAIT_INSTALL != 0;
    let pool_start = arg.value() as u64 & super::spawn::DUE_START != 0;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    if shmem::is_dropped(db_oid) {
        exit_clean();
    }
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(pg_sys::Oid::from(db_oid)), None);
    pin_session();
    let pid = unsafe { pg_sys::MyProcPid };
    // A due start (one pass of what is due, then it parks again when idle)
    // only for a database its last worker parked, as the pool's entry says:
    // after a server start or a crash, shared memory holds no parked
    // database, and the launcher's first look at each (or the postmaster
    // restarting a worker that was a due start) gets a worker that stays,
    // as CREATE EXTENSION's does.
    let (idx, due_start) = match shmem::claim(db_oid, pid, now_ts()) {
        shmem::Claim::Claimed(i, due_only) => (i, pool_start && due_only),
        // (a pool-started worker finds its database's slot taken when a
        // producer's commit got it a worker first)
        shmem::Claim::Busy => exit_clean(),
        shmem::Claim::Full => {
            log!(
                "pgque worker: all {} worker slots are in use; database {} gets none",
                shmem::MAX_DBS,
                database_name()
            );
            exit_clean()
        }
    };
    unsafe {
        pg_sys::before_shmem_exit(Some(release_slot), pg_sys::Datum::from(idx));
    }
    // DROP / RENAME / CREATE DATABASE ... TEMPLATE marks the database while
    // it needs it unused (hooks.rs): a worker that was starting then leaves
    // (PostgreSQL waits a few seconds for other sessions to go).
    if shmem::is_dropped(db_oid) {
        exit_clean();
    }
    unsafe {
        pg_sys::pgstat_report_appname(c"pgque worker".as_ptr());
    }

    // start() (also run by CREATE EXTENSION) launches us when its
    // transaction commits (wake::spawn_at_commit), so what we read is its
    // committed outcome; the extension may still be invisible for a moment
    // to a worker whose start() was in the CREATE EXTENSION transaction.
    let deadline = Instant::now()
        + if await_install {
            INSTALL_WAIT
        } else {
            Duration::ZERO
        };
    loop {
        if shmem::is_dropped(db_oid) {
            exit_clean();
        }
        match wanted_here() {
            Some(true) => break,
            Some(false) => {
                shmem::mark_unwanted(db_oid, now_ts());
                exit_clean()
            }
            None if Instant::now() >= deadline => {
                // a CREATE EXTENSION that has not committed in time is not
                // a verdict: the launcher looks again on its next scan
                if !await_install {
                    shmem::mark_unwanted(db_oid, now_ts());
                }
                exit_clean()
            }
            None => {}
        }
        if !BackgroundWorker::wait_latch(Some(Duration::from_millis(100))) {
            terminated(idx);
        }
    }
    let dbname = database_name();
    log!("pgque worker started for database {dbname}");

    // A worker started for a due duty of a parked database takes each
    // duty's last run from the counters its slot kept, so it runs only what
    // is due (and housekeeping on its idle period) rather than every duty;
    // without them (the slot went to another database) every duty runs once.
    let kept = due_start.then(|| kept_last_runs(db_oid)).flatten();
    let mut sched: Vec<Schedule> = DUTIES
        .iter()
        .enumerate()
        .map(|(i, _)| Schedule {
            next_due: Instant::now(),
            last_start: kept.as_ref().and_then(|k| k[i]),
            consecutive_failures: 0,
            last_logged_error: None,
        })
        .collect();
    let mut next_check = Instant::now() + RECHECK;
    // Idle mode (module comment): when it began, and each duty's next work
    // as the last pgque.duty_due() read said.
    let mut last_wake = Instant::now();
    let mut idle_since: Option<Instant> = None;
    let mut hints: Vec<Option<Instant>> = vec![None; DUTIES.len()];
    // Whether the hints were read since the worker went idle (it may park then).
    let mut idle_checked = false;
    let claimed_at = Instant::now();
    let mut first_pass = true;
    if kept.is_some() && gucs::idle_after().is_some() {
        // idle from the start: read duty_due() first
        idle_since = Some(Instant::now());
        shmem::set_idle(idx, now_ts());
        next_check = Instant::now();
        first_pass = false;
    }

    let job_maint = DUTIES.iter().position(|d| d.name == "job_maint");
    loop {
        // An idle worker learns a new job lease's expiry from shared memory
        // (wake::lease_due_at_commit), not by reading duty_due() again.
        if let (Some(_), Some(j)) = (idle_since, job_maint) {
            let at = shmem::lease_due(idx);
            if at != 0 {
                let when = Instant::now() + Duration::from_micros((at - now_ts()).max(0) as u64);
                hints[j] = Some(hints[j].map_or(when, |t| t.min(when)));
            }
        }
        // A busy database (its consumers claimed jobs lately, though no
        // producer's commit woke the worker) keeps its process like an
        // active one: only a database with work takes it, after a turn.
        let busy = now_ts() - shmem::busy_at(idx) < BUSY_WINDOW_US;
        if let Some(since) = idle_since {
            if idle_checked {
                let leave = if busy {
                    turn_over(claimed_at)
                } else {
                    due_start
                        || shmem::pool_waiting_since() != 0
                        || gucs::worker_idle_exit().is_some_and(|d| since.elapsed() >= d)
                };
                let now = Instant::now();
                let duty_next = sched
                    .iter()
                    .zip(DUTIES)
                    .zip(&hints)
                    .filter_map(|((s, d), h)| idle_next(s, d, *h, since))
                    .min();
                // A database with work waiting takes the process even when
                // a duty here is due soon: a due start serves that one.
                let soon_ok = !busy && shmem::pool_wanted_since() != 0;
                if leave && (soon_ok || duty_next.is_none_or(|t| t >= now + PARK_MIN_SLEEP)) {
                    let after = duty_next.map_or(gucs::idle_maint_period(), |t| t - now);
                    let ts = now_ts();
                    // busy: back in the queue at once, behind the waiting one
                    if shmem::park_worker(idx, pid, ts + after.as_micros() as i64, busy, ts) {
                        if busy {
                            log!("pgque worker for database {dbname}: gives its process to a waiting database after its turn of {:?}", claimed_at.elapsed());
                        }
                        park_exit();
                    }
                }
            }
        } else if turn_over(claimed_at) {
            let ts = now_ts();
            if shmem::park_worker(idx, pid, 0, true, ts) {
                log!("pgque worker for database {dbname}: gives its process to a waiting database after its turn of {:?}", claimed_at.elapsed());
                park_exit();
            }
        }
        let now = Instant::now();
        let next = match idle_since {
            Some(since) => sched
                .iter()
                .zip(DUTIES)
                .zip(&hints)
                .filter_map(|((s, d), h)| idle_next(s, d, *h, since))
                .min(),
            None => sched.iter().map(|s| s.next_due).min(),
        };
        let mut next = next.unwrap_or(now + RECHECK).min(next_check);
        if let (None, Some(after)) = (idle_since, gucs::idle_after()) {
            next = next.min(last_wake + after);
        }
        let wait = next.saturating_duration_since(now);
        if !wait.is_zero() {
            // A background worker's counters (pg_stat_database's xact_commit,
            // table scans) are flushed only when it asks; before a sleep,
            // as a backend does when it goes idle. Rate-limited to once a
            // second inside unless forced, which an idle worker can afford.
            let _ = unsafe { pg_sys::pgstat_report_stat(idle_since.is_some()) };
        }
        if !wait.is_zero()
            && !BackgroundWorker::wait_latch(Some(wait.max(Duration::from_millis(1))))
        {
            terminated(idx);
        }
        if BackgroundWorker::sigterm_received() {
            terminated(idx);
        }
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            // New cadences apply from now on.
            for (s, d) in sched.iter_mut().zip(DUTIES) {
                if let Some(start) = s.last_start {
                    if let Some(delay) = duties::delay(
                        (d.period)(),
                        s.consecutive_failures,
                        gucs::duty_backoff_max(),
                    ) {
                        s.next_due = start + delay;
                    }
                }
            }
            if idle_since.is_some() {
                if gucs::idle_after().is_none() {
                    // idle mode switched off: back on the active cadences
                    idle_since = None;
                    idle_checked = false;
                    shmem::set_idle(idx, 0);
                    hints = vec![None; DUTIES.len()];
                }
                next_check = Instant::now();
            }
        }
        if shmem::stop_requested(idx) || !gucs::enabled() || shmem::is_dropped(db_oid) {
            exit_clean();
        }
        if !allowed(&dbname, &gucs::databases()) {
            // left alone until the list changes (the launcher forgets the
            // mark on reload), so commits here do not start workers again
            shmem::mark_unwanted(db_oid, now_ts());
            exit_clean();
        }
        // The wake flag stays set until an on_wake duty runs for it: while it
        // is set, committing producers skip signalling us (a stream of small
        // commits would otherwise signal this process once per commit), and
        // a wake that comes within wake_min_interval() of the last run is
        // deferred to the end of that interval instead of being dropped.
        let woken = shmem::wake_pending(idx);
        // A consumer waits on a queue a producer just sent to (waiters.rs):
        // the tick goes now, not at the end of the coalescing window.
        let mut demanded = woken && shmem::take_tick_demand(idx);
        let now = Instant::now();
        if woken {
            last_wake = now;
            if idle_since.take().is_some() {
                // Back on the active cadences: the ticker runs at once for
                // the commit, the duties that came due meanwhile after it.
                idle_checked = false;
                shmem::set_idle(idx, 0);
                next_check = next_check.min(now + RECHECK);
            }
        } else if idle_since.is_some() {
            if shmem::take_recheck(idx) {
                next_check = now;
            }
        } else if gucs::idle_after().is_some_and(|after| now >= last_wake + after) {
            idle_since = Some(now);
            shmem::set_idle(idx, now_ts());
            next_check = now;
        }
        if now >= next_check {
            let wanted = match idle_since {
                Some(_) => match idle_check() {
                    Some((wanted, due)) => {
                        let at = Instant::now();
                        hints = due
                            .iter()
                            .map(|d| d.map(|secs| at + Duration::from_secs_f64(secs.min(1e9))))
                            .collect();
                        idle_checked = true;
                        wanted
                    }
                    None => {
                        // duty_due's tables are missing (a schema older than
                        // the library, before ALTER EXTENSION UPDATE): every
                        // duty on its active cadence.
                        hints = vec![Some(Instant::now()); DUTIES.len()];
                        wanted_here() == Some(true)
                    }
                },
                None => wanted_here() == Some(true),
            };
            if !wanted {
                log!("pgque worker for database {dbname}: extension dropped or stop() called; exiting");
                shmem::mark_unwanted(db_oid, now_ts());
                exit_clean();
            }
            next_check = Instant::now()
                + if idle_since.is_some() {
                    gucs::idle_check_interval()
                } else {
                    RECHECK
                };
        }
        let mut ran_idle = false;
        // Whether an on_wake duty ran in this pass (see the break below).
        let mut ticked = false;
        for (i, d) in DUTIES.iter().enumerate() {
            if !d.on_wake
                && !ticked
                && shmem::wake_pending(idx)
                && (wake_duty_may_run(&sched) || shmem::tick_demanded(idx))
            {
                // A producer committed while the duties before this one ran
                // (an idle worker's housekeeping, a due maint): its tick goes
                // first, the rest of this pass after it. Once per pass at
                // most: a pass that ticked runs every due duty, so a ticker
                // slower than the window cannot starve the others.
                break;
            }
            let s = &mut sched[i];
            let now = Instant::now();
            let period = (d.period)();
            if let Some(since) = idle_since {
                if idle_next(s, d, hints[i], since).is_none_or(|t| now < t) {
                    continue;
                }
                hints[i] = None;
                ran_idle = true;
            } else {
                let wake_run = woken
                    && d.on_wake
                    && (demanded
                        || s.last_start
                            .is_none_or(|t| now.duration_since(t) >= duties::wake_min_interval()));
                if woken && d.on_wake && !wake_run {
                    if let Some(t) = s.last_start {
                        s.next_due = s.next_due.min(t + duties::wake_min_interval());
                    }
                }
                if now < s.next_due && !wake_run {
                    continue;
                }
                if d.on_wake {
                    // Cleared before the run: a commit during it sets it again.
                    shmem::take_wake(idx);
                }
                if period.is_zero() {
                    s.next_due = now + Duration::from_secs(3600);
                    continue;
                }
            }
            ticked |= d.on_wake;
            if d.on_wake {
                demanded = false;
            }
            if Some(i) == job_maint {
                // it rescues what is due; later leases are in duty_due()
                shmem::clear_lease_due(idx);
            }
            run_duty(idx, i, d, s, &dbname);
            let delay = duties::delay(period, s.consecutive_failures, gucs::duty_backoff_max())
                .unwrap_or(period);
            s.next_due = s.last_start.unwrap_or(now) + delay;
            if s.consecutive_failures == 0 {
                if let Some(soon) = duties::sooner(d.name) {
                    s.next_due = s.next_due.min(Instant::now() + soon);
                }
            }
        }
        if ran_idle {
            // What it did moves the due times: read them again before sleeping.
            next_check = Instant::now();
            idle_checked = false;
        }
        if std::mem::take(&mut first_pass) && due_start && idle_since.is_none() {
            // Started for a due duty: every duty ran once; idle from now on
            // (and parked again at once if nothing else is due soon).
            if gucs::idle_after().is_some() {
                idle_since = Some(Instant::now());
                shmem::set_idle(idx, now_ts());
                next_check = Instant::now();
            }
        }
    }
}

/// Whether an `on_wake` duty (the ticker) would run now for a wake-up: it
/// last started at least the coalescing window ago (or never).
fn wake_duty_may_run(sched: &[Schedule]) -> bool {
    let now = Instant::now();
    sched.iter().zip(DUTIES).any(|(s, d)| {
        d.on_wake
            && s.last_start
                .is_none_or(|t| now.duration_since(t) >= duties::wake_min_interval())
    })
}

/// When each duty last ran, as Instants, from the counters the slot of
/// `db_oid` kept while it was parked; None unless every duty has run.
fn kept_last_runs(db_oid: u32) -> Option<Vec<Option<Instant>>> {
    let slot = shmem::snapshot(db_oid)?;
    let now_i = Instant::now();
    let now = now_ts();
    let runs: Vec<Option<Instant>> = slot.duties[..DUTIES.len()]
        .iter()
        .map(|d| {
            (d.last_run != 0)
                .then(|| now_i.checked_sub(Duration::from_micros((now - d.last_run).max(0) as u64)))
                .flatten()
        })
        .collect();
    runs.iter().all(|r| r.is_some()).then_some(runs)
}

/// Leaves after park_worker, counters flushed (release_slot tells the
/// launcher a process is free).
fn park_exit() -> ! {
    let _ = unsafe { pg_sys::pgstat_report_stat(true) };
    exit_clean()
}

/// When an idle worker runs duty `d` next: at its hint (from duty_due()),
/// or, for a housekeeping duty, pgque.idle_maint_period after its last run,
/// whichever is sooner; never sooner than its active cadence (or back-off)
/// allows, so a duty that stays due (work blocked, or a backlog bigger than
/// one run) costs at most what it costs an active worker. None: not before
/// the next check.
fn idle_next(
    s: &Schedule,
    d: &duties::Duty,
    hint: Option<Instant>,
    since: Instant,
) -> Option<Instant> {
    let period = (d.period)();
    if period.is_zero() {
        return None;
    }
    let housekeeping = duties::idle_housekeeping(d.name)
        .then(|| s.last_start.unwrap_or(since) + period.max(gucs::idle_maint_period()));
    let at = match (hint, housekeeping) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    let floor = s.last_start.map(|t| {
        t + duties::delay(period, s.consecutive_failures, gucs::duty_backoff_max())
            .unwrap_or(period)
    });
    Some(floor.map_or(at, |f| at.max(f)))
}

/// An idle worker's periodic look, in one transaction: whether it is still
/// wanted here (as wanted_here) and each duty's due time (duty_due()). None
/// when that failed (the extension's schema may be older than the library).
fn idle_check() -> Option<(bool, Vec<Option<f64>>)> {
    in_transaction(|| {
        let ext = unsafe { pg_sys::get_extension_oid(c"pgque".as_ptr(), true) };
        if ext == pg_sys::InvalidOid {
            return (false, vec![]);
        }
        let enabled = read_worker_config().unwrap_or_else(|e| pgrx::error!("{e}"));
        if enabled != Some(true) {
            return (false, vec![]);
        }
        // Through the function, which pins its own search_path.
        let rows = super::due::read_through_function();
        let due = DUTIES
            .iter()
            .map(|d| rows.iter().find(|r| r.0 == d.name).and_then(|r| r.1))
            .collect();
        (true, due)
    })
    .ok()
}

thread_local! {
    /// Each duty's call, prepared once: the ticker runs up to once per pgque.tick_coalesce_ms
    /// times a second under load, and parsing and planning `SELECT pgque.ticker()`
    /// every time was ~6% of the worker's CPU. PostgreSQL's plan cache
    /// re-resolves the function when the extension is dropped and created again.
    static DUTY_PLANS: std::cell::RefCell<std::collections::HashMap<&'static str, std::rc::Rc<pgrx::spi::OwnedPreparedStatement>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

fn duty_plan(
    c: &pgrx::spi::SpiClient<'_>,
    sql: &'static str,
) -> pgrx::spi::SpiResult<std::rc::Rc<pgrx::spi::OwnedPreparedStatement>> {
    if let Some(p) = DUTY_PLANS.with(|m| m.borrow().get(sql).cloned()) {
        return Ok(p);
    }
    let p = std::rc::Rc::new(c.prepare(sql, &[])?.keep());
    DUTY_PLANS.with(|m| m.borrow_mut().insert(sql, p.clone()));
    Ok(p)
}

fn run_duty(idx: usize, i: usize, d: &duties::Duty, s: &mut Schedule, dbname: &str) {
    let start = Instant::now();
    s.last_start = Some(start);
    shmem::duty_started(idx, i, now_ts());
    let sql = d.sql;
    // Called through SPI's read path: Spi::run assigns the transaction an id
    // up front, so every duty run (the ticker every 100 ms) burned an xid and
    // wrote a commit record even in an idle database. A duty that writes gets
    // its id when it does.
    let result = in_transaction(move || {
        Spi::connect(|c| {
            let plan = duty_plan(c, sql)?;
            c.select(&*plan, None, &[]).map(|_| ())
        })
        .map_err(|e| e.to_string())
    });
    let result = match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) | Err(e) => Err(e),
    };
    let us = start.elapsed().as_micros() as u64;
    match &result {
        Ok(()) => {
            if s.consecutive_failures > 0 {
                log!(
                    "pgque worker {dbname}: duty {} recovered after {} failures",
                    d.name,
                    s.consecutive_failures
                );
            }
            s.consecutive_failures = 0;
            s.last_logged_error = None;
            shmem::duty_finished(idx, i, now_ts(), us, None);
        }
        Err(msg) => {
            s.consecutive_failures += 1;
            if s.last_logged_error.as_deref() != Some(msg.as_str()) {
                log!(
                    "pgque worker {dbname}: duty {} failed: {msg}; backing off",
                    d.name
                );
                s.last_logged_error = Some(msg.clone());
            }
            shmem::duty_finished(idx, i, now_ts(), us, Some(msg));
        }
    }
}

/// SIGTERM or postmaster death. A stop request (DROP DATABASE, stop()) exits
/// cleanly; anything else exits 1 so the postmaster brings the worker back.
#[allow(unreachable_code)]
fn terminated(idx: usize) -> ! {
    if shmem::stop_requested(idx) {
        exit_clean();
    }
    unsafe { pg_sys::proc_exit(1) };
    unreachable!("proc_exit returned")
}
