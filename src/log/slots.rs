//! Partition slots (DESIGN.md section 3): which slot a key belongs to, the
//! per-N slot indexes on a queue's event tables, the persisted N of a
//! partitioned consumer, its slot subscriptions and the slots' leases.
//!
//! A partitioned consumer `c` with N slots is N ordinary subscriptions
//! `c#0` .. `c#<N-1>`: each slot has its own position, batches, retries and
//! holds back rotation like any consumer. A slot's batches hold only the
//! events whose key maps to it: `read_events` adds the slot condition, which
//! an index on (slot expression for N, ev_txid, ev_id) on every event table
//! of the queue answers, so a slot reads its own events, not the stream.
use super::queue::Queue;
use super::slot::{slot_expr, Slot};
use super::spi::{col, exec, first_row, run_once};
use crate::error::{self, raise, raise_detail};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

extension_sql_file!(
    "../../sql/15_slots.sql",
    name = "slots",
    requires = ["event_log"]
);

fn index_name(qid: i32, t: i32, n: i32) -> String {
    format!("event_{qid}_{t}_slot{n}_idx")
}

/// Whether the role calling pgque (its SET ROLE identity: inside pgque's
/// SECURITY DEFINER functions the current user is the extension's owner)
/// has the privileges of pgque_admin; superusers have.
fn caller_is_admin() -> bool {
    unsafe {
        let who = pg_sys::GetOuterUserId();
        let admin = pg_sys::get_role_oid(c"pgque_admin".as_ptr(), true);
        pg_sys::superuser_arg(who)
            || (admin != pg_sys::InvalidOid && pg_sys::has_privs_of_role(who, admin))
    }
}

/// Creates the slot index for `n` on each event table of the queue, when
/// missing. CREATE INDEX takes a SHARE lock: sends to this queue wait until
/// the subscribing transaction ends (they are never lost or misplaced).
/// Creating one is an administrator's step (42501 for other roles): each
/// index is paid by every send to the queue, and its SHARE lock, held by a
/// consumer's open transaction, would stop every send and duty on the
/// queue. A reader subscribes with an N whose indexes exist.
pub fn ensure_index(client: &mut SpiClient<'_>, q: &Queue, n: i32) {
    for t in 0..q.ntables {
        let name = index_name(q.id, t, n);
        let r = exec(
            client,
            "SELECT to_regclass('pgque.' || $1) IS NULL",
            &[name.as_str().into()],
        );
        let missing: bool = col(&first_row(r).unwrap(), 1).unwrap();
        if missing {
            if !caller_is_admin() {
                raise_detail(
                    error::INSUFFICIENT_PRIVILEGE,
                    format!(
                        "queue {:?} has no slot indexes for {n} slots, and creating them needs pgque_admin",
                        q.name
                    ),
                    format!(
                        "An administrator allows N = {n} on this queue by subscribing a consumer with it first (pgque.subscribe_partitioned); readers then subscribe with that N."
                    ),
                );
            }
            run_once(
                client,
                &format!(
                    "CREATE INDEX {name} ON {} (({}), ev_txid, ev_id)",
                    super::queue::event_table(q.id, t),
                    slot_expr(n)
                ),
            );
        }
    }
}

/// Drops the slot index for `n` when no partitioned consumer of the queue
/// uses that N any more (each index costs every send an index insert).
/// Only for an administrator's call: DROP INDEX takes an ACCESS EXCLUSIVE
/// lock, which a reader's open transaction must not hold on the queue (a
/// reader's unsubscribe leaves the index, for the next consumer of that N).
pub fn drop_index_if_unused(client: &mut SpiClient<'_>, q: &Queue, n: i32) {
    if !caller_is_admin() {
        return;
    }
    let t = exec(
        client,
        "SELECT EXISTS (SELECT 1 FROM pgque.partition_consumer WHERE pc_queue = $1 AND pc_n = $2)",
        &[q.id.into(), n.into()],
    );
    let used: bool = col(&first_row(t).unwrap(), 1).unwrap();
    if !used {
        for t in 0..q.ntables {
            run_once(
                client,
                &format!("DROP INDEX IF EXISTS pgque.{}", index_name(q.id, t, n)),
            );
        }
    }
}

/// The persisted N of a partitioned consumer, if it is one.
pub fn consumer_n(client: &mut SpiClient<'_>, q: &Queue, consumer: &str) -> Option<i32> {
    if !crate::log::schema::slots_installed() {
        return None;
    }
    let t = exec(
        client,
        "SELECT pc_n FROM pgque.partition_consumer WHERE pc_queue = $1 AND pc_consumer = $2",
        &[q.id.into(), consumer.into()],
    );
    first_row(t).and_then(|r| col(&r, 1))
}

