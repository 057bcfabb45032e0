//! Flows (DESIGN.md section 14): jobs that run after other jobs.
//!
//! - A job with parents is a row of pgque.jobs in state `waiting`, with
//!   `pending_parents` = its parents not completed yet; the edges are rows
//!   of `pgque.job_deps` (parent, child). A waiting job is in none of the
//!   indexes dispatch walks (they are partial on `ready`), so waiting jobs
//!   cost dispatch nothing.
//! - Every job of a flow lives in pgque.jobs (never in the job log): a
//!   parent's completion must find its children, and its row says whether it
//!   has any (`has_children`), so completing an ordinary job costs no extra
//!   statement. A job of the log named in `enqueue(..., depends_on)` is moved
//!   into pgque.jobs first (as cancel moves one), or counts as done when it
//!   completed already.
//! - `completed`: when a parent completes, each waiting child's counter goes
//!   down by one (children locked in id order, so completers never deadlock)
//!   and a child reaching zero becomes ready (or scheduled, for a future
//!   run_at) in the same transaction, taking its place in its lane under the
//!   lane lock as promotion does. Two completers of a child's last two
//!   parents serialise on the child's row: exactly one sees zero.
//! - `ended`: a parent that ends failed or cancelled cancels its waiting
//!   children (the error names the parent), and theirs in turn; a child that
//!   says `"on_parent_failure": "run"` counts that parent as done instead.
use super::log::stmt::{prepared, ty, with_generic_plans, with_settings, PLAN_SETTINGS};
use crate::error::{self, raise};
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::{pg_sys, JsonB};
use std::collections::HashMap;

/// Most jobs one enqueue_flow takes.
pub const MAX_FLOW_JOBS: usize = 100_000;

/// One job of a flow, as parsed and checked.
#[derive(Debug, Default, PartialEq)]
pub struct FlowJob {
    pub key: String,
    pub kind: String,
    pub args: Option<serde_json::Value>,
    pub depends_on: Vec<String>,
    pub priority: Option<i32>,
    pub run_at: Option<String>,
    pub max_attempts: Option<i32>,
    pub actor: Option<String>,
    pub fairness_key: Option<String>,
    pub identity_key: Option<String>,
    pub run_on_parent_failure: bool,
    /// Trace context (docs/tracing.md): a JSON object of strings, checked
    /// by args::check_headers in check_options.
    pub headers: Option<serde_json::Value>,
}

/// Why a flow was refused: its SQLSTATE and message.
#[derive(Debug, PartialEq)]
pub struct Refusal {
    pub code: &'static str,
    pub msg: String,
}

fn refuse<T>(code: &'static str, msg: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal {
        code,
        msg: msg.into(),
    })
}

const FIELDS: [&str; 12] = [
    "key",
    "kind",
    "args",
    "depends_on",
    "priority",
    "run_at",
    "max_attempts",
    "actor",
    "fairness_key",
    "identity_key",
    "on_parent_failure",
    "headers",
];

fn opt_str(v: Option<&serde_json::Value>, what: &str) -> Result<Option<String>, Refusal> {
    match v {
        None => Ok(None),
        Some(v) if v.is_null() => Ok(None),
        Some(v) => match v.as_str() {
            Some(s) => Ok(Some(s.to_string())),
            None => refuse("22023", format!("{what} must be a string")),
        },
    }
}

fn opt_int(v: Option<&serde_json::Value>, what: &str) -> Result<Option<i32>, Refusal> {
    match v {
        None => Ok(None),
        Some(v) if v.is_null() => Ok(None),
        Some(v) => match v.as_i64().and_then(|i| i32::try_from(i).ok()) {
            Some(i) => Ok(Some(i)),
            None => refuse("22023", format!("{what} must be an integer")),
        },
    }
}

/// A parsed flow: its jobs in input order, and the edges (parent index,
/// child index).
pub type Parsed = (Vec<FlowJob>, Vec<(usize, usize)>);

