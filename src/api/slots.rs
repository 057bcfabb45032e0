//! Partition keys (DESIGN.md section 3): ordered per-key consumption through
//! N slots, each consumed by one lease holder at a time.
//!
//! Arguments are checked before anything is touched: NULL 22004, names
//! 42602/42622 (a consumer name with '#' is 42602: '#' separates a
//! consumer from its slot number in the slot subscriptions `c#k`), N outside
//! 1..256 and slot outside 0..N-1 22003, an N other than the persisted one
//! 22023, a TTL that is not finite or under one second 22023, an unknown
//! queue / consumer / unsubscribed slot 42704. A worker that does not hold
//! the slot's lease gets 55000 from receive / ack / nack_partitioned, and
//! nothing is changed.
#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
use super::srf::{Messages, MessagesWithHeaders};
use super::{deliver, max_return_arg};
use crate::error::{self, raise, required};
use crate::log::slot::{Slot, MAX_SLOTS};
use crate::log::slots;
use crate::log::{self, batch, pause, tick, Queue};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

/// N: required, 1..=256 (22003).
fn n_arg(n: Option<i32>) -> i32 {
    let n = required(n, "n");
    if !(1..=MAX_SLOTS).contains(&n) {
        raise(
            error::OUT_OF_RANGE,
            format!("n must be between 1 and {MAX_SLOTS}, not {n}"),
        );
    }
    n
}

/// A slot number: required, 0..n-1 (22003).
fn slot_arg(slot: Option<i32>, n: i32) -> i32 {
    let k = required(slot, "slot");
    if !(0..n).contains(&k) {
        raise(
            error::OUT_OF_RANGE,
            format!("slot must be between 0 and {} (n = {n}), not {k}", n - 1),
        );
    }
    k
}

fn worker_arg(worker: Option<&str>) -> &str {
    error::valid_name(worker, "worker", error::MAX_CONSUMER_NAME)
}

/// The TTL of a lease: required, finite, at least one second (22023).
fn ttl_arg(ttl: Option<Interval>) -> Interval {
    let ttl = required(ttl, "ttl");
    // PostgreSQL 17+ infinite intervals have every field at its extreme.
    let infinite = ttl.months() == i32::MAX || ttl.months() == i32::MIN;
    if infinite || crate::datum::interval_ms(&ttl) < 1000.0 {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "ttl must be a finite interval of at least 1 second",
        );
    }
    ttl
}

/// The queue and the checked consumer name.
fn queue_consumer<'a>(
    c: &mut SpiClient<'_>,
    queue_name: Option<&str>,
    consumer: Option<&'a str>,
) -> (Queue, &'a str) {
    let q = log::queue_by_name(c, queue_name);
    let consumer = log::valid_consumer(consumer, "consumer");
    (q, consumer)
}

/// The tick new slot subscriptions start at: the queue's last (one for all).
fn shared_tick(c: &mut SpiClient<'_>, q: &Queue) -> i64 {
    tick::last_tick(c, q.id)
        .map(|t| t.id)
        .unwrap_or_else(|| tick::insert_tick(c, q.id, &q.name, 0, tick::Pending::None))
}

/// subscribe_partitioned(queue_name, consumer, n) → slots newly subscribed:
/// all N slot subscriptions `consumer#0..n-1`, at one shared tick, in this
/// transaction; N is persisted (a different N later is 22023). Creates the
/// slot index for N on the queue's event tables when it is the first
/// consumer with that N (sends wait for this transaction meanwhile).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn subscribe_partitioned(queue_name: Option<&str>, consumer: Option<&str>, n: Option<i32>) -> i32 {
    subscribe_with(queue_name, consumer, n, slots::Policy::SKIP)
}

fn subscribe_with(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    n: Option<i32>,
    policy: slots::Policy,
) -> i32 {
    let n = n_arg(n);
    Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        slots::set_n(c, &q, consumer, n, Some(policy));
        slots::ensure_index(c, &q, n);
        let at = shared_tick(c, &q);
        slots::subscribe_slots(c, &q, consumer, 0, n - 1, at)
    })
}

/// The failure policy arguments: failure_policy 'skip' or 'pause',
/// on_dead_letter 'resume' or 'block' ('block' only with 'pause'); NULL
/// 22004, anything else 22023.
fn policy_arg(failure_policy: Option<&str>, on_dead_letter: Option<&str>) -> slots::Policy {
    let fp = required(failure_policy, "failure_policy");
    let dl = required(on_dead_letter, "on_dead_letter");
    let pause = match fp {
        "skip" => false,
        "pause" => true,
        _ => raise(
            error::INVALID_PARAMETER_VALUE,
            format!("failure_policy must be 'skip' or 'pause', not {fp:?}"),
        ),
    };
    let block = match dl {
        "resume" => false,
        "block" => true,
        _ => raise(
            error::INVALID_PARAMETER_VALUE,
            format!("on_dead_letter must be 'resume' or 'block', not {dl:?}"),
        ),
    };
    if block && !pause {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "on_dead_letter 'block' needs failure_policy 'pause' (with 'skip' a dead letter holds nothing back)",
        );
    }
    if pause && !crate::log::schema::pause_installed() {
        raise(
            error::WRONG_STATE,
            "failure_policy 'pause' needs pgque 0.8.0's schema: run ALTER EXTENSION pgque UPDATE",
        );
    }
    slots::Policy { pause, block }
}

