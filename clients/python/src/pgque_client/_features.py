"""What the connected server's pgque offers, read once per connection.

The client works with servers of several pgque versions: functions added
later (outputs on ``complete_many``, ``set_progress``, ``enqueue_flow``,
``job_channel``, the ``headers`` of ``send``, the waiting ``receive``) are looked up in ``pg_proc``
and used when present. The
parameter names and types of the functions whose options are passed by name
(``enqueue``, ``enqueue_ready_rows``) come from the same read, so a keyword
the server does not know is refused by the client before any SQL is sent, and
each value is cast to the parameter's own type.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

# One statement: every overload of the functions the client cares about, with
# named parameters and their types. Read-only catalogue access, cheap.
CATALOG_SQL = """
SELECT p.proname::text, p.pronargs::int,
       coalesce(p.proargnames[1:p.pronargs], '{}')::text[],
       ARRAY(SELECT pg_catalog.format_type(t, NULL)
             FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i) ORDER BY i)::text[]
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'pgque'
  AND p.proname = ANY ('{enqueue,enqueue_ready_rows,complete,complete_many,set_progress,enqueue_flow,job_channel,send,receive,receive_with_headers}')
"""


@dataclass
class Features:
    """Server capabilities. ``params[fn]`` maps each named parameter of the
    widest overload of ``fn`` to its SQL type."""

    outputs: bool = False
    progress: bool = False
    flows: bool = False
    job_channel: bool = False
    # jobs carry headers (trace context): enqueue takes them, dispatch returns them
    headers: bool = False
    # events carry headers: send(queue, type, payload, partition_key, headers)
    # and its siblings take them, receive_with_headers returns them (0.8)
    event_headers: bool = False
    # the waiting receive(queue, consumer, max_return, wait interval), which
    # sleeps in the server until the consumer has a batch (0.9, docs/waits.md)
    receive_wait: bool = False
    # its receive_with_headers(queue, consumer, max_return, wait interval) twin
    receive_with_headers_wait: bool = False
    params: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: list[tuple[str, int, list[str], list[str]]]) -> Features:
        f = cls()
        widest: dict[str, int] = {}
        for name, nargs, argnames, argtypes in rows:
            if name == "complete_many" and nargs >= 3:
                f.outputs = True
            elif name == "set_progress":
                f.progress = True
            elif name == "enqueue_flow":
                f.flows = True
            elif name == "job_channel":
                f.job_channel = True
            elif name in ("receive", "receive_with_headers") and argtypes[3:] == ["interval"]:
                if name == "receive":
                    f.receive_wait = True
                else:
                    f.receive_with_headers_wait = True
            if nargs > widest.get(name, -1):
                widest[name] = nargs
                f.params[name] = dict(zip(argnames, argtypes))
        f.headers = "headers" in f.params.get("enqueue", {})
        f.event_headers = "headers" in f.params.get("send", {})
        return f


_cache: weakref.WeakKeyDictionary[Any, Features] = weakref.WeakKeyDictionary()


def features(conn: Any) -> Features:
    """The capabilities for a psycopg (sync) connection, read on first use."""
    f = _cache.get(conn)
    if f is None:
        rows = conn.execute(CATALOG_SQL).fetchall()
        f = Features.from_rows(rows)
        _cache[conn] = f
    return f


async def afeatures(conn: Any) -> Features:
    """The same for an AsyncConnection."""
    f = _cache.get(conn)
    if f is None:
        cur = await conn.execute(CATALOG_SQL)
        f = Features.from_rows(await cur.fetchall())
        _cache[conn] = f
    return f
