"""Trace context (docs/tracing.md) with the OpenTelemetry SDK's in-memory
exporter: the producer's send span and the headers it stores, the worker's
process span (child of and linked to the producer on the first attempt, a
new trace linked to it on a retry), and the no-OpenTelemetry path.

clients/run.sh runs this file twice: in the venv without the ``otel`` extra
(PGQUE_TEST_OTEL unset: only the no-OpenTelemetry tests apply) and with
opentelemetry-api/sdk on the path (PGQUE_TEST_OTEL=1: the others, which
then must not be skipped)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pgque_client as pq
from pgque_client import _otel
from conftest import job_states, wait_until
from test_worker import Running

OTEL = os.environ.get("PGQUE_TEST_OTEL") == "1"
otel_only = pytest.mark.skipif(not OTEL, reason="runs in clients/run.sh's OpenTelemetry pass")
plain_only = pytest.mark.skipif(OTEL, reason="runs in clients/run.sh's pass without OpenTelemetry")


@pytest.fixture()
def exporter(otel_exporter):
    otel_exporter.clear()
    return otel_exporter


@plain_only
def test_without_opentelemetry_nothing_is_imported_and_no_headers_are_stored(dsn, conn, name):
    out = subprocess.run(
        [sys.executable, "-c", "import sys, pgque_client; "
         "print(pgque_client._otel.ENABLED, any(m.startswith('opentelemetry') for m in sys.modules))"],
        capture_output=True, text=True, check=True,
    )
    assert out.stdout.split() == ["False", "False"]
    assert not _otel.ENABLED
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    a = pq.enqueue(conn, name, "k", {})
    b = pq.enqueue_many(conn, name, [("k", {})])[0].job_id
    rows = conn.execute(
        "SELECT headers, stored_in FROM pgque.all_jobs WHERE id = ANY(%s) ORDER BY id", ([a, b],)
    ).fetchall()
    # no headers: the jobs keep the job log
    assert rows == [(None, "log"), (None, "log")]


@otel_only
def test_flow_jobs_take_the_send_span_context_and_traced_jobs_keep_the_log(conn, name, exporter):
    from opentelemetry import trace

    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    exporter.clear()
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with trace.get_tracer("test").start_as_current_span("request"):
        flow = pq.enqueue_flow(conn, name, [
            {"key": "a", "kind": "k"},
            {"key": "b", "kind": "k", "depends_on": ["a"]},
            {"key": "c", "kind": "k", "headers": {"traceparent": own}},
        ])
        single = pq.enqueue(conn, name, "k", {})
    sends = [s for s in exporter.get_finished_spans() if s.name == f"send {name}"]
    assert len(sends) == 2
    assert sends[0].attributes["messaging.batch.message_count"] == 3
    ids = {f.key: f.job_id for f in flow}
    hdr = dict(conn.execute("SELECT id, headers FROM pgque.all_jobs WHERE queue = %s", (name,)).fetchall())
    # every flow job without headers of its own carries the flow's send span
    assert hdr[ids["a"]]["traceparent"].split("-")[2] == f"{sends[0].context.span_id:016x}"
    assert hdr[ids["b"]] == hdr[ids["a"]]
    assert hdr[ids["c"]] == {"traceparent": own}
    # a traced job without flow stays in the job log, headers and all
    assert conn.execute("SELECT stored_in, headers IS NOT NULL FROM pgque.get_job(%s)", (single,)).fetchone() == (
        "log", True)


@otel_only
def test_producer_span_and_headers_then_worker_span_per_attempt(dsn, conn, name, exporter):
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    assert _otel.ENABLED
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    exporter.clear()
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as root:
        job = pq.enqueue(conn, name, "flaky", {"x": 1})
        batch = [e.job_id for e in pq.enqueue_many(conn, name, [("ok", {}), ("ok", {})])]
    trace_id = root.get_span_context().trace_id
    sends = [s for s in exporter.get_finished_spans() if s.name == f"send {name}"]
    assert len(sends) == 2
    for s in sends:
        assert s.kind == SpanKind.PRODUCER
        assert s.context.trace_id == trace_id and s.parent.span_id == root.get_span_context().span_id
        assert s.attributes["messaging.system"] == "pgque"
        assert s.attributes["messaging.destination.name"] == name
    assert sends[1].attributes["messaging.batch.message_count"] == 2
    # each job stored its send span's context
    hdr = dict(conn.execute("SELECT id, headers FROM pgque.all_jobs WHERE queue = %s", (name,)).fetchall())
    flags = f"{int(sends[0].context.trace_flags):02x}"  # sampled, and the SDK's random-trace-id bit
    assert hdr[job]["traceparent"] == f"00-{trace_id:032x}-{sends[0].context.span_id:016x}-{flags}"
    assert hdr[batch[0]] == hdr[batch[1]]
    assert hdr[batch[0]]["traceparent"].split("-")[2] == f"{sends[1].context.span_id:016x}"

    w = pq.Worker(dsn, name, concurrency=2, poll_interval=0.2, handle_signals=False)
    seen = {}

    @w.handler("flaky")
    def flaky(j):
        seen.setdefault(j.id, []).append(trace.get_current_span().get_span_context().trace_id)
        if j.attempt == 1:
            raise ValueError("first attempt fails")

    @w.handler("ok")
    def ok(j):
        return None

    conn.execute("UPDATE pgque.job_queues SET max_attempts = 3 WHERE queue_name = %s", (name,))
    with Running(w):
        wait_until(lambda: job_states(conn, name) == {"completed": 3}, 60, 0.2, "the jobs and the retry")
    procs = [s for s in exporter.get_finished_spans() if s.name == f"process {name}"]
    by = {}
    for s in procs:
        by.setdefault(int(s.attributes["messaging.message.id"]), []).append(s)
    assert sorted(by) == sorted([job, *batch])
    first, retry = sorted(by[job], key=lambda s: s.attributes["pgque.job.attempt"])
    for s in (first, retry):
        assert s.kind == SpanKind.CONSUMER
        assert s.attributes["messaging.operation.type"] == "process"
        assert s.attributes["messaging.destination.name"] == name
        assert s.attributes["pgque.job.kind"] == "flaky"
        assert [ln.context.span_id for ln in s.links] == [sends[0].context.span_id]
    # attempt 1: the producer's trace, a child of its send span; failed
    assert first.context.trace_id == trace_id and first.parent.span_id == sends[0].context.span_id
    assert first.status.status_code.name == "ERROR" and first.events[0].name == "exception"
    # attempt 2: a new trace, linked
    assert retry.attributes["pgque.job.attempt"] == 2
    assert retry.context.trace_id != trace_id and retry.parent is None
    assert retry.status.status_code.name != "ERROR"
    # the handler ran inside its span
    assert seen[job] == [first.context.trace_id, retry.context.trace_id]
    for b in batch:
        (s,) = by[b]
        assert s.parent.span_id == sends[1].context.span_id


@otel_only
def test_outside_a_trace_and_explicit_headers(dsn, conn, name, exporter):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    # no current span: the send span is a root, its context is stored
    a = pq.enqueue(conn, name, "k", {})
    # headers given by the caller win
    b = pq.enqueue(conn, name, "k", {}, headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    c = pq.enqueue_many(conn, name, [{"kind": "k", "headers": {"x": "y"}}, ("k", {})])
    h = dict(conn.execute("SELECT id, headers FROM pgque.all_jobs WHERE queue = %s", (name,)).fetchall())
    assert h[a]["traceparent"].startswith("00-") and h[a]["traceparent"] != h[b]["traceparent"]
    assert h[b]["traceparent"] == "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    assert h[c[0].job_id] == {"x": "y"}
    assert h[c[1].job_id]["traceparent"].startswith("00-")
