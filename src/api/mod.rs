//! The PgQue-compatible SQL API of event queues (DESIGN.md section 1).
//!
//! Every function is SECURITY DEFINER with a pinned search_path, except the
//! send path (send, send_batch, insert_event), which switches to the owner
//! itself and qualifies every name (owner.rs says why): roles get EXECUTE on
//! functions (sql/99_finalize.sql), never rights on the tables.
//! The bodies are thin: argument checks, then the engine in `crate::log`.
#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
use crate::error::{self, raise, required};
use crate::log::batch::PgText;
use crate::log::{self, batch, tick, NewEvent, Queue};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

pub mod admin;
pub mod dead_letter;
pub mod delayed;
pub mod idem;
pub mod info;
pub mod observe;
pub mod owner;
pub mod pgq_compat;
pub mod slots;
pub mod srf;
pub mod stored;
pub mod triggers;
pub mod types;

use srf::Messages;
use types::{interval_ms, ArrayDatum, JsonbArray, JsonbText, TextArray};

fn send_one(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    extra: [Option<&str>; 4],
) -> i64 {
    owner::as_owner(|| {
        Spi::connect_mut(|c| {
            let q = log::queue_by_name(c, queue_name);
            log::insert_event(
                c,
                &q,
                &NewEvent {
                    ev_type: type_name,
                    ev_data: payload,
                    extra,
                },
            )
        })
    })
}

/// A required, non-empty event type (22004 / 42602).
pub(crate) fn type_arg(type_name: Option<&str>) -> &str {
    let t = required(type_name, "type_name");
    if t.is_empty() {
        raise(error::INVALID_NAME, "type_name must not be empty");
    }
    t
}

/// send(queue_name, payload jsonb): publishes one event of type 'default'.
#[pg_extern(name = "send")]
fn send_jsonb(queue_name: Option<&str>, payload: Option<JsonbText>) -> i64 {
    let p = payload.map(|p| p.0);
    send_one(queue_name, Some("default"), p.as_deref(), [None; 4])
}

/// send(queue_name, payload text): publishes one event of type 'default'.
#[pg_extern(name = "send")]
fn send_text(queue_name: Option<&str>, payload: Option<&str>) -> i64 {
    send_one(queue_name, Some("default"), payload, [None; 4])
}

/// send(queue_name, type_name, payload jsonb).
#[pg_extern(name = "send")]
fn send_typed_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<JsonbText>,
) -> i64 {
    let t = type_arg(type_name);
    let p = payload.map(|p| p.0);
    send_one(queue_name, Some(t), p.as_deref(), [None; 4])
}

/// send(queue_name, type_name, payload text).
#[pg_extern(name = "send")]
fn send_typed_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
) -> i64 {
    let t = type_arg(type_name);
    send_one(queue_name, Some(t), payload, [None; 4])
}

fn send_many(
    queue_name: Option<&str>,
    type_name: &str,
    payloads: ArrayDatum,
    keys: Option<TextArray>,
) -> Vec<i64> {
    if let Some(k) = &keys {
        if k.0.len != payloads.len {
            raise(
                error::INVALID_PARAMETER_VALUE,
                format!(
                    "partition_keys has {} elements, payloads has {}: they must align",
                    k.0.len, payloads.len
                ),
            );
        }
    }
    owner::as_owner(|| {
        Spi::connect_mut(|c| {
            let q = log::queue_by_name(c, queue_name);
            log::insert_events(c, &q, type_name, &payloads, keys.map(|k| k.0).as_ref())
        })
    })
}

/// send_batch(queue_name, payloads jsonb[]) → ids aligned with the input.
#[pg_extern(name = "send_batch")]
fn send_batch_jsonb(queue_name: Option<&str>, payloads: Option<JsonbArray>) -> Vec<i64> {
    let p = required(payloads, "payloads").0;
    send_many(queue_name, "default", p, None)
}

/// send_batch(queue_name, payloads text[]).
#[pg_extern(name = "send_batch")]
fn send_batch_text(queue_name: Option<&str>, payloads: Option<TextArray>) -> Vec<i64> {
    let p = required(payloads, "payloads").0;
    send_many(queue_name, "default", p, None)
}

/// send_batch(queue_name, type_name, payloads jsonb[]).
#[pg_extern(name = "send_batch")]
fn send_batch_typed_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payloads: Option<JsonbArray>,
) -> Vec<i64> {
    let t = type_arg(type_name).to_string();
    let p = required(payloads, "payloads").0;
    send_many(queue_name, &t, p, None)
}

/// send_batch(queue_name, type_name, payloads text[]).
#[pg_extern(name = "send_batch")]
fn send_batch_typed_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payloads: Option<TextArray>,
) -> Vec<i64> {
    let t = type_arg(type_name).to_string();
    let p = required(payloads, "payloads").0;
    send_many(queue_name, &t, p, None)
}

