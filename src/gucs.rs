//! Every `pgque.*` setting, in one place, with typed accessors.
//!
//! Worker cadences are `PGC_SIGHUP`: change them in postgresql.conf (or with
//! ALTER SYSTEM) and `SELECT pg_reload_conf()`; the workers pick them up on
//! their next loop. Add new settings to the table in `init()` and give each an
//! accessor below; the README lists them all.
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CString;
use std::time::Duration;

// ---- background workers -------------------------------------------------
pub static ENABLED: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static DATABASES: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static LAUNCHER_RESCAN_S: GucSetting<i32> = GucSetting::<i32>::new(60);
pub static DUTY_BACKOFF_MAX_MS: GucSetting<i32> = GucSetting::<i32>::new(30_000);
pub static WORKER_RESTART_S: GucSetting<i32> = GucSetting::<i32>::new(1);
pub static IDLE_AFTER_MS: GucSetting<i32> = GucSetting::<i32>::new(1_000);
pub static IDLE_CHECK_S: GucSetting<i32> = GucSetting::<i32>::new(5);
pub static IDLE_MAINT_S: GucSetting<i32> = GucSetting::<i32>::new(60);
pub static MAX_WORKERS: GucSetting<i32> = GucSetting::<i32>::new(0);
pub static WORKER_IDLE_EXIT_S: GucSetting<i32> = GucSetting::<i32>::new(0);
pub static WORKER_TURN_S: GucSetting<i32> = GucSetting::<i32>::new(10);

// ---- event queues -------------------------------------------------------
pub static TICK_PERIOD_MS: GucSetting<i32> = GucSetting::<i32>::new(100);
// 20 ms, measured against 2, 5 and 50 in benches/results/cpu.md ("the tick-on-commit
// window"): the knee of server CPU per event against send -> receive latency.
pub static TICK_COALESCE_MS: GucSetting<i32> = GucSetting::<i32>::new(20);
pub static MAINT_PERIOD_MS: GucSetting<i32> = GucSetting::<i32>::new(1_000);
pub static LEDGER_ROTATION_S: GucSetting<i32> = GucSetting::<i32>::new(300);
pub static DELAYED_PERIOD_MS: GucSetting<i32> = GucSetting::<i32>::new(100);
pub static BATCH_MAX_EVENTS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
pub static METADATA_ROTATION_MS: GucSetting<i32> = GucSetting::<i32>::new(60_000);
pub static MAX_CONSUMERS_PER_QUEUE: GucSetting<i32> = GucSetting::<i32>::new(1_000);
/// The longest a waiting call (receive(q, c, n, wait), dispatch_wait, ...)
/// sleeps: its statement's snapshot holds back the xmin horizon meanwhile
/// (src/waiters.rs).
pub static MAX_WAIT_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);

// ---- job queues ---------------------------------------------------------
pub static JOB_MAINT_PERIOD_MS: GucSetting<i32> = GucSetting::<i32>::new(1_000);
pub static JOB_EVENT_RETENTION_S: GucSetting<i32> = GucSetting::<i32>::new(7 * 86_400);
pub static COMPLETED_JOB_RETENTION_S: GucSetting<i32> = GucSetting::<i32>::new(86_400);
pub static FAILED_JOB_RETENTION_S: GucSetting<i32> = GucSetting::<i32>::new(7 * 86_400);
pub static ANALYZE_INTERVAL_S: GucSetting<i32> = GucSetting::<i32>::new(300);
pub static JOB_LOG: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static JOB_LOG_ROTATION_S: GucSetting<i32> = GucSetting::<i32>::new(3_600);
/// Most job-log lanes (priority x shard) one queue may have: a writer picks
/// the priorities, and every lane costs dispatch, rotation and the status
/// views a probe (DESIGN.md 25). 64: every shard count (1..64) at one
/// priority, or a handful of priorities x shards.
pub static JOB_LANES_PER_QUEUE: GucSetting<i32> = GucSetting::<i32>::new(64);

// ---- dashboard history ----------------------------------------------------
// Read by the history duty's SQL (current_setting), which passes it to
// pgque.maint_history: no Rust accessor.
pub static HISTORY_RETENTION_S: GucSetting<i32> = GucSetting::<i32>::new(86_400);

fn int(
    name: &'static std::ffi::CStr,
    short: &'static std::ffi::CStr,
    setting: &'static GucSetting<i32>,
    min: i32,
    max: i32,
    unit: GucFlags,
) {
    GucRegistry::define_int_guc(
        name,
        short,
        c"",
        setting,
        min,
        max,
        GucContext::Sighup,
        unit,
    );
}

