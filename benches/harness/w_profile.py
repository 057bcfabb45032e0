"""Workload w11: the seed's headline profile (PgQue's "432M events/day" run) on this machine.

PgQue's published run: 5,000 events/s of ~200-byte JSON, partition keys drawn
zipfian over 2,000 tenants, a partitioned consumer with N = 16 (and 64) slots
consumed by M = 4 workers looping claim_next_slot -> receive -> ack -> release,
and one worker stalled past its lease in the middle of the run. Here:

  producer   one process; every 10 ms it sends the events due by then in one
             keyed send_batch (keys aligned with payloads); each payload carries
             its tenant, the tenant's sequence number and the send time;
  workers    M processes, each: claim_next_slot(q, c, w, ttl) -> receive_partitioned
             (max 500) -> ack_partitioned -> release_slot; after a sweep's worth of
             empty receives a worker waits for the queue's tick NOTIFY (at most
             20 ms) instead of spinning;
  stall      worker 0, a third into the run, receives a batch and then sleeps
             1.5 x ttl without acking; its next call is refused (55000, the lease
             was taken over) and it goes on. The takeover time is from the stall's
             start to the first ack of that slot by another worker;
  effects    each batch's processed events (tenant, sequence, send time) are
             written to bench_pk_effects in the ack's transaction, one row per
             batch, and each non-empty receive to bench_pk_recv: what the checks
             read, so a worker killed at any point (w12 / w13, benches/harness/
             chaos.py) loses nothing of the record, and an effect committed twice
             shows (both tables are unlogged; their two inserts per batch are
             part of every cell's CPU and buffers);
  checks     every event sent is acked exactly once, and each tenant's acked
             sequence (ordered by batch id, then position in the batch) is exactly
             1, 2, 3, ... : none lost, none twice, per-key order kept;
  figures    sustained rate (acked events / s over the cell), lag = ack time - send
             time per event (all slots; per slot p50 / p99; the stalled slot apart),
             the server's CPU per event (utime + stime of every process of the
             cluster: backends, the pgque worker, autovacuum, from /proc), buffers
             per event (pg_stat_database blks_hit + blks_read of the bench database).

Then the highest rate this sustains: N = 16, no stall, short cells at rising
rates until acked lag p99 reaches 1 s or the producer falls behind its rate.
"""
import bisect
import json
import multiprocessing as mp
import os
import random
import threading
import time

import psycopg

from . import chaos, db
from .core import fmt, median, pct, progress

MP = mp.get_context("fork")

FUNCS = ["pgque.subscribe_partitioned(text,text,integer)", "pgque.claim_next_slot(text,text,text,interval)",
         "pgque.receive_partitioned(text,text,integer,integer,text,integer)",
         "pgque.ack_partitioned(text,text,integer,integer,text)", "pgque.release_slot(text,text,integer,text)",
         "pgque.send_batch(text,text,jsonb[],text[])"]
TENANTS = 2000
BATCH = 500
TICK_S = 0.010  # the producer's pacing step


def zipf_cdf(n, s):
    w = [1.0 / (i ** s) for i in range(1, n + 1)]
    tot = sum(w)
    acc, out = 0.0, []
    for x in w:
        acc += x / tot
        out.append(acc)
    return out


def _payload(tenant, seq):
    # ~200 bytes as JSON text, like the seed's events
    return json.dumps({"tenant": tenant, "seq": seq, "ts": time.time(), "kind": "order.created",
                       "customer": "cust-000042", "amount": 129.95, "currency": "EUR", "items": 3,
                       "note": "x" * 40})


def _producer(q, rate, secs, zipf_s, seed, barrier, outq):
    rnd = random.Random(seed)
    cdf = zipf_cdf(TENANTS, zipf_s)
    seqs = [0] * TENANTS
    conn = db.connect()
    cur = conn.cursor()
    barrier.wait()
    t0 = time.time()
    sent = 0
    try:
        while True:
            now = time.time()
            if now - t0 >= secs:
                break
            due = int((now - t0) * rate) - sent
            if due > 0:
                payloads, keys = [], []
                for _ in range(due):
                    t = min(bisect.bisect_left(cdf, rnd.random()), TENANTS - 1)
                    seqs[t] += 1
                    key = f"tenant-{t}"
                    payloads.append(_payload(key, seqs[t]))
                    keys.append(key)
                cur.execute("SELECT cardinality(pgque.send_batch(%s, 'ev', %s::jsonb[], %s::text[]))",
                            (q, payloads, keys), prepare=True)
                sent += due
            d = now + TICK_S - time.time()
            if d > 0:
                time.sleep(d)
        elapsed = time.time() - t0
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT 1")
        outq.put(("sent", {"sent": sent, "secs": elapsed,
                           "per_tenant": {f"tenant-{i}": c for i, c in enumerate(seqs) if c}}))
    except Exception as e:
        outq.put(("error", f"producer: {e!r}"))
    conn.close()


