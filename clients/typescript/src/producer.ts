/**
 * Producers: job enqueue and event send on the caller's client.
 *
 * Each call is one statement on the client it is given and runs in that
 * client's transaction: nothing is committed here, so a ROLLBACK of the
 * caller's transaction leaves no job and no event (and a job's NOTIFY fires
 * only at the caller's COMMIT). On a client outside a transaction (or a
 * `pg.Pool`) each call commits by itself.
 *
 * Values are always bound parameters. The only identifiers written into a
 * statement are parameter names of the server's own functions (read from
 * pg_catalog, features.ts), quoted.
 */
import { InvalidParameterValue, ServerFeatureMissing } from "./errors.js";
import { features, type Features } from "./features.js";
import { sendSpan } from "./otel.js";
import { query, toId, toIdOrNull, toIds, type Queryable } from "./util.js";

/** Options of {@link enqueue}, the parameters of `pgque.enqueue` by name. */
export interface EnqueueOptions {
  /** Lower runs first, -1000..1000 (default 0). */
  priority?: number;
  /** When the job becomes ready; a future time makes it scheduled. */
  runAt?: Date | string;
  /** The actor whose capacity and rate limits the job counts against. */
  actor?: string;
  /** Round-robin fairness key. */
  fairnessKey?: string;
  /** At most one running job per (queue, identityKey). */
  identityKey?: string;
  /** At most one live job per (queue, uniqueKey). */
  uniqueKey?: string;
  /** Attempts before the job fails for good (default: the queue's). */
  maxAttempts?: number;
  /** `"skip"` (default: a duplicate returns the holder's id) or `"error"` (23505). */
  onDuplicate?: "skip" | "error";
  /** Ids of jobs this one runs after (servers with flows). */
  dependsOn?: number[];
  /** Small metadata stored with the job (servers with job headers): an object
   * of strings, e.g. W3C `traceparent` / `tracestate`. When absent and
   * `@opentelemetry/api` is installed, filled from the active context
   * (docs/tracing.md). */
  headers?: Record<string, string>;
}

/** One job of {@link enqueueMany}: `[kind, args]` or an object with options. */
export type NewJob =
  | [kind: string, args?: unknown]
  | {
      kind: string;
      args?: unknown;
      priority?: number;
      runAt?: Date | string;
      actor?: string;
      fairnessKey?: string;
      identityKey?: string;
      uniqueKey?: string;
      maxAttempts?: number;
      headers?: Record<string, string>;
    };

/** One row of {@link enqueueMany}: the job id (the holder's for a
 * `duplicate`; null when that holder is not yet visible) and its state
 * (`ready`, `scheduled`, `duplicate`). */
export interface Enqueued {
  jobId: number | null;
  state: string;
}

/** One job of a flow for {@link enqueueFlow}: `key` (unique in the flow),
 * `kind`, `args`, `dependsOn` (keys of the same flow), enqueue options, and
 * `onParentFailure` (`"cancel"`, the default, or `"run"`). The server's
 * snake_case field names are accepted too. */
export interface FlowJobSpec {
  key: string;
  kind: string;
  args?: unknown;
  dependsOn?: string[];
  onParentFailure?: "cancel" | "run";
  priority?: number;
  runAt?: Date | string;
  maxAttempts?: number;
  actor?: string;
  fairnessKey?: string;
  identityKey?: string;
  /** Trace context (`traceparent`, `tracestate`); filled from the current
   * OpenTelemetry context when absent (docs/tracing.md). */
  headers?: Record<string, string>;
  [field: string]: unknown;
}

/** One row of {@link enqueueFlow}. */
export interface FlowJob {
  flowId: number;
  key: string;
  jobId: number;
}

/** The result of {@link sendIdem}: the event id (the original one when
 * `deduped`). */
export interface IdemSend {
  eventId: number;
  deduped: boolean;
}