/// subscribe_partitioned(queue_name, consumer, n, failure_policy,
/// on_dead_letter default 'resume') → slots newly subscribed: as the
/// three-argument form, with the consumer's failure policy (persisted with
/// N; a different one later is 22023). 'skip' (the three-argument form's):
/// a nacked event comes back after its key's later events. 'pause': its
/// key's later events wait until it is acked or dead-lettered; after a dead
/// letter 'resume' lets them go, 'block' holds them until
/// release_partition_key (src/log/pause.rs).
#[pg_extern(name = "subscribe_partitioned", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn subscribe_partitioned_policy(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    n: Option<i32>,
    failure_policy: Option<&str>,
    on_dead_letter: default!(Option<&str>, "'resume'"),
) -> i32 {
    let policy = policy_arg(failure_policy, on_dead_letter);
    subscribe_with(queue_name, consumer, n, policy)
}

/// release_partition_key(queue_name, consumer, partition_key) → true when
/// the key was blocked (pause policy): its failed event (if still waiting
/// for its retry time) and its held events are redelivered next, in order,
/// then it flows again; done at once, or at the ack of the slot's open
/// batch. False when the key is not blocked. An administrator's call.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn release_partition_key(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    partition_key: Option<&str>,
) -> bool {
    let key = required(partition_key, "partition_key");
    Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        let n = slots::require_n(c, &q, consumer);
        if !crate::log::schema::pause_installed() {
            return false;
        }
        let k = crate::log::slot::slot_of(Some(key), n);
        // The lease row: serialized with the slot's batch openings, acks
        // and nacks (it waits for one in flight).
        let t = log::exec(
            c,
            "SELECT ps_sub FROM pgque.partition_slot \
              WHERE ps_queue = $1 AND ps_consumer = $2 AND ps_slot = $3 FOR NO KEY UPDATE",
            &[q.id.into(), consumer.into(), k.into()],
        );
        let Some(sub) = log::first_row(t).and_then(|r| log::col::<i32>(&r, 1)) else {
            return false;
        };
        crate::log::pause::release_key(c, &q, sub, key)
    })
}

/// unsubscribe_partitioned(queue_name, consumer) → slots unsubscribed: removes
/// every slot subscription, its retries, the leases and the persisted N.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn unsubscribe_partitioned(queue_name: Option<&str>, consumer: Option<&str>) -> i32 {
    Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        let n = slots::require_n(c, &q, consumer);
        // A resize in progress goes too (its new slots delivered nothing).
        if let Some(r) = crate::log::resize::current(c, &q, consumer) {
            crate::log::resize::drop_pending(c, &q, consumer, &r);
        }
        let gone = slots::unsubscribe_slots(c, &q, consumer, 0, n - 1);
        slots::forget_if_empty(c, &q, consumer);
        gone
    })
}

/// subscribe_slot(queue_name, consumer, slot, n) → 1 new / 0 subscribed
/// already: (re)subscribes one slot at the queue's last tick (repair); the
/// first call for a consumer persists N like subscribe_partitioned.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn subscribe_slot(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    slot: Option<i32>,
    n: Option<i32>,
) -> i32 {
    let n = n_arg(n);
    let k = slot_arg(slot, n);
    Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        slots::set_n(c, &q, consumer, n, None);
        slots::ensure_index(c, &q, n);
        let at = shared_tick(c, &q);
        slots::subscribe_slots(c, &q, consumer, k, k, at)
    })
}

/// unsubscribe_slot(queue_name, consumer, slot, n) → 1 / 0 not subscribed:
/// removes one slot subscription (and its retries); when it was the last,
/// the consumer and its N are forgotten.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn unsubscribe_slot(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    slot: Option<i32>,
    n: Option<i32>,
) -> i32 {
    let n = n_arg(n);
    let k = slot_arg(slot, n);
    Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        let persisted = slots::require_n(c, &q, consumer);
        slots::check_n(consumer, persisted, n);
        crate::log::resize::refuse_during(c, &q, consumer, "unsubscribe_slot");
        let gone = slots::unsubscribe_slots(c, &q, consumer, k, k);
        slots::forget_if_empty(c, &q, consumer);
        gone
    })
}

/// claim_slot(queue_name, consumer, slot, worker, ttl default '30 seconds')
/// → the lease epoch, or NULL at once when another worker holds the slot
/// (or a claim / call of that slot is in flight). Never waits.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn claim_slot(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    slot: Option<i32>,
    worker: Option<&str>,
    ttl: default!(Option<Interval>, "'30 seconds'"),
) -> Option<i64> {
    let worker = worker_arg(worker);
    let ttl = ttl_arg(ttl);
    let k = required(slot, "slot");
    Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        let n = slots::require_n(c, &q, consumer);
        let k = slot_arg(Some(k), n);
        require_subscribed(c, &q, consumer, k);
        slots::claim(c, &q, consumer, Some(k), worker, &ttl).map(|(_, e)| e)
    })
}

fn require_subscribed(c: &mut SpiClient<'_>, q: &Queue, consumer: &str, k: i32) {
    let name = crate::log::slot::slot_sub_name(consumer, k);
    if log::find_sub(c, q, &name).is_none() {
        raise(
            error::UNDEFINED_OBJECT,
            format!("consumer not registered: slot {k} of {consumer:?} is not subscribed"),
        );
    }
}

