//! Trace-context headers (W3C `traceparent` / `tracestate`) that jobs and
//! events carry beside their payload: the one rule both accept, and the
//! schema probes that tell whether a database has the columns yet (the
//! library can be newer than the schema until ALTER EXTENSION pgque UPDATE).
//! Imported by the job code (src/jobs) and the event code (src/log,
//! src/api) alike; it imports neither.
use crate::error::{self, raise, raise_detail};

/// The largest `headers` object a job or event may carry, in bytes of its
/// JSON text: room for a W3C traceparent (55 bytes) and a tracestate (at
/// most 32 members, 512 bytes recommended) with a margin, while keeping the
/// row small.
pub const MAX_HEADERS_BYTES: usize = 1024;

/// Checks a `headers` value (`what` names it in errors): 22023 unless it is
/// a JSON object whose values are all strings, 54000 when its JSON text is
/// over MAX_HEADERS_BYTES.
pub fn check_headers(h: &pgrx::JsonB, what: &str) {
    let Some(map) = h.0.as_object() else {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!(
                "{what} must be a JSON object of strings, e.g. {{\"traceparent\": \"00-...\"}}"
            ),
        );
    };
    if let Some((k, _)) = map.iter().find(|(_, v)| !v.is_string()) {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!("{what}: the value of {k:?} must be a string"),
        );
    }
    let size = h.0.to_string().len();
    if size > MAX_HEADERS_BYTES {
        raise_detail(
            error::LIMIT_EXCEEDED,
            format!("{what} is {size} bytes long; the limit is {MAX_HEADERS_BYTES}"),
            "Headers carry trace context (traceparent, tracestate), not data: put data in the args or payload.",
        );
    }
}

/// The event side's storage of headers exists (0.8.0 on): pgque.retry_queue
/// has `ev_headers`, and with it (one upgrade step) every queue's event
/// tables, the dead letters, the held events of paused keys and the delayed
/// events. Until then events are read with NULL headers and moved without
/// them. Three syscache lookups, no SQL.
pub fn events_have_headers() -> bool {
    has_column(c"retry_queue", c"ev_headers")
}

/// Whether table pgque.`rel` has column `col` (syscache lookups only).
pub fn has_column(rel: &std::ffi::CStr, col: &std::ffi::CStr) -> bool {
    unsafe {
        let ns = pgrx::pg_sys::get_namespace_oid(c"pgque".as_ptr(), true);
        if ns == pgrx::pg_sys::InvalidOid {
            return false;
        }
        let rel = pgrx::pg_sys::get_relname_relid(rel.as_ptr(), ns);
        rel != pgrx::pg_sys::InvalidOid
            && pgrx::pg_sys::get_attnum(rel, col.as_ptr()) != pgrx::pg_sys::InvalidAttrNumber as i16
    }
}

/// pgque.jobs has the headers column (0.8.0 on; the library can be newer
/// than the schema until ALTER EXTENSION pgque UPDATE). Two syscache
/// lookups.
pub fn jobs_have_headers() -> bool {
    has_column(c"jobs", c"headers")
}

/// pgque.job_log has the headers array (0.8.0 on, as jobs_have_headers):
/// traced batches may go to the log, and the log's readers read it.
pub fn job_log_has_headers() -> bool {
    has_column(c"job_log", c"headers")
}
