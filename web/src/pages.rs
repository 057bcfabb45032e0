//! Server-rendered HTML: the page shell, each page's refreshable fragment,
//! and charts as inline SVG (no script library, no CDN: these pages work on
//! networks without internet). Every value from the database is escaped.
use crate::db::{Metric, Table};
use crate::history::{key, History};
use crate::html::{esc, num, Ctx};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Page {
    Overview,
    Events,
    Jobs,
    /// The jobs list (the explorer: web/src/explorer.rs), not refreshed in place.
    JobList,
    Schedules,
    Worker,
    /// One event queue's page (web/src/events.rs), under the nav entry of
    /// Events, not refreshed in place (a refresh would drop a selection).
    EventQueue,
}

pub const PAGES: &[Page] = &[
    Page::Overview,
    Page::Events,
    Page::Jobs,
    Page::JobList,
    Page::Schedules,
    Page::Worker,
];

impl Page {
    pub fn path(self) -> &'static str {
        match self {
            Page::Overview => "/",
            Page::Events => "/events",
            Page::Jobs => "/jobs",
            Page::JobList => "/jobs/list",
            Page::Schedules => "/schedules",
            Page::Worker => "/worker",
            Page::EventQueue => "/events",
        }
    }
    pub fn slug(self) -> &'static str {
        match self {
            Page::Overview => "overview",
            Page::Events => "events",
            Page::Jobs => "jobs",
            Page::JobList => "joblist",
            Page::Schedules => "schedules",
            Page::Worker => "worker",
            Page::EventQueue => "event-queue",
        }
    }
    pub fn title(self) -> &'static str {
        match self {
            Page::Overview => "Overview",
            Page::Events => "Event queues",
            Page::Jobs => "Job queues",
            Page::JobList => "Jobs",
            Page::Schedules => "Schedules",
            Page::Worker => "Worker",
            Page::EventQueue => "Event queue",
        }
    }
    pub fn from_slug(s: &str) -> Option<Page> {
        PAGES.iter().copied().find(|p| p.slug() == s)
    }
    pub fn from_path(s: &str) -> Option<Page> {
        PAGES.iter().copied().find(|p| p.path() == s)
    }
    /// Whether the page's figures refresh in place (the explorer's pages
    /// do not: a refresh would drop a selection or a position).
    pub fn refreshes(self) -> bool {
        self != Page::JobList && self != Page::EventQueue
    }
    /// The nav entry a page is shown under.
    fn nav(self) -> Page {
        match self {
            Page::EventQueue => Page::Events,
            p => p,
        }
    }
}