/// The persisted N, or 42704 when `consumer` is not a partitioned consumer.
pub fn require_n(client: &mut SpiClient<'_>, q: &Queue, consumer: &str) -> i32 {
    consumer_n(client, q, consumer).unwrap_or_else(|| {
        raise(
            error::UNDEFINED_OBJECT,
            format!(
                "consumer not found: {consumer:?} is not a partitioned consumer of queue {:?}",
                q.name
            ),
        )
    })
}

/// 22023 unless `n` is the consumer's persisted N. N changes only by an
/// online resize (src/log/resize.rs): a worker still passing the old N
/// after one gets this error, and re-reads N.
pub fn check_n(consumer: &str, persisted: i32, n: i32) {
    if persisted != n {
        raise_detail(
            error::INVALID_PARAMETER_VALUE,
            format!("consumer {consumer:?} has {persisted} slots, not {n}"),
            "N changes only through pgque.begin_resize / complete_resize; a worker of a resized consumer claims again with the new N.",
        );
    }
}

/// A partitioned consumer's failure policy (docs/partition-keys.md,
/// "Failure policy"): `pause` holds a nacked key's later events back;
/// `block` (pause only) keeps the key blocked after a dead letter until
/// release_partition_key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub pause: bool,
    pub block: bool,
}

impl Policy {
    pub const SKIP: Policy = Policy {
        pause: false,
        block: false,
    };
    pub fn names(self) -> (&'static str, &'static str) {
        (
            if self.pause { "pause" } else { "skip" },
            if self.block { "block" } else { "resume" },
        )
    }
}

/// Records `consumer` as partitioned with `n` slots (with the N lease rows)
/// and `policy` (Policy::SKIP when None), or checks that it already is with
/// that same N (22023) and, when given, that policy (22023: a policy is
/// chosen once, at the first subscribe). Serialized per consumer: a
/// concurrent first subscribe waits on the primary key, then compares.
pub fn set_n(
    client: &mut SpiClient<'_>,
    q: &Queue,
    consumer: &str,
    n: i32,
    policy: Option<Policy>,
) {
    if super::queue::find_sub(client, q, consumer).is_some() {
        raise(
            error::DUPLICATE_OBJECT,
            format!(
                "queue {:?} has a plain consumer named {consumer:?}; a partitioned consumer needs its own name",
                q.name
            ),
        );
    }
    if !crate::log::schema::pause_installed() {
        // An older schema (before ALTER EXTENSION UPDATE): skip, as it was.
        let t = exec(
            client,
            "INSERT INTO pgque.partition_consumer (pc_queue, pc_consumer, pc_n) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING RETURNING 1",
            &[q.id.into(), consumer.into(), n.into()],
        );
        if !t.is_empty() {
            exec(
                client,
                "INSERT INTO pgque.partition_slot (ps_queue, ps_consumer, ps_slot, ps_n) \
                 SELECT $1, $2, g, $3 FROM generate_series(0, $3 - 1) g",
                &[q.id.into(), consumer.into(), n.into()],
            );
            return;
        }
        let t = exec(
            client,
            "SELECT pc_n FROM pgque.partition_consumer WHERE pc_queue = $1 AND pc_consumer = $2 \
             FOR NO KEY UPDATE",
            &[q.id.into(), consumer.into()],
        );
        let persisted: i32 = first_row(t).and_then(|r| col(&r, 1)).unwrap_or_else(|| {
            raise(
                error::UNDEFINED_OBJECT,
                "consumer not registered: it was removed concurrently",
            )
        });
        check_n(consumer, persisted, n);
        return;
    }
    let (fp, dl) = policy.unwrap_or(Policy::SKIP).names();
    let t = exec(
        client,
        "INSERT INTO pgque.partition_consumer (pc_queue, pc_consumer, pc_n, pc_failure_policy, pc_on_dead_letter) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING 1",
        &[q.id.into(), consumer.into(), n.into(), fp.into(), dl.into()],
    );
    if !t.is_empty() {
        exec(
            client,
            "INSERT INTO pgque.partition_slot (ps_queue, ps_consumer, ps_slot, ps_n, ps_pause) \
             SELECT $1, $2, g, $3, $4 FROM generate_series(0, $3 - 1) g",
            &[
                q.id.into(),
                consumer.into(),
                n.into(),
                (fp == "pause").into(),
            ],
        );
        return;
    }
    let t = exec(
        client,
        "SELECT pc_n, pc_failure_policy, pc_on_dead_letter FROM pgque.partition_consumer \
          WHERE pc_queue = $1 AND pc_consumer = $2 FOR NO KEY UPDATE",
        &[q.id.into(), consumer.into()],
    );
    let (persisted, pfp, pdl): (i32, String, String) = first_row(t)
        .map(|r| {
            (
                col(&r, 1).unwrap(),
                col(&r, 2).unwrap(),
                col(&r, 3).unwrap(),
            )
        })
        .unwrap_or_else(|| {
            raise(
                error::UNDEFINED_OBJECT,
                "consumer not registered: it was removed concurrently",
            )
        });
    check_n(consumer, persisted, n);
    if policy.is_some() && (pfp.as_str(), pdl.as_str()) != (fp, dl) {
        error::raise_detail(
            error::INVALID_PARAMETER_VALUE,
            format!(
                "consumer {consumer:?} has failure_policy {pfp:?} (on_dead_letter {pdl:?}), not {fp:?} ({dl:?}): the policy cannot change while it is subscribed"
            ),
            "The failure policy is chosen at the first subscribe; unsubscribe_partitioned and subscribe again to change it.",
        );
    }
}

