//! Privileges beyond the grant matrix (pg_test/sql/privileges.sql):
//! - hostile objects on an unprivileged caller's search_path (functions and
//!   operators shadowing built-ins, tables and temporary tables and types
//!   shadowing pgque's names, each logging if it is ever used) change nothing
//!   in what pgque does: every pgque function pins
//!   `search_path = pg_catalog, pgque, pg_temp` and names its own objects
//!   schema-qualified;
//! - installing pgque needs a superuser: a database owner gets a clear
//!   42501 and nothing is created; after a superuser installs it, that owner
//!   works through the pgque roles but cannot update or drop the extension
//!   (docs/operations.md, "Privileges").
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;
use std::sync::Mutex;

static CREATE: Mutex<()> = Mutex::new(());

fn new_db(name: &str, ext: bool) -> TestDb {
    let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    if ext {
        TestDb::new(name)
    } else {
        TestDb::without_extension(name)
    }
}

fn ensure_role(c: &mut Client, role: &str) {
    c.batch_execute(&format!(
        "DO $r$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $r$"
    ))
    .unwrap();
}

/// Objects an unprivileged user can create to capture unqualified names,
/// each recording its use in evil.calls.
const HOSTILE: &str = r#"
CREATE TABLE evil.calls (what text, at timestamptz DEFAULT pg_catalog.now());
CREATE FUNCTION evil.log(w text) RETURNS void LANGUAGE sql
    AS $$ INSERT INTO evil.calls (what) VALUES (w) $$;
CREATE FUNCTION evil.trg() RETURNS trigger LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log(TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME || ' ' || TG_OP); RETURN NULL; END $$;
-- Built-in functions pgque calls, same signatures and better matches.
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('now'); RETURN '2000-01-01'; END $$;
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('clock_timestamp'); RETURN '2000-01-01'; END $$;
CREATE FUNCTION evil.nextval(regclass) RETURNS bigint LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('nextval(regclass)'); RETURN 1; END $$;
CREATE FUNCTION evil.nextval(text) RETURNS bigint LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('nextval(text)'); RETURN 1; END $$;
CREATE FUNCTION evil.hashtext(text) RETURNS int LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('hashtext'); RETURN 0; END $$;
CREATE FUNCTION evil.hashtextextended(text, bigint) RETURNS bigint LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('hashtextextended'); RETURN 0; END $$;
CREATE FUNCTION evil.pg_current_xact_id() RETURNS xid8 LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('pg_current_xact_id'); RETURN '3'; END $$;
CREATE FUNCTION evil.pg_notify(text, text) RETURNS void LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('pg_notify'); END $$;
CREATE FUNCTION evil.pg_advisory_xact_lock(bigint) RETURNS void LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('pg_advisory_xact_lock'); END $$;
CREATE FUNCTION evil.unnest(text[]) RETURNS SETOF text LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('unnest'); END $$;
CREATE FUNCTION evil.greatest_(int) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;
-- Operators: = and < on the types pgque compares, returning wrong answers.
CREATE FUNCTION evil.eq8(bigint, bigint) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('= bigint'); RETURN false; END $$;
CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.eq8);
CREATE FUNCTION evil.eqt(text, text) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('= text'); RETURN false; END $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.eqt);
CREATE FUNCTION evil.lt8(bigint, bigint) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('< bigint'); RETURN false; END $$;
CREATE OPERATOR evil.< (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.lt8);
-- The same in public (writable by everyone before PostgreSQL 15; granted here).
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('public.now'); RETURN '2000-01-01'; END $$;
CREATE FUNCTION public.hashtextextended(text, bigint) RETURNS bigint LANGUAGE plpgsql
    AS $$ BEGIN PERFORM evil.log('public.hashtextextended'); RETURN 0; END $$;
