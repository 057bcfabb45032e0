//! The job worker against a real server.
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use pgque_client::*;
use serde_json::json;

async fn enqueue_n(c: &tokio_postgres::Client, q: &str, kind: &str, n: usize) -> Vec<i64> {
    let jobs: Vec<NewJob> = (0..n).map(|i| NewJob::new(kind, json!({ "i": i }))).collect();
    enqueue_many(c, q, &jobs, None)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.job_id.unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_with_8_concurrent_handlers() {
    let (dsn, c) = test_db("worker_once").await;
    c.execute("SELECT pgque.create_job_queue('q')", &[]).await.unwrap();
    let n = 400;
    enqueue_n(&c, "q", "work", n).await;
    let seen: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    let sd = Shutdown::new();
    for _ in 0..2 {
        let (seen, active, peak) = (seen.clone(), active.clone(), peak.clone());
        let w = Worker::builder(&dsn, ["q"])
            .unwrap()
            .concurrency(4)
            .poll_interval(Duration::from_millis(200))
            .handler("work", move |job: Job| {
                let (seen, active, peak) = (seen.clone(), active.clone(), peak.clone());
                async move {
                    *seen.lock().unwrap().entry(job.id).or_default() += 1;
                    let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    active.fetch_sub(1, Ordering::SeqCst);
                    Ok(Some(json!({"i": job.args["i"]})))
                }
            })
            .build()
            .unwrap();
        let sd = sd.clone();
        handles.push(tokio::spawn(async move { w.run(sd).await }));
    }
    wait_until(60, "every job completed", || async {
        states(&c, "q").await == vec![("completed".into(), n as i64)]
    })
    .await;
    sd.trigger();
    for h in handles {
        h.await.unwrap().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), n);
    assert!(seen.values().all(|&v| v == 1), "a job ran twice");
    assert_eq!(peak.load(Ordering::SeqCst), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_handler_is_retried_then_completes() {
    let (dsn, c) = test_db("worker_retry").await;
    c.execute("SELECT pgque.create_job_queue('q')", &[]).await.unwrap();
    let id = enqueue(&c, "q", "flaky", &json!({}), &EnqueueOptions::default())
        .await
        .unwrap()
        .unwrap();
    let attempts: Arc<Mutex<Vec<i32>>> = Arc::default();
    let a = attempts.clone();
    let w = Worker::builder(&dsn, ["q"])
        .unwrap()
        .poll_interval(Duration::from_millis(200))
        .handler("flaky", move |job: Job| {
            let a = a.clone();
            async move {
                a.lock().unwrap().push(job.attempt);
                if job.attempt == 1 {
                    return Err("boom on the first attempt".into());
                }
                Ok(None)
            }
        })
        .build()
        .unwrap();
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let sd = sd.clone();
        async move { w.run(sd).await }
    });
    wait_until(30, "the retry", || async {
        states(&c, "q").await == vec![("completed".into(), 1)]
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();
    assert_eq!(*attempts.lock().unwrap(), vec![1, 2]);
    let errs: String = c
        .query_one("SELECT errors::text FROM pgque.get_job($1)", &[&id])
        .await
        .unwrap()
        .get(0);
    assert!(errs.contains("boom on the first attempt"), "{errs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_long_handler_alive() {
    let (dsn, c) = test_db("worker_heartbeat").await;
    c.execute("SELECT pgque.create_job_queue('q')", &[]).await.unwrap();
    let id = enqueue(&c, "q", "long", &json!({}), &EnqueueOptions::default())
        .await
        .unwrap()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let w = Worker::builder(&dsn, ["q"])
        .unwrap()
        .lease(Duration::from_secs(2))
        .heartbeat_interval(Duration::from_millis(500))
        .poll_interval(Duration::from_millis(200))
        .handler("long", move |_job: Job| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(4)).await;
                Ok(None)
            }
        })
        .build()
        .unwrap();
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let sd = sd.clone();
        async move { w.run(sd).await }
    });
    wait_until(30, "completion", || async {
        states(&c, "q").await == vec![("completed".into(), 1)]
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let r = c
        .query_one("SELECT attempt FROM pgque.get_job($1)", &[&id])
        .await
        .unwrap();
    assert_eq!(r.get::<_, i32>(0), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_mid_batch_loses_nothing() {
    let (dsn, c) = test_db("worker_shutdown").await;
    c.execute("SELECT pgque.create_job_queue('q')", &[]).await.unwrap();
    let n = 60;
    let ids = enqueue_n(&c, "q", "slow", n).await;
    let handled: Arc<Mutex<Vec<i64>>> = Arc::default();
    let make = |handled: Arc<Mutex<Vec<i64>>>| {
        Worker::builder(&dsn, ["q"])
            .unwrap()
            .concurrency(4)
            .poll_interval(Duration::from_millis(200))
            .handler("slow", move |job: Job| {
                let handled = handled.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    handled.lock().unwrap().push(job.id);
                    Ok(None)
                }
            })
            .build()
            .unwrap()
    };
    let w = make(handled.clone());
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let sd = sd.clone();
        async move { w.run(sd).await }
    });
    wait_until(30, "some jobs handled", || async { handled.lock().unwrap().len() >= 8 }).await;
    let running = states(&c, "q")
        .await
        .iter()
        .find(|s| s.0 == "running")
        .map_or(0, |s| s.1);
    sd.trigger();
    h.await.unwrap().unwrap();
    assert!(running > 0, "the shutdown should come mid-batch");
    let st = states(&c, "q").await;
    let done_first = handled.lock().unwrap().len() as i64;
    assert!(!st.iter().any(|s| s.0 == "running"), "{st:?}");
    assert_eq!(
        st.iter().find(|s| s.0 == "completed").map_or(0, |s| s.1),
        done_first,
        "{st:?}"
    );
    // Restart: the rest is done; every job handled exactly once.
    let w = make(handled.clone());
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let sd = sd.clone();
        async move { w.run(sd).await }
    });
    wait_until(60, "all completed", || async {
        states(&c, "q").await == vec![("completed".into(), n as i64)]
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();
    let mut got = handled.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_wakes_an_idle_worker() {
    let (dsn, c) = test_db("worker_listen").await;
    c.execute("SELECT pgque.create_job_queue('q')", &[]).await.unwrap();
    let got: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let g = got.clone();
    let w = Worker::builder(&dsn, ["q"])
        .unwrap()
        .concurrency(1)
        .poll_interval(Duration::from_secs(60))
        .handler("ping", move |job: Job| {
            let g = g.clone();
            async move {
                g.lock()
                    .unwrap()
                    .insert(job.args["i"].as_i64().unwrap(), Instant::now());
                Ok(None)
            }
        })
        .build()
        .unwrap();
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let sd = sd.clone();
        async move { w.run(sd).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut lat = Vec::new();
    for i in 0..5i64 {
        let t0 = Instant::now();
        enqueue(&c, "q", "ping", &json!({ "i": i }), &EnqueueOptions::default())
            .await
            .unwrap();
        wait_until(10, "the job handled", || async { got.lock().unwrap().contains_key(&i) }).await;
        lat.push(got.lock().unwrap()[&i] - t0);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    sd.trigger();
    h.await.unwrap().unwrap();
    lat.sort();
    println!(
        "LISTEN wake-up latency (commit -> handler): median {:?}, max {:?}",
        lat[2], lat[4]
    );
    assert!(lat[4] < Duration::from_secs(10));
}

#[tokio::test]
async fn unknown_queue_is_a_typed_error_and_run_returns() {
    let (dsn, _c) = test_db("worker_unknown").await;
    let w = Worker::builder(&dsn, ["no_such_queue"]).unwrap().build().unwrap();
    let err = tokio::time::timeout(Duration::from_secs(30), w.run(Shutdown::new()))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UndefinedObject, "{err}");
}