/// Subscribes slots `from..=to` that are not subscribed, all at `tick`;
/// returns how many were new.
pub fn subscribe_slots(
    client: &mut SpiClient<'_>,
    q: &Queue,
    consumer: &str,
    from: i32,
    to: i32,
    tick: i64,
) -> i32 {
    let new_slots: i64 = first_row(exec(
        client,
        "SELECT count(*) FROM pgque.partition_slot \
          WHERE ps_queue = $1 AND ps_consumer = $2 AND ps_slot BETWEEN $3 AND $4 AND ps_sub IS NULL",
        &[q.id.into(), consumer.into(), from.into(), to.into()],
    ))
    .and_then(|r| col(&r, 1))
    .unwrap_or(0);
    super::queue::check_consumer_room(client, q, new_slots);
    let t = exec(
        client,
        "WITH s AS ( \
           INSERT INTO pgque.subscription (sub_queue, sub_consumer, sub_start_tick) \
           SELECT $1, $2 || '#' || g, $5 FROM generate_series($3, $4) g \
               JOIN pgque.partition_slot p ON p.ps_queue = $1 AND p.ps_consumer = $2 AND p.ps_slot = g \
              WHERE p.ps_sub IS NULL \
           ON CONFLICT DO NOTHING RETURNING sub_id, sub_consumer) \
         UPDATE pgque.partition_slot p SET ps_sub = s.sub_id FROM s \
          WHERE p.ps_queue = $1 AND p.ps_consumer = $2 AND s.sub_consumer = $2 || '#' || p.ps_slot \
         RETURNING 1",
        &[
            q.id.into(),
            consumer.into(),
            from.into(),
            to.into(),
            tick.into(),
        ],
    );
    t.len() as i32
}

/// Removes slot subscriptions (their retries too) of slots `from..=to`;
/// returns how many there were. The lease rows stay (N stays persisted).
pub fn unsubscribe_slots(
    client: &mut SpiClient<'_>,
    q: &Queue,
    consumer: &str,
    from: i32,
    to: i32,
) -> i32 {
    let t = exec(
        client,
        "WITH p AS (UPDATE pgque.partition_slot p SET ps_sub = NULL, ps_owner = NULL, ps_until = now() \
                     FROM (SELECT ps_slot, ps_sub FROM pgque.partition_slot \
                            WHERE ps_queue = $1 AND ps_consumer = $2 AND ps_slot BETWEEN $3 AND $4 \
                              AND ps_sub IS NOT NULL FOR UPDATE) old \
                    WHERE p.ps_queue = $1 AND p.ps_consumer = $2 AND p.ps_slot = old.ps_slot \
                    RETURNING old.ps_sub AS sub_id), \
              r AS (DELETE FROM pgque.retry_queue WHERE ev_owner IN (SELECT sub_id FROM p)), \
              s AS (DELETE FROM pgque.subscription WHERE sub_id IN (SELECT sub_id FROM p) RETURNING 1) \
         SELECT count(*)::int4 FROM s",
        &[q.id.into(), consumer.into(), from.into(), to.into()],
    );
    col(&first_row(t).unwrap(), 1).unwrap()
}

