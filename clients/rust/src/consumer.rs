//! Event consumers: [`Consumer`] (receive / ack / nack; on a server with the
//! waiting receive it waits for its batch inside the server, on an older one
//! it is woken by the queue's tick NOTIFY) and [`PartitionedConsumer`], whose
//! M tasks cover N slots with the `claim_next_slot` loop so every slot is
//! polled.
//!
//! At least once: a batch is acked after its handler calls returned; a batch
//! cut short (a crash, a lost slot lease) is delivered again. A handler error
//! nacks its event; the nacks and the ack of a batch commit together.
//!
//! Exactly-once handlers ([`Consumer::new_tx`], [`PartitionedConsumer::new_tx`])
//! get the transaction that acks the batch (a savepoint of it per event): the
//! batch's effects, nacks and ack commit together or not at all. A handler
//! error takes back only its own event's effects (its savepoint) and nacks
//! it. For a partitioned consumer the ack is fenced by the slot lease: a task
//! that lost its slot gets 55000 from `ack_partitioned` (or notices at a
//! renewal, made on a second connection so it takes effect at once), and the
//! batch's effects roll back; the new owner gets the same batch.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::{Manager, Object, Pool};
use serde_json::Value;
use tokio::sync::watch;
use tokio_postgres::{Client, Config, NoTls, Row, Transaction};

use crate::error::{Error, ErrorKind, Result};
use crate::features::Features;
use crate::worker::BoxError;
use crate::{listen, Shutdown};

/// One event, with PgQue's `pgque.message` fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub msg_id: i64,
    pub batch_id: i64,
    /// The event type (PgQue's `type`).
    pub type_name: String,
    pub payload: Option<String>,
    /// None on first delivery.
    pub retry_count: Option<i32>,
    pub created_at: SystemTime,
    /// The partition key rides extra1.
    pub extra1: Option<String>,
    pub extra2: Option<String>,
    pub extra3: Option<String>,
    pub extra4: Option<String>,
    /// The event's headers (W3C trace context): read only with the `otel`
    /// feature on a server with event headers (pgque 0.8); None otherwise.
    pub headers: Option<Value>,
}

impl Message {
    fn from_row(r: &Row) -> Message {
        Message {
            msg_id: r.get(0),
            batch_id: r.get(1),
            type_name: r.get(2),
            payload: r.get(3),
            retry_count: r.get(4),
            created_at: r.get(5),
            extra1: r.get(6),
            extra2: r.get(7),
            extra3: r.get(8),
            extra4: r.get(9),
            // the column of the *_with_headers receives
            headers: if r.len() > 10 { r.get(10) } else { None },
        }
    }
    /// The partition key (extra1).
    pub fn partition_key(&self) -> Option<&str> {
        self.extra1.as_deref()
    }
    /// The payload decoded as JSON (Null for a NULL payload).
    pub fn json(&self) -> std::result::Result<Value, serde_json::Error> {
        self.payload.as_deref().map_or(Ok(Value::Null), serde_json::from_str)
    }
}

type MsgHandler =
    Arc<dyn Fn(Message) -> Pin<Box<dyn Future<Output = std::result::Result<(), BoxError>> + Send>> + Send + Sync>;
/// The future an exactly-once message handler returns: it may borrow the
/// transaction it was given (write `Box::pin(async move { ... })`).
pub type TxMsgFuture<'a> = Pin<Box<dyn Future<Output = std::result::Result<(), BoxError>> + Send + 'a>>;
type TxMsgHandler = Arc<dyn for<'a, 'b> Fn(Message, &'a mut Transaction<'b>) -> TxMsgFuture<'a> + Send + Sync>;

#[derive(Clone)]
enum Handler {
    Plain(MsgHandler),
    Tx(TxMsgHandler),
}

impl Handler {
    fn is_tx(&self) -> bool {
        matches!(self, Handler::Tx(_))
    }
}

/// Runs the handler for one event, with the `otel` feature in a `process
/// <queue>` span (docs/tracing.md) that an error marks. Plain: on its own.
/// Exactly-once: in a savepoint of `tx`, released on success, rolled back on
/// an error. Returns the handler's error text (the event is then nacked).
async fn handle_one(
    h: &Handler,
    m: &Message,
    tx: Option<&mut Transaction<'_>>,
    batch: &BatchCx,
    queue: &str,
    consumer: &str,
) -> Result<Option<String>> {
    #[cfg(feature = "otel")]
    {
        let _ = batch;
        let cx = crate::otel::start_event(
            queue,
            consumer,
            m.msg_id,
            &m.type_name,
            m.retry_count,
            m.headers.as_ref(),
        );
        let r = opentelemetry::context::FutureExt::with_context(call_handler(h, m, tx), cx.clone()).await;
        let err = match &r {
            Ok(Some(why)) => Some(why.clone()),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        };
        crate::otel::end(&cx, err.as_deref());
        r
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (batch, queue, consumer);
        call_handler(h, m, tx).await
    }
}

