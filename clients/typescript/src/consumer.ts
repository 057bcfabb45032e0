/**
 * Event consumers: a plain {@link Consumer} (receive / ack / nack; on a
 * server with the waiting receive it waits for its batch inside the server,
 * on an older one it is woken by the queue's tick NOTIFY) and a
 * {@link PartitionedConsumer} whose M loops cover N slots with the
 * `claim_next_slot` loop, so every slot is polled.
 *
 * Delivery is at least once: a batch is acked only after its handler calls
 * returned, and a batch interrupted by a crash, a stop or a lost slot lease
 * is delivered again (the same batch) to whoever reads that consumer or slot
 * next. A handler that throws nacks its message (retried after
 * `retryAfterMs`, dead-lettered after the queue's max_retries); the nacks and
 * the ack of one batch commit together.
 *
 * With `txHandler` instead of `handler` the effects are exactly once: the
 * batch's handler calls run inside one transaction on the consumer's
 * connection (`handler(msg, tx)`, each in a savepoint), and the nacks and
 * the ack (for a slot: the lease-fenced `ack_partitioned`) run in that same
 * transaction before COMMIT. If the ack is refused (a slot lease lost: 55000)
 * everything rolls back, effects included, and the new owner gets the batch.
 */
import { hostname } from "node:os";

import type pg from "pg";

import { InvalidParameterValue, NumericValueOutOfRange, SlotLost, WrongState, isConnectionError } from "./errors.js";
import { features } from "./features.js";
import { Listener } from "./listen.js";
import { eventSpan, tracingActive } from "./otel.js";
import {
  cancelRequest,
  closeQuietly,
  connect,
  consoleLogger,
  onSignals,
  query,
  secs,
  shortId,
  sleep,
  toId,
  toIdOrNull,
  Waker,
  type ConnectionOptions,
  type Logger,
} from "./util.js";

/** One event, with PgQue's `pgque.message` fields. */
export class Message {
  readonly msgId: number;
  readonly batchId: number;
  readonly type: string;
  /** The payload as sent (JSON payloads as their text); see {@link json}. */
  readonly payload: string | null;
  /** null on the first delivery, then the number of retries. */
  readonly retryCount: number | null;
  readonly createdAt: Date;
  readonly extra1: string | null;
  readonly extra2: string | null;
  readonly extra3: string | null;
  readonly extra4: string | null;
  /** The event's headers (W3C trace context), read only while OpenTelemetry
   * is active on a server with event headers (pgque 0.8); null otherwise. */
  readonly headers: Record<string, string> | null;

  /** @internal Made from a row of `receive`. */
  constructor(row: MessageRow) {
    this.msgId = toId(row.msg_id);
    this.batchId = toId(row.batch_id);
    this.type = row.type;
    this.payload = row.payload;
    this.retryCount = row.retry_count;
    this.createdAt = row.created_at;
    this.extra1 = row.extra1;
    this.extra2 = row.extra2;
    this.extra3 = row.extra3;
    this.extra4 = row.extra4;
    this.headers = row.headers ?? null;
  }

  /** The partition key (it rides extra1). */
  get partitionKey(): string | null {
    return this.extra1;
  }

  /** The payload decoded as JSON (null for a NULL payload). */
  json<T = unknown>(): T {
    return (this.payload === null ? null : JSON.parse(this.payload)) as T;
  }
}

/** @internal */
export interface MessageRow {
  msg_id: unknown;
  batch_id: unknown;
  type: string;
  payload: string | null;
  retry_count: number | null;
  created_at: Date;
  extra1: string | null;
  extra2: string | null;
  extra3: string | null;
  extra4: string | null;
  /** Only from the *_with_headers receives. */
  headers?: Record<string, string> | null;
}

/** A message handler; a throw nacks the message. */
export type MessageHandler = (msg: Message) => unknown;
/** An exactly-once message handler: writes its effects through `tx`, the
 * transaction the batch's ack commits in. */
export type TxMessageHandler = (msg: Message, tx: pg.ClientBase) => unknown;

const MSG_COLS = "msg_id, batch_id, type, payload, retry_count, created_at, extra1, extra2, extra3, extra4";

/** `$k..$k+9` as a pgque.message row. */
function msgRow(k: number): string {
  return (
    `ROW($${k}::int8, $${k + 1}::int8, $${k + 2}::text, $${k + 3}::text, $${k + 4}::int4, $${k + 5}::timestamptz, ` +
    `$${k + 6}::text, $${k + 7}::text, $${k + 8}::text, $${k + 9}::text)::pgque.message`
  );
}

