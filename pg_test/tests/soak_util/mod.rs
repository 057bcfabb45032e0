//! A steady produce/consume load on one event queue and one job queue, run
//! in phases (clean, with a REPEATABLE READ snapshot held open, recovery),
//! with throughput, call latency and dead tuples per pgque table measured at
//! the end of each phase. Used by the `make soak` run (tests/soak.rs) and by
//! its short version (tests/held_xmin.rs).
#![allow(dead_code)]
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Offered load: events and jobs per second.
#[derive(Clone, Copy, Debug)]
pub struct Rates {
    pub events: u64,
    pub jobs: u64,
}

#[derive(Default)]
pub struct Counters {
    pub events_sent: AtomicU64,
    pub events_acked: AtomicU64,
    pub jobs_enqueued: AtomicU64,
    pub jobs_completed: AtomicU64,
    pub recv_us: AtomicU64,
    pub recv_calls: AtomicU64,
    pub dispatch_us: AtomicU64,
    pub dispatch_calls: AtomicU64,
    pub errors: AtomicU64,
}

impl Counters {
    fn snap(&self) -> [u64; 8] {
        [
            self.events_sent.load(Relaxed),
            self.events_acked.load(Relaxed),
            self.jobs_enqueued.load(Relaxed),
            self.jobs_completed.load(Relaxed),
            self.recv_us.load(Relaxed),
            self.recv_calls.load(Relaxed),
            self.dispatch_us.load(Relaxed),
            self.dispatch_calls.load(Relaxed),
        ]
    }
}

/// One pgque table's tuple counts.
#[derive(Clone, Debug)]
pub struct TableStat {
    pub live: i64,
    pub dead: i64,
}

/// What one phase measured.
#[derive(Clone, Debug)]
pub struct Phase {
    pub name: String,
    pub secs: f64,
    pub events_sent_s: f64,
    pub events_acked_s: f64,
    pub jobs_enqueued_s: f64,
    pub jobs_completed_s: f64,
    pub recv_ms: f64,
    pub dispatch_ms: f64,
    pub tables: BTreeMap<String, TableStat>,
}

