#!/usr/bin/env bash
# `make bench`: the side-by-side benchmark harness (issue 8).
#
#   1. builds the release library (`cargo pgrx package`) and installs it into a
#      PRIVATE copy of the Debian PostgreSQL 15 installation (benches/.work/pg15inst;
#      15 is the only version with PgQ here: postgresql-15-pgq3). Private, because
#      `cargo pgrx test pg15` from any other worktree reinstalls pgque.so into the
#      shared /usr/lib/postgresql/15 and would swap the library under a running
#      benchmark (or benchmark another branch's build);
#   2. creates/starts a dedicated cluster in benches/.work/pg15 (git-ignored), port
#      55515, socket /tmp/pgque_bench, with the settings in benches/bench.conf
#      (printed into the results file);
#   3. creates database pgque_bench with pgq, pgque, pg_stat_statements and the
#      reference tables (benches/sql/references.sql);
#   4. runs the Python harness (benches/harness/), which interleaves rounds of every
#      workload with its references and writes benches/results/overview.md
#      (QUICK=1: quick.md; ONLY= without BENCH_OUT: partial.md; both git-ignored),
#      keeping the file's trailing `## History` section.
#
# Environment:
#   QUICK=1            a few-minute development run (short cells, small backlogs)
#   ROUNDS=N           rounds per workload (default 3, never fewer than 3 unless QUICK)
#   ONLY=w1,w3         run only these workloads (w1..w9)
#   W7_DEPTHS=1000,200000  ready depths of w7 (QUICK default 1k,10k,50k; full adds 200k)
#   W10_SIZES=10000,100000 W10_BATCH=100 W10_PGQ=0  w10's interval sizes, batch size, and
#                      whether PgQ's two systems run
#   W4_RATES=500 W4_IDLE_SECS=60  w4's paced rates, and the idle spell before its
#                      first-send cells (0: no such cells)
#   W11_RATE W11_SECS W11_TTL  the seed's-profile cells (w11-w13): rate, seconds, lease ttl
#   W11_KILLS=4        w12/w13: worker kills of each kind (SIGKILL, pg_terminate_backend) per kill cell
#   W12_CELLS=skip,nacks,nacks_kills,hot  W13_CELLS=none,resize,resize_kills,abort_kills
#                      run only these cells of w12 / w13 (default all)
#   W11_DEBUG_DIR=dir  w11-w13: write each cell's kills, resizes and first-ack timeline there
#   CELL_SCALE=0.5     timed cells (sends, latency, enqueue, end-to-end, held xmin)
#                      scaled by this factor; rounds, backlogs and depths unchanged
#   BENCH_NO_BUILD=1   skip the cargo build/install (use what is installed)
#   BENCH_OUT=path     results file (default above); a family file, e.g.
#                      BENCH_OUT=$PWD/benches/results/jobs.md ONLY=w6,w7,w8,w9
#   BENCH_RECREATE=0   keep the existing pgque extension objects (default: drop and
#                      recreate it, the bench database is disposable)
#   BENCH_SOURCE_NOTE  free text printed next to the source commit in the results
#   BENCH_SETUP_ONLY=1 build, install and start the cluster, run no workload
#   BENCH_PORT, BENCH_SOCK  port and socket directory of the bench cluster (default
#                      55515, /tmp/pgque_bench): two worktrees can bench side by side
# Extra arguments are passed to the harness (python3 -m harness --help).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SYS_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
WORK=$ROOT/benches/.work
# The private installation keeps Debian's layout under a prefix, so PostgreSQL's
# relocatable paths (share dir relative to bin dir) resolve inside it.
INST=$WORK/pg15inst
BIN=$INST/usr/lib/postgresql/15/bin
DATA=$WORK/pg15
SOCK=${BENCH_SOCK:-/tmp/pgque_bench}
PORT=${BENCH_PORT:-55515}
DB=pgque_bench
log() { printf '[bench] %s\n' "$*"; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

mkdir -p "$WORK" "$SOCK"
[ "$(id -u)" = 0 ] && chown postgres "$SOCK"

# ---- 1. build (release) + install into the private PostgreSQL 15 ---------------------
if [ ! -x "$BIN/postgres" ]; then
  log "copying the Debian PostgreSQL 15 installation (with pgq, pg_stat_statements) to $INST"
  mkdir -p "$INST/usr/lib/postgresql" "$INST/usr/share/postgresql"
  cp -a /usr/lib/postgresql/15 "$INST/usr/lib/postgresql/"
  cp -a /usr/share/postgresql/15 "$INST/usr/share/postgresql/"
  # stale pgque files from whoever last installed into the system copy
  rm -f "$INST"/usr/lib/postgresql/15/lib/pgque.so "$INST"/usr/share/postgresql/15/extension/pgque*
fi
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  log "cargo pgrx package (release, PostgreSQL 15); log: $WORK/build.log"
  cargo pgrx package --pg-config "$SYS_PG_CONFIG" --no-default-features --features pg15 \
    >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; exit 1; }
