//! Event queues: every bad input gets its SQLSTATE and changes nothing; role
//! separation (writer sends, reader receives, PUBLIC calls nothing).
mod events_util;
use events_util::*;
use pgque_pg_test::postgres::Client;
use pgque_pg_test::*;

fn state(c: &mut Client, sql: &str) -> String {
    sqlstate(c.batch_execute(sql))
}

fn counts(c: &mut Client) -> (i64, i64, i64) {
    (
        i64s(c, "SELECT count(*) FROM pgque.queue"),
        i64s(c, "SELECT count(*) FROM pgque.subscription"),
        i64s(c, "SELECT count(*) FROM pgque.event_1"),
    )
}

#[test]
fn bad_inputs_get_specific_sqlstates_and_change_nothing() {
    let db = manual_db("ev_badinput");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c')")
        .unwrap();
    let before = counts(&mut c);
    let long = "x".repeat(58);
    let cases: Vec<(String, &str)> = vec![
        ("SELECT pgque.send(NULL, 'x'::text)".into(), "22004"),
        ("SELECT pgque.send('', 'x'::text)".into(), "42602"),
        (format!("SELECT pgque.send('{long}', 'x'::text)"), "42622"),
        ("SELECT pgque.send('nope', 'x'::text)".into(), "42704"),
        ("SELECT pgque.send('q', 'not json'::jsonb)".into(), "22P02"),
        (
            "SELECT pgque.send('q', 't', 'not json'::jsonb)".into(),
            "22P02",
        ),
        (
            "SELECT pgque.send('q', NULL::text, 'x'::text)".into(),
            "22004",
        ),
        ("SELECT pgque.send_batch('q', NULL::text[])".into(), "22004"),
        (
            "SELECT pgque.send_batch('q', ARRAY['{', '1']::jsonb[])".into(),
            "22P02",
        ),
        ("SELECT pgque.create_queue(NULL)".into(), "22004"),
        ("SELECT pgque.create_queue(E'a\\nb')".into(), "42602"),
        (format!("SELECT pgque.create_queue('{long}')"), "42622"),
        ("SELECT pgque.subscribe('q', 'a#b')".into(), "42602"),
        ("SELECT pgque.subscribe('q', '')".into(), "42602"),
        ("SELECT pgque.subscribe('q', NULL)".into(), "22004"),
        ("SELECT pgque.subscribe('nope', 'c')".into(), "42704"),
        ("SELECT pgque.unsubscribe('nope', 'c')".into(), "42704"),
        ("SELECT * FROM pgque.receive('q', 'ghost')".into(), "42704"),
        ("SELECT * FROM pgque.receive('nope', 'c')".into(), "42704"),
        ("SELECT * FROM pgque.receive('q', 'c', 0)".into(), "22023"),
        (
            "SELECT * FROM pgque.receive('q', 'c', NULL)".into(),
            "22004",
        ),
        ("SELECT pgque.ack(NULL)".into(), "22004"),
        ("SELECT pgque.nack(-1, ROW(1, -1, 't', 'x', NULL, now(), NULL, NULL, NULL, NULL)::pgque.message)".into(), "42704"),
        ("SELECT pgque.nack(-1, NULL::pgque.message)".into(), "22004"),
        (
            "SELECT pgque.set_queue_config('q', 'bogus', '1')".into(),
            "22023",
        ),
        (
            "SELECT pgque.set_queue_config('q', 'ticker_max_count', 'many')".into(),
            "22023",
        ),
        (
            "SELECT pgque.set_queue_config('q', 'ticker_max_lag', '-3 s')".into(),
            "22023",
        ),
        (
            "SELECT pgque.set_queue_config('q', 'max_retries', '-1')".into(),
            "22023",
        ),
        (
            "SELECT pgque.set_queue_config('q', NULL, '1')".into(),
            "22004",
        ),
        (
            "SELECT pgque.set_queue_config('nope', 'max_retries', '1')".into(),
            "42704",
        ),
        ("SELECT pgque.drop_queue('q')".into(), "55000"),
        ("SELECT pgque.drop_queue('nope')".into(), "42704"),
        ("SELECT * FROM pgque.get_batch_info(-5)".into(), "42704"),
        ("SELECT * FROM pgque.get_batch_events(-5)".into(), "42704"),
        (
            "SELECT pgque.register_consumer_at('q', 'c2', -7)".into(),
            "42704",
        ),
        ("SELECT pgque.dlq_replay(-1)".into(), "42704"),
        ("SELECT pgque.dlq_purge('q', NULL)".into(), "22004"),
        (
            "SELECT * FROM pgque.receive_coop('nope', 'c', 'ghost')".into(),
            "42704",
        ),
        (
            "SELECT pgque.register_subconsumer('q', 'c', '')".into(),
            "42602",
        ),
        (
            "SELECT * FROM pgque.get_consumer_info('q', 'ghost')".into(),
            "42704",
        ),
        ("SELECT * FROM pgque.get_queue_info('nope')".into(), "42704"),
    ];
    for (sql, want) in &cases {
        assert_eq!(&state(&mut c, sql), want, "{sql}");
    }
    assert_eq!(counts(&mut c), before, "a failed call changed something");
    // Setting NULL resets to the default.
    c.batch_execute(
        "SELECT pgque.set_queue_config('q', 'ticker_max_count', '7'); \
         SELECT pgque.set_queue_config('q', 'ticker_max_count', NULL)",
    )
    .unwrap();
    assert_eq!(
        i64s(
            &mut c,
            "SELECT queue_ticker_max_count::int8 FROM pgque.get_queue_info('q')"
        ),
        500
    );
    // A finished batch cannot be nacked; a second ack returns 0 (PgQue).
    send(&mut c, "q", "x");
    tick(&mut c, "q");
    let (b, _) = recv(&mut c, "q", "c", 10);
    ack(&mut c, b.unwrap());
    assert_eq!(
        i64s(&mut c, &format!("SELECT pgque.ack({})::int8", b.unwrap())),
        0
    );
    assert_eq!(
        state(
            &mut c,
            &format!(
                "SELECT pgque.nack({b}, ROW(1, {b}, 't', 'x', NULL, now(), NULL, NULL, NULL, NULL)::pgque.message)",
                b = b.unwrap()
            )
        ),
        "55000"
    );
}

