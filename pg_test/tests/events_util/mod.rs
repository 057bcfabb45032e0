//! Helpers shared by the events_* tests.
#![allow(dead_code)]
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;

use std::sync::Mutex;

pub mod gen;

/// CREATE EXTENSION in two databases at once can race on creating the
/// cluster-wide pgque_* roles (first install only); tests of one binary
/// create their databases one at a time.
static CREATE: Mutex<()> = Mutex::new(());

/// A fresh database with pgque and its worker running.
pub fn new_db(name: &str) -> TestDb {
    let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    TestDb::new(name)
}

/// A database with the worker switched off and gone: ticks and maintenance
/// happen only when a test asks.
pub fn manual_db(name: &str) -> TestDb {
    let db = new_db(name);
    stop_worker(&mut db.connect());
    db
}

/// A database on a private cluster (see `Cluster`), with its worker stopped
/// when `manual`. For tests that assert rotation or truncation makes progress:
/// a table is truncated only once every transaction that held an xid anywhere
/// in the cluster at its switch has ended (pg_current_snapshot's xmin), and on
/// the shared server the tests running alongside (CREATE DATABASE, transactions
/// held open on purpose) keep such transactions in flight nearly all the time,
/// by an amount no bound in the test can cover. Returns the cluster (stopped
/// on drop) and a connection to the database.
pub fn private_db(name: &str, manual: bool) -> (Cluster, Client) {
    let cl = Cluster::start_new(name, "");
    let mut c = cl.create_db(name);
    if manual {
        stop_worker(&mut c);
    }
    (cl, c)
}

/// receive(): (batch_id, msg ids in order).
pub fn recv(c: &mut Client, q: &str, consumer: &str, max: i32) -> (Option<i64>, Vec<i64>) {
    let rows = c
        .query(
            "SELECT msg_id, batch_id FROM pgque.receive($1, $2, $3)",
            &[&q, &consumer, &max],
        )
        .unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    let batch = rows.first().map(|r| r.get::<_, i64>(1));
    for r in &rows {
        assert_eq!(Some(r.get::<_, i64>(1)), batch, "one batch_id per receive");
    }
    (batch, ids)
}

pub fn ack(c: &mut Client, batch: i64) {
    let n: i32 = c
        .query_one("SELECT pgque.ack($1)", &[&batch])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

pub fn tick(c: &mut Client, q: &str) -> i64 {
    c.query_one("SELECT pgque.force_tick($1)", &[&q])
        .unwrap()
        .get(0)
}

/// Ticks, then receives and acks until a receive is empty; returns all ids.
pub fn drain(c: &mut Client, q: &str, consumer: &str, max: i32) -> Vec<i64> {
    tick(c, q);
    let mut all = vec![];
    loop {
        let (b, ids) = recv(c, q, consumer, max);
        match b {
            Some(b) => {
                all.extend(ids);
                ack(c, b);
            }
            None => return all,
        }
    }
}

pub fn send(c: &mut Client, q: &str, payload: &str) -> i64 {
    c.query_one("SELECT pgque.send($1, $2::text)", &[&q, &payload])
        .unwrap()
        .get(0)
}

pub fn send_many(c: &mut Client, q: &str, n: usize) -> Vec<i64> {
    let payloads: Vec<String> = (0..n).map(|i| format!("{{\"i\": {i}}}")).collect();
    c.query_one("SELECT pgque.send_batch($1, $2::text[])", &[&q, &payloads])
        .unwrap()
        .get(0)
}

pub fn i64s(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// The id of queue `q`.
pub fn queue_id(c: &mut Client, q: &str) -> i32 {
    c.query_one(
        "SELECT queue_id FROM pgque.queue WHERE queue_name = $1",
        &[&q],
    )
    .unwrap()
    .get(0)
}

/// Plans of the statements a session ran, nested ones too (auto_explain
/// with ANALYZE, sent to the client as log messages).
pub type Plans = std::sync::Arc<Mutex<Vec<String>>>;

/// A connection to `db` whose session hands the test the plan, with actual
/// row counts, of every statement it runs, including those inside pgque's
/// functions.
pub fn explained(db: &TestDb) -> (Client, Plans) {
    let plans: Plans = Default::default();
    let sink = plans.clone();
    let mut cfg: postgres::Config = conninfo(&db.name, "postgres").parse().unwrap();
    cfg.notice_callback(move |n| sink.lock().unwrap().push(n.message().to_string()));
    let mut c = cfg.connect(postgres::NoTls).unwrap();
    c.batch_execute(
        "LOAD 'auto_explain'; \
         SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on; \
         SET auto_explain.log_timing = off; SET auto_explain.log_nested_statements = on; \
         SET client_min_messages = log",
    )
    .unwrap();
    (c, plans)
}

/// Rows the plans read from the tables named `prefix` + a number (e.g.
/// " on event_7_" for queue 7's children, " on tick_p" for the tick
/// pieces): for every scan node on one of them (not on one of its indexes),
/// the rows it returned and the rows its filters removed, times its loops.
pub fn rows_read_from(plans: &[String], prefix: &str) -> i64 {
    let num_after = |line: &str, key: &str| -> Option<i64> {
        let i = line.find(key)? + key.len();
        let digits: String = line[i..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().ok()
    };
    let mut total = 0;
    for p in plans {
        let (mut scan, mut loops) = (false, 1);
        for line in p.lines() {
            if line.contains("(actual rows=") || line.contains("(never executed)") {
                scan = line.match_indices(prefix).any(|(i, _)| {
                    let rest = &line[i + prefix.len()..];
                    let d = rest.chars().take_while(|c| c.is_ascii_digit()).count();
                    d > 0 && rest[d..].starts_with(' ')
                });
                loops = num_after(line, " loops=").unwrap_or(0);
                if scan {
                    total += num_after(line, "(actual rows=").unwrap_or(0) * loops;
                }
            } else if scan {
                for key in [
                    "Rows Removed by Filter: ",
                    "Rows Removed by Index Recheck: ",
                ] {
                    if let Some(n) = num_after(line, key) {
                        total += n * loops;
                    }
                }
            }
        }
    }
    total
}
