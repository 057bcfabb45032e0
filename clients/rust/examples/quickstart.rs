//! The README's quick start: against `make run`'s server, enqueue a job and
//! send an event in one transaction, run a worker until it has done the job,
//! then a consumer until it has read the event.
//!
//!     cargo run --manifest-path clients/rust/Cargo.toml --example quickstart

use pgque_client::{enqueue, send, Consumer, EnqueueOptions, Job, Message, Shutdown, Worker};
use serde_json::json;

const DSN: &str = "host=/tmp/pgque_run_15 port=55415 dbname=pgque_demo user=postgres";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut client, conn) = tokio_postgres::connect(DSN, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let tx = client.transaction().await?;
    tx.batch_execute(
        "SELECT pgque.create_job_queue('rs_emails'); SELECT pgque.create_queue('rs_orders'); \
         SELECT pgque.subscribe('rs_orders', 'billing')",
    )
    .await?;
    let opts = EnqueueOptions {
        priority: Some(5),
        ..Default::default()
    };
    let job_id = enqueue(&tx, "rs_emails", "welcome", &json!({"to": "ada@example.com"}), &opts).await?;
    send(&tx, "rs_orders", "order.created", &json!({"id": 7}), Some("tenant-42")).await?;
    tx.commit().await?;
    println!("enqueued job {job_id:?}");

    let stop = Shutdown::on_signals(); // SIGTERM / Ctrl-C drain the worker too
    let s = stop.clone();
    let worker = Worker::builder(DSN, ["rs_emails"])?
        .concurrency(4)
        .handler("welcome", move |job: Job| {
            let s = s.clone();
            async move {
                println!(
                    "job {}: welcome mail to {} (attempt {})",
                    job.id, job.args["to"], job.attempt
                );
                s.trigger(); // a demo: stop after one job
                Ok(Some(json!({"sent": true})))
            }
        })
        .build()?;
    worker.run(stop).await?;

    let stop = Shutdown::new();
    let s = stop.clone();
    let consumer = Consumer::new(DSN, "rs_orders", "billing", move |m: Message| {
        let s = s.clone();
        async move {
            println!(
                "event {} {} key={:?} {}",
                m.msg_id,
                m.type_name,
                m.partition_key(),
                m.json()?
            );
            s.trigger();
            Ok(())
        }
    })?;
    consumer.run(stop).await?;
    Ok(())
}
