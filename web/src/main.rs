//! pgque-web: the dashboard of one pgque database and its Prometheus
//! exporter.
//!
//!   pgque-web --database-url postgres://monitor@localhost/app --listen 127.0.0.1:8080
//!
//! Pages (server-rendered, refreshed in place by a few lines of inline
//! script): `/` overview, `/events`, `/jobs`, `/schedules`, `/worker`;
//! `/fragment/<page>` is a page's refreshable part; `/metrics` is
//! pgque.metrics() in the Prometheus text format; `/healthz` answers once
//! the database does.
//!
//! Read-only unless the database role is a member of pgque_admin (and
//! --read-only is not given): then pages carry pause/resume, retry, cancel
//! and replay buttons, each a POST carrying this process's CSRF token.
mod db;
mod history;
mod pages;
mod prom;

use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use clap::Parser;
use deadpool_postgres::Pool;
use history::History;
use pages::{Ctx, Figures, Page};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "pgque-web",
    version,
    about = "Dashboard and Prometheus /metrics for a pgque database",
    long_about = "Dashboard and Prometheus /metrics for a pgque database.\n\n\
Serves the event queues (consumers, lag, partition slots, dead letters), the job queues \
(by state, throughput, oldest ready job), the schedules and the background worker's duties, \
and /metrics in the Prometheus text format (from pgque.metrics()).\n\n\
The pages are read-only unless the database role is a member of pgque_admin: then they \
offer pause/resume, retry a failed job, cancel a job and replay dead letters, each a POST \
protected by a CSRF token. A role with pgque_reader is enough for a read-only dashboard \
and for /metrics.\n\n\
TLS to the database is not supported: connect over a local socket or a trusted network."
)]
struct Args {
    /// The database to watch, as a libpq URL (postgres://user:password@host:port/db) or
    /// key=value string (host=/var/run/postgresql dbname=app). Never logged or shown.
    #[arg(long, env = "PGQUE_WEB_DATABASE_URL")]
    database_url: String,

    /// Address and port to listen on. The default keeps the dashboard on this machine;
    /// put it behind an authenticating proxy before exposing it.
    #[arg(long, default_value = "127.0.0.1:8080", env = "PGQUE_WEB_LISTEN")]
    listen: SocketAddr,

    /// Show no admin actions even when the role could run them.
    #[arg(long)]
    read_only: bool,

    /// How often pages refresh their figures in the browser, in milliseconds.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(200..))]
    refresh_ms: u64,

    /// How often the charts' history samples pgque.metrics(), in milliseconds.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..))]
    sample_ms: u64,

    /// Samples the charts keep (with --sample-ms 5000, 120 samples are 10 minutes).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(2..100000))]
    history: u64,

    /// Database connections in the pool.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..1000))]
    pool_size: u64,
}

struct App {
    pool: Pool,
    identity: db::Identity,
    admin: bool,
    csrf: String,
    refresh_ms: u64,
    history: Mutex<History>,
}

type Shared = Arc<App>;

/// 32 random bytes from the kernel, hex: the CSRF token of this process.
/// Forms carry it; another site's page cannot read it (same-origin policy),
/// so it cannot forge a POST that carries it.
fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Equal without an early exit, so the time taken tells nothing of the token.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn log(msg: &str) {
    eprintln!("pgque-web: {msg}");
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let pool = match db::pool(&args.database_url, args.pool_size as usize) {
        Ok(p) => p,
        Err(e) => {
            log(&e);
            std::process::exit(2);
        }
    };
    let identity = match db::identity(&pool).await {
        Ok(i) => i,
        Err(e) => {
            log(&format!("cannot connect to the database: {}", e.0));
            std::process::exit(1);
        }
    };
    let Some(version) = identity.pgque_version.clone() else {
        log(&format!(
            "database {} has no pgque extension (CREATE EXTENSION pgque)",
            identity.database
        ));
        std::process::exit(1);
    };
    let admin = identity.is_admin && !args.read_only;
    let csrf = random_token().unwrap_or_else(|e| {
        log(&format!("cannot read /dev/urandom: {e}"));
        std::process::exit(1)
    });
    log(&format!(
        "connected to database {} as role {} (pgque {version}); admin actions {}",
        identity.database,
        identity.role,
        match (identity.is_admin, args.read_only) {
            (true, false) => "ON (the role is a member of pgque_admin)",
            (true, true) => "OFF (--read-only)",
            _ => "OFF (the role is not a member of pgque_admin)",
        }
    ));
    let app = Arc::new(App {
        pool,
        identity,
        admin,
        csrf,
        refresh_ms: args.refresh_ms,
        history: Mutex::new(History::new(args.history as usize)),
    });
    tokio::spawn(sampler(app.clone(), Duration::from_millis(args.sample_ms)));

    let router = Router::new()
        .route("/", get(page_overview))
        .route("/events", get(page_events))
        .route("/jobs", get(page_jobs))
        .route("/schedules", get(page_schedules))
        .route("/worker", get(page_worker))
        .route("/fragment/{page}", get(fragment))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/action/{action}", post(action))
        .with_state(app);
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            log(&format!("cannot listen on {}: {e}", args.listen));
            std::process::exit(1);
        }
    };
    log(&format!(
        "dashboard on http://{}/ , Prometheus metrics on http://{}/metrics",
        args.listen, args.listen
    ));
    if let Err(e) = axum::serve(listener, router)
        .with_graceful_shutdown(shutdown())
        .await
    {
        log(&format!("server error: {e}"));
        std::process::exit(1);
    }
}

