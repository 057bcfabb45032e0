/**
 * Internal helpers: the queryable interface producers accept, the query
 * wrapper that translates errors, id conversion, and the wake-up primitive
 * the worker and consumers sleep on.
 */
import net from "node:net";

import type { QueryResult, QueryResultRow } from "pg";
import pg from "pg";

import { translateError } from "./errors.js";

/** Anything with node-postgres' `query(text, values)`: a `pg.Client`, a
 * `pg.PoolClient` (in or out of a transaction) or a `pg.Pool`. */
export interface Queryable {
  query<R extends QueryResultRow = QueryResultRow>(text: string, values?: unknown[]): Promise<QueryResult<R>>;
}

/** How to connect: a connection string or node-postgres' client config. */
export type ConnectionOptions = string | pg.ClientConfig;

/** Runs one statement with bound parameters; database errors come back as
 * typed PgqueErrors (errors.ts). */
export async function query<R extends QueryResultRow = QueryResultRow>(
  client: Queryable,
  text: string,
  values: unknown[] = [],
): Promise<QueryResult<R>> {
  try {
    return await client.query<R>(text, values);
  } catch (err) {
    throw translateError(err);
  }
}

/** A bigint column as a JS number. node-postgres returns int8 as a string
 * (or a number / bigint when the caller configured a parser); ids and tokens
 * come from sequences, far below 2^53, which this checks. */
export function toId(v: unknown): number {
  const n = typeof v === "number" ? v : Number(v);
  if (!Number.isSafeInteger(n)) throw new RangeError(`bigint value ${String(v)} is not a safe JS integer`);
  return n;
}

/** A nullable bigint column as a number or null. */
export function toIdOrNull(v: unknown): number | null {
  return v === null || v === undefined ? null : toId(v);
}

/** An int8[] column (node-postgres: an array of strings) as numbers. */
export function toIds(v: unknown): number[] {
  if (!Array.isArray(v)) throw new TypeError("expected an array of ids");
  return v.map(toId);
}

/** A duration in milliseconds as a float8 of seconds, for
 * `make_interval(secs => $n::float8)`; refuses a non-finite or negative value. */
export function secs(ms: number, what: string): number {
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`${what} must be a finite number of milliseconds >= 0`);
  return ms / 1000;
}

/** Connects a new node-postgres client, with an 'error' listener so that a
 * connection the server drops does not crash the process (the next query on
 * it fails instead, and the owner reconnects). */
export async function connect(options: ConnectionOptions, onError?: (err: Error) => void): Promise<pg.Client> {
  const client = new pg.Client(options);
  client.on("error", (err) => onError?.(err));
  await client.connect();
  return client;
}

/**
 * Sends the server a cancel request for the statement running on `client`
 * (the protocol's CancelRequest with the connection's process id and secret
 * key, on a socket of its own: no login, no privilege, and it reaches the
 * right backend through a pooler) and resolves once the server closed that
 * socket, which it does after it signalled the backend: a request sent
 * while the backend is idle is dropped there, so once this resolves the
 * client's next statement is safe from it.
 */
export function cancelRequest(client: pg.Client): Promise<void> {
  const c = client as unknown as { host: string; port: number; processID: number | null; secretKey: number | null };
  const { processID, secretKey } = c;
  if (processID === null || secretKey === null) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const sock = c.host.startsWith("/") ? net.connect(`${c.host}/.s.PGSQL.${c.port}`) : net.connect(c.port, c.host);
    const packet = Buffer.alloc(16);
    packet.writeInt32BE(16, 0);
    packet.writeInt32BE(80877102, 4); // the cancel request code
    packet.writeInt32BE(processID, 8);
    packet.writeInt32BE(secretKey, 12);
    sock.setTimeout(5_000, () => sock.destroy(new Error("cancel request: no answer in 5 s")));
    sock.on("connect", () => sock.end(packet));
    sock.on("error", reject);
    sock.on("close", () => resolve());
    sock.resume();
  });
}

/** Closes a client, ignoring errors (it may be broken already). */
export async function closeQuietly(client: pg.Client | undefined): Promise<void> {
  if (client === undefined) return;
  try {
    await client.end();
  } catch {
    /* already closed or broken */
  }
}

/**
 * A wake-up source: `notify()` bumps a generation counter and wakes every
 * waiter. A waiter takes `gen` before its query and then waits for a change
 * of it, so a notification that arrives while it is busy is not lost.
 */
export class Waker {
  /** How many notifications there were so far. */
  gen = 0;
  private waiters = new Set<() => void>();

  /** Wakes every waiter and bumps the generation: something may be ready
   * (a NOTIFY arrived, a reconnect, stop()). */
  notify(): void {
    this.gen++;
    this.poke();
  }

  /** Wakes every waiter to re-check its condition without bumping the
   * generation (a handler slot was freed): a waiter for new work sleeps on. */
  poke(): void {
    const ws = [...this.waiters];
    this.waiters.clear();
    for (const w of ws) w();
  }

  /** Resolves once `pred()` is true, re-checked at every notify, or after
   * `timeoutMs` (whatever pred says then). Returns pred's last value. */
  async waitFor(pred: () => boolean, timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (!pred()) {
      const left = deadline - Date.now();
      if (left <= 0) return pred();
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, left);
        const self = this;
        function done(): void {
          clearTimeout(timer);
          self.waiters.delete(done);
          resolve();
        }
        this.waiters.add(done);
      });
    }
    return true;
  }

  /** Resolves at the next notify after generation `gen` (at once if it
   * happened already), when `stop()` is true, or after `timeoutMs`. */
  waitGen(gen: number, timeoutMs: number, stop: () => boolean): Promise<boolean> {
    return this.waitFor(() => stop() || this.gen !== gen, timeoutMs);
  }
}

/** Sleeps `ms`, or less when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** A random suffix for worker ids. */
export function shortId(): string {
  return Math.random().toString(16).slice(2, 8);
}

/** Hooks SIGTERM and SIGINT to `onSignal` until the returned function is called. */
export function onSignals(onSignal: (sig: NodeJS.Signals) => void): () => void {
  const handler = (sig: NodeJS.Signals): void => onSignal(sig);
  process.on("SIGTERM", handler);
  process.on("SIGINT", handler);
  return () => {
    process.off("SIGTERM", handler);
    process.off("SIGINT", handler);
  };
}

/** pgque's logger: warnings of the background loops go to console.warn
 * unless the caller gives a logger of its own. */
export interface Logger {
  warn(message: string): void;
  error(message: string): void;
}

/** The default logger (console). */
export const consoleLogger: Logger = {
  warn: (m) => console.warn(`pgque: ${m}`),
  error: (m) => console.error(`pgque: ${m}`),
};
