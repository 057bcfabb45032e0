//! One hop of the cross-client trace test (clients/python/tests/
//! test_cross_trace.py): a worker with the `otel` feature and the SDK's
//! in-memory exporter runs one job of kind `hop` from FROM_QUEUE, and its
//! handler enqueues a job of kind `hop` into TO_QUEUE; then it prints every
//! finished span as a JSON line (name, kind, trace_id, span_id, parent,
//! links, attributes) for the test to check.
//!
//!     cargo run --features otel --example trace_hop -- DSN FROM_QUEUE TO_QUEUE

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::global;
use opentelemetry::trace::SpanKind;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use pgque_client::{enqueue, EnqueueOptions, Job, Shutdown, Worker};
use serde_json::json;
use tokio::sync::Notify;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let [dsn, from, to] = <[String; 3]>::try_from(argv).map_err(|_| "usage: trace_hop DSN FROM_QUEUE TO_QUEUE")?;
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    global::set_tracer_provider(provider.clone());

    let done = Arc::new(Notify::new());
    let (d, dsn2, to2) = (done.clone(), dsn.clone(), to.clone());
    let w = Worker::builder(&dsn, [from.as_str()])?
        .poll_interval(Duration::from_millis(100))
        .handler("hop", move |job: Job| {
            let (d, dsn2, to2) = (d.clone(), dsn2.clone(), to2.clone());
            async move {
                let (c, conn) = tokio_postgres::connect(&dsn2, tokio_postgres::NoTls).await?;
                tokio::spawn(conn);
                enqueue(&c, &to2, "hop", &json!({"from": job.id}), &EnqueueOptions::default()).await?;
                d.notify_one();
                Ok(None)
            }
        })
        .build()?;
    let sd = Shutdown::new();
    let run = tokio::spawn({
        let sd = sd.clone();
        async move { w.run(sd).await }
    });
    tokio::time::timeout(Duration::from_secs(60), done.notified())
        .await
        .map_err(|_| "no hop job within 60 s")?;
    sd.trigger();
    run.await??;
    for s in exporter.get_finished_spans()? {
        let kind = match s.span_kind {
            SpanKind::Producer => "producer",
            SpanKind::Consumer => "consumer",
            SpanKind::Client => "client",
            SpanKind::Server => "server",
            SpanKind::Internal => "internal",
        };
        let attrs: serde_json::Map<String, serde_json::Value> = s
            .attributes
            .iter()
            .map(|kv| (kv.key.to_string(), json!(kv.value.to_string())))
            .collect();
        let links: Vec<String> = s.links.iter().map(|l| l.span_context.span_id().to_string()).collect();
        println!(
            "{}",
            json!({
                "name": s.name,
                "kind": kind,
                "trace_id": s.span_context.trace_id().to_string(),
                "span_id": s.span_context.span_id().to_string(),
                "parent_span_id": s.parent_span_id.to_string(),
                "links": links,
                "attributes": attrs,
            })
        );
    }
    let _ = provider.shutdown();
    Ok(())
}
