/** Producers on the caller's client and transaction, against a real server. */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import pg from "pg";

import {
  DuplicateJob,
  InvalidParameterValue,
  enqueue,
  enqueueFlow,
  enqueueMany,
  send,
  sendAt,
  sendBatch,
  sendIdem,
} from "../src/index.js";
import { client, freshDatabase, getJob, jobStates, uniq, waitUntil } from "./helpers.js";

let cfg: pg.ClientConfig;
let conn: pg.Client;

before(async () => {
  cfg = await freshDatabase("pgque_ts_producer");
  conn = await client(cfg);
});
after(async () => {
  await conn.end();
});

describe("job producers", () => {
  test("enqueue runs in the caller's transaction", async () => {
    const q = uniq();
    await conn.query("SELECT pgque.create_job_queue($1)", [q]);
    const tx = await client(cfg);
    try {
      await tx.query("BEGIN");
      const id = await enqueue(tx, q, "welcome", { to: 1 });
      assert.equal(typeof id, "number");
      await tx.query("ROLLBACK");
      assert.deepEqual(await jobStates(conn, q), {});

      await tx.query("BEGIN");
      const id2 = (await enqueue(tx, q, "welcome", { to: 2 })) as number;
      assert.deepEqual(await jobStates(conn, q), {}, "not visible before the caller's COMMIT");
      await tx.query("COMMIT");
      assert.deepEqual(await jobStates(conn, q), { ready: 1 });
      const job = await getJob(conn, id2);
      assert.equal(job.kind, "welcome");
      assert.deepEqual(job.args, { to: 2 });
    } finally {
      await tx.end();
    }
  });

  test("enqueue options go by name; duplicates skip or raise 23505", async () => {
    const q = uniq();
    await conn.query("SELECT pgque.create_job_queue($1)", [q]);
    const later = new Date(Date.now() + 3_600_000);
    const id = (await enqueue(conn, q, "k", { a: 1 }, {
      priority: 7,
      maxAttempts: 3,
      uniqueKey: "u1",
      runAt: later,
      actor: "t-1",
    })) as number;
    const job = await getJob(conn, id);
    assert.deepEqual(
      [job.priority, job.max_attempts, job.unique_key, job.state, job.actor],
      [7, 3, "u1", "scheduled", "t-1"],
    );
    assert.equal(await enqueue(conn, q, "k", {}, { uniqueKey: "u1" }), id, "skip returns the holder's id");
    await assert.rejects(enqueue(conn, q, "k", {}, { uniqueKey: "u1", onDuplicate: "error" }), (e: unknown) => {
      assert.ok(e instanceof DuplicateJob);
      assert.equal(e.code, "23505");
      return true;
    });
  });

  test("an unknown option is refused before anything is sent", async () => {
    const tx = await client(cfg);
    try {
      await tx.query("BEGIN");
      await assert.rejects(
        enqueue(tx, "whatever", "k", {}, { colour: "red" } as never),
        (e: unknown) => e instanceof InvalidParameterValue && /colour/.test(e.message),
      );
      // Nothing reached the server: the transaction is still usable.
      const { rows } = await tx.query("SELECT 1 AS one");
      assert.equal(rows[0].one, 1);
      await tx.query("ROLLBACK");
    } finally {
      await tx.end();
    }
  });

  test("enqueueMany keeps input order and reports duplicates", async () => {
    const q = uniq();
    await conn.query("SELECT pgque.create_job_queue($1)", [q]);
    const got = await enqueueMany(conn, q, [
      ["a", { i: 0 }],
      { kind: "b", args: { i: 1 }, uniqueKey: "x", priority: 3 },
      { kind: "c", uniqueKey: "x" },
    ]);
    assert.deepEqual(
      got.map((g) => g.state),
      ["ready", "ready", "duplicate"],
    );
    assert.ok((got[0]?.jobId as number) < (got[1]?.jobId as number));
    assert.equal(got[2]?.jobId, got[1]?.jobId);
    const { rows } = await conn.query("SELECT kind, priority FROM pgque.all_jobs WHERE queue = $1 ORDER BY id", [q]);
    assert.deepEqual(rows, [
      { kind: "a", priority: 0 },
      { kind: "b", priority: 3 },
    ]);
    assert.deepEqual(await enqueueMany(conn, q, []), []);
    await assert.rejects(enqueueMany(conn, q, [{ kind: "a", colour: "red" } as never]), InvalidParameterValue);
  });

  test("enqueueFlow: children wait for their parents", async () => {
    const q = uniq();
    await conn.query("SELECT pgque.create_job_queue($1)", [q]);
    const rows = await enqueueFlow(conn, q, [
      { key: "fetch", kind: "fetch", args: { day: 1 } },
      { key: "render", kind: "render", dependsOn: ["fetch"], onParentFailure: "run" },
    ]);
    assert.deepEqual(rows.map((r) => r.key).sort(), ["fetch", "render"]);
    assert.equal(new Set(rows.map((r) => r.flowId)).size, 1);
    const render = rows.find((r) => r.key === "render")?.jobId as number;
    assert.equal((await getJob(conn, render)).state, "waiting");
    const dependsOn = (await enqueue(conn, q, "archive", {}, { dependsOn: [render] })) as number;
    assert.equal((await getJob(conn, dependsOn)).state, "waiting");
  });

  test("producers work on a pg.Pool (each call commits by itself)", async () => {
    const q = uniq();
    await conn.query("SELECT pgque.create_job_queue($1)", [q]);
    const pool = new pg.Pool({ ...cfg, max: 2 });
    try {
      const id = await enqueue(pool, q, "k", [1, 2, 3]);
      assert.deepEqual((await getJob(conn, id as number)).args, [1, 2, 3], "a JSON array stays a JSON array");
    } finally {
      await pool.end();
    }
  });
});

