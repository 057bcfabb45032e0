/** Trace context on events (docs/tracing.md, "Events") with the
 * OpenTelemetry SDK's in-memory exporter: the producers' `send <queue>`
 * spans and the headers the events store (explicit headers win), the
 * consumers' `process <queue>` span per event (child of and linked to the
 * send span on the first delivery, a new trace linked to it on a
 * redelivery, a throw marking it), for Consumer and PartitionedConsumer. */
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

import { Consumer, PartitionedConsumer, send, sendAt, sendBatch, sendIdem, type Message } from "../src/index.js";
import { client, freshDatabase, uniq, waitUntil } from "./helpers.js";

const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

const OWN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

let cfg: pg.ClientConfig;
let conn: pg.Client;

before(async () => {
  cfg = await freshDatabase("pgque_ts_event_tracing");
  conn = await client(cfg);
});
after(async () => {
  await conn.end();
});

const named = (name: string): ReadableSpan[] => exporter.getFinishedSpans().filter((s) => s.name === name);
const tp = (s: ReadableSpan): Record<string, string> => ({
  traceparent: `00-${s.spanContext().traceId}-${s.spanContext().spanId}-01`,
});

/** Every pending event of `consumer` with its stored headers (one batch of
 * receive_with_headers, acked). */
async function stored(queue: string, consumer: string): Promise<Map<number, Record<string, string> | null>> {
  await conn.query("SELECT pgque.force_tick($1)", [queue]);
  const { rows } = await conn.query<{ msg_id: string; batch_id: string; headers: Record<string, string> | null }>(
    "SELECT msg_id, batch_id, headers FROM pgque.receive_with_headers($1, $2, 1000)",
    [queue, consumer],
  );
  if (rows[0] !== undefined) await conn.query("SELECT pgque.ack($1)", [rows[0].batch_id]);
  return new Map(rows.map((r) => [Number(r.msg_id), r.headers]));
}

function running(c: { run(o: { signal: AbortSignal }): Promise<void> }): () => Promise<void> {
  const ac = new AbortController();
  const done = c.run({ signal: ac.signal });
  done.catch(() => undefined);
  return async () => {
    ac.abort();
    await done;
  };
}

test("send spans store their context on the events; explicit headers win", async () => {
  const q = uniq("ev");
  await conn.query("SELECT pgque.create_queue($1), pgque.subscribe($1, 'probe')", [q]);
  exporter.reset();
  const tracer = trace.getTracer("test");
  const { ids, root } = await tracer.startActiveSpan("request", async (span) => {
    const ids = [
      await send(conn, q, { n: 1 }),
      await send(conn, q, "text", { type: "t", partitionKey: "k" }),
      ...(await sendBatch(conn, q, [{ n: 2 }, { n: 3 }], { type: "b" })),
      (await sendIdem(conn, q, "i", { n: 4 }, `effect:${q}`)).eventId,
      await sendAt(conn, q, "a", { n: 5 }, new Date(Date.now() - 1000)),
      await send(conn, q, { own: 1 }, { headers: { traceparent: OWN } }),
    ];
    span.end();
    return { ids, root: span.spanContext() };
  });
  const sends = named(`send ${q}`);
  assert.equal(sends.length, 6);
  for (const s of sends) {
    assert.equal(s.kind, SpanKind.PRODUCER);
    assert.equal(s.spanContext().traceId, root.traceId);
    assert.equal(s.parentSpanContext?.spanId, root.spanId);
    assert.equal(s.attributes["messaging.system"], "pgque");
    assert.equal(s.attributes["messaging.destination.name"], q);
  }
  assert.deepEqual(
    sends.map((s) => s.attributes["messaging.batch.message_count"]),
    [undefined, undefined, 2, undefined, undefined, undefined],
  );
  const got = await stored(q, "probe");
  assert.deepEqual([...got.keys()].sort(), [...ids].sort());
  const [s0, s1, s2, s3, s4] = sends as [ReadableSpan, ReadableSpan, ReadableSpan, ReadableSpan, ReadableSpan];
  const byCall: [number, ReadableSpan][] = [
    [ids[0] as number, s0],
    [ids[1] as number, s1],
    [ids[2] as number, s2],
    [ids[3] as number, s2],
    [ids[4] as number, s3],
    [ids[5] as number, s4],
  ];
  for (const [id, s] of byCall) assert.deepEqual(got.get(id), tp(s), `event ${id}`);
  assert.deepEqual(got.get(ids[6] as number), { traceparent: OWN });
});

