//! Slot leases with real sessions: exclusivity, never waiting, takeover
//! after the TTL with fencing of the old worker, a killed worker's batch
//! redelivered, M < N workers covering every slot through claim_next_slot,
//! and lease writes bounded under a held xmin.
mod slots_util;
use pgque_pg_test::*;
use slots_util::*;
use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// A queue `q` with partitioned consumer c (n slots) and `per_slot` events
/// sent to each slot (keys found by asking the server), ticked.
fn setup(db: &TestDb, q: &str, n: i32, per_slot: usize) -> Vec<Vec<i64>> {
    let mut c = db.connect();
    c.batch_execute(&format!(
        "SELECT pgque.create_queue('{q}'); SELECT pgque.subscribe_partitioned('{q}', 'c', {n});"
    ))
    .unwrap();
    let mut ids = vec![vec![]; n as usize];
    let mut i = 0;
    while ids.iter().any(|v| v.len() < per_slot) {
        let key = format!("key-{i}");
        let s = slot_of(&mut c, &key, n) as usize;
        if ids[s].len() < per_slot {
            let id: i64 = c
                .query_one("SELECT pgque.send($1, 'ev', 'x'::text, $2)", &[&q, &key])
                .unwrap()
                .get(0);
            ids[s].push(id);
        }
        i += 1;
    }
    tick(&mut c, q);
    ids
}

#[test]
fn slots_racing_workers_one_wins_and_a_busy_claim_returns_null_at_once() {
    let db = manual_db("slots_race");
    setup(&db, "r", 4, 1);
    // Eight sessions claim slot 2 at the same moment: exactly one wins.
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let (name, barrier) = (db.name.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut s = connect_to(&name);
                barrier.wait();
                claim(&mut s, "r", "c", 2, &format!("w{i}"), "30 seconds")
            })
        })
        .collect();
    let got: Vec<Option<i64>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(got.iter().filter(|e| e.is_some()).count(), 1, "{got:?}");
    assert_eq!(got.iter().flatten().copied().collect::<Vec<_>>(), vec![1]);
    let winner = format!("w{}", got.iter().position(|e| e.is_some()).unwrap());

    // The owner inside an open transaction (its receive holds the lease
    // row): another claim returns NULL without waiting (a wait would hit
    // the statement timeout and raise 57014).
    let mut a = db.connect();
    a.batch_execute("BEGIN").unwrap();
    let msgs = recv_slot(&mut a, "r", "c", 2, 4, &winner, 10).unwrap();
    assert_eq!(msgs.len(), 1);
    let mut b = db.connect();
    b.batch_execute("SET statement_timeout = '2s'").unwrap();
    assert_eq!(claim(&mut b, "r", "c", 2, "other", "30 seconds"), None);
    let next: Vec<i32> = b
        .query(
            "SELECT slot FROM pgque.claim_next_slot('r', 'c', 'other')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(next.len(), 1);
    assert_ne!(next[0], 2, "claim_next_slot skips the held slot");
    a.batch_execute("COMMIT").unwrap();
    // Held (not expired) after the commit too: still NULL.
    assert_eq!(claim(&mut b, "r", "c", 2, "other", "30 seconds"), None);
    assert_eq!(claim(&mut b, "r", "c", 2, &winner, "30 seconds"), Some(1));
}

