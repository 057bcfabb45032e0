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
//! address (a TID range scan over the pages they fill, or a TID scan of the
//! addresses when they are a fraction of their pages): O(cut). The events
//! fetched are checked against the interval condition and the stored ids,
//! and anything that does not match (a table rewritten by VACUUM FULL,
//! chunks lost with a metadata rotation or a crash) falls back to the read
//! by txid, which stays correct, only slower.
//!
//! The rows are per consumer subscription (a partition slot's own, a
//! cooperative consumer's parent), insert-only, and reclaimed by the
//! metadata rotation (maint.rs), which copies forward the chunks of the
//! ranges consumers are still in.
//! The table is unlogged: what it holds is derived from the event tables,
//! and a cut whose chunks are gone (a crash empties it) reads by txid or
//! builds them again.
use super::events::{event_cols, id_range, interval_cond, snapshots, take_events, Event};
use super::queue::{event_table, Queue};
use super::slot::Slot;
use super::spi::{col, exec, plan};
use pgrx::pg_sys;
use pgrx::spi::SpiClient;

/// Events per stored chunk: a row of 100 ids, addresses and table numbers
/// (~1.7 kB) stays under the TOAST threshold, so the build neither
/// compresses nor writes a TOAST table and a read detoasts nothing; a cut
/// reads little beyond its own events, a 100,000-event cut a thousand rows.
pub const CHUNK: i64 = 100;

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

/// One stored event of a cut: its id, tuple address and child table.
struct Stored {
    id: i64,
    tid: pg_sys::ItemPointerData,
    tbl: i16,
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
    let (want, cut_ceiling) = loop {
        let t = exec(
            client,
            "SELECT last_id, ids, tids, tbls FROM pgque.batch_cut \
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
        let mut want: Vec<Stored> = vec![];
        let mut hi = floor;
        for r in t {
            hi = col(&r, 1)?;
            let ids: Vec<i64> = col(&r, 2)?;
            let tids: Vec<pg_sys::ItemPointerData> = col(&r, 3)?;
            let tbls: Vec<i16> = col(&r, 4)?;
            if ids.len() != tids.len() || ids.len() != tbls.len() {
                return None;
            }
            for ((id, tid), tbl) in ids.into_iter().zip(tids).zip(tbls) {
                if id > floor && ceiling.is_none_or(|c| id <= c) {
                    want.push(Stored { id, tid, tbl });
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
                    break (want, Some(c));
                }
            }
            None => {
                if want.len() as i64 > limit {
                    want.truncate(limit as usize);
                    let c = want.last().unwrap().id;
                    break (want, Some(c));
                }
                if exhausted {
                    break (want, None);
                }
            }
        }
        rows = rows.saturating_mul(2);
    };
    if want.is_empty() || !want.windows(2).all(|w| w[0].id < w[1].id) {
        return None;
    }
    let upper = cut_ceiling.unwrap_or(i64::MAX);
    let (prev_snap, cur_snap) = snapshots(client, q, prev_tick, tick);
    let mut children: Vec<i16> = want.iter().map(|w| w.tbl).collect();
    children.sort_unstable();
    children.dedup();
    let mut events: Vec<Event> = Vec::with_capacity(want.len());
    for n in children {
        if n < 0 || n as i32 >= q.ntables {
            return None;
        }
        let mine: Vec<&Stored> = want.iter().filter(|w| w.tbl == n).collect();
        let tids: Vec<pg_sys::ItemPointerData> = mine.iter().map(|w| w.tid).collect();
        // The rows are fetched by address: the pages between the cut's
        // lowest and highest address when its events fill them (a TID range
        // scan reads a page's tuples under one buffer lock), else one by one
        // (a slot's events are a fraction of every page's). The interval
        // condition and the id bounds re-check every row fetched, and the ids
        // must be exactly the stored ones.
        let span = span(&tids);
        let (fetch, slot_param) = match span {
            Some(_) => ("ctid >= $6 AND ctid <= $7", 8),
            None => ("ctid = ANY ($6)", 7),
        };
        let sql = format!(
            "SELECT {} FROM {} WHERE {fetch} AND {} AND {} ORDER BY ev_id",
            event_cols(with_txid),
            event_table(q.id, n as i32),
            interval_cond(slot, slot_param),
            id_range(slot)
        );
        let mut args = vec![
            prev_snap.as_str().into(),
            cur_snap.as_str().into(),
            sub_id.into(),
            floor.into(),
            upper.into(),
        ];
        match span {
            Some((lo, hi)) => {
                args.push(lo.into());
                args.push(hi.into());
            }
            None => args.push(tids.into()),
        }
        if let Some(s) = slot {
            args.push((s.k as i64).into());
        }
        let t = exec(client, &sql, &args);
        let got = take_events(t.len());
        if !got.iter().map(|e| e.id).eq(mine.iter().map(|w| w.id)) {
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

/// The lowest and highest of `tids` when a range scan between them reads
/// at most about twice as many rows as `tids` (a page's rows estimated by
/// the highest line number seen on it, a page with none of `tids` by the
/// average of those with some). None otherwise.
fn span(
    tids: &[pg_sys::ItemPointerData],
) -> Option<(pg_sys::ItemPointerData, pg_sys::ItemPointerData)> {
    use pgrx::itemptr::{item_pointer_get_both, item_pointer_to_u64};
    let mut sorted = tids.to_vec();
    sorted.sort_unstable_by_key(|t| item_pointer_to_u64(*t));
    let (lo, hi) = (*sorted.first()?, *sorted.last()?);
    // (block, highest line number of `tids` on it), in block order
    let mut pages: Vec<(u32, u64)> = vec![];
    for (b, o) in sorted.iter().map(|t| item_pointer_get_both(*t)) {
        match pages.last_mut() {
            Some(p) if p.0 == b => p.1 = o as u64,
            _ => pages.push((b, o as u64)),
        }
    }
    let seen: u64 = pages.iter().map(|p| p.1).sum();
    let avg = seen.div_ceil(pages.len() as u64);
    let blocks = (pages.last()?.0 - pages[0].0 + 1) as u64;
    // Read from lo on (the first page's rows before it are not); the last
    // page's highest line number seen is hi's own.
    let lo_off = item_pointer_get_both(lo).1 as u64;
    let rows = seen - (lo_off - 1) + (blocks - pages.len() as u64) * avg;
    (rows <= 2 * tids.len() as u64 + 16).then_some((lo, hi))
}
