//! The `pause` failure policy of partitioned consumers (DESIGN.md section
//! 24; docs/partition-keys.md, "Failure policy").
//!
//! When an event E of key K is nacked, K gets a marker (partition_blocked,
//! per slot subscription and key) and K's later events -- those of E's
//! batch after E, and those of later batches -- are parked in
//! partition_held instead of being delivered. They are parked once, as a
//! batch is opened (or by the nack, for E's own batch): a blocked key costs
//! one insert per event that reaches the slot, never a re-read of its held
//! backlog, and other keys are never looked at. Parking does not touch
//! ev_retry: held events do not count as retries.
//!
//! The marker's state says what K waits for:
//! - `retry`: the redelivery of its failed event (pb_event). Only that
//!   event of K is delivered; when the batch that delivered it is acked,
//!   the block is released.
//! - `dead`: the failed event was dead-lettered. With on_dead_letter =
//!   'block' K waits for release_partition_key; with 'resume' the block is
//!   released at the ack of the batch (pb_unblock).
//! - `release`: the first PUT_BACK_MAX of K's held events (by ev_id) were
//!   put back into the queue (the current event table, as redeliveries to
//!   this slot, in ev_id order, in one transaction) and pb_pending of them
//!   have not reached the slot yet; the rest stay parked (pb_held counts
//!   them). The put-back ones are delivered (a put-back event carries
//!   ev_retry, a first delivery never does); K's newer events are parked
//!   behind the rest. Once all have reached the slot and their batch is
//!   acked, the next PUT_BACK_MAX held events are put back the same way,
//!   or, with none, the marker goes and K flows again.
//!
//! Put-back is bounded so that a key failing again costs bounded work: a
//! failure of a put-back event blocks K at that event, and the put-back
//! events behind it are parked again as they reach the slot. With the whole
//! backlog put back at once, every failure re-parked all of it (measured:
//! 1.5-4 parkings per event of keys failing often, growing with the
//! backlog; benches/results/pause.md); with rounds of PUT_BACK_MAX, at most
//! PUT_BACK_MAX events are re-parked per failure, and a key blocked once
//! still parks each event exactly once.
//!
//! Every step runs under the slot's lease row lock (a batch opening, ack,
//! nack, or release_partition_key), and held events are put back only at a
//! batch boundary: an open batch, re-read after a crash, shows exactly what
//! it showed (its events minus the parked ones).
use super::batch::{self, Batch};
use super::events::Event;
use super::queue::{event_table, Queue};
use super::spi::{col, exec, first_row};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use std::collections::{HashMap, HashSet};

/// Most held events of one key put back into the queue per round: what a
/// failure during the round can re-park (one insert each), whatever the
/// backlog. The order of a few batches (the clients' default batch size is
/// 100; pgque.batch_max_events defaults to 10,000), so a failure costs
/// about what delivering a round does. Large enough that a round, one tick
/// plus the batches delivering it, drains a hot key faster than it arrives
/// (w12's hottest tenant: ~750 events/s at 5,000 events/s; 1,000 per 100 ms
/// tick is 10,000/s); a key that arrives faster stays blocked, at bounded
/// work per round, its events still in order.
pub const PUT_BACK_MAX: i32 = 1_000;

extension_sql_file!(
    "../../sql/16_slots_pause.sql",
    name = "slots_pause",
    requires = ["slots"]
);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Retry,
    Dead,
    Release,
}

impl State {
    fn parse(s: &str) -> State {
        match s {
            "retry" => State::Retry,
            "dead" => State::Dead,
            _ => State::Release,
        }
    }
    fn as_str(self) -> &'static str {
        match self {
            State::Retry => "retry",
            State::Dead => "dead",
            State::Release => "release",
        }
    }
}

/// A blocked key's marker (a row of pgque.partition_blocked).
#[derive(Debug, Clone)]
pub struct Marker {
    pub key: String,
    pub state: State,
    pub event: Option<i64>,
    pub batch: Option<i64>,
    pub pending: i32,
    pub unblock: bool,
}

const MARKER_COLS: &str = "pb_key, pb_state, pb_event, pb_batch, pb_pending, pb_unblock";

