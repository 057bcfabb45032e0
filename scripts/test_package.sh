#!/usr/bin/env bash
# The package tier (issue #45, make test-package): on Debian's PostgreSQL 15,
# install postgresql-15-pgque from nothing with apt-get, preload it in a private
# cluster, CREATE EXTENSION, send and receive, run a job; upgrade from the
# 0.8.0 package with state in flight (PKG_SKIP_UPGRADE=1 skips that); remove
# the package and show the server fails to start while shared_preload_libraries
# names pgque, and starts once the setting is gone. Then reinstall the dev
# build (scripts/install.sh), which the other tiers on 15 use from the same
# directory. Installs into /usr/lib/postgresql/15: never run it beside another
# tier on 15.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=pgcluster.sh
source "$ROOT/scripts/pgcluster.sh"
[ "$(id -u)" = 0 ] || { echo "test_package.sh: needs root (apt-get install)" >&2; exit 1; }
[ -x /usr/lib/postgresql/15/bin/pg_config ] || { echo "test_package.sh: needs Debian's postgresql-15" >&2; exit 1; }
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
BINDIR=/usr/lib/postgresql/15/bin
target="${CARGO_TARGET_DIR:-$ROOT/target}"
out="$target/pgque-package"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -1)
OLD_COMMIT=${PKG_OLD_COMMIT:-3ff08fa}
OLD_VERSION=0.8.0
DATA=/tmp/pgque_pkgtest/data
PORT=55490
step() { echo "[package] $(date -u +%T) $*"; }
fail() { echo "[package] FAIL: $*" >&2; exit 1; }
q() { as_pg "$BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$DATA" -p "$PORT" -d postgres -c "$1"; }

reinstall_dev() {
  step "reinstalling the dev build for the other tiers"
  bash "$ROOT/scripts/install.sh" "$PG_CONFIG" 15 --tier >/tmp/pgque_pkgtest_reinstall.log 2>&1 \
    || { tail -20 /tmp/pgque_pkgtest_reinstall.log; echo "[package] dev reinstall FAILED" >&2; }
}
cleanup() { pgq_cluster_stop; reinstall_dev; }
# pgq_cluster_start sets its own EXIT trap: put ours (which also stops it) back.
start_cluster() { pgq_cluster_start "$DATA" "$PORT" "max_worker_processes = 16"; trap cleanup EXIT; }

purge() { apt-get purge -y -q postgresql-15-pgque >/dev/null 2>&1 || true; }
apt_install() { # DEB: prints apt's and postinst's output into LOG, returns apt's status
  apt-get install -y -q --allow-downgrades "$1" >"$2" 2>&1
}

# ---- 1. the new package from nothing ----
deb="$out/postgresql-15-pgque_${version}_amd64.deb"
step "building $deb"
bash "$ROOT/scripts/package.sh" --tier 15 >/tmp/pgque_pkgtest_build.log 2>&1 \
  || { tail -30 /tmp/pgque_pkgtest_build.log; fail "package.sh"; }
