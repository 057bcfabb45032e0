#!/usr/bin/env bash
# The event browser page of pgque-web (GET /events/q/<queue>, and /events, whose
# dead letters preview reads the newest five of each queue) with N events
# waiting and D dead letters: seeds a fresh database, then times the page's
# first page, a page deep in the waiting events (after_txid/after_id = the
# middle) and a page deep in the dead letters (dl_before = the middle)
# through a running pgque-web, and prints the buffers each browse function
# reads (EXPLAIN ANALYZE BUFFERS of its call: the machine-independent cost).
#
#   benches/dashboard/event_page_bench.sh PSQL_HOST PSQL_PORT N D [ROUNDS]
#
# PSQL_HOST/PORT: a PostgreSQL with pgque installed and preloaded (superuser
# postgres, trust); a database evb_<N>_<D> is (re)created there. Seeding goes
# through pgque's own API: queue `big` (consumer `lag`, which never reads, so
# all N events wait) gets N events by send_batch of 10,000, with a table
# rotation (maint_rotate_tables_step1 after a zero rotation period) after
# every tenth of them, so they lie across the queue's event tables; queue
# `dl` (max_retries 0, consumer `c`) gets D events that are received and
# nacked in batches of 10,000, each a dead letter. Prints one table row per
# page: median and p90 ms of ROUNDS (default 20) requests. SEED=0 reuses the
# database seeded before. Needs target/debug/pgque-web (cargo build -p
# pgque-web).
set -euo pipefail
HOST=${1:?host}; PORT=${2:?port}; N=${3:?events}; D=${4:?dead letters}; ROUNDS=${5:-20}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WEB_BIN=${WEB_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/pgque-web}
DB=evb_${N}_${D}
P=(psql -h "$HOST" -p "$PORT" -U postgres -v ON_ERROR_STOP=1 -qAt)
BATCH=10000
if [ "${SEED:-1}" != 0 ]; then
  "${P[@]}" -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
  "${P[@]}" -d "$DB" -c "CREATE EXTENSION pgque" \
    -c "SELECT pgque.create_queue('big')" -c "SELECT pgque.subscribe('big', 'lag')" \
    -c "SELECT pgque.create_queue('dl')" -c "SELECT pgque.set_queue_config('dl', 'max_retries', '0')" \
    -c "SELECT pgque.subscribe('dl', 'c')" >/dev/null
  t0=$(date +%s.%N)
  left=$N; step=$(( N / 10 > BATCH ? N / 10 : BATCH )); since=0
  while [ "$left" -gt 0 ]; do
    b=$(( left < BATCH ? left : BATCH ))
    "${P[@]}" -d "$DB" -c "SELECT pgque.send_batch('big', 'order',
        (SELECT array_agg(jsonb_build_object('n', g, 'sku', 'sku-' || (g % 977))::text)
           FROM generate_series(1, $b) g))" >/dev/null
    left=$(( left - b )); since=$(( since + b ))
    if [ "$since" -ge "$step" ] && [ "$left" -gt 0 ]; then
      "${P[@]}" -d "$DB" -c "SELECT pgque.ticker()" \
        -c "UPDATE pgque.queue SET queue_rotation_period = '0', queue_switch_time = now() - interval '1 hour' WHERE queue_name = 'big'" \
        -c "SELECT pgque.maint_rotate_tables_step1('big')" >/dev/null
      since=0
    fi
  done
  left=$D
  while [ "$left" -gt 0 ]; do
    b=$(( left < BATCH ? left : BATCH ))
    "${P[@]}" -d "$DB" -c "SELECT pgque.send_batch('dl', 'mail',
        (SELECT array_agg(jsonb_build_object('to', 'user' || g || '@example.test')::text)
           FROM generate_series(1, $b) g))" -c "SELECT pgque.ticker()" >/dev/null
    "${P[@]}" -d "$DB" -c "SELECT pgque.ack(max(x.batch_id)) FROM (
        SELECT pgque.nack(m.batch_id, m, '0 seconds', 'smtp down'), m.batch_id
          FROM pgque.receive('dl', 'c', $BATCH) m) x" >/dev/null
    left=$(( left - b ))
  done
  "${P[@]}" -d "$DB" -c "UPDATE pgque.queue SET queue_rotation_period = '1 hour' WHERE queue_name = 'big'" \
    -c "SELECT pgque.ticker()" -c "VACUUM ANALYZE" >/dev/null
  t1=$(date +%s.%N)
  printf 'seeded %s waiting events and %s dead letters in %.1f s\n' "$N" "$D" "$(echo "$t1 - $t0" | bc)"
