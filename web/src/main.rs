//! pgque-web: the dashboard of one pgque database and its Prometheus
//! exporter.
//!
//!   pgque-web --database-url postgres://monitor@localhost/app --listen 127.0.0.1:8080
//!
//! Pages (server-rendered, refreshed in place by a few lines of inline
//! script): `/` overview, `/events`, `/jobs`, `/schedules`, `/worker`;
//! the job explorer (explorer.rs, not refreshed): `/jobs/list` (filters,
//! keyset pages, bulk retry / cancel behind `/jobs/bulk`'s confirmation),
//! `/jobs/<id>`, `/flows/<id>`; the event browser (events.rs, not refreshed):
//! `/events/q/<queue>` (waiting events, open batches, dead letters with
//! replay / purge of selected ones behind `/events/confirm`); `/fragment/<page>` is a page's refreshable part; `/metrics` is
//! pgque.metrics() in the Prometheus text format; `/healthz` answers once
//! the database does.
//!
//! Read-only unless the database role is a member of pgque_admin (and
//! --read-only is not given): then pages carry pause/resume, retry, cancel
//! and replay buttons, each a POST carrying the session's CSRF token.
//!
//! Every request must name this server in `Host` and every POST must come
//! from its own pages (`Origin` / `Referer`): guard.rs. A login (auth.rs) is
//! required whenever it listens beyond loopback or offers admin actions.
mod auth;
mod charts;
mod db;
mod events;
mod explorer;
mod guard;
mod history;
mod html;
mod pages;
mod prom;

use auth::{Backoff, Credentials, Role, Sessions};
use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use clap::Parser;
use deadpool_postgres::Pool;
use history::History;
use html::Ctx;
use pages::{Figures, Page};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "pgque-web",
    version,
    about = "Dashboard and Prometheus /metrics for a pgque database",
    long_about = "Dashboard and Prometheus /metrics for a pgque database.\n\n\
Serves the event queues (consumers, lag, partition slots, dead letters), the job queues \
(by state, throughput, oldest ready job), the jobs themselves (a filtered list, each job's \
args, errors and history, flows as graphs), the schedules and the background worker's duties, \
and /metrics in the Prometheus text format (from pgque.metrics()).\n\n\
The pages are read-only unless the database role is a member of pgque_admin: then they \
offer pause/resume, retry a failed job, cancel a job and replay dead letters, each a POST \
protected by a CSRF token. A role with pgque_reader is enough for a read-only dashboard \
and for /metrics.\n\n\
Login: required whenever admin actions are on or --listen is not a loopback address. \
Secrets come from --auth-file (lines ROLE:NAME:SECRET, ROLE admin or read, the file \
mode 0600) and/or the environment (PGQUE_WEB_ADMIN_TOKEN, PGQUE_WEB_READ_TOKEN), never \
from the command line; each is at least 16 characters (openssl rand -hex 16). A read \
login sees the pages; only an admin login can use the admin actions. With a login on, \
/metrics takes a session or `Authorization: Bearer <token>` (either role).\n\n\
Requests must name this server in Host (the --listen address, localhost:PORT on \
loopback, or an --allowed-host name) and POSTs must come from its own pages (Origin or \
Referer): other web pages, DNS-rebound names included, are refused.\n\n\
TLS to the database is not supported: connect over a local socket or a trusted network."
)]
struct Args {
    /// The database to watch, as a libpq URL (postgres://user:password@host:port/db) or
    /// key=value string (host=/var/run/postgresql dbname=app). Never logged or shown.
    #[arg(long, env = "PGQUE_WEB_DATABASE_URL")]
    database_url: String,

    /// Address and port to listen on. The default keeps the dashboard on this machine;
    /// any other than a loopback address requires a login (--auth-file or the token
    /// variables) and should be behind a TLS proxy.
    #[arg(long, default_value = "127.0.0.1:8080", env = "PGQUE_WEB_LISTEN")]
    listen: SocketAddr,

    /// Another name requests may use in Host and Origin, NAME or NAME:PORT (repeatable):
    /// the name a proxy or users reach the dashboard by. Without a port, any port.
    #[arg(long = "allowed-host", value_name = "NAME[:PORT]")]
    allowed_hosts: Vec<String>,

    /// File of credentials, one `ROLE:NAME:SECRET` per line (ROLE `admin` or `read`,
    /// `#` comments), readable by its owner only (chmod 600). Combines with
    /// PGQUE_WEB_ADMIN_TOKEN and PGQUE_WEB_READ_TOKEN from the environment.
    #[arg(long, value_name = "PATH", env = "PGQUE_WEB_AUTH_FILE")]
    auth_file: Option<PathBuf>,

    /// How long a login lasts, in minutes (then the browser is asked to log in again).
    #[arg(long, default_value_t = 480, value_parser = clap::value_parser!(u64).range(1..=10080))]
    session_minutes: u64,

    /// Mark the session cookie Secure: give it when browsers reach the dashboard over
    /// HTTPS (a TLS proxy in front), so the cookie is never sent in clear.
    #[arg(long)]
    cookie_secure: bool,

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

    /// Most series (one per metric and label set: queue, consumer, slot, duty) the
    /// charts keep; beyond it new ones are not charted (readers can create consumers
    /// without bound, this bounds the memory: about 2 KB per series at --history 120).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=1000000))]
    max_series: u64,

    /// Database connections in the pool.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..1000))]
    pool_size: u64,
}

/// The login's state, when there is one.
struct Auth {
    creds: Credentials,
    sessions: Mutex<Sessions>,
    /// Failed logins through the form, and failed bearer tokens on
    /// /metrics, each backed off on its own (a scraper with a stale token
    /// does not slow people's logins).
    logins: Mutex<Backoff>,
    bearers: Mutex<Backoff>,
    cookie: String,
    secure: bool,
}

struct App {
    pool: Pool,
    identity: db::Identity,
    /// The database role may run admin actions and --read-only is not given
    /// (an admin login is still needed to use them).
    admin: bool,
    /// The CSRF token of a dashboard without a login (it has no admin
    /// actions, so no form uses it; sessions have their own).
    csrf: String,
    refresh_ms: u64,
    history: Mutex<History>,
    allowed: guard::Allowed,
    /// The port a Host header without one stands for.
    default_port: u16,
    /// The server was a hot standby at the last sample (or at startup):
    /// pages show no admin actions and say so; the actions themselves ask
    /// the server again (standby_refusal).
    standby: AtomicBool,
    auth: Option<Auth>,
}

