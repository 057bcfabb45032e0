"""Server CPU per event at a fixed event rate, pgque against PgQ, in one run
(issue 35 item 4).

Producer processes (one per 1,500 events/s) send one event per transaction
at a paced rate (the payload carries its send time), one consumer process receives and acks,
computing send->receive latency, as benches/harness w4 does. pgque: the
background worker ticks at its defaults, the consumer LISTENs on
`pgque_<queue>` between empty receives (at most PGQUE_POLL_MS, by default
POLL_MS). PgQ: a process
calls pgq.ticker() every PGQ_TICK_MS as pgqd would (queue ticker_max_lag the
same), the consumer polls next_batch every POLL_MS.

CPU is every process of the cluster (the postmaster and all its children:
the producer's and consumer's backends, pgque's worker and launcher, PgQ's
ticker backend, walwriter, ...), from /proc/<pid>/schedstat, summed over
the cell; the client processes are not in it. Systems run in interleaved
rounds, each cell on a fresh queue. Run on the database host, against the
bench cluster (benches/run.sh leaves it running):

    BENCH_HOST=/tmp/pgque_bench BENCH_PORT=55515 BENCH_DATA=benches/.work/pg15 \
        RATES=500,2000,5000 SECS=15 ROUNDS=3 python3 benches/cpu/rate_cpu.py

Each cell also prints its CPU split by process class (the producers' and the
consumer's backends, pgque's worker, PgQ's ticker backend, walwriter, the
rest) per event, and per batch. SYSTEMS=pgquewait,pgque,pgq adds pgque's
waiting receive (no LISTEN: receive(q, c, 1000, WAIT_MS) in a loop, the
worker ticking on demand; docs/waits.md). WINDOWS=5,20,50 runs pgque once per
pgque.tick_coalesce_ms value (ALTER SYSTEM + reload before each cell; reset
at the end).
"""
import json
import multiprocessing as MP
import os
import statistics
import time

import psycopg

from backend import CONNINFO

