//! Appending events: send, send_batch and insert_event below SQL where that
//! can be done (the queue found by [`super::qlookup`], the rows written by
//! [`super::direct`]), by SQL otherwise.
use super::queue::{event_seq, queue_by_name, Queue};
use super::spi::{col, exec, first_row};
use super::{direct, qlookup};
use crate::error::{self, raise};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

/// The raw fields of one event to append.
#[derive(Debug, Default, Clone)]
pub struct NewEvent<'a> {
    pub ev_type: Option<&'a str>,
    pub ev_data: Option<&'a str>,
    pub extra: [Option<&'a str>; 4],
    /// ev_headers (checked by the caller: crate::headers::check_headers).
    pub headers: Option<super::events::PgJsonb>,
}

/// The queue named `queue_name` for a send, found below SQL ([`qlookup`])
/// where that can be done (42704 when there is no such queue); None when
/// the caller must look it up by SQL ([`queue_by_name`]).
fn send_queue(name: &str) -> Option<Queue> {
    qlookup::find(name).map(|found| {
        found.unwrap_or_else(|| {
            raise(
                error::UNDEFINED_OBJECT,
                format!("queue not found: {name:?}"),
            )
        })
    })
}

/// send / insert_event: appends one event to the queue named `queue_name`
/// (checked and looked up as [`queue_by_name`] does); returns its id. A
/// send that needs no SQL (the queue found by [`qlookup`], the row written
/// by [`direct`]) opens no SPI connection.
pub fn send_event(queue_name: Option<&str>, ev: &NewEvent<'_>) -> i64 {
    let name = error::valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    match send_queue(name) {
        Some(q) => insert_event_direct(&q, ev)
            .unwrap_or_else(|| Spi::connect_mut(|c| insert_event_sql(c, &q, ev))),
        None => Spi::connect_mut(|c| {
            let q = queue_by_name(c, Some(name));
            insert_event(c, &q, ev)
        }),
    }
}

/// send_batch: [`insert_events`] (headers on every event) into the queue named `queue_name`, with
/// no SPI connection when none is needed (as [`send_event`]).
pub fn send_events(
    queue_name: Option<&str>,
    ev_type: &str,
    payloads: &crate::datum::ArrayDatum,
    keys: Option<&crate::datum::ArrayDatum>,
    headers: Option<super::events::PgJsonb>,
) -> Vec<i64> {
    let name = error::valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    match send_queue(name) {
        Some(_) if payloads.len == 0 => vec![],
        Some(q) => match insert_events_direct(&q, ev_type, payloads, keys, headers) {
            Some(ids) => {
                crate::wake::sent_at_commit(q.id);
                ids
            }
            None => Spi::connect_mut(|c| insert_events(c, &q, ev_type, payloads, keys, headers)),
        },
        None => Spi::connect_mut(|c| {
            let q = queue_by_name(c, Some(name));
            insert_events(c, &q, ev_type, payloads, keys, headers)
        }),
    }
}

/// Appends one event to the queue's current table; returns its id.
pub fn insert_event<'a>(client: &mut SpiClient<'_>, q: &Queue, ev: &NewEvent<'a>) -> i64 {
    insert_event_direct(q, ev).unwrap_or_else(|| insert_event_sql(client, q, ev))
}

/// [`insert_event`] below SQL ([`direct`]); None when the table needs the
/// SQL INSERT.
fn insert_event_direct<'a>(q: &Queue, ev: &NewEvent<'a>) -> Option<i64> {
    let mut t = direct::Target::open(q, 1, ev.headers.is_some())?;
    let id = nextval(q.seq);
    let v = |s: Option<&'a str>| s.map_or(direct::Val::Null, direct::Val::Str);
    t.push(
        id,
        v(ev.ev_type),
        v(ev.ev_data),
        [
            v(ev.extra[0]),
            v(ev.extra[1]),
            v(ev.extra[2]),
            v(ev.extra[3]),
        ],
        ev.headers.map(super::events::PgJsonb::datum),
    );
    t.finish();
    crate::wake::sent_at_commit(q.id);
    Some(id)
}