pub struct Load {
    stop: Arc<AtomicBool>,
    pub counters: Arc<Counters>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

pub const SETUP: &str = "SELECT pgque.create_queue('sq'); SELECT pgque.subscribe('sq', 'c'); \
    SELECT pgque.set_queue_config('sq', 'rotation_period', '20 seconds'); \
    SELECT pgque.create_job_queue('sj')";

fn paced(stop: &AtomicBool, period: Duration, mut f: impl FnMut()) {
    let mut next = Instant::now();
    while !stop.load(Relaxed) {
        f();
        next += period;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
}

impl Load {
    /// Starts the load: an event producer and consumer, a job producer and
    /// two job workers, each on its own connection from `connect`.
    pub fn start(connect: &dyn Fn() -> Client, rates: Rates) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let k = Arc::new(Counters::default());
        let mut threads = vec![];
        // 10 transactions a second per producer.
        let per_ev = rates.events.div_ceil(10) as i32;
        let per_job = rates.jobs.div_ceil(10) as i32;
        {
            let (mut c, s, k) = (connect(), stop.clone(), k.clone());
            threads.push(std::thread::spawn(move || {
                paced(&s, Duration::from_millis(100), || {
                    match c.query_one(
                        "SELECT cardinality(pgque.send_batch('sq', array_fill('{\"x\":1}'::text, ARRAY[$1::int])))",
                        &[&per_ev],
                    ) {
                        Ok(r) => k.events_sent.fetch_add(r.get::<_, i32>(0) as u64, Relaxed),
                        Err(_) => k.errors.fetch_add(1, Relaxed),
                    };
                })
            }));
        }
        {
            let (mut c, s, k) = (connect(), stop.clone(), k.clone());
            threads.push(std::thread::spawn(move || {
                while !s.load(Relaxed) {
                    let t = Instant::now();
                    let rows =
                        match c.query("SELECT batch_id FROM pgque.receive('sq', 'c', 1000)", &[]) {
                            Ok(r) => r,
                            Err(_) => {
                                k.errors.fetch_add(1, Relaxed);
                                std::thread::sleep(Duration::from_millis(100));
                                continue;
                            }
                        };
                    k.recv_us.fetch_add(t.elapsed().as_micros() as u64, Relaxed);
                    k.recv_calls.fetch_add(1, Relaxed);
                    match rows.first() {
                        Some(r) => {
                            let b: i64 = r.get(0);
                            if c.query_one("SELECT pgque.ack($1)", &[&b]).is_ok() {
                                k.events_acked.fetch_add(rows.len() as u64, Relaxed);
                            } else {
                                k.errors.fetch_add(1, Relaxed);
                            }
                        }
                        None => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            }));
        }
        {
            let (mut c, s, k) = (connect(), stop.clone(), k.clone());
            threads.push(std::thread::spawn(move || {
                paced(&s, Duration::from_millis(100), || {
                    match c.query_one(
                        "SELECT count(*) FROM pgque.enqueue_ready_rows('sj', array_fill('k'::text, ARRAY[$1::int]), \
                                array_fill('{\"a\":1}'::jsonb, ARRAY[$1::int]))",
                        &[&per_job],
                    ) {
                        Ok(r) => k.jobs_enqueued.fetch_add(r.get::<_, i64>(0) as u64, Relaxed),
                        Err(_) => k.errors.fetch_add(1, Relaxed),
                    };
                })
            }));
        }
        for w in 0..2 {
            let (mut c, s, k) = (connect(), stop.clone(), k.clone());
            let worker = format!("w{w}");
            threads.push(std::thread::spawn(move || {
                while !s.load(Relaxed) {
                    let t = Instant::now();
                    let rows = match c.query(
                        "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['sj'], 50, $1, '1 minute')",
                        &[&worker],
                    ) {
                        Ok(r) => r,
                        Err(_) => {
                            k.errors.fetch_add(1, Relaxed);
                            std::thread::sleep(Duration::from_millis(100));
                            continue;
                        }
                    };
                    k.dispatch_us.fetch_add(t.elapsed().as_micros() as u64, Relaxed);
                    k.dispatch_calls.fetch_add(1, Relaxed);
                    if rows.is_empty() {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                    let toks: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
                    match c.query_one("SELECT pgque.complete_many($1, $2)", &[&ids, &toks]) {
                        Ok(r) => k.jobs_completed.fetch_add(r.get::<_, i32>(0) as u64, Relaxed),
                        Err(_) => k.errors.fetch_add(1, Relaxed),
                    };
                }
            }));
        }
        Load {
            stop,
            counters: k,
            threads,
        }
    }

    /// Runs for `d`, then measures: rates over the phase and tuple counts.
    pub fn phase(&self, stats: &mut Client, name: &str, d: Duration) -> Phase {
        let t0 = Instant::now();
        let a = self.counters.snap();
        std::thread::sleep(d);
        let b = self.counters.snap();
        let secs = t0.elapsed().as_secs_f64();
        let rate = |i: usize| (b[i] - a[i]) as f64 / secs;
        let avg = |us: usize, n: usize| {
            let calls = (b[n] - a[n]).max(1) as f64;
            (b[us] - a[us]) as f64 / calls / 1000.0
        };
        Phase {
            name: name.to_string(),
            secs,
            events_sent_s: rate(0),
            events_acked_s: rate(1),
            jobs_enqueued_s: rate(2),
            jobs_completed_s: rate(3),
            recv_ms: avg(4, 5),
            dispatch_ms: avg(6, 7),
            tables: table_stats(stats),
        }
    }

    pub fn stop(self) -> u64 {
        self.stop.store(true, Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        self.counters.errors.load(Relaxed)
    }
}

/// n_live_tup / n_dead_tup of every pgque table (partitions, event tables),
/// after making the statistics current.
pub fn table_stats(c: &mut Client) -> BTreeMap<String, TableStat> {
    flush_stats(c);
    c.query(
        "SELECT relname::text, n_live_tup, n_dead_tup FROM pg_stat_user_tables \
          WHERE schemaname = 'pgque' ORDER BY 1",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| {
        (
            r.get(0),
            TableStat {
                live: r.get(1),
                dead: r.get(2),
            },
        )
    })
    .collect()
}

/// The table families the assertions and the report talk about.
pub fn family(table: &str) -> &'static str {
    if table.starts_with("event_") {
        "event"
    } else if table.starts_with("job") {
        "job"
    } else {
        "meta"
    }
}

pub fn dead_of(p: &Phase, fam: &str) -> i64 {
    p.tables
        .iter()
        .filter(|(t, _)| family(t) == fam)
        .map(|(_, s)| s.dead)
        .sum()
}

pub fn live_of(p: &Phase, fam: &str) -> i64 {
    p.tables
        .iter()
        .filter(|(t, _)| family(t) == fam)
        .map(|(_, s)| s.live)
        .sum()
}

/// Takes a snapshot and keeps it (and so the database's xmin horizon) until
/// the returned client commits.
pub fn hold_snapshot(mut c: Client) -> Client {
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pgque.jobs")
        .unwrap();
    c
}

/// A markdown report: one throughput table, one dead-tuple table.
pub fn report(phases: &[Phase]) -> String {
    let mut s = String::new();
    s.push_str("| phase | secs | events sent/s | events acked/s | jobs enqueued/s | jobs completed/s | receive ms | dispatch ms |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for p in phases {
        s.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |\n",
            p.name,
            p.secs,
            p.events_sent_s,
            p.events_acked_s,
            p.jobs_enqueued_s,
            p.jobs_completed_s,
            p.recv_ms,
            p.dispatch_ms
        ));
    }
    s.push_str("\nDead tuples (live in parentheses) per pgque table at the end of each phase:\n\n| table |");
    for p in phases {
        s.push_str(&format!(" {} |", p.name));
    }
    s.push_str("\n|---|");
    for _ in phases {
        s.push_str("---:|");
    }
    s.push('\n');
    let names: std::collections::BTreeSet<&String> =
        phases.iter().flat_map(|p| p.tables.keys()).collect();
    for t in names {
        s.push_str(&format!("| {t} |"));
        for p in phases {
            match p.tables.get(t) {
                Some(st) => s.push_str(&format!(" {} ({}) |", st.dead, st.live)),
                None => s.push_str(" - |"),
            }
        }
        s.push('\n');
    }
    s
}

/// Most dead tuples tolerated in the event-queue metadata (ticks, batches,
/// queue and subscription rows, ledgers) at any phase end: they come from
/// rotation bookkeeping only (a few rows updated per rotation), never from
/// the per-event or per-batch path, so they do not grow with the load or
/// with the length of the hold.
pub const META_DEAD_MAX: i64 = 200;

/// The assertions shared by the soak and its short version. `phases` are
/// clean, hold, recovery.
pub fn check(phases: &[Phase]) {
    let [clean, hold, rec] = phases else {
        panic!("three phases expected")
    };
    for p in phases {
        assert_eq!(
            dead_of(p, "event"),
            0,
            "{}: dead tuples in event tables",
            p.name
        );
        let meta = dead_of(p, "meta");
        assert!(
            meta <= META_DEAD_MAX,
            "{}: {meta} dead tuples in metadata",
            p.name
        );
    }
    // The load keeps up while the snapshot is held: at least 80% of the
    // clean phase's throughput, for events and for jobs.
    assert!(
        hold.events_acked_s >= 0.8 * clean.events_acked_s,
        "event throughput during the hold {:.0}/s vs clean {:.0}/s",
        hold.events_acked_s,
        clean.events_acked_s
    );
    assert!(
        hold.jobs_completed_s >= 0.8 * clean.jobs_completed_s,
        "job throughput during the hold {:.0}/s vs clean {:.0}/s",
        hold.jobs_completed_s,
        clean.jobs_completed_s
    );
    // The job store: ordinary jobs live in the job log, which is written
    // append-only (batch rows, claim rows, done rows) and leaves by TRUNCATE:
    // no dead tuples in any phase, held snapshot or not. Claim rows are
    // updated once, when the rescue duty settles them after their lease: at
    // most one dead tuple per claim. pgque.jobs holds none of this load's
    // jobs.
    for p in phases {
        let sum = |pred: &dyn Fn(&str) -> bool, live: bool| -> i64 {
            p.tables
                .iter()
                .filter(|(t, _)| pred(t))
                .map(|(_, s)| if live { s.live } else { s.dead })
                .sum()
        };
        let log_dead = sum(
            &|t| t.starts_with("job_log") || t.starts_with("job_done"),
            false,
        );
        assert_eq!(log_dead, 0, "{}: dead tuples in the job log", p.name);
        let claims_dead = sum(&|t| t.starts_with("job_claims"), false);
        let claims_live = sum(&|t| t.starts_with("job_claims"), true);
        assert!(
            claims_dead <= claims_live,
            "{}: {claims_dead} dead claim rows for {claims_live} claims",
            p.name
        );
        assert_eq!(
            sum(&|t| t == "jobs", false),
            0,
            "{}: dead tuples in pgque.jobs",
            p.name
        );
    }
    let (jc, jr) = (dead_of(clean, "job"), dead_of(rec, "job"));
    assert!(
        jr <= 2 * jc + 2000,
        "job store not reclaimed after the hold: dead {jc} clean, {} end of hold, {jr} after recovery",
        dead_of(hold, "job")
    );
    // Metadata rows (live) come back to their clean level too: the pieces
    // held for the snapshot are truncated once it is gone.
    let (mc, mr) = (live_of(clean, "meta"), live_of(rec, "meta"));
    assert!(
        mr <= 3 * mc.max(50),
        "metadata did not shrink back after the hold: {mc} rows clean, {mr} after recovery"
    );
}

/// Runs the three phases on `cl` (a fresh database `db`), returns them.
pub fn run(cl: &Cluster, db: &str, rates: Rates, clean: u64, hold: u64, rec: u64) -> Vec<Phase> {
    let mut c = cl.create_db(db);
    c.batch_execute(SETUP).unwrap();
    let load = Load::start(&|| cl.connect(db), rates);
    let mut phases = vec![load.phase(&mut c, "clean", Duration::from_secs(clean))];
    let mut holder = hold_snapshot(cl.connect(db));
    let holder_pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    phases.push(load.phase(&mut c, "hold", Duration::from_secs(hold)));
    // The hold was real: the holder's xmin stayed put while the load ran
    // thousands of transactions past it.
    let age: i32 = c
        .query_one(
            "SELECT age(backend_xmin) FROM pg_stat_activity WHERE pid = $1",
            &[&holder_pid],
        )
        .unwrap()
        .get(0);
    assert!(age > 500, "the snapshot was not held: xmin age {age}");
    holder.close().unwrap(); // ends the transaction: the horizon moves on
    phases.push(load.phase(&mut c, "recovery", Duration::from_secs(rec)));
    let errors = load.stop();
    assert_eq!(errors, 0, "calls failed during the load");
    phases
}
