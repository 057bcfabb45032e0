"""One cell of the client benchmark: drain a backlog of N trivial jobs with
one Python worker of one system, on the server of benches/clients/run.sh.

    bench_py.py SYSTEM DSN N     SYSTEM: pgque | pgqueuer | procrastinate

The backlog is enqueued with the system's own bulk call (not timed); the
clock runs from the worker's start until the last job is done; prints one
JSON line {"system", "jobs", "secs", "jobs_per_s"}. Every system gets 50
concurrent handlers and fetches in batches of up to 50 where it can.
"""

import asyncio
import json
import sys
import threading
import time
import uuid

import psycopg

CONC = 50


def pgque(dsn: str, n: int) -> float:
    import pgque_client as pq

    queue = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pgque.create_job_queue(%s)", (queue,))
        for i in range(0, n, 1000):
            pq.enqueue_many(c, queue, [("noop", {"i": j}) for j in range(i, min(n, i + 1000))])
    done = [0]
    lock = threading.Lock()
    w = pq.Worker(dsn, [queue], concurrency=CONC, poll_interval=0.5, handle_signals=False)

    @w.handler("noop")
    def noop(job):
        with lock:
            done[0] += 1
            if done[0] == n:
                w.stop()

    t0 = time.perf_counter()
    w.run()  # returns after the last completion was sent
    t = time.perf_counter() - t0
    with psycopg.connect(dsn) as c:
        left = c.execute(
            "SELECT count(*) FROM pgque.all_jobs WHERE queue = %s AND state <> 'completed'", (queue,)
        ).fetchone()[0]
    assert left == 0, left
    return t


def pgqueuer(dsn: str, n: int) -> float:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    async def main() -> float:
        conn = await asyncpg.connect(dsn=_uri(dsn))
        q = Queries(AsyncpgDriver(conn))
        if not await q.schema_is_installed():
            await q.install()
        await conn.execute("TRUNCATE pgqueuer")
        for i in range(0, n, 1000):
            k = min(n, i + 1000) - i
            await q.enqueue(["noop"] * k, [None] * k, [0] * k)
        wconn = await asyncpg.connect(dsn=_uri(dsn))
        qm = QueueManager(Queries(AsyncpgDriver(wconn)))

        @qm.entrypoint("noop")
        async def noop(job) -> None:
            pass

        t0 = time.perf_counter()
        await qm.run(batch_size=CONC, mode=QueueExecutionMode.drain)
        t = time.perf_counter() - t0
        left = await conn.fetchval("SELECT count(*) FROM pgqueuer")
        assert left == 0, left
        return t

    return asyncio.run(main())


def procrastinate(dsn: str, n: int) -> float:
    import procrastinate as pc

    app = pc.App(connector=pc.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop", queue="bench")
    async def noop(i: int) -> None:
        pass

    async def main() -> float:
        async with app.open_async():
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
                have = await (await c.execute("SELECT to_regclass('procrastinate_jobs')")).fetchone()
            if have[0] is None:
                await app.schema_manager.apply_schema_async()
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
                await c.execute("TRUNCATE procrastinate_jobs CASCADE")
            for i in range(0, n, 1000):
                await noop.batch_defer_async(*[{"i": j} for j in range(i, min(n, i + 1000))])
            t0 = time.perf_counter()
            await app.run_worker_async(queues=["bench"], concurrency=CONC, wait=False, delete_jobs="never")
            t = time.perf_counter() - t0
            async with await psycopg.AsyncConnection.connect(dsn) as c:
                left = await (
                    await c.execute("SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'")
                ).fetchone()
            assert left[0] == 0, left
            return t

    return asyncio.run(main())


def _uri(dsn: str) -> str:
    kv = dict(p.split("=", 1) for p in dsn.split())
    return f"postgresql://{kv['user']}@/{kv['dbname']}?host={kv['host']}&port={kv['port']}"


if __name__ == "__main__":
    system, dsn, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    secs = {"pgque": pgque, "pgqueuer": pgqueuer, "procrastinate": procrastinate}[system](dsn, n)
    print(json.dumps({"system": f"{system} (Python)", "jobs": n, "secs": round(secs, 3), "jobs_per_s": round(n / secs)}))
