#!/usr/bin/env bash
# Server CPU per event at a fixed rate (rate_cpu.py) for two builds of
# pgque in one run: each round runs PgQ's cell, then swaps in library A,
# restarts the bench cluster and runs pgque's cell, then the same for B.
# For a before/after of a change to the per-batch path, on a machine whose
# load moves too much for two separate runs to compare.
#
#   bash benches/cpu/rate_ab.sh BEFORE.so AFTER.so   (RATES, SECS, ROUNDS as rate_cpu.py)
#
# Needs the bench cluster of benches/run.sh (BENCH_PORT, BENCH_SOCK as
# there); the library it had is left installed at the end (B). Both
# libraries must match the installed extension SQL (a change that is
# Rust-only).
set -euo pipefail
A=$(realpath "${1:?usage: rate_ab.sh A.so B.so}"); B=$(realpath "${2:?usage: rate_ab.sh A.so B.so}")
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
INST=$ROOT/benches/.work/pg15inst
BIN=$INST/usr/lib/postgresql/15/bin
LIB=$INST/usr/lib/postgresql/15/lib
DATA=$ROOT/benches/.work/pg15
SOCK=${BENCH_SOCK:-/tmp/pgque_bench}
PORT=${BENCH_PORT:-55515}
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
use_lib() {
  as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 120 stop >/dev/null
  cp "$1" "$LIB/.pgque.so.new"
  mv -f "$LIB/.pgque.so.new" "$LIB/pgque.so"
  as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 120 start >/dev/null
  sleep 2
}
export BENCH_HOST=$SOCK BENCH_PORT=$PORT BENCH_DATA=$DATA
cd "$ROOT/benches/cpu"
echo "rate_ab.sh: A=$(basename "$A") B=$(basename "$B"); $(uptime)"
for r in $(seq 1 "${ROUNDS:-3}"); do
  echo "## round $r"
  ROUNDS=1 SYSTEMS=pgq python3 rate_cpu.py | grep -v "median\|^rate_cpu" | sed "s/^/pgq /"
  use_lib "$A"
  ROUNDS=1 SYSTEMS=pgque python3 rate_cpu.py | grep -v "median\|^rate_cpu" | sed "s/^/A   /"
  use_lib "$B"
  ROUNDS=1 SYSTEMS=pgque python3 rate_cpu.py | grep -v "median\|^rate_cpu" | sed "s/^/B   /"
done
echo "done; $(uptime)"