type Shared = Arc<App>;

/// Who is looking: a session's user, or anyone on a dashboard without a
/// login.
struct Viewer {
    /// May use the admin actions: an admin login on a dashboard that has them.
    admin: bool,
    /// May see contents (pages::Ctx::contents): an admin login, on a
    /// dashboard whose database role is in pgque_admin.
    contents: bool,
    user: Option<(String, Role)>,
    csrf: String,
    session_id: Option<String>,
}

/// Equal without an early exit, so the time taken tells nothing of the token.
fn same(a: &str, b: &str) -> bool {
    auth::ct_eq(a.as_bytes(), b.as_bytes())
}

/// Why a login is required (None: it is not): listening beyond loopback,
/// or admin actions on. The reason is part of the startup error.
fn login_required(listen: SocketAddr, admin: bool) -> Option<String> {
    if !listen.ip().is_loopback() {
        Some(format!(
            "--listen {listen} is not a loopback address, so a login is required"
        ))
    } else if admin {
        Some(
            "admin actions are on (the database role is a member of pgque_admin), so a login is required"
                .into(),
        )
    } else {
        None
    }
}

/// The startup error for a required login without credentials: what to set.
fn no_credentials(why: &str, admin: bool) -> String {
    let mut m = format!(
        "{why}, and no credentials are configured. Set PGQUE_WEB_ADMIN_TOKEN and/or \
PGQUE_WEB_READ_TOKEN in the environment (16+ characters each, e.g. from `openssl rand -hex 16`), \
or give --auth-file PATH (lines ROLE:NAME:SECRET with ROLE admin or read, chmod 600)."
    );
    if admin {
        m.push_str(" Or pass --read-only for a read-only dashboard on loopback without a login.");
    }
    m
}

/// Reads the credentials of --auth-file and the environment. Err says what
/// is wrong (never a secret).
fn load_credentials(file: Option<&std::path::Path>) -> Result<Credentials, String> {
    let mut list = match file {
        Some(p) => auth::load_auth_file(p)?,
        None => Vec::new(),
    };
    list.extend(auth::from_env(
        std::env::var("PGQUE_WEB_ADMIN_TOKEN").ok(),
        std::env::var("PGQUE_WEB_READ_TOKEN").ok(),
    )?);
    Credentials::new(list)
}

