-- pgque finalize: runs after every table and function exists.

-- Nothing is callable by PUBLIC; each function is granted to the narrowest role.
-- pgque.xact_lock, xact_lock_shared and try_xact_lock are granted to none:
-- only pgque's own (SECURITY DEFINER) functions take pgque's locks.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgque FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA pgque FROM PUBLIC;

-- ---- administration (pgque_admin) ---------------------------------------
GRANT EXECUTE ON FUNCTION pgque.start() TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.stop() TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.status() TO pgque_admin, pgque_reader;
-- When each duty next has work (src/worker/due.rs).
GRANT EXECUTE ON FUNCTION pgque.duty_due() TO pgque_admin, pgque_reader;
-- Who keeps the job log's due truncation from running (src/jobs/log/rotate.rs).
GRANT EXECUTE ON FUNCTION pgque.job_log_blockers() TO pgque_admin, pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.version() TO pgque_admin, pgque_reader, pgque_writer;
-- Metrics for dashboards and Prometheus (src/metrics.rs).
GRANT EXECUTE ON FUNCTION pgque.metrics() TO pgque_admin, pgque_reader;

-- ---- event queues ---------------------------------------------------------
-- Publishing: pgque_writer.
GRANT EXECUTE ON FUNCTION
    pgque.send(text, jsonb), pgque.send(text, text),
    pgque.send(text, text, jsonb), pgque.send(text, text, text),
    pgque.send_batch(text, jsonb[]), pgque.send_batch(text, text[]),
    pgque.send_batch(text, text, jsonb[]), pgque.send_batch(text, text, text[]),
    pgque.insert_event(text, text, text),
    pgque.insert_event(text, text, text, text, text, text, text)
  TO pgque_writer;
-- Consuming and observability: pgque_reader.
GRANT EXECUTE ON FUNCTION
    pgque.subscribe(text, text), pgque.unsubscribe(text, text),
    pgque.receive(text, text, int4), pgque.ack(bigint), pgque.ack_receive(bigint, int4),
    pgque.nack(bigint, pgque.message, interval, text),
    pgque.register_consumer(text, text), pgque.register_consumer_at(text, text, bigint),
    pgque.unregister_consumer(text, text),
    pgque.next_batch(text, text), pgque.next_batch_info(text, text),
    pgque.next_batch_custom(text, text, interval, int4, interval),
    pgque.get_batch_events(bigint), pgque.get_batch_cursor(bigint, text, int4),
    pgque.finish_batch(bigint),
    pgque.event_retry(bigint, bigint, timestamptz), pgque.event_retry(bigint, bigint, int4),
    pgque.batch_retry(bigint, int4),
    pgque.register_subconsumer(text, text, text, boolean),
    pgque.subscribe_subconsumer(text, text, text, boolean),
    pgque.unsubscribe_subconsumer(text, text, text, int4),
    pgque.next_batch_custom(text, text, text, interval, int4, interval, interval),
    pgque.unregister_subconsumer(text, text, text, int4),
    pgque.next_batch(text, text, text), pgque.next_batch(text, text, text, interval),
    pgque.receive_coop(text, text, text, int4, interval),
    pgque.touch_subconsumer(text, text, text),
    pgque.dlq_inspect(text, int4), pgque.dlq_replay(bigint), pgque.dlq_replay_all(text),
    pgque.get_queue_info(), pgque.get_queue_info(text),
    pgque.get_consumer_info(), pgque.get_consumer_info(text), pgque.get_consumer_info(text, text),
    pgque.get_batch_info(bigint)
  TO pgque_reader;
-- Administration: pgque_admin.
GRANT EXECUTE ON FUNCTION
    pgque.create_queue(text), pgque.drop_queue(text), pgque.drop_queue(text, boolean),
    pgque.set_queue_config(text, text, text),
    pgque.ticker(), pgque.ticker(text), pgque.force_next_tick(text), pgque.force_tick(text),
    pgque.maint(), pgque.maint_retry_events(), pgque.maint_operations(),
    pgque.dlq_purge(text, interval)
  TO pgque_admin;
-- Inspection of what a server stores (sharded clusters, docs/scale-out.md).
GRANT EXECUTE ON FUNCTION pgque.all_events(text) TO pgque_admin;
-- (dlq_purge destroys the dead letters of every consumer of the queue, which
-- no consumer needs to do to another: an administrator's step. Inspecting
-- and replaying stay with readers: replay only re-delivers.)
-- PgQue grants replaying to its writers, so a PgQue client running as
-- pgque_writer alone replays dead letters here too.
GRANT EXECUTE ON FUNCTION pgque.dlq_replay(bigint), pgque.dlq_replay_all(text) TO pgque_writer;

