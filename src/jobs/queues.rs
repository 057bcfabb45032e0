//! Job queue and actor administration (role pgque_admin). Not hot paths:
//! plain SPI with parameters, no SQL built from input.
use super::args::MAX_MAX_ATTEMPTS;
use crate::error::{self, raise, required, valid_name};
use pgrx::prelude::*;

const MODES: [&str; 2] = ["strict_fifo", "round_robin"];
pub const MAX_SHARDS: i32 = 64;

fn check_mode(mode: &str) {
    if !MODES.contains(&mode) {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!("mode must be 'strict_fifo' or 'round_robin', not {mode:?}"),
        );
    }
}

fn check_shards(shards: i32) {
    if !(1..=MAX_SHARDS).contains(&shards) {
        raise(
            error::OUT_OF_RANGE,
            format!("shards must be between 1 and {MAX_SHARDS}, not {shards}"),
        );
    }
}

/// Raises 42704 unless job queue `queue` exists.
pub fn require_queue(queue: &str) {
    let found = Spi::get_one_with_args::<bool>(
        "SELECT true FROM pgque.job_queues WHERE queue_name = $1",
        &[queue.into()],
    )
    .unwrap_or(None);
    if found.is_none() {
        raise(
            error::UNDEFINED_OBJECT,
            format!("job queue {queue:?} does not exist"),
        );
    }
}

