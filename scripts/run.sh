#!/usr/bin/env bash
# `make run` / `make stop` / `make psql`: a local PostgreSQL with pgque preloaded.
#
#   scripts/run.sh start [PG]   build (release), install, start, demo, start the dashboard
#                               (pgque-web on 127.0.0.1:8080, PGQUE_WEB_LISTEN), print both
#   scripts/run.sh stop  [PG]
#   scripts/run.sh psql  [PG]
#
# The cluster lives in .run/pg<PG>/ (git-ignored); a second start reuses it.
set -euo pipefail
cmd=${1:-start}
VER=${2:-15}
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PG_CONFIG=$(sed -n "s/^pg$VER = \"\(.*\)\"$/\1/p" "${PGRX_HOME:-$HOME/.pgrx}/config.toml" 2>/dev/null || true)
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
  if [ -f "$ROOT/.run/web.pid" ]; then kill "$(cat "$ROOT/.run/web.pid")" 2>/dev/null || true; rm -f "$ROOT/.run/web.pid"; fi
  if [ -f "$DATA/postmaster.pid" ]; then as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast stop; else echo "not running"; fi
  exit 0 ;;
psql)
  exec "${PSQL[@]}" -d "$DB" ;;
start) ;;
*) echo "usage: $0 start|stop|psql [PG]" >&2; exit 2 ;;
esac

echo "== building pgque (release) and installing it into PostgreSQL $VER"
# A new file renamed over the old one: a server already running from this
# installation (this one, or a test's) keeps the library it maps.
bash "$ROOT/scripts/install.sh" "$PG_CONFIG" "$VER" --release >/tmp/pgque_run_install.log 2>&1 \
  || { tail -40 /tmp/pgque_run_install.log; exit 1; }

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

# The dashboard beside it (pgque-web, as the superuser: admin actions on, so
# it requires a login). Its admin token is made once, readable by this user
# only, and handed over in the environment (never on the command line).
WEB_LISTEN=${PGQUE_WEB_LISTEN:-127.0.0.1:8080}
WEB_TOKEN_FILE="$ROOT/.run/web-token"
if [ ! -s "$WEB_TOKEN_FILE" ]; then
  (umask 077; python3 -c 'import secrets; print(secrets.token_hex(16))' > "$WEB_TOKEN_FILE")
fi
WEB_CMD="PGQUE_WEB_ADMIN_TOKEN=\$(cat $WEB_TOKEN_FILE) pgque-web --database-url 'host=$SOCK port=$PORT user=postgres dbname=$DB' --listen $WEB_LISTEN"
echo "== building and starting the dashboard (pgque-web)"
if [ -f "$ROOT/.run/web.pid" ]; then kill "$(cat "$ROOT/.run/web.pid")" 2>/dev/null || true; rm -f "$ROOT/.run/web.pid"; fi
web_msg="Dashboard: could not start (see .run/web.log); run it with: $WEB_CMD"
if cargo build -q -p pgque-web >/tmp/pgque_run_web_build.log 2>&1; then
  WEB_BIN=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug/pgque-web
  PGQUE_WEB_ADMIN_TOKEN=$(cat "$WEB_TOKEN_FILE") nohup "$WEB_BIN" --database-url "host=$SOCK port=$PORT user=postgres dbname=$DB" --listen "$WEB_LISTEN" \
    >"$ROOT/.run/web.log" 2>&1 &
  echo $! > "$ROOT/.run/web.pid"
  for _ in $(seq 1 50); do
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' "http://$WEB_LISTEN/healthz" >/dev/null 2>&1 && { web_msg="Dashboard: http://$WEB_LISTEN/   (log in with the admin token in .run/web-token; Prometheus: http://$WEB_LISTEN/metrics with that token as a Bearer token; log .run/web.log)"; break; }
    kill -0 "$(cat "$ROOT/.run/web.pid")" 2>/dev/null || break
    sleep 0.2
  done
else
  tail -20 /tmp/pgque_run_web_build.log
fi

cat <<MSG

pgque is running on PostgreSQL $VER with the background worker preloaded.
$web_msg
Connect:   ${PSQL[*]} -d $DB      (or: make psql PG=$VER)
Stop:      make stop PG=$VER
Log:       $DATA/server.log
MSG
