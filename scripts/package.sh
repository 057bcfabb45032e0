#!/usr/bin/env bash
# Builds installable pgque packages from the built library, so that a database
# host needs no Rust toolchain (issue #45, DESIGN.md section 28):
#
#   scripts/package.sh [--release|--tier] [MAJOR...]    # default: release, 14 15 16 17 18
#
# For each major: postgresql-<major>-pgque_<version>_amd64.deb (Debian layout,
# Depends: postgresql-<major>) and pgque-<version>-pg<major>-amd64.tar.gz (the
# same files under usr/, for servers that are not Debian), into
# $CARGO_TARGET_DIR/pgque-package/ (or target/pgque-package/). The version is
# Cargo.toml's; META.json (PGXN) must carry the same one or this fails.
#
# The library is built against each major's pg_config from ~/.pgrx/config.toml
# (the same build `cargo pgrx package` makes); the files are then laid out at
# Debian's paths (/usr/lib/postgresql/<major>/lib, /usr/share/postgresql/<major>/
# extension), whatever prefix that build's PostgreSQL has: the ABI is the major's.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# cargo builds the crate of the current directory: build this tree's, not the caller's
# (test_package.sh runs a copy of this script in a 0.8.0 checkout).
cd "$ROOT"
usage() { echo "usage: package.sh [--release|--tier] [MAJOR...]  (MAJOR in 14..18)" >&2; exit 2; }
profile=(--release)
case "${1:-}" in
  --release) shift ;;
  --tier) profile=(--tier); shift ;;
  -*) usage ;;
esac
majors=("$@")
[ ${#majors[@]} -gt 0 ] || majors=(14 15 16 17 18)
for m in "${majors[@]}"; do
  case "$m" in 14|15|16|17|18) ;; *) echo "package.sh: unsupported PostgreSQL major '$m'" >&2; usage ;; esac
done
for t in dpkg-deb tar nm; do
  command -v "$t" >/dev/null || { echo "package.sh: needs $t on PATH" >&2; exit 1; }
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -1)
[ -n "$version" ] || { echo "package.sh: no version in Cargo.toml" >&2; exit 1; }
bash "$ROOT/scripts/check_meta.sh"

target="${CARGO_TARGET_DIR:-$ROOT/target}"
out="$target/pgque-package"
mkdir -p "$out"
pgrx_config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"

for m in "${majors[@]}"; do
  pgc=$(sed -n "s/^pg$m = \"\(.*\)\"$/\1/p" "$pgrx_config")
  [ -x "$pgc" ] || { echo "package.sh: no pg_config for pg$m in $pgrx_config (run make setup)" >&2; exit 1; }
  stage="$out/stage-pg$m"
  rm -rf "$stage"
  case "${profile[0]}" in
    --release) cprof=() ;;
    --tier) cprof=(--profile tier) ;;
  esac
  # cargo-pgrx packages target/<profile>/libpgque.so whatever the major: one
  # build and copy at a time per target dir (the same lock install.sh takes).
  flock "$target/.pgque-package.lock" \
    cargo pgrx package "${cprof[@]}" --pg-config "$pgc" --no-default-features \
    --features "pg$m" --out-dir "$stage/build"
  libdir=$("$pgc" --pkglibdir)
  extdir="$("$pgc" --sharedir)/extension"
  root="$stage/root"
  deb_lib="$root/usr/lib/postgresql/$m/lib"
  deb_ext="$root/usr/share/postgresql/$m/extension"
  mkdir -p "$deb_lib" "$deb_ext"
  install -m 0755 "$stage/build$libdir/pgque.so" "$deb_lib/pgque.so"
  for f in "$stage/build$extdir"/pgque*; do install -m 0644 "$f" "$deb_ext/"; done
  # The released versions' base scripts, as install.sh ships them.
  bash "$ROOT/scripts/ship_archive.sh" --dir "$deb_ext"
  # Every script the source tree has must be in the package: a missing upgrade
  # script makes ALTER EXTENSION UPDATE fail on the server, not here.
  for f in "$ROOT"/sql/archive/pgque--*.sql "$ROOT"/sql/pgque--*--*.sql; do
    [ -f "$deb_ext/$(basename "$f")" ] || { echo "package.sh: $(basename "$f") missing from the pg$m package" >&2; exit 1; }
  done
  [ -f "$deb_ext/pgque--$version.sql" ] || { echo "package.sh: pgque--$version.sql not built" >&2; exit 1; }
  grep -q "^default_version = '$version'" "$deb_ext/pgque.control" \
    || { echo "package.sh: pgque.control does not say default_version = '$version'" >&2; exit 1; }
  # The new library must serve every released script's C functions.
  bash "$ROOT/scripts/check_symbols.sh" "$deb_lib/pgque.so"

  # ---- the tarball: the same files, relative to / ----
  tarball="$out/pgque-$version-pg$m-amd64.tar.gz"
  tar -C "$root" --owner=0 --group=0 -czf "$tarball" usr

  # ---- the .deb ----
  mkdir -p "$root/DEBIAN"
  size=$(du -sk "$root/usr" | cut -f1)
  cat >"$root/DEBIAN/control" <<EOF
Package: postgresql-$m-pgque
Version: $version
Architecture: amd64
Maintainer: pgque developers <pgque@localhost>
Depends: postgresql-$m, libc6
Section: database
Priority: optional
Installed-Size: $size
Homepage: https://github.com/pgque/pgque
Description: pgque: event queues and job queues for PostgreSQL $m
 PgQ-style event queues and job queues in a PostgreSQL extension, maintained
 by in-server background workers. The library must be preloaded
 (shared_preload_libraries = 'pgque') and the server restarted.
EOF
  # postinst: says what to set; never edits postgresql.conf (the operator owns it).
  cat >"$root/DEBIAN/postinst" <<EOF
#!/bin/sh
set -e
if [ "\$1" = configure ]; then
  cat <<'MSG'
postgresql-$m-pgque $version installed. pgque runs background workers, so it
must be preloaded; this package does not edit your configuration. In
postgresql.conf of each PostgreSQL $m cluster that uses pgque, set:
    shared_preload_libraries = 'pgque'   (add it to any existing list)
    max_worker_processes = 16            (at least 8 more than you use now)
then restart the server and, in each database:
    CREATE EXTENSION pgque;               (new)
    ALTER EXTENSION pgque UPDATE;          (upgrading: after the restart)
See docs/install.md.
MSG
fi
exit 0
EOF
  # prerm: before the library goes, say that a server still preloading it will
  # not start. Warns only: refusing removal would block dist-upgrades.
  cat >"$root/DEBIAN/prerm" <<EOF
#!/bin/sh
set -e
if [ "\$1" = remove ] || [ "\$1" = purge ]; then
  cat >&2 <<'MSG'
WARNING: removing postgresql-$m-pgque. A PostgreSQL $m server whose
shared_preload_libraries still names pgque will NOT START once the library
is gone (FATAL: could not access file "pgque"). Before restarting it, remove
pgque from shared_preload_libraries in postgresql.conf (and from
postgresql.auto.conf: ALTER SYSTEM RESET shared_preload_libraries, or SET it
to the remaining list). DROP EXTENSION pgque in each database first if you
are done with it.
MSG
fi
exit 0
EOF
  chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm"
  deb="$out/postgresql-$m-pgque_${version}_amd64.deb"
  dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
  echo "package.sh: $deb"
  echo "package.sh: $tarball"
  rm -rf "$stage/build"
done
cp "$ROOT/META.json" "$out/META.json"
echo "package.sh: $out/META.json"
