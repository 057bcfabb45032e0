//! Online resize of a partitioned consumer's N (src/log/resize.rs) with
//! real sessions: a resize 16 -> 32 -> 16 under load with workers killed
//! mid-batch, and an abort mid-drain, keep every key's acked sequence
//! exactly its send order, none lost, none twice; what would lose or
//! reorder an event is refused and changes nothing; a pause-policy
//! consumer's blocked key keeps its marker, held events and failed event
//! across the cutover, on its new slot.
mod slots_util;
use pgque_pg_test::postgres;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use slots_util::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEYS: usize = 120;

/// An acked delivery: (key, seq, batch id, position in its batch, sent and
/// acked at, in ms since the epoch).
type Acked = (String, usize, i64, usize, f64, f64);

fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

/// receive_partitioned with each message's send time (ms since the epoch).
fn recv_timed(
    c: &mut Client,
    q: &str,
    slot: i32,
    n: i32,
    w: &str,
) -> Result<Vec<(Msg, f64)>, postgres::Error> {
    let rows = c.query(
        "SELECT msg_id, batch_id, extra1, payload, retry_count, \
                (extract(epoch FROM created_at) * 1000)::float8 \
           FROM pgque.receive_partitioned($1, 'c', $2, $3, $4, 50)",
        &[&q, &slot, &n, &w],
    )?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                Msg {
                    id: r.get(0),
                    batch: r.get(1),
                    key: r.get(2),
                    payload: r.get(3),
                    retry: r.get(4),
                },
                r.get(5),
            )
        })
        .collect())
}

/// The consumer's N and whether a resize is in progress.
fn n_of(c: &mut Client, q: &str) -> i32 {
    c.query_one(
        "SELECT c.pc_n FROM pgque.partition_consumer c JOIN pgque.queue q ON q.queue_id = c.pc_queue \
          WHERE q.queue_name = $1 AND c.pc_consumer = 'c'",
        &[&q],
    )
    .unwrap()
    .get(0)
}

