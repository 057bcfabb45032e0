//! Lifecycle and status: start(), stop(), status(), version().
//!
//! start/stop/status are SECURITY DEFINER (search_path pinned): the roles
//! that may call them have no rights on pgque.worker_config itself.
//!
//! In pgque the ticker is the background worker: start()/stop() switch this
//! database's worker on and off (persisted in pgque.worker_config) instead of
//! creating pg_cron jobs as PgQue does.
use crate::shmem;
use crate::worker::duties::DUTIES;
use pgrx::prelude::*;

/// The extension's version as built (the crate version, e.g. `'0.3.0'`). Touches nothing.
#[pg_extern]
#[search_path(pg_catalog, pgque, pg_temp)]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Switches this database's background worker on (persisted) and starts it.
/// Returns true when a worker was requested (pgque is preloaded), false in
/// manual mode, where pgque.ticker() and pgque.maint() must be scheduled by hand.
#[pg_extern(volatile, security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn start() -> bool {
    Spi::run("UPDATE pgque.worker_config SET worker_enabled = true, changed_at = now() WHERE NOT worker_enabled")
        .unwrap_or_else(|e| crate::error::raise(crate::error::WRONG_STATE, e.to_string()));
    if !shmem::available() {
        return false;
    }
    // The worker is launched when this transaction commits, so it reads
    // what start() switched on.
    crate::wake::spawn_at_commit();
    true
}

/// Switches this database's background worker off (persisted: it stays off
/// across restarts until start()). The worker leaves within a second of commit.
/// Returns true if it was on.
#[pg_extern(volatile, security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn stop() -> bool {
    let was_on = Spi::get_one::<bool>(
        "UPDATE pgque.worker_config SET worker_enabled = false, changed_at = now() \
         WHERE worker_enabled RETURNING true",
    )
    .unwrap_or(None)
    .unwrap_or(false);
    // Wake it so it notices at once after commit.
    crate::wake::at_commit();
    was_on
}

fn ts_text(ts: i64) -> String {
    if ts == 0 {
        return "never".into();
    }
    let t =
        unsafe { pgrx::datum::TimestampWithTimeZone::from_datum(pg_sys::Datum::from(ts), false) };
    t.map(|t| t.to_string()).unwrap_or_else(|| ts.to_string())
}

/// Whether this database's worker is switched on (pgque.worker_config; on
/// when the row is missing). On SPI's read path: pgrx's Spi::get_one takes
/// the write path, which assigns the transaction an id, and a hot standby
/// refuses that ("cannot assign TransactionIds during recovery").
pub(crate) fn worker_enabled() -> bool {
    Spi::connect(|c| {
        c.select(
            "SELECT worker_enabled FROM pgque.worker_config",
            Some(1),
            &[],
        )
        .ok()
        .and_then(|t| t.first().get_one::<bool>().ok().flatten())
    })
    .unwrap_or(true)
}

/// Whether this server is a standby (recovery in progress): pgque's tables
/// are read-only here and no worker runs until it is promoted.
pub(crate) fn in_recovery() -> bool {
    unsafe { pg_sys::RecoveryInProgress() }
}

/// status()'s `recovery` row on a standby.
fn recovery_row() -> (String, String, String) {
    (
        "recovery".into(),
        "standby".into(),
        "a hot standby replaying the primary's WAL: pgque's queues and jobs are read-only \
         here and no worker runs; the status and metrics functions show what was \
         replicated. Promotion (pg_promote()) starts the workers within a second."
            .into(),
    )
}

/// One row per component: `mode` (preloaded or manual), `recovery` (only
/// on a standby: status `standby`), `worker` (this database's worker:
/// running / parked / starting / stopped / standby / absent), `launcher`,
/// `worker_pool` (only while the pool is short of processes), `job_log`
/// (only while its truncation is held back) and `duty:<name>` for each duty (runs, failures, last run, last error).
/// Reads shared memory and pgque.worker_config; changes nothing and takes
/// no transaction id, so it answers on a hot standby too.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn status() -> TableIterator<
    'static,
    (
        name!(component, String),
        name!(status, String),
        name!(detail, String),
    ),
