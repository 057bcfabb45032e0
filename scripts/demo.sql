-- What `make run` shows: the worker and its duties.
\pset footer off
\echo 'pgque version:'
SELECT pgque.version();
-- Give the worker a moment after CREATE EXTENSION.
SELECT pg_sleep(1.5);
\echo 'The background worker and its duties (pgque.status()):'
SELECT component, status, left(detail, 90) AS detail FROM pgque.status();
