-- Who may call what: every pgque function against every role, generated
-- from the catalog, so a new function shows up here until its grant is
-- decided. PUBLIC must have nothing; pgque_admin (a member of both other
-- roles) can do everything the others can.
SELECT p.oid::regprocedure AS function,
       has_function_privilege('pgque_reader', p.oid, 'EXECUTE') AS reader,
       has_function_privilege('pgque_writer', p.oid, 'EXECUTE') AS writer,
       has_function_privilege('pgque_admin', p.oid, 'EXECUTE') AS admin
  FROM pg_proc p
 WHERE p.pronamespace = 'pgque'::regnamespace
 ORDER BY p.oid::regprocedure::text COLLATE "C";

-- Nothing is executable by PUBLIC.
SELECT p.oid::regprocedure AS public_executable
  FROM pg_proc p
 WHERE p.pronamespace = 'pgque'::regnamespace
   AND has_function_privilege('public', p.oid, 'EXECUTE');

-- No role but the owner touches the tables directly.
SELECT c.oid::regclass AS table_granted
  FROM pg_class c
 WHERE c.relnamespace = 'pgque'::regnamespace AND c.relkind IN ('r', 'p', 'v')
   AND (has_table_privilege('pgque_reader', c.oid, 'INSERT,UPDATE,DELETE,TRUNCATE')
        OR has_table_privilege('pgque_writer', c.oid, 'INSERT,UPDATE,DELETE,TRUNCATE')
        OR has_table_privilege('public', c.oid, 'SELECT,INSERT,UPDATE,DELETE,TRUNCATE'));

-- Every SECURITY DEFINER function pins its search_path.
SELECT p.oid::regprocedure AS definer_without_search_path
  FROM pg_proc p
 WHERE p.pronamespace = 'pgque'::regnamespace AND p.prosecdef
   AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%');

-- Every function runs with JIT off (short statements; JIT only costs),
-- except the send functions and the row triggers, which carry nothing but
-- their search_path (each setting is paid on every call, and theirs would
-- change no plan), job_channel, a pure function called inside pgque's own
-- NOTIFY statements, and the procedure ticker_loop (it COMMITs: no settings).
SELECT p.oid::regprocedure AS function_with_jit
  FROM pg_proc p
 WHERE p.pronamespace = 'pgque'::regnamespace AND p.prokind = 'f'
   AND p.proname <> ALL (ARRAY['send', 'send_batch', 'insert_event', 'insert_event_bulk',
                               'job_channel', 'logutriga', 'sqltriga', 'jsontriga',
                               'xact_lock', 'xact_lock_shared', 'try_xact_lock'])
   AND NOT coalesce('jit=off' = ANY (p.proconfig), false);
SELECT p.oid::regprocedure AS send_function, p.proconfig
  FROM pg_proc p
 WHERE p.pronamespace = 'pgque'::regnamespace
   AND p.proname = ANY (ARRAY['send', 'send_batch', 'insert_event', 'insert_event_bulk',
                              'logutriga', 'sqltriga', 'jsontriga'])
 ORDER BY 1::text;
SELECT p.oid::regprocedure AS procedure, p.proconfig
  FROM pg_proc p
 WHERE p.pronamespace = 'pgque'::regnamespace AND p.prokind = 'p';