fn marker_from(r: &pgrx::spi::SpiHeapTupleData<'_>) -> Marker {
    Marker {
        key: col(r, 1).unwrap(),
        state: State::parse(&col::<String>(r, 2).unwrap()),
        event: col(r, 3),
        batch: col(r, 4),
        pending: col(r, 5).unwrap(),
        unblock: col(r, 6).unwrap(),
    }
}

fn key_of(ev: &Event) -> Option<String> {
    ev.extra[0].map(|t| t.to_string_lossy())
}

/// Whether an event of a blocked key is delivered now (else it is parked).
fn delivered(m: &Marker, ev: &Event) -> bool {
    match m.state {
        State::Retry => ev.retry.is_some() && Some(ev.id) == m.event,
        State::Dead => false,
        State::Release => ev.retry.is_some(),
    }
}

/// Whether an event of a blocked key is one put back by a release that has
/// not reached the slot yet (it counts down pb_pending).
fn arrival(m: &Marker, ev: &Event) -> bool {
    m.pending > 0 && ev.retry.is_some() && !(m.state == State::Retry && Some(ev.id) == m.event)
}

/// A new batch of a paused slot: the events to deliver. Events of blocked
/// keys that must wait are parked; the markers note the batch that
/// delivered their keys' events. One lookup of the batch's keys among the
/// slot's markers; nothing more when none is blocked.
pub fn hold_back(c: &mut SpiClient<'_>, sub: i32, batch_id: i64, evs: Vec<Event>) -> Vec<Event> {
    let keyed: Vec<Option<String>> = evs.iter().map(key_of).collect();
    let mut keys: Vec<String> = keyed.iter().flatten().cloned().collect();
    if keys.is_empty() {
        return evs;
    }
    keys.sort_unstable();
    keys.dedup();
    let t = exec(
        c,
        &format!(
            "SELECT {MARKER_COLS} FROM pgque.partition_blocked WHERE pb_sub = $1 AND pb_key = ANY ($2)"
        ),
        &[sub.into(), keys.into()],
    );
    let markers: HashMap<String, Marker> = t
        .map(|r| {
            let m = marker_from(&r);
            (m.key.clone(), m)
        })
        .collect();
    if markers.is_empty() {
        return evs;
    }
    let mut keep = Vec::with_capacity(evs.len());
    let mut park = vec![];
    // key -> (delivered any, arrivals)
    let mut touched: HashMap<String, (bool, i32)> = HashMap::new();
    for (ev, key) in evs.into_iter().zip(keyed) {
        let Some(m) = key.as_ref().and_then(|k| markers.get(k)) else {
            keep.push(ev);
            continue;
        };
        let e = touched.entry(m.key.clone()).or_default();
        if arrival(m, &ev) {
            e.1 += 1;
        }
        if delivered(m, &ev) {
            e.0 = true;
            keep.push(ev);
        } else {
            park.push((m.key.clone(), ev));
        }
    }
    park_events(c, sub, &park);
    let (mut ks, mut delivered_any, mut arrived) = (vec![], vec![], vec![]);
    for (k, (d, a)) in touched {
        if d || a > 0 {
            ks.push(k);
            delivered_any.push(d);
            arrived.push(a);
        }
    }
    if !ks.is_empty() {
        exec(
            c,
            "UPDATE pgque.partition_blocked b \
                SET pb_batch = CASE WHEN s.d THEN $2 ELSE b.pb_batch END, \
                    pb_pending = greatest(b.pb_pending - s.a, 0) \
               FROM unnest($3::text[], $4::bool[], $5::int4[]) s(k, d, a) \
              WHERE b.pb_sub = $1 AND b.pb_key = s.k",
            &[
                sub.into(),
                batch_id.into(),
                ks.into(),
                delivered_any.into(),
                arrived.into(),
            ],
        );
    }
    keep
}

