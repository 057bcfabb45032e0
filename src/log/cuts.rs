//! Stored cuts of a big batch range.
//!
//! A batch range (two ticks) holding more events than the batch limit is
//! cut by event id into batches (batch.rs). The event tables are indexed on
//! ev_txid only (one index insert per event keeps sends cheap), so finding
//! "the next `limit` events above the floor" by that index reads every event
//! of the range and sorts them: each cut cost O(range), a drain of one big
//! range O(range^2 / limit).
//!
//! So the range is read once, when its first cut is needed: the ids and
//! tuple addresses (ctid, and which child table) of all its events above the
//! floor, in id order, are stored in `pgque.batch_cut` in chunks of
//! [`CHUNK`] events. Every later cut (and every re-read of a cut batch) reads
//! the chunks that cover it through an index range and fetches its events by
//! address (a TID scan): O(cut). The events fetched are checked against the
//! interval condition and the stored ids, and anything that does not match
//! (a table rewritten by VACUUM FULL, chunks lost with a metadata rotation)
//! falls back to the read by txid, which stays correct, only slower.
//!
//! The rows are per consumer subscription (a partition slot's own, a
//! cooperative consumer's parent), insert-only, and reclaimed by the
//! metadata rotation (maint.rs), which copies forward the chunks of the
//! ranges consumers are still in.
use super::batch::{event_cols, id_range, interval_cond, snapshots, take_events, Event};
use super::slots::Slot;
use super::{col, event_table, exec, plan, Queue};
use pgrx::pg_sys;
use pgrx::spi::SpiClient;

/// Events per stored chunk: small enough that a cut reads little beyond its
/// own events, big enough that a 100,000-event cut reads a few hundred rows.
pub const CHUNK: i64 = 500;

/// Whether `pgque.batch_cut` exists (a 0.6.0 schema not updated yet has
/// none: batches are then cut by the read by txid, as 0.6.0 did).
pub fn installed() -> bool {
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"pgque".as_ptr(), true);
        ns != pg_sys::InvalidOid
            && pg_sys::get_relname_relid(c"batch_cut".as_ptr(), ns) != pg_sys::InvalidOid
    }
}

/// One cut served from stored chunks.
pub struct Cut {
    pub events: Vec<Event>,
    /// The id of the cut's last event when more events of the range are
    /// left above it (the batch's ev_ceiling), else None.
    pub ceiling: Option<i64>,
}

/// Reads the range (prev_tick, tick] of consumer `sub_id` (with `slot`, that
/// slot's events) above `floor` once and stores its chunks. Returns the
/// number of chunk rows written (0: no event above the floor).
///
/// One sorted scan through a cursor, cut into chunks as it is read: SQL's
/// GROUP BY over a row_number() would sort the range again by chunk and each
/// `array_agg(... ORDER BY ev_id)` once more per chunk. The cursor keeps one
/// chunk's tuples in memory at a time, whatever the range's size.
#[allow(clippy::too_many_arguments)]
pub fn build(
    client: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    slot: Option<Slot>,
    prev_tick: i64,
    tick: i64,
    floor: i64,
) -> usize {
    let (prev_snap, cur_snap) = snapshots(client, q, prev_tick, tick);
    // Which child table a row is in, as its number (the fetch names the child).
    let child = (0..q.ntables)
        .map(|n| format!("WHEN '{}'::regclass::oid THEN {n}", event_table(q.id, n)))
        .collect::<Vec<_>>()
        .join(" ");
    // $5 and $6 (the ticks) are not read by the scan; they keep the
    // parameter numbers interval_cond expects ($7, the slot).
    let sql = format!(
        "SELECT ev_id, ctid, (CASE tableoid {child} END)::int2 \
           FROM {} WHERE {} AND {} > $4 \
          ORDER BY ev_id",
        q.parent_table(),
        interval_cond(slot, 7),
        if slot.is_some() { "ev_id" } else { "ev_id + 0" }
    );
    let mut args = vec![
        prev_snap.as_str().into(),
        cur_snap.as_str().into(),
        sub_id.into(),
        floor.into(),
        prev_tick.into(),
        tick.into(),
    ];
    if let Some(s) = slot {
        args.push((s.k as i64).into());
    }
    let k = plan(client, &sql, &args);
    let mut cursor = client.open_cursor(&*k.plan, &args);
    let mut written = 0;
    loop {
        let mut ids: Vec<i64> = Vec::with_capacity(CHUNK as usize);
        let mut tids: Vec<pg_sys::ItemPointerData> = Vec::with_capacity(CHUNK as usize);
        let mut tbls: Vec<i16> = Vec::with_capacity(CHUNK as usize);
        {
            let t = cursor
                .fetch(CHUNK as std::ffi::c_long)
                .unwrap_or_else(|e| panic!("pgque: statement failed: {e}"));
            for r in t {
                ids.push(col(&r, 1).expect("ev_id"));
                tids.push(col(&r, 2).expect("ctid"));
                tbls.push(col(&r, 3).expect("child table"));
            }
        }
        // SAFETY: the chunk's rows were copied out above and nothing refers
        // to the fetched table; SPI would otherwise keep every chunk's
        // tuples until the function returns.
        unsafe { pg_sys::SPI_freetuptable(pg_sys::SPI_tuptable) };
        let n = ids.len();
        if n == 0 {
            break;
        }
        exec(
            client,
            "INSERT INTO pgque.batch_cut (sub_id, prev_tick_id, tick_id, base, first_id, last_id, ids, tids, tbls, piece) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, (SELECT cur_piece FROM pgque.meta_state)",
            &[
                sub_id.into(),
                prev_tick.into(),
                tick.into(),
                floor.into(),
                ids[0].into(),
                ids[n - 1].into(),
                ids.into(),
                tids.into(),
                tbls.into(),
            ],
        );
        written += 1;
        if n < CHUNK as usize {
            break;
        }
    }
    written
}

