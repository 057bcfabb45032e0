//! Online resize of a partitioned consumer's N (DESIGN.md section 24;
//! docs/partition-keys.md, "Resizing N online"): drain, then cut over at a
//! sealed tick.
//!
//! `begin` takes a tick T while it holds every old slot's lease row (the
//! lock a batch is opened under), so no old slot has a batch past T; it
//! seals the old slots at T (their batches stop there: batch.rs) and
//! subscribes the N' new slots at T. Every event is then on exactly one side
//! of the seal: committed by T (visible in its snapshot) on its old slot,
//! after T on its new slot, which therefore delivers only events after T.
//! The new slots are not lease rows yet, so nobody is handed one: a key's
//! events after T wait until `complete`, which runs only once every old
//! slot has reached T and finished its batches -- so each key's events up
//! to T are all acked before any of its later ones is delivered.
//!
//! What an old slot still owns at the cutover goes with its key to the new
//! slot: scheduled retries, retries already put back into the event table
//! after T (their owner), the pause policy's markers and held events, and
//! dead letters. `abort` drops the new subscriptions and the seal: the old
//! slots simply go on past T, nothing was moved.
use super::queue::Queue;
use super::slot::MAX_SLOTS;
use super::slots;
use super::spi::{col, exec, first_row};
use super::{batch, tick};
use crate::error::{self, raise, raise_detail};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

extension_sql_file!(
    "../../sql/17_slots_resize.sql",
    name = "slots_resize",
    requires = ["slots_pause"]
);

/// A resize in progress (a row of pgque.partition_resize).
pub struct Resize {
    pub n: i32,
    pub tick: i64,
    /// The new slots' subscriptions, slot k at index k.
    pub subs: Vec<i32>,
}

/// 55000 unless the resize schema is installed.
pub fn require_installed() {
    if !crate::log::schema::resize_installed() {
        raise(
            error::WRONG_STATE,
            "resizing N needs pgque 0.8.0's schema: run ALTER EXTENSION pgque UPDATE",
        );
    }
}

/// The resize in progress of `consumer`, if any.
pub fn current(c: &mut SpiClient<'_>, q: &Queue, consumer: &str) -> Option<Resize> {
    if !crate::log::schema::resize_installed() {
        return None;
    }
    let t = exec(
        c,
        "SELECT pr_n, pr_tick, pr_subs FROM pgque.partition_resize \
          WHERE pr_queue = $1 AND pr_consumer = $2",
        &[q.id.into(), consumer.into()],
    );
    first_row(t).map(|r| Resize {
        n: col(&r, 1).unwrap(),
        tick: col(&r, 2).unwrap(),
        subs: col::<Vec<i32>>(&r, 3).unwrap(),
    })
}

/// 55000 while `consumer` is being resized (for the repair calls that
/// would change its old slots under the drain).
pub fn refuse_during(c: &mut SpiClient<'_>, q: &Queue, consumer: &str, what: &str) {
    if let Some(r) = current(c, q, consumer) {
        raise_detail(
            error::WRONG_STATE,
            format!(
                "consumer {consumer:?} is being resized to {} slots: {what} is refused until the resize completes or is aborted",
                r.n
            ),
            "Finish it with pgque.complete_resize or pgque.abort_resize.",
        );
    }
}

/// Locks the consumer's row (serializing begin / complete / abort and
/// subscribes of this consumer) and returns (N, pause policy); 42704 when
/// it is not a partitioned consumer.
fn lock_consumer(c: &mut SpiClient<'_>, q: &Queue, consumer: &str) -> (i32, bool) {
    let t = exec(
        c,
        "SELECT pc_n, pc_failure_policy = 'pause' FROM pgque.partition_consumer \
          WHERE pc_queue = $1 AND pc_consumer = $2 FOR NO KEY UPDATE",
        &[q.id.into(), consumer.into()],
    );
    let Some(r) = first_row(t) else {
        raise(
            error::UNDEFINED_OBJECT,
            format!(
                "consumer not found: {consumer:?} is not a partitioned consumer of queue {:?}",
                q.name
            ),
        );
    };
    (col(&r, 1).unwrap(), col(&r, 2).unwrap())
}

