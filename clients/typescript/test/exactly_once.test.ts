/**
 * Exactly-once handlers (Worker.handleTx, consumers' txHandler): a handler's
 * effects and the job's completion (or the batch's ack) commit in one
 * transaction, and a completion the server refuses leaves no effects.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";

import pg from "pg";

import { Consumer, PartitionedConsumer, Worker, enqueue, enqueueMany, sendBatch, type Job } from "../src/index.js";
import { client, freshDatabase, gate, getJob, jobStates, sleep, uniq, waitUntil } from "./helpers.js";

let cfg: pg.ClientConfig;
let conn: pg.Client;

before(async () => {
  cfg = await freshDatabase("pgque_ts_exactly_once");
  conn = await client(cfg);
});
after(async () => {
  await conn.end();
});

function running(worker: { run(o: { signal: AbortSignal }): Promise<void> }): { stop: () => Promise<void> } {
  const ac = new AbortController();
  const done = worker.run({ signal: ac.signal });
  done.catch(() => undefined);
  return {
    stop: async () => {
      ac.abort();
      await done;
    },
  };
}

/** The effect rows of jobs `jobIds`. */
async function effects(jobIds: number[]): Promise<{ job_id: number; attempt: number; note: string }[]> {
  const { rows } = await conn.query(
    "SELECT job_id::int, attempt, note FROM effects WHERE job_id = ANY($1) AND note NOT LIKE 'ev:%' ORDER BY job_id, attempt",
    [jobIds],
  );
  return rows;
}

/** The effect rows the consumers of queue `q` wrote (event ids repeat across queues). */
async function eventEffects(q: string): Promise<{ job_id: number; attempt: number; note: string }[]> {
  const { rows } = await conn.query(
    "SELECT job_id::int, attempt, note FROM effects WHERE note LIKE $1 ORDER BY job_id, attempt",
    [`ev:${q}:%`],
  );
  return rows;
}

const insertEffect = (tx: pg.ClientBase, job: Job, note: string): Promise<unknown> =>
  tx.query("INSERT INTO effects (job_id, attempt, note) VALUES ($1, $2, $3)", [job.id, job.attempt, note]);

test("a tx handler's effects and its completion commit together", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const ids = (await enqueueMany(conn, q, Array.from({ length: 20 }, (_, i): [string, unknown] => ["pay", { i }]))).map(
    (e) => e.jobId as number,
  );
  const bad = (await enqueue(conn, q, "pay_twice", {}, { maxAttempts: 1 })) as number;
  const seenInTx: boolean[] = [];
  const w = new Worker({ connection: cfg, queues: q, concurrency: 4, pollIntervalMs: 200, handleSignals: false })
    .handleTx("pay", async (job, tx) => {
      await insertEffect(tx, job, `pay:${job.id}`);
      // Not visible outside the transaction before the worker commits.
      const other = await conn.query("SELECT count(*)::int AS n FROM effects WHERE job_id = $1", [job.id]);
      seenInTx.push(other.rows[0].n === 0);
      return { paid: (job.args as { i: number }).i };
    })
    // Two rows with one note: the deferred unique constraint fails at COMMIT,
    // after complete() ran in the transaction. Both must roll back.
    .handleTx("pay_twice", async (job, tx) => {
      await insertEffect(tx, job, "twice");
      await insertEffect(tx, job, "twice");
    });
  const r = running(w);
  try {
    await waitUntil(
      async () => {
        const s = await jobStates(conn, q);
        return s.completed === 20 && s.failed === 1;
      },
      30_000,
      "every job finished",
      100,
    );
  } finally {
    await r.stop();
  }
  const rows = await effects(ids);
  assert.deepEqual(
    rows.map((e) => e.job_id),
    ids,
    "one effect row per completed job",
  );
  assert.ok(seenInTx.every(Boolean), "effects were invisible until the commit");
  const { rows: out } = await conn.query("SELECT output FROM pgque.get_job($1)", [ids[3]]);
  assert.deepEqual(out[0].output, { paid: 3 }, "the output is recorded by the same complete()");
  // The failed COMMIT took the completion with it: the job was failed, not completed.
  assert.deepEqual(await effects([bad]), []);
  const b = await getJob(conn, bad);
  assert.equal(b.state, "failed");
  assert.match(JSON.stringify(b.errors), /effects_note_key/);
  assert.equal(w.completed, 20);
});

