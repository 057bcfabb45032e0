/**
 * What the connected server's pgque offers, read once per client.
 *
 * The client works with servers of several pgque versions: functions added
 * later (outputs on `complete_many`, `set_progress`, `enqueue_flow`,
 * `job_channel`, the `headers` of `send`, the waiting `receive`) are looked
 * up in `pg_proc` and used when present. The parameter names and types of the functions whose options go by name
 * (`enqueue`, `enqueue_ready_rows`) come from the same read, so an option the
 * server does not know is refused before any SQL is sent, and each value is
 * cast to the parameter's own type.
 */
import { query, type Queryable } from "./util.js";

const CATALOG_SQL = `
SELECT p.proname::text AS name, p.pronargs::int AS nargs,
       coalesce(p.proargnames[1:p.pronargs], '{}')::text[] AS argnames,
       ARRAY(SELECT pg_catalog.format_type(t, NULL)
             FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i) ORDER BY i)::text[] AS argtypes
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'pgque'
  AND p.proname = ANY ($1::text[])`;

const FUNCTIONS = [
  "enqueue",
  "enqueue_ready_rows",
  "complete",
  "complete_many",
  "set_progress",
  "enqueue_flow",
  "job_channel",
  "send",
  "receive",
  "receive_with_headers",
];

/** Server capabilities. `params[fn]` maps each named parameter of the widest
 * overload of `fn` to its SQL type. */
export interface Features {
  /** `complete_many` takes outputs (pgque 0.7). */
  outputs: boolean;
  /** `set_progress` exists. */
  progress: boolean;
  /** `enqueue_flow` exists. */
  flows: boolean;
  /** `job_channel` exists. */
  jobChannel: boolean;
  /** Jobs carry headers (trace context): enqueue takes them, dispatch returns them. */
  headers: boolean;
  /** Events carry headers: `send(queue, type, payload, partition_key,
   * headers)` and its siblings take them (pgque 0.8). */
  eventHeaders: boolean;
  /** The waiting `receive(queue, consumer, max_return, wait interval)`,
   * which sleeps in the server until the consumer has a batch (pgque 0.9,
   * docs/waits.md). */
  receiveWait: boolean;
  /** Its `receive_with_headers(queue, consumer, max_return, wait interval)` twin. */
  receiveWithHeadersWait: boolean;
  /** Named parameters and their SQL types per function. */
  params: Record<string, Record<string, string>>;
}

const cache = new WeakMap<object, Promise<Features>>();

interface CatalogRow {
  name: string;
  nargs: number;
  argnames: string[];
  argtypes: string[];
}

/** The capabilities for `client`, read from pg_catalog on first use and
 * cached per client object (one read-only query). */
export function features(client: Queryable): Promise<Features> {
  let f = cache.get(client);
  if (f === undefined) {
    f = readFeatures(client);
    cache.set(client, f);
    f.catch(() => cache.delete(client));
  }
  return f;
}

async function readFeatures(client: Queryable): Promise<Features> {
  const { rows } = await query<CatalogRow>(client, CATALOG_SQL, [FUNCTIONS]);
  const f: Features = {
    outputs: false,
    progress: false,
    flows: false,
    jobChannel: false,
    headers: false,
    eventHeaders: false,
    receiveWait: false,
    receiveWithHeadersWait: false,
    params: {},
  };
  const widest: Record<string, number> = {};
  for (const r of rows) {
    if (r.name === "complete_many" && r.nargs >= 3) f.outputs = true;
    else if (r.name === "set_progress") f.progress = true;
    else if (r.name === "enqueue_flow") f.flows = true;
    else if (r.name === "job_channel") f.jobChannel = true;
    else if (r.name === "receive" && r.nargs === 4 && r.argtypes[3] === "interval") f.receiveWait = true;
    else if (r.name === "receive_with_headers" && r.nargs === 4 && r.argtypes[3] === "interval") f.receiveWithHeadersWait = true;
    if (r.nargs > (widest[r.name] ?? -1)) {
      widest[r.name] = r.nargs;
      const params: Record<string, string> = {};
      r.argnames.forEach((n, i) => {
        if (n) params[n] = r.argtypes[i] as string;
      });
      f.params[r.name] = params;
    }
  }
  f.headers = f.params.enqueue?.headers !== undefined;
  f.eventHeaders = f.params.send?.headers !== undefined;
  return f;
}