/// Locks every old slot's lease row, in slot order (the lock a batch is
/// opened, acked and nacked under: waits for one in flight), and returns
/// (slot, subscription) for each.
fn lock_slots(c: &mut SpiClient<'_>, q: &Queue, consumer: &str) -> Vec<(i32, Option<i32>)> {
    let t = exec(
        c,
        "SELECT ps_slot, ps_sub FROM pgque.partition_slot \
          WHERE ps_queue = $1 AND ps_consumer = $2 ORDER BY ps_slot FOR NO KEY UPDATE",
        &[q.id.into(), consumer.into()],
    );
    t.map(|r| (col(&r, 1).unwrap(), col(&r, 2))).collect()
}

/// The subscription name of new slot `k` while the resize to `n` runs.
fn pending_name(consumer: &str, k: i32, n: i32) -> String {
    format!("{consumer}#{k}/{n}")
}

/// Takes the seal tick: a tick of the queue now, after every old slot's
/// lease row is locked (so every batch opened before is committed and ends
/// at an older tick). Ticks are serialized on the queue's row, which this
/// transaction then holds until it ends: the worker's ticker skips the
/// queue meanwhile, sends never take that row.
fn seal_tick(c: &mut SpiClient<'_>, q: &Queue) -> i64 {
    let t = exec(
        c,
        "SELECT coalesce(pg_sequence_last_value(queue_event_seq::regclass), 0) \
           FROM pgque.queue WHERE queue_id = $1",
        &[q.id.into()],
    );
    let seq: i64 = col(&first_row(t).unwrap(), 1).unwrap();
    tick::insert_tick(c, q.id, &q.name, seq, tick::Pending::New)
}

/// begin_resize: seals the old slots at a new tick T and subscribes the
/// `new_n` new slots at T. Returns T. Refuses (changing nothing): a
/// non-partitioned consumer 42704, `new_n` equal to N 22023, a resize in
/// progress or an old slot unsubscribed (repair) 55000.
pub fn begin(c: &mut SpiClient<'_>, q: &Queue, consumer: &str, new_n: i32) -> i64 {
    require_installed();
    let (n, _) = lock_consumer(c, q, consumer);
    if let Some(r) = current(c, q, consumer) {
        raise(
            error::WRONG_STATE,
            format!(
                "consumer {consumer:?} is already being resized to {} slots (sealed at tick {}): complete or abort that resize first",
                r.n, r.tick
            ),
        );
    }
    if new_n == n {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!("consumer {consumer:?} has {n} slots already"),
        );
    }
    debug_assert!((1..=MAX_SLOTS).contains(&new_n));
    let old = lock_slots(c, q, consumer);
    if let Some((k, _)) = old.iter().find(|(_, s)| s.is_none()) {
        raise_detail(
            error::WRONG_STATE,
            format!("slot {k} of {consumer:?} is not subscribed: its events up to a seal would have no reader"),
            "Subscribe it again (pgque.subscribe_slot) before resizing.",
        );
    }
    slots::ensure_index(c, q, new_n);
    let t = seal_tick(c, q);
    let names: Vec<String> = (0..new_n)
        .map(|k| pending_name(consumer, k, new_n))
        .collect();
    let subs = insert_subs(c, q, &names, t);
    exec(
        c,
        "INSERT INTO pgque.partition_resize (pr_queue, pr_consumer, pr_n, pr_tick, pr_subs) \
         VALUES ($1, $2, $3, $4, $5)",
        &[
            q.id.into(),
            consumer.into(),
            new_n.into(),
            t.into(),
            subs.into(),
        ],
    );
    exec(
        c,
        "UPDATE pgque.partition_slot SET ps_seal = $3 WHERE ps_queue = $1 AND ps_consumer = $2",
        &[q.id.into(), consumer.into(), t.into()],
    );
    t
}

