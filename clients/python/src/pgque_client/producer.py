"""Producers: job enqueue and event send on the caller's connection.

Each call is one statement on the connection it is given and runs in that
connection's transaction: nothing is committed here, so a rollback of the
caller's transaction leaves no job and no event (and a job's NOTIFY fires only
at the caller's commit). With an autocommit connection each call commits by
itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from . import _otel, _sql
from ._features import features
from ._sql import Enqueued, FlowJob, IdemSend
from .errors import translated

__all__ = [
    "enqueue",
    "enqueue_many",
    "enqueue_flow",
    "send",
    "send_batch",
    "send_idem",
    "send_at",
    "Enqueued",
    "FlowJob",
    "IdemSend",
]


def enqueue(conn: psycopg.Connection[Any], queue: str, kind: str, args: Any = None, **options: Any) -> int | None:
    """Enqueues one job (``pgque.enqueue``) and returns its id.

    ``options`` are the SQL function's parameters by name: ``priority``,
    ``run_at``, ``actor``, ``fairness_key``, ``identity_key``, ``unique_key``,
    ``max_attempts``, ``on_duplicate`` (and ``depends_on`` on servers with
    flows). A name the server's function does not have raises
    InvalidParameterValue before anything is sent. For a duplicate unique key
    (``on_duplicate='skip'``) the id is that of the job holding the key."""
    f = features(conn)
    with _otel.send_span(queue) as headers:
        _otel.with_headers(f.params.get("enqueue", {}), options, headers)
        q, params = _sql.enqueue_query(f, queue, kind, args, options)
        with translated():
            row = conn.execute(q, params).fetchone()
    return None if row is None else row[0]


def enqueue_many(
    conn: psycopg.Connection[Any],
    queue: str,
    jobs: Sequence[tuple[str, Any] | Mapping[str, Any]],
    on_duplicate: str | None = None,
) -> list[Enqueued]:
    """Enqueues a batch in one statement (``pgque.enqueue_ready_rows``).

    Each job is ``(kind, args)`` or a dict with ``kind``, ``args`` and any of
    ``priority``, ``run_at``, ``actor``, ``fairness_key``, ``identity_key``,
    ``unique_key``, ``max_attempts``. Returns one (job_id, state) per job, in
    input order."""
    if not jobs:
        return []
    f = features(conn)
    with _otel.send_span(queue, len(jobs)) as headers:
        q, params = _sql.enqueue_many_query(f, queue, jobs, on_duplicate, headers)
        with translated():
            rows = conn.execute(q, params).fetchall()
    return [Enqueued(r[0], r[1]) for r in rows]


def enqueue_flow(conn: psycopg.Connection[Any], queue: str, jobs: Iterable[Mapping[str, Any]]) -> list[FlowJob]:
    """Enqueues a flow (``pgque.enqueue_flow``): jobs with ``key``, ``kind``,
    ``args``, ``depends_on`` (keys) and enqueue options, all or nothing.
    In a traced context every job without ``headers`` of its own gets the
    ``send <queue>`` span's trace context (docs/tracing.md).
    Raises ServerFeatureMissing on a server without flows."""
    flow = list(jobs)
    f = features(conn)
    with _otel.send_span(queue, len(flow)) as headers:
        q, params = _sql.enqueue_flow_query(f, queue, flow, headers)
        with translated():
            rows = conn.execute(q, params).fetchall()
    return [FlowJob(r[0], r[1], r[2]) for r in rows]


def _event_headers(
    conn: psycopg.Connection[Any], explicit: Mapping[str, str] | None, traced: dict[str, str] | None
) -> Mapping[str, str] | None:
    # The catalogue is read only when there are headers to pass: an untraced
    # send runs exactly the statement it always did.
    if explicit is None and traced is None:
        return None
    return _sql.event_headers(features(conn), explicit, traced)


def send(
    conn: psycopg.Connection[Any],
    queue: str,
    payload: Any,
    type: str | None = None,
    partition_key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> int:
    """Sends one event (``pgque.send``); returns its id. A ``str`` payload is
    sent as text, anything else as JSON. ``partition_key`` rides extra1.
    ``headers`` (a dict of strings, e.g. W3C ``traceparent``; servers with
    event headers) are stored with the event; in a traced context the
    ``send <queue>`` span's trace context is, unless given (docs/tracing.md)."""
    with _otel.send_span(queue) as traced:
        h = _event_headers(conn, headers, traced)
        q, params = _sql.send_query(queue, payload, type, partition_key, h)
        with translated():
            return conn.execute(q, params).fetchone()[0]  # type: ignore[index]


def send_batch(
    conn: psycopg.Connection[Any],
    queue: str,
    payloads: Sequence[Any],
    type: str | None = None,
    partition_keys: Sequence[str | None] | None = None,
    headers: Mapping[str, str] | None = None,
) -> list[int]:
    """Sends many events in one statement (``pgque.send_batch``); ids aligned
    with ``payloads``. All-``str`` payloads go as text, otherwise as JSON.
    ``headers``: as for send, one object for every event of the batch (in a
    traced context: one ``send <queue>`` span for the batch)."""
    with _otel.send_span(queue, len(payloads)) as traced:
        h = _event_headers(conn, headers, traced)
        q, params = _sql.send_batch_query(queue, payloads, type, partition_keys, h)
        with translated():
            return list(conn.execute(q, params).fetchone()[0])  # type: ignore[index]


def send_idem(
    conn: psycopg.Connection[Any],
    queue: str,
    type: str,
    payload: Any,
    idem_key: str,
    ttl: timedelta | str = timedelta(hours=1),
    partition_key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> IdemSend:
    """At most one event per (queue, idem_key) while the key's window is live
    (``pgque.send_idem``). Returns (event_id, deduped). ``headers``: as for
    send (a deduped send stores nothing, the original keeps its own)."""
    with _otel.send_span(queue) as traced:
        h = _event_headers(conn, headers, traced)
        q, params = _sql.send_idem_query(queue, type, payload, idem_key, ttl, partition_key, h)
        with translated():
            r = conn.execute(q, params).fetchone()
    return IdemSend(r[0], r[1])  # type: ignore[index]


def send_at(
    conn: psycopg.Connection[Any],
    queue: str,
    type: str,
    payload: Any,
    deliver_at: datetime,
    partition_key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> int:
    """Delayed delivery (``pgque.send_at``); returns the event id.
    ``headers``: as for send, kept until the event is delivered."""
    with _otel.send_span(queue) as traced:
        h = _event_headers(conn, headers, traced)
        q, params = _sql.send_at_query(queue, type, payload, deliver_at, partition_key, h)
        with translated():
            return conn.execute(q, params).fetchone()[0]  # type: ignore[index]
