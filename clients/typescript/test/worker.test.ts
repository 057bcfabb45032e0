/** The job worker against a real server: concurrency, exactly one run per
 * job, retries, heartbeats, LISTEN wake-ups, outputs and progress, drain on
 * abort and on SIGTERM. */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import pg from "pg";

import { UndefinedObject, Worker, enqueue, enqueueMany, type Job } from "../src/index.js";
import { client, freshDatabase, gate, getJob, jobStates, sleep, uniq, waitUntil } from "./helpers.js";

let cfg: pg.ClientConfig;
let conn: pg.Client;

before(async () => {
  cfg = await freshDatabase("pgque_ts_worker");
  conn = await client(cfg);
});
after(async () => {
  await conn.end();
});

/** Starts `worker.run()`; the returned stop() aborts it and waits for the drain. */
function running(worker: Worker): { stop: () => Promise<void>; done: Promise<void> } {
  const ac = new AbortController();
  const done = worker.run({ signal: ac.signal });
  done.catch(() => undefined);
  return {
    done,
    stop: async () => {
      ac.abort();
      await done;
    },
  };
}

test("two workers of 4 run 200 jobs, each exactly once, 8 at a time", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const n = 200;
  await enqueueMany(conn, q, Array.from({ length: n }, (_, i): [string, unknown] => ["work", { i }]));
  const seen = new Map<number, number>();
  let active = 0;
  let maxActive = 0;
  const work = async (job: Job): Promise<unknown> => {
    seen.set(job.id, (seen.get(job.id) ?? 0) + 1);
    active++;
    maxActive = Math.max(maxActive, active);
    await sleep(20);
    active--;
    return { i: (job.args as { i: number }).i };
  };
  const workers = [0, 1].map(
    () => new Worker({ connection: cfg, queues: [q], concurrency: 4, pollIntervalMs: 200, handleSignals: false }),
  );
  const runs = workers.map((w) => running(w.handle("work", work)));
  try {
    await waitUntil(async () => (await jobStates(conn, q)).completed === n, 60_000, "every job completed", 100);
  } finally {
    await Promise.all(runs.map((r) => r.stop()));
  }
  assert.equal(seen.size, n);
  assert.deepEqual(new Set(seen.values()), new Set([1]), "no job ran twice");
  assert.equal(maxActive, 8, "8 handlers at once");
  assert.equal(workers[0]!.completed + workers[1]!.completed, n);
  const { rows } = await conn.query(
    "SELECT count(*)::int AS n FROM pgque.all_jobs WHERE queue = $1 AND output = jsonb_build_object('i', (args->>'i')::int)",
    [q],
  );
  assert.equal(rows[0].n, n, "every job's return value is its output");
});

test("a failing handler is retried; the error and its stack are recorded", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const flaky = (await enqueue(conn, q, "flaky", {})) as number;
  const doomed = (await enqueue(conn, q, "doomed", {}, { maxAttempts: 1 })) as number;
  const orphan = (await enqueue(conn, q, "no_handler_for_this", {}, { maxAttempts: 1 })) as number;
  const attempts = new Map<number, number[]>();
  const note = (job: Job): void => void attempts.set(job.id, [...(attempts.get(job.id) ?? []), job.attempt]);
  const w = new Worker({ connection: cfg, queues: q, concurrency: 2, pollIntervalMs: 200, handleSignals: false })
    .handle("flaky", (job) => {
      note(job);
      if (job.attempt === 1) throw new RangeError("boom on the first attempt");
      return "ok";
    })
    .handle("doomed", (job) => {
      note(job);
      throw new Error("always");
    });
  const r = running(w);
  try {
    // The retry waits for the server's backoff (about a second).
    await waitUntil(
      async () => {
        const s = await jobStates(conn, q);
        return s.completed === 1 && s.failed === 2;
      },
      30_000,
      "the retry and the failures",
      200,
    );
  } finally {
    await r.stop();
  }
  assert.deepEqual(attempts.get(flaky), [1, 2]);
  assert.deepEqual(attempts.get(doomed), [1]);
  const errs = JSON.stringify((await getJob(conn, flaky)).errors);
  assert.match(errs, /RangeError: boom on the first attempt/);
  assert.match(errs, /worker\.test\.js/, "the stack is recorded");
  const o = await getJob(conn, orphan);
  assert.equal(o.state, "failed");
  assert.match(JSON.stringify(o.errors), /no handler for job kind/);
  assert.equal((await getJob(conn, flaky)).output, "ok");
  assert.equal(w.failed, 3);
});

