"""Workload 9: a held xmin.

A REPEATABLE READ session takes a snapshot (and an xid) and stays open while the
systems keep working; vacuum can then remove nothing newer than that snapshot.
Three phases, each running every system for the same time, interleaved:

  before   no snapshot held
  during   the snapshot is held for the whole phase (all systems, one after another)
  after    the snapshot released

Systems: event queues (pgque, PgQ) under continuous send (pgbench -c 1, one event
per transaction = workload 1) plus one consumer draining batches (workload 3's
loop), with the ticker running (pgque: its worker; PgQ: pgq.ticker() every 100 ms);
job queues (pgque, SKIP LOCKED) under workload 8's loop with one worker. Each
system keeps its queue across the phases, so dead tuples can pile up. Recorded per
phase: throughput, and n_dead_tup of every table of the system at the end of it.
"""
import multiprocessing as mp
import time

from . import db, pgbench, w_events, w_jobs
from .core import progress

MP = mp.get_context("fork")


def _consume(system, q, secs, outq):
    conn = db.connect()
    cur = conn.cursor()
    n = 0
    try:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < secs:
            got = 0
            with conn.transaction():
                if system == "pgque":
                    rows = cur.execute("SELECT batch_id FROM pgque.receive(%s, 'c1', 1000)", (q,), prepare=True).fetchall()
                    if rows:
                        cur.execute("SELECT pgque.ack(%s)", (rows[0][0],), prepare=True)
                    got = len(rows)
                else:
                    bid = cur.execute("SELECT pgq.next_batch(%s, 'c1')", (q,), prepare=True).fetchone()[0]
                    if bid is not None:
                        got = len(cur.execute("SELECT ev_id FROM pgq.get_batch_events(%s)", (bid,), prepare=True).fetchall())
                        cur.execute("SELECT pgq.finish_batch(%s)", (bid,), prepare=True)
            n += got
            if not got:
                time.sleep(0.01)
        outq.put((n, time.perf_counter() - t0))
    except Exception as e:
        outq.put(e)
    conn.close()


def _ticker(secs):
    conn = db.connect()
    t0 = time.time()
    while time.time() - t0 < secs:
        conn.execute("SELECT pgq.ticker()")
        time.sleep(0.1)
    conn.close()


def events_cell(w, conn, cfg, system, phase, q):
    secs = cfg.w9_secs
    outq = MP.Queue()
    cons = MP.Process(target=_consume, args=(system, q, secs + 1.0, outq))
    tick = MP.Process(target=_ticker, args=(secs + 1.0,)) if system == "pgq" else None
    cons.start()
    if tick:
        tick.start()
    lsn = db.wal_lsn(conn)
    tx, tps, _ = pgbench.run(w_events.send_script(system, 1), 1, secs, {"q": q})
    res = outq.get()
    cons.join()
    if tick:
        tick.join()
    if isinstance(res, Exception):
        raise res
    wal = db.wal_diff(conn, lsn)
    consumed, csecs = res
    dead = w_events.dead_for(conn, system)
    if system == "pgque":  # the job store shares schema pgque: its tables belong to the jobs rows
        dead = {t: n for t, n in dead.items() if not t.startswith("pgque.job")}
    w.add(phase, f"{system} events", 1, {"rate": consumed / csecs, "sent_rate": tps,
                                         "wal_per": wal / tx if tx else None, "dead": dead})


def jobs_cell(w, conn, cfg, system, phase, q):
    outq = MP.Queue()
    barrier = MP.Barrier(1)
    lsn = db.wal_lsn(conn)
    p = MP.Process(target=w_jobs._jobs_worker, args=(system, q, cfg.w9_secs, 100, barrier, outq, 0))
    p.start()
    res = outq.get()
    p.join()
    if isinstance(res, Exception):
        raise res
    done, secs = res
    wal = db.wal_diff(conn, lsn)
    dead = w_events.dead_for(conn, system)
    if system == "pgque":
        dead = {t: n for t, n in dead.items() if t.startswith("pgque.job")}
    w.add(phase, f"{system} jobs", 1, {"rate": done / secs, "wal_per": wal / done if done else None, "dead": dead})


def w9(res, cfg, conn):
    w = res.workload("w9", "Held xmin: throughput and dead tuples before, during and after",
                     [("rate", "consumed or done/s"), ("sent_rate", "sent/s"), ("wal_per", "WAL B/event")],
                     about=__doc__.split("\n\n", 1)[1].strip().replace("\n", " "))
    ev = ["pgq"]
    if not db.missing_functions(conn, w_events.PGQUE_LATENCY):
        ev.insert(0, "pgque")
    else:
        w.skip("pgque events: function " + ", ".join(db.missing_functions(conn, w_events.PGQUE_LATENCY)) + " not installed")
    jb = ["skiplocked"]
    if not (db.missing_functions(conn, w_jobs.ENQ[:1] + w_jobs.DISPATCH) or not w_jobs.has_enqueue(conn)
            or not w_jobs.has_complete_many(conn)):
        jb.insert(0, "pgque")
    else:
        w.skip("pgque jobs: enqueue_ready_rows / dispatch / complete_many not installed")
    queues = {}
    for s in ev:
        q = f"w9_{s}"
        w_events.create(conn, s, q)
        if s == "pgque":
            db.execute(conn, "SELECT pgque.subscribe(%s, 'c1')", (q,))
        else:
            db.execute(conn, "SELECT pgq.register_consumer(%s, 'c1')", (q,))
            db.execute(conn, "SELECT pgq.set_queue_config(%s, 'ticker_max_lag', '100 ms')", (q,))
        queues[("ev", s)] = q
    for s in jb:
        q = "w9_jobs"
        if s == "pgque":
            w_jobs.create_job_queue(conn, q, "strict_fifo")
        else:
            db.truncate(conn, "bench.sl_jobs")
        queues[("jb", s)] = q
    holder = None
    held_since = None
    try:
        for phase in ("before", "during", "after"):
            if phase == "during":
                holder = db.connect(autocommit=False)
                holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                xid = db.scalar(holder, "SELECT txid_current()")
                held_since = time.time()
                progress(f"w9: REPEATABLE READ session holds a snapshot (xid {xid})")
            if phase == "after" and holder is not None:
                holder.rollback()
                holder.close()
                holder = None
                w.note(f"snapshot held for {time.time() - held_since:.0f} s")
                progress("w9: snapshot released")
            for s in ev:
                events_cell(w, conn, cfg, s, phase, queues[("ev", s)])
            for s in jb:
                jobs_cell(w, conn, cfg, s, phase, queues[("jb", s)])
    finally:
        if holder is not None:
            holder.rollback()
            holder.close()
        for s in ev:
            w_events.drop(conn, s, queues[("ev", s)])
        if "pgque" in jb:
            w_jobs.drop_job_queue(conn, "w9_jobs")
    # dead tuples per table per phase, every table that had any
    rows = []
    for s in [f"{x} events" for x in ev] + [f"{x} jobs" for x in jb]:
        tables = set()
        for ph in ("before", "during", "after"):
            d = w.last(ph, s, "dead") or {}
            tables.update(d)
        for t in sorted(tables):
            rows.append([s, t] + [(w.last(ph, s, "dead") or {}).get(t, 0) for ph in ("before", "during", "after")])
    w.extra_tables.append(("dead tuples per table at the end of each phase (n_dead_tup)",
                           ["system", "table", "before", "during", "after"], rows))
