#!/usr/bin/env bash
# Client benchmark (issue #31): every client's worker beside other Postgres job
# queues, on one private server, in interleaved rounds. Three parts:
#
#   drain  end-to-end jobs/s of one worker process draining a backlog of N
#          trivial jobs: pgque's Python Worker, aio.Worker, Rust Worker (and a
#          hand-written SQL loop), TypeScript Worker; pgqueuer, Procrastinate
#          (PyPI), graphile-worker, pg-boss (npm)
#   rate   latency enqueue -> handler start (p50 / p99) at fixed enqueue rates
#          (RATES jobs/s for SECS s each; Procrastinate at PROC_RATE only, it
#          drains ~50 jobs/s here)
#   eo     the exactly-once handler's cost: pgque's four workers draining EO_N
#          jobs with a no-op handler, a plain handler inserting one row on a
#          connection of its own, and the exactly-once (job, tx) handler
#          inserting it through the job's transaction
#
#   benches/clients/run.sh [N=20000] [ROUNDS=3] [PG=15]
#   RATES="200 1000" SECS=4 PROC_RATE=20 EO_N=5000 PARTS="drain rate eo" benches/clients/run.sh
#
# Needs the package registries once (pip into benches/clients/.venv, npm ci
# into benches/clients/node_modules and clients/typescript/node_modules; all
# git-ignored). Prints markdown tables (medians of the rounds, ratios to the
# pgque Python worker's figure of the same round); RAW (default
# /tmp/pgque_bench_clients.jsonl) keeps every cell's JSON line.
set -euo pipefail
N=${1:-20000}
ROUNDS=${2:-3}
VER=${3:-15}
RATES=${RATES:-200 1000}
SECS=${SECS:-4}
PROC_RATE=${PROC_RATE:-20}
EO_N=${EO_N:-5000}
PARTS=${PARTS:-drain rate eo}
RAW=${RAW:-/tmp/pgque_bench_clients.jsonl}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PG_CONFIG=$(sed -n "s/^pg$VER = \"\(.*\)\"$/\1/p" "${PGRX_HOME:-$HOME/.pgrx}/config.toml")
BINDIR=$("$PG_CONFIG" --bindir)

VENV=$HERE/.venv
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -c 'import psycopg, pgqueuer, procrastinate, asyncpg' 2>/dev/null \
  || "$VENV/bin/pip" install -q "psycopg[binary]==3.3.9" "pgqueuer==1.6.0" "procrastinate==3.10.0" "asyncpg==0.32.0"
export PYTHONPATH=$ROOT/clients/python/src   # the pgque client as it is in this tree
[ -d "$HERE/node_modules/graphile-worker" ] || (cd "$HERE" && npm ci --silent --no-audit --no-fund)
(cd "$ROOT/clients/typescript" && { [ -d node_modules ] || npm ci --silent --no-audit --no-fund; } && npm run -s build)
export BENCH_PYTHON=$VENV/bin/python
export BENCH_PRODUCER="$VENV/bin/python $HERE/produce.py"

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

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
START_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(date +%s)
# The systems far below 1,000 jobs/s here get fewer jobs, so every cell takes
# seconds, not minutes (jobs/s is a rate either way).
SLOW_N=$(( N / 20 ))
MID_N=$(( N / 10 ))
: > "$RAW"
node_() { (cd "$HERE" && node bench_node.mjs "$1" "$DATA" "$PORT" bench "${@:2}"); }
py_() { "$VENV/bin/python" "$HERE/bench_py.py" "$1" "$DSN" "${@:2}" 2> >(grep -v 'App is instantiated' >&2); }
cell() { # LABEL COMMAND...: run one cell, keep its JSON line
  local line
  line=$("${@:2}") || { echo "round $r: $1 FAILED" >&2; return 0; }
  echo "round $r: $line" >&2
  echo "{\"round\": $r, \"cell\": $(echo "$line" | tail -1)}" >> "$RAW"
}
for r in $(seq 1 "$ROUNDS"); do
  for part in $PARTS; do
    case $part in
      drain)
        for s in pgque pgque_aio pgqueuer procrastinate pgque_ts graphile pgboss1 pgboss10 rust_worker rust_loop; do
          case $s in
            pgque|pgque_aio|pgqueuer) cell $s py_ $s drain "$N" ;;
            procrastinate) cell $s py_ $s drain "$SLOW_N" ;;
            pgque_ts|graphile) cell $s node_ $s drain "$N" ;;
            pgboss1) cell $s node_ $s drain "$SLOW_N" ;;
            pgboss10) cell $s node_ $s drain "$MID_N" ;;
            rust_worker) cell $s "$RUST_BIN" "$DSN" "$N" worker ;;
            rust_loop) cell $s "$RUST_BIN" "$DSN" "$N" loop ;;
          esac
        done ;;
      rate)
        for rate in $RATES; do
          for s in pgque pgque_aio rust pgque_ts pgqueuer graphile pgboss10; do
            case $s in
              pgque|pgque_aio|pgqueuer) cell $s py_ $s rate "$rate" "$SECS" ;;
              rust) cell $s "$RUST_BIN" "$DSN" "$rate" rate "$SECS" ;;
              *) cell $s node_ $s rate "$rate" "$SECS" ;;
            esac
          done
        done
        cell procrastinate py_ procrastinate rate "$PROC_RATE" "$SECS" ;;
      eo)
        for h in noop plain tx; do
          cell "pgque eo $h" py_ pgque eo "$h" "$EO_N"
          cell "pgque_aio eo $h" py_ pgque_aio eo "$h" "$EO_N"
          cell "rust eo $h" "$RUST_BIN" "$DSN" "$EO_N" "eo-$h"
          cell "pgque_ts eo $h" node_ pgque_ts eo "$h" "$EO_N"
        done ;;
    esac
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg) (start: $START_LOAD); $(( $(date +%s) - T0 )) s" >&2
"$VENV/bin/python" "$HERE/report.py" "$RAW" "$N" "$ROUNDS" "$START_LOAD" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(( $(date +%s) - T0 ))"
