"""The job worker: dispatch in batches, run handlers in threads, heartbeat,
complete or fail, and drain gracefully on stop() / SIGTERM / SIGINT.

Threads and connections of a running Worker:

- the caller's thread runs the dispatch loop (``pgque.dispatch`` of up to the
  free handler slots, one statement) and then waits for a NOTIFY on the
  queues' job channels, a freed handler slot, or the poll interval;
- a listener thread with its own connection (LISTEN only);
- ``concurrency`` handler threads;
- a completer thread that sends the finished jobs of each moment in one
  ``complete_many`` (with outputs where the server takes them), and each
  failure as ``fail`` with the error and its traceback;
- a heartbeat thread extending the leases of the jobs still running every
  ``lease / 3``; a job the server leaves out of a heartbeat (cancelled, or its
  lease lost) is flagged on the job (``job.cancelled``).

The completer, the heartbeats and progress reports share one "control"
connection (psycopg serialises calls on a connection); dispatch has its own, so
a dispatch never waits behind a completion.

Exactly-once handlers: a handler that takes two arguments, ``def h(job, tx)``
(or one registered with ``transactional=True``), runs inside a transaction on
a connection of its own. The worker opens it, the handler writes its effects
through ``tx`` (a ``psycopg.Connection`` in that transaction), and the worker
runs ``pgque.complete(job, lease_token[, output])`` in the same transaction
before COMMIT. A completion the server refuses (false: the lease was lost to
the rescue and the job went to another worker, or the job was cancelled or
handed back) rolls the whole transaction back; a handler exception rolls it
back and the job is failed (retried) in a separate transaction.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import queue as _queue
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from . import _otel
from ._features import Features, features
from ._listen import Listener
from .errors import ServerFeatureMissing, translated

log = logging.getLogger("pgque_client")

Handler = Callable[..., Any]
"""``fn(job)`` (plain) or ``fn(job, tx)`` (exactly-once, in the completion's transaction)."""

DISPATCH_SQL = (
    "SELECT job_id, queue, kind, args, priority, attempt, max_attempts, actor, "
    "enqueued_at, lease_token, lease_until "
    "FROM pgque.dispatch(%s::text[], %s::int, %s::text, %s::interval)"
)
# DISPATCH_SQL with the jobs' headers, on a server that has them.
DISPATCH_HEADERS_SQL = DISPATCH_SQL.replace("lease_until ", "lease_until, headers ")


def dispatch_sql(f: Features) -> str:
    """The dispatch statement for the server of ``f``."""
    return DISPATCH_HEADERS_SQL if f.headers else DISPATCH_SQL


# How long a dispatch waits for half the handler slots to free up (see _dispatch_loop).
REFILL_WAIT = 0.02


def _seconds(v: float | timedelta) -> float:
    return v.total_seconds() if isinstance(v, timedelta) else float(v)


def wants_transaction(fn: Callable[..., Any], transactional: bool | None = None) -> bool:
    """Whether ``fn`` is an exactly-once handler: ``transactional`` when given,
    otherwise True when ``fn`` takes exactly two required positional
    parameters (``job, tx``). Used by the sync and the asyncio workers."""
    if transactional is not None:
        return transactional
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = list(sig.parameters.values())
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return False  # ambiguous: say it with transactional=
    required = [p for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]
    return len(required) == 2


def complete_sql(outputs: bool) -> str:
    """The fenced single-job completion a transactional handler's
    transaction ends with (with the output where the server takes one)."""
    if outputs:
        return "SELECT pgque.complete(%s::bigint, %s::bigint, %s::jsonb)"
    return "SELECT pgque.complete(%s::bigint, %s::bigint)"


def complete_params(job: Job, output: str | None, outputs: bool) -> tuple[Any, ...]:
    """The parameters of complete_sql(outputs) for ``job``."""
    return (job.id, job.lease_token, output) if outputs else (job.id, job.lease_token)


def failure_text(e: BaseException) -> str:
    """A handler's exception as a job error: its type, message and traceback."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return f"{type(e).__name__}: {e}\n{tb}"


@dataclass(eq=False)
class Job:
    """A dispatched job, as a handler sees it."""

    id: int
    queue: str
    kind: str
    args: Any
    priority: int
    attempt: int
    max_attempts: int
    actor: str | None
    enqueued_at: datetime
    lease_token: int
    lease_until: datetime
    # What the producer attached (W3C traceparent / tracestate); None: nothing.
    headers: dict[str, str] | None = None
    _worker: Worker | None = field(default=None, repr=False)
    _lost: threading.Event = field(default_factory=threading.Event, repr=False)
    _handed_back: bool = field(default=False, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once a heartbeat left this job out: it was cancelled, or its
        lease was lost to the rescue. Its completion will be refused; a long
        handler should check this and return early."""
        return self._lost.is_set()

    def progress(self, value: Any) -> bool:
        """Reports progress (any JSON value) with ``pgque.set_progress``.
        Returns False when the server refused it (the job was cancelled or its
        lease is stale). Raises ServerFeatureMissing on a server without it."""
        if self._worker is None:
            raise RuntimeError("job is not attached to a worker")
        return self._worker._set_progress(self, value)


class Worker:
    """Runs job handlers for ``queues``.

    >>> w = Worker("dbname=app", ["emails"], concurrency=8)
    >>> @w.handler("welcome")
    ... def welcome(job):
    ...     return {"sent_to": job.args["to"]}
    >>> w.run()  # blocks until w.stop(), SIGTERM or SIGINT  # doctest: +SKIP

    A handler with two parameters, ``def h(job, tx)`` (or registered with
    ``transactional=True``), is exactly-once: it runs in a transaction on a
    connection of the worker, writes its effects through ``tx`` (a
    ``psycopg.Connection`` with the transaction open: use ``tx.execute``, do
    not commit), and the worker completes the job in that same transaction.
    Either the effects and the completion commit together, or neither does
    (a refused completion, an exception, a crash). ``worker.lost`` counts the
    completions the server refused (lease lost, job cancelled), whose effects
    were rolled back.

    A handler's return value becomes the job's output on servers with outputs
    (it must be JSON-serialisable; otherwise the job fails); an exception fails
    the job with its message and traceback, and the server retries it with its
    backoff until ``max_attempts``. A job whose kind has no handler fails.

    Options: ``batch_size`` caps one dispatch (default: ``concurrency``; never
    more than the free handler slots, so no dispatched job waits unheld);
    ``lease`` is asked of dispatch and renewed every ``heartbeat_interval``
    (default lease / 3) while a handler runs; ``poll_interval`` is the fallback
    when no NOTIFY comes; ``shutdown_timeout`` is how long a stop waits for the
    running handlers before it hands their jobs back (``snooze`` to now: the
    attempt is not counted, another worker takes them at once).
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
        self._handlers: dict[str, tuple[Handler, bool]] = {}
        self._tx_idle: list[psycopg.Connection[Any]] = []
        self._tx_lock = threading.Lock()
        self._control_lock = threading.Lock()
        self._cond = threading.Condition()
        self._gen = 0
        self._stopping = threading.Event()
        self._drained = threading.Event()
        self._running: dict[int, Job] = {}
        self._done_q: _queue.Queue[tuple[str, Job, Any] | None] = _queue.Queue()
        self._control: psycopg.Connection[Any] | None = None
        self._features: Features | None = None
        self.completed = 0
        self.failed = 0
        self.lost = 0

    # ---- registration -----------------------------------------------------
    def handler(self, kind: str, *, transactional: bool | None = None) -> Callable[[Handler], Handler]:
        """Decorator: ``@worker.handler("kind")`` registers a handler for a job
        kind; ``fn(job, tx)`` (or ``transactional=True``) makes it exactly-once."""

        def deco(fn: Handler) -> Handler:
            self.register(kind, fn, transactional=transactional)
            return fn

        return deco

    def register(self, kind: str, fn: Handler, *, transactional: bool | None = None) -> None:
        """Registers ``fn`` for ``kind`` (the decorator's plain form)."""
        self._handlers[kind] = (fn, wants_transaction(fn, transactional))

    # ---- control ------------------------------------------------------------
    def stop(self) -> None:
        """Asks run() to drain and return. Callable from any thread; returns at once."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _wake(self) -> None:
        with self._cond:
            self._gen += 1
            self._cond.notify_all()

    # ---- the run loop -------------------------------------------------------
    def run(self) -> None:
        """Dispatches and runs jobs until stop() (or SIGTERM / SIGINT in the
        main thread), then drains: no new dispatch, running handlers get up to
        ``shutdown_timeout`` to finish, the rest are handed back, and every
        finished job's completion is sent before run() returns."""
        self._drained.clear()
        restore = self._install_signals()
        dconn = psycopg.connect(self.dsn, autocommit=True, **self.connect_kwargs)
        self._control = psycopg.connect(self.dsn, autocommit=True, **self.connect_kwargs)
        try:
            self._features = features(self._control)
            listener = Listener(self.dsn, self._channels(dconn), self._wake, self.connect_kwargs)
            listener.start()
            pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="pgque-job")
            completer = threading.Thread(target=self._complete_loop, name="pgque-complete", daemon=True)
            beater = threading.Thread(target=self._heartbeat_loop, name="pgque-heartbeat", daemon=True)
            completer.start()
            beater.start()
            try:
                self._dispatch_loop(dconn, pool)
            finally:
                self._stopping.set()  # also on an error: the other threads end too
                self._drain()
                self._done_q.put(None)
                completer.join()
                beater.join()
                pool.shutdown(wait=False, cancel_futures=True)
                listener.close()
        finally:
            restore()
            dconn.close()
            self._control.close()
            with self._tx_lock:
                idle, self._tx_idle = self._tx_idle, []
            for c in idle:
                c.close()
            self._stopping.clear()

    def _channels(self, conn: psycopg.Connection[Any]) -> list[str]:
        f = features(conn)
        if f.job_channel:
            return [conn.execute("SELECT pgque.job_channel(%s)", (q,)).fetchone()[0] for q in self.queues]  # type: ignore[index]
        return [f"pgque_jobs_{q}" for q in self.queues]

    def _free(self) -> int:
        return self.concurrency - len(self._running)

    def _dispatch_loop(self, conn: psycopg.Connection[Any], pool: ThreadPoolExecutor) -> None:
        lease = timedelta(seconds=self.lease)
        while not self._stopping.is_set():
            with self._cond:
                gen = self._gen
                free = self._free()
            if free <= 0:
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping.is_set() or self._free() > 0, self.poll_interval)
                continue
            low = max(1, min(self.batch_size, self.concurrency) // 2)
            if free < low:
                # Refill in batches: give the running handlers a moment to free
                # half the slots, so short jobs are not dispatched one by one
                # (one round trip each); a slow handler delays a refill by at
                # most REFILL_WAIT.
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping.is_set() or self._free() >= low, REFILL_WAIT)
                    free = self._free()
                if self._stopping.is_set():
                    break
            want = min(free, self.batch_size)
            try:
                with translated():
                    rows = conn.execute(dispatch_sql(self._features), (self.queues, want, self.worker_id, lease)).fetchall()
            except psycopg.OperationalError as e:
                log.warning("pgque worker: dispatch failed (%s); reconnecting", e)
                self._stopping.wait(1.0)
                conn = self._reconnect(conn)
                continue
            for r in rows:
                job = Job(*r, _worker=self)
                with self._cond:
                    self._running[job.id] = job
                pool.submit(self._run_job, job)
            if len(rows) < want:
                # The queues had no more ready jobs: sleep until a NOTIFY (the
                # listener bumps _gen), the poll interval, or stop().
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping.is_set() or self._gen != gen, self.poll_interval)

    def _reconnect(self, conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        try:
            conn.close()
        except psycopg.Error:
            pass
        while not self._stopping.is_set():
            try:
                return psycopg.connect(self.dsn, autocommit=True, **self.connect_kwargs)
            except psycopg.OperationalError as e:
                log.warning("pgque worker: reconnect failed (%s)", e)
                self._stopping.wait(2.0)
        return conn

    # ---- one job ------------------------------------------------------------
    def _run_job(self, job: Job) -> None:
        try:
            entry = self._handlers.get(job.kind)
            if entry is None:
                raise LookupError(f"no handler for job kind {job.kind!r} in worker {self.worker_id}")
            fn, tx = entry
            with _otel.process_span(job.queue, job.id, job.kind, job.attempt, job.headers):
                if tx:
                    outcome = self._run_in_transaction(job, fn)
                else:
                    result = fn(job)
                    out = None if result is None else json.dumps(result)
                    outcome = ("complete", job, out)
        except BaseException as e:  # noqa: BLE001 - every failure of a handler fails its job
            outcome = ("fail", job, failure_text(e))
        if outcome is not None:
            self._done_q.put(outcome)
        with self._cond:
            self._running.pop(job.id, None)
            self._cond.notify_all()

    def _run_in_transaction(self, job: Job, fn: Handler) -> tuple[str, Job, Any] | None:
        """Runs an exactly-once handler: BEGIN, fn(job, tx), the fenced
        complete, COMMIT. Returns the failure to report (None: committed, or
        refused and rolled back). An exception of the handler (or of the
        completion / commit) rolls back and is reported as the job's failure,
        in a separate transaction: the fail is fenced by the same token, so a
        commit that did happen before a lost connection makes it a no-op."""
        assert self._features is not None
        conn = self._take_tx_conn()
        refused = False
        try:
            with conn.transaction():
                result = fn(job, conn)
                out = None if result is None else json.dumps(result)
                with translated():
                    row = conn.execute(
                        complete_sql(self._features.outputs), complete_params(job, out, self._features.outputs)
                    ).fetchone()
                if not (row and row[0]):
                    refused = True
                    raise psycopg.Rollback()
        except BaseException as e:  # noqa: BLE001 - rolled back; the job fails
            self._give_back_tx_conn(conn)
            return ("fail", job, failure_text(e))
        self._give_back_tx_conn(conn)
        with self._cond:
            if refused:
                self.lost += 1
            else:
                self.completed += 1
        if refused:
            why = "handed back at shutdown" if job._handed_back else "its lease was lost or it was cancelled"
            log.warning("pgque worker: job %d not completed (%s); its transaction was rolled back", job.id, why)
        return None

    def _take_tx_conn(self) -> psycopg.Connection[Any]:
        with self._tx_lock:
            if self._tx_idle:
                return self._tx_idle.pop()
        return psycopg.connect(self.dsn, autocommit=True, **self.connect_kwargs)

    def _give_back_tx_conn(self, conn: psycopg.Connection[Any]) -> None:
        ok = not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # After the drain run() closes the idle connections: a handler that
        # outlived it (handed back) closes its own.
        if ok and not self._drained.is_set():
            with self._tx_lock:
                if len(self._tx_idle) < self.concurrency:
                    self._tx_idle.append(conn)
                    return
        conn.close()

    # ---- completions --------------------------------------------------------
    def _complete_loop(self) -> None:
        done = False
        while not done:
            item = self._done_q.get()
            batch = []
            if item is None:
                done = True
            else:
                batch.append(item)
            while len(batch) < 1000:
                try:
                    nxt = self._done_q.get_nowait()
                except _queue.Empty:
                    break
                if nxt is None:
                    done = True
                    continue
                batch.append(nxt)
            if batch:
                self._send_outcomes(batch)

    def _send_outcomes(self, batch: list[tuple[str, Job, Any]]) -> None:
        assert self._control is not None and self._features is not None
        oks = [(j, out) for what, j, out in batch if what == "complete" and not j._handed_back]
        fails = [(j, err) for what, j, err in batch if what == "fail" and not j._handed_back]
        try:
            if oks:
                ids = [j.id for j, _ in oks]
                tokens = [j.lease_token for j, _ in oks]
                with translated():
                    if self._features.outputs and any(out is not None for _, out in oks):
                        self._control.execute(
                            "SELECT pgque.complete_many(%s::bigint[], %s::bigint[], %s::jsonb[])",
                            (ids, tokens, [out for _, out in oks]),
                        )
                    else:
                        self._control.execute(
                            "SELECT pgque.complete_many(%s::bigint[], %s::bigint[])", (ids, tokens)
                        )
                self.completed += len(oks)
            for j, err in fails:
                with translated():
                    self._control.execute(
                        "SELECT pgque.fail(%s::bigint, %s::bigint, %s::text)", (j.id, j.lease_token, err)
                    )
                self.failed += 1
        except psycopg.Error as e:
            # The leases of these jobs expire and the server's rescue hands
            # them out again: at-least-once, never lost.
            log.error("pgque worker: could not report %d job outcomes: %s", len(batch), e)
            self._repair_control()

    def _repair_control(self) -> None:
        """Reconnects the control connection if it broke (the completer and
        the heartbeats share it; whichever notices first reconnects)."""
        with self._control_lock:
            if self._control is not None and self._control.closed:
                self._control = self._reconnect(self._control)

    # ---- heartbeats and progress ---------------------------------------------
    def _heartbeat_loop(self) -> None:
        extend = timedelta(seconds=self.lease)
        while not self._stopping.wait(self.heartbeat_interval):
            with self._cond:
                jobs = list(self._running.values())
            if not jobs:
                continue
            try:
                assert self._control is not None
                with translated():
                    rows = self._control.execute(
                        "SELECT job_id FROM pgque.heartbeat(%s::bigint[], %s::bigint[], %s::interval)",
                        ([j.id for j in jobs], [j.lease_token for j in jobs], extend),
                    ).fetchall()
            except psycopg.Error as e:
                log.warning("pgque worker: heartbeat failed: %s", e)
                self._repair_control()
                continue
            alive = {r[0] for r in rows}
            with self._cond:
                for j in jobs:
                    if j.id not in alive and j.id in self._running:
                        j._lost.set()
        # While draining, the jobs still running keep their leases.
        while self._running and not self._drained.is_set():
            with self._cond:
                jobs = list(self._running.values())
            try:
                assert self._control is not None
                self._control.execute(
                    "SELECT job_id FROM pgque.heartbeat(%s::bigint[], %s::bigint[], %s::interval)",
                    ([j.id for j in jobs], [j.lease_token for j in jobs], extend),
                )
            except psycopg.Error:
                pass
            self._drained.wait(self.heartbeat_interval)

    def _set_progress(self, job: Job, value: Any) -> bool:
        assert self._features is not None and self._control is not None
        if not self._features.progress:
            raise ServerFeatureMissing("this server's pgque has no set_progress (progress needs pgque 0.7)")
        with translated():
            row = self._control.execute(
                "SELECT pgque.set_progress(%s::bigint, %s::bigint, %s::jsonb)",
                (job.id, job.lease_token, Jsonb(value)),
            ).fetchone()
        return bool(row and row[0])

    # ---- shutdown ---------------------------------------------------------------
    def _drain(self) -> None:
        """Waits for the running handlers, then hands back what is still running."""
        deadline = time.monotonic() + self.shutdown_timeout
        with self._cond:
            while self._running and time.monotonic() < deadline:
                self._cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            left = list(self._running.values())
        self._drained.set()
        if not left:
            return
        log.warning("pgque worker: handing back %d jobs still running after %.0f s", len(left), self.shutdown_timeout)
        assert self._control is not None
        for j in left:
            j._handed_back = True
            try:
                self._control.execute(
                    "SELECT pgque.snooze(%s::bigint, %s::bigint, now())", (j.id, j.lease_token)
                )
            except psycopg.Error as e:
                log.error("pgque worker: could not hand back job %d: %s", j.id, e)

    def _install_signals(self) -> Callable[[], None]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None
        old = {}

        def on_signal(signum: int, frame: Any) -> None:
            log.info("pgque worker: signal %d, stopping", signum)
            # Not stop() itself: a signal handler must not take locks the
            # interrupted code may hold.
            self._stopping.set()
            threading.Thread(target=self.stop, daemon=True).start()

        for s in (signal.SIGTERM, signal.SIGINT):
            old[s] = signal.signal(s, on_signal)

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore
