//! The duties a database worker runs, and when. Each duty is one SQL-callable
//! function, so it can be tested alone and run by any scheduler in manual mode
//! (no shared_preload_libraries); the worker only decides when to call it.
use crate::gucs;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// This database's tick period from set_tick_period_ms (0: none), read by the
/// worker with its periodic check of pgque.worker_config.
static TICK_PERIOD_OVERRIDE_MS: AtomicI32 = AtomicI32::new(0);

/// Records this database's set_tick_period_ms value (None: not set).
pub fn set_tick_period_override(ms: Option<i32>) {
    TICK_PERIOD_OVERRIDE_MS.store(ms.unwrap_or(0).max(0), Ordering::Relaxed);
}

/// The ticker's cadence: the database's set_tick_period_ms, else pgque.tick_period_ms.
pub fn tick_period() -> Duration {
    match TICK_PERIOD_OVERRIDE_MS.load(Ordering::Relaxed) {
        0 => gucs::tick_period(),
        ms => Duration::from_millis(ms as u64),
    }
}

pub struct Duty {
    /// Shown by pgque.status() as `duty:<name>`.
    pub name: &'static str,
    /// The statement the worker runs, in a transaction of its own.
    pub sql: &'static str,
    /// The cadence, read from a SIGHUP-reloadable setting.
    pub period: fn() -> Duration,
    /// Run at once when a committing producer wakes the worker.
    pub on_wake: bool,
}

pub const DUTIES: &[Duty] = &[
    Duty {
        name: "ticker",
        sql: "SELECT pgque.ticker()",
        period: tick_period,
        on_wake: true,
    },
    Duty {
        name: "maint",
        sql: "SELECT pgque.maint()",
        period: gucs::maint_period,
        on_wake: false,
    },
    Duty {
        name: "delayed",
        sql: "SELECT pgque.maint_delayed()",
        period: gucs::delayed_period,
        on_wake: false,
    },
    Duty {
        name: "job_maint",
        sql: "SELECT pgque.job_maint()",
        period: gucs::job_maint_period,
        on_wake: false,
    },
    Duty {
        name: "job_log",
        sql: "SELECT pgque.rotate_job_log()",
        period: gucs::job_maint_period,
        on_wake: false,
    },
    Duty {
        name: "schedules",
        sql: "SELECT pgque.run_schedules()",
        period: gucs::job_maint_period,
        on_wake: false,
    },
    Duty {
        name: "job_analyze",
        sql: "SELECT pgque.job_analyze()",
        period: gucs::analyze_interval,
        on_wake: false,
    },
    Duty {
        name: "history",
        // the retention from pgque.history_retention (SHOW's form, e.g. "1d",
        // is valid interval input); the function keeps its explicit argument
        // so that a manual run or a test can give another
        sql: "SELECT pgque.maint_history(pg_catalog.current_setting('pgque.history_retention')::interval)",
        period: history_period,
        on_wake: false,
    },
];

/// The history duty's cadence: it writes one row per queue and minute
/// (sql/36_history.sql), so a call within a minute already written only
/// looks; duty_due() wakes an idle worker at the next minute.
fn history_period() -> Duration {
    Duration::from_secs(20)
}

/// How soon a duty that just ran wants to run again, when that is before
/// its period: the schedules duty wakes for its next slot (as its last run
/// in this process left it), never sooner than SCHEDULES_MIN_GAP after a
/// run, so that a slot it cannot fire yet (another caller holds it) does not
/// make the worker spin.
pub fn sooner(name: &str) -> Option<Duration> {
    match name {
        "schedules" => crate::schedules::until_next_due().map(|d| d.max(SCHEDULES_MIN_GAP)),
        _ => None,
    }
}

/// Whether an idle worker runs duty `name` every pgque.idle_maint_period
/// (beside the times pgque.duty_due() knows): rotation copy-forward and
/// truncation steps, retention and GC wait on conditions no table announces
/// in advance (an old snapshot ending, a sealed segment's last job finishing).
pub fn idle_housekeeping(name: &str) -> bool {
    matches!(
        name,
        "maint" | "delayed" | "job_maint" | "job_log" | "job_analyze"
    )
}

/// See `sooner`.
pub const SCHEDULES_MIN_GAP: Duration = Duration::from_millis(20);

/// The worker's lock_timeout. Duties run one after another, so one waiting
/// on a lock would stop every other (the ticker of every queue included).
/// Each lock a duty takes on an object a caller can hold is only tried
/// (SKIP LOCKED rows, conditional table locks, try-locks of lanes and
/// claims; ANALYZE (SKIP_LOCKED)), so the busy object waits for the next
/// run; pgque's own locks cannot be taken by other roles (src/locks.rs).
/// This bounds whatever else a duty may meet (an administrator's open DDL
/// transaction): the duty fails after it, is logged once and backs off,
/// and the others run meanwhile.
pub const DUTY_LOCK_TIMEOUT: &std::ffi::CStr = c"1s";

/// A wake-up runs an `on_wake` duty at most this often (pgque.tick_coalesce_ms),
/// so a stream of small commits costs at most one tick per window rather than
/// one per commit; a commit that comes after a quiet window is ticked at once.
/// Each tick is a batch for every waiting consumer (a NOTIFY, a receive, an
/// ack, an empty receive: about 1 ms of server CPU here), so the window
/// trades server CPU per event at a steady rate against send -> receive
/// latency: benches/results/cpu.md measures both at several windows.
pub fn wake_min_interval() -> Duration {
    gucs::tick_coalesce()
}

/// How long after its last start a duty is due again. A failing duty backs off
/// exponentially from its period up to `max_backoff`; a period of zero means
/// the duty is switched off.
pub fn delay(
    period: Duration,
    consecutive_failures: u32,
    max_backoff: Duration,
) -> Option<Duration> {
    if period.is_zero() {
        return None;
    }
    if consecutive_failures == 0 {
        return Some(period);
    }
    let factor = 1u32
        .checked_shl(consecutive_failures.min(20))
        .unwrap_or(u32::MAX);
    let backoff = period.saturating_mul(factor).min(max_backoff.max(period));
    Some(backoff)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn healthy_duty_runs_on_its_period() {
        assert_eq!(delay(MS(100), 0, MS(30_000)), Some(MS(100)));
    }

    #[test]
    fn failing_duty_backs_off_exponentially_to_the_cap() {
        assert_eq!(delay(MS(100), 1, MS(30_000)), Some(MS(200)));
        assert_eq!(delay(MS(100), 3, MS(30_000)), Some(MS(800)));
        assert_eq!(delay(MS(100), 12, MS(30_000)), Some(MS(30_000)));
        assert_eq!(delay(MS(100), 1000, MS(30_000)), Some(MS(30_000)));
    }

    #[test]
    fn cap_never_shortens_a_long_period() {
        assert_eq!(delay(MS(600_000), 2, MS(30_000)), Some(MS(600_000)));
    }

    #[test]
    fn zero_period_switches_a_duty_off() {
        assert_eq!(delay(Duration::ZERO, 0, MS(1000)), None);
    }

    #[test]
    fn every_duty_calls_a_pgque_function() {
        for d in DUTIES {
            assert!(d.sql.starts_with("SELECT pgque."), "{}", d.name);
        }
        assert!(DUTIES.len() <= crate::shmem::MAX_DUTIES);
    }
}