/// [`insert_event`] by the SQL INSERT.
fn insert_event_sql(client: &mut SpiClient<'_>, q: &Queue, ev: &NewEvent<'_>) -> i64 {
    if let Some(h) = ev.headers {
        // A traced event on a table the direct path does not write: the
        // statement below with the headers (an untraced one stays as it is).
        let sql = format!(
            "INSERT INTO {} (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_headers) \
             VALUES (pg_catalog.nextval('{}'::pg_catalog.regclass), $1, $2, $3, $4, $5, $6, $7) \
             RETURNING ev_id",
            q.current_table(),
            event_seq(q.id)
        );
        let t = exec(
            client,
            &sql,
            &[
                ev.ev_type.into(),
                ev.ev_data.into(),
                ev.extra[0].into(),
                ev.extra[1].into(),
                ev.extra[2].into(),
                ev.extra[3].into(),
                h.into(),
            ],
        );
        crate::wake::sent_at_commit(q.id);
        return col(&first_row(t).expect("INSERT RETURNING"), 1).unwrap();
    }
    let sql = format!(
        "INSERT INTO {} (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4) \
         VALUES (pg_catalog.nextval('{}'::pg_catalog.regclass), $1, $2, $3, $4, $5, $6) \
         RETURNING ev_id",
        q.current_table(),
        event_seq(q.id)
    );
    let t = exec(
        client,
        &sql,
        &[
            ev.ev_type.into(),
            ev.ev_data.into(),
            ev.extra[0].into(),
            ev.extra[1].into(),
            ev.extra[2].into(),
            ev.extra[3].into(),
        ],
    );
    crate::wake::sent_at_commit(q.id);
    col(&first_row(t).expect("INSERT RETURNING"), 1).unwrap()
}

/// Appends many events of one type in one statement; ids come back aligned
/// with the input positions. `payloads` is a `jsonb[]` or `text[]` datum
/// (cast to text by the statement); `keys` (partition keys, into ev_extra1)
/// must be as long as `payloads` (the caller checks); `headers` go with
/// every event of the call.
///
/// The ids are drawn from the queue's sequence here, one nextval per event
/// in input order as the statement would draw them, and handed to the INSERT
/// as a third array: the statement returns nothing, so no RETURNING rows are
/// projected, stored by SPI and read back (about a tenth of a 100-event call).
pub fn insert_events(
    client: &mut SpiClient<'_>,
    q: &Queue,
    ev_type: &str,
    payloads: &crate::datum::ArrayDatum,
    keys: Option<&crate::datum::ArrayDatum>,
    headers: Option<super::events::PgJsonb>,
) -> Vec<i64> {
    if payloads.len == 0 {
        return vec![];
    }
    if let Some(ids) = insert_events_direct(q, ev_type, payloads, keys, headers) {
        crate::wake::sent_at_commit(q.id);
        return ids;
    }
    let cast = if payloads.type_oid == pg_sys::JSONBARRAYOID {
        "jsonb[]"
    } else {
        "text[]"
    };
    // Keyed or not, one statement: unnest of a NULL keys array yields no
    // rows, and ROWS FROM pads the shorter side with NULLs. Every name is
    // schema-qualified: the send path runs with the caller's search_path
    // (crate::api::owner); so is find_queue's and insert_event's.
    // Headers, when given, are a fifth parameter of another statement: an
    // untraced call runs the same one as before headers existed.
    let (hcol, hval) = if headers.is_some() {
        (", ev_headers", ", $5::pg_catalog.jsonb")
    } else {
        ("", "")
    };
    let sql = format!(
        "INSERT INTO {tbl} (ev_id, ev_type, ev_data, ev_extra1{hcol}) \
         SELECT u.i, $1, u.p::pg_catalog.text, u.k{hval} \
           FROM ROWS FROM (pg_catalog.unnest($4::pg_catalog.int8[]), \
                           pg_catalog.unnest($2::pg_catalog.{cast}), \
                           pg_catalog.unnest($3::pg_catalog.text[])) AS u(i, p, k)",
        tbl = q.current_table()
    );
    let ids: Vec<i64> = (0..payloads.len).map(|_| nextval(q.seq)).collect();
    let keys = keys.map_or(
        pgrx::datum::DatumWithOid::null_oid(pg_sys::TEXTARRAYOID),
        |k| k.arg(),
    );
    let id_arg = pgrx::datum::DatumWithOid::from(ids.as_slice());
    let mut args = vec![ev_type.into(), payloads.arg(), keys, id_arg];
    if let Some(h) = headers {
        args.push(h.into());
    }
    exec(client, &sql, &args);
    crate::wake::sent_at_commit(q.id);
    ids
}

