-- pgque history: a minute-by-minute rollup of each queue's throughput,
-- depth and lag, written by the worker's `history` duty
-- (pgque.maint_history) and read by pgque-web's charts
-- (pgque.read_history), so a restarted or second dashboard shows the last
-- hours at once.
--
-- Bounded: one row per queue and minute, kept `keep` (24 hours by default),
-- trimmed by the duty that writes it (the rows of minutes past that go in
-- the same transaction, through the bucket index). Append-only otherwise:
-- a minute already written is not written again.
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
    PRIMARY KEY (bucket, kind, queue)
);
-- A queue's previous row (per_second).
CREATE INDEX metric_history_queue_idx ON pgque.metric_history (kind, queue, bucket);

-- The history duty: writes this minute's row of every event and job queue
-- (from pgque.metrics() and the event sequences) unless this minute is
-- written already, and removes rows older than `keep` (1 minute .. 31
-- days). Returns the rows written. 22023 for `keep` out of range.
CREATE FUNCTION pgque.maint_history(keep interval DEFAULT '24 hours') RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
AS $maint_history$
DECLARE
    v_now timestamptz := pg_catalog.date_trunc('minute', pg_catalog.now());
    v_n bigint;
BEGIN
    IF $1 IS NULL OR $1 OPERATOR(pg_catalog.<) interval '1 minute'
       OR $1 OPERATOR(pg_catalog.>) interval '31 days' THEN
        RAISE EXCEPTION 'keep % is outside 1 minute .. 31 days', $1 USING ERRCODE = '22023';
    END IF;
    DELETE FROM pgque.metric_history h
     WHERE h.bucket OPERATOR(pg_catalog.<) (v_now OPERATOR(pg_catalog.-) $1);
    IF EXISTS (SELECT 1 FROM pgque.metric_history h
                WHERE h.bucket OPERATOR(pg_catalog.>=) v_now) THEN
        RETURN 0;
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
    INSERT INTO pgque.metric_history (bucket, kind, queue, total, per_second, depth, lag_seconds)
    SELECT v_now, c.kind, c.queue, c.total,
           CASE WHEN p.bucket IS NOT NULL THEN
               pg_catalog.float8larger(0, (c.total OPERATOR(pg_catalog.-) p.total)::float8)
               OPERATOR(pg_catalog./)
               pg_catalog.date_part('epoch', v_now OPERATOR(pg_catalog.-) p.bucket) END,
           c.depth, c.lag
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

REVOKE ALL ON TABLE pgque.metric_history FROM PUBLIC;
REVOKE ALL ON FUNCTION pgque.maint_history(interval), pgque.read_history(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.maint_history(interval) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.read_history(interval) TO pgque_reader, pgque_admin;