/// send(queue_name, type_name, payload jsonb, partition_key): a keyed event;
/// the key rides ev_extra1 and picks the event's partition slot (NULL: slot 0).
#[pg_extern(name = "send")]
fn send_keyed_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<JsonbText>,
    partition_key: Option<&str>,
) -> i64 {
    let t = type_arg(type_name);
    let p = payload.map(|p| p.0);
    send_one(
        queue_name,
        Some(t),
        p.as_deref(),
        [partition_key, None, None, None],
    )
}

/// send(queue_name, type_name, payload text, partition_key).
#[pg_extern(name = "send")]
fn send_keyed_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    partition_key: Option<&str>,
) -> i64 {
    let t = type_arg(type_name);
    send_one(
        queue_name,
        Some(t),
        payload,
        [partition_key, None, None, None],
    )
}

/// send_batch(queue_name, type_name, payloads jsonb[], partition_keys text[]):
/// keyed events in one statement, keys aligned with payloads (22023 when the
/// lengths differ); ids aligned with the input.
#[pg_extern(name = "send_batch")]
fn send_batch_keyed_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payloads: Option<JsonbArray>,
    partition_keys: Option<TextArray>,
) -> Vec<i64> {
    let t = type_arg(type_name).to_string();
    let p = required(payloads, "payloads").0;
    let k = required(partition_keys, "partition_keys");
    send_many(queue_name, &t, p, Some(k))
}

/// send_batch(queue_name, type_name, payloads text[], partition_keys text[]).
#[pg_extern(name = "send_batch")]
fn send_batch_keyed_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payloads: Option<TextArray>,
    partition_keys: Option<TextArray>,
) -> Vec<i64> {
    let t = type_arg(type_name).to_string();
    let p = required(payloads, "payloads").0;
    let k = required(partition_keys, "partition_keys");
    send_many(queue_name, &t, p, Some(k))
}

/// insert_event(queue_name, ev_type, ev_data): PgQ's raw entry point.
#[pg_extern(name = "insert_event")]
fn insert_event3(queue_name: Option<&str>, ev_type: Option<&str>, ev_data: Option<&str>) -> i64 {
    send_one(queue_name, ev_type, ev_data, [None; 4])
}

/// insert_event(queue_name, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4).
#[pg_extern(name = "insert_event")]
fn insert_event7(
    queue_name: Option<&str>,
    ev_type: Option<&str>,
    ev_data: Option<&str>,
    ev_extra1: Option<&str>,
    ev_extra2: Option<&str>,
    ev_extra3: Option<&str>,
    ev_extra4: Option<&str>,
) -> i64 {
    send_one(
        queue_name,
        ev_type,
        ev_data,
        [ev_extra1, ev_extra2, ev_extra3, ev_extra4],
    )
}

// ---- consumers ---------------------------------------------------------

fn do_register(queue_name: Option<&str>, consumer: Option<&str>, at: Option<i64>) -> i32 {
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        let name = log::valid_consumer(consumer, "consumer");
        log::register(c, &q, name, at) as i32
    })
}

/// Unsubscribes a plain consumer: 1, or 0 when it is not subscribed (PgQue:
/// the number of subscriptions removed). An unknown queue is still 42704.
fn do_unregister(queue_name: Option<&str>, consumer: Option<&str>) -> i32 {
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        let name = log::valid_consumer(consumer, "consumer");
        match log::find_sub(c, &q, name) {
            Some(sub) => {
                log::unregister(c, &q, &sub);
                1
            }
            None => 0,
        }
    })
}

/// subscribe(queue_name, consumer) → 1 new, 0 already subscribed.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn subscribe(queue_name: Option<&str>, consumer: Option<&str>) -> i32 {
    do_register(queue_name, consumer, None)
}

/// unsubscribe(queue_name, consumer) → 1 removed, 0 when not subscribed.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn unsubscribe(queue_name: Option<&str>, consumer: Option<&str>) -> i32 {
    do_unregister(queue_name, consumer)
}

/// PgQ: register_consumer(x_queue_name, x_consumer_id).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn register_consumer(x_queue_name: Option<&str>, x_consumer_id: Option<&str>) -> i32 {
    do_register(x_queue_name, x_consumer_id, None)
}

/// PgQ: register_consumer_at(x_queue_name, x_consumer_name, x_tick_pos).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn register_consumer_at(
    x_queue_name: Option<&str>,
    x_consumer_name: Option<&str>,
    x_tick_pos: Option<i64>,
) -> i32 {
    let at = required(x_tick_pos, "x_tick_pos");
    do_register(x_queue_name, x_consumer_name, Some(at))
}

/// PgQ: unregister_consumer(x_queue_name, x_consumer_name).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn unregister_consumer(x_queue_name: Option<&str>, x_consumer_name: Option<&str>) -> i32 {
    do_unregister(x_queue_name, x_consumer_name)
}

pub(crate) fn max_return_arg(max_return: Option<i32>) -> i64 {
    let n = required(max_return, "max_return");
    if n < 1 {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!("max_return must be at least 1, not {n}"),
        );
    }
    // PgQue's clients pass i32::MAX for "as many as there are": above the
    // cap a call returns at most MAX_RETURN events, as a batch cut would.
    n.min(error::MAX_RETURN) as i64
}

