-- pgque 0.2.0 -> 0.3.0 (ALTER EXTENSION pgque UPDATE).
--
-- How this file is kept right: pg_test/tests/upgrade.rs installs each released
-- version (the frozen sql/archive/pgque--<version>.sql), fills it with queues,
-- events, consumers and jobs, runs ALTER EXTENSION pgque UPDATE and compares
-- every extension object (definitions, grants, options, pg_dump
-- registrations) with a fresh 0.3.0 install; it prints the differences when
-- they disagree.
--
-- When a change to sql/*.sql or to a #[pg_extern] lands, extend this file:
--   cargo pgrx schema pg15 --no-default-features --features pg15 -o /tmp/pgque--0.3.0.sql
--   python3 scripts/upgrade_draft.py sql/archive/pgque--0.2.0.sql /tmp/pgque--0.3.0.sql \
--       --upgrade sql/pgque--0.2.0--0.3.0.sql
-- prints the new and changed statements not yet covered here. Then:
--   bash pg_test/run.sh 15 upgrade
--
-- Rules: every statement schema-qualified (the script runs with the
-- extension's search_path); nothing here may depend on data being present or
-- absent; keep sections in the order below.

\echo Use "ALTER EXTENSION pgque UPDATE" to load this file. \quit

-- ---- 1. tables ------------------------------------------------------------------

-- job_events loses its job_id index (one btree entry less per job event, on the
-- enqueue hot path; see sql/30_jobs.sql).
-- handled: index job_events_job_idx gone
DROP INDEX IF EXISTS pgque.job_events_job_idx;

-- job_events: one row per statement and transition (job_ids lists the jobs a
-- row covers; job_id is the job of a cancel or retry_job row), and the per-job view.
-- Existing rows are single-job rows: the check holds for them.
-- handled: table job_events 7af9f9a5d5
ALTER TABLE pgque.job_events ALTER COLUMN job_id DROP NOT NULL;
ALTER TABLE pgque.job_events ADD COLUMN job_ids bigint[];
ALTER TABLE pgque.job_events
    ADD CONSTRAINT job_events_one_job_or_many CHECK ((job_id IS NULL) <> (job_ids IS NULL));
CREATE VIEW pgque.job_history AS
SELECT e.id AS event_id, e.at, COALESCE(e.job_id, m.job_id) AS job_id, e.queue, e.event,
       e.attempt, e.detail
FROM pgque.job_events e
LEFT JOIN LATERAL unnest(e.job_ids) AS m(job_id) ON true;

-- ---- 2. new and changed functions ------------------------------------------------

-- ---- 3. pg_dump registrations (see the sql/*.sql files for why each) -------------

-- ---- 4. grants and per-function settings (as sql/99_finalize.sql) ----------------
-- New functions get their GRANT lines from sql/99_finalize.sql and, when a
-- setting list of 99_finalize.sql changes, its DO block is copied here whole.
GRANT SELECT ON pgque.job_history TO pgque_admin;

-- The send functions (send, send_batch, insert_event) no longer carry
-- enable_seqscan = off and jit = off: they scan nothing, and each setting is
-- set and reset on every call. sql/99_finalize.sql now leaves them out of its
-- setting lists; every other function keeps what 0.2.0 set on it, so only
-- these two settings are reset here (which is all the changed $seqscan$ and
-- $nojit$ blocks of sql/99_finalize.sql amount to on an existing install).
-- handled: do $seqscan$ b554d6c79d
-- handled: do $nojit$ 899c6a75c0
DO $sendcfg$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'pgque'::regnamespace
                AND p.proname = ANY (ARRAY['send', 'send_batch', 'insert_event'])
    LOOP
        EXECUTE format('ALTER FUNCTION %s RESET enable_seqscan', f);
        EXECUTE format('ALTER FUNCTION %s RESET jit', f);
    END LOOP;
END
$sendcfg$;
