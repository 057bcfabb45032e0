/**
 * A worker process for worker.test.ts's SIGTERM test:
 * `node sigterm_worker.js CONFIG_JSON QUEUE`. Each handler records its job in
 * table `handled` (its own commit, before it returns), then waits a little.
 * Drains on SIGTERM (handleSignals) and prints the count it completed.
 */
import pg from "pg";

import { Worker } from "../src/index.js";

const [cfgJson, queue] = process.argv.slice(2) as [string, string];
const cfg = JSON.parse(cfgJson) as pg.ClientConfig;
const db = new pg.Pool({ ...cfg, max: 4 });
const w = new Worker({ connection: cfg, queues: [queue], concurrency: 4, pollIntervalMs: 200, shutdownTimeoutMs: 20_000 });
w.handle("slow", async (job) => {
  await new Promise((r) => setTimeout(r, 150));
  await db.query("INSERT INTO handled (job_id) VALUES ($1)", [job.id]);
});
process.stdout.write("ready\n");
await w.run();
await db.end();
process.stdout.write(`stopped completed=${w.completed}\n`);
