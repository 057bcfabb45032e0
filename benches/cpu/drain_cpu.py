"""Backend CPU per drained event: pgque receive+ack vs PgQ next_batch +
get_batch_events + finish_batch, at one batch size, on the bench cluster.

CPU time comes from /proc/<backend pid>/schedstat (nanoseconds on CPU), which
moves far less than wall time on a loaded 2-core machine. The script must run
on the database host as a user that can read /proc of the backend.

  python3 benches/cpu/drain_cpu.py            # env: BENCH_HOST, BENCH_PORT (as benches/run.sh)
  BATCH=100 ROUNDS=3 python3 benches/cpu/drain_cpu.py

Setup (untimed): queues cpu_rq (pgque) and cpu_pq (PgQ), 200 ticks of BATCH
events each (one send_batch / insert_event loop per tick), one consumer each;
then ROUNDS alternating rounds of 20 batches per system.
"""
import os
import psycopg

from backend import CONNINFO, cpu_ns
BATCH = int(os.environ.get("BATCH", "500"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
PAYLOAD = "jsonb_build_object('id', g, 'note', repeat('x', 150))"



def setup(c):
    c.execute("SELECT pgque.drop_queue('cpu_rq', true) FROM pgque.get_queue_info() WHERE queue_name = 'cpu_rq'")
    c.execute("SELECT pgq.drop_queue('cpu_pq', true) FROM pgq.queue WHERE queue_name = 'cpu_pq'")
    c.execute("SELECT pgque.create_queue('cpu_rq'), pgque.subscribe('cpu_rq', 'c')")
    c.execute("SELECT pgq.create_queue('cpu_pq'), pgq.register_consumer('cpu_pq', 'c')")
    for _ in range(200):
        c.execute(f"SELECT pgque.send_batch('cpu_rq', array_agg({PAYLOAD})) FROM generate_series(1, %s) g", (BATCH,))
        c.execute("SELECT pgque.force_tick('cpu_rq')")
        c.execute("SELECT pgque.ticker('cpu_rq')")
        c.execute(f"SELECT count(pgq.insert_event('cpu_pq', 'default', ({PAYLOAD})::text)) FROM generate_series(1, %s) g", (BATCH,))
        c.execute("SELECT pgq.force_tick('cpu_pq')")
        c.execute("SELECT pgq.ticker('cpu_pq')")


def pgque_batch(cur):
    cur.execute("SELECT msg_id, batch_id, payload FROM pgque.receive('cpu_rq', 'c', %s)", (BATCH,))
    rows = cur.fetchall()
    if rows:
        cur.execute("SELECT pgque.ack(%s)", (rows[0][1],))
    return len(rows)


def pgq_batch(cur):
    cur.execute("SELECT pgq.next_batch('cpu_pq', 'c')")
    b = cur.fetchone()[0]
    if b is None:
        return 0
    cur.execute("SELECT ev_id, ev_data FROM pgq.get_batch_events(%s)", (b,))
    rows = cur.fetchall()
    cur.execute("SELECT pgq.finish_batch(%s)", (b,))
    return len(rows)


def measure(conn, fn, batches=20):
    cur = conn.cursor()
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    t0, n = cpu_ns(pid), 0
    for _ in range(batches):
        n += fn(cur)
    return (cpu_ns(pid) - t0) / max(n, 1)


def main():
    info = CONNINFO
    with psycopg.connect(info, autocommit=True) as c:
        setup(c)
    with psycopg.connect(info, autocommit=True) as a, psycopg.connect(info, autocommit=True) as b:
        pgque_batch(a.cursor()), pgq_batch(b.cursor())  # warm plans
        for r in range(ROUNDS):
            x, y = measure(a, pgque_batch), measure(b, pgq_batch)
            print(f"round {r + 1}: pgque {x:.0f} ns/event, pgq {y:.0f} ns/event, ratio {x / y:.2f} (batch {BATCH})")


if __name__ == "__main__":
    main()