/// The open batch `batch_id` of a paused slot read again (after a crash or
/// a lease takeover): its events minus the parked ones and minus the one
/// nacked in it per key (a marker waiting for that event, set by a nack
/// in this batch: pb_batch is not this batch), so an event is handed out
/// for processing once per failure, never ahead of its key's earlier ones.
pub fn without_held(c: &mut SpiClient<'_>, sub: i32, batch_id: i64, evs: Vec<Event>) -> Vec<Event> {
    let ids: Vec<i64> = evs
        .iter()
        .filter(|e| e.extra[0].is_some())
        .map(|e| e.id)
        .collect();
    if ids.is_empty() {
        return evs;
    }
    let t = exec(
        c,
        "SELECT ev_id FROM pgque.partition_held WHERE ph_sub = $1 AND ev_id = ANY ($2) \
         UNION ALL \
         SELECT pb_event FROM pgque.partition_blocked \
          WHERE pb_sub = $1 AND pb_state IN ('retry', 'dead') AND pb_event = ANY ($2) \
            AND pb_batch IS DISTINCT FROM $3",
        &[sub.into(), ids.into(), batch_id.into()],
    );
    let held: HashSet<i64> = t.map(|r| col::<i64>(&r, 1).unwrap()).collect();
    if held.is_empty() {
        return evs;
    }
    evs.into_iter().filter(|e| !held.contains(&e.id)).collect()
}

/// Parks events of blocked keys (whose markers exist): one statement; an
/// event parked already stays as it is. Counts them in pb_held.
fn park_events(c: &mut SpiClient<'_>, sub: i32, evs: &[(String, Event)]) {
    if evs.is_empty() {
        return;
    }
    let txt = |f: &dyn Fn(&Event) -> Option<super::events::PgText>| -> Vec<Option<String>> {
        evs.iter()
            .map(|(_, e)| f(e).map(|t| t.to_string_lossy()))
            .collect()
    };
    let keys: Vec<String> = evs.iter().map(|(k, _)| k.clone()).collect();
    let ids: Vec<i64> = evs.iter().map(|(_, e)| e.id).collect();
    let times: Vec<TimestampWithTimeZone> = evs.iter().map(|(_, e)| e.time).collect();
    let retries: Vec<Option<i32>> = evs.iter().map(|(_, e)| e.retry).collect();
    let types = txt(&|e| e.ev_type);
    let datas = txt(&|e| e.data);
    let x1 = txt(&|e| e.extra[0]);
    let x2 = txt(&|e| e.extra[1]);
    let x3 = txt(&|e| e.extra[2]);
    let x4 = txt(&|e| e.extra[3]);
    // The headers as JSON text, cast back to jsonb by the statement (a
    // parked event is rare; its headers rarer). Without the column (a
    // schema before 0.8.0) they are NULL and not stored.
    let with_headers = crate::headers::events_have_headers();
    let hdrs: Vec<Option<String>> = evs
        .iter()
        .map(|(_, e)| e.headers.map(|h| h.to_json_string()))
        .collect();
    let (hcol, hval) = if with_headers {
        (", ev_headers", ", $12::text[]::jsonb[]")
    } else {
        ("", "")
    };
    let sql = format!(
        "WITH ins AS ( \
           INSERT INTO pgque.partition_held (ph_sub, ph_key, ev_id, ev_time, ev_retry, ev_type, ev_data, \
                                             ev_extra1, ev_extra2, ev_extra3, ev_extra4{hcol}) \
           SELECT $1, * FROM unnest($2::text[], $3::int8[], $4::timestamptz[], $5::int4[], $6::text[], \
                                    $7::text[], $8::text[], $9::text[], $10::text[], $11::text[]{hval}) \
           ON CONFLICT DO NOTHING RETURNING ph_key), \
              n AS (SELECT ph_key, count(*)::int4 AS n FROM ins GROUP BY ph_key) \
         UPDATE pgque.partition_blocked b SET pb_held = b.pb_held + n.n FROM n \
          WHERE b.pb_sub = $1 AND b.pb_key = n.ph_key"
    );
    let mut args = vec![
        sub.into(),
        keys.into(),
        ids.into(),
        times.into(),
        retries.into(),
        types.into(),
        datas.into(),
        x1.into(),
        x2.into(),
        x3.into(),
        x4.into(),
    ];
    if with_headers {
        args.push(hdrs.into());
    }
    exec(c, &sql, &args);
}

fn marker(c: &mut SpiClient<'_>, sub: i32, key: &str) -> Option<Marker> {
    let t = exec(
        c,
        &format!(
            "SELECT {MARKER_COLS} FROM pgque.partition_blocked WHERE pb_sub = $1 AND pb_key = $2 FOR UPDATE"
        ),
        &[sub.into(), key.into()],
    );
    first_row(t).map(|r| marker_from(&r))
}

