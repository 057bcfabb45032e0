//! Code planted by a database owner (or, on PostgreSQL 14, by anyone who can
//! connect: `public` grants CREATE to PUBLIC there) must never run as the
//! superuser that pgque's background worker and `ticker_loop()` run as.
//!
//! The attacker plants functions and operators that PostgreSQL's name
//! resolution prefers over the built-in ones for the argument types pgque's
//! SQL uses (`int4 * interval` has no exact match in pg_catalog, so
//! `public.*(int4, interval)` wins; likewise `int4 / numeric` and
//! `to_jsonb(record)`), in `public` and in a schema named after the bootstrap
//! superuser (`"$user"`), and makes the database's own search_path put them
//! before pg_catalog. Each planted function records who ran it. The worker
//! runs with the extension and the planted objects present, active
//! (producers commit) and idle (it reads `pgque.duty_due()` on its idle
//! checks), after a restart of its process, and `ticker_loop()` runs as a
//! superuser and as a pgque_admin: no planted function may ever run as a
//! superuser, and the worker and ticker_loop must still do their work.
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::time::{Duration, Instant};

/// The planted objects, created in schema `{s}`; each logs into public.pwned.
fn plant(s: &str) -> String {
    format!(
        r#"
CREATE FUNCTION {s}.pwn_mul(int4, interval) RETURNS interval LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.pwned (via, usr, su) VALUES ('{s}.*(int4, interval)', current_user,
         pg_catalog.current_setting('is_superuser'));
  RETURN $2 OPERATOR(pg_catalog.*) $1::pg_catalog.float8;
END $$;
CREATE OPERATOR {s}.* (LEFTARG = int4, RIGHTARG = interval, FUNCTION = {s}.pwn_mul);
CREATE FUNCTION {s}.pwn_div(int4, numeric) RETURNS numeric LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.pwned (via, usr, su) VALUES ('{s}./(int4, numeric)', current_user,
         pg_catalog.current_setting('is_superuser'));
  RETURN $1::pg_catalog.numeric OPERATOR(pg_catalog./) $2;
END $$;
CREATE OPERATOR {s}./ (LEFTARG = int4, RIGHTARG = numeric, FUNCTION = {s}.pwn_div);
CREATE FUNCTION {s}.to_jsonb(record) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.pwned (via, usr, su) VALUES ('{s}.to_jsonb(record)', current_user,
         pg_catalog.current_setting('is_superuser'));
  RETURN pg_catalog.to_jsonb($1);
END $$;
CREATE FUNCTION {s}.pwn_gt(int8, int8) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.pwned (via, usr, su) VALUES ('{s}.>(int8, int8)', current_user,
         pg_catalog.current_setting('is_superuser'));
  RETURN $1 OPERATOR(pg_catalog.>) $2;
END $$;
CREATE OPERATOR {s}.> (LEFTARG = int8, RIGHTARG = int8, FUNCTION = {s}.pwn_gt);
CREATE FUNCTION {s}.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.pwned (via, usr, su) VALUES ('{s}.clock_timestamp()', current_user,
         pg_catalog.current_setting('is_superuser'));
  RETURN pg_catalog.clock_timestamp();
END $$;
"#
    )
}

