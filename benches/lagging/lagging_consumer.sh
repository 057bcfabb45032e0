#!/usr/bin/env bash
# A consumer 400k events (800 chunks of 500, each ticked) behind, across a
# metadata truncation, then 100 receive(500)+ack on a scratch PostgreSQL 15
# cluster with the installed pgque (port 55600). Prints the ticks kept, the
# drain time and how many batches were cut by event id.
# Run as root: bash benches/lagging/lagging_consumer.sh (needs the release
# build installed into PostgreSQL 15, e.g. by `bash pg_test/run.sh 15`).
set -euo pipefail
mkdir -p /tmp/pgque_lag && chown postgres /tmp/pgque_lag
B=/usr/lib/postgresql/15/bin
D=/tmp/pgque_lag/data
runuser -u postgres -- $B/initdb -D $D -A trust -U postgres >/dev/null
printf "port=55600\nunix_socket_directories='/tmp/pgque_lag'\nshared_preload_libraries='pgque'\nshared_buffers=1GB\nsynchronous_commit=off\n" >> $D/postgresql.conf
runuser -u postgres -- $B/pg_ctl -D $D -l /tmp/pgque_lag/log -w start >/dev/null
PS="$B/psql -h /tmp/pgque_lag -p 55600 -U postgres -XAtq"
$PS -c "CREATE DATABASE d" >/dev/null
PS="$PS -d d"
$PS -c "CREATE EXTENSION pgque" -c "SELECT pgque.stop()" -c "SELECT pgque.create_queue('lag'), pgque.subscribe('lag', 'c')" >/dev/null
PAY="jsonb_build_object('id', g, 'note', repeat('x', 150))"
for i in $(seq 1 800); do echo "SELECT pgque.send_batch('lag', array_agg($PAY)) FROM generate_series(1, 500) g; SELECT pgque.force_tick('lag'); SELECT pgque.ticker('lag');"; done | $PS >/dev/null
$PS -c "SET pgque.metadata_rotation_period = 0" -c "SELECT pgque.maint()" -c "SELECT pgque.maint()" -c "SELECT pgque.maint()" >/dev/null
echo "ticks kept: $($PS -c "SELECT count(*) FROM pgque.tick t JOIN pgque.queue q ON q.queue_id = t.tick_queue WHERE q.queue_name = 'lag'")"
$PS -c '\timing on' -c "DO \$\$ DECLARE b bigint; n int; BEGIN FOR i IN 1..100 LOOP SELECT max(batch_id), count(*) INTO b, n FROM pgque.receive('lag', 'c', 500); EXIT WHEN n = 0; PERFORM pgque.ack(b); END LOOP; END \$\$" | grep Time
echo "batches cut by event id: $($PS -c "SELECT count(*) FROM pgque.batch WHERE ev_ceiling IS NOT NULL")"
runuser -u postgres -- $B/pg_ctl -D $D -m immediate stop >/dev/null
rm -rf $D
