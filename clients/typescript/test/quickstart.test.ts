/** README.md's quick start (examples/quickstart.ts) runs as written, here
 * against a fresh database of the test server instead of `make run`'s. */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { test } from "node:test";

import { client, freshDatabase } from "./helpers.js";

test("the quick start prints the job, its output and the event", async () => {
  const cfg = await freshDatabase("pgque_ts_quickstart");
  const script = fileURLToPath(new URL("../examples/quickstart.js", import.meta.url));
  const { stdout } = await promisify(execFile)(process.execPath, [script], {
    env: { ...process.env, PGQUE_CONFIG: JSON.stringify(cfg) },
    timeout: 60_000,
  });
  const lines = stdout.trim().split("\n");
  assert.match(lines[0] ?? "", /^enqueued job (\d+)$/);
  const id = /(\d+)$/.exec(lines[0] ?? "")?.[1];
  assert.deepEqual(lines.slice(1), [
    `job ${id}: welcome mail to ada@example.com (attempt 1)`,
    `job ${id} output {"sent":true}`,
    'event 1 order.created key=tenant-42 {"id":7}',
  ]);
  const c = await client(cfg);
  try {
    const { rows } = await c.query("SELECT job_id::int, address FROM ts_sent_mail");
    assert.deepEqual(rows, [{ job_id: Number(id), address: "ada@example.com" }], "the handler's effect committed");
  } finally {
    await c.end();
  }
});
