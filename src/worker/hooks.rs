//! A ProcessUtility hook for the commands that must not run beside the
//! database's pgque worker: DROP DATABASE, ALTER DATABASE ... RENAME and
//! CREATE DATABASE ... TEMPLATE (they refuse while another session is
//! connected), and DROP EXTENSION pgque (its exclusive locks on the pgque
//! tables deadlock with a duty that is reading them). Each stops the worker
//! first; after a rename or copy it is started again, after a drop it is not
//! (if the command fails, is cancelled or times out, also while it waits
//! for the worker to leave, it is started again at once). Only for a caller
//! with the right to run the statement (`permitted`): the worker of a
//! database stays up whatever statements others are refused on it.
use crate::shmem;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CStr;
use std::time::{Duration, Instant};

static mut PREV_HOOK: pg_sys::ProcessUtility_hook_type = None;

pub fn install() {
    unsafe {
        PREV_HOOK = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(pgque_process_utility);
    }
}

/// What a utility statement means for a database's worker.
enum Action {
    None,
    /// Stop the worker of this database; `restart` after the command
    /// succeeds; `drop_db`: the database goes away (no restart by the postmaster).
    Stop {
        name: String,
        restart: bool,
        drop_db: bool,
        kind: Kind,
    },
}

/// Which statement it is, for the privilege check (`permitted`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    DropDatabase,
    DropExtension,
    RenameDatabase,
    CopyDatabase,
}

/// The text of a `T_String` node: PostgreSQL 15 made it a `String` node of
/// its own; 14 keeps it in the generic `Value` node.
unsafe fn string_node_value(node: *mut pg_sys::Node) -> *const std::ffi::c_char {
    #[cfg(feature = "pg14")]
    {
        (*(node as *mut pg_sys::Value)).val.str_
    }
    #[cfg(not(feature = "pg14"))]
    {
        (*(node as *mut pg_sys::String)).sval
    }
}

unsafe fn cstr(p: *const std::ffi::c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

unsafe fn classify(node: *mut pg_sys::Node) -> Action {
    unsafe {
        if node.is_null() {
            return Action::None;
        }
        match (*node).type_ {
            pg_sys::NodeTag::T_DropdbStmt => {
                let s = node as *mut pg_sys::DropdbStmt;
                match cstr((*s).dbname) {
                    Some(name) => Action::Stop {
                        name,
                        restart: false,
                        drop_db: true,
                        kind: Kind::DropDatabase,
                    },
                    None => Action::None,
                }
            }
            pg_sys::NodeTag::T_DropStmt => {
                let s = node as *mut pg_sys::DropStmt;
                if (*s).removeType != pg_sys::ObjectType::OBJECT_EXTENSION || (*s).objects.is_null()
                {
                    return Action::None;
                }
                let objs = (*s).objects;
                for i in 0..(*objs).length as usize {
                    let obj = (*(*objs).elements.add(i)).ptr_value as *mut pg_sys::Node;
                    if !obj.is_null() && (*obj).type_ == pg_sys::NodeTag::T_String {
                        let name = cstr(string_node_value(obj));
                        if name.as_deref() == Some("pgque") {
                            let db = pg_sys::get_database_name(pg_sys::MyDatabaseId);
                            if let Some(name) = cstr(db) {
                                return Action::Stop {
                                    name,
                                    restart: false,
                                    drop_db: false,
                                    kind: Kind::DropExtension,
                                };
                            }
                        }
                    }
                }
                Action::None
            }
            pg_sys::NodeTag::T_RenameStmt => {
                let s = node as *mut pg_sys::RenameStmt;
                if (*s).renameType == pg_sys::ObjectType::OBJECT_DATABASE {
                    match cstr((*s).subname) {
                        Some(name) => Action::Stop {
                            name,
                            restart: true,
                            drop_db: false,
                            kind: Kind::RenameDatabase,
                        },
                        None => Action::None,
                    }
                } else {
                    Action::None
                }
            }
            pg_sys::NodeTag::T_CreatedbStmt => {
                let s = node as *mut pg_sys::CreatedbStmt;
                let opts = (*s).options;
                if opts.is_null() {
                    return Action::None;
                }
                for i in 0..(*opts).length as usize {
                    let def = (*(*opts).elements.add(i)).ptr_value as *mut pg_sys::DefElem;
                    if cstr((*def).defname).as_deref() == Some("template") && !(*def).arg.is_null()
                    {
                        if let Some(name) = cstr(pg_sys::defGetString(def)) {
                            return Action::Stop {
                                name,
                                restart: true,
                                drop_db: false,
                                kind: Kind::CopyDatabase,
                            };
                        }
                    }
                }
                Action::None
            }
            _ => Action::None,
        }
    }
}

/// The owner of database `db` and whether it is a template (None: gone).
unsafe fn database_row(db: pg_sys::Oid) -> Option<(pg_sys::Oid, bool)> {
    unsafe {
        let t = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::DATABASEOID as _,
            pg_sys::Datum::from(db),
        );
        if t.is_null() {
            return None;
        }
        let f = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(t);
        let r = ((*f).datdba, (*f).datistemplate);
        pg_sys::ReleaseSysCache(t);
        Some(r)
    }
}

