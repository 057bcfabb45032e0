-- Partition keys: the API surface of slots and leases, and a deterministic
-- session on one slot (the queue's ticker is paused: only force_tick ticks).
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments, pg_get_function_result(p.oid) AS result,
       p.prosecdef AS security_definer
  FROM pg_proc p
 WHERE p.pronamespace = 'pgque'::regnamespace
   AND (p.proname IN ('subscribe_partitioned', 'unsubscribe_partitioned', 'subscribe_slot',
                      'unsubscribe_slot', 'claim_slot', 'claim_next_slot', 'release_slot',
                      'receive_partitioned', 'ack_partitioned', 'nack_partitioned',
                      'partition_slot', 'partition_slot_rows')
        OR (p.proname IN ('send', 'send_batch') AND p.pronargs = 4))
 ORDER BY 1, 2;
SELECT attname, format_type(atttypid, atttypmod)
  FROM pg_attribute WHERE attrelid = 'pgque.partition_slot_status'::regclass AND attnum > 0
 ORDER BY attnum;

SELECT pgque.create_queue('sq');
SELECT pgque.set_queue_config('sq', 'ticker_paused', 'true');
SELECT pgque.subscribe_partitioned('sq', 'orders', 4);
SELECT consumer_name FROM pgque.get_consumer_info('sq');
-- Keys whose slots (of 4) are known from the server's own hash.
SELECT k, pgque.partition_slot(k, 4) AS slot, (hashtextextended(k, 0) % 4 + 4) % 4 AS by_hand
  FROM unnest(ARRAY['tenant-1', 'tenant-2', 'tenant-3', 'tenant-4', NULL]) k;
SELECT pgque.send('sq', 'order', '{"n": 1}'::jsonb, 'tenant-1') > 0 AS sent;
SELECT pgque.send('sq', 'order', 'two', 'tenant-2') > 0 AS sent;
SELECT pgque.send('sq', 'order', 'three', 'tenant-1') > 0 AS sent;
SELECT pgque.send('sq', 'order', 'no key', NULL) > 0 AS sent;
SELECT pgque.force_tick('sq') > 0 AS ticked;
SELECT slot, n, subscribed, lease_owner, epoch, pending_events FROM pgque.partition_slot_status ORDER BY slot;
SELECT pgque.claim_slot('sq', 'orders', pgque.partition_slot('tenant-1', 4), 'w1');
SELECT pgque.claim_slot('sq', 'orders', pgque.partition_slot('tenant-1', 4), 'w2');
SELECT type, payload, retry_count, extra1
  FROM pgque.receive_partitioned('sq', 'orders', pgque.partition_slot('tenant-1', 4), 4, 'w1');
SELECT pgque.ack_partitioned('sq', 'orders', pgque.partition_slot('tenant-1', 4), 4, 'w1');
SELECT pgque.ack_partitioned('sq', 'orders', pgque.partition_slot('tenant-1', 4), 4, 'w1');
SELECT pgque.release_slot('sq', 'orders', pgque.partition_slot('tenant-1', 4), 'w1');
SELECT slot, epoch FROM pgque.claim_next_slot('sq', 'orders', 'w3', '10 seconds');
SELECT slot, lease_owner, epoch FROM pgque.partition_slot_status ORDER BY slot;
-- Errors carry their SQLSTATE.
\set VERBOSITY sqlstate
SELECT pgque.subscribe_partitioned('sq', 'orders', 8);
SELECT pgque.subscribe_partitioned('sq', 'x', 0);
SELECT pgque.subscribe_partitioned('sq', 'bad#name', 4);
SELECT pgque.claim_slot('sq', 'orders', 4, 'w1');
SELECT pgque.claim_slot('sq', 'orders', 0, 'w1', '0 seconds');
SELECT pgque.claim_slot('sq', 'orders', 0, NULL);
SELECT pgque.receive_partitioned('sq', 'orders', 0, 4, 'stranger');
SELECT pgque.unsubscribe_partitioned('sq', 'orders');
