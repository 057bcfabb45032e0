// One cell of the client benchmark (benches/clients/run.sh) for a Node system,
// on the server run.sh starts. Prints one JSON line.
//
//   node bench_node.mjs SYSTEM SOCKETDIR PORT DB drain N
//   node bench_node.mjs SYSTEM SOCKETDIR PORT DB rate RATE SECS
//   node bench_node.mjs pgque_ts SOCKETDIR PORT DB eo noop|plain|tx N
//
// SYSTEM:
//   pgque_ts   the pgque TypeScript client's Worker (clients/typescript/dist, built
//              by run.sh): concurrency 50, dispatch batches of up to 50, LISTEN
//              plus a 0.5 s poll fallback, completions batched
//   graphile   graphile-worker (npm): concurrentJobs 50, localQueue.size 50 (batch
//              fetch), completeJobBatchDelay 0 (batched completions), LISTEN plus
//              pollInterval 0.5 s, maxPoolSize 52
//   pgboss1 / pgboss10
//              pg-boss (npm): 1 or 10 work() loops, batchSize 50 each,
//              pollingIntervalSeconds 0.5 (its minimum; pg-boss 10 has no LISTEN
//              and no in-process concurrency knob)
//
// rate: a producer in another process enqueues RATE jobs/s for SECS s, each
// job's data carrying {t: wall-clock seconds just before its enqueue}; each
// handler records (its start - t). pgque_ts and graphile use produce.py
// (SQL pgque.enqueue / graphile_worker.add_job, the same producer as the
// Python and Rust cells); pg-boss uses its own send() from a child process of
// this file (`produce-pgboss`).
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import path from "node:path";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const CONC = 50;
const POLL_MS = 500;
const K = 8; // producer connections, as produce.py
const now = () => (performance.timeOrigin + performance.now()) / 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const [system, host, portStr, database, mode, ...rest] = process.argv.slice(2);
const port = parseInt(portStr, 10);
const conn = { host, port, database, user: "postgres" };
const connString = `postgres://postgres@/${database}?host=${encodeURIComponent(host)}&port=${port}`;
const dsn = `host=${host} port=${port} dbname=${database} user=postgres`;
const LABEL = {
  pgque_ts: "pgque Worker (TypeScript)",
  graphile: "graphile-worker (Node)",
  pgboss1: "pg-boss (Node, 1 work loop)",
  pgboss10: "pg-boss (Node, 10 work loops)",
};

function quantiles(lat) {
  lat.sort((a, b) => a - b);
  const q = (f) => (lat.length ? Math.round(lat[Math.min(lat.length - 1, Math.floor(lat.length * f))] * 100_000) / 100 : null);
  return { p50_ms: q(0.5), p99_ms: q(0.99) };
}

/** Starts the producer process; resolves to its JSON line when it exits. */
function producer(kind, queue, rate, secs) {
  const [cmd, args] =
    kind === "pgboss"
      ? [process.execPath, [fileURLToPath(import.meta.url), "produce-pgboss", host, portStr, database, "rate", String(rate), String(secs), queue]]
      : [process.env.BENCH_PYTHON || "python3", [path.join(HERE, "produce.py"), kind, dsn, queue, String(rate), String(secs)]];
  const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  return new Promise((resolve, reject) =>
    child.on("exit", (code) => (code === 0 ? resolve(JSON.parse(out.trim().split("\n").pop())) : reject(new Error(`producer exited ${code}`)))),
  );
}

function rateLine(rate, lat, p) {
  return {
    system: LABEL[system],
    mode: "rate",
    target: rate,
    achieved: p.rate,
    sent: p.sent,
    received: lat.length,
    ...quantiles(lat),
    enqueue_ms_p50: p.enqueue_ms_p50,
  };
}

function drainLine(n, secs, handler) {
  const l = { system: LABEL[system], mode: handler ? "eo" : "drain", jobs: n, secs: +secs.toFixed(3), jobs_per_s: Math.round(n / secs) };
  if (handler) l.handler = handler;
  return l;
}

