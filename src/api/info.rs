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

/// The rows of get_consumer_info, PgQue's: one per consumer, and one per
/// cooperative member named `consumer.member` (PgQue names a member's
/// subscription so). A cooperative consumer's row is its shared position:
/// the tick its members' batches have reached (a member's batch moves it on
/// when it opens), with no current batch of its own; a member's row shows
/// its open batch (last_tick = the batch's start, next_tick its end,
/// pending_events from its start), all NULL but last_seen when it holds none.
/// With `consumer`, 42704 when neither a consumer nor a member has that name.
fn consumer_info(queue: Option<&str>, consumer: Option<&str>) -> Vec<ConsumerInfo> {
    Spi::connect_mut(|c| {
        if queue.is_some() {
            log::queue_by_name(c, queue);
        }
        if consumer.is_some() {
            // (a member's name has a dot, which consumer names allow)
            log::valid_consumer(consumer, "consumer");
        }
        let t = log::exec(
            c,
            "SELECT * FROM ( \
             SELECT q.queue_name, p.sub_consumer, now() - pt.tick_time AS lag, \
                    now() - coalesce(lb.opened_at, s.sub_created_at) AS last_seen, pos.tick_id AS last_tick, \
                    ob.batch_id, ob.tick_id, \
                    coalesce(pg_sequence_last_value(q.queue_event_seq::regclass), 0) - pt.tick_event_seq AS pending \
               FROM pgque.consumer_position p \
               JOIN pgque.subscription s ON s.sub_id = p.sub_id \
               JOIN pgque.queue q ON q.queue_id = p.sub_queue \
               CROSS JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM pgque.subscription m \
                                                   WHERE m.sub_parent = s.sub_id) AS coop) k \
               LEFT JOIN LATERAL (SELECT b.tick_id, b.prev_tick_id, b.ev_ceiling FROM pgque.batch b \
                                   WHERE b.sub_id = p.sub_id \
                                   ORDER BY b.tick_id DESC, b.ev_floor DESC, b.batch_id DESC LIMIT 1) fb ON k.coop \
               CROSS JOIN LATERAL (SELECT CASE WHEN NOT k.coop THEN p.pos_tick \
                                               WHEN fb.tick_id IS NULL THEN s.sub_start_tick \
                                               WHEN fb.ev_ceiling IS NULL THEN fb.tick_id \
                                               ELSE fb.prev_tick_id END AS tick_id) pos \
               LEFT JOIN LATERAL (SELECT * FROM pgque.tick t WHERE t.tick_queue = q.queue_id \
                                   AND t.tick_id = pos.tick_id LIMIT 1) pt ON true \
               LEFT JOIN LATERAL (SELECT * FROM pgque.batch b WHERE b.sub_id = p.sub_id \
                                  ORDER BY b.batch_id DESC LIMIT 1) lb ON true \
               LEFT JOIN LATERAL (SELECT b.batch_id, b.tick_id FROM pgque.batch b WHERE b.sub_id = p.sub_id \
                                    AND NOT EXISTS (SELECT 1 FROM pgque.batch_done d WHERE d.batch_id = b.batch_id) \
                                  ORDER BY b.batch_id LIMIT 1) ob ON NOT k.coop \
             UNION ALL \
             SELECT q.queue_name, s.sub_consumer || '.' || m.sub_consumer, \
                    CASE WHEN mb.open THEN now() - pt.tick_time END, \
                    now() - greatest(m.sub_active, mb.opened_at), \
                    CASE WHEN mb.open THEN mb.prev_tick_id END, \
                    CASE WHEN mb.open THEN mb.batch_id END, \
                    CASE WHEN mb.open THEN mb.tick_id END, \
                    CASE WHEN mb.open THEN \
                      coalesce(pg_sequence_last_value(q.queue_event_seq::regclass), 0) - pt.tick_event_seq END \
               FROM pgque.subscription m \
               JOIN pgque.subscription s ON s.sub_id = m.sub_parent \
               JOIN pgque.queue q ON q.queue_id = s.sub_queue \
               LEFT JOIN LATERAL (SELECT b.batch_id, b.prev_tick_id, b.tick_id, b.opened_at, \
                                         NOT EXISTS (SELECT 1 FROM pgque.batch_done d \
                                                      WHERE d.batch_id = b.batch_id) AS open \
                                    FROM pgque.batch b WHERE b.member_id = m.sub_id AND b.sub_id + 0 = s.sub_id \
                                   ORDER BY b.batch_id DESC LIMIT 1) mb ON true \
               LEFT JOIN LATERAL (SELECT * FROM pgque.tick t WHERE t.tick_queue = q.queue_id \
                                   AND t.tick_id = mb.prev_tick_id LIMIT 1) pt ON mb.open \
             ) r (queue_name, consumer_name, lag, last_seen, last_tick, current_batch, next_tick, pending_events) \
              WHERE ($1::text IS NULL OR r.queue_name = $1) AND ($2::text IS NULL OR r.consumer_name = $2) \
              ORDER BY r.queue_name, r.consumer_name",
            &[queue.into(), consumer.into()],
        );
        let rows: Vec<ConsumerInfo> = t
            .map(|r| {
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
            .collect();
        if let (Some(q), Some(name), true) = (queue, consumer, rows.is_empty()) {
            raise(
                error::UNDEFINED_OBJECT,
                format!("consumer not registered: {name:?} on queue {q:?}"),
            );
        }
        rows
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