def _worker(q, n, idx, ttl_s, stall_after, stop, barrier, outq, fail=None, ctl=None, name=None):
    """One claim_next_slot loop (see the module's header). Each batch's effects
    (the processed events: tenant, sequence, send time, and the keys nacked) are
    written to bench_pk_effects in the same transaction as its ack, so a worker
    killed at any point leaves either both or neither: a batch not acked is
    redelivered, and an effect committed twice would show as a duplicate.
    Each non-empty receive is logged in bench_pk_recv (redeliveries: a batch id
    received more than once). With ctl (chaos.Ctl) the worker publishes its
    backend pid and state for the killer, and reconnects when its backend is
    terminated; the batch it had in hand is redelivered once its lease lapses.

    fail (pause-policy cells): {"p": probability that a delivery fails,
    "key": a tenant whose first delivery fails with a retry in an hour (a key
    that stays blocked), "seed"}. A failed event is nacked (retry after 0 s);
    the key's later events of the same batch are skipped, as the clients'
    PartitionedConsumer do under pause; the server holds the rest back.
    Neither is recorded: only processed-and-acked events are."""
    rnd = random.Random((fail or {}).get("seed", 0) * 1000 + idx + (os.getpid() if name else 0))
    name = name or f"w{idx}"
    ctl = ctl or chaos.Ctl(MP, idx + 1)
    stall = None
    empties = 0
    ttl = f"{ttl_s} seconds"
    conn = cur = None
    if barrier is not None:
        barrier.wait()
    stall_at = time.time() + stall_after if stall_after is not None else None
    try:
        while not stop.is_set():
            if conn is None:
                conn = db.connect()
                cur = conn.cursor()
                cur.execute(f'LISTEN "pgque_{q}"')
                ctl.pid[idx] = conn.info.backend_pid
            try:
                ctl.set(idx, chaos.IDLE)
                row = cur.execute("SELECT slot, epoch FROM pgque.claim_next_slot(%s, 'c', %s, %s)",
                                  (q, name, ttl), prepare=True).fetchone()
                if row is None:
                    for _ in conn.notifies(timeout=0.02, stop_after=1):
                        pass
                    continue
                slot = row[0]
                ctl.set(idx, chaos.CLAIMED, slot)
                if slot >= n:
                    n = _current_n(cur, q)  # a slot of a bigger N: the consumer was resized
                try:
                    rows = cur.execute("SELECT batch_id, payload, msg_id FROM pgque.receive_partitioned(%s, 'c', %s, %s, %s, %s)",
                                       (q, slot, n, name, BATCH), prepare=True).fetchall()
                except RESIZED:
                    # resized under this worker (22023 / 22003 for the old N; 55000
                    # when the cutover ended its lease): follow the server's N, and
                    # give the slot back, or it stays leased to this worker (which
                    # claim_next_slot does not hand its own lease) until the ttl
                    n = _give_back(cur, q, slot, name)
                    continue
                if rows:
                    ctl.batch[idx] = rows[0][0]
                    ctl.set(idx, chaos.IN_BATCH, slot)
                    cur.execute("INSERT INTO public.bench_pk_recv VALUES (%s, %s, %s, %s)",
                                (q, rows[0][0], len(rows), time.time()), prepare=True)
                if rows and stall_at is not None and stall is None and time.time() >= stall_at:
                    stall = {"slot": slot, "start": time.time()}
                    time.sleep(ttl_s * 1.5)
                    try:
                        _ack(conn, cur, q, slot, n, name, rows, [])
                        stall["refused"] = False  # nobody took the slot over: the late ack stands
                    except psycopg.errors.ObjectNotInPrerequisiteState:
                        stall["refused"] = True
                    continue
                if rows:
                    done_rows, nacks = rows, []
                    if fail:
                        done_rows, nacks = _fail_some(rows, fail, rnd)
                    try:
                        _ack(conn, cur, q, slot, n, name, done_rows, nacks, ctl, idx)
                    except RESIZED:
                        # not acked (resized, or the lease lapsed): redelivered, not recorded
                        n = _give_back(cur, q, slot, name)
                        continue
                    ctl.set(idx, chaos.CLAIMED, slot)  # acked: no batch in hand
                    empties = 0
                else:
                    empties += 1
                try:
                    cur.execute("SELECT pgque.release_slot(%s, 'c', %s, %s)", (q, slot, name), prepare=True)
                except RESIZED:
                    n = _current_n(cur, q)
                ctl.set(idx, chaos.IDLE)
                if empties >= max(1, n // 4):
                    empties = 0
                    for _ in conn.notifies(timeout=0.02, stop_after=1):
                        pass
            except psycopg.OperationalError:
                if not (conn.closed or conn.broken):
                    raise
                # the backend was terminated: reconnect under the same name;
                # the batch in hand (not acked) is redelivered after its lease
                ctl.reconnects[idx] += 1
                conn.close()
                conn = cur = None
        ctl.set(idx, chaos.IDLE)
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT 1")
        outq.put(("acked", {"idx": idx, "stall": stall}))
    except Exception as e:
        outq.put(("error", f"worker {idx} ({name}): {e!r}"))
    if conn is not None:
        conn.close()


# refusals that mean "resized under this worker" (22023 / 22003 for the old N)
# or "the lease ended" (55000: the cutover, or a takeover)
RESIZED = (psycopg.errors.InvalidParameterValue, psycopg.errors.NumericValueOutOfRange,
           psycopg.errors.ObjectNotInPrerequisiteState)


def _give_back(cur, q, slot, name):
    """Re-reads N after a refusal and gives the slot back (a slot left leased
    to this worker waits for its ttl: claim_next_slot skips a worker's own
    live lease). Returns the current N."""
    n = _current_n(cur, q)
    try:
        cur.execute("SELECT pgque.release_slot(%s, 'c', %s, %s)", (q, slot, name))
    except psycopg.Error:
        pass  # not ours any more (the cutover ended every lease), or a batch still open
    return n


def _fail_some(rows, fail, rnd):
    """Under `fail`, splits a batch into the processed rows and the (msg_id,
    batch_id, retry) of the failed ones: a failed key's later rows of the
    batch are neither processed nor nacked (the server holds them)."""
    done_rows, nacks, failed = [], [], set()
    for r in rows:
        tenant = json.loads(r[1])["tenant"]
        if tenant in failed:
            continue
        hold = False
        if tenant == fail.get("key"):
            with fail["once"].get_lock():
                hold = fail["once"].value == 0
                fail["once"].value = 1
        if hold or rnd.random() < fail.get("p", 0.0):
            nacks.append((r[2], r[0], "1 hour" if hold else "0 seconds", tenant))
            failed.add(tenant)
            continue
        done_rows.append(r)
    return done_rows, nacks


def _ack(conn, cur, q, slot, n, name, rows, nacks, ctl=None, idx=0):
    """In one transaction: the nacks, the batch's effects, the ack. Raises the
    server's refusal (and then nothing of it is committed). A worker armed by
    the killer (ctl.arm) holds inside the transaction, after the effects or
    after the ack, to be terminated there."""
    hold = 0
    if ctl is not None and ctl.arm[idx]:
        hold, ctl.arm[idx] = ctl.arm[idx], 0
    now = time.time()
    tenants, seqs, sent = [], [], []
    for r in rows:
        p = json.loads(r[1])
        tenants.append(p["tenant"])
        seqs.append(p["seq"])
        sent.append(p["ts"])
    with conn.transaction():
        for msg_id, bid, retry, _tenant in nacks:
            cur.execute("SELECT pgque.nack_partitioned(%s, 'c', %s, %s, %s, "
                        "ROW(%s, %s, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::pgque.message, "
                        "%s::interval, 'bench')", (q, slot, n, name, msg_id, bid, retry), prepare=True)
        if rows or nacks:
            cur.execute("INSERT INTO public.bench_pk_effects VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        (q, name, slot, rows[0][0] if rows else nacks[0][1], tenants, seqs, sent, now,
                         [t for *_, t in nacks]), prepare=True)
        if hold == chaos.HOLD_AFTER_EFFECTS:
            _hold(ctl, idx)
        cur.execute("SELECT pgque.ack_partitioned(%s, 'c', %s, %s, %s)", (q, slot, n, name), prepare=True)
        if hold == chaos.HOLD_AFTER_ACK:
            _hold(ctl, idx)


