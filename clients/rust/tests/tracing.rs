//! Trace context with the `otel` feature (docs/tracing.md), checked with the
//! OpenTelemetry SDK's in-memory exporter: the producer's send span and the
//! headers it stores, the worker's process span per attempt (child of and
//! linked to the producer on the first, a new linked trace on a retry), and
//! an enqueue inside a handler carrying the process span's context on.
mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{global, Context, Value as OtelValue};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use pgque_client::*;
use serde_json::json;

fn attr(s: &SpanData, key: &str) -> Option<OtelValue> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn producer_and_worker_spans_per_attempt_and_nested_enqueue() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    global::set_tracer_provider(provider.clone());

    let (dsn, c) = test_db("tracing").await;
    c.batch_execute(
        "SELECT pgque.create_job_queue('ta'); SELECT pgque.create_job_queue('tb'); \
         SELECT pgque.create_job_queue('tf')",
    )
    .await
    .unwrap();

    // a producer in a traced context
    let tracer = global::tracer("test");
    let root = tracer.start("request");
    let root_cx = Context::current_with_span(root);
    let trace_id = root_cx.span().span_context().trace_id();
    let (a, batch, flow) = {
        let _g = root_cx.clone().attach();
        let a = enqueue(&c, "ta", "flaky", &json!({}), &EnqueueOptions::default())
            .await
            .unwrap()
            .unwrap();
        let batch = enqueue_many(
            &c,
            "tb",
            &[NewJob::new("b", json!({})), NewJob::new("b", json!({}))],
            None,
        )
        .await
        .unwrap();
        // a flow: one send span, its context on every job of the flow
        let flow = enqueue_flow(
            &c,
            "tf",
            &json!([{"key": "x", "kind": "f"}, {"key": "y", "kind": "f", "depends_on": ["x"]}]),
        )
        .await
        .unwrap();
        (a, batch, flow)
    };
    root_cx.span().end();
    let spans = exporter.get_finished_spans().unwrap();
    let sends = named(&spans, "send ta");
    assert_eq!(sends.len(), 1);
    let send = sends[0];
    assert_eq!(send.span_kind, SpanKind::Producer);
    assert_eq!(send.span_context.trace_id(), trace_id);
    assert_eq!(send.parent_span_id, root_cx.span().span_context().span_id());
    assert_eq!(attr(send, "messaging.system"), Some("pgque".into()));
    assert_eq!(attr(send, "messaging.destination.name"), Some("ta".into()));
    let send_b = named(&spans, "send tb")[0];
    assert_eq!(attr(send_b, "messaging.batch.message_count"), Some(2i64.into()));
    let tp: String = c
        .query_one("SELECT headers ->> 'traceparent' FROM pgque.get_job($1)", &[&a])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        tp,
        format!("00-{}-{}-01", send.span_context.trace_id(), send.span_context.span_id())
    );
    for e in &batch {
        let h: String = c
            .query_one(
                "SELECT headers ->> 'traceparent' FROM pgque.get_job($1)",
                &[&e.job_id.unwrap()],
            )
            .await
            .unwrap()
            .get(0);
        assert!(h.contains(&send_b.span_context.span_id().to_string()), "{h}");
    }

    let send_f = named(&spans, "send tf")[0];
    assert_eq!(send_f.span_context.trace_id(), trace_id);
    assert_eq!(attr(send_f, "messaging.batch.message_count"), Some(2i64.into()));
    assert_eq!(flow.len(), 2);
    for f in &flow {
        let h: String = c
            .query_one("SELECT headers ->> 'traceparent' FROM pgque.get_job($1)", &[&f.job_id])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            h,
            format!(
                "00-{}-{}-01",
                send_f.span_context.trace_id(),
                send_f.span_context.span_id()
            )
        );
    }

    // the worker: attempt 1 fails, attempt 2 enqueues a job into tc
    c.batch_execute("SELECT pgque.create_job_queue('tc')").await.unwrap();
    let nested: Arc<Mutex<Option<i64>>> = Arc::default();
    let n2 = nested.clone();
    let dsn2 = dsn.clone();
    let w = Worker::builder(&dsn, ["ta", "tb"])
        .unwrap()
        .poll_interval(Duration::from_millis(200))
        .handler("flaky", move |job: Job| {
            let (n2, dsn2) = (n2.clone(), dsn2.clone());
            async move {
                if job.attempt == 1 {
                    return Err("boom on the first attempt".into());
                }
                let c = connect(&dsn2).await;
                let id = enqueue(&c, "tc", "nested", &json!({}), &EnqueueOptions::default()).await?;
                *n2.lock().unwrap() = id;
                Ok(None)
            }
        })
        .handler("b", |_job: Job| async { Ok(None) })
        .build()
        .unwrap();
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let sd = sd.clone();
        async move { w.run(sd).await }
    });
    wait_until(60, "the jobs and the retry", || async {
        states(&c, "ta").await == vec![("completed".into(), 1)]
            && states(&c, "tb").await == vec![("completed".into(), 2)]
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let mut procs: Vec<&SpanData> = named(&spans, "process ta");
    procs.sort_by_key(|s| match attr(s, "pgque.job.attempt") {
        Some(OtelValue::I64(n)) => n,
        _ => 0,
    });
    assert_eq!(procs.len(), 2, "one process span per attempt");
    for p in &procs {
        assert_eq!(p.span_kind, SpanKind::Consumer);
        assert_eq!(attr(p, "messaging.message.id"), Some(a.to_string().into()));
        assert_eq!(attr(p, "messaging.operation.type"), Some("process".into()));
        assert_eq!(attr(p, "pgque.job.kind"), Some("flaky".into()));
        let links: Vec<_> = p.links.iter().map(|l| l.span_context.span_id()).collect();
        assert_eq!(links, vec![send.span_context.span_id()]);
    }
    let (first, retry) = (procs[0], procs[1]);
    assert_eq!(first.span_context.trace_id(), trace_id);
    assert_eq!(first.parent_span_id, send.span_context.span_id());
    assert!(matches!(first.status, Status::Error { .. }), "{:?}", first.status);
    assert_eq!(attr(retry, "pgque.job.attempt"), Some(2i64.into()));
    assert_ne!(retry.span_context.trace_id(), trace_id);
    assert_eq!(retry.status, Status::Unset);
    // the nested enqueue: a send span under the retry's process span, and
    // the job carries it
    let nested_send = named(&spans, "send tc")[0];
    assert_eq!(nested_send.parent_span_id, retry.span_context.span_id());
    assert_eq!(nested_send.span_context.trace_id(), retry.span_context.trace_id());
    let nested = nested.lock().unwrap().expect("the nested job");
    let tp: String = c
        .query_one("SELECT headers ->> 'traceparent' FROM pgque.get_job($1)", &[&nested])
        .await
        .unwrap()
        .get(0);
    assert!(tp.contains(&nested_send.span_context.span_id().to_string()), "{tp}");
    let procs_b = named(&spans, "process tb");
    assert_eq!(procs_b.len(), 2);
    for p in procs_b {
        assert_eq!(p.parent_span_id, send_b.span_context.span_id());
    }
    let _ = provider.shutdown();
}

#[tokio::test]
async fn explicit_headers_win_and_bad_ones_are_refused() {
    let (_dsn, c) = test_db("tracing_explicit").await;
    c.batch_execute("SELECT pgque.create_job_queue('q')").await.unwrap();
    let o = EnqueueOptions {
        headers: Some(json!({"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"})),
        ..Default::default()
    };
    let id = enqueue(&c, "q", "k", &json!({}), &o).await.unwrap().unwrap();
    let tp: String = c
        .query_one("SELECT headers ->> 'traceparent' FROM pgque.get_job($1)", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tp, "00-11111111111111111111111111111111-2222222222222222-01");
    let bad = EnqueueOptions {
        headers: Some(json!({"traceparent": 1})),
        ..Default::default()
    };
    let e = enqueue(&c, "q", "k", &json!({}), &bad).await.unwrap_err();
    assert_eq!(e.sqlstate(), Some("22023"), "{e}");
}