# The previous release's package, built once per commit and cached: built
# before anything is installed, so that a build failure leaves the system as it was.
old_deb="$out/old-$OLD_COMMIT/postgresql-15-pgque_${OLD_VERSION}_amd64.deb"
build_old() {
  if [ ! -f "$old_deb" ]; then
    if ! git -C "$ROOT" cat-file -e "$OLD_COMMIT^{commit}" 2>/dev/null; then
      # A shallow clone has no previous release to build: say so loudly and
      # test the rest (install, use, removal).
      echo "[package] WARNING: commit $OLD_COMMIT (release $OLD_VERSION) is not in this clone's history:" \
           "the upgrade from the $OLD_VERSION package is NOT tested (fetch the history to test it)" >&2
      PKG_SKIP_UPGRADE=1
      return 0
    fi
    src=$(mktemp -d /tmp/pgque_old_src.XXXXXX)
    git -C "$ROOT" archive "$OLD_COMMIT" | tar -x -C "$src"
    # 0.8.0 has no package.sh: build it with this one (the file layout is the same).
    cp "$ROOT/scripts/package.sh" "$ROOT/scripts/check_symbols.sh" "$ROOT/scripts/check_meta.sh" "$src/scripts/"
    sed "s/\"0.9.0\"/\"$OLD_VERSION\"/" "$ROOT/META.json" >"$src/META.json"
    step "building the $OLD_VERSION package from $OLD_COMMIT (cached afterwards)"
    CARGO_TARGET_DIR="$target" bash "$src/scripts/package.sh" --tier 15 >/tmp/pgque_pkgtest_old.log 2>&1 \
      || { tail -30 /tmp/pgque_pkgtest_old.log; fail "building $OLD_VERSION"; }
    mkdir -p "$(dirname "$old_deb")"
    mv "$out/postgresql-15-pgque_${OLD_VERSION}_amd64.deb" "$old_deb"
    rm -rf "$src"
    # The new package's build was overwritten by the old one in the shared
    # stage, and so was the library cargo uplifts to $target/tier/: both
    # crates are `pgque`, and cargo takes the new one for fresh (its own
    # fingerprint is untouched) and does not copy it there again. Forget
    # pgque's fingerprints so the rebuild compiles this tree (package.sh's
    # symbol check caught the stale library once the new release named C
    # symbols the old one lacks).
    find "$target/tier/.fingerprint" -maxdepth 1 -regex '.*/pgque-[0-9a-f]+' -exec rm -rf {} +
    bash "$ROOT/scripts/package.sh" --tier 15 >/tmp/pgque_pkgtest_build.log 2>&1 \
      || { tail -30 /tmp/pgque_pkgtest_build.log; fail "package.sh (again)"; }
  fi
}
[ "${PKG_SKIP_UPGRADE:-0}" = 1 ] || build_old
# build_old may have found no history and set PKG_SKIP_UPGRADE=1.
if [ "${PKG_BUILD_ONLY:-0}" = 1 ]; then step "built $deb and $old_deb"; exit 0; fi

mkdir -p "$(dirname "$DATA")"; chown postgres "$(dirname "$DATA")"
trap cleanup EXIT
purge
# Files the dev install left (not owned by a package) go too: "from nothing".
rm -f /usr/lib/postgresql/15/lib/pgque.so /usr/share/postgresql/15/extension/pgque*
step "apt-get install ./$(basename "$deb")"
apt_install "$deb" /tmp/pgque_pkgtest_apt.log || { cat /tmp/pgque_pkgtest_apt.log; fail "apt-get install"; }
grep -q "shared_preload_libraries = 'pgque'" /tmp/pgque_pkgtest_apt.log || fail "postinst did not say shared_preload_libraries"
grep -q "max_worker_processes" /tmp/pgque_pkgtest_apt.log || fail "postinst did not say max_worker_processes"
dpkg -s postgresql-15-pgque | grep -q "^Version: $version$" || fail "dpkg does not list $version"
start_cluster
q "CREATE EXTENSION pgque"
[ "$(q "SELECT extversion FROM pg_extension WHERE extname = 'pgque'")" = "$version" ] || fail "extversion"
q "SELECT pgque.create_queue('pk'); SELECT pgque.subscribe('pk', 'c');" >/dev/null
q "SELECT pgque.send('pk', '{\"n\": 1}'::jsonb)" >/dev/null
# The worker ticks within milliseconds of the commit; wait for the batch.
got=""
for _ in $(seq 50); do
  got=$(q "SELECT count(*) FROM pgque.receive('pk', 'c', 100)")
  [ "$got" = 1 ] && break; sleep 0.2
done
[ "$got" = 1 ] || fail "the sent event was not received (got '$got')"
q "SELECT pgque.create_job_queue('pj')" >/dev/null
jid=$(q "SELECT pgque.enqueue('pj', 'k', '{}')")
tok=$(q "SELECT lease_token FROM pgque.dispatch(ARRAY['pj'], 1, 'w1')")
[ -n "$tok" ] || fail "job $jid was not dispatched"
[ "$(q "SELECT pgque.complete($jid, $tok)")" = t ] || fail "job $jid did not complete"
step "fresh install: extension $version created, event received, job $jid completed"
pgq_cluster_stop

