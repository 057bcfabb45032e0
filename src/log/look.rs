//! A plain consumer's first look at its queue, in one statement: the queue,
//! the subscription, its latest batch and whether a newer tick exists.
//!
//! receive (and PgQ's next_batch) used to find these with four statements
//! (queue, subscription, latest batch, next range). A consumer that is
//! caught up -- the receive after every ack, every idle poll -- stops
//! there, so that was the whole call: about a fifth of the server's CPU per
//! batch at a steady 500 events/s (benches/results/cpu.md). One statement
//! answers it now; only a call that finds something goes on to the locked
//! path of batch.rs (which looks again under the subscription's lock).
use super::batch::{self, Batch, Opened};
use super::queue::{queue_by_name, sub_by_name, Queue};
use super::slot::Slot;
use super::spi::{col, exec, first_row};
use crate::error;
use pgrx::spi::SpiClient;

/// Columns 1-5 the queue (as find_queue), 6 the subscription, 7-13 the
/// latest batch (as batch.rs's BATCH_COLS, with its done flag as a scalar
/// subquery for the same reason), 14 whether the queue has a tick after it
/// (after the subscription's start tick when it has no batch yet), then
/// `$extra` columns.
macro_rules! look_sql {
    ($extra:expr, $joins:expr) => {
        concat!(
            "SELECT q.queue_id, q.queue_cur_table, q.queue_ntables, q.queue_max_retries, \
        q.queue_event_seq::pg_catalog.oid, s.sub_id, \
        b.batch_id, b.member_id, b.prev_tick_id, b.tick_id, b.ev_floor, b.ev_ceiling, b.done, \
        (SELECT true FROM pgque.tick t WHERE t.tick_queue = q.queue_id \
            AND t.tick_id > coalesce(b.tick_id, s.sub_start_tick) LIMIT 1) IS NOT NULL",
            $extra,
            " FROM pgque.queue q \
   LEFT JOIN pgque.subscription s \
     ON s.sub_queue = q.queue_id AND s.sub_parent IS NULL AND s.sub_consumer = $2 \
   LEFT JOIN LATERAL ( \
        SELECT b.batch_id, b.member_id, b.prev_tick_id, b.tick_id, b.ev_floor, b.ev_ceiling, \
               (SELECT true FROM pgque.batch_done d WHERE d.batch_id = b.batch_id LIMIT 1) IS NOT NULL \
                 AS done \
          FROM pgque.batch b WHERE b.sub_id = s.sub_id \
         ORDER BY b.tick_id DESC, b.ev_floor DESC, b.batch_id DESC LIMIT 1) b ON true",
            $joins,
            " WHERE q.queue_name OPERATOR(pg_catalog.=) $1"
        )
    };
}

const LOOK_SQL: &str = look_sql!("", "");

/// LOOK_SQL for the waiting forms, with 15 whether the latest tick's event
/// sequence is past the consumer's frontier tick's, 16 whether that
/// frontier tick is pending (events taken before it may still show in a
/// later tick's range), 17 whether the queue's sequence has moved past its
/// latest tick (ids no tick covers: the waiter asks for a tick). A newer
/// tick whose sequence has not moved, after a frontier that is not
/// pending, has no event for the consumer: a waiting look skips it with
/// no further statement.
const LOOK_WAIT_SQL: &str = look_sql!(
    ", lt.seq > (SELECT f.tick_event_seq FROM pgque.tick f WHERE f.tick_queue = q.queue_id \
                 AND f.tick_id = coalesce(b.tick_id, s.sub_start_tick)), \
     (SELECT f.tick_pending IS NOT NULL FROM pgque.tick f WHERE f.tick_queue = q.queue_id \
                 AND f.tick_id = coalesce(b.tick_id, s.sub_start_tick)), \
     coalesce(pg_catalog.pg_sequence_last_value(q.queue_event_seq) > lt.seq, false)",
    " LEFT JOIN LATERAL ( \
        SELECT t.tick_event_seq AS seq FROM pgque.tick t WHERE t.tick_queue = q.queue_id \
         ORDER BY t.tick_id DESC LIMIT 1) lt ON true"
);

/// Whether `name` passes valid_consumer (without raising).
fn consumer_ok(name: Option<&str>) -> bool {
    name.is_some_and(|n| error::check_name(n, error::MAX_CONSUMER_NAME).is_ok() && !n.contains('#'))
}

/// The consumer's open batch, or its next batch opened (at most `limit`
/// events), for `receive` and PgQ's `next_batch`: returns the queue and
/// the batch (None: nothing new). Errors as queue_by_name and sub_by_name
/// (checked in that order). A consumer with nothing new costs one
/// read-only statement: no lock, no transaction id, no write.
pub fn plain_next(
    c: &mut SpiClient<'_>,
    queue_name: Option<&str>,
    consumer: Option<&str>,
    limit: i64,
) -> (Queue, Option<Opened>) {
    let (q, opened, _) = look_next(c, queue_name, consumer, limit, false);
    (q, opened)
}