-- ---- PgQue's relations and the job channel (issue 17) ----------------------
-- PgQue's users read these relations directly (its monitoring recipes, its
-- dead-letter docs): readers may read them; only an admin may delete dead
-- letters by hand; nobody writes them but pgque's own functions.
GRANT SELECT ON pgque.dead_letter, pgque.consumer, pgque.queue, pgque.subscription,
    pgque.retry_queue TO pgque_reader;
GRANT DELETE ON pgque.dead_letter TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.job_channel(text) TO pgque_reader, pgque_writer;

-- ---- idempotent and delayed publishing ------------------------------------------------
GRANT EXECUTE ON FUNCTION
    pgque.send_idem(text, text, jsonb, text, interval, text, jsonb),
    pgque.send_idem(text, text, text, text, interval, text, jsonb)
  TO pgque_writer;
GRANT EXECUTE ON FUNCTION
    pgque.send_at(text, text, jsonb, timestamptz, text, jsonb),
    pgque.send_at(text, text, text, timestamptz, text, jsonb)
  TO pgque_writer;
GRANT EXECUTE ON FUNCTION pgque.maint_idem(), pgque.maint_delayed() TO pgque_admin;

-- ---- PgQue's API beyond section 1 (DESIGN.md section 11) -----------------------------
-- insert_event_bulk and uninstall: no role (owner / superuser only), as in PgQue.
GRANT EXECUTE ON FUNCTION
    pgque.event_dead(bigint, bigint, text, timestamptz, xid8, int4, text, text, text, text, text, text),
    pgque.create_queue(text, jsonb), pgque.pause_queue(text), pgque.resume_queue(text),
    pgque.set_tick_period_ms(int4), pgque.maint_idem(text), pgque.maint_deliver_delayed(),
    pgque.maint_rotate_tables_step1(text), pgque.maint_rotate_tables_step2()
  TO pgque_admin;
-- (ALL FUNCTIONS, revoked above, leaves procedures out.)
REVOKE ALL ON PROCEDURE pgque.ticker_loop() FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE pgque.ticker_loop() TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.ticker_loop_tick() TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.unsubscribe_slot(text, text, int4) TO pgque_reader;
GRANT EXECUTE ON FUNCTION
    pgque.queue_stats(), pgque.consumer_stats(), pgque.queue_health(), pgque.otel_metrics(),
    pgque.stuck_consumers(interval), pgque.in_flight(text),
    pgque.throughput(text, interval, interval), pgque.error_rate(text, interval, interval)
  TO pgque_reader;
