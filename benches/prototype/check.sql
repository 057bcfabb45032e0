-- Single-session checks of the job-log prototype's semantics (psql -f; every
-- check raises on failure, so ON_ERROR_STOP makes the run fail). Loads a fresh
-- jl schema first. The concurrent checks (no job claimed twice, lane FIFO under
-- 2 producers + 2 dispatchers, rotation under load) are in e2e.py --check.
\set ON_ERROR_STOP 1
\set QUIET 1
\i benches/prototype/job_log.sql
SET client_min_messages = warning;

CREATE FUNCTION pg_temp.ok(c boolean, what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF c IS NOT TRUE THEN RAISE EXCEPTION 'CHECK FAILED: %', what; END IF;
    RAISE NOTICE 'ok: %', what;
END $$;
SET client_min_messages = notice;

-- 1. FIFO, ids in input order, fencing -------------------------------------------------------
SELECT jl.create_queue('c1');
CREATE TEMP TABLE e1 AS SELECT * FROM jl.enqueue('c1', array_fill('k'::text, ARRAY[5]),
                                               ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 5) g));
SELECT pg_temp.ok((SELECT bool_and(job_id > 0) AND array_agg(job_id ORDER BY ord) = array_agg(job_id ORDER BY job_id) FROM e1),
                  'ids in input order');
CREATE TEMP TABLE d1 AS SELECT * FROM jl.dispatch(ARRAY['c1'], 3, 'w1');
SELECT pg_temp.ok((SELECT array_agg((args->>'n')::int) FROM d1) = ARRAY[1, 2, 3], 'dispatch in FIFO order');
SELECT pg_temp.ok((SELECT count(DISTINCT lease_token) = 1 FROM d1), 'one claim (token) for the batch');
SELECT pg_temp.ok(jl.complete_many(ARRAY(SELECT job_id FROM d1 ORDER BY job_id LIMIT 2),
                                   ARRAY(SELECT lease_token FROM d1 ORDER BY job_id LIMIT 2)) = 2, 'complete_many 2');
SELECT pg_temp.ok(NOT jl.complete((SELECT min(job_id) FROM d1), (SELECT min(lease_token) FROM d1)), 'second complete refused');
SELECT pg_temp.ok(NOT jl.complete((SELECT max(job_id) FROM d1), 424242), 'stale token refused');
SELECT pg_temp.ok(jl.job_state((SELECT max(job_id) FROM d1)) = 'running', 'third job still running');
SELECT pg_temp.ok((SELECT ready = 2 AND running = 1 AND completed = 2 FROM jl.queue_status WHERE queue_name = 'c1'), 'status counts');

-- 2. fail -> scheduled -> promoted -> retried keeps its place, attempt 2; terminal failure ---------
SELECT pg_temp.ok(jl.fail((SELECT max(job_id) FROM d1), (SELECT max(lease_token) FROM d1), 'boom', now()) = 'ready', 'fail -> ready');
SELECT pg_temp.ok(NOT jl.complete((SELECT max(job_id) FROM d1), (SELECT max(lease_token) FROM d1)), 'complete after fail refused');
CREATE TEMP TABLE d2 AS SELECT * FROM jl.dispatch(ARRAY['c1'], 10, 'w1');
SELECT pg_temp.ok((SELECT array_agg((args->>'n')::int ORDER BY (args->>'n')::int) FROM d2) = ARRAY[3, 4, 5]
                  AND (SELECT (args->>'n')::int FROM d2 LIMIT 1) = 3, 'retried job first (kept its place)');
