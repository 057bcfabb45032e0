/** Event consumers against a real server: Consumer and PartitionedConsumer. */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import pg from "pg";

import { Consumer, PartitionedConsumer, sendBatch, type Message } from "../src/index.js";
import { client, freshDatabase, gate, sleep, uniq, waitUntil } from "./helpers.js";

let cfg: pg.ClientConfig;
let conn: pg.Client;

before(async () => {
  cfg = await freshDatabase("pgque_ts_consumer");
  conn = await client(cfg);
});
after(async () => {
  await conn.end();
});

function running(c: { run(o: { signal: AbortSignal }): Promise<void> }): { stop: () => Promise<void> } {
  const ac = new AbortController();
  const done = c.run({ signal: ac.signal });
  done.catch(() => undefined);
  return {
    stop: async () => {
      ac.abort();
      await done;
    },
  };
}

interface SlotRow {
  slot: number;
  pending_events: string;
  last_tick: string;
  lease_owner: string | null;
}

async function slots(queue: string, consumer: string): Promise<SlotRow[]> {
  const { rows } = await conn.query<SlotRow>(
    "SELECT slot, pending_events, last_tick, lease_owner FROM pgque.partition_slot_status " +
      "WHERE queue_name = $1 AND consumer = $2 ORDER BY slot",
    [queue, consumer],
  );
  return rows;
}

async function lastTick(queue: string): Promise<number> {
  const { rows } = await conn.query("SELECT last_tick_id FROM pgque.get_queue_info($1)", [queue]);
  return Number(rows[0].last_tick_id);
}

test("Consumer handles in order, nacks a failing event, acks every batch", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  await conn.query("SELECT pgque.subscribe($1, 'c1')", [q]);
  const ids = await sendBatch(conn, q, Array.from({ length: 50 }, (_, i) => ({ i })), { type: "t" });
  const seen: number[] = [];
  const retried: [number, number][] = [];
  const c = new Consumer({
    connection: cfg,
    queue: q,
    consumer: "c1",
    pollIntervalMs: 200,
    retryAfterMs: 0,
    handleSignals: false,
    handler: (m: Message) => {
      if (m.json<{ i: number }>().i === 7 && m.retryCount === null) throw new Error("first delivery of 7 fails");
      if (m.retryCount) retried.push([m.msgId, m.retryCount]);
      assert.equal(m.type, "t");
      seen.push(m.msgId);
    },
  });
  const r = running(c);
  try {
    await waitUntil(() => seen.length === 50, 30_000, "every event handled");
  } finally {
    await r.stop();
  }
  assert.deepEqual([...seen].sort((a, b) => a - b), ids);
  assert.deepEqual(
    seen.filter((s) => s !== ids[7]),
    ids.filter((i) => i !== ids[7]),
    "in order",
  );
  assert.deepEqual(retried, [[ids[7], 1]]);
  const { rows } = await conn.query("SELECT pending_events FROM pgque.get_consumer_info($1, 'c1')", [q]);
  assert.equal(Number(rows[0].pending_events), 0);
  assert.equal(c.handled, 51);
});

test("PartitionedConsumer: 3 loops keep all 8 slots polled, each key in order", async () => {
  const n = 8;
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  await conn.query("SELECT pgque.subscribe_partitioned($1, 'pc', $2)", [q, n]);
  const keys = Array.from({ length: 40 }, (_, k) => `key-${k}`);
  const sent = new Map<string, number[]>();
  for (let round = 0; round < 5; round++) {
    const ids = await sendBatch(
      conn,
      q,
      keys.map((k) => ({ round, k })),
      { type: "t", partitionKeys: keys },
    );
    keys.forEach((k, i) => sent.set(k, [...(sent.get(k) ?? []), ids[i] as number]));
  }
  const got = new Map<string, number[]>();
  const pc = new PartitionedConsumer({
    connection: cfg,
    queue: q,
    consumer: "pc",
    n,
    workers: 3,
    pollIntervalMs: 300,
    handleSignals: false,
    handler: async (m) => {
      const k = m.partitionKey as string;
      got.set(k, [...(got.get(k) ?? []), m.msgId]);
      if (Math.random() < 0.1) await sleep(5); // interleave the loops
    },
  });
  const r = running(pc);
  try {
    await conn.query("SELECT pgque.force_tick($1)", [q]);
    const t1 = await lastTick(q);
    await waitUntil(
      async () => (await slots(q, "pc")).every((s) => Number(s.pending_events) === 0 && Number(s.last_tick) >= t1),
      60_000,
      "every slot drained",
      100,
    );
    // Idle slots are polled too: every slot's position follows a new tick.
    await conn.query("SELECT pgque.force_tick($1)", [q]);
    const t2 = await lastTick(q);
    await waitUntil(
      async () => (await slots(q, "pc")).every((s) => Number(s.last_tick) >= t2),
      30_000,
      "every slot polled after an idle tick",
      100,
    );
  } finally {
    await r.stop();
  }
  assert.equal([...got.values()].reduce((a, v) => a + v.length, 0), keys.length * 5);
  for (const k of keys) assert.deepEqual(got.get(k), sent.get(k), `key ${k}: in order, each once`);
  const all = await slots(q, "pc");
  assert.equal(all.length, n);
  assert.deepEqual(
    all.map((s) => s.slot),
    [0, 1, 2, 3, 4, 5, 6, 7],
  );
  assert.equal(pc.handled, keys.length * 5);
});

