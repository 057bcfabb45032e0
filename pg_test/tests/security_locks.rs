//! No lock another role can hold stalls the worker or the job calls
//! (docs/operations.md, "Threat model"): a role with no pgque rights holds
//! every advisory key of every lock class pgque used, and a reader holds
//! the table locks of slot-index DDL in open transactions, while producers,
//! consumers and the worker's duties must go on.
mod sec_util;
use pgque_pg_test::*;
use sec_util::*;
use std::time::Duration;

#[test]
fn security_no_foreign_lock_stalls_the_worker_or_the_job_calls() {
    let _g = serial();
    let db = TestDb::new("sec_locks");
    let mut su = db.connect();
    ensure_role(&mut su, "sec_nobody", "LOGIN");
    ensure_role(&mut su, "sec_reader", "LOGIN IN ROLE pgque_reader");
    su.batch_execute(
        "SELECT pgque.create_queue('ev'); SELECT pgque.subscribe('ev', 'c'); \
         SELECT pgque.create_queue('ev2'); SELECT pgque.subscribe('ev2', 'c'); \
         SELECT pgque.subscribe_partitioned('ev', 'pa', 4); \
         SELECT pgque.create_job_queue('jq'); \
         SELECT pgque.enqueue('jq', 'k', '{}')",
    )
    .unwrap();
    let claimed = su
        .query_one(
            "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['jq'], 1, 'w1')",
            &[],
        )
        .unwrap();
    let (job, token): (i64, i64) = (claimed.get(0), claimed.get(1));
    let scheduled: i64 = su
        .query_one(
            "SELECT pgque.enqueue('jq', 'later', '{}', run_at => now() + interval '2 seconds')",
            &[],
        )
        .unwrap()
        .get(0);

    // Every advisory key of every lock class pgque used, computed as pgque
    // computes it, held by a role that may call no pgque function.
    let keys: Vec<(i32, i32)> = su
        .query(
            "SELECT 1785684580, lane_id::int FROM pgque.job_lanes \
             UNION ALL SELECT 1785684579, hashint8(claim_id) FROM pgque.job_claims \
             UNION ALL SELECT 1785684588, hashtext('jq/0/0') \
             UNION ALL SELECT 1785684593, hashtext('jq')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(keys.len() >= 4, "{keys:?}");
    let mut nobody = db.connect_as("sec_nobody");
    for (class, key) in &keys {
        nobody
            .execute("SELECT pg_advisory_lock($1, $2)", &[class, key])
            .unwrap();
    }
    // A reader's open transaction that would create a slot index (SHARE
    // lock on the event tables) and one that would drop one (ACCESS
    // EXCLUSIVE), both left open.
    let mut r1 = db.connect_as("sec_reader");
    r1.batch_execute("SET statement_timeout = '5s'; BEGIN")
        .unwrap();
    let create_index =
        failure(r1.batch_execute("SELECT pgque.subscribe_partitioned('ev', 'pb', 8)"));
    let mut r2 = db.connect_as("sec_reader");
    r2.batch_execute("SET statement_timeout = '5s'; BEGIN")
        .unwrap();
    let drop_index = failure(r2.batch_execute("SELECT pgque.unsubscribe_partitioned('ev', 'pa')"));

    // Meanwhile producers, consumers and the worker go on.
    su.batch_execute("SET statement_timeout = '5s'").unwrap();
    let results = [
        (
            "send to the queue",
            failure(su.batch_execute("SELECT pgque.send('ev', 'x'::text)")),
        ),
        (
            "enqueue",
            failure(su.batch_execute("SELECT pgque.enqueue('jq', 'k2', '{}')")),
        ),
        (
            "dispatch",
            failure(su.batch_execute("SELECT * FROM pgque.dispatch(ARRAY['jq'], 10, 'w2')")),
        ),
        (
            "complete",
            failure(su.batch_execute(&format!("SELECT pgque.complete({job}, {token})"))),
        ),
    ];
    for (what, (st, msg)) in &results {
        assert_eq!(
            st, "",
            "{what} failed while another role held pgque's lock keys: {msg}"
        );
    }
    assert_eq!(
        create_index.0, "42501",
        "a reader created slot indexes: {}",
        create_index.1
    );
    assert_eq!(drop_index.0, "", "a reader's unsubscribe: {}", drop_index.1);
    let sent: i64 = su
        .query_one("SELECT pgque.send('ev2', 'y'::text)", &[])
        .unwrap()
        .get(0);
    let mut got = vec![];
    let ticked = wait_until(Duration::from_secs(15), || {
        got.extend(
            su.query("SELECT msg_id FROM pgque.receive('ev2', 'c', 10)", &[])
                .unwrap()
                .iter()
                .map(|r| r.get::<_, i64>(0)),
        );
        got.contains(&sent)
    });
    assert!(ticked, "the worker stopped ticking: {got:?}");
    let promoted = wait_until(Duration::from_secs(15), || {
        su.query_one(
            "SELECT state::text FROM pgque.jobs WHERE id = $1",
            &[&scheduled],
        )
        .unwrap()
        .get::<_, String>(0)
            != "scheduled"
    });
    assert!(
        promoted,
        "job maintenance stopped: the scheduled job stayed scheduled"
    );
    drop((r1, r2, nobody));
}