function msgParams(m: Message): unknown[] {
  return [m.msgId, m.batchId, m.type, m.payload, m.retryCount, m.createdAt, m.extra1, m.extra2, m.extra3, m.extra4];
}

function reason(err: unknown): string {
  const e = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  return e.slice(0, 1000);
}

/** Options both consumers take. Durations are in milliseconds. */
export interface ConsumerOptionsBase {
  /** How to connect: a connection string or a `pg.ClientConfig`. */
  connection: ConnectionOptions;
  /** The event queue. */
  queue: string;
  /** The consumer's name. */
  consumer: string;
  /** Called per message; a throw nacks it. Give this or `txHandler`. */
  handler?: MessageHandler;
  /** Called per message inside the batch's transaction (exactly-once
   * effects, module doc). Give this or `handler`. */
  txHandler?: TxMessageHandler;
  /** Most events per batch (default 100). */
  batchSize?: number;
  /** The fallback poll when no tick NOTIFY comes (default 2 s). */
  pollIntervalMs?: number;
  /** When a nacked event comes again (default 60 s). */
  retryAfterMs?: number;
  /** Subscribe first (default true; a no-op when subscribed). */
  subscribe?: boolean;
  /** Stop on SIGTERM / SIGINT while run() runs (default true). */
  handleSignals?: boolean;
  /** Where warnings go (default console). */
  logger?: Logger;
}

type Handlers = { plain: MessageHandler; tx?: undefined } | { plain?: undefined; tx: TxMessageHandler };

/** What both consumers share: the stop flag, the tick wake-ups, signals, and
 * the handling of one received batch. */
abstract class Runner {
  /** Events handled (their batch acked). */
  handled = 0;
  readonly queue: string;
  readonly consumer: string;
  readonly batchSize: number;
  readonly pollIntervalMs: number;
  readonly retryAfterMs: number;
  protected readonly connection: ConnectionOptions;
  protected readonly subscribe: boolean;
  protected readonly log: Logger;
  protected readonly waker = new Waker();
  protected stopping = false;
  private readonly handleSignals: boolean;
  private readonly handlers: Handlers;
  private listener: Listener | undefined;
  /** The connection whose waiting receive is in flight (stop() cancels it). */
  private waiting: { conn: pg.Client; done: Promise<void> } | undefined;
  /** stop()'s cancel of that receive, while it runs. */
  private cancelling: Promise<void> | undefined;
  /** False once the server turned out to lack the *_with_headers receives
   * (42883, a 0.7 schema): the plain ones from then on. */
  private serverHeaders = true;

  constructor(o: ConsumerOptionsBase) {
    this.connection = o.connection;
    this.queue = o.queue;
    this.consumer = o.consumer;
    if ((o.handler === undefined) === (o.txHandler === undefined)) {
      throw new TypeError("give exactly one of handler and txHandler");
    }
    this.handlers = o.handler !== undefined ? { plain: o.handler } : { tx: o.txHandler as TxMessageHandler };
    this.batchSize = o.batchSize ?? 100;
    this.pollIntervalMs = o.pollIntervalMs ?? 2_000;
    this.retryAfterMs = o.retryAfterMs ?? 60_000;
    secs(this.retryAfterMs, "retryAfterMs");
    this.subscribe = o.subscribe ?? true;
    this.handleSignals = o.handleSignals ?? true;
    this.log = o.logger ?? consoleLogger;
  }

  /** Asks run() to finish the batches in hand and return; returns at once. */
  stop(): void {
    this.stopping = true;
    this.waker.notify();
    if (this.waiting !== undefined && this.cancelling === undefined) this.cancelling = this.cancelWait();
  }

  /** Cancels the waiting receive in flight, again every 200 ms until it
   * returned (a cancel request that reaches the server before the statement
   * is dropped there). The receiving side awaits this before its next
   * statement, so a cancel never lands on the ack. */
  private async cancelWait(): Promise<void> {
    try {
      while (this.waiting !== undefined) {
        const { conn, done } = this.waiting;
        try {
          await cancelRequest(conn);
        } catch (err) {
          this.log.warn(`consumer ${this.consumer}: cancelling the waiting receive: ${(err as Error).message}`);
        }
        await Promise.race([done, sleep(200)]);
      }
    } finally {
      this.cancelling = undefined;
    }
  }

