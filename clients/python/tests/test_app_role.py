"""The client as an application runs it: a role with only pgque_writer and
pgque_reader, logging in over TCP with a scram-sha-256 password
(clients/run.sh makes it and exports PGQUE_TEST_APP_*). An administrator
(the superuser fixtures) makes the queues, as docs/operations.md says one
does; producers, the job Worker with an exactly-once handler, a Consumer and
a PartitionedConsumer then run as the application role alone."""

from __future__ import annotations

import collections
import os
import threading

import psycopg
import pytest

import pgque_client as pq
from conftest import DB, job_states, wait_until
from test_worker import Running


@pytest.fixture(scope="module")
def app_dsn(dsn: str) -> str:
    host = os.environ.get("PGQUE_TEST_APP_HOST")
    if not host:
        pytest.fail("PGQUE_TEST_APP_HOST not set: run these tests through clients/run.sh")
    port = os.environ["PGQUE_TEST_PORT"]
    user = os.environ["PGQUE_TEST_APP_USER"]
    password = os.environ["PGQUE_TEST_APP_PASSWORD"]
    with psycopg.connect(dsn, autocommit=True) as c:
        # what the application's own tables need, granted as an owner would
        c.execute("CREATE TABLE IF NOT EXISTS app_effects (job_id bigint, note text)")
        c.execute(f"GRANT SELECT, INSERT ON app_effects TO {user}")
    return f"host={host} port={port} dbname={DB} user={user} password={password}"


def test_the_role_logs_in_with_scram_over_tcp_and_holds_only_pgques_groups(app_dsn: str) -> None:
    with psycopg.connect(app_dsn) as c:
        who, addr, superuser = c.execute(
            "SELECT current_user, inet_server_addr()::text, rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        groups = [r[0] for r in c.execute(
            "SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
            "WHERE m.member = (SELECT oid FROM pg_roles WHERE rolname = current_user) ORDER BY 1"
        )]  # fmt: skip
    assert (who, addr, superuser) == (os.environ["PGQUE_TEST_APP_USER"], "127.0.0.1/32", False)
    assert groups == ["pgque_reader", "pgque_writer"]
    # the password is what lets it in
    wrong = app_dsn.replace(os.environ["PGQUE_TEST_APP_PASSWORD"], "not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong).close()
    # and administration is not its to do
    with psycopg.connect(app_dsn, autocommit=True) as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
        c.execute("SELECT pgque.create_queue('app_may_not')")


def test_producer_worker_and_exactly_once_handler_as_the_application(
    app_dsn: str, conn: psycopg.Connection, name: str
) -> None:
    conn.execute("SELECT pgque.create_job_queue(%s)", (name,))
    with psycopg.connect(app_dsn) as app:  # the application's own transaction
        ids = [e.job_id for e in pq.enqueue_many(app, name, [("work", {"i": i}) for i in range(40)])]
        # rolled back with the application's transaction: nothing enqueued
        with app.transaction(force_rollback=True):
            pq.enqueue(app, name, "work", {"i": -1})
    assert len(ids) == 40
    seen: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()

    def work(job: pq.Job, tx: psycopg.Connection) -> dict[str, int]:
        tx.execute("INSERT INTO app_effects (job_id, note) VALUES (%s, %s)", (job.id, name))
        with lock:
            seen[job.id] += 1
        return {"i": job.args["i"]}

    w = pq.Worker(app_dsn, [name], concurrency=4, poll_interval=0.2, handle_signals=False)
    w.register("work", work)
    with Running(w):
        wait_until(lambda: job_states(conn, name) == {"completed": 40}, 60, 0.1, "every job completed")
    assert set(seen) == set(ids) and set(seen.values()) == {1}
    effects = conn.execute(
        "SELECT count(*), count(DISTINCT job_id) FROM app_effects WHERE note = %s", (name,)
    ).fetchone()
    assert effects == (40, 40)


def test_consumers_as_the_application(app_dsn: str, conn: psycopg.Connection, name: str) -> None:
    conn.execute("SELECT pgque.create_queue(%s)", (name,))
    conn.execute("SELECT pgque.subscribe(%s, 'app')", (name,))
    # an administrator makes the slot indexes of N = 4 with the first
    # partitioned consumer (they stay while one uses them); the
    # application's own subscribes with that N
    conn.execute("SELECT pgque.subscribe_partitioned(%s, 'admin_pc', 4)", (name,))
    keys = [f"tenant-{k % 5}" for k in range(60)]
    with psycopg.connect(app_dsn, autocommit=True) as app:
        app.execute("SELECT pgque.subscribe_partitioned(%s, 'app_pc', 4)", (name,))
        ids = pq.send_batch(app, name, [{"i": i} for i in range(60)], type="t", partition_keys=keys)
    seen: list[int] = []
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    lock = threading.Lock()

    def plain(m: pq.Message) -> None:
        seen.append(m.msg_id)

    def keyed(m: pq.Message) -> None:
        with lock:
            by_key[m.partition_key].append(m.msg_id)

    c = pq.Consumer(app_dsn, name, "app", plain, poll_interval=0.2, handle_signals=False)
    pc = pq.PartitionedConsumer(app_dsn, name, "app_pc", 4, keyed, workers=2, poll_interval=0.2, handle_signals=False)
    with Running(c), Running(pc):
        conn.execute("SELECT pgque.force_tick(%s)", (name,))
        wait_until(lambda: len(seen) == 60 and sum(map(len, by_key.values())) == 60, 60, 0.1, "every event")
    assert seen == ids
    for k, got in by_key.items():
        assert got == [i for i, kk in zip(ids, keys) if kk == k], f"{k} out of order"
