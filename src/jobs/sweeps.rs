//! The background worker's job duties, each one bounded per run and each a
//! SQL function of its own (manual mode, tests): lease rescue, promotion of
//! due scheduled jobs, the job_events retention sweep, pruning of terminal
//! jobs; `job_maint()` runs the four, `job_analyze()` refreshes statistics.
use super::log::stmt::{prepared, run_int, ty, with_generic_plans};
use crate::error::{self, raise, required};
use crate::gucs;
use pgrx::pg_sys;
use pgrx::prelude::*;

pub const MAX_BATCH: i32 = 100_000;

fn check_batch(n: Option<i32>) -> i32 {
    let n = required(n, "max_jobs");
    if !(1..=MAX_BATCH).contains(&n) {
        raise(
            error::OUT_OF_RANGE,
            format!("the batch size must be between 1 and {MAX_BATCH}, not {n}"),
        );
    }
    n
}

/// Expired leases: back to ready (the attempt stays counted) or, when it was
/// the last attempt, failed. SKIP LOCKED: a job a worker is completing right
/// now is left alone.
pub const RESCUE_SQL: &str = concat!(
    r#"WITH exp AS MATERIALIZED (
    SELECT j.id, j.attempt >= j.max_attempts AS exhausted
    FROM pgque.jobs j
    WHERE j.state = 'running' AND j.lease_until < clock_timestamp()
    ORDER BY j.lease_until
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
gone AS (
    UPDATE pgque.jobs j
    SET state = CASE WHEN e.exhausted THEN 'failed' ELSE 'ready' END,
        finished_at = CASE WHEN e.exhausted THEN now() END,
        lease_token = NULL, lease_until = NULL,
        errors = COALESCE(j.errors, '[]'::jsonb)
                 || jsonb_build_array(jsonb_build_object('attempt', j.attempt, 'at', now(),
                                                         'error', 'lease expired'))
    FROM exp e
    WHERE j.id = e.id
    RETURNING j.id, j.queue, j.actor, j.identity_key, j.attempt,
              'rescued'::text AS event,
              CASE WHEN j.state = 'failed' THEN 'failed: lease expired on the last attempt'
                   ELSE 'lease expired' END AS detail,
              j.state = 'failed' AND j.has_children AS failed_parent
),
"#,
    include_str!("release_tail.sql"),
    r#",
note AS (
    SELECT pg_catalog.pg_notify((CASE WHEN octet_length(q.queue) <= 52 THEN 'pgque_jobs_' || q.queue ELSE 'pgque_jobs_' || md5(q.queue) END), '')
    FROM (SELECT DISTINCT g.queue FROM gone g) q
)
SELECT (SELECT count(*)::int FROM gone), (SELECT count(*)::int FROM note),
       (SELECT array_agg(g.id) FROM gone g WHERE g.failed_parent)"#
);

