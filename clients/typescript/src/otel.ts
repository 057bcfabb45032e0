/**
 * OpenTelemetry trace context for jobs (docs/tracing.md), with the optional
 * peer dependency `@opentelemetry/api`: loaded once by a dynamic import;
 * when it is not installed every helper here is a no-op and nothing of
 * OpenTelemetry is loaded.
 *
 * - Producer: `sendSpan(queue, n, fn)` runs `fn(headers)` in a PRODUCER span
 *   `send <queue>` (child of the active context); `headers` are that span's
 *   W3C `traceparent` / `tracestate` (undefined: no valid span, e.g. the API
 *   without an SDK).
 * - Worker: `processSpan(job, fn)` runs a handler in a CONSUMER span
 *   `process <queue>`, linked to the producer's context; on the first
 *   attempt it is also its child (one trace from producer to handler), a
 *   retry (attempt > 1) starts a new trace linked to it. The handler runs
 *   with the span active (so what it enqueues carries it on, given a
 *   context manager, as the Node SDK registers).
 * - Events (docs/tracing.md, "Events"): the producers use `sendSpan` too;
 *   `eventSpan(queue, consumer, msg, fn)` runs one event's handler call in a
 *   CONSUMER span `process <queue>` with the same rules (linked to the
 *   producer, its child on the first delivery, a new trace on a redelivery:
 *   retryCount > 0). `tracingActive()` tells a consumer whether to read the
 *   events' headers at all (a tracer provider is registered).
 * Attributes follow the OpenTelemetry messaging conventions:
 * messaging.system = "pgque", messaging.destination.name,
 * messaging.message.id, messaging.operation.type / name, plus pgque.job.kind
 * and pgque.job.attempt; on event spans messaging.consumer.group.name (the
 * consumer), pgque.event.type and pgque.event.retry_count.
 */
import type * as Api from "@opentelemetry/api";

let loaded: Promise<typeof Api | null> | undefined;

/** The API module, or null when it is not installed (memoised). */
export function otelApi(): Promise<typeof Api | null> {
  loaded ??= import("@opentelemetry/api").then(
    (m) => m,
    () => null,
  );
  return loaded;
}

const SYSTEM = "pgque";