test("heartbeats keep a handler longer than its lease alive", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const id = (await enqueue(conn, q, "long", {})) as number;
  const runs: number[] = [];
  const w = new Worker({
    connection: cfg,
    queues: q,
    concurrency: 2,
    leaseMs: 2000,
    heartbeatIntervalMs: 400,
    pollIntervalMs: 200,
    handleSignals: false,
  }).handle("long", async (job) => {
    runs.push(job.attempt);
    await sleep(4500); // more than twice the lease
    assert.equal(job.cancelled, false);
  });
  const r = running(w);
  try {
    await waitUntil(async () => (await jobStates(conn, q)).completed === 1, 30_000, "completion", 100);
  } finally {
    await r.stop();
  }
  assert.deepEqual(runs, [1]);
  const job = await getJob(conn, id);
  assert.deepEqual([job.state, job.attempt], ["completed", 1]);
});

test("an idle worker is woken by the enqueue's NOTIFY, not its poll", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const got = new Map<number, number>();
  const w = new Worker({ connection: cfg, queues: q, concurrency: 1, pollIntervalMs: 60_000, handleSignals: false });
  w.handle("ping", (job) => void got.set((job.args as { i: number }).i, Date.now()));
  const r = running(w);
  const lat: number[] = [];
  try {
    await sleep(800); // idle: the worker sleeps on its 60 s poll
    for (let i = 0; i < 3; i++) {
      const t0 = Date.now();
      await enqueue(conn, q, "ping", { i });
      await waitUntil(() => got.has(i), 10_000, `job ${i} handled`, 5);
      lat.push((got.get(i) as number) - t0);
      await sleep(200);
    }
  } finally {
    await r.stop();
  }
  assert.ok(Math.max(...lat) < 5_000, `wake-up latencies ${lat.join(", ")} ms`);
});

test("outputs and progress", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const id = (await enqueue(conn, q, "calc", { x: 20 })) as number;
  let progressed: boolean | undefined;
  const w = new Worker({ connection: cfg, queues: q, pollIntervalMs: 200, handleSignals: false }).handle("calc", async (job) => {
    progressed = await job.progress({ pct: 50 });
    return { y: (job.args as { x: number }).x * 2 };
  });
  const r = running(w);
  try {
    await waitUntil(async () => (await jobStates(conn, q)).completed === 1, 30_000, "completion", 100);
  } finally {
    await r.stop();
  }
  assert.equal(progressed, true);
  const job = await getJob(conn, id);
  assert.deepEqual(job.output, { y: 40 });
  assert.deepEqual(job.progress, { pct: 50 });
});

test("abort drains: running handlers finish, jobs past the timeout are handed back", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const quick = (await enqueue(conn, q, "quick", {})) as number;
  const stuck = (await enqueue(conn, q, "stuck", {})) as number;
  const quickStarted = gate();
  const stuckStarted = gate();
  const release = gate();
  let stuckSignal: AbortSignal | undefined;
  let dispatchedAfterAbort = 0;
  let aborted = false;
  const w = new Worker({
    connection: cfg,
    queues: q,
    concurrency: 2,
    pollIntervalMs: 200,
    shutdownTimeoutMs: 1500,
    handleSignals: false,
  })
    .handle("quick", async () => {
      if (aborted) dispatchedAfterAbort++;
      quickStarted.open();
      await sleep(700); // finishes within the shutdown timeout
      return { quick: true };
    })
    .handle("stuck", async (job) => {
      if (aborted) dispatchedAfterAbort++;
      stuckSignal = job.signal;
      stuckStarted.open();
      await release.promise; // past the timeout
    });
  const r = running(w);
  await Promise.all([quickStarted.promise, stuckStarted.promise]);
  const late = (await enqueue(conn, q, "quick", {})) as number;
  aborted = true;
  const t0 = Date.now();
  await r.stop();
  const took = Date.now() - t0;
  release.open();
  assert.ok(took >= 1400 && took < 10_000, `drain took ${took} ms`);
  assert.equal(dispatchedAfterAbort, 0, "nothing is dispatched after the abort");
  assert.equal((await getJob(conn, quick)).state, "completed", "a running handler's outcome is reported");
  assert.equal(stuckSignal?.aborted, true, "the handed-back job's signal aborts");
  const s = await getJob(conn, stuck);
  assert.ok(["ready", "scheduled"].includes(s.state as string), `handed back: ${String(s.state)}`);
  assert.equal((await getJob(conn, late)).state, "ready");
  assert.equal(w.handedBack, 1);
  assert.equal((await jobStates(conn, q)).running, undefined, "nothing left running");

  // Handed back: the next worker takes it at once, the attempt was not consumed.
  const again: number[] = [];
  const w2 = new Worker({ connection: cfg, queues: q, concurrency: 2, pollIntervalMs: 200, handleSignals: false })
    .handle("stuck", (job) => void again.push(job.attempt))
    .handle("quick", () => undefined);
  const r2 = running(w2);
  try {
    await waitUntil(async () => (await jobStates(conn, q)).completed === 3, 30_000, "the rest done", 100);
  } finally {
    await r2.stop();
  }
  assert.deepEqual(again, [1]);
});