def _hold(ctl, idx):
    ctl.state[idx] = chaos.IN_ACK
    time.sleep(chaos.HOLD_S)


def _current_n(cur, q):
    """The consumer's N as the server has it now (after a resize)."""
    return cur.execute("SELECT n FROM pgque.partition_slot_status WHERE queue_name = %s AND consumer = 'c' LIMIT 1",
                       (q,)).fetchone()[0]


def _resizer(q, plan, t0, log, stop, killer=None):
    """Resizes the consumer at the planned times: plan entries (seconds after
    t0, new N, mode). mode None: begin_resize, poll resize_ready until every
    old slot is drained, then complete_resize. mode 'abort': begin_resize,
    ask the killer (if any) for a SIGKILL at once (the killed worker's open
    batch holds its old slot undrained until its lease lapses), poll
    resize_ready every 5 ms until some but not all old slots are ready, then
    abort_resize (if every slot turned ready between two looks, the abort
    comes after the drain: logged as such). Records each resize's times."""
    conn = db.connect()
    try:
        for at, new_n, mode in plan:
            while time.time() < t0 + at and not stop.is_set():
                time.sleep(0.05)
            if stop.is_set():
                break
            begin = time.time()
            db.execute(conn, "SELECT pgque.begin_resize(%s, 'c', %s)", (q, new_n))
            if mode == "abort":
                if killer:
                    killer.now("sigkill")
                while True:
                    ready, total = db.one(conn, "SELECT count(*) FILTER (WHERE ready), count(*) "
                                                "FROM pgque.resize_ready(%s, 'c')", (q,))
                    if 0 < ready < total or ready == total:
                        kept = db.scalar(conn, "SELECT pgque.abort_resize(%s, 'c')", (q,))
                        break
                    time.sleep(0.005)
                log.append({"to": new_n, "begin": begin, "aborted": True, "ready": ready, "of": total,
                            "kept": kept, "done": time.time()})
                continue
            ready_at = None
            while True:
                if db.scalar(conn, "SELECT bool_and(ready) FROM pgque.resize_ready(%s, 'c')", (q,)):
                    ready_at = ready_at or time.time()
                    try:
                        db.execute(conn, "SELECT pgque.complete_resize(%s, 'c')", (q,))
                        break
                    except psycopg.errors.ObjectNotInPrerequisiteState:
                        pass  # a batch opened since the look: drain on
                time.sleep(0.02)
            log.append({"to": new_n, "begin": begin, "ready": ready_at, "done": time.time()})
    except Exception as e:
        log.append({"error": repr(e)})
    conn.close()