fn log(msg: &str) {
    eprintln!("pgque-web: {msg}");
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let allowed = guard::Allowed::new(args.listen, &args.allowed_hosts).unwrap_or_else(|e| {
        log(&e);
        std::process::exit(2)
    });
    let creds = load_credentials(args.auth_file.as_deref()).unwrap_or_else(|e| {
        log(&e);
        std::process::exit(2)
    });
    if creds.is_empty() {
        if let Some(why) = login_required(args.listen, false) {
            log(&no_credentials(&why, false));
            std::process::exit(2);
        }
    }
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
    if let Err(e) = identity.check_search_path() {
        log(&e);
        std::process::exit(1);
    }
    let Some(version) = identity.pgque_version.clone() else {
        log(&format!(
            "database {} has no pgque extension (CREATE EXTENSION pgque)",
            identity.database
        ));
        std::process::exit(1);
    };
    let admin = identity.is_admin && !args.read_only;
    if creds.is_empty() {
        if let Some(why) = login_required(args.listen, admin) {
            log(&no_credentials(&why, admin));
            std::process::exit(2);
        }
    }
    let csrf = auth::random_hex().unwrap_or_else(|e| {
        log(&e);
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
    let ttl = Duration::from_secs(args.session_minutes * 60);
    if creds.is_empty() {
        log("no login: loopback only and read-only (give --auth-file or the token variables to require one)");
    } else {
        log(&format!(
            "login required: {} admin and {} read credential(s); a login lasts {} min{}",
            creds.count(Role::Admin),
            creds.count(Role::Read),
            args.session_minutes,
            if admin && creds.count(Role::Admin) == 0 {
                "; no admin credential, so nobody can use the admin actions"
            } else {
                ""
            }
        ));
    }
    log(&format!("answering to Host {}", allowed.describe()));
    if args.listen.ip().is_unspecified() && args.allowed_hosts.is_empty() {
        log(&format!(
            "listening on {} but answering to loopback names only: give --allowed-host for each \
name or address browsers use to reach it",
            args.listen
        ));
    }
    let auth = (!creds.is_empty()).then(|| Auth {
        creds,
        sessions: Mutex::new(Sessions::new(ttl)),
        logins: Mutex::new(Backoff::default()),
        bearers: Mutex::new(Backoff::default()),
        cookie: auth::cookie_name(args.listen.port()),
        secure: args.cookie_secure,
    });
    let standby = identity.standby;
    if standby {
        log("the database server is a hot standby: the pages are read-only and admin actions are refused until it is promoted");
    }
    let app = Arc::new(App {
        pool,
        identity,
        admin,
        csrf,
        refresh_ms: args.refresh_ms,
        history: Mutex::new(History::new(
            args.history as usize,
            args.max_series as usize,
        )),
        allowed,
        default_port: if args.cookie_secure { 443 } else { 80 },
        standby: AtomicBool::new(standby),
        auth,
    });
    tokio::spawn(sampler(app.clone(), Duration::from_millis(args.sample_ms)));

    let router = Router::new()
        .route("/", get(page_overview))
        .route("/events", get(page_events))
        .route("/events/q/{queue}", get(page_event_queue))
        .route("/events/confirm", post(dead_confirm))
        .route("/jobs", get(page_jobs))
        .route("/jobs/list", get(page_job_list))
        .route("/jobs/bulk", post(bulk_confirm))
        .route("/jobs/{id}", get(page_job))
        .route("/flows/{id}", get(page_flow))
        .route("/schedules", get(page_schedules))
        .route("/worker", get(page_worker))
        .route("/fragment/{page}", get(fragment))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        // Browsers ask for it on the plain-text answers (the pages carry an
        // empty icon of their own): no content rather than a 404.
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/action/{action}", post(action))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .layer(axum::middleware::from_fn_with_state(app.clone(), gate))
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
    let mut dropped = 0;
    loop {
        tick.tick().await;
        match db::metrics(&app.pool).await {
            Ok(ms) => {
                if let Ok(r) = db::in_recovery(&app.pool).await {
                    app.standby.store(r, Ordering::Relaxed);
                }
                let mut h = app.history.lock().unwrap();
                h.push(history::now(), &ms);
                if h.dropped() > 0 && dropped == 0 {
                    log(&format!(
                        "the charts keep {} series (--max-series): newer ones are not charted",
                        h.kept()
                    ));
                }
                dropped = h.dropped();
                drop(h);
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

/// Most characters of one client-chosen value a log line carries.
const LOG_TEXT_MAX: usize = 64;

/// A value a client chose (a path, a header, an action's name), as a log
/// line may carry it: Debug-escaped, so that a newline or a terminal escape
/// in it cannot forge or hide log lines (axum percent-decodes path
/// parameters, `%0A` included, and a refusal is logged before any login),
/// and cut to `max` characters, so that a request cannot fill the log.
fn client_text(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        format!("{s:?}")
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{cut:?}… ({n} characters)")
    }
}

/// A request as its refusals are logged: the method and path, each as
/// client_text.
fn request_what(method: &str, path: &str) -> String {
    if matches!(method, "GET" | "POST" | "HEAD") {
        format!("{method} {}", client_text(path, LOG_TEXT_MAX))
    } else {
        format!(
            "{} {}",
            client_text(method, LOG_TEXT_MAX),
            client_text(path, LOG_TEXT_MAX)
        )
    }
}

/// A plain-text refusal with its reason, logged. `what` and `why` are
/// logged as they are: whatever of them a client chose must already be
/// client_text.
fn refuse(status: StatusCode, what: &str, why: &str) -> Response {
    log(&format!("refused {what}: {why}"));
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        format!("refused: {why}\n"),
    )
        .into_response()
}

/// Whether a POST comes from a page of this dashboard: its Origin, or its
/// Referer when the browser sent no Origin, must be an allowed host, and
/// Sec-Fetch-Site must not say cross-site. Err: why not.
fn post_source(allowed: &guard::Allowed, headers: &HeaderMap) -> Result<(), String> {
    let get = |h: header::HeaderName| headers.get(h).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    if get(header::HeaderName::from_static("sec-fetch-site")) == Some("cross-site") {
        return Err("cross-site request".into());
    }
    let (which, url) = match (get(header::ORIGIN), get(header::REFERER)) {
        (Some(o), _) => ("Origin", o),
        (None, Some(r)) => ("Referer", r),
        (None, None) => {
            return Err(
                "no Origin or Referer header: POSTs must come from this dashboard's pages".into(),
            )
        }
    };
    if allowed.origin_ok(url) {
        Ok(())
    } else {
        Err(format!(
            "{which} {} is not this dashboard (allowed: {})",
            client_text(url, LOG_TEXT_MAX),
            allowed.describe()
        ))
    }
}

/// Runs before every route: refuses (421) a request whose Host is not a
/// name of this server, and (403) a POST from anywhere but its own pages.
async fn gate(State(app): State<Shared>, req: Request, next: Next) -> Response {
    let what = request_what(req.method().as_str(), req.uri().path());
    let host = req
        .headers()
        .get(header::HOST)
        .map(|v| v.to_str().unwrap_or("\u{fffd}"));
    match host {
        Some(h) if app.allowed.host_ok(h, app.default_port) => {}
        Some(h) => {
            return refuse(
                StatusCode::MISDIRECTED_REQUEST,
                &what,
                &format!(
                "Host {} is not a name of this dashboard (allowed: {}; more with --allowed-host)",
                client_text(h, LOG_TEXT_MAX),
                app.allowed.describe()
            ),
            )
        }
        None => return refuse(StatusCode::MISDIRECTED_REQUEST, &what, "no Host header"),
    }
    if req.method() == Method::POST {
        if let Err(why) = post_source(&app.allowed, req.headers()) {
            return refuse(StatusCode::FORBIDDEN, &what, &why);
        }
    }
    next.run(req).await
}

/// The session cookie's value in a request, if any.
fn session_id(app: &App, headers: &HeaderMap) -> Option<String> {
    let a = app.auth.as_ref()?;
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| auth::cookie_value(c, &a.cookie))
        .map(str::to_string)
}

/// Who makes this request: None without a live session on a dashboard
/// with a login; anyone (read-only) on one without.
fn viewer(app: &App, headers: &HeaderMap) -> Option<Viewer> {
    let Some(a) = &app.auth else {
        return Some(Viewer {
            admin: false,
            contents: false,
            user: None,
            csrf: app.csrf.clone(),
            session_id: None,
        });
    };
    let id = session_id(app, headers)?;
    let s = a.sessions.lock().unwrap().get(&id, Instant::now())?;
    Some(Viewer {
        admin: app.admin && s.role == Role::Admin,
        contents: app.identity.is_admin && s.role == Role::Admin,
        user: Some((s.name, s.role)),
        csrf: s.csrf,
        session_id: Some(id),
    })
}

/// A page's refreshable HTML, from fresh figures.
async fn content(app: &App, p: Page, ctx: &Ctx<'_>, range: Option<&str>) -> Result<String, String> {
    let ms = db::metrics(&app.pool).await.map_err(|e| e.0)?;
    let f = Figures::new(&ms);
    let (range_name, range_s) = charts::range(range);
    let history = |kind: &'static str, path: &'static str| async move {
        let rows = db::history(&app.pool, range_s).await.map_err(|e| e.0);
        charts::history_section(kind, &rows, path, range_name, range_s, history::now())
    };
    let out = match p {
        Page::Overview => pages::overview(&f),
        Page::Events => {
            let mut dead = Vec::new();
            for m in f.all("pgque_dead_letters") {
                if m.value > 0.0 {
                    let q = m.label("queue").to_string();
                    let t = db::dead_letters(&app.pool, &q, 5, ctx.contents)
                        .await
                        .map_err(|e| e.0);
                    dead.push((q, t));
                }
            }
            let charts = history("event", "/events").await;
            let h = app.history.lock().unwrap();
            pages::events(ctx, &f, &h, &dead) + &charts
        }
        Page::Jobs => {
            // (their last errors are contents)
            let failed = if ctx.contents {
                Some(db::failed_jobs(&app.pool, 20).await.map_err(|e| e.0))
            } else {
                None
            };
            let charts = history("job", "/jobs").await;
            let h = app.history.lock().unwrap();
            pages::jobs(ctx, &f, &h, failed.as_ref()) + &charts
        }
        Page::JobList => {
            let f = explorer::Filter::default();
            explorer::list_page(
                ctx,
                &f,
                &explorer::list(&app.pool, &f, ctx.contents)
                    .await
                    .map_err(|e| e.0),
            )
        }
        Page::Schedules => explorer::schedules_page(
            ctx,
            &explorer::schedules(&app.pool, ctx.contents)
                .await
                .map_err(|e| e.0),
        ),
        // (not in PAGES: no fragment URL reaches it)
        Page::EventQueue => return Err("this page is not refreshed in place".into()),
        Page::Worker => {
            let st = db::status(&app.pool).await.map_err(|e| e.0);
            let h = app.history.lock().unwrap();
            pages::worker(&f, &h, &st)
        }
    };
    Ok(out)
}

fn ctx<'a>(app: &'a App, v: &'a Viewer, message: Option<&'a str>) -> Ctx<'a> {
    let standby = app.standby.load(Ordering::Relaxed);
    Ctx {
        role: &app.identity.role,
        database: &app.identity.database,
        admin: v.admin && !standby,
        standby,
        contents: v.contents,
        csrf: &v.csrf,
        refresh_ms: app.refresh_ms,
        message,
        user: v.user.as_ref().map(|(n, r)| (n.as_str(), r.as_str())),
    }
}

#[derive(Deserialize)]
struct PageQuery {
    msg: Option<String>,
    /// The history charts' range (charts::RANGES).
    range: Option<String>,
}

/// The login page in place of a page (401), for a browser without a session.
fn login_instead(p: Page) -> Response {
    html(StatusCode::UNAUTHORIZED, pages::login(p.path(), None))
}

async fn render(app: &App, p: Page, q: PageQuery, headers: &HeaderMap) -> Response {
    let Some(v) = viewer(app, headers) else {
        return login_instead(p);
    };
    let c = ctx(app, &v, q.msg.as_deref());
    match content(app, p, &c, q.range.as_deref()).await {
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
                &format!("<p class=\"bad\">{}</p>", html::esc(&e)),
                "",
            ),
        ),
    }
}

