-- pgque 0.4.0 -> 0.5.0 (ALTER EXTENSION pgque UPDATE).
--
-- How this file is kept right: pg_test/tests/upgrade.rs installs each released
-- version (the frozen sql/archive/pgque--<version>.sql), fills it with queues,
-- events, consumers and jobs, runs ALTER EXTENSION pgque UPDATE and compares
-- every extension object (definitions, grants, options, pg_dump
-- registrations) with a fresh 0.5.0 install; it prints the differences when
-- they disagree.
--
-- When a change to sql/*.sql or to a #[pg_extern] lands, extend this file:
--   cargo pgrx schema pg15 --no-default-features --features pg15 -o /tmp/pgque--0.5.0.sql
--   python3 scripts/upgrade_draft.py sql/archive/pgque--0.4.0.sql /tmp/pgque--0.5.0.sql \
--       --upgrade sql/pgque--0.4.0--0.5.0.sql
-- prints the new and changed statements not yet covered here.
--
-- Rules: every statement schema-qualified (the script runs with the
-- extension's search_path); nothing here may depend on data being present or
-- absent.

\echo Use "ALTER EXTENSION pgque UPDATE" to load this file. \quit

-- ---- job_queue_status counts the job log by its rows ------------------------------
-- (0.4.0 aggregated pgque.all_jobs, which unpacks every job of the log: 24.6 s
-- with 1.19M completed log jobs; now 0.15 s.) Same columns and counts.
CREATE OR REPLACE VIEW pgque.job_queue_status AS
WITH lanes AS MATERIALIZED (
    SELECT l.lane_id, l.queue, l.priority, l.shard,
           GREATEST(l.cursor_floor,
                    (SELECT c.hi FROM pgque.job_claims c WHERE c.lane_id = l.lane_id
                     ORDER BY c.hi DESC LIMIT 1)) AS cur
    FROM pgque.job_lanes l
),
-- the log rows above each lane's cursor (its backlog, read by key: the jobs'
-- arrays stay in TOAST), with how many of their jobs are ready there (above
-- the cursor, not holes) and the oldest run_at among those
backlog AS (
    SELECT l.lane_id, x.n, x.oldest
    FROM lanes l
    JOIN pgque.job_log r ON r.lane_id = l.lane_id AND r.id_hi > l.cur
    CROSS JOIN LATERAL (
        SELECT h.c AS holes FROM (
            SELECT count(*) AS c FROM pgque.job_log_holes h
            WHERE h.lane_id = l.lane_id AND h.job_id > GREATEST(l.cur, r.id_lo - 1)
              AND h.job_id <= r.id_hi) h) hh
    CROSS JOIN LATERAL (
        SELECT CASE WHEN r.id_lo > l.cur THEN r.n
                    WHEN r.ids IS NULL THEN r.id_hi - l.cur
                    ELSE (SELECT count(*) FROM unnest(r.ids) AS i WHERE i > l.cur) END
               - hh.holes AS n,
               CASE WHEN r.run_ats IS NULL AND hh.holes = 0 THEN r.enqueued_at
                    ELSE (SELECT min(COALESCE(u.t, r.enqueued_at))
                          FROM unnest(r.run_ats) WITH ORDINALITY AS u(t, o)
                          WHERE COALESCE(r.ids[u.o], r.id_lo + u.o - 1) > l.cur
                            AND NOT EXISTS (SELECT 1 FROM pgque.job_log_holes h
                                            WHERE h.lane_id = l.lane_id
                                              AND h.job_id = COALESCE(r.ids[u.o], r.id_lo + u.o - 1)))
               END AS oldest) x
),
-- per lane: the jobs of its active claims, the done rows of those (what is
-- still running is the difference), and the jobs its claims completed
claimed AS (
    SELECT c.lane_id, sum(cardinality(c.job_ids)) AS active
    FROM pgque.job_claims c WHERE c.state::text = 'a'
    GROUP BY c.lane_id
),
finished AS (
    SELECT c.lane_id,
           sum(cardinality(d.job_ids)) FILTER (WHERE c.state::text = 'a') AS active_done,
           sum(cardinality(d.job_ids)) FILTER (WHERE d.kind = 'c') AS completed
    FROM pgque.job_done d JOIN pgque.job_claims c ON c.claim_id = d.claim_id
    WHERE c.state::text <> 's'
    GROUP BY c.lane_id
),
log_lanes AS (
    SELECT l.queue, l.priority, l.shard,
           COALESCE(b.ready, 0)::bigint AS ready, b.oldest,
           (COALESCE(a.active, 0) - COALESCE(f.active_done, 0))::bigint AS running,
           COALESCE(f.completed, 0)::bigint AS completed
    FROM lanes l
    LEFT JOIN (SELECT b.lane_id, sum(b.n) AS ready, min(b.oldest) FILTER (WHERE b.n > 0) AS oldest
               FROM backlog b GROUP BY b.lane_id) b ON b.lane_id = l.lane_id
    LEFT JOIN claimed a ON a.lane_id = l.lane_id
    LEFT JOIN finished f ON f.lane_id = l.lane_id
),
side AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.state = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE j.state = 'ready')     AS ready,
           count(*) FILTER (WHERE j.state = 'running')   AS running,
           count(*) FILTER (WHERE j.state = 'completed') AS completed,
           count(*) FILTER (WHERE j.state = 'failed')    AS failed,
           count(*) FILTER (WHERE j.state = 'cancelled') AS cancelled,
           min(j.run_at) FILTER (WHERE j.state = 'ready') AS oldest
    FROM pgque.jobs j GROUP BY j.queue
),
-- the lanes (priority, shard) holding a job not finished yet, in either store
live AS (
    SELECT j.queue, j.priority, j.shard FROM pgque.jobs j
    WHERE j.state IN ('scheduled', 'ready', 'running')
    UNION
    SELECT g.queue, g.priority, g.shard FROM log_lanes g WHERE g.ready > 0 OR g.running > 0
)
SELECT q.queue_name,
       q.mode,
       q.paused,
       COALESCE(s.scheduled, 0) AS scheduled,
       COALESCE(s.ready, 0) + COALESCE(g.ready, 0) AS ready,
       COALESCE(s.running, 0) + COALESCE(g.running, 0) AS running,
       COALESCE(s.completed, 0) + COALESCE(g.completed, 0) AS completed,
       COALESCE(s.failed, 0) AS failed,
       COALESCE(s.cancelled, 0) AS cancelled,
       now() - LEAST(s.oldest, g.oldest) AS oldest_ready_age,
       (SELECT count(*) FROM live v WHERE v.queue = q.queue_name) AS lanes
FROM pgque.job_queues q
LEFT JOIN side s ON s.queue = q.queue_name
LEFT JOIN (SELECT g.queue, sum(g.ready)::bigint AS ready, min(g.oldest) AS oldest,
                  sum(g.running)::bigint AS running, sum(g.completed)::bigint AS completed
           FROM log_lanes g GROUP BY g.queue) g ON g.queue = q.queue_name;

-- ---- get_job: one job by id, read by key --------------------------------------------
-- (all_jobs WHERE id = ... unpacks the whole log.)
-- One job by id, wherever it is stored: its pgque.all_jobs row, or no row.
-- Reads by key: pgque.jobs' primary key, then one probe per lane of the log
-- for the batch row holding the id, the claim that covers it (claims tile
-- their lane: the first whose hi is at or after the id) and that claim's
-- done rows; all_jobs would unpack the whole log. Same row as
-- `SELECT * FROM pgque.all_jobs WHERE id = $1` (a test compares them).
CREATE FUNCTION pgque.get_job(job_id bigint) RETURNS SETOF pgque.all_jobs
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
AS $get_job$
SELECT s.id, s.queue, s.kind, s.args, s.priority, s.state, s.run_at, s.attempt,
       s.max_attempts, s.actor, s.fairness_key, s.identity_key, s.unique_key,
       s.enqueued_at, s.worker, s.lease_token, s.lease_until, s.dispatched_at,
       s.finished_at, s.errors, s.shard, 'jobs'::text
FROM pgque.jobs s WHERE s.id = $1
UNION ALL
SELECT $1, f.queue, u.kind, u.args, f.priority,
       CASE WHEN c.claim_id IS NULL THEN 'ready'
            WHEN d.claim_id IS NOT NULL THEN 'completed'
            ELSE 'running' END,
       COALESCE(u.run_at, f.enqueued_at),
       CASE WHEN c.claim_id IS NULL THEN 0 ELSE 1 END,
       COALESCE(u.ma, f.max_attempts), NULL, u.fk, NULL, NULL,
       f.enqueued_at, c.worker,
       CASE WHEN d.claim_id IS NULL THEN c.claim_id END,
       CASE WHEN d.claim_id IS NULL THEN c.lease_until END,
       c.dispatched_at, d.at, NULL, f.shard, 'log'::text
FROM (
    SELECT l.lane_id, l.queue, l.priority, l.shard, r.id_lo, r.ids, r.enqueued_at,
           r.max_attempts, r.kinds, r.args, r.run_ats, r.job_max_attempts, r.fairness_keys,
           GREATEST(l.cursor_floor,
                    (SELECT c.hi FROM pgque.job_claims c WHERE c.lane_id = l.lane_id
                     ORDER BY c.hi DESC LIMIT 1)) AS cur
    FROM pgque.job_lanes l
    CROSS JOIN LATERAL (
        SELECT r.* FROM pgque.job_log r
        WHERE r.lane_id = l.lane_id AND r.id_hi >= $1
        ORDER BY r.id_hi LIMIT 1) r
    WHERE r.id_lo <= $1 AND (r.ids IS NULL OR $1 = ANY (r.ids))
    LIMIT 1
) f
CROSS JOIN LATERAL (
    SELECT u.* FROM unnest(f.kinds, f.args, f.run_ats, f.job_max_attempts, f.fairness_keys)
         WITH ORDINALITY AS u(kind, args, run_at, ma, fk, ord)
    WHERE COALESCE(f.ids[u.ord], f.id_lo + u.ord - 1) = $1) u
LEFT JOIN LATERAL (
    SELECT c.* FROM (
        SELECT c.* FROM pgque.job_claims c
        WHERE c.lane_id = f.lane_id AND c.hi >= $1
        ORDER BY c.hi LIMIT 1) c
    WHERE c.state::text <> 's' AND $1 = ANY (c.job_ids)) c ON true
LEFT JOIN LATERAL (
    SELECT d.* FROM pgque.job_done d
    WHERE d.claim_id = c.claim_id AND d.kind = 'c' AND $1 = ANY (d.job_ids)
    LIMIT 1) d ON true
WHERE NOT EXISTS (SELECT 1 FROM pgque.jobs s WHERE s.id = $1)
  AND (c.claim_id IS NOT NULL OR $1 > f.cur)
$get_job$;
REVOKE ALL ON FUNCTION pgque.get_job(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.get_job(bigint) TO pgque_admin;
ALTER FUNCTION pgque.get_job(bigint) SET jit = off;
