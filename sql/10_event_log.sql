-- pgque event queues: the tables of the event-log engine (src/log).
--
-- Zero dead tuples by construction:
--  * event tables (pgque.event_<queue_id>_<n>, created by create_queue) are
--    append-only and reclaimed by TRUNCATE when the queue rotates;
--  * the hot metadata (ticks, batches, batch completions) is append-only too,
--    in tables partitioned by "piece" (0 or 1); maint() switches the current
--    piece periodically and TRUNCATEs the old one after copying forward the
--    few rows still needed (the consumers' current positions). Nothing on the
--    send / receive / ack path UPDATEs or DELETEs a row.
--  * pgque.queue and pgque.subscription are updated only by administration
--    (config, subscribe) and by rotation (once per rotation period).

CREATE SEQUENCE pgque.queue_id_seq AS int4;
CREATE SEQUENCE pgque.tick_id_seq;
CREATE SEQUENCE pgque.batch_id_seq;
CREATE SEQUENCE pgque.sub_id_seq AS int4;

CREATE TABLE pgque.queue (
    queue_id                 int4 PRIMARY KEY DEFAULT nextval('pgque.queue_id_seq'),
    queue_name               text NOT NULL UNIQUE,
    queue_ntables            int4 NOT NULL DEFAULT 3,
    queue_cur_table          int4 NOT NULL DEFAULT 0,
    queue_rotation_period    interval NOT NULL DEFAULT '2 hours',
    queue_switch_step1       xid8 NOT NULL DEFAULT pg_current_xact_id(),
    queue_switch_step2       xid8 DEFAULT pg_current_xact_id(),
    queue_switch_time        timestamptz NOT NULL DEFAULT now(),
    queue_ticker_max_count   int4 NOT NULL DEFAULT 500,
    queue_ticker_max_lag     interval NOT NULL DEFAULT '3 seconds',
    queue_ticker_idle_period interval NOT NULL DEFAULT '1 minute',
    queue_ticker_paused      boolean NOT NULL DEFAULT false,
    queue_max_retries        int4 NOT NULL DEFAULT 5,
    -- The queue's event id sequence (pgque.event_<id>_id_seq). regclass, not
    -- oid: pg_dump writes it as a name, so a restore finds the new sequence.
    queue_event_seq          regclass NOT NULL,
    queue_created_at         timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);

-- Consumers. A plain consumer has sub_parent NULL; a cooperative member
-- (subconsumer) points at its consumer's row. sub_start_tick is the position
-- before the consumer's first batch (moved forward only when the batch log is
-- truncated).
CREATE TABLE pgque.subscription (
    sub_id          int4 PRIMARY KEY DEFAULT nextval('pgque.sub_id_seq'),
    sub_queue       int4 NOT NULL REFERENCES pgque.queue (queue_id) ON DELETE CASCADE,
    sub_consumer    text NOT NULL,
    sub_parent      int4 REFERENCES pgque.subscription (sub_id) ON DELETE CASCADE,
    sub_start_tick  bigint NOT NULL,
    sub_active      timestamptz NOT NULL DEFAULT now(),
    sub_created_at  timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);
CREATE UNIQUE INDEX subscription_name_idx
    ON pgque.subscription (sub_queue, coalesce(sub_parent, 0), sub_consumer);
CREATE INDEX subscription_parent_idx ON pgque.subscription (sub_parent);

-- Which metadata piece receives new rows.
CREATE TABLE pgque.meta_state (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    cur_piece   int2 NOT NULL DEFAULT 0,
    switched_at timestamptz NOT NULL DEFAULT now(),
    switch_xid  xid8,            -- set by a switch, cleared once the old piece is truncated
    old_pending boolean NOT NULL DEFAULT false
);
INSERT INTO pgque.meta_state DEFAULT VALUES;

-- Ticks: (tick id, time, snapshot, event sequence value). tick_pending is the
-- xmax of a tick's snapshot while transactions that took event ids may still
-- commit (the ticker then ticks again once they are done).
CREATE TABLE pgque.tick (
    tick_queue     int4 NOT NULL,
    tick_id        bigint NOT NULL,
    tick_time      timestamptz NOT NULL,
    tick_snapshot  pg_snapshot NOT NULL,
    tick_event_seq bigint NOT NULL,
    tick_pending   xid8,
    piece          int2 NOT NULL
) PARTITION BY LIST (piece);
CREATE TABLE pgque.tick_p0 PARTITION OF pgque.tick FOR VALUES IN (0);
CREATE TABLE pgque.tick_p1 PARTITION OF pgque.tick FOR VALUES IN (1);
CREATE INDEX tick_queue_id_idx ON pgque.tick (tick_queue, tick_id);
-- How far a batch may reach: the furthest tick within `limit` events (batch.rs next_range).
CREATE INDEX tick_queue_seq_idx ON pgque.tick (tick_queue, tick_event_seq, tick_id);