DATA = os.environ.get("BENCH_DATA", os.path.join(os.path.dirname(__file__), "..", ".work", "pg15"))
RATES = [int(r) for r in os.environ.get("RATES", "500,2000,5000").split(",")]
SECS = float(os.environ.get("SECS", "15"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
POLL_MS = int(os.environ.get("POLL_MS", "10"))
# How long pgque's consumer waits for the tick's NOTIFY before it receives
# again (default POLL_MS; the client libraries' Consumer waits 2 s).
PGQUE_POLL_MS = int(os.environ.get("PGQUE_POLL_MS", str(POLL_MS)))
PGQ_TICK_MS = int(os.environ.get("PGQ_TICK_MS", "100"))
SYSTEMS = os.environ.get("SYSTEMS", "pgque,pgq").split(",")
# The waiting receive's wait (system pgquewait); the server caps it at pgque.max_wait.
WAIT_MS = int(os.environ.get("WAIT_MS", "5000"))
WINDOWS = [w for w in os.environ.get("WINDOWS", "").split(",") if w]


def server_cpu_by_pid():
    """CPU time so far (ns) of the postmaster and every process it forked, by pid."""
    with open(os.path.join(DATA, "postmaster.pid")) as f:
        pm = int(f.readline())
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if int(d) != pm and ppid != pm:
                continue
            with open(f"/proc/{d}/schedstat") as f:
                out[int(d)] = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass  # exited meanwhile
    return out


def proc_class(pid, roles):
    """The class of server process `pid`: a role the clients reported for
    their backends (producers, consumer, ticker), else from its title."""
    if pid in roles:
        return roles[pid]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return "other"
    if "pgque worker" in title or "pgque db worker" in title:
        return "worker"
    if "walwriter" in title:
        return "walwriter"
    return "other"


CLASSES = ("producers", "consumer", "worker", "ticker", "walwriter", "other")


def payload(i):
    return json.dumps({"id": i, "ts": time.time(), "kind": "order.created", "note": "x" * 64})


def engine(system):
    """pgque for the pgque systems (pgque: LISTEN + receive; pgquewait: the
    waiting receive, docs/waits.md), else pgq."""
    return "pgque" if system.startswith("pgque") else "pgq"


def producer(system, q, rate, secs, barrier, outq, end):
    conn = psycopg.connect(CONNINFO, autocommit=True)
    cur = conn.cursor()
    outq.put(("pid", conn.info.backend_pid, "producers"))
    barrier.wait()
    t0 = time.time()
    i = 0
    while time.time() - t0 < secs:
        due = int((time.time() - t0) * rate) + 1
        while i < due:
            i += 1
            if engine(system) == "pgque":
                cur.execute("SELECT pgque.send(%s, %s::jsonb)", (q, payload(i)), prepare=True)
            else:
                cur.execute("SELECT pgq.insert_event(%s, 'default', %s)", (q, payload(i)), prepare=True)
        d = t0 + i / rate - time.time()
        if d > 0:
            time.sleep(d)
    outq.put(("sent", i, time.time() - t0))
    end.wait()  # the backend's CPU is read before it exits
    conn.close()


def consumer(system, q, stop_at, barrier, outq, end):
    conn = psycopg.connect(CONNINFO, autocommit=True)
    cur = conn.cursor()
    outq.put(("pid", conn.info.backend_pid, "consumer"))
    if system == "pgque":
        cur.execute(f'LISTEN "pgque_{q}"')
    lats, batches = [], 0
    barrier.wait()
    while time.time() < stop_at:
        rows = []
        with conn.transaction():
            # (the waiting receive is the transaction's first statement: a
            # transaction that has written would not sleep)
            if system == "pgquewait":
                rows = cur.execute("SELECT payload, batch_id FROM pgque.receive(%s, 'c1', 1000, %s::interval)",
                                   (q, f"{WAIT_MS} ms"), prepare=True).fetchall()
                if rows:
                    cur.execute("SELECT pgque.ack(%s)", (rows[0][1],), prepare=True)
            elif system == "pgque":
                rows = cur.execute("SELECT payload, batch_id FROM pgque.receive(%s, 'c1', 1000)",
                                   (q,), prepare=True).fetchall()
                if rows:
                    cur.execute("SELECT pgque.ack(%s)", (rows[0][1],), prepare=True)
            else:
                bid = cur.execute("SELECT pgq.next_batch(%s, 'c1')", (q,), prepare=True).fetchone()[0]
                if bid is not None:
                    rows = cur.execute("SELECT ev_data FROM pgq.get_batch_events(%s)", (bid,),
                                       prepare=True).fetchall()
                    cur.execute("SELECT pgq.finish_batch(%s)", (bid,), prepare=True)
        now = time.time()
        if rows:
            batches += 1
            for r in rows:
                p = r[0] if isinstance(r[0], dict) else json.loads(r[0])
                lats.append((now - p["ts"]) * 1000.0)
            continue
        if system == "pgque":
            for _ in conn.notifies(timeout=PGQUE_POLL_MS / 1000.0, stop_after=1):
                pass
        elif system == "pgq":
            time.sleep(POLL_MS / 1000.0)
    outq.put(("lats", lats, batches))
    end.wait()
    conn.close()


def pgq_ticker(stop_at, barrier, end, outq):
    conn = psycopg.connect(CONNINFO, autocommit=True)
    outq.put(("pid", conn.info.backend_pid, "ticker"))
    barrier.wait()
    while time.time() < stop_at:
        conn.execute("SELECT pgq.ticker()")
        time.sleep(PGQ_TICK_MS / 1000.0)
    end.wait()
    conn.close()


def cell(admin, system, rate, rnd):
    q = f"ratecpu_{system}_{rate}_{rnd}"
    if engine(system) == "pgque":
        admin.execute("SELECT pgque.create_queue(%s)", (q,))
        admin.execute("SELECT pgque.subscribe(%s, 'c1')", (q,))
    else:
        admin.execute("SELECT pgq.create_queue(%s)", (q,))
        admin.execute("SELECT pgq.register_consumer(%s, 'c1')", (q,))
        admin.execute("SELECT pgq.set_queue_config(%s, 'ticker_max_lag', %s)", (q, f"{PGQ_TICK_MS} ms"))
    time.sleep(1.5)  # the worker goes back to its idle state between cells
    # one producer process per 1,500 events/s: one Python process sends
    # about that many single-event transactions a second here
    nprod = -(-rate // 1500)
    n = nprod + 1 + (system == "pgq")
    barrier = MP.Barrier(n + 1, timeout=120)
    end = MP.Barrier(n + 1, timeout=120)
    outq = MP.Queue()
    stop_at = time.time() + SECS + 2.0
    procs = [MP.Process(target=producer, args=(system, q, rate / nprod, SECS, barrier, outq, end))
             for _ in range(nprod)]
    procs.append(MP.Process(target=consumer, args=(system, q, stop_at, barrier, outq, end)))
    if system == "pgq":
        procs.append(MP.Process(target=pgq_ticker, args=(stop_at, barrier, end, outq)))
    for p in procs:
        p.start()
    barrier.wait()
    cpu0, t0 = server_cpu_by_pid(), time.time()
    sent, sent_secs, lats, batches = 0, 0.0, [], 0
    roles, done = {}, 0
    while done < nprod + 1:
        kind, val, extra = outq.get()
        if kind == "pid":
            roles[val] = extra
        elif kind == "sent":
            sent, sent_secs, done = sent + val, max(sent_secs, extra), done + 1
        else:
            lats, batches, done = val, extra, done + 1
    # every client still connected: their backends' CPU is all there
    cpu1, wall = server_cpu_by_pid(), time.time() - t0
    split = {c: 0 for c in CLASSES}
    for pid, ns in cpu1.items():
        split[proc_class(pid, roles)] += ns - cpu0.get(pid, 0)
    cpu = sum(split.values())
    end.wait()
    for p in procs:
        p.join()
    if engine(system) == "pgque":
        admin.execute("SELECT pgque.drop_queue(%s, true)", (q,))
    else:
        admin.execute("SELECT pgq.drop_queue(%s, true)", (q,))
    lats.sort()
    pct = lambda p: lats[min(len(lats) - 1, int(len(lats) * p / 100))] if lats else float("nan")
    return {"sent": sent, "rate": sent / sent_secs, "recv": len(lats), "batches": batches,
            "cpu_us_per_event": cpu / 1000.0 / max(sent, 1), "cores": cpu / 1e9 / wall,
            "p50": pct(50), "p99": pct(99),
            "split": {c: split[c] / 1000.0 / max(sent, 1) for c in CLASSES},
            "per_batch_us": cpu / 1000.0 / max(batches, 1)}


def set_window(admin, ms):
    """Sets pgque.tick_coalesce_ms on the cluster (None: back to its default)."""
    if ms is None:
        admin.execute("ALTER SYSTEM RESET pgque.tick_coalesce_ms")
    else:
        admin.execute(f"ALTER SYSTEM SET pgque.tick_coalesce_ms = {int(ms)}")
    admin.execute("SELECT pg_reload_conf()")


def main():
    admin = psycopg.connect(CONNINFO, autocommit=True)
    # WINDOWS=5,20: pgque runs once per pgque.tick_coalesce_ms value, as
    # systems pgque@5, pgque@20 (unset: pgque at the server's setting)
    systems = []
    for s in SYSTEMS:
        if s in ("pgque", "pgquewait") and WINDOWS:
            systems += [f"{s}@{w}" for w in WINDOWS]
        else:
            systems.append(s)
    print(f"rate_cpu.py: {SECS:.0f} s cells, {ROUNDS} rounds, poll {POLL_MS} ms (pgque {PGQUE_POLL_MS} ms), PgQ ticker {PGQ_TICK_MS} ms; "
          f"{os.getloadavg()[0]:.2f} load", flush=True)
    for rate in RATES:
        res = {s: [] for s in systems}
        for rnd in range(1, ROUNDS + 1):
            for s in systems:
                base, _, w = s.partition("@")
                if w:
                    set_window(admin, w)
                r = cell(admin, base, rate, rnd)
                res[s].append(r)
                sp = " ".join(f"{c} {r['split'][c]:.0f}" for c in CLASSES if r["split"][c] >= 0.5)
                print(f"rate={rate}/s round {rnd} {s:8}: {r['rate']:7.0f} ev/s sent, {r['recv']} received in "
                      f"{r['batches']} batches; server CPU {r['cpu_us_per_event']:6.1f} us/event "
                      f"({r['cores']:.2f} cores; {r['per_batch_us']:.0f} us/batch); latency p50 {r['p50']:.1f} ms, "
                      f"p99 {r['p99']:.1f} ms; load {os.getloadavg()[0]:.1f}", flush=True)
                print(f"    us/event by process: {sp}", flush=True)
        med = {s: statistics.median(x["cpu_us_per_event"] for x in res[s]) for s in systems}
        line = "  ".join(f"{s} {med[s]:.1f}" for s in systems)
        print(f"rate={rate}/s median server CPU us/event: {line}", flush=True)
        if "pgq" in res:
            for s in systems:
                if s.startswith("pgque"):
                    ratios = [a["cpu_us_per_event"] / b["cpu_us_per_event"] for a, b in zip(res[s], res["pgq"])]
                    print(f"rate={rate}/s {s}/pgq per round {' '.join(f'{x:.2f}' for x in ratios)}", flush=True)
    if WINDOWS:
        set_window(admin, None)


if __name__ == "__main__":
    main()
