"""What the backend-CPU scripts of this directory share: where the bench
cluster is (the env of benches/run.sh) and a backend's CPU time so far."""
import os

HOST = os.environ.get("BENCH_HOST", "/tmp/pgque_bench")
PORT = os.environ.get("BENCH_PORT", "55515")
DB = os.environ.get("BENCH_DB", "pgque_bench")
CONNINFO = f"host={HOST} port={PORT} dbname={DB} user=postgres"


def cpu_ns(pid):
    """Nanoseconds backend `pid` has spent on a CPU (/proc/<pid>/schedstat:
    the run must be on the database host, as a user that can read it)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])
