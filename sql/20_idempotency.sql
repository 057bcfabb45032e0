-- Producer idempotency (send_idem): a rotating key ledger.
--
-- A claim is a row (queue, idem_key, event_id, expires_at) in one of two
-- pieces. send_idem inserts only into the current piece and looks in both;
-- GC (pgque.maint_idem(), run by maint()) TRUNCATEs the other piece once all
-- its keys have expired (copying forward any long-lived stragglers), then
-- makes it current again. So the ledger takes no DELETE and no UPDATE on its
-- hot path: dead tuples stay at zero however many keys come and go (an
-- expired key claimed again in the same piece is the one UPDATE).
--
-- Consistency across a switch: every send_idem takes FOR KEY SHARE on the
-- idem_state row; a switch takes FOR UPDATE on it (skipping the round when
-- a producer holds it), so no claim can be in flight into the old piece
-- while the current piece changes.
CREATE TABLE pgque.idem_state (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    cur_piece   int2 NOT NULL DEFAULT 0 CHECK (cur_piece IN (0, 1)),
    switched_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);  -- HOT room for the (rare) switches
INSERT INTO pgque.idem_state DEFAULT VALUES;

CREATE TABLE pgque.idem_key (
    queue_id   int4 NOT NULL,
    idem_key   text NOT NULL,
    event_id   bigint NOT NULL,
    claimed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    piece      int2 NOT NULL
) PARTITION BY LIST (piece);
CREATE TABLE pgque.idem_key_p0 PARTITION OF pgque.idem_key FOR VALUES IN (0);
CREATE TABLE pgque.idem_key_p1 PARTITION OF pgque.idem_key FOR VALUES IN (1);
-- Uniqueness within a piece; across pieces send_idem looks in both.
CREATE UNIQUE INDEX idem_key_p0_key ON pgque.idem_key_p0 (queue_id, idem_key);
CREATE UNIQUE INDEX idem_key_p1_key ON pgque.idem_key_p1 (queue_id, idem_key);
-- max(expires_at) of a piece in one index probe: can it be truncated yet?
CREATE INDEX idem_key_expires_idx ON pgque.idem_key (expires_at);

-- pg_dump: the key ledger is dumped (a restored database keeps deduplicating
-- the keys claimed before the dump). idem_state is not: a restore starts at
-- piece 0, and since send_idem looks in both pieces that only changes which
-- piece GC empties first.
SELECT pg_catalog.pg_extension_config_dump('pgque.idem_key_p0', '');
SELECT pg_catalog.pg_extension_config_dump('pgque.idem_key_p1', '');
