//! Batches and consumer positions.
//!
//! A batch is a row of the append-only batch log: (prev_tick, tick, ev_floor,
//! ev_ceiling). Its events are those committed between the two ticks'
//! snapshots (visible in tick's, not in prev_tick's) with
//! ev_floor < ev_id <= ev_ceiling, in ev_id order. When a range holds more
//! events than the batch limit, the batch gets a ceiling (its last event id)
//! and the next batch continues the same tick range above it; so a ticker
//! outage or a huge producer transaction never yields a giant batch.
//!
//! A consumer's position is its latest batch: open (no batch_done row) or
//! finished. Opening, finishing and reading a position take no UPDATE: rows
//! are inserted only, and reclaimed by the metadata rotation in maint().
//! Opening a batch locks the consumer's subscription row (FOR NO KEY UPDATE),
//! so two sessions receiving for one consumer get the same batch.
use super::cuts;
use super::events::{event_cols, id_range, interval_cond, snapshots, take_events, Event};
use super::queue::Queue;
use super::slot::Slot;
use super::spi::{col, exec, first_row};
use crate::error::{self, raise};
use pgrx::spi::SpiClient;

#[derive(Debug, Clone)]
pub struct Batch {
    pub batch_id: i64,
    pub sub_id: i32,
    pub member_id: Option<i32>,
    pub prev_tick: i64,
    pub tick: i64,
    pub floor: i64,
    pub ceiling: Option<i64>,
    pub done: bool,
    /// The partition slot whose events this batch holds (a slot
    /// subscription's batch), None for a plain or cooperative consumer.
    pub slot: Option<Slot>,
}

/// The batch columns and whether it is done. "Done" is a scalar subquery
/// with LIMIT 1, not EXISTS: the planner may run an EXISTS as a hashed
/// subplan, which reads every id of batch_done (all the batches since the
/// last metadata rotation) to answer for the one row these lookups return;
/// it does so in the generic plans of latest_batch, whose estimate is taken
/// before its LIMIT 1. A scalar subquery is always an index probe per row.
const BATCH_COLS: &str =
    "b.batch_id, b.sub_id, b.member_id, b.prev_tick_id, b.tick_id, b.ev_floor, b.ev_ceiling, \
     (SELECT true FROM pgque.batch_done d WHERE d.batch_id = b.batch_id LIMIT 1) IS NOT NULL";

fn batch_from(r: &pgrx::spi::SpiHeapTupleData<'_>) -> Batch {
    Batch {
        batch_id: col(r, 1).unwrap(),
        sub_id: col(r, 2).unwrap(),
        member_id: col(r, 3),
        prev_tick: col(r, 4).unwrap(),
        tick: col(r, 5).unwrap(),
        floor: col(r, 6).unwrap(),
        ceiling: col(r, 7),
        done: col(r, 8).unwrap(),
        slot: None,
    }
}

/// The frontier batch of a consumer (any member): the one with the furthest
/// range; for a plain consumer, its latest batch.
pub fn latest_batch(client: &mut SpiClient<'_>, sub_id: i32) -> Option<Batch> {
    let sql = format!(
        "SELECT {BATCH_COLS} FROM pgque.batch b WHERE b.sub_id = $1 \
         ORDER BY b.tick_id DESC, b.ev_floor DESC, b.batch_id DESC LIMIT 1"
    );
    let t = exec(client, &sql, &[sub_id.into()]);
    first_row(t).map(|r| batch_from(&r))
}

/// A cooperative member's open batch.
///
/// A member holds at most one open batch, and it is its latest: it gets its
/// open batch back before it may open or take over another. So this reads
/// the member's latest batch, newest batch id first through batch_id_idx
/// (`sub_id + 0` keeps the consumer's index out of the plan), and returns it
/// when it is open. Looking for an open batch among all the consumer's
/// batches instead read every batch of the metadata piece (one batch_done
/// probe each) on every call, 2-4 ms after 30 s of a busy stream.
pub fn member_open_batch(client: &mut SpiClient<'_>, sub_id: i32, member: i32) -> Option<Batch> {
    let sql = format!(
        "SELECT {BATCH_COLS} FROM pgque.batch b WHERE b.member_id = $2 AND b.sub_id + 0 = $1 \
         ORDER BY b.batch_id DESC LIMIT 1"
    );
    let t = exec(client, &sql, &[sub_id.into(), member.into()]);
    first_row(t).map(|r| batch_from(&r)).filter(|b| !b.done)
}

