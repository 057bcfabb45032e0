#!/usr/bin/env bash
# Ships the frozen install scripts of released versions (sql/archive/
# pgque--<version>.sql) next to the ones `cargo pgrx install` / `package`
# write. cargo-pgrx copies only the current version's script and the upgrade
# scripts (sql/pgque--A--B.sql); without the old base scripts,
# `CREATE EXTENSION pgque VERSION '0.1.0'` fails.
#
#   scripts/ship_archive.sh PG_CONFIG            # into $(PG_CONFIG --sharedir)/extension
#   scripts/ship_archive.sh --dir EXTENSION_DIR  # into a directory (a cargo pgrx package tree)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --dir ]; then
  dest=${2:?usage: ship_archive.sh --dir EXTENSION_DIR}
else
  dest="$("${1:?usage: ship_archive.sh PG_CONFIG}" --sharedir)/extension"
fi
[ -d "$dest" ] || { echo "ship_archive.sh: no directory $dest" >&2; exit 1; }
for f in "$ROOT"/sql/archive/pgque--*.sql; do
  [ -e "$f" ] || continue
  install -m 0644 "$f" "$dest/$(basename "$f")"
done
