-- Job queues through psql: the API surface, its results and its errors.
SELECT pgque.create_job_queue('mail');
SELECT pgque.create_job_queue('fair', 'round_robin');
SELECT queue_name, mode, shards, max_attempts, lease, paused FROM pgque.job_queues ORDER BY 1;
-- a batch: ids in input order, one scheduled, one duplicate inside the batch
SELECT * FROM pgque.enqueue_ready_rows('mail',
    ARRAY['welcome', 'welcome', 'digest', 'welcome'],
    ARRAY['{"to": 1}', '{"to": 2}', '{"week": 47}', '{"to": 1}']::jsonb[],
    priorities => ARRAY[0, 0, 5, 0]::smallint[],
    run_at => ARRAY[NULL, NULL, '2999-01-01 00:00:00+00', NULL]::timestamptz[],
    unique_keys => ARRAY['welcome:1', 'welcome:2', NULL, 'welcome:1']);
SELECT pgque.enqueue('mail', 'welcome', '{"to": 3}', unique_key => 'welcome:3');
SELECT pgque.enqueue('mail', 'welcome', '{"to": 3}', unique_key => 'welcome:3');  -- duplicate: same id
SELECT queue_name, scheduled, ready, running, completed, failed, cancelled, lanes
  FROM pgque.job_queue_status ORDER BY 1;
-- dispatch: FIFO by priority then readiness; leases fence the outcome calls
SELECT job_id, queue, kind, args, attempt, lease_token FROM pgque.dispatch(ARRAY['mail'], 2, 'w1');
SELECT pgque.complete(1, 1) AS completed, pgque.complete(1, 1) AS again, pgque.complete(2, 99) AS stale;
SELECT pgque.fail(2, 2, 'smtp timeout', '2999-01-01 00:00:00+00') AS new_state;
SELECT id, state, attempt, errors->0->>'error' AS error FROM pgque.jobs ORDER BY id;
-- one job_events row per statement and transition; job_history has a row per job
SELECT job_id, job_ids, event, attempt, detail FROM pgque.job_events ORDER BY id;
SELECT job_id, event, attempt, detail FROM pgque.job_history ORDER BY event_id, job_id;
-- errors: each with its SQLSTATE, nothing changed
\set VERBOSITY sqlstate
SELECT * FROM pgque.enqueue_ready_rows('nope', ARRAY['k'], ARRAY['{}']::jsonb[]);
SELECT * FROM pgque.enqueue_ready_rows('mail', ARRAY['k', 'k'], ARRAY['{}']::jsonb[]);
SELECT * FROM pgque.enqueue_ready_rows('mail', ARRAY['k', NULL], ARRAY['{}', '{}']::jsonb[]);
SELECT * FROM pgque.enqueue_ready_rows('mail', ARRAY['k'], ARRAY['{}']::jsonb[], priorities => ARRAY[5000]::smallint[]);
SELECT * FROM pgque.enqueue_ready_rows('mail', ARRAY['k'], ARRAY['{}']::jsonb[], on_duplicate => 'merge');
SELECT * FROM pgque.enqueue_ready_rows('mail', ARRAY['k'], ARRAY['{}']::jsonb[], unique_keys => ARRAY['welcome:3'], on_duplicate => 'error');
SELECT pgque.enqueue('mail', 'k', 'not json');
SELECT * FROM pgque.dispatch(ARRAY['nope'], 1, 'w');
SELECT * FROM pgque.dispatch(ARRAY['mail'], 0, 'w');
SELECT pgque.cancel(12345);
SELECT pgque.retry_job(3);
SELECT pgque.drop_job_queue('mail');
SELECT pgque.create_job_queue(E'bad\nname');
\set VERBOSITY default
SELECT count(*) AS jobs FROM pgque.jobs;
-- cancel and retry
SELECT pgque.cancel(3) AS cancelled;
SELECT pgque.retry_job(3) AS retried;
SELECT id, state, attempt FROM pgque.jobs WHERE id = 3;
-- roles: a writer enqueues but does not dispatch or administer
SET ROLE pgque_writer;
SELECT pgque.enqueue('fair', 'k', fairness_key => 'a') IS NOT NULL AS enqueued;
\set VERBOSITY sqlstate
SELECT * FROM pgque.dispatch(ARRAY['fair'], 1, 'w');
SELECT pgque.pause_job_queue('fair');
\set VERBOSITY default
RESET ROLE;
SELECT pgque.drop_job_queue('mail', force => true) AS dropped;
SELECT queue_name FROM pgque.job_queues ORDER BY 1;
