//! Trace-context headers on events (docs/tracing.md): what the producers
//! store in ev_headers comes back from the *_with_headers receive functions,
//! and stays with the event through every move: a nack and its retry, a
//! dead letter and its replay, a paused key's held events and their put-back,
//! delayed delivery and a resize of a partitioned consumer. The plain receive
//! functions are unchanged, events without headers have NULL, and bad headers
//! are refused with nothing stored.
mod events_util;
use events_util::*;
use pgque_pg_test::postgres::Client;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const H1: &str = r#"{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}"#;
const H2: &str = r#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "congo=t61rcWkgMzE"}"#;

/// The headers as the server prints jsonb (normalised key order and spacing).
fn norm(c: &mut Client, h: &str) -> String {
    c.query_one("SELECT $1::text::jsonb::text", &[&h])
        .unwrap()
        .get(0)
}

/// receive_with_headers: (msg_id, batch_id, retry_count, headers as text).
fn recv_h(c: &mut Client, q: &str, cn: &str) -> Vec<(i64, i64, Option<i32>, Option<String>)> {
    c.query(
        "SELECT msg_id, batch_id, retry_count, headers::text FROM pgque.receive_with_headers($1, $2)",
        &[&q, &cn],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

fn one_i64(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

fn one_text(c: &mut Client, sql: &str) -> Option<String> {
    c.query_one(sql, &[]).unwrap().get(0)
}

#[test]
fn every_producer_stores_headers_and_receive_with_headers_returns_them() {
    let db = manual_db("ev_headers_send");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('h'); SELECT pgque.subscribe('h', 'traced'); \
         SELECT pgque.subscribe('h', 'plain')",
    )
    .unwrap();
    let (h1, h2) = (norm(&mut c, H1), norm(&mut c, H2));
    let mut want: HashMap<i64, Option<String>> = HashMap::new();
    let id =
        |c: &mut Client, sql: &str, h: &str| -> i64 { c.query_one(sql, &[&h]).unwrap().get(0) };
    want.insert(
        id(
            &mut c,
            "SELECT pgque.send('h', 't', '{\"a\": 1}'::jsonb, NULL, $1::text::jsonb)",
            H1,
        ),
        Some(h1.clone()),
    );
    want.insert(
        id(
            &mut c,
            "SELECT pgque.send('h', 't', 'x'::text, 'key', $1::text::jsonb)",
            H2,
        ),
        Some(h2.clone()),
    );
    let batch: Vec<i64> = c
        .query_one(
            "SELECT pgque.send_batch('h', 't', ARRAY['{\"b\": 1}', '{\"b\": 2}']::jsonb[], NULL, $1::text::jsonb)",
            &[&H1],
        )
        .unwrap()
        .get(0);
    assert_eq!(batch.len(), 2);
    for b in batch {
        want.insert(b, Some(h1.clone()));
    }
    let batch: Vec<i64> = c
        .query_one(
            "SELECT pgque.send_batch('h', 't', ARRAY['p', 'q', 'r'], ARRAY['k1', NULL, 'k3'], $1::text::jsonb)",
            &[&H2],
        )
        .unwrap()
        .get(0);
    assert_eq!(batch.len(), 3);
    for b in batch {
        want.insert(b, Some(h2.clone()));
    }
    want.insert(
        id(
            &mut c,
            "SELECT event_id FROM pgque.send_idem('h', 't', '{}'::jsonb, 'once', headers => $1::text::jsonb)",
            H1,
        ),
        Some(h1.clone()),
    );
    want.insert(
        id(
            &mut c,
            "SELECT event_id FROM pgque.send_idem('h', 't', 'y'::text, 'twice', '1 hour', 'k', $1::text::jsonb)",
            H2,
        ),
        Some(h2.clone()),
    );
    // a past deliver_at: an ordinary send, with its headers
    want.insert(
        id(
            &mut c,
            "SELECT pgque.send_at('h', 't', 'now'::text, now() - interval '1 hour', headers => $1::text::jsonb)",
            H1,
        ),
        Some(h1.clone()),
    );
    // without headers: NULL, whichever entry point
    for sql in [
        "SELECT pgque.send('h', 'plain'::text)",
        "SELECT pgque.send('h', 't', '{}'::jsonb, 'k')",
        "SELECT pgque.send('h', 't', '{}'::jsonb, 'k', NULL)",
        "SELECT (pgque.send_batch('h', 't', ARRAY['s'], NULL, NULL))[1]",
        "SELECT event_id FROM pgque.send_idem('h', 't', '{}'::jsonb, 'nohdr')",
        "SELECT pgque.insert_event('h', 't', 'raw')",
    ] {
        let i = one_i64(&mut c, sql);
        want.insert(i, None);
    }
    // a duplicate send_idem keeps the original's headers
    let dup: (i64, bool) = {
        let r = c
            .query_one(
                "SELECT event_id, deduped FROM pgque.send_idem('h', 't', '{}'::jsonb, 'once', headers => $1::text::jsonb)",
                &[&H2],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(dup.1);
    assert_eq!(want.get(&dup.0), Some(&Some(h1.clone())));

    tick(&mut c, "h");
    let got = recv_h(&mut c, "h", "traced");
    let got_map: HashMap<i64, Option<String>> =
        got.iter().map(|(i, _, _, h)| (*i, h.clone())).collect();
    assert_eq!(got_map, want);
    // plain receive of the other consumer: the same events, pgque.message's
    // ten columns, the same values
    let plain = c
        .query("SELECT * FROM pgque.receive('h', 'plain', 100)", &[])
        .unwrap();
    assert_eq!(plain.len(), want.len());
    assert_eq!(
        plain[0].len(),
        10,
        "receive returns pgque.message as before"
    );
    let cols = "msg_id, type, payload, retry_count, created_at, extra1, extra2, extra3, extra4";
    let a: Vec<String> = c
        .query(
            &format!(
                "SELECT concat_ws('|', {cols}) FROM pgque.receive_with_headers('h', 'traced', 100) ORDER BY msg_id"
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let b: Vec<String> = c
        .query(
            &format!("SELECT concat_ws('|', {cols}) FROM pgque.receive('h', 'plain', 100) ORDER BY msg_id"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(a, b);
    assert_eq!(a.len(), want.len());
    // one batch for both functions: receive after receive_with_headers
    // returns the open batch, and ack finishes it
    let bid = got[0].1;
    assert_eq!(
        one_i64(
            &mut c,
            "SELECT count(*) FROM pgque.receive('h', 'traced', 100)"
        ),
        want.len() as i64
    );
    ack(&mut c, bid);
    assert!(recv_h(&mut c, "h", "traced").is_empty());
}

#[test]
fn bad_headers_are_refused_and_nothing_is_stored() {
    let db = manual_db("ev_headers_bad");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('b')").unwrap();
    let big = format!("{{\"tracestate\": \"{}\"}}", "x".repeat(1100));
    let cases: Vec<(String, &str)> = vec![
        ("SELECT pgque.send('b', 't', '{}'::jsonb, NULL, '[1]')".into(), "22023"),
        ("SELECT pgque.send('b', 't', 'x'::text, NULL, '{\"traceparent\": 1}')".into(), "22023"),
        ("SELECT pgque.send('b', 't', 'x'::text, NULL, '\"str\"')".into(), "22023"),
        (format!("SELECT pgque.send('b', 't', 'x'::text, NULL, '{big}')"), "54000"),
        ("SELECT pgque.send_batch('b', 't', ARRAY['{}']::jsonb[], NULL, '{\"a\": null}')".into(), "22023"),
        (format!("SELECT pgque.send_batch('b', 't', ARRAY['x'], NULL, '{big}')"), "54000"),
        ("SELECT pgque.send_idem('b', 't', '{}'::jsonb, 'k', headers => '[]')".into(), "22023"),
        (format!("SELECT pgque.send_idem('b', 't', 'x'::text, 'k', headers => '{big}')"), "54000"),
        ("SELECT pgque.send_at('b', 't', '{}'::jsonb, now() + interval '1 hour', headers => '1')".into(), "22023"),
        (format!("SELECT pgque.send_at('b', 't', 'x'::text, now() - interval '1 hour', headers => '{big}')"), "54000"),
    ];
    for (sql, state) in &cases {
        let e = c.batch_execute(sql).expect_err(sql);
        assert_eq!(e.code().map(|s| s.code()), Some(*state), "{sql}: {e}");
    }
    assert_eq!(
        one_i64(&mut c, "SELECT count(*) FROM pgque.all_events('b')"),
        0
    );
    assert_eq!(
        one_i64(&mut c, "SELECT count(*) FROM pgque.delayed_event"),
        0
    );
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pgque.idem_key"), 0);
}

/// A nacked event's retry keeps its headers; so does its dead letter, and
/// the replay of that.
#[test]
fn headers_survive_retry_dead_letter_and_replay() {
    let db = manual_db("ev_headers_retry");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('r'); SELECT pgque.subscribe('r', 'c'); \
         SELECT pgque.set_queue_config('r', 'max_retries', '1')",
    )
    .unwrap();
    let h = norm(&mut c, H2);
    let id: i64 = c
        .query_one(
            "SELECT pgque.send('r', 't', 'work'::text, NULL, $1::text::jsonb)",
            &[&H2],
        )
        .unwrap()
        .get(0);
    tick(&mut c, "r");
    let nack = |c: &mut Client| -> i64 {
        let r = c
            .query_one(
                "WITH m AS (SELECT * FROM pgque.receive('r', 'c', 100) LIMIT 1) \
                 SELECT (m).batch_id, pgque.nack((m).batch_id, m, '0 seconds', 'boom') FROM m",
                &[],
            )
            .unwrap();
        assert_eq!(r.get::<_, i32>(1), 1);
        r.get(0)
    };
    let b = nack(&mut c);
    assert_eq!(
        one_text(&mut c, "SELECT ev_headers::text FROM pgque.retry_queue"),
        Some(h.clone())
    );
    ack(&mut c, b);
    assert_eq!(
        one_i64(&mut c, "SELECT pgque.maint_retry_events()::int8"),
        1
    );
    tick(&mut c, "r");
    let got = recv_h(&mut c, "r", "c");
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].0, got[0].2, got[0].3.clone()),
        (id, Some(1), Some(h.clone()))
    );
    // retries reached max_retries: this nack dead-letters it
    let b = nack(&mut c);
    ack(&mut c, b);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pgque.retry_queue"), 0);
    assert_eq!(
        one_text(
            &mut c,
            "SELECT ev_headers::text FROM pgque.dead_letter_store"
        ),
        Some(h.clone())
    );
    let dl: i64 = one_i64(&mut c, "SELECT dl_id FROM pgque.dead_letter_store");
    assert_eq!(
        c.query_one("SELECT pgque.dlq_replay($1)", &[&dl])
            .unwrap()
            .get::<_, i64>(0),
        id
    );
    assert_eq!(
        one_text(&mut c, "SELECT ev_headers::text FROM pgque.retry_queue"),
        Some(h.clone())
    );
    assert_eq!(
        one_i64(&mut c, "SELECT pgque.maint_retry_events()::int8"),
        1
    );
    tick(&mut c, "r");
    let got = recv_h(&mut c, "r", "c");
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].0, got[0].2, got[0].3.clone()),
        (id, Some(0), Some(h))
    );
    // an event without headers takes the same path with NULL
    let plain = send(&mut c, "r", "plain");
    ack(&mut c, got[0].1);
    tick(&mut c, "r");
    let b = nack(&mut c);
    assert_eq!(
        one_text(
            &mut c,
            "SELECT coalesce(ev_headers::text, 'null') FROM pgque.retry_queue"
        ),
        Some("null".into())
    );
    ack(&mut c, b);
    one_i64(&mut c, "SELECT pgque.maint_retry_events()::int8");
    tick(&mut c, "r");
    let got = recv_h(&mut c, "r", "c");
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0, got[0].3.clone()), (plain, None));
}

