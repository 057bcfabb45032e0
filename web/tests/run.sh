#!/usr/bin/env bash
# The dashboard tier (`make test-web`): builds pgque and pgque-web, starts a
# private PostgreSQL with pgque preloaded, and runs web/tests/test_web.py
# against both: /metrics parsed by prometheus_client and compared with
# pgque.metrics(), logins through the login page and every page in headless
# Chromium (WebDriver), admin actions through the browser, a read-only role
# and a read login, forged POSTs, foreign Host and Origin headers, requests
# without a session, logout, and startups refused for want of credentials.
# It rewrites the screenshots in docs/screenshots/. Exit status: the tests'.
#
#   web/tests/run.sh [PGVERSION] [test name filter]
#
# Env: WEBTEST_PROFILE=tier|release|debug (the pgque library; default tier, as
# pg_test/run.sh, whose build it shares), WEBTEST_SCREENSHOTS=0 to leave
# docs/screenshots alone.
set -euo pipefail
VER=${1:-15}
shift || true
cd "$(dirname "$0")/../.."
ROOT=$(pwd)

PG_CONFIG=$(sed -n "s/^pg$VER = \"\(.*\)\"$/\1/p" "${PGRX_HOME:-$HOME/.pgrx}/config.toml")
[ -n "$PG_CONFIG" ] || { echo "no pg$VER in ~/.pgrx/config.toml: run scripts/setup.sh" >&2; exit 1; }
BINDIR=$("$PG_CONFIG" --bindir)
for b in /usr/bin/chromium /usr/bin/chromedriver; do
  [ -x "$b" ] || { echo "$b is missing: run scripts/setup.sh (apt-get install chromium chromium-driver)" >&2; exit 1; }
done
/usr/bin/python3 -c 'import prometheus_client, psycopg2' 2>/dev/null \
  || { echo "python3-prometheus-client / python3-psycopg2 missing: run scripts/setup.sh" >&2; exit 1; }

PROFILE=${WEBTEST_PROFILE:-tier}
flag=(--$PROFILE)
echo "[webtest] installing pgque ($PROFILE) into PostgreSQL $VER"
bash "$ROOT/scripts/install.sh" "$PG_CONFIG" "$VER" "${flag[@]}" >/tmp/pgque_webtest_install_$VER.log 2>&1 \
  || { tail -40 /tmp/pgque_webtest_install_$VER.log; exit 1; }
echo "[webtest] building pgque-web"
cargo build -q -p pgque-web
TARGET=$(cargo metadata --format-version 1 --no-deps | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
WEB_BIN=$TARGET/debug/pgque-web

DATA=/tmp/pgque_webtest_$VER
PORT=$((54100 + VER))
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
fsync = off
full_page_writes = off
CONF
cleanup() { as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast stop >/dev/null 2>&1 || as_pg "$BINDIR/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true; }
trap cleanup EXIT
as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w start >/dev/null
echo "[webtest] PostgreSQL $VER on port $PORT (data $DATA)"

export WEBTEST_PGHOST=$DATA WEBTEST_PGPORT=$PORT WEBTEST_BIN=$WEB_BIN WEBTEST_ROOT=$ROOT
set +e
/usr/bin/python3 "$ROOT/web/tests/test_web.py" "$@"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "[webtest] FAILED; last lines of the server log:"
  tail -30 "$DATA/server.log"
fi
exit $rc
