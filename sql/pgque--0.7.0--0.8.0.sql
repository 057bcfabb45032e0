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
ALTER FUNCTION pgque.maint_rotate_tables_step1(text) SET enable_seqscan = off;
ALTER FUNCTION pgque.maint_rotate_tables_step2() SET enable_seqscan = off;
ALTER FUNCTION pgque.maint_rotate_tables_step1(text) SET jit = off;
ALTER FUNCTION pgque.maint_rotate_tables_step2() SET jit = off;

-- ==== the job explorer (issue 32): sql/34_explorer.sql, as a fresh install runs it ====
-- The jobs list's index on pgque.jobs: a queue's jobs in a state, newest
-- first (queue and state filters; a queue alone is its 7 states merged, a
-- state alone its queues merged). One more entry per row version whose
-- state changes; those updates are not HOT already (state is in the
-- predicates of the dispatch indexes).
CREATE INDEX jobs_explorer_idx ON pgque.jobs (queue, state, id);

-- One page of jobs, newest first: those of queue `of_queue`, in state
-- `in_state`, of kind `of_kind`, whose args or last error contain `search` (case-insensitive),
-- with an id below `before_id` (NULL: from the newest); each filter NULL or
-- '' for any. At most `max_jobs` rows (1..1000). cursor_id is the row's id;
-- pass the last row's cursor_id as before_id for the next page. A last row
-- with id NULL says the search window ended there with the page not full:
-- nothing matched above its cursor_id, go on from it. Fewer than max_jobs
-- rows and no such row: the end.
-- Errors: 22023 unknown state, 42704 unknown queue, 22003 max_jobs outside
-- 1..1000, 22001 a search over 200 characters.
CREATE FUNCTION pgque.list_jobs(of_queue text DEFAULT NULL, in_state text DEFAULT NULL,
                                of_kind text DEFAULT NULL, search text DEFAULT NULL,
                                before_id bigint DEFAULT NULL, max_jobs int DEFAULT 50)
RETURNS TABLE (id bigint, queue text, kind text, state text, priority int, attempt int,
               max_attempts int, enqueued_at timestamptz, finished_at timestamptz,
               last_error text, stored_in text, flow_id bigint, cursor_id bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
-- every read goes through an index in page order: the walk of the log's
-- rows is a cursor the planner would otherwise read whole and sort once a
-- lane holds a few thousand rows
SET enable_seqscan = off
SET enable_sort = off
AS $list_jobs$
#variable_conflict use_column
DECLARE
    v_q text := NULLIF($1, '');
    v_st text := NULLIF($2, '');
    v_k text := NULLIF($3, '');
    v_s text := pg_catalog.lower(NULLIF($4, ''));
    v_b bigint := COALESCE($5, 9223372036854775807);
    v_lim int := COALESCE($6, 50);
    v_windowed boolean;
    v_w int;
    v_lw int;
    v_side bigint[];
    v_match bigint[] := '{}';
    v_front bigint;
    v_lane record;
    v_row record;
    v_start bigint;
    v_got int;
    v_seen int;
    v_ids bigint[];
    v_n int;
    v_lo bigint;
    v_rows int;
    v_hi bigint;
    v_done bigint[];
BEGIN
    IF v_st IS NOT NULL AND v_st <> ALL (ARRAY['waiting', 'scheduled', 'ready', 'running',
                                              'completed', 'failed', 'cancelled']) THEN
        RAISE EXCEPTION 'unknown job state %', v_st USING ERRCODE = '22023',
            HINT = 'waiting, scheduled, ready, running, completed, failed or cancelled';
    END IF;
    IF v_lim < 1 OR v_lim > 1000 THEN
        RAISE EXCEPTION 'max_jobs % is outside 1..1000', v_lim USING ERRCODE = '22003';
    END IF;
    IF pg_catalog.length(v_s) > 200 THEN
        RAISE EXCEPTION 'search is longer than 200 characters' USING ERRCODE = '22001';
    END IF;
    IF v_q IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pgque.job_queues jq WHERE jq.queue_name = v_q) THEN
        RAISE EXCEPTION 'job queue % does not exist', v_q USING ERRCODE = '42704';
    END IF;
    v_windowed := v_k IS NOT NULL OR v_s IS NOT NULL;
    v_w := CASE WHEN v_windowed THEN GREATEST(2000, v_lim) ELSE v_lim END;
    -- the log's window applies to every filter: jobs of its batch rows that
    -- moved to pgque.jobs (failed, cancelled, retried) are passed over
    v_lw := GREATEST(2000, v_lim);

    -- pgque.jobs: the newest v_w rows the indexed filters let through
    IF v_q IS NOT NULL AND v_st IS NOT NULL THEN
        SELECT pg_catalog.array_agg(x.id ORDER BY x.id DESC) INTO v_side FROM (
            SELECT j.id FROM pgque.jobs j
            WHERE j.queue = v_q AND j.state = v_st AND j.id < v_b
            ORDER BY j.id DESC LIMIT v_w) x;
    ELSIF v_q IS NOT NULL THEN
        SELECT pg_catalog.array_agg(x.id ORDER BY x.id DESC) INTO v_side FROM (
            SELECT y.id FROM pg_catalog.unnest(ARRAY['waiting', 'scheduled', 'ready', 'running',
                                                     'completed', 'failed', 'cancelled']) AS s(st)
            CROSS JOIN LATERAL (
                SELECT j.id FROM pgque.jobs j
                WHERE j.queue = v_q AND j.state = s.st AND j.id < v_b
                ORDER BY j.id DESC LIMIT v_w) y
            ORDER BY y.id DESC LIMIT v_w) x;
    ELSIF v_st IS NOT NULL THEN
        SELECT pg_catalog.array_agg(x.id ORDER BY x.id DESC) INTO v_side FROM (
            SELECT y.id FROM pgque.job_queues jq
            CROSS JOIN LATERAL (
                SELECT j.id FROM pgque.jobs j
                WHERE j.queue = jq.queue_name AND j.state = v_st AND j.id < v_b
                ORDER BY j.id DESC LIMIT v_w) y
            ORDER BY y.id DESC LIMIT v_w) x;
    ELSE
        SELECT pg_catalog.array_agg(x.id ORDER BY x.id DESC) INTO v_side FROM (
            SELECT j.id FROM pgque.jobs j WHERE j.id < v_b ORDER BY j.id DESC LIMIT v_w) x;
    END IF;
    v_side := COALESCE(v_side, '{}');
    IF v_windowed THEN
        SELECT COALESCE(pg_catalog.array_agg(x.id ORDER BY x.id DESC), '{}') INTO v_ids FROM (
            SELECT j.id FROM pgque.jobs j
            WHERE j.id = ANY (v_side)
              AND (v_k IS NULL OR j.kind = v_k)
              AND (v_s IS NULL
                   OR pg_catalog.strpos(pg_catalog.lower(j.args::text), v_s) > 0
                   OR pg_catalog.strpos(pg_catalog.lower(j.errors -> -1 ->> 'error'), v_s) > 0)
            ORDER BY j.id DESC LIMIT v_lim) x;
        IF pg_catalog.cardinality(v_side) = v_w AND pg_catalog.cardinality(v_ids) < v_lim THEN
            v_front := v_side[v_w];
        END IF;
        v_match := v_ids;
    ELSE
        v_match := v_side;
    END IF;

    -- the job log: ready, running and completed jobs, lane by lane
    IF v_st IS NULL OR v_st IN ('ready', 'running', 'completed') THEN
        FOR v_lane IN
            SELECT l.lane_id,
                   GREATEST(l.cursor_floor,
                            (SELECT c.hi FROM pgque.job_claims c WHERE c.lane_id = l.lane_id
                             ORDER BY c.hi DESC LIMIT 1)) AS cur
            FROM pgque.job_lanes l
            WHERE v_q IS NULL OR l.queue = v_q
        LOOP
            IF v_st = 'running' THEN
                -- the lane's active claims (few: one per dispatch holding a lease)
                -- (each claim's jobs less its done rows' as a set difference)
                SELECT COALESCE(pg_catalog.array_agg(x.jid ORDER BY x.jid DESC), '{}'),
                       pg_catalog.count(*)::int INTO v_ids, v_n FROM (
                    SELECT m.jid FROM pgque.job_claims c
                    CROSS JOIN LATERAL (
                        SELECT pg_catalog.unnest(c.job_ids)
                        EXCEPT
                        SELECT pg_catalog.unnest(d.job_ids) FROM pgque.job_done d
                        WHERE d.claim_id = c.claim_id) AS m(jid)
                    WHERE c.state = 'a' AND c.lease_until > '-infinity' AND c.lane_id = v_lane.lane_id
                      -- a claim whose jobs all finished (settled by the rescue
                      -- duty only after its lease) is passed over by its done
                      -- rows' counts, no array read
                      AND c.n > (SELECT COALESCE(pg_catalog.sum(d.n), 0) FROM pgque.job_done d
                                 WHERE d.claim_id = c.claim_id)
                      AND m.jid < v_b
                      AND NOT EXISTS (SELECT 1 FROM pgque.jobs j WHERE j.id = m.jid)
                    ORDER BY m.jid DESC LIMIT v_w) x;
                IF v_windowed THEN
                    SELECT COALESCE(pg_catalog.array_agg(x.jid ORDER BY x.jid DESC), '{}') INTO v_side
                    FROM (SELECT i.jid FROM pg_catalog.unnest(v_ids) AS i(jid)
                          CROSS JOIN LATERAL pgque.get_job(i.jid) g
                          WHERE (v_k IS NULL OR g.kind = v_k)
                            AND (v_s IS NULL OR pg_catalog.strpos(pg_catalog.lower(g.args::text), v_s) > 0)
                          ORDER BY i.jid DESC LIMIT v_lim) x;
                    IF v_n = v_w AND pg_catalog.cardinality(v_side) < v_lim THEN
                        v_front := GREATEST(v_front, v_ids[v_w]);
                    END IF;
                    v_ids := v_side;
                END IF;
                v_match := v_match || v_ids[1:v_lim];
                CONTINUE;
            END IF;
            -- ready: above the cursor; completed: at or below it
            v_start := CASE WHEN v_st = 'completed' THEN LEAST(v_b, v_lane.cur + 1) ELSE v_b END;
            v_got := 0;
            v_seen := 0;
            FOR v_row IN
                (SELECT r.id_lo, r.id_hi, r.ids, r.kinds, r.args FROM pgque.job_log r
                 WHERE r.lane_id = v_lane.lane_id AND r.id_hi >= v_start AND r.id_lo < v_start
                 ORDER BY r.id_hi LIMIT 1)
                UNION ALL
                (SELECT r.id_lo, r.id_hi, r.ids, r.kinds, r.args FROM pgque.job_log r
                 WHERE r.lane_id = v_lane.lane_id AND r.id_hi < v_start
                   AND (v_st IS DISTINCT FROM 'ready' OR r.id_hi > v_lane.cur)
                 ORDER BY r.id_hi DESC LIMIT v_lw + 1)
            LOOP
                -- completed: the jobs the done rows (kind c) of the claims
                -- covering this row's jobs list, each claim and done row
                -- unnested once (claims tile their lane)
                v_done := '{}';
                v_hi := LEAST(v_row.id_hi, v_start - 1, v_lane.cur);
                IF v_st = 'completed' AND v_row.id_lo <= v_hi THEN
                    SELECT COALESCE(pg_catalog.array_agg(m.jid), '{}') INTO v_done
                    FROM pgque.job_claims c
                    JOIN pgque.job_done d ON d.claim_id = c.claim_id AND d.kind = 'c'
                    CROSS JOIN LATERAL pg_catalog.unnest(d.job_ids) AS m(jid)
                    WHERE c.lane_id = v_lane.lane_id AND c.state::text <> 's'
                      AND c.hi >= v_row.id_lo
                      AND c.hi <= COALESCE((SELECT c2.hi FROM pgque.job_claims c2
                                            WHERE c2.lane_id = v_lane.lane_id AND c2.hi >= v_hi
                                            ORDER BY c2.hi LIMIT 1), v_hi)
                      AND m.jid BETWEEN v_row.id_lo AND v_hi;
                END IF;
                SELECT COALESCE(pg_catalog.array_agg(x.jid ORDER BY x.jid DESC) FILTER (WHERE x.ok), '{}'),
                       pg_catalog.count(*)::int, pg_catalog.min(x.jid)
                INTO v_ids, v_n, v_lo
                FROM (
                    SELECT u.jid,
                           (v_k IS NULL OR u.kind = v_k)
                           AND (v_s IS NULL OR pg_catalog.strpos(pg_catalog.lower(u.args::text), v_s) > 0)
                           AND CASE WHEN v_st IS NULL THEN true
                                    WHEN u.jid > v_lane.cur THEN v_st = 'ready'
                                    ELSE dn.jid IS NOT NULL END
                           AND NOT EXISTS (SELECT 1 FROM pgque.jobs j WHERE j.id = u.jid) AS ok
                    FROM (SELECT COALESCE(v_row.ids[o.o], v_row.id_lo + o.o - 1) AS jid, o.kind, o.args
                          FROM ROWS FROM (pg_catalog.unnest(v_row.kinds), pg_catalog.unnest(v_row.args))
                               WITH ORDINALITY AS o(kind, args, o)) u
                    LEFT JOIN (SELECT DISTINCT t.jid FROM pg_catalog.unnest(v_done) AS t(jid)) dn
                           ON dn.jid = u.jid
                    WHERE u.jid < v_start
                      AND (v_st IS DISTINCT FROM 'ready' OR u.jid > v_lane.cur)
                      AND (v_st IS NULL OR v_st = 'ready' OR u.jid <= v_lane.cur)) x;
                v_match := v_match || v_ids;
                v_got := v_got + pg_catalog.cardinality(v_ids);
                v_seen := v_seen + v_n;
                EXIT WHEN v_got >= v_lim;
                IF v_seen >= v_lw THEN
                    v_front := GREATEST(v_front, v_lo);
                    EXIT;
                END IF;
            END LOOP;
        END LOOP;
    END IF;

    RETURN QUERY
    WITH page AS (
        SELECT DISTINCT m.jid FROM pg_catalog.unnest(v_match) AS m(jid)
        WHERE v_front IS NULL OR m.jid >= v_front
        ORDER BY m.jid DESC LIMIT v_lim)
    SELECT g.id, g.queue, g.kind, g.state, g.priority::int, g.attempt, g.max_attempts,
           g.enqueued_at, g.finished_at, g.errors -> -1 ->> 'error', g.stored_in,
           (SELECT j.flow_id FROM pgque.jobs j WHERE j.id = p.jid), g.id
    FROM page p
    CROSS JOIN LATERAL pgque.get_job(p.jid) g
    ORDER BY g.id DESC;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows < v_lim AND v_front IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::int, NULL::int,
                            NULL::int, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text,
                            NULL::bigint, v_front;
    END IF;
