#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
//! PgQue's observability set (its sql/experimental/observability.sql, with
//! PgQue's column lists): queue_stats, consumer_stats, queue_health,
//! otel_metrics, stuck_consumers, in_flight, throughput, error_rate.
//!
//! All read only (no transaction id, no row lock) and are granted to
//! pgque_reader. They read the queues' metadata: each queue's last ticks
//! and its consumers' positions (index probes on pgque.tick and
//! pgque.batch), never the event tables, so their cost does not grow with
//! backlog depth. Each function's header says what else it reads.
use crate::datum::{check_nonnegative_interval, interval_ms};
use crate::error::{self, raise, required};
use crate::log;
use pgrx::datum::{AnyNumeric, Interval, JsonB, TimestampWithTimeZone};
use pgrx::prelude::*;

/// One row per queue: its last tick, the tick before it, and the oldest
/// position of its consumers (consumer_position: per consumer an index probe
/// on its latest batch and its open ones) with that tick's time and sequence.
/// dlq_count counts the queue's dead letters through dead_letter_queue_idx:
/// the one part that grows with something, the dead-letter queue's size.
const QUEUE_STATS: &str = "\
SELECT q.queue_name, q.queue_id,
       coalesce(l.tick_event_seq - m.min_seq, 0)::int8 AS depth,
       now() - m.oldest_time AS oldest_msg_age,
       (SELECT count(*)::int4 FROM pgque.subscription s
         WHERE s.sub_queue = q.queue_id AND s.sub_parent IS NULL) AS consumers,
       CASE WHEN p.tick_time IS NULL THEN NULL
            WHEN p.tick_time = l.tick_time THEN 0::numeric
            ELSE round((l.tick_event_seq - p.tick_event_seq)::numeric
                       / extract(epoch FROM l.tick_time - p.tick_time), 3) END AS events_per_sec,
       q.queue_cur_table AS cur_table,
       now() - q.queue_switch_time AS rotation_age,
       q.queue_rotation_period AS rotation_period,
       q.queue_ticker_paused AS ticker_paused,
       l.tick_time AS last_tick_time, l.tick_id AS last_tick_id,
       (SELECT count(*) FROM pgque.dead_letter_store d WHERE d.dl_queue = q.queue_id)::int8 AS dlq_count
  FROM pgque.queue q
  LEFT JOIN LATERAL (SELECT t.tick_id, t.tick_time, t.tick_event_seq FROM pgque.tick t
                      WHERE t.tick_queue = q.queue_id ORDER BY t.tick_id DESC LIMIT 1) l ON true
  LEFT JOIN LATERAL (SELECT t.tick_time, t.tick_event_seq FROM pgque.tick t
                      WHERE t.tick_queue = q.queue_id AND t.tick_id < l.tick_id
                      ORDER BY t.tick_id DESC LIMIT 1) p ON true
  LEFT JOIN LATERAL (SELECT min(t.tick_event_seq) AS min_seq, min(t.tick_time) AS oldest_time
                       FROM pgque.consumer_position cp
                       JOIN LATERAL (SELECT t.tick_time, t.tick_event_seq FROM pgque.tick t
                                      WHERE t.tick_queue = q.queue_id AND t.tick_id = cp.pos_tick
                                      LIMIT 1) t ON true
                      WHERE cp.sub_queue = q.queue_id) m ON true";

/// One row per consumer (a partition slot is a consumer of its own, `c#k`):
/// its position (consumer_position), that tick and the queue's last tick, its
/// latest batch and its oldest open batch (index probes on pgque.batch).
const CONSUMER_STATS: &str = "\
SELECT q.queue_name, cp.sub_consumer AS consumer_name,
       now() - t.tick_time AS lag,
       coalesce(l.tick_event_seq - t.tick_event_seq, 0)::int8 AS pending_events,
       lb.opened_at AS last_batch_start,
       ob.batch_id IS NOT NULL AS batch_active,
       ob.batch_id,
       s.sub_active, s.sub_created_at
  FROM pgque.consumer_position cp
  JOIN pgque.queue q ON q.queue_id = cp.sub_queue
  JOIN pgque.subscription s ON s.sub_id = cp.sub_id
  LEFT JOIN LATERAL (SELECT t.tick_time, t.tick_event_seq FROM pgque.tick t
                      WHERE t.tick_queue = q.queue_id AND t.tick_id = cp.pos_tick LIMIT 1) t ON true
  LEFT JOIN LATERAL (SELECT t.tick_event_seq FROM pgque.tick t
                      WHERE t.tick_queue = q.queue_id ORDER BY t.tick_id DESC LIMIT 1) l ON true
  LEFT JOIN LATERAL (SELECT b.opened_at FROM pgque.batch b WHERE b.sub_id = cp.sub_id
                      ORDER BY b.tick_id DESC, b.ev_floor DESC, b.batch_id DESC LIMIT 1) lb ON true
  LEFT JOIN LATERAL (SELECT b.batch_id FROM pgque.batch b WHERE b.sub_id = cp.sub_id
                        AND NOT EXISTS (SELECT 1 FROM pgque.batch_done d WHERE d.batch_id = b.batch_id)
                      ORDER BY b.tick_id, b.ev_floor, b.batch_id LIMIT 1) ob ON true";

