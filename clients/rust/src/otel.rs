//! OpenTelemetry trace context for jobs (feature `otel`, docs/tracing.md).
//!
//! Producer: [`start_send`] opens a PRODUCER span `send <queue>` (child of
//! the current context) and returns the W3C `traceparent` / `tracestate` of
//! that span as the job's headers. Worker: [`start_process`] opens a
//! CONSUMER span `process <queue>` for one job, linked to the producer's
//! context; on the first attempt it is also its child (one trace from
//! producer to handler), a retry (attempt > 1) starts a new trace linked to
//! it. The handler's future runs in the span's context, so what it enqueues
//! carries it on. Attributes follow the OpenTelemetry messaging conventions
//! (messaging.system = "pgque", messaging.destination.name,
//! messaging.message.id, messaging.operation.type / name), plus
//! pgque.job.kind and pgque.job.attempt.
//!
//! Events (docs/tracing.md, "Events"): the producers use [`start_send`] as
//! well, and the consumers open one CONSUMER span `process <queue>` per
//! event ([`start_event`]) with the same rules: linked to the producer, its
//! child on the first delivery, a new trace on a redelivery (a positive
//! `retry_count`); attributes `messaging.consumer.group.name` (the
//! consumer), `pgque.event.type`, `pgque.event.retry_count`.
//!
//! Only the API crate is used: the W3C header format is written and read
//! here (the propagator lives in the SDK), so the headers do not depend on
//! which global propagator the application installed.

use std::borrow::Cow;
use std::str::FromStr;

use opentelemetry::trace::{Link, SpanContext, SpanKind, Status, TraceContextExt, TraceState, Tracer};
use opentelemetry::{global, Context, KeyValue, SpanId, TraceFlags, TraceId};
use serde_json::{Map, Value};

const SYSTEM: &str = "pgque";

fn tracer() -> global::BoxedTracer {
    global::tracer("pgque-client")
}

/// The W3C headers of the span of `cx` (None: no valid span).
pub fn headers_of(cx: &Context) -> Option<Value> {
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let mut m = Map::new();
    m.insert(
        "traceparent".into(),
        Value::String(format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )),
    );
    let state = sc.trace_state().header();
    if !state.is_empty() {
        m.insert("tracestate".into(), Value::String(state));
    }
    Some(Value::Object(m))
}

/// The remote span context a job's headers carry (None: none, or malformed).
pub fn context_of(headers: &Value) -> Option<SpanContext> {
    let tp = headers.get("traceparent")?.as_str()?;
    let mut parts = tp.split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let state = headers
        .get("tracestate")
        .and_then(Value::as_str)
        .and_then(|s| TraceState::from_str(s).ok())
        .unwrap_or_default();
    let sc = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(flags & 1),
        true,
        state,
    );
    sc.is_valid().then_some(sc)
}

/// A PRODUCER span for an enqueue of `n` jobs into `queue`, child of the
/// current context: its context and the headers to store (None: no valid
/// span, e.g. no SDK installed).
pub fn start_send(queue: &str, n: usize) -> (Context, Option<Value>) {
    let parent = Context::current();
    let mut attrs = vec![
        KeyValue::new("messaging.system", SYSTEM),
        KeyValue::new("messaging.destination.name", queue.to_owned()),
        KeyValue::new("messaging.operation.type", "send"),
        KeyValue::new("messaging.operation.name", "send"),
    ];
    if n != 1 {
        attrs.push(KeyValue::new("messaging.batch.message_count", n as i64));
    }
    let t = tracer();
    let span = t
        .span_builder(Cow::Owned(format!("send {queue}")))
        .with_kind(SpanKind::Producer)
        .with_attributes(attrs)
        .start_with_context(&t, &parent);
    let cx = parent.with_span(span);
    let headers = headers_of(&cx);
    (cx, headers)
}

/// A CONSUMER span for one job (see the module doc); run the handler with
/// `.with_context(cx)` and end it with [`end`].
pub fn start_process(queue: &str, job_id: i64, kind: &str, attempt: i32, headers: Option<&Value>) -> Context {
    consumer_span(
        queue,
        headers,
        attempt <= 1,
        vec![
            KeyValue::new("messaging.system", SYSTEM),
            KeyValue::new("messaging.destination.name", queue.to_owned()),
            KeyValue::new("messaging.message.id", job_id.to_string()),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("pgque.job.kind", kind.to_owned()),
            KeyValue::new("pgque.job.attempt", attempt as i64),
        ],
    )
}

/// A CONSUMER span for one event's handler call (see the module doc);
/// `retry_count` None or 0 is the first delivery. Run the handler with
/// `.with_context(cx)` and end it with [`end`].
pub fn start_event(
    queue: &str,
    consumer: &str,
    msg_id: i64,
    type_name: &str,
    retry_count: Option<i32>,
    headers: Option<&Value>,
) -> Context {
    let retries = retry_count.unwrap_or(0);
    consumer_span(
        queue,
        headers,
        retries == 0,
        vec![
            KeyValue::new("messaging.system", SYSTEM),
            KeyValue::new("messaging.destination.name", queue.to_owned()),
            KeyValue::new("messaging.consumer.group.name", consumer.to_owned()),
            KeyValue::new("messaging.message.id", msg_id.to_string()),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("pgque.event.type", type_name.to_owned()),
            KeyValue::new("pgque.event.retry_count", retries as i64),
        ],
    )
}

/// A CONSUMER span `process <queue>` linked to the producer context in
/// `headers`, and its child when `first`.
fn consumer_span(queue: &str, headers: Option<&Value>, first: bool, attrs: Vec<KeyValue>) -> Context {
    let producer = headers.and_then(context_of);
    let parent = match &producer {
        Some(sc) if first => Context::new().with_remote_span_context(sc.clone()),
        _ => Context::new(),
    };
    let links = producer.map(|sc| vec![Link::with_context(sc)]).unwrap_or_default();
    let t = tracer();
    let span = t
        .span_builder(Cow::Owned(format!("process {queue}")))
        .with_kind(SpanKind::Consumer)
        .with_links(links)
        .with_attributes(attrs)
        .start_with_context(&t, &parent);
    parent.with_span(span)
}

/// Ends the span of `cx`, with an error status when `error` is given.
pub fn end(cx: &Context, error: Option<&str>) {
    let span = cx.span();
    if let Some(e) = error {
        span.add_event("exception", vec![KeyValue::new("exception.message", e.to_owned())]);
        span.set_status(Status::error(e.to_owned()));
    }
    span.end();
}