async fn page_overview(
    State(app): State<Shared>,
    Query(q): Query<PageQuery>,
    h: HeaderMap,
) -> Response {
    render(&app, Page::Overview, q, &h).await
}
async fn page_events(
    State(app): State<Shared>,
    Query(q): Query<PageQuery>,
    h: HeaderMap,
) -> Response {
    render(&app, Page::Events, q, &h).await
}
async fn page_jobs(
    State(app): State<Shared>,
    Query(q): Query<PageQuery>,
    h: HeaderMap,
) -> Response {
    render(&app, Page::Jobs, q, &h).await
}
async fn page_schedules(
    State(app): State<Shared>,
    Query(q): Query<PageQuery>,
    h: HeaderMap,
) -> Response {
    render(&app, Page::Schedules, q, &h).await
}
async fn page_worker(
    State(app): State<Shared>,
    Query(q): Query<PageQuery>,
    h: HeaderMap,
) -> Response {
    render(&app, Page::Worker, q, &h).await
}

async fn fragment(
    State(app): State<Shared>,
    Path(slug): Path<String>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    let Some(p) = Page::from_slug(&slug) else {
        return html(StatusCode::NOT_FOUND, "no such page".into());
    };
    let Some(v) = viewer(&app, &headers) else {
        return html(StatusCode::UNAUTHORIZED, "log in again".into());
    };
    let c = ctx(&app, &v, None);
    match content(&app, p, &c, q.range.as_deref()).await {
        Ok(body) => html(StatusCode::OK, body),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("<p class=\"bad\">{}</p>", html::esc(&e)),
        ),
    }
}

/// The refusal of a /metrics request, None when it may answer: always
/// without a login; with one, to a session or to `Authorization: Bearer
/// <secret>` of any credential (a Prometheus scraper: read tokens are meant
/// for it).
fn metrics_refusal(app: &App, headers: &HeaderMap) -> Option<Response> {
    let a = app.auth.as_ref()?;
    if viewer(app, headers).is_some() {
        return None;
    }
    let unauthorized = |why: &str| {
        log(&format!("refused GET /metrics: {why}"));
        let mut r = (
            StatusCode::UNAUTHORIZED,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("refused: {why}\n"),
        )
            .into_response();
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"pgque-web\""),
        );
        r
    };
    let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return Some(unauthorized(
            "no session and no Authorization: Bearer token",
        ));
    };
    let now = Instant::now();
    let mut b = a.bearers.lock().unwrap();
    if let Some(w) = b.wait(now) {
        return Some(unauthorized(&format!(
            "too many wrong tokens; next one looked at in {} s",
            w.as_secs() + 1
        )));
    }
    if a.creds.check(token.trim()).is_some() {
        None
    } else {
        b.failed(now);
        Some(unauthorized("wrong bearer token"))
    }
}

