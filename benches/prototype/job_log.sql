-- Job log prototype (schema `jl`): a job store whose hot path writes the job
-- once (an append to a rotating log segment) and does its bookkeeping per
-- batch, not per job. Design and reasons: docs/design/job-log.md. This is a
-- PL/pgSQL prototype to measure the shape, not the product (the product is
-- Rust running the same statements through SPI, see the design's last part).
--
-- Hot path, per batch of n jobs:
--   enqueue   lane advisory lock; one INSERT of n log rows (2 btree entries each)
--   dispatch  lane advisory lock; an index range read of n log rows after the
--             lane cursor; ONE claim row (the lease token = claim_id)
--   complete  claim advisory lock; ONE claim_done row naming the n ids
-- Nothing of the hot path UPDATEs or DELETEs a row: the log, the claims and
-- the completions are append-only and leave by TRUNCATE of a whole segment.
-- Jobs that leave the fast path (failed, rescued, snoozed, cancelled,
-- parked by capacity/identity, scheduled, long-running across a rotation) get
-- a row in jl.side, a classic MVCC job row with the lifecycle of pgque.jobs.
--
-- Load: psql -f benches/prototype/job_log.sql (drops and recreates jl).
DROP SCHEMA IF EXISTS jl CASCADE;
CREATE SCHEMA jl;

-- ---- configuration --------------------------------------------------------------------
CREATE TABLE jl.queue (
    queue_name   text PRIMARY KEY,
    mode         text NOT NULL DEFAULT 'strict_fifo' CHECK (mode IN ('strict_fifo', 'round_robin')),
    max_attempts int NOT NULL DEFAULT 25,
    lease        interval NOT NULL DEFAULT '5 minutes',
    paused       boolean NOT NULL DEFAULT false
);

-- A lane is the unit of FIFO: (queue, priority, shard). `pos` in the log is
-- dense per lane and taken under the lane's advisory lock, so within a lane
-- pos order is commit order and every snapshot sees a prefix of the lane.
-- The lane's dispatch cursor is not stored here: it is the highest hi_pos of
-- the lane's claims (an index probe), so dispatch writes no lane row. The two
-- floors remember head and cursor across the truncation of the segments that
-- held them (written by rotation only).
CREATE TABLE jl.lane (
    lane_id      int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text NOT NULL,
    priority     smallint NOT NULL,
    shard        smallint NOT NULL DEFAULT 0,
    pos_floor    bigint NOT NULL DEFAULT 0,
    cursor_floor bigint NOT NULL DEFAULT 0,
    UNIQUE (queue, priority, shard)
);

-- Segment ring: K segments, one current; rotation switches to the next empty
-- one and truncates the oldest once it is safe (jl.rotate).
CREATE TABLE jl.meta (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    cur_seg         smallint NOT NULL DEFAULT 0,
    nsegs           smallint NOT NULL DEFAULT 3,
    rotation_period interval NOT NULL DEFAULT '10 minutes',
    -- max(completed_job_retention, job_event_retention): a segment is kept at
    -- least this long after it stopped being current.
    retention       interval NOT NULL DEFAULT '1 day'
);
INSERT INTO jl.meta DEFAULT VALUES;
CREATE TABLE jl.seg (
    seg       smallint PRIMARY KEY,
    opened_at timestamptz,
    sealed_at timestamptz,
    empty     boolean NOT NULL DEFAULT true
);
INSERT INTO jl.seg VALUES (0, now(), NULL, false), (1, NULL, NULL, true), (2, NULL, NULL, true);

CREATE SEQUENCE jl.job_id_seq AS bigint;
CREATE SEQUENCE jl.token_seq AS bigint;

-- ---- the log: one row per enqueue batch and lane -----------------------------------------
-- The jobs of one enqueue call that land in one lane are ONE row: parallel
-- arrays, lz4-compressed (a batch of 100 ~230-byte jobs is ~1.3 kB on disk and
-- stays inline: no TOAST table). Job k (1-based) of the row has lane position
-- pos_lo + k - 1 and job id batch_id * 1024 + ords[k] (ords NULL: k - 1), so
-- ids follow input order and a job is found from its id by an index probe on
-- batch_id (= job_id >> 10). A row written for one job that already had an id
-- (promotion of a scheduled job, a migrated 0.2.0 job) has batch_id = -job_id.
-- Optional arrays are NULL when no job of the row has the attribute.
CREATE TABLE jl.log (
    seg           smallint NOT NULL,
    lane_id       int NOT NULL,
    pos_lo        bigint NOT NULL,
    pos_hi        bigint NOT NULL,
    batch_id      bigint NOT NULL,
    enqueued_at   timestamptz NOT NULL,
    max_attempts  int NOT NULL,
    ords          int2[],
    kinds         text[] NOT NULL,
    args          jsonb[] NOT NULL,
    run_ats       timestamptz[],
    actors        text[],
    fairness_keys text[],
    identity_keys text[],
    unique_keys   text[]
) PARTITION BY LIST (seg);
CREATE TABLE jl.log_0 PARTITION OF jl.log FOR VALUES IN (0);
CREATE TABLE jl.log_1 PARTITION OF jl.log FOR VALUES IN (1);
CREATE TABLE jl.log_2 PARTITION OF jl.log FOR VALUES IN (2);
DO $$
BEGIN
    FOR i IN 0..2 LOOP
        EXECUTE format('ALTER TABLE jl.log_%s ALTER COLUMN args SET COMPRESSION lz4, '
                       'ALTER COLUMN kinds SET COMPRESSION lz4', i);
    END LOOP;
END $$;
CREATE INDEX log_lane_pos ON jl.log (lane_id, pos_hi);   -- dispatch: the lane after its cursor
CREATE INDEX log_batch ON jl.log (batch_id);             -- per-job lookups (status, cancel, fail)
CREATE SEQUENCE jl.batch_id_seq AS bigint;

-- the log, one row per job
CREATE VIEW jl.log_job AS
SELECT g.seg, g.lane_id, g.pos_lo + u.k - 1 AS pos,
       CASE WHEN g.batch_id < 0 THEN -g.batch_id ELSE g.batch_id * 1024 + COALESCE(g.ords[u.k], u.k - 1) END AS job_id,
       g.enqueued_at, COALESCE(u.ra, g.enqueued_at) AS run_at, g.max_attempts, u.kind, u.args, u.actor,
       u.fk AS fairness_key, u.ik AS identity_key, u.uk AS unique_key, g.batch_id, g.pos_hi
FROM jl.log g
CROSS JOIN LATERAL unnest(g.kinds, g.args, g.run_ats, g.actors, g.fairness_keys, g.identity_keys, g.unique_keys)
     WITH ORDINALITY AS u(kind, args, ra, actor, fk, ik, uk, k);

-- the first p_n jobs of a lane after position p_cur: only the log rows
-- overlapping positions p_cur+1 .. p_cur+p_n are read, whatever the lane's depth
CREATE FUNCTION jl.lane_window(p_lane int, p_cur bigint, p_n int) RETURNS SETOF jl.log_job
LANGUAGE sql STABLE AS $$
    SELECT j.* FROM jl.log_job j
    WHERE j.lane_id = p_lane
      AND j.pos_hi > p_cur AND j.pos_hi < p_cur + p_n + 1024   -- the rows overlapping (p_cur, p_cur + p_n]:
      AND j.pos > p_cur AND j.pos <= p_cur + p_n               -- positions are dense in a lane
    ORDER BY j.pos
$$;

-- ---- claims: one row per (dispatch, lane) ------------------------------------------------
-- claim_id is the lease token of every job it names. job_ids lists the claimed
-- jobs of the lane range (lo_pos, hi_pos]; the range's other rows were moved to
-- jl.side (parked, cancelled) in the same statement. actors/identities/ukeys
-- are parallel arrays, NULL unless some job carries one (flags says which), so
-- releases never read the log.
CREATE TABLE jl.claim (
    seg           smallint NOT NULL,
    claim_id      bigint NOT NULL,
    lane_id       int NOT NULL,
    lo_pos        bigint NOT NULL,
    hi_pos        bigint NOT NULL,
    n             int NOT NULL,
    job_ids       bigint[] NOT NULL,
    flags         int NOT NULL DEFAULT 0,      -- 1 capped actors, 2 identities, 4 unique keys
    actors        text[],
    identities    text[],
    ukeys         text[],
    worker        text NOT NULL,
    dispatched_at timestamptz NOT NULL,
    lease_until   timestamptz NOT NULL,
    state         "char" NOT NULL DEFAULT 'a'   -- a active, s settled, r rescued, e evacuated
) PARTITION BY LIST (seg);
CREATE TABLE jl.claim_0 PARTITION OF jl.claim FOR VALUES IN (0);
CREATE TABLE jl.claim_1 PARTITION OF jl.claim FOR VALUES IN (1);
CREATE TABLE jl.claim_2 PARTITION OF jl.claim FOR VALUES IN (2);
CREATE INDEX claim_id_idx ON jl.claim (claim_id);
CREATE INDEX claim_lane_hi ON jl.claim (lane_id, hi_pos);            -- the lane cursor
CREATE INDEX claim_lease ON jl.claim (lease_until) WHERE state = 'a'; -- rescue

-- ---- completions: one row per (complete call, claim) -----------------------------------
-- kind 'c' completed, 'o' left the claim otherwise (failed, snoozed,
-- cancelled, evacuated: its row in jl.side says how).
CREATE TABLE jl.claim_done (
    seg      smallint NOT NULL,
    claim_id bigint NOT NULL,
    kind     "char" NOT NULL,
    job_ids  bigint[] NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (seg);
CREATE TABLE jl.claim_done_0 PARTITION OF jl.claim_done FOR VALUES IN (0);
CREATE TABLE jl.claim_done_1 PARTITION OF jl.claim_done FOR VALUES IN (1);
CREATE TABLE jl.claim_done_2 PARTITION OF jl.claim_done FOR VALUES IN (2);
CREATE INDEX claim_done_claim ON jl.claim_done (claim_id);

-- ---- the side store: jobs off the fast path ---------------------------------------------
-- A classic job row (the lifecycle of pgque.jobs), for the jobs that need
-- per-job state: scheduled, failed-and-retrying, rescued, snoozed, cancelled,
-- parked (capacity/identity), evacuated by rotation while running, failed.
-- lane_id/pos keep a job's place in its lane, so a retried job is dispatched
-- before the lane's later jobs (merge by (priority, pos)). A row here
-- overrides the job's log row.
CREATE TABLE jl.side (
    job_id       bigint PRIMARY KEY,
    queue        text NOT NULL,
    lane_id      int,
    pos          bigint,              -- NULL: never ready yet (scheduled at enqueue)
    priority     smallint NOT NULL,
    state        text NOT NULL CHECK (state IN
                 ('scheduled', 'ready', 'parked', 'running', 'completed', 'failed', 'cancelled')),
    park_reason  text,
    run_at       timestamptz NOT NULL,
    enqueued_at  timestamptz NOT NULL,
    attempt      int NOT NULL DEFAULT 0,
    max_attempts int NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL,
    actor        text,
    fairness_key text,
    identity_key text,
    unique_key   text,
    worker       text,
    lease_token  bigint,
    lease_until  timestamptz,
    finished_at  timestamptz,
    errors       jsonb
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 200);
CREATE INDEX side_lane_pos ON jl.side (lane_id, pos);   -- holes in a lane range
CREATE INDEX side_ready ON jl.side (queue, priority, pos) WHERE state = 'ready';
CREATE INDEX side_sched ON jl.side (run_at) WHERE state = 'scheduled';
CREATE INDEX side_running ON jl.side (lease_until) WHERE state = 'running';
CREATE INDEX side_parked_actor ON jl.side (actor, priority, pos) WHERE state = 'parked' AND park_reason = 'capacity';
CREATE INDEX side_parked_ident ON jl.side (queue, identity_key, priority, pos) WHERE state = 'parked' AND park_reason = 'identity';
CREATE INDEX side_terminal ON jl.side (state, finished_at) WHERE state IN ('completed', 'failed', 'cancelled');

-- capped actors only (an actor without a row is unlimited and costs nothing)
CREATE TABLE jl.actor_cap (
    actor          text PRIMARY KEY,
    max_concurrent int NOT NULL,
    running        int NOT NULL DEFAULT 0,
    parked         int NOT NULL DEFAULT 0
) WITH (fillfactor = 50);
CREATE TABLE jl.running_identity (
    queue        text NOT NULL,
    identity_key text NOT NULL,
    job_id       bigint NOT NULL,
    PRIMARY KEY (queue, identity_key)
);
-- unique keys of live jobs (deleted when the job becomes terminal)
CREATE TABLE jl.ukey (
    queue      text NOT NULL,
    unique_key text NOT NULL,
    job_id     bigint NOT NULL,
    PRIMARY KEY (queue, unique_key)
);
-- narration of the rare transitions; the hot ones (enqueued, dispatched,
-- completed) are read from the log, claims and completions (jl.job_events_all).
CREATE TABLE jl.job_events (
    at      timestamptz NOT NULL DEFAULT now(),
    job_id  bigint NOT NULL,
    queue   text NOT NULL,
    event   text NOT NULL,
    attempt int,
    detail  text
);
CREATE INDEX job_events_job ON jl.job_events (job_id);
CREATE INDEX job_events_at ON jl.job_events (at);

-- ---- admin -------------------------------------------------------------------------------
CREATE FUNCTION jl.create_queue(p_queue text, p_mode text DEFAULT 'strict_fifo', p_max_attempts int DEFAULT 25,
                                p_lease interval DEFAULT '5 minutes') RETURNS void
LANGUAGE sql AS $$
    INSERT INTO jl.queue (queue_name, mode, max_attempts, lease) VALUES (p_queue, p_mode, p_max_attempts, p_lease);
$$;

CREATE FUNCTION jl.set_actor_capacity(p_actor text, p_max int) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO jl.actor_cap (actor, max_concurrent) VALUES (p_actor, p_max)
    ON CONFLICT (actor) DO UPDATE SET max_concurrent = excluded.max_concurrent;
$$;

-- lane ids of (queue, priority), created on first use
CREATE FUNCTION jl.lane_ids(p_queue text, p_prios smallint[]) RETURNS TABLE (priority smallint, lane_id int)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO jl.lane (queue, priority)
    SELECT p_queue, p FROM (SELECT DISTINCT unnest(p_prios) AS p) x
    WHERE NOT EXISTS (SELECT 1 FROM jl.lane l WHERE l.queue = p_queue AND l.priority = x.p AND l.shard = 0)
    ORDER BY 2
    ON CONFLICT DO NOTHING;
    RETURN QUERY SELECT l.priority, l.lane_id FROM jl.lane l
                 WHERE l.queue = p_queue AND l.shard = 0 AND l.priority = ANY (p_prios);
END $$;

-- ---- enqueue -----------------------------------------------------------------------------
-- One call per batch: ids in input order (nextval in ord order), lane FIFO by
-- commit order (pos under the lane lock), unique keys skip/error, future run_at
-- to jl.side as scheduled, one NOTIFY per queue per transaction.
CREATE FUNCTION jl.enqueue(p_queue text, p_kinds text[], p_args jsonb[],
                           p_priorities smallint[] DEFAULT NULL, p_run_at timestamptz[] DEFAULT NULL,
                           p_actors text[] DEFAULT NULL, p_fairness_keys text[] DEFAULT NULL,
                           p_identity_keys text[] DEFAULT NULL, p_unique_keys text[] DEFAULT NULL,
                           p_on_duplicate text DEFAULT 'skip')
RETURNS TABLE (ord int, job_id bigint, state text)
LANGUAGE plpgsql AS $$
DECLARE
    v_max_attempts int;
    v_simple boolean;
    v_lanes int[];
BEGIN
    SELECT q.max_attempts INTO v_max_attempts FROM jl.queue q WHERE q.queue_name = p_queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job queue % does not exist', p_queue USING ERRCODE = '42704';
    END IF;
    v_simple := p_priorities IS NULL AND p_run_at IS NULL AND p_unique_keys IS NULL;
    IF v_simple THEN
        -- the common batch: one lane (priority 0), all ready, no unique keys.
        SELECT array_agg(l.lane_id) INTO v_lanes FROM jl.lane l
         WHERE l.queue = p_queue AND l.priority = 0 AND l.shard = 0;
        IF v_lanes IS NULL THEN
            SELECT array_agg(x.lane_id) INTO v_lanes FROM jl.lane_ids(p_queue, ARRAY[0::smallint]) x;
        END IF;
        PERFORM pg_advisory_xact_lock(1785684600, v_lanes[1]);
        -- a new statement: its snapshot is taken after the lane lock, so it
        -- sees the lane's last committed pos.
        RETURN QUERY
        WITH head AS MATERIALIZED (
            SELECT greatest((SELECT l.pos_floor FROM jl.lane l WHERE l.lane_id = v_lanes[1]),
                            COALESCE((SELECT g.pos_hi AS pos FROM jl.log g WHERE g.lane_id = v_lanes[1]
                                      ORDER BY g.pos_hi DESC LIMIT 1), 0)) AS h
        ),
        ins AS (
            INSERT INTO jl.log (seg, lane_id, pos_lo, pos_hi, batch_id, enqueued_at, max_attempts, kinds, args,
                                actors, fairness_keys, identity_keys)
            SELECT (SELECT m.cur_seg FROM jl.meta m), v_lanes[1], h.h + 1, h.h + cardinality(p_kinds),
                   nextval('jl.batch_id_seq'), now(), v_max_attempts, p_kinds, p_args,
                   CASE WHEN cardinality(array_remove(p_actors, NULL)) > 0 THEN p_actors END,
                   CASE WHEN cardinality(array_remove(p_fairness_keys, NULL)) > 0 THEN p_fairness_keys END,
                   CASE WHEN cardinality(array_remove(p_identity_keys, NULL)) > 0 THEN p_identity_keys END
            FROM head h
            RETURNING jl.log.batch_id
        )
        SELECT k::int, (SELECT i.batch_id FROM ins i) * 1024 + k - 1, 'ready'::text
        FROM generate_series(1, cardinality(p_kinds)) k;
        PERFORM pg_notify('jl_jobs_' || p_queue, '');
        RETURN;
    END IF;
    -- general batch: several lanes, scheduled rows, unique keys.
    RETURN QUERY SELECT * FROM jl.enqueue_general(p_queue, v_max_attempts, p_kinds, p_args, p_priorities, p_run_at,
                                                  p_actors, p_fairness_keys, p_identity_keys, p_unique_keys,
                                                  p_on_duplicate);
END $$;

CREATE FUNCTION jl.enqueue_general(p_queue text, p_max_attempts int, p_kinds text[], p_args jsonb[],
                                   p_priorities smallint[], p_run_at timestamptz[],
                                   p_actors text[], p_fairness_keys text[], p_identity_keys text[],
                                   p_unique_keys text[], p_on_duplicate text)
RETURNS TABLE (ord int, job_id bigint, state text)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    v_dup bigint;
    v_prios smallint[];
    v_batch bigint;
BEGIN
    IF cardinality(p_kinds) > 1024 THEN
        RAISE EXCEPTION 'the prototype takes at most 1024 jobs per call' USING ERRCODE = '22003';
    END IF;
    v_batch := nextval('jl.batch_id_seq');
    CREATE TEMP TABLE IF NOT EXISTS jl_in (o int, k text, a jsonb, pr smallint, ra timestamptz, sched boolean,
                                           act text, fk text, ik text, uk text, id bigint, lane_id int,
                                           st text);
    DELETE FROM jl_in;
    INSERT INTO jl_in
    SELECT u.o, u.k, u.a, COALESCE(u.pr, 0), COALESCE(u.ra, now()), COALESCE(u.ra > now(), false),
           u.act, u.fk, u.ik, u.uk, v_batch * 1024 + u.o - 1, NULL, NULL
    FROM (SELECT * FROM unnest(p_kinds, p_args,
                               COALESCE(p_priorities, array_fill(NULL::smallint, ARRAY[cardinality(p_kinds)])),
                               COALESCE(p_run_at, array_fill(NULL::timestamptz, ARRAY[cardinality(p_kinds)])),
                               p_actors, p_fairness_keys, p_identity_keys, p_unique_keys)
                   WITH ORDINALITY AS u(k, a, pr, ra, act, fk, ik, uk, o)
          ORDER BY u.o) u;
    -- unique keys of live jobs: first holder wins, later ones are duplicates
    FOR r IN SELECT * FROM jl_in WHERE uk IS NOT NULL ORDER BY o LOOP
        INSERT INTO jl.ukey VALUES (p_queue, r.uk, r.id) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            SELECT k.job_id INTO v_dup FROM jl.ukey k WHERE k.queue = p_queue AND k.unique_key = r.uk;
            IF p_on_duplicate = 'error' THEN
                RAISE EXCEPTION 'job % of the batch has a unique key that a live job holds already', r.o
                      USING ERRCODE = '23505', DETAIL = format('The job holding it is %s.', v_dup);
            END IF;
            UPDATE jl_in SET st = 'duplicate', id = v_dup WHERE o = r.o;
        END IF;
    END LOOP;
    SELECT array_agg(DISTINCT pr) INTO v_prios FROM jl_in WHERE st IS NULL AND NOT sched;
    IF v_prios IS NOT NULL THEN
        UPDATE jl_in i SET lane_id = l.lane_id FROM jl.lane_ids(p_queue, v_prios) l
         WHERE l.priority = i.pr AND i.st IS NULL AND NOT i.sched;
        PERFORM pg_advisory_xact_lock(1785684600, x.lane_id)
        FROM (SELECT DISTINCT lane_id FROM jl_in WHERE lane_id IS NOT NULL ORDER BY 1) x;
        INSERT INTO jl.log (seg, lane_id, pos_lo, pos_hi, batch_id, enqueued_at, max_attempts, ords, kinds, args,
                            actors, fairness_keys, identity_keys, unique_keys)
        SELECT (SELECT m.cur_seg FROM jl.meta m), x.lane_id, x.h + 1, x.h + x.n, v_batch, now(), p_max_attempts,
               x.ords, x.kinds, x.args, x.actors, x.fks, x.iks, x.uks
        FROM (SELECT i.lane_id,
                     greatest(min(l.pos_floor), COALESCE((SELECT g.pos_hi FROM jl.log g WHERE g.lane_id = i.lane_id
                                                         ORDER BY g.pos_hi DESC LIMIT 1), 0)) AS h,
                     count(*)::int AS n,
                     array_agg((i.o - 1)::int2 ORDER BY i.o) AS ords, array_agg(i.k ORDER BY i.o) AS kinds,
                     array_agg(i.a ORDER BY i.o) AS args,
                     CASE WHEN bool_or(i.act IS NOT NULL) THEN array_agg(i.act ORDER BY i.o) END AS actors,
                     CASE WHEN bool_or(i.fk IS NOT NULL) THEN array_agg(i.fk ORDER BY i.o) END AS fks,
                     CASE WHEN bool_or(i.ik IS NOT NULL) THEN array_agg(i.ik ORDER BY i.o) END AS iks,
                     CASE WHEN bool_or(i.uk IS NOT NULL) THEN array_agg(i.uk ORDER BY i.o) END AS uks
              FROM jl_in i JOIN jl.lane l ON l.lane_id = i.lane_id
              WHERE i.st IS NULL AND NOT i.sched
              GROUP BY i.lane_id) x;
        PERFORM pg_notify('jl_jobs_' || p_queue, '');
    END IF;
    INSERT INTO jl.side (job_id, queue, priority, state, run_at, enqueued_at, max_attempts, kind, args,
                         actor, fairness_key, identity_key, unique_key)
    SELECT i.id, p_queue, i.pr, 'scheduled', i.ra, now(), p_max_attempts, i.k, i.a, i.act, i.fk, i.ik, i.uk
    FROM jl_in i WHERE i.st IS NULL AND i.sched;
    RETURN QUERY SELECT i.o, i.id, COALESCE(i.st, CASE WHEN i.sched THEN 'scheduled' ELSE 'ready' END)
                 FROM jl_in i ORDER BY i.o;
END $$;

-- ---- dispatch ----------------------------------------------------------------------------
-- strict_fifo: claims up to p_limit jobs in (priority, pos) order from the
-- queues' lanes and the side store's ready jobs. Lanes are locked (advisory,
-- lane order) for the statement's transaction, which serialises dispatchers of
-- a lane; the next statement's snapshot sees the lane's latest claims.
CREATE FUNCTION jl.dispatch(p_queues text[], p_limit int, p_worker text,
                            p_lease interval DEFAULT NULL, p_oversample int DEFAULT 2)
RETURNS TABLE (job_id bigint, queue text, kind text, args jsonb, priority smallint, attempt int,
               max_attempts int, actor text, fairness_key text, identity_key text, run_at timestamptz,
               enqueued_at timestamptz, lease_token bigint, lease_until timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_lanes int[];
    v_n int;
BEGIN
    -- the lanes, locked in lane order (one statement: lookup and locks)
    SELECT array_agg(x.lane_id ORDER BY x.lane_id) INTO v_lanes
      FROM (SELECT l.lane_id, pg_advisory_xact_lock(1785684600, l.lane_id)
              FROM jl.lane l JOIN jl.queue q ON q.queue_name = l.queue
             WHERE l.queue = ANY (p_queues) AND NOT q.paused
             ORDER BY l.lane_id) x;
    IF v_lanes IS NULL THEN
        RETURN;
    END IF;
    -- Fast path: the first p_limit jobs of a single lane need no admission
    -- (no capped actor, no identity key, no hole in the range, nothing ready in
    -- the side store). The statement writes only when that holds; otherwise it
    -- returns nothing and the general path runs.
    IF cardinality(v_lanes) = 1 THEN
        RETURN QUERY
        WITH ln AS MATERIALIZED (
            SELECT l.lane_id, q.queue_name, l.priority, COALESCE(p_lease, q.lease) AS lease,
                   greatest(l.cursor_floor,
                            COALESCE((SELECT c.hi_pos FROM jl.claim c WHERE c.lane_id = l.lane_id
                                      ORDER BY c.hi_pos DESC LIMIT 1), 0)) AS cur
            FROM jl.lane l JOIN jl.queue q ON q.queue_name = l.queue
            WHERE l.lane_id = v_lanes[1]
        ),
        c AS MATERIALIZED (
            SELECT g.pos, g.job_id, g.kind, g.args, g.max_attempts, g.actor, g.fairness_key,
                   g.identity_key, g.unique_key, g.run_at, g.enqueued_at
            FROM ln CROSS JOIN LATERAL (
                -- positions are dense in a lane, so the next p_limit jobs are
                -- positions cur+1 .. cur+p_limit: the rows overlapping them, found
                -- by a bounded index range (a row holds at most 1024 jobs), and
                -- only those rows are unpacked
                SELECT j.* FROM (SELECT r.* FROM jl.log r
                                 WHERE r.lane_id = ln.lane_id AND r.pos_hi > ln.cur
                                   AND r.pos_hi < ln.cur + p_limit + 1024 AND r.pos_lo <= ln.cur + p_limit) r
                CROSS JOIN LATERAL (
                    SELECT r.pos_lo + u.k - 1 AS pos,
                           CASE WHEN r.batch_id < 0 THEN -r.batch_id
                                ELSE r.batch_id * 1024 + COALESCE(r.ords[u.k], u.k - 1) END AS job_id,
                           u.kind, u.args, r.max_attempts, u.actor, u.fk AS fairness_key, u.ik AS identity_key,
                           u.uk AS unique_key, COALESCE(u.ra, r.enqueued_at) AS run_at, r.enqueued_at
                    FROM unnest(r.kinds, r.args, r.run_ats, r.actors, r.fairness_keys, r.identity_keys, r.unique_keys)
                         WITH ORDINALITY AS u(kind, args, ra, actor, fk, ik, uk, k)
                    WHERE r.pos_lo + u.k - 1 > ln.cur AND r.pos_lo + u.k - 1 <= ln.cur + p_limit) j
                ORDER BY j.pos LIMIT p_limit) g
        ),
        ok AS MATERIALIZED (
            SELECT NOT EXISTS (SELECT 1 FROM c WHERE c.identity_key IS NOT NULL
                                  OR (c.actor IS NOT NULL AND EXISTS (SELECT 1 FROM jl.actor_cap a WHERE a.actor = c.actor)))
               AND NOT EXISTS (SELECT 1 FROM jl.side s, ln WHERE s.lane_id = ln.lane_id AND s.pos > ln.cur)
               AND NOT EXISTS (SELECT 1 FROM jl.side s, ln WHERE s.queue = ln.queue_name AND s.state = 'ready'
                                  AND s.priority <= ln.priority) AS ok
        ),
        cl AS (
            INSERT INTO jl.claim (seg, claim_id, lane_id, lo_pos, hi_pos, n, job_ids, flags, ukeys, worker,
                                  dispatched_at, lease_until)
            SELECT (SELECT m.cur_seg FROM jl.meta m), nextval('jl.token_seq'), ln.lane_id, ln.cur + 1,
                   x.hi, x.n, x.ids, CASE WHEN x.keyed THEN 4 ELSE 0 END, CASE WHEN x.keyed THEN x.ukeys END,
                   p_worker, now(), clock_timestamp() + ln.lease
            FROM ln, (SELECT max(c.pos) AS hi, count(*)::int AS n, array_agg(c.job_id ORDER BY c.pos) AS ids,
                             bool_or(c.unique_key IS NOT NULL) AS keyed,
                             array_agg(c.unique_key ORDER BY c.pos) AS ukeys FROM c) x
            WHERE x.n > 0 AND (SELECT ok.ok FROM ok)
            RETURNING jl.claim.claim_id, jl.claim.lease_until
        )
        SELECT c.job_id, ln.queue_name, c.kind, c.args, ln.priority, 1, c.max_attempts, c.actor, c.fairness_key,
               c.identity_key, c.run_at, c.enqueued_at, cl.claim_id, cl.lease_until
        FROM c CROSS JOIN ln CROSS JOIN cl
        ORDER BY c.pos;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n > 0 THEN
            RETURN;
        END IF;
        -- nothing claimed: an empty lane and no side-ready job is the common
        -- reason (two index probes), and needs no general pass
        IF NOT EXISTS (SELECT 1 FROM jl.log r JOIN jl.lane l ON l.lane_id = r.lane_id
                       WHERE r.lane_id = v_lanes[1]
                         AND r.pos_hi > greatest(l.cursor_floor,
                                                 COALESCE((SELECT c.hi_pos FROM jl.claim c WHERE c.lane_id = l.lane_id
                                                           ORDER BY c.hi_pos DESC LIMIT 1), 0)))
           AND NOT EXISTS (SELECT 1 FROM jl.side s WHERE s.queue = ANY (p_queues) AND s.state = 'ready') THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM jl.dispatch_general(p_queues, v_lanes, p_limit, p_worker, p_lease, p_oversample);
END $$;

-- The general path: admission (capacity, identity), holes, side-ready jobs,
-- several lanes. Jobs of the examined range that may not run now are PARKED
-- (moved to jl.side) so the lane cursor can pass them: the next dispatch does
-- not walk them again (O(limit) however many jobs a capped actor has queued),
-- and a release unparks them in (priority, pos) order (per-actor FIFO).
CREATE FUNCTION jl.dispatch_general(p_queues text[], p_lanes int[], p_limit int, p_worker text,
                                    p_lease interval, p_oversample int)
RETURNS TABLE (job_id bigint, queue text, kind text, args jsonb, priority smallint, attempt int,
               max_attempts int, actor text, fairness_key text, identity_key text, run_at timestamptz,
               enqueued_at timestamptz, lease_token bigint, lease_until timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_win int := p_limit * p_oversample;
BEGIN
    CREATE TEMP TABLE IF NOT EXISTS jl_c (
        from_side boolean, lane_id int, queue text, priority smallint, pos bigint, job_id bigint,
        kind text, args jsonb, max_attempts int, attempt int, actor text, fairness_key text,
        identity_key text, unique_key text, run_at timestamptz, enqueued_at timestamptz,
        lease interval, cur bigint, r bigint, verdict text);
    DELETE FROM jl_c;
    -- capped actors with queued jobs in the window are locked first (actor
    -- order), so `running` is read in its latest committed version and no two
    -- dispatchers admit against the same count (lanes of other queues may
    -- hold jobs of the same actor).
    IF EXISTS (SELECT 1 FROM jl.actor_cap) THEN
        PERFORM 1 FROM jl.actor_cap a
        WHERE a.actor IN (
            SELECT g.actor FROM unnest(p_lanes) AS ln(lane_id)
            CROSS JOIN LATERAL (
                SELECT w.actor FROM jl.lane_window(ln.lane_id,
                    greatest((SELECT l.cursor_floor FROM jl.lane l WHERE l.lane_id = ln.lane_id),
                             COALESCE((SELECT c.hi_pos FROM jl.claim c WHERE c.lane_id = ln.lane_id
                                       ORDER BY c.hi_pos DESC LIMIT 1), 0)), v_win) w) g
            UNION
            SELECT s.actor FROM jl.side s WHERE s.queue = ANY (p_queues) AND s.state = 'ready')
        ORDER BY a.actor
        FOR UPDATE;
    END IF;
    -- candidates: each lane's window after its cursor, and the side store's ready jobs
    INSERT INTO jl_c
    SELECT false, ln.lane_id, ln.queue, ln.priority, g.pos, g.job_id, g.kind, g.args, g.max_attempts, 0,
           g.actor, g.fairness_key, g.identity_key, g.unique_key, g.run_at, g.enqueued_at, ln.lease, ln.cur, NULL,
           CASE WHEN EXISTS (SELECT 1 FROM jl.side s WHERE s.lane_id = g.lane_id AND s.pos = g.pos
                               AND s.job_id = g.job_id) THEN 'gone' END
    FROM (SELECT l.lane_id, l.queue, l.priority, COALESCE(p_lease, q.lease) AS lease,
                 greatest(l.cursor_floor, COALESCE((SELECT c.hi_pos FROM jl.claim c WHERE c.lane_id = l.lane_id
                                                    ORDER BY c.hi_pos DESC LIMIT 1), 0)) AS cur
          FROM jl.lane l JOIN jl.queue q ON q.queue_name = l.queue
          WHERE l.lane_id = ANY (p_lanes)) ln
    CROSS JOIN LATERAL (
        SELECT * FROM jl.lane_window(ln.lane_id, ln.cur, v_win)) g;
    INSERT INTO jl_c
    SELECT true, s.lane_id, s.queue, s.priority, s.pos, s.job_id, s.kind, s.args, s.max_attempts, s.attempt,
           s.actor, s.fairness_key, s.identity_key, s.unique_key, s.run_at, s.enqueued_at,
           COALESCE(p_lease, q.lease), NULL, NULL, NULL
    FROM jl.queue q CROSS JOIN LATERAL (
        SELECT * FROM jl.side s WHERE s.queue = q.queue_name AND s.state = 'ready' AND s.run_at <= now()
        ORDER BY s.priority, s.pos LIMIT p_limit) s
    WHERE q.queue_name = ANY (p_queues) AND NOT q.paused;
    UPDATE jl_c c SET r = x.r FROM (
        SELECT c2.job_id, c2.from_side,
               row_number() OVER (ORDER BY c2.priority, c2.pos, c2.from_side DESC, c2.job_id) AS r
        FROM jl_c c2) x
    WHERE x.job_id = c.job_id AND x.from_side = c.from_side;
    -- merged order is only valid up to the end of the first window that may
    -- continue (a full window): beyond it, that window's next jobs would come first
    DELETE FROM jl_c c WHERE c.r > (
        SELECT COALESCE(min(m.r), 9e18) FROM (
            SELECT max(c3.r) AS r FROM jl_c c3 WHERE NOT c3.from_side GROUP BY c3.lane_id HAVING count(*) >= v_win
            UNION ALL
            SELECT max(c3.r) FROM jl_c c3 WHERE c3.from_side GROUP BY c3.queue HAVING count(*) >= p_limit) m);
    -- identity: one per (queue, identity) per call and none whose identity runs,
    -- nor one behind a parked job of the same identity (per-identity FIFO)
    UPDATE jl_c c SET verdict = 'park:identity' FROM (
        SELECT c2.job_id, c2.from_side,
               row_number() OVER (PARTITION BY c2.queue, c2.identity_key ORDER BY c2.r) AS ir
        FROM jl_c c2 WHERE c2.identity_key IS NOT NULL AND c2.verdict IS NULL) x
    WHERE x.job_id = c.job_id AND x.from_side = c.from_side
      AND (x.ir > 1
           OR EXISTS (SELECT 1 FROM jl.running_identity ri WHERE ri.queue = c.queue AND ri.identity_key = c.identity_key)
           OR (NOT c.from_side AND EXISTS (SELECT 1 FROM jl.side s WHERE s.state = 'parked' AND s.park_reason = 'identity'
                                             AND s.queue = c.queue AND s.identity_key = c.identity_key)));
    -- capacity: at most max_concurrent - running per capped actor, none while the
    -- actor has parked jobs (they go first, per-actor FIFO)
    UPDATE jl_c c SET verdict = 'park:capacity' FROM (
        SELECT c2.job_id, c2.from_side, a.max_concurrent, a.running, a.parked,
               row_number() OVER (PARTITION BY c2.actor ORDER BY c2.r) AS ar
        FROM jl_c c2 JOIN jl.actor_cap a ON a.actor = c2.actor
        WHERE c2.verdict IS NULL) x
    WHERE x.job_id = c.job_id AND x.from_side = c.from_side
      AND ((x.parked > 0 AND NOT c.from_side) OR x.ar > x.max_concurrent - x.running);
    UPDATE jl_c c SET verdict = 'take' WHERE c.verdict IS NULL;
    -- stop at p_limit taken jobs: the examined prefix ends there
    DELETE FROM jl_c c WHERE c.r > (
        SELECT COALESCE(max(t.r), 9e18) FROM (
            SELECT c2.r FROM jl_c c2 WHERE c2.verdict = 'take' ORDER BY c2.r LIMIT p_limit) t
        HAVING count(*) >= p_limit);
    -- park: log jobs move to the side store, side jobs change state
    INSERT INTO jl.side (job_id, queue, lane_id, pos, priority, state, park_reason, run_at, enqueued_at,
                         attempt, max_attempts, kind, args, actor, fairness_key, identity_key, unique_key)
    SELECT c.job_id, c.queue, c.lane_id, c.pos, c.priority, 'parked', split_part(c.verdict, ':', 2), c.run_at,
           c.enqueued_at, 0, c.max_attempts, c.kind, c.args, c.actor, c.fairness_key, c.identity_key, c.unique_key
    FROM jl_c c WHERE NOT c.from_side AND c.verdict LIKE 'park:%';
    UPDATE jl.side s SET state = 'parked', park_reason = split_part(c.verdict, ':', 2)
    FROM jl_c c WHERE c.from_side AND c.verdict LIKE 'park:%' AND s.job_id = c.job_id;
    UPDATE jl.actor_cap a SET parked = a.parked + x.n
    FROM (SELECT c.actor, count(*)::int AS n FROM jl_c c WHERE c.verdict = 'park:capacity' GROUP BY c.actor) x
    WHERE a.actor = x.actor;
    INSERT INTO jl.job_events (job_id, queue, event, attempt, detail)
    SELECT c.job_id, c.queue, 'parked', c.attempt, split_part(c.verdict, ':', 2) FROM jl_c c WHERE c.verdict LIKE 'park:%';
    -- takes: identities, capacity counters
    INSERT INTO jl.running_identity (queue, identity_key, job_id)
    SELECT c.queue, c.identity_key, c.job_id FROM jl_c c WHERE c.verdict = 'take' AND c.identity_key IS NOT NULL
    ORDER BY 1, 2;
    UPDATE jl.actor_cap a SET running = a.running + x.n
    FROM (SELECT c.actor, count(*)::int AS n FROM jl_c c WHERE c.verdict = 'take' GROUP BY c.actor) x
    WHERE a.actor = x.actor;
    RETURN QUERY
    WITH cl AS (
        -- one claim per lane that had examined log rows (n = 0 when all were
        -- parked or gone: the claim then only moves the cursor, settled at once)
        INSERT INTO jl.claim (seg, claim_id, lane_id, lo_pos, hi_pos, n, job_ids, flags, actors, identities, ukeys,
                              worker, dispatched_at, lease_until, state)
        SELECT (SELECT m.cur_seg FROM jl.meta m), nextval('jl.token_seq'), x.lane_id, x.cur + 1, x.hi, x.n,
               x.ids, x.flags,
               CASE WHEN x.flags & 1 <> 0 THEN x.actors END, CASE WHEN x.flags & 2 <> 0 THEN x.identities END,
               CASE WHEN x.flags & 4 <> 0 THEN x.ukeys END,
               p_worker, now(), clock_timestamp() + x.lease, CASE WHEN x.n = 0 THEN 's' ELSE 'a' END
        FROM (SELECT c.lane_id, min(c.cur) AS cur, max(c.pos) AS hi, min(c.lease) AS lease,
                     count(*) FILTER (WHERE c.verdict = 'take')::int AS n,
                     COALESCE(array_agg(c.job_id ORDER BY c.pos) FILTER (WHERE c.verdict = 'take'), '{}') AS ids,
                     array_agg(c.actor ORDER BY c.pos) FILTER (WHERE c.verdict = 'take') AS actors,
                     array_agg(c.identity_key ORDER BY c.pos) FILTER (WHERE c.verdict = 'take') AS identities,
                     array_agg(c.unique_key ORDER BY c.pos) FILTER (WHERE c.verdict = 'take') AS ukeys,
                     (CASE WHEN bool_or(c.verdict = 'take' AND c.actor IN (SELECT a.actor FROM jl.actor_cap a)) THEN 1 ELSE 0 END
                      | CASE WHEN bool_or(c.verdict = 'take' AND c.identity_key IS NOT NULL) THEN 2 ELSE 0 END
                      | CASE WHEN bool_or(c.verdict = 'take' AND c.unique_key IS NOT NULL) THEN 4 ELSE 0 END) AS flags
              FROM jl_c c WHERE NOT c.from_side GROUP BY c.lane_id) x
        RETURNING jl.claim.claim_id, jl.claim.lane_id, jl.claim.lease_until
    ),
    su AS (
        UPDATE jl.side s SET state = 'running', attempt = s.attempt + 1, worker = p_worker,
               lease_token = nextval('jl.token_seq'), lease_until = clock_timestamp() + c.lease, park_reason = NULL
        FROM jl_c c WHERE c.from_side AND c.verdict = 'take' AND s.job_id = c.job_id
        RETURNING s.job_id, s.queue, s.attempt, s.lease_token, s.lease_until
    ),
    sev AS (
        INSERT INTO jl.job_events (job_id, queue, event, attempt, detail)
        SELECT su.job_id, su.queue, 'dispatched', su.attempt, p_worker FROM su
    )
    SELECT o.job_id, o.queue, o.kind, o.args, o.priority, o.attempt, o.max_attempts, o.actor, o.fairness_key,
           o.identity_key, o.run_at, o.enqueued_at, o.lease_token, o.lease_until
    FROM (SELECT c.r, c.job_id, c.queue, c.kind, c.args, c.priority, 1 AS attempt, c.max_attempts, c.actor,
                 c.fairness_key, c.identity_key, c.run_at, c.enqueued_at, cl.claim_id AS lease_token, cl.lease_until
          FROM jl_c c JOIN cl ON cl.lane_id = c.lane_id
          WHERE NOT c.from_side AND c.verdict = 'take'
          UNION ALL
          SELECT c.r, c.job_id, c.queue, c.kind, c.args, c.priority, su.attempt, c.max_attempts, c.actor,
                 c.fairness_key, c.identity_key, c.run_at, c.enqueued_at, su.lease_token, su.lease_until
          FROM jl_c c JOIN su ON su.job_id = c.job_id
          WHERE c.from_side) o
    ORDER BY o.r;
END $$;

-- ---- releases -----------------------------------------------------------------------------
-- Jobs that stopped running give back their actor slot and identity; parked
-- jobs that may run now become ready in the side store, earliest first.
CREATE FUNCTION jl.release(p_queue text, p_actors text[], p_identities text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_actors IS NOT NULL THEN
        UPDATE jl.actor_cap a SET running = greatest(a.running - x.n, 0)
        FROM (SELECT u AS actor, count(*)::int AS n FROM unnest(p_actors) u WHERE u IS NOT NULL GROUP BY u ORDER BY u) x
        WHERE a.actor = x.actor;
        PERFORM jl.unpark_actor(x) FROM (SELECT DISTINCT u AS x FROM unnest(p_actors) u WHERE u IS NOT NULL) y;
    END IF;
    IF p_identities IS NOT NULL THEN
        DELETE FROM jl.running_identity ri WHERE ri.queue = p_queue AND ri.identity_key = ANY (p_identities);
        UPDATE jl.side s SET state = 'ready', park_reason = NULL
        WHERE s.job_id IN (
            SELECT DISTINCT ON (p.identity_key) p.job_id FROM jl.side p
            WHERE p.state = 'parked' AND p.park_reason = 'identity' AND p.queue = p_queue
              AND p.identity_key = ANY (p_identities)
            ORDER BY p.identity_key, p.priority, p.pos);
    END IF;
END $$;

CREATE FUNCTION jl.unpark_actor(p_actor text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_free int;
BEGIN
    SELECT a.max_concurrent - a.running INTO v_free FROM jl.actor_cap a WHERE a.actor = p_actor AND a.parked > 0 FOR UPDATE;
    IF v_free IS NULL OR v_free <= 0 THEN
        RETURN;
    END IF;
    WITH u AS (
        UPDATE jl.side s SET state = 'ready', park_reason = NULL
        WHERE s.job_id IN (SELECT p.job_id FROM jl.side p
                           WHERE p.state = 'parked' AND p.park_reason = 'capacity' AND p.actor = p_actor
                           ORDER BY p.priority, p.pos LIMIT v_free)
        RETURNING 1)
    UPDATE jl.actor_cap a SET parked = greatest(a.parked - (SELECT count(*) FROM u), 0) WHERE a.actor = p_actor;
END $$;

-- ---- complete ------------------------------------------------------------------------------
-- Fenced by the claim: a job completes only if it is a member of the claim
-- named by its token, the claim is active (not rescued/evacuated), and the job
-- has not left it (done rows). The claim's advisory lock serialises this with
-- rescue, fail, cancel and other completions of the same claim.
CREATE FUNCTION jl.complete_many(p_ids bigint[], p_tokens bigint[]) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_n int := 0;
    v_side int := 0;
    v_flagged boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(1785684601, (t % 2147483647)::int)
    FROM (SELECT DISTINCT t FROM unnest(p_tokens) t ORDER BY 1) x;
    WITH inp AS MATERIALIZED (
        SELECT DISTINCT u.i, u.t FROM unnest(p_ids, p_tokens) AS u(i, t)
    ),
    cl AS MATERIALIZED (
        -- (the state test stays outside the scan: with it inside, the partial
        -- index of active claims by lease becomes a candidate path)
        SELECT c.claim_id, c.job_ids, c.flags, c.state FROM jl.claim c
        WHERE c.claim_id = ANY (ARRAY(SELECT DISTINCT inp.t FROM inp))
    ),
    -- jobs of these claims that completed or left already: read once per claim
    gone AS MATERIALIZED (
        SELECT d.claim_id, x.id FROM jl.claim_done d CROSS JOIN LATERAL unnest(d.job_ids) x(id)
        WHERE d.claim_id = ANY (ARRAY(SELECT cl.claim_id FROM cl))
    ),
    -- membership by array containment, not a join with the unnested claim
    -- (a nested loop re-running unnest per input row was most of the time)
    acc AS MATERIALIZED (
        SELECT inp.t AS claim_id, inp.i AS id FROM inp
        WHERE EXISTS (SELECT 1 FROM cl WHERE cl.claim_id = inp.t AND cl.state = 'a' AND inp.i = ANY (cl.job_ids))
          AND NOT EXISTS (SELECT 1 FROM gone WHERE gone.claim_id = inp.t AND gone.id = inp.i)
    ),
    ins AS (
        INSERT INTO jl.claim_done (seg, claim_id, kind, job_ids, at)
        SELECT (SELECT m.cur_seg FROM jl.meta m), acc.claim_id, 'c', array_agg(acc.id), now()
        FROM acc GROUP BY acc.claim_id
        RETURNING cardinality(jl.claim_done.job_ids) AS n
    )
    SELECT COALESCE((SELECT sum(ins.n) FROM ins), 0),
           EXISTS (SELECT 1 FROM cl WHERE cl.flags <> 0)
      INTO v_n, v_flagged;
    IF v_flagged THEN
        -- capped actors, identities, unique keys of the completed jobs
        PERFORM jl.release(x.queue, x.actors, x.identities)
        FROM (SELECT l.queue,
                     array_agg(c.actors[k]) FILTER (WHERE c.flags & 1 <> 0) AS actors,
                     array_agg(c.identities[k]) FILTER (WHERE c.flags & 2 <> 0 AND c.identities[k] IS NOT NULL) AS identities
              FROM jl.claim c JOIN jl.lane l ON l.lane_id = c.lane_id
              CROSS JOIN LATERAL generate_subscripts(c.job_ids, 1) k
              JOIN unnest(p_ids, p_tokens) u(i, t) ON u.t = c.claim_id AND u.i = c.job_ids[k]
              WHERE c.claim_id = ANY (p_tokens) AND c.flags <> 0
              GROUP BY l.queue) x;
        DELETE FROM jl.ukey k USING (
            SELECT l.queue, c.ukeys[s] AS uk, c.job_ids[s] AS id
            FROM jl.claim c JOIN jl.lane l ON l.lane_id = c.lane_id
            CROSS JOIN LATERAL generate_subscripts(c.job_ids, 1) s
            WHERE c.claim_id = ANY (p_tokens) AND c.flags & 4 <> 0 AND c.job_ids[s] = ANY (p_ids)) x
        WHERE k.queue = x.queue AND k.unique_key = x.uk AND k.job_id = x.id;
    END IF;
    IF v_n < cardinality(p_ids) THEN
        -- tokens of side-store attempts (retried, rescued, evacuated jobs)
        v_side := jl.complete_side(p_ids, p_tokens);
    END IF;
    RETURN v_n + v_side;
END $$;

CREATE FUNCTION jl.complete_side(p_ids bigint[], p_tokens bigint[]) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_n int;
BEGIN
    WITH g AS (
        UPDATE jl.side s SET state = 'completed', finished_at = now(), lease_token = NULL, lease_until = NULL
        FROM unnest(p_ids, p_tokens) u(i, t)
        WHERE s.job_id = u.i AND s.lease_token = u.t AND s.state = 'running'
        RETURNING s.job_id, s.queue, s.actor, s.identity_key, s.unique_key, s.attempt
    ),
    ev AS (INSERT INTO jl.job_events (job_id, queue, event, attempt) SELECT g.job_id, g.queue, 'completed', g.attempt FROM g),
    uk AS (DELETE FROM jl.ukey k USING g WHERE k.queue = g.queue AND k.unique_key = g.unique_key AND k.job_id = g.job_id),
    rel AS (SELECT jl.release(g2.queue, array_agg(g2.actor) FILTER (WHERE g2.actor IN (SELECT a.actor FROM jl.actor_cap a)),
                              array_agg(g2.identity_key) FILTER (WHERE g2.identity_key IS NOT NULL))
            FROM g g2 GROUP BY g2.queue)
    SELECT (SELECT count(*) FROM g)::int + 0 * (SELECT count(*) FROM rel) INTO v_n;
    RETURN v_n;
END $$;

CREATE FUNCTION jl.complete(p_id bigint, p_token bigint) RETURNS boolean
LANGUAGE sql AS $$ SELECT jl.complete_many(ARRAY[p_id], ARRAY[p_token]) = 1 $$;

-- ---- leaving a claim: fail, snooze, cancel of a running job ------------------------------
-- Moves one job of an active claim to the side store in `p_state` (with the
-- attempt counted: the claim's attempt is its first), marks it gone from the
-- claim, releases its slot. Returns false when the token is stale.
CREATE FUNCTION jl.leave_claim(p_id bigint, p_token bigint, p_state text, p_run_at timestamptz,
                               p_attempt_delta int, p_error text, p_event text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    g record;
    v_state text := p_state;
    k int;
BEGIN
    PERFORM pg_advisory_xact_lock(1785684601, (p_token % 2147483647)::int);
    SELECT * INTO c FROM jl.claim WHERE claim_id = p_token AND state = 'a';
    IF NOT FOUND OR NOT (p_id = ANY (c.job_ids))
       OR EXISTS (SELECT 1 FROM jl.claim_done d WHERE d.claim_id = p_token AND p_id = ANY (d.job_ids)) THEN
        RETURN NULL;
    END IF;
    SELECT * INTO g FROM jl.log_job WHERE batch_id IN (p_id >> 10, -p_id) AND job_id = p_id;
    IF p_state = 'retry' THEN
        v_state := CASE WHEN 1 >= g.max_attempts THEN 'failed'
                        WHEN p_run_at <= now() THEN 'ready' ELSE 'scheduled' END;
    END IF;
    INSERT INTO jl.side (job_id, queue, lane_id, pos, priority, state, run_at, enqueued_at, attempt, max_attempts,
                         kind, args, actor, fairness_key, identity_key, unique_key, worker, finished_at, errors)
    SELECT g.job_id, l.queue, g.lane_id, g.pos, l.priority, v_state,
           CASE WHEN v_state IN ('ready', 'scheduled') THEN greatest(p_run_at, g.run_at) ELSE g.run_at END,
           g.enqueued_at, 1 + p_attempt_delta, g.max_attempts, g.kind, g.args, g.actor, g.fairness_key,
           g.identity_key, g.unique_key, c.worker,
           CASE WHEN v_state IN ('failed', 'cancelled') THEN now() END,
           CASE WHEN p_error IS NOT NULL THEN jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'error', p_error)) END
    FROM jl.lane l WHERE l.lane_id = g.lane_id;
    INSERT INTO jl.claim_done (seg, claim_id, kind, job_ids) VALUES ((SELECT cur_seg FROM jl.meta), p_token, 'o', ARRAY[p_id]);
    INSERT INTO jl.job_events (job_id, queue, event, attempt, detail)
    SELECT p_id, l.queue, CASE WHEN v_state = 'failed' THEN 'failed' ELSE p_event END, 1, p_error
    FROM jl.lane l WHERE l.lane_id = g.lane_id;
    k := array_position(c.job_ids, p_id);
    PERFORM jl.release((SELECT queue FROM jl.lane WHERE lane_id = g.lane_id),
                       CASE WHEN c.flags & 1 <> 0 THEN ARRAY[c.actors[k]] END,
                       CASE WHEN c.flags & 2 <> 0 AND c.identities[k] IS NOT NULL THEN ARRAY[c.identities[k]] END);
    IF v_state IN ('failed', 'cancelled') AND g.unique_key IS NOT NULL THEN
        DELETE FROM jl.ukey WHERE queue = (SELECT queue FROM jl.lane WHERE lane_id = g.lane_id)
                              AND unique_key = g.unique_key AND job_id = p_id;
    END IF;
    RETURN v_state;
END $$;

-- fail: backoff 2^(attempt-1) s x jitter [0.75, 1.25), or retry_at; 'failed' at max_attempts.
CREATE FUNCTION jl.fail(p_id bigint, p_token bigint, p_error text, p_retry_at timestamptz DEFAULT NULL) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v text;
    s record;
    v_next timestamptz;
BEGIN
    v := jl.leave_claim(p_id, p_token, 'retry',
                        COALESCE(p_retry_at, now() + (0.75 + random() * 0.5) * interval '1 second'),
                        0, p_error, 'retried');
    IF v IS NOT NULL THEN
        RETURN v;
    END IF;
    -- a side-store attempt
    SELECT * INTO s FROM jl.side WHERE job_id = p_id AND lease_token = p_token AND state = 'running' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_next := COALESCE(p_retry_at, now() + least(power(2, greatest(s.attempt - 1, 0)), 3600)
                                         * (0.75 + random() * 0.5) * interval '1 second');
    v := CASE WHEN s.attempt >= s.max_attempts THEN 'failed' WHEN v_next <= now() THEN 'ready' ELSE 'scheduled' END;
    UPDATE jl.side SET state = v, run_at = CASE WHEN v = 'failed' THEN run_at ELSE greatest(v_next, run_at) END,
           finished_at = CASE WHEN v = 'failed' THEN now() END, lease_token = NULL, lease_until = NULL,
           errors = COALESCE(errors, '[]') || jsonb_build_array(jsonb_build_object('attempt', s.attempt, 'at', now(), 'error', p_error))
    WHERE job_id = p_id;
    INSERT INTO jl.job_events (job_id, queue, event, attempt, detail)
    VALUES (p_id, s.queue, CASE WHEN v = 'failed' THEN 'failed' ELSE 'retried' END, s.attempt, p_error);
    PERFORM jl.release(s.queue, CASE WHEN s.actor IN (SELECT actor FROM jl.actor_cap) THEN ARRAY[s.actor] END,
                       CASE WHEN s.identity_key IS NOT NULL THEN ARRAY[s.identity_key] END);
    IF v = 'failed' AND s.unique_key IS NOT NULL THEN
        DELETE FROM jl.ukey WHERE queue = s.queue AND unique_key = s.unique_key AND job_id = p_id;
    END IF;
    RETURN v;
END $$;

-- snooze: back until p_until without consuming the attempt
CREATE FUNCTION jl.snooze(p_id bigint, p_token bigint, p_until timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v text;
BEGIN
    v := jl.leave_claim(p_id, p_token, CASE WHEN p_until <= now() THEN 'ready' ELSE 'scheduled' END, p_until, -1,
                        NULL, 'snoozed');
    IF v IS NOT NULL THEN
        RETURN true;
    END IF;
    UPDATE jl.side SET state = CASE WHEN p_until <= now() THEN 'ready' ELSE 'scheduled' END, run_at = p_until,
           attempt = attempt - 1, lease_token = NULL, lease_until = NULL
    WHERE job_id = p_id AND lease_token = p_token AND state = 'running';
    RETURN FOUND;
END $$;

-- heartbeat: a claim's lease is extended as a whole (one row per claim)
CREATE FUNCTION jl.heartbeat(p_ids bigint[], p_tokens bigint[], p_extend interval)
RETURNS TABLE (job_id bigint, lease_until timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1785684601, (t % 2147483647)::int)
    FROM (SELECT DISTINCT t FROM unnest(p_tokens) t ORDER BY 1) x;
    RETURN QUERY
    WITH c AS (
        UPDATE jl.claim c SET lease_until = clock_timestamp() + p_extend
        WHERE c.claim_id = ANY (p_tokens) AND c.state = 'a'
        RETURNING c.claim_id, c.job_ids, c.lease_until
    ),
    s AS (
        UPDATE jl.side s SET lease_until = clock_timestamp() + p_extend
        FROM unnest(p_ids, p_tokens) u(i, t)
        WHERE s.job_id = u.i AND s.lease_token = u.t AND s.state = 'running'
        RETURNING s.job_id, s.lease_until
    )
    SELECT u.i, c.lease_until FROM unnest(p_ids, p_tokens) u(i, t) JOIN c ON c.claim_id = u.t
    WHERE u.i = ANY (c.job_ids)
      AND NOT EXISTS (SELECT 1 FROM jl.claim_done d WHERE d.claim_id = u.t AND u.i = ANY (d.job_ids))
    UNION ALL SELECT s.job_id, s.lease_until FROM s;
END $$;

-- ---- per-job view ---------------------------------------------------------------------------
-- state of one job: its side row if any (authoritative), else the log row and
-- the claim covering its position.
CREATE FUNCTION jl.job_state(p_id bigint) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    g record;
    c record;
    v_cur bigint;
BEGIN
    PERFORM 1 FROM jl.side WHERE job_id = p_id;
    IF FOUND THEN
        RETURN (SELECT state FROM jl.side WHERE job_id = p_id);
    END IF;
    SELECT * INTO g FROM jl.log_job WHERE batch_id IN (p_id >> 10, -p_id) AND job_id = p_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO c FROM jl.claim WHERE lane_id = g.lane_id AND hi_pos >= g.pos ORDER BY hi_pos LIMIT 1;
    IF NOT FOUND OR c.lo_pos > g.pos THEN
        RETURN 'ready';
    END IF;
    IF EXISTS (SELECT 1 FROM jl.claim_done d WHERE d.claim_id = c.claim_id AND d.kind = 'c' AND p_id = ANY (d.job_ids)) THEN
        RETURN 'completed';
    END IF;
    RETURN CASE c.state WHEN 'a' THEN 'running' ELSE 'unknown' END;
END $$;

-- cancel: a ready job in the log gets a side row (dispatch skips it: a hole);
-- a running one leaves its claim (a later complete is refused).
CREATE FUNCTION jl.cancel(p_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    g record;
    c record;
    v_state text;
BEGIN
    SELECT state INTO v_state FROM jl.side WHERE job_id = p_id FOR UPDATE;
    IF FOUND THEN
        IF v_state IN ('completed', 'failed', 'cancelled') THEN
            RETURN false;
        END IF;
        UPDATE jl.side SET state = 'cancelled', finished_at = now(), lease_token = NULL, lease_until = NULL
        WHERE job_id = p_id RETURNING * INTO g;
        INSERT INTO jl.job_events (job_id, queue, event, detail) VALUES (p_id, g.queue, 'cancelled', 'was ' || v_state);
        IF v_state = 'running' THEN
            PERFORM jl.release(g.queue, CASE WHEN g.actor IN (SELECT actor FROM jl.actor_cap) THEN ARRAY[g.actor] END,
                               CASE WHEN g.identity_key IS NOT NULL THEN ARRAY[g.identity_key] END);
        ELSIF v_state = 'parked' AND g.park_reason = 'capacity' THEN
            UPDATE jl.actor_cap SET parked = greatest(parked - 1, 0) WHERE actor = g.actor;
        END IF;
        DELETE FROM jl.ukey WHERE queue = g.queue AND unique_key = g.unique_key AND job_id = p_id;
        RETURN true;
    END IF;
    SELECT * INTO g FROM jl.log_job WHERE batch_id IN (p_id >> 10, -p_id) AND job_id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % does not exist', p_id USING ERRCODE = '42704';
    END IF;
    -- the lane lock: no dispatcher claims it while we decide
    PERFORM pg_advisory_xact_lock(1785684600, g.lane_id);
    SELECT * INTO c FROM jl.claim WHERE lane_id = g.lane_id AND hi_pos >= g.pos ORDER BY hi_pos LIMIT 1;
    IF NOT FOUND OR c.lo_pos > g.pos THEN
        INSERT INTO jl.side (job_id, queue, lane_id, pos, priority, state, run_at, enqueued_at, max_attempts, kind, args,
                             actor, fairness_key, identity_key, unique_key, finished_at)
        SELECT g.job_id, l.queue, g.lane_id, g.pos, l.priority, 'cancelled', g.run_at, g.enqueued_at, g.max_attempts,
               g.kind, g.args, g.actor, g.fairness_key, g.identity_key, g.unique_key, now()
        FROM jl.lane l WHERE l.lane_id = g.lane_id;
        INSERT INTO jl.job_events (job_id, queue, event, detail)
        SELECT p_id, l.queue, 'cancelled', 'was ready' FROM jl.lane l WHERE l.lane_id = g.lane_id;
        DELETE FROM jl.ukey k USING jl.lane l WHERE l.lane_id = g.lane_id AND k.queue = l.queue
                                                AND k.unique_key = g.unique_key AND k.job_id = p_id;
        RETURN true;
    END IF;
    RETURN jl.leave_claim(p_id, c.claim_id, 'cancelled', now(), 0, NULL, 'cancelled') IS NOT NULL;
END $$;

-- retry_job: a failed or cancelled job becomes ready again (attempt 0), in its old place
CREATE FUNCTION jl.retry_job(p_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v text;
BEGIN
    SELECT state INTO v FROM jl.side WHERE job_id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % is not failed or cancelled', p_id USING ERRCODE = '55000';
    END IF;
    IF v NOT IN ('failed', 'cancelled') THEN
        RAISE EXCEPTION 'job % is %; only failed or cancelled jobs can be retried', p_id, v USING ERRCODE = '55000';
    END IF;
    UPDATE jl.side SET state = CASE WHEN pos IS NULL THEN 'scheduled' ELSE 'ready' END,
           attempt = 0, run_at = now(), finished_at = NULL WHERE job_id = p_id;
    INSERT INTO jl.job_events (job_id, queue, event, attempt, detail)
    SELECT p_id, queue, 'retried', 0, 'retry_job' FROM jl.side WHERE job_id = p_id;
    RETURN true;
END $$;

-- ---- background duties ----------------------------------------------------------------------
-- rescue: claims whose lease expired. Jobs of the claim that neither completed
-- nor left go to the side store as ready (attempt 1 counted, keeping their
-- place) or failed at max_attempts; a claim that completed entirely is just
-- settled (that is where settling happens: off the hot path, once per batch).
CREATE FUNCTION jl.rescue(p_max int DEFAULT 1000) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    v_n int := 0;
    v_rem bigint[];
BEGIN
    FOR c IN SELECT cc.claim_id FROM jl.claim cc WHERE cc.state = 'a' AND cc.lease_until < clock_timestamp()
             ORDER BY cc.lease_until LIMIT p_max LOOP
        PERFORM pg_advisory_xact_lock(1785684601, (c.claim_id % 2147483647)::int);
        SELECT ARRAY(SELECT x FROM unnest(cl.job_ids) x
                     WHERE NOT EXISTS (SELECT 1 FROM jl.claim_done d WHERE d.claim_id = cl.claim_id AND x = ANY (d.job_ids)))
          INTO v_rem
          FROM jl.claim cl WHERE cl.claim_id = c.claim_id AND cl.state = 'a' AND cl.lease_until < clock_timestamp();
        IF v_rem IS NULL THEN
            CONTINUE;   -- heartbeat or another rescuer got there first
        END IF;
        UPDATE jl.claim SET state = CASE WHEN cardinality(v_rem) = 0 THEN 's' ELSE 'r' END WHERE claim_id = c.claim_id;
        IF cardinality(v_rem) > 0 THEN
            INSERT INTO jl.side (job_id, queue, lane_id, pos, priority, state, run_at, enqueued_at, attempt,
                                 max_attempts, kind, args, actor, fairness_key, identity_key, unique_key, finished_at, errors)
            SELECT g.job_id, l.queue, g.lane_id, g.pos, l.priority,
                   CASE WHEN 1 >= g.max_attempts THEN 'failed' ELSE 'ready' END, g.run_at, g.enqueued_at, 1,
                   g.max_attempts, g.kind, g.args, g.actor, g.fairness_key, g.identity_key, g.unique_key,
                   CASE WHEN 1 >= g.max_attempts THEN now() END,
                   jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'error', 'lease expired'))
            FROM jl.log_job g JOIN jl.lane l ON l.lane_id = g.lane_id
            WHERE g.batch_id = ANY (ARRAY(SELECT x >> 10 FROM unnest(v_rem) x UNION SELECT -x FROM unnest(v_rem) x))
              AND g.job_id = ANY (v_rem)
            ON CONFLICT (job_id) DO NOTHING;   -- an evacuated copy is rescued below, as a side row
            INSERT INTO jl.job_events (job_id, queue, event, attempt, detail)
            SELECT s.job_id, s.queue, 'rescued', 1, CASE WHEN s.state = 'failed' THEN 'failed: lease expired on the last attempt'
                                                         ELSE 'lease expired' END
            FROM jl.side s WHERE s.job_id = ANY (v_rem);
            PERFORM jl.release(l.queue,
                               (SELECT array_agg(cl.actors[k]) FROM generate_subscripts(cl.job_ids, 1) k
                                 WHERE cl.flags & 1 <> 0 AND cl.job_ids[k] = ANY (v_rem)),
                               (SELECT array_agg(cl.identities[k]) FROM generate_subscripts(cl.job_ids, 1) k
                                 WHERE cl.flags & 2 <> 0 AND cl.identities[k] IS NOT NULL AND cl.job_ids[k] = ANY (v_rem)))
            FROM jl.claim cl JOIN jl.lane l ON l.lane_id = cl.lane_id WHERE cl.claim_id = c.claim_id AND cl.flags <> 0;
            v_n := v_n + cardinality(v_rem);
        END IF;
    END LOOP;
    -- side-store attempts (retries, evacuated jobs)
    WITH e AS (
        UPDATE jl.side s SET state = CASE WHEN s.attempt >= s.max_attempts THEN 'failed' ELSE 'ready' END,
               finished_at = CASE WHEN s.attempt >= s.max_attempts THEN now() END,
               lease_token = NULL, lease_until = NULL,
               errors = COALESCE(s.errors, '[]') || jsonb_build_array(jsonb_build_object('attempt', s.attempt, 'at', now(), 'error', 'lease expired'))
        WHERE s.job_id IN (SELECT x.job_id FROM jl.side x WHERE x.state = 'running' AND x.lease_until < clock_timestamp()
                           ORDER BY x.lease_until LIMIT p_max FOR UPDATE SKIP LOCKED)
        RETURNING s.job_id, s.queue, s.attempt, s.state, s.actor, s.identity_key
    ),
    ev AS (INSERT INTO jl.job_events (job_id, queue, event, attempt, detail)
           SELECT e.job_id, e.queue, 'rescued', e.attempt, e.state FROM e),
    rel AS (SELECT jl.release(e.queue, array_agg(e.actor) FILTER (WHERE e.actor IN (SELECT actor FROM jl.actor_cap)),
                              array_agg(e.identity_key) FILTER (WHERE e.identity_key IS NOT NULL))
            FROM e GROUP BY e.queue)
    SELECT v_n + (SELECT count(*) FROM e) + 0 * (SELECT count(*) FROM rel) INTO v_n;
    RETURN v_n;
END $$;

-- promotion: due scheduled jobs. One that was never ready is appended to its
-- lane (a fresh pos under the lane lock: lane FIFO by promotion); a retried or
-- snoozed one becomes ready in the side store, keeping its place.
CREATE FUNCTION jl.promote(p_max int DEFAULT 1000) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_n int;
    v_m int;
BEGIN
    UPDATE jl.side s SET state = 'ready'
    WHERE s.job_id IN (SELECT x.job_id FROM jl.side x WHERE x.state = 'scheduled' AND x.run_at <= now() AND x.pos IS NOT NULL
                       ORDER BY x.run_at LIMIT p_max FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    CREATE TEMP TABLE IF NOT EXISTS jl_due (job_id bigint, queue text, priority smallint, lane_id int);
    DELETE FROM jl_due;
    INSERT INTO jl_due SELECT x.job_id, x.queue, x.priority, NULL FROM jl.side x
    WHERE x.state = 'scheduled' AND x.run_at <= now() AND x.pos IS NULL
    ORDER BY x.run_at, x.job_id LIMIT p_max FOR UPDATE SKIP LOCKED;
    UPDATE jl_due d SET lane_id = l.lane_id
    FROM (SELECT DISTINCT queue, priority FROM jl_due) q CROSS JOIN LATERAL jl.lane_ids(q.queue, ARRAY[q.priority]) l
    WHERE d.queue = q.queue AND d.priority = q.priority;
    PERFORM pg_advisory_xact_lock(1785684600, x.lane_id) FROM (SELECT DISTINCT lane_id FROM jl_due ORDER BY 1) x;
    -- one row per promoted job (its id exists already: batch_id = -job_id)
    INSERT INTO jl.log (seg, lane_id, pos_lo, pos_hi, batch_id, enqueued_at, max_attempts, kinds, args, run_ats,
                        actors, fairness_keys, identity_keys, unique_keys)
    SELECT (SELECT cur_seg FROM jl.meta), x.lane_id, x.p, x.p, -x.job_id, x.enqueued_at, x.max_attempts,
           ARRAY[x.kind], ARRAY[x.args], ARRAY[x.run_at], ARRAY[x.actor], ARRAY[x.fairness_key],
           ARRAY[x.identity_key], ARRAY[x.unique_key]
    FROM (SELECT d.lane_id, s.job_id, s.enqueued_at, s.max_attempts, s.kind, s.args, s.run_at, s.actor,
                 s.fairness_key, s.identity_key, s.unique_key,
                 greatest(l.pos_floor, COALESCE((SELECT g.pos_hi FROM jl.log g WHERE g.lane_id = d.lane_id
                                                 ORDER BY g.pos_hi DESC LIMIT 1), 0))
                 + row_number() OVER (PARTITION BY d.lane_id ORDER BY s.run_at, s.job_id) AS p
          FROM jl_due d JOIN jl.side s ON s.job_id = d.job_id JOIN jl.lane l ON l.lane_id = d.lane_id) x;
    DELETE FROM jl.side s USING jl_due d WHERE s.job_id = d.job_id;
    GET DIAGNOSTICS v_m = ROW_COUNT;
    RETURN v_n + v_m;
END $$;

-- rotation, step 1: switch the current segment when it is older than the
-- rotation period and the next one is empty.
-- step 2: truncate the oldest sealed segment once it is safe:
--   (a) every lane's cursor is past every log row of the segment (all dispatched);
--   (b) no active claim holds a job of the segment: a running job's row is
--       copied to the side store ('running', same token and lease: it keeps its
--       lease and completes through jl.complete_side) and its claim marked
--       evacuated, so a long-running job never holds a segment;
--   (c) it was sealed at least `retention` ago (completed jobs and the hot
--       narration stay readable that long);
-- then, under the lanes' advisory locks, the lanes' floors take the segment's
-- head and cursor, and log, claim and claim_done partitions are TRUNCATEd
-- (lock_timeout: a reader holding the partition delays rotation, it never
-- waits behind it). No row is deleted, so nothing bloats, held xmin or not.
CREATE FUNCTION jl.rotate(p_force boolean DEFAULT false) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    m record;
    v_next smallint;
    v_old smallint;
    v_blocked int;
    v_lanes int[];
BEGIN
    SELECT * INTO m FROM jl.meta FOR UPDATE;
    v_next := (m.cur_seg + 1) % m.nsegs;
    IF (SELECT s.empty FROM jl.seg s WHERE s.seg = v_next)
       AND (p_force OR (SELECT s.opened_at FROM jl.seg s WHERE s.seg = m.cur_seg) < now() - m.rotation_period) THEN
        UPDATE jl.seg SET sealed_at = now() WHERE seg = m.cur_seg;
        UPDATE jl.seg SET opened_at = now(), sealed_at = NULL, empty = false WHERE seg = v_next;
        UPDATE jl.meta SET cur_seg = v_next;
        RETURN format('switched to segment %s', v_next);
    END IF;
    -- the oldest sealed, non-empty segment: the one after the current in ring order
    SELECT s.seg INTO v_old FROM jl.seg s
    WHERE NOT s.empty AND s.seg <> m.cur_seg ORDER BY s.sealed_at LIMIT 1;
    IF v_old IS NULL THEN
        RETURN 'nothing to do';
    END IF;
    IF (SELECT s.sealed_at FROM jl.seg s WHERE s.seg = v_old) > now() - m.retention THEN
        RETURN format('segment %s within retention', v_old);
    END IF;
    -- (a): lanes with undispatched rows in the segment (cursors only advance:
    -- once true it stays true)
    SELECT count(*) INTO v_blocked
    FROM jl.lane l
    CROSS JOIN LATERAL (SELECT g.pos_hi AS pos FROM jl.log g WHERE g.seg = v_old AND g.lane_id = l.lane_id
                        ORDER BY g.pos_hi DESC LIMIT 1) mx
    WHERE mx.pos > greatest(l.cursor_floor, COALESCE((SELECT c.hi_pos FROM jl.claim c WHERE c.lane_id = l.lane_id
                                                      ORDER BY c.hi_pos DESC LIMIT 1), 0));
    IF v_blocked > 0 THEN
        RETURN format('segment %s: %s lane(s) not dispatched past it', v_old, v_blocked);
    END IF;
    -- (b): evacuate the running jobs of the segment: active claims of its
    -- lanes starting at or below its last pos that still have unfinished jobs
    -- (claims that completed entirely are simply truncated with it)
    PERFORM jl.evacuate(c.claim_id)
    FROM jl.lane l
    CROSS JOIN LATERAL (SELECT g.pos_hi AS pos FROM jl.log g WHERE g.seg = v_old AND g.lane_id = l.lane_id
                        ORDER BY g.pos_hi DESC LIMIT 1) mx
    JOIN jl.claim c ON c.lane_id = l.lane_id AND c.state = 'a' AND c.lo_pos <= mx.pos
    WHERE c.n > COALESCE((SELECT sum(cardinality(d.job_ids)) FROM jl.claim_done d WHERE d.claim_id = c.claim_id), 0);
    -- floors, then truncate, under the lanes' locks (held for these two
    -- statements only): a dispatcher sees the old partition and old floors,
    -- or the new floors and the empty partition
    SELECT array_agg(l.lane_id ORDER BY l.lane_id) INTO v_lanes FROM jl.lane l;
    PERFORM pg_advisory_xact_lock(1785684600, x) FROM unnest(v_lanes) x;
    UPDATE jl.lane l SET pos_floor = greatest(l.pos_floor, x.hi), cursor_floor = greatest(l.cursor_floor, x.cur)
    FROM (SELECT l2.lane_id,
                 COALESCE((SELECT g.pos_hi AS pos FROM jl.log g WHERE g.lane_id = l2.lane_id ORDER BY g.pos_hi DESC LIMIT 1), 0) AS hi,
                 COALESCE((SELECT c.hi_pos FROM jl.claim c WHERE c.lane_id = l2.lane_id ORDER BY c.hi_pos DESC LIMIT 1), 0) AS cur
          FROM jl.lane l2) x
    WHERE l.lane_id = x.lane_id AND (x.hi > l.pos_floor OR x.cur > l.cursor_floor);
    SET LOCAL lock_timeout = '200ms';
    EXECUTE format('TRUNCATE jl.log_%s, jl.claim_%s, jl.claim_done_%s', v_old, v_old, v_old);
    UPDATE jl.seg SET empty = true, opened_at = NULL, sealed_at = NULL WHERE seg = v_old;
    RETURN format('truncated segment %s', v_old);
END $$;

-- a claim's unfinished jobs move to the side store as running (same token and
-- lease), the claim is marked evacuated: completion, fail, heartbeat and rescue
-- of those jobs then go through their side rows.
CREATE FUNCTION jl.evacuate(p_claim bigint) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_n int;
BEGIN
    PERFORM pg_advisory_xact_lock(1785684601, (p_claim % 2147483647)::int);
    INSERT INTO jl.side (job_id, queue, lane_id, pos, priority, state, run_at, enqueued_at, attempt, max_attempts, kind,
                         args, actor, fairness_key, identity_key, unique_key, worker, lease_token, lease_until)
    SELECT g.job_id, l.queue, g.lane_id, g.pos, l.priority, 'running', g.run_at, g.enqueued_at, 1, g.max_attempts,
           g.kind, g.args, g.actor, g.fairness_key, g.identity_key, g.unique_key, c.worker, c.claim_id, c.lease_until
    FROM jl.claim c JOIN jl.lane l ON l.lane_id = c.lane_id
    CROSS JOIN LATERAL unnest(c.job_ids) x(id)
    JOIN jl.log_job g ON g.batch_id IN (x.id >> 10, -x.id) AND g.job_id = x.id
    WHERE c.claim_id = p_claim AND c.state = 'a'
      AND NOT EXISTS (SELECT 1 FROM jl.claim_done d WHERE d.claim_id = c.claim_id AND x.id = ANY (d.job_ids));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    UPDATE jl.claim SET state = 'e' WHERE claim_id = p_claim AND state = 'a';
    RETURN v_n;
END $$;

-- one maintenance pass, as the background worker would run it
CREATE FUNCTION jl.maint() RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    r int;
    p int;
BEGIN
    r := jl.rescue(1000);
    p := jl.promote(1000);
    -- parked jobs whose blocker is gone (a release that raced a dispatcher's
    -- parking is at most one pass late, never lost)
    PERFORM jl.unpark_actor(a.actor) FROM jl.actor_cap a WHERE a.parked > 0 AND a.running < a.max_concurrent;
    UPDATE jl.side s SET state = 'ready', park_reason = NULL
    WHERE s.job_id IN (
        SELECT DISTINCT ON (p.queue, p.identity_key) p.job_id FROM jl.side p
        WHERE p.state = 'parked' AND p.park_reason = 'identity'
          AND NOT EXISTS (SELECT 1 FROM jl.running_identity ri WHERE ri.queue = p.queue AND ri.identity_key = p.identity_key)
          AND NOT EXISTS (SELECT 1 FROM jl.side q WHERE q.queue = p.queue AND q.identity_key = p.identity_key
                            AND q.state IN ('ready', 'running'))
        ORDER BY p.queue, p.identity_key, p.priority, p.pos);
    RETURN format('rescued %s, promoted %s, %s', r, p, jl.rotate());
END $$;

-- ---- narration and status --------------------------------------------------------------------
-- Every transition of every job: the hot ones derived from the append-only
-- store (one log row = enqueued, one claim = dispatched, one done row =
-- completed/left), the rare ones from jl.job_events.
CREATE VIEW jl.job_events_all AS
SELECT g.enqueued_at AS at, g.job_id, l.queue, 'enqueued'::text AS event, 0 AS attempt, NULL::text AS detail
FROM jl.log_job g JOIN jl.lane l ON l.lane_id = g.lane_id
UNION ALL
SELECT c.dispatched_at, x.id, l.queue, 'dispatched', 1, c.worker
FROM jl.claim c JOIN jl.lane l ON l.lane_id = c.lane_id CROSS JOIN LATERAL unnest(c.job_ids) x(id)
UNION ALL
SELECT d.at, x.id, l.queue, 'completed', 1, NULL
FROM jl.claim_done d JOIN jl.claim c ON c.claim_id = d.claim_id JOIN jl.lane l ON l.lane_id = c.lane_id
CROSS JOIN LATERAL unnest(d.job_ids) x(id) WHERE d.kind = 'c'
UNION ALL
SELECT e.at, e.job_id, e.queue, e.event, e.attempt, e.detail FROM jl.job_events e;

-- counts per queue: O(lanes + active claims) for ready/running of the log,
-- plus the side store's states (index scans of its partial indexes).
CREATE VIEW jl.queue_status AS
SELECT q.queue_name,
       (SELECT COALESCE(sum(greatest(l.pos_floor, COALESCE((SELECT g.pos_hi AS pos FROM jl.log g WHERE g.lane_id = l.lane_id ORDER BY g.pos_hi DESC LIMIT 1), 0))
                           - greatest(l.cursor_floor, COALESCE((SELECT c.hi_pos FROM jl.claim c WHERE c.lane_id = l.lane_id ORDER BY c.hi_pos DESC LIMIT 1), 0))
                           - (SELECT count(*) FROM jl.side s WHERE s.lane_id = l.lane_id
                                AND s.pos > greatest(l.cursor_floor, COALESCE((SELECT c.hi_pos FROM jl.claim c WHERE c.lane_id = l.lane_id ORDER BY c.hi_pos DESC LIMIT 1), 0)))), 0)
          FROM jl.lane l WHERE l.queue = q.queue_name)
       + (SELECT count(*) FROM jl.side s WHERE s.queue = q.queue_name AND s.state = 'ready') AS ready,
       (SELECT COALESCE(sum(c.n - COALESCE((SELECT sum(cardinality(d.job_ids)) FROM jl.claim_done d WHERE d.claim_id = c.claim_id), 0)), 0)
          FROM jl.claim c JOIN jl.lane l ON l.lane_id = c.lane_id WHERE l.queue = q.queue_name AND c.state = 'a')
       + (SELECT count(*) FROM jl.side s WHERE s.queue = q.queue_name AND s.state = 'running') AS running,
       (SELECT count(*) FROM jl.side s WHERE s.queue = q.queue_name AND s.state = 'scheduled') AS scheduled,
       (SELECT count(*) FROM jl.side s WHERE s.queue = q.queue_name AND s.state = 'parked') AS parked,
       (SELECT COALESCE(sum(cardinality(d.job_ids)), 0) FROM jl.claim_done d JOIN jl.claim c ON c.claim_id = d.claim_id
          JOIN jl.lane l ON l.lane_id = c.lane_id WHERE l.queue = q.queue_name AND d.kind = 'c')
       + (SELECT count(*) FROM jl.side s WHERE s.queue = q.queue_name AND s.state = 'completed') AS completed,
       (SELECT count(*) FROM jl.side s WHERE s.queue = q.queue_name AND s.state = 'failed') AS failed,
       (SELECT count(*) FROM jl.side s WHERE s.queue = q.queue_name AND s.state = 'cancelled') AS cancelled
FROM jl.queue q;

-- Planner settings of the statements that must stay on their index paths
-- whatever the statistics say (a segment just truncated looks empty, and a
-- seq scan planned then would read the whole segment once it fills up): the
-- same settings pgque's job statements run under (src/jobs/stmt.rs).
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['jl.enqueue(text,text[],jsonb[],smallint[],timestamptz[],text[],text[],text[],text[],text)',
                             'jl.dispatch(text[],int,text,interval,int)',
                             'jl.dispatch_general(text[],int[],int,text,interval,int)',
                             'jl.complete_many(bigint[],bigint[])', 'jl.leave_claim(bigint,bigint,text,timestamptz,int,text,text)',
                             'jl.rescue(int)', 'jl.rotate(boolean)', 'jl.cancel(bigint)', 'jl.job_state(bigint)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET enable_seqscan = off', f);
        EXECUTE format('ALTER FUNCTION %s SET enable_bitmapscan = off', f);
    END LOOP;
END $$;
