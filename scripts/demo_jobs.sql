-- The job-queue part of `make run`: 10,000 jobs through the job log
-- (enqueue batches of 100, dispatch 100, complete_many), then its footprint.
\o /dev/null
SELECT pgque.drop_job_queue('demo_jobs', true) FROM pgque.job_queues WHERE queue_name = 'demo_jobs';
\o
SELECT pgque.create_job_queue('demo_jobs') AS job_queue_created;
\echo 'Enqueuing 10,000 jobs (100 calls of enqueue_ready_rows with 100 jobs each) ...'
SELECT clock_timestamp() AS t2 \gset
\o /dev/null
SELECT format($f$SELECT count(*) FROM pgque.enqueue_ready_rows('demo_jobs',
         array_fill('demo.job'::text, ARRAY[100]),
         (SELECT array_agg(jsonb_build_object('n', g, 'call', %s)) FROM generate_series(1, 100) g))$f$, r)
  FROM generate_series(1, 100) r \gexec
\o
SELECT round(10000 / extract(epoch FROM clock_timestamp() - :'t2'::timestamptz)) AS "enqueued per second";
\echo 'Dispatching and completing them, 100 at a time:'
SELECT clock_timestamp() AS t3 \gset
DO $$
DECLARE ids bigint[]; toks bigint[];
BEGIN
  LOOP
    SELECT array_agg(job_id), array_agg(lease_token) INTO ids, toks
      FROM pgque.dispatch(ARRAY['demo_jobs'], 100, 'demo-worker');
    EXIT WHEN ids IS NULL;
    PERFORM pgque.complete_many(ids, toks);
    COMMIT;
  END LOOP;
END $$;
SELECT round(10000 / extract(epoch FROM clock_timestamp() - :'t3'::timestamptz)) AS "dispatched and completed per second";
SELECT ready, running, completed FROM pgque.job_queue_status WHERE queue_name = 'demo_jobs';
\echo 'One of them, looked up by id (pgque.get_job reads it by key, wherever it is stored):'
SELECT id, kind, args, state, attempt, worker, stored_in
  FROM pgque.get_job((SELECT max(id_hi) FROM pgque.job_log l JOIN pgque.job_lanes n USING (lane_id)
                       WHERE n.queue = 'demo_jobs'));
\echo 'Rows the job log wrote for them (one per enqueue call, dispatch and completion), and dead tuples:'
SELECT (SELECT count(*) FROM pgque.job_log l JOIN pgque.job_lanes n USING (lane_id) WHERE n.queue = 'demo_jobs') AS batch_rows,
       (SELECT count(*) FROM pgque.job_claims c JOIN pgque.job_lanes n USING (lane_id) WHERE n.queue = 'demo_jobs') AS claim_rows,
       (SELECT count(*) FROM pgque.jobs WHERE queue = 'demo_jobs') AS per_job_rows,
       (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
         WHERE schemaname = 'pgque' AND (relname LIKE 'job\_log%' OR relname LIKE 'job\_claims%' OR relname LIKE 'job\_done%')) AS dead_tuples;
\echo 'A schedule: one job every second (cron with seconds), fired by the worker; three seconds later:'
\o /dev/null
SELECT pgque.drop_schedule('demo_every_second') FROM pgque.schedules WHERE name = 'demo_every_second';
\o
SELECT pgque.create_schedule('demo_every_second', '* * * * * *', 'demo_jobs', 'demo.tick',
                             '{"from": "make run"}', misfire => 'catch_up') AS schedule_id;
\o /dev/null
SELECT pg_sleep(3.2);
\o
SELECT name, cron, next_run_at, last_run_at, last_job_id FROM pgque.schedules WHERE name = 'demo_every_second';
SELECT id, kind, args->>'scheduled_for' AS scheduled_for, state
  FROM pgque.all_jobs WHERE kind = 'demo.tick' ORDER BY id;
\o /dev/null
SELECT pgque.drop_schedule('demo_every_second');
\o
\echo 'A small flow: fetch, then two renders side by side, then a mail once both are done:'
\o /dev/null
SELECT pgque.drop_job_queue('demo_flow', true) FROM pgque.job_queues WHERE queue_name = 'demo_flow';
SELECT pgque.create_job_queue('demo_flow');
\o
CREATE TEMP TABLE demo_flow AS
SELECT flow_id, key, job_id FROM pgque.enqueue_flow('demo_flow', '[
  {"key": "fetch", "kind": "fetch", "args": {"day": "today"}},
  {"key": "left", "kind": "render", "depends_on": ["fetch"]},
  {"key": "right", "kind": "render", "depends_on": ["fetch"]},
  {"key": "mail", "kind": "mail", "depends_on": ["left", "right"]}]');
TABLE demo_flow;
SELECT max(flow_id) AS demo_flow_id, max(job_id) FILTER (WHERE key = 'mail') AS demo_job_id
  FROM demo_flow \gset
SELECT waiting, ready FROM pgque.job_queue_status WHERE queue_name = 'demo_flow';
\echo 'A worker runs what is ready, level by level, each job completing with an output;'
\echo 'each completion makes the children whose parents are all done ready in its transaction:'
DO $$
DECLARE r record; level int := 0; n int;
BEGIN
  LOOP
    level := level + 1;
    n := 0;
    FOR r IN SELECT job_id, lease_token, kind FROM pgque.dispatch(ARRAY['demo_flow'], 10, 'demo-worker') LOOP
      PERFORM pgque.set_progress(r.job_id, r.lease_token, '{"done": 1, "of": 1}');
      PERFORM pgque.complete(r.job_id, r.lease_token, jsonb_build_object('level', level, 'kind', r.kind));
      n := n + 1;
    END LOOP;
    EXIT WHEN n = 0;
    RAISE NOTICE 'level %: ran %', level, n;
    COMMIT;
  END LOOP;
END $$;
\echo 'The last job (mail) reads its parents and their outputs; the flow is complete:'
SELECT key, state, output FROM pgque.job_parents(:demo_job_id);
SELECT total, completed, waiting FROM pgque.flow_status(:demo_flow_id);
