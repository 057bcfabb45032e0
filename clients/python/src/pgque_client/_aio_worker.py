"""The asyncio job worker (``pgque_client.aio.Worker``): the sync Worker's
behaviour on ``psycopg.AsyncConnection`` and tasks instead of threads.

Tasks of a running worker, all on the caller's event loop:

- the dispatch loop (``run()`` itself) on its own connection: ``pgque.dispatch``
  of up to the free handler slots, then a wait for a NOTIFY, a freed slot, the
  poll interval or a stop;
- a listener task with its own connection (LISTEN only);
- one task per running job (at most ``concurrency``);
- a completer task sending the finished jobs of each moment in one
  ``complete_many`` (outputs where the server takes them) and each failure as
  ``fail``, and a heartbeat task extending the leases of the running jobs every
  ``lease / 3``; both on the "control" connection;
- exactly-once handlers (``async def h(job, tx)``) run on connections of
  their own (kept for reuse, at most ``concurrency``): BEGIN, the handler, the
  fenced ``pgque.complete``, COMMIT; a refused completion rolls back.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from . import _otel
from ._features import Features, afeatures
from .errors import ServerFeatureMissing, translated
from .worker import REFILL_WAIT, dispatch_sql, _seconds, complete_params, complete_sql, failure_text
from .worker import Job as _SyncJob
from .worker import wants_transaction

log = logging.getLogger("pgque_client")

AsyncHandler = Callable[..., Awaitable[Any] | Any]
"""``async def h(job)`` (plain) or ``async def h(job, tx)`` (exactly-once, ``tx``
an ``AsyncConnection`` in the completion's transaction). A plain function is
accepted too (its result is used as is; it runs on the event loop)."""

HEARTBEAT_SQL = "SELECT job_id FROM pgque.heartbeat(%s::bigint[], %s::bigint[], %s::interval)"


class Job(_SyncJob):
    """A dispatched job, as an async handler sees it (the fields of
    ``pgque_client.Job``; ``progress`` is a coroutine)."""

    _aworker: Worker | None = None

    async def progress(self, value: Any) -> bool:  # type: ignore[override]
        """Reports progress (any JSON value) with ``pgque.set_progress``;
        False when refused (cancelled, stale lease). ServerFeatureMissing on a
        server without it."""
        if self._aworker is None:
            raise RuntimeError("job is not attached to a worker")
        return await self._aworker._set_progress(self, value)


async def _maybe_await(v: Any) -> Any:
    return await v if inspect.isawaitable(v) else v


class Worker:
    """Runs async job handlers for ``queues`` on the running event loop.

    >>> w = Worker("dbname=app", ["emails"], concurrency=8)
    >>> @w.handler("welcome")
    ... async def welcome(job):
    ...     return {"sent_to": job.args["to"]}
    >>> await w.run()  # until w.stop(), the stop event, SIGTERM or SIGINT  # doctest: +SKIP

    The options and the semantics are those of ``pgque_client.Worker``
    (outputs, failures and retries, heartbeats, ``job.cancelled``, the drain
    with ``shutdown_timeout`` and the hand-back). ``run(stop_event)`` also
    stops when ``stop_event`` (an ``asyncio.Event``) is set; SIGTERM and SIGINT
    stop it when ``handle_signals`` and the loop runs in the main thread.

    Exactly-once: ``async def h(job, tx)`` (or ``transactional=True``) gets
    ``tx``, a ``psycopg.AsyncConnection`` with a transaction open; its writes
    and the job's completion commit together, or neither does. ``lost``
    counts the completions the server refused (lease lost, job cancelled,
    handed back), whose effects were rolled back. Handlers still running when
    the drain ends are handed back and their tasks cancelled (a transactional
    one rolls back).
    """

    def __init__(
        self,
        dsn: str,
        queues: Sequence[str] | str,
        concurrency: int = 10,
        *,
        batch_size: int | None = None,
        lease: float | timedelta = 60.0,
        heartbeat_interval: float | timedelta | None = None,
        poll_interval: float | timedelta = 2.0,
        shutdown_timeout: float | timedelta = 30.0,
        worker_id: str | None = None,
        handle_signals: bool = True,
        connect_kwargs: dict[str, Any] | None = None,
    ):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.dsn = dsn
        self.queues = [queues] if isinstance(queues, str) else list(queues)
        if not self.queues:
            raise ValueError("queues must not be empty")
        self.concurrency = concurrency
        self.batch_size = max(1, batch_size or concurrency)
        self.lease = _seconds(lease)
        self.heartbeat_interval = _seconds(heartbeat_interval) if heartbeat_interval else self.lease / 3
        self.poll_interval = _seconds(poll_interval)
        self.shutdown_timeout = _seconds(shutdown_timeout)
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.handle_signals = handle_signals
        self.connect_kwargs = connect_kwargs or {}
        self._handlers: dict[str, tuple[AsyncHandler, bool]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = False
        self._kick: asyncio.Event | None = None
        self._gen = 0
        self._running: dict[int, tuple[Job, asyncio.Task[None]]] = {}
        self._done_q: asyncio.Queue[tuple[str, Job, Any] | None] | None = None
        self._control: psycopg.AsyncConnection[Any] | None = None
        self._features: Features | None = None
        self._tx_idle: list[psycopg.AsyncConnection[Any]] = []
        self.completed = 0
        self.failed = 0
        self.lost = 0

    # ---- registration -----------------------------------------------------
    def handler(self, kind: str, *, transactional: bool | None = None) -> Callable[[AsyncHandler], AsyncHandler]:
        """Decorator: ``@worker.handler("kind")`` registers an async handler;
        ``async def h(job, tx)`` (or ``transactional=True``) is exactly-once."""

        def deco(fn: AsyncHandler) -> AsyncHandler:
            self.register(kind, fn, transactional=transactional)
            return fn

        return deco

    def register(self, kind: str, fn: AsyncHandler, *, transactional: bool | None = None) -> None:
        """Registers ``fn`` for ``kind`` (the decorator's plain form)."""
        self._handlers[kind] = (fn, wants_transaction(fn, transactional))

    # ---- control ------------------------------------------------------------
    def stop(self) -> None:
        """Asks run() to drain and return. Callable from any thread (and
        before run(): run() then returns at once); returns at once."""
        self._stop_requested = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            self._poke()
        else:
            loop.call_soon_threadsafe(self._poke)

    @property
    def stopping(self) -> bool:
        """True once a stop was asked for."""
        return self._stop_requested

    def _poke(self) -> None:
        if self._kick is not None:
            self._kick.set()

    def _notified(self) -> None:
        self._gen += 1
        self._poke()

    async def _wait(self, until: Callable[[], bool], timeout: float) -> None:
        """Waits until ``until()`` or ``timeout`` seconds; re-checked at every
        poke (a NOTIFY, a freed slot, a stop)."""
        assert self._kick is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not until():
            left = deadline - loop.time()
            if left <= 0:
                return
            self._kick.clear()
            if until():
                return
            try:
                await asyncio.wait_for(self._kick.wait(), left)
            except asyncio.TimeoutError:
                return

    # ---- the run loop -------------------------------------------------------
    async def run(self, stop_event: asyncio.Event | None = None) -> None:
        """Dispatches and runs jobs until stop(), ``stop_event`` is set, or
        SIGTERM / SIGINT, then drains: no new dispatch, running handlers get
        ``shutdown_timeout`` to finish, the rest are handed back (and their
        tasks cancelled), and every finished job's outcome is sent before
        run() returns."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._kick = asyncio.Event()
        self._done_q = asyncio.Queue()
        restore = self._install_signals(loop)
        watcher = asyncio.create_task(self._watch(stop_event)) if stop_event is not None else None
        dconn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, **self.connect_kwargs)
        self._control = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, **self.connect_kwargs)
        listener: asyncio.Task[None] | None = None
        completer: asyncio.Task[None] | None = None
        beater: asyncio.Task[None] | None = None
        drained = asyncio.Event()
        try:
            self._features = await afeatures(self._control)
            channels = await self._channels(dconn)
            ready = asyncio.Event()
            listener = asyncio.create_task(self._listen(channels, ready))
            try:
                await asyncio.wait_for(ready.wait(), 10)
            except asyncio.TimeoutError:
                pass
            completer = asyncio.create_task(self._complete_loop())
            beater = asyncio.create_task(self._heartbeat_loop(drained))
            try:
                await self._dispatch_loop(dconn)
            finally:
                self._stop_requested = True  # also on an error: the other tasks end too
                await self._drain()
                drained.set()
                self._done_q.put_nowait(None)
                await completer
                await beater
        finally:
            for t in (listener, watcher):
                if t is not None:
                    t.cancel()
                    await asyncio.gather(t, return_exceptions=True)
            restore()
            await dconn.close()
            await self._control.close()
            idle, self._tx_idle = self._tx_idle, []
            for c in idle:
                await c.close()
            self._stop_requested = False
            self._loop = None

    async def _watch(self, ev: asyncio.Event) -> None:
        await ev.wait()
        self.stop()

    async def _channels(self, conn: psycopg.AsyncConnection[Any]) -> list[str]:
        assert self._features is not None
        if not self._features.job_channel:
            return [f"pgque_jobs_{q}" for q in self.queues]
        out = []
        for q in self.queues:
            cur = await conn.execute("SELECT pgque.job_channel(%s)", (q,))
            out.append((await cur.fetchone())[0])  # type: ignore[index]
        return out

    async def _listen(self, channels: list[str], ready: asyncio.Event) -> None:
        """LISTENs on the job channels and pokes the dispatch loop on every
        NOTIFY (and after each (re)connect: notifications sent while
        disconnected are gone). Cancelled by run() at the end."""
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, **self.connect_kwargs)
                async with conn:
                    for ch in channels:
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(ch)))
                    ready.set()
                    self._notified()
                    async for _ in conn.notifies():
                        self._notified()
            except psycopg.Error as e:
                log.warning("pgque async listener: %s; reconnecting in 1 s", e)
                ready.set()
                await asyncio.sleep(1.0)

    def _free(self) -> int:
        return self.concurrency - len(self._running)

    async def _dispatch_loop(self, conn: psycopg.AsyncConnection[Any]) -> None:
        lease = timedelta(seconds=self.lease)
        while not self._stop_requested:
            gen = self._gen
            free = self._free()
            if free <= 0:
                await self._wait(lambda: self._stop_requested or self._free() > 0, self.poll_interval)
                continue
            low = max(1, min(self.batch_size, self.concurrency) // 2)
            if free < low:
                # Refill in batches, as the sync worker does.
                await self._wait(lambda: self._stop_requested or self._free() >= low, REFILL_WAIT)
                free = self._free()
                if self._stop_requested:
                    break
            want = min(free, self.batch_size)
            try:
                with translated():
                    cur = await conn.execute(dispatch_sql(self._features), (self.queues, want, self.worker_id, lease))
                    rows = await cur.fetchall()
            except psycopg.OperationalError as e:
                log.warning("pgque async worker: dispatch failed (%s); reconnecting", e)
                await self._wait(lambda: self._stop_requested, 1.0)
                conn = await self._reconnect(conn)
                continue
            for r in rows:
                job = Job(*r)
                job._aworker = self
                entry = self._handlers.get(job.kind)
                task = asyncio.create_task(self._run_job(job, entry), name=f"pgque-job-{job.id}")
                self._running[job.id] = (job, task)
            if len(rows) < want:
                # No more ready jobs: sleep until a NOTIFY, the poll interval or a stop.
                await self._wait(lambda: self._stop_requested or self._gen != gen, self.poll_interval)

    async def _reconnect(self, conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncConnection[Any]:
        try:
            await conn.close()
        except psycopg.Error:
            pass
        while not self._stop_requested:
            try:
                return await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, **self.connect_kwargs)
            except psycopg.OperationalError as e:
                log.warning("pgque async worker: reconnect failed (%s)", e)
                await self._wait(lambda: self._stop_requested, 2.0)
        return conn

    # ---- one job ------------------------------------------------------------
    async def _run_job(self, job: Job, entry: tuple[AsyncHandler, bool] | None) -> None:
        outcome: tuple[str, Job, Any] | None
        try:
            if entry is None:
                raise LookupError(f"no handler for job kind {job.kind!r} in worker {self.worker_id}")
            fn, tx = entry
            with _otel.process_span(job.queue, job.id, job.kind, job.attempt, job.headers):
                if tx:
                    outcome = await self._run_in_transaction(job, fn)
                else:
                    result = await _maybe_await(fn(job))
                    outcome = ("complete", job, None if result is None else json.dumps(result))
        except asyncio.CancelledError:
            outcome = None  # handed back at the end of the drain
        except Exception as e:  # noqa: BLE001 - every failure of a handler fails its job
            outcome = ("fail", job, failure_text(e))
        finally:
            self._running.pop(job.id, None)
            self._poke()
        if outcome is not None and self._done_q is not None:
            self._done_q.put_nowait(outcome)

    async def _run_in_transaction(self, job: Job, fn: AsyncHandler) -> tuple[str, Job, Any] | None:
        """BEGIN, fn(job, tx), the fenced complete, COMMIT on a connection of
        its own. Returns the failure to report (None: committed, or refused
        and rolled back); see the sync worker's twin."""
        assert self._features is not None
        conn = await self._take_tx_conn()
        refused = False
        try:
            async with conn.transaction():
                result = await _maybe_await(fn(job, conn))
                out = None if result is None else json.dumps(result)
                with translated():
                    cur = await conn.execute(
                        complete_sql(self._features.outputs), complete_params(job, out, self._features.outputs)
                    )
                    row = await cur.fetchone()
                if not (row and row[0]):
                    refused = True
                    raise psycopg.Rollback()
        except asyncio.CancelledError:
            await conn.close()  # cancelled mid-statement: the connection's state is unknown
            raise
        except Exception as e:  # noqa: BLE001 - rolled back; the job fails
            await self._give_back_tx_conn(conn)
            return ("fail", job, failure_text(e))
        await self._give_back_tx_conn(conn)
        if refused:
            self.lost += 1
            why = "handed back at shutdown" if job._handed_back else "its lease was lost or it was cancelled"
            log.warning("pgque async worker: job %d not completed (%s); its transaction was rolled back", job.id, why)
        else:
            self.completed += 1
        return None

    async def _take_tx_conn(self) -> psycopg.AsyncConnection[Any]:
        if self._tx_idle:
            return self._tx_idle.pop()
        return await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, **self.connect_kwargs)

    async def _give_back_tx_conn(self, conn: psycopg.AsyncConnection[Any]) -> None:
        ok = not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if ok and len(self._tx_idle) < self.concurrency and not self._stop_requested:
            self._tx_idle.append(conn)
        else:
            await conn.close()

    # ---- completions --------------------------------------------------------
    async def _complete_loop(self) -> None:
        assert self._done_q is not None
        done = False
        while not done:
            item = await self._done_q.get()
            batch = []
            if item is None:
                done = True
            else:
                batch.append(item)
            while len(batch) < 1000 and not self._done_q.empty():
                nxt = self._done_q.get_nowait()
                if nxt is None:
                    done = True
                    continue
                batch.append(nxt)
            if batch:
                await self._send_outcomes(batch)

    async def _send_outcomes(self, batch: list[tuple[str, Job, Any]]) -> None:
        assert self._control is not None and self._features is not None
        oks = [(j, out) for what, j, out in batch if what == "complete" and not j._handed_back]
        fails = [(j, err) for what, j, err in batch if what == "fail" and not j._handed_back]
        try:
            if oks:
                ids = [j.id for j, _ in oks]
                tokens = [j.lease_token for j, _ in oks]
                with translated():
                    if self._features.outputs and any(out is not None for _, out in oks):
                        await self._control.execute(
                            "SELECT pgque.complete_many(%s::bigint[], %s::bigint[], %s::jsonb[])",
                            (ids, tokens, [out for _, out in oks]),
                        )
                    else:
                        await self._control.execute(
                            "SELECT pgque.complete_many(%s::bigint[], %s::bigint[])", (ids, tokens)
                        )
                self.completed += len(oks)
            for j, err in fails:
                with translated():
                    await self._control.execute(
                        "SELECT pgque.fail(%s::bigint, %s::bigint, %s::text)", (j.id, j.lease_token, err)
                    )
                self.failed += 1
        except psycopg.Error as e:
            # Their leases expire and the rescue hands them out again: at least once.
            log.error("pgque async worker: could not report %d job outcomes: %s", len(batch), e)
            await self._repair_control()

    async def _repair_control(self) -> None:
        """Reconnects the control connection if it broke."""
        if self._control is not None and self._control.closed:
            self._control = await self._reconnect(self._control)

    # ---- heartbeats and progress ---------------------------------------------
    async def _heartbeat_loop(self, drained: asyncio.Event) -> None:
        """Extends the leases of the running jobs every heartbeat_interval
        (also while draining), flagging the jobs a heartbeat leaves out."""
        extend = timedelta(seconds=self.lease)
        while not drained.is_set():
            try:
                await asyncio.wait_for(drained.wait(), self.heartbeat_interval)
                return
            except asyncio.TimeoutError:
                pass
            jobs = [j for j, _ in self._running.values()]
            if not jobs:
                continue
            try:
                assert self._control is not None
                with translated():
                    cur = await self._control.execute(
                        HEARTBEAT_SQL, ([j.id for j in jobs], [j.lease_token for j in jobs], extend)
                    )
                    rows = await cur.fetchall()
            except psycopg.Error as e:
                log.warning("pgque async worker: heartbeat failed: %s", e)
                await self._repair_control()
                continue
            alive = {r[0] for r in rows}
            for j in jobs:
                if j.id not in alive and j.id in self._running:
                    j._lost.set()

    async def _set_progress(self, job: Job, value: Any) -> bool:
        assert self._features is not None and self._control is not None
        if not self._features.progress:
            raise ServerFeatureMissing("this server's pgque has no set_progress (progress needs pgque 0.7)")
        with translated():
            cur = await self._control.execute(
                "SELECT pgque.set_progress(%s::bigint, %s::bigint, %s::jsonb)",
                (job.id, job.lease_token, Jsonb(value)),
            )
            row = await cur.fetchone()
        return bool(row and row[0])

    # ---- shutdown ---------------------------------------------------------------
    async def _drain(self) -> None:
        """Waits for the running handlers, then hands back (snooze to now)
        the jobs still running and cancels their tasks."""
        await self._wait(lambda: not self._running, self.shutdown_timeout)
        left = list(self._running.values())
        if not left:
            return
        log.warning(
            "pgque async worker: handing back %d jobs still running after %.0f s", len(left), self.shutdown_timeout
        )
        assert self._control is not None
        for j, _ in left:
            j._handed_back = True
            try:
                await self._control.execute(
                    "SELECT pgque.snooze(%s::bigint, %s::bigint, now())", (j.id, j.lease_token)
                )
            except psycopg.Error as e:
                log.error("pgque async worker: could not hand back job %d: %s", j.id, e)
        for _, t in left:
            t.cancel()
        await asyncio.gather(*(t for _, t in left), return_exceptions=True)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None
        sigs = (signal.SIGTERM, signal.SIGINT)
        try:
            for s in sigs:
                loop.add_signal_handler(s, self.stop)
        except (NotImplementedError, RuntimeError):
            return lambda: None

        def restore() -> None:
            for s in sigs:
                loop.remove_signal_handler(s)

        return restore
