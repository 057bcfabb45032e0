-- pgque bootstrap: objects every module needs, created before anything else.
-- The schema `pgque` itself is created by CREATE EXTENSION (pgque.control: schema = pgque).

-- Roles. Created if missing (they are cluster-wide and outlive the extension).
-- pgque_admin is a member of both others, so it can do all they can.
-- Two databases creating the extension at the same moment race on these
-- cluster-wide names: the loser's duplicate is not an error.
DO $roles$
DECLARE r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgque_reader', 'pgque_writer', 'pgque_admin'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
    BEGIN
        GRANT pgque_reader, pgque_writer TO pgque_admin;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;
    END;
END
$roles$;
GRANT USAGE ON SCHEMA pgque TO pgque_reader, pgque_writer, pgque_admin;

-- What receive() returns: PgQue's message type, column for column.
CREATE TYPE pgque.message AS (
    msg_id      bigint,
    batch_id    bigint,
    type        text,
    payload     text,
    retry_count int4,        -- NULL on first delivery
    created_at  timestamptz,
    extra1      text,
    extra2      text,
    extra3      text,
    extra4      text
);

-- Per-database switch of the background worker (start() / stop()).
-- One row; the worker reads it each loop and exits when it is off.
CREATE TABLE pgque.worker_config (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    worker_enabled boolean NOT NULL DEFAULT true,
    changed_at     timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pgque.worker_config DEFAULT VALUES;