async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    log("shutting down");
}

/// Samples pgque.metrics() into the charts' history.
async fn sampler(app: Shared, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        match db::metrics(&app.pool).await {
            Ok(ms) => {
                app.history.lock().unwrap().push(history::now(), &ms);
                if failing {
                    log("sampling pgque.metrics() works again");
                    failing = false;
                }
            }
            Err(e) => {
                if !failing {
                    log(&format!("sampling pgque.metrics() failed: {}", e.0));
                    failing = true;
                }
            }
        }
    }
}

fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(pages::CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    r
}

/// A page's refreshable HTML, from fresh figures.
async fn content(app: &App, p: Page, ctx: &Ctx<'_>) -> Result<String, String> {
    let ms = db::metrics(&app.pool).await.map_err(|e| e.0)?;
    let f = Figures::new(&ms);
    let out = match p {
        Page::Overview => pages::overview(&f),
        Page::Events => {
            let mut dead = Vec::new();
            for m in f.all("pgque_dead_letters") {
                if m.value > 0.0 {
                    let q = m.label("queue").to_string();
                    let t = db::dead_letters(&app.pool, &q, 5).await.map_err(|e| e.0);
                    dead.push((q, t));
                }
            }
            let h = app.history.lock().unwrap();
            pages::events(ctx, &f, &h, &dead)
        }
        Page::Jobs => {
            let failed = if app.admin {
                Some(db::failed_jobs(&app.pool, 20).await.map_err(|e| e.0))
            } else {
                None
            };
            let h = app.history.lock().unwrap();
            pages::jobs(ctx, &f, &h, failed.as_ref())
        }
        Page::Schedules => pages::schedules(&db::schedules(&app.pool).await.map_err(|e| e.0)),
        Page::Worker => {
            let st = db::status(&app.pool).await.map_err(|e| e.0);
            let h = app.history.lock().unwrap();
            pages::worker(&f, &h, &st)
        }
    };
    Ok(out)
}

fn ctx<'a>(app: &'a App, message: Option<&'a str>) -> Ctx<'a> {
    Ctx {
        role: &app.identity.role,
        database: &app.identity.database,
        admin: app.admin,
        csrf: &app.csrf,
        refresh_ms: app.refresh_ms,
        message,
    }
}

#[derive(Deserialize)]
struct PageQuery {
    msg: Option<String>,
}

async fn render(app: &App, p: Page, q: PageQuery) -> Response {
    let c = ctx(app, q.msg.as_deref());
    match content(app, p, &c).await {
        Ok(body) => {
            let fixed = if p == Page::Jobs {
                pages::jobs_fixed(&c)
            } else {
                String::new()
            };
            html(StatusCode::OK, pages::page(p, &c, &body, &fixed))
        }
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::page(
                p,
                &c,
                &format!("<p class=\"bad\">{}</p>", pages::esc(&e)),
                "",
            ),
        ),
    }
}