  /** Runs `body` with the stop plumbing (signal, SIGTERM, the tick listener,
   * started first unless `listen` is false: then {@link listen} starts it). */
  protected async runWith(signal: AbortSignal | undefined, body: () => Promise<void>, listen = true): Promise<void> {
    this.stopping = signal?.aborted ?? false;
    const onAbort = (): void => this.stop();
    signal?.addEventListener("abort", onAbort, { once: true });
    const restore = this.handleSignals ? onSignals(() => this.stop()) : () => undefined;
    try {
      if (listen) await this.listen();
      await body();
    } finally {
      await this.listener?.close();
      this.listener = undefined;
      signal?.removeEventListener("abort", onAbort);
      restore();
      this.stopping = false;
    }
  }

  /** Starts the tick listener (once per run). */
  protected async listen(): Promise<void> {
    if (this.listener !== undefined) return;
    this.listener = new Listener(this.connection, [`pgque_${this.queue}`], () => this.waker.notify(), this.log);
    await this.listener.start();
  }

  /**
   * The waiting `receive(args..., wait)` on `conn` (autocommit: a
   * transaction that has written would not sleep), cancellable by stop();
   * empty when stop() came first or cancelled it.
   */
  protected async receiveWaiting(conn: pg.Client, args: unknown[], waitMs: number, headers: boolean): Promise<Message[]> {
    let settled!: () => void;
    this.waiting = { conn, done: new Promise<void>((r) => (settled = r)) };
    try {
      if (this.stopping) return [];
      return await this.receive(
        conn,
        "receive",
        "$1::text, $2::text, $3::int4, make_interval(secs => $4::float8)",
        [...args, waitMs / 1000],
        headers,
      );
    } catch (err) {
      if (this.stopping && (err as { code?: unknown }).code === "57014") return [];
      throw err;
    } finally {
      this.waiting = undefined;
      settled();
      await this.cancelling;
    }
  }

  /**
   * One batch from `pgque.<fn>(<args>)` on `conn`. While OpenTelemetry is
   * active (docs/tracing.md) from its `_with_headers` twin, which adds the
   * events' headers; a server without it (42883) is remembered and read
   * with `fn` itself from then on.
   */
  protected async receive(conn: pg.Client, fn: string, args: string, params: unknown[], headers = true): Promise<Message[]> {
    if (headers && this.serverHeaders && (await tracingActive())) {
      try {
        const { rows } = await query<MessageRow>(
          conn,
          `SELECT ${MSG_COLS}, headers FROM pgque.${fn}_with_headers(${args})`,
          params,
        );
        return rows.map((r) => new Message(r));
      } catch (err) {
        if ((err as { code?: unknown }).code !== "42883") throw err;
        this.serverHeaders = false;
      }
    }
    const { rows } = await query<MessageRow>(conn, `SELECT ${MSG_COLS} FROM pgque.${fn}(${args})`, params);
    return rows.map((r) => new Message(r));
  }

  /** Whether a failed message's key is skipped for the rest of its batch
   * (a partitioned consumer with the pause policy). */
  protected pauseKeys(): boolean {
    return false;
  }

  protected waitTick(gen: number): Promise<boolean> {
    return this.waker.waitGen(gen, this.pollIntervalMs, () => this.stopping);
  }

