//! Draining one tick interval that holds many more events than a batch
//! (a ticker outage, a huge producer transaction): every event exactly once
//! and in id order, for a plain consumer, one that starts far behind,
//! partition slots and cooperative members; and each cut reads about its
//! own events, not the whole interval again (counted with the transaction's
//! own table statistics, pg_stat_xact_user_tables).
mod events_util;
use events_util::*;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::TestDb;
use std::cell::Cell;

const N_SLOTS: i32 = 4;

thread_local! {
    /// Scans of an event table by the receives `counted` saw since the last
    /// `take_scans`: (TID range scans, TID scans).
    static SCANS: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

fn take_scans() -> (usize, usize) {
    SCANS.with(|s| s.replace((0, 0)))
}

/// One receive in its own transaction: (batch id, ids, event rows its
/// statements read, when the session's plans are collected).
fn counted(
    c: &mut Client,
    qid: i32,
    plans: Option<&Plans>,
    sql: &str,
) -> (Option<i64>, Vec<i64>, i64) {
    if let Some(p) = plans {
        p.lock().unwrap().clear();
    }
    let rows = c.query(sql, &[]).unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.get("msg_id")).collect();
    let batch = rows.first().map(|r| r.get::<_, i64>("batch_id"));
    let read = plans.map_or(0, |p| {
        rows_read_from(&p.lock().unwrap(), &format!(" on event_{qid}_"))
    });
    if let Some(p) = plans {
        let on = |kind: &str| {
            let key = format!("{kind} on event_{qid}_");
            p.lock()
                .unwrap()
                .iter()
                .map(|plan| plan.matches(&key).count())
                .sum::<usize>()
        };
        let (range, list) = (on("Tid Range Scan"), on("Tid Scan"));
        SCANS.with(|s| {
            let (r, l) = s.get();
            s.set((r + range, l + list));
        });
    }
    if read > 2 * ids.len() as i64 + 16 {
        // shown when the test fails
        println!(
            "{sql}: read {read} event rows for {} events; plans:",
            ids.len()
        );
        for p in plans.unwrap().lock().unwrap().iter() {
            println!("{p}");
        }
    }
    (batch, ids, read)
}

/// The queue with `n` events in one interval: a big keyed send_batch, many
/// small transactions, and two transactions interleaved with each other (so
/// id order and transaction order differ), all before one tick. Returns the
/// queue id and the interval's ids in order.
fn one_big_interval(db: &TestDb, c: &mut Client, n: i64) -> (i32, Vec<i64>) {
    c.batch_execute("SELECT pgque.create_queue('q')").unwrap();
    let qid = queue_id(c, "q");
    c.batch_execute(&format!(
        "SELECT pgque.subscribe('q', 'p'); \
         SELECT pgque.subscribe('q', 'p100'); \
         SELECT pgque.subscribe('q', 'p500'); \
         SELECT pgque.subscribe('q', 'behind'); \
         SELECT pgque.subscribe_partitioned('q', 'ps', {N_SLOTS}); \
         SELECT pgque.subscribe('q', 'co'); \
         SELECT pgque.register_subconsumer('q', 'co', 'm1', convert_normal => true); \
         SELECT pgque.register_subconsumer('q', 'co', 'm2');"
    ))
    .unwrap();
    // History first: 'behind' starts 20 ticks back.
    for _ in 0..20 {
        c.execute(
            "SELECT pgque.send_batch('q', 'h', array_fill('{}'::jsonb, ARRAY[50]), \
                    ARRAY(SELECT 'k' || g FROM generate_series(1, 50) g))",
            &[],
        )
        .unwrap();
        tick(c, "q");
    }
    for (consumer, slot) in [("p", None), ("p100", None), ("p500", None), ("co", None)]
        .into_iter()
        .chain((0..N_SLOTS).map(|k| ("ps", Some(k))))
    {
        drain_all(c, None, consumer, slot, 1000, &mut |_, _| {});
    }
    // The big interval.
    let quarter = n / 4;
    let mut other = db.connect();
    other.batch_execute("BEGIN").unwrap();
    other
        .execute(
            "SELECT pgque.send_batch('q', 'x', ARRAY(SELECT jsonb_build_object('i', g) FROM generate_series(1, $1::int4) g), \
                    ARRAY(SELECT 'k' || (g % 97) FROM generate_series(1, $1::int4) g))",
            &[&(quarter as i32)],
        )
        .unwrap();
    for _ in 0..(quarter / 25) {
        c.execute(
            "SELECT pgque.send_batch('q', 'x', array_fill('{\"s\":1}'::jsonb, ARRAY[25]), \
                    ARRAY(SELECT 'k' || (g % 13) FROM generate_series(1, 25) g))",
            &[],
        )
        .unwrap();
    }
    other
        .execute(
            "SELECT pgque.send_batch('q', 'x', ARRAY(SELECT jsonb_build_object('j', g) FROM generate_series(1, $1::int4) g), \
                    ARRAY(SELECT 'k' || (g % 89) FROM generate_series(1, $1::int4) g))",
            &[&(quarter as i32)],
        )
        .unwrap();
    other.batch_execute("COMMIT").unwrap();
    c.execute(
        "SELECT pgque.send_batch('q', 'x', ARRAY(SELECT jsonb_build_object('l', g) FROM generate_series(1, $1::int4) g), \
                ARRAY(SELECT 'k' || (g % 7) FROM generate_series(1, $1::int4) g))",
        &[&((n - 3 * quarter) as i32)],
    )
    .unwrap();
    let first: i64 = c
        .query_one(
            &format!("SELECT min(ev_id) FROM pgque.event_{qid} WHERE ev_type = 'x'"),
            &[],
        )
        .unwrap()
        .get(0);
    tick(c, "q");
    let ids: Vec<i64> = c
        .query(
            &format!("SELECT ev_id FROM pgque.event_{qid} WHERE ev_id >= $1 ORDER BY ev_id"),
            &[&first],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids.len() as i64, n, "the interval holds the events sent");
    (qid, ids)
}

