"""One cell of the client benchmark (benches/clients/run.sh) for a Python
system, on the server run.sh starts. Prints one JSON line.

    bench_py.py SYSTEM DSN drain N           drain a backlog of N trivial jobs
    bench_py.py SYSTEM DSN rate RATE SECS    latency at a fixed enqueue rate
    bench_py.py SYSTEM DSN eo HANDLER N      exactly-once cost (pgque, pgque_aio)

SYSTEM: pgque (pgque_client.Worker, threads), pgque_aio (pgque_client.aio.Worker),
pgqueuer, procrastinate. Every system gets 50 concurrent handlers and fetches
in batches of up to 50 where it can, with a 0.5 s poll fallback behind its
LISTEN.

drain: the backlog is enqueued with the system's own bulk call (not timed);
the clock runs from the worker's start until the last job is done; prints
{"system", "jobs", "secs", "jobs_per_s"}.

rate: produce.py (another process) enqueues RATE jobs/s for SECS s, each
job's args carrying the wall-clock time just before its enqueue; each handler
records (its start - that time). Prints {"system", "target", "achieved",
"received", "p50_ms", "p99_ms", "enqueue_ms_p50"}.

eo: a drain of N jobs whose handler is `noop` (nothing), `plain` (inserts one
row into bench_effects on a connection of its own, autocommit: at least once)
or `tx` (the exactly-once handler `def h(job, tx)`: the same insert through
the transaction the job completes in). Prints the drain's line plus
{"handler"}; checks that bench_effects holds exactly one row per job.
"""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import psycopg

CONC = 50
POLL = 0.5
HERE = os.path.dirname(os.path.abspath(__file__))
LABEL = {
    "pgque": "pgque Worker (Python)",
    "pgque_aio": "pgque aio.Worker (Python)",
    "pgqueuer": "pgqueuer (Python)",
    "procrastinate": "Procrastinate (Python)",
}
EFFECTS_SQL = "INSERT INTO bench_effects (queue, job_id) VALUES (%s, %s)"


# ---- helpers -----------------------------------------------------------------
def producer(system: str, dsn: str, queue: str, rate: float, secs: float) -> subprocess.Popen:
    """Starts produce.py in its own process (its GIL and CPU are not the worker's)."""
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "produce.py"), system, dsn, queue, str(rate), str(secs)],
        stdout=subprocess.PIPE,
        text=True,
    )


def rate_line(system: str, rate: float, lat: list, prod: subprocess.Popen) -> dict:
    out, _ = prod.communicate(timeout=120)
    p = json.loads(out.strip().splitlines()[-1])
    lat = sorted(lat)
    q = lambda f: round(lat[min(len(lat) - 1, int(len(lat) * f))] * 1000, 2) if lat else None  # noqa: E731
    return {
        "system": LABEL[system],
        "mode": "rate",
        "target": rate,
        "achieved": p["rate"],
        "sent": p["sent"],
        "received": len(lat),
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "enqueue_ms_p50": p["enqueue_ms_p50"],
    }


def new_pgque_queue(dsn: str, n: int) -> str:
    import pgque_client as pq

    queue = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pgque.create_job_queue(%s)", (queue,))
        for i in range(0, n, 1000):
            pq.enqueue_many(c, queue, [("noop", {"i": j}) for j in range(i, min(n, i + 1000))])
    return queue


def check_pgque(dsn: str, queue: str, effects: int | None = None) -> None:
    with psycopg.connect(dsn) as c:
        left = c.execute(
            "SELECT count(*) FROM pgque.all_jobs WHERE queue = %s AND state <> 'completed'", (queue,)
        ).fetchone()[0]
        assert left == 0, f"{left} jobs not completed"
        if effects is not None:
            rows, distinct = c.execute(
                "SELECT count(*), count(DISTINCT job_id) FROM bench_effects WHERE queue = %s", (queue,)
            ).fetchone()
            assert rows == distinct == effects, (rows, distinct, effects)


def effects_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS bench_effects (queue text NOT NULL, job_id bigint NOT NULL)")