/// What a batch gives its handler calls. The batch span (a `receive
/// <queue>` span around a batch's receive, handler calls, nacks and ack)
/// is not done yet (docs/tracing.md, "Not done"): a batch's body runs as is.
type BatchCx = ();

async fn in_batch<T, F, Fut>(_: &str, _: &str, _: &[Message], _: SystemTime, body: F) -> Result<T>
where
    F: FnOnce(BatchCx) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    body(()).await
}

async fn call_handler(h: &Handler, m: &Message, tx: Option<&mut Transaction<'_>>) -> Result<Option<String>> {
    match (h, tx) {
        (Handler::Plain(f), _) => Ok(f(m.clone()).await.err().map(|e| e.to_string())),
        (Handler::Tx(f), Some(tx)) => {
            let mut sp = tx.transaction().await?;
            match f(m.clone(), &mut sp).await {
                Ok(()) => {
                    sp.commit().await?;
                    Ok(None)
                }
                Err(e) => {
                    sp.rollback().await?;
                    Ok(Some(e.to_string()))
                }
            }
        }
        (Handler::Tx(_), None) => Err(Error::Invalid("an exactly-once handler needs a transaction".into())),
    }
}

const COLS: &str = "msg_id, batch_id, type, payload, retry_count, created_at, extra1, extra2, extra3, extra4";

/// One batch from `pgque.<func>(<args>)`. With the `otel` feature from its
/// `_with_headers` twin, which adds the events' headers (pgque 0.8); a
/// server without it (42883) is remembered in `server_headers` and read with
/// `func` itself from then on.
async fn receive(
    c: &Client,
    server_headers: &std::sync::atomic::AtomicBool,
    func: &str,
    args: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
    if cfg!(feature = "otel") && server_headers.load(Ordering::Relaxed) {
        match c
            .query(
                &format!("SELECT {COLS}, headers FROM pgque.{func}_with_headers({args})"),
                params,
            )
            .await
        {
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_FUNCTION) => {
                server_headers.store(false, Ordering::Relaxed);
            }
            r => return r,
        }
    }
    c.query(&format!("SELECT {COLS} FROM pgque.{func}({args})"), params)
        .await
}
const MSG_ROW: &str = "ROW($1::int8, $2::int8, $3::text, $4::text, $5::int4, $6::timestamptz, \
                       $7::text, $8::text, $9::text, $10::text)::pgque.message";

async fn nack_in(
    tx: &deadpool_postgres::Transaction<'_>,
    sql: &str,
    m: &Message,
    extra: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<()> {
    let mut p: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
        &m.msg_id,
        &m.batch_id,
        &m.type_name,
        &m.payload,
        &m.retry_count,
        &m.created_at,
        &m.extra1,
        &m.extra2,
        &m.extra3,
        &m.extra4,
    ];
    p.extend_from_slice(extra);
    tx.execute(sql, &p).await?;
    Ok(())
}

fn pool_for(config: &Config, size: usize) -> Result<Pool> {
    Pool::builder(Manager::new(config.clone(), NoTls))
        .max_size(size)
        .build()
        .map_err(|e| Error::Invalid(format!("pool: {e}")))
}

fn parse(dsn: &str) -> Result<Config> {
    dsn.parse()
        .map_err(|e: tokio_postgres::Error| Error::Invalid(format!("dsn: {e}")))
}

fn wrap<F, Fut>(f: F) -> MsgHandler
where
    F: Fn(Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
{
    Arc::new(move |m| Box::pin(f(m)))
}

async fn wait_tick(rx: &mut watch::Receiver<u64>, poll: Duration, shutdown: &Shutdown) {
    tokio::select! {
        _ = rx.changed() => {}
        _ = tokio::time::sleep(poll) => {}
        _ = shutdown.wait() => {}
    }
}

/// What a waiting receive ended with.
enum Waited {
    Rows(Vec<Row>),
    /// The shutdown came first, or cancelled the wait.
    Stopped,
}

/// Counters of a consumer (live while it runs).
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Events whose handler returned (ok or error).
    pub handled: AtomicU64,
    /// Slots given up because another worker took the lease over.
    pub lost_slots: AtomicU64,
}

/// Reads `queue` as `consumer`, one handler call per event.
pub struct Consumer {
    config: Config,
    queue: String,
    consumer: String,
    handler: Handler,
    batch_size: i32,
    poll_interval: Duration,
    retry_after: Duration,
    stats: Arc<ConsumerStats>,
    /// False once the server turned out to lack receive_with_headers.
    server_headers: std::sync::atomic::AtomicBool,
    /// A cooperative consumer's member name ([`Consumer::cooperative`]).
    subconsumer: Option<String>,
    dead_interval: Option<Duration>,
    /// The wait of one waiting receive ([`Consumer::wait`]); zero: LISTEN.
    wait: Duration,
    /// True while `run` waits inside the server.
    server_waits: AtomicBool,
}

