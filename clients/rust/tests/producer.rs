//! Producers on the caller's transaction, typed errors.
mod common;

use common::*;
use pgque_client::*;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn enqueue_runs_in_the_callers_transaction() {
    let (dsn, c) = test_db("producer_tx").await;
    c.execute("SELECT pgque.create_job_queue('q')", &[]).await.unwrap();
    let mut p = connect(&dsn).await;
    let tx = p.transaction().await.unwrap();
    enqueue(&tx, "q", "k", &json!({"a": 1}), &EnqueueOptions::default())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(states(&c, "q").await.is_empty());
    let tx = p.transaction().await.unwrap();
    let opts = EnqueueOptions {
        priority: Some(7),
        max_attempts: Some(3),
        unique_key: Some("u".into()),
        ..Default::default()
    };
    let id = enqueue(&tx, "q", "k", &json!({"a": 2}), &opts).await.unwrap().unwrap();
    tx.commit().await.unwrap();
    let r = c
        .query_one(
            "SELECT priority, max_attempts, unique_key, args FROM pgque.get_job($1)",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        (r.get::<_, i16>(0), r.get::<_, i32>(1), r.get::<_, String>(2)),
        (7, 3, "u".to_string())
    );
    assert_eq!(r.get::<_, serde_json::Value>(3), json!({"a": 2}));
    // A duplicate: skip gives the holder, 'error' a typed DuplicateJob.
    assert_eq!(enqueue(&c, "q", "k", &json!({}), &opts).await.unwrap(), Some(id));
    let err = enqueue(
        &c,
        "q",
        "k",
        &json!({}),
        &EnqueueOptions {
            on_duplicate: Some("error".into()),
            ..opts
        },
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DuplicateJob);
    assert_eq!(err.sqlstate(), Some("23505"));

    let many = enqueue_many(
        &c,
        "q",
        &[
            NewJob::new("a", json!({})),
            NewJob {
                options: EnqueueOptions {
                    unique_key: Some("u".into()),
                    ..Default::default()
                },
                ..NewJob::new("b", json!({}))
            },
        ],
        None,
    )
    .await
    .unwrap();
    assert_eq!(many[0].state, "ready");
    assert_eq!(
        many[1],
        Enqueued {
            job_id: Some(id),
            state: "duplicate".into()
        }
    );
}

