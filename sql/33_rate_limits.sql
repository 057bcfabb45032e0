-- Rate limits (token buckets): src/jobs/rate.rs, docs/rate-limits.md.
--
-- A bucket holds up to `burst` tokens and gains `jobs` tokens per `per`;
-- dispatch starts a job only for a whole token and takes it. The state is
-- (tokens, refilled_at): the tokens left at refilled_at; the refill since is
-- computed when the bucket is read, so an idle bucket is never written.

-- Per queue. Locked (FOR UPDATE, queue order) by dispatch's first statement
-- (LOCK_LANES_SQL) and debited with what the call claimed, in the same
-- transaction. Update-hot: tiny rows, no indexed column ever changes (HOT),
-- fillfactor 20 leaves each row's page room for its versions.
CREATE TABLE pgque.job_rate_limits (
    queue_name  text PRIMARY KEY REFERENCES pgque.job_queues (queue_name) ON DELETE CASCADE,
    jobs        int NOT NULL CHECK (jobs >= 1),
    per         interval NOT NULL,
    burst       int NOT NULL CHECK (burst >= 1),
    tokens      float8 NOT NULL CHECK (tokens >= 0),
    refilled_at timestamptz NOT NULL
) WITH (fillfactor = 20,
        autovacuum_vacuum_threshold = 50,
        autovacuum_vacuum_scale_factor = 0.0,
        autovacuum_analyze_threshold = 50);

-- Per actor: the bucket lives in the actor's row, which dispatch already
-- locks (actor_locks) and updates (act); NULL rate_jobs: no limit.
ALTER TABLE pgque.job_actors
    ADD COLUMN rate_jobs   int CHECK (rate_jobs >= 1),
    ADD COLUMN rate_per    interval,
    ADD COLUMN rate_burst  int CHECK (rate_burst >= 1),
    ADD COLUMN tokens      float8 CHECK (tokens >= 0),
    ADD COLUMN refilled_at timestamptz;

SELECT pg_catalog.pg_extension_config_dump('pgque.job_rate_limits', '');

-- Every limit with the tokens its bucket holds now (pgque_reader): the
-- stored tokens plus the refill since refilled_at, as dispatch computes it.
CREATE VIEW pgque.rate_limits AS
SELECT 'queue'::text AS scope, b.queue_name AS name, b.jobs, b.per, b.burst,
       LEAST(b.burst::float8, b.tokens + b.jobs::float8
             * GREATEST(0, EXTRACT(EPOCH FROM statement_timestamp() - b.refilled_at))::float8
             / EXTRACT(EPOCH FROM b.per)::float8) AS tokens
FROM pgque.job_rate_limits b
UNION ALL
SELECT 'actor'::text, a.actor, a.rate_jobs, a.rate_per, a.rate_burst,
       LEAST(a.rate_burst::float8, a.tokens + a.rate_jobs::float8
             * GREATEST(0, EXTRACT(EPOCH FROM statement_timestamp() - a.refilled_at))::float8
             / EXTRACT(EPOCH FROM a.rate_per)::float8)
FROM pgque.job_actors a
WHERE a.rate_jobs IS NOT NULL;
