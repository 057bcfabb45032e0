#!/usr/bin/env python3
"""End-to-end jobs/s of the job-log prototype (schema jl, job_log.sql) beside
pgque's current job store and the classic SKIP LOCKED table, the w8 loop of
benches/harness/w_jobs.py:

  each worker process loops: enqueue 100 jobs, dispatch 100, complete them
  (pgque: enqueue_ready_rows / dispatch / complete_many;
   skiplocked: INSERT 100 / UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING / DELETE;
   joblog: jl.enqueue / jl.dispatch / jl.complete_many)

Autocommit, one transaction per statement, ~233-byte jsonb built server-side
(the harness's payload). Rounds interleave the systems (A B C, A B C, ...).
During a joblog cell a maintenance process runs jl.maint() (rescue, promotion,
rotation) every 0.5 s with a rotation period of 1 s and retention 0, so
segments switch and are truncated under load; pgque's own background worker
runs its job duties as in the harness.

Two more systems: `floor` (the same three round trips and payload with no store:
what any store pays in this loop) and `joblog-sql` (jl's hot statements sent
directly, locks inside the statement: correct with ONE worker only, it measures
what the PL/pgSQL layer costs).

Per cell: jobs/s, WAL bytes per job (pg_current_wal_insert_lsn difference over
the cell), cluster CPU per job (all PostgreSQL processes, /proc) and client CPU
per job, dead tuples per table at the end (pg_stat_user_tables), and the top
statements of pg_stat_statements.

Other modes: --check (concurrent semantic checks), --inserver CYCLES (the loop in
one DO block per cell, no round trips), --depths 1000,10000,... (jl.dispatch
latency vs ready depth, rolled-back samples, custom and generic plans).

Usage (cluster from `make bench`, see benches/results/job-log-prototype.md):
  BENCH_HOST=/tmp/pgque_bench_proto BENCH_PORT=55517 python3 benches/prototype/e2e.py \
      --secs 5 --rounds 3 --out /tmp/e2e.md
"""
import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import psycopg  # noqa: E402

HOST = os.environ.get("BENCH_HOST", "/tmp/pgque_bench_proto")
PORT = int(os.environ.get("BENCH_PORT", "55517"))
DB = os.environ.get("BENCH_DB", "pgque_bench")
MP = mp.get_context("fork")
NO_MAINT = os.environ.get("JL_NO_MAINT") == "1"   # diagnostics: joblog cells without the maintenance process

PAYLOAD = ("jsonb_build_object('id', g, 'ts', clock_timestamp(), 'kind', 'order.created', "
           "'customer', 'cust-000042', 'amount', 129.95, 'currency', 'EUR', 'items', 3, "
           "'note', repeat('x', 64))")
PG_ENQ = (f"SELECT count(*) FROM pgque.enqueue_ready_rows(%s, array_fill('bench.kind'::text, ARRAY[%s]), "
          f"ARRAY(SELECT {PAYLOAD} FROM generate_series(1, %s) g))")
PG_DISPATCH = "SELECT job_id, lease_token FROM pgque.dispatch(%s::text[], %s::int, %s::text, NULL::interval, 2)"
PG_COMPLETE = "SELECT pgque.complete_many(%s::bigint[], %s::bigint[])"
JL_ENQ = (f"SELECT count(*) FROM jl.enqueue(%s, array_fill('bench.kind'::text, ARRAY[%s]), "
          f"ARRAY(SELECT {PAYLOAD} FROM generate_series(1, %s) g))")
JL_DISPATCH = "SELECT job_id, lease_token FROM jl.dispatch(%s::text[], %s::int, %s::text, NULL::interval, 2)"
JL_COMPLETE = "SELECT jl.complete_many(%s::bigint[], %s::bigint[])"
SL_INSERT = f"INSERT INTO bench.sl_jobs(queue, kind, args) SELECT %s, 'bench.kind', {PAYLOAD} FROM generate_series(1, %s) g"
SL_CLAIM = ("UPDATE bench.sl_jobs SET state = 'running', locked_by = %s, locked_at = now(), attempt = attempt + 1 "
            "WHERE id IN (SELECT id FROM bench.sl_jobs WHERE queue = %s AND state = 'ready' AND run_at <= now() "
            "ORDER BY priority, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED) "
            "RETURNING id, queue, kind, args::text, priority, attempt")
