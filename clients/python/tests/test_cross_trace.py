"""One connected trace across the three clients (docs/tracing.md), each
checked through its SDK's in-memory exporter: a Python producer enqueues job
A in a traced request; a Rust worker (clients/rust/examples/trace_hop.rs)
processes A and, inside its process span, enqueues job B; a TypeScript
worker (clients/typescript/test/trace_hop.ts) processes B.

Runs in clients/run.sh's OpenTelemetry pass, which builds both hops and
passes their commands in PGQUE_TRACE_RUST / PGQUE_TRACE_TS."""

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