test("a loop that loses its slot lease stops processing that slot", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  await conn.query("SELECT pgque.subscribe_partitioned($1, 'pc', 1)", [q]);
  const ids = await sendBatch(conn, q, [0, 1, 2, 3, 4].map((i) => ({ i })), { type: "t", partitionKeys: Array(5).fill("k") });
  const handled: number[] = [];
  const inFirst = gate();
  const goOn = gate();
  const pc = new PartitionedConsumer({
    connection: cfg,
    queue: q,
    consumer: "pc",
    n: 1,
    ttlMs: 1000,
    pollIntervalMs: 200,
    workerId: "A",
    handleSignals: false,
    handler: async (m) => {
      handled.push(m.msgId);
      if (handled.length === 1) {
        inFirst.open();
        await goOn.promise; // past the 1 s lease, without renewing it
      }
    },
  });
  const r = running(pc);
  try {
    await conn.query("SELECT pgque.force_tick($1)", [q]);
    await inFirst.promise;
    await waitUntil(async () => (await slots(q, "pc"))[0]?.lease_owner === null, 10_000, "A's lease to lapse");
    const { rows } = await conn.query("SELECT pgque.claim_slot($1, 'pc', 0, 'thief', '60 seconds') AS epoch", [q]);
    assert.notEqual(rows[0].epoch, null);
    goOn.open();
    await waitUntil(() => pc.lostSlots >= 1, 10_000, "A to notice the take-over");
    await sleep(300);
    assert.deepEqual(handled, [ids[0]], "nothing more of that slot");
    const { rows: again } = await conn.query("SELECT msg_id FROM pgque.receive_partitioned($1, 'pc', 0, 1, 'thief', 100)", [q]);
    assert.deepEqual(
      again.map((x) => Number(x.msg_id)),
      ids,
      "the new owner gets the whole batch again",
    );
    const { rows: acked } = await conn.query("SELECT pgque.ack_partitioned($1, 'pc', 0, 1, 'thief') AS n", [q]);
    assert.equal(acked[0].n, 1);
  } finally {
    goOn.open();
    await r.stop();
  }
  assert.deepEqual(handled, [ids[0]]);
});

test("PartitionedConsumer with failurePolicy pause: a failed key's later events wait for it", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  await conn.query("SELECT pgque.subscribe_partitioned($1, 'pp', 1, failure_policy => 'pause')", [q]);
  const keys = ["a", "b", "a", "b", "a", "a"];
  const ids = (await sendBatch(
    conn,
    q,
    keys.map((_, i) => ({ i })),
    { type: "t", partitionKeys: keys },
  )) as number[];
  const done: [string, number][] = [];
  let failedOnce = false;
  const pc = new PartitionedConsumer({
    connection: cfg,
    queue: q,
    consumer: "pp",
    n: 1,
    pollIntervalMs: 200,
    retryAfterMs: 0,
    handleSignals: false,
    failurePolicy: "pause",
    handler: async (m) => {
      if (m.msgId === ids[0] && !failedOnce) {
        failedOnce = true;
        throw new Error("a's first event fails once");
      }
      done.push([m.partitionKey as string, m.msgId]);
    },
  });
  const r = running(pc);
  try {
    await conn.query("SELECT pgque.force_tick($1)", [q]);
    await waitUntil(async () => done.length === keys.length, 30_000, "every event handled", 50);
  } finally {
    await r.stop();
  }
  assert.ok(failedOnce);
  assert.deepEqual(
    done.filter(([k]) => k === "a").map(([, i]) => i),
    [ids[0], ids[2], ids[4], ids[5]],
  );
  assert.deepEqual(
    done.filter(([k]) => k === "b").map(([, i]) => i),
    [ids[1], ids[3]],
  );
  // The policy is the consumer's: a skip consumer of that name is refused.
  const skip = new PartitionedConsumer({ connection: cfg, queue: q, consumer: "pp", n: 1, handleSignals: false, handler: async () => {} });
  await assert.rejects(skip.run(), (err: { code?: string; sqlstate?: string; message?: string }) =>
    /22023|policy/.test(`${err.code ?? ""} ${err.sqlstate ?? ""} ${err.message ?? ""}`),
  );
});

