//! Dispatch from the log.
//!
//! `dispatch` (src/jobs/dispatch.rs) runs, for queues that have lanes:
//! 1. LOCK_LANES_SQL: the dispatch lock of the call's lane when it has one;
//!    with more, READY_LANES_SQL: the dispatch locks of the lanes that can
//!    have a ready job, in lane order (a lane all handed out costs no lock);
//! 2. with one lane (the common call), `dispatch_one` (dispatch_one.rs):
//!    LANE_STATE_SQL reads the lane's cursor, whether the call is blocked
//!    (as below) and the first log rows above the cursor, LANE_ROWS_SQL more
//!    rows when those hold fewer than `limit` jobs, and CLAIM_SQL writes the
//!    claim of the first `limit` jobs, cut out of the rows in Rust;
//!    with several lanes, LOG_DISPATCH_SQL: each lane's cursor (max(hi) of its claims, a backward
//!    index probe), its next jobs (the log rows above the cursor, walked one
//!    index probe at a time until `limit` jobs: O(limit) whatever the depth),
//!    ranked as DISPATCH_SQL ranks a strict_fifo queue ((priority, id) per
//!    queue, queues interleaved), the first `limit` claimed with one claim row
//!    per lane. It claims nothing and says `blocked` when the call must merge
//!    with pgque.jobs: a queue of the call has a ready job there, a lane's
//!    queue is round_robin, or a lane has a hole above its cursor;
//! 3. when blocked, LOG_SPILL_SQL copies the jobs of each lane that must be
//!    ranked against pgque.jobs' ready jobs into pgque.jobs (as ready, in
//!    their place: ready_seq = id), moves the lane cursor past them with a
//!    claim row of state 's', and DISPATCH_SQL runs as for any pgque.jobs job.
//!
//! What is spilled is bounded so that the merge is exact and stops: with c
//! ready jobs in pgque.jobs among the first `limit` of a queue, a lane spills
//! at most limit - c jobs (c < limit), or, when c = limit, only the jobs that
//! rank before the limit-th of those. DISPATCH_SQL then picks the first
//! `limit` of the union, and every job left in the log ranks after them.

/// LOCK_LANES_SQL for a schema from before rate limits (0.6.0 and older:
/// the library is updated before ALTER EXTENSION UPDATE runs).
pub const LOCK_LANES_SQL_NO_RATE: &str = r#"
WITH lanes AS MATERIALIZED (
    SELECT l.lane_id FROM pgque.job_lanes l WHERE l.queue = ANY ($1::text[])
)
SELECT COALESCE(array_agg(x.lane_id ORDER BY x.lane_id), '{}'::int[]), NULL::int, NULL::text[],
       NULL::text[],
       (SELECT array_agg(l.lane_id ORDER BY l.lane_id) FROM lanes l
        WHERE (SELECT count(*) FROM lanes) > 1)
FROM (SELECT l.lane_id, pgque.xact_lock(1785684580, l.lane_id) AS lk
      FROM lanes l
      WHERE (SELECT count(*) FROM lanes) = 1) x
"#;

/// The lanes of queues $1 and their rate-limit buckets (src/jobs/rate.rs),
/// locked in queue order. Returns the lane, locked, when the call's queues
/// have exactly one (the common call: dispatch_one follows, so this path
/// reads nothing more than it did), else an empty array; the whole tokens
/// of the emptiest bucket, the queues that have one and their rows' ctids
/// (for rate::DEBIT_SQL; NULL, NULL, NULL: no limit); and, when the call
/// has more than one lane, their ids, not locked (READY_LANES_SQL locks
/// those that can have a ready job; NULL: none or one). Lanes and buckets are
/// found by one index probe per queue of the call (lateral lookups): with
/// `l.queue = ANY ($1)`, the kept generic plan made while job_lanes was
/// tiny walked the whole lanes primary key (1,001 of 1,001 lanes with 1,000
/// queues, under stmt::PLAN_SETTINGS); rate_tests.rs checks it.
pub const LOCK_LANES_SQL: &str = concat!(
    r#"
WITH rl AS MATERIALIZED (
    SELECT b.queue_name, b.ctid AS tid, "#,
    crate::refill!(b, jobs, per, burst),
    r#" AS avail
    FROM (SELECT DISTINCT q.name FROM unnest($1::text[]) AS q(name) ORDER BY q.name) n
    CROSS JOIN LATERAL (
        SELECT b.ctid, b.* FROM pgque.job_rate_limits b
        WHERE b.queue_name = n.name
        FOR UPDATE) b
),
lanes AS MATERIALIZED (
    SELECT l.lane_id
    FROM (SELECT DISTINCT q.name FROM unnest($1::text[]) AS q(name)) n
    CROSS JOIN LATERAL (SELECT l.lane_id FROM pgque.job_lanes l
                        WHERE l.queue = n.name OFFSET 0) l
)
SELECT COALESCE(array_agg(x.lane_id ORDER BY x.lane_id), '{}'::int[]),
       (SELECT floor(min(rl.avail))::int FROM rl),
       (SELECT array_agg(rl.queue_name ORDER BY rl.queue_name) FROM rl),
       (SELECT array_agg(rl.tid::text ORDER BY rl.queue_name) FROM rl),
       (SELECT array_agg(l.lane_id ORDER BY l.lane_id) FROM lanes l
        WHERE (SELECT count(*) FROM lanes) > 1)
FROM (SELECT l.lane_id, pgque.xact_lock(1785684580, l.lane_id) AS lk
      FROM lanes l
      WHERE (SELECT count(*) FROM lanes) = 1) x
"#
);

