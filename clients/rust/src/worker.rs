//! The job worker: dispatch in batches, run async handlers as tasks,
//! heartbeat, complete or fail, and drain on [`Shutdown`].
//!
//! Tasks of a running worker: the dispatch loop (one pooled connection,
//! `pgque.dispatch` of up to the free handler slots), a LISTEN task, one task
//! per running job, a completer (the finished jobs of each moment in one
//! `complete_many`, with outputs where the server takes them; failures as
//! `fail` with the error), and a heartbeat task renewing the leases of the
//! running jobs every `lease / 3`.
//!
//! Exactly-once handlers ([`WorkerBuilder::tx_handler`]) run on connections of
//! a pool of their own (at most `concurrency`): the task opens a transaction,
//! the handler writes through it, the task runs the fenced
//! `pgque.complete(job, lease_token[, output])` in it and commits only when
//! that returned true; otherwise (lease lost, job cancelled or handed back)
//! it rolls back. A handler error rolls back and the job is failed by the
//! completer, in its own transaction.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use deadpool_postgres::{Manager, Pool};
use serde_json::Value;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_postgres::{Config, NoTls, Transaction};

use crate::error::{Error, Result};
use crate::features::Features;
use crate::{listen, Shutdown};

/// A handler's error type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// What a job handler returns: an output (stored where the server has
/// outputs) or an error (the job fails with its text and is retried by the
/// server's backoff until max_attempts).
pub type HandlerResult = std::result::Result<Option<Value>, BoxError>;
type HandlerFn = Arc<dyn Fn(Job) -> Pin<Box<dyn Future<Output = HandlerResult> + Send>> + Send + Sync>;
/// The future an exactly-once handler returns: it may borrow the transaction
/// it was given (write `Box::pin(async move { ... })`).
pub type TxFuture<'a> = Pin<Box<dyn Future<Output = HandlerResult> + Send + 'a>>;
type TxHandlerFn = Arc<dyn for<'a, 'b> Fn(Job, &'a mut Transaction<'b>) -> TxFuture<'a> + Send + Sync>;

#[derive(Clone)]
enum Handler {
    Plain(HandlerFn),
    Tx(TxHandlerFn),
}

const DISPATCH: &str = "SELECT job_id, queue, kind, args, priority, attempt, max_attempts, actor, lease_token \
     FROM pgque.dispatch($1::text[], $2::int4, $3::text, make_interval(secs => $4::float8))";
/// DISPATCH with the jobs' headers, on a server that has them.
const DISPATCH_HEADERS: &str =
    "SELECT job_id, queue, kind, args, priority, attempt, max_attempts, actor, lease_token, \
     headers FROM pgque.dispatch($1::text[], $2::int4, $3::text, make_interval(secs => $4::float8))";
const HEARTBEAT: &str = "SELECT job_id FROM pgque.heartbeat($1::int8[], $2::int8[], make_interval(secs => $3::float8))";

/// How long a dispatch waits for half the handler slots to free up.
const REFILL_WAIT: Duration = Duration::from_millis(20);

struct Shared {
    pool: Pool,
    /// The connections of exactly-once handlers (None: the worker has none).
    tx_pool: Option<Pool>,
    features: Features,
    stats: Arc<Stats>,
}

#[derive(Default)]
struct Flags {
    lost: AtomicBool,
    handed_back: AtomicBool,
}

