/** Without `@opentelemetry/api` (an optional peer dependency): the client
 * loads, enqueues jobs without headers (they keep the job log) and runs them,
 * sends events without headers and consumes them (the plain receive),
 * in a node process where resolving any `@opentelemetry/*` module fails as it
 * does when the package is not installed. */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

import { freshDatabase } from "./helpers.js";

// A resolve hook that makes @opentelemetry/* "not installed".
const HOOKS =
  "export async function resolve(s, c, next) { if (s.startsWith('@opentelemetry/')) " +
  "{ const e = new Error('Cannot find package ' + s); e.code = 'ERR_MODULE_NOT_FOUND'; throw e; } " +
  "return next(s, c); }";
const REGISTER =
  "import { register } from 'node:module'; " +
  `register('data:text/javascript,' + encodeURIComponent(${JSON.stringify(HOOKS)}));`;

test("without @opentelemetry/api: no spans, no headers, jobs keep the job log, events carry none", async () => {
  const cfg = await freshDatabase("pgque_ts_no_otel");
  const index = fileURLToPath(new URL("../src/index.js", import.meta.url));
  const otel = fileURLToPath(new URL("../src/otel.js", import.meta.url));
  const script = `
    import pg from "pg";
    const { enqueue, enqueueMany, Worker, Consumer, send, sendBatch, sendIdem, sendAt } = await import(${JSON.stringify(index)});
    const { otelApi } = await import(${JSON.stringify(otel)});
    const c = new pg.Client(${JSON.stringify(cfg)});
    await c.connect();
    await c.query("SELECT pgque.create_job_queue('plain')");
    const a = await enqueue(c, "plain", "k", {});
    const [b] = await enqueueMany(c, "plain", [["k"]]);
    const ac = new AbortController();
    let seen = null;
    const w = new Worker({ connection: ${JSON.stringify(cfg)}, queues: "plain", concurrency: 1, pollIntervalMs: 100, handleSignals: false })
      .handle("k", (job) => { seen = job.headers; if (job.id === b.jobId) ac.abort(); });
    await w.run({ signal: ac.signal });
    const { rows } = await c.query("SELECT headers, stored_in, state FROM pgque.all_jobs WHERE id = ANY($1) ORDER BY id", [[a, b.jobId]]);
    await c.query("SELECT pgque.create_queue('ev'), pgque.subscribe('ev', 'probe'), pgque.subscribe('ev', 'c')");
    const ids = [await send(c, "ev", { n: 1 }), ...(await sendBatch(c, "ev", ["x", "y"])),
      (await sendIdem(c, "ev", "t", {}, "e1")).eventId, await sendAt(c, "ev", "t", {}, new Date(Date.now() - 1000))];
    await c.query("SELECT pgque.force_tick('ev')");
    const ev = await c.query("SELECT count(*)::int AS n, count(headers)::int AS with_headers FROM pgque.receive_with_headers('ev', 'probe', 100)");
    const msgs = [];
    const ac2 = new AbortController();
    const consumer = new Consumer({ connection: ${JSON.stringify(cfg)}, queue: "ev", consumer: "c", pollIntervalMs: 100, handleSignals: false,
      handler: (m) => { msgs.push(m.headers); if (msgs.length === ids.length) ac2.abort(); } });
    await consumer.run({ signal: ac2.signal });
    await c.end();
    console.log(JSON.stringify({ api: await otelApi(), seen, rows, events: ev.rows[0], consumed: msgs }));`;
  const out = execFileSync(process.execPath, ["--import", `data:text/javascript,${encodeURIComponent(REGISTER)}`,
    "--input-type=module", "-e", script], { cwd: fileURLToPath(new URL("..", import.meta.url)), encoding: "utf8" });
  const got = JSON.parse(out.trim().split("\n").pop() as string);
  assert.deepEqual(got, {
    api: null,
    seen: null,
    rows: [
      { headers: null, stored_in: "log", state: "completed" },
      { headers: null, stored_in: "log", state: "completed" },
    ],
    events: { n: 5, with_headers: 0 },
    consumed: [null, null, null, null, null],
  });
});