/// Registers every setting. Called from `_PG_init` in every process that loads
/// the library, so `SHOW pgque.x` works with or without preload.
pub fn init() {
    GucRegistry::define_int_guc(
        c"pgque.ledger_rotation_period",
        c"How long the idempotency-key and delayed-event ledgers write one piece before switching to the other.",
        c"Superusers may SET it per session (tests, manual maint_idem() calls).",
        &LEDGER_ROTATION_S,
        1,
        86_400 * 30,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_bool_guc(
        c"pgque.enabled",
        c"Run pgque background workers (needs shared_preload_libraries).",
        c"Off stops every database worker; duties can still be called by hand.",
        &ENABLED,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"pgque.databases",
        c"Comma-separated database names that may get a pgque worker; empty means all.",
        c"",
        &DATABASES,
        GucContext::Sighup,
        GucFlags::default(),
    );
    int(
        c"pgque.launcher_rescan_interval",
        c"How often the launcher looks for databases with pgque whose worker is missing.",
        &LAUNCHER_RESCAN_S,
        0,
        86_400,
        GucFlags::UNIT_S,
    );
    int(
        c"pgque.duty_backoff_max",
        c"Longest back-off after a duty fails repeatedly.",
        &DUTY_BACKOFF_MAX_MS,
        10,
        3_600_000,
        GucFlags::UNIT_MS,
    );
    int(
        c"pgque.worker_restart_time",
        c"Delay before PostgreSQL restarts a pgque worker that died.",
        &WORKER_RESTART_S,
        1,
        3_600,
        GucFlags::UNIT_S,
    );
    int(
        c"pgque.idle_after",
        c"How long without a producer's wake-up before a database worker goes idle (0: never).",
        &IDLE_AFTER_MS,
        0,
        3_600_000,
        GucFlags::UNIT_MS,
    );
    int(
        c"pgque.idle_check_interval",
        c"Longest sleep of an idle worker before it re-reads pgque.duty_due().",
        &IDLE_CHECK_S,
        1,
        3_600,
        GucFlags::UNIT_S,
    );
    int(
        c"pgque.idle_maint_period",
        c"How often an idle worker runs the housekeeping duties whose next run is not known in advance.",
        &IDLE_MAINT_S,
        1,
        86_400,
        GucFlags::UNIT_S,
    );
    int(
        c"pgque.max_workers",
        c"Most database workers at once (0: as many as max_worker_processes allows); more databases are served in turns.",
        &MAX_WORKERS,
        0,
        crate::shmem::MAX_DBS as i32,
        GucFlags::default(),
    );
    int(
        c"pgque.worker_idle_exit",
        c"How long a database worker stays idle before it gives its process back (0, the default: until another database needs the slot).",
        &WORKER_IDLE_EXIT_S,
        0,
        86_400,
        GucFlags::UNIT_S,
    );
    int(
        c"pgque.worker_turn",
        c"How long a busy database worker keeps its process while another database waits for one.",
        &WORKER_TURN_S,
        1,
        86_400,
        GucFlags::UNIT_S,
    );
    int(
        c"pgque.tick_period_ms",
        c"Ticker cadence: how often the worker runs pgque.ticker().",
        &TICK_PERIOD_MS,
        1,
        60_000,
        GucFlags::UNIT_MS,
    );
    int(
        c"pgque.tick_coalesce_ms",
        c"Least time between two ticks a producer's commit asks for: commits within it share one tick (and one batch).",
        &TICK_COALESCE_MS,
        1,
        1_000,
        GucFlags::UNIT_MS,
    );
    int(
        c"pgque.max_wait",
        c"The longest a waiting receive, next_batch_wait or dispatch sleeps inside the server; a longer wait asked for is cut to it.",
        &MAX_WAIT_MS,
        0,
        3_600_000,
        GucFlags::UNIT_MS,
    );
    int(
        c"pgque.delayed_period_ms",
        c"How often the worker promotes due delayed events (send_at).",
        &DELAYED_PERIOD_MS,
        1,
        3_600_000,
        GucFlags::UNIT_MS,
    );
    int(
        c"pgque.maint_period_ms",
        c"Event-queue maintenance cadence: retries, rotation, delayed events, idempotency-key GC.",
        &MAINT_PERIOD_MS,
        10,
        3_600_000,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pgque.batch_max_events",
        c"Most events in one batch opened by next_batch (receive uses its max_return).",
        c"A bigger tick range is cut into several batches.",
        &BATCH_MAX_EVENTS,
        1,
        crate::error::MAX_RETURN,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pgque.max_consumers_per_queue",
        c"Most consumers one event queue may have: plain ones, each slot of a partitioned one, cooperative members.",
        c"Each consumer holds back the queue's table rotation and is read by metrics() and get_consumer_info(); a role that may subscribe could otherwise make any number. Superuser-only, so that such a role cannot raise it.",
        &MAX_CONSUMERS_PER_QUEUE,
        1,
        1_000_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pgque.metadata_rotation_period",
        c"How often maint() switches the tick/batch metadata piece and truncates the old one.",
        c"",
        &METADATA_ROTATION_MS,
        0,
        86_400_000,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    int(
        c"pgque.job_maint_period_ms",
        c"Job-queue maintenance cadence: lease rescue, scheduled promotion, sweeps.",
        &JOB_MAINT_PERIOD_MS,
        10,
        3_600_000,
        GucFlags::UNIT_MS,
    );
    int(
        c"pgque.job_event_retention",
        c"How long job_events rows are kept.",
        &JOB_EVENT_RETENTION_S,
        0,
        i32::MAX,
        GucFlags::UNIT_S,
    );
    int(
        c"pgque.history_retention",
        c"How long the history duty keeps the dashboard's minute rollup (1 minute .. 31 days).",
        &HISTORY_RETENTION_S,
        60,
        31 * 86_400,
        GucFlags::UNIT_S,
    );
    int(
        c"pgque.completed_job_retention",
        c"How long completed and cancelled jobs are kept.",
        &COMPLETED_JOB_RETENTION_S,
        0,
        i32::MAX,
        GucFlags::UNIT_S,
    );
    int(
        c"pgque.failed_job_retention",
        c"How long failed jobs are kept.",
        &FAILED_JOB_RETENTION_S,
        0,
        i32::MAX,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_bool_guc(
        c"pgque.job_log",
        c"Store ordinary jobs (strict_fifo queue, ready now, no actor, identity or unique key) in the job log.",
        c"Off: every job is a row of pgque.jobs, as before 0.4.0. Read at enqueue.",
        &JOB_LOG,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pgque.job_lanes_per_queue",
        c"Most job-log lanes (priority x shard) a job queue may have.",
        c"A job of a lane beyond it is stored in pgque.jobs, in the same dispatch order. Read when an enqueue would create a lane.",
        &JOB_LANES_PER_QUEUE,
        1,
        10_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pgque.job_log_rotation_period",
        c"How long the job log writes one segment before switching to the next.",
        c"A sealed segment is truncated once its jobs were handed out and finished and pgque.completed_job_retention has passed.",
        &JOB_LOG_ROTATION_S,
        0,
        86_400 * 30,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    int(
        c"pgque.analyze_interval",
        c"How often the worker refreshes ANALYZE on tables autovacuum does not analyze well.",
        &ANALYZE_INTERVAL_S,
        0,
        86_400 * 7,
        GucFlags::UNIT_S,
    );
    // Every pgque.* name is one of the above: a misspelt one (in
    // postgresql.conf, ALTER SYSTEM or SET) is reported instead of becoming a
    // placeholder that nothing reads (the server logs a WARNING for one in the
    // configuration file; SET raises 42602). PostgreSQL 14 has no reserved
    // prefixes: it can only warn about the placeholders that exist now, and a
    // later SET of a misspelt name still makes one.
    #[cfg(not(feature = "pg14"))]
    unsafe {
        pgrx::pg_sys::MarkGUCPrefixReserved(c"pgque".as_ptr())
    };
    #[cfg(feature = "pg14")]
    unsafe {
        pgrx::pg_sys::EmitWarningsOnPlaceholders(c"pgque".as_ptr())
    };
}

fn ms(v: i32) -> Duration {
    Duration::from_millis(v.max(0) as u64)
}
fn secs(v: i32) -> Duration {
    Duration::from_secs(v.max(0) as u64)
}

pub fn enabled() -> bool {
    ENABLED.get()
}
/// The databases allowed a worker, or None when every database is.
pub fn databases() -> Option<Vec<String>> {
    let raw = DATABASES.get()?;
    let list: Vec<String> = raw
        .to_string_lossy()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if list.is_empty() {
        None
    } else {
        Some(list)
    }
}
pub fn launcher_rescan() -> Duration {
    secs(LAUNCHER_RESCAN_S.get())
}
pub fn duty_backoff_max() -> Duration {
    ms(DUTY_BACKOFF_MAX_MS.get())
}
pub fn worker_restart() -> Duration {
    secs(WORKER_RESTART_S.get())
}
/// How long without a wake-up before the worker goes idle; None: never.
pub fn idle_after() -> Option<Duration> {
    let v = IDLE_AFTER_MS.get();
    (v > 0).then(|| ms(v))
}
pub fn idle_check_interval() -> Duration {
    secs(IDLE_CHECK_S.get())
}
pub fn idle_maint_period() -> Duration {
    secs(IDLE_MAINT_S.get())
}
/// Most database workers at once; None: no bound of pgque's own.
pub fn max_workers() -> Option<usize> {
    let v = MAX_WORKERS.get();
    (v > 0).then_some(v as usize)
}
/// How long an idle worker keeps its process; None: until a database waits for one.
pub fn worker_idle_exit() -> Option<Duration> {
    let v = WORKER_IDLE_EXIT_S.get();
    (v > 0).then(|| secs(v))
}
pub fn worker_turn() -> Duration {
    secs(WORKER_TURN_S.get())
}
pub fn tick_period() -> Duration {
    ms(TICK_PERIOD_MS.get())
}
/// The coalescing window of the tick on commit (duties::wake_min_interval).
pub fn tick_coalesce() -> Duration {
    ms(TICK_COALESCE_MS.get())
}
/// The cap of every server-side wait (src/waiters.rs).
pub fn max_wait() -> Duration {
    ms(MAX_WAIT_MS.get())
}
pub fn maint_period() -> Duration {
    ms(MAINT_PERIOD_MS.get())
}
pub fn batch_max_events() -> i64 {
    BATCH_MAX_EVENTS.get().max(1) as i64
}
pub fn max_consumers_per_queue() -> i64 {
    MAX_CONSUMERS_PER_QUEUE.get() as i64
}
pub fn metadata_rotation_period_ms() -> i64 {
    METADATA_ROTATION_MS.get().max(0) as i64
}
pub fn job_maint_period() -> Duration {
    ms(JOB_MAINT_PERIOD_MS.get())
}
pub fn job_event_retention() -> Duration {
    secs(JOB_EVENT_RETENTION_S.get())
}
pub fn completed_job_retention() -> Duration {
    secs(COMPLETED_JOB_RETENTION_S.get())
}
pub fn failed_job_retention() -> Duration {
    secs(FAILED_JOB_RETENTION_S.get())
}
/// Whether eligible batches go to the job log (`pgque.job_log`).
pub fn job_log() -> bool {
    JOB_LOG.get()
}
/// Most lanes per job queue (`pgque.job_lanes_per_queue`).
pub fn job_lanes_per_queue() -> i32 {
    JOB_LANES_PER_QUEUE.get()
}
/// Segment switch period of the job log (`pgque.job_log_rotation_period`).
pub fn job_log_rotation_period_s() -> i32 {
    JOB_LOG_ROTATION_S.get()
}
pub fn analyze_interval() -> Duration {
    secs(ANALYZE_INTERVAL_S.get())
}

/// `pgque.ledger_rotation_period` in seconds.
pub fn ledger_rotation_period_s() -> i32 {
    LEDGER_ROTATION_S.get()
}

/// Promotion cadence of delayed events (`pgque.delayed_period_ms`).
pub fn delayed_period() -> Duration {
    ms(DELAYED_PERIOD_MS.get())
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::test_util::{one, sqlstate};
    use pgrx::prelude::*;

    /// The pgque prefix is reserved: a misspelt setting is an error (42602),
    /// not a placeholder nothing reads; the real ones still set. PostgreSQL 14
    /// cannot reserve a prefix, so there the misspelt name is accepted as a
    /// placeholder (documented in README's settings section).
    #[pg_test]
    fn a_misspelt_pgque_setting_is_refused() {
        let want = if cfg!(feature = "pg14") {
            "ok"
        } else {
            "42602"
        };
        assert_eq!(sqlstate("SET LOCAL pgque.job_logg = off"), want);
        assert_eq!(
            sqlstate("SELECT set_config('pgque.tick_period', '5', true)"),
            want
        );
        assert_eq!(sqlstate("SET LOCAL pgque.job_log = off"), "ok");
        assert_eq!(
            one::<String>("SELECT current_setting('pgque.job_log')"),
            Some("off".into())
        );
    }
}