  /**
   * Handles one received batch and finishes it in one transaction on `conn`:
   * `nack(msg)` for each failed message, then `finish()` (the ack). With a
   * txHandler the handler calls run in that transaction too. Throws what
   * `finish` throws (after a ROLLBACK).
   */
  protected async handleBatch(
    conn: pg.Client,
    msgs: Message[],
    nack: (m: Message, why: string) => Promise<unknown>,
    finish: () => Promise<unknown>,
    beforeEach?: () => Promise<void>,
  ): Promise<void> {
    const failed: [Message, string][] = [];
    // The pause policy: a key whose event failed in this batch is skipped
    // from there on (the server holds its later events back).
    const blocked = new Set<string>();
    const skipped = (m: Message) => m.partitionKey !== null && blocked.has(m.partitionKey);
    const fail = (m: Message, err: unknown) => {
      failed.push([m, reason(err)]);
      if (this.pauseKeys() && m.partitionKey !== null) blocked.add(m.partitionKey);
    };
    if (this.handlers.plain !== undefined) {
      for (const m of msgs) {
        if (skipped(m)) continue;
        await beforeEach?.();
        const plain = this.handlers.plain;
        try {
          await eventSpan(this.queue, this.consumer, m, async () => plain(m));
        } catch (err) {
          fail(m, err);
        }
      }
    }
    await conn.query("BEGIN");
    try {
      if (this.handlers.tx !== undefined) {
        for (const m of msgs) {
          if (skipped(m)) continue;
          await beforeEach?.();
          // A savepoint per message: a failing message's effects go, the
          // others' stay, and it is nacked in this same transaction.
          const tx = this.handlers.tx;
          await conn.query("SAVEPOINT pgque_msg");
          try {
            await eventSpan(this.queue, this.consumer, m, async () => tx(m, conn));
            await conn.query("RELEASE SAVEPOINT pgque_msg");
          } catch (err) {
            await conn.query("ROLLBACK TO SAVEPOINT pgque_msg");
            fail(m, err);
          }
        }
      }
      for (const [m, why] of failed) await nack(m, why);
      await finish();
      await conn.query("COMMIT");
    } catch (err) {
      try {
        await conn.query("ROLLBACK");
      } catch {
        /* the connection is gone: the server rolled back */
      }
      throw err;
    }
  }
}

/** Options of {@link Consumer}. */
export interface ConsumerOptions extends ConsumerOptionsBase {
  /**
   * Makes it one member of the cooperative consumer `consumer`
   * (`pgque.receive_coop`): the members share the consumer's stream, each
   * batch to one of them. `run()` registers the member
   * (`register_subconsumer`) unless `subscribe: false`; a normal consumer of
   * that name is not converted (55000).
   */
  subconsumer?: string;
  /** A cooperative member also takes over the open batch of a member idle
   * longer than this, in ms (`receive_coop`'s dead_interval; default never). */
  deadIntervalMs?: number;
  /**
   * How long one waiting receive waits inside the server for a batch, in ms
   * (default 5 s; the server caps it at `pgque.max_wait`, and run() at half
   * the session's `statement_timeout`). On a server with the waiting receive
   * (pgque 0.9, docs/waits.md) run() loops on it instead of LISTEN + poll:
   * an event arrives within a few milliseconds and no LISTEN connection is
   * held (it works through transaction-mode poolers). 0 keeps LISTEN + poll,
   * which is also what an older server, a cooperative member (no waiting
   * `receive_coop` yet) and a server that does not sleep (`pgque.max_wait =
   * 0`, a REPEATABLE READ default isolation) get.
   */
  waitMs?: number;
}

/** An empty waiting receive quicker than this (ms) did not sleep in the server. */
const AT_ONCE_MS = 20;

/**
 * Reads `queue` as `consumer` and calls the handler per event, acking each
 * batch after its handler calls.
 *
 * ```ts
 * const c = new Consumer({ connection, queue: "orders", consumer: "billing",
 *   handler: (m) => console.log(m.msgId, m.json()) });
 * await c.run({ signal });
 * ```
 */
export class Consumer extends Runner {
  /** The wait of one waiting receive, in ms (0: LISTEN + poll). */
  readonly waitMs: number;
  /** True while run() waits for its batches inside the server (the waiting
   * receive), false while it LISTENs and polls (once run() returned: what
   * its last run did). */
  serverWaits = false;
  private readonly subconsumer: string | undefined;
  private readonly deadIntervalMs: number | undefined;

  /** Makes a consumer; nothing connects before {@link run}. */
  constructor(options: ConsumerOptions) {
    super(options);
    this.subconsumer = options.subconsumer;
    this.deadIntervalMs = options.deadIntervalMs;
    this.waitMs = options.waitMs ?? 5_000;
    secs(this.waitMs, "waitMs");
  }

  /** Subscribes (unless `subscribe: false`), then receives, handles and acks
   * batches until stop(), `signal` aborts or SIGTERM / SIGINT; the batch in
   * hand is finished and acked first. Waits for each batch inside the server
   * where it can ({@link ConsumerOptions.waitMs}; stop() cancels the waiting
   * statement), else sleeps on the tick NOTIFY between empty polls. */
  async run(options: { signal?: AbortSignal } = {}): Promise<void> {
    await this.runWith(options.signal, () => this.consume(), false);
  }