CREATE TABLE public.queue (queue_id int, queue_name text);
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON public.queue FOR EACH ROW EXECUTE FUNCTION evil.trg();
-- Tables with pgque's names, in the caller's schema ...
CREATE TABLE evil.queue (queue_id int, queue_name text);
CREATE TABLE evil.subscription (sub_id int);
CREATE TABLE evil.jobs (id bigint);
CREATE TABLE evil.tick (tick_queue int);
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON evil.queue FOR EACH ROW EXECUTE FUNCTION evil.trg();
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON evil.jobs FOR EACH ROW EXECUTE FUNCTION evil.trg();
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON evil.tick FOR EACH ROW EXECUTE FUNCTION evil.trg();
-- ... and as temporary tables: pg_temp is searched FIRST for tables and
-- types unless a search_path lists it. A temporary table also makes a type
-- of its name: `text`, `int8` and `jsonb` here shadow the built-in types.
CREATE TEMP TABLE queue (queue_id int, queue_name text);
CREATE TEMP TABLE subscription (sub_id int);
CREATE TEMP TABLE jobs (id bigint);
CREATE TEMP TABLE job_queues (queue_name text);
CREATE TEMP TABLE tick (tick_queue int);
CREATE TEMP TABLE batch (batch_id bigint);
CREATE TEMP TABLE meta_state (cur_piece int2);
CREATE TEMP TABLE text (x int);
CREATE TEMP TABLE int8 (x int);
CREATE TEMP TABLE jsonb (x int);
CREATE TEMP TABLE message (x int);
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON pg_temp.queue FOR EACH ROW EXECUTE FUNCTION evil.trg();
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON pg_temp.jobs FOR EACH ROW EXECUTE FUNCTION evil.trg();
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON pg_temp.tick FOR EACH ROW EXECUTE FUNCTION evil.trg();
CREATE TRIGGER t BEFORE INSERT OR UPDATE OR DELETE ON pg_temp.batch FOR EACH ROW EXECUTE FUNCTION evil.trg();
"#;

