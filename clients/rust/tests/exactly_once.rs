//! Exactly-once handlers (`tx_handler`) against a real server: the handler's
//! effects and the job's completion commit in one transaction, and a
//! completion the server refuses (lease lost, job cancelled) takes the
//! effects back with it.
mod common;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pgque_client::*;
use serde_json::json;
use tokio::sync::Notify;

async fn effects(c: &tokio_postgres::Client) -> HashMap<i64, i64> {
    c.query("SELECT job_id, count(*) FROM effects GROUP BY job_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

async fn setup(name: &str) -> (String, tokio_postgres::Client) {
    let (dsn, c) = test_db(name).await;
    c.batch_execute(
        "SELECT pgque.create_job_queue('q'); \
         CREATE TABLE effects (job_id bigint NOT NULL, attempt int NOT NULL)",
    )
    .await
    .unwrap();
    (dsn, c)
}

async fn enqueue_n(c: &tokio_postgres::Client, kind: &str, n: usize) -> Vec<i64> {
    let jobs: Vec<NewJob> = (0..n).map(|i| NewJob::new(kind, json!({ "i": i }))).collect();
    enqueue_many(c, "q", &jobs, None)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.job_id.unwrap())
        .collect()
}

const INSERT: &str = "INSERT INTO effects (job_id, attempt) VALUES ($1, $2)";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn effects_and_completion_commit_together() {
    let (dsn, c) = setup("xo_commit").await;
    let n = 200;
    let ids = enqueue_n(&c, "work", n).await;
    let boom = enqueue(
        &c,
        "q",
        "boom",
        &json!({}),
        &EnqueueOptions {
            max_attempts: Some(1),
            ..Default::default()
        },
    )
    .await
    .unwrap()
    .unwrap();
    let w = Worker::builder(&dsn, ["q"])
        .unwrap()
        .concurrency(4)
        .poll_interval(Duration::from_millis(200))
        .tx_handler("work", |job: Job, tx| {
            Box::pin(async move {
                tx.execute(INSERT, &[&job.id, &job.attempt]).await?;
                Ok(Some(json!({ "i": job.args["i"] })))
            })
        })
        .tx_handler("boom", |job: Job, tx| {
            Box::pin(async move {
                tx.execute(INSERT, &[&job.id, &job.attempt]).await?;
                Err("after the insert".into())
            })
        })
        .build()
        .unwrap();
    let stats = w.stats().clone();
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let sd = sd.clone();
        async move { w.run(sd).await }
    });
    wait_until(60, "every job finished", || async {
        states(&c, "q").await == vec![("completed".into(), n as i64), ("failed".into(), 1)]
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();
    let fx = effects(&c).await;
    let mut got: Vec<i64> = fx.keys().copied().collect();
    got.sort();
    assert_eq!(got, ids, "one effect per completed job, none of the failed one");
    assert!(fx.values().all(|&v| v == 1));
    assert!(!fx.contains_key(&boom));
    assert_eq!(stats.completed.load(Ordering::SeqCst), n as u64);
    assert_eq!(stats.failed.load(Ordering::SeqCst), 1);
    assert_eq!(stats.lost.load(Ordering::SeqCst), 0);
    let out: serde_json::Value = c
        .query_one("SELECT output FROM pgque.get_job($1)", &[&ids[9]])
        .await
        .unwrap()
        .get(0);
    assert_eq!(out, json!({ "i": 9 }));
    let errs: String = c
        .query_one("SELECT errors::text FROM pgque.get_job($1)", &[&boom])
        .await
        .unwrap()
        .get(0);
    assert!(errs.contains("after the insert"), "{errs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_rolls_back_and_the_retry_commits_once() {
    // The first attempt inserts, then fails: rolled back, failed in its own
    // transaction, retried; the second attempt's insert is the only row.
    let (dsn, c) = setup("xo_retry").await;
    let id = enqueue(&c, "q", "flaky", &json!({}), &EnqueueOptions::default())
        .await
        .unwrap()
        .unwrap();
    let w = Worker::builder(&dsn, ["q"])
        .unwrap()
        .concurrency(1)
        .poll_interval(Duration::from_millis(200))
        .tx_handler("flaky", |job: Job, tx| {
            Box::pin(async move {
                tx.execute(INSERT, &[&job.id, &job.attempt]).await?;
                if job.attempt == 1 {
                    return Err("boom after the insert".into());
                }
                Ok(Some(json!({ "attempt": job.attempt })))
            })
        })
        .build()
        .unwrap();
    let stats = w.stats().clone();
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let sd = sd.clone();
        async move { w.run(sd).await }
    });
    wait_until(30, "the retry completed", || async {
        states(&c, "q").await == vec![("completed".into(), 1)]
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();
    let rows: Vec<(i64, i32)> = c
        .query("SELECT job_id, attempt FROM effects", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, vec![(id, 2)]);
    let r = c
        .query_one("SELECT attempt, output, errors::text FROM pgque.get_job($1)", &[&id])
        .await
        .unwrap();
    assert_eq!(r.get::<_, i32>(0), 2);
    assert_eq!(r.get::<_, Option<serde_json::Value>>(1), Some(json!({ "attempt": 2 })));
    assert!(r.get::<_, String>(2).contains("boom after the insert"));
    assert_eq!(stats.completed.load(Ordering::SeqCst), 1);
    assert_eq!(stats.failed.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_lost_mid_handler_rolls_back_the_effects() {
    // A 1 s lease without heartbeats; the first worker's handler sleeps 3 s,
    // the rescue hands the jobs to a second worker, which completes them; the
    // first worker's completions are refused and its inserts rolled back.
    let (dsn, c) = setup("xo_lease").await;
    c.execute("SELECT pgque.set_job_queue_config('q', 'max_attempts', '10')", &[])
        .await
        .unwrap();
    let ids = enqueue_n(&c, "slow", 3).await;
    let make = |sleep: Duration| {
        Worker::builder(&dsn, ["q"])
            .unwrap()
            .concurrency(3)
            .lease(Duration::from_secs(1))
            .heartbeat_interval(Duration::from_secs(3600))
            .poll_interval(Duration::from_millis(100))
            .tx_handler("slow", move |job: Job, tx| {
                Box::pin(async move {
                    tx.execute(INSERT, &[&job.id, &job.attempt]).await?;
                    tokio::time::sleep(sleep).await;
                    Ok(None)
                })
            })
            .build()
            .unwrap()
    };
    let (slow, fast) = (make(Duration::from_secs(3)), make(Duration::ZERO));
    let (slow_stats, fast_stats) = (slow.stats().clone(), fast.stats().clone());
    let (sd_slow, sd_fast) = (Shutdown::new(), Shutdown::new());
    let h1 = tokio::spawn({
        let sd = sd_slow.clone();
        async move { slow.run(sd).await }
    });
    wait_until(10, "the slow worker holds the jobs", || async {
        states(&c, "q").await == vec![("running".into(), 3)]
    })
    .await;
    let h2 = tokio::spawn({
        let sd = sd_fast.clone();
        async move { fast.run(sd).await }
    });
    wait_until(30, "the rescued jobs completed by the second worker", || async {
        fast_stats.completed.load(Ordering::SeqCst) == 3
    })
    .await;
    wait_until(30, "the slow worker's completions refused", || async {
        slow_stats.lost.load(Ordering::SeqCst) == 3
    })
    .await;
    sd_slow.trigger();
    sd_fast.trigger();
    h1.await.unwrap().unwrap();
    h2.await.unwrap().unwrap();
    assert_eq!(slow_stats.completed.load(Ordering::SeqCst), 0);
    assert_eq!(states(&c, "q").await, vec![("completed".into(), 3)]);
    let fx = effects(&c).await;
    let mut got: Vec<i64> = fx.keys().copied().collect();
    got.sort();
    assert_eq!(got, ids);
    assert!(fx.values().all(|&v| v == 1), "{fx:?}");
    let attempts: Vec<i32> = c
        .query("SELECT DISTINCT attempt FROM effects", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(attempts, vec![2], "only the second attempts' effects remain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_mid_handler_leaves_no_effects() {
    let (dsn, c) = setup("xo_cancel").await;
    let id = enqueue(&c, "q", "cancel_me", &json!({}), &EnqueueOptions::default())
        .await
        .unwrap()
        .unwrap();
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (s, r) = (started.clone(), release.clone());
    let w = Worker::builder(&dsn, ["q"])
        .unwrap()
        .concurrency(1)
        .poll_interval(Duration::from_millis(200))
        .tx_handler("cancel_me", move |job: Job, tx| {
            let (s, r) = (s.clone(), r.clone());
            Box::pin(async move {
                tx.execute(INSERT, &[&job.id, &job.attempt]).await?;
                s.notify_one();
                r.notified().await;
                Ok(Some(json!({ "should": "not be recorded" })))
            })
        })
        .build()
        .unwrap();
    let stats = w.stats().clone();
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let sd = sd.clone();
        async move { w.run(sd).await }
    });
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the handler started");
    let cancelled: bool = c.query_one("SELECT pgque.cancel($1)", &[&id]).await.unwrap().get(0);
    assert!(cancelled);
    release.notify_one();
    wait_until(10, "the refused completion", || async {
        stats.lost.load(Ordering::SeqCst) == 1
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();
    let r = c
        .query_one("SELECT state, output FROM pgque.get_job($1)", &[&id])
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "cancelled");
    assert_eq!(r.get::<_, Option<serde_json::Value>>(1), None);
    assert!(effects(&c).await.is_empty());
    assert_eq!(stats.completed.load(Ordering::SeqCst), 0);
}

// ---- event consumers ----------------------------------------------------------

async fn msg_effects(c: &tokio_postgres::Client) -> HashMap<i64, i64> {
    c.query("SELECT msg_id, count(*) FROM msg_effects GROUP BY msg_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_batch_effects_commit_with_its_ack() {
    // Each event's insert commits with the batch's ack; an event whose
    // handler fails after its insert takes back only that insert (its
    // savepoint) and is nacked; it comes back once.
    let (dsn, c) = test_db("xo_consumer").await;
    c.batch_execute(
        "SELECT pgque.create_queue('ev'); SELECT pgque.subscribe('ev', 'c1'); \
         CREATE TABLE msg_effects (msg_id bigint NOT NULL)",
    )
    .await
    .unwrap();
    let payloads: Vec<serde_json::Value> = (0..30).map(|i| json!({ "i": i })).collect();
    let ids = send_batch(&c, "ev", "t", &payloads, None).await.unwrap();
    let consumer = Consumer::new_tx(&dsn, "ev", "c1", |m: Message, tx| {
        Box::pin(async move {
            tx.execute("INSERT INTO msg_effects (msg_id) VALUES ($1)", &[&m.msg_id])
                .await?;
            if m.json()?["i"] == 7 && m.retry_count.is_none() {
                return Err("first delivery of 7 fails after its insert".into());
            }
            Ok(())
        })
    })
    .unwrap()
    .poll_interval(Duration::from_millis(200))
    .retry_after(Duration::ZERO);
    let sd = Shutdown::new();
    let consumer = Arc::new(consumer);
    let h = tokio::spawn({
        let (sd, consumer) = (sd.clone(), consumer.clone());
        async move { consumer.run(sd).await }
    });
    c.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    wait_until(30, "every event's effect", || async {
        msg_effects(&c).await.len() == 30
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();
    let fx = msg_effects(&c).await;
    let mut got: Vec<i64> = fx.keys().copied().collect();
    got.sort();
    assert_eq!(got, ids);
    assert!(fx.values().all(|&v| v == 1), "{fx:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_slot_lost_mid_batch_rolls_the_batch_back() {
    // One slot, a 1 s lease: the handler of the third event sleeps past it
    // and a thief claims the slot meanwhile. The task notices at its next
    // renewal and the batch's inserts so far roll back; once the thief's
    // lease lapses the task handles the same batch again: one row per event.
    let (dsn, c) = test_db("xo_partitioned").await;
    c.batch_execute(
        "SELECT pgque.create_queue('ev'); SELECT pgque.subscribe_partitioned('ev', 'pc', 1); \
         CREATE TABLE msg_effects (msg_id bigint NOT NULL)",
    )
    .await
    .unwrap();
    let payloads: Vec<serde_json::Value> = (0..6).map(|i| json!({ "i": i })).collect();
    let ids = send_batch(&c, "ev", "t", &payloads, Some(&[Some("k"); 6]))
        .await
        .unwrap();
    let calls: Arc<std::sync::Mutex<Vec<i64>>> = Arc::default();
    let stolen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (calls2, stolen2, dsn2) = (calls.clone(), stolen.clone(), dsn.clone());
    let pc = Arc::new(
        PartitionedConsumer::new_tx(&dsn, "ev", "pc", 1, move |m: Message, tx| {
            let (calls, stolen, dsn) = (calls2.clone(), stolen2.clone(), dsn2.clone());
            Box::pin(async move {
                calls.lock().unwrap().push(m.msg_id);
                tx.execute("INSERT INTO msg_effects (msg_id) VALUES ($1)", &[&m.msg_id])
                    .await?;
                if m.json()?["i"] == 2 && !stolen.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(1300)).await; // past the 1 s lease
                    let thief = connect(&dsn).await;
                    let epoch: Option<i64> = thief
                        .query_one("SELECT pgque.claim_slot('ev', 'pc', 0, 'thief', '1 second')", &[])
                        .await?
                        .get(0);
                    assert!(epoch.is_some(), "the thief got the slot");
                    stolen.store(true, Ordering::SeqCst);
                }
                Ok(())
            })
        })
        .unwrap()
        .ttl(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(200))
        .worker_id("A"),
    );
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let (sd, pc) = (sd.clone(), pc.clone());
        async move { pc.run(sd).await }
    });
    c.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    wait_until(30, "the batch handled again and committed", || async {
        msg_effects(&c).await.len() == 6
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();
    assert!(stolen.load(Ordering::SeqCst));
    assert!(pc.stats().lost_slots.load(Ordering::SeqCst) >= 1);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(&calls[..3], &ids[..3], "{calls:?}");
    assert_eq!(
        &calls[3..],
        &ids[..],
        "the first try stopped after the third event: {calls:?}"
    );
    let fx = msg_effects(&c).await;
    let mut got: Vec<i64> = fx.keys().copied().collect();
    got.sort();
    assert_eq!(got, ids);
    assert!(fx.values().all(|&v| v == 1), "{fx:?}");
}

// ---- chaos, small ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminated_backends_and_expiring_leases_leave_one_effect_per_job() {
    // The Rust side of benches/results/exactly-once.md, in-process and small:
    // two workers on 1 s leases (one without heartbeats), 2 % of handler runs
    // sleeping past the lease, and every 300 ms one or two of the workers'
    // backends terminated (dispatch, heartbeat, LISTEN, handler transactions).
    // At the end every job is completed with one effect row, and its output
    // names the attempt of that row.
    let (dsn, c) = setup("xo_chaos").await;
    c.execute("SELECT pgque.set_job_queue_config('q', 'max_attempts', '1000')", &[])
        .await
        .unwrap();
    let n = 600;
    let ids = enqueue_n(&c, "work", n).await;
    let wdsn = format!("{dsn} application_name=rs_chaos");
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let make = |heartbeats: bool| {
        let runs = runs.clone();
        Worker::builder(&wdsn, ["q"])
            .unwrap()
            .concurrency(4)
            .lease(Duration::from_secs(1))
            .heartbeat_interval(Duration::from_millis(if heartbeats { 300 } else { 3_600_000 }))
            .poll_interval(Duration::from_millis(200))
            .shutdown_timeout(Duration::from_secs(5))
            .tx_handler("work", move |job: Job, tx| {
                let runs = runs.clone();
                Box::pin(async move {
                    let k = runs.fetch_add(1, Ordering::SeqCst);
                    tx.execute(INSERT, &[&job.id, &job.attempt]).await?;
                    let pause = if k % 50 == 7 { 1500 } else { 3 };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    Ok(Some(json!({ "attempt": job.attempt })))
                })
            })
            .build()
            .unwrap()
    };
    let workers = [make(true), make(false)];
    let stats: Vec<Arc<Stats>> = workers.iter().map(|w| w.stats().clone()).collect();
    let sd = Shutdown::new();
    let handles: Vec<_> = workers
        .into_iter()
        .map(|w| {
            let sd = sd.clone();
            tokio::spawn(async move { w.run(sd).await })
        })
        .collect();
    let completed = || async {
        c.query_one(
            "SELECT completed FROM pgque.job_queue_status WHERE queue_name = 'q'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
    };
    // The chaos starts once both workers run (a worker whose start-up queries
    // fail returns that error from run()).
    wait_until(30, "the workers running", || async { completed().await >= 50 }).await;
    let mut terminated = 0i64;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let done = completed().await;
        if done == n as i64 {
            break;
        }
        if std::time::Instant::now() > deadline {
            let left: Vec<String> = c
                .query(
                    "SELECT format('%s %s attempt %s run_at %s lease_until %s worker %s', id, state, attempt, \
                     run_at, lease_until, worker) FROM pgque.all_jobs WHERE queue = 'q' AND state <> 'completed'",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            panic!("only {done}/{n} completed; unfinished: {left:#?}");
        }
        let k: i64 = c
            .query_one(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM \
                 (SELECT pid FROM pg_stat_activity WHERE application_name = 'rs_chaos' \
                  ORDER BY random() LIMIT 1 + (random() < 0.5)::int) s",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        terminated += k;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    sd.trigger();
    for h in handles {
        h.await.unwrap().unwrap();
    }
    assert_eq!(states(&c, "q").await, vec![("completed".into(), n as i64)]);
    let fx = effects(&c).await;
    let mut got: Vec<i64> = fx.keys().copied().collect();
    got.sort();
    assert_eq!(got, ids, "every job has an effect row, and no other job");
    assert!(fx.values().all(|&v| v == 1), "a job has two effect rows");
    let mismatched: i64 = c
        .query_one(
            "SELECT count(*) FROM pgque.all_jobs j JOIN effects e ON e.job_id = j.id \
             WHERE j.queue = 'q' AND (j.output->>'attempt')::int IS DISTINCT FROM e.attempt",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(mismatched, 0, "an output names another attempt than its effect row");
    let lost: u64 = stats.iter().map(|s| s.lost.load(Ordering::SeqCst)).sum();
    let total_runs = runs.load(Ordering::SeqCst);
    println!(
        "chaos: {n} jobs, {total_runs} handler runs, {terminated} backends terminated, {lost} completions refused"
    );
    assert!(terminated > 0, "no backend was terminated: the test proved nothing");
    assert!(total_runs > n as u64, "no job ran twice: the test proved nothing");
}
