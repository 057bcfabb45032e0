#!/usr/bin/env bash
# Dispatch p50 with a rate limit vs without (issue 18, target <= 1.2x), on a
# scratch PostgreSQL 15 cluster with the installed pgque (port 55611, worker
# stopped). Four queues, each with a backlog of N ready jobs:
#   free / limited        ordinary jobs: the job log's one-lane path;
#   free_a / limited_a    every job has an actor: pgque.jobs;
# `limited` has a queue rate limit, `limited_a` a queue rate limit and its
# actor an actor rate limit, all far above what one session can dispatch, so
# every call locks, reads and debits the buckets but none is held back.
# pgbench, 1 client, `BEGIN; dispatch(q, LIMIT, 'w'); ROLLBACK` (rolled back,
# as w7, so the depth stays the same), CELL-second cells interleaved
# free/limited for ROUNDS rounds; p50 and p95 from pgbench's per-transaction
# log. Run as root after installing the build to measure, e.g.
#   hx NAME bash pg_test/run.sh 15 rate_limit     # installs the tier build
#   hx NAME bash benches/rate_limits/rate_bench.sh
# Prints a markdown table; benches/results/jobs.md keeps the runs (History).
set -euo pipefail
N=${N:-50000}
LIMIT=${LIMIT:-10}
CELL=${CELL:-5}
ROUNDS=${ROUNDS:-3}
B=/usr/lib/postgresql/15/bin
W=/tmp/pgque_ratebench
D=$W/data
PORT=55611
rm -rf "$W"; mkdir -p "$W" && chown postgres "$W"
runuser -u postgres -- $B/initdb -D $D -A trust -U postgres >/dev/null
printf "port=$PORT\nlisten_addresses=''\nunix_socket_directories='$W'\nshared_preload_libraries='pgque'\nshared_buffers=512MB\nsynchronous_commit=off\njit=off\n" >> $D/postgresql.conf
runuser -u postgres -- $B/pg_ctl -D $D -l $W/log -w start >/dev/null
trap 'runuser -u postgres -- $B/pg_ctl -D $D -m immediate stop >/dev/null 2>&1 || true' EXIT
PS="$B/psql -h $W -p $PORT -U postgres -XAtq"
$PS -c "CREATE DATABASE d" >/dev/null
PS="$PS -d d"
$PS -c "CREATE EXTENSION pgque" -c "SELECT pgque.stop()" >/dev/null
for q in free limited free_a limited_a; do
  actor=NULL; case $q in *_a) actor="'actor_$q'";; esac
  $PS -c "SELECT pgque.create_job_queue('$q')" \
      -c "SELECT count(*) FROM pgque.enqueue_ready_rows('$q',
            (SELECT array_agg('k'::text) FROM generate_series(1, $N)),
            (SELECT array_agg('{}'::jsonb) FROM generate_series(1, $N)),
            actors => (SELECT array_agg($actor::text) FROM generate_series(1, $N)))" >/dev/null
done
$PS -c "SELECT pgque.set_rate_limit('limited', 1000000000, '1 second')" \
    -c "SELECT pgque.set_rate_limit('limited_a', 1000000000, '1 second')" \
    -c "SELECT pgque.set_actor_rate_limit('actor_limited_a', 1000000000, '1 second')" \
    -c "VACUUM ANALYZE" >/dev/null
cd "$W"
cell() { # queue round -> "p50 p95 calls" (ms)
  printf 'BEGIN;\nSELECT count(*) FROM pgque.dispatch(ARRAY[%s], %s, %s);\nROLLBACK;\n' "'$1'" "$LIMIT" "'w'" > $W/$1.sql
  chmod 644 $W/$1.sql
  rm -f $W/pl_$1_$2*
  runuser -u postgres -- $B/pgbench -h $W -p $PORT -U postgres -n -c 1 -T $CELL -M prepared \
      -l --log-prefix=$W/pl_$1_$2 -f $W/$1.sql d >/dev/null 2>&1
  cat $W/pl_$1_$2* | awk '{print $3}' | sort -n |
    awk '{a[NR]=$1} END {printf "%.3f %.3f %d", a[int((NR+1)/2)]/1000, a[int(NR*0.95)]/1000, NR}'
}
# every dispatch returns the whole limit (a cell that dispatched nothing
# would measure an empty call)
for q in free limited free_a limited_a; do
  got=$($PS -c "BEGIN" -c "SELECT count(*) FROM pgque.dispatch(ARRAY['$q'], $LIMIT, 'w')" -c "ROLLBACK")
  [ "$got" = "$LIMIT" ] || { echo "dispatch from $q returned $got jobs, not $LIMIT" >&2; exit 1; }
done
echo "N=$N ready jobs per queue, limit $LIMIT, ${CELL} s cells, $ROUNDS rounds, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| store | round | without limit: p50 / p95 ms (calls) | with limit: p50 / p95 ms (calls) | p50 ratio |"
echo "|---|---|---|---|---|"
for round in $(seq 1 $ROUNDS); do
  for store in log jobs; do
    f=free; l=limited; [ $store = jobs ] && { f=free_a; l=limited_a; }
    read -r a a95 an <<<"$(cell $f $round)"
    read -r b b95 bn <<<"$(cell $l $round)"
    echo "| $store | $round | $a / $a95 ($an) | $b / $b95 ($bn) | $(awk -v a=$a -v b=$b 'BEGIN {printf "%.2f", b/a}') |"
  done
done
