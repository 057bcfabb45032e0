"""The asyncio Worker against a real server: plain and exactly-once async
handlers, retries, lease loss and cancellation, the drain on a stop event and
on SIGTERM. Each test runs its own event loop with asyncio.run."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

import pgque_client as pq
from pgque_client import aio
from pgque_client._features import features
from conftest import job_states, wait_until


def _table(conn: psycopg.Connection[Any], name: str) -> str:
    t = f"afx_{name}"
    conn.execute(sql.SQL("CREATE TABLE {} (job_id bigint NOT NULL, attempt int)").format(sql.Identifier(t)))
    return t


def _effects(conn: psycopg.Connection[Any], table: str) -> dict[int, int]:
    q = sql.SQL("SELECT job_id, count(*)::int FROM {} GROUP BY job_id").format(sql.Identifier(table))
    return dict(conn.execute(q).fetchall())


async def _insert(tx: psycopg.AsyncConnection[Any], table: str, job: aio.Job) -> None:
    await tx.execute(
        sql.SQL("INSERT INTO {} (job_id, attempt) VALUES (%s, %s)").format(sql.Identifier(table)),
        (job.id, job.attempt),
    )


async def _until(pred, timeout: float, what: str) -> None:
    """Polls a sync predicate without blocking the loop (it runs in a thread)."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(pred):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


