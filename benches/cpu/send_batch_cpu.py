"""Backend CPU per event of send_batch against the cheapest plain INSERT of
the same payloads (issue 33, item 1), jsonb[] and text[], on the bench
cluster: the payload is one constant (~200-byte JSON, parsed once per
prepared statement), so what is compared is the storing, not the building.

  BENCH_HOST=/tmp/pgque_bench BENCH_PORT=55515 python3 benches/cpu/send_batch_cpu.py
  BATCH=1000 CALLS=60 ROUNDS=7 python3 benches/cpu/send_batch_cpu.py

Systems (one connection each, prepared statements, autocommit, interleaved
within every round: SUB passes of CALLS/SUB calls each):
  pgque_jsonb  SELECT cardinality(pgque.send_batch(q, array_fill(P::jsonb, ARRAY[B])))
  plain_jsonb  INSERT INTO bench.plain_events(payload) SELECT P::jsonb FROM generate_series(1, B)
  pgque_text   SELECT cardinality(pgque.send_batch(q, array_fill(P::text, ARRAY[B])))
  plain_text   INSERT INTO bench.plain_text(payload) SELECT P::text FROM generate_series(1, B)
  pgq          SELECT count(pgq.insert_event(q, 'default', P)) FROM generate_series(1, B)
(bench.plain_text: id bigserial PRIMARY KEY, payload text NOT NULL, made here
if missing.) The report is the median over rounds of backend CPU us per
event, and per round the ratio plain / pgque (>= 1 means pgque is cheaper),
CPU time from /proc/<backend pid>/schedstat.
"""
import os
import statistics
import psycopg

from backend import CONNINFO, cpu_ns
BATCH = int(os.environ.get("BATCH", "100"))
CALLS = int(os.environ.get("CALLS", str(max(30, 30000 // BATCH))))
ROUNDS = int(os.environ.get("ROUNDS", "7"))
SUB = int(os.environ.get("SUB", "5"))
# the w1/w2 payload (benches/harness/db.py) with id 1 and a fixed time
PAYLOAD = ('{"id": 1, "ts": "2026-12-03T10:00:00.123456+00:00", "kind": "order.created", '
           '"customer": "cust-000042", "amount": 129.95, "currency": "EUR", "items": 3, '
           '"note": "' + "x" * 64 + '"}')
P = "'" + PAYLOAD + "'"


def statements(b):
    return {
        "pgque_jsonb": f"SELECT cardinality(pgque.send_batch('cpu_bj', array_fill({P}::jsonb, ARRAY[{b}])))",
        "plain_jsonb": f"INSERT INTO bench.plain_events(payload) SELECT {P}::jsonb FROM generate_series(1, {b})",
        "pgque_text": f"SELECT cardinality(pgque.send_batch('cpu_bt', array_fill({P}::text, ARRAY[{b}])))",
        "plain_text": f"INSERT INTO bench.plain_text(payload) SELECT {P}::text FROM generate_series(1, {b})",
        "pgq": f"SELECT count(pgq.insert_event('cpu_bp', 'default', {P})) FROM generate_series(1, {b})",
    }


def reset(admin):
    for q in ("cpu_bj", "cpu_bt"):
        admin.execute("SELECT pgque.drop_queue(%s, true) FROM pgque.get_queue_info() WHERE queue_name = %s", (q, q))
        admin.execute("SELECT pgque.create_queue(%s)", (q,))
    admin.execute("SELECT pgq.drop_queue('cpu_bp', true) FROM pgq.queue WHERE queue_name = 'cpu_bp'")
    admin.execute("SELECT pgq.create_queue('cpu_bp')")
    admin.execute("CREATE TABLE IF NOT EXISTS bench.plain_text (id bigserial PRIMARY KEY, payload text NOT NULL)")
    admin.execute("TRUNCATE bench.plain_events, bench.plain_text")
    admin.execute("CHECKPOINT")


def main():
    admin = psycopg.connect(CONNINFO, autocommit=True)
    reset(admin)
    sql = statements(BATCH)
    conns = {s: psycopg.connect(CONNINFO, autocommit=True, prepare_threshold=0) for s in sql}
    pids = {s: c.execute("SELECT pg_backend_pid()").fetchone()[0] for s, c in conns.items()}
    for s, c in conns.items():  # warm: plans, caches
        for _ in range(10):
            c.execute(sql[s])
    per = {s: [] for s in sql}
    loads = []
    for _ in range(ROUNDS):
        ns = dict.fromkeys(conns, 0)
        # SUB passes over the systems per round: a change of the machine's
        # load within a round falls on every system alike
        for _ in range(SUB):
            for s, c in conns.items():
                t0 = cpu_ns(pids[s])
                for _ in range(max(1, CALLS // SUB)):
                    c.execute(sql[s])
                ns[s] += cpu_ns(pids[s]) - t0
        for s in conns:
            per[s].append(ns[s] / 1000 / (max(1, CALLS // SUB) * SUB * BATCH))
        loads.append(os.getloadavg()[0])
    print(f"batch={BATCH} calls/round={CALLS} rounds={ROUNDS} passes/round={SUB}: backend CPU us per event (constant payload)")
    for s, v in per.items():
        print(f"  {s:11} median {statistics.median(v):7.2f}  rounds {' '.join(f'{x:.2f}' for x in v)}")
    for kind in ("jsonb", "text"):
        r = [p / q for p, q in zip(per[f"plain_{kind}"], per[f"pgque_{kind}"])]
        print(f"  {kind}: plain/pgque CPU per round {' '.join(f'{x:.2f}' for x in r)}  median {statistics.median(r):.2f}")
    r = [p / q for p, q in zip(per["pgq"], per["pgque_text"])]
    print(f"  pgq/pgque_text CPU median {statistics.median(r):.2f}")
    print(f"  load average (1 min) per round: {' '.join(f'{x:.1f}' for x in loads)}")
    for q in ("cpu_bj", "cpu_bt"):
        admin.execute("SELECT pgque.drop_queue(%s, true)", (q,))
    admin.execute("SELECT pgq.drop_queue('cpu_bp', true)")
    admin.execute("TRUNCATE bench.plain_events, bench.plain_text")


if __name__ == "__main__":
    main()
