//! Reading event rows: the event as the engine returns it, the column list
//! and id-range conditions of the reads (for a plain consumer or one slot),
//! the snapshots of a batch's two ticks, and the datums of text and jsonb
//! columns kept as they are. Batches (batch.rs) and their stored cuts
//! (cuts.rs) both read through here.
use super::queue::Queue;
use super::slot::{slot_expr, Slot};
use super::tick;
use crate::error::{self, raise};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::spi::SpiClient;
use pgrx::FromDatum;

#[derive(Debug, Clone)]
pub struct Event {
    pub id: i64,
    pub time: TimestampWithTimeZone,
    pub txid: i64,
    pub retry: Option<i32>,
    pub ev_type: Option<PgText>,
    pub data: Option<PgText>,
    pub extra: [Option<PgText>; 4],
    /// ev_headers (trace context), NULL for most events and on a schema
    /// without the column.
    pub headers: Option<PgJsonb>,
}

/// A text value read from an event table, kept as PostgreSQL's datum: a
/// receive hands it to its result set as it is. Converting every payload to a
/// Rust String and back (and reading the row column by column through pgrx)
/// was ~20% of a drain's CPU per event.
#[derive(Debug, Clone, Copy)]
pub struct PgText(pg_sys::Datum);

impl PgText {
    /// The value as a Rust string (a copy).
    pub fn to_string_lossy(self) -> String {
        unsafe {
            let c = pg_sys::text_to_cstring(self.0.cast_mut_ptr());
            let s = std::ffi::CStr::from_ptr(c).to_string_lossy().into_owned();
            pg_sys::pfree(c.cast());
            s
        }
    }
}

impl pgrx::IntoDatum for PgText {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::TEXTOID
    }
}

/// A jsonb value read from an event table (its headers), kept as
/// PostgreSQL's datum like [`PgText`].
#[derive(Debug, Clone, Copy)]
pub struct PgJsonb(pg_sys::Datum);

impl PgJsonb {
    /// A JSON value as a jsonb datum (made in the current memory context).
    pub fn new(j: pgrx::JsonB) -> PgJsonb {
        PgJsonb(pgrx::IntoDatum::into_datum(j).expect("jsonb datum"))
    }

    /// The datum itself.
    pub fn datum(self) -> pg_sys::Datum {
        self.0
    }

    /// The value as JSON text (a copy).
    pub fn to_json_string(self) -> String {
        unsafe { pgrx::JsonB::from_datum(self.0, false) }
            .map(|j| j.0.to_string())
            .unwrap_or_default()
    }
}

impl pgrx::IntoDatum for PgJsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

/// The snapshots of a batch's two ticks, as text (42704 when one is gone).
pub(super) fn snapshots(
    client: &mut SpiClient<'_>,
    q: &Queue,
    prev_tick: i64,
    tick: i64,
) -> (String, String) {
    // Both in one statement (a receive that opens a batch runs this once).
    let (prev, cur) = tick::tick_snapshots(client, q.id, prev_tick, tick);
    let gone = |t: i64| -> String {
        raise(
            error::UNDEFINED_OBJECT,
            format!("tick {t} of queue {:?} is gone", q.name),
        )
    };
    (
        prev.unwrap_or_else(|| gone(prev_tick)),
        cur.unwrap_or_else(|| gone(tick)),
    )
}

/// The columns an event read selects, in [`take_events`]' order: the
/// headers last, NULL on a schema without them
/// ([`crate::headers::events_have_headers`]).
pub(super) fn event_cols(with_txid: bool) -> &'static str {
    match (with_txid, crate::headers::events_have_headers()) {
        (true, true) => {
            "ev_id, ev_time, ev_txid::text::int8, ev_retry, ev_type, ev_data, \
             ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_headers"
        }
        (true, false) => {
            "ev_id, ev_time, ev_txid::text::int8, ev_retry, ev_type, ev_data, \
             ev_extra1, ev_extra2, ev_extra3, ev_extra4, NULL::jsonb"
        }
        (false, true) => {
            "ev_id, ev_time, 0::int8, ev_retry, ev_type, ev_data, \
             ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_headers"
        }
        (false, false) => {
            "ev_id, ev_time, 0::int8, ev_retry, ev_type, ev_data, \
             ev_extra1, ev_extra2, ev_extra3, ev_extra4, NULL::jsonb"
        }
    }
}

/// A batch's event id bounds ($4 < ev_id <= $5). Without a slot, out of
/// reach of any index (`ev_id + 0`): no event-table index leads with ev_id,
/// the slot indexes hold it as their third column, and a generic plan made
/// while the table was empty used one for these bounds alone (Bitmap Index
/// Scan on event_<q>_<n>_slot<N>_idx, Index Cond: ev_id > $4 AND ev_id <=
/// $5): a scan of the whole index, with a floor of 0 and no ceiling, for
/// every plain or cooperative batch once a partitioned consumer existed. A
/// slot's read keeps them in its slot index's range (slot = k, its txid
/// range, then these), where they bound the rows a cut of a big interval
/// fetches.
pub(super) fn id_range(slot: Option<Slot>) -> &'static str {
    if slot.is_some() {
        "ev_id > $4 AND ev_id <= $5"
    } else {
        "ev_id + 0 > $4 AND ev_id + 0 <= $5"
    }
}

