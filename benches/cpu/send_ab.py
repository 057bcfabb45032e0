"""Backend CPU per untraced sent event for two builds of pgque in one run:
single `send` and `send_batch` of BATCH events, each round installing build A,
restarting the cluster, recreating the extension and measuring, then the
same for B, with a plain INSERT measured beside each as the reference of
that moment. For a before/after of a change that touches the extension SQL
(so rate_ab.sh's library swap alone would not do).

  python3 benches/cpu/send_ab.py STAGE_A STAGE_B
      STAGE_x: an out-dir of `cargo pgrx package` (its tree mirrors the
      installation's paths); PG_CONFIG names the installation both go into.
  env: BENCH_SOCK (the cluster's data and socket dir), BENCH_PORT, ROUNDS
       (default 4), CALLS (single sends per cell, default 2000), BCALLS
       (batches per cell, default 200), BATCH (default 100).

The cluster is a throwaway one (scripts/pgcluster.sh's settings: fsync off),
so the figures are CPU, not I/O. Run as root on the database host (reads
/proc/<pid>/schedstat, swaps the installed files). Leaves build B installed.
"""
import os
import shutil
import statistics
import subprocess
import sys

import psycopg

from backend import cpu_ns

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PG_CONFIG = os.environ["PG_CONFIG"]
SOCK = os.environ.get("BENCH_SOCK", "/tmp/pgque_bench_evtrace")
PORT = os.environ.get("BENCH_PORT", "55541")
ROUNDS = int(os.environ.get("ROUNDS", "4"))
CALLS = int(os.environ.get("CALLS", "2000"))
BCALLS = int(os.environ.get("BCALLS", "200"))
BATCH = int(os.environ.get("BATCH", "100"))
PAYLOAD = ("jsonb_build_object('id', g, 'ts', clock_timestamp(), 'kind', 'order.created', "
           "'customer', 'cust-000042', 'amount', 129.95, 'currency', 'EUR', 'items', 3, "
           "'note', repeat('x', 64))")
ONE = PAYLOAD.replace("'id', g", "'id', 1")
CELLS = {
    "send": (f"SELECT pgque.send('ab', 't', {ONE})", 1, CALLS),
    "send_batch": (f"SELECT cardinality(pgque.send_batch('ab', 't', ARRAY(SELECT {PAYLOAD} "
                   f"FROM generate_series(1, {BATCH}) g)))", BATCH, BCALLS),
    "plain1": (f"INSERT INTO plain_events(payload) VALUES ({ONE})", 1, CALLS),
    "plainN": (f"INSERT INTO plain_events(payload) SELECT {PAYLOAD} FROM generate_series(1, {BATCH}) g",
               BATCH, BCALLS),
}


def pg(*args):
    return subprocess.run(["bash", "-c", f". {ROOT}/scripts/pgcluster.sh; " + " ".join(args)],
                          check=True, capture_output=True, text=True).stdout


def install(stage):
    """Copies the stage's library and extension files over the installation's."""
    for d in (pg(PG_CONFIG, "--pkglibdir").strip(), pg(PG_CONFIG, "--sharedir").strip() + "/extension"):
        src = stage + d
        for f in os.listdir(src):
            if f.startswith("pgque"):
                shutil.copy(os.path.join(src, f), os.path.join(d, f + ".ab-new"))
                os.replace(os.path.join(d, f + ".ab-new"), os.path.join(d, f))


def restart():
    bindir = pg(PG_CONFIG, "--bindir").strip()
    pg("as_pg", f"{bindir}/pg_ctl", "-D", SOCK, "-m", "fast", "-w", "restart", "-l", f"{SOCK}/server.log")


def measure():
    conninfo = f"host={SOCK} port={PORT} dbname=postgres user=postgres"
    admin = psycopg.connect(conninfo, autocommit=True)
    admin.execute("DROP EXTENSION IF EXISTS pgque CASCADE")
    admin.execute("CREATE EXTENSION pgque")
    admin.execute("SELECT pgque.stop()")  # no worker work beside the cells
    admin.execute("SELECT pgque.create_queue('ab')")
    admin.execute("DROP TABLE IF EXISTS plain_events")
    admin.execute("CREATE TABLE plain_events (id bigserial PRIMARY KEY, payload jsonb)")
    out = {}
    for name, (sql, per_call, calls) in CELLS.items():
        c = psycopg.connect(conninfo, autocommit=True, prepare_threshold=0)
        pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        for _ in range(50):
            c.execute(sql)
        t0 = cpu_ns(pid)
        for _ in range(calls):
            c.execute(sql)
        out[name] = (cpu_ns(pid) - t0) / 1000 / (calls * per_call)
        c.close()
    admin.close()
    return out


def main():
    a, b = sys.argv[1], sys.argv[2]
    res = {"A": [], "B": []}
    print(f"send_ab.py: A={a} B={b} rounds={ROUNDS} calls={CALLS} batch={BATCH}x{BCALLS}; "
          f"{os.getloadavg()}")
    for r in range(ROUNDS):
        for tag, stage in (("A", a), ("B", b)) if r % 2 == 0 else (("B", b), ("A", a)):
            install(stage)
            restart()
            m = measure()
            res[tag].append(m)
            print(f"round {r + 1} {tag}: " + "  ".join(f"{k} {v:.2f}" for k, v in m.items()), flush=True)
    print("us/event medians, and each send's CPU relative to the plain INSERT of its own cell set:")
    for tag in ("A", "B"):
        med = {k: statistics.median(m[k] for m in res[tag]) for k in CELLS}
        print(f"  {tag}: send {med['send']:.2f} ({statistics.median(m['send'] / m['plain1'] for m in res[tag]):.2f}x plain)"
              f"  send_batch {med['send_batch']:.2f} ({statistics.median(m['send_batch'] / m['plainN'] for m in res[tag]):.2f}x plain)")
    for k, ref in (("send", "plain1"), ("send_batch", "plainN")):
        ra = statistics.median(m[k] / m[ref] for m in res["A"])
        rb = statistics.median(m[k] / m[ref] for m in res["B"])
        raw = statistics.median(res["B"][i][k] / res["A"][i][k] for i in range(ROUNDS))
        print(f"  B/A {k}: {rb / ra:.3f} (normalised by plain INSERT), {raw:.3f} (raw, median of rounds)")
    print(f"done; {os.getloadavg()}")


if __name__ == "__main__":
    main()
