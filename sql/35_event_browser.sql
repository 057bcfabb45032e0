-- pgque event browser: what pgque-web's page of one event queue reads
-- (web/src/events.rs): the events its consumers have still to process and
-- its dead letters, with their payloads, headers and reasons for a member of
-- pgque_admin (sql/34_explorer.sql: who sees contents), a page at a time. SECURITY DEFINER
-- with a pinned search_path and schema-qualified names, granted to
-- pgque_reader and pgque_admin, so a dashboard role never reads pgque's
-- tables. Replaying and purging dead letters go through dlq_replay and
-- the pgque.dead_letter view (DELETE, pgque_admin) as before.

-- A queue's dead letters newest first, by id: the keyset of
-- browse_dead_letters (dead_letter_queue_idx orders by time, and many
-- letters of one nack share it).
CREATE INDEX dead_letter_queue_id_idx ON pgque.dead_letter_store (dl_queue, dl_id);

-- One page of the events of queue `queue_name` that a consumer has still
-- to process: committed after the position of `consumer` (NULL: of the
-- queue's furthest-behind consumer), ticked or not, its open batches'
-- events included. In (transaction, id) order, the order the event
-- tables' transaction index gives: pass the last row's ev_txid and ev_id
-- as after_txid / after_id for the next page. At most `max_events` rows
-- (1..1000). No consumer: no row (nothing waits). for_consumer names the
-- one consumer a retried event is redelivered to (NULL: every consumer).
-- Each page reads its rows through the index from the cursor on: its cost
-- is the page's (plus the rest of the largest transaction it enters: rows
-- of one transaction come in id order), whatever the queue holds.
-- ev_data and headers (contents) are NULL for a caller without pgque_admin
-- (sql/34_explorer.sql says who the caller is and why).
-- Errors: 22004 NULL queue_name, 42704 unknown queue or consumer, 22003
-- max_events outside 1..1000 or a negative cursor.
CREATE FUNCTION pgque.browse_events(queue_name text, consumer text DEFAULT NULL,
                                    after_txid bigint DEFAULT NULL, after_id bigint DEFAULT NULL,
                                    max_events int DEFAULT 50)
