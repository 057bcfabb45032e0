//! Producers: job enqueue and event send on the caller's client or
//! transaction. Each call is one statement; nothing here commits, so a
//! rolled-back transaction leaves no job and no event.

use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

use crate::error::{Error, Result};

/// The options of `pgque.enqueue`, by the SQL function's parameter names.
/// `None` takes the server's default.
#[derive(Debug, Clone, Default)]
pub struct EnqueueOptions {
    /// -1000..1000, lower runs first.
    pub priority: Option<i32>,
    /// A future time puts the job in the scheduled set.
    pub run_at: Option<SystemTime>,
    /// At most `max_concurrent` running jobs per actor (`set_actor_capacity`).
    pub actor: Option<String>,
    /// Round-robin queues are fair over this key.
    pub fairness_key: Option<String>,
    /// At most one running job per (queue, identity key).
    pub identity_key: Option<String>,
    /// At most one live job per (queue, unique key).
    pub unique_key: Option<String>,
    /// 1..1000; the queue's setting when `None`.
    pub max_attempts: Option<i32>,
    /// `"skip"` (the default) or `"error"`.
    pub on_duplicate: Option<String>,
    /// Parent jobs (servers with flows only).
    pub depends_on: Option<Vec<i64>>,
    /// Small metadata stored with the job (servers with job headers only): a
    /// JSON object of strings, e.g. W3C `traceparent` / `tracestate`. With
    /// the `otel` feature, None is filled from the current OpenTelemetry
    /// context (docs/tracing.md).
    pub headers: Option<Value>,
}

/// One row of [`enqueue_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id; for a `duplicate` the holder's (None if not yet visible).
    pub job_id: Option<i64>,
    /// `ready`, `scheduled` or `duplicate`.
    pub state: String,
}

/// One job of [`enqueue_many`].
#[derive(Debug, Clone)]
pub struct NewJob {
    pub kind: String,
    pub args: Value,
    /// Per job: priority, run_at, actor, fairness_key, identity_key,
    /// unique_key, max_attempts (on_duplicate and depends_on are not per job).
    pub options: EnqueueOptions,
}

impl NewJob {
    /// A job with default options.
    pub fn new(kind: impl Into<String>, args: Value) -> Self {
        NewJob {
            kind: kind.into(),
            args,
            options: EnqueueOptions::default(),
        }
    }
}

/// One row of [`enqueue_flow`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowJob {
    pub flow_id: i64,
    pub key: String,
    pub job_id: i64,
}

/// The result of [`send_idem`]: the event id (the original one when deduped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdemSend {
    pub event_id: i64,
    pub deduped: bool,
}

type Param = Box<dyn ToSql + Sync + Send>;

fn refs(params: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect()
}

/// Enqueues one job (`pgque.enqueue`); returns its id (for a duplicate unique
/// key with `on_duplicate = "skip"`, the holder's id).
pub async fn enqueue<C: GenericClient>(
    client: &C,
    queue: &str,
    kind: &str,
    args: &Value,
    options: &EnqueueOptions,
) -> Result<Option<i64>> {
    #[cfg(feature = "otel")]
    {
        if options.headers.is_none() {
            let (cx, headers) = crate::otel::start_send(queue, 1);
            let mut o = options.clone();
            o.headers = headers;
            let r = enqueue_plain(client, queue, kind, args, &o).await;
            crate::otel::end(&cx, r.as_ref().err().map(|e| e.to_string()).as_deref());
            return r;
        }
    }
    enqueue_plain(client, queue, kind, args, options).await
}

async fn enqueue_plain<C: GenericClient>(
    client: &C,
    queue: &str,
    kind: &str,
    args: &Value,
    options: &EnqueueOptions,
) -> Result<Option<i64>> {
    let mut sql = String::from("SELECT pgque.enqueue(queue_name => $1::text, kind => $2::text, args => $3::jsonb");
    let mut params: Vec<Param> = vec![
        Box::new(queue.to_owned()),
        Box::new(kind.to_owned()),
        Box::new(args.clone()),
    ];
    let mut add = |name: &str, ty: &str, p: Param, params: &mut Vec<Param>| {
        params.push(p);
        sql.push_str(&format!(", {name} => ${}::{ty}", params.len()));
    };
    let o = options;
    if let Some(v) = o.priority {
        add("priority", "int4", Box::new(v), &mut params);
    }
    if let Some(v) = o.run_at {
        add("run_at", "timestamptz", Box::new(v), &mut params);
    }
    for (name, v) in [
        ("actor", &o.actor),
        ("fairness_key", &o.fairness_key),
        ("identity_key", &o.identity_key),
        ("unique_key", &o.unique_key),
        ("on_duplicate", &o.on_duplicate),
    ] {
        if let Some(v) = v {
            add(name, "text", Box::new(v.clone()), &mut params);
        }
    }
    if let Some(v) = o.max_attempts {
        add("max_attempts", "int4", Box::new(v), &mut params);
    }
    if let Some(v) = &o.depends_on {
        add("depends_on", "int8[]", Box::new(v.clone()), &mut params);
    }
    if let Some(v) = &o.headers {
        add("headers", "jsonb", Box::new(v.clone()), &mut params);
    }
    sql.push(')');
    let row = client
        .query_one(&sql, &refs(&params))
        .await
        .map_err(|e| missing(e, "enqueue(..., depends_on)"))?;
    Ok(row.get(0))
}

