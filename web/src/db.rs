//! What the dashboard reads from the database, and the admin calls it makes.
//! Every figure comes from pgque's own functions (pgque.metrics(),
//! pgque.status(), dlq_inspect, the all_jobs view), all with bound
//! parameters; the binary has no SQL of its own over pgque's tables.
//!
//! Names: the dashboard's role is often pgque_admin, and a database's owner
//! (who needs no pgque role at all) can plant functions and operators in
//! `public` and put them first with `ALTER DATABASE ... SET search_path`; a
//! planted `public.to_jsonb(record)` beat pg_catalog's `to_jsonb(anyelement)`
//! and ran as the dashboard's role. So every connection pins
//! `search_path = pg_catalog, pg_temp` in its startup options ([`pool`]),
//! which outrank the database's and the role's settings, startup checks that
//! it holds ([`identity`]), and every statement of web/ still names its
//! functions `pg_catalog.` and its operators `OPERATOR(pg_catalog.x)`, so
//! that no name of it depends on the path.
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use std::collections::BTreeMap;
use std::str::FromStr;
use tokio_postgres::NoTls;

/// One row of pgque.metrics().
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Metric {
    pub fn label(&self, k: &str) -> &str {
        self.labels.get(k).map(String::as_str).unwrap_or("")
    }
}

/// A database error as a page may show it: PostgreSQL's message and
/// SQLSTATE, never the connection string.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} (SQLSTATE {})", d.message(), d.code().code()),
        None => e.to_string(),
    }
}

#[derive(Debug)]
pub struct DbError(pub String);

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        DbError(describe(&e))
    }
}
impl From<deadpool_postgres::PoolError> for DbError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => DbError(describe(&e)),
            other => DbError(format!("no database connection: {other}")),
        }
    }
}

/// The search_path every connection of pgque-web runs with.
pub const SEARCH_PATH: &str = "pg_catalog,pg_temp";

/// The startup options of a connection: the URL's own, then the pinned
/// search_path. The server applies them in order, so ours wins over an
/// `options=-c search_path=...` in the URL, and options of the startup
/// packet outrank ALTER DATABASE / ALTER ROLE settings.
pub fn startup_options(own: Option<&str>) -> String {
    let pin = format!("-c search_path={SEARCH_PATH}");
    match own.map(str::trim).filter(|o| !o.is_empty()) {
        Some(o) => format!("{o} {pin}"),
        None => pin,
    }
}