def _cluster_cpu_ticks():
    """utime + stime (clock ticks) of the postmaster and all its children."""
    data = os.environ.get("BENCH_DATA")
    if not data:
        return None
    with open(os.path.join(data, "postmaster.pid")) as f:
        pm = int(f.readline())
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        ppid = int(fields[1])
        if int(pid) == pm or ppid == pm:
            total += int(fields[11]) + int(fields[12])
    return total


def _parkings(conn):
    """Rows ever inserted into pgque.partition_held (the pause policy's parked
    events; a row per parking, so an event parked twice counts twice)."""
    db.execute(conn, "SELECT pg_stat_clear_snapshot()")
    return int(db.scalar(conn, "SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables "
                               "WHERE schemaname = 'pgque' AND relname = 'partition_held'"))


def _blocks(conn):
    db.execute(conn, "SELECT pg_stat_clear_snapshot()")
    return int(db.scalar(conn, "SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()"))


EFFECTS_DDL = [
    # one row per acked batch, written in the ack's transaction (see _worker)
    "CREATE UNLOGGED TABLE IF NOT EXISTS public.bench_pk_effects (q text, worker text, slot int, batch_id bigint, "
    "tenants text[], seqs int[], sent float8[], at float8, nacked text[])",
    # one row per non-empty receive (a batch id seen twice: a redelivery)
    "CREATE UNLOGGED TABLE IF NOT EXISTS public.bench_pk_recv (q text, batch_id bigint, events int, at float8)",
    "TRUNCATE public.bench_pk_effects, public.bench_pk_recv",
]


def _acked_count(conn, q):
    return int(db.scalar(conn, "SELECT coalesce(sum(cardinality(seqs)), 0) FROM public.bench_pk_effects WHERE q = %s",
                         (q,)))


def _effects(conn, q):
    """The committed effects: (tenant, seq, batch_id, pos, slot, lag ms, ack time)
    per processed event, and the keys nacked."""
    acked, nacked = [], set()
    with conn.cursor() as cur:
        cur.execute("SELECT slot, batch_id, tenants, seqs, sent, at, nacked FROM public.bench_pk_effects WHERE q = %s",
                    (q,))
        for slot, bid, tenants, seqs, sent, at, nk in cur:
            for pos, (t, s, ts) in enumerate(zip(tenants, seqs, sent)):
                acked.append((t, s, bid, pos, slot, (at - ts) * 1000.0, at))
            nacked.update(nk or [])
    return acked, nacked


