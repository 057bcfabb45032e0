//! Dump and restore: pg_dump of a database holding every kind of pgque
//! state, pg_restore into a new database (docs/operations.md, the procedure
//! this follows): every row of user data arrives (extension tables through
//! their pg_extension_config_dump registrations, the per-queue event tables
//! as ordinary tables), sequences keep their values, and the restored
//! database goes on working: pending events are delivered exactly once to
//! each consumer from where it was, jobs run to completion.
mod rel_util;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use rel_util::*;
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Mutex;

static CREATE: Mutex<()> = Mutex::new(());

/// Row counts of every table and last values of every sequence in schema
/// pgque (extension members and the runtime event tables alike).
fn contents(c: &mut Client) -> BTreeMap<String, i64> {
    let rels: Vec<(String, String)> = c
        .query(
            "SELECT c.oid::regclass::text, c.relkind::text FROM pg_class c
              WHERE c.relnamespace = 'pgque'::regnamespace AND c.relkind IN ('r', 'S')
              ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut m = BTreeMap::new();
    for (rel, kind) in rels {
        let sql = if kind == "S" {
            format!("SELECT last_value FROM {rel}")
        } else {
            format!("SELECT count(*) FROM ONLY {rel}")
        };
        m.insert(rel, c.query_one(&sql, &[]).unwrap().get(0));
    }
    m
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run a PostgreSQL client program");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// Where pg_dump and pg_restore come from: the server's own, except on
/// PostgreSQL 14, whose pg_dump (14.23) crashes with a segmentation fault on
/// any partition that belongs to an extension, as pgque's metadata partitions
/// do. pg_dump dumps servers older than itself, so 14 is dumped and restored
/// with Debian's 15 (docs/operations.md, "Dump and restore").
fn dump_bindir() -> String {
    if major() == 14 {
        "/usr/lib/postgresql/15/bin".to_string()
    } else {
        bindir()
    }
}

fn conn_args(cmd: &mut Command) -> &mut Command {
    cmd.args(["-h", &host(), "-p", &port().to_string(), "-U", "postgres"])
}

#[test]
fn dump_and_restore_keeps_queues_consumers_and_jobs() {
    let src = {
        let _g = CREATE.lock().unwrap();
        TestDb::new("dr_src")
    };
    let mut c = src.connect();
    stop_worker(&mut c);
    let filled = fill(&mut c, false);
    let before = contents(&mut c);
    // What the dump must leave out: delayed events already promoted.
    let promoted_before: i64 = c
        .query_one(
            "SELECT count(*) FROM pgque.delayed_event d, pgque.delayed_state s
              WHERE d.deliver_at <= s.last_horizon AND pg_visible_in_snapshot(d.ev_txid, s.last_snapshot)",
            &[],
        )
        .unwrap()
        .get(0);

    let file = std::env::temp_dir().join(format!("pgque_dump_{}.dump", std::process::id()));
    run(
        conn_args(&mut Command::new(format!("{}/pg_dump", dump_bindir())))
            .args(["-Fc", "-d", &src.name, "-f"])
            .arg(&file),
    );
    let dst = TestDb::without_extension("dr_dst");
    // One transaction: the restored database's worker (started by CREATE
    // EXTENSION) sees nothing before every row is in.
    run(
        conn_args(&mut Command::new(format!("{}/pg_restore", dump_bindir())))
            .args(["--single-transaction", "--exit-on-error", "-d", &dst.name])
            .arg(&file),
    );
    let _ = std::fs::remove_file(&file);

    let mut d = dst.connect();
    stop_worker(&mut d);
    let after = contents(&mut d);
    // The restored database's worker runs from the restore's commit until
    // stop_worker: on a slow machine delayed-1 (due ~2 s after the fill) comes
    // due meanwhile and is promoted there, one more event in its queue.
    let promoted_in_dst: i64 = d
        .query_one(
            "SELECT count(*) FROM pgque.delayed_event d, pgque.delayed_state s
              WHERE d.deliver_at <= s.last_horizon AND pg_visible_in_snapshot(d.ev_txid, s.last_snapshot)",
            &[],
        )
        .unwrap()
        .get(0);
    // ... and, the same way, the scheduled job s1 (due ~2 s after the fill)
    // may have been promoted there: one job event, and a ready_seq taken
    // from jobs_id_seq.
    let s1_promoted_in_dst: i64 = d
        .query_one(
            "SELECT count(*) FROM pgque.jobs WHERE kind = 's1' AND state <> 'scheduled'",
            &[],
        )
        .unwrap()
        .get(0);
    // Every table and sequence of schema pgque came across.
    let missing: Vec<&String> = before.keys().filter(|k| !after.contains_key(*k)).collect();
    assert!(missing.is_empty(), "not restored: {missing:?}");
    let mut wrong = vec![];
    for (rel, n) in &before {
        let m = after[rel];
        let ok = match rel.as_str() {
            // Install-script singletons: the restored database has its own.
            "pgque.worker_config"
            | "pgque.meta_state"
            | "pgque.idem_state"
            | "pgque.delayed_state"
            | "pgque.job_maint_state" => m == 1,
            // Only the delayed events not yet promoted are dumped.
            "pgque.delayed_event_p0" | "pgque.delayed_event_p1" => m <= *n,
            // A worker may have ticked between restore and stop_worker.
            "pgque.tick_p0" | "pgque.tick_p1" | "pgque.tick_id_seq" => m >= *n,
            // ... and written its history minute (one row per queue).
            r if r.starts_with("pgque.metric_history_") => m >= *n,
            // ... and promoted delayed-1 into uq's current event table.
            r if r.starts_with("pgque.event_1_") => m == *n || m == *n + promoted_in_dst,
            "pgque.job_events" | "pgque.job_events_id_seq" | "pgque.jobs_id_seq" => {
                m == *n + s1_promoted_in_dst
            }
            _ => m == *n,
        };
        if !ok {
            wrong.push(format!("{rel}: {n} before, {m} after"));
        }
    }
    assert!(
        wrong.is_empty(),
        "restored contents differ:\n{}",
        wrong.join("\n")
    );
    let delayed_after = after["pgque.delayed_event_p0"] + after["pgque.delayed_event_p1"];
    let delayed_before = before["pgque.delayed_event_p0"] + before["pgque.delayed_event_p1"];
    assert_eq!(delayed_after, delayed_before - promoted_before);
    assert!(
        // r2 (actor) and s1 (scheduled) are rows of pgque.jobs, and so is r1,
        // which the fixture's dispatch moved there to rank it before r2; r1
        // and r3 were each one row of the job log
        before["pgque.event_1_id_seq"] > 0
            && before["pgque.jobs"] == 3
            && before["pgque.job_log_0"] == 2,
        "the fixture is not empty: {before:?}"
    );
    // The queue's sequence reference points at the restored sequence.
    let seq_ok: bool = d
        .query_one(
            "SELECT queue_event_seq = 'pgque.event_1_id_seq'::regclass FROM pgque.queue WHERE queue_name = 'uq'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(seq_ok, "queue_event_seq names the restored sequence");

    // The restored database works: everything pending is consumed, from
    // where each consumer was, and the jobs run.
    consume_all(&mut d, &filled);
}