/// Parses and checks a flow: a non-empty JSON array of objects with known
/// fields, unique keys, parents that are keys of the flow, no cycle.
/// Returns the jobs in input order and the edges (parent index, child
/// index), each edge once.
pub fn parse(jobs: &serde_json::Value) -> Result<Parsed, Refusal> {
    let Some(arr) = jobs.as_array() else {
        return refuse("22023", "jobs must be a JSON array of job objects");
    };
    if arr.is_empty() {
        return refuse("22023", "jobs must not be empty");
    }
    if arr.len() > MAX_FLOW_JOBS {
        return refuse(
            "54000",
            format!(
                "a flow has at most {MAX_FLOW_JOBS} jobs; this one has {}",
                arr.len()
            ),
        );
    }
    let mut out = Vec::with_capacity(arr.len());
    let mut index: HashMap<String, usize> = HashMap::with_capacity(arr.len());
    for (i, v) in arr.iter().enumerate() {
        let n = i + 1;
        let Some(o) = v.as_object() else {
            return refuse("22023", format!("jobs[{n}] must be a JSON object"));
        };
        if let Some(f) = o.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            if f == "unique_key" {
                return refuse(
                    "0A000",
                    format!("jobs[{n}]: unique_key is not supported in a flow"),
                );
            }
            return refuse(
                "42703",
                format!(
                    "jobs[{n}] has an unknown field {f:?} (known: {})",
                    FIELDS.join(", ")
                ),
            );
        }
        let Some(key) = opt_str(o.get("key"), &format!("jobs[{n}].key"))? else {
            return refuse("22004", format!("jobs[{n}].key is required"));
        };
        let Some(kind) = opt_str(o.get("kind"), &format!("jobs[{n}].kind"))? else {
            return refuse("22004", format!("jobs[{n}].kind is required"));
        };
        if kind.is_empty() {
            return refuse("22023", format!("jobs[{n}].kind must not be empty"));
        }
        let mut depends_on = Vec::new();
        match o.get("depends_on") {
            None => {}
            Some(d) if d.is_null() => {}
            Some(d) => {
                let Some(list) = d.as_array() else {
                    return refuse(
                        "22023",
                        format!("jobs[{n}].depends_on must be an array of keys"),
                    );
                };
                for p in list {
                    let Some(p) = p.as_str() else {
                        return refuse(
                            "22023",
                            format!("jobs[{n}].depends_on must be an array of keys"),
                        );
                    };
                    if !depends_on.iter().any(|x| x == p) {
                        depends_on.push(p.to_string());
                    }
                }
            }
        }
        let run_on_parent_failure = match opt_str(
            o.get("on_parent_failure"),
            &format!("jobs[{n}].on_parent_failure"),
        )?
        .as_deref()
        {
            None | Some("cancel") => false,
            Some("run") => true,
            Some(other) => {
                return refuse(
                    "22023",
                    format!("jobs[{n}].on_parent_failure must be 'cancel' or 'run', not {other:?}"),
                )
            }
        };
        let args = match o.get("args") {
            None => None,
            Some(a) if a.is_null() => None,
            Some(a) => Some(a.clone()),
        };
        let headers = match o.get("headers") {
            None => None,
            Some(h) if h.is_null() => None,
            Some(h) => Some(h.clone()),
        };
        let job = FlowJob {
            headers,
            key: key.clone(),
            kind,
            args,
            depends_on,
            priority: opt_int(o.get("priority"), &format!("jobs[{n}].priority"))?,
            run_at: opt_str(o.get("run_at"), &format!("jobs[{n}].run_at"))?,
            max_attempts: opt_int(o.get("max_attempts"), &format!("jobs[{n}].max_attempts"))?,
            actor: opt_str(o.get("actor"), &format!("jobs[{n}].actor"))?,
            fairness_key: opt_str(o.get("fairness_key"), &format!("jobs[{n}].fairness_key"))?,
            identity_key: opt_str(o.get("identity_key"), &format!("jobs[{n}].identity_key"))?,
            run_on_parent_failure,
        };
        if index.insert(key.clone(), i).is_some() {
            return refuse(
                "42710",
                format!("jobs[{n}]: key {key:?} appears twice in the flow"),
            );
        }
        out.push(job);
    }
    let mut edges = Vec::new();
    for (c, job) in out.iter().enumerate() {
        for p in &job.depends_on {
            match index.get(p) {
                Some(&pi) => edges.push((pi, c)),
                None => {
                    return refuse(
                        "42704",
                        format!(
                            "jobs[{}] ({:?}) depends on {p:?}, which is no key of the flow",
                            c + 1,
                            job.key
                        ),
                    )
                }
            }
        }
    }
    if let Some(k) = cycle_member(out.len(), &edges) {
        return refuse(
            "42P19",
            format!("the flow has a dependency cycle (through {:?})", out[k].key),
        );
    }
    Ok((out, edges))
}

/// A job on a cycle of the graph (Kahn's algorithm: what cannot be ordered
/// is on or behind a cycle), or None.
fn cycle_member(n: usize, edges: &[(usize, usize)]) -> Option<usize> {
    let mut indeg = vec![0usize; n];
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(p, c) in edges {
        indeg[c] += 1;
        out[p].push(c);
    }
    let mut stack: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    let mut seen = 0;
    while let Some(i) = stack.pop() {
        seen += 1;
        for &c in &out[i] {
            indeg[c] -= 1;
            if indeg[c] == 0 {
                stack.push(c);
            }
        }
    }
    (seen < n).then(|| (0..n).find(|&i| indeg[i] > 0).unwrap())
}

/// $1 queue, $2 kinds, $3 args, $4 priorities, $5 run_at (text), $6 actors,
/// $7 fairness keys, $8 identity keys, $9 max_attempts, $10 keys, $11
/// pending parents, $12 run on parent failure, $13 has children, $14 and
/// $15 the edges (parent ord, child ord), $16 the flow id (NULL: a new one).
/// Inserts the jobs (waiting when they have pending parents, else ready or
/// scheduled as at enqueue: ready ones under their lane's lock, ids in
/// input order) and the edges; returns (flow_id, key, id, state) in input
/// order, or no row when the queue does not exist. The macro's `$s`, `$u`,
/// `$a`, `$c`, `$v` add $17, the jobs' headers, to the input's columns, the
/// unnest, its column names,
/// the INSERT's columns and its values (empty: a flow without headers, whose
/// statement also runs on a schema from before 0.8.0).
macro_rules! flow_sql {
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
           COALESCE(t.run_at::timestamptz, now()) AS run_at,
           t.actor, t.fairness_key, t.identity_key,
           COALESCE(t.max_attempts, q.max_attempts) AS max_attempts,
           CASE WHEN q.mode = 'round_robin' THEN COALESCE(t.fairness_key, '') END AS rr_key,
           s.shard, t.key, t.pending, t.run_on_failure, t.has_children,"#,
            $s,
            r#"
           CASE WHEN t.pending > 0 THEN 'waiting'
                WHEN COALESCE(t.run_at::timestamptz > now(), false) THEN 'scheduled'
                ELSE 'ready' END AS state
    FROM q
    CROSS JOIN LATERAL (
        SELECT CASE WHEN q.shards > 1
                    THEN (pg_catalog.pg_backend_pid() % q.shards)::smallint
                    ELSE 0::smallint END AS shard) s
    CROSS JOIN LATERAL unnest($2::text[], $3::jsonb[], $4::smallint[], $5::text[],
                              $6::text[], $7::text[], $8::text[], $9::int[], $10::text[],
                              $11::int[], $12::boolean[], $13::boolean[]"#,
            $u,
            r#")
         WITH ORDINALITY AS t(kind, args, priority, run_at, actor, fairness_key,
                              identity_key, max_attempts, key, pending, run_on_failure,
                              has_children, "#,
            $a,
            r#"ord)
),
lanes AS MATERIALIZED (
    SELECT k.lane_key, pgque.xact_lock(1785684588, k.lane_key) AS lock
    FROM (SELECT pg_catalog.hashtext($1 || '/' || l.priority || '/' || l.shard) AS lane_key
          FROM (SELECT DISTINCT i.priority, i.shard FROM input i WHERE i.state = 'ready') l
          ORDER BY 1) k
),
flow AS MATERIALIZED (
    SELECT COALESCE($16::bigint, pg_catalog.nextval('pgque.job_flow_id_seq')) AS flow_id
    FROM q
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
                                 enqueued_at, flow_id, flow_key, pending_parents,
                                 run_on_parent_failure, has_children"#,
            $c,
            r#")
    SELECT n.id, $1, n.kind, n.args, n.priority, n.shard, n.state,
           CASE WHEN n.state = 'ready' THEN n.id END,
           n.run_at, n.max_attempts, n.actor, n.fairness_key, n.rr_key, n.identity_key,
           now(), f.flow_id, n.key, CASE WHEN n.pending > 0 THEN n.pending END,
           CASE WHEN n.run_on_failure THEN true END, CASE WHEN n.has_children THEN true END"#,
            $v,
            r#"
    FROM numbered n CROSS JOIN flow f
    ORDER BY n.ord
    RETURNING j.id, j.state, j.actor
),
deps AS (
    INSERT INTO pgque.job_deps (parent_id, child_id)
    SELECT p.id, c.id
    FROM unnest($14::int[], $15::int[]) AS e(parent_ord, child_ord)
    JOIN numbered p ON p.ord = e.parent_ord
    JOIN numbered c ON c.ord = e.child_ord
),
ev AS (
    INSERT INTO pgque.job_events (job_ids, queue, event, attempt)
    SELECT array_agg(ins.id ORDER BY ins.id), $1,
           CASE ins.state WHEN 'ready' THEN 'enqueued' ELSE ins.state END, 0
    FROM ins
    GROUP BY ins.state
),
act AS (
    INSERT INTO pgque.job_actors (actor)
    SELECT DISTINCT ins.actor FROM ins WHERE ins.actor IS NOT NULL ORDER BY 1
    ON CONFLICT DO NOTHING
)
SELECT f.flow_id, n.key, n.id, n.state
FROM numbered n CROSS JOIN flow f
WHERE (SELECT count(pg_catalog.pg_notify((CASE WHEN octet_length($1) <= 52 THEN 'pgque_jobs_' || $1 ELSE 'pgque_jobs_' || md5($1) END), ''))
       FROM (SELECT 1 FROM ins WHERE ins.state = 'ready' LIMIT 1) r) >= 0
ORDER BY n.ord
"#
        )
    };
}

