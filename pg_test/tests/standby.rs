//! Hot standby and failover (issue 30, items 2 and 3), on a private primary
//! and a standby taken from it with pg_basebackup, replicating
//! synchronously (`synchronous_standby_names = '*'`):
//!
//! - on the standby, `pgque.status()` says it is one and `pgque.metrics()`
//!   reports the replicated queues (job counts equal to the primary's,
//!   event depths), and no pgque process runs;
//! - the primary stops immediately, the standby is promoted
//!   (`pg_promote()`): its worker starts within a second, and every event
//!   not acked and every job not completed on the old primary is delivered
//!   once, none acked or completed there again: the batch open at the
//!   failover comes back whole with its id, a job lease whose worker goes
//!   on completes with its token, job leases whose worker is gone come back
//!   when they expire, a delayed event is promoted, an idempotency key
//!   still dedupes, and a schedule fires every slot once across it. No replay wait before the stop: with
//!   synchronous replication every commit had reached the standby.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

fn one_i64(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// metrics()'s value of figure `name` with `labels` (a JSON object), if any.
fn figure(c: &mut Client, name: &str, labels: &str) -> Option<f64> {
    c.query_opt(
        "SELECT value FROM pgque.metrics() WHERE name = $1 AND labels = $2::text::jsonb",
        &[&name, &labels],
    )
    .unwrap()
    .map(|r| r.get(0))
}

/// pgque.status() as (component, status) pairs.
fn status(c: &mut Client) -> Vec<(String, String)> {
    c.query("SELECT component, status FROM pgque.status()", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn pgque_processes(c: &mut Client) -> i64 {
    one_i64(
        c,
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'pgque%'",
    )
}

/// One receive of consumer c: the batch id and its payloads (None: no batch).
fn receive(c: &mut Client) -> Option<(i64, Vec<String>)> {
    let rows = c
        .query(
            "SELECT batch_id, payload FROM pgque.receive('q', 'c', 1000)",
            &[],
        )
        .unwrap();
    let b: i64 = rows.first()?.get(0);
    Some((b, rows.iter().map(|r| r.get(1)).collect()))
}

/// Receives and acks until `want` payloads have come or `timeout` passed.
fn receive_until(c: &mut Client, want: &HashSet<String>, timeout: Duration) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    while Instant::now() < deadline {
        if want.iter().all(|w| got.contains(w)) {
            break;
        }
        match receive(c) {
            Some((b, evs)) => {
                got.extend(evs);
                c.execute("SELECT pgque.ack($1)", &[&b]).unwrap();
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    got
}

fn send_range(c: &mut Client, from: i32, to: i32) {
    c.execute(
        "SELECT pgque.send('q', 'e' || i) FROM generate_series($1::int, $2::int) i",
        &[&from, &to],
    )
    .unwrap();
}

fn names(from: i32, to: i32) -> Vec<String> {
    (from..=to).map(|i| format!("e{i}")).collect()
}

/// Dispatches up to `n` jobs of queue j under `lease`: (job id, lease token).
fn dispatch(c: &mut Client, n: i32, lease: &str) -> Vec<(i64, i64)> {
    c.query(
        "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['j'], $1, 'w', $2::text::interval)",
        &[&n, &lease],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

fn complete(c: &mut Client, job: (i64, i64)) -> bool {
    c.query_one("SELECT pgque.complete($1, $2)", &[&job.0, &job.1])
        .unwrap()
        .get(0)
}

#[test]
fn standby_reports_and_a_failover_delivers_everything_once() {
    let pri = Cluster::start_new("failover_pri", "");
    let db = "failover";
    let mut p = pri.create_db(db);
    p.batch_execute(
        "SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c');
         SELECT pgque.create_job_queue('j');
         SELECT pgque.create_job_queue('sj');
         SELECT pgque.create_schedule('beat', '* * * * * *', 'sj', 'beat', misfire => 'catch_up');",
    )
    .unwrap();
    let sb = pri.start_standby("failover_sby", "");
    let mut padmin = pri.connect("postgres");
    assert!(
        wait_until(Duration::from_secs(30), || one_i64(
            &mut padmin,
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
        ) == 1),
        "the standby does not stream:\n{}",
        sb.log_tail(20)
    );
    padmin
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        .unwrap();
    padmin.batch_execute("SELECT pg_reload_conf()").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || one_i64(
            &mut padmin,
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
        ) == 1),
        "the standby did not become synchronous"
    );

    // Events: e1..e30 received and acked on the primary; a batch of
    // e31..e60 open (received, not acked); e61..e80 and a delayed event
    // pending; an idempotency key claimed.
    send_range(&mut p, 1, 30);
    let want: HashSet<String> = names(1, 30).into_iter().collect();
    let acked = receive_until(&mut p, &want, Duration::from_secs(20));
    assert_eq!(acked, names(1, 30), "events acked on the primary");
    send_range(&mut p, 31, 60);
    let mut open = None;
    assert!(wait_until(Duration::from_secs(20), || {
        open = receive(&mut p);
        open.is_some()
    }));
    let (open_batch, open_events) = open.unwrap();
    assert_eq!(open_events, names(31, 60), "the batch left open");
    send_range(&mut p, 61, 80);
    p.batch_execute(
        "SELECT pgque.send_at('q', 't', 'delayed'::text, clock_timestamp() + interval '4 seconds');
         SELECT pgque.send_idem('q', 't', 'idem'::text, 'failover:once');",
    )
    .unwrap();
    // Jobs: 30 enqueued; 10 completed, 1 under a 1 minute lease (its worker
    // completes it on the new primary), 5 under a 3 s lease (held at the
    // failover, their worker gone), 14 ready.
    p.batch_execute(
        "SELECT pgque.enqueue('j', 'k', jsonb_build_object('i', i)) FROM generate_series(1, 30) i",
    )
    .unwrap();
    let done = dispatch(&mut p, 10, "1 minute");
    assert_eq!(done.len(), 10);
    for j in &done {
        assert!(complete(&mut p, *j));
    }
    let kept = dispatch(&mut p, 1, "1 minute");
    assert_eq!(kept.len(), 1);
    let held = dispatch(&mut p, 5, "3 seconds");
    assert_eq!(held.len(), 5);
    let all_jobs: BTreeSet<i64> = p
        .query("SELECT id FROM pgque.all_jobs WHERE queue = 'j'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(all_jobs.len(), 30);

    // The standby: status() and metrics() answer, from the replicated state.
    let mut s = sb.connect(db);
    let st = status(&mut s);
    for row in [("recovery", "standby"), ("worker", "standby")] {
        assert!(
            st.contains(&(row.0.to_string(), row.1.to_string())),
            "status() on the standby: {st:?}"
        );
    }
    let jobs = |c: &mut Client, state: &str| {
        figure(
            c,
            "pgque_jobs",
            &format!(r#"{{"queue": "j", "state": "{state}"}}"#),
        )
    };
    // synchronous_commit = on waits for the standby's flush, not its
    // replay: the last commits become visible there a moment later
    assert!(
        wait_until(Duration::from_secs(10), || jobs(&mut s, "running")
            == Some(6.0)),
        "the standby's metrics: {:?}",
        s.query("SELECT name, labels::text, value FROM pgque.metrics()", &[])
            .unwrap()
            .iter()
            .map(|r| (
                r.get::<_, String>(0),
                r.get::<_, String>(1),
                r.get::<_, f64>(2)
            ))
            .collect::<Vec<_>>()
    );
    for state in ["ready", "running", "completed", "scheduled", "failed"] {
        assert_eq!(
            jobs(&mut s, state),
            jobs(&mut p, state),
            "job count {state} on the standby and the primary"
        );
    }
    assert_eq!(jobs(&mut s, "ready"), Some(14.0));
    assert_eq!(figure(&mut s, "pgque_in_recovery", "{}"), Some(1.0));
    assert_eq!(figure(&mut p, "pgque_in_recovery", "{}"), Some(0.0));
    assert_eq!(figure(&mut s, "pgque_worker_up", "{}"), Some(0.0));
    // Event depth: the primary's, plus at most the 32 sequence values
    // PostgreSQL logs ahead of the last one handed out (a standby sees the
    // logged value).
    let depth = r#"{"queue": "q", "consumer": "c"}"#;
    let (sd, pd) = (
        figure(&mut s, "pgque_consumer_pending_events", depth).unwrap(),
        figure(&mut p, "pgque_consumer_pending_events", depth).unwrap(),
    );
    assert!(
        pd >= 50.0 && (pd..=pd + 32.0).contains(&sd),
        "pending events: standby {sd}, primary {pd}"
    );
    assert_eq!(
        figure(&mut s, "pgque_consumer_batch_open", depth),
        Some(1.0)
    );
    let lag: bool = s
        .query_one(
            "SELECT lag IS NOT NULL AND current_batch = $1 FROM pgque.get_consumer_info('q', 'c')",
            &[&open_batch],
        )
        .unwrap()
        .get(0);
    assert!(lag, "get_consumer_info on the standby");
    // What pgque-web's read-only pages read beside metrics() and status().
    let held_id = held[0].0;
    for sql in [
        "SELECT count(*) FROM pgque.dlq_inspect('q', 10)",
        "SELECT count(*) FROM pgque.all_jobs WHERE stored_in = 'jobs' AND state = 'failed'",
        "SELECT count(*) FROM pgque.schedules",
        "SELECT count(*) FROM pgque.get_queue_info()",
        "SELECT count(*) FROM pgque.job_queue_status",
        "SELECT count(*) FROM pgque.get_job($1)",
    ] {
        let args: Vec<&(dyn pgque_pg_test::postgres::types::ToSql + Sync)> = if sql.contains("$1") {
            vec![&held_id]
        } else {
            vec![]
        };
        s.query_one(sql, &args)
            .unwrap_or_else(|e| panic!("{sql} on the standby: {e}"));
    }
    // Read-only: a producer's call fails.
    assert!(s
        .execute("SELECT pgque.send('q', 'on-standby'::text)", &[])
        .is_err());
    // Quiet: no launcher, no worker.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(pgque_processes(&mut s), 0, "pgque processes on the standby");
    drop(s);

    // Failover: the primary stops without a word; the standby is promoted.
    pri.stop_immediate();
    let mut s = sb.connect(db);
    let promoted: bool = s.query_one("SELECT pg_promote()", &[]).unwrap().get(0);
    assert!(promoted);
    let t0 = Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || one_i64(
            &mut s,
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgque worker' \
               AND datname = current_database()"
        ) == 1),
        "no worker after the promotion:\n{}",
        sb.log_tail(30)
    );
    let started = t0.elapsed();
    eprintln!("worker up {started:?} after pg_promote() returned");
    assert!(
        started <= Duration::from_secs(1),
        "the worker took {started:?} to start after the promotion"
    );
    assert!(!status(&mut s).iter().any(|(c, _)| c == "recovery"));

    // Events: the open batch comes back first, whole, with its id; then
    // everything else not acked, the delayed event included; nothing acked
    // on the old primary.
    let (b, evs) = receive(&mut s).expect("the batch open at the failover");
    assert_eq!(
        (b, &evs),
        (open_batch, &open_events),
        "the batch open at the failover"
    );
    s.execute("SELECT pgque.ack($1)", &[&b]).unwrap();
    let dedup: bool = s
        .query_one(
            "SELECT deduped FROM pgque.send_idem('q', 't', 'idem-again'::text, 'failover:once')",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(dedup, "the idempotency key claimed on the old primary");
    s.execute("SELECT pgque.send('q', 'after'::text)", &[])
        .unwrap();
    let mut rest: HashSet<String> = names(61, 80).into_iter().collect();
    for e in ["delayed", "idem", "after"] {
        rest.insert(e.to_string());
    }
    let got = receive_until(&mut s, &rest, Duration::from_secs(30));
    let mut expected: Vec<String> = names(61, 80);
    expected.push("idem".into());
    let mut order = got.clone();
    order.retain(|e| e.starts_with('e') || e == "idem");
    assert_eq!(order, expected, "events after the failover, in order");
    let seen: HashSet<&String> = got.iter().collect();
    assert_eq!(
        got.len(),
        seen.len(),
        "an event delivered twice after the failover: {got:?}"
    );
    assert_eq!(
        seen,
        rest.iter().collect(),
        "events after the failover: {got:?}"
    );
    // and nothing more comes
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(receive(&mut s), None, "events beyond what was pending");

    // Jobs: the one whose worker goes on with its lease completes with its
    // token; the 14 ready ones and, once their leases expire, the 5 held at
    // the failover are dispatched; each completes once; none completed
    // before comes back.
    assert!(
        complete(&mut s, kept[0]),
        "a lease held across the failover"
    );
    let mut after: Vec<i64> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while after.len() < 19 && Instant::now() < deadline {
        let got = dispatch(&mut s, 10, "1 minute");
        if got.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
        for j in got {
            assert!(complete(&mut s, j), "job {} did not complete", j.0);
            after.push(j.0);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        dispatch(&mut s, 10, "1 minute").is_empty(),
        "jobs beyond the pending ones"
    );
    let after_set: BTreeSet<i64> = after.iter().copied().collect();
    assert_eq!(
        after.len(),
        after_set.len(),
        "a job dispatched twice: {after:?}"
    );
    let done_set: BTreeSet<i64> = done.iter().chain(&kept).map(|j| j.0).collect();
    let expect: BTreeSet<i64> = all_jobs.difference(&done_set).copied().collect();
    assert_eq!(after_set, expect, "jobs dispatched after the failover");
    for (id, token) in &held {
        // the old lease's token no longer completes it
        assert!(!complete(&mut s, (*id, *token)), "job {id}'s old lease");
    }

    // The schedule (every second, catch_up) fired on both sides of the
    // failover: every slot from its first to its last once, none twice,
    // none skipped, the latest ones by the new primary.
    let (n, distinct, span, newest): (i64, i64, f64, f64) = {
        let r = s
            .query_one(
                "SELECT count(*), count(DISTINCT args->>'scheduled_for'),
                        extract(epoch FROM max((args->>'scheduled_for')::timestamptz)
                                          - min((args->>'scheduled_for')::timestamptz))::float8,
                        extract(epoch FROM clock_timestamp()
                                          - max((args->>'scheduled_for')::timestamptz))::float8
                   FROM pgque.all_jobs WHERE queue = 'sj'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2), r.get(3))
    };
    assert_eq!(n, distinct, "a schedule slot fired twice");
    assert_eq!(
        n,
        span.round() as i64 + 1,
        "a schedule slot skipped ({n} jobs over {span} s)"
    );
    assert!(
        newest < 3.0,
        "the schedule stopped firing after the failover ({newest} s)"
    );
}