SL_DELETE = "DELETE FROM bench.sl_jobs WHERE id = ANY(%s)"
# "joblog-sql": the job log's three hot statements sent directly by the client, with
# the lane/claim lock INSIDE the statement instead of a PL/pgSQL function taking it
# in a statement of its own. Its snapshot can then predate a concurrent dispatcher's
# or producer's commit, so it is only correct with ONE worker: a measurement of what
# the PL/pgSQL layer costs (the Rust version would run the same statements through
# SPI, the lock in its own statement), not an implementation.
JLSQL_ENQ = f"""
WITH ln AS MATERIALIZED (
    SELECT l.lane_id, l.pos_floor, q.max_attempts, pg_advisory_xact_lock(1785684600, l.lane_id) AS lk
    FROM jl.lane l JOIN jl.queue q ON q.queue_name = l.queue
    WHERE l.queue = %(q)s AND l.priority = 0 AND l.shard = 0),
head AS MATERIALIZED (
    SELECT ln.*, greatest(ln.pos_floor, COALESCE((SELECT g.pos_hi FROM jl.log g WHERE g.lane_id = ln.lane_id
                                                  ORDER BY g.pos_hi DESC LIMIT 1), 0)) AS h FROM ln),
x AS MATERIALIZED (
    SELECT array_fill('bench.kind'::text, ARRAY[%(n)s]) AS k, ARRAY(SELECT {PAYLOAD} FROM generate_series(1, %(n)s) g) AS a),
ins AS (
    INSERT INTO jl.log (seg, lane_id, pos_lo, pos_hi, batch_id, enqueued_at, max_attempts, kinds, args)
    SELECT (SELECT m.cur_seg FROM jl.meta m), h.lane_id, h.h + 1, h.h + cardinality(x.k), nextval('jl.batch_id_seq'),
           now(), h.max_attempts, x.k, x.a
    FROM head h, x
    RETURNING batch_id)
SELECT count(*) FROM ins, generate_series(1, %(n)s) WHERE (SELECT count(pg_notify('jl_jobs_' || %(q)s, ''))) >= 0
"""
JLSQL_DISPATCH = """
WITH ln AS MATERIALIZED (
    SELECT l.lane_id, q.queue_name, l.priority, q.lease, pg_advisory_xact_lock(1785684600, l.lane_id) AS lk,
           greatest(l.cursor_floor, COALESCE((SELECT c.hi_pos FROM jl.claim c WHERE c.lane_id = l.lane_id
                                              ORDER BY c.hi_pos DESC LIMIT 1), 0)) AS cur
    FROM jl.lane l JOIN jl.queue q ON q.queue_name = l.queue
    WHERE l.queue = %(q)s AND l.priority = 0 AND l.shard = 0),
c AS MATERIALIZED (
    SELECT g.* FROM ln CROSS JOIN LATERAL (
        SELECT j.* FROM (SELECT r.* FROM jl.log r
                         WHERE r.lane_id = ln.lane_id AND r.pos_hi > ln.cur
                           AND r.pos_hi < ln.cur + %(lim)s + 1024 AND r.pos_lo <= ln.cur + %(lim)s) r
        CROSS JOIN LATERAL (
            SELECT r.pos_lo + u.k - 1 AS pos,
                   CASE WHEN r.batch_id < 0 THEN -r.batch_id ELSE r.batch_id * 1024 + COALESCE(r.ords[u.k], u.k - 1) END AS job_id,
                   u.kind, u.args, r.max_attempts, u.actor, u.fk AS fairness_key, u.ik AS identity_key,
                   u.uk AS unique_key, COALESCE(u.ra, r.enqueued_at) AS run_at, r.enqueued_at
            FROM unnest(r.kinds, r.args, r.run_ats, r.actors, r.fairness_keys, r.identity_keys, r.unique_keys)
                 WITH ORDINALITY AS u(kind, args, ra, actor, fk, ik, uk, k)
            WHERE r.pos_lo + u.k - 1 > ln.cur AND r.pos_lo + u.k - 1 <= ln.cur + %(lim)s) j
        ORDER BY j.pos LIMIT %(lim)s) g),
ok AS MATERIALIZED (
    SELECT NOT EXISTS (SELECT 1 FROM c WHERE c.identity_key IS NOT NULL
                          OR (c.actor IS NOT NULL AND EXISTS (SELECT 1 FROM jl.actor_cap a WHERE a.actor = c.actor)))
       AND NOT EXISTS (SELECT 1 FROM jl.side s, ln WHERE s.lane_id = ln.lane_id AND s.pos > ln.cur)
       AND NOT EXISTS (SELECT 1 FROM jl.side s, ln WHERE s.queue = ln.queue_name AND s.state = 'ready'
                          AND s.priority <= ln.priority) AS ok),
cl AS (
    INSERT INTO jl.claim (seg, claim_id, lane_id, lo_pos, hi_pos, n, job_ids, flags, worker, dispatched_at, lease_until)
    SELECT (SELECT m.cur_seg FROM jl.meta m), nextval('jl.token_seq'), ln.lane_id, ln.cur + 1, x.hi, x.n, x.ids, 0,
           %(w)s, now(), clock_timestamp() + ln.lease
    FROM ln, (SELECT max(c.pos) AS hi, count(*)::int AS n, array_agg(c.job_id ORDER BY c.pos) AS ids FROM c) x
    WHERE x.n > 0 AND (SELECT ok.ok FROM ok)
    RETURNING claim_id, lease_until)
SELECT o.job_id, o.claim_id FROM (
    SELECT c.job_id, cl.claim_id, ln.queue_name, c.kind, c.args, ln.priority, 1, c.max_attempts, c.actor,
           c.fairness_key, c.identity_key, c.run_at, c.enqueued_at, cl.lease_until
    FROM c CROSS JOIN ln CROSS JOIN cl ORDER BY c.pos) o
"""
JLSQL_COMPLETE = """
WITH inp AS MATERIALIZED (
    SELECT DISTINCT u.i, u.t FROM unnest(%(ids)s::bigint[], %(toks)s::bigint[]) AS u(i, t)),
lk AS MATERIALIZED (
    SELECT count(pg_advisory_xact_lock(1785684601, (t %% 2147483647)::int)) AS n
    FROM (SELECT DISTINCT t FROM inp ORDER BY 1) x),
cl AS MATERIALIZED (
    SELECT c.claim_id, c.job_ids, c.flags, c.state FROM jl.claim c
    WHERE c.claim_id = ANY (ARRAY(SELECT DISTINCT inp.t FROM inp)) AND (SELECT n FROM lk) >= 0),
gone AS MATERIALIZED (
    SELECT d.claim_id, x.id FROM jl.claim_done d CROSS JOIN LATERAL unnest(d.job_ids) x(id)
    WHERE d.claim_id = ANY (ARRAY(SELECT cl.claim_id FROM cl))),
acc AS MATERIALIZED (
    SELECT inp.t AS claim_id, inp.i AS id FROM inp
    WHERE EXISTS (SELECT 1 FROM cl WHERE cl.claim_id = inp.t AND cl.state = 'a' AND inp.i = ANY (cl.job_ids))
      AND NOT EXISTS (SELECT 1 FROM gone WHERE gone.claim_id = inp.t AND gone.id = inp.i)),
ins AS (
    INSERT INTO jl.claim_done (seg, claim_id, kind, job_ids, at)
    SELECT (SELECT m.cur_seg FROM jl.meta m), acc.claim_id, 'c', array_agg(acc.id), now()
    FROM acc GROUP BY acc.claim_id
    RETURNING cardinality(job_ids) AS n)
SELECT COALESCE((SELECT sum(ins.n) FROM ins), 0)::int
"""
FLOOR_ENQ = (f"SELECT count(*) FROM (SELECT array_fill('bench.kind'::text, ARRAY[%s]) AS k, "
             f"ARRAY(SELECT {PAYLOAD} FROM generate_series(1, %s) g) AS a) x")
