//! Consuming events: subscribing consumers, receive and ack, and giving
//! events back (nack, event_retry, batch_retry).
#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
use super::srf::{Messages, MessagesWithHeaders};
use crate::datum;
use crate::error::{self, raise, required};
use crate::log::{self, batch, Queue};
use crate::waiters::{self, Key, Look};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

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
) -> Option<(i64, Vec<crate::log::events::Event>)> {
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
    Messages::new(receive_batch(queue_name, consumer, max_return))
}

/// receive_with_headers(queue_name, consumer, max_return default 100) →
/// receive's rows with the events' trace-context headers as a last column
/// (`headers jsonb`, NULL for an event sent without). The same batch as
/// receive: the two may be mixed for one consumer.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn receive_with_headers(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    max_return: default!(Option<i32>, 100),
) -> MessagesWithHeaders {
    MessagesWithHeaders(Messages::new(receive_batch(
        queue_name, consumer, max_return,
    )))
}

/// receive(queue_name, consumer, max_return, wait) → setof pgque.message:
/// receive that waits inside the server, for at most `wait` (capped by
/// pgque.max_wait), until the consumer has a batch; empty at the end of the
/// wait. Woken by the tick that covers a producer's commit, which a waiting
/// consumer asks for at once (docs/waits.md). Returns at once, as receive,
/// in a transaction that has written or in REPEATABLE READ / SERIALIZABLE.
#[pg_extern(name = "receive", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn receive_wait(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    max_return: Option<i32>,
    wait: Option<Interval>,
) -> Messages {
    Messages::new(receive_batch_waiting(
        queue_name, consumer, max_return, wait,
    ))
}

/// receive_with_headers(queue_name, consumer, max_return, wait): the
/// waiting receive with the events' headers as a last column.
#[pg_extern(name = "receive_with_headers", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn receive_with_headers_wait(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    max_return: Option<i32>,
    wait: Option<Interval>,
) -> MessagesWithHeaders {
    MessagesWithHeaders(Messages::new(receive_batch_waiting(
        queue_name, consumer, max_return, wait,
    )))
}

/// What the waiting receive returns: receive_batch's batch, waited for.
/// When it starts to sleep on a queue with event ids no tick covers yet (a
/// producer committed within the worker's coalescing window, before this
/// consumer waited), it asks the worker for a tick now.
fn receive_batch_waiting(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    max_return: Option<i32>,
    wait: Option<Interval>,
) -> Option<(i64, Vec<crate::log::events::Event>)> {
    let limit = max_return_arg(max_return);
    let wait = waiters::wait_arg(wait);
    let untick = std::cell::Cell::new(false);
    waiters::wait_for(
        wait,
        || {
            Spi::connect_mut(|c| {
                let (q, opened, ids) = log::look::waiting_next(c, queue_name, consumer, limit);
                untick.set(ids);
                match deliver(c, &q, opened) {
                    Some(b) => Look::Found(b),
                    None => Look::Wait(vec![Key::Events(q.id)]),
                }
            })
        },
        |_| {
            if untick.get() {
                crate::wake::demand_tick_now();
            }
        },
    )
    // the end of the wait: the plain look, which moves past empty ticks
    .or_else(|| receive_batch(queue_name, consumer, max_return))
}

/// What receive returns: the consumer's open or next batch and its events.
fn receive_batch(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    max_return: Option<i32>,
) -> Option<(i64, Vec<crate::log::events::Event>)> {
    let limit = max_return_arg(max_return);
    Spi::connect_mut(|c| {
        let (q, opened) = log::look::plain_next(c, queue_name, consumer, limit);
        deliver(c, &q, opened)
    })
}

/// ack(batch_id) → 1: finishes the batch; 0 (and a WARNING) when the batch
/// is unknown or already finished, as PgQue's ack.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn ack(batch_id: Option<i64>) -> i32 {
    Spi::connect_mut(|c| batch::finish(c, batch_id))
}

/// ack_receive(batch_id, max_return default 100) → setof pgque.message: ack
/// of batch_id and receive for its consumer, in one call (one round trip
/// and one commit per batch for a consumer that keeps up; it does not wait:
/// the ack takes an xid). A batch already finished is only received after
/// (with ack's WARNING); an unknown batch is 42704, a partition slot's 55000
/// (ack_partitioned checks the lease). Touches what ack and receive touch.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn ack_receive(batch_id: Option<i64>, max_return: default!(Option<i32>, 100)) -> Messages {
    let id = required(batch_id, "batch_id");
    let limit = max_return_arg(max_return);
    Messages::new(Spi::connect_mut(|c| {
        let Some((b, q, consumer)) = batch::batch_by_id(c, id) else {
            raise(error::UNDEFINED_OBJECT, format!("batch {id} not found"))
        };
        if b.member_id.is_some() {
            raise(
                error::WRONG_STATE,
                format!("batch {id} belongs to a cooperative consumer's member of {consumer:?}: use ack and receive_coop"),
            );
        }
        // (a partition slot's batch: finish raises 55000)
        batch::finish(c, Some(id));
        let (q, opened) = log::look::plain_next(c, Some(&q.name), Some(&consumer), limit);
        deliver(c, &q, opened)
    }))
}

/// PgQ: finish_batch(x_batch_id).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn finish_batch(x_batch_id: Option<i64>) -> i32 {
    Spi::connect_mut(|c| batch::finish(c, x_batch_id))
}

pub(crate) fn find_in_batch(
    c: &mut SpiClient<'_>,
    q: &Queue,
    b: &batch::Batch,
    ev_id: i64,
) -> crate::log::events::Event {
    // With its transaction id: a dead letter records it (ev_txid).
    batch::read_batch(c, q, b, 1, Some(ev_id), true)
        .pop()
        .unwrap_or_else(|| {
            raise(
                error::UNDEFINED_OBJECT,
                format!("msg_id {ev_id} not found in batch {}", b.batch_id),
            )
        })
}

pub(crate) fn check_retry_after(iv: &Interval) {
    datum::check_nonnegative_interval(iv, "retry_after");
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
        log::retry::retry_event(c, &q, &b, &consumer, &ev, &retry_after, reason, true)
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
        log::retry::retry_event(c, &q, &b, &consumer, &ev, &iv, None, false)
    })
}

/// `secs` seconds as an interval (22023 when negative).
pub(crate) fn seconds_interval(c: &mut SpiClient<'_>, secs: i32) -> Interval {
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
        log::retry::retry_event(c, &q, &b, &consumer, &ev, &iv, None, false)
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
            .map(|ev| log::retry::retry_event(c, &q, &b, &consumer, ev, &iv, None, false))
            .sum()
    })
}
