"""SQL of the producer calls, built once for the sync and the async API.

Values are always bound parameters; the only identifiers written into the
statement are parameter names, and only those the server's own function
declares (read from pg_catalog), quoted with ``sql.Identifier``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

from psycopg import sql
from psycopg.types.json import Jsonb

from ._features import Features
from .errors import InvalidParameterValue, ServerFeatureMissing

Query = tuple[sql.Composable, list[Any]]


class Enqueued(NamedTuple):
    """One row of ``enqueue_many``: the job id (the holder's id for a
    ``duplicate``; None when that holder is not yet visible) and its state
    (``ready``, ``scheduled``, ``duplicate``)."""

    job_id: int | None
    state: str


class FlowJob(NamedTuple):
    """One row of ``enqueue_flow``."""

    flow_id: int
    key: str
    job_id: int


class IdemSend(NamedTuple):
    """The result of ``send_idem``: the event id (the original one when
    ``deduped``)."""

    event_id: int
    deduped: bool


def jsonb(value: Any) -> Jsonb:
    """A Python value as a jsonb parameter."""
    return Jsonb(value)


def _named_call(fn: str, params: dict[str, str], values: dict[str, Any]) -> Query:
    parts = []
    args: list[Any] = []
    for name, value in values.items():
        typ = params.get(name)
        if typ is None:
            known = ", ".join(sorted(params))
            raise InvalidParameterValue(
                f"pgque.{fn} has no parameter {name!r} on this server (it has: {known})"
            )
        parts.append(sql.SQL("{} => {}::{}").format(sql.Identifier(name), sql.Placeholder(), sql.SQL(typ)))
        args.append(value)
    q = sql.SQL("SELECT * FROM pgque.{}({})").format(sql.Identifier(fn), sql.SQL(", ").join(parts))
    return q, args


def enqueue_query(f: Features, queue: str, kind: str, args: Any, options: Mapping[str, Any]) -> Query:
    values: dict[str, Any] = {"queue_name": queue, "kind": kind, "args": Jsonb({} if args is None else args)}
    for k, v in options.items():
        if k in values:
            raise InvalidParameterValue(f"{k!r} is given twice")
        if k == "depends_on":
            v = list(v)
        elif k == "headers" and v is not None:
            v = Jsonb(dict(v))
        values[k] = v
    return _named_call("enqueue", f.params.get("enqueue", {}), values)


# Per-job option of enqueue_many -> the array parameter of enqueue_ready_rows.
_MANY = {
    "priority": "priorities",
    "run_at": "run_at",
    "actor": "actors",
    "fairness_key": "fairness_keys",
    "identity_key": "identity_keys",
    "unique_key": "unique_keys",
    "max_attempts": "max_attempts",
    "headers": "headers",
}


def enqueue_many_query(
    f: Features, queue: str, jobs: Sequence[Any], on_duplicate: str | None, headers: dict[str, str] | None = None
) -> Query:
    """``headers``: trace context for every job of the batch that has none of
    its own (ignored by a server without job headers)."""
    kinds: list[str] = []
    argv: list[Jsonb] = []
    cols: dict[str, list[Any]] = {}
    for i, job in enumerate(jobs):
        if isinstance(job, Mapping):
            job = dict(job)
            kind = job.pop("kind", None)
            a = job.pop("args", None)
            opts = job
        else:
            kind, a = job
            opts = {}
        kinds.append(kind)
        argv.append(Jsonb({} if a is None else a))
        for k, v in opts.items():
            if k not in _MANY:
                raise InvalidParameterValue(
                    f"job {i}: unknown option {k!r} for enqueue_many (known: {', '.join(sorted(_MANY))})"
                )
            if k == "headers" and v is not None:
                v = Jsonb(dict(v))
            cols.setdefault(k, [None] * len(jobs))[i] = v
    if headers is not None and "headers" in f.params.get("enqueue_ready_rows", {}):
        col = cols.setdefault("headers", [None] * len(jobs))
        for i, h in enumerate(col):
            if h is None:
                col[i] = Jsonb(headers)
    values: dict[str, Any] = {"queue_name": queue, "kinds": kinds, "args": argv}
    for k, col in cols.items():
        values[_MANY[k]] = col
    if on_duplicate is not None:
        values["on_duplicate"] = on_duplicate
    q, params = _named_call("enqueue_ready_rows", f.params.get("enqueue_ready_rows", {}), values)
    q = sql.SQL("SELECT job_id, state FROM ({}) r ORDER BY ord").format(q)
    return q, params


def enqueue_flow_query(
    f: Features, queue: str, jobs: Iterable[Mapping[str, Any]], headers: dict[str, str] | None = None
) -> Query:
    """``headers``: trace context for every job of the flow that has none of
    its own (ignored by a server whose flows take no headers)."""
    if not f.flows:
        raise ServerFeatureMissing("this server's pgque has no enqueue_flow (flows need pgque 0.7)")
    out = list(jobs)
    if headers is not None and f.headers:
        out = [j if "headers" in j else {**j, "headers": headers} for j in out]
    return (
        sql.SQL("SELECT flow_id, key, job_id FROM pgque.enqueue_flow({}::text, {}::jsonb)").format(
            sql.Placeholder(), sql.Placeholder()
        ),
        [queue, Jsonb(out)],
    )


def event_headers(f: Features, explicit: Mapping[str, str] | None, traced: dict[str, str] | None) -> Mapping[str, str] | None:
    """The headers an event send passes: the caller's (refused by a server
    without event headers), else the send span's trace context when the
    server takes it, else None (the plain overloads)."""
    if explicit is not None:
        if not f.event_headers:
            raise ServerFeatureMissing("this server's pgque takes no event headers (they need pgque 0.8)")
        return explicit
    return traced if f.event_headers else None


def _payload(payload: Any) -> tuple[Any, str]:
    """Strings go to the text overloads (sent as is), anything else is JSON."""
    if isinstance(payload, str):
        return payload, "text"
    return Jsonb(payload), "jsonb"


def send_query(
    queue: str, payload: Any, type: str | None, partition_key: str | None, headers: Mapping[str, str] | None = None
) -> Query:
    """``headers`` (trace context) take the 5-argument overload of servers
    with event headers; without them, the overloads every server has."""
    value, t = _payload(payload)
    if headers is not None:
        q = f"SELECT pgque.send(%s::text, %s::text, %s::{t}, %s::text, %s::jsonb)"
        return sql.SQL(q), [queue, type or "default", value, partition_key, Jsonb(dict(headers))]  # type: ignore[arg-type]
    if partition_key is not None:
        q = f"SELECT pgque.send(%s::text, %s::text, %s::{t}, %s::text)"
        return sql.SQL(q), [queue, type or "default", value, partition_key]  # type: ignore[arg-type]
    if type is not None:
        return sql.SQL(f"SELECT pgque.send(%s::text, %s::text, %s::{t})"), [queue, type, value]  # type: ignore[arg-type]
    return sql.SQL(f"SELECT pgque.send(%s::text, %s::{t})"), [queue, value]  # type: ignore[arg-type]


def send_batch_query(
    queue: str,
    payloads: Sequence[Any],
    type: str | None,
    partition_keys: Sequence[str | None] | None,
    headers: Mapping[str, str] | None = None,
) -> Query:
    """``headers``: one object for every event of the batch (as send_query)."""
    if payloads and all(isinstance(p, str) for p in payloads):
        values: list[Any] = list(payloads)
        t = "text[]"
    else:
        values = [Jsonb(p) for p in payloads]
        t = "jsonb[]"
    if partition_keys is not None and len(partition_keys) != len(payloads):
        raise InvalidParameterValue("partition_keys must align with payloads")
    if headers is not None:
        q = f"SELECT pgque.send_batch(%s::text, %s::text, %s::{t}, %s::text[], %s::jsonb)"
        keys = None if partition_keys is None else list(partition_keys)
        return sql.SQL(q), [queue, type or "default", values, keys, Jsonb(dict(headers))]  # type: ignore[arg-type]
    if partition_keys is not None:
        q = f"SELECT pgque.send_batch(%s::text, %s::text, %s::{t}, %s::text[])"
        return sql.SQL(q), [queue, type or "default", values, list(partition_keys)]  # type: ignore[arg-type]
    if type is not None:
        return sql.SQL(f"SELECT pgque.send_batch(%s::text, %s::text, %s::{t})"), [queue, type, values]  # type: ignore[arg-type]
    return sql.SQL(f"SELECT pgque.send_batch(%s::text, %s::{t})"), [queue, values]  # type: ignore[arg-type]


def send_idem_query(
    queue: str, type: str, payload: Any, idem_key: str, ttl: timedelta | str, partition_key: str | None,
    headers: Mapping[str, str] | None = None,
) -> Query:  # fmt: skip
    value, t = _payload(payload)
    params: list[Any] = [queue, type, value, idem_key, ttl, partition_key]
    h = ""
    if headers is not None:
        h = ", %s::jsonb"
        params.append(Jsonb(dict(headers)))
    q = (
        "SELECT event_id, deduped FROM pgque.send_idem("
        f"%s::text, %s::text, %s::{t}, %s::text, %s::interval, %s::text{h})"
    )
    return sql.SQL(q), params  # type: ignore[arg-type]


def send_at_query(
    queue: str, type: str, payload: Any, deliver_at: Any, partition_key: str | None,
    headers: Mapping[str, str] | None = None,
) -> Query:  # fmt: skip
    value, t = _payload(payload)
    params: list[Any] = [queue, type, value, deliver_at, partition_key]
    h = ""
    if headers is not None:
        h = ", %s::jsonb"
        params.append(Jsonb(dict(headers)))
    q = f"SELECT pgque.send_at(%s::text, %s::text, %s::{t}, %s::timestamptz, %s::text{h})"
    return sql.SQL(q), params  # type: ignore[arg-type]