/// Enqueues a batch in one statement (`pgque.enqueue_ready_rows`); one row
/// per job, in input order.
pub async fn enqueue_many<C: GenericClient>(
    client: &C,
    queue: &str,
    jobs: &[NewJob],
    on_duplicate: Option<&str>,
) -> Result<Vec<Enqueued>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    #[cfg(feature = "otel")]
    {
        let (cx, headers) = crate::otel::start_send(queue, jobs.len());
        let r = enqueue_many_plain(client, queue, jobs, on_duplicate, headers.as_ref()).await;
        crate::otel::end(&cx, r.as_ref().err().map(|e| e.to_string()).as_deref());
        r
    }
    #[cfg(not(feature = "otel"))]
    enqueue_many_plain(client, queue, jobs, on_duplicate, None).await
}

/// `headers`: for the jobs without their own (None: only the jobs' own).
async fn enqueue_many_plain<C: GenericClient>(
    client: &C,
    queue: &str,
    jobs: &[NewJob],
    on_duplicate: Option<&str>,
    headers: Option<&Value>,
) -> Result<Vec<Enqueued>> {
    fn col<T: Clone>(jobs: &[NewJob], f: impl Fn(&EnqueueOptions) -> Option<T>) -> Option<Vec<Option<T>>> {
        let v: Vec<Option<T>> = jobs.iter().map(|j| f(&j.options)).collect();
        v.iter().any(Option::is_some).then_some(v)
    }
    let kinds: Vec<&str> = jobs.iter().map(|j| j.kind.as_str()).collect();
    let args: Vec<&Value> = jobs.iter().map(|j| &j.args).collect();
    let prio = col(jobs, |o| {
        o.priority.map(|p| p.clamp(i16::MIN as i32, i16::MAX as i32) as i16)
    });
    let run_at = col(jobs, |o| o.run_at);
    let actors = col(jobs, |o| o.actor.clone());
    let fair = col(jobs, |o| o.fairness_key.clone());
    let ident = col(jobs, |o| o.identity_key.clone());
    let uniq = col(jobs, |o| o.unique_key.clone());
    let maxa = col(jobs, |o| o.max_attempts);
    let hdrs = col(jobs, |o| o.headers.clone().or_else(|| headers.cloned()));
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![
        &queue,
        &kinds,
        &args,
        &prio,
        &run_at,
        &actors,
        &fair,
        &ident,
        &uniq,
        &maxa,
        &on_duplicate,
    ];
    // Headers only when some job has them: the statement of a server
    // without job headers otherwise.
    let sql = if let Some(h) = &hdrs {
        params.push(h);
        "SELECT job_id, state FROM pgque.enqueue_ready_rows($1::text, $2::text[], $3::jsonb[], \
         $4::int2[], $5::timestamptz[], $6::text[], $7::text[], $8::text[], $9::text[], $10::int4[], \
         coalesce($11::text, 'skip'), $12::jsonb[]) ORDER BY ord"
    } else {
        "SELECT job_id, state FROM pgque.enqueue_ready_rows($1::text, $2::text[], $3::jsonb[], \
         $4::int2[], $5::timestamptz[], $6::text[], $7::text[], $8::text[], $9::text[], $10::int4[], \
         coalesce($11::text, 'skip')) ORDER BY ord"
    };
    let rows = client.query(sql, &params).await?;
    Ok(rows
        .iter()
        .map(|r| Enqueued {
            job_id: r.get(0),
            state: r.get(1),
        })
        .collect())
}