/// [`insert_events`] below SQL ([`direct`]); None when the table needs the
/// SQL INSERT. A jsonb payload is stored as its text (`jsonb::text`).
fn insert_events_direct(
    q: &Queue,
    ev_type: &str,
    payloads: &crate::datum::ArrayDatum,
    keys: Option<&crate::datum::ArrayDatum>,
    headers: Option<super::events::PgJsonb>,
) -> Option<Vec<i64>> {
    // made before open: they outlive its chunk context
    let jsonb = payloads.type_oid == pg_sys::JSONBARRAYOID;
    let elem = if jsonb {
        pg_sys::JSONBOID
    } else {
        pg_sys::TEXTOID
    };
    let (p, pn) = unsafe { payloads.elements(elem) };
    let k = keys.map(|k| unsafe { k.elements(pg_sys::TEXTOID) });
    let ty = direct::Val::Datum(direct::text_datum(ev_type));
    let mut t = direct::Target::open(q, payloads.len, headers.is_some())?;
    let h = headers.map(super::events::PgJsonb::datum);
    let mut scratch = Vec::new();
    let mut ids = Vec::with_capacity(p.len());
    for i in 0..p.len() {
        // the sequence's ACL is checked with the first id, not for each
        let id = if i == 0 {
            nextval(q.seq)
        } else {
            nextval_unchecked(q.seq)
        };
        ids.push(id);
        let data = match (pn[i], jsonb) {
            (true, _) => direct::Val::Null,
            (false, true) => direct::Val::Datum(direct::jsonb_text(p[i], &mut scratch)),
            (false, false) => direct::Val::Datum(p[i]),
        };
        let key = match &k {
            Some((kv, kn)) if i < kv.len() && !kn[i] => direct::Val::Datum(kv[i]),
            _ => direct::Val::Null,
        };
        t.push(
            id,
            ty,
            data,
            [key, direct::Val::Null, direct::Val::Null, direct::Val::Null],
            h,
        );
    }
    t.finish();
    Some(ids)
}

unsafe extern "C-unwind" {
    /// sequence.c's nextval, exported by the server (commands/sequence.h
    /// in every supported major): `check_permissions` false skips the ACL
    /// lookup, as the executor's nextval of a column default does.
    fn nextval_internal(relid: pg_sys::Oid, check_permissions: bool) -> i64;
}

/// The next value of sequence `seq` (the caller owns it: the send path runs
/// as the extension's owner).
fn nextval(seq: pg_sys::Oid) -> i64 {
    unsafe { pgrx::direct_function_call::<i64>(pg_sys::nextval_oid, &[seq.into_datum()]) }
        .expect("nextval returned NULL")
}

/// [`nextval`] without the ACL check, for the second and later ids of one
/// call (1% of a 100-event send_batch's CPU was checking it again). An
/// error it raises (the sequence exhausted) becomes a Rust panic at the
/// boundary, as with pg_sys's own functions.
fn nextval_unchecked(seq: pg_sys::Oid) -> i64 {
    unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| nextval_internal(seq, false)) }
}