/// Whether the current user has the CREATEDB attribute (or is a superuser).
unsafe fn has_createdb() -> bool {
    unsafe {
        if pg_sys::superuser() {
            return true;
        }
        let t = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::AUTHOID as _,
            pg_sys::Datum::from(pg_sys::GetUserId()),
        );
        if t.is_null() {
            return false;
        }
        let f = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_authid>(t);
        let r = (*f).rolcreatedb;
        pg_sys::ReleaseSysCache(t);
        r
    }
}

/// Whether the current user owns extension pgque (or is a superuser).
unsafe fn owns_extension() -> bool {
    unsafe {
        let ext = pg_sys::get_extension_oid(c"pgque".as_ptr(), true);
        if ext == pg_sys::InvalidOid {
            return false;
        }
        #[cfg(any(feature = "pg14", feature = "pg15"))]
        {
            pg_sys::pg_extension_ownercheck(ext, pg_sys::GetUserId())
        }
        #[cfg(not(any(feature = "pg14", feature = "pg15")))]
        {
            pg_sys::object_ownercheck(pg_sys::ExtensionRelationId, ext, pg_sys::GetUserId())
        }
    }
}

/// Whether the statement will pass PostgreSQL's own privilege checks, made
/// as PostgreSQL makes them (dropdb, RenameDatabase, createdb,
/// RemoveObjects): the worker is only stopped for a statement that may
/// succeed. Stopping it first for any caller let every connected role keep
/// a database's worker down by repeating a statement that then failed.
unsafe fn permitted(kind: Kind, db: pg_sys::Oid) -> bool {
    unsafe {
        let Some((owner, is_template)) = database_row(db) else {
            return false;
        };
        let owns_db = pg_sys::has_privs_of_role(pg_sys::GetUserId(), owner);
        match kind {
            // a template database cannot be dropped
            Kind::DropDatabase => owns_db && !is_template,
            Kind::RenameDatabase => owns_db && has_createdb(),
            // any template, or one's own database, may be copied
            Kind::CopyDatabase => has_createdb() && (is_template || owns_db),
            Kind::DropExtension => owns_extension(),
        }
    }
}

/// Asks the worker of `db_oid` to stop and waits (up to 5 s) until it is gone.
fn stop_worker(db_oid: u32) {
    let Some(pid) = shmem::request_stop(db_oid) else {
        return;
    };
    shmem::send_signal(pid, 15 /* SIGTERM */);
    wait_gone(db_oid, true);
}

/// Waits (up to 5 s) until the worker of `db_oid` has left its slot;
/// `interruptible`: a cancel raises its error here (not on an error path).
fn wait_gone(db_oid: u32, interruptible: bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while shmem::find(db_oid).is_some() && Instant::now() < deadline {
        unsafe {
            pg_sys::pg_usleep(10_000);
        }
        if interruptible {
            pg_sys::check_for_interrupts!();
        }
    }
}