fn is_held(c: &mut SpiClient<'_>, sub: i32, ev_id: i64) -> bool {
    let t = exec(
        c,
        "SELECT 1 FROM pgque.partition_held WHERE ph_sub = $1 AND ev_id = $2",
        &[sub.into(), ev_id.into()],
    );
    !t.is_empty()
}

/// Whether a dead letter blocks the key (the consumer's on_dead_letter).
fn blocks_on_dead_letter(c: &mut SpiClient<'_>, sub: i32) -> bool {
    let t = exec(
        c,
        "SELECT pc.pc_on_dead_letter = 'block' FROM pgque.partition_slot p \
           JOIN pgque.partition_consumer pc ON pc.pc_queue = p.ps_queue AND pc.pc_consumer = p.ps_consumer \
          WHERE p.ps_sub = $1",
        &[sub.into()],
    );
    first_row(t).and_then(|r| col(&r, 1)).unwrap_or(false)
}

/// nack_partitioned on a paused slot: schedules the retry (or the dead
/// letter) of event `ev` of open batch `b` as the skip policy does, and
/// blocks its key: the marker waits for that event, and the key's later
/// events of this batch are parked (a client skips them: they come back
/// after the failed one). A parked event nacked is not scheduled again (0).
/// An event without a key blocks nothing.
#[allow(clippy::too_many_arguments)]
pub fn nack(
    c: &mut SpiClient<'_>,
    q: &Queue,
    b: &Batch,
    name: &str,
    ev: &Event,
    retry_after: &Interval,
    reason: Option<&str>,
) -> i32 {
    let retry = |c: &mut SpiClient<'_>| {
        super::retry::retry_event(c, q, b, name, ev, retry_after, reason, true)
    };
    let Some(key) = key_of(ev) else {
        return retry(c);
    };
    let sub = b.sub_id;
    if is_held(c, sub, ev.id) {
        return 0;
    }
    let m = marker(c, sub, &key);
    if let Some(m) = &m {
        let first = m.event.unwrap_or(i64::MAX);
        if m.state == State::Dead && ev.id == first {
            // Dead-lettered already: the dead letter is not added twice.
            return retry(c);
        }
        if m.state != State::Release && ev.id > first {
            // A later event of the key than the one it waits for: held.
            park_events(c, sub, &[(key, ev.clone())]);
            return 1;
        }
        if m.state == State::Retry && ev.id < first {
            // An earlier event failed too (nacks out of order in one
            // batch): the later one waits among the held events again.
            pull_back(c, sub, &key, first);
        }
    }
    let dead = ev.retry.unwrap_or(0) >= q.max_retries;
    let r = retry(c);
    let (state, unblock) = match (dead, dead && blocks_on_dead_letter(c, sub)) {
        (false, _) => (State::Retry, false),
        (true, true) => (State::Dead, false),
        (true, false) => (State::Dead, true),
    };
    exec(
        c,
        "INSERT INTO pgque.partition_blocked (pb_sub, pb_key, pb_state, pb_event, pb_unblock) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (pb_sub, pb_key) DO UPDATE \
            SET pb_state = $3, pb_event = $4, pb_unblock = $5, pb_batch = NULL",
        &[
            sub.into(),
            key.as_str().into(),
            state.as_str().into(),
            ev.id.into(),
            unblock.into(),
        ],
    );
    // The key's later events of this batch wait for this one.
    let later: Vec<(String, Event)> = batch::batch_events(c, q, b, false)
        .into_iter()
        .filter(|e| e.id > ev.id && key_of(e).as_deref() == Some(key.as_str()))
        .map(|e| (key.clone(), e))
        .collect();
    park_events(c, sub, &later);
    r
}

/// Moves a scheduled retry of the key back among its held events (its
/// retry count stays: it did fail). A retry already back in the queue is
/// parked when it reaches the slot.
fn pull_back(c: &mut SpiClient<'_>, sub: i32, key: &str, ev_id: i64) {
    let sql = format!(
        "WITH r AS (DELETE FROM pgque.retry_queue WHERE ev_owner = $1 AND ev_id = $3 \
                    RETURNING ev_id, ev_time, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4{h}), \
              ins AS (INSERT INTO pgque.partition_held (ph_sub, ph_key, ev_id, ev_time, ev_retry, ev_type, ev_data, \
                                                        ev_extra1, ev_extra2, ev_extra3, ev_extra4{h}) \
                      SELECT $1, $2, * FROM r ON CONFLICT DO NOTHING RETURNING 1) \
         UPDATE pgque.partition_blocked SET pb_held = pb_held + (SELECT count(*) FROM ins) \
          WHERE pb_sub = $1 AND pb_key = $2",
        h = super::schema::headers_col()
    );
    exec(c, &sql, &[sub.into(), key.into(), ev_id.into()]);
}