/// Turns an opened batch into its events; an empty new batch is finished at
/// once (the consumer moves on), and nothing is returned.
pub(crate) fn deliver(
    c: &mut SpiClient<'_>,
    q: &Queue,
    opened: Option<batch::Opened>,
) -> Option<(i64, Vec<batch::Event>)> {
    let opened = opened?;
    let b = opened.batch;
    let evs = match opened.events {
        Some(evs) => {
            if evs.is_empty() {
                batch::mark_done(c, b.batch_id, false);
                return None;
            }
            evs
        }
        None => batch::batch_events(c, q, &b, false),
    };
    Some((b.batch_id, evs))
}

/// receive(queue_name, consumer, max_return default 100) → setof pgque.message.
///
/// Opens the consumer's next batch (at most max_return events: a bigger
/// range is cut into several batches) or returns its open batch, whole: an
/// open batch is always delivered entirely, so ack never drops unseen rows.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn receive(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    max_return: default!(Option<i32>, 100),
) -> Messages {
    let limit = max_return_arg(max_return);
    Messages::new(Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        let sub = log::sub_by_name(c, &q, consumer);
        let opened = batch::next_batch(c, &q, sub.id, limit);
        deliver(c, &q, opened)
    }))
}

/// ack(batch_id) → 1: finishes the batch; 0 (and a WARNING) when the batch
/// is unknown or already finished, as PgQue's ack.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn ack(batch_id: Option<i64>) -> i32 {
    Spi::connect_mut(|c| batch::finish(c, batch_id))
}

/// PgQ: finish_batch(x_batch_id).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn finish_batch(x_batch_id: Option<i64>) -> i32 {
    Spi::connect_mut(|c| batch::finish(c, x_batch_id))
}

/// Schedules one event of an open batch for redelivery to its consumer, or
/// dead-letters it once its retries reached the queue's max_retries.
#[allow(clippy::too_many_arguments)]
pub(crate) fn retry_event(
    c: &mut SpiClient<'_>,
    q: &Queue,
    b: &batch::Batch,
    consumer: &str,
    ev: &batch::Event,
    retry_after: &Interval,
    reason: Option<&str>,
    dead_letter: bool,
) -> i32 {
    // maint moves it back at ev_retry_after: an idle worker must learn that time.
    crate::worker::wake::recheck_at_commit();
    let count = ev.retry.unwrap_or(0);
    let [e1, e2, e3, e4] = &ev.extra;
    // The 0.7.0 schema records the event's transaction id (NULL where it was
    // not read: 0); an older schema, between a library install and ALTER
    // EXTENSION UPDATE, has no such column.
    let with_txid = log::dead_letter_store_installed();
    if dead_letter && count >= q.max_retries {
        // Once per (consumer, event): a repeated nack of a dead-lettered
        // event adds no second row (PgQue's contract), and still returns 1.
        let sql = if with_txid {
            "INSERT INTO pgque.dead_letter_store (dl_queue, dl_consumer, dl_owner, dl_reason, ev_id, ev_time, ev_retry, \
                                                  ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_txid) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, nullif($14, 0)::text::xid8 \
              WHERE NOT EXISTS (SELECT 1 FROM pgque.dead_letter_store d WHERE d.dl_owner = $3 AND d.ev_id = $5)"
        } else {
            "INSERT INTO pgque.dead_letter (dl_queue, dl_consumer, dl_owner, dl_reason, ev_id, ev_time, ev_retry, \
                                            ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 \
              WHERE $14::int8 IS NOT NULL \
                AND NOT EXISTS (SELECT 1 FROM pgque.dead_letter d WHERE d.dl_owner = $3 AND d.ev_id = $5)"
        };
        log::exec(
            c,
            sql,
            &[
                q.id.into(),
                consumer.into(),
                b.sub_id.into(),
                reason.into(),
                ev.id.into(),
                ev.time.into(),
                ev.retry.into(),
                ev.ev_type.into(),
                ev.data.into(),
                (*e1).into(),
                (*e2).into(),
                (*e3).into(),
                (*e4).into(),
                ev.txid.into(),
            ],
        );
        return 1;
    }
    let sql = if with_txid {
        "INSERT INTO pgque.retry_queue (ev_retry_after, ev_queue, ev_owner, ev_id, ev_time, ev_retry, \
                                        ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_txid) \
         VALUES (now() + $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, nullif($13, 0)::text::xid8) \
         ON CONFLICT (ev_owner, ev_id) DO NOTHING RETURNING 1"
    } else {
        "INSERT INTO pgque.retry_queue (ev_retry_after, ev_queue, ev_owner, ev_id, ev_time, ev_retry, \
                                        ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4) \
         SELECT now() + $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 WHERE $13::int8 IS NOT NULL \
         ON CONFLICT (ev_owner, ev_id) DO NOTHING RETURNING 1"
    };
    let t = log::exec(
        c,
        sql,
        &[
            (*retry_after).into(),
            q.id.into(),
            b.sub_id.into(),
            ev.id.into(),
            ev.time.into(),
            (count + 1).into(),
            ev.ev_type.into(),
            ev.data.into(),
            (*e1).into(),
            (*e2).into(),
            (*e3).into(),
            (*e4).into(),
            ev.txid.into(),
        ],
    );
    t.len() as i32
}

