"""Backend CPU and WAL per enqueued job: pgque.enqueue_ready_rows vs the plain
multi-row INSERT of workload 6 (bench.plain_jobs), at one batch size, on the
bench cluster.

CPU time comes from /proc/<backend pid>/schedstat (nanoseconds on CPU), which
moves far less than wall time on a loaded 2-core machine; the script must run
on the database host as a user that can read /proc of the backend. Each call
is its own transaction (autocommit), as in workload 6.

  python3 benches/cpu/enqueue_cpu.py        # env: BENCH_HOST, BENCH_PORT (as benches/run.sh)
  BATCH=100 CALLS=50 ROUNDS=5 python3 benches/cpu/enqueue_cpu.py

Setup (untimed): job queue cpu_eq; rounds alternate the two systems, CALLS
calls each; the medians of the rounds are printed.
"""
import os
import statistics

import psycopg

from backend import CONNINFO, cpu_ns
BATCH = int(os.environ.get("BATCH", "100"))
CALLS = int(os.environ.get("CALLS", "50"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
# the payload of benches/harness/db.py
PAYLOAD = ("jsonb_build_object('id', g, 'ts', clock_timestamp(), 'kind', 'order.created', "
           "'customer', 'cust-000042', 'amount', 129.95, 'currency', 'EUR', 'items', 3, "
           "'note', repeat('x', 64))")
SYSTEMS = {
    "pgque": (f"SELECT count(*) FROM pgque.enqueue_ready_rows('cpu_eq', array_fill('bench.kind'::text, ARRAY[{BATCH}]), "
              f"ARRAY(SELECT {PAYLOAD} FROM generate_series(1, {BATCH}) g))"),
    "plain": (f"INSERT INTO bench.plain_jobs(queue, kind, args) SELECT 'cpu_eq', 'bench.kind', {PAYLOAD} "
              f"FROM generate_series(1, {BATCH}) g"),
}



def measure(conn, sql):
    cur = conn.cursor()
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    lsn0 = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    t0 = cpu_ns(pid)
    for _ in range(CALLS):
        cur.execute(sql, prepare=True)
    cpu = cpu_ns(pid) - t0
    wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn0,)).fetchone()[0]
    jobs = CALLS * BATCH
    return cpu / jobs / 1000.0, float(wal) / jobs


def main():
    info = CONNINFO
    with psycopg.connect(info, autocommit=True) as c:
        c.execute("SELECT pgque.drop_job_queue('cpu_eq', true) FROM pgque.job_queues WHERE queue_name = 'cpu_eq'")
        c.execute("SELECT pgque.create_job_queue('cpu_eq', 'strict_fifo', 1)")
        c.execute("TRUNCATE bench.plain_jobs")
    conns = {s: psycopg.connect(info, autocommit=True) for s in SYSTEMS}
    res = {s: [] for s in SYSTEMS}
    for s, sql in SYSTEMS.items():  # warm plans and caches
        conns[s].execute(sql)
    for _ in range(ROUNDS):
        for s, sql in SYSTEMS.items():
            res[s].append(measure(conns[s], sql))
    print(f"batch {BATCH}, {CALLS} calls x {ROUNDS} rounds; backend CPU us/job and WAL B/job (median of rounds)")
    for s in SYSTEMS:
        cpus = [r[0] for r in res[s]]
        wals = [r[1] for r in res[s]]
        print(f"  {s:6} cpu {statistics.median(cpus):7.2f} us/job  (rounds {' '.join(f'{x:.1f}' for x in cpus)})"
              f"  wal {statistics.median(wals):6.1f} B/job")
    a, b = (statistics.median(r[0] for r in res[s]) for s in ("pgque", "plain"))
    print(f"  cpu ratio plain/pgque = {b / a:.3f} (the rate ratio if both were CPU-bound)")
    for c in conns.values():
        c.close()


if __name__ == "__main__":
    main()