const FLOW_SQL: &str = flow_sql!("", "", "", "", "");
/// FLOW_SQL for a flow of which some job has headers ($17).
const FLOW_HEADERS_SQL: &str = flow_sql!(
    " t.headers,",
    ", $17::jsonb[]",
    "headers, ",
    ", headers",
    ", n.headers"
);

/// Checks the per-job options as enqueue does (22023 / 22003; headers:
/// 22023 / 54000, and 0A000 on a schema from before 0.8.0, which has no
/// place for them).
fn check_options(jobs: &[FlowJob]) {
    for j in jobs {
        if let Some(h) = &j.headers {
            crate::headers::check_headers(&JsonB(h.clone()), &format!("job {:?}: headers", j.key));
            if !crate::headers::jobs_have_headers() {
                raise(
                    error::FEATURE_NOT_SUPPORTED,
                    "headers need the pgque 0.8.0 schema: run ALTER EXTENSION pgque UPDATE",
                );
            }
        }
        if let Some(p) = j.priority {
            super::args::check_priority(p);
        }
        if let Some(m) = j.max_attempts {
            super::args::check_max_attempts(m);
        }
        for (v, what) in [
            (&j.actor, "actor"),
            (&j.fairness_key, "fairness_key"),
            (&j.identity_key, "identity_key"),
        ] {
            if v.as_deref() == Some("") {
                raise(
                    error::INVALID_PARAMETER_VALUE,
                    format!("job {:?}: {what} must not be empty", j.key),
                );
            }
        }
    }
    check_run_at_texts(jobs);
}

/// 22023 for a run_at that is 'infinity' or '-infinity' (a job never
/// promoted, or one whose age no status view can compute), 22007 for text
/// that is no timestamp; one statement for all of a flow's run_at values.
fn check_run_at_texts(jobs: &[FlowJob]) {
    let texts: Vec<&str> = jobs.iter().filter_map(|j| j.run_at.as_deref()).collect();
    if texts.is_empty() {
        return;
    }
    let bad = Spi::get_one_with_args::<String>(
        "SELECT t FROM pg_catalog.unnest($1::text[]) t
         WHERE NOT pg_catalog.isfinite(t::pg_catalog.timestamptz) LIMIT 1",
        &[texts.into()],
    )
    .ok()
    .flatten();
    if let Some(t) = bad {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!("run_at must be finite, not {t:?}"),
        );
    }
}

