//! When each duty next has work: `pgque.duty_due()`, read by an idle worker
//! to sleep until then (dbworker.rs), and callable by anyone to see why a
//! worker wakes.
//!
//! Every time here is read from state the duties themselves keep (the next
//! delayed event, retry, scheduled job, lease expiry, schedule slot, idle
//! tick, piece switch, history minute), each through an index or a one-row table, so the
//! cost does not grow with backlog or history. What is not known in advance
//! (a sealed job-log segment whose jobs are still running, metadata
//! copy-forward blocked by an old snapshot, retention of rows not yet
//! aged) is left to the idle housekeeping cadence, pgque.idle_maint_period.
use crate::gucs;
use pgrx::prelude::*;

/// One row per duty of `duties::DUTIES` (same names), with the seconds from
/// now until it has work (0: now), or NULL when nothing of it is known to
/// become due. $1 metadata rotation period (ms), $2 ledger rotation period
/// (s), $3 job log rotation period (s), $4 completed-job retention (s),
/// $5 failed-job retention (s), $6 job event retention (s), $7 analyze
/// interval (s); 0 switches that part off, as in the duties.
const DUE_SQL: &str = r#"
WITH n AS (SELECT pg_catalog.clock_timestamp() AS t),
ticker AS (
    SELECT pg_catalog.min(CASE
        WHEN lt.tick_id IS NULL THEN n.t
        WHEN coalesce(pg_catalog.pg_sequence_last_value(q.queue_event_seq::regclass), 0) > lt.tick_event_seq THEN n.t
        WHEN lt.tick_pending IS NOT NULL
             AND pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot()) >= lt.tick_pending THEN n.t
        WHEN lt.tick_pending IS NOT NULL
             THEN lt.tick_time + LEAST(q.queue_ticker_max_lag, q.queue_ticker_idle_period)
        ELSE lt.tick_time + q.queue_ticker_idle_period END) AS at
      FROM n, pgque.queue q
      LEFT JOIN LATERAL (SELECT t.tick_id, t.tick_time, t.tick_event_seq, t.tick_pending
                           FROM pgque.tick t WHERE t.tick_queue = q.queue_id
                          ORDER BY t.tick_id DESC LIMIT 1) lt ON true
     WHERE NOT q.queue_ticker_paused),
delayed AS (
    SELECT LEAST(
        (SELECT pg_catalog.min(d.deliver_at) FROM pgque.delayed_event d
          WHERE d.deliver_at > (SELECT s.last_horizon FROM pgque.delayed_state s)),
        (SELECT s.switched_at + $2 * interval '1 second' FROM pgque.delayed_state s)) AS at),
maint AS (
    SELECT LEAST(
        (SELECT pg_catalog.min(r.ev_retry_after) FROM pgque.retry_queue r),
        (SELECT n.t FROM n WHERE EXISTS (SELECT 1 FROM pgque.queue q WHERE q.queue_switch_step2 IS NULL)),
        (SELECT pg_catalog.min(q.queue_switch_time + q.queue_rotation_period) FROM pgque.queue q
          WHERE q.queue_switch_step2 IS NOT NULL
            AND NOT EXISTS (
                SELECT 1 FROM pgque.consumer_position p
                  LEFT JOIN LATERAL (SELECT t.tick_snapshot FROM pgque.tick t
                                      WHERE t.tick_queue = q.queue_id AND t.tick_id = p.pos_tick LIMIT 1) t ON true
                 WHERE p.sub_queue = q.queue_id
                   AND (t.tick_snapshot IS NULL
                        OR pg_catalog.pg_snapshot_xmin(t.tick_snapshot) < q.queue_switch_step2))),
        (SELECT CASE WHEN m.old_pending THEN n.t
                     WHEN $1 > 0 THEN m.switched_at + $1 * interval '1 millisecond' END
           FROM n, pgque.meta_state m),
        (SELECT i.switched_at + $2 * interval '1 second' FROM pgque.idem_state i)) AS at),
job_maint AS (
    SELECT LEAST(
        (SELECT n.t FROM n WHERE EXISTS (SELECT 1 FROM pgque.job_links)),
        (SELECT pg_catalog.min(j.run_at) FROM pgque.jobs j WHERE j.state = 'scheduled'),
        (SELECT pg_catalog.min(j.lease_until) FROM pgque.jobs j WHERE j.state = 'running'),
        (SELECT pg_catalog.min(c.lease_until) FROM pgque.job_claims c WHERE c.state = 'a'),
        (SELECT pg_catalog.min(e.at) + $6 * interval '1 second' FROM pgque.job_events e WHERE $6 > 0),
        (SELECT pg_catalog.min(j.finished_at) + $4 * interval '1 second' FROM pgque.jobs j
          WHERE j.state = 'completed' AND $4 > 0),
        (SELECT pg_catalog.min(j.finished_at) + $4 * interval '1 second' FROM pgque.jobs j
          WHERE j.state = 'cancelled' AND $4 > 0),
        (SELECT pg_catalog.min(j.finished_at) + $5 * interval '1 second' FROM pgque.jobs j
          WHERE j.state = 'failed' AND $5 > 0)) AS at),
job_log AS (
    SELECT pg_catalog.min(s.opened_at + $3 * interval '1 second') AS at
      FROM pgque.job_log_segments s
     WHERE s.opened_at IS NOT NULL AND s.sealed_at IS NULL AND $3 > 0),
schedules AS (
    SELECT pg_catalog.min(s.next_run_at) AS at FROM pgque.schedules_def s WHERE NOT s.paused),
