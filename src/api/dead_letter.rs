//! `dlq_inspect`: the dead letters of a queue as rows of PgQue's
//! `pgque.dead_letter` (the view over `pgque.dead_letter_store`, see
//! sql/10_event_log.sql), newest first.
//!
//! PgQue declares it `RETURNS SETOF pgque.dead_letter`, so clients that read
//! its rows by position or by column name, and SQL that uses the row type,
//! work unchanged. The rows are read by one statement over the view and
//! copied into the caller's memory (SPI_copytuple) while SPI is connected,
//! then handed to a materialized result set (`crate::materialize`).
use crate::error::{self, raise, required};
use crate::log;
use crate::materialize::materialize_target;
use pgrx::callconv::RetAbi;
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::prelude::*;

/// Rows of `pgque.dead_letter`, copied out of SPI.
pub struct DeadLetterRows(Vec<*mut pg_sys::HeapTupleData>);

unsafe impl SqlTranslatable for DeadLetterRows {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(DeadLetterRows);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Err(ArgumentError::SetOf);
    // As for srf::Messages: the SETOF is part of the literal.
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(
        SqlMappingRef::literal("SETOF pgque.dead_letter"),
    ));
}

unsafe impl RetAbi for DeadLetterRows {
    type Item = DeadLetterRows;
    type Ret = DeadLetterRows;

    fn to_ret(self) -> Self::Ret {
        self
    }

    unsafe fn box_ret_in_fcinfo(fcinfo: pg_sys::FunctionCallInfo, ret: Self::Ret) -> pg_sys::Datum {
        unsafe {
            let (store, _desc) = materialize_target(fcinfo);
            for t in ret.0 {
                pg_sys::tuplestore_puttuple(store, t);
            }
            pg_sys::Datum::from(0)
        }
    }

    unsafe fn move_into_fcinfo_fcx(self, _fcinfo: pg_sys::FunctionCallInfo) {}

    unsafe fn fill_fcinfo_fcx(&self, _fcinfo: pg_sys::FunctionCallInfo) {}
}

/// dlq_inspect(queue_name, limit default 100) → setof pgque.dead_letter: the
/// queue's newest dead letters (dl_id descending), at most `limit`.
/// 22004 NULL limit, 22023 negative; queue name errors as everywhere.
#[pg_extern(security_definer, requires = ["event_log"])]
#[search_path(pg_catalog, pgque, pg_temp)]
fn dlq_inspect(queue_name: Option<&str>, limit: default!(Option<i32>, 100)) -> DeadLetterRows {
    let lim = required(limit, "limit");
    if lim < 0 {
        raise(error::INVALID_PARAMETER_VALUE, "limit must not be negative");
    }
    // The library can be newer than the schema until ALTER EXTENSION UPDATE;
    // an older schema's dlq_inspect has another row type.
    if !log::dead_letter_store_installed() {
        raise(
            error::FEATURE_NOT_SUPPORTED,
            "dlq_inspect needs the pgque 0.7.0 schema: run ALTER EXTENSION pgque UPDATE",
        );
    }
    DeadLetterRows(Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        let t = log::exec(
            c,
            "SELECT d.* FROM pgque.dead_letter d WHERE d.dl_queue_id = $1 ORDER BY d.dl_id DESC LIMIT $2",
            &[q.id.into(), (lim as i64).into()],
        );
        let n = t.len();
        // SAFETY: the statement above left its rows in SPI_tuptable; each is
        // copied into the memory context of the calling function, which
        // outlives this SPI connection.
        unsafe {
            let tt = pg_sys::SPI_tuptable;
            (0..n)
                .map(|i| pg_sys::SPI_copytuple(*(*tt).vals.add(i)))
                .collect::<Vec<_>>()
        }
    }))
}