> {
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let enabled = worker_enabled();
    let standby = in_recovery();
    if !shmem::available() {
        rows.push((
            "mode".into(),
            "manual".into(),
            "pgque is not in shared_preload_libraries: no background worker. Call pgque.ticker() \
             (every 100 ms or so) and pgque.maint() (every second or so) from any scheduler."
                .into(),
        ));
        if standby {
            rows.push(recovery_row());
        }
        rows.push((
            "worker".into(),
            "absent".into(),
            "needs shared_preload_libraries = 'pgque'".into(),
        ));
        return TableIterator::new(rows);
    }
    rows.push((
        "mode".into(),
        "preloaded".into(),
        "duties run in the background worker".into(),
    ));
    if standby {
        // The launcher starts when recovery finishes (BgWorkerStartTime::
        // RecoveryFinished): nothing here can run a duty, and no slot or
        // pool entry of this server describes the primary's worker.
        rows.push(recovery_row());
        rows.push((
            "launcher".into(),
            "standby".into(),
            "starts when the server is promoted".into(),
        ));
        rows.push((
            "worker".into(),
            "standby".into(),
            if enabled {
                "no worker on a standby; one starts within a second of promotion"
            } else {
                "no worker on a standby; switched off by pgque.stop(), so none starts after promotion either"
            }
            .into(),
        ));
        return TableIterator::new(rows);
    }
    let lpid = shmem::launcher_pid();
    rows.push((
        "launcher".into(),
        if lpid > 0 { "running" } else { "absent" }.into(),
        format!("pid {lpid}"),
    ));
    let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
    let slot = shmem::snapshot(db);
    let parked = shmem::demand_of(db);
    match (slot, parked) {
        (Some(slot), _) if slot.pid > 0 => {
            rows.push((
                "worker".into(),
                if enabled { "running" } else { "stopping" }.into(),
                if slot.idle_since > 0 {
                    format!(
                        "pid {} since {}; idle since {}: sleeps until a duty is due or a producer commits",
                        slot.pid,
                        ts_text(slot.started_at),
                        ts_text(slot.idle_since)
                    )
                } else {
                    format!("pid {} since {}", slot.pid, ts_text(slot.started_at))
                },
            ));
            duty_rows(&mut rows, &slot);
        }
        (slot, Some(d)) if enabled && crate::gucs::enabled() => {
            let when = if d.wanted_since != 0 {
                format!("wanted since {}", ts_text(d.wanted_since))
            } else if d.due_at != 0 {
                format!("next duty due at {}", ts_text(d.due_at))
            } else {
                "nothing due".to_string()
            };
            rows.push((
                "worker".into(),
                "parked".into(),
                format!(
                    "no process ({when}): the worker pool starts one when a duty is due or a producer commits"
                ),
            ));
            // the counters of the last worker, which the slot keeps while parked
            if let Some(slot) = slot.filter(|s| s.db_oid == db) {
                duty_rows(&mut rows, &slot);
            }
        }
        _ => {
            let (state, detail) = if !enabled {
                (
                    "stopped",
                    "switched off by pgque.stop(); pgque.start() switches it on",
                )
            } else if !crate::gucs::enabled() {
                ("stopped", "pgque.enabled is off")
            } else {
                (
                    "starting",
                    "no worker yet; the launcher or pgque.start() starts one",
                )
            };
            rows.push(("worker".into(), state.into(), detail.into()));
        }
    }
    if let Some(row) = pool_short_row() {
        rows.push(row);
    }
    if let Some(row) = job_log_row() {
        rows.push(row);
    }
    TableIterator::new(rows)
}

