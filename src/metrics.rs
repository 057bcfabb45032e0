#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
//! pgque.metrics(): every figure an operator graphs or alerts on, as
//! (name, labels, value) rows that pgque-web turns into Prometheus text.
//!
//! It reads what the status functions read and counts the way they count
//! (get_queue_info, get_consumer_info, partition_slot_status,
//! job_queue_status, the workers' shared memory behind status()), so a
//! dashboard and `SELECT * FROM pgque.get_consumer_info()` never disagree.
//! Queue and consumer figures come from the tick metadata and the event
//! sequences, dead letters through their (dl_queue, dl_time) index, the
//! worker's from shared memory: none of those grows with history. Job counts
//! come from job_queue_status, which sums the job counts (`n`) of the job
//! log's active claims and of its done rows still in retention: that grows
//! with the completion calls in the retention window (one done row per call
//! and claim), not with the jobs they completed, and reads no job-id array
//! (benches/results/metrics.md). A partition slot's own pending count
//! (partition_slot_status counts that slot's events) is paid only by queues
//! with partitioned consumers.
use crate::worker::duties::DUTIES;
use crate::{log, shmem};
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::json;

/// The SQL-side figures, in one statement (each status function runs once).
/// Names and labels are Prometheus's conventions: snake case, base units
/// (seconds), `_total` for counters.
const FIGURES: &str = "\
WITH qi AS MATERIALIZED (SELECT * FROM pgque.get_queue_info()),
     ci AS MATERIALIZED (SELECT * FROM pgque.get_consumer_info()),
     ps AS MATERIALIZED (SELECT * FROM pgque.partition_slot_status WHERE subscribed),
     js AS MATERIALIZED (SELECT * FROM pgque.job_queue_status)
SELECT 'pgque_event_queue_pending_events'::text AS name, jsonb_build_object('queue', qi.queue_name) AS labels,
       COALESCE((SELECT max(ci.pending_events) FROM ci WHERE ci.queue_name = qi.queue_name), 0)::float8 AS value
  FROM qi
UNION ALL
SELECT 'pgque_event_queue_unticked_events', jsonb_build_object('queue', qi.queue_name), COALESCE(qi.ev_new, 0)::float8
  FROM qi
UNION ALL
SELECT 'pgque_event_queue_last_tick_age_seconds', jsonb_build_object('queue', qi.queue_name),
       extract(epoch FROM qi.ticker_lag)::float8
  FROM qi WHERE qi.ticker_lag IS NOT NULL
UNION ALL
SELECT 'pgque_event_queue_events_per_second', jsonb_build_object('queue', qi.queue_name), qi.ev_per_sec
  FROM qi WHERE qi.ev_per_sec IS NOT NULL
UNION ALL
SELECT 'pgque_event_queue_ticker_paused', jsonb_build_object('queue', qi.queue_name),
       CASE WHEN qi.queue_ticker_paused THEN 1 ELSE 0 END::float8
  FROM qi
UNION ALL
SELECT 'pgque_event_queue_consumers', jsonb_build_object('queue', qi.queue_name),
       (SELECT count(*) FROM ci WHERE ci.queue_name = qi.queue_name)::float8
  FROM qi
UNION ALL
SELECT 'pgque_dead_letters', jsonb_build_object('queue', q.queue_name),
       (SELECT count(*) FROM pgque.dead_letter_store d WHERE d.dl_queue = q.queue_id)::float8
  FROM pgque.queue q
UNION ALL
SELECT 'pgque_consumer_lag_seconds', jsonb_build_object('queue', ci.queue_name, 'consumer', ci.consumer_name),
       extract(epoch FROM ci.lag)::float8
  FROM ci WHERE ci.lag IS NOT NULL
UNION ALL
SELECT 'pgque_consumer_pending_events', jsonb_build_object('queue', ci.queue_name, 'consumer', ci.consumer_name),
       ci.pending_events::float8
  FROM ci WHERE ci.pending_events IS NOT NULL