/// The condition that an event row belongs to a batch range and consumer:
/// committed between the snapshots $1 (earlier tick) and $2 (later tick),
/// for everyone or for consumer $3 (a retry), and with `slot`, on that slot
/// (its number is parameter `$slot_param`).
///
/// The slot's condition names the index expression of its N literally
/// (the planner matches index expressions by their text), its slot number
/// is a parameter: one kept plan per (queue, N).
/// Its lower txid bound (every event the earlier tick did not see has
/// ev_txid >= that snapshot's xmin) makes the index range start at the
/// batch, not at the slot's oldest event still in the table.
///
/// Every path to the rows through an index is bounded by the batch, so a
/// kept generic plan stays as fast as the table grows. Without a slot, the
/// only txid condition is an OR whose arms are both closed ranges
/// (`[xmax(earlier), xmax(later))`, and the earlier snapshot's in-progress
/// ids), which the planner can only use as a BitmapOr of two bounded index
/// scans (sequential scans are off in these functions). It used to be
/// `ev_txid < xmax(later) AND (ev_txid >= xmax(earlier) OR ...)`: a plan
/// made while the event table was empty (a fresh database, before the first
/// ANALYZE) took the one-sided `ev_txid < xmax(later)` as its index
/// condition -- estimated a third of a few hundred rows, cheaper than the
/// BitmapOr -- and kept it for the life of the backend: every batch read
/// every event older than itself still in the table (EXPLAIN: Bitmap Index
/// Scan, Index Cond: ev_txid < pg_snapshot_xmax($0), rows=50000, Rows
/// Removed by Filter: 49900 for a batch of 100), a receive 10x slower after
/// 30 s of 2,000 events/s. With a slot, the slot index takes the range
/// `[xmin(earlier), xmax(later))` of that slot, and so would the txid index.
pub(super) fn interval_cond(slot: Option<Slot>, slot_param: usize) -> String {
    let head = match slot {
        Some(s) => format!(
            "{} = ${slot_param} AND ev_txid >= pg_snapshot_xmin((SELECT $1::pg_snapshot)) \
             AND ev_txid < pg_snapshot_xmax((SELECT $2::pg_snapshot)) AND ",
            slot_expr(s.n)
        ),
        None => String::new(),
    };
    format!(
        "{head}((ev_txid >= pg_snapshot_xmax((SELECT $1::pg_snapshot)) \
                   AND ev_txid < pg_snapshot_xmax((SELECT $2::pg_snapshot))) \
                 OR ev_txid = ANY (ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot)))) \
            AND pg_visible_in_snapshot(ev_txid, (SELECT $2::pg_snapshot)) \
            AND NOT pg_visible_in_snapshot(ev_txid, (SELECT $1::pg_snapshot)) \
            AND (ev_owner IS NULL OR ev_owner = $3)"
    )
}

/// The events of the statement just run (its `len` rows, of
/// [`event_cols`]), read straight from SPI's result table: one
/// heap_deform_tuple per row, and the text columns copied as datums into
/// the memory context that outlives this SPI connection (the calling
/// function's), where the caller's result set picks them up. Call it while
/// the statement's SpiTupleTable is alive.
pub(super) fn take_events(len: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(len);
    unsafe {
        let tt = pg_sys::SPI_tuptable;
        assert!(!tt.is_null(), "the event read left no result table");
        assert_eq!((*(*tt).tupdesc).natts, 11, "the event read has 11 columns");
        let mut values = [pg_sys::Datum::from(0); 11];
        let mut nulls = [false; 11];
        // A TOASTed value is fetched and decompressed first: the copy must not
        // point into the event table's TOAST relation (a plain value is not
        // copied by the detoast).
        let text = |i: usize, values: &[pg_sys::Datum; 11], nulls: &[bool; 11]| {
            (!nulls[i]).then(|| {
                let plain = pg_sys::pg_detoast_datum_packed(values[i].cast_mut_ptr());
                PgText(pg_sys::SPI_datumTransfer(
                    pg_sys::Datum::from(plain),
                    false,
                    -1,
                ))
            })
        };
        for i in 0..len {
            pg_sys::heap_deform_tuple(
                *(*tt).vals.add(i),
                (*tt).tupdesc,
                values.as_mut_ptr(),
                nulls.as_mut_ptr(),
            );
            out.push(Event {
                id: i64::from_datum(values[0], nulls[0]).expect("ev_id"),
                time: TimestampWithTimeZone::from_datum(values[1], nulls[1]).expect("ev_time"),
                txid: i64::from_datum(values[2], nulls[2]).expect("txid"),
                retry: i32::from_datum(values[3], nulls[3]),
                ev_type: text(4, &values, &nulls),
                data: text(5, &values, &nulls),
                extra: [
                    text(6, &values, &nulls),
                    text(7, &values, &nulls),
                    text(8, &values, &nulls),
                    text(9, &values, &nulls),
                ],
                // jsonb with a 4-byte header: as its functions take it
                headers: (!nulls[10]).then(|| {
                    let full = pg_sys::pg_detoast_datum(values[10].cast_mut_ptr());
                    PgJsonb(pg_sys::SPI_datumTransfer(
                        pg_sys::Datum::from(full),
                        false,
                        -1,
                    ))
                }),
            });
        }
    }
    out
}
