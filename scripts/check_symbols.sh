#!/usr/bin/env bash
# Every C symbol that a released install or upgrade script names
# (AS 'MODULE_PATHNAME', 'sym' in sql/archive/*.sql and sql/pgque--*.sql) must
# be exported by the library: after a package upgrade and restart, the new
# library serves the previous release's SQL objects until ALTER EXTENSION
# UPDATE, and a missing symbol fails that function's every call (issue #45).
#
#   scripts/check_symbols.sh PATH/TO/pgque.so
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
lib=${1:?usage: check_symbols.sh PATH/TO/pgque.so}
[ -f "$lib" ] || { echo "check_symbols.sh: no file $lib" >&2; exit 1; }
have=$(mktemp); want=$(mktemp)
trap 'rm -f "$have" "$want"' EXIT
nm -D --defined-only "$lib" | awk '$2 == "T" {print $3}' | sort -u >"$have"
[ -s "$have" ] || { echo "check_symbols.sh: $lib exports no functions" >&2; exit 1; }
# The symbol may follow MODULE_PATHNAME on the same line or the next one.
cat "$ROOT"/sql/archive/pgque--*.sql "$ROOT"/sql/pgque--*--*.sql \
  | tr '\n' ' ' | grep -oE "'MODULE_PATHNAME'[[:space:]]*,[[:space:]]*'[A-Za-z0-9_]+'" \
  | sed -E "s/.*'([A-Za-z0-9_]+)'$/\1/" | sort -u >"$want"
[ -s "$want" ] || { echo "check_symbols.sh: found no MODULE_PATHNAME symbols in sql/" >&2; exit 1; }
missing=$(comm -23 "$want" "$have")
if [ -n "$missing" ]; then
  echo "check_symbols.sh: $lib lacks C symbols that released scripts name:" >&2
  echo "$missing" | sed 's/^/  /' >&2
  exit 1
fi
echo "check_symbols.sh: all $(wc -l <"$want") symbols the released scripts name are in $(basename "$lib")"
