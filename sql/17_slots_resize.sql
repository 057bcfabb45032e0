-- pgque partition slots, online resize of N (src/log/resize.rs,
-- docs/partition-keys.md "Resizing N online").
--
-- A resize of consumer c from N to N' slots seals the old slots at a tick T
-- (their batches stop at T) and subscribes the N' new slots at T, under
-- pending names "c#<k>/<N'>" (never handed out: they are not lease rows of
-- partition_slot). complete_resize, once every old slot has reached T with
-- no open batch, moves retries, blocked-key markers, held events and dead
-- letters to each key's new slot, drops the old subscriptions and makes
-- the new ones c#0 .. c#<N'-1>.

-- The seal of a slot: its batches never reach past this tick (NULL: no
-- resize in progress). Read with the lease row by the fence, so the batch
-- opener sees it under the lock it opens batches under.
ALTER TABLE pgque.partition_slot ADD COLUMN ps_seal int8;

-- The resize in progress of a partitioned consumer (at most one).
--  pr_n     the new N
--  pr_tick  the seal T: old slots deliver up to it, new slots after it
--  pr_subs  the new slots' subscriptions, slot k at index k + 1
CREATE TABLE pgque.partition_resize (
    pr_queue    int4 NOT NULL,
    pr_consumer text NOT NULL,
    pr_n        int4 NOT NULL CHECK (pr_n BETWEEN 1 AND 256),
    pr_tick     int8 NOT NULL,
    pr_subs     int4[] NOT NULL,
    pr_since    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pr_queue, pr_consumer),
    FOREIGN KEY (pr_queue, pr_consumer)
        REFERENCES pgque.partition_consumer (pc_queue, pc_consumer) ON DELETE CASCADE,
    CHECK (pg_catalog.cardinality(pr_subs) = pr_n)
);

SELECT pg_catalog.pg_extension_config_dump('pgque.partition_resize', '');

-- One row per resize in progress.
CREATE VIEW pgque.partition_resizes AS
SELECT q.queue_name, r.pr_consumer AS consumer, c.pc_n AS n, r.pr_n AS new_n,
       r.pr_tick AS seal_tick, r.pr_since AS started_at,
       pg_catalog.now() OPERATOR(pg_catalog.-) r.pr_since AS running_for
  FROM pgque.partition_resize r
  JOIN pgque.partition_consumer c
    ON c.pc_queue OPERATOR(pg_catalog.=) r.pr_queue
   AND c.pc_consumer OPERATOR(pg_catalog.=) r.pr_consumer
  JOIN pgque.queue q ON q.queue_id OPERATOR(pg_catalog.=) r.pr_queue;