fn superuser_rows(c: &mut Client) -> Vec<String> {
    c.query(
        "SELECT via || ' as ' || usr FROM public.pwned WHERE su = 'on' ORDER BY at",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// A superuser connection that resolves nothing through the hostile path.
fn su_conn(cl: &Cluster, db: &str) -> Client {
    let mut c = cl.connect(db);
    c.batch_execute("SET search_path = pg_catalog, pg_temp")
        .unwrap();
    c
}

fn worker_pid(c: &mut Client) -> Option<i32> {
    c.query_opt(
        "SELECT pid FROM pg_catalog.pg_stat_activity WHERE backend_type = 'pgque worker' \
           AND datname = pg_catalog.current_database()",
        &[],
    )
    .unwrap()
    .map(|r| r.get(0))
}

fn ticks(c: &mut Client) -> i64 {
    c.query_one("SELECT pg_catalog.count(*) FROM pgque.tick", &[])
        .unwrap()
        .get(0)
}

/// Sets up database `hw` on `cl` with the attacker's objects and pgque.
fn hostile_db(cl: &Cluster) -> Client {
    let mut pg = su_conn(cl, "postgres");
    pg.batch_execute(
        "CREATE ROLE hw_owner LOGIN; CREATE ROLE hw_anyone LOGIN; CREATE ROLE hw_admin LOGIN;",
    )
    .unwrap();
    pg.batch_execute("CREATE DATABASE hw OWNER hw_owner")
        .unwrap();
    // The database owner: a schema named after the bootstrap superuser, a
    // table everyone may log into, and a search_path that puts the planted
    // objects before pg_catalog for every session that does not set its own.
    let mut owner = cl.connect_as("hw", "hw_owner");
    owner
        .batch_execute(
            "CREATE TABLE public.pwned (via text, usr text, su text,
                                        at timestamptz DEFAULT pg_catalog.clock_timestamp());
             GRANT INSERT, SELECT ON public.pwned TO PUBLIC;
             CREATE SCHEMA postgres;
             GRANT USAGE ON SCHEMA postgres TO PUBLIC;
             ALTER DATABASE hw SET search_path = \"$user\", public, pg_catalog;",
        )
        .unwrap();
    owner.batch_execute(&plant("postgres")).unwrap();
    if major() == 14 {
        // Before 15 any role that can connect creates objects in public.
        let mut anyone = cl.connect_as("hw", "hw_anyone");
        anyone.batch_execute(&plant("public")).unwrap();
    } else {
        // From 15 on, public belongs to the database owner.
        owner.batch_execute(&plant("public")).unwrap();
    }
    // The planted objects are live: a session on the database's path uses them.
    let mut probe = cl.connect_as("hw", "hw_anyone");
    probe
        .batch_execute("SELECT 2 * interval '1 second', 1::int8 > 0::int8")
        .unwrap();
    let live: i64 = probe
        .query_one(
            "SELECT count(*) FROM public.pwned WHERE usr = 'hw_anyone' AND su = 'off'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(live >= 2, "the planted operators are not reached: {live}");

    let mut su = su_conn(cl, "hw");
    su.batch_execute(
        "CREATE EXTENSION pgque;
         GRANT pgque_admin TO hw_admin;",
    )
    .unwrap();
    su
}

/// The worker, active, idle and restarted, runs nothing planted.
#[test]
fn the_worker_never_runs_planted_code_as_superuser() {
    let cl = Cluster::start_new(
        "hostile_worker",
        "pgque.idle_after = '2s'\npgque.idle_check_interval = '1s'\npgque.worker_restart_time = 1",
    );
    let mut su = hostile_db(&cl);
    assert!(
        wait_until(Duration::from_secs(20), || worker_pid(&mut su).is_some()),
        "no worker for the database"
    );
    su.batch_execute(
        "SELECT pgque.create_queue('hq'); SELECT pgque.subscribe('hq', 'c');
         SELECT pgque.create_job_queue('hj');
         SELECT pgque.send_at('hq', 't', 'later', pg_catalog.now() + interval '3 seconds');
         SELECT pgque.enqueue('hj', 'k', '{}'::pg_catalog.jsonb);",
    )
    .unwrap();
    // Active: producers commit for a few seconds, so the worker ticks on
    // their wake-ups and runs its duties on their active cadences.
    let t0 = ticks(&mut su);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        su.batch_execute("SELECT pgque.send('hq', 'x'::pg_catalog.text)")
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        wait_until(Duration::from_secs(10), || ticks(&mut su) > t0),
        "the worker did not tick"
    );
    // Idle: no producer for longer than idle_after, so the worker reads
    // duty_due() on each idle check (every second) and runs what is due
    // (the delayed event, the idle tick).
    std::thread::sleep(Duration::from_secs(6));
    // A restarted worker process reads the database's settings afresh.
    let pid = worker_pid(&mut su).expect("a worker");
    su.batch_execute(&format!("SELECT pg_catalog.pg_terminate_backend({pid})"))
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || worker_pid(&mut su)
            .is_some_and(|p| p != pid)),
        "the worker was not restarted"
    );
    let t1 = ticks(&mut su);
    su.batch_execute("SELECT pgque.send('hq', 'after restart'::pg_catalog.text)")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || ticks(&mut su) > t1),
        "the restarted worker did not tick"
    );
    std::thread::sleep(Duration::from_secs(4));
    // The delayed event was promoted by the worker (a duty that reads times):
    // the promotion horizon passed its delivery time.
    let promoted: bool = su
        .query_one(
            "SELECT s.last_horizon OPERATOR(pg_catalog.>=) (SELECT pg_catalog.max(d.deliver_at) FROM pgque.delayed_event d)
               FROM pgque.delayed_state s",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(promoted, "the delayed event was not promoted");
    let ran = superuser_rows(&mut su);
    assert!(
        ran.is_empty(),
        "planted code ran as superuser in the worker: {ran:?}\n{}",
        cl.log_tail(20)
    );
}

/// ticker_loop() as a superuser on the database's hostile search_path runs
/// nothing planted, and it works for a pgque_admin that is no superuser.
#[test]
fn ticker_loop_runs_nothing_planted_and_works_for_an_admin() {
    let cl = Cluster::start_new("hostile_ticker_loop", "");
    let mut su = hostile_db(&cl);
    su.batch_execute("SELECT pgque.stop(); SELECT pgque.create_queue('tq');")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || worker_pid(&mut su).is_none()),
        "the worker did not stop"
    );
    // A superuser session on the database's own search_path (as pg_cron's).
    let mut cron = cl.connect("hw");
    let path: String = cron.query_one("SHOW search_path", &[]).unwrap().get(0);
    assert!(
        path.contains("public"),
        "the hostile path is in effect: {path}"
    );
    for who in [None, Some("hw_admin")] {
        if let Some(role) = who {
            cron = cl.connect_as("hw", role);
        }
        let before = ticks(&mut su);
        su.batch_execute("SELECT pgque.send('tq', 'x'::pg_catalog.text)")
            .unwrap();
        cron.batch_execute("SET statement_timeout = '1500ms'")
            .unwrap();
        let r = cron.batch_execute("CALL pgque.ticker_loop()");
        assert_eq!(
            sqlstate(r),
            "57014",
            "ticker_loop ({who:?}) must run until cancelled"
        );
        assert!(
            ticks(&mut su) > before,
            "ticker_loop ({who:?}) did not tick"
        );
    }
    let ran = superuser_rows(&mut su);
    assert!(
        ran.is_empty(),
        "planted code ran as superuser in ticker_loop: {ran:?}"
    );
}
