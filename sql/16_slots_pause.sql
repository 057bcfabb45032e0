-- pgque partition slots, the `pause` failure policy (src/log/pause.rs,
-- docs/partition-keys.md "Failure policy").
--
-- A partitioned consumer chooses at subscribe what a nack does to the key's
-- later events: 'skip' (they are delivered; the nacked one comes back later,
-- after them) or 'pause' (they are held back until the nacked one has been
-- redelivered and acked, or dead-lettered). With 'pause', on_dead_letter
-- says what a dead letter does to the key: 'resume' its held events, or
-- 'block' them until pgque.release_partition_key.
ALTER TABLE pgque.partition_consumer
    ADD COLUMN pc_failure_policy text NOT NULL DEFAULT 'skip'
        CHECK (pc_failure_policy IN ('skip', 'pause')),
    ADD COLUMN pc_on_dead_letter text NOT NULL DEFAULT 'resume'
        CHECK (pc_on_dead_letter IN ('resume', 'block'));
-- The policy as the lease fence reads it (with the lease row, no second
-- lookup on the receive path); set with the slot rows, never changed.
ALTER TABLE pgque.partition_slot
    ADD COLUMN ps_pause boolean NOT NULL DEFAULT false;

-- A blocked key of a slot subscription ('pause' only): its later events are
-- held back (parked in partition_held) until the block ends.
--  pb_state   'retry': waiting for the redelivery of pb_event (a nacked event)
--             'dead': pb_event was dead-lettered, held events wait for
--                     release_partition_key (or, on_dead_letter = 'resume',
--                     for the open batch's ack: pb_unblock)
--             'release': the first held events (at most 1,000 a round,
--                     PUT_BACK_MAX in src/log/pause.rs) were put back into
--                     the queue and are being redelivered (pb_pending of them
--                     not yet acked); the rest stay held for the next round
--  pb_batch   the last batch that delivered events of the key: when it is
--             acked, the block moves on
--  pb_pending events put back into the queue that have not reached the
--             slot yet (the block ends only after they have)
--  pb_held    events parked now; pb_unblock: release at the next ack
CREATE TABLE pgque.partition_blocked (
    pb_sub     int4 NOT NULL REFERENCES pgque.subscription (sub_id) ON DELETE CASCADE,
    pb_key     text NOT NULL,
    pb_state   text NOT NULL CHECK (pb_state IN ('retry', 'dead', 'release')),
    pb_event   int8,
    pb_since   timestamptz NOT NULL DEFAULT now(),
    pb_batch   int8,
    pb_pending int4 NOT NULL DEFAULT 0,
    pb_held    int4 NOT NULL DEFAULT 0,
    pb_unblock boolean NOT NULL DEFAULT false,
    PRIMARY KEY (pb_sub, pb_key)
);

-- Events of a blocked key held back from their slot subscription, as read
-- from the event table (ev_retry as delivered: NULL for a first delivery).
-- Put back into the queue, in ev_id order, when the block ends: at most
-- 1,000 a round, the next round once those are delivered and acked.
CREATE TABLE pgque.partition_held (
    ph_sub    int4 NOT NULL,
    ph_key    text NOT NULL,
    ev_id     int8 NOT NULL,
    ev_time   timestamptz NOT NULL,
    ev_retry  int4,
    ev_type   text,
    ev_data   text,
    ev_extra1 text,
    ev_extra2 text,
    ev_extra3 text,
    ev_extra4 text,
    ev_headers jsonb,
    PRIMARY KEY (ph_sub, ev_id),
    FOREIGN KEY (ph_sub, ph_key)
        REFERENCES pgque.partition_blocked (pb_sub, pb_key) ON DELETE CASCADE
);
CREATE INDEX partition_held_key_idx ON pgque.partition_held (ph_sub, ph_key, ev_id);

SELECT pg_catalog.pg_extension_config_dump('pgque.partition_blocked', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.partition_held', '');

-- One row per blocked key of every partitioned consumer.
CREATE VIEW pgque.partition_blocked_keys AS
SELECT q.queue_name, p.ps_consumer AS consumer, p.ps_slot AS slot, p.ps_n AS n,
       b.pb_key AS partition_key, b.pb_state AS state, b.pb_event AS failed_event,
       b.pb_since AS blocked_since,
       pg_catalog.now() OPERATOR(pg_catalog.-) b.pb_since AS blocked_for,
       b.pb_held AS held_events, b.pb_pending AS redelivering_events,
       b.pb_unblock AS release_at_ack
  FROM pgque.partition_blocked b
  JOIN pgque.partition_slot p ON p.ps_sub OPERATOR(pg_catalog.=) b.pb_sub
  JOIN pgque.queue q ON q.queue_id OPERATOR(pg_catalog.=) p.ps_queue;
