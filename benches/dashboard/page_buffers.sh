#!/usr/bin/env bash
# Buffers and time of one pgque.list_jobs page (50 jobs) per filter, read
# as the dashboard does: the second call in a session (the first also
# compiles and plans), through EXPLAIN (ANALYZE, BUFFERS). Buffers are the
# machine-independent cost: the same with 1,000 or 1,000,000 jobs stored.
#
#   benches/dashboard/page_buffers.sh PSQL_HOST PSQL_PORT DATABASE [BEFORE_ID]
set -euo pipefail
HOST=${1:?host}; PORT=${2:?port}; DB=${3:?database}; BEFORE=${4:-NULL}
echo "| list_jobs(queue, state, kind, search) | shared buffers hit | execution ms |"
echo "|---|---|---|"
for args in "NULL, NULL, NULL, NULL" "'bench', NULL, NULL, NULL" "'side', NULL, NULL, NULL" \
            "NULL, 'completed', NULL, NULL" "'bench', 'completed', NULL, NULL" \
            "'side', 'completed', NULL, NULL" "NULL, 'failed', NULL, NULL" \
            "'bench', 'ready', NULL, NULL" "NULL, 'running', NULL, NULL" \
            "NULL, NULL, 'resize', NULL" "'side', NULL, 'resize', NULL" \
            "NULL, NULL, NULL, 'user4242'" "NULL, NULL, NULL, 'smtp timeout'"; do
  out=$(psql -h "$HOST" -p "$PORT" -U postgres -d "$DB" -At \
        -c "SELECT count(*) FROM pgque.list_jobs($args, $BEFORE, 50)" \
        -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT * FROM pgque.list_jobs($args, $BEFORE, 50)")
  hit=$(echo "$out" | sed -n 's/.*Buffers: shared hit=\([0-9]*\).*/\1/p' | head -1)
  ms=$(echo "$out" | sed -n 's/Execution Time: \([0-9.]*\) ms/\1/p')
  echo "| \`$args\` | $hit | $ms |"
done