#[test]
fn roles_writer_sends_reader_receives_public_nothing() {
    let db = manual_db("ev_roles");
    let mut su = db.connect();
    su.batch_execute(
        "DROP ROLE IF EXISTS ev_w; DROP ROLE IF EXISTS ev_r; DROP ROLE IF EXISTS ev_p; \
         CREATE ROLE ev_w LOGIN IN ROLE pgque_writer; CREATE ROLE ev_r LOGIN IN ROLE pgque_reader; \
         CREATE ROLE ev_p LOGIN; \
         SELECT pgque.create_queue('sec'); SELECT pgque.subscribe('sec', 'c')",
    )
    .unwrap();
    let mut w = db.connect_as("ev_w");
    let mut r = db.connect_as("ev_r");
    let mut p = db.connect_as("ev_p");
    w.batch_execute("SELECT pgque.send('sec', 'hi'::text)")
        .unwrap();
    assert_eq!(
        state(&mut w, "SELECT * FROM pgque.receive('sec', 'c')"),
        "42501"
    );
    assert_eq!(state(&mut w, "SELECT pgque.drop_queue('sec')"), "42501");
    tick(&mut su, "sec");
    let rows = r
        .query("SELECT msg_id FROM pgque.receive('sec', 'c')", &[])
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        state(&mut r, "SELECT pgque.drop_queue('sec', true)"),
        "42501"
    );
    assert_eq!(
        state(&mut r, "SELECT pgque.send('sec', 'x'::text)"),
        "42501"
    );
    // PgQue's relations are readable by readers, never writable.
    assert_eq!(i64s(&mut r, "SELECT count(*) FROM pgque.queue"), 1);
    assert_eq!(i64s(&mut r, "SELECT count(*) FROM pgque.dead_letter"), 0);
    assert_eq!(state(&mut r, "DELETE FROM pgque.queue"), "42501");
    assert_eq!(state(&mut r, "DELETE FROM pgque.dead_letter"), "42501");
    assert_eq!(state(&mut r, "SELECT count(*) FROM pgque.tick"), "42501");
    assert_eq!(
        state(&mut w, "SELECT count(*) FROM pgque.dead_letter"),
        "42501"
    );
    assert_eq!(
        state(&mut p, "SELECT pgque.send('sec', 'x'::text)"),
        "42501"
    );
    assert_eq!(
        state(&mut p, "SELECT * FROM pgque.receive('sec', 'c')"),
        "42501"
    );
    // PUBLIC (a role with no pgque role) can execute no function of the schema.
    let callable = i64s(
        &mut su,
        "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgque'::regnamespace \
           AND has_function_privilege('ev_p', oid, 'EXECUTE')",
    );
    assert_eq!(callable, 0);
    // Every event-queue function is granted to some pgque role.
    let ungranted = su
        .query(
            "SELECT oid::regprocedure::text FROM pg_proc WHERE pronamespace = 'pgque'::regnamespace \
               AND NOT has_function_privilege('pgque_admin', oid, 'EXECUTE') \
               AND proname IN ('send', 'receive', 'ack', 'nack', 'ticker', 'maint', 'create_queue', \
                               'get_queue_info', 'dlq_replay', 'receive_coop', 'next_batch')",
            &[],
        )
        .unwrap();
    assert!(
        ungranted.is_empty(),
        "{:?}",
        ungranted
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
    );
    drop((w, r, p));
    su.batch_execute(
        "DROP OWNED BY ev_w, ev_r, ev_p; DROP ROLE ev_w; DROP ROLE ev_r; DROP ROLE ev_p",
    )
    .unwrap();
}