/// Forgets a partitioned consumer whose slots are all unsubscribed (its N
/// and leases); true when it did.
pub fn forget_if_empty(client: &mut SpiClient<'_>, q: &Queue, consumer: &str) -> bool {
    let t = exec(
        client,
        "DELETE FROM pgque.partition_consumer c WHERE pc_queue = $1 AND pc_consumer = $2 \
            AND NOT EXISTS (SELECT 1 FROM pgque.partition_slot p WHERE p.ps_queue = $1 \
                              AND p.ps_consumer = $2 AND p.ps_sub IS NOT NULL) \
         RETURNING pc_n",
        &[q.id.into(), consumer.into()],
    );
    let gone: Option<i32> = first_row(t).and_then(|r| col(&r, 1));
    if let Some(n) = gone {
        drop_index_if_unused(client, q, n);
    }
    gone.is_some()
}

/// Takes or renews a slot's lease without waiting: a slot whose row another
/// transaction holds (a claim or a receive in flight) counts as busy.
/// `slot` None picks the free or expired slot that has waited longest (never
/// one the worker holds live: that is not free).
/// The owner re-claiming keeps its epoch; anyone else taking a free or
/// expired lease gets epoch + 1. Returns (slot, epoch), None when busy.
pub fn claim(
    client: &mut SpiClient<'_>,
    q: &Queue,
    consumer: &str,
    slot: Option<i32>,
    worker: &str,
    ttl: &pgrx::datum::Interval,
) -> Option<(i32, i64)> {
    let t = exec(
        client,
        "WITH l AS ( \
           SELECT ps_slot FROM pgque.partition_slot \
            WHERE ps_queue = $1 AND ps_consumer = $2 AND ($3::int4 IS NULL OR ps_slot = $3) \
              AND ps_sub IS NOT NULL \
              AND (ps_owner IS NULL OR ps_until <= clock_timestamp() \
                   OR ($3::int4 IS NOT NULL AND ps_owner = $4)) \
            ORDER BY ps_until, ps_slot LIMIT 1 \
              FOR NO KEY UPDATE SKIP LOCKED) \
         UPDATE pgque.partition_slot p \
            SET ps_epoch = p.ps_epoch + CASE WHEN p.ps_owner IS NOT DISTINCT FROM $4 THEN 0 ELSE 1 END, \
                ps_owner = $4, ps_until = clock_timestamp() + $5, ps_ttl = $5 \
           FROM l WHERE p.ps_queue = $1 AND p.ps_consumer = $2 AND p.ps_slot = l.ps_slot \
         RETURNING p.ps_slot, p.ps_epoch",
        &[
            q.id.into(),
            consumer.into(),
            slot.into(),
            worker.into(),
            (*ttl).into(),
        ],
    );
    first_row(t).map(|r| (col(&r, 1).unwrap(), col(&r, 2).unwrap()))
}

/// What the lease fence found.
pub struct Fenced {
    pub sub_id: i32,
    pub epoch: i64,
    /// Whether this transaction now holds the slot's lease row.
    pub locked: bool,
    /// The consumer's failure policy is `pause` (src/log/pause.rs).
    pub pause: bool,
    /// The slot's seal during a resize (src/log/resize.rs): its batches
    /// stop at this tick. Authoritative only when `locked`.
    pub seal: Option<i64>,
}

