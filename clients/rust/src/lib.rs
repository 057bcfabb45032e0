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
mod producer;
mod shutdown;
mod worker;

pub use consumer::{Consumer, ConsumerStats, Message, PartitionedConsumer, TxMsgFuture};
pub use error::{Error, ErrorKind, Result};
pub use features::Features;
pub use producer::{
    enqueue, enqueue_flow, enqueue_many, send, send_batch, send_idem, send_text, EnqueueOptions, Enqueued, FlowJob,
    IdemSend, NewJob,
};
pub use shutdown::Shutdown;
pub use worker::{BoxError, HandlerResult, Job, Stats, TxFuture, Worker, WorkerBuilder};