// The ProcessUtility functions themselves, unwrapped: pgrx's pg_sys wrapper
// would catch an error they raise and raise it again from Rust, keeping only
// its message, detail, hint and SQLSTATE (a DO block's or COPY's CONTEXT and
// the table, column and constraint names drivers read were lost, and with
// RUST_BACKTRACE set in the server's environment a Rust backtrace was
// appended to the DETAIL of every failing utility statement in every
// database).
unsafe extern "C-unwind" {
    #[link_name = "standard_ProcessUtility"]
    fn standard_process_utility_raw(
        pstmt: *mut pg_sys::PlannedStmt,
        query_string: *const std::ffi::c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        query_env: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        qc: *mut pg_sys::QueryCompletion,
    );
}

/// The next hook, or standard_ProcessUtility, called as C calls it: an error
/// it raises longjmps out of here untouched.
#[allow(clippy::too_many_arguments)]
unsafe fn next_process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    unsafe {
        match PREV_HOOK {
            Some(prev) => prev(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
            None => standard_process_utility_raw(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
        }
    }
}

/// Whether the statement concerns a database's worker (see `classify`).
/// Guarded: an error here is reported as a PostgreSQL error.
#[pg_guard]
unsafe extern "C-unwind" fn concerns_a_worker(pstmt: *mut pg_sys::PlannedStmt) -> bool {
    shmem::available() && !matches!(unsafe { classify((*pstmt).utilityStmt) }, Action::None)
}

/// The hook. Every statement that does not concern a worker (nearly all)
/// goes straight to the next hook or to standard_ProcessUtility, so that
/// their errors reach the client exactly as PostgreSQL raised them: nothing
/// of Rust is live in this frame at that call (no value to drop), so an
/// error's longjmp passes over it as over a C frame.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn pgque_process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    unsafe {
        if concerns_a_worker(pstmt) {
            return process_utility_with_worker(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            );
        }
        next_process_utility(
            pstmt,
            query_string,
            read_only_tree,
            context,
            params,
            query_env,
            dest,
            qc,
        )
    }
}

/// The hook for the statements that concern a worker (module comment).
#[pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility_with_worker(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    let action = if shmem::available() {
        unsafe { classify((*pstmt).utilityStmt) }
    } else {
        Action::None
    };
    // (classified twice for the few statements that get here: cheap, and it
    // keeps this function the whole story for them)
    let mut stopped: Option<(pg_sys::Oid, bool, bool)> = None;
    if let Action::Stop {
        name,
        restart,
        drop_db,
        kind,
    } = action
    {
        let cname = std::ffi::CString::new(name).unwrap_or_default();
        let oid = unsafe { pg_sys::get_database_oid(cname.as_ptr(), true) };
        if oid != pg_sys::InvalidOid
            && (shmem::find(oid.to_u32()).is_some() || shmem::demand_of(oid.to_u32()).is_some())
            && unsafe { permitted(kind, oid) }
        {
            stopped = Some((oid, restart, drop_db));
        }
    }
    // Rust frames are live here (the restart below): an error must come back
    // as a Rust panic, which pg_guard_ffi_boundary makes of the longjmp.
    let run = || unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            next_process_utility(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            )
        })
    };
    match stopped {
        None => run(),
        Some((oid, restart, drop_db)) => {
            // The stop is inside the try: a cancel (or statement_timeout)
            // while it waits for the worker to leave is an error like the
            // command's own, and must not leave the database marked as
            // dropped, with no worker until the server restarts.
            let stop_and_run = || {
                // Keeps the postmaster from restarting the worker into a
                // database that is gone, and the pool from starting one in
                // a parked database while the command needs it unused.
                shmem::mark_dropped(oid.to_u32());
                stop_worker(oid.to_u32());
                run()
            };
            PgTryBuilder::new(stop_and_run)
                .catch_others(|e| {
                    // The command failed: the database is still there, so is its need for a worker.
                    // (After a cancel the stopping worker may not have left its slot yet, and
                    // a new one would find it taken and leave.)
                    wait_gone(oid.to_u32(), false);
                    shmem::unmark_dropped(oid.to_u32());
                    super::spawn::spawn_db_worker(oid, super::spawn::Start::Wanted);
                    e.rethrow()
                })
                .execute();
            if !drop_db {
                shmem::unmark_dropped(oid.to_u32());
            }
            if restart {
                super::spawn::spawn_db_worker(oid, super::spawn::Start::Wanted);
            }
        }
    }
}
