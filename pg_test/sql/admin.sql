-- Administration basics: version (the library's is the installed one), status rows, roles and the message type.
SELECT pgque.version() = extversion AS same_version FROM pg_extension WHERE extname = 'pgque';
SELECT component, status FROM pgque.status() WHERE component = 'mode';
SELECT rolname FROM pg_roles WHERE rolname LIKE 'pgque\_%' ORDER BY 1;
SELECT attname, format_type(atttypid, atttypmod)
  FROM pg_attribute WHERE attrelid = 'pgque.message'::regclass AND attnum > 0 ORDER BY attnum;
-- PUBLIC can execute nothing in the schema.
SELECT count(*) AS public_executable
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'pgque' AND has_function_privilege('public', p.oid, 'EXECUTE');
-- The roles reach the worker switch and status through the functions only.
SET ROLE pgque_reader;
SELECT count(*) > 0 AS reader_sees_status FROM pgque.status();
SELECT pgque.stop();
RESET ROLE;
SET ROLE pgque_admin;
SELECT pgque.stop() AS was_on;
SELECT worker_enabled FROM pgque.worker_config;
SELECT pgque.start() AS started;
RESET ROLE;
SELECT worker_enabled FROM pgque.worker_config;
