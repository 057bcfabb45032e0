"""Cases of PgQue's own client suites, run against pgque as PgQue runs them.

- pgque-py's tests/test_send.py::test_jsonb_payload_round_trip, with the
  fixtures of its tests/conftest.py: a connection with autocommit off, and a
  queue and consumer named after the pytest node (``pyt_<node name[:40]>_<hex>``),
  so the parameter ids end up in the names.
- PgQue's TypeScript suite (clients/typescript/test/coop.test.ts),
  "unsubscribeSubconsumer batchHandling=1 routes through retry", through
  pgque-py's equivalent calls.
"""

import json
import secrets

import psycopg
import pytest

import pgque
from conftest import MANUAL, sql1


# ---- pgque-py's conftest ------------------------------------------------------


@pytest.fixture
def pq_conn():
    """PgQue's `conn`: a raw psycopg connection, autocommit off."""
    with psycopg.connect(MANUAL) as c:
        yield c


@pytest.fixture
def pq_queue_name(request):
    base = request.node.name.replace("[", "_").replace("]", "_")
    return f"pyt_{base[:40]}_{secrets.token_hex(4)}"


@pytest.fixture
def pq_consumer_name(request):
    base = request.node.name.replace("[", "_").replace("]", "_")
    return f"pyt_c_{base[:38]}_{secrets.token_hex(4)}"


@pytest.fixture
def setup_queue(pq_conn, pq_queue_name, pq_consumer_name):
    """PgQue's `setup_queue`: create queue + register consumer, committed."""
    pq_conn.execute("select pgque.create_queue(%s)", (pq_queue_name,))
    pq_conn.execute(
        "select pgque.register_consumer(%s, %s)", (pq_queue_name, pq_consumer_name)
    )
    pq_conn.commit()
    try:
        yield (pq_queue_name, pq_consumer_name)
    finally:
        try:
            pq_conn.rollback()
            pq_conn.execute(
                "select pgque.unregister_consumer(%s, %s)",
                (pq_queue_name, pq_consumer_name),
            )
            pq_conn.execute("select pgque.drop_queue(%s, true)", (pq_queue_name,))
            pq_conn.commit()
        except Exception:
            pq_conn.rollback()


# ---- tests/test_send.py -------------------------------------------------------

# The JSON string literal's case gets the pytest id `"just a string"-just a
# string`, so its queue is named `pyt_test_jsonb_payload_round_trip_"just a
# st_<hex>`: a double quote and a space, which pgque takes as PgQue does.
@pytest.mark.parametrize(
    "payload,expected",
    [
        ({"key": "val", "n": 1}, {"key": "val", "n": 1}),
        ([1, "two", None], [1, "two", None]),
        ('"just a string"', "just a string"),
        ("42", 42),
        ("null", None),
    ],
)
def test_jsonb_payload_round_trip(pq_conn, setup_queue, payload, expected):
    queue, consumer = setup_queue
    client = pgque.PgqueClient(pq_conn)
    client.send(queue, payload)
    pq_conn.commit()
    pq_conn.execute("select pgque.force_tick(%s)", (queue,))
    pq_conn.execute("select pgque.ticker()")
    pq_conn.commit()
    msgs = client.receive(queue, consumer, max_messages=10)
    assert len(msgs) == 1
    raw = msgs[0].payload
    got = raw if not isinstance(raw, str) else json.loads(raw)
    assert got == expected
    client.ack(msgs[0].batch_id)
    pq_conn.commit()


# ---- clients/typescript/test/coop.test.ts -------------------------------------


def test_unsubscribe_subconsumer_batch_handling_1_routes_through_retry(client):
    queue = f"coop_{secrets.token_hex(4)}"
    sql1(client, "select pgque.create_queue(%s)", (queue,))
    try:
        # setupTestQueue subscribes a normal consumer; the coop tests drop it.
        assert client.subscribe(queue, "c") == 1
        assert client.unsubscribe(queue, "c") == 1
        sub = "worker-flush"
        assert client.subscribe_subconsumer(queue, "c", sub) == 1
        client.send(queue, {"i": 1}, type="t")
        # advanceQueue: force_next_tick, then ticker
        client.force_next_tick(queue)
        client.ticker(queue)
        msgs = client.receive_coop(queue, "c", sub, max_messages=100)
        assert len(msgs) == 1
        removed = client.unsubscribe_subconsumer(queue, "c", sub, batch_handling=1)
        assert removed > 0
        count = sql1(
            client,
            "select count(*)::text from pgque.retry_queue rq "
            "join pgque.queue q on q.queue_id = rq.ev_queue where q.queue_name = %s",
            (queue,),
        )
        assert count == "1"
    finally:
        sql1(client, "select pgque.drop_queue(%s, true)", (queue,))
