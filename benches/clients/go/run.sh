#!/usr/bin/env bash
# pgque's Go Worker beside River (github.com/riverqueue/river, on
# riverdriver/riverpgxv5, its own schema by rivermigrate) on one private
# PostgreSQL server, in interleaved rounds (issue #44 item 2):
#
#   drain  end-to-end jobs/s of one worker draining N trivial jobs, the
#          server's CPU per job, the dead tuples the drain left
#   rate   latency enqueue -> handler start (p50 / p99) at RATES jobs/s for
#          SECS s each, and the server's CPU per job meanwhile
#   settle after the rounds, one more drain of pgque and of River (FetchCooldown
#          1 ms), then 75 s: the dead tuples that maintenance makes after a
#          drain (pgque settles each dispatch's claim once its lease ended)
#
#   benches/clients/go/run.sh [N=20000] [ROUNDS=3] [PG=15]
#   RATES=200,1000 SECS=4 PARTS=drain,rate,settle SYSTEMS=pgque,river,river_fc1ms benches/clients/go/run.sh
#
# pgque is built in release mode and installed into that PostgreSQL
# (scripts/install.sh --release). pgque and River get a database each on the
# same server; autovacuum is off, so the dead tuples counted are the ones a
# drain left (each drain starts after a VACUUM). Go modules (River, pgx)
# come through the Go module proxy, pinned by go.sum; the pgque client is
# this tree's clients/go. Prints markdown tables; RAW (default
# /tmp/pgque_bench_go.jsonl) keeps every cell's JSON line.
set -euo pipefail
N=${1:-20000}
ROUNDS=${2:-3}
VER=${3:-15}
RATES=${RATES:-200,1000}
SECS=${SECS:-4}
PARTS=${PARTS:-drain,rate,settle}
SYSTEMS=${SYSTEMS:-pgque,river,river_fc1ms}
RAW=${RAW:-/tmp/pgque_bench_go.jsonl}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
PG_CONFIG=$(sed -n "s/^pg$VER = \"\(.*\)\"$/\1/p" "${PGRX_HOME:-$HOME/.pgrx}/config.toml")
[ -n "$PG_CONFIG" ] || { echo "no pg$VER in ${PGRX_HOME:-$HOME/.pgrx}/config.toml: run make setup" >&2; exit 1; }
BINDIR=$("$PG_CONFIG" --bindir)

echo "[bench go] installing pgque (release) into PostgreSQL $VER" >&2
bash "$ROOT/scripts/install.sh" "$PG_CONFIG" "$VER" --release >/tmp/pgque_bench_go_install.log 2>&1 \
  || { tail -40 /tmp/pgque_bench_go_install.log; exit 1; }
BIN=/tmp/pgque_bench_go_$$
(cd "$HERE" && go build -o "$BIN" .)

DATA=/tmp/pgque_bench_go_$VER
PORT=$((54500 + VER))
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
max_worker_processes = 32
shared_buffers = 256MB
fsync = off
full_page_writes = off
synchronous_commit = off
autovacuum = off
CONF
trap 'as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast stop >/dev/null 2>&1 || true; rm -f "$BIN"' EXIT
as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w start >/dev/null
PSQL=("$BINDIR/psql" -X -q -h "$DATA" -p "$PORT" -U postgres)
"${PSQL[@]}" -d postgres -c "CREATE DATABASE bench_pgque" -c "CREATE DATABASE bench_river"
"${PSQL[@]}" -d bench_pgque -c "CREATE EXTENSION pgque"
BASE="host=$DATA port=$PORT user=postgres"

START_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(date +%s)
echo "[bench go] load average at start: $START_LOAD" >&2
"$BIN" -pgque-dsn "$BASE dbname=bench_pgque" -river-dsn "$BASE dbname=bench_river" -data "$DATA" \
  -n "$N" -rounds "$ROUNDS" -rates "$RATES" -secs "$SECS" -parts "$PARTS" -systems "$SYSTEMS" -raw "$RAW"
echo
echo "PostgreSQL $("$BINDIR/postgres" --version | awk '{print $3}'); load average at start $START_LOAD, at end $(cut -d' ' -f1-3 /proc/loadavg); $(( $(date +%s) - T0 )) s"