/// Inserts the new slots' subscriptions at tick `t`; their ids in slot order.
fn insert_subs(c: &mut SpiClient<'_>, q: &Queue, names: &[String], t: i64) -> Vec<i32> {
    super::queue::check_consumer_room(c, q, names.len() as i64);
    let r = exec(
        c,
        "WITH s AS (INSERT INTO pgque.subscription (sub_queue, sub_consumer, sub_start_tick) \
                    SELECT $1, name, $3 FROM unnest($2::text[]) name RETURNING sub_id, sub_consumer) \
         SELECT array_agg(s.sub_id ORDER BY u.k) \
           FROM unnest($2::text[]) WITH ORDINALITY u(name, k) JOIN s ON s.sub_consumer = u.name",
        &[q.id.into(), names.to_vec().into(), t.into()],
    );
    col::<Vec<i32>>(&first_row(r).unwrap(), 1).unwrap()
}

/// Where an old slot stands in the drain.
pub struct SlotState {
    pub slot: i32,
    pub sub: i32,
    /// The tick its position (or open batch) reaches.
    pub tick: i64,
    pub open_batch: bool,
    /// It has read and finished everything up to the seal.
    pub drained: bool,
    pub retries: i64,
    pub blocked_keys: i64,
    pub held_events: i64,
    pub dead_letters: i64,
}

/// The drain state of every old slot (under no lock: a status).
pub fn states(c: &mut SpiClient<'_>, q: &Queue, consumer: &str, seal: i64) -> Vec<SlotState> {
    let t = exec(
        c,
        "SELECT ps_slot, ps_sub FROM pgque.partition_slot \
          WHERE ps_queue = $1 AND ps_consumer = $2 AND ps_sub IS NOT NULL ORDER BY ps_slot",
        &[q.id.into(), consumer.into()],
    );
    let slots: Vec<(i32, i32)> = t
        .map(|r| (col(&r, 1).unwrap(), col(&r, 2).unwrap()))
        .collect();
    slots
        .into_iter()
        .map(|(k, sub)| slot_state(c, k, sub, seal))
        .collect()
}

fn slot_state(c: &mut SpiClient<'_>, k: i32, sub: i32, seal: i64) -> SlotState {
    let (tick, open_batch, drained) = match batch::latest_batch(c, sub) {
        Some(b) => (
            b.tick,
            !b.done,
            b.done && b.ceiling.is_none() && b.tick >= seal,
        ),
        None => {
            let t = exec(
                c,
                "SELECT sub_start_tick FROM pgque.subscription WHERE sub_id = $1",
                &[sub.into()],
            );
            let s: i64 = col(&first_row(t).unwrap(), 1).unwrap();
            (s, false, s >= seal)
        }
    };
    let t = exec(
        c,
        &format!(
            "SELECT (SELECT count(*) FROM pgque.retry_queue WHERE ev_owner = $1), \
                    (SELECT count(*) FROM pgque.partition_blocked WHERE pb_sub = $1), \
                    (SELECT count(*) FROM pgque.partition_held WHERE ph_sub = $1), \
                    (SELECT count(*) FROM {} WHERE dl_owner = $1)",
            super::schema::dead_letter_table()
        ),
        &[sub.into()],
    );
    let r = first_row(t).unwrap();
    SlotState {
        slot: k,
        sub,
        tick,
        open_batch,
        drained,
        retries: col(&r, 1).unwrap(),
        blocked_keys: col(&r, 2).unwrap(),
        held_events: col(&r, 3).unwrap(),
        dead_letters: col(&r, 4).unwrap(),
    }
}

/// The resize in progress, or 55000.
pub fn require_current(c: &mut SpiClient<'_>, q: &Queue, consumer: &str) -> Resize {
    current(c, q, consumer).unwrap_or_else(|| {
        raise(
            error::WRONG_STATE,
            format!(
                "consumer {consumer:?} of queue {:?} is not being resized",
                q.name
            ),
        )
    })
}

/// The SQL of a key's new slot subscription: element slot(key, n) of the
/// array parameter `$subs` (a NULL key: slot 0).
fn new_sub_sql(key_col: &str, n: i32, subs: &str) -> String {
    format!("({subs}::int4[])[coalesce((hashtextextended({key_col}, 0) % {n} + {n}) % {n}, 0) + 1]")
}

