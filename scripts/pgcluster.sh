# Sourced by every test tier (pg_test/run.sh, clients/run.sh,
# compat/pgque_py/run.sh, web/tests/run.sh): one way to find a PostgreSQL
# version, install pgque into it and start a throwaway cluster with pgque
# preloaded, stopped when the sourcing script exits.
#
#   pgq_pg_config VER        sets PG_CONFIG and BINDIR (from cargo pgrx's config, or
#                            PGQ_PG_CONFIG: a copy of that major's installation)
#   pgq_install VER TAG      builds and installs pgque (profile PGTEST_PROFILE, default
#                            tier) with scripts/install.sh; the log is /tmp/pgque_TAG_install_VER.log
#   pgq_cluster_start DATA PORT [CONF]
#                            initdb in DATA (removed first), the common settings plus the
#                            lines CONF, start; the socket is in DATA; stopped on EXIT.
#                            The cluster is made as users make theirs, not in the C
#                            locale: PGQ_LOCALE picks its default (pgq_initdb_locale)
#   pgq_initdb_locale KIND   initdb's locale options for KIND: libc (the default:
#                            en_US.UTF-8, what initdb gives on most Linux machines), icu
#                            (en-US; Debian's 15 is the build here with ICU), builtin
#                            (C.UTF-8, 17 and later), c
#   as_pg CMD...             runs CMD as the postgres OS user when we are root
#                            (PostgreSQL refuses to run as root)

PGQ_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

pgq_pg_config() {
  # PGQ_PG_CONFIG: another installation of that major (a private copy, so that
  # two people's runs on one machine do not install into each other's server)
  PG_CONFIG=${PGQ_PG_CONFIG:-$(sed -n "s/^pg$1 = \"\(.*\)\"$/\1/p" "${PGRX_HOME:-$HOME/.pgrx}/config.toml")}
  [ -n "$PG_CONFIG" ] || { echo "no pg$1 in ~/.pgrx/config.toml: run scripts/setup.sh" >&2; exit 1; }
  BINDIR=$("$PG_CONFIG" --bindir)
}

pgq_install() {
  local ver=$1 tag=$2 profile=${PGTEST_PROFILE:-tier}
  local log=/tmp/pgque_${tag}_install_$ver.log
  echo "[$tag] installing pgque ($profile) into PostgreSQL $ver"
  bash "$PGQ_ROOT/scripts/install.sh" "$PG_CONFIG" "$ver" "--$profile" >"$log" 2>&1 \
    || { tail -40 "$log"; exit 1; }
}

pgq_initdb_locale() {
  case "$1" in
    libc) echo "--locale=en_US.UTF-8" ;;
    icu) echo "--locale=en_US.UTF-8 --locale-provider=icu --icu-locale=en-US" ;;
    builtin) echo "--locale=en_US.UTF-8 --locale-provider=builtin --builtin-locale=C.UTF-8" ;;
    c) echo "--locale=C" ;;
    *) echo "pgq_initdb_locale: unknown kind '$1' (libc|icu|builtin|c)" >&2; return 2 ;;
  esac
}

pgq_cluster_stop() {
  [ -n "${PGQ_DATA:-}" ] || return 0
  as_pg "$BINDIR/pg_ctl" -D "$PGQ_DATA" -m fast stop >/dev/null 2>&1 \
    || as_pg "$BINDIR/pg_ctl" -D "$PGQ_DATA" -m immediate stop >/dev/null 2>&1 || true
}

pgq_cluster_start() {
  local data=$1 port=$2 conf=${3:-}
  if [ -f "$data/postmaster.pid" ]; then as_pg "$BINDIR/pg_ctl" -D "$data" -m immediate stop >/dev/null 2>&1 || true; fi
  rm -rf "$data"; mkdir -p "$data"
  [ "$(id -u)" = 0 ] && chown postgres "$data"
  local locale_opts
  locale_opts=$(pgq_initdb_locale "${PGQ_LOCALE:-libc}") || exit 2
  # shellcheck disable=SC2086 # the options are words
  as_pg "$BINDIR/initdb" -D "$data" -A trust -U postgres --no-sync $locale_opts >/dev/null
  cat >> "$data/postgresql.conf" <<CONF
port = $port
listen_addresses = ''
unix_socket_directories = '$data'
shared_preload_libraries = 'pgque'
fsync = off
full_page_writes = off
log_line_prefix = '%m [%p] %b %d '
$conf
CONF
  PGQ_DATA=$data
  trap pgq_cluster_stop EXIT
  as_pg "$BINDIR/pg_ctl" -D "$data" -l "$data/server.log" -w start >/dev/null
}