/// Looks a batch up by id: (batch, queue id, consumer name).
pub fn batch_by_id(client: &mut SpiClient<'_>, batch_id: i64) -> Option<(Batch, Queue, String)> {
    // Without the partition-key tables (a 0.1.0 schema not updated yet) no
    // batch belongs to a slot.
    let (slot_cols, slot_join) = if crate::log::schema::slots_installed() {
        (
            "ps.ps_n, ps.ps_slot",
            "LEFT JOIN pgque.partition_slot ps ON ps.ps_sub = b.sub_id",
        )
    } else {
        ("NULL::int4, NULL::int4", "")
    };
    let sql = format!(
        "SELECT {BATCH_COLS}, q.queue_id, q.queue_name, q.queue_cur_table, q.queue_ntables, \
                q.queue_max_retries, s.sub_consumer, {slot_cols}, \
                q.queue_event_seq::pg_catalog.oid \
           FROM pgque.batch b JOIN pgque.subscription s ON s.sub_id = b.sub_id \
           JOIN pgque.queue q ON q.queue_id = s.sub_queue \
           {slot_join} \
          WHERE b.batch_id = $1 LIMIT 1"
    );
    let t = exec(client, &sql, &[batch_id.into()]);
    first_row(t).map(|r| {
        let mut b = batch_from(&r);
        b.slot = match (col::<i32>(&r, 15), col::<i32>(&r, 16)) {
            (Some(n), Some(k)) => Some(Slot { n, k }),
            _ => None,
        };
        let q = Queue {
            id: col(&r, 9).unwrap(),
            name: col(&r, 10).unwrap(),
            cur_table: col(&r, 11).unwrap(),
            ntables: col(&r, 12).unwrap(),
            max_retries: col(&r, 13).unwrap(),
            seq: col(&r, 17).unwrap(),
        };
        (b, q, col(&r, 14).unwrap())
    })
}

/// A batch that must be open: 22004 for NULL, 42704 unknown, 55000 finished.
/// Both messages start with PgQue's "batch not found" (its clients map that
/// phrase to their batch-not-found error; a finished batch is one PgQue no
/// longer finds).
pub fn open_batch_by_id(
    client: &mut SpiClient<'_>,
    batch_id: Option<i64>,
) -> (Batch, Queue, String) {
    let batch_id = error::required(batch_id, "batch_id");
    let found = batch_by_id(client, batch_id).unwrap_or_else(|| {
        raise(
            error::UNDEFINED_OBJECT,
            format!("batch not found: {batch_id}"),
        )
    });
    if found.0.done {
        raise(
            error::WRONG_STATE,
            format!("batch not found: {batch_id} is already finished"),
        );
    }
    found
}

/// Locks the consumer's subscription row: one batch opener per consumer.
pub fn lock_sub(client: &mut SpiClient<'_>, sub_id: i32) {
    let t = exec(
        client,
        "SELECT 1 FROM pgque.subscription WHERE sub_id = $1 FOR NO KEY UPDATE",
        &[sub_id.into()],
    );
    if t.is_empty() {
        raise(
            error::UNDEFINED_OBJECT,
            "consumer not registered: it was unsubscribed concurrently",
        );
    }
}

/// Reads a batch's events (in ev_id order), at most `limit`, optionally one
/// id; with `slot`, only that slot's events, through the slot index.
#[allow(clippy::too_many_arguments)]
pub fn read_events(
    client: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    slot: Option<Slot>,
    prev_tick: i64,
    tick: i64,
    floor: i64,
    ceiling: Option<i64>,
    limit: i64,
    only: Option<i64>,
) -> Vec<Event> {
    read_events_ext(
        client, q, sub_id, slot, prev_tick, tick, floor, ceiling, limit, only, false,
    )
}

