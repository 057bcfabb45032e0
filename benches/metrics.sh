#!/usr/bin/env bash
# What one scrape of pgque.metrics() costs on a database with a deep backlog
# and a long history: 1M events pending for a consumer, 1M completed log
# jobs (enqueued 1000 per call, dispatched and completed 1000 per call, as a
# batching worker does), plus the status functions it reads as references
# measured in the same run. Prints a Markdown table (benches/results/metrics.md).
#
#   hx NAME bash benches/metrics.sh [PGVERSION]     # release build, ~10 minutes
#
# Env: EVENTS (1000000), JOBS (1000000), SECONDS_PER (15: pgbench time per
# statement), SLOTS (0: also a partitioned consumer with that many slots),
# KEEP=1 (leave the cluster running).
set -euo pipefail
VER=${1:-15}
cd "$(dirname "$0")/.."
ROOT=$(pwd)
EVENTS=${EVENTS:-1000000}
JOBS=${JOBS:-1000000}
SECONDS_PER=${SECONDS_PER:-15}
SLOTS=${SLOTS:-0}
PG_CONFIG=$(sed -n "s/^pg$VER = \"\(.*\)\"$/\1/p" "${PGRX_HOME:-$HOME/.pgrx}/config.toml")
BINDIR=$("$PG_CONFIG" --bindir)
bash "$ROOT/scripts/install.sh" "$PG_CONFIG" "$VER" --release >/tmp/pgque_metrics_bench_install.log 2>&1 \
  || { tail -30 /tmp/pgque_metrics_bench_install.log; exit 1; }
DATA=/tmp/pgque_metrics_bench
PORT=54299
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ -f "$DATA/postmaster.pid" ] && as_pg "$BINDIR/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true
rm -rf "$DATA"; mkdir -p "$DATA"; [ "$(id -u)" = 0 ] && chown postgres "$DATA"
as_pg "$BINDIR/initdb" -D "$DATA" -A trust -U postgres --no-sync >/dev/null
cat >> "$DATA/postgresql.conf" <<CONF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$DATA'
shared_preload_libraries = 'pgque'
shared_buffers = 512MB
synchronous_commit = off
fsync = off
full_page_writes = off
max_wal_size = 8GB
CONF
# KEEP=1 leaves the filled cluster running (socket $DATA, port 54299) to look into.
[ "${KEEP:-0}" = 1 ] || trap 'as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast stop >/dev/null 2>&1 || true' EXIT
as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w start >/dev/null
PSQL=("$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$DATA" -p "$PORT" -U postgres)
"${PSQL[@]}" -d postgres -c "CREATE DATABASE bench"
P=("${PSQL[@]}" -d bench)
"${P[@]}" -c "CREATE EXTENSION pgque"
"${P[@]}" -c "SELECT pgque.create_queue('bq'); SELECT pgque.subscribe('bq', 'reader')"
[ "$SLOTS" -gt 0 ] && "${P[@]}" -c "SELECT pgque.subscribe_partitioned('bq', 'keyed', $SLOTS)"
"${P[@]}" -c "SELECT pgque.create_job_queue('bj')"
t0=$(date +%s)
echo "filling: $EVENTS events" >&2
# keyed events (a key per event), so a partitioned consumer has them spread over its slots
for _ in $(seq 1 $((EVENTS / 10000))); do
  echo "SELECT count(*) FROM (SELECT unnest(pgque.send_batch('bq', 'e', array_agg('{\"n\":' || g || '}'), array_agg('key' || g))) FROM generate_series(1, 10000) g) x;"
done | "${P[@]}" >/dev/null
echo "filling: $JOBS jobs enqueued, dispatched and completed 1000 per call" >&2
for _ in $(seq 1 $((JOBS / 1000))); do
  echo "SELECT count(*) FROM pgque.enqueue_ready_rows('bj', array_fill('k'::text, ARRAY[1000]), array_fill('{\"a\":1}'::jsonb, ARRAY[1000]));"
done | "${P[@]}" >/dev/null
for _ in $(seq 1 $((JOBS / 1000))); do
  echo "SELECT pgque.complete_many(array_agg(job_id), array_agg(lease_token)) FROM pgque.dispatch(ARRAY['bj'], 1000, 'w', '1 hour');"
done | "${P[@]}" >/dev/null
"${P[@]}" -c "SELECT pgque.ticker()" >/dev/null
"${P[@]}" -c "VACUUM ANALYZE" >/dev/null
echo "filled in $(( $(date +%s) - t0 )) s" >&2
"${P[@]}" -At -c "SELECT 'check: consumer pending ' || value FROM pgque.metrics() WHERE name = 'pgque_consumer_pending_events' AND labels->>'consumer' = 'reader'
                  UNION ALL SELECT 'check: completed jobs ' || value FROM pgque.metrics() WHERE name = 'pgque_jobs' AND labels = '{\"queue\":\"bj\",\"state\":\"completed\"}'
                  UNION ALL SELECT 'check: rows ' || count(*) FROM pgque.metrics()" >&2

bench() { # label sql
  local f; f=$(mktemp); echo "$2" > "$f"; chmod a+r "$f"
  local lat
  lat=$("$BINDIR/pgbench" -n -h "$DATA" -p "$PORT" -U postgres -T "$SECONDS_PER" -c 1 -f "$f" bench 2>/dev/null \
        | sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p')
  rm -f "$f"
  printf '| %s | %s |\n' "$1" "$lat"
}
echo "| statement (1 client, $SECONDS_PER s each) | mean latency, ms |"
echo "|---|---|"
# Every column is fetched: count(*) over a view lets the planner drop the
# columns it does not need (job_queue_status's completed count among them).
bench 'SELECT * FROM pgque.metrics()' 'SELECT * FROM pgque.metrics();'
bench 'reference: SELECT * FROM pgque.get_consumer_info()' 'SELECT * FROM pgque.get_consumer_info();'
bench 'reference: SELECT * FROM pgque.get_queue_info()' 'SELECT * FROM pgque.get_queue_info();'
bench 'reference: SELECT * FROM pgque.job_queue_status' 'SELECT * FROM pgque.job_queue_status;'
bench 'reference: SELECT count(*) FROM pgque.job_queue_status' 'SELECT count(*) FROM pgque.job_queue_status;'
bench 'reference: SELECT * FROM pgque.status()' 'SELECT * FROM pgque.status();'
[ "$SLOTS" -gt 0 ] && bench "reference: SELECT * FROM pgque.partition_slot_status ($SLOTS slots)" 'SELECT * FROM pgque.partition_slot_status;'
exit 0
