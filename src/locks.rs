//! pgque's own transaction-scoped locks (lanes, claims, job queues), which no
//! other role can take.
//!
//! They are advisory-type heavyweight locks, so they behave as
//! `pg_advisory_xact_lock` does (released at the end of the transaction,
//! visible in `pg_locks` as locktype `advisory`), but with a lock tag that no
//! SQL-callable function of PostgreSQL builds: `pg_advisory_*` always set the
//! tag's fourth field to 1 (one int8 key) or 2 (two int4 keys), and these set
//! it to the low 16 bits of the pgque class (`objsubid` in `pg_locks`), with
//! the 64-bit key in the first two (`classid` = high half, `objid` = low half).
//! With the plain advisory functions, which PUBLIC may call, any connected
//! role could take a lane's or a claim's lock with its fixed, computable key
//! and stall dispatch, completion and the worker's duties behind it.
//!
//! The SQL wrappers (`pgque.xact_lock` and friends) are granted to no role:
//! only pgque's SECURITY DEFINER functions (running as the extension's owner)
//! call them, from inside their statements.
//!
//! Until `ALTER EXTENSION pgque UPDATE` has created them, a database with an
//! older schema runs this library with its released lock protocol: `sql`
//! then turns pgque's lock calls back into the `pg_advisory_*` ones, and
//! `lock` / `try_lock` take those, so every backend of that database keeps
//! taking the same locks (the switch happens when the update commits).
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

thread_local! {
    /// The extension OID whose schema was seen to have the lock functions.
    static INSTALLED_IN: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    /// The released-protocol text of each statement, by the address of its
    /// text (leaked: kept plans refer to them by address, see jobs::stmt).
    static FALLBACK: RefCell<HashMap<usize, &'static str>> = RefCell::new(HashMap::new());
}

/// Whether this database's pgque schema has pgque.try_xact_lock (0.7.0+).
/// Looked up once per backend and extension once present.
pub fn installed() -> bool {
    unsafe {
        let ext = pg_sys::get_extension_oid(c"pgque".as_ptr(), true);
        if ext == pg_sys::InvalidOid {
            return false;
        }
        if INSTALLED_IN.with(|c| c.get()) == ext {
            return true;
        }
        let mut names: *mut pg_sys::List = std::ptr::null_mut();
        for n in [c"pgque", c"try_xact_lock"] {
            names = pg_sys::lappend(
                names,
                pg_sys::makeString(pg_sys::pstrdup(n.as_ptr())).cast(),
            );
        }
        let args = [pg_sys::INT4OID, pg_sys::INT8OID];
        let found = pg_sys::LookupFuncName(names, 2, args.as_ptr(), true) != pg_sys::InvalidOid;
        if found {
            INSTALLED_IN.with(|c| c.set(ext));
        }
        found
    }
}

