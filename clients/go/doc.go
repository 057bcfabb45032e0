// Package pgque is the Go client of pgque, the PostgreSQL extension for
// event queues (the PgQ model) and job queues, on pgx v5.
//
// Producers run on the caller's connection and in its transaction: each of
// [Enqueue], [EnqueueMany], [EnqueueFlow], [Send], [SendBatch],
// [SendIdem] and [SendAt] is one statement on a [DB] (a pgx.Tx,
// *pgx.Conn or *pgxpool.Pool), and nothing is committed by this package,
// so a rollback leaves no job and no event.
//
// A [Worker] runs job handlers for a set of job queues (LISTEN on the
// queues' job channels plus a poll fallback, dispatch in batches,
// heartbeats while a handler runs, batched completions with outputs,
// failures retried by the server with backoff, a graceful drain when its
// context ends). A [Consumer] reads an event queue batch by batch, waiting
// for each batch inside the server where the server can ([WaitTimeout]); a
// [PartitionedConsumer] runs the claim_next_slot loop over N slots with M
// goroutines, in order per partition key, following online resizes.
// Each has an exactly-once form whose handler gets the pgx.Tx that
// completes the job or acks the batch.
//
// Errors of pgque's calls are [*Error] values carrying the SQLSTATE; match
// them with errors.Is against the Err* sentinels (ErrUndefinedObject,
// ErrInvalidParameterValue, ErrWrongState, ErrDuplicateJob, ...) or with
// errors.As.
//
// OpenTelemetry (go.opentelemetry.io/otel) is used only when the caller
// configures it, with the [TracerProvider] option or a global provider
// set with otel.SetTracerProvider: then the producers open "send <queue>"
// spans and store their W3C trace context with the jobs and events, and
// the worker and consumers run each handler in a "process <queue>" span
// linked to it (docs/tracing.md), the same spans as pgque's Python, Rust
// and TypeScript clients.
package pgque