/// A dispatched job, as a handler gets it.
pub struct Job {
    pub id: i64,
    pub queue: String,
    pub kind: String,
    /// The job's args, decoded JSON.
    pub args: Value,
    pub priority: i16,
    pub attempt: i32,
    pub max_attempts: i32,
    pub actor: Option<String>,
    pub lease_token: i64,
    /// What the producer attached (W3C `traceparent` / `tracestate`); None:
    /// nothing, or a server without job headers.
    pub headers: Option<Value>,
    shared: Arc<Shared>,
    flags: Arc<Flags>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.id)
            .field("queue", &self.queue)
            .field("kind", &self.kind)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// True once a heartbeat left this job out (cancelled, or its lease was
    /// lost): its completion will be refused, a long handler should return.
    pub fn is_cancelled(&self) -> bool {
        self.flags.lost.load(Ordering::Relaxed)
    }

    /// Reports progress (`pgque.set_progress`); false when refused (cancelled
    /// or stale). [`Error::ServerFeatureMissing`] on servers without it.
    pub async fn progress(&self, value: &Value) -> Result<bool> {
        if !self.shared.features.progress {
            return Err(Error::ServerFeatureMissing("set_progress"));
        }
        let c = self.shared.pool.get().await?;
        let row = c
            .query_one(
                "SELECT pgque.set_progress($1::int8, $2::int8, $3::jsonb)",
                &[&self.id, &self.lease_token, value],
            )
            .await?;
        Ok(row.get::<_, Option<bool>>(0).unwrap_or(false))
    }
}

/// Counters of a worker run.
#[derive(Debug, Default)]
pub struct Stats {
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub handed_back: AtomicU64,
    /// Exactly-once handlers whose completion the server refused (lease
    /// lost, job cancelled or handed back): their transactions were rolled back.
    pub lost: AtomicU64,
}

/// Builds a [`Worker`]: queues, handlers per kind, and the knobs.
pub struct WorkerBuilder {
    config: Config,
    queues: Vec<String>,
    concurrency: usize,
    batch_size: Option<usize>,
    lease: Duration,
    heartbeat_interval: Option<Duration>,
    poll_interval: Duration,
    shutdown_timeout: Duration,
    worker_id: Option<String>,
    handlers: HashMap<String, Handler>,
}

impl WorkerBuilder {
    /// Registers the async handler of a job kind.
    pub fn handler<F, Fut>(mut self, kind: impl Into<String>, f: F) -> Self
    where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.handlers
            .insert(kind.into(), Handler::Plain(Arc::new(move |job| Box::pin(f(job)))));
        self
    }
    /// Registers an exactly-once handler of a job kind: it gets the job and
    /// a transaction (on a connection of the worker's) to write its effects
    /// through; the worker completes the job in that same transaction, so the
    /// effects and the completion commit together or not at all.
    ///
    /// - `Ok(output)`: the worker runs `pgque.complete(job, lease_token,
    ///   output)` in the transaction and commits if the server accepted it.
    ///   If it refused (false: the lease was lost and the job went to another
    ///   worker, or it was cancelled or handed back at shutdown), the
    ///   transaction is rolled back, the effects vanish, and
    ///   [`Stats::lost`] counts it.
    /// - `Err(e)` or a panic: rolled back; the job is failed (and retried)
    ///   in a separate transaction.
    ///
    /// Effects outside this database (an e-mail, an HTTP call) are not
    /// covered: they happen at least once.
    ///
    /// ```no_run
    /// use pgque_client::{Job, Shutdown, Worker};
    /// use serde_json::json;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = Worker::builder("host=/tmp dbname=app", ["invoices"])?
    ///     .tx_handler("issue", |job: Job, tx| {
    ///         Box::pin(async move {
    ///             let n = tx
    ///                 .execute("INSERT INTO invoices (job_id, body) VALUES ($1, $2)", &[&job.id, &job.args])
    ///                 .await?;
    ///             Ok(Some(json!({ "rows": n })))
    ///         })
    ///     })
    ///     .build()?;
    /// worker.run(Shutdown::on_signals()).await?;
    /// # Ok(()) }
    /// ```
    pub fn tx_handler<F>(mut self, kind: impl Into<String>, f: F) -> Self
    where
        F: for<'a, 'b> Fn(Job, &'a mut Transaction<'b>) -> TxFuture<'a> + Send + Sync + 'static,
    {
        self.handlers.insert(kind.into(), Handler::Tx(Arc::new(f)));
        self
    }
    /// Handler tasks at once (default 10).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }
    /// Cap of one dispatch (default: concurrency; never more than the free slots).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = Some(n.max(1));
        self
    }
    /// The lease asked of dispatch and renewed by heartbeats (default 60 s).
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }
    /// Heartbeat period (default lease / 3).
    pub fn heartbeat_interval(mut self, d: Duration) -> Self {
        self.heartbeat_interval = Some(d);
        self
    }
    /// Poll when no NOTIFY comes (default 2 s).
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }
    /// How long a shutdown waits for running handlers before handing their
    /// jobs back (`snooze` to now: the attempt is not counted). Default 30 s.
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }
    /// The worker name recorded on dispatched jobs.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }
    /// The worker (no connection is made before [`Worker::run`]).
    pub fn build(self) -> Result<Worker> {
        let pool = Pool::builder(Manager::new(self.config.clone(), NoTls))
            .max_size(4)
            .build()
            .map_err(|e| Error::Invalid(format!("pool: {e}")))?;
        let worker_id = self.worker_id.clone().unwrap_or_else(|| {
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            format!("rust-{}-{nanos:x}", std::process::id())
        });
        Ok(Worker {
            b: self,
            pool,
            worker_id,
            stats: Arc::new(Stats::default()),
        })
    }
}