/// One worker: the claim_next_slot loop (claim, a few batches, release),
/// acking what it receives; `pid` shows its backend while a batch is in its
/// hands, for the killer. A killed session reconnects; its batch is
/// redelivered to the slot's next lease holder. An ack whose reply was lost
/// to a kill is logged when the server has the batch finished.
fn worker(
    db: String,
    q: &'static str,
    w: String,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
    pid: Arc<AtomicI32>,
) {
    let mut s = connect_to(&db);
    let log = |msgs: &[(Msg, f64)]| {
        let at = now_ms();
        let mut a = acked.lock().unwrap();
        for (i, (m, sent)) in msgs.iter().enumerate() {
            let seq: usize = m.payload.as_deref().unwrap().parse().unwrap();
            a.push((m.key.clone().unwrap(), seq, m.batch, i, *sent, at));
        }
    };
    let fenced = |e: &postgres::Error| {
        e.code()
            .is_some_and(|c| matches!(c.code(), "22023" | "55000"))
    };
    while !stop.load(Ordering::SeqCst) {
        let mut broken = false;
        let mut idle = true;
        let claimed = s.query(
            "SELECT slot FROM pgque.claim_next_slot($1, 'c', $2, '2 seconds')",
            &[&q, &w],
        );
        let slot: Option<i32> = match claimed {
            Ok(rows) => rows.first().map(|r| r.get(0)),
            Err(_) => {
                broken = true;
                None
            }
        };
        if let Some(slot) = slot {
            let n: Result<i32, _> = s
                .query_one(
                    "SELECT ps_n FROM pgque.partition_slot p JOIN pgque.queue q ON q.queue_id = p.ps_queue \
                      WHERE q.queue_name = $1 AND p.ps_consumer = 'c' AND p.ps_slot = $2",
                    &[&q, &slot],
                )
                .map(|r| r.get(0));
            match n {
                Err(_) => broken = true,
                Ok(n) => {
                    for _ in 0..4 {
                        let msgs = match recv_timed(&mut s, q, slot, n, &w) {
                            Ok(m) => m,
                            Err(e) => {
                                broken = !fenced(&e);
                                break;
                            }
                        };
                        if msgs.is_empty() {
                            continue;
                        }
                        idle = false;
                        let me: i32 = match s.query_one("SELECT pg_backend_pid()", &[]) {
                            Ok(r) => r.get(0),
                            Err(_) => {
                                broken = true;
                                break;
                            }
                        };
                        pid.store(me, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(3));
                        let ok = ack_slot(&mut s, q, "c", slot, n, &w);
                        pid.store(0, Ordering::SeqCst);
                        match ok {
                            Ok(1) => log(&msgs),
                            Ok(_) => {}
                            Err(e) if fenced(&e) => break,
                            Err(_) => {
                                // Killed during the ack: did it commit?
                                s = connect_to(&db);
                                let done: bool = s
                                    .query_one(
                                        "SELECT EXISTS (SELECT 1 FROM pgque.batch_done WHERE batch_id = $1 AND NOT abandoned)",
                                        &[&msgs[0].0.batch],
                                    )
                                    .unwrap()
                                    .get(0);
                                if done {
                                    log(&msgs);
                                }
                                break;
                            }
                        }
                    }
                    if !broken {
                        let _ = s.query(
                            "SELECT pgque.release_slot($1, 'c', $2, $3)",
                            &[&q, &slot, &w],
                        );
                    }
                }
            }
        }
        if broken || s.is_closed() {
            pid.store(0, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            s = connect_to(&db);
        } else if idle {
            std::thread::sleep(Duration::from_millis(15));
        }
    }
}

/// Producers: each key belongs to one producer, which sends its events in
/// order (seq in the payload), several keys a transaction. Returns the
/// number sent per key.
fn producer(
    db: String,
    q: &'static str,
    p: usize,
    np: usize,
    period: Duration,
    stop: Arc<AtomicBool>,
) -> HashMap<String, usize> {
    let mut s = connect_to(&db);
    let mut sent: HashMap<String, usize> = HashMap::new();
    let mine: Vec<String> = (p..KEYS).step_by(np).map(|k| format!("key-{k}")).collect();
    let mut round = 0usize;
    let start = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        // A rotating handful of this producer's keys per transaction.
        let keys: Vec<String> = (0..12)
            .map(|i| mine[(round * 12 + i) % mine.len()].clone())
            .collect();
        let payloads: Vec<String> = keys
            .iter()
            .map(|k| {
                let e = sent.entry(k.clone()).or_default();
                *e += 1;
                format!("{}", *e - 1)
            })
            .collect();
        s.query_one(
            "SELECT pgque.send_batch($1, 'ev', $2::text[], $3::text[])",
            &[&q, &payloads, &keys],
        )
        .unwrap();
        round += 1;
        // At a fixed rate: 12 events per period (as fast as it can if behind).
        let next = start + period * round as u32;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    sent
}

/// Kills, now and then, a worker's session while it holds a batch.
fn killer(db: String, pids: Vec<Arc<AtomicI32>>, stop: Arc<AtomicBool>, kills: Arc<AtomicUsize>) {
    let mut s = connect_to(&db);
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(400));
        for _ in 0..pids.len() {
            i += 1;
            let p = pids[i % pids.len()].load(Ordering::SeqCst);
            if p != 0 {
                let ok: bool = s
                    .query_one("SELECT pg_terminate_backend($1)", &[&p])
                    .unwrap()
                    .get(0);
                if ok {
                    kills.fetch_add(1, Ordering::SeqCst);
                }
                break;
            }
        }
    }
}

/// Waits until every old slot has drained to the seal, then cuts over.
fn wait_ready_and_complete(c: &mut Client, q: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let ready: bool = c
            .query_one(
                "SELECT bool_and(ready) FROM pgque.resize_ready($1, 'c')",
                &[&q],
            )
            .unwrap()
            .get(0);
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "the old slots never drained");
        std::thread::sleep(Duration::from_millis(50));
    }
    c.query_one("SELECT pgque.complete_resize($1, 'c')", &[&q])
        .unwrap()
        .get(0)
}

/// Every key's acked sequence in delivery order (batch id, then position in
/// the batch: a key's batches are opened one after another) is exactly
/// 0..sent, none lost, none twice.
fn check_order(acked: &[Acked], sent: &HashMap<String, usize>) {
    let mut by_key: HashMap<&str, Vec<(i64, usize, usize)>> = HashMap::new();
    for (k, seq, b, i, _, _) in acked {
        by_key.entry(k.as_str()).or_default().push((*b, *i, *seq));
    }
    let total: usize = sent.values().sum();
    assert_eq!(acked.len(), total, "every sent event acked exactly once");
    for (k, n) in sent {
        let mut evs = by_key.remove(k.as_str()).unwrap_or_default();
        evs.sort();
        let seqs: Vec<usize> = evs.iter().map(|e| e.2).collect();
        assert_eq!(
            seqs,
            (0..*n).collect::<Vec<_>>(),
            "{k}: acked in send order, none lost or twice"
        );
    }
    assert!(by_key.is_empty(), "no event of an unknown key");
}