def profile_cell(conn, q, n, rate, secs, m, ttl_s, stall, zipf_s, seed, fail=None, resize=None, kills=0):
    """Runs one cell; returns a dict of figures (raises on lost / duplicated / reordered events).

    With `fail` (see _worker) the consumer has the pause policy; a key
    blocked for an hour is released once the producer is done, and its held
    events must then arrive in order like every other key's. With `kills`
    (per kind), a chaos.Killer SIGKILLs worker processes and terminates
    worker backends at random times (never worker 0 when it stalls)."""
    for ddl in EFFECTS_DDL:
        db.execute(conn, ddl)
    db.execute(conn, "SELECT pgque.create_queue(%s)", (q,))
    if fail:
        db.execute(conn, "SELECT pgque.subscribe_partitioned(%s, 'c', %s, 'pause')", (q, n))
    else:
        db.execute(conn, "SELECT pgque.subscribe_partitioned(%s, 'c', %s)", (q, n))
    db.execute(conn, "VACUUM ANALYZE")
    # this session's own statistics (the VACUUM's reads) land now, not inside the cell
    db.execute(conn, "SELECT pg_stat_force_next_flush()")
    db.execute(conn, "SELECT 1")
    barrier = MP.Barrier(m + 2, timeout=300)
    outq, stop, once = MP.Queue(), MP.Event(), MP.Value("b", 0)
    ctl = chaos.Ctl(MP, m)
    wfail = dict(fail, seed=seed, once=once) if fail else None

    def spawn(i, name):  # a replacement for a killed worker: no barrier, no stall
        p = MP.Process(target=_worker, args=(q, n, i, ttl_s, None, stop, None, outq, wfail, ctl, name))
        p.start()
        return p

    procs = [MP.Process(target=_producer, args=(q, rate, secs, zipf_s, seed, barrier, outq))]
    procs += [MP.Process(target=_worker, args=(q, n, i, ttl_s, secs / 3.0 if stall and i == 0 else None, stop, barrier,
                                               outq, wfail, ctl))
              for i in range(m)]
    for p in procs:
        p.start()
    db.pgss_reset(conn)
    cpu0, blk0, park0 = _cluster_cpu_ticks(), _blocks(conn), _parkings(conn)
    barrier.wait()
    t0 = time.time()
    killer = None
    if kills:
        killer = chaos.Killer(procs, spawn, ctl, list(range(1 if stall else 0, m)), kills, secs, t0, seed)
        killer.start()
    resizes, rstop = [], threading.Event()
    rthread = None
    if resize:
        rthread = threading.Thread(target=_resizer, args=(q, resize, t0, resizes, rstop, killer), daemon=True)
        rthread.start()
    try:
        kind, sent = outq.get(timeout=secs + 120)
        if kind == "error":
            raise RuntimeError(sent)
        if killer:
            killer.stop()  # no kill while draining: the cell's end waits for the workers
        # the workers drain what is left; give them up to 60 s
        total = sent["sent"]
        blocked = None
        if fail and fail.get("key"):
            # what the blocked key holds at the end of the sending, then its release
            blocked = db.scalar(conn, "SELECT coalesce(sum(held_events), 0) FROM pgque.partition_blocked_keys "
                                      "WHERE queue_name = %s AND partition_key = %s", (q, fail["key"]))
            db.execute(conn, "SELECT pgque.release_partition_key(%s, 'c', %s)", (q, fail["key"]))
        if rthread:
            rthread.join(timeout=120)  # a resize under way finishes before the count
        deadline = time.time() + 60
        while _acked_count(conn, q) < total and time.time() < deadline:
            time.sleep(0.1)
        drained_at = time.time()
        # CPU now, while every backend of the cell is still alive (an exited
        # process's time is gone from /proc); blocks after the workers end, as
        # a backend flushes its statistics when it exits
        cpu1 = _cluster_cpu_ticks()
        stop.set()
        results = []
        for _ in range(m):
            kind, r = outq.get(timeout=120)
            if kind == "error":
                raise RuntimeError(r)
            results.append(r)
    finally:
        stop.set()
        rstop.set()
        if killer:
            killer.stop()
        if rthread:
            rthread.join(timeout=60)
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    blk1, park1 = _blocks(conn), _parkings(conn)
    top = db.pgss_top(conn, 8)
    acked, nacked = _effects(conn, q)
    redeliveries = db.one(conn, "SELECT count(*), coalesce(sum(events), 0) FROM (SELECT batch_id, "
                                "unnest((array_agg(events ORDER BY at))[2:]) AS events FROM public.bench_pk_recv "
                                "WHERE q = %s GROUP BY batch_id) r", (q,))
    if killer:
        # mid-batch: the batch in hand was received again after the kill (not acked, redelivered)
        for k in killer.log:
            k["mid_batch"] = k["batch"] is not None and bool(db.scalar(
                conn, "SELECT count(*) FROM public.bench_pk_recv WHERE q = %s AND batch_id = %s AND at > %s",
                (q, k["batch"], k["at"])))
    db.execute(conn, "SELECT pgque.drop_queue(%s, true)", (q,))

    if killer and killer.errors:
        raise RuntimeError(f"{q}: the killer failed: {killer.errors}")
    bad = [r["error"] for r in resizes if "error" in r]
    if bad or (resize and len(resizes) != len(resize)):
        raise RuntimeError(f"{q}: resize failed or did not finish: {bad or resizes}")
    stalls = [r["stall"] for r in results if r["stall"]]
    # exactly once, in order, per tenant
    by_tenant = {}
    for tenant, seq, bid, pos, slot, lag, at in acked:
        by_tenant.setdefault(tenant, []).append((bid, pos, seq))
    lost = dup = disorder = 0
    for tenant, count in sent["per_tenant"].items():
        got = [s for _, _, s in sorted(by_tenant.get(tenant, []))]
        if len(set(got)) != len(got):
            dup += len(got) - len(set(got))
        lost += count - len(set(got))
        if got != sorted(got) or got != list(range(1, len(got) + 1)):
            disorder += 1
    if lost or dup or disorder:
        raise RuntimeError(f"{q}: {lost} lost, {dup} duplicated, {disorder} tenants out of order "
                           f"(sent {total}, acked {len(acked)}; kills {killer.log if killer else None}; "
                           f"resizes {resizes})")
    stalled_slot = stalls[0]["slot"] if stalls else None
    per_slot = {}
    for tenant, seq, bid, pos, slot, lag, at in acked:
        per_slot.setdefault(slot, []).append(lag)
    healthy = [s for s in per_slot if s != stalled_slot]
    lags = [lag for s in healthy for lag in per_slot[s]]
    # pause cells: the lag of the keys that never failed, while the producer
    # ran (after it, a released key's backlog is drained)
    clean = [lag for tenant, seq, bid, pos, slot, lag, at in acked
             if tenant not in nacked and slot != stalled_slot and at < t0 + sent["secs"]] if fail else None
    takeover = None
    if stalls:
        st = stalls[0]
        after = [at for tenant, seq, bid, pos, slot, lag, at in acked if slot == st["slot"] and at > st["start"]]
        takeover = (min(after) - st["start"]) if after else None
    hz = os.sysconf("SC_CLK_TCK")
    acked_secs = max(at for *_, at in acked) - t0 if acked else None
    out = {
        "target": rate, "sent_rate": total / sent["secs"], "acked_rate": len(acked) / acked_secs if acked_secs else None,
        "events": total, "p50": pct(lags, 50), "p99": pct(lags, 99), "max": max(lags) if lags else None,
        "slot_p50_med": median([pct(per_slot[s], 50) for s in healthy]),
        "slot_p99_max": max(pct(per_slot[s], 99) for s in healthy) if healthy else None,
        "stalled_p99": pct(per_slot[stalled_slot], 99) if stalled_slot is not None else None,
        "takeover_s": takeover, "stall_refused": stalls[0].get("refused") if stalls else None,
        "cpu_us": (cpu1 - cpu0) / hz * 1e6 / total if cpu0 is not None and total else None,
        "cores": (cpu1 - cpu0) / hz / (drained_at - t0) if cpu0 is not None else None,
        "buf_per": (blk1 - blk0) / total if total else None,
        "clean_p50": pct(clean, 50) if clean else None, "clean_p99": pct(clean, 99) if clean else None,
        "nacked_keys": len(nacked) if fail else None, "held_at_release": blocked,
        # parkings per event of the keys that failed: 1 if each was parked once
        "parked_per": (park1 - park0) / sum(c for t, c in sent["per_tenant"].items() if t in nacked)
        if fail and nacked else None,
        "resize_s": ", ".join(f"{r['done'] - r['begin']:.1f}" for r in resizes if "done" in r) if resize else None,
        "redelivered": f"{redeliveries[0]} / {redeliveries[1]}",
        "reconnects": sum(ctl.reconnects),
        "top": top,
    }
    if os.environ.get("W11_DEBUG_DIR"):
        # the raw timeline of a cell, to see what a kill or a resize did
        with open(os.path.join(os.environ["W11_DEBUG_DIR"], f"{q}.json"), "w") as f:
            json.dump({"t0": t0, "kills": killer.log if killer else [], "resizes": resizes,
                       "acks": sorted((at, slot, bid) for _t, _s, bid, pos, slot, _l, at in acked if pos == 0)}, f)
    if killer:
        s = chaos.summary(killer.log, acked)
        for kind in ("sigkill", "terminate"):
            k = s[kind]
            out[kind] = f"{k['n']} ({k['mid_batch']} mid-batch, {k['after_ack']} of them after the ack)"
            out[f"{kind}_served"] = ", ".join(f"{x:.1f}" for x in k["served"]) or None
    aborts = [r for r in resizes if r.get("aborted")]
    if aborts:
        a = aborts[0]
        sent_at = [(at - lag / 1000.0, lag) for *_, lag, at in acked]
        before = [lag for ts, lag in sent_at if a["begin"] - 5 <= ts < a["begin"]]
        around = [lag for ts, lag in sent_at if a["begin"] <= ts < a["done"] + 5]
        out["abort"] = (f"{a['ready']} of {a['of']} ready at the abort, {a['done'] - a['begin']:.2f} s after begin; "
                        f"lag p50/p99 ms sent 5 s before {fmt(pct(before, 50))} / {fmt(pct(before, 99))}, "
                        f"from begin to 5 s after the abort {fmt(pct(around, 50))} / {fmt(pct(around, 99))}")
    return out


