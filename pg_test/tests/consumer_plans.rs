//! Consumers keep their speed on a fresh database as its tables grow
//! (issue #30 item 4).
//!
//! pgque's consumer functions run their statements with kept generic plans
//! (plan_cache_mode = force_generic_plan, enable_seqscan = off), planned once
//! per backend at the first call. On a fresh database that first call sees
//! nearly empty tables and no statistics, and the plan lives until the
//! backend ends. A plan that reaches the events through a one-sided index
//! range (every event older than the batch) is cheap there and gets slower
//! with every event sent: cooperative next_batch_custom went from 2.6 to 29
//! ms over 30 s at 2,000 events/s until the first ANALYZE.
//!
//! The test reproduces the fresh database (a private cluster with autovacuum
//! off, so no ANALYZE ever runs), plans every consumer path on nearly empty
//! tables, then fills the queue as 30 s and then 90 s of a 2,000 events/s
//! stream would (one tick per 200 events, every consumer caught up after each
//! tick: the event tables, ticks and batches all grow as they would), and
//! times the same calls at both sizes. A plan bounded by the batch costs the
//! same at both; one that reads what the table holds costs about three times
//! as much at the second size.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::time::Instant;

/// Events per tick: 2,000 events/s ticked every 100 ms.
const PER_TICK: i64 = 200;
/// Ticks in 30 s and in 90 s of that stream.
const TICKS_30S: usize = 300;
const TICKS_90S: usize = 900;
/// Timed rounds at each size.
const ROUNDS: usize = 25;
/// The per-call time at the 90 s size may be at most this factor of the 30 s one.
const MAX_RATIO: f64 = 1.6;

const SLOTS: i32 = 2;

/// One batch of PER_TICK keyed events, committed, then a tick.
fn send_and_tick(p: &mut Client) {
    p.execute(
        "SELECT pgque.send_batch('cq', 'bench', \
                array(SELECT '{\"created_at\": \"' || clock_timestamp() || '\", \"pad\": \"' || repeat('x', 120) || '\"}' \
                        FROM generate_series(1, $1::int8)), \
                array(SELECT (i % 13)::text FROM generate_series(1, $1::int8) i))",
        &[&PER_TICK],
    )
    .unwrap();
    p.query_one("SELECT pgque.force_tick('cq')", &[]).unwrap();
}

/// The three consumer paths, each on its own connection (its own kept plans).
struct Consumers {
    plain: Client,
    coop: Client,
    part: Client,
}

/// Milliseconds each path took to take its next batch with its events
/// (receive; next_batch_custom + get_batch_events; receive_partitioned);
/// each batch is then finished. Asserts each got the tick's events.
fn consume(cs: &mut Consumers) -> [f64; 3] {
    let t = Instant::now();
    let rows = cs
        .plain
        .query("SELECT batch_id FROM pgque.receive('cq', 'c', 1000)", &[])
        .unwrap();
    let plain = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(rows.len() as i64, PER_TICK, "plain receive");
    let b: i64 = rows[0].get(0);
    cs.plain.execute("SELECT pgque.ack($1)", &[&b]).unwrap();

    let t = Instant::now();
    let b: i64 = cs
        .coop
        .query_one(
            "SELECT batch_id FROM pgque.next_batch_custom('cq', 'g', 'sub_0', \
                    '0 ms'::interval, 1, '0 ms'::interval)",
            &[],
        )
        .unwrap()
        .get::<_, Option<i64>>(0)
        .expect("a cooperative batch");
    let n: i64 = cs
        .coop
        .query_one("SELECT count(*) FROM pgque.get_batch_events($1)", &[&b])
        .unwrap()
        .get(0);
    let coop = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(n, PER_TICK, "cooperative batch");
    cs.coop
        .execute("SELECT pgque.finish_batch($1)", &[&b])
        .unwrap();

    let t = Instant::now();
    let mut got = 0;
    for k in 0..SLOTS {
        got += cs
            .part
            .query(
                "SELECT 1 FROM pgque.receive_partitioned('cq', 'p', $1, $2, 'w', 1000)",
                &[&k, &SLOTS],
            )
            .unwrap()
            .len() as i64;
    }
    let part = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(got, PER_TICK, "partitioned receive over all slots");
    for k in 0..SLOTS {
        cs.part
            .query_one(
                "SELECT pgque.ack_partitioned('cq', 'p', $1, $2, 'w')",
                &[&k, &SLOTS],
            )
            .unwrap();
    }
    [plain, coop, part]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// `n` rounds of send, tick, consume; the per-path medians when `timed`.
fn rounds(p: &mut Client, cs: &mut Consumers, n: usize) -> [f64; 3] {
    let mut times: [Vec<f64>; 3] = [vec![], vec![], vec![]];
    for _ in 0..n {
        send_and_tick(p);
        let t = consume(cs);
        for i in 0..3 {
            times[i].push(t[i]);
        }
    }
    times.map(median)
}

#[test]
fn consumer_calls_keep_their_speed_as_a_fresh_database_grows() {
    // A fresh database that nothing analyzes: autovacuum off.
    let cl = Cluster::start_new("consumer_plans", "autovacuum = off");
    let mut p = cl.create_db("consumer_plans");
    stop_worker(&mut p);
    p.batch_execute(
        "SELECT pgque.create_queue('cq'); \
         SELECT pgque.subscribe('cq', 'c'); \
         SELECT pgque.register_subconsumer('cq', 'g', 'sub_0'); \
         SELECT pgque.subscribe_partitioned('cq', 'p', 2); \
         SELECT pgque.claim_slot('cq', 'p', 0, 'w', '1 hour'); \
         SELECT pgque.claim_slot('cq', 'p', 1, 'w', '1 hour')",
    )
    .unwrap();
    let mut cs = Consumers {
        plain: cl.connect("consumer_plans"),
        coop: cl.connect("consumer_plans"),
        part: cl.connect("consumer_plans"),
    };
    // The first calls plan every statement on nearly empty tables.
    rounds(&mut p, &mut cs, 3);
    // 30 s of the stream, then the calls at that size.
    rounds(&mut p, &mut cs, TICKS_30S - 3 - ROUNDS);
    let at_30s = rounds(&mut p, &mut cs, ROUNDS);
    // On to 90 s, and the same calls again.
    rounds(&mut p, &mut cs, TICKS_90S - TICKS_30S - ROUNDS);
    let at_90s = rounds(&mut p, &mut cs, ROUNDS);
    // Nothing analyzed the tables meanwhile: the plans are the fresh ones.
    let analyzed: i64 = p
        .query_one(
            "SELECT count(*) FROM pg_stat_user_tables \
              WHERE schemaname = 'pgque' AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(analyzed, 0);
    let events: i64 = p
        .query_one("SELECT count(*) FROM pgque.event_1", &[])
        .unwrap()
        .get(0);
    assert_eq!(events, TICKS_90S as i64 * PER_TICK);
    for (i, path) in [
        "receive",
        "next_batch_custom + get_batch_events",
        "receive_partitioned",
    ]
    .iter()
    .enumerate()
    {
        let ratio = at_90s[i] / at_30s[i];
        eprintln!(
            "{path}: {:.2} ms at the 30 s size, {:.2} ms at the 90 s size (x{ratio:.2})",
            at_30s[i], at_90s[i]
        );
        assert!(
            ratio <= MAX_RATIO,
            "{path} slowed down as the tables grew: {:.2} ms -> {:.2} ms (x{ratio:.2})",
            at_30s[i],
            at_90s[i]
        );
    }
}