/// The pool. `url` is a libpq URL or key=value string; it is parsed here
/// and never logged (it may hold a password).
pub fn pool(url: &str, size: usize) -> Result<Pool, String> {
    let mut cfg =
        tokio_postgres::Config::from_str(url).map_err(|e| format!("bad --database-url: {e}"))?;
    if cfg.get_application_name().is_none() {
        cfg.application_name("pgque-web");
    }
    let opts = startup_options(cfg.get_options());
    cfg.options(opts);
    let mgr = Manager::from_config(
        cfg,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(mgr)
        .max_size(size)
        .build()
        .map_err(|e| format!("cannot build the connection pool: {e}"))
}

/// Who the binary is in the database, read once at startup.
#[derive(Clone, Debug)]
pub struct Identity {
    pub role: String,
    pub database: String,
    pub pgque_version: Option<String>,
    /// Member of pgque_admin (superusers are members of every role).
    pub is_admin: bool,
    /// The server is a hot standby (pg_is_in_recovery()) at startup.
    pub standby: bool,
    /// The connection's search_path as the server reports it.
    pub search_path: String,
}

impl Identity {
    /// Err when the connection does not run with the pinned search_path
    /// (a pooler that drops startup options, say): pgque-web then refuses
    /// to start rather than resolve names through someone else's path.
    pub fn check_search_path(&self) -> Result<(), String> {
        let got: String = self.search_path.split_whitespace().collect();
        if got == SEARCH_PATH {
            Ok(())
        } else {
            Err(format!(
                "the database connection's search_path is {:?}, not {SEARCH_PATH:?}: pgque-web pins it in the \
connection's startup options (-c search_path=...), so something between it and the server dropped them \
(a pooler?): connect directly or let the pooler pass startup options",
                self.search_path
            ))
        }
    }
}

pub async fn identity(pool: &Pool) -> Result<Identity, DbError> {
    let c = pool.get().await?;
    let r = c
        .query_one(
            "SELECT current_user::pg_catalog.text, pg_catalog.current_database()::pg_catalog.text,
                    (SELECT e.extversion FROM pg_catalog.pg_extension e
                      WHERE e.extname OPERATOR(pg_catalog.=) 'pgque'::pg_catalog.name),
                    COALESCE((SELECT pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER')
                                FROM pg_catalog.pg_roles r
                               WHERE r.rolname OPERATOR(pg_catalog.=) 'pgque_admin'::pg_catalog.name),
                             false),
                    pg_catalog.pg_is_in_recovery(),
                    pg_catalog.current_setting('search_path')",
            &[],
        )
        .await?;
    Ok(Identity {
        role: r.get(0),
        database: r.get(1),
        pgque_version: r.get(2),
        is_admin: r.get(3),
        standby: r.get(4),
        search_path: r.get(5),
    })
}

/// Whether the server is a hot standby now (in recovery: every write
/// fails there), so that admin actions are refused before they are tried.
pub async fn in_recovery(pool: &Pool) -> Result<bool, DbError> {
    let c = pool.get().await?;
    Ok(c.query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
        .await?
        .get(0))
}

pub async fn metrics(pool: &Pool) -> Result<Vec<Metric>, DbError> {
    let c = pool.get().await?;
    let rows = c
        .query(
            "SELECT m.name, m.labels, m.value FROM pgque.metrics() m",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let labels: serde_json::Value = r.get(1);
            let labels = labels
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| {
                            let v = match v {
                                serde_json::Value::String(s) => s.clone(),
                                other => other.to_string(),
                            };
                            (k.clone(), v)
                        })
                        .collect()
                })
                .unwrap_or_default();
            Metric {
                name: r.get(0),
                labels,
                value: r.get(2),
            }
        })
        .collect())
}

/// A result shown as a table: column names and each row's values as text.
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// Runs `sql` (whose rows are one jsonb object each, in column order given
/// by `columns`) and turns it into a Table.
async fn json_table(
    pool: &Pool,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    columns: Option<&[&str]>,
) -> Result<Table, DbError> {
    let c = pool.get().await?;
    let rows = c.query(sql, params).await?;
    let mut t = Table::default();
    for r in &rows {
        let v: serde_json::Value = r.get(0);
        let Some(o) = v.as_object() else { continue };
        if t.columns.is_empty() {
            t.columns = match columns {
                Some(cols) => cols.iter().map(|s| s.to_string()).collect(),
                None => o.keys().cloned().collect(),
            };
        }
        t.rows.push(
            t.columns
                .iter()
                .map(|k| match o.get(k) {
                    None | Some(serde_json::Value::Null) => String::new(),
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                })
                .collect(),
        );
    }
    if t.columns.is_empty() {
        if let Some(cols) = columns {
            t.columns = cols.iter().map(|s| s.to_string()).collect();
        }
    }
    Ok(t)
}

/// pgque.status(): (component, status, detail).
pub async fn status(pool: &Pool) -> Result<Table, DbError> {
    json_table(
        pool,
        "SELECT pg_catalog.to_jsonb(s) FROM pgque.status() s",
        &[],
        Some(&["component", "status", "detail"]),
    )
    .await
}

