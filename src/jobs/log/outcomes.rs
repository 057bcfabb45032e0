//! The result set of `enqueue_ready_rows`, returned in materialize mode: all
//! rows handed over in one call, in a tuplestore.
//!
//! pgrx's `TableIterator` returns sets value-per-call: PostgreSQL calls the
//! function once per row, and for a SECURITY DEFINER function with pinned
//! settings every such call goes through fmgr_security_definer, which applies
//! and rolls back the function's `SET` options (search_path, jit) each time.
//! For an enqueue of 100 jobs that per-row GUC work was ~10% of the call's
//! backend CPU (perf: fmgr_security_definer, set_config_option, AtEOXact_GUC).
//! The SQL signature is unchanged (`RETURNS TABLE (ord int, job_id bigint,
//! state text)`), and so is the function's C symbol. Same technique as
//! `receive` (src/api/srf.rs).
use crate::materialize::materialize_target;
use pgrx::callconv::RetAbi;
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::IntoDatum;

/// One row of the result, in input order.
pub struct Outcome {
    pub ord: i32,
    pub job_id: Option<i64>,
    pub state: String,
}

/// The rows of one enqueue, in input order.
pub struct Outcomes(pub Vec<Outcome>);

unsafe impl SqlTranslatable for Outcomes {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(Outcomes);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Err(ArgumentError::SetOf);
    // The columns of the released signature, spelled as pgrx spelled them for
    // the TableIterator this replaces (pgrx would treat this type as a scalar,
    // so the whole TABLE clause is the literal).
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> =
        Ok(ReturnsRef::One(SqlMappingRef::literal(
            "TABLE (\n\t\"ord\" INT,\n\t\"job_id\" bigint,\n\t\"state\" TEXT\n)",
        )));
}

unsafe impl RetAbi for Outcomes {
    type Item = Outcomes;
    type Ret = Outcomes;

    fn to_ret(self) -> Self::Ret {
        self
    }

    unsafe fn box_ret_in_fcinfo(fcinfo: pg_sys::FunctionCallInfo, ret: Self::Ret) -> pg_sys::Datum {
        unsafe {
            let (store, desc) = materialize_target(fcinfo);
            for o in ret.0 {
                let cols = [
                    o.ord.into_datum(),
                    o.job_id.into_datum(),
                    o.state.into_datum(),
                ];
                let mut nulls = cols.map(|c| c.is_none());
                let mut datums = cols.map(|c| c.unwrap_or(pg_sys::Datum::from(0)));
                pg_sys::tuplestore_putvalues(store, desc, datums.as_mut_ptr(), nulls.as_mut_ptr());
            }
            pg_sys::Datum::from(0)
        }
    }

    unsafe fn move_into_fcinfo_fcx(self, _fcinfo: pg_sys::FunctionCallInfo) {}

    unsafe fn fill_fcinfo_fcx(&self, _fcinfo: pg_sys::FunctionCallInfo) {}
}
