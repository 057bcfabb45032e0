//! Schedules across crashes, on private clusters (a crash restarts every
//! process of its server): a worker killed with SIGKILL while it fires a
//! per-second schedule, and a server stopped with `-m immediate`, never give
//! a slot twice, and under misfire catch_up skip none: after recovery the
//! worker fires the slots of the downtime, then goes on.
mod sched_util;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use sched_util::*;
use std::time::Duration;

fn worker_pid(cl: &Cluster, db: &str) -> Option<i32> {
    let mut admin = pgque_pg_test::postgres::Client::connect(
        &cl.conninfo("postgres"),
        pgque_pg_test::postgres::NoTls,
    )
    .ok()?;
    admin
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgque worker' AND datname = $1",
            &[&db],
        )
        .ok()
        .flatten()
        .map(|r| r.get(0))
}

fn fired(c: &mut Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pgque.all_jobs WHERE kind = 'beat'",
        &[],
    )
    .map(|r| r.get(0))
    .unwrap_or(0)
}

fn setup(cl: &Cluster) -> Client {
    let mut c = cl.create_db("sched");
    c.batch_execute(
        "SELECT pgque.create_job_queue('cq');
         SELECT pgque.create_schedule('beat', '* * * * * *', 'cq', 'beat', misfire => 'catch_up')",
    )
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || fired(&mut c) >= 3),
        "the worker did not fire the schedule: {}",
        cl.log_tail(30)
    );
    c
}

/// After the crash: waits until the worker fired slots past `after`, stops
/// it, and checks every slot from the first to the last came exactly once.
fn check_after_recovery(cl: &Cluster, after: i64) {
    let mut c = cl.connect("sched");
    assert!(
        wait_until(Duration::from_secs(60), || {
            c.query_one(
                "SELECT coalesce(max(extract(epoch FROM (args->>'scheduled_for')::timestamptz)), 0)::bigint
                   FROM pgque.all_jobs WHERE kind = 'beat'",
                &[],
            )
            .map(|r| r.get::<_, i64>(0) >= after + 3)
            .unwrap_or(false)
        }),
        "no slot fired after recovery: {}",
        cl.log_tail(40)
    );
    c.batch_execute("SELECT pgque.pause_schedule('beat')")
        .unwrap();
    let by_kind = slots_by_kind(&mut c);
    let slots = &by_kind["beat"];
    assert_every_second_once("beat", slots);
    let first: i64 = c
        .query_one(
            "SELECT extract(epoch FROM min(created_at))::bigint FROM pgque.schedules_def",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        slots[0] <= first + 1,
        "the first slot after creation is missing: {slots:?}"
    );
}

fn now_unix(c: &mut Client) -> i64 {
    c.query_one("SELECT extract(epoch FROM now())::bigint", &[])
        .unwrap()
        .get(0)
}

#[test]
fn sigkilled_worker_neither_repeats_nor_skips_a_slot() {
    let cl = Cluster::start_new("sched_kill", "");
    drop(setup(&cl));
    let mut last_pid = None;
    for _ in 0..3 {
        let pid = worker_pid(&cl, "sched").expect("a worker");
        assert_ne!(Some(pid), last_pid);
        kill9(pid);
        // the whole server restarts (crash recovery), then the worker
        assert!(
            wait_until(Duration::from_secs(60), || worker_pid(&cl, "sched")
                .is_some_and(|p| p != pid)),
            "no worker after kill -9: {}",
            cl.log_tail(40)
        );
        last_pid = Some(pid);
        std::thread::sleep(Duration::from_millis(1500));
    }
    let mut c = cl.connect("sched");
    let t = now_unix(&mut c);
    check_after_recovery(&cl, t);
}

#[test]
fn immediate_shutdown_neither_repeats_nor_skips_a_slot() {
    let cl = Cluster::start_new("sched_stop", "");
    drop(setup(&cl));
    cl.stop_immediate();
    // down for a few slots; catch_up fires them after the restart
    std::thread::sleep(Duration::from_secs(3));
    cl.start();
    let mut c = cl.connect("sched");
    let t = now_unix(&mut c);
    check_after_recovery(&cl, t);
}