FLOOR_DISPATCH = "SELECT g::bigint, g::bigint FROM generate_series(1, %s) g"
FLOOR_COMPLETE = "SELECT cardinality(%s::bigint[]) + cardinality(%s::bigint[])"

SCHEMAS = {"pgque": ["pgque"], "skiplocked": ["bench"], "joblog": ["jl"], "joblog-sql": ["jl"], "floor": ["none"]}


def connect(autocommit=True):
    return psycopg.connect(f"host={HOST} port={PORT} dbname={DB} user=postgres application_name=jl_e2e",
                           autocommit=autocommit)


def q1(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        r = cur.fetchone()
        return None if r is None else r[0]


def ex(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)


PGDATA = os.environ.get("BENCH_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".work", "pg15"))
TICK = os.sysconf("SC_CLK_TCK")


def cluster_cpu():
    """CPU seconds (user + system) used by the whole cluster so far: every child of the
    postmaster alive now, plus the postmaster's own and its reaped children's (a backend
    that exited during a cell lands there). Less sensitive than wall time to the other
    sessions sharing the machine: it counts work, not waiting."""
    try:
        with open(os.path.join(PGDATA, "postmaster.pid")) as f:
            pm = int(f.readline())
    except OSError:
        return None
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid = int(st[1])
        if int(d) == pm:
            total += int(st[11]) + int(st[12]) + int(st[13]) + int(st[14])
        elif ppid == pm:
            total += int(st[11]) + int(st[12])
    return total / TICK


def worker(system, q, secs, batch, barrier, outq, wid):
    conn = connect()
    cur = conn.cursor()
    if system == "joblog-sql":
        # what jl's functions set per call (SET clauses), set once for the session
        cur.execute("SET enable_seqscan = off")
        cur.execute("SET enable_bitmapscan = off")
        cur.execute("SET plan_cache_mode = force_generic_plan")   # as pgque's job statements
    done = 0
    try:
        barrier.wait()
        t0 = time.perf_counter()
        c0 = os.times()
        while time.perf_counter() - t0 < secs:
            if system == "pgque":
                cur.execute(PG_ENQ, (q, batch, batch), prepare=True)
                rows = cur.execute(PG_DISPATCH, ([q], batch, f"w{wid}"), prepare=True).fetchall()
                if rows:
                    cur.execute(PG_COMPLETE, ([r[0] for r in rows], [r[1] for r in rows]), prepare=True)
            elif system == "joblog":
                cur.execute(JL_ENQ, (q, batch, batch), prepare=True)
                rows = cur.execute(JL_DISPATCH, ([q], batch, f"w{wid}"), prepare=True).fetchall()
                if rows:
                    n = cur.execute(JL_COMPLETE, ([r[0] for r in rows], [r[1] for r in rows]), prepare=True).fetchone()[0]
                    if n != len(rows):
                        raise RuntimeError(f"jl.complete_many completed {n} of {len(rows)}")
            elif system == "joblog-sql":
                cur.execute(JLSQL_ENQ, {"q": q, "n": batch}, prepare=True)
                rows = cur.execute(JLSQL_DISPATCH, {"q": q, "lim": batch, "w": f"w{wid}"}, prepare=True).fetchall()
                if rows:
                    n = cur.execute(JLSQL_COMPLETE, {"ids": [r[0] for r in rows], "toks": [r[1] for r in rows]},
                                    prepare=True).fetchone()[0]
                    if n != len(rows):
                        raise RuntimeError(f"joblog-sql completed {n} of {len(rows)}")
            elif system == "floor":
                # a store that costs nothing: the same three round trips, the same payload
                # built server-side, 100 (id, token) rows back, the ids sent back
                cur.execute(FLOOR_ENQ, (batch, batch), prepare=True)
                rows = cur.execute(FLOOR_DISPATCH, (batch,), prepare=True).fetchall()
                cur.execute(FLOOR_COMPLETE, ([r[0] for r in rows], [r[1] for r in rows]), prepare=True)
            else:
                cur.execute(SL_INSERT, (q, batch), prepare=True)
                rows = cur.execute(SL_CLAIM, (f"w{wid}", q, batch), prepare=True).fetchall()
                if rows:
                    cur.execute(SL_DELETE, ([r[0] for r in rows],), prepare=True)
            done += len(rows)
        c1 = os.times()
        outq.put((done, time.perf_counter() - t0, (c1.user - c0.user) + (c1.system - c0.system)))
    except Exception as e:  # noqa: BLE001
        barrier.abort()
        outq.put(RuntimeError(f"{system} worker {wid}: {e}"))
    conn.close()


def maint_loop(stop, outq):
    """jl's background duties during a joblog cell: rescue, promotion, rotation."""
    conn = connect()
    log = []
    try:
        while not stop.is_set():
            try:
                log.append(q1(conn, "SELECT jl.maint()"))
            except psycopg.errors.LockNotAvailable:
                log.append("rotation: lock_timeout (a reader held a segment)")
            stop.wait(0.5)
    finally:
        outq.put(log)
        conn.close()


def jl_reset(conn, period="1 second", retention="0"):
    ex(conn, "TRUNCATE jl.log, jl.claim, jl.claim_done, jl.side, jl.actor_cap, jl.running_identity, jl.ukey, "
             "jl.job_events, jl.lane, jl.queue")
    ex(conn, "UPDATE jl.meta SET cur_seg = 0, rotation_period = %s::interval, retention = %s::interval",
       (period, retention))
    ex(conn, "UPDATE jl.seg SET opened_at = CASE WHEN seg = 0 THEN now() END, sealed_at = NULL, empty = (seg <> 0)")


def dead_tuples(conn, schemas):
    time.sleep(0.7)
    ex(conn, "SELECT pg_stat_clear_snapshot()")
    with conn.cursor() as cur:
        cur.execute("SELECT schemaname || '.' || relname, n_dead_tup, n_live_tup FROM pg_stat_user_tables "
                    "WHERE schemaname = ANY(%s) AND (n_dead_tup > 0 OR n_live_tup > 0) ORDER BY 1", (schemas,))
        return {n: (int(d), int(l)) for n, d, l in cur.fetchall()}


def pgss_top(conn, n=6):
    with conn.cursor() as cur:
        cur.execute("""
            SELECT s.toplevel, s.calls, round(s.total_exec_time::numeric, 0), round((s.total_exec_time / greatest(s.calls, 1))::numeric, 3),
                   round(((s.shared_blks_hit + s.shared_blks_read)::float8 / greatest(s.calls, 1))::numeric, 1),
                   round((s.wal_bytes::float8 / greatest(s.calls, 1))::numeric, 0),
                   regexp_replace(left(s.query, 110), '\\s+', ' ', 'g')
              FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = current_database() AND s.query NOT ILIKE '%%pg_stat%%'
               AND s.query NOT ILIKE '%%pg_current_wal%%'
             ORDER BY s.total_exec_time DESC LIMIT %s""", (n,))
        return cur.fetchall()


def cell(conn, system, rnd, workers, secs, batch):
    q = f"e2e_{workers}_r{rnd}"
    if system == "pgque":
        ex(conn, "SELECT pgque.create_job_queue(%s, 'strict_fifo', 1)", (q,))
    elif system in ("joblog", "joblog-sql"):
        jl_reset(conn)
        ex(conn, "SELECT jl.create_queue(%s)", (q,))
        ex(conn, "SELECT jl.lane_ids(%s, ARRAY[0::smallint])", (q,))
    else:
        ex(conn, "TRUNCATE bench.sl_jobs")
    ex(conn, "SELECT pg_stat_force_next_flush()")
    ex(conn, "SELECT pg_stat_statements_reset()")
    lsn = q1(conn, "SELECT pg_current_wal_insert_lsn()::text")
    cpu0 = cluster_cpu()
    barrier = MP.Barrier(workers, timeout=300)
    outq = MP.Queue()
    stop = MP.Event()
    maint = None
    if system in ("joblog", "joblog-sql") and not NO_MAINT:
        maint = MP.Process(target=maint_loop, args=(stop, outq))
        maint.start()
    procs = [MP.Process(target=worker, args=(system, q, secs, batch, barrier, outq, i)) for i in range(workers)]
    for p in procs:
        p.start()
    outs = []
    while len([o for o in outs if not isinstance(o, list)]) < workers:
        outs.append(outq.get())
    for p in procs:
        p.join()
    maint_log = []
    if maint:
        stop.set()
        while not any(isinstance(o, list) for o in outs):
            outs.append(outq.get())
        maint.join()
    for o in outs:
        if isinstance(o, Exception):
            raise o
        if isinstance(o, list):
            maint_log = o
    time.sleep(0.2)  # the workers' backends exit and are reaped
    cpu1 = cluster_cpu()
    wal = int(q1(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", (lsn,)))
    res = [o for o in outs if isinstance(o, tuple)]
    done = sum(o[0] for o in res)
    secs_run = max(o[1] for o in res)
    dead = dead_tuples(conn, SCHEMAS[system])
    top = pgss_top(conn)
    if system == "pgque":
        ex(conn, "SELECT pgque.drop_job_queue(%s, true)", (q,))
    rot = {"switch": sum("switched" in m for m in maint_log), "truncate": sum("truncated" in m for m in maint_log),
           "blocked": sum("not dispatched" in m or "lock_timeout" in m for m in maint_log)}
    return {"rate": done / secs_run, "wal": wal / done if done else None, "jobs": done, "dead": dead, "top": top,
            "rot": rot,
            "scpu": (cpu1 - cpu0) * 1e6 / done if done and cpu0 is not None else None,
            "ccpu": sum(o[2] for o in res) * 1e6 / done if done else None}


def check_claims(conn):
    """After a joblog run without truncation: no job was claimed twice, and each
    lane's claims tile it in order (lo = previous hi + 1): lane FIFO, nothing skipped."""
    twice = q1(conn, "SELECT count(*) - count(DISTINCT x) FROM jl.claim c, unnest(c.job_ids) x")
    gaps = q1(conn, """SELECT count(*) FROM (SELECT lane_id, lo_pos, lag(hi_pos) OVER (PARTITION BY lane_id ORDER BY hi_pos) AS prev
                                          FROM jl.claim) x WHERE prev IS NOT NULL AND lo_pos <> prev + 1""")
    claimed = q1(conn, "SELECT count(*) FROM jl.claim c, unnest(c.job_ids) x")
    unfinished = q1(conn, "SELECT running FROM jl.queue_status LIMIT 1")
    return twice, gaps, claimed, unfinished


def cap_worker(q, rounds, barrier, outq, wid):
    """Holds its dispatched jobs across a barrier so both dispatchers' claims overlap in time."""
    conn = connect()
    cur = conn.cursor()
    seen = []
    try:
        for _ in range(rounds):
            cur.execute("SELECT count(*) FROM jl.enqueue(%s, array_fill('k'::text, ARRAY[10]), "
                        "ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 10) g), "
                        "p_actors => array_fill('capped'::text, ARRAY[10]))", (q,))
            barrier.wait()
            rows = cur.execute("SELECT job_id, lease_token FROM jl.dispatch(%s::text[], 10, %s)", ([q], f"c{wid}")).fetchall()
            barrier.wait()   # both hold their jobs now
            if wid == 0:
                seen.append(q1(conn, "SELECT count(*) FROM jl.claim c, unnest(c.job_ids) x "
                                     "WHERE c.state = 'a' AND NOT EXISTS (SELECT 1 FROM jl.claim_done d WHERE d.claim_id = c.claim_id AND x = ANY (d.job_ids))")
                            + q1(conn, "SELECT count(*) FROM jl.side WHERE state = 'running' AND actor = 'capped'"))
            barrier.wait()
            if rows:
                cur.execute("SELECT jl.complete_many(%s::bigint[], %s::bigint[])", ([r[0] for r in rows], [r[1] for r in rows]))
            barrier.wait()
        outq.put(seen)
    except Exception as e:  # noqa: BLE001
        barrier.abort()
        outq.put(RuntimeError(f"cap worker {wid}: {e}"))
    conn.close()


def run_checks(conn, secs):
    out = []
    # 1. two producers + two dispatchers on one lane, rotation switching (no truncation)
    jl_reset(conn, period="1 second", retention="1 hour")
    ex(conn, "SELECT jl.create_queue('chk')")
    barrier, outq, stop = MP.Barrier(2, timeout=120), MP.Queue(), MP.Event()
    maint = MP.Process(target=maint_loop, args=(stop, outq))
    maint.start()
    procs = [MP.Process(target=worker, args=("joblog", "chk", secs, 100, barrier, outq, i)) for i in range(2)]
    for p in procs:
        p.start()
    res = [outq.get() for _ in procs]
    stop.set()
    res.append(outq.get())
    for p in procs + [maint]:
        p.join()
    for r in res:
        if isinstance(r, Exception):
            raise r
    twice, gaps, claimed, unfinished = check_claims(conn)
    segs = q1(conn, "SELECT count(*) FROM jl.seg WHERE NOT empty")
    out.append(f"2 workers x {secs} s on one lane, segments switching every second: {claimed:,} jobs claimed, "
               f"claimed twice: {twice}, claim ranges not contiguous: {gaps}, still running: {unfinished}, "
               f"segments in use: {segs}")
    if twice or gaps or unfinished:
        raise SystemExit("CHECK FAILED: " + out[-1])
    # 2. capacity under concurrent dispatchers: two queues, one actor capped at 3
    jl_reset(conn)
    ex(conn, "SELECT jl.create_queue('cap1'), jl.create_queue('cap2'), jl.set_actor_capacity('capped', 3)")
    barrier, outq = MP.Barrier(2, timeout=120), MP.Queue()
    procs = [MP.Process(target=cap_worker, args=(q, 20, barrier, outq, i)) for i, q in enumerate(("cap1", "cap2"))]
    for p in procs:
        p.start()
    res = [outq.get() for _ in procs]
    for p in procs:
        p.join()
    for r in res:
        if isinstance(r, Exception):
            raise r
    seen = [x for r in res for x in r]
    out.append(f"capacity 3, two queues, two concurrent dispatchers, 20 rounds: in-flight jobs of the actor per round "
               f"max {max(seen)}, min {min(seen)}")
    if max(seen) > 3:
        raise SystemExit("CHECK FAILED: over-admission " + out[-1])
    return out


INSERVER = {
    # one DO block per cell: `cycles` iterations of the w8 loop with a COMMIT after each
    # statement (as autocommit would), no client round trips: the stores' own cost
    "pgque": """
        FOR i IN 1..{cycles} LOOP
            PERFORM count(*) FROM pgque.enqueue_ready_rows(q, array_fill('bench.kind'::text, ARRAY[100]), ARRAY(SELECT {payload} FROM generate_series(1, 100) g));
            COMMIT;
            SELECT array_agg(job_id), array_agg(lease_token) INTO ids, toks FROM pgque.dispatch(ARRAY[q], 100, 'w', NULL, 2);
            COMMIT;
            PERFORM pgque.complete_many(ids, toks);
            COMMIT;
        END LOOP;""",
    "joblog": """
        FOR i IN 1..{cycles} LOOP
            PERFORM count(*) FROM jl.enqueue(q, array_fill('bench.kind'::text, ARRAY[100]), ARRAY(SELECT {payload} FROM generate_series(1, 100) g));
            COMMIT;
            SELECT array_agg(job_id), array_agg(lease_token) INTO ids, toks FROM jl.dispatch(ARRAY[q], 100, 'w', NULL, 2);
            COMMIT;
            PERFORM jl.complete_many(ids, toks);
            COMMIT;
        END LOOP;""",
    "skiplocked": """
        FOR i IN 1..{cycles} LOOP
            INSERT INTO bench.sl_jobs(queue, kind, args) SELECT q, 'bench.kind', {payload} FROM generate_series(1, 100) g;
            COMMIT;
            WITH c AS (UPDATE bench.sl_jobs SET state = 'running', locked_by = 'w', locked_at = now(), attempt = attempt + 1
                       WHERE id IN (SELECT id FROM bench.sl_jobs WHERE queue = q AND state = 'ready' AND run_at <= now()
                                    ORDER BY priority, run_at, id LIMIT 100 FOR UPDATE SKIP LOCKED)
                       RETURNING id, queue, kind, args::text, priority, attempt)
            SELECT array_agg(id) INTO ids FROM c;
            COMMIT;
            DELETE FROM bench.sl_jobs WHERE id = ANY (ids);
            COMMIT;
        END LOOP;""",
}


def inserver(conn, systems, rounds, cycles):
    res = {}
    for rnd in range(1, rounds + 1):
        for s in systems:
            q = f"ins_r{rnd}"
            if s == "pgque":
                ex(conn, "SELECT pgque.create_job_queue(%s, 'strict_fifo', 1)", (q,))
            elif s == "joblog":
                jl_reset(conn)
                ex(conn, "SELECT jl.create_queue(%s)", (q,))
            else:
                ex(conn, "TRUNCATE bench.sl_jobs")
            body = INSERVER[s].format(cycles=cycles, payload=PAYLOAD)
            lsn = q1(conn, "SELECT pg_current_wal_insert_lsn()::text")
            t0 = time.perf_counter()
            ex(conn, f"DO $do$ DECLARE q text := '{q}'; ids bigint[]; toks bigint[]; BEGIN {body} END $do$")
            dt = time.perf_counter() - t0
            wal = int(q1(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", (lsn,)))
            if s == "pgque":
                ex(conn, "SELECT pgque.drop_job_queue(%s, true)", (q,))
            res.setdefault(s, []).append((cycles * 100 / dt, wal / (cycles * 100)))
            print(f"[inserver {time.strftime('%H:%M:%S')}] round {rnd} {s:10s} jobs/s {cycles * 100 / dt:9,.0f}  WAL B/job {wal / (cycles * 100):7,.0f}",
                  flush=True)
    return res


def depth_latency(conn, depths, samples=30):
    """jl.dispatch(100) latency at several ready depths, each sample rolled back
    (the depth stays), custom and forced-generic plans: the w7 shape for the prototype."""
    jl_reset(conn, period="1 hour", retention="1 hour")
    ex(conn, "SELECT jl.create_queue('depth')")
    have, out = 0, []
    for d in depths:
        while have < d:
            ex(conn, f"SELECT count(*) FROM jl.enqueue('depth', array_fill('bench.kind'::text, ARRAY[100]), "
                     f"ARRAY(SELECT {PAYLOAD} FROM generate_series(1, 100) g))")
            have += 100
        ex(conn, "VACUUM ANALYZE jl.log")
        for plan in ("force_custom_plan", "force_generic_plan"):
            c2 = connect(autocommit=False)
            cur = c2.cursor()
            cur.execute(f"SET plan_cache_mode = {plan}")
            c2.commit()
            lats, rows = [], []
            for i in range(samples + 3):
                t0 = time.perf_counter()
                r = cur.execute("SELECT job_id FROM jl.dispatch(ARRAY['depth'], 100, 'w')").fetchall()
                lats.append((time.perf_counter() - t0) * 1000)
                rows.append(len(r))
                c2.rollback()
            c2.close()
            lats = sorted(lats[3:])
            out.append((d, plan, lats[len(lats) // 2], lats[int(len(lats) * 0.95) - 1], min(rows)))
            print(f"[depth] ready {d:>7,} {plan:19s} p50 {out[-1][2]:6.2f} ms  p95 {out[-1][3]:6.2f} ms  min rows {out[-1][4]}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", default=None, help="comma-separated ready depths: jl.dispatch latency at each, then exit")
    ap.add_argument("--inserver", type=int, default=0, metavar="CYCLES",
                    help="run the loop inside the server (one DO block per cell, CYCLES iterations) and exit")
    ap.add_argument("--check", action="store_true", help="run the concurrent checks of the prototype and exit")
    ap.add_argument("--secs", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--systems", default="pgque,skiplocked,joblog")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    systems = a.systems.split(",")
    conn = connect()
    if a.depths:
        depth_latency(conn, [int(x) for x in a.depths.split(",")])
        return
    if a.inserver:
        res = inserver(conn, systems, a.rounds, a.inserver)
        med = statistics.median
        print("\n| system | " + " | ".join(f"round {i}" for i in range(1, a.rounds + 1)) + " | median jobs/s | median WAL B/job |")
        print("|---|" + "---|" * (a.rounds + 2))
        for s_ in systems:
            print(f"| {s_} | " + " | ".join(f"{r[0]:,.0f}" for r in res[s_]) + f" | {med([r[0] for r in res[s_]]):,.0f} | {med([r[1] for r in res[s_]]):,.0f} |")
        if "joblog" in res and "skiplocked" in res:
            print("\n| joblog / skiplocked | " + " | ".join(f"{x[0] / y[0]:.2f}" for x, y in zip(res["joblog"], res["skiplocked"])) +
                  f" | ratio of medians {med([r[0] for r in res['joblog']]) / med([r[0] for r in res['skiplocked']]):.2f} |")
        return
    if a.check:
        for line in run_checks(conn, a.secs):
            print("ok:", line)
        return
    results = {}  # (workers, system) -> [cells]
    lines = []
    t_start = time.time()
    for w in [int(x) for x in a.workers.split(",")]:
        for rnd in range(1, a.rounds + 1):
            for s in systems:
                r = cell(conn, s, rnd, w, a.secs, a.batch)
                results.setdefault((w, s), []).append(r)
                print(f"[e2e {time.strftime('%H:%M:%S')}] workers={w} round {rnd} {s:10s} jobs/s {r['rate']:9,.0f}  "
                      f"WAL B/job {r['wal'] or 0:7,.0f}  jobs {r['jobs']:7,}  dead {sum(d for d, _ in r['dead'].values()):7,}  "
                      f"server CPU us/job {r['scpu'] or 0:5.1f}  client CPU us/job {r['ccpu'] or 0:5.1f}"
                      + (f"  rotation {r['rot']}" if s.startswith('joblog') else ""), flush=True)
    # report
    med = statistics.median
    lines.append(f"# job-log prototype, end-to-end (w8 loop) — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    lines.append(f"command: `BENCH_HOST={HOST} BENCH_PORT={PORT} python3 benches/prototype/e2e.py --secs {a.secs} "
                 f"--rounds {a.rounds} --workers {a.workers} --batch {a.batch}`; wall time {time.time() - t_start:.0f} s; "
                 f"load average at end {os.getloadavg()[0]:.2f}\n")
    for w in sorted({k[0] for k in results}):
        lines.append(f"\n## workers={w}\n")
        lines.append("| system | " + " | ".join(f"round {i}" for i in range(1, a.rounds + 1)) + " | median jobs/s | median WAL B/job | dead tuples at end (last round) |")
        lines.append("|---|" + "---|" * (a.rounds + 3))
        for s in systems:
            cs = results[(w, s)]
            dead = ", ".join(f"{n} {d:,}" for n, (d, _) in cs[-1]["dead"].items() if d) or "0 in every table"
            lines.append(f"| {s} | " + " | ".join(f"{c['rate']:,.0f}" for c in cs) +
                         f" | {med([c['rate'] for c in cs]):,.0f} | {med([c['wal'] for c in cs]):,.0f} | {dead} |")
        lines.append("")
        lines.append("cluster CPU (all PostgreSQL processes, user + system) per job, µs, per round; client CPU per job in brackets:\n")
        lines.append("| system | " + " | ".join(f"round {i}" for i in range(1, a.rounds + 1)) + " | median server CPU µs/job |")
        lines.append("|---|" + "---|" * (a.rounds + 1))
        for s_ in systems:
            cs = results[(w, s_)]
            lines.append(f"| {s_} | " + " | ".join(f"{c['scpu']:.1f} ({c['ccpu']:.1f})" for c in cs) +
                         f" | {med([c['scpu'] for c in cs]):.1f} |")
        lines.append("")
        lines.append("ratio per round (same round, interleaved):\n")
        lines.append("| ratio | " + " | ".join(f"round {i}" for i in range(1, a.rounds + 1)) + " | ratio of medians |")
        lines.append("|---|" + "---|" * (a.rounds + 1))
        for num, den in (("joblog", "skiplocked"), ("joblog-sql", "skiplocked"), ("joblog", "pgque"), ("pgque", "skiplocked"), ("floor", "skiplocked"), ("joblog", "floor")):
            if num in systems and den in systems:
                n, d = results[(w, num)], results[(w, den)]
                lines.append(f"| {num} / {den} | " + " | ".join(f"{x['rate'] / y['rate']:.2f}" for x, y in zip(n, d)) +
                             f" | {med([x['rate'] for x in n]) / med([y['rate'] for y in d]):.2f} |")
        if "joblog" in systems:
            lines.append("\nrotation during the joblog cells (maint every 0.5 s, period 1 s, retention 0): " +
                         "; ".join(f"round {i + 1}: {c['rot']}" for i, c in enumerate(results[(w, 'joblog')])))
            lines.append("\nlive/dead tuples of jl tables at the end of the last joblog cell: " +
                         ", ".join(f"{n} {l:,}/{d:,}" for n, (d, l) in results[(w, 'joblog')][-1]["dead"].items()))
        lines.append("\npg_stat_statements, last round (toplevel, calls, total ms, mean ms, buffers/call, WAL B/call, statement):\n")
        for s in systems:
            lines.append(f"{s}:\n")
            lines.append("| top | calls | total ms | mean ms | buf/call | WAL B/call | statement |")
            lines.append("|---|---|---|---|---|---|---|")
            for row in results[(w, s)][-1]["top"]:
                lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in row) + " |")
            lines.append("")
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