test("a throwing tx handler rolls back its effects and fails the job", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const id = (await enqueue(conn, q, "boom", {}, { maxAttempts: 1 })) as number;
  const w = new Worker({ connection: cfg, queues: q, pollIntervalMs: 200, handleSignals: false }).handleTx(
    "boom",
    async (job, tx) => {
      await insertEffect(tx, job, `boom:${job.id}`);
      throw new Error("after the write");
    },
  );
  const r = running(w);
  try {
    await waitUntil(async () => (await jobStates(conn, q)).failed === 1, 30_000, "the failure", 100);
  } finally {
    await r.stop();
  }
  assert.deepEqual(await effects([id]), []);
  assert.match(JSON.stringify((await getJob(conn, id)).errors), /Error: after the write/);
  assert.equal(w.failed, 1);
});

test("a job cancelled mid-handler: complete() is refused, the effects vanish", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const id = (await enqueue(conn, q, "slow", {})) as number;
  const wrote = gate();
  const cancelled = gate();
  const w = new Worker({ connection: cfg, queues: q, pollIntervalMs: 200, handleSignals: false }).handleTx(
    "slow",
    async (job, tx) => {
      await insertEffect(tx, job, `slow:${job.id}`);
      wrote.open();
      await cancelled.promise;
      return { done: true };
    },
  );
  const r = running(w);
  try {
    await wrote.promise;
    const { rows } = await conn.query("SELECT pgque.cancel($1) AS ok", [id]);
    assert.equal(rows[0].ok, true);
    cancelled.open();
    await waitUntil(() => w.lost === 1, 10_000, "the refused completion");
  } finally {
    await r.stop();
  }
  assert.deepEqual(await effects([id]), [], "no application rows");
  const job = await getJob(conn, id);
  assert.equal(job.state, "cancelled");
  assert.equal(job.output, null);
  assert.equal(w.completed, 0);
});

test("a lease that lapsed mid-handler: the late completion is refused and leaves no rows", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const id = (await enqueue(conn, q, "slow", {})) as number;
  const firstWrote = gate();
  const rescued = gate();
  let firstSignal: AbortSignal | undefined;
  // A 1 s lease and no heartbeat before the rescue: the lease lapses while
  // attempt 1 waits; the server's rescue hands the job out again (attempt 2).
  const w = new Worker({
    connection: cfg,
    queues: q,
    concurrency: 2,
    leaseMs: 1000,
    heartbeatIntervalMs: 60_000,
    pollIntervalMs: 100,
    handleSignals: false,
  }).handleTx("slow", async (job, tx) => {
    await insertEffect(tx, job, `slow:${job.id}:${job.attempt}`);
    if (job.attempt === 1) {
      firstSignal = job.signal;
      firstWrote.open();
      await rescued.promise;
    }
    return { attempt: job.attempt };
  });
  const r = running(w);
  try {
    await firstWrote.promise;
    await sleep(1100);
    await conn.query("SELECT pgque.rescue_expired_leases()"); // or the background worker's next job_maint
    await waitUntil(async () => ((await getJob(conn, id)).attempt as number) >= 2, 10_000, "the rescue");
    rescued.open();
    await waitUntil(async () => (await getJob(conn, id)).state === "completed" && w.lost === 1, 15_000, "both outcomes");
  } finally {
    rescued.open();
    await r.stop();
  }
  assert.deepEqual(
    (await effects([id])).map((e) => e.attempt),
    [2],
    "only the attempt whose completion committed left rows",
  );
  const job = await getJob(conn, id);
  assert.deepEqual([job.state, job.attempt, job.output], ["completed", 2, { attempt: 2 }]);
  assert.equal(firstSignal?.aborted, true, "the refused attempt's signal aborted");
  assert.equal(w.completed, 1);
});

test("consumer txHandler: effects, nacks and the ack commit together", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  await conn.query("SELECT pgque.subscribe($1, 'c')", [q]);
  const ids = await sendBatch(conn, q, Array.from({ length: 10 }, (_, i) => ({ i })), { type: "t" });
  const c = new Consumer({
    connection: cfg,
    queue: q,
    consumer: "c",
    pollIntervalMs: 200,
    retryAfterMs: 0,
    handleSignals: false,
    txHandler: async (m, tx) => {
      await tx.query("INSERT INTO effects (job_id, attempt, note) VALUES ($1, $2, $3)", [
        m.msgId,
        m.retryCount ?? 0,
        `ev:${q}:${m.msgId}:${m.retryCount ?? 0}`,
      ]);
      if (m.json<{ i: number }>().i === 4 && m.retryCount === null) throw new Error("first delivery of 4 fails");
    },
  });
  const r = running(c);
  try {
    await waitUntil(async () => (await eventEffects(q)).length === 10, 30_000, "every event's effect", 100);
  } finally {
    await r.stop();
  }
  const rows = await eventEffects(q);
  assert.deepEqual(
    rows.map((e) => e.job_id),
    ids,
    "one row per event: the failed delivery's row was rolled back to its savepoint",
  );
  assert.equal(rows.find((e) => e.job_id === ids[4])?.attempt, 1, "event 4's row is from its retry");
  const { rows: info } = await conn.query("SELECT pending_events FROM pgque.get_consumer_info($1, 'c')", [q]);
  assert.equal(Number(info[0].pending_events), 0);
});