fi
# (cargo builds into CARGO_TARGET_DIR when it is set, as .ci/run sets it)
PKG=${CARGO_TARGET_DIR:-$ROOT/target}/release/pgque-pg15
[ -f "$PKG/usr/lib/postgresql/15/lib/pgque.so" ] || { log "no build in $PKG: run without BENCH_NO_BUILD"; exit 1; }
# cargo pgrx package ships the current script and the upgrade scripts; add the
# frozen install scripts of released versions.
bash "$ROOT/scripts/ship_archive.sh" --dir "$PKG/usr/share/postgresql/15/extension"
# Stop the bench server first, and replace the library by rename, never in place:
# overwriting a mapped .so crashes the processes that have it loaded.
if [ -f "$DATA/postmaster.pid" ]; then
  log "stopping the bench cluster to install the new library"
  as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 120 stop >/dev/null || true
fi
cp "$PKG"/usr/lib/postgresql/15/lib/pgque.so "$INST/usr/lib/postgresql/15/lib/.pgque.so.new"
mv -f "$INST/usr/lib/postgresql/15/lib/.pgque.so.new" "$INST/usr/lib/postgresql/15/lib/pgque.so"
cp "$PKG"/usr/share/postgresql/15/extension/pgque* "$INST/usr/share/postgresql/15/extension/"
chmod -R a+rX "$INST"
d=$INST; while [ "$d" != / ]; do chmod o+x "$d" 2>/dev/null || true; d=$(dirname "$d"); done

# ---- 2. the dedicated cluster ----------------------------------------------------
if [ ! -f "$DATA/PG_VERSION" ]; then
  log "initdb $DATA"
  mkdir -p "$DATA"; [ "$(id -u)" = 0 ] && chown postgres "$DATA"
  d=$DATA; while [ "$d" != / ]; do chmod o+x "$d" 2>/dev/null || true; d=$(dirname "$d"); done
  as_pg "$BIN/initdb" -D "$DATA" -A trust -U postgres >/dev/null
  echo "include = 'bench.conf'" >> "$DATA/postgresql.conf"
fi
# Settings live in benches/bench.conf; port and socket are appended here.
{ cat "$ROOT/benches/bench.conf"
  echo "port = $PORT"
  echo "unix_socket_directories = '$SOCK'"
  echo "listen_addresses = ''"
} > "$DATA/bench.conf"
[ "$(id -u)" = 0 ] && chown postgres "$DATA/bench.conf"
log "starting the bench cluster (port $PORT, socket $SOCK)"
as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 120 start >/dev/null

# ---- 3. the database -------------------------------------------------------------
PSQL=("$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCK" -p "$PORT" -U postgres)
"${PSQL[@]}" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1 \
  || "${PSQL[@]}" -d postgres -c "CREATE DATABASE $DB"
"${PSQL[@]}" -d "$DB" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
  -c "CREATE EXTENSION IF NOT EXISTS pgq" -c "CREATE EXTENSION IF NOT EXISTS pgque"
# A library newer than the database's extension objects: recreate (bench data is disposable).
"${PSQL[@]}" -d "$DB" -c "ALTER EXTENSION pgque UPDATE" 2>/dev/null || true
if [ "${BENCH_RECREATE:-1}" = 1 ]; then
  "${PSQL[@]}" -d "$DB" -c "DROP EXTENSION pgque CASCADE" -c "CREATE EXTENSION pgque"
fi
"${PSQL[@]}" -d "$DB" -f "$ROOT/benches/sql/references.sql"

# BENCH_SETUP_ONLY=1: build, install and start, then leave the cluster to the
# scripts that run against it (benches/cpu/*.py)
[ "${BENCH_SETUP_ONLY:-0}" = 1 ] && { log "cluster ready (port $PORT, socket $SOCK)"; exit 0; }

# ---- 4. the harness --------------------------------------------------------------
python3 -c 'import psycopg' 2>/dev/null || pip install -q 'psycopg[binary]'
export BENCH_PGBENCH=$BIN/pgbench BENCH_HOST=$SOCK BENCH_PORT=$PORT BENCH_DB=$DB BENCH_DATA=$DATA
cd "$ROOT/benches"
exec python3 -m harness "$@"