/// complete_resize: the cutover. Under every old slot's lease row lock,
/// re-checks that each has reached the seal with no open batch (55000,
/// naming the slots still draining, otherwise), moves what the old slots
/// still own to each key's new slot, drops the old subscriptions and makes
/// the new ones the consumer's slots (fresh leases). Returns the new N.
pub fn complete(c: &mut SpiClient<'_>, q: &Queue, consumer: &str) -> i32 {
    require_installed();
    let (n, pause) = lock_consumer(c, q, consumer);
    let r = require_current(c, q, consumer);
    let old = lock_slots(c, q, consumer);
    let mut old_subs = vec![];
    let mut waiting = vec![];
    for (k, sub) in &old {
        let sub = sub.expect("old slots stay subscribed during a resize");
        let s = slot_state(c, *k, sub, r.tick);
        if !s.drained {
            waiting.push(format!(
                "slot {k} at tick {}{}",
                s.tick,
                if s.open_batch { " (open batch)" } else { "" }
            ));
        }
        old_subs.push(sub);
    }
    if !waiting.is_empty() {
        raise_detail(
            error::WRONG_STATE,
            format!(
                "the resize of {consumer:?} is not ready: {} of {n} old slots have not drained to the seal (tick {})",
                waiting.len(),
                r.tick
            ),
            format!(
                "Still draining: {}. Keep consuming the old slots (pgque.resize_ready shows the progress), or pgque.abort_resize.",
                waiting.join(", ")
            ),
        );
    }
    let snap = tick::tick_snapshot(c, q.id, r.tick).unwrap_or_else(|| {
        raise(
            error::UNDEFINED_OBJECT,
            format!("the seal tick {} of queue {:?} is gone", r.tick, q.name),
        )
    });
    let nn = r.n;
    let subs = r.subs.clone();
    // Scheduled retries first: an UPDATE waits for a retry mover (maint)
    // in flight, whose moved rows the next statement then sees.
    exec(
        c,
        &format!(
            "UPDATE pgque.retry_queue SET ev_owner = {} WHERE ev_owner = ANY ($2)",
            new_sub_sql("ev_extra1", nn, "$1")
        ),
        &[subs.clone().into(), old_subs.clone().into()],
    );
    // Retries and released held events put back into the event table after
    // the seal: the old slot never reads past it, the new slot will.
    exec(
        c,
        &format!(
            "UPDATE {} SET ev_owner = {} WHERE ev_owner = ANY ($2) \
               AND ev_txid >= pg_snapshot_xmin($3::pg_snapshot) \
               AND NOT pg_visible_in_snapshot(ev_txid, $3::pg_snapshot)",
            q.parent_table(),
            new_sub_sql("ev_extra1", nn, "$1")
        ),
        &[
            subs.clone().into(),
            old_subs.clone().into(),
            snap.as_str().into(),
        ],
    );
    if crate::log::schema::pause_installed() {
        exec(
            c,
            &format!(
                "INSERT INTO pgque.partition_blocked (pb_sub, pb_key, pb_state, pb_event, pb_since, \
                                                      pb_batch, pb_pending, pb_held, pb_unblock) \
                 SELECT {}, pb_key, pb_state, pb_event, pb_since, NULL, pb_pending, pb_held, pb_unblock \
                   FROM pgque.partition_blocked WHERE pb_sub = ANY ($2)",
                new_sub_sql("pb_key", nn, "$1")
            ),
            &[subs.clone().into(), old_subs.clone().into()],
        );
        exec(
            c,
            &format!(
                "UPDATE pgque.partition_held SET ph_sub = {} WHERE ph_sub = ANY ($2)",
                new_sub_sql("ph_key", nn, "$1")
            ),
            &[subs.clone().into(), old_subs.clone().into()],
        );
        exec(
            c,
            "DELETE FROM pgque.partition_blocked WHERE pb_sub = ANY ($1)",
            &[old_subs.clone().into()],
        );
    }
    let slot_sql = format!("coalesce((hashtextextended(ev_extra1, 0) % {nn} + {nn}) % {nn}, 0)");
    exec(
        c,
        &format!(
            "UPDATE {} SET dl_owner = {}, dl_consumer = $3 || '#' || {slot_sql} \
              WHERE dl_owner = ANY ($2)",
            super::schema::dead_letter_table(),
            new_sub_sql("ev_extra1", nn, "$1")
        ),
        &[
            subs.clone().into(),
            old_subs.clone().into(),
            consumer.into(),
        ],
    );
    exec(
        c,
        "DELETE FROM pgque.subscription WHERE sub_id = ANY ($1)",
        &[old_subs.into()],
    );
    exec(
        c,
        "UPDATE pgque.subscription s SET sub_consumer = $2 || '#' || (u.k - 1) \
           FROM unnest($1::int4[]) WITH ORDINALITY u(id, k) WHERE s.sub_id = u.id",
        &[subs.clone().into(), consumer.into()],
    );
    // The lease rows become the new slots': every lease ends (epoch + 1),
    // so a worker of an old slot is fenced off (its N is not the consumer's).
    exec(
        c,
        "DELETE FROM pgque.partition_slot WHERE ps_queue = $1 AND ps_consumer = $2 AND ps_slot >= $3",
        &[q.id.into(), consumer.into(), nn.into()],
    );
    exec(
        c,
        "UPDATE pgque.partition_slot SET ps_n = $3, ps_sub = ($4::int4[])[ps_slot + 1], \
                ps_owner = NULL, ps_epoch = ps_epoch + 1, ps_until = clock_timestamp(), ps_seal = NULL \
          WHERE ps_queue = $1 AND ps_consumer = $2",
        &[q.id.into(), consumer.into(), nn.into(), subs.clone().into()],
    );
    exec(
        c,
        "INSERT INTO pgque.partition_slot (ps_queue, ps_consumer, ps_slot, ps_n, ps_sub, ps_pause) \
         SELECT $1, $2, g, $3, ($4::int4[])[g + 1], $5 FROM generate_series($6, $3 - 1) g",
        &[
            q.id.into(),
            consumer.into(),
            nn.into(),
            subs.into(),
            pause.into(),
            n.into(),
        ],
    );
    exec(
        c,
        "UPDATE pgque.partition_consumer SET pc_n = $3 WHERE pc_queue = $1 AND pc_consumer = $2",
        &[q.id.into(), consumer.into(), nn.into()],
    );
    exec(
        c,
        "DELETE FROM pgque.partition_resize WHERE pr_queue = $1 AND pr_consumer = $2",
        &[q.id.into(), consumer.into()],
    );
    slots::drop_index_if_unused(c, q, n);
    crate::wake::at_commit();
    nn
}

