"""Event-queue workloads 1-5: pgque beside PgQ, the plain append-only table and
the SKIP LOCKED job table.

  w1  single-event send, one event per transaction, 2 pgbench clients
  w2  batch send, 100 and 1000 events per call (batch built server-side), 2 clients
  w3  drain a pre-ticked backlog, 1 consumer (and 2 where the model allows)
  w4  send->receive latency at a paced rate with the ticker running
  w5  partition slots: buffers per consumed event at N = 1, 16, 64

Every cell starts from a fresh queue (or a truncated table) and records: the rate,
WAL bytes per event (pg_current_wal_insert_lsn difference over the cell), and the
dead tuples of the system's tables at the end of the cell.
"""
import json
import multiprocessing as mp
import time

from . import db, pgbench
from .core import pct, progress, run_rounds

MP = mp.get_context("fork")

PGQUE_SEND = ["pgque.create_queue(text)", "pgque.send(text,jsonb)"]
PGQUE_BATCH = ["pgque.create_queue(text)", "pgque.send_batch(text,jsonb[])"]
PGQUE_CONSUME = ["pgque.create_queue(text)", "pgque.send_batch(text,jsonb[])", "pgque.subscribe(text,text)",
                 "pgque.receive(text,text,integer)", "pgque.ack(bigint)", "pgque.force_tick(text)"]
PGQUE_LATENCY = ["pgque.create_queue(text)", "pgque.send(text,jsonb)", "pgque.subscribe(text,text)",
                 "pgque.receive(text,text,integer)", "pgque.ack(bigint)"]


# ---- queue lifecycle per system -------------------------------------------------------
def create(conn, system, q):
    if system.startswith("pgque"):
        db.execute(conn, "SELECT pgque.create_queue(%s)", (q,))
    elif system == "pgq":
        db.execute(conn, "SELECT pgq.create_queue(%s)", (q,))
    elif system == "plain":
        db.truncate(conn, "bench.plain_events")
    elif system.startswith("skiplocked"):
        db.truncate(conn, "bench.sl_jobs")


def drop(conn, system, q):
    try:
        if system.startswith("pgque"):
            db.execute(conn, "SELECT pgque.drop_queue(%s, true)", (q,))
        elif system == "pgq":
            db.execute(conn, "SELECT pgq.drop_queue(%s, true)", (q,))
    except Exception as e:  # a failed drop must not stop the run; the name is per cell
        progress(f"warning: drop_queue({q}) on {system}: {str(e).splitlines()[0]}")
    if system.startswith("pgque") or system == "pgq":
        db.vacuum_schemas(conn, schemas(system))
    # The references' tables are emptied when their cell ends, as the queues'
    # tables are dropped: a cell must not leave its rows in shared_buffers for
    # the next system's cell to evict (plain's 20 s of sends are ~1.7 GB of
    # dirty buffers, and pgque's cell always came right after it).
    elif system == "plain":
        db.truncate(conn, "bench.plain_events")
    elif system.startswith("skiplocked"):
        db.truncate(conn, "bench.sl_jobs")


def schemas(system):
    return db.SYSTEM_SCHEMAS["pgque" if system.startswith("pgque") else
                             "skiplocked" if system.startswith("skiplocked") else system]


def dead_for(conn, system):
    """Dead tuples of the tables a system owns (the references share schema bench)."""
    tables = {"plain": {"bench.plain_events"}}.get(system)
    if system.startswith("skiplocked"):
        tables = {"bench.sl_jobs"}
    return db.dead_tuples(conn, schemas(system), tables)


def pgque_worker(conn, on):
    """Switch this database's pgque worker on/off (start()/stop() exist on main)."""
    if db.has_function(conn, "pgque.stop()"):
        db.execute(conn, "SELECT pgque.start()" if on else "SELECT pgque.stop()")


# ---- w1, w2: sends through pgbench ----------------------------------------------------
def send_script(system, batch):
    p = db.payload_sql("g")
    if batch == 1:
        p1 = db.payload_sql("1")
        return {
            "pgque": f"SELECT pgque.send(:q, {p1});\n",
            # the same payload as text (pgque.send(text, text)), as PgQ takes it
            "pgque_text": f"SELECT pgque.send(:q, ({p1})::text);\n",
            "pgq": f"SELECT pgq.insert_event(:q, 'default', ({p1})::text);\n",
            "plain": f"INSERT INTO bench.plain_events(payload) VALUES ({p1});\n",
        }[system]
    return {
        "pgque": f"SELECT cardinality(pgque.send_batch(:q, ARRAY(SELECT {p} FROM generate_series(1, {batch}) g)));\n",
        "pgq": f"SELECT count(pgq.insert_event(:q, 'default', ({p})::text)) FROM generate_series(1, {batch}) g;\n",
        "plain": f"INSERT INTO bench.plain_events(payload) SELECT {p} FROM generate_series(1, {batch}) g;\n",
    }[system]