/// The events of batch `b` (its range, slot and cut bounds), at most
/// `limit`, optionally one id, with `Event::txid` when `with_txid`.
pub fn read_batch(
    client: &mut SpiClient<'_>,
    q: &Queue,
    b: &Batch,
    limit: i64,
    only: Option<i64>,
    with_txid: bool,
) -> Vec<Event> {
    read_events_ext(
        client,
        q,
        b.sub_id,
        b.slot,
        b.prev_tick,
        b.tick,
        b.floor,
        b.ceiling,
        limit,
        only,
        with_txid,
    )
}

/// [`read_events`], with `Event::txid` filled in when `with_txid` (else 0).
///
/// The snapshots come in as text and are cast inside scalar subqueries, which
/// PostgreSQL evaluates once per execution (InitPlans): cast in the WHERE
/// clause, a generic plan parsed both snapshots again for every row. Only
/// get_batch_events shows the transaction id; rendering xid8 through text for
/// every row of every receive was another ~5% of a drain.
#[allow(clippy::too_many_arguments)]
pub fn read_events_ext(
    client: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    slot: Option<Slot>,
    prev_tick: i64,
    tick: i64,
    floor: i64,
    ceiling: Option<i64>,
    limit: i64,
    only: Option<i64>,
    with_txid: bool,
) -> Vec<Event> {
    let (prev_snap, cur_snap) = snapshots(client, q, prev_tick, tick);
    let sql = format!(
        "SELECT {} FROM {} \
          WHERE {} \
            AND {} \
            AND ($7::int8 IS NULL OR ev_id = $7) \
          ORDER BY ev_id LIMIT $6",
        event_cols(with_txid),
        q.parent_table(),
        interval_cond(slot, 8),
        id_range(slot)
    );
    let mut args = vec![
        prev_snap.as_str().into(),
        cur_snap.as_str().into(),
        sub_id.into(),
        floor.into(),
        ceiling.unwrap_or(i64::MAX).into(),
        limit.into(),
        only.into(),
    ];
    if let Some(s) = slot {
        args.push((s.k as i64).into());
    }
    let t = exec(client, &sql, &args);
    // (`t` stays in scope while the rows are taken: they are its table's)
    take_events(t.len())
}

/// All events of a batch; `with_txid` as in [`read_events_ext`].
pub fn batch_events(
    client: &mut SpiClient<'_>,
    q: &Queue,
    b: &Batch,
    with_txid: bool,
) -> Vec<Event> {
    // A cut of a big range is re-read from its stored chunks (cuts.rs).
    if (b.floor > 0 || b.ceiling.is_some()) && crate::log::schema::cuts_installed() {
        if let Some(c) = cuts::read(
            client,
            q,
            b.sub_id,
            b.slot,
            b.prev_tick,
            b.tick,
            b.floor,
            b.ceiling,
            i64::MAX,
            with_txid,
        ) {
            return c.events;
        }
    }
    read_batch(client, q, b, i64::MAX, None, with_txid)
}

fn insert_batch(client: &mut SpiClient<'_>, b: &Batch) -> i64 {
    let t = exec(
        client,
        "INSERT INTO pgque.batch (batch_id, sub_id, member_id, prev_tick_id, tick_id, ev_floor, ev_ceiling, opened_at, piece) \
         VALUES (nextval('pgque.batch_id_seq'), $1, $2, $3, $4, $5, $6, now(), (SELECT cur_piece FROM pgque.meta_state)) \
         RETURNING batch_id",
        &[
            b.sub_id.into(),
            b.member_id.into(),
            b.prev_tick.into(),
            b.tick.into(),
            b.floor.into(),
            b.ceiling.into(),
        ],
    );
    col(&first_row(t).unwrap(), 1).unwrap()
}

/// Records a batch as finished (or abandoned).
pub fn mark_done(client: &mut SpiClient<'_>, batch_id: i64, abandoned: bool) {
    exec(
        client,
        "INSERT INTO pgque.batch_done (batch_id, done_at, abandoned, piece) \
         VALUES ($1, now(), $2, (SELECT cur_piece FROM pgque.meta_state))",
        &[batch_id.into(), abandoned.into()],
    );
}