SELECT pg_temp.ok((SELECT attempt FROM d2 WHERE (args->>'n')::int = 3) = 2, 'attempt counted');
UPDATE jl.side SET max_attempts = 2 WHERE job_id = (SELECT job_id FROM d2 WHERE (args->>'n')::int = 3);
SELECT pg_temp.ok(jl.fail((SELECT job_id FROM d2 WHERE (args->>'n')::int = 3), (SELECT lease_token FROM d2 WHERE (args->>'n')::int = 3), 'boom again') = 'failed', 'terminal failed at max_attempts');
SELECT pg_temp.ok(jl.retry_job((SELECT job_id FROM d2 WHERE (args->>'n')::int = 3)), 'retry_job');
SELECT pg_temp.ok(jl.job_state((SELECT job_id FROM d2 WHERE (args->>'n')::int = 3)) = 'ready', 'retried job ready');
SELECT pg_temp.ok(jl.complete_many(ARRAY(SELECT job_id FROM d2 WHERE (args->>'n')::int > 3), ARRAY(SELECT lease_token FROM d2 WHERE (args->>'n')::int > 3)) = 2, 'complete the rest');

-- 3. capacity: parked jobs, per-actor FIFO, never over capacity ----------------------------------
SELECT jl.create_queue('c3');
SELECT jl.set_actor_capacity('a', 2);
CREATE TEMP TABLE e3 AS SELECT * FROM jl.enqueue('c3', array_fill('k'::text, ARRAY[6]),
    ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 6) g), p_actors => ARRAY['a', 'a', 'a', 'b', 'a', 'b']);
CREATE TEMP TABLE d3 AS SELECT * FROM jl.dispatch(ARRAY['c3'], 10, 'w1');
SELECT pg_temp.ok((SELECT array_agg((args->>'n')::int ORDER BY (args->>'n')::int) FROM d3) = ARRAY[1, 2, 4, 6], 'capacity 2: a1 a2 b4 b6 taken');
SELECT pg_temp.ok((SELECT running = 2 AND parked = 2 FROM jl.actor_cap WHERE actor = 'a'), 'a: 2 running, 2 parked');
SELECT pg_temp.ok((SELECT count(*) FROM jl.dispatch(ARRAY['c3'], 10, 'w1')) = 0, 'nothing more while a is full');
SELECT pg_temp.ok(jl.complete((SELECT job_id FROM d3 WHERE (args->>'n')::int = 1), (SELECT lease_token FROM d3 WHERE (args->>'n')::int = 1)), 'complete a1');
CREATE TEMP TABLE d3b AS SELECT * FROM jl.dispatch(ARRAY['c3'], 10, 'w1');
SELECT pg_temp.ok((SELECT array_agg((args->>'n')::int) FROM d3b) = ARRAY[3], 'a3 (the earliest parked) next, not a5');
SELECT pg_temp.ok((SELECT running FROM jl.actor_cap WHERE actor = 'a') = 2, 'a: 2 running again');
SELECT jl.enqueue('c3', ARRAY['k'], ARRAY['{"n": 7}'::jsonb], p_actors => ARRAY['a']);
SELECT pg_temp.ok(jl.complete((SELECT job_id FROM d3 WHERE (args->>'n')::int = 2), (SELECT lease_token FROM d3 WHERE (args->>'n')::int = 2)), 'complete a2');
CREATE TEMP TABLE d3c AS SELECT * FROM jl.dispatch(ARRAY['c3'], 10, 'w1');
SELECT pg_temp.ok((SELECT array_agg((args->>'n')::int) FROM d3c) = ARRAY[5], 'a5 before the later a7 (per-actor FIFO)');

-- 4. identity single flight ------------------------------------------------------------------------
SELECT jl.create_queue('c4');
SELECT jl.enqueue('c4', array_fill('k'::text, ARRAY[3]), ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 3) g),
                  p_identity_keys => ARRAY['x', 'x', 'y']);
CREATE TEMP TABLE d4 AS SELECT * FROM jl.dispatch(ARRAY['c4'], 10, 'w1');
SELECT pg_temp.ok((SELECT array_agg((args->>'n')::int ORDER BY (args->>'n')::int) FROM d4) = ARRAY[1, 3], 'one job per identity');
SELECT pg_temp.ok(jl.complete((SELECT job_id FROM d4 WHERE (args->>'n')::int = 1), (SELECT lease_token FROM d4 WHERE (args->>'n')::int = 1)), 'complete x1');
SELECT pg_temp.ok((SELECT array_agg((args->>'n')::int) FROM jl.dispatch(ARRAY['c4'], 10, 'w1')) = ARRAY[2], 'x2 after x1 finished');

