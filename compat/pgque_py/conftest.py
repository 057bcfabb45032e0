"""Fixtures of the pgque-py compatibility tier (run through run.sh).

Two databases of one private cluster: `compat_manual` has pgque's worker
stopped (the tests tick by hand and count what ticker() did), and
`compat_worker` runs it (the Consumer class, woken by LISTEN/NOTIFY).
"""

import os
import uuid

import psycopg
import pytest

import pgque

MANUAL = os.environ.get("PGQUE_COMPAT_MANUAL_DSN")
WORKER = os.environ.get("PGQUE_COMPAT_WORKER_DSN")
SUPER = os.environ.get("PGQUE_COMPAT_SUPER_DSN")

if not (MANUAL and WORKER and SUPER):
    raise RuntimeError("run these tests through compat/pgque_py/run.sh")


def fresh_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def client():
    """A PgqueClient on the hand-ticked database, autocommit: each call is
    its own transaction, as the snapshot rule wants between send, ticker and
    receive."""
    with pgque.connect(MANUAL, autocommit=True) as c:
        yield c


@pytest.fixture
def queue(client):
    """A fresh queue with consumer 'c' subscribed."""
    name = fresh_name("q")
    assert client.conn.execute("select pgque.create_queue(%s)", (name,)).fetchone()[0] == 1
    assert client.subscribe(name, "c") == 1
    yield name
    client.conn.execute("select pgque.drop_queue(%s, true)", (name,))


@pytest.fixture
def worker_client():
    with pgque.connect(WORKER, autocommit=True) as c:
        yield c


@pytest.fixture
def worker_queue(worker_client):
    name = fresh_name("wq")
    worker_client.conn.execute("select pgque.create_queue(%s)", (name,))
    yield name
    worker_client.conn.execute("select pgque.drop_queue(%s, true)", (name,))


def tick(client, queue):
    """Send commits first (autocommit), then one tick of the queue."""
    t = client.ticker(queue)
    assert t is not None, "ticker made no tick after a send"
    return t


def sql1(client, sql, args=()):
    return client.conn.execute(sql, args).fetchone()[0]


@pytest.fixture
def superuser():
    with psycopg.connect(SUPER, autocommit=True) as c:
        yield c