struct Load {
    stop_prod: Arc<AtomicBool>,
    stop_work: Arc<AtomicBool>,
    producers: Vec<std::thread::JoinHandle<HashMap<String, usize>>>,
    workers: Vec<std::thread::JoinHandle<()>>,
    killer: std::thread::JoinHandle<()>,
    acked: Arc<Mutex<Vec<Acked>>>,
    kills: Arc<AtomicUsize>,
}

fn start_load(db: &str, q: &'static str, nworkers: usize, period: Duration) -> Load {
    let stop_prod = Arc::new(AtomicBool::new(false));
    let stop_work = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(vec![]));
    let kills = Arc::new(AtomicUsize::new(0));
    let pids: Vec<Arc<AtomicI32>> = (0..nworkers).map(|_| Arc::new(AtomicI32::new(0))).collect();
    let workers = (0..nworkers)
        .map(|i| {
            let (db, stop, acked, pid) = (
                db.to_string(),
                stop_work.clone(),
                acked.clone(),
                pids[i].clone(),
            );
            std::thread::spawn(move || worker(db, q, format!("w{i}"), stop, acked, pid))
        })
        .collect();
    let producers = (0..2)
        .map(|p| {
            let (db, stop) = (db.to_string(), stop_prod.clone());
            std::thread::spawn(move || producer(db, q, p, 2, period, stop))
        })
        .collect();
    let killer = {
        let (db, stop, kills) = (db.to_string(), stop_work.clone(), kills.clone());
        std::thread::spawn(move || killer(db, pids, stop, kills))
    };
    Load {
        stop_prod,
        stop_work,
        producers,
        workers,
        killer,
        acked,
        kills,
    }
}

/// Stops the producers, lets the workers drain everything, stops them;
/// returns (sent per key, acked, kills).
fn finish_load(l: Load) -> (HashMap<String, usize>, Vec<Acked>, usize) {
    l.stop_prod.store(true, Ordering::SeqCst);
    let mut sent = HashMap::new();
    for p in l.producers {
        sent.extend(p.join().unwrap());
    }
    let total: usize = sent.values().sum();
    let deadline = Instant::now() + Duration::from_secs(40);
    while l.acked.lock().unwrap().len() < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // A little longer: nothing more may come.
    std::thread::sleep(Duration::from_millis(500));
    l.stop_work.store(true, Ordering::SeqCst);
    for w in l.workers {
        w.join().unwrap();
    }
    l.killer.join().unwrap();
    let acked = l.acked.lock().unwrap().clone();
    (sent, acked, l.kills.load(Ordering::SeqCst))
}

#[test]
fn resize_16_32_16_under_load_with_kills_keeps_every_keys_order() {
    let db = new_db("slots_resize_load");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('rq'); \
         SELECT pgque.subscribe_partitioned('rq', 'c', 16);",
    )
    .unwrap();
    let load = start_load(&db.name, "rq", 4, Duration::from_millis(10));
    std::thread::sleep(Duration::from_millis(1500));
    let seal: i64 = c
        .query_one("SELECT pgque.begin_resize('rq', 'c', 32)", &[])
        .unwrap()
        .get(0);
    assert!(seal > 0);
    assert_eq!(
        i64s(
            &mut c,
            "SELECT count(*) FROM pgque.partition_resizes WHERE new_n = 32 AND n = 16"
        ),
        1
    );
    assert_eq!(wait_ready_and_complete(&mut c, "rq"), 32);
    assert_eq!(n_of(&mut c, "rq"), 32);
    assert_eq!(
        i64s(
            &mut c,
            "SELECT count(*) FROM pgque.partition_slot WHERE ps_n = 32"
        ),
        32
    );
    std::thread::sleep(Duration::from_millis(1500));
    c.query_one("SELECT pgque.begin_resize('rq', 'c', 16)", &[])
        .unwrap();
    assert_eq!(wait_ready_and_complete(&mut c, "rq"), 16);
    assert_eq!(n_of(&mut c, "rq"), 16);
    std::thread::sleep(Duration::from_millis(1000));
    let (sent, acked, kills) = finish_load(load);
    let total: usize = sent.values().sum();
    eprintln!("16 -> 32 -> 16 under load: {total} events over {KEYS} keys, {kills} worker sessions killed");
    assert!(total > 2000, "a real load: {total} events");
    assert!(kills > 0, "workers were killed mid-batch");
    check_order(&acked, &sent);
    // Acked events came from both sides of each cutover: batches of N = 16,
    // 32 and 16 again (the slot subscriptions of each generation).
    assert_eq!(
        i64s(
            &mut c,
            "SELECT count(*) FROM pgque.subscription WHERE sub_consumer LIKE 'c#%'"
        ),
        16
    );
    assert_eq!(
        i64s(&mut c, "SELECT count(*) FROM pgque.partition_resize"),
        0
    );
    assert_eq!(
        i64s(
            &mut c,
            "SELECT coalesce(sum(pending_events), 0)::int8 FROM pgque.partition_slot_status"
        ),
        0
    );
}

