/**
 * The job worker: dispatch in batches, run async handlers, heartbeat,
 * complete or fail, and drain gracefully on stop() / AbortSignal / SIGTERM.
 *
 * Connections of a running Worker:
 *
 * - the dispatch connection: `pgque.dispatch` of up to the free handler
 *   slots (one statement), then a wait for a NOTIFY, a freed slot, or the poll
 *   interval;
 * - a LISTEN connection (listen.ts) on `pgque.job_channel(queue)` of each queue;
 * - the control connection: the finished jobs of each moment in one
 *   `complete_many` (with outputs where the server takes them), each failure
 *   as `fail` with the error and its stack, heartbeats of the running jobs
 *   every `heartbeatIntervalMs`, progress reports;
 * - for transactional handlers ({@link Worker.handleTx}) a pool of up to
 *   `concurrency` connections, one per running handler, each holding the
 *   handler's transaction.
 */
import { hostname } from "node:os";

import pg from "pg";

import { ServerFeatureMissing, isConnectionError, translateError } from "./errors.js";
import { features, type Features } from "./features.js";
import { Listener } from "./listen.js";
import { processSpan } from "./otel.js";
import {
  closeQuietly,
  connect,
  consoleLogger,
  onSignals,
  query,
  secs,
  shortId,
  sleep,
  toId,
  Waker,
  type ConnectionOptions,
  type Logger,
} from "./util.js";

/** A handler: gets the job, returns its output (any JSON value; undefined or
 * null: none) or throws to fail it. */
export type JobHandler = (job: Job) => unknown;

/** A transactional (exactly-once) handler: writes its effects through `tx`,
 * a transaction the worker opened; the worker completes the job in that
 * same transaction and commits, or rolls everything back. */
export type TxJobHandler = (job: Job, tx: pg.PoolClient) => unknown;

/** Options of {@link Worker}. Durations are in milliseconds. */
export interface WorkerOptions {
  /** How to connect: a connection string or a `pg.ClientConfig`. */
  connection: ConnectionOptions;
  /** The job queues to work on. */
  queues: string | string[];
  /** Handlers running at once (default 10). */
  concurrency?: number;
  /** Most jobs per dispatch (default: concurrency; never more than the free slots). */
  batchSize?: number;
  /** The lease asked of dispatch and renewed by heartbeats (default 60 s). */
  leaseMs?: number;
  /** How often running jobs' leases are renewed (default leaseMs / 3). */
  heartbeatIntervalMs?: number;
  /** The fallback poll when no NOTIFY comes (default 2 s). */
  pollIntervalMs?: number;
  /** How long a stop waits for running handlers before it hands their jobs
   * back (default 30 s). */
  shutdownTimeoutMs?: number;
  /** The worker name given to dispatch (default host-pid-random). */
  workerId?: string;
  /** Drain on SIGTERM / SIGINT while run() runs (default true). */
  handleSignals?: boolean;
  /** Where warnings of the background loops go (default console). */
  logger?: Logger;
}

interface JobRow {
  job_id: unknown;
  queue: string;
  kind: string;
  args: unknown;
  priority: number;
  attempt: number;
  max_attempts: number;
  actor: string | null;
  enqueued_at: Date;
  lease_token: unknown;
  lease_until: Date;
  headers?: Record<string, string> | null;
}

const DISPATCH_SQL =
  "SELECT job_id, queue, kind, args, priority, attempt, max_attempts, actor, enqueued_at, lease_token, lease_until " +
  "FROM pgque.dispatch($1::text[], $2::int4, $3::text, make_interval(secs => $4::float8))";
/** DISPATCH_SQL with the jobs' headers, on a server that has them. */
const DISPATCH_HEADERS_SQL = DISPATCH_SQL.replace("lease_until ", "lease_until, headers ");
const HEARTBEAT_SQL =
  "SELECT job_id FROM pgque.heartbeat($1::int8[], $2::int8[], make_interval(secs => $3::float8))";