/// $1 the call's lanes (more than one, from LOCK_LANES_SQL), $2 its
/// queues: the dispatch locks of the lanes that can have a ready job, in
/// lane order, and their ids; and whether pgque.jobs has a ready job in a
/// queue of the call (false with no lane locked: nothing to dispatch, and
/// DISPATCH_SQL is not run, as LOG_DISPATCH_SQL's `blocked` spares it).
/// A lane can have one when a log row of it ends above its cursor (one
/// probe of job_log (lane_id, id_hi) after the cursor's probe of
/// job_claims (lane_id, hi)): a lane whose jobs were all handed out costs
/// two probes and no lock, so a queue's dispatch holds as many locks as it
/// has lanes with work, at most pgque.job_lanes_per_queue each.
/// The test is read before the locks, in this statement's snapshot: a lane
/// that looks empty had no ready job committed before the call began (the
/// cursor and the head only grow, and producers commit a lane's jobs in id
/// order), so leaving it out is the dispatch of a moment earlier; a lane
/// that looks ready is locked and read again by the next statement. A
/// rotation's truncation can only make a lane look readier (a lower cursor
/// read from an emptied partition), never empty while it has a job.
pub const READY_LANES_SQL: &str = r#"
SELECT COALESCE(array_agg(x.lane_id ORDER BY x.lane_id), '{}'::int[]),
       EXISTS (SELECT 1 FROM unnest($2::text[]) AS q(name) CROSS JOIN LATERAL (
                   SELECT 1 FROM pgque.jobs j
                   WHERE j.queue = q.name AND j.state = 'ready'
                   ORDER BY j.priority, j.ready_seq LIMIT 1) s)
FROM (SELECT l.lane_id, pgque.xact_lock(1785684580, l.lane_id) AS lk
      FROM pgque.job_lanes l
      WHERE l.lane_id = ANY ($1::int[])
        AND EXISTS (SELECT 1 FROM pgque.job_log r
                    WHERE r.lane_id = l.lane_id
                      AND r.id_hi > GREATEST(l.cursor_floor,
                                             (SELECT c.hi FROM pgque.job_claims c
                                              WHERE c.lane_id = l.lane_id
                                              ORDER BY c.hi DESC LIMIT 1)))
      ORDER BY l.lane_id) x
"#;

/// The lanes of the call with their cursors; the first common part of the
/// two statements ($1 queues, $5 lane ids).
macro_rules! lanes_head {
    () => {
        concat!(
            crate::dispatch_queues!(),
            r#"
lanes AS MATERIALIZED (
    SELECT l.lane_id, l.queue, l.priority, l.shard, qs.pos, qs.mode, qs.lease,
           GREATEST(l.cursor_floor,
                    (SELECT c.hi FROM pgque.job_claims c WHERE c.lane_id = l.lane_id
                     ORDER BY c.hi DESC LIMIT 1)) AS cur
    FROM pgque.job_lanes l
    JOIN qs ON qs.queue_name = l.queue
    WHERE l.lane_id = ANY ($5::int[])
),
"#
        )
    };
}

