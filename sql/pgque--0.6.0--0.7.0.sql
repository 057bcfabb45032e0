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
