//! What happens to a dispatched job: complete, complete_many, fail (with
//! exponential backoff and jitter, then the terminal 'failed' state),
//! heartbeat, snooze; and the admin actions cancel and retry_job.
//!
//! Every worker-side call is fenced by the attempt's lease token: a call with
//! a stale token (the lease expired and was rescued, the job was cancelled,
//! another attempt runs now) changes nothing and says so (false / NULL / no
//! row). A job has a lease token exactly while it is running (a CHECK on
//! pgque.jobs), so `id = $1 AND lease_token = $2` is the whole fence: the
//! statements leave `state = 'running'` out of their quals on purpose, as it
//! would make the partial index of running jobs (a walk over every running
//! job) a valid path for what must be a primary-key lookup. Every transition out of 'running' gives back the actor's slot and
//! the identity claim, in the same statement, and writes one job event.
use super::log;
use super::log::stmt::{prepared, run_int, ty, with_generic_plans};
use super::outputs::{self, JsonbDatum};
use crate::datum::JsonbArray;
use crate::error::{self, raise, required};
use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;

/// `release_tail.sql` is the shared tail of every statement that takes jobs
/// out of 'running': it gives back actor slots (locking the actor rows in
/// order) and identity claims, and writes the job events, for the rows of the
/// statement's `gone` CTE.
macro_rules! leave_running {
    ($head:expr, $select:expr) => {
        concat!(
            "WITH ",
            $head,
            ",",
            "\n",
            include_str!("release_tail.sql"),
            $select
        )
    };
}

/// $1 id, $2 token, $3 output (NULL: none).
pub const COMPLETE_SQL: &str = leave_running!(
    r#"gone AS (
    UPDATE pgque.jobs j
    SET state = 'completed', finished_at = now(), lease_token = NULL, lease_until = NULL,
        output = $3::jsonb
    WHERE j.id = $1 AND j.lease_token = $2
    RETURNING j.id, j.queue, j.actor, j.identity_key, j.attempt,
              'completed'::text AS event, NULL::text AS detail, j.has_children
)"#,
    // the second column: the jobs that are parents in a flow (flows.rs)
    "SELECT count(*)::int, array_agg(g.id) FILTER (WHERE g.has_children) FROM gone g"
);

/// $1 ids, $2 tokens, $3 outputs aligned with them (NULL: none; unnest
/// pads a NULL array with NULLs).
pub const COMPLETE_MANY_SQL: &str = leave_running!(
    r#"input AS MATERIALIZED (
    SELECT t.id, t.token, t.output
    FROM unnest($1::bigint[], $2::bigint[], $3::jsonb[]) AS t(id, token, output)
),
gone AS (
    UPDATE pgque.jobs j
    SET state = 'completed', finished_at = now(), lease_token = NULL, lease_until = NULL,
        output = i.output
    FROM input i
    WHERE j.id = ANY ($1::bigint[]) AND j.id = i.id AND j.lease_token = i.token
    RETURNING j.id, j.queue, j.actor, j.identity_key, j.attempt,
              'completed'::text AS event, NULL::text AS detail, j.has_children
)"#,
    "SELECT count(*)::int, array_agg(g.id) FILTER (WHERE g.has_children) FROM gone g"
);

