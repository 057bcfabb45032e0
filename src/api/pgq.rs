//! PgQ's batch primitives: next_batch and its info/custom variants,
//! get_batch_events and get_batch_cursor, for PgQ-style consumers.
#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
use crate::datum::interval_ms;
use crate::error::{self, raise, required};
use crate::log::events::PgText;
use crate::log::{self, batch, tick, Queue};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

fn next_batch_opened(queue: Option<&str>, consumer: Option<&str>) -> Option<(batch::Batch, Queue)> {
    Spi::connect_mut(|c| {
        let limit = crate::gucs::batch_max_events();
        let (q, opened) = log::look::plain_next(c, queue, consumer, limit);
        opened.map(|o| (o.batch, q))
    })
}

/// PgQ: next_batch(x_queue_name, x_consumer_name) → batch id or NULL.
#[pg_extern(name = "next_batch", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn next_batch(x_queue_name: Option<&str>, x_consumer_name: Option<&str>) -> Option<i64> {
    next_batch_opened(x_queue_name, x_consumer_name).map(|(b, _)| b.batch_id)
}

/// next_batch_wait(queue_name, consumer_name, wait) → batch id or NULL:
/// PgQ's next_batch that waits inside the server, for at most `wait`
/// (capped by pgque.max_wait), for the consumer's next batch (as the
/// waiting receive: docs/waits.md). While it waits, ticks without events
/// for the consumer are passed over; at the end of the wait it is
/// next_batch, which returns such a tick as an empty batch, as PgQ's does.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn next_batch_wait(
    queue_name: Option<&str>,
    consumer_name: Option<&str>,
    wait: Option<Interval>,
) -> Option<i64> {
    use crate::waiters::{self, Key, Look};
    let wait = waiters::wait_arg(wait);
    let untick = std::cell::Cell::new(false);
    waiters::wait_for(
        wait,
        || {
            Spi::connect_mut(|c| {
                let limit = crate::gucs::batch_max_events();
                let (q, opened, ids) = log::look::waiting_next(c, queue_name, consumer_name, limit);
                untick.set(ids);
                match opened {
                    Some(o) => Look::Found(o.batch.batch_id),
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
    .or_else(|| next_batch_opened(queue_name, consumer_name).map(|(b, _)| b.batch_id))
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
        crate::datum::check_nonnegative_interval(iv, "x_min_lag");
    }
    if let Some(iv) = &x_min_interval {
        crate::datum::check_nonnegative_interval(iv, "x_min_interval");
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

fn event_rows(evs: Vec<crate::log::events::Event>) -> Vec<EventRow> {
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
        let mut evs = batch::read_batch(c, &q, &b, quick as i64 + 1, None, true);
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
                    .map(|s| format!("AND {} = {}", crate::log::slot::slot_expr(s.n), s.k))
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
