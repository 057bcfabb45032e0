-- Blocks of pgque.jobs (heap and indexes) read per dispatch of 50 job-log
-- jobs, with 100,000 waiting jobs in the same queue and with none (issue 19;
-- companion of flows_bench.sh: a count of blocks, which the machine's load
-- does not change, where the client-side p50 of a 1-2 ms call is noisy).
-- Each dispatch runs in a subtransaction that is rolled back, so the 10,000
-- ready jobs stay. The states alternate three times (waiting jobs added by
-- enqueue_flow, removed by DELETE + VACUUM ANALYZE).
-- Run: psql -At -f benches/flows/dispatch_blocks.sql on a scratch database
-- with pgque (the worker stopped: SELECT pgque.stop()).
\set QUIET on
SELECT pgque.create_job_queue('lq');
DO $$ BEGIN FOR r IN 1..10 LOOP PERFORM count(*) FROM pgque.enqueue_ready_rows('lq', array_fill('k'::text, ARRAY[1000]), (SELECT array_agg(jsonb_build_object('n', g)) FROM generate_series(1, 1000) g)); END LOOP; END $$;
CREATE FUNCTION pg_temp.t(n int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz; total interval := '0'; k int;
BEGIN
  FOR i IN 1..n LOOP
    t0 := clock_timestamp();
    BEGIN
      SELECT count(*) INTO k FROM pgque.dispatch(ARRAY['lq'], 50, 'w');
      IF k <> 50 THEN RAISE EXCEPTION 'got %', k; END IF;
      RAISE EXCEPTION 'undo';
    EXCEPTION WHEN raise_exception THEN
      IF SQLERRM <> 'undo' THEN RAISE; END IF;
    END;
    total := total + (clock_timestamp() - t0);
  END LOOP;
  RETURN round((extract(epoch FROM total) * 1000 / n)::numeric, 3) || ' ms, jobs blocks/dispatch ' ||
    round((SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid)) FROM pg_class c
           WHERE c.oid = 'pgque.jobs'::regclass OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'pgque.jobs'::regclass))::numeric / n, 2)
    || ', all pgque blocks/dispatch ' ||
    round((SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid)) FROM pg_class c WHERE c.relnamespace = 'pgque'::regnamespace)::numeric / n, 2);
END $$;
SELECT 'none' AS state, pg_temp.t(2000) AS ms_per_dispatch;
DO $$ BEGIN FOR r IN 1..10 LOOP PERFORM count(*) FROM pgque.enqueue_flow('lq', jsonb_build_array(jsonb_build_object('key', 'r', 'kind', 'later', 'run_at', (now() + interval '1 day')::text))
  || (SELECT jsonb_agg(jsonb_build_object('key', 'c' || g, 'kind', 'waits', 'depends_on', jsonb_build_array('r'))) FROM generate_series(1, 10000) g)); END LOOP; END $$;
ANALYZE pgque.jobs;
SELECT 'waiting' AS state, pg_temp.t(2000) AS ms_per_dispatch, (SELECT waiting FROM pgque.job_queue_status WHERE queue_name = 'lq');
DELETE FROM pgque.job_deps; DELETE FROM pgque.jobs WHERE queue = 'lq' AND state IN ('waiting', 'scheduled');
VACUUM ANALYZE pgque.jobs;
SELECT 'none' AS state, pg_temp.t(2000) AS ms_per_dispatch;
DO $$ BEGIN FOR r IN 1..10 LOOP PERFORM count(*) FROM pgque.enqueue_flow('lq', jsonb_build_array(jsonb_build_object('key', 'r', 'kind', 'later', 'run_at', (now() + interval '1 day')::text))
  || (SELECT jsonb_agg(jsonb_build_object('key', 'c' || g, 'kind', 'waits', 'depends_on', jsonb_build_array('r'))) FROM generate_series(1, 10000) g)); END LOOP; END $$;
VACUUM ANALYZE pgque.jobs;
SELECT 'waiting' AS state, pg_temp.t(2000) AS ms_per_dispatch;
DELETE FROM pgque.job_deps; DELETE FROM pgque.jobs WHERE queue = 'lq' AND state IN ('waiting', 'scheduled');
VACUUM ANALYZE pgque.jobs;
SELECT 'none' AS state, pg_temp.t(2000) AS ms_per_dispatch;
DO $$ BEGIN FOR r IN 1..10 LOOP PERFORM count(*) FROM pgque.enqueue_flow('lq', jsonb_build_array(jsonb_build_object('key', 'r', 'kind', 'later', 'run_at', (now() + interval '1 day')::text))
  || (SELECT jsonb_agg(jsonb_build_object('key', 'c' || g, 'kind', 'waits', 'depends_on', jsonb_build_array('r'))) FROM generate_series(1, 10000) g)); END LOOP; END $$;
VACUUM ANALYZE pgque.jobs;
SELECT 'waiting' AS state, pg_temp.t(2000) AS ms_per_dispatch;
