//! `dispatch`: claim up to `limit` ready jobs under a lease (the job log first,
//! src/jobs/log/dispatch.rs; then pgque.jobs, in one statement, below).
//!
//! DISPATCH_SQL is built so that its cost is O(limit) whatever the backlog
//! depth and whatever plan the planner picks, custom or generic (the lessons
//! of TaskQ's depth spike, seeds/004):
//! - every candidate walk is a correlated LATERAL over an index in dispatch
//!   order, stopped by `LIMIT $2 * $5` (a parameter, never a subquery, so a
//!   generic plan cannot turn it into "2 rows");
//! - the round-robin key walk is a recursive loose index scan that visits at
//!   most `limit * oversample` distinct fairness keys, starting after the
//!   queue's cursor and wrapping around, one index seek per key;
//! - the candidates are materialised and ranked (a few hundred rows), then
//!   locked one by one through a correlated probe by ctid (a TID scan)
//!   `FOR UPDATE SKIP LOCKED` whose locked version must be `ready`, stopping
//!   at `limit` locked rows;
//! - planned without sequential and bitmap scans (stmt::with_generic_plans):
//!   a generic plan made while the table was tiny must not stay a table scan.
//! - the terminal UPDATE finds its rows by `ctid = ANY(ARRAY(...))` (the
//!   locked versions, a TID scan), an array built once, so no join can reopen
//!   a scan of the backlog and no index is descended (a job updated and rolled
//!   back many times has many primary-key entries to step over);
//!
//! Admission:
//! - per-actor capacity: the candidates' actor rows are locked FOR UPDATE in
//!   actor order before admission is computed. A locked row is read in its
//!   latest committed version (READ COMMITTED re-reads a row it had to wait
//!   for), so `running` includes what a concurrent dispatcher just claimed,
//!   and the counter is raised in the same statement: concurrent dispatchers
//!   serialise per actor and never over-admit.
//! - identity keys: at most one candidate per (queue, identity) per call, none
//!   whose identity has a running job, and the claim itself is an INSERT ...
//!   ON CONFLICT DO NOTHING into job_running_identities, which waits for a
//!   concurrent claimer's outcome: two dispatchers never both win.
//! - paused queues are skipped; lanes stay FIFO because each queue is walked
//!   in (priority, ready_seq) order and ready_seq follows commit order per lane.
use super::log;
use super::log::jobrows::{JobRows, RawRow};
use super::log::stmt::{prepared, ty, with_generic_plans};
use crate::error::{self, raise, required};
use pgrx::datum::{DatumWithOid, Interval};
use pgrx::pg_sys;
use pgrx::prelude::*;

pub const MAX_LIMIT: i32 = 10_000;
pub const MAX_OVERSAMPLE: i32 = 100;

