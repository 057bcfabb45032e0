-- What `make run` shows: an event queue worked end to end by the background
-- worker (no pgque.ticker() call here: the worker ticks on its own).
\pset footer off
\set QUIET on
SELECT pgque.version() AS "pgque version";

-- A fresh queue with one consumer (re-runs start from a clean queue).
\o /dev/null
SELECT pgque.drop_queue('demo', true) FROM pgque.get_queue_info() WHERE queue_name = 'demo';
\o
SELECT pgque.create_queue('demo') AS created;
SELECT pgque.subscribe('demo', 'demo_consumer') AS subscribed;
SELECT last_tick_id AS tick_before FROM pgque.get_queue_info('demo') \gset

\echo 'Sending 20,000 events: 20 transactions of send_batch(1,000 JSON payloads) ...'
SELECT clock_timestamp() AS t0 \gset
\o /dev/null
SELECT format($f$SELECT pgque.send_batch('demo', 'demo.event',
         (SELECT array_agg(jsonb_build_object('n', g, 'round', %s, 'note', 'hello from make run'))
            FROM generate_series(1, 1000) g))$f$, r)
  FROM generate_series(1, 20) r \gexec
\o
SELECT round(20000 / extract(epoch FROM clock_timestamp() - :'t0'::timestamptz)) AS "sent per second";

\echo 'The background worker ticks within milliseconds of each commit:'
SELECT pg_sleep(0.5);
SELECT last_tick_id - :tick_before AS "ticks made by the worker", ev_new AS "events not yet in a tick"
  FROM pgque.get_queue_info('demo');

\echo 'Receiving and acking in batches of up to 1,000 (receive + ack per batch):'
CREATE TEMP TABLE demo_seen (batch_id bigint, n int);
SELECT clock_timestamp() AS t1 \gset
DO $$
DECLARE got int; bid bigint;
BEGIN
  LOOP
    SELECT count(*), max(batch_id) INTO got, bid FROM pgque.receive('demo', 'demo_consumer', 1000);
    EXIT WHEN got = 0;
    INSERT INTO demo_seen VALUES (bid, got);
    PERFORM pgque.ack(bid);
  END LOOP;
END $$;
SELECT sum(n) AS "events received and acked", count(*) AS batches,
       round(sum(n) / extract(epoch FROM clock_timestamp() - :'t1'::timestamptz)) AS "received per second"
  FROM demo_seen;

\echo 'Consumer position after the acks (lag, pending events):'
SELECT consumer_name, lag, pending_events FROM pgque.get_consumer_info('demo');
\echo 'Dead tuples in the event tables (append-only + TRUNCATE: always 0):'
SELECT coalesce(sum(n_dead_tup), 0) AS dead_tuples FROM pg_stat_user_tables
 WHERE schemaname = 'pgque' AND relname LIKE 'event\_%';
\ir demo_events.sql
\ir demo_jobs.sql
\echo 'The worker and its duties (pgque.status()):'
SELECT component, status, left(detail, 80) AS detail FROM pgque.status();