/// Runs every public path (event queue, idempotent and delayed sends,
/// cooperative consumer, job queue, info) as the connected user and checks
/// the results; returns nothing, panics on a wrong result.
fn exercise(c: &mut Client) {
    for s in [
        "SELECT pgque.create_queue('hq')",
        "SELECT pgque.subscribe('hq', 'c1')",
        "SELECT pgque.subscribe_subconsumer('hq', 'coop', 'm1')",
        "SELECT pgque.send('hq', 'p1'::pg_catalog.text)",
        "SELECT pgque.send('hq', 't', '{\"p\": 2}'::pg_catalog.jsonb)",
        "SELECT pgque.send_batch('hq', 't', ARRAY['p3', 'p4']::pg_catalog.text[])",
        "SELECT pgque.send_batch('hq', ARRAY['{\"p\": 5}']::pg_catalog.jsonb[])",
        "SELECT pgque.insert_event('hq', 't', 'p5a')",
        "SELECT pgque.insert_event('hq', 't', 'p5b', 'x1', NULL, NULL, NULL)",
        "SELECT pgque.send('hq', 't', 'p5c'::pg_catalog.text, 'key1')",
        "SELECT pgque.send_batch('hq', 't', ARRAY['p5d']::pg_catalog.text[], ARRAY['key2'])",
        "SELECT pgque.send('hq', 't', 'p5e'::pg_catalog.text, 'key3', '{\"traceparent\": \"00-x\"}'::pg_catalog.jsonb)",
        "SELECT pgque.send_batch('hq', 't', ARRAY['p5f']::pg_catalog.text[], NULL, '{\"traceparent\": \"00-y\"}'::pg_catalog.jsonb)",
        "SELECT * FROM pgque.send_idem('hq', 't', 'p6', 'k1', '1 hour')",
        "SELECT * FROM pgque.send_idem('hq', 't', 'p6-again', 'k1', '1 hour')",
        "SELECT pgque.send_at('hq', 't', 'p7', pg_catalog.now() - interval '1 second')",
        "SELECT pgque.send_at('hq', 't', 'later', pg_catalog.now() + interval '1 hour')",
        "SELECT pgque.maint_delayed()",
        "SELECT pgque.force_tick('hq')",
    ] {
        c.batch_execute(s).unwrap_or_else(|e| panic!("{s}: {e:?}"));
    }
    let rows = c
        .query(
            "SELECT msg_id, batch_id, payload, created_at > pg_catalog.now() OPERATOR(pg_catalog.-) interval '1 minute'
               FROM pgque.receive('hq', 'c1', 100)",
            &[],
        )
        .unwrap();
    let payloads: Vec<String> = rows.iter().map(|r| r.get(2)).collect();
    assert_eq!(
        payloads,
        [
            "p1",
            "{\"p\": 2}",
            "p3",
            "p4",
            "{\"p\": 5}",
            "p5a",
            "p5b",
            "p5c",
            "p5d",
            "p5e",
            "p5f",
            "p6",
            "p7"
        ],
        "what c1 receives"
    );
    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "distinct increasing ids: {ids:?}"
    );
    assert!(
        rows.iter().all(|r| r.get::<_, bool>(3)),
        "event times are now, not 2000"
    );
    let batch: i64 = rows[0].get(1);
    let n: i32 = c
        .query_one("SELECT pgque.ack($1)", &[&batch])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let coop = c
        .query(
            "SELECT payload FROM pgque.receive_coop('hq', 'coop', 'm1', 100)",
            &[],
        )
        .unwrap();
    assert_eq!(
        coop.len(),
        13,
        "the cooperative consumer gets the batch too"
    );
    let traced: Vec<String> = c
        .query(
            "SELECT headers OPERATOR(pg_catalog.->>) 'traceparent' FROM pgque.receive_coop_with_headers('hq', 'coop', 'm1', 100) \
              WHERE headers IS NOT NULL ORDER BY msg_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(traced, ["00-x", "00-y"], "the traced events' headers");
    let info: i64 = c
        .query_one("SELECT count(*) FROM pgque.get_consumer_info('hq')", &[])
        .unwrap()
        .get(0);
    // c1, coop and its member coop.m1 (a row of its own, as PgQue lists it)
    assert_eq!(info, 3);
    let q: i64 = c
        .query_one("SELECT count(*) FROM pgque.get_queue_info()", &[])
        .unwrap()
        .get(0);
    assert_eq!(q, 1);

    // Job queue.
    for s in [
        "SELECT pgque.create_job_queue('hj')",
        "SELECT pgque.enqueue('hj', 'k', '{\"a\": 1}'::pg_catalog.jsonb, actor => 'acme')",
        "SELECT pgque.enqueue('hj', 'k', '{\"a\": 2}'::pg_catalog.jsonb, unique_key => 'u1')",
        "SELECT pgque.enqueue('hj', 'k', '{\"a\": 3}'::pg_catalog.jsonb, unique_key => 'u1')",
    ] {
        c.batch_execute(s).unwrap_or_else(|e| panic!("{s}: {e:?}"));
    }
    let jobs = c
        .query(
            "SELECT job_id, lease_token, args::pg_catalog.text FROM pgque.dispatch(ARRAY['hj'], 10, 'w')",
            &[],
        )
        .unwrap();
    let args: Vec<String> = jobs.iter().map(|r| r.get(2)).collect();
    assert_eq!(
        args,
        ["{\"a\": 1}", "{\"a\": 2}"],
        "dispatched jobs (u1 once)"
    );
    for r in &jobs {
        let ok: bool = c
            .query_one(
                "SELECT pgque.complete($1, $2)",
                &[&r.get::<_, i64>(0), &r.get::<_, i64>(1)],
            )
            .unwrap()
            .get(0);
        assert!(ok);
    }
    let done: i64 = c
        .query_one(
            "SELECT completed FROM pgque.job_queue_status WHERE queue_name OPERATOR(pg_catalog.=) 'hj'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(done, 2);
    c.batch_execute("SELECT pgque.maint(); SELECT pgque.job_maint(); SELECT * FROM pgque.status(); SELECT pgque.version()")
        .unwrap();
}

#[test]
fn hostile_search_path_objects_change_nothing() {
    let db = new_db("hostile_path", true);
    let mut su = db.connect();
    stop_worker(&mut su);
    ensure_role(&mut su, "hostile_mallory");
    su.batch_execute(
        "GRANT pgque_admin TO hostile_mallory;
         CREATE SCHEMA evil AUTHORIZATION hostile_mallory;
         GRANT CREATE ON SCHEMA public TO hostile_mallory;",
    )
    .unwrap();
    let mut m = db.connect_as("hostile_mallory");
    m.batch_execute(HOSTILE).unwrap();
    // The caller's own unqualified names now resolve to the hostile objects
    // (proof that they are live) ...
    m.batch_execute("SET search_path = evil, pg_catalog")
        .unwrap();
    let t: bool = m
        .query_one("SELECT now() < '2001-01-01'::timestamptz", &[])
        .unwrap()
        .get(0);
    assert!(t, "the caller's now() is the hostile one");
    let calls: i64 = m
        .query_one("SELECT count(*) FROM evil.calls", &[])
        .unwrap()
        .get(0);
    assert_eq!(calls, 1);
    m.batch_execute("TRUNCATE evil.calls").unwrap();

    // ... while pgque, called with that search_path, uses none of them.
    exercise(&mut m);
    let used: Vec<String> = m
        .query("SELECT what FROM evil.calls ORDER BY at", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(used.is_empty(), "hostile objects used by pgque: {used:?}");
    for t in [
        "evil.queue",
        "evil.jobs",
        "evil.tick",
        "pg_temp.queue",
        "pg_temp.jobs",
        "pg_temp.tick",
    ] {
        let n: i64 = m
            .query_one(&format!("SELECT count(*) FROM {t}"), &[])
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "{t} was written");
    }
    // And pgque's own tables hold what was done.
    let (q, j): (i64, i64) = {
        let r = su
            .query_one(
                "SELECT (SELECT count(*) FROM pgque.queue), (SELECT count(*) FROM pgque.jobs)",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((q, j), (1, 2));
}

/// The invariant behind the test above, over every function (also those
/// added later): the pinned search_path lists exactly pg_catalog, pgque and
/// pg_temp (last). Procedures are exempt: one that COMMITs (ticker_loop)
/// cannot carry a SET clause, so it schema-qualifies every name instead.
#[test]
fn every_function_pins_search_path_with_pg_temp_last() {
    let db = new_db("hostile_pins", true);
    let mut c = db.connect();
    let bad: Vec<String> = c
        .query(
            // pgque's lock functions (src/locks.rs) and job_channel are the
            // exception: C functions that run no statement and resolve no
            // name, with invoker's rights; the lock functions are called per
            // row inside pgque's own statements, where a setting would cost a
            // security-definer call frame each time. They must stay exactly that.
            // So is the send path (send, send_batch, insert_event: C,
            // invoker's rights, no setting), which switches to the owner
            // itself and qualifies every name (src/api/owner.rs): the
            // setting's save and restore was a measured part of each send.
            // The test above runs them under the hostile search_path.
            "SELECT p.oid::regprocedure::text FROM pg_proc p
              WHERE p.pronamespace = 'pgque'::regnamespace AND p.prokind <> 'p'
                AND NOT coalesce('search_path=pg_catalog, pgque, pg_temp' = ANY (p.proconfig), false)
                AND NOT (p.proname IN ('xact_lock', 'xact_lock_shared', 'try_xact_lock', 'job_channel',
                                       'send', 'send_batch', 'insert_event')
                         AND NOT p.prosecdef AND p.proconfig IS NULL
                         AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'c'))
              ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        bad.is_empty(),
        "functions without the pinned search_path: {bad:?}"
    );
}

/// The send path runs as pgque's owner without SECURITY DEFINER
/// (src/api/owner.rs) and hands the caller's identity back: after a send,
/// and after a send that failed inside a caught exception, the session is
/// the caller again, still without any right on pgque's tables; a role
/// without pgque_writer cannot call it at all.
#[test]
fn the_send_path_switches_to_the_owner_and_back() {
    let db = new_db("hostile_switch", true);
    let mut su = db.connect();
    stop_worker(&mut su);
    ensure_role(&mut su, "hostile_sender");
    ensure_role(&mut su, "hostile_nobody");
    su.batch_execute(
        "GRANT pgque_writer TO hostile_sender;
         SELECT pgque.create_queue('sq'); SELECT pgque.subscribe('sq', 'c');",
    )
    .unwrap();
    let mut w = db.connect_as("hostile_sender");
    w.batch_execute(
        "SELECT pgque.send('sq', 'a'::text);
         SELECT pgque.send_batch('sq', ARRAY['b', 'c']::text[]);
         SELECT pgque.insert_event('sq', 't', 'd');
         DO $d$ BEGIN PERFORM pgque.send('no_such_queue', 'x'::text);
                EXCEPTION WHEN undefined_object THEN NULL; END $d$;",
    )
    .unwrap();
    let who: String = w
        .query_one("SELECT current_user::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(who, "hostile_sender", "the caller again after the sends");
    let qid: i32 = su
        .query_one(
            "SELECT queue_id FROM pgque.queue WHERE queue_name = 'sq'",
            &[],
        )
        .unwrap()
        .get(0);
    for s in [
        "SELECT count(*) FROM pgque.queue".to_string(),
        format!("SELECT count(*) FROM pgque.event_{qid}"),
        format!("INSERT INTO pgque.event_{qid}_0 (ev_id) VALUES (1)"),
    ] {
        let e = w.batch_execute(&s).expect_err(&s);
        assert_eq!(
            e.code(),
            Some(&pgque_pg_test::postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{s}: {e:?}"
        );
    }
    let mut n = db.connect_as("hostile_nobody");
    let e = n
        .batch_execute("SELECT pgque.send('sq', 'e'::text)")
        .expect_err("send without pgque_writer");
    assert_eq!(
        e.code(),
        Some(&pgque_pg_test::postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
    );
    su.batch_execute("SELECT pgque.force_tick('sq')").unwrap();
    let got: Vec<String> = su
        .query("SELECT payload FROM pgque.receive('sq', 'c', 100)", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, ["a", "b", "c", "d"]);
}

#[test]
fn a_database_owner_cannot_install_and_works_through_the_roles() {
    let mut su = connect_to("postgres");
    ensure_role(&mut su, "hostile_dbowner");
    su.batch_execute(
        "DO $r$ BEGIN REVOKE pgque_admin FROM hostile_dbowner; \
         EXCEPTION WHEN undefined_object THEN NULL; END $r$",
    )
    .unwrap();
    let db = new_db("hostile_owner", false);
    su.batch_execute("ALTER DATABASE hostile_owner OWNER TO hostile_dbowner")
        .unwrap();
    let mut o = db.connect_as("hostile_dbowner");
    let e = o.batch_execute("CREATE EXTENSION pgque").unwrap_err();
    let dbe = e.as_db_error().expect("a server error");
    assert_eq!(dbe.code().code(), "42501", "{dbe:?}");
    assert!(
        dbe.message()
            .contains("permission denied to create extension \"pgque\""),
        "{dbe:?}"
    );
    assert!(
        dbe.hint().unwrap_or("").contains("superuser"),
        "the hint says who can: {dbe:?}"
    );
    let left: i64 = o
        .query_one(
            "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = 'pgque')
                  + (SELECT count(*) FROM pg_extension WHERE extname = 'pgque')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "a refused CREATE EXTENSION leaves nothing");

    // The supported path: a superuser installs, the owner gets a role.
    {
        let _g = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        db.connect()
            .batch_execute("CREATE EXTENSION pgque")
            .unwrap();
    }
    // Without a pgque role the owner of the database may call nothing.
    assert_eq!(
        sqlstate(o.batch_execute("SELECT pgque.create_queue('oq')")),
        "42501"
    );
    db.connect()
        .batch_execute("GRANT pgque_admin TO hostile_dbowner")
        .unwrap();
    let mut o = db.connect_as("hostile_dbowner");
    for s in [
        "SELECT pgque.create_queue('oq')",
        "SELECT pgque.subscribe('oq', 'c')",
        "SELECT pgque.send('oq', 'x'::text)",
        "SELECT pgque.force_tick('oq')",
    ] {
        o.batch_execute(s).unwrap_or_else(|e| panic!("{s}: {e:?}"));
    }
    let got: Vec<String> = o
        .query("SELECT payload FROM pgque.receive('oq', 'c', 10)", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, ["x"]);
    // Updating and dropping stay with superusers.
    assert_eq!(
        sqlstate(o.batch_execute("ALTER EXTENSION pgque UPDATE")),
        "42501"
    );
    assert_eq!(sqlstate(o.batch_execute("DROP EXTENSION pgque")), "42501");
    // Nor can the owner open pgque's schema to itself.
    assert_eq!(
        sqlstate(o.batch_execute("CREATE TABLE pgque.mine (x int)")),
        "42501"
    );
}
