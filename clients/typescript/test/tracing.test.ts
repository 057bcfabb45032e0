/** Trace context (docs/tracing.md) with the OpenTelemetry SDK's in-memory
 * exporter: the producer's send span and the headers it stores, the worker's
 * process span per attempt (child of and linked to the producer on the
 * first, a new linked trace on a retry), an enqueue inside a handler
 * carrying the process span's context on, and explicit headers. */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { context, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type ReadableSpan,
} from "@opentelemetry/sdk-trace-base";
import pg from "pg";

import { Worker, enqueue, enqueueFlow, enqueueMany } from "../src/index.js";
import { client, freshDatabase, jobStates, uniq, waitUntil } from "./helpers.js";

const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

let cfg: pg.ClientConfig;
let conn: pg.Client;

before(async () => {
  cfg = await freshDatabase("pgque_ts_tracing");
  conn = await client(cfg);
});
after(async () => {
  await conn.end();
});

const named = (name: string): ReadableSpan[] => exporter.getFinishedSpans().filter((s) => s.name === name);

async function headersOf(id: number | null): Promise<Record<string, string> | null> {
  const { rows } = await conn.query<{ headers: Record<string, string> | null }>(
    "SELECT headers FROM pgque.get_job($1)",
    [id],
  );
  return rows[0]?.headers ?? null;
}

test("producer and worker spans per attempt, and an enqueue inside a handler", async () => {
  const [qa, qb] = [uniq("ta"), uniq("tb")];
  await conn.query("SELECT pgque.create_job_queue($1), pgque.create_job_queue($2)", [qa, qb]);
  const tracer = trace.getTracer("test");
  let traceId = "";
  let rootSpanId = "";
  const [a, batch] = await tracer.startActiveSpan("request", async (root) => {
    traceId = root.spanContext().traceId;
    rootSpanId = root.spanContext().spanId;
    const a = await enqueue(conn, qa, "flaky", {});
    const batch = await enqueueMany(conn, qa, [["ok"], ["ok"]]);
    root.end();
    return [a, batch] as const;
  });
  const sends = named(`send ${qa}`);
  assert.equal(sends.length, 2);
  for (const s of sends) {
    assert.equal(s.kind, SpanKind.PRODUCER);
    assert.equal(s.spanContext().traceId, traceId);
    assert.equal(s.parentSpanContext?.spanId, rootSpanId);
    assert.equal(s.attributes["messaging.system"], "pgque");
    assert.equal(s.attributes["messaging.destination.name"], qa);
  }
  const [send, sendBatch] = sends as [ReadableSpan, ReadableSpan];
  assert.equal(sendBatch.attributes["messaging.batch.message_count"], 2);
  assert.deepEqual(await headersOf(a), {
    traceparent: `00-${traceId}-${send.spanContext().spanId}-01`,
  });
  for (const e of batch) {
    assert.equal((await headersOf(e.jobId))?.traceparent, `00-${traceId}-${sendBatch.spanContext().spanId}-01`);
  }

  let nested: number | null = null;
  const w = new Worker({ connection: cfg, queues: qa, concurrency: 2, pollIntervalMs: 200, handleSignals: false })
    .handle("flaky", async (job) => {
      if (job.attempt === 1) throw new Error("boom on the first attempt");
      nested = await enqueue(conn, qb, "nested", {});
    })
    .handle("ok", () => undefined);
  const ac = new AbortController();
  const done = w.run({ signal: ac.signal });
  try {
    await waitUntil(async () => (await jobStates(conn, qa)).completed === 3, 60_000, "the jobs and the retry", 100);
  } finally {
    ac.abort();
    await done;
  }
  const procs = named(`process ${qa}`);
  const ofA = procs
    .filter((s) => s.attributes["messaging.message.id"] === String(a))
    .sort((x, y) => Number(x.attributes["pgque.job.attempt"]) - Number(y.attributes["pgque.job.attempt"]));
  assert.equal(ofA.length, 2, "one process span per attempt");
  for (const p of ofA) {
    assert.equal(p.kind, SpanKind.CONSUMER);
    assert.equal(p.attributes["messaging.operation.type"], "process");
    assert.equal(p.attributes["pgque.job.kind"], "flaky");
    assert.deepEqual(
      p.links.map((l) => l.context.spanId),
      [send.spanContext().spanId],
    );
  }
  const [first, retry] = ofA as [ReadableSpan, ReadableSpan];
  assert.equal(first.spanContext().traceId, traceId);
  assert.equal(first.parentSpanContext?.spanId, send.spanContext().spanId);
  assert.equal(first.status.code, SpanStatusCode.ERROR);
  assert.equal(retry.attributes["pgque.job.attempt"], 2);
  assert.notEqual(retry.spanContext().traceId, traceId);
  assert.equal(retry.parentSpanContext, undefined);
  assert.notEqual(retry.status.code, SpanStatusCode.ERROR);
  // the nested enqueue ran in the retry's span
  const [nestedSend] = named(`send ${qb}`);
  assert.ok(nestedSend);
  assert.equal(nestedSend.parentSpanContext?.spanId, retry.spanContext().spanId);
  assert.equal(
    (await headersOf(nested))?.traceparent,
    `00-${retry.spanContext().traceId}-${nestedSend.spanContext().spanId}-01`,
  );
  for (const e of batch) {
    const [p] = procs.filter((s) => s.attributes["messaging.message.id"] === String(e.jobId));
    assert.equal(p?.parentSpanContext?.spanId, sendBatch.spanContext().spanId);
  }
});

test("explicit headers win; bad ones are refused", async () => {
  const q = uniq("tx");
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const tp = "00-11111111111111111111111111111111-2222222222222222-01";
  const id = await enqueue(conn, q, "k", {}, { headers: { traceparent: tp } });
  assert.deepEqual(await headersOf(id), { traceparent: tp });
  const [m] = await enqueueMany(conn, q, [{ kind: "k", headers: { x: "y" } }]);
  assert.deepEqual(await headersOf(m?.jobId ?? null), { x: "y" });
  await assert.rejects(
    enqueue(conn, q, "k", {}, { headers: { traceparent: 1 } as unknown as Record<string, string> }),
    (e: Error & { code?: string }) => e.code === "22023",
  );
});

test("a flow's jobs carry its send span's context; their own headers win", async () => {
  const q = uniq("tf");
  await conn.query("SELECT pgque.create_job_queue($1)", [q]);
  const own = "00-11111111111111111111111111111111-3333333333333333-01";
  const flow = await trace.getTracer("test").startActiveSpan("request", async (root) => {
    const f = await enqueueFlow(conn, q, [
      { key: "a", kind: "k" },
      { key: "b", kind: "k", dependsOn: ["a"] },
      { key: "c", kind: "k", headers: { traceparent: own } },
    ]);
    root.end();
    return f;
  });
  const [send] = named(`send ${q}`);
  assert.ok(send);
  assert.equal(send.attributes["messaging.batch.message_count"], 3);
  const id = (k: string): number | null => flow.find((f) => f.key === k)?.jobId ?? null;
  const tp = `00-${send.spanContext().traceId}-${send.spanContext().spanId}-01`;
  assert.deepEqual(await headersOf(id("a")), { traceparent: tp });
  assert.deepEqual(await headersOf(id("b")), { traceparent: tp });
  assert.deepEqual(await headersOf(id("c")), { traceparent: own });
});
