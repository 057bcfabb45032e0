#!/usr/bin/env bash
# Runs the server-level test tier against one PostgreSQL major version:
# installs pgque into it, starts a throwaway cluster with pgque preloaded,
# runs `cargo test` in pg_test/, stops the cluster. Exit status: the tests'.
#
#   pg_test/run.sh 15            # all pg_test tests
#   pg_test/run.sh 16 worker     # only tests whose name matches "worker"
#
# Env: PGTEST_PROFILE=release|debug (default release: the timing-sensitive
# tests want the optimised library), PGQUE_REGRESS_ACCEPT=1 to (re)write
# expected regression output.
set -euo pipefail
VER=${1:?usage: run.sh PGVERSION [test filter]}
shift
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PG_CONFIG=$(sed -n "s/^pg$VER = \"\(.*\)\"$/\1/p" "$HOME/.pgrx/config.toml")
[ -n "$PG_CONFIG" ] || { echo "no pg$VER in ~/.pgrx/config.toml: run scripts/setup.sh" >&2; exit 1; }
BINDIR=$("$PG_CONFIG" --bindir)

PROFILE=${PGTEST_PROFILE:-release}
flag=(); [ "$PROFILE" = release ] && flag=(--release)
echo "[pgtest] installing pgque ($PROFILE) into PostgreSQL $VER"
cargo pgrx install "${flag[@]}" --pg-config "$PG_CONFIG" --no-default-features --features "pg$VER" >/tmp/pgque_pgtest_install_$VER.log 2>&1 \
  || { tail -40 /tmp/pgque_pgtest_install_$VER.log; exit 1; }
# The frozen install scripts of released versions (upgrade tests install them).
bash "$ROOT/scripts/ship_archive.sh" "$PG_CONFIG"

DATA=/tmp/pgque_pgtest_$VER
PORT=$((54000 + VER))
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

if [ -f "$DATA/postmaster.pid" ]; then as_pg "$BINDIR/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true; fi
rm -rf "$DATA"; mkdir -p "$DATA"
[ "$(id -u)" = 0 ] && chown postgres "$DATA"
as_pg "$BINDIR/initdb" -D "$DATA" -A trust -U postgres --no-sync >/dev/null
cat >> "$DATA/postgresql.conf" <<CONF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$DATA'
shared_preload_libraries = 'pgque'
max_worker_processes = 64
max_connections = 200
fsync = off
full_page_writes = off
log_min_messages = log
log_line_prefix = '%m [%p] %b %d '
CONF
cleanup() { as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast stop >/dev/null 2>&1 || as_pg "$BINDIR/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true; }
trap cleanup EXIT
as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w start >/dev/null

export PGQUE_TEST_HOST=$DATA PGQUE_TEST_PORT=$PORT PGQUE_TEST_BINDIR=$BINDIR PGQUE_TEST_PGDATA=$DATA PGQUE_TEST_PGVER=$VER
echo "[pgtest] PostgreSQL $VER on port $PORT (data $DATA)"
set +e
cargo test --no-fail-fast --manifest-path "$ROOT/pg_test/Cargo.toml" ${PGTEST_CARGO_ARGS:-} -- "$@"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "[pgtest] FAILED; last lines of the server log:"
  tail -60 "$DATA/server.log"
fi
exit $rc