pub(crate) fn find_in_batch(
    c: &mut SpiClient<'_>,
    q: &Queue,
    b: &batch::Batch,
    ev_id: i64,
) -> batch::Event {
    // With its transaction id: a dead letter records it (ev_txid).
    batch::read_events_ext(
        c,
        q,
        b.sub_id,
        b.slot,
        b.prev_tick,
        b.tick,
        b.floor,
        b.ceiling,
        1,
        Some(ev_id),
        true,
    )
    .pop()
    .unwrap_or_else(|| {
        raise(
            error::UNDEFINED_OBJECT,
            format!("msg_id {ev_id} not found in batch {}", b.batch_id),
        )
    })
}

pub(crate) fn check_retry_after(iv: &Interval) {
    types::check_nonnegative_interval(iv, "retry_after");
}

/// nack(batch_id, msg, retry_after default '60 seconds', reason default NULL)
/// → 1 scheduled (or dead-lettered), 0 when already scheduled in this batch.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn nack(
    batch_id: Option<i64>,
    msg: Option<pgrx::composite_type!("pgque.message")>,
    retry_after: default!(Option<Interval>, "'60 seconds'"),
    reason: default!(Option<&str>, "NULL"),
) -> i32 {
    let msg = required(msg, "msg");
    let retry_after = required(retry_after, "retry_after");
    check_retry_after(&retry_after);
    let msg_id: i64 = required(
        msg.get_by_index(1.try_into().unwrap()).unwrap(),
        "msg.msg_id",
    );
    let msg_batch: Option<i64> = msg.get_by_index(2.try_into().unwrap()).unwrap();
    Spi::connect_mut(|c| {
        let (b, q, consumer) = batch::plain_open_batch(c, batch_id);
        if msg_batch.is_some_and(|mb| mb != b.batch_id) {
            raise(
                error::INVALID_PARAMETER_VALUE,
                format!(
                    "msg belongs to batch {}, not to batch {}",
                    msg_batch.unwrap(),
                    b.batch_id
                ),
            );
        }
        let ev = find_in_batch(c, &q, &b, msg_id);
        retry_event(c, &q, &b, &consumer, &ev, &retry_after, reason, true)
    })
}

/// PgQ: event_retry(x_batch_id, x_event_id, x_retry_time timestamptz).
#[pg_extern(name = "event_retry", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn event_retry_at(
    x_batch_id: Option<i64>,
    x_event_id: Option<i64>,
    x_retry_time: Option<TimestampWithTimeZone>,
) -> i32 {
    let ev_id = required(x_event_id, "x_event_id");
    let at = required(x_retry_time, "x_retry_time");
    if at.is_infinity() || at.is_neg_infinity() {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "x_retry_time must be finite",
        );
    }
    Spi::connect_mut(|c| {
        let t = log::exec(c, "SELECT greatest($1 - now(), interval '0')", &[at.into()]);
        let iv: Interval = log::col(&log::first_row(t).unwrap(), 1).unwrap();
        let (b, q, consumer) = batch::plain_open_batch(c, x_batch_id);
        let ev = find_in_batch(c, &q, &b, ev_id);
        retry_event(c, &q, &b, &consumer, &ev, &iv, None, false)
    })
}

fn seconds_interval(c: &mut SpiClient<'_>, secs: i32) -> Interval {
    if secs < 0 {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "retry seconds must not be negative",
        );
    }
    let t = log::exec(
        c,
        "SELECT make_interval(secs => $1)",
        &[(secs as f64).into()],
    );
    log::col(&log::first_row(t).unwrap(), 1).unwrap()
}

/// PgQ: event_retry(x_batch_id, x_event_id, x_retry_seconds int4).
#[pg_extern(name = "event_retry", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn event_retry_secs(
    x_batch_id: Option<i64>,
    x_event_id: Option<i64>,
    x_retry_seconds: Option<i32>,
) -> i32 {
    let ev_id = required(x_event_id, "x_event_id");
    let secs = required(x_retry_seconds, "x_retry_seconds");
    Spi::connect_mut(|c| {
        let iv = seconds_interval(c, secs);
        let (b, q, consumer) = batch::plain_open_batch(c, x_batch_id);
        let ev = find_in_batch(c, &q, &b, ev_id);
        retry_event(c, &q, &b, &consumer, &ev, &iv, None, false)
    })
}