/// The events of consumer `sub_id`'s range (prev_tick, tick] above `floor`
/// from the stored chunks: up to `ceiling` when given (a batch cut earlier),
/// else the next `limit` (a new cut, whose ceiling is set when events are
/// left above it). None when the chunks do not cover the cut or the events
/// fetched do not match them: the caller reads by txid instead.
#[allow(clippy::too_many_arguments)]
pub fn read(
    client: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    slot: Option<Slot>,
    prev_tick: i64,
    tick: i64,
    floor: i64,
    ceiling: Option<i64>,
    limit: i64,
    with_txid: bool,
) -> Option<Cut> {
    let limit = limit.max(1);
    // Chunk rows in id order from the floor on: enough rows for `limit`
    // events (the first may be partly below the floor), more if that was not.
    // Only a build whose base is at or below the floor covers the cut (a
    // batch opened before the build, below its base, is read by txid). A
    // range is built again only when no such build has events above the
    // floor, so the rows read here are all of one build: no id twice.
    let mut rows = (limit / CHUNK).saturating_add(2).min(1_000_000);
    let (ids, tbls, hi, cut_ceiling) = loop {
        let t = exec(
            client,
            "SELECT last_id, ids, tbls FROM pgque.batch_cut \
              WHERE sub_id = $1 AND prev_tick_id = $2 AND tick_id = $3 AND last_id > $4 \
                AND base <= $4 \
              ORDER BY last_id LIMIT $5",
            &[
                sub_id.into(),
                prev_tick.into(),
                tick.into(),
                floor.into(),
                rows.into(),
            ],
        );
        let got = t.len() as i64;
        let mut ids: Vec<i64> = vec![];
        let mut tbls: Vec<i16> = vec![];
        let mut hi = floor;
        for r in t {
            hi = col(&r, 1).unwrap();
            let rids: Vec<i64> = col(&r, 2).unwrap();
            let rtbls: Vec<i16> = col(&r, 3).unwrap();
            if rids.len() != rtbls.len() {
                return None;
            }
            for (id, tb) in rids.into_iter().zip(rtbls) {
                if id > floor && ceiling.is_none_or(|c| id <= c) {
                    ids.push(id);
                    tbls.push(tb);
                }
            }
        }
        if got == 0 {
            return None;
        }
        let exhausted = got < rows;
        match ceiling {
            Some(c) => {
                if exhausted || hi >= c {
                    break (ids, tbls, hi, Some(c));
                }
            }
            None => {
                if ids.len() as i64 > limit {
                    ids.truncate(limit as usize);
                    tbls.truncate(limit as usize);
                    let c = *ids.last().unwrap();
                    break (ids, tbls, hi, Some(c));
                }
                if exhausted {
                    break (ids, tbls, hi, None);
                }
            }
        }
        rows = rows.saturating_mul(2);
    };
    if ids.is_empty() || !ids.windows(2).all(|w| w[0] < w[1]) {
        return None;
    }
    let upper = cut_ceiling.unwrap_or(i64::MAX);
    let (prev_snap, cur_snap) = snapshots(client, q, prev_tick, tick);
    let mut children: Vec<i16> = tbls.clone();
    children.sort_unstable();
    children.dedup();
    let mut events: Vec<Event> = Vec::with_capacity(ids.len());
    for n in children {
        if n < 0 || n as i32 >= q.ntables {
            return None;
        }
        // The addresses come from the chunk rows inside the statement (an
        // InitPlan array, so the child is read by a TID scan); the interval
        // condition and the id bounds re-check every row fetched.
        let sql = format!(
            "SELECT {} FROM {} \
              WHERE ctid = ANY (ARRAY(SELECT u.t FROM pgque.batch_cut c \
                                        CROSS JOIN LATERAL unnest(c.ids, c.tids, c.tbls) AS u(i, t, n) \
                                       WHERE c.sub_id = $3 AND c.prev_tick_id = $6 AND c.tick_id = $7 \
                                         AND c.last_id > $4 AND c.last_id <= $8 AND c.base <= $4 \
                                         AND u.i > $4 AND u.i <= $5 AND u.n = {n})) \
                AND {} AND {} \
              ORDER BY ev_id",
            event_cols(with_txid),
            event_table(q.id, n as i32),
            interval_cond(slot, 9),
            id_range(slot)
        );
        let mut args = vec![
            prev_snap.as_str().into(),
            cur_snap.as_str().into(),
            sub_id.into(),
            floor.into(),
            upper.into(),
            prev_tick.into(),
            tick.into(),
            hi.into(),
        ];
        if let Some(s) = slot {
            args.push((s.k as i64).into());
        }
        let t = exec(client, &sql, &args);
        let got = take_events(t.len());
        let want = ids
            .iter()
            .zip(&tbls)
            .filter(|(_, tb)| **tb == n)
            .map(|(id, _)| *id);
        if !got.iter().map(|e| e.id).eq(want) {
            return None;
        }
        events.extend(got);
    }
    events.sort_by_key(|e| e.id);
    Some(Cut {
        events,
        ceiling: cut_ceiling.filter(|_| ceiling.is_none()),
    })
}