/// A job worker; see the crate docs for an example.
pub struct Worker {
    b: WorkerBuilder,
    pool: Pool,
    worker_id: String,
    stats: Arc<Stats>,
}

struct Outcome {
    id: i64,
    token: i64,
    result: std::result::Result<Option<Value>, String>,
    flags: Arc<Flags>,
}

enum Msg {
    Done(Outcome),
    Stop,
}

type Running = Arc<Mutex<HashMap<i64, (i64, Arc<Flags>)>>>;

impl Worker {
    /// A builder for a worker on `dsn` (a libpq connection string) serving `queues`.
    pub fn builder<I, S>(dsn: &str, queues: I) -> Result<WorkerBuilder>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let config: Config = dsn
            .parse()
            .map_err(|e: tokio_postgres::Error| Error::Invalid(format!("dsn: {e}")))?;
        let queues: Vec<String> = queues.into_iter().map(Into::into).collect();
        if queues.is_empty() {
            return Err(Error::Invalid("queues must not be empty".into()));
        }
        Ok(WorkerBuilder {
            config,
            queues,
            concurrency: 10,
            batch_size: None,
            lease: Duration::from_secs(60),
            heartbeat_interval: None,
            poll_interval: Duration::from_secs(2),
            shutdown_timeout: Duration::from_secs(30),
            worker_id: None,
            handlers: HashMap::new(),
        })
    }

    /// This worker's counters (live while it runs).
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The name recorded on the jobs it dispatches.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Dispatches and runs jobs until `shutdown` triggers, then drains: no new
    /// dispatch, running handlers get `shutdown_timeout` to finish, the rest
    /// are handed back, and every finished job's outcome is sent first.
    pub async fn run(&self, shutdown: Shutdown) -> Result<()> {
        let b = &self.b;
        let mut client = self.pool.get().await?;
        let features = Features::read(&client).await?;
        let tx_pool = if b.handlers.values().any(|h| matches!(h, Handler::Tx(_))) {
            Some(
                Pool::builder(Manager::new(b.config.clone(), NoTls))
                    .max_size(b.concurrency)
                    .build()
                    .map_err(|e| Error::Invalid(format!("pool: {e}")))?,
            )
        } else {
            None
        };
        let shared = Arc::new(Shared {
            pool: self.pool.clone(),
            tx_pool,
            features,
            stats: self.stats.clone(),
        });
        let channels = self.channels(&client, &shared.features).await?;
        let (gen_tx, mut gen_rx) = watch::channel(0u64);
        let stop_listen = Shutdown::new();
        let listener = listen::spawn(b.config.clone(), channels, gen_tx, stop_listen.clone()).await;
        let sem = Arc::new(Semaphore::new(b.concurrency));
        let running: Running = Arc::new(Mutex::new(HashMap::new()));
        let (done_tx, done_rx) = mpsc::unbounded_channel::<Msg>();
        let completer = tokio::spawn(complete_loop(shared.clone(), done_rx, self.stats.clone()));
        let drained = Shutdown::new();
        let lease = b.lease.as_secs_f64();
        let hb_every = b
            .heartbeat_interval
            .unwrap_or(b.lease / 3)
            .max(Duration::from_millis(10));
        let beater = tokio::spawn(heartbeat_loop(
            shared.clone(),
            running.clone(),
            hb_every,
            lease,
            drained.clone(),
        ));
        let batch = b.batch_size.unwrap_or(b.concurrency);
        let dispatch_sql = if features.headers { DISPATCH_HEADERS } else { DISPATCH };

        let mut failure = None;
        while !shutdown.is_triggered() {
            gen_rx.borrow_and_update();
            let free = sem.available_permits();
            if free == 0 {
                tokio::select! {
                    p = sem.clone().acquire_owned() => drop(p),
                    _ = shutdown.wait() => break,
                }
                continue;
            }
            let low = (batch.min(b.concurrency) / 2).max(1);
            let free = if free < low {
                // Refill in batches: give the running handlers a moment to
                // free half the slots, so short jobs are not dispatched one by
                // one (a round trip each); a slow handler delays a refill by
                // at most REFILL_WAIT.
                let want = u32::try_from(low).unwrap_or(u32::MAX);
                let _ = tokio::time::timeout(REFILL_WAIT, sem.acquire_many(want)).await;
                sem.available_permits()
            } else {
                free
            };
            if free == 0 {
                continue;
            }
            let want = free.min(batch);
            let rows = match client
                .query(dispatch_sql, &[&b.queues, &(want as i32), &self.worker_id, &lease])
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    let err = Error::Db(e);
                    if err.kind() != crate::ErrorKind::Other {
                        failure = Some(err); // a refused call (unknown queue...): not transient
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    match self.pool.get().await {
                        Ok(c) => client = c,
                        Err(e) => {
                            failure = Some(e.into());
                            break;
                        }
                    }
                    continue;
                }
            };
            let got = rows.len();
            for r in rows {
                let permit = sem.clone().try_acquire_owned().expect("a free slot per dispatched job");
                let flags = Arc::new(Flags::default());
                let job = Job {
                    id: r.get(0),
                    queue: r.get(1),
                    kind: r.get(2),
                    args: r.get(3),
                    priority: r.get(4),
                    attempt: r.get(5),
                    max_attempts: r.get(6),
                    actor: r.get(7),
                    lease_token: r.get(8),
                    headers: if features.headers { r.get(9) } else { None },
                    shared: shared.clone(),
                    flags: flags.clone(),
                };
                running.lock().unwrap().insert(job.id, (job.lease_token, flags));
                let handler = b.handlers.get(&job.kind).cloned();
                let tx = done_tx.clone();
                let running = running.clone();
                let shared = shared.clone();
                tokio::spawn(async move {
                    let (id, token, flags) = (job.id, job.lease_token, job.flags.clone());
                    #[cfg(feature = "otel")]
                    let cx =
                        crate::otel::start_process(&job.queue, job.id, &job.kind, job.attempt, job.headers.as_ref());
                    // The handler's future runs in the process span's context.
                    #[cfg(feature = "otel")]
                    fn traced<F>(f: F, cx: &opentelemetry::Context) -> opentelemetry::context::WithContext<F> {
                        opentelemetry::context::FutureExt::with_context(f, cx.clone())
                    }
                    #[cfg(not(feature = "otel"))]
                    fn traced<F>(f: F, _: &()) -> F {
                        f
                    }
                    #[cfg(not(feature = "otel"))]
                    let cx = ();
                    // None: an exactly-once handler's outcome is settled already.
                    let result = match handler {
                        None => Some(Err(format!("no handler for job kind {:?}", job.kind))),
                        Some(Handler::Plain(h)) => Some(match tokio::spawn(traced(h(job), &cx)).await {
                            Ok(Ok(out)) => Ok(out),
                            Ok(Err(e)) => Err(error_text(&*e)),
                            Err(join) => Err(format!("handler panicked: {join}")),
                        }),
                        Some(Handler::Tx(h)) => {
                            match tokio::spawn(traced(run_in_transaction(shared, h, job), &cx)).await {
                                Ok(Ok(())) => None,
                                Ok(Err(e)) => Some(Err(e)),
                                Err(join) => Some(Err(format!("handler panicked: {join}"))),
                            }
                        }
                    };
                    #[cfg(feature = "otel")]
                    crate::otel::end(&cx, result.as_ref().and_then(|r| r.as_ref().err()).map(String::as_str));
                    if let Some(result) = result {
                        let _ = tx.send(Msg::Done(Outcome {
                            id,
                            token,
                            result,
                            flags,
                        }));
                    }
                    running.lock().unwrap().remove(&id);
                    drop(permit);
                });
            }
            if got < want {
                tokio::select! {
                    _ = gen_rx.changed() => {}
                    _ = tokio::time::sleep(b.poll_interval) => {}
                    _ = shutdown.wait() => {}
                }
            }
        }

        // Drain: wait for the running handlers, then hand back the rest.
        let all = u32::try_from(b.concurrency).unwrap_or(u32::MAX);
        if tokio::time::timeout(b.shutdown_timeout, sem.acquire_many(all))
            .await
            .is_err()
        {
            let left: Vec<(i64, i64, Arc<Flags>)> = running
                .lock()
                .unwrap()
                .iter()
                .map(|(id, (t, f))| (*id, *t, f.clone()))
                .collect();
            for (id, token, flags) in left {
                flags.handed_back.store(true, Ordering::Relaxed);
                if client
                    .execute("SELECT pgque.snooze($1::int8, $2::int8, now())", &[&id, &token])
                    .await
                    .is_ok()
                {
                    self.stats.handed_back.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        drained.trigger();
        let _ = done_tx.send(Msg::Stop);
        let _ = completer.await;
        let _ = beater.await;
        stop_listen.trigger();
        let _ = listener.await;
        failure.map_or(Ok(()), Err)
    }

    async fn channels(&self, client: &tokio_postgres::Client, f: &Features) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for q in &self.b.queues {
            if f.job_channel {
                out.push(
                    client
                        .query_one("SELECT pgque.job_channel($1::text)", &[q])
                        .await?
                        .get(0),
                );
            } else {
                out.push(format!("pgque_jobs_{q}"));
            }
        }
        Ok(out)
    }
}

