//! Helpers shared by the slots_* tests (partition keys, slots, leases).
#![allow(dead_code)]
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::Mutex;

static CREATE: Mutex<()> = Mutex::new(());

/// A fresh database with pgque (worker running: ticks and maint happen).
pub fn new_db(name: &str) -> TestDb {
    let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    TestDb::new(name)
}

/// A database whose worker is stopped: ticks only when the test asks.
pub fn manual_db(name: &str) -> TestDb {
    let db = new_db(name);
    let mut c = db.connect();
    stop_worker(&mut c);
    db
}

/// One delivered message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub id: i64,
    pub batch: i64,
    pub key: Option<String>,
    pub payload: Option<String>,
    pub retry: Option<i32>,
}

/// receive_partitioned: the messages (possibly none).
pub fn recv_slot(
    c: &mut Client,
    q: &str,
    consumer: &str,
    slot: i32,
    n: i32,
    worker: &str,
    max: i32,
) -> Result<Vec<Msg>, postgres::Error> {
    let rows = c.query(
        "SELECT msg_id, batch_id, extra1, payload, retry_count \
           FROM pgque.receive_partitioned($1, $2, $3, $4, $5, $6)",
        &[&q, &consumer, &slot, &n, &worker, &max],
    )?;
    Ok(rows
        .iter()
        .map(|r| Msg {
            id: r.get(0),
            batch: r.get(1),
            key: r.get(2),
            payload: r.get(3),
            retry: r.get(4),
        })
        .collect())
}

pub fn ack_slot(
    c: &mut Client,
    q: &str,
    consumer: &str,
    slot: i32,
    n: i32,
    worker: &str,
) -> Result<i32, postgres::Error> {
    c.query_one(
        "SELECT pgque.ack_partitioned($1, $2, $3, $4, $5)",
        &[&q, &consumer, &slot, &n, &worker],
    )
    .map(|r| r.get(0))
}

pub fn claim(
    c: &mut Client,
    q: &str,
    consumer: &str,
    slot: i32,
    worker: &str,
    ttl: &str,
) -> Option<i64> {
    c.query_one(
        "SELECT pgque.claim_slot($1, $2, $3, $4, $5::text::interval)",
        &[&q, &consumer, &slot, &worker, &ttl],
    )
    .unwrap()
    .get(0)
}

/// The slot of a key for n slots, as the server computes it.
pub fn slot_of(c: &mut Client, key: &str, n: i32) -> i32 {
    c.query_one("SELECT pgque.partition_slot($1, $2)", &[&key, &n])
        .unwrap()
        .get(0)
}

pub fn tick(c: &mut Client, q: &str) -> i64 {
    c.query_one("SELECT pgque.force_tick($1)", &[&q])
        .unwrap()
        .get(0)
}

pub fn i64s(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// Everything a fenced call could change, to compare before and after.
pub fn fingerprint(c: &mut Client) -> String {
    c.query_one(
        "SELECT concat_ws('|', \
           (SELECT string_agg(concat_ws(',', ps_slot, ps_owner, ps_epoch, ps_sub, ps_until), ';' ORDER BY ps_slot) FROM pgque.partition_slot), \
           (SELECT string_agg(batch_id::text, ',' ORDER BY batch_id) FROM pgque.batch), \
           (SELECT string_agg(batch_id::text, ',' ORDER BY batch_id) FROM pgque.batch_done), \
           (SELECT count(*) FROM pgque.retry_queue))",
        &[],
    )
    .unwrap()
    .get(0)
}