#[test]
fn slots_after_ttl_another_worker_takes_over_and_the_old_one_is_fenced() {
    let db = manual_db("slots_fence");
    let ids = setup(&db, "f", 2, 5);
    let mut a = db.connect();
    let mut b = db.connect();
    assert_eq!(claim(&mut a, "f", "c", 1, "A", "1 second"), Some(1));
    let first = recv_slot(&mut a, "f", "c", 1, 2, "A", 100).unwrap();
    assert_eq!(first.iter().map(|m| m.id).collect::<Vec<_>>(), ids[1]);
    // Before the TTL: busy.
    assert_eq!(claim(&mut b, "f", "c", 1, "B", "30 seconds"), None);
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(claim(&mut b, "f", "c", 1, "B", "30 seconds"), Some(2));
    // The old worker: receive, ack and nack fail with 55000, nothing changes.
    let before = fingerprint(&mut b);
    assert_eq!(
        sqlstate(recv_slot(&mut a, "f", "c", 1, 2, "A", 100)),
        "55000"
    );
    assert_eq!(sqlstate(ack_slot(&mut a, "f", "c", 1, 2, "A")), "55000");
    let r = a.query_one(
        "SELECT pgque.nack_partitioned('f', 'c', 1, 2, 'A', \
            ROW($1::int8, $2::int8, 'ev', 'x', NULL, now(), NULL, NULL, NULL, NULL)::pgque.message)",
        &[&first[0].id, &first[0].batch],
    );
    assert_eq!(sqlstate(r), "55000");
    // Nor does the plain batch API bypass the fence.
    assert_eq!(
        sqlstate(a.query_one("SELECT pgque.ack($1)", &[&first[0].batch])),
        "55000"
    );
    assert_eq!(
        sqlstate(a.query_one("SELECT pgque.finish_batch($1)", &[&first[0].batch])),
        "55000"
    );
    assert_eq!(
        fingerprint(&mut b),
        before,
        "a fenced call changed something"
    );
    // The new owner gets the same open batch and finishes it.
    let again = recv_slot(&mut b, "f", "c", 1, 2, "B", 100).unwrap();
    assert_eq!(again, first);
    assert_eq!(ack_slot(&mut b, "f", "c", 1, 2, "B").unwrap(), 1);
    assert_eq!(ack_slot(&mut b, "f", "c", 1, 2, "B").unwrap(), 0);
    // The old worker's claim now returns NULL (B holds it).
    assert_eq!(claim(&mut a, "f", "c", 1, "A", "1 second"), None);
    // Release: owner only, and not with an open batch.
    c_send_tick(&db, "f", 1, 2);
    let open = recv_slot(&mut b, "f", "c", 1, 2, "B", 100).unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(
        sqlstate(b.query_one("SELECT pgque.release_slot('f', 'c', 1, 'B')", &[])),
        "55000"
    );
    assert_eq!(ack_slot(&mut b, "f", "c", 1, 2, "B").unwrap(), 1);
    let released: bool = b
        .query_one("SELECT pgque.release_slot('f', 'c', 1, 'B')", &[])
        .unwrap()
        .get(0);
    assert!(released);
    assert_eq!(claim(&mut a, "f", "c", 1, "A", "1 second"), Some(3));
}

/// Sends one event to slot `slot` (of n) and ticks.
fn c_send_tick(db: &TestDb, q: &str, slot: i32, n: i32) {
    let mut c = db.connect();
    let mut i = 0;
    loop {
        let key = format!("more-{i}");
        if slot_of(&mut c, &key, n) == slot {
            c.query_one("SELECT pgque.send($1, 'ev', 'y'::text, $2)", &[&q, &key])
                .unwrap();
            break;
        }
        i += 1;
    }
    tick(&mut c, q);
}

#[test]
fn slots_killed_worker_slot_is_taken_over_after_ttl_and_its_batch_redelivered() {
    let db = manual_db("slots_crash");
    let ids = setup(&db, "k", 3, 4);
    let mut victim = db.connect();
    let pid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    assert_eq!(claim(&mut victim, "k", "c", 0, "V", "2 seconds"), Some(1));
    // Mid-batch: the batch is received (committed), then the worker dies
    // while processing it, without ack.
    let got = recv_slot(&mut victim, "k", "c", 0, 3, "V", 100).unwrap();
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), ids[0]);
    let mut admin = db.connect();
    let killed: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap()
        .get(0);
    assert!(killed);
    assert!(victim.is_closed() || victim.simple_query("SELECT 1").is_err());
    // Its claim and open batch were committed: the slot is taken only once
    // the TTL has passed.
    let mut heir = db.connect();
    assert_eq!(claim(&mut heir, "k", "c", 0, "H", "30 seconds"), None);
    let start = Instant::now();
    let mut epoch = None;
    while epoch.is_none() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
        epoch = claim(&mut heir, "k", "c", 0, "H", "30 seconds");
    }
    assert_eq!(epoch, Some(2));
    let again = recv_slot(&mut heir, "k", "c", 0, 3, "H", 100).unwrap();
    assert_eq!(
        again.iter().map(|m| m.id).collect::<Vec<_>>(),
        ids[0],
        "none lost"
    );
    // Re-reading the open batch and idle polls only read the lease: they
    // hold no row lock, so a claim meanwhile is not turned away.
    assert_eq!(
        poll_locks_nothing(&db, &mut heir, "k", 3, "H"),
        ids[0].len()
    );
    assert_eq!(ack_slot(&mut heir, "k", "c", 0, 3, "H").unwrap(), 1);
    tick(&mut heir, "k");
    assert_eq!(
        recv_slot(&mut heir, "k", "c", 0, 3, "H", 100)
            .unwrap()
            .len(),
        0
    );
    assert_eq!(poll_locks_nothing(&db, &mut heir, "k", 3, "H"), 0);
}

