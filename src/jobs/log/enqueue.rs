//! Enqueue into the log: one row per batch and lane.
//!
//! Used by enqueue_ready_rows / enqueue for a batch whose every job is
//! ordinary (`eligible`): no unique key, no actor, no identity key, ready
//! now, into a strict_fifo queue (checked by the statement), with
//! `pgque.job_log` on. The statement takes the same locks as ENQUEUE_SQL (the
//! queue's shared lock, the lanes' locks in hash order, before the first id),
//! so log and pgque.jobs producers of one lane serialise on one lock and their
//! ids are one order.
use super::outcomes::Outcome;
use super::stmt::{prepared, ty, with_generic_plans};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// The most jobs one log row holds.
pub const ROW_MAX: usize = 256;

/// The queue $1 if it is strict_fifo, locked shared (drop waits), with
/// this backend's shard: the common head of the two statements.
macro_rules! fifo_queue {
    () => {
        r#"
WITH q AS MATERIALIZED (
    SELECT jq.queue_name, jq.max_attempts,
           pgque.xact_lock_shared(1785684593, pg_catalog.hashtext(jq.queue_name)) AS qlock,
           CASE WHEN jq.shards > 1 THEN (pg_catalog.pg_backend_pid() % jq.shards)::smallint
                ELSE 0::smallint END AS shard
    FROM pgque.job_queues jq
    WHERE jq.queue_name = $1 AND jq.mode = 'strict_fifo'
),"#
    };
}