/// DISPATCH_SQL's text, with the actor rate limits' two pieces (src/jobs/rate.rs)
/// as holes: `$rate_left`, an actor's whole tokens (NULL: no limit) in
/// actor_locks, and `$debit`, more SET clauses of the `act` UPDATE; and
/// `$headers`, the jobs' headers column (NULL::jsonb on a schema without it).
macro_rules! dispatch_sql {
    ($rate_left:expr, $debit:expr, $headers:expr) => {
        concat!(
    crate::dispatch_queues!(),
    r#"
-- strict FIFO: the first limit*oversample ready jobs of each queue, in order.
-- For a round-robin queue the same walk is the filler ranked after every
-- round-robin candidate: it keeps a dispatch full when the visited keys
-- run short of jobs.
fifo AS MATERIALIZED (
    SELECT c.id, c.tid, c.actor, c.identity_key, qs.queue_name, qs.pos,
           CASE WHEN qs.mode = 'strict_fifo' THEN c.rn ELSE 1000000000 + c.rn END AS qrank,
           NULL::text AS k
    FROM qs
    CROSS JOIN LATERAL (
        SELECT j.id, j.ctid AS tid, j.actor, j.identity_key,
               row_number() OVER (ORDER BY j.priority, j.ready_seq) AS rn
        FROM pgque.jobs j
        WHERE j.queue = qs.queue_name AND j.state = 'ready'
        ORDER BY j.priority, j.ready_seq
        LIMIT $2 * $5
    ) c
),
rrq AS MATERIALIZED (
    SELECT qs.queue_name, qs.pos, COALESCE(cur.last_key, '') AS cursor
    FROM qs
    LEFT JOIN pgque.job_rr_cursors cur ON cur.queue_name = qs.queue_name
    WHERE qs.mode = 'round_robin'
),
-- round robin: the distinct fairness keys after the cursor, then from the
-- start up to the cursor; at most limit*oversample keys, one seek each.
-- rr_key is the job's key as a round-robin queue groups it
-- (COALESCE(fairness_key, '')), NULL in a strict_fifo queue, whose jobs
-- therefore cost no entry in the round-robin index. A job whose rr_key is
-- NULL in a round-robin queue (enqueued by a statement that started before
-- a mode change committed) is still dispatched, by the FIFO filler walk.
keys (queue_name, pos, cursor, k, n, phase) AS (
    SELECT rrq.queue_name, rrq.pos, rrq.cursor, f.k, 1, f.phase
    FROM rrq
    CROSS JOIN LATERAL (
        SELECT s.k, s.phase FROM (
            (SELECT j.rr_key AS k, 0 AS phase
             FROM pgque.jobs j
             WHERE j.queue = rrq.queue_name AND j.state = 'ready'
               AND j.rr_key > rrq.cursor
             ORDER BY j.rr_key
             LIMIT 1)
            UNION ALL
            (SELECT j.rr_key AS k, 1 AS phase
             FROM pgque.jobs j
             WHERE j.queue = rrq.queue_name AND j.state = 'ready' AND j.rr_key IS NOT NULL
             ORDER BY j.rr_key
             LIMIT 1)
        ) s
        LIMIT 1
    ) f
    UNION ALL
    SELECT keys.queue_name, keys.pos, keys.cursor, f.k, keys.n + 1, f.phase
    FROM keys
    CROSS JOIN LATERAL (
        SELECT s.k, s.phase FROM (
            (SELECT j.rr_key AS k, keys.phase AS phase
             FROM pgque.jobs j
             WHERE j.queue = keys.queue_name AND j.state = 'ready'
               AND j.rr_key > keys.k
               AND (keys.phase = 0 OR j.rr_key <= keys.cursor)
             ORDER BY j.rr_key
             LIMIT 1)
            UNION ALL
            (SELECT j.rr_key AS k, 1 AS phase
             FROM pgque.jobs j
             WHERE keys.phase = 0 AND j.queue = keys.queue_name AND j.state = 'ready'
               AND j.rr_key <= keys.cursor
             ORDER BY j.rr_key
             LIMIT 1)
        ) s
        LIMIT 1
    ) f
    WHERE keys.n < $2 * $5
),
keyed AS MATERIALIZED (
    SELECT keys.queue_name, keys.pos, keys.k, keys.n,
           count(*) OVER (PARTITION BY keys.queue_name) AS nkeys
    FROM keys
),
-- each visited key's head, (limit*oversample)/keys jobs per key ...
rr_heads AS MATERIALIZED (
    SELECT c.id, c.tid, c.actor, c.identity_key, kq.queue_name, kq.pos, kq.k, kq.n,
           kq.nkeys, c.priority, c.ready_seq
    FROM keyed kq
    CROSS JOIN LATERAL (
        SELECT j.id, j.ctid AS tid, j.actor, j.identity_key, j.priority, j.ready_seq
        FROM pgque.jobs j
        WHERE j.queue = kq.queue_name AND j.state = 'ready'
          AND j.rr_key = kq.k
        ORDER BY j.priority, j.ready_seq
        LIMIT ($2 * $5 + kq.nkeys - 1) / kq.nkeys
    ) c
),
-- ... ranked (round - 1) * keys + key position: round-robin order. One window
-- over the few hundred heads, not one window per key inside the lateral
-- (that was a WindowAgg rescan per visited key, most of the statement's time).
rr AS MATERIALIZED (
    SELECT h.id, h.tid, h.actor, h.identity_key, h.queue_name, h.pos,
           (row_number() OVER (PARTITION BY h.queue_name, h.k
                               ORDER BY h.priority, h.ready_seq) - 1) * h.nkeys + h.n AS qrank,
           h.k
    FROM rr_heads h
),
-- a job found by both walks keeps its better (round-robin) rank.
cand AS MATERIALIZED (
    SELECT DISTINCT ON (u.id) u.*
    FROM (SELECT * FROM fifo UNION ALL SELECT * FROM rr) u
    ORDER BY u.id, u.qrank
),
-- identity: one candidate per (queue, identity), none whose identity runs.
ident_ok AS MATERIALIZED (
    SELECT c.*
    FROM (SELECT c.*,
                 row_number() OVER (PARTITION BY c.queue_name, c.identity_key
                                    ORDER BY c.qrank, c.pos) AS ident_rank
          FROM cand c) c
    WHERE c.identity_key IS NULL
       OR (c.ident_rank = 1
           AND NOT EXISTS (SELECT 1 FROM pgque.job_running_identities ri
                           WHERE ri.queue = c.queue_name AND ri.identity_key = c.identity_key))
),
-- the candidates' actors, locked in actor order, read in their latest version,
-- with the whole tokens of their rate limit (src/jobs/rate.rs; NULL: none).
actor_locks AS MATERIALIZED (
    SELECT a.actor, a.max_concurrent, a.running,
           "#,
    $rate_left,
    r#" AS rate_left
    FROM pgque.job_actors a
    WHERE a.actor = ANY (ARRAY(SELECT DISTINCT i.actor FROM ident_ok i WHERE i.actor IS NOT NULL))
    ORDER BY a.actor
    FOR UPDATE
),
-- the locked actors as one jsonb object (actor -> [max_concurrent, running,
-- rate_left]):
-- each candidate looks its actor up in O(log actors); a join of the two
-- CTEs could be planned as a nested loop, O(candidates x actors).
actor_map AS MATERIALIZED (
    SELECT COALESCE(jsonb_object_agg(al.actor, jsonb_build_array(al.max_concurrent, al.running,
                                                                  al.rate_left)),
                    '{}'::jsonb) AS m
    FROM actor_locks al
),
admitted AS MATERIALIZED (
    SELECT r.id, r.tid, r.actor, r.identity_key, r.queue_name, r.pos, r.qrank, r.k
    FROM (SELECT i.*,
                 (am.m -> i.actor ->> 0)::int AS max_concurrent,
                 (am.m -> i.actor ->> 1)::int AS running,
                 (am.m -> i.actor ->> 2)::int AS rate_left,
                 row_number() OVER (PARTITION BY i.actor ORDER BY i.qrank, i.pos) AS actor_rank
          FROM ident_ok i
          CROSS JOIN actor_map am) r
    WHERE r.actor IS NULL
       OR ((r.max_concurrent IS NULL OR r.actor_rank <= r.max_concurrent - r.running)
           AND (r.rate_left IS NULL OR r.actor_rank <= r.rate_left))
    ORDER BY r.qrank, r.pos
),
-- lock in rank order, skipping rows another dispatcher holds, stop at limit.
-- The probe goes to the candidate's tuple by its ctid (a TID scan: no index
-- descent, and nothing a plan could turn into a walk over a partial index on
-- state, as `id = a.id AND state = 'ready'` could). The ctid is safe: our
-- snapshot saw that version, so it cannot have been vacuumed away and its
-- slot reused; if it was updated since, the lock follows the update chain to
-- the latest version, which is then not 'ready' (every update of a ready job
-- takes it out of ready) or, on versions whose TID scan rechecks the ctid,
-- not returned at all. The LIMIT 1 keeps the outer checks out of the probe.
-- `tid` is the locked version's ctid, which the UPDATE below goes to.
locked AS MATERIALIZED (
    SELECT a.id, l.tid, a.actor, a.identity_key, a.queue_name, a.pos, a.qrank, a.k
    FROM admitted a
    CROSS JOIN LATERAL (
        SELECT j.id, j.state, j.ctid AS tid FROM pgque.jobs j
        WHERE j.ctid = a.tid
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) l
    WHERE l.state = 'ready' AND l.id = a.id
    LIMIT $2
),
idc AS (
    INSERT INTO pgque.job_running_identities (queue, identity_key, job_id)
    SELECT l.queue_name, l.identity_key, l.id FROM locked l
    WHERE l.identity_key IS NOT NULL
    ORDER BY l.queue_name, l.identity_key
    ON CONFLICT DO NOTHING
    RETURNING job_id
),
final AS MATERIALIZED (
    SELECT l.* FROM locked l
    WHERE l.identity_key IS NULL OR l.id = ANY (ARRAY(SELECT idc.job_id FROM idc))
),
upd AS (
    UPDATE pgque.jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        worker = $3,
        lease_token = pg_catalog.nextval('pgque.job_lease_token_seq'),
        lease_until = pg_catalog.clock_timestamp()
                      + (SELECT qs.lease FROM qs WHERE qs.queue_name = j.queue),
        dispatched_at = now()
    WHERE j.ctid = ANY (ARRAY(SELECT f.tid FROM final f))
    RETURNING j.id, j.queue, j.kind, j.args, j.priority, j.attempt, j.max_attempts, j.actor,
              j.fairness_key, j.identity_key, j.run_at, j.enqueued_at, j.lease_token,
              j.lease_until, "#,
    $headers,
    r#" AS headers
),
per_actor AS MATERIALIZED (
    SELECT COALESCE(jsonb_object_agg(x.actor, x.n), '{}'::jsonb) AS m
    FROM (SELECT u.actor, count(*)::int AS n FROM upd u
          WHERE u.actor IS NOT NULL GROUP BY u.actor) x
),
-- raises `running` and takes the claimed jobs' tokens (the rows are locked)
act AS (
    UPDATE pgque.job_actors a SET running = a.running + (p.m ->> a.actor)::int"#,
    $debit,
    r#"
    FROM per_actor p
    WHERE a.actor = ANY (ARRAY(SELECT jsonb_object_keys(p2.m) FROM per_actor p2))
),
-- one event row per queue and attempt number for the claimed jobs
ev AS (
    INSERT INTO pgque.job_events (job_ids, queue, event, attempt, detail)
    SELECT array_agg(u.id ORDER BY u.id), u.queue, 'dispatched', u.attempt, $3
    FROM upd u
    GROUP BY u.queue, u.attempt
),
cur_lock AS MATERIALIZED (
    SELECT c.queue_name FROM pgque.job_rr_cursors c
    WHERE c.queue_name = ANY (ARRAY(SELECT rrq.queue_name FROM rrq))
    FOR UPDATE SKIP LOCKED
),
cur AS (
    UPDATE pgque.job_rr_cursors c SET last_key = lk.k
    FROM (SELECT DISTINCT ON (f.queue_name) f.queue_name, f.k
          FROM final f WHERE f.k IS NOT NULL
          ORDER BY f.queue_name, f.qrank DESC) lk
    WHERE c.queue_name = lk.queue_name
      AND c.queue_name = ANY (ARRAY(SELECT cl.queue_name FROM cur_lock cl))
),
-- dispatch order, looked up per row in one jsonb object (no join of CTEs)
rank_map AS MATERIALIZED (
    SELECT jsonb_object_agg(f.id::text, jsonb_build_array(f.qrank, f.pos)) AS m FROM final f
)
SELECT u.id, u.queue, u.kind, u.args, u.priority, u.attempt, u.max_attempts, u.actor,
       u.fairness_key, u.identity_key, u.run_at, u.enqueued_at, u.lease_token, u.lease_until,
       u.headers
FROM upd u
CROSS JOIN rank_map rm
ORDER BY (rm.m -> u.id::text ->> 0)::bigint, (rm.m -> u.id::text ->> 1)::bigint
"#
        )
    };
}

