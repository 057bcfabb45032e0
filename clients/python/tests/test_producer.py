"""Producers on the caller's connection and transaction, typed errors."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

import pgque_client as pq
from pgque_client import errors
from pgque_client._features import features
from conftest import job_states


def test_enqueue_runs_in_the_callers_transaction(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    with psycopg.connect(dsn) as tx:  # not autocommit: one transaction
        jid = pq.enqueue(tx, name, "welcome", {"to": 1})
        assert isinstance(jid, int)
        tx.rollback()
    assert job_states(conn, name) == {}
    with psycopg.connect(dsn) as tx:
        jid = pq.enqueue(tx, name, "welcome", {"to": 2})
        # Not visible to others before the caller commits.
        assert job_states(conn, name) == {}
        tx.commit()
    assert job_states(conn, name) == {"ready": 1}
    row = conn.execute("SELECT kind, args FROM pgque.get_job(%s)", (jid,)).fetchone()
    assert row == ("welcome", {"to": 2})


def test_enqueue_options_by_name(conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    jid = pq.enqueue(conn, name, "k", {"a": 1}, priority=7, max_attempts=3, unique_key="u1", run_at=later, actor="t-1")
    row = conn.execute(
        "SELECT priority, max_attempts, unique_key, state, actor FROM pgque.get_job(%s)", (jid,)
    ).fetchone()
    assert row == (7, 3, "u1", "scheduled", "t-1")
    # A duplicate unique key: skip returns the holder, 'error' raises 23505.
    assert pq.enqueue(conn, name, "k", {}, unique_key="u1") == jid
    with pytest.raises(errors.DuplicateJob) as ei:
        pq.enqueue(conn, name, "k", {}, unique_key="u1", on_duplicate="error")
    assert ei.value.sqlstate == "23505"


def test_unknown_option_is_refused_before_sending(dsn, name):
    with psycopg.connect(dsn) as tx:
        with pytest.raises(errors.InvalidParameterValue, match="no parameter 'colour'"):
            pq.enqueue(tx, name, "k", {}, colour="red")
        # Nothing reached the server: the transaction is still usable.
        assert tx.execute("SELECT 1").fetchone() == (1,)


def test_typed_errors_by_sqlstate(conn, name):
    with pytest.raises(errors.UndefinedObject):
        pq.enqueue(conn, "no_such_queue_" + name, "k", {})
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    with pytest.raises(errors.InvalidParameterValue):
        pq.enqueue(conn, name, "", {})
    with pytest.raises(errors.NumericValueOutOfRange):
        pq.enqueue(conn, name, "k", {}, priority=5000)
    with pytest.raises(errors.InvalidName):
        pq.send(conn, "bad\nname; drop", {"x": 1})
    with pytest.raises(errors.UndefinedObject):
        pq.send(conn, "no_such_" + name, {"x": 1})
    # Every typed error is a PgqueError and keeps psycopg's error as its cause.
    try:
        pq.send(conn, "no_such_" + name, {"x": 1})
    except pq.PgqueError as e:
        assert isinstance(e.__cause__, psycopg.Error) and e.sqlstate == "42704"


def test_enqueue_many_in_order_with_duplicates(conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    got = pq.enqueue_many(
        conn,
        name,
        [("a", {"i": 0}), {"kind": "b", "args": {"i": 1}, "unique_key": "x"}, {"kind": "c", "unique_key": "x"}],
    )
    assert [g.state for g in got] == ["ready", "ready", "duplicate"]
    assert got[0].job_id < got[1].job_id and got[2].job_id == got[1].job_id
    kinds = conn.execute(
        "SELECT kind FROM pgque.all_jobs WHERE queue = %s ORDER BY id", (name,)
    ).fetchall()
    assert kinds == [("a",), ("b",)]
    assert pq.enqueue_many(conn, name, []) == []
    with pytest.raises(errors.InvalidParameterValue):
        pq.enqueue_many(conn, name, [{"kind": "a", "colour": "red"}])


def test_enqueue_flow_where_the_server_has_it(conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    jobs = [{"key": "a", "kind": "x", "args": {}}, {"key": "b", "kind": "y", "args": {}, "depends_on": ["a"]}]
    if not features(conn).flows:
        with pytest.raises(errors.ServerFeatureMissing):
            pq.enqueue_flow(conn, name, jobs)
        return
    rows = pq.enqueue_flow(conn, name, jobs)
    assert sorted(r.key for r in rows) == ["a", "b"]
    assert len({r.flow_id for r in rows}) == 1


def _receive_all(conn, queue, consumer):
    conn.execute("SELECT pgque.force_tick(%s)", (queue,))
    rows = conn.execute("SELECT * FROM pgque.receive(%s, %s, 1000)", (queue, consumer)).fetchall()
    if rows:
        conn.execute("SELECT pgque.ack(%s)", (rows[0][1],))
    return rows


def test_send_send_batch_send_idem(dsn, conn, name):
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe(%s, 'c')", (name,))
    with psycopg.connect(dsn) as tx:
        pq.send(tx, name, {"lost": True})
        tx.rollback()
    a = pq.send(conn, name, {"n": 1})
    b = pq.send(conn, name, "plain text", type="t.text")
    c = pq.send(conn, name, {"n": 3}, type="t.key", partition_key="tenant-9")
    ids = pq.send_batch(conn, name, [{"n": 4}, {"n": 5}], type="t.batch", partition_keys=["k1", None])
    tids = pq.send_batch(conn, name, ["x", "y"])
    first = pq.send_idem(conn, name, "t.idem", {"n": 6}, "effect:6")
    again = pq.send_idem(conn, name, "t.idem", {"n": 6}, "effect:6", ttl=timedelta(minutes=5))
    assert not first.deduped and again.deduped and again.event_id == first.event_id
    rows = _receive_all(conn, name, "c")
    by_id = {r[0]: r for r in rows}
    assert sorted(by_id) == sorted([a, b, c, *ids, *tids, first.event_id])
    assert by_id[a][2:4] == ("default", '{"n": 1}')
    assert by_id[b][2:4] == ("t.text", "plain text")
    assert by_id[c][6] == "tenant-9"
    assert [by_id[i][6] for i in ids] == ["k1", None]
    assert [by_id[i][3] for i in tids] == ["x", "y"]


def test_asyncio_twin(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    conn.execute("SELECT pgque.create_queue(%s)", (name,))

    async def main():
        async with await psycopg.AsyncConnection.connect(dsn) as ac:
            jid = await pq.aio.enqueue(ac, name, "k", {"a": 1}, priority=2)
            many = await pq.aio.enqueue_many(ac, name, [("k", {"a": 2})])
            ev = await pq.aio.send(ac, name, {"e": 1})
            idem = await pq.aio.send_idem(ac, name, "t", {"e": 2}, "once")
            with pytest.raises(errors.UndefinedObject):
                await pq.aio.send(ac, "nope_" + name, {"e": 1})
            await ac.rollback()
            jid2 = await pq.aio.enqueue(ac, name, "k", {"a": 3})
            await ac.commit()
            return jid, many, ev, idem, jid2

    jid, many, ev, idem, jid2 = asyncio.run(main())
    assert isinstance(jid, int) and many[0].state == "ready" and isinstance(ev, int) and not idem.deduped
    # The first transaction was rolled back (after the error), the second committed.
    assert conn.execute("SELECT count(*) FROM pgque.all_jobs WHERE queue = %s", (name,)).fetchone() == (1,)
    assert conn.execute("SELECT id FROM pgque.all_jobs WHERE queue = %s", (name,)).fetchone() == (jid2,)
