"""Consumer on the waiting receive (docs/waits.md) against a real server:
it waits inside the server (an Extension wait event, no LISTEN), gets an
event sent by another connection quickly, stops promptly while waiting
(stop() and SIGTERM), caps its wait under statement_timeout, and falls back
to LISTEN + poll with wait=None and on a server without the waits (a
0.8.0 schema)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import psycopg

import pgque_client as pq
from pgque_client._features import features
from conftest import wait_until
from test_worker import Running


def _backends(conn, app: str) -> list[tuple[str, str | None, str | None, str]]:
    """(state, wait_event_type, wait_event, query) of the backends named app."""
    return conn.execute(
        "SELECT state, wait_event_type, wait_event, query FROM pg_stat_activity WHERE application_name = %s",
        (app,),
    ).fetchall()


def _waiting_in_server(conn, app: str) -> bool:
    return any(st == "active" and wt == "Extension" for st, wt, _, _ in _backends(conn, app))


def _listening(conn, app: str) -> bool:
    return any(q.startswith("LISTEN") for _, _, _, q in _backends(conn, app))


def _latency(conn, queue: str, seen: list, n: int) -> float:
    """Sends one event from conn (committed at once) and returns how long
    until the consumer's handler had it."""
    t0 = time.monotonic()
    pq.send(conn, queue, {"n": n}, type="t")
    wait_until(lambda: len(seen) > n, 10, 0.001, f"event {n} handled")
    return seen[n][1] - t0


def test_consumer_waits_in_the_server_and_gets_an_event_quickly(dsn, conn, name):
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    app = "wait_" + name
    seen: list[tuple[int, float]] = []
    c = pq.Consumer(dsn, name, "c1", lambda m: seen.append((m.msg_id, time.monotonic())),
                    handle_signals=False, connect_kwargs={"application_name": app})  # fmt: skip
    assert c.wait == 5.0
    with Running(c):
        wait_until(lambda: _waiting_in_server(conn, app), 10, 0.02, "the consumer waiting in the server")
        assert c.server_waits
        assert not _listening(conn, app), _backends(conn, app)
        lat = []
        for i in range(3):
            lat.append(_latency(conn, name, seen, i))
            wait_until(lambda: _waiting_in_server(conn, app), 10, 0.01, "waiting again")
    print(f"\nwaiting receive latency (commit -> handler): {', '.join(f'{x * 1000:.1f}' for x in lat)} ms")
    assert max(lat) < 1.0, lat
    assert conn.execute(
        "SELECT pending_events FROM pgque.get_consumer_info(%s, 'c1')", (name,)
    ).fetchone() == (0,)


def test_stop_while_waiting_cancels_the_wait(dsn, conn, name):
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    app = "stop_" + name
    c = pq.Consumer(dsn, name, "c1", lambda m: None, handle_signals=False, wait=9,
                    connect_kwargs={"application_name": app})  # fmt: skip
    r = Running(c)
    r.__enter__()
    try:
        wait_until(lambda: _waiting_in_server(conn, app), 10, 0.02, "the consumer waiting in the server")
        time.sleep(0.3)  # well inside the 9 s wait
    finally:
        t0 = time.monotonic()
        r.__exit__(None, None, None)
        took = time.monotonic() - t0
    assert took < 2.0, f"stop() took {took:.2f} s"
    assert r.error is None
    assert _backends(conn, app) == []  # run() closed its connection
    # A new consumer run after the cancel: it is still fine.
    seen = []
    c2 = pq.Consumer(dsn, name, "c1", lambda m: seen.append(m.msg_id), handle_signals=False)
    with Running(c2):
        i = pq.send(conn, name, {}, type="t")
        wait_until(lambda: seen == [i], 10, 0.01, "the event handled")