/** How long a dispatch waits for half the handler slots to free up (see dispatchLoop). */
const REFILL_WAIT_MS = 20;

/** A dispatched job, as a handler sees it. */
export class Job {
  /** The job id. */
  readonly id: number;
  /** Its queue. */
  readonly queue: string;
  /** Its kind (which handler runs it). */
  readonly kind: string;
  /** Its args, decoded JSON. */
  readonly args: unknown;
  readonly priority: number;
  /** 1 on the first attempt. */
  readonly attempt: number;
  readonly maxAttempts: number;
  readonly actor: string | null;
  readonly enqueuedAt: Date;
  /** The lease token of this attempt; every outcome call is fenced by it. */
  readonly leaseToken: number;
  readonly leaseUntil: Date;
  /** What the producer attached (W3C `traceparent` / `tracestate`); null:
   * nothing, or a server without job headers. */
  readonly headers: Record<string, string> | null;
  /** Aborted when the job was cancelled or its lease lost (a heartbeat left
   * it out), or when a shutdown handed it back: its completion will be
   * refused, a long handler should stop. */
  readonly signal: AbortSignal;
  /** @internal */
  handedBack = false;
  /** @internal The error reported for this attempt (its process span's status). */
  failure: string | undefined;
  private readonly controller = new AbortController();
  private readonly worker: Worker;

  /** @internal Made by the worker from a dispatched row. */
  constructor(row: JobRow, worker: Worker) {
    this.id = toId(row.job_id);
    this.queue = row.queue;
    this.kind = row.kind;
    this.args = row.args;
    this.priority = row.priority;
    this.attempt = row.attempt;
    this.maxAttempts = row.max_attempts;
    this.actor = row.actor;
    this.enqueuedAt = row.enqueued_at;
    this.leaseToken = toId(row.lease_token);
    this.leaseUntil = row.lease_until;
    this.headers = row.headers ?? null;
    this.signal = this.controller.signal;
    this.worker = worker;
  }

  /** True once the job was cancelled, its lease lost, or it was handed back. */
  get cancelled(): boolean {
    return this.signal.aborted;
  }

  /** @internal */
  lose(reason: string): void {
    if (!this.controller.signal.aborted) this.controller.abort(new Error(reason));
  }

  /** Reports progress (any JSON value) with `pgque.set_progress` on the
   * worker's control connection. Resolves false when the server refused it
   * (the job was cancelled or its lease is stale). Throws
   * ServerFeatureMissing on a server without it. */
  progress(value: unknown): Promise<boolean> {
    return this.worker.setProgress(this, value);
  }
}

type Outcome = { what: "complete"; job: Job; output: string | null } | { what: "fail"; job: Job; error: string };

/**
 * Runs job handlers for a set of queues.
 *
 * ```ts
 * const worker = new Worker({ connection: "postgres:///app", queues: ["emails"], concurrency: 8 });
 * worker.handle("welcome", async (job) => ({ sentTo: (job.args as { to: string }).to }));
 * worker.handleTx("invoice", async (job, tx) => {
 *   await tx.query("INSERT INTO invoices (job_id) VALUES ($1)", [job.id]);
 * });
 * await worker.run({ signal }); // until signal aborts, stop(), or SIGTERM; then drains
 * ```
 *
 * A handler's return value is the job's output; a throw fails the job with
 * its message and stack, and the server retries it with backoff until
 * max_attempts. A job whose kind has no handler fails.
 */
export class Worker {
  readonly queues: string[];
  readonly concurrency: number;
  readonly batchSize: number;
  readonly leaseMs: number;
  readonly heartbeatIntervalMs: number;
  readonly pollIntervalMs: number;
  readonly shutdownTimeoutMs: number;
  readonly workerId: string;
  /** Jobs completed (their completion committed). */
  completed = 0;
  /** Jobs failed (reported with `fail`). */
  failed = 0;
  /** Outcomes the server refused (the lease was lost, the job cancelled or
   * handed back): for transactional handlers, their effects were rolled
   * back. The job is not failed: it belongs to its new run, or it is
   * cancelled. (`lost`, as the Python and Rust clients name it.) */
  lost = 0;
  /** Jobs handed back at shutdown (snoozed to now: the attempt is not counted). */
  handedBack = 0;