#[test]
fn resize_aborted_mid_drain_loses_and_repeats_nothing() {
    let db = new_db("slots_resize_abort");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('ra'); \
         SELECT pgque.subscribe_partitioned('ra', 'c', 16);",
    )
    .unwrap();
    let load = start_load(&db.name, "ra", 4, Duration::from_millis(10));
    std::thread::sleep(Duration::from_millis(1200));
    c.query_one("SELECT pgque.begin_resize('ra', 'c', 32)", &[])
        .unwrap();
    // Mid-drain: some old slots have reached the seal, not all, or let it
    // run a moment whatever they did.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        i64s(
            &mut c,
            "SELECT count(*) FROM pgque.subscription WHERE sub_consumer LIKE 'c#%/32'"
        ),
        32
    );
    let n: i32 = c
        .query_one("SELECT pgque.abort_resize('ra', 'c')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 16);
    assert_eq!(
        i64s(
            &mut c,
            "SELECT count(*) FROM pgque.subscription WHERE sub_consumer LIKE 'c#%/32'"
        ),
        0
    );
    assert_eq!(
        i64s(
            &mut c,
            "SELECT count(*) FROM pgque.partition_slot WHERE ps_seal IS NOT NULL"
        ),
        0
    );
    std::thread::sleep(Duration::from_millis(1500));
    let (sent, acked, _) = finish_load(load);
    check_order(&acked, &sent);
    assert_eq!(n_of(&mut c, "ra"), 16);
}