/// $1 id, $2 token, $3 error, $4 retry_at (NULL: backoff).
/// Backoff: 2^(attempt-1) seconds (capped at 1 hour) times a jitter in
/// [0.75, 1.25), so retries of a failed batch spread out.
pub const FAIL_SQL: &str = leave_running!(
    r#"cur AS MATERIALIZED (
    SELECT j.id, j.attempt >= j.max_attempts AS exhausted,
           COALESCE($4::timestamptz,
                    now() + least(power(2, greatest(j.attempt - 1, 0)), 3600)
                            * (0.75 + random() * 0.5) * interval '1 second') AS next_at
    FROM pgque.jobs j
    WHERE j.id = $1 AND j.lease_token = $2
    FOR UPDATE
),
gone AS (
    UPDATE pgque.jobs j
    SET state = CASE WHEN c.exhausted THEN 'failed'
                     WHEN c.next_at <= now() THEN 'ready'
                     ELSE 'scheduled' END,
        run_at = CASE WHEN c.exhausted THEN j.run_at ELSE greatest(c.next_at, j.run_at) END,
        finished_at = CASE WHEN c.exhausted THEN now() END,
        lease_token = NULL, lease_until = NULL,
        errors = COALESCE(j.errors, '[]'::jsonb)
                 || jsonb_build_array(jsonb_build_object('attempt', j.attempt, 'at', now(),
                                                         'error', $3::text))
    FROM cur c
    WHERE j.id = c.id
    RETURNING j.id, j.queue, j.actor, j.identity_key, j.attempt,
              CASE WHEN j.state = 'failed' THEN 'failed' ELSE 'retried' END AS event,
              $3::text AS detail, j.state, j.has_children
)"#,
    // a job that is ready again at once wakes dispatchers like an enqueue
    "SELECT g.state, (SELECT count(pg_catalog.pg_notify((CASE WHEN octet_length(g2.queue) <= 52 THEN 'pgque_jobs_' || g2.queue ELSE 'pgque_jobs_' || md5(g2.queue) END), ''))
                      FROM gone g2 WHERE g2.state = 'ready'), g.has_children FROM gone g"
);

/// $1 id, $2 token, $3 until: back to scheduled (or ready), attempt not consumed.
pub const SNOOZE_SQL: &str = leave_running!(
    r#"gone AS (
    UPDATE pgque.jobs j
    SET state = CASE WHEN $3::timestamptz <= now() THEN 'ready' ELSE 'scheduled' END,
        run_at = $3::timestamptz, attempt = j.attempt - 1,
        lease_token = NULL, lease_until = NULL
    WHERE j.id = $1 AND j.lease_token = $2
    RETURNING j.id, j.queue, j.actor, j.identity_key, j.attempt,
              'snoozed'::text AS event, $3::text AS detail, j.state
)"#,
    "SELECT count(*)::int, (SELECT count(pg_catalog.pg_notify((CASE WHEN octet_length(g2.queue) <= 52 THEN 'pgque_jobs_' || g2.queue ELSE 'pgque_jobs_' || md5(g2.queue) END), ''))
                           FROM gone g2 WHERE g2.state = 'ready') FROM gone"
);

/// $1 id: any unfinished job becomes cancelled; returns its previous state.
pub const CANCEL_SQL: &str = r#"
WITH cur AS MATERIALIZED (
    SELECT j.id, j.state AS was FROM pgque.jobs j WHERE j.id = $1 FOR UPDATE
),
upd AS (
    UPDATE pgque.jobs j
    SET state = 'cancelled', finished_at = now(), lease_token = NULL, lease_until = NULL
    FROM cur c
    WHERE j.id = c.id AND c.was IN ('waiting', 'scheduled', 'ready', 'running')
    RETURNING j.id, j.queue, j.actor, j.identity_key, j.attempt, c.was, j.has_children
),
gone AS (
    SELECT u.id, u.queue, u.actor, u.identity_key, u.attempt,
           'cancelled'::text AS event, u.was AS detail
    FROM upd u WHERE u.was = 'running'
),
per_actor AS MATERIALIZED (
    SELECT g.actor, count(*)::int AS n FROM gone g WHERE g.actor IS NOT NULL GROUP BY g.actor
),
act AS (
    UPDATE pgque.job_actors a SET running = greatest(a.running - p.n, 0)
    FROM per_actor p WHERE a.actor = p.actor
),
ids AS (
    DELETE FROM pgque.job_running_identities ri
    USING gone g
    WHERE ri.queue = g.queue AND ri.identity_key = g.identity_key AND ri.job_id = g.id
),
ev AS (
    INSERT INTO pgque.job_events (job_id, queue, event, attempt, detail)
    SELECT u.id, u.queue, 'cancelled', u.attempt, 'was ' || u.was FROM upd u
)
SELECT c.was, (SELECT count(*)::int FROM upd), (SELECT bool_or(u.has_children) FROM upd u)
FROM cur c
"#;

