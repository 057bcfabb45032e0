-- pgque explorer: what pgque-web's jobs, job, flow and schedules pages read
-- (src/explorer.rs). Every function is SECURITY DEFINER with a pinned
-- search_path and schema-qualified names, so a dashboard role with
-- pgque_reader (pages) or pgque_admin (actions) never reads pgque's tables.
--
-- Pages are keyset-paginated by job id, newest first (never OFFSET), over
-- both stores: pgque.jobs through the index below, the job log lane by lane
-- through job_log_lane_idx (lane_id, id_hi), reading only the batch rows
-- that hold the page's jobs. Filters an index cannot serve (kind and the
-- text search: in the log kinds and args live in per-batch arrays) look at
-- no more than 2000 candidate jobs per store stream and page, and so does
-- the log's walk for any filter (it passes over the jobs of its batch rows
-- that moved to pgque.jobs); when that window ends before the page is full,
-- the page ends with a row whose id is NULL and whose cursor_id says where
-- to go on. So a page costs the same with 100 or 10 million jobs stored.
--
-- What a caller sees (docs/operations.md, "What each role can see and do"):
-- every caller the states, counts, kinds, queues, keys, timings, attempts
-- and workers of jobs; never a lease token (it is the running worker's
-- capability: whoever holds it can complete, fail, heartbeat or snooze the
-- job, so showing it to readers let any reader finish another worker's
-- job); contents (args, outputs, progress, error texts and tracebacks,
-- headers) only a member of pgque_admin, as pgque.get_job, all_jobs and
-- job_history show them only to pgque_admin. "The caller" is the role in
-- effect outside any SECURITY DEFINER function: the one SET ROLE chose, else
-- the session's (inside these functions current_user is pgque's owner, and
-- only a member of a role can SET ROLE to it):
--   pg_has_role(COALESCE(NULLIF(current_setting('role'), 'none'), session_user), 'pgque_admin', 'USAGE')
-- written out in each function (a helper would be one more function in
-- every grant and bad-input matrix for one expression).

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
-- last_error is NULL and `search` is refused for a caller without
-- pgque_admin (a search of args and errors would read them out a
-- substring at a time).
-- Errors: 22023 unknown state, 42704 unknown queue, 22003 max_jobs outside
-- 1..1000, 22001 a search over 200 characters, 42501 a search by a caller
-- without pgque_admin.
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
    -- contents (the last error) for pgque_admin only: see the top of this file
    v_admin boolean := pg_catalog.pg_has_role(COALESCE(NULLIF(pg_catalog.current_setting('role'), 'none'), session_user::text)::name,
                                'pgque_admin', 'USAGE');
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
    IF v_s IS NOT NULL AND NOT v_admin THEN
        RAISE EXCEPTION 'searching job args and errors needs pgque_admin' USING ERRCODE = '42501',
            HINT = 'filter by queue, state or kind instead';
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
           g.enqueued_at, g.finished_at, CASE WHEN v_admin THEN g.errors -> -1 ->> 'error' END, g.stored_in,
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
-- an unknown (or pruned) job. Never the lease token. For a caller without
-- pgque_admin (see the top of this file) no args, output, progress or
-- headers, and each error only its attempt and time; `contents_hidden`
-- says which.
CREATE FUNCTION pgque.job_detail(job_id bigint) RETURNS jsonb
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $job_detail$
WITH who AS (
    SELECT pg_catalog.pg_has_role(COALESCE(NULLIF(pg_catalog.current_setting('role'), 'none'), session_user::text)::name,
                                'pgque_admin', 'USAGE') AS admin
)
SELECT CASE WHEN who.admin THEN pg_catalog.to_jsonb(g) - 'lease_token'
            ELSE (pg_catalog.to_jsonb(g) - ARRAY['lease_token', 'args', 'output', 'progress', 'headers', 'errors'])
                 || pg_catalog.jsonb_build_object(
                        'errors', (SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                                              'attempt', e.e -> 'attempt', 'at', e.e -> 'at') ORDER BY e.o)
                                     FROM pg_catalog.jsonb_array_elements(g.errors) WITH ORDINALITY AS e(e, o)))
       END
       || pg_catalog.jsonb_build_object('flow_id', j.flow_id, 'flow_key', j.flow_key,
                                        'pending_parents', j.pending_parents,
                                        'run_on_parent_failure', j.run_on_parent_failure,
                                        'contents_hidden', NOT who.admin)
FROM who, pgque.get_job($1) g
LEFT JOIN pgque.jobs j ON j.id = g.id
$job_detail$;

-- A job's history, oldest first: its job_events rows (read through the
-- (at, id) index from a minute before its enqueue on, as docs/job-queues.md
-- advises) and, for a job of the log, its enqueue, dispatch and completion,
-- which are the log's own rows (for a job that left the log, its first
-- enqueue and last dispatch as its row has them). `source` says which. No row: unknown job.
-- The detail of a failed or retried attempt is the error text the worker
-- gave pgque.fail: NULL for a caller without pgque_admin (see the top).
CREATE FUNCTION pgque.job_timeline(job_id bigint)
RETURNS TABLE (at timestamptz, event text, attempt int, detail text, source text)
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $job_timeline$
WITH who AS (
    SELECT pg_catalog.pg_has_role(COALESCE(NULLIF(pg_catalog.current_setting('role'), 'none'), session_user::text)::name,
                                'pgque_admin', 'USAGE') AS admin
),
g AS (SELECT * FROM pgque.get_job($1)),
ev AS (
    SELECT e.id, e.at, e.event, e.attempt, e.detail
    FROM g, pgque.job_events e
    WHERE e.at >= g.enqueued_at - interval '1 minute'
      AND (e.job_id = $1 OR $1 = ANY (e.job_ids))
)
SELECT t.at, t.event, t.attempt,
       CASE WHEN t.event IN ('failed', 'retried') AND NOT (SELECT w.admin FROM who w) THEN NULL
            ELSE t.detail END,
       t.source FROM (
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
-- "scheduled_for" the current time), recorded as its last run (and in
-- front of its recent firings). Its next
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
    UPDATE pgque.schedules_def s SET last_run_at = pg_catalog.now(), last_job_id = v_job,
           recent_job_ids = (v_job OPERATOR(pg_catalog.||) s.recent_job_ids)[1:10]
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