async fn metrics(State(app): State<Shared>, headers: HeaderMap) -> Response {
    if let Some(r) = metrics_refusal(&app, &headers) {
        return r;
    }
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

/// GET /healthz: "ok" once the database answers. Open without a login (a
/// load balancer's probe), so it says no more than "unavailable".
async fn healthz(State(app): State<Shared>) -> Response {
    let ok = match app.pool.get().await {
        Ok(c) => c.query_one("SELECT 1", &[]).await.is_ok(),
        Err(_) => false,
    };
    if ok {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response()
    }
}

#[derive(Deserialize)]
struct LoginQuery {
    next: Option<String>,
    out: Option<String>,
}

/// GET /login: the login form (a dashboard without a login, or a browser
/// already logged in, goes on to its page).
async fn login_page(
    State(app): State<Shared>,
    Query(q): Query<LoginQuery>,
    headers: HeaderMap,
) -> Response {
    let next = q.next.as_deref().unwrap_or("/");
    if app.auth.is_none() || viewer(&app, &headers).is_some() {
        return Redirect::to(pages::Page::from_path(next).map_or("/", |p| p.path()))
            .into_response();
    }
    let msg = q.out.is_some().then_some("You are logged out.");
    html(StatusCode::OK, pages::login(next, msg))
}

#[derive(Deserialize)]
struct LoginForm {
    secret: Option<String>,
    next: Option<String>,
}

/// POST /login: checks the secret (under the failed-login back-off), and
/// on success starts a session (cookie) and goes to `next`.
async fn login(State(app): State<Shared>, Form(f): Form<LoginForm>) -> Response {
    let Some(a) = &app.auth else {
        return Redirect::to("/").into_response();
    };
    let next = f
        .next
        .as_deref()
        .and_then(Page::from_path)
        .map_or("/", |p| p.path());
    let now = Instant::now();
    let found = {
        // Held across the check, so parallel guesses queue behind the back-off.
        let mut b = a.logins.lock().unwrap();
        if let Some(w) = b.wait(now) {
            let secs = w.as_secs() + 1;
            log(&format!("refused a login: back-off, {secs} s left"));
            let mut r = html(
                StatusCode::TOO_MANY_REQUESTS,
                pages::login(
                    next,
                    Some(&format!("Too many failed logins: try again in {secs} s.")),
                ),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            return r;
        }
        let found = a.creds.check(f.secret.as_deref().unwrap_or("")).cloned();
        if found.is_none() {
            b.failed(now);
        }
        found
    };
    let Some(cred) = found else {
        log("failed login: wrong password or token");
        return html(
            StatusCode::UNAUTHORIZED,
            pages::login(next, Some("Wrong password or token.")),
        );
    };
    let created = a.sessions.lock().unwrap().create(&cred, now);
    let (id, s) = match created {
        Ok(x) => x,
        Err(e) => {
            log(&e);
            return html(StatusCode::SERVICE_UNAVAILABLE, html::esc(&e));
        }
    };
    let (ttl, live) = {
        let ss = a.sessions.lock().unwrap();
        (ss.ttl(), ss.live())
    };
    log(&format!(
        "login: {} ({}); {live} live session(s)",
        s.name,
        s.role.as_str()
    ));
    let mut r = Redirect::to(next).into_response();
    if let Ok(v) = HeaderValue::from_str(&auth::set_cookie(&a.cookie, &id, ttl, a.secure)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// POST /logout (the session's CSRF token): ends the session, removes
/// the cookie, and shows the login page.
async fn logout(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let Some(a) = &app.auth else {
        return Redirect::to("/").into_response();
    };
    let Some(v) = viewer(&app, &headers) else {
        return Redirect::to("/login").into_response();
    };
    match form.get("csrf") {
        Some(t) if same(t, &v.csrf) => {}
        _ => {
            return refuse(
                StatusCode::FORBIDDEN,
                "POST /logout",
                "wrong or no CSRF token",
            )
        }
    }
    if let Some(id) = &v.session_id {
        a.sessions.lock().unwrap().remove(id);
    }
    if let Some((name, _)) = &v.user {
        log(&format!("logout: {name}"));
    }
    let mut r = Redirect::to("/login?out=1").into_response();
    if let Ok(c) = HeaderValue::from_str(&auth::clear_cookie(&a.cookie, a.secure)) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    r
}

/// POST /action/<name>: refused (403) without an admin session, without
/// the session's CSRF token (the gate already refused other sites);
/// otherwise runs it and sends the browser back to its page with what
/// happened.
async fn action(
    State(app): State<Shared>,
    Path(name): Path<String>,
    AdminPost { viewer: v, form }: AdminPost<HashMap<String, String>>,
) -> Response {
    let back = form
        .get("back")
        .map(String::as_str)
        .filter(|b| explorer::safe_back(b))
        .unwrap_or("/")
        .to_string();
    let who = v.user.as_ref().map_or("", |(n, _)| n.as_str()).to_string();
    if let Some(res) = explorer_action(&app, &name, &form).await {
        let msg = match res {
            Ok(m) => {
                log(&action_line(&name, &who, &m));
                m
            }
            Err(e) => format!("{name} failed: {e}"),
        };
        return back_with(&back, &msg);
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
    let msg = match db::act(&app.pool, act, queue, job_id).await {
        Ok(m) => {
            log(&action_line(&name, &who, &m));
            m
        }
        Err(e) => format!("{name} failed: {}", e.0),
    };
    back_with(&back, &msg)
}

/// The log line of an admin action that ran: its name (one of the known
/// actions by now) and its message, which names the queues, schedules and
/// keys the form gave, so client_text, the message with room for them.
fn action_line(name: &str, who: &str, msg: &str) -> String {
    format!(
        "action {} by {who}: {}",
        client_text(name, LOG_TEXT_MAX),
        client_text(msg, 4 * LOG_TEXT_MAX)
    )
}

/// The form of a data-changing POST that passed every check an admin
/// action needs, in this order: a session (403 "not logged in"), a
/// dashboard with admin actions and an admin login (403 "... read-only"),
/// the session's CSRF token in the form field `csrf` (403 "wrong" / "no
/// CSRF token"), and a primary server (409 on a hot standby). Each refusal
/// is logged with the request's method and percent-decoded path. A handler
/// that takes it changes data only after all of them; nothing else checks.
struct AdminPost<T> {
    viewer: Viewer,
    form: T,
}

/// A form's `csrf` field, for [`AdminPost`].
trait CsrfField {
    fn csrf(&self) -> Option<&str>;
}

impl CsrfField for HashMap<String, String> {
    fn csrf(&self) -> Option<&str> {
        self.get("csrf").map(String::as_str)
    }
}

impl CsrfField for Vec<(String, String)> {
    fn csrf(&self) -> Option<&str> {
        html::field(self, "csrf")
    }
}

/// `p` with its %XX escapes decoded (as axum's Path extractor decodes a
/// segment), invalid UTF-8 replaced.
fn percent_decoded(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl<T> axum::extract::FromRequest<Shared> for AdminPost<T>
where
    T: serde::de::DeserializeOwned + CsrfField + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, app: &Shared) -> Result<Self, Response> {
        let what = request_what("POST", &percent_decoded(req.uri().path()));
        let Some(viewer) = viewer(app, req.headers()) else {
            return Err(refuse(StatusCode::FORBIDDEN, &what, "not logged in"));
        };
        if !app.admin {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                &what,
                "this dashboard is read-only",
            ));
        }
        if !viewer.admin {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                &what,
                "this login is read-only",
            ));
        }
        let Form(form) = Form::<T>::from_request(req, app)
            .await
            .map_err(IntoResponse::into_response)?;
        match form.csrf() {
            Some(t) if same(t, &viewer.csrf) => {}
            Some(_) => return Err(refuse(StatusCode::FORBIDDEN, &what, "wrong CSRF token")),
            None => return Err(refuse(StatusCode::FORBIDDEN, &what, "no CSRF token")),
        }
        if let Some(r) = standby_refusal(app, &what).await {
            return Err(r);
        }
        Ok(AdminPost { viewer, form })
    }
}

