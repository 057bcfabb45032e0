//! The launcher: finds the databases that need a pgque worker and starts
//! workers for them within the pool's bound (pool.rs).
use crate::pool;
use crate::{gucs, shmem};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use std::ffi::CStr;
use std::time::{Duration, Instant};

pub fn register() {
    BackgroundWorkerBuilder::new("pgque launcher")
        .set_type("pgque launcher")
        .set_library("pgque")
        .set_function("pgque_launcher_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

/// How soon the launcher tries again while databases wait for a worker.
const FULL_RETRY: Duration = Duration::from_secs(1);
/// As FULL_RETRY, while a database with work waits.
const WANTED_RETRY: Duration = Duration::from_millis(50);

/// A database the launcher may start a worker for.
struct Db {
    oid: pg_sys::Oid,
    name: String,
}

/// Reads pg_database (a shared catalog, readable without connecting to a
/// database): connectable, non-template, valid databases.
fn list_databases() -> Vec<Db> {
    let mut out = Vec::new();
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as _);
        let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
        loop {
            let tup = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tup.is_null() {
                break;
            }
            let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tup);
            // datconnlimit -2 marks a database whose DROP was interrupted.
            if (*form).datallowconn && !(*form).datistemplate && (*form).datconnlimit != -2 {
                let name = CStr::from_ptr((*form).datname.data.as_ptr())
                    .to_string_lossy()
                    .into_owned();
                out.push(Db {
                    oid: (*form).oid,
                    name,
                });
            }
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as _);
        pg_sys::PopActiveSnapshot();
        pg_sys::CommitTransactionCommand();
    }
    out
}

/// Whether `name` may have a worker under `pgque.databases`.
pub fn allowed(name: &str, list: &Option<Vec<String>>) -> bool {
    match list {
        None => true,
        Some(names) => names.iter().any(|n| n == name),
    }
}

/// Puts each database that may want a worker and has neither a worker nor
/// an entry in the pool's demand table into that table, due now: the pool
/// then starts a worker there (one that leaves at once where it is not
/// wanted, and parks where it finds nothing to do). A database recently
/// found without the extension, or stopped, is left alone
/// (shmem::is_unwanted). Returns how many did not fit in the table.
fn scan() -> usize {
    let list = gucs::databases();
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    let mut left_out = 0;
    for db in list_databases() {
        let oid = db.oid.to_u32();
        if !allowed(&db.name, &list)
            || shmem::is_dropped(oid)
            || shmem::is_unwanted(oid, now)
            || shmem::find(oid).is_some()
            || shmem::demand_of(oid).is_some()
        {
            continue;
        }
        if !shmem::want_at(oid, now) {
            left_out += 1;
        }
    }
    left_out
}

/// Starts workers for the databases of the demand table that want one now
/// or whose next duty is due, the longest-waiting first, within
/// pgque.max_workers and the worker slots PostgreSQL has free. Marks the
/// pool as waiting when some are left (workers then give their process
/// back, pool.rs) and wakes the idle ones so they do at once. Returns the
/// next due time (TimestampTz) the launcher must wake for, if any.
fn serve_pool() -> Option<i64> {
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    // A parked worker's process counts until it has exited.
    let exiting = shmem::reap_parked();
    let (table, running) = shmem::pool_view();
    let starting = table
        .iter()
        .filter(|d| d.starting(now, pool::START_GRACE_US))
        .count();
    let room = pool::room(gucs::max_workers(), running, starting);
    // Databases dropped, or found not to want a worker, leave the table.
    let picks: Vec<(u32, bool)> = pool::pick(&table, now, usize::MAX)
        .into_iter()
        .filter(|&(oid, _)| {
            // (and those a worker serves already: start() there)
            let gone =
                shmem::is_dropped(oid) || shmem::is_unwanted(oid, now) || shmem::serving(oid);
            if gone {
                shmem::forget_demand(oid);
            }
            !gone
        })
        .take(room)
        .collect();
    let mut refused = false;
    for (oid, wanted) in picks {
        shmem::mark_starting(oid, now);
        // Wanted now: a producer committed there, or start() ran (the
        // extension of a CREATE EXTENSION may not be visible yet: the
        // worker waits for it). Due only: no wait for the extension; a
        // database its last worker parked gets one pass of what is due (it
        // parks again if idle), one the launcher only looked at (new since
        // the server started) a worker that stays (dbworker, claim).
        let how = if wanted {
            super::spawn::Start::Wanted
        } else {
            super::spawn::Start::Due
        };
        if !super::spawn::spawn_db_worker(pg_sys::Oid::from(oid), how) {
            shmem::mark_starting(oid, 0);
            refused = true;
            break;
        }
    }
    let (table, _) = shmem::pool_view();
    // What still waits was refused a process (PostgreSQL's slots, or
    // pgque.max_workers): the pool is short.
    let (waiting, wanted) = pool::waiting_counts(&table, now);
    if waiting > 0 {
        if shmem::pool_waiting_since() == 0 {
            shmem::set_pool_waiting(now);
            for pid in shmem::idle_worker_pids() {
                crate::wake::set_latch_of(pid);
            }
        }
    } else {
        shmem::set_pool_waiting(0);
    }
    shmem::set_pool_wanted(if wanted > 0 { now } else { 0 });
    shmem::set_pool_short(
        if waiting > 0 { now } else { 0 },
        waiting as u32,
        wanted as u32,
    );
    if waiting > 0 {
        warn_short(now, refused);
    }
    let next = pool::next_due(&table, now);
    if exiting {
        // look again when the parked process is gone (a few milliseconds)
        Some(next.map_or(now + EXITING_RECHECK_US, |t| {
            t.min(now + EXITING_RECHECK_US)
        }))
    } else {
        next
    }
}