#[test]
fn resize_refuses_what_would_lose_or_reorder_and_changes_nothing() {
    let db = manual_db("slots_resize_refuse");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('rr'); \
         SELECT pgque.subscribe_partitioned('rr', 'c', 4); \
         SELECT pgque.subscribe('rr', 'plain');",
    )
    .unwrap();
    let state = |c: &mut Client| -> String {
        let f = fingerprint(c);
        let r: String = c
            .query_one(
                "SELECT concat_ws('|', (SELECT string_agg(concat_ws(',', pr_n, pr_tick), ';') FROM pgque.partition_resize), \
                   (SELECT string_agg(sub_consumer, ',' ORDER BY sub_id) FROM pgque.subscription), \
                   (SELECT string_agg(concat_ws(',', pc_n), ';') FROM pgque.partition_consumer), \
                   (SELECT string_agg(coalesce(ps_seal::text, '-'), ',' ORDER BY ps_slot) FROM pgque.partition_slot))",
                &[],
            )
            .unwrap()
            .get(0);
        format!("{f}#{r}")
    };
    let before = state(&mut c);
    let q = |c: &mut Client, sql: &str| sqlstate(c.query_one(sql, &[]).map(|_| ()));
    for (sql, want) in [
        // new_n = N
        ("SELECT pgque.begin_resize('rr', 'c', 4)", "22023"),
        ("SELECT pgque.begin_resize('rr', 'c', 0)", "22003"),
        ("SELECT pgque.begin_resize('rr', 'c', 257)", "22003"),
        ("SELECT pgque.begin_resize('rr', 'c', NULL)", "22004"),
        ("SELECT pgque.begin_resize('rr', 'plain', 8)", "42704"),
        ("SELECT pgque.begin_resize('rr', 'nobody', 8)", "42704"),
        ("SELECT pgque.begin_resize('nope', 'c', 8)", "42704"),
        // nothing to complete
        ("SELECT pgque.complete_resize('rr', 'c')", "55000"),
        // nothing to abort
        ("SELECT pgque.abort_resize('rr', 'c')", "55000"),
        ("SELECT * FROM pgque.resize_ready('rr', 'c')", "55000"),
    ] {
        assert_eq!(q(&mut c, sql), want, "{sql}");
    }
    assert_eq!(before, state(&mut c), "refusals change nothing");

    // Events before the seal, one slot behind.
    for i in 0..20 {
        c.execute(
            "SELECT pgque.send('rr', 'ev', $1::text, $2)",
            &[&format!("{i}"), &format!("k{}", i % 7)],
        )
        .unwrap();
    }
    tick(&mut c, "rr");
    let seal: i64 = c
        .query_one("SELECT pgque.begin_resize('rr', 'c', 8)", &[])
        .unwrap()
        .get(0);
    let during = state(&mut c);
    for (sql, want) in [
        // a second begin
        ("SELECT pgque.begin_resize('rr', 'c', 2)", "55000"),
        // complete before ready
        ("SELECT pgque.complete_resize('rr', 'c')", "55000"),
        // repair of an old slot under the drain
        ("SELECT pgque.unsubscribe_slot('rr', 'c', 1, 4)", "55000"),
    ] {
        assert_eq!(q(&mut c, sql), want, "{sql}");
    }
    assert_eq!(
        during,
        state(&mut c),
        "refusals during a resize change nothing"
    );
    // The status: per old slot, what it still has to read.
    let rows = c
        .query("SELECT slot, n, new_n, seal_tick, ready, open_batch FROM pgque.resize_ready('rr', 'c') ORDER BY slot", &[])
        .unwrap();
    assert_eq!(rows.len(), 4);
    for r in &rows {
        assert_eq!(
            (r.get::<_, i32>(1), r.get::<_, i32>(2), r.get::<_, i64>(3)),
            (4, 8, seal)
        );
        assert!(!r.get::<_, bool>(4), "nothing read yet");
    }
    // New slots are not handed out during the drain; events after the seal wait.
    for i in 20..30 {
        c.execute(
            "SELECT pgque.send('rr', 'ev', $1::text, $2)",
            &[&format!("{i}"), &format!("k{}", i % 7)],
        )
        .unwrap();
    }
    tick(&mut c, "rr");
    let mut got = vec![];
    for slot in 0..4 {
        assert_eq!(claim(&mut c, "rr", "c", slot, "w", "1 minute"), Some(1));
        // An old slot's batch stops at the seal.
        for _ in 0..12 {
            let m = recv_slot(&mut c, "rr", "c", slot, 4, "w", 3).unwrap();
            if m.is_empty() {
                continue;
            }
            // An open batch blocks the cutover.
            if slot == 0 && got.is_empty() {
                assert_eq!(
                    q(&mut c, "SELECT pgque.complete_resize('rr', 'c')"),
                    "55000"
                );
            }
            got.extend(m);
            ack_slot(&mut c, "rr", "c", slot, 4, "w").unwrap();
        }
    }
    let mut ids: Vec<i64> = got
        .iter()
        .map(|m| m.payload.as_deref().unwrap().parse().unwrap())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        (0..20).collect::<Vec<i64>>(),
        "old slots: exactly the events up to the seal"
    );
    // Every old slot is leased: a new slot is never handed out before the cutover.
    assert!(c
        .query(
            "SELECT slot FROM pgque.claim_next_slot('rr', 'c', 'w2')",
            &[]
        )
        .unwrap()
        .is_empty());
    assert_eq!(
        i64s(
            &mut c,
            "SELECT count(*) FILTER (WHERE NOT ready) FROM pgque.resize_ready('rr', 'c')"
        ),
        0
    );
    let n: i32 = c
        .query_one("SELECT pgque.complete_resize('rr', 'c')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 8);
    // Workers of the old N are refused (and the old leases ended).
    assert_eq!(
        sqlstate(recv_slot(&mut c, "rr", "c", 0, 4, "w", 10)),
        "22023"
    );
    let mut after = vec![];
    for slot in 0..8 {
        assert!(claim(&mut c, "rr", "c", slot, "w", "1 minute").is_some());
        for _ in 0..12 {
            let m = recv_slot(&mut c, "rr", "c", slot, 8, "w", 100).unwrap();
            if m.is_empty() {
                continue;
            }
            for x in &m {
                assert_eq!(slot_of(&mut c, x.key.as_deref().unwrap(), 8), slot);
            }
            after.extend(m);
            ack_slot(&mut c, "rr", "c", slot, 8, "w").unwrap();
        }
    }
    let mut ids: Vec<i64> = after
        .iter()
        .map(|m| m.payload.as_deref().unwrap().parse().unwrap())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        (20..30).collect::<Vec<i64>>(),
        "new slots: exactly the events after the seal"
    );
}

