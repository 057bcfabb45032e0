-- pgque 0.6.0 -> 0.7.0 (ALTER EXTENSION pgque UPDATE).
--
-- How this file is kept right: pg_test/tests/upgrade.rs installs each released
-- version (the frozen sql/archive/pgque--<version>.sql), fills it with queues,
-- events, consumers and jobs, runs ALTER EXTENSION pgque UPDATE and compares
-- every extension object (definitions, grants, options, pg_dump
-- registrations) with a fresh 0.7.0 install; it prints the differences when
-- they disagree.
--
-- When a change to sql/*.sql or to a #[pg_extern] lands, extend this file:
--   cargo pgrx schema pg15 --no-default-features --features pg15 -o /tmp/pgque--0.7.0.sql
--   python3 scripts/upgrade_draft.py sql/archive/pgque--0.6.0.sql /tmp/pgque--0.7.0.sql \
--       --upgrade sql/pgque--0.6.0--0.7.0.sql
-- prints the new and changed statements not yet covered here.
--
-- Rules: every statement schema-qualified (the script runs with the
-- extension's search_path); nothing here may depend on data being present or
-- absent.

\echo Use "ALTER EXTENSION pgque UPDATE" to load this file. \quit


-- ==== schedules (issue 18) ====
-- Periodic jobs: sql/32_schedules.sql, src/schedules/ (docs/schedules.md).
CREATE SEQUENCE pgque.schedules_id_seq AS bigint;

CREATE TABLE pgque.schedules_def (
    schedule_id  bigint PRIMARY KEY DEFAULT pg_catalog.nextval('pgque.schedules_id_seq'),
    name         text NOT NULL UNIQUE,
    cron         text NOT NULL,
    timezone     text NOT NULL DEFAULT 'UTC',
    queue_name   text NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL DEFAULT '{}',
    priority     smallint NOT NULL DEFAULT 0,
    misfire      text NOT NULL DEFAULT 'skip' CHECK (misfire IN ('skip', 'catch_up')),
    max_attempts int CHECK (max_attempts BETWEEN 1 AND 1000),
    paused       boolean NOT NULL DEFAULT false,
    -- the next slot to fire (an instant; whole seconds)
    next_run_at  timestamptz NOT NULL,
    last_run_at  timestamptz,
    last_job_id  bigint,
    created_at   timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50,
        autovacuum_vacuum_threshold = 500,
        autovacuum_vacuum_scale_factor = 0.05,
        autovacuum_analyze_threshold = 500);

ALTER SEQUENCE pgque.schedules_id_seq OWNED BY pgque.schedules_def.schedule_id;

CREATE INDEX schedules_due ON pgque.schedules_def (next_run_at) WHERE NOT paused;

CREATE VIEW pgque.schedules AS
SELECT s.name, s.cron, s.timezone, s.queue_name, s.kind, s.args, s.misfire, s.paused,
       s.next_run_at, s.last_run_at, s.last_job_id, s.priority, s.max_attempts, s.schedule_id
FROM pgque.schedules_def s;

SELECT pg_catalog.pg_extension_config_dump('pgque.schedules_def', '');

SELECT pg_catalog.pg_extension_config_dump('pgque.schedules_id_seq', '');

CREATE OR REPLACE FUNCTION "alter_schedule"(
	"name" TEXT,
	"cron" TEXT DEFAULT NULL,
	"queue_name" TEXT DEFAULT NULL,
	"kind" TEXT DEFAULT NULL,
	"args" jsonb DEFAULT NULL,
	"timezone" TEXT DEFAULT NULL,
	"priority" INT DEFAULT NULL,
	"misfire" TEXT DEFAULT NULL,
	"max_attempts" INT DEFAULT NULL
) RETURNS void
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'alter_schedule_wrapper';

CREATE OR REPLACE FUNCTION "create_schedule"(
	"name" TEXT,
	"cron" TEXT,
	"queue_name" TEXT,
	"kind" TEXT,
	"args" jsonb DEFAULT '{}',
	"timezone" TEXT DEFAULT 'UTC',
	"priority" INT DEFAULT 0,
	"misfire" TEXT DEFAULT 'skip',
	"max_attempts" INT DEFAULT NULL
) RETURNS bigint
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'create_schedule_wrapper';

CREATE OR REPLACE FUNCTION "drop_schedule"(
	"name" TEXT
) RETURNS bool
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'drop_schedule_wrapper';

CREATE OR REPLACE FUNCTION "pause_schedule"(
	"name" TEXT
) RETURNS void
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'pause_schedule_wrapper';

CREATE OR REPLACE FUNCTION "resume_schedule"(
	"name" TEXT
) RETURNS void
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'resume_schedule_wrapper';

CREATE OR REPLACE FUNCTION "run_schedules"() RETURNS INT
STRICT SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'run_schedules_wrapper';

-- Nothing new is PUBLIC's (as sql/99_finalize.sql; idempotent for what exists).
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgque FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA pgque FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.create_schedule(text, text, text, text, jsonb, text, int, text, int)
  TO pgque_admin;

GRANT EXECUTE ON FUNCTION pgque.alter_schedule(text, text, text, text, jsonb, text, int, text, int)
  TO pgque_admin;

GRANT EXECUTE ON FUNCTION pgque.pause_schedule(text), pgque.resume_schedule(text),
    pgque.drop_schedule(text), pgque.run_schedules()
  TO pgque_admin;

GRANT SELECT ON pgque.schedules TO pgque_reader, pgque_admin;
ALTER FUNCTION pgque.create_schedule(text, text, text, text, jsonb, text, int, text, int) SET jit = off;
ALTER FUNCTION pgque.alter_schedule(text, text, text, text, jsonb, text, int, text, int) SET jit = off;
ALTER FUNCTION pgque.pause_schedule(text) SET jit = off;
ALTER FUNCTION pgque.resume_schedule(text) SET jit = off;
ALTER FUNCTION pgque.drop_schedule(text) SET jit = off;
ALTER FUNCTION pgque.run_schedules() SET jit = off;
-- ==== end schedules (issue 18) ====

-- ==== metrics for dashboards and Prometheus (issue 21) ====
CREATE FUNCTION pgque."metrics"() RETURNS TABLE (
	"name" TEXT,
	"labels" jsonb,
	"value" double precision
)
STRICT STABLE SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'metrics_wrapper';
-- as 99_finalize.sql does for every function but the send ones
ALTER FUNCTION pgque.metrics() SET jit = off;
REVOKE ALL ON FUNCTION pgque.metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.metrics() TO pgque_admin, pgque_reader;

-- ==== security hardening (issue 24) ====
-- pgque's own locks (src/locks.rs): advisory-type locks with a tag no
-- PUBLIC function builds, granted to no role; the statements that took
-- pg_advisory_xact_lock now call these (their new text comes with the new
-- library: the statements live in Rust).
CREATE FUNCTION pgque."xact_lock"(
	"class" INT,
	"key" bigint
) RETURNS void
STRICT
PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'xact_lock_wrapper';
CREATE FUNCTION pgque."xact_lock_shared"(
	"class" INT,
	"key" bigint
) RETURNS void
STRICT
PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'xact_lock_shared_wrapper';
CREATE FUNCTION pgque."try_xact_lock"(
	"class" INT,
	"key" bigint
) RETURNS bool
STRICT
PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'try_xact_lock_wrapper';
REVOKE ALL ON FUNCTION pgque.xact_lock(int4, int8), pgque.xact_lock_shared(int4, int8),
    pgque.try_xact_lock(int4, int8) FROM PUBLIC;
-- dlq_purge is an administrator's step.
REVOKE EXECUTE ON FUNCTION pgque.dlq_purge(text, interval) FROM pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.dlq_purge(text, interval) TO pgque_admin;
-- ==== stored cuts of big batch ranges (issue 25) ====
CREATE TABLE pgque.batch_cut (
    sub_id       int4 NOT NULL,
    prev_tick_id bigint NOT NULL,
    tick_id      bigint NOT NULL,
    base         bigint NOT NULL,
    first_id     bigint NOT NULL,
    last_id      bigint NOT NULL,
    ids          bigint[] NOT NULL,
    tids         tid[] NOT NULL,
    tbls         int2[] NOT NULL,
    piece        int2 NOT NULL
) PARTITION BY LIST (piece);
CREATE TABLE pgque.batch_cut_p0 PARTITION OF pgque.batch_cut FOR VALUES IN (0);
CREATE TABLE pgque.batch_cut_p1 PARTITION OF pgque.batch_cut FOR VALUES IN (1);
CREATE INDEX batch_cut_idx ON pgque.batch_cut (sub_id, prev_tick_id, tick_id, last_id);
REVOKE ALL ON pgque.batch_cut, pgque.batch_cut_p0, pgque.batch_cut_p1 FROM PUBLIC;


-- ==== PgQue contract: return values, error texts, names, relations (issue 17) ====
-- The behaviour changes (ack of a finished batch 0, unsubscribe of a
-- non-subscriber 0, force_next_tick making the next ticker() tick, error
-- texts with PgQue's phrases, 57-byte queue names) live in the library; the
-- schema changes follow.

-- Dead letters: the storage table becomes pgque.dead_letter_store, and
-- pgque.dead_letter is PgQue's view of it (dlq_inspect returns its rows).
ALTER TABLE pgque.dead_letter RENAME TO dead_letter_store;
ALTER SEQUENCE pgque.dead_letter_dl_id_seq RENAME TO dead_letter_store_dl_id_seq;
ALTER INDEX pgque.dead_letter_pkey RENAME TO dead_letter_store_pkey;
-- PostgreSQL 18 names NOT NULL constraints after the table (<table>_<column>_not_null)
-- and keeps the name across a table rename; a fresh install names them after
-- dead_letter_store, so the update renames them to match.
DO $$
DECLARE c record;
BEGIN
  FOR c IN SELECT conname FROM pg_catalog.pg_constraint
            WHERE conrelid = 'pgque.dead_letter_store'::regclass AND contype = 'n'
              AND conname LIKE 'dead\_letter\_%\_not\_null'
              AND conname NOT LIKE 'dead\_letter\_store\_%' LOOP
    EXECUTE format('ALTER TABLE pgque.dead_letter_store RENAME CONSTRAINT %I TO %I',
                   c.conname, 'dead_letter_store_' || substr(c.conname, length('dead_letter_') + 1));
  END LOOP;
END $$;
ALTER TABLE pgque.dead_letter_store ADD COLUMN ev_txid xid8;
CREATE INDEX dead_letter_owner_ev_idx ON pgque.dead_letter_store (dl_owner, ev_id);
ALTER TABLE pgque.retry_queue ADD COLUMN ev_txid xid8;

CREATE VIEW pgque.dead_letter AS
SELECT d.dl_id, d.dl_queue AS dl_queue_id, d.dl_owner AS dl_consumer_id, d.dl_time, d.dl_reason,
       d.ev_id, d.ev_time, d.ev_txid, d.ev_retry, d.ev_type, d.ev_data,
       d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4
  FROM pgque.dead_letter_store d;

CREATE VIEW pgque.consumer AS
SELECT s.sub_id AS co_id, s.sub_consumer AS co_name
  FROM pgque.subscription s
 WHERE s.sub_parent IS NULL;

GRANT SELECT ON pgque.dead_letter, pgque.consumer, pgque.queue, pgque.subscription,
    pgque.retry_queue TO pgque_reader;
GRANT DELETE ON pgque.dead_letter TO pgque_admin;

-- dlq_inspect returns setof pgque.dead_letter (its result type changes).
DROP FUNCTION pgque.dlq_inspect(text, int4);
CREATE FUNCTION pgque."dlq_inspect"(
	"queue_name" TEXT,
	"limit" INT DEFAULT 100
) RETURNS SETOF pgque.dead_letter
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'dlq_inspect_wrapper';
REVOKE ALL ON FUNCTION pgque.dlq_inspect(text, int4) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.dlq_inspect(text, int4) TO pgque_reader;
ALTER FUNCTION pgque.dlq_inspect(text, int4) SET enable_seqscan = off;
ALTER FUNCTION pgque.dlq_inspect(text, int4) SET jit = off;

-- The NOTIFY channel of a job queue (names of 53..57 bytes get a hashed form).
CREATE FUNCTION pgque."job_channel"(
	"queue_name" TEXT
) RETURNS TEXT
IMMUTABLE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'job_channel_wrapper';
REVOKE ALL ON FUNCTION pgque.job_channel(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.job_channel(text) TO pgque_reader, pgque_writer;
-- PgQue grants replaying dead letters to its writers.
GRANT EXECUTE ON FUNCTION pgque.dlq_replay(bigint), pgque.dlq_replay_all(text) TO pgque_writer;


-- ==== PgQue's API beyond section 1, table-change capture, observability (issue 17) ====
-- (DESIGN.md section 11; src/api/pgq_compat.rs, src/api/triggers.rs, src/api/observe.rs)

-- set_tick_period_ms(): the database's tick period, read by its worker.
ALTER TABLE pgque.worker_config
    ADD COLUMN tick_period_ms int4 CHECK (tick_period_ms BETWEEN 1 AND 1000);
-- handled: table worker_config 0b01b5fd2b

-- The cooperative registration takes convert_normal now (PgQue's 4 arguments).
DROP FUNCTION pgque.register_subconsumer(text, text, text);
-- handled: function register_subconsumer(text, text, text) gone
DROP FUNCTION pgque.subscribe_subconsumer(text, text, text);
-- handled: function subscribe_subconsumer(text, text, text) gone

-- event_dead's idempotency probe is dead_letter_owner_ev_idx (made above with the store).

CREATE OR REPLACE FUNCTION "consumer_stats"() RETURNS TABLE (
	"queue_name" TEXT,
	"consumer_name" TEXT,
	"lag" interval,
	"pending_events" bigint,
	"last_batch_start" timestamp with time zone,
	"batch_active" bool,
	"batch_id" bigint
)
STRICT SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'consumer_stats_wrapper';

CREATE OR REPLACE FUNCTION "create_queue"(
	"queue_name" TEXT,
	"options" jsonb
) RETURNS INT
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'create_queue_options_wrapper';

CREATE OR REPLACE FUNCTION "error_rate"(
	"queue_name" TEXT,
	"period" interval,
	"bucket_size" interval
) RETURNS TABLE (
	"bucket_start" timestamp with time zone,
	"retries" bigint,
	"dead_letters" bigint
)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'error_rate_wrapper';

CREATE OR REPLACE FUNCTION "event_dead"(
	"batch_id" bigint,
	"event_id" bigint,
	"reason" TEXT,
	"ev_time" timestamp with time zone,
	"ev_txid" xid8,
	"ev_retry" INT,
	"ev_type" TEXT,
	"ev_data" TEXT,
	"ev_extra1" TEXT DEFAULT NULL,
	"ev_extra2" TEXT DEFAULT NULL,
	"ev_extra3" TEXT DEFAULT NULL,
	"ev_extra4" TEXT DEFAULT NULL
) RETURNS INT
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'event_dead_wrapper';

CREATE OR REPLACE FUNCTION "in_flight"(
	"queue_name" TEXT
) RETURNS TABLE (
	"consumer_name" TEXT,
	"batch_id" bigint,
	"batch_age" interval,
	"estimated_events" bigint
)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'in_flight_wrapper';

CREATE OR REPLACE FUNCTION "insert_event_bulk"(
	"queue_name" TEXT,
	"ev_type" TEXT,
	"ev_data_list" TEXT[]
) RETURNS bigint[]
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'insert_event_bulk_wrapper';

CREATE OR REPLACE FUNCTION "maint_deliver_delayed"() RETURNS bigint
STRICT SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'maint_deliver_delayed_wrapper';

CREATE OR REPLACE FUNCTION "maint_idem"(
	"queue_name" TEXT
) RETURNS bigint
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'maint_idem_queue_wrapper';

CREATE OR REPLACE FUNCTION "next_batch_custom"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"subconsumer" TEXT,
	"min_lag" interval,
	"min_count" INT,
	"min_interval" interval,
	"dead_interval" interval DEFAULT NULL
) RETURNS TABLE (
	"batch_id" bigint,
	"prev_tick_id" bigint,
	"next_tick_id" bigint
)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'next_batch_custom_coop_wrapper';

CREATE OR REPLACE FUNCTION "otel_metrics"() RETURNS TABLE (
	"metric_name" TEXT,
	"metric_type" TEXT,
	"metric_value" NUMERIC,
	"labels" jsonb
)
STRICT SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'otel_metrics_wrapper';

CREATE OR REPLACE FUNCTION "pause_queue"(
	"queue_name" TEXT
) RETURNS void
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'pause_queue_wrapper';

CREATE OR REPLACE FUNCTION "queue_health"() RETURNS TABLE (
	"queue_name" TEXT,
	"check_name" TEXT,
	"status" TEXT,
	"detail" TEXT
)
STRICT SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'queue_health_wrapper';

CREATE OR REPLACE FUNCTION "queue_stats"() RETURNS TABLE (
	"queue_name" TEXT,
	"queue_id" INT,
	"depth" bigint,
	"oldest_msg_age" interval,
	"consumers" INT,
	"events_per_sec" NUMERIC,
	"cur_table" INT,
	"rotation_age" interval,
	"rotation_period" interval,
	"ticker_paused" bool,
	"last_tick_time" timestamp with time zone,
	"last_tick_id" bigint,
	"dlq_count" bigint
)
STRICT SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'queue_stats_wrapper';

CREATE OR REPLACE FUNCTION "register_subconsumer"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"subconsumer" TEXT,
	"convert_normal" bool DEFAULT false
) RETURNS INT
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'register_subconsumer4_wrapper';

CREATE OR REPLACE FUNCTION "resume_queue"(
	"queue_name" TEXT
) RETURNS void
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'resume_queue_wrapper';

CREATE OR REPLACE FUNCTION "set_tick_period_ms"(
	"ms" INT
) RETURNS INT
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_tick_period_ms_wrapper';

CREATE OR REPLACE FUNCTION "stuck_consumers"(
	"threshold" interval DEFAULT '1 hour'
) RETURNS TABLE (
	"queue_name" TEXT,
	"consumer_name" TEXT,
	"lag" interval,
	"last_active" timestamp with time zone
)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'stuck_consumers_wrapper';

CREATE OR REPLACE FUNCTION "subscribe_subconsumer"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"subconsumer" TEXT,
	"convert_normal" bool DEFAULT false
) RETURNS INT
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'subscribe_subconsumer4_wrapper';

CREATE OR REPLACE FUNCTION "throughput"(
	"queue_name" TEXT,
	"period" interval,
	"bucket_size" interval
) RETURNS TABLE (
	"bucket_start" timestamp with time zone,
	"events" bigint,
	"events_per_sec" NUMERIC
)
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'throughput_wrapper';

CREATE OR REPLACE FUNCTION "uninstall"() RETURNS void
STRICT
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'uninstall_wrapper';

CREATE OR REPLACE FUNCTION "unsubscribe_slot"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"slot" INT
) RETURNS void
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'unsubscribe_slot3_wrapper';

CREATE OR REPLACE FUNCTION "unsubscribe_subconsumer"(
	"queue_name" TEXT,
	"consumer" TEXT,
	"subconsumer" TEXT,
	"batch_handling" INT DEFAULT 0
) RETURNS INT
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'unsubscribe_subconsumer_wrapper';

CREATE OR REPLACE FUNCTION "jsontriga"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'jsontriga_wrapper';

CREATE OR REPLACE FUNCTION "logutriga"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'logutriga_wrapper';

CREATE OR REPLACE FUNCTION "sqltriga"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'sqltriga_wrapper';

CREATE PROCEDURE pgque.ticker_loop()
LANGUAGE plpgsql
AS $body$
DECLARE
    period_ms int4;
BEGIN
    LOOP
        PERFORM pgque.ticker();
        SELECT coalesce(w.tick_period_ms,
                        pg_catalog.current_setting('pgque.tick_period_ms')::int4)
          INTO period_ms FROM pgque.worker_config w;
        COMMIT;
        PERFORM pg_catalog.pg_sleep(period_ms / 1000.0);
    END LOOP;
END
$body$;

-- New functions are callable by PUBLIC until revoked (the install script's
-- blanket REVOKE ran before they existed).
REVOKE ALL ON FUNCTION
    pgque.consumer_stats(), pgque.create_queue(text, jsonb),
    pgque.error_rate(text, interval, interval),
    pgque.event_dead(bigint, bigint, text, timestamptz, xid8, int4, text, text, text, text, text, text),
    pgque.in_flight(text), pgque.insert_event_bulk(text, text, text[]),
    pgque.maint_deliver_delayed(), pgque.maint_idem(text),
    pgque.next_batch_custom(text, text, text, interval, int4, interval, interval),
    pgque.otel_metrics(), pgque.pause_queue(text), pgque.queue_health(), pgque.queue_stats(),
    pgque.register_subconsumer(text, text, text, boolean), pgque.resume_queue(text),
    pgque.set_tick_period_ms(int4), pgque.stuck_consumers(interval),
    pgque.subscribe_subconsumer(text, text, text, boolean),
    pgque.throughput(text, interval, interval), pgque.uninstall(),
    pgque.unsubscribe_slot(text, text, int4), pgque.unsubscribe_subconsumer(text, text, text, int4),
    pgque.jsontriga(), pgque.logutriga(), pgque.sqltriga()
  FROM PUBLIC;
REVOKE ALL ON PROCEDURE pgque.ticker_loop() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgque.register_subconsumer(text, text, text, boolean),
    pgque.subscribe_subconsumer(text, text, text, boolean),
    pgque.unsubscribe_subconsumer(text, text, text, int4),
    pgque.next_batch_custom(text, text, text, interval, int4, interval, interval)
  TO pgque_reader;

-- ---- PgQue's API beyond section 1 (DESIGN.md section 11) -----------------------------
-- insert_event_bulk and uninstall: no role (owner / superuser only), as in PgQue.
GRANT EXECUTE ON FUNCTION
    pgque.event_dead(bigint, bigint, text, timestamptz, xid8, int4, text, text, text, text, text, text),
    pgque.create_queue(text, jsonb), pgque.pause_queue(text), pgque.resume_queue(text),
    pgque.set_tick_period_ms(int4), pgque.maint_idem(text), pgque.maint_deliver_delayed()
  TO pgque_admin;
GRANT EXECUTE ON PROCEDURE pgque.ticker_loop() TO pgque_admin;
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

-- The install script's function settings, for the new functions (settings
-- already set on the others are set again in place).
DO $seqscan$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'pgque'::regnamespace
                AND p.proname = ANY (ARRAY[
                    'subscribe', 'unsubscribe', 'receive',
                    'ack', 'nack', 'register_consumer', 'register_consumer_at', 'unregister_consumer',
                    'next_batch', 'next_batch_info', 'next_batch_custom', 'get_batch_events',
                    'get_batch_cursor', 'finish_batch', 'event_retry', 'batch_retry',
                    'register_subconsumer', 'subscribe_subconsumer', 'unregister_subconsumer',
                    'receive_coop', 'touch_subconsumer', 'dlq_inspect', 'dlq_replay', 'dlq_replay_all',
                    'dlq_purge', 'create_queue', 'drop_queue', 'set_queue_config', 'ticker',
                    'force_next_tick', 'force_tick', 'maint', 'maint_retry_events',
                    'get_queue_info', 'get_consumer_info', 'get_batch_info',
                    'send_idem', 'maint_idem', 'send_at', 'maint_delayed',
                    'subscribe_partitioned', 'unsubscribe_partitioned', 'subscribe_slot',
                    'unsubscribe_slot', 'claim_slot', 'claim_next_slot', 'release_slot',
                    'receive_partitioned', 'ack_partitioned', 'nack_partitioned',
                    'partition_slot_rows', 'event_dead', 'unsubscribe_subconsumer',
                    'pause_queue', 'resume_queue', 'queue_stats', 'consumer_stats',
                    'queue_health', 'otel_metrics', 'stuck_consumers', 'in_flight', 'throughput',
                    'error_rate'])
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET enable_seqscan = off', f);
    END LOOP;
END
$seqscan$;

DO $generic$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'pgque'::regnamespace
                AND p.proname = ANY (ARRAY[
                    'receive', 'receive_coop', 'next_batch', 'next_batch_info',
                    'next_batch_custom', 'get_batch_events', 'get_batch_cursor',
                    'receive_partitioned'])
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan', f);
    END LOOP;
END
$generic$;

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

-- ==== job outputs, progress, cancellation seen by the worker (issue 19) ====
-- Outputs: pgque.jobs.output, and in the log job_done.outputs (written with
-- the done row); progress: pgque.jobs.progress, and in the log appended rows
-- of pgque.job_progress (truncated with their segment). complete and
-- complete_many take the outputs (a changed signature: dropped and created
-- again, with their grants); all_jobs / get_job show both.
ALTER TABLE pgque.jobs ADD COLUMN output jsonb, ADD COLUMN progress jsonb;
ALTER TABLE pgque.job_done ADD COLUMN outputs jsonb[];
CREATE SEQUENCE pgque.job_progress_id_seq AS bigint;
CREATE TABLE pgque.job_progress (
    seg      smallint NOT NULL,
    id       bigint NOT NULL,
    claim_id bigint NOT NULL,
    job_id   bigint NOT NULL,
    progress jsonb NOT NULL,
    at       timestamptz NOT NULL
) PARTITION BY LIST (seg);
CREATE TABLE pgque.job_progress_0 PARTITION OF pgque.job_progress FOR VALUES IN (0);
CREATE TABLE pgque.job_progress_1 PARTITION OF pgque.job_progress FOR VALUES IN (1);
CREATE TABLE pgque.job_progress_2 PARTITION OF pgque.job_progress FOR VALUES IN (2);
CREATE INDEX job_progress_job_idx ON pgque.job_progress (job_id, id);
SELECT pg_catalog.pg_extension_config_dump('pgque.job_progress_0', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_progress_1', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_progress_2', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_progress_id_seq', '');
REVOKE ALL ON TABLE pgque.job_progress, pgque.job_progress_0, pgque.job_progress_1,
    pgque.job_progress_2 FROM PUBLIC;

CREATE OR REPLACE VIEW pgque.job_log_jobs AS
WITH lanes AS (
    SELECT l.*, GREATEST(l.cursor_floor,
                         (SELECT max(c.hi) FROM pgque.job_claims c WHERE c.lane_id = l.lane_id)) AS cur
    FROM pgque.job_lanes l
),
claimed AS (
    SELECT c.lane_id, c.claim_id, c.worker, c.dispatched_at, c.lease_until, m.job_id
    FROM pgque.job_claims c CROSS JOIN LATERAL unnest(c.job_ids) AS m(job_id)
    WHERE c.state <> 's'
),
done AS (
    SELECT d.claim_id, d.at, m.job_id, m.output
    FROM pgque.job_done d CROSS JOIN LATERAL unnest(d.job_ids, d.outputs) AS m(job_id, output)
    WHERE d.kind = 'c'
),
jobs AS (
    SELECT COALESCE(r.ids[u.ord], r.id_lo + u.ord - 1) AS id, l.queue, l.priority, l.shard,
           r.lane_id, l.cur, u.kind, u.args,
           COALESCE(u.run_at, r.enqueued_at) AS run_at,
           COALESCE(u.max_attempts, r.max_attempts) AS max_attempts,
           u.fairness_key, r.enqueued_at
    FROM pgque.job_log r
    JOIN lanes l ON l.lane_id = r.lane_id
    CROSS JOIN LATERAL unnest(r.kinds, r.args, r.run_ats, r.job_max_attempts, r.fairness_keys)
         WITH ORDINALITY AS u(kind, args, run_at, max_attempts, fairness_key, ord)
)
SELECT j.id, j.queue, j.kind, j.args, j.priority, j.shard,
       CASE WHEN c.claim_id IS NULL THEN 'ready'
            WHEN d.claim_id IS NOT NULL THEN 'completed'
            ELSE 'running' END AS state,
       j.run_at,
       CASE WHEN c.claim_id IS NULL THEN 0 ELSE 1 END AS attempt,
       j.max_attempts, j.fairness_key, j.enqueued_at,
       c.worker,
       CASE WHEN d.claim_id IS NULL THEN c.claim_id END AS lease_token,
       CASE WHEN d.claim_id IS NULL THEN c.lease_until END AS lease_until,
       c.dispatched_at, d.at AS finished_at, j.lane_id, d.output,
       (SELECT p.progress FROM pgque.job_progress p
        WHERE p.job_id = j.id AND p.claim_id = c.claim_id ORDER BY p.id DESC LIMIT 1) AS progress
FROM jobs j
LEFT JOIN claimed c ON c.lane_id = j.lane_id AND c.job_id = j.id
LEFT JOIN done d ON d.claim_id = c.claim_id AND d.job_id = j.id
WHERE NOT EXISTS (SELECT 1 FROM pgque.jobs s WHERE s.id = j.id)
  AND (c.claim_id IS NOT NULL OR j.id > j.cur);

CREATE OR REPLACE VIEW pgque.all_jobs AS
SELECT s.id, s.queue, s.kind, s.args, s.priority, s.state, s.run_at, s.attempt,
       s.max_attempts, s.actor, s.fairness_key, s.identity_key, s.unique_key,
       s.enqueued_at, s.worker, s.lease_token, s.lease_until, s.dispatched_at,
       s.finished_at, s.errors, s.shard, 'jobs'::text AS stored_in, s.output, s.progress
FROM pgque.jobs s
UNION ALL
SELECT g.id, g.queue, g.kind, g.args, g.priority, g.state, g.run_at, g.attempt,
       g.max_attempts, NULL, g.fairness_key, NULL, NULL,
       g.enqueued_at, g.worker, g.lease_token, g.lease_until, g.dispatched_at,
       g.finished_at, NULL, g.shard, 'log'::text, g.output, g.progress
FROM pgque.job_log_jobs g;

CREATE OR REPLACE FUNCTION pgque.get_job(job_id bigint) RETURNS SETOF pgque.all_jobs
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
AS $get_job$
SELECT s.id, s.queue, s.kind, s.args, s.priority, s.state, s.run_at, s.attempt,
       s.max_attempts, s.actor, s.fairness_key, s.identity_key, s.unique_key,
       s.enqueued_at, s.worker, s.lease_token, s.lease_until, s.dispatched_at,
       s.finished_at, s.errors, s.shard, 'jobs'::text, s.output, s.progress
FROM pgque.jobs s WHERE s.id = $1
UNION ALL
SELECT $1, f.queue, u.kind, u.args, f.priority,
       CASE WHEN c.claim_id IS NULL THEN 'ready'
            WHEN d.claim_id IS NOT NULL THEN 'completed'
            ELSE 'running' END,
       COALESCE(u.run_at, f.enqueued_at),
       CASE WHEN c.claim_id IS NULL THEN 0 ELSE 1 END,
       COALESCE(u.ma, f.max_attempts), NULL, u.fk, NULL, NULL,
       f.enqueued_at, c.worker,
       CASE WHEN d.claim_id IS NULL THEN c.claim_id END,
       CASE WHEN d.claim_id IS NULL THEN c.lease_until END,
       c.dispatched_at, d.at, NULL, f.shard, 'log'::text,
       d.outputs[array_position(d.job_ids, $1)],
       (SELECT p.progress FROM pgque.job_progress p
        WHERE p.job_id = $1 AND p.claim_id = c.claim_id ORDER BY p.id DESC LIMIT 1)
FROM (
    SELECT l.lane_id, l.queue, l.priority, l.shard, r.id_lo, r.ids, r.enqueued_at,
           r.max_attempts, r.kinds, r.args, r.run_ats, r.job_max_attempts, r.fairness_keys,
           GREATEST(l.cursor_floor,
                    (SELECT c.hi FROM pgque.job_claims c WHERE c.lane_id = l.lane_id
                     ORDER BY c.hi DESC LIMIT 1)) AS cur
    FROM pgque.job_lanes l
    CROSS JOIN LATERAL (
        SELECT r.* FROM pgque.job_log r
        WHERE r.lane_id = l.lane_id AND r.id_hi >= $1
        ORDER BY r.id_hi LIMIT 1) r
    WHERE r.id_lo <= $1 AND (r.ids IS NULL OR $1 = ANY (r.ids))
    LIMIT 1
) f
CROSS JOIN LATERAL (
    SELECT u.* FROM unnest(f.kinds, f.args, f.run_ats, f.job_max_attempts, f.fairness_keys)
         WITH ORDINALITY AS u(kind, args, run_at, ma, fk, ord)
    WHERE COALESCE(f.ids[u.ord], f.id_lo + u.ord - 1) = $1) u
LEFT JOIN LATERAL (
    SELECT c.* FROM (
        SELECT c.* FROM pgque.job_claims c
        WHERE c.lane_id = f.lane_id AND c.hi >= $1
        ORDER BY c.hi LIMIT 1) c
    WHERE c.state::text <> 's' AND $1 = ANY (c.job_ids)) c ON true
LEFT JOIN LATERAL (
    SELECT d.* FROM pgque.job_done d
    WHERE d.claim_id = c.claim_id AND d.kind = 'c' AND $1 = ANY (d.job_ids)
    LIMIT 1) d ON true
WHERE NOT EXISTS (SELECT 1 FROM pgque.jobs s WHERE s.id = $1)
  AND (c.claim_id IS NOT NULL OR $1 > f.cur)
$get_job$;

-- complete / complete_many take the outputs: new signatures (dropped and
-- created again, with their grants and settings) on new C symbols; the old
-- symbols stay in the library for databases not updated yet
DROP FUNCTION pgque.complete(bigint, bigint);
CREATE FUNCTION pgque."complete"(
	"job_id" bigint,
	"lease_token" bigint,
	"output" jsonb DEFAULT NULL
) RETURNS bool
SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'complete_with_output_wrapper';
DROP FUNCTION pgque.complete_many(bigint[], bigint[]);
CREATE FUNCTION pgque."complete_many"(
	"job_ids" bigint[],
	"lease_tokens" bigint[],
	"outputs" jsonb[] DEFAULT NULL
) RETURNS INT
SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'complete_many_with_outputs_wrapper';
CREATE FUNCTION pgque."set_progress"(
	"job_id" bigint,
	"lease_token" bigint,
	"progress" jsonb
) RETURNS bool
SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_progress_wrapper';
ALTER FUNCTION pgque.get_job(bigint) SET jit = off;
REVOKE ALL ON FUNCTION pgque.complete(bigint, bigint, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgque.complete_many(bigint[], bigint[], jsonb[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgque.set_progress(bigint, bigint, jsonb) FROM PUBLIC;
ALTER FUNCTION pgque.complete(bigint, bigint, jsonb) SET jit = off;
ALTER FUNCTION pgque.complete_many(bigint[], bigint[], jsonb[]) SET jit = off;
ALTER FUNCTION pgque.set_progress(bigint, bigint, jsonb) SET jit = off;
GRANT EXECUTE ON FUNCTION pgque.complete(bigint, bigint, jsonb) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.complete_many(bigint[], bigint[], jsonb[]) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.set_progress(bigint, bigint, jsonb) TO pgque_reader;
-- ==== end of job outputs, progress, cancellation (issue 19) ====

-- ==== flows: jobs that run after other jobs (issue 19) ====
-- Waiting jobs and their parents are rows of pgque.jobs (new columns, a new
-- state 'waiting'); the edges are pgque.job_deps. enqueue takes depends_on
-- (a changed signature: dropped and created again, with its grant).
ALTER TABLE pgque.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE pgque.jobs ADD CONSTRAINT jobs_state_check CHECK (state IN
    ('waiting', 'scheduled', 'ready', 'running', 'completed', 'failed', 'cancelled'));
ALTER TABLE pgque.jobs ADD COLUMN flow_id bigint, ADD COLUMN flow_key text,
    ADD COLUMN pending_parents int, ADD COLUMN run_on_parent_failure boolean,
    ADD COLUMN has_children boolean;
CREATE INDEX jobs_flow_idx ON pgque.jobs (flow_id) WHERE flow_id IS NOT NULL;
CREATE SEQUENCE pgque.job_flow_id_seq AS bigint;
CREATE TABLE pgque.job_deps (
    parent_id bigint NOT NULL,
    child_id  bigint NOT NULL,
    PRIMARY KEY (parent_id, child_id)
);
-- a child's parents (job_parents, and pruning with the child)
CREATE INDEX job_deps_child_idx ON pgque.job_deps (child_id);

-- The parents of a job: id, key in its flow, state and output (NULL state:
-- the parent was pruned). A worker reads its parents' outputs here.
CREATE FUNCTION pgque.job_parents(child_id bigint)
RETURNS TABLE (job_id bigint, key text, state text, output jsonb)
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
AS $job_parents$
SELECT d.parent_id, p.flow_key, COALESCE(p.state, g.state), COALESCE(p.output, g.output)
FROM pgque.job_deps d
LEFT JOIN pgque.jobs p ON p.id = d.parent_id
LEFT JOIN LATERAL (SELECT g.state, g.output FROM pgque.get_job(d.parent_id) g
                   WHERE p.id IS NULL) g ON true
WHERE d.child_id = $1
ORDER BY d.parent_id
$job_parents$;

-- How many jobs of a flow are in each state (no row: no such flow, or all
-- its jobs were pruned).
CREATE FUNCTION pgque.flow_status(flow bigint)
RETURNS TABLE (flow_id bigint, total bigint, waiting bigint, scheduled bigint, ready bigint,
               running bigint, completed bigint, failed bigint, cancelled bigint)
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
AS $flow_status$
SELECT $1, count(*),
       count(*) FILTER (WHERE j.state = 'waiting'),
       count(*) FILTER (WHERE j.state = 'scheduled'),
       count(*) FILTER (WHERE j.state = 'ready'),
       count(*) FILTER (WHERE j.state = 'running'),
       count(*) FILTER (WHERE j.state = 'completed'),
       count(*) FILTER (WHERE j.state = 'failed'),
       count(*) FILTER (WHERE j.state = 'cancelled')
FROM pgque.jobs j WHERE j.flow_id = $1
HAVING count(*) > 0
$flow_status$;

SELECT pg_catalog.pg_extension_config_dump('pgque.job_deps', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_flow_id_seq', '');
REVOKE ALL ON TABLE pgque.job_deps FROM PUBLIC;
REVOKE ALL ON FUNCTION pgque.job_parents(bigint), pgque.flow_status(bigint) FROM PUBLIC;
ALTER FUNCTION pgque.job_parents(bigint) SET jit = off;
ALTER FUNCTION pgque.flow_status(bigint) SET jit = off;
GRANT EXECUTE ON FUNCTION pgque.job_parents(bigint) TO pgque_reader, pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.flow_status(bigint) TO pgque_reader, pgque_admin;

-- job_queue_status counts the waiting jobs (a new last column)
CREATE OR REPLACE VIEW pgque.job_queue_status AS
WITH lanes AS MATERIALIZED (
    SELECT l.lane_id, l.queue, l.priority, l.shard,
           GREATEST(l.cursor_floor,
                    (SELECT c.hi FROM pgque.job_claims c WHERE c.lane_id = l.lane_id
                     ORDER BY c.hi DESC LIMIT 1)) AS cur
    FROM pgque.job_lanes l
),
-- the log rows above each lane's cursor (its backlog, read by key: the jobs'
-- arrays stay in TOAST), with how many of their jobs are ready there (above
-- the cursor, not holes) and the oldest run_at among those
backlog AS (
    SELECT l.lane_id, x.n, x.oldest
    FROM lanes l
    JOIN pgque.job_log r ON r.lane_id = l.lane_id AND r.id_hi > l.cur
    CROSS JOIN LATERAL (
        SELECT h.c AS holes FROM (
            SELECT count(*) AS c FROM pgque.job_log_holes h
            WHERE h.lane_id = l.lane_id AND h.job_id > GREATEST(l.cur, r.id_lo - 1)
              AND h.job_id <= r.id_hi) h) hh
    CROSS JOIN LATERAL (
        SELECT CASE WHEN r.id_lo > l.cur THEN r.n
                    WHEN r.ids IS NULL THEN r.id_hi - l.cur
                    ELSE (SELECT count(*) FROM unnest(r.ids) AS i WHERE i > l.cur) END
               - hh.holes AS n,
               CASE WHEN r.run_ats IS NULL AND hh.holes = 0 THEN r.enqueued_at
                    ELSE (SELECT min(COALESCE(u.t, r.enqueued_at))
                          FROM unnest(r.run_ats) WITH ORDINALITY AS u(t, o)
                          WHERE COALESCE(r.ids[u.o], r.id_lo + u.o - 1) > l.cur
                            AND NOT EXISTS (SELECT 1 FROM pgque.job_log_holes h
                                            WHERE h.lane_id = l.lane_id
                                              AND h.job_id = COALESCE(r.ids[u.o], r.id_lo + u.o - 1)))
               END AS oldest) x
),
-- per lane: the jobs of its active claims, the done rows of those (what is
-- still running is the difference), and the jobs its claims completed
claimed AS (
    SELECT c.lane_id, sum(cardinality(c.job_ids)) AS active
    FROM pgque.job_claims c WHERE c.state::text = 'a'
    GROUP BY c.lane_id
),
finished AS (
    SELECT c.lane_id,
           sum(cardinality(d.job_ids)) FILTER (WHERE c.state::text = 'a') AS active_done,
           sum(cardinality(d.job_ids)) FILTER (WHERE d.kind = 'c') AS completed
    FROM pgque.job_done d JOIN pgque.job_claims c ON c.claim_id = d.claim_id
    WHERE c.state::text <> 's'
    GROUP BY c.lane_id
),
log_lanes AS (
    SELECT l.queue, l.priority, l.shard,
           COALESCE(b.ready, 0)::bigint AS ready, b.oldest,
           (COALESCE(a.active, 0) - COALESCE(f.active_done, 0))::bigint AS running,
           COALESCE(f.completed, 0)::bigint AS completed
    FROM lanes l
    LEFT JOIN (SELECT b.lane_id, sum(b.n) AS ready, min(b.oldest) FILTER (WHERE b.n > 0) AS oldest
               FROM backlog b GROUP BY b.lane_id) b ON b.lane_id = l.lane_id
    LEFT JOIN claimed a ON a.lane_id = l.lane_id
    LEFT JOIN finished f ON f.lane_id = l.lane_id
),
side AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.state = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE j.state = 'ready')     AS ready,
           count(*) FILTER (WHERE j.state = 'running')   AS running,
           count(*) FILTER (WHERE j.state = 'completed') AS completed,
           count(*) FILTER (WHERE j.state = 'failed')    AS failed,
           count(*) FILTER (WHERE j.state = 'cancelled') AS cancelled,
           min(j.run_at) FILTER (WHERE j.state = 'ready') AS oldest,
           count(*) FILTER (WHERE j.state = 'waiting')   AS waiting
    FROM pgque.jobs j GROUP BY j.queue
),
-- the lanes (priority, shard) holding a job not finished yet, in either store
live AS (
    SELECT j.queue, j.priority, j.shard FROM pgque.jobs j
    WHERE j.state IN ('waiting', 'scheduled', 'ready', 'running')
    UNION
    SELECT g.queue, g.priority, g.shard FROM log_lanes g WHERE g.ready > 0 OR g.running > 0
)
SELECT q.queue_name,
       q.mode,
       q.paused,
       COALESCE(s.scheduled, 0) AS scheduled,
       COALESCE(s.ready, 0) + COALESCE(g.ready, 0) AS ready,
       COALESCE(s.running, 0) + COALESCE(g.running, 0) AS running,
       COALESCE(s.completed, 0) + COALESCE(g.completed, 0) AS completed,
       COALESCE(s.failed, 0) AS failed,
       COALESCE(s.cancelled, 0) AS cancelled,
       now() - LEAST(s.oldest, g.oldest) AS oldest_ready_age,
       (SELECT count(*) FROM live v WHERE v.queue = q.queue_name) AS lanes,
       COALESCE(s.waiting, 0) AS waiting
FROM pgque.job_queues q
LEFT JOIN side s ON s.queue = q.queue_name
LEFT JOIN (SELECT g.queue, sum(g.ready)::bigint AS ready, min(g.oldest) AS oldest,
                  sum(g.running)::bigint AS running, sum(g.completed)::bigint AS completed
           FROM log_lanes g GROUP BY g.queue) g ON g.queue = q.queue_name;

DROP FUNCTION pgque.enqueue(text, text, jsonb, int, timestamptz, text, text, text, text, int, text);
CREATE FUNCTION pgque."enqueue"(
	"queue_name" TEXT,
	"kind" TEXT,
	"args" jsonb DEFAULT '{}',
	"priority" INT DEFAULT 0,
	"run_at" timestamp with time zone DEFAULT NULL,
	"actor" TEXT DEFAULT NULL,
	"fairness_key" TEXT DEFAULT NULL,
	"identity_key" TEXT DEFAULT NULL,
	"unique_key" TEXT DEFAULT NULL,
	"max_attempts" INT DEFAULT NULL,
	"on_duplicate" TEXT DEFAULT 'skip',
	"depends_on" bigint[] DEFAULT NULL
) RETURNS bigint
SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'enqueue_with_parents_wrapper';
CREATE FUNCTION pgque."enqueue_flow"(
	"queue_name" TEXT,
	"jobs" jsonb
) RETURNS TABLE (
	"flow_id" bigint,
	"key" TEXT,
	"job_id" bigint
)
SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'enqueue_flow_wrapper';
REVOKE ALL ON FUNCTION pgque.enqueue(text, text, jsonb, int, timestamptz, text, text, text, text, int, text, bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgque.enqueue_flow(text, jsonb) FROM PUBLIC;
ALTER FUNCTION pgque.enqueue(text, text, jsonb, int, timestamptz, text, text, text, text, int, text, bigint[]) SET jit = off;
ALTER FUNCTION pgque.enqueue_flow(text, jsonb) SET jit = off;
GRANT EXECUTE ON FUNCTION pgque.enqueue(text, text, jsonb, int, timestamptz, text,
    text, text, text, int, text, bigint[]) TO pgque_writer;
GRANT EXECUTE ON FUNCTION pgque.enqueue_flow(text, jsonb) TO pgque_writer;
-- ==== end of flows (issue 19) ====

-- ==== sharding (issue 23) ====
-- pgque.all_events: what a server stores for a queue (src/api/stored.rs,
-- docs/scale-out.md).
CREATE FUNCTION pgque."all_events"(
	"queue_name" TEXT
) RETURNS TABLE (
	"ev_id" bigint,
	"ev_type" TEXT,
	"ev_data" TEXT,
	"ev_extra1" TEXT,
	"ev_extra2" TEXT,
	"ev_extra3" TEXT,
	"ev_extra4" TEXT,
	"ev_time" timestamp with time zone
)
STABLE SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'all_events_wrapper';
REVOKE ALL ON FUNCTION pgque.all_events(text) FROM PUBLIC;
ALTER FUNCTION pgque.all_events(text) SET jit = off;
GRANT EXECUTE ON FUNCTION pgque.all_events(text) TO pgque_admin;
-- ==== end of sharding (issue 23) ====

-- ==== event-queue performance (issue 25) ====
-- The send path (send, send_batch, insert_event) has invoker's rights and no
-- settings: it switches to pgque's owner itself and qualifies every name
-- (src/api/owner.rs), so a call no longer saves and restores search_path.
ALTER FUNCTION pgque.send(text, jsonb) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.send(text, text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.send(text, text, jsonb) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.send(text, text, text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.send(text, text, jsonb, text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.send(text, text, text, text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.send_batch(text, jsonb[]) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.send_batch(text, text[]) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.send_batch(text, text, jsonb[]) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.send_batch(text, text, text[]) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.send_batch(text, text, jsonb[], text[]) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.send_batch(text, text, text[], text[]) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.insert_event(text, text, text) SECURITY INVOKER RESET search_path;
ALTER FUNCTION pgque.insert_event(text, text, text, text, text, text, text) SECURITY INVOKER RESET search_path;
-- ==== end of event-queue performance (issue 25) ====

-- ==== metrics speed (issue 21) ====
-- job_queue_status (and so metrics()) summed cardinality(job_ids) of every
-- claim and done row in the job log's retention: with claims of a few
-- hundred jobs or more the arrays are TOASTed, so every completed job id was
-- read and decompressed (1M completed jobs in claims of 1000: ~200 ms a
-- scrape, benches/results/metrics.md). Claims and done rows now carry their
-- job count n, a stored generated column (every writer stores it, exactly,
-- and no hot-path statement changes); the view sums n. ADD COLUMN rewrites
-- the claim and done partitions once, which computes n for the rows already
-- there, so an updated database shows the same figures as before.
ALTER TABLE pgque.job_claims ADD COLUMN n int GENERATED ALWAYS AS (cardinality(job_ids)) STORED;
ALTER TABLE pgque.job_done ADD COLUMN n int GENERATED ALWAYS AS (cardinality(job_ids)) STORED;

CREATE OR REPLACE VIEW pgque.job_queue_status AS
WITH lanes AS MATERIALIZED (
    SELECT l.lane_id, l.queue, l.priority, l.shard,
           GREATEST(l.cursor_floor,
                    (SELECT c.hi FROM pgque.job_claims c WHERE c.lane_id = l.lane_id
                     ORDER BY c.hi DESC LIMIT 1)) AS cur
    FROM pgque.job_lanes l
),
-- the log rows above each lane's cursor (its backlog, read by key: the jobs'
-- arrays stay in TOAST), with how many of their jobs are ready there (above
-- the cursor, not holes) and the oldest run_at among those
backlog AS (
    SELECT l.lane_id, x.n, x.oldest
    FROM lanes l
    JOIN pgque.job_log r ON r.lane_id = l.lane_id AND r.id_hi > l.cur
    CROSS JOIN LATERAL (
        SELECT h.c AS holes FROM (
            SELECT count(*) AS c FROM pgque.job_log_holes h
            WHERE h.lane_id = l.lane_id AND h.job_id > GREATEST(l.cur, r.id_lo - 1)
              AND h.job_id <= r.id_hi) h) hh
    CROSS JOIN LATERAL (
        SELECT CASE WHEN r.id_lo > l.cur THEN r.n
                    WHEN r.ids IS NULL THEN r.id_hi - l.cur
                    ELSE (SELECT count(*) FROM unnest(r.ids) AS i WHERE i > l.cur) END
               - hh.holes AS n,
               CASE WHEN r.run_ats IS NULL AND hh.holes = 0 THEN r.enqueued_at
                    ELSE (SELECT min(COALESCE(u.t, r.enqueued_at))
                          FROM unnest(r.run_ats) WITH ORDINALITY AS u(t, o)
                          WHERE COALESCE(r.ids[u.o], r.id_lo + u.o - 1) > l.cur
                            AND NOT EXISTS (SELECT 1 FROM pgque.job_log_holes h
                                            WHERE h.lane_id = l.lane_id
                                              AND h.job_id = COALESCE(r.ids[u.o], r.id_lo + u.o - 1)))
               END AS oldest) x
),
-- per lane: the jobs of its active claims, the done rows of those (what is
-- still running is the difference), and the jobs its claims completed
claimed AS (
    SELECT c.lane_id, sum(c.n) AS active
    FROM pgque.job_claims c WHERE c.state::text = 'a'
    GROUP BY c.lane_id
),
finished AS (
    SELECT c.lane_id,
           sum(d.n) FILTER (WHERE c.state::text = 'a') AS active_done,
           sum(d.n) FILTER (WHERE d.kind = 'c') AS completed
    FROM pgque.job_done d JOIN pgque.job_claims c ON c.claim_id = d.claim_id
    WHERE c.state::text <> 's'
    GROUP BY c.lane_id
),
log_lanes AS (
    SELECT l.queue, l.priority, l.shard,
           COALESCE(b.ready, 0)::bigint AS ready, b.oldest,
           (COALESCE(a.active, 0) - COALESCE(f.active_done, 0))::bigint AS running,
           COALESCE(f.completed, 0)::bigint AS completed
    FROM lanes l
    LEFT JOIN (SELECT b.lane_id, sum(b.n) AS ready, min(b.oldest) FILTER (WHERE b.n > 0) AS oldest
               FROM backlog b GROUP BY b.lane_id) b ON b.lane_id = l.lane_id
    LEFT JOIN claimed a ON a.lane_id = l.lane_id
    LEFT JOIN finished f ON f.lane_id = l.lane_id
),
side AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.state = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE j.state = 'ready')     AS ready,
           count(*) FILTER (WHERE j.state = 'running')   AS running,
           count(*) FILTER (WHERE j.state = 'completed') AS completed,
           count(*) FILTER (WHERE j.state = 'failed')    AS failed,
           count(*) FILTER (WHERE j.state = 'cancelled') AS cancelled,
           min(j.run_at) FILTER (WHERE j.state = 'ready') AS oldest,
           count(*) FILTER (WHERE j.state = 'waiting')   AS waiting
    FROM pgque.jobs j GROUP BY j.queue
),
-- the lanes (priority, shard) holding a job not finished yet, in either store
live AS (
    SELECT j.queue, j.priority, j.shard FROM pgque.jobs j
    WHERE j.state IN ('waiting', 'scheduled', 'ready', 'running')
    UNION
    SELECT g.queue, g.priority, g.shard FROM log_lanes g WHERE g.ready > 0 OR g.running > 0
)
SELECT q.queue_name,
       q.mode,
       q.paused,
       COALESCE(s.scheduled, 0) AS scheduled,
       COALESCE(s.ready, 0) + COALESCE(g.ready, 0) AS ready,
       COALESCE(s.running, 0) + COALESCE(g.running, 0) AS running,
       COALESCE(s.completed, 0) + COALESCE(g.completed, 0) AS completed,
       COALESCE(s.failed, 0) AS failed,
       COALESCE(s.cancelled, 0) AS cancelled,
       now() - LEAST(s.oldest, g.oldest) AS oldest_ready_age,
       (SELECT count(*) FROM live v WHERE v.queue = q.queue_name) AS lanes,
       COALESCE(s.waiting, 0) AS waiting
FROM pgque.job_queues q
LEFT JOIN side s ON s.queue = q.queue_name
LEFT JOIN (SELECT g.queue, sum(g.ready)::bigint AS ready, min(g.oldest) AS oldest,
                  sum(g.running)::bigint AS running, sum(g.completed)::bigint AS completed
           FROM log_lanes g GROUP BY g.queue) g ON g.queue = q.queue_name;
-- ==== end of metrics speed (issue 21) ====

-- ==== idle workers (issue 23) ====
-- When each duty next has work, read by an idle worker (src/worker/due.rs).
CREATE FUNCTION pgque."duty_due"() RETURNS TABLE (
	"duty" TEXT,
	"due_in" double precision
)
STRICT SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'duty_due_wrapper';
-- as 99_finalize.sql does for every function but the send ones
ALTER FUNCTION pgque.duty_due() SET jit = off;
REVOKE ALL ON FUNCTION pgque.duty_due() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.duty_due() TO pgque_admin, pgque_reader;
-- ==== end of idle workers (issue 23) ====

-- ==== rate limits (issue 18) ====
-- Token buckets per queue and per actor: sql/33_rate_limits.sql, src/jobs/rate.rs
-- (docs/rate-limits.md). Dispatch reads them from the new library.
CREATE TABLE pgque.job_rate_limits (
    queue_name  text PRIMARY KEY REFERENCES pgque.job_queues (queue_name) ON DELETE CASCADE,
    jobs        int NOT NULL CHECK (jobs >= 1),
    per         interval NOT NULL,
    burst       int NOT NULL CHECK (burst >= 1),
    tokens      float8 NOT NULL CHECK (tokens >= 0),
    refilled_at timestamptz NOT NULL
) WITH (fillfactor = 20,
        autovacuum_vacuum_threshold = 50,
        autovacuum_vacuum_scale_factor = 0.0,
        autovacuum_analyze_threshold = 50);

-- Per actor: the bucket lives in the actor's row, which dispatch already
-- locks (actor_locks) and updates (act); NULL rate_jobs: no limit.
ALTER TABLE pgque.job_actors
    ADD COLUMN rate_jobs   int CHECK (rate_jobs >= 1),
    ADD COLUMN rate_per    interval,
    ADD COLUMN rate_burst  int CHECK (rate_burst >= 1),
    ADD COLUMN tokens      float8 CHECK (tokens >= 0),
    ADD COLUMN refilled_at timestamptz;

SELECT pg_catalog.pg_extension_config_dump('pgque.job_rate_limits', '');

-- Every limit with the tokens its bucket holds now (pgque_reader): the
-- stored tokens plus the refill since refilled_at, as dispatch computes it.
CREATE VIEW pgque.rate_limits AS
SELECT 'queue'::text AS scope, b.queue_name AS name, b.jobs, b.per, b.burst,
       LEAST(b.burst::float8, b.tokens + b.jobs::float8
             * GREATEST(0, EXTRACT(EPOCH FROM statement_timestamp() - b.refilled_at))::float8
             / EXTRACT(EPOCH FROM b.per)::float8) AS tokens
FROM pgque.job_rate_limits b
UNION ALL
SELECT 'actor'::text, a.actor, a.rate_jobs, a.rate_per, a.rate_burst,
       LEAST(a.rate_burst::float8, a.tokens + a.rate_jobs::float8
             * GREATEST(0, EXTRACT(EPOCH FROM statement_timestamp() - a.refilled_at))::float8
             / EXTRACT(EPOCH FROM a.rate_per)::float8)
FROM pgque.job_actors a
WHERE a.rate_jobs IS NOT NULL;

CREATE FUNCTION pgque."set_rate_limit"(
	"queue_name" TEXT,
	"jobs" INT,
	"per" interval,
	"burst" INT DEFAULT NULL
) RETURNS void
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_rate_limit_wrapper';

CREATE FUNCTION pgque."set_actor_rate_limit"(
	"actor" TEXT,
	"jobs" INT,
	"per" interval,
	"burst" INT DEFAULT NULL
) RETURNS void
SECURITY DEFINER
SET search_path TO pg_catalog, pgque, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_actor_rate_limit_wrapper';

-- Nothing new is PUBLIC's (as sql/99_finalize.sql).
REVOKE ALL ON pgque.job_rate_limits, pgque.rate_limits FROM PUBLIC;
REVOKE ALL ON FUNCTION pgque.set_rate_limit(text, int, interval, int),
    pgque.set_actor_rate_limit(text, int, interval, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.set_rate_limit(text, int, interval, int),
    pgque.set_actor_rate_limit(text, int, interval, int) TO pgque_admin;
ALTER FUNCTION pgque.set_rate_limit(text, int, interval, int) SET jit = off;
ALTER FUNCTION pgque.set_actor_rate_limit(text, int, interval, int) SET jit = off;
GRANT SELECT ON pgque.rate_limits TO pgque_reader, pgque_admin;
-- ==== end rate limits (issue 18) ====
