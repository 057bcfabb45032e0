/**
 * Consumer on the waiting receive (docs/waits.md) against a real server: it
 * waits inside the server (an Extension wait event, no LISTEN), gets an
 * event sent by another connection quickly, returns promptly when stopped
 * while waiting, caps its wait under statement_timeout, and LISTENs and
 * polls with `waitMs: 0` and on a server without the waits (a 0.8.0 schema).
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import pg from "pg";

import { Consumer, features, send, type Message } from "../src/index.js";
import { client, connection, freshDatabase, sleep, uniq, waitUntil } from "./helpers.js";

let cfg: pg.ClientConfig;
let conn: pg.Client;

before(async () => {
  cfg = await freshDatabase("pgque_ts_consumer_wait");
  conn = await client(cfg);
});
after(async () => {
  await conn.end();
});

interface Backend {
  state: string | null;
  wait_event_type: string | null;
  query: string;
}

async function backends(c: pg.Client, app: string): Promise<Backend[]> {
  const { rows } = await c.query<Backend>(
    "SELECT state, wait_event_type, query FROM pg_stat_activity WHERE application_name = $1",
    [app],
  );
  return rows;
}

async function waitingInServer(c: pg.Client, app: string): Promise<boolean> {
  return (await backends(c, app)).some((b) => b.state === "active" && b.wait_event_type === "Extension");
}

async function listening(c: pg.Client, app: string): Promise<boolean> {
  return (await backends(c, app)).some((b) => b.query.startsWith("LISTEN"));
}

function running(c: Consumer): { stop: () => Promise<void>; done: Promise<void> } {
  const ac = new AbortController();
  const done = c.run({ signal: ac.signal });
  done.catch(() => undefined);
  return {
    done,
    stop: async () => {
      ac.abort();
      await done;
    },
  };
}

function consumer(c: pg.ClientConfig, queue: string, seen: [number, number][], extra: Partial<ConstructorParameters<typeof Consumer>[0]> = {}): Consumer {
  return new Consumer({
    connection: c,
    queue,
    consumer: "c1",
    handleSignals: false,
    handler: (m: Message) => {
      seen.push([m.msgId, performance.now()]);
    },
    ...extra,
  });
}

test("Consumer waits in the server and gets an event quickly", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  const app = `ts_wait_${q}`;
  const seen: [number, number][] = [];
  const c = consumer({ ...cfg, application_name: app }, q, seen);
  assert.equal(c.waitMs, 5000);
  const r = running(c);
  try {
    await waitUntil(() => waitingInServer(conn, app), 10_000, "the consumer waiting in the server", 20);
    assert.ok(c.serverWaits);
    assert.ok(!(await listening(conn, app)), JSON.stringify(await backends(conn, app)));
    const lat: number[] = [];
    for (let i = 0; i < 3; i++) {
      const t0 = performance.now();
      await send(conn, q, { i }, { type: "t" });
      await waitUntil(() => seen.length > i, 10_000, `event ${i} handled`, 1);
      lat.push((seen[i] as [number, number])[1] - t0);
      await waitUntil(() => waitingInServer(conn, app), 10_000, "waiting again", 10);
    }
    console.log(`# waiting receive latency (commit -> handler): ${lat.map((l) => l.toFixed(1)).join(", ")} ms`);
    assert.ok(Math.max(...lat) < 1000, String(lat));
  } finally {
    await r.stop();
  }
});

test("stop while waiting cancels the wait", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  const app = `ts_stop_${q}`;
  const seen: [number, number][] = [];
  const r = running(consumer({ ...cfg, application_name: app }, q, seen, { waitMs: 9000 }));
  await waitUntil(() => waitingInServer(conn, app), 10_000, "the consumer waiting in the server", 20);
  await sleep(300); // well inside the 9 s wait
  const t0 = performance.now();
  await r.stop();
  const took = performance.now() - t0;
  assert.ok(took < 2000, `stop took ${took.toFixed(0)} ms`);
  await waitUntil(async () => (await backends(conn, app)).length === 0, 5000, "the consumer's backend gone");
  // A new run after the cancelled wait reads on.
  const app2 = `ts_stop2_${q}`;
  const r2 = running(consumer({ ...cfg, application_name: app2 }, q, seen));
  try {
    await waitUntil(() => waitingInServer(conn, app2), 10_000, "waiting", 20);
    const id = await send(conn, q, {}, { type: "t" });
    await waitUntil(() => seen.length === 1, 10_000, "the event handled", 10);
    assert.equal(seen[0]?.[0], id);
  } finally {
    await r2.stop();
  }
});

test("the wait is capped under statement_timeout", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  const app = `ts_stmt_${q}`;
  const seen: [number, number][] = [];
  const c = consumer({ ...cfg, application_name: app, statement_timeout: 1000 }, q, seen);
  const r = running(c);
  try {
    await waitUntil(() => waitingInServer(conn, app), 10_000, "the consumer waiting in the server", 20);
    await sleep(2500); // five waits' ends; two timeouts had the wait not been capped
    const id = await send(conn, q, {}, { type: "t" });
    await waitUntil(() => seen.length === 1, 10_000, "the event handled", 10);
    assert.equal(seen[0]?.[0], id);
    assert.ok(c.serverWaits);
  } finally {
    await r.stop();
  }
});

test("waitMs: 0 listens and polls", async () => {
  const q = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [q]);
  const app = `ts_nowait_${q}`;
  const seen: [number, number][] = [];
  const c = consumer({ ...cfg, application_name: app }, q, seen, { waitMs: 0, pollIntervalMs: 60_000 });
  const r = running(c);
  try {
    await waitUntil(() => listening(conn, app), 10_000, "the consumer's LISTEN", 20);
    await sleep(300);
    assert.ok(!c.serverWaits);
    assert.ok(!(await waitingInServer(conn, app)));
    await send(conn, q, {}, { type: "t" });
    // a 60 s poll: only the tick's NOTIFY wakes it in time
    await waitUntil(() => seen.length === 1, 10_000, "the event handled", 10);
  } finally {
    await r.stop();
  }
});

test("a server without the waits gets LISTEN and poll", async () => {
  const db = "pgque_ts_wait_080";
  const admin = await client(connection("postgres"));
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${db}`);
  } finally {
    await admin.end();
  }
  const old = connection(db);
  const oc = await client(old);
  try {
    await oc.query("CREATE EXTENSION pgque VERSION '0.8.0'");
    assert.equal((await features(oc)).receiveWait, false);
    const q = uniq();
    await oc.query("SELECT pgque.create_queue($1)", [q]);
    const app = `ts_old_${q}`;
    const seen: [number, number][] = [];
    const c = consumer({ ...old, application_name: app }, q, seen, { pollIntervalMs: 60_000 });
    const r = running(c);
    try {
      await waitUntil(() => listening(oc, app), 10_000, "the consumer's LISTEN", 20);
      assert.ok(!c.serverWaits);
      await send(oc, q, {}, { type: "t" });
      await waitUntil(() => seen.length === 1, 10_000, "the event handled", 10);
      assert.ok(!(await waitingInServer(oc, app)));
    } finally {
      await r.stop();
    }
  } finally {
    await oc.end();
  }
});