/// plain_next for the waiting forms: newer ticks without events for the
/// consumer are nothing new either (read over instead of opened: opening
/// and finishing an empty batch takes an xid, which ends a wait; the
/// consumer moves past them with its next batch, or with the plain look
/// that ends the wait). Returns also whether the queue has event ids no
/// tick covers yet (the waiter asks for a tick).
pub fn waiting_next(
    c: &mut SpiClient<'_>,
    queue_name: Option<&str>,
    consumer: Option<&str>,
    limit: i64,
) -> (Queue, Option<Opened>, bool) {
    look_next(c, queue_name, consumer, limit, true)
}

fn look_next(
    c: &mut SpiClient<'_>,
    queue_name: Option<&str>,
    consumer: Option<&str>,
    limit: i64,
    waiting: bool,
) -> (Queue, Option<Opened>, bool) {
    let qname = error::valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    // The statement-by-statement path, which raises the errors of a bad
    // consumer name, an unknown queue or consumer in their usual order (or
    // finds what a concurrent commit created after the look).
    let slow = |c: &mut SpiClient<'_>| {
        let q = queue_by_name(c, queue_name);
        let sub = sub_by_name(c, &q, consumer);
        let opened = batch::next_batch(c, &q, sub.id, limit);
        (q, opened, false)
    };
    let Some(cname) = consumer.filter(|_| consumer_ok(consumer)) else {
        return slow(c);
    };
    let sql = if waiting { LOOK_WAIT_SQL } else { LOOK_SQL };
    let t = exec(c, sql, &[qname.into(), cname.into()]);
    let Some(r) = first_row(t) else {
        return slow(c);
    };
    let q = Queue {
        id: col(&r, 1).unwrap(),
        name: qname.to_string(),
        cur_table: col(&r, 2).unwrap(),
        ntables: col(&r, 3).unwrap(),
        max_retries: col(&r, 4).unwrap(),
        seq: col(&r, 5).unwrap(),
    };
    let Some(sub_id) = col::<i32>(&r, 6) else {
        return slow(c);
    };
    let latest = col::<i64>(&r, 7).map(|batch_id| Batch {
        batch_id,
        sub_id,
        member_id: col(&r, 8),
        prev_tick: col(&r, 9).unwrap(),
        tick: col(&r, 10).unwrap(),
        floor: col(&r, 11).unwrap(),
        ceiling: col(&r, 12),
        done: col(&r, 13).unwrap(),
        slot: None,
    });
    let newer: bool = col(&r, 14).unwrap();
    let (seq_moved, frontier_pending, untick) = if waiting {
        (
            col::<bool>(&r, 15),
            col::<bool>(&r, 16),
            col::<bool>(&r, 17).unwrap_or(false),
        )
    } else {
        (None, None, false)
    };
    match latest {
        Some(b) if !b.done => {
            return (
                q,
                Some(Opened {
                    batch: b,
                    events: None,
                }),
                untick,
            )
        }
        // finished, not a cut with more above it, no newer tick: caught up
        Some(b) if b.ceiling.is_none() && !newer => return (q, None, untick),
        // a new subscription with no tick after its start: nothing yet (its
        // first batch is the range up to the first tick after the start)
        None if !newer => return (q, None, untick),
        _ => {}
    }
    if waiting && latest.as_ref().is_none_or(|b| b.ceiling.is_none()) {
        match (seq_moved, frontier_pending) {
            // no id taken since the frontier, which saw every earlier one
            (Some(false), Some(false)) => return (q, None, untick),
            // ids taken (their senders may have rolled back), a pending
            // frontier, or a tick row gone: read the range
            _ => {
                let from = latest
                    .as_ref()
                    .map_or_else(|| batch::start_tick(c, sub_id), |b| b.tick);
                if !has_events_after(c, &q, sub_id, None, from, None) {
                    return (q, None, untick);
                }
            }
        }
    }
    let opened = batch::next_batch_locked(c, &q, sub_id, None, limit, &mut |_| None);
    (q, opened, untick)
}

/// Whether the queue has an event between tick `from` and its latest tick
/// (no further than tick `cap`) for subscription `sub_id` (of partition
/// slot `slot`): read-only, so a waiting consumer skips the empty ticks (a
/// pending tick's follow-up, an idle tick, a rolled-back send's; for a
/// slot, ticks with nothing of its keys) without opening and finishing an
/// empty batch, which would take a transaction id and end its wait.
pub fn has_events_after(
    c: &mut SpiClient<'_>,
    q: &Queue,
    sub_id: i32,
    slot: Option<Slot>,
    from: i64,
    cap: Option<i64>,
) -> bool {
    let t = exec(
        c,
        "SELECT tick_id FROM pgque.tick WHERE tick_queue = $1 ORDER BY tick_id DESC LIMIT 1",
        &[q.id.into()],
    );
    let Some(last) = first_row(t).and_then(|r| col::<i64>(&r, 1)) else {
        return false;
    };
    let to = cap.map_or(last, |c| c.min(last));
    to > from && !batch::read_events(c, q, sub_id, slot, from, to, 0, None, 1, None).is_empty()
}
