//! One cell of benches/clients (benches/clients/run.sh), printing one JSON line:
//!
//!     bench_worker DSN N worker|loop        drain a backlog of N trivial jobs through
//!                                           the `Worker` (concurrency 100) or a
//!                                           hand-written loop (dispatch 100 +
//!                                           complete_many on one connection)
//!     bench_worker DSN N eo-noop|eo-plain|eo-tx
//!                                           the Worker's drain with a no-op handler,
//!                                           a plain handler inserting one row into
//!                                           bench_effects on a pooled connection of
//!                                           its own (autocommit), or the exactly-once
//!                                           `tx_handler` doing the same insert
//!                                           through the job's transaction
//!     bench_worker DSN RATE rate SECS       latency enqueue -> handler start at a
//!                                           fixed rate, jobs enqueued by
//!                                           $BENCH_PRODUCER (produce.py)
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgque_client::{enqueue_many, Job, NewJob, Shutdown, Worker, WorkerBuilder};
use serde_json::{json, Value};

const CONC: usize = 100;
const EFFECTS_SQL: &str = "INSERT INTO bench_effects (queue, job_id) VALUES ($1, $2)";

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn builder(dsn: &str, queue: &str) -> Result<WorkerBuilder, Box<dyn std::error::Error>> {
    Ok(Worker::builder(dsn, [queue.to_string()])?
        .concurrency(CONC)
        .poll_interval(Duration::from_millis(500)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (dsn, n, mode) = (args[1].clone(), args[2].parse::<f64>()?, args[3].clone());
    let (c, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let queue = format!("bench_{}_{nanos:x}", mode.replace('-', "_"));
    c.execute("SELECT pgque.create_job_queue($1)", &[&queue]).await?;
    if mode == "rate" {
        return rate(&dsn, &queue, n, args[4].parse::<f64>()?).await;
    }
    let n = n as usize;
    for i in (0..n).step_by(1000) {
        let jobs: Vec<NewJob> = (i..n.min(i + 1000))
            .map(|j| NewJob::new("noop", json!({ "i": j })))
            .collect();
        enqueue_many(&c, &queue, &jobs, None).await?;
    }
    if mode == "eo-plain" || mode == "eo-tx" {
        c.execute(
            "CREATE TABLE IF NOT EXISTS bench_effects (queue text NOT NULL, job_id bigint NOT NULL)",
            &[],
        )
        .await?;
    }
    let t0 = Instant::now();
    let label = if mode == "loop" {
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
    } else {
        let done = Arc::new(AtomicUsize::new(0));
        let stop = Shutdown::new();
        let (d, s) = (done.clone(), stop.clone());
        let count = move || {
            if d.fetch_add(1, Ordering::Relaxed) + 1 == n {
                s.trigger();
            }
        };
        let b = builder(&dsn, &queue)?;
        let w = match mode.as_str() {
            "eo-tx" => {
                let q = queue.clone();
                b.tx_handler("noop", move |job: Job, tx| {
                    let (q, count) = (q.clone(), count.clone());
                    Box::pin(async move {
                        tx.execute(EFFECTS_SQL, &[&q, &job.id]).await?;
                        count();
                        Ok(None)
                    })
                })
            }
            "eo-plain" => {
                // Up to CONC connections, opened on first need (as the worker's tx pool).
                let pool = Arc::new(
                    deadpool_postgres::Pool::builder(deadpool_postgres::Manager::new(
                        dsn.parse()?,
                        tokio_postgres::NoTls,
                    ))
                    .max_size(CONC)
                    .build()?,
                );
                let q = queue.clone();
                b.handler("noop", move |job: Job| {
                    let (q, pool, count) = (q.clone(), pool.clone(), count.clone());
                    async move {
                        let conn = pool.get().await?;
                        conn.execute(EFFECTS_SQL, &[&q, &job.id]).await?;
                        count();
                        Ok(None)
                    }
                })
            }
            _ => b.handler("noop", move |_job: Job| {
                let count = count.clone();
                async move {
                    count();
                    Ok(None)
                }
            }),
        }
        .build()?;
        w.run(stop).await?;
        match mode.as_str() {
            "worker" => "pgque Worker (Rust)",
            _ => "pgque Worker (Rust) eo",
        }
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
    let mut line = json!({"system": label, "mode": "drain", "jobs": n, "secs": (secs * 1000.0).round() / 1000.0, "jobs_per_s": (n as f64 / secs).round()});
    if let Some(h) = mode.strip_prefix("eo-") {
        if h != "noop" {
            let row = c
                .query_one(
                    "SELECT count(*), count(DISTINCT job_id) FROM bench_effects WHERE queue = $1",
                    &[&queue],
                )
                .await?;
            let (rows, distinct): (i64, i64) = (row.get(0), row.get(1));
            assert!(rows == n as i64 && distinct == n as i64, "{rows} {distinct} {n}");
        }
        line["system"] = json!("pgque Worker (Rust)");
        line["mode"] = json!("eo");
        line["handler"] = json!(h);
    }
    println!("{line}");
    Ok(())
}

/// The fixed-rate cell: the worker runs, produce.py enqueues RATE jobs/s for
/// SECS s, each handler records its start minus the job's args.t.
async fn rate(dsn: &str, queue: &str, rate: f64, secs: f64) -> Result<(), Box<dyn std::error::Error>> {
    let n = (rate * secs) as usize;
    let lat = Arc::new(Mutex::new(Vec::<f64>::with_capacity(n)));
    let stop = Shutdown::new();
    let (l, s) = (lat.clone(), stop.clone());
    let w = builder(dsn, queue)?
        .handler("noop", move |job: Job| {
            // None: produce.py's warm-up job (no "t"), not counted.
            let d = job.args["t"].as_f64().map(|t| now_secs() - t);
            let (l, s) = (l.clone(), s.clone());
            async move {
                let Some(d) = d else { return Ok(None) };
                let mut v = l.lock().unwrap();
                v.push(d);
                if v.len() == n {
                    s.trigger();
                }
                Ok(None)
            }
        })
        .build()?;
    let producer = std::env::var("BENCH_PRODUCER")?;
    let mut parts = producer.split_whitespace();
    let child = std::process::Command::new(parts.next().ok_or("BENCH_PRODUCER")?)
        .args(parts)
        .args(["pgque", dsn, queue, &rate.to_string(), &secs.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let guard = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs_f64(secs + 60.0)).await;
        guard.trigger();
    });
    w.run(stop).await?;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    let p: Value = serde_json::from_slice(
        out.stdout
            .split(|b| *b == b'\n')
            .rfind(|l| !l.is_empty())
            .unwrap_or(b"{}"),
    )?;
    let mut v = lat.lock().unwrap().clone();
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |f: f64| -> Value {
        if v.is_empty() {
            Value::Null
        } else {
            let i = ((v.len() as f64 * f) as usize).min(v.len() - 1);
            json!((v[i] * 100_000.0).round() / 100.0)
        }
    };
    println!(
        "{}",
        json!({"system": "pgque Worker (Rust)", "mode": "rate", "target": rate, "achieved": p["rate"],
               "sent": p["sent"], "received": v.len(), "p50_ms": q(0.5), "p99_ms": q(0.99),
               "enqueue_ms_p50": p["enqueue_ms_p50"]})
    );
    Ok(())
}