  private async consume(): Promise<void> {
    let conn = await connect(this.connection);
    try {
      if (this.subscribe && this.subconsumer === undefined) {
        await query(conn, "SELECT pgque.subscribe($1::text, $2::text)", [this.queue, this.consumer]);
      } else if (this.subscribe) {
        await query(conn, "SELECT pgque.register_subconsumer($1::text, $2::text, $3::text)", [
          this.queue,
          this.consumer,
          this.subconsumer,
        ]);
      }
      let wait = await this.serverWait(conn);
      this.serverWaits = wait !== undefined;
      if (wait === undefined) await this.listen();
      while (!this.stopping) {
        const gen = this.waker.gen;
        const t0 = Date.now();
        let got: number;
        try {
          got = await this.runOnce(conn, wait);
        } catch (err) {
          if (!isConnectionError(err)) throw err;
          this.log.warn(`consumer ${this.consumer}: ${(err as Error).message}; reconnecting`);
          await closeQuietly(conn);
          await sleep(1000);
          conn = await connect(this.connection);
          continue;
        }
        if (wait !== undefined) {
          if (got === 0 && Date.now() - t0 < AT_ONCE_MS && !this.stopping) {
            this.log.warn(
              `consumer ${this.consumer}: the waiting receive returned at once (pgque.max_wait = 0, or a ` +
                "REPEATABLE READ / SERIALIZABLE default isolation?); LISTEN and poll from now on",
            );
            wait = undefined;
            this.serverWaits = false;
            await this.listen();
          }
          continue;
        }
        if (got === 0) await this.waitTick(gen);
      }
    } finally {
      await closeQuietly(conn);
    }
  }

  /** The wait of run()'s waiting receives in ms, or undefined when run()
   * LISTENs ({@link ConsumerOptions.waitMs}). Half the session's
   * statement_timeout at most, so that the timeout never cancels a wait. */
  private async serverWait(conn: pg.Client): Promise<number | undefined> {
    if (this.waitMs === 0 || this.subconsumer !== undefined || !(await features(conn)).receiveWait) return undefined;
    const { rows } = await query<{ st: string }>(
      conn,
      "SELECT setting::int8 AS st FROM pg_catalog.pg_settings WHERE name = 'statement_timeout'",
    );
    const st = Number(rows[0]?.st ?? 0);
    return st > 0 ? Math.min(this.waitMs, st / 2) : this.waitMs;
  }

  /** Receives one batch on `conn`, handles it, acks it; returns its size (0:
   * none). With `waitMs` (a server with the waiting receive; not for a
   * cooperative member) the receive waits up to that long inside the server
   * for a batch; `conn` must then be outside a transaction that has written,
   * or it does not sleep. */
  async runOnce(conn: pg.Client, waitMs?: number): Promise<number> {
    if (waitMs !== undefined && this.subconsumer !== undefined) {
      throw new TypeError("a cooperative member has no waiting receive (receive_coop); call runOnce without waitMs");
    }
    const msgs =
      waitMs !== undefined
        ? await this.receiveWaiting(
            conn,
            [this.queue, this.consumer, this.batchSize],
            waitMs,
            (await features(conn)).receiveWithHeadersWait,
          )
        : this.subconsumer === undefined
        ? await this.receive(conn, "receive", "$1::text, $2::text, $3::int4", [this.queue, this.consumer, this.batchSize])
        : await this.receive(
            conn,
            "receive_coop",
            "$1::text, $2::text, $3::text, $4::int4, $5::float8 * interval '1 millisecond'",
            [this.queue, this.consumer, this.subconsumer, this.batchSize, this.deadIntervalMs ?? null],
          );
    if (msgs.length === 0) return 0;
    const batchId = msgs[0]?.batchId as number;
    await this.handleBatch(
      conn,
      msgs,
      (m, why) =>
        query(conn, `SELECT pgque.nack($1::int8, ${msgRow(2)}, make_interval(secs => $12::float8), $13::text)`, [
          batchId,
          ...msgParams(m),
          this.retryAfterMs / 1000,
          why,
        ]),
      () => query(conn, "SELECT pgque.ack($1::int8)", [batchId]),
    );
    this.handled += msgs.length;
    return msgs.length;
  }
}