/// PgQ: batch_retry(i_batch_id, i_retry_seconds) → events scheduled.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn batch_retry(i_batch_id: Option<i64>, i_retry_seconds: Option<i32>) -> i32 {
    let secs = required(i_retry_seconds, "i_retry_seconds");
    Spi::connect_mut(|c| {
        let iv = seconds_interval(c, secs);
        let (b, q, consumer) = batch::plain_open_batch(c, i_batch_id);
        let evs = batch::batch_events(c, &q, &b, false);
        evs.iter()
            .map(|ev| retry_event(c, &q, &b, &consumer, ev, &iv, None, false))
            .sum()
    })
}

fn next_batch_opened(queue: Option<&str>, consumer: Option<&str>) -> Option<(batch::Batch, Queue)> {
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue);
        let sub = log::sub_by_name(c, &q, consumer);
        let limit = crate::gucs::batch_max_events();
        batch::next_batch(c, &q, sub.id, limit).map(|o| (o.batch, q))
    })
}

/// PgQ: next_batch(x_queue_name, x_consumer_name) → batch id or NULL.
#[pg_extern(name = "next_batch", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn next_batch(x_queue_name: Option<&str>, x_consumer_name: Option<&str>) -> Option<i64> {
    next_batch_opened(x_queue_name, x_consumer_name).map(|(b, _)| b.batch_id)
}

type BatchInfoRow = (
    name!(batch_id, Option<i64>),
    name!(cur_tick_id, Option<i64>),
    name!(prev_tick_id, Option<i64>),
    name!(cur_tick_time, Option<TimestampWithTimeZone>),
    name!(prev_tick_time, Option<TimestampWithTimeZone>),
    name!(cur_tick_event_seq, Option<i64>),
    name!(prev_tick_event_seq, Option<i64>),
);

fn batch_info_row(c: &mut SpiClient<'_>, q: &Queue, b: &batch::Batch) -> BatchInfoRow {
    let t = log::exec(
        c,
        "SELECT c.tick_time, p.tick_time, c.tick_event_seq, p.tick_event_seq \
           FROM (SELECT * FROM pgque.tick WHERE tick_queue = $1 AND tick_id = $2 LIMIT 1) c, \
                (SELECT * FROM pgque.tick WHERE tick_queue = $1 AND tick_id = $3 LIMIT 1) p",
        &[q.id.into(), b.tick.into(), b.prev_tick.into()],
    );
    let r = log::first_row(t);
    let get_t = |n| {
        r.as_ref()
            .and_then(|r| log::col::<TimestampWithTimeZone>(r, n))
    };
    let get_i = |n| r.as_ref().and_then(|r| log::col::<i64>(r, n));
    (
        Some(b.batch_id),
        Some(b.tick),
        Some(b.prev_tick),
        get_t(1),
        get_t(2),
        get_i(3),
        get_i(4),
    )
}

/// PgQ: next_batch_info(x_queue_name, x_consumer_name).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn next_batch_info(
    x_queue_name: Option<&str>,
    x_consumer_name: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(batch_id, Option<i64>),
        name!(cur_tick_id, Option<i64>),
        name!(prev_tick_id, Option<i64>),
        name!(cur_tick_time, Option<TimestampWithTimeZone>),
        name!(prev_tick_time, Option<TimestampWithTimeZone>),
        name!(cur_tick_event_seq, Option<i64>),
        name!(prev_tick_event_seq, Option<i64>),
    ),
> {
    next_batch_custom(x_queue_name, x_consumer_name, None, None, None)
}

/// PgQ: next_batch_custom(x_queue_name, x_consumer_name, x_min_lag,
/// x_min_count, x_min_interval): a batch only once the conditions hold.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn next_batch_custom(
    x_queue_name: Option<&str>,
    x_consumer_name: Option<&str>,
    x_min_lag: Option<Interval>,
    x_min_count: Option<i32>,
    x_min_interval: Option<Interval>,
) -> TableIterator<
    'static,
    (
        name!(batch_id, Option<i64>),
        name!(cur_tick_id, Option<i64>),
        name!(prev_tick_id, Option<i64>),
        name!(cur_tick_time, Option<TimestampWithTimeZone>),
        name!(prev_tick_time, Option<TimestampWithTimeZone>),
        name!(cur_tick_event_seq, Option<i64>),
        name!(prev_tick_event_seq, Option<i64>),
    ),