# ---- pgque, sync Worker (threads) ----------------------------------------------
def pgque(dsn: str, mode: str, a: list) -> dict:
    import pgque_client as pq

    lock = threading.Lock()
    if mode == "rate":
        rate, secs = float(a[0]), float(a[1])
        n = int(rate * secs)
        queue = new_pgque_queue(dsn, 0)
        w = pq.Worker(dsn, [queue], concurrency=CONC, poll_interval=POLL, handle_signals=False)
        lat: list = []

        @w.handler("noop")
        def noop(job):
            if "t" not in job.args:
                return  # produce.py's warm-up job
            d = time.time() - job.args["t"]
            with lock:
                lat.append(d)
                if len(lat) == n:
                    w.stop()

        prod = producer("pgque", dsn, queue, rate, secs)
        guard = threading.Timer(secs + 60, w.stop)
        guard.start()
        w.run()
        guard.cancel()
        return rate_line("pgque", rate, lat, prod)

    handler = a[0] if mode == "eo" else "noop"
    n = int(a[1] if mode == "eo" else a[0])
    queue = new_pgque_queue(dsn, n)
    if handler != "noop":
        effects_table(dsn)
    done = [0]
    w = pq.Worker(dsn, [queue], concurrency=CONC, poll_interval=POLL, handle_signals=False)

    def count() -> None:
        with lock:
            done[0] += 1
            if done[0] == n:
                w.stop()

    local = threading.local()
    conns: list = []
    if handler == "noop":

        @w.handler("noop")
        def h_noop(job):
            count()

    elif handler == "plain":

        @w.handler("noop")
        def h_plain(job):
            c = getattr(local, "c", None)
            if c is None:  # one connection per handler thread, opened on first use (as the tx pool)
                c = local.c = psycopg.connect(dsn, autocommit=True)
                with lock:
                    conns.append(c)
            c.execute(EFFECTS_SQL, (queue, job.id))
            count()

    else:

        @w.handler("noop")
        def h_tx(job, tx):
            tx.execute(EFFECTS_SQL, (queue, job.id))
            count()

    t0 = time.perf_counter()
    w.run()  # returns after the last completion was sent
    t = time.perf_counter() - t0
    for c in conns:
        c.close()
    check_pgque(dsn, queue, None if handler == "noop" else n)
    return drain_line("pgque", n, t, handler if mode == "eo" else None)


# ---- pgque, aio.Worker -----------------------------------------------------------
def pgque_aio(dsn: str, mode: str, a: list) -> dict:
    from pgque_client import aio

    async def main() -> dict:
        if mode == "rate":
            rate, secs = float(a[0]), float(a[1])
            n = int(rate * secs)
            queue = new_pgque_queue(dsn, 0)
            w = aio.Worker(dsn, [queue], concurrency=CONC, poll_interval=POLL, handle_signals=False)
            lat: list = []

            @w.handler("noop")
            async def noop(job):
                if "t" not in job.args:
                    return  # produce.py's warm-up job
                lat.append(time.time() - job.args["t"])
                if len(lat) == n:
                    w.stop()

            prod = producer("pgque", dsn, queue, rate, secs)
            asyncio.get_running_loop().call_later(secs + 60, w.stop)
            await w.run()
            return rate_line("pgque_aio", rate, lat, prod)

        handler = a[0] if mode == "eo" else "noop"
        n = int(a[1] if mode == "eo" else a[0])
        queue = new_pgque_queue(dsn, n)
        if handler != "noop":
            effects_table(dsn)
        done = [0]
        w = aio.Worker(dsn, [queue], concurrency=CONC, poll_interval=POLL, handle_signals=False)

        def count() -> None:
            done[0] += 1
            if done[0] == n:
                w.stop()

        idle: list = []
        opened: list = []
        if handler == "noop":

            @w.handler("noop")
            async def h_noop(job):
                count()

        elif handler == "plain":

            @w.handler("noop")
            async def h_plain(job):
                # a connection per running handler, opened on first need (as the tx pool)
                c = idle.pop() if idle else None
                if c is None:
                    c = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
                    opened.append(c)
                try:
                    await c.execute(EFFECTS_SQL, (queue, job.id))
                finally:
                    idle.append(c)
                count()

        else:

            @w.handler("noop")
            async def h_tx(job, tx):
                await tx.execute(EFFECTS_SQL, (queue, job.id))
                count()

        t0 = time.perf_counter()
        await w.run()
        t = time.perf_counter() - t0
        for c in opened:
            await c.close()
        check_pgque(dsn, queue, None if handler == "noop" else n)
        return drain_line("pgque_aio", n, t, handler if mode == "eo" else None)

    return asyncio.run(main())