/// Runs an exactly-once handler: BEGIN, the handler, the fenced complete,
/// COMMIT (or ROLLBACK when the server refused the completion). Ok(()) when
/// settled (committed, or refused and rolled back); Err(text) when the job
/// must be failed: the handler's error, or an error of the completion or the
/// commit (the fail is fenced by the same token, so it changes nothing if
/// the commit did happen before the connection broke).
async fn run_in_transaction(shared: Arc<Shared>, h: TxHandlerFn, job: Job) -> std::result::Result<(), String> {
    let pool = shared
        .tx_pool
        .as_ref()
        .expect("a transaction pool with exactly-once handlers");
    let mut obj = pool
        .get()
        .await
        .map_err(|e| format!("no connection for the job's transaction: {e}"))?;
    let client: &mut tokio_postgres::Client = &mut obj;
    let mut tx = client
        .transaction()
        .await
        .map_err(|e| format!("BEGIN failed: {}", error_text(&e)))?;
    let (id, token, flags) = (job.id, job.lease_token, job.flags.clone());
    let output = match h(job, &mut tx).await {
        Ok(out) => out,
        Err(e) => {
            let text = error_text(&*e);
            let _ = tx.rollback().await;
            return Err(text);
        }
    };
    let done = if shared.features.outputs {
        tx.query_one(
            "SELECT pgque.complete($1::int8, $2::int8, $3::jsonb)",
            &[&id, &token, &output],
        )
        .await
    } else {
        tx.query_one("SELECT pgque.complete($1::int8, $2::int8)", &[&id, &token])
            .await
    };
    let accepted = match done {
        Ok(row) => row.get::<_, Option<bool>>(0).unwrap_or(false),
        Err(e) => return Err(format!("complete failed: {}", error_text(&e))),
    };
    if !accepted {
        let _ = tx.rollback().await;
        shared.stats.lost.fetch_add(1, Ordering::Relaxed);
        let why = if flags.handed_back.load(Ordering::Relaxed) {
            "handed back at shutdown"
        } else {
            "its lease was lost or it was cancelled"
        };
        eprintln!("pgque worker: job {id} not completed ({why}); its transaction was rolled back");
        return Ok(());
    }
    tx.commit()
        .await
        .map_err(|e| format!("COMMIT failed: {}", error_text(&e)))?;
    shared.stats.completed.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// An error and its chain of sources, one per line (Rust's stand-in for a traceback).
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!("\ncaused by: {c}"));
        cur = c.source();
    }
    s.push_str(&format!("\n{e:?}"));
    s
}

