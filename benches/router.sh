#!/usr/bin/env bash
# The cost of the router hop (docs/scale-out.md): one keyed send per
# transaction through the PL/Proxy router vs the same send straight to a
# shard, same machine, same run. Needs the cluster of `make cluster` (this
# script starts it if it is down, without rebuilding when
# PGQUE_CLUSTER_NOBUILD=1). pgbench, 1 client, alternating router / direct
# cells so that machine noise hits both alike; prints a Markdown table.
#
#   bash benches/router.sh                 # 5 rounds of 10 s cells
#   ROUNDS=3 SECONDS_PER=5 bash benches/router.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
ROUNDS=${ROUNDS:-5}
SECONDS_PER=${SECONDS_PER:-10}
PG_CONFIG=$(sed -n "s/^pg15 = \"\(.*\)\"$/\1/p" "${PGRX_HOME:-$HOME/.pgrx}/config.toml")
BINDIR=$("$PG_CONFIG" --bindir)
SOCK=/tmp/pgque_cluster
ROUTER=55460
SHARD0=55461

if ! "$BINDIR/pg_isready" -q -h "$SOCK" -p "$ROUTER"; then
  bash "$ROOT/scripts/cluster.sh" start >/dev/null
fi
psql_at() { "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCK" -p "$1" -U postgres -d pgque "${@:2}"; }
psql_at "$ROUTER" -Atc "SELECT pgque.create_queue('bench_hop')" >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/send.sql" <<'SQL'
\set k random(1, 1000)
SELECT pgque.send('bench_hop', 'b', '{"n": 1}'::jsonb, 'key-' || :k);
SQL
# 'key-<n>' for n in 1..1000 spans both shards through the router; the
# direct cell sends the same statement to shard 0 (a shard takes any key).

cell() { # PORT → "tps latency_ms"
  "$BINDIR/pgbench" -n -h "$SOCK" -p "$1" -U postgres -c 1 -T "$SECONDS_PER" -f "$work/send.sql" pgque 2>/dev/null \
    | awk '/^latency average/ { lat = $4 } /^tps/ { tps = $3 } END { printf "%.0f %.3f\n", tps, lat }'
}

echo "| round | router tps | router ms | direct tps | direct ms | router/direct latency |"
echo "|---|---|---|---|---|---|"
rl=(); dl=()
for r in $(seq 1 "$ROUNDS"); do
  read -r rt rlat < <(cell "$ROUTER")
  read -r dt dlat < <(cell "$SHARD0")
  rl+=("$rlat"); dl+=("$dlat")
  echo "| $r | $rt | $rlat | $dt | $dlat | $(awk -v a="$rlat" -v b="$dlat" 'BEGIN { printf "%.2f", a / b }') |"
done
med() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
mr=$(med "${rl[@]}"); md=$(med "${dl[@]}")
echo
echo "median latency: router $mr ms, direct $md ms, ratio $(awk -v a="$mr" -v b="$md" 'BEGIN { printf "%.2f", a / b }'), hop cost $(awk -v a="$mr" -v b="$md" 'BEGIN { printf "%.3f", a - b }') ms"