/// An empty waiting receive quicker than this did not sleep in the server.
const AT_ONCE: Duration = Duration::from_millis(20);

impl Consumer {
    /// A consumer (subscribed on `run` if it is not yet).
    pub fn new<F, Fut>(dsn: &str, queue: &str, consumer: &str, handler: F) -> Result<Consumer>
    where
        F: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        Self::with(dsn, queue, consumer, Handler::Plain(wrap(handler)))
    }

    /// A consumer with an exactly-once handler: it gets each event and the
    /// transaction that acks its batch (a savepoint of it), so the batch's
    /// effects and its ack commit together. An error rolls back that event's
    /// effects only and nacks it.
    ///
    /// ```no_run
    /// use pgque_client::{Consumer, Message, Shutdown};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let consumer = Consumer::new_tx("host=/tmp dbname=app", "orders", "billing", |m: Message, tx| {
    ///     Box::pin(async move {
    ///         tx.execute("INSERT INTO billed (msg_id, body) VALUES ($1, $2)", &[&m.msg_id, &m.payload])
    ///             .await?;
    ///         Ok(())
    ///     })
    /// })?;
    /// consumer.run(Shutdown::on_signals()).await?;
    /// # Ok(()) }
    /// ```
    pub fn new_tx<F>(dsn: &str, queue: &str, consumer: &str, handler: F) -> Result<Consumer>
    where
        F: for<'a, 'b> Fn(Message, &'a mut Transaction<'b>) -> TxMsgFuture<'a> + Send + Sync + 'static,
    {
        Self::with(dsn, queue, consumer, Handler::Tx(Arc::new(handler)))
    }

    fn with(dsn: &str, queue: &str, consumer: &str, handler: Handler) -> Result<Consumer> {
        Ok(Consumer {
            config: parse(dsn)?,
            queue: queue.into(),
            consumer: consumer.into(),
            handler,
            batch_size: 100,
            poll_interval: Duration::from_secs(2),
            retry_after: Duration::from_secs(60),
            stats: Arc::default(),
            server_headers: true.into(),
            subconsumer: None,
            dead_interval: None,
            wait: Duration::from_secs(5),
            server_waits: AtomicBool::new(false),
        })
    }
    /// Events per receive (default 100).
    pub fn batch_size(mut self, n: i32) -> Self {
        self.batch_size = n.max(1);
        self
    }
    /// Makes this a member `subconsumer` of the cooperative consumer
    /// `consumer` (PgQ's cooperative consumers, `pgque.receive_coop`): the
    /// members share the consumer's stream, each batch goes to one member.
    /// `run` registers the member (`register_subconsumer`); the consumer
    /// must be cooperative or new (a normal consumer is not converted:
    /// 55000). With the `otel` feature it receives through
    /// `receive_coop_with_headers`.
    ///
    /// ```no_run
    /// use pgque_client::{Consumer, Message, Shutdown};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let member = Consumer::new("host=/tmp dbname=app", "orders", "billing", |m: Message| async move {
    ///     println!("{} {:?}", m.msg_id, m.payload);
    ///     Ok(())
    /// })?
    /// .cooperative("billing-1");
    /// member.run(Shutdown::on_signals()).await?;
    /// # Ok(()) }
    /// ```
    pub fn cooperative(mut self, subconsumer: impl Into<String>) -> Self {
        self.subconsumer = Some(subconsumer.into());
        self
    }
    /// A cooperative member also takes over the open batch of a member idle
    /// longer than `d` (`receive_coop`'s dead_interval; default: never).
    pub fn dead_interval(mut self, d: Duration) -> Self {
        self.dead_interval = Some(d);
        self
    }
    /// Poll when no tick NOTIFY comes (default 2 s).
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }
    /// How long one waiting receive waits inside the server for a batch
    /// (default 5 s; the server caps it at `pgque.max_wait`, and `run` at
    /// half the session's `statement_timeout`). On a server with the waiting
    /// receive (pgque 0.9, docs/waits.md) `run` loops on it instead of
    /// LISTEN + poll: an event arrives within a few milliseconds and no
    /// LISTEN connection is held (it works through transaction-mode
    /// poolers). `Duration::ZERO` keeps LISTEN + poll, which is also what an
    /// older server, a cooperative member (no waiting `receive_coop` yet)
    /// and a server that does not sleep (`pgque.max_wait = 0`, a REPEATABLE
    /// READ default isolation) get.
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }
    /// Redelivery delay of a failed event (default 60 s).
    pub fn retry_after(mut self, d: Duration) -> Self {
        self.retry_after = d;
        self
    }
    /// The counters.
    pub fn stats(&self) -> &Arc<ConsumerStats> {
        &self.stats
    }
    /// True while `run` waits for its batches inside the server (the
    /// waiting receive), false while it LISTENs and polls (once `run`
    /// returned: what its last run did).
    pub fn server_waits(&self) -> bool {
        self.server_waits.load(Ordering::Relaxed)
    }

    /// Consumes until `shutdown`; the batch in hand is finished and acked
    /// first. A waiting receive in flight is cancelled (the server's cancel
    /// request), so `run` returns at once.
    pub async fn run(&self, shutdown: Shutdown) -> Result<()> {
        let pool = pool_for(&self.config, 1)?;
        let mut c = pool.get().await?;
        match &self.subconsumer {
            None => {
                c.execute(
                    "SELECT pgque.subscribe($1::text, $2::text)",
                    &[&self.queue, &self.consumer],
                )
                .await?
            }
            Some(sub) => {
                c.execute(
                    "SELECT pgque.register_subconsumer($1::text, $2::text, $3::text)",
                    &[&self.queue, &self.consumer, sub],
                )
                .await?
            }
        };
        let features = Features::read(&c).await?;
        let mut wait = self.server_wait(&c, &features).await?;
        self.server_waits.store(wait.is_some(), Ordering::Relaxed);
        let (gen_tx, mut gen_rx) = watch::channel(0u64);
        let stop = Shutdown::new();
        let listen = || {
            listen::spawn(
                self.config.clone(),
                vec![format!("pgque_{}", self.queue)],
                gen_tx.clone(),
                stop.clone(),
            )
        };
        let mut listener = match wait {
            None => Some(listen().await),
            Some(_) => None,
        };
        let result = async {
            while !shutdown.is_triggered() {
                if let Some(w) = wait {
                    let t0 = Instant::now();
                    let got = match self
                        .receive_waiting(&c, w, features.receive_with_headers_wait, &shutdown)
                        .await?
                    {
                        Waited::Rows(rows) => self.handle_rows(&mut c, rows, SystemTime::now()).await?,
                        Waited::Stopped => break,
                    };
                    if got == 0 && t0.elapsed() < AT_ONCE && !shutdown.is_triggered() {
                        eprintln!(
                            "pgque consumer {}: the waiting receive returned at once (pgque.max_wait = 0, or a \
                             REPEATABLE READ / SERIALIZABLE default isolation?); LISTEN and poll from now on",
                            self.consumer
                        );
                        wait = None;
                        self.server_waits.store(false, Ordering::Relaxed);
                        listener = Some(listen().await);
                    }
                    continue;
                }
                gen_rx.borrow_and_update();
                if self.run_once(&mut c).await? == 0 {
                    wait_tick(&mut gen_rx, self.poll_interval, &shutdown).await;
                }
            }
            Ok(())
        }
        .await;
        stop.trigger();
        if let Some(l) = listener {
            let _ = l.await;
        }
        result
    }

    /// The wait of `run`'s waiting receives, or None when `run` LISTENs
    /// ([`Consumer::wait`]). Half the session's statement_timeout at most,
    /// so that the timeout never cancels a wait.
    async fn server_wait(&self, c: &Client, f: &Features) -> Result<Option<Duration>> {
        if self.wait.is_zero() || self.subconsumer.is_some() || !f.receive_wait {
            return Ok(None);
        }
        let st: i64 = c
            .query_one(
                "SELECT setting::int8 FROM pg_catalog.pg_settings WHERE name = 'statement_timeout'",
                &[],
            )
            .await?
            .get(0);
        let mut w = self.wait;
        if st > 0 {
            w = w.min(Duration::from_millis(st as u64) / 2);
        }
        Ok(Some(w))
    }

    /// The waiting `receive(queue, consumer, batch_size, wait)` on `c` (an
    /// autocommit connection: a transaction that has written would not
    /// sleep). `shutdown` cancels it with the server's cancel request, sent
    /// again every 200 ms until the statement ended (a request that reaches
    /// the server before the statement is dropped there). Rows that arrive
    /// once a cancel was sent are left unhandled (`Stopped`): tokio-postgres'
    /// cancel does not wait for the server to act on it, so the request may
    /// still be on its way and would cancel the next statement (the ack); the
    /// open batch is delivered again, whole, to the consumer's next receive.
    async fn receive_waiting(&self, c: &Client, wait: Duration, headers: bool, shutdown: &Shutdown) -> Result<Waited> {
        if shutdown.is_triggered() {
            return Ok(Waited::Stopped);
        }
        let no_headers = AtomicBool::new(false);
        let secs = wait.as_secs_f64();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&self.queue, &self.consumer, &self.batch_size, &secs];
        let q = receive(
            c,
            if headers { &self.server_headers } else { &no_headers },
            "receive",
            "$1::text, $2::text, $3::int4, make_interval(secs => $4::float8)",
            &params,
        );
        tokio::pin!(q);
        let token = c.cancel_token();
        let r = tokio::select! {
            biased;
            r = &mut q => r,
            _ = shutdown.wait() => {
                loop {
                    let _ = token.cancel_query(NoTls).await;
                    tokio::select! {
                        biased;
                        _ = &mut q => break,
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
                return Ok(Waited::Stopped);
            }
        };
        Ok(Waited::Rows(r?))
    }

    async fn run_once(&self, c: &mut Object) -> Result<usize> {
        let started = SystemTime::now();
        let rows = match &self.subconsumer {
            None => {
                receive(
                    c,
                    &self.server_headers,
                    "receive",
                    "$1::text, $2::text, $3::int4",
                    &[&self.queue, &self.consumer, &self.batch_size],
                )
                .await?
            }
            Some(sub) => {
                let dead = self.dead_interval.map(|d| d.as_secs_f64());
                receive(
                    c,
                    &self.server_headers,
                    "receive_coop",
                    "$1::text, $2::text, $3::text, $4::int4, $5::float8 * interval '1 second'",
                    &[&self.queue, &self.consumer, sub, &self.batch_size, &dead],
                )
                .await?
            }
        };
        self.handle_rows(c, rows, started).await
    }

    /// Handles a received batch and acks it (with its nacks) in one
    /// transaction; returns its size.
    async fn handle_rows(&self, c: &mut Object, rows: Vec<Row>, started: SystemTime) -> Result<usize> {
        if rows.is_empty() {
            return Ok(0);
        }
        let msgs: Vec<Message> = rows.iter().map(Message::from_row).collect();
        let msgs = &msgs;
        in_batch(&self.queue, &self.consumer, msgs, started, |batch| async move {
            let mut failed = Vec::new();
            if !self.handler.is_tx() {
                for m in msgs {
                    if let Some(why) = handle_one(&self.handler, m, None, &batch, &self.queue, &self.consumer).await? {
                        failed.push((m, why));
                    }
                    self.stats.handled.fetch_add(1, Ordering::Relaxed);
                }
            }
            let retry = self.retry_after.as_secs_f64();
            let mut tx = c.transaction().await?;
            if self.handler.is_tx() {
                for m in msgs {
                    if let Some(why) =
                        handle_one(&self.handler, m, Some(&mut tx), &batch, &self.queue, &self.consumer).await?
                    {
                        failed.push((m, why));
                    }
                    self.stats.handled.fetch_add(1, Ordering::Relaxed);
                }
            }
            for (m, why) in &failed {
                let sql =
                    format!("SELECT pgque.nack($11::int8, {MSG_ROW}, make_interval(secs => $12::float8), $13::text)");
                nack_in(&tx, &sql, m, &[&m.batch_id, &retry, why]).await?;
            }
            tx.execute("SELECT pgque.ack($1::int8)", &[&msgs[0].batch_id]).await?;
            tx.commit().await?;
            Ok(msgs.len())
        })
        .await
    }
}

