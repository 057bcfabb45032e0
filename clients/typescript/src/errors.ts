/**
 * Typed errors for pgque's SQLSTATEs (docs/errors.md).
 *
 * Every pgque function refuses bad input with a specific SQLSTATE; the client
 * throws the matching subclass of {@link PgqueError}, with PostgreSQL's code in
 * `.code` and node-postgres' `DatabaseError` as `.cause`. Branch on the class
 * (or on `.code`), never on the message text.
 */

/** A pgque call failed. `code` is PostgreSQL's SQLSTATE, or undefined for a
 * client-side error (a feature the server lacks, a lost slot lease). */
export class PgqueError extends Error {
  /** The SQLSTATE this class stands for (undefined: client side or any code). */
  static readonly sqlstate: string | undefined = undefined;
  /** The SQLSTATE of this error, or undefined for a client-side error. */
  readonly code: string | undefined;

  /** Makes an error with `message`; `code` defaults to the class's SQLSTATE. */
  constructor(message: string, options?: { cause?: unknown; code?: string }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options?.code ?? (new.target as typeof PgqueError).sqlstate;
  }
}

/** 22004: a required argument (or array element) is NULL. */
export class NullValueNotAllowed extends PgqueError {
  static override readonly sqlstate = "22004";
}

/** 42602: an empty name, a forbidden character, a `#` in a plain consumer. */
export class InvalidName extends PgqueError {
  static override readonly sqlstate = "42602";
}

/** 42622: a name over its byte limit. */
export class NameTooLong extends PgqueError {
  static override readonly sqlstate = "42622";
}

/** 42704: unknown queue, consumer, batch, job, dead letter... */
export class UndefinedObject extends PgqueError {
  static override readonly sqlstate = "42704";
}

/** 22023: an unacceptable value (bad interval, unequal arrays, wrong N, an
 * option the server's function does not have...). */
export class InvalidParameterValue extends PgqueError {
  static override readonly sqlstate = "22023";
}

/** 22003: a number outside its range (priority, limit, max_attempts...). */
export class NumericValueOutOfRange extends PgqueError {
  static override readonly sqlstate = "22003";
}

/** 22P02: text that is not JSON given to a jsonb argument. */
export class InvalidJson extends PgqueError {
  static override readonly sqlstate = "22P02";
}

/** 55000: the object is in the wrong state (a finished batch, a slot lease
 * held by another worker, a queue that still has consumers...). */
export class WrongState extends PgqueError {
  static override readonly sqlstate = "55000";
}

/** 23505: a unique key held by a live job, with `onDuplicate: "error"`. */
export class DuplicateJob extends PgqueError {
  static override readonly sqlstate = "23505";
}

/** 0A000: e.g. a job-log call at REPEATABLE READ, `unique_key` in a flow. */
export class FeatureNotSupported extends PgqueError {
  static override readonly sqlstate = "0A000";
}

/** Client side: the connected server's pgque has no such function (e.g.
 * `enqueue_flow` or `set_progress` on a server from before they existed). */
export class ServerFeatureMissing extends PgqueError {}

/** Client side: a partitioned consumer's loop no longer holds its slot's
 * lease (another worker took it over); it stops processing that slot. */
export class SlotLost extends PgqueError {}

const BY_SQLSTATE: ReadonlyMap<string, typeof PgqueError> = new Map(
  [
    NullValueNotAllowed,
    InvalidName,
    NameTooLong,
    UndefinedObject,
    InvalidParameterValue,
    NumericValueOutOfRange,
    InvalidJson,
    WrongState,
    DuplicateJob,
    FeatureNotSupported,
  ].map((cls) => [cls.sqlstate as string, cls as typeof PgqueError]),
);

/** SQLSTATE classes about the server or the session rather than the call:
 * connection (08), resources (53), operator intervention such as a cancel or
 * shutdown (57), system (58), transaction rollback (40), invalid transaction
 * state (25). Errors of these classes are passed through untranslated. */
const PASS_THROUGH = new Set(["08", "53", "57", "58", "40", "25"]);

/** The SQLSTATE of a server error (node-postgres' DatabaseError, recognised
 * by its fields so that a caller's own copy of `pg` works too), else
 * undefined. Node's system errors also have a `code` (EPIPE, ECONNRESET) but
 * no `severity`. */
function sqlstateOf(err: unknown): string | undefined {
  if (!(err instanceof Error)) return undefined;
  const e = err as { code?: unknown; severity?: unknown; syscall?: unknown };
  if (typeof e.code !== "string" || !/^[0-9A-Z]{5}$/.test(e.code)) return undefined;
  if (typeof e.severity !== "string" || e.syscall !== undefined) return undefined;
  return e.code;
}

/**
 * The typed error for a database error: the subclass for its SQLSTATE,
 * PgqueError for other codes of the call's own classes, and the error itself
 * (unchanged) for connection-level errors and anything that is not a
 * database error. Used by every call of this package; exported for code that
 * runs pgque SQL of its own.
 */
export function translateError(err: unknown): unknown {
  if (err instanceof PgqueError) return err;
  const code = sqlstateOf(err);
  if (code === undefined) return err;
  const cls = BY_SQLSTATE.get(code);
  if (cls === undefined && PASS_THROUGH.has(code.slice(0, 2))) return err;
  const message = (err as Error).message;
  return new (cls ?? PgqueError)(message, { cause: err, code });
}

/** True for an error that says the connection is unusable (no SQLSTATE and
 * not a PgqueError, or a connection-class / admin-shutdown SQLSTATE). */
export function isConnectionError(err: unknown): boolean {
  if (err instanceof PgqueError) return false;
  const code = sqlstateOf(err);
  if (code === undefined) return true;
  return code.startsWith("08") || code.startsWith("57P");
}