/// The actor rate limits' pieces of DISPATCH_SQL (`$rate_left`, `$debit`).
macro_rules! rated_dispatch_sql {
    ($headers:expr) => {
        dispatch_sql!(
            concat!(
                "CASE WHEN a.rate_jobs IS NOT NULL THEN floor(",
                crate::refill!(a, rate_jobs, rate_per, rate_burst),
                ")::int END"
            ),
            concat!(
                ",
        tokens = CASE WHEN a.rate_jobs IS NULL THEN a.tokens ELSE GREATEST(0, ",
                crate::refill!(a, rate_jobs, rate_per, rate_burst),
                " - (p.m ->> a.actor)::int) END,
        refilled_at = CASE WHEN a.rate_jobs IS NULL THEN a.refilled_at
                           ELSE GREATEST(a.refilled_at, statement_timestamp()) END"
            ),
            $headers
        )
    };
}

pub const DISPATCH_SQL: &str = rated_dispatch_sql!("j.headers");

/// DISPATCH_SQL for a schema from before job headers (0.7.0: the library is
/// updated before ALTER EXTENSION UPDATE runs).
pub const DISPATCH_SQL_NO_HEADERS: &str = rated_dispatch_sql!("NULL::jsonb");

/// DISPATCH_SQL for a schema from before rate limits (0.6.0 and older): no
/// actor buckets, no headers.
pub const DISPATCH_SQL_NO_RATE: &str = dispatch_sql!("NULL::int", "", "NULL::jsonb");

pub fn arg_types() -> [pgrx::pg_sys::PgOid; 5] {
    [
        ty(pg_sys::TEXTARRAYOID),
        ty(pg_sys::INT4OID),
        ty(pg_sys::TEXTOID),
        ty(pg_sys::INTERVALOID),
        ty(pg_sys::INT4OID),
    ]
}

/// Claims up to `limit` ready jobs from `queues` for `worker`, each under a
/// lease of `lease` (default: the queue's), in one call: a few statements
/// for the job log's lanes (src/jobs/log/dispatch.rs), one for pgque.jobs
/// (DISPATCH_SQL), which the log's jobs join only when they must be ranked
/// against its ready jobs. Looks at most
/// `limit * oversample` candidates per queue, so jobs skipped for capacity,
/// identity or a concurrent dispatcher's lock can be made up for.
/// Returns the claimed jobs in dispatch order; `lease_token` fences every
/// later call about the attempt.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn dispatch(
    queues: Option<Vec<Option<String>>>,
    limit: Option<i32>,
    worker: Option<&str>,
    lease: default!(Option<Interval>, "NULL"),
    oversample: default!(Option<i32>, 2),
) -> JobRows {
    JobRows(Call::new(queues, limit, worker, lease, oversample).run())
}

