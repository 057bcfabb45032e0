#!/usr/bin/env bash
# Flows at scale (issue 19), on a scratch PostgreSQL 15 cluster with the
# installed pgque (port 55620, the worker stopped: only the measured calls
# run, and nothing a flow needs is done by the worker):
#   a. completing a child of a flow of 10,000 jobs (1 -> 9,998 -> 1, so the
#      child has 9,997 siblings and its fan-in child 9,998 parents) vs a
#      child of a flow 1 -> 2 -> 1 (one sibling): per-call p50/p95 with one
#      completer, and completions/s with two completers at once;
#   b. dispatch p50/p95 (limit 50, w7-style: prepared, each call rolled
#      back) with 100,000 waiting jobs in the queue vs none, the ready jobs
#      in pgque.jobs (flow jobs) and in the job log, plan_cache_mode
#      force_custom_plan and force_generic_plan.
# Run as root: bash benches/flows/flows_bench.sh (needs pgque installed into
# PostgreSQL 15, e.g. by `bash pg_test/run.sh 15 flow`). ROUNDS=N (default 3);
# KEEP=1 leaves the cluster running afterwards.
# Prints markdown; the Flows section of benches/results/jobs.md keeps the
# current figures (benches/flows/dispatch_blocks.sql counts the blocks).
set -euo pipefail
cd "$(dirname "$0")"
B=/usr/lib/postgresql/15/bin
W=/tmp/pgque_flowbench
D=$W/data
PORT=55620
[ -f "$D/postmaster.pid" ] && runuser -u postgres -- $B/pg_ctl -D $D -m immediate stop >/dev/null 2>&1 || true
rm -rf "$W"; mkdir -p "$W" && chown postgres "$W"
runuser -u postgres -- $B/initdb -D $D -A trust -U postgres >/dev/null
printf "port=$PORT\nlisten_addresses=''\nunix_socket_directories='$W'\nshared_preload_libraries='pgque'\nshared_buffers=512MB\nsynchronous_commit=off\njit=off\nmax_wal_size=4GB\n" >> $D/postgresql.conf
runuser -u postgres -- $B/pg_ctl -D $D -l $W/log -w start >/dev/null
[ "${KEEP:-0}" = 1 ] || trap 'runuser -u postgres -- $B/pg_ctl -D $D -m immediate stop >/dev/null 2>&1 || true' EXIT
PS="$B/psql -h $W -p $PORT -U postgres -XAtq"
$PS -d postgres -c "CREATE DATABASE d" >/dev/null
$PS -d d -c "CREATE EXTENSION pgque" -c "SELECT pgque.stop()" >/dev/null
python3 -c 'import psycopg' 2>/dev/null || pip install -q 'psycopg[binary]'
FLOWBENCH_DSN="host=$W port=$PORT user=postgres dbname=d" python3 flows_bench.py
