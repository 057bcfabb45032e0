//! Consumer on the waiting receive (docs/waits.md) against a real server: it
//! waits inside the server (an Extension wait event, no LISTEN), gets an
//! event sent by another connection quickly, returns promptly when shut down
//! while waiting, and LISTENs and polls with `wait(Duration::ZERO)` and on a
//! server without the waits (a 0.8.0 schema).
mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use pgque_client::*;
use serde_json::json;
use tokio::task::JoinHandle;

/// (state, wait_event_type, query) of the backends named `app`.
async fn backends(c: &tokio_postgres::Client, app: &str) -> Vec<(String, Option<String>, String)> {
    c.query(
        "SELECT coalesce(state, ''), wait_event_type, query FROM pg_stat_activity WHERE application_name = $1",
        &[&app],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

async fn waiting_in_server(c: &tokio_postgres::Client, app: &str) -> bool {
    backends(c, app)
        .await
        .iter()
        .any(|(st, wt, _)| st == "active" && wt.as_deref() == Some("Extension"))
}

async fn listening(c: &tokio_postgres::Client, app: &str) -> bool {
    backends(c, app).await.iter().any(|(_, _, q)| q.starts_with("LISTEN"))
}

type Seen = Arc<Mutex<Vec<(i64, Instant)>>>;

fn consumer(dsn: &str, queue: &str, seen: &Seen) -> Consumer {
    let s = seen.clone();
    Consumer::new(dsn, queue, "c1", move |m: Message| {
        let s = s.clone();
        async move {
            s.lock().unwrap().push((m.msg_id, Instant::now()));
            Ok(())
        }
    })
    .unwrap()
}

fn start(c: Consumer) -> (Arc<Consumer>, Shutdown, JoinHandle<Result<()>>) {
    let c = Arc::new(c);
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let (c, sd) = (c.clone(), sd.clone());
        async move { c.run(sd).await }
    });
    (c, sd, h)
}

