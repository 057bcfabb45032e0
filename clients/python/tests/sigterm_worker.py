"""A worker process for test_worker.test_sigterm_mid_batch_loses_nothing:
python sigterm_worker.py DSN QUEUE. Each handler records its job in table
`handled` (its own commit, before it returns), then sleeps a little."""

import sys
import threading
import time

import psycopg

import pgque_client as pq

dsn, queue = sys.argv[1], sys.argv[2]
local = threading.local()
w = pq.Worker(dsn, [queue], concurrency=4, poll_interval=0.2, shutdown_timeout=20)


@w.handler("slow")
def slow(job):
    if not hasattr(local, "conn"):
        local.conn = psycopg.connect(dsn, autocommit=True)
    time.sleep(0.15)
    local.conn.execute("INSERT INTO handled (job_id) VALUES (%s)", (job.id,))
    return None


print("ready", flush=True)
w.run()
print(f"stopped completed={w.completed}", flush=True)