def send_cell(res_w, conn, cfg, variant, system, rnd, batch, clients):
    q = f"{res_w.wid}_{system}_b{batch}_r{rnd}"
    create(conn, system, q)
    db.pgss_reset(conn)
    lsn = db.wal_lsn(conn)
    tx, tps, failed = pgbench.run(send_script(system, batch), clients, cfg.send_secs, {"q": q})
    wal = db.wal_diff(conn, lsn)
    if system.startswith("pgque"):
        res_w.profile(variant, system, rnd, db.pgss_top(conn))
    events = tx * batch
    dead = dead_for(conn, system)
    drop(conn, system, q)
    res_w.add(variant, system, rnd, {
        "rate": tps * batch, "wal_per": wal / events if events else None, "dead": dead,
        "events": events, "failed": failed})


def w1(res, cfg, conn):
    w = res.workload("w1", "Single-event send, one event per transaction, 2 clients",
                     [("rate", "events/s"), ("wal_per", "WAL B/event")],
                     about="pgbench -c 2 -j 2 -M prepared, one statement per transaction: "
                           "`pgque.send(q, payload jsonb)` / pgque_text: `pgque.send(q, payload::text)` / "
                           "`pgq.insert_event(q, 'default', payload::text)` / "
                           "`INSERT INTO bench.plain_events(payload) VALUES (...)`; payload ~200-byte JSON built server-side.")
    systems = ["pgque", "pgque_text", "pgq", "plain"]
    miss = db.missing_functions(conn, PGQUE_SEND + ["pgque.send(text,text)"])
    if miss:
        w.skip(f"pgque: function {', '.join(miss)} not installed")
        systems.remove("pgque")
        systems.remove("pgque_text")
    run_rounds(cfg.rounds, systems, lambda s, r: send_cell(w, conn, cfg, "batch=1", s, r, 1, 2))


def w2(res, cfg, conn):
    w = res.workload("w2", "Batch send, 100 and 1000 events per call, 2 clients",
                     [("rate", "events/s"), ("wal_per", "WAL B/event")],
                     about="pgbench -c 2, one call per transaction, batch built server-side with generate_series: "
                           "`pgque.send_batch(q, ARRAY(SELECT payload ...))` / `SELECT count(pgq.insert_event(...)) FROM generate_series` / "
                           "`INSERT INTO bench.plain_events(payload) SELECT ...` (the physical limit).")
    systems = ["pgque", "pgq", "plain"]
    miss = db.missing_functions(conn, PGQUE_BATCH)
    if miss:
        w.skip(f"pgque: function {', '.join(miss)} not installed")
        systems.remove("pgque")
    for batch in cfg.send_batches:
        run_rounds(cfg.rounds, systems, lambda s, r: send_cell(w, conn, cfg, f"batch={batch}", s, r, batch, 2))


# ---- w3: drain a backlog -----------------------------------------------------------------
def fill_backlog(conn, system, q, n, batch, consumers=("c1",)):
    """Untimed: n events in chunks of `batch`, each chunk cut into its own batch by a tick."""
    p = db.payload_sql("g")
    chunk_sql = f"ARRAY(SELECT {p} FROM generate_series(1, %s) g)"
    if system.startswith("pgque"):
        create(conn, system, q)
        for c in consumers:
            db.execute(conn, "SELECT pgque.subscribe(%s, %s)", (q, c))
        for left in range(n, 0, -batch):
            db.execute(conn, f"SELECT pgque.send_batch(%s, {chunk_sql})", (q, min(batch, left)))
            db.execute(conn, "SELECT pgque.force_tick(%s)", (q,))  # ticks now (PgQ's only bumps the sequence)
    elif system == "pgq":
        create(conn, system, q)
        db.execute(conn, "SELECT pgq.register_consumer(%s, %s)", (q, "c1"))
        for left in range(n, 0, -batch):
            db.execute(conn, f"SELECT count(pgq.insert_event(%s, 'default', ({p})::text)) FROM generate_series(1, %s) g",
                       (q, min(batch, left)))
            db.execute(conn, "SELECT pgq.force_tick(%s)", (q,))
            db.execute(conn, "SELECT pgq.ticker(%s)", (q,))
    elif system == "plain":
        create(conn, system, q)
        db.execute(conn, f"INSERT INTO bench.plain_events(payload) SELECT {p} FROM generate_series(1, %s) g", (n,))
        db.execute(conn, "VACUUM ANALYZE bench.plain_events")
    elif system.startswith("skiplocked"):
        create(conn, system, q)
        db.execute(conn, f"INSERT INTO bench.sl_jobs(queue, kind, args) SELECT %s, 'event', {p} FROM generate_series(1, %s) g",
                   (q, n))
        db.execute(conn, "VACUUM ANALYZE bench.sl_jobs")