def w11(res, cfg, conn):
    w = res.workload(
        "w11", "The seed's profile: 5,000 ev/s, zipfian keys over 2,000 tenants, N slots, 4 workers, one stalled",
        [("acked_rate", "acked ev/s"), ("p50", "lag p50 ms"), ("p99", "lag p99 ms"), ("slot_p99_max", "worst slot p99 ms"),
         ("cpu_us", "server CPU us/event"), ("cores", "server cores"), ("buf_per", "buffers/event"),
         ("takeover_s", "stalled slot taken over after s"), ("stalled_p99", "stalled slot p99 ms")],
        about=f"{cfg.w11_secs} s cells at {cfg.w11_rate:,} events/s of ~200-byte JSON (one producer, a keyed send_batch every "
              f"10 ms), keys 'tenant-<k>' with k zipfian (s = {cfg.w11_zipf}) over 2,000 tenants, a partitioned consumer "
              f"with N slots and M = 4 worker processes (claim_next_slot -> receive_partitioned(500) -> "
              f"ack_partitioned -> release_slot, lease ttl {cfg.w11_ttl} s), the pgque worker with its defaults. "
              "Worker 0 stalls a third into the cell holding a received batch for 1.5 x ttl. Lag = ack time - send "
              "time, over every event of the slots that did not stall; the stalled slot's p99 apart. Every cell checks "
              "that each event was acked exactly once and each tenant's events in send order (it fails otherwise). "
              "CPU = utime + stime of all the cluster's processes over the cell / events; buffers = pg_stat_database "
              "blks_hit + blks_read / events. PgQue's published run of this profile: 16 dedicated cores at 26-31% "
              "(4.2-5.0 cores) for 5,000 events/s, and a stalled slot left without an owner for 15 minutes.")
    miss = db.missing_functions(conn, FUNCS)
    if miss:
        w.skip(f"function {', '.join(miss)} not installed")
        return
    for r in range(1, cfg.rounds + 1):
        for n in (16, 64):
            q = f"w11_n{n}_r{r}"
            progress(f"w11 N={n} round {r}")
            m = profile_cell(conn, q, n, cfg.w11_rate, cfg.w11_secs, 4, cfg.w11_ttl, True, cfg.w11_zipf, seed=r)
            w.profile(f"N={n}", "pgque", r, m.pop("top"))
            w.add(f"N={n}", "pgque", r, m)
    # the highest rate sustained with lag p99 under 1 s: N = 16, no stall
    best = None
    for rate in cfg.w11_search:
        progress(f"w11 search: {rate:,} events/s")
        m = profile_cell(conn, f"w11_s{rate}", 16, rate, cfg.w11_search_secs, 4, cfg.w11_ttl, False, cfg.w11_zipf, seed=7)
        m.pop("top")
        w.add("max rate N=16 (no stall)", f"{rate:,} ev/s", 1, m)
        if m["p99"] is None or m["p99"] >= 1000 or m["sent_rate"] < 0.95 * rate:
            break
        best = rate
    w.note(f"highest rate tried with lag p99 under 1 s and the producer on its rate (N = 16, 4 workers): "
           f"{best:,} events/s" if best else "no rate of the search kept lag p99 under 1 s")