// ---- pgque TypeScript Worker ---------------------------------------------------
async function pgqueTs() {
  const { Worker, enqueueMany } = await import("../../clients/typescript/dist/src/index.js");
  const pg = (await import("pg")).default;
  const c = new pg.Client(conn);
  await c.connect();
  const queue = `bench_ts_${Math.random().toString(16).slice(2, 10)}`;
  await c.query("SELECT pgque.create_job_queue($1)", [queue]);
  const worker = new Worker({ connection: conn, queues: [queue], concurrency: CONC, pollIntervalMs: POLL_MS, handleSignals: false });
  if (mode === "rate") {
    const rate = parseFloat(rest[0]);
    const secs = parseFloat(rest[1]);
    const n = Math.floor(rate * secs);
    const lat = [];
    worker.handle("noop", (job) => {
      if (job.args.t === undefined) return; // the producer's warm-up job
      lat.push(now() - job.args.t);
      if (lat.length === n) worker.stop();
    });
    const prod = producer("pgque", queue, rate, secs);
    const guard = setTimeout(() => worker.stop(), (secs + 60) * 1000);
    await worker.run();
    clearTimeout(guard);
    const line = rateLine(rate, lat, await prod);
    await c.end();
    return line;
  }
  const handler = mode === "eo" ? rest[0] : "noop";
  const n = parseInt(mode === "eo" ? rest[1] : rest[0], 10);
  for (let i = 0; i < n; i += 1000) {
    const jobs = [];
    for (let j = i; j < Math.min(n, i + 1000); j++) jobs.push(["noop", { i: j }]);
    await enqueueMany(c, queue, jobs);
  }
  if (handler !== "noop") await c.query("CREATE TABLE IF NOT EXISTS bench_effects (queue text NOT NULL, job_id bigint NOT NULL)");
  let done = 0;
  const count = () => {
    if (++done === n) worker.stop();
  };
  const EFFECTS = "INSERT INTO bench_effects (queue, job_id) VALUES ($1, $2)";
  // The plain handler's own connections: up to CONC, opened on first need (as the worker's tx pool).
  const pool = handler === "plain" ? new pg.Pool({ ...conn, max: CONC }) : undefined;
  if (handler === "tx") {
    worker.handleTx("noop", async (job, tx) => {
      await tx.query(EFFECTS, [queue, job.id]);
      count();
    });
  } else if (handler === "plain") {
    worker.handle("noop", async (job) => {
      await pool.query(EFFECTS, [queue, job.id]);
      count();
    });
  } else {
    worker.handle("noop", () => count());
  }
  const t0 = process.hrtime.bigint();
  await worker.run(); // resolves after the last completion was sent
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  await pool?.end();
  const { rows } = await c.query("SELECT count(*)::int AS n FROM pgque.all_jobs WHERE queue = $1 AND state <> 'completed'", [queue]);
  if (rows[0].n !== 0) throw new Error(`${rows[0].n} jobs not completed`);
  if (handler !== "noop") {
    const r = await c.query("SELECT count(*)::int AS n, count(DISTINCT job_id)::int AS d FROM bench_effects WHERE queue = $1", [queue]);
    if (r.rows[0].n !== n || r.rows[0].d !== n) throw new Error(`effects ${JSON.stringify(r.rows[0])}, want ${n}`);
  }
  await c.end();
  return drainLine(n, secs, mode === "eo" ? handler : undefined);
}