END
$list_jobs$;

-- Every job the admin action `action` ('retry': failed or cancelled jobs;
-- 'cancel': waiting, scheduled, ready or running ones) would change among
-- those list_jobs shows for these filters, newest first, at most
-- `max_jobs` (1..100000; pass one more than you will act on to learn
-- whether there are more). What a confirmation page counts and an action
-- then changes. 22023 for another action.
CREATE FUNCTION pgque.match_jobs(action text, queue_name text DEFAULT NULL, state text DEFAULT NULL,
                                 kind text DEFAULT NULL, search text DEFAULT NULL,
                                 max_jobs int DEFAULT 10001)
RETURNS SETOF bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $match_jobs$
DECLARE
    v_states text[];
    v_st text;
    v_before bigint;
    v_left int := COALESCE($6, 10001);
    v_r record;
    v_last bigint;
    v_last_id bigint;
    v_page int;
    v_n int;
BEGIN
    IF $1 = 'retry' THEN
        v_states := ARRAY['failed', 'cancelled'];
    ELSIF $1 = 'cancel' THEN
        v_states := ARRAY['running', 'ready', 'scheduled', 'waiting'];
    ELSE
        RAISE EXCEPTION 'unknown bulk action %', $1 USING ERRCODE = '22023',
            HINT = 'retry or cancel';
    END IF;
    IF v_left < 1 OR v_left > 100000 THEN
        RAISE EXCEPTION 'max_jobs % is outside 1..100000', v_left USING ERRCODE = '22003';
    END IF;
    IF NULLIF($3, '') IS NOT NULL THEN
        v_states := ARRAY(SELECT s FROM pg_catalog.unnest(v_states) AS s WHERE s = $3);
        IF NOT ($3 = ANY (ARRAY['waiting', 'scheduled', 'ready', 'running', 'completed', 'failed',
                                'cancelled'])) THEN
            RAISE EXCEPTION 'unknown job state %', $3 USING ERRCODE = '22023';
        END IF;
    END IF;
    FOREACH v_st IN ARRAY v_states LOOP
        v_before := NULL;
        LOOP
            EXIT WHEN v_left <= 0;
            v_page := LEAST(v_left, 1000);
            v_n := 0;
            v_last := NULL;
            v_last_id := NULL;
            FOR v_r IN SELECT l.id, l.cursor_id
                       FROM pgque.list_jobs($2, v_st, $4, $5, v_before, v_page) l LOOP
                v_n := v_n + 1;
                v_last := v_r.cursor_id;
                v_last_id := v_r.id;
                IF v_r.id IS NOT NULL THEN
                    v_left := v_left - 1;
                    RETURN NEXT v_r.id;
                END IF;
            END LOOP;
            -- on after a full page or a window's end; otherwise this state is done
            EXIT WHEN v_n = 0 OR (v_last_id IS NOT NULL AND v_n < v_page);
            v_before := v_last;
        END LOOP;
    END LOOP;
END
$match_jobs$;

-- One job for its page: pgque.get_job's row as jsonb, with its flow (id,
-- key, parents still pending), its full errors list (attempt, at, error
-- and traceback when the worker recorded one) and its progress. NULL for
-- an unknown (or pruned) job.
CREATE FUNCTION pgque.job_detail(job_id bigint) RETURNS jsonb
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $job_detail$
SELECT pg_catalog.to_jsonb(g)
       || pg_catalog.jsonb_build_object('flow_id', j.flow_id, 'flow_key', j.flow_key,
                                        'pending_parents', j.pending_parents,
                                        'run_on_parent_failure', j.run_on_parent_failure)
FROM pgque.get_job($1) g
LEFT JOIN pgque.jobs j ON j.id = g.id
$job_detail$;

-- A job's history, oldest first: its job_events rows (read through the
-- (at, id) index from a minute before its enqueue on, as docs/job-queues.md
-- advises) and, for a job of the log, its enqueue, dispatch and completion,
-- which are the log's own rows (for a job that left the log, its first
-- enqueue and last dispatch as its row has them). `source` says which. No row: unknown job.
CREATE FUNCTION pgque.job_timeline(job_id bigint)
RETURNS TABLE (at timestamptz, event text, attempt int, detail text, source text)
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $job_timeline$
WITH g AS (SELECT * FROM pgque.get_job($1)),
ev AS (
    SELECT e.id, e.at, e.event, e.attempt, e.detail
    FROM g, pgque.job_events e
    WHERE e.at >= g.enqueued_at - interval '1 minute'
      AND (e.job_id = $1 OR $1 = ANY (e.job_ids))
)
SELECT t.at, t.event, t.attempt, t.detail, t.source FROM (
    SELECT ev.at, ev.event, ev.attempt, ev.detail, 'job_events'::text AS source, ev.id AS o FROM ev
    UNION ALL
    SELECT g.enqueued_at, 'enqueued', 0, NULL, 'job log', NULL FROM g
    WHERE NOT EXISTS (SELECT 1 FROM ev WHERE ev.event IN ('enqueued', 'scheduled'))
    UNION ALL
    SELECT g.dispatched_at, 'dispatched', GREATEST(g.attempt, 1), g.worker, 'job log', NULL FROM g
    WHERE g.dispatched_at IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM ev WHERE ev.event = 'dispatched')
    UNION ALL
    SELECT g.finished_at, 'completed', 1, NULL, 'job log', NULL FROM g
    WHERE g.stored_in = 'log' AND g.state = 'completed'
) t
ORDER BY t.at, t.o NULLS FIRST
$job_timeline$;