/// The refusal of an admin request on a hot standby (every write fails
/// there), asked of the server at the time of the request; None on a
/// primary. 409 with the reason, logged; a failed check lets the request go
/// on (its own error then says what is wrong).
async fn standby_refusal(app: &App, what: &str) -> Option<Response> {
    let standby = db::in_recovery(&app.pool).await.ok()?;
    app.standby.store(standby, Ordering::Relaxed);
    standby.then(|| {
        refuse(
            StatusCode::CONFLICT,
            what,
            "the database server is a hot standby (in recovery, read-only): \
admin actions run on the primary",
        )
    })
}

/// The redirect back to a page (a local path) with a message for it.
fn back_with(back: &str, msg: &str) -> Response {
    let sep = if back.contains('?') { '&' } else { '?' };
    Redirect::to(&format!("{back}{sep}msg={}", html::urlenc(msg))).into_response()
}

/// Runs an action of the explorer (schedules, bulk retry / cancel); None
/// for another action. The caller checked the admin login and the CSRF
/// token.
async fn explorer_action(
    app: &App,
    name: &str,
    form: &HashMap<String, String>,
) -> Option<Result<String, String>> {
    match name {
        "pause_schedule" | "resume_schedule" | "run_schedule" => {
            let Some(s) = form.get("schedule").filter(|s| !s.is_empty()) else {
                return Some(Err("a schedule name is required".into()));
            };
            Some(
                explorer::schedule_action(&app.pool, name, s)
                    .await
                    .map_err(|e| e.0),
            )
        }
        "release_key" => {
            let field = |k: &str| form.get(k).map(String::as_str).filter(|s| !s.is_empty());
            let (Some(queue), Some(consumer), Some(key)) =
                (field("queue"), field("consumer"), field("key"))
            else {
                return Some(Err("a queue, consumer and key are required".into()));
            };
            Some(
                events::release_key(&app.pool, queue, consumer, key)
                    .await
                    .map_err(|e| e.0),
            )
        }
        "dead_replay" | "dead_purge" => {
            let op = events::DeadOp::parse(&name[5..])?;
            let Some(queue) = form.get("queue").filter(|s| !s.is_empty()) else {
                return Some(Err("a queue name is required".into()));
            };
            let ids = match parse_ids(form.get("selected").map_or("", String::as_str).split(',')) {
                Ok(v) => v,
                Err(e) => return Some(Err(e)),
            };
            let Some(count) = form
                .get("count")
                .and_then(|n| n.trim().parse::<usize>().ok())
            else {
                return Some(Err("no confirmed count".into()));
            };
            Some(
                events::apply(&app.pool, op, queue, &ids, count)
                    .await
                    .map_err(|e| e.0),
            )
        }
        "bulk_retry" | "bulk_cancel" => {
            let act = explorer::Bulk::parse(&name[5..])?;
            let Some(d) = form.get("digest") else {
                return Some(Err("no confirmation digest".into()));
            };
            let pairs: Vec<(String, String)> =
                form.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let f = explorer::Filter::from_form(&pairs);
            let ids = match form.get("selected") {
                Some(list) => match parse_ids(list.split(',')) {
                    Ok(v) => Some(v),
                    Err(e) => return Some(Err(e)),
                },
                None => None,
            };
            Some(
                explorer::bulk_apply(&app.pool, act, ids.as_deref(), &f, d)
                    .await
                    .map_err(|e| e.0),
            )
        }
        _ => None,
    }
}

/// Job ids from a form (blank entries skipped). Err: the first that is not one.
fn parse_ids<'a>(it: impl Iterator<Item = &'a str>) -> Result<Vec<i64>, String> {
    let mut v = Vec::new();
    for s in it.map(str::trim).filter(|s| !s.is_empty()) {
        v.push(
            s.parse::<i64>()
                .map_err(|_| format!("{s:?} is not a job id"))?,
        );
    }
    Ok(v)
}

/// The query string as pairs (repeated keys kept).
#[derive(Deserialize)]
#[serde(transparent)]
struct Pairs(Vec<(String, String)>);

/// GET /jobs/list: a page of jobs for the filters of the query string
/// (queue, state, kind, q, before).
async fn page_job_list(
    State(app): State<Shared>,
    Query(Pairs(q)): Query<Pairs>,
    h: HeaderMap,
) -> Response {
    let Some(v) = viewer(&app, &h) else {
        return login_instead(Page::JobList);
    };
    let mut f = explorer::Filter::from_form(&q);
    match html::field(&q, "before")
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        Some(b) => match b.parse::<i64>() {
            Ok(b) => f.before = Some(b),
            Err(_) => return html(StatusCode::BAD_REQUEST, "before must be a job id".into()),
        },
        None => f.before = None,
    }
    let c = ctx(&app, &v, html::field(&q, "msg"));
    let page = explorer::list(&app.pool, &f, c.contents)
        .await
        .map_err(|e| e.0);
    html(
        StatusCode::OK,
        pages::page(Page::JobList, &c, &explorer::list_page(&c, &f, &page), ""),
    )
}

