"""Event consumers against a real server: Consumer and PartitionedConsumer."""

from __future__ import annotations

import collections
import threading
import time

import pytest

import pgque_client as pq
from conftest import wait_until
from test_worker import Running


def test_consumer_handles_acks_and_nacks(dsn, conn, name):
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe(%s, 'c1')", (name,))
    ids = pq.send_batch(conn, name, [{"i": i} for i in range(50)], type="t")
    seen = []
    retried = []

    def handle(m: pq.Message):
        if m.json()["i"] == 7 and m.retry_count is None:
            raise ValueError("first delivery of 7 fails")
        if m.retry_count:
            retried.append((m.msg_id, m.retry_count))
        seen.append(m.msg_id)

    c = pq.Consumer(dsn, name, "c1", handle, poll_interval=0.2, retry_after=0, handle_signals=False)
    with Running(c):
        wait_until(lambda: len(seen) == 50, 30, 0.05, "every event handled")
    assert sorted(seen) == sorted(ids)
    assert [s for s in seen if s != ids[7]] == [i for i in ids if i != ids[7]]  # in order
    assert retried == [(ids[7], 1)]
    info = conn.execute(
        "SELECT pending_events FROM pgque.get_consumer_info(%s, 'c1')", (name,)
    ).fetchone()
    assert info == (0,)


def test_cooperative_members_share_the_stream(dsn, conn, name):
    """Two members of one cooperative consumer (``subconsumer=``,
    ``pgque.receive_coop``): every event handled once by one of them, a
    nack redelivered; a normal consumer beside them still gets every event."""
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe(%s, 'all')", (name,))
    for m in ("m1", "m2"):
        conn.execute("SELECT pgque.register_subconsumer(%s, 'grp', %s)", (name, m))
    seen: list[tuple[str, int, int | None]] = []

    def handler(member: str):
        def handle(m: pq.Message):
            if m.json()["i"] == 7 and m.retry_count is None:
                raise ValueError("first delivery of 7 fails")
            seen.append((member, m.msg_id, m.retry_count))
            time.sleep(0.02)  # slow, so the other member gets batches too

        return handle

    members = [
        pq.Consumer(dsn, name, "grp", handler(m), subconsumer=m, batch_size=5, poll_interval=0.1,
                    retry_after=0, handle_signals=False)
        for m in ("m1", "m2")
    ]  # fmt: skip
    ids = []
    for r in range(8):
        ids += pq.send_batch(conn, name, [{"i": r * 5 + i} for i in range(5)], type="t")
        conn.execute("SELECT pgque.force_tick(%s)", (name,))
    with Running(members[0]), Running(members[1]):
        wait_until(lambda: len(seen) == 40, 60, 0.05, "every event handled")
    assert sorted(s[1] for s in seen) == sorted(ids)
    assert any(s[1] == ids[7] and s[2] == 1 for s in seen)
    assert {s[0] for s in seen} == {"m1", "m2"}
    conn.execute("SELECT pgque.force_tick(%s)", (name,))
    total = 0
    while rows := conn.execute("SELECT batch_id FROM pgque.receive(%s, 'all', 1000)", (name,)).fetchall():
        total += len(rows)
        conn.execute("SELECT pgque.ack(%s)", (rows[0][0],))
    assert total >= 40


def _slots(conn, queue, consumer):
    return conn.execute(
        "SELECT slot, pending_events, last_tick, lease_owner FROM pgque.partition_slot_status "
        "WHERE queue_name = %s AND consumer = %s ORDER BY slot",
        (queue, consumer),
    ).fetchall()


def _last_tick(conn, queue):
    return conn.execute("SELECT last_tick_id FROM pgque.get_queue_info(%s)", (queue,)).fetchone()[0]


