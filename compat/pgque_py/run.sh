#!/usr/bin/env bash
# The PgQue compatibility tier: PgQue's published Python client, pgque-py
# 0.2.2 from PyPI, driven against pgque on a private PostgreSQL cluster.
# Every public method of its PgqueClient and Consumer is called by the pytest
# files beside this script; a failure is a PgQue contract pgque breaks.
#
#   compat/pgque_py/run.sh 15            # install pgque, start a cluster, run pytest
#   compat/pgque_py/run.sh 15 -k coop    # extra arguments go to pytest
#   compat/pgque_py/run.sh --install-only   # only make the Python venv
#
# The venv (pgque-py==0.2.2, psycopg, pytest) is made once under the cargo
# target directory and reused; on a fresh machine the script installs
# python3-venv first. Env: PGTEST_PROFILE=tier|release|debug as for pg_test/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
HERE=$ROOT/compat/pgque_py
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
VENV=$TARGET/compat-pgque-py-0.2.2

make_venv() {
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import pgque, pytest; assert pgque.__version__ == "0.2.2"' 2>/dev/null; then
    return
  fi
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    echo "[compat] installing python3-venv"
    apt-get install -y -q python3-venv >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q python3-venv >/dev/null; }
  fi
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check 'pgque-py==0.2.2' 'pytest>=7,<9'
}

if [ "${1:-}" = "--install-only" ]; then
  make_venv
  exit 0
fi
VER=${1:?usage: run.sh PGVERSION [pytest args] | --install-only}
shift
make_venv

. "$ROOT/scripts/pgcluster.sh"
pgq_pg_config "$VER"
pgq_install "$VER" compat

DATA=/tmp/pgque_compat_$VER
PORT=$((55000 + VER))
pgq_cluster_start "$DATA" "$PORT" "max_worker_processes = 32"
echo "[compat] PostgreSQL $VER on port $PORT (data $DATA)"

# Two databases: one ticked by hand (its worker stopped: the tests call
# ticker() and count what it did), one with pgque's worker running (the
# Consumer class, woken by LISTEN/NOTIFY as in production). The client
# connects as an ordinary login role holding pgque_admin (reader + writer).
PSQL=("$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$DATA" -p "$PORT" -U postgres)
for db in compat_manual compat_worker; do
  "${PSQL[@]}" -d postgres -c "CREATE DATABASE $db"
  "${PSQL[@]}" -d "$db" -c "CREATE EXTENSION pgque"
done
# The pgque roles exist once the extension does.
"${PSQL[@]}" -d postgres -c "CREATE ROLE compat_app LOGIN" -c "GRANT pgque_admin TO compat_app"
"${PSQL[@]}" -d compat_manual -c "SELECT pgque.stop()" >/dev/null
# The worker CREATE EXTENSION started leaves within a second of stop(); until it
# has, it may still tick, and the manual tests count every tick themselves.
for _ in $(seq 1 300); do
  n=$("${PSQL[@]}" -d postgres -Atc "SELECT count(*) FROM pg_stat_activity
        WHERE backend_type = 'pgque worker' AND datname = 'compat_manual'")
  [ "$n" = 0 ] && break
  sleep 0.1
done
[ "$n" = 0 ] || { echo "[compat] the worker of compat_manual did not leave after stop()" >&2; exit 1; }

export PGQUE_COMPAT_MANUAL_DSN="host=$DATA port=$PORT user=compat_app dbname=compat_manual"
export PGQUE_COMPAT_WORKER_DSN="host=$DATA port=$PORT user=compat_app dbname=compat_worker"
export PGQUE_COMPAT_SUPER_DSN="host=$DATA port=$PORT user=postgres dbname=compat_manual"
set +e
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$HERE" "$@"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "[compat] FAILED; last lines of the server log:"
  tail -40 "$DATA/server.log"
fi
exit $rc
