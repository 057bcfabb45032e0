//! Partition keys with real sessions: per-key order across N slots
//! consumed concurrently, and events sent while the consumer subscribes.
mod slots_util;
use pgque_pg_test::*;
use slots_util::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const N: i32 = 8;
const KEYS: usize = 60;
const PER_KEY: usize = 25;

#[test]
fn slots_per_key_order_with_n_slots_consumed_by_concurrent_sessions() {
    let db = new_db("slots_order");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('po'); \
         SELECT pgque.subscribe_partitioned('po', 'c', 8);",
    )
    .unwrap();
    let total = KEYS * PER_KEY;
    let first_seen = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let log: Arc<Mutex<Vec<(i32, Msg)>>> = Arc::new(Mutex::new(vec![]));
    // Which slot nacks (once) the first event it sees.
    let nack_slot = {
        let k0 = "key-0".to_string();
        slot_of(&mut c, &k0, N)
    };

    let mut consumers = vec![];
    for slot in 0..N {
        let (name, first_seen, done, log) = (
            db.name.clone(),
            first_seen.clone(),
            done.clone(),
            log.clone(),
        );
        consumers.push(std::thread::spawn(move || {
            let mut s = connect_to(&name);
            let worker = format!("w{slot}");
            assert_eq!(claim(&mut s, "po", "c", slot, &worker, "5 minutes"), Some(1));
            let mut nacked = false;
            while !done.load(Ordering::SeqCst) {
                let msgs = recv_slot(&mut s, "po", "c", slot, N, &worker, 37).unwrap();
                if msgs.is_empty() {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                for m in &msgs {
                    if m.retry.is_none() {
                        first_seen.fetch_add(1, Ordering::SeqCst);
                    }
                }
                if slot == nack_slot && !nacked {
                    // Redeliver the first event of key-0 this slot got.
                    if let Some(m) = msgs.iter().find(|m| m.key.as_deref() == Some("key-0")) {
                        let n: i32 = s
                            .query_one(
                                "SELECT pgque.nack_partitioned('po', 'c', $1, $2, $3, m, '0 seconds', 'test') \
                                   FROM pgque.receive_partitioned('po', 'c', $1, $2, $3, 1000) m \
                                  WHERE m.msg_id = $4",
                                &[&slot, &N, &worker, &m.id],
                            )
                            .unwrap()
                            .get(0);
                        assert_eq!(n, 1);
                        nacked = true;
                    }
                }
                log.lock().unwrap().extend(msgs.into_iter().map(|m| (slot, m)));
                assert_eq!(ack_slot(&mut s, "po", "c", slot, N, &worker).unwrap(), 1);
            }
        }));
    }

    // Producers: keys interleaved, several transactions, two sessions at once,
    // each key's events sent by one producer in order (seq in the payload).
    let mut producers = vec![];
    for p in 0..2usize {
        let name = db.name.clone();
        producers.push(std::thread::spawn(move || {
            let mut s = connect_to(&name);
            for round in 0..PER_KEY {
                let (mut payloads, mut keys) = (vec![], vec![]);
                for k in (p..KEYS).step_by(2) {
                    payloads.push(format!("{round}"));
                    keys.push(format!("key-{k}"));
                }
                if round % 2 == 0 {
                    s.query_one(
                        "SELECT pgque.send_batch('po', 'ev', $1::text[], $2::text[])",
                        &[&payloads, &keys],
                    )
                    .unwrap();
                } else {
                    let mut t = s.transaction().unwrap();
                    for (p, k) in payloads.iter().zip(&keys) {
                        t.query_one("SELECT pgque.send('po', 'ev', $1::text, $2)", &[p, k])
                            .unwrap();
                    }
                    t.commit().unwrap();
                }
            }
        }));
    }
    for p in producers {
        p.join().unwrap();
    }
    // Until every event arrived once and the nacked one came back.
    let deadline = Instant::now() + Duration::from_secs(60);
    let redelivered = || log.lock().unwrap().iter().any(|(_, m)| m.retry == Some(1));
    while (first_seen.load(Ordering::SeqCst) < total || !redelivered()) && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // A little longer: nothing more may come.
    std::thread::sleep(Duration::from_millis(500));
    done.store(true, Ordering::SeqCst);
    for t in consumers {
        t.join().unwrap();
    }

    let log = log.lock().unwrap();
    let firsts: Vec<&(i32, Msg)> = log.iter().filter(|(_, m)| m.retry.is_none()).collect();
    assert_eq!(
        firsts.len(),
        total,
        "every event exactly once (first deliveries)"
    );
    let ids: HashSet<i64> = firsts.iter().map(|(_, m)| m.id).collect();
    assert_eq!(ids.len(), total, "no event twice");
    // Each key: one slot, the right one; its events in send order.
    let mut by_key: HashMap<String, Vec<(i32, i64, usize)>> = HashMap::new();
    for (slot, m) in &firsts {
        let seq: usize = m.payload.as_deref().unwrap().parse().unwrap();
        by_key
            .entry(m.key.clone().unwrap())
            .or_default()
            .push((*slot, m.id, seq));
    }
    assert_eq!(by_key.len(), KEYS);
    let mut slots_used = HashSet::new();
    for (key, evs) in &by_key {
        let want = slot_of(&mut c, key, N);
        assert!(
            evs.iter().all(|(s, _, _)| *s == want),
            "{key} on one slot, {want}"
        );
        slots_used.insert(want);
        let seqs: Vec<usize> = evs.iter().map(|e| e.2).collect();
        assert_eq!(
            seqs,
            (0..PER_KEY).collect::<Vec<_>>(),
            "{key} in send order"
        );
        // Delivery order within the slot log is event-id order.
        assert!(evs.windows(2).all(|w| w[0].1 < w[1].1));
    }
    assert!(slots_used.len() > 1, "keys spread over several slots");
    // The nacked event came back once, on the same slot, with retry_count 1.
    let again: Vec<&(i32, Msg)> = log.iter().filter(|(_, m)| m.retry.is_some()).collect();
    assert_eq!(again.len(), 1, "one redelivery: {again:?}");
    let (slot, m) = again[0];
    assert_eq!(m.retry, Some(1));
    assert_eq!(*slot, nack_slot);
    assert_eq!(m.key.as_deref(), Some("key-0"));
    assert!(ids.contains(&m.id));
    // Nothing pending on any slot.
    wait_until(Duration::from_secs(5), || {
        i64s(
            &mut c,
            "SELECT coalesce(sum(pending_events), 0)::int8 FROM pgque.partition_slot_status",
        ) == 0
    });
    assert_eq!(
        i64s(
            &mut c,
            "SELECT coalesce(sum(pending_events), 0)::int8 FROM pgque.partition_slot_status"
        ),
        0
    );
}

