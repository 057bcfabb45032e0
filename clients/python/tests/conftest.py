"""Fixtures: a real PostgreSQL with pgque, started by clients/run.sh, which
sets PGQUE_TEST_HOST / PGQUE_TEST_PORT. The session gets one database with
the extension; each test uses queues of its own (unique names)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

DB = "pgque_client_test"


def _base() -> str:
    host = os.environ.get("PGQUE_TEST_HOST")
    port = os.environ.get("PGQUE_TEST_PORT")
    if not host or not port:
        pytest.exit("PGQUE_TEST_HOST/PORT not set: run these tests through clients/run.sh", returncode=2)
    return f"host={host} port={port} user=postgres"


@pytest.fixture(scope="session")
def dsn() -> str:
    base = _base()
    with psycopg.connect(base + " dbname=postgres", autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {DB}")
    d = f"{base} dbname={DB}"
    with psycopg.connect(d, autocommit=True) as c:
        c.execute("CREATE EXTENSION pgque")
        c.execute("CREATE TABLE handled (job_id bigint, at timestamptz DEFAULT clock_timestamp())")
    return d


@pytest.fixture()
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture()
def name() -> str:
    """A fresh queue name for this test."""
    return "t_" + uuid.uuid4().hex[:10]


def wait_until(pred: Callable[[], Any], timeout: float = 30.0, every: float = 0.05, what: str = "condition") -> Any:
    """Polls pred() until it is truthy (returns it) or fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def job_states(conn: psycopg.Connection[Any], queue: str) -> dict[str, int]:
    rows = conn.execute(
        "SELECT state, count(*)::int FROM pgque.all_jobs WHERE queue = %s GROUP BY state", (queue,)
    ).fetchall()
    return dict(rows)


@pytest.fixture(scope="session")
def otel_exporter() -> Any:
    """The OpenTelemetry SDK's in-memory exporter behind the global tracer
    provider (set once per process). Only in clients/run.sh's OpenTelemetry
    pass, where the SDK is on the path."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    trace.set_tracer_provider(provider)
    return exp
