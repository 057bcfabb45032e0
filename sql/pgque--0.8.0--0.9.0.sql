-- pgque 0.8.0 -> 0.9.0 (ALTER EXTENSION pgque UPDATE).
--
-- How this file is kept right: pg_test/tests/upgrade.rs installs each released
-- version (the frozen sql/archive/pgque--<version>.sql), fills it with queues,
-- events, consumers and jobs, runs ALTER EXTENSION pgque UPDATE and compares
-- every extension object (definitions, grants, options, pg_dump
-- registrations) with a fresh 0.9.0 install; it prints the differences when
-- they disagree.
--
-- When a change to sql/*.sql or to a #[pg_extern] lands, extend this file:
--   cargo pgrx schema pg15 --no-default-features --features pg15 -o /tmp/pgque--0.9.0.sql
--   python3 scripts/upgrade_draft.py sql/archive/pgque--0.8.0.sql /tmp/pgque--0.9.0.sql \
--       --upgrade sql/pgque--0.8.0--0.9.0.sql
-- prints the new and changed statements not yet covered here.
--
-- Rules: every statement schema-qualified (the script runs with the
-- extension's search_path); nothing here may depend on data being present or
-- absent.

\echo Use "ALTER EXTENSION pgque UPDATE" to load this file. \quit

-- ==== databases pgque runs in (issue 42) ====
-- 0.9.0 installs only into UTF8 databases (sql/00_bootstrap.sql says why). A
-- database that has 0.8.0 in another encoding is updated, since refusing
-- would keep it on 0.8.0's objects under the new library, but told that
-- text outside ASCII is not kept byte for byte there.
DO $encoding$
BEGIN
    IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.<>) 'UTF8' THEN
        RAISE WARNING 'pgque supports only UTF8 databases, and this one is %', pg_catalog.getdatabaseencoding()
            USING DETAIL = 'Text outside ASCII (payloads, names, arguments) may be refused or not kept byte for byte.',
                  HINT = 'Move the data to a database with ENCODING ''UTF8'' (docs/operations.md, "Databases pgque runs in").';
    END IF;
END
$encoding$;


-- ==== what readers see (issue 42, review items 2 and 6) ====
-- The explorer's and the event browser's functions (granted to pgque_reader)
-- no longer give anyone a running job's lease token (any reader could
-- complete, fail, heartbeat or snooze another worker's job with it), and give
-- contents (job args, outputs, progress, error texts, event and dead-letter
-- payloads, headers, dead-letter reasons) only to a member of pgque_admin;
-- list_jobs refuses a search of args and errors to others (42501).
-- sql/34_explorer.sql says who "the caller" is. Same signatures, result
-- types and grants: CREATE OR REPLACE keeps the ACLs.
CREATE OR REPLACE FUNCTION pgque.list_jobs(of_queue text DEFAULT NULL, in_state text DEFAULT NULL,
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

CREATE OR REPLACE FUNCTION pgque.job_detail(job_id bigint) RETURNS jsonb
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

CREATE OR REPLACE FUNCTION pgque.job_timeline(job_id bigint)
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

CREATE OR REPLACE FUNCTION pgque.browse_events(queue_name text, consumer text DEFAULT NULL,
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
    v_admin boolean := pg_catalog.pg_has_role(COALESCE(NULLIF(pg_catalog.current_setting('role'), 'none'), session_user::text)::name,
                                'pgque_admin', 'USAGE');
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
        'SELECT e.ev_id, e.ev_txid::text::int8, e.ev_time, e.ev_type,
                CASE WHEN $7 THEN e.ev_data END, e.ev_extra1,
                e.ev_retry, s.sub_consumer, CASE WHEN $7 THEN e.ev_headers END
           FROM pgque.%I e
           LEFT JOIN pgque.subscription s ON s.sub_id OPERATOR(pg_catalog.=) e.ev_owner
          WHERE e.ev_txid OPERATOR(pg_catalog.>=) $1
            AND NOT pg_catalog.pg_visible_in_snapshot(e.ev_txid, $2)
            AND ($3::int8 IS NULL
                 OR (e.ev_txid::text::int8, e.ev_id) OPERATOR(pg_catalog.>) ($3::int8, COALESCE($4, -1)))
            AND ($5::int4 IS NULL OR e.ev_owner IS NULL OR e.ev_owner OPERATOR(pg_catalog.=) $5)
          ORDER BY e.ev_txid, e.ev_id
          LIMIT $6', 'event_' || v_q::text)
    USING v_from, v_snap, $3, $4, v_sub, v_lim, v_admin;
END
$browse_events$;

CREATE OR REPLACE FUNCTION pgque.browse_dead_letters(queue_name text, before_id bigint DEFAULT NULL,
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
    v_admin boolean := pg_catalog.pg_has_role(COALESCE(NULLIF(pg_catalog.current_setting('role'), 'none'), session_user::text)::name,
                                'pgque_admin', 'USAGE');
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
    SELECT d.dl_id, d.dl_consumer, d.dl_time, CASE WHEN v_admin THEN d.dl_reason END, d.ev_id,
           d.ev_time, d.ev_retry, d.ev_type, CASE WHEN v_admin THEN d.ev_data END, d.ev_extra1,
           CASE WHEN v_admin THEN d.ev_headers END
      FROM pgque.dead_letter_store d
     WHERE d.dl_queue OPERATOR(pg_catalog.=) v_q
       AND d.dl_id OPERATOR(pg_catalog.<) COALESCE($2, 9223372036854775807)
     ORDER BY d.dl_id DESC
     LIMIT v_lim;
END
$browse_dead_letters$;

-- ==== waiting inside the server (issue 43, src/waiters.rs, docs/waits.md) ====
-- receive and receive_with_headers with a required wait argument, and PgQ's
-- next_batch as next_batch_wait (a next_batch(text, text, interval) would
-- clash with the cooperative next_batch(text, text, text) for a literal).
CREATE OR REPLACE FUNCTION "receive"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"max_return" INT,
	"wait" interval
) RETURNS SETOF pgque.message
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'receive_wait_wrapper';
CREATE OR REPLACE FUNCTION "receive_with_headers"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"max_return" INT,
	"wait" interval
) RETURNS TABLE (msg_id bigint, batch_id bigint, type text, payload text, retry_count int4, created_at timestamptz, extra1 text, extra2 text, extra3 text, extra4 text, headers jsonb)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'receive_with_headers_wait_wrapper';
CREATE OR REPLACE FUNCTION "next_batch_wait"(
	"queue_name" TEXT,
	"consumer_name" TEXT,
	"wait" interval
) RETURNS bigint
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'next_batch_wait_wrapper';
REVOKE ALL ON FUNCTION pgque.receive(text, text, int4, interval),
    pgque.receive_with_headers(text, text, int4, interval),
    pgque.next_batch_wait(text, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.receive(text, text, int4, interval),
    pgque.receive_with_headers(text, text, int4, interval),
    pgque.next_batch_wait(text, text, interval) TO pgque_reader;
ALTER FUNCTION pgque.receive(text, text, int4, interval) SET enable_seqscan = off;
ALTER FUNCTION pgque.receive(text, text, int4, interval) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgque.receive(text, text, int4, interval) SET jit = off;
ALTER FUNCTION pgque.receive_with_headers(text, text, int4, interval) SET enable_seqscan = off;
ALTER FUNCTION pgque.receive_with_headers(text, text, int4, interval) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgque.receive_with_headers(text, text, int4, interval) SET jit = off;
ALTER FUNCTION pgque.next_batch_wait(text, text, interval) SET enable_seqscan = off;
ALTER FUNCTION pgque.next_batch_wait(text, text, interval) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgque.next_batch_wait(text, text, interval) SET jit = off;
-- dispatch_wait: dispatch that waits (src/jobs/dispatch_wait.rs).
CREATE OR REPLACE FUNCTION "dispatch_wait"(
	"queues" TEXT[],
	"limit" INT,
	"worker" TEXT,
	"wait" interval,
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
AS 'MODULE_PATHNAME', 'dispatch_wait_wrapper';
REVOKE ALL ON FUNCTION pgque.dispatch_wait(text[], int, text, interval, interval, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.dispatch_wait(text[], int, text, interval, interval, int) TO pgque_reader;
ALTER FUNCTION pgque.dispatch_wait(text[], int, text, interval, interval, int) SET jit = off;
-- ack_receive: ack and the next receive in one call (issue 43 item 3).
CREATE OR REPLACE FUNCTION "ack_receive"(
	"batch_id" bigint,
	"max_return" INT DEFAULT 100
) RETURNS SETOF pgque.message
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'ack_receive_wrapper';
REVOKE ALL ON FUNCTION pgque.ack_receive(bigint, int4) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.ack_receive(bigint, int4) TO pgque_reader;
ALTER FUNCTION pgque.ack_receive(bigint, int4) SET enable_seqscan = off;
ALTER FUNCTION pgque.ack_receive(bigint, int4) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgque.ack_receive(bigint, int4) SET jit = off;
-- receive_partitioned with a wait (src/api/slots.rs).
CREATE OR REPLACE FUNCTION "receive_partitioned"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"slot" INT,
	"n" INT,
	"worker" TEXT,
	"max_return" INT,
	"wait" interval
) RETURNS SETOF pgque.message
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'receive_partitioned_wait_wrapper';
REVOKE ALL ON FUNCTION pgque.receive_partitioned(text, text, int4, int4, text, int4, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.receive_partitioned(text, text, int4, int4, text, int4, interval) TO pgque_reader;
ALTER FUNCTION pgque.receive_partitioned(text, text, int4, int4, text, int4, interval) SET enable_seqscan = off;
ALTER FUNCTION pgque.receive_partitioned(text, text, int4, int4, text, int4, interval) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgque.receive_partitioned(text, text, int4, int4, text, int4, interval) SET jit = off;