/// ack_partitioned on a paused slot, after the batch is finished (also for
/// a batch finished at its opening because all of its events were parked):
/// the markers the batch moved on are settled.
pub fn settle(c: &mut SpiClient<'_>, q: &Queue, sub: i32, batch_id: i64) {
    let t = exec(
        c,
        &format!(
            "SELECT {MARKER_COLS} FROM pgque.partition_blocked \
              WHERE pb_sub = $1 AND (pb_batch = $2 OR pb_unblock) FOR UPDATE"
        ),
        &[sub.into(), batch_id.into()],
    );
    let ms: Vec<Marker> = t.map(|r| marker_from(&r)).collect();
    for m in ms {
        settle_one(c, q, sub, &m, Some(batch_id));
    }
}

/// One marker at a batch boundary (`acked`: the batch just finished; None
/// for release_partition_key without an open batch). The key's first
/// PUT_BACK_MAX held events (by ev_id) are put back once nothing put back
/// earlier is still on its way and either the block was released
/// (pb_unblock) or the acked batch delivered what the key waited for; the
/// rest stay held (pb_held) for the next round.
fn settle_one(c: &mut SpiClient<'_>, q: &Queue, sub: i32, m: &Marker, acked: Option<i64>) {
    let here = acked.is_some() && m.batch == acked;
    let now = m.pending == 0 && (m.unblock || (here && m.state != State::Dead));
    if !now {
        if here {
            exec(
                c,
                "UPDATE pgque.partition_blocked SET pb_batch = NULL WHERE pb_sub = $1 AND pb_key = $2",
                &[sub.into(), m.key.as_str().into()],
            );
        }
        return;
    }
    // Released while still waiting for its failed event: that event comes
    // first (taken from its scheduled retry, or still on its way).
    let pull = m.state == State::Retry && !here;
    let sql = format!(
        "WITH r AS (DELETE FROM pgque.retry_queue WHERE $4 AND ev_owner = $1 AND ev_id = $3 \
                    RETURNING ev_id, ev_time, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4{h}), \
              h AS (DELETE FROM pgque.partition_held \
                     WHERE ph_sub = $1 AND ev_id IN (SELECT ev_id FROM pgque.partition_held \
                                                      WHERE ph_sub = $1 AND ph_key = $2 \
                                                      ORDER BY ev_id LIMIT $5) \
                    RETURNING ev_id, ev_time, coalesce(ev_retry, 0) AS ev_retry, ev_type, ev_data, \
                              ev_extra1, ev_extra2, ev_extra3, ev_extra4{h}), \
              ins AS (INSERT INTO {} (ev_id, ev_time, ev_owner, ev_retry, ev_type, ev_data, \
                                      ev_extra1, ev_extra2, ev_extra3, ev_extra4{h}) \
                      SELECT ev_id, ev_time, $1, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4{h} \
                        FROM (SELECT * FROM r UNION ALL SELECT * FROM h) x ORDER BY ev_id RETURNING ev_id) \
         SELECT count(*)::int4, min(ev_id), (SELECT count(*) FROM r)::int4, \
                (SELECT count(*) FROM h)::int4 FROM ins",
        event_table(q.id, q.cur_table),
        h = super::schema::headers_col()
    );
    let t = exec(
        c,
        &sql,
        &[
            sub.into(),
            m.key.as_str().into(),
            m.event.unwrap_or(0).into(),
            pull.into(),
            PUT_BACK_MAX.into(),
        ],
    );
    let r = first_row(t).unwrap();
    let moved: i32 = col(&r, 1).unwrap();
    let first: Option<i64> = col(&r, 2);
    let pulled: i32 = col(&r, 3).unwrap();
    let unheld: i32 = col(&r, 4).unwrap();
    drop(r);
    if moved > 0 {
        super::maint::tick_after_reinsert(c, q.id);
    }
    let pending = moved + i32::from(pull && pulled == 0);
    if pending == 0 {
        exec(
            c,
            "DELETE FROM pgque.partition_blocked WHERE pb_sub = $1 AND pb_key = $2",
            &[sub.into(), m.key.as_str().into()],
        );
    } else {
        exec(
            c,
            "UPDATE pgque.partition_blocked \
                SET pb_state = 'release', pb_event = coalesce($3, pb_event), pb_pending = $4, \
                    pb_batch = NULL, pb_unblock = false, pb_held = greatest(pb_held - $5, 0) \
              WHERE pb_sub = $1 AND pb_key = $2",
            &[
                sub.into(),
                m.key.as_str().into(),
                first.into(),
                pending.into(),
                unheld.into(),
            ],
        );
    }
}

