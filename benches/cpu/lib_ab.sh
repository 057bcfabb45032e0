#!/usr/bin/env bash
# Runs benchmark commands under two pgque libraries in one run: each round
# swaps in library A, restarts the bench cluster and runs every command,
# then the same for B. For a before/after of a Rust-only change (both
# libraries must match the installed extension SQL), on a machine whose
# load moves too much for two separate runs to compare; each command should
# print its own reference (PgQ, a plain table) beside pgque.
#
#   bash benches/cpu/lib_ab.sh A.so B.so 'python3 drain_cpu.py' 'python3 dispatch_cpu.py'
#
# Env: ROUNDS (default 3); BENCH_PORT, BENCH_SOCK as benches/run.sh. The
# commands run in benches/cpu with BENCH_HOST/BENCH_PORT/BENCH_DATA set.
# Library B is left installed.
set -euo pipefail
A=$(realpath "${1:?usage: lib_ab.sh A.so B.so CMD...}"); B=$(realpath "${2:?usage: lib_ab.sh A.so B.so CMD...}")
shift 2
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
echo "lib_ab.sh: A=$A B=$B; $(uptime)"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for lib in A B; do
    if [ "$lib" = A ]; then use_lib "$A"; else use_lib "$B"; fi
    for cmd in "$@"; do
      ROUNDS=1 bash -c "$cmd" | sed "s/^/round $r $lib  /"
    done
  done
done
echo "done; $(uptime)"