def _drain_proc(system, q, consumer, n, batch, barrier, out):
    """One consumer process: drains until n events are seen in total (or nothing is left)."""
    conn = db.connect()
    cur = conn.cursor()
    barrier.wait()
    t0 = time.perf_counter()
    consumed = batches = empties = 0
    while consumed < n and empties < 3:
        with conn.transaction():
            if system == "pgque":
                rows = cur.execute("SELECT msg_id, batch_id, payload FROM pgque.receive(%s, %s, %s)",
                                   (q, consumer, batch), prepare=True).fetchall()
                if rows:
                    cur.execute("SELECT pgque.ack(%s)", (rows[0][1],), prepare=True)
            elif system == "pgque_coop":
                rows = cur.execute("SELECT msg_id, batch_id, payload FROM pgque.receive_coop(%s, %s, %s, %s)",
                                   (q, "c1", consumer, batch), prepare=True).fetchall()
                if rows:
                    cur.execute("SELECT pgque.ack(%s)", (rows[0][1],), prepare=True)
            elif system == "pgq":
                bid = cur.execute("SELECT pgq.next_batch(%s, %s)", (q, consumer), prepare=True).fetchone()[0]
                rows = []
                if bid is not None:
                    rows = cur.execute("SELECT ev_id, ev_data FROM pgq.get_batch_events(%s)", (bid,), prepare=True).fetchall()
                    cur.execute("SELECT pgq.finish_batch(%s)", (bid,), prepare=True)
                    batches += 1
                    if not rows:
                        continue
            elif system == "plain":
                rows = cur.execute("SELECT id, payload::text FROM bench.plain_events WHERE id > %s ORDER BY id LIMIT %s",
                                   (out.get("last", 0) if isinstance(out, dict) else 0, batch), prepare=True).fetchall()
            else:  # skiplocked: claim (commit), then delete (commit), as a job runner does
                rows = cur.execute(
                    "UPDATE bench.sl_jobs SET state = 'running', locked_by = %s, locked_at = now(), attempt = attempt + 1 "
                    "WHERE id IN (SELECT id FROM bench.sl_jobs WHERE queue = %s AND state = 'ready' AND run_at <= now() "
                    "ORDER BY priority, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, args::text",
                    (consumer, q, batch), prepare=True).fetchall()
        if system.startswith("skiplocked") and rows:
            with conn.transaction():
                cur.execute("DELETE FROM bench.sl_jobs WHERE id = ANY(%s)", ([r[0] for r in rows],), prepare=True)
        if not rows:
            empties += 1
            if system.startswith("skiplocked") or system == "plain" or system == "pgq":
                break
            continue
        if system == "plain":
            out["last"] = rows[-1][0]
        empties = 0
        consumed += len(rows)
        if system != "pgq":
            batches += 1
    t1 = time.perf_counter()
    conn.close()
    return consumed, batches, t0, t1


def _drain_child(args, barrier, queue):
    system, q, consumer, n, batch = args
    try:
        queue.put(_drain_proc(system, q, consumer, n, batch, barrier, {}))
    except Exception as e:  # report, do not hang the parent
        barrier.abort()
        queue.put(e)


