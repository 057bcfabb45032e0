-- pgque job queues: the job log, where ordinary jobs live (docs/design/job-log.md).
--
-- A job that needs nothing but FIFO order (a strict_fifo queue, ready at
-- enqueue, no actor, identity key or unique key) is not a row of pgque.jobs:
-- its enqueue call appends ONE row to its lane's log holding the whole batch
-- as parallel arrays, a dispatch claims the next jobs of a lane with ONE claim
-- row (the claim id is every claimed job's lease token), and a completion
-- call writes ONE done row per claim. Nothing here is updated or deleted on
-- the hot path: the three tables are partitioned into a ring of three
-- segments that leave by TRUNCATE (src/jobs/log_rotate.rs), so a held xmin
-- pins no dead tuples in them and there is no per-job vacuum debt.
--
-- Everything off that path (fail, snooze, cancel, a lease that expired, a
-- claim still running when its segment is truncated, a dispatch that must
-- merge with pgque.jobs) copies the job into pgque.jobs, the "side store",
-- which has the full per-job lifecycle; a side row always overrides the log.
-- Ids come from pgque.jobs_id_seq in both stores, taken under the lane's
-- advisory lock held to commit, so within a lane ids are dispatch order for
-- log and side jobs alike (ready_seq = id).

-- A lane (queue, priority, shard): the unit of FIFO. cursor_floor is the
-- lane's cursor (the highest job id handed out) as it was when the claims
-- that carried it were truncated; otherwise the cursor is max(hi) of the
-- lane's claims, so dispatch writes no lane row.
CREATE SEQUENCE pgque.job_lanes_lane_id_seq AS int;
CREATE TABLE pgque.job_lanes (
    lane_id      int PRIMARY KEY DEFAULT nextval('pgque.job_lanes_lane_id_seq'),
    queue        text NOT NULL,
    priority     smallint NOT NULL,
    shard        smallint NOT NULL,
    cursor_floor bigint NOT NULL DEFAULT 0,
    CONSTRAINT job_lanes_queue_priority_shard_key UNIQUE (queue, priority, shard)
);

-- The ring: three segments, one current (opened, not sealed). A sealed
-- segment is truncated once every job in it was handed out, none of them
-- still runs from it, and it was sealed pgque.completed_job_retention ago;
-- then it is empty (both NULL) until it becomes current again.
CREATE TABLE pgque.job_log_segments (
    seg       smallint PRIMARY KEY CHECK (seg BETWEEN 0 AND 2),
    opened_at timestamptz,
    sealed_at timestamptz,
    CHECK (sealed_at IS NULL OR opened_at IS NOT NULL)
);
CREATE UNIQUE INDEX job_log_segments_current_idx ON pgque.job_log_segments ((true))
    WHERE opened_at IS NOT NULL AND sealed_at IS NULL;
INSERT INTO pgque.job_log_segments (seg, opened_at) VALUES (0, now()), (1, NULL), (2, NULL);

-- One row per enqueue call and lane: jobs id_lo..id_hi (ids lists them when
-- a concurrent producer of another lane interleaved its ids; NULL when they
-- are consecutive). Optional per-job attributes are NULL arrays when no job
-- of the batch has one. ~200-byte args compress to a few hundred bytes per
-- 100 jobs, inline. headers: the jobs' trace context (docs/tracing.md; NULL
-- elements: none), NULL when no job of the batch has any, so an untraced
-- batch stores and reads nothing more; last, so that a database updated
-- from 0.7.0 (ADD COLUMN) has the same columns.
CREATE TABLE pgque.job_log (
    seg           smallint NOT NULL,
    lane_id       int NOT NULL,
    id_lo         bigint NOT NULL,
    id_hi         bigint NOT NULL,
    n             int NOT NULL,
    ids           bigint[],
    enqueued_at   timestamptz NOT NULL,
    max_attempts  int NOT NULL,
    kinds         text[] NOT NULL,
    args          jsonb[] NOT NULL,
    run_ats       timestamptz[],
    job_max_attempts int[],
    fairness_keys text[],
    headers       jsonb[]
) PARTITION BY LIST (seg);
CREATE TABLE pgque.job_log_0 PARTITION OF pgque.job_log FOR VALUES IN (0);
CREATE TABLE pgque.job_log_1 PARTITION OF pgque.job_log FOR VALUES IN (1);
CREATE TABLE pgque.job_log_2 PARTITION OF pgque.job_log FOR VALUES IN (2);
-- a lane's jobs above its cursor, in order
CREATE INDEX job_log_lane_idx ON pgque.job_log (lane_id, id_hi);