#[test]
fn slots_events_sent_during_subscribe_partitioned_land_on_exactly_one_slot() {
    let db = manual_db("slots_setup");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('ps')").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut senders = vec![];
    for p in 0..3 {
        let (name, stop) = (db.name.clone(), stop.clone());
        senders.push(std::thread::spawn(move || {
            let mut s = connect_to(&name);
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) || i < 200 {
                let key = format!("k{}", (i * 7 + p) % 50);
                s.query_one(
                    "SELECT pgque.send('ps', 'ev', $1::text, $2)",
                    &[&format!("{p}-{i}"), &key],
                )
                .unwrap();
                i += 1;
            }
            i
        }));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut sub = db.connect();
    sub.batch_execute(
        "SELECT pgque.force_tick('ps'); SELECT pgque.subscribe_partitioned('ps', 'c', 4)",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let sent: i32 = senders.into_iter().map(|t| t.join().unwrap()).sum();

    // Drain all four slots.
    let mut got: Vec<(i32, Msg)> = vec![];
    for slot in 0..4 {
        assert_eq!(claim(&mut c, "ps", "c", slot, "w", "1 minute"), Some(1));
    }
    tick(&mut c, "ps");
    loop {
        let mut any = false;
        for slot in 0..4 {
            let msgs = recv_slot(&mut c, "ps", "c", slot, 4, "w", 1000).unwrap();
            if !msgs.is_empty() {
                any = true;
                ack_slot(&mut c, "ps", "c", slot, 4, "w").unwrap();
            }
            got.extend(msgs.into_iter().map(|m| (slot, m)));
        }
        if !any {
            break;
        }
    }
    // Expected: exactly the events the shared start tick did not see.
    let qid = i64s(
        &mut c,
        "SELECT queue_id::int8 FROM pgque.queue WHERE queue_name = 'ps'",
    );
    let starts = i64s(
        &mut c,
        "SELECT count(DISTINCT sub_start_tick) FROM pgque.subscription WHERE sub_consumer LIKE 'c#%'",
    );
    assert_eq!(starts, 1, "one shared start tick");
    let rows = c
        .query(
            &format!(
                "SELECT e.ev_id, pg_visible_in_snapshot(e.ev_txid, t.tick_snapshot) \
                   FROM pgque.event_{qid} e, pgque.tick t \
                  WHERE t.tick_id = (SELECT min(sub_start_tick) FROM pgque.subscription)"
            ),
            &[],
        )
        .unwrap();
    assert_eq!(rows.len() as i32, sent, "every sent event is in the table");
    let after: HashSet<i64> = rows
        .iter()
        .filter(|r| !r.get::<_, bool>(1))
        .map(|r| r.get(0))
        .collect();
    let before = rows.len() - after.len();
    assert!(
        before > 0 && !after.is_empty(),
        "the subscription happened mid-stream"
    );
    let ids: Vec<i64> = got.iter().map(|(_, m)| m.id).collect();
    let idset: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(ids.len(), idset.len(), "no event on two slots or twice");
    assert_eq!(
        idset, after,
        "every event after the start tick, none before"
    );
    for (slot, m) in &got {
        assert_eq!(*slot, slot_of(&mut c, m.key.as_deref().unwrap(), 4));
    }
}