/// Seconds as a person reads them.
pub fn age(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        format!("{} m {} s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else if s < 86400.0 {
        format!(
            "{} h {} m",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    } else {
        format!("{:.1} d", s / 86400.0)
    }
}

const CSS: &str = r#"
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#f5f6f8}
header{background:#1d2330;color:#fff;padding:.6rem 1.2rem;display:flex;gap:1.4rem;align-items:center;flex-wrap:wrap}
header a{color:#c9d3e6;text-decoration:none}header a.on{color:#fff;font-weight:600;border-bottom:2px solid #6ea8fe}
header .who{margin-left:auto;font-size:.85rem;color:#c9d3e6}
main{padding:1rem 1.2rem;max-width:1300px}
h1{font-size:1.3rem;margin:.2rem 0 1rem}h2{font-size:1.05rem;margin:1.4rem 0 .5rem}
table{border-collapse:collapse;background:#fff;width:100%;font-size:.9rem}
th,td{padding:.35rem .6rem;border-bottom:1px solid #e3e6ec;text-align:left;vertical-align:middle}
th{background:#eef1f5;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;gap:.8rem;flex-wrap:wrap}.card{background:#fff;padding:.7rem 1rem;border-radius:6px;min-width:9rem;box-shadow:0 1px 2px #0001}
.card b{display:block;font-size:1.5rem}.card span{font-size:.8rem;color:#5a6475}
.ok{color:#17803d}.bad{color:#b42318}.warn{color:#b54708}.muted{color:#6b7280}
.msg{background:#e8f3ff;border:1px solid #b6d4fe;padding:.5rem .8rem;border-radius:4px;margin-bottom:1rem}
form.inline{display:inline;margin:0}button{font-size:.8rem;padding:.15rem .55rem;cursor:pointer}
svg.spark{vertical-align:middle;color:#3b6fd8}svg.chart{background:#fff;color:#3b6fd8;border-radius:6px}
svg text{font-size:10px;fill:#5a6475}
footer{font-size:.8rem;color:#6b7280;padding:1rem 1.2rem}
"#;

/// Fetches the page's fragment every `data-refresh` ms and swaps it in, so
/// figures update without a reload. Failures are shown in the footer, not
/// thrown (a thrown error is a console error).
const JS: &str = r#"
(function(){
  var b=document.body, ms=+b.dataset.refresh, url=b.dataset.fragment;
  var c=document.getElementById('content'), st=document.getElementById('updated');
  if(!ms||!url||!c) return;
  function tick(){
    fetch(url+location.search,{headers:{'Accept':'text/html'},credentials:'same-origin'})
      .then(function(r){ if(r.status===401){ location.reload(); } if(!r.ok){ throw new Error('HTTP '+r.status); } return r.text(); })
      .then(function(h){ c.innerHTML=h; st.textContent='updated '+new Date().toLocaleTimeString(); })
      .catch(function(e){ st.textContent='refresh failed: '+e.message; });
  }
  setInterval(tick, ms);
})();
"#;

/// The Content-Security-Policy of every page: nothing loads from anywhere
/// (no CDN), the inline style and script run, fetch and forms go only to
/// this server, and no other site may frame the pages.
pub const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
     img-src data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A whole page: the shell around `content` (the same HTML the fragment URL
/// returns) and `fixed` (parts that must not be replaced by a refresh, such
/// as a form being typed into).
pub fn page(p: Page, ctx: &Ctx, content: &str, fixed: &str) -> String {
    page_titled(p, p.title(), ctx, content, fixed)
}

/// A page with a title of its own (a job's, a flow's), under the nav entry
/// of `p`; refreshed in place only when `p` is.
pub fn page_titled(p: Page, title: &str, ctx: &Ctx, content: &str, fixed: &str) -> String {
    let mut nav = String::new();
    for q in PAGES {
        let _ = write!(
            nav,
            "<a href=\"{}\"{}>{}</a>",
            q.path(),
            if *q == p.nav() { " class=\"on\"" } else { "" },
            q.title()
        );
    }
    let msg = ctx
        .message
        .map(|m| format!("<div class=\"msg\" id=\"msg\">{}</div>", esc(m)))
        .unwrap_or_default();
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
<link rel=\"icon\" href=\"data:,\"><title>pgque · {title}</title><style>{CSS}{ECSS}{VCSS}{HCSS}</style></head>\
<body data-refresh=\"{refresh}\" data-fragment=\"/fragment/{slug}\" data-admin=\"{admin}\">\
<header><strong>pgque</strong>{nav}<span class=\"who\">database <b>{db}</b> as role <b>{role}</b> · {mode}{user}</span></header>\
<main><h1>{title}</h1>{msg}<div id=\"content\">{content}</div>{fixed}</main>\
<footer><span id=\"updated\">rendered {when}</span>{every} · <a href=\"/metrics\">/metrics</a></footer>\
<script>{JS}</script></body></html>",
        title = esc(title),
        ECSS = crate::html::EXPLORER_CSS,
        VCSS = crate::html::EVENTS_CSS,
        HCSS = crate::html::CHARTS_CSS,
        refresh = if p.refreshes() { ctx.refresh_ms } else { 0 },
        slug = p.slug(),
        admin = ctx.admin,
        db = esc(ctx.database),
        role = esc(ctx.role),
        mode = if ctx.standby {
            "<b id=\"standby\">read-only: the server is a hot standby</b>"
        } else if ctx.admin {
            "admin actions on"
        } else {
            "read-only"
        },
        when = "now",
        every = if p.refreshes() {
            format!(" · refreshes every {} s", ctx.refresh_ms as f64 / 1000.0)
        } else {
            String::new()
        },
        user = user(ctx),
    )
}

/// The header's "signed in as" and its logout button (a POST with the
/// session's CSRF token), when the dashboard has a login.
fn user(ctx: &Ctx) -> String {
    match ctx.user {
        None => String::new(),
        Some((name, role)) => format!(
            " · signed in as <b id=\"user\">{}</b> ({}) \
<form class=\"inline logout\" id=\"logout\" method=\"post\" action=\"/logout\">\
<input type=\"hidden\" name=\"csrf\" value=\"{}\"><button type=\"submit\">Log out</button></form>",
            esc(name),
            esc(role),
            esc(ctx.csrf)
        ),
    }
}

/// The login page: one password field for a token or password of the auth
/// file or the environment, and where to go after (`next`, a page path).
/// `message` says why the page is shown (wrong secret, logged out ...).
pub fn login(next: &str, message: Option<&str>) -> String {
    let next = Page::from_path(next).map_or("/", |p| p.path());
    let msg = message
        .map(|m| format!("<div class=\"msg\" id=\"msg\">{}</div>", esc(m)))
        .unwrap_or_default();
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
<link rel=\"icon\" href=\"data:,\"><title>pgque · Log in</title><style>{CSS}\
form.login{{background:#fff;padding:1rem 1.2rem;border-radius:6px;max-width:26rem;box-shadow:0 1px 2px #0001}}\
form.login input[type=password]{{width:100%;box-sizing:border-box;padding:.4rem;margin:.4rem 0 .8rem;font-size:1rem}}\
form.login button{{font-size:.95rem;padding:.3rem 1rem}}</style></head>\
<body data-admin=\"false\"><header><strong>pgque</strong></header>\
<main><h1>Log in</h1>{msg}<form class=\"login\" id=\"login\" method=\"post\" action=\"/login\">\
<input type=\"hidden\" name=\"next\" value=\"{next}\">\
<label for=\"secret\">Password or token</label>\
<input type=\"password\" id=\"secret\" name=\"secret\" autocomplete=\"current-password\" required autofocus>\
<button type=\"submit\">Log in</button></form>\
<p class=\"muted\">The secrets are set by whoever runs pgque-web: <code>--auth-file</code>, \
<code>PGQUE_WEB_ADMIN_TOKEN</code> or <code>PGQUE_WEB_READ_TOKEN</code>.</p></main></body></html>"
    )
}

/// A small line chart of a series (oldest first), drawn in SVG.
pub fn sparkline(points: &[(f64, f64)], what: &str) -> String {
    const W: f64 = 140.0;
    const H: f64 = 28.0;
    let label = esc(what);
    if points.len() < 2 {
        return format!(
            "<svg class=\"spark\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{label}\">\
<line x1=\"0\" y1=\"{y}\" x2=\"{W}\" y2=\"{y}\" stroke=\"#c9d3e6\" stroke-dasharray=\"3 3\"/></svg>",
            y = H - 1.0
        );
    }
    let t0 = points[0].0;
    let t1 = points[points.len() - 1].0;
    let max = points.iter().map(|p| p.1).fold(0.0_f64, f64::max);
    let span = (t1 - t0).max(1e-9);
    let mut pts = String::new();
    for (t, v) in points {
        let x = (t - t0) / span * W;
        let y = if max > 0.0 {
            H - 2.0 - v / max * (H - 4.0)
        } else {
            H - 2.0
        };
        let _ = write!(pts, "{x:.1},{y:.1} ");
    }
    format!(
        "<svg class=\"spark\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{label}\">\
<title>{label}: max {max}</title><polyline points=\"{pts}\" fill=\"none\" stroke=\"currentColor\" stroke-width=\"1.5\"/></svg>",
        max = num(max)
    )
}

/// An admin button: a POST form carrying the CSRF token. Empty for a
/// read-only dashboard, so a non-admin page has no form at all.
fn button(ctx: &Ctx, back: Page, action: &str, fields: &[(&str, &str)], label: &str) -> String {
    if !ctx.admin {
        return String::new();
    }
    let mut f = format!(
        "<form class=\"inline\" method=\"post\" action=\"/action/{action}\">\
<input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"back\" value=\"{}\">",
        esc(ctx.csrf),
        back.path()
    );
    let mut data = String::new();
    for (k, v) in fields {
        let _ = write!(
            f,
            "<input type=\"hidden\" name=\"{k}\" value=\"{}\">",
            esc(v)
        );
        let _ = write!(data, " data-{k}=\"{}\"", esc(v));
    }
    let _ = write!(
        f,
        "<button type=\"submit\" data-action=\"{action}\"{data}>{}</button></form> ",
        esc(label)
    );
    f
}

/// Indexes pgque.metrics() rows by name and labels.
pub struct Figures<'a> {
    by_name: BTreeMap<&'a str, Vec<&'a Metric>>,
}

impl<'a> Figures<'a> {
    pub fn new(ms: &'a [Metric]) -> Self {
        let mut by_name: BTreeMap<&str, Vec<&Metric>> = BTreeMap::new();
        for m in ms {
            by_name.entry(m.name.as_str()).or_default().push(m);
        }
        Figures { by_name }
    }
    pub fn all(&self, name: &str) -> &[&'a Metric] {
        self.by_name.get(name).map(Vec::as_slice).unwrap_or(&[])
    }
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.all(name)
            .iter()
            .find(|m| {
                m.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| m.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|m| m.value)
    }
    pub fn sum(&self, name: &str) -> f64 {
        self.all(name).iter().map(|m| m.value).sum()
    }
    /// Distinct values of a label across a metric's rows, sorted.
    pub fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        self.all(name)
            .iter()
            .map(|m| m.label(label).to_string())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }
}

/// A table cell holding one metric's value, marked with the metric's name
/// and labels so a test (or a user's script) can find it.
fn cell(f: &Figures, name: &str, labels: &[(&str, &str)], seconds: bool) -> String {
    let ltxt = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    match f.get(name, labels) {
        Some(v) => {
            let shown = if seconds { age(v) } else { num(v) };
            format!(
                "<td class=\"n\" data-metric=\"{name}\" data-labels=\"{}\" data-value=\"{v}\">{}</td>",
                esc(&ltxt),
                esc(&shown)
            )
        }
        None => "<td class=\"n muted\">–</td>".into(),
    }
}

/// Renders a row's extra cell (an action button) from its values.
type RowExtra<'a> = &'a dyn Fn(&[String]) -> String;

fn table(t: &Table, extra: Option<RowExtra>, extra_head: &str) -> String {
    let mut o = String::from("<table><thead><tr>");
    for c in &t.columns {
        let _ = write!(o, "<th>{}</th>", esc(c));
    }
    if extra.is_some() {
        let _ = write!(o, "<th>{extra_head}</th>");
    }
    o.push_str("</tr></thead><tbody>");
    for r in &t.rows {
        o.push_str("<tr>");
        for v in r {
            let _ = write!(o, "<td>{}</td>", esc(v));
        }
        if let Some(x) = extra {
            let _ = write!(o, "<td>{}</td>", x(r));
        }
        o.push_str("</tr>");
    }
    o.push_str("</tbody></table>");
    o
}

fn card(value: &str, what: &str, class: &str, id: &str) -> String {
    format!(
        "<div class=\"card\" id=\"{id}\"><b class=\"{class}\">{}</b><span>{}</span></div>",
        esc(value),
        esc(what)
    )
}

pub fn overview(f: &Figures) -> String {
    let up = f.get("pgque_worker_up", &[]) == Some(1.0);
    let failing = f
        .all("pgque_duty_consecutive_failures")
        .iter()
        .filter(|m| m.value > 0.0)
        .count();
    let queues = f
        .label_values("pgque_event_queue_pending_events", "queue")
        .len();
    let jqueues = f.label_values("pgque_job_queue_paused", "queue").len();
    let jobs_in = |state: &str| -> f64 {
        f.all("pgque_jobs")
            .iter()
            .filter(|m| m.label("state") == state)
            .map(|m| m.value)
            .sum()
    };
    let oldest = f
        .all("pgque_job_oldest_ready_age_seconds")
        .iter()
        .map(|m| m.value)
        .fold(0.0_f64, f64::max);
    let mut o = String::from("<div class=\"cards\">");
    // On a hot standby no worker runs until promotion: not a fault.
    let standby = f.get("pgque_in_recovery", &[]) == Some(1.0);
    o.push_str(&card(
        if up {
            "up"
        } else if standby {
            "standby"
        } else {
            "down"
        },
        "background worker",
        if up {
            "ok"
        } else if standby {
            "muted"
        } else {
            "bad"
        },
        "card-worker",
    ));
    o.push_str(&card(
        &failing.to_string(),
        "duties failing",
        if failing > 0 { "bad" } else { "ok" },
        "card-failing",
    ));
    o.push_str(&card(
        &queues.to_string(),
        "event queues",
        "",
        "card-queues",
    ));
    o.push_str(&card(
        &num(f.sum("pgque_event_queue_pending_events")),
        "events pending",
        "",
        "card-pending",
    ));
    let dl = f.sum("pgque_dead_letters");
    o.push_str(&card(
        &num(dl),
        "dead letters",
        if dl > 0.0 { "warn" } else { "" },
        "card-dead",
    ));
    o.push_str(&card(
        &jqueues.to_string(),
        "job queues",
        "",
        "card-jqueues",
    ));
    o.push_str(&card(
        &num(jobs_in("ready")),
        "jobs ready",
        "",
        "card-ready",
    ));
    o.push_str(&card(
        &num(jobs_in("running")),
        "jobs running",
        "",
        "card-running",
    ));
    let failed = jobs_in("failed");
    o.push_str(&card(
        &num(failed),
        "jobs failed",
        if failed > 0.0 { "warn" } else { "" },
        "card-failed",
    ));
    o.push_str(&card(&age(oldest), "oldest ready job", "", "card-oldest"));
    o.push_str("</div>");
    o
}

pub fn events(
    ctx: &Ctx,
    f: &Figures,
    h: &History,
    dead: &[(String, Result<Table, String>)],
) -> String {
    let mut o = String::from("<h2>Queues</h2><table id=\"event-queues\"><thead><tr><th>queue</th><th>pending</th><th>unticked</th><th>last tick</th><th>events/s</th><th>consumers</th><th>dead letters</th><th>ticker</th><th>pending, last minutes</th>");
    if ctx.admin {
        o.push_str("<th>actions</th>");
    }
    o.push_str("</tr></thead><tbody>");
    let queues = f.label_values("pgque_event_queue_pending_events", "queue");
    if queues.is_empty() {
        o.push_str(
            "<tr><td colspan=\"9\" class=\"muted\">no event queues (pgque.create_queue)</td></tr>",
        );
    }
    for q in &queues {
        let l = [("queue", q.as_str())];
        let paused = f.get("pgque_event_queue_ticker_paused", &l) == Some(1.0);
        let _ = write!(
            o,
            "<tr data-queue=\"{qe}\"><td><a href=\"{}\">{qe}</a></td>{}{}{}{}{}{}<td class=\"{}\">{}</td><td>{}</td>",
            esc(&crate::events::href(q)),
            cell(f, "pgque_event_queue_pending_events", &l, false),
            cell(f, "pgque_event_queue_unticked_events", &l, false),
            cell(f, "pgque_event_queue_last_tick_age_seconds", &l, true),
            cell(f, "pgque_event_queue_events_per_second", &l, false),
            cell(f, "pgque_event_queue_consumers", &l, false),
            cell(f, "pgque_dead_letters", &l, false),
            if paused { "warn" } else { "ok" },
            if paused { "paused" } else { "running" },
            sparkline(
                &h.series(&key("pgque_event_queue_pending_events", &l)),
                &format!("pending events of {q}")
            ),
            qe = esc(q),
        );
        if ctx.admin {
            o.push_str("<td>");
            if paused {
                o.push_str(&button(
                    ctx,
                    Page::Events,
                    "resume_queue",
                    &[("queue", q)],
                    "Resume",
                ));
            } else {
                o.push_str(&button(
                    ctx,
                    Page::Events,
                    "pause_queue",
                    &[("queue", q)],
                    "Pause",
                ));
            }
            if f.get("pgque_dead_letters", &l).unwrap_or(0.0) > 0.0 {
                o.push_str(&button(
                    ctx,
                    Page::Events,
                    "replay_dead_letters",
                    &[("queue", q)],
                    "Replay dead letters",
                ));
            }
            o.push_str("</td>");
        }
        o.push_str("</tr>");
    }
    o.push_str("</tbody></table>");

    o.push_str("<h2>Consumers</h2><table id=\"consumers\"><thead><tr><th>queue</th><th>consumer</th><th>lag</th><th>pending</th><th>last seen</th><th>batch</th><th>lag, last minutes</th></tr></thead><tbody>");
    let mut consumers: BTreeSet<(String, String)> = BTreeSet::new();
    for m in f.all("pgque_consumer_batch_open") {
        consumers.insert((m.label("queue").into(), m.label("consumer").into()));
    }
    if consumers.is_empty() {
        o.push_str("<tr><td colspan=\"7\" class=\"muted\">no consumers</td></tr>");
    }
    for (q, c) in &consumers {
        let l = [("queue", q.as_str()), ("consumer", c.as_str())];
        let open = f.get("pgque_consumer_batch_open", &l) == Some(1.0);
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td>{}{}{}<td>{}</td><td>{}</td></tr>",
            esc(q),
            esc(c),
            cell(f, "pgque_consumer_lag_seconds", &l, true),
            cell(f, "pgque_consumer_pending_events", &l, false),
            cell(f, "pgque_consumer_last_seen_seconds", &l, true),
            if open { "open" } else { "–" },
            sparkline(
                &h.series(&key("pgque_consumer_lag_seconds", &l)),
                &format!("lag of {c} on {q}")
            ),
        );
    }
    o.push_str("</tbody></table>");

    let slots = f.all("pgque_partition_slot_leased");
    if !slots.is_empty() {
        o.push_str("<h2>Partition slots</h2><table id=\"slots\"><thead><tr><th>queue</th><th>consumer</th><th>slot</th><th>pending</th><th>oldest pending</th><th>lease</th></tr></thead><tbody>");
        let mut rows: Vec<(&str, &str, i64, &str)> = slots
            .iter()
            .map(|m| {
                (
                    m.label("queue"),
                    m.label("consumer"),
                    m.label("slot").parse::<i64>().unwrap_or(-1),
                    m.label("slot"),
                )
            })
            .collect();
        rows.sort();
        for (q, c, _, s) in rows {
            let l = [("queue", q), ("consumer", c), ("slot", s)];
            let leased = f.get("pgque_partition_slot_leased", &l) == Some(1.0);
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td>{}{}<td>{}</td></tr>",
                esc(q),
                esc(c),
                esc(s),
                cell(f, "pgque_partition_slot_pending_events", &l, false),
                cell(
                    f,
                    "pgque_partition_slot_oldest_pending_age_seconds",
                    &l,
                    true
                ),
                if leased { "held" } else { "free" },
            );
        }
        o.push_str("</tbody></table>");
    }

    for (q, t) in dead {
        let _ = write!(o, "<h2>Newest dead letters of {}</h2>", esc(q));
        match t {
            Ok(t) => o.push_str(&table(t, None, "")),
            Err(e) => {
                let _ = write!(o, "<p class=\"bad\">{}</p>", esc(e));
            }
        }
    }
    o
}

pub fn jobs(ctx: &Ctx, f: &Figures, h: &History, failed: Option<&Result<Table, String>>) -> String {
    const STATES: &[&str] = &[
        "scheduled",
        "ready",
        "running",
        "completed",
        "failed",
        "cancelled",
    ];
    let mut o =
        String::from("<h2>Queues by state</h2><table id=\"job-queues\"><thead><tr><th>queue</th>");
    for s in STATES {
        let _ = write!(o, "<th>{s}</th>");
    }
    o.push_str(
        "<th>oldest ready</th><th>completed/s</th><th>dispatch</th><th>ready, last minutes</th>",
    );
    if ctx.admin {
        o.push_str("<th>actions</th>");
    }
    o.push_str("</tr></thead><tbody>");
    let queues = f.label_values("pgque_job_queue_paused", "queue");
    if queues.is_empty() {
        o.push_str("<tr><td colspan=\"11\" class=\"muted\">no job queues (pgque.create_job_queue)</td></tr>");
    }
    for q in &queues {
        let _ = write!(
            o,
            "<tr data-queue=\"{qe}\"><td><a href=\"/jobs/list?queue={}\">{qe}</a></td>",
            crate::html::urlenc(q),
            qe = esc(q)
        );
        for s in STATES {
            o.push_str(&cell(f, "pgque_jobs", &[("queue", q), ("state", s)], false));
        }
        let l = [("queue", q.as_str())];
        o.push_str(&cell(f, "pgque_job_oldest_ready_age_seconds", &l, true));
        let ck = key("pgque_jobs", &[("queue", q), ("state", "completed")]);
        let rate = h.rate(&ck);
        let _ = write!(
            o,
            "<td class=\"n\" data-throughput=\"{}\">{}</td>",
            esc(q),
            rate.map(num).unwrap_or_else(|| "–".into())
        );
        let paused = f.get("pgque_job_queue_paused", &l) == Some(1.0);
        let _ = write!(
            o,
            "<td class=\"{}\">{}</td><td>{}</td>",
            if paused { "warn" } else { "ok" },
            if paused { "paused" } else { "running" },
            sparkline(
                &h.series(&key("pgque_jobs", &[("queue", q), ("state", "ready")])),
                &format!("ready jobs of {q}")
            )
        );
        if ctx.admin {
            o.push_str("<td>");
            if paused {
                o.push_str(&button(
                    ctx,
                    Page::Jobs,
                    "resume_job_queue",
                    &[("queue", q)],
                    "Resume",
                ));
            } else {
                o.push_str(&button(
                    ctx,
                    Page::Jobs,
                    "pause_job_queue",
                    &[("queue", q)],
                    "Pause",
                ));
            }
            o.push_str("</td>");
        }
        o.push_str("</tr>");
    }
    o.push_str("</tbody></table>");
    if let Some(failed) = failed {
        o.push_str("<h2>Newest failed jobs</h2>");
        match failed {
            Ok(t) if t.rows.is_empty() => o.push_str("<p class=\"muted\">no failed jobs</p>"),
            Ok(t) => {
                let retry = |r: &[String]| -> String {
                    button(
                        ctx,
                        Page::Jobs,
                        "retry_job",
                        &[("job_id", r[0].as_str())],
                        "Retry",
                    )
                };
                o.push_str(&table(t, Some(&retry), "actions"));
            }
            Err(e) => {
                let _ = write!(o, "<p class=\"bad\">{}</p>", esc(e));
            }
        }
    }
    o
}

/// The part of the jobs page a refresh leaves alone: the cancel form.
pub fn jobs_fixed(ctx: &Ctx) -> String {
    if !ctx.admin {
        return String::new();
    }
    format!(
        "<h2>Cancel a job</h2><form method=\"post\" action=\"/action/cancel_job\" id=\"cancel-form\">\
<input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"back\" value=\"/jobs\">\
<label>job id <input type=\"number\" name=\"job_id\" min=\"1\" required id=\"cancel-id\"></label> \
<button type=\"submit\" data-action=\"cancel_job\">Cancel job</button></form>",
        esc(ctx.csrf)
    )
}

pub fn worker(f: &Figures, h: &History, status: &Result<Table, String>) -> String {
    let mut o = String::new();
    let up = f.get("pgque_worker_up", &[]) == Some(1.0);
    let _ = write!(
        o,
        "<p>Worker: <b class=\"{}\" id=\"worker-state\">{}</b> · preloaded: {} · switched on: {}</p>",
        if up { "ok" } else { "bad" },
        if up { "up" } else { "down" },
        if f.get("pgque_preloaded", &[]) == Some(1.0) { "yes" } else { "no (manual mode)" },
        if f.get("pgque_worker_enabled", &[]) == Some(1.0) { "yes" } else { "no (pgque.stop())" },
    );
    o.push_str("<h2>Duties</h2><table id=\"duties\"><thead><tr><th>duty</th><th>runs</th><th>failures</th><th>failing in a row</th><th>last run</th><th>last success</th><th>last duration</th><th>runs/s, last minutes</th></tr></thead><tbody>");
    let now = crate::history::now();
    let duties = f.label_values("pgque_duty_runs_total", "duty");
    if duties.is_empty() {
        o.push_str(
            "<tr><td colspan=\"8\" class=\"muted\">no worker running: no duty figures</td></tr>",
        );
    }
    for d in &duties {
        let l = [("duty", d.as_str())];
        let ago = |n: &str| {
            f.get(n, &l)
                .map(|t| format!("{} ago", age((now - t).max(0.0))))
                .unwrap_or_else(|| "never".into())
        };
        let failing = f.get("pgque_duty_consecutive_failures", &l).unwrap_or(0.0) > 0.0;
        let _ = write!(
            o,
            "<tr><td class=\"{}\">{}</td>{}{}{}<td>{}</td><td>{}</td>{}<td>{}</td></tr>",
            if failing { "bad" } else { "" },
            esc(d),
            cell(f, "pgque_duty_runs_total", &l, false),
            cell(f, "pgque_duty_failures_total", &l, false),
            cell(f, "pgque_duty_consecutive_failures", &l, false),
            ago("pgque_duty_last_run_timestamp_seconds"),
            ago("pgque_duty_last_success_timestamp_seconds"),
            cell(f, "pgque_duty_last_duration_seconds", &l, true),
            sparkline(
                &h.rates(&key("pgque_duty_runs_total", &l)),
                &format!("runs of {d}")
            ),
        );
    }
    o.push_str("</tbody></table><h2>pgque.status()</h2>");
    match status {
        Ok(t) => o.push_str(&table(t, None, "")),
        Err(e) => {
            let _ = write!(o, "<p class=\"bad\">{}</p>", esc(e));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn numbers_and_ages_read_well() {
        assert_eq!(num(7.0), "7");
        assert_eq!(num(0.125), "0.125");
        assert_eq!(num(2.5), "2.5");
        assert_eq!(age(0.25), "250 ms");
        assert_eq!(age(75.0), "1 m 15 s");
        assert_eq!(age(7200.0), "2 h 0 m");
    }

    #[test]
    fn a_standby_page_says_so() {
        let ctx = Ctx {
            role: "r",
            database: "d",
            admin: false,
            csrf: "tok",
            refresh_ms: 2000,
            message: None,
            user: None,
            standby: true,
            contents: false,
        };
        let p = page(Page::Overview, &ctx, "", "");
        assert!(
            p.contains("id=\"standby\"") && p.contains("hot standby"),
            "{p}"
        );
        assert!(!page(
            Page::Overview,
            &Ctx {
                standby: false,
                ..ctx
            },
            "",
            ""
        )
        .contains("standby"));
    }

    #[test]
    fn read_only_pages_have_no_forms() {
        let ctx = Ctx {
            role: "r",
            database: "d",
            admin: false,
            csrf: "tok",
            refresh_ms: 2000,
            message: None,
            user: None,
            standby: false,
            contents: false,
        };
        assert_eq!(
            button(&ctx, Page::Jobs, "retry_job", &[("job_id", "1")], "Retry"),
            ""
        );
        assert_eq!(jobs_fixed(&ctx), "");
        let admin = Ctx { admin: true, ..ctx };
        let b = button(
            &admin,
            Page::Jobs,
            "retry_job",
            &[("job_id", "1\"")],
            "Retry",
        );
        assert!(b.contains("name=\"csrf\" value=\"tok\""));
        assert!(b.contains("value=\"1&quot;\""));
    }

    #[test]
    fn charts_draw_a_point_per_sample() {
        let s = sparkline(&[(0.0, 0.0), (1.0, 5.0), (2.0, 10.0)], "x");
        assert!(
            s.contains("points=\"0.0,26.0 70.0,14.0 140.0,2.0 \""),
            "{s}"
        );
    }

    #[test]
    fn the_login_page_and_the_logout_button() {
        let l = login("/jobs", Some("wrong <secret>"));
        assert!(l.contains("action=\"/login\""));
        assert!(l.contains("type=\"password\""));
        assert!(l.contains("name=\"next\" value=\"/jobs\""));
        assert!(l.contains("wrong &lt;secret&gt;"));
        // next is a page of this dashboard, never a URL elsewhere.
        assert!(login("https://evil.example/", None).contains("name=\"next\" value=\"/\""));
        let ctx = Ctx {
            role: "r",
            database: "d",
            admin: false,
            csrf: "tok",
            refresh_ms: 2000,
            message: None,
            user: Some(("alice", "read")),
            standby: false,
            contents: false,
        };
        let p = page(Page::Overview, &ctx, "", "");
        assert!(p.contains("signed in as <b id=\"user\">alice</b> (read)"));
        assert!(p.contains("action=\"/logout\""));
        assert!(p.contains("name=\"csrf\" value=\"tok\""));
        assert!(!page(Page::Overview, &Ctx { user: None, ..ctx }, "", "").contains("/logout"));
    }
}