-- The batch arrays are compressed with lz4 where the server was built with it
-- (pglz otherwise): ~15% larger than pglz for job arguments, measured about a
-- third of pglz's CPU, which was ~5% of a backend's CPU in the end-to-end loop.
DO $lz4$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_settings s
               WHERE s.name = 'default_toast_compression' AND 'lz4' = ANY (s.enumvals)) THEN
        ALTER TABLE pgque.job_log_0 ALTER COLUMN kinds SET COMPRESSION lz4,
                                    ALTER COLUMN args SET COMPRESSION lz4,
                                    ALTER COLUMN headers SET COMPRESSION lz4;
        ALTER TABLE pgque.job_log_1 ALTER COLUMN kinds SET COMPRESSION lz4,
                                    ALTER COLUMN args SET COMPRESSION lz4,
                                    ALTER COLUMN headers SET COMPRESSION lz4;
        ALTER TABLE pgque.job_log_2 ALTER COLUMN kinds SET COMPRESSION lz4,
                                    ALTER COLUMN args SET COMPRESSION lz4,
                                    ALTER COLUMN headers SET COMPRESSION lz4;
    END IF;
END
$lz4$;

-- One row per dispatch and lane: the jobs it handed out (job_ids, in order;
-- hi is the last), all under the lease token claim_id. state: a (active),
-- d (every job finished: set by the rescue duty once the lease is over, so
-- completions never update the claim), r (lease expired: the unfinished jobs were moved to pgque.jobs), e (moved
-- to pgque.jobs before its segment was truncated), s (spilled: the jobs were
-- moved to pgque.jobs as ready, for a dispatch that merges both stores).
-- n is the number of jobs (of job_ids), for job_queue_status: a claim of a
-- few hundred jobs or more has its id array in TOAST, and summing the arrays'
-- lengths detoasted every claim in the retention window (1M completed jobs in
-- claims of 1000: ~200 ms). Generated, so every writer stores it, exact, and
-- it is computed from the array in memory before the row is TOASTed; last, so
-- that a database updated from 0.6.0 (ADD COLUMN) has the same columns.
CREATE TABLE pgque.job_claims (
    seg           smallint NOT NULL,
    claim_id      bigint NOT NULL,
    lane_id       int NOT NULL,
    hi            bigint NOT NULL,
    job_ids       bigint[] NOT NULL,
    worker        text,
    dispatched_at timestamptz NOT NULL,
    lease_until   timestamptz NOT NULL,
    state         "char" NOT NULL CHECK (state IN ('a', 'd', 'r', 'e', 's')),
    n             int GENERATED ALWAYS AS (cardinality(job_ids)) STORED
) PARTITION BY LIST (seg);
CREATE TABLE pgque.job_claims_0 PARTITION OF pgque.job_claims FOR VALUES IN (0);
CREATE TABLE pgque.job_claims_1 PARTITION OF pgque.job_claims FOR VALUES IN (1);
CREATE TABLE pgque.job_claims_2 PARTITION OF pgque.job_claims FOR VALUES IN (2);
CREATE INDEX job_claims_id_idx ON pgque.job_claims (claim_id);
-- the lane cursor: max(hi), a backward probe
CREATE INDEX job_claims_lane_idx ON pgque.job_claims (lane_id, hi);
-- lease rescue
CREATE INDEX job_claims_lease_idx ON pgque.job_claims (lease_until) WHERE state = 'a';