/// Inserts `jobs` (pending parents per job: `pending`; has children:
/// `parents_of_some`) with `edges`; returns (flow_id, key, id, state).
fn insert(
    queue: &str,
    jobs: &[FlowJob],
    pending: &[i32],
    has_children: &[bool],
    edges: &[(usize, usize)],
    flow_id: Option<i64>,
) -> Vec<(i64, String, i64, String)> {
    let col = |f: &dyn Fn(&FlowJob) -> Option<String>| -> Vec<Option<String>> {
        jobs.iter().map(f).collect()
    };
    let kinds: Vec<String> = jobs.iter().map(|j| j.kind.clone()).collect();
    let args: Vec<JsonB> = jobs
        .iter()
        .map(|j| JsonB(j.args.clone().unwrap_or_else(|| serde_json::json!({}))))
        .collect();
    let prio: Vec<Option<i16>> = jobs.iter().map(|j| j.priority.map(|p| p as i16)).collect();
    let ma: Vec<Option<i32>> = jobs.iter().map(|j| j.max_attempts).collect();
    let run: Vec<bool> = jobs.iter().map(|j| j.run_on_parent_failure).collect();
    // a job enqueued behind existing jobs has no key (NULL)
    let keys: Vec<Option<String>> = jobs
        .iter()
        .map(|j| (!j.key.is_empty()).then(|| j.key.clone()))
        .collect();
    let (ep, ec): (Vec<i32>, Vec<i32>) = edges
        .iter()
        .map(|&(p, c)| (p as i32 + 1, c as i32 + 1))
        .unzip();
    let headers = jobs.iter().any(|j| j.headers.is_some());
    let mut args_in: Vec<DatumWithOid> = vec![
        queue.into(),
        kinds.into(),
        args.into(),
        prio.into(),
        col(&|j| j.run_at.clone()).into(),
        col(&|j| j.actor.clone()).into(),
        col(&|j| j.fairness_key.clone()).into(),
        col(&|j| j.identity_key.clone()).into(),
        ma.into(),
        keys.into(),
        pending.to_vec().into(),
        run.into(),
        has_children.to_vec().into(),
        ep.into(),
        ec.into(),
        flow_id.into(),
    ];
    if headers {
        let h: Vec<Option<JsonB>> = jobs.iter().map(|j| j.headers.clone().map(JsonB)).collect();
        args_in.push(h.into());
    }
    let rows = with_generic_plans(|| {
        Spi::connect_mut(|client| {
            let mut types = vec![
                ty(pg_sys::TEXTOID),
                ty(pg_sys::TEXTARRAYOID),
                ty(pg_sys::JSONBARRAYOID),
                ty(pg_sys::INT2ARRAYOID),
                ty(pg_sys::TEXTARRAYOID),
                ty(pg_sys::TEXTARRAYOID),
                ty(pg_sys::TEXTARRAYOID),
                ty(pg_sys::TEXTARRAYOID),
                ty(pg_sys::INT4ARRAYOID),
                ty(pg_sys::TEXTARRAYOID),
                ty(pg_sys::INT4ARRAYOID),
                ty(pg_sys::BOOLARRAYOID),
                ty(pg_sys::BOOLARRAYOID),
                ty(pg_sys::INT4ARRAYOID),
                ty(pg_sys::INT4ARRAYOID),
                ty(pg_sys::INT8OID),
            ];
            if headers {
                types.push(ty(pg_sys::JSONBARRAYOID));
            }
            let sql = if headers { FLOW_HEADERS_SQL } else { FLOW_SQL };
            let stmt = prepared(client, sql, &types);
            client
                .update(stmt, None, &args_in)
                .unwrap_or_else(|e| pgrx::error!("{e}"))
                .map(|r| {
                    (
                        r.get::<i64>(1).ok().flatten().unwrap_or(0),
                        r.get::<String>(2).ok().flatten().unwrap_or_default(),
                        r.get::<i64>(3).ok().flatten().unwrap_or(0),
                        r.get::<String>(4).ok().flatten().unwrap_or_default(),
                    )
                })
                .collect::<Vec<_>>()
        })
    });
    if rows.is_empty() {
        raise(
            error::UNDEFINED_OBJECT,
            format!("job queue {queue:?} does not exist"),
        );
    }
    if rows.iter().any(|r| r.3 == "scheduled") {
        crate::wake::at_commit();
    }
    if rows.iter().any(|r| r.3 == "ready") {
        // a flow's jobs may be in several queues
        crate::wake::all_jobs_at_commit();
    }
    rows
}

fn raise_refusal(r: Refusal) -> ! {
    let code = match r.code {
        "22004" => error::NULL_VALUE_NOT_ALLOWED,
        "42703" => error::UNDEFINED_COLUMN,
        "42704" => error::UNDEFINED_OBJECT,
        "42710" => error::DUPLICATE_OBJECT,
        "42P19" => error::INVALID_RECURSION,
        "54000" => error::LIMIT_EXCEEDED,
        "0A000" => error::FEATURE_NOT_SUPPORTED,
        _ => error::INVALID_PARAMETER_VALUE,
    };
    raise(code, r.msg)
}

/// Enqueues a flow: a JSON array of jobs `{key, kind, args, depends_on:
/// [keys], priority, run_at, max_attempts, actor, fairness_key,
/// identity_key, on_parent_failure: 'cancel' | 'run', headers: {trace
/// context}}` into one queue, all
/// or nothing, in one statement. A job with parents waits until all of them
/// completed. Returns (flow_id, key, job_id) per job in input order.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn enqueue_flow(
    queue_name: Option<&str>,
    jobs: Option<JsonB>,
) -> TableIterator<'static, (name!(flow_id, i64), name!(key, String), name!(job_id, i64))> {
    let queue = error::valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    let jobs = error::required(jobs, "jobs");
    let (jobs, edges) = parse(&jobs.0).unwrap_or_else(|r| raise_refusal(r));
    check_options(&jobs);
    let mut pending = vec![0i32; jobs.len()];
    let mut has_children = vec![false; jobs.len()];
    for &(p, c) in &edges {
        pending[c] += 1;
        has_children[p] = true;
    }
    let rows = insert(queue, &jobs, &pending, &has_children, &edges, None);
    TableIterator::new(rows.into_iter().map(|(f, k, id, _)| (f, k, id)))
}

/// $1 parents: each one's state and queue in either store (NULL: no such
/// job), as get_job says, read without a lock.
const PARENT_STATES_SQL: &str = r#"
SELECT p.id, g.state, g.queue
FROM pg_catalog.unnest($1::bigint[]) AS p(id)
LEFT JOIN LATERAL (SELECT g.state, g.queue FROM pgque.get_job(p.id) g LIMIT 1) g ON true
ORDER BY p.id
"#;

/// Whether the calling role (the role the session runs as, outside pgque's
/// SECURITY DEFINER frame) has the rights of pgque_reader or pgque_admin:
/// the roles that can see the jobs of every queue (job_parents,
/// flow_status, get_job). Superusers have every role's rights.
fn caller_sees_every_queue() -> bool {
    unsafe {
        let caller = pg_sys::GetOuterUserId();
        [c"pgque_reader", c"pgque_admin"].iter().any(|r| {
            let role = pg_sys::get_role_oid(r.as_ptr(), true);
            role != pg_sys::InvalidOid && pg_sys::has_privs_of_role(caller, role)
        })
    }
}