/// claim_next_slot(queue_name, consumer, worker, ttl default '30 seconds') →
/// (slot, epoch) of the free or expired subscribed slot that has waited
/// longest, now leased to `worker`; no row when every slot is held.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn claim_next_slot(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    worker: Option<&str>,
    ttl: default!(Option<Interval>, "'30 seconds'"),
) -> TableIterator<'static, (name!(slot, i32), name!(epoch, i64))> {
    let worker = worker_arg(worker);
    let ttl = ttl_arg(ttl);
    let got = Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        slots::require_n(c, &q, consumer);
        slots::claim(c, &q, consumer, None, worker, &ttl)
    });
    TableIterator::new(got)
}

/// release_slot(queue_name, consumer, slot, worker) → true when released,
/// false when `worker` did not hold it; 55000 while the slot has an open
/// batch. The epoch stays; the next claimant gets epoch + 1.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn release_slot(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    slot: Option<i32>,
    worker: Option<&str>,
) -> bool {
    let worker = worker_arg(worker);
    let k = required(slot, "slot");
    Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        let n = slots::require_n(c, &q, consumer);
        let k = slot_arg(Some(k), n);
        slots::release(c, &q, consumer, k, worker)
    })
}

/// Checks the arguments of a fenced call and passes the fence (see
/// slots::fence; `lock` for calls that change the slot's state).
fn fenced<'a>(
    c: &mut SpiClient<'_>,
    queue_name: Option<&str>,
    consumer: Option<&'a str>,
    slot: Option<i32>,
    n: Option<i32>,
    worker: Option<&'a str>,
    lock: bool,
) -> (Queue, &'a str, &'a str, Slot, slots::Fenced) {
    let n = n_arg(n);
    let k = slot_arg(slot, n);
    let worker = worker_arg(worker);
    let (q, consumer) = queue_consumer(c, queue_name, consumer);
    let s = Slot { n, k };
    let f = slots::fence(c, &q, consumer, s, worker, lock);
    (q, consumer, worker, s, f)
}

/// receive_partitioned(queue_name, consumer, slot, n, worker, max_return
/// default 100) → setof pgque.message: the slot's open batch, or its next
/// one (events of that slot only, in event-id order). Lease-fenced; an idle
/// poll and a re-read of the open batch take no row lock, opening a batch
/// locks the lease row first.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn receive_partitioned(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    slot: Option<i32>,
    n: Option<i32>,
    worker: Option<&str>,
    max_return: default!(Option<i32>, 100),
) -> Messages {
    Messages::new(partitioned_batch(
        queue_name, consumer, slot, n, worker, max_return,
    ))
}

/// receive_partitioned(queue_name, consumer, slot, n, worker, max_return,
/// wait) → receive_partitioned that waits inside the server, for at most
/// `wait` (capped by pgque.max_wait), until the slot has a batch (docs/waits.md).
/// The wait reads only (the lease as the plain call checks it, the slot's
/// frontier, one probe of its events past it); then, or at the end of the
/// wait, the plain call runs once and its rows are returned. A lease due
/// for renewal is renewed by a look, a write, which ends the wait.
#[pg_extern(name = "receive_partitioned", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn receive_partitioned_wait(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    slot: Option<i32>,
    n: Option<i32>,
    worker: Option<&str>,
    max_return: Option<i32>,
    wait: Option<Interval>,
) -> Messages {
    use crate::waiters::{self, Key, Look};
    max_return_arg(max_return);
    let wait = waiters::wait_arg(wait);
    waiters::wait_for(
        wait,
        || {
            Spi::connect_mut(|c| {
                let (q, _, _, s, f) = fenced(c, queue_name, consumer, slot, n, worker, false);
                if slot_may_have_batch(c, &q, &f, s) {
                    Look::Found(())
                } else {
                    Look::Wait(vec![Key::Events(q.id)])
                }
            })
        },
        |_| {},
    );
    Messages::new(partitioned_batch(
        queue_name, consumer, slot, n, worker, max_return,
    ))
}

/// Whether slot `s` has an open batch, a cut with more above it, or an
/// event of its keys past its frontier (up to its seal): read-only.
fn slot_may_have_batch(c: &mut SpiClient<'_>, q: &Queue, f: &slots::Fenced, s: Slot) -> bool {
    let latest = batch::latest_batch(c, f.sub_id);
    if let Some(b) = &latest {
        if !b.done || b.ceiling.is_some() {
            return true;
        }
    }
    let from = match &latest {
        Some(b) => b.tick,
        None => batch::start_tick(c, f.sub_id),
    };
    if f.seal.is_some_and(|t| from >= t) {
        return false;
    }
    log::look::has_events_after(c, q, f.sub_id, Some(s), from, f.seal)
}

/// receive_partitioned_with_headers(queue_name, consumer, slot, n, worker,
/// max_return default 100) → receive_partitioned's rows with the events'
/// trace-context headers as a last column (`headers jsonb`).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn receive_partitioned_with_headers(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    slot: Option<i32>,
    n: Option<i32>,
    worker: Option<&str>,
    max_return: default!(Option<i32>, 100),
) -> MessagesWithHeaders {
    MessagesWithHeaders(Messages::new(partitioned_batch(
        queue_name, consumer, slot, n, worker, max_return,
    )))
}