fi
# where the events lie, and how many dead letters there are
"${P[@]}" -d "$DB" -c "SELECT 'event tables of big: ' || string_agg(t || '=' || n, ' ') FROM (
    SELECT c.relname AS t, c.reltuples::bigint AS n FROM pg_class c
     WHERE c.relnamespace = 'pgque'::regnamespace
       AND c.relname LIKE 'event\_' || (SELECT queue_id FROM pgque.queue WHERE queue_name = 'big') || '\_%'
       AND c.relkind = 'r' ORDER BY 1) x" \
  -c "SELECT 'dead letters of dl: ' || count(*) FROM pgque.browse_dead_letters('dl', NULL, 1000)"
DL_MID=$("${P[@]}" -d "$DB" -c "SELECT (min(dl_id) + max(dl_id)) / 2 FROM pgque.dead_letter_store")
# a cursor in the middle of the waiting events: the (txid, id) of the event
# N/2 events after the first (ids of one queue increase with send order here)
MID=$("${P[@]}" -d "$DB" -c "SELECT e.ev_txid || ' ' || e.ev_id FROM pgque.browse_events('big', NULL, NULL, NULL, 1) e")
read -r _ MID0 <<<"$MID"
MID_ID=$(( MID0 + N / 2 ))
QID=$("${P[@]}" -d "$DB" -c "SELECT queue_id FROM pgque.queue WHERE queue_name = 'big'")
MTX=$("${P[@]}" -d "$DB" -c "SELECT e.ev_txid::text FROM pgque.event_$QID e WHERE e.ev_id = $MID_ID")
TOKEN=bench-admin-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
WPORT=$(( 20000 + RANDOM % 20000 ))
PGQUE_WEB_READ_TOKEN=$TOKEN "$WEB_BIN" --database-url \
  "host=$HOST port=$PORT user=postgres dbname=$DB" --read-only --listen 127.0.0.1:$WPORT >/tmp/event_page_bench_web.log 2>&1 &
WEB=$!
trap 'kill $WEB 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$WPORT/healthz" >/dev/null && break; sleep 0.1; done
CK=$(curl -s -i -X POST -H "Origin: http://127.0.0.1:$WPORT" --data "secret=$TOKEN&next=/" \
  "http://127.0.0.1:$WPORT/login" | sed -n 's/^[Ss]et-[Cc]ookie: \([^;]*\);.*/\1/p')
echo "| page | median / p90 ms | rows shown |"
echo "|---|---|---|"
for url in "/events" "/events/q/big" "/events/q/big?after_txid=$MTX&after_id=$MID_ID" "/events/q/dl" "/events/q/dl?dl_before=$DL_MID"; do
  ts=()
  for _ in $(seq "$ROUNDS"); do
    ts+=("$(curl -s -o /tmp/event_page_bench_page.html -w '%{time_total}' -b "$CK" "http://127.0.0.1:$WPORT$url")")
  done
  n=$(grep -o 'data-ev="\|data-dl="' /tmp/event_page_bench_page.html | wc -l || true)
  echo "| \`$url\` | $(printf '%s\n' "${ts[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.1f / %.1f", a[int((NR+1)/2)]*1000, a[int(NR*0.9+0.5)]*1000}') | $n |"
done
# buffers of each browse call (second call of the session: the first also
# compiles the function)
for call in "pgque.browse_events('big', NULL, NULL, NULL, 50)" \
            "pgque.browse_events('big', NULL, $MTX, $MID_ID, 50)" \
            "pgque.browse_dead_letters('dl', NULL, 50)" \
            "pgque.browse_dead_letters('dl', $DL_MID, 50)"; do
  b=$("${P[@]}" -d "$DB" -c "SELECT count(*) FROM $call" \
        -c "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM $call" \
      | python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("["):]); p=j[0]["Plan"]; print(p.get("Shared Hit Blocks",0)+p.get("Shared Read Blocks",0))')
  echo "buffers: $call = $b"
done