RETURNS TABLE (ev_id bigint, ev_txid bigint, ev_time timestamptz, ev_type text, ev_data text,
               partition_key text, ev_retry int, for_consumer text, headers jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
SET enable_seqscan = off
AS $browse_events$
DECLARE
    v_q int4;
    v_sub int4;
    v_pos bigint;
    v_snap pg_catalog.pg_snapshot;
    v_lim int := COALESCE($5, 50);
    v_from pg_catalog.xid8;
    v_admin boolean := pg_catalog.pg_has_role(COALESCE(NULLIF(pg_catalog.current_setting('role'), 'none'), session_user::text)::name,
                                'pgque_admin', 'USAGE');
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'queue_name must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF v_lim < 1 OR v_lim > 1000 THEN
        RAISE EXCEPTION 'max_events % is outside 1..1000', v_lim USING ERRCODE = '22003';
    END IF;
    IF $3 < 0 OR $4 < 0 THEN
        RAISE EXCEPTION 'after_txid and after_id must not be negative' USING ERRCODE = '22003';
    END IF;
    SELECT q.queue_id INTO v_q FROM pgque.queue q WHERE q.queue_name OPERATOR(pg_catalog.=) $1;
    IF v_q IS NULL THEN
        RAISE EXCEPTION 'queue not found: %', $1 USING ERRCODE = '42704';
    END IF;
    IF $2 IS NOT NULL THEN
        SELECT s.sub_id INTO v_sub FROM pgque.subscription s
         WHERE s.sub_queue OPERATOR(pg_catalog.=) v_q AND s.sub_parent IS NULL
           AND s.sub_consumer OPERATOR(pg_catalog.=) $2;
        IF v_sub IS NULL THEN
            RAISE EXCEPTION 'consumer not registered: % on queue %', $2, $1 USING ERRCODE = '42704';
        END IF;
        SELECT p.pos_tick INTO v_pos FROM pgque.consumer_position p
         WHERE p.sub_id OPERATOR(pg_catalog.=) v_sub;
    ELSE
        SELECT pg_catalog.min(p.pos_tick) INTO v_pos FROM pgque.consumer_position p
         WHERE p.sub_queue OPERATOR(pg_catalog.=) v_q;
    END IF;
    IF v_pos IS NULL THEN
        RETURN;
    END IF;
    SELECT t.tick_snapshot INTO v_snap FROM pgque.tick t
     WHERE t.tick_queue OPERATOR(pg_catalog.=) v_q AND t.tick_id OPERATOR(pg_catalog.=) v_pos
     LIMIT 1;
    IF v_snap IS NULL THEN
        RETURN;
    END IF;
    v_from := pg_catalog.pg_snapshot_xmin(v_snap);
    IF $3 IS NOT NULL AND ($3::text)::pg_catalog.xid8 OPERATOR(pg_catalog.>) v_from THEN
        v_from := ($3::text)::pg_catalog.xid8;
    END IF;
    -- (the table's name is made of the queue's integer id)
    RETURN QUERY EXECUTE pg_catalog.format(
        'SELECT e.ev_id, e.ev_txid::text::int8, e.ev_time, e.ev_type,
                CASE WHEN $7 THEN e.ev_data END, e.ev_extra1,
                e.ev_retry, s.sub_consumer, CASE WHEN $7 THEN e.ev_headers END
           FROM pgque.%I e
           LEFT JOIN pgque.subscription s ON s.sub_id OPERATOR(pg_catalog.=) e.ev_owner
          WHERE e.ev_txid OPERATOR(pg_catalog.>=) $1
            AND NOT pg_catalog.pg_visible_in_snapshot(e.ev_txid, $2)
            AND ($3::int8 IS NULL
                 OR (e.ev_txid::text::int8, e.ev_id) OPERATOR(pg_catalog.>) ($3::int8, COALESCE($4, -1)))
            AND ($5::int4 IS NULL OR e.ev_owner IS NULL OR e.ev_owner OPERATOR(pg_catalog.=) $5)
          ORDER BY e.ev_txid, e.ev_id
          LIMIT $6', 'event_' || v_q::text)
    USING v_from, v_snap, $3, $4, v_sub, v_lim, v_admin;
END
$browse_events$;

-- One page of the dead letters of queue `queue_name`, newest first: those
-- with an id below `before_id` (NULL: from the newest), at most
-- `max_letters` (1..1000), with their payloads, partition keys and the
-- reason each was given up on. Pass the last row's dl_id as before_id for
-- the next page. One index range per page (dead_letter_queue_id_idx).
-- ev_data, headers and dl_reason (the consumer's error text) are NULL for a
-- caller without pgque_admin (sql/34_explorer.sql says who and why).
-- Errors: 22004 NULL queue_name, 42704 unknown queue, 22003 max_letters
-- outside 1..1000.
CREATE FUNCTION pgque.browse_dead_letters(queue_name text, before_id bigint DEFAULT NULL,
                                          max_letters int DEFAULT 50)
RETURNS TABLE (dl_id bigint, consumer text, dl_time timestamptz, dl_reason text, ev_id bigint,
               ev_time timestamptz, ev_retry int, ev_type text, ev_data text, partition_key text,
               headers jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pgque, pg_temp
SET jit = off
SET enable_seqscan = off
AS $browse_dead_letters$
DECLARE
    v_q int4;
    v_lim int := COALESCE($3, 50);
    v_admin boolean := pg_catalog.pg_has_role(COALESCE(NULLIF(pg_catalog.current_setting('role'), 'none'), session_user::text)::name,
                                'pgque_admin', 'USAGE');
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'queue_name must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF v_lim < 1 OR v_lim > 1000 THEN
        RAISE EXCEPTION 'max_letters % is outside 1..1000', v_lim USING ERRCODE = '22003';
    END IF;
    SELECT q.queue_id INTO v_q FROM pgque.queue q WHERE q.queue_name OPERATOR(pg_catalog.=) $1;
    IF v_q IS NULL THEN
        RAISE EXCEPTION 'queue not found: %', $1 USING ERRCODE = '42704';
    END IF;
    RETURN QUERY
    SELECT d.dl_id, d.dl_consumer, d.dl_time, CASE WHEN v_admin THEN d.dl_reason END, d.ev_id,
           d.ev_time, d.ev_retry, d.ev_type, CASE WHEN v_admin THEN d.ev_data END, d.ev_extra1,
           CASE WHEN v_admin THEN d.ev_headers END
      FROM pgque.dead_letter_store d
     WHERE d.dl_queue OPERATOR(pg_catalog.=) v_q
       AND d.dl_id OPERATOR(pg_catalog.<) COALESCE($2, 9223372036854775807)
     ORDER BY d.dl_id DESC
     LIMIT v_lim;
END
$browse_dead_letters$;

REVOKE ALL ON FUNCTION pgque.browse_events(text, text, bigint, bigint, int),
    pgque.browse_dead_letters(text, bigint, int)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.browse_events(text, text, bigint, bigint, int),
    pgque.browse_dead_letters(text, bigint, int)
  TO pgque_reader, pgque_admin;
