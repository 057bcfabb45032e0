-- The reference systems the harness measures pgque against, in schema `bench`
-- (PgQ, the third reference, is the Debian extension `pgq`).
--
--   bench.plain_events  append-only table (bigserial, jsonb): the physical limit
--                       for inserting events, and a keyset read for draining them.
--   bench.plain_jobs    the same for jobs (kind, args, priority, run_at): the
--                       multi-row INSERT reference of enqueue_ready_rows.
--   bench.sl_jobs       a classic job table consumed with
--                       UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)
--                       RETURNING, completed with DELETE; indexed the way such a
--                       table usually is (partial index on ready jobs in claim order).
-- Recreated on every run: the bench database is disposable.
DROP SCHEMA IF EXISTS bench CASCADE;
CREATE SCHEMA bench;

CREATE TABLE bench.plain_events (
    id      bigserial PRIMARY KEY,
    payload jsonb NOT NULL
);

CREATE TABLE bench.plain_jobs (
    id          bigserial PRIMARY KEY,
    queue       text NOT NULL,
    kind        text NOT NULL,
    args        jsonb NOT NULL,
    priority    smallint NOT NULL DEFAULT 0,
    run_at      timestamptz NOT NULL DEFAULT now(),
    enqueued_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE bench.sl_jobs (
    id          bigserial PRIMARY KEY,
    queue       text NOT NULL,
    kind        text NOT NULL,
    args        jsonb NOT NULL,
    priority    smallint NOT NULL DEFAULT 0,
    run_at      timestamptz NOT NULL DEFAULT now(),
    state       text NOT NULL DEFAULT 'ready',
    attempt     int NOT NULL DEFAULT 0,
    locked_by   text,
    locked_at   timestamptz,
    enqueued_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sl_jobs_claim ON bench.sl_jobs (queue, priority, run_at, id) WHERE state = 'ready';