-- The jobs that depend on a job: id, key in its flow, state (as
-- job_parents gives a job's parents).
CREATE FUNCTION pgque.job_children(parent_id bigint)
RETURNS TABLE (job_id bigint, key text, state text)
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $job_children$
SELECT d.child_id, c.flow_key, c.state
FROM pgque.job_deps d
LEFT JOIN pgque.jobs c ON c.id = d.child_id
WHERE d.parent_id = $1
ORDER BY d.child_id
$job_children$;

-- A flow as a graph: each job (at most max_jobs, 1..10000, lowest ids
-- first) with its key, kind, state and the ids of its parents. No row: no
-- such flow (or all its jobs were pruned). 22003 for max_jobs out of range.
CREATE FUNCTION pgque.flow_graph(flow bigint, max_jobs int DEFAULT 1000)
RETURNS TABLE (job_id bigint, key text, kind text, state text, parents bigint[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $flow_graph$
BEGIN
    IF $2 IS NULL OR $2 < 1 OR $2 > 10000 THEN
        RAISE EXCEPTION 'max_jobs % is outside 1..10000', $2 USING ERRCODE = '22003';
    END IF;
    RETURN QUERY
    SELECT j.id, j.flow_key, j.kind, j.state,
           ARRAY(SELECT d.parent_id FROM pgque.job_deps d WHERE d.child_id = j.id ORDER BY 1)
    FROM pgque.jobs j
    WHERE j.flow_id = $1
    ORDER BY j.id
    LIMIT $2;
END
$flow_graph$;

-- Fires a schedule now, once, besides its cron slots: one job as its slots
-- are (the schedule's queue, kind, priority, max_attempts and args, with
-- "scheduled_for" the current time), recorded as its last run. Its next
-- slot does not change. Returns the job's id. 42704 for an unknown
-- schedule (or a dropped queue), 55000 for a paused one.
CREATE FUNCTION pgque.run_schedule_now(name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $run_schedule_now$
DECLARE
    v_s pgque.schedules_def;
    v_job bigint;
BEGIN
    SELECT * INTO v_s FROM pgque.schedules_def s WHERE s.name = $1 FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'schedule % does not exist', $1 USING ERRCODE = '42704';
    END IF;
    IF v_s.paused THEN
        RAISE EXCEPTION 'schedule % is paused', $1 USING ERRCODE = '55000',
            HINT = 'resume it first (pgque.resume_schedule)';
    END IF;
    v_job := pgque.enqueue(v_s.queue_name, v_s.kind,
                           v_s.args || pg_catalog.jsonb_build_object(
                               'scheduled_for',
                               pg_catalog.to_char(pg_catalog.now() AT TIME ZONE 'UTC',
                                                  'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
                           v_s.priority::int, NULL, NULL, NULL, NULL, NULL, v_s.max_attempts);
    UPDATE pgque.schedules_def s SET last_run_at = pg_catalog.now(), last_job_id = v_job
    WHERE s.schedule_id = v_s.schedule_id;
    RETURN v_job;
END
$run_schedule_now$;

REVOKE ALL ON FUNCTION pgque.list_jobs(text, text, text, text, bigint, int),
    pgque.match_jobs(text, text, text, text, text, int),
    pgque.job_detail(bigint), pgque.job_timeline(bigint), pgque.job_children(bigint),
    pgque.flow_graph(bigint, int), pgque.run_schedule_now(text)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.list_jobs(text, text, text, text, bigint, int),
    pgque.job_detail(bigint), pgque.job_timeline(bigint), pgque.job_children(bigint),
    pgque.flow_graph(bigint, int)
  TO pgque_reader, pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.match_jobs(text, text, text, text, text, int),
    pgque.run_schedule_now(text)
  TO pgque_admin;

-- ==== the event browser (issue 32, item 4): sql/35_event_browser.sql, as a fresh install runs it ====
-- A queue's dead letters newest first, by id: the keyset of
-- browse_dead_letters (dead_letter_queue_idx orders by time, and many
-- letters of one nack share it).
CREATE INDEX dead_letter_queue_id_idx ON pgque.dead_letter_store (dl_queue, dl_id);

-- One page of the events of queue `queue_name` that a consumer has still
-- to process: committed after the position of `consumer` (NULL: of the
-- queue's furthest-behind consumer), ticked or not, its open batches'
-- events included. In (transaction, id) order, the order the event
-- tables' transaction index gives: pass the last row's ev_txid and ev_id
-- as after_txid / after_id for the next page. At most `max_events` rows
-- (1..1000). No consumer: no row (nothing waits). for_consumer names the
-- one consumer a retried event is redelivered to (NULL: every consumer).
-- Each page reads its rows through the index from the cursor on: its cost
-- is the page's (plus the rest of the largest transaction it enters: rows
-- of one transaction come in id order), whatever the queue holds.
-- Errors: 22004 NULL queue_name, 42704 unknown queue or consumer, 22003
-- max_events outside 1..1000 or a negative cursor.
CREATE FUNCTION pgque.browse_events(queue_name text, consumer text DEFAULT NULL,
                                    after_txid bigint DEFAULT NULL, after_id bigint DEFAULT NULL,
                                    max_events int DEFAULT 50)
RETURNS TABLE (ev_id bigint, ev_txid bigint, ev_time timestamptz, ev_type text, ev_data text,
               partition_key text, ev_retry int, for_consumer text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
SET enable_seqscan = off
AS $browse_events$
DECLARE
    v_q int4;
    v_sub int4;
    v_pos bigint;
    v_snap pg_catalog.pg_snapshot;
    v_lim int := COALESCE($5, 50);
    v_from pg_catalog.xid8;
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'queue_name must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF v_lim < 1 OR v_lim > 1000 THEN
        RAISE EXCEPTION 'max_events % is outside 1..1000', v_lim USING ERRCODE = '22003';
    END IF;
    IF $3 < 0 OR $4 < 0 THEN
        RAISE EXCEPTION 'after_txid and after_id must not be negative' USING ERRCODE = '22003';
    END IF;
    SELECT q.queue_id INTO v_q FROM pgque.queue q WHERE q.queue_name OPERATOR(pg_catalog.=) $1;
    IF v_q IS NULL THEN
        RAISE EXCEPTION 'queue not found: %', $1 USING ERRCODE = '42704';
    END IF;
    IF $2 IS NOT NULL THEN
        SELECT s.sub_id INTO v_sub FROM pgque.subscription s
         WHERE s.sub_queue OPERATOR(pg_catalog.=) v_q AND s.sub_parent IS NULL
           AND s.sub_consumer OPERATOR(pg_catalog.=) $2;
        IF v_sub IS NULL THEN
            RAISE EXCEPTION 'consumer not registered: % on queue %', $2, $1 USING ERRCODE = '42704';
        END IF;
        SELECT p.pos_tick INTO v_pos FROM pgque.consumer_position p
         WHERE p.sub_id OPERATOR(pg_catalog.=) v_sub;
    ELSE
        SELECT pg_catalog.min(p.pos_tick) INTO v_pos FROM pgque.consumer_position p
         WHERE p.sub_queue OPERATOR(pg_catalog.=) v_q;
    END IF;
    IF v_pos IS NULL THEN
        RETURN;
    END IF;
    SELECT t.tick_snapshot INTO v_snap FROM pgque.tick t
     WHERE t.tick_queue OPERATOR(pg_catalog.=) v_q AND t.tick_id OPERATOR(pg_catalog.=) v_pos
     LIMIT 1;
    IF v_snap IS NULL THEN
        RETURN;
    END IF;
    v_from := pg_catalog.pg_snapshot_xmin(v_snap);
    IF $3 IS NOT NULL AND ($3::text)::pg_catalog.xid8 OPERATOR(pg_catalog.>) v_from THEN
        v_from := ($3::text)::pg_catalog.xid8;
    END IF;
    -- (the table's name is made of the queue's integer id)
    RETURN QUERY EXECUTE pg_catalog.format(
        'SELECT e.ev_id, e.ev_txid::text::int8, e.ev_time, e.ev_type, e.ev_data, e.ev_extra1,
                e.ev_retry, s.sub_consumer
           FROM pgque.%I e
           LEFT JOIN pgque.subscription s ON s.sub_id OPERATOR(pg_catalog.=) e.ev_owner
          WHERE e.ev_txid OPERATOR(pg_catalog.>=) $1
            AND NOT pg_catalog.pg_visible_in_snapshot(e.ev_txid, $2)
            AND ($3::int8 IS NULL
                 OR (e.ev_txid::text::int8, e.ev_id) OPERATOR(pg_catalog.>) ($3::int8, COALESCE($4, -1)))
            AND ($5::int4 IS NULL OR e.ev_owner IS NULL OR e.ev_owner OPERATOR(pg_catalog.=) $5)
          ORDER BY e.ev_txid, e.ev_id
          LIMIT $6', 'event_' || v_q::text)
    USING v_from, v_snap, $3, $4, v_sub, v_lim;
END
$browse_events$;

-- One page of the dead letters of queue `queue_name`, newest first: those
-- with an id below `before_id` (NULL: from the newest), at most
-- `max_letters` (1..1000), with their payloads, partition keys and the
-- reason each was given up on. Pass the last row's dl_id as before_id for
-- the next page. One index range per page (dead_letter_queue_id_idx).
-- Errors: 22004 NULL queue_name, 42704 unknown queue, 22003 max_letters
-- outside 1..1000.
CREATE FUNCTION pgque.browse_dead_letters(queue_name text, before_id bigint DEFAULT NULL,
                                          max_letters int DEFAULT 50)
RETURNS TABLE (dl_id bigint, consumer text, dl_time timestamptz, dl_reason text, ev_id bigint,
               ev_time timestamptz, ev_retry int, ev_type text, ev_data text, partition_key text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
SET enable_seqscan = off
AS $browse_dead_letters$
DECLARE
    v_q int4;
    v_lim int := COALESCE($3, 50);
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'queue_name must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF v_lim < 1 OR v_lim > 1000 THEN
        RAISE EXCEPTION 'max_letters % is outside 1..1000', v_lim USING ERRCODE = '22003';
    END IF;
    SELECT q.queue_id INTO v_q FROM pgque.queue q WHERE q.queue_name OPERATOR(pg_catalog.=) $1;
    IF v_q IS NULL THEN
        RAISE EXCEPTION 'queue not found: %', $1 USING ERRCODE = '42704';
    END IF;
    RETURN QUERY
    SELECT d.dl_id, d.dl_consumer, d.dl_time, d.dl_reason, d.ev_id, d.ev_time, d.ev_retry,
           d.ev_type, d.ev_data, d.ev_extra1
      FROM pgque.dead_letter_store d
     WHERE d.dl_queue OPERATOR(pg_catalog.=) v_q
       AND d.dl_id OPERATOR(pg_catalog.<) COALESCE($2, 9223372036854775807)
     ORDER BY d.dl_id DESC
     LIMIT v_lim;
END
$browse_dead_letters$;

REVOKE ALL ON FUNCTION pgque.browse_events(text, text, bigint, bigint, int),
    pgque.browse_dead_letters(text, bigint, int)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.browse_events(text, text, bigint, bigint, int),
    pgque.browse_dead_letters(text, bigint, int)
  TO pgque_reader, pgque_admin;

-- ==== the pause failure policy of partitioned consumers (issue 34 item 1): sql/16_slots_pause.sql ====
-- pgque partition slots, the `pause` failure policy (src/log/pause.rs,
-- docs/partition-keys.md "Failure policy").
--
-- A partitioned consumer chooses at subscribe what a nack does to the key's
-- later events: 'skip' (they are delivered; the nacked one comes back later,
-- after them) or 'pause' (they are held back until the nacked one has been
-- redelivered and acked, or dead-lettered). With 'pause', on_dead_letter
-- says what a dead letter does to the key: 'resume' its held events, or
-- 'block' them until pgque.release_partition_key.
ALTER TABLE pgque.partition_consumer
    ADD COLUMN pc_failure_policy text NOT NULL DEFAULT 'skip'
        CHECK (pc_failure_policy IN ('skip', 'pause')),
    ADD COLUMN pc_on_dead_letter text NOT NULL DEFAULT 'resume'
        CHECK (pc_on_dead_letter IN ('resume', 'block'));
-- The policy as the lease fence reads it (with the lease row, no second
-- lookup on the receive path); set with the slot rows, never changed.
ALTER TABLE pgque.partition_slot
    ADD COLUMN ps_pause boolean NOT NULL DEFAULT false;

-- A blocked key of a slot subscription ('pause' only): its later events are
-- held back (parked in partition_held) until the block ends.
--  pb_state   'retry': waiting for the redelivery of pb_event (a nacked event)
--             'dead': pb_event was dead-lettered, held events wait for
--                     release_partition_key (or, on_dead_letter = 'resume',
--                     for the open batch's ack: pb_unblock)
--             'release': the first held events (at most 1,000 a round,
--                     PUT_BACK_MAX in src/log/pause.rs) were put back into
--                     the queue and are being redelivered (pb_pending of them
--                     not yet acked); the rest stay held for the next round
--  pb_batch   the last batch that delivered events of the key: when it is
--             acked, the block moves on
--  pb_pending events put back into the queue that have not reached the
--             slot yet (the block ends only after they have)
--  pb_held    events parked now; pb_unblock: release at the next ack
CREATE TABLE pgque.partition_blocked (
    pb_sub     int4 NOT NULL REFERENCES pgque.subscription (sub_id) ON DELETE CASCADE,
    pb_key     text NOT NULL,
    pb_state   text NOT NULL CHECK (pb_state IN ('retry', 'dead', 'release')),
    pb_event   int8,
    pb_since   timestamptz NOT NULL DEFAULT now(),
    pb_batch   int8,
    pb_pending int4 NOT NULL DEFAULT 0,
    pb_held    int4 NOT NULL DEFAULT 0,
    pb_unblock boolean NOT NULL DEFAULT false,
    PRIMARY KEY (pb_sub, pb_key)
);

-- Events of a blocked key held back from their slot subscription, as read
-- from the event table (ev_retry as delivered: NULL for a first delivery).
-- Put back into the queue, in ev_id order, when the block ends: at most
-- 1,000 a round, the next round once those are delivered and acked.
CREATE TABLE pgque.partition_held (
    ph_sub    int4 NOT NULL,
    ph_key    text NOT NULL,
    ev_id     int8 NOT NULL,
    ev_time   timestamptz NOT NULL,
    ev_retry  int4,
    ev_type   text,
    ev_data   text,
    ev_extra1 text,
    ev_extra2 text,
    ev_extra3 text,
    ev_extra4 text,
    PRIMARY KEY (ph_sub, ev_id),
    FOREIGN KEY (ph_sub, ph_key)
        REFERENCES pgque.partition_blocked (pb_sub, pb_key) ON DELETE CASCADE
);
CREATE INDEX partition_held_key_idx ON pgque.partition_held (ph_sub, ph_key, ev_id);

SELECT pg_catalog.pg_extension_config_dump('pgque.partition_blocked', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.partition_held', '');

-- One row per blocked key of every partitioned consumer.
CREATE VIEW pgque.partition_blocked_keys AS
SELECT q.queue_name, p.ps_consumer AS consumer, p.ps_slot AS slot, p.ps_n AS n,
       b.pb_key AS partition_key, b.pb_state AS state, b.pb_event AS failed_event,
       b.pb_since AS blocked_since,
       pg_catalog.now() OPERATOR(pg_catalog.-) b.pb_since AS blocked_for,
       b.pb_held AS held_events, b.pb_pending AS redelivering_events,
       b.pb_unblock AS release_at_ack
  FROM pgque.partition_blocked b
  JOIN pgque.partition_slot p ON p.ps_sub OPERATOR(pg_catalog.=) b.pb_sub
  JOIN pgque.queue q ON q.queue_id OPERATOR(pg_catalog.=) p.ps_queue;

CREATE FUNCTION pgque."subscribe_partitioned"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"n" INT,
	"failure_policy" TEXT,
	"on_dead_letter" TEXT DEFAULT 'resume'
) RETURNS INT
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'subscribe_partitioned_policy_wrapper';

CREATE FUNCTION pgque."release_partition_key"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"partition_key" TEXT
) RETURNS bool
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'release_partition_key_wrapper';

REVOKE ALL ON FUNCTION pgque.subscribe_partitioned(text, text, int4, text, text),
    pgque.release_partition_key(text, text, text) FROM PUBLIC;
REVOKE ALL ON pgque.partition_blocked, pgque.partition_held, pgque.partition_blocked_keys FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.subscribe_partitioned(text, text, int4, text, text)
  TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.release_partition_key(text, text, text) TO pgque_admin;
GRANT SELECT ON pgque.partition_blocked_keys TO pgque_reader;
ALTER FUNCTION pgque.subscribe_partitioned(text, text, int4, text, text) SET enable_seqscan = off;
ALTER FUNCTION pgque.release_partition_key(text, text, text) SET enable_seqscan = off;
ALTER FUNCTION pgque.subscribe_partitioned(text, text, int4, text, text) SET jit = off;
ALTER FUNCTION pgque.release_partition_key(text, text, text) SET jit = off;
-- ==== trace context: job headers (issue 31, item 3; docs/tracing.md) ====
-- A job's headers (W3C traceparent / tracestate), stored in pgque.jobs only
-- (a job with headers never goes to the job log); enqueue and
-- enqueue_ready_rows take them as a last argument with a default (callers of
-- 0.7.0's signatures are unchanged), dispatch returns them as a 15th column,
-- all_jobs / get_job (and so job_detail) as their last.
ALTER TABLE pgque.jobs ADD COLUMN headers jsonb;

CREATE OR REPLACE VIEW pgque.all_jobs AS
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
       g.finished_at, NULL, g.shard, 'log'::text, g.output, g.progress, NULL::jsonb
FROM pgque.job_log_jobs g;

CREATE OR REPLACE FUNCTION pgque.get_job(job_id bigint) RETURNS SETOF pgque.all_jobs
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
       NULL::jsonb
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

DROP FUNCTION pgque.dispatch(text[], int, text, interval, int);
CREATE FUNCTION pgque."dispatch"(
	"queues" TEXT[],
	"limit" INT,
	"worker" TEXT,
	"lease" interval DEFAULT NULL,
	"oversample" INT DEFAULT 2
) RETURNS TABLE (
	"job_id" bigint,
	"queue" TEXT,
	"kind" TEXT,
	"args" jsonb,
	"priority" smallint,
	"attempt" INT,
	"max_attempts" INT,
	"actor" TEXT,
	"fairness_key" TEXT,
	"identity_key" TEXT,
	"run_at" timestamp with time zone,
	"enqueued_at" timestamp with time zone,
	"lease_token" bigint,
	"lease_until" timestamp with time zone,
	"headers" jsonb
)
SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'dispatch_wrapper';

DROP FUNCTION pgque.enqueue(text, text, jsonb, int, timestamptz, text, text, text, text, int, text, bigint[]);
CREATE FUNCTION pgque."enqueue"(
	"queue_name" TEXT,
	"kind" TEXT,
	"args" jsonb DEFAULT '{}',
	"priority" INT DEFAULT 0,
	"run_at" timestamp with time zone DEFAULT NULL,
	"actor" TEXT DEFAULT NULL,
	"fairness_key" TEXT DEFAULT NULL,
	"identity_key" TEXT DEFAULT NULL,
	"unique_key" TEXT DEFAULT NULL,
	"max_attempts" INT DEFAULT NULL,
	"on_duplicate" TEXT DEFAULT 'skip',
	"depends_on" bigint[] DEFAULT NULL,
	"headers" jsonb DEFAULT NULL
) RETURNS bigint
SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'enqueue_with_headers_wrapper';

DROP FUNCTION pgque.enqueue_ready_rows(text, text[], jsonb[], smallint[], timestamptz[],
                                       text[], text[], text[], text[], int[], text);
CREATE FUNCTION pgque."enqueue_ready_rows"(
	"queue_name" TEXT,
	"kinds" TEXT[],
	"args" jsonb[],
	"priorities" smallint[] DEFAULT NULL,
	"run_at" timestamp with time zone[] DEFAULT NULL,
	"actors" TEXT[] DEFAULT NULL,
	"fairness_keys" TEXT[] DEFAULT NULL,
	"identity_keys" TEXT[] DEFAULT NULL,
	"unique_keys" TEXT[] DEFAULT NULL,
	"max_attempts" INT[] DEFAULT NULL,
	"on_duplicate" TEXT DEFAULT 'skip',
	"headers" jsonb[] DEFAULT NULL
) RETURNS TABLE (
	"ord" INT,
	"job_id" bigint,
	"state" TEXT
)
SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'enqueue_ready_rows_with_headers_wrapper';

REVOKE ALL ON FUNCTION pgque.dispatch(text[], int, text, interval, int),
    pgque.enqueue(text, text, jsonb, int, timestamptz, text, text, text, text, int, text,
                  bigint[], jsonb),
    pgque.enqueue_ready_rows(text, text[], jsonb[], smallint[], timestamptz[], text[], text[],
                             text[], text[], int[], text, jsonb[])
  FROM PUBLIC;
ALTER FUNCTION pgque.dispatch(text[], int, text, interval, int) SET jit = off;
ALTER FUNCTION pgque.get_job(bigint) SET jit = off;
ALTER FUNCTION pgque.enqueue(text, text, jsonb, int, timestamptz, text, text, text, text, int,
                             text, bigint[], jsonb) SET jit = off;
ALTER FUNCTION pgque.enqueue_ready_rows(text, text[], jsonb[], smallint[], timestamptz[], text[],
                                        text[], text[], text[], int[], text, jsonb[]) SET jit = off;
GRANT EXECUTE ON FUNCTION pgque.dispatch(text[], int, text, interval, int) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.enqueue(text, text, jsonb, int, timestamptz, text,
    text, text, text, int, text, bigint[], jsonb) TO pgque_writer;
GRANT EXECUTE ON FUNCTION pgque.enqueue_ready_rows(text, text[], jsonb[], smallint[],
    timestamptz[], text[], text[], text[], text[], int[], text, jsonb[]) TO pgque_writer;
-- ==== end of trace context ====


-- ==== the history rollup (issue 32, item 6): sql/36_history.sql, as a fresh install runs it ====
-- metric_history is three pieces (partitions) that leave by TRUNCATE, never
-- trimmed by DELETE; maint_history takes `at` (the minute it writes). The
-- table is new in 0.8.0, so this is its one definition here.
-- handled: table metric_history 5f816e9391
CREATE TABLE pgque.metric_history (
    -- the minute (date_trunc('minute', now()) when written)
    bucket      timestamptz NOT NULL,
    -- 'e' an event queue, 'j' a job queue
    kind        "char" NOT NULL,
    queue       text NOT NULL,
    -- a running count: events sent (ids drawn from the queue's sequence),
    -- jobs completed (as stored: retention prunes them)
    total       bigint NOT NULL,
    -- its increase per second since the queue's previous row (NULL: none;
    -- 0 when the count fell)
    per_second  float8,
    -- events not yet processed by every consumer / jobs ready
    depth       bigint,
    -- seconds: the furthest-behind consumer's lag / the oldest ready job's wait
    lag_seconds float8,
    -- the piece the row was written to
    seg         smallint NOT NULL CHECK (seg BETWEEN 0 AND 2),
    PRIMARY KEY (bucket, kind, queue, seg)
) PARTITION BY LIST (seg);
CREATE TABLE pgque.metric_history_0 PARTITION OF pgque.metric_history FOR VALUES IN (0);
CREATE TABLE pgque.metric_history_1 PARTITION OF pgque.metric_history FOR VALUES IN (1);
CREATE TABLE pgque.metric_history_2 PARTITION OF pgque.metric_history FOR VALUES IN (2);
-- A queue's previous row (per_second).
CREATE INDEX metric_history_queue_idx ON pgque.metric_history (kind, queue, bucket);


-- The history duty: writes minute `at` (this minute by default; tests and
-- backfills give an earlier one) of every event and job queue (from
-- pgque.metrics() and the event sequences) unless a row of that minute or
-- a later one is written already, rotating the pieces first when due (see
-- above; `keep` is the retention, 1 minute .. 31 days; the worker passes
-- pgque.history_retention). A piece a reader still holds is not waited
-- for: its rotation is tried again at the next minute. Returns the rows
-- written. 22023 for `keep` out of range or `at` NULL or in the future.
CREATE FUNCTION pgque.maint_history(keep interval DEFAULT '24 hours',
                                    at timestamptz DEFAULT pg_catalog.now()) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $maint_history$
DECLARE
    v_now timestamptz := pg_catalog.date_trunc('minute', $2);
    v_cur smallint;
    v_next smallint;
    v_cur_min timestamptz;
    v_next_max timestamptz;
    v_n bigint;
BEGIN
    IF $1 IS NULL OR $1 OPERATOR(pg_catalog.<) interval '1 minute'
       OR $1 OPERATOR(pg_catalog.>) interval '31 days' THEN
        RAISE EXCEPTION 'keep % is outside 1 minute .. 31 days', $1 USING ERRCODE = '22023';
    END IF;
    IF $2 IS NULL OR $2 OPERATOR(pg_catalog.>) pg_catalog.now() THEN
        RAISE EXCEPTION 'at % is not a past or present time', $2 USING ERRCODE = '22023';
    END IF;
    -- One backward probe of each piece's primary key.
    IF EXISTS (SELECT 1 FROM pgque.metric_history h
                WHERE h.bucket OPERATOR(pg_catalog.>=) v_now) THEN
        RETURN 0;
    END IF;
    SELECT h.seg INTO v_cur FROM pgque.metric_history h ORDER BY h.bucket DESC LIMIT 1;
    v_cur := COALESCE(v_cur, 0);
    SELECT pg_catalog.min(h.bucket) INTO v_cur_min FROM pgque.metric_history h
     WHERE h.seg OPERATOR(pg_catalog.=) v_cur;
    IF v_cur_min OPERATOR(pg_catalog.<=)
       (v_now OPERATOR(pg_catalog.-) ($1 OPERATOR(pg_catalog./) 2::float8)) THEN
        v_next := (v_cur OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.%) 3;
        SELECT pg_catalog.max(h.bucket) INTO v_next_max FROM pgque.metric_history h
         WHERE h.seg OPERATOR(pg_catalog.=) v_next;
        IF v_next_max IS NULL THEN
            v_cur := v_next;
        ELSIF v_next_max OPERATOR(pg_catalog.<) (v_now OPERATOR(pg_catalog.-) $1) THEN
            BEGIN
                EXECUTE pg_catalog.format('LOCK TABLE pgque.%I IN ACCESS EXCLUSIVE MODE NOWAIT',
                                          'metric_history_' OPERATOR(pg_catalog.||) v_next);
                EXECUTE pg_catalog.format('TRUNCATE pgque.%I',
                                          'metric_history_' OPERATOR(pg_catalog.||) v_next);
                v_cur := v_next;
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
        END IF;
    END IF;
    WITH m AS MATERIALIZED (
        SELECT x.name, x.labels OPERATOR(pg_catalog.->>) 'queue' AS queue,
               x.labels OPERATOR(pg_catalog.->>) 'state' AS state, x.value
          FROM pgque.metrics() x
         WHERE x.name OPERATOR(pg_catalog.=) ANY (ARRAY['pgque_event_queue_pending_events',
                                 'pgque_consumer_lag_seconds', 'pgque_jobs',
                                 'pgque_job_oldest_ready_age_seconds'])),
    cur AS (
        SELECT 'e'::"char" AS kind, q.queue_name AS queue,
               COALESCE(pg_catalog.pg_sequence_last_value(q.queue_event_seq), 0) AS total,
               (SELECT pg_catalog.max(m.value) FROM m
                 WHERE m.name OPERATOR(pg_catalog.=) 'pgque_event_queue_pending_events'
                   AND m.queue OPERATOR(pg_catalog.=) q.queue_name)::bigint AS depth,
               (SELECT pg_catalog.max(m.value) FROM m
                 WHERE m.name OPERATOR(pg_catalog.=) 'pgque_consumer_lag_seconds'
                   AND m.queue OPERATOR(pg_catalog.=) q.queue_name) AS lag
          FROM pgque.queue q
        UNION ALL
        SELECT 'j'::"char", jq.queue_name,
               COALESCE((SELECT pg_catalog.max(m.value) FROM m
                          WHERE m.name OPERATOR(pg_catalog.=) 'pgque_jobs'
                            AND m.queue OPERATOR(pg_catalog.=) jq.queue_name
                            AND m.state OPERATOR(pg_catalog.=) 'completed'), 0)::bigint,
               (SELECT pg_catalog.max(m.value) FROM m
                 WHERE m.name OPERATOR(pg_catalog.=) 'pgque_jobs'
                   AND m.queue OPERATOR(pg_catalog.=) jq.queue_name
                   AND m.state OPERATOR(pg_catalog.=) 'ready')::bigint,
               (SELECT pg_catalog.max(m.value) FROM m
                 WHERE m.name OPERATOR(pg_catalog.=) 'pgque_job_oldest_ready_age_seconds'
                   AND m.queue OPERATOR(pg_catalog.=) jq.queue_name)
          FROM pgque.job_queues jq)
    INSERT INTO pgque.metric_history (bucket, kind, queue, total, per_second, depth, lag_seconds, seg)
    SELECT v_now, c.kind, c.queue, c.total,
           CASE WHEN p.bucket IS NOT NULL THEN
               pg_catalog.float8larger(0, (c.total OPERATOR(pg_catalog.-) p.total)::float8)
               OPERATOR(pg_catalog./)
               pg_catalog.date_part('epoch', v_now OPERATOR(pg_catalog.-) p.bucket) END,
           c.depth, c.lag, v_cur
      FROM cur c
      LEFT JOIN LATERAL (SELECT h.bucket, h.total FROM pgque.metric_history h
                          WHERE h.kind OPERATOR(pg_catalog.=) c.kind
                            AND h.queue OPERATOR(pg_catalog.=) c.queue
                            AND h.bucket OPERATOR(pg_catalog.<) v_now
                          ORDER BY h.bucket DESC LIMIT 1) p ON true;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$maint_history$;

REVOKE ALL ON TABLE pgque.metric_history, pgque.metric_history_0, pgque.metric_history_1,
    pgque.metric_history_2 FROM PUBLIC;
-- The history of the last `since` (1 minute .. 31 days), by queue then
-- minute: one index range of the minutes asked for, whatever else is kept.
-- kind is 'event' or 'job'. 22023 for `since` out of range.
CREATE FUNCTION pgque.read_history(since interval DEFAULT '1 hour')
RETURNS TABLE (bucket timestamptz, kind text, queue text, total bigint, per_second float8,
               depth bigint, lag_seconds float8)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $read_history$
BEGIN
    IF $1 IS NULL OR $1 OPERATOR(pg_catalog.<) interval '1 minute'
       OR $1 OPERATOR(pg_catalog.>) interval '31 days' THEN
        RAISE EXCEPTION 'since % is outside 1 minute .. 31 days', $1 USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT h.bucket, CASE h.kind WHEN 'e' THEN 'event' ELSE 'job' END, h.queue, h.total,
           h.per_second, h.depth, h.lag_seconds
      FROM pgque.metric_history h
     WHERE h.bucket OPERATOR(pg_catalog.>=)
           pg_catalog.date_trunc('minute', pg_catalog.now() OPERATOR(pg_catalog.-) $1)
     ORDER BY h.kind, h.queue, h.bucket;
END
$read_history$;

REVOKE ALL ON FUNCTION pgque.maint_history(interval, timestamptz), pgque.read_history(interval)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.maint_history(interval, timestamptz) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.read_history(interval) TO pgque_reader, pgque_admin;
-- ==== end of the history rotation ====

-- ==== schedules: the jobs of their recent firings (issue 32 item 5, web2) ====
-- schedules_def keeps the jobs of each schedule's last firings (newest
-- first, at most 10) in the row its firings update anyway; an existing
-- schedule starts from its last job.
-- handled: table schedules_def fbd62a0f26
ALTER TABLE pgque.schedules_def ADD COLUMN recent_job_ids bigint[] NOT NULL DEFAULT '{}';
UPDATE pgque.schedules_def SET recent_job_ids = ARRAY[last_job_id] WHERE last_job_id IS NOT NULL;
CREATE OR REPLACE VIEW pgque.schedules AS
SELECT s.name, s.cron, s.timezone, s.queue_name, s.kind, s.args, s.misfire, s.paused,
       s.next_run_at, s.last_run_at, s.last_job_id, s.priority, s.max_attempts, s.schedule_id,
       s.recent_job_ids
FROM pgque.schedules_def s;
-- handled: function run_schedule_now(text) dc458cc7a5
CREATE OR REPLACE FUNCTION pgque.run_schedule_now(name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $run_schedule_now$
DECLARE
    v_s pgque.schedules_def;
    v_job bigint;
BEGIN
    SELECT * INTO v_s FROM pgque.schedules_def s WHERE s.name = $1 FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'schedule % does not exist', $1 USING ERRCODE = '42704';
    END IF;
    IF v_s.paused THEN
        RAISE EXCEPTION 'schedule % is paused', $1 USING ERRCODE = '55000',
            HINT = 'resume it first (pgque.resume_schedule)';
    END IF;
    v_job := pgque.enqueue(v_s.queue_name, v_s.kind,
                           v_s.args || pg_catalog.jsonb_build_object(
                               'scheduled_for',
                               pg_catalog.to_char(pg_catalog.now() AT TIME ZONE 'UTC',
                                                  'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
                           v_s.priority::int, NULL, NULL, NULL, NULL, NULL, v_s.max_attempts);
    UPDATE pgque.schedules_def s SET last_run_at = pg_catalog.now(), last_job_id = v_job,
           recent_job_ids = (v_job OPERATOR(pg_catalog.||) s.recent_job_ids)[1:10]
    WHERE s.schedule_id = v_s.schedule_id;
    RETURN v_job;
END
$run_schedule_now$;
-- ==== end of the schedules' recent firings ====

-- ==== online resize of a partitioned consumer's N (issue 34 item 2): sql/17_slots_resize.sql ====
-- pgque partition slots, online resize of N (src/log/resize.rs,
-- docs/partition-keys.md "Resizing N online").
--
-- A resize of consumer c from N to N' slots seals the old slots at a tick T
-- (their batches stop at T) and subscribes the N' new slots at T, under
-- pending names "c#<k>/<N'>" (never handed out: they are not lease rows of
-- partition_slot). complete_resize, once every old slot has reached T with
-- no open batch, moves retries, blocked-key markers, held events and dead
-- letters to each key's new slot, drops the old subscriptions and makes
-- the new ones c#0 .. c#<N'-1>.

-- The seal of a slot: its batches never reach past this tick (NULL: no
-- resize in progress). Read with the lease row by the fence, so the batch
-- opener sees it under the lock it opens batches under.
ALTER TABLE pgque.partition_slot ADD COLUMN ps_seal int8;

-- The resize in progress of a partitioned consumer (at most one).
--  pr_n     the new N
--  pr_tick  the seal T: old slots deliver up to it, new slots after it
--  pr_subs  the new slots' subscriptions, slot k at index k + 1
CREATE TABLE pgque.partition_resize (
    pr_queue    int4 NOT NULL,
    pr_consumer text NOT NULL,
    pr_n        int4 NOT NULL CHECK (pr_n BETWEEN 1 AND 256),
    pr_tick     int8 NOT NULL,
    pr_subs     int4[] NOT NULL,
    pr_since    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pr_queue, pr_consumer),
    FOREIGN KEY (pr_queue, pr_consumer)
        REFERENCES pgque.partition_consumer (pc_queue, pc_consumer) ON DELETE CASCADE,
    CHECK (pg_catalog.cardinality(pr_subs) = pr_n)
);

SELECT pg_catalog.pg_extension_config_dump('pgque.partition_resize', '');

-- One row per resize in progress.
CREATE VIEW pgque.partition_resizes AS
SELECT q.queue_name, r.pr_consumer AS consumer, c.pc_n AS n, r.pr_n AS new_n,
       r.pr_tick AS seal_tick, r.pr_since AS started_at,
       pg_catalog.now() OPERATOR(pg_catalog.-) r.pr_since AS running_for
  FROM pgque.partition_resize r
  JOIN pgque.partition_consumer c
    ON c.pc_queue OPERATOR(pg_catalog.=) r.pr_queue
   AND c.pc_consumer OPERATOR(pg_catalog.=) r.pr_consumer
  JOIN pgque.queue q ON q.queue_id OPERATOR(pg_catalog.=) r.pr_queue;

CREATE FUNCTION pgque."begin_resize"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"new_n" INT
) RETURNS bigint
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'begin_resize_wrapper';

CREATE FUNCTION pgque."resize_ready"(
	"queue_name" TEXT,
	"consumer" TEXT
) RETURNS TABLE (
	"slot" INT,
	"n" INT,
	"new_n" INT,
	"seal_tick" bigint,
	"last_tick" bigint,
	"open_batch" bool,
	"ready" bool,
	"retry_events" bigint,
	"blocked_keys" bigint,
	"held_events" bigint,
	"dead_letters" bigint
)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'resize_ready_wrapper';

CREATE FUNCTION pgque."complete_resize"(
	"queue_name" TEXT,
	"consumer" TEXT
) RETURNS INT
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'complete_resize_wrapper';

CREATE FUNCTION pgque."abort_resize"(
	"queue_name" TEXT,
	"consumer" TEXT
) RETURNS INT
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'abort_resize_wrapper';

REVOKE ALL ON FUNCTION pgque.begin_resize(text, text, int4), pgque.resize_ready(text, text),
    pgque.complete_resize(text, text), pgque.abort_resize(text, text) FROM PUBLIC;
REVOKE ALL ON pgque.partition_resize, pgque.partition_resizes FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.begin_resize(text, text, int4),
    pgque.complete_resize(text, text), pgque.abort_resize(text, text)
  TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.resize_ready(text, text) TO pgque_reader, pgque_admin;
GRANT SELECT ON pgque.partition_resizes TO pgque_reader, pgque_admin;
ALTER FUNCTION pgque.begin_resize(text, text, int4) SET enable_seqscan = off;
ALTER FUNCTION pgque.resize_ready(text, text) SET enable_seqscan = off;
ALTER FUNCTION pgque.complete_resize(text, text) SET enable_seqscan = off;
ALTER FUNCTION pgque.abort_resize(text, text) SET enable_seqscan = off;
ALTER FUNCTION pgque.begin_resize(text, text, int4) SET jit = off;
ALTER FUNCTION pgque.resize_ready(text, text) SET jit = off;
ALTER FUNCTION pgque.complete_resize(text, text) SET jit = off;
ALTER FUNCTION pgque.abort_resize(text, text) SET jit = off;
-- ==== end of online resize ====

-- ==== trace context II: headers in the job log (issue 31, item 3) ====
-- The log's batch rows get a headers array (parallel to kinds / args; NULL
-- when no job of the batch has headers), so a traced job stays in the log
-- instead of taking pgque.jobs; job_log_jobs, all_jobs and get_job return it.
-- handled: table job_log 2c960c4b2a
ALTER TABLE pgque.job_log ADD COLUMN headers jsonb[];
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

CREATE OR REPLACE VIEW pgque.job_log_jobs AS
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
-- (all_jobs and get_job change a second time in this script: upgrade_draft
-- sees the first, so these are marked)
-- handled: view all_jobs a21021ad62
-- handled: function get_job(bigint) c4100a2938
CREATE OR REPLACE VIEW pgque.all_jobs AS
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
CREATE OR REPLACE FUNCTION pgque.get_job(job_id bigint) RETURNS SETOF pgque.all_jobs
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
ALTER FUNCTION pgque.get_job(bigint) SET jit = off;
-- ==== end of trace context II: headers in the job log ====

-- ==== trace context III: headers on events (issue 31 item 3, evtrace; docs/tracing.md) ====
-- An event's headers (W3C traceparent / tracestate) live in a new last
-- column ev_headers of every queue's event tables, and move with the event
-- through retries, dead letters, held events of paused keys and delayed
-- delivery: each of those tables gets the column too. pgque.message and
-- receive / receive_coop / receive_partitioned are PgQue's contract and stay
-- as they are; the *_with_headers twins return the headers as a last column.
-- handled: table retry_queue 8eee707686
-- handled: table dead_letter_store ab3abbf683
-- handled: table delayed_event c190aad909
-- handled: table partition_held 9eaf9e274d
ALTER TABLE pgque.retry_queue ADD COLUMN ev_headers jsonb;
ALTER TABLE pgque.dead_letter_store ADD COLUMN ev_headers jsonb;
ALTER TABLE pgque.partition_held ADD COLUMN ev_headers jsonb;
-- (a partitioned table: its pieces get the column with it)
ALTER TABLE pgque.delayed_event ADD COLUMN ev_headers jsonb;

-- Every existing queue's event tables: the column added to the parent
-- reaches its children (inheritance), and the children made later by
-- rotation (TRUNCATE keeps columns) or a new queue (create_queue) have it.
-- IF NOT EXISTS: a queue created by a 0.8.0 library before this update
-- already has it.
DO $evheaders$
DECLARE q int4;
BEGIN
    FOR q IN SELECT queue_id FROM pgque.queue LOOP
        IF pg_catalog.to_regclass(pg_catalog.format('pgque.event_%s', q)) IS NOT NULL THEN
            EXECUTE pg_catalog.format('ALTER TABLE pgque.%I ADD COLUMN IF NOT EXISTS ev_headers jsonb',
                                      'event_' || q);
        END IF;
    END LOOP;
END
$evheaders$;

-- send_idem and send_at take headers as a last argument with a default
-- (new C symbols: 0.7.0's stay in the library for a database not updated).
-- handled: function send_idem(text, text, jsonb, text, interval, text) gone
-- handled: function send_idem(text, text, text, text, interval, text) gone
-- handled: function send_at(text, text, jsonb, timestamp with time zone, text) gone
-- handled: function send_at(text, text, text, timestamp with time zone, text) gone
DROP FUNCTION pgque.send_idem(text, text, jsonb, text, interval, text);
DROP FUNCTION pgque.send_idem(text, text, text, text, interval, text);
DROP FUNCTION pgque.send_at(text, text, jsonb, timestamptz, text);
DROP FUNCTION pgque.send_at(text, text, text, timestamptz, text);

CREATE FUNCTION pgque."send_idem"(
	"queue_name" TEXT,
	"type_name" TEXT,
	"payload" jsonb,
	"idem_key" TEXT,
	"ttl" interval DEFAULT '1 hour',
	"partition_key" TEXT DEFAULT NULL,
	"headers" jsonb DEFAULT NULL
) RETURNS TABLE (
	"event_id" bigint,
	"deduped" bool
)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'send_idem_headers_jsonb_wrapper';

CREATE FUNCTION pgque."send_idem"(
	"queue_name" TEXT,
	"type_name" TEXT,
	"payload" TEXT,
	"idem_key" TEXT,
	"ttl" interval DEFAULT '1 hour',
	"partition_key" TEXT DEFAULT NULL,
	"headers" jsonb DEFAULT NULL
) RETURNS TABLE (
	"event_id" bigint,
	"deduped" bool
)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'send_idem_headers_text_wrapper';

CREATE FUNCTION pgque."send_at"(
	"queue_name" TEXT,
	"type_name" TEXT,
	"payload" jsonb,
	"deliver_at" timestamp with time zone,
	"partition_key" TEXT DEFAULT NULL,
	"headers" jsonb DEFAULT NULL
) RETURNS bigint
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'send_at_headers_jsonb_wrapper';

CREATE FUNCTION pgque."send_at"(
	"queue_name" TEXT,
	"type_name" TEXT,
	"payload" TEXT,
	"deliver_at" timestamp with time zone,
	"partition_key" TEXT DEFAULT NULL,
	"headers" jsonb DEFAULT NULL
) RETURNS bigint
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'send_at_headers_text_wrapper';

-- The traced producers: send and send_batch with partition key(s) and
-- headers, five arguments without defaults (no 0.7.0 call resolves to them).
-- Invoker's rights and no settings, as every send (src/api/owner.rs).
CREATE FUNCTION pgque."send"(
	"queue_name" TEXT,
	"type_name" TEXT,
	"payload" jsonb,
	"partition_key" TEXT,
	"headers" jsonb
) RETURNS bigint
LANGUAGE c
AS 'MODULE_PATHNAME', 'send_headers_jsonb_wrapper';

CREATE FUNCTION pgque."send"(
	"queue_name" TEXT,
	"type_name" TEXT,
	"payload" TEXT,
	"partition_key" TEXT,
	"headers" jsonb
) RETURNS bigint
LANGUAGE c
AS 'MODULE_PATHNAME', 'send_headers_text_wrapper';

CREATE FUNCTION pgque."send_batch"(
	"queue_name" TEXT,
	"type_name" TEXT,
	"payloads" jsonb[],
	"partition_keys" TEXT[],
	"headers" jsonb
) RETURNS bigint[]
LANGUAGE c
AS 'MODULE_PATHNAME', 'send_batch_headers_jsonb_wrapper';

CREATE FUNCTION pgque."send_batch"(
	"queue_name" TEXT,
	"type_name" TEXT,
	"payloads" TEXT[],
	"partition_keys" TEXT[],
	"headers" jsonb
) RETURNS bigint[]
LANGUAGE c
AS 'MODULE_PATHNAME', 'send_batch_headers_text_wrapper';

-- The receive twins with the headers as a last column.
CREATE FUNCTION pgque."receive_with_headers"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"max_return" INT DEFAULT 100
) RETURNS TABLE (msg_id bigint, batch_id bigint, type text, payload text, retry_count int4, created_at timestamptz, extra1 text, extra2 text, extra3 text, extra4 text, headers jsonb)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'receive_with_headers_wrapper';

CREATE FUNCTION pgque."receive_coop_with_headers"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"subconsumer" TEXT,
	"max_return" INT DEFAULT 100,
	"dead_interval" interval DEFAULT NULL
) RETURNS TABLE (msg_id bigint, batch_id bigint, type text, payload text, retry_count int4, created_at timestamptz, extra1 text, extra2 text, extra3 text, extra4 text, headers jsonb)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'receive_coop_with_headers_wrapper';

CREATE FUNCTION pgque."receive_partitioned_with_headers"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"slot" INT,
	"n" INT,
	"worker" TEXT,
	"max_return" INT DEFAULT 100
) RETURNS TABLE (msg_id bigint, batch_id bigint, type text, payload text, retry_count int4, created_at timestamptz, extra1 text, extra2 text, extra3 text, extra4 text, headers jsonb)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'receive_partitioned_with_headers_wrapper';

-- Grants and settings as sql/99_finalize.sql gives them.
REVOKE ALL ON FUNCTION
    pgque.send_idem(text, text, jsonb, text, interval, text, jsonb),
    pgque.send_idem(text, text, text, text, interval, text, jsonb),
    pgque.send_at(text, text, jsonb, timestamptz, text, jsonb),
    pgque.send_at(text, text, text, timestamptz, text, jsonb),
    pgque.send(text, text, jsonb, text, jsonb), pgque.send(text, text, text, text, jsonb),
    pgque.send_batch(text, text, jsonb[], text[], jsonb),
    pgque.send_batch(text, text, text[], text[], jsonb),
    pgque.receive_with_headers(text, text, int4),
    pgque.receive_coop_with_headers(text, text, text, int4, interval),
    pgque.receive_partitioned_with_headers(text, text, int4, int4, text, int4)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgque.send_idem(text, text, jsonb, text, interval, text, jsonb),
    pgque.send_idem(text, text, text, text, interval, text, jsonb)
  TO pgque_writer;
GRANT EXECUTE ON FUNCTION
    pgque.send_at(text, text, jsonb, timestamptz, text, jsonb),
    pgque.send_at(text, text, text, timestamptz, text, jsonb)
  TO pgque_writer;
GRANT EXECUTE ON FUNCTION
    pgque.send(text, text, jsonb, text, jsonb), pgque.send(text, text, text, text, jsonb),
    pgque.send_batch(text, text, jsonb[], text[], jsonb),
    pgque.send_batch(text, text, text[], text[], jsonb)
  TO pgque_writer;
GRANT EXECUTE ON FUNCTION
    pgque.receive_with_headers(text, text, int4),
    pgque.receive_coop_with_headers(text, text, text, int4, interval),
    pgque.receive_partitioned_with_headers(text, text, int4, int4, text, int4)
  TO pgque_reader;
ALTER FUNCTION pgque.send_idem(text, text, jsonb, text, interval, text, jsonb) SET enable_seqscan = off;
ALTER FUNCTION pgque.send_idem(text, text, text, text, interval, text, jsonb) SET enable_seqscan = off;
ALTER FUNCTION pgque.send_at(text, text, jsonb, timestamptz, text, jsonb) SET enable_seqscan = off;
ALTER FUNCTION pgque.send_at(text, text, text, timestamptz, text, jsonb) SET enable_seqscan = off;
ALTER FUNCTION pgque.send_idem(text, text, jsonb, text, interval, text, jsonb) SET jit = off;
ALTER FUNCTION pgque.send_idem(text, text, text, text, interval, text, jsonb) SET jit = off;
ALTER FUNCTION pgque.send_at(text, text, jsonb, timestamptz, text, jsonb) SET jit = off;
ALTER FUNCTION pgque.send_at(text, text, text, timestamptz, text, jsonb) SET jit = off;
ALTER FUNCTION pgque.receive_with_headers(text, text, int4) SET enable_seqscan = off;
ALTER FUNCTION pgque.receive_coop_with_headers(text, text, text, int4, interval) SET enable_seqscan = off;
ALTER FUNCTION pgque.receive_partitioned_with_headers(text, text, int4, int4, text, int4) SET enable_seqscan = off;
ALTER FUNCTION pgque.receive_with_headers(text, text, int4) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgque.receive_coop_with_headers(text, text, text, int4, interval) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgque.receive_partitioned_with_headers(text, text, int4, int4, text, int4) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgque.receive_with_headers(text, text, int4) SET jit = off;
ALTER FUNCTION pgque.receive_coop_with_headers(text, text, text, int4, interval) SET jit = off;
ALTER FUNCTION pgque.receive_partitioned_with_headers(text, text, int4, int4, text, int4) SET jit = off;

-- The event browser's pages (sql/35_event_browser.sql) show the headers as
-- a last column: new result columns, so dropped and made again.
DROP FUNCTION pgque.browse_events(text, text, bigint, bigint, int);
DROP FUNCTION pgque.browse_dead_letters(text, bigint, int);
CREATE FUNCTION pgque.browse_events(queue_name text, consumer text DEFAULT NULL,
                                    after_txid bigint DEFAULT NULL, after_id bigint DEFAULT NULL,
                                    max_events int DEFAULT 50)
RETURNS TABLE (ev_id bigint, ev_txid bigint, ev_time timestamptz, ev_type text, ev_data text,
               partition_key text, ev_retry int, for_consumer text, headers jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
SET enable_seqscan = off
AS $browse_events$
DECLARE
    v_q int4;
    v_sub int4;
    v_pos bigint;
    v_snap pg_catalog.pg_snapshot;
    v_lim int := COALESCE($5, 50);
    v_from pg_catalog.xid8;
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'queue_name must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF v_lim < 1 OR v_lim > 1000 THEN
        RAISE EXCEPTION 'max_events % is outside 1..1000', v_lim USING ERRCODE = '22003';
    END IF;
    IF $3 < 0 OR $4 < 0 THEN
        RAISE EXCEPTION 'after_txid and after_id must not be negative' USING ERRCODE = '22003';
    END IF;
    SELECT q.queue_id INTO v_q FROM pgque.queue q WHERE q.queue_name OPERATOR(pg_catalog.=) $1;
    IF v_q IS NULL THEN
        RAISE EXCEPTION 'queue not found: %', $1 USING ERRCODE = '42704';
    END IF;
    IF $2 IS NOT NULL THEN
        SELECT s.sub_id INTO v_sub FROM pgque.subscription s
         WHERE s.sub_queue OPERATOR(pg_catalog.=) v_q AND s.sub_parent IS NULL
           AND s.sub_consumer OPERATOR(pg_catalog.=) $2;
        IF v_sub IS NULL THEN
            RAISE EXCEPTION 'consumer not registered: % on queue %', $2, $1 USING ERRCODE = '42704';
        END IF;
        SELECT p.pos_tick INTO v_pos FROM pgque.consumer_position p
         WHERE p.sub_id OPERATOR(pg_catalog.=) v_sub;
    ELSE
        SELECT pg_catalog.min(p.pos_tick) INTO v_pos FROM pgque.consumer_position p
         WHERE p.sub_queue OPERATOR(pg_catalog.=) v_q;
    END IF;
    IF v_pos IS NULL THEN
        RETURN;
    END IF;
    SELECT t.tick_snapshot INTO v_snap FROM pgque.tick t
     WHERE t.tick_queue OPERATOR(pg_catalog.=) v_q AND t.tick_id OPERATOR(pg_catalog.=) v_pos
     LIMIT 1;
    IF v_snap IS NULL THEN
        RETURN;
    END IF;
    v_from := pg_catalog.pg_snapshot_xmin(v_snap);
    IF $3 IS NOT NULL AND ($3::text)::pg_catalog.xid8 OPERATOR(pg_catalog.>) v_from THEN
        v_from := ($3::text)::pg_catalog.xid8;
    END IF;
    -- (the table's name is made of the queue's integer id)
    RETURN QUERY EXECUTE pg_catalog.format(
        'SELECT e.ev_id, e.ev_txid::text::int8, e.ev_time, e.ev_type, e.ev_data, e.ev_extra1,
                e.ev_retry, s.sub_consumer, e.ev_headers
           FROM pgque.%I e
           LEFT JOIN pgque.subscription s ON s.sub_id OPERATOR(pg_catalog.=) e.ev_owner
          WHERE e.ev_txid OPERATOR(pg_catalog.>=) $1
            AND NOT pg_catalog.pg_visible_in_snapshot(e.ev_txid, $2)
            AND ($3::int8 IS NULL
                 OR (e.ev_txid::text::int8, e.ev_id) OPERATOR(pg_catalog.>) ($3::int8, COALESCE($4, -1)))
            AND ($5::int4 IS NULL OR e.ev_owner IS NULL OR e.ev_owner OPERATOR(pg_catalog.=) $5)
          ORDER BY e.ev_txid, e.ev_id
          LIMIT $6', 'event_' || v_q::text)
    USING v_from, v_snap, $3, $4, v_sub, v_lim;
END
$browse_events$;

CREATE FUNCTION pgque.browse_dead_letters(queue_name text, before_id bigint DEFAULT NULL,
                                          max_letters int DEFAULT 50)
RETURNS TABLE (dl_id bigint, consumer text, dl_time timestamptz, dl_reason text, ev_id bigint,
               ev_time timestamptz, ev_retry int, ev_type text, ev_data text, partition_key text,
               headers jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
SET enable_seqscan = off
AS $browse_dead_letters$
DECLARE
    v_q int4;
    v_lim int := COALESCE($3, 50);
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'queue_name must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF v_lim < 1 OR v_lim > 1000 THEN
        RAISE EXCEPTION 'max_letters % is outside 1..1000', v_lim USING ERRCODE = '22003';
    END IF;
    SELECT q.queue_id INTO v_q FROM pgque.queue q WHERE q.queue_name OPERATOR(pg_catalog.=) $1;
    IF v_q IS NULL THEN
        RAISE EXCEPTION 'queue not found: %', $1 USING ERRCODE = '42704';
    END IF;
    RETURN QUERY
    SELECT d.dl_id, d.dl_consumer, d.dl_time, d.dl_reason, d.ev_id, d.ev_time, d.ev_retry,
           d.ev_type, d.ev_data, d.ev_extra1, d.ev_headers
      FROM pgque.dead_letter_store d
     WHERE d.dl_queue OPERATOR(pg_catalog.=) v_q
       AND d.dl_id OPERATOR(pg_catalog.<) COALESCE($2, 9223372036854775807)
     ORDER BY d.dl_id DESC
     LIMIT v_lim;
END
$browse_dead_letters$;

REVOKE ALL ON FUNCTION pgque.browse_events(text, text, bigint, bigint, int),
    pgque.browse_dead_letters(text, bigint, int)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.browse_events(text, text, bigint, bigint, int),
    pgque.browse_dead_letters(text, bigint, int)
  TO pgque_reader, pgque_admin;
-- ==== end of trace context III ====

-- ==== stored cuts unlogged (issue 33 item 2): sql/10_event_log.sql ====
-- The cut store is a cache rebuilt from the event tables when missing; its
-- chunks are now small enough to stay uncompressed, and unlogged they write
-- no WAL (src/log/cuts.rs).
ALTER TABLE pgque.batch_cut_p0 SET UNLOGGED;
ALTER TABLE pgque.batch_cut_p1 SET UNLOGGED;
-- ==== end of stored cuts unlogged ====