def drain_cell(w, conn, cfg, system, rnd, batch, nconsumers):
    q = f"w3_{system}_b{batch}_r{rnd}"
    n = cfg.backlog
    subs = [f"s{i}" for i in range(nconsumers)]
    fill_backlog(conn, system, q, n, batch)
    if system == "pgque_coop":
        # c1 was subscribed before the sends (its position is before them);
        # its members join it, converting it to a cooperative consumer
        for sub in subs:
            db.execute(conn, "SELECT pgque.subscribe_subconsumer(%s, 'c1', %s, true)", (q, sub))
    db.pgss_reset(conn)
    lsn = db.wal_lsn(conn)
    barrier = MP.Barrier(nconsumers, timeout=300)
    outq = MP.Queue()
    procs = []
    for i in range(nconsumers):
        consumer = subs[i] if system in ("pgque_coop",) or system.startswith("skiplocked") else "c1"
        p = MP.Process(target=_drain_child, args=((system, q, consumer, n, batch), barrier, outq))
        p.start()
        procs.append(p)
    results = [outq.get() for _ in procs]
    for p in procs:
        p.join()
    errs = [r for r in results if isinstance(r, Exception)]
    if errs:
        raise errs[0]
    wal = db.wal_diff(conn, lsn)
    consumed = sum(r[0] for r in results)
    batches = sum(r[1] for r in results)
    secs = max(r[3] for r in results) - min(r[2] for r in results)
    dead = dead_for(conn, system)
    drop(conn, system, q)
    label = {"pgque": "pgque", "pgque_coop": f"pgque coop x{nconsumers}", "pgq": "pgq", "plain": "plain keyset",
             "skiplocked": f"skiplocked x{nconsumers}"}[system]
    if system.startswith("pgque") or system == "pgq":
        w.profile(f"batch={batch}", label, rnd, db.pgss_top(conn))
    w.add(f"batch={batch}", label, rnd, {
        "rate": consumed / secs if secs > 0 else None, "wal_per": wal / consumed if consumed else None,
        "per_batch": consumed / batches if batches else None, "consumed": consumed, "dead": dead})
    if consumed < n:
        w.note(f"{label} batch={batch} round {rnd}: consumed {consumed} of {n} events (stopped on empty reads)")


def w3(res, cfg, conn):
    w = res.workload("w3", f"Drain a backlog of {cfg.backlog:,} events",
                     [("rate", "events/s"), ("wal_per", "WAL B/event"), ("per_batch", "events/batch")],
                     about="Backlog filled untimed, cut into batches of the given size by one tick per chunk "
                           "(pgque.force_tick(q), which ticks at once; pgq.force_tick(q) + pgq.ticker(q)); the pgque worker is "
                           "stopped during this workload so it cuts no other batches. Consumers: pgque receive(q, c, B)+ack "
                           "in one transaction per batch; PgQ next_batch + get_batch_events + finish_batch; plain keyset "
                           "`WHERE id > last ORDER BY id LIMIT B`; SKIP LOCKED claim (commit) then DELETE (commit). "
                           "`events/batch` is what the consumer actually saw.")
    miss = db.missing_functions(conn, PGQUE_CONSUME)
    has_pgque = not miss
    if miss:
        w.skip(f"pgque: function {', '.join(miss)} not installed")
    coop_miss = db.missing_functions(conn, ["pgque.subscribe_subconsumer(text,text,text,boolean)"])
    has_coop = has_pgque and not coop_miss and db.scalar(
        conn, "SELECT count(*) FROM pg_proc WHERE proname = 'receive_coop' AND pronamespace = 'pgque'::regnamespace") > 0
    if has_pgque and not has_coop:
        w.skip("pgque cooperative consumers x2: function pgque.receive_coop / pgque.subscribe_subconsumer(text,text,text,boolean) not installed")
    if has_pgque:
        pgque_worker(conn, False)
    try:
        for batch in cfg.drain_batches:
            cells = ([("pgque", 1)] if has_pgque else []) + ([("pgque_coop", 2)] if has_coop else []) + \
                    [("pgq", 1), ("plain", 1), ("skiplocked", 1), ("skiplocked", 2)]
            run_rounds(cfg.rounds, cells, lambda sc, r: drain_cell(w, conn, cfg, sc[0], r, batch, sc[1]))
    finally:
        if has_pgque:
            pgque_worker(conn, True)
    w.note("PgQ has no cooperative consumers in this install (pgq_coop is not packaged), so it drains with one consumer only.")


# ---- w4: latency ---------------------------------------------------------------------------
def _payload(i):
    return json.dumps({"id": i, "ts": time.time(), "kind": "order.created", "customer": "cust-000042",
                       "amount": 129.95, "currency": "EUR", "items": 3, "note": "x" * 64})


