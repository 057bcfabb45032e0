//! Test helpers: a real PostgreSQL started by clients/run.sh (which sets
//! PGQUE_TEST_HOST / PGQUE_TEST_PORT); each test gets a database of its own
//! with the extension.
#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};

pub fn base() -> String {
    let host = std::env::var("PGQUE_TEST_HOST").expect("PGQUE_TEST_HOST is not set: run through clients/run.sh");
    let port = std::env::var("PGQUE_TEST_PORT").expect("PGQUE_TEST_PORT is not set");
    format!("host={host} port={port} user=postgres")
}

pub async fn connect(dsn: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(dsn, NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
}

/// A fresh database named after the test, with pgque; returns its dsn and a client.
pub async fn test_db(name: &str) -> (String, Client) {
    let db = format!("rs_{name}");
    let admin = connect(&format!("{} dbname=postgres", base())).await;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await
        .unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {db}")).await.unwrap();
    let dsn = format!("{} dbname={db}", base());
    let c = connect(&dsn).await;
    c.batch_execute("CREATE EXTENSION pgque").await.unwrap();
    (dsn, c)
}

/// Polls `f` until it returns true, or panics after `secs`.
pub async fn wait_until<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Jobs of a queue by state.
pub async fn states(c: &Client, queue: &str) -> Vec<(String, i64)> {
    c.query(
        "SELECT state, count(*) FROM pgque.all_jobs WHERE queue = $1 GROUP BY state ORDER BY state",
        &[&queue],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}
