#!/usr/bin/env bash
# Idle databases (issue 23), on a scratch PostgreSQL 15 cluster with the
# installed pgque (port 55620, max_worker_processes 64): N databases (default
# 50), each with three event queues (one with a consumer) and two job queues,
# all idle. Two phases in the same run, on the same cluster:
#   before: pgque.idle_after = 0, the workers run every duty on its cadence
#           (the loop as it was before idle mode);
#   after:  pgque.idle_after = 1 s (the default), the workers go idle
#           (pgque.worker_idle_exit = 0: they stay resident);
#   parked: pgque.worker_idle_exit = 5 s, idle workers give their process
#           back to the pool (src/pool.rs) until a duty is due.
# The cluster starts with idle mode off, so "before" is measured first.
# Each phase: reload, wait 15 s to settle, then over 30 s the CPU time
# (utime + stime from /proc/<pid>/stat) of every pgque worker and of the
# whole server (postmaster and all its children, and the children that
# exited meanwhile: the postmaster's cutime + cstime), and the transactions
# the pgque databases committed (pg_stat_database.xact_commit).
# Run as root: bash benches/idle/idle_bench.sh [N] (needs the release build
# installed into PostgreSQL 15, e.g. by `bash pg_test/run.sh 15 idle`;
# PGBIN=<bindir> for another installation).
# Prints a markdown table; benches/results/idle.md keeps the current one.
set -euo pipefail
N=${1:-50}
B=${PGBIN:-/usr/lib/postgresql/15/bin}
W=/tmp/pgque_idlebench
D=$W/data
PORT=55620
WINDOW=30
rm -rf "$W"; mkdir -p "$W" && chown postgres "$W"
runuser -u postgres -- $B/initdb -D $D -A trust -U postgres >/dev/null
printf "port=$PORT\nlisten_addresses=''\nunix_socket_directories='$W'\nshared_preload_libraries='pgque'\nmax_worker_processes=64\nmax_connections=100\npgque.idle_after=0\npgque.worker_idle_exit=0\nsynchronous_commit=off\njit=off\n" >> $D/postgresql.conf
runuser -u postgres -- $B/pg_ctl -D $D -l $W/log -w start >/dev/null
trap 'runuser -u postgres -- $B/pg_ctl -D $D -m immediate stop >/dev/null 2>&1 || true' EXIT
PS="$B/psql -h $W -p $PORT -U postgres -XAtq"
for i in $(seq 1 "$N"); do
  $PS -c "CREATE DATABASE idle$i" >/dev/null
  $PS -d idle$i -c "CREATE EXTENSION pgque" \
     -c "SELECT pgque.create_queue('q1'), pgque.subscribe('q1', 'c'), pgque.create_queue('q2'), pgque.create_queue('q3')" \
     -c "SELECT pgque.create_job_queue('j1'), pgque.create_job_queue('j2')" >/dev/null
done
PM=$(head -1 $D/postmaster.pid)
HZ=$(getconf CLK_TCK)

ticks() { # pid... -> summed utime+stime in clock ticks
  local t=0 p
  for p in "$@"; do
    [ -r /proc/$p/stat ] || continue
    t=$((t + $(sed 's/.*) //' /proc/$p/stat | awk '{print $12 + $13}')))
  done
  echo $t
}
workers() { $PS -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgque worker'"; }
server() { pgrep -P $PM; }
reaped() { sed 's/.*) //' /proc/$PM/stat | awk '{print $12 + $13 + $14 + $15}'; } # postmaster + exited children
xacts() { $PS -c "SELECT sum(xact_commit) FROM pg_stat_database WHERE datname LIKE 'idle%'"; }

phase() { # name idle_after worker_idle_exit
  $PS -c "ALTER SYSTEM SET pgque.idle_after = '$2'" -c "ALTER SYSTEM SET pgque.worker_idle_exit = '$3'" \
      -c "SELECT pg_reload_conf()" >/dev/null
  sleep 15
  local wk sv nw w0 s0 x0 w1 s1 x1
  wk=$(workers); sv=$(server); nw=$(echo "$wk" | wc -w)
  # (with parked workers: those that run at the start, and the whole server
  # with the children that came and went)
  w0=$(ticks $wk); s0=$(( $(ticks $sv) + $(reaped) )); x0=$(xacts)
  sleep $WINDOW
  sv=$(server)
  w1=$(ticks $wk); s1=$(( $(ticks $sv) + $(reaped) )); x1=$(xacts)
  awk -v name="$1" -v nw=$nw -v n=$N -v w=$((w1 - w0)) -v s=$((s1 - s0)) -v x=$((x1 - x0)) -v hz=$HZ -v win=$WINDOW 'BEGIN {
    printf "| %s | %d | %.3f%% | %.2f%% | %.2f%% | %.2f |\n", name, nw,
      100 * w / hz / win / (nw > 0 ? nw : 1), 100 * w / hz / win, 100 * s / hz / win, x / win / n }'
}

echo "| phase | workers | CPU per worker (of a core) | all workers | whole server | transactions/s per database |"
echo "|---|---|---|---|---|---|"
phase "before (pgque.idle_after = 0)" 0 0
phase "after (pgque.idle_after = 1 s)" 1000 0
phase "parked (pgque.worker_idle_exit = 5 s)" 1000 5