def _producer(system, q, rate, secs, barrier, outq):
    conn = db.connect()
    cur = conn.cursor()
    barrier.wait()
    t0 = time.time()
    i = 0
    try:
        while True:
            now = time.time()
            if now - t0 >= secs:
                break
            due = int((now - t0) * rate) + 1
            while i < due:
                i += 1
                if system == "pgque":
                    cur.execute("SELECT pgque.send(%s, %s::jsonb)", (q, _payload(i)), prepare=True)
                elif system == "pgq":
                    cur.execute("SELECT pgq.insert_event(%s, 'default', %s)", (q, _payload(i)), prepare=True)
                else:
                    cur.execute("INSERT INTO bench.sl_jobs(queue, kind, args) VALUES (%s, 'event', %s::jsonb)",
                                (q, _payload(i)), prepare=True)
            nxt = t0 + (i / rate)
            d = nxt - time.time()
            if d > 0:
                time.sleep(d)
        outq.put(("sent", i, time.time() - t0))
    except Exception as e:
        outq.put(("error", repr(e), 0))
    conn.close()


def _consumer(system, q, stop_at, barrier, outq, poll):
    conn = db.connect()
    cur = conn.cursor()
    if system == "pgque":
        cur.execute(f'LISTEN "pgque_{q}"')
    lats = []
    barrier.wait()
    try:
        while time.time() < stop_at:
            rows = []
            with conn.transaction():
                if system == "pgque":
                    rows = cur.execute("SELECT payload, batch_id FROM pgque.receive(%s, 'c1', 1000)", (q,), prepare=True).fetchall()
                    if rows:
                        cur.execute("SELECT pgque.ack(%s)", (rows[0][1],), prepare=True)
                elif system == "pgq":
                    bid = cur.execute("SELECT pgq.next_batch(%s, 'c1')", (q,), prepare=True).fetchone()[0]
                    if bid is not None:
                        rows = cur.execute("SELECT ev_data FROM pgq.get_batch_events(%s)", (bid,), prepare=True).fetchall()
                        cur.execute("SELECT pgq.finish_batch(%s)", (bid,), prepare=True)
                else:
                    rows = cur.execute(
                        "UPDATE bench.sl_jobs SET state = 'running', locked_by = 'c1', locked_at = now() "
                        "WHERE id IN (SELECT id FROM bench.sl_jobs WHERE queue = %s AND state = 'ready' AND run_at <= now() "
                        "ORDER BY priority, run_at, id LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING args, id",
                        (q,), prepare=True).fetchall()
            now = time.time()
            if rows:
                for r in rows:
                    p = r[0] if isinstance(r[0], dict) else json.loads(r[0])
                    lats.append((now - p["ts"]) * 1000.0)
                if system == "skiplocked":
                    with conn.transaction():
                        cur.execute("DELETE FROM bench.sl_jobs WHERE id = ANY(%s)", ([r[1] for r in rows],), prepare=True)
                continue
            if system == "pgque":
                for _ in conn.notifies(timeout=poll, stop_after=1):
                    pass
            else:
                time.sleep(poll)
        outq.put(("lats", lats, 0))
    except Exception as e:
        outq.put(("error", repr(e), 0))
    conn.close()


def _pgq_ticker(period, stop_at, barrier):
    """What pgqd does: call pgq.ticker() every `period` seconds."""
    conn = db.connect()
    barrier.wait()
    while time.time() < stop_at:
        conn.execute("SELECT pgq.ticker()")
        time.sleep(period)
    conn.close()


