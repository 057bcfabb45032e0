//! Which parts of pgque's schema this database has. Between installing a new
//! library and `ALTER EXTENSION pgque UPDATE` a database still has an older
//! release's schema, and the engine must keep working on it: each probe is a
//! syscache lookup, no SQL, so the hot paths ask it freely.
use pgrx::pg_sys;
use std::ffi::CStr;

/// Whether `pgque.<name>` is a relation in this database.
fn has_relation(name: &CStr) -> bool {
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"pgque".as_ptr(), true);
        ns != pg_sys::InvalidOid
            && pg_sys::get_relname_relid(name.as_ptr(), ns) != pg_sys::InvalidOid
    }
}

/// The partition-key tables (0.2.0): without them a database can have no
/// partitioned consumer, and its plain consumers keep working.
pub fn slots_installed() -> bool {
    has_relation(c"partition_slot")
}

/// The pause tables (0.8.0): without them partitioned consumers keep
/// working with the skip policy.
pub fn pause_installed() -> bool {
    has_relation(c"partition_blocked")
}

/// The resize schema (0.8.0).
pub fn resize_installed() -> bool {
    has_relation(c"partition_resize")
}

/// `pgque.batch_cut` (0.7.0): without it batches are cut by the read by
/// txid, as 0.6.0 did.
pub fn cuts_installed() -> bool {
    has_relation(c"batch_cut")
}

/// Whether the 0.7.0 dead-letter storage exists (`pgque.dead_letter_store`,
/// with the ev_txid columns of it and of retry_queue). Between installing
/// this library and `ALTER EXTENSION pgque UPDATE` a database still has the
/// older schema (dead letters in the table `pgque.dead_letter`), and nack,
/// replay and purge must keep working there. A syscache lookup, no SQL.
pub fn dead_letter_store_installed() -> bool {
    has_relation(c"dead_letter_store")
}

/// The table dead letters are stored in (see [`dead_letter_store_installed`]).
pub fn dead_letter_table() -> &'static str {
    if dead_letter_store_installed() {
        "pgque.dead_letter_store"
    } else {
        "pgque.dead_letter"
    }
}

/// `, ev_headers` where the schema has the event headers
/// ([`crate::headers::events_have_headers`]), else nothing: appended to the
/// column lists of the statements that move events between the event
/// tables, retries, dead letters, held and delayed events, so each move
/// carries an event's headers (and works unchanged on an older schema).
pub fn headers_col() -> &'static str {
    if crate::headers::events_have_headers() {
        ", ev_headers"
    } else {
        ""
    }
}