async fn page_overview(State(app): State<Shared>, Query(q): Query<PageQuery>) -> Response {
    render(&app, Page::Overview, q).await
}
async fn page_events(State(app): State<Shared>, Query(q): Query<PageQuery>) -> Response {
    render(&app, Page::Events, q).await
}
async fn page_jobs(State(app): State<Shared>, Query(q): Query<PageQuery>) -> Response {
    render(&app, Page::Jobs, q).await
}
async fn page_schedules(State(app): State<Shared>, Query(q): Query<PageQuery>) -> Response {
    render(&app, Page::Schedules, q).await
}
async fn page_worker(State(app): State<Shared>, Query(q): Query<PageQuery>) -> Response {
    render(&app, Page::Worker, q).await
}

async fn fragment(State(app): State<Shared>, Path(slug): Path<String>) -> Response {
    let Some(p) = Page::from_slug(&slug) else {
        return html(StatusCode::NOT_FOUND, "no such page".into());
    };
    let c = ctx(&app, None);
    match content(&app, p, &c).await {
        Ok(body) => html(StatusCode::OK, body),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("<p class=\"bad\">{}</p>", pages::esc(&e)),
        ),
    }
}

async fn metrics(State(app): State<Shared>) -> Response {
    match db::metrics(&app.pool).await {
        Ok(ms) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, prom::CONTENT_TYPE)],
            prom::render(&ms),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("pgque.metrics() failed: {}\n", e.0),
        )
            .into_response(),
    }
}

async fn healthz(State(app): State<Shared>) -> Response {
    match app.pool.get().await {
        Ok(c) => match c.query_one("SELECT 1", &[]).await {
            Ok(_) => (StatusCode::OK, "ok\n").into_response(),
            Err(e) => (StatusCode::SERVICE_UNAVAILABLE, db::describe(&e)).into_response(),
        },
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// POST /action/<name>: refused (403) without admin rights, without the CSRF
/// token or from another site; otherwise runs it and sends the browser back
/// to its page with what happened.
async fn action(
    State(app): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let refuse = |why: &str| {
        log(&format!("refused POST /action/{name}: {why}"));
        (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("refused: {why}\n"),
        )
            .into_response()
    };
    if !app.admin {
        return refuse("this dashboard is read-only");
    }
    if headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == "cross-site")
    {
        return refuse("cross-site request");
    }
    match form.get("csrf") {
        Some(t) if same(t, &app.csrf) => {}
        Some(_) => return refuse("wrong CSRF token"),
        None => return refuse("no CSRF token"),
    }
    let Some(act) = db::Action::parse(&name) else {
        return (StatusCode::NOT_FOUND, "no such action\n").into_response();
    };
    let queue = form
        .get("queue")
        .map(String::as_str)
        .filter(|s| !s.is_empty());
    let job_id = match form
        .get("job_id")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
    {
        Some(s) => match s.parse::<i64>() {
            Ok(v) => Some(v),
            Err(_) => {
                return (StatusCode::BAD_REQUEST, "job_id must be a number\n").into_response()
            }
        },
        None => None,
    };
    let back = form
        .get("back")
        .and_then(|b| Page::from_path(b))
        .unwrap_or(Page::Overview);
    let msg = match db::act(&app.pool, act, queue, job_id).await {
        Ok(m) => {
            log(&format!("action {name}: {m}"));
            m
        }
        Err(e) => format!("{name} failed: {}", e.0),
    };
    let mut to = format!("{}?msg=", back.path());
    for b in msg.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' {
            to.push(b as char);
        } else {
            to.push_str(&format!("%{b:02X}"));
        }
    }
    Redirect::to(&to).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn tokens_are_random_hex_and_compared_whole() {
        let a = random_token().unwrap();
        let b = random_token().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(same(&a, &a.clone()));
        assert!(!same(&a, &b));
        assert!(!same(&a, &a[..63]));
    }

    #[test]
    fn help_documents_every_flag_and_listens_locally_by_default() {
        let mut cmd = Args::command();
        let help = cmd.render_long_help().to_string();
        for flag in [
            "--database-url",
            "--listen",
            "--read-only",
            "--refresh-ms",
            "--sample-ms",
            "--history",
            "--pool-size",
        ] {
            assert!(help.contains(flag), "{flag} missing from --help");
        }
        for a in cmd.get_arguments() {
            assert!(a.get_help().is_some(), "{} has no help", a.get_id());
        }
        let args = Args::try_parse_from(["pgque-web", "--database-url", "x"]).unwrap();
        assert_eq!(args.listen.to_string(), "127.0.0.1:8080");
        assert!(!args.read_only);
    }
}
