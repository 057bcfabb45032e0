//! Event queues: rotation with a lagging consumer, rotation in manual mode and
//! with the worker, zero dead tuples for 100k events, bounded metadata.
mod events_util;
use events_util::*;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::collections::HashSet;
use std::time::Duration;

fn cur_table(c: &mut Client, q: &str) -> i32 {
    c.query_one(
        "SELECT queue_cur_table FROM pgque.get_queue_info($1)",
        &[&q],
    )
    .unwrap()
    .get(0)
}

#[test]
fn lagging_consumer_blocks_truncation_and_rotation_repeats_in_manual_mode() {
    let db = manual_db("ev_rotation");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('rot'); SELECT pgque.subscribe('rot', 'fast'); \
         SELECT pgque.subscribe('rot', 'slow'); SELECT pgque.set_queue_config('rot', 'rotation_period', '0')",
    )
    .unwrap();
    let mut sent = vec![];
    let mut fast = vec![];
    let mut tables = vec![cur_table(&mut c, "rot")];
    for round in 0..12 {
        sent.extend(send_many(&mut c, "rot", 10));
        fast.extend(drain(&mut c, "rot", "fast", 100));
        c.query_one("SELECT pgque.maint()", &[]).unwrap();
        c.query_one("SELECT pgque.maint()", &[]).unwrap();
        tables.push(cur_table(&mut c, "rot"));
        let _ = round;
    }
    assert_eq!(fast, sent);
    // 'slow' never read: the queue may switch tables at most until it would
    // have to truncate a table 'slow' still needs, so at most K-1 switches.
    let switches = tables.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(switches <= 2, "rotated past a lagging consumer: {tables:?}");
    // Nothing was lost for the lagging consumer.
    let slow = drain(&mut c, "rot", "slow", 1000);
    assert_eq!(slow, sent);
    // Now both keep up: rotation goes through every table, repeatedly. (A
    // transaction of a test running in parallel holds back snapshot xmin and
    // may delay a switch by a round; hence "until", with a generous bound.)
    let mut tables = vec![cur_table(&mut c, "rot")];
    let mut sent2 = vec![];
    let (mut f2, mut s2) = (vec![], vec![]);
    let mut switches = 0;
    for _ in 0..80 {
        sent2.extend(send_many(&mut c, "rot", 5));
        f2.extend(drain(&mut c, "rot", "fast", 100));
        s2.extend(drain(&mut c, "rot", "slow", 100));
        c.query_one("SELECT pgque.maint()", &[]).unwrap();
        c.query_one("SELECT pgque.maint()", &[]).unwrap();
        tables.push(cur_table(&mut c, "rot"));
        switches = tables.windows(2).filter(|w| w[0] != w[1]).count();
        if switches >= 7 {
            break;
        }
    }
    assert_eq!(f2, sent2);
    assert_eq!(s2, sent2);
    assert!(switches >= 7, "rotation stalled in manual mode: {tables:?}");
    let distinct: HashSet<i32> = tables.iter().copied().collect();
    assert_eq!(distinct.len(), 3);
}

#[test]
fn rotation_keeps_going_with_the_worker() {
    let db = new_db("ev_rotation_worker");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('rw'); SELECT pgque.subscribe('rw', 'c'); \
         SELECT pgque.set_queue_config('rw', 'rotation_period', '0')",
    )
    .unwrap();
    let start = cur_table(&mut c, "rw");
    let mut seen = vec![start];
    let mut sent = vec![];
    let mut got = vec![];
    let ok = wait_until(Duration::from_secs(60), || {
        sent.push(send(&mut c, "rw", "x"));
        let (b, ids) = recv(&mut c, "rw", "c", 1000);
        if let Some(b) = b {
            got.extend(ids);
            ack(&mut c, b);
        }
        let t = cur_table(&mut c, "rw");
        if *seen.last().unwrap() != t {
            seen.push(t);
        }
        std::thread::sleep(Duration::from_millis(50));
        seen.len() >= 7
    });
    assert!(ok, "the worker rotated only through {seen:?}");
    // Everything sent so far arrives.
    let ok = wait_until(Duration::from_secs(10), || {
        let (b, ids) = recv(&mut c, "rw", "c", 1000);
        if let Some(b) = b {
            got.extend(ids);
            ack(&mut c, b);
        }
        got.len() >= sent.len()
    });
    assert!(ok);
    assert_eq!(got, sent);
}

fn dead(c: &mut Client, rels: &str) -> i64 {
    c.query_one(
        &format!(
            "SELECT coalesce(sum(n_dead_tup), 0)::int8 FROM pg_stat_user_tables \
              WHERE schemaname = 'pgque' AND relname ~ '{rels}'"
        ),
        &[],
    )
    .unwrap()
    .get(0)
}

#[test]
fn hundred_thousand_events_leave_no_dead_tuples() {
    let db = manual_db("ev_deadtup");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('d'); SELECT pgque.subscribe('d', 'c'); \
         SET pgque.metadata_rotation_period = 0",
    )
    .unwrap();
    // A session holding an old snapshot (xmin) during the whole run.
    let mut holder = db.connect();
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class")
        .unwrap();
    let mut received = 0usize;
    for round in 0..100 {
        send_many(&mut c, "d", 1000);
        tick(&mut c, "d");
        loop {
            let (b, ids) = recv(&mut c, "d", "c", 500);
            match b {
                Some(b) => {
                    received += ids.len();
                    ack(&mut c, b);
                }
                None => break,
            }
        }
        if round % 10 == 9 {
            c.query_one("SELECT pgque.maint()", &[]).unwrap();
        }
    }
    assert_eq!(received, 100_000);
    flush_stats(&mut c);
    let ev_dead = dead(&mut c, "^event_");
    let meta_dead = dead(
        &mut c,
        "^(tick|batch|batch_done)_p|^subscription$|^queue$|^meta_state$",
    );
    holder.batch_execute("COMMIT").unwrap();
    assert_eq!(ev_dead, 0, "dead tuples in event tables");
    // Metadata dead tuples come only from rotation bookkeeping (one meta_state
    // update per switch and per truncation): 20 here, whatever the number of
    // events or batches.
    assert!(meta_dead <= 40, "metadata dead tuples: {meta_dead}");
}
