-- Delayed delivery (send_at): events held until their deliver_at, then
-- promoted into their queue's current event table by pgque.maint_delayed()
-- (a worker duty of its own, and part of maint()).
--
-- Bloat-free like the key ledger: two pieces, append-only. Promotion marks
-- nothing: it remembers (snapshot, horizon) of its last run in
-- delayed_state, and a row is promoted by the first run in whose snapshot it
-- is committed and whose horizon has reached its deliver_at. A piece is
-- TRUNCATEd once every row in it has been promoted (far-future rows are
-- copied forward first when the piece has waited long), so no row is ever
-- deleted or updated.
CREATE TABLE pgque.delayed_state (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    cur_piece     int2 NOT NULL DEFAULT 0 CHECK (cur_piece IN (0, 1)),
    switched_at   timestamptz NOT NULL DEFAULT now(),
    last_snapshot pg_snapshot NOT NULL DEFAULT pg_current_snapshot(),
    last_horizon  timestamptz NOT NULL DEFAULT '-infinity'
) WITH (fillfactor = 20);  -- one HOT update per promotion run
INSERT INTO pgque.delayed_state DEFAULT VALUES;

CREATE TABLE pgque.delayed_event (
    ev_queue   int4 NOT NULL,
    ev_id      bigint NOT NULL,      -- reserved from the queue's sequence at send_at
    deliver_at timestamptz NOT NULL,
    ev_time    timestamptz NOT NULL DEFAULT now(),
    ev_txid    xid8 NOT NULL DEFAULT pg_current_xact_id(),
    ev_type    text,
    ev_data    text,
    ev_extra1  text,
    ev_extra2  text,
    ev_extra3  text,
    ev_extra4  text,
    piece      int2 NOT NULL,
    ev_headers jsonb              -- trace context, carried into the event table
) PARTITION BY LIST (piece);
CREATE TABLE pgque.delayed_event_p0 PARTITION OF pgque.delayed_event FOR VALUES IN (0);
CREATE TABLE pgque.delayed_event_p1 PARTITION OF pgque.delayed_event FOR VALUES IN (1);
-- Rows that came due since the last run ...
CREATE INDEX delayed_event_due_idx ON pgque.delayed_event (deliver_at, ev_id);
-- ... and rows that were due but not yet committed at the last run.
CREATE INDEX delayed_event_txid_idx ON pgque.delayed_event (ev_txid);

-- pg_dump: only the delayed events not yet promoted (the rest are in their
-- queue's event table already). A row is promoted once it is due by the
-- last run's horizon and committed in its snapshot (delayed.rs PROMOTABLE);
-- delayed_state itself is not dumped: a restored database starts from the
-- install script's row (horizon -infinity), so every dumped row is promoted
-- once when due.
SELECT pg_catalog.pg_extension_config_dump('pgque.delayed_event_p0',
    'WHERE NOT (deliver_at <= (SELECT s.last_horizon FROM pgque.delayed_state s) '
    'AND pg_catalog.pg_visible_in_snapshot(ev_txid, (SELECT s.last_snapshot FROM pgque.delayed_state s)))');
SELECT pg_catalog.pg_extension_config_dump('pgque.delayed_event_p1',
    'WHERE NOT (deliver_at <= (SELECT s.last_horizon FROM pgque.delayed_state s) '
    'AND pg_catalog.pg_visible_in_snapshot(ev_txid, (SELECT s.last_snapshot FROM pgque.delayed_state s)))');
