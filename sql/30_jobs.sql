-- pgque job queues: the job store.
--
-- Competing-consumer work items with their own state. The two hot paths
-- (pgque.enqueue_ready_rows and pgque.dispatch) are single statements written
-- in src/jobs/*.rs; this file holds the tables, the indexes those statements
-- walk, and the storage settings of the tables they churn.
--
-- No foreign keys from jobs to job_queues: an FK check is a per-row trigger
-- that also share-locks the queue row (a MultiXact as soon as two producers
-- enqueue at once). Enqueue checks the queue in its own statement and holds a
-- shared advisory lock on it to commit, which drop_job_queue takes exclusively.

-- ---- queues ---------------------------------------------------------------
CREATE TABLE pgque.job_queues (
    queue_name   text PRIMARY KEY,
    -- strict_fifo: (priority, order of becoming ready); round_robin: one job
    -- per fairness key per round, each key in FIFO order.
    mode         text NOT NULL DEFAULT 'strict_fifo'
                 CHECK (mode IN ('strict_fifo', 'round_robin')),
    -- Lanes per priority. A lane (queue, priority, shard) is the unit of FIFO;
    -- producers serialise per lane until commit, so more shards = more
    -- concurrent producers (FIFO then holds per producer session's shard).
    shards       int NOT NULL DEFAULT 1 CHECK (shards BETWEEN 1 AND 64),
    max_attempts int NOT NULL DEFAULT 25 CHECK (max_attempts BETWEEN 1 AND 1000),
    lease        interval NOT NULL DEFAULT '5 minutes' CHECK (lease > '0'::interval),
    paused       boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Round-robin position per queue: the last fairness key a dispatch visited.
-- Updated by dispatch (SKIP LOCKED: a busy cursor is left to its holder), so
-- it is update-hot: tiny rows, fillfactor 20 for HOT updates, vacuumed often.
CREATE TABLE pgque.job_rr_cursors (
    queue_name text PRIMARY KEY,
    last_key   text NOT NULL DEFAULT ''
) WITH (fillfactor = 20,
        autovacuum_vacuum_threshold = 50,
        autovacuum_vacuum_scale_factor = 0.0,
        autovacuum_analyze_threshold = 50);

-- ---- actors ---------------------------------------------------------------
-- One row per actor ever seen (created by enqueue). `running` is the number of
-- this actor's jobs in state running; dispatch locks the row, admits at most
-- max_concurrent - running and adds what it claimed, every transition out of
-- running subtracts. Kept for every actor (not only capped ones) so that
-- set_actor_capacity never has to count jobs racing with dispatchers.
-- Update-hot (every dispatch and completion of an actor's job): fillfactor 50
-- leaves room for HOT updates; vacuum by a small absolute threshold.
CREATE TABLE pgque.job_actors (
    actor          text PRIMARY KEY,
    max_concurrent int CHECK (max_concurrent >= 0),   -- NULL: unlimited
    running        int NOT NULL DEFAULT 0 CHECK (running >= 0)
) WITH (fillfactor = 50,
        autovacuum_vacuum_threshold = 100,
        autovacuum_vacuum_scale_factor = 0.05,
        autovacuum_analyze_threshold = 100,
        autovacuum_analyze_scale_factor = 0.05);

-- ---- jobs -----------------------------------------------------------------
CREATE SEQUENCE pgque.jobs_id_seq AS bigint;
CREATE SEQUENCE pgque.job_lease_token_seq AS bigint;

CREATE TABLE pgque.jobs (
    -- Ready-at-enqueue jobs take their id under their lane's lock, so within a
    -- lane ids follow commit order; ready_seq = id for them.
    id            bigint PRIMARY KEY,
    queue         text NOT NULL,
    kind          text NOT NULL,
    args          jsonb NOT NULL,
    priority      smallint NOT NULL,
    shard         smallint NOT NULL,
    -- waiting: a job of a flow whose parents have not all completed (flows.rs)
    state         text NOT NULL CHECK (state IN
                  ('waiting', 'scheduled', 'ready', 'running', 'completed', 'failed', 'cancelled')),
    -- Dispatch order inside (queue, priority): taken from jobs_id_seq under the
    -- lane lock when the job first becomes ready (at enqueue, or when a
    -- scheduled job is promoted); a retried job keeps its place.
    ready_seq     bigint,
    run_at        timestamptz NOT NULL,
    attempt       int NOT NULL DEFAULT 0,
    max_attempts  int NOT NULL,
    actor         text,
    fairness_key  text,
    identity_key  text,
    unique_key    text,
    enqueued_at   timestamptz NOT NULL DEFAULT now(),
    worker        text,
    lease_token   bigint,
    lease_until   timestamptz,
    dispatched_at timestamptz,
    finished_at   timestamptz,
    -- [{attempt, at, error}, ...] one entry per failed attempt.
    errors        jsonb,
    -- The job's key as round-robin dispatch groups it, COALESCE(fairness_key,
    -- ''), set only while its queue is round_robin (enqueue; a mode change
    -- rewrites it for the queue's unfinished jobs). NULL in a strict_fifo
    -- queue, so those jobs cost no entry in jobs_ready_rr_idx.
    rr_key        text,
    -- What complete recorded (kept as long as the job), and the last value
    -- set_progress reported. (Last columns: where ALTER TABLE ... ADD COLUMN
    -- puts them on upgrade.)
    output        jsonb,
    progress      jsonb,
    -- Flows (src/jobs/flows.rs): the flow and the job's key in it; while
    -- waiting, how many parents have not completed; true: run even when a
    -- parent failed or was cancelled (NULL: be cancelled with it); true: a
    -- job_deps row names it as a parent (NULL: none does, so completing it
    -- looks for no children).
    flow_id       bigint,
    flow_key      text,
    pending_parents int,
    run_on_parent_failure boolean,
    has_children  boolean,
    -- Trace context and other small metadata the producer attached (W3C
    -- traceparent / tracestate: docs/tracing.md): a JSON object of strings,
    -- at most 1 kB (src/jobs/args.rs check_headers); NULL: none. A job with
    -- headers is stored here, never in the job log, whose batch rows have no
    -- place for them.
    headers       jsonb,
    CHECK (state <> 'ready' OR ready_seq IS NOT NULL),
    CHECK (state <> 'running' OR (lease_token IS NOT NULL AND lease_until IS NOT NULL)),
    -- A lease token exists exactly while the job runs: the lifecycle
    -- statements fence on (id, lease_token) alone (src/jobs/lifecycle.rs).
    CONSTRAINT jobs_lease_token_only_running CHECK ((state = 'running') = (lease_token IS NOT NULL))
) WITH (
    -- Every job row is updated 2-3 times (dispatch, completion, maybe retries)
    -- and the indexes that change are partial ones; 80% fill leaves room for
    -- the new version on the same page (HOT when no indexed column changes,
    -- and always cheaper pruning), without the +50% footprint of 50%.
    fillfactor = 80,
    -- Vacuum on churn, not on table fraction: 2% dead (vs the global 20%)
    -- keeps the dispatch indexes' dead entries few; insert-driven vacuum keeps
    -- the visibility map fresh during backlog growth; fresh stats keep the
    -- planner on the index paths.
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- strict_fifo dispatch walks this in order: (queue, priority, ready_seq).
CREATE INDEX jobs_ready_fifo_idx ON pgque.jobs (queue, priority, ready_seq)
    WHERE state = 'ready';
-- round_robin dispatch: a loose index scan over the distinct fairness keys of a
-- queue, then each key's head in (priority, ready_seq) order. Only jobs of
-- round-robin queues have an rr_key: a strict_fifo job is one index entry
-- fewer to write (measured: a third of the enqueue statement's time).
CREATE INDEX jobs_ready_rr_idx
    ON pgque.jobs (queue, rr_key, priority, ready_seq)
    WHERE state = 'ready' AND rr_key IS NOT NULL;
-- promotion of due scheduled jobs, oldest run_at first.
CREATE INDEX jobs_scheduled_idx ON pgque.jobs (run_at, id) WHERE state = 'scheduled';
-- lease rescue: running jobs by lease expiry.
CREATE INDEX jobs_running_lease_idx ON pgque.jobs (lease_until) WHERE state = 'running';
-- uniqueness holds while a job is not terminal.
CREATE UNIQUE INDEX jobs_unique_key_idx ON pgque.jobs (queue, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('scheduled', 'ready', 'running');
-- the jobs of a flow (flow_status).
CREATE INDEX jobs_flow_idx ON pgque.jobs (flow_id) WHERE flow_id IS NOT NULL;
-- pruning of terminal jobs by age, per state.
CREATE INDEX jobs_terminal_idx ON pgque.jobs (state, finished_at)
    WHERE state IN ('completed', 'failed', 'cancelled');

-- Identity single-flight: a row per identity key that has a running job. Dispatch
-- claims it with INSERT ... ON CONFLICT DO NOTHING (which waits for a concurrent
-- claimer's commit, so two dispatchers never both win); every transition out of
-- running deletes it. Insert/delete churn: small absolute vacuum thresholds.
CREATE TABLE pgque.job_running_identities (
    queue        text NOT NULL,
    identity_key text NOT NULL,
    job_id       bigint NOT NULL,
    PRIMARY KEY (queue, identity_key)
) WITH (autovacuum_vacuum_threshold = 100,
        autovacuum_vacuum_scale_factor = 0.05,
        autovacuum_analyze_threshold = 100,
        autovacuum_analyze_scale_factor = 0.05);

-- ---- job events -------------------------------------------------------------
-- Append-only narration of transitions: enqueued, scheduled, promoted,
-- dispatched, completed, failed, retried, snoozed, cancelled, rescued.
-- Narrow on purpose and without a primary key (nothing looks events up by id):
-- one index entry per event, the (at, id) one the retention sweep needs. No
-- index on job_id: every enqueued job writes an event, and a second btree
-- entry per event cost ~2 us of the ~37 us per job of enqueue_ready_rows
-- (benches/cpu/enqueue_cpu.py); a job's history is an occasional admin query,
-- which finds it by scanning the log (see docs/job-queues.md). Kept for
-- pgque.job_event_retention (7 days), independently of the jobs, and deleted
-- oldest-first in bounded batches.
-- One row per statement and transition, not per job: the jobs one enqueue,
-- dispatch or completion moved together (same queue, event, attempt and
-- detail) share a row listing them in job_ids (also when the set is one
-- job). job_id is the job of cancel and retry_job, which act on one job, and
-- of rows written before 0.3.0. A row per job (a heap tuple and an index entry each) was ~3 us
-- of enqueue_ready_rows' ~21 us per job at batch 100, and as much again at
-- dispatch and at completion. pgque.job_history has one row per job
-- and transition.
CREATE SEQUENCE pgque.job_events_id_seq AS bigint;
CREATE TABLE pgque.job_events (
    id      bigint NOT NULL DEFAULT nextval('pgque.job_events_id_seq'),
    at      timestamptz NOT NULL DEFAULT now(),
    job_id  bigint,
    queue   text NOT NULL,
    event   text NOT NULL,
    attempt int,
    detail  text,
    -- (last column: where ALTER TABLE ... ADD COLUMN puts it on upgrade)
    job_ids bigint[],
    CONSTRAINT job_events_one_job_or_many CHECK ((job_id IS NULL) <> (job_ids IS NULL))
) WITH (
    -- Append-only with batch deletes at the old end: vacuum at 1% so the
    -- swept space is reused and the visibility map stays fresh; inserts
    -- trigger vacuum too (freezing, VM) since deletes alone are rare.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.01
);
-- the retention sweep drains oldest-first through this index.
CREATE INDEX job_events_at_idx ON pgque.job_events (at, id);

-- pgque.job_history (one row per job and transition) is in sql/31_job_log.sql.

-- When job_analyze last ran (it runs at most every pgque.analyze_interval).
CREATE TABLE pgque.job_maint_state (
    singleton        boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_analyze_at  timestamptz
);
INSERT INTO pgque.job_maint_state DEFAULT VALUES;

-- ---- status: pgque.job_queue_status is in sql/31_job_log.sql (it counts the log too)

-- pg_dump: queues, actors, jobs and their history are user data and are
-- dumped, with the sequences their ids come from. job_maint_state is not
-- (a restore just runs ANALYZE again).
SELECT pg_catalog.pg_extension_config_dump('pgque.job_queues', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_rr_cursors', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_actors', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.jobs', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_running_identities', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_events', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.jobs_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_lease_token_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.job_events_id_seq', '');