fn seen_len(seen: &Seen) -> usize {
    seen.lock().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_waits_in_the_server_and_gets_an_event_quickly() {
    let (dsn, c) = test_db("wait_quick").await;
    c.batch_execute("SELECT pgque.create_queue('ev')").await.unwrap();
    let app = "rs_wait_quick";
    let seen: Seen = Arc::default();
    let (cons, sd, h) = start(consumer(&format!("{dsn} application_name={app}"), "ev", &seen));
    wait_until(10, "the consumer waiting in the server", || waiting_in_server(&c, app)).await;
    assert!(cons.server_waits());
    assert!(!listening(&c, app).await, "{:?}", backends(&c, app).await);
    let mut lat = Vec::new();
    for i in 0..3 {
        let t0 = Instant::now();
        send(&c, "ev", "t", &json!({ "i": i }), None).await.unwrap();
        wait_until(10, "the event handled", || {
            let n = seen_len(&seen);
            async move { n > i }
        })
        .await;
        lat.push(seen.lock().unwrap()[i].1 - t0);
        wait_until(10, "waiting again", || waiting_in_server(&c, app)).await;
    }
    println!("waiting receive latency (commit -> handler): {lat:?}");
    assert!(lat.iter().all(|l| *l < Duration::from_secs(1)), "{lat:?}");
    sd.trigger();
    h.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_waiting_cancels_the_wait() {
    let (dsn, c) = test_db("wait_stop").await;
    c.batch_execute("SELECT pgque.create_queue('ev')").await.unwrap();
    let app = "rs_wait_stop";
    let seen: Seen = Arc::default();
    let cons = consumer(&format!("{dsn} application_name={app}"), "ev", &seen).wait(Duration::from_secs(9));
    let (_cons, sd, h) = start(cons);
    wait_until(10, "the consumer waiting in the server", || waiting_in_server(&c, app)).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // well inside the 9 s wait
    let t0 = Instant::now();
    sd.trigger();
    tokio::time::timeout(Duration::from_secs(10), h)
        .await
        .expect("run did not return")
        .unwrap()
        .unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "shutdown took {took:?}");
    wait_until(5, "the consumer's backend gone", || async {
        backends(&c, app).await.is_empty()
    })
    .await;
    // The consumer still reads after the cancelled wait.
    let (_cons, sd, h) = start(consumer(&dsn, "ev", &seen));
    wait_until(10, "subscribed and waiting", || async {
        c.query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Extension'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
            == 1
    })
    .await;
    let id = send(&c, "ev", "t", &json!({}), None).await.unwrap();
    wait_until(10, "the event handled", || {
        let n = seen_len(&seen);
        async move { n == 1 }
    })
    .await;
    assert_eq!(seen.lock().unwrap()[0].0, id);
    sd.trigger();
    h.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_zero_listens_and_polls() {
    let (dsn, c) = test_db("wait_zero").await;
    c.batch_execute("SELECT pgque.create_queue('ev')").await.unwrap();
    let app = "rs_wait_zero";
    let seen: Seen = Arc::default();
    let cons = consumer(&format!("{dsn} application_name={app}"), "ev", &seen)
        .wait(Duration::ZERO)
        .poll_interval(Duration::from_secs(60));
    let (cons, sd, h) = start(cons);
    wait_until(10, "the consumer's LISTEN", || listening(&c, app)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!cons.server_waits());
    assert!(!waiting_in_server(&c, app).await);
    send(&c, "ev", "t", &json!({}), None).await.unwrap();
    // a 60 s poll: only the tick's NOTIFY wakes it in time
    wait_until(10, "the event handled", || {
        let n = seen_len(&seen);
        async move { n == 1 }
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_waits_gets_listen_and_poll() {
    let db = "rs_wait_080";
    let admin = connect(&format!("{} dbname=postgres", base())).await;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await
        .unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {db}")).await.unwrap();
    let dsn = format!("{} dbname={db}", base());
    let c = connect(&dsn).await;
    c.batch_execute("CREATE EXTENSION pgque VERSION '0.8.0'; SELECT pgque.create_queue('ev')")
        .await
        .unwrap();
    assert!(!Features::read(&c).await.unwrap().receive_wait);
    let app = "rs_wait_080";
    let seen: Seen = Arc::default();
    let cons = consumer(&format!("{dsn} application_name={app}"), "ev", &seen).poll_interval(Duration::from_secs(60));
    let (cons, sd, h) = start(cons);
    wait_until(10, "the consumer's LISTEN", || listening(&c, app)).await;
    assert!(!cons.server_waits());
    send(&c, "ev", "t", &json!({}), None).await.unwrap();
    wait_until(10, "the event handled", || {
        let n = seen_len(&seen);
        async move { n == 1 }
    })
    .await;
    assert!(!waiting_in_server(&c, app).await);
    sd.trigger();
    h.await.unwrap().unwrap();
}

/// statement_timeout = 1 s: the waits are 0.5 s, none is cancelled by the
/// timeout (which would end `run` with an error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_is_capped_under_statement_timeout() {
    let (dsn, c) = test_db("wait_stmt").await;
    c.batch_execute("SELECT pgque.create_queue('ev')").await.unwrap();
    let app = "rs_wait_stmt";
    let seen: Seen = Arc::default();
    let dsn = format!("{dsn} application_name={app} options='-c statement_timeout=1000'");
    let (cons, sd, h) = start(consumer(&dsn, "ev", &seen));
    wait_until(10, "the consumer waiting in the server", || waiting_in_server(&c, app)).await;
    // five waits' ends; two timeouts had the wait not been capped
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!h.is_finished(), "run ended: {:?}", h.await);
    let id = send(&c, "ev", "t", &json!({}), None).await.unwrap();
    wait_until(10, "the event handled", || {
        let n = seen_len(&seen);
        async move { n == 1 }
    })
    .await;
    assert_eq!(seen.lock().unwrap()[0].0, id);
    assert!(cons.server_waits());
    sd.trigger();
    h.await.unwrap().unwrap();
}
