//! `enqueue_ready_rows`: a batch of jobs in one statement (one round trip, one
//! transaction), and `enqueue` for one job on the same path.
//!
//! The statement (ENQUEUE_SQL), in order of what it guarantees:
//! 1. the queue exists (else it returns no row and the caller raises 42704), and
//!    this transaction holds the queue's advisory lock shared (drop waits);
//! 2. every lane (queue, priority, shard) with a ready row is locked with a
//!    transaction-scoped advisory lock, in hash order (so two batches never
//!    deadlock on each other), BEFORE any id is taken: ids, which are the
//!    ready jobs' dispatch order (ready_seq), are therefore taken in commit
//!    order within a lane, and a job enqueued later in a lane can never be
//!    dispatched before an earlier committed one, whatever the producers do;
//! 3. ids are taken in input order (`ORDER BY ord` below the nextval), so a
//!    batch's own jobs keep their input order inside a lane;
//! 4. unique keys: ON CONFLICT DO NOTHING against the partial unique index
//!    (live jobs only); a skipped row reports the id of the job that holds
//!    the key (earlier in this batch, or committed before);
//! 5. one `enqueued`/`scheduled` job event per job, the actors' counter rows,
//!    and one pg_notify on the queue's channel (`pgque.job_channel`) if a job is ready
//!    (PostgreSQL folds identical notifications of one transaction into one,
//!    and delivers them only at commit).
use super::args::{check_max_attempts, check_priority, check_run_at};
use super::log::outcomes::{Outcome, Outcomes};
use super::log::stmt::{prepared, ty, with_generic_plans};
use crate::error::{self, raise, required, valid_name};
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::{pg_sys, JsonB};

