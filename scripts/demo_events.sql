-- Event queues in `make run`: a queue, two consumers, send, receive, ack.
-- (Include from demo.sql with: \ir demo_events.sql)
\echo 'Fan-out: a queue with two consumers, three events'
\o /dev/null
SELECT pgque.drop_queue('demo_orders', true) FROM pgque.get_queue_info() WHERE queue_name = 'demo_orders';
\o
SELECT pgque.create_queue('demo_orders');
SELECT pgque.subscribe('demo_orders', 'billing'), pgque.subscribe('demo_orders', 'shipping');
SELECT pgque.send('demo_orders', 'order.created', '{"order": 1}'::jsonb);
SELECT pgque.send_batch('demo_orders', 'order.paid', ARRAY['{"order": 1}', '{"order": 2}']::jsonb[]);
-- The worker ticks the queue within milliseconds of the commit.
SELECT pg_sleep(0.2);
\echo 'billing receives the batch:'
SELECT msg_id, batch_id, type, payload, retry_count FROM pgque.receive('demo_orders', 'billing');
SELECT pgque.ack(batch_id) FROM (SELECT DISTINCT batch_id FROM pgque.receive('demo_orders', 'billing')) b;
\echo 'shipping gets the same events in its own batch:'
SELECT msg_id, batch_id, type, payload FROM pgque.receive('demo_orders', 'shipping');
\echo 'Queue and consumer info:'
SELECT queue_name, queue_ntables, queue_cur_table, ticker_lag, last_tick_id FROM pgque.get_queue_info('demo_orders');
SELECT queue_name, consumer_name, lag, last_tick, current_batch, pending_events FROM pgque.get_consumer_info('demo_orders');