/// Enqueues a flow (`pgque.enqueue_flow`): a JSON array of jobs with `key`,
/// `kind`, `args`, `depends_on` (keys) and enqueue options, all or nothing.
/// With the `otel` feature, in a traced context, every job without
/// `headers` of its own gets the `send <queue>` span's trace context (on a
/// server whose flows take headers, pgque 0.8).
/// [`Error::ServerFeatureMissing`] on a server without flows.
pub async fn enqueue_flow<C: GenericClient>(client: &C, queue: &str, jobs: &Value) -> Result<Vec<FlowJob>> {
    #[cfg(feature = "otel")]
    {
        let n = jobs.as_array().map_or(1, Vec::len);
        let (cx, headers) = crate::otel::start_send(queue, n);
        let r = match headers {
            Some(h) if flows_take_headers(client).await? => {
                enqueue_flow_plain(client, queue, &with_flow_headers(jobs, &h)).await
            }
            _ => enqueue_flow_plain(client, queue, jobs).await,
        };
        crate::otel::end(&cx, r.as_ref().err().map(|e| e.to_string()).as_deref());
        r
    }
    #[cfg(not(feature = "otel"))]
    enqueue_flow_plain(client, queue, jobs).await
}

/// Whether the server's flows take headers: its enqueue has them (pgque 0.8).
#[cfg(feature = "otel")]
async fn flows_take_headers<C: GenericClient>(client: &C) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p \
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = 'pgque' AND p.proname = 'enqueue' AND p.pronargs >= 13)",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// `jobs` with `headers` set on every job object that has none.
#[cfg(feature = "otel")]
fn with_flow_headers(jobs: &Value, headers: &Value) -> Value {
    let mut out = jobs.clone();
    if let Some(arr) = out.as_array_mut() {
        for j in arr.iter_mut() {
            if let Some(o) = j.as_object_mut() {
                o.entry("headers").or_insert_with(|| headers.clone());
            }
        }
    }
    out
}

async fn enqueue_flow_plain<C: GenericClient>(client: &C, queue: &str, jobs: &Value) -> Result<Vec<FlowJob>> {
    let rows = client
        .query(
            "SELECT flow_id, key, job_id FROM pgque.enqueue_flow($1::text, $2::jsonb)",
            &[&queue, jobs],
        )
        .await
        .map_err(|e| missing(e, "enqueue_flow"))?;
    Ok(rows
        .iter()
        .map(|r| FlowJob {
            flow_id: r.get(0),
            key: r.get(1),
            job_id: r.get(2),
        })
        .collect())
}

fn missing(e: tokio_postgres::Error, what: &'static str) -> Error {
    let err = Error::Db(e);
    if err.kind() == crate::ErrorKind::UndefinedFunction {
        Error::ServerFeatureMissing(what)
    } else {
        err
    }
}

/// The options of an event send ([`send_with`], [`send_text_with`],
/// [`send_idem_with`], [`send_at`]).
#[derive(Debug, Clone, Default)]
pub struct SendOptions {
    /// Rides extra1 (partitioned consumers read it).
    pub partition_key: Option<String>,
    /// Stored with the event (servers with event headers, pgque 0.8): a JSON
    /// object of strings, e.g. W3C `traceparent` / `tracestate`. Given, they
    /// win over the `send <queue>` span's trace context (feature `otel`); a
    /// server without event headers refuses them with
    /// [`Error::ServerFeatureMissing`].
    pub headers: Option<Value>,
}

/// Runs `f` (an event send) in a `send <queue>` span with the `otel`
/// feature. `f` gets the headers to store: `explicit` when given, else the
/// span's when there is a valid span context and the server's send takes
/// headers (pgque 0.8), else None (the plain overloads; an untraced send
/// costs nothing more).
#[cfg(feature = "otel")]
async fn send_span<C, T, F, Fut>(client: &C, queue: &str, n: usize, explicit: Option<&Value>, f: F) -> Result<T>
where
    C: GenericClient,
    F: FnOnce(Option<Value>) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let (cx, headers) = crate::otel::start_send(queue, n);
    let r = async {
        let headers = match (explicit, headers) {
            (Some(h), _) => Some(h.clone()),
            (None, Some(h)) if event_headers(client).await? => Some(h),
            _ => None,
        };
        with_explicit(explicit.is_some(), f(headers).await)
    }
    .await;
    crate::otel::end(&cx, r.as_ref().err().map(|e| e.to_string()).as_deref());
    r
}

#[cfg(not(feature = "otel"))]
async fn send_span<C, T, F, Fut>(_: &C, _: &str, _: usize, explicit: Option<&Value>, f: F) -> Result<T>
where
    C: GenericClient,
    F: FnOnce(Option<Value>) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    with_explicit(explicit.is_some(), f(explicit.cloned()).await)
}