/** Options of {@link send}. */
export interface SendOptions {
  /** The event type (default `"default"`). */
  type?: string;
  /** The partition key (rides extra1; docs/partition-keys.md). */
  partitionKey?: string | null;
  /** Stored with the event (servers with event headers, pgque 0.8): an
   * object of strings, e.g. W3C `traceparent` / `tracestate`. Unset, a
   * traced context's `send <queue>` span fills it (docs/tracing.md). */
  headers?: Record<string, string>;
}

/** Options of {@link sendBatch}. */
export interface SendBatchOptions {
  /** The event type of every event (default `"default"`). */
  type?: string;
  /** One partition key per payload (null: none). */
  partitionKeys?: (string | null)[];
  /** As for {@link send}: one object for every event of the batch. */
  headers?: Record<string, string>;
}

/** The headers an event send passes: the caller's (refused by a server
 * without event headers), else the send span's trace context when the
 * server takes it, else undefined (the plain overloads, which every server
 * has; the catalogue is not even read). */
async function eventHeaders(
  client: Queryable,
  explicit: Record<string, string> | undefined,
  traced: Record<string, string> | undefined,
): Promise<Record<string, string> | undefined> {
  if (explicit === undefined && traced === undefined) return undefined;
  const f = await features(client);
  if (explicit !== undefined) {
    if (!f.eventHeaders) throw new ServerFeatureMissing("this server's pgque takes no event headers (they need pgque 0.8)");
    return explicit;
  }
  return f.eventHeaders ? traced : undefined;
}

const ENQUEUE_PARAMS: Record<keyof EnqueueOptions, string> = {
  priority: "priority",
  runAt: "run_at",
  actor: "actor",
  fairnessKey: "fairness_key",
  identityKey: "identity_key",
  uniqueKey: "unique_key",
  maxAttempts: "max_attempts",
  onDuplicate: "on_duplicate",
  dependsOn: "depends_on",
  headers: "headers",
};

// Per-job option of enqueueMany -> the array parameter of enqueue_ready_rows.
const MANY_PARAMS: Record<string, string> = {
  priority: "priorities",
  runAt: "run_at",
  actor: "actors",
  fairnessKey: "fairness_keys",
  identityKey: "identity_keys",
  uniqueKey: "unique_keys",
  maxAttempts: "max_attempts",
  headers: "headers",
};

const FLOW_FIELDS: Record<string, string> = {
  dependsOn: "depends_on",
  onParentFailure: "on_parent_failure",
  runAt: "run_at",
  maxAttempts: "max_attempts",
  fairnessKey: "fairness_key",
  identityKey: "identity_key",
  uniqueKey: "unique_key",
};

function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/** `SELECT * FROM pgque.fn(a => $1::t, ...)` for named parameters that the
 * server's function declares (with their declared types). */
function namedCall(f: Features, fn: string, values: [string, unknown][]): [string, unknown[]] {
  const params = f.params[fn] ?? {};
  const parts: string[] = [];
  const args: unknown[] = [];
  for (const [name, value] of values) {
    const typ = params[name];
    if (typ === undefined) {
      const known = Object.keys(params).sort().join(", ");
      throw new InvalidParameterValue(`pgque.${fn} has no parameter '${name}' on this server (it has: ${known})`);
    }
    args.push(value);
    parts.push(`${quoteIdent(name)} => $${args.length}::${typ}`);
  }
  return [`SELECT * FROM pgque.${quoteIdent(fn)}(${parts.join(", ")})`, args];
}

/** A JS value as a jsonb parameter (node-postgres would turn a JS array
 * into a PostgreSQL array literal, so JSON is always stringified here). */
function json(value: unknown): string {
  const s = JSON.stringify(value === undefined ? {} : value);
  if (s === undefined) throw new InvalidParameterValue("value is not JSON-serialisable");
  return s;
}

/** A payload as [parameter, SQL type]: strings go to the text overloads (sent
 * as they are), anything else is JSON. */
function payloadParam(payload: unknown): [unknown, "text" | "jsonb"] {
  return typeof payload === "string" ? [payload, "text"] : [json(payload), "jsonb"];
}

