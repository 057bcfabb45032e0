"""Job-queue workloads 6-8: pgque's job queues beside a plain multi-row INSERT and
the classic SKIP LOCKED job table (bench.sl_jobs).

  w6  enqueue_ready_rows at batch 1/10/100/1000 with 1 and 2 producers vs a plain
      multi-row INSERT of the same rows; statements per call from pg_stat_statements
  w7  dispatch latency p50/p95 at ready depths 1k..200k, strict_fifo and round_robin,
      custom and forced-generic plans, vs the SKIP LOCKED claim on an equally deep table
  w8  end-to-end jobs/s (enqueue 100, dispatch 100, complete_many) with 1 and 2
      workers vs SKIP LOCKED insert + claim + delete
"""
import multiprocessing as mp
import time

from . import db, pgbench
from .core import pct, progress, run_rounds

MP = mp.get_context("fork")

ENQ = ["pgque.create_job_queue(text,text,integer)",
       "pgque.enqueue_ready_rows(text,text[],jsonb[],smallint[],timestamp with time zone[],text[],text[],text[],text[],integer[],text)"]
DISPATCH = ["pgque.dispatch(text[],integer,text,interval,integer)"]
# complete_many(ids, tokens) is what the loop calls; 0.7.0 added a defaulted outputs argument
COMPLETE = ["pgque.complete_many"]
JOB_SCHEMAS = db.SYSTEM_SCHEMAS["pgque"]


def has_enqueue(conn):
    """The exact argument list may grow; accept any enqueue_ready_rows with the leading (text, text[], jsonb[])."""
    return db.scalar(conn, """
        SELECT count(*) FROM pg_proc
         WHERE pronamespace = to_regnamespace('pgque') AND proname = 'enqueue_ready_rows'
           AND proargtypes[0:2]::oid[] = ARRAY['text'::regtype, 'text[]'::regtype, 'jsonb[]'::regtype]::oid[]""") > 0


def has_complete_many(conn):
    """Any complete_many with the leading (bigint[], bigint[]) (later arguments defaulted)."""
    return db.scalar(conn, """
        SELECT count(*) FROM pg_proc
         WHERE pronamespace = to_regnamespace('pgque') AND proname = 'complete_many'
           AND proargtypes[0:1]::oid[] = ARRAY['bigint[]'::regtype, 'bigint[]'::regtype]::oid[]
           AND pronargs - pronargdefaults = 2""") > 0


def create_job_queue(conn, q, mode):
    db.execute(conn, "SELECT pgque.create_job_queue(%s, %s, 1)", (q, mode))


def drop_job_queue(conn, q):
    try:
        db.execute(conn, "SELECT pgque.drop_job_queue(%s, true)", (q,))
    except Exception as e:
        progress(f"warning: drop_job_queue({q}): {str(e).splitlines()[0]}")
    db.vacuum_schemas(conn, JOB_SCHEMAS)


def enqueue_sql(batch, q_expr=":q", fairness=False):
    p = db.payload_sql("g")
    fk = ", fairness_keys => ARRAY(SELECT 'k' || mod(g, 100) FROM generate_series(1, {b}) g)".format(b=batch) if fairness else ""
    return (f"SELECT count(*) FROM pgque.enqueue_ready_rows({q_expr}, array_fill('bench.kind'::text, ARRAY[{batch}]), "
            f"ARRAY(SELECT {p} FROM generate_series(1, {batch}) g){fk})")


def plain_insert_sql(batch, q_expr=":q"):
    p = db.payload_sql("g")
    return f"INSERT INTO bench.plain_jobs(queue, kind, args) SELECT {q_expr}, 'bench.kind', {p} FROM generate_series(1, {batch}) g"


# ---- w6 ------------------------------------------------------------------------------------
def enqueue_cell(w, conn, cfg, system, rnd, batch, clients):
    q = f"w6_b{batch}_c{clients}_r{rnd}"
    if system == "pgque":
        create_job_queue(conn, q, "strict_fifo")
        script, marker, schemas = enqueue_sql(batch) + ";\n", "enqueue_ready_rows", JOB_SCHEMAS
    else:
        db.truncate(conn, "bench.plain_jobs")
        script, marker, schemas = plain_insert_sql(batch) + ";\n", "bench.plain_jobs", ("bench",)
    tables = {"bench.plain_jobs"} if system == "plain" else None
    db.pgss_reset(conn)
    lsn = db.wal_lsn(conn)
    tx, tps, failed = pgbench.run(script, clients, cfg.enq_secs, {"q": q})
    wal = db.wal_diff(conn, lsn)
    top, spc = db.pgss_statements_per_call(conn, marker)
    if system == "pgque":
        w.profile(f"batch={batch} producers={clients}", system, rnd, db.pgss_top(conn))
    jobs = tx * batch
    dead = db.dead_tuples(conn, schemas, tables)
    if system == "pgque":
        drop_job_queue(conn, q)
    w.add(f"batch={batch} producers={clients}", system, rnd, {
        "rate": tps * batch, "wal_per": wal / jobs if jobs else None, "stmts": spc, "dead": dead})


