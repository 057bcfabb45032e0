//! The dashboard's HTML kit, below every page: what each page needs besides
//! its data (`Ctx`), escaping and formatting, the row helpers of the JSON the
//! explorer functions return, and each page family's CSS, which the layout in
//! pages.rs puts into every page. Nothing here imports a page.
use serde_json::{Map, Value};
use std::fmt::Write;

/// What every page needs besides its data.
pub struct Ctx<'a> {
    pub role: &'a str,
    pub database: &'a str,
    pub admin: bool,
    pub csrf: &'a str,
    pub refresh_ms: u64,
    pub message: Option<&'a str>,
    /// The logged-in user's name and role (`admin` / `read`); None when
    /// the dashboard has no login.
    pub user: Option<(&'a str, &'a str)>,
    /// The database server is a hot standby (in recovery): the pages are
    /// read-only whatever the role, and say so.
    pub standby: bool,
    /// May see contents (job args, outputs, progress, error texts, event and
    /// dead-letter payloads, headers, dead-letter reasons): an admin login on
    /// a dashboard whose database role is in pgque_admin. Everyone else gets
    /// them left out of the data before a page is made ([`hidden`] says so
    /// where they would be), as pgque's own functions leave them out for
    /// roles without pgque_admin. Lease tokens nobody sees.
    pub contents: bool,
}

/// Why the viewer sees no contents (pages::Ctx::contents).
fn hidden_reason(ctx: &Ctx) -> &'static str {
    match ctx.user {
        Some((_, "admin")) => "hidden: the dashboard's database role is not in pgque_admin",
        _ => "hidden: an admin login sees it",
    }
}

/// What a page shows in place of contents the viewer may not see.
pub fn hidden(ctx: &Ctx) -> String {
    format!(
        "<span class=\"muted hidden-contents\" data-hidden=\"contents\">{}</span>",
        hidden_reason(ctx)
    )
}

/// `hidden`, in a table cell's width: "hidden" with the reason as its title.
pub fn hidden_short(ctx: &Ctx) -> String {
    format!(
        "<span class=\"muted hidden-contents\" data-hidden=\"contents\" title=\"{}\">hidden</span>",
        hidden_reason(ctx)
    )
}

pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// A count as an integer, anything else with up to three decimals.
pub fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A row as a JSON object.
pub type Row = Map<String, Value>;

/// A value as text: strings as they are, null as "", others as JSON.
pub fn text(r: &Row, k: &str) -> String {
    match r.get(k) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// A timestamp as people read it: to the second, without the `T`.
pub fn when(r: &Row, k: &str) -> String {
    let t = text(r, k);
    if t.len() >= 19 && t.as_bytes()[10] == b'T' {
        format!("{} {}", &t[..10], &t[11..19])
    } else {
        t
    }
}

/// The first value of a form field.
pub fn field<'a>(f: &'a [(String, String)], k: &str) -> Option<&'a str> {
    f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

/// Percent-encodes everything but unreserved characters.
pub fn urlenc(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' || b == b'~' {
            o.push(b as char);
        } else {
            let _ = write!(o, "%{b:02X}");
        }
    }
    o
}

/// A JSON value pretty-printed (job and event pages); empty for none or null.
pub fn pretty(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(v) => serde_json::to_string_pretty(v).unwrap_or_default(),
    }
}

/// The states' colours, for the list's badges and the flow graph's nodes.
pub const EXPLORER_CSS: &str = r#"
.st{padding:.05rem .45rem;border-radius:9px;font-size:.8rem;color:#fff;white-space:nowrap}
.st-completed{background:#17803d}.st-failed{background:#b42318}.st-cancelled{background:#6b7280}
.st-running{background:#3b6fd8}.st-ready{background:#0e7490}.st-scheduled{background:#9b4dca}.st-waiting{background:#b54708}
form.filters{display:flex;gap:.6rem;flex-wrap:wrap;align-items:end;margin-bottom:.8rem}
form.filters label{font-size:.8rem;display:flex;flex-direction:column;gap:.15rem}
form.filters input,form.filters select{font-size:.9rem;padding:.2rem}
.bulk{margin:.6rem 0;display:flex;gap:.5rem;flex-wrap:wrap}
dl.job{display:grid;grid-template-columns:11rem 1fr;gap:.25rem .8rem;background:#fff;padding:.8rem 1rem;border-radius:6px}
dl.job dt{color:#5a6475}dl.job dd{margin:0;word-break:break-all}
pre{background:#fff;padding:.6rem .8rem;border-radius:6px;overflow:auto;font-size:.85rem;max-height:24rem}
.pager{margin:.8rem 0;display:flex;gap:1rem}
svg.flow{background:#fff;border-radius:6px}svg.flow text{font-size:11px;fill:#fff}
"#;

pub const EVENTS_CSS: &str = "td.payload{max-width:28rem;word-break:break-all}td.payload code{font-size:.8rem}\
td.headers pre{margin:0;padding:.2rem .4rem;font-size:.75rem;white-space:pre-wrap;word-break:break-all;max-width:24rem}";

pub const CHARTS_CSS: &str = "nav.range a{margin:0 .3rem;padding:.05rem .4rem;border-radius:4px}nav.range a.on{background:#1d2330;color:#fff}";