/// status()'s `worker_pool` row while the worker pool is short: databases
/// of this server wait for a worker process it cannot start (launcher.rs
/// also logs a WARNING). None otherwise (the row is left out).
fn pool_short_row() -> Option<(String, String, String)> {
    let short = shmem::pool_short();
    if short.since == 0 {
        return None;
    }
    let mwp = unsafe { pg_sys::max_worker_processes };
    Some((
        "worker_pool".into(),
        "short".into(),
        format!(
            "since {}: {} databases wait for a worker process ({} with work now); \
             max_worker_processes = {mwp}, pgque serves {} databases: raise it (docs/operations.md, the pool)",
            ts_text(short.since),
            short.waiting,
            short.wanted,
            shmem::pool_databases()
        ),
    ))
}

/// How long the job log's due truncation may wait on other sessions' locks
/// before status() says so: a reader's statement that reads the log holds
/// them briefly all the time, a transaction left open holds them for good.
const TRUNCATION_BLOCKED_AFTER_S: f64 = 60.0;

/// status()'s `job_log` row when the due truncation of a sealed segment has
/// been held back by other sessions' locks for a while: who holds them.
/// None otherwise (the row is left out).
fn job_log_row() -> Option<(String, String, String)> {
    let b = crate::jobs::log::rotate::blockers();
    let due = b.first()?.due_for_s;
    if due < TRUNCATION_BLOCKED_AFTER_S {
        return None;
    }
    let who: Vec<String> = b
        .iter()
        .map(|x| {
            format!(
                "pid {} ({}, {:?}, {}, transaction open {:.0} s)",
                x.pid,
                x.usename.as_deref().unwrap_or("?"),
                x.application_name.as_deref().unwrap_or(""),
                x.state.as_deref().unwrap_or("?"),
                x.xact_age_s.unwrap_or(0.0)
            )
        })
        .collect();
    Some((
        "job_log".into(),
        "blocked".into(),
        format!(
            "truncation of segment {} due for {due:.0} s, held back by the locks of {}: end those transactions (pgque.job_log_blockers() lists them)",
            b[0].seg,
            who.join(", ")
        ),
    ))
}

/// status()'s `duty:<name>` rows from a worker slot's counters.
fn duty_rows(rows: &mut Vec<(String, String, String)>, slot: &shmem::DbSlot) {
    for (i, d) in DUTIES.iter().enumerate() {
        let st = &slot.duties[i];
        let state = if st.runs == 0 {
            "pending"
        } else if st.consecutive_failures > 0 {
            "failing"
        } else {
            "ok"
        };
        let mut detail = format!(
            "runs={} failures={} last_run={} last_ok={} last_ms={:.3}",
            st.runs,
            st.failures,
            ts_text(st.last_run),
            ts_text(st.last_ok),
            st.last_duration_us as f64 / 1000.0
        );
        if let Some(e) = st.last_error() {
            detail.push_str(&format!(
                " last_error={e:?} at {}",
                ts_text(st.last_failure)
            ));
        }
        rows.push((format!("duty:{}", d.name), state.into(), detail));
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn version_is_the_crate_version() {
        assert_eq!(
            Spi::get_one::<String>("SELECT pgque.version()").unwrap(),
            Some(env!("CARGO_PKG_VERSION").into())
        );
    }

    #[pg_test]
    fn stop_then_start_flips_the_persisted_switch() {
        assert_eq!(
            Spi::get_one::<bool>("SELECT pgque.stop()").unwrap(),
            Some(true)
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT pgque.stop()").unwrap(),
            Some(false)
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT worker_enabled FROM pgque.worker_config").unwrap(),
            Some(false)
        );
        Spi::run("SELECT pgque.start()").unwrap();
        assert_eq!(
            Spi::get_one::<bool>("SELECT worker_enabled FROM pgque.worker_config").unwrap(),
            Some(true)
        );
    }

    #[pg_test]
    fn status_reports_mode_and_worker() {
        // The test server preloads pgque (lib.rs pg_test::postgresql_conf_options).
        let mode =
            Spi::get_one::<String>("SELECT status FROM pgque.status() WHERE component = 'mode'")
                .unwrap();
        assert_eq!(mode.as_deref(), Some("preloaded"));
        let n =
            Spi::get_one::<i64>("SELECT count(*) FROM pgque.status() WHERE component = 'worker'")
                .unwrap();
        assert_eq!(n, Some(1));
    }
}