  private readonly connection: ConnectionOptions;
  private readonly handleSignals: boolean;
  private readonly log: Logger;
  private readonly handlers = new Map<string, { fn: JobHandler | TxJobHandler; tx: boolean }>();
  private readonly waker = new Waker();
  // Keyed by the Job object: a rescued job can run again (a new attempt, a new
  // token) here while its old attempt still runs.
  private readonly running = new Set<Job>();
  private readonly tasks = new Set<Promise<void>>();
  private outcomes: Outcome[] = [];
  private flushing: Promise<void> | undefined;
  private stopping = false;
  private active = false;
  private control: pg.Client | undefined;
  private controlConnecting: Promise<pg.Client> | undefined;
  private pool: pg.Pool | undefined;
  private feats: Features | undefined;

  /** Makes a worker; nothing connects before {@link run}. */
  constructor(options: WorkerOptions) {
    this.connection = options.connection;
    this.queues = typeof options.queues === "string" ? [options.queues] : [...options.queues];
    if (this.queues.length === 0) throw new RangeError("queues must not be empty");
    this.concurrency = options.concurrency ?? 10;
    if (!Number.isInteger(this.concurrency) || this.concurrency < 1) throw new RangeError("concurrency must be at least 1");
    this.batchSize = Math.max(1, options.batchSize ?? this.concurrency);
    this.leaseMs = options.leaseMs ?? 60_000;
    secs(this.leaseMs, "leaseMs");
    this.heartbeatIntervalMs = options.heartbeatIntervalMs ?? this.leaseMs / 3;
    this.pollIntervalMs = options.pollIntervalMs ?? 2_000;
    this.shutdownTimeoutMs = options.shutdownTimeoutMs ?? 30_000;
    this.workerId = options.workerId ?? `${hostname()}-${process.pid}-${shortId()}`;
    this.handleSignals = options.handleSignals ?? true;
    this.log = options.logger ?? consoleLogger;
  }

  /** Registers `fn` for jobs of `kind` (replacing an earlier one). Returns
   * the worker, for chaining. */
  handle(kind: string, fn: JobHandler): this {
    this.handlers.set(kind, { fn, tx: false });
    return this;
  }

  /**
   * Registers an exactly-once handler for `kind`: `fn(job, tx)` runs inside
   * a transaction the worker opened (BEGIN, READ COMMITTED) on a connection
   * of its own and writes its effects through `tx`. When it returns, the
   * worker runs the fenced `pgque.complete(job, lease token, output)` in that
   * same transaction and COMMITs: the effects and the completion commit
   * together. If complete returns false (the lease was lost or the job
   * cancelled) the worker ROLLBACKs, so the effects vanish (counted in
   * `lost` and logged; another attempt may run the job again). A throw ROLLBACKs
   * and fails the job in a separate transaction. `fn` must not COMMIT or
   * ROLLBACK `tx` itself. Returns the worker, for chaining.
   */
  handleTx(kind: string, fn: TxJobHandler): this {
    this.handlers.set(kind, { fn, tx: true });
    return this;
  }

  /** Asks run() to drain and return; returns at once. */
  stop(): void {
    this.stopping = true;
    this.waker.notify();
  }

  /** True from stop() (or the abort / signal) until run() returned. */
  get isStopping(): boolean {
    return this.stopping;
  }

  /** The number of handlers running now. */
  get runningCount(): number {
    return this.running.size;
  }