#[tokio::test]
async fn typed_errors_and_flows() {
    let (_dsn, c) = test_db("producer_errors").await;
    let e = enqueue(&c, "nope", "k", &json!({}), &EnqueueOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UndefinedObject);
    c.execute("SELECT pgque.create_job_queue('q')", &[]).await.unwrap();
    let e = enqueue(&c, "q", "", &json!({}), &EnqueueOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParameterValue);
    let e = enqueue(
        &c,
        "q",
        "k",
        &json!({}),
        &EnqueueOptions {
            priority: Some(5000),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NumericValueOutOfRange);
    let e = send(&c, "bad\nname;", "t", &json!({}), None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidName);
    let flow =
        json!([{"key": "a", "kind": "x", "args": {}}, {"key": "b", "kind": "y", "args": {}, "depends_on": ["a"]}]);
    let f = Features::read(&c).await.unwrap();
    match enqueue_flow(&c, "q", &flow).await {
        Ok(rows) => {
            assert!(f.flows);
            assert_eq!(rows.len(), 2);
        }
        Err(Error::ServerFeatureMissing(_)) => assert!(!f.flows),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn send_batch_idem_and_text() {
    let (_dsn, c) = test_db("producer_send").await;
    c.batch_execute("SELECT pgque.create_queue('ev'); SELECT pgque.subscribe('ev', 'c')")
        .await
        .unwrap();
    let a = send(&c, "ev", "t", &json!({"n": 1}), Some("k1")).await.unwrap();
    let b = send_text(&c, "ev", "t.text", "plain", None).await.unwrap();
    let ids = send_batch(
        &c,
        "ev",
        "t.b",
        &[json!({"n": 2}), json!({"n": 3})],
        Some(&[Some("k2"), None]),
    )
    .await
    .unwrap();
    let first = send_idem(&c, "ev", "t.i", &json!({}), "effect:1", Duration::from_secs(60), None)
        .await
        .unwrap();
    let again = send_idem(&c, "ev", "t.i", &json!({}), "effect:1", Duration::from_secs(60), None)
        .await
        .unwrap();
    assert!(!first.deduped && again.deduped && again.event_id == first.event_id);
    c.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    let rows = c
        .query(
            "SELECT msg_id, type, payload, extra1 FROM pgque.receive('ev', 'c', 100)",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(i64, String, Option<String>, Option<String>)> =
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
    assert_eq!(
        got,
        vec![
            (a, "t".into(), Some(r#"{"n": 1}"#.into()), Some("k1".into())),
            (b, "t.text".into(), Some("plain".into()), None),
            (ids[0], "t.b".into(), Some(r#"{"n": 2}"#.into()), Some("k2".into())),
            (ids[1], "t.b".into(), Some(r#"{"n": 3}"#.into()), None),
            (first.event_id, "t.i".into(), Some("{}".into()), None),
        ]
    );
}

/// Without the `otel` feature the producers store no headers and the
/// consumer reads none (the plain overloads: a 0.7.0 schema has them).
#[cfg(not(feature = "otel"))]
#[tokio::test]
async fn events_without_otel_carry_no_headers() {
    let (dsn, c) = test_db("producer_no_otel").await;
    c.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c')")
        .await
        .unwrap();
    let mut ids = vec![
        send(&c, "q", "t", &json!({"n": 1}), None).await.unwrap(),
        send_text(&c, "q", "t", "x", Some("k")).await.unwrap(),
        send_idem(&c, "q", "t", &json!({}), "e1", Duration::from_secs(60), None)
            .await
            .unwrap()
            .event_id,
    ];
    ids.extend(send_batch(&c, "q", "t", &[json!(1), json!(2)], None).await.unwrap());
    c.execute("SELECT pgque.force_tick('q')", &[]).await.unwrap();
    let rows = c
        .query(
            "SELECT msg_id, headers IS NULL FROM pgque.receive_with_headers('q', 'c', 100) ORDER BY msg_id",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(i64, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    ids.sort();
    assert_eq!(got, ids.iter().map(|i| (*i, true)).collect::<Vec<_>>());
    // the batch is still open: the consumer gets it again, without headers
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let consumer = Consumer::new(&dsn, "q", "c", move |m: Message| {
        let s2 = s2.clone();
        async move {
            s2.lock().unwrap().push((m.msg_id, m.headers.is_none()));
            Ok(())
        }
    })
    .unwrap()
    .poll_interval(Duration::from_millis(100));
    let sd = Shutdown::new();
    let run = tokio::spawn({
        let sd = sd.clone();
        async move { consumer.run(sd).await }
    });
    wait_until(30, "the batch handled", || {
        let n = seen.lock().unwrap().len();
        async move { n == 5 }
    })
    .await;
    sd.trigger();
    run.await.unwrap().unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        ids.iter().map(|i| (*i, true)).collect::<Vec<_>>()
    );
}

type Read = Vec<(i64, Option<serde_json::Value>, Option<String>)>;

/// One batch of receive_with_headers for 'c' on 'q' (acked): id, headers, extra1.
async fn read_headers(c: &tokio_postgres::Client) -> Read {
    let rows = c
        .query(
            "SELECT msg_id, batch_id, headers, extra1 FROM pgque.receive_with_headers('q', 'c', 100) ORDER BY msg_id",
            &[],
        )
        .await
        .unwrap();
    if let Some(r) = rows.first() {
        c.execute("SELECT pgque.ack($1)", &[&r.get::<_, i64>(1)]).await.unwrap();
    }
    rows.iter().map(|r| (r.get(0), r.get(2), r.get(3))).collect()
}

/// Explicit event headers (`SendOptions`, `send_batch_with`) are stored as
/// given, with or without the `otel` feature; `send_at` delivers at its time
/// with its headers.
#[tokio::test]
async fn explicit_event_headers_and_send_at() {
    let (_dsn, c) = test_db("producer_event_headers").await;
    c.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c')")
        .await
        .unwrap();
    let h = |n: u8| json!({"traceparent": format!("00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b{n}-01")});
    let opts = |n: u8, key: Option<&str>| SendOptions {
        partition_key: key.map(str::to_owned),
        headers: Some(h(n)),
    };
    let one = send_with(&c, "q", "t", &json!({"n": 1}), &opts(1, Some("k1")))
        .await
        .unwrap();
    let text = send_text_with(&c, "q", "t", "x", &opts(2, None)).await.unwrap();
    let idem = send_idem_with(&c, "q", "t", &json!({}), "e1", Duration::from_secs(60), &opts(3, None))
        .await
        .unwrap();
    let again = send_idem_with(&c, "q", "t", &json!({}), "e1", Duration::from_secs(60), &opts(9, None))
        .await
        .unwrap();
    assert!(again.deduped && again.event_id == idem.event_id);
    let batch = send_batch_with(&c, "q", "t", &[json!(1), json!(2)], None, Some(&h(4)))
        .await
        .unwrap();
    let plain = send_with(&c, "q", "t", &json!({"n": 0}), &SendOptions::default())
        .await
        .unwrap();
    let at = send_at(
        &c,
        "q",
        "later",
        &json!({"n": 5}),
        std::time::SystemTime::now() + Duration::from_secs(2),
        &opts(5, Some("k5")),
    )
    .await
    .unwrap();
    c.execute("SELECT pgque.force_tick('q')", &[]).await.unwrap();
    let got = read_headers(&c).await;
    assert_eq!(
        got,
        vec![
            (one, Some(h(1)), Some("k1".to_string())),
            (text, Some(h(2)), None),
            (idem.event_id, Some(h(3)), None),
            (batch[0], Some(h(4)), None),
            (batch[1], Some(h(4)), None),
            (plain, None, None),
        ]
    );
    // the delayed event: not yet, then delivered (maint_delayed) with its headers and key
    let mut later = Vec::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.execute("SELECT pgque.maint_delayed()", &[]).await.ok();
        c.execute("SELECT pgque.force_tick('q')", &[]).await.unwrap();
        later = read_headers(&c).await;
        if !later.is_empty() {
            break;
        }
    }
    assert_eq!(later.len(), 1, "the send_at event was delivered");
    assert_eq!(later[0].1, Some(h(5)));
    assert_eq!(later[0].2.as_deref(), Some("k5"));
    let _ = at;
}