test("partitioned txHandler: a slot lease lost mid-batch rolls the batch's effects back", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  await conn.query("SELECT pgque.subscribe_partitioned($1, 'pc', 1)", [q]);
  const ids = await sendBatch(conn, q, [1, 2, 3, 4, 5].map((i) => ({ i })), { type: "t", partitionKeys: Array(5).fill("k") });
  const inFirst = gate();
  const goOn = gate();
  let calls = 0;
  const pc = new PartitionedConsumer({
    connection: cfg,
    queue: q,
    consumer: "pc",
    n: 1,
    ttlMs: 1000,
    pollIntervalMs: 200,
    workerId: "A",
    handleSignals: false,
    txHandler: async (m, tx) => {
      calls++;
      await tx.query("INSERT INTO effects (job_id, attempt, note) VALUES ($1, 0, $2)", [m.msgId, `ev:${q}:${m.msgId}`]);
      if (calls === 1) {
        inFirst.open();
        await goOn.promise; // past the 1 s lease, without renewing it
      }
    },
  });
  const r = running(pc);
  try {
    await conn.query("SELECT pgque.force_tick($1)", [q]);
    await inFirst.promise;
    await waitUntil(
      async () =>
        (await conn.query("SELECT lease_owner FROM pgque.partition_slot_status WHERE queue_name = $1", [q])).rows[0]
          .lease_owner === null,
      10_000,
      "A's lease to lapse",
    );
    const { rows } = await conn.query("SELECT pgque.claim_slot($1, 'pc', 0, 'thief', '60 seconds') AS epoch", [q]);
    assert.notEqual(rows[0].epoch, null);
    goOn.open();
    await waitUntil(() => pc.lostSlots >= 1, 10_000, "A to notice the take-over");
  } finally {
    goOn.open();
    await r.stop();
  }
  assert.deepEqual(await eventEffects(q), [], "no effects of the batch A lost");
  assert.ok(calls >= 1);
  const { rows } = await conn.query("SELECT msg_id FROM pgque.receive_partitioned($1, 'pc', 0, 1, 'thief', 100)", [q]);
  assert.deepEqual(
    rows.map((x) => Number(x.msg_id)),
    ids,
    "the new owner gets the whole batch again",
  );
});

test("under lapsing leases and terminated backends every completed job has exactly one run's effects", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const n = 240;
  const ids = (
    await enqueueMany(
      conn,
      q,
      Array.from({ length: n }, (_, i): [string, unknown] => ["pay", { slow: i % 40 === 7 }]),
    )
  ).map((e) => e.jobId as number);
  const app = `eo_${q}`;
  const quiet = { warn: () => undefined, error: () => undefined };
  // No heartbeats and a 1.5 s lease: the slow runs (1 in 40) lose their lease
  // to the rescue and run again while the first run still holds its transaction.
  const workers = [0, 1].map(() =>
    new Worker({
      connection: { ...cfg, application_name: app },
      queues: q,
      concurrency: 4,
      leaseMs: 1500,
      heartbeatIntervalMs: 60_000,
      pollIntervalMs: 200,
      handleSignals: false,
      logger: quiet,
    }).handleTx("pay", async (job, tx) => {
      await insertEffect(tx, job, `eo:${job.id}:${job.attempt}`);
      await sleep((job.args as { slow: boolean }).slow && job.attempt === 1 ? 2500 : Math.random() * 10);
      return { attempt: job.attempt };
    }),
  );
  const runs = workers.map((w) => running(w));
  try {
    // Terminate every backend of both workers (dispatch, control, LISTEN,
    // handler transactions) three times while they work.
    for (let i = 0; i < 3; i++) {
      await sleep(700);
      await conn.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", [app]);
    }
    await waitUntil(async () => (await jobStates(conn, q)).completed === n, 90_000, "every job completed", 200);
  } finally {
    await Promise.all(runs.map((r) => r.stop()));
  }
  const { rows } = await conn.query(
    "SELECT j.id::int AS id, j.attempt, j.output, count(e.*)::int AS rows, max(e.attempt) AS effect_attempt " +
      "FROM pgque.all_jobs j LEFT JOIN effects e ON e.job_id = j.id WHERE j.queue = $1 GROUP BY 1, 2, 3",
    [q],
  );
  assert.equal(rows.length, n);
  for (const r of rows) {
    assert.equal(r.rows, 1, `job ${r.id}: one run's effects, got ${r.rows}`);
    assert.equal(r.effect_attempt, r.attempt, `job ${r.id}: the effects of the run that completed it`);
    assert.deepEqual(r.output, { attempt: r.attempt });
  }
  assert.ok(
    rows.some((r) => r.attempt > 1),
    "some runs lost their lease (or their connection) and ran again",
  );
  assert.ok(workers[0]!.lost + workers[1]!.lost >= 1, "refused completions were rolled back");
  assert.deepEqual(
    rows.map((r) => r.id).sort((a, b) => a - b),
    ids,
  );
});