/// A pause-policy consumer with a blocked key across a 4 -> 8 resize: the
/// failed event's retry (put back after the seal), the key's held events and
/// its marker move to its new slot; the key's acked sequence stays its send
/// order, and other keys are not held back.
#[test]
fn resize_moves_a_blocked_keys_marker_and_held_events_to_its_new_slot() {
    let db = manual_db("slots_resize_pause");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('rp'); \
         SELECT pgque.subscribe_partitioned('rp', 'c', 4, failure_policy => 'pause');",
    )
    .unwrap();
    // A key whose slot changes from 4 to 8 slots.
    let hot = (0..100)
        .map(|i| format!("hot{i}"))
        .find(|k| slot_of(&mut c, k, 4) != slot_of(&mut c, k, 8))
        .unwrap();
    let (old_slot, new_slot) = (slot_of(&mut c, &hot, 4), slot_of(&mut c, &hot, 8));
    let send = |c: &mut Client, k: &str, p: &str| {
        c.execute("SELECT pgque.send('rp', 't', $1::text, $2)", &[&p, &k])
            .unwrap();
    };
    for i in 0..3 {
        send(&mut c, &hot, &format!("{i}"));
    }
    send(&mut c, "other", "o0");
    tick(&mut c, "rp");
    assert_eq!(
        claim(&mut c, "rp", "c", old_slot, "w", "5 minutes"),
        Some(1)
    );
    let got = recv_slot(&mut c, "rp", "c", old_slot, 4, "w", 100).unwrap();
    let first = got
        .iter()
        .find(|m| m.payload.as_deref() == Some("0"))
        .unwrap()
        .clone();
    let n: i32 = c
        .query_one(
            "SELECT pgque.nack_partitioned('rp', 'c', $1, 4, 'w', \
                 ROW($2, $3, 't', NULL, NULL, now(), NULL, NULL, NULL, NULL)::pgque.message, \
                 '0 seconds'::interval, 'test')",
            &[&old_slot, &first.id, &first.batch],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let mut acked: Vec<String> = got
        .iter()
        .filter(|m| m.key.as_deref() != Some(hot.as_str()))
        .map(|m| m.payload.clone().unwrap())
        .collect();
    assert_eq!(ack_slot(&mut c, "rp", "c", old_slot, 4, "w").unwrap(), 1);
    // More of hot before the seal (parked by the old slot as it drains).
    send(&mut c, &hot, "3");
    tick(&mut c, "rp");
    c.query_one("SELECT pgque.begin_resize('rp', 'c', 8)", &[])
        .unwrap();
    // After the seal: the retry comes due and is put back (owned by the old
    // slot, past its seal), and hot's newest event arrives.
    assert_eq!(i64s(&mut c, "SELECT pgque.maint_retry_events()::int8"), 1);
    send(&mut c, &hot, "4");
    send(&mut c, "other", "o1");
    tick(&mut c, "rp");
    for slot in 0..4 {
        assert!(claim(&mut c, "rp", "c", slot, "w", "5 minutes").is_some());
        for _ in 0..12 {
            let m = recv_slot(&mut c, "rp", "c", slot, 4, "w", 100).unwrap();
            if m.is_empty() {
                continue;
            }
            acked.extend(m.iter().map(|x| x.payload.clone().unwrap()));
            ack_slot(&mut c, "rp", "c", slot, 4, "w").unwrap();
        }
    }
    assert!(
        !acked.iter().any(|p| p.parse::<i32>().is_ok()),
        "hot held back: {acked:?}"
    );
    let status: String = c
        .query_one(
            "SELECT string_agg(concat_ws(',', slot, ready, blocked_keys, held_events), ';' ORDER BY slot) \
               FROM pgque.resize_ready('rp', 'c') WHERE blocked_keys > 0",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        status,
        format!("{old_slot},t,1,3"),
        "hot blocked, 1, 2 and 3 held"
    );
    assert_eq!(
        c.query_one("SELECT pgque.complete_resize('rp', 'c')", &[])
            .unwrap()
            .get::<_, i32>(0),
        8
    );
    let marker: String = c
        .query_one(
            "SELECT string_agg(concat_ws(',', partition_key, slot, n, state, held_events), ';') FROM pgque.partition_blocked_keys",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        marker,
        format!("{hot},{new_slot},8,retry,3"),
        "the marker followed its key"
    );
    // The new slots: hot's failed event first, then its held ones, then 4.
    let mut hot_seq = vec![];
    for _round in 0..6 {
        for slot in 0..8 {
            claim(&mut c, "rp", "c", slot, "w", "5 minutes");
            let m = recv_slot(&mut c, "rp", "c", slot, 8, "w", 100).unwrap();
            if m.is_empty() {
                continue;
            }
            for x in &m {
                if x.key.as_deref() == Some(hot.as_str()) {
                    assert_eq!(slot, new_slot);
                    hot_seq.push(x.payload.clone().unwrap());
                } else {
                    acked.push(x.payload.clone().unwrap());
                }
            }
            ack_slot(&mut c, "rp", "c", slot, 8, "w").unwrap();
        }
        tick(&mut c, "rp");
    }
    assert_eq!(
        hot_seq,
        ["0", "1", "2", "3", "4"],
        "hot in send order across the cutover"
    );
    acked.sort();
    assert_eq!(acked, ["o0", "o1"]);
    assert_eq!(
        i64s(&mut c, "SELECT count(*) FROM pgque.partition_blocked"),
        0
    );
}

