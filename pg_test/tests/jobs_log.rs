//! The job log (sql/31_job_log.sql, src/jobs/log/) across real sessions with
//! real commits: concurrent producers and dispatchers keep lane FIFO and hand
//! every job out once; completions racing each other and racing the lease
//! rescue settle every job exactly one way; rotation under load loses and
//! repeats nothing; a held snapshot leaves no dead tuple in the log; a killed
//! worker's jobs come back; REPEATABLE READ dispatch of the log is refused.
//!
//! Every test stops its database's pgque worker first, so the duties it
//! would run (rescue, rotation) happen only where the test runs them.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

static CREATE: Mutex<()> = Mutex::new(());

/// A fresh database with its worker stopped.
fn new_db(name: &str) -> TestDb {
    let db = {
        let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        TestDb::new(name)
    };
    stop_worker(&mut db.connect());
    db
}

/// One job as dispatch returned it.
#[derive(Clone, Debug)]
struct Job {
    id: i64,
    token: i64,
    kind: String,
    attempt: i32,
}

/// Enqueues one batch of `n` jobs (kinds `<prefix>.1` .. `<prefix>.n`) in
/// one autocommit call; returns the ids in input order.
fn enqueue(c: &mut Client, queue: &str, prefix: &str, n: i32) -> Vec<i64> {
    let rows = c
        .query(
            "SELECT job_id, state FROM pgque.enqueue_ready_rows($1,
                 (SELECT array_agg($2 || '.' || i ORDER BY i) FROM generate_series(1, $3) i),
                 (SELECT array_agg(jsonb_build_object('i', i) ORDER BY i) FROM generate_series(1, $3) i))
             ORDER BY ord",
            &[&queue, &prefix, &n],
        )
        .unwrap();
    assert_eq!(rows.len(), n as usize);
    rows.iter()
        .map(|r| {
            let state: String = r.get(1);
            assert_eq!(state, "ready");
            r.get(0)
        })
        .collect()
}

/// `pgque.dispatch(ARRAY[queue], limit, worker, lease)`, rows in dispatch order.
fn dispatch(
    c: &mut Client,
    queue: &str,
    limit: i32,
    worker: &str,
    lease: Option<&str>,
) -> Vec<Job> {
    try_dispatch(c, queue, limit, worker, lease).unwrap()
}

fn try_dispatch(
    c: &mut Client,
    queue: &str,
    limit: i32,
    worker: &str,
    lease: Option<&str>,
) -> Result<Vec<Job>, pgque_pg_test::postgres::Error> {
    Ok(c.query(
        "SELECT job_id, lease_token, kind, attempt
             FROM pgque.dispatch(ARRAY[$1], $2, $3, $4::text::interval)",
        &[&queue, &limit, &worker, &lease],
    )?
    .iter()
    .map(|r| Job {
        id: r.get(0),
        token: r.get(1),
        kind: r.get(2),
        attempt: r.get(3),
    })
    .collect())
}

fn complete_many(c: &mut Client, jobs: &[Job]) -> i32 {
    let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
    let toks: Vec<i64> = jobs.iter().map(|j| j.token).collect();
    c.query_one("SELECT pgque.complete_many($1, $2)", &[&ids, &toks])
        .unwrap()
        .get(0)
}

