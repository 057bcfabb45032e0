"""Usage: BENCH_HOST=/tmp/pgque_bench python3 benches/cpu/send_setting_ab.py (ROUNDS, CALLS).
A/B of the send path's declaration on one cluster: backend CPU per event.
'pgque' is the function as installed (invoker's rights, no settings, owner
switch inside); 'pgque_definer' is the same library function re-declared the
0.6.0 way (SECURITY DEFINER SET search_path) for its cells only."""
import os, sys, statistics, psycopg
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backend import cpu_ns, CONNINFO
P = ("jsonb_build_object('id', 1, 'ts', clock_timestamp(), 'kind', 'order.created', "
     "'customer', 'cust-000042', 'amount', 129.95, 'currency', 'EUR', 'items', 3, 'note', repeat('x', 64))")
CALLS=int(os.environ.get("CALLS","300")); ROUNDS=int(os.environ.get("ROUNDS","40"))
a = psycopg.connect(CONNINFO, autocommit=True)
a.execute("SELECT pgque.create_queue('ab_q') WHERE NOT EXISTS (SELECT FROM pgque.get_queue_info() WHERE queue_name='ab_q')")
a.execute("SELECT pgq.create_queue('ab_p') WHERE NOT EXISTS (SELECT FROM pgq.queue WHERE queue_name='ab_p')")
SIG = {"jsonb": "pgque.send(text, jsonb)", "text": "pgque.send(text, text)"}
V = {
 "pgque jsonb": (f"SELECT pgque.send('ab_q', {P})", None),
 "pgque_definer jsonb": (f"SELECT pgque.send('ab_q', {P})", "jsonb"),
 "pgque text": (f"SELECT pgque.send('ab_q', ({P})::text)", None),
 "pgque_definer text": (f"SELECT pgque.send('ab_q', ({P})::text)", "text"),
 "pgq insert_event": (f"SELECT pgq.insert_event('ab_p', 'default', ({P})::text)", None),
 "plain INSERT": (f"INSERT INTO bench.plain_events(payload) VALUES ({P})", None),
}
conns = {k: psycopg.connect(CONNINFO, autocommit=True, prepare_threshold=0) for k in V}
pids = {k: c.execute("SELECT pg_backend_pid()").fetchone()[0] for k, c in conns.items()}
per = {k: [] for k in V}
try:
    for r in range(ROUNDS + 1):
        for k, (sql, definer) in V.items():
            if definer:
                a.execute(f"ALTER FUNCTION {SIG[definer]} SECURITY DEFINER SET search_path = pg_catalog, pgque, pg_temp")
            c = conns[k]
            c.execute(sql)  # revalidate after the ALTER, outside the timing
            t0 = cpu_ns(pids[k])
            for _ in range(CALLS):
                c.execute(sql)
            if r:
                per[k].append((cpu_ns(pids[k]) - t0) / 1000 / CALLS)
            if definer:
                a.execute(f"ALTER FUNCTION {SIG[definer]} SECURITY INVOKER RESET search_path")
finally:
    for s in SIG.values():
        a.execute(f"ALTER FUNCTION {s} SECURITY INVOKER RESET search_path")
m = {k: statistics.median(v) for k, v in per.items()}
print(f"calls/cell {CALLS}, rounds {ROUNDS}: backend CPU us per event (median; p25-p75)")
for k, v in per.items():
    q = statistics.quantiles(v, n=4)
    print(f"  {k:22} {m[k]:7.1f}   ({q[0]:.1f}-{q[2]:.1f})")
print(f"  pgque jsonb / pgq {m['pgque jsonb']/m['pgq insert_event']:.2f}x; definer jsonb / pgq {m['pgque_definer jsonb']/m['pgq insert_event']:.2f}x")
print(f"  pgque text / pgq {m['pgque text']/m['pgq insert_event']:.2f}x; definer text / pgq {m['pgque_definer text']/m['pgq insert_event']:.2f}x")
a.execute("SELECT pgque.drop_queue('ab_q', true), pgq.drop_queue('ab_p', true)")
a.execute("TRUNCATE bench.plain_events")
