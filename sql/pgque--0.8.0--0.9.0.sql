-- pgque 0.8.0 -> 0.9.0 (ALTER EXTENSION pgque UPDATE).
--
-- How this file is kept right: pg_test/tests/upgrade.rs installs each released
-- version (the frozen sql/archive/pgque--<version>.sql), fills it with queues,
-- events, consumers and jobs, runs ALTER EXTENSION pgque UPDATE and compares
-- every extension object (definitions, grants, options, pg_dump
-- registrations) with a fresh 0.9.0 install; it prints the differences when
-- they disagree.
--
-- When a change to sql/*.sql or to a #[pg_extern] lands, extend this file:
--   cargo pgrx schema pg15 --no-default-features --features pg15 -o /tmp/pgque--0.9.0.sql
--   python3 scripts/upgrade_draft.py sql/archive/pgque--0.8.0.sql /tmp/pgque--0.9.0.sql \
--       --upgrade sql/pgque--0.8.0--0.9.0.sql
-- prints the new and changed statements not yet covered here.
--
-- Rules: every statement schema-qualified (the script runs with the
-- extension's search_path); nothing here may depend on data being present or
-- absent.

\echo Use "ALTER EXTENSION pgque UPDATE" to load this file. \quit

-- ==== databases pgque runs in (issue 42) ====
-- 0.9.0 installs only into UTF8 databases (sql/00_bootstrap.sql says why). A
-- database that has 0.8.0 in another encoding is updated, since refusing
-- would keep it on 0.8.0's objects under the new library, but told that
-- text outside ASCII is not kept byte for byte there.
DO $encoding$
BEGIN
    IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.<>) 'UTF8' THEN
        RAISE WARNING 'pgque supports only UTF8 databases, and this one is %', pg_catalog.getdatabaseencoding()
            USING DETAIL = 'Text outside ASCII (payloads, names, arguments) may be refused or not kept byte for byte.',
                  HINT = 'Move the data to a database with ENCODING ''UTF8'' (docs/operations.md, "Databases pgque runs in").';
    END IF;
END
$encoding$;
