#!/usr/bin/env bash
# The jobs list page of pgque-web with N completed jobs in the job log:
# seeds a fresh database, then times GET /jobs/list for each filter kind
# (first page and a deep page) through a running pgque-web, and dumps the
# plans of list_jobs' statements (auto_explain of nested statements).
#
#   benches/dashboard/dashboard_bench.sh PSQL_HOST PSQL_PORT N [ROUNDS]
#
# PSQL_HOST/PORT: a PostgreSQL with pgque installed and preloaded (superuser
# postgres, trust); a database dash_<N> is (re)created there. Seeding is the
# fastest honest way through pgque's own API: enqueue_ready_rows of BATCH
# (default 1,000) jobs per call (one log row per 256), dispatch BATCH and
# complete_many them, round after round (a page reads the claims of its
# jobs, so the same BATCH keeps runs of different N comparable); then 100 failed jobs (pgque.jobs) and 1,000
# ready ones on top, and (unless SIDE=0) N completed jobs in pgque.jobs
# (queue side, pgque.job_log = off). Prints one line per filter: median and p90 ms of ROUNDS
# (default 20) requests. SEED=0 reuses the database seeded before. Needs target/debug/pgque-web (cargo build -p pgque-web).
set -euo pipefail
HOST=${1:?host}; PORT=${2:?port}; N=${3:?jobs}; ROUNDS=${4:-20}
BATCH=${BATCH:-1000}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DB=dash_$N
P=(psql -h "$HOST" -p "$PORT" -U postgres -v ON_ERROR_STOP=1 -qAt)
if [ "${SEED:-1}" != 0 ]; then
"${P[@]}" -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
"${P[@]}" -d "$DB" -c "CREATE EXTENSION pgque" -c "SELECT pgque.create_job_queue('bench')" \
  -c "SELECT pgque.create_job_queue('side')" >/dev/null
t0=$(date +%s.%N)
left=$N
while [ "$left" -gt 0 ]; do
  b=$(( left < BATCH ? left : BATCH ))
  "${P[@]}" -d "$DB" -c "SELECT count(*) FROM pgque.enqueue_ready_rows('bench',
        (SELECT array_agg(CASE WHEN g % 2 = 0 THEN 'mail' ELSE 'resize' END)
           FROM generate_series($N - $left + 1, $N - $left + $b) g),
        (SELECT array_agg(jsonb_build_object('n', g, 'to', 'user' || g || '@example.test'))
           FROM generate_series($N - $left + 1, $N - $left + $b) g))" \
    -c "SELECT pgque.complete_many(array_agg(d.job_id), array_agg(d.lease_token))
          FROM pgque.dispatch(ARRAY['bench'], $b, 'seed', '1 hour') d" >/dev/null
  left=$(( left - b ))
done
t1=$(date +%s.%N)
# The same number of completed jobs in pgque.jobs (pgque.job_log = off: the
# store of jobs that leave the log), queue `side`, unless SIDE=0.
if [ "${SIDE:-1}" != 0 ]; then
  left=$N
  while [ "$left" -gt 0 ]; do
    b=$(( left < BATCH ? left : BATCH ))
    "${P[@]}" -d "$DB" -c "SET pgque.job_log = off" -c "SELECT count(*) FROM pgque.enqueue_ready_rows('side',
          (SELECT array_agg(CASE WHEN g % 2 = 0 THEN 'mail' ELSE 'resize' END)
           FROM generate_series($N - $left + 1, $N - $left + $b) g),
          (SELECT array_agg(jsonb_build_object('n', g, 'to', 'user' || g || '@example.test'))
             FROM generate_series($N - $left + 1, $N - $left + $b) g))" \
      -c "SELECT pgque.complete_many(array_agg(d.job_id), array_agg(d.lease_token))
            FROM pgque.dispatch(ARRAY['side'], $b, 'seed', '1 hour') d" >/dev/null
    left=$(( left - b ))
  done