/// A server without the headers overloads (42883, pgque 0.7) refuses the
/// caller's explicit headers as a missing feature.
fn with_explicit<T>(explicit: bool, r: Result<T>) -> Result<T> {
    match r {
        Err(Error::Db(e)) if explicit => Err(missing(e, "event headers (pgque 0.8)")),
        r => r,
    }
}

/// Whether the server's event sends take headers (pgque 0.8).
#[cfg(feature = "otel")]
async fn event_headers<C: GenericClient>(client: &C) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT to_regprocedure('pgque.send(text,text,jsonb,text,jsonb)') IS NOT NULL",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// Sends one JSON event (`pgque.send`); `partition_key` rides extra1. With
/// the `otel` feature, in a traced context, the event stores the `send
/// <queue>` span's trace context (docs/tracing.md).
pub async fn send<C: GenericClient>(
    client: &C,
    queue: &str,
    type_name: &str,
    payload: &Value,
    partition_key: Option<&str>,
) -> Result<i64> {
    send_span(client, queue, 1, None, |h| {
        send_one(client, queue, type_name, payload, "jsonb", partition_key, h)
    })
    .await
}

/// [`send`] with [`SendOptions`]: a partition key and explicit headers.
///
/// ```no_run
/// # async fn f(client: &tokio_postgres::Client) -> pgque_client::Result<()> {
/// use pgque_client::{send_with, SendOptions};
/// let opts = SendOptions {
///     headers: Some(serde_json::json!({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})),
///     ..Default::default()
/// };
/// let id = send_with(client, "orders", "created", &serde_json::json!({"id": 1}), &opts).await?;
/// # let _ = id; Ok(()) }
/// ```
pub async fn send_with<C: GenericClient>(
    client: &C,
    queue: &str,
    type_name: &str,
    payload: &Value,
    options: &SendOptions,
) -> Result<i64> {
    let key = options.partition_key.as_deref();
    send_span(client, queue, 1, options.headers.as_ref(), |h| {
        send_one(client, queue, type_name, payload, "jsonb", key, h)
    })
    .await
}

/// Sends one text event (the text overload of `pgque.send`); as [`send`].
pub async fn send_text<C: GenericClient>(
    client: &C,
    queue: &str,
    type_name: &str,
    payload: &str,
    partition_key: Option<&str>,
) -> Result<i64> {
    send_span(client, queue, 1, None, |h| {
        send_one(client, queue, type_name, &payload, "text", partition_key, h)
    })
    .await
}

/// [`send_text`] with [`SendOptions`].
pub async fn send_text_with<C: GenericClient>(
    client: &C,
    queue: &str,
    type_name: &str,
    payload: &str,
    options: &SendOptions,
) -> Result<i64> {
    let key = options.partition_key.as_deref();
    send_span(client, queue, 1, options.headers.as_ref(), |h| {
        send_one(client, queue, type_name, &payload, "text", key, h)
    })
    .await
}

/// Delayed delivery (`pgque.send_at`): the event is delivered at
/// `deliver_at` (a past time: at the next tick); returns its id. Traced as
/// [`send`]; `options.headers` are kept until the event is delivered.
pub async fn send_at<C: GenericClient>(
    client: &C,
    queue: &str,
    type_name: &str,
    payload: &Value,
    deliver_at: SystemTime,
    options: &SendOptions,
) -> Result<i64> {
    let key = options.partition_key.as_deref();
    send_span(client, queue, 1, options.headers.as_ref(), |h| async move {
        let row = match &h {
            Some(h) => {
                client
                    .query_one(
                        "SELECT pgque.send_at($1::text, $2::text, $3::jsonb, $4::timestamptz, $5::text, $6::jsonb)",
                        &[&queue, &type_name, payload, &deliver_at, &key, h],
                    )
                    .await?
            }
            None => {
                client
                    .query_one(
                        "SELECT pgque.send_at($1::text, $2::text, $3::jsonb, $4::timestamptz, $5::text)",
                        &[&queue, &type_name, payload, &deliver_at, &key],
                    )
                    .await?
            }
        };
        Ok(row.get(0))
    })
    .await
}

