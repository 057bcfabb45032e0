#!/usr/bin/env bash
# `make cluster` / `make cluster-stop`: a sharded pgque on this machine
# (docs/scale-out.md): two shard servers with pgque (ports 55461, 55462) and a
# router server (55460) whose database pgque holds the PL/Proxy functions of
# sql/router/pgque_router.sql. Sockets in /tmp/pgque_cluster, data in
# .run/cluster/ (git-ignored). PostgreSQL 15 (the PL/Proxy that Debian packages
# here, postgresql-15-plproxy).
#
#   scripts/cluster.sh start     build (release), install, start, configure, print how to connect
#   scripts/cluster.sh stop
#   PGQUE_CLUSTER_NOBUILD=1 scripts/cluster.sh start   skip the build (pgque already installed)
set -euo pipefail
cmd=${1:-start}
VER=15
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PG_CONFIG=$(sed -n "s/^pg$VER = \"\(.*\)\"$/\1/p" "${PGRX_HOME:-$HOME/.pgrx}/config.toml" 2>/dev/null || true)
[ -n "$PG_CONFIG" ] || { echo "PostgreSQL $VER is not set up: run make setup" >&2; exit 1; }
BINDIR=$("$PG_CONFIG" --bindir)
SOCK=/tmp/pgque_cluster
BASE=$ROOT/.run/cluster
ROUTER_PORT=55460
SHARD_PORTS=(55461 55462)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
psql_at() { "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCK" -p "$1" -U postgres -d "$2" "${@:3}"; }

stop_one() { # DATA
  if [ -f "$1/postmaster.pid" ]; then as_pg "$BINDIR/pg_ctl" -D "$1" -m fast -w stop >/dev/null; fi
}

case "$cmd" in
stop)
  for d in "$BASE"/router "$BASE"/shard*; do [ -d "$d" ] && stop_one "$d"; done
  echo "cluster stopped"
  exit 0 ;;
start) ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

[ -f "$("$PG_CONFIG" --sharedir)/extension/plproxy.control" ] \
  || { echo "PL/Proxy is not installed for PostgreSQL $VER (apt-get install postgresql-$VER-plproxy; make setup does)" >&2; exit 1; }
if [ -z "${PGQUE_CLUSTER_NOBUILD:-}" ]; then
  echo "== building pgque (release) and installing it into PostgreSQL $VER"
  bash "$ROOT/scripts/install.sh" "$PG_CONFIG" "$VER" --release >/tmp/pgque_cluster_install.log 2>&1 \
    || { tail -40 /tmp/pgque_cluster_install.log; exit 1; }
fi

mkdir -p "$BASE" "$SOCK"
if [ "$(id -u)" = 0 ]; then
  chown postgres "$SOCK"
  d=$BASE; while [ "$d" != / ]; do chmod o+x "$d" 2>/dev/null || true; d=$(dirname "$d"); done
fi

start_one() { # NAME PORT PRELOAD
  local data=$BASE/$1
  if [ ! -f "$data/PG_VERSION" ]; then
    mkdir -p "$data"; [ "$(id -u)" = 0 ] && chown postgres "$data"
    as_pg "$BINDIR/initdb" -D "$data" -A trust -U postgres >/dev/null
    as_pg sh -c "cat >> '$data/postgresql.conf'" <<CONF
port = $2
listen_addresses = ''
unix_socket_directories = '$SOCK'
max_worker_processes = 32
$3
CONF
  fi
  if ! as_pg "$BINDIR/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    as_pg "$BINDIR/pg_ctl" -D "$data" -l "$data/server.log" -w start >/dev/null
  fi
}

dsns=()
for i in "${!SHARD_PORTS[@]}"; do
  port=${SHARD_PORTS[$i]}
  echo "== shard $i: port $port"
  start_one "shard$i" "$port" "shared_preload_libraries = 'pgque'"
  if [ "$(psql_at "$port" postgres -Atc "SELECT count(*) FROM pg_database WHERE datname = 'pgque'")" = 0 ]; then
    psql_at "$port" postgres -c "CREATE DATABASE pgque"
  fi
  psql_at "$port" pgque -c "CREATE EXTENSION IF NOT EXISTS pgque"
  dsns+=("host=$SOCK port=$port dbname=pgque connect_timeout=5")
done

echo "== router: port $ROUTER_PORT"
start_one router "$ROUTER_PORT" ""
if [ "$(psql_at "$ROUTER_PORT" postgres -Atc "SELECT count(*) FROM pg_database WHERE datname = 'pgque'")" = 0 ]; then
  psql_at "$ROUTER_PORT" postgres -c "CREATE DATABASE pgque"
fi
psql_at "$ROUTER_PORT" pgque -f "$ROOT/sql/router/pgque_router.sql"
arr=$(printf "'%s'," "${dsns[@]}"); arr="ARRAY[${arr%,}]"
psql_at "$ROUTER_PORT" pgque -Atc "SET client_min_messages = warning; SELECT pgque.configure_cluster($arr)" >/dev/null

cat <<MSG

pgque cluster up: router + ${#SHARD_PORTS[@]} shards (PostgreSQL $VER, sockets in $SOCK)
  producers (router):  psql -h $SOCK -p $ROUTER_PORT -U postgres -d pgque
      SELECT pgque.create_queue('orders');
      SELECT pgque.send('orders', 'created', '{"id": 1}'::jsonb, 'customer-42');
      SELECT pgque.shard_of('orders', 'customer-42');
  consumers (each shard):
MSG
for i in "${!SHARD_PORTS[@]}"; do
  echo "      shard $i: psql -h $SOCK -p ${SHARD_PORTS[$i]} -U postgres -d pgque"
done
echo "  stop: make cluster-stop"