def w6(res, cfg, conn):
    w = res.workload("w6", "enqueue_ready_rows vs plain multi-row INSERT",
                     [("rate", "jobs/s"), ("wal_per", "WAL B/job"), ("stmts", "nested statements/call")],
                     about="pgbench -c 1|2, one call per transaction: `SELECT count(*) FROM pgque.enqueue_ready_rows(q, kinds, args)` "
                           "(arrays built server-side) vs `INSERT INTO bench.plain_jobs(queue, kind, args) SELECT ... FROM generate_series` "
                           "(same ~200-byte args). The client sends one statement per call; nested statements/call = the statements "
                           "pg_stat_statements (track = all) saw in the bench database during the cell beyond the top-level "
                           "calls, over the top-level calls (0 for a plain INSERT); the pgque "
                           "worker is stopped during this workload so its statements do not count.")
    systems = ["pgque", "plain"]
    miss = db.missing_functions(conn, ENQ[:1]) + ([] if has_enqueue(conn) else ["pgque.enqueue_ready_rows(text,text[],jsonb[],...)"])
    if miss:
        w.skip(f"pgque: function {', '.join(miss)} not installed")
        systems.remove("pgque")
    from .w_events import pgque_worker
    pgque_worker(conn, False)
    try:
        for clients in cfg.enq_clients:
            for batch in cfg.enq_batches:
                run_rounds(cfg.rounds, systems, lambda s, r: enqueue_cell(w, conn, cfg, s, r, batch, clients))
    finally:
        pgque_worker(conn, True)


# ---- w7 ------------------------------------------------------------------------------------
SL_CLAIM = ("UPDATE bench.sl_jobs SET state = 'running', locked_by = %s, locked_at = now(), attempt = attempt + 1 "
            "WHERE id IN (SELECT id FROM bench.sl_jobs WHERE queue = %s AND state = 'ready' AND run_at <= now() "
            "ORDER BY priority, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED) "
            "RETURNING id, queue, kind, args::text, priority, attempt")
PG_DISPATCH = "SELECT job_id, queue, kind, args::text, priority, attempt, lease_token FROM pgque.dispatch(%s::text[], %s::int, %s::text, NULL::interval, 2)"
# w8's floor: rows as wide as a claim's (id, queue, kind, a 200-byte args text,
# priority, attempt, token), made without touching a table.
FLOOR_FETCH = ("SELECT g::bigint, %s::text, 'bench.kind'::text, repeat('x', 200), 0::smallint, 1, g::bigint "
               "FROM generate_series(1, %s) g")


def fill_depth(conn, target, have, queues):
    """Bring each pgque queue and the SKIP LOCKED table from `have` to `target` ready jobs."""
    add = target - have
    if add <= 0:
        return
    p = db.payload_sql("g")
    for q, mode in queues:
        left = add
        while left > 0:
            b = min(1000, left)
            db.execute(conn, enqueue_sql(b, "%s", fairness=(mode == "round_robin")), (q,))
            left -= b
    db.execute(conn, f"INSERT INTO bench.sl_jobs(queue, kind, args) SELECT 'w7', 'bench.kind', {p} FROM generate_series(1, %s) g",
               (add,))
    db.execute(conn, "VACUUM ANALYZE bench.sl_jobs")
    if queues:
        db.execute(conn, "ANALYZE")  # the job store's tables too, as autovacuum eventually would


def dispatch_cell(w, cfg, system, plan, depth, rnd, queues_by_mode, admin):
    if system.startswith("pgque"):
        db.pgss_reset(admin)
    conn = db.connect(autocommit=False)
    cur = conn.cursor()
    cur.execute("SET plan_cache_mode = %s" % ("force_generic_plan" if plan == "generic" else "force_custom_plan"))
    conn.commit()
    lats = []
    rows_seen = []
    for i in range(cfg.w7_samples + 3):
        t0 = time.perf_counter()
        if system == "skiplocked":
            rows = cur.execute(SL_CLAIM, ("w7", "w7", cfg.w7_limit), prepare=True).fetchall()
        else:
            q = queues_by_mode[system.split()[1]]
            rows = cur.execute(PG_DISPATCH, ([q], cfg.w7_limit, "w7"), prepare=True).fetchall()
        t1 = time.perf_counter()
        conn.rollback()  # keep the depth constant: every sample sees the same backlog
        if i >= 3:  # the first executions prepare and warm the plan cache
            lats.append((t1 - t0) * 1000.0)
            rows_seen.append(len(rows))
    conn.close()
    if system.startswith("pgque"):
        w.profile(f"depth={depth:,}", f"{system} ({plan})", rnd, db.pgss_top(admin, 4))
    w.add(f"depth={depth:,}", f"{system} ({plan})", rnd, {
        "p50": pct(lats, 50), "p95": pct(lats, 95), "rows": min(rows_seen) if rows_seen else None})