/**
 * Enqueues one job (`pgque.enqueue`) on `client`, in its transaction.
 * Returns the job id; for a duplicate unique key (`onDuplicate: "skip"`) the
 * id of the job holding the key (null when the holder is not yet visible).
 * An option the server's function does not have throws InvalidParameterValue
 * before anything is sent.
 */
export async function enqueue(
  client: Queryable,
  queue: string,
  kind: string,
  args?: unknown,
  options: EnqueueOptions = {},
): Promise<number | null> {
  const f = await features(client);
  return sendSpan(queue, 1, async (traced) => {
    const values: [string, unknown][] = [
      ["queue_name", queue],
      ["kind", kind],
      ["args", json(args)],
    ];
    for (const [k, v] of Object.entries(options)) {
      if (v === undefined) continue;
      const name = ENQUEUE_PARAMS[k as keyof EnqueueOptions];
      if (name === undefined) throw new InvalidParameterValue(`unknown enqueue option '${k}'`);
      values.push([name, k === "headers" ? json(v) : v]);
    }
    if (traced !== undefined && options.headers === undefined && f.params.enqueue?.headers !== undefined) {
      values.push(["headers", json(traced)]);
    }
    const [sql, params] = namedCall(f, "enqueue", values);
    const { rows } = await query(client, sql, params);
    const first = rows[0];
    return first === undefined ? null : toIdOrNull(Object.values(first)[0]);
  });
}

/**
 * Enqueues a batch in one statement (`pgque.enqueue_ready_rows`) on
 * `client`, in its transaction. Each job is `[kind, args]` or an object with
 * `kind`, `args` and per-job options. Returns one {@link Enqueued} per job,
 * in input order.
 */
export async function enqueueMany(
  client: Queryable,
  queue: string,
  jobs: NewJob[],
  options: { onDuplicate?: "skip" | "error" } = {},
): Promise<Enqueued[]> {
  if (jobs.length === 0) return [];
  const f = await features(client);
  return sendSpan(queue, jobs.length, (traced) => enqueueManyWith(f, client, queue, jobs, options, traced));
}

async function enqueueManyWith(
  f: Features,
  client: Queryable,
  queue: string,
  jobs: NewJob[],
  options: { onDuplicate?: "skip" | "error" },
  traced: Record<string, string> | undefined,
): Promise<Enqueued[]> {
  const kinds: string[] = [];
  const args: string[] = [];
  const cols = new Map<string, unknown[]>();
  jobs.forEach((job, i) => {
    if (Array.isArray(job)) {
      kinds.push(job[0]);
      args.push(json(job[1]));
      return;
    }
    const { kind, args: a, ...opts } = job;
    kinds.push(kind);
    args.push(json(a));
    for (const [k, v] of Object.entries(opts)) {
      if (v === undefined) continue;
      if (!(k in MANY_PARAMS)) {
        const known = Object.keys(MANY_PARAMS).sort().join(", ");
        throw new InvalidParameterValue(`job ${i}: unknown option '${k}' for enqueueMany (known: ${known})`);
      }
      let col = cols.get(k);
      if (col === undefined) {
        col = new Array<unknown>(jobs.length).fill(null);
        cols.set(k, col);
      }
      col[i] = k === "headers" ? json(v) : v;
    }
  });
  if (traced !== undefined && f.params.enqueue_ready_rows?.headers !== undefined) {
    let col = cols.get("headers");
    if (col === undefined) {
      col = new Array<unknown>(jobs.length).fill(null);
      cols.set("headers", col);
    }
    for (let i = 0; i < col.length; i++) if (col[i] === null) col[i] = json(traced);
  }
  const values: [string, unknown][] = [
    ["queue_name", queue],
    ["kinds", kinds],
    ["args", args],
  ];
  for (const [k, col] of cols) values.push([MANY_PARAMS[k] as string, col]);
  if (options.onDuplicate !== undefined) values.push(["on_duplicate", options.onDuplicate]);
  const [sql, params] = namedCall(f, "enqueue_ready_rows", values);
  const { rows } = await query<{ job_id: unknown; state: string }>(
    client,
    `SELECT job_id, state FROM (${sql}) r ORDER BY ord`,
    params,
  );
  return rows.map((r) => ({ jobId: toIdOrNull(r.job_id), state: r.state }));
}

