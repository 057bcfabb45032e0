#!/usr/bin/env bash
# The dashboard tier (`make test-web`): builds pgque and pgque-web, starts a
# private PostgreSQL with pgque preloaded, and runs web/tests/test_web.py
# against both: /metrics parsed by prometheus_client and compared with
# pgque.metrics(), logins through the login page and every page in headless
# Chromium (WebDriver), admin actions through the browser, the job explorer's
# pages (jobs list, job, flow, schedules) against the database's own figures
# and its bulk actions, a read-only role
# and a read login, every page against a hot standby of the server (made by
# pg_basebackup) with its admin actions refused, forged POSTs, foreign Host and Origin headers, requests
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

. "$ROOT/scripts/pgcluster.sh"
pgq_pg_config "$VER"
for b in /usr/bin/chromium /usr/bin/chromedriver; do
  [ -x "$b" ] || { echo "$b is missing: run scripts/setup.sh (apt-get install chromium chromium-driver)" >&2; exit 1; }
done
/usr/bin/python3 -c 'import prometheus_client, psycopg2' 2>/dev/null \
  || { echo "python3-prometheus-client / python3-psycopg2 missing: run scripts/setup.sh" >&2; exit 1; }

PGTEST_PROFILE=${WEBTEST_PROFILE:-${PGTEST_PROFILE:-tier}} pgq_install "$VER" webtest
echo "[webtest] building pgque-web"
cargo build -q -p pgque-web
TARGET=$(cargo metadata --format-version 1 --no-deps | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
WEB_BIN=$TARGET/debug/pgque-web

DATA=/tmp/pgque_webtest_$VER
PORT=$((54100 + VER))
pgq_cluster_start "$DATA" "$PORT" ""
echo "[webtest] PostgreSQL $VER on port $PORT (data $DATA)"

export WEBTEST_PGHOST=$DATA WEBTEST_PGPORT=$PORT WEBTEST_BIN=$WEB_BIN WEBTEST_ROOT=$ROOT WEBTEST_PGBINDIR=$BINDIR
set +e
/usr/bin/python3 "$ROOT/web/tests/test_web.py" "$@"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "[webtest] FAILED; last lines of the server log:"
  tail -30 "$DATA/server.log"
fi
exit $rc