/// A dispatch call's arguments, checked (Call::new raises their errors).
pub(crate) struct Call<'a> {
    pub names: Vec<String>,
    limit: i32,
    worker: &'a str,
    lease: Option<Interval>,
    oversample: i32,
}

impl<'a> Call<'a> {
    /// Checks dispatch's arguments: 22004 for a NULL, 22023 / 22003 / 42602
    /// / 42622 for bad values, as documented for dispatch.
    pub(crate) fn new(
        queues: Option<Vec<Option<String>>>,
        limit: Option<i32>,
        worker: Option<&'a str>,
        lease: Option<Interval>,
        oversample: Option<i32>,
    ) -> Call<'a> {
        let queues = required(queues, "queues");
        if queues.is_empty() {
            raise(error::INVALID_PARAMETER_VALUE, "queues must not be empty");
        }
        // Same rules as create_job_queue: 22004 NULL, 42602 bad, 42622 too long.
        for q in &queues {
            error::valid_name(q.as_deref(), "queue name", error::MAX_QUEUE_NAME);
        }
        let limit = required(limit, "limit");
        if !(1..=MAX_LIMIT).contains(&limit) {
            raise(
                error::OUT_OF_RANGE,
                format!("limit must be between 1 and {MAX_LIMIT}, not {limit}"),
            );
        }
        let worker = required(worker, "worker");
        if worker.is_empty() {
            raise(error::INVALID_NAME, "worker must not be empty");
        }
        if worker.len() > error::MAX_CONSUMER_NAME {
            raise(
                error::NAME_TOO_LONG,
                format!(
                    "worker is {} bytes long; the limit is {}",
                    worker.len(),
                    error::MAX_CONSUMER_NAME
                ),
            );
        }
        let oversample = required(oversample, "oversample");
        if !(1..=MAX_OVERSAMPLE).contains(&oversample) {
            raise(
                error::OUT_OF_RANGE,
                format!("oversample must be between 1 and {MAX_OVERSAMPLE}, not {oversample}"),
            );
        }
        if let Some(l) = &lease {
            super::args::check_positive_interval(l, "lease");
        }
        let names: Vec<String> = queues.into_iter().flatten().collect();
        Call {
            names,
            limit,
            worker,
            lease,
            oversample,
        }
    }

    /// Claims the jobs (dispatch's body); returns them in dispatch order.
    pub(crate) fn run(&self) -> Vec<RawRow> {
        let Call {
            names,
            limit,
            worker,
            lease,
            oversample,
        } = self;
        let (names, limit, worker, lease, oversample) =
            (names, *limit, *worker, *lease, *oversample);
        let mut out = Vec::new();
        with_generic_plans(|| {
            Spi::connect_mut(|client| {
                let args = |lanes: Option<Vec<i32>>| -> Vec<DatumWithOid<'_>> {
                    let mut a: Vec<DatumWithOid<'_>> = vec![
                        names.clone().into(),
                        limit.into(),
                        worker.into(),
                        lease.into(),
                        oversample.into(),
                    ];
                    if let Some(l) = lanes {
                        a[4] = l.into();
                    }
                    a
                };
                // The job log first. Its rotation barrier, shared, before any
                // lane lock and any statement that reads the log (log/mod.rs):
                // a lock, not a statement, so the fast path keeps its count.
                log::enter_log();
                // Its lanes of these queues: the one lane locked, or the lanes
                // to test for ready jobs.
                let rated = super::rate::schema_has_rate_limits();
                let lock = prepared(
                    client,
                    if rated {
                        log::dispatch::LOCK_LANES_SQL
                    } else {
                        log::dispatch::LOCK_LANES_SQL_NO_RATE
                    },
                    &[ty(pg_sys::TEXTARRAYOID)],
                );
                let locked = client
                    .update(lock, None, &[names.clone().into()])
                    .unwrap_or_else(|e| pgrx::error!("{e}"))
                    .first();
                let mut lanes: Vec<i32> =
                    locked.get::<Vec<i32>>(1).ok().flatten().unwrap_or_default();
                let several: Option<Vec<i32>> = locked.get::<Vec<i32>>(5).ok().flatten();
                // ---- rate limits (issue 18, src/jobs/rate.rs): the call takes
                // at most the emptiest bucket's whole tokens, debited below.
                let limited: Vec<String> = locked
                    .get::<Vec<String>>(3)
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                let tids: Vec<String> = locked
                    .get::<Vec<String>>(4)
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                let limit = match locked.get::<i32>(2).ok().flatten() {
                    Some(tokens) if !limited.is_empty() => limit.min(tokens.max(0)),
                    _ => limit,
                };
                if limit == 0 {
                    return;
                }
                if let Some(several) = several {
                    // only the lanes that can have a ready job are locked and read
                    let stmt = prepared(
                        client,
                        log::dispatch::READY_LANES_SQL,
                        &[ty(pg_sys::INT4ARRAYOID), ty(pg_sys::TEXTARRAYOID)],
                    );
                    let ready = client
                        .update(stmt, None, &[several.into(), names.clone().into()])
                        .unwrap_or_else(|e| pgrx::error!("{e}"))
                        .first();
                    lanes = ready.get::<Vec<i32>>(1).ok().flatten().unwrap_or_default();
                    let jobs_ready = ready.get::<bool>(2).ok().flatten().unwrap_or(true);
                    if lanes.is_empty() && !jobs_ready {
                        // an idle poll of queues with several lanes: two probes
                        // a lane, no DISPATCH_SQL (as before lanes were tested)
                        return;
                    }
                }
                let args = |lanes: Option<Vec<i32>>| -> Vec<DatumWithOid<'_>> {
                    let mut a = args(lanes);
                    a[1] = limit.into();
                    a
                };
                let run = |client: &mut pgrx::spi::SpiClient<'_>| {
                    if !lanes.is_empty() {
                        log::require_read_committed("dispatch");
                        let blocked = if let [lane] = lanes[..] {
                            log::dispatch_one::dispatch_one(
                                client, names, lane, limit, worker, lease, &mut out,
                            )
                        } else {
                            let sql = log::dispatch::fit(
                                log::dispatch::LOG_DISPATCH_SQL,
                                log::dispatch::LOG_DISPATCH_SQL_V07,
                            );
                            let stmt = prepared(client, sql, &log_arg_types());
                            let table = client
                                .update(stmt, None, &args(Some(lanes.clone())))
                                .unwrap_or_else(|e| pgrx::error!("{e}"));
                            unsafe { take_rows(table.len(), &mut out) }
                        };
                        if !blocked {
                            return;
                        }
                        let sql = log::dispatch::fit(
                            log::dispatch::LOG_SPILL_SQL,
                            log::dispatch::LOG_SPILL_SQL_V07,
                        );
                        let spill = prepared(client, sql, &log_arg_types());
                        client
                            .update(spill, None, &args(Some(lanes)))
                            .unwrap_or_else(|e| pgrx::error!("{e}"));
                    }
                    let sql = if !rated {
                        DISPATCH_SQL_NO_RATE
                    } else if crate::headers::jobs_have_headers() {
                        DISPATCH_SQL
                    } else {
                        DISPATCH_SQL_NO_HEADERS
                    };
                    let stmt = prepared(client, sql, &arg_types());
                    let table = client
                        .update(stmt, None, &args(None))
                        .unwrap_or_else(|e| pgrx::error!("{e}"));
                    unsafe { take_rows(table.len(), &mut out) };
                };
                run(client);
                if !limited.is_empty() {
                    super::rate::debit(client, &limited, &tids, &out);
                }
            })
        });
        // Unknown queue names are an error (a typo must not look like an empty
        // queue); checked only when nothing was dispatched, so the busy path
        // stays one statement.
        if out.is_empty() {
            check_queues_exist(names);
        } else {
            // The claims' leases expire at a time an idle worker must learn
            // (rescue); and a database whose consumers claim is busy (its
            // worker keeps its process). A poll that claims nothing is neither.
            match out
                .iter()
                .filter(|r| !r.1[LEASE_UNTIL])
                .map(|r| r.0[LEASE_UNTIL].value() as i64)
                .min()
            {
                Some(at) => crate::wake::lease_due_at_commit(at),
                None => crate::wake::recheck_at_commit(),
            }
            crate::wake::busy_at_commit();
        }
        out
    }
}