/// What receive_partitioned returns: the slot's open or next batch.
fn partitioned_batch(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    slot: Option<i32>,
    n: Option<i32>,
    worker: Option<&str>,
    max_return: Option<i32>,
) -> Option<(i64, Vec<crate::log::events::Event>)> {
    let limit = max_return_arg(max_return);
    Spi::connect_mut(|c| {
        let (q, consumer, worker, s, f) = fenced(c, queue_name, consumer, slot, n, worker, false);
        let (locked, seal) = (f.locked, f.seal);
        // The seal as read under the lease row lock: a resize begun since
        // the unlocked read is seen before a batch is opened.
        let mut lock = |c: &mut SpiClient<'_>| {
            if locked {
                seal
            } else {
                slots::fence(c, &q, consumer, s, worker, true).seal
            }
        };
        if !f.pause {
            let opened = batch::next_batch_of(c, &q, f.sub_id, Some(s), limit, seal, &mut lock);
            return deliver(c, &q, opened);
        }
        // A batch whose events were all held back is finished at once and
        // the next one opened (a blocked key's backlog in the log must not
        // make the other keys' poll come back empty), up to a bound.
        for _ in 0..PARKED_BATCHES_PER_CALL {
            let opened = batch::next_batch_of(c, &q, f.sub_id, Some(s), limit, seal, &mut lock);
            match deliver_paused(c, &q, f.sub_id, opened) {
                Paused::Deliver(b, evs) => return Some((b, evs)),
                Paused::Nothing => return None,
                Paused::AllHeld => {}
            }
        }
        None
    })
}

/// How many batches whose events were all held back one receive_partitioned
/// of a paused slot goes through before it returns empty.
const PARKED_BATCHES_PER_CALL: usize = 16;

enum Paused {
    Deliver(i64, Vec<crate::log::events::Event>),
    /// No new batch, or an empty one.
    Nothing,
    /// A new batch whose events were all held back (finished).
    AllHeld,
}

/// deliver() for a slot of a pause consumer: a new batch's events of
/// blocked keys are held back (a batch left with nothing to deliver is
/// finished at once); an open batch read again shows what it showed.
fn deliver_paused(
    c: &mut SpiClient<'_>,
    q: &Queue,
    sub: i32,
    opened: Option<batch::Opened>,
) -> Paused {
    let Some(opened) = opened else {
        return Paused::Nothing;
    };
    let b = opened.batch;
    match opened.events {
        Some(evs) if evs.is_empty() => {
            batch::mark_done(c, b.batch_id, false);
            Paused::Nothing
        }
        Some(evs) => {
            let evs = pause::hold_back(c, sub, b.batch_id, evs);
            if evs.is_empty() {
                batch::mark_done(c, b.batch_id, false);
                pause::settle(c, q, sub, b.batch_id);
                return Paused::AllHeld;
            }
            Paused::Deliver(b.batch_id, evs)
        }
        None => {
            let evs = batch::batch_events(c, q, &b, false);
            Paused::Deliver(b.batch_id, pause::without_held(c, sub, b.batch_id, evs))
        }
    }
}

/// ack_partitioned(queue_name, consumer, slot, n, worker) → 1 when the
/// slot's open batch was finished, 0 when it had none. Lease-fenced.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn ack_partitioned(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    slot: Option<i32>,
    n: Option<i32>,
    worker: Option<&str>,
) -> i32 {
    Spi::connect_mut(|c| {
        let (q, _c, _w, _s, f) = fenced(c, queue_name, consumer, slot, n, worker, true);
        // The fence holds the lease row: no other ack of this slot runs now.
        match batch::latest_batch(c, f.sub_id) {
            Some(b) if !b.done => {
                batch::mark_done(c, b.batch_id, false);
                if f.pause {
                    pause::settle(c, &q, f.sub_id, b.batch_id);
                }
                1
            }
            _ => 0,
        }
    })
}

/// nack_partitioned(queue_name, consumer, slot, n, worker, msg, retry_after
/// default '60 seconds', reason default NULL) → 1 scheduled (or
/// dead-lettered), 0 already scheduled: the event is redelivered on the
/// same slot. 55000 when the slot has no open batch. Lease-fenced.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
#[allow(clippy::too_many_arguments)]
fn nack_partitioned(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    slot: Option<i32>,
    n: Option<i32>,
    worker: Option<&str>,
    msg: Option<pgrx::composite_type!("pgque.message")>,
    retry_after: default!(Option<Interval>, "'60 seconds'"),
    reason: default!(Option<&str>, "NULL"),
) -> i32 {
    let msg = required(msg, "msg");
    let retry_after = required(retry_after, "retry_after");
    super::consume::check_retry_after(&retry_after);
    let msg_id: i64 = required(
        msg.get_by_index(1.try_into().unwrap()).unwrap(),
        "msg.msg_id",
    );
    let msg_batch: Option<i64> = msg.get_by_index(2.try_into().unwrap()).unwrap();
    Spi::connect_mut(|c| {
        let (q, consumer, _w, s, f) = fenced(c, queue_name, consumer, slot, n, worker, true);
        let name = crate::log::slot::slot_sub_name(consumer, s.k);
        let b = match batch::latest_batch(c, f.sub_id) {
            Some(b) if !b.done => batch::Batch { slot: Some(s), ..b },
            _ => raise(
                error::WRONG_STATE,
                format!("slot {} has no open batch to nack in", s.k),
            ),
        };
        if msg_batch.is_some_and(|mb| mb != b.batch_id) {
            raise(
                error::INVALID_PARAMETER_VALUE,
                format!(
                    "msg belongs to batch {}, not to the slot's open batch {}",
                    msg_batch.unwrap(),
                    b.batch_id
                ),
            );
        }
        let ev = super::consume::find_in_batch(c, &q, &b, msg_id);
        if f.pause {
            pause::nack(c, &q, &b, &name, &ev, &retry_after, reason)
        } else {
            crate::log::retry::retry_event(c, &q, &b, &name, &ev, &retry_after, reason, true)
        }
    })
}