/// receive_partitioned of slot 0 inside a transaction left open while
/// another session re-claims the slot for the same worker: the claim must
/// succeed (same epoch), i.e. the receive holds no lock on the lease row.
/// Returns how many messages the receive gave.
fn poll_locks_nothing(
    db: &TestDb,
    c: &mut pgque_pg_test::postgres::Client,
    q: &str,
    n: i32,
    w: &str,
) -> usize {
    c.batch_execute("BEGIN").unwrap();
    let got = recv_slot(c, q, "c", 0, n, w, 100).unwrap().len();
    let mut other = db.connect();
    let epoch = claim(&mut other, q, "c", 0, w, "30 seconds");
    c.batch_execute("COMMIT").unwrap();
    assert_eq!(epoch, Some(2), "the poll held the lease row");
    got
}

#[test]
fn slots_few_workers_drain_every_slot_and_idle_slots_do_not_pin_rotation() {
    // The worker ticks and runs maint (rotation) meanwhile.
    let db = new_db("slots_cover");
    let mut c = db.connect();
    let n = 8;
    c.batch_execute(
        "SELECT pgque.create_queue('cv'); \
         SELECT pgque.set_queue_config('cv', 'rotation_period', '1 second'); \
         SELECT pgque.subscribe_partitioned('cv', 'c', 8);",
    )
    .unwrap();
    // Keys for slots 0..3 only: slots 4..7 stay idle throughout.
    let mut keys = vec![];
    let mut i = 0;
    while keys.len() < 12 {
        let k = format!("t-{i}");
        if slot_of(&mut c, &k, n) < 4 {
            keys.push(k);
        }
        i += 1;
    }
    let switch0: String = c
        .query_one(
            "SELECT queue_switch_time::text FROM pgque.get_queue_info('cv')",
            &[],
        )
        .unwrap()
        .get(0);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(i32, i64)>::new()));
    let polled = Arc::new(std::sync::Mutex::new(HashSet::<i32>::new()));
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let (name, stop, seen, polled) =
                (db.name.clone(), stop.clone(), seen.clone(), polled.clone());
            std::thread::spawn(move || {
                let mut s = connect_to(&name);
                let me = format!("m{w}");
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let row = s
                        .query_opt(
                            "SELECT slot FROM pgque.claim_next_slot('cv', 'c', $1, '30 seconds')",
                            &[&me],
                        )
                        .unwrap();
                    let Some(row) = row else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let slot: i32 = row.get(0);
                    polled.lock().unwrap().insert(slot);
                    let msgs = recv_slot(&mut s, "cv", "c", slot, 8, &me, 50).unwrap();
                    if !msgs.is_empty() {
                        seen.lock()
                            .unwrap()
                            .extend(msgs.iter().map(|m| (slot, m.id)));
                        assert_eq!(ack_slot(&mut s, "cv", "c", slot, 8, &me).unwrap(), 1);
                    }
                    let released: bool = s
                        .query_one(
                            "SELECT pgque.release_slot('cv', 'c', $1, $2)",
                            &[&slot, &me],
                        )
                        .unwrap()
                        .get(0);
                    assert!(released);
                }
            })
        })
        .collect();
    // A trickle of events over a few rotation periods.
    let mut sent = vec![];
    let start = Instant::now();
    let mut j = 0;
    while start.elapsed() < Duration::from_secs(6) {
        let k = &keys[j % keys.len()];
        let id: i64 = c
            .query_one("SELECT pgque.send('cv', 'ev', 'z'::text, $1)", &[k])
            .unwrap()
            .get(0);
        sent.push(id);
        j += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let all_seen = wait_until(Duration::from_secs(20), || {
        seen.lock().unwrap().len() >= sent.len()
    });
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    assert!(all_seen, "every event delivered");
    let seen = seen.lock().unwrap();
    let ids: Vec<i64> = seen.iter().map(|(_, id)| *id).collect();
    let set: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(ids.len(), set.len(), "exactly once");
    assert_eq!(set, sent.iter().copied().collect::<HashSet<_>>());
    assert_eq!(polled.lock().unwrap().len(), 8, "every slot was polled");
    // Rotation went on although slots 4..7 never had an event.
    let switches = c
        .query_one(
            "SELECT queue_switch_time::text <> $1 FROM pgque.get_queue_info('cv')",
            &[&switch0],
        )
        .unwrap()
        .get::<_, bool>(0);
    assert!(switches, "the queue rotated while idle slots were polled");
    let idle_pos: i64 = i64s(
        &mut c,
        "SELECT min(last_tick) FROM pgque.partition_slot_status WHERE slot >= 4",
    );
    let first_tick: i64 = i64s(&mut c, "SELECT min(sub_start_tick) FROM pgque.subscription");
    assert!(idle_pos > first_tick, "idle slots moved forward");
}