// ---- graphile-worker ---------------------------------------------------------------
async function graphile() {
  const { run, makeWorkerUtils } = await import("graphile-worker");
  const preset = {
    worker: {
      connectionString: connString,
      concurrentJobs: CONC,
      maxPoolSize: CONC + 2,
      pollInterval: POLL_MS,
      localQueue: { size: CONC },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
    },
  };
  const logger = new (await import("graphile-worker")).Logger(() => () => undefined);
  const utils = await makeWorkerUtils({ connectionString: connString, logger });
  await utils.migrate();
  await utils.withPgClient((pc) => pc.query("DELETE FROM graphile_worker._private_jobs"));
  let done = 0;
  let resolveDone;
  const finished = new Promise((r) => (resolveDone = r));
  if (mode === "rate") {
    const rate = parseFloat(rest[0]);
    const secs = parseFloat(rest[1]);
    const n = Math.floor(rate * secs);
    const lat = [];
    const runner = await run({
      preset,
      logger,
      noHandleSignals: true,
      taskList: {
        noop: async (payload) => {
          if (payload.t === undefined) return; // the producer's warm-up job
          lat.push(now() - payload.t);
          if (lat.length === n) resolveDone();
        },
      },
    });
    const prod = producer("graphile", "noop", rate, secs);
    const guard = setTimeout(resolveDone, (secs + 60) * 1000);
    await finished;
    clearTimeout(guard);
    await runner.stop();
    const line = rateLine(rate, lat, await prod);
    await utils.release();
    return line;
  }
  const n = parseInt(rest[0], 10);
  for (let i = 0; i < n; i += 1000) {
    const specs = [];
    for (let j = i; j < Math.min(n, i + 1000); j++) specs.push({ identifier: "noop", payload: { i: j } });
    await utils.addJobs(specs);
  }
  const t0 = process.hrtime.bigint();
  const runner = await run({
    preset,
    logger,
    noHandleSignals: true,
    taskList: {
      noop: async () => {
        if (++done === n) resolveDone();
      },
    },
  });
  await finished;
  // Completions are batched after the handler returns: wait until the table is empty
  // (graphile-worker deletes a job when it completes).
  for (;;) {
    const { rows } = await utils.withPgClient((pc) => pc.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs"));
    if (rows[0].n === 0) break;
    await sleep(5);
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  await runner.stop();
  await utils.release();
  return drainLine(n, secs);
}

// ---- pg-boss ---------------------------------------------------------------------------
async function pgboss(loops) {
  const PgBoss = (await import("pg-boss")).default;
  const boss = new PgBoss({ ...conn, max: 4 + loops });
  boss.on("error", (e) => console.error(e));
  await boss.start();
  // A queue of its own per cell: a rate cell stops without completing its
  // last fetched batch, which must not count in a later cell's backlog.
  const queue = `bench_${Math.random().toString(16).slice(2, 10)}`;
  await boss.createQueue(queue);
  const work = (fn) => {
    for (let l = 0; l < loops; l++) boss.work(queue, { batchSize: 50, pollingIntervalSeconds: POLL_MS / 1000 }, fn);
  };
  if (mode === "rate") {
    const rate = parseFloat(rest[0]);
    const secs = parseFloat(rest[1]);
    const n = Math.floor(rate * secs);
    const lat = [];
    let resolveDone;
    const finished = new Promise((r) => (resolveDone = r));
    work(async (jobs) => {
      const t = now();
      for (const j of jobs) if (j.data.t !== undefined) lat.push(t - j.data.t); // not the warm-up jobs
      if (lat.length >= n) resolveDone();
    });
    const prod = producer("pgboss", queue, rate, secs);
    const guard = setTimeout(resolveDone, (secs + 60) * 1000);
    await finished;
    clearTimeout(guard);
    const line = rateLine(rate, lat, await prod);
    await boss.stop({ graceful: false, wait: false });
    return line;
  }
  const n = parseInt(rest[0], 10);
  for (let i = 0; i < n; i += 1000) {
    const jobs = [];
    for (let j = i; j < Math.min(n, i + 1000); j++) jobs.push({ name: queue, data: { i: j } });
    await boss.insert(jobs);
  }
  let done = 0;
  const t0 = process.hrtime.bigint();
  await new Promise((resolve) =>
    work(async (jobs) => {
      done += jobs.length;
      if (done >= n) setImmediate(resolve);
    }),
  );
  // The last batch is completed after the handler returns: wait for it.
  for (;;) {
    const left = await boss.getQueueSize(queue, { before: "completed" });
    if (left === 0) break;
    await sleep(5);
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  await boss.stop({ graceful: false, wait: false });
  return drainLine(n, secs);
}

/** The pg-boss producer (a child process of a pgboss rate cell): send() at a fixed rate. */
async function producePgboss() {
  const [rateS, secsS, queue] = rest;
  const rate = parseFloat(rateS);
  const n = Math.floor(rate * parseFloat(secsS));
  const PgBoss = (await import("pg-boss")).default;
  const boss = new PgBoss({ ...conn, max: K, supervise: false, schedule: false });
  await boss.start();
  // One warm-up job per loop's connection (no t: the handler skips it), as produce.py.
  await Promise.all(Array.from({ length: K }, () => boss.send(queue, { i: -1 })));
  await sleep(1000); // the worker is up
  const took = [];
  const t0 = now();
  // K loops share the schedule (job i is sent by loop i mod K), as produce.py's connections.
  const loop = async (k) => {
    for (let i = k; i < n; i += K) {
      const d = t0 + i / rate - now();
      if (d > 0) await sleep(d * 1000);
      const t = now();
      await boss.send(queue, { t, i });
      took.push(now() - t);
    }
  };
  await Promise.all(Array.from({ length: K }, (_, k) => loop(k)));
  const secs = now() - t0;
  took.sort((a, b) => a - b);
  await boss.stop({ graceful: false, wait: false });
  return {
    sent: n,
    secs: +secs.toFixed(3),
    rate: Math.round(n / secs),
    enqueue_ms_p50: Math.round(took[Math.floor(n / 2)] * 1e6) / 1000,
    enqueue_ms_p99: Math.round(took[Math.floor(n * 0.99)] * 1e6) / 1000,
  };
}

const main = {
  pgque_ts: pgqueTs,
  graphile,
  pgboss1: () => pgboss(1),
  pgboss10: () => pgboss(10),
  "produce-pgboss": producePgboss,
}[system];
main()
  .then((line) => {
    console.log(JSON.stringify(line));
    process.exit(0);
  })
  .catch((e) => {
    console.error(e);
    process.exit(1);
  });
