-- Administration basics: version, status rows, roles and the message type.
SELECT pgque.version();
SELECT component, status FROM pgque.status() WHERE component = 'mode';
SELECT rolname FROM pg_roles WHERE rolname LIKE 'pgque\_%' ORDER BY 1;
SELECT attname, format_type(atttypid, atttypmod)
  FROM pg_attribute WHERE attrelid = 'pgque.message'::regclass AND attnum > 0 ORDER BY attnum;
-- PUBLIC can execute nothing in the schema.
SELECT count(*) AS public_executable
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'pgque' AND has_function_privilege('public', p.oid, 'EXECUTE');