#[test]
fn slots_lease_writes_stay_bounded_under_a_held_xmin() {
    let db = manual_db("slots_xmin");
    setup(&db, "x", 2, 1);
    let mut c = db.connect();
    let mut holder = db.connect();
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pgque.queue;")
        .unwrap();
    assert_eq!(claim(&mut c, "x", "c", 0, "w", "30 seconds"), Some(1));
    pgque_pg_test::flush_stats(&mut c);
    let upd0 = i64s(
        &mut c,
        "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'pgque.partition_slot'::regclass",
    );
    let mut batches = 0;
    for i in 0..150 {
        c.query_one(
            "SELECT pgque.send('x', 'ev', 'x'::text, $1)",
            &[&format!("k{i}")],
        )
        .unwrap();
        tick(&mut c, "x");
        if !recv_slot(&mut c, "x", "c", 0, 2, "w", 100)
            .unwrap()
            .is_empty()
        {
            assert_eq!(ack_slot(&mut c, "x", "c", 0, 2, "w").unwrap(), 1);
            batches += 1;
        }
    }
    assert!(batches > 40, "enough batches on slot 0: {batches}");
    pgque_pg_test::flush_stats(&mut c);
    let upd = i64s(
        &mut c,
        "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'pgque.partition_slot'::regclass",
    ) - upd0;
    // Renewal is written once half the TTL has passed, not per call.
    assert!(upd <= 2, "{upd} lease row updates for {batches} batches");
    // The lease writes there are (claims, renewals) are HOT updates, also
    // while the xmin is held: unindexed columns, pages kept half empty.
    let hot = |c: &mut pgque_pg_test::postgres::Client| -> (i64, i64) {
        let r = c
            .query_one(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables                   WHERE relid = 'pgque.partition_slot'::regclass",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    let (u0, h0) = hot(&mut c);
    for _ in 0..20 {
        assert_eq!(claim(&mut c, "x", "c", 0, "w", "30 seconds"), Some(1));
    }
    pgque_pg_test::flush_stats(&mut c);
    let (u1, h1) = hot(&mut c);
    assert_eq!(u1 - u0, 20, "one update per re-claim");
    assert_eq!(h1 - h0, 20, "all of them HOT");
    holder.batch_execute("COMMIT").unwrap();
}
