#!/usr/bin/env bash
# Job-queue benchmarks (issues 6 and 7), one run on one server:
#   1. enqueue throughput: pgque.enqueue_ready_rows at batch 1/10/100/1000 with
#      1 and 2 producers, beside a plain multi-row INSERT of the same rows into
#      a plain table (the physical reference), and statements per call from
#      pg_stat_statements (track = all, so statements inside the function count);
#   2. dispatch latency at ready depths 1k/10k/50k/200k, strict_fifo and
#      round_robin, custom and forced-generic plans, beside a classic
#      FOR UPDATE SKIP LOCKED claim on an equally deep plain table. Each
#      dispatch runs in a rolled-back transaction so the depth stays put.
#
# Usage: benches/jobs_bench.sh [PGVERSION=17]   (installs pgque --release)
# Writes benches/results/jobs_<date>_pg<ver>.md. Env: SECS (per enqueue cell,
# default 8), TXNS (dispatch calls per cell, default 300).
set -euo pipefail
VER=${1:-17}
SECS=${SECS:-8}
TXNS=${TXNS:-300}
cd "$(dirname "$0")/.."
PG_CONFIG=$(sed -n "s/^pg$VER = \"\(.*\)\"$/\1/p" "$HOME/.pgrx/config.toml")
BIN=$("$PG_CONFIG" --bindir)
DATA=/tmp/pgque_jobs_bench_$VER
PORT=$((54200 + VER))
OUT=benches/results/jobs_$(date -u +%Y%m%d)_pg$VER.md
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  cargo pgrx install --release --pg-config "$PG_CONFIG" --no-default-features --features "pg$VER" >/tmp/pgque_jobs_bench_install.log 2>&1
fi
[ -f "$DATA/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true
rm -rf "$DATA"; mkdir -p "$DATA"; [ "$(id -u)" = 0 ] && chown postgres "$DATA"
as_pg "$BIN/initdb" -D "$DATA" -A trust -U postgres --no-sync >/dev/null
cat >> "$DATA/postgresql.conf" <<CONF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$DATA'
shared_preload_libraries = 'pgque,pg_stat_statements'
pg_stat_statements.track = all
shared_buffers = 512MB
synchronous_commit = off
max_wal_size = 4GB
CONF
trap 'as_pg "$BIN/pg_ctl" -D "$DATA" -m fast stop >/dev/null 2>&1 || true' EXIT
as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w start >/dev/null
PSQL=("$BIN/psql" -X -q -At -h "$DATA" -p "$PORT" -U postgres -d bench)
PGB=("$BIN/pgbench" -h "$DATA" -p "$PORT" -U postgres -n)
"$BIN/psql" -X -q -h "$DATA" -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE bench"
"${PSQL[@]}" <<'SQL'
CREATE EXTENSION pgque;
CREATE EXTENSION pg_stat_statements;
SELECT pgque.create_job_queue('bench');
-- the physical reference: the same columns, a bigserial key, nothing else
CREATE TABLE plain_jobs (id bigserial PRIMARY KEY, queue text, kind text, args jsonb,
    priority smallint, run_at timestamptz, state text);
SQL
TMP=$(mktemp -d)
{
echo "# Job-queue benchmarks, PostgreSQL $VER"
echo
echo "Command: \`benches/jobs_bench.sh $VER\` (SECS=$SECS, TXNS=$TXNS), $(date -u "+%Y-%m-%d %H:%M UTC"), at commit $(git rev-parse --short HEAD),"
echo "$(nproc) cores shared with other builds, release build, synchronous_commit = off, args '{\"n\": 1}'."
echo
echo "## Enqueue throughput (jobs/s)"
echo
echo "| batch | producers | enqueue_ready_rows | plain INSERT | ratio | statements per call |"
echo "|---|---|---|---|---|---|"
} > "$OUT"
for B in 1 10 100 1000; do
  cat > "$TMP/enq.sql" <<SQL
SELECT count(*) FROM pgque.enqueue_ready_rows('bench', array_fill('k'::text, ARRAY[$B]), array_fill('{"n": 1}'::jsonb, ARRAY[$B]));
SQL
  cat > "$TMP/plain.sql" <<SQL
INSERT INTO plain_jobs (queue, kind, args, priority, run_at, state) SELECT 'bench', k, a, 0, now(), 'ready' FROM unnest(array_fill('k'::text, ARRAY[$B]), array_fill('{"n": 1}'::jsonb, ARRAY[$B])) AS t(k, a);
SQL
  for C in 1 2; do
    "${PSQL[@]}" -c "TRUNCATE pgque.jobs, pgque.job_events, plain_jobs; CHECKPOINT; SELECT pg_stat_statements_reset()" >/dev/null
    tps_e=$("${PGB[@]}" -c "$C" -j "$C" -T "$SECS" -f "$TMP/enq.sql" bench 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    stmts=$("${PSQL[@]}" -c "SELECT round(sum(calls) FILTER (WHERE toplevel = false AND query NOT LIKE '%pg_stat_statements%')::numeric
                                    / nullif(sum(calls) FILTER (WHERE toplevel AND query LIKE '%enqueue_ready_rows%'), 0), 2)
                             FROM pg_stat_statements")
    "${PSQL[@]}" -c "TRUNCATE pgque.jobs, pgque.job_events, plain_jobs; CHECKPOINT" >/dev/null
    tps_p=$("${PGB[@]}" -c "$C" -j "$C" -T "$SECS" -f "$TMP/plain.sql" bench 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    je=$(python3 -c "print(round($tps_e*$B))"); jp=$(python3 -c "print(round($tps_p*$B))")
    ratio=$(python3 -c "print(f'{$tps_e/$tps_p:.2f}')")
    echo "| $B | $C | $je | $jp | $ratio | $stmts |" >> "$OUT"
    echo "enqueue batch=$B producers=$C: $je vs $jp jobs/s ($ratio), $stmts statements/call"
  done
done

# ---- dispatch latency vs depth ----------------------------------------------
"${PSQL[@]}" <<'SQL'
TRUNCATE pgque.jobs, pgque.job_events;
SELECT pgque.create_job_queue('rrbench', 'round_robin');
CREATE TABLE skl (id bigserial PRIMARY KEY, priority smallint NOT NULL, run_at timestamptz NOT NULL,
                  state text NOT NULL, args jsonb NOT NULL);
CREATE INDEX skl_ready ON skl (priority, run_at, id) WHERE state = 'ready';
SQL
{
echo
echo "## Dispatch latency (ms per call, limit 50, rolled back so the depth stays)"
echo
echo "Columns \"session custom/generic\": the session's plan_cache_mode (force_custom_plan / force_generic_plan). pgque.dispatch plans its statement generically in both (it sets force_generic_plan for its own statement), so the pair shows that a session setting cannot change its plan; the SKIP LOCKED baseline runs under the default."
echo
echo "| ready depth | strict_fifo session custom p50 / p95 | strict_fifo session generic p50 / p95 | round_robin session custom p50 / p95 | round_robin session generic p50 / p95 | SKIP LOCKED p50 / p95 |"
echo "|---|---|---|---|---|---|"
} >> "$OUT"
cat > "$TMP/d_fifo.sql" <<'SQL'
BEGIN;
SELECT count(*) FROM pgque.dispatch(ARRAY['bench'], 50, 'w');
ROLLBACK;
SQL
cat > "$TMP/d_rr.sql" <<'SQL'
BEGIN;
SELECT count(*) FROM pgque.dispatch(ARRAY['rrbench'], 50, 'w');
ROLLBACK;
SQL
cat > "$TMP/d_skl.sql" <<'SQL'
BEGIN;
UPDATE skl SET state = 'running' WHERE id IN (SELECT id FROM skl WHERE state = 'ready' ORDER BY priority, run_at, id LIMIT 50 FOR UPDATE SKIP LOCKED) RETURNING id;
ROLLBACK;
SQL
pct() { # pgbench log -> "p50 / p95" of the transaction latency in ms
  python3 - "$@" <<'PY'
import sys, glob
lat = []
for f in glob.glob(sys.argv[1] + '*'):
    for line in open(f):
        p = line.split()
        lat.append(int(p[2]) / 1000.0)
lat.sort()
q = lambda x: lat[min(len(lat) - 1, int(x * len(lat)))]
print(f"{q(0.50):.2f} / {q(0.95):.2f}")
PY
}
have=0
for D in 1000 10000 50000 200000; do
  add=$((D - have))
  "${PSQL[@]}" <<SQL
SELECT count(*) FROM generate_series(1, $add / 10000 + 1) c,
  LATERAL pgque.enqueue_ready_rows('bench', array_fill('k'::text, ARRAY[least(10000, $add - (c - 1) * 10000)]),
                                   array_fill('{"n": 1}'::jsonb, ARRAY[least(10000, $add - (c - 1) * 10000)]))
WHERE $add - (c - 1) * 10000 > 0;
SELECT count(*) FROM generate_series(1, $add / 10000 + 1) c,
  LATERAL pgque.enqueue_ready_rows('rrbench', array_fill('k'::text, ARRAY[least(10000, $add - (c - 1) * 10000)]),
                                   array_fill('{"n": 1}'::jsonb, ARRAY[least(10000, $add - (c - 1) * 10000)]),
                                   fairness_keys => (SELECT array_agg('f' || (i % 500)) FROM generate_series(1, least(10000, $add - (c - 1) * 10000)) i))
WHERE $add - (c - 1) * 10000 > 0;
INSERT INTO skl (priority, run_at, state, args) SELECT 0, now(), 'ready', '{"n": 1}' FROM generate_series(1, $add);
VACUUM ANALYZE pgque.jobs; VACUUM ANALYZE skl;
SQL
  have=$D
  row="| $D"
  for s in d_fifo d_rr; do
    for mode in force_custom_plan force_generic_plan; do
      rm -f "$TMP"/log_*
      (cd "$TMP" && PGOPTIONS="-c plan_cache_mode=$mode" "${PGB[@]}" -c 1 -t "$TXNS" -f "$TMP/$s.sql" -l --log-prefix="$TMP/log_" bench >/dev/null 2>&1)
      row="$row | $(pct "$TMP/log_")"
    done
  done
  rm -f "$TMP"/log_*
  (cd "$TMP" && "${PGB[@]}" -c 1 -t "$TXNS" -f "$TMP/d_skl.sql" -l --log-prefix="$TMP/log_" bench >/dev/null 2>&1)
  row="$row | $(pct "$TMP/log_") |"
  echo "$row" >> "$OUT"
  echo "dispatch depth $D: $row"
done
echo >> "$OUT"
echo "Latencies are whole pgbench transactions (BEGIN; dispatch; ROLLBACK) from the client." >> "$OUT"
echo "wrote $OUT"