  /**
   * Dispatches and runs jobs until stop(), `signal` aborts, or SIGTERM /
   * SIGINT (with `handleSignals`), then drains: no new dispatch, running
   * handlers get up to `shutdownTimeoutMs` to finish, the jobs still running
   * then are handed back (`snooze` to now: the attempt is not counted; their
   * `job.signal` aborts), and every finished job's outcome is sent before the
   * promise resolves. Rejects with the typed error when dispatch fails for a
   * reason other than the connection (e.g. UndefinedObject for an unknown
   * queue), after the same drain.
   */
  async run(options: { signal?: AbortSignal } = {}): Promise<void> {
    if (this.active) throw new Error("this worker is running already");
    this.active = true;
    this.stopping = false;
    const signal = options.signal;
    const onAbort = (): void => this.stop();
    if (signal?.aborted) this.stopping = true;
    signal?.addEventListener("abort", onAbort, { once: true });
    const restoreSignals = this.handleSignals ? onSignals(() => this.stop()) : () => undefined;
    let dconn: pg.Client | undefined;
    let listener: Listener | undefined;
    const drained = new AbortController();
    let beater: Promise<void> | undefined;
    try {
      dconn = await connect(this.connection);
      this.control = await connect(this.connection);
      this.feats = await features(this.control);
      if ([...this.handlers.values()].some((h) => h.tx)) {
        const cfg = typeof this.connection === "string" ? { connectionString: this.connection } : this.connection;
        this.pool = new pg.Pool({ ...cfg, max: this.concurrency });
        this.pool.on("error", (err) => this.log.warn(`idle transaction connection: ${err.message}`));
        // A checked-out client reports a dropped connection on itself, not on
        // the pool: without a listener that would be an uncaught 'error'. The
        // handler's next query fails instead, and the job is failed (retried).
        this.pool.on("connect", (c) => c.on("error", () => undefined));
      }
      listener = new Listener(this.connection, await this.channels(dconn), () => this.waker.notify(), this.log);
      await listener.start();
      beater = this.heartbeatLoop(drained.signal);
      try {
        await this.dispatchLoop(dconn);
      } finally {
        this.stopping = true;
        await this.drain();
        drained.abort();
        await beater;
        await this.flush();
      }
    } finally {
      await listener?.close();
      await closeQuietly(dconn);
      await closeQuietly(this.control);
      this.control = undefined;
      if (this.pool !== undefined) {
        const pool = this.pool;
        this.pool = undefined;
        // A handler still running past the hand-back keeps its client; do not wait for it forever.
        await Promise.race([pool.end().catch(() => undefined), sleep(1000)]);
      }
      signal?.removeEventListener("abort", onAbort);
      restoreSignals();
      this.active = false;
      this.stopping = false;
    }
  }

  private async channels(conn: pg.Client): Promise<string[]> {
    const f = await features(conn);
    if (!f.jobChannel) return this.queues.map((q) => `pgque_jobs_${q}`);
    const out: string[] = [];
    for (const q of this.queues) {
      const { rows } = await query<{ ch: string }>(conn, "SELECT pgque.job_channel($1::text) AS ch", [q]);
      out.push(rows[0]?.ch as string);
    }
    return out;
  }

  private free(): number {
    return this.concurrency - this.running.size;
  }

