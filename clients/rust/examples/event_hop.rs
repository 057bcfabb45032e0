//! The Rust consumer of the cross-client event trace test
//! (clients/python/tests/test_cross_trace.py): a Consumer with the `otel`
//! feature and the SDK's in-memory exporter reads COUNT events of QUEUE as
//! CONSUMER (subscribed by the test before the events were sent), then
//! prints every finished span as a JSON line (name, kind, trace_id,
//! span_id, parent, links, attributes) for the test to check.
//!
//!     cargo run --features otel --example event_hop -- DSN QUEUE CONSUMER COUNT

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::global;
use opentelemetry::trace::SpanKind;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use pgque_client::{Consumer, Message, Shutdown};
use serde_json::json;
use tokio::sync::Notify;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let [dsn, queue, consumer, count] =
        <[String; 4]>::try_from(argv).map_err(|_| "usage: event_hop DSN QUEUE CONSUMER COUNT")?;
    let count: usize = count.parse()?;
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    global::set_tracer_provider(provider.clone());

    let done = Arc::new(Notify::new());
    let handled = Arc::new(AtomicUsize::new(0));
    let (d, h) = (done.clone(), handled.clone());
    let c = Consumer::new(&dsn, &queue, &consumer, move |_m: Message| {
        let (d, h) = (d.clone(), h.clone());
        async move {
            if h.fetch_add(1, Ordering::SeqCst) + 1 == count {
                d.notify_one();
            }
            Ok(())
        }
    })?
    .poll_interval(Duration::from_millis(100));
    let sd = Shutdown::new();
    let run = tokio::spawn({
        let sd = sd.clone();
        async move { c.run(sd).await }
    });
    tokio::time::timeout(Duration::from_secs(60), done.notified())
        .await
        .map_err(|_| format!("not {count} events within 60 s"))?;
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