interface Row {
  msg_id: string;
  batch_id: string;
  type: string;
  payload: string;
  extra1: string | null;
}

async function receiveAll(queue: string, consumer: string): Promise<Row[]> {
  await conn.query("SELECT pgque.force_tick($1)", [queue]);
  const { rows } = await conn.query<Row>("SELECT * FROM pgque.receive($1, $2, 1000)", [queue, consumer]);
  if (rows.length > 0) await conn.query("SELECT pgque.ack($1)", [rows[0]?.batch_id]);
  return rows;
}

describe("event producers", () => {
  test("send, sendBatch and sendIdem, in the caller's transaction", async () => {
    const q = uniq();
    await conn.query("SELECT pgque.create_queue($1)", [q]);
    await conn.query("SELECT pgque.subscribe($1, 'c')", [q]);
    const tx = await client(cfg);
    try {
      await tx.query("BEGIN");
      await send(tx, q, { lost: true });
      await tx.query("ROLLBACK");
    } finally {
      await tx.end();
    }
    const a = await send(conn, q, { n: 1 });
    const b = await send(conn, q, "plain text", { type: "t.text" });
    const c = await send(conn, q, { n: 3 }, { type: "t.key", partitionKey: "tenant-9" });
    const ids = await sendBatch(conn, q, [{ n: 4 }, { n: 5 }], { type: "t.batch", partitionKeys: ["k1", null] });
    const tids = await sendBatch(conn, q, ["x", "y"]);
    const first = await sendIdem(conn, q, "t.idem", { n: 6 }, "effect:6");
    const again = await sendIdem(conn, q, "t.idem", { n: 6 }, "effect:6", { ttlMs: 300_000 });
    assert.equal(first.deduped, false);
    assert.equal(again.deduped, true);
    assert.equal(again.eventId, first.eventId);

    const rows = await receiveAll(q, "c");
    const byId = new Map(rows.map((r) => [Number(r.msg_id), r]));
    assert.deepEqual(
      [...byId.keys()].sort((x, y) => x - y),
      [a, b, c, ...ids, ...tids, first.eventId].sort((x, y) => x - y),
      "every committed send arrives once, the rolled-back one does not",
    );
    assert.deepEqual([byId.get(a)?.type, JSON.parse(byId.get(a)?.payload as string)], ["default", { n: 1 }]);
    assert.deepEqual([byId.get(b)?.type, byId.get(b)?.payload], ["t.text", "plain text"]);
    assert.equal(byId.get(c)?.extra1, "tenant-9");
    assert.deepEqual(
      ids.map((i) => byId.get(i)?.extra1),
      ["k1", null],
    );
    assert.deepEqual(
      tids.map((i) => byId.get(i)?.payload),
      ["x", "y"],
    );
    await assert.rejects(sendBatch(conn, q, [1, 2], { partitionKeys: ["a"] }), InvalidParameterValue);
  });

  test("sendAt delivers at its time, not before", async () => {
    const q = uniq();
    await conn.query("SELECT pgque.create_queue($1)", [q]);
    await conn.query("SELECT pgque.subscribe($1, 'c')", [q]);
    const at = new Date(Date.now() + 1500);
    const id = await sendAt(conn, q, "reminder", { user: 1 }, at, { partitionKey: "tenant-7" });
    assert.deepEqual(await receiveAll(q, "c"), [], "not delivered before its time");
    const rows = (await waitUntil(
      async () => {
        const r = await receiveAll(q, "c");
        return r.length > 0 ? r : undefined;
      },
      15_000,
      "the delayed event",
      200,
    )) as Row[];
    assert.equal(Date.now() >= at.getTime(), true);
    assert.deepEqual(
      rows.map((r) => [Number(r.msg_id), r.type, r.extra1]),
      [[id, "reminder", "tenant-7"]],
    );
  });
});