-- 5. cancel: a ready job is skipped, a running job's complete is refused -----------------------
SELECT jl.create_queue('c5');
CREATE TEMP TABLE e5 AS SELECT * FROM jl.enqueue('c5', array_fill('k'::text, ARRAY[4]), ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 4) g));
SELECT pg_temp.ok(jl.cancel((SELECT job_id FROM e5 WHERE ord = 2)), 'cancel a ready job');
CREATE TEMP TABLE d5 AS SELECT * FROM jl.dispatch(ARRAY['c5'], 2, 'w1');
SELECT pg_temp.ok((SELECT array_agg((args->>'n')::int) FROM d5) = ARRAY[1, 3], 'the cancelled job is skipped');
SELECT pg_temp.ok(jl.cancel((SELECT job_id FROM d5 WHERE (args->>'n')::int = 3)), 'cancel a running job');
SELECT pg_temp.ok(NOT jl.complete((SELECT job_id FROM d5 WHERE (args->>'n')::int = 3), (SELECT lease_token FROM d5 LIMIT 1)), 'its complete is refused');
SELECT pg_temp.ok(jl.complete((SELECT job_id FROM d5 WHERE (args->>'n')::int = 1), (SELECT lease_token FROM d5 LIMIT 1)), 'its batch sibling completes');
SELECT pg_temp.ok(jl.job_state((SELECT job_id FROM e5 WHERE ord = 2)) = 'cancelled' AND jl.job_state((SELECT job_id FROM e5 WHERE ord = 3)) = 'cancelled', 'job_state cancelled');

-- 6. unique keys while not terminal ---------------------------------------------------------------
SELECT jl.create_queue('c6');
CREATE TEMP TABLE e6 AS SELECT * FROM jl.enqueue('c6', ARRAY['k', 'k', 'k'], ARRAY['{}'::jsonb, '{}', '{}'], p_unique_keys => ARRAY['u1', 'u1', 'u2']);
SELECT pg_temp.ok((SELECT array_agg(state ORDER BY ord) FROM e6) = ARRAY['ready', 'duplicate', 'ready']
                  AND (SELECT job_id FROM e6 WHERE ord = 2) = (SELECT job_id FROM e6 WHERE ord = 1), 'duplicate reports the holder');
CREATE TEMP TABLE d6 AS SELECT * FROM jl.dispatch(ARRAY['c6'], 10, 'w1');
SELECT pg_temp.ok(jl.complete_many(ARRAY(SELECT job_id FROM d6), ARRAY(SELECT lease_token FROM d6)) = 2, 'complete keyed jobs');
SELECT pg_temp.ok((SELECT state FROM jl.enqueue('c6', ARRAY['k'], ARRAY['{}'::jsonb], p_unique_keys => ARRAY['u1'])) = 'ready', 'key free after completion');

-- 7. scheduled at enqueue, promotion appends to the lane ------------------------------------------
SELECT jl.create_queue('c7');
CREATE TEMP TABLE e7 AS SELECT * FROM jl.enqueue('c7', ARRAY['k', 'k'], ARRAY['{"n": 1}'::jsonb, '{"n": 2}'], p_run_at => ARRAY[now() + interval '1 hour', NULL]);
SELECT pg_temp.ok((SELECT array_agg(state ORDER BY ord) FROM e7) = ARRAY['scheduled', 'ready'], 'scheduled + ready');
UPDATE jl.side SET run_at = now() - interval '1 second' WHERE job_id = (SELECT job_id FROM e7 WHERE ord = 1);
SELECT pg_temp.ok(jl.promote() = 1, 'promoted');
SELECT pg_temp.ok((SELECT array_agg((args->>'n')::int) FROM jl.dispatch(ARRAY['c7'], 10, 'w1')) = ARRAY[2, 1], 'promoted job after the lane''s earlier one');