/// The receive call of a consumer (plain, or slot `slot` of 'ps', or the
/// cooperative member `m1`/`m2` chosen by the caller in `consumer`).
fn receive_sql(consumer: &str, slot: Option<i32>, max: i32) -> String {
    match (consumer, slot) {
        (_, Some(k)) => format!(
            "SELECT msg_id, batch_id, extra1 FROM pgque.receive_partitioned('q', 'ps', {k}, {N_SLOTS}, 'w', {max})"
        ),
        ("m1" | "m2", None) => format!(
            "SELECT msg_id, batch_id, extra1 FROM pgque.receive_coop('q', 'co', '{consumer}', {max})"
        ),
        ("co", None) => unreachable!("a cooperative consumer receives through a member"),
        (_, None) => {
            format!("SELECT msg_id, batch_id, extra1 FROM pgque.receive('q', '{consumer}', {max})")
        }
    }
}

fn ack_sql(slot: Option<i32>, batch: i64) -> String {
    match slot {
        Some(k) => format!("SELECT pgque.ack_partitioned('q', 'ps', {k}, {N_SLOTS}, 'w')"),
        None => format!("SELECT pgque.ack({batch})"),
    }
}

/// Receives and acks until empty; `each` sees every batch's ids and rows
/// read. A cooperative consumer ('co') alternates its two members.
fn drain_all(
    c: &mut Client,
    plans: Option<&Plans>,
    consumer: &str,
    slot: Option<i32>,
    max: i32,
    each: &mut dyn FnMut(&[i64], i64),
) -> Vec<i64> {
    if let Some(k) = slot {
        let e: Option<i64> = c
            .query_one(
                "SELECT pgque.claim_slot('q', 'ps', $1, 'w', '10 minutes')",
                &[&k],
            )
            .unwrap()
            .get(0);
        assert!(e.is_some(), "slot {k} claimed");
    }
    let qid = queue_id(c, "q");
    let mut all = vec![];
    for turn in 0.. {
        let who = match consumer {
            "co" if turn % 2 == 0 => "m1",
            "co" => "m2",
            other => other,
        };
        let (b, ids, read) = counted(c, qid, plans, &receive_sql(who, slot, max));
        let Some(b) = b else {
            return all;
        };
        assert!(ids.len() as i32 <= max, "a batch holds at most max_return");
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a batch is in id order"
        );
        each(&ids, read);
        all.extend(ids);
        c.execute(&ack_sql(slot, b), &[]).unwrap();
    }
    unreachable!()
}

