//! Schedules on a real server: racing `run_schedules()` callers fire each
//! slot exactly once (none twice, none skipped under catch_up), the worker
//! fires schedules by itself and shows the duty in pgque.status(), and a
//! fired job is an ordinary job (dispatch, complete). Crashes are in
//! schedules_crash.rs (they restart a private cluster).
mod sched_util;
use pgque_pg_test::*;
use sched_util::*;
use std::time::Duration;

#[test]
fn racing_callers_fire_every_slot_exactly_once() {
    let db = TestDb::new("sched_race");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute("SELECT pgque.create_job_queue('sq')")
        .unwrap();
    const N: usize = 40;
    for i in 0..N {
        c.execute(
            "SELECT pgque.create_schedule($1, '* * * * * *', 'sq', $1, misfire => 'catch_up')",
            &[&format!("k{i}")],
        )
        .unwrap();
    }
    // every schedule missed the last 20 seconds
    c.batch_execute(
        "UPDATE pgque.schedules_def SET next_run_at = date_trunc('second', now()) - interval '20 seconds'",
    )
    .unwrap();
    let start: i64 = c
        .query_one(
            "SELECT extract(epoch FROM min(next_run_at))::bigint FROM pgque.schedules",
            &[],
        )
        .unwrap()
        .get(0);
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let mut s = db.connect();
            std::thread::spawn(move || {
                let mut fired = 0i64;
                while std::time::Instant::now() < until {
                    let n: i32 = s
                        .query_one("SELECT pgque.run_schedules()", &[])
                        .unwrap()
                        .get(0);
                    fired += n as i64;
                }
                fired
            })
        })
        .collect();
    let fired: i64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let last: i64 = c
        .query_one("SELECT extract(epoch FROM now())::bigint", &[])
        .unwrap()
        .get(0);
    let by_kind = slots_by_kind(&mut c);
    assert_eq!(by_kind.len(), N);
    let total: usize = by_kind.values().map(Vec::len).sum();
    assert_eq!(
        total as i64, fired,
        "run_schedules() counts disagree with the jobs"
    );
    for (kind, slots) in &by_kind {
        assert_every_second_once(kind, slots);
        assert_eq!(
            slots[0], start,
            "{kind}: the first missed slot was not fired"
        );
        // the callers ran for 3 s: each schedule got past its missed slots
        assert!(*slots.last().unwrap() >= start + 20, "{kind}: {slots:?}");
        assert!(*slots.last().unwrap() <= last);
    }
    // what the view says agrees with the jobs
    let agree: bool = c
        .query_one(
            "SELECT bool_and(s.last_job_id = (SELECT max(j.id) FROM pgque.all_jobs j WHERE j.kind = s.kind)
                             AND s.next_run_at > s.last_run_at)
               FROM pgque.schedules s",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(agree);
}

#[test]
fn the_worker_fires_schedules_and_status_shows_the_duty() {
    let db = TestDb::new("sched_worker");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_job_queue('wq');
         SELECT pgque.create_schedule('every-second', '* * * * * *', 'wq', 'beat', '{\"n\": 7}',
                                      misfire => 'catch_up')",
    )
    .unwrap();
    let fired = wait_until(Duration::from_secs(20), || {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pgque.all_jobs WHERE kind = 'beat'",
                &[],
            )
            .unwrap()
            .get(0);
        n >= 3
    });
    assert!(
        fired,
        "the worker fired fewer than 3 slots of a per-second schedule in 20 s"
    );
    let st: String = c
        .query_one(
            "SELECT status FROM pgque.status() WHERE component = 'duty:schedules'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(st, "ok");
    c.batch_execute("SELECT pgque.pause_schedule('every-second')")
        .unwrap();
    // a fired job is an ordinary job: dispatched and completed like any other
    let row = c
        .query_one(
            "SELECT job_id, lease_token, (args->>'n')::int FROM pgque.dispatch(ARRAY['wq'], 1, 'w1')",
            &[],
        )
        .unwrap();
    let (id, token, n): (i64, i64, i32) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(n, 7);
    let done: bool = c
        .query_one("SELECT pgque.complete($1, $2)", &[&id, &token])
        .unwrap()
        .get(0);
    assert!(done);
    let by_kind = slots_by_kind(&mut c);
    assert_every_second_once("beat", &by_kind["beat"]);
}

