"""Where a small batch's time goes inside pgque, from pg_stat_statements.

One producer connection sends an event and ticks (force_tick); one consumer
connection receives it, acks, and receives again (caught up). PREFILL such
cycles run first, untimed, so the queue keeps that many ticks (the case of
a busy queue late in its metadata rotation period); then pg_stat_statements
is reset and CYCLES more are run. Prints the top statements by total time:
mean us per call and shared buffers per call, nested ones included (the
bench cluster tracks them: pg_stat_statements.track = all).

  BENCH_HOST=/tmp/pgque_bench BENCH_PORT=55515 PREFILL=3000 python3 benches/cpu/receive_cycle.py
"""
import os
import time

import psycopg

from backend import CONNINFO

PREFILL = int(os.environ.get("PREFILL", "3000"))
CYCLES = int(os.environ.get("CYCLES", "500"))


def main():
    p = psycopg.connect(CONNINFO, autocommit=True)
    c = psycopg.connect(CONNINFO, autocommit=True)
    q = f"cycle_{int(time.time())}"
    p.execute("SELECT pgque.create_queue(%s)", (q,))
    p.execute("SELECT pgque.subscribe(%s, 'c1')", (q,))

    def cycle():
        p.execute("SELECT pgque.send(%s, '{\"a\": 1}'::jsonb)", (q,), prepare=True)
        p.execute("SELECT pgque.force_tick(%s)", (q,), prepare=True)
        rows = c.execute("SELECT msg_id, batch_id, payload FROM pgque.receive(%s, 'c1', 100)",
                         (q,), prepare=True).fetchall()
        if rows:
            c.execute("SELECT pgque.ack(%s)", (rows[0][1],), prepare=True)
        c.execute("SELECT msg_id, batch_id, payload FROM pgque.receive(%s, 'c1', 100)",
                  (q,), prepare=True).fetchall()

    for _ in range(PREFILL):
        cycle()
    p.execute("SELECT pg_stat_statements_reset()")
    for _ in range(CYCLES):
        cycle()
    ticks = p.execute("SELECT count(*) FROM pgque.tick t JOIN pgque.queue q ON q.queue_id = t.tick_queue "
                      "WHERE q.queue_name = %s", (q,)).fetchone()[0]
    print(f"receive_cycle.py prefill={PREFILL} cycles={CYCLES}: ticks kept {ticks}")
    print("top-level | calls | mean us | buffers/call | statement")
    for r in p.execute(
            "SELECT toplevel, calls, round((total_exec_time / calls * 1000)::numeric, 1), "
            "round((shared_blks_hit + shared_blks_read)::numeric / calls, 1), "
            "left(regexp_replace(query, '\\s+', ' ', 'g'), 110) "
            "FROM pg_stat_statements WHERE query NOT LIKE '%%pg_stat_statements%%' "
            "ORDER BY total_exec_time DESC LIMIT 12"):
        print(" | ".join(str(x) for x in r))
    p.execute("SELECT pgque.unsubscribe(%s, 'c1')", (q,))
    p.execute("SELECT pgque.drop_queue(%s)", (q,))


if __name__ == "__main__":
    main()