/** Options of {@link PartitionedConsumer}. */
export interface PartitionedConsumerOptions extends ConsumerOptionsBase {
  /** The number of slots N (1..256). */
  n: number;
  /** Concurrent slot loops M, each with its own connection (default 1; any ratio to N). */
  workers?: number;
  /** The slot lease (default 30 s, at least 1 s). */
  ttlMs?: number;
  /** Most batches per claim of a busy slot before it is released (default 16). */
  maxBatchesPerClaim?: number;
  /** The lease owner prefix (default host-pid-random; loop i is `${workerId}/${i}`). */
  workerId?: string;
  /**
   * The consumer's failure policy, chosen at its first subscribe
   * (docs/partition-keys.md, "Failure policy"): "skip" (default: a failed
   * event comes back after its key's later ones) or "pause" (they wait until
   * it is acked or dead-lettered). With "pause" a loop skips a key's
   * remaining messages of a batch once the handler failed on one of them.
   */
  failurePolicy?: "skip" | "pause";
  /** With "pause": after a dead letter, "resume" (default) or "block" the key until release_partition_key. */
  onDeadLetter?: "resume" | "block";
}

/**
 * Reads `queue` as partitioned consumer `consumer` over `n` slots with
 * `workers` loops, each looping claim_next_slot -> receive_partitioned ->
 * handler -> ack_partitioned -> release_slot: the slot that waited longest
 * is served next and no slot is left unpolled (an unpolled slot pins the
 * queue's rotation).
 *
 * A loop keeps a slot while its batches are non-empty (at most
 * `maxBatchesPerClaim`), renewing the lease between messages once a third of
 * the TTL has passed; if the lease was taken over meanwhile it stops
 * processing that slot at once, without acking (the new owner gets the same
 * batch), and counts it in `lostSlots`. Events of one key arrive in order,
 * on one loop at a time.
 *
 * It follows an online resize of N (docs/partition-keys.md, "Resizing N
 * online") without a restart: `n` is only the N it subscribes with (a
 * consumer resized since keeps its new N); a loop whose calls are refused
 * because N changed, or that is handed a slot beyond the N it knows,
 * re-reads N from the server and goes on with the new slots (`n` follows).
 */
export class PartitionedConsumer extends Runner {
  /** The consumer's N as this consumer last knew it (it follows a resize). */
  n: number;
  readonly workers: number;
  readonly ttlMs: number;
  readonly maxBatchesPerClaim: number;
  readonly workerId: string;
  readonly failurePolicy: "skip" | "pause";
  readonly onDeadLetter: "resume" | "block";
  /** Slots whose lease a loop lost while it held a batch. */
  lostSlots = 0;

  /** Makes a partitioned consumer; nothing connects before {@link run}. */
  constructor(options: PartitionedConsumerOptions) {
    super(options);
    this.n = options.n;
    this.workers = options.workers ?? 1;
    if (!Number.isInteger(this.workers) || this.workers < 1) throw new RangeError("workers must be at least 1");
    this.ttlMs = Math.max(1000, options.ttlMs ?? 30_000);
    this.maxBatchesPerClaim = options.maxBatchesPerClaim ?? 16;
    this.workerId = options.workerId ?? `${hostname()}-${process.pid}-${shortId()}`;
    this.failurePolicy = options.failurePolicy ?? "skip";
    this.onDeadLetter = options.onDeadLetter ?? "resume";
    if (this.failurePolicy !== "skip" && this.failurePolicy !== "pause") {
      throw new RangeError(`failurePolicy must be "skip" or "pause", not ${JSON.stringify(this.failurePolicy)}`);
    }
    if (this.onDeadLetter !== "resume" && this.onDeadLetter !== "block") {
      throw new RangeError(`onDeadLetter must be "resume" or "block", not ${JSON.stringify(this.onDeadLetter)}`);
    }
  }

  protected override pauseKeys(): boolean {
    return this.failurePolicy === "pause";
  }

  /** The lease owner name of loop `i`. */
  workerName(i: number): string {
    return `${this.workerId}/${i}`;
  }

  /** Subscribes the N slots (unless `subscribe: false`), then runs the M
   * loops until stop(), `signal` aborts or SIGTERM / SIGINT. Rejects with the
   * first error a loop failed with (the others are stopped). */
  async run(options: { signal?: AbortSignal } = {}): Promise<void> {
    const errors: unknown[] = [];
    await this.runWith(options.signal, async () => {
      if (this.subscribe) {
        const c = await connect(this.connection);
        try {
          const n = this.n;
          try {
            if (this.failurePolicy === "skip" && this.onDeadLetter === "resume") {
              await query(c, "SELECT pgque.subscribe_partitioned($1::text, $2::text, $3::int4)", [this.queue, this.consumer, n]);
            } else {
              await query(c, "SELECT pgque.subscribe_partitioned($1::text, $2::text, $3::int4, $4::text, $5::text)", [
                this.queue,
                this.consumer,
                n,
                this.failurePolicy,
                this.onDeadLetter,
              ]);
            }
          } catch (err) {
            // Subscribed already with another N (resized since): follow the server's.
            if (!(err instanceof InvalidParameterValue) || (await this.refreshN(c)) === n) throw err;
          }
        } finally {
          await closeQuietly(c);
        }
      }
      const loops = Array.from({ length: this.workers }, (_, i) =>
        this.loop(i).catch((err) => {
          errors.push(err);
          this.stop();
        }),
      );
      await Promise.all(loops);
    });
    if (errors.length > 0) throw errors[0];
  }

