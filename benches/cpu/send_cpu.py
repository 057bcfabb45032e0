"""Backend CPU per sent event: pgque send / send_batch vs PgQ insert_event vs
a plain INSERT, one statement per transaction (autocommit), on the bench
cluster. The per-event costs the w1/w2 workloads compare, without pgbench's
and the machine's noise: CPU time comes from /proc/<backend pid>/schedstat
(run on the database host as a user that can read it).

  BENCH_HOST=/tmp/pgque_bench BENCH_PORT=55515 python3 benches/cpu/send_cpu.py
  BATCH=100 CALLS=500 ROUNDS=5 python3 benches/cpu/send_cpu.py

Each round runs CALLS statements per system, the systems interleaved; the
report is the median over rounds of backend CPU microseconds per event.
"""
import os
import statistics
import psycopg

from backend import CONNINFO, cpu_ns
BATCH = int(os.environ.get("BATCH", "1"))
CALLS = int(os.environ.get("CALLS", "2000" if BATCH == 1 else "300"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
# the w1/w2 payload (benches/harness/db.py)
PAYLOAD = ("jsonb_build_object('id', g, 'ts', clock_timestamp(), 'kind', 'order.created', "
           "'customer', 'cust-000042', 'amount', 129.95, 'currency', 'EUR', 'items', 3, "
           "'note', repeat('x', 64))")


def statements(batch):
    if batch == 1:
        p = PAYLOAD.replace("'id', g", "'id', 1")
        return {
            "pgque": f"SELECT pgque.send('cpu_sq', {p})",
            "pgq": f"SELECT pgq.insert_event('cpu_sp', 'default', ({p})::text)",
            "plain": f"INSERT INTO bench.plain_events(payload) VALUES ({p})",
        }
    return {
        "pgque": f"SELECT cardinality(pgque.send_batch('cpu_sq', ARRAY(SELECT {PAYLOAD} FROM generate_series(1, {batch}) g)))",
        "pgq": f"SELECT count(pgq.insert_event('cpu_sp', 'default', ({PAYLOAD})::text)) FROM generate_series(1, {batch}) g",
        "plain": f"INSERT INTO bench.plain_events(payload) SELECT {PAYLOAD} FROM generate_series(1, {batch}) g",
    }



def main():
    admin = psycopg.connect(CONNINFO, autocommit=True)
    admin.execute("SELECT pgque.drop_queue('cpu_sq', true) FROM pgque.get_queue_info() WHERE queue_name = 'cpu_sq'")
    admin.execute("SELECT pgq.drop_queue('cpu_sp', true) FROM pgq.queue WHERE queue_name = 'cpu_sp'")
    admin.execute("SELECT pgque.create_queue('cpu_sq'), pgq.create_queue('cpu_sp')")
    admin.execute("TRUNCATE bench.plain_events")
    sql = statements(BATCH)
    conns = {s: psycopg.connect(CONNINFO, autocommit=True,
                                prepare_threshold=0) for s in sql}
    pids = {s: c.execute("SELECT pg_backend_pid()").fetchone()[0] for s, c in conns.items()}
    for s, c in conns.items():  # warm: plans, caches
        for _ in range(50):
            c.execute(sql[s])
    per = {s: [] for s in sql}
    for _ in range(ROUNDS):
        for s, c in conns.items():
            t0 = cpu_ns(pids[s])
            for _ in range(CALLS):
                c.execute(sql[s])
            per[s].append((cpu_ns(pids[s]) - t0) / 1000 / (CALLS * BATCH))
    print(f"batch={BATCH} calls/round={CALLS} rounds={ROUNDS}: backend CPU us per event")
    for s, v in per.items():
        print(f"  {s:6} median {statistics.median(v):7.2f}  rounds {' '.join(f'{x:.2f}' for x in v)}")
    m = {s: statistics.median(v) for s, v in per.items()}
    print(f"  pgque/pgq CPU {m['pgque'] / m['pgq']:.2f}x   pgque/plain CPU {m['pgque'] / m['plain']:.2f}x")
    admin.execute("SELECT pgque.drop_queue('cpu_sq', true), pgq.drop_queue('cpu_sp', true)")


if __name__ == "__main__":
    main()