-- One row per completion call and claim (kind c: job_ids completed), or per
-- job that left its claim for pgque.jobs (kind o: failed, snoozed, cancelled
-- while running). A claim's unfinished jobs are its job_ids minus its done rows.
-- outputs: what complete recorded, aligned with job_ids (NULL when the call
-- gave none): written with the row, so an output costs no update. n: the
-- number of jobs, as in job_claims.
CREATE TABLE pgque.job_done (
    seg      smallint NOT NULL,
    claim_id bigint NOT NULL,
    kind     "char" NOT NULL CHECK (kind IN ('c', 'o')),
    job_ids  bigint[] NOT NULL,
    at       timestamptz NOT NULL,
    outputs  jsonb[],
    n        int GENERATED ALWAYS AS (cardinality(job_ids)) STORED
) PARTITION BY LIST (seg);
CREATE TABLE pgque.job_done_0 PARTITION OF pgque.job_done FOR VALUES IN (0);
CREATE TABLE pgque.job_done_1 PARTITION OF pgque.job_done FOR VALUES IN (1);
CREATE TABLE pgque.job_done_2 PARTITION OF pgque.job_done FOR VALUES IN (2);
CREATE INDEX job_done_claim_idx ON pgque.job_done (claim_id);

-- One row per set_progress of a job of the log (its claim active, the job
-- unfinished in it): appended, never updated; the row with the highest id
-- of a (claim, job) is the job's progress. Partitioned by the segment that
-- was current when it was written and truncated with it (after the claim's
-- own segment, or with it: segments go oldest first); a job that moves to
-- pgque.jobs takes its last progress along (release.rs, TO_SIDE_SQL).
CREATE SEQUENCE pgque.job_progress_id_seq AS bigint;
CREATE TABLE pgque.job_progress (
    seg      smallint NOT NULL,
    id       bigint NOT NULL,
    claim_id bigint NOT NULL,
    job_id   bigint NOT NULL,
    progress jsonb NOT NULL,
    at       timestamptz NOT NULL
) PARTITION BY LIST (seg);
CREATE TABLE pgque.job_progress_0 PARTITION OF pgque.job_progress FOR VALUES IN (0);
CREATE TABLE pgque.job_progress_1 PARTITION OF pgque.job_progress FOR VALUES IN (1);
CREATE TABLE pgque.job_progress_2 PARTITION OF pgque.job_progress FOR VALUES IN (2);
CREATE INDEX job_progress_job_idx ON pgque.job_progress (job_id, id);

-- Log jobs above their lane's cursor that pgque.jobs owns (a ready job that
-- was cancelled): dispatch passes over them. Removed once the cursor passes.
CREATE TABLE pgque.job_log_holes (
    lane_id int NOT NULL,
    job_id  bigint NOT NULL,
    PRIMARY KEY (lane_id, job_id)
);