UNION ALL
SELECT 'pgque_consumer_last_seen_seconds', jsonb_build_object('queue', ci.queue_name, 'consumer', ci.consumer_name),
       extract(epoch FROM ci.last_seen)::float8
  FROM ci WHERE ci.last_seen IS NOT NULL
UNION ALL
SELECT 'pgque_consumer_batch_open', jsonb_build_object('queue', ci.queue_name, 'consumer', ci.consumer_name),
       CASE WHEN ci.current_batch IS NULL THEN 0 ELSE 1 END::float8
  FROM ci
UNION ALL
SELECT 'pgque_partition_slot_pending_events',
       jsonb_build_object('queue', ps.queue_name, 'consumer', ps.consumer, 'slot', ps.slot::text),
       ps.pending_events::float8
  FROM ps WHERE ps.pending_events IS NOT NULL
UNION ALL
SELECT 'pgque_partition_slot_oldest_pending_age_seconds',
       jsonb_build_object('queue', ps.queue_name, 'consumer', ps.consumer, 'slot', ps.slot::text),
       extract(epoch FROM ps.oldest_pending_age)::float8
  FROM ps WHERE ps.oldest_pending_age IS NOT NULL
UNION ALL
SELECT 'pgque_partition_slot_leased',
       jsonb_build_object('queue', ps.queue_name, 'consumer', ps.consumer, 'slot', ps.slot::text),
       CASE WHEN ps.lease_owner IS NULL THEN 0 ELSE 1 END::float8
  FROM ps
UNION ALL
SELECT 'pgque_jobs', jsonb_build_object('queue', js.queue_name, 'state', s.state), s.n::float8
  FROM js CROSS JOIN LATERAL (VALUES ('scheduled', js.scheduled::bigint), ('ready', js.ready::bigint),
                                     ('running', js.running::bigint), ('completed', js.completed::bigint),
                                     ('failed', js.failed::bigint), ('cancelled', js.cancelled::bigint)) s(state, n)
UNION ALL
SELECT 'pgque_job_oldest_ready_age_seconds', jsonb_build_object('queue', js.queue_name),
       GREATEST(COALESCE(extract(epoch FROM js.oldest_ready_age), 0), 0)::float8
  FROM js
UNION ALL
SELECT 'pgque_job_queue_paused', jsonb_build_object('queue', js.queue_name),
       CASE WHEN js.paused THEN 1 ELSE 0 END::float8
  FROM js
ORDER BY 1, 2";

/// The blocked keys of `pause` consumers (src/log/pause.rs), per consumer:
/// how many (0 included, for alerting), the oldest one's age and how many
/// events they hold back. Reads the markers only (one row per blocked key,
/// with its held count), not the held events. Needs 0.8.0's schema.
const BLOCKED_FIGURES: &str = "\
SELECT 'pgque_partition_blocked_keys'::text, jsonb_build_object('queue', q.queue_name, 'consumer', pc.pc_consumer),
       (SELECT count(*) FROM pgque.partition_blocked_keys b
         WHERE b.queue_name = q.queue_name AND b.consumer = pc.pc_consumer)::float8
  FROM pgque.partition_consumer pc JOIN pgque.queue q ON q.queue_id = pc.pc_queue
 WHERE pc.pc_failure_policy = 'pause'
UNION ALL
SELECT 'pgque_partition_blocked_oldest_seconds', jsonb_build_object('queue', queue_name, 'consumer', consumer),
       extract(epoch FROM max(blocked_for))::float8
  FROM pgque.partition_blocked_keys GROUP BY queue_name, consumer
UNION ALL
SELECT 'pgque_partition_held_events', jsonb_build_object('queue', queue_name, 'consumer', consumer),
       sum(held_events)::float8
  FROM pgque.partition_blocked_keys GROUP BY queue_name, consumer
ORDER BY 1, 2";

