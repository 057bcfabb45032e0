"""An asyncio worker process for test_aio_worker's SIGTERM test:
python sigterm_aio_worker.py DSN QUEUE TABLE. Each job is an exactly-once
handler that inserts its job id into TABLE and sleeps a little."""

import asyncio
import sys

from psycopg import sql

from pgque_client import aio

dsn, queue, table = sys.argv[1], sys.argv[2], sys.argv[3]


async def main() -> None:
    w = aio.Worker(dsn, [queue], concurrency=4, poll_interval=0.2, shutdown_timeout=20)

    @w.handler("slow")
    async def slow(job, tx):
        await tx.execute(sql.SQL("INSERT INTO {} (job_id) VALUES (%s)").format(sql.Identifier(table)), (job.id,))
        await asyncio.sleep(0.15)

    print("ready", flush=True)
    await w.run()
    print(f"stopped completed={w.completed}", flush=True)


asyncio.run(main())
