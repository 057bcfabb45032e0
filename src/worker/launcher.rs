//! The launcher: finds the databases that need a pgque worker.
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

/// How soon the launcher scans again when it ran out of worker slots.
const FULL_RETRY: Duration = Duration::from_secs(1);

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

/// Starts a worker in each database that may want one and has none (a
/// database a worker recently found without the extension, or stopped, is
/// left alone: shmem::is_unwanted). Returns the database it could not start
/// one in when PostgreSQL ran out of worker slots before the end of the
/// list (the caller scans again soon: the workers it started leave their
/// slots quickly where they are not wanted).
fn scan() -> Option<String> {
    let list = gucs::databases();
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    for db in list_databases() {
        let oid = db.oid.to_u32();
        if !allowed(&db.name, &list)
            || shmem::is_dropped(oid)
            || shmem::is_unwanted(oid, now)
            || shmem::find(oid).is_some()
        {
            continue;
        }
        if !super::spawn_db_worker(db.oid, false) {
            return Some(db.name);
        }
    }
    None
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pgque_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);
    shmem::set_launcher_pid(unsafe { pg_sys::MyProcPid });

    let mut next_scan = Instant::now();
    let mut logged_full: Option<Instant> = None;
    loop {
        if gucs::enabled() && Instant::now() >= next_scan {
            let cut_short = scan();
            let every = gucs::launcher_rescan();
            // A rescan interval of 0 means: only at start.
            next_scan = if every.is_zero() {
                Instant::now() + Duration::from_secs(86_400 * 365)
            } else {
                Instant::now() + every
            };
            if let Some(name) = cut_short {
                // the rest of the list soon, whatever the interval; said
                // once a minute at most
                next_scan = Instant::now() + FULL_RETRY;
                if logged_full.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    log!("pgque launcher: no free background worker slot for database {name}; raise max_worker_processes");
                    logged_full = Some(Instant::now());
                }
            }
        }
        let wait = next_scan
            .saturating_duration_since(Instant::now())
            .min(Duration::from_secs(10));
        if !BackgroundWorker::wait_latch(Some(wait.max(Duration::from_millis(10)))) {
            break;
        }
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            // A changed database list or a re-enable takes effect at once.
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
