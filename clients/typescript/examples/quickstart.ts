/**
 * The quick start of README.md: against the server of `make run`
 * (PostgreSQL 15, socket /tmp/pgque_run_15, port 55415, database pgque_demo).
 * PGQUE_CONFIG (a JSON pg.ClientConfig) points it at another server.
 *
 * It enqueues a job and sends an event in one transaction, runs a worker
 * whose exactly-once handler records the mail in the same transaction as
 * the job's completion, then a consumer that reads the event.
 */
import pg from "pg";
import { Consumer, Worker, enqueue, send } from "pgque-client";

const connection: pg.ClientConfig = process.env.PGQUE_CONFIG
  ? JSON.parse(process.env.PGQUE_CONFIG)
  : { host: "/tmp/pgque_run_15", port: 55415, user: "postgres", database: "pgque_demo" };

// Producers run on your client, in your transaction.
const client = new pg.Client(connection);
await client.connect();
await client.query("BEGIN");
await client.query("SELECT pgque.create_job_queue('ts_emails')");
await client.query("CREATE TABLE IF NOT EXISTS ts_sent_mail (job_id bigint PRIMARY KEY, address text)");
const jobId = await enqueue(client, "ts_emails", "welcome", { to: "ada@example.com" }, { priority: 5 });
await client.query("SELECT pgque.create_queue('ts_orders')");
await client.query("SELECT pgque.subscribe('ts_orders', 'billing')");
await send(client, "ts_orders", { id: 7 }, { type: "order.created", partitionKey: "tenant-42" });
await client.query("COMMIT"); // the job, the event and the job's NOTIFY, all at once
console.log(`enqueued job ${jobId}`);

// A worker: the handler's effects and the job's completion commit together.
const stopWorker = new AbortController();
const worker = new Worker({ connection, queues: ["ts_emails"], concurrency: 4 });
worker.handleTx("welcome", async (job, tx) => {
  const { to } = job.args as { to: string };
  await tx.query("INSERT INTO ts_sent_mail (job_id, address) VALUES ($1, $2)", [job.id, to]);
  console.log(`job ${job.id}: welcome mail to ${to} (attempt ${job.attempt})`);
  stopWorker.abort(); // a demo: stop after one job
  return { sent: true }; // the job's output
});
await worker.run({ signal: stopWorker.signal }); // until aborted, SIGTERM or Ctrl-C; then drains

const { rows } = await client.query("SELECT output FROM pgque.get_job($1)", [jobId]);
console.log(`job ${jobId} output ${JSON.stringify(rows[0].output)}`);

// A consumer of the event queue.
const stopConsumer = new AbortController();
const consumer = new Consumer({
  connection,
  queue: "ts_orders",
  consumer: "billing",
  handler: (msg) => {
    console.log(`event ${msg.msgId} ${msg.type} key=${msg.partitionKey} ${JSON.stringify(msg.json())}`);
    stopConsumer.abort();
  },
});
await consumer.run({ signal: stopConsumer.signal });
await client.end();