-- Batches: one row per opened batch. A batch is the events committed between
-- prev_tick_id's and tick_id's snapshots with ev_floor < ev_id <= ev_ceiling
-- (ev_ceiling NULL = no upper bound); a big range is cut into several batches.
CREATE TABLE pgque.batch (
    batch_id     bigint NOT NULL,
    sub_id       int4 NOT NULL,
    member_id    int4,
    prev_tick_id bigint NOT NULL,
    tick_id      bigint NOT NULL,
    ev_floor     bigint NOT NULL,
    ev_ceiling   bigint,
    opened_at    timestamptz NOT NULL,
    piece        int2 NOT NULL
) PARTITION BY LIST (piece);
CREATE TABLE pgque.batch_p0 PARTITION OF pgque.batch FOR VALUES IN (0);
CREATE TABLE pgque.batch_p1 PARTITION OF pgque.batch FOR VALUES IN (1);
CREATE INDEX batch_sub_idx ON pgque.batch (sub_id, tick_id, ev_floor, batch_id);
CREATE INDEX batch_id_idx ON pgque.batch (batch_id);

-- Finished batches (ack / finish_batch), or abandoned ones (taken over).
CREATE TABLE pgque.batch_done (
    batch_id  bigint NOT NULL,
    done_at   timestamptz NOT NULL,
    abandoned boolean NOT NULL DEFAULT false,
    piece     int2 NOT NULL
) PARTITION BY LIST (piece);
CREATE TABLE pgque.batch_done_p0 PARTITION OF pgque.batch_done FOR VALUES IN (0);
CREATE TABLE pgque.batch_done_p1 PARTITION OF pgque.batch_done FOR VALUES IN (1);
CREATE INDEX batch_done_id_idx ON pgque.batch_done (batch_id);

-- Stored cuts of a big batch range (src/log/cuts.rs): the ids and addresses
-- (ctid, child table number) of the range's events above `base`, in id order,
-- in chunks; read once when the range's first cut is needed, so every cut
-- fetches its own events by address instead of re-reading the range.
-- Not dumped: tuple addresses do not survive a restore (cuts are rebuilt).
-- Unlogged: a derived cache, rebuilt from the event tables whenever it is
-- missing (after a crash or on a promoted standby a cut reads by txid, or
-- builds again), so a big range's build writes no WAL.
CREATE TABLE pgque.batch_cut (
    sub_id       int4 NOT NULL,
    prev_tick_id bigint NOT NULL,
    tick_id      bigint NOT NULL,
    base         bigint NOT NULL,
    first_id     bigint NOT NULL,
    last_id      bigint NOT NULL,
    ids          bigint[] NOT NULL,
    tids         tid[] NOT NULL,
    tbls         int2[] NOT NULL,
    piece        int2 NOT NULL
) PARTITION BY LIST (piece);
CREATE UNLOGGED TABLE pgque.batch_cut_p0 PARTITION OF pgque.batch_cut FOR VALUES IN (0);
CREATE UNLOGGED TABLE pgque.batch_cut_p1 PARTITION OF pgque.batch_cut FOR VALUES IN (1);
CREATE INDEX batch_cut_idx ON pgque.batch_cut (sub_id, prev_tick_id, tick_id, last_id);