test("SIGTERM mid-batch drains the worker process and loses nothing", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const n = 40;
  const ids = (await enqueueMany(conn, q, Array.from({ length: n }, (_, i): [string, unknown] => ["slow", { i }]))).map(
    (e) => e.jobId as number,
  );
  const handled = async (): Promise<number> =>
    (await conn.query("SELECT count(*)::int AS n FROM handled WHERE job_id = ANY($1)", [ids])).rows[0].n as number;
  const script = fileURLToPath(new URL("./sigterm_worker.js", import.meta.url));
  const child = spawn(process.execPath, [script, JSON.stringify(cfg), q], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
  await waitUntil(() => out.includes("ready"), 20_000, "the worker process to start");
  await waitUntil(async () => (await handled()) >= 6, 30_000, "some jobs handled", 20);
  const runningBefore = (await jobStates(conn, q)).running ?? 0;
  child.kill("SIGTERM");
  const [code] = (await once(child, "exit")) as [number | null];
  assert.equal(code, 0, out);
  assert.match(out, /stopped completed=\d+/);
  assert.ok(runningBefore > 0, "SIGTERM came mid-batch");
  const st = await jobStates(conn, q);
  assert.equal(st.running, undefined, `drained: nothing left running (${JSON.stringify(st)})`);
  const doneFirst = await handled();
  assert.equal(st.completed ?? 0, doneFirst, "every job a handler finished is completed");
  assert.ok(doneFirst < n);
  assert.equal(Number(/completed=(\d+)/.exec(out)?.[1]), doneFirst);

  // A new worker does the rest; every job ran exactly once.
  const w = new Worker({ connection: cfg, queues: q, concurrency: 4, pollIntervalMs: 200, handleSignals: false });
  const c2 = await client(cfg);
  w.handle("slow", async (job) => {
    await c2.query("INSERT INTO handled (job_id) VALUES ($1)", [job.id]);
  });
  const r = running(w);
  try {
    await waitUntil(async () => (await jobStates(conn, q)).completed === n, 30_000, "every job completed", 100);
  } finally {
    await r.stop();
    await c2.end();
  }
  const { rows } = await conn.query(
    "SELECT job_id, count(*)::int AS n FROM handled WHERE job_id = ANY($1) GROUP BY job_id",
    [ids],
  );
  assert.equal(rows.length, n);
  assert.ok(rows.every((row) => row.n === 1), "no job handled twice");
});

test("an unknown queue is a typed error from run()", async () => {
  const w = new Worker({ connection: cfg, queues: [`no_such_${uniq()}`], handleSignals: false });
  await assert.rejects(w.run(), UndefinedObject);
});

test("a cancelled job's signal aborts at the next heartbeat; its completion is refused", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const id = (await enqueue(conn, q, "long", {})) as number;
  const started = gate();
  let sawAbort = false;
  const w = new Worker({
    connection: cfg,
    queues: q,
    heartbeatIntervalMs: 200,
    pollIntervalMs: 200,
    handleSignals: false,
  }).handle("long", async (job) => {
    started.open();
    await new Promise<void>((resolve) => job.signal.addEventListener("abort", () => resolve(), { once: true }));
    sawAbort = job.cancelled;
    return { late: true };
  });
  const r = running(w);
  try {
    await started.promise;
    await conn.query("SELECT pgque.cancel($1)", [id]);
    await waitUntil(() => w.lost === 1, 10_000, "the refused completion");
  } finally {
    await r.stop();
  }
  assert.equal(sawAbort, true);
  const job = await getJob(conn, id);
  assert.deepEqual([job.state, job.output], ["cancelled", null]);
  assert.equal(w.completed, 0);
});

test("the worker survives its backends being terminated (dispatch, control, LISTEN)", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const done = new Set<number>();
  const w = new Worker({
    connection: { ...cfg, application_name: `w_${q}` },
    queues: q,
    concurrency: 2,
    heartbeatIntervalMs: 200,
    pollIntervalMs: 500,
    handleSignals: false,
    logger: { warn: () => undefined, error: () => undefined },
  }).handle("k", async (job) => {
    await sleep(300); // running while its worker's backends go
    done.add(job.id);
  });
  const r = running(w);
  const kill = async (): Promise<number> =>
    (
      await conn.query(
        "SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE application_name = $1",
        [`w_${q}`],
      )
    ).rows[0].n as number;
  try {
    const first = (await enqueueMany(conn, q, [["k", {}], ["k", {}]])).map((e) => e.jobId as number);
    await waitUntil(async () => (await jobStates(conn, q)).running === 2, 10_000, "both jobs running");
    assert.ok((await kill()) >= 3, "dispatch, control and LISTEN connections terminated");
    await waitUntil(async () => (await jobStates(conn, q)).completed === 2, 15_000, "the running jobs' completions");
    assert.deepEqual([...done].sort(), first.sort());
    // New connections: the NOTIFY of a new job reaches it again, its outcome is sent.
    await sleep(1500);
    const later = (await enqueue(conn, q, "k", {})) as number;
    await waitUntil(async () => (await getJob(conn, later)).state === "completed", 15_000, "a job after the kill");
  } finally {
    await r.stop();
  }
});
