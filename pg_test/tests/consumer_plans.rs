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
//! runs the same calls at both sizes under EXPLAIN (ANALYZE, BUFFERS): their
//! execution time and the buffers they touch. A plan bounded by the batch
//! costs the same at both; one that reads what the table holds costs about
//! three times as much at the second size. The buffer counts do not depend
//! on how busy the machine is; the times are lower quartiles of 25 calls.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;

/// Events per tick: 2,000 events/s ticked every 100 ms.
const PER_TICK: i64 = 200;
/// Ticks in 30 s and in 90 s of that stream.
const TICKS_30S: usize = 300;
const TICKS_90S: usize = 900;
/// Timed rounds at each size.
const ROUNDS: usize = 25;
/// The per-call time at the 90 s size may be at most this factor of the 30
/// s one (a plan that reads what the table holds: about 3).
const MAX_RATIO: f64 = 2.0;
/// And the buffers a call touches (index descents get a level deeper).
const MAX_BUFFER_RATIO: f64 = 1.5;

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

/// What one call cost the server: its execution time (ms) and the shared
/// buffers it touched, nested statements included (EXPLAIN ANALYZE of the
/// call; buffer counts do not depend on how busy the machine is), and the
/// rows it returned.
#[derive(Clone, Copy, Default)]
struct Cost {
    ms: f64,
    buffers: f64,
    rows: i64,
}

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost {
            ms: self.ms + o.ms,
            buffers: self.buffers + o.buffers,
            rows: self.rows + o.rows,
        }
    }
}