/// Seconds since 1970 of a PostgreSQL TimestampTz (microseconds since 2000).
fn unix_seconds(ts: i64) -> f64 {
    ts as f64 / 1_000_000.0 + 946_684_800.0
}

type Figure = (String, JsonB, f64);

/// How long the job log's due truncation has waited on other sessions'
/// locks (0: it is not held back) and how many sessions hold them
/// (jobs::log::rotate::blockers; status() names them).
fn job_log_figures() -> Vec<Figure> {
    let b = crate::jobs::log::rotate::blockers();
    vec![
        (
            "pgque_job_log_truncation_blocked_seconds".into(),
            JsonB(json!({})),
            b.first().map_or(0.0, |x| x.due_for_s),
        ),
        (
            "pgque_job_log_truncation_blockers".into(),
            JsonB(json!({})),
            b.len() as f64,
        ),
    ]
}

/// The worker's figures from shared memory: whether pgque is preloaded, the
/// worker is up and switched on, and each duty's counters (the numbers
/// status() prints in its `duty:<name>` rows).
fn worker_figures(enabled: bool) -> Vec<Figure> {
    let mut out: Vec<Figure> = Vec::new();
    let mut put = |name: &str, labels: serde_json::Value, value: f64| {
        out.push((name.to_string(), JsonB(labels), value));
    };
    let preloaded = shmem::available();
    put("pgque_preloaded", json!({}), preloaded as u8 as f64);
    // 1 on a hot standby: no worker runs there (pgque_worker_up is 0) and
    // the queue figures are what was replicated.
    put(
        "pgque_in_recovery",
        json!({}),
        crate::admin::in_recovery() as u8 as f64,
    );
    put("pgque_worker_enabled", json!({}), enabled as u8 as f64);
    let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
    let snap = if preloaded { shmem::snapshot(db) } else { None };
    let running = snap.filter(|s| s.pid > 0);
    // A database parked by the worker pool has no process but is served:
    // the launcher starts one when a duty is due or a producer commits.
    let parked = preloaded && running.is_none() && shmem::demand_of(db).is_some();
    put(
        "pgque_worker_up",
        json!({}),
        ((running.is_some() || parked) && enabled) as u8 as f64,
    );
    put("pgque_worker_parked", json!({}), parked as u8 as f64);
    if preloaded {
        // The server's pool, the same in every database: databases that
        // wait for a worker process the pool cannot start.
        let short = shmem::pool_short();
        put(
            "pgque_worker_pool_short",
            json!({}),
            (short.since != 0) as u8 as f64,
        );
        put(
            "pgque_worker_pool_waiting_databases",
            json!({}),
            short.waiting as f64,
        );
        // Backends of this database sleeping in a waiting receive or
        // next_batch_wait now (src/waiters.rs): exact, from shared memory.
        put(
            "pgque_waiting_consumers",
            json!({}),
            crate::waiters::waiting(db).1 as f64,
        );
    }
    if let Some(slot) = running {
        put(
            "pgque_worker_start_time_seconds",
            json!({}),
            unix_seconds(slot.started_at),
        );
    }
    // While parked, the counters its last worker left in the slot.
    let Some(slot) = running.or(snap.filter(|s| parked && s.db_oid == db)) else {
        return out;
    };
    for (i, d) in DUTIES.iter().enumerate() {
        let st = &slot.duties[i];
        let l = || json!({ "duty": d.name });
        put("pgque_duty_runs_total", l(), st.runs as f64);
        put("pgque_duty_failures_total", l(), st.failures as f64);
        put(
            "pgque_duty_consecutive_failures",
            l(),
            st.consecutive_failures as f64,
        );
        put(
            "pgque_duty_last_duration_seconds",
            l(),
            st.last_duration_us as f64 / 1_000_000.0,
        );
        if st.last_run != 0 {
            put(
                "pgque_duty_last_run_timestamp_seconds",
                l(),
                unix_seconds(st.last_run),
            );
        }
        if st.last_ok != 0 {
            put(
                "pgque_duty_last_success_timestamp_seconds",
                l(),
                unix_seconds(st.last_ok),
            );
        }
    }
    out
}

