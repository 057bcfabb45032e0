-- pgque job queues: flows, jobs that run after other jobs (src/jobs/flows.rs).
--
-- A job with parents is a row of pgque.jobs in state 'waiting' (in none of
-- the indexes dispatch walks) with pending_parents = its parents not yet
-- completed; each edge is a row here. The parent's completion counts its
-- children down and makes ready those reaching zero, in its transaction; a
-- parent that fails or is cancelled cancels its waiting children unless
-- they run anyway (run_on_parent_failure).
CREATE SEQUENCE pgque.job_flow_id_seq AS bigint;
CREATE TABLE pgque.job_deps (
    parent_id bigint NOT NULL,
    child_id  bigint NOT NULL,
    PRIMARY KEY (parent_id, child_id)
);
-- a child's parents (job_parents, and pruning with the child)
CREATE INDEX job_deps_child_idx ON pgque.job_deps (child_id);

-- Jobs enqueued behind existing jobs (enqueue(..., depends_on)) that the
-- job_maint duty has not linked yet: the writer's transaction records the
-- edges above and this row, and takes no lock on a parent, its lane or its
-- queue; the duty then marks the parents, moves those still in the job log
-- into pgque.jobs and counts the job's pending parents (flows::link_late).
CREATE TABLE pgque.job_links (child_id bigint PRIMARY KEY);

-- The parents of a job: id, key in its flow, state and output (NULL state:
-- the parent was pruned). A worker reads its parents' outputs here.
CREATE FUNCTION pgque.job_parents(child_id bigint)
RETURNS TABLE (job_id bigint, key text, state text, output jsonb)
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
AS $job_parents$
SELECT d.parent_id, p.flow_key, COALESCE(p.state, g.state), COALESCE(p.output, g.output)
FROM pgque.job_deps d
LEFT JOIN pgque.jobs p ON p.id = d.parent_id
LEFT JOIN LATERAL (SELECT g.state, g.output FROM pgque.get_job(d.parent_id) g
                   WHERE p.id IS NULL) g ON true
WHERE d.child_id = $1
ORDER BY d.parent_id
$job_parents$;

-- How many jobs of a flow are in each state (no row: no such flow, or all
-- its jobs were pruned).
CREATE FUNCTION pgque.flow_status(flow bigint)
RETURNS TABLE (flow_id bigint, total bigint, waiting bigint, scheduled bigint, ready bigint,
               running bigint, completed bigint, failed bigint, cancelled bigint)
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
AS $flow_status$
SELECT $1, count(*),
       count(*) FILTER (WHERE j.state = 'waiting'),
       count(*) FILTER (WHERE j.state = 'scheduled'),
       count(*) FILTER (WHERE j.state = 'ready'),
       count(*) FILTER (WHERE j.state = 'running'),
       count(*) FILTER (WHERE j.state = 'completed'),
       count(*) FILTER (WHERE j.state = 'failed'),
       count(*) FILTER (WHERE j.state = 'cancelled')
FROM pgque.jobs j WHERE j.flow_id = $1
HAVING count(*) > 0
$flow_status$;

SELECT pg_catalog.pg_extension_config_dump('pgque.job_deps', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_links', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_flow_id_seq', '');
