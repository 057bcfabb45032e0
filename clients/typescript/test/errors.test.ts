/** Errors typed by SQLSTATE, from real server errors. */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import pg from "pg";

import {
  FeatureNotSupported,
  InvalidJson,
  InvalidName,
  InvalidParameterValue,
  NullValueNotAllowed,
  NumericValueOutOfRange,
  PgqueError,
  UndefinedObject,
  WrongState,
  enqueue,
  enqueueFlow,
  send,
  translateError,
} from "../src/index.js";
import { client, freshDatabase, uniq } from "./helpers.js";

let cfg: pg.ClientConfig;
let conn: pg.Client;

before(async () => {
  cfg = await freshDatabase("pgque_ts_errors");
  conn = await client(cfg);
});
after(async () => {
  await conn.end();
});

/** Asserts that `p` rejects with an instance of `cls` carrying `code`, a
 * PgqueError whose cause is node-postgres' DatabaseError with that code. */
async function rejectsWith(p: Promise<unknown>, cls: typeof PgqueError, code: string): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${String(e)}`);
    assert.ok(e instanceof PgqueError);
    assert.equal(e.code, code);
    assert.equal(e.name, cls.name);
    assert.ok(e.cause instanceof pg.DatabaseError, "the driver's error is the cause");
    assert.equal((e.cause as pg.DatabaseError).code, code);
    return true;
  });
}

test("each SQLSTATE class maps to its error class", async () => {
  const q = uniq();
  await rejectsWith(enqueue(conn, `no_such_${q}`, "k", {}), UndefinedObject, "42704");
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  await rejectsWith(enqueue(conn, q, "", {}), InvalidParameterValue, "22023");
  await rejectsWith(enqueue(conn, q, "k", {}, { priority: 5000 }), NumericValueOutOfRange, "22003");
  await rejectsWith(enqueue(conn, q, null as unknown as string, {}), NullValueNotAllowed, "22004");
  await rejectsWith(send(conn, "bad\nname; drop", { x: 1 }), InvalidName, "42602");
  await rejectsWith(send(conn, `no_such_${q}`, { x: 1 }), UndefinedObject, "42704");
  await rejectsWith(
    enqueueFlow(conn, q, [{ key: "a", kind: "x", unique_key: "u" }]),
    FeatureNotSupported,
    "0A000",
  );
  // 55000: a queue that still has consumers cannot be dropped.
  const eq = uniq();
  await conn.query("SELECT pgque.create_queue($1)", [eq]);
  await conn.query("SELECT pgque.subscribe($1, 'c')", [eq]);
  await rejectsWith(
    conn.query("SELECT pgque.drop_queue($1)", [eq]).catch((e) => {
      throw translateError(e);
    }),
    WrongState,
    "55000",
  );
  // 22P02 from the server's JSON input.
  await rejectsWith(
    conn.query("SELECT pgque.enqueue($1, 'k', $2::text::jsonb)", [q, "{not json"]).catch((e) => {
      throw translateError(e);
    }),
    InvalidJson,
    "22P02",
  );
});

test("other codes are PgqueError; connection-level errors pass through", async () => {
  const other = await conn.query("SELECT 1/0").catch((e: unknown) => translateError(e));
  assert.ok(other instanceof PgqueError && other.constructor === PgqueError);
  assert.equal((other as PgqueError).code, "22012");

  const shutdown = Object.assign(new Error("terminating connection due to administrator command"), {
    code: "57P01",
    severity: "FATAL",
  });
  assert.equal(translateError(shutdown), shutdown, "57P01 is about the server, not the call");
  const plain = new TypeError("not a database error");
  assert.equal(translateError(plain), plain);
  const epipe = Object.assign(new Error("write EPIPE"), { code: "EPIPE", errno: -32, syscall: "write" });
  assert.equal(translateError(epipe), epipe, "a system error's code is not a SQLSTATE");
  // A real one, from a session the server terminates.
  const victim = await client(cfg);
  const { rows } = await victim.query("SELECT pg_backend_pid() AS pid");
  // The client reports the FATAL, then the closed socket: keep listening for both.
  const dropped = new Promise<Error>((resolve) => victim.on("error", resolve));
  await conn.query("SELECT pg_terminate_backend($1)", [rows[0].pid]);
  const err = await dropped;
  assert.equal((err as { code?: string }).code, "57P01");
  assert.equal(translateError(err), err);
});