/**
 * Enqueues a flow (`pgque.enqueue_flow`) on `client`, in its transaction:
 * jobs with `key`, `kind`, `args`, `dependsOn` (keys) and enqueue options,
 * all or nothing. Returns (flowId, key, jobId) per job. In a traced
 * context every job without `headers` of its own gets the `send <queue>`
 * span's trace context (docs/tracing.md). Throws ServerFeatureMissing on a
 * server without flows.
 */
export async function enqueueFlow(client: Queryable, queue: string, jobs: FlowJobSpec[]): Promise<FlowJob[]> {
  const f = await features(client);
  if (!f.flows) throw new ServerFeatureMissing("this server's pgque has no enqueue_flow (flows need pgque 0.7)");
  return sendSpan(queue, jobs.length, async (traced) => {
    // flows take headers where enqueue does (pgque 0.8): a traced context's
    // goes to every job without headers of its own
    const fill = traced !== undefined && f.params.enqueue?.headers !== undefined;
    const spec = jobs.map((job) => {
      const out: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(job)) {
        if (v === undefined) continue;
        out[FLOW_FIELDS[k] ?? k] = v instanceof Date ? v.toISOString() : v;
      }
      if (fill && out.headers === undefined) out.headers = traced;
      return out;
    });
    const { rows } = await query<{ flow_id: unknown; key: string; job_id: unknown }>(
      client,
      "SELECT flow_id, key, job_id FROM pgque.enqueue_flow($1::text, $2::jsonb)",
      [queue, JSON.stringify(spec)],
    );
    return rows.map((r) => ({ flowId: toId(r.flow_id), key: r.key, jobId: toId(r.job_id) }));
  });
}

/**
 * Sends one event (`pgque.send`) on `client`, in its transaction; returns
 * its id. A string payload is sent as text, anything else as JSON. The
 * partition key rides extra1. In a traced context the call is a `send
 * <queue>` span whose trace context the event stores (docs/tracing.md).
 */
export async function send(client: Queryable, queue: string, payload: unknown, options: SendOptions = {}): Promise<number> {
  return sendSpan(queue, 1, async (traced) => {
    const headers = await eventHeaders(client, options.headers, traced);
    const [value, t] = payloadParam(payload);
    let sql: string;
    let params: unknown[];
    if (headers !== undefined) {
      sql = `SELECT pgque.send($1::text, $2::text, $3::${t}, $4::text, $5::jsonb) AS id`;
      params = [queue, options.type ?? "default", value, options.partitionKey ?? null, json(headers)];
    } else if (options.partitionKey !== undefined && options.partitionKey !== null) {
      sql = `SELECT pgque.send($1::text, $2::text, $3::${t}, $4::text) AS id`;
      params = [queue, options.type ?? "default", value, options.partitionKey];
    } else if (options.type !== undefined) {
      sql = `SELECT pgque.send($1::text, $2::text, $3::${t}) AS id`;
      params = [queue, options.type, value];
    } else {
      sql = `SELECT pgque.send($1::text, $2::${t}) AS id`;
      params = [queue, value];
    }
    const { rows } = await query<{ id: unknown }>(client, sql, params);
    return toId(rows[0]?.id);
  });
}

/**
 * Sends many events in one statement (`pgque.send_batch`) on `client`, in
 * its transaction; returns the ids aligned with `payloads`. All-string
 * payloads go as text, otherwise every payload as JSON. Traced as one `send
 * <queue>` span for the batch.
 */
