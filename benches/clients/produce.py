"""The fixed-rate producer of benches/clients' latency cells: enqueues RATE
jobs/s for SECS seconds from 8 connections, one job per transaction
(autocommit), each job's args holding {"t": wall-clock seconds taken just before its enqueue call}.
The worker under test subtracts that from the clock at its handler's start:
enqueue -> handler start, on the same machine's clock. The figure therefore
includes the enqueue statement's own round trip and commit (its p50 is
printed, so the reader can subtract it).

    produce.py SYSTEM DSN QUEUE RATE SECS [DELAY]

SYSTEM: pgque (SQL pgque.enqueue), graphile (SQL graphile_worker.add_job),
pgqueuer (its Queries.enqueue on asyncpg), procrastinate (the task's
defer_async). pg-boss's producer is in bench_node.mjs (its send()).

Open loop: job i is due at start + i / RATE (connection i mod 8 sends it); a
late producer sends at once (it never skips), so the achieved rate it prints is what the worker saw.
Each connection first sends one warm-up job (args without "t": the handlers
skip it and do not count it; it warms the producer's and the worker's
backends and code paths), then waits DELAY seconds (default 1).
Prints one JSON line: {"sent", "secs", "rate", "enqueue_ms_p50", "enqueue_ms_p99"}.
"""

import asyncio
import json
import sys
import threading
import time


WARM = json.dumps({"i": -1})  # a warm-up job: no "t", the handlers skip it


def _pace(n: int, rate: float, senders: list) -> dict:
    """K threads (one connection each) share the schedule: thread k sends jobs
    k, k + K, ... (psycopg releases the GIL while it waits on the server)."""
    for send in senders:
        send(WARM)
    time.sleep(DELAY)
    took: list = []
    t0 = time.time()

    def run(k: int) -> None:
        send = senders[k]
        for i in range(k, n, len(senders)):
            due = t0 + i / rate
            now = time.time()
            if due > now:
                time.sleep(due - now)
            t = time.time()
            send(json.dumps({"t": t, "i": i}))
            took.append(time.time() - t)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(senders))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return _stats(n, time.time() - t0, took)


async def _apace(n: int, rate: float, senders: list) -> dict:
    """As _pace, with K tasks."""
    for send in senders:
        await send(WARM)
    await asyncio.sleep(DELAY)
    took: list = []
    t0 = time.time()

    async def run(k: int) -> None:
        send = senders[k]
        for i in range(k, n, len(senders)):
            due = t0 + i / rate
            now = time.time()
            if due > now:
                await asyncio.sleep(due - now)
            t = time.time()
            await send(json.dumps({"t": t, "i": i}))
            took.append(time.time() - t)

    await asyncio.gather(*(run(k) for k in range(len(senders))))
    return _stats(n, time.time() - t0, took)


K = 8  # producer connections
DELAY = 1.0


def _stats(n: int, secs: float, took: list) -> dict:
    took.sort()
    return {
        "sent": n,
        "secs": round(secs, 3),
        "rate": round(n / secs),
        "enqueue_ms_p50": round(took[len(took) // 2] * 1000, 3),
        "enqueue_ms_p99": round(took[int(len(took) * 0.99)] * 1000, 3),
    }


def main() -> None:
    system, dsn, queue, rate, secs = sys.argv[1:6]
    global DELAY
    DELAY = float(sys.argv[6]) if len(sys.argv) > 6 else 1.0
    rate_f = float(rate)
    n = int(rate_f * float(secs))
    if system in ("pgque", "graphile"):
        import psycopg

        sql = {
            "pgque": "SELECT pgque.enqueue(%s, 'noop', %s::jsonb)",
            "graphile": "SELECT graphile_worker.add_job(%s, %s::json)",
        }[system]
        name = queue if system == "pgque" else "noop"
        conns = [psycopg.connect(dsn, autocommit=True) for _ in range(K)]
        try:
            out = _pace(n, rate_f, [lambda a, c=c: c.execute(sql, (name, a), prepare=True) for c in conns])
        finally:
            for c in conns:
                c.close()
    elif system == "pgqueuer":
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        async def go() -> dict:
            conns = [await asyncpg.connect(dsn=_uri(dsn)) for _ in range(K)]
            qs = [Queries(AsyncpgDriver(c)) for c in conns]
            try:
                return await _apace(n, rate_f, [lambda a, q=q: q.enqueue(["noop"], [a.encode()], [0]) for q in qs])
            finally:
                for c in conns:
                    await c.close()

        out = asyncio.run(go())
    elif system == "procrastinate":
        import procrastinate as pc

        app = pc.App(connector=pc.PsycopgConnector(conninfo=dsn, min_size=K, max_size=K))

        @app.task(name="noop", queue=queue)
        async def noop(t: float, i: int) -> None:
            pass

        async def go() -> dict:
            async with app.open_async():
                return await _apace(n, rate_f, [lambda a: noop.defer_async(**json.loads(a))] * K)

        out = asyncio.run(go())
    else:
        raise SystemExit(f"unknown system {system}")
    print(json.dumps(out), flush=True)


def _uri(dsn: str) -> str:
    kv = dict(p.split("=", 1) for p in dsn.split())
    return f"postgresql://{kv['user']}@/{kv['dbname']}?host={kv['host']}&port={kv['port']}"


if __name__ == "__main__":
    main()