/// The index of `lease_until` (timestamptz) among dispatch's result columns.
const LEASE_UNTIL: usize = 13;

/// LOG_DISPATCH_SQL's and LOG_SPILL_SQL's arguments: DISPATCH_SQL's, with
/// the locked lanes' ids in place of oversample.
fn log_arg_types() -> [pgrx::pg_sys::PgOid; 5] {
    [
        ty(pg_sys::TEXTARRAYOID),
        ty(pg_sys::INT4OID),
        ty(pg_sys::TEXTOID),
        ty(pg_sys::INTERVALOID),
        ty(pg_sys::INT4ARRAYOID),
    ]
}

/// Moves the `n` rows of the dispatch statement just run (SPI_tuptable:
/// DISPATCH_SQL's 14 columns, and LOG_DISPATCH_SQL's 15th, `blocked`) into
/// `out` (RawRow's 15 columns: DISPATCH_SQL's and the log statements' with
/// `headers`; their 16th is `blocked`): each row deformed once, its by-reference values (texts, the args)
/// detoasted and copied into the memory context that outlives the SPI
/// connection (the function's), where JobRows picks them up. Reading the
/// columns one by one through SPI_getbinval walked each tuple from its start
/// for every column (nocachegetattr: 8% of a dispatch's CPU, with pgrx's
/// per-call checks and String copies as much again). Returns true when the
/// statement answered `blocked` instead of rows.
unsafe fn take_rows(n: usize, out: &mut Vec<RawRow>) -> bool {
    unsafe {
        let tt = pg_sys::SPI_tuptable;
        if n == 0 || tt.is_null() {
            return false;
        }
        let desc = (*tt).tupdesc;
        let natts = (*desc).natts as usize;
        assert!(
            natts == 15 || natts == 16,
            "a dispatch statement returns 15 or 16 columns"
        );
        let mut values = [pg_sys::Datum::from(0); 16];
        let mut nulls = [false; 16];
        for i in 0..n {
            pg_sys::heap_deform_tuple(
                *(*tt).vals.add(i),
                desc,
                values.as_mut_ptr(),
                nulls.as_mut_ptr(),
            );
            if natts == 16 && !nulls[15] && values[15].value() != 0 {
                return true;
            }
            let mut row: RawRow = ([pg_sys::Datum::from(0); 15], [false; 15]);
            for c in 0..15 {
                row.1[c] = nulls[c];
                if nulls[c] {
                    continue;
                }
                row.0[c] = if BY_REF[c] {
                    let plain = pg_sys::pg_detoast_datum_packed(values[c].cast_mut_ptr());
                    pg_sys::SPI_datumTransfer(pg_sys::Datum::from(plain), false, -1)
                } else {
                    values[c]
                };
            }
            out.push(row);
        }
        false
    }
}

/// Which of the 15 result columns are passed by reference: queue, kind,
/// args, actor, fairness_key, identity_key, headers (the rest are integers
/// and timestamps, by value on every platform PostgreSQL 15+ supports).
const BY_REF: [bool; 15] = [
    false, true, true, true, false, false, false, true, true, true, false, false, false, false,
    true,
];

const QUEUES_EXIST_SQL: &str = "SELECT n FROM unnest($1::text[]) n
     WHERE NOT EXISTS (SELECT 1 FROM pgque.job_queues q WHERE q.queue_name = n) LIMIT 1";

pub(crate) fn check_queues_exist(names: &[String]) {
    let missing = Spi::connect(|client| {
        let stmt = prepared(client, QUEUES_EXIST_SQL, &[ty(pg_sys::TEXTARRAYOID)]);
        client
            .select(stmt, None, &[names.to_vec().into()])
            .ok()
            .and_then(|t| t.first().get::<String>(1).ok().flatten())
    });
    if let Some(name) = missing {
        raise(
            error::UNDEFINED_OBJECT,
            format!("job queue {name:?} does not exist"),
        );
    }
}