def latency_cell(w, conn, cfg, system, rnd, rate):
    q = f"w4_{system}_{rate}_r{rnd}"
    create(conn, system, q)
    if system == "pgque":
        db.execute(conn, "SELECT pgque.subscribe(%s, 'c1')", (q,))
    elif system == "pgq":
        db.execute(conn, "SELECT pgq.register_consumer(%s, 'c1')", (q,))
        db.execute(conn, "SELECT pgq.set_queue_config(%s, 'ticker_max_lag', %s)", (q, f"{cfg.pgq_tick_ms} ms"))
    lsn = db.wal_lsn(conn)
    secs = cfg.lat_secs
    nproc = 3 if system == "pgq" else 2
    barrier = MP.Barrier(nproc, timeout=300)
    outq = MP.Queue()
    stop_at = time.time() + secs + 2.0 + 1.0  # start skew + drain time after the producer stops
    procs = [MP.Process(target=_producer, args=(system, q, rate, secs, barrier, outq)),
             MP.Process(target=_consumer, args=(system, q, stop_at, barrier, outq, cfg.poll_ms / 1000.0))]
    if system == "pgq":
        procs.append(MP.Process(target=_pgq_ticker, args=(cfg.pgq_tick_ms / 1000.0, stop_at, barrier)))
    for p in procs:
        p.start()
    got = {}
    for _ in range(2):
        kind, val, extra = outq.get()
        if kind == "error":
            for p in procs:
                p.kill()
            raise RuntimeError(f"w4 {system}: {val}")
        got[kind] = (val, extra)
    for p in procs:
        p.join()
    wal = db.wal_diff(conn, lsn)
    sent, sent_secs = got["sent"]
    lats = got["lats"][0]
    dead = dead_for(conn, system)
    drop(conn, system, q)
    label = {"pgque": "pgque (worker)", "pgq": f"pgq (ticker {cfg.pgq_tick_ms} ms)",
             "skiplocked": f"skiplocked (poll {cfg.poll_ms} ms)"}[system]
    w.add(f"rate={rate}/s", label, rnd, {
        "p50": pct(lats, 50), "p99": pct(lats, 99), "max": max(lats) if lats else None,
        "sent_rate": sent / sent_secs if sent_secs else None, "received": len(lats), "sent": sent,
        "wal_per": wal / sent if sent else None, "dead": dead})
    if len(lats) < sent:
        w.note(f"{label} rate={rate} round {rnd}: received {len(lats)} of {sent} sent events within the cell")


def w4(res, cfg, conn):
    w = res.workload("w4", "Send->receive latency at a paced rate",
                     [("p50", "p50 ms"), ("p99", "p99 ms"), ("max", "max ms"), ("sent_rate", "sent/s"),
                      ("wal_per", "WAL B/event")],
                     higher_is_better=False,
                     about=f"One producer process sending one event per transaction at a paced rate (payload carries "
                           f"the send time), one consumer process computing latency when the event reaches it. "
                           f"pgque: the background worker ticks at its default settings; the consumer LISTENs on "
                           f"`pgque_<queue>` and calls receive+ack (waiting at most {cfg.poll_ms} ms for a notification "
                           f"between empty receives). PgQ: a process calls pgq.ticker() every {cfg.pgq_tick_ms} ms as pgqd "
                           f"would, queue ticker_max_lag {cfg.pgq_tick_ms} ms, consumer polls next_batch every "
                           f"{cfg.poll_ms} ms. SKIP LOCKED: claim+delete, polling every {cfg.poll_ms} ms when empty.")
    systems = ["pgque", "pgq", "skiplocked"]
    miss = db.missing_functions(conn, PGQUE_LATENCY)
    if miss:
        w.skip(f"pgque: function {', '.join(miss)} not installed")
        systems.remove("pgque")
    for rate in cfg.lat_rates:
        run_rounds(cfg.rounds, systems, lambda s, r: latency_cell(w, conn, cfg, s, r, rate))
    if "pgque" in systems and cfg.idle_secs > 0:
        for rnd in range(1, cfg.rounds + 1):
            idle_first_send_cell(w, conn, cfg, rnd)


def _idle_consumer(q, ready, outq, timeout):
    """Waits on the queue's channel as w4's consumer does; returns the
    send -> receive latency of the first event that arrives."""
    conn = db.connect()
    cur = conn.cursor()
    cur.execute(f'LISTEN "pgque_{q}"')
    ready.set()
    t_end = time.time() + timeout
    try:
        while time.time() < t_end:
            with conn.transaction():
                rows = cur.execute("SELECT payload, batch_id FROM pgque.receive(%s, 'c1', 1000)", (q,)).fetchall()
                if rows:
                    cur.execute("SELECT pgque.ack(%s)", (rows[0][1],))
            if rows:
                p = rows[0][0] if isinstance(rows[0][0], dict) else json.loads(rows[0][0])
                outq.put(("lat", (time.time() - p["ts"]) * 1000.0, 0))
                break
            for _ in conn.notifies(timeout=0.5, stop_after=1):
                pass
        else:
            outq.put(("error", "no event within the timeout", 0))
    except Exception as e:
        outq.put(("error", repr(e), 0))
    conn.close()


