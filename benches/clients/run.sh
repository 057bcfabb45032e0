#!/usr/bin/env bash
# Client benchmark: end-to-end jobs/s of a worker draining a backlog of N
# trivial jobs, every system on the same private server, in interleaved rounds:
#   Python: pgque_client.Worker vs pgqueuer and Procrastinate (PyPI)
#   Node:   pg-boss (npm)
#   Rust:   pgque_client::Worker vs a hand-written dispatch/complete_many loop
#
#   benches/clients/run.sh [N=20000] [ROUNDS=3] [PG=15]
#
# Needs the network once (pip into benches/clients/.venv, npm into
# benches/clients/node_modules; both git-ignored). Prints a markdown table of
# the median jobs/s per system and its ratio to the pgque Python worker.
set -euo pipefail
N=${1:-20000}
ROUNDS=${2:-3}
VER=${3:-15}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PG_CONFIG=$(sed -n "s/^pg$VER = \"\(.*\)\"$/\1/p" "${PGRX_HOME:-$HOME/.pgrx}/config.toml")
BINDIR=$("$PG_CONFIG" --bindir)

VENV=$HERE/.venv
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -c 'import psycopg, pgqueuer, procrastinate, asyncpg' 2>/dev/null \
  || "$VENV/bin/pip" install -q "psycopg[binary]==3.3.9" "pgqueuer==1.6.0" "procrastinate==3.10.0" "asyncpg==0.32.0"
export PYTHONPATH=$ROOT/clients/python/src   # the pgque client as it is in this tree
[ -d "$HERE/node_modules/pg-boss" ] || (cd "$HERE" && npm install --silent --no-audit --no-fund)

bash "$ROOT/scripts/install.sh" "$PG_CONFIG" "$VER" --release >/tmp/pgque_bench_clients_install.log 2>&1 \
  || { tail -40 /tmp/pgque_bench_clients_install.log; exit 1; }
cargo build -q --release --manifest-path "$ROOT/clients/rust/Cargo.toml" --example bench_worker
RUST_BIN=${CARGO_TARGET_DIR:-$ROOT/clients/rust/target}/release/examples/bench_worker

DATA=/tmp/pgque_bench_clients_$VER
PORT=$((54200 + VER))
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ -f "$DATA/postmaster.pid" ]; then as_pg "$BINDIR/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true; fi
rm -rf "$DATA"; mkdir -p "$DATA"; [ "$(id -u)" = 0 ] && chown postgres "$DATA"
as_pg "$BINDIR/initdb" -D "$DATA" -A trust -U postgres --no-sync >/dev/null
cat >> "$DATA/postgresql.conf" <<CONF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$DATA'
shared_preload_libraries = 'pgque'
max_connections = 300
shared_buffers = 256MB
fsync = off
full_page_writes = off
synchronous_commit = off
CONF
trap 'as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast stop >/dev/null 2>&1 || true' EXIT
as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w start >/dev/null
PSQL=("$BINDIR/psql" -X -q -h "$DATA" -p "$PORT" -U postgres)
"${PSQL[@]}" -d postgres -c "CREATE DATABASE bench"
"${PSQL[@]}" -d bench -c "CREATE EXTENSION pgque"
DSN="host=$DATA port=$PORT dbname=bench user=postgres"

# The systems that do well under 1,000 jobs/s here get a tenth of the jobs, so
# every cell takes seconds, not minutes (jobs/s is a rate either way).
SLOW_N=$(( N / 10 ))
out=$(mktemp)
for r in $(seq 1 "$ROUNDS"); do
  for s in pgque pgqueuer procrastinate pgboss pgboss10 rust_worker rust_loop; do
    case $s in
      pgboss) line=$(cd "$HERE" && node bench_pgboss.js "$DATA" "$PORT" bench "$SLOW_N" 1) ;;
      pgboss10) line=$(cd "$HERE" && node bench_pgboss.js "$DATA" "$PORT" bench "$SLOW_N" 10) ;;
      procrastinate) line=$("$VENV/bin/python" "$HERE/bench_py.py" "$s" "$DSN" "$SLOW_N") ;;
      rust_worker) line=$("$RUST_BIN" "$DSN" "$N" worker) ;;
      rust_loop) line=$("$RUST_BIN" "$DSN" "$N" loop) ;;
      *) line=$("$VENV/bin/python" "$HERE/bench_py.py" "$s" "$DSN" "$N") ;;
    esac
    echo "round $r: $line" >&2
    echo "$line" >> "$out"
  done
done
"$VENV/bin/python" - "$out" "$N" "$ROUNDS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r["system"], []).append(r["jobs_per_s"])
ref_py = statistics.median(by["pgque (Python)"])
ref_rs = statistics.median(by["hand-written SQL loop (Rust)"])
print(f"N = {sys.argv[2]} jobs per cell (Procrastinate and pg-boss: N / 10), {sys.argv[3]} interleaved rounds, median of the rounds\n")
print("| system | jobs/s (median) | rounds | vs pgque Python worker | vs SQL loop |")
print("|---|---|---|---|---|")
for s, v in by.items():
    m = statistics.median(v)
    print(f"| {s} | {m:,.0f} | {', '.join(f'{x:,}' for x in v)} | {m / ref_py:.2f}x | {m / ref_rs:.2f}x |")
PY
