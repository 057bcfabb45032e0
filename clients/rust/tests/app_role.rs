//! The client as an application runs it: a role with only pgque_writer and
//! pgque_reader over TCP with a scram-sha-256 password (clients/run.sh makes
//! it and exports PGQUE_TEST_APP_*). The superuser makes the queues; the
//! producer, the job Worker and a Consumer run as the application alone.
mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pgque_client::*;
use serde_json::json;

/// The application role's DSN for database `db`.
fn app_dsn(db: &str) -> String {
    let var = |n: &str| std::env::var(n).unwrap_or_else(|_| panic!("{n} is not set: run through clients/run.sh"));
    format!(
        "host={} port={} dbname={db} user={} password={}",
        var("PGQUE_TEST_APP_HOST"),
        var("PGQUE_TEST_PORT"),
        var("PGQUE_TEST_APP_USER"),
        var("PGQUE_TEST_APP_PASSWORD")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn producer_worker_and_consumer_as_an_application_role_over_scram() {
    let (_, admin) = test_db("app_role").await;
    admin
        .batch_execute(
            "SELECT pgque.create_job_queue('jq'); SELECT pgque.create_queue('ev'); \
             SELECT pgque.subscribe('ev', 'app')",
        )
        .await
        .unwrap();
    let dsn = app_dsn("rs_app_role");
    let app = connect(&dsn).await;
    let (user, tcp, su): (String, Option<String>, bool) = app
        .query_one(
            "SELECT current_user::text, inet_server_addr()::text, rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();
    assert_eq!(
        (user.as_str(), tcp.as_deref(), su),
        ("pgque_app", Some("127.0.0.1/32"), false)
    );
    assert!(
        tokio_postgres::connect(&dsn.replace("password=", "password=x"), tokio_postgres::NoTls)
            .await
            .is_err(),
        "a wrong password is refused"
    );

    let jobs: Vec<NewJob> = (0..30).map(|i| NewJob::new("work", json!({ "i": i }))).collect();
    let ids: Vec<i64> = enqueue_many(&app, "jq", &jobs, None)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.job_id.unwrap())
        .collect();
    let sent = send_batch(
        &app,
        "ev",
        "t",
        &(0..20).map(|i| json!({ "i": i })).collect::<Vec<_>>(),
        None,
    )
    .await
    .unwrap();

    let seen: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
    let s = seen.clone();
    let w = Worker::builder(&dsn, ["jq"])
        .unwrap()
        .concurrency(4)
        .poll_interval(Duration::from_millis(200))
        .handler("work", move |job: Job| {
            let s = s.clone();
            async move {
                *s.lock().unwrap().entry(job.id).or_default() += 1;
                Ok(Some(json!({ "i": job.args["i"] })))
            }
        })
        .build()
        .unwrap();
    let got: Arc<Mutex<Vec<i64>>> = Arc::default();
    let g = got.clone();
    let consumer = Consumer::new(&dsn, "ev", "app", move |m: Message| {
        let g = g.clone();
        async move {
            g.lock().unwrap().push(m.msg_id);
            Ok(())
        }
    })
    .unwrap()
    .poll_interval(Duration::from_millis(200));
    let sd = Shutdown::new();
    let (sd1, sd2) = (sd.clone(), sd.clone());
    let wh = tokio::spawn(async move { w.run(sd1).await });
    let ch = tokio::spawn(async move { consumer.run(sd2).await });
    admin.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    wait_until(60, "every job and event", || async {
        states(&admin, "jq").await == vec![("completed".into(), 30)] && got.lock().unwrap().len() == 20
    })
    .await;
    sd.trigger();
    wh.await.unwrap().unwrap();
    ch.await.unwrap().unwrap();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), ids.len());
        assert!(seen.values().all(|n| *n == 1), "a job ran twice");
        assert_eq!(*got.lock().unwrap(), sent);
    }
    // administration is not the application's
    let e = app.execute("SELECT pgque.create_queue('nope')", &[]).await.unwrap_err();
    assert_eq!(e.code().map(|s| s.code()), Some("42501"));
}