/// The range the next batch after `frontier` covers, or None when there is
/// no newer tick. A batch follows ticks: it reaches the furthest tick whose
/// events since its start fit in `limit` (by the ticks' event-sequence
/// values), and at least the next tick. So a consumer that fell behind reads
/// about `limit` events a batch, each from its own tick range, instead of
/// one range up to the last tick re-read for every capped cut of it; only a
/// single tick interval larger than `limit` (one huge transaction, a ticker
/// outage) is cut by event id, through stored cuts (cuts.rs).
///
/// The range comes with whether it is known to hold more than `limit`
/// events (a cut's continuation, or a next tick already beyond `limit`):
/// such a range is read once into stored cuts.
fn next_range(
    client: &mut SpiClient<'_>,
    q: &Queue,
    frontier: Option<&Batch>,
    start_tick: i64,
    limit: i64,
) -> Option<(Range, bool)> {
    if let Some(f) = frontier {
        if let Some(c) = f.ceiling {
            return Some(((f.prev_tick, f.tick, c), true));
        }
    }
    let from = frontier.map(|f| f.tick).unwrap_or(start_tick);
    // One statement: the next tick is looked up only when no tick within
    // `limit` exists (coalesce), and OFFSET 0 keeps the first lookup from
    // being pulled up and run twice. A later tick has a later event
    // sequence value, so the row bound (seq, id) > the frontier's is the
    // same set as tick_id > its: it starts the index range at the frontier,
    // where `tick_id >` alone, a filter, walked back through every older
    // tick of the queue whenever no newer one existed (each caught-up
    // receive, O(ticks kept)).
    let t = exec(
        client,
        "SELECT coalesce(w.t, (SELECT tick_id FROM pgque.tick WHERE tick_queue = $1 AND tick_id > $2 \
                               ORDER BY tick_id LIMIT 1)), w.t IS NULL \
           FROM (SELECT (SELECT t2.tick_id FROM pgque.tick t1 \
                           CROSS JOIN LATERAL (SELECT t2.tick_id FROM pgque.tick t2 \
                                                WHERE t2.tick_queue = t1.tick_queue AND t2.tick_id > t1.tick_id \
                                                  AND (t2.tick_event_seq, t2.tick_id) > (t1.tick_event_seq, t1.tick_id) \
                                                  AND t2.tick_event_seq <= t1.tick_event_seq + $3 \
                                                ORDER BY t2.tick_event_seq DESC, t2.tick_id DESC LIMIT 1) t2 \
                          WHERE t1.tick_queue = $1 AND t1.tick_id = $2) AS t OFFSET 0) w",
        &[q.id.into(), from.into(), limit.into()],
    );
    let r = first_row(t)?;
    let end: i64 = col(&r, 1)?;
    // Even the next tick is more than `limit` events ahead: a big range.
    let big: bool = col(&r, 2).unwrap();
    Some(((from, end, 0), big))
}

/// A batch range: (prev_tick, tick, ev_floor).
type Range = (i64, i64, i64);

/// What opening a batch gave.
pub struct Opened {
    pub batch: Batch,
    /// The events, when they were read while opening (a new batch).
    pub events: Option<Vec<Event>>,
}

/// The subscription's start tick (where its first batch begins).
pub fn start_tick(client: &mut SpiClient<'_>, sub_id: i32) -> i64 {
    let t = exec(
        client,
        "SELECT sub_start_tick FROM pgque.subscription WHERE sub_id = $1",
        &[sub_id.into()],
    );
    col(&first_row(t).unwrap(), 1).unwrap()
}