# ---- 2. upgrade from the previous release's package with state in flight ----
if [ "${PKG_SKIP_UPGRADE:-0}" != 1 ]; then
  purge
  step "installing the $OLD_VERSION package"
  apt_install "$old_deb" /tmp/pgque_pkgtest_apt_old.log || { cat /tmp/pgque_pkgtest_apt_old.log; fail "apt-get install $OLD_VERSION"; }
  start_cluster
  q "CREATE EXTENSION pgque VERSION '$OLD_VERSION'"
  q "SELECT pgque.create_queue('uq'); SELECT pgque.subscribe('uq', 'open'); SELECT pgque.subscribe('uq', 'later');" >/dev/null
  q "SELECT pgque.send_batch('uq', array_fill('e'::text, ARRAY[20]))" >/dev/null
  for _ in $(seq 50); do
    n=$(q "SELECT count(*) FROM pgque.receive('uq', 'open', 100)")
    [ "$n" = 20 ] && break; sleep 0.2
  done
  [ "$n" = 20 ] || fail "$OLD_VERSION: the open batch has $n events, not 20"
  # 'open' keeps its batch open (no ack) across the upgrade; 'later' has read nothing.
  q "SELECT pgque.create_job_queue('uj')" >/dev/null
  q "SELECT pgque.enqueue('uj', 'k', jsonb_build_object('i', i)) FROM generate_series(1, 10) i" >/dev/null
  leased=$(q "SELECT job_id || ' ' || lease_token FROM pgque.dispatch(ARRAY['uj'], 1, 'w-old', lease => '1 hour')")
  [ -n "$leased" ] || fail "$OLD_VERSION: nothing leased"
  read -r ljid ltok <<<"$leased"
  step "$OLD_VERSION: 20 events sent, 'open' holds a batch, 10 jobs queued, job $ljid leased"
  step "installing the $version package over it, restarting"
  apt_install "$deb" /tmp/pgque_pkgtest_apt_up.log || { cat /tmp/pgque_pkgtest_apt_up.log; fail "apt-get install $version over $OLD_VERSION"; }
  as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast -w restart -l "$DATA/server.log" >/dev/null
  q "ALTER EXTENSION pgque UPDATE"
  [ "$(q "SELECT extversion FROM pg_extension WHERE extname = 'pgque'")" = "$version" ] || fail "ALTER EXTENSION UPDATE did not reach $version"
  # The open batch is still open and redelivered, then acked; 'later' reads all 20.
  n=$(q "SELECT count(*) FROM pgque.receive('uq', 'open', 100)")
  [ "$n" = 20 ] || fail "after the upgrade, 'open' re-reads $n of its 20 events"
  bid=$(q "SELECT DISTINCT batch_id FROM pgque.receive('uq', 'open', 100)")
  q "SELECT pgque.ack($bid)" >/dev/null
  n=$(q "SELECT count(*) FROM pgque.receive('uq', 'later', 100)")
  [ "$n" = 20 ] || fail "after the upgrade, 'later' receives $n of 20"
  [ "$(q "SELECT pgque.complete($ljid, $ltok)")" = t ] || fail "the job leased by $OLD_VERSION did not complete after the upgrade"
  done_n=0
  for _ in $(seq 20); do
    rows=$(q "SELECT job_id || ' ' || lease_token FROM pgque.dispatch(ARRAY['uj'], 50, 'w-new')")
    [ -z "$rows" ] && break
    while read -r j t; do
      [ "$(q "SELECT pgque.complete($j, $t)")" = t ] || fail "job $j did not complete"
      done_n=$((done_n + 1))
    done <<<"$rows"
  done
  [ "$done_n" = 9 ] || fail "after the upgrade, $done_n of the 9 queued jobs were dispatched"
  step "upgrade $OLD_VERSION -> $version: open batch redelivered, 20 events to the other consumer, leased job completed, 9 queued jobs done"
  pgq_cluster_stop
fi

# ---- 3. removal ----
start_cluster
q "CREATE EXTENSION pgque" >/dev/null
pgq_cluster_stop
step "apt-get purge postgresql-15-pgque"
apt-get purge -y -q postgresql-15-pgque >/tmp/pgque_pkgtest_purge.log 2>&1 || { cat /tmp/pgque_pkgtest_purge.log; fail "purge"; }
grep -q "will NOT START" /tmp/pgque_pkgtest_purge.log || fail "prerm did not warn"
[ ! -e /usr/lib/postgresql/15/lib/pgque.so ] || fail "pgque.so is still installed"
if as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 20 start >/dev/null 2>&1; then
  fail "the server started with shared_preload_libraries = 'pgque' and no library"
fi
grep -q 'could not access file "pgque"' "$DATA/server.log" || fail "the server log does not say why it failed"
step "without the library the server refuses to start, as prerm said"
sed -i "s/^shared_preload_libraries = 'pgque'/#&/" "$DATA/postgresql.conf"
as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w start >/dev/null || fail "the server did not start with pgque unpreloaded"
q "SELECT 1" >/dev/null
step "with shared_preload_libraries cleared the server starts"
echo "[package] all green"