/// abort_resize: drops the new slots' subscriptions (they have delivered
/// nothing) and the seal; the old slots go on past it. Returns N (kept).
/// 55000 when no resize is in progress.
pub fn abort(c: &mut SpiClient<'_>, q: &Queue, consumer: &str) -> i32 {
    require_installed();
    let (n, _) = lock_consumer(c, q, consumer);
    let r = require_current(c, q, consumer);
    drop_pending(c, q, consumer, &r);
    slots::drop_index_if_unused(c, q, r.n);
    n
}

/// Removes a resize's new subscriptions, its row and the seal.
pub fn drop_pending(c: &mut SpiClient<'_>, q: &Queue, consumer: &str, r: &Resize) {
    exec(
        c,
        "UPDATE pgque.partition_slot SET ps_seal = NULL WHERE ps_queue = $1 AND ps_consumer = $2",
        &[q.id.into(), consumer.into()],
    );
    exec(
        c,
        "WITH r AS (DELETE FROM pgque.retry_queue WHERE ev_owner = ANY ($1)) \
         DELETE FROM pgque.subscription WHERE sub_id = ANY ($1)",
        &[r.subs.clone().into()],
    );
    exec(
        c,
        "DELETE FROM pgque.partition_resize WHERE pr_queue = $1 AND pr_consumer = $2",
        &[q.id.into(), consumer.into()],
    );
}
