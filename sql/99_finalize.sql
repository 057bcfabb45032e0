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
-- Producers (pgque_writer) enqueue; consumers (pgque_reader) dispatch and
-- report outcomes; pgque_admin administers queues, actors and single jobs.
GRANT EXECUTE ON FUNCTION pgque.enqueue_ready_rows(text, text[], jsonb[], smallint[],
    timestamptz[], text[], text[], text[], text[], int[], text) TO pgque_writer;
GRANT EXECUTE ON FUNCTION pgque.enqueue(text, text, jsonb, int, timestamptz, text,
    text, text, text, int, text) TO pgque_writer;
GRANT EXECUTE ON FUNCTION pgque.create_job_queue(text, text, int) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.drop_job_queue(text, boolean) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.set_job_queue_config(text, text, text) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.pause_job_queue(text) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.resume_job_queue(text) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.set_actor_capacity(text, int) TO pgque_admin;
GRANT SELECT ON pgque.job_queue_status TO pgque_reader, pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.dispatch(text[], int, text, interval, int) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.complete(bigint, bigint) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.complete_many(bigint[], bigint[]) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.fail(bigint, bigint, text, timestamptz) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.heartbeat(bigint[], bigint[], interval) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.snooze(bigint, bigint, timestamptz) TO pgque_reader;
GRANT EXECUTE ON FUNCTION pgque.cancel(bigint) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.retry_job(bigint) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.rescue_expired_leases(int) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.promote_scheduled_jobs(int) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.sweep_job_events(int) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.prune_jobs(int) TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.job_maint() TO pgque_admin;
GRANT EXECUTE ON FUNCTION pgque.job_analyze() TO pgque_admin;

-- Start this database's worker now (a no-op without shared_preload_libraries;
-- the worker waits for this transaction to commit before it begins).
SELECT pgque.start();