/** An operator's online resize: begin, wait until every old slot drained, complete. */
async function resize(q: string, newN: number): Promise<void> {
  await conn.query("SELECT pgque.begin_resize($1, 'pr', $2)", [q, newN]);
  await waitUntil(
    async () => (await conn.query<{ r: boolean }>("SELECT bool_and(ready) AS r FROM pgque.resize_ready($1, 'pr')", [q])).rows[0]?.r === true,
    60_000,
    `the old slots to drain (resize to ${newN})`,
    100,
  );
  const { rows } = await conn.query<{ n: number }>("SELECT pgque.complete_resize($1, 'pr') AS n", [q]);
  assert.equal(rows[0]?.n, newN);
}

test("PartitionedConsumer follows an online resize (4 -> 8 -> 2) without a restart", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  await conn.query("SELECT pgque.subscribe_partitioned($1, 'pr', 4)", [q]);
  const keys = Array.from({ length: 30 }, (_, k) => `key-${k}`);
  const sent = new Map<string, number[]>();
  const got = new Map<string, number[]>();
  const sendRound = async (round: number): Promise<void> => {
    const ids = await sendBatch(
      conn,
      q,
      keys.map((k) => ({ round, k })),
      { type: "t", partitionKeys: keys },
    );
    keys.forEach((k, i) => sent.set(k, [...(sent.get(k) ?? []), ids[i] as number]));
  };
  const count = (m: Map<string, number[]>): number => [...m.values()].reduce((a, v) => a + v.length, 0);
  const pc = new PartitionedConsumer({
    connection: cfg,
    queue: q,
    consumer: "pr",
    n: 4,
    workers: 3,
    pollIntervalMs: 200,
    handleSignals: false,
    handler: async (m) => {
      const k = m.partitionKey as string;
      got.set(k, [...(got.get(k) ?? []), m.msgId]);
    },
  });
  const r = running(pc);
  try {
    for (let round = 0; round < 3; round++) await sendRound(round);
    await resize(q, 8); // grow while the events before the seal are consumed
    for (let round = 3; round < 6; round++) await sendRound(round);
    await conn.query("SELECT pgque.force_tick($1)", [q]);
    await waitUntil(() => count(got) === count(sent), 60_000, "every event handled after the grow", 100);
    assert.equal(pc.n, 8);
    for (let round = 6; round < 9; round++) await sendRound(round);
    await resize(q, 2); // shrink
    await sendRound(9);
    await conn.query("SELECT pgque.force_tick($1)", [q]);
    await waitUntil(() => count(got) === count(sent), 60_000, "every event handled after the shrink", 100);
    assert.equal(pc.n, 2);
  } finally {
    await r.stop();
  }
  for (const k of keys) assert.deepEqual(got.get(k), sent.get(k), `key ${k}: in send order, none lost or twice`);
  assert.equal((await slots(q, "pr")).length, 2);
});

test("cooperative members (subconsumer) share the stream; a normal consumer still gets every event", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  await conn.query("SELECT pgque.subscribe($1, 'all')", [q]);
  for (const m of ["m1", "m2"]) await conn.query("SELECT pgque.register_subconsumer($1, 'grp', $2)", [q, m]);
  const seen: [string, number, number | null][] = [];
  const member = (name: string) =>
    new Consumer({
      connection: cfg,
      queue: q,
      consumer: "grp",
      subconsumer: name,
      batchSize: 5,
      pollIntervalMs: 100,
      retryAfterMs: 0,
      handleSignals: false,
      handler: async (m: Message) => {
        if (m.json<{ i: number }>().i === 7 && m.retryCount === null) throw new Error("first delivery of 7 fails");
        seen.push([name, m.msgId, m.retryCount]);
        await sleep(20); // slow, so the other member gets batches too
      },
    });
  const ids: number[] = [];
  for (let r = 0; r < 8; r++) {
    ids.push(...(await sendBatch(conn, q, Array.from({ length: 5 }, (_, i) => ({ i: r * 5 + i })), { type: "t" })));
    await conn.query("SELECT pgque.force_tick($1)", [q]);
  }
  const runs = [running(member("m1")), running(member("m2"))];
  try {
    await waitUntil(() => seen.length === 40, 60_000, "every event handled");
  } finally {
    for (const r of runs) await r.stop();
  }
  assert.deepEqual(
    seen.map((s) => s[1]).sort((a, b) => a - b),
    ids,
  );
  assert.ok(seen.some((s) => s[1] === ids[7] && s[2] === 1), "7 redelivered");
  assert.deepEqual(new Set(seen.map((s) => s[0])), new Set(["m1", "m2"]));
  await conn.query("SELECT pgque.force_tick($1)", [q]);
  let total = 0;
  for (;;) {
    const { rows } = await conn.query("SELECT batch_id FROM pgque.receive($1, 'all', 1000)", [q]);
    if (rows.length === 0) break;
    total += rows.length;
    await conn.query("SELECT pgque.ack($1)", [rows[0].batch_id]);
  }
  assert.ok(total >= 40, `the normal consumer got ${total}`);
});