  private async dispatchLoop(initial: pg.Client): Promise<void> {
    let conn = initial;
    const lease = secs(this.leaseMs, "leaseMs");
    while (!this.stopping) {
      const gen = this.waker.gen;
      let free = this.free();
      if (free <= 0) {
        await this.waker.waitFor(() => this.stopping || this.free() > 0, this.pollIntervalMs);
        continue;
      }
      const low = Math.max(1, Math.floor(Math.min(this.batchSize, this.concurrency) / 2));
      if (free < low) {
        // Refill in batches: give the running handlers a moment to free half
        // the slots, so short jobs are not dispatched one by one (a round
        // trip each); a slow handler delays a refill by at most REFILL_WAIT_MS.
        await this.waker.waitFor(() => this.stopping || this.free() >= low, REFILL_WAIT_MS);
        if (this.stopping) break;
        free = this.free();
      }
      const want = Math.min(free, this.batchSize);
      let rows: JobRow[];
      try {
        ({ rows } = await query<JobRow>(conn, this.feats?.headers ? DISPATCH_HEADERS_SQL : DISPATCH_SQL, [this.queues, want, this.workerId, lease]));
      } catch (err) {
        if (!isConnectionError(err)) throw err;
        this.log.warn(`worker ${this.workerId}: dispatch failed (${(err as Error).message}); reconnecting`);
        await closeQuietly(conn);
        conn = await this.reconnect();
        continue;
      }
      for (const row of rows) this.start(new Job(row, this));
      if (rows.length < want) {
        // The queues had no more ready jobs: sleep until a NOTIFY, the poll
        // interval, or stop().
        await this.waker.waitGen(gen, this.pollIntervalMs, () => this.stopping);
      }
    }
    await closeQuietly(conn);
  }

  private async reconnect(): Promise<pg.Client> {
    for (;;) {
      await sleep(1000);
      try {
        return await connect(this.connection);
      } catch (err) {
        this.log.warn(`worker ${this.workerId}: reconnect failed (${(err as Error).message})`);
        if (this.stopping) throw err;
      }
    }
  }

  private start(job: Job): void {
    this.running.add(job);
    const task = this.runJob(job).finally(() => {
      this.running.delete(job);
      this.tasks.delete(task);
      this.waker.poke();
    });
    this.tasks.add(task);
  }

  private runJob(job: Job): Promise<void> {
    return processSpan(job, () => this.runJobIn(job));
  }

  private async runJobIn(job: Job): Promise<void> {
    const h = this.handlers.get(job.kind);
    if (h === undefined) {
      this.report({ what: "fail", job, error: `Error: no handler for job kind '${job.kind}' in worker ${this.workerId}` });
      return;
    }
    if (h.tx) return this.runTx(job, h.fn as TxJobHandler);
    try {
      const result = await (h.fn as JobHandler)(job);
      this.report({ what: "complete", job, output: outputJson(result) });
    } catch (err) {
      this.report({ what: "fail", job, error: describe(err) });
    }
  }

  private async runTx(job: Job, fn: TxJobHandler): Promise<void> {
    let tx: pg.PoolClient;
    try {
      tx = await (this.pool as pg.Pool).connect();
    } catch (err) {
      this.report({ what: "fail", job, error: describe(err) });
      return;
    }
    let broken: Error | undefined;
    try {
      await tx.query("BEGIN ISOLATION LEVEL READ COMMITTED");
      let ok: boolean;
      try {
        const output = outputJson(await fn(job, tx));
        ok = await this.completeIn(tx, job, output);
      } catch (err) {
        broken = await rollback(tx);
        if (!job.handedBack) this.report({ what: "fail", job, error: describe(err) });
        return;
      }
      if (!ok) {
        // Lease lost, job cancelled or handed back: the effects must not stay.
        broken = await rollback(tx);
        this.lost++;
        job.lose("completion refused: lease lost or job cancelled");
        this.log.warn(
          `worker ${this.workerId}: job ${job.id} not completed (its lease was lost or it was cancelled); ` +
            "its transaction was rolled back",
        );
        return;
      }
      try {
        await tx.query("COMMIT");
        this.completed++;
      } catch (err) {
        // The completion did not commit either: the job is still running under
        // this lease. Fail it (separately) so it is retried.
        broken = await rollback(tx);
        if (!job.handedBack) this.report({ what: "fail", job, error: describe(err) });
      }
    } catch (err) {
      // BEGIN itself failed: a broken connection.
      broken = err as Error;
      if (!job.handedBack) this.report({ what: "fail", job, error: describe(err) });
    } finally {
      tx.release(broken ?? false);
    }
  }