-- Events waiting to be redelivered to one consumer (nack / event_retry).
-- PgQ's and PgQue's columns (ev_owner is the consumer's subscription id;
-- ev_txid the event's original transaction, NULL where it was not read).
CREATE TABLE pgque.retry_queue (
    ev_retry_after timestamptz NOT NULL,
    ev_queue       int4 NOT NULL,
    ev_owner       int4 NOT NULL,
    ev_id          bigint NOT NULL,
    ev_time        timestamptz NOT NULL,
    ev_retry       int4 NOT NULL,
    ev_type        text,
    ev_data        text,
    ev_extra1      text,
    ev_extra2      text,
    ev_extra3      text,
    ev_extra4      text,
    ev_txid        xid8,
    ev_headers     jsonb,        -- trace context (traceparent, ...), as on the event
    PRIMARY KEY (ev_owner, ev_id)
);
CREATE INDEX retry_queue_due_idx ON pgque.retry_queue (ev_retry_after);

-- Events that ran out of retries. Users read them through the view
-- pgque.dead_letter below (PgQue's columns); the consumer's name is kept
-- here too, so a dead letter still says whose it was after an unsubscribe.
CREATE TABLE pgque.dead_letter_store (
    dl_id         bigserial PRIMARY KEY,
    dl_queue      int4 NOT NULL,
    dl_consumer   text NOT NULL,
    dl_owner      int4,
    dl_time       timestamptz NOT NULL DEFAULT now(),
    dl_reason     text,
    ev_id         bigint NOT NULL,
    ev_time       timestamptz NOT NULL,
    ev_retry      int4,
    ev_type       text,
    ev_data       text,
    ev_extra1     text,
    ev_extra2     text,
    ev_extra3     text,
    ev_extra4     text,
    ev_txid       xid8,
    ev_headers    jsonb          -- trace context, as on the event
);
CREATE INDEX dead_letter_queue_idx ON pgque.dead_letter_store (dl_queue, dl_time);
-- One dead letter per (consumer, event): nack's insert probes this.
CREATE INDEX dead_letter_owner_ev_idx ON pgque.dead_letter_store (dl_owner, ev_id);

-- PgQue's pgque.dead_letter, column for column (its docs tell users to
-- query it; dlq_inspect returns its rows). dl_consumer_id is the consumer's
-- subscription id, as co_id of pgque.consumer.
CREATE VIEW pgque.dead_letter AS
SELECT d.dl_id, d.dl_queue AS dl_queue_id, d.dl_owner AS dl_consumer_id, d.dl_time, d.dl_reason,
       d.ev_id, d.ev_time, d.ev_txid, d.ev_retry, d.ev_type, d.ev_data,
       d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4
  FROM pgque.dead_letter_store d;

-- PgQ's / PgQue's consumer names (co_id, co_name). In pgque a consumer is
-- registered per queue, so co_id is the (plain) consumer's subscription id:
-- pgque.dead_letter.dl_consumer_id and pgque.retry_queue.ev_owner join it;
-- pgque.subscription.sub_consumer holds the name itself.
CREATE VIEW pgque.consumer AS
SELECT s.sub_id AS co_id, s.sub_consumer AS co_name
  FROM pgque.subscription s
 WHERE s.sub_parent IS NULL;

-- Each consumer's position: the tick its next batch starts after (the oldest
-- open batch's start for cooperative consumers). Drives rotation and info.
-- A consumer's frontier is its batch with the furthest range (tick_id,
-- ev_floor): for a plain consumer that is simply its latest batch.
CREATE VIEW pgque.consumer_position AS
SELECT s.sub_id, s.sub_queue, s.sub_consumer,
       least(
         (SELECT min(b.prev_tick_id) FROM pgque.batch b
           WHERE b.sub_id = s.sub_id
             AND NOT EXISTS (SELECT 1 FROM pgque.batch_done d WHERE d.batch_id = b.batch_id)),
         coalesce(
           (SELECT CASE WHEN b.ev_ceiling IS NULL THEN b.tick_id ELSE b.prev_tick_id END
              FROM pgque.batch b WHERE b.sub_id = s.sub_id
             ORDER BY b.tick_id DESC, b.ev_floor DESC, b.batch_id DESC LIMIT 1),
           s.sub_start_tick)
       ) AS pos_tick
  FROM pgque.subscription s
 WHERE s.sub_parent IS NULL;

-- pg_dump: the user data of the event log is dumped with the database (the
-- per-queue event tables and their id sequences, made by create_queue, are
-- not extension members and are dumped anyway). Metadata pieces are leaf
-- partitions: pg_dump dumps data per partition, not through the parent.
-- Not dumped: meta_state (singleton written by the install script; a
-- restore starts at piece 0, which rotation handles: rows keep their piece).
SELECT pg_catalog.pg_extension_config_dump('pgque.queue', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.subscription', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.tick_p0', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.tick_p1', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.batch_p0', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.batch_p1', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.batch_done_p0', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.batch_done_p1', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.retry_queue', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.dead_letter_store', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.dead_letter_store_dl_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.queue_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.tick_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.batch_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.sub_id_seq', '');
