//! Event queues: produce / consume, fan-out, capped batches, NOTIFY per tick,
//! plan cache across DROP / CREATE EXTENSION.
mod events_util;
use events_util::*;
use pgque_pg_test::postgres::fallible_iterator::FallibleIterator;
use pgque_pg_test::*;
use std::time::Duration;

#[test]
fn produce_consume_round_trip() {
    let db = manual_db("ev_roundtrip");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('orders'); SELECT pgque.subscribe('orders', 'c1')")
        .unwrap();
    let id1: i64 = c
        .query_one("SELECT pgque.send('orders', '{\"a\":1}'::jsonb)", &[])
        .unwrap()
        .get(0);
    let id2: i64 = c
        .query_one("SELECT pgque.send('orders', 'created', 'plain text')", &[])
        .unwrap()
        .get(0);
    assert!(id2 > id1);
    // Invisible before a tick.
    assert_eq!(recv(&mut c, "orders", "c1", 100), (None, vec![]));
    tick(&mut c, "orders");
    let rows = c
        .query(
            "SELECT msg_id, batch_id, type, payload, retry_count, created_at IS NOT NULL, \
                    extra1 IS NULL FROM pgque.receive('orders', 'c1')",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].get::<_, i64>(0), id1);
    assert_eq!(rows[0].get::<_, String>(2), "default");
    assert_eq!(rows[0].get::<_, String>(3), "{\"a\": 1}");
    assert_eq!(rows[0].get::<_, Option<i32>>(4), None);
    assert!(rows[0].get::<_, bool>(5));
    assert!(rows[0].get::<_, bool>(6));
    assert_eq!(rows[1].get::<_, i64>(0), id2);
    assert_eq!(rows[1].get::<_, String>(2), "created");
    assert_eq!(rows[1].get::<_, String>(3), "plain text");
    let batch: i64 = rows[0].get(1);
    // A second receive on the open batch returns the same batch.
    assert_eq!(
        recv(&mut c, "orders", "c1", 100),
        (Some(batch), vec![id1, id2])
    );
    // get_batch_info knows it.
    let r = c
        .query_one(
            "SELECT queue_name, consumer_name, tick_id > prev_tick_id FROM pgque.get_batch_info($1)",
            &[&batch],
        )
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "orders");
    assert_eq!(r.get::<_, String>(1), "c1");
    assert!(r.get::<_, bool>(2));
    ack(&mut c, batch);
    tick(&mut c, "orders");
    assert_eq!(recv(&mut c, "orders", "c1", 100), (None, vec![]));
    // A finished or unknown batch: ack returns 0 (PgQue's contract; its
    // clients count a repeated ack), and finishes nothing.
    let again: i32 = c
        .query_one("SELECT pgque.ack($1)", &[&batch])
        .unwrap()
        .get(0);
    assert_eq!(again, 0);
    let unknown: i32 = c
        .query_one("SELECT pgque.finish_batch(987654321)", &[])
        .unwrap()
        .get(0);
    assert_eq!(unknown, 0);
    // Info functions answer.
    let r = c
        .query_one(
            "SELECT queue_ntables, last_tick_id IS NOT NULL FROM pgque.get_queue_info('orders')",
            &[],
        )
        .unwrap();
    assert_eq!(r.get::<_, i32>(0), 3);
    assert!(r.get::<_, bool>(1));
    let r = c
        .query_one(
            "SELECT consumer_name, current_batch, pending_events FROM pgque.get_consumer_info('orders', 'c1')",
            &[],
        )
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "c1");
    assert_eq!(r.get::<_, Option<i64>>(1), None);
    assert_eq!(r.get::<_, Option<i64>>(2), Some(0));
}