def w7(res, cfg, conn):
    w = res.workload("w7", f"Dispatch latency vs ready depth (limit {cfg.w7_limit})",
                     [("p50", "p50 ms"), ("p95", "p95 ms"), ("rows", "min rows returned")],
                     higher_is_better=False,
                     about=f"Client-side time of one dispatch statement (prepared, {cfg.w7_samples} samples per cell after 3 "
                           f"warm-ups), each sample in a transaction that is rolled back so the depth stays constant. "
                           f"`pgque.dispatch(ARRAY[q], {cfg.w7_limit}, worker, NULL, 2)` on a strict_fifo queue and on a "
                           f"round_robin queue (100 fairness keys) vs the SKIP LOCKED claim `UPDATE ... WHERE id IN (SELECT "
                           f"... ORDER BY priority, run_at, id LIMIT {cfg.w7_limit} FOR UPDATE SKIP LOCKED) RETURNING` on "
                           f"bench.sl_jobs with the same number of ready rows; plan_cache_mode force_custom_plan vs "
                           f"force_generic_plan. `min rows returned` must equal the limit (a generic-plan cliff shows there).")
    systems = ["pgque strict_fifo", "pgque round_robin", "skiplocked"]
    miss = db.missing_functions(conn, ENQ[:1] + DISPATCH) + ([] if has_enqueue(conn) else ["pgque.enqueue_ready_rows"])
    queues = []
    if miss:
        w.skip(f"pgque: function {', '.join(miss)} not installed")
        systems = ["skiplocked"]
    else:
        queues = [("w7_fifo", "strict_fifo"), ("w7_rr", "round_robin")]
        for q, mode in queues:
            create_job_queue(conn, q, mode)
    db.truncate(conn, "bench.sl_jobs")
    by_mode = {mode: q for q, mode in queues}
    have = 0
    try:
        for depth in cfg.w7_depths:
            fill_depth(conn, depth, have, queues)
            have = depth
            cells = [(s, p) for s in systems for p in ("custom", "generic")]
            run_rounds(cfg.rounds, cells, lambda sp, r: dispatch_cell(w, cfg, sp[0], sp[1], depth, r, by_mode, conn))
    finally:
        for q, _ in queues:
            drop_job_queue(conn, q)
        db.truncate(conn, "bench.sl_jobs")
    # depth ratios: p50 at each depth over p50 at the smallest depth, per system and plan
    depths = [f"depth={d:,}" for d in cfg.w7_depths]
    rows = []
    for s in systems:
        for p in ("custom", "generic"):
            name = f"{s} ({p})"
            base = w.med(depths[0], name, "p50")
            rows.append([name] + [(w.med(d, name, "p50") / base) if base and w.med(d, name, "p50") else None for d in depths])
    w.extra_tables.append((f"median p50 at each depth / median p50 at {depths[0]} (target ≤ 1.25 at the deepest)",
                           ["system (plan)"] + depths, rows))


# ---- w8 ------------------------------------------------------------------------------------
def _jobs_worker(system, q, secs, batch, barrier, outq, wid):
    conn = db.connect()
    cur = conn.cursor()
    p = db.payload_sql("g")
    done = 0
    try:
        barrier.wait()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < secs:
            if system == "pgque":
                cur.execute(enqueue_sql(batch, "%s"), (q,), prepare=True)
                rows = cur.execute(PG_DISPATCH, ([q], batch, f"w{wid}"), prepare=True).fetchall()
                if rows:
                    cur.execute("SELECT pgque.complete_many(%s::bigint[], %s::bigint[])",
                                ([r[0] for r in rows], [r[6] for r in rows]), prepare=True)
            elif system == "floor":
                # the same client loop with no queue behind it: the payloads
                # built, 100 rows of the claim's width fetched, the ids and
                # tokens sent back (what every system pays per cycle)
                cur.execute(f"SELECT count(*) FROM (SELECT ARRAY(SELECT {p} FROM generate_series(1, %s) g)) x",
                            (batch,), prepare=True)
                rows = cur.execute(FLOOR_FETCH, (q, batch), prepare=True).fetchall()
                if rows:
                    cur.execute("SELECT cardinality(%s::bigint[]) + cardinality(%s::bigint[])",
                                ([r[0] for r in rows], [r[6] for r in rows]), prepare=True)
            else:
                cur.execute(f"INSERT INTO bench.sl_jobs(queue, kind, args) SELECT %s, 'bench.kind', {p} FROM generate_series(1, %s) g",
                            (q, batch), prepare=True)
                rows = cur.execute(SL_CLAIM, (f"w{wid}", q, batch), prepare=True).fetchall()
                if rows:
                    cur.execute("DELETE FROM bench.sl_jobs WHERE id = ANY(%s)", ([r[0] for r in rows],), prepare=True)
            done += len(rows)
        outq.put((done, time.perf_counter() - t0))
    except Exception as e:
        barrier.abort()
        outq.put(e)
    conn.close()