/// Refuses (42501, before anything is written) a parent in another queue
/// than `queue` unless the caller can see every queue's jobs. A queue is
/// the unit a writer's application owns (pgque has no per-queue grants, and
/// pgque_writer can see no job): a child joins its parents' flow (flow_id,
/// flow_status, job_parents), and linking it moves a parent of the job log
/// into pgque.jobs, so naming another application's job would put the
/// writer's job into that application's flow and change how that queue's
/// jobs are stored. Cross-queue pipelines stay open to roles that see both
/// queues. The message names neither the parent's queue nor its state,
/// which the writer could not read otherwise.
fn check_parents_visible(queue: &str, parents: &[(i64, Option<String>, Option<String>)]) {
    let Some((p, _, _)) = parents
        .iter()
        .find(|(_, _, q)| q.as_deref().is_some_and(|q| q != queue))
    else {
        return;
    };
    if caller_sees_every_queue() {
        return;
    }
    raise(
        error::INSUFFICIENT_PRIVILEGE,
        format!(
            "depends_on: job {p} is not a job of queue {queue:?}; a parent in another queue needs the rights of pgque_reader or pgque_admin"
        ),
    );
}

/// Enqueues one job behind existing jobs (`enqueue(..., depends_on)`) and
/// returns its id. 42704 for an unknown parent; 54000 beyond MAX_ARRAY.
///
/// The writer's transaction takes no lock on a parent, on its lane or on
/// anything of the parent's queue, and moves nothing: a writer that keeps
/// its transaction open must not hold up another queue's dispatch or a
/// parent's completion. It records the edges (job_deps) and, unless every
/// parent has completed already (the job is then ready at once), leaves the
/// job `waiting` with a row in pgque.job_links; the job_maint duty links it
/// after the commit (`link_late`), under its own short-lived locks, as this
/// function used to do in the writer's transaction.
pub fn enqueue_after(queue: &str, job: FlowJob, parents: &[i64]) -> i64 {
    error::check_len(parents.len(), "depends_on", error::MAX_ARRAY);
    let mut parents = parents.to_vec();
    parents.sort_unstable();
    parents.dedup();
    check_options(std::slice::from_ref(&job));
    if !has_job_links() {
        raise(
            error::FEATURE_NOT_SUPPORTED,
            "enqueue with depends_on needs the pgque 0.8.0 schema: run ALTER EXTENSION pgque UPDATE",
        );
    }
    let states: Vec<(i64, Option<String>, Option<String>)> = Spi::connect(|c| {
        c.select(PARENT_STATES_SQL, None, &[parents.clone().into()])
            .unwrap_or_else(|e| pgrx::error!("{e}"))
            .map(|r| {
                (
                    r.get::<i64>(1).ok().flatten().unwrap_or_default(),
                    r.get::<String>(2).ok().flatten(),
                    r.get::<String>(3).ok().flatten(),
                )
            })
            .collect()
    });
    if let Some((p, _, _)) = states.iter().find(|s| s.1.is_none()) {
        raise(error::UNDEFINED_OBJECT, format!("job {p} does not exist"));
    }
    check_parents_visible(queue, &states);
    // completed is final (retry takes failed and cancelled jobs only)
    let all_completed = states.iter().all(|s| s.1.as_deref() == Some("completed"));
    let flow_id = Spi::get_one_with_args::<i64>(
        "SELECT pg_catalog.min(j.flow_id) FROM pgque.jobs j WHERE j.id = ANY ($1::bigint[])",
        &[parents.clone().into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
    let pending = if all_completed {
        0
    } else {
        parents.len() as i32
    };
    let out = insert(
        queue,
        std::slice::from_ref(&job),
        &[pending],
        &[false],
        &[],
        flow_id,
    );
    let id = out[0].2;
    Spi::run_with_args(
        "INSERT INTO pgque.job_deps (parent_id, child_id)
         SELECT p, $2 FROM pg_catalog.unnest($1::bigint[]) p",
        &[parents.into(), id.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
    if !all_completed {
        Spi::run_with_args(
            "INSERT INTO pgque.job_links (child_id) VALUES ($1)",
            &[id.into()],
        )
        .unwrap_or_else(|e| pgrx::error!("{e}"));
        // an idle worker runs job_maint at once (duty_due counts job_links)
        crate::wake::at_commit();
    }
    id
}

/// Whether pgque.job_links exists: a schema older than the library (0.7.0
/// and before, until ALTER EXTENSION pgque UPDATE) has none.
fn has_job_links() -> bool {
    Spi::get_one::<bool>("SELECT pg_catalog.to_regclass('pgque.job_links') IS NOT NULL")
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// $1 child: its parents in pgque.jobs, locked (id order) unless another
/// transaction holds one (SKIP LOCKED), with the number of them there is.
const LOCK_PARENTS_SQL: &str = r#"
WITH p AS (SELECT d.parent_id AS id FROM pgque.job_deps d WHERE d.child_id = $1),
locked AS (
    SELECT j.id, j.state FROM pgque.jobs j
    WHERE j.id = ANY (ARRAY(SELECT p.id FROM p))
    ORDER BY j.id
    FOR UPDATE SKIP LOCKED
)
SELECT (SELECT pg_catalog.count(*)::int FROM pgque.jobs j WHERE j.id = ANY (ARRAY(SELECT p.id FROM p))),
       (SELECT pg_catalog.count(*)::int FROM locked),
       COALESCE((SELECT pg_catalog.array_agg(l.id ORDER BY l.id) FROM locked l
                  WHERE l.state IN ('waiting', 'scheduled', 'ready', 'running')), '{}'),
       COALESCE((SELECT pg_catalog.array_agg(l.id ORDER BY l.id) FROM locked l
                  WHERE l.state = 'failed'), '{}'),
       COALESCE((SELECT pg_catalog.array_agg(l.id ORDER BY l.id) FROM locked l
                  WHERE l.state = 'cancelled'), '{}')
"#;

/// Links up to `limit` jobs that `enqueue_after` left in pgque.job_links:
/// for each, its parents still in the job log move into pgque.jobs, the
/// parents are marked as having children, and the job waits for those not
/// completed (ready at once when none is left; parents that failed or were
/// cancelled act on it as if they ended now). Every lock is only tried, as
/// in any duty (duties.rs): a job whose parent, lane or claim another
/// transaction holds stays for the next run. Returns the jobs linked.
/// Called by job_maint; touches pgque.jobs, job_links and the job log.
pub fn link_late(limit: i64) -> i32 {
    if !has_job_links() {
        return 0;
    }
    let children: Vec<i64> = Spi::connect_mut(|c| {
        c.update(
            "SELECT l.child_id FROM pgque.job_links l ORDER BY l.child_id LIMIT $1
             FOR UPDATE SKIP LOCKED",
            None,
            &[limit.into()],
        )
        .map(|t| t.filter_map(|r| r.get::<i64>(1).ok().flatten()).collect())
        .unwrap_or_else(|e| pgrx::error!("{e}"))
    });
    let mut linked = 0;
    for child in children {
        if link_one(child) {
            linked += 1;
        }
    }
    linked
}

/// link_late for one job; false when something it needs is locked.
fn link_one(child: i64) -> bool {
    let forget = || {
        Spi::run_with_args(
            "DELETE FROM pgque.job_links l WHERE l.child_id = $1",
            &[child.into()],
        )
        .unwrap_or_else(|e| pgrx::error!("{e}"))
    };
    let in_log: Vec<i64> = Spi::connect(|c| {
        c.select(
            "SELECT d.parent_id FROM pgque.job_deps d WHERE d.child_id = $1
               AND NOT EXISTS (SELECT 1 FROM pgque.jobs j WHERE j.id = d.parent_id)
             ORDER BY 1",
            None,
            &[child.into()],
        )
        .map(|t| t.filter_map(|r| r.get::<i64>(1).ok().flatten()).collect())
        .unwrap_or_else(|e| pgrx::error!("{e}"))
    });
    // a parent still in the log moves into pgque.jobs, where its end finds
    // its children; one that completed there stays (and counts as done),
    // as does one pruned since the enqueue
    for p in in_log {
        if super::log::release::try_job_to_side(p).is_none() {
            return false;
        }
    }
    // lock order parent, then child: as a completer takes them
    let (present, locked, open, failed, cancelled) = Spi::connect_mut(|c| {
        let t = c
            .update(LOCK_PARENTS_SQL, None, &[child.into()])
            .unwrap_or_else(|e| pgrx::error!("{e}"));
        let r = t.first();
        (
            r.get::<i32>(1).ok().flatten().unwrap_or(0),
            r.get::<i32>(2).ok().flatten().unwrap_or(0),
            r.get::<Vec<i64>>(3).ok().flatten().unwrap_or_default(),
            r.get::<Vec<i64>>(4).ok().flatten().unwrap_or_default(),
            r.get::<Vec<i64>>(5).ok().flatten().unwrap_or_default(),
        )
    });
    if locked < present {
        return false;
    }
    // the job, locked unless another transaction holds it (its row then
    // still exists: this job waits for the next run)
    let state: Option<Option<String>> = Spi::connect_mut(|c| {
        let t = c
            .update(
                "SELECT j.state FROM pgque.jobs j WHERE j.id = $1 FOR UPDATE SKIP LOCKED",
                None,
                &[child.into()],
            )
            .unwrap_or_else(|e| pgrx::error!("{e}"));
        (!t.is_empty()).then(|| t.first().get::<String>(1).ok().flatten())
    });
    let Some(state) = state else {
        let exists = Spi::get_one_with_args::<bool>(
            "SELECT EXISTS (SELECT 1 FROM pgque.jobs j WHERE j.id = $1)",
            &[child.into()],
        )
        .ok()
        .flatten()
        .unwrap_or(true);
        if exists {
            return false;
        }
        // the job is gone (pruned): nothing to link
        forget();
        return true;
    };
    forget();
    if state.as_deref() != Some("waiting") {
        // cancelled, or made ready by its parents' ends meanwhile
        return true;
    }
    let pending = (open.len() + failed.len() + cancelled.len()) as i32;
    let marked: Vec<i64> = open
        .iter()
        .chain(&failed)
        .chain(&cancelled)
        .copied()
        .collect();
    Spi::run_with_args(
        "WITH c AS (UPDATE pgque.jobs j SET pending_parents = $2 WHERE j.id = $1)
         UPDATE pgque.jobs j SET has_children = true
         WHERE j.id = ANY ($3::bigint[]) AND j.has_children IS NOT TRUE",
        &[child.into(), pending.into(), marked.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
    if pending == 0 {
        wake(vec![child]);
    }
    // parents that ended already act on the job as if they ended now
    for (ids, word) in [(failed, "failed"), (cancelled, "cancelled")] {
        if !ids.is_empty() {
            propagate(ids, word);
        }
    }
    true
}

/// $1 completed parents: each waiting child's pending count goes down by
/// its parents among them (children locked in id order); returns the
/// children that reached zero.
const RELEASE_SQL: &str = r#"
WITH kids AS MATERIALIZED (
    SELECT d.child_id, count(*)::int AS n FROM pgque.job_deps d
    WHERE d.parent_id = ANY ($1::bigint[])
    GROUP BY d.child_id
),
locked AS MATERIALIZED (
    SELECT c.id FROM pgque.jobs c
    WHERE c.id = ANY (ARRAY(SELECT k.child_id FROM kids k)) AND c.state = 'waiting'
    ORDER BY c.id
    FOR UPDATE
),
dec AS (
    UPDATE pgque.jobs c SET pending_parents = c.pending_parents - k.n
    FROM kids k
    WHERE c.id = ANY (ARRAY(SELECT l.id FROM locked l)) AND c.id = k.child_id
      AND c.state = 'waiting'
    RETURNING c.id, c.pending_parents
)
SELECT COALESCE(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.pending_parents <= 0), '{}')
FROM dec d
"#;

/// $1 waiting jobs whose parents all ended: ready (under their lanes'
/// locks, taking their place now, as promotion does) or scheduled (a future
/// run_at); one event row per queue and state, a notification per queue.
const WAKE_SQL: &str = r#"
WITH w AS MATERIALIZED (
    SELECT j.id, j.queue, j.run_at > now() AS later,
           pg_catalog.hashtext(j.queue || '/' || j.priority || '/' || j.shard) AS lane_key
    FROM pgque.jobs j
    WHERE j.id = ANY ($1::bigint[]) AND j.state = 'waiting' AND j.pending_parents <= 0
    ORDER BY j.id
    FOR UPDATE
),
lanes AS MATERIALIZED (
    SELECT l.lane_key, pgque.xact_lock(1785684588, l.lane_key) AS lock
    FROM (SELECT DISTINCT w.lane_key FROM w WHERE NOT w.later ORDER BY 1) l
),
numbered AS MATERIALIZED (
    SELECT s.id, s.later,
           CASE WHEN s.later THEN NULL ELSE pg_catalog.nextval('pgque.jobs_id_seq') END AS ready_seq
    FROM (SELECT w.* FROM w WHERE (SELECT count(*) FROM lanes) >= 0 ORDER BY w.id) s
),
upd AS (
    UPDATE pgque.jobs j
    SET state = CASE WHEN n.later THEN 'scheduled' ELSE 'ready' END,
        ready_seq = n.ready_seq, pending_parents = NULL
    FROM numbered n
    WHERE j.id = ANY (ARRAY(SELECT n2.id FROM numbered n2)) AND j.id = n.id
    RETURNING j.id, j.queue, j.state
),
ev AS (
    INSERT INTO pgque.job_events (job_ids, queue, event, attempt, detail)
    SELECT array_agg(u.id ORDER BY u.id), u.queue,
           CASE WHEN u.state = 'ready' THEN 'promoted' ELSE 'scheduled' END, 0, 'parents done'
    FROM upd u
    GROUP BY u.queue, u.state
),
note AS (
    SELECT pg_catalog.pg_notify((CASE WHEN octet_length(q.queue) <= 52 THEN 'pgque_jobs_' || q.queue ELSE 'pgque_jobs_' || md5(q.queue) END), '')
    FROM (SELECT DISTINCT u.queue FROM upd u WHERE u.state = 'ready') q
)
SELECT (SELECT count(*)::int FROM upd WHERE upd.state = 'scheduled'), (SELECT count(*)::int FROM note)
"#;

/// The planner settings of RELEASE_SQL, WAKE_SQL and PROPAGATE_SQL: the job
/// statements' (stmt::PLAN_SETTINGS) and no nested loops. Each of them
/// joins the children it locked (a CTE of n rows) to pgque.jobs, which it
/// reads by `id = ANY (ARRAY(...))` of those n ids. As a nested loop with
/// that array scan on the inner side, the join probes the primary key n
/// times per outer row: n^2 (a fan-out of 8,000 children took 9.4 s to make
/// ready, 4,000 took 2.6 s). A hash or merge join reads each side once; the
/// array keeps the jobs side to the n rows whatever the plan.
pub const FLOW_PLAN_SETTINGS: [(&std::ffi::CStr, &std::ffi::CStr); 4] = [
    PLAN_SETTINGS[0],
    PLAN_SETTINGS[1],
    PLAN_SETTINGS[2],
    (c"enable_nestloop", c"off"),
];

/// Runs `f` under FLOW_PLAN_SETTINGS.
fn with_flow_plans<R>(f: impl FnOnce() -> R) -> R {
    with_settings(&FLOW_PLAN_SETTINGS, f)
}

fn ids_stmt(sql: &'static str, ids: Vec<i64>) -> Vec<i64> {
    with_flow_plans(|| {
        Spi::connect_mut(|client| {
            let stmt = prepared(client, sql, &[ty(pg_sys::INT8ARRAYOID)]);
            client
                .update(stmt, None, &[ids.into()])
                .unwrap_or_else(|e| pgrx::error!("{e}"))
                .first()
                .get::<Vec<i64>>(1)
                .ok()
                .flatten()
                .unwrap_or_default()
        })
    })
}

/// Makes the waiting jobs among `ids` whose parents all ended ready (or
/// scheduled).
fn wake(ids: Vec<i64>) {
    if ids.is_empty() {
        return;
    }
    let scheduled = with_flow_plans(|| {
        Spi::connect_mut(|client| {
            let stmt = prepared(client, WAKE_SQL, &[ty(pg_sys::INT8ARRAYOID)]);
            client
                .update(stmt, None, &[ids.into()])
                .unwrap_or_else(|e| pgrx::error!("{e}"))
                .first()
                .get::<i32>(1)
                .ok()
                .flatten()
                .unwrap_or(0)
        })
    });
    if scheduled > 0 {
        crate::wake::at_commit();
    }
    // children made ready: waiting dispatchers look (in whatever queue)
    crate::wake::all_jobs_at_commit();
}

/// The parents `ids` completed (the caller's statement did it and said
/// they have children): their children whose parents all ended now become
/// ready, in this transaction.
pub fn completed(ids: Vec<i64>) {
    if ids.is_empty() {
        return;
    }
    wake(ids_stmt(RELEASE_SQL, ids));
}

/// $1 parents that ended failed or cancelled ($2 says which): their waiting
/// children that run anyway count them as done; the others are cancelled,
/// the error naming the parent. Returns (children now without pending
/// parents, cancelled children that have children of their own).
const PROPAGATE_SQL: &str = r#"
WITH kids AS MATERIALIZED (
    SELECT d.child_id, count(*)::int AS n, min(d.parent_id) AS parent FROM pgque.job_deps d
    WHERE d.parent_id = ANY ($1::bigint[])
    GROUP BY d.child_id
),
locked AS MATERIALIZED (
    SELECT c.id FROM pgque.jobs c
    WHERE c.id = ANY (ARRAY(SELECT k.child_id FROM kids k)) AND c.state = 'waiting'
    ORDER BY c.id
    FOR UPDATE
),
upd AS (
    UPDATE pgque.jobs c
    SET pending_parents = CASE WHEN c.run_on_parent_failure THEN c.pending_parents - k.n
                               ELSE NULL END,
        state = CASE WHEN c.run_on_parent_failure THEN c.state ELSE 'cancelled' END,
        finished_at = CASE WHEN c.run_on_parent_failure THEN NULL ELSE now() END,
        errors = CASE WHEN c.run_on_parent_failure THEN c.errors
                      ELSE COALESCE(c.errors, '[]'::jsonb)
                           || jsonb_build_array(jsonb_build_object(
                                  'attempt', 0, 'at', now(),
                                  'error', 'parent ' || k.parent || ' ' || $2::text)) END
    FROM kids k
    WHERE c.id = ANY (ARRAY(SELECT l.id FROM locked l)) AND c.id = k.child_id
      AND c.state = 'waiting'
    RETURNING c.id, c.queue, c.state, c.pending_parents, c.has_children, k.parent
),
ev AS (
    INSERT INTO pgque.job_events (job_ids, queue, event, attempt, detail)
    SELECT array_agg(u.id ORDER BY u.id), u.queue, 'cancelled', 0,
           'parent ' || u.parent || ' ' || $2::text
    FROM upd u WHERE u.state = 'cancelled'
    GROUP BY u.queue, u.parent
)
SELECT COALESCE(array_agg(u.id ORDER BY u.id) FILTER (WHERE u.state = 'waiting' AND u.pending_parents <= 0), '{}'),
       COALESCE(array_agg(u.id ORDER BY u.id) FILTER (WHERE u.state = 'cancelled' AND u.has_children), '{}')
FROM upd u
"#;

/// The jobs `ids` ended `word` ('failed' or 'cancelled'): propagates to
/// their waiting descendants, level by level.
pub fn propagate(ids: Vec<i64>, word: &str) {
    let mut frontier = ids;
    let mut word = word.to_string();
    while !frontier.is_empty() {
        let (woke, next) = with_flow_plans(|| {
            Spi::connect_mut(|client| {
                let stmt = prepared(
                    client,
                    PROPAGATE_SQL,
                    &[ty(pg_sys::INT8ARRAYOID), ty(pg_sys::TEXTOID)],
                );
                let t = client
                    .update(stmt, None, &[frontier.clone().into(), word.clone().into()])
                    .unwrap_or_else(|e| pgrx::error!("{e}"));
                let r = t.first();
                (
                    r.get::<Vec<i64>>(1).ok().flatten().unwrap_or_default(),
                    r.get::<Vec<i64>>(2).ok().flatten().unwrap_or_default(),
                )
            })
        });
        wake(woke);
        frontier = next;
        word = "cancelled".into();
    }
}

/// A timestamptz as text, for FLOW_SQL's run_at column (cast back there).
pub fn timestamp_text(t: pgrx::datum::TimestampWithTimeZone) -> String {
    Spi::get_one_with_args::<String>("SELECT $1::text", &[t.into()])
        .ok()
        .flatten()
        .unwrap_or_else(|| pgrx::error!("pgque: cannot render a timestamp"))
}

#[cfg(test)]
mod pure_tests {
    use super::parse;
    use serde_json::json;

    fn code(v: serde_json::Value) -> &'static str {
        parse(&v).err().map(|r| r.code).unwrap_or("ok")
    }

    #[test]
    fn flows_are_checked_before_anything_is_written() {
        assert_eq!(code(json!({"key": "a"})), "22023");
        assert_eq!(code(json!([])), "22023");
        assert_eq!(code(json!([1])), "22023");
        assert_eq!(
            code(json!([{"key": "a", "kind": "k", "dependson": []}])),
            "42703"
        );
        assert_eq!(
            code(json!([{"key": "a", "kind": "k", "unique_key": "u"}])),
            "0A000"
        );
        assert_eq!(code(json!([{"kind": "k"}])), "22004");
        assert_eq!(code(json!([{"key": "a"}])), "22004");
        assert_eq!(code(json!([{"key": "a", "kind": ""}])), "22023");
        assert_eq!(code(json!([{"key": 1, "kind": "k"}])), "22023");
        assert_eq!(
            code(json!([{"key": "a", "kind": "k", "priority": "high"}])),
            "22023"
        );
        assert_eq!(
            code(json!([{"key": "a", "kind": "k", "depends_on": "b"}])),
            "22023"
        );
        assert_eq!(
            code(json!([{"key": "a", "kind": "k", "on_parent_failure": "ignore"}])),
            "22023"
        );
        assert_eq!(
            code(json!([{"key": "a", "kind": "k"}, {"key": "a", "kind": "k"}])),
            "42710"
        );
        assert_eq!(
            code(json!([{"key": "a", "kind": "k", "depends_on": ["x"]}])),
            "42704"
        );
        assert_eq!(
            code(json!([{"key": "a", "kind": "k", "depends_on": ["a"]}])),
            "42P19"
        );
        assert_eq!(
            code(json!([
                {"key": "a", "kind": "k", "depends_on": ["c"]},
                {"key": "b", "kind": "k", "depends_on": ["a"]},
                {"key": "c", "kind": "k", "depends_on": ["b"]},
                {"key": "d", "kind": "k"}
            ])),
            "42P19"
        );
    }

    #[test]
    fn a_diamond_parses_into_its_edges() {
        let (jobs, edges) = parse(&json!([
            {"key": "a", "kind": "k", "args": {"x": 1}},
            {"key": "b", "kind": "k", "depends_on": ["a", "a"]},
            {"key": "c", "kind": "k", "depends_on": ["a"], "on_parent_failure": "run", "priority": 3},
            {"key": "d", "kind": "k", "depends_on": ["b", "c"]}
        ]))
        .unwrap();
        assert_eq!(jobs.len(), 4);
        assert_eq!(jobs[0].args, Some(json!({"x": 1})));
        assert!(jobs[2].run_on_parent_failure && !jobs[1].run_on_parent_failure);
        assert_eq!(jobs[2].priority, Some(3));
        // a repeated parent is one edge
        assert_eq!(edges, vec![(0, 1), (0, 2), (1, 3), (2, 3)]);
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[path = "flows_tests.rs"]
mod tests;