-- Table-change capture: attaching a trigger needs EXECUTE on its function;
-- firing it needs none (the rows' writers need pgque_writer for insert_event).
GRANT EXECUTE ON FUNCTION pgque.logutriga(), pgque.sqltriga(), pgque.jsontriga() TO pgque_writer;
-- Their expressions (when=, ev_*=) see pg_catalog and pgque, whatever the
-- session's search_path: qualify other schemas' functions in them.
ALTER FUNCTION pgque.logutriga() SET search_path = pg_catalog, pgque, pg_temp;
ALTER FUNCTION pgque.sqltriga() SET search_path = pg_catalog, pgque, pg_temp;
ALTER FUNCTION pgque.jsontriga() SET search_path = pg_catalog, pgque, pg_temp;

-- ---- partition keys ---------------------------------------------------------
GRANT EXECUTE ON FUNCTION
    pgque.send(text, text, jsonb, text), pgque.send(text, text, text, text),
    pgque.send_batch(text, text, jsonb[], text[]), pgque.send_batch(text, text, text[], text[])
  TO pgque_writer;
GRANT EXECUTE ON FUNCTION
    pgque.subscribe_partitioned(text, text, int4), pgque.unsubscribe_partitioned(text, text),
    pgque.subscribe_slot(text, text, int4, int4), pgque.unsubscribe_slot(text, text, int4, int4),
    pgque.claim_slot(text, text, int4, text, interval),
    pgque.claim_next_slot(text, text, text, interval),
    pgque.release_slot(text, text, int4, text),
    pgque.receive_partitioned(text, text, int4, int4, text, int4),
    pgque.ack_partitioned(text, text, int4, int4, text),
    pgque.nack_partitioned(text, text, int4, int4, text, pgque.message, interval, text),
    pgque.partition_slot_rows()
  TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.partition_slot(text, int4)
  TO pgque_reader, pgque_writer, pgque_admin;
-- ---- trace context on events (docs/tracing.md) ---------------------------------
GRANT EXECUTE ON FUNCTION
    pgque.send(text, text, jsonb, text, jsonb), pgque.send(text, text, text, text, jsonb),
    pgque.send_batch(text, text, jsonb[], text[], jsonb),
    pgque.send_batch(text, text, text[], text[], jsonb)
  TO pgque_writer;
GRANT EXECUTE ON FUNCTION
    pgque.receive_with_headers(text, text, int4),
    pgque.receive_coop_with_headers(text, text, text, int4, interval),
    pgque.receive_partitioned_with_headers(text, text, int4, int4, text, int4)
  TO pgque_reader;
-- The waiting forms (src/waiters.rs, docs/waits.md): consumers' calls.
GRANT EXECUTE ON FUNCTION
    pgque.receive(text, text, int4, interval),
    pgque.receive_with_headers(text, text, int4, interval),
    pgque.next_batch_wait(text, text, interval),
    pgque.receive_partitioned(text, text, int4, int4, text, int4, interval)
  TO pgque_reader;
GRANT SELECT ON pgque.partition_slot_status TO pgque_reader;
-- The pause failure policy (src/log/pause.rs): a consumer chooses it at
-- subscribe; releasing a blocked key is an administrator's call.
GRANT EXECUTE ON FUNCTION pgque.subscribe_partitioned(text, text, int4, text, text)
  TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.release_partition_key(text, text, text) TO pgque_admin;
GRANT SELECT ON pgque.partition_blocked_keys TO pgque_reader;
-- Online resize of N (src/log/resize.rs): an administrator's calls; its
-- status is readable by consumers (their PartitionedConsumer follows it).
GRANT EXECUTE ON FUNCTION pgque.begin_resize(text, text, int4),
    pgque.complete_resize(text, text), pgque.abort_resize(text, text)
  TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.resize_ready(text, text) TO pgque_reader, pgque_admin;
GRANT SELECT ON pgque.partition_resizes TO pgque_reader, pgque_admin;

-- Event-queue functions plan their lookups with sequential scans disabled:
-- ticks, batches and events are always reached through their indexes, also
-- while the planner's statistics are stale (a metadata piece analyzed empty
-- and refilled since, an event table grown since its last ANALYZE).
-- Not the send functions (send, send_batch, insert_event): they scan nothing
-- (a queue lookup by its unique name, then an INSERT), and every setting a
-- function carries is set and reset on each call (measured: dropping this
-- one and jit = off made a single-event send ~10% cheaper in CPU).
DO $seqscan$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'pgque'::regnamespace
                AND p.proname = ANY (ARRAY[
                    'subscribe', 'unsubscribe', 'receive',
                    'ack', 'ack_receive', 'nack', 'register_consumer', 'register_consumer_at', 'unregister_consumer',
                    'next_batch', 'next_batch_info', 'next_batch_custom', 'get_batch_events',
                    'get_batch_cursor', 'finish_batch', 'event_retry', 'batch_retry',
                    'register_subconsumer', 'subscribe_subconsumer', 'unregister_subconsumer',
                    'receive_coop', 'touch_subconsumer', 'dlq_inspect', 'dlq_replay', 'dlq_replay_all',
                    'dlq_purge', 'create_queue', 'drop_queue', 'set_queue_config', 'ticker',
                    'force_next_tick', 'force_tick', 'maint', 'maint_retry_events',
                    'maint_rotate_tables_step1', 'maint_rotate_tables_step2',
                    'get_queue_info', 'get_consumer_info', 'get_batch_info',
                    'send_idem', 'maint_idem', 'send_at', 'maint_delayed',
                    'subscribe_partitioned', 'unsubscribe_partitioned', 'subscribe_slot',
                    'unsubscribe_slot', 'claim_slot', 'claim_next_slot', 'release_slot',
                    'receive_partitioned', 'ack_partitioned', 'nack_partitioned',
                    'partition_slot_rows', 'release_partition_key', 'event_dead', 'unsubscribe_subconsumer',
                    'begin_resize', 'resize_ready', 'complete_resize', 'abort_resize',
                    'pause_queue', 'resume_queue', 'queue_stats', 'consumer_stats',
                    'queue_health', 'otel_metrics', 'stuck_consumers', 'in_flight', 'throughput',
                    'error_rate', 'receive_with_headers', 'receive_coop_with_headers',
                    'receive_partitioned_with_headers', 'next_batch_wait'])
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET enable_seqscan = off', f);
    END LOOP;
END
$seqscan$;

-- The functions that read batches run their statements with generic plans.
-- Their statements reach every row through an index whatever the values
-- (enable_seqscan off, above), so a custom plan buys nothing, but the plan
-- cache kept choosing custom ones (their estimates look cheaper) and so
-- re-planned the event read on every receive: ~10% of a drain's CPU.
DO $generic$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'pgque'::regnamespace
                AND p.proname = ANY (ARRAY[
                    'receive', 'receive_coop', 'next_batch', 'next_batch_info',
                    'next_batch_custom', 'get_batch_events', 'get_batch_cursor',
                    'receive_partitioned', 'receive_with_headers', 'receive_coop_with_headers',
                    'receive_partitioned_with_headers', 'next_batch_wait', 'ack_receive'])
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan', f);
    END LOOP;
