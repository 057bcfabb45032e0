"""Trace context on events (docs/tracing.md, "Events") with the OpenTelemetry
SDK's in-memory exporter: the producers' ``send <queue>`` spans and the
headers they store, the consumers' ``process <queue>`` span per event
(linked to its producer, its child on the first delivery, a new trace on a
redelivery), and the path without OpenTelemetry (no headers, the plain
overloads, which a 0.7.0 schema has).

Like test_tracing.py, clients/run.sh runs it without the ``otel`` extra
(PGQUE_TEST_OTEL unset) and in its OpenTelemetry pass (PGQUE_TEST_OTEL=1)."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

import pgque_client as pq
from pgque_client import _otel
from conftest import wait_until
from test_worker import Running

OTEL = os.environ.get("PGQUE_TEST_OTEL") == "1"
otel_only = pytest.mark.skipif(not OTEL, reason="runs in clients/run.sh's OpenTelemetry pass")
plain_only = pytest.mark.skipif(OTEL, reason="runs in clients/run.sh's pass without OpenTelemetry")

OWN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _headers_of(conn, queue, consumer):
    """Every pending event of ``consumer`` with its stored headers (a batch
    read with receive_with_headers, then acked)."""
    conn.execute("SELECT pgque.force_tick(%s)", (queue,))
    rows = conn.execute(
        "SELECT msg_id, batch_id, headers FROM pgque.receive_with_headers(%s, %s, 1000)", (queue, consumer)
    ).fetchall()
    if rows:
        conn.execute("SELECT pgque.ack(%s)", (rows[0][1],))
    return {r[0]: r[2] for r in rows}


def _all_producers(conn, name):
    """One event through each producer (sync and asyncio); their ids."""
    ids = [
        pq.send(conn, name, {"n": 1}),
        pq.send(conn, name, "text", type="t", partition_key="k"),
        *pq.send_batch(conn, name, [{"n": 2}, {"n": 3}], type="b"),
        pq.send_idem(conn, name, "i", {"n": 4}, "effect:" + name).event_id,
        pq.send_at(conn, name, "a", {"n": 5}, datetime.now(timezone.utc) - timedelta(seconds=1)),
    ]

    async def aio():
        async with await psycopg.AsyncConnection.connect(conn.info.dsn, autocommit=True) as ac:
            return [
                await pq.aio.send(ac, name, {"n": 6}),
                *(await pq.aio.send_batch(ac, name, ["x", "y"])),
            ]

    return ids + asyncio.run(aio())


@plain_only
def test_without_opentelemetry_events_carry_no_headers(dsn, conn, name):
    assert not _otel.ENABLED and not _otel.active()
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe(%s, 'c')", (name,))
    ids = _all_producers(conn, name)
    got = _headers_of(conn, name, "c")
    assert sorted(got) == sorted(ids)
    assert set(got.values()) == {None}
    # the consumer reads them without headers (the plain receive)
    ids = pq.send_batch(conn, name, [{"i": i} for i in range(3)])
    seen = []
    c = pq.Consumer(dsn, name, "c", lambda m: seen.append((m.msg_id, m.headers)), poll_interval=0.2,
                    handle_signals=False)  # fmt: skip
    with Running(c):
        wait_until(lambda: len(seen) == 3, 30, 0.05, "the events handled")
    assert seen == [(i, None) for i in ids]


@plain_only
def test_explicit_headers_are_stored_without_opentelemetry(conn, name):
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe(%s, 'c')", (name,))
    a = pq.send(conn, name, {"n": 1}, headers={"traceparent": OWN})
    b = pq.send_batch(conn, name, [{"n": 2}, {"n": 3}], headers={"traceparent": OWN, "tracestate": "k=v"})
    got = _headers_of(conn, name, "c")
    assert got == {a: {"traceparent": OWN}, b[0]: {"traceparent": OWN, "tracestate": "k=v"},
                   b[1]: {"traceparent": OWN, "tracestate": "k=v"}}  # fmt: skip


def test_a_070_schema_keeps_working(dsn, name, request):
    """The plain overloads and receive on a 0.7.0 schema: producers in a
    traced context and consumers with OpenTelemetry active fall back to them
    (the consumer once, on 42883)."""
    if OTEL:
        request.getfixturevalue("otel_exporter")  # an SDK installed: consumers try the headers
        assert _otel.active()
    db = "pgque_client_070_" + uuid.uuid4().hex[:6]
    base = dsn.replace("dbname=pgque_client_test", "dbname=postgres")
    with psycopg.connect(base, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {db}")
    old = dsn.replace("dbname=pgque_client_test", f"dbname={db}")
    try:
        with psycopg.connect(old, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pgque VERSION '0.7.0'")
            conn.execute("SELECT pgque.create_queue(%s)", (name,))
            conn.execute("SELECT pgque.subscribe(%s, 'c')", (name,))
            if OTEL:
                from opentelemetry import trace

                with trace.get_tracer("test").start_as_current_span("request"):
                    ids = _all_producers(conn, name)
                with pytest.raises(pq.errors.ServerFeatureMissing):
                    pq.send(conn, name, {}, headers={"traceparent": OWN})
            else:
                ids = _all_producers(conn, name)
            seen = []
            c = pq.Consumer(old, name, "c", lambda m: seen.append(m.msg_id), poll_interval=0.2, handle_signals=False)
            with Running(c):
                wait_until(lambda: len(seen) == len(ids), 30, 0.05, "the events handled")
                assert c._server_headers == (not OTEL)  # fell back (OpenTelemetry) or never tried
            assert sorted(seen) == sorted(ids)
    finally:
        with psycopg.connect(base, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


@pytest.fixture()
def exporter(otel_exporter):
    otel_exporter.clear()
    return otel_exporter


def _spans(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


@otel_only
def test_send_spans_store_their_context_explicit_headers_win(conn, name, exporter):
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    assert _otel.active()
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe(%s, 'c')", (name,))
    exporter.clear()
    with trace.get_tracer("test").start_as_current_span("request") as root:
        ids = _all_producers(conn, name)
        own = pq.send(conn, name, {"own": 1}, headers={"traceparent": OWN})
    sends = _spans(exporter, f"send {name}")
    assert len(sends) == 8  # 5 sync (one per call), 2 asyncio, the explicit one
    root_sc = root.get_span_context()
    for s in sends:
        assert s.kind == SpanKind.PRODUCER
        assert s.context.trace_id == root_sc.trace_id and s.parent.span_id == root_sc.span_id
        assert s.attributes["messaging.system"] == "pgque"
        assert s.attributes["messaging.destination.name"] == name
        assert s.attributes["messaging.operation.type"] == "send"
    counts = [s.attributes.get("messaging.batch.message_count") for s in sends]
    assert counts == [None, None, 2, None, None, None, 2, None]
    got = _headers_of(conn, name, "c")
    assert sorted(got) == sorted([*ids, own])
    flags = f"{int(sends[0].context.trace_flags):02x}"
    # each event stored the context of the span of the call that sent it
    by_call = [ids[0], ids[1], ids[2], ids[4], ids[5], ids[6], ids[7]]
    for s, ev in zip(sends[:7], by_call):
        assert got[ev] == {"traceparent": f"00-{root_sc.trace_id:032x}-{s.context.span_id:016x}-{flags}"}
    assert got[ids[3]] == got[ids[2]]  # one span for the batch, one headers object
    assert got[ids[8]] == got[ids[7]]
    assert got[own] == {"traceparent": OWN}


@otel_only
def test_consumer_span_per_event_linked_retry_in_a_new_trace(dsn, conn, name, exporter):
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe(%s, 'c')", (name,))
    exporter.clear()
    with trace.get_tracer("test").start_as_current_span("request") as root:
        a = pq.send(conn, name, {"fail": True}, type="flaky")
        batch = pq.send_batch(conn, name, [{"i": 1}, {"i": 2}], type="ok")
    plain = pq.send(conn, name, {"untraced": True})  # outside a trace: a root send span
    send_a, send_batch, send_plain = _spans(exporter, f"send {name}")
    current = {}

    def handle(m: pq.Message):
        current.setdefault(m.msg_id, []).append(trace.get_current_span().get_span_context().span_id)
        if m.type == "flaky" and not m.retry_count:
            raise ValueError("first delivery fails")

    c = pq.Consumer(dsn, name, "c", handle, poll_interval=0.2, retry_after=0, handle_signals=False)
    with Running(c):
        wait_until(lambda: len(current.get(a, [])) == 2 and len(current) == 4, 60, 0.1, "the events and the retry")
    procs = _spans(exporter, f"process {name}")
    by = {}
    for s in procs:
        by.setdefault(int(s.attributes["messaging.message.id"]), []).append(s)
    assert sorted(by) == sorted([a, *batch, plain])
    for s in procs:
        assert s.kind == SpanKind.CONSUMER
        assert s.attributes["messaging.system"] == "pgque"
        assert s.attributes["messaging.destination.name"] == name
        assert s.attributes["messaging.consumer.group.name"] == "c"
        assert s.attributes["messaging.operation.type"] == "process"
    first, retry = sorted(by[a], key=lambda s: s.attributes["pgque.event.retry_count"])
    trace_id = root.get_span_context().trace_id
    # first delivery: the producer's trace, child of and linked to its send span; failed
    assert first.context.trace_id == trace_id and first.parent.span_id == send_a.context.span_id
    assert [ln.context.span_id for ln in first.links] == [send_a.context.span_id]
    assert first.status.status_code.name == "ERROR" and first.events[0].name == "exception"
    assert first.attributes["pgque.event.type"] == "flaky"
    # the redelivery: a new trace, linked to the send span
    assert retry.attributes["pgque.event.retry_count"] == 1
    assert retry.context.trace_id != trace_id and retry.parent is None
    assert [ln.context.span_id for ln in retry.links] == [send_a.context.span_id]
    assert retry.status.status_code.name != "ERROR"
    for b in batch:
        (s,) = by[b]
        assert s.parent.span_id == send_batch.context.span_id
        assert [ln.context.span_id for ln in s.links] == [send_batch.context.span_id]
    (p,) = by[plain]
    assert p.context.trace_id == send_plain.context.trace_id != trace_id
    # the handler ran inside its span
    assert current[a] == [first.context.span_id, retry.context.span_id]


@otel_only
def test_partitioned_consumer_spans_link_each_event(dsn, conn, name, exporter):
    from opentelemetry import trace

    n = 4
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe_partitioned(%s, 'pc', %s)", (name, n))
    keys = [f"k{i}" for i in range(12)]
    exporter.clear()
    with trace.get_tracer("test").start_as_current_span("request"):
        ids = pq.send_batch(conn, name, [{"k": k} for k in keys], partition_keys=keys)
        one = pq.send(conn, name, {"k": "solo"}, partition_key="solo")
    send_batch, send_one = _spans(exporter, f"send {name}")
    lock = threading.Lock()
    seen = []

    def handle(m: pq.Message, tx):
        with lock:
            seen.append(m.msg_id)

    pc = pq.PartitionedConsumer(dsn, name, "pc", n, handle, workers=2, poll_interval=0.2, handle_signals=False)
    with Running(pc):
        conn.execute("SELECT pgque.force_tick(%s)", (name,))
        wait_until(lambda: len(seen) == 13, 60, 0.1, "every event handled")
    procs = {int(s.attributes["messaging.message.id"]): s for s in _spans(exporter, f"process {name}")}
    assert sorted(procs) == sorted([*ids, one])
    for i in ids:
        assert procs[i].parent.span_id == send_batch.context.span_id
        assert [ln.context.span_id for ln in procs[i].links] == [send_batch.context.span_id]
        assert procs[i].attributes["messaging.consumer.group.name"] == "pc"
    assert [ln.context.span_id for ln in procs[one].links] == [send_one.context.span_id]
