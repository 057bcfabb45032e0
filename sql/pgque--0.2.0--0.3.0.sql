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
DROP INDEX IF EXISTS pgque.job_events_job_idx;

-- ---- 2. new and changed functions ------------------------------------------------

-- ---- 3. pg_dump registrations (see the sql/*.sql files for why each) -------------

-- ---- 4. grants and per-function settings (as sql/99_finalize.sql) ----------------
-- New functions get their GRANT lines from sql/99_finalize.sql and, when a
-- setting list of 99_finalize.sql changes, its DO block is copied here whole.
