#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
//! Observability with PgQ's column names: get_queue_info, get_consumer_info,
//! get_batch_info.
use crate::error::{self, raise, required};
use crate::log;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;

type QueueInfo = (
    name!(queue_name, String),
    name!(queue_ntables, i32),
    name!(queue_cur_table, i32),
    name!(queue_rotation_period, Interval),
    name!(queue_switch_time, TimestampWithTimeZone),
    name!(queue_external_ticker, bool),
    name!(queue_ticker_paused, bool),
    name!(queue_ticker_max_count, i32),
    name!(queue_ticker_max_lag, Interval),
    name!(queue_ticker_idle_period, Interval),
    name!(ticker_lag, Option<Interval>),
    name!(ev_per_sec, Option<f64>),
    name!(ev_new, Option<i64>),
    name!(last_tick_id, Option<i64>),
);

fn queue_info(name: Option<&str>) -> Vec<QueueInfo> {
    Spi::connect_mut(|c| {
        if name.is_some() {
            log::queue_by_name(c, name);
        }
        let t = log::exec(
            c,
            "SELECT q.queue_name, q.queue_ntables, q.queue_cur_table, q.queue_rotation_period, \
                    q.queue_switch_time, false, q.queue_ticker_paused, q.queue_ticker_max_count, \
                    q.queue_ticker_max_lag, q.queue_ticker_idle_period, now() - t.tick_time, \
                    CASE WHEN f.tick_time < t.tick_time THEN \
                      ((t.tick_event_seq - f.tick_event_seq) / extract(epoch FROM t.tick_time - f.tick_time))::float8 END, \
                    coalesce(pg_sequence_last_value(q.queue_event_seq::regclass), 0) - t.tick_event_seq, \
                    t.tick_id \
               FROM pgque.queue q \
               LEFT JOIN LATERAL (SELECT * FROM pgque.tick x WHERE x.tick_queue = q.queue_id \
                                  ORDER BY x.tick_id DESC LIMIT 1) t ON true \
               LEFT JOIN LATERAL (SELECT * FROM pgque.tick x WHERE x.tick_queue = q.queue_id \
                                  ORDER BY x.tick_id LIMIT 1) f ON true \
              WHERE ($1::text IS NULL OR q.queue_name = $1) \
              ORDER BY q.queue_name",
            &[name.into()],
        );
        t.map(|r| {
            (
                log::col(&r, 1).unwrap(),
                log::col(&r, 2).unwrap(),
                log::col(&r, 3).unwrap(),
                log::col(&r, 4).unwrap(),
                log::col(&r, 5).unwrap(),
                log::col(&r, 6).unwrap(),
                log::col(&r, 7).unwrap(),
                log::col(&r, 8).unwrap(),
                log::col(&r, 9).unwrap(),
                log::col(&r, 10).unwrap(),
                log::col(&r, 11),
                log::col(&r, 12),
                log::col(&r, 13),
                log::col(&r, 14),
            )
        })
        .collect()
    })
}

/// get_queue_info(): one row per queue.
#[pg_extern(name = "get_queue_info", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn get_queue_info_all() -> TableIterator<
    'static,
    (
        name!(queue_name, String),
        name!(queue_ntables, i32),
        name!(queue_cur_table, i32),
        name!(queue_rotation_period, Interval),
        name!(queue_switch_time, TimestampWithTimeZone),
        name!(queue_external_ticker, bool),
        name!(queue_ticker_paused, bool),
        name!(queue_ticker_max_count, i32),
        name!(queue_ticker_max_lag, Interval),
        name!(queue_ticker_idle_period, Interval),
        name!(ticker_lag, Option<Interval>),
        name!(ev_per_sec, Option<f64>),
        name!(ev_new, Option<i64>),
        name!(last_tick_id, Option<i64>),
    ),
> {
    TableIterator::new(queue_info(None))
}

/// get_queue_info(queue_name).
#[pg_extern(name = "get_queue_info", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn get_queue_info_one(
    queue_name: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(queue_name, String),
        name!(queue_ntables, i32),
        name!(queue_cur_table, i32),
        name!(queue_rotation_period, Interval),
        name!(queue_switch_time, TimestampWithTimeZone),
        name!(queue_external_ticker, bool),
        name!(queue_ticker_paused, bool),
        name!(queue_ticker_max_count, i32),
        name!(queue_ticker_max_lag, Interval),
        name!(queue_ticker_idle_period, Interval),
        name!(ticker_lag, Option<Interval>),
        name!(ev_per_sec, Option<f64>),
        name!(ev_new, Option<i64>),
        name!(last_tick_id, Option<i64>),
    ),
> {
    let n = required(queue_name, "queue_name");
    TableIterator::new(queue_info(Some(n)))
}

type ConsumerInfo = (
    name!(queue_name, String),
    name!(consumer_name, String),
    name!(lag, Option<Interval>),
    name!(last_seen, Option<Interval>),
    name!(last_tick, Option<i64>),
    name!(current_batch, Option<i64>),
    name!(next_tick, Option<i64>),
    name!(pending_events, Option<i64>),
);

