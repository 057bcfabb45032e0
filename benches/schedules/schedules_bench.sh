#!/usr/bin/env bash
# Schedules at scale (issue 18), on a scratch PostgreSQL 15 cluster with the
# installed pgque (port 55610, worker stopped: run_schedules() is called by
# hand so that its cost is measured alone):
#   1. run_schedules() when nothing is due, with 100, 10,000 and 100,000
#      schedules (pgbench, 1 client, 5 s each): must not grow with their number;
#   2. 10,000 schedules due every minute ('* * * * *'): the time to fire one
#      minute's slots (10,000 jobs; run_schedules() called until it returns 0,
#      each call one transaction of at most 1,000 schedules), 3 rounds.
# Run as root: bash benches/schedules/schedules_bench.sh (needs the release
# build installed into PostgreSQL 15, e.g. by `bash pg_test/run.sh 15 schedules`).
# Prints a markdown table; benches/results/schedules.md keeps the current one.
set -euo pipefail
B=/usr/lib/postgresql/15/bin
W=/tmp/pgque_schedbench
D=$W/data
PORT=55610
rm -rf "$W"; mkdir -p "$W" && chown postgres "$W"
runuser -u postgres -- $B/initdb -D $D -A trust -U postgres >/dev/null
printf "port=$PORT\nlisten_addresses=''\nunix_socket_directories='$W'\nshared_preload_libraries='pgque'\nshared_buffers=512MB\nsynchronous_commit=off\njit=off\n" >> $D/postgresql.conf
runuser -u postgres -- $B/pg_ctl -D $D -l $W/log -w start >/dev/null
trap 'runuser -u postgres -- $B/pg_ctl -D $D -m immediate stop >/dev/null 2>&1 || true' EXIT
PS="$B/psql -h $W -p $PORT -U postgres -XAtq"
$PS -c "CREATE DATABASE d" >/dev/null
PS="$PS -d d"
$PS -c "CREATE EXTENSION pgque" -c "SELECT pgque.stop()" -c "SELECT pgque.create_job_queue('bq')" >/dev/null
echo "SELECT pgque.run_schedules();" > $W/run.sql
chmod 644 $W/run.sql

echo "| workload | schedules | figure |"
echo "|---|---|---|"
have=0
for n in 100 10000 100000; do
  # yearly schedules: none comes due while measuring
  $PS -c "SELECT count(pgque.create_schedule('idle' || g, '0 0 1 1 *', 'bq', 'k')) FROM generate_series($((have + 1)), $n) g" >/dev/null
  have=$n
  $PS -c "VACUUM ANALYZE pgque.schedules_def" >/dev/null
  lat=$(runuser -u postgres -- $B/pgbench -h $W -p $PORT -U postgres -n -c 1 -T 5 -f $W/run.sql d 2>/dev/null | sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p')
  echo "| run_schedules(), nothing due | $n | $lat ms per call (pgbench, 1 client, 5 s) |"
done

$PS -c "SELECT count(pgque.create_schedule('due' || g, '* * * * *', 'bq', 'k')) FROM generate_series(1, 10000) g" >/dev/null
for round in 1 2 3; do
  $PS -c "UPDATE pgque.schedules_def SET next_run_at = date_trunc('minute', now()) WHERE name LIKE 'due%'" -c "VACUUM ANALYZE pgque.schedules_def" >/dev/null
  out=$($PS -c "DO \$\$
    DECLARE n int; total int := 0; calls int := 0; t0 timestamptz := clock_timestamp();
    BEGIN
      LOOP
        n := pgque.run_schedules(); COMMIT;
        total := total + n; calls := calls + 1;
        EXIT WHEN n = 0;
      END LOOP;
      RAISE NOTICE 'fired % jobs in % calls, % ms', total, calls,
        round(extract(epoch FROM clock_timestamp() - t0) * 1000);
    END \$\$" 2>&1 | sed -n 's/.*NOTICE:  //p')
  echo "| 10,000 due every minute, round $round | 10000 (+100000 idle) | $out |"
done
