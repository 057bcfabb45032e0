#!/usr/bin/env bash
# Installs pgque into the PostgreSQL that PG_CONFIG names, safely beside a server
# that runs from that installation with pgque preloaded.
#
#   scripts/install.sh PG_CONFIG PGMAJOR [--debug|--tier|--release]
#                                                      # build, install, frozen scripts
#                                                      # (cargo profile dev, tier or release)
#   scripts/install.sh --unlink PG_CONFIG             # only unlink the installed library
#                                                      # (before `cargo pgrx test`)
#
# cargo-pgrx's own install copies the library in place (open, truncate, write). A
# running server maps pgque.so (the postmaster and every process it forks), and
# pages that change or vanish under a mapping kill the process with SIGBUS: with
# the postmaster, the whole server. So this script builds a package into the
# target dir and puts each file in place as a new file renamed over the old one:
# processes that map the old library keep it until they exit, new ones load the
# new file. `--unlink` is the same idea for `cargo pgrx test`, whose install
# cannot be changed: with the old file unlinked first, its copy makes a new one.
# docs/operations.md ("Upgrading a running server") says the same for operators.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --unlink ]; then
  rm -f "$("${2:?usage: install.sh --unlink PG_CONFIG}" --pkglibdir)/pgque.so"
  exit 0
fi
PG_CONFIG=${1:?usage: install.sh PG_CONFIG PGMAJOR [--debug|--tier|--release]}
VER=${2:?usage: install.sh PG_CONFIG PGMAJOR [--debug|--tier|--release]}
case "${3:---debug}" in
  --debug) profile=(--debug) ;;
  --tier) profile=(--profile tier) ;;
  --release) profile=() ;;
  *) echo "install.sh: unknown profile ${3}" >&2; exit 2 ;;
esac
# One stage per run: tiers installing side by side (or two developers' runs)
# must not remove each other's package before it is put in place.
stage="${CARGO_TARGET_DIR:-$ROOT/target}/pgque-stage-pg$VER.$$"
rm -rf "$stage"
trap 'rm -rf "$stage"' EXIT
# cargo-pgrx packages target/<profile>/libpgque.so, the file every build of
# that profile links there, whatever its PostgreSQL major: two installs
# sharing a target dir (two majors, two checkouts) could each package the
# other's library. One build and copy at a time per target dir.
target="${CARGO_TARGET_DIR:-$ROOT/target}"
mkdir -p "$target"
flock "$target/.pgque-package.lock" \
  cargo pgrx package "${profile[@]}" --pg-config "$PG_CONFIG" --no-default-features \
  --features "pg$VER" --out-dir "$stage"
put() { # MODE SRC DESTDIR: a new file beside the old one, then an atomic rename
  local dest="$3/$(basename "$2")"
  install -m "$1" -T "$2" "$dest.new.$$"
  mv -f "$dest.new.$$" "$dest"
}
libdir=$("$PG_CONFIG" --pkglibdir)
extdir="$("$PG_CONFIG" --sharedir)/extension"
put 0755 "$stage$libdir/pgque.so" "$libdir"
for f in "$stage$extdir"/pgque*; do put 0644 "$f" "$extdir"; done
bash "$ROOT/scripts/ship_archive.sh" "$PG_CONFIG"