/// Marks the job completed if `lease_token` is its current attempt's token,
/// recording `output` (shown by get_job / all_jobs as long as the job is
/// kept; 54000 over MAX_OUTPUT_BYTES). False (and nothing changed) for a
/// stale token, a cancelled job or a job not running.
#[pg_extern(name = "complete", security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn complete_with_output(
    job_id: Option<i64>,
    lease_token: Option<i64>,
    output: default!(Option<JsonbDatum>, "NULL"),
) -> bool {
    let id = required(job_id, "job_id");
    let token = required(lease_token, "lease_token");
    if let Some(o) = output {
        outputs::check_size(o.size, outputs::MAX_OUTPUT_BYTES, "output");
    }
    let elems = output.map(|o| [Some(o.datum)]);
    if log_complete(&[id], &[token], elems.as_ref().map(|e| &e[..])) == 1 {
        return true;
    }
    let out = match output {
        Some(o) => o.arg(),
        None => DatumWithOid::null_oid(pg_sys::JSONBOID),
    };
    run_completion(
        COMPLETE_SQL,
        &[
            ty(pg_sys::INT8OID),
            ty(pg_sys::INT8OID),
            ty(pg_sys::JSONBOID),
        ],
        vec![id.into(), token.into(), out],
    ) == 1
}

/// Runs a completion statement of pgque.jobs (COMPLETE_SQL,
/// COMPLETE_MANY_SQL): returns how many it completed, and releases the
/// children of those that are parents in a flow, in this transaction.
fn run_completion(sql: &'static str, types: &[pg_sys::PgOid], args: Vec<DatumWithOid<'_>>) -> i32 {
    let (n, parents) = with_generic_plans(|| {
        Spi::connect_mut(|client| {
            let stmt = prepared(client, sql, types);
            let t = client
                .update(stmt, None, &args)
                .unwrap_or_else(|e| pgrx::error!("{e}"));
            let r = t.first();
            (
                r.get::<i32>(1).ok().flatten().unwrap_or(0),
                r.get::<Vec<i64>>(2).ok().flatten(),
            )
        })
    });
    if let Some(p) = parents {
        super::flows::completed(p);
    }
    n
}

/// Completes many jobs in one statement, recording `outputs[i]` for the
/// i-th pair (NULL array or element: no output); pairs with a stale token
/// are skipped. Returns how many were completed.
#[pg_extern(name = "complete_many", security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn complete_many_with_outputs(
    job_ids: Option<Vec<Option<i64>>>,
    lease_tokens: Option<Vec<Option<i64>>>,
    outputs: default!(Option<JsonbArray>, "NULL"),
) -> i32 {
    let ids = required(job_ids, "job_ids");
    let tokens = required(lease_tokens, "lease_tokens");
    error::check_len(ids.len().max(tokens.len()), "job_ids", error::MAX_ARRAY);
    if ids.len() != tokens.len() {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!(
                "job_ids has {} elements and lease_tokens {}; they must be of equal length",
                ids.len(),
                tokens.len()
            ),
        );
    }
    if let Some(o) = &outputs {
        if o.0.len != ids.len() {
            raise(
                error::INVALID_PARAMETER_VALUE,
                format!(
                    "outputs has {} elements and job_ids {}; they must be of equal length",
                    o.0.len,
                    ids.len()
                ),
            );
        }
    }
    if ids.iter().chain(tokens.iter()).any(Option::is_none) {
        raise(
            error::NULL_VALUE_NOT_ALLOWED,
            "job_ids and lease_tokens must not contain NULL",
        );
    }
    if ids.is_empty() {
        return 0;
    }
    let ids: Vec<i64> = ids.into_iter().flatten().collect();
    let tokens: Vec<i64> = tokens.into_iter().flatten().collect();
    // checks each output's size too
    let elems = outputs.as_ref().map(outputs::elements);
    let from_log = log_complete(&ids, &tokens, elems.as_deref());
    if from_log as usize == ids.len() {
        return from_log;
    }
    let outs = match &outputs {
        Some(o) => o.0.arg(),
        None => DatumWithOid::null_oid(pg_sys::JSONBARRAYOID),
    };
    // the rest are pgque.jobs' (or stale): a pair the log completed has no
    // running row there, so nothing is counted twice
    from_log
        + run_completion(
            COMPLETE_MANY_SQL,
            &[
                ty(pg_sys::INT8ARRAYOID),
                ty(pg_sys::INT8ARRAYOID),
                ty(pg_sys::JSONBARRAYOID),
            ],
            vec![ids.into(), tokens.into(), outs],
        )
}

