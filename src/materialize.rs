//! Set-returning functions in materialize mode: every row handed over in one
//! call, in a tuplestore, instead of pgrx's value-per-call `TableIterator`
//! (which, for a SECURITY DEFINER function with pinned settings, applies and
//! rolls back those settings once per row). receive (api/srf.rs), the dead
//! letters (api/dead_letter.rs), dispatch and enqueue's outcomes (jobs/log/)
//! return their sets through here.
use pgrx::prelude::*;

/// Switches the call to materialize mode and returns its (empty) tuplestore
/// and row descriptor; 0A000 where the caller cannot take a materialized set.
///
/// # Safety
/// `fcinfo` must be the call info of the set-returning function being
/// called, in that call.
pub unsafe fn materialize_target(
    fcinfo: pg_sys::FunctionCallInfo,
) -> (*mut pg_sys::Tuplestorestate, pg_sys::TupleDesc) {
    unsafe {
        let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;
        let materialize = pg_sys::SetFunctionReturnMode::SFRM_Materialize as i32;
        if rsinfo.is_null()
            || (*rsinfo).type_ != pg_sys::NodeTag::T_ReturnSetInfo
            || (*rsinfo).allowedModes & materialize == 0
        {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                "set-valued function called in context that cannot accept a set"
            );
        }
        let mut desc: pg_sys::TupleDesc = std::ptr::null_mut();
        let class = pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut desc);
        if class != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE || desc.is_null() {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                "set-returning function called with another row type"
            );
        }
        // The store and its descriptor must outlive this call: the executor
        // reads them after we return.
        let old = pg_sys::MemoryContextSwitchTo((*(*rsinfo).econtext).ecxt_per_query_memory);
        let desc = pg_sys::CreateTupleDescCopy(desc);
        let random = (*rsinfo).allowedModes
            & pg_sys::SetFunctionReturnMode::SFRM_Materialize_Random as i32
            != 0;
        let store = pg_sys::tuplestore_begin_heap(random, false, pg_sys::work_mem);
        pg_sys::MemoryContextSwitchTo(old);
        (*rsinfo).returnMode = pg_sys::SetFunctionReturnMode::SFRM_Materialize;
        (*rsinfo).setResult = store;
        (*rsinfo).setDesc = desc;
        (store, desc)
    }
}