test("a process span per event, linked; the redelivery in a new trace; a throw marks it", async () => {
  const q = uniq("ec");
  await conn.query("SELECT pgque.create_queue($1), pgque.subscribe($1, 'c')", [q]);
  exporter.reset();
  const tracer = trace.getTracer("test");
  const { a, batch, traceId } = await tracer.startActiveSpan("request", async (span) => {
    const a = await send(conn, q, { fail: true }, { type: "flaky" });
    const batch = await sendBatch(conn, q, [{ i: 1 }, { i: 2 }], { type: "ok" });
    span.end();
    return { a, batch, traceId: span.spanContext().traceId };
  });
  const [sendA, sendB] = named(`send ${q}`) as [ReadableSpan, ReadableSpan];
  const calls: [number, string | undefined][] = [];
  const c = new Consumer({
    connection: cfg,
    queue: q,
    consumer: "c",
    pollIntervalMs: 200,
    retryAfterMs: 0,
    handleSignals: false,
    handler: (m: Message) => {
      calls.push([m.msgId, trace.getActiveSpan()?.spanContext().spanId]);
      if (m.type === "flaky" && !m.retryCount) throw new Error("first delivery fails");
    },
  });
  const stop = running(c);
  await waitUntil(() => calls.length === 4, 60_000, "the events and the redelivery");
  await stop();
  const procs = named(`process ${q}`);
  assert.equal(procs.length, 4);
  for (const p of procs) {
    assert.equal(p.kind, SpanKind.CONSUMER);
    assert.equal(p.attributes["messaging.system"], "pgque");
    assert.equal(p.attributes["messaging.consumer.group.name"], "c");
    assert.equal(p.attributes["messaging.operation.type"], "process");
  }
  const of = (id: number) => procs.filter((p) => p.attributes["messaging.message.id"] === String(id));
  const [first, retry] = of(a).sort(
    (x, y) => Number(x.attributes["pgque.event.retry_count"]) - Number(y.attributes["pgque.event.retry_count"]),
  ) as [ReadableSpan, ReadableSpan];
  assert.equal(first.spanContext().traceId, traceId);
  assert.equal(first.parentSpanContext?.spanId, sendA.spanContext().spanId);
  assert.deepEqual(first.links.map((l) => l.context.spanId), [sendA.spanContext().spanId]);
  assert.equal(first.status.code, SpanStatusCode.ERROR);
  assert.equal(first.attributes["pgque.event.type"], "flaky");
  assert.equal(retry.attributes["pgque.event.retry_count"], 1);
  assert.notEqual(retry.spanContext().traceId, traceId);
  assert.equal(retry.parentSpanContext, undefined);
  assert.deepEqual(retry.links.map((l) => l.context.spanId), [sendA.spanContext().spanId]);
  assert.notEqual(retry.status.code, SpanStatusCode.ERROR);
  for (const id of batch) {
    const [p] = of(id) as [ReadableSpan];
    assert.equal(p.parentSpanContext?.spanId, sendB.spanContext().spanId);
    assert.deepEqual(p.links.map((l) => l.context.spanId), [sendB.spanContext().spanId]);
  }
  // the handler ran inside its span
  assert.deepEqual(
    calls.filter(([id]) => id === a).map(([, s]) => s),
    [first.spanContext().spanId, retry.spanContext().spanId],
  );
});

test("a partitioned consumer with a txHandler: each event's span linked", async () => {
  const q = uniq("ep");
  await conn.query("SELECT pgque.create_queue($1), pgque.subscribe_partitioned($1, 'pc', 4)", [q]);
  exporter.reset();
  const keys = Array.from({ length: 8 }, (_, i) => `k${i}`);
  const ids = await trace.getTracer("test").startActiveSpan("request", async (span) => {
    const ids = await sendBatch(conn, q, keys.map((k) => ({ k })), { partitionKeys: keys });
    span.end();
    return ids;
  });
  const [sendP] = named(`send ${q}`) as [ReadableSpan];
  const seen: number[] = [];
  const pc = new PartitionedConsumer({
    connection: cfg,
    queue: q,
    consumer: "pc",
    n: 4,
    workers: 2,
    pollIntervalMs: 200,
    handleSignals: false,
    txHandler: async (m: Message, tx) => {
      await tx.query("SELECT 1");
      seen.push(m.msgId);
    },
  });
  const stop = running(pc);
  await conn.query("SELECT pgque.force_tick($1)", [q]);
  await waitUntil(() => seen.length === 8, 60_000, "every event handled");
  await stop();
  const procs = named(`process ${q}`);
  assert.deepEqual(
    procs.map((p) => Number(p.attributes["messaging.message.id"])).sort((x, y) => x - y),
    [...ids].sort((x, y) => x - y),
  );
  for (const p of procs) {
    assert.equal(p.parentSpanContext?.spanId, sendP.spanContext().spanId);
    assert.deepEqual(p.links.map((l) => l.context.spanId), [sendP.spanContext().spanId]);
    assert.equal(p.attributes["messaging.consumer.group.name"], "pc");
  }
});