  /** The fenced completion inside the handler's transaction. */
  private async completeIn(tx: pg.PoolClient, job: Job, output: string | null): Promise<boolean> {
    const f = this.feats as Features;
    const { rows } =
      output !== null && f.outputs
        ? await query<{ ok: boolean }>(tx, "SELECT pgque.complete($1::int8, $2::int8, $3::jsonb) AS ok", [
            job.id,
            job.leaseToken,
            output,
          ])
        : await query<{ ok: boolean }>(tx, "SELECT pgque.complete($1::int8, $2::int8) AS ok", [job.id, job.leaseToken]);
    return rows[0]?.ok === true;
  }

  // ---- outcomes ------------------------------------------------------------

  private report(o: Outcome): void {
    if (o.what === "fail") o.job.failure = o.error;
    // A handed-back job's outcome is not ours to send; nor is anything after run() returned.
    if (o.job.handedBack || !this.active) return;
    this.outcomes.push(o);
    if (this.flushing === undefined) {
      this.flushing = this.flushLoop().finally(() => {
        this.flushing = undefined;
      });
    }
  }

  /** Waits until every reported outcome was sent. */
  private async flush(): Promise<void> {
    while (this.flushing !== undefined) await this.flushing;
  }

  private async flushLoop(): Promise<void> {
    // Let the handlers that finish in this same moment join the batch.
    await new Promise((r) => setImmediate(r));
    while (this.outcomes.length > 0) {
      const batch = this.outcomes.splice(0, 1000);
      for (let attempt = 1; ; attempt++) {
        try {
          await this.send(batch);
          break;
        } catch (err) {
          const lostConnection = isConnectionError(err);
          if (lostConnection) await this.resetControl();
          // A dropped control connection (a restart, a terminated backend) is
          // re-made and the batch sent again: complete_many and fail are fenced,
          // so a repeat of what did commit changes nothing.
          if (lostConnection && attempt < 3 && this.active) {
            await sleep(200 * attempt);
            continue;
          }
          // The leases of these jobs expire and the server's rescue hands them
          // out again: at least once, never lost.
          this.log.error(`worker ${this.workerId}: could not report ${batch.length} job outcomes: ${(err as Error).message}`);
          break;
        }
      }
    }
  }

  private async send(batch: Outcome[]): Promise<void> {
    const ctl = await this.ctl();
    const f = this.feats as Features;
    const oks = batch.filter((o): o is Extract<Outcome, { what: "complete" }> => o.what === "complete" && !o.job.handedBack);
    const fails = batch.filter((o): o is Extract<Outcome, { what: "fail" }> => o.what === "fail" && !o.job.handedBack);
    if (oks.length > 0) {
      const ids = oks.map((o) => o.job.id);
      const tokens = oks.map((o) => o.job.leaseToken);
      let done: number;
      if (f.outputs && oks.some((o) => o.output !== null)) {
        const { rows } = await query<{ n: number }>(
          ctl,
          "SELECT pgque.complete_many($1::int8[], $2::int8[], $3::jsonb[]) AS n",
          [ids, tokens, oks.map((o) => o.output)],
        );
        done = rows[0]?.n ?? 0;
      } else {
        const { rows } = await query<{ n: number }>(ctl, "SELECT pgque.complete_many($1::int8[], $2::int8[]) AS n", [ids, tokens]);
        done = rows[0]?.n ?? 0;
      }
      this.completed += done;
      this.lost += oks.length - done;
    }
    for (const o of fails) {
      const { rows } = await query<{ state: string | null }>(ctl, "SELECT pgque.fail($1::int8, $2::int8, $3::text) AS state", [
        o.job.id,
        o.job.leaseToken,
        o.error,
      ]);
      if (rows[0]?.state === null) this.lost++;
      else this.failed++;
    }
  }

  /** The control connection, re-made (once, whoever asks first) after a
   * connection error reset it. */
  private async ctl(): Promise<pg.Client> {
    if (this.control !== undefined) return this.control;
    if (this.controlConnecting === undefined) {
      this.controlConnecting = connect(this.connection).finally(() => {
        this.controlConnecting = undefined;
      });
      this.control = await this.controlConnecting;
      return this.control;
    }
    return this.controlConnecting;
  }