/// The newest dead letters of a queue, without their payloads (user data
/// that may be sensitive: dlq_inspect shows them to whoever needs them),
/// and with the reason each was given up on (the consumer's error text)
/// only for a viewer who may see contents (pages::Ctx::contents).
pub async fn dead_letters(
    pool: &Pool,
    queue: &str,
    limit: i32,
    contents: bool,
) -> Result<Table, DbError> {
    let mut cols = vec![
        "dead_letter_id",
        "consumer",
        "msg_id",
        "ev_type",
        "retry_count",
        "reason",
        "failed_at",
    ];
    if !contents {
        cols.retain(|c| *c != "reason");
    }
    json_table(
        pool,
        "SELECT pg_catalog.jsonb_build_object('dead_letter_id', d.dl_id, 'consumer', co.co_name,
                                   'msg_id', d.ev_id, 'ev_type', d.ev_type,
                                   'retry_count', d.ev_retry,
                                   'reason', CASE WHEN $3 THEN d.dl_reason END,
                                   'failed_at', d.dl_time)
           FROM pgque.dlq_inspect($1, $2) d
           LEFT JOIN pgque.consumer co ON co.co_id OPERATOR(pg_catalog.=) d.dl_consumer_id",
        &[&queue, &limit, &contents],
        Some(&cols),
    )
    .await
}

/// The newest failed jobs (pgque_admin: all_jobs). Failed jobs are always
/// in pgque.jobs (a log job that fails moves there), so only that branch of
/// the view is read, through its (state, finished_at) index.
pub async fn failed_jobs(pool: &Pool, limit: i64) -> Result<Table, DbError> {
    json_table(
        pool,
        "SELECT pg_catalog.jsonb_build_object('id', j.id, 'queue', j.queue, 'kind', j.kind,
                                   'attempt', j.attempt, 'finished_at', j.finished_at,
                                   'last_error', (j.errors OPERATOR(pg_catalog.->) -1)
                                                 OPERATOR(pg_catalog.->>) 'error'::pg_catalog.text)
           FROM pgque.all_jobs j
          WHERE j.stored_in OPERATOR(pg_catalog.=) 'jobs'::pg_catalog.text
            AND j.state OPERATOR(pg_catalog.=) 'failed'::pg_catalog.text
          ORDER BY j.finished_at DESC NULLS LAST LIMIT $1",
        &[&limit],
        Some(&[
            "id",
            "queue",
            "kind",
            "attempt",
            "finished_at",
            "last_error",
        ]),
    )
    .await
}

/// An admin action, as the form names it. Each is one pgque function call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action {
    PauseQueue,
    ResumeQueue,
    PauseJobQueue,
    ResumeJobQueue,
    RetryJob,
    CancelJob,
    ReplayDeadLetters,
}

impl Action {
    pub fn parse(name: &str) -> Option<Action> {
        Some(match name {
            "pause_queue" => Action::PauseQueue,
            "resume_queue" => Action::ResumeQueue,
            "pause_job_queue" => Action::PauseJobQueue,
            "resume_job_queue" => Action::ResumeJobQueue,
            "retry_job" => Action::RetryJob,
            "cancel_job" => Action::CancelJob,
            "replay_dead_letters" => Action::ReplayDeadLetters,
            _ => return None,
        })
    }
}