fn consumer_info(queue: Option<&str>, consumer: Option<&str>) -> Vec<ConsumerInfo> {
    Spi::connect_mut(|c| {
        if queue.is_some() {
            let q = log::queue_by_name(c, queue);
            if consumer.is_some() {
                log::sub_by_name(c, &q, consumer);
            }
        }
        let t = log::exec(
            c,
            "SELECT q.queue_name, p.sub_consumer, now() - pt.tick_time, \
                    now() - coalesce(lb.opened_at, s.sub_created_at), p.pos_tick, \
                    ob.batch_id, ob.tick_id, \
                    coalesce(pg_sequence_last_value(q.queue_event_seq::regclass), 0) - pt.tick_event_seq \
               FROM pgque.consumer_position p \
               JOIN pgque.subscription s ON s.sub_id = p.sub_id \
               JOIN pgque.queue q ON q.queue_id = p.sub_queue \
               LEFT JOIN LATERAL (SELECT * FROM pgque.tick t WHERE t.tick_queue = q.queue_id \
                                   AND t.tick_id = p.pos_tick LIMIT 1) pt ON true \
               LEFT JOIN LATERAL (SELECT * FROM pgque.batch b WHERE b.sub_id = p.sub_id \
                                  ORDER BY b.batch_id DESC LIMIT 1) lb ON true \
               LEFT JOIN LATERAL (SELECT b.batch_id, b.tick_id FROM pgque.batch b WHERE b.sub_id = p.sub_id \
                                    AND NOT EXISTS (SELECT 1 FROM pgque.batch_done d WHERE d.batch_id = b.batch_id) \
                                  ORDER BY b.batch_id LIMIT 1) ob ON true \
              WHERE ($1::text IS NULL OR q.queue_name = $1) AND ($2::text IS NULL OR p.sub_consumer = $2) \
              ORDER BY q.queue_name, p.sub_consumer",
            &[queue.into(), consumer.into()],
        );
        t.map(|r| {
            (
                log::col(&r, 1).unwrap(),
                log::col(&r, 2).unwrap(),
                log::col(&r, 3),
                log::col(&r, 4),
                log::col(&r, 5),
                log::col(&r, 6),
                log::col(&r, 7),
                log::col(&r, 8),
            )
        })
        .collect()
    })
}

/// get_consumer_info(): every consumer of every queue.
#[pg_extern(name = "get_consumer_info", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn get_consumer_info_all() -> TableIterator<
    'static,
    (
        name!(queue_name, String),
        name!(consumer_name, String),
        name!(lag, Option<Interval>),
        name!(last_seen, Option<Interval>),
        name!(last_tick, Option<i64>),
        name!(current_batch, Option<i64>),
        name!(next_tick, Option<i64>),
        name!(pending_events, Option<i64>),
    ),
> {
    TableIterator::new(consumer_info(None, None))
}

/// get_consumer_info(queue_name).
#[pg_extern(name = "get_consumer_info", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn get_consumer_info_queue(
    queue_name: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(queue_name, String),
        name!(consumer_name, String),
        name!(lag, Option<Interval>),
        name!(last_seen, Option<Interval>),
        name!(last_tick, Option<i64>),
        name!(current_batch, Option<i64>),
        name!(next_tick, Option<i64>),
        name!(pending_events, Option<i64>),
    ),
> {
    let q = required(queue_name, "queue_name");
    TableIterator::new(consumer_info(Some(q), None))
}

/// get_consumer_info(queue_name, consumer).
#[pg_extern(name = "get_consumer_info", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn get_consumer_info_one(
    queue_name: Option<&str>,
    consumer: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(queue_name, String),
        name!(consumer_name, String),
        name!(lag, Option<Interval>),
        name!(last_seen, Option<Interval>),
        name!(last_tick, Option<i64>),
        name!(current_batch, Option<i64>),
        name!(next_tick, Option<i64>),
        name!(pending_events, Option<i64>),
    ),
> {
    let q = required(queue_name, "queue_name");
    let cn = required(consumer, "consumer");
    TableIterator::new(consumer_info(Some(q), Some(cn)))
}

/// get_batch_info(batch_id).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn get_batch_info(
    batch_id: Option<i64>,
) -> TableIterator<
    'static,
    (
        name!(queue_name, String),
        name!(consumer_name, String),
        name!(batch_start, Option<TimestampWithTimeZone>),
        name!(batch_end, Option<TimestampWithTimeZone>),
        name!(prev_tick_id, i64),
        name!(tick_id, i64),
        name!(lag, Option<Interval>),
        name!(seq_start, Option<i64>),
        name!(seq_end, Option<i64>),
    ),
> {
    let id = required(batch_id, "batch_id");
    let row = Spi::connect_mut(|c| {
        let t = log::exec(
            c,
            "SELECT q.queue_name, s.sub_consumer, pt.tick_time, ct.tick_time, b.prev_tick_id, b.tick_id, \
                    now() - ct.tick_time, pt.tick_event_seq, ct.tick_event_seq \
               FROM pgque.batch b \
               JOIN pgque.subscription s ON s.sub_id = b.sub_id \
               JOIN pgque.queue q ON q.queue_id = s.sub_queue \
               LEFT JOIN LATERAL (SELECT * FROM pgque.tick t WHERE t.tick_queue = q.queue_id \
                                   AND t.tick_id = b.prev_tick_id LIMIT 1) pt ON true \
               LEFT JOIN LATERAL (SELECT * FROM pgque.tick t WHERE t.tick_queue = q.queue_id \
                                   AND t.tick_id = b.tick_id LIMIT 1) ct ON true \
              WHERE b.batch_id = $1 LIMIT 1",
            &[id.into()],
        );
        let Some(r) = log::first_row(t) else {
            raise(error::UNDEFINED_OBJECT, format!("batch not found: {id}"));
        };
        (
            log::col(&r, 1).unwrap(),
            log::col(&r, 2).unwrap(),
            log::col(&r, 3),
            log::col(&r, 4),
            log::col(&r, 5).unwrap(),
            log::col(&r, 6).unwrap(),
            log::col(&r, 7),
            log::col(&r, 8),
            log::col(&r, 9),
        )
    });
    TableIterator::once(row)
}
