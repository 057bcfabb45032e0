-- The shared tail of every statement that takes jobs out of 'running' (src/jobs/lifecycle.rs):
-- `gone` (id, queue, actor, identity_key, attempt, event, detail) are the jobs that left.
per_actor AS MATERIALIZED (
    SELECT g.actor, count(*)::int AS n FROM gone g WHERE g.actor IS NOT NULL GROUP BY g.actor
),
act_lock AS MATERIALIZED (
    SELECT a.actor FROM pgque.job_actors a
    WHERE a.actor = ANY (ARRAY(SELECT p.actor FROM per_actor p))
    ORDER BY a.actor
    FOR UPDATE
),
act AS (
    UPDATE pgque.job_actors a SET running = greatest(a.running - p.n, 0)
    FROM per_actor p
    WHERE a.actor = p.actor AND a.actor = ANY (ARRAY(SELECT l.actor FROM act_lock l))
),
ids AS (
    DELETE FROM pgque.job_running_identities ri
    USING gone g
    WHERE ri.queue = g.queue AND ri.identity_key = g.identity_key AND ri.job_id = g.id
),
-- one event row per (queue, event, attempt, detail): a complete_many of a
-- dispatch writes one
ev AS (
    INSERT INTO pgque.job_events (job_ids, queue, event, attempt, detail)
    SELECT array_agg(g.id ORDER BY g.id), g.queue, g.event, g.attempt, g.detail
    FROM gone g
    GROUP BY g.queue, g.event, g.attempt, g.detail
)