> {
    if let Some(iv) = &x_min_lag {
        types::check_nonnegative_interval(iv, "x_min_lag");
    }
    if let Some(iv) = &x_min_interval {
        types::check_nonnegative_interval(iv, "x_min_interval");
    }
    if x_min_count.is_some_and(|n| n < 0) {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "x_min_count must not be negative",
        );
    }
    let row = Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, x_queue_name);
        let sub = log::sub_by_name(c, &q, x_consumer_name);
        if x_min_lag.is_some() || x_min_count.is_some() || x_min_interval.is_some() {
            // Conditions compare the consumer's position with the last tick.
            let t = log::exec(
                c,
                "SELECT (extract(epoch FROM now() - l.tick_time) * 1000)::float8, \
                        l.tick_event_seq - p.tick_event_seq, \
                        (extract(epoch FROM l.tick_time - p.tick_time) * 1000)::float8, \
                        EXISTS (SELECT 1 FROM pgque.batch b WHERE b.sub_id = $2 \
                                  AND NOT EXISTS (SELECT 1 FROM pgque.batch_done d WHERE d.batch_id = b.batch_id)) \
                   FROM pgque.consumer_position cp \
                   JOIN LATERAL (SELECT * FROM pgque.tick t WHERE t.tick_queue = $1 AND t.tick_id = cp.pos_tick LIMIT 1) p ON true \
                   JOIN LATERAL (SELECT * FROM pgque.tick t WHERE t.tick_queue = $1 ORDER BY t.tick_id DESC LIMIT 1) l ON true \
                  WHERE cp.sub_id = $2",
                &[q.id.into(), sub.id.into()],
            );
            if let Some(r) = log::first_row(t) {
                let lag: f64 = log::col(&r, 1).unwrap_or(0.0);
                let count: i64 = log::col(&r, 2).unwrap_or(0);
                let span: f64 = log::col(&r, 3).unwrap_or(0.0);
                let open: bool = log::col(&r, 4).unwrap_or(false);
                if !open {
                    if x_min_lag.as_ref().is_some_and(|m| lag < interval_ms(m)) {
                        return None;
                    }
                    if x_min_count.is_some_and(|m| count < m as i64) {
                        return None;
                    }
                    if x_min_interval
                        .as_ref()
                        .is_some_and(|m| span < interval_ms(m))
                    {
                        return None;
                    }
                }
            }
        }
        let limit = crate::gucs::batch_max_events();
        let b = batch::next_batch(c, &q, sub.id, limit)?.batch;
        Some(batch_info_row(c, &q, &b))
    });
    let row = row.unwrap_or((None, None, None, None, None, None, None));
    TableIterator::once(row)
}

type EventRow = (
    name!(ev_id, i64),
    name!(ev_time, TimestampWithTimeZone),
    name!(ev_txid, i64),
    name!(ev_retry, Option<i32>),
    name!(ev_type, Option<String>),
    name!(ev_data, Option<String>),
    name!(ev_extra1, Option<String>),
    name!(ev_extra2, Option<String>),
    name!(ev_extra3, Option<String>),
    name!(ev_extra4, Option<String>),
);

fn event_rows(evs: Vec<batch::Event>) -> Vec<EventRow> {
    evs.into_iter()
        .map(|e| {
            let [a, b, c, d] = e.extra.map(|x| x.map(PgText::to_string_lossy));
            let s = |x: Option<PgText>| x.map(PgText::to_string_lossy);
            (
                e.id,
                e.time,
                e.txid,
                e.retry,
                s(e.ev_type),
                s(e.data),
                a,
                b,
                c,
                d,
            )
        })
        .collect()
}

/// PgQ: get_batch_events(x_batch_id): every event of an open batch.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn get_batch_events(
    x_batch_id: Option<i64>,
) -> TableIterator<
    'static,
    (
        name!(ev_id, i64),
        name!(ev_time, TimestampWithTimeZone),
        name!(ev_txid, i64),
        name!(ev_retry, Option<i32>),
        name!(ev_type, Option<String>),
        name!(ev_data, Option<String>),
        name!(ev_extra1, Option<String>),
        name!(ev_extra2, Option<String>),
        name!(ev_extra3, Option<String>),
        name!(ev_extra4, Option<String>),
    ),
> {
    let evs = Spi::connect_mut(|c| {
        let (b, q, _) = batch::open_batch_by_id(c, x_batch_id);
        batch::batch_events(c, &q, &b, true)
    });
    TableIterator::new(event_rows(evs))
}

/// PgQ: get_batch_cursor(i_batch_id, i_cursor_name, i_quick_limit): the
/// first i_quick_limit events, and when there are more, a cursor named
/// i_cursor_name (open in the caller's transaction) over the rest.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn get_batch_cursor(
    i_batch_id: Option<i64>,
    i_cursor_name: Option<&str>,
    i_quick_limit: Option<i32>,
) -> TableIterator<
    'static,
    (
        name!(ev_id, i64),
        name!(ev_time, TimestampWithTimeZone),
        name!(ev_txid, i64),
        name!(ev_retry, Option<i32>),
        name!(ev_type, Option<String>),
        name!(ev_data, Option<String>),
        name!(ev_extra1, Option<String>),
        name!(ev_extra2, Option<String>),
        name!(ev_extra3, Option<String>),
        name!(ev_extra4, Option<String>),
    ),