fi
t2=$(date +%s.%N)
"${P[@]}" -d "$DB" -c "SELECT count(pgque.enqueue('bench', 'mail', jsonb_build_object('n', g), max_attempts => 1)) FROM generate_series(1, 100) g" \
  -c "SELECT count(pgque.fail(d.job_id, d.lease_token, 'smtp timeout ' || d.job_id)) FROM pgque.dispatch(ARRAY['bench'], 100, 'seed', '1 hour') d" \
  -c "SELECT count(*) FROM pgque.enqueue_ready_rows('bench', pg_catalog.array_fill('mail'::text, ARRAY[1000]),
        (SELECT array_agg(jsonb_build_object('n', g)) FROM generate_series(1, 1000) g))" \
  -c "VACUUM ANALYZE" >/dev/null
printf 'seeded %s completed jobs in the job log in %.1f s, %s in pgque.jobs in %.1f s\n' "$N" "$(echo "$t1 - $t0" | bc)" \
  "$([ "${SIDE:-1}" != 0 ] && echo "$N" || echo 0)" "$(echo "$t2 - $t1" | bc)"
fi
"${P[@]}" -d "$DB" -c "SELECT 'job_queue_status: ' || string_agg(queue_name || ' ready=' || ready || ' completed=' || completed || ' failed=' || failed, '; ') FROM pgque.job_queue_status"
MID=$("${P[@]}" -d "$DB" -c "SELECT (min(id_lo) + max(id_hi)) / 2 FROM pgque.job_log")

TOKEN=bench-admin-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
WPORT=$(( 20000 + RANDOM % 20000 ))
PGQUE_WEB_ADMIN_TOKEN=$TOKEN "$ROOT/target/debug/pgque-web" --database-url \
  "host=$HOST port=$PORT user=postgres dbname=$DB" --listen 127.0.0.1:$WPORT >/tmp/dashboard_bench_web.log 2>&1 &
WEB=$!
trap 'kill $WEB 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$WPORT/healthz" >/dev/null && break; sleep 0.1; done
CK=$(curl -s -i -X POST -H "Origin: http://127.0.0.1:$WPORT" --data "secret=$TOKEN&next=/" \
  "http://127.0.0.1:$WPORT/login" | sed -n 's/^[Ss]et-[Cc]ookie: \([^;]*\);.*/\1/p')
echo "| filter | first page median / p90 ms | deep page (before=$MID) median / p90 ms | rows |"
echo "|---|---|---|---|"
for f in "" "queue=bench" "queue=side" "state=completed" "queue=bench&state=completed" \
         "queue=side&state=completed" "state=failed" "queue=bench&state=ready" "state=running" \
         "kind=resize" "queue=side&kind=resize" "q=user4242" "q=smtp+timeout"; do
  row="| \`${f:-none}\` |"
  for deep in "" "before=$MID"; do
    url="/jobs/list?$f${deep:+&$deep}"
    ts=()
    for _ in $(seq "$ROUNDS"); do
      ts+=("$(curl -s -o /tmp/dashboard_bench_page.html -w '%{time_total}' -b "$CK" "http://127.0.0.1:$WPORT$url")")
    done
    row+=" $(printf '%s\n' "${ts[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.1f / %.1f", a[int((NR+1)/2)]*1000, a[int(NR*0.9+0.5)]*1000}') |"
    [ -z "$deep" ] && n=$(grep -o 'data-job="' /tmp/dashboard_bench_page.html | wc -l || true)
  done
  echo "$row $n |"
done
# The plans of list_jobs' inner statements for a few filters (auto_explain).
PLANS=/tmp/dashboard_bench_plans_$N.txt
: >"$PLANS"
for args in "NULL, NULL" "'bench', NULL" "'side', NULL" "'bench', 'completed'" "'side', 'completed'" \
            "NULL, 'completed'" "NULL, 'failed'" "'bench', 'ready'" "NULL, 'running'"; do
  echo "==== list_jobs($args, NULL, NULL, NULL, 50)" >>"$PLANS"
  "${P[@]}" -d "$DB" 2>>"$PLANS" >/dev/null <<SQL
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_analyze = on;
SET auto_explain.log_buffers = on;
SET auto_explain.log_level = notice;
SET client_min_messages = notice;
SELECT count(*) FROM pgque.list_jobs($args, NULL, NULL, NULL, 50);
SQL
done
echo "plans: $PLANS"
