//! `dispatch`'s result set, returned in materialize mode: all rows handed
//! over in one call, in a tuplestore.
//!
//! As for `enqueue_ready_rows` (outcomes.rs): pgrx's `TableIterator` returns
//! a set value-per-call, and every call of a SECURITY DEFINER function with
//! pinned settings applies and rolls back those settings
//! (fmgr_security_definer); for a dispatch of 100 jobs that was 100 rounds of
//! GUC work. The SQL signature is unchanged, and so is the C symbol.
use crate::materialize::materialize_target;
use pgrx::callconv::RetAbi;
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};

/// One dispatched job: the values (and NULL flags) of `dispatch`'s 15
/// result columns, by-reference values already in the function's memory.
/// Under 0.7.0's SQL signature (14 columns, before ALTER EXTENSION UPDATE)
/// the tuplestore's descriptor has 14 and the 15th, headers, is not read.
pub type RawRow = ([pg_sys::Datum; 15], [bool; 15]);

/// The jobs of one dispatch, in dispatch order.
pub struct JobRows(pub Vec<RawRow>);

unsafe impl SqlTranslatable for JobRows {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(JobRows);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Err(ArgumentError::SetOf);
    // The columns of the released signature, as pgrx spelled them for the
    // TableIterator this replaces, and headers.
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> =
        Ok(ReturnsRef::One(SqlMappingRef::literal(
            "TABLE (\n\t\"job_id\" bigint,\n\t\"queue\" TEXT,\n\t\"kind\" TEXT,\n\t\"args\" jsonb,\n\t\"priority\" smallint,\n\t\"attempt\" INT,\n\t\"max_attempts\" INT,\n\t\"actor\" TEXT,\n\t\"fairness_key\" TEXT,\n\t\"identity_key\" TEXT,\n\t\"run_at\" timestamp with time zone,\n\t\"enqueued_at\" timestamp with time zone,\n\t\"lease_token\" bigint,\n\t\"lease_until\" timestamp with time zone,\n\t\"headers\" jsonb\n)",
        )));
}

unsafe impl RetAbi for JobRows {
    type Item = JobRows;
    type Ret = JobRows;

    fn to_ret(self) -> Self::Ret {
        self
    }

    unsafe fn box_ret_in_fcinfo(fcinfo: pg_sys::FunctionCallInfo, ret: Self::Ret) -> pg_sys::Datum {
        unsafe {
            let (store, desc) = materialize_target(fcinfo);
            for (mut datums, mut nulls) in ret.0 {
                pg_sys::tuplestore_putvalues(store, desc, datums.as_mut_ptr(), nulls.as_mut_ptr());
            }
            pg_sys::Datum::from(0)
        }
    }

    unsafe fn move_into_fcinfo_fcx(self, _fcinfo: pg_sys::FunctionCallInfo) {}

    unsafe fn fill_fcinfo_fcx(&self, _fcinfo: pg_sys::FunctionCallInfo) {}
}