def test_async_handlers_run_once_with_outputs_and_retries(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    n = 200
    ids = [e.job_id for e in pq.enqueue_many(conn, name, [("work", {"i": i}) for i in range(n)])]
    flaky = pq.enqueue(conn, name, "flaky", {})
    seen: collections.Counter[int] = collections.Counter()
    active = [0, 0]

    async def main() -> list[aio.Worker]:
        workers = [aio.Worker(dsn, name, concurrency=4, poll_interval=0.2, handle_signals=False) for _ in range(2)]
        for w in workers:

            @w.handler("work")
            async def work(job: aio.Job) -> Any:
                seen[job.id] += 1
                active[0] += 1
                active[1] = max(active[1], active[0])
                await asyncio.sleep(0.01)
                active[0] -= 1
                return {"i": job.args["i"]}

            @w.handler("flaky")
            async def flaky_h(job: aio.Job) -> Any:
                if job.attempt == 1:
                    raise ValueError("boom on the first attempt")
                return "ok"

        stop = asyncio.Event()
        runs = [asyncio.create_task(w.run(stop)) for w in workers]
        await _until(lambda: job_states(conn, name) == {"completed": n + 1}, 60, "every job completed")
        stop.set()
        await asyncio.gather(*runs)
        return workers

    workers = asyncio.run(main())
    assert len(seen) == n and set(seen.values()) == {1}
    assert active[1] == 8, f"expected 8 handlers at once, saw {active[1]}"
    assert sum(w.completed for w in workers) == n + 1 and sum(w.failed for w in workers) == 1
    assert conn.execute("SELECT output FROM pgque.get_job(%s)", (ids[3],)).fetchone()[0] == {"i": 3}
    errs = conn.execute("SELECT errors::text FROM pgque.get_job(%s)", (flaky,)).fetchone()[0]
    assert "ValueError: boom on the first attempt" in errs


def test_async_exactly_once_effects_commit_with_the_completion(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    table = _table(conn, name)
    n = 100
    ids = [e.job_id for e in pq.enqueue_many(conn, name, [("work", {"i": i}) for i in range(n)])]
    boom = pq.enqueue(conn, name, "boom", {}, max_attempts=1)

    async def main() -> aio.Worker:
        w = aio.Worker(dsn, name, concurrency=4, poll_interval=0.2, handle_signals=False)

        @w.handler("work")
        async def work(job: aio.Job, tx: psycopg.AsyncConnection[Any]) -> Any:
            await _insert(tx, table, job)
            return {"i": job.args["i"]}

        @w.handler("boom")
        async def boom_h(job: aio.Job, tx: psycopg.AsyncConnection[Any]) -> Any:
            await _insert(tx, table, job)
            raise RuntimeError("after the insert")

        stop = asyncio.Event()
        run = asyncio.create_task(w.run(stop))
        await _until(lambda: job_states(conn, name) == {"completed": n, "failed": 1}, 60, "all finished")
        stop.set()
        await run
        return w

    w = asyncio.run(main())
    fx = _effects(conn, table)
    assert sorted(fx) == sorted(ids) and set(fx.values()) == {1}
    assert boom not in fx
    assert (w.completed, w.failed, w.lost) == (n, 1, 0)
    assert conn.execute("SELECT output FROM pgque.get_job(%s)", (ids[5],)).fetchone()[0] == {"i": 5}


def test_async_lease_lost_and_cancel_roll_the_effects_back(dsn, conn, name):
    """Two jobs on a 1 s lease without heartbeats: the slow worker sleeps
    past it, a fast worker takes both over and completes them; then a third
    job is cancelled while its handler runs. Only the completed attempts'
    effects remain."""
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    conn.execute("SELECT pgque.set_job_queue_config(%s, 'max_attempts', '10')", (name,))
    table = _table(conn, name)
    ids = [e.job_id for e in pq.enqueue_many(conn, name, [("slow", {}), ("slow", {})])]

    async def main() -> tuple[aio.Worker, aio.Worker]:
        kw: dict[str, Any] = dict(poll_interval=0.1, handle_signals=False, lease=1.0, heartbeat_interval=3600)
        slow_w = aio.Worker(dsn, name, concurrency=2, **kw)
        fast_w = aio.Worker(dsn, name, concurrency=2, **kw)
        release = asyncio.Event()

        @slow_w.handler("slow")
        async def slow(job: aio.Job, tx: psycopg.AsyncConnection[Any]) -> None:
            await _insert(tx, table, job)
            await asyncio.sleep(3.0)

        @slow_w.handler("cancel_me")
        async def cancel_me(job: aio.Job, tx: psycopg.AsyncConnection[Any]) -> Any:
            await _insert(tx, table, job)
            await release.wait()
            return {"should": "not be recorded"}

        @fast_w.handler("slow")
        async def fast(job: aio.Job, tx: psycopg.AsyncConnection[Any]) -> None:
            await _insert(tx, table, job)

        stop_slow, stop_fast = asyncio.Event(), asyncio.Event()
        r1 = asyncio.create_task(slow_w.run(stop_slow))
        await _until(lambda: job_states(conn, name).get("running") == 2, 10, "the slow worker holds both")
        r2 = asyncio.create_task(fast_w.run(stop_fast))
        await _until(lambda: fast_w.completed == 2, 30, "the rescued jobs completed by the fast worker")
        await _until(lambda: slow_w.lost == 2, 30, "the slow worker's completions refused")
        stop_fast.set()
        await r2
        jid = await asyncio.to_thread(pq.enqueue, conn, name, "cancel_me", {})
        await _until(lambda: job_states(conn, name).get("running") == 1, 10, "the cancel_me job running")
        assert (await asyncio.to_thread(lambda: conn.execute("SELECT pgque.cancel(%s)", (jid,)).fetchone()))[0]
        release.set()
        await _until(lambda: slow_w.lost == 3, 10, "the cancelled job's completion refused")
        stop_slow.set()
        await r1
        ids.append(jid)
        return slow_w, fast_w

    slow_w, fast_w = asyncio.run(main())
    assert slow_w.completed == 0 and fast_w.completed == 2
    assert job_states(conn, name) == {"completed": 2, "cancelled": 1}
    fx = _effects(conn, table)
    assert sorted(fx) == sorted(ids[:2]) and set(fx.values()) == {1}, fx
    rows = conn.execute(sql.SQL("SELECT DISTINCT attempt FROM {}").format(sql.Identifier(table))).fetchall()
    assert rows == [(2,)]


def test_async_stop_event_drains_and_hands_back_past_the_timeout(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    table = _table(conn, name)
    quick = [e.job_id for e in pq.enqueue_many(conn, name, [("quick", {}) for _ in range(3)])]
    stuck = pq.enqueue(conn, name, "stuck", {})

    async def main() -> aio.Worker:
        w = aio.Worker(dsn, name, concurrency=4, poll_interval=0.2, shutdown_timeout=0.5, handle_signals=False)
        started = asyncio.Event()

        @w.handler("quick")
        async def quick_h(job: aio.Job, tx: psycopg.AsyncConnection[Any]) -> None:
            await started.wait()
            await asyncio.sleep(0.2)  # finishes inside the drain
            await _insert(tx, table, job)

        @w.handler("stuck")
        async def stuck_h(job: aio.Job, tx: psycopg.AsyncConnection[Any]) -> None:
            await _insert(tx, table, job)
            started.set()
            await asyncio.sleep(60)  # cancelled at the end of the drain

        stop = asyncio.Event()
        run = asyncio.create_task(w.run(stop))
        await asyncio.wait_for(started.wait(), 10)
        stop.set()
        await asyncio.wait_for(run, 30)
        return w

    w = asyncio.run(main())
    assert w.completed == 3
    st = conn.execute("SELECT state, attempt FROM pgque.get_job(%s)", (stuck,)).fetchone()
    assert st[0] in ("ready", "scheduled"), st
    assert sorted(_effects(conn, table)) == sorted(quick), "the handed-back job's insert was rolled back"


def test_async_sigterm_mid_batch_loses_nothing(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    table = _table(conn, name)
    n = 40
    ids = [e.job_id for e in pq.enqueue_many(conn, name, [("slow", {}) for _ in range(n)])]
    script = os.path.join(os.path.dirname(__file__), "sigterm_aio_worker.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))

    def start() -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, script, dsn, name, table], stdout=subprocess.PIPE, text=True, env=env)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return p

    p = start()
    wait_until(lambda: len(_effects(conn, table)) >= 8, 30, 0.02, "some jobs done")
    running = job_states(conn, name).get("running", 0)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0, out
    assert running > 0
    st = job_states(conn, name)
    assert st.get("running", 0) == 0, st
    assert st.get("completed", 0) == len(_effects(conn, table)) < n
    p = start()
    wait_until(lambda: job_states(conn, name) == {"completed": n}, 60, 0.1, "the rest after a restart")
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    assert p.returncode == 0
    fx = _effects(conn, table)
    assert sorted(fx) == sorted(ids) and set(fx.values()) == {1}


def test_async_progress_missing_handler_and_unknown_queue(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    jid = pq.enqueue(conn, name, "calc", {"x": 20})
    orphan = pq.enqueue(conn, name, "no_handler_for_this", {}, max_attempts=1)
    seen: dict[str, Any] = {}

    async def main() -> None:
        w = aio.Worker(dsn, name, concurrency=2, poll_interval=0.2, handle_signals=False)

        @w.handler("calc")
        async def calc(job: aio.Job) -> Any:
            try:
                seen["progress"] = await job.progress({"pct": 50})
            except pq.errors.ServerFeatureMissing:
                seen["progress"] = "missing"
            return {"y": job.args["x"] * 2}

        stop = asyncio.Event()
        run = asyncio.create_task(w.run(stop))
        await _until(lambda: job_states(conn, name) == {"completed": 1, "failed": 1}, 30, "both finished")
        stop.set()
        await run
        bad = aio.Worker(dsn, ["no_such_" + name], handle_signals=False)
        try:
            await asyncio.wait_for(bad.run(), 30)
        except pq.errors.UndefinedObject:
            seen["unknown"] = True

    asyncio.run(main())
    assert seen["unknown"] is True
    f = features(conn)
    assert seen["progress"] == (True if f.progress else "missing")
    if f.outputs:
        assert conn.execute("SELECT output FROM pgque.get_job(%s)", (jid,)).fetchone()[0] == {"y": 40}
    st = conn.execute("SELECT state, errors::text FROM pgque.get_job(%s)", (orphan,)).fetchone()
    assert st[0] == "failed" and "no handler for job kind" in st[1]
