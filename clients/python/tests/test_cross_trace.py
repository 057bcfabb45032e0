"""One connected trace across the three clients (docs/tracing.md), each
checked through its SDK's in-memory exporter.

Jobs: a Python producer enqueues job A in a traced request; a Rust worker
(clients/rust/examples/trace_hop.rs) processes A and, inside its process
span, enqueues job B; a TypeScript worker (clients/typescript/test/
trace_hop.ts) processes B.

Events: a Python ``send`` and ``send_batch`` in a traced request, read by a
Rust Consumer (clients/rust/examples/event_hop.rs) and a TypeScript
Consumer (clients/typescript/test/event_hop.ts), each as a consumer of its
own on the same queue, so each gets every event.

Runs in clients/run.sh's OpenTelemetry pass, which builds the hops and
passes their commands in PGQUE_TRACE_RUST / PGQUE_TRACE_TS and
PGQUE_EVENT_RUST / PGQUE_EVENT_TS."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import psycopg
import pytest

import pgque_client as pq

pytestmark = pytest.mark.skipif(
    os.environ.get("PGQUE_TEST_OTEL") != "1", reason="runs in clients/run.sh's OpenTelemetry pass"
)


def _spans(cmd: list[str]) -> list[dict]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{cmd[0]} failed:\n{out.stdout}\n{out.stderr}"
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_python_producer_rust_worker_typescript_worker_one_trace(dsn, conn, name, otel_exporter):
    from opentelemetry import trace

    exporter = otel_exporter
    exporter.clear()
    tracer = trace.get_tracer("cross")
    qa, qb = name + "_a", name + "_b"
    conn.execute("SELECT pgque.create_job_queue(%s), pgque.create_job_queue(%s)", (qa, qb))
    with tracer.start_as_current_span("request") as root:
        a = pq.enqueue(conn, qa, "hop", {"step": "python"})
    trace_id = f"{root.get_span_context().trace_id:032x}"
    (py_send,) = [s for s in exporter.get_finished_spans() if s.name == f"send {qa}"]
    py_send_id = f"{py_send.context.span_id:016x}"
    assert f"{py_send.context.trace_id:032x}" == trace_id

    # the Rust hop: process A, enqueue B
    rust = _spans(shlex.split(os.environ["PGQUE_TRACE_RUST"]) + [dsn, qa, qb])
    (rs_proc,) = [s for s in rust if s["name"] == f"process {qa}"]
    (rs_send,) = [s for s in rust if s["name"] == f"send {qb}"]
    assert rs_proc["kind"] == "consumer" and rs_send["kind"] == "producer"
    assert rs_proc["trace_id"] == trace_id and rs_proc["parent_span_id"] == py_send_id
    assert rs_proc["links"] == [py_send_id]
    assert rs_proc["attributes"]["messaging.message.id"] == str(a)
    assert rs_proc["attributes"]["messaging.system"] == "pgque"
    assert rs_send["trace_id"] == trace_id and rs_send["parent_span_id"] == rs_proc["span_id"]
    b = conn.execute("SELECT id, headers FROM pgque.all_jobs WHERE queue = %s", (qb,)).fetchall()
    assert len(b) == 1
    b_id, b_headers = b[0]
    assert b_headers["traceparent"] == f"00-{trace_id}-{rs_send['span_id']}-01"

    # the TypeScript hop: process B
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    cfg = {"host": params["host"], "port": int(params["port"]), "user": params["user"], "database": params["dbname"]}
    ts = _spans(shlex.split(os.environ["PGQUE_TRACE_TS"]) + [json.dumps(cfg), qb])
    (ts_proc,) = [s for s in ts if s["name"] == f"process {qb}"]
    assert ts_proc["kind"] == "consumer"
    assert ts_proc["trace_id"] == trace_id and ts_proc["parent_span_id"] == rs_send["span_id"]
    assert ts_proc["links"] == [rs_send["span_id"]]
    assert ts_proc["attributes"]["messaging.message.id"] == str(b_id)
    assert ts_proc["attributes"]["pgque.job.attempt"] == "1"
    # and both jobs completed
    states = dict(conn.execute(
        "SELECT queue, state FROM pgque.all_jobs WHERE queue IN (%s, %s)", (qa, qb)
    ).fetchall())
    assert states == {qa: "completed", qb: "completed"}


def test_python_send_read_by_rust_and_typescript_consumers_one_trace(dsn, conn, name, otel_exporter):
    from opentelemetry import trace

    exporter = otel_exporter
    exporter.clear()
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe(%s, 'rs'), pgque.subscribe(%s, 'ts')", (name, name))
    with trace.get_tracer("cross").start_as_current_span("request") as root:
        one = pq.send(conn, name, {"step": "python"}, type="hop")
        batch = pq.send_batch(conn, name, [{"i": 1}, {"i": 2}], type="hop")
    trace_id = f"{root.get_span_context().trace_id:032x}"
    send_one, send_batch = [s for s in exporter.get_finished_spans() if s.name == f"send {name}"]
    parent_of = {one: send_one, batch[0]: send_batch, batch[1]: send_batch}
    conn.execute("SELECT pgque.force_tick(%s)", (name,))

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    cfg = {"host": params["host"], "port": int(params["port"]), "user": params["user"], "database": params["dbname"]}
    for who, cmd in (
        ("rs", shlex.split(os.environ["PGQUE_EVENT_RUST"]) + [dsn, name, "rs", "3"]),
        ("ts", shlex.split(os.environ["PGQUE_EVENT_TS"]) + [json.dumps(cfg), name, "ts", "3"]),
    ):
        procs = [s for s in _spans(cmd) if s["name"] == f"process {name}"]
        assert sorted(int(p["attributes"]["messaging.message.id"]) for p in procs) == sorted(parent_of), who
        for p in procs:
            send = parent_of[int(p["attributes"]["messaging.message.id"])]
            send_id = f"{send.context.span_id:016x}"
            # one trace: each consumer's span is a child of the Python send span, and linked to it
            assert p["kind"] == "consumer", who
            assert p["trace_id"] == trace_id and p["parent_span_id"] == send_id, who
            assert p["links"] == [send_id], who
            assert p["attributes"]["messaging.system"] == "pgque", who
            assert p["attributes"]["messaging.consumer.group.name"] == who
            assert p["attributes"]["pgque.event.type"] == "hop", who