/// Whether the call must merge with pgque.jobs (module comment).
macro_rules! blocked {
    () => {
        r#"
blocked AS MATERIALIZED (
    SELECT EXISTS (SELECT 1 FROM lanes l WHERE l.mode <> 'strict_fifo')
        OR EXISTS (SELECT 1 FROM qs CROSS JOIN LATERAL (
                       SELECT 1 FROM pgque.jobs j
                       WHERE j.queue = qs.queue_name AND j.state = 'ready'
                       ORDER BY j.priority, j.ready_seq LIMIT 1) s)
        OR EXISTS (SELECT 1 FROM lanes l CROSS JOIN LATERAL (
                       SELECT 1 FROM pgque.job_log_holes h
                       WHERE h.lane_id = l.lane_id AND h.job_id > l.cur LIMIT 1) h) AS b
),
"#
    };
}

/// The log rows of each lane from its cursor on, one index probe per row,
/// until `quota` jobs (a per-lane column of `lanes_q`). Carries only each
/// row's key (lane_id, id_hi) and the jobs counted so far; the rows
/// themselves are read once, by the statement's next step. `$h`: the rows'
/// headers array (`r.headers`, or `NULL::jsonb[]` on a schema without it).
macro_rules! walk {
    ($h:expr) => {
        concat!(
            r#"
walk (lane_id, id_hi, acc) AS (
    SELECT l.lane_id, r.id_hi,
           CASE WHEN r.id_lo > l.cur THEN r.n
                WHEN r.ids IS NULL THEN (r.id_hi - l.cur)::int
                ELSE (SELECT count(*)::int FROM unnest(r.ids) AS x WHERE x > l.cur) END
    FROM lanes_q l
    CROSS JOIN LATERAL (
        SELECT r.id_hi, r.id_lo, r.n, r.ids FROM pgque.job_log r
        WHERE r.lane_id = l.lane_id AND r.id_hi > l.cur
        ORDER BY r.id_hi LIMIT 1) r
    WHERE l.quota > 0
    UNION ALL
    SELECT w.lane_id, r.id_hi, w.acc + r.n
    FROM walk w
    CROSS JOIN LATERAL (
        SELECT r.id_hi, r.n FROM pgque.job_log r
        WHERE r.lane_id = w.lane_id AND r.id_hi > w.id_hi
        ORDER BY r.id_hi LIMIT 1) r
    WHERE w.acc < (SELECT l.quota FROM lanes_q l WHERE l.lane_id = w.lane_id)
),
-- the walked rows' jobs above the cursor
jobs AS MATERIALIZED (
    SELECT x.* FROM (
        SELECT l.lane_id, l.queue, l.priority, l.shard, l.pos, l.lease, l.mode, l.quota, l.cur,
               COALESCE(r.ids[u.ord], r.id_lo + u.ord - 1) AS id,
               u.kind, u.args, COALESCE(u.run_at, r.enqueued_at) AS run_at,
               COALESCE(u.ma, r.max_attempts) AS max_attempts, u.fk, r.enqueued_at, u.h
        FROM walk w
        JOIN lanes_q l ON l.lane_id = w.lane_id
        JOIN pgque.job_log r ON r.lane_id = w.lane_id AND r.id_hi = w.id_hi
        CROSS JOIN LATERAL unnest(r.kinds, r.args, r.run_ats, r.job_max_attempts, r.fairness_keys,
                                  "#,
            $h,
            r#")
             WITH ORDINALITY AS u(kind, args, run_at, ma, fk, h, ord)) x
    WHERE x.id > x.cur
),
"#
        )
    };
}

/// `lanes_q`: every lane with quota `limit`, or 0 when the call is blocked.
macro_rules! lanes_q_blocked {
    () => {
        r#"
lanes_q AS MATERIALIZED (
    SELECT l.*, CASE WHEN (SELECT b.b FROM blocked b) THEN 0 ELSE $2 END AS quota FROM lanes l
),
"#
    };
}

/// `cand`: `jobs` numbered per lane in id order (lrank).
macro_rules! cand {
    () => {
        r#"
cand AS MATERIALIZED (
    SELECT j.*, row_number() OVER (PARTITION BY j.lane_id ORDER BY j.id) AS lrank FROM jobs j
),
"#
    };
}

/// The one-lane dispatch (`dispatch_one`), first statement: $1 queues, $4
/// lease, $5 the lane (locked), $6 how many log rows to read. Whether the
/// call is blocked, the lane's id, queue, priority, lease and cursor (NULL
/// when its queue is paused or not in the call), and, unless blocked, the
/// lane's first $6 log rows above the cursor (LANE_ROWS_SQL's columns; one
/// row of NULLs when there is none). `$h` as in walk!.
macro_rules! lane_state_sql {
    ($h:expr) => {
        concat!(
            lanes_head!(),
            blocked!(),
            r#"
st AS (
    SELECT b.b, l.lane_id, l.queue, l.priority, l.lease, l.cur
    FROM blocked b LEFT JOIN lanes l ON true
)
SELECT st.*, r.*
FROM st
LEFT JOIN LATERAL (
    SELECT r.id_hi, r.id_lo, r.enqueued_at, r.max_attempts, r.ids, r.kinds, r.args, r.run_ats,
           r.job_max_attempts, r.fairness_keys, "#,
            $h,
            r#" AS headers
    FROM pgque.job_log r
    WHERE r.lane_id = st.lane_id AND r.id_hi > st.cur AND NOT st.b
    ORDER BY r.id_hi
    LIMIT $6) r ON true
"#
        )
    };
}

pub const LANE_STATE_SQL: &str = lane_state_sql!("r.headers");
/// LANE_STATE_SQL for a schema from before 0.8.0 (no headers array in the
/// log: the library is updated before ALTER EXTENSION UPDATE runs).
pub const LANE_STATE_SQL_V07: &str = lane_state_sql!("NULL::jsonb[]");

/// $1 lane, $2 cursor, $3 how many: the lane's next log rows above the
/// cursor, in order (one index range scan, stopped by the limit).
macro_rules! lane_rows_sql {
    ($h:expr) => {
        concat!(
            r#"
SELECT r.id_hi, r.id_lo, r.enqueued_at, r.max_attempts, r.ids, r.kinds, r.args, r.run_ats,
       r.job_max_attempts, r.fairness_keys, "#,
            $h,
            r#" AS headers
FROM pgque.job_log r
WHERE r.lane_id = $1 AND r.id_hi > $2
ORDER BY r.id_hi
LIMIT $3
"#
        )
    };
}

pub const LANE_ROWS_SQL: &str = lane_rows_sql!("r.headers");
/// LANE_ROWS_SQL for a schema from before 0.8.0.
pub const LANE_ROWS_SQL_V07: &str = lane_rows_sql!("NULL::jsonb[]");

/// $1 lane, $2 its last job, $3 the jobs (in id order), $4 worker, $5 lease:
/// the claim row. Returns its token and lease end.
pub const CLAIM_SQL: &str = concat!(
    r#"
INSERT INTO pgque.job_claims (seg, claim_id, lane_id, hi, job_ids, worker, dispatched_at,
                              lease_until, state)
SELECT "#,
    crate::cur_seg!(),
    r#", pg_catalog.nextval('pgque.job_lease_token_seq'), $1, $2, $3, $4, now(),
       pg_catalog.clock_timestamp() + $5, 'a'
RETURNING claim_id, lease_until
"#
);

/// $1 queues, $2 limit, $3 worker, $4 lease (NULL: the queue's), $5 lane ids
/// (locked by LOCK_LANES_SQL). Returns DISPATCH_SQL's 15 columns and
/// `blocked`: the claimed jobs in dispatch order (blocked false), or one row
/// with blocked true and nothing claimed. `$h` as in walk!.
macro_rules! log_dispatch_sql {
    ($h:expr) => {
        concat!(
            lanes_head!(),
            blocked!(),
            lanes_q_blocked!(),
            walk!($h),
            cand!(),
            r#"
taken AS MATERIALIZED (
    SELECT r.* FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.queue ORDER BY c.priority, c.id) AS qrank
        FROM cand c WHERE c.lrank <= $2) r
    ORDER BY r.qrank, r.pos
    LIMIT $2
),
ins AS (
    INSERT INTO pgque.job_claims (seg, claim_id, lane_id, hi, job_ids, worker, dispatched_at,
                                  lease_until, state)
    SELECT "#,
            crate::cur_seg!(),
            r#", pg_catalog.nextval('pgque.job_lease_token_seq'), t.lane_id, max(t.id),
           array_agg(t.id ORDER BY t.id), $3, now(), pg_catalog.clock_timestamp() + t.lease, 'a'
    FROM taken t
    GROUP BY t.lane_id, t.lease
    RETURNING claim_id, lane_id, lease_until
)
(SELECT t.id, t.queue, t.kind, t.args, t.priority, 1, t.max_attempts, NULL::text, t.fk,
        NULL::text, t.run_at, t.enqueued_at, i.claim_id, i.lease_until, t.h, false
 FROM taken t JOIN ins i ON i.lane_id = t.lane_id
 ORDER BY t.qrank, t.pos)
-- a blocked call: one row, blocked true
UNION ALL
SELECT NULL::bigint, NULL::text, NULL::text, NULL::jsonb, NULL::smallint, NULL::int, NULL::int,
       NULL::text, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::bigint,
       NULL::timestamptz, NULL::jsonb, true
FROM blocked WHERE blocked.b
"#
        )
    };
}