/// ENQUEUE_SQL's text; `$s`, `$u`, `$a`, `$c`, `$v` add the jobs' headers
/// ($12) to the input, the unnest, its column names, the INSERT's columns
/// and its values (empty: a batch without headers, whose statement is the
/// same as before headers existed and works on a schema without the column).
macro_rules! enqueue_sql {
    ($s:expr, $u:expr, $a:expr, $c:expr, $v:expr) => {
        concat!(
            r#"
WITH q AS MATERIALIZED (
    SELECT jq.queue_name, jq.shards, jq.max_attempts, jq.mode,
           pgque.xact_lock_shared(1785684593, pg_catalog.hashtext(jq.queue_name)) AS qlock
    FROM pgque.job_queues jq
    WHERE jq.queue_name = $1
),
input AS MATERIALIZED (
    SELECT t.ord::int AS ord, t.kind, t.args,
           COALESCE(t.priority, 0::smallint) AS priority,
           COALESCE(t.run_at, now()) AS run_at,
           COALESCE(t.run_at > now(), false) AS scheduled,
           t.actor, t.fairness_key, t.identity_key, t.unique_key,"#,
            $s,
            r#"
           COALESCE(t.max_attempts, q.max_attempts) AS max_attempts,
           CASE WHEN q.mode = 'round_robin' THEN COALESCE(t.fairness_key, '') END AS rr_key,
           s.shard
    FROM q
    CROSS JOIN LATERAL (
        SELECT CASE WHEN q.shards > 1
                    THEN (pg_catalog.pg_backend_pid() % q.shards)::smallint
                    ELSE 0::smallint END AS shard) s
    CROSS JOIN LATERAL unnest($2::text[], $3::jsonb[], $4::smallint[], $5::timestamptz[],
                              $6::text[], $7::text[], $8::text[], $9::text[], $10::int[]"#,
            $u,
            r#")
         WITH ORDINALITY AS t(kind, args, priority, run_at, actor, fairness_key,
                              identity_key, unique_key, max_attempts, "#,
            $a,
            r#"ord)
),
lanes AS MATERIALIZED (
    SELECT k.lane_key, pgque.xact_lock(1785684588, k.lane_key) AS lock
    FROM (SELECT pg_catalog.hashtext($1 || '/' || l.priority || '/' || l.shard) AS lane_key
          FROM (SELECT DISTINCT i.priority, i.shard FROM input i WHERE NOT i.scheduled) l
          ORDER BY 1) k
),
numbered AS MATERIALIZED (
    SELECT s.*, pg_catalog.nextval('pgque.jobs_id_seq') AS id
    FROM (SELECT i.* FROM input i
          -- a one-time filter: every lane lock is taken before the first nextval
          WHERE (SELECT count(*) FROM lanes) >= 0
          ORDER BY i.ord) s
),
ins AS (
    INSERT INTO pgque.jobs AS j (id, queue, kind, args, priority, shard, state, ready_seq, run_at,
                                 max_attempts, actor, fairness_key, rr_key, identity_key,
                                 unique_key, enqueued_at"#,
            $c,
            r#")
    SELECT n.id, $1, n.kind, n.args, n.priority, n.shard,
           CASE WHEN n.scheduled THEN 'scheduled' ELSE 'ready' END,
           CASE WHEN n.scheduled THEN NULL ELSE n.id END,
           n.run_at, n.max_attempts, n.actor, n.fairness_key, n.rr_key, n.identity_key,
           n.unique_key, now()"#,
            $v,
            r#"
    FROM numbered n
    ORDER BY n.ord
    ON CONFLICT DO NOTHING
    RETURNING j.id, j.state, j.unique_key, j.actor
),
-- one event row per kind (enqueued / scheduled) for the whole batch
ev AS (
    INSERT INTO pgque.job_events (job_ids, queue, event, attempt)
    SELECT array_agg(ins.id ORDER BY ins.id), $1, CASE WHEN ins.state = 'ready' THEN 'enqueued' ELSE 'scheduled' END, 0
    FROM ins
    GROUP BY ins.state
),
act AS (
    INSERT INTO pgque.job_actors (actor)
    SELECT DISTINCT ins.actor FROM ins WHERE ins.actor IS NOT NULL ORDER BY 1
    ON CONFLICT DO NOTHING
)
SELECT n.ord,
       COALESCE(i.id,
                (SELECT min(i2.id) FROM ins i2 WHERE i2.unique_key = n.unique_key),
                (SELECT j.id FROM pgque.jobs j
                 WHERE j.queue = $1 AND j.unique_key = n.unique_key
                   AND j.state IN ('scheduled', 'ready', 'running'))) AS job_id,
       COALESCE(i.state, 'duplicate') AS state
FROM numbered n
LEFT JOIN ins i ON i.id = n.id
WHERE (SELECT count(pg_catalog.pg_notify((CASE WHEN octet_length($1) <= 52 THEN 'pgque_jobs_' || $1 ELSE 'pgque_jobs_' || md5($1) END), ''))
       FROM (SELECT 1 FROM ins WHERE ins.state = 'ready' LIMIT 1) r) >= 0
ORDER BY n.ord
"#
        )
    };
}

/// The enqueue statement for any batch: $1..$10 (queue, kinds, args,
/// priorities, run_at, actors, fairness_keys, identity_keys, unique_keys,
/// max_attempts); one row per input position (ord, job_id, state).
pub const ENQUEUE_SQL: &str = enqueue_sql!("", "", "", "", "");
/// ENQUEUE_SQL for a batch with headers: $11 unused, $12 the headers.
pub const ENQUEUE_SQL_HEADERS: &str = enqueue_sql!(
    " t.headers,",
    ", $12::jsonb[]",
    "headers, ",
    ", headers",
    ", n.headers"
);

/// ENQUEUE_SQL for batches without unique keys (most batches), with the same
/// guarantees and less work: a plain insert instead of a speculative one per
/// row (nothing can conflict: ids are fresh and the only other unique index
/// is on unique_key), ids taken by the INSERT itself (nextval evaluated after
/// the sort by ord: PostgreSQL postpones volatile target-list expressions past
/// an ORDER BY) and the result read straight from its RETURNING. No
/// duplicates means one job per input row and ids increasing in input order,
/// so ord is the rank of the id. Two more cuts, measured with
/// benches/cpu/enqueue_cpu.py (~6% of the statement's CPU at batch 100):
/// the batch is not copied into a materialised CTE first (the INSERT reads
/// the arrays directly), and the lanes to lock come in as $11, the distinct
/// priorities of the batch's ready jobs (`ready_lane_priorities`, computed by
/// the caller from the same arrays and the same now()), instead of a
/// DISTINCT over the whole batch.
macro_rules! enqueue_no_keys_sql {
    ($u:expr, $a:expr, $c:expr, $v:expr) => {
        concat!(
            r#"
WITH q AS MATERIALIZED (
    SELECT jq.max_attempts, jq.mode,
           CASE WHEN jq.shards > 1
                THEN (pg_catalog.pg_backend_pid() % jq.shards)::smallint
                ELSE 0::smallint END AS shard,
           pgque.xact_lock_shared(1785684593, pg_catalog.hashtext(jq.queue_name)) AS qlock
    FROM pgque.job_queues jq
    WHERE jq.queue_name = $1
),
lanes AS MATERIALIZED (
    SELECT k.lane_key, pgque.xact_lock(1785684588, k.lane_key) AS lock
    FROM (SELECT pg_catalog.hashtext($1 || '/' || p.priority || '/' || q.shard) AS lane_key
          FROM q CROSS JOIN LATERAL unnest($11::smallint[]) AS p(priority)
          ORDER BY 1) k
),
ins AS (
    INSERT INTO pgque.jobs AS j (id, queue, kind, args, priority, shard, state, ready_seq, run_at,
                                 max_attempts, actor, fairness_key, rr_key, identity_key,
                                 enqueued_at"#,
            $c,
            r#")
    SELECT s.id, $1, s.kind, s.args, COALESCE(s.priority, 0::smallint), s.shard,
           CASE WHEN s.scheduled THEN 'scheduled' ELSE 'ready' END,
           CASE WHEN s.scheduled THEN NULL ELSE s.id END,
           COALESCE(s.run_at, now()), COALESCE(s.max_attempts, s.queue_max_attempts),
           s.actor, s.fairness_key,
           CASE WHEN s.mode = 'round_robin' THEN COALESCE(s.fairness_key, '') END,
           s.identity_key, now()"#,
            $v,
            r#"
    FROM (SELECT i.*, COALESCE(i.run_at > now(), false) AS scheduled,
                 pg_catalog.nextval('pgque.jobs_id_seq') AS id
          FROM (SELECT t.*, q.shard, q.mode, q.max_attempts AS queue_max_attempts
                FROM q
                CROSS JOIN LATERAL unnest($2::text[], $3::jsonb[], $4::smallint[], $5::timestamptz[],
                                          $6::text[], $7::text[], $8::text[], $10::int[]"#,
            $u,
            r#")
                     WITH ORDINALITY AS t(kind, args, priority, run_at, actor, fairness_key,
                                          identity_key, max_attempts, "#,
            $a,
            r#"ord)
                -- a one-time filter: every lane lock is taken before the first nextval
                WHERE (SELECT count(*) FROM lanes) >= 0
                ORDER BY t.ord) i) s
    RETURNING j.id, j.state, j.actor
),
-- one event row per kind (enqueued / scheduled) for the whole batch
ev AS (
    INSERT INTO pgque.job_events (job_ids, queue, event, attempt)
    SELECT array_agg(ins.id ORDER BY ins.id), $1, CASE WHEN ins.state = 'ready' THEN 'enqueued' ELSE 'scheduled' END, 0
    FROM ins
    GROUP BY ins.state
),
act AS (
    INSERT INTO pgque.job_actors (actor)
    SELECT DISTINCT ins.actor FROM ins WHERE ins.actor IS NOT NULL ORDER BY 1
    ON CONFLICT DO NOTHING
)
SELECT (row_number() OVER (ORDER BY i.id))::int AS ord, i.id AS job_id, i.state
FROM ins i
WHERE (SELECT count(pg_catalog.pg_notify((CASE WHEN octet_length($1) <= 52 THEN 'pgque_jobs_' || $1 ELSE 'pgque_jobs_' || md5($1) END), ''))
       FROM (SELECT 1 FROM ins WHERE ins.state = 'ready' LIMIT 1) r) >= 0
ORDER BY i.id
"#
        )
    };
}

pub const ENQUEUE_NO_KEYS_SQL: &str = enqueue_no_keys_sql!("", "", "", "");
/// ENQUEUE_NO_KEYS_SQL for a batch with headers ($12).
pub const ENQUEUE_NO_KEYS_SQL_HEADERS: &str =
    enqueue_no_keys_sql!(", $12::jsonb[]", "headers, ", ", headers", ", s.headers");

/// The distinct priorities (sorted) of the jobs of a batch that are ready at
/// enqueue: the lanes ENQUEUE_NO_KEYS_SQL locks. A job is ready unless its
/// run_at is after `now` (the transaction's start, which is what now() is in
/// the statement); a NULL priority is 0, a NULL run_at is now. `n` is the
/// batch size (the arrays, when present, have that length).
pub fn ready_lane_priorities(
    n: usize,
    priorities: Option<&[Option<i16>]>,
    run_at: Option<&[Option<i64>]>,
    now: i64,
) -> Vec<i16> {
    let mut lanes: Vec<i16> = (0..n)
        .filter(|&i| run_at.and_then(|r| r[i]).is_none_or(|t| t <= now))
        .map(|i| priorities.and_then(|p| p[i]).unwrap_or(0))
        .collect();
    lanes.sort_unstable();
    lanes.dedup();
    lanes
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OnDuplicate {
    Skip,
    Error,
}

pub fn parse_on_duplicate(v: Option<&str>) -> OnDuplicate {
    match required(v, "on_duplicate") {
        "skip" => OnDuplicate::Skip,
        "error" => OnDuplicate::Error,
        other => raise(
            error::INVALID_PARAMETER_VALUE,
            format!("on_duplicate must be 'skip' or 'error', not {other:?}"),
        ),
    }
}

/// now() of the statements: the start of the current transaction.
fn transaction_start() -> i64 {
    unsafe { pg_sys::GetCurrentTransactionStartTimestamp() }
}

fn check_len(what: &str, len: Option<usize>, n: usize) {
    if let Some(len) = len {
        if len != n {
            raise(
                error::INVALID_PARAMETER_VALUE,
                format!("{what} has {len} elements but kinds has {n}; the arrays must be of equal length"),
            );
        }
    }
}

/// The arrays of one batch, validated, as statement arguments.
pub struct Batch<'a> {
    pub n: usize,
    /// Some job has a unique key (the statement must handle conflicts).
    pub keyed: bool,
    /// The statement's arguments: the 10 arrays and scalars of the call, and
    /// for a batch without keys an 11th, `ready_lane_priorities`.
    pub args: Vec<DatumWithOid<'a>>,
    /// The batch may go to the job log (log::enqueue::eligible), into these
    /// lanes' priorities (the 11th argument).
    pub log_lanes: Option<Vec<i16>>,
    /// Some job has headers: `args` has 12 elements (the 11th NULL for a
    /// keyed batch), the 12th the headers. Such a batch goes to the log
    /// like any other when the log has its headers array (a schema from
    /// before 0.8.0's has not: pgque.jobs then).
    pub headers: bool,
}

impl<'a> Batch<'a> {
    /// Appends the arguments after the 10 arrays: the ready lanes
    /// (`ready_lane_priorities`, None for a keyed batch) and the headers
    /// (an array aligned with kinds, or None when no job has any).
    pub fn finish(&mut self, lanes: Option<Vec<i16>>, headers: Option<DatumWithOid<'a>>) {
        match headers {
            Some(h) => {
                if self.log_lanes.is_some() && !crate::headers::job_log_has_headers() {
                    self.log_lanes = None;
                }
                self.headers = true;
                self.args.push(lanes.into());
                self.args.push(h);
            }
            None => {
                if let Some(lanes) = lanes {
                    self.args.push(lanes.into());
                }
            }
        }
    }
}

/// Runs ENQUEUE_SQL over a validated batch. Raises 42704 for an unknown queue
/// and 23505 for a duplicate in 'error' mode (the transaction is then
/// aborted, so nothing of the batch persists).
pub fn run(queue: &str, batch: Batch<'_>, on_duplicate: OnDuplicate) -> Vec<Outcome> {
    if batch.n == 0 {
        require_queue_exists(queue);
        return Vec::new();
    }
    if let Some(lanes) = &batch.log_lanes {
        if let Some(out) = super::log::enqueue::run(&batch.args, queue, batch.n, lanes) {
            // ready jobs in the log: its waiting dispatchers look
            crate::wake::jobs_at_commit(queue);
            return out;
        }
    }
    let mut out = Vec::with_capacity(batch.n);
    let sql: &'static str = match (batch.keyed, batch.headers) {
        (true, false) => ENQUEUE_SQL,
        (false, false) => ENQUEUE_NO_KEYS_SQL,
        (true, true) => ENQUEUE_SQL_HEADERS,
        (false, true) => ENQUEUE_NO_KEYS_SQL_HEADERS,
    };
    with_generic_plans(|| {
        Spi::connect_mut(|client| {
            let base = super::log::enqueue::arg_types();
            let with_headers: Vec<pg_sys::PgOid>;
            let types = if batch.headers {
                with_headers = base
                    .iter()
                    .copied()
                    .chain([ty(pg_sys::JSONBARRAYOID)])
                    .collect();
                &with_headers[..]
            } else if batch.keyed {
                &base[..10]
            } else {
                &base[..]
            };
            let stmt = prepared(client, sql, types);
            let table = client
                .update(stmt, None, &batch.args)
                .unwrap_or_else(|e| pgrx::error!("{e}"));
            for row in table {
                out.push(Outcome {
                    ord: row.get::<i32>(1).ok().flatten().unwrap_or(0),
                    job_id: row.get::<i64>(2).ok().flatten(),
                    state: row
                        .get::<String>(3)
                        .ok()
                        .flatten()
                        .unwrap_or_else(|| "duplicate".into()),
                });
            }
        })
    });
    if out.is_empty() {
        raise(
            error::UNDEFINED_OBJECT,
            format!("job queue {queue:?} does not exist"),
        );
    }
    if on_duplicate == OnDuplicate::Error {
        if let Some(dup) = out.iter().find(|o| o.state == "duplicate") {
            error::raise_detail(
                pgrx::PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                format!(
                    "job {} of the batch has a unique key that a live job holds already",
                    dup.ord
                ),
                format!(
                    "The job holding it is {}. Nothing of the batch was enqueued; pass on_duplicate => 'skip' to skip such jobs.",
                    dup.job_id.map_or("unknown".to_string(), |id| id.to_string())
                ),
            );
        }
    }
    if out.iter().any(|o| o.state == "scheduled") {
        crate::wake::at_commit();
    }
    if out.iter().any(|o| o.state == "ready") {
        crate::wake::jobs_at_commit(queue);
    }
    out
}

fn require_queue_exists(queue: &str) {
    super::queues::require_queue(queue);
}

type Arr<'a, T> = Option<Array<'a, T>>;

/// Enqueues a batch of jobs into one queue, in one statement. Returns one row
/// per input position (ord is 1-based): the job id and its state ('ready',
/// 'scheduled', or 'duplicate' with the id of the live job holding the
/// unique key). All arrays must have the length of `kinds`; NULL arrays and
/// NULL elements take the defaults (priority 0, run_at now, the queue's
/// max_attempts, no actor/keys). `headers` (aligned with kinds, NULL
/// elements: none) are small JSON objects of strings, W3C trace context
/// (args.rs check_headers), stored with the job wherever it is stored.
#[allow(clippy::too_many_arguments)]
#[pg_extern(name = "enqueue_ready_rows", security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn enqueue_ready_rows_with_headers<'a>(
    queue_name: Option<&'a str>,
    kinds: Arr<'a, &'a str>,
    args: Arr<'a, JsonB>,
    priorities: default!(Arr<'a, i16>, "NULL"),
    run_at: default!(Arr<'a, TimestampWithTimeZone>, "NULL"),
    actors: default!(Arr<'a, &'a str>, "NULL"),
    fairness_keys: default!(Arr<'a, &'a str>, "NULL"),
    identity_keys: default!(Arr<'a, &'a str>, "NULL"),
    unique_keys: default!(Arr<'a, &'a str>, "NULL"),
    max_attempts: default!(Arr<'a, i32>, "NULL"),
    on_duplicate: default!(Option<&'a str>, "'skip'"),
    headers: default!(Arr<'a, JsonB>, "NULL"),
) -> Outcomes {
    let queue = valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    let kinds = required(kinds, "kinds");
    let args = required(args, "args");
    let on_duplicate = parse_on_duplicate(on_duplicate);
    let n = kinds.len();
    check_len("args", Some(args.len()), n);
    check_len("priorities", priorities.as_ref().map(|a| a.len()), n);
    check_len("run_at", run_at.as_ref().map(|a| a.len()), n);
    check_len("actors", actors.as_ref().map(|a| a.len()), n);
    check_len("fairness_keys", fairness_keys.as_ref().map(|a| a.len()), n);
    check_len("identity_keys", identity_keys.as_ref().map(|a| a.len()), n);
    check_len("unique_keys", unique_keys.as_ref().map(|a| a.len()), n);
    check_len("max_attempts", max_attempts.as_ref().map(|a| a.len()), n);
    check_len("headers", headers.as_ref().map(|a| a.len()), n);
    let mut any_headers = false;
    if let Some(h) = &headers {
        for (i, h) in h.iter().enumerate() {
            if let Some(h) = h {
                crate::headers::check_headers(&h, &format!("headers[{}]", i + 1));
                any_headers = true;
            }
        }
    }
    for (i, k) in kinds.iter().enumerate() {
        match k {
            None => raise(
                error::NULL_VALUE_NOT_ALLOWED,
                format!("kinds[{}] must not be NULL", i + 1),
            ),
            Some("") => raise(
                error::INVALID_PARAMETER_VALUE,
                format!("kinds[{}] must not be empty", i + 1),
            ),
            Some(_) => {}
        }
    }
    if args.contains_nulls() {
        raise(
            error::NULL_VALUE_NOT_ALLOWED,
            "args must not contain NULL (use '{}' for a job without arguments)",
        );
    }
    if let Some(p) = &priorities {
        p.iter().flatten().for_each(|p| check_priority(p as i32));
    }
    if let Some(m) = &max_attempts {
        m.iter().flatten().for_each(check_max_attempts);
    }
    if let Some(r) = &run_at {
        r.iter().flatten().for_each(check_run_at);
    }
    let keyed = unique_keys
        .as_ref()
        .is_some_and(|u| u.iter().any(|k| k.is_some()));
    let now = transaction_start();
    let all_ready = run_at
        .as_ref()
        .is_none_or(|r| r.iter().flatten().all(|t| t.into_inner() <= now));
    let has = |a: &Arr<'a, &'a str>| a.as_ref().is_some_and(|a| a.iter().any(|k| k.is_some()));
    let log_ok = super::log::enqueue::eligible(keyed, has(&actors), has(&identity_keys), all_ready);
    let lanes = (!keyed).then(|| {
        let p: Option<Vec<Option<i16>>> = priorities.as_ref().map(|a| a.iter().collect());
        let r: Option<Vec<Option<i64>>> = run_at
            .as_ref()
            .map(|a| a.iter().map(|t| t.map(|t| t.into_inner())).collect());
        ready_lane_priorities(n, p.as_deref(), r.as_deref(), now)
    });
    let mut batch = Batch {
        n,
        keyed,
        log_lanes: if log_ok { lanes.clone() } else { None },
        headers: false,
        args: vec![
            queue.into(),
            kinds.into(),
            args.into(),
            priorities.into(),
            run_at.into(),
            actors.into(),
            fairness_keys.into(),
            identity_keys.into(),
            unique_keys.into(),
            max_attempts.into(),
        ],
    };
    batch.finish(lanes, headers.filter(|_| any_headers).map(Into::into));
    Outcomes(run(queue, batch, on_duplicate))
}

/// The entry point of 0.7.0's `enqueue_ready_rows` (C symbol
/// enqueue_ready_rows_wrapper, no headers), kept out of this version's SQL:
/// a database still at 0.7.0 runs this library's enqueue_ready_rows through
/// it until ALTER EXTENSION pgque UPDATE.
#[allow(clippy::too_many_arguments)]
#[pg_extern(sql = false, security_definer, parallel_unsafe)]
fn enqueue_ready_rows<'a>(
    queue_name: Option<&'a str>,
    kinds: Arr<'a, &'a str>,
    args: Arr<'a, JsonB>,
    priorities: Arr<'a, i16>,
    run_at: Arr<'a, TimestampWithTimeZone>,
    actors: Arr<'a, &'a str>,
    fairness_keys: Arr<'a, &'a str>,
    identity_keys: Arr<'a, &'a str>,
    unique_keys: Arr<'a, &'a str>,
    max_attempts: Arr<'a, i32>,
    on_duplicate: Option<&'a str>,
) -> Outcomes {
    enqueue_ready_rows_with_headers(
        queue_name,
        kinds,
        args,
        priorities,
        run_at,
        actors,
        fairness_keys,
        identity_keys,
        unique_keys,
        max_attempts,
        on_duplicate,
        None,
    )
}

/// Enqueues one job (the one-element case of enqueue_ready_rows, same
/// statement). Returns its id; with a unique key that a live job holds, the
/// id of that job (on_duplicate 'skip') or error 23505 ('error'). With
/// `depends_on` (job ids) the job waits until those jobs completed
/// (flows.rs: stored in pgque.jobs, with its headers; no unique key then,
/// 0A000).
/// `headers`: a small JSON object of strings, W3C trace context
/// (args.rs check_headers), stored with the job.
#[allow(clippy::too_many_arguments)]
#[pg_extern(name = "enqueue", security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn enqueue_with_headers(
    queue_name: Option<&str>,
    kind: Option<&str>,
    args: default!(Option<JsonB>, "'{}'"),
    priority: default!(Option<i32>, 0),
    run_at: default!(Option<TimestampWithTimeZone>, "NULL"),
    actor: default!(Option<&str>, "NULL"),
    fairness_key: default!(Option<&str>, "NULL"),
    identity_key: default!(Option<&str>, "NULL"),
    unique_key: default!(Option<&str>, "NULL"),
    max_attempts: default!(Option<i32>, "NULL"),
    on_duplicate: default!(Option<&str>, "'skip'"),
    depends_on: default!(Option<Vec<Option<i64>>>, "NULL"),
    headers: default!(Option<JsonB>, "NULL"),
) -> Option<i64> {
    let queue = valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    let kind = required(kind, "kind");
    if kind.is_empty() {
        raise(error::INVALID_PARAMETER_VALUE, "kind must not be empty");
    }
    let args = required(args, "args");
    let on_duplicate = parse_on_duplicate(on_duplicate);
    let priority = required(priority, "priority");
    check_priority(priority);
    let priority = priority as i16;
    if let Some(m) = max_attempts {
        check_max_attempts(m);
    }
    if let Some(r) = run_at {
        check_run_at(r);
    }
    if let Some(h) = &headers {
        crate::headers::check_headers(h, "headers");
    }
    if let Some(d) = depends_on.as_deref().filter(|d| !d.is_empty()) {
        let parents = super::args::check_depends_on(d);
        if unique_key.is_some() {
            raise(
                error::FEATURE_NOT_SUPPORTED,
                "a job with depends_on cannot have a unique_key",
            );
        }
        let job = super::flows::FlowJob {
            key: String::new(),
            kind: kind.to_string(),
            args: Some(args.0),
            depends_on: vec![],
            priority: Some(priority as i32),
            run_at: run_at.map(super::flows::timestamp_text),
            max_attempts,
            actor: actor.map(str::to_string),
            fairness_key: fairness_key.map(str::to_string),
            identity_key: identity_key.map(str::to_string),
            run_on_parent_failure: false,
            headers: headers.map(|h| h.0),
        };
        return Some(super::flows::enqueue_after(queue, job, &parents));
    }
    let keyed = unique_key.is_some();
    let now = transaction_start();
    let all_ready = run_at.is_none_or(|t| t.into_inner() <= now);
    let log_ok =
        super::log::enqueue::eligible(keyed, actor.is_some(), identity_key.is_some(), all_ready);
    let lanes = (!keyed).then(|| {
        ready_lane_priorities(
            1,
            Some(&[Some(priority)]),
            Some(&[run_at.map(|t| t.into_inner())]),
            now,
        )
    });
    let mut batch = Batch {
        n: 1,
        keyed,
        log_lanes: if log_ok { lanes.clone() } else { None },
        headers: false,
        args: vec![
            queue.into(),
            vec![kind].into(),
            vec![args].into(),
            vec![priority].into(),
            vec![run_at].into(),
            vec![actor].into(),
            vec![fairness_key].into(),
            vec![identity_key].into(),
            vec![unique_key].into(),
            vec![max_attempts].into(),
        ],
    };
    batch.finish(lanes, headers.map(|h| vec![h].into()));
    run(queue, batch, on_duplicate)
        .into_iter()
        .next()
        .and_then(|o| o.job_id)
}

/// The entry point of 0.6.0's 11-argument `enqueue` (C symbol
/// enqueue_wrapper), kept out of this version's SQL: a database still at
/// 0.6.0 runs this library's enqueue through it until ALTER EXTENSION
/// pgque UPDATE.
#[allow(clippy::too_many_arguments)]
#[pg_extern(sql = false, security_definer, parallel_unsafe)]
fn enqueue(
    queue_name: Option<&str>,
    kind: Option<&str>,
    args: Option<JsonB>,
    priority: Option<i32>,
    run_at: Option<TimestampWithTimeZone>,
    actor: Option<&str>,
    fairness_key: Option<&str>,
    identity_key: Option<&str>,
    unique_key: Option<&str>,
    max_attempts: Option<i32>,
    on_duplicate: Option<&str>,
) -> Option<i64> {
    enqueue_with_parents(
        queue_name,
        kind,
        args,
        priority,
        run_at,
        actor,
        fairness_key,
        identity_key,
        unique_key,
        max_attempts,
        on_duplicate,
        None,
    )
}

/// The entry point of 0.7.0's 12-argument `enqueue` (C symbol
/// enqueue_with_parents_wrapper, no headers), kept out of this version's
/// SQL for a database still at 0.7.0, as `enqueue` above for 0.6.0.
#[allow(clippy::too_many_arguments)]
#[pg_extern(sql = false, security_definer, parallel_unsafe)]
fn enqueue_with_parents(
    queue_name: Option<&str>,
    kind: Option<&str>,
    args: Option<JsonB>,
    priority: Option<i32>,
    run_at: Option<TimestampWithTimeZone>,
    actor: Option<&str>,
    fairness_key: Option<&str>,
    identity_key: Option<&str>,
    unique_key: Option<&str>,
    max_attempts: Option<i32>,
    on_duplicate: Option<&str>,
    depends_on: Option<Vec<Option<i64>>>,
) -> Option<i64> {
    enqueue_with_headers(
        queue_name,
        kind,
        args,
        priority,
        run_at,
        actor,
        fairness_key,
        identity_key,
        unique_key,
        max_attempts,
        on_duplicate,
        depends_on,
        None,
    )
}

#[cfg(test)]
mod pure_tests {
    use super::ready_lane_priorities;

    #[test]
    fn ready_lanes_are_the_distinct_priorities_of_jobs_not_in_the_future() {
        // no arrays: one lane, priority 0
        assert_eq!(ready_lane_priorities(3, None, None, 100), vec![0]);
        // NULL priority is 0; sorted and distinct
        let p = [Some(5), None, Some(-3), Some(5)];
        assert_eq!(
            ready_lane_priorities(4, Some(&p), None, 100),
            vec![-3, 0, 5]
        );
        // a job whose run_at is after now is scheduled and locks no lane;
        // run_at == now and NULL run_at are ready
        let r = [Some(101), Some(100), None, Some(50)];
        assert_eq!(
            ready_lane_priorities(
                4,
                Some(&[Some(1), Some(2), Some(3), Some(4)]),
                Some(&r),
                100
            ),
            vec![2, 3, 4]
        );
        // all scheduled: no lane at all
        assert!(ready_lane_priorities(2, None, Some(&[Some(200), Some(300)]), 100).is_empty());
        // an empty batch
        assert!(ready_lane_priorities(0, None, None, 100).is_empty());
    }
}