KILL_METRICS = [("sigkill", "SIGKILLed workers"), ("sigkill_served", "their slot served again after s"),
                ("terminate", "terminated backends"), ("terminate_served", "their slot served again after s"),
                ("reconnects", "worker reconnects"), ("redelivered", "redelivered batches / events")]
KILL_ABOUT = ("kills: at random times of the sending ({k} of each kind per cell), aimed at a worker holding a received, "
              "unacked batch (it waits up to 2 s for one): a worker process SIGKILLed and restarted (alternately under "
              "the same worker name and a new one: the lease lapses and is taken over), and pg_terminate_backend of a "
              "worker's backend (the worker reconnects). Each batch's effects are written in its ack's transaction, "
              "so a kill leaves both or neither: a batch not acked is redelivered (counted: a batch id received "
              "twice), an effect committed twice would fail the check. 'served again': from the kill to the first "
              "ack of the slot the killed worker held.")


def _cells(env, cells):
    """The cells an env list (e.g. W13_CELLS=none,abort_kills) selects, all by default."""
    want = [c for c in os.environ.get(env, "").split(",") if c]
    return [c for c in cells if not want or c[0] in want]


def w12(res, cfg, conn):
    """The seed's profile under the pause failure policy (issue 34): random
    failures (with and without worker kills), and a hot key blocked for the
    whole sending, beside the same profile with the default skip policy and
    no failures, in one run."""
    w = res.workload(
        "w12", "The seed's profile under the pause policy: random nacks (and worker kills), a hot blocked key, "
               "vs skip without failures",
        [("acked_rate", "acked ev/s"), ("p50", "lag p50 ms"), ("p99", "lag p99 ms"),
         ("clean_p50", "never-failed keys p50 ms"), ("clean_p99", "never-failed keys p99 ms"),
         ("cpu_us", "server CPU us/event"), ("buf_per", "buffers/event"), ("nacked_keys", "keys that failed"),
         ("held_at_release", "held events of the blocked key at its release"),
         ("parked_per", "parkings per event of the failed keys"), ("takeover_s", "stalled slot taken over after s")]
        + KILL_METRICS,
        about=f"{cfg.w11_secs} s cells of w11's profile ({cfg.w11_rate:,} events/s, zipfian keys over 2,000 tenants, "
              f"N = 16, 4 claim_next_slot workers, lease ttl {cfg.w11_ttl} s, worker 0 stalled past its lease a third "
              "into the cell). skip: subscribe_partitioned(q, c, 16), no failures (the reference). "
              f"pause, random nacks: failure_policy 'pause', each delivery fails with probability {cfg.w12_nack_p} "
              "(nack_partitioned, retry after 0 s; the key's later events of the batch skipped, as the clients do; "
              "the nacks, the batch's effects and the ack in one transaction). "
              "pause, random nacks, kills: the same with worker kills. "
              "pause, hot key blocked: the first delivery of the hottest tenant (tenant-0, ~15 % of all events) is "
              "nacked with a retry in an hour, so the key stays blocked and its events are held while the producer "
              "runs; then release_partition_key, and its held events drain. Every cell checks that each event was "
              "processed and acked exactly once and each tenant's processed events are in send order (a failed "
              "delivery is not processed; its redelivery is). 'never-failed keys': lag over the tenants that never "
              "failed, while the producer ran (the other keys, which a blocked key must not delay). "
              + KILL_ABOUT.format(k=cfg.w11_kills))
    miss = db.missing_functions(conn, FUNCS + ["pgque.release_partition_key(text,text,text)",
                                               "pgque.nack_partitioned(text,text,integer,integer,text,pgque.message,interval,text)"])
    if miss:
        w.skip(f"function {', '.join(miss)} not installed")
        return
    nacks = {"p": cfg.w12_nack_p}
    cells = _cells("W12_CELLS", [("skip", "skip, no failures", None, 0), ("nacks", "pause, random nacks", nacks, 0),
                                 ("nacks_kills", "pause, random nacks, kills", nacks, cfg.w11_kills),
                                 ("hot", "pause, hot key blocked", {"key": "tenant-0", "p": 0.0}, 0)])
    ratios = {label: [] for _, label, fail, _ in cells if fail}
    for r in range(1, cfg.rounds + 1):
        ref = None
        for _, label, fail, kills in cells:
            q = f"w12_{len(label)}_r{r}"
            progress(f"w12 {label} round {r}")
            m = profile_cell(conn, q, 16, cfg.w11_rate, cfg.w11_secs, 4, cfg.w11_ttl, True, cfg.w11_zipf, seed=r,
                             fail=fail, kills=kills)
            w.profile(label, "pgque", r, m.pop("top"))
            w.add(label, "pgque", r, m)
            if fail is None:
                ref = m
            elif ref and ref["p99"] and m["clean_p99"]:
                ratios[label].append((m["clean_p50"] / ref["p50"], m["clean_p99"] / ref["p99"],
                                      m["cpu_us"] / ref["cpu_us"] if m["cpu_us"] and ref["cpu_us"] else None))
    for label, rs in ratios.items():
        w.note(f"{label} / skip in the same round, per round (never-failed keys' p50, p99; CPU per event): "
               + "; ".join(f"{a:.2f}, {b:.2f}; {c:.2f}" if c else f"{a:.2f}, {b:.2f}; -" for a, b, c in rs))


