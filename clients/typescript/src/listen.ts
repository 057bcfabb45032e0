/**
 * A LISTEN connection of its own, calling back on every NOTIFY.
 *
 * The worker and the consumers sleep on a {@link Waker}; this turns the
 * server's notifications (`pgque.job_channel(queue)` at a job enqueue's
 * commit, `pgque_<queue>` at every tick) into wake-ups. It runs no query
 * besides LISTEN, so a slow handler or a long dispatch never delays a
 * wake-up. A dropped connection is re-made after a second; `onNotify` is
 * also called after each (re)connect, since notifications sent while
 * disconnected are gone.
 */
import type pg from "pg";

import { closeQuietly, connect, sleep, type ConnectionOptions, type Logger } from "./util.js";

/** Keeps a connection LISTENing on `channels` until {@link close}. */
export class Listener {
  private client: pg.Client | undefined;
  private readonly closed = new AbortController();
  private loop: Promise<void> | undefined;

  /** Prepares a listener; nothing connects before {@link start}. */
  constructor(
    private readonly connection: ConnectionOptions,
    private readonly channels: string[],
    private readonly onNotify: () => void,
    private readonly log: Logger,
  ) {}

  /** Connects and LISTENs; resolves once the subscriptions are in place (so
   * nothing committed after the owner's first poll goes unnoticed), or after
   * the first failed attempt (the loop goes on retrying). */
  async start(): Promise<void> {
    let ready!: () => void;
    const first = new Promise<void>((r) => (ready = r));
    this.loop = this.run(ready);
    await first;
  }

  private async run(ready: () => void): Promise<void> {
    while (!this.closed.signal.aborted) {
      let lost!: (err: Error) => void;
      const dropped = new Promise<Error>((r) => (lost = r));
      try {
        this.client = await connect(this.connection, (err) => lost(err));
        this.client.on("end", () => lost(new Error("connection ended")));
        this.client.on("notification", () => this.onNotify());
        for (const ch of this.channels) {
          // A channel is an identifier; LISTEN takes no parameters. Quoted.
          await this.client.query(`LISTEN "${ch.replace(/"/g, '""')}"`);
        }
        ready();
        this.onNotify();
        const err = await Promise.race([dropped, closedPromise(this.closed.signal)]);
        if (err instanceof Error && !this.closed.signal.aborted) throw err;
      } catch (err) {
        ready();
        if (this.closed.signal.aborted) break;
        this.log.warn(`listener: ${(err as Error).message}; reconnecting in 1 s`);
        await closeQuietly(this.client);
        this.client = undefined;
        await sleep(1000, this.closed.signal);
      }
    }
  }

  /** Stops listening and closes the connection. */
  async close(): Promise<void> {
    this.closed.abort();
    await closeQuietly(this.client);
    await this.loop;
  }
}

function closedPromise(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}
