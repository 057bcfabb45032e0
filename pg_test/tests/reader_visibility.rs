//! What the explorer's and the event browser's functions (sql/34_explorer.sql,
//! sql/35_event_browser.sql, granted to pgque_reader) show to whom
//! (docs/operations.md, "What each role can see and do"):
//! - a pgque_reader sees the states, counts, kinds, queues, timings and
//!   attempts of jobs and events, and none of their contents (job args,
//!   outputs, progress, error texts and tracebacks, event and dead-letter
//!   payloads, headers, dead-letter reasons); a text search of args and
//!   errors is refused (42501);
//! - a pgque_admin sees the contents;
//! - nobody gets a running job's lease token, so nothing a reader saw lets
//!   it complete, fail, heartbeat or snooze another worker's job.
//!
//! Every secret the fixture stores carries the marker SECRET, so "no
//! contents" is checked over the whole text of every row a function returns.
mod events_util;
use events_util::*;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;

const MARK: &str = "SECRET";

fn ensure_role(c: &mut Client, name: &str, attrs: &str) {
    c.batch_execute(&format!(
        "DO $$ BEGIN CREATE ROLE {name} {attrs}; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    ))
    .unwrap();
}

fn i64s(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// The fixture's ids: jobs of queue vq and the tokens their worker holds.
struct Fixture {
    /// completed in the log, with an output
    done: i64,
    /// failed once (retried), then dispatched again: running in pgque.jobs
    rerun: (i64, i64),
    /// failed for good, its error with a traceback
    failed: i64,
    /// running in the log, with progress
    running: (i64, i64),
    /// a flow's two jobs (args each)
    flow: (i64, i64, i64),
    /// every job id
    all: Vec<i64>,
}

fn fixture(c: &mut Client) -> Fixture {
    c.batch_execute(
        "SELECT pgque.create_job_queue('vq');
         SELECT pgque.create_queue('veq');
         SELECT pgque.set_queue_config('veq', 'max_retries', '0');
         SELECT pgque.subscribe('veq', 'gives_up');
         SELECT pgque.subscribe('veq', 'slow');",
    )
    .unwrap();
    let enq = |c: &mut Client, n: i32, attempts: i32| -> i64 {
        c.query_one(
            "SELECT pgque.enqueue('vq', 'mail', pg_catalog.jsonb_build_object('to', 'ARGS-SECRET-' || $1::int),
                                  max_attempts => $2::int,
                                  headers => '{\"tracestate\": \"HDR-SECRET\"}'::jsonb)",
            &[&n, &attempts],
        )
        .unwrap()
        .get(0)
    };
    let done = enq(c, 1, 1);
    let rerun = enq(c, 2, 2);
    let failed = enq(c, 3, 1);
    let running = enq(c, 4, 1);
    let got: Vec<(i64, i64)> = c
        .query(
            "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['vq'], 4, 'w1', '1 hour')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(got.len(), 4, "{got:?}");
    let tok = |id: i64| got.iter().find(|g| g.0 == id).unwrap().1;
    let ok = |c: &mut Client, sql: &str, id: i64, t: i64| {
        let r: bool = c.query_one(sql, &[&id, &t]).unwrap().get(0);
        assert!(r, "{sql} for job {id}");
    };
    ok(
        c,
        "SELECT pgque.complete($1, $2, '{\"o\": \"OUTPUT-SECRET\"}')",
        done,
        tok(done),
    );
    ok(
        c,
        "SELECT pgque.fail($1, $2, 'ERROR-SECRET once', pg_catalog.now()) IS NOT NULL",
        rerun,
        tok(rerun),
    );
    ok(
        c,
        "SELECT pgque.fail($1, $2, E'ERROR-SECRET for good\\nTraceback: SECRET.py line 1') IS NOT NULL",
        failed,
        tok(failed),
    );
    ok(
        c,
        "SELECT pgque.set_progress($1, $2, '{\"p\": \"PROGRESS-SECRET\"}')",
        running,
        tok(running),
    );
    let again: Vec<(i64, i64)> = c
        .query(
            "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['vq'], 4, 'w2', '1 hour')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(again.iter().map(|g| g.0).collect::<Vec<_>>(), [rerun]);
    let flow: Vec<(i64, i64)> = c
        .query(
            "SELECT flow_id, job_id FROM pgque.enqueue_flow('vq', '[
                {\"key\": \"a\", \"kind\": \"fetch\", \"args\": {\"s\": \"ARGS-SECRET-flow\"}},
                {\"key\": \"b\", \"kind\": \"render\", \"depends_on\": [\"a\"]}]') ORDER BY job_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // events: `gives_up` dead-letters one with a reason; `slow` reads nothing
    c.batch_execute(
        "SELECT pgque.send('veq', 'order', '{\"p\": \"PAYLOAD-SECRET\"}'::jsonb, 'key-1',
                           '{\"tracestate\": \"HDR-SECRET\"}'::jsonb);
         SELECT pgque.send('veq', 'order', '{\"p\": \"PAYLOAD-SECRET-2\"}'::jsonb, 'key-2');",
    )
    .unwrap();
    tick(c, "veq");
    let batch: i64 = c
        .query_one(
            "WITH m AS MATERIALIZED (SELECT * FROM pgque.receive('veq', 'gives_up', 100))
             SELECT pg_catalog.max((m).batch_id) FROM m
              WHERE pgque.nack((m).batch_id, m, '0 seconds', 'REASON-SECRET') IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    ack(c, batch);
    assert_eq!(
        i64s(c, "SELECT count(*) FROM pgque.dlq_inspect('veq', 10)"),
        2
    );
    let mut all = vec![done, rerun, failed, running, flow[0].1, flow[1].1];
    all.sort_unstable();
    Fixture {
        done,
        rerun: (rerun, again[0].1),
        failed,
        running: (running, tok(running)),
        flow: (flow[0].0, flow[0].1, flow[1].1),
        all,
    }
}

/// What one role gets from every reader-granted function of the explorer and
/// the event browser, each row as jsonb text, by function.
fn everything(c: &mut Client, f: &Fixture) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rows = |what: String, sql: &str, c: &mut Client| {
        for r in c.query(sql, &[]).unwrap() {
            let v: Option<String> = r.get(0);
            out.push((what.clone(), v.unwrap_or_default()));
        }
    };
    rows(
        "list_jobs".into(),
        "SELECT pg_catalog.to_jsonb(l)::text FROM pgque.list_jobs('vq', max_jobs => 100) l",
        c,
    );
    for st in ["running", "completed", "failed", "ready", "waiting"] {
        rows(
            format!("list_jobs {st}"),
            &format!("SELECT pg_catalog.to_jsonb(l)::text FROM pgque.list_jobs(NULL, '{st}') l"),
            c,
        );
    }
    for id in &f.all {
        rows(
            format!("job_detail {id}"),
            &format!("SELECT pgque.job_detail({id})::text"),
            c,
        );
        rows(
            format!("job_timeline {id}"),
            &format!("SELECT pg_catalog.to_jsonb(t)::text FROM pgque.job_timeline({id}) t"),
            c,
        );
        rows(
            format!("job_children {id}"),
            &format!("SELECT pg_catalog.to_jsonb(t)::text FROM pgque.job_children({id}) t"),
            c,
        );
    }
    rows(
        "flow_graph".into(),
        &format!(
            "SELECT pg_catalog.to_jsonb(g)::text FROM pgque.flow_graph({}) g",
            f.flow.0
        ),
        c,
    );
    for consumer in ["NULL", "'slow'"] {
        rows(
            format!("browse_events {consumer}"),
            &format!(
                "SELECT pg_catalog.to_jsonb(e)::text FROM pgque.browse_events('veq', {consumer}) e"
            ),
            c,
        );
    }
    rows(
        "browse_dead_letters".into(),
        "SELECT pg_catalog.to_jsonb(d)::text FROM pgque.browse_dead_letters('veq') d",
        c,
    );
    out
}

/// A job's job_detail as the connected role gets it (jsonb text).
fn detail(c: &mut Client, id: i64) -> String {
    c.query_one("SELECT pgque.job_detail($1)::text", &[&id])
        .unwrap()
        .get(0)
}

fn has_key(c: &mut Client, o: &str, k: &str) -> bool {
    c.query_one("SELECT $1::text::jsonb ? $2", &[&o, &k])
        .unwrap()
        .get(0)
}

/// The value at a dotted path of a jsonb text (`errors.0.at`), as text.
fn field(c: &mut Client, o: &str, path: &str) -> Option<String> {
    c.query_one(
        "SELECT $1::text::jsonb #>> $2::text[]",
        &[&o, &path.split('.').map(str::to_string).collect::<Vec<_>>()],
    )
    .unwrap()
    .get(0)
}

#[test]
fn visibility_a_reader_sees_no_token_and_no_contents_an_admin_contents_and_no_token() {
    let db = new_db("visibility");
    let mut su = db.connect();
    stop_worker(&mut su);
    ensure_role(&mut su, "vis_reader", "LOGIN IN ROLE pgque_reader");
    ensure_role(&mut su, "vis_admin", "LOGIN IN ROLE pgque_admin");
    let f = fixture(&mut su);
    let mut reader = db.connect_as("vis_reader");
    let mut admin = db.connect_as("vis_admin");

    // The reader: every row of every function, and not one secret.
    let seen = everything(&mut reader, &f);
    assert!(seen.len() > 20, "the fixture shows rows: {seen:?}");
    let leaks: Vec<&(String, String)> = seen.iter().filter(|(_, v)| v.contains(MARK)).collect();
    assert!(leaks.is_empty(), "contents a reader saw: {leaks:#?}");
    // ... but the figures: states, kinds, attempts, timings, keys
    let d = detail(&mut reader, f.failed);
    assert_eq!(field(&mut reader, &d, "state").as_deref(), Some("failed"));
    assert_eq!(field(&mut reader, &d, "kind").as_deref(), Some("mail"));
    assert_eq!(field(&mut reader, &d, "attempt").as_deref(), Some("1"));
    assert!(field(&mut reader, &d, "finished_at").is_some());
    assert_eq!(
        field(&mut reader, &d, "errors.0.attempt").as_deref(),
        Some("1")
    );
    assert!(field(&mut reader, &d, "errors.0.at").is_some());
    assert_eq!(
        field(&mut reader, &d, "contents_hidden").as_deref(),
        Some("true")
    );
    for k in ["args", "output", "progress", "headers", "lease_token"] {
        assert!(
            !has_key(&mut reader, &d, k),
            "job_detail gives a reader {k}"
        );
    }
    let ev: i64 = i64s(
        &mut reader,
        "SELECT count(*) FROM pgque.browse_events('veq') e
          WHERE e.ev_type = 'order' AND e.partition_key LIKE 'key-%' AND e.ev_data IS NULL",
    );
    assert_eq!(ev, 2, "a reader sees the waiting events without payloads");
    let dl: i64 = i64s(
        &mut reader,
        "SELECT count(*) FROM pgque.browse_dead_letters('veq') d
          WHERE d.consumer = 'gives_up' AND d.ev_data IS NULL AND d.dl_reason IS NULL
            AND d.headers IS NULL",
    );
    assert_eq!(dl, 2);
    // A search of args and errors would read them out: refused, 42501.
    for s in ["SECRET", "ARGS-SECRET-1"] {
        let r = reader.query("SELECT * FROM pgque.list_jobs('vq', NULL, NULL, $1)", &[&s]);
        assert_eq!(sqlstate(r), "42501", "a reader's search for {s}");
    }
    // A session that SET ROLE to a reader is a reader, even a superuser's.
    su.batch_execute("SET ROLE pgque_reader").unwrap();
    let leaks: Vec<(String, String)> = everything(&mut su, &f)
        .into_iter()
        .filter(|(_, v)| v.contains(MARK))
        .collect();
    assert!(
        leaks.is_empty(),
        "contents after SET ROLE pgque_reader: {leaks:#?}"
    );
    su.batch_execute("RESET ROLE").unwrap();

    // The admin: the contents, and still no token.
    let seen = everything(&mut admin, &f);
    for (what, secret) in [
        (format!("job_detail {}", f.done), "ARGS-SECRET-1"),
        (format!("job_detail {}", f.done), "OUTPUT-SECRET"),
        (format!("job_detail {}", f.done), "HDR-SECRET"),
        (format!("job_detail {}", f.running.0), "PROGRESS-SECRET"),
        (format!("job_detail {}", f.failed), "Traceback: SECRET.py"),
        (format!("job_detail {}", f.rerun.0), "ERROR-SECRET once"),
        (format!("job_detail {}", f.flow.1), "ARGS-SECRET-flow"),
        (
            format!("job_timeline {}", f.failed),
            "ERROR-SECRET for good",
        ),
        ("list_jobs failed".into(), "ERROR-SECRET for good"),
        ("browse_events NULL".into(), "PAYLOAD-SECRET"),
        ("browse_events NULL".into(), "HDR-SECRET"),
        ("browse_events 'slow'".into(), "PAYLOAD-SECRET-2"),
        ("browse_dead_letters".into(), "PAYLOAD-SECRET"),
        ("browse_dead_letters".into(), "REASON-SECRET"),
        ("browse_dead_letters".into(), "HDR-SECRET"),
    ] {
        assert!(
            seen.iter().any(|(w, v)| *w == what && v.contains(secret)),
            "the admin does not see {secret} in {what}"
        );
    }
    for id in &f.all {
        let d = detail(&mut admin, *id);
        assert!(
            !has_key(&mut admin, &d, "lease_token"),
            "job_detail gives the admin job {id}'s token"
        );
        assert_eq!(
            field(&mut admin, &d, "contents_hidden").as_deref(),
            Some("false")
        );
    }
    let n: i64 = admin
        .query_one(
            "SELECT count(*) FROM pgque.list_jobs('vq', NULL, NULL, 'error-secret for')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "the admin's search finds the failed job");
    // The superuser (a member of every role) is an admin here too.
    let d = detail(&mut su, f.done);
    assert!(field(&mut su, &d, "args.to").is_some_and(|a| a == "ARGS-SECRET-1"));
}

/// A reader that completes, fails, snoozes and heartbeats a running job
/// (of the log, and of pgque.jobs) with the lease token the explorer shows
/// it changes nothing, because the explorer shows it none; the worker's own
/// token still completes the job. (job_detail used to return the token, and
/// any reader could finish another worker's job with it.)
#[test]
fn visibility_a_forged_completion_with_what_a_reader_saw_changes_nothing() {
    let db = new_db("visibility_forge");
    let mut su = db.connect();
    stop_worker(&mut su);
    ensure_role(&mut su, "vis_forger", "LOGIN IN ROLE pgque_reader");
    let f = fixture(&mut su);
    let mut reader = db.connect_as("vis_forger");
    for (job, real) in [f.running, f.rerun] {
        let d = detail(&mut reader, job);
        assert_eq!(field(&mut reader, &d, "state").as_deref(), Some("running"));
        // what a forger would take: the token job_detail shows, if any
        let shown: Option<i64> = field(&mut reader, &d, "lease_token").map(|t| t.parse().unwrap());
        assert_eq!(
            shown, None,
            "job_detail shows the reader job {job}'s lease token"
        );
        let state = |su: &mut Client| -> (String, i32) {
            let r = su
                .query_one("SELECT state, attempt FROM pgque.get_job($1)", &[&job])
                .unwrap();
            (r.get(0), r.get(1))
        };
        let before = state(&mut su);
        for sql in [
            "SELECT pgque.complete($1, $2) IS TRUE",
            "SELECT pgque.fail($1, $2, 'forged') IS NOT NULL",
            "SELECT pgque.snooze($1, $2, pg_catalog.now()) IS TRUE",
            "SELECT count(*) > 0 FROM pgque.heartbeat(ARRAY[$1::int8], ARRAY[$2::int8])",
        ] {
            let r = reader.query_one(sql, &[&job, &shown]);
            let took = r
                .map(|r| r.get::<_, Option<bool>>(0) == Some(true))
                .unwrap_or(false);
            assert!(!took, "{sql} with what the reader saw took job {job}");
        }
        assert_eq!(state(&mut su), before, "job {job} is still its worker's");
        let ok: bool = su
            .query_one("SELECT pgque.complete($1, $2)", &[&job, &real])
            .unwrap()
            .get(0);
        assert!(ok, "the worker's own token completes job {job}");
    }
}