_SIGTERM_CONSUMER = """
import sys
import pgque_client as pq
from pgque_client._features import features
c = pq.Consumer(sys.argv[1], sys.argv[2], "c1", lambda m: None,
                connect_kwargs={"application_name": sys.argv[3]})
print("ready", flush=True)
c.run()
print(f"stopped waits={c.server_waits}", flush=True)
"""


def test_sigterm_while_waiting_ends_run_promptly(dsn, conn, name):
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe(%s, 'c1')", (name,))
    app = "term_" + name
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-c", _SIGTERM_CONSUMER, dsn, name, app], stdout=subprocess.PIPE,
                         text=True, env=env)  # fmt: skip
    try:
        assert p.stdout.readline().strip() == "ready"
        wait_until(lambda: _waiting_in_server(conn, app), 10, 0.02, "the consumer waiting in the server")
        time.sleep(0.3)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=10)
        took = time.monotonic() - t0
    finally:
        p.kill()
    assert p.returncode == 0, out
    assert out.strip() == "stopped waits=True"
    assert took < 2.0, f"SIGTERM to exit took {took:.2f} s"


def test_wait_is_capped_under_statement_timeout(dsn, conn, name):
    """statement_timeout = 1 s: the waits are 0.5 s, none is cancelled by
    the timeout (which would end run() with QueryCanceled)."""
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    app = "stmt_" + name
    seen = []
    c = pq.Consumer(dsn, name, "c1", lambda m: seen.append(m.msg_id), handle_signals=False,
                    connect_kwargs={"application_name": app, "options": "-c statement_timeout=1000"})  # fmt: skip
    with Running(c) as r:
        wait_until(lambda: _waiting_in_server(conn, app), 10, 0.02, "the consumer waiting in the server")
        time.sleep(2.5)  # five waits' ends, two timeouts had the wait not been capped
        i = pq.send(conn, name, {}, type="t")
        wait_until(lambda: seen == [i], 10, 0.01, "the event handled")
        assert r.server_waits


def test_wait_none_listens_and_polls(dsn, conn, name):
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    app = "nowait_" + name
    seen = []
    c = pq.Consumer(dsn, name, "c1", lambda m: seen.append(m.msg_id), handle_signals=False, wait=None,
                    poll_interval=60, connect_kwargs={"application_name": app})  # fmt: skip
    with Running(c):
        wait_until(lambda: _listening(conn, app), 10, 0.02, "the consumer's LISTEN connection")
        time.sleep(0.3)
        assert not c.server_waits
        assert not _waiting_in_server(conn, app)
        i = pq.send(conn, name, {}, type="t")
        # a 60 s poll: only the tick's NOTIFY wakes it in time
        wait_until(lambda: seen == [i], 10, 0.01, "the event handled")


def test_a_server_without_the_waits_gets_listen_and_poll(dsn, name):
    """A 0.8.0 schema (no waiting receive): the consumer LISTENs as before."""
    db = "pgque_client_080_" + uuid.uuid4().hex[:6]
    base = dsn.replace("dbname=pgque_client_test", "dbname=postgres")
    with psycopg.connect(base, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {db}")
    old = dsn.replace("dbname=pgque_client_test", f"dbname={db}")
    app = "old_" + name
    try:
        with psycopg.connect(old, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pgque VERSION '0.8.0'")
            assert not features(conn).receive_wait
            conn.execute("SELECT pgque.create_queue(%s)", (name,))
            seen = []
            c = pq.Consumer(old, name, "c1", lambda m: seen.append(m.msg_id), handle_signals=False,
                            poll_interval=60, connect_kwargs={"application_name": app})  # fmt: skip
            with Running(c):
                wait_until(lambda: _listening(conn, app), 10, 0.02, "the consumer's LISTEN connection")
                assert not c.server_waits
                i = pq.send(conn, name, {}, type="t")
                wait_until(lambda: seen == [i], 10, 0.01, "the event handled")
                assert not _waiting_in_server(conn, app)
    finally:
        with psycopg.connect(base, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