END
$generic$;

-- No pgque function is worth JIT-compiling: each runs short statements, and
-- with enable_seqscan off (above) a plan's cost can pass jit_above_cost, after
-- which every execution paid ~200 ms of LLVM compilation (seen on Debian's
-- PostgreSQL 15, whose llvmjit is installed and on by default). Except the
-- send functions: their statements (a lookup by unique name, an INSERT of
-- VALUES or of an unnested array) cost far below jit_above_cost and they keep
-- sequential scans enabled, so the setting would only cost its per-call
-- set and reset. Nor pgque's lock functions (src/locks.rs), called per row
-- inside pgque's statements: they run no statement, and a function with a
-- setting is called through fmgr_security_definer on every row. Nor
-- job_channel: a pure function, where a setting would cost on every call.
DO $nojit$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'pgque'::regnamespace
                AND p.prokind = 'f'
                AND p.proname <> ALL (ARRAY['send', 'send_batch', 'insert_event', 'insert_event_bulk',
                                            'job_channel', 'logutriga', 'sqltriga', 'jsontriga',
                                            'xact_lock', 'xact_lock_shared', 'try_xact_lock'])
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET jit = off', f);
    END LOOP;
END
$nojit$;

-- ---- job queues -----------------------------------------------------------
-- Producers (pgque_writer) enqueue; consumers (pgque_reader) dispatch and
-- report outcomes; pgque_admin administers queues, actors and single jobs.
GRANT EXECUTE ON FUNCTION pgque.enqueue_ready_rows(text, text[], jsonb[], smallint[],
    timestamptz[], text[], text[], text[], text[], int[], text, jsonb[]) TO pgque_writer;
GRANT EXECUTE ON FUNCTION pgque.enqueue(text, text, jsonb, int, timestamptz, text,
    text, text, text, int, text, bigint[], jsonb) TO pgque_writer;
GRANT EXECUTE ON FUNCTION pgque.enqueue_flow(text, jsonb) TO pgque_writer;
GRANT EXECUTE ON FUNCTION pgque.job_parents(bigint) TO pgque_reader, pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.flow_status(bigint) TO pgque_reader, pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.create_job_queue(text, text, int) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.drop_job_queue(text, boolean) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.set_job_queue_config(text, text, text) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.pause_job_queue(text) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.resume_job_queue(text) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.set_actor_capacity(text, int) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.set_rate_limit(text, int, interval, int),
    pgque.set_actor_rate_limit(text, int, interval, int) TO pgque_admin;
GRANT SELECT ON pgque.rate_limits TO pgque_reader, pgque_admin;
GRANT SELECT ON pgque.job_queue_status TO pgque_reader, pgque_admin;
GRANT SELECT ON pgque.job_history TO pgque_admin;
GRANT SELECT ON pgque.all_jobs, pgque.job_log_jobs TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.get_job(bigint) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.dispatch(text[], int, text, interval, int) TO pgque_reader;
-- dispatch that waits inside the server (src/jobs/dispatch_wait.rs, docs/waits.md).
GRANT EXECUTE ON FUNCTION pgque.dispatch_wait(text[], int, text, interval, interval, int) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.complete(bigint, bigint, jsonb) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.complete_many(bigint[], bigint[], jsonb[]) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.set_progress(bigint, bigint, jsonb) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.fail(bigint, bigint, text, timestamptz) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.heartbeat(bigint[], bigint[], interval) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.snooze(bigint, bigint, timestamptz) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.cancel(bigint) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.retry_job(bigint) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.rescue_expired_leases(int) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.promote_scheduled_jobs(int) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.sweep_job_events(int) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.prune_jobs(int) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.job_maint() TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.job_analyze() TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.rotate_job_log() TO pgque_admin;

-- ---- schedules (periodic jobs) -------------------------------------------
GRANT EXECUTE ON FUNCTION pgque.create_schedule(text, text, text, text, jsonb, text, int, text, int)
  TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.alter_schedule(text, text, text, text, jsonb, text, int, text, int)
  TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.pause_schedule(text), pgque.resume_schedule(text),
    pgque.drop_schedule(text), pgque.run_schedules()
  TO pgque_admin;
GRANT SELECT ON pgque.schedules TO pgque_reader, pgque_admin;

-- Start this database's worker now (a no-op without shared_preload_libraries;
-- the worker waits for this transaction to commit before it begins).
SELECT pgque.start();
