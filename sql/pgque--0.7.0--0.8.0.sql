-- pgque 0.7.0 -> 0.8.0 (ALTER EXTENSION pgque UPDATE).
--
-- How this file is kept right: pg_test/tests/upgrade.rs installs each released
-- version (the frozen sql/archive/pgque--<version>.sql), fills it with queues,
-- events, consumers and jobs, runs ALTER EXTENSION pgque UPDATE and compares
-- every extension object (definitions, grants, options, pg_dump
-- registrations) with a fresh 0.8.0 install; it prints the differences when
-- they disagree.
--
-- When a change to sql/*.sql or to a #[pg_extern] lands, extend this file:
--   cargo pgrx schema pg15 --no-default-features --features pg15 -o /tmp/pgque--0.8.0.sql
--   python3 scripts/upgrade_draft.py sql/archive/pgque--0.7.0.sql /tmp/pgque--0.8.0.sql \
--       --upgrade sql/pgque--0.7.0--0.8.0.sql
-- prints the new and changed statements not yet covered here.
--
-- Rules: every statement schema-qualified (the script runs with the
-- extension's search_path); nothing here may depend on data being present or
-- absent.

\echo Use "ALTER EXTENSION pgque UPDATE" to load this file. \quit


-- ==== security (issue 29) ====
-- ticker_loop(): its body only calls ticker_loop_tick(), which pins its own
-- search_path (a procedure that commits may carry no SET clause, and pg_cron
-- runs it as a superuser on the database's search_path).
CREATE OR REPLACE FUNCTION "ticker_loop_tick"() RETURNS double precision
STRICT SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'ticker_loop_tick_wrapper';
REVOKE ALL ON FUNCTION pgque.ticker_loop_tick() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.ticker_loop_tick() TO pgque_admin;
ALTER FUNCTION pgque.ticker_loop_tick() SET jit = off;

CREATE OR REPLACE PROCEDURE pgque.ticker_loop()
LANGUAGE plpgsql
AS $body$
DECLARE
    period_s pg_catalog.float8;
BEGIN
    LOOP
        period_s := pgque.ticker_loop_tick();
        COMMIT;
        PERFORM pg_catalog.pg_sleep(period_s);
    END LOOP;
END
$body$;

-- enqueue(..., depends_on): the writer records the job here; job_maint links
-- it to its parents after the commit (src/jobs/flows.rs, link_late).
CREATE TABLE pgque.job_links (child_id bigint PRIMARY KEY);
SELECT pg_catalog.pg_extension_config_dump('pgque.job_links', '');

-- job_queue_status: a non-finite run_at stored before 0.8.0 no longer makes
-- the view (and metrics(), every dashboard page) fail.

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

-- job_log_blockers(): the sessions keeping the job log's due truncation
-- from running (a reader's open transaction over job_queue_status).
CREATE OR REPLACE FUNCTION "job_log_blockers"() RETURNS TABLE (
	"seg" smallint,
	"due_for_s" double precision,
	"pid" INT,
	"usename" TEXT,
	"application_name" TEXT,
	"state" TEXT,
	"xact_age_s" double precision
)
STRICT SECURITY DEFINER PARALLEL SAFE
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'job_log_blockers_wrapper';
REVOKE ALL ON FUNCTION pgque.job_log_blockers() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.job_log_blockers() TO pgque_admin, pgque_reader;
ALTER FUNCTION pgque.job_log_blockers() SET jit = off;

-- ==== PgQue's adapters (issue 35) ====
-- PgQ's rotation steps: PgQue's benchmark adapter calls step 2 every 10 s.
CREATE OR REPLACE FUNCTION "maint_rotate_tables_step1"(
	"queue_name" TEXT
) RETURNS INT
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'maint_rotate_tables_step1_wrapper';
CREATE OR REPLACE FUNCTION "maint_rotate_tables_step2"() RETURNS INT
STRICT SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'maint_rotate_tables_step2_wrapper';
REVOKE ALL ON FUNCTION pgque.maint_rotate_tables_step1(text), pgque.maint_rotate_tables_step2() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.maint_rotate_tables_step1(text), pgque.maint_rotate_tables_step2() TO pgque_admin;
ALTER FUNCTION pgque.maint_rotate_tables_step1(text) SET jit = off;
ALTER FUNCTION pgque.maint_rotate_tables_step2() SET jit = off;
