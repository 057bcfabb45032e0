//! Owner's rights for the send path without a SECURITY DEFINER call frame.
//!
//! send / send_batch / insert_event are the hottest calls of event queues:
//! one per produced event. As SECURITY DEFINER functions with the pinned
//! `SET search_path`, every call saved, parsed, assigned and restored that
//! setting (on PostgreSQL 15, AtEOXact_GUC walks every setting of the server
//! on each call's exit, and the search path is recomputed twice), which PgQ's
//! insert_event, a SECURITY DEFINER function with no settings, does not pay
//! (benches/results/events.md).
//!
//! So those functions are declared with invoker's rights and no settings,
//! and switch to the owner of schema `pgque` (the role that installed the
//! extension, as SECURITY DEFINER would) around their work, with
//! [`as_owner`]. Who may call them is still decided by their EXECUTE grants
//! (pgque_writer); the caller gets no right on any table. Since the
//! caller's search_path stays in force, every statement they run names
//! everything schema-qualified, operators included (`OPERATOR(pg_catalog.=)`,
//! `pg_catalog.nextval`): pg_test/tests/hostile.rs runs them with a hostile
//! search_path and checks that none of its objects is used, and that only
//! these functions (C, invoker's rights) go without the pinned setting.
use pgrx::pg_sys;

/// The owner of schema `pgque` (two catalog-cache lookups, no SQL).
fn schema_owner() -> pg_sys::Oid {
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"pgque".as_ptr(), false);
        let tup = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::NAMESPACEOID as _,
            pg_sys::Datum::from(ns),
        );
        if tup.is_null() {
            pgrx::error!("pgque: schema pgque not found in the catalog cache");
        }
        let owner = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_namespace>(tup)).nspowner;
        pg_sys::ReleaseSysCache(tup);
        owner
    }
}

/// Restores the caller's user id and security context when dropped, also
/// when a statement fails (the error unwinds through here; the transaction
/// abort restores them as well, as it does for SECURITY DEFINER).
struct Restore {
    user: pg_sys::Oid,
    context: i32,
}

impl Drop for Restore {
    fn drop(&mut self) {
        unsafe { pg_sys::SetUserIdAndSecContext(self.user, self.context) };
    }
}

/// Runs `f` as the owner of schema `pgque`, exactly as a SECURITY DEFINER
/// function owned by that role would (the same user-id switch,
/// SECURITY_LOCAL_USERID_CHANGE set so SET ROLE / SET SESSION AUTHORIZATION
/// are refused inside), and switches back. Returns what `f` returns.
pub fn as_owner<R>(f: impl FnOnce() -> R) -> R {
    let owner = schema_owner();
    let mut user = pg_sys::InvalidOid;
    let mut context: i32 = 0;
    unsafe { pg_sys::GetUserIdAndSecContext(&mut user, &mut context) };
    let _restore = Restore { user, context };
    unsafe {
        pg_sys::SetUserIdAndSecContext(owner, context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32)
    };
    f()
}