/// Runs the action; returns what to tell the user.
pub async fn act(
    pool: &Pool,
    action: Action,
    queue: Option<&str>,
    job_id: Option<i64>,
) -> Result<String, DbError> {
    let c = pool.get().await?;
    let need_queue = || queue.ok_or_else(|| DbError("a queue name is required".into()));
    let need_job = || job_id.ok_or_else(|| DbError("a job id is required".into()));
    Ok(match action {
        Action::PauseQueue | Action::ResumeQueue => {
            let q = need_queue()?;
            let on = if action == Action::PauseQueue {
                "true"
            } else {
                "false"
            };
            c.execute(
                "SELECT pgque.set_queue_config($1, 'ticker_paused', $2)",
                &[&q, &on],
            )
            .await?;
            format!(
                "event queue {q} {}",
                if on == "true" { "paused" } else { "resumed" }
            )
        }
        Action::PauseJobQueue => {
            let q = need_queue()?;
            c.execute("SELECT pgque.pause_job_queue($1)", &[&q]).await?;
            format!("job queue {q} paused")
        }
        Action::ResumeJobQueue => {
            let q = need_queue()?;
            c.execute("SELECT pgque.resume_job_queue($1)", &[&q])
                .await?;
            format!("job queue {q} resumed")
        }
        Action::RetryJob => {
            let id = need_job()?;
            let ok: bool = c
                .query_one("SELECT pgque.retry_job($1)", &[&id])
                .await?
                .get(0);
            if ok {
                format!("job {id} is ready again")
            } else {
                format!("job {id} was not retried (not failed)")
            }
        }
        Action::CancelJob => {
            let id = need_job()?;
            let ok: bool = c.query_one("SELECT pgque.cancel($1)", &[&id]).await?.get(0);
            if ok {
                format!("job {id} cancelled")
            } else {
                format!("job {id} was not cancelled (already finished)")
            }
        }
        Action::ReplayDeadLetters => {
            let q = need_queue()?;
            let n: i64 = c
                .query_one("SELECT pgque.dlq_replay_all($1)", &[&q])
                .await?
                .get(0);
            format!("{n} dead letters of {q} replayed")
        }
    })
}

/// One minute of a queue's history (pgque.read_history): `at` in Unix
/// seconds, `kind` "event" or "job".
#[derive(Clone, Debug, PartialEq)]
pub struct HistRow {
    pub at: f64,
    pub kind: String,
    pub queue: String,
    pub per_second: Option<f64>,
    pub depth: Option<f64>,
    pub lag: Option<f64>,
}

/// The history the worker kept of the last `since_s` seconds, by queue
/// then minute (one call of pgque.read_history).
pub async fn history(pool: &Pool, since_s: i64) -> Result<Vec<HistRow>, DbError> {
    let c = pool.get().await?;
    let secs = since_s as f64;
    let rows = c
        .query(
            "SELECT pg_catalog.date_part('epoch', h.bucket)::pg_catalog.float8, h.kind, h.queue,
                    h.per_second, h.depth::pg_catalog.float8, h.lag_seconds
               FROM pgque.read_history(pg_catalog.make_interval(secs => $1)) h",
            &[&secs],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| HistRow {
            at: r.get(0),
            kind: r.get(1),
            queue: r.get(2),
            per_second: r.get(3),
            depth: r.get(4),
            lag: r.get(5),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_connection_pins_the_search_path_last() {
        assert_eq!(startup_options(None), "-c search_path=pg_catalog,pg_temp");
        assert_eq!(
            startup_options(Some("  ")),
            "-c search_path=pg_catalog,pg_temp"
        );
        // the URL's own options stay, and ours come after them (the server
        // applies them in order: a search_path of the URL's loses)
        assert_eq!(
            startup_options(Some("-c search_path=public -c statement_timeout=5s")),
            "-c search_path=public -c statement_timeout=5s -c search_path=pg_catalog,pg_temp"
        );
        let cfg = {
            let mut c =
                tokio_postgres::Config::from_str("host=/tmp dbname=x options='-c work_mem=1MB'")
                    .unwrap();
            let o = startup_options(c.get_options());
            c.options(o);
            c
        };
        assert_eq!(
            cfg.get_options(),
            Some("-c work_mem=1MB -c search_path=pg_catalog,pg_temp")
        );
    }

    #[test]
    fn startup_refuses_a_connection_without_the_pinned_path() {
        let id = |p: &str| Identity {
            role: "r".into(),
            database: "d".into(),
            pgque_version: None,
            is_admin: true,
            standby: false,
            search_path: p.into(),
        };
        assert!(id("pg_catalog,pg_temp").check_search_path().is_ok());
        assert!(id("pg_catalog, pg_temp").check_search_path().is_ok());
        for bad in [
            "\"$user\", public",
            "public, pg_catalog",
            "pg_catalog, pg_temp, public",
        ] {
            let e = id(bad).check_search_path().unwrap_err();
            assert!(e.contains("startup options"), "{e}");
        }
    }
}