/// $1..$10 as ENQUEUE_SQL (queue, kinds, args, priorities, run_at, actors,
/// fairness_keys, identity_keys, unique_keys, max_attempts), $11 the ready
/// lanes' priorities. Returns one row: the jobs' ids in input order and
/// 'ready' (every job of the batch is ready: the caller numbers them), or
/// (NULL, 'nolane') when a lane has no job_lanes row yet (nothing was
/// written: the caller creates the lanes and runs it again); no row when the
/// queue does not exist or is not strict_fifo (the caller takes the
/// pgque.jobs path, which reports a missing queue).
///
/// A batch in one lane of at most 256 jobs stores the argument arrays as
/// they came (no unnest); a bigger batch or one over several priorities is
/// split into rows of at most 256 jobs of one lane each (ROW_MAX: a dispatch
/// unpacks at most limit + ROW_MAX jobs, whatever the batch sizes). Optional
/// attributes are NULL arrays when the call passed none.
///
/// The macro's `$u`, `$a`, `$s`, `$c`, `$v` add the jobs' headers ($12) to the
/// unnest, its column names, the split rows, the INSERT's columns and its
/// values (empty: a batch without headers, whose statement is the one from
/// before headers existed, and works on a schema without the column).
macro_rules! log_enqueue_sql {
    ($u:expr, $a:expr, $s:expr, $c:expr, $v:expr) => {
        concat!(
    fifo_queue!(),
    r#"
lanes AS MATERIALIZED (
    SELECT k.priority, pgque.xact_lock(1785684588, k.lane_key) AS lock,
           (SELECT l.lane_id FROM pgque.job_lanes l
            WHERE l.queue = $1 AND l.priority = k.priority AND l.shard = k.shard) AS lane_id
    FROM (SELECT p.priority, q.shard,
                 pg_catalog.hashtext($1 || '/' || p.priority || '/' || q.shard) AS lane_key
          FROM q CROSS JOIN unnest($11::smallint[]) AS p(priority)
          ORDER BY 3) k
),
ok AS MATERIALIZED (
    SELECT count(*) > 0 AND count(*) = count(l.lane_id) AS ok FROM lanes l
),
ids AS MATERIALIZED (
    SELECT g.o AS ord, pg_catalog.nextval('pgque.jobs_id_seq') AS id,
           COALESCE(($4::smallint[])[g.o], 0::smallint) AS priority
    FROM (SELECT o FROM generate_series(1, cardinality($2::text[])) AS o
          WHERE (SELECT ok.ok FROM ok)
          ORDER BY o) g
),
split AS MATERIALIZED (
    SELECT l.lane_id, (i.ord - 1) / 256 AS chunk,
           array_agg(u.kind ORDER BY u.ord) AS kinds, array_agg(u.args ORDER BY u.ord) AS args,
           array_agg(u.run_at ORDER BY u.ord) AS run_ats,
           array_agg(u.ma ORDER BY u.ord) AS mas, array_agg(u.fk ORDER BY u.ord) AS fks"#,
    $s,
    r#"
    FROM unnest($2::text[], $3::jsonb[], $5::timestamptz[], $10::int[], $7::text[]"#,
    $u,
    r#")
         WITH ORDINALITY AS u(kind, args, run_at, ma, fk, "#,
    $a,
    r#"ord)
    JOIN ids i ON i.ord = u.ord
    JOIN lanes l ON l.priority = i.priority
    WHERE cardinality($11::smallint[]) > 1 OR cardinality($2::text[]) > 256
    GROUP BY l.lane_id, (i.ord - 1) / 256
),
rows AS MATERIALIZED (
    SELECT l.lane_id, (i.ord - 1) / 256 AS chunk,
           min(i.id) AS id_lo, max(i.id) AS id_hi, count(*)::int AS n,
           CASE WHEN max(i.id) - min(i.id) + 1 = count(*) THEN NULL
                ELSE array_agg(i.id ORDER BY i.ord) END AS ids
    FROM ids i JOIN lanes l ON l.priority = i.priority
    GROUP BY l.lane_id, (i.ord - 1) / 256
),
ins AS (
    INSERT INTO pgque.job_log (seg, lane_id, id_lo, id_hi, n, ids, enqueued_at, max_attempts,
                               kinds, args, run_ats, job_max_attempts, fairness_keys"#,
    $c,
    r#")
    SELECT "#,
    crate::cur_seg!(),
    r#", r.lane_id, r.id_lo, r.id_hi, r.n, r.ids, now(),
           (SELECT q.max_attempts FROM q),
           COALESCE(s.kinds, $2::text[]), COALESCE(s.args, $3::jsonb[]),
           CASE WHEN s.lane_id IS NULL THEN $5::timestamptz[] ELSE s.run_ats END,
           CASE WHEN s.lane_id IS NULL THEN $10::int[] ELSE s.mas END,
           CASE WHEN s.lane_id IS NULL THEN $7::text[] ELSE s.fks END"#,
    $v,
    r#"
    FROM rows r LEFT JOIN split s ON s.lane_id = r.lane_id AND s.chunk = r.chunk
)
(SELECT array_agg(i.id ORDER BY i.ord), 'ready'::text FROM ids i
 WHERE (SELECT count(pg_catalog.pg_notify((CASE WHEN octet_length($1) <= 52 THEN 'pgque_jobs_' || $1 ELSE 'pgque_jobs_' || md5($1) END), ''))
        FROM (SELECT 1 FROM ids LIMIT 1) r) >= 0
 HAVING count(*) > 0)
UNION ALL
SELECT NULL::bigint[], 'nolane'::text FROM ok WHERE NOT ok.ok AND EXISTS (SELECT 1 FROM q)
"#
        )
    };
}

pub const LOG_ENQUEUE_SQL: &str = log_enqueue_sql!("", "", "", "", "");
/// LOG_ENQUEUE_SQL for a batch with headers ($12, aligned with kinds).
pub const LOG_ENQUEUE_HEADERS_SQL: &str = log_enqueue_sql!(
    ", $12::jsonb[]",
    "h, ",
    ", array_agg(u.h ORDER BY u.ord) AS hs",
    ", headers",
    ",
           CASE WHEN s.lane_id IS NULL THEN $12::jsonb[] ELSE s.hs END"
);

/// LOG_ENQUEUE_SQL for the common batch: one lane, at most ROW_MAX jobs.
/// Same arguments, locks and result; the arrays are stored as they came and
/// the ids are taken as one array, in input order, after the lane's lock,
/// so nothing is unnested, sorted or regrouped (the per-job CTE this
/// replaces took half of the statement's time). `$c`, `$v`: as in
/// log_enqueue_sql.
macro_rules! log_enqueue_one_sql {
    ($c:expr, $v:expr) => {
        concat!(
    fifo_queue!(),
    r#"
lane AS MATERIALIZED (
    SELECT pgque.xact_lock(1785684588,
               pg_catalog.hashtext($1 || '/' || ($11::smallint[])[1] || '/' || q.shard)) AS lock,
           (SELECT l.lane_id FROM pgque.job_lanes l
            WHERE l.queue = $1 AND l.priority = ($11::smallint[])[1] AND l.shard = q.shard) AS lane_id
    FROM q
),
ids AS MATERIALIZED (
    SELECT ARRAY(SELECT pg_catalog.nextval('pgque.jobs_id_seq')
                 FROM generate_series(1, cardinality($2::text[]))) AS a, lane.lane_id
    FROM lane WHERE lane.lane_id IS NOT NULL
),
ins AS (
    INSERT INTO pgque.job_log (seg, lane_id, id_lo, id_hi, n, ids, enqueued_at, max_attempts,
                               kinds, args, run_ats, job_max_attempts, fairness_keys"#,
    $c,
    r#")
    SELECT "#,
    crate::cur_seg!(),
    r#", i.lane_id, i.a[1], i.a[cardinality(i.a)], cardinality(i.a),
           CASE WHEN i.a[cardinality(i.a)] - i.a[1] + 1 = cardinality(i.a) THEN NULL ELSE i.a END,
           now(), (SELECT q.max_attempts FROM q),
           $2::text[], $3::jsonb[], $5::timestamptz[], $10::int[], $7::text[]"#,
    $v,
    r#"
    FROM ids i
)
(SELECT i.a, 'ready'::text FROM ids i
 WHERE (SELECT count(pg_catalog.pg_notify((CASE WHEN octet_length($1) <= 52 THEN 'pgque_jobs_' || $1 ELSE 'pgque_jobs_' || md5($1) END), '')) FROM ids) >= 0)
UNION ALL
SELECT NULL::bigint[], 'nolane'::text FROM lane WHERE lane.lane_id IS NULL
"#
        )
    };
}

pub const LOG_ENQUEUE_ONE_SQL: &str = log_enqueue_one_sql!("", "");
/// LOG_ENQUEUE_ONE_SQL for a batch with headers ($12).
pub const LOG_ENQUEUE_ONE_HEADERS_SQL: &str = log_enqueue_one_sql!(", headers", ", $12::jsonb[]");

/// Advisory-lock class of a queue's lane creation (class, hashtext(queue)):
/// held to commit by the transaction that creates lanes of the queue, so
/// that the next creator counts them (CREATE_LANES_SQL).
const LANE_CREATE_LOCK_CLASS: i32 = 0x6A6F_626E; // "jobn"
const _: () = assert!(
    LANE_CREATE_LOCK_CLASS == 1785684590,
    "LANE_CREATE_LOCK_SQL's class"
);

/// The lane-creation lock of queue $1 if no other transaction holds it.
const LANE_CREATE_LOCK_SQL: &str =
    "SELECT pgque.try_xact_lock(1785684590, pg_catalog.hashtext($1))";

/// The lanes of `$2` (priorities) for this backend's shard of queue $1, all
/// or none: none when the queue would then have more than $3 lanes
/// (pgque.job_lanes_per_queue). A writer chooses its priorities (-1000 to
/// 1000) and its backend's shard, and every lane costs each dispatch of the
/// queue a probe, the rotation a floor and the status views a row
/// (DESIGN.md 25), so lanes are bounded; a job of a lane that cannot be
/// made goes to pgque.jobs, whose jobs dispatch ranks with the log's by
/// (priority, id) (log/dispatch.rs), so the order is the same. The caller
/// holds the queue's lane-creation lock (LANE_CREATE_LOCK_SQL, a statement
/// before this one), so the count here includes every lane a committed
/// creator made and no other creator adds one until this transaction ends.
const CREATE_LANES_SQL: &str = r#"
WITH q AS MATERIALIZED (
    SELECT jq.queue_name,
           CASE WHEN jq.shards > 1 THEN (pg_catalog.pg_backend_pid() % jq.shards)::smallint
                ELSE 0::smallint END AS shard
    FROM pgque.job_queues jq
    WHERE jq.queue_name = $1
),
new AS MATERIALIZED (
    SELECT DISTINCT p.priority, q.shard
    FROM q CROSS JOIN unnest($2::smallint[]) AS p(priority)
    WHERE NOT EXISTS (SELECT 1 FROM pgque.job_lanes l
                      WHERE l.queue = $1 AND l.priority = p.priority AND l.shard = q.shard)
)
INSERT INTO pgque.job_lanes (queue, priority, shard)
SELECT $1, n.priority, n.shard FROM new n
WHERE (SELECT count(*) FROM pgque.job_lanes l WHERE l.queue = $1)
      + (SELECT count(*) FROM new) <= $3
ON CONFLICT DO NOTHING
"#;

/// Creates the lanes of `lanes` (priorities) of `queue` for this backend's
/// shard if the queue's lane bound allows all of them (CREATE_LANES_SQL).
/// Creates none when another transaction is creating lanes of the queue
/// (its lock is only tried: a producer never waits for another's commit
/// here) or when the transaction reads with one snapshot (REPEATABLE READ
/// could not count a lane committed after it began). The caller's batch
/// then goes to pgque.jobs, which is correct, only slower to dispatch.
fn create_lanes(client: &mut pgrx::spi::SpiClient<'_>, queue: &str, lanes: &[i16]) {
    if super::xact_snapshot() {
        return;
    }
    let lock = prepared(client, LANE_CREATE_LOCK_SQL, &[ty(pg_sys::TEXTOID)]);
    let got = client
        .update(lock, None, &[queue.into()])
        .unwrap_or_else(|e| pgrx::error!("{e}"))
        .first()
        .get::<bool>(1)
        .ok()
        .flatten()
        .unwrap_or(false);
    if !got {
        return;
    }
    let create = prepared(
        client,
        CREATE_LANES_SQL,
        &[
            ty(pg_sys::TEXTOID),
            ty(pg_sys::INT2ARRAYOID),
            ty(pg_sys::INT4OID),
        ],
    );
    client
        .update(
            create,
            None,
            &[
                queue.into(),
                lanes.to_vec().into(),
                crate::gucs::job_lanes_per_queue().into(),
            ],
        )
        .unwrap_or_else(|e| pgrx::error!("{e}"));
}

/// Whether a batch can go to the log, from what the call passed: no unique
/// key, actor or identity key, and every job ready now (`all_ready`).
pub fn eligible(keyed: bool, has_actor: bool, has_identity: bool, all_ready: bool) -> bool {
    crate::gucs::job_log() && !keyed && !has_actor && !has_identity && all_ready
}

/// Runs LOG_ENQUEUE_ONE_SQL or LOG_ENQUEUE_SQL with `args` (the 11
/// arguments of a batch of `n` jobs, or 12 with the headers: their
/// _HEADERS_ statements); `lanes` are the priorities of $11. None when the queue is missing or not strict_fifo
/// (or, at REPEATABLE READ, a lane is not visible yet): pgque.jobs' path then.
pub fn run(
    args: &[DatumWithOid<'_>],
    queue: &str,
    n: usize,
    lanes: &[i16],
) -> Option<Vec<Outcome>> {
    let outcomes = |ids: Vec<i64>| -> Vec<Outcome> {
        ids.into_iter()
            .enumerate()
            .map(|(i, id)| Outcome {
                ord: i as i32 + 1,
                job_id: Some(id),
                state: "ready".into(),
            })
            .collect()
    };
    let headers = args.len() == 12;
    let sql = match (lanes.len() == 1 && n <= ROW_MAX, headers) {
        (true, false) => LOG_ENQUEUE_ONE_SQL,
        (false, false) => LOG_ENQUEUE_SQL,
        (true, true) => LOG_ENQUEUE_ONE_HEADERS_SQL,
        (false, true) => LOG_ENQUEUE_HEADERS_SQL,
    };
    with_generic_plans(|| {
        Spi::connect_mut(|client| {
            let base = arg_types();
            let with_headers: Vec<pg_sys::PgOid>;
            let types = if headers {
                with_headers = base
                    .iter()
                    .copied()
                    .chain([ty(pg_sys::JSONBARRAYOID)])
                    .collect();
                &with_headers[..]
            } else {
                &base[..]
            };
            let stmt = prepared(client, sql, types);
            for attempt in 0..2 {
                let mut table = client
                    .update(stmt, None, args)
                    .unwrap_or_else(|e| pgrx::error!("{e}"));
                // one row (a statement's 100 rows were read one value at
                // a time through SPI); none: the queue is not the log's
                let row = table.next()?;
                if row.get::<&str>(2).ok().flatten() != Some("nolane") {
                    let ids = row.get::<Vec<i64>>(1).ok().flatten().unwrap_or_default();
                    return Some(outcomes(ids));
                }
                if attempt == 1 {
                    // a lane the queue's bound, another creator or the
                    // isolation level kept from being made: pgque.jobs takes
                    // the batch
                    return None;
                }
                create_lanes(client, queue, lanes);
            }
            None
        })
    })
}

/// The argument types of the enqueue statements (ENQUEUE_SQL takes the first
/// ten; ENQUEUE_NO_KEYS_SQL and the job log's take all eleven).
pub fn arg_types() -> [pgrx::pg_sys::PgOid; 11] {
    [
        ty(pg_sys::TEXTOID),
        ty(pg_sys::TEXTARRAYOID),
        ty(pg_sys::JSONBARRAYOID),
        ty(pg_sys::INT2ARRAYOID),
        ty(pg_sys::TIMESTAMPTZARRAYOID),
        ty(pg_sys::TEXTARRAYOID),
        ty(pg_sys::TEXTARRAYOID),
        ty(pg_sys::TEXTARRAYOID),
        ty(pg_sys::TEXTARRAYOID),
        ty(pg_sys::INT4ARRAYOID),
        // ENQUEUE_NO_KEYS_SQL only: the ready lanes' priorities
        ty(pg_sys::INT2ARRAYOID),
    ]
}