  private async loop(i: number): Promise<void> {
    const wid = this.workerName(i);
    const ttl = this.ttlMs / 1000;
    let idle = 0;
    let conn: pg.Client | undefined;
    // The slot this loop holds the lease of, kept across a lost connection:
    // after reconnecting it claims that slot again first (the owner's re-claim
    // renews its lease), instead of leaving it, and its open batch, to wait
    // out the TTL.
    let held: number | undefined;
    try {
      while (!this.stopping) {
        if (conn === undefined) conn = await connect(this.connection);
        const gen = this.waker.gen;
        let got: number;
        try {
          let claim: { slot: number; epoch: unknown } | undefined;
          if (held !== undefined) {
            const { rows } = await query<{ epoch: unknown }>(
              conn,
              "SELECT pgque.claim_slot($1::text, $2::text, $3::int4, $4::text, make_interval(secs => $5::float8)) AS epoch",
              [this.queue, this.consumer, held, wid, ttl],
            );
            const epoch = rows[0]?.epoch;
            claim = epoch === null || epoch === undefined ? undefined : { slot: held, epoch };
            held = undefined;
          }
          if (claim === undefined) {
            const { rows } = await query<{ slot: number; epoch: unknown }>(
              conn,
              "SELECT slot, epoch FROM pgque.claim_next_slot($1::text, $2::text, $3::text, make_interval(secs => $4::float8))",
              [this.queue, this.consumer, wid, ttl],
            );
            claim = rows[0];
          }
          if (claim === undefined) {
            // Every slot is held by a live lease of another loop or worker.
            await this.waitTick(gen);
            continue;
          }
          held = claim.slot;
          // A slot of a bigger N: the consumer was resized.
          if (claim.slot >= this.n) await this.refreshN(conn);
          got = await this.serveSlot(conn, wid, claim.slot, toId(claim.epoch));
          held = undefined;
        } catch (err) {
          if (err instanceof SlotLost) {
            held = undefined;
            this.log.warn(`consumer ${wid}: ${err.message}`);
            this.lostSlots++;
            continue;
          }
          if (!isConnectionError(err)) throw err;
          this.log.warn(`consumer ${wid}: ${(err as Error).message}; reconnecting`);
          await closeQuietly(conn);
          conn = undefined;
          await sleep(1000);
          continue;
        }
        idle = got > 0 ? 0 : idle + 1;
        if (idle >= Math.max(1, Math.ceil(this.n / this.workers))) {
          idle = 0;
          await this.waitTick(gen);
        }
      }
    } finally {
      await closeQuietly(conn);
    }
  }