/// GET /jobs/<id>: one job, its history, parents and children.
async fn page_job(
    State(app): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PageQuery>,
    h: HeaderMap,
) -> Response {
    let Some(v) = viewer(&app, &h) else {
        return login_instead(Page::JobList);
    };
    let Ok(id) = id.parse::<i64>() else {
        return html(StatusCode::NOT_FOUND, "no such page".into());
    };
    let c = ctx(&app, &v, q.msg.as_deref());
    let (status, body) = match explorer::job(&app.pool, id, c.contents).await {
        Ok(d) if d.job.is_none() => (StatusCode::NOT_FOUND, explorer::job_page(&c, id, &d)),
        Ok(d) => (StatusCode::OK, explorer::job_page(&c, id, &d)),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("<p class=\"bad\">{}</p>", html::esc(&e.0)),
        ),
    };
    html(
        status,
        pages::page_titled(Page::JobList, &format!("Job {id}"), &c, &body, ""),
    )
}

/// GET /flows/<id>: a flow's graph and its counts by state.
async fn page_flow(State(app): State<Shared>, Path(id): Path<String>, h: HeaderMap) -> Response {
    let Some(v) = viewer(&app, &h) else {
        return login_instead(Page::JobList);
    };
    let Ok(id) = id.parse::<i64>() else {
        return html(StatusCode::NOT_FOUND, "no such page".into());
    };
    let c = ctx(&app, &v, None);
    let (status, body) = match explorer::flow(&app.pool, id).await {
        Ok(d) if d.status.is_none() => (StatusCode::NOT_FOUND, explorer::flow_page(id, &d)),
        Ok(d) => (StatusCode::OK, explorer::flow_page(id, &d)),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("<p class=\"bad\">{}</p>", html::esc(&e.0)),
        ),
    };
    html(
        status,
        pages::page_titled(Page::JobList, &format!("Flow {id}"), &c, &body, ""),
    )
}

/// GET /events/q/<queue>: one event queue's waiting events, open batches
/// and dead letters, from the cursors of the query string.
async fn page_event_queue(
    State(app): State<Shared>,
    Path(queue): Path<String>,
    Query(Pairs(q)): Query<Pairs>,
    h: HeaderMap,
) -> Response {
    let Some(v) = viewer(&app, &h) else {
        return login_instead(Page::EventQueue);
    };
    let at = match events::Cursor::from_query(&q) {
        Ok(at) => at,
        Err(e) => return html(StatusCode::BAD_REQUEST, html::esc(&e)),
    };
    let c = ctx(&app, &v, html::field(&q, "msg"));
    let (status, body) = match events::queue(&app.pool, &queue, at, c.contents).await {
        Ok(d) => (StatusCode::OK, events::queue_page(&c, &queue, at, &d)),
        Err(e) => (
            if e.0.contains("SQLSTATE 42704") {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            },
            format!("<p class=\"bad\">{}</p>", html::esc(&e.0)),
        ),
    };
    html(
        status,
        pages::page_titled(
            Page::EventQueue,
            &format!("Event queue {queue}"),
            &c,
            &body,
            "",
        ),
    )
}

/// POST /events/confirm (admin, CSRF): the confirmation of a replay or
/// purge of the selected dead letters of a queue, saying how many it will
/// change. Changes nothing itself.
async fn dead_confirm(
    State(app): State<Shared>,
    AdminPost { viewer: v, form }: AdminPost<Vec<(String, String)>>,
) -> Response {
    let Some(op) = html::field(&form, "op").and_then(events::DeadOp::parse) else {
        return html(
            StatusCode::BAD_REQUEST,
            "no replay or purge operation".into(),
        );
    };
    let Some(queue) = html::field(&form, "queue").filter(|s| !s.is_empty()) else {
        return html(StatusCode::BAD_REQUEST, "a queue name is required".into());
    };
    let ids = match parse_ids(
        form.iter()
            .filter(|(k, _)| k == "ids")
            .map(|(_, v)| v.as_str()),
    ) {
        Ok(v) => v,
        Err(e) => return html(StatusCode::BAD_REQUEST, html::esc(&e)),
    };
    let c = ctx(&app, &v, None);
    let body = match events::confirm(&app.pool, &c, op, queue, &ids).await {
        Ok(b) => b,
        Err(e) => format!("<p class=\"bad\">{}</p>", html::esc(&e.0)),
    };
    html(
        StatusCode::OK,
        pages::page_titled(
            Page::EventQueue,
            &format!("Confirm: {} dead letters of {queue}", op.name()),
            &c,
            &body,
            "",
        ),
    )
}