# ---- pgqueuer ----------------------------------------------------------------------
def pgqueuer(dsn: str, mode: str, a: list) -> dict:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    async def main() -> dict:
        conn = await asyncpg.connect(dsn=_uri(dsn))
        q = Queries(AsyncpgDriver(conn))
        if not await q.schema_is_installed():
            await q.install()
        await conn.execute("TRUNCATE pgqueuer")
        wconn = await asyncpg.connect(dsn=_uri(dsn))
        qm = QueueManager(Queries(AsyncpgDriver(wconn)))
        if mode == "rate":
            rate, secs = float(a[0]), float(a[1])
            n = int(rate * secs)
            lat: list = []

            @qm.entrypoint("noop")
            async def noop(job) -> None:
                a = json.loads(job.payload)
                if "t" not in a:
                    return  # produce.py's warm-up job
                lat.append(time.time() - a["t"])
                if len(lat) == n:
                    qm.shutdown.set()

            prod = producer("pgqueuer", dsn, "noop", rate, secs)
            asyncio.get_running_loop().call_later(secs + 60, qm.shutdown.set)
            await qm.run(batch_size=CONC, dequeue_timeout=_td(POLL))
            await conn.close()
            return rate_line("pgqueuer", rate, lat, prod)

        n = int(a[0])
        for i in range(0, n, 1000):
            k = min(n, i + 1000) - i
            await q.enqueue(["noop"] * k, [None] * k, [0] * k)

        @qm.entrypoint("noop")
        async def noop_d(job) -> None:
            pass

        t0 = time.perf_counter()
        await qm.run(batch_size=CONC, mode=QueueExecutionMode.drain, dequeue_timeout=_td(POLL))
        t = time.perf_counter() - t0
        left = await conn.fetchval("SELECT count(*) FROM pgqueuer")
        assert left == 0, left
        await conn.close()
        return drain_line("pgqueuer", n, t, None)

    return asyncio.run(main())


# ---- Procrastinate -------------------------------------------------------------------
def procrastinate(dsn: str, mode: str, a: list) -> dict:
    import procrastinate as pc

    app = pc.App(connector=pc.PsycopgConnector(conninfo=dsn))
    lat: list = []
    state = {"n": 0, "stop": None}

    @app.task(name="noop", queue="bench")
    async def noop(i: int, t: float = 0.0) -> None:
        if t:
            lat.append(time.time() - t)
            if len(lat) == state["n"]:
                state["stop"].set()

    async def main() -> dict:
        async with app.open_async():
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
                have = await (await c.execute("SELECT to_regclass('procrastinate_jobs')")).fetchone()
                if have[0] is None:
                    await app.schema_manager.apply_schema_async()
                await c.execute("TRUNCATE procrastinate_jobs CASCADE")
            if mode == "rate":
                rate, secs = float(a[0]), float(a[1])
                state["n"] = int(rate * secs)
                state["stop"] = asyncio.Event()
                prod = producer("procrastinate", dsn, "bench", rate, secs)
                task = asyncio.create_task(
                    app.run_worker_async(
                        queues=["bench"],
                        concurrency=CONC,
                        fetch_job_polling_interval=POLL,
                        install_signal_handlers=False,
                        delete_jobs="never",
                    )
                )
                try:
                    await asyncio.wait_for(state["stop"].wait(), secs + 60)
                except asyncio.TimeoutError:
                    pass
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping the worker
                    pass
                return rate_line("procrastinate", rate, lat, prod)
            n = int(a[0])
            for i in range(0, n, 1000):
                await noop.batch_defer_async(*[{"i": j} for j in range(i, min(n, i + 1000))])
            t0 = time.perf_counter()
            await app.run_worker_async(
                queues=["bench"], concurrency=CONC, wait=False, fetch_job_polling_interval=POLL, delete_jobs="never"
            )
            t = time.perf_counter() - t0
            async with await psycopg.AsyncConnection.connect(dsn) as c:
                left = await (
                    await c.execute("SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'")
                ).fetchone()
            assert left[0] == 0, left
            return drain_line("procrastinate", n, t, None)

    return asyncio.run(main())


def drain_line(system: str, n: int, secs: float, handler: str | None) -> dict:
    d = {"system": LABEL[system], "mode": "eo" if handler else "drain", "jobs": n, "secs": round(secs, 3), "jobs_per_s": round(n / secs)}
    if handler:
        d["handler"] = handler
    return d


def _td(s: float):
    from datetime import timedelta

    return timedelta(seconds=s)


def _uri(dsn: str) -> str:
    kv = dict(p.split("=", 1) for p in dsn.split())
    return f"postgresql://{kv['user']}@/{kv['dbname']}?host={kv['host']}&port={kv['port']}"


if __name__ == "__main__":
    system, dsn, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    fn = {"pgque": pgque, "pgque_aio": pgque_aio, "pgqueuer": pgqueuer, "procrastinate": procrastinate}[system]
    print(json.dumps(fn(dsn, mode, sys.argv[4:])), flush=True)
