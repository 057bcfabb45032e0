#!/usr/bin/env bash
# End-to-end job throughput (issue 7): one producer enqueues batches of 100
# while W workers (1, 2) loop { dispatch 100 ; complete_many } for SECS
# seconds, beside a classic FOR UPDATE SKIP LOCKED table with the same
# producer and workers doing claim + DELETE. Reports completed jobs/s and the
# dead tuples left in each table right after the run (autovacuum off during
# the run, so the count is what the run produced).
#
# Usage: benches/jobs_e2e.sh [PGVERSION=17]     Env: SECS (default 15), SKIP_INSTALL=1
set -euo pipefail
VER=${1:-17}
SECS=${SECS:-15}
cd "$(dirname "$0")/.."
PG_CONFIG=$(sed -n "s/^pg$VER = \"\(.*\)\"$/\1/p" "$HOME/.pgrx/config.toml")
BIN=$("$PG_CONFIG" --bindir)
DATA=/tmp/pgque_jobs_e2e_$VER
PORT=$((54300 + VER))
OUT=benches/results/jobs_e2e_$(date -u +%Y%m%d)_pg$VER.md
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  cargo pgrx install --release --pg-config "$PG_CONFIG" --no-default-features --features "pg$VER" >/tmp/pgque_jobs_e2e_install.log 2>&1
fi
[ -f "$DATA/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true
rm -rf "$DATA"; mkdir -p "$DATA"; [ "$(id -u)" = 0 ] && chown postgres "$DATA"
as_pg "$BIN/initdb" -D "$DATA" -A trust -U postgres --no-sync >/dev/null
cat >> "$DATA/postgresql.conf" <<CONF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$DATA'
shared_preload_libraries = 'pgque'
shared_buffers = 512MB
synchronous_commit = off
max_wal_size = 4GB
autovacuum = off
CONF
trap 'as_pg "$BIN/pg_ctl" -D "$DATA" -m fast stop >/dev/null 2>&1 || true' EXIT
as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w start >/dev/null
PSQL=("$BIN/psql" -X -q -At -h "$DATA" -p "$PORT" -U postgres -d bench)
PGB=("$BIN/pgbench" -h "$DATA" -p "$PORT" -U postgres -n)
"$BIN/psql" -X -q -h "$DATA" -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE bench"
"${PSQL[@]}" <<'SQL'
CREATE EXTENSION pgque;
CREATE TABLE skl (id bigserial PRIMARY KEY, priority smallint NOT NULL, run_at timestamptz NOT NULL,
                  state text NOT NULL, args jsonb NOT NULL);
CREATE INDEX skl_ready ON skl (priority, run_at, id) WHERE state = 'ready';
SQL
TMP=$(mktemp -d)
cat > "$TMP/p_pgque.sql" <<'SQL'
SELECT count(*) FROM pgque.enqueue_ready_rows('e2e', array_fill('k'::text, ARRAY[100]), array_fill('{"n": 1}'::jsonb, ARRAY[100]));
SQL
cat > "$TMP/w_pgque.sql" <<'SQL'
SELECT coalesce(array_agg(job_id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS toks FROM pgque.dispatch(ARRAY['e2e'], 100, 'w') \gset
SELECT pgque.complete_many(':ids'::bigint[], ':toks'::bigint[]);
SQL
cat > "$TMP/p_skl.sql" <<'SQL'
INSERT INTO skl (priority, run_at, state, args) SELECT 0, now(), 'ready', a FROM unnest(array_fill('{"n": 1}'::jsonb, ARRAY[100])) a;
SQL
cat > "$TMP/w_skl.sql" <<'SQL'
DELETE FROM skl WHERE id IN (SELECT id FROM skl WHERE state = 'ready' ORDER BY priority, run_at, id LIMIT 100 FOR UPDATE SKIP LOCKED);
SQL
{
echo "# End-to-end job throughput, PostgreSQL $VER"
echo
echo "Command: \`benches/jobs_e2e.sh $VER\` (SECS=$SECS) at $(git rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores shared"
echo "with other builds, release build, synchronous_commit = off, autovacuum off during the run."
echo "One producer (batches of 100) and W workers (dispatch 100 + complete_many; baseline: SKIP LOCKED claim + DELETE of 100)."
echo
echo "| workers | pgque completed jobs/s | SKIP LOCKED completed jobs/s | ratio | pgque dead tuples after run (jobs / job_events / job_actors) | SKIP LOCKED dead tuples |"
echo "|---|---|---|---|---|---|"
} > "$OUT"
for W in 1 2; do
  "${PSQL[@]}" -c "SELECT pgque.drop_job_queue('e2e', true) FROM pgque.job_queues WHERE queue_name = 'e2e'" >/dev/null
  "${PSQL[@]}" -c "SELECT pgque.create_job_queue('e2e'); TRUNCATE pgque.jobs, pgque.job_events, skl; SELECT pg_stat_reset()" >/dev/null
  # pre-fill so workers never starve at the start
  "${PSQL[@]}" -c "SELECT count(*) FROM generate_series(1, 20) c, LATERAL pgque.enqueue_ready_rows('e2e', array_fill(('k' || c)::text, ARRAY[100]), array_fill('{\"n\": 1}'::jsonb, ARRAY[100]))" >/dev/null
  before=$("${PSQL[@]}" -c "SELECT count(*) FROM pgque.jobs WHERE state = 'completed'")
  "${PGB[@]}" -c 1 -j 1 -T "$SECS" -f "$TMP/p_pgque.sql" bench >/dev/null 2>&1 &
  "${PGB[@]}" -c "$W" -j "$W" -T "$SECS" -f "$TMP/w_pgque.sql" bench >/dev/null 2>&1
  wait
  done_pgque=$("${PSQL[@]}" -c "SELECT count(*) FROM pgque.jobs WHERE state = 'completed'")
  sleep 1.2
  dead_pgque=$("${PSQL[@]}" -c "SELECT pg_stat_force_next_flush(); SELECT string_agg(coalesce(n_dead_tup, 0)::text, ' / ' ORDER BY ord) FROM (VALUES (1, 'jobs'), (2, 'job_events'), (3, 'job_actors')) v(ord, rel) LEFT JOIN pg_stat_user_tables s ON s.schemaname = 'pgque' AND s.relname = v.rel" | tail -1)
  "${PSQL[@]}" -c "INSERT INTO skl (priority, run_at, state, args) SELECT 0, now(), 'ready', '{\"n\": 1}' FROM generate_series(1, 2000)" >/dev/null
  "${PSQL[@]}" -c "SELECT pg_stat_reset()" >/dev/null
  "${PGB[@]}" -c 1 -j 1 -T "$SECS" -f "$TMP/p_skl.sql" bench >/dev/null 2>&1 &
  out=$("${PGB[@]}" -c "$W" -j "$W" -T "$SECS" -f "$TMP/w_skl.sql" bench 2>/dev/null)
  wait
  sleep 1.2
  del_skl=$("${PSQL[@]}" -c "SELECT pg_stat_force_next_flush(); SELECT n_tup_del FROM pg_stat_user_tables WHERE relname = 'skl'" | tail -1)
  dead_skl=$("${PSQL[@]}" -c "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'skl'")
  rp=$(python3 -c "print(round(($done_pgque - $before) / $SECS))")
  rs=$(python3 -c "print(round($del_skl / $SECS))")
  ratio=$(python3 -c "print(f'{$rp / max($rs, 1):.2f}')")
  echo "| $W | $rp | $rs | $ratio | $dead_pgque | $dead_skl |" >> "$OUT"
  echo "workers=$W: pgque $rp jobs/s, SKIP LOCKED $rs jobs/s ($ratio); dead $dead_pgque vs $dead_skl"
done
echo "wrote $OUT"
