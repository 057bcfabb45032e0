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
SELECT pgque.ack(-1);
SELECT pgque.set_queue_config('rq', 'bogus', '1');
SELECT pgque.drop_queue('rq');
\set VERBOSITY default
SELECT pgque.drop_queue('rq', true);
