-- pgque 0.3.0 -> 0.4.0 (ALTER EXTENSION pgque UPDATE): the job log.
--
-- How this file is kept right: pg_test/tests/upgrade.rs installs each released
-- version (the frozen sql/archive/pgque--<version>.sql), fills it with queues,
-- events, consumers and jobs, runs ALTER EXTENSION pgque UPDATE and compares
-- every extension object (definitions, grants, options, pg_dump
-- registrations) with a fresh 0.4.0 install; it prints the differences when
-- they disagree.
--
-- When a change to sql/*.sql or to a #[pg_extern] lands, extend this file:
--   cargo pgrx schema pg15 --no-default-features --features pg15 -o /tmp/pgque--0.4.0.sql
--   python3 scripts/upgrade_draft.py sql/archive/pgque--0.3.0.sql /tmp/pgque--0.4.0.sql \
--       --upgrade sql/pgque--0.3.0--0.4.0.sql
-- prints the new and changed statements not yet covered here.
--
-- Rules: every statement schema-qualified (the script runs with the
-- extension's search_path); nothing here may depend on data being present or
-- absent.
--
-- What changes for data: nothing moves. pgque.jobs keeps every job it holds
-- (they finish there, with the tokens their workers hold); from now on an
-- ordinary batch (strict_fifo queue, ready now, no actor, identity or unique
-- key) goes to the new job log (sql/31_job_log.sql, docs/design/job-log.md).
-- Job ids keep coming from pgque.jobs_id_seq, so they stay unique and ordered
-- across both stores. pgque.job_queue_status and pgque.job_history now count
-- and narrate both.

\echo Use "ALTER EXTENSION pgque UPDATE" to load this file. \quit

-- ---- the job log: tables, views, pg_dump registrations ------------------------------

CREATE SEQUENCE pgque.job_lanes_lane_id_seq AS int;

CREATE TABLE pgque.job_lanes (
    lane_id      int PRIMARY KEY DEFAULT nextval('pgque.job_lanes_lane_id_seq'),
    queue        text NOT NULL,
    priority     smallint NOT NULL,
    shard        smallint NOT NULL,
    cursor_floor bigint NOT NULL DEFAULT 0,
    CONSTRAINT job_lanes_queue_priority_shard_key UNIQUE (queue, priority, shard)
);

CREATE TABLE pgque.job_log_segments (
    seg       smallint PRIMARY KEY CHECK (seg BETWEEN 0 AND 2),
    opened_at timestamptz,
    sealed_at timestamptz,
    CHECK (sealed_at IS NULL OR opened_at IS NOT NULL)
);

CREATE UNIQUE INDEX job_log_segments_current_idx ON pgque.job_log_segments ((true))
    WHERE opened_at IS NOT NULL AND sealed_at IS NULL;

INSERT INTO pgque.job_log_segments (seg, opened_at) VALUES (0, now()), (1, NULL), (2, NULL);

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
    fairness_keys text[]
) PARTITION BY LIST (seg);

CREATE TABLE pgque.job_log_0 PARTITION OF pgque.job_log FOR VALUES IN (0);

CREATE TABLE pgque.job_log_1 PARTITION OF pgque.job_log FOR VALUES IN (1);

CREATE TABLE pgque.job_log_2 PARTITION OF pgque.job_log FOR VALUES IN (2);

CREATE INDEX job_log_lane_idx ON pgque.job_log (lane_id, id_hi);

-- The batch arrays are compressed with lz4 where the server was built with it
-- (pglz otherwise): ~15% larger than pglz for job arguments, measured about a
-- third of pglz's CPU, which was ~5% of a backend's CPU in the end-to-end loop.
DO $lz4$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_settings s
               WHERE s.name = 'default_toast_compression' AND 'lz4' = ANY (s.enumvals)) THEN
        ALTER TABLE pgque.job_log_0 ALTER COLUMN kinds SET COMPRESSION lz4,
                                    ALTER COLUMN args SET COMPRESSION lz4;
        ALTER TABLE pgque.job_log_1 ALTER COLUMN kinds SET COMPRESSION lz4,
                                    ALTER COLUMN args SET COMPRESSION lz4;
        ALTER TABLE pgque.job_log_2 ALTER COLUMN kinds SET COMPRESSION lz4,
                                    ALTER COLUMN args SET COMPRESSION lz4;
    END IF;
END
$lz4$;

CREATE TABLE pgque.job_claims (
    seg           smallint NOT NULL,
    claim_id      bigint NOT NULL,
    lane_id       int NOT NULL,
    hi            bigint NOT NULL,
    job_ids       bigint[] NOT NULL,
    worker        text,
    dispatched_at timestamptz NOT NULL,
    lease_until   timestamptz NOT NULL,
    state         "char" NOT NULL CHECK (state IN ('a', 'd', 'r', 'e', 's'))
) PARTITION BY LIST (seg);

CREATE TABLE pgque.job_claims_0 PARTITION OF pgque.job_claims FOR VALUES IN (0);

CREATE TABLE pgque.job_claims_1 PARTITION OF pgque.job_claims FOR VALUES IN (1);

CREATE TABLE pgque.job_claims_2 PARTITION OF pgque.job_claims FOR VALUES IN (2);

CREATE INDEX job_claims_id_idx ON pgque.job_claims (claim_id);

CREATE INDEX job_claims_lane_idx ON pgque.job_claims (lane_id, hi);

CREATE INDEX job_claims_lease_idx ON pgque.job_claims (lease_until) WHERE state = 'a';

CREATE TABLE pgque.job_done (
    seg      smallint NOT NULL,
    claim_id bigint NOT NULL,
    kind     "char" NOT NULL CHECK (kind IN ('c', 'o')),
    job_ids  bigint[] NOT NULL,
    at       timestamptz NOT NULL
) PARTITION BY LIST (seg);

CREATE TABLE pgque.job_done_0 PARTITION OF pgque.job_done FOR VALUES IN (0);

CREATE TABLE pgque.job_done_1 PARTITION OF pgque.job_done FOR VALUES IN (1);

CREATE TABLE pgque.job_done_2 PARTITION OF pgque.job_done FOR VALUES IN (2);

CREATE INDEX job_done_claim_idx ON pgque.job_done (claim_id);

CREATE TABLE pgque.job_log_holes (
    lane_id int NOT NULL,
    job_id  bigint NOT NULL,
    PRIMARY KEY (lane_id, job_id)
);

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
    SELECT d.claim_id, d.at, m.job_id
    FROM pgque.job_done d CROSS JOIN LATERAL unnest(d.job_ids) AS m(job_id)
    WHERE d.kind = 'c'
),
jobs AS (
    SELECT COALESCE(r.ids[u.ord], r.id_lo + u.ord - 1) AS id, l.queue, l.priority, l.shard,
           r.lane_id, l.cur, u.kind, u.args,
           COALESCE(u.run_at, r.enqueued_at) AS run_at,
           COALESCE(u.max_attempts, r.max_attempts) AS max_attempts,
           u.fairness_key, r.enqueued_at
    FROM pgque.job_log r
    JOIN lanes l ON l.lane_id = r.lane_id
    CROSS JOIN LATERAL unnest(r.kinds, r.args, r.run_ats, r.job_max_attempts, r.fairness_keys)
         WITH ORDINALITY AS u(kind, args, run_at, max_attempts, fairness_key, ord)
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
       c.dispatched_at, d.at AS finished_at, j.lane_id
FROM jobs j
LEFT JOIN claimed c ON c.lane_id = j.lane_id AND c.job_id = j.id
LEFT JOIN done d ON d.claim_id = c.claim_id AND d.job_id = j.id
WHERE NOT EXISTS (SELECT 1 FROM pgque.jobs s WHERE s.id = j.id)
  AND (c.claim_id IS NOT NULL OR j.id > j.cur);

CREATE VIEW pgque.all_jobs AS
SELECT s.id, s.queue, s.kind, s.args, s.priority, s.state, s.run_at, s.attempt,
       s.max_attempts, s.actor, s.fairness_key, s.identity_key, s.unique_key,
       s.enqueued_at, s.worker, s.lease_token, s.lease_until, s.dispatched_at,
       s.finished_at, s.errors, s.shard, 'jobs'::text AS stored_in
FROM pgque.jobs s
UNION ALL
SELECT g.id, g.queue, g.kind, g.args, g.priority, g.state, g.run_at, g.attempt,
       g.max_attempts, NULL, g.fairness_key, NULL, NULL,
       g.enqueued_at, g.worker, g.lease_token, g.lease_until, g.dispatched_at,
       g.finished_at, NULL, g.shard, 'log'::text
FROM pgque.job_log_jobs g;

CREATE OR REPLACE VIEW pgque.job_history AS
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

CREATE OR REPLACE VIEW pgque.job_queue_status AS
SELECT q.queue_name,
       q.mode,
       q.paused,
       count(j.id) FILTER (WHERE j.state = 'scheduled') AS scheduled,
       count(j.id) FILTER (WHERE j.state = 'ready')     AS ready,
       count(j.id) FILTER (WHERE j.state = 'running')   AS running,
       count(j.id) FILTER (WHERE j.state = 'completed') AS completed,
       count(j.id) FILTER (WHERE j.state = 'failed')    AS failed,
       count(j.id) FILTER (WHERE j.state = 'cancelled') AS cancelled,
       now() - min(j.run_at) FILTER (WHERE j.state = 'ready') AS oldest_ready_age,
       count(DISTINCT (j.priority, j.shard))
           FILTER (WHERE j.state IN ('scheduled', 'ready', 'running')) AS lanes
FROM pgque.job_queues q
LEFT JOIN pgque.all_jobs j ON j.queue = q.queue_name
GROUP BY q.queue_name, q.mode, q.paused;

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

-- ---- new functions -------------------------------------------------------------------
CREATE OR REPLACE FUNCTION "rotate_job_log"() RETURNS TABLE (
	"switched" bool,
	"truncated" smallint,
	"evacuated" INT,
	"busy" bool
)
STRICT SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'rotate_job_log_wrapper';

-- ---- grants and per-function settings (as sql/99_finalize.sql) ------------------------
-- Nothing new is PUBLIC's (idempotent for the objects that exist already).
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgque FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA pgque FROM PUBLIC;
GRANT SELECT ON pgque.all_jobs, pgque.job_log_jobs TO pgque_admin;

GRANT EXECUTE ON FUNCTION pgque.rotate_job_log() TO pgque_admin;

ALTER FUNCTION pgque.rotate_job_log() SET jit = off;
