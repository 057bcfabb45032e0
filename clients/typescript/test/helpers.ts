/**
 * Test fixtures: a real PostgreSQL with pgque, started by clients/run.sh,
 * which sets PGQUE_TEST_HOST / PGQUE_TEST_PORT. Each test file makes a
 * database of its own (files run in parallel); each test uses queues of its
 * own (unique names).
 */
import { randomBytes } from "node:crypto";

import pg from "pg";

/** Connection settings for database `db` of the test server. */
export function connection(db: string): pg.ClientConfig {
  const host = process.env.PGQUE_TEST_HOST;
  const port = process.env.PGQUE_TEST_PORT;
  if (!host || !port) {
    throw new Error("PGQUE_TEST_HOST/PORT not set: run these tests through clients/run.sh 15 typescript");
  }
  return { host, port: Number(port), user: "postgres", database: db };
}

/** (Re)creates database `db` with the extension and the tables the tests
 * write (`handled`, `effects`); returns its connection settings. `db` is a
 * constant of the test file, checked to be a plain identifier. */
export async function freshDatabase(db: string): Promise<pg.ClientConfig> {
  if (!/^[a-z_][a-z0-9_]*$/.test(db)) throw new Error(`bad test database name ${db}`);
  const admin = new pg.Client(connection("postgres"));
  await admin.connect();
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${db}`);
  } finally {
    await admin.end();
  }
  const cfg = connection(db);
  const c = new pg.Client(cfg);
  await c.connect();
  try {
    await c.query("CREATE EXTENSION pgque");
    await c.query("CREATE TABLE handled (job_id bigint, at timestamptz DEFAULT clock_timestamp())");
    await c.query(
      "CREATE TABLE effects (job_id bigint, attempt int, note text, " +
        "CONSTRAINT effects_note_key UNIQUE (note) DEFERRABLE INITIALLY DEFERRED)",
    );
  } finally {
    await c.end();
  }
  return cfg;
}

/** A connected client (autocommit); close it with `end()`. */
export async function client(cfg: pg.ClientConfig): Promise<pg.Client> {
  const c = new pg.Client(cfg);
  await c.connect();
  return c;
}

/** A fresh queue name for one test. */
export function uniq(prefix = "t"): string {
  return `${prefix}_${randomBytes(5).toString("hex")}`;
}

/** Polls `pred` until it returns a truthy value (returned) or fails after `timeoutMs`. */
export async function waitUntil<T>(pred: () => Promise<T> | T, timeoutMs: number, what: string, everyMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** Counts of the queue's jobs by state (pgque.all_jobs: both stores). */
export async function jobStates(c: pg.Client, queue: string): Promise<Record<string, number>> {
  const { rows } = await c.query<{ state: string; n: number }>(
    "SELECT state, count(*)::int AS n FROM pgque.all_jobs WHERE queue = $1 GROUP BY state",
    [queue],
  );
  return Object.fromEntries(rows.map((r) => [r.state, r.n]));
}

/** One job's row from pgque.get_job. */
export async function getJob(c: pg.Client, id: number): Promise<Record<string, unknown>> {
  const { rows } = await c.query("SELECT * FROM pgque.get_job($1)", [id]);
  if (rows[0] === undefined) throw new Error(`no job ${id}`);
  return rows[0] as Record<string, unknown>;
}

/** A promise with its resolve function, for handlers that wait on the test. */
export function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}

/** Sleeps `ms`. */
export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