/// pgque.metrics(): one row per figure (name, labels as a jsonb object of
/// strings, value). Reads the status functions' sources and shared memory;
/// changes nothing and takes no transaction id (it answers on a hot
/// standby, where `pgque_in_recovery` is 1). Rows without a value (a queue
/// never ticked has no tick age) are left out rather than reported as 0.
#[pg_extern(stable, security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn metrics(
) -> TableIterator<'static, (name!(name, String), name!(labels, JsonB), name!(value, f64))> {
    let (mut rows, enabled) = Spi::connect_mut(|c| {
        // On SPI's read path (a WITH is not one log::exec can prove
        // read-only): the write path assigns the transaction an id, which
        // a hot standby refuses, and monitoring must work there.
        let rows: Vec<Figure> = log::exec_read(c, FIGURES, &[])
            .map(|r| {
                (
                    log::col::<String>(&r, 1).unwrap(),
                    log::col::<JsonB>(&r, 2).unwrap(),
                    log::col::<f64>(&r, 3).unwrap_or(0.0),
                )
            })
            .collect();
        let mut rows = rows;
        if crate::log::schema::pause_installed() {
            rows.extend(
                log::exec_read(c, BLOCKED_FIGURES, &[])
                    .map(|r| {
                        (
                            log::col::<String>(&r, 1).unwrap(),
                            log::col::<JsonB>(&r, 2).unwrap(),
                            log::col::<f64>(&r, 3).unwrap_or(0.0),
                        )
                    })
                    .collect::<Vec<_>>(),
            );
        }
        let enabled = log::first_row(log::exec(
            c,
            "SELECT worker_enabled FROM pgque.worker_config",
            &[],
        ))
        .and_then(|r| log::col::<bool>(&r, 1))
        .unwrap_or(true);
        (rows, enabled)
    });
    rows.extend(worker_figures(enabled));
    rows.extend(job_log_figures());
    TableIterator::new(rows)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn run(sql: &str) {
        Spi::run(sql).unwrap();
    }
    fn one_i64(sql: &str) -> i64 {
        Spi::get_one::<i64>(sql).unwrap().unwrap()
    }
    fn one_f64(sql: &str) -> f64 {
        Spi::get_one::<f64>(sql).unwrap().unwrap()
    }

    /// Rows of `metrics()` named `name` that differ from `reference`
    /// (a query of (labels jsonb, value float8)), both ways.
    fn differences(name: &str, reference: &str) -> i64 {
        one_i64(&format!(
            "WITH m AS (SELECT labels, value FROM pgque.metrics() WHERE name = '{name}'),
                  r AS ({reference})
             SELECT count(*) FROM ((SELECT * FROM m EXCEPT ALL SELECT * FROM r)
                                   UNION ALL (SELECT * FROM r EXCEPT ALL SELECT * FROM m)) d"
        ))
    }

    fn value(name: &str, labels: &str) -> Option<f64> {
        Spi::get_one::<f64>(&format!(
            "SELECT value FROM pgque.metrics() WHERE name = '{name}' AND labels = '{labels}'::jsonb"
        ))
        .unwrap()
    }

    fn event_setup() {
        run("SELECT pgque.create_queue('mq')");
        run("SELECT pgque.create_queue('mq2')");
        run("SELECT pgque.subscribe('mq', 'fast')");
        run("SELECT pgque.subscribe('mq', 'slow')");
        run("SELECT pgque.subscribe_partitioned('mq2', 'keyed', 4)");
        run("SELECT pgque.send('mq', '{\"a\":1}'::jsonb) FROM generate_series(1, 7)");
        run("SELECT pgque.send('mq2', 'k', 'v' || g, 'key' || g) FROM generate_series(1, 5) g");
        run("SELECT pgque.ticker()");
    }

    #[pg_test]
    fn event_figures_equal_the_status_functions() {
        event_setup();
        // Both consumers subscribed before the 7 sends: each has all 7 pending.
        assert_eq!(
            value(
                "pgque_consumer_pending_events",
                r#"{"queue":"mq","consumer":"slow"}"#
            ),
            Some(7.0)
        );
        assert_eq!(
            value("pgque_event_queue_pending_events", r#"{"queue":"mq"}"#),
            Some(7.0)
        );
        assert_eq!(
            value("pgque_event_queue_consumers", r#"{"queue":"mq"}"#),
            Some(2.0)
        );
        for (name, reference) in [
            (
                "pgque_consumer_pending_events",
                "SELECT jsonb_build_object('queue', queue_name, 'consumer', consumer_name), pending_events::float8
                   FROM pgque.get_consumer_info() WHERE pending_events IS NOT NULL",
            ),
            (
                "pgque_consumer_lag_seconds",
                "SELECT jsonb_build_object('queue', queue_name, 'consumer', consumer_name),
                        extract(epoch FROM lag)::float8
                   FROM pgque.get_consumer_info() WHERE lag IS NOT NULL",
            ),
            (
                "pgque_event_queue_pending_events",
                "SELECT jsonb_build_object('queue', q.queue_name),
                        COALESCE(max(c.pending_events), 0)::float8
                   FROM pgque.get_queue_info() q LEFT JOIN pgque.get_consumer_info() c USING (queue_name)
                  GROUP BY q.queue_name",
            ),
            (
                "pgque_event_queue_unticked_events",
                "SELECT jsonb_build_object('queue', queue_name), ev_new::float8 FROM pgque.get_queue_info()",
            ),
            (
                "pgque_event_queue_last_tick_age_seconds",
                "SELECT jsonb_build_object('queue', queue_name), extract(epoch FROM ticker_lag)::float8
                   FROM pgque.get_queue_info()",
            ),
            (
                "pgque_partition_slot_pending_events",
                "SELECT jsonb_build_object('queue', queue_name, 'consumer', consumer, 'slot', slot::text),
                        pending_events::float8
                   FROM pgque.partition_slot_status WHERE subscribed",
            ),
        ] {
            assert_eq!(differences(name, reference), 0, "{name}");
        }
        // Four slots, one row each.
        assert_eq!(
            one_i64(
                "SELECT count(*) FROM pgque.metrics() WHERE name = 'pgque_partition_slot_pending_events'
                   AND labels->>'queue' = 'mq2' AND labels->>'consumer' = 'keyed'"
            ),
            4
        );
    }

    #[pg_test]
    fn dead_letters_are_counted_per_queue() {
        event_setup();
        assert_eq!(value("pgque_dead_letters", r#"{"queue":"mq"}"#), Some(0.0));
        // Events are not deliverable inside the test's own transaction, so the
        // dead letters are written as event_dead would write them.
        run("INSERT INTO pgque.dead_letter_store (dl_queue, dl_consumer, dl_reason, ev_id, ev_time, ev_type, ev_data)
             SELECT queue_id, 'fast', 'boom', g, now(), 'default', 'x'
               FROM pgque.queue, generate_series(1, 3) g WHERE queue_name = 'mq'");
        let dead = one_i64(
            "SELECT count(*) FROM pgque.dead_letter_store d JOIN pgque.queue q ON q.queue_id = d.dl_queue
              WHERE q.queue_name = 'mq'",
        );
        assert_eq!(dead, 3);
        assert_eq!(
            value("pgque_dead_letters", r#"{"queue":"mq"}"#),
            Some(dead as f64)
        );
        assert_eq!(value("pgque_dead_letters", r#"{"queue":"mq2"}"#), Some(0.0));
    }

    #[pg_test]
    fn job_figures_equal_job_queue_status() {
        run("SELECT pgque.create_job_queue('mj')");
        run("SELECT pgque.enqueue('mj', 'k', '{}'::jsonb) FROM generate_series(1, 5)");
        run("SELECT pgque.enqueue('mj', 'k', '{}'::jsonb, run_at => now() + interval '1 hour')");
        run("SELECT pgque.dispatch(ARRAY['mj'], 2, 'w1', '1 minute', 1)");
        let status = "SELECT jsonb_build_object('queue', j.queue_name, 'state', s.state), s.n::float8
                        FROM pgque.job_queue_status j CROSS JOIN LATERAL (VALUES
                          ('scheduled', j.scheduled::bigint), ('ready', j.ready::bigint),
                          ('running', j.running::bigint), ('completed', j.completed::bigint),
                          ('failed', j.failed::bigint), ('cancelled', j.cancelled::bigint)) s(state, n)";
        assert_eq!(differences("pgque_jobs", status), 0);
        assert_eq!(
            value("pgque_jobs", r#"{"queue":"mj","state":"ready"}"#),
            Some(3.0)
        );
        assert_eq!(
            value("pgque_jobs", r#"{"queue":"mj","state":"running"}"#),
            Some(2.0)
        );
        assert_eq!(
            value("pgque_jobs", r#"{"queue":"mj","state":"scheduled"}"#),
            Some(1.0)
        );
        assert_eq!(
            differences(
                "pgque_job_oldest_ready_age_seconds",
                "SELECT jsonb_build_object('queue', queue_name),
                        GREATEST(COALESCE(extract(epoch FROM oldest_ready_age), 0), 0)::float8
                   FROM pgque.job_queue_status"
            ),
            0
        );
        run("SELECT pgque.pause_job_queue('mj')");
        assert_eq!(
            value("pgque_job_queue_paused", r#"{"queue":"mj"}"#),
            Some(1.0)
        );
    }

    #[pg_test]
    fn worker_figures_follow_status() {
        // The test server preloads pgque, so this database has a worker.
        assert_eq!(
            one_f64("SELECT value FROM pgque.metrics() WHERE name = 'pgque_preloaded'"),
            1.0
        );
        // One runs and one failures counter per duty status() lists, once the
        // worker is up (it may still be starting right after server start).
        let up = one_f64("SELECT value FROM pgque.metrics() WHERE name = 'pgque_worker_up'");
        let duties = one_i64("SELECT count(*) FROM pgque.status() WHERE component LIKE 'duty:%'");
        assert_eq!(up == 1.0, duties > 0);
        assert_eq!(
            one_i64(
                "SELECT count(*) FROM pgque.metrics() m JOIN pgque.status() s
                     ON s.component = 'duty:' || (m.labels->>'duty')
                  WHERE m.name IN ('pgque_duty_runs_total', 'pgque_duty_failures_total')"
            ),
            2 * duties
        );
        // Counters only grow: status() read after metrics() shows at least as many runs.
        assert_eq!(
            one_i64(
                "WITH m AS (SELECT labels->>'duty' AS duty, value FROM pgque.metrics()
                             WHERE name = 'pgque_duty_runs_total'),
                      s AS (SELECT substr(component, 6) AS duty,
                                   substring(detail FROM 'runs=([0-9]+)')::float8 AS runs
                              FROM pgque.status() WHERE component LIKE 'duty:%')
                 SELECT count(*) FROM m JOIN s USING (duty) WHERE m.value > s.runs"
            ),
            0
        );
        run("SELECT pgque.stop()");
        assert_eq!(
            one_f64("SELECT value FROM pgque.metrics() WHERE name = 'pgque_worker_enabled'"),
            0.0
        );
        assert_eq!(
            one_f64("SELECT value FROM pgque.metrics() WHERE name = 'pgque_worker_up'"),
            0.0
        );
    }
}