/// send_at's delayed event is promoted with its headers.
#[test]
fn delayed_event_keeps_its_headers() {
    let db = manual_db("ev_headers_delayed");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('d'); SELECT pgque.subscribe('d', 'c')")
        .unwrap();
    let h = norm(&mut c, H1);
    let id: i64 = c
        .query_one(
            "SELECT pgque.send_at('d', 't', '{}'::jsonb, clock_timestamp() + interval '200 milliseconds', \
                                  headers => $1::text::jsonb)",
            &[&H1],
        )
        .unwrap()
        .get(0);
    let plain: i64 = one_i64(
        &mut c,
        "SELECT pgque.send_at('d', 't', 'p'::text, clock_timestamp() + interval '200 milliseconds')",
    );
    assert_eq!(
        one_text(
            &mut c,
            &format!("SELECT ev_headers::text FROM pgque.delayed_event WHERE ev_id = {id}")
        ),
        Some(h.clone())
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = vec![];
    while got.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the delayed events never arrived"
        );
        std::thread::sleep(Duration::from_millis(100));
        c.execute("SELECT pgque.maint_delayed()", &[]).unwrap();
        tick(&mut c, "d");
        let r = recv_h(&mut c, "d", "c");
        if let Some(b) = r.first().map(|m| m.1) {
            ack(&mut c, b);
        }
        got.extend(r);
    }
    let m: HashMap<i64, Option<String>> = got.into_iter().map(|(i, _, _, h)| (i, h)).collect();
    assert_eq!(m, HashMap::from([(id, Some(h)), (plain, None)]));
}