/// Creates a job queue. Returns 1 when created, 0 when it existed already
/// (its settings are then left as they are).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn create_job_queue(
    queue_name: Option<&str>,
    mode: default!(Option<&str>, "'strict_fifo'"),
    shards: default!(Option<i32>, 1),
) -> i32 {
    let queue = valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    let mode = required(mode, "mode");
    check_mode(mode);
    let shards = required(shards, "shards");
    check_shards(shards);
    super::channel::refuse_shared_channel(queue, false);
    let created = Spi::get_one_with_args::<i32>(
        "WITH q AS (
             INSERT INTO pgque.job_queues (queue_name, mode, shards) VALUES ($1, $2, $3)
             ON CONFLICT (queue_name) DO NOTHING RETURNING queue_name),
         c AS (INSERT INTO pgque.job_rr_cursors (queue_name) SELECT queue_name FROM q
               ON CONFLICT (queue_name) DO NOTHING),
         -- the job log's lanes of priority 0, so that the first enqueue of
         -- the common kind is one statement too (other lanes are created
         -- by the first enqueue into them)
         l AS (INSERT INTO pgque.job_lanes (queue, priority, shard)
               SELECT q.queue_name, 0, s.shard FROM q, generate_series(0, $3 - 1) AS s(shard)
               ON CONFLICT DO NOTHING)
         SELECT count(*)::int FROM q",
        &[queue.into(), mode.into(), shards.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"))
    .unwrap_or(0);
    created
}

/// Drops a job queue with its jobs. Refused (55000) while it has scheduled,
/// ready or running jobs, unless `force`. Job events stay until their
/// retention sweep.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn drop_job_queue(queue_name: Option<&str>, force: default!(Option<bool>, false)) -> bool {
    let queue = valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    let force = required(force, "force");
    // Wait for in-flight enqueues into this queue (they hold the lock shared).
    Spi::run_with_args(
        crate::locks::sql("SELECT pgque.xact_lock($1, pg_catalog.hashtext($2))"),
        &[super::QUEUE_LOCK_CLASS.into(), queue.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
    let locked = Spi::get_one_with_args::<bool>(
        "SELECT true FROM pgque.job_queues WHERE queue_name = $1 FOR UPDATE",
        &[queue.into()],
    )
    .unwrap_or(None);
    if locked.is_none() {
        raise(
            error::UNDEFINED_OBJECT,
            format!("job queue {queue:?} does not exist"),
        );
    }
    if !force {
        // job_queue_status counts the log by its rows (job_log_jobs would
        // unpack every job of the log)
        let live = Spi::get_one_with_args::<i64>(
            "SELECT waiting + scheduled + ready + running FROM pgque.job_queue_status WHERE queue_name = $1",
            &[queue.into()],
        )
        .unwrap_or(None)
        .unwrap_or(0);
        if live > 0 {
            error::raise_detail(
                error::WRONG_STATE,
                format!("job queue {queue:?} has {live} unfinished jobs"),
                "Pass force => true to drop it with them.",
            );
        }
    }
    Spi::run_with_args(
        "WITH gone AS (DELETE FROM pgque.jobs WHERE queue = $1 RETURNING state, actor),
              per_actor AS (
                  SELECT actor, count(*)::int AS n FROM gone
                  WHERE state = 'running' AND actor IS NOT NULL GROUP BY actor),
              act AS (
                  UPDATE pgque.job_actors a SET running = greatest(a.running - p.n, 0)
                  FROM per_actor p WHERE a.actor = p.actor),
              ids AS (DELETE FROM pgque.job_running_identities WHERE queue = $1),
              cur AS (DELETE FROM pgque.job_rr_cursors WHERE queue_name = $1),
              -- the queue's log rows, claims and done rows leave with their
              -- segments (rotation skips rows whose lane is gone); its active
              -- claims are settled now, so that their tokens are stale and
              -- the lease rescue does not keep finding them
              lanes AS (DELETE FROM pgque.job_lanes WHERE queue = $1 RETURNING lane_id),
              holes AS (DELETE FROM pgque.job_log_holes h USING lanes l WHERE h.lane_id = l.lane_id),
              claims AS (UPDATE pgque.job_claims c SET state = 'd' FROM lanes l
                         WHERE c.lane_id = l.lane_id AND c.state = 'a')
         DELETE FROM pgque.job_queues WHERE queue_name = $1",
        &[queue.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
    true
}

/// A mode change, and the rr_key of the queue's unfinished jobs with it
/// (round-robin dispatch groups a job by rr_key, set only in round_robin
/// queues: sql/30_jobs.sql).
const MODE_SQL: &str = "
WITH q AS (
    UPDATE pgque.job_queues SET mode = coalesce($2, 'strict_fifo') WHERE queue_name = $1
    RETURNING mode
)
UPDATE pgque.jobs j
SET rr_key = CASE WHEN q.mode = 'round_robin' THEN COALESCE(j.fairness_key, '') END
FROM q
WHERE j.queue = $1 AND j.state IN ('scheduled', 'ready', 'running')
  AND j.rr_key IS DISTINCT FROM
      CASE WHEN q.mode = 'round_robin' THEN COALESCE(j.fairness_key, '') END";

/// Changes one setting of a job queue; a NULL value restores the default.
/// Changing the mode also regroups the queue's unfinished jobs for it (one
/// UPDATE of them, after waiting for the enqueues in flight; a switch to
/// round_robin moves the job log's ready jobs of the queue into pgque.jobs).
/// Parameters: max_attempts (25), lease (5 minutes), mode (strict_fifo),
/// shards (1), paused (false).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn set_job_queue_config(queue_name: Option<&str>, param: Option<&str>, value: Option<&str>) {
    let queue = valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    let param = required(param, "param");
    require_queue(queue);
    let (column_sql, value): (&str, Option<String>) = match param {
        "max_attempts" => {
            let v = value.map(|v| match v.trim().parse::<i32>() {
                Ok(n) if (1..=MAX_MAX_ATTEMPTS).contains(&n) => n.to_string(),
                Ok(n) => raise(
                    error::OUT_OF_RANGE,
                    format!("max_attempts must be between 1 and {MAX_MAX_ATTEMPTS}, not {n}"),
                ),
                Err(_) => raise(
                    error::INVALID_PARAMETER_VALUE,
                    format!("max_attempts must be an integer, not {v:?}"),
                ),
            });
            (
                "UPDATE pgque.job_queues SET max_attempts = coalesce($2::int, 25) WHERE queue_name = $1",
                v,
            )
        }
        "lease" => {
            if let Some(v) = value {
                check_interval(v, "lease");
            }
            (
                "UPDATE pgque.job_queues SET lease = coalesce($2::interval, interval '5 minutes') WHERE queue_name = $1",
                value.map(str::to_string),
            )
        }
        "mode" => {
            if let Some(v) = value {
                check_mode(v);
            }
            // Wait for the enqueues in flight (they hold the queue's lock
            // shared until they commit) so that the rr_key rewrite below,
            // run with a snapshot taken after the wait, sees their jobs.
            Spi::run_with_args(
                crate::locks::sql("SELECT pgque.xact_lock($1, pg_catalog.hashtext($2))"),
                &[super::QUEUE_LOCK_CLASS.into(), queue.into()],
            )
            .unwrap_or_else(|e| pgrx::error!("{e}"));
            (MODE_SQL, value.map(str::to_string))
        }
        "shards" => {
            let v = value.map(|v| match v.trim().parse::<i32>() {
                Ok(n) => {
                    check_shards(n);
                    n.to_string()
                }
                Err(_) => raise(
                    error::INVALID_PARAMETER_VALUE,
                    format!("shards must be an integer, not {v:?}"),
                ),
            });
            (
                "UPDATE pgque.job_queues SET shards = coalesce($2::int, 1) WHERE queue_name = $1",
                v,
            )
        }
        "paused" => {
            let v = value.map(|v| match v.trim().to_ascii_lowercase().as_str() {
                "true" | "on" | "yes" | "1" | "t" => "true".to_string(),
                "false" | "off" | "no" | "0" | "f" => "false".to_string(),
                _ => raise(
                    error::INVALID_PARAMETER_VALUE,
                    format!("paused must be a boolean, not {v:?}"),
                ),
            });
            (
                "UPDATE pgque.job_queues SET paused = coalesce($2::boolean, false) WHERE queue_name = $1",
                v,
            )
        }
        other => raise(
            error::INVALID_PARAMETER_VALUE,
            format!(
                "unknown job queue parameter {other:?}; known are max_attempts, lease, mode, shards, paused"
            ),
        ),
    };
    let to_round_robin = param == "mode" && value.as_deref() == Some("round_robin");
    Spi::run_with_args(column_sql, &[queue.into(), value.into()])
        .unwrap_or_else(|e| pgrx::error!("{e}"));
    if to_round_robin {
        // the fair walk needs the queue's backlog in pgque.jobs: the job
        // log's ready jobs move there (in their places), lanes locked
        super::log::require_read_committed("a switch to round_robin");
        // the rotation barrier first, as dispatch takes it (log/mod.rs)
        super::log::enter_log();
        Spi::run_with_args(
            crate::locks::sql(
                "SELECT count(pgque.xact_lock(1785684580, l.lane_id))
                 FROM (SELECT lane_id FROM pgque.job_lanes WHERE queue = $1 ORDER BY lane_id) l",
            ),
            &[queue.into()],
        )
        .unwrap_or_else(|e| pgrx::error!("{e}"));
        let sql = super::log::dispatch::fit(
            super::log::dispatch::SPILL_ALL_SQL,
            super::log::dispatch::SPILL_ALL_SQL_V07,
        );
        Spi::run_with_args(sql, &[queue.into()]).unwrap_or_else(|e| pgrx::error!("{e}"));
    }
}

/// Raises 22023 unless `v` is a positive, finite interval.
pub fn check_interval(v: &str, what: &str) {
    // The cast itself raises 22007 on text that is no interval at all.
    let ok = Spi::get_one_with_args::<bool>(
        "SELECT $1::interval > interval '0' AND $1::interval < interval '1000 years'",
        &[v.into()],
    )
    .unwrap_or(None)
    .unwrap_or(false);
    if !ok {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!("{what} must be a positive, finite interval, not {v:?}"),
        );
    }
}

fn set_paused(queue: &str, paused: bool) {
    require_queue(queue);
    Spi::run_with_args(
        "UPDATE pgque.job_queues SET paused = $2 WHERE queue_name = $1",
        &[queue.into(), paused.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
}

/// Stops dispatch from the queue (enqueue goes on; running jobs finish).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn pause_job_queue(queue_name: Option<&str>) {
    set_paused(
        valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME),
        true,
    );
}

/// Lets dispatch take jobs from the queue again.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn resume_job_queue(queue_name: Option<&str>) {
    set_paused(
        valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME),
        false,
    );
    crate::wake::at_commit();
    crate::wake::all_jobs_at_commit();
}

/// Caps how many of `actor`'s jobs may run at once (across all queues and
/// dispatchers); NULL removes the cap. Jobs already running are not touched.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn set_actor_capacity(actor: Option<&str>, max_concurrent: Option<i32>) {
    let actor = required(actor, "actor");
    if actor.is_empty() {
        raise(error::INVALID_NAME, "actor must not be empty");
    }
    if let Some(n) = max_concurrent {
        if n < 0 {
            raise(
                error::OUT_OF_RANGE,
                format!("max_concurrent must be >= 0 (or NULL for no cap), not {n}"),
            );
        }
    }
    Spi::run_with_args(
        "INSERT INTO pgque.job_actors (actor, max_concurrent) VALUES ($1, $2)
         ON CONFLICT (actor) DO UPDATE SET max_concurrent = excluded.max_concurrent",
        &[actor.into(), max_concurrent.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
}
