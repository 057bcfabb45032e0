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

from . import db
from .core import median, pct, progress

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


def _worker(q, n, idx, ttl_s, stall_after, stop, done, barrier, outq, fail=None):
    """One claim_next_slot loop; records (tenant, seq, batch_id, pos, slot, lag_ms) of acked events.

    fail (pause-policy cells): {"p": probability that a delivery fails,
    "key": a tenant whose first delivery fails with a retry in an hour (a key
    that stays blocked), "seed"}. A failed event is nacked (retry after 0 s);
    the key's later events of the same batch are skipped, as the clients'
    PartitionedConsumer do under pause; the server holds the rest back.
    Neither is recorded: only processed-and-acked events are."""
    rnd = random.Random((fail or {}).get("seed", 0) * 1000 + idx)
    nacked = set()
    name = f"w{idx}"
    conn = db.connect()
    cur = conn.cursor()
    cur.execute(f'LISTEN "pgque_{q}"')
    acked, stall = [], None
    empties = 0
    ttl = f"{ttl_s} seconds"
    barrier.wait()
    stall_at = time.time() + stall_after if stall_after is not None else None
    try:
        while not stop.is_set():
            row = cur.execute("SELECT slot, epoch FROM pgque.claim_next_slot(%s, 'c', %s, %s)",
                              (q, name, ttl), prepare=True).fetchone()
            if row is None:
                for _ in conn.notifies(timeout=0.02, stop_after=1):
                    pass
                continue
            slot = row[0]
            if slot >= n:
                n = _current_n(cur, q)  # a slot of a bigger N: the consumer was resized
            try:
                rows = cur.execute("SELECT batch_id, payload, msg_id FROM pgque.receive_partitioned(%s, 'c', %s, %s, %s, %s)",
                                   (q, slot, n, name, BATCH), prepare=True).fetchall()
            except (psycopg.errors.InvalidParameterValue, psycopg.errors.NumericValueOutOfRange,
                    psycopg.errors.ObjectNotInPrerequisiteState):
                # resized under this worker (22023 / 22003 for the old N; 55000
                # when the cutover ended its lease): follow the server's N, and
                # give the slot back, or it stays leased to this worker (which
                # claim_next_slot does not hand its own lease) until the ttl
                n = _current_n(cur, q)
                try:
                    cur.execute("SELECT pgque.release_slot(%s, 'c', %s, %s)", (q, slot, name))
                except psycopg.Error:
                    pass  # not ours any more (the cutover ended every lease)
                continue
            if rows and stall_at is not None and stall is None and time.time() >= stall_at:
                stall = {"slot": slot, "start": time.time()}
                time.sleep(ttl_s * 1.5)
                try:
                    cur.execute("SELECT pgque.ack_partitioned(%s, 'c', %s, %s, %s)", (q, slot, n, name))
                    stall["refused"] = False  # nobody took the slot over: the late ack stands
                    _record(acked, rows, slot, done)
                except psycopg.errors.ObjectNotInPrerequisiteState:
                    stall["refused"] = True
                continue
            if rows and fail:
                done_rows, failed = [], set()
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
                        nacked.add(tenant)
                        cur.execute("SELECT pgque.nack_partitioned(%s, 'c', %s, %s, %s, "
                                    "ROW(%s, %s, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::pgque.message, "
                                    "%s::interval, 'bench')",
                                    (q, slot, n, name, r[2], r[0], "1 hour" if hold else "0 seconds"), prepare=True)
                        failed.add(tenant)
                        continue
                    done_rows.append(r)
                cur.execute("SELECT pgque.ack_partitioned(%s, 'c', %s, %s, %s)", (q, slot, n, name), prepare=True)
                _record(acked, done_rows, slot, done)
                empties = 0
            elif rows:
                try:
                    cur.execute("SELECT pgque.ack_partitioned(%s, 'c', %s, %s, %s)", (q, slot, n, name), prepare=True)
                except (psycopg.errors.InvalidParameterValue, psycopg.errors.ObjectNotInPrerequisiteState):
                    # not acked (resized, or the lease lapsed): redelivered, not recorded
                    n = _current_n(cur, q)
                    continue
                _record(acked, rows, slot, done)
                empties = 0
            else:
                empties += 1
            try:
                cur.execute("SELECT pgque.release_slot(%s, 'c', %s, %s)", (q, slot, name), prepare=True)
            except (psycopg.errors.InvalidParameterValue, psycopg.errors.NumericValueOutOfRange,
                    psycopg.errors.ObjectNotInPrerequisiteState):
                n = _current_n(cur, q)
            if empties >= max(1, n // 4):
                empties = 0
                for _ in conn.notifies(timeout=0.02, stop_after=1):
                    pass
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT 1")
        outq.put(("acked", {"idx": idx, "acked": acked, "stall": stall, "nacked": nacked}))
    except Exception as e:
        outq.put(("error", f"worker {idx}: {e!r}"))
    conn.close()


def _current_n(cur, q):
    """The consumer's N as the server has it now (after a resize)."""
    return cur.execute("SELECT n FROM pgque.partition_slot_status WHERE queue_name = %s AND consumer = 'c' LIMIT 1",
                       (q,)).fetchone()[0]


def _resizer(q, plan, t0, log, stop):
    """Resizes the consumer at the planned times (seconds after t0, new N):
    begin_resize, poll resize_ready until every old slot is drained, then
    complete_resize; records each resize's begin and end."""
    conn = db.connect()
    try:
        for at, new_n in plan:
            while time.time() < t0 + at and not stop.is_set():
                time.sleep(0.05)
            if stop.is_set():
                break
            begin = time.time()
            db.execute(conn, "SELECT pgque.begin_resize(%s, 'c', %s)", (q, new_n))
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


def _record(acked, rows, slot, done):
    now = time.time()
    for pos, (bid, payload, *_) in enumerate(rows):
        p = json.loads(payload)
        acked.append((p["tenant"], p["seq"], bid, pos, slot, (now - p["ts"]) * 1000.0, now))
    with done.get_lock():
        done.value += len(rows)


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


def _blocks(conn):
    db.execute(conn, "SELECT pg_stat_clear_snapshot()")
    return int(db.scalar(conn, "SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()"))


def profile_cell(conn, q, n, rate, secs, m, ttl_s, stall, zipf_s, seed, fail=None, resize=None):
    """Runs one cell; returns a dict of figures (raises on lost / duplicated / reordered events).

    With `fail` (see _worker) the consumer has the pause policy; a key
    blocked for an hour is released once the producer is done, and its held
    events must then arrive in order like every other key's."""
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
    outq, stop, done, once = MP.Queue(), MP.Event(), MP.Value("q", 0), MP.Value("b", 0)
    procs = [MP.Process(target=_producer, args=(q, rate, secs, zipf_s, seed, barrier, outq))]
    procs += [MP.Process(target=_worker, args=(q, n, i, ttl_s, secs / 3.0 if stall and i == 0 else None, stop, done, barrier,
                                               outq, dict(fail, seed=seed, once=once) if fail else None))
              for i in range(m)]
    for p in procs:
        p.start()
    db.pgss_reset(conn)
    cpu0, blk0 = _cluster_cpu_ticks(), _blocks(conn)
    barrier.wait()
    t0 = time.time()
    resizes, rstop = [], threading.Event()
    rthread = None
    if resize:
        rthread = threading.Thread(target=_resizer, args=(q, resize, t0, resizes, rstop), daemon=True)
        rthread.start()
    try:
        kind, sent = outq.get(timeout=secs + 120)
        if kind == "error":
            raise RuntimeError(sent)
        # the workers drain what is left; give them up to 60 s
        total = sent["sent"]
        blocked = None
        if fail and fail.get("key"):
            # what the blocked key holds at the end of the sending, then its release
            blocked = db.scalar(conn, "SELECT coalesce(sum(held_events), 0) FROM pgque.partition_blocked_keys "
                                      "WHERE queue_name = %s AND partition_key = %s", (q, fail["key"]))
            db.execute(conn, "SELECT pgque.release_partition_key(%s, 'c', %s)", (q, fail["key"]))
        deadline = time.time() + 60
        while done.value < total and time.time() < deadline:
            time.sleep(0.05)
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
        if rthread:
            rthread.join(timeout=60)
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    blk1 = _blocks(conn)
    top = db.pgss_top(conn, 8)
    db.execute(conn, "SELECT pgque.drop_queue(%s, true)", (q,))

    bad = [r["error"] for r in resizes if "error" in r]
    if bad or (resize and len(resizes) != len(resize)):
        raise RuntimeError(f"{q}: resize failed or did not finish: {bad or resizes}")
    acked = [e for r in results for e in r["acked"]]
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
                           f"(sent {total}, acked {len(acked)})")
    stalled_slot = stalls[0]["slot"] if stalls else None
    per_slot = {}
    for tenant, seq, bid, pos, slot, lag, at in acked:
        per_slot.setdefault(slot, []).append(lag)
    healthy = [s for s in per_slot if s != stalled_slot]
    lags = [lag for s in healthy for lag in per_slot[s]]
    # pause cells: the lag of the keys that never failed, while the producer
    # ran (after it, a released key's backlog is drained)
    nacked = set().union(*[r["nacked"] for r in results])
    clean = [lag for tenant, seq, bid, pos, slot, lag, at in acked
             if tenant not in nacked and slot != stalled_slot and at < t0 + sent["secs"]] if fail else None
    takeover = None
    if stalls:
        st = stalls[0]
        after = [at for tenant, seq, bid, pos, slot, lag, at in acked if slot == st["slot"] and at > st["start"]]
        takeover = (min(after) - st["start"]) if after else None
    hz = os.sysconf("SC_CLK_TCK")
    acked_secs = max(at for *_, at in acked) - t0 if acked else None
    return {
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
        "resize_s": ", ".join(f"{r['done'] - r['begin']:.1f}" for r in resizes if "done" in r) if resize else None,
        "top": top,
    }


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