fn count(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// What a producer session enqueued: per batch, the ids in input order and
/// the kind prefix.
type Produced = Vec<(String, Vec<i64>)>;

/// What a dispatcher session got: per non-empty dispatch, its jobs in the
/// order dispatch returned them, and what complete_many returned for them.
type Dispatched = Vec<(Vec<Job>, i32)>;

/// Producers: `producers` sessions each enqueue `batches` batches of `size`
/// (or, with `for_time`, batches until it passes), pausing `pace` after each
/// (so dispatchers catch up and keep reaching the head of the lane while
/// producers commit). Dispatchers: `dispatchers`
/// sessions loop dispatch(limit) + complete_many (after `hold` per claim)
/// until the producers are done and a dispatch finds nothing. `side` runs in
/// the calling thread while they work, and gets the `done` flag that says the
/// producers finished. Returns what each producer and dispatcher saw.
#[allow(clippy::too_many_arguments)]
fn produce_and_consume(
    db: &TestDb,
    queue: &str,
    producers: usize,
    batches: usize,
    for_time: Option<Duration>,
    size: i32,
    pace: Duration,
    dispatchers: usize,
    limit: i32,
    hold: Duration,
    side: impl FnOnce(&AtomicBool),
) -> (Vec<Produced>, Vec<Dispatched>) {
    let done = Arc::new(AtomicBool::new(false));
    let producers_left = Arc::new(AtomicUsize::new(producers));
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut ps = Vec::new();
    for p in 0..producers {
        let mut c = db.connect();
        let queue = queue.to_string();
        let left = producers_left.clone();
        let done = done.clone();
        ps.push(std::thread::spawn(move || {
            let start = Instant::now();
            let mut out: Produced = Vec::new();
            let mut b = 0;
            loop {
                let more = match for_time {
                    Some(t) => start.elapsed() < t,
                    None => b < batches,
                };
                if !more {
                    break;
                }
                let prefix = format!("p{p}b{b}");
                let ids = enqueue(&mut c, &queue, &prefix, size);
                out.push((prefix, ids));
                b += 1;
                std::thread::sleep(pace);
            }
            if left.fetch_sub(1, Ordering::SeqCst) == 1 {
                done.store(true, Ordering::SeqCst);
            }
            out
        }));
    }
    let mut ds = Vec::new();
    for w in 0..dispatchers {
        let mut c = db.connect();
        let queue = queue.to_string();
        let done = done.clone();
        ds.push(std::thread::spawn(move || {
            let mut out: Dispatched = Vec::new();
            let worker = format!("w{w}");
            loop {
                // read the flag before dispatching: an empty dispatch after
                // the producers finished means the lane is drained
                let finished = done.load(Ordering::SeqCst);
                let jobs = dispatch(&mut c, &queue, limit, &worker, None);
                if jobs.is_empty() {
                    if finished || Instant::now() > deadline {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                if !hold.is_zero() {
                    std::thread::sleep(hold);
                }
                let n = complete_many(&mut c, &jobs);
                out.push((jobs, n));
            }
            out
        }));
    }
    side(&done);
    let produced = ps.into_iter().map(|t| t.join().unwrap()).collect();
    let dispatched = ds.into_iter().map(|t| t.join().unwrap()).collect();
    (produced, dispatched)
}

/// The common bookkeeping checks: every enqueued job dispatched exactly once
/// with the kind it was enqueued with and attempt 1, every complete_many
/// completed every job it was given. Returns (all ids, id -> kind).
fn check_once(produced: &[Produced], dispatched: &[Dispatched]) -> (HashSet<i64>, usize) {
    let mut kind_of: HashMap<i64, String> = HashMap::new();
    for p in produced {
        for (prefix, ids) in p {
            for (i, id) in ids.iter().enumerate() {
                let prev = kind_of.insert(*id, format!("{prefix}.{}", i + 1));
                assert!(prev.is_none(), "id {id} given to two enqueued jobs");
            }
        }
    }
    let mut seen: HashMap<i64, usize> = HashMap::new();
    let mut calls = 0;
    for d in dispatched {
        for (jobs, n) in d {
            calls += 1;
            assert_eq!(
                *n as usize,
                jobs.len(),
                "complete_many of a fresh claim completed {n} of {} jobs",
                jobs.len()
            );
            for j in jobs {
                *seen.entry(j.id).or_default() += 1;
                assert_eq!(
                    j.attempt, 1,
                    "job {} dispatched with attempt {}",
                    j.id, j.attempt
                );
                assert_eq!(
                    kind_of.get(&j.id),
                    Some(&j.kind),
                    "job {} came out with the wrong kind",
                    j.id
                );
            }
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} jobs dispatched more than once, e.g. (id, times) {:?}",
        twice.len(),
        &twice[..twice.len().min(10)]
    );
    let all: HashSet<i64> = kind_of.keys().copied().collect();
    let got: HashSet<i64> = seen.keys().copied().collect();
    let lost: Vec<_> = all.difference(&got).take(10).collect();
    assert!(
        lost.is_empty(),
        "{} enqueued jobs never dispatched, e.g. {lost:?}",
        all.len() - got.len()
    );
    assert_eq!(got.len(), all.len());
    (all, calls)
}

#[test]
fn log_concurrent_producers_and_dispatchers_keep_fifo_and_hand_out_once() {
    let db = new_db("jlog_fifo");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('lf')")
        .unwrap();
    let start = Instant::now();
    let (produced, dispatched) = produce_and_consume(
        &db,
        "lf",
        2,
        100,
        None,
        50,
        Duration::from_millis(25),
        3,
        37,
        Duration::ZERO,
        |_| {},
    );
    let elapsed = start.elapsed();
    let (all, calls) = check_once(&produced, &dispatched);
    assert_eq!(all.len(), 2 * 100 * 50);

    // Dispatch order: a claim's token is taken under the lane's dispatch
    // lock, so ordering the claims by token is the order they were made.
    let mut claims: Vec<&Vec<Job>> = dispatched
        .iter()
        .flat_map(|d| d.iter().map(|(jobs, _)| jobs))
        .collect();
    for jobs in &claims {
        assert!(
            jobs.iter().all(|j| j.token == jobs[0].token),
            "one dispatch of one lane is one claim"
        );
    }
    claims.sort_by_key(|jobs| jobs[0].token);
    let order: Vec<i64> = claims.iter().flat_map(|j| j.iter().map(|j| j.id)).collect();
    let pos: HashMap<i64, usize> = order.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    for (p, batches) in produced.iter().enumerate() {
        let mine: Vec<i64> = batches.iter().flat_map(|(_, ids)| ids.clone()).collect();
        let places: Vec<usize> = mine.iter().map(|id| pos[id]).collect();
        assert!(
            places.windows(2).all(|w| w[0] < w[1]),
            "producer {p}'s jobs were dispatched out of their enqueue order"
        );
    }

    // The tables agree: everything went through the log, one row per batch,
    // one claim per dispatch, one done row per completion.
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgque.jobs"), 0);
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgque.job_lanes"), 1);
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgque.job_log"), 200);
    let rows = c
        .query(
            "SELECT claim_id, hi, job_ids, state::text FROM pgque.job_claims ORDER BY hi",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), calls, "one claim row per non-empty dispatch");
    let mut prev_hi = 0i64;
    let mut prev_token = 0i64;
    let mut claimed: Vec<i64> = Vec::new();
    for r in &rows {
        let token: i64 = r.get(0);
        let hi: i64 = r.get(1);
        let ids: Vec<i64> = r.get(2);
        let state: String = r.get(3);
        assert_eq!(state, "a");
        assert!(!ids.is_empty());
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "claim {token} not increasing"
        );
        assert_eq!(*ids.last().unwrap(), hi);
        assert!(
            ids[0] > prev_hi,
            "claim {token} starts at {} at or below the previous claim's hi {prev_hi}",
            ids[0]
        );
        assert!(
            token > prev_token,
            "a later claim of the lane has an older token"
        );
        prev_hi = hi;
        prev_token = token;
        claimed.extend(ids);
    }
    let claimed_set: HashSet<i64> = claimed.iter().copied().collect();
    assert_eq!(claimed.len(), claimed_set.len(), "a job in two claims");
    assert_eq!(
        claimed_set, all,
        "the claims are not exactly the enqueued jobs"
    );
    let done = c
        .query("SELECT kind::text, job_ids FROM pgque.job_done", &[])
        .unwrap();
    assert_eq!(done.len(), calls, "one done row per claim completed");
    let mut completed: Vec<i64> = Vec::new();
    for r in &done {
        let kind: String = r.get(0);
        assert_eq!(kind, "c");
        completed.extend(r.get::<_, Vec<i64>>(1));
    }
    let completed_set: HashSet<i64> = completed.iter().copied().collect();
    assert_eq!(
        completed.len(),
        completed_set.len(),
        "a job completed twice"
    );
    assert_eq!(completed_set, all);
    let by_state: Vec<(String, i64)> = c
        .query(
            "SELECT state, count(*) FROM pgque.all_jobs WHERE queue = 'lf' GROUP BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(by_state, vec![("completed".to_string(), 10_000)]);
    // claims shorter than the limit: a dispatcher reached the head of the
    // lane while producers were still committing
    let short = claims.iter().filter(|j| j.len() < 37).count();
    println!(
        "fifo: 10000 jobs, 200 batches, {calls} claims ({short} short of the limit) by 3 \
         dispatchers in {:.2} s",
        elapsed.as_secs_f64()
    );
}

#[test]
fn log_double_completion_counts_each_job_once() {
    let db = new_db("jlog_double");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('dc')")
        .unwrap();
    let mut a = db.connect();
    let mut b = db.connect();
    for round in 0..10 {
        enqueue(&mut c, "dc", &format!("r{round}"), 40);
        let jobs = dispatch(&mut c, "dc", 40, "w", None);
        assert_eq!(jobs.len(), 40);
        // even rounds: both complete all of them; odd rounds: overlapping halves
        let (ja, jb): (Vec<Job>, Vec<Job>) = if round % 2 == 0 {
            (jobs.clone(), jobs.clone())
        } else {
            (jobs[..30].to_vec(), jobs[10..].to_vec())
        };
        let barrier = Arc::new(Barrier::new(2));
        let (ba, bb) = (barrier.clone(), barrier);
        let ta = std::thread::spawn(move || {
            ba.wait();
            let n = complete_many(&mut a, &ja);
            (a, n)
        });
        let tb = std::thread::spawn(move || {
            bb.wait();
            let n = complete_many(&mut b, &jb);
            (b, n)
        });
        let (a2, na) = ta.join().unwrap();
        let (b2, nb) = tb.join().unwrap();
        a = a2;
        b = b2;
        assert_eq!(
            na + nb,
            40,
            "round {round}: {na} + {nb} completions of 40 jobs"
        );
        let token = jobs[0].token;
        let done = c
            .query(
                "SELECT m.id, count(*) FROM pgque.job_done d, unnest(d.job_ids) m(id)
                 WHERE d.claim_id = $1 GROUP BY 1",
                &[&token],
            )
            .unwrap();
        assert_eq!(done.len(), 40, "round {round}: jobs with a done row");
        assert!(done.iter().all(|r| r.get::<_, i64>(1) == 1));
        // every job is completed, nothing went to pgque.jobs
        let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
        let states: Vec<(String, String)> = c
            .query(
                "SELECT state, stored_in FROM pgque.all_jobs WHERE id = ANY ($1)",
                &[&ids],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(states.len(), 40);
        assert!(states.iter().all(|s| s.0 == "completed" && s.1 == "log"));
    }
}

#[test]
fn log_completion_racing_the_lease_rescue_settles_each_job_one_way() {
    let db = new_db("jlog_rescue_race");
    let mut c = db.connect();
    let mut r = db.connect();
    let mut k = db.connect();
    let (mut total_done, mut total_rescued) = (0, 0);
    for round in 0..6 {
        // a queue per round: rescued jobs of earlier rounds stay out of it
        let q = format!("rr{round}");
        c.query_one("SELECT pgque.create_job_queue($1)", &[&q])
            .unwrap();
        let mut claims = Vec::new();
        for i in 0..3 {
            enqueue(&mut c, &q, &format!("c{i}"), 20);
            let jobs = dispatch(&mut c, &q, 20, "w", Some("1 second"));
            assert_eq!(jobs.len(), 20);
            claims.push(jobs);
        }
        // the completer completes all of claim 2, half of claim 1, one job
        // of claim 0, in that order, while the rescuer rescues all three
        let asked: Vec<Vec<Job>> = vec![
            claims[2].clone(),
            claims[1][..10].to_vec(),
            claims[0][..1].to_vec(),
        ];
        std::thread::sleep(Duration::from_millis(1100));
        let barrier = Arc::new(Barrier::new(2));
        let (b1, b2) = (barrier.clone(), barrier);
        let rt = std::thread::spawn(move || {
            b1.wait();
            let n: i32 = r
                .query_one("SELECT pgque.rescue_expired_leases()", &[])
                .unwrap()
                .get(0);
            (r, n)
        });
        let kt = std::thread::spawn(move || {
            b2.wait();
            let n: Vec<i32> = asked
                .iter()
                .map(|jobs| complete_many(&mut k, jobs))
                .collect();
            (k, asked, n)
        });
        let (r2, rescued_first) = rt.join().unwrap();
        let (k2, asked, completed) = kt.join().unwrap();
        r = r2;
        k = k2;
        // the rescue only tries each claim's lock: a claim the completer held
        // at that moment is skipped and rescued by the next run
        let rescued_later: i32 = r
            .query_one("SELECT pgque.rescue_expired_leases()", &[])
            .unwrap()
            .get(0);
        let rescued = rescued_first + rescued_later;
        let mut completed_ids: HashSet<i64> = HashSet::new();
        for (jobs, n) in asked.iter().zip(&completed) {
            // a claim is either completed first (all asked) or rescued first (none)
            assert!(
                *n == 0 || *n as usize == jobs.len(),
                "round {round}: complete_many completed {n} of {}",
                jobs.len()
            );
            if *n > 0 {
                completed_ids.extend(jobs.iter().map(|j| j.id));
            }
        }
        let mut n_done = 0;
        let mut n_rescued = 0;
        for jobs in &claims {
            let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
            let rows = c
                .query(
                    "SELECT id, state, attempt, stored_in FROM pgque.all_jobs WHERE id = ANY ($1)",
                    &[&ids],
                )
                .unwrap();
            assert_eq!(
                rows.len(),
                20,
                "round {round}: a job is missing or twice in all_jobs"
            );
            for row in rows {
                let id: i64 = row.get(0);
                let state: String = row.get(1);
                let attempt: i32 = row.get(2);
                let stored: String = row.get(3);
                if completed_ids.contains(&id) {
                    assert_eq!(
                        (state.as_str(), stored.as_str()),
                        ("completed", "log"),
                        "round {round}: job {id} was completed"
                    );
                    n_done += 1;
                } else {
                    assert_eq!(
                        (state.as_str(), attempt, stored.as_str()),
                        ("ready", 1, "jobs"),
                        "round {round}: job {id} was not completed, so it must be rescued"
                    );
                    n_rescued += 1;
                }
            }
        }
        assert_eq!(n_done + n_rescued, 60);
        assert_eq!(rescued, n_rescued, "round {round}: rescue's count");
        assert_eq!(
            count(
                &mut c,
                &format!("SELECT count(*) FROM pgque.jobs WHERE queue = '{q}' AND state = 'ready'")
            ),
            n_rescued as i64
        );
        total_done += n_done;
        total_rescued += n_rescued;
    }
    println!("rescue race: {total_done} completed first, {total_rescued} rescued first");
}

#[test]
fn log_rotation_under_load_loses_and_repeats_nothing() {
    let db = new_db("jlog_rotation");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('rot')")
        .unwrap();
    let mut rot = db.connect();
    rot.batch_execute("SET pgque.job_log_rotation_period = 0")
        .unwrap();
    // A claim held across truncations, so that the evacuation path runs
    // whatever the timing of the consumers' short claims: five jobs of
    // their own queue, dispatched before the load and completed only after
    // three truncations, with the tokens the dispatch gave.
    let mut hold = db.connect();
    hold.batch_execute(
        "SELECT pgque.create_job_queue('rot_hold');
         SELECT count(*) FROM pgque.enqueue_ready_rows('rot_hold', array_fill('h'::text, ARRAY[5]),
                                                       array_fill('{}'::jsonb, ARRAY[5]))",
    )
    .unwrap();
    let held: Vec<(i64, i64)> = hold
        .query(
            "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['rot_hold'], 5, 'holder', interval '1 hour')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(held.len(), 5);
    let held_done = Arc::new(AtomicUsize::new(usize::MAX));
    let hd = held_done.clone();
    let stats = Arc::new(Mutex::new((0usize, 0usize, 0usize, 0i64, 0usize)));
    let st = stats.clone();
    let start = Instant::now();
    let (produced, dispatched) = produce_and_consume(
        &db,
        "rot",
        2,
        0,
        Some(Duration::from_secs(12)),
        50,
        Duration::from_millis(20),
        3,
        37,
        // claims stay running a while, so truncations meet running claims
        Duration::from_millis(10),
        |done| {
            // runs until the producers stop; (runs, switched, truncated, evacuated, busy)
            while !done.load(Ordering::SeqCst) {
                let r = rot
                    .query_one("SELECT * FROM pgque.rotate_job_log()", &[])
                    .unwrap();
                let switched: bool = r.get(0);
                let truncated: Option<i16> = r.get(1);
                let evacuated: i32 = r.get(2);
                let busy: bool = r.get(3);
                rot.batch_execute(
                    "UPDATE pgque.job_log_segments SET sealed_at = now() - interval '2 days'
                     WHERE sealed_at IS NOT NULL",
                )
                .unwrap();
                let mut s = st.lock().unwrap();
                s.0 += 1;
                s.1 += switched as usize;
                s.2 += truncated.is_some() as usize;
                s.3 += evacuated as i64;
                s.4 += busy as usize;
                let truncations = s.2;
                drop(s);
                if truncations >= 3 && hd.load(Ordering::SeqCst) == usize::MAX {
                    let ids: Vec<i64> = held.iter().map(|h| h.0).collect();
                    let toks: Vec<i64> = held.iter().map(|h| h.1).collect();
                    let n: i32 = hold
                        .query_one("SELECT pgque.complete_many($1, $2)", &[&ids, &toks])
                        .unwrap()
                        .get(0);
                    hd.store(n as usize, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        },
    );
    let elapsed = start.elapsed();
    let (all, calls) = check_once(&produced, &dispatched);
    let (runs, switched, truncated, evacuated, busy) = *stats.lock().unwrap();
    println!(
        "rotation: {} jobs, {calls} claims in {:.1} s; {runs} rotations: {switched} switched, \
         {truncated} truncated, {evacuated} claims evacuated, {busy} busy",
        all.len(),
        elapsed.as_secs_f64()
    );
    assert!(
        truncated >= 1,
        "no segment was truncated in {runs} rotations ({busy} busy)"
    );
    assert!(
        evacuated >= 1,
        "no truncation met a running claim: the evacuation path was not exercised"
    );
    // the held claim's jobs went to pgque.jobs with their claim's token and
    // were completed there with it
    assert_eq!(
        held_done.load(Ordering::SeqCst),
        5,
        "the held claim's jobs, completed after {truncated} truncations"
    );
    // Whatever the rotations moved to pgque.jobs was completed there, and
    // no job is left ready or running anywhere.
    let left = c
        .query(
            "SELECT state, stored_in, count(*) FROM pgque.all_jobs
             WHERE state <> 'completed' GROUP BY 1, 2",
            &[],
        )
        .unwrap();
    assert!(
        left.is_empty(),
        "jobs not completed: {:?}",
        left.iter()
            .map(|r| (
                r.get::<_, String>(0),
                r.get::<_, String>(1),
                r.get::<_, i64>(2)
            ))
            .collect::<Vec<_>>()
    );
    // no job of pgque.jobs is one that did not come from the producers
    let side: Vec<i64> = c
        .query("SELECT id FROM pgque.jobs WHERE queue = 'rot'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(side.iter().all(|id| all.contains(id)));
    // an evacuated claim had at least one unfinished job, which went there
    // (one evacuated claim is the held one, whose jobs are in rot_hold)
    assert_eq!(
        count(
            &mut c,
            "SELECT count(*) FROM pgque.jobs WHERE queue = 'rot_hold' AND state = 'completed'"
        ),
        5,
        "the held claim was evacuated into pgque.jobs"
    );
    assert!(
        side.len() as i64 + 1 >= evacuated,
        "{} jobs in pgque.jobs",
        side.len()
    );
}

#[test]
fn log_held_snapshot_leaves_no_dead_tuples() {
    let db = new_db("jlog_held_xmin");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('hx')")
        .unwrap();
    let mut holder = db.connect();
    holder
        .batch_execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ;
             SELECT count(*) FROM pgque.job_queues;",
        )
        .unwrap();
    let holder_pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let start = Instant::now();
    let mut completed = 0;
    for b in 0..200 {
        enqueue(&mut c, "hx", &format!("b{b}"), 100);
        let jobs = dispatch(&mut c, "hx", 100, "w", None);
        assert_eq!(jobs.len(), 100);
        completed += complete_many(&mut c, &jobs);
    }
    let elapsed = start.elapsed();
    assert_eq!(completed, 20_000);
    // the snapshot was held all along
    let xmin_held: bool = c
        .query_one(
            "SELECT backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = $1",
            &[&holder_pid],
        )
        .unwrap()
        .get(0);
    assert!(xmin_held, "the REPEATABLE READ session holds no xmin");
    flush_stats(&mut c);
    let tables = [
        "job_log_0",
        "job_log_1",
        "job_log_2",
        "job_claims_0",
        "job_claims_1",
        "job_claims_2",
        "job_done_0",
        "job_done_1",
        "job_done_2",
        "jobs",
    ];
    let mut stats: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let ok = wait_until(Duration::from_secs(10), || {
        c.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
        stats = c
            .query(
                "SELECT relname::text, n_tup_ins, n_dead_tup FROM pg_stat_user_tables
                 WHERE schemaname = 'pgque' AND relname = ANY ($1)",
                &[&tables.to_vec()],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect();
        // the pushing session's counters have reached the shared stats
        stats.get("job_done_0").map(|s| s.0) == Some(200)
    });
    println!(
        "held xmin: 20000 jobs in {:.1} s; (inserted, dead) per table: {stats:?}",
        elapsed.as_secs_f64()
    );
    assert!(ok, "stats never showed the 200 done rows: {stats:?}");
    assert_eq!(stats.len(), tables.len());
    // the traffic went where the design says: one row per batch in each
    // table of segment 0, nothing in pgque.jobs
    assert_eq!(stats["job_log_0"].0, 200);
    assert_eq!(stats["job_claims_0"].0, 200);
    assert_eq!(stats["jobs"].0, 0);
    for (t, (_, dead)) in &stats {
        assert_eq!(*dead, 0, "{t} has {dead} dead tuples");
    }
    holder.batch_execute("COMMIT").unwrap();
}

#[test]
fn log_killed_worker_session_jobs_are_rescued_and_dispatched_again() {
    let db = new_db("jlog_killed");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('kq')")
        .unwrap();
    enqueue(&mut c, "kq", "k", 30);
    let mut victim = db.connect();
    let pid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    // a committed claim of 20 jobs (8 completed), then an open transaction
    // holding an uncommitted claim of the other 10
    let held = dispatch(&mut victim, "kq", 20, "victim", Some("1 second"));
    assert_eq!(held.len(), 20);
    assert_eq!(complete_many(&mut victim, &held[..8]), 8);
    victim.batch_execute("BEGIN").unwrap();
    let uncommitted = dispatch(&mut victim, "kq", 20, "victim", Some("1 second"));
    assert_eq!(uncommitted.len(), 10);
    let killed: bool = c
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap()
        .get(0);
    assert!(killed);
    assert!(wait_until(Duration::from_secs(5), || {
        count(
            &mut c,
            &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"),
        ) == 0
    }));
    assert!(victim.is_closed() || victim.batch_execute("SELECT 1").is_err());
    // the lease has not expired yet: nothing to rescue, and the aborted
    // claim's jobs are ready again, never dispatched
    let first = dispatch(&mut c, "kq", 20, "w2", None);
    assert_eq!(
        first.iter().map(|j| j.id).collect::<Vec<_>>(),
        uncommitted.iter().map(|j| j.id).collect::<Vec<_>>()
    );
    assert!(first.iter().all(|j| j.attempt == 1));
    assert_eq!(complete_many(&mut c, &first), 10);
    std::thread::sleep(Duration::from_millis(1100));
    let rescued: i32 = c
        .query_one("SELECT pgque.rescue_expired_leases()", &[])
        .unwrap()
        .get(0);
    assert_eq!(rescued, 12);
    let unfinished: Vec<i64> = held[8..].iter().map(|j| j.id).collect();
    let rows = c
        .query(
            "SELECT id, state, attempt, stored_in FROM pgque.all_jobs
             WHERE id = ANY ($1) ORDER BY id",
            &[&unfinished],
        )
        .unwrap();
    assert_eq!(rows.len(), 12);
    for r in &rows {
        assert_eq!(
            (
                r.get::<_, String>(1),
                r.get::<_, i32>(2),
                r.get::<_, String>(3)
            ),
            ("ready".to_string(), 1, "jobs".to_string()),
            "job {}",
            r.get::<_, i64>(0)
        );
    }
    let again = dispatch(&mut c, "kq", 20, "w3", None);
    assert_eq!(
        again.iter().map(|j| j.id).collect::<Vec<_>>(),
        unfinished,
        "the rescued jobs come back, in order, and only they"
    );
    assert!(again.iter().all(|j| j.attempt == 2));
    assert!(again.iter().all(|j| j.token != held[0].token));
    // the dead session's token is stale
    let stale: bool = c
        .query_one(
            "SELECT pgque.complete($1, $2)",
            &[&held[10].id, &held[10].token],
        )
        .unwrap()
        .get(0);
    assert!(!stale, "the killed session's token still completes");
    assert_eq!(complete_many(&mut c, &held[8..]), 0);
    assert_eq!(complete_many(&mut c, &again), 12);
    let by_state: Vec<(String, i64)> = c
        .query(
            "SELECT state, count(*) FROM pgque.all_jobs WHERE queue = 'kq' GROUP BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(by_state, vec![("completed".to_string(), 30)]);
}

#[test]
fn log_dispatch_refuses_a_transaction_snapshot() {
    let db = new_db("jlog_isolation");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_job_queue('iso')")
        .unwrap();
    enqueue(&mut c, "iso", "k", 10);
    let snapshot = |c: &mut Client| -> (i64, i64, i64) {
        let r = c
            .query_one(
                "SELECT (SELECT count(*) FROM pgque.job_claims),
                        (SELECT count(*) FROM pgque.job_done),
                        (SELECT count(*) FROM pgque.all_jobs WHERE state = 'ready')",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(snapshot(&mut c), (0, 0, 10));
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .unwrap();
        assert_eq!(
            sqlstate(try_dispatch(&mut c, "iso", 5, "w", None)),
            "0A000",
            "{level}"
        );
        c.batch_execute("ROLLBACK").unwrap();
        assert_eq!(snapshot(&mut c), (0, 0, 10), "{level} changed something");
    }
    // a running log job cannot be completed under a transaction snapshot either
    let jobs = dispatch(&mut c, "iso", 5, "w", None);
    assert_eq!(snapshot(&mut c), (1, 0, 5));
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .unwrap();
    let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
    let toks: Vec<i64> = jobs.iter().map(|j| j.token).collect();
    assert_eq!(
        sqlstate(c.query_one("SELECT pgque.complete_many($1, $2)", &[&ids, &toks])),
        "0A000"
    );
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(snapshot(&mut c), (1, 0, 5));
    assert_eq!(complete_many(&mut c, &jobs), 5);
    assert_eq!(snapshot(&mut c), (1, 1, 5));
}

/// A database with its worker stopped and job queue `queue`, and a session
/// in it for which every rotate_job_log() switches segments.
fn rotation_db(name: &str, queue: &str) -> (TestDb, Client) {
    let db = new_db(name);
    let mut c = db.connect();
    c.batch_execute("SET pgque.job_log_rotation_period = 0")
        .unwrap();
    c.execute("SELECT pgque.create_job_queue($1)", &[&queue])
        .unwrap();
    (db, c)
}

/// `rotate_job_log()` until it is not busy (up to 10 s): (switched, truncated, evacuated).
fn rotate(c: &mut Client) -> (bool, Option<i16>, i32) {
    let start = Instant::now();
    loop {
        let r = c
            .query_one("SELECT * FROM pgque.rotate_job_log()", &[])
            .unwrap();
        if !r.get::<_, bool>(3) || start.elapsed() > Duration::from_secs(10) {
            return (r.get(0), r.get(1), r.get(2));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn log_rotation_truncates_in_ring_order_when_the_clock_stepped_back() {
    // A claim lives in the segment current at dispatch, its done rows in the
    // one current at completion (the same or a later one): truncating a
    // later segment before an earlier one would drop done rows of claims
    // that stay. sealed_at is wall-clock time; a clock stepped back between
    // two seals makes the later segment look older.
    let (_db, mut c) = rotation_db("jlog_ring_order", "ck");
    enqueue(&mut c, "ck", "k", 5);
    let jobs = dispatch(&mut c, "ck", 5, "w", Some("1 second"));
    assert_eq!(jobs.len(), 5);
    assert_eq!(rotate(&mut c), (true, None, 0), "seal 0, open 1");
    assert_eq!(complete_many(&mut c, &jobs), 5);
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgque.job_done_1"), 1);
    assert_eq!(rotate(&mut c), (true, None, 0), "seal 1, open 2");
    // segment 1 was sealed after segment 0, but the clock says before
    c.batch_execute(
        "UPDATE pgque.job_log_segments SET sealed_at = now() - interval '2 days' WHERE seg = 0;
         UPDATE pgque.job_log_segments SET sealed_at = now() - interval '3 days' WHERE seg = 1;",
    )
    .unwrap();
    let (_, truncated, _) = rotate(&mut c);
    let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
    let not_done = count_ids(
        &mut c,
        "SELECT count(*) FROM pgque.all_jobs WHERE id = ANY ($1) AND state <> 'completed'",
        &ids,
    );
    assert_eq!(
        not_done, 0,
        "completed jobs came back to life (truncated {truncated:?})"
    );
    std::thread::sleep(Duration::from_millis(1100));
    let rescued: i32 = c
        .query_one("SELECT pgque.rescue_expired_leases()", &[])
        .unwrap()
        .get(0);
    assert_eq!(rescued, 0, "completed jobs were rescued");
    assert!(
        dispatch(&mut c, "ck", 5, "w", None).is_empty(),
        "completed jobs dispatched again"
    );
    assert_eq!(
        truncated,
        Some(0),
        "the oldest segment in ring order goes first"
    );
}

fn count_ids(c: &mut Client, sql: &str, ids: &[i64]) -> i64 {
    c.query_one(sql, &[&ids]).unwrap().get(0)
}

#[test]
fn log_rotation_evacuates_and_counts_only_claims_with_running_jobs() {
    let (_db, mut c) = rotation_db("jlog_evac_count", "ev");
    enqueue(&mut c, "ev", "k", 15);
    // three claims of segment 0: one finished, one half finished, one running
    let a = dispatch(&mut c, "ev", 5, "w", None);
    let b = dispatch(&mut c, "ev", 5, "w", None);
    let d = dispatch(&mut c, "ev", 5, "w", None);
    assert_eq!(complete_many(&mut c, &a), 5);
    assert_eq!(complete_many(&mut c, &b[..2]), 2);
    assert_eq!(rotate(&mut c), (true, None, 0), "seal 0, open 1");
    c.batch_execute(
        "UPDATE pgque.job_log_segments SET sealed_at = now() - interval '2 days' WHERE seg = 0",
    )
    .unwrap();
    assert_eq!(
        rotate(&mut c),
        (true, Some(0), 2),
        "b and d evacuated, a not"
    );
    let side: Vec<(i64, String, i64)> = c
        .query(
            "SELECT id, state, lease_token FROM pgque.jobs ORDER BY id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let want: Vec<(i64, String, i64)> = b[2..]
        .iter()
        .chain(d.iter())
        .map(|j| (j.id, "running".to_string(), j.token))
        .collect();
    assert_eq!(
        side, want,
        "the unfinished jobs, running under their claim's token"
    );
    // they complete with the token they hold; a's and b's finished jobs stay finished
    assert_eq!(complete_many(&mut c, &b), 3);
    assert_eq!(complete_many(&mut c, &d), 5);
    assert_eq!(complete_many(&mut c, &a), 0);
    assert_eq!(
        count(
            &mut c,
            "SELECT count(*) FROM pgque.jobs WHERE state = 'completed'"
        ),
        8
    );
}

/// Rotation keeps a segment sealed too recently, truncates the oldest one
/// in ring order once it is old enough (moving its one running claim to the
/// side table, where the jobs complete with the token they hold), and the
/// lane goes on after its floor.
#[test]
fn log_rotation_keeps_young_segments_and_truncates_in_ring_order() {
    let (_db, mut c) = rotation_db("jlog_ring_kept", "ro");
    let kinds = |jobs: &[Job]| jobs.iter().map(|j| j.kind.clone()).collect::<Vec<_>>();
    enqueue(&mut c, "ro", "a", 10);
    assert_eq!(rotate(&mut c), (true, None, 0), "seal 0, open 1");
    enqueue(&mut c, "ro", "b", 5);
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgque.job_log_1"), 1);
    let got = dispatch(&mut c, "ro", 12, "w", None);
    assert_eq!(got.len(), 12);
    assert_eq!(complete_many(&mut c, &got[..8]), 8);
    assert_eq!(
        rotate(&mut c),
        (true, None, 0),
        "seal 1, open 2; segment 0 is not sealed long enough to go"
    );
    c.batch_execute(
        "UPDATE pgque.job_log_segments SET sealed_at = now() - interval '2 days' WHERE seg = 0",
    )
    .unwrap();
    let (_, truncated, evacuated) = rotate(&mut c);
    assert_eq!(truncated, Some(0));
    assert_eq!(evacuated, 1, "the claim of a9..b2 has running jobs");
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgque.job_log_0"), 0);
    assert_eq!(
        count(
            &mut c,
            "SELECT count(*) FROM pgque.jobs WHERE state = 'running'"
        ),
        4
    );
    assert_eq!(
        complete_many(&mut c, &got[8..]),
        4,
        "with the token they hold"
    );
    let rest = dispatch(&mut c, "ro", 12, "w", None);
    assert_eq!(kinds(&rest), vec!["b.3", "b.4", "b.5"]);
    // Segment 1 (sealed by the second rotation, drained) goes first, its one
    // running claim (b3..b5, never completed) evacuated; then segment 2,
    // which holds a job nobody dispatched yet, is kept.
    enqueue(&mut c, "ro", "c", 1);
    c.batch_execute(
        "UPDATE pgque.job_log_segments SET sealed_at = now() - interval '2 days' WHERE seg IN (1, 2);
         UPDATE pgque.job_log_segments SET opened_at = now() WHERE seg = 0;",
    )
    .unwrap();
    let (_, truncated, evacuated) = rotate(&mut c);
    assert_eq!((truncated, evacuated), (Some(1), 1));
    let (_, truncated, _) = rotate(&mut c);
    assert_eq!(truncated, None, "segment 2 still has a job to dispatch");
    assert_eq!(count(&mut c, "SELECT count(*) FROM pgque.job_log_2"), 1);
    assert_eq!(kinds(&dispatch(&mut c, "ro", 5, "w", None)), vec!["c.1"]);
}

/// A reader that read job_queue_status and keeps its transaction open holds
/// locks on every job-log partition, so the due truncation of a sealed
/// segment never gets its lock: rotate_job_log() says busy, and
/// job_log_blockers() names that session (pid, user, state), how long the
/// truncation has been due and how long the blocker's transaction is open;
/// once the reader ends, the truncation runs and nothing is reported.
#[test]
fn a_blocked_log_truncation_names_the_session_that_blocks_it() {
    let (db, mut c) = rotation_db("jlog_blockers", "bq");
    enqueue(&mut c, "bq", "k", 3);
    let jobs = dispatch(&mut c, "bq", 3, "w", None);
    assert_eq!(complete_many(&mut c, &jobs), 3);
    assert_eq!(rotate(&mut c), (true, None, 0), "seal 0, open 1");
    // sealed longer ago than pgque.completed_job_retention: truncation due
    c.batch_execute(
        "UPDATE pgque.job_log_segments SET sealed_at = now() - interval '400 days' WHERE seg = 0",
    )
    .unwrap();
    let mut reader = db.connect();
    let reader_pid: i32 = reader
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    reader
        .batch_execute("BEGIN; SELECT * FROM pgque.job_queue_status;")
        .unwrap();
    let busy: bool = c
        .query_one("SELECT busy FROM pgque.rotate_job_log()", &[])
        .unwrap()
        .get(0);
    assert!(busy, "the truncation is due and blocked");
    let rows = c
        .query(
            "SELECT seg, due_for_s, pid, usename, state, xact_age_s FROM pgque.job_log_blockers()",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), 1, "one blocker");
    let r = &rows[0];
    assert_eq!(r.get::<_, i16>(0), 0, "segment 0 waits");
    assert!(r.get::<_, f64>(1) >= 0.0);
    assert_eq!(r.get::<_, i32>(2), reader_pid);
    assert_eq!(r.get::<_, Option<String>>(3).as_deref(), Some("postgres"));
    assert_eq!(
        r.get::<_, Option<String>>(4).as_deref(),
        Some("idle in transaction")
    );
    assert!(r.get::<_, Option<f64>>(5).unwrap_or(-1.0) >= 0.0);
    // status() and metrics() say so (due for days here: past their 60 s)
    let st: (String, String) = {
        let r = c
            .query_one(
                "SELECT status, detail FROM pgque.status() WHERE component = 'job_log'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(st.0, "blocked");
    assert!(st.1.contains(&format!("pid {reader_pid} ")), "{}", st.1);
    let metric = |c: &mut Client, name: &str| -> f64 {
        c.query_one(
            "SELECT value FROM pgque.metrics() WHERE name = $1",
            &[&name],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!(metric(&mut c, "pgque_job_log_truncation_blockers"), 1.0);
    assert!(metric(&mut c, "pgque_job_log_truncation_blocked_seconds") > 60.0);
    reader.batch_execute("COMMIT").unwrap();
    let (_, truncated, _) = rotate(&mut c);
    assert_eq!(truncated, Some(0));
    assert_eq!(
        count(&mut c, "SELECT count(*) FROM pgque.job_log_blockers()"),
        0
    );
    assert_eq!(
        count(
            &mut c,
            "SELECT count(*) FROM pgque.status() WHERE component = 'job_log'"
        ),
        0
    );
    assert_eq!(metric(&mut c, "pgque_job_log_truncation_blockers"), 0.0);
}