/// A pause-policy key in `release` with events still held at the cutover
/// (put-back goes 1,000 events a round, src/log/pause.rs PUT_BACK_MAX): 1
/// -> 2 slots sealed while the key's first round is open; the second round,
/// put back after the seal, its remaining held events and the marker
/// (release, pending, held) move to the key's new slot, which delivers the
/// rest in send order, each once.
#[test]
fn resize_moves_a_released_key_with_events_still_held() {
    let db = manual_db("slots_resize_release");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('rl'); \
         SELECT pgque.subscribe_partitioned('rl', 'c', 1, 'pause');",
    )
    .unwrap();
    let k = (0..100)
        .map(|i| format!("k{i}"))
        .find(|k| slot_of(&mut c, k, 2) == 1)
        .unwrap();
    claim(&mut c, "rl", "c", 0, "w", "1 hour").unwrap();
    c.execute("SELECT pgque.send('rl', 't', '0', $1)", &[&k])
        .unwrap();
    tick(&mut c, "rl");
    let got = recv_slot(&mut c, "rl", "c", 0, 1, "w", 100).unwrap();
    let n: i32 = c
        .query_one(
            "SELECT pgque.nack_partitioned('rl', 'c', 0, 1, 'w', \
                 ROW($1, $2, 't', NULL, NULL, now(), NULL, NULL, NULL, NULL)::pgque.message, \
                 '0 seconds'::interval, 'test')",
            &[&got[0].id, &got[0].batch],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    ack_slot(&mut c, "rl", "c", 0, 1, "w").unwrap();
    c.execute(
        "SELECT pgque.send('rl', 't', g::text, $1) FROM generate_series(1, 2500) g",
        &[&k],
    )
    .unwrap();
    tick(&mut c, "rl");
    assert!(recv_slot(&mut c, "rl", "c", 0, 1, "w", 1000)
        .unwrap()
        .is_empty());
    // The failed event back and acked: round one (1..1000) put back.
    assert_eq!(i64s(&mut c, "SELECT pgque.maint_retry_events()::int8"), 1);
    tick(&mut c, "rl");
    let mut seq: Vec<String> = vec![];
    let got = recv_slot(&mut c, "rl", "c", 0, 1, "w", 100).unwrap();
    seq.extend(got.iter().map(|m| m.payload.clone().unwrap()));
    ack_slot(&mut c, "rl", "c", 0, 1, "w").unwrap();
    tick(&mut c, "rl");
    let got = recv_slot(&mut c, "rl", "c", 0, 1, "w", 1000).unwrap();
    assert_eq!(got.len(), 1000);
    seq.extend(got.iter().map(|m| m.payload.clone().unwrap()));
    // Sealed while round one's batch is open; its ack puts round two back
    // after the seal.
    c.query_one("SELECT pgque.begin_resize('rl', 'c', 2)", &[])
        .unwrap();
    ack_slot(&mut c, "rl", "c", 0, 1, "w").unwrap();
    let marker = |c: &mut Client| -> String {
        c.query_one(
            "SELECT string_agg(concat_ws(',', slot, n, state, held_events, redelivering_events), ';') \
               FROM pgque.partition_blocked_keys",
            &[],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!(marker(&mut c), "0,1,release,500,1000");
    tick(&mut c, "rl");
    for _ in 0..6 {
        let m = recv_slot(&mut c, "rl", "c", 0, 1, "w", 2000).unwrap();
        assert!(
            m.is_empty(),
            "the old slot reads past its seal: {}",
            m.len()
        );
    }
    assert_eq!(
        c.query_one("SELECT pgque.complete_resize('rl', 'c')", &[])
            .unwrap()
            .get::<_, i32>(0),
        2
    );
    assert_eq!(marker(&mut c), "1,2,release,500,1000");
    assert_eq!(
        i64s(
            &mut c,
            "SELECT count(*) FROM pgque.partition_held h JOIN pgque.partition_slot p ON p.ps_sub = h.ph_sub \
              WHERE p.ps_slot = 1 AND p.ps_n = 2"
        ),
        500
    );
    claim(&mut c, "rl", "c", 1, "w", "1 hour").unwrap();
    for _ in 0..6 {
        tick(&mut c, "rl");
        let m = recv_slot(&mut c, "rl", "c", 1, 2, "w", 2000).unwrap();
        if m.is_empty() {
            continue;
        }
        assert!(m.len() <= 1000);
        seq.extend(m.iter().map(|x| x.payload.clone().unwrap()));
        ack_slot(&mut c, "rl", "c", 1, 2, "w").unwrap();
    }
    let want: Vec<String> = (0..=2500).map(|i| i.to_string()).collect();
    assert_eq!(seq, want, "in send order across the cutover, each once");
    assert_eq!(
        i64s(&mut c, "SELECT count(*) FROM pgque.partition_blocked"),
        0
    );
}

/// Percentiles of a list of lags (ms).
fn pcts(mut v: Vec<f64>) -> (f64, f64, f64, usize) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    (at(0.5), at(0.99), *v.last().unwrap(), v.len())
}

/// The cost of a resize (docs/partition-keys.md, benches/results/partition-keys.md):
/// events at a fixed rate over 120 keys, 4 workers, N = 16; the end-to-end
/// lag (ack time - send time) of the events sent in a 6 s window without a
/// resize, and of those sent in the 6 s from begin_resize(32) (the drain,
/// the cutover, the first batches of the new slots). No kills. By hand:
///   PGTEST_PROFILE=tier PGTEST_CARGO_ARGS="--test slots_resize" bash pg_test/run.sh 16 -- --ignored resize_cost
#[test]
#[ignore]
fn resize_cost_lag_during_a_16_to_32_resize() {
    let db = new_db("slots_resize_cost");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('rc'); \
         SELECT pgque.subscribe_partitioned('rc', 'c', 16); \
         SELECT pgque.subscribe_partitioned('rc', 'other', 32); \
         SELECT pgque.unsubscribe_partitioned('rc', 'other');",
    )
    .unwrap();
    // (the N = 32 slot index exists, as for a queue that allows 32)
    let period = Duration::from_millis(25); // 2 producers x 12 events / 25 ms = 960 ev/s
    let load = start_load(&db.name, "rc", 4, period);
    std::thread::sleep(Duration::from_secs(3));
    let base_from = now_ms();
    std::thread::sleep(Duration::from_secs(6));
    let begin_at = now_ms();
    let t = Instant::now();
    c.query_one("SELECT pgque.begin_resize('rc', 'c', 32)", &[])
        .unwrap();
    let begin_ms = t.elapsed().as_secs_f64() * 1000.0;
    let ready_ms;
    loop {
        let ready: bool = c
            .query_one(
                "SELECT bool_and(ready) FROM pgque.resize_ready('rc', 'c')",
                &[],
            )
            .unwrap()
            .get(0);
        if ready {
            ready_ms = t.elapsed().as_secs_f64() * 1000.0;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let t2 = Instant::now();
    c.query_one("SELECT pgque.complete_resize('rc', 'c')", &[])
        .unwrap();
    let complete_ms = t2.elapsed().as_secs_f64() * 1000.0;
    std::thread::sleep(Duration::from_secs(8));
    let (sent, acked, _) = finish_load(load);
    check_order(&acked, &sent);
    let lag = |from: f64, to: f64| {
        pcts(
            acked
                .iter()
                .filter(|a| a.4 >= from && a.4 < to)
                .map(|a| a.5 - a.4)
                .collect(),
        )
    };
    let base = lag(base_from, base_from + 6000.0);
    let during = lag(begin_at, begin_at + 6000.0);
    println!("| window | events | lag p50 ms | lag p99 ms | lag max ms |");
    println!("|---|---|---|---|---|");
    println!(
        "| no resize (6 s) | {} | {:.0} | {:.0} | {:.0} |",
        base.3, base.0, base.1, base.2
    );
    println!(
        "| from begin_resize (6 s) | {} | {:.0} | {:.0} | {:.0} |",
        during.3, during.0, during.1, during.2
    );
    println!(
        "ratios resize / no resize: p50 {:.2}, p99 {:.2}, max {:.2}; begin_resize {begin_ms:.0} ms, drain to ready {ready_ms:.0} ms, complete_resize {complete_ms:.0} ms",
        during.0 / base.0,
        during.1 / base.1,
        during.2 / base.2
    );
}
