//! Crash safety of consumers: a session that received a batch (or claimed
//! jobs) and dies before acknowledging it, by pg_terminate_backend (on the
//! shared test server: only that backend goes) and by kill -9 (on a private
//! cluster: PostgreSQL then restarts every process and runs crash recovery).
//! Either way the batch is delivered again, whole, and nothing is lost or
//! delivered twice; jobs whose worker died are rescued when their lease
//! expires, with the attempt counted.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::time::Duration;

const SETUP: &str = "SELECT pgque.create_queue('cq'); SELECT pgque.subscribe('cq', 'plain'); \
     SELECT pgque.register_subconsumer('cq', 'grp', 'm1'); \
     SELECT pgque.register_subconsumer('cq', 'grp', 'm2'); \
     SELECT pgque.create_job_queue('jq')";

fn pid(c: &mut Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

fn send_n(c: &mut Client, tag: &str, n: usize) -> Vec<i64> {
    let payloads: Vec<String> = (0..n).map(|i| format!("{tag}-{i}")).collect();
    c.query_one("SELECT pgque.send_batch('cq', $1::text[])", &[&payloads])
        .unwrap()
        .get(0)
}

/// receive() until it returns a batch (the worker ticks), up to 20 s.
fn recv_wait(c: &mut Client, sql: &str) -> (i64, Vec<i64>) {
    let mut got = None;
    let ok = wait_until(Duration::from_secs(20), || {
        let rows = c.query(sql, &[]).unwrap();
        if let Some(r) = rows.first() {
            let b: i64 = r.get(1);
            got = Some((b, rows.iter().map(|r| r.get::<_, i64>(0)).collect()));
            true
        } else {
            false
        }
    });
    assert!(ok, "nothing received within 20 s: {sql}");
    got.unwrap()
}

const PLAIN: &str = "SELECT msg_id, batch_id FROM pgque.receive('cq', 'plain', 100)";
const M1: &str = "SELECT msg_id, batch_id FROM pgque.receive_coop('cq', 'grp', 'm1', 100)";
const M2_TAKEOVER: &str =
    "SELECT msg_id, batch_id FROM pgque.receive_coop('cq', 'grp', 'm2', 100, '1 second')";

fn ack(c: &mut Client, b: i64) {
    let n: i32 = c.query_one("SELECT pgque.ack($1)", &[&b]).unwrap().get(0);
    assert_eq!(n, 1);
}

/// Receives every remaining event of `sql`'s consumer (acking), until a
/// receive stays empty for 1.5 s.
fn drain_quiet(c: &mut Client, sql: &str) -> Vec<i64> {
    let mut all = vec![];
    let mut idle_since = std::time::Instant::now();
    while idle_since.elapsed() < Duration::from_millis(1500) {
        let rows = c.query(sql, &[]).unwrap();
        if let Some(r) = rows.first() {
            let b: i64 = r.get(1);
            all.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
            ack(c, b);
            idle_since = std::time::Instant::now();
        } else {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    all
}

/// How the test kills a session: given the victim's pid and a way to get a
/// fresh connection, kills it and returns once the server accepts sessions.
type Killer<'a> = &'a dyn Fn(i32);

/// A plain consumer dies between receive and ack: the next receive (new
/// session) returns the same batch id with the same events; after its ack
/// the next events follow, none twice.
fn plain_consumer_dies(connect: &dyn Fn() -> Client, kill: Killer) {
    let mut c = connect();
    let sent = send_n(&mut c, "plain", 7);
    let mut victim = connect();
    let vpid = pid(&mut victim);
    let (b, ids) = recv_wait(&mut victim, PLAIN);
    assert_eq!(ids, sent);
    kill(vpid);
    assert!(
        victim.query_one("SELECT 1", &[]).is_err(),
        "victim survived"
    );
    let mut c = connect();
    let (b2, ids2) = recv_wait(&mut c, PLAIN);
    assert_eq!((b2, &ids2), (b, &sent), "the open batch is delivered again");
    ack(&mut c, b2);
    let more = send_n(&mut c, "plain-after", 3);
    assert_eq!(
        drain_quiet(&mut c, PLAIN),
        more,
        "after the ack: only new events"
    );
}

/// A cooperative member dies with an open batch: another member takes the
/// batch over once the dead one is idle past dead_interval, and gets exactly
/// its events; the dead member, back, does not see them again.
fn coop_member_dies(connect: &dyn Fn() -> Client, kill: Killer) {
    let mut c = connect();
    let sent = send_n(&mut c, "coop", 5);
    let mut victim = connect();
    let vpid = pid(&mut victim);
    let (b1, ids1) = recv_wait(&mut victim, M1);
    assert_eq!(ids1, sent);
    kill(vpid);
    let mut m2 = connect();
    std::thread::sleep(Duration::from_millis(1200));
    let (b2, ids2) = recv_wait(&mut m2, M2_TAKEOVER);
    assert_ne!(b2, b1, "a taken-over batch gets a new id");
    assert_eq!(
        ids2, sent,
        "the dead member's events go to the other member"
    );
    ack(&mut m2, b2);
    let mut m1 = connect();
    let more = send_n(&mut m1, "coop-after", 4);
    let (b3, ids3) = recv_wait(&mut m1, M1);
    assert_eq!(ids3, more, "the returning member gets only new events");
    ack(&mut m1, b3);
}

/// A job worker dies holding dispatched jobs: the worker's lease rescue puts
/// them back (attempt 1 counted, "lease expired" recorded); the next
/// dispatch runs attempt 2; the dead worker's lease token is stale.
fn job_worker_dies(connect: &dyn Fn() -> Client, kill: Killer) {
    let mut c = connect();
    let ids: Vec<i64> = c
        .query(
            "SELECT pgque.enqueue('jq', 'k', jsonb_build_object('i', i)) FROM generate_series(1, 3) i",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut victim = connect();
    let vpid = pid(&mut victim);
    let rows = victim
        .query(
            "SELECT job_id, attempt, lease_token FROM pgque.dispatch(ARRAY['jq'], 10, 'w1', '1 second')",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), 3);
    let stale: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(2))).collect();
    assert!(rows.iter().all(|r| r.get::<_, i32>(1) == 1));
    kill(vpid);
    let mut c2 = connect();
    let rescued = wait_until(Duration::from_secs(30), || {
        let n: i64 = c2
            .query_one(
                "SELECT count(*) FROM pgque.jobs WHERE id = ANY($1) AND state = 'ready' AND attempt = 1 \
                   AND errors @> '[{\"error\": \"lease expired\"}]'",
                &[&ids],
            )
            .unwrap()
            .get(0);
        n == 3
    });
    assert!(
        rescued,
        "jobs of the dead worker were not rescued within 30 s"
    );
    let ev: i64 = c2
        .query_one(
            "SELECT count(*) FROM pgque.job_history WHERE job_id = ANY($1) AND event = 'rescued'",
            &[&ids],
        )
        .unwrap()
        .get(0);
    assert_eq!(ev, 3);
    let again = c2
        .query(
            "SELECT job_id, attempt, lease_token FROM pgque.dispatch(ARRAY['jq'], 10, 'w2', '1 minute')",
            &[],
        )
        .unwrap();
    let mut got: Vec<i64> = again.iter().map(|r| r.get(0)).collect();
    got.sort();
    assert_eq!(got, ids);
    assert!(again.iter().all(|r| r.get::<_, i32>(1) == 2), "attempt 2");
    for (id, tok) in &stale {
        let ok: bool = c2
            .query_one("SELECT pgque.complete($1, $2)", &[id, tok])
            .unwrap()
            .get(0);
        assert!(!ok, "the dead worker's lease token still worked");
    }
    for r in &again {
        let ok: bool = c2
            .query_one(
                "SELECT pgque.complete($1, $2)",
                &[&r.get::<_, i64>(0), &r.get::<_, i64>(2)],
            )
            .unwrap()
            .get(0);
        assert!(ok);
    }
}

/// pg_terminate_backend from another session, then wait until it is gone.
fn terminate(db: &TestDb) -> impl Fn(i32) + '_ {
    move |victim: i32| {
        let mut k = db.connect();
        let ok: bool = k
            .query_one("SELECT pg_terminate_backend($1)", &[&victim])
            .unwrap()
            .get(0);
        assert!(ok);
        let gone = wait_until(Duration::from_secs(10), || {
            k.query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&victim],
            )
            .unwrap()
            .get::<_, i64>(0)
                == 0
        });
        assert!(gone);
    }
}