/// `pgque.send` with the payload cast to `ty`; `headers` take the
/// 5-argument overload (servers with event headers).
async fn send_one<C: GenericClient>(
    client: &C,
    queue: &str,
    type_name: &str,
    payload: &(dyn ToSql + Sync),
    ty: &str,
    partition_key: Option<&str>,
    headers: Option<Value>,
) -> Result<i64> {
    let row = match (partition_key, &headers) {
        (k, Some(h)) => {
            client
                .query_one(
                    &format!("SELECT pgque.send($1::text, $2::text, $3::{ty}, $4::text, $5::jsonb)"),
                    &[&queue, &type_name, payload, &k, h],
                )
                .await?
        }
        (Some(k), None) => {
            client
                .query_one(
                    &format!("SELECT pgque.send($1::text, $2::text, $3::{ty}, $4::text)"),
                    &[&queue, &type_name, payload, &k],
                )
                .await?
        }
        (None, None) => {
            client
                .query_one(
                    &format!("SELECT pgque.send($1::text, $2::text, $3::{ty})"),
                    &[&queue, &type_name, payload],
                )
                .await?
        }
    };
    Ok(row.get(0))
}

/// Sends JSON events in one statement (`pgque.send_batch`); ids aligned with
/// `payloads`. `partition_keys`, when given, must align too. With the
/// `otel` feature, in a traced context, one `send <queue>` span for the
/// batch, whose trace context every event stores.
pub async fn send_batch<C: GenericClient>(
    client: &C,
    queue: &str,
    type_name: &str,
    payloads: &[Value],
    partition_keys: Option<&[Option<&str>]>,
) -> Result<Vec<i64>> {
    send_batch_with(client, queue, type_name, payloads, partition_keys, None).await
}

/// [`send_batch`] with explicit `headers`: one object stored with every
/// event of the batch (servers with event headers); they win over the span's.
pub async fn send_batch_with<C: GenericClient>(
    client: &C,
    queue: &str,
    type_name: &str,
    payloads: &[Value],
    partition_keys: Option<&[Option<&str>]>,
    headers: Option<&Value>,
) -> Result<Vec<i64>> {
    if let Some(keys) = partition_keys {
        if keys.len() != payloads.len() {
            return Err(Error::Invalid("partition_keys must align with payloads".into()));
        }
    }
    send_span(client, queue, payloads.len(), headers, |h| async move {
        let row = match (partition_keys, &h) {
            (keys, Some(h)) => {
                client
                    .query_one(
                        "SELECT pgque.send_batch($1::text, $2::text, $3::jsonb[], $4::text[], $5::jsonb)",
                        &[&queue, &type_name, &payloads, &keys, h],
                    )
                    .await?
            }
            (Some(keys), None) => {
                client
                    .query_one(
                        "SELECT pgque.send_batch($1::text, $2::text, $3::jsonb[], $4::text[])",
                        &[&queue, &type_name, &payloads, &keys],
                    )
                    .await?
            }
            (None, None) => {
                client
                    .query_one(
                        "SELECT pgque.send_batch($1::text, $2::text, $3::jsonb[])",
                        &[&queue, &type_name, &payloads],
                    )
                    .await?
            }
        };
        Ok(row.get(0))
    })
    .await
}

/// At most one event per (queue, idem_key) while the key's window (`ttl`)
/// is live (`pgque.send_idem`). Traced as [`send`].
pub async fn send_idem<C: GenericClient>(
    client: &C,
    queue: &str,
    type_name: &str,
    payload: &Value,
    idem_key: &str,
    ttl: Duration,
    partition_key: Option<&str>,
) -> Result<IdemSend> {
    let options = SendOptions {
        partition_key: partition_key.map(str::to_owned),
        headers: None,
    };
    send_idem_with(client, queue, type_name, payload, idem_key, ttl, &options).await
}

/// [`send_idem`] with [`SendOptions`] (a deduped send stores nothing: the
/// original keeps its own headers).
pub async fn send_idem_with<C: GenericClient>(
    client: &C,
    queue: &str,
    type_name: &str,
    payload: &Value,
    idem_key: &str,
    ttl: Duration,
    options: &SendOptions,
) -> Result<IdemSend> {
    let secs = ttl.as_secs_f64();
    let partition_key = options.partition_key.as_deref();
    send_span(client, queue, 1, options.headers.as_ref(), |h| async move {
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&queue, &type_name, payload, &idem_key, &secs, &partition_key];
        let sql = if let Some(h) = &h {
            params.push(h);
            "SELECT event_id, deduped FROM pgque.send_idem($1::text, $2::text, $3::jsonb, $4::text, \
             make_interval(secs => $5::float8), $6::text, $7::jsonb)"
        } else {
            "SELECT event_id, deduped FROM pgque.send_idem($1::text, $2::text, $3::jsonb, $4::text, \
             make_interval(secs => $5::float8), $6::text)"
        };
        let row = client.query_one(sql, &params).await?;
        Ok(IdemSend {
            event_id: row.get(0),
            deduped: row.get(1),
        })
    })
    .await
}