/// nack_partitioned of one delivered message.
fn nack_slot(c: &mut Client, q: &str, slot: i32, n: i32, id: i64, batch: i64, after: &str) -> i32 {
    c.query_one(
        "SELECT pgque.nack_partitioned($1, 'c', $2, $3, 'w', \
             ROW($4, $5, 't', NULL, NULL, now(), NULL, NULL, NULL, NULL)::pgque.message, \
             $6::text::interval, 'test')",
        &[&q, &slot, &n, &id, &batch, &after],
    )
    .unwrap()
    .get(0)
}

/// receive_partitioned_with_headers: (msg_id, batch_id, payload, headers).
fn recv_slot_h(
    c: &mut Client,
    q: &str,
    slot: i32,
    n: i32,
) -> Vec<(i64, i64, String, Option<String>)> {
    c.query(
        "SELECT msg_id, batch_id, payload, headers::text \
           FROM pgque.receive_partitioned_with_headers($1, 'c', $2, $3, 'w')",
        &[&q, &slot, &n],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

fn ack_slot(c: &mut Client, q: &str, slot: i32, n: i32) {
    let r: i32 = c
        .query_one(
            "SELECT pgque.ack_partitioned($1, 'c', $2, $3, 'w')",
            &[&q, &slot, &n],
        )
        .unwrap()
        .get(0);
    assert_eq!(r, 1);
}

/// A paused key's later events are held with their headers and put back
/// with them; the failed event's retry keeps its own.
#[test]
fn paused_keys_held_events_keep_their_headers() {
    let db = manual_db("ev_headers_pause");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('p'); \
         SELECT pgque.subscribe_partitioned('p', 'c', 1, failure_policy => 'pause'); \
         SELECT pgque.claim_slot('p', 'c', 0, 'w', '5 minutes')",
    )
    .unwrap();
    let (h1, h2) = (norm(&mut c, H1), norm(&mut c, H2));
    for (p, h) in [("a1", Some(H1)), ("a2", Some(H2)), ("a3", None)] {
        c.execute(
            "SELECT pgque.send('p', 't', $1::text, 'a', $2::text::jsonb)",
            &[&p, &h],
        )
        .unwrap();
    }
    tick(&mut c, "p");
    let got = recv_slot_h(&mut c, "p", 0, 1);
    let seen: Vec<(String, Option<String>)> =
        got.iter().map(|m| (m.2.clone(), m.3.clone())).collect();
    assert_eq!(
        seen,
        vec![
            ("a1".into(), Some(h1.clone())),
            ("a2".into(), Some(h2.clone())),
            ("a3".into(), None)
        ]
    );
    // a1 fails: a2, a3 are held with their headers, a1's retry keeps its own
    assert_eq!(
        nack_slot(&mut c, "p", 0, 1, got[0].0, got[0].1, "0 seconds"),
        1
    );
    assert_eq!(
        one_text(
            &mut c,
            "SELECT string_agg(coalesce(ev_headers->>'tracestate', '-') || ':' || coalesce(ev_headers::text, 'null'), ',' ORDER BY ev_id) \
               FROM pgque.partition_held"
        ),
        Some(format!("congo=t61rcWkgMzE:{h2},-:null"))
    );
    assert_eq!(
        one_text(&mut c, "SELECT ev_headers::text FROM pgque.retry_queue"),
        Some(h1.clone())
    );
    ack_slot(&mut c, "p", 0, 1);
    assert_eq!(
        one_i64(&mut c, "SELECT pgque.maint_retry_events()::int8"),
        1
    );
    tick(&mut c, "p");
    let got = recv_slot_h(&mut c, "p", 0, 1);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].2.as_str(), got[0].3.clone()), ("a1", Some(h1)));
    ack_slot(&mut c, "p", 0, 1);
    // released: the held ones come back, with their headers
    tick(&mut c, "p");
    let got = recv_slot_h(&mut c, "p", 0, 1);
    let seen: Vec<(String, Option<String>)> =
        got.iter().map(|m| (m.2.clone(), m.3.clone())).collect();
    assert_eq!(seen, vec![("a2".into(), Some(h2)), ("a3".into(), None)]);
    ack_slot(&mut c, "p", 0, 1);
    assert_eq!(
        one_i64(&mut c, "SELECT count(*) FROM pgque.partition_held"),
        0
    );
}

