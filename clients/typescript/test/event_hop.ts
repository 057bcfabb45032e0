/** The TypeScript consumer of the cross-client event trace test
 * (clients/python/tests/test_cross_trace.py): a Consumer with the
 * OpenTelemetry SDK's in-memory exporter reads COUNT events of QUEUE as
 * CONSUMER (subscribed by the test before the events were sent), then
 * prints every finished span as a JSON line (name, kind, trace_id, span_id,
 * parent_span_id, links, attributes) for the test to check.
 *
 *     node dist/test/event_hop.js '{"host":...,"port":...,"user":...,"database":...}' QUEUE CONSUMER COUNT */
import { context, SpanKind, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";

import { Consumer } from "../src/index.js";

const [cfgJson, queue, consumer, count] = process.argv.slice(2);
if (cfgJson === undefined || queue === undefined || consumer === undefined || count === undefined) {
  throw new Error("usage: event_hop.js CONNECTION_JSON QUEUE CONSUMER COUNT");
}
const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

const ac = new AbortController();
let handled = 0;
const c = new Consumer({
  connection: JSON.parse(cfgJson),
  queue,
  consumer,
  pollIntervalMs: 100,
  handleSignals: false,
  handler: () => {
    handled += 1;
    if (handled === Number(count)) ac.abort();
  },
});
const timer = setTimeout(() => ac.abort(), 60_000);
await c.run({ signal: ac.signal });
clearTimeout(timer);
if (handled !== Number(count)) throw new Error(`${handled} of ${count} events within 60 s`);
for (const s of exporter.getFinishedSpans()) {
  console.log(
    JSON.stringify({
      name: s.name,
      kind: SpanKind[s.kind].toLowerCase(),
      trace_id: s.spanContext().traceId,
      span_id: s.spanContext().spanId,
      parent_span_id: s.parentSpanContext?.spanId ?? "0000000000000000",
      links: s.links.map((l) => l.context.spanId),
      attributes: Object.fromEntries(Object.entries(s.attributes).map(([k, v]) => [k, String(v)])),
    }),
  );
}
