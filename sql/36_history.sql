-- pgque history: a minute-by-minute rollup of each queue's throughput,
-- depth and lag, written by the worker's `history` duty
-- (pgque.maint_history) and read by pgque-web's charts
-- (pgque.read_history), so a restarted or second dashboard shows the last
-- hours at once.
--
-- Append-only and rotated like pgque's other metadata: no row is ever
-- updated or deleted, so the table leaves no dead tuples and needs no
-- vacuum. Rows go to one of three pieces (partitions of seg 0..2), the
-- current one being the piece that holds the newest row. Once the current
-- piece spans half the retention (pgque.history_retention, 24 hours by
-- default) and the next piece's rows are all older than the retention, the
-- next piece is TRUNCATEd and becomes current. So a row is kept at least
-- the retention and leaves within 1.5 times it; read_history filters by
-- the range it is asked for.
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

-- The history of the last `since` (1 minute .. 31 days), by queue then
-- minute, across the three pieces: one index range of each piece for the
-- minutes asked for, whatever else is kept.
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

REVOKE ALL ON TABLE pgque.metric_history, pgque.metric_history_0, pgque.metric_history_1,
    pgque.metric_history_2 FROM PUBLIC;
REVOKE ALL ON FUNCTION pgque.maint_history(interval, timestamptz), pgque.read_history(interval)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.maint_history(interval, timestamptz) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.read_history(interval) TO pgque_reader, pgque_admin;
