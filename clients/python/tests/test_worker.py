"""The job worker against a real server: exactly once, retries, heartbeats,
graceful SIGTERM, LISTEN wake-ups, outputs and progress where the server has them."""

from __future__ import annotations

import collections
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import pytest

import pgque_client as pq
from pgque_client import errors
from pgque_client._features import features
from conftest import job_states, wait_until


class Running:
    """Runs worker.run() in a thread; stops and joins it on exit."""

    def __init__(self, worker):
        self.worker = worker
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            self.worker.run()
        except BaseException as e:  # noqa: BLE001
            self.error = e

    def __enter__(self):
        self.thread.start()
        return self.worker

    def __exit__(self, *exc):
        self.worker.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "worker did not stop"
        if self.error and not exc[0]:
            raise self.error


def test_exactly_once_with_8_concurrent_handlers(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    n = 300
    pq.enqueue_many(conn, name, [("work", {"i": i}) for i in range(n)])
    seen = collections.Counter()
    lock = threading.Lock()
    active = [0, 0]  # now, max

    def work(job):
        with lock:
            seen[job.id] += 1
            active[0] += 1
            active[1] = max(active[1], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return {"i": job.args["i"]}

    # Two workers of 4 handler threads compete for one queue: 8 handlers.
    workers = [pq.Worker(dsn, [name], concurrency=4, poll_interval=0.2, handle_signals=False) for _ in range(2)]
    for w in workers:
        w.register("work", work)
    with Running(workers[0]), Running(workers[1]):
        wait_until(lambda: job_states(conn, name) == {"completed": n}, 60, 0.2, "every job completed")
    assert len(seen) == n
    assert set(seen.values()) == {1}, "a job ran twice"
    assert active[1] == 8, f"expected 8 handlers at once, saw {active[1]}"
    assert sum(w.completed for w in workers) == n


def test_failing_handler_is_retried_with_traceback(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    flaky = pq.enqueue(conn, name, "flaky", {})
    doomed = pq.enqueue(conn, name, "doomed", {}, max_attempts=1)
    orphan = pq.enqueue(conn, name, "no_handler_for_this", {}, max_attempts=1)
    attempts = collections.defaultdict(list)
    w = pq.Worker(dsn, name, concurrency=2, poll_interval=0.2, handle_signals=False)

    @w.handler("flaky")
    def flaky_h(job):
        attempts[job.id].append(job.attempt)
        if job.attempt == 1:
            raise ValueError("boom on the first attempt")
        return "ok"

    @w.handler("doomed")
    def doomed_h(job):
        attempts[job.id].append(job.attempt)
        raise RuntimeError("always")

    with Running(w):
        wait_until(
            lambda: job_states(conn, name) == {"completed": 1, "failed": 2}, 30, 0.2, "the retry and the failures"
        )
    assert attempts[flaky] == [1, 2]
    assert attempts[doomed] == [1]
    errs = conn.execute("SELECT errors::text FROM pgque.get_job(%s)", (flaky,)).fetchone()[0]
    assert "ValueError: boom on the first attempt" in errs and "Traceback" in errs
    errs = conn.execute("SELECT state, errors::text FROM pgque.get_job(%s)", (orphan,)).fetchone()
    assert errs[0] == "failed" and "no handler for job kind" in errs[1]


@pytest.mark.parametrize("heartbeats", [True, False])
def test_heartbeats_keep_a_long_handler_alive(dsn, conn, name, heartbeats):
    """A 2 s lease and a 4 s handler: with heartbeats it runs once; without
    (the control) the server's rescue hands the job out again meanwhile."""
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    jid = pq.enqueue(conn, name, "long", {})
    runs = []
    w = pq.Worker(
        dsn, name, concurrency=2, lease=2.0, poll_interval=0.2, handle_signals=False, shutdown_timeout=0.5,
        heartbeat_interval=0.5 if heartbeats else 3600,
    )  # fmt: skip

    @w.handler("long")
    def long_h(job):
        runs.append(job.attempt)
        time.sleep(4)

    with Running(w):
        if heartbeats:
            wait_until(lambda: job_states(conn, name).get("completed") == 1, 30, 0.2, "completion")
        else:
            wait_until(lambda: len(runs) >= 2, 30, 0.1, "a second run after the rescue")
    if heartbeats:
        assert runs == [1]
        assert conn.execute("SELECT state, attempt FROM pgque.get_job(%s)", (jid,)).fetchone() == ("completed", 1)
    else:
        assert runs[:2] == [1, 2]


def test_sigterm_mid_batch_loses_nothing(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    n = 60
    ids = [e.job_id for e in pq.enqueue_many(conn, name, [("slow", {"i": i}) for i in range(n)])]
    script = os.path.join(os.path.dirname(__file__), "sigterm_worker.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))

    def handled():
        return conn.execute("SELECT count(*) FROM handled WHERE job_id = ANY(%s)", (ids,)).fetchone()[0]

    p = subprocess.Popen([sys.executable, script, dsn, name], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "ready"
    wait_until(lambda: handled() >= 8, 30, 0.02, "some jobs handled")
    running = job_states(conn, name).get("running", 0)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0, out
    assert running > 0, "SIGTERM came between batches; the test wants it mid-batch"
    st = job_states(conn, name)
    # Drained: nothing left running, and every job a handler finished is completed.
    assert st.get("running", 0) == 0, st
    done_first = handled()
    assert st.get("completed", 0) == done_first, (st, done_first)
    assert done_first < n
    # Restart: the rest is done, each job completed once.
    p = subprocess.Popen([sys.executable, script, dsn, name], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "ready"
    wait_until(lambda: job_states(conn, name) == {"completed": n}, 60, 0.1, "every job completed after restart")
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    assert p.returncode == 0
    counts = dict(conn.execute(
        "SELECT job_id, count(*) FROM handled WHERE job_id = ANY(%s) GROUP BY job_id", (ids,)
    ).fetchall())  # fmt: skip
    assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}


def test_listen_wakes_an_idle_worker(dsn, conn, name):
    """With a 60 s poll interval only the NOTIFY can wake the worker in time."""
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    got = {}
    w = pq.Worker(dsn, name, concurrency=1, poll_interval=60, handle_signals=False)

    @w.handler("ping")
    def ping(job):
        got[job.args["i"]] = time.monotonic()

    lat = []
    with Running(w):
        time.sleep(1.0)  # idle: the worker sleeps on its 60 s poll
        for i in range(5):
            t0 = time.monotonic()
            pq.enqueue(conn, name, "ping", {"i": i})
            wait_until(lambda: i in got, 10, 0.005, f"job {i} handled")
            lat.append(got[i] - t0)
            time.sleep(0.3)
    print(f"\nLISTEN wake-up latency (commit -> handler): median {statistics.median(lat) * 1000:.1f} ms, "
          f"max {max(lat) * 1000:.1f} ms")  # fmt: skip
    assert max(lat) < 10


def test_outputs_and_progress_where_supported(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    jid = pq.enqueue(conn, name, "calc", {"x": 20})
    f = features(conn)
    seen = {}
    w = pq.Worker(dsn, name, concurrency=1, poll_interval=0.2, handle_signals=False)

    @w.handler("calc")
    def calc(job):
        try:
            seen["progress"] = job.progress({"pct": 50})
        except errors.ServerFeatureMissing:
            seen["progress"] = "missing"
        return {"y": job.args["x"] * 2}

    with Running(w):
        wait_until(lambda: job_states(conn, name) == {"completed": 1}, 30, 0.1, "completion")
    if f.progress:
        assert seen["progress"] is True
    else:
        assert seen["progress"] == "missing"
    if f.outputs:
        out = conn.execute("SELECT output FROM pgque.get_job(%s)", (jid,)).fetchone()[0]
        assert out == {"y": 40}


def test_graceful_stop_hands_back_jobs_past_the_timeout(dsn, conn, name):
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    jid = pq.enqueue(conn, name, "stuck", {})
    release = threading.Event()
    started = threading.Event()
    w = pq.Worker(dsn, name, concurrency=1, poll_interval=0.2, shutdown_timeout=0.5, handle_signals=False)

    @w.handler("stuck")
    def stuck(job):
        started.set()
        release.wait(30)

    with Running(w):
        assert started.wait(10)
    release.set()
    row = conn.execute("SELECT state FROM pgque.get_job(%s)", (jid,)).fetchone()
    assert row[0] in ("ready", "scheduled"), row
    # Handed back: the next worker runs it at once, and the attempt was not consumed.
    again = []
    w2 = pq.Worker(dsn, name, concurrency=1, poll_interval=0.2, handle_signals=False)
    w2.register("stuck", lambda job: again.append(job.attempt))
    with Running(w2):
        wait_until(lambda: job_states(conn, name) == {"completed": 1}, 30, 0.1, "the handed-back job done")
    assert again == [1]


def test_unknown_queue_is_a_typed_error_from_run(dsn, name):
    w = pq.Worker(dsn, ["no_such_" + name], handle_signals=False)
    with pytest.raises(errors.UndefinedObject):
        w.run()