fn exactly_once_in_order(got: &[i64], want: &[i64], who: &str) {
    assert_eq!(got.len(), want.len(), "{who}: every event, none twice");
    assert_eq!(got, want, "{who}: the interval's events in id order");
}

#[test]
fn big_interval_events_once_in_order_plain_behind_slots_coop() {
    let db = manual_db("ev_big_order");
    let mut c = db.connect();
    let n = 6000;
    let (qid, ids) = one_big_interval(&db, &mut c, n);

    let got = drain_all(&mut c, None, "p", None, 250, &mut |_, _| {});
    exactly_once_in_order(&got, &ids, "plain consumer");

    // 'behind' first reads the 20 history ticks, then the interval's cuts.
    let got = drain_all(&mut c, None, "behind", None, 250, &mut |_, _| {});
    assert_eq!(
        got.len() as i64,
        20 * 50 + n,
        "behind: history and interval"
    );
    assert!(got.windows(2).all(|w| w[0] < w[1]), "behind: in id order");
    exactly_once_in_order(&got[1000..], &ids, "consumer starting far behind");

    // Slots: each its own events in id order, together all of them once.
    let mut union = vec![];
    for k in 0..N_SLOTS {
        let got = drain_all(&mut c, None, "ps", Some(k), 200, &mut |_, _| {});
        assert!(got.windows(2).all(|w| w[0] < w[1]), "slot {k}: id order");
        let keys: Vec<i32> = c
            .query(
                &format!(
                    "SELECT pgque.partition_slot(ev_extra1, {N_SLOTS}) FROM pgque.event_{qid} \
                      WHERE ev_id = ANY($1) AND ev_type = 'x'"
                ),
                &[&got],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(keys.len(), got.len());
        assert!(keys.iter().all(|s| *s == k), "slot {k}: only its keys");
        assert!(
            got.len() > 250,
            "slot {k} gets several cuts of the interval"
        );
        union.extend(got);
    }
    union.sort_unstable();
    exactly_once_in_order(&union, &ids, "partition slots together");

    // Cooperative members: m1 opens a cut and goes silent, m2 takes it over
    // (a re-read of a cut batch), then they alternate.
    let (b1, taken, _) = counted(&mut c, qid, None, &receive_sql("m1", None, 300));
    assert_eq!(taken.len(), 300);
    let over = c
        .query(
            "SELECT msg_id, batch_id FROM pgque.receive_coop('q', 'co', 'm2', 300, '0 seconds')",
            &[],
        )
        .unwrap();
    let over_ids: Vec<i64> = over.iter().map(|r| r.get(0)).collect();
    assert_eq!(over_ids, taken, "the taken-over cut holds the same events");
    let b2: i64 = over[0].get(1);
    assert_ne!(Some(b2), b1);
    c.execute(&format!("SELECT pgque.ack({b2})"), &[]).unwrap();
    let mut got = taken;
    got.extend(drain_all(&mut c, None, "co", None, 300, &mut |_, _| {}));
    exactly_once_in_order(&got, &ids, "cooperative members");

    // Nothing left for anyone.
    assert_eq!(recv(&mut c, "q", "p", 250), (None, vec![]));
}

#[test]
fn big_interval_events_cut_reads_bounded_rows() {
    let db = manual_db("ev_big_cost");
    let mut c = db.connect();
    let n = 6000;
    let (_, ids) = one_big_interval(&db, &mut c, n);
    let (mut e, plans) = explained(&db);
    // Each cut after the first (which reads the interval once to store the
    // cuts) reads at most a small multiple of its own events; reading the
    // interval again for every cut reads all n.
    let check = |who: &str, max: i32, reads: &[(usize, i64)]| {
        assert!(reads.len() > 5, "{who}: several cuts");
        let total: i64 = reads.iter().map(|r| r.1).sum();
        for (i, (len, read)) in reads.iter().enumerate().skip(1) {
            assert!(
                *read <= 2 * *len as i64 + 16,
                "{who}: cut {i} of {len} events read {read} event rows (max_return {max})"
            );
        }
        assert!(
            total <= 3 * n,
            "{who}: the whole drain read {total} event rows for {n} events"
        );
    };
    let mut reads = vec![];
    let got = drain_all(&mut e, Some(&plans), "p", None, 250, &mut |ids, r| {
        reads.push((ids.len(), r))
    });
    exactly_once_in_order(&got, &ids, "plain");
    check("plain consumer", 250, &reads);
    // The interval's events fill their pages: its cuts read page ranges.
    let (range, list) = take_scans();
    assert!(
        range >= reads.len() - 2 && list <= 2,
        "plain consumer: {range} TID range scans, {list} TID scans for {} cuts",
        reads.len()
    );

    // the batch sizes of the one-interval benchmark (w10: 100 and 500)
    for (consumer, max) in [("p100", 100), ("p500", 500)] {
        let mut reads = vec![];
        let got = drain_all(&mut e, Some(&plans), consumer, None, max, &mut |ids, r| {
            reads.push((ids.len(), r))
        });
        exactly_once_in_order(&got, &ids, consumer);
        check(consumer, max, &reads);
    }

    let mut reads = vec![];
    take_scans();
    drain_all(&mut e, Some(&plans), "ps", Some(1), 100, &mut |ids, r| {
        reads.push((ids.len(), r))
    });
    check("partition slot", 100, &reads);
    // A slot's events are a quarter of every page's: never a page range.
    let (range, _) = take_scans();
    assert_eq!(range, 0, "partition slot: TID range scans");

    let mut reads = vec![];
    let got = drain_all(&mut e, Some(&plans), "co", None, 250, &mut |ids, r| {
        reads.push((ids.len(), r))
    });
    exactly_once_in_order(&got, &ids, "cooperative");
    check("cooperative members", 250, &reads);
    let stored: i64 = c
        .query_one("SELECT count(*) FROM pgque.batch_cut", &[])
        .unwrap()
        .get(0);
    assert!(stored > 0, "the cuts were stored");
}

/// The cut store is unlogged: a crash empties it. A consumer in the middle
/// of a big interval gets its open batch again after crash recovery (the
/// same events, read by txid up to the batch's ceiling), then the rest of
/// the interval once and in order, the cuts built again.
#[test]
fn big_interval_after_a_crash_emptied_the_cut_store() {
    let (cl, mut c) = private_db("ev_big_crash", true);
    c.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'p')")
        .unwrap();
    assert_eq!(drain(&mut c, "q", "p", 1000), Vec::<i64>::new());
    for _ in 0..3 {
        c.execute(
            "SELECT pgque.send_batch('q', 'x', ARRAY(SELECT jsonb_build_object('i', g) FROM generate_series(1, 1000) g))",
            &[],
        )
        .unwrap();
    }
    tick(&mut c, "q");
    let stored = |c: &mut Client| -> i64 {
        c.query_one("SELECT count(*) FROM pgque.batch_cut", &[])
            .unwrap()
            .get(0)
    };
    let (b1, mut got) = recv(&mut c, "q", "p", 250);
    assert_eq!(got.len(), 250, "a cut of max_return events");
    ack(&mut c, b1.unwrap());
    let (b2, open) = recv(&mut c, "q", "p", 250);
    assert_eq!(open.len(), 250);
    assert!(stored(&mut c) > 0, "the interval's cuts were stored");

    cl.stop_immediate();
    cl.start();
    let mut c = cl.connect("ev_big_crash");
    assert_eq!(
        stored(&mut c),
        0,
        "crash recovery empties the unlogged cut store"
    );
    let (again, ids) = recv(&mut c, "q", "p", 250);
    assert_eq!(again, b2, "the open batch is handed out again");
    assert_eq!(ids, open, "with the same events");
    got.extend(ids);
    ack(&mut c, again.unwrap());
    let (b3, ids) = recv(&mut c, "q", "p", 250);
    assert_eq!(ids.len(), 250);
    assert!(
        stored(&mut c) > 0,
        "the rest of the interval is cut from a new store"
    );
    got.extend(ids);
    ack(&mut c, b3.unwrap());
    loop {
        let (b, ids) = recv(&mut c, "q", "p", 250);
        let Some(b) = b else { break };
        got.extend(ids);
        ack(&mut c, b);
    }
    let qid = queue_id(&mut c, "q");
    let want: Vec<i64> = c
        .query(
            &format!("SELECT ev_id FROM pgque.event_{qid} ORDER BY ev_id"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(want.len(), 3000);
    exactly_once_in_order(&got, &want, "after the crash");
}