/** The job headers of a span context (undefined when it is not valid). */
function headersOf(api: typeof Api, sc: Api.SpanContext): Record<string, string> | undefined {
  if (!api.isSpanContextValid(sc)) return undefined;
  const flags = (sc.traceFlags & 0xff).toString(16).padStart(2, "0");
  const h: Record<string, string> = { traceparent: `00-${sc.traceId}-${sc.spanId}-${flags}` };
  const state = sc.traceState?.serialize();
  if (state) h.tracestate = state;
  return h;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** The remote span context a job's headers carry (undefined: none or malformed). */
export function contextOf(api: typeof Api, headers: unknown): Api.SpanContext | undefined {
  if (headers === null || typeof headers !== "object") return undefined;
  const tp = (headers as Record<string, unknown>).traceparent;
  if (typeof tp !== "string") return undefined;
  const m = TRACEPARENT.exec(tp);
  if (m === null || m[1] === "ff") return undefined;
  const sc: Api.SpanContext = {
    traceId: m[2] as string,
    spanId: m[3] as string,
    traceFlags: parseInt(m[4] as string, 16) & 1,
    isRemote: true,
  };
  return api.isSpanContextValid(sc) ? sc : undefined;
}

function tracer(api: typeof Api): Api.Tracer {
  return api.trace.getTracer("pgque-client");
}

function failed(api: typeof Api, span: Api.Span, err: unknown): void {
  span.recordException(err instanceof Error ? err : String(err));
  span.setStatus({ code: api.SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
}

/** Runs `fn` in a PRODUCER span for an enqueue of `n` jobs (see the module doc). */
export async function sendSpan<T>(
  queue: string,
  n: number,
  fn: (headers: Record<string, string> | undefined) => Promise<T>,
): Promise<T> {
  const api = await otelApi();
  if (api === null) return fn(undefined);
  const attributes: Api.Attributes = {
    "messaging.system": SYSTEM,
    "messaging.destination.name": queue,
    "messaging.operation.type": "send",
    "messaging.operation.name": "send",
  };
  if (n !== 1) attributes["messaging.batch.message_count"] = n;
  const span = tracer(api).startSpan(`send ${queue}`, { kind: api.SpanKind.PRODUCER, attributes });
  try {
    return await fn(headersOf(api, span.spanContext()));
  } catch (err) {
    failed(api, span, err);
    throw err;
  } finally {
    span.end();
  }
}

/** The job fields processSpan reads. */
export interface TracedJob {
  readonly id: number;
  readonly queue: string;
  readonly kind: string;
  readonly attempt: number;
  readonly headers: Record<string, string> | null;
  /** The error the attempt was failed with, once fn settled. */
  readonly failure?: string | undefined;
}

/** Whether spans are recorded: the API is installed and a tracer provider
 * is registered behind its global proxy. Consumers read event headers only
 * then. */
export async function tracingActive(): Promise<boolean> {
  const api = await otelApi();
  if (api === null) return false;
  const p = api.trace.getTracerProvider();
  return !(p instanceof api.ProxyTracerProvider) || p.getDelegateTracer("pgque-client") !== undefined;
}

/** Runs `fn` in a CONSUMER span `process <queue>` linked to the producer
 * context in `headers`, and its child when `first`; `failure` (read once
 * `fn` settled) marks it as failed. */
async function consumerSpan<T>(
  api: typeof Api,
  queue: string,
  headers: unknown,
  first: boolean,
  attributes: Api.Attributes,
  fn: () => Promise<T>,
  failure: () => string | undefined = () => undefined,
): Promise<T> {
  const producer = contextOf(api, headers);
  const parent =
    producer !== undefined && first ? api.trace.setSpanContext(api.ROOT_CONTEXT, producer) : api.ROOT_CONTEXT;
  const span = tracer(api).startSpan(
    `process ${queue}`,
    { kind: api.SpanKind.CONSUMER, links: producer === undefined ? [] : [{ context: producer }], attributes },
    parent,
  );
  try {
    const out = await api.context.with(api.trace.setSpan(parent, span), fn);
    const f = failure();
    if (f !== undefined) failed(api, span, new Error(f.split("\n")[0]));
    return out;
  } catch (err) {
    failed(api, span, err);
    throw err;
  } finally {
    span.end();
  }
}

/** Runs a job's handler in a CONSUMER span (see the module doc). */
export async function processSpan<T>(job: TracedJob, fn: () => Promise<T>): Promise<T> {
  const api = await otelApi();
  if (api === null) return fn();
  const attributes: Api.Attributes = {
    "messaging.system": SYSTEM,
    "messaging.destination.name": job.queue,
    "messaging.message.id": String(job.id),
    "messaging.operation.type": "process",
    "messaging.operation.name": "process",
    "pgque.job.kind": job.kind,
    "pgque.job.attempt": job.attempt,
  };
  return consumerSpan(api, job.queue, job.headers, job.attempt <= 1, attributes, fn, () => job.failure);
}

/** The event fields eventSpan reads. */
export interface TracedEvent {
  readonly msgId: number;
  readonly type: string;
  readonly retryCount: number | null;
  readonly headers: Record<string, string> | null;
}

/** Runs one event's handler call in a CONSUMER span (see the module doc). */
export async function eventSpan<T>(queue: string, consumer: string, m: TracedEvent, fn: () => Promise<T>): Promise<T> {
  const api = await otelApi();
  if (api === null) return fn();
  const retries = m.retryCount ?? 0;
  const attributes: Api.Attributes = {
    "messaging.system": SYSTEM,
    "messaging.destination.name": queue,
    "messaging.consumer.group.name": consumer,
    "messaging.message.id": String(m.msgId),
    "messaging.operation.type": "process",
    "messaging.operation.name": "process",
    "pgque.event.type": m.type,
    "pgque.event.retry_count": retries,
  };
  return consumerSpan(api, queue, m.headers, retries === 0, attributes, fn);
}