export async function sendBatch(
  client: Queryable,
  queue: string,
  payloads: unknown[],
  options: SendBatchOptions = {},
): Promise<number[]> {
  if (payloads.length === 0) return [];
  if (options.partitionKeys !== undefined && options.partitionKeys.length !== payloads.length) {
    throw new InvalidParameterValue("partitionKeys must align with payloads");
  }
  return sendSpan(queue, payloads.length, async (traced) => {
    const headers = await eventHeaders(client, options.headers, traced);
    const allText = payloads.every((p) => typeof p === "string");
    const values = allText ? payloads : payloads.map(json);
    const t = allText ? "text[]" : "jsonb[]";
    let sql: string;
    let params: unknown[];
    if (headers !== undefined) {
      sql = `SELECT pgque.send_batch($1::text, $2::text, $3::${t}, $4::text[], $5::jsonb) AS ids`;
      params = [queue, options.type ?? "default", values, options.partitionKeys ?? null, json(headers)];
    } else if (options.partitionKeys !== undefined) {
      sql = `SELECT pgque.send_batch($1::text, $2::text, $3::${t}, $4::text[]) AS ids`;
      params = [queue, options.type ?? "default", values, options.partitionKeys];
    } else if (options.type !== undefined) {
      sql = `SELECT pgque.send_batch($1::text, $2::text, $3::${t}) AS ids`;
      params = [queue, options.type, values];
    } else {
      sql = `SELECT pgque.send_batch($1::text, $2::${t}) AS ids`;
      params = [queue, values];
    }
    const { rows } = await query<{ ids: unknown }>(client, sql, params);
    return toIds(rows[0]?.ids);
  });
}

/**
 * At most one event per (queue, idemKey) while the key's window is live
 * (`pgque.send_idem`), on `client`, in its transaction. `ttlMs` is the
 * window (default one hour). Returns the event id (the original one when
 * `deduped`). Keys name an effect (`invoice:1042:issue`), not an entity.
 * `headers` and tracing as for {@link send}.
 */
export async function sendIdem(
  client: Queryable,
  queue: string,
  type: string,
  payload: unknown,
  idemKey: string,
  options: { ttlMs?: number; partitionKey?: string | null; headers?: Record<string, string> } = {},
): Promise<IdemSend> {
  const [value, t] = payloadParam(payload);
  const ttl = options.ttlMs ?? 3_600_000;
  if (!Number.isFinite(ttl) || ttl <= 0) throw new InvalidParameterValue("ttlMs must be a positive number");
  return sendSpan(queue, 1, async (traced) => {
    const headers = await eventHeaders(client, options.headers, traced);
    const params: unknown[] = [queue, type, value, idemKey, ttl / 1000, options.partitionKey ?? null];
    if (headers !== undefined) params.push(json(headers));
    const { rows } = await query<{ event_id: unknown; deduped: boolean }>(
      client,
      `SELECT event_id, deduped FROM pgque.send_idem($1::text, $2::text, $3::${t}, $4::text, ` +
        `make_interval(secs => $5::float8), $6::text${headers !== undefined ? ", $7::jsonb" : ""})`,
      params,
    );
    const r = rows[0];
    if (r === undefined) throw new Error("send_idem returned no row");
    return { eventId: toId(r.event_id), deduped: r.deduped };
  });
}

/**
 * Delayed delivery (`pgque.send_at`) on `client`, in its transaction: the
 * event enters the queue at `deliverAt`. Returns the event id. `headers`
 * and tracing as for {@link send} (kept until the event is delivered).
 */
export async function sendAt(
  client: Queryable,
  queue: string,
  type: string,
  payload: unknown,
  deliverAt: Date | string,
  options: { partitionKey?: string | null; headers?: Record<string, string> } = {},
): Promise<number> {
  const [value, t] = payloadParam(payload);
  return sendSpan(queue, 1, async (traced) => {
    const headers = await eventHeaders(client, options.headers, traced);
    const params: unknown[] = [queue, type, value, deliverAt, options.partitionKey ?? null];
    if (headers !== undefined) params.push(json(headers));
    const { rows } = await query<{ id: unknown }>(
      client,
      `SELECT pgque.send_at($1::text, $2::text, $3::${t}, $4::timestamptz, $5::text` +
        `${headers !== undefined ? ", $6::jsonb" : ""}) AS id`,
      params,
    );
    return toId(rows[0]?.id);
  });
}