/// Due scheduled jobs become ready. A job that never was ready takes its
/// ready_seq now, under its lane's lock (lane FIFO, as at enqueue); a
/// retried or snoozed one keeps its place. The lane lock is only tried: a
/// lane an open enqueue transaction holds keeps its due jobs scheduled until
/// the next run (the duty never waits on a caller's transaction).
pub const PROMOTE_SQL: &str = r#"
WITH due AS MATERIALIZED (
    SELECT j.id, j.queue, j.ready_seq, j.run_at,
           pg_catalog.hashtext(j.queue || '/' || j.priority || '/' || j.shard) AS lane_key
    FROM pgque.jobs j
    WHERE j.state = 'scheduled' AND j.run_at <= now()
    ORDER BY j.run_at, j.id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
lanes AS MATERIALIZED (
    SELECT l.lane_key, pgque.try_xact_lock(1785684588, l.lane_key) AS ok
    FROM (SELECT DISTINCT d.lane_key FROM due d WHERE d.ready_seq IS NULL ORDER BY 1) l
),
numbered AS MATERIALIZED (
    SELECT s.id, s.queue,
           COALESCE(s.ready_seq, pg_catalog.nextval('pgque.jobs_id_seq')) AS ready_seq
    FROM (SELECT d.* FROM due d
          WHERE d.ready_seq IS NOT NULL
             OR d.lane_key = ANY (ARRAY(SELECT l.lane_key FROM lanes l WHERE l.ok))
          ORDER BY d.run_at, d.id) s
),
upd AS (
    UPDATE pgque.jobs j SET state = 'ready', ready_seq = n.ready_seq
    FROM numbered n
    WHERE j.id = ANY (ARRAY(SELECT n2.id FROM numbered n2)) AND j.id = n.id
    RETURNING j.id, j.queue, j.attempt
),
ev AS (
    INSERT INTO pgque.job_events (job_ids, queue, event, attempt)
    SELECT array_agg(u.id ORDER BY u.id), u.queue, 'promoted', u.attempt
    FROM upd u
    GROUP BY u.queue, u.attempt
),
note AS (
    SELECT pg_catalog.pg_notify((CASE WHEN octet_length(q.queue) <= 52 THEN 'pgque_jobs_' || q.queue ELSE 'pgque_jobs_' || md5(q.queue) END), '')
    FROM (SELECT DISTINCT u.queue FROM upd u) q
)
SELECT (SELECT count(*)::int FROM upd), (SELECT count(*)::int FROM note)
"#;

/// Oldest-first, bounded: the ctids of at most $2 events older than the
/// retention $1 (an index range scan on (at, id)), deleted by ctid.
pub const SWEEP_EVENTS_SQL: &str = r#"
WITH gone AS (
    DELETE FROM pgque.job_events e
    WHERE e.ctid = ANY (ARRAY(
        SELECT x.ctid FROM pgque.job_events x
        WHERE x.at < now() - $1::interval
        ORDER BY x.at, x.id
        LIMIT $2))
      AND e.at < now() - $1::interval
    RETURNING 1
)
SELECT count(*)::int FROM gone
"#;

/// Terminal jobs past their retention ($1 completed/cancelled, $2 failed),
/// oldest first, at most $3 per state per run.
pub const PRUNE_SQL: &str = r#"
WITH victims AS MATERIALIZED (
    (SELECT j.id FROM pgque.jobs j
     WHERE j.state = 'completed' AND j.finished_at < now() - $1::interval
     ORDER BY j.finished_at LIMIT $3)
    UNION ALL
    (SELECT j.id FROM pgque.jobs j
     WHERE j.state = 'cancelled' AND j.finished_at < now() - $1::interval
     ORDER BY j.finished_at LIMIT $3)
    UNION ALL
    (SELECT j.id FROM pgque.jobs j
     WHERE j.state = 'failed' AND j.finished_at < now() - $2::interval
     ORDER BY j.finished_at LIMIT $3)
),
gone AS (
    DELETE FROM pgque.jobs j
    WHERE j.id = ANY (ARRAY(SELECT v.id FROM victims v))
      AND j.state IN ('completed', 'cancelled', 'failed')
    RETURNING j.id
),
-- a pruned job's edges to its parents go with it
deps AS (
    DELETE FROM pgque.job_deps d WHERE d.child_id = ANY (ARRAY(SELECT g.id FROM gone g))
)
SELECT count(*)::int FROM gone
"#;

fn interval_arg(d: std::time::Duration) -> String {
    format!("{} seconds", d.as_secs())
}

/// Rescues up to `max_jobs` jobs whose lease expired. Returns how many.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn rescue_expired_leases(max_jobs: default!(Option<i32>, 1000)) -> i32 {
    let n = check_batch(max_jobs);
    // the log's expired claims first: their unfinished jobs become running
    // rows of pgque.jobs with the expired lease, which the statement below
    // then rescues like any other
    super::log::rotate::rescue_claims(n);
    let (rescued, failed_parents) = with_generic_plans(|| {
        Spi::connect_mut(|client| {
            let stmt = prepared(client, RESCUE_SQL, &[ty(pg_sys::INT4OID)]);
            let t = client
                .update(stmt, None, &[n.into()])
                .unwrap_or_else(|e| pgrx::error!("{e}"));
            let r = t.first();
            (
                r.get::<i32>(1).ok().flatten().unwrap_or(0),
                r.get::<Vec<i64>>(3).ok().flatten(),
            )
        })
    });
    if let Some(p) = failed_parents {
        // parents in a flow that failed on their last attempt
        super::flows::propagate(p, "failed");
    }
    if rescued > 0 {
        // rescued jobs are ready again: waiting dispatchers look
        crate::wake::all_jobs_at_commit();
    }
    rescued
}