/// POST /jobs/bulk (admin, CSRF): the confirmation of a bulk retry or
/// cancel, of the selected jobs or of every job matching the filters,
/// saying how many jobs it will change. Changes nothing itself.
async fn bulk_confirm(
    State(app): State<Shared>,
    AdminPost { viewer: v, form }: AdminPost<Vec<(String, String)>>,
) -> Response {
    let op = html::field(&form, "op").unwrap_or("");
    let Some((act, mode)) = op.split_once('-') else {
        return html(StatusCode::BAD_REQUEST, "no bulk operation".into());
    };
    let Some(act) = explorer::Bulk::parse(act) else {
        return html(StatusCode::BAD_REQUEST, "unknown bulk operation".into());
    };
    let f = explorer::Filter::from_form(&form);
    let ids = if mode == "selected" {
        match parse_ids(
            form.iter()
                .filter(|(k, _)| k == "ids")
                .map(|(_, v)| v.as_str()),
        ) {
            Ok(v) => Some(v),
            Err(e) => return html(StatusCode::BAD_REQUEST, html::esc(&e)),
        }
    } else {
        None
    };
    let c = ctx(&app, &v, None);
    let body = match app.pool.get().await {
        Ok(conn) => match explorer::bulk_targets(&conn, act, ids.as_deref(), &f).await {
            Ok(t) => explorer::confirm_page(&c, act, ids.as_deref(), &f, &t),
            Err(e) => format!("<p class=\"bad\">{}</p>", html::esc(&e.0)),
        },
        Err(e) => format!(
            "<p class=\"bad\">{}</p>",
            html::esc(&db::DbError::from(e).0)
        ),
    };
    html(
        StatusCode::OK,
        pages::page_titled(
            Page::JobList,
            &format!("Confirm: {} jobs", act.name()),
            &c,
            &body,
            "",
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn client_chosen_text_is_logged_escaped_and_capped() {
        // what a refused POST /action/<name> logs: the name axum decoded
        // from `%0Arefused%20POST%20/action/x:%20ok` and a long tail
        let name = format!(
            "x\nrefused POST /action/y: not logged in\u{1b}[2J{}",
            "z".repeat(500)
        );
        let what = request_what("POST", &format!("/action/{name}"));
        let line = format!("refused {what}: not logged in");
        assert!(!line.contains('\n') && !line.contains('\u{1b}'), "{line}");
        assert!(line.contains("\\n") && line.contains("\\u{1b}"), "{line}");
        assert!(
            line.chars().count() < 140,
            "{} chars: {line}",
            line.chars().count()
        );
        let n = "/action/".len() + name.chars().count();
        assert!(what.contains(&format!("({n} characters)")), "{what}");
        // a short value: whole, quoted
        assert_eq!(client_text("emails", LOG_TEXT_MAX), "\"emails\"");
        assert_eq!(request_what("GET", "/jobs"), "GET \"/jobs\"");
        // an extension method is escaped too
        assert_eq!(request_what("X\u{7f}", "/"), "\"X\\u{7f}\" \"/\"");
        // an action that ran: its message names what the form gave
        let line = action_line(
            "pause_queue",
            "alice",
            &format!("event queue a\nb{} paused", "q".repeat(400)),
        );
        assert!(!line.contains('\n') && line.chars().count() < 320, "{line}");
        // an Origin refusal (its reason is logged) carries a capped Origin
        let allowed = guard::Allowed::new("127.0.0.1:8080".parse().unwrap(), &[]).unwrap();
        let mut h = HeaderMap::new();
        let long = format!("http://{}.example", "e".repeat(5000));
        h.insert(header::ORIGIN, HeaderValue::from_str(&long).unwrap());
        let why = post_source(&allowed, &h).unwrap_err();
        assert!(
            why.chars().count() < 300 && why.contains("(5015 characters)"),
            "{why}"
        );
    }

    #[test]
    fn help_documents_every_flag_and_listens_locally_by_default() {
        let mut cmd = Args::command();
        let help = cmd.render_long_help().to_string();
        for flag in [
            "--database-url",
            "--listen",
            "--allowed-host",
            "--auth-file",
            "--session-minutes",
            "--cookie-secure",
            "--read-only",
            "--refresh-ms",
            "--sample-ms",
            "--history",
            "--max-series",
            "--pool-size",
            "PGQUE_WEB_ADMIN_TOKEN",
            "PGQUE_WEB_READ_TOKEN",
        ] {
            assert!(help.contains(flag), "{flag} missing from --help");
        }
        for a in cmd.get_arguments() {
            assert!(a.get_help().is_some(), "{} has no help", a.get_id());
        }
        let args = Args::try_parse_from(["pgque-web", "--database-url", "x"]).unwrap();
        assert_eq!(args.listen.to_string(), "127.0.0.1:8080");
        assert!(!args.read_only && !args.cookie_secure);
        assert!(args.allowed_hosts.is_empty() && args.auth_file.is_none());
        let args = Args::try_parse_from([
            "pgque-web",
            "--database-url",
            "x",
            "--allowed-host",
            "a.test",
            "--allowed-host",
            "b.test:9",
        ])
        .unwrap();
        assert_eq!(args.allowed_hosts, ["a.test", "b.test:9"]);
        // No flag takes a secret.
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str().to_string();
            assert!(
                !id.contains("token") && !id.contains("secret") && !id.contains("password"),
                "{id}"
            );
        }
    }

    #[test]
    fn a_login_is_required_beyond_loopback_or_with_admin_actions() {
        let lo: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(login_required(lo, false), None);
        assert!(login_required(lo, true)
            .unwrap()
            .contains("admin actions are on"));
        assert!(login_required("[::1]:8080".parse().unwrap(), false).is_none());
        for far in ["0.0.0.0:8080", "10.1.2.3:8080", "[::]:8080"] {
            let why = login_required(far.parse().unwrap(), false).unwrap();
            assert!(why.contains("not a loopback address"), "{far}: {why}");
        }
        let m = no_credentials("x", true);
        for need in [
            "PGQUE_WEB_ADMIN_TOKEN",
            "PGQUE_WEB_READ_TOKEN",
            "--auth-file",
            "--read-only",
        ] {
            assert!(m.contains(need), "{need}: {m}");
        }
        assert!(!no_credentials("x", false).contains("--read-only"));
    }

    #[test]
    fn posts_must_come_from_this_dashboard() {
        let allowed = guard::Allowed::new("127.0.0.1:8080".parse().unwrap(), &[]).unwrap();
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            m
        };
        assert!(post_source(&allowed, &h(&[("origin", "http://127.0.0.1:8080")])).is_ok());
        assert!(post_source(&allowed, &h(&[("referer", "http://localhost:8080/jobs")])).is_ok());
        for (bad, why) in [
            (h(&[]), "no Origin or Referer"),
            (
                h(&[("origin", "http://evil.example:8080")]),
                "Origin \"http://evil.example:8080\"",
            ),
            (
                h(&[
                    ("origin", "http://evil.example:8080"),
                    ("sec-fetch-site", "same-origin"),
                ]),
                "is not this dashboard",
            ),
            (h(&[("origin", "null")]), "is not this dashboard"),
            (
                // An Origin decides even when the Referer would pass.
                h(&[
                    ("origin", "http://evil.example"),
                    ("referer", "http://127.0.0.1:8080/"),
                ]),
                "Origin",
            ),
            (h(&[("referer", "http://evil.example/")]), "Referer"),
            (
                h(&[
                    ("origin", "http://127.0.0.1:8080"),
                    ("sec-fetch-site", "cross-site"),
                ]),
                "cross-site",
            ),
        ] {
            let e = post_source(&allowed, &bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
