//! The per-database worker: runs the duties of `duties::DUTIES` on their
//! cadences, each in a short transaction of its own, and never holds a
//! transaction (or snapshot) across its sleep.
//!
//! Exit status tells the postmaster whether to restart it: 0 (no restart) when
//! it is not wanted here (no extension, stop(), pgque.enabled off, database
//! being dropped or not in pgque.databases, another worker already serves the
//! database); 1 (restart after pgque.worker_restart_time) when it was
//! terminated by a signal, so `pg_terminate_backend` is followed by a restart.
use super::duties::{self, DUTIES, WAKE_MIN_INTERVAL};
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

/// Whether this database wants its worker: the extension is installed and
/// pgque.start() (not stop()) was the last word. None: the extension is absent.
fn wanted_here() -> Option<bool> {
    in_transaction(|| {
        let ext = unsafe { pg_sys::get_extension_oid(c"pgque".as_ptr(), true) };
        if ext == pg_sys::InvalidOid {
            return None;
        }
        // to_jsonb: the column exists from 0.7.0 on, and the library may run
        // against a schema not updated yet.
        let (enabled, period) = Spi::get_two::<bool, i32>(
            "SELECT worker_enabled, (to_jsonb(w) ->> 'tick_period_ms')::int4 FROM pgque.worker_config w",
        )
        .ok()?;
        duties::set_tick_period_override(period);
        enabled
    })
    .ok()
    .flatten()
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
    shmem::release(idx, unsafe { pg_sys::MyProcPid });
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
    let await_install = arg.value() as u64 & super::AWAIT_INSTALL != 0;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    if shmem::is_dropped(db_oid) {
        exit_clean();
    }
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(pg_sys::Oid::from(db_oid)), None);
    let pid = unsafe { pg_sys::MyProcPid };
    let idx = match shmem::claim(db_oid, pid, now_ts()) {
        shmem::Claim::Claimed(i) => i,
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
    // A duty never waits long on a lock another session holds (duties.rs).
    unsafe {
        pg_sys::SetConfigOption(
            c"lock_timeout".as_ptr(),
            duties::DUTY_LOCK_TIMEOUT.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_SESSION,
        );
    }

    let mut sched: Vec<Schedule> = DUTIES
        .iter()
        .map(|_| Schedule {
            next_due: Instant::now(),
            last_start: None,
            consecutive_failures: 0,
            last_logged_error: None,
        })
        .collect();
    let mut next_check = Instant::now() + RECHECK;

    loop {
        let now = Instant::now();
        let next = sched
            .iter()
            .map(|s| s.next_due)
            .min()
            .unwrap_or(now + RECHECK)
            .min(next_check);
        let wait = next.saturating_duration_since(now);
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
        }
        if shmem::stop_requested(idx) || !gucs::enabled() || !allowed(&dbname, &gucs::databases()) {
            exit_clean();
        }
        if Instant::now() >= next_check {
            if wanted_here() != Some(true) {
                log!("pgque worker for database {dbname}: extension dropped or stop() called; exiting");
                shmem::mark_unwanted(db_oid, now_ts());
                exit_clean();
            }
            next_check = Instant::now() + RECHECK;
        }
        // The wake flag stays set until an on_wake duty runs for it: while it
        // is set, committing producers skip signalling us (a stream of small
        // commits would otherwise signal this process once per commit), and
        // a wake that comes within WAKE_MIN_INTERVAL of the last run is
        // deferred to the end of that interval instead of being dropped.
        let woken = shmem::wake_pending(idx);
        for (i, d) in DUTIES.iter().enumerate() {
            let s = &mut sched[i];
            let now = Instant::now();
            let wake_run = woken
                && d.on_wake
                && s.last_start
                    .is_none_or(|t| now.duration_since(t) >= WAKE_MIN_INTERVAL);
            if woken && d.on_wake && !wake_run {
                if let Some(t) = s.last_start {
                    s.next_due = s.next_due.min(t + WAKE_MIN_INTERVAL);
                }
            }
            if now < s.next_due && !wake_run {
                continue;
            }
            if d.on_wake {
                // Cleared before the run: a commit during it sets it again.
                shmem::take_wake(idx);
            }
            let period = (d.period)();
            if period.is_zero() {
                s.next_due = now + Duration::from_secs(3600);
                continue;
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
    }
}

thread_local! {
    /// Each duty's call, prepared once: the ticker runs up to 1/WAKE_MIN_INTERVAL
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
