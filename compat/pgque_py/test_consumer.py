"""pgque-py 0.2.2's Consumer against pgque with its background worker
running: handlers, nack on failure, unknown types, cooperative members and
the LISTEN wake-up (the worker's tick NOTIFYs pgque_<queue>)."""

import threading
import time

import pytest

import pgque
from conftest import WORKER

# Long enough that a test passing in seconds cannot have been woken by the
# poll timer: only a NOTIFY on pgque_<queue> wakes the consumer that fast.
POLL = 60


def run_consumer(consumer):
    t = threading.Thread(target=consumer.start, daemon=True)
    t.start()
    return t


def stop(consumer, thread):
    consumer.stop()
    thread.join(timeout=10)
    assert not thread.is_alive(), "Consumer.stop() did not end start()"


def wait_for(pred, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def consumer_for(queue, name, **kw):
    return pgque.Consumer(WORKER, queue=queue, name=name, poll_interval=POLL, **kw)


def test_listen_wakes_the_consumer_and_handlers_run(worker_client, worker_queue):
    worker_client.subscribe(worker_queue, "app")
    got, anything = [], []
    cons = consumer_for(worker_queue, "app")

    @cons.on("order.created")
    def handle(msg):
        got.append((msg.type, msg.payload, msg.retry_count))

    @cons.on("*")
    def other(msg):
        anything.append(msg.type)

    th = run_consumer(cons)
    time.sleep(1.0)  # the consumer's first poll found nothing and waits on LISTEN
    t0 = time.monotonic()
    worker_client.send(worker_queue, {"id": 1}, type="order.created")
    worker_client.send(worker_queue, {"id": 2}, type="misc")
    assert wait_for(lambda: len(got) == 1 and len(anything) == 1), (got, anything)
    woke_in = time.monotonic() - t0
    stop(cons, th)
    assert got == [("order.created", '{"id": 1}', None)]
    assert anything == ["misc"]
    assert woke_in < POLL / 4, f"woken after {woke_in:.1f}s: by polling, not by NOTIFY"
    # The consumer acked its batch: nothing is left for it.
    assert worker_client.receive(worker_queue, "app") == []


def test_longest_queue_name_wakes_too(worker_client):
    name = "w" * 57
    worker_client.conn.execute("select pgque.create_queue(%s)", (name,))
    try:
        worker_client.subscribe(name, "app")
        seen = []
        cons = consumer_for(name, "app")
        cons.on("*")(lambda m: seen.append(m.msg_id))
        th = run_consumer(cons)
        time.sleep(1.0)
        eid = worker_client.send(name, {"x": 1})
        assert wait_for(lambda: seen == [eid], timeout=POLL / 4), seen
        stop(cons, th)
    finally:
        worker_client.conn.execute("select pgque.drop_queue(%s, true)", (name,))


def test_failing_handler_nacks_and_the_event_comes_back(worker_client, worker_queue):
    worker_client.subscribe(worker_queue, "app")
    attempts = []
    cons = consumer_for(worker_queue, "app", retry_after=0)

    @cons.on("*")
    def flaky(msg):
        attempts.append(msg.retry_count)
        if len(attempts) == 1:
            raise RuntimeError("first delivery fails")

    th = run_consumer(cons)
    time.sleep(0.5)
    worker_client.send(worker_queue, {"job": 1})
    # The retry is moved back by the worker's maint and ticked; a NOTIFY wakes
    # the consumer again.
    assert wait_for(lambda: len(attempts) >= 2, timeout=30), attempts
    stop(cons, th)
    assert attempts[:2] == [None, 1]


def test_unknown_types_nack_to_the_dead_letters_or_ack(worker_client, worker_queue):
    worker_client.conn.execute(
        "select pgque.set_queue_config(%s, 'max_retries', '0')", (worker_queue,)
    )
    worker_client.subscribe(worker_queue, "strict")
    worker_client.subscribe(worker_queue, "lenient")
    strict = consumer_for(worker_queue, "strict")
    lenient = consumer_for(worker_queue, "lenient", unknown_handler_policy="ack")
    handled = []
    strict.on("known")(lambda m: handled.append(("strict", m.type)))
    lenient.on("known")(lambda m: handled.append(("lenient", m.type)))
    threads = [run_consumer(strict), run_consumer(lenient)]
    time.sleep(0.5)
    worker_client.send(worker_queue, {"a": 1}, type="known")
    eid = worker_client.send(worker_queue, {"b": 2}, type="surprise")
    assert wait_for(lambda: sorted(handled) == [("lenient", "known"), ("strict", "known")])

    def dead():
        return worker_client.conn.execute(
            "select ev_id, dl_reason from pgque.dlq_inspect(%s)", (worker_queue,)
        ).fetchall()

    # strict nacks the unknown type: with max_retries 0 it is dead at once.
    assert wait_for(lambda: len(dead()) == 1)
    stop(strict, threads[0])
    stop(lenient, threads[1])
    assert dead() == [(eid, "no handler for type=surprise")]
    with pytest.raises(ValueError):
        pgque.Consumer(WORKER, queue=worker_queue, name="x", unknown_handler_policy="drop")


def test_cooperative_consumers_share_the_stream(worker_client, worker_queue):
    with pytest.raises(ValueError):
        pgque.Consumer(WORKER, queue=worker_queue, name="grp", dead_interval="1 minute")
    lock = threading.Lock()
    seen = {}

    def member(name):
        c = consumer_for(worker_queue, "grp", subconsumer=name, dead_interval="5 minutes")

        @c.on("*")
        def h(msg):
            with lock:
                seen.setdefault(msg.msg_id, []).append(name)
            time.sleep(0.01)

        return c

    members = [member("w1"), member("w2")]
    threads = [run_consumer(m) for m in members]
    # receive_coop registered both members on their first call.
    assert wait_for(
        lambda: worker_client.touch_subconsumer(worker_queue, "grp", "w1") == 1
        and worker_client.touch_subconsumer(worker_queue, "grp", "w2") == 1
    )
    ids = []
    for i in range(5):
        ids += worker_client.send_batch(worker_queue, "t", [{"i": i, "j": j} for j in range(4)])
        time.sleep(0.05)
    assert wait_for(lambda: len(seen) == len(ids), timeout=30), len(seen)
    for m, t in zip(members, threads):
        stop(m, t)
    assert sorted(seen) == sorted(ids)
    assert all(len(v) == 1 for v in seen.values()), "an event went to two members"