  /** Drains up to maxBatchesPerClaim batches of a claimed slot, then releases
   * it. Returns the number of events handled. Throws SlotLost when the lease
   * was taken over (nothing acked, the slot is not released). */
  private async serveSlot(conn: pg.Client, wid: string, slot: number, epoch0: number): Promise<number> {
    const args = [this.queue, this.consumer, slot, this.n, wid];
    const ttl = this.ttlMs / 1000;
    let epoch = epoch0;
    let renewed = Date.now();
    let total = 0;
    for (let b = 0; b < this.maxBatchesPerClaim && !this.stopping; b++) {
      let msgs: Message[];
      try {
        msgs = await this.receive(
          conn,
          "receive_partitioned",
          "$1::text, $2::text, $3::int4, $4::int4, $5::text, $6::int4",
          [...args, this.batchSize],
        );
      } catch (err) {
        if (err instanceof WrongState) throw new SlotLost(`slot ${slot}: lease lost before receive (${err.message})`, { cause: err });
        throw await this.resized(conn, slot, err, args[3] as number, wid);
      }
      renewed = Date.now();
      if (msgs.length === 0) break;
      const renew = async (): Promise<void> => {
        if (Date.now() - renewed <= this.ttlMs / 3) return;
        const { rows: got } = await query<{ epoch: unknown }>(
          conn,
          "SELECT pgque.claim_slot($1::text, $2::text, $3::int4, $4::text, make_interval(secs => $5::float8)) AS epoch",
          [this.queue, this.consumer, slot, wid, ttl],
        );
        const e = got[0]?.epoch === undefined ? null : toIdOrNull(got[0].epoch);
        // The same epoch: renewed. epoch + 1: it had lapsed and nobody took it
        // in between (a take-over would have made that epoch its own), so the
        // batch is still ours. Anything else: another worker held the slot.
        if (e === null || (e !== epoch && e !== epoch + 1)) {
          if (e !== null) await this.releaseQuietly(conn, slot, wid);
          throw new SlotLost(`slot ${slot}: lease taken over (epoch ${epoch} -> ${e})`);
        }
        epoch = e;
        renewed = Date.now();
      };
      try {
        await this.handleBatch(
          conn,
          msgs,
          (m, why) =>
            query(
              conn,
              "SELECT pgque.nack_partitioned($1::text, $2::text, $3::int4, $4::int4, $5::text, " +
                `${msgRow(6)}, make_interval(secs => $16::float8), $17::text)`,
              [...args, ...msgParams(m), this.retryAfterMs / 1000, why],
            ),
          () => query(conn, "SELECT pgque.ack_partitioned($1::text, $2::text, $3::int4, $4::int4, $5::text)", args),
          // Inside the transaction of a txHandler the claim_slot would hold the
          // lease row to commit; renewing there is still correct (it commits
          // with the ack), and a lost lease rolls the effects back.
          renew,
        );
      } catch (err) {
        if (err instanceof WrongState) throw new SlotLost(`slot ${slot}: lease lost before ack (${err.message})`, { cause: err });
        throw await this.resized(conn, slot, err, args[3] as number, wid);
      }
      renewed = Date.now();
      total += msgs.length;
      this.handled += msgs.length;
    }
    try {
      await query(conn, "SELECT pgque.release_slot($1::text, $2::text, $3::int4, $4::text)", [this.queue, this.consumer, slot, wid]);
    } catch (err) {
      // A resize between the last batch and this release (a shrink leaves
      // the slot out of range: 22003) is a lost slot, as in receive.
      throw await this.resized(conn, slot, err, args[3] as number, wid);
    }
    return total;
  }

  /** Re-reads the consumer's N from the server (after a resize); returns it. */
  private async refreshN(conn: pg.Client): Promise<number> {
    const { rows } = await query<{ n: number }>(
      conn,
      "SELECT n FROM pgque.partition_slot_status WHERE queue_name = $1 AND consumer = $2 LIMIT 1",
      [this.queue, this.consumer],
    );
    if (rows[0] !== undefined) this.n = rows[0].n;
    return this.n;
  }

  /** A fenced call refused for the N it passed (22023 "has N' slots, not N",
   * or 22003 for a slot beyond it): when the server's N differs, the
   * consumer was resized (the batch, not acked, is redelivered on the keys'
   * new slots): SlotLost, and the loop goes on with the new N. Otherwise the
   * error itself. `used` is the N the call passed, not `this.n`: another
   * loop may have refreshed N already. The slot is given back (when no
   * batch is open): claimNextSlot never hands a loop its own lease, so a
   * kept one would hold the slot's keys back until its ttl. */
  private async resized(conn: pg.Client, slot: number, err: unknown, used: number, wid: string): Promise<unknown> {
    if (!(err instanceof InvalidParameterValue || err instanceof NumericValueOutOfRange)) return err;
    const before = used;
    if ((await this.refreshN(conn)) === before) return err;
    try {
      await this.releaseQuietly(conn, slot, wid);
    } catch {
      // not ours any more: the cutover ended every lease
    }
    return new SlotLost(`slot ${slot}: consumer resized from ${before} to ${this.n} slots`, { cause: err });
  }

  private async releaseQuietly(conn: pg.Client, slot: number, wid: string): Promise<void> {
    try {
      await query(conn, "SELECT pgque.release_slot($1::text, $2::text, $3::int4, $4::text)", [this.queue, this.consumer, slot, wid]);
    } catch (err) {
      // An open batch (55000): the lease lapses after its ttl and the batch is redelivered.
      if (!(err instanceof WrongState)) throw err;
    }
  }
}
