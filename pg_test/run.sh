#!/usr/bin/env bash
# Runs the server-level test tier against one PostgreSQL major version:
# installs pgque into it, starts a throwaway cluster with pgque preloaded,
# runs `cargo test` in pg_test/, stops the cluster. Exit status: the tests'.
#
#   pg_test/run.sh 15            # all pg_test tests
#   pg_test/run.sh 16 worker     # only tests whose name matches "worker"
#
# Env: PGTEST_PROFILE=tier|release|debug (default tier, optimised: the timing-sensitive
# tests want the optimised library), PGQUE_REGRESS_ACCEPT=1 to (re)write
# expected regression output.
set -euo pipefail
VER=${1:?usage: run.sh PGVERSION [test filter]}
shift
cd "$(dirname "$0")/.."
ROOT=$(pwd)

. "$ROOT/scripts/pgcluster.sh"
pgq_pg_config "$VER"

# On the newest version the tier also runs pg_upgrade from each older major
# (tests/major_upgrade.rs): pgque into all of them first, this version last.
if [ "$VER" = 18 ] && [ "${PGTEST_MAJOR_UPGRADE:-1}" = 1 ]; then
  bash "$ROOT/pg_test/major_upgrade_prep.sh"
fi
# scripts/install.sh also ships the frozen install scripts of released versions
# (the upgrade tests install them).
pgq_install "$VER" pgtest

DATA=/tmp/pgque_pgtest_$VER
PORT=$((54000 + VER))
# The tier's databases are made as users make theirs (DESIGN.md section 25):
# every cluster's locale is en_US.UTF-8; its databases' default collation
# comes from libc on 14 (and 16, 17), from ICU on 15 (Debian's build has it;
# the other binaries here are built without) and from the builtin provider
# on 18. tests/real_databases.rs adds the other kinds each server can make.
# The private clusters the tests start (pgque_pg_test::Cluster) are made the
# same way (PGQUE_TEST_LOCALE_OPTS).
case "$VER" in
  15) PGQ_LOCALE=${PGQ_LOCALE:-icu} ;;
  18) PGQ_LOCALE=${PGQ_LOCALE:-builtin} ;;
  *) PGQ_LOCALE=${PGQ_LOCALE:-libc} ;;
esac
export PGQ_LOCALE
export PGQUE_TEST_LOCALE_OPTS="$(pgq_initdb_locale "$PGQ_LOCALE")"
# the tests time duties on their active cadences; tests/idle.rs runs idle
# mode (the default) on private clusters
pgq_cluster_start "$DATA" "$PORT" "max_worker_processes = 64
max_connections = 200
log_min_messages = log
pgque.idle_after = 0"

# Installing over a running server must not touch what it maps: reinstall now,
# while the postmaster maps the library (preloaded), and check that the file it
# maps was replaced, not rewritten, and that the server lives on.
lib="$("$PG_CONFIG" --pkglibdir)/pgque.so"
pm=$(head -1 "$DATA/postmaster.pid")
mapped_inode() { awk -v lib="$lib" '$6 == lib { print $5; exit }' "/proc/$pm/maps"; }
before=$(mapped_inode)
[ -n "$before" ] || { echo "[pgtest] the postmaster does not map $lib"; exit 1; }
bash "$ROOT/scripts/install.sh" "$PG_CONFIG" "$VER" "--${PGTEST_PROFILE:-tier}" >>/tmp/pgque_pgtest_install_$VER.log 2>&1 \
  || { tail -40 /tmp/pgque_pgtest_install_$VER.log; exit 1; }
now=$(stat -c %i "$lib")
if [ "$now" = "$before" ]; then
  echo "[pgtest] FAILED: the install rewrote the library file a running server maps (inode $now)"; exit 1
fi
as_pg "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null \
  || { echo "[pgtest] FAILED: the server died when pgque was reinstalled under it"; tail -20 "$DATA/server.log"; exit 1; }
"$BINDIR/psql" -X -q -h "$DATA" -p "$PORT" -U postgres -d postgres -Atc "SELECT 1" >/dev/null \
  || { echo "[pgtest] FAILED: no new session after the reinstall"; exit 1; }
echo "[pgtest] reinstalled under the running server: library replaced (inode $before -> $now), server up"

export PGQUE_TEST_HOST=$DATA PGQUE_TEST_PORT=$PORT PGQUE_TEST_BINDIR=$BINDIR PGQUE_TEST_PGDATA=$DATA PGQUE_TEST_PGVER=$VER
echo "[pgtest] PostgreSQL $VER on port $PORT (data $DATA)"
set +e
# The test binaries run side by side, PGTEST_JOBS at a time (default 4): they
# are mostly waiting (for ticks, leases, workers, crash restarts), and each
# test owns its databases, roles and private clusters, so they share the
# server as the tests inside one binary already do. Longest first, so the
# long ones do not end the run alone. PGTEST_JOBS=1 runs them one by one and
# adds each binary's busy CPU (the whole machine's, from /proc/stat).
bash "$ROOT/pg_test/parallel.sh" "$ROOT/pg_test" "${PGTEST_JOBS:-4}" ${PGTEST_CARGO_ARGS:-} -- "$@"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "[pgtest] FAILED; last lines of the server log:"
  tail -60 "$DATA/server.log"
fi
exit $rc
