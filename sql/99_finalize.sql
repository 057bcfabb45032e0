-- pgque finalize: runs after every table and function exists.

-- Nothing is callable by PUBLIC; each function is granted to the narrowest role.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgque FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA pgque FROM PUBLIC;

-- ---- administration (pgque_admin) ---------------------------------------
GRANT EXECUTE ON FUNCTION pgque.start() TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.stop() TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.status() TO pgque_admin, pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.version() TO pgque_admin, pgque_reader, pgque_writer;

-- ---- event queues ---------------------------------------------------------
-- (grants of src/log and src/api functions go here)

-- ---- job queues -----------------------------------------------------------
-- (grants of src/jobs functions go here)

-- Start this database's worker now (a no-op without shared_preload_libraries;
-- the worker waits for this transaction to commit before it begins).
SELECT pgque.start();
