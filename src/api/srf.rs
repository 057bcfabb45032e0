//! `setof pgque.message` returned in materialize mode: all rows handed over
//! in one call, in a tuplestore.
//!
//! pgrx returns sets value-per-call: PostgreSQL calls the function once per
//! row. For a SECURITY DEFINER function with pinned settings every such call
//! goes through fmgr_security_definer, which applies and then rolls back the
//! function's `SET` options; measured on receive(500), that per-row GUC work
//! was ~15% of the whole drain's CPU. A materialized set pays it once per
//! receive. The SQL signature is unchanged (`RETURNS SETOF pgque.message`),
//! and so is the C symbol of each function using it.
use crate::log::events::Event;
use crate::materialize::materialize_target;
use pgrx::callconv::RetAbi;
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::prelude::*;

/// The events of one batch as `pgque.message` rows (none when there is no batch).
pub struct Messages {
    batch_id: i64,
    events: Vec<Event>,
}

impl Messages {
    pub fn new(batch: Option<(i64, Vec<Event>)>) -> Messages {
        match batch {
            Some((batch_id, events)) => Messages { batch_id, events },
            None => Messages {
                batch_id: 0,
                events: vec![],
            },
        }
    }
}

/// The same rows with the events' headers as an 11th column (`headers
/// jsonb`): what the `*_with_headers` receive functions return. A table
/// type of its own, so pgque.message (PgQue's contract) stays as it is.
pub struct MessagesWithHeaders(pub Messages);

unsafe impl SqlTranslatable for MessagesWithHeaders {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(MessagesWithHeaders);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Err(ArgumentError::SetOf);
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> =
        Ok(ReturnsRef::One(SqlMappingRef::literal(
            "TABLE (msg_id bigint, batch_id bigint, type text, payload text, retry_count int4, \
             created_at timestamptz, extra1 text, extra2 text, extra3 text, extra4 text, headers jsonb)",
        )));
}

unsafe impl RetAbi for MessagesWithHeaders {
    type Item = MessagesWithHeaders;
    type Ret = MessagesWithHeaders;

    fn to_ret(self) -> Self::Ret {
        self
    }

    unsafe fn box_ret_in_fcinfo(fcinfo: pg_sys::FunctionCallInfo, ret: Self::Ret) -> pg_sys::Datum {
        unsafe { put_rows(fcinfo, ret.0, true) }
    }

    unsafe fn move_into_fcinfo_fcx(self, _fcinfo: pg_sys::FunctionCallInfo) {}

    unsafe fn fill_fcinfo_fcx(&self, _fcinfo: pg_sys::FunctionCallInfo) {}
}

/// Puts a batch's events into the call's materialized result: the
/// pgque.message columns, and `headers` last when `with_headers`.
unsafe fn put_rows(
    fcinfo: pg_sys::FunctionCallInfo,
    ret: Messages,
    with_headers: bool,
) -> pg_sys::Datum {
    unsafe {
        let (store, desc) = materialize_target(fcinfo);
        let batch_id = ret.batch_id;
        for e in ret.events {
            let [a, b, c, d] = e.extra;
            let cols = [
                e.id.into_datum(),
                batch_id.into_datum(),
                e.ev_type.into_datum(),
                e.data.into_datum(),
                e.retry.into_datum(),
                e.time.into_datum(),
                a.into_datum(),
                b.into_datum(),
                c.into_datum(),
                d.into_datum(),
                e.headers.and_then(|h| h.into_datum()),
            ];
            let mut nulls = cols.map(|c| c.is_none());
            let mut datums = cols.map(|c| c.unwrap_or(pg_sys::Datum::from(0)));
            // The plain row type has 10 columns: the descriptor decides
            // how many of these the store reads.
            debug_assert_eq!((*desc).natts as usize, if with_headers { 11 } else { 10 });
            pg_sys::tuplestore_putvalues(store, desc, datums.as_mut_ptr(), nulls.as_mut_ptr());
        }
        pg_sys::Datum::from(0)
    }
}

unsafe impl SqlTranslatable for Messages {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(Messages);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Err(ArgumentError::SetOf);
    // pgrx decides "set or not" from the Rust return type's syntax and would
    // treat this one as a scalar: the SETOF is therefore part of the literal.
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(
        SqlMappingRef::literal("SETOF pgque.message"),
    ));
}

unsafe impl RetAbi for Messages {
    type Item = Messages;
    type Ret = Messages;

    fn to_ret(self) -> Self::Ret {
        self
    }

    unsafe fn box_ret_in_fcinfo(fcinfo: pg_sys::FunctionCallInfo, ret: Self::Ret) -> pg_sys::Datum {
        unsafe { put_rows(fcinfo, ret, false) }
    }

    unsafe fn move_into_fcinfo_fcx(self, _fcinfo: pg_sys::FunctionCallInfo) {}

    unsafe fn fill_fcinfo_fcx(&self, _fcinfo: pg_sys::FunctionCallInfo) {}
}
