//! Upgrades: a database installed at a released version (the frozen
//! sql/archive/pgque--<version>.sql, loaded against the current library), holding
//! every kind of state, is brought to the current version with
//! `ALTER EXTENSION pgque UPDATE`; then every extension object must equal a
//! fresh install's in another database (the difference is printed), and the
//! old data must still be consumable.
mod rel_util;
use pgque_pg_test::*;
use rel_util::*;
use std::sync::Mutex;
use std::time::Duration;

/// CREATE EXTENSION in two databases at once races on the cluster-wide roles.
static CREATE: Mutex<()> = Mutex::new(());

/// Every released version, oldest first: each must update to the current one.
const RELEASED: [&str; 8] = [
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0",
];

fn default_version(c: &mut pgque_pg_test::postgres::Client) -> String {
    c.query_one(
        "SELECT default_version FROM pg_available_extensions WHERE name = 'pgque'",
        &[],
    )
    .unwrap()
    .get(0)
}

fn create_at(db: &TestDb, version: Option<&str>) {
    let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    let sql = match version {
        Some(v) => format!("CREATE EXTENSION pgque VERSION '{v}'"),
        None => "CREATE EXTENSION pgque".into(),
    };
    db.connect().batch_execute(&sql).unwrap();
}

// The old versions' job rows are written as those versions wrote them (the
// same statements for 0.1.0 and 0.2.0 on these columns): the current job
// functions need the current job store (0.2.0: jobs.rr_key; 0.3.0:
// job_events.job_ids), so they cannot fill an un-updated schema.
#[test]
fn update_from_0_1_0_equals_a_fresh_install_and_keeps_the_data() {
    update_from("0.1.0", true);
}

#[test]
fn update_from_0_2_0_equals_a_fresh_install_and_keeps_the_data() {
    update_from("0.2.0", true);
}

#[test]
fn update_from_0_3_0_equals_a_fresh_install_and_keeps_the_data() {
    update_from("0.3.0", true);
}

// 0.4.0 to 0.8.0 have the current job store, so their jobs are made by the current
// functions: r1 and r3 go to the job log, r2 (an actor) and s1 (scheduled)
// to pgque.jobs, and the update must keep both stores' jobs.
#[test]
fn update_from_0_4_0_equals_a_fresh_install_and_keeps_the_data() {
    update_from("0.4.0", false);
}

#[test]
fn update_from_0_5_0_equals_a_fresh_install_and_keeps_the_data() {
    update_from("0.5.0", false);
}

#[test]
fn update_from_0_6_0_equals_a_fresh_install_and_keeps_the_data() {
    update_from("0.6.0", false);
}

#[test]
fn update_from_0_7_0_equals_a_fresh_install_and_keeps_the_data() {
    update_from("0.7.0", false);
}

#[test]
fn update_from_0_8_0_equals_a_fresh_install_and_keeps_the_data() {
    update_from("0.8.0", false);
}

fn update_from(from_v: &str, jobs_as_0_1_0: bool) {
    let tag = from_v.replace('.', "_");
    let old = TestDb::without_extension(&format!("upg_from_{tag}"));
    let fresh = TestDb::without_extension(&format!("upg_fresh_{tag}"));
    create_at(&old, Some(from_v));
    create_at(&fresh, None);
    let mut c = old.connect();
    let v: String = c
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'pgque'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(v, from_v);
    let current = default_version(&mut c);
    assert_ne!(
        current, from_v,
        "the control file's default version is the new one"
    );
    // Manual mode: the test decides when ticks and maintenance happen.
    stop_worker(&mut c);
    let filled = fill(&mut c, jobs_as_0_1_0);
    // A job log with history (0.4.0 on): its status figures must come out
    // the same from the updated schema (0.7.0 counts claims and done rows by
    // their n, which the update computes for the rows already there).
    let log_figures = (!jobs_as_0_1_0).then(|| fill_log_history(&mut c));

    let mut f = fresh.connect();
    let want = snapshot(&mut f);
    if from_v == "0.1.0" {
        // The comparison can find a difference (the test has something to
        // find): 0.1.0 pinned search_path without pg_temp.
        let before = snapshot(&mut c);
        assert!(
            !diff("updated", &before, "fresh", &want).is_empty(),
            "a 0.1.0 install must differ from a fresh {current} one"
        );
    }

    c.batch_execute("ALTER EXTENSION pgque UPDATE").unwrap();
    let v: String = c
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'pgque'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(v, current);
    let got = snapshot(&mut c);
    let d = diff("updated", &got, "fresh", &want);
    assert!(
        d.is_empty(),
        "after ALTER EXTENSION pgque UPDATE ({from_v} -> {current}) the extension differs from a fresh \
         install; extend the upgrade script that leads to {current} (scripts/upgrade_draft.py \
         drafts it):\n{d}"
    );
    assert!(
        got.keys().filter(|k| k.starts_with("function ")).count() > 80
            && got.keys().any(|k| k.starts_with("pg_dump registration ")),
        "the snapshot sees the functions and the pg_dump registrations"
    );

    if let Some(before) = log_figures {
        assert_eq!(
            job_figures(&mut c),
            before,
            "job_queue_status of the job log's history after the update ({from_v} -> {current})"
        );
        let wrong: i64 = c
            .query_one(
                "SELECT (SELECT count(*) FROM pgque.job_claims WHERE n IS DISTINCT FROM cardinality(job_ids))
                      + (SELECT count(*) FROM pgque.job_done WHERE n IS DISTINCT FROM cardinality(job_ids))",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(
            wrong, 0,
            "claim and done rows without their job count after the update"
        );
    }

    // The data made under the old version is consumed under the new one.
    consume_all(&mut c, &filled);

    // And the worker runs the updated database again.
    c.batch_execute("SELECT pgque.start()").unwrap();
    let back = wait_until(Duration::from_secs(10), || {
        c.query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgque worker' \
               AND datname = current_database()",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
            == 1
    });
    assert!(back, "the worker of the updated database did not start");
}