def idle_first_send_cell(w, conn, cfg, rnd):
    """The first send after cfg.idle_secs without any: the worker has gone
    idle (pgque.idle_after) and the consumer sits in LISTEN; one event is
    sent and its send -> receive latency measured (pgque only)."""
    q = f"w4_idle_r{rnd}"
    create(conn, "pgque", q)
    db.execute(conn, "SELECT pgque.subscribe(%s, 'c1')", (q,))
    ready, outq = MP.Event(), MP.Queue()
    p = MP.Process(target=_idle_consumer, args=(q, ready, outq, cfg.idle_secs + 30))
    p.start()
    ready.wait(60)
    time.sleep(cfg.idle_secs)
    db.execute(conn, "SELECT pgque.send(%s, %s::jsonb)", (q, _payload(1)))
    kind, val, _ = outq.get(timeout=cfg.idle_secs + 60)
    p.join()
    drop(conn, "pgque", q)
    if kind == "error":
        raise RuntimeError(f"w4 idle first send: {val}")
    w.add(f"first send after {cfg.idle_secs} s idle", "pgque (worker)", rnd,
          {"p50": val, "p99": None, "max": val, "sent_rate": None, "wal_per": None})


# ---- w5: partition slots ---------------------------------------------------------------------
PGQUE_SLOTS = ["pgque.subscribe_partitioned(text,text,integer)", "pgque.claim_slot(text,text,integer,text,interval)",
               "pgque.receive_partitioned(text,text,integer,integer,text,integer)",
               "pgque.ack_partitioned(text,text,integer,integer,text)", "pgque.send(text,text,jsonb,text)"]


def _w5_cell(w, conn, cfg, mode, system, n, rnd):
    """One w5 cell. mode "drain": a keyed backlog (ticked every `chunk` events, as a
    live ticker would cut it) is sent first, then every slot is drained in turn.
    mode "live": each chunk is sent and ticked, then every slot takes its batch of
    that tick (receive + ack, and one more receive that finds nothing), as workers
    that keep up do. system "pgque": as installed; "stream_scan": the slot indexes
    are dropped right after subscribing, so every slot filters the whole stream
    (what PgQue does): a reference measured in the same run.

    Buffers: shared_blks_hit + shared_blks_read of the top-level
    receive_partitioned / ack_partitioned statements (pg_stat_statements: a
    top-level statement's counters include its nested ones) over events consumed."""
    q = f"w5_{mode}_{system}_n{n}_r{rnd}"
    events, chunk, batch, keys = cfg.w5_events, 1000, 500, 2000
    # Housekeeping between cells (never inside one): the earlier cells' dropped
    # queues left dead metadata rows and the worker is stopped, so vacuum and
    # refresh statistics first, or plans drift from cell to cell.
    db.execute(conn, "VACUUM ANALYZE")
    db.execute(conn, "SELECT pgque.create_queue(%s)", (q,))
    db.execute(conn, "SELECT pgque.subscribe_partitioned(%s, 'c', %s)", (q, n))
    for k in range(n):
        db.execute(conn, "SELECT pgque.claim_slot(%s, 'c', %s, 'w', '10 minutes')", (q, k))
    if system == "stream_scan":
        qid = db.scalar(conn, "SELECT queue_id FROM pgque.queue WHERE queue_name = %s", (q,))
        ntables = db.scalar(conn, "SELECT queue_ntables FROM pgque.queue WHERE queue_name = %s", (q,))
        for t in range(ntables):
            db.execute(conn, f"DROP INDEX pgque.event_{int(qid)}_{t}_slot{int(n)}_idx")
    p = db.payload_sql("g")

    def send_chunk(start):
        db.execute(conn, f"SELECT cardinality(pgque.send_batch(%s, 'ev', ARRAY(SELECT {p} FROM generate_series(%s::int, %s::int) g), "
                         f"ARRAY(SELECT 'tenant-' || (g %% {keys}) FROM generate_series(%s::int, %s::int) g)))",
                   (q, start, start + chunk - 1, start, start + chunk - 1))
        db.execute(conn, "SELECT pgque.force_tick(%s)", (q,))

    calls = 0

    def one_pass(cur):
        nonlocal calls
        got_pass = 0
        for k in range(n):
            cur.execute("SELECT count(*) FROM pgque.receive_partitioned(%s, 'c', %s, %s, 'w', %s)",
                        (q, k, n, batch), prepare=True)
            got = cur.fetchone()[0]
            calls += 1
            if got:
                got_pass += got
                cur.execute("SELECT pgque.ack_partitioned(%s, 'c', %s, %s, 'w')", (q, k, n), prepare=True)
        return got_pass

    consumed = 0
    if mode == "drain":
        for start in range(0, events, chunk):
            send_chunk(start)
        db.execute(conn, "VACUUM ANALYZE")
    db.pgss_reset(conn)
    t0 = time.time()
    with conn.cursor() as cur:
        if mode == "drain":
            # An empty receive may just have passed a tick range without events
            # of that slot: go round until everything is consumed; many passes
            # in a row finding nothing would be a bug (reported below).
            empty_passes = 0
            while consumed < events and empty_passes < 100:
                got = one_pass(cur)
                consumed += got
                empty_passes = 0 if got else empty_passes + 1
        else:
            for start in range(0, events, chunk):
                send_chunk(start)
                while True:
                    got = one_pass(cur)
                    consumed += got
                    if not got:
                        break
    secs = time.time() - t0
    with conn.cursor() as cur:
        cur.execute("SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0), coalesce(sum(shared_blks_read), 0) "
                    "FROM pg_stat_statements WHERE toplevel AND dbid = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database()) AND (query LIKE '%%receive_partitioned%%' "
                    "OR query LIKE '%%ack_partitioned%%')")
        blks, reads = cur.fetchone()
    variant = f"{mode} N={n}"
    w.profile(variant, system, rnd, db.pgss_top(conn))
    db.execute(conn, "SELECT pgque.drop_queue(%s, true)", (q,))
    if consumed != events:
        raise RuntimeError(f"w5 {variant}: consumed {consumed} of {events} events")
    w.add(variant, system, rnd, {
        "buf_per": int(blks) / consumed, "read_per": int(reads) / consumed,
        # the live cells' time includes the sends: no consume rate there
        "rate": consumed / secs if mode == "drain" else None,
        "per_batch": consumed / max(1, calls), "events": consumed})