def w12(res, cfg, conn):
    """The seed's profile under the pause failure policy (issue 34): random
    failures, and a hot key blocked for the whole sending, beside the same
    profile with the default skip policy and no failures, in one run."""
    w = res.workload(
        "w12", "The seed's profile under the pause policy: random nacks, a hot blocked key, vs skip without failures",
        [("acked_rate", "acked ev/s"), ("p50", "lag p50 ms"), ("p99", "lag p99 ms"),
         ("clean_p50", "never-failed keys p50 ms"), ("clean_p99", "never-failed keys p99 ms"),
         ("cpu_us", "server CPU us/event"), ("buf_per", "buffers/event"), ("nacked_keys", "keys that failed"),
         ("held_at_release", "held events of the blocked key at its release")],
        about=f"{cfg.w11_secs} s cells of w11's profile ({cfg.w11_rate:,} events/s, zipfian keys over 2,000 tenants, "
              "N = 16, 4 claim_next_slot workers, worker 0 stalled past its lease a third into the cell). "
              "skip: subscribe_partitioned(q, c, 16), no failures (the reference). "
              f"pause, random nacks: failure_policy 'pause', each delivery fails with probability {cfg.w12_nack_p} "
              "(nack_partitioned, retry after 0 s; the key's later events of the batch skipped, as the clients do). "
              "pause, hot key blocked: the first delivery of the hottest tenant (tenant-0, ~15 % of all events) is "
              "nacked with a retry in an hour, so the key stays blocked and its events are held while the producer "
              "runs; then release_partition_key, and its held events drain. Every cell checks that each event was "
              "processed and acked exactly once and each tenant's processed events are in send order (a failed "
              "delivery is not processed; its redelivery is). 'never-failed keys': lag over the tenants that never "
              "failed, while the producer ran (the other keys, which a blocked key must not delay).")
    miss = db.missing_functions(conn, FUNCS + ["pgque.release_partition_key(text,text,text)",
                                               "pgque.nack_partitioned(text,text,integer,integer,text,pgque.message,interval,text)"])
    if miss:
        w.skip(f"function {', '.join(miss)} not installed")
        return
    cells = [("skip, no failures", None), ("pause, random nacks", {"p": cfg.w12_nack_p}),
             ("pause, hot key blocked", {"key": "tenant-0", "p": 0.0})]
    ratios = {label: [] for label, _ in cells[1:]}
    for r in range(1, cfg.rounds + 1):
        ref = None
        for label, fail in cells:
            q = f"w12_{len(label)}_r{r}"
            progress(f"w12 {label} round {r}")
            m = profile_cell(conn, q, 16, cfg.w11_rate, cfg.w11_secs, 4, cfg.w11_ttl, True, cfg.w11_zipf, seed=r,
                             fail=fail)
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
    (issue 34 item 2), beside the same cell without a resize, in one run."""
    w = res.workload(
        "w13", "The seed's profile with an online resize 16 -> 32 -> 16 under load, vs no resize",
        [("acked_rate", "acked ev/s"), ("p50", "lag p50 ms"), ("p99", "lag p99 ms"), ("max", "lag max ms"),
         ("cpu_us", "server CPU us/event"), ("buf_per", "buffers/event"), ("resize_s", "resizes took s (begin to complete)")],
        about=f"{cfg.w11_secs} s cells of w11's profile ({cfg.w11_rate:,} events/s, zipfian keys over 2,000 tenants, "
              "4 claim_next_slot workers, no stalled worker). resize: the consumer starts with N = 16; a third into "
              "the cell begin_resize(q, c, 32), resize_ready polled every 20 ms until every old slot is drained to "
              "the seal, complete_resize; two thirds in, the same back to 16. The workers follow N: a claim of a "
              "slot beyond their N, or a call refused for the old N (22023 / 22003) or the lease the cutover ended "
              "(55000), re-reads N from partition_slot_status; a batch not acked is redelivered. Every cell checks "
              "that each event was acked exactly once and each tenant's events in send order, across both cutovers.")
    miss = db.missing_functions(conn, FUNCS + ["pgque.begin_resize(text,text,integer)",
                                               "pgque.complete_resize(text,text)", "pgque.resize_ready(text,text)"])
    if miss:
        w.skip(f"function {', '.join(miss)} not installed")
        return
    secs = cfg.w11_secs
    ratios = []
    for r in range(1, cfg.rounds + 1):
        ref = None
        for label, plan in (("no resize", None), ("resize 16 -> 32 -> 16", [(secs / 3.0, 32), (2 * secs / 3.0, 16)])):
            q = f"w13_{'r' if plan else 'n'}_r{r}"
            progress(f"w13 {label} round {r}")
            m = profile_cell(conn, q, 16, cfg.w11_rate, secs, 4, cfg.w11_ttl, False, cfg.w11_zipf, seed=r, resize=plan)
            w.profile(label, "pgque", r, m.pop("top"))
            w.add(label, "pgque", r, m)
            if plan is None:
                ref = m
            elif ref and ref["p50"] and ref["p99"]:
                ratios.append((m["p50"] / ref["p50"], m["p99"] / ref["p99"]))
    w.note("resize / no resize in the same round, lag p50, p99 per round: "
           + "; ".join(f"{a:.2f}, {b:.2f}" for a, b in ratios))
