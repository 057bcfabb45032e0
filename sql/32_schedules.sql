-- pgque schedules: periodic jobs fired by the database's worker (src/schedules/).
--
-- One row per schedule. run_schedules() finds the due ones through
-- schedules_due (next_run_at of the active schedules), so its cost when
-- nothing is due is one index probe, whatever the number of schedules.
--
-- Storage: each fired slot updates its row (next_run_at, last_run_at,
-- last_job_id, recent_job_ids). next_run_at is indexed, so these updates cannot be HOT; what
-- keeps the table small instead: fillfactor 50 leaves room on each page for
-- the new version (the row stays on its page and page pruning reclaims the
-- old one without waiting for vacuum), the indexes that do not change
-- (schedule_id, name) shed their stale entries by bottom-up deletion, and
-- autovacuum runs after a small, fixed number of updates. Rows are narrow
-- and few (one per schedule), so even a held xmin lets the table grow only by
-- one dead version per fired slot until it is released.
--
-- No foreign key to job_queues (as for pgque.jobs): a schedule whose queue
-- was dropped is paused by the next run_schedules() that finds it due.
CREATE SEQUENCE pgque.schedules_id_seq AS bigint;

CREATE TABLE pgque.schedules_def (
    schedule_id  bigint PRIMARY KEY DEFAULT pg_catalog.nextval('pgque.schedules_id_seq'),
    name         text NOT NULL UNIQUE,
    cron         text NOT NULL,
    timezone     text NOT NULL DEFAULT 'UTC',
    queue_name   text NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL DEFAULT '{}',
    priority     smallint NOT NULL DEFAULT 0,
    misfire      text NOT NULL DEFAULT 'skip' CHECK (misfire IN ('skip', 'catch_up')),
    max_attempts int CHECK (max_attempts BETWEEN 1 AND 1000),
    paused       boolean NOT NULL DEFAULT false,
    -- the next slot to fire (an instant; whole seconds)
    next_run_at  timestamptz NOT NULL,
    last_run_at  timestamptz,
    last_job_id  bigint,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- the jobs of its last firings, newest first, at most 10 (a catch-up
    -- run that fires several slots counts once, with its last job): kept
    -- in the row every firing updates anyway, so the schedules page reads
    -- them with the row, whatever the number of jobs or firings before
    recent_job_ids bigint[] NOT NULL DEFAULT '{}'
) WITH (fillfactor = 50,
        autovacuum_vacuum_threshold = 500,
        autovacuum_vacuum_scale_factor = 0.05,
        autovacuum_analyze_threshold = 500);

ALTER SEQUENCE pgque.schedules_id_seq OWNED BY pgque.schedules_def.schedule_id;

CREATE INDEX schedules_due ON pgque.schedules_def (next_run_at) WHERE NOT paused;

CREATE VIEW pgque.schedules AS
SELECT s.name, s.cron, s.timezone, s.queue_name, s.kind, s.args, s.misfire, s.paused,
       s.next_run_at, s.last_run_at, s.last_job_id, s.priority, s.max_attempts, s.schedule_id,
       s.recent_job_ids
FROM pgque.schedules_def s;

SELECT pg_catalog.pg_extension_config_dump('pgque.schedules_def', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.schedules_id_seq', '');