def w13(res, cfg, conn):
    """The seed's profile with an online resize 16 -> 32 -> 16 under load
    (issue 34 item 2), with and without worker kills, and a resize aborted
    mid-drain, beside the same cell without a resize, in one run."""
    w = res.workload(
        "w13", "The seed's profile with an online resize 16 -> 32 -> 16 under load (and worker kills, and an abort "
               "mid-drain), vs no resize",
        [("acked_rate", "acked ev/s"), ("p50", "lag p50 ms"), ("p99", "lag p99 ms"), ("max", "lag max ms"),
         ("cpu_us", "server CPU us/event"), ("buf_per", "buffers/event"), ("resize_s", "resizes took s (begin to complete)"),
         ("abort", "the abort")] + KILL_METRICS,
        about=f"{cfg.w11_secs} s cells of w11's profile ({cfg.w11_rate:,} events/s, zipfian keys over 2,000 tenants, "
              f"4 claim_next_slot workers, lease ttl {cfg.w11_ttl} s, no stalled worker). resize: the consumer starts "
              "with N = 16; a third into the cell begin_resize(q, c, 32), resize_ready polled every 20 ms until every "
              "old slot is drained to the seal, complete_resize; two thirds in, the same back to 16. The workers follow "
              "N: a claim of a slot beyond their N, or a call refused for the old N (22023 / 22003) or the lease the "
              "cutover ended (55000), re-reads N from partition_slot_status and gives the slot back; a batch not acked "
              "is redelivered. resize, kills: the same with worker kills. abort mid-drain, kills: a third in "
              "begin_resize(q, c, 32) and at once a SIGKILL of a worker holding a batch (its old slot stays undrained "
              "until the lease lapses), resize_ready polled every 5 ms until some but not all old slots are ready, "
              "abort_resize; sending and consuming go on; two thirds in a resize to 32 that completes. Every cell "
              "checks that each event was acked exactly once and each tenant's events in send order, across the "
              "cutovers and the abort. " + KILL_ABOUT.format(k=cfg.w11_kills))
    miss = db.missing_functions(conn, FUNCS + ["pgque.begin_resize(text,text,integer)", "pgque.abort_resize(text,text)",
                                               "pgque.complete_resize(text,text)", "pgque.resize_ready(text,text)"])
    if miss:
        w.skip(f"function {', '.join(miss)} not installed")
        return
    secs = cfg.w11_secs
    there_and_back = [(secs / 3.0, 32, None), (2 * secs / 3.0, 16, None)]
    cells = _cells("W13_CELLS", [("none", "no resize", None, 0),
                                 ("resize", "resize 16 -> 32 -> 16", there_and_back, 0),
                                 ("resize_kills", "resize 16 -> 32 -> 16, kills", there_and_back, cfg.w11_kills),
                                 ("abort_kills", "abort mid-drain, kills",
                                  [(secs / 3.0, 32, "abort"), (2 * secs / 3.0, 32, None)], cfg.w11_kills)])
    ratios = {label: [] for _, label, plan, kills in cells if plan or kills}
    for r in range(1, cfg.rounds + 1):
        ref = None
        for key, label, plan, kills in cells:
            q = f"w13_{key}_r{r}"
            progress(f"w13 {label} round {r}")
            m = profile_cell(conn, q, 16, cfg.w11_rate, secs, 4, cfg.w11_ttl, False, cfg.w11_zipf, seed=r, resize=plan,
                             kills=kills)
            w.profile(label, "pgque", r, m.pop("top"))
            w.add(label, "pgque", r, m)
            if plan is None:
                ref = m
            elif ref and ref["p50"] and ref["p99"]:
                ratios[label].append((m["p50"] / ref["p50"], m["p99"] / ref["p99"]))
    for label, rs in ratios.items():
        w.note(f"{label} / no resize in the same round, lag p50, p99 per round: "
               + "; ".join(f"{a:.2f}, {b:.2f}" for a, b in rs))