job_analyze AS (
    SELECT coalesce(m.last_analyze_at + $7 * interval '1 second', n.t) AS at
      FROM n, pgque.job_maint_state m WHERE $7 > 0),
history AS (
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM pgque.queue)
                     AND NOT EXISTS (SELECT 1 FROM pgque.job_queues) THEN NULL
                WHEN EXISTS (SELECT 1 FROM pgque.metric_history h
                              WHERE h.bucket >= pg_catalog.date_trunc('minute', n.t))
                THEN pg_catalog.date_trunc('minute', n.t) + interval '1 minute'
                ELSE n.t END AS at
      FROM n)
-- GREATEST ignores a NULL: nothing due stays NULL only through the CASE
SELECT d.duty, CASE WHEN d.at IS NOT NULL THEN GREATEST(0, extract(epoch FROM d.at - n.t))::float8 END
  FROM n, (VALUES ('ticker', (SELECT at FROM ticker)),
                  ('maint', (SELECT at FROM maint)),
                  ('delayed', (SELECT at FROM delayed)),
                  ('job_maint', (SELECT at FROM job_maint)),
                  ('job_log', (SELECT at FROM job_log)),
                  ('schedules', (SELECT at FROM schedules)),
                  ('job_analyze', (SELECT at FROM job_analyze)),
                  ('history', (SELECT at FROM history))) d(duty, at)
"#;

/// Reads the due times (a statement of its own in the caller's transaction):
/// (duty name, seconds until due or None), in the order of `duties::DUTIES`.
/// DUE_SQL names operators unqualified: it runs only inside duty_due(), whose
/// search_path is pinned.
fn read() -> Vec<(String, Option<f64>)> {
    let s = |d: std::time::Duration| d.as_secs().min(i32::MAX as u64) as i32;
    let args = [
        (gucs::metadata_rotation_period_ms().min(i32::MAX as i64) as i32).into(),
        gucs::ledger_rotation_period_s().into(),
        gucs::job_log_rotation_period_s().into(),
        s(gucs::completed_job_retention()).into(),
        s(gucs::failed_job_retention()).into(),
        s(gucs::job_event_retention()).into(),
        s(gucs::analyze_interval()).into(),
    ];
    select_due(DUE_SQL, &args)
}

/// Runs `sql`, which yields (duty, due_in) rows; an ERROR propagates.
fn select_due(sql: &str, args: &[pgrx::datum::DatumWithOid]) -> Vec<(String, Option<f64>)> {
    Spi::connect(|c| {
        c.select(sql, None, args).map(|t| {
            t.map(|r| {
                (
                    r.get::<String>(1).ok().flatten().unwrap_or_default(),
                    r.get::<f64>(2).ok().flatten(),
                )
            })
            .collect()
        })
    })
    .unwrap_or_else(|e| pgrx::error!("{e}"))
}

/// The worker's read of the due times: through `pgque.duty_due()` (so
/// through its pinned search_path), in the caller's transaction. An ERROR
/// (a schema older than the library, without the function) propagates.
pub fn read_through_function() -> Vec<(String, Option<f64>)> {
    select_due("SELECT d.duty, d.due_in FROM pgque.duty_due() d", &[])
}

/// duty_due(): for each duty the worker runs, the seconds until it next has
/// work (0: now; NULL: nothing known in advance, left to the housekeeping
/// cadence). Reads the queues' and jobs' state; changes nothing.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn duty_due() -> TableIterator<'static, (name!(duty, String), name!(due_in, Option<f64>))> {
    TableIterator::new(read())
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn due(duty: &str) -> Option<f64> {
        Spi::get_one_with_args::<f64>(
            "SELECT due_in FROM pgque.duty_due() WHERE duty = $1",
            &[duty.into()],
        )
        .unwrap()
    }

    #[pg_test]
    fn duty_due_has_a_row_per_duty() {
        let n = Spi::get_one::<i64>("SELECT count(*) FROM pgque.duty_due()").unwrap();
        assert_eq!(n, Some(crate::worker::duties::DUTIES.len() as i64));
        for d in crate::worker::duties::DUTIES {
            let found = Spi::get_one_with_args::<bool>(
                "SELECT EXISTS (SELECT 1 FROM pgque.duty_due() WHERE duty = $1)",
                &[d.name.into()],
            )
            .unwrap();
            assert_eq!(found, Some(true), "{}", d.name);
        }
    }

    #[pg_test]
    fn a_delayed_event_and_a_scheduled_job_set_their_duties_due_time() {
        Spi::run("SELECT pgque.create_queue('dq')").unwrap();
        Spi::run(
            "SELECT pgque.send_at('dq', 't', 'x'::text, clock_timestamp() + interval '40 seconds')",
        )
        .unwrap();
        let d = due("delayed").expect("delayed is due");
        assert!((35.0..=40.0).contains(&d), "delayed due in {d} s");
        Spi::run("SELECT pgque.create_job_queue('dj')").unwrap();
        Spi::run(
            "SELECT pgque.enqueue('dj', 'k', '{}'::jsonb, 0, clock_timestamp() + interval '50 seconds')",
        )
        .unwrap();
        let j = due("job_maint").expect("job_maint is due");
        assert!((45.0..=50.0).contains(&j), "job_maint due in {j} s");
        // no schedule: nothing due (not 0, which would keep the worker busy)
        assert_eq!(due("schedules"), None);
        // a queue just created has no tick yet: the ticker is due now
        let t = due("ticker").expect("ticker is due");
        assert!(t < 1.0, "ticker due in {t} s");
    }
}
