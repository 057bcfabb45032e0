#!/usr/bin/env bash
# `make run` / `make stop` / `make psql`: a local PostgreSQL with pgque preloaded.
#
#   scripts/run.sh start [PG]   build (release), install, start, demo, print psql line
#   scripts/run.sh stop  [PG]
#   scripts/run.sh psql  [PG]
#
# The cluster lives in .run/pg<PG>/ (git-ignored); a second start reuses it.
set -euo pipefail
cmd=${1:-start}
VER=${2:-15}
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PG_CONFIG=$(sed -n "s/^pg$VER = \"\(.*\)\"$/\1/p" "$HOME/.pgrx/config.toml" 2>/dev/null || true)
[ -n "$PG_CONFIG" ] || { echo "PostgreSQL $VER is not set up: run make setup" >&2; exit 1; }
BINDIR=$("$PG_CONFIG" --bindir)
DATA=$ROOT/.run/pg$VER
# Socket dir: short path (unix socket paths are limited to ~107 bytes).
SOCK=/tmp/pgque_run_$VER
PORT=$((55400 + VER))
DB=pgque_demo
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
PSQL=("$BINDIR/psql" -X -h "$SOCK" -p "$PORT" -U postgres)

case "$cmd" in
stop)
  if [ -f "$DATA/postmaster.pid" ]; then as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast stop; else echo "not running"; fi
  exit 0 ;;
psql)
  exec "${PSQL[@]}" -d "$DB" ;;
start) ;;
*) echo "usage: $0 start|stop|psql [PG]" >&2; exit 2 ;;
esac

echo "== building pgque (release) and installing it into PostgreSQL $VER"
cargo pgrx install --release --pg-config "$PG_CONFIG" --no-default-features --features "pg$VER" >/tmp/pgque_run_install.log 2>&1 \
  || { tail -40 /tmp/pgque_run_install.log; exit 1; }
bash "$ROOT/scripts/ship_archive.sh" "$PG_CONFIG"

mkdir -p "$ROOT/.run" "$SOCK"
[ "$(id -u)" = 0 ] && chown postgres "$SOCK" && chmod 755 "$ROOT/.run"
if [ ! -f "$DATA/PG_VERSION" ]; then
  echo "== creating a cluster in $DATA"
  mkdir -p "$DATA"; [ "$(id -u)" = 0 ] && chown postgres "$DATA"
  # The postgres user must be able to reach the data dir through the clone.
  d=$DATA; while [ "$d" != / ]; do chmod o+x "$d" 2>/dev/null || true; d=$(dirname "$d"); done
  as_pg "$BINDIR/initdb" -D "$DATA" -A trust -U postgres >/dev/null
  cat >> "$DATA/postgresql.conf" <<CONF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$SOCK'
shared_preload_libraries = 'pgque'
max_worker_processes = 32
CONF
fi
if ! as_pg "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  echo "== starting PostgreSQL $VER (port $PORT, socket $SOCK)"
  as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w start >/dev/null
else
  echo "== restarting PostgreSQL $VER to load the new library"
  as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -m fast restart >/dev/null
fi
# The demo database is made afresh each time, so it always has the extension
# as just built (the cluster, and any database of yours in it, is kept).
"${PSQL[@]}" -d postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
"${PSQL[@]}" -d postgres -qc "CREATE DATABASE $DB"
"${PSQL[@]}" -d "$DB" -qc "CREATE EXTENSION pgque"

echo "== demo"
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -f "$ROOT/scripts/demo.sql"

cat <<MSG

pgque is running on PostgreSQL $VER with the background worker preloaded.
Connect:   ${PSQL[*]} -d $DB      (or: make psql PG=$VER)
Stop:      make stop PG=$VER
Log:       $DATA/server.log
MSG