/// Runs `call` (a SELECT of a consumer function) under EXPLAIN (ANALYZE,
/// BUFFERS): it runs as it would, and its cost is read from the plan.
fn explain(c: &mut Client, call: &str) -> Cost {
    let lines: Vec<String> = c
        .query(&format!("EXPLAIN (ANALYZE, BUFFERS) {call}"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let num = |line: &str, key: &str| -> f64 {
        line.split(key)
            .nth(1)
            .map(|r| {
                r.split(|ch: char| !(ch.is_ascii_digit() || ch == '.'))
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .unwrap_or(0.0)
    };
    // The top node's line, then its Buffers line (before "Planning:").
    let top = &lines[0];
    let buffers = lines
        .iter()
        .take_while(|l| !l.starts_with("Planning"))
        .find(|l| l.trim_start().starts_with("Buffers: shared"))
        .map(|l| num(l, "hit=") + num(l, "read="))
        .unwrap_or(0.0);
    let ms = lines
        .iter()
        .find(|l| l.starts_with("Execution Time:"))
        .map(|l| num(l, "Time: "))
        .expect("an execution time");
    Cost {
        ms,
        buffers,
        rows: num(
            top.split("(actual").nth(1).expect("ANALYZE output"),
            "rows=",
        ) as i64,
    }
}

/// What each path's next batch with its events cost (receive;
/// next_batch_custom + get_batch_events; receive_partitioned of every
/// slot); each batch is then finished. Asserts each got the tick's events.
fn consume(cs: &mut Consumers) -> [Cost; 3] {
    let plain = explain(
        &mut cs.plain,
        "SELECT * FROM pgque.receive('cq', 'c', 1000)",
    );
    assert_eq!(plain.rows, PER_TICK, "plain receive");
    let b: i64 = cs
        .plain
        .query_one(
            "SELECT current_batch FROM pgque.get_consumer_info('cq', 'c')",
            &[],
        )
        .unwrap()
        .get(0);
    cs.plain.execute("SELECT pgque.ack($1)", &[&b]).unwrap();

    const NEXT: &str = "SELECT batch_id FROM pgque.next_batch_custom('cq', 'g', 'sub_0', \
                        '0 ms'::interval, 1, '0 ms'::interval)";
    let opened = explain(&mut cs.coop, NEXT);
    // (the member's open batch comes back as it is)
    let b: i64 = cs
        .coop
        .query_one(NEXT, &[])
        .unwrap()
        .get::<_, Option<i64>>(0)
        .expect("a cooperative batch");
    let read = explain(
        &mut cs.coop,
        &format!("SELECT * FROM pgque.get_batch_events({b})"),
    );
    assert_eq!(read.rows, PER_TICK, "cooperative batch");
    cs.coop
        .execute("SELECT pgque.finish_batch($1)", &[&b])
        .unwrap();
    let coop = opened + read;

    let mut part = Cost::default();
    for k in 0..SLOTS {
        part = part
            + explain(
                &mut cs.part,
                &format!(
                    "SELECT * FROM pgque.receive_partitioned('cq', 'p', {k}, {SLOTS}, 'w', 1000)"
                ),
            );
    }
    assert_eq!(part.rows, PER_TICK, "partitioned receive over all slots");
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

/// The `q` quantile of `v`.
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// `n` rounds of send, tick, consume; per path, the lower quartile of the
/// calls' times (the machine is shared: a busy moment makes single calls
/// slow, never fast) and the median of their buffers.
fn rounds(p: &mut Client, cs: &mut Consumers, n: usize) -> [(f64, f64); 3] {
    let mut costs: [Vec<Cost>; 3] = [vec![], vec![], vec![]];
    for _ in 0..n {
        send_and_tick(p);
        let t = consume(cs);
        for i in 0..3 {
            costs[i].push(t[i]);
        }
    }
    costs.map(|v| {
        (
            quantile(v.iter().map(|c| c.ms).collect(), 0.25),
            quantile(v.iter().map(|c| c.buffers).collect(), 0.5),
        )
    })
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
    // Nothing analyzed the event queue's tables meanwhile: the plans are the
    // fresh ones. (The job sweeps analyze the job tables: not these.)
    let analyzed: i64 = p
        .query_one(
            "SELECT count(*) FROM pg_stat_user_tables \
              WHERE schemaname = 'pgque' AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL) \
                AND (relname LIKE 'event\\_%' OR relname LIKE 'tick%' OR relname LIKE 'batch%' \
                     OR relname IN ('queue', 'subscription', 'partition_slot', 'retry_queue', 'meta_state'))",
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
        let ((ms30, buf30), (ms90, buf90)) = (at_30s[i], at_90s[i]);
        eprintln!(
            "{path}: {ms30:.2} ms, {buf30} buffers at the 30 s size; \
             {ms90:.2} ms, {buf90} buffers at the 90 s size"
        );
        assert!(
            ms90 <= MAX_RATIO * ms30,
            "{path} slowed down as the tables grew: {ms30:.2} ms -> {ms90:.2} ms"
        );
        assert!(
            buf90 <= MAX_BUFFER_RATIO * buf30,
            "{path} reads more as the tables grew: {buf30} -> {buf90} buffers a call"
        );
    }
}

/// Buffers one call touches (its EXPLAIN (ANALYZE, BUFFERS), nested
/// statements included).
fn buffers(c: &mut Client, call: &str) -> f64 {
    explain(c, call).buffers
}

/// One round of the lookup test: a tick of PER_LOOKUP events, then the plain
/// consumer's receive + ack and each slot's receive + ack + release + claim.
/// With `measure`, the buffers of each kind of call, summed over the slots.
fn lookup_round(p: &mut Client, c: &mut Client, measure: bool) -> [f64; 7] {
    const PER_LOOKUP: i64 = 20;
    p.execute(
        "SELECT pgque.send_batch('lq', 'e', array(SELECT '{}'::jsonb FROM generate_series(1, $1::int8)), \
                array(SELECT (i % 7)::text FROM generate_series(1, $1::int8) i))",
        &[&PER_LOOKUP],
    )
    .unwrap();
    p.query_one("SELECT pgque.force_tick('lq')", &[]).unwrap();
    let run = |c: &mut Client, call: &str| -> f64 {
        if measure {
            buffers(c, call)
        } else {
            c.batch_execute(call).unwrap();
            0.0
        }
    };
    let mut out = [0.0; 7];
    out[0] = run(c, "SELECT * FROM pgque.receive('lq', 'c', 1000)");
    let b: i64 = c
        .query_one(
            "SELECT current_batch FROM pgque.get_consumer_info('lq', 'c')",
            &[],
        )
        .unwrap()
        .get(0);
    out[1] = run(c, &format!("SELECT pgque.ack({b})"));
    for k in 0..SLOTS {
        out[2] += run(
            c,
            &format!("SELECT * FROM pgque.receive_partitioned('lq', 'p', {k}, {SLOTS}, 'w', 1000)"),
        );
        out[3] += run(
            c,
            &format!("SELECT pgque.ack_partitioned('lq', 'p', {k}, {SLOTS}, 'w')"),
        );
        out[4] += run(
            c,
            &format!("SELECT pgque.release_slot('lq', 'p', {k}, 'w')"),
        );
        out[5] += run(
            c,
            &format!("SELECT pgque.claim_slot('lq', 'p', {k}, 'w', '1 hour')"),
        );
    }
    out[6] = run(c, "SELECT * FROM pgque.claim_next_slot('lq', 'p', 'w2')");
    out
}

/// The batch lookups of every consumer call (an open batch, the frontier
/// batch, a batch by id) stay one index probe whatever the batch history
/// holds. The planner, once it has statistics, liked to answer "is this
/// batch done" by hashing every id in batch_done (all the batches since the
/// last metadata rotation), which made ack_partitioned, release_slot and
/// receive_partitioned cost ~1 ms and ~350 buffers each after 30 s at 5,000
/// events/s. Here: a history of batches, ANALYZE, fresh sessions (plans made
/// with those statistics), then the calls' buffers at two history sizes.
#[test]
fn batch_lookups_do_not_read_the_batch_history() {
    let cl = Cluster::start_new("batch_lookups", "autovacuum = off");
    let mut p = cl.create_db("batch_lookups");
    stop_worker(&mut p);
    p.batch_execute(
        "SELECT pgque.create_queue('lq'); \
         SELECT pgque.subscribe('lq', 'c'); \
         SELECT pgque.subscribe_partitioned('lq', 'p', 2); \
         SELECT pgque.claim_slot('lq', 'p', 0, 'w', '1 hour'); \
         SELECT pgque.claim_slot('lq', 'p', 1, 'w', '1 hour')",
    )
    .unwrap();
    let mut c = cl.connect("batch_lookups");
    for _ in 0..300 {
        lookup_round(&mut p, &mut c, false);
    }
    p.batch_execute("ANALYZE").unwrap();
    let mut c = cl.connect("batch_lookups");
    let measure = |p: &mut Client, c: &mut Client| -> Vec<f64> {
        let rounds: Vec<[f64; 7]> = (0..9).map(|_| lookup_round(p, c, true)).collect();
        (0..7)
            .map(|i| quantile(rounds.iter().map(|r| r[i]).collect(), 0.5))
            .collect()
    };
    measure(&mut p, &mut c); // plans made (and kept) now
    let small = measure(&mut p, &mut c);
    for _ in 0..900 {
        lookup_round(&mut p, &mut c, false);
    }
    let big = measure(&mut p, &mut c);
    let done: i64 = p
        .query_one("SELECT count(*) FROM pgque.batch_done", &[])
        .unwrap()
        .get(0);
    assert!(
        done > 3000,
        "a batch history to read: {done} finished batches"
    );
    for (i, call) in [
        "receive",
        "ack",
        "receive_partitioned",
        "ack_partitioned",
        "release_slot",
        "claim_slot",
        "claim_next_slot",
    ]
    .iter()
    .enumerate()
    {
        eprintln!(
            "{call}: {} buffers at the first size, {} with {done} finished batches",
            small[i], big[i]
        );
        assert!(
            big[i] <= MAX_BUFFER_RATIO * small[i].max(10.0),
            "{call} reads the batch history: {} -> {} buffers a call",
            small[i],
            big[i]
        );
    }
}