def test_partitioned_consumer_fewer_workers_than_slots_polls_every_slot(dsn, conn, name):
    n, m = 8, 3
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe_partitioned(%s, 'pc', %s)", (name, n))
    keys = [f"key-{k}" for k in range(40)]
    sent = collections.defaultdict(list)
    for round_ in range(5):
        ids = pq.send_batch(conn, name, [{"r": round_, "k": k} for k in keys], type="t", partition_keys=keys)
        for k, i in zip(keys, ids):
            sent[k].append(i)
    got = collections.defaultdict(list)
    holders = collections.defaultdict(set)
    lock = threading.Lock()

    def handle(msg: pq.Message):
        with lock:
            got[msg.partition_key].append(msg.msg_id)
            holders[msg.partition_key].add(threading.current_thread().name)

    pc = pq.PartitionedConsumer(dsn, name, "pc", n, handle, workers=m, poll_interval=0.3, handle_signals=False)
    with Running(pc):
        conn.execute("SELECT pgque.force_tick(%s)", (name,))
        t1 = _last_tick(conn, name)
        wait_until(
            lambda: all(p == 0 and lt >= t1 for _, p, lt, _ in _slots(conn, name, "pc")),
            60, 0.1, "pending events of every slot at 0",
        )  # fmt: skip
        # Idle slots are polled too: every slot's position follows a new tick.
        conn.execute("SELECT pgque.force_tick(%s)", (name,))
        t2 = _last_tick(conn, name)
        wait_until(lambda: all(lt >= t2 for _, _, lt, _ in _slots(conn, name, "pc")), 30, 0.1, "every slot polled")
    assert sum(len(v) for v in got.values()) == len(keys) * 5
    for k in keys:
        assert got[k] == sent[k], f"key {k}: out of order or missing"
    assert len(_slots(conn, name, "pc")) == n


def test_partitioned_worker_that_loses_its_lease_stops_processing_the_slot(dsn, conn, name):
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe_partitioned(%s, 'pc', 1)", (name,))
    ids = pq.send_batch(conn, name, [{"i": i} for i in range(5)], type="t", partition_keys=["k"] * 5)
    handled = []
    in_first = threading.Event()
    go_on = threading.Event()

    def handle(msg: pq.Message):
        handled.append(msg.msg_id)
        if len(handled) == 1:
            in_first.set()
            go_on.wait(30)  # past the 1 s lease, without renewing it

    pc = pq.PartitionedConsumer(
        dsn, name, "pc", 1, handle, workers=1, ttl=1, poll_interval=0.2, handle_signals=False, worker_id="A"
    )
    with Running(pc):
        conn.execute("SELECT pgque.force_tick(%s)", (name,))
        assert in_first.wait(20)
        # The lease lapses; another worker takes the slot over.
        wait_until(lambda: _slots(conn, name, "pc")[0][3] is None, 10, 0.05, "A's lease to lapse")
        epoch = conn.execute("SELECT pgque.claim_slot(%s, 'pc', 0, 'thief', '60 seconds')", (name,)).fetchone()[0]
        assert epoch is not None
        go_on.set()
        wait_until(lambda: pc.lost_slots >= 1, 10, 0.05, "A to notice the take-over")
        time.sleep(0.5)
        # A handled the one message it was in, nothing more of that slot, and acked nothing.
        assert handled == [ids[0]]
        rows = conn.execute(
            "SELECT msg_id FROM pgque.receive_partitioned(%s, 'pc', 0, 1, 'thief', 100)", (name,)
        ).fetchall()
        assert [r[0] for r in rows] == ids  # the new owner gets the whole batch again
        assert conn.execute("SELECT pgque.ack_partitioned(%s, 'pc', 0, 1, 'thief')", (name,)).fetchone() == (1,)
    assert handled == [ids[0]]