/// The entry points of 0.6.0's `complete(bigint, bigint)` and
/// `complete_many(bigint[], bigint[])` (C symbols complete_wrapper and
/// complete_many_wrapper), kept out of this version's SQL: a database whose
/// extension is still at 0.6.0 runs this library's code through them until
/// ALTER EXTENSION pgque UPDATE (the new signatures have more arguments,
/// which these symbols would not be passed).
#[pg_extern(sql = false, security_definer, parallel_unsafe)]
fn complete(job_id: Option<i64>, lease_token: Option<i64>) -> bool {
    complete_with_output(job_id, lease_token, None)
}

/// See `complete`.
#[pg_extern(sql = false, security_definer, parallel_unsafe)]
fn complete_many(job_ids: Option<Vec<Option<i64>>>, lease_tokens: Option<Vec<Option<i64>>>) -> i32 {
    complete_many_with_outputs(job_ids, lease_tokens, None)
}

/// Completes the pairs whose token is a claim of the job log (a done row per
/// claim). Returns how many. At READ COMMITTED the claim locks are taken
/// without looking the tokens up first (`lock_tokens`), so completing log
/// jobs is one statement; at REPEATABLE READ and SERIALIZABLE the lookup
/// says whether a token is a claim, which must then be refused (0A000),
/// and returns 0 at once for jobs of pgque.jobs.
fn log_complete(ids: &[i64], tokens: &[i64], outputs: Option<&[Option<pg_sys::Datum>]>) -> i32 {
    if log::xact_snapshot() {
        if !log::claims_locked(tokens, "complete") {
            return 0;
        }
    } else {
        log::lock_tokens(tokens);
    }
    log::release::complete(ids, tokens, outputs)
}

/// Records a failed attempt. Returns the job's new state: 'ready' or
/// 'scheduled' (retried at `retry_at`, or after an exponential backoff with
/// jitter when it is NULL), or 'failed' once the attempt was the last one.
/// NULL for a stale token (nothing changed).
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn fail(
    job_id: Option<i64>,
    lease_token: Option<i64>,
    error: Option<&str>,
    retry_at: default!(Option<TimestampWithTimeZone>, "NULL"),
) -> Option<String> {
    let id = required(job_id, "job_id");
    let token = required(lease_token, "lease_token");
    let err = required(error, "error");
    if let Some(r) = retry_at {
        super::args::check_run_at(r);
    }
    // a job of the log leaves its claim into pgque.jobs, where it fails
    log::release::leave_claim(id, token);
    let (state, parent) = with_generic_plans(|| {
        Spi::connect_mut(|client| {
            let stmt = prepared(
                client,
                FAIL_SQL,
                &[
                    ty(pg_sys::INT8OID),
                    ty(pg_sys::INT8OID),
                    ty(pg_sys::TEXTOID),
                    ty(pg_sys::TIMESTAMPTZOID),
                ],
            );
            let t = client
                .update(
                    stmt,
                    None,
                    &[id.into(), token.into(), err.into(), retry_at.into()],
                )
                .unwrap_or_else(|e| pgrx::error!("{e}"));
            if t.is_empty() {
                return (None, false);
            }
            let r = t.first();
            (
                r.get::<String>(1).ok().flatten(),
                r.get::<bool>(3).ok().flatten().unwrap_or(false),
            )
        })
    });
    if parent && state.as_deref() == Some("failed") {
        // its waiting children are cancelled (or run anyway)
        super::flows::propagate(vec![id], "failed");
    }
    if state.as_deref() == Some("scheduled") {
        crate::wake::at_commit();
    }
    state
}

