//! Trace context on events with the `otel` feature (docs/tracing.md,
//! "Events"), checked with the OpenTelemetry SDK's in-memory exporter: the
//! producers' `send <queue>` spans and the headers the events store, the
//! consumers' `process <queue>` span per event (child of and linked to the
//! send span on the first delivery, a new trace linked to it on a
//! redelivery, an error marking it), for Consumer and PartitionedConsumer.
//! A binary of its own: the tracer provider is global to the process.
mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{global, Context, SpanId, Value as OtelValue};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use pgque_client::*;
use serde_json::{json, Value};

fn attr(s: &SpanData, key: &str) -> Option<OtelValue> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn links(s: &SpanData) -> Vec<SpanId> {
    s.links.iter().map(|l| l.span_context.span_id()).collect()
}

fn msg_id(s: &SpanData) -> i64 {
    attr(s, "messaging.message.id").unwrap().to_string().parse().unwrap()
}

/// Every pending event of `consumer` with its stored headers (one batch of
/// receive_with_headers, acked).
async fn stored_headers(c: &tokio_postgres::Client, queue: &str, consumer: &str) -> HashMap<i64, Option<Value>> {
    c.execute("SELECT pgque.force_tick($1)", &[&queue]).await.unwrap();
    let rows = c
        .query(
            "SELECT msg_id, batch_id, headers FROM pgque.receive_with_headers($1, $2, 1000)",
            &[&queue, &consumer],
        )
        .await
        .unwrap();
    if let Some(r) = rows.first() {
        let b: i64 = r.get(1);
        c.execute("SELECT pgque.ack($1)", &[&b]).await.unwrap();
    }
    rows.iter().map(|r| (r.get(0), r.get(2))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn send_spans_headers_and_consumer_spans_per_event() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    global::set_tracer_provider(provider.clone());

    let (dsn, c) = test_db("event_tracing").await;
    c.batch_execute(
        "SELECT pgque.create_queue('ev'); SELECT pgque.subscribe('ev', 'probe'); \
         SELECT pgque.subscribe('ev', 'c')",
    )
    .await
    .unwrap();

    // the producers in a traced request
    let root_cx = Context::current_with_span(global::tracer("test").start("request"));
    let trace_id = root_cx.span().span_context().trace_id();
    let (a, t, batch, idem) = {
        let _g = root_cx.clone().attach();
        let a = send(&c, "ev", "flaky", &json!({"n": 1}), None).await.unwrap();
        let t = send_text(&c, "ev", "text", "hello", Some("k1")).await.unwrap();
        let batch = send_batch(&c, "ev", "ok", &[json!({"n": 2}), json!({"n": 3})], None)
            .await
            .unwrap();
        let idem = send_idem(
            &c,
            "ev",
            "ok",
            &json!({"n": 4}),
            "effect:4",
            Duration::from_secs(60),
            None,
        )
        .await
        .unwrap();
        (a, t, batch, idem.event_id)
    };
    root_cx.span().end();
    let spans = exporter.get_finished_spans().unwrap();
    let sends = named(&spans, "send ev");
    assert_eq!(sends.len(), 4);
    for s in &sends {
        assert_eq!(s.span_kind, SpanKind::Producer);
        assert_eq!(s.span_context.trace_id(), trace_id);
        assert_eq!(s.parent_span_id, root_cx.span().span_context().span_id());
        assert_eq!(attr(s, "messaging.system"), Some("pgque".into()));
        assert_eq!(attr(s, "messaging.destination.name"), Some("ev".into()));
    }
    assert_eq!(attr(sends[2], "messaging.batch.message_count"), Some(2i64.into()));
    let tp = |s: &SpanData| json!({"traceparent": format!("00-{}-{}-01", s.span_context.trace_id(), s.span_context.span_id())});
    let stored = stored_headers(&c, "ev", "probe").await;
    assert_eq!(stored.len(), 5);
    assert_eq!(stored[&a], Some(tp(sends[0])));
    assert_eq!(stored[&t], Some(tp(sends[1])));
    assert_eq!(stored[&batch[0]], Some(tp(sends[2])));
    assert_eq!(stored[&batch[1]], Some(tp(sends[2])));
    assert_eq!(stored[&idem], Some(tp(sends[3])));
    // outside a trace (no current span): the send span is a root, its context stored
    let lone = send(&c, "ev", "ok", &json!({"n": 5}), None).await.unwrap();
    let lone_send = exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .find(|s| s.name == "send ev" && s.parent_span_id == SpanId::INVALID)
        .expect("a root send span");
    assert_ne!(lone_send.span_context.trace_id(), trace_id);
    exporter.reset();

    // the consumer: the first delivery of `a` fails, its redelivery succeeds
    let seen: Arc<Mutex<Vec<(i64, SpanId)>>> = Arc::default();
    let s2 = seen.clone();
    let consumer = Consumer::new(&dsn, "ev", "c", move |m: Message| {
        let s2 = s2.clone();
        async move {
            let current = Context::current().span().span_context().span_id();
            s2.lock().unwrap().push((m.msg_id, current));
            if m.type_name == "flaky" && m.retry_count.unwrap_or(0) == 0 {
                return Err("first delivery fails".into());
            }
            Ok(())
        }
    })
    .unwrap()
    .poll_interval(Duration::from_millis(200))
    .retry_after(Duration::ZERO);
    let sd = Shutdown::new();
    let run = tokio::spawn({
        let sd = sd.clone();
        async move { consumer.run(sd).await }
    });
    wait_until(60, "the events and the redelivery", || {
        let n = seen.lock().unwrap().len();
        async move { n == 7 }
    })
    .await;
    sd.trigger();
    run.await.unwrap().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let procs = named(&spans, "process ev");
    assert_eq!(procs.len(), 7);
    for p in &procs {
        assert_eq!(p.span_kind, SpanKind::Consumer);
        assert_eq!(attr(p, "messaging.system"), Some("pgque".into()));
        assert_eq!(attr(p, "messaging.consumer.group.name"), Some("c".into()));
        assert_eq!(attr(p, "messaging.operation.type"), Some("process".into()));
    }
    let of = |id: i64| -> Vec<&SpanData> { procs.iter().copied().filter(|p| msg_id(p) == id).collect() };
    let mut tries = of(a);
    tries.sort_by_key(|p| attr(p, "pgque.event.retry_count").unwrap().to_string());
    let (first, retry) = (tries[0], tries[1]);
    // first delivery: child of and linked to its send span, failed
    assert_eq!(first.span_context.trace_id(), trace_id);
    assert_eq!(first.parent_span_id, sends[0].span_context.span_id());
    assert_eq!(links(first), vec![sends[0].span_context.span_id()]);
    assert!(matches!(first.status, Status::Error { .. }), "{:?}", first.status);
    assert_eq!(attr(first, "pgque.event.type"), Some("flaky".into()));
    // the redelivery: a new trace, linked
    assert_eq!(attr(retry, "pgque.event.retry_count"), Some(1i64.into()));
    assert_ne!(retry.span_context.trace_id(), trace_id);
    assert_eq!(retry.parent_span_id, SpanId::INVALID);
    assert_eq!(links(retry), vec![sends[0].span_context.span_id()]);
    assert!(!matches!(retry.status, Status::Error { .. }));
    for (id, send) in [
        (t, sends[1]),
        (batch[0], sends[2]),
        (batch[1], sends[2]),
        (idem, sends[3]),
    ] {
        let p = of(id);
        assert_eq!(p.len(), 1, "event {id}");
        assert_eq!(p[0].parent_span_id, send.span_context.span_id());
        assert_eq!(links(p[0]), vec![send.span_context.span_id()]);
    }
    assert_eq!(of(lone)[0].span_context.trace_id(), lone_send.span_context.trace_id());
    // the handler ran inside its span
    let seen = seen.lock().unwrap().clone();
    let a_calls: Vec<SpanId> = seen.iter().filter(|(id, _)| *id == a).map(|(_, s)| *s).collect();
    assert_eq!(
        a_calls,
        vec![first.span_context.span_id(), retry.span_context.span_id()]
    );
    exporter.reset();

    // a partitioned consumer with an exactly-once handler
    c.batch_execute("SELECT pgque.create_queue('pev'); SELECT pgque.subscribe_partitioned('pev', 'pc', 4)")
        .await
        .unwrap();
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let key_refs: Vec<Option<&str>> = keys.iter().map(|k| Some(k.as_str())).collect();
    let payloads: Vec<Value> = keys.iter().map(|k| json!({ "k": k })).collect();
    let pids = {
        let root = Context::current_with_span(global::tracer("test").start("request 2"));
        let _g = root.attach();
        send_batch(&c, "pev", "p", &payloads, Some(&key_refs)).await.unwrap()
    };
    let psend = named(&exporter.get_finished_spans().unwrap(), "send pev")[0].clone();
    let handled: Arc<Mutex<Vec<i64>>> = Arc::default();
    let h2 = handled.clone();
    let pc = Arc::new(
        PartitionedConsumer::new_tx(&dsn, "pev", "pc", 4, move |m: Message, _tx| {
            let h2 = h2.clone();
            Box::pin(async move {
                h2.lock().unwrap().push(m.msg_id);
                Ok(())
            })
        })
        .unwrap()
        .workers(2)
        .poll_interval(Duration::from_millis(200)),
    );
    let sd = Shutdown::new();
    let run = tokio::spawn({
        let (pc, sd) = (pc.clone(), sd.clone());
        async move { pc.run(sd).await }
    });
    c.execute("SELECT pgque.force_tick('pev')", &[]).await.unwrap();
    wait_until(60, "the partitioned events", || {
        let n = handled.lock().unwrap().len();
        async move { n == 8 }
    })
    .await;
    sd.trigger();
    run.await.unwrap().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let procs = named(&spans, "process pev");
    let mut ids: Vec<i64> = procs.iter().map(|p| msg_id(p)).collect();
    ids.sort();
    assert_eq!(ids, pids);
    for p in procs {
        assert_eq!(p.parent_span_id, psend.span_context.span_id());
        assert_eq!(links(p), vec![psend.span_context.span_id()]);
        assert_eq!(attr(p, "messaging.consumer.group.name"), Some("pc".into()));
    }
    exporter.reset();

    // a cooperative member reads the headers (receive_coop_with_headers);
    // explicit headers win over the send span's
    c.batch_execute("SELECT pgque.create_queue('cev'); SELECT pgque.register_subconsumer('cev', 'grp', 'm1')")
        .await
        .unwrap();
    let explicit = json!({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"});
    let (cid, xid) = {
        let root = Context::current_with_span(global::tracer("test").start("request 3"));
        let _g = root.attach();
        let cid = send(&c, "cev", "co", &json!({"n": 1}), None).await.unwrap();
        let opts = SendOptions {
            headers: Some(explicit.clone()),
            ..Default::default()
        };
        (cid, send_with(&c, "cev", "co", &json!({"n": 2}), &opts).await.unwrap())
    };
    let csend = named(&exporter.get_finished_spans().unwrap(), "send cev")[0].clone();
    type Got = Arc<Mutex<Vec<(i64, Option<Value>)>>>;
    let got: Got = Arc::default();
    let g2 = got.clone();
    let member = Consumer::new(&dsn, "cev", "grp", move |m: Message| {
        let g2 = g2.clone();
        async move {
            g2.lock().unwrap().push((m.msg_id, m.headers.clone()));
            Ok(())
        }
    })
    .unwrap()
    .cooperative("m1")
    .poll_interval(Duration::from_millis(200));
    let sd = Shutdown::new();
    let run = tokio::spawn({
        let sd = sd.clone();
        async move { member.run(sd).await }
    });
    c.execute("SELECT pgque.force_tick('cev')", &[]).await.unwrap();
    wait_until(60, "the cooperative member's events", || {
        let n = got.lock().unwrap().len();
        async move { n == 2 }
    })
    .await;
    sd.trigger();
    run.await.unwrap().unwrap();
    let got = got.lock().unwrap().clone();
    assert_eq!(got[0], (cid, Some(tp(&csend))));
    assert_eq!(got[1], (xid, Some(explicit)));
    let spans = exporter.get_finished_spans().unwrap();
    let procs = named(&spans, "process cev");
    assert_eq!(procs.len(), 2);
    let p = procs.iter().find(|p| msg_id(p) == cid).unwrap();
    assert_eq!(p.parent_span_id, csend.span_context.span_id());
    assert_eq!(links(p), vec![csend.span_context.span_id()]);
    assert_eq!(attr(p, "messaging.consumer.group.name"), Some("grp".into()));
    let x = procs.iter().find(|p| msg_id(p) == xid).unwrap();
    assert_eq!(
        x.span_context.trace_id().to_string(),
        "0af7651916cd43dd8448eb211c80319c"
    );
    let _ = provider.shutdown();
}
