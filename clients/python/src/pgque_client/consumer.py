"""Event consumers: a plain ``Consumer`` (receive / ack / nack; on a server
with the waiting receive it waits for its batch inside the server, on an
older one it is woken by the queue's tick NOTIFY) and a
``PartitionedConsumer`` whose M worker threads cover N slots with the
``claim_next_slot`` loop, so every slot is polled.

Delivery is at least once: a batch is acked only after its handler calls
returned, and a batch interrupted by a crash, a stop or a lost slot lease is
delivered again (the same batch) to whoever reads that consumer or slot next.
A handler that raises nacks its message (retried after ``retry_after``, to the
dead-letter queue after the queue's max_retries); the nacks and the ack of one
batch commit together.

Exactly-once handlers: a handler that takes two arguments,
``def handle(message, tx)`` (or ``transactional=True``), is called inside the
transaction that acks the batch: its effects, the batch's nacks and its ack
commit together or not at all. Each call runs in a savepoint, so a handler
that raises takes back only its own effects and nacks its message. For a
partitioned consumer the ack is fenced by the slot lease: a worker that lost
its slot gets 55000 from ``ack_partitioned``, which rolls the batch's effects
back (the new owner gets the same batch).
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from . import _otel
from ._features import features
from ._listen import Listener
from .worker import wants_transaction
from .errors import InvalidParameterValue, NumericValueOutOfRange, PgqueError, SlotLost, WrongState, translated

log = logging.getLogger("pgque_client")


@dataclass(frozen=True)
class Message:
    """One event, with PgQue's ``pgque.message`` fields."""

    msg_id: int
    batch_id: int
    type: str
    payload: str | None
    retry_count: int | None
    created_at: datetime
    extra1: str | None
    extra2: str | None
    extra3: str | None
    extra4: str | None
    # The event's headers (W3C trace context), read only while OpenTelemetry
    # is active on a server with event headers; None otherwise.
    headers: dict[str, str] | None = None

    @property
    def partition_key(self) -> str | None:
        """The partition key (it rides extra1)."""
        return self.extra1

    def json(self) -> Any:
        """The payload decoded as JSON."""
        return None if self.payload is None else json.loads(self.payload)


MessageHandler = Callable[..., Any]
"""``fn(message)`` (plain) or ``fn(message, tx)`` (its effects commit with the batch's ack)."""

_MSG_COLS = "msg_id, batch_id, type, payload, retry_count, created_at, extra1, extra2, extra3, extra4"
_MSG_ROW = (
    "ROW(%s::bigint, %s::bigint, %s::text, %s::text, %s::int4, %s::timestamptz, "
    "%s::text, %s::text, %s::text, %s::text)::pgque.message"
)


def _msg_params(m: Message) -> tuple[Any, ...]:
    return (
        m.msg_id, m.batch_id, m.type, m.payload, m.retry_count, m.created_at,
        m.extra1, m.extra2, m.extra3, m.extra4,
    )  # fmt: skip


# An empty waiting receive quicker than this did not sleep in the server.
_AT_ONCE = 0.02


def _seconds(v: float | timedelta) -> float:
    return v.total_seconds() if isinstance(v, timedelta) else float(v)


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:1000]