def test_partitioned_consumer_pause_keeps_a_failed_keys_order(dsn, conn, name):
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe_partitioned(%s, 'pp', 1, failure_policy => 'pause')", (name,))
    keys = ["a", "b", "a", "b", "a", "a"]
    ids = pq.send_batch(conn, name, [{"i": i} for i in range(len(keys))], type="t", partition_keys=keys)
    done = []
    lock = threading.Lock()
    failed_once = threading.Event()

    def handle(msg: pq.Message):
        # The first delivery of a's first event fails.
        if msg.msg_id == ids[0] and not failed_once.is_set():
            failed_once.set()
            raise ValueError("a's first event fails once")
        with lock:
            done.append((msg.partition_key, msg.msg_id))

    pc = pq.PartitionedConsumer(
        dsn, name, "pp", 1, handle, poll_interval=0.2, retry_after=0, handle_signals=False,
        failure_policy="pause",
    )  # fmt: skip
    with Running(pc):
        conn.execute("SELECT pgque.force_tick(%s)", (name,))
        wait_until(lambda: len(done) == len(keys), 30, 0.05, "every event handled")
    assert failed_once.is_set()
    assert [i for k, i in done if k == "a"] == [ids[0], ids[2], ids[4], ids[5]]  # a in order, the failed first
    assert [i for k, i in done if k == "b"] == [ids[1], ids[3]]
    assert conn.execute(
        "SELECT pc_failure_policy FROM pgque.partition_consumer WHERE pc_consumer = 'pp'"
    ).fetchone() == ("pause",)
    assert conn.execute("SELECT count(*) FROM pgque.partition_blocked_keys WHERE consumer = 'pp'").fetchone() == (0,)
    # The policy is the consumer's: another one is refused.
    with pytest.raises(pq.errors.InvalidParameterValue):
        pq.PartitionedConsumer(dsn, name, "pp", 1, handle, handle_signals=False).run()


def _resize(conn, queue, consumer, new_n):
    """An operator's online resize: begin, wait until every old slot drained, complete."""
    conn.execute("SELECT pgque.begin_resize(%s, %s, %s)", (queue, consumer, new_n))
    wait_until(
        lambda: conn.execute(
            "SELECT bool_and(ready) FROM pgque.resize_ready(%s, %s)", (queue, consumer)
        ).fetchone()[0],
        60, 0.1, f"the old slots to drain (resize to {new_n})",
    )  # fmt: skip
    assert conn.execute("SELECT pgque.complete_resize(%s, %s)", (queue, consumer)).fetchone() == (new_n,)


def test_partitioned_consumer_follows_an_online_resize_without_a_restart(dsn, conn, name):
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe_partitioned(%s, 'pr', 4)", (name,))
    keys = [f"key-{k}" for k in range(30)]
    sent = collections.defaultdict(list)
    got = collections.defaultdict(list)
    lock = threading.Lock()

    def send_round(r):
        ids = pq.send_batch(conn, name, [{"r": r, "k": k} for k in keys], type="t", partition_keys=keys)
        for k, i in zip(keys, ids):
            sent[k].append(i)

    def handle(msg: pq.Message):
        with lock:
            got[msg.partition_key].append(msg.msg_id)

    def all_handled():
        with lock:
            return sum(len(v) for v in got.values()) == sum(len(v) for v in sent.values())

    pc = pq.PartitionedConsumer(dsn, name, "pr", 4, handle, workers=3, poll_interval=0.2, handle_signals=False)
    with Running(pc):
        for r in range(3):
            send_round(r)
        _resize(conn, name, "pr", 8)  # grow while events of before the seal are consumed
        for r in range(3, 6):
            send_round(r)
        conn.execute("SELECT pgque.force_tick(%s)", (name,))
        wait_until(all_handled, 60, 0.1, "every event handled after the grow")
        assert pc.n == 8
        for r in range(6, 9):
            send_round(r)
        _resize(conn, name, "pr", 2)  # shrink
        send_round(9)
        conn.execute("SELECT pgque.force_tick(%s)", (name,))
        wait_until(all_handled, 60, 0.1, "every event handled after the shrink")
        assert pc.n == 2
    for k in keys:
        assert got[k] == sent[k], f"key {k}: out of order, missing or twice across the resizes"
    assert len(_slots(conn, name, "pr")) == 2
    # A consumer started later with the N it was first given follows the server's.
    pc2 = pq.PartitionedConsumer(dsn, name, "pr", 4, handle, poll_interval=0.2, handle_signals=False)
    with Running(pc2):
        send_round(10)
        conn.execute("SELECT pgque.force_tick(%s)", (name,))
        wait_until(all_handled, 60, 0.1, "every event handled by the restarted consumer")
    assert pc2.n == 2
    for k in keys:
        assert got[k] == sent[k]
