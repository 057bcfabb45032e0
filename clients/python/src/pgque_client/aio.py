"""The asyncio side: the producers on a ``psycopg.AsyncConnection`` (the same
calls, in its transaction, with the same SQL), and ``Worker``, the job
worker with async handlers (``async def h(job)``, or ``async def h(job, tx)``
for exactly-once handlers)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from . import _otel, _sql
from ._aio_worker import Job, Worker
from ._features import afeatures
from ._sql import Enqueued, FlowJob, IdemSend
from .errors import translated

__all__ = ["Worker", "Job", "enqueue", "enqueue_many", "enqueue_flow", "send", "send_batch", "send_idem", "send_at"]


async def _one(conn: psycopg.AsyncConnection[Any], q: _sql.Query) -> Any:
    with translated():
        cur = await conn.execute(q[0], q[1])
        return await cur.fetchone()


async def _all(conn: psycopg.AsyncConnection[Any], q: _sql.Query) -> list[Any]:
    with translated():
        cur = await conn.execute(q[0], q[1])
        return await cur.fetchall()


async def enqueue(conn: psycopg.AsyncConnection[Any], queue: str, kind: str, args: Any = None, **options: Any) -> int | None:
    """As pgque_client.enqueue."""
    f = await afeatures(conn)
    with _otel.send_span(queue) as headers:
        _otel.with_headers(f.params.get("enqueue", {}), options, headers)
        row = await _one(conn, _sql.enqueue_query(f, queue, kind, args, options))
    return None if row is None else row[0]


async def enqueue_many(
    conn: psycopg.AsyncConnection[Any],
    queue: str,
    jobs: Sequence[tuple[str, Any] | Mapping[str, Any]],
    on_duplicate: str | None = None,
) -> list[Enqueued]:
    """As pgque_client.enqueue_many."""
    if not jobs:
        return []
    f = await afeatures(conn)
    with _otel.send_span(queue, len(jobs)) as headers:
        rows = await _all(conn, _sql.enqueue_many_query(f, queue, jobs, on_duplicate, headers))
    return [Enqueued(r[0], r[1]) for r in rows]


async def enqueue_flow(conn: psycopg.AsyncConnection[Any], queue: str, jobs: Iterable[Mapping[str, Any]]) -> list[FlowJob]:
    """As pgque_client.enqueue_flow."""
    flow = list(jobs)
    f = await afeatures(conn)
    with _otel.send_span(queue, len(flow)) as headers:
        rows = await _all(conn, _sql.enqueue_flow_query(f, queue, flow, headers))
    return [FlowJob(r[0], r[1], r[2]) for r in rows]


async def _event_headers(
    conn: psycopg.AsyncConnection[Any], explicit: Mapping[str, str] | None, traced: dict[str, str] | None
) -> Mapping[str, str] | None:
    if explicit is None and traced is None:
        return None
    return _sql.event_headers(await afeatures(conn), explicit, traced)


async def send(conn: psycopg.AsyncConnection[Any], queue: str, payload: Any, type: str | None = None,
               partition_key: str | None = None, headers: Mapping[str, str] | None = None) -> int:  # fmt: skip
    """As pgque_client.send."""
    with _otel.send_span(queue) as traced:
        h = await _event_headers(conn, headers, traced)
        return (await _one(conn, _sql.send_query(queue, payload, type, partition_key, h)))[0]


async def send_batch(conn: psycopg.AsyncConnection[Any], queue: str, payloads: Sequence[Any], type: str | None = None,
                     partition_keys: Sequence[str | None] | None = None,
                     headers: Mapping[str, str] | None = None) -> list[int]:  # fmt: skip
    """As pgque_client.send_batch."""
    with _otel.send_span(queue, len(payloads)) as traced:
        h = await _event_headers(conn, headers, traced)
        return list((await _one(conn, _sql.send_batch_query(queue, payloads, type, partition_keys, h)))[0])


async def send_idem(conn: psycopg.AsyncConnection[Any], queue: str, type: str, payload: Any, idem_key: str,
                    ttl: timedelta | str = timedelta(hours=1), partition_key: str | None = None,
                    headers: Mapping[str, str] | None = None) -> IdemSend:  # fmt: skip
    """As pgque_client.send_idem."""
    with _otel.send_span(queue) as traced:
        h = await _event_headers(conn, headers, traced)
        r = await _one(conn, _sql.send_idem_query(queue, type, payload, idem_key, ttl, partition_key, h))
    return IdemSend(r[0], r[1])


async def send_at(conn: psycopg.AsyncConnection[Any], queue: str, type: str, payload: Any, deliver_at: datetime,
                  partition_key: str | None = None, headers: Mapping[str, str] | None = None) -> int:  # fmt: skip
    """As pgque_client.send_at."""
    with _otel.send_span(queue) as traced:
        h = await _event_headers(conn, headers, traced)
        return (await _one(conn, _sql.send_at_query(queue, type, payload, deliver_at, partition_key, h)))[0]