#[test]
fn terminated_plain_consumer_gets_its_batch_again() {
    let db = TestDb::new("crash_term_plain");
    db.connect().batch_execute(SETUP).unwrap();
    plain_consumer_dies(&|| db.connect(), &terminate(&db));
}

#[test]
fn terminated_coop_member_batch_is_taken_over() {
    let db = TestDb::new("crash_term_coop");
    db.connect().batch_execute(SETUP).unwrap();
    coop_member_dies(&|| db.connect(), &terminate(&db));
}

#[test]
fn terminated_job_worker_jobs_are_rescued() {
    let db = TestDb::new("crash_term_job");
    db.connect().batch_execute(SETUP).unwrap();
    job_worker_dies(&|| db.connect(), &terminate(&db));
}

/// kill -9 of the victim's backend on a private cluster: the postmaster
/// kills every session, runs crash recovery and restarts (the pgque worker
/// too); return once the database accepts connections again.
#[test]
fn sigkilled_consumers_and_job_worker_lose_nothing() {
    let cl = Cluster::start_new("crash_kill9", "");
    // One database per scenario, as in the pg_terminate_backend tests.
    for db in ["k9_plain", "k9_coop", "k9_job"] {
        cl.create_db(db).batch_execute(SETUP).unwrap();
    }
    let kill = |victim: i32| {
        kill9(victim);
        // Wait for the restart: the first connection attempts fail while
        // the postmaster resets; connect() retries.
        std::thread::sleep(Duration::from_millis(300));
        drop(cl.connect("postgres"));
    };
    plain_consumer_dies(&|| cl.connect("k9_plain"), &kill);
    coop_member_dies(&|| cl.connect("k9_coop"), &kill);
    job_worker_dies(&|| cl.connect("k9_job"), &kill);
    let log = std::fs::read_to_string(format!("{}/server.log", cl.dir)).unwrap();
    let recoveries = log.matches("terminated by signal 9").count();
    assert!(
        recoveries >= 3,
        "expected three crash restarts in the server log, saw {recoveries}"
    );
}