/// partition_slot(partition_key, n) → the slot (0..n-1) of a key for n
/// slots: (hashtextextended(key, 0) % n + n) % n, NULL key → 0.
#[pg_extern(immutable, parallel_safe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn partition_slot(partition_key: Option<&str>, n: Option<i32>) -> i32 {
    let n = n_arg(n);
    crate::log::slot::slot_of(partition_key, n)
}

/// The rows of view pgque.partition_slot_status: one per slot of every
/// partitioned consumer, with that slot's own backlog.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn partition_slot_rows() -> TableIterator<
    'static,
    (
        name!(queue_name, String),
        name!(consumer, String),
        name!(slot, i32),
        name!(n, i32),
        name!(subscribed, bool),
        name!(lease_owner, Option<String>),
        name!(lease_until, Option<TimestampWithTimeZone>),
        name!(epoch, i64),
        name!(last_tick, Option<i64>),
        name!(pending_events, Option<i64>),
        name!(oldest_pending_age, Option<Interval>),
    ),
> {
    let rows = Spi::connect_mut(|c| {
        let t = log::exec(
            c,
            "SELECT q.queue_name, p.ps_consumer, p.ps_slot, p.ps_n, p.ps_sub IS NOT NULL, \
                    CASE WHEN p.ps_until > clock_timestamp() THEN p.ps_owner END, \
                    CASE WHEN p.ps_owner IS NOT NULL THEN p.ps_until END, p.ps_epoch, \
                    cp.pos_tick, q.queue_id, p.ps_sub, t.tick_snapshot::text \
               FROM pgque.partition_slot p \
               JOIN pgque.queue q ON q.queue_id = p.ps_queue \
               LEFT JOIN pgque.consumer_position cp ON cp.sub_id = p.ps_sub \
               LEFT JOIN LATERAL (SELECT t.tick_snapshot FROM pgque.tick t \
                                   WHERE t.tick_queue = q.queue_id AND t.tick_id = cp.pos_tick LIMIT 1) t ON true \
              ORDER BY q.queue_name, p.ps_consumer, p.ps_slot",
            &[],
        );
        let base: Vec<_> = t
            .map(|r| {
                (
                    log::col::<String>(&r, 1).unwrap(),
                    log::col::<String>(&r, 2).unwrap(),
                    log::col::<i32>(&r, 3).unwrap(),
                    log::col::<i32>(&r, 4).unwrap(),
                    log::col::<bool>(&r, 5).unwrap(),
                    log::col::<String>(&r, 6),
                    log::col::<TimestampWithTimeZone>(&r, 7),
                    log::col::<i64>(&r, 8).unwrap(),
                    log::col::<i64>(&r, 9),
                    log::col::<i32>(&r, 10).unwrap(),
                    log::col::<i32>(&r, 11),
                    log::col::<String>(&r, 12),
                )
            })
            .collect();
        base.into_iter()
            .map(
                |(qn, cn, k, n, subd, owner, until, epoch, pos, qid, sub, snap)| {
                    let (pending, age) = match (sub, snap) {
                        (Some(sub), Some(snap)) => {
                            let (cnt, age) = slots::backlog(c, qid, Slot { n, k }, sub, &snap);
                            (Some(cnt), age)
                        }
                        _ => (None, None),
                    };
                    (qn, cn, k, n, subd, owner, until, epoch, pos, pending, age)
                },
            )
            .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}

extension_sql!(
    r#"
-- One row per slot of every partitioned consumer (DESIGN.md section 3).
-- lease_owner is NULL when the lease has expired; pending_events counts that
-- slot's own unconsumed events (and its scheduled retries), not the stream's.
CREATE VIEW pgque.partition_slot_status AS
SELECT queue_name, consumer, slot, n, subscribed, lease_owner, lease_until, epoch,
       last_tick, pending_events, oldest_pending_age
  FROM pgque.partition_slot_rows();
"#,
    name = "partition_slot_status_view",
    requires = [partition_slot_rows]
);

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one_i64(sql: &str) -> Option<i64> {
        Spi::get_one::<i64>(sql).unwrap()
    }
    fn one_bool(sql: &str) -> Option<bool> {
        Spi::get_one::<bool>(sql).unwrap()
    }

    /// Runs `sql` in a subtransaction: "ok", or the SQLSTATE it raised (its
    /// effects rolled back either way on error).
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

    /// A snapshot of everything the slot functions may change.
    fn fingerprint() -> String {
        Spi::get_one::<String>(
            "SELECT concat_ws('|', \
               (SELECT string_agg(concat_ws(',', ps_queue, ps_consumer, ps_slot, ps_n, ps_sub, ps_owner, ps_epoch, ps_until, ps_ttl), ';' ORDER BY 1) FROM pgque.partition_slot), \
               (SELECT string_agg(concat_ws(',', pc_queue, pc_consumer, pc_n), ';' ORDER BY 1) FROM pgque.partition_consumer), \
               (SELECT string_agg(concat_ws(',', sub_id, sub_consumer, sub_start_tick), ';' ORDER BY 1) FROM pgque.subscription), \
               (SELECT count(*) FROM pgque.batch), (SELECT count(*) FROM pgque.batch_done), \
               (SELECT count(*) FROM pgque.retry_queue))",
        )
        .unwrap()
        .unwrap_or_default()
    }

    #[pg_test]
    fn rust_hash_matches_hashtextextended() {
        let keys = [
            "",
            "a",
            "ab",
            "abc",
            "abcd",
            "abcde",
            "tenant-1",
            "tenant-42",
            "eleven char",
            "twelve chars",
            "thirteen char",
            "a much longer key, past 24 bytes: 0123456789",
            "ключ",
            "键",
            "🦀 crab",
        ];
        for k in keys {
            let pg = Spi::get_one_with_args::<i64>("SELECT hashtextextended($1, 0)", &[k.into()])
                .unwrap()
                .unwrap();
            assert_eq!(crate::log::slot::key_hash(k), pg, "key {k:?}");
            for n in [1, 2, 3, 16, 64, 255, 256] {
                let sql_slot = Spi::get_one_with_args::<i64>(
                    "SELECT (hashtextextended($1, 0) % $2 + $2) % $2",
                    &[k.into(), (n as i64).into()],
                )
                .unwrap()
                .unwrap();
                let via_fn = Spi::get_one_with_args::<i32>(
                    "SELECT pgque.partition_slot($1, $2)",
                    &[k.into(), n.into()],
                )
                .unwrap()
                .unwrap();
                assert_eq!(via_fn as i64, sql_slot, "key {k:?} n {n}");
                assert_eq!(crate::log::slot::slot_of(Some(k), n) as i64, sql_slot);
            }
        }
        assert_eq!(
            Spi::get_one::<i32>("SELECT pgque.partition_slot(NULL, 16)").unwrap(),
            Some(0)
        );
        assert_eq!(state("SELECT pgque.partition_slot('k', 0)"), "22003");
        assert_eq!(state("SELECT pgque.partition_slot('k', 257)"), "22003");
    }

    #[pg_test]
    fn keyed_sends_carry_the_key_in_extra1() {
        Spi::run("SELECT pgque.create_queue('k1')").unwrap();
        let a = one_i64("SELECT pgque.send('k1', 't', '{\"x\": 1}'::jsonb, 'tenant-7')").unwrap();
        let b = one_i64("SELECT pgque.send('k1', 't', 'plain'::text, NULL)").unwrap();
        let ids = Spi::get_one::<Vec<i64>>(
            "SELECT pgque.send_batch('k1', 't', ARRAY['p', 'q']::text[], ARRAY['k-a', NULL])",
        )
        .unwrap()
        .unwrap();
        assert_eq!(ids, vec![b + 1, b + 2]);
        let jids = Spi::get_one::<Vec<i64>>(
            "SELECT pgque.send_batch('k1', 't', ARRAY['{}'::jsonb], ARRAY['k-j'])",
        )
        .unwrap()
        .unwrap();
        assert_eq!(jids, vec![b + 3]);
        let qid =
            one_i64("SELECT queue_id::int8 FROM pgque.queue WHERE queue_name = 'k1'").unwrap();
        let got = Spi::get_one::<String>(&format!(
            "SELECT string_agg(ev_id || ':' || coalesce(ev_extra1, '-') || ':' || ev_data, ' ' ORDER BY ev_id) \
               FROM pgque.event_{qid}"
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            got,
            format!(
                "{a}:tenant-7:{{\"x\": 1}} {b}:-:plain {}:k-a:p {}:-:q {}:k-j:{{}}",
                b + 1,
                b + 2,
                b + 3
            )
        );
        // Keys and payloads must align; nothing is sent otherwise.
        assert_eq!(
            state("SELECT pgque.send_batch('k1', 't', ARRAY['p', 'q']::text[], ARRAY['only one'])"),
            "22023"
        );
        assert_eq!(
            state("SELECT pgque.send_batch('k1', 't', ARRAY['p']::text[], NULL::text[])"),
            "22004"
        );
    }

    #[pg_test]
    fn subscribe_partitioned_makes_n_slots_at_one_tick_with_indexes() {
        Spi::run("SELECT pgque.create_queue('p1')").unwrap();
        assert_eq!(
            one_i64("SELECT pgque.subscribe_partitioned('p1', 'orders', 4)::int8"),
            Some(4)
        );
        assert_eq!(
            one_i64("SELECT pgque.subscribe_partitioned('p1', 'orders', 4)::int8"),
            Some(0)
        );
        assert_eq!(
            one_i64(
                "SELECT count(DISTINCT sub_start_tick) FROM pgque.subscription \
                  WHERE sub_consumer LIKE 'orders#%'"
            ),
            Some(1)
        );
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT string_agg(sub_consumer, ',' ORDER BY sub_consumer) FROM pgque.subscription"
            )
            .unwrap()
            .unwrap(),
            "orders#0,orders#1,orders#2,orders#3"
        );
        let qid =
            one_i64("SELECT queue_id::int8 FROM pgque.queue WHERE queue_name = 'p1'").unwrap();
        for t in 0..3 {
            assert_eq!(
                one_bool(&format!(
                    "SELECT to_regclass('pgque.event_{qid}_{t}_slot4_idx') IS NOT NULL"
                )),
                Some(true)
            );
        }
        assert_eq!(
            one_i64(
                "SELECT count(*) FROM pgque.partition_slot_status \
                  WHERE queue_name = 'p1' AND consumer = 'orders' AND n = 4 AND subscribed \
                    AND lease_owner IS NULL AND epoch = 0 AND pending_events = 0"
            ),
            Some(4)
        );
        // Repair: one slot off and on again.
        assert_eq!(
            one_i64("SELECT pgque.unsubscribe_slot('p1', 'orders', 2, 4)::int8"),
            Some(1)
        );
        assert_eq!(
            one_i64("SELECT pgque.unsubscribe_slot('p1', 'orders', 2, 4)::int8"),
            Some(0)
        );
        assert_eq!(
            one_bool(
                "SELECT NOT subscribed FROM pgque.partition_slot_status WHERE consumer = 'orders' AND slot = 2"
            ),
            Some(true)
        );
        assert_eq!(
            state("SELECT pgque.claim_slot('p1', 'orders', 2, 'w')"),
            "42704"
        );
        assert_eq!(
            one_i64("SELECT pgque.subscribe_slot('p1', 'orders', 2, 4)::int8"),
            Some(1)
        );
        // All off: the consumer, its N and (unused) index go.
        assert_eq!(
            one_i64("SELECT pgque.unsubscribe_partitioned('p1', 'orders')::int8"),
            Some(4)
        );
        assert_eq!(
            one_i64("SELECT count(*) FROM pgque.partition_slot"),
            Some(0)
        );
        assert_eq!(one_i64("SELECT count(*) FROM pgque.subscription"), Some(0));
        assert_eq!(
            one_bool(&format!(
                "SELECT to_regclass('pgque.event_{qid}_0_slot4_idx') IS NULL"
            )),
            Some(true)
        );
        // Now another N is fine.
        assert_eq!(
            one_i64("SELECT pgque.subscribe_partitioned('p1', 'orders', 8)::int8"),
            Some(8)
        );
    }

    #[pg_test]
    fn bad_input_is_refused_and_changes_nothing() {
        Spi::run("SELECT pgque.create_queue('b1')").unwrap();
        Spi::run("SELECT pgque.subscribe_partitioned('b1', 'c', 4)").unwrap();
        Spi::run("SELECT pgque.subscribe('b1', 'plain')").unwrap();
        Spi::run("SELECT pgque.claim_slot('b1', 'c', 1, 'w1')").unwrap();
        let before = fingerprint();
        let cases = [
            ("SELECT pgque.subscribe_partitioned('b1', 'd', 0)", "22003"),
            (
                "SELECT pgque.subscribe_partitioned('b1', 'd', 257)",
                "22003",
            ),
            (
                "SELECT pgque.subscribe_partitioned('b1', 'd', NULL)",
                "22004",
            ),
            ("SELECT pgque.subscribe_partitioned('b1', 'c', 8)", "22023"),
            ("SELECT pgque.subscribe_slot('b1', 'c', 1, 8)", "22023"),
            ("SELECT pgque.subscribe_slot('b1', 'c', 4, 4)", "22003"),
            ("SELECT pgque.subscribe_slot('b1', 'c', -1, 4)", "22003"),
            (
                "SELECT pgque.subscribe_partitioned('b1', 'c#1', 4)",
                "42602",
            ),
            (
                "SELECT pgque.subscribe_partitioned('b1', 'a#b', 4)",
                "42602",
            ),
            ("SELECT pgque.subscribe('b1', 'c#1')", "42602"),
            ("SELECT pgque.receive('b1', 'c#1')", "42602"),
            (
                "SELECT pgque.subscribe_partitioned('b1', 'plain', 4)",
                "42710",
            ),
            ("SELECT pgque.subscribe('b1', 'c')", "42710"),
            (
                "SELECT pgque.subscribe_partitioned('nope', 'c', 4)",
                "42704",
            ),
            ("SELECT pgque.claim_slot('b1', 'c', 4, 'w2')", "22003"),
            ("SELECT pgque.claim_slot('b1', 'c', 0, NULL)", "22004"),
            ("SELECT pgque.claim_slot('b1', 'c', 0, '')", "42602"),
            (
                "SELECT pgque.claim_slot('b1', 'c', 0, 'w2', '0 seconds')",
                "22023",
            ),
            (
                "SELECT pgque.claim_slot('b1', 'c', 0, 'w2', '-5 seconds')",
                "22023",
            ),
            (
                "SELECT pgque.claim_slot('b1', 'c', 0, 'w2', '500 ms')",
                "22023",
            ),
            ("SELECT pgque.claim_slot('b1', 'c', 0, 'w2', NULL)", "22004"),
            ("SELECT pgque.claim_slot('b1', 'x', 0, 'w2')", "42704"),
            ("SELECT pgque.claim_next_slot('b1', 'c', NULL)", "22004"),
            (
                "SELECT pgque.claim_next_slot('b1', 'c', 'w2', '0 s')",
                "22023",
            ),
            ("SELECT pgque.release_slot('b1', 'c', 9, 'w1')", "22003"),
            ("SELECT pgque.release_slot('b1', 'c', 1, NULL)", "22004"),
            (
                "SELECT pgque.receive_partitioned('b1', 'c', 1, 8, 'w1')",
                "22023",
            ),
            (
                "SELECT pgque.receive_partitioned('b1', 'c', 1, 0, 'w1')",
                "22003",
            ),
            (
                "SELECT pgque.receive_partitioned('b1', 'c', 4, 4, 'w1')",
                "22003",
            ),
            (
                "SELECT pgque.receive_partitioned('b1', 'c', 1, 4, NULL)",
                "22004",
            ),
            (
                "SELECT pgque.receive_partitioned('b1', 'c', 1, 4, 'w2')",
                "55000",
            ),
            (
                "SELECT pgque.receive_partitioned('b1', 'c', 2, 4, 'w1')",
                "55000",
            ),
            (
                "SELECT pgque.receive_partitioned('b1', 'c', 1, 4, 'w1', 0)",
                "22023",
            ),
            (
                "SELECT pgque.ack_partitioned('b1', 'c', 1, 4, 'w2')",
                "55000",
            ),
            (
                "SELECT pgque.ack_partitioned('b1', 'x', 1, 4, 'w1')",
                "42704",
            ),
            (
                "SELECT pgque.nack_partitioned('b1', 'c', 1, 4, 'w1', NULL)",
                "22004",
            ),
            ("SELECT pgque.unsubscribe_slot('b1', 'c', 1, 5)", "22023"),
            ("SELECT pgque.unsubscribe_partitioned('b1', 'x')", "42704"),
            ("SELECT pgque.unsubscribe_partitioned('b1', 'x#1')", "42602"),
        ];
        for (sql, code) in cases {
            assert_eq!(state(sql), code, "{sql}");
        }
        if Spi::get_one::<i32>("SELECT current_setting('server_version_num')::int4 / 10000")
            .unwrap()
            .unwrap()
            >= 17
        {
            assert_eq!(
                state("SELECT pgque.claim_slot('b1', 'c', 0, 'w2', 'infinity')"),
                "22023"
            );
        }
        assert_eq!(fingerprint(), before, "a refused call changed something");
    }

    #[pg_test]
    fn claim_renew_release_and_epochs() {
        Spi::run("SELECT pgque.create_queue('l1')").unwrap();
        Spi::run("SELECT pgque.subscribe_partitioned('l1', 'c', 3)").unwrap();
        assert_eq!(
            one_i64("SELECT pgque.claim_slot('l1', 'c', 0, 'w1')"),
            Some(1)
        );
        // The owner re-claiming renews with the same epoch.
        assert_eq!(
            one_i64("SELECT pgque.claim_slot('l1', 'c', 0, 'w1', '1 minute')"),
            Some(1)
        );
        // Someone else: busy, NULL.
        assert_eq!(one_i64("SELECT pgque.claim_slot('l1', 'c', 0, 'w2')"), None);
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT lease_owner || ':' || epoch FROM pgque.partition_slot_status WHERE consumer = 'c' AND slot = 0"
            )
            .unwrap(),
            Some("w1:1".into())
        );
        // Only the owner releases.
        assert_eq!(
            one_bool("SELECT pgque.release_slot('l1', 'c', 0, 'w2')"),
            Some(false)
        );
        assert_eq!(
            one_bool("SELECT pgque.release_slot('l1', 'c', 0, 'w1')"),
            Some(true)
        );
        assert_eq!(
            one_bool("SELECT pgque.release_slot('l1', 'c', 0, 'w1')"),
            Some(false)
        );
        assert_eq!(
            one_i64("SELECT pgque.claim_slot('l1', 'c', 0, 'w2')"),
            Some(2)
        );
        // An expired lease is taken over with epoch + 1 (made expired by hand).
        Spi::run(
            "UPDATE pgque.partition_slot SET ps_until = clock_timestamp() - interval '1 second' \
              WHERE ps_consumer = 'c' AND ps_slot = 0",
        )
        .unwrap();
        assert_eq!(
            one_bool(
                "SELECT lease_owner IS NULL FROM pgque.partition_slot_status WHERE consumer = 'c' AND slot = 0"
            ),
            Some(true)
        );
        assert_eq!(
            one_i64("SELECT pgque.claim_slot('l1', 'c', 0, 'w3')"),
            Some(3)
        );
        assert_eq!(
            state("SELECT pgque.ack_partitioned('l1', 'c', 0, 3, 'w2')"),
            "55000"
        );
        assert_eq!(
            one_i64("SELECT pgque.ack_partitioned('l1', 'c', 0, 3, 'w3')::int8"),
            Some(0)
        );
        // claim_next_slot: the free slots, longest waiting first (1 then 2
        // were free since subscribe; slot 0 is held), then nothing.
        Spi::run(
            "UPDATE pgque.partition_slot SET ps_until = ps_until - interval '1 minute' \
              WHERE ps_consumer = 'c' AND ps_slot = 2",
        )
        .unwrap();
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT slot || ':' || epoch FROM pgque.claim_next_slot('l1', 'c', 'w4')"
            )
            .unwrap(),
            Some("2:1".into())
        );
        assert_eq!(
            Spi::get_one::<String>(
                "SELECT slot || ':' || epoch FROM pgque.claim_next_slot('l1', 'c', 'w5')"
            )
            .unwrap(),
            Some("1:1".into())
        );
        assert_eq!(
            one_i64("SELECT count(*) FROM pgque.claim_next_slot('l1', 'c', 'w6')"),
            Some(0)
        );
    }
}