/// The next cut of `range` for `sub_id`: its events (at most `limit`) and
/// its ceiling (set when events of the range are left above it). A range
/// known to be big (`big`) is served from stored cuts, built on its first
/// cut; another is read by txid, and if it turns out bigger than `limit`,
/// the rest above this cut is stored for the next cuts.
#[allow(clippy::too_many_arguments)]
fn cut_range(
    client: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    slot: Option<Slot>,
    range: Range,
    limit: i64,
    big: bool,
) -> (Vec<Event>, Option<i64>) {
    let (prev, tick, floor) = range;
    let stored = (big || floor > 0) && crate::log::schema::cuts_installed();
    if stored {
        let read = |client: &mut SpiClient<'_>| {
            cuts::read(
                client, q, sub_id, slot, prev, tick, floor, None, limit, false,
            )
        };
        if let Some(c) = read(client) {
            return (c.events, c.ceiling);
        }
        if cuts::build(client, q, sub_id, slot, prev, tick, floor) > 0 {
            if let Some(c) = read(client) {
                return (c.events, c.ceiling);
            }
        }
    }
    let mut evs = read_events(
        client,
        q,
        sub_id,
        slot,
        prev,
        tick,
        floor,
        None,
        limit + 1,
        None,
    );
    let ceiling = if evs.len() as i64 > limit {
        evs.truncate(limit as usize);
        let c = evs.last().map(|e| e.id);
        if let (false, Some(c)) = (stored, c) {
            if crate::log::schema::cuts_installed() {
                cuts::build(client, q, sub_id, slot, prev, tick, c);
            }
        }
        c
    } else {
        None
    };
    (evs, ceiling)
}

/// Opens a batch over `range` (cut to `limit` events) for sub/member.
#[allow(clippy::too_many_arguments)]
fn open_range(
    client: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    member: Option<i32>,
    slot: Option<Slot>,
    range: Range,
    limit: i64,
    big: bool,
) -> Opened {
    let (prev, tick, floor) = range;
    let (evs, ceiling) = cut_range(client, q, sub_id, slot, range, limit, big);
    let mut b = Batch {
        batch_id: 0,
        sub_id,
        member_id: member,
        prev_tick: prev,
        tick,
        floor,
        ceiling,
        done: false,
        slot,
    };
    b.batch_id = insert_batch(client, &b);
    Opened {
        batch: b,
        events: Some(evs),
    }
}

/// Returns the consumer's open batch or opens the next one (at most `limit`
/// events). None when there is no new tick to read up to.
pub fn next_batch(
    client: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    limit: i64,
) -> Option<Opened> {
    next_batch_of(client, q, sub_id, None, limit, None, &mut |_| None)
}

