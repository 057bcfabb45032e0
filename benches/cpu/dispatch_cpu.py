"""Backend CPU per dispatched-and-completed job: pgque.dispatch of LIMIT jobs
+ complete_many, against the classic skip-locked table (bench.sl_jobs:
UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING, then
DELETE), on the bench cluster.

CPU time comes from /proc/<backend pid>/schedstat of the consuming backend
only (a second connection enqueues, untimed), so it runs on the database
host as a user that can read /proc. Each cycle: LIMIT jobs enqueued (one
enqueue_ready_rows / one INSERT), then one dispatch and one completion
call, each its own transaction.

  BATCH=100 CYCLES=100 ROUNDS=3 python3 benches/cpu/dispatch_cpu.py   # env as benches/run.sh
"""
import os
import statistics

import psycopg

from backend import CONNINFO, cpu_ns

BATCH = int(os.environ.get("BATCH", "100"))
CYCLES = int(os.environ.get("CYCLES", "100"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
ARGS = "jsonb_build_object('id', g, 'note', repeat('x', 100))"


def pgque_cycle(prod, cons):
    prod.execute(f"SELECT count(*) FROM pgque.enqueue_ready_rows('cpu_dq', "
                 f"(SELECT array_agg('k'::text) FROM generate_series(1, %s) g), "
                 f"(SELECT array_agg({ARGS}) FROM generate_series(1, %s) g))", (BATCH, BATCH))
    rows = cons.execute("SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['cpu_dq'], %s, 'w')",
                        (BATCH,), prepare=True).fetchall()
    cons.execute("SELECT pgque.complete_many(%s::bigint[], %s::bigint[])",
                 ([r[0] for r in rows], [r[1] for r in rows]), prepare=True)
    return len(rows)


def plain_cycle(prod, cons):
    prod.execute(f"INSERT INTO bench.sl_jobs(queue, kind, args) SELECT 'cpu', 'k', {ARGS} "
                 f"FROM generate_series(1, %s) g", (BATCH,))
    rows = cons.execute(
        "UPDATE bench.sl_jobs SET state = 'running', locked_by = 'w', locked_at = now(), attempt = attempt + 1 "
        "WHERE id IN (SELECT id FROM bench.sl_jobs WHERE queue = 'cpu' AND state = 'ready' "
        "ORDER BY priority, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id",
        (BATCH,), prepare=True).fetchall()
    cons.execute("DELETE FROM bench.sl_jobs WHERE id = ANY(%s::bigint[])", ([r[0] for r in rows],),
                 prepare=True)
    return len(rows)


def measure(prod, cons, cycle):
    pid = cons.execute("SELECT pg_backend_pid()").fetchone()[0]
    t0, n = cpu_ns(pid), 0
    for _ in range(CYCLES):
        n += cycle(prod, cons)
    return (cpu_ns(pid) - t0) / 1000 / max(n, 1)


def main():
    with psycopg.connect(CONNINFO, autocommit=True) as c:
        c.execute("SELECT pgque.drop_job_queue('cpu_dq', true) FROM pgque.job_queues WHERE queue_name = 'cpu_dq'")
        c.execute("SELECT pgque.create_job_queue('cpu_dq')")
        c.execute("TRUNCATE bench.sl_jobs")
    res = {"pgque": [], "plain": []}
    with psycopg.connect(CONNINFO, autocommit=True) as prod, \
            psycopg.connect(CONNINFO, autocommit=True) as cons:
        pgque_cycle(prod, cons), plain_cycle(prod, cons)  # warm plans
        for r in range(ROUNDS):
            x, y = measure(prod, cons, pgque_cycle), measure(prod, cons, plain_cycle)
            res["pgque"].append(x)
            res["plain"].append(y)
            print(f"round {r + 1}: pgque {x:.1f} us/job, skip-locked table {y:.1f} us/job, "
                  f"ratio {x / y:.2f} (batch {BATCH})", flush=True)
    print(f"median ratio {statistics.median(a / b for a, b in zip(res['pgque'], res['plain'])):.2f}")


if __name__ == "__main__":
    main()
