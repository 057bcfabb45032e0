//! One cell of benches/clients: drain a backlog of N trivial jobs through the
//! Rust `Worker` (concurrency 100) or through a hand-written SQL loop
//! (dispatch 100, complete_many, on one connection): the client's overhead.
//!
//!     cargo run --release --example bench_worker -- DSN N worker|loop
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use pgque_client::{enqueue_many, Job, NewJob, Shutdown, Worker};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (dsn, n, mode) = (args[1].clone(), args[2].parse::<usize>()?, args[3].clone());
    let (c, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let queue = format!("bench_{mode}_{nanos:x}");
    c.execute("SELECT pgque.create_job_queue($1)", &[&queue]).await?;
    for i in (0..n).step_by(1000) {
        let jobs: Vec<NewJob> = (i..n.min(i + 1000))
            .map(|j| NewJob::new("noop", json!({ "i": j })))
            .collect();
        enqueue_many(&c, &queue, &jobs, None).await?;
    }
    let t0 = Instant::now();
    let label = if mode == "worker" {
        let done = Arc::new(AtomicUsize::new(0));
        let stop = Shutdown::new();
        let (d, s) = (done.clone(), stop.clone());
        let w = Worker::builder(&dsn, [queue.clone()])?
            .concurrency(100)
            .handler("noop", move |_job: Job| {
                let (d, s) = (d.clone(), s.clone());
                async move {
                    if d.fetch_add(1, Ordering::Relaxed) + 1 == n {
                        s.trigger();
                    }
                    Ok(None)
                }
            })
            .build()?;
        w.run(stop).await?;
        "pgque Worker (Rust)"
    } else {
        let mut done = 0;
        while done < n {
            let rows = c
                .query(
                    "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY[$1], 100, 'loop', '60 seconds')",
                    &[&queue],
                )
                .await?;
            let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
            let tokens: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
            c.execute("SELECT pgque.complete_many($1, $2)", &[&ids, &tokens])
                .await?;
            done += ids.len();
        }
        "hand-written SQL loop (Rust)"
    };
    let secs = t0.elapsed().as_secs_f64();
    let left: i64 = c
        .query_one(
            "SELECT count(*) FROM pgque.all_jobs WHERE queue = $1 AND state <> 'completed'",
            &[&queue],
        )
        .await?
        .get(0);
    assert_eq!(left, 0);
    println!(
        "{}",
        json!({"system": label, "jobs": n, "secs": (secs * 1000.0).round() / 1000.0, "jobs_per_s": (n as f64 / secs).round()})
    );
    Ok(())
}
