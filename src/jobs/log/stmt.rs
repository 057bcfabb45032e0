//! Prepared statements, prepared once per backend and reused.
//!
//! Each hot-path SQL text is a `&'static str`; the first call in a backend
//! prepares it (`SPI_prepare` + `SPI_keepplan`) and later calls execute the
//! kept plan, so parse analysis happens once. PostgreSQL's plan cache still
//! revalidates the plan when a table it uses changes; and when the extension
//! itself was dropped and created again in this backend (a new extension OID),
//! the whole cache is thrown away and statements are prepared afresh.
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, SpiClient};
use std::cell::RefCell;
use std::collections::HashMap;

/// Kept plans are leaked boxes, never dropped by a destructor: a thread-local
/// destructor would run SPI_freeplan while the backend exits, after
/// PostgreSQL has begun tearing itself down.
struct Cache {
    ext_oid: pg_sys::Oid,
    stmts: HashMap<usize, &'static OwnedPreparedStatement>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache {
        ext_oid: pg_sys::InvalidOid,
        stmts: HashMap::new(),
    });
}

fn extension_oid() -> pg_sys::Oid {
    unsafe { pg_sys::get_extension_oid(c"pgque".as_ptr(), true) }
}

/// The kept plan of `sql` (identified by its address: pass a `const`/`static`
/// string), preparing it with argument types `types` on first use.
pub fn prepared(
    client: &SpiClient<'_>,
    sql: &'static str,
    types: &[PgOid],
) -> &'static OwnedPreparedStatement {
    // (on a schema older than pgque's lock functions, the released lock calls)
    let sql = crate::locks::sql(sql);
    let ext = extension_oid();
    let key = sql.as_ptr() as usize;
    let cached = CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.ext_oid != ext {
            // The old plans are left allocated (a few kB, once per DROP and
            // CREATE EXTENSION in this backend): a caller up the stack may
            // still hold one, so freeing them here could free a plan in use.
            c.stmts.clear();
            c.ext_oid = ext;
        }
        c.stmts.get(&key).copied()
    });
    if let Some(stmt) = cached {
        return stmt;
    }
    let stmt: &'static OwnedPreparedStatement = Box::leak(Box::new(
        client
            .prepare_mut(sql, types)
            .unwrap_or_else(|e| pgrx::error!("pgque: cannot prepare a job statement: {e}"))
            .keep(),
    ));
    CACHE.with(|c| c.borrow_mut().stmts.insert(key, stmt));
    stmt
}

/// Argument type of a prepared statement.
pub const fn ty(o: pg_sys::Oid) -> PgOid {
    PgOid::from_untagged(o)
}

/// The planner settings of `with_generic_plans` (tests plan with them too).
pub const PLAN_SETTINGS: [(&std::ffi::CStr, &std::ffi::CStr); 3] = [
    (c"plan_cache_mode", c"force_generic_plan"),
    (c"enable_seqscan", c"off"),
    (c"enable_bitmapscan", c"off"),
];

/// The planner settings every job statement is planned and run under, and
/// why (restored after `f`, also on error through the transaction's GUC
/// unwinding):
/// - `plan_cache_mode = force_generic_plan`: the statements are built to be
///   bounded under any plan (tests pin it for dispatch), and their plans do
///   not get better with the actual values, so re-planning a custom plan on
///   every call (several ms for these CTEs) buys nothing;
/// - `enable_seqscan = off`, `enable_bitmapscan = off`: a kept generic plan
///   lives as long as the backend (until the next ANALYZE or VACUUM of the
///   table). Planned while pgque.jobs is nearly empty (a fresh or just
///   vacuumed queue: a few pages), it sequentially scans jobs inside the
///   per-candidate lock probe, or bitmap-scans a whole partial index there,
///   and keeps doing so once the table holds thousands of finished jobs:
///   measured 40k buffers and 65 ms per dispatch of 100 in the end-to-end
///   loop. Every access to a job table in these statements has an index
///   path that is bounded by the rows it returns, so taking the two
///   unbounded scan types out of the planner's choice loses nothing.
pub fn with_generic_plans<R>(f: impl FnOnce() -> R) -> R {
    with_settings(&PLAN_SETTINGS, f)
}

/// Runs `f` under the planner `settings` (name, value), restored after it
/// as in `with_generic_plans`.
pub fn with_settings<R>(
    settings: &[(&std::ffi::CStr, &std::ffi::CStr)],
    f: impl FnOnce() -> R,
) -> R {
    unsafe {
        let nest = pg_sys::NewGUCNestLevel();
        for &(name, value) in settings {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        let r = f();
        pg_sys::AtEOXact_GUC(true, nest);
        r
    }
}

/// Runs a kept statement (under `with_generic_plans`) and returns its first
/// row's first column as an int (0 when there is no row or it is NULL).
pub fn run_int(
    sql: &'static str,
    types: &[pg_sys::PgOid],
    args: Vec<pgrx::datum::DatumWithOid<'_>>,
) -> i32 {
    with_generic_plans(|| {
        pgrx::prelude::Spi::connect_mut(|client| {
            let stmt = prepared(client, sql, types);
            client
                .update(stmt, None, &args)
                .unwrap_or_else(|e| pgrx::error!("{e}"))
                .first()
                .get::<i32>(1)
                .ok()
                .flatten()
                .unwrap_or(0)
        })
    })
}