  private async resetControl(): Promise<void> {
    const c = this.control;
    this.control = undefined;
    await closeQuietly(c);
  }

  // ---- heartbeats and progress ---------------------------------------------

  private async heartbeatLoop(drained: AbortSignal): Promise<void> {
    const extend = secs(this.leaseMs, "leaseMs");
    while (!drained.aborted) {
      await sleep(this.heartbeatIntervalMs, drained);
      if (drained.aborted) break;
      const jobs = [...this.running.values()].filter((j) => !j.handedBack);
      if (jobs.length === 0) continue;
      try {
        const { rows } = await query<{ job_id: unknown }>(await this.ctl(), HEARTBEAT_SQL, [
          jobs.map((j) => j.id),
          jobs.map((j) => j.leaseToken),
          extend,
        ]);
        const alive = new Set(rows.map((r) => toId(r.job_id)));
        for (const j of jobs) {
          if (!alive.has(j.id) && this.running.has(j)) j.lose("left out of a heartbeat: cancelled, or the lease was lost");
        }
      } catch (err) {
        this.log.warn(`worker ${this.workerId}: heartbeat failed: ${(err as Error).message}`);
        if (isConnectionError(err)) await this.resetControl();
      }
    }
  }

  /** @internal `job.progress()`. */
  async setProgress(job: Job, value: unknown): Promise<boolean> {
    const f = this.feats;
    if (f === undefined || !this.active) throw new Error("the worker is not running");
    if (!f.progress) throw new ServerFeatureMissing("this server's pgque has no set_progress (progress needs pgque 0.7)");
    const { rows } = await query<{ ok: boolean }>(await this.ctl(), "SELECT pgque.set_progress($1::int8, $2::int8, $3::jsonb) AS ok", [
      job.id,
      job.leaseToken,
      JSON.stringify(value),
    ]);
    return rows[0]?.ok === true;
  }

  // ---- shutdown ------------------------------------------------------------

  /** Waits for the running handlers, then hands back what still runs. */
  private async drain(): Promise<void> {
    await this.waker.waitFor(() => this.running.size === 0, this.shutdownTimeoutMs);
    const left = [...this.running.values()];
    if (left.length === 0) return;
    this.log.warn(
      `worker ${this.workerId}: handing back ${left.length} jobs still running after ${this.shutdownTimeoutMs} ms`,
    );
    for (const j of left) {
      j.handedBack = true;
      j.lose("handed back at shutdown");
      try {
        const { rows } = await query<{ ok: boolean }>(
          await this.ctl(),
          "SELECT pgque.snooze($1::int8, $2::int8, now()) AS ok",
          [j.id, j.leaseToken],
        );
        // false: the job finished, was cancelled or rescued meanwhile.
        if (rows[0]?.ok === true) this.handedBack++;
      } catch (err) {
        this.log.error(`worker ${this.workerId}: could not hand back job ${j.id}: ${(err as Error).message}`);
      }
    }
  }
}

function outputJson(result: unknown): string | null {
  if (result === undefined || result === null) return null;
  const s = JSON.stringify(result);
  if (s === undefined) throw new TypeError("the handler's result is not JSON-serialisable");
  return s;
}

/** A thrown value as the error text `fail` records: name, message and stack. */
function describe(err: unknown): string {
  const e = translateError(err);
  if (e instanceof Error) {
    const head = `${e.name}: ${e.message}`;
    return e.stack && e.stack.includes(e.message) ? `${head}\n${e.stack.split("\n").slice(1).join("\n")}` : `${head}\n${e.stack ?? ""}`;
  }
  return String(e);
}

async function rollback(tx: pg.PoolClient): Promise<Error | undefined> {
  try {
    await tx.query("ROLLBACK");
    return undefined;
  } catch (err) {
    return err as Error;
  }
}