> {
    // A cursor name is an identifier (quoted below, never pasted raw):
    // NAMEDATALEN - 1 bytes, and the characters of any other pgque name.
    let cursor = error::valid_name(i_cursor_name, "i_cursor_name", 63);
    let quick = required(i_quick_limit, "i_quick_limit");
    if quick < 0 {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "i_quick_limit must not be negative",
        );
    }
    error::check_return_count(quick, "i_quick_limit");
    let evs = Spi::connect_mut(|c| {
        let (b, q, _) = batch::open_batch_by_id(c, i_batch_id);
        let mut evs = batch::read_events_ext(
            c,
            &q,
            b.sub_id,
            b.slot,
            b.prev_tick,
            b.tick,
            b.floor,
            b.ceiling,
            quick as i64 + 1,
            None,
            true,
        );
        if evs.len() as i64 > quick as i64 {
            evs.truncate(quick as usize);
            let after = evs.last().map(|e| e.id).unwrap_or(b.floor);
            let prev = tick::tick_snapshot(c, q.id, b.prev_tick).unwrap();
            let cur = tick::tick_snapshot(c, q.id, b.tick).unwrap();
            let sql = format!(
                "DECLARE {} NO SCROLL CURSOR FOR \
                 SELECT ev_id, ev_time, ev_txid::text::int8 AS ev_txid, ev_retry, ev_type, ev_data, \
                        ev_extra1, ev_extra2, ev_extra3, ev_extra4 FROM {} \
                  WHERE ev_txid < pg_snapshot_xmax({p2}::pg_snapshot) \
                    AND pg_visible_in_snapshot(ev_txid, {p2}::pg_snapshot) \
                    AND NOT pg_visible_in_snapshot(ev_txid, {p1}::pg_snapshot) \
                    AND (ev_owner IS NULL OR ev_owner = {sub}) {slot} \
                    AND ev_id > {after} AND ev_id <= {ceil} ORDER BY ev_id",
                pgrx::spi::quote_identifier(cursor),
                q.parent_table(),
                slot = b
                    .slot
                    .map(|s| format!("AND {} = {}", log::slots::slot_expr(s.n), s.k))
                    .unwrap_or_default(),
                p1 = pgrx::spi::quote_literal(&prev),
                p2 = pgrx::spi::quote_literal(&cur),
                sub = b.sub_id,
                ceil = b.ceiling.unwrap_or(i64::MAX),
            );
            log::run_once(c, &sql);
        }
        evs
    });
    TableIterator::new(event_rows(evs))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one_i64(sql: &str) -> Option<i64> {
        Spi::get_one::<i64>(sql).unwrap()
    }
    fn one_i32(sql: &str) -> Option<i32> {
        Spi::get_one::<i32>(sql).unwrap()
    }

    /// Each id send_batch returns is the event of the payload at the same
    /// position (jsonb, text and keyed variants; NULL elements and a 2-D array
    /// are taken in storage order, as unnest gives them).
    #[pg_test]
    fn send_batch_ids_align_with_the_payloads() {
        Spi::run("SELECT pgque.create_queue('al')").unwrap();
        let qid = one_i32("SELECT queue_id FROM pgque.queue WHERE queue_name = 'al'").unwrap();
        let read = format!("SELECT ev_data, ev_extra1 FROM pgque.event_{qid} WHERE ev_id = $1");
        let cases = [
            ("SELECT pgque.send_batch('al', ARRAY['{\"n\": 1}', NULL, '{\"n\": 3}']::jsonb[])",
             vec![Some("{\"n\": 1}"), None, Some("{\"n\": 3}")], vec![None, None, None]),
            ("SELECT pgque.send_batch('al', 't', ARRAY[['a', 'b'], ['c', NULL]]::text[])",
             vec![Some("a"), Some("b"), Some("c"), None], vec![None, None, None, None]),
            ("SELECT pgque.send_batch('al', 't', ARRAY['x', 'y', 'z']::text[], ARRAY['k1', NULL, 'k3'])",
             vec![Some("x"), Some("y"), Some("z")], vec![Some("k1"), None, Some("k3")]),
            ("SELECT pgque.send_batch('al', 't', ARRAY['[1]', '\"s\"']::jsonb[], ARRAY['j1', 'j2'])",
             vec![Some("[1]"), Some("\"s\"")], vec![Some("j1"), Some("j2")]),
        ];
        for (sql, payloads, keys) in cases {
            let ids = Spi::get_one::<Vec<i64>>(sql).unwrap().unwrap();
            assert_eq!(ids.len(), payloads.len(), "{sql}");
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "{sql}: {ids:?}");
            for (i, id) in ids.iter().enumerate() {
                let row = Spi::get_two_with_args::<String, String>(&read, &[(*id).into()]).unwrap();
                assert_eq!(row.0.as_deref(), payloads[i], "{sql}: position {i}");
                assert_eq!(row.1.as_deref(), keys[i], "{sql}: position {i}");
            }
        }
    }

    #[pg_test]
    fn create_subscribe_and_send_in_one_transaction() {
        assert_eq!(one_i32("SELECT pgque.create_queue('t1')"), Some(1));
        assert_eq!(one_i32("SELECT pgque.create_queue('t1')"), Some(0));
        assert_eq!(one_i32("SELECT pgque.subscribe('t1', 'c')"), Some(1));
        assert_eq!(one_i32("SELECT pgque.subscribe('t1', 'c')"), Some(0));
        let a = one_i64("SELECT pgque.send('t1', 'x'::text)").unwrap();
        let b = one_i64("SELECT pgque.send('t1', '{\"k\": 1}'::jsonb)").unwrap();
        assert_eq!(b, a + 1);
        let ids =
            Spi::get_one::<Vec<i64>>("SELECT pgque.send_batch('t1', 'ty', ARRAY['p', 'q', 'r'])")
                .unwrap()
                .unwrap();
        assert_eq!(ids, vec![b + 1, b + 2, b + 3]);
        let empty = Spi::get_one::<Vec<i64>>("SELECT pgque.send_batch('t1', ARRAY[]::text[])")
            .unwrap()
            .unwrap();
        assert!(empty.is_empty());
        // Five event ids taken since the queue's first tick.
        assert_eq!(
            one_i64("SELECT ev_new FROM pgque.get_queue_info('t1')"),
            Some(5)
        );
        assert_eq!(
            one_i64("SELECT count(*) FROM pgque.get_consumer_info('t1')"),
            Some(1)
        );
    }

    #[pg_test]
    fn ticker_ticks_queues_with_new_events_only() {
        Spi::run("SELECT pgque.create_queue('t2')").unwrap();
        // Nothing new since create_queue's tick: no tick.
        assert_eq!(one_i64("SELECT pgque.ticker('t2')"), None);
        Spi::run("SELECT pgque.send('t2', 'x'::text)").unwrap();
        let t = one_i64("SELECT pgque.ticker('t2')").unwrap();
        // Paused queues are ticked only by force.
        Spi::run("SELECT pgque.set_queue_config('t2', 'ticker_paused', 'true')").unwrap();
        Spi::run("SELECT pgque.send('t2', 'y'::text)").unwrap();
        assert_eq!(one_i64("SELECT pgque.ticker('t2')"), None);
        let f = one_i64("SELECT pgque.force_tick('t2')").unwrap();
        assert!(f > t);
        assert_eq!(
            one_i64("SELECT last_tick_id FROM pgque.get_queue_info('t2')"),
            Some(f)
        );
    }

    #[pg_test]
    fn set_queue_config_sets_and_null_resets() {
        Spi::run("SELECT pgque.create_queue('t3')").unwrap();
        Spi::run("SELECT pgque.set_queue_config('t3', 'ticker_max_count', '42')").unwrap();
        Spi::run("SELECT pgque.set_queue_config('t3', 'queue_ticker_max_lag', '250ms')").unwrap();
        Spi::run("SELECT pgque.set_queue_config('t3', 'rotation_period', '10 minutes')").unwrap();
        assert_eq!(
            one_i32("SELECT queue_ticker_max_count FROM pgque.get_queue_info('t3')"),
            Some(42)
        );
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT queue_ticker_max_lag = interval '250 ms' AND queue_rotation_period = interval '10 min' \
                   FROM pgque.get_queue_info('t3')"
            )
            .unwrap(),
            Some(true)
        );
        Spi::run("SELECT pgque.set_queue_config('t3', 'ticker_max_count', NULL)").unwrap();
        Spi::run("SELECT pgque.set_queue_config('t3', 'rotation_period', NULL)").unwrap();
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT queue_ticker_max_count = 500 AND queue_rotation_period = interval '2 hours' \
                   FROM pgque.get_queue_info('t3')"
            )
            .unwrap(),
            Some(true)
        );
    }

    #[pg_test(error = "queue not found: \"nope\"")]
    fn unknown_queue_is_an_error() {
        Spi::run("SELECT pgque.send('nope', 'x'::text)").unwrap();
    }

    #[pg_test(error = "consumer \"a#b\" must not contain '#'")]
    fn hash_in_a_plain_consumer_name_is_refused() {
        Spi::run("SELECT pgque.create_queue('t4')").unwrap();
        Spi::run("SELECT pgque.subscribe('t4', 'a#b')").unwrap();
    }

    #[pg_test]
    fn maint_and_drop_queue() {
        Spi::run("SELECT pgque.create_queue('t5')").unwrap();
        assert!(one_i32("SELECT pgque.maint()").unwrap() >= 0);
        assert!(one_i64("SELECT count(*) FROM pgque.maint_operations()").unwrap() >= 3);
        let qid = one_i32("SELECT queue_id FROM pgque.queue WHERE queue_name = 't5'").unwrap();
        let table = format!("SELECT to_regclass('pgque.event_{qid}_0') IS NULL");
        assert_eq!(Spi::get_one::<bool>(&table).unwrap(), Some(false));
        assert_eq!(one_i32("SELECT pgque.drop_queue('t5')"), Some(1));
        assert_eq!(Spi::get_one::<bool>(&table).unwrap(), Some(true));
        assert_eq!(
            one_i64("SELECT count(*) FROM pgque.get_queue_info()"),
            Some(0)
        );
    }
}