/// `stmt` as this database runs it: itself, or, on a schema older than the
/// lock functions, with pgque's lock calls turned into `pg_advisory_*` ones
/// (every key pgque passes fits their int4 form).
pub fn sql(stmt: &'static str) -> &'static str {
    if !stmt.contains("xact_lock") || installed() {
        return stmt;
    }
    let key = stmt.as_ptr() as usize;
    FALLBACK.with(|m| {
        *m.borrow_mut().entry(key).or_insert_with(|| {
            let old = stmt
                .replace(
                    "pgque.xact_lock_shared(",
                    "pg_catalog.pg_advisory_xact_lock_shared(",
                )
                .replace(
                    "pgque.try_xact_lock(",
                    "pg_catalog.pg_try_advisory_xact_lock(",
                )
                .replace("pgque.xact_lock(", "pg_catalog.pg_advisory_xact_lock(");
            Box::leak(old.into_boxed_str())
        })
    })
}

/// The released protocol's lock of (`class`, `key` as int4).
fn advisory_int4(class: i32, key: i64, wait: bool) -> bool {
    let f = if wait {
        pg_sys::F_PG_ADVISORY_XACT_LOCK_INT4_INT4
    } else {
        pg_sys::F_PG_TRY_ADVISORY_XACT_LOCK_INT4_INT4
    };
    let d = unsafe {
        pg_sys::OidFunctionCall2Coll(
            pg_sys::Oid::from(f),
            pg_sys::InvalidOid,
            pg_sys::Datum::from(class),
            pg_sys::Datum::from(key as i32),
        )
    };
    wait || d.value() != 0
}

/// The lock tag of (`class`, `key`) in the current database.
fn tag(class: i32, key: i64) -> pg_sys::LOCKTAG {
    let field4 = class as u32 as u16;
    // 1 and 2 are the tags of pg_advisory_*; no pgque class may map there.
    debug_assert!(field4 > 2);
    pg_sys::LOCKTAG {
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: ((key as u64) >> 32) as u32,
        locktag_field3: key as u64 as u32,
        locktag_field4: field4,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

fn acquire(class: i32, key: i64, mode: u32, dont_wait: bool) -> bool {
    let t = tag(class, key);
    let r = unsafe { pg_sys::LockAcquire(&t, mode as pg_sys::LOCKMODE, false, dont_wait) };
    if r == pg_sys::LockAcquireResult::LOCKACQUIRE_OK && class == LANE_CLASS && !dont_wait {
        count_lane_lock();
    }
    r != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// The lock class of a job lane (jobs::LANE_LOCK_CLASS): an enqueue takes
/// one per (queue, priority, shard) it writes and holds it to commit.
pub const LANE_CLASS: i32 = 0x6A6F_626C; // "jobl"

thread_local! {
    /// (start time of the transaction, lane locks it took) of this backend.
    static LANE_LOCKS: Cell<(i64, usize)> = const { Cell::new((0, 0)) };
}

/// Counts a lane lock newly taken by this transaction; 54000 past
/// 4 x max_locks_per_transaction. Priorities run -1000..1000 and lanes are
/// per queue, so a producer's transaction that enqueued into many
/// priorities of many queues held that many entries of the cluster's
/// shared lock table to its commit, and could fill it: "out of shared
/// memory" for every session of every database meanwhile. The lock table
/// is sized for max_locks_per_transaction per backend on average; one
/// transaction may take four times that in lanes. Try-locks are not
/// counted: only the duties take lanes that way (promotion), in batches of
/// their own bounded size, and refusing them would stall the duty for good.
fn count_lane_lock() {
    let xact = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    let max = 4 * unsafe { pg_sys::max_locks_per_xact }.max(1) as usize;
    let n = LANE_LOCKS.with(|c| {
        let (t, n) = c.get();
        let n = if t == xact { n + 1 } else { 1 };
        c.set((xact, n));
        n
    });
    if n > max {
        crate::error::raise_detail(
            crate::error::LIMIT_EXCEEDED,
            format!("this transaction has taken {max} job lane locks, the most one transaction may hold"),
            format!(
                "An enqueue takes one lock per queue and priority it writes, held to commit; the limit is 4 x max_locks_per_transaction ({}). Enqueue into fewer priorities per transaction, or commit in between.",
                unsafe { pg_sys::max_locks_per_xact }
            ),
        );
    }
}

/// Takes (`class`, `key`) exclusively until the transaction ends (waits).
pub fn lock(class: i32, key: i64) {
    if !installed() {
        advisory_int4(class, key, true);
        return;
    }
    acquire(class, key, pg_sys::ExclusiveLock, false);
}

/// Takes (`class`, `key`) exclusively if no one holds it; false otherwise.
pub fn try_lock(class: i32, key: i64) -> bool {
    if !installed() {
        return advisory_int4(class, key, false);
    }
    acquire(class, key, pg_sys::ExclusiveLock, true)
}

/// Takes (`class`, `key`) shared until the transaction ends (waits): only
/// an exclusive holder of the same lock excludes it.
pub fn lock_shared(class: i32, key: i64) {
    if !installed() {
        unsafe {
            pg_sys::OidFunctionCall2Coll(
                pg_sys::Oid::from(pg_sys::F_PG_ADVISORY_XACT_LOCK_SHARED_INT4_INT4),
                pg_sys::InvalidOid,
                pg_sys::Datum::from(class),
                pg_sys::Datum::from(key as i32),
            );
        }
        return;
    }
    acquire(class, key, pg_sys::ShareLock, false);
}

/// Takes (`class`, `key`) shared if no one holds it exclusively (nor waits
/// for it); false otherwise.
pub fn try_lock_shared(class: i32, key: i64) -> bool {
    if !installed() {
        let d = unsafe {
            pg_sys::OidFunctionCall2Coll(
                pg_sys::Oid::from(pg_sys::F_PG_TRY_ADVISORY_XACT_LOCK_SHARED_INT4_INT4),
                pg_sys::InvalidOid,
                pg_sys::Datum::from(class),
                pg_sys::Datum::from(key as i32),
            )
        };
        return d.value() != 0;
    }
    acquire(class, key, pg_sys::ShareLock, true)
}

/// Takes (`class`, `key`) exclusively, waiting at most `timeout` (a
/// lock_timeout value, e.g. c"200ms"); false when the wait timed out or
/// ended in a deadlock, with nothing held. See `within`.
pub fn lock_within(class: i32, key: i64, timeout: &std::ffi::CStr) -> bool {
    within(timeout, || {
        if installed() {
            acquire(class, key, pg_sys::ExclusiveLock, false);
        } else {
            advisory_int4(class, key, true);
        }
    })
}

/// Runs `take` (which takes locks, waiting) with lock_timeout = `timeout`,
/// in a subtransaction: true and the locks kept (the subtransaction's locks
/// pass to the transaction) when it returned; false when a lock wait ran
/// out of time (55P03) or was a deadlock's victim (40P01): the
/// subtransaction is rolled back, which takes this backend out of the wait
/// queue and releases what `take` had got. Any other error is raised.
///
/// This is how a worker duty waits for a lock that callers take all the
/// time without ever starving (a try-lock fails whenever one holder is in
/// flight; a queued request is served as soon as the holders it waits for
/// end, and holds new requesters back meanwhile), and without stopping the
/// other duties for longer than `timeout`.
pub fn within(timeout: &std::ffi::CStr, take: impl FnOnce()) -> bool {
    unsafe {
        let cx = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(cx);
        let rollback = move || {
            pg_sys::MemoryContextSwitchTo(cx);
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            pg_sys::MemoryContextSwitchTo(cx);
            pg_sys::CurrentResourceOwner = owner;
            false
        };
        let take = std::panic::AssertUnwindSafe(take);
        PgTryBuilder::new(move || {
            let take = take;
            let nest = pg_sys::NewGUCNestLevel();
            pg_sys::set_config_option(
                c"lock_timeout".as_ptr(),
                timeout.as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
            (take.0)();
            pg_sys::AtEOXact_GUC(true, nest);
            pg_sys::ReleaseCurrentSubTransaction();
            pg_sys::MemoryContextSwitchTo(cx);
            pg_sys::CurrentResourceOwner = owner;
            true
        })
        .catch_when(PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE, |_| rollback())
        .catch_when(PgSqlErrorCode::ERRCODE_T_R_DEADLOCK_DETECTED, |_| {
            rollback()
        })
        .catch_others(|e| {
            rollback();
            e.rethrow()
        })
        .execute()
    }
}

/// xact_lock(class, key): `lock` for pgque's statements (granted to no role).
#[pg_extern(parallel_unsafe)]
fn xact_lock(class: i32, key: i64) {
    acquire(class, key, pg_sys::ExclusiveLock, false);
}

/// xact_lock_shared(class, key): the shared mode of `xact_lock` (waits).
#[pg_extern(parallel_unsafe)]
fn xact_lock_shared(class: i32, key: i64) {
    acquire(class, key, pg_sys::ShareLock, false);
}

/// try_xact_lock(class, key) → whether it took the lock: `try_lock` for
/// pgque's statements (granted to no role).
#[pg_extern(parallel_unsafe)]
fn try_xact_lock(class: i32, key: i64) -> bool {
    acquire(class, key, pg_sys::ExclusiveLock, true)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn pgque_locks_are_not_the_advisory_locks_of_the_same_numbers() {
        // the same class and key through the PUBLIC advisory functions
        // is another lock: taking both in one transaction shows two entries
        Spi::run("SELECT pgque.xact_lock(1785684580, 7)").unwrap();
        Spi::run("SELECT pg_advisory_xact_lock(1785684580, 7)").unwrap();
        Spi::run("SELECT pg_advisory_xact_lock((1785684580::int8 << 32) | 7)").unwrap();
        let n = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
              AND pid = pg_backend_pid() AND objsubid = 25188 AND objid = 7 AND classid = 0",
        )
        .unwrap()
        .unwrap();
        assert_eq!(n, 1);
        let all = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
        )
        .unwrap()
        .unwrap();
        assert_eq!(all, 3);
        assert_eq!(
            Spi::get_one::<bool>("SELECT pgque.try_xact_lock(1785684580, 7)").unwrap(),
            Some(true)
        );
    }
}