/// Makes up to `max_jobs` due scheduled jobs ready. Returns how many.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn promote_scheduled_jobs(max_jobs: default!(Option<i32>, 1000)) -> i32 {
    let n = check_batch(max_jobs);
    let promoted = run_int(PROMOTE_SQL, &[ty(pg_sys::INT4OID)], vec![n.into()]);
    if promoted > 0 {
        crate::wake::all_jobs_at_commit();
    }
    promoted
}

/// Deletes up to `max_events` job events older than pgque.job_event_retention
/// (0 keeps them forever). Returns how many.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn sweep_job_events(max_events: default!(Option<i32>, 10000)) -> i32 {
    let n = check_batch(max_events);
    let retention = gucs::job_event_retention();
    if retention.is_zero() {
        return 0;
    }
    run_int(
        SWEEP_EVENTS_SQL,
        &[ty(pg_sys::TEXTOID), ty(pg_sys::INT4OID)],
        vec![interval_arg(retention).into(), n.into()],
    )
}

/// Deletes up to `max_jobs` (per terminal state) completed/cancelled jobs
/// older than pgque.completed_job_retention and failed jobs older than
/// pgque.failed_job_retention. Returns how many.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn prune_jobs(max_jobs: default!(Option<i32>, 10000)) -> i32 {
    let n = check_batch(max_jobs);
    run_int(
        PRUNE_SQL,
        &[
            ty(pg_sys::TEXTOID),
            ty(pg_sys::TEXTOID),
            ty(pg_sys::INT4OID),
        ],
        vec![
            interval_arg(gucs::completed_job_retention()).into(),
            interval_arg(gucs::failed_job_retention()).into(),
            n.into(),
        ],
    )
}

/// One maintenance pass (the worker runs it every pgque.job_maint_period_ms):
/// rescue, promotion, event sweep, prune, each bounded. Returns one row: what
/// each did.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn job_maint() -> TableIterator<
    'static,
    (
        name!(rescued, i32),
        name!(promoted, i32),
        name!(events_swept, i32),
        name!(pruned, i32),
    ),
> {
    // jobs enqueued behind existing jobs since the last run (flows.rs)
    super::flows::link_late(1000);
    let rescued = rescue_expired_leases(Some(1000));
    let promoted = promote_scheduled_jobs(Some(1000));
    let events_swept = sweep_job_events(Some(10000));
    let pruned = prune_jobs(Some(10000));
    TableIterator::once((rescued, promoted, events_swept, pruned))
}

/// The small, update-hot control tables: their row counts never reach
/// autovacuum's analyze threshold, so their statistics would stay at the
/// planner's defaults, which pushes the dispatch joins off the index paths.
pub const ANALYZED_TABLES: [&str; 4] = [
    "pgque.job_queues",
    "pgque.job_actors",
    "pgque.job_rr_cursors",
    "pgque.job_running_identities",
];

/// Refreshes statistics of the job tables autovacuum does not analyze well
/// (the worker runs it every pgque.analyze_interval). SKIP_LOCKED: a table
/// being vacuumed is left for the next run. Returns the tables analyzed.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn job_analyze() -> i32 {
    Spi::run(&format!(
        "ANALYZE (SKIP_LOCKED) {}",
        ANALYZED_TABLES.join(", ")
    ))
    .unwrap_or_else(|e| pgrx::error!("{e}"));
    Spi::run("UPDATE pgque.job_maint_state SET last_analyze_at = now()")
        .unwrap_or_else(|e| pgrx::error!("{e}"));
    ANALYZED_TABLES.len() as i32
}