-- Every job of the log, unpacked, with the state the log gives it (a job
-- with a row in pgque.jobs is that row's, and is left out here). Reads the
-- whole log: for inspection (pgque.all_jobs), not for hot paths.
CREATE VIEW pgque.job_log_jobs AS
WITH lanes AS (
    SELECT l.*, GREATEST(l.cursor_floor,
                         (SELECT max(c.hi) FROM pgque.job_claims c WHERE c.lane_id = l.lane_id)) AS cur
    FROM pgque.job_lanes l
),
claimed AS (
    SELECT c.lane_id, c.claim_id, c.worker, c.dispatched_at, c.lease_until, m.job_id
    FROM pgque.job_claims c CROSS JOIN LATERAL unnest(c.job_ids) AS m(job_id)
    WHERE c.state <> 's'
),
done AS (
    SELECT d.claim_id, d.at, m.job_id, m.output
    FROM pgque.job_done d CROSS JOIN LATERAL unnest(d.job_ids, d.outputs) AS m(job_id, output)
    WHERE d.kind = 'c'
),
jobs AS (
    SELECT COALESCE(r.ids[u.ord], r.id_lo + u.ord - 1) AS id, l.queue, l.priority, l.shard,
           r.lane_id, l.cur, u.kind, u.args,
           COALESCE(u.run_at, r.enqueued_at) AS run_at,
           COALESCE(u.max_attempts, r.max_attempts) AS max_attempts,
           u.fairness_key, r.enqueued_at, u.headers
    FROM pgque.job_log r
    JOIN lanes l ON l.lane_id = r.lane_id
    CROSS JOIN LATERAL unnest(r.kinds, r.args, r.run_ats, r.job_max_attempts, r.fairness_keys,
                              r.headers)
         WITH ORDINALITY AS u(kind, args, run_at, max_attempts, fairness_key, headers, ord)
)
SELECT j.id, j.queue, j.kind, j.args, j.priority, j.shard,
       CASE WHEN c.claim_id IS NULL THEN 'ready'
            WHEN d.claim_id IS NOT NULL THEN 'completed'
            ELSE 'running' END AS state,
       j.run_at,
       CASE WHEN c.claim_id IS NULL THEN 0 ELSE 1 END AS attempt,
       j.max_attempts, j.fairness_key, j.enqueued_at,
       c.worker,
       CASE WHEN d.claim_id IS NULL THEN c.claim_id END AS lease_token,
       CASE WHEN d.claim_id IS NULL THEN c.lease_until END AS lease_until,
       c.dispatched_at, d.at AS finished_at, j.lane_id, d.output,
       (SELECT p.progress FROM pgque.job_progress p
        WHERE p.job_id = j.id AND p.claim_id = c.claim_id ORDER BY p.id DESC LIMIT 1) AS progress,
       j.headers
FROM jobs j
LEFT JOIN claimed c ON c.lane_id = j.lane_id AND c.job_id = j.id
LEFT JOIN done d ON d.claim_id = c.claim_id AND d.job_id = j.id
WHERE NOT EXISTS (SELECT 1 FROM pgque.jobs s WHERE s.id = j.id)
  AND (c.claim_id IS NOT NULL OR j.id > j.cur);

-- Every job, wherever it is stored: pgque.jobs' rows and the log's jobs, with
-- the columns users look at. For inspection: it reads the whole log.
CREATE VIEW pgque.all_jobs AS
SELECT s.id, s.queue, s.kind, s.args, s.priority, s.state, s.run_at, s.attempt,
       s.max_attempts, s.actor, s.fairness_key, s.identity_key, s.unique_key,
       s.enqueued_at, s.worker, s.lease_token, s.lease_until, s.dispatched_at,
       s.finished_at, s.errors, s.shard, 'jobs'::text AS stored_in, s.output, s.progress,
       s.headers
FROM pgque.jobs s
UNION ALL
SELECT g.id, g.queue, g.kind, g.args, g.priority, g.state, g.run_at, g.attempt,
       g.max_attempts, NULL, g.fairness_key, NULL, NULL,
       g.enqueued_at, g.worker, g.lease_token, g.lease_until, g.dispatched_at,
       g.finished_at, NULL, g.shard, 'log'::text, g.output, g.progress, g.headers
FROM pgque.job_log_jobs g;

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
       s.finished_at, s.errors, s.shard, 'jobs'::text, s.output, s.progress, s.headers
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
       c.dispatched_at, d.at, NULL, f.shard, 'log'::text,
       d.outputs[array_position(d.job_ids, $1)],
       (SELECT p.progress FROM pgque.job_progress p
        WHERE p.job_id = $1 AND p.claim_id = c.claim_id ORDER BY p.id DESC LIMIT 1),
       u.headers
FROM (
    SELECT l.lane_id, l.queue, l.priority, l.shard, r.id_lo, r.ids, r.enqueued_at,
           r.max_attempts, r.kinds, r.args, r.run_ats, r.job_max_attempts, r.fairness_keys,
           r.headers,
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
    SELECT u.* FROM unnest(f.kinds, f.args, f.run_ats, f.job_max_attempts, f.fairness_keys,
                           f.headers)
         WITH ORDINALITY AS u(kind, args, run_at, ma, fk, headers, ord)
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

-- One row per job and transition: `WHERE job_id = $1` is a job's history.
-- The log's own rows are its jobs' enqueued / dispatched / completed events
-- (kept as long as their segment); every other transition is a job_events row.
CREATE VIEW pgque.job_history AS
SELECT e.id AS event_id, e.at, COALESCE(e.job_id, m.job_id) AS job_id, e.queue, e.event,
       e.attempt, e.detail
FROM pgque.job_events e
LEFT JOIN LATERAL unnest(e.job_ids) AS m(job_id) ON true
UNION ALL
SELECT NULL::bigint, r.enqueued_at, COALESCE(r.ids[g.o], r.id_lo + g.o - 1), l.queue,
       'enqueued', 0, NULL::text
FROM pgque.job_log r
JOIN pgque.job_lanes l ON l.lane_id = r.lane_id
CROSS JOIN LATERAL generate_series(1, r.n) AS g(o)
UNION ALL
SELECT NULL::bigint, c.dispatched_at, m.job_id, l.queue, 'dispatched', 1, c.worker
FROM pgque.job_claims c
JOIN pgque.job_lanes l ON l.lane_id = c.lane_id
CROSS JOIN LATERAL unnest(c.job_ids) AS m(job_id)
WHERE c.state <> 's'
UNION ALL
SELECT NULL::bigint, d.at, m.job_id, l.queue, 'completed', 1, NULL::text
FROM pgque.job_done d
JOIN pgque.job_claims c ON c.claim_id = d.claim_id
JOIN pgque.job_lanes l ON l.lane_id = c.lane_id
CROSS JOIN LATERAL unnest(d.job_ids) AS m(job_id)
WHERE d.kind = 'c';

-- ---- status -----------------------------------------------------------------
-- Counts by state, over both stores: pgque.jobs' rows one by one, the log by
-- its rows' counts (no job is unpacked, no args read): the jobs above each
-- lane's cursor less its holes are ready; an active claim's jobs (its n)
-- less its done rows' are running; done rows of kind c are completed. So a
-- dashboard polling it reads pgque.jobs, the claim and done rows (one per
-- dispatch and completion call, their n, never their id arrays) and the
-- backlog's rows, not every job. The same counts as aggregating
-- pgque.all_jobs (tests compare them).
CREATE VIEW pgque.job_queue_status AS
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
    SELECT c.lane_id, sum(c.n) AS active
    FROM pgque.job_claims c WHERE c.state::text = 'a'
    GROUP BY c.lane_id
),
finished AS (
    SELECT c.lane_id,
           sum(d.n) FILTER (WHERE c.state::text = 'a') AS active_done,
           sum(d.n) FILTER (WHERE d.kind = 'c') AS completed
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
           -- finite times only: no path stores another since 0.8.0, and a
           -- row written before must not make the view fail
           min(j.run_at) FILTER (WHERE j.state = 'ready' AND pg_catalog.isfinite(j.run_at)) AS oldest,
           count(*) FILTER (WHERE j.state = 'waiting')   AS waiting
    FROM pgque.jobs j GROUP BY j.queue
),
-- the lanes (priority, shard) holding a job not finished yet, in either store
live AS (
    SELECT j.queue, j.priority, j.shard FROM pgque.jobs j
    WHERE j.state IN ('waiting', 'scheduled', 'ready', 'running')
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
       CASE WHEN pg_catalog.isfinite(LEAST(s.oldest, g.oldest))
            THEN now() - LEAST(s.oldest, g.oldest) END AS oldest_ready_age,
       (SELECT count(*) FROM live v WHERE v.queue = q.queue_name) AS lanes,
       COALESCE(s.waiting, 0) AS waiting
FROM pgque.job_queues q
LEFT JOIN side s ON s.queue = q.queue_name
LEFT JOIN (SELECT g.queue, sum(g.ready)::bigint AS ready, min(g.oldest) AS oldest,
                  sum(g.running)::bigint AS running, sum(g.completed)::bigint AS completed
           FROM log_lanes g GROUP BY g.queue) g ON g.queue = q.queue_name;

-- pg_dump: the log is user data (the jobs themselves). Partitions are
-- registered one by one (a partitioned parent has no rows of its own); the
-- segment ring is not dumped: a restore starts a fresh ring (segment 0
-- current) around the restored rows, which rotation then handles like any
-- others.
SELECT pg_catalog.pg_extension_config_dump('pgque.job_lanes', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_lanes_lane_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_log_holes', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_log_0', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_log_1', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_log_2', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_claims_0', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_claims_1', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_claims_2', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_done_0', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_done_1', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_done_2', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_progress_0', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_progress_1', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_progress_2', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_progress_id_seq', '');