/// next_batch for a plain consumer (`slot` None) or a partition slot's
/// subscription. A slot sees about 1/N of the stream, so its batches follow
/// ticks over up to `limit * N` events of the stream to hold about `limit`
/// of its own (a skewed slot's bigger share is cut at `limit` as usual).
/// For a slot, `lock_slot` is called before a batch is opened: it takes the
/// slot's lease row (receive_partitioned's fence), which serializes the
/// slot's openers, and returns the slot's seal as read under that lock.
/// A sealed slot (a resize in progress, src/log/resize.rs) opens no batch
/// past its seal tick: its ranges end at the seal, and once there it has
/// nothing to open. `seal_hint` (the seal read without the lock) lets an
/// idle poll of a drained slot return without taking the lock.
pub fn next_batch_of(
    client: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    slot: Option<Slot>,
    limit: i64,
    seal_hint: Option<i64>,
    lock_slot: &mut dyn FnMut(&mut SpiClient<'_>) -> Option<i64>,
) -> Option<Opened> {
    let span = slot.map_or(limit, |s| limit.saturating_mul(s.n as i64));
    let open = |b: &Batch| {
        Some(Opened {
            batch: Batch { slot, ..b.clone() },
            events: None,
        })
    };
    // Read-only fast path: an open batch is returned as is, and with no new
    // tick there is nothing to open, so an idle poll takes no row lock (and
    // no transaction id).
    let seen = latest_batch(client, sub_id);
    if let Some(b) = &seen {
        if !b.done {
            return open(b);
        }
    }
    if let Some(f) = &seen {
        let r = next_range(client, q, seen.as_ref(), 0, span)?;
        sealed(r, f, seal_hint)?;
    }
    next_batch_locked(client, q, sub_id, slot, limit, lock_slot)
}

/// The part of [`next_batch_of`] after its read-only look, for a caller
/// that has looked already (and found an open batch or something to open
/// possible): serializes with other openers, looks again under the lock,
/// and returns the open batch or opens the next range (cut at the seal
/// `lock_slot` returns for a slot being resized). Takes the subscription's
/// row lock (or `lock_slot`'s) and, when it opens a batch, inserts it.
pub fn next_batch_locked(
    client: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    slot: Option<Slot>,
    limit: i64,
    lock_slot: &mut dyn FnMut(&mut SpiClient<'_>) -> Option<i64>,
) -> Option<Opened> {
    let span = slot.map_or(limit, |s| limit.saturating_mul(s.n as i64));
    let open = |b: &Batch| {
        Some(Opened {
            batch: Batch { slot, ..b.clone() },
            events: None,
        })
    };
    // Serialize with other openers, then look once more. A slot's openers
    // are serialized by its lease row (no plain call can name a slot
    // subscription), which the caller's `lock_slot` takes.
    let seal = if slot.is_some() {
        lock_slot(client)
    } else {
        lock_sub(client, sub_id);
        None
    };
    let latest = latest_batch(client, sub_id);
    if let Some(b) = &latest {
        if !b.done {
            return open(b);
        }
    }
    let start = match &latest {
        None => start_tick(client, sub_id),
        Some(_) => 0,
    };
    let (range, big) = next_range(client, q, latest.as_ref(), start, span)?;
    let range = match (&latest, seal) {
        (_, None) => range,
        (Some(f), s) => sealed((range, big), f, s)?,
        (None, Some(t)) => {
            if start >= t {
                return None;
            }
            (range.0, range.1.min(t), range.2)
        }
    };
    Some(open_range(client, q, sub_id, None, slot, range, limit, big))
}

/// The next range after `frontier` cut at the seal tick `seal`: None when
/// the frontier has reached it. Tick ids grow with their snapshots (ticks
/// of a queue are serialized on its row), so ending a range at the seal
/// instead of a later tick reads exactly the events up to the seal. A cut's
/// continuation stays within its tick (which never passes the seal: the
/// seal is taken after every batch opened before it). Capping never makes a
/// range big: a big range already ends at the first tick after its start.
fn sealed(r: (Range, bool), frontier: &Batch, seal: Option<i64>) -> Option<Range> {
    let ((prev, end, floor), _) = r;
    let Some(t) = seal else {
        return Some((prev, end, floor));
    };
    if frontier.ceiling.is_none() && frontier.tick >= t {
        return None;
    }
    Some((prev, end.min(t), floor))
}

/// Cooperative consumers: the member's open batch, else (with a dead
/// interval) a batch of a dead or departed member, taken over, else the next
/// range of the shared stream.
pub fn next_batch_coop(
    client: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    member: i32,
    dead_interval_ms: Option<f64>,
    limit: i64,
) -> Option<Opened> {
    next_batch_coop_gated(client, q, sub_id, member, dead_interval_ms, limit, true)
}

/// next_batch_coop that opens a new range of the stream only when
/// `open_new` (next_batch_custom's conditions); the member's open batch and
/// takeovers are returned either way.
pub fn next_batch_coop_gated(
    client: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    member: i32,
    dead_interval_ms: Option<f64>,
    limit: i64,
    open_new: bool,
) -> Option<Opened> {
    lock_sub(client, sub_id);
    if let Some(b) = member_open_batch(client, sub_id, member) {
        return Some(Opened {
            batch: b,
            events: None,
        });
    }
    // Takeover only with a dead interval, as in PgQue: the search reads
    // every open batch of the consumer (an anti-join over its batches), so a
    // member that passes none does not pay for it on every call. A departed
    // member leaves no open batch (unregister_subconsumer retries its
    // events); one left by pgque before 0.8.0 is taken over here too.
    let orphan = dead_interval_ms.and_then(|dead_ms| {
        let sql = format!(
            "SELECT {BATCH_COLS} FROM pgque.batch b \
               LEFT JOIN pgque.subscription m ON m.sub_id = b.member_id \
              WHERE b.sub_id = $1 AND b.member_id IS DISTINCT FROM $2 \
                AND NOT EXISTS (SELECT 1 FROM pgque.batch_done d WHERE d.batch_id = b.batch_id) \
                AND (m.sub_id IS NULL OR \
                     greatest(b.opened_at, m.sub_active) < now() - $3::float8 * interval '1 millisecond') \
              ORDER BY b.batch_id LIMIT 1"
        );
        let t = exec(client, &sql, &[sub_id.into(), member.into(), dead_ms.into()]);
        first_row(t).map(|r| batch_from(&r))
    });
    if let Some(orphan) = orphan {
        mark_done(client, orphan.batch_id, true);
        let mut b = Batch {
            member_id: Some(member),
            ..orphan
        };
        b.batch_id = insert_batch(client, &b);
        return Some(Opened {
            batch: b,
            events: None,
        });
    }
    if !open_new {
        return None;
    }
    let latest = latest_batch(client, sub_id);
    let start = if latest.is_none() {
        start_tick(client, sub_id)
    } else {
        0
    };
    let (range, big) = next_range(client, q, latest.as_ref(), start, limit)?;
    Some(open_range(
        client,
        q,
        sub_id,
        Some(member),
        None,
        range,
        limit,
        big,
    ))
}

/// A batch that a plain call (by batch id) may change: open, and not a
/// partition slot's (those are lease-fenced: ack_partitioned and co.), 55000.
pub fn plain_open_batch(
    client: &mut SpiClient<'_>,
    batch_id: Option<i64>,
) -> (Batch, Queue, String) {
    let found = open_batch_by_id(client, batch_id);
    if let Some(s) = found.0.slot {
        raise(
            error::WRONG_STATE,
            format!(
                "batch {} belongs to partition slot {} of {:?}: use ack_partitioned / nack_partitioned, which check the slot's lease",
                found.0.batch_id, s.k, found.2
            ),
        );
    }
    found
}

/// Finishes an open batch (ack / finish_batch): 1. A batch that is unknown
/// or already finished returns 0 with PgQ's WARNING (PgQue's contract: its
/// clients count a repeated ack as 0, it is not an error). NULL is 22004, a
/// partition slot's batch 55000 (those are acked through their lease).
/// Serialized with openers.
pub fn finish(client: &mut SpiClient<'_>, batch_id: Option<i64>) -> i32 {
    let id = error::required(batch_id, "batch_id");
    let not_found = || {
        pgrx::warning!("finish_batch: batch {id} not found");
        0
    };
    let Some((b, _q, consumer)) = batch_by_id(client, id) else {
        return not_found();
    };
    if b.done {
        return not_found();
    }
    if let Some(s) = b.slot {
        raise(
            error::WRONG_STATE,
            format!(
                "batch {id} belongs to partition slot {} of {consumer:?}: use ack_partitioned / nack_partitioned, which check the slot's lease",
                s.k
            ),
        );
    }
    lock_sub(client, b.sub_id);
    // Re-checked under the lock, in the insert: a concurrent ack may have
    // finished it.
    if !mark_done_if_open(client, b.batch_id) {
        return not_found();
    }
    1
}

/// Records batch `batch_id` as finished unless it has a batch_done row
/// already (one statement: the re-check under the subscription's lock and
/// the insert, which finish() used to run as two). Returns whether it
/// inserted the row. Runs on a fresh snapshot (a write), so it sees a
/// concurrent ack that committed while this one waited for the lock.
fn mark_done_if_open(client: &mut SpiClient<'_>, batch_id: i64) -> bool {
    let t = exec(
        client,
        "INSERT INTO pgque.batch_done (batch_id, done_at, abandoned, piece) \
         SELECT $1, now(), false, (SELECT cur_piece FROM pgque.meta_state) \
          WHERE NOT EXISTS (SELECT 1 FROM pgque.batch_done d WHERE d.batch_id = $1) \
         RETURNING batch_id",
        &[batch_id.into()],
    );
    !t.is_empty()
}
