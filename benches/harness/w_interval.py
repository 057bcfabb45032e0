"""Workload w10: drain N events that sit in ONE tick interval (issue 25).

A ticker outage, manual mode ticking rarely, or one producer transaction
sending a large batch leaves many events between two ticks. pgque cuts such
an interval into batches of `max_return`; this workload measures that drain
against the same N spread over many ticks (the ordinary case, one tick per
500 events) and against PgQ reading the same single interval the way PgQ
does it (next_batch, then get_batch_cursor + FETCH in steps of 500, one
transaction for the whole interval; finish_batch).

  pgque (one interval)        receive(q, c, 500) + ack per transaction
  ref: pgque many ticks       the same consumer loop over N events ticked every 500
  pgq (one interval, cursor)  next_batch + get_batch_cursor(b, cur, 500) + FETCH 500 + finish_batch
  pgq many ticks              next_batch + get_batch_events + finish_batch, ticked every 500

The target: the one-interval drain takes at most 1.5x the many-ticks drain
(rate ratio >= 0.67), at N = 100k and 1M.
"""
import os
import time

from . import db
from .core import progress, run_rounds
from .w_events import create, dead_for, drop, fill_backlog, _drain_proc

# W10_BATCH: the consumer's max_return and the many-ticks reference's tick
# size (default 500); W10_PGQ=0 leaves PgQ's two systems out.
BATCH = int(os.environ.get("W10_BATCH", "500"))
CHUNK = 10_000  # events per producer transaction while filling one interval


class _NoBarrier:
    def wait(self):
        pass


def fill_one_interval(conn, system, q, n):
    """Untimed: n events in transactions of CHUNK, then one tick: one interval."""
    p = db.payload_sql("g")
    create(conn, system, q)
    if system == "pgque":
        db.execute(conn, "SELECT pgque.subscribe(%s, %s)", (q, "c1"))
        for left in range(n, 0, -CHUNK):
            db.execute(conn, f"SELECT pgque.send_batch(%s, ARRAY(SELECT {p} FROM generate_series(1, %s) g))",
                       (q, min(CHUNK, left)))
        db.execute(conn, "SELECT pgque.force_tick(%s)", (q,))
    else:
        db.execute(conn, "SELECT pgq.register_consumer(%s, %s)", (q, "c1"))
        for left in range(n, 0, -CHUNK):
            db.execute(conn, f"SELECT count(pgq.insert_event(%s, 'default', ({p})::text)) FROM generate_series(1, %s) g",
                       (q, min(CHUNK, left)))
        db.execute(conn, "SELECT pgq.force_tick(%s)", (q,))
        db.execute(conn, "SELECT pgq.ticker(%s)", (q,))


def _pgq_cursor_drain(q, n):
    """PgQ's way through one big batch: a cursor over the batch, fetched in steps."""
    conn = db.connect()
    cur = conn.cursor()
    t0 = time.perf_counter()
    consumed = batches = 0
    while consumed < n:
        with conn.transaction():
            bid = cur.execute("SELECT pgq.next_batch(%s, %s)", (q, "c1"), prepare=True).fetchone()[0]
            if bid is None:
                break
            batches += 1
            rows = cur.execute("SELECT ev_id, ev_data FROM pgq.get_batch_cursor(%s, 'w10cur', %s)",
                               (bid, BATCH), prepare=True).fetchall()
            consumed += len(rows)
            # get_batch_cursor leaves its cursor open (until the transaction ends)
            while len(rows) >= BATCH:
                rows = cur.execute(f"FETCH {BATCH} FROM w10cur").fetchall()
                consumed += len(rows)
            cur.execute("CLOSE w10cur")
            cur.execute("SELECT pgq.finish_batch(%s)", (bid,), prepare=True)
    t1 = time.perf_counter()
    conn.close()
    return consumed, batches, t0, t1


def interval_cell(w, conn, cfg, system, rnd, n):
    q = f"w10_{system.split()[0].replace(':', '')}_{len(system)}_{n}_r{rnd}"
    kind = "pgque" if "pgque" in system else "pgq"
    if "many ticks" in system:
        fill_backlog(conn, kind, q, n, BATCH)
    else:
        fill_one_interval(conn, kind, q, n)
    db.pgss_reset(conn)
    lsn = db.wal_lsn(conn)
    if system == "pgq (one interval, cursor)":
        consumed, batches, t0, t1 = _pgq_cursor_drain(q, n)
    else:
        consumed, batches, t0, t1 = _drain_proc(kind, q, "c1", n, BATCH, _NoBarrier(), {})
    secs = t1 - t0
    wal = db.wal_diff(conn, lsn)
    dead = dead_for(conn, kind)
    if kind == "pgque":
        w.profile(f"N={n:,}", system, rnd, db.pgss_top(conn))
    drop(conn, kind, q)
    w.add(f"N={n:,}", system, rnd, {
        "rate": consumed / secs if secs > 0 else None, "secs": secs,
        "per_batch": consumed / batches if batches else None, "consumed": consumed,
        "wal_per": wal / consumed if consumed else None, "dead": dead})
    if consumed < n:
        w.note(f"{system} N={n:,} round {rnd}: consumed {consumed} of {n} events")


def w10(res, cfg, conn):
    w = res.workload("w10", f"Drain N events that sit in one tick interval, batch {BATCH}",
                     [("rate", "events/s"), ("secs", "drain s"), ("per_batch", "events/batch"),
                      ("wal_per", "WAL B/event")],
                     about="Filled untimed. One interval: the events sent in transactions of 10,000 and ticked once "
                           f"(pgque.force_tick; pgq.force_tick + pgq.ticker). Many ticks: one tick per {BATCH} events, as w3. "
                           f"pgque drains with receive(q, c, {BATCH}) + ack per transaction (the worker stopped); PgQ's "
                           "one-interval drain is next_batch + get_batch_cursor(b, cur, 500) + FETCH 500 until empty + "
                           "finish_batch in one transaction; PgQ many ticks is next_batch + get_batch_events + finish_batch. "
                           "Target: pgque (one interval) / ref: pgque many ticks >= 0.67 in rate (at most 1.5x the time).")
    miss = db.missing_functions(conn, ["pgque.create_queue(text)", "pgque.send_batch(text,jsonb[])",
                                       "pgque.subscribe(text,text)", "pgque.receive(text,text,integer)",
                                       "pgque.ack(bigint)", "pgque.force_tick(text)"])
    systems = ["pgque (one interval)", "ref: pgque many ticks"] if not miss else []
    if miss:
        w.skip(f"pgque: function {', '.join(miss)} not installed")
    if os.environ.get("W10_PGQ", "1") != "0":
        systems += ["pgq (one interval, cursor)", "pgq many ticks"]
    if not miss:
        db.execute(conn, "SELECT pgque.stop()")
    try:
        for n in cfg.w10_sizes:
            progress(f"w10 N={n:,}")
            run_rounds(cfg.rounds, systems, lambda s, r: interval_cell(w, conn, cfg, s, r, n))
    finally:
        if not miss:
            db.execute(conn, "SELECT pgque.start()")