#[test]
fn bad_schedules_are_refused_and_change_nothing() {
    let db = TestDb::new("sched_bad");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute(
        "SELECT pgque.create_job_queue('bq');
         SELECT pgque.create_schedule('one', '@hourly', 'bq', 'k')",
    )
    .unwrap();
    for (sql, state) in [
        (
            "SELECT pgque.create_schedule('x', '61 * * * *', 'bq', 'k')",
            "22007",
        ),
        (
            "SELECT pgque.create_schedule('x', '* * *', 'bq', 'k')",
            "22007",
        ),
        (
            "SELECT pgque.create_schedule('x', '0 0 30 2 *', 'bq', 'k')",
            "22023",
        ),
        (
            "SELECT pgque.create_schedule('x', '@daily', 'nope', 'k')",
            "42704",
        ),
        (
            "SELECT pgque.create_schedule('x', '@daily', 'bq', 'k', timezone => 'Mars/Base')",
            "22023",
        ),
        (
            "SELECT pgque.create_schedule('one', '@daily', 'bq', 'k')",
            "42710",
        ),
        (
            "SELECT pgque.create_schedule('x', NULL, 'bq', 'k')",
            "22004",
        ),
        (
            "SELECT pgque.create_schedule('x', '@daily', 'bq', 'k', misfire => 'later')",
            "22023",
        ),
        (
            "SELECT pgque.create_schedule('x', '@daily', 'bq', 'k', '[1]')",
            "22023",
        ),
        (
            "SELECT pgque.alter_schedule('one', cron => 'often')",
            "22007",
        ),
        ("SELECT pgque.alter_schedule('nope', kind => 'k2')", "42704"),
        (
            "SELECT pgque.alter_schedule('one', queue_name => 'nope')",
            "42704",
        ),
    ] {
        assert_eq!(sqlstate(c.execute(sql, &[])), state, "{sql}");
    }
    let (n, cron): (i64, String) = {
        let r = c
            .query_one("SELECT count(*), min(cron) FROM pgque.schedules", &[])
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((n, cron.as_str()), (1, "@hourly"));
}

/// Each firing, by the duty (run_schedules) or run now, puts its job in
/// front of the schedule's recent ones, ten kept: what the schedules page
/// shows, read with the schedule's row, so its cost does not depend on how
/// many jobs or firings there were (checked: after 25 firings the row holds
/// ten ids, and reading it touches the schedules table only).
#[test]
fn a_schedule_keeps_the_jobs_of_its_last_ten_firings() {
    let db = TestDb::new("sched_recent");
    let mut c = db.connect();
    stop_worker(&mut c);
    c.batch_execute(
        "SELECT pgque.create_job_queue('rq'); \
         SELECT pgque.create_schedule('r', '* * * * * *', 'rq', 'tick')",
    )
    .unwrap();
    let mut fired: Vec<i64> = vec![];
    for i in 0..25 {
        if i % 2 == 0 {
            // due now: the duty fires its one slot (misfire skip)
            c.batch_execute(
                "UPDATE pgque.schedules_def SET next_run_at = date_trunc('second', now()) - interval '1 second' \
                  WHERE name = 'r'",
            )
            .unwrap();
            let n: i32 = c
                .query_one("SELECT pgque.run_schedules()", &[])
                .unwrap()
                .get(0);
            assert_eq!(n, 1, "firing {i}");
        } else {
            c.query_one("SELECT pgque.run_schedule_now('r')", &[])
                .unwrap();
        }
        let last: i64 = c
            .query_one(
                "SELECT last_job_id FROM pgque.schedules WHERE name = 'r'",
                &[],
            )
            .unwrap()
            .get(0);
        fired.push(last);
    }
    let want: Vec<i64> = fired.iter().rev().take(10).copied().collect();
    let recent: Vec<i64> = c
        .query_one(
            "SELECT recent_job_ids FROM pgque.schedules WHERE name = 'r'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(recent, want);
    // each is a job of the schedule, as fired
    let kinds: i64 = c
        .query_one(
            "SELECT count(*) FROM unnest($1::bigint[]) u(id) \
              WHERE (SELECT kind FROM pgque.get_job(u.id)) = 'tick'",
            &[&recent],
        )
        .unwrap()
        .get(0);
    assert_eq!(kinds, 10);
    // The page's read: the schedules view by name, one row per schedule;
    // no job table is scanned for the recent ids (they are in the row).
    let plan: String = c
        .query(
            "EXPLAIN (COSTS OFF) SELECT s.name, s.recent_job_ids FROM pgque.schedules s \
              ORDER BY s.name LIMIT 1000",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(plan.contains("schedules_def"), "{plan}");
    assert!(
        !plan.contains("jobs") && !plan.contains("job_log"),
        "{plan}"
    );
}