def w5(res, cfg, conn):
    w = res.workload("w5", "Partition slots: buffers per consumed event at N = 1, 16, 64 (drained backlog; live, tick by tick)",
                     [("buf_per", "buffers/event"), ("rate", "events/s"), ("read_per", "reads/event"),
                      ("per_batch", "events/receive")],
                     higher_is_better=False,
                     about=f"{cfg.w5_events:,} events keyed 'tenant-<i mod 2000>' (the harness payload), sent "
                           "1000 per send_batch with one force_tick after each (a tick per 1000 events), the pgque worker "
                           "stopped; one process holds every slot's lease and consumes with "
                           "receive_partitioned(q, c, slot, N, w, 500) + ack_partitioned. `drain`: the whole backlog is "
                           "sent first, then the slots are drained round-robin (a slot batch spans up to 500 x N stream "
                           "events, so few batches). `live`: after each chunk and tick every slot takes that tick's "
                           "batch (and one empty receive), as keeping-up workers do: one batch per slot per tick, so "
                           "the fixed per-batch cost is paid N times per tick. buffers/event = shared_blks_hit + shared_blks_read of the top-level "
                           "receive_partitioned and ack_partitioned statements (pg_stat_statements; nested "
                           "statements are included in their top-level caller's counters) divided by the events "
                           "consumed. A slot reads through the per-N slot index, so this should grow far less than N. "
                           "PgQue's published figure (every slot scans the stream; steady state at 5k ev/s, batch 500, "
                           "16 dedicated cores): 4.39 buffers/event at N=16, 7.02 at N=32. Reference `stream_scan`: the "
                           "same cells with the slot indexes dropped before consuming (each slot then reads the "
                           "stream through the txid index and filters it, as PgQue's slots do).")
    miss = db.missing_functions(conn, PGQUE_SLOTS)
    if miss:
        w.skip(f"function {', '.join(miss)} not installed (issue 4 not built yet)")
        return
    pgque_worker(conn, False)
    try:
        for mode in ("drain", "live"):
            for n in (1, 16, 64):
                run_rounds(cfg.rounds, ["pgque", "stream_scan"],
                           lambda s, r: _w5_cell(w, conn, cfg, mode, s, n, r))
    finally:
        pgque_worker(conn, True)
    for mode in ("drain", "live"):
        base = w.med(f"{mode} N=1", "pgque", "buf_per")
        if not base:
            continue
        for n in (16, 64):
            m = w.med(f"{mode} N={n}", "pgque", "buf_per")
            sc = w.med(f"{mode} N={n}", "stream_scan", "buf_per")
            if m:
                w.note(f"{mode} N={n}: {m:.2f} buffers/event, {m / base:.2f}x those of N=1 (linear growth would be {n}x)"
                       + (f"; without the slot index {sc:.2f} ({sc / m:.1f}x more)." if sc else "."))
