//! Job outputs and progress (DESIGN.md section 14): what `complete` records
//! and what `set_progress` reports, for jobs of the log and of pgque.jobs.
//!
//! - The values are taken as PostgreSQL's own jsonb datums (`JsonbDatum`,
//!   and jsonb[] as `JsonbArray`) and handed to SPI as they are: no serde
//!   round trip, and a NULL output is a NULL parameter of the statement the
//!   completion runs anyway (no extra statement).
//! - In the log an output is part of the done row (`job_done.outputs`,
//!   aligned with its `job_ids`): nothing is updated. Progress of a log job
//!   is one appended row of `pgque.job_progress` per call, partitioned by
//!   segment like the log and truncated with it; the latest row is the
//!   job's progress. A done-row kind for progress would have had every
//!   reader of done rows (completion, rescue, heartbeat, the status view)
//!   tell it apart from a finishing row; a side table keeps them as they are.
//! - Sizes are capped (`MAX_OUTPUT_BYTES`, `MAX_PROGRESS_BYTES`, 54000):
//!   both are kept as long as the job, inline in the rows the hot paths read.
use super::log;
use super::log::stmt::{prepared, ty, with_generic_plans};
use crate::datum::JsonbArray;
use crate::error::{self, raise, required};
use pgrx::callconv::{Arg, ArgAbi};
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::{impl_sql_translatable, pg_sys};

/// Largest output of one job, in bytes of its jsonb form.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// Largest progress value, in bytes of its jsonb form.
pub const MAX_PROGRESS_BYTES: usize = 64 * 1024;

/// A `jsonb` argument kept as its (detoasted) datum, with its size.
#[derive(Debug, Clone, Copy)]
pub struct JsonbDatum {
    pub datum: pg_sys::Datum,
    /// Bytes of the jsonb value (without the varlena header).
    pub size: usize,
}

impl JsonbDatum {
    /// The datum as an SPI argument.
    pub fn arg(&self) -> DatumWithOid<'static> {
        unsafe { DatumWithOid::new(self.datum, pg_sys::JSONBOID) }
    }
}

impl FromDatum for JsonbDatum {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<JsonbDatum> {
        if is_null {
            return None;
        }
        unsafe {
            let p = pg_sys::pg_detoast_datum(datum.cast_mut_ptr());
            Some(JsonbDatum {
                datum: pg_sys::Datum::from(p),
                size: pgrx::varlena::varsize_any_exhdr(p),
            })
        }
    }
}

unsafe impl<'fcx> ArgAbi<'fcx> for JsonbDatum {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        unsafe { arg.unbox_arg_using_from_datum() }.expect("jsonb argument must not be NULL")
    }
    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
        unsafe { arg.unbox_arg_using_from_datum::<JsonbDatum>() }.into()
    }
}

impl_sql_translatable!(JsonbDatum, arg_only = "jsonb");

/// Raises 54000 when a value of `size` bytes is over `max`.
pub fn check_size(size: usize, max: usize, what: &str) {
    if size > max {
        raise(
            error::LIMIT_EXCEEDED,
            format!("{what} is {size} bytes; at most {max} bytes are kept with a job (store large results elsewhere and record a reference)"),
        );
    }
}

/// The elements of a jsonb[] (NULL elements as None), each checked against
/// the output cap. The datums point into the array, which lives as long as
/// the call.
pub fn elements(arr: &JsonbArray) -> Vec<Option<pg_sys::Datum>> {
    let mut out = Vec::with_capacity(arr.0.len);
    unsafe {
        let a = arr.0.datum.cast_mut_ptr::<pg_sys::ArrayType>();
        let mut elems: *mut pg_sys::Datum = std::ptr::null_mut();
        let mut nulls: *mut bool = std::ptr::null_mut();
        let mut n: i32 = 0;
        pg_sys::deconstruct_array(
            a,
            pg_sys::JSONBOID,
            -1,
            false,
            pg_sys::TYPALIGN_INT as std::ffi::c_char,
            &mut elems,
            &mut nulls,
            &mut n,
        );
        for i in 0..n as usize {
            if *nulls.add(i) {
                out.push(None);
            } else {
                let d = *elems.add(i);
                let size = pgrx::varlena::varsize_any_exhdr(d.cast_mut_ptr());
                check_size(size, MAX_OUTPUT_BYTES, &format!("outputs[{}]", i + 1));
                out.push(Some(d));
            }
        }
    }
    out
}

/// $1 job, $2 token, $3 progress: a running job of pgque.jobs records it.
const SIDE_PROGRESS_SQL: &str = r#"
UPDATE pgque.jobs j SET progress = $3::jsonb
WHERE j.id = $1 AND j.lease_token = $2
RETURNING 1
"#;

/// Records the progress of a running job (shown by get_job and all_jobs
/// until the next call replaces it). False, and nothing recorded, when
/// `lease_token` is not the job's current attempt (stale, rescued,
/// cancelled: the worker should stop). 54000 over MAX_PROGRESS_BYTES.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn set_progress(
    job_id: Option<i64>,
    lease_token: Option<i64>,
    progress: Option<JsonbDatum>,
) -> bool {
    let id = required(job_id, "job_id");
    let token = required(lease_token, "lease_token");
    let progress = required(progress, "progress");
    check_size(progress.size, MAX_PROGRESS_BYTES, "progress");
    // a log job appends a row; a token that is a claim no longer holding
    // the job (evacuated, left) may still be the job's token in pgque.jobs
    if log::claims_locked(&[token], "set_progress")
        && log::release::set_progress(id, token, progress.arg())
    {
        return true;
    }
    with_generic_plans(|| {
        Spi::connect_mut(|client| {
            let stmt = prepared(
                client,
                SIDE_PROGRESS_SQL,
                &[
                    ty(pg_sys::INT8OID),
                    ty(pg_sys::INT8OID),
                    ty(pg_sys::JSONBOID),
                ],
            );
            !client
                .update(stmt, None, &[id.into(), token.into(), progress.arg()])
                .unwrap_or_else(|e| pgrx::error!("{e}"))
                .is_empty()
        })
    })
}

#[cfg(any(test, feature = "pg_test"))]
#[path = "outputs_tests.rs"]
mod tests;