pub const LOG_DISPATCH_SQL: &str = log_dispatch_sql!("r.headers");
/// LOG_DISPATCH_SQL for a schema from before 0.8.0.
pub const LOG_DISPATCH_SQL_V07: &str = log_dispatch_sql!("NULL::jsonb[]");

/// Given `moved` (the jobs to move, with lane_id, id, kind, args, ..., h,
/// and `hole`), `sp` copies them into pgque.jobs as ready, in their places,
/// and `cl` moves each lane's cursor past them with a claim of state 's'.
/// `$c`, `$v`: the headers column of pgque.jobs and its value (empty on a
/// schema from before 0.8.0).
macro_rules! spill_moved {
    ($c:expr, $v:expr) => {
        concat!(
            r#"
sp AS (
    INSERT INTO pgque.jobs (id, queue, kind, args, priority, shard, state, ready_seq, run_at,
                            max_attempts, fairness_key, rr_key, enqueued_at"#,
            $c,
            r#")
    SELECT m.id, m.queue, m.kind, m.args, m.priority, m.shard, 'ready', m.id, m.run_at,
           m.max_attempts, m.fk,
           CASE WHEN m.mode = 'round_robin' THEN COALESCE(m.fk, '') END, m.enqueued_at"#,
            $v,
            r#"
    FROM moved m WHERE NOT m.hole
    ORDER BY m.id
    RETURNING 1
),
cl AS (
    INSERT INTO pgque.job_claims (seg, claim_id, lane_id, hi, job_ids, worker, dispatched_at,
                                  lease_until, state)
    SELECT "#,
            crate::cur_seg!(),
            r#", pg_catalog.nextval('pgque.job_lease_token_seq'), m.lane_id, max(m.id),
           COALESCE(array_agg(m.id ORDER BY m.id) FILTER (WHERE NOT m.hole), '{}'::bigint[]),
           NULL, now(), now(), 's'
    FROM moved m GROUP BY m.lane_id
),"#
        )
    };
}

/// $1 queues, $2 limit, $4 lease (unused but typed alike), $5 lane ids.
/// Copies into pgque.jobs the jobs of each lane that DISPATCH_SQL must rank
/// against pgque.jobs' ready jobs (module comment), skipping holes, and
/// moves each lane's cursor past them (a claim row of state 's'). Returns
/// how many jobs were copied. `$h` as in walk!, `$c`, `$v` as in spill_moved!.
macro_rules! log_spill_sql {
    ($h:expr, $c:expr, $v:expr) => {
        concat!(
            lanes_head!(),
            r#"
-- per queue: how many of its first $2 jobs in pgque.jobs are ready there, and
-- the rank key of the last of them
side AS MATERIALIZED (
    SELECT qs.queue_name, x.c, x.lp, x.ls
    FROM qs CROSS JOIN LATERAL (
        SELECT count(*)::int AS c,
               (array_agg(s.priority ORDER BY s.priority DESC, s.ready_seq DESC))[1] AS lp,
               (array_agg(s.ready_seq ORDER BY s.priority DESC, s.ready_seq DESC))[1] AS ls
        FROM (SELECT j.priority, j.ready_seq FROM pgque.jobs j
              WHERE j.queue = qs.queue_name AND j.state = 'ready'
              ORDER BY j.priority, j.ready_seq LIMIT $2) s) x
),
lanes_q AS MATERIALIZED (
    SELECT l.*, CASE WHEN s.c < $2 THEN $2 - s.c ELSE $2 END AS quota,
           CASE WHEN s.c < $2 THEN NULL ELSE s.lp END AS lp,
           CASE WHEN s.c < $2 THEN NULL ELSE s.ls END AS ls
    FROM lanes l JOIN side s ON s.queue_name = l.queue
),
"#,
            walk!($h),
            cand!(),
            r#"
moved AS MATERIALIZED (
    SELECT c.*, (h.job_id IS NOT NULL) AS hole
    FROM cand c
    JOIN lanes_q l ON l.lane_id = c.lane_id
    LEFT JOIN pgque.job_log_holes h ON h.lane_id = c.lane_id AND h.job_id = c.id
    WHERE c.lrank <= c.quota
      AND (l.lp IS NULL OR (c.priority, c.id) < (l.lp, l.ls))
),
"#,
            spill_moved!($c, $v),
            r#"
holes AS (
    DELETE FROM pgque.job_log_holes h
    USING (SELECT m.lane_id, max(m.id) AS hi FROM moved m GROUP BY m.lane_id) x
    WHERE h.lane_id = x.lane_id AND h.job_id <= x.hi
)
SELECT count(*)::int FROM sp
"#
        )
    };
}

pub const LOG_SPILL_SQL: &str = log_spill_sql!("r.headers", ", headers", ", m.h");
/// LOG_SPILL_SQL for a schema from before 0.8.0.
pub const LOG_SPILL_SQL_V07: &str = log_spill_sql!("NULL::jsonb[]", "", "");

/// $1 queue: every job of the queue's lanes above the cursor moves to
/// pgque.jobs as ready (in its place, grouped for round robin), and each
/// lane's cursor passes them. Run by a switch to round_robin (the caller
/// holds the lanes' dispatch locks), whose fair walk needs the whole backlog
/// in pgque.jobs' round-robin index. Returns how many moved. `$h`, `$c`,
/// `$v` as in log_spill_sql!.
macro_rules! spill_all_sql {
    ($h:expr, $c:expr, $v:expr) => {
        concat!(
    r#"
WITH lanes AS MATERIALIZED (
    SELECT l.lane_id, l.queue, l.priority, l.shard, jq.mode,
           GREATEST(l.cursor_floor, (SELECT max(c.hi) FROM pgque.job_claims c
                                     WHERE c.lane_id = l.lane_id)) AS cur
    FROM pgque.job_lanes l JOIN pgque.job_queues jq ON jq.queue_name = l.queue
    WHERE l.queue = $1
),
moved AS MATERIALIZED (
    SELECT x.*, EXISTS (SELECT 1 FROM pgque.job_log_holes h
                        WHERE h.lane_id = x.lane_id AND h.job_id = x.id) AS hole
    FROM (SELECT l.lane_id, l.queue, l.priority, l.shard, l.mode, l.cur,
                 COALESCE(r.ids[u.ord], r.id_lo + u.ord - 1) AS id, u.kind, u.args,
                 COALESCE(u.run_at, r.enqueued_at) AS run_at,
                 COALESCE(u.ma, r.max_attempts) AS max_attempts, u.fk, r.enqueued_at, u.h
          FROM lanes l
          JOIN pgque.job_log r ON r.lane_id = l.lane_id AND r.id_hi > l.cur
          CROSS JOIN LATERAL unnest(r.kinds, r.args, r.run_ats, r.job_max_attempts, r.fairness_keys,
                                    "#,
    $h,
    r#")
               WITH ORDINALITY AS u(kind, args, run_at, ma, fk, h, ord)) x
    WHERE x.id > x.cur
),
"#,
    spill_moved!($c, $v),
    r#"
holes AS (
    DELETE FROM pgque.job_log_holes h USING lanes l WHERE h.lane_id = l.lane_id
)
SELECT count(*)::int FROM sp
"#
        )
    };
}

pub const SPILL_ALL_SQL: &str = spill_all_sql!("r.headers", ", headers", ", m.h");
/// SPILL_ALL_SQL for a schema from before 0.8.0.
pub const SPILL_ALL_SQL_V07: &str = spill_all_sql!("NULL::jsonb[]", "", "");

/// Which of this module's statements fit the schema: the log's headers
/// array is 0.8.0's (the library can be newer than the schema until ALTER
/// EXTENSION pgque UPDATE). Picks `cur` or `v07`.
pub fn fit(cur: &'static str, v07: &'static str) -> &'static str {
    if crate::headers::job_log_has_headers() {
        cur
    } else {
        v07
    }
}