/// The lease fence of receive / ack / nack_partitioned: checks that `worker`
/// holds the slot's lease (55000 otherwise: taken over, released, never
/// claimed; nothing is changed) and renews it once half its TTL has passed
/// -- renewal rides these calls, so a busy slot writes its lease row about
/// twice per TTL, not once per batch.
///
/// With `lock`, the lease row is locked (FOR NO KEY UPDATE, waiting only
/// for a claim or another call of the same slot in flight) before the
/// check: every call that changes the slot's state (opens, acks or nacks a
/// batch) holds it, so a takeover is serialized with them. Without `lock`
/// the check only reads (an idle poll or a re-read of the open batch takes
/// no row lock, so it never turns a claim away), unless a renewal is due.
pub fn fence(
    client: &mut SpiClient<'_>,
    q: &Queue,
    consumer: &str,
    s: Slot,
    worker: &str,
    lock: bool,
) -> Fenced {
    let sql = format!(
        "SELECT ps_n, ps_sub, ps_owner, ps_epoch, \
                ps_ttl IS NOT NULL AND ps_until - clock_timestamp() < ps_ttl / 2, {}, {} \
           FROM pgque.partition_slot \
          WHERE ps_queue = $1 AND ps_consumer = $2 AND ps_slot = $3{}",
        if crate::log::schema::pause_installed() {
            "ps_pause"
        } else {
            "false"
        },
        if crate::log::schema::resize_installed() {
            "ps_seal"
        } else {
            "NULL::int8"
        },
        if lock { " FOR NO KEY UPDATE" } else { "" }
    );
    let t = exec(client, &sql, &[q.id.into(), consumer.into(), s.k.into()]);
    let Some(r) = first_row(t) else {
        let persisted = require_n(client, q, consumer);
        check_n(consumer, persisted, s.n);
        raise(
            error::UNDEFINED_OBJECT,
            format!("slot {} does not exist", s.k),
        );
    };
    let n: i32 = col(&r, 1).unwrap();
    let sub: Option<i32> = col(&r, 2);
    let owner: Option<String> = col(&r, 3);
    let epoch: i64 = col(&r, 4).unwrap();
    let renew: bool = col(&r, 5).unwrap();
    let pause: bool = col(&r, 6).unwrap();
    let seal: Option<i64> = col(&r, 7);
    drop(r);
    check_n(consumer, n, s.n);
    let Some(sub_id) = sub else {
        raise(
            error::UNDEFINED_OBJECT,
            format!(
                "consumer not registered: slot {} of {consumer:?} is not subscribed",
                s.k
            ),
        );
    };
    if owner.as_deref() != Some(worker) {
        error::raise_detail(
            error::WRONG_STATE,
            format!(
                "worker {worker:?} does not hold the lease of slot {} of {consumer:?}",
                s.k
            ),
            match owner {
                Some(o) => {
                    format!("the lease is held by {o:?} at epoch {epoch}; claim the slot again")
                }
                None => format!("the slot is not claimed (epoch {epoch}); claim it first"),
            },
        );
    }
    if renew && !lock {
        return fence(client, q, consumer, s, worker, true);
    }
    if renew {
        exec(
            client,
            "UPDATE pgque.partition_slot SET ps_until = clock_timestamp() + ps_ttl \
              WHERE ps_queue = $1 AND ps_consumer = $2 AND ps_slot = $3",
            &[q.id.into(), consumer.into(), s.k.into()],
        );
    }
    Fenced {
        sub_id,
        epoch,
        locked: lock,
        pause,
        seal,
    }
}

/// Releases the lease if `worker` holds it: false when it does not; 55000
/// while the slot has an open batch (ack or nack it first).
pub fn release(
    client: &mut SpiClient<'_>,
    q: &Queue,
    consumer: &str,
    k: i32,
    worker: &str,
) -> bool {
    let t = exec(
        client,
        "SELECT ps_sub, ps_owner = $4 FROM pgque.partition_slot \
          WHERE ps_queue = $1 AND ps_consumer = $2 AND ps_slot = $3 FOR NO KEY UPDATE",
        &[q.id.into(), consumer.into(), k.into(), worker.into()],
    );
    let Some(r) = first_row(t) else {
        return false;
    };
    let sub: Option<i32> = col(&r, 1);
    let mine: bool = col(&r, 2).unwrap_or(false);
    drop(r);
    if !mine {
        return false;
    }
    if let Some(sub) = sub {
        if super::batch::latest_batch(client, sub).is_some_and(|b| !b.done) {
            raise(
                error::WRONG_STATE,
                format!(
                    "slot {k} of {consumer:?} has an open batch: ack or nack it before releasing"
                ),
            );
        }
    }
    exec(
        client,
        "UPDATE pgque.partition_slot SET ps_owner = NULL, ps_until = clock_timestamp() \
          WHERE ps_queue = $1 AND ps_consumer = $2 AND ps_slot = $3",
        &[q.id.into(), consumer.into(), k.into()],
    );
    true
}

/// Events of slot `s` that its subscription has not consumed yet: those in
/// the event tables committed after its position (through the slot index)
/// plus its scheduled retries; and the oldest one's age.
pub fn backlog(
    client: &mut SpiClient<'_>,
    qid: i32,
    s: Slot,
    sub_id: i32,
    pos_snapshot: &str,
) -> (i64, Option<pgrx::datum::Interval>) {
    let sql = format!(
        "SELECT count(*), now() - min(ev_time) FROM ( \
           SELECT ev_time FROM {} \
            WHERE {} = $1 AND ev_txid >= pg_snapshot_xmin($3::pg_snapshot) \
              AND NOT pg_visible_in_snapshot(ev_txid, $3::pg_snapshot) \
              AND (ev_owner IS NULL OR ev_owner = $2) \
           UNION ALL \
           SELECT ev_time FROM pgque.retry_queue WHERE ev_owner = $2) e",
        super::queue::event_parent(qid),
        slot_expr(s.n)
    );
    let t = exec(
        client,
        &sql,
        &[(s.k as i64).into(), sub_id.into(), pos_snapshot.into()],
    );
    let r = first_row(t).unwrap();
    (col(&r, 1).unwrap(), col(&r, 2))
}