/// queue_stats() → one row per queue (PgQue's columns): depth = events of the
/// last tick not yet past the slowest consumer, oldest_msg_age = age of that
/// consumer's position, events_per_sec between the last two ticks, dlq_count.
/// Costs per queue: a few index probes per consumer, plus the count of its
/// dead letters.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn queue_stats() -> TableIterator<
    'static,
    (
        name!(queue_name, String),
        name!(queue_id, i32),
        name!(depth, i64),
        name!(oldest_msg_age, Option<Interval>),
        name!(consumers, i32),
        name!(events_per_sec, Option<AnyNumeric>),
        name!(cur_table, i32),
        name!(rotation_age, Interval),
        name!(rotation_period, Interval),
        name!(ticker_paused, bool),
        name!(last_tick_time, Option<TimestampWithTimeZone>),
        name!(last_tick_id, Option<i64>),
        name!(dlq_count, i64),
    ),
> {
    let rows = Spi::connect_mut(|c| {
        let sql = format!("{QUEUE_STATS} ORDER BY q.queue_name");
        log::exec(c, &sql, &[])
            .map(|r| {
                (
                    log::col(&r, 1).unwrap(),
                    log::col(&r, 2).unwrap(),
                    log::col(&r, 3).unwrap(),
                    log::col(&r, 4),
                    log::col(&r, 5).unwrap(),
                    log::col(&r, 6),
                    log::col(&r, 7).unwrap(),
                    log::col(&r, 8).unwrap(),
                    log::col(&r, 9).unwrap(),
                    log::col(&r, 10).unwrap(),
                    log::col(&r, 11),
                    log::col(&r, 12),
                    log::col(&r, 13).unwrap(),
                )
            })
            .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}

/// consumer_stats() → one row per consumer (PgQue's columns): lag = age of its
/// position's tick, pending_events = events between that tick and the last,
/// last_batch_start, batch_active / batch_id (its oldest open batch).
/// Costs a few index probes per consumer.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn consumer_stats() -> TableIterator<
    'static,
    (
        name!(queue_name, String),
        name!(consumer_name, String),
        name!(lag, Option<Interval>),
        name!(pending_events, i64),
        name!(last_batch_start, Option<TimestampWithTimeZone>),
        name!(batch_active, bool),
        name!(batch_id, Option<i64>),
    ),
> {
    let rows = Spi::connect_mut(|c| {
        let sql = format!("{CONSUMER_STATS} ORDER BY 1, 2");
        log::exec(c, &sql, &[])
            .map(|r| {
                (
                    log::col(&r, 1).unwrap(),
                    log::col(&r, 2).unwrap(),
                    log::col(&r, 3),
                    log::col(&r, 4).unwrap(),
                    log::col(&r, 5),
                    log::col(&r, 6).unwrap(),
                    log::col(&r, 7),
                )
            })
            .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}

/// queue_health() → (queue_name, check_name, status, detail) with status ok /
/// warning / critical, PgQue's checks: ticker_running (no tick for longer
/// than the idle period + max lag + 10 s), consumer_lag:<consumer> (position
/// older than half / all of the rotation period), rotation_health,
/// dlq_health (more than 1000 dead letters: warning), and for the database
/// (queue_name 'system') the worker instead of PgQue's pg_cron jobs.
/// Costs what queue_stats and consumer_stats cost.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn queue_health() -> TableIterator<
    'static,
    (
        name!(queue_name, String),
        name!(check_name, String),
        name!(status, String),
        name!(detail, String),
    ),
> {
    let sql = format!(
        "WITH qs AS ({QUEUE_STATS}), cs AS ({CONSUMER_STATS}) \
         SELECT * FROM ( \
         SELECT qs.queue_name, 'ticker_running'::text, \
                CASE WHEN qs.last_tick_time IS NULL \
                       OR now() - qs.last_tick_time > q.queue_ticker_idle_period + q.queue_ticker_max_lag + interval '10 seconds' \
                     THEN 'critical' ELSE 'ok' END, \
                'Last tick: ' || coalesce(qs.last_tick_time::text, 'never'), 1 AS k \
           FROM qs JOIN pgque.queue q USING (queue_id) WHERE NOT qs.ticker_paused \
         UNION ALL \
         SELECT cs.queue_name, 'consumer_lag:' || cs.consumer_name, \
                CASE WHEN cs.lag IS NULL THEN 'warning' \
                     WHEN cs.lag > q.queue_rotation_period THEN 'critical' \
                     WHEN cs.lag > q.queue_rotation_period / 2 THEN 'warning' ELSE 'ok' END, \
                cs.consumer_name || ' lag: ' || coalesce(cs.lag::text, 'unknown'), 2 \
           FROM cs JOIN pgque.queue q ON q.queue_name = cs.queue_name \
         UNION ALL \
         SELECT q.queue_name, 'rotation_health', \
                CASE WHEN q.queue_switch_step2 IS NULL THEN 'warning' \
                     WHEN now() - q.queue_switch_time > q.queue_rotation_period * 2 THEN 'warning' \
                     ELSE 'ok' END, \
                CASE WHEN q.queue_switch_step2 IS NULL THEN 'mid-rotation (step2 pending)' \
                     ELSE 'last rotation: ' || q.queue_switch_time::text END, 3 \
           FROM pgque.queue q \
         UNION ALL \
         SELECT qs.queue_name, 'dlq_health', \
                CASE WHEN qs.dlq_count > 1000 THEN 'warning' ELSE 'ok' END, \
                qs.dlq_count::text || ' dead letter events', 4 \
           FROM qs \
         ) h ORDER BY h.k, 1, 2"
    );
    let mut rows = Spi::connect_mut(|c| {
        log::exec_read(c, &sql, &[])
            .map(|r| {
                (
                    log::col(&r, 1).unwrap(),
                    log::col(&r, 2).unwrap(),
                    log::col(&r, 3).unwrap(),
                    log::col(&r, 4).unwrap(),
                )
            })
            .collect::<Vec<(String, String, String, String)>>()
    });
    let enabled = Spi::get_one::<bool>("SELECT worker_enabled FROM pgque.worker_config")
        .ok()
        .flatten()
        .unwrap_or(false);
    let (status, detail) = if !enabled {
        (
            "critical",
            "worker stopped (pgque.stop()); pgque.start() switches it on",
        )
    } else if !crate::shmem::available() {
        (
            "warning",
            "manual mode (pgque not in shared_preload_libraries): schedule pgque.ticker() and pgque.maint()",
        )
    } else {
        (
            "ok",
            "the background worker ticks and maintains this database",
        )
    };
    rows.push((
        "system".into(),
        "worker".into(),
        status.into(),
        detail.into(),
    ));
    TableIterator::new(rows)
}

/// otel_metrics() → (metric_name, metric_type, metric_value, labels): gauges
/// per queue (pgque.queue.depth, pgque.queue.oldest_message_age_seconds,
/// pgque.message.dead_lettered, pgque.queue.throughput) and per consumer
/// (pgque.consumer.lag_seconds, pgque.consumer.pending_events), as PgQue's
/// (with pgque's prefix). Costs what queue_stats and consumer_stats cost.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn otel_metrics() -> TableIterator<
    'static,
    (
        name!(metric_name, String),
        name!(metric_type, String),
        name!(metric_value, AnyNumeric),
        name!(labels, JsonB),
    ),
> {
    let sql = format!(
        "WITH qs AS ({QUEUE_STATS}), cs AS ({CONSUMER_STATS}) \
         SELECT 'pgque.queue.depth', 'gauge', qs.depth::numeric, jsonb_build_object('queue', qs.queue_name) FROM qs \
         UNION ALL SELECT 'pgque.queue.oldest_message_age_seconds', 'gauge', \
                coalesce(extract(epoch FROM qs.oldest_msg_age), 0)::numeric, jsonb_build_object('queue', qs.queue_name) FROM qs \
         UNION ALL SELECT 'pgque.consumer.lag_seconds', 'gauge', \
                coalesce(extract(epoch FROM cs.lag), 0)::numeric, \
                jsonb_build_object('queue', cs.queue_name, 'consumer', cs.consumer_name) FROM cs \
         UNION ALL SELECT 'pgque.consumer.pending_events', 'gauge', cs.pending_events::numeric, \
                jsonb_build_object('queue', cs.queue_name, 'consumer', cs.consumer_name) FROM cs \
         UNION ALL SELECT 'pgque.message.dead_lettered', 'gauge', qs.dlq_count::numeric, \
                jsonb_build_object('queue', qs.queue_name) FROM qs \
         UNION ALL SELECT 'pgque.queue.throughput', 'gauge', coalesce(qs.events_per_sec, 0), \
                jsonb_build_object('queue', qs.queue_name) FROM qs"
    );
    let rows = Spi::connect_mut(|c| {
        log::exec_read(c, &sql, &[])
            .map(|r| {
                (
                    log::col(&r, 1).unwrap(),
                    log::col(&r, 2).unwrap(),
                    log::col(&r, 3).unwrap(),
                    log::col(&r, 4).unwrap(),
                )
            })
            .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}

/// stuck_consumers(threshold default '1 hour') → consumers whose position is
/// older than `threshold` (or, before their first tick, whose last sign of
/// life is): (queue_name, consumer_name, lag, last_active), oldest first.
/// last_active is the later of the latest batch's start and the
/// subscription's last touch. Costs what consumer_stats costs.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn stuck_consumers(
    threshold: default!(Option<Interval>, "'1 hour'"),
) -> TableIterator<
    'static,
    (
        name!(queue_name, String),
        name!(consumer_name, String),
        name!(lag, Option<Interval>),
        name!(last_active, TimestampWithTimeZone),
    ),
> {
    let threshold = required(threshold, "threshold");
    check_nonnegative_interval(&threshold, "threshold");
    let sql = format!(
        "WITH cs AS ({CONSUMER_STATS}) \
         SELECT cs.queue_name, cs.consumer_name, cs.lag, \
                greatest(cs.last_batch_start, cs.sub_active) AS last_active \
           FROM cs \
          WHERE coalesce(cs.lag, now() - greatest(cs.last_batch_start, cs.sub_active)) > $1 \
          ORDER BY cs.lag DESC NULLS FIRST, 1, 2"
    );
    let rows = Spi::connect_mut(|c| {
        log::exec_read(c, &sql, &[threshold.into()])
            .map(|r| {
                (
                    log::col(&r, 1).unwrap(),
                    log::col(&r, 2).unwrap(),
                    log::col(&r, 3),
                    log::col(&r, 4).unwrap(),
                )
            })
            .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}

/// in_flight(queue_name) → the queue's open batches: (consumer_name, batch_id,
/// batch_age, estimated_events). A cooperative member's batch is named
/// `consumer.member` as in PgQue; estimated_events comes from the batch's
/// tick sequence values (or its cut), not from reading events. Costs, per
/// consumer, a walk over its batches still in the metadata pieces (bounded
/// by metadata rotation, pgque.metadata_rotation_period).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn in_flight(
    queue_name: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(consumer_name, String),
        name!(batch_id, i64),
        name!(batch_age, Interval),
        name!(estimated_events, i64),
    ),
> {
    let rows = Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        log::exec(
            c,
            "SELECT CASE WHEN m.sub_id IS NULL THEN s.sub_consumer \
                         ELSE s.sub_consumer || '.' || m.sub_consumer END, \
                    b.batch_id, now() - b.opened_at, \
                    greatest(coalesce(b.ev_ceiling, tc.tick_event_seq) \
                             - greatest(tp.tick_event_seq, b.ev_floor), 0)::int8 \
               FROM pgque.subscription s \
               JOIN pgque.batch b ON b.sub_id = s.sub_id \
                AND NOT EXISTS (SELECT 1 FROM pgque.batch_done d WHERE d.batch_id = b.batch_id) \
               LEFT JOIN pgque.subscription m ON m.sub_id = b.member_id \
               LEFT JOIN LATERAL (SELECT t.tick_event_seq FROM pgque.tick t \
                                   WHERE t.tick_queue = $1 AND t.tick_id = b.tick_id LIMIT 1) tc ON true \
               LEFT JOIN LATERAL (SELECT t.tick_event_seq FROM pgque.tick t \
                                   WHERE t.tick_queue = $1 AND t.tick_id = b.prev_tick_id LIMIT 1) tp ON true \
              WHERE s.sub_queue = $1 AND s.sub_parent IS NULL \
              ORDER BY 1, 2",
            &[q.id.into()],
        )
        .map(|r| {
            (
                log::col(&r, 1).unwrap(),
                log::col(&r, 2).unwrap(),
                log::col(&r, 3).unwrap(),
                log::col::<i64>(&r, 4).unwrap_or(0),
            )
        })
        .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}

/// Most buckets throughput / error_rate return: beyond it the call is 22023.
pub const MAX_BUCKETS: f64 = 100_000.0;

/// Checks (period, bucket_size): both required (22004), finite and positive,
/// and at most MAX_BUCKETS buckets (22023).
fn window_args(period: Option<Interval>, bucket: Option<Interval>) -> (Interval, Interval) {
    let period = required(period, "period");
    let bucket = required(bucket, "bucket_size");
    check_nonnegative_interval(&period, "period");
    check_nonnegative_interval(&bucket, "bucket_size");
    let (p, b) = (interval_ms(&period), interval_ms(&bucket));
    if p <= 0.0 {
        raise(error::INVALID_PARAMETER_VALUE, "period must be positive");
    }
    if b <= 0.0 {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "bucket_size must be positive",
        );
    }
    if p / b > MAX_BUCKETS {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!(
                "period / bucket_size is {:.0} buckets; the limit is {MAX_BUCKETS}",
                p / b
            ),
        );
    }
    (period, bucket)
}

/// throughput(queue_name, period, bucket_size) → (bucket_start, events,
/// events_per_sec): the events of the queue's ticks in the last `period`,
/// summed per bucket (date_bin, buckets aligned on 2000-01-01 UTC), from the ticks' sequence
/// values. pgque keeps ticks only as long as metadata rotation does (about
/// two pgque.metadata_rotation_period, longer for lagging consumers), so the
/// history reaches back that far; buckets without ticks are left out, as in
/// PgQue. Costs a walk over the queue's retained ticks.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn throughput(
    queue_name: Option<&str>,
    period: Option<Interval>,
    bucket_size: Option<Interval>,
) -> TableIterator<
    'static,
    (
        name!(bucket_start, TimestampWithTimeZone),
        name!(events, i64),
        name!(events_per_sec, AnyNumeric),
    ),
> {
    let (period, bucket) = window_args(period, bucket_size);
    let rows = Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        log::exec_read(
            c,
            "WITH t AS (SELECT t.tick_time, \
                               t.tick_event_seq - lag(t.tick_event_seq) OVER (ORDER BY t.tick_id) AS d \
                          FROM pgque.tick t WHERE t.tick_queue = $1) \
             SELECT date_bin($3, t.tick_time, timestamptz '2000-01-01 00:00:00+00'), sum(t.d)::int8, \
                    round(sum(t.d)::numeric / extract(epoch FROM $3::interval), 3) \
               FROM t WHERE t.d IS NOT NULL AND t.tick_time >= now() - $2::interval \
              GROUP BY 1 ORDER BY 1",
            &[q.id.into(), period.into(), bucket.into()],
        )
        .map(|r| {
            (
                log::col(&r, 1).unwrap(),
                log::col(&r, 2).unwrap(),
                log::col(&r, 3).unwrap(),
            )
        })
        .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}

/// error_rate(queue_name, period, bucket_size) → (bucket_start, retries,
/// dead_letters) for every bucket from `period` ago (to the minute) to now,
/// as PgQue's: retries are the queue's scheduled retries by their retry time
/// (pending ones: pgque.retry_queue), dead_letters its dead letters by when
/// they died. Costs index range scans over the retries and dead letters in
/// the window (proportional to failures, not to events).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn error_rate(
    queue_name: Option<&str>,
    period: Option<Interval>,
    bucket_size: Option<Interval>,
) -> TableIterator<
    'static,
    (
        name!(bucket_start, TimestampWithTimeZone),
        name!(retries, i64),
        name!(dead_letters, i64),
    ),
> {
    let (period, bucket) = window_args(period, bucket_size);
    let rows = Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        log::exec(
            c,
            "SELECT g, \
                    (SELECT count(*) FROM pgque.retry_queue r WHERE r.ev_queue = $1 \
                        AND r.ev_retry_after >= g AND r.ev_retry_after < g + $3::interval), \
                    (SELECT count(*) FROM pgque.dead_letter_store d WHERE d.dl_queue = $1 \
                        AND d.dl_time >= g AND d.dl_time < g + $3::interval) \
               FROM generate_series(date_trunc('minute', now() - $2::interval), \
                                    date_trunc('minute', now()), $3::interval) AS g \
              ORDER BY g",
            &[q.id.into(), period.into(), bucket.into()],
        )
        .map(|r| {
            (
                log::col(&r, 1).unwrap(),
                log::col(&r, 2).unwrap(),
                log::col(&r, 3).unwrap(),
            )
        })
        .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}