const HEARTBEAT_SQL: &str = r#"
UPDATE pgque.jobs j
SET lease_until = clock_timestamp() + $3::interval
FROM unnest($1::bigint[], $2::bigint[]) AS t(id, token)
WHERE j.id = ANY ($1::bigint[]) AND j.id = t.id AND j.lease_token = t.token
RETURNING j.id, j.lease_until
"#;

/// Extends the leases of running jobs to now + `extend`. Returns the jobs
/// whose lease was extended (a job missing from the result has lost its
/// lease and must stop).
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn heartbeat(
    job_ids: Option<Vec<Option<i64>>>,
    lease_tokens: Option<Vec<Option<i64>>>,
    extend: Option<Interval>,
) -> TableIterator<
    'static,
    (
        name!(job_id, i64),
        name!(lease_until, TimestampWithTimeZone),
    ),
> {
    let ids = required(job_ids, "job_ids");
    let tokens = required(lease_tokens, "lease_tokens");
    error::check_len(ids.len().max(tokens.len()), "job_ids", error::MAX_ARRAY);
    let extend = required(extend, "extend");
    super::args::check_positive_interval(&extend, "extend");
    if ids.len() != tokens.len() {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "job_ids and lease_tokens must be of equal length",
        );
    }
    // pairs with a NULL match nothing (as in the statement below)
    let (ids, tokens): (Vec<i64>, Vec<i64>) = ids
        .into_iter()
        .zip(tokens)
        .filter_map(|(i, t)| Some((i?, t?)))
        .unzip();
    // the log's claims first (the whole claim's lease), then pgque.jobs' rows
    let mut out = Vec::new();
    if log::claims_locked(&tokens, "heartbeat") {
        out = log::release::heartbeat(&ids, &tokens, extend);
    }
    with_generic_plans(|| {
        Spi::connect_mut(|client| {
            let stmt = prepared(
                client,
                HEARTBEAT_SQL,
                &[
                    ty(pg_sys::INT8ARRAYOID),
                    ty(pg_sys::INT8ARRAYOID),
                    ty(pg_sys::INTERVALOID),
                ],
            );
            let t = client
                .update(stmt, None, &[ids.into(), tokens.into(), extend.into()])
                .unwrap_or_else(|e| pgrx::error!("{e}"));
            for row in t {
                out.push((
                    row.get::<i64>(1).ok().flatten().unwrap(),
                    row.get::<TimestampWithTimeZone>(2).ok().flatten().unwrap(),
                ));
            }
        })
    });
    TableIterator::new(out)
}

/// Puts a running job back until `until` without consuming an attempt
/// ("not now"). False for a stale token.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn snooze(
    job_id: Option<i64>,
    lease_token: Option<i64>,
    until: Option<TimestampWithTimeZone>,
) -> bool {
    let id = required(job_id, "job_id");
    let token = required(lease_token, "lease_token");
    let until = required(until, "until");
    super::args::check_run_at(until);
    log::release::leave_claim(id, token);
    let n = run_int(
        SNOOZE_SQL,
        &[
            ty(pg_sys::INT8OID),
            ty(pg_sys::INT8OID),
            ty(pg_sys::TIMESTAMPTZOID),
        ],
        vec![id.into(), token.into(), until.into()],
    );
    if n == 1 {
        crate::wake::at_commit();
    }
    n == 1
}