class _Runner:
    """What both consumers share: the stop flag, the tick wake-ups, signals."""

    def __init__(self, dsn: str, queue: str, poll_interval: float, handle_signals: bool,
                 connect_kwargs: dict[str, Any] | None, handler: MessageHandler,
                 transactional: bool | None):  # fmt: skip
        self.dsn = dsn
        self.handler = handler
        self.transactional = wants_transaction(handler, transactional)
        self.queue = queue
        self.poll_interval = poll_interval
        self.handle_signals = handle_signals
        self.connect_kwargs = connect_kwargs or {}
        self._stopping = threading.Event()
        self._cond = threading.Condition()
        self._gen = 0
        # False once the server turned out to lack the *_with_headers
        # receives (42883, a 0.7 schema): the plain ones from then on.
        self._server_headers = True
        # The connection whose waiting receive is in flight (stop() cancels
        # it), under _wait_lock.
        self._waiting: psycopg.Connection[Any] | None = None
        self._wait_lock = threading.Lock()

    def stop(self) -> None:
        """Asks run() to finish the batches in hand and return. Any thread."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        with self._wait_lock:
            waiting = self._waiting is not None
        if waiting:
            threading.Thread(target=self._cancel_wait, name="pgque-cancel", daemon=True).start()

    def _cancel_wait(self) -> None:
        """Cancels the waiting receive in flight, again every 0.2 s until it
        returned: a cancel request that reaches the server before the
        statement does is dropped there. Each cancel is sent under
        _wait_lock, which the receiving thread takes before its next
        statement, so a cancel never lands on the ack that follows."""
        while True:
            with self._wait_lock:
                conn = self._waiting
                if conn is None:
                    return
                try:
                    conn.cancel_safe(timeout=2.0)
                except Exception as e:  # noqa: BLE001 - the wait ends by itself at its end
                    log.warning("pgque consumer: cancelling the waiting receive: %s", e)
            time.sleep(0.2)

    def _wake(self) -> None:
        with self._cond:
            self._gen += 1
            self._cond.notify_all()

    def _wait_tick(self, gen: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._stopping.is_set() or self._gen != gen, self.poll_interval)

    def _call(self, conn: psycopg.Connection[Any], m: Message, failed: list[tuple[Message, str]]) -> None:
        """Runs the handler for one message, in a ``process <queue>`` span when
        OpenTelemetry is installed; a transactional one in a savepoint of the
        batch's transaction on ``conn``. An exception is recorded in
        ``failed`` (the message is nacked) and on the span."""
        try:
            with _otel.event_span(self.queue, self.consumer, m.msg_id, m.type, m.retry_count, m.headers):
                if self.transactional:
                    with conn.transaction():
                        self.handler(m, conn)
                else:
                    self.handler(m)
        except Exception as e:  # noqa: BLE001 - a failing handler nacks its event
            failed.append((m, _reason(e)))

    def _receive(
        self, conn: psycopg.Connection[Any], fn: str, args: tuple[Any, ...], headers: bool = True
    ) -> list[Message]:
        """One batch from ``pgque.<fn>(args)``. While OpenTelemetry is active
        (docs/tracing.md) from its ``_with_headers`` twin, which adds the
        events' headers (unless ``headers`` is false); a server without it
        (42883) is remembered and read with ``fn`` itself from then on."""
        marks = ", ".join(["%s"] * len(args))
        if headers and self._server_headers and _otel.active():
            try:
                with translated():
                    rows = conn.execute(
                        f"SELECT {_MSG_COLS}, headers FROM pgque.{fn}_with_headers({marks})", args
                    ).fetchall()
                return [Message(*r) for r in rows]
            except PgqueError as e:
                if e.sqlstate != "42883":
                    raise
                self._server_headers = False
        with translated():
            rows = conn.execute(f"SELECT {_MSG_COLS} FROM pgque.{fn}({marks})", args).fetchall()
        return [Message(*r) for r in rows]

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True, **self.connect_kwargs)

    def _receive_waiting(
        self, conn: psycopg.Connection[Any], args: tuple[Any, ...], wait: timedelta, headers: bool
    ) -> list[Message]:
        """The waiting ``receive(*args, wait)`` on ``conn`` (autocommit: a
        transaction that has written would not sleep), cancellable by
        stop(); empty when stop() cancelled it or came first."""
        with self._wait_lock:
            self._waiting = conn
        try:
            if self._stopping.is_set():
                return []
            try:
                return self._receive(conn, "receive", (*args, wait), headers)
            except psycopg.errors.QueryCanceled:
                if self._stopping.is_set():
                    return []
                raise
        finally:
            with self._wait_lock:
                self._waiting = None

    def _listener(self) -> Listener:
        return Listener(self.dsn, [f"pgque_{self.queue}"], self._wake, self.connect_kwargs)

    def _install_signals(self) -> Callable[[], None]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None

        def on_signal(signum: int, frame: Any) -> None:
            self._stopping.set()
            threading.Thread(target=self.stop, daemon=True).start()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore


class Consumer(_Runner):
    """Reads ``queue`` as ``consumer`` and calls ``handler(message)`` per event.

    ``subscribe=True`` subscribes the consumer first (a no-op when it is).
    ``run()`` blocks until ``stop()`` or SIGTERM / SIGINT (in the main thread);
    the batch in hand is finished and acked first. A ``handler(message, tx)``
    (or ``transactional=True``) runs in the transaction that acks its batch
    (a savepoint per message): its writes commit with the ack.

    ``subconsumer="member-1"`` makes it one member of the cooperative
    consumer ``consumer`` (``pgque.receive_coop``; ``dead_interval``: also
    take over the open batch of a member idle that long): the members share
    the consumer's stream, each batch to one of them. ``run()`` registers
    the member (``register_subconsumer``) when ``subscribe``; a normal
    consumer of that name is not converted (55000).

    Waiting: on a server with the waiting receive (pgque 0.9,
    docs/waits.md) ``run()`` loops on ``pgque.receive(..., wait)``, which
    sleeps inside the server until the consumer has a batch, for at most
    ``wait`` seconds (default 5; the server caps it at ``pgque.max_wait``, and
    the client at half the session's ``statement_timeout``): a new event
    arrives within a few milliseconds, with no LISTEN connection (so it
    works through transaction-mode poolers). ``stop()`` cancels the
    waiting statement, so run() returns at once. On an older server, with
    ``wait=None`` (or 0), and for a cooperative member (no waiting
    ``receive_coop`` yet) it LISTENs for the queue's tick NOTIFY and polls
    every ``poll_interval``, as before; also when the server turns out not
    to sleep (``pgque.max_wait = 0``, a REPEATABLE READ default isolation).
    ``server_waits`` says which of the two the running consumer does."""

    def __init__(
        self,
        dsn: str,
        queue: str,
        consumer: str,
        handler: MessageHandler,
        *,
        subconsumer: str | None = None,
        dead_interval: float | timedelta | None = None,
        batch_size: int = 100,
        poll_interval: float | timedelta = 2.0,
        retry_after: float | timedelta = 60.0,
        subscribe: bool = True,
        handle_signals: bool = True,
        connect_kwargs: dict[str, Any] | None = None,
        transactional: bool | None = None,
        wait: float | timedelta | None = 5.0,
    ):
        super().__init__(dsn, queue, _seconds(poll_interval), handle_signals, connect_kwargs, handler, transactional)
        self.consumer = consumer
        self.batch_size = batch_size
        self.retry_after = timedelta(seconds=_seconds(retry_after))
        self.subscribe = subscribe
        self.subconsumer = subconsumer
        self.dead_interval = None if dead_interval is None else timedelta(seconds=_seconds(dead_interval))
        w = None if wait is None else _seconds(wait)
        if w is not None and (w < 0 or not math.isfinite(w)):
            raise ValueError(f"wait must be a finite number of seconds >= 0 (or None), not {wait!r}")
        self.wait = w or None
        # True while run() waits inside the server (the waiting receive),
        # False while it LISTENs and polls (after run(): what it last did).
        self.server_waits = False
        self.handled = 0

    def run(self) -> None:
        restore = self._install_signals()
        listener = self._listener()
        try:
            with self._connect() as conn:
                if self.subscribe:
                    with translated():
                        if self.subconsumer is None:
                            conn.execute("SELECT pgque.subscribe(%s, %s)", (self.queue, self.consumer))
                        else:
                            conn.execute(
                                "SELECT pgque.register_subconsumer(%s, %s, %s)",
                                (self.queue, self.consumer, self.subconsumer),
                            )
                wait = self._server_wait(conn)
                self.server_waits = wait is not None
                if not self.server_waits:
                    listener.start()
                while not self._stopping.is_set():
                    if wait is not None:
                        t0 = time.monotonic()
                        if (not self.run_once(conn, wait=wait) and time.monotonic() - t0 < _AT_ONCE
                                and not self._stopping.is_set()):  # fmt: skip
                            log.warning(
                                "pgque consumer %s: the waiting receive returned at once (pgque.max_wait = 0, or "
                                "a REPEATABLE READ / SERIALIZABLE default isolation?); LISTEN and poll from now on",
                                self.consumer,
                            )
                            wait = None
                            self.server_waits = False
                            listener.start()
                        continue
                    with self._cond:
                        gen = self._gen
                    if not self.run_once(conn):
                        self._wait_tick(gen)
        finally:
            listener.close()
            restore()
            self._stopping.clear()

    def _server_wait(self, conn: psycopg.Connection[Any]) -> timedelta | None:
        """The wait of run()'s waiting receives, or None when run() LISTENs:
        ``wait`` not set, a cooperative member, a server without the
        waiting receive. Half the session's statement_timeout at most, so
        that a wait ends before the timeout cancels it."""
        if self.wait is None or self.subconsumer is not None or not features(conn).receive_wait:
            return None
        row = conn.execute(
            "SELECT setting::int8 FROM pg_catalog.pg_settings WHERE name = 'statement_timeout'"
        ).fetchone()
        w = self.wait
        if row is not None and row[0] > 0:
            w = min(w, row[0] / 2000)
        return timedelta(seconds=w)

    def run_once(self, conn: psycopg.Connection[Any], wait: timedelta | None = None) -> int:
        """Receives one batch, handles it, acks it; returns its size (0: none).
        With ``wait`` (a server with the waiting receive; not for a
        cooperative member) the receive waits that long inside the server
        for a batch; ``conn`` must then be outside a transaction that has
        written (autocommit), or it does not sleep."""
        if self.subconsumer is None and wait is not None:
            args = (self.queue, self.consumer, self.batch_size)
            msgs = self._receive_waiting(conn, args, wait, features(conn).receive_with_headers_wait)
        elif self.subconsumer is None:
            msgs = self._receive(conn, "receive", (self.queue, self.consumer, self.batch_size))
        elif wait is not None:
            raise ValueError("a cooperative member has no waiting receive (receive_coop); call run_once without wait")
        else:
            args = (self.queue, self.consumer, self.subconsumer, self.batch_size, self.dead_interval)
            msgs = self._receive(conn, "receive_coop", args)
        if not msgs:
            return 0
        failed: list[tuple[Message, str]] = []
        if not self.transactional:
            for m in msgs:
                self._call(conn, m, failed)
        with translated(), conn.transaction():
            if self.transactional:
                for m in msgs:
                    self._call(conn, m, failed)
            for m, why in failed:
                conn.execute(
                    f"SELECT pgque.nack(%s::bigint, {_MSG_ROW}, %s::interval, %s::text)",
                    (m.batch_id, *_msg_params(m), self.retry_after, why),
                )
            conn.execute("SELECT pgque.ack(%s::bigint)", (msgs[0].batch_id,))
        self.handled += len(msgs)
        return len(msgs)


class PartitionedConsumer(_Runner):
    """Reads ``queue`` as partitioned consumer ``consumer`` over ``n`` slots
    with ``workers`` threads (any ratio to n), each looping
    claim_next_slot -> receive_partitioned -> handler -> ack_partitioned ->
    release_slot, so the slot that has waited longest is always served next
    and no slot is left unpolled (an unpolled slot pins the queue's rotation).

    A worker keeps a slot while its batches are non-empty (at most
    ``max_batches_per_claim``), renewing the lease between messages once a
    third of ``ttl`` has passed; if the lease was taken over meanwhile it
    stops processing that slot at once, without acking (the new owner gets
    the same batch). Events of one key arrive in order, on one worker at a
    time. When a worker finds a whole round of slots idle it sleeps until
    the next tick's NOTIFY or ``poll_interval``.

    With a transactional handler (``handler(message, tx)``) a batch's
    handler calls, nacks and fenced ack run in one transaction; the lease
    renewals between messages go through a second connection of the worker
    thread, so they take effect at once rather than at that commit.

    ``failure_policy`` is the consumer's, chosen at its first subscribe
    (docs/partition-keys.md, "Failure policy"): ``"skip"`` (a failed event
    comes back after its key's later ones) or ``"pause"`` (the key's later
    events wait until it is acked or dead-lettered; ``on_dead_letter``
    ``"resume"`` or ``"block"``). With ``"pause"`` a worker skips a key's
    remaining events of a batch once the handler failed on one of them:
    the server holds them back and redelivers them after the failed one.

    The consumer follows an online resize of N (docs/partition-keys.md,
    "Resizing N online") without a restart: ``n`` is only the N it
    subscribes with (a consumer resized since keeps its new N); a worker
    whose calls are refused because N changed (22023), or that is handed a
    slot beyond the N it knows, re-reads N from the server and goes on with
    the new slots (``self.n`` follows it)."""

    def __init__(
        self,
        dsn: str,
        queue: str,
        consumer: str,
        n: int,
        handler: MessageHandler,
        workers: int = 1,
        *,
        ttl: float | timedelta = 30.0,
        batch_size: int = 100,
        poll_interval: float | timedelta = 2.0,
        retry_after: float | timedelta = 60.0,
        max_batches_per_claim: int = 16,
        subscribe: bool = True,
        worker_id: str | None = None,
        handle_signals: bool = True,
        connect_kwargs: dict[str, Any] | None = None,
        transactional: bool | None = None,
        failure_policy: str = "skip",
        on_dead_letter: str = "resume",
    ):
        super().__init__(dsn, queue, _seconds(poll_interval), handle_signals, connect_kwargs, handler, transactional)
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if failure_policy not in ("skip", "pause"):
            raise ValueError(f"failure_policy must be 'skip' or 'pause', not {failure_policy!r}")
        if on_dead_letter not in ("resume", "block"):
            raise ValueError(f"on_dead_letter must be 'resume' or 'block', not {on_dead_letter!r}")
        self.failure_policy = failure_policy
        self.on_dead_letter = on_dead_letter
        self.consumer = consumer
        self.n = n
        self.workers = workers
        self.ttl = max(1.0, _seconds(ttl))
        self.batch_size = batch_size
        self.retry_after = timedelta(seconds=_seconds(retry_after))
        self.max_batches_per_claim = max_batches_per_claim
        self.subscribe = subscribe
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.handled = 0
        self.lost_slots = 0
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []

    def worker_name(self, i: int) -> str:
        """The lease owner name of worker thread ``i``."""
        return f"{self.worker_id}/{i}"

    def run(self) -> None:
        restore = self._install_signals()
        listener = self._listener()
        try:
            if self.subscribe:
                with self._connect() as conn:
                    n = self.n
                    try:
                        with translated():
                            if (self.failure_policy, self.on_dead_letter) == ("skip", "resume"):
                                conn.execute(
                                    "SELECT pgque.subscribe_partitioned(%s, %s, %s)",
                                    (self.queue, self.consumer, self.n),
                                )
                            else:
                                conn.execute(
                                    "SELECT pgque.subscribe_partitioned(%s, %s, %s, %s, %s)",
                                    (self.queue, self.consumer, self.n, self.failure_policy, self.on_dead_letter),
                                )
                    except InvalidParameterValue:
                        # Subscribed already with another N (resized since):
                        # follow the server's.
                        if self._refresh_n(conn) == n:
                            raise
            listener.start()
            threads = [
                threading.Thread(target=self._worker, args=(i,), name=f"pgque-slot-{i}", daemon=True)
                for i in range(self.workers)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            listener.close()
            restore()
            self._stopping.clear()
        if self._errors:
            raise self._errors[0]

    def _worker(self, i: int) -> None:
        wid = self.worker_name(i)
        ttl = timedelta(seconds=self.ttl)
        idle = 0
        conn: psycopg.Connection[Any] | None = None
        side: psycopg.Connection[Any] | None = None
        try:
            while not self._stopping.is_set():
                if conn is None or conn.closed:
                    conn = self._connect()
                if self.transactional and (side is None or side.closed):
                    side = self._connect()
                with self._cond:
                    gen = self._gen
                try:
                    with translated():
                        row = conn.execute(
                            "SELECT slot, epoch FROM pgque.claim_next_slot(%s, %s, %s, %s::interval)",
                            (self.queue, self.consumer, wid, ttl),
                        ).fetchone()
                    if row is None:
                        # Every slot is held by a live lease of another worker.
                        self._wait_tick(gen)
                        continue
                    slot, epoch = row
                    if slot >= self.n:
                        # A slot of a bigger N: the consumer was resized.
                        self._refresh_n(conn)
                    got = self._serve_slot(conn, side or conn, wid, slot, epoch, ttl)
                except SlotLost as e:
                    log.info("pgque consumer %s: %s", wid, e)
                    with self._lock:
                        self.lost_slots += 1
                    continue
                except psycopg.OperationalError as e:
                    log.warning("pgque consumer %s: %s; reconnecting", wid, e)
                    conn.close()
                    if side is not None:
                        side.close()
                    self._stopping.wait(1.0)
                    continue
                idle = 0 if got else idle + 1
                if idle >= max(1, math.ceil(self.n / self.workers)):
                    idle = 0
                    self._wait_tick(gen)
        except BaseException as e:  # noqa: BLE001 - surfaced by run()
            log.exception("pgque consumer %s failed", wid)
            with self._lock:
                self._errors.append(e)
            self.stop()
        finally:
            if conn is not None:
                conn.close()
            if side is not None:
                side.close()

    def _serve_slot(
        self, conn: psycopg.Connection[Any], side: psycopg.Connection[Any], wid: str, slot: int, epoch: int,
        ttl: timedelta,
    ) -> int:  # fmt: skip
        """Drains up to max_batches_per_claim batches of a claimed slot, then
        releases it. Returns the number of events handled. SlotLost when the
        lease was taken over (nothing acked, the slot is not released).
        Lease renewals run on ``side`` (``conn`` itself for plain handlers)."""
        args = (self.queue, self.consumer, slot, self.n, wid)
        renewed = time.monotonic()
        total = 0
        for _ in range(self.max_batches_per_claim):
            if self._stopping.is_set():
                break
            try:
                msgs = self._receive(conn, "receive_partitioned", (*args, self.batch_size))
            except WrongState as e:
                raise SlotLost(f"slot {slot}: lease lost before receive ({e})") from e
            except (InvalidParameterValue, NumericValueOutOfRange) as e:
                raise self._resized(conn, slot, e, args[3], wid) from e
            renewed = time.monotonic()
            if not msgs:
                break
            failed: list[tuple[Message, str]] = []

            def handle_all() -> None:
                nonlocal epoch, renewed
                # pause: a key whose event failed in this batch is skipped
                # from there on (its later events come back after it).
                blocked: set[str] = set()
                for m in msgs:
                    if m.partition_key is not None and m.partition_key in blocked:
                        continue
                    if time.monotonic() - renewed > self.ttl / 3:
                        epoch = self._renew(side, wid, slot, epoch, ttl)
                        renewed = time.monotonic()
                    before = len(failed)
                    self._call(conn, m, failed)
                    if self.failure_policy == "pause" and len(failed) > before and m.partition_key is not None:
                        blocked.add(m.partition_key)

            if not self.transactional:
                handle_all()
            try:
                with translated(), conn.transaction():
                    if self.transactional:
                        handle_all()
                    for m, why in failed:
                        conn.execute(
                            f"SELECT pgque.nack_partitioned(%s, %s, %s, %s, %s, {_MSG_ROW}, %s::interval, %s::text)",
                            (*args, *_msg_params(m), self.retry_after, why),
                        )
                    conn.execute("SELECT pgque.ack_partitioned(%s, %s, %s, %s, %s)", args)
            except WrongState as e:
                raise SlotLost(f"slot {slot}: lease lost before ack ({e})") from e
            except (InvalidParameterValue, NumericValueOutOfRange) as e:
                raise self._resized(conn, slot, e, args[3], wid) from e
            renewed = time.monotonic()
            total += len(msgs)
            with self._lock:
                self.handled += len(msgs)
        try:
            with translated():
                conn.execute("SELECT pgque.release_slot(%s, %s, %s, %s)", (self.queue, self.consumer, slot, wid))
        except (InvalidParameterValue, NumericValueOutOfRange) as e:
            # A resize between the last batch and this release (a shrink
            # leaves the slot out of range: 22003) is a lost slot, as in receive.
            raise self._resized(conn, slot, e, args[3], wid) from e
        return total

    def _refresh_n(self, conn: psycopg.Connection[Any]) -> int:
        """Re-reads the consumer's N from the server (after a resize) into
        ``self.n``; returns it."""
        with translated():
            row = conn.execute(
                "SELECT n FROM pgque.partition_slot_status WHERE queue_name = %s AND consumer = %s LIMIT 1",
                (self.queue, self.consumer),
            ).fetchone()
        if row is not None:
            with self._lock:
                self.n = int(row[0])
        return self.n

    def _resized(self, conn: psycopg.Connection[Any], slot: int, e: Exception, used: int, wid: str) -> Exception:
        """A fenced call refused for the N it passed (``used``): when the
        server's N differs, the consumer was resized (the batch, not acked,
        is redelivered on the key's new slot); SlotLost, and the worker goes
        on with the new N. Otherwise the error itself. ``used``, not
        ``self.n``: another worker thread may have refreshed N already. The
        slot is given back (when no batch is open): claim_next_slot does not
        hand a worker its own lease, so a kept one would hold the slot's keys
        back until its ttl."""
        before = used
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        if self._refresh_n(conn) != before:
            try:
                self._release_quietly(conn, slot, wid)
            except PgqueError:
                pass  # not ours any more: the cutover ended every lease
            return SlotLost(f"slot {slot}: consumer resized from {before} to {self.n} slots")
        return e

    def _renew(self, conn: psycopg.Connection[Any], wid: str, slot: int, epoch: int, ttl: timedelta) -> int:
        """Renews the slot lease; returns its epoch, or raises SlotLost when
        another worker took it over."""
        with translated():
            got = conn.execute(
                "SELECT pgque.claim_slot(%s, %s, %s, %s, %s::interval)",
                (self.queue, self.consumer, slot, wid, ttl),
            ).fetchone()
        # The same epoch: renewed. epoch + 1: it had lapsed and nobody took
        # it in between (a take-over would have made that epoch its own), so
        # the batch is still ours. Anything else: another worker held the
        # slot; stop here.
        if got is None or got[0] is None or got[0] not in (epoch, epoch + 1):
            if got is not None and got[0] is not None:
                self._release_quietly(conn, slot, wid)
            raise SlotLost(f"slot {slot}: lease taken over (epoch {epoch} -> {got and got[0]})")
        return int(got[0])

    def _release_quietly(self, conn: psycopg.Connection[Any], slot: int, wid: str) -> None:
        try:
            with translated():
                conn.execute("SELECT pgque.release_slot(%s, %s, %s, %s)", (self.queue, self.consumer, slot, wid))
        except WrongState:
            pass  # an open batch: the lease lapses after its ttl and the batch is redelivered