/// complete_resize moves a consumer's retries, held events and dead letters
/// to the new slots: their headers go with them.
#[test]
fn resize_keeps_the_headers_of_retries_held_events_and_dead_letters() {
    let db = manual_db("ev_headers_resize");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('z'); \
         SELECT pgque.subscribe_partitioned('z', 'c', 1, failure_policy => 'pause'); \
         SELECT pgque.claim_slot('z', 'c', 0, 'w', '5 minutes'); \
         SELECT pgque.set_queue_config('z', 'max_retries', '0')",
    )
    .unwrap();
    let (h1, h2) = (norm(&mut c, H1), norm(&mut c, H2));
    for (p, k, h) in [("d1", "d", H1), ("r1", "r", H2), ("r2", "r", H1)] {
        c.execute(
            "SELECT pgque.send('z', 't', $1::text, $2, $3::text::jsonb)",
            &[&p, &k, &h],
        )
        .unwrap();
    }
    tick(&mut c, "z");
    let got = recv_slot_h(&mut c, "z", 0, 1);
    assert_eq!(got.len(), 3);
    // d1 is dead-lettered (max_retries 0); r1 is scheduled for later, and r2
    // held behind it
    assert_eq!(
        nack_slot(&mut c, "z", 0, 1, got[0].0, got[0].1, "0 seconds"),
        1
    );
    c.batch_execute("SELECT pgque.set_queue_config('z', 'max_retries', '5')")
        .unwrap();
    assert_eq!(
        nack_slot(&mut c, "z", 0, 1, got[1].0, got[1].1, "1 hour"),
        1
    );
    ack_slot(&mut c, "z", 0, 1);
    let moved = |c: &mut Client| -> String {
        one_text(
            c,
            "SELECT concat_ws('|', \
                (SELECT string_agg(ev_data || '=' || ev_headers::text, ',') FROM pgque.dead_letter_store), \
                (SELECT string_agg(ev_data || '=' || ev_headers::text, ',') FROM pgque.retry_queue), \
                (SELECT string_agg(ev_data || '=' || ev_headers::text, ',') FROM pgque.partition_held))",
        )
        .unwrap()
    };
    let before = moved(&mut c);
    assert_eq!(before, format!("d1={h1}|r1={h2}|r2={h1}"));
    let owners = |c: &mut Client| -> String {
        one_text(
            c,
            "SELECT concat_ws('|', (SELECT string_agg(dl_owner::text, ',') FROM pgque.dead_letter_store), \
                (SELECT string_agg(ev_owner::text, ',') FROM pgque.retry_queue), \
                (SELECT string_agg(ph_sub::text, ',') FROM pgque.partition_held))",
        )
        .unwrap()
    };
    let owners_before = owners(&mut c);
    c.query_one("SELECT pgque.begin_resize('z', 'c', 2)", &[])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        tick(&mut c, "z");
        // the old slot reads on to the seal
        if !recv_slot_h(&mut c, "z", 0, 1).is_empty() {
            ack_slot(&mut c, "z", 0, 1);
        }
        let ready: bool = c
            .query_one(
                "SELECT bool_and(ready) FROM pgque.resize_ready('z', 'c')",
                &[],
            )
            .unwrap()
            .get(0);
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "the old slot never drained");
        std::thread::sleep(Duration::from_millis(50));
    }
    let n: i32 = c
        .query_one("SELECT pgque.complete_resize('z', 'c')", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
    assert_ne!(
        owners(&mut c),
        owners_before,
        "the rows moved to the new slots"
    );
    assert_eq!(moved(&mut c), before);
}
