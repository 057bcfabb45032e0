-- Event queues: the PgQue-compatible API surface (names, arguments, results)
-- and a deterministic produce / consume session (the queue's ticker is
-- paused, so only force_tick ticks it).
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments, pg_get_function_result(p.oid) AS result,
       p.prosecdef AS security_definer
  FROM pg_proc p
 WHERE p.pronamespace = 'pgque'::regnamespace
   AND p.proname IN ('send', 'send_batch', 'insert_event', 'subscribe', 'unsubscribe', 'receive', 'ack',
                     'nack', 'register_consumer', 'register_consumer_at', 'unregister_consumer',
                     'next_batch', 'next_batch_info', 'next_batch_custom', 'get_batch_events',
                     'get_batch_cursor', 'finish_batch', 'event_retry', 'batch_retry',
                     'register_subconsumer', 'subscribe_subconsumer', 'unregister_subconsumer',
                     'receive_coop', 'touch_subconsumer', 'dlq_inspect', 'dlq_replay',
                     'dlq_replay_all', 'dlq_purge', 'create_queue', 'drop_queue', 'set_queue_config',
                     'ticker', 'force_next_tick', 'force_tick', 'maint', 'maint_retry_events',
                     'maint_operations', 'get_queue_info', 'get_consumer_info', 'get_batch_info')
 ORDER BY 1, 2;

SELECT pgque.create_queue('rq');
SELECT pgque.set_queue_config('rq', 'ticker_paused', 'true');
SELECT pgque.subscribe('rq', 'reader');
SELECT pgque.send('rq', '{"hello": "world"}'::jsonb) > 0 AS sent;
SELECT pgque.send('rq', 'greeting', 'plain text') > 0 AS sent;
-- Not visible before a tick.
SELECT count(*) FROM pgque.receive('rq', 'reader');
SELECT pgque.force_tick('rq') > 0 AS ticked;
SELECT type, payload, retry_count, extra1 FROM pgque.receive('rq', 'reader');
SELECT pgque.ack(batch_id) FROM (SELECT DISTINCT batch_id FROM pgque.receive('rq', 'reader')) b;
SELECT pgque.force_tick('rq') > 0 AS ticked;
SELECT count(*) FROM pgque.receive('rq', 'reader');
SELECT queue_name, queue_ntables, queue_ticker_paused, queue_ticker_max_count, queue_ticker_max_lag,
       queue_ticker_idle_period, queue_rotation_period, ev_new
  FROM pgque.get_queue_info('rq');
SELECT queue_name, consumer_name, current_batch, pending_events FROM pgque.get_consumer_info('rq');
-- Errors carry their SQLSTATE.
\set VERBOSITY sqlstate
SELECT pgque.send('nope', 'x'::text);
SELECT pgque.subscribe('rq', 'bad#name');
SELECT * FROM pgque.get_batch_events(-1);
SELECT pgque.set_queue_config('rq', 'bogus', '1');
SELECT pgque.drop_queue('rq');
\set VERBOSITY default
-- PgQue's return-value contracts: a second ack and an unknown batch are 0,
-- a second unsubscribe is 0, ticker() ticks again right after
-- force_next_tick, receive_coop registers its member. The worker is stopped
-- first, so only this session ticks.
SELECT pgque.stop();
DO $$
BEGIN
    FOR i IN 1..200 LOOP
        PERFORM pg_stat_clear_snapshot();
        EXIT WHEN NOT EXISTS (SELECT 1 FROM pg_stat_activity
                               WHERE backend_type = 'pgque worker' AND datname = current_database());
        PERFORM pg_sleep(0.05);
    END LOOP;
END
$$;
SELECT pgque.create_queue('cq');
SELECT pgque.subscribe('cq', 'c'), pgque.subscribe('cq', 'c');
SELECT pgque.send('cq', 'one') > 0 AS sent;
SELECT pgque.ticker('cq') > 0 AS ticked;
SELECT pgque.ack(batch_id) FROM (SELECT DISTINCT batch_id FROM pgque.receive('cq', 'c')) b;
SELECT pgque.ack(max(batch_id)) AS again FROM pgque.batch;
SELECT pgque.ack(987654321) AS unknown;
SELECT pgque.force_next_tick('cq') > 0 AS forced, pgque.ticker('cq') > 0 AS ticked_after_force;
SELECT pgque.unsubscribe('cq', 'c'), pgque.unsubscribe('cq', 'c');
SELECT count(*) FROM pgque.receive_coop('cq', 'grp', 'w1');
SELECT pgque.touch_subconsumer('cq', 'grp', 'w1'), pgque.touch_subconsumer('cq', 'grp', 'ghost');
SELECT pgque.unregister_subconsumer('cq', 'grp', 'w1'), pgque.unregister_subconsumer('cq', 'grp', 'w1');
-- PgQue's phrases in the messages.
SELECT pgque.send('nope', 'x'::text);
SELECT * FROM pgque.receive('cq', 'nobody');
SELECT * FROM pgque.get_batch_events(987654321);
-- Queue names up to 57 bytes; job channels fit 63.
SELECT pgque.create_queue(repeat('q', 57));
SELECT pgque.create_queue(repeat('q', 58));
SELECT pgque.job_channel('orders'), pgque.job_channel(repeat('j', 52)) = 'pgque_jobs_' || repeat('j', 52) AS plain_52;
SELECT pgque.job_channel(repeat('j', 57)), octet_length(pgque.job_channel(repeat('ж', 28))) AS bytes_56;
-- PgQue's relations.
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
 WHERE attrelid = 'pgque.dead_letter'::regclass AND attnum > 0 ORDER BY attnum;
SELECT pg_get_function_result('pgque.dlq_inspect(text, int4)'::regprocedure);
SELECT attname FROM pg_attribute WHERE attrelid = 'pgque.consumer'::regclass AND attnum > 0 ORDER BY attnum;
SELECT pgque.drop_queue('cq', true);
SELECT pgque.drop_queue(repeat('q', 57));
SELECT pgque.drop_queue('rq', true);
