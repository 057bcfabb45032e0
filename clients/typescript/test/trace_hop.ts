/** The last hop of the cross-client trace test (clients/python/tests/
 * test_cross_trace.py): a worker with the OpenTelemetry SDK's in-memory
 * exporter runs one job of kind `hop` from QUEUE, then prints every finished
 * span as a JSON line (name, kind, trace_id, span_id, parent_span_id, links,
 * attributes) for the test to check.
 *
 *     node dist/test/trace_hop.js '{"host":...,"port":...,"user":...,"database":...}' QUEUE */
import { context, SpanKind, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";

import { Worker } from "../src/index.js";

const [cfgJson, queue] = process.argv.slice(2);
if (cfgJson === undefined || queue === undefined) throw new Error("usage: trace_hop.js CONNECTION_JSON QUEUE");
const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

const ac = new AbortController();
let handled = false;
const w = new Worker({ connection: JSON.parse(cfgJson), queues: queue, concurrency: 1, pollIntervalMs: 100, handleSignals: false })
  .handle("hop", () => {
    handled = true;
    ac.abort();
  });
const timer = setTimeout(() => ac.abort(), 60_000);
await w.run({ signal: ac.signal });
clearTimeout(timer);
if (!handled) throw new Error("no hop job within 60 s");
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