-- 8. rescue: expired lease -> ready with the attempt counted, stale token refused ------------------
SELECT jl.create_queue('c8', 'strict_fifo', 2, '1 second');
SELECT jl.enqueue('c8', ARRAY['k', 'k'], ARRAY['{"n": 1}'::jsonb, '{"n": 2}']);
CREATE TEMP TABLE d8 AS SELECT * FROM jl.dispatch(ARRAY['c8'], 10, 'w1');
SELECT pg_temp.ok(jl.complete((SELECT job_id FROM d8 WHERE (args->>'n')::int = 2), (SELECT lease_token FROM d8 LIMIT 1)), 'complete one of two');
UPDATE jl.claim SET lease_until = now() - interval '1 second' WHERE claim_id = (SELECT lease_token FROM d8 LIMIT 1);
SELECT pg_temp.ok(jl.rescue() = 1, 'rescued the unfinished job only');
SELECT pg_temp.ok(NOT jl.complete((SELECT job_id FROM d8 WHERE (args->>'n')::int = 1), (SELECT lease_token FROM d8 LIMIT 1)), 'stale token refused after rescue');
CREATE TEMP TABLE d8b AS SELECT * FROM jl.dispatch(ARRAY['c8'], 10, 'w1');
SELECT pg_temp.ok((SELECT attempt FROM d8b) = 2, 'redispatched, attempt 2');
UPDATE jl.side SET lease_until = now() - interval '1 second' WHERE job_id = (SELECT job_id FROM d8b);
SELECT pg_temp.ok(jl.rescue() = 1, 'rescued again');
SELECT pg_temp.ok(jl.job_state((SELECT job_id FROM d8b)) = 'failed', 'failed after max_attempts (2)');

-- 9. rotation: running jobs are evacuated, completions still fenced; truncation --------------------
SELECT jl.create_queue('c9');
CREATE TEMP TABLE e9 AS SELECT * FROM jl.enqueue('c9', array_fill('k'::text, ARRAY[3]), ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 3) g));
CREATE TEMP TABLE d9 AS SELECT * FROM jl.dispatch(ARRAY['c9'], 2, 'w1');
UPDATE jl.meta SET retention = '0';
SELECT pg_temp.ok(jl.rotate(true) LIKE 'switched%', 'switch segment');
SELECT pg_temp.ok(jl.rotate() LIKE '%not dispatched%', 'segment with a ready job is not truncated');
-- every lane still holding ready jobs in the old segment is drained first
SELECT count(*) FROM (SELECT jl.complete_many(ARRAY_AGG(d.job_id), ARRAY_AGG(d.lease_token))
                      FROM jl.dispatch(ARRAY(SELECT queue_name FROM jl.queue), 100, 'drain') d) x;
SELECT pg_temp.ok(jl.rotate() LIKE 'truncated%', 'truncated with running jobs evacuated');
SELECT pg_temp.ok((SELECT count(*) FROM jl.side WHERE state = 'running' AND job_id IN (SELECT job_id FROM d9)) = 2, 'running jobs copied to the side store');
SELECT pg_temp.ok(jl.complete_many(ARRAY(SELECT job_id FROM d9), ARRAY(SELECT lease_token FROM d9)) = 2, 'evacuated jobs complete with their token');
SELECT pg_temp.ok(NOT jl.complete((SELECT min(job_id) FROM d9), (SELECT min(lease_token) FROM d9)), 'and only once');
CREATE TEMP TABLE e9b AS SELECT * FROM jl.enqueue('c9', ARRAY['k'], ARRAY['{"n": 4}'::jsonb]);
SELECT pg_temp.ok((SELECT array_agg((args->>'n')::int) FROM jl.dispatch(ARRAY['c9'], 5, 'w1')) = ARRAY[4], 'lane continues after truncation (floors)');
SELECT pg_temp.ok((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jl.log_0'::regclass) = 0, 'no dead tuples in the log');