/// (queue, ready, running, completed, failed) of every job queue.
fn job_figures(c: &mut pgque_pg_test::postgres::Client) -> Vec<(String, i64, i64, i64, i64)> {
    c.query(
        "SELECT queue_name, ready, running, completed, failed FROM pgque.job_queue_status ORDER BY 1",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
    .collect()
}

/// Queue `hq` with a job log history of every kind the status counts: a
/// claim completed whole, one completed partly (one by one and in a
/// batch, the rest running), jobs left ready. Enqueue and dispatch are the
/// current functions (the log's tables are 0.4.0's); the done rows are
/// written as the old versions' complete and complete_many wrote them (one
/// per call and claim: the current ones also write 0.7.0's outputs).
/// Returns job_figures (checked against what was done).
fn fill_log_history(c: &mut pgque_pg_test::postgres::Client) -> Vec<(String, i64, i64, i64, i64)> {
    c.batch_execute(
        "SELECT pgque.create_job_queue('hq');
         SELECT count(*) FROM pgque.enqueue_ready_rows('hq', array_fill('h'::text, ARRAY[30]),
             array_fill('{}'::jsonb, ARRAY[30]));
         SELECT count(*) FROM pgque.enqueue_ready_rows('hq', array_fill('h'::text, ARRAY[30]),
             array_fill('{}'::jsonb, ARRAY[30]));
         CREATE TEMP TABLE hq_claim AS
           SELECT job_id, lease_token, row_number() OVER (ORDER BY job_id) AS o
             FROM pgque.dispatch(ARRAY['hq'], 20, 'w', interval '1 hour');
         INSERT INTO pgque.job_done (seg, claim_id, kind, job_ids, at)
           SELECT c.seg, c.claim_id, 'c', c.job_ids, now() FROM pgque.job_claims c
            WHERE c.claim_id = (SELECT min(lease_token) FROM hq_claim);
         DROP TABLE hq_claim;
         CREATE TEMP TABLE hq_claim AS
           SELECT job_id, lease_token, row_number() OVER (ORDER BY job_id) AS o
             FROM pgque.dispatch(ARRAY['hq'], 25, 'w', interval '1 hour');
         INSERT INTO pgque.job_done (seg, claim_id, kind, job_ids, at)
           SELECT c.seg, c.claim_id, 'c', ARRAY[h.job_id], now()
             FROM hq_claim h JOIN pgque.job_claims c ON c.claim_id = h.lease_token WHERE h.o <= 3;
         INSERT INTO pgque.job_done (seg, claim_id, kind, job_ids, at)
           SELECT c.seg, c.claim_id, 'c', array_agg(h.job_id ORDER BY h.job_id), now()
             FROM hq_claim h JOIN pgque.job_claims c ON c.claim_id = h.lease_token
            WHERE h.o BETWEEN 4 AND 12 GROUP BY c.seg, c.claim_id;
         DROP TABLE hq_claim;",
    )
    .unwrap();
    let f = job_figures(c);
    let hq = f.iter().find(|r| r.0 == "hq").cloned();
    assert_eq!(
        hq,
        Some(("hq".into(), 15, 13, 32, 0)),
        "ready, running, completed, failed of hq before the update"
    );
    f
}

/// The update path exists from every released version, one script per
/// release, and the frozen scripts are shipped (a broken install path would
/// make the tests above fail late and unclearly).
#[test]
fn the_update_paths_from_released_versions_are_installed() {
    let db = TestDb::without_extension("upg_paths");
    let mut c = db.connect();
    let current = default_version(&mut c);
    let versions: Vec<String> = c
        .query(
            "SELECT version FROM pg_available_extension_versions WHERE name = 'pgque' ORDER BY version",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        versions.contains(&current),
        "installable versions: {versions:?}"
    );
    for (i, old) in RELEASED.iter().enumerate() {
        assert!(
            versions.contains(&old.to_string()),
            "installable versions: {versions:?}"
        );
        let path: Option<String> = c
            .query_one(
                "SELECT path FROM pg_extension_update_paths('pgque') WHERE source = $1 AND target = $2",
                &[old, &current],
            )
            .unwrap()
            .get(0);
        let mut want: Vec<&str> = RELEASED[i..].to_vec();
        want.push(&current);
        assert_eq!(path.as_deref(), Some(want.join("--").as_str()));
    }
}
