-- pgque partition slots (src/log/slots.rs, src/api/slots.rs): ordered
-- per-key consumption through N slot subscriptions with batch leases.
--
-- A partitioned consumer "c" with N slots is N ordinary subscriptions named
-- "c#0" .. "c#<N-1>" (pgque.subscription, sub_parent NULL), so each slot has
-- its own position and holds back rotation like any consumer. Plain consumer
-- names may not contain '#', so these names never collide.

-- One row per partitioned consumer: its slot count N, persisted and enforced.
CREATE TABLE pgque.partition_consumer (
    pc_queue      int4 NOT NULL REFERENCES pgque.queue (queue_id) ON DELETE CASCADE,
    pc_consumer   text NOT NULL,
    pc_n          int4 NOT NULL CHECK (pc_n BETWEEN 1 AND 256),
    pc_created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pc_queue, pc_consumer)
);

-- The lease of each slot (all N rows exist while the consumer does).
--  ps_sub    the slot's subscription (NULL: unsubscribed by unsubscribe_slot)
--  ps_owner  the worker holding the lease (NULL: released / never claimed)
--  ps_epoch  +1 on every change of owner (fencing token)
--  ps_until  the lease ends at ps_until; for a free slot, when it became free
--            (so "waited longest" is simply the smallest ps_until)
-- Lease changes UPDATE only unindexed columns (HOT) on pages kept half empty,
-- and renewal is written only when half the TTL has passed (not per batch),
-- so the table takes a bounded number of row versions per slot per TTL.
CREATE TABLE pgque.partition_slot (
    ps_queue    int4 NOT NULL,
    ps_consumer text NOT NULL,
    ps_slot     int4 NOT NULL,
    ps_n        int4 NOT NULL,
    ps_sub      int4,
    ps_owner    text,
    ps_epoch    bigint NOT NULL DEFAULT 0,
    ps_until    timestamptz NOT NULL DEFAULT now(),
    ps_ttl      interval,
    PRIMARY KEY (ps_queue, ps_consumer, ps_slot),
    FOREIGN KEY (ps_queue, ps_consumer)
        REFERENCES pgque.partition_consumer (pc_queue, pc_consumer) ON DELETE CASCADE,
    CHECK (ps_slot >= 0 AND ps_slot < ps_n)
) WITH (fillfactor = 50);
-- From a batch's subscription to its slot (batch_by_id, get_batch_events).
CREATE UNIQUE INDEX partition_slot_sub_idx ON pgque.partition_slot (ps_sub)
    WHERE ps_sub IS NOT NULL;

-- User data (which consumers are partitioned, with what N; each slot's
-- subscription, lease owner and epoch): kept by pg_dump.
SELECT pg_catalog.pg_extension_config_dump('pgque.partition_consumer', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.partition_slot', '');
