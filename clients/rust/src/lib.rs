//! # pgque-client
//!
//! Producers, a job worker and event consumers for the
//! [pgque](../../../README.md) PostgreSQL extension, on `tokio-postgres` with
//! a `deadpool-postgres` pool.
//!
//! - **Producers** ([`enqueue`], [`enqueue_many`], [`enqueue_flow`], [`send`],
//!   [`send_text`], [`send_batch`], [`send_idem`]) take any
//!   [`tokio_postgres::GenericClient`] (a client or a transaction) and run one
//!   statement in it: a rolled-back transaction leaves nothing.
//! - **[`Worker`]**: async handlers per job kind; LISTEN on the queues' job
//!   channels plus a poll fallback, dispatch in batches, heartbeats while a job
//!   runs, a handler's `Ok(Some(value))` becomes the job's output (on servers
//!   with outputs), an `Err` fails the job (the server retries it with
//!   backoff). [`Shutdown`] drains gracefully.
//! - **[`Consumer`]** and **[`PartitionedConsumer`]** read event queues; the
//!   partitioned one runs the `claim_next_slot` loop that keeps every slot polled.
//! - **Exactly-once handlers** ([`WorkerBuilder::tx_handler`],
//!   [`Consumer::new_tx`], [`PartitionedConsumer::new_tx`]) write their
//!   effects through the transaction that completes the job (acks the batch).
//! - **Errors** carry a [`ErrorKind`] from the SQLSTATE.
//!
//! Functions of newer servers (outputs, progress, flows, `job_channel`) are
//! found in `pg_proc` at a worker's start and used when present.
//!
//! ## A producer in the caller's transaction
//!
//! ```no_run
//! use pgque_client::{enqueue, send, EnqueueOptions};
//! use serde_json::json;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let (mut client, conn) = tokio_postgres::connect("host=/tmp dbname=app", tokio_postgres::NoTls).await?;
//! tokio::spawn(conn);
//! let tx = client.transaction().await?;
//! let opts = EnqueueOptions { priority: Some(5), ..Default::default() };
//! let job_id = enqueue(&tx, "emails", "welcome", &json!({"to": 42}), &opts).await?;
//! send(&tx, "orders", "order.created", &json!({"id": 7}), Some("tenant-42")).await?;
//! tx.commit().await?; // both become visible (and the job's NOTIFY fires) here
//! # let _ = job_id; Ok(()) }
//! ```
//!
//! ## A job worker
//!
//! ```no_run
//! use pgque_client::{Job, Shutdown, Worker};
//! use serde_json::json;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let worker = Worker::builder("host=/tmp dbname=app", ["emails"])?
//!     .concurrency(8)
//!     .handler("welcome", |job: Job| async move {
//!         let to = job.args["to"].as_i64().ok_or("no recipient")?;
//!         Ok(Some(json!({ "sent_to": to })))
//!     })
//!     .build()?;
//! // Drains on SIGTERM / Ctrl-C (or call .trigger() on a clone).
//! worker.run(Shutdown::on_signals()).await?;
//! # Ok(()) }
//! ```
//!
//! ## Exactly-once handlers
//!
//! A handler registered with [`WorkerBuilder::tx_handler`] gets the job and a
//! `&mut tokio_postgres::Transaction` on a connection of the worker's. Its
//! writes and the job's completion commit in one transaction: the worker runs
//! `pgque.complete(job_id, lease_token, output)` in it and commits only if the
//! server accepted the completion.
//!
//! - **Guaranteed**: for every job that ends completed, the effects written
//!   through `tx` by exactly one run of its handler are committed, that run's
//!   output is the job's output, and the effects of every other run (a run
//!   whose lease expired and was rescued, a run of a cancelled job, a run cut
//!   short by a crash, a killed connection or an error) are rolled back.
//! - **Not guaranteed**: anything the handler does outside that transaction:
//!   an e-mail, an HTTP call, a write on another connection or database
//!   happens once per run, i.e. at least once. Make those idempotent, or
//!   have the handler enqueue them (as jobs or events, through `tx`) so that
//!   they exist only if the job completes.
//! - **A lost lease shows up** as a refused completion: `pgque.complete`
//!   returns false (the lease expired and the rescue gave the job to another
//!   worker, or the job was cancelled, or handed back at shutdown), the
//!   transaction is rolled back, [`Stats::lost`] is incremented and a line
//!   goes to stderr; the job itself is not failed (it belongs to its new run,
//!   or it is cancelled). While the handler runs, [`Job::is_cancelled`] turns
//!   true at the first heartbeat that leaves the job out: a long handler may
//!   check it and return early, its effects will be rolled back anyway.
//! - A handler `Err` (or panic) rolls back, and the job is failed with the
//!   error in a separate transaction (retried with backoff), as for plain
//!   handlers. Keep the transaction short: it holds the locks of its writes
//!   until the handler returns.
//!
//! ```no_run
//! use pgque_client::{Job, Shutdown, Worker};
//! use serde_json::json;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let worker = Worker::builder("host=/tmp dbname=app", ["payments"])?
//!     .concurrency(8)
//!     .tx_handler("capture", |job: Job, tx| {
//!         Box::pin(async move {
//!             let order = job.args["order"].as_i64().ok_or("no order")?;
//!             tx.execute("UPDATE orders SET captured = true WHERE id = $1", &[&order]).await?;
//!             tx.execute("INSERT INTO ledger (order_id, job_id) VALUES ($1, $2)", &[&order, &job.id])
//!                 .await?;
//!             Ok(Some(json!({ "captured": order })))
//!         })
//!     })
//!     .build()?;
//! let stats = worker.stats().clone();
//! worker.run(Shutdown::on_signals()).await?;
//! println!("lost completions (rolled back): {}", stats.lost.load(std::sync::atomic::Ordering::Relaxed));
//! # Ok(()) }
//! ```
//!
//! The consumers' [`Consumer::new_tx`] / [`PartitionedConsumer::new_tx`] do
//! the same for events: the handler writes through the transaction that acks
//! the batch (a savepoint per event), so a redelivered batch does not apply
//! its effects twice.
//!
//! ## A partitioned consumer: 3 tasks over 16 slots
//!
//! ```no_run
//! use std::sync::Arc;
//! use pgque_client::{Message, PartitionedConsumer, Shutdown};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let consumer = Arc::new(
//!     PartitionedConsumer::new("host=/tmp dbname=app", "orders", "billing", 16, |m: Message| async move {
//!         println!("{:?} {:?}", m.partition_key(), m.json()?);
//!         Ok(())
//!     })?
//!     .workers(3),
//! );
//! consumer.run(Shutdown::on_signals()).await?;
//! # Ok(()) }
//! ```

mod consumer;
mod error;
mod features;
mod listen;
#[cfg(feature = "otel")]
pub mod otel;
mod producer;
mod shutdown;
mod worker;

pub use consumer::{Consumer, ConsumerStats, Message, PartitionedConsumer, TxMsgFuture};
pub use error::{Error, ErrorKind, Result};
pub use features::Features;
pub use producer::{
    enqueue, enqueue_flow, enqueue_many, send, send_at, send_batch, send_batch_with, send_idem, send_idem_with,
    send_text, send_text_with, send_with, EnqueueOptions, Enqueued, FlowJob, IdemSend, NewJob, SendOptions,
};
pub use shutdown::Shutdown;
pub use worker::{BoxError, HandlerResult, Job, Stats, TxFuture, Worker, WorkerBuilder};