#[test]
fn pgq_primitives_and_send_batch() {
    let db = manual_db("ev_primitives");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.register_consumer('q', 'c')")
        .unwrap();
    let ids: Vec<i64> = c
        .query_one(
            "SELECT pgque.send_batch('q', 't', ARRAY['a', 'b', 'c'])",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(ids.len(), 3);
    assert!(ids[0] < ids[1] && ids[1] < ids[2]);
    let empty: Vec<i64> = c
        .query_one("SELECT pgque.send_batch('q', ARRAY[]::text[])", &[])
        .unwrap()
        .get(0);
    assert!(empty.is_empty());
    let jids: Vec<i64> = c
        .query_one(
            "SELECT pgque.send_batch('q', ARRAY['{\"x\":1}', '[2]']::jsonb[])",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(jids.len(), 2);
    let e7: i64 = c
        .query_one(
            "SELECT pgque.insert_event('q', 'raw', 'data', 'e1', 'e2', 'e3', 'e4')",
            &[],
        )
        .unwrap()
        .get(0);
    tick(&mut c, "q");
    let batch: i64 = c
        .query_one("SELECT pgque.next_batch('q', 'c')", &[])
        .unwrap()
        .get(0);
    let rows = c
        .query(
            "SELECT ev_id, ev_type, ev_data, ev_extra1, ev_extra4 FROM pgque.get_batch_events($1)",
            &[&batch],
        )
        .unwrap();
    let got: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    let mut want = ids.clone();
    want.extend(&jids);
    want.push(e7);
    assert_eq!(got, want);
    assert_eq!(rows[3].get::<_, String>(2), "{\"x\": 1}");
    assert_eq!(rows[5].get::<_, String>(1), "raw");
    assert_eq!(rows[5].get::<_, String>(3), "e1");
    assert_eq!(rows[5].get::<_, String>(4), "e4");
    // next_batch on an open batch returns it again.
    let again: i64 = c
        .query_one("SELECT pgque.next_batch('q', 'c')", &[])
        .unwrap()
        .get(0);
    assert_eq!(again, batch);
    let n: i32 = c
        .query_one("SELECT pgque.finish_batch($1)", &[&batch])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // No new tick: no batch.
    let none: Option<i64> = c
        .query_one("SELECT pgque.next_batch('q', 'c')", &[])
        .unwrap()
        .get(0);
    assert_eq!(none, None);
    // next_batch_info after a tick.
    send(&mut c, "q", "later");
    tick(&mut c, "q");
    let r = c
        .query_one(
            "SELECT batch_id, cur_tick_id > prev_tick_id, cur_tick_event_seq - prev_tick_event_seq \
               FROM pgque.next_batch_info('q', 'c')",
            &[],
        )
        .unwrap();
    let b2: i64 = r.get(0);
    assert!(r.get::<_, bool>(1));
    assert_eq!(r.get::<_, i64>(2), 1);
    // get_batch_cursor: quick rows plus a cursor over the rest.
    c.batch_execute("BEGIN").unwrap();
    let quick = c
        .query(
            "SELECT ev_id FROM pgque.get_batch_cursor($1, 'cur', 0)",
            &[&b2],
        )
        .unwrap();
    assert!(quick.is_empty());
    let rest = c.query("FETCH ALL FROM cur", &[]).unwrap();
    assert_eq!(rest.len(), 1);
    c.batch_execute("COMMIT").unwrap();
    c.query_one("SELECT pgque.finish_batch($1)", &[&b2])
        .unwrap();
    // unregister
    let n: i32 = c
        .query_one("SELECT pgque.unregister_consumer('q', 'c')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // Again: not subscribed any more, 0 (PgQue's count of removed subscriptions).
    let n: i32 = c
        .query_one("SELECT pgque.unregister_consumer('q', 'c')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[test]
fn fan_out_three_consumers_each_get_every_event_once() {
    let db = manual_db("ev_fanout");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('f')").unwrap();
    for cn in ["a", "b", "c"] {
        let n: i32 = c
            .query_one("SELECT pgque.subscribe('f', $1)", &[&cn])
            .unwrap()
            .get(0);
        assert_eq!(n, 1);
    }
    let again: i32 = c
        .query_one("SELECT pgque.subscribe('f', 'a')", &[])
        .unwrap()
        .get(0);
    assert_eq!(again, 0);
    let mut sent = send_many(&mut c, "f", 120);
    for i in 0..30 {
        sent.push(send(&mut c, "f", &format!("single {i}")));
    }
    for cn in ["a", "b", "c"] {
        let got = drain(&mut c, "f", cn, 50);
        assert_eq!(got, sent, "consumer {cn}");
    }
}

#[test]
fn big_backlog_is_cut_into_capped_batches() {
    let db = manual_db("ev_batchcap");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('big'); SELECT pgque.subscribe('big', 'c')")
        .unwrap();
    let sent = send_many(&mut c, "big", 250);
    tick(&mut c, "big");
    let (b1, ids1) = recv(&mut c, "big", "c", 100);
    assert_eq!(ids1.len(), 100);
    // A second receive with a smaller max_return still delivers the whole open
    // batch, so the ack after it cannot drop undelivered rows.
    let (b1b, ids1b) = recv(&mut c, "big", "c", 10);
    assert_eq!((b1b, &ids1b), (b1, &ids1));
    ack(&mut c, b1.unwrap());
    let (b2, ids2) = recv(&mut c, "big", "c", 100);
    assert_eq!(ids2.len(), 100);
    ack(&mut c, b2.unwrap());
    let (b3, ids3) = recv(&mut c, "big", "c", 100);
    assert_eq!(ids3.len(), 50);
    ack(&mut c, b3.unwrap());
    assert_eq!(recv(&mut c, "big", "c", 100), (None, vec![]));
    let mut all = ids1;
    all.extend(ids2);
    all.extend(ids3);
    assert_eq!(all, sent);
    // next_batch caps by pgque.batch_max_events.
    let sent = send_many(&mut c, "big", 30);
    tick(&mut c, "big");
    c.batch_execute("SET pgque.batch_max_events = 20").unwrap();
    let b: i64 = c
        .query_one("SELECT pgque.next_batch('big', 'c')", &[])
        .unwrap()
        .get(0);
    let n = c
        .query("SELECT 1 FROM pgque.get_batch_events($1)", &[&b])
        .unwrap()
        .len();
    assert_eq!(n, 20);
    c.query_one("SELECT pgque.finish_batch($1)", &[&b]).unwrap();
    let rest = drain(&mut c, "big", "c", 100);
    assert_eq!(rest, sent[20..].to_vec());
}

#[test]
fn each_tick_notifies_its_queue_channel() {
    let db = manual_db("ev_notify");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('nq')").unwrap();
    let mut l = db.connect();
    l.batch_execute("LISTEN pgque_nq").unwrap();
    let t = tick(&mut c, "nq");
    let mut got = None;
    let mut notes = l.notifications();
    let mut it = notes.timeout_iter(Duration::from_secs(5));
    if let Some(n) = it.next().unwrap() {
        got = Some((n.channel().to_string(), n.payload().to_string()));
    }
    assert_eq!(got, Some(("pgque_nq".to_string(), t.to_string())));
}

#[test]
fn cached_plans_survive_drop_and_create_extension() {
    let db = manual_db("ev_replan");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('p'); SELECT pgque.subscribe('p', 'c')")
        .unwrap();
    let a = send(&mut c, "p", "one");
    assert_eq!(drain(&mut c, "p", "c", 10), vec![a]);
    c.batch_execute(
        "DROP EXTENSION pgque CASCADE; CREATE EXTENSION pgque; SELECT pgque.stop(); \
         SELECT pgque.create_queue('p'); SELECT pgque.subscribe('p', 'c')",
    )
    .unwrap();
    let b = send(&mut c, "p", "two");
    assert_eq!(drain(&mut c, "p", "c", 10), vec![b]);
}

#[test]
fn worker_ticks_a_sent_event_promptly_and_leaves_idle_queues_alone() {
    // On a private cluster: the follow-up tick waits for every transaction
    // in the cluster that was running at the event's tick, and on the shared
    // server other tests' (CREATE DATABASE among them) can postpone it past
    // the settling window below.
    let (_cl, mut c) = private_db("ev_worker_tick", false);
    c.batch_execute("SELECT pgque.create_queue('w'); SELECT pgque.subscribe('w', 'c')")
        .unwrap();
    let id = send(&mut c, "w", "hello");
    let mut got = vec![];
    let ok = wait_until(Duration::from_secs(5), || {
        let (b, ids) = recv(&mut c, "w", "c", 10);
        if let Some(b) = b {
            got.extend(ids);
            ack(&mut c, b);
        }
        got == vec![id]
    });
    assert!(ok, "the worker did not tick the event in 5 s: {got:?}");
    // Quiet queue: once settled, no ticks for a while (idle period 1 min).
    // The one follow-up tick after a send comes when the transactions that
    // were running at the event's tick have ended; ticker_max_lag is raised
    // so it cannot come earlier.
    c.batch_execute("SELECT pgque.set_queue_config('w', 'ticker_max_lag', '1 hour')")
        .unwrap();
    let last = |c: &mut pgque_pg_test::postgres::Client| {
        i64s(c, "SELECT last_tick_id FROM pgque.get_queue_info('w')")
    };
    let mut prev = last(&mut c);
    let settled = wait_until(Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(500));
        let now = last(&mut c);
        let same = now == prev;
        prev = now;
        same
    });
    assert!(settled, "the queue kept being ticked");
    let t1 = last(&mut c);
    std::thread::sleep(Duration::from_millis(1500));
    let t2 = last(&mut c);
    assert_eq!(t1, t2, "an idle queue was ticked");
    c.batch_execute("SELECT pgque.stop()").unwrap();
}

#[test]
fn ticker_and_maint_skip_a_queue_locked_by_an_open_transaction() {
    let db = manual_db("ev_nowait");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('a'); SELECT pgque.create_queue('b'); \
         SELECT pgque.set_queue_config('a', 'rotation_period', '0'); \
         SELECT pgque.set_queue_config('b', 'rotation_period', '0')",
    )
    .unwrap();
    // A transaction that ticked 'a' by hand and stays open holds a's row.
    let mut holder = db.connect();
    holder
        .batch_execute("BEGIN; SELECT pgque.force_tick('a')")
        .unwrap();
    c.batch_execute("SET statement_timeout = '5s'").unwrap();
    send(&mut c, "a", "x");
    send(&mut c, "b", "y");
    let n: i64 = c.query_one("SELECT pgque.ticker()", &[]).unwrap().get(0);
    assert_eq!(n, 1, "b is ticked, a is skipped without waiting");
    let b_table = |c: &mut pgque_pg_test::postgres::Client, q: &str| -> i32 {
        c.query_one(
            "SELECT queue_cur_table FROM pgque.get_queue_info($1)",
            &[&q],
        )
        .unwrap()
        .get(0)
    };
    let (a0, b0) = (b_table(&mut c, "a"), b_table(&mut c, "b"));
    c.query_one("SELECT pgque.maint()", &[]).unwrap();
    assert_eq!(b_table(&mut c, "a"), a0, "a's rotation waits for its row");
    assert_ne!(b_table(&mut c, "b"), b0, "b rotates");
    holder.batch_execute("COMMIT").unwrap();
    let n: i64 = c.query_one("SELECT pgque.ticker()", &[]).unwrap().get(0);
    assert!(n >= 1, "a is ticked once free");
}

/// Payloads stored out of line (TOASTed: one incompressible of ~300 kB, one
/// compressible of 50 kB) come back byte for byte through receive,
/// get_batch_events, a nack's retry and the dead letters: the read path hands
/// the stored text values over as datums, fetched from TOAST first.
#[test]
fn toasted_payloads_round_trip() {
    let db = manual_db("ev_toast");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('big'); SELECT pgque.subscribe('big', 'c1'); \
         SELECT pgque.set_queue_config('big', 'max_retries', '0')",
    )
    .unwrap();
    let payloads: Vec<String> = c
        .query(
            "SELECT p FROM (VALUES \
               (1, (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 10000) i)), \
               (2, repeat('abc', 17000)), \
               (3, 'small')) v(n, p) ORDER BY n",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(payloads[0].len(), 320_000);
    for p in &payloads {
        c.execute("SELECT pgque.send('big', 'big', $1::text)", &[p])
            .unwrap();
    }
    tick(&mut c, "big");
    let rows = c
        .query(
            "SELECT msg_id, batch_id, payload FROM pgque.receive('big', 'c1', 10)",
            &[],
        )
        .unwrap();
    let got: Vec<String> = rows.iter().map(|r| r.get(2)).collect();
    assert_eq!(got, payloads, "receive returns the stored payloads");
    let batch: i64 = rows[0].get(1);
    let via_pgq: Vec<String> = c
        .query("SELECT ev_data FROM pgque.get_batch_events($1)", &[&batch])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(via_pgq, payloads, "get_batch_events returns them too");
    // The first goes to the dead letters (max_retries 0), whole.
    let first: i64 = rows[0].get(0);
    c.execute(
        "SELECT pgque.nack($1, m, interval '0', 'too big') \
           FROM pgque.receive('big', 'c1', 10) m WHERE m.msg_id = $2",
        &[&batch, &first],
    )
    .unwrap();
    ack(&mut c, batch);
    let dead: String = c
        .query_one(
            "SELECT ev_data FROM pgque.dead_letter WHERE ev_id = $1",
            &[&first],
        )
        .unwrap()
        .get(0);
    assert_eq!(dead, payloads[0], "the dead letter keeps the whole payload");
}