/// release_partition_key: ends the block of `key` on slot subscription
/// `sub` (whose lease row the caller holds): the failed event, if still
/// waiting for its retry time, and the held events are redelivered next,
/// in order, then the key flows again. While the slot has an open batch (or
/// events put back earlier are on their way) this happens at its ack.
/// False when the key is not blocked.
pub fn release_key(c: &mut SpiClient<'_>, q: &Queue, sub: i32, key: &str) -> bool {
    let Some(m) = marker(c, sub, key) else {
        return false;
    };
    let open = batch::latest_batch(c, sub).is_some_and(|b| !b.done);
    if open || m.pending > 0 {
        exec(
            c,
            "UPDATE pgque.partition_blocked SET pb_unblock = true WHERE pb_sub = $1 AND pb_key = $2",
            &[sub.into(), key.into()],
        );
    } else {
        settle_one(c, q, sub, &Marker { unblock: true, ..m }, None);
    }
    true
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one_i64(sql: &str) -> Option<i64> {
        Spi::get_one::<i64>(sql).unwrap()
    }

    /// "ok", or the SQLSTATE `sql` raised (rolled back to a savepoint).
    fn state(sql: &str) -> String {
        Spi::run(
            "CREATE OR REPLACE FUNCTION pg_temp.state_of(q text) RETURNS text LANGUAGE plpgsql AS \
             $f$ BEGIN EXECUTE q; RETURN 'ok'; EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $f$",
        )
        .unwrap();
        Spi::get_one_with_args::<String>("SELECT pg_temp.state_of($1)", &[sql.into()])
            .unwrap()
            .unwrap()
    }

    fn consumers() -> String {
        Spi::get_one::<String>(
            "SELECT coalesce(string_agg(concat_ws(',', pc_consumer, pc_n, pc_failure_policy, pc_on_dead_letter, \
                    (SELECT string_agg(ps_pause::text, '' ORDER BY ps_slot) FROM pgque.partition_slot p \
                      WHERE p.ps_queue = c.pc_queue AND p.ps_consumer = c.pc_consumer)), ';' ORDER BY pc_consumer), '') \
               FROM pgque.partition_consumer c",
        )
        .unwrap()
        .unwrap()
    }

    #[pg_test]
    fn the_policy_is_chosen_at_subscribe_and_kept() {
        Spi::run("SELECT pgque.create_queue('fp')").unwrap();
        assert_eq!(
            one_i64(
                "SELECT pgque.subscribe_partitioned('fp', 'p', 2, failure_policy => 'pause')::int8"
            ),
            Some(2)
        );
        assert_eq!(
            one_i64("SELECT pgque.subscribe_partitioned('fp', 'b', 2, 'pause', on_dead_letter => 'block')::int8"),
            Some(2)
        );
        assert_eq!(
            one_i64("SELECT pgque.subscribe_partitioned('fp', 's', 2)::int8"),
            Some(2)
        );
        assert_eq!(
            one_i64("SELECT pgque.subscribe_partitioned('fp', 's2', 2, 'skip')::int8"),
            Some(2)
        );
        let before = consumers();
        assert_eq!(
            before,
            "b,2,pause,block,truetrue;p,2,pause,resume,truetrue;s,2,skip,resume,falsefalse;s2,2,skip,resume,falsefalse"
        );
        // The same call again is fine; another policy is refused.
        assert_eq!(
            one_i64("SELECT pgque.subscribe_partitioned('fp', 'p', 2, 'pause', 'resume')::int8"),
            Some(0)
        );
        for (sql, code) in [
            ("SELECT pgque.subscribe_partitioned('fp', 'p', 2)", "22023"),
            (
                "SELECT pgque.subscribe_partitioned('fp', 'p', 2, 'skip')",
                "22023",
            ),
            (
                "SELECT pgque.subscribe_partitioned('fp', 'b', 2, 'pause')",
                "22023",
            ),
            (
                "SELECT pgque.subscribe_partitioned('fp', 's', 2, 'pause')",
                "22023",
            ),
            (
                "SELECT pgque.subscribe_partitioned('fp', 'n', 2, 'halt')",
                "22023",
            ),
            (
                "SELECT pgque.subscribe_partitioned('fp', 'n', 2, 'skip', 'block')",
                "22023",
            ),
            (
                "SELECT pgque.subscribe_partitioned('fp', 'n', 2, 'pause', 'never')",
                "22023",
            ),
            (
                "SELECT pgque.subscribe_partitioned('fp', 'n', 2, NULL)",
                "22004",
            ),
            (
                "SELECT pgque.subscribe_partitioned('fp', 'n', 2, 'pause', NULL)",
                "22004",
            ),
            (
                "SELECT pgque.release_partition_key('fp', 'p', NULL)",
                "22004",
            ),
            (
                "SELECT pgque.release_partition_key('fp', 'nobody', 'k')",
                "42704",
            ),
            (
                "SELECT pgque.release_partition_key('nope', 'p', 'k')",
                "42704",
            ),
        ] {
            assert_eq!(state(sql), code, "{sql}");
        }
        assert_eq!(consumers(), before, "a refused call changed something");
        // subscribe_slot (repair) keeps the persisted policy.
        Spi::run("SELECT pgque.unsubscribe_slot('fp', 'p', 1, 2)").unwrap();
        Spi::run("SELECT pgque.subscribe_slot('fp', 'p', 1, 2)").unwrap();
        assert_eq!(consumers(), before);
        // Nothing blocked: release says so; metrics report 0 per pause consumer.
        assert_eq!(
            Spi::get_one::<bool>("SELECT pgque.release_partition_key('fp', 'p', 'k')").unwrap(),
            Some(false)
        );
        assert_eq!(
            one_i64(
                "SELECT count(*) FROM pgque.metrics() WHERE name = 'pgque_partition_blocked_keys' \
                  AND labels->>'queue' = 'fp' AND value = 0"
            ),
            Some(2)
        );
    }

    #[pg_test]
    fn markers_and_held_events_go_with_their_slot() {
        Spi::run("SELECT pgque.create_queue('fq')").unwrap();
        Spi::run("SELECT pgque.subscribe_partitioned('fq', 'p', 2, 'pause')").unwrap();
        // A blocked key with a held event, as a nack leaves them.
        Spi::run(
            "INSERT INTO pgque.partition_blocked (pb_sub, pb_key, pb_state, pb_event, pb_held) \
             SELECT ps_sub, 'k', 'retry', 1, 1 FROM pgque.partition_slot WHERE ps_consumer = 'p' AND ps_slot = 0",
        )
        .unwrap();
        Spi::run(
            "INSERT INTO pgque.partition_held (ph_sub, ph_key, ev_id, ev_time) \
             SELECT ps_sub, 'k', 2, now() FROM pgque.partition_slot WHERE ps_consumer = 'p' AND ps_slot = 0",
        )
        .unwrap();
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT concat_ws(',', queue_name, consumer, slot, partition_key, state, failed_event, held_events, \
                        blocked_for >= interval '0') FROM pgque.partition_blocked_keys"
            )
            .unwrap(),
            Some("fq,p,0,k,retry,1,1,t".into())
        );
        assert_eq!(
            one_i64(
                "SELECT value::int8 FROM pgque.metrics() WHERE name = 'pgque_partition_held_events' \
                  AND labels->>'queue' = 'fq'"
            ),
            Some(1)
        );
        Spi::run("SELECT pgque.unsubscribe_partitioned('fq', 'p')").unwrap();
        assert_eq!(
            one_i64("SELECT count(*) FROM pgque.partition_blocked"),
            Some(0)
        );
        assert_eq!(
            one_i64("SELECT count(*) FROM pgque.partition_held"),
            Some(0)
        );
    }
}