/// Cancels an unfinished job (waiting, scheduled, ready or running: a
/// running job's later complete/fail is refused), and with it the waiting
/// jobs that depend on it (unless they run on parent failure). False when
/// the job had finished already.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn cancel(job_id: Option<i64>) -> bool {
    let id = required(job_id, "job_id");
    let run = || {
        with_generic_plans(|| {
            Spi::connect_mut(|client| {
                let stmt = prepared(client, CANCEL_SQL, &[ty(pg_sys::INT8OID)]);
                let t = client
                    .update(stmt, None, &[id.into()])
                    .unwrap_or_else(|e| pgrx::error!("{e}"));
                if t.is_empty() {
                    return (None, 0, false);
                }
                let row = t.first();
                (
                    row.get::<String>(1).ok().flatten(),
                    row.get::<i32>(2).ok().flatten().unwrap_or(0),
                    row.get::<bool>(3).ok().flatten().unwrap_or(false),
                )
            })
        })
    };
    let (mut was, mut n, mut parent) = run();
    if was.is_none() {
        // not a row of pgque.jobs: a job of the log is brought there first
        // (ready: in its place; running: out of its claim) and cancelled
        // there; a completed one stays in the log and is not cancelled
        if !log::release::job_to_side(id) {
            raise(error::UNDEFINED_OBJECT, format!("job {id} does not exist"));
        }
        (was, n, parent) = run();
        if was.is_none() {
            return false;
        }
    }
    if n == 1 && parent {
        // its waiting children are cancelled too (or run anyway)
        super::flows::propagate(vec![id], "cancelled");
    }
    n == 1
}

const RETRY_SQL: &str = r#"
WITH cur AS MATERIALIZED (
    SELECT j.id, j.queue, j.priority, j.shard, j.state, j.ready_seq
    FROM pgque.jobs j WHERE j.id = $1 FOR UPDATE
),
lane AS MATERIALIZED (
    SELECT c.id, pgque.xact_lock(1785684588,
               pg_catalog.hashtext(c.queue || '/' || c.priority || '/' || c.shard)) AS l
    FROM cur c WHERE c.state IN ('failed', 'cancelled') AND c.ready_seq IS NULL
),
upd AS (
    UPDATE pgque.jobs j
    SET state = 'ready', attempt = 0, run_at = now(), finished_at = NULL,
        ready_seq = COALESCE(j.ready_seq,
                             (SELECT pg_catalog.nextval('pgque.jobs_id_seq')
                              FROM lane WHERE lane.id = j.id))
    FROM cur c
    WHERE j.id = c.id AND c.state IN ('failed', 'cancelled')
    RETURNING j.id, j.queue
),
ev AS (
    INSERT INTO pgque.job_events (job_id, queue, event, attempt, detail)
    SELECT u.id, u.queue, 'retried', 0, 'retry_job' FROM upd u
),
note AS (
    SELECT pg_catalog.pg_notify((CASE WHEN octet_length(u.queue) <= 52 THEN 'pgque_jobs_' || u.queue ELSE 'pgque_jobs_' || md5(u.queue) END), '') FROM upd u
)
SELECT c.state, (SELECT count(*)::int FROM upd), (SELECT count(*)::int FROM note) FROM cur c
"#;

/// Puts a failed or cancelled job back to ready with a fresh attempt count.
/// 42704 for an unknown job, 55000 for a job in another state.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn retry_job(job_id: Option<i64>) -> bool {
    let id = required(job_id, "job_id");
    let was = with_generic_plans(|| {
        Spi::connect_mut(|client| {
            let stmt = prepared(client, RETRY_SQL, &[ty(pg_sys::INT8OID)]);
            let t = client
                .update(stmt, None, &[id.into()])
                .unwrap_or_else(|e| pgrx::error!("{e}"));
            if t.is_empty() {
                None
            } else {
                t.first().get::<String>(1).ok().flatten()
            }
        })
    });
    match was.as_deref() {
        None => raise(error::UNDEFINED_OBJECT, format!("job {id} does not exist")),
        Some("failed") | Some("cancelled") => {
            crate::wake::all_jobs_at_commit();
            true
        }
        Some(other) => raise(
            error::WRONG_STATE,
            format!("job {id} is {other}; only failed or cancelled jobs can be retried"),
        ),
    }
}