def e2e_cell(w, conn, cfg, system, rnd, workers):
    q = f"w8_{workers}_r{rnd}"
    if system == "pgque":
        create_job_queue(conn, q, "strict_fifo")
        schemas = JOB_SCHEMAS
    elif system == "floor":
        schemas = ()
    else:
        db.truncate(conn, "bench.sl_jobs")
        schemas = ("bench",)
    db.pgss_reset(conn)
    lsn = db.wal_lsn(conn)
    barrier = MP.Barrier(workers, timeout=300)
    outq = MP.Queue()
    procs = [MP.Process(target=_jobs_worker, args=(system, q, cfg.w8_secs, 100, barrier, outq, i)) for i in range(workers)]
    for pr in procs:
        pr.start()
    out = [outq.get() for _ in procs]
    for pr in procs:
        pr.join()
    errs = [o for o in out if isinstance(o, Exception)]
    if errs:
        raise errs[0]
    wal = db.wal_diff(conn, lsn)
    done = sum(o[0] for o in out)
    secs = max(o[1] for o in out)
    dead = None if system == "floor" else db.dead_tuples(conn, schemas, None if system == "pgque" else {"bench.sl_jobs"})
    if system == "pgque":
        w.profile(f"workers={workers}", system, rnd, db.pgss_top(conn))
        drop_job_queue(conn, q)
    w.add(f"workers={workers}", system, rnd, {
        "rate": done / secs if secs else None, "wal_per": wal / done if done else None, "jobs": done, "dead": dead})


def w8(res, cfg, conn):
    w = res.workload("w8", "End-to-end jobs/s: enqueue 100, dispatch 100, complete",
                     [("rate", "jobs/s"), ("wal_per", "WAL B/job"), ("jobs", "jobs done")],
                     about="Each worker process loops: pgque `enqueue_ready_rows` 100, `dispatch(ARRAY[q], 100, ...)`, "
                           "`complete_many(ids, tokens)`; SKIP LOCKED: INSERT 100, claim 100 (UPDATE ... SKIP LOCKED "
                           "RETURNING), DELETE the claimed ids. Both fetch the claimed jobs' id, queue, kind, args as text, "
                           "priority and attempt (pgque also the lease token). Autocommit: one transaction per statement. "
                           "`floor`: the same client loop with no queue behind it (the payloads built, 100 rows of the same "
                           "width fetched, the ids sent back): what every system pays per cycle of 100 jobs.")
    systems = ["pgque", "skiplocked", "floor"]
    miss = (db.missing_functions(conn, ENQ[:1] + DISPATCH) + ([] if has_enqueue(conn) else ["pgque.enqueue_ready_rows"])
            + ([] if has_complete_many(conn) else COMPLETE))
    if miss:
        w.skip(f"pgque: function {', '.join(miss)} not installed")
        systems.remove("pgque")
    for workers in (1, 2):
        run_rounds(cfg.rounds, systems, lambda s, r: e2e_cell(w, conn, cfg, s, r, workers))
    # time per 100 jobs, and what each system adds to the floor's
    rows = []
    for workers in (1, 2):
        v = f"workers={workers}"
        ms = {s: (100_000.0 / w.med(v, s, "rate")) if w.med(v, s, "rate") else None for s in systems}
        above = {s: (ms[s] - ms["floor"]) if ms.get(s) and ms.get("floor") else None for s in ("pgque", "skiplocked")}
        ratio = above["skiplocked"] / above["pgque"] if above["pgque"] and above["skiplocked"] else None
        rows.append([v, ms.get("pgque"), ms.get("skiplocked"), ms.get("floor"), above["pgque"], above["skiplocked"], ratio])
    w.extra_tables.append(("ms per 100 jobs (median rate), and above the floor (what the queue itself costs the loop)",
                           ["workers", "pgque ms", "skiplocked ms", "floor ms", "pgque above floor", "skiplocked above floor",
                            "skiplocked / pgque above floor"], rows))
