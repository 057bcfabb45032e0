/**
 * The client as an application runs it: a role with only pgque_writer and
 * pgque_reader, over TCP with a scram-sha-256 password (clients/run.sh makes
 * it and exports PGQUE_TEST_APP_*). The superuser makes the queues; the
 * producers, the job Worker and a Consumer run as the application alone.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import pg from "pg";

import { Consumer, Worker, enqueueMany, sendBatch, type Message } from "../src/index.js";
import { client, freshDatabase, jobStates, uniq, waitUntil } from "./helpers.js";

const DB = "pgque_ts_app_role";
let admin: pg.Client;

/** The application role's settings for the test database. */
function app(): pg.ClientConfig {
  const env = (n: string): string => {
    const v = process.env[n];
    if (!v) throw new Error(`${n} not set: run through clients/run.sh`);
    return v;
  };
  return {
    host: env("PGQUE_TEST_APP_HOST"),
    port: Number(env("PGQUE_TEST_PORT")),
    user: env("PGQUE_TEST_APP_USER"),
    password: env("PGQUE_TEST_APP_PASSWORD"),
    database: DB,
  };
}

before(async () => {
  admin = await client(await freshDatabase(DB));
});
after(async () => {
  await admin.end();
});

test("the application role logs in with scram over TCP and holds only pgque's groups", async () => {
  const c = await client(app());
  try {
    const { rows } = await c.query(
      "SELECT current_user::text AS who, inet_server_addr()::text AS addr, rolsuper FROM pg_roles WHERE rolname = current_user",
    );
    assert.deepEqual(rows[0], { who: "pgque_app", addr: "127.0.0.1/32", rolsuper: false });
    await assert.rejects(c.query("SELECT pgque.create_queue('nope')"), (e: { code?: string }) => e.code === "42501");
  } finally {
    await c.end();
  }
  await assert.rejects(client({ ...app(), password: "not-the-password" }), /password authentication failed/);
});

test("producers, the Worker and a Consumer as the application role", async () => {
  const jq = uniq("jq");
  const ev = uniq("ev");
  await admin.query("SELECT pgque.create_job_queue($1)", [jq]);
  await admin.query("SELECT pgque.create_queue($1)", [ev]);
  await admin.query("SELECT pgque.subscribe($1, 'app')", [ev]);
  const c = await client(app());
  let sent: number[];
  try {
    await enqueueMany(
      c,
      jq,
      Array.from({ length: 30 }, (_, i) => ({ kind: "work", args: { i } })),
    );
    sent = await sendBatch(c, ev, Array.from({ length: 20 }, (_, i) => ({ i })), { type: "t" });
  } finally {
    await c.end();
  }
  const seen = new Map<number, number>();
  const got: number[] = [];
  const w = new Worker({ connection: app(), queues: [jq], concurrency: 4, pollIntervalMs: 200, handleSignals: false }).handle(
    "work",
    (job) => {
      seen.set(job.id, (seen.get(job.id) ?? 0) + 1);
      return { i: (job.args as { i: number }).i };
    },
  );
  const consumer = new Consumer({
    connection: app(),
    queue: ev,
    consumer: "app",
    pollIntervalMs: 200,
    handleSignals: false,
    handler: (m: Message) => {
      got.push(m.msgId);
    },
  });
  const ac = new AbortController();
  const runs = [w.run({ signal: ac.signal }), consumer.run({ signal: ac.signal })];
  try {
    await admin.query("SELECT pgque.force_tick($1)", [ev]);
    await waitUntil(
      async () => (await jobStates(admin, jq)).completed === 30 && got.length === 20,
      60_000,
      "every job and event",
      100,
    );
  } finally {
    ac.abort();
    await Promise.all(runs);
  }
  assert.equal(seen.size, 30);
  assert.deepEqual(new Set(seen.values()), new Set([1]), "no job ran twice");
  assert.deepEqual(got, sent);
});
