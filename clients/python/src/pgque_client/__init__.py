"""pgque_client: producers, a job worker and event consumers for pgque.

Producers run on your connection and in your transaction::

    import psycopg, pgque_client as pq
    with psycopg.connect(dsn) as conn:
        pq.enqueue(conn, "emails", "welcome", {"to": 1}, priority=5)
        pq.send(conn, "orders", {"id": 7}, type="order.created", partition_key="tenant-42")

Workers and consumers own their connections and block in ``run()`` until
``stop()``, SIGTERM or SIGINT. ``pgque_client.aio`` has the asyncio producers
and an asyncio ``Worker``. A handler ``def handle(job, tx)`` is exactly-once:
its writes through ``tx`` and the job's completion commit in one transaction.
"""

from . import aio, errors
from .consumer import Consumer, Message, PartitionedConsumer
from .errors import PgqueError
from .producer import (
    Enqueued,
    FlowJob,
    IdemSend,
    enqueue,
    enqueue_flow,
    enqueue_many,
    send,
    send_at,
    send_batch,
    send_idem,
)
from .worker import Job, Worker

__version__ = "0.1.0"

__all__ = [
    "aio",
    "errors",
    "PgqueError",
    "enqueue",
    "enqueue_many",
    "enqueue_flow",
    "send",
    "send_batch",
    "send_idem",
    "send_at",
    "Enqueued",
    "FlowJob",
    "IdemSend",
    "Worker",
    "Job",
    "Consumer",
    "PartitionedConsumer",
    "Message",
]
