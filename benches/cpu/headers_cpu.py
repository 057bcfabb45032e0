"""Backend CPU per enqueued job, in one run: pgque.enqueue_ready_rows without
headers and with a traceparent per job (docs/tracing.md; both go to the job
log since 0.8.0, the traced batch with a headers array; before, traced jobs
took pgque.jobs), and a plain multi-row INSERT
into a table with a primary key as the reference (as benches/cpu/
enqueue_cpu.py). CPU from /proc/<backend pid>/schedstat (backend.py); each
call its own transaction; rounds alternate the three; medians printed.

  BENCH_HOST=... BENCH_PORT=... [BENCH_DB=pgque_bench] python3 benches/cpu/headers_cpu.py
  BATCH=100 CALLS=40 ROUNDS=5 (defaults)

Setup (untimed): CREATE EXTENSION pgque if missing, job queue cpu_eq, table
plain_jobs.
"""
import os
import statistics

import psycopg

from backend import CONNINFO, cpu_ns

B = int(os.environ.get("BATCH", "100"))
CALLS = int(os.environ.get("CALLS", "40"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
P = ("jsonb_build_object('id', g, 'ts', clock_timestamp(), 'kind', 'order.created', "
     "'customer', 'cust-000042', 'amount', 129.95, 'currency', 'EUR', 'items', 3, 'note', repeat('x', 64))")
H = "jsonb_build_object('traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')"
S = {
  "no headers": f"SELECT count(*) FROM pgque.enqueue_ready_rows('cpu_eq', array_fill('k'::text, ARRAY[{B}]), ARRAY(SELECT {P} FROM generate_series(1,{B}) g))",
  "headers": f"SELECT count(*) FROM pgque.enqueue_ready_rows('cpu_eq', array_fill('k'::text, ARRAY[{B}]), ARRAY(SELECT {P} FROM generate_series(1,{B}) g), headers => ARRAY(SELECT {H} FROM generate_series(1,{B}) g))",
  "plain": f"INSERT INTO plain_jobs(queue, kind, args) SELECT 'cpu_eq', 'k', {P} FROM generate_series(1,{B}) g",
}
with psycopg.connect(CONNINFO, autocommit=True) as c:
    c.execute("CREATE EXTENSION IF NOT EXISTS pgque")
    c.execute("SELECT pgque.create_job_queue('cpu_eq')")
    c.execute("CREATE TABLE IF NOT EXISTS plain_jobs (id bigserial PRIMARY KEY, queue text, kind text, args jsonb)")
    pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
    res = {k: [] for k in S}
    for _ in range(ROUNDS):
        for k, sql in S.items():
            c.execute(sql)  # warm
            t0 = cpu_ns(pid)
            for _ in range(CALLS):
                c.execute(sql)
            res[k].append((cpu_ns(pid) - t0) / (CALLS * B) / 1000)
    for k, v in res.items():
        print(f"{k:11s} {statistics.median(v):6.2f} us CPU/job (median of {ROUNDS})")
    m = {k: statistics.median(v) for k, v in res.items()}
    print(f"ratio vs plain: no headers {m['no headers']/m['plain']:.2f}, headers {m['headers']/m['plain']:.2f}")