/// How soon the launcher looks again while a parked worker is exiting.
const EXITING_RECHECK_US: i64 = 5_000;

thread_local! {
    static WARNED_SHORT: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// A shortage is worth a WARNING once it has lasted this long (the pool
/// ends a short one itself: idle workers park, a probe leaves).
const SHORT_WARN_AFTER_US: i64 = 5_000_000;
/// At most one WARNING per this long.
const SHORT_WARN_EVERY: Duration = Duration::from_secs(300);

/// Says, with a WARNING at most every SHORT_WARN_EVERY, that databases have
/// waited for a worker process for SHORT_WARN_AFTER_US, and what to set.
/// `refused`: PostgreSQL had no free background worker slot (else
/// pgque.max_workers were running).
fn warn_short(now: i64, refused: bool) {
    let short = shmem::pool_short();
    if short.since == 0 || now - short.since < SHORT_WARN_AFTER_US {
        return;
    }
    WARNED_SHORT.with(|l| {
        if l.get().is_some_and(|t| t.elapsed() < SHORT_WARN_EVERY) {
            return;
        }
        l.set(Some(Instant::now()));
        let served = shmem::pool_databases();
        let mwp = unsafe { pg_sys::max_worker_processes };
        let cause = if refused || gucs::max_workers().is_none() {
            format!("PostgreSQL has no free background worker slot (max_worker_processes = {mwp})")
        } else {
            format!(
                "pgque.max_workers = {} workers run",
                gucs::max_workers().unwrap_or(0)
            )
        };
        ereport!(
            PgLogLevel::WARNING,
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
            format!(
                "pgque worker pool is short: {} databases wait for a worker process ({} with work now): {cause}",
                short.waiting, short.wanted
            ),
            format!(
                "pgque serves {served} databases here; set max_worker_processes to at least {} \
                 (one per database with pgque, pgque's launcher, PostgreSQL's logical replication launcher) \
                 plus what parallel query and replication workers use, and restart",
                served + 2
            )
        );
    });
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pgque_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);
    shmem::set_launcher_pid(unsafe { pg_sys::MyProcPid });

    let mut next_scan = Instant::now();
    let mut logged_table_full: Option<Instant> = None;
    loop {
        let mut wait = Duration::from_secs(10);
        if gucs::enabled() {
            if Instant::now() >= next_scan {
                let left_out = scan();
                let every = gucs::launcher_rescan();
                // A rescan interval of 0 means: only at start.
                next_scan = if every.is_zero() {
                    Instant::now() + Duration::from_secs(86_400 * 365)
                } else {
                    Instant::now() + every
                };
                if left_out > 0
                    && logged_table_full.is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
                {
                    log!("pgque launcher: {left_out} databases beyond the {} the worker pool keeps track of get no worker", shmem::DEMAND);
                    logged_table_full = Some(Instant::now());
                }
            }
            if let Some(due) = serve_pool() {
                let now = unsafe { pg_sys::GetCurrentTimestamp() };
                wait = wait.min(Duration::from_micros((due - now).max(0) as u64));
            }
            if shmem::pool_wanted_since() != 0 {
                // a database with work waits: PostgreSQL frees a slot
                // without telling us, and others (parallel query) take it
                wait = wait.min(WANTED_RETRY);
            } else if shmem::pool_waiting_since() != 0 {
                // a worker parking sets our latch; this is the fallback
                wait = wait.min(FULL_RETRY);
            }
            wait = wait.min(next_scan.saturating_duration_since(Instant::now()));
        }
        if !BackgroundWorker::wait_latch(Some(wait.max(Duration::from_millis(1)))) {
            break;
        }
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            // A changed database list or a re-enable takes effect at once:
            // databases left alone under the old list are looked at again.
            shmem::clear_unwanted();
            next_scan = Instant::now();
        }
    }
    // Exit status 1: if this was pg_terminate_backend rather than shutdown, the
    // postmaster restarts the launcher after its restart time.
    unsafe { pg_sys::proc_exit(1) };
}

#[cfg(test)]
mod tests {
    use super::allowed;

    #[test]
    fn database_filter() {
        assert!(allowed("app", &None));
        let list = Some(vec!["app".to_string(), "jobs".to_string()]);
        assert!(allowed("jobs", &list));
        assert!(!allowed("other", &list));
    }
}