async fn complete_loop(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Msg>, stats: Arc<Stats>) {
    let mut stop = false;
    while !stop {
        let mut batch = Vec::new();
        match rx.recv().await {
            Some(Msg::Done(o)) => batch.push(o),
            Some(Msg::Stop) | None => stop = true,
        }
        while batch.len() < 1000 {
            match rx.try_recv() {
                Ok(Msg::Done(o)) => batch.push(o),
                Ok(Msg::Stop) => stop = true,
                Err(_) => break,
            }
        }
        batch.retain(|o| !o.flags.handed_back.load(Ordering::Relaxed));
        if batch.is_empty() {
            continue;
        }
        if let Err(e) = send_outcomes(&shared, &batch, &stats).await {
            // Unreported jobs keep their leases until they expire and the
            // server's rescue hands them out again: at least once, never lost.
            eprintln!("pgque worker: could not report {} job outcomes: {e}", batch.len());
        }
    }
}

async fn send_outcomes(shared: &Shared, batch: &[Outcome], stats: &Stats) -> Result<()> {
    let c = shared.pool.get().await?;
    let oks: Vec<&Outcome> = batch.iter().filter(|o| o.result.is_ok()).collect();
    if !oks.is_empty() {
        let ids: Vec<i64> = oks.iter().map(|o| o.id).collect();
        let tokens: Vec<i64> = oks.iter().map(|o| o.token).collect();
        let outputs: Vec<Option<Value>> = oks.iter().map(|o| o.result.as_ref().ok().cloned().flatten()).collect();
        if shared.features.outputs && outputs.iter().any(Option::is_some) {
            c.execute(
                "SELECT pgque.complete_many($1::int8[], $2::int8[], $3::jsonb[])",
                &[&ids, &tokens, &outputs],
            )
            .await?;
        } else {
            c.execute("SELECT pgque.complete_many($1::int8[], $2::int8[])", &[&ids, &tokens])
                .await?;
        }
        stats.completed.fetch_add(oks.len() as u64, Ordering::Relaxed);
    }
    for o in batch {
        if let Err(err) = &o.result {
            c.execute(
                "SELECT pgque.fail($1::int8, $2::int8, $3::text)",
                &[&o.id, &o.token, err],
            )
            .await?;
            stats.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

async fn heartbeat_loop(shared: Arc<Shared>, running: Running, every: Duration, lease: f64, drained: Shutdown) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = drained.wait() => return,
        }
        let jobs: Vec<(i64, i64, Arc<Flags>)> = running
            .lock()
            .unwrap()
            .iter()
            .map(|(id, (t, f))| (*id, *t, f.clone()))
            .collect();
        if jobs.is_empty() {
            continue;
        }
        let ids: Vec<i64> = jobs.iter().map(|j| j.0).collect();
        let tokens: Vec<i64> = jobs.iter().map(|j| j.1).collect();
        let Ok(c) = shared.pool.get().await else { continue };
        let Ok(rows) = c.query(HEARTBEAT, &[&ids, &tokens, &lease]).await else {
            continue;
        };
        let alive: std::collections::HashSet<i64> = rows.iter().map(|r| r.get(0)).collect();
        let still = running.lock().unwrap();
        for (id, _, flags) in &jobs {
            if !alive.contains(id) && still.contains_key(id) {
                flags.lost.store(true, Ordering::Relaxed);
            }
        }
    }
}
