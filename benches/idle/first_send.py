"""Where the first send after an idle spell spends its time (issue 33 item 4:
<= 20 ms after an idle minute). As w4's idle cell (benches/harness
w_events.py): a consumer LISTENs on the queue's channel between empty
receives, the worker goes idle (pgque.idle_after), then one event is sent.
Each round prints the hops, from one clock (client and server on this host):

  commit   the producer's send, call to return (its commit included)
  wake     its return to the start of the tick's transaction (tick_time):
           the worker's wake-up, and whatever it ran before the ticker
  notify   the tick's start to the consumer holding the notification (the
           tick's statements, its commit, the NOTIFY's delivery)
  receive  the notification to the receive + ack returning
  total    send -> receive, w4's figure

    BENCH_HOST=/tmp/pgque_bench BENCH_PORT=55515 IDLE_SECS=60 ROUNDS=3 \
        python3 benches/idle/first_send.py

WARM=1: the consumer takes one batch before the idle spell (a long-lived
consumer), so its receive is not the first batch its backend ever opened;
w4's cell is WARM=0.
"""
import json
import multiprocessing as MP
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cpu"))
import psycopg  # noqa: E402

from backend import CONNINFO  # noqa: E402

IDLE_SECS = float(os.environ.get("IDLE_SECS", "60"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
WARM = os.environ.get("WARM", "0") == "1"


def consumer(q, ready, outq):
    conn = psycopg.connect(CONNINFO, autocommit=True)
    cur = conn.cursor()
    cur.execute(f'LISTEN "pgque_{q}"')
    ready.set()
    t_note = None
    t_end = time.time() + IDLE_SECS + 30
    while time.time() < t_end:
        with conn.transaction():
            rows = cur.execute("SELECT payload, batch_id FROM pgque.receive(%s, 'c1', 1000)", (q,)).fetchall()
            if rows:
                cur.execute("SELECT pgque.ack(%s)", (rows[0][1],))
        if rows:
            p = rows[0][0] if isinstance(rows[0][0], dict) else json.loads(rows[0][0])
            if p.get("warm"):
                outq.put("warm")
                continue
            outq.put((p["ts"], t_note, time.time()))
            break
        for _ in conn.notifies(timeout=0.5, stop_after=1):
            t_note = time.time()
    else:
        outq.put(None)
    conn.close()


def one_round(admin, rnd):
    q = f"first_send_{rnd}_{os.getpid()}"
    admin.execute("SELECT pgque.create_queue(%s)", (q,))
    admin.execute("SELECT pgque.subscribe(%s, 'c1')", (q,))
    ready, outq = MP.Event(), MP.Queue()
    p = MP.Process(target=consumer, args=(q, ready, outq))
    p.start()
    ready.wait(60)
    if WARM:
        admin.execute("SELECT pgque.send(%s, %s::jsonb)", (q, json.dumps({"warm": True})))
        assert outq.get(timeout=60) == "warm"
    time.sleep(IDLE_SECS)
    idle = admin.execute("SELECT detail FROM pgque.status() WHERE component = 'worker'").fetchone()
    t0 = time.time()
    admin.execute("SELECT pgque.send(%s, %s::jsonb)", (q, json.dumps({"ts": t0})))
    t1 = time.time()
    got = outq.get(timeout=IDLE_SECS + 60)
    p.join()
    tick = admin.execute(
        "SELECT extract(epoch FROM t.tick_time)::float8 FROM pgque.tick t JOIN pgque.queue q ON q.queue_id = t.tick_queue "
        "WHERE q.queue_name = %s AND t.tick_time >= to_timestamp(%s) ORDER BY t.tick_id LIMIT 1", (q, t0)).fetchone()
    admin.execute("SELECT pgque.drop_queue(%s, true)", (q,))
    if got is None or tick is None:
        print(f"round {rnd}: no event or no tick", flush=True)
        return
    ts, t_note, t_recv = got
    ms = lambda a, b: (b - a) * 1000.0 if a is not None and b is not None else float("nan")
    print(f"round {rnd}: total {ms(ts, t_recv):6.1f} ms = commit {ms(ts, t1):5.1f} + wake {ms(t1, tick[0]):5.1f} "
          f"+ notify {ms(tick[0], t_note):5.1f} + receive {ms(t_note, t_recv):5.1f}; worker before: "
          f"{idle[0] if idle else '?'}; load {os.getloadavg()[0]:.1f}", flush=True)


def main():
    admin = psycopg.connect(CONNINFO, autocommit=True)
    print(f"first_send.py: {ROUNDS} rounds, {IDLE_SECS:.0f} s idle before each send, warm consumer {WARM}; "
          f"load {os.getloadavg()[0]:.1f}",
          flush=True)
    for rnd in range(1, ROUNDS + 1):
        one_round(admin, rnd)


if __name__ == "__main__":
    main()