test("partitioned txHandler under terminated backends: each event's effects exactly once, keys in order", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  await conn.query("SELECT pgque.subscribe_partitioned($1, 'pc', 4)", [q]);
  const keys = Array.from({ length: 20 }, (_, k) => `key-${k}`);
  const ids: number[] = [];
  for (let round = 0; round < 10; round++) {
    ids.push(...(await sendBatch(conn, q, keys.map((k) => ({ k, round })), { type: "t", partitionKeys: keys })));
  }
  const app = `pc_${q}`;
  const pc = new PartitionedConsumer({
    connection: { ...cfg, application_name: app },
    queue: q,
    consumer: "pc",
    n: 4,
    workers: 2,
    batchSize: 10,
    pollIntervalMs: 200,
    handleSignals: false,
    logger: { warn: () => undefined, error: () => undefined },
    txHandler: async (m, tx) => {
      await tx.query("INSERT INTO effects (job_id, attempt, note) VALUES ($1, $2, $3)", [
        m.msgId,
        0,
        `ev:${q}:${m.msgId}:${randomUUID()}`, // a second commit would be a second row
      ]);
      await sleep(2);
    },
  });
  const r = running(pc);
  try {
    await conn.query("SELECT pgque.force_tick($1)", [q]);
    for (let i = 0; i < 2; i++) {
      await sleep(150);
      const { rows: killed } = await conn.query(
        "SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE application_name = $1",
        [app],
      );
      if (i === 0) assert.ok(killed[0].n >= 3, `both loops and the listener terminated (${killed[0].n})`);
    }
    // Well within the 30 s slot TTL: a loop that lost its connection claims its
    // slot again at once instead of leaving it (and its open batch) to lapse.
    await waitUntil(async () => (await eventEffects(q)).length >= ids.length, 20_000, "every event's effect", 200);
    await sleep(300); // a duplicate would show up now
  } finally {
    await r.stop();
  }
  // One row per event: each batch's effects committed once, with its ack.
  const rows = await eventEffects(q);
  assert.deepEqual(
    rows.map((e) => e.job_id),
    ids,
  );
});

test("heartbeats keep a long tx handler's lease; a drain past the timeout rolls its effects back", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const long = (await enqueue(conn, q, "long", {})) as number;
  const w = new Worker({
    connection: cfg,
    queues: q,
    leaseMs: 1500,
    heartbeatIntervalMs: 300,
    pollIntervalMs: 200,
    shutdownTimeoutMs: 500,
    handleSignals: false,
  })
    .handleTx("long", async (job, tx) => {
      await insertEffect(tx, job, `long:${job.id}`);
      await sleep(3500); // more than twice the lease, in the open transaction
      return { ok: job.cancelled === false };
    })
    .handleTx("stuck", async (job, tx) => {
      await insertEffect(tx, job, `stuck:${job.id}`);
      await sleep(2500); // past the shutdown timeout: handed back meanwhile
    });
  const r = running(w);
  let stuck = 0;
  try {
    await waitUntil(async () => (await getJob(conn, long)).state === "completed", 20_000, "the long job", 100);
    stuck = (await enqueue(conn, q, "stuck", {})) as number;
    await waitUntil(async () => (await getJob(conn, stuck)).state === "running", 10_000, "the stuck job running");
    await sleep(200);
  } finally {
    await r.stop(); // returns after the 0.5 s timeout; the handler is still in its transaction
  }
  assert.deepEqual((await getJob(conn, long)).output, { ok: true });
  assert.deepEqual(
    (await effects([long])).map((e) => e.attempt),
    [1],
  );
  assert.equal(w.handedBack, 1);
  assert.ok(["ready", "scheduled"].includes((await getJob(conn, stuck)).state as string));
  // The handed-back handler finishes later: its complete() is refused, its effects roll back.
  await waitUntil(() => w.lost === 1, 10_000, "the handed-back run's refused completion");
  assert.deepEqual(await effects([stuck]), []);
});
