//! Exactly-once handlers against `make run`'s server: three jobs write a
//! ledger row each through the transaction their completion commits in; a
//! fourth is cancelled while its handler runs, so its completion is refused
//! and its ledger row is rolled back.
//!
//!     cargo run --manifest-path clients/rust/Cargo.toml --example exactly_once
//!
//! (`PGQUE_DSN=...` points it at another server's database with pgque.)
//!
//! Prints the ledger (three rows) and the worker's counters (completed 3,
//! lost 1).

use std::sync::atomic::Ordering;
use std::time::Duration;

use pgque_client::{enqueue, EnqueueOptions, Job, Shutdown, Worker};
use serde_json::json;

const DSN: &str = "host=/tmp/pgque_run_15 port=55415 dbname=pgque_demo user=postgres";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dsn = std::env::var("PGQUE_DSN").unwrap_or_else(|_| DSN.to_string());
    let (client, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS rs_ledger (job_id bigint PRIMARY KEY, amount int NOT NULL); \
             TRUNCATE rs_ledger; \
             SELECT pgque.create_job_queue('rs_payments') \
             WHERE NOT EXISTS (SELECT 1 FROM pgque.job_queue_status WHERE queue_name = 'rs_payments')",
        )
        .await?;
    let opts = EnqueueOptions::default();
    for amount in [10, 20, 30] {
        enqueue(&client, "rs_payments", "capture", &json!({ "amount": amount }), &opts).await?;
    }
    let slow = enqueue(
        &client,
        "rs_payments",
        "capture",
        &json!({ "amount": 99, "slow": true }),
        &opts,
    )
    .await?
    .ok_or("no job id")?;

    let worker = Worker::builder(&dsn, ["rs_payments"])?
        .concurrency(4)
        .tx_handler("capture", |job: Job, tx| {
            Box::pin(async move {
                let amount = job.args["amount"].as_i64().ok_or("no amount")? as i32;
                tx.execute(
                    "INSERT INTO rs_ledger (job_id, amount) VALUES ($1, $2)",
                    &[&job.id, &amount],
                )
                .await?;
                if job.args["slow"] == json!(true) {
                    tokio::time::sleep(Duration::from_secs(2)).await; // cancelled meanwhile
                }
                Ok(Some(json!({ "captured": amount })))
            })
        })
        .build()?;
    let stats = worker.stats().clone();
    let stop = Shutdown::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.execute("SELECT pgque.cancel($1)", &[&slow]).await?;
    while stats.completed.load(Ordering::SeqCst) + stats.lost.load(Ordering::SeqCst) < 4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.trigger();
    run.await??;

    for r in client
        .query("SELECT job_id, amount FROM rs_ledger ORDER BY job_id", &[])
        .await?
    {
        println!("ledger: job {} amount {}", r.get::<_, i64>(0), r.get::<_, i32>(1));
    }
    println!(
        "completed {}, lost {} (job {slow}: cancelled mid-handler, its ledger row rolled back)",
        stats.completed.load(Ordering::SeqCst),
        stats.lost.load(Ordering::SeqCst)
    );
    Ok(())
}
