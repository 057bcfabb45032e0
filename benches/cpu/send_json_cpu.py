"""A single send of a JSON text payload, one event per transaction, as
clients send it (issue 35 item 4): the client binds the JSON as text and
pgque takes it as jsonb, PgQ's insert_event takes the same text as it is.

  BENCH_HOST=/tmp/pgque_bench BENCH_PORT=55515 python3 benches/cpu/send_json_cpu.py
  CALLS=2000 ROUNDS=7 python3 benches/cpu/send_json_cpu.py

Systems (one connection each, server-side prepared statements, autocommit,
interleaved within every round: SUB passes of CALLS/SUB calls each; the
payload a bound parameter):
  pgque_jsonb  SELECT pgque.send($1, $2::jsonb)
  pgque_text   SELECT pgque.send($1, $2::text)
  pgq          SELECT pgq.insert_event($1, 'default', $2)
  plain        INSERT INTO bench.plain_events(payload) VALUES ($1::jsonb)
For each: backend CPU us per event (/proc/<pid>/schedstat) and wall us per
call (the client waits for each call; the worker's wake-ups and whatever
else runs on the machine are in the wall figure, not in the CPU one). Per
round the ratios pgq / pgque_jsonb (>= 1 means pgque is cheaper or
faster), and the 1-minute load average at the round's end.
"""
import os
import statistics
import time
import psycopg

from backend import CONNINFO, cpu_ns
CALLS = int(os.environ.get("CALLS", "2000"))
ROUNDS = int(os.environ.get("ROUNDS", "7"))
SUB = int(os.environ.get("SUB", "10"))
# the w1/w2 payload (benches/harness/db.py) with id 1 and a fixed time
PAYLOAD = ('{"id": 1, "ts": "2026-12-03T10:00:00.123456+00:00", "kind": "order.created", '
           '"customer": "cust-000042", "amount": 129.95, "currency": "EUR", "items": 3, '
           '"note": "' + "x" * 64 + '"}')

SYSTEMS = {
    "pgque_jsonb": ("SELECT pgque.send(%s, %s::jsonb)", "cpu_jq"),
    "pgque_text": ("SELECT pgque.send(%s, %s::text)", "cpu_jt"),
    "pgq": ("SELECT pgq.insert_event(%s, 'default', %s)", "cpu_jp"),
    "plain": ("INSERT INTO bench.plain_events(payload) VALUES (%s::jsonb)", None),
}


def reset(admin):
    for q in ("cpu_jq", "cpu_jt"):
        admin.execute("SELECT pgque.drop_queue(%s, true) FROM pgque.get_queue_info() WHERE queue_name = %s", (q, q))
        admin.execute("SELECT pgque.create_queue(%s)", (q,))
    admin.execute("SELECT pgq.drop_queue('cpu_jp', true) FROM pgq.queue WHERE queue_name = 'cpu_jp'")
    admin.execute("SELECT pgq.create_queue('cpu_jp')")
    admin.execute("TRUNCATE bench.plain_events")
    admin.execute("CHECKPOINT")


def main():
    admin = psycopg.connect(CONNINFO, autocommit=True)
    reset(admin)
    conns = {s: psycopg.connect(CONNINFO, autocommit=True, prepare_threshold=0) for s in SYSTEMS}
    pids = {s: c.execute("SELECT pg_backend_pid()").fetchone()[0] for s, c in conns.items()}

    def call(s):
        sql, q = SYSTEMS[s]
        conns[s].execute(sql, (q, PAYLOAD) if q else (PAYLOAD,))

    for s in SYSTEMS:  # warm: plans, caches
        for _ in range(50):
            call(s)
    cpu = {s: [] for s in SYSTEMS}
    wall = {s: [] for s in SYSTEMS}
    loads = []
    for _ in range(ROUNDS):
        c_ns = dict.fromkeys(SYSTEMS, 0)
        w_s = dict.fromkeys(SYSTEMS, 0.0)
        # each round is SUB passes over the systems, so a change of the
        # machine's load within a round falls on every system alike
        for _ in range(SUB):
            for s in SYSTEMS:
                t0, w0 = cpu_ns(pids[s]), time.perf_counter()
                for _ in range(CALLS // SUB):
                    call(s)
                w_s[s] += time.perf_counter() - w0
                c_ns[s] += cpu_ns(pids[s]) - t0
        n = CALLS // SUB * SUB
        for s in SYSTEMS:
            wall[s].append(w_s[s] * 1e6 / n)
            cpu[s].append(c_ns[s] / 1000 / n)
        loads.append(os.getloadavg()[0])
    print(f"send_json_cpu.py calls/round={CALLS} rounds={ROUNDS} passes/round={SUB}: backend CPU us per event | wall us per call")
    for s in SYSTEMS:
        print(f"  {s:11} CPU median {statistics.median(cpu[s]):7.2f} rounds {' '.join(f'{x:.1f}' for x in cpu[s])}"
              f" | wall median {statistics.median(wall[s]):7.1f}")
    for kind, d in (("CPU ", cpu), ("wall", wall)):
        for other in ("pgq", "plain"):
            r = [o / p for o, p in zip(d[other], d["pgque_jsonb"])]
            print(f"  {kind} {other}/pgque_jsonb per round {' '.join(f'{x:.2f}' for x in r)}"
                  f"  min {min(r):.2f} median {statistics.median(r):.2f}")
    print(f"  load average (1 min) per round: {' '.join(f'{x:.1f}' for x in loads)}")
    for q in ("cpu_jq", "cpu_jt"):
        admin.execute("SELECT pgque.drop_queue(%s, true)", (q,))
    admin.execute("SELECT pgq.drop_queue('cpu_jp', true)")
    admin.execute("TRUNCATE bench.plain_events")


if __name__ == "__main__":
    main()