/// Reads `queue` as partitioned consumer `consumer` over `n` slots with
/// `workers` tasks (any ratio to n), each looping claim_next_slot ->
/// receive_partitioned -> handler -> ack_partitioned -> release_slot: the
/// slot that waited longest is served next, and no slot is left unpolled.
///
/// A task keeps a slot while its batches are non-empty (at most 16 batches),
/// renewing the lease between events once a third of the ttl has passed; a
/// lease taken over by another worker meanwhile makes it stop processing that
/// slot at once, without acking (the new owner gets the same batch).
///
/// It follows an online resize of N (docs/partition-keys.md, "Resizing N
/// online") without a restart: `n` is only the N it subscribes with (a
/// consumer resized since keeps its new N); a task whose calls are refused
/// because N changed, or that is handed a slot beyond the N it knows,
/// re-reads N from the server and goes on with the new slots ([`Self::n`]).
pub struct PartitionedConsumer {
    config: Config,
    queue: String,
    consumer: String,
    n: std::sync::atomic::AtomicI32,
    handler: Handler,
    workers: usize,
    ttl: Duration,
    batch_size: i32,
    poll_interval: Duration,
    retry_after: Duration,
    worker_id: String,
    stats: Arc<ConsumerStats>,
    policy: Option<(String, String)>,
    /// False once the server turned out to lack receive_partitioned_with_headers.
    server_headers: std::sync::atomic::AtomicBool,
}

/// Whether a fenced call was refused for the N it passed (22023 "has N'
/// slots, not N", or 22003 for a slot beyond the N): the consumer may have
/// been resized.
fn resized(e: &Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::InvalidParameterValue | ErrorKind::NumericValueOutOfRange
    ) && {
        let m = e.to_string();
        m.contains("slots, not") || m.contains("slot must be between")
    }
}

/// Whether `m` is skipped because its key failed earlier in the batch
/// (the pause policy: the server holds the key's later events back).
fn skipped(blocked: &std::collections::HashSet<String>, m: &Message) -> bool {
    m.partition_key().is_some_and(|k| blocked.contains(k))
}

impl PartitionedConsumer {
    /// A partitioned consumer with one worker task (see [`Self::workers`]).
    pub fn new<F, Fut>(dsn: &str, queue: &str, consumer: &str, n: i32, handler: F) -> Result<PartitionedConsumer>
    where
        F: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        Self::with(dsn, queue, consumer, n, Handler::Plain(wrap(handler)))
    }

    /// A partitioned consumer with an exactly-once handler (as
    /// [`Consumer::new_tx`]): a batch's effects, nacks and fenced
    /// `ack_partitioned` commit together; a task that lost its slot rolls
    /// the batch's effects back. Each task then uses two connections (the
    /// second renews the slot lease outside the batch's transaction).
    pub fn new_tx<F>(dsn: &str, queue: &str, consumer: &str, n: i32, handler: F) -> Result<PartitionedConsumer>
    where
        F: for<'a, 'b> Fn(Message, &'a mut Transaction<'b>) -> TxMsgFuture<'a> + Send + Sync + 'static,
    {
        Self::with(dsn, queue, consumer, n, Handler::Tx(Arc::new(handler)))
    }

    fn with(dsn: &str, queue: &str, consumer: &str, n: i32, handler: Handler) -> Result<PartitionedConsumer> {
        Ok(PartitionedConsumer {
            config: parse(dsn)?,
            queue: queue.into(),
            consumer: consumer.into(),
            n: std::sync::atomic::AtomicI32::new(n),
            handler,
            workers: 1,
            ttl: Duration::from_secs(30),
            batch_size: 100,
            poll_interval: Duration::from_secs(2),
            retry_after: Duration::from_secs(60),
            worker_id: format!("rust-{}", std::process::id()),
            stats: Arc::default(),
            policy: None,
            server_headers: true.into(),
        })
    }
    /// The consumer's failure policy, chosen at its first subscribe
    /// (docs/partition-keys.md, "Failure policy"): `"skip"` (the default:
    /// a failed event comes back after its key's later ones) or `"pause"`
    /// (they wait until it is acked or dead-lettered; `on_dead_letter`
    /// `"resume"` or `"block"`). With `"pause"` a task skips a key's
    /// remaining events of a batch once the handler failed on one of them.
    pub fn failure_policy(mut self, policy: &str, on_dead_letter: &str) -> Self {
        self.policy = Some((policy.into(), on_dead_letter.into()));
        self
    }
    fn pause(&self) -> bool {
        self.policy.as_ref().is_some_and(|(p, _)| p == "pause")
    }
    /// Worker tasks (M, any ratio to n).
    pub fn workers(mut self, m: usize) -> Self {
        self.workers = m.max(1);
        self
    }
    /// Slot lease ttl (at least 1 s; default 30 s).
    pub fn ttl(mut self, d: Duration) -> Self {
        self.ttl = d.max(Duration::from_secs(1));
        self
    }
    /// Events per receive (default 100).
    pub fn batch_size(mut self, n: i32) -> Self {
        self.batch_size = n.max(1);
        self
    }
    /// Poll when no tick NOTIFY comes (default 2 s).
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }
    /// Redelivery delay of a failed event (default 60 s).
    pub fn retry_after(mut self, d: Duration) -> Self {
        self.retry_after = d;
        self
    }
    /// The lease owner names are `<id>/<task number>`.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = id.into();
        self
    }
    /// The counters.
    pub fn stats(&self) -> &Arc<ConsumerStats> {
        &self.stats
    }
    /// The consumer's N as this consumer last knew it (it follows a resize).
    pub fn n(&self) -> i32 {
        self.n.load(Ordering::SeqCst)
    }

    /// Re-reads the consumer's N from the server (after a resize); returns it.
    async fn refresh_n(&self, c: &Client) -> Result<i32> {
        let row = c
            .query_opt(
                "SELECT n FROM pgque.partition_slot_status WHERE queue_name = $1 AND consumer = $2 LIMIT 1",
                &[&self.queue, &self.consumer],
            )
            .await?;
        if let Some(r) = row {
            self.n.store(r.get(0), Ordering::SeqCst);
        }
        Ok(self.n())
    }

    /// Consumes until `shutdown` (each task finishes and acks its batch first).
    pub async fn run(self: &Arc<Self>, shutdown: Shutdown) -> Result<()> {
        let per_task = if self.handler.is_tx() { 2 } else { 1 };
        let pool = pool_for(&self.config, self.workers * per_task + 1)?;
        {
            let c = pool.get().await?;
            let n = self.n();
            let subscribed = match &self.policy {
                None => {
                    c.execute(
                        "SELECT pgque.subscribe_partitioned($1::text, $2::text, $3::int4)",
                        &[&self.queue, &self.consumer, &n],
                    )
                    .await
                }
                Some((p, d)) => {
                    c.execute(
                        "SELECT pgque.subscribe_partitioned($1::text, $2::text, $3::int4, $4::text, $5::text)",
                        &[&self.queue, &self.consumer, &n, p, d],
                    )
                    .await
                }
            };
            if let Err(e) = subscribed {
                let e: Error = e.into();
                // Subscribed already with another N (resized since): follow
                // the server's.
                if e.kind() != ErrorKind::InvalidParameterValue || self.refresh_n(&c).await? == n {
                    return Err(e);
                }
            }
        }
        let (gen_tx, gen_rx) = watch::channel(0u64);
        let stop = Shutdown::new();
        let listener = listen::spawn(
            self.config.clone(),
            vec![format!("pgque_{}", self.queue)],
            gen_tx,
            stop.clone(),
        )
        .await;
        let mut tasks = Vec::new();
        for i in 0..self.workers {
            let me = self.clone();
            let pool = pool.clone();
            let sd = shutdown.clone();
            let rx = gen_rx.clone();
            tasks.push(tokio::spawn(async move { me.worker(i, pool, rx, sd).await }));
        }
        let mut result = Ok(());
        for t in tasks {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    shutdown.trigger();
                    result = Err(e);
                }
                Err(e) => result = Err(Error::Invalid(format!("worker task: {e}"))),
            }
        }
        stop.trigger();
        let _ = listener.await;
        result
    }

    async fn worker(&self, i: usize, pool: Pool, mut rx: watch::Receiver<u64>, shutdown: Shutdown) -> Result<()> {
        let wid = format!("{}/{i}", self.worker_id);
        let ttl = self.ttl.as_secs_f64();
        let mut idle = 0;
        let mut c = pool.get().await?;
        // Exactly-once: lease renewals go through a second connection, so they
        // take effect at once rather than at the batch's commit.
        let side = if self.handler.is_tx() {
            Some(pool.get().await?)
        } else {
            None
        };
        while !shutdown.is_triggered() {
            rx.borrow_and_update();
            let row = c
                .query_opt(
                    "SELECT slot, epoch FROM pgque.claim_next_slot($1::text, $2::text, $3::text, make_interval(secs => $4::float8))",
                    &[&self.queue, &self.consumer, &wid, &ttl],
                )
                .await?;
            let Some(row) = row else {
                wait_tick(&mut rx, self.poll_interval, &shutdown).await;
                continue;
            };
            let (slot, epoch): (i32, i64) = (row.get(0), row.get(1));
            if slot >= self.n() {
                // A slot of a bigger N: the consumer was resized.
                self.refresh_n(&c).await?;
            }
            // The N this claim's calls pass: another task may refresh
            // self.n() meanwhile, and a refusal is a resize only if the
            // server's N differs from the one the refused call passed.
            let n = self.n();
            match self
                .serve_slot(&mut c, side.as_deref(), &wid, slot, n, epoch, &shutdown)
                .await
            {
                Ok(got) => idle = if got > 0 { 0 } else { idle + 1 },
                Err(Error::SlotLost { .. }) => {
                    self.stats.lost_slots.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(e) if resized(&e) => {
                    // The consumer's N changed under this task: its batch
                    // (not acked) is redelivered on the keys' new slots.
                    if self.refresh_n(&c).await? == n {
                        return Err(e);
                    }
                    // Give the slot back (when no batch is open):
                    // claim_next_slot never hands a task its own lease, so a
                    // kept one would hold the slot's keys back until its ttl.
                    // An error means it is not ours any more.
                    let _ = c
                        .execute(
                            "SELECT pgque.release_slot($1::text, $2::text, $3::int4, $4::text)",
                            &[&self.queue, &self.consumer, &slot, &wid],
                        )
                        .await;
                    self.stats.lost_slots.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(e) => return Err(e),
            }
            let idle_round = (self.n() as usize).div_ceil(self.workers).max(1);
            if idle >= idle_round {
                idle = 0;
                wait_tick(&mut rx, self.poll_interval, &shutdown).await;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn serve_slot(
        &self,
        c: &mut Object,
        side: Option<&deadpool_postgres::ClientWrapper>,
        wid: &str,
        slot: i32,
        n: i32,
        mut epoch: i64,
        shutdown: &Shutdown,
    ) -> Result<usize> {
        let lost = |e: Error| {
            if e.kind() == ErrorKind::WrongState {
                Error::SlotLost { slot }
            } else {
                e
            }
        };
        let retry = self.retry_after.as_secs_f64();
        let mut total = 0;
        for _ in 0..16 {
            let started = SystemTime::now();
            if shutdown.is_triggered() {
                break;
            }
            let rows = receive(
                c,
                &self.server_headers,
                "receive_partitioned",
                "$1::text, $2::text, $3::int4, $4::int4, $5::text, $6::int4",
                &[&self.queue, &self.consumer, &slot, &n, &wid, &self.batch_size],
            )
            .await
            .map_err(|e| lost(e.into()))?;
            let mut renewed = Instant::now();
            if rows.is_empty() {
                break;
            }
            let msgs: Vec<Message> = rows.iter().map(Message::from_row).collect();
            let msgs = &msgs;
            let cc: &mut Object = &mut *c;
            epoch = in_batch(&self.queue, &self.consumer, msgs, started, |batch| async move {
                let mut failed = Vec::new();
                let mut blocked = std::collections::HashSet::new();
                let pause = self.pause();
                if !self.handler.is_tx() {
                    for m in msgs {
                        if skipped(&blocked, m) {
                            continue;
                        }
                        if renewed.elapsed() > self.ttl / 3 {
                            epoch = self.renew(cc, wid, slot, epoch).await?;
                            renewed = Instant::now();
                        }
                        if let Some(why) = handle_one(&self.handler, m, None, &batch, &self.queue, &self.consumer).await? {
                            if let (true, Some(k)) = (pause, m.partition_key()) {
                                blocked.insert(k.to_string());
                            }
                            failed.push((m, why));
                        }
                        self.stats.handled.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let mut tx = cc.transaction().await?;
                if self.handler.is_tx() {
                    let side = side.expect("a second connection with an exactly-once handler");
                    for m in msgs {
                        if skipped(&blocked, m) {
                            continue;
                        }
                        if renewed.elapsed() > self.ttl / 3 {
                            // An error returns with tx dropped: the batch rolls back.
                            epoch = self.renew(side, wid, slot, epoch).await?;
                            renewed = Instant::now();
                        }
                        if let Some(why) = handle_one(&self.handler, m, Some(&mut tx), &batch, &self.queue, &self.consumer).await? {
                            if let (true, Some(k)) = (pause, m.partition_key()) {
                                blocked.insert(k.to_string());
                            }
                            failed.push((m, why));
                        }
                        self.stats.handled.fetch_add(1, Ordering::Relaxed);
                    }
                }
                for (m, why) in &failed {
                    let sql = format!(
                        "SELECT pgque.nack_partitioned($11::text, $12::text, $13::int4, $14::int4, $15::text, {MSG_ROW}, \
                         make_interval(secs => $16::float8), $17::text)"
                    );
                    nack_in(
                        &tx,
                        &sql,
                        m,
                        &[&self.queue, &self.consumer, &slot, &n, &wid, &retry, why],
                    )
                    .await
                    .map_err(lost)?;
                }
                tx.execute(
                    "SELECT pgque.ack_partitioned($1::text, $2::text, $3::int4, $4::int4, $5::text)",
                    &[&self.queue, &self.consumer, &slot, &n, &wid],
                )
                .await
                .map_err(|e| lost(e.into()))?;
                tx.commit().await?;
                Ok(epoch)
            })
            .await?;
            total += rows.len();
        }
        c.execute(
            "SELECT pgque.release_slot($1::text, $2::text, $3::int4, $4::text)",
            &[&self.queue, &self.consumer, &slot, &wid],
        )
        .await?;
        Ok(total)
    }

    /// Renews the slot lease on `c`; returns its epoch, or SlotLost when
    /// another worker took it over.
    async fn renew(&self, c: &Client, wid: &str, slot: i32, epoch: i64) -> Result<i64> {
        let ttl = self.ttl.as_secs_f64();
        let got: Option<i64> = c
            .query_one(
                "SELECT pgque.claim_slot($1::text, $2::text, $3::int4, $4::text, make_interval(secs => $5::float8))",
                &[&self.queue, &self.consumer, &slot, &wid, &ttl],
            )
            .await?
            .get(0);
        // Same epoch: renewed; epoch + 1: it had lapsed and nobody took it in
        // between. Anything else: another worker held it.
        match got {
            Some(e) if e == epoch || e == epoch + 1 => Ok(e),
            Some(_) => {
                let _ = c
                    .execute(
                        "SELECT pgque.release_slot($1::text, $2::text, $3::int4, $4::text)",
                        &[&self.queue, &self.consumer, &slot, &wid],
                    )
                    .await;
                Err(Error::SlotLost { slot })
            }
            None => Err(Error::SlotLost { slot }),
        }
    }
}
