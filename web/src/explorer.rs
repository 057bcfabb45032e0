//! The job explorer: the jobs list (filters, keyset pages, bulk retry and
//! cancel behind a confirmation), one job's page, a flow's graph and the
//! schedules with their actions. Reads only pgque's explorer functions
//! (sql/34_explorer.sql: list_jobs, job_detail, job_timeline, job_children,
//! flow_graph, match_jobs) and job_parents, flow_status, the schedules
//! view, all with bound parameters. What a viewer may not see (contents
//! without an admin login, lease tokens for everyone) is taken out of the
//! rows before a page is made of them (redact_job).
use crate::db::DbError;
use crate::html::{esc, field, pretty, text, urlenc, when, Ctx, Row};
use deadpool_postgres::Pool;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

/// Jobs per page of the list.
pub const PAGE_SIZE: i32 = 50;
/// Most jobs one bulk action changes (the confirmation says when more match).
pub const BULK_MAX: i32 = 10_000;

pub const STATES: &[&str] = &[
    "waiting",
    "scheduled",
    "ready",
    "running",
    "completed",
    "failed",
    "cancelled",
];

/// Runs `sql`, whose rows are one jsonb value each, and returns the objects.
async fn json_rows(
    pool: &Pool,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Row>, DbError> {
    let c = pool.get().await?;
    let rows = c.query(sql, params).await?;
    Ok(rows
        .iter()
        .filter_map(|r| match r.get::<_, Option<Value>>(0) {
            Some(Value::Object(o)) => Some(o),
            _ => None,
        })
        .collect())
}

/// The list's filters, as the query string gives them.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct Filter {
    pub queue: Option<String>,
    pub state: Option<String>,
    pub kind: Option<String>,
    pub q: Option<String>,
    pub before: Option<i64>,
}

fn opt(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

impl Filter {
    pub fn queue(&self) -> Option<&str> {
        opt(&self.queue)
    }
    pub fn state(&self) -> Option<&str> {
        opt(&self.state)
    }
    pub fn kind(&self) -> Option<&str> {
        opt(&self.kind)
    }
    pub fn search(&self) -> Option<&str> {
        opt(&self.q)
    }
    /// The query string of these filters (without `before`), URL-encoded.
    pub fn query(&self) -> String {
        let mut parts = Vec::new();
        for (k, v) in [
            ("queue", self.queue()),
            ("state", self.state()),
            ("kind", self.kind()),
            ("q", self.search()),
        ] {
            if let Some(v) = v {
                parts.push(format!("{k}={}", urlenc(v)));
            }
        }
        parts.join("&")
    }
    /// The filters from a form's fields.
    pub fn from_form(f: &[(String, String)]) -> Filter {
        let get = |k: &str| field(f, k).map(str::to_string);
        Filter {
            queue: get("queue"),
            state: get("state"),
            kind: get("kind"),
            q: get("q"),
            before: None,
        }
    }
}

/// One page of the list: the jobs, and where the next page starts (None:
/// this is the last). `window_end`: the search window ended before the page
/// filled (the page says so and offers to go on).
pub struct JobPage {
    pub jobs: Vec<Row>,
    pub next: Option<i64>,
    pub window_end: bool,
}

/// Takes out of a job's row what the viewer may not see
/// (pages::Ctx::contents): the lease token always (whoever holds it can
/// complete, fail, heartbeat or snooze the job; job_detail leaves it out
/// since pgque 0.9.0, an older pgque still returns it), and without
/// `contents` the args, output, progress, headers and each error's text
/// (its attempt and time stay). Done to the data, before any page is made
/// of it, so that no part of a page can show them.
pub fn redact_job(j: &mut Row, contents: bool) {
    j.remove("lease_token");
    if contents {
        return;
    }
    for k in ["args", "output", "progress", "headers"] {
        j.remove(k);
    }
    if let Some(Value::Array(errors)) = j.get_mut("errors") {
        for e in errors.iter_mut() {
            if let Value::Object(o) = e {
                o.retain(|k, _| k == "attempt" || k == "at");
            }
        }
    }
}

/// pgque.list_jobs for these filters. Without `contents`
/// (pages::Ctx::contents) the last errors are left out, and a text search
/// is refused: the dashboard's role may be pgque_admin, and a search of
/// args and errors would read them out a substring at a time.
pub async fn list(pool: &Pool, f: &Filter, contents: bool) -> Result<JobPage, DbError> {
    if !contents && f.search().is_some() {
        return Err(DbError(
            "searching args and errors needs an admin login (they are contents)".into(),
        ));
    }
    let rows = json_rows(
        pool,
        "SELECT pg_catalog.to_jsonb(l) FROM pgque.list_jobs($1, $2, $3, $4, $5, $6) l",
        &[
            &f.queue(),
            &f.state(),
            &f.kind(),
            &f.search(),
            &f.before,
            &PAGE_SIZE,
        ],
    )
    .await?;
    let last = rows.last().cloned();
    let window_end = last
        .as_ref()
        .is_some_and(|r| r.get("id") == Some(&Value::Null));
    let next = match &last {
        Some(r) if window_end || rows.len() >= PAGE_SIZE as usize => {
            r.get("cursor_id").and_then(Value::as_i64)
        }
        _ => None,
    };
    let jobs = rows
        .into_iter()
        .filter(|r| r.get("id") != Some(&Value::Null))
        .map(|mut r| {
            if !contents {
                r.remove("last_error");
            }
            r
        })
        .collect();
    Ok(JobPage {
        jobs,
        next,
        window_end,
    })
}

/// The CSS class of a state.
fn state_class(s: &str) -> &'static str {
    match s {
        "completed" => "st-completed",
        "failed" => "st-failed",
        "cancelled" => "st-cancelled",
        "running" => "st-running",
        "ready" => "st-ready",
        "scheduled" => "st-scheduled",
        _ => "st-waiting",
    }
}

fn badge(state: &str) -> String {
    format!(
        "<span class=\"st {}\">{}</span>",
        state_class(state),
        esc(state)
    )
}

fn job_link(id: &str) -> String {
    if id.is_empty() {
        return "<span class=\"muted\">–</span>".into();
    }
    format!("<a href=\"/jobs/{0}\">{0}</a>", esc(id))
}

/// The jobs list page's content: the filter form, the bulk bar (admin),
/// the page of jobs and the link to the next one.
pub fn list_page(ctx: &Ctx, f: &Filter, page: &Result<JobPage, String>) -> String {
    let mut o = String::from(
        "<form class=\"filters\" id=\"filters\" method=\"get\" action=\"/jobs/list\">",
    );
    let _ = write!(
        o,
        "<label>queue<input name=\"queue\" id=\"f-queue\" value=\"{}\" size=\"12\"></label>",
        esc(f.queue().unwrap_or(""))
    );
    o.push_str("<label>state<select name=\"state\" id=\"f-state\"><option value=\"\">any</option>");
    for s in STATES {
        let _ = write!(
            o,
            "<option{}>{s}</option>",
            if f.state() == Some(*s) {
                " selected"
            } else {
                ""
            }
        );
    }
    let _ = write!(
        o,
        "</select></label><label>kind<input name=\"kind\" id=\"f-kind\" value=\"{}\" size=\"12\"></label>",
        esc(f.kind().unwrap_or(""))
    );
    // a search reads args and errors: contents (see list)
    if ctx.contents {
        let _ = write!(
            o,
            "<label>args or last error contain<input name=\"q\" id=\"f-q\" value=\"{}\" size=\"24\" maxlength=\"200\"></label>",
            esc(f.search().unwrap_or(""))
        );
    }
    o.push_str(
        "<button type=\"submit\" id=\"f-go\">Filter</button> <a href=\"/jobs/list\">clear</a></form>",
    );
    let page = match page {
        Ok(p) => p,
        Err(e) => {
            let _ = write!(o, "<p class=\"bad\" id=\"list-error\">{}</p>", esc(e));
            return o;
        }
    };
    if ctx.admin {
        let _ = write!(
            o,
            "<form method=\"post\" action=\"/jobs/bulk\" id=\"bulk-form\">\
<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
            esc(ctx.csrf)
        );
        for (k, v) in [
            ("queue", f.queue()),
            ("state", f.state()),
            ("kind", f.kind()),
            ("q", f.search()),
        ] {
            let _ = write!(
                o,
                "<input type=\"hidden\" name=\"{k}\" value=\"{}\">",
                esc(v.unwrap_or(""))
            );
        }
        o.push_str(
            "<div class=\"bulk\"><button type=\"submit\" name=\"op\" value=\"retry-selected\" data-action=\"bulk-retry-selected\">Retry selected</button>\
<button type=\"submit\" name=\"op\" value=\"cancel-selected\" data-action=\"bulk-cancel-selected\">Cancel selected</button>\
<button type=\"submit\" name=\"op\" value=\"retry-filter\" data-action=\"bulk-retry-filter\">Retry all matching…</button>\
<button type=\"submit\" name=\"op\" value=\"cancel-filter\" data-action=\"bulk-cancel-filter\">Cancel all matching…</button></div>",
        );
    }
    o.push_str("<table id=\"job-list\"><thead><tr>");
    if ctx.admin {
        o.push_str(
            "<th><input type=\"checkbox\" id=\"select-all\" title=\"select the page\"></th>",
        );
    }
    o.push_str("<th>id</th><th>queue</th><th>kind</th><th>state</th><th>attempt</th><th>enqueued</th><th>finished</th><th>last error</th><th>stored in</th><th>flow</th></tr></thead><tbody>");
    if page.jobs.is_empty() {
        let _ = write!(
            o,
            "<tr><td colspan=\"11\" class=\"muted\" id=\"no-jobs\">{}</td></tr>",
            if page.window_end {
                "no match among the jobs searched so far"
            } else {
                "no jobs match"
            }
        );
    }
    for r in &page.jobs {
        let id = text(r, "id");
        let st = text(r, "state");
        let _ = write!(
            o,
            "<tr data-job=\"{}\" data-state=\"{}\">",
            esc(&id),
            esc(&st)
        );
        if ctx.admin {
            let _ = write!(
                o,
                "<td><input type=\"checkbox\" name=\"ids\" value=\"{}\"></td>",
                esc(&id)
            );
        }
        let flow = text(r, "flow_id");
        let _ = write!(
            o,
            "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}/{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            job_link(&id),
            esc(&text(r, "queue")),
            esc(&text(r, "kind")),
            badge(&st),
            esc(&text(r, "attempt")),
            esc(&text(r, "max_attempts")),
            esc(&when(r, "enqueued_at")),
            esc(&when(r, "finished_at")),
            if ctx.contents {
                esc(&text(r, "last_error"))
            } else {
                crate::html::hidden_short(ctx)
            },
            esc(&text(r, "stored_in")),
            if flow.is_empty() {
                String::new()
            } else {
                format!("<a href=\"/flows/{0}\">{0}</a>", esc(&flow))
            },
        );
    }
    o.push_str("</tbody></table>");
    if ctx.admin {
        // the header's box selects the page's boxes
        o.push_str(
            "</form><script>(function(){var a=document.getElementById('select-all');\
if(a){a.addEventListener('change',function(){document.querySelectorAll(\"#job-list input[name='ids']\")\
.forEach(function(b){b.checked=a.checked;});});}})();</script>",
        );
    }
    let base = f.query();
    o.push_str("<div class=\"pager\">");
    if f.before.is_some() {
        let _ = write!(
            o,
            "<a id=\"newest\" href=\"/jobs/list{}{}\">« newest</a>",
            if base.is_empty() { "" } else { "?" },
            base
        );
    }
    if let Some(n) = page.next {
        let _ = write!(
            o,
            "<a id=\"older\" href=\"/jobs/list?{}{}before={n}\">{} »</a>",
            base,
            if base.is_empty() { "" } else { "&" },
            if page.window_end {
                "search older jobs"
            } else {
                "older"
            }
        );
    }
    o.push_str("</div>");
    if page.window_end {
        o.push_str("<p class=\"muted\" id=\"window-note\">The kind and text filters look at up to 2,000 jobs per page and store: go on to search older jobs.</p>");
    }
    o
}

/// Which bulk action: retry (failed, cancelled) or cancel (unfinished).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bulk {
    Retry,
    Cancel,
}

impl Bulk {
    pub fn parse(s: &str) -> Option<Bulk> {
        match s {
            "retry" => Some(Bulk::Retry),
            "cancel" => Some(Bulk::Cancel),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Bulk::Retry => "retry",
            Bulk::Cancel => "cancel",
        }
    }
    fn states(self) -> &'static [&'static str] {
        match self {
            Bulk::Retry => &["failed", "cancelled"],
            Bulk::Cancel => &["waiting", "scheduled", "ready", "running"],
        }
    }
}

/// The jobs a bulk action would change: the selected ones in a state it
/// applies to, or (ids None) every job matching the filters
/// (pgque.match_jobs), newest first, at most BULK_MAX + 1.
pub async fn bulk_targets(
    c: &impl deadpool_postgres::GenericClient,
    act: Bulk,
    ids: Option<&[i64]>,
    f: &Filter,
) -> Result<Vec<i64>, DbError> {
    let states: Vec<&str> = act.states().to_vec();
    let rows = match ids {
        Some(ids) => {
            let ids: Vec<i64> = ids.iter().copied().take(BULK_MAX as usize).collect();
            c.query(
                "SELECT g.id FROM pg_catalog.unnest($1::pg_catalog.int8[]) AS i(id)
                   CROSS JOIN LATERAL pgque.get_job(i.id) g
                  WHERE g.state OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.text[]) ORDER BY g.id DESC",
                &[&ids, &states],
            )
            .await?
        }
        None => {
            c.query(
                "SELECT m FROM pgque.match_jobs($1, $2, $3, $4, $5, $6) m",
                &[
                    &act.name(),
                    &f.queue(),
                    &f.state(),
                    &f.kind(),
                    &f.search(),
                    &(BULK_MAX + 1),
                ],
            )
            .await?
        }
    };
    let mut v: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v.dedup();
    Ok(v)
}

/// The digest a confirmation carries: SHA-256 of the ids it counted, so the
/// action changes exactly those or nothing.
pub fn digest(ids: &[i64]) -> String {
    let mut h = Sha256::new();
    for i in ids {
        h.update(i.to_string().as_bytes());
        h.update(b",");
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs a confirmed bulk action in one transaction: the targets are read
/// again and must be those confirmed (same digest), else nothing changes.
/// Returns what to tell the user.
pub async fn bulk_apply(
    pool: &Pool,
    act: Bulk,
    ids: Option<&[i64]>,
    f: &Filter,
    confirmed: &str,
) -> Result<String, DbError> {
    let mut c = pool.get().await?;
    let tx = c.transaction().await?;
    let mut targets = bulk_targets(&tx, act, ids, f).await?;
    targets.truncate(BULK_MAX as usize);
    if digest(&targets) != confirmed {
        return Ok(format!(
            "nothing changed: the jobs to {} are not those confirmed any more ({} now); confirm again",
            act.name(),
            targets.len()
        ));
    }
    let sql = match act {
        Bulk::Retry => {
            "SELECT pg_catalog.count(*) FILTER (WHERE pgque.retry_job(i))
               FROM pg_catalog.unnest($1::pg_catalog.int8[]) AS i"
        }
        Bulk::Cancel => {
            "SELECT pg_catalog.count(*) FILTER (WHERE pgque.cancel(i))
               FROM pg_catalog.unnest($1::pg_catalog.int8[]) AS i"
        }
    };
    let n: i64 = tx.query_one(sql, &[&targets]).await?.get(0);
    tx.commit().await?;
    Ok(match act {
        Bulk::Retry => format!("{n} of {} jobs are ready again", targets.len()),
        Bulk::Cancel => format!("{n} of {} jobs cancelled", targets.len()),
    })
}

/// The confirmation page's content: how many jobs the action changes, the
/// first of them, and the form that runs it (with their digest).
pub fn confirm_page(
    ctx: &Ctx,
    act: Bulk,
    ids: Option<&[i64]>,
    f: &Filter,
    targets: &[i64],
) -> String {
    let more = targets.len() > BULK_MAX as usize;
    let shown = &targets[..targets.len().min(BULK_MAX as usize)];
    let back = format!("/jobs/list?{}", f.query());
    let mut o = String::new();
    let _ = write!(
        o,
        "<p id=\"confirm-count\" data-count=\"{n}\">This will <b>{a}</b> <b>{n}</b> job{s}{more}.</p>",
        a = act.name(),
        n = shown.len(),
        s = if shown.len() == 1 { "" } else { "s" },
        more = if more {
            format!(" (the newest {BULK_MAX}; more match: run it again afterwards)")
        } else {
            String::new()
        }
    );
    let _ = write!(
        o,
        "<p class=\"muted\">{}</p>",
        match ids {
            Some(sel) => format!(
                "Of the {} selected jobs, those in a state {} applies to ({}).",
                sel.len(),
                act.name(),
                act.states().join(", ")
            ),
            None => format!(
                "Every job matching queue={}, state={}, kind={}, search={}, in a state {} applies to ({}).",
                f.queue().unwrap_or("any"),
                f.state().unwrap_or("any"),
                f.kind().unwrap_or("any"),
                f.search().unwrap_or("none"),
                act.name(),
                act.states().join(", ")
            ),
        }
        .replace('&', "&amp;")
        .replace('<', "&lt;")
    );
    if !shown.is_empty() {
        o.push_str("<p id=\"confirm-ids\">");
        for (i, id) in shown.iter().take(100).enumerate() {
            if i > 0 {
                o.push_str(", ");
            }
            o.push_str(&job_link(&id.to_string()));
        }
        if shown.len() > 100 {
            let _ = write!(o, " … and {} more", shown.len() - 100);
        }
        o.push_str("</p>");
    }
    if ctx.admin && !shown.is_empty() {
        let _ = write!(
            o,
            "<form method=\"post\" action=\"/action/bulk_{a}\" id=\"confirm-form\">\
<input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"back\" value=\"{back}\">\
<input type=\"hidden\" name=\"digest\" value=\"{d}\">",
            a = act.name(),
            csrf = esc(ctx.csrf),
            back = esc(&back),
            d = digest(shown)
        );
        match ids {
            Some(sel) => {
                let list: Vec<String> = sel.iter().map(i64::to_string).collect();
                let _ = write!(
                    o,
                    "<input type=\"hidden\" name=\"selected\" value=\"{}\">",
                    list.join(",")
                );
            }
            None => {
                for (k, v) in [
                    ("queue", f.queue()),
                    ("state", f.state()),
                    ("kind", f.kind()),
                    ("q", f.search()),
                ] {
                    let _ = write!(
                        o,
                        "<input type=\"hidden\" name=\"{k}\" value=\"{}\">",
                        esc(v.unwrap_or(""))
                    );
                }
            }
        }
        let _ = write!(
            o,
            "<button type=\"submit\" id=\"confirm\" data-action=\"bulk_{a}\">Yes, {a} {n} job{s}</button></form>",
            a = act.name(),
            n = shown.len(),
            s = if shown.len() == 1 { "" } else { "s" }
        );
    }
    let _ = write!(
        o,
        "<p><a id=\"confirm-back\" href=\"{}\">Back to the list</a></p>",
        esc(&back)
    );
    o
}

/// Everything the job page shows.
pub struct JobData {
    pub job: Option<Row>,
    pub timeline: Vec<Row>,
    pub parents: Vec<Row>,
    pub children: Vec<Row>,
}

/// A job's page data, with what the viewer may not see taken out
/// (redact_job; without `contents` also the error texts of its history and
/// its parents' outputs).
pub async fn job(pool: &Pool, id: i64, contents: bool) -> Result<JobData, DbError> {
    let mut d = job_rows(pool, id).await?;
    if let Some(j) = d.job.as_mut() {
        redact_job(j, contents);
    }
    if !contents {
        for t in d.timeline.iter_mut() {
            // a failed or retried attempt's detail is the worker's error text
            if matches!(text(t, "event").as_str(), "failed" | "retried") {
                t.remove("detail");
            }
        }
        for p in d.parents.iter_mut() {
            p.remove("output");
        }
    }
    Ok(d)
}

async fn job_rows(pool: &Pool, id: i64) -> Result<JobData, DbError> {
    let job = json_rows(pool, "SELECT pgque.job_detail($1)", &[&id])
        .await?
        .into_iter()
        .next();
    if job.is_none() {
        return Ok(JobData {
            job,
            timeline: vec![],
            parents: vec![],
            children: vec![],
        });
    }
    Ok(JobData {
        job,
        timeline: json_rows(
            pool,
            "SELECT pg_catalog.to_jsonb(t) FROM pgque.job_timeline($1) t",
            &[&id],
        )
        .await?,
        parents: json_rows(
            pool,
            "SELECT pg_catalog.to_jsonb(p) FROM pgque.job_parents($1) p",
            &[&id],
        )
        .await?,
        children: json_rows(
            pool,
            "SELECT pg_catalog.to_jsonb(c) FROM pgque.job_children($1) c",
            &[&id],
        )
        .await?,
    })
}

/// An admin button of the explorer: a POST with the CSRF token that comes
/// back to `back`. Empty for a viewer without admin actions.
fn button(ctx: &Ctx, action: &str, fields: &[(&str, &str)], back: &str, label: &str) -> String {
    if !ctx.admin {
        return String::new();
    }
    let mut f = format!(
        "<form class=\"inline\" method=\"post\" action=\"/action/{action}\">\
<input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"back\" value=\"{}\">",
        esc(ctx.csrf),
        esc(back)
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

/// The job page's content.
pub fn job_page(ctx: &Ctx, id: i64, d: &JobData) -> String {
    let Some(j) = &d.job else {
        return format!("<p class=\"muted\" id=\"no-job\">No job {id} (unknown, or pruned).</p>");
    };
    let st = text(j, "state");
    let back = format!("/jobs/{id}");
    let mut o = String::new();
    let _ = write!(o, "<div class=\"bulk\">{} ", badge(&st));
    if ["failed", "cancelled"].contains(&st.as_str()) {
        o.push_str(&button(
            ctx,
            "retry_job",
            &[("job_id", &id.to_string())],
            &back,
            "Retry",
        ));
    }
    if ["waiting", "scheduled", "ready", "running"].contains(&st.as_str()) {
        o.push_str(&button(
            ctx,
            "cancel_job",
            &[("job_id", &id.to_string())],
            &back,
            "Cancel",
        ));
    }
    o.push_str("</div><dl class=\"job\" id=\"job\">");
    let flow = text(j, "flow_id");
    for (k, label) in [
        ("id", "id"),
        ("queue", "queue"),
        ("kind", "kind"),
        ("state", "state"),
        ("attempt", "attempt"),
        ("max_attempts", "max attempts"),
        ("priority", "priority"),
        ("enqueued_at", "enqueued"),
        ("run_at", "run at"),
        ("dispatched_at", "dispatched"),
        ("finished_at", "finished"),
        ("worker", "worker"),
        ("lease_until", "lease until"),
        ("actor", "actor"),
        ("fairness_key", "fairness key"),
        ("identity_key", "identity key"),
        ("unique_key", "unique key"),
        ("stored_in", "stored in"),
        ("flow_key", "key in its flow"),
    ] {
        let v = if k.ends_with("_at") || k == "lease_until" {
            when(j, k)
        } else {
            text(j, k)
        };
        let _ = write!(
            o,
            "<dt>{label}</dt><dd data-field=\"{k}\" data-raw=\"{}\">{}</dd>",
            esc(&text(j, k)),
            if v.is_empty() {
                "<span class=\"muted\">–</span>".to_string()
            } else {
                esc(&v)
            }
        );
    }
    let _ = write!(
        o,
        "<dt>flow</dt><dd data-field=\"flow_id\">{}</dd></dl>",
        if flow.is_empty() {
            "<span class=\"muted\">–</span>".to_string()
        } else {
            format!(
                "<a href=\"/flows/{0}\" id=\"flow-link\">flow {0}</a>",
                esc(&flow)
            )
        }
    );
    if !ctx.contents {
        let _ = write!(
            o,
            "<h2>Args, output, progress, headers and error texts</h2><p id=\"contents-hidden\">{}</p>",
            crate::html::hidden(ctx)
        );
    } else {
        let _ = write!(
            o,
            "<h2>Args</h2><pre id=\"args\">{}</pre>",
            esc(&pretty(j.get("args")))
        );
    }
    // trace context the producer attached (docs/tracing.md); these and the
    // error texts below are contents: only for a viewer with them, even
    // when the row still holds them
    let shown = |k: &str| j.get(k).filter(|v| ctx.contents && !v.is_null());
    if let Some(h) = shown("headers") {
        let _ = write!(
            o,
            "<h2>Headers</h2><pre id=\"headers\">{}</pre>",
            esc(&pretty(Some(h)))
        );
    }
    if let Some(p) = shown("progress") {
        let _ = write!(
            o,
            "<h2>Progress</h2><pre id=\"progress\">{}</pre>",
            esc(&pretty(Some(p)))
        );
    }
    if let Some(p) = shown("output") {
        let _ = write!(
            o,
            "<h2>Output</h2><pre id=\"output\">{}</pre>",
            esc(&pretty(Some(p)))
        );
    }
    let errors = j
        .get("errors")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    o.push_str("<h2>Attempts and errors</h2>");
    if errors.is_empty() {
        o.push_str("<p class=\"muted\" id=\"no-errors\">no failed attempt</p>");
    } else {
        o.push_str("<table id=\"errors\"><thead><tr><th>attempt</th><th>at</th><th>error</th></tr></thead><tbody>");
        for e in &errors {
            let Some(e) = e.as_object() else { continue };
            // a multi-line error is a traceback the worker put in its message
            let msg = if ctx.contents {
                text(e, "error")
            } else {
                String::new()
            };
            let shown = match msg.split_once('\n') {
                _ if !ctx.contents => crate::html::hidden(ctx),
                Some((first, _)) => {
                    format!("{}<pre class=\"traceback\">{}</pre>", esc(first), esc(&msg))
                }
                None => esc(&msg),
            };
            let _ = write!(
                o,
                "<tr class=\"error\"><td class=\"n\">{}</td><td>{}</td><td data-error=\"{}\">{shown}",
                esc(&text(e, "attempt")),
                esc(&when(e, "at")),
                esc(&msg)
            );
            for tk in ["traceback", "stacktrace", "backtrace"] {
                let t = if ctx.contents {
                    text(e, tk)
                } else {
                    String::new()
                };
                if !t.is_empty() {
                    let _ = write!(o, "<pre class=\"traceback\">{}</pre>", esc(&t));
                }
            }
            o.push_str("</td></tr>");
        }
        o.push_str("</tbody></table>");
    }
    o.push_str("<h2>History</h2><table id=\"timeline\"><thead><tr><th>at</th><th>event</th><th>attempt</th><th>detail</th><th>from</th></tr></thead><tbody>");
    for t in &d.timeline {
        let ev = text(t, "event");
        let _ = write!(
            o,
            "<tr data-event=\"{ev}\"><td>{}</td><td>{ev}</td><td class=\"n\">{}</td><td>{}</td><td class=\"muted\">{}</td></tr>",
            esc(&when(t, "at")),
            esc(&text(t, "attempt")),
            if !ctx.contents && matches!(ev.as_str(), "failed" | "retried") {
                crate::html::hidden(ctx)
            } else {
                esc(&text(t, "detail"))
            },
            esc(&text(t, "source")),
            ev = esc(&ev),
        );
    }
    o.push_str("</tbody></table>");
    for (title, rows, id) in [
        ("Parents", &d.parents, "parents"),
        ("Children", &d.children, "children"),
    ] {
        if rows.is_empty() {
            continue;
        }
        let _ = write!(o, "<h2>{title}</h2><table id=\"{id}\"><thead><tr><th>job</th><th>key</th><th>state</th></tr></thead><tbody>");
        for r in rows.iter() {
            let jid = text(r, "job_id");
            let st = text(r, "state");
            let _ = write!(
                o,
                "<tr data-job=\"{}\"><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&jid),
                job_link(&jid),
                esc(&text(r, "key")),
                if st.is_empty() {
                    "<span class=\"muted\">pruned</span>".into()
                } else {
                    badge(&st)
                }
            );
        }
        o.push_str("</tbody></table>");
    }
    o
}

/// A flow's jobs and its counts by state.
pub struct FlowData {
    pub nodes: Vec<Row>,
    pub status: Option<Row>,
}

/// Most jobs the flow page draws.
pub const FLOW_MAX: i32 = 500;

pub async fn flow(pool: &Pool, id: i64) -> Result<FlowData, DbError> {
    Ok(FlowData {
        nodes: json_rows(
            pool,
            "SELECT pg_catalog.to_jsonb(g) FROM pgque.flow_graph($1, $2) g",
            &[&id, &FLOW_MAX],
        )
        .await?,
        status: json_rows(
            pool,
            "SELECT pg_catalog.to_jsonb(s) FROM pgque.flow_status($1) s",
            &[&id],
        )
        .await?
        .into_iter()
        .next(),
    })
}

/// Depth of each node: 0 without parents in the flow, else one more than
/// its deepest parent's. Nodes come in id order and a parent's id is lower
/// than its child's in a flow (enqueue_flow takes ids in order); a parent
/// that is not drawn does not count.
pub fn depths(nodes: &[(i64, Vec<i64>)]) -> HashMap<i64, usize> {
    let mut d: HashMap<i64, usize> = HashMap::new();
    let mut sorted: Vec<&(i64, Vec<i64>)> = nodes.iter().collect();
    sorted.sort_by_key(|n| n.0);
    // ids are ascending along edges, but be safe: iterate to a fixed point
    for _ in 0..2 {
        for (id, parents) in &sorted {
            let v = parents
                .iter()
                .filter_map(|p| d.get(p).map(|x| x + 1))
                .max()
                .unwrap_or(0);
            d.insert(*id, v);
        }
    }
    d
}

/// The flow page's content: counts by state and the graph (inline SVG,
/// one column per depth, each node a link to its job coloured by state).
pub fn flow_page(id: i64, d: &FlowData) -> String {
    let Some(s) = &d.status else {
        return format!("<p class=\"muted\" id=\"no-flow\">No flow {id} (unknown, or its jobs were pruned).</p>");
    };
    let mut o = String::from("<div class=\"cards\" id=\"flow-counts\">");
    for k in [
        "total",
        "waiting",
        "scheduled",
        "ready",
        "running",
        "completed",
        "failed",
        "cancelled",
    ] {
        let _ = write!(
            o,
            "<div class=\"card\" data-count=\"{k}\" data-value=\"{v}\"><b>{v}</b><span>{k}</span></div>",
            v = esc(&text(s, k))
        );
    }
    o.push_str("</div>");
    let nodes: Vec<(i64, Vec<i64>)> = d
        .nodes
        .iter()
        .map(|r| {
            (
                r.get("job_id").and_then(Value::as_i64).unwrap_or(0),
                r.get("parents")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_i64).collect())
                    .unwrap_or_default(),
            )
        })
        .collect();
    let depth = depths(&nodes);
    const W: f64 = 150.0;
    const H: f64 = 34.0;
    const GX: f64 = 60.0;
    const GY: f64 = 14.0;
    let mut rows_at: BTreeMap<usize, usize> = BTreeMap::new();
    let mut pos: HashMap<i64, (f64, f64)> = HashMap::new();
    for (id, _) in &nodes {
        let dd = depth.get(id).copied().unwrap_or(0);
        let r = rows_at.entry(dd).or_insert(0);
        pos.insert(
            *id,
            (10.0 + dd as f64 * (W + GX), 10.0 + *r as f64 * (H + GY)),
        );
        *r += 1;
    }
    let cols = rows_at.keys().max().map_or(1, |m| m + 1);
    let rows = rows_at.values().max().copied().unwrap_or(1);
    let sw = 20.0 + cols as f64 * (W + GX) - GX;
    let sh = 20.0 + rows as f64 * (H + GY) - GY;
    let _ = write!(
        o,
        "<h2>Graph</h2><svg class=\"flow\" id=\"flow-graph\" viewBox=\"0 0 {sw} {sh}\" width=\"{sw}\" height=\"{sh}\" role=\"img\" aria-label=\"flow {id}\">"
    );
    for (id, parents) in &nodes {
        let (x, y) = pos[id];
        for p in parents {
            if let Some((px, py)) = pos.get(p) {
                let _ = write!(
                    o,
                    "<line class=\"edge\" data-from=\"{p}\" data-to=\"{id}\" x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#9aa4b5\" stroke-width=\"1.4\"/>",
                    px + W,
                    py + H / 2.0,
                    y + H / 2.0
                );
            }
        }
    }
    let fill = |s: &str| match s {
        "completed" => "#17803d",
        "failed" => "#b42318",
        "cancelled" => "#6b7280",
        "running" => "#3b6fd8",
        "ready" => "#0e7490",
        "scheduled" => "#9b4dca",
        _ => "#b54708",
    };
    for r in &d.nodes {
        let jid = r.get("job_id").and_then(Value::as_i64).unwrap_or(0);
        let (x, y) = pos[&jid];
        let st = text(r, "state");
        let key = text(r, "key");
        let label: String = key.chars().take(18).collect();
        let _ = write!(
            o,
            "<a href=\"/jobs/{jid}\"><g class=\"node\" data-job=\"{jid}\" data-state=\"{se}\"><title>job {jid} {ke} ({kind}): {se}</title>\
<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{W}\" height=\"{H}\" rx=\"5\" fill=\"{f}\"/>\
<text x=\"{tx:.1}\" y=\"{ty:.1}\">{le}</text><text x=\"{tx:.1}\" y=\"{ty2:.1}\">#{jid} · {se}</text></g></a>",
            se = esc(&st),
            ke = esc(&key),
            kind = esc(&text(r, "kind")),
            le = esc(&label),
            f = fill(&st),
            tx = x + 7.0,
            ty = y + 14.0,
            ty2 = y + 28.0,
        );
    }
    o.push_str("</svg>");
    if d.nodes.len() >= FLOW_MAX as usize {
        let _ = write!(
            o,
            "<p class=\"muted\">The first {FLOW_MAX} jobs of the flow are drawn.</p>"
        );
    }
    o
}

/// The schedules view's rows, by name (at most 1000), each with the state
/// of the job it last fired (`last_job_state`; NULL when none or pruned)
/// and `recent`, the jobs of its last firings (at most 10, newest first, as
/// the row keeps them) with their states: a lookup by id each, whatever the
/// number of jobs or firings.
/// Without `contents` (pages::Ctx::contents) the args each schedule fires
/// its jobs with are left out.
pub async fn schedules(pool: &Pool, contents: bool) -> Result<Option<Vec<Row>>, DbError> {
    let c = pool.get().await?;
    let exists: bool = c
        .query_one(
            "SELECT pg_catalog.to_regclass('pgque.schedules'::pg_catalog.text) IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    drop(c);
    if !exists {
        return Ok(None);
    }
    Ok(Some(
        json_rows(
            pool,
            "SELECT pg_catalog.to_jsonb(s) OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object(
                        'last_job_state',
                        pgque.job_detail(s.last_job_id) OPERATOR(pg_catalog.->>) 'state'::pg_catalog.text,
                        'recent', (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                                              'id', u.id,
                                              'state', pgque.job_detail(u.id)
                                                       OPERATOR(pg_catalog.->>) 'state'::pg_catalog.text)
                                              ORDER BY u.o), '[]'::pg_catalog.jsonb)
                                     FROM pg_catalog.unnest(s.recent_job_ids) WITH ORDINALITY AS u(id, o)))
               FROM pgque.schedules s ORDER BY s.name LIMIT 1000",
            &[],
        )
        .await?
        .into_iter()
        .map(|mut r| {
            if !contents {
                r.remove("args");
            }
            r
        })
        .collect(),
    ))
}

/// The schedules page's content: each schedule's next and last firing, the
/// job it last fired (a link, and its state now) and, for an admin, pause /
/// resume / run now.
pub fn schedules_page(ctx: &Ctx, s: &Result<Option<Vec<Row>>, String>) -> String {
    let rows = match s {
        Ok(None) => return "<p class=\"muted\" id=\"no-schedules\">This pgque has no schedules (view pgque.schedules does not exist).</p>".into(),
        Ok(Some(r)) if r.is_empty() => return "<p class=\"muted\" id=\"no-schedules\">No schedules (pgque.create_schedule).</p>".into(),
        Ok(Some(r)) => r,
        Err(e) => return format!("<p class=\"bad\">{}</p>", esc(e)),
    };
    let mut o = String::from("<div id=\"schedules\"><table id=\"schedule-list\"><thead><tr><th>name</th><th>cron</th><th>timezone</th><th>queue</th><th>kind</th><th>args</th><th>misfire</th><th>state</th><th>next firing</th><th>last firing</th><th>last job</th><th>recent firings</th>");
    if ctx.admin {
        o.push_str("<th>actions</th>");
    }
    o.push_str("</tr></thead><tbody>");
    for r in rows {
        let name = text(r, "name");
        let paused = r.get("paused") == Some(&Value::Bool(true));
        let _ = write!(
            o,
            "<tr data-schedule=\"{n}\"><td>{n}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td class=\"{}\">{}</td>\
<td data-field=\"next_run_at\" data-raw=\"{}\">{}</td><td data-field=\"last_run_at\" data-raw=\"{}\">{}</td><td data-field=\"last_job_id\" data-state=\"{}\">{}{} \
<a class=\"muted\" href=\"/jobs/list?queue={}&amp;kind={}\" title=\"the newest jobs of its queue and kind\">all</a></td>",
            esc(&text(r, "cron")),
            esc(&text(r, "timezone")),
            esc(&text(r, "queue_name")),
            esc(&text(r, "kind")),
            if ctx.contents {
                esc(&text(r, "args"))
            } else {
                crate::html::hidden_short(ctx)
            },
            esc(&text(r, "misfire")),
            if paused { "warn" } else { "ok" },
            if paused { "paused" } else { "active" },
            esc(&text(r, "next_run_at")),
            if paused { "<span class=\"muted\">paused</span>".into() } else { esc(&when(r, "next_run_at")) },
            esc(&text(r, "last_run_at")),
            esc(&when(r, "last_run_at")),
            esc(&text(r, "last_job_state")),
            job_link(&text(r, "last_job_id")),
            match text(r, "last_job_state") {
                st if st.is_empty() => String::new(),
                st => format!(" {}", badge(&st)),
            },
            urlenc(&text(r, "queue_name")),
            urlenc(&text(r, "kind")),
            n = esc(&name),
        );
        o.push_str(&recent_firings(r));
        if ctx.admin {
            o.push_str("<td>");
            let f = [("schedule", name.as_str())];
            if paused {
                o.push_str(&button(ctx, "resume_schedule", &f, "/schedules", "Resume"));
            } else {
                o.push_str(&button(ctx, "pause_schedule", &f, "/schedules", "Pause"));
                o.push_str(&button(ctx, "run_schedule", &f, "/schedules", "Run now"));
            }
            o.push_str("</td>");
        }
        o.push_str("</tr>");
    }
    o.push_str("</tbody></table></div>");
    o
}

/// A schedule's recent firings cell: each job (newest first) linked to its
/// page with its state now (none: pruned by retention).
fn recent_firings(r: &Row) -> String {
    let mut o = String::from("<td class=\"recent\">");
    let list = r.get("recent").and_then(Value::as_array);
    for j in list.into_iter().flatten() {
        let id = j.get("id").map(|v| v.to_string()).unwrap_or_default();
        let state = j.get("state").and_then(Value::as_str).unwrap_or("");
        let _ = write!(
            o,
            "<span class=\"firing\" data-job=\"{}\" data-state=\"{}\">{}{}</span> ",
            esc(&id),
            esc(state),
            job_link(&id),
            if state.is_empty() {
                " <span class=\"muted\">pruned</span>".to_string()
            } else {
                format!(" {}", badge(state))
            }
        );
    }
    if list.is_none_or(|l| l.is_empty()) {
        o.push_str("<span class=\"muted\">–</span>");
    }
    o.push_str("</td>");
    o
}

/// A schedule action (admin): pause, resume, or run now.
pub async fn schedule_action(pool: &Pool, action: &str, name: &str) -> Result<String, DbError> {
    let c = pool.get().await?;
    Ok(match action {
        "pause_schedule" => {
            c.execute("SELECT pgque.pause_schedule($1)", &[&name])
                .await?;
            format!("schedule {name} paused")
        }
        "resume_schedule" => {
            c.execute("SELECT pgque.resume_schedule($1)", &[&name])
                .await?;
            format!("schedule {name} resumed")
        }
        _ => {
            let id: i64 = c
                .query_one("SELECT pgque.run_schedule_now($1)", &[&name])
                .await?
                .get(0);
            format!("schedule {name} fired job {id}")
        }
    })
}

/// Whether `back` is a page of this dashboard a form may return to: a
/// path (never another site), of safe characters.
pub fn safe_back(back: &str) -> bool {
    back.starts_with('/')
        && !back.starts_with("//")
        && back.len() < 1000
        && back
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_-.?=&%+~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_row_loses_its_token_always_and_its_contents_without_them() {
        let row: Row = serde_json::from_str(
            r#"{"id": 7, "state": "running", "attempt": 2, "lease_token": 41,
                "args": {"to": "x@example.test"}, "output": {"o": 1}, "progress": {"p": 1},
                "headers": {"traceparent": "00-a-b-01"},
                "errors": [{"attempt": 1, "at": "2026-01-01T00:00:00Z", "error": "boom\nTraceback",
                            "traceback": "t"}]}"#,
        )
        .unwrap();
        let mut admin = row.clone();
        redact_job(&mut admin, true);
        assert!(!admin.contains_key("lease_token"));
        assert_eq!(admin.get("args"), row.get("args"));
        assert_eq!(admin.get("errors"), row.get("errors"));
        let mut reader = row.clone();
        redact_job(&mut reader, false);
        let mut keys: Vec<&String> = reader.keys().collect();
        keys.sort();
        assert_eq!(keys, ["attempt", "errors", "id", "state"]);
        assert_eq!(
            reader["errors"],
            serde_json::json!([{"attempt": 1, "at": "2026-01-01T00:00:00Z"}])
        );
    }

    #[test]
    fn a_job_page_shows_contents_only_to_a_viewer_with_them_and_never_a_token() {
        let ctx = Ctx {
            role: "r",
            database: "d",
            admin: false,
            csrf: "tok",
            refresh_ms: 2000,
            message: None,
            user: Some(("bob", "read")),
            standby: false,
            contents: false,
        };
        let row: Row = serde_json::from_str(
            r#"{"id": 7, "state": "failed", "attempt": 1, "lease_token": 41,
                "args": {"to": "x@example.test"}, "output": {"o": "out-secret"},
                "errors": [{"attempt": 1, "at": "2026-01-01T00:00:00Z", "error": "err-secret"}]}"#,
        )
        .unwrap();
        let timeline: Row = serde_json::from_str(
            r#"{"at": "2026-01-01T00:00:00Z", "event": "failed", "attempt": 1, "detail": "err-secret"}"#,
        )
        .unwrap();
        let d = |j: &Row| JobData {
            job: Some(j.clone()),
            timeline: vec![timeline.clone()],
            parents: vec![],
            children: vec![],
        };
        // even rows that still carry them (a dashboard role in pgque_admin)
        let p = job_page(&ctx, 7, &d(&row));
        for s in [
            "example.test",
            "out-secret",
            "err-secret",
            "lease token",
            "41",
        ] {
            assert!(!p.contains(s), "{s} on a read login's page: {p}");
        }
        assert!(p.contains("id=\"contents-hidden\"") && p.contains("an admin login sees it"));
        let admin = Ctx {
            user: Some(("alice", "admin")),
            contents: true,
            ..ctx
        };
        let mut j = row.clone();
        redact_job(&mut j, true);
        let p = job_page(&admin, 7, &d(&j));
        for s in ["example.test", "out-secret", "err-secret"] {
            assert!(p.contains(s), "{s} not on an admin login's page");
        }
        assert!(
            !p.contains("lease token") && !p.contains("data-hidden"),
            "{p}"
        );
    }

    #[test]
    fn depths_follow_the_longest_path() {
        let d = depths(&[
            (1, vec![]),
            (2, vec![1]),
            (3, vec![1]),
            (4, vec![2, 3]),
            (5, vec![1, 4]),
        ]);
        assert_eq!((d[&1], d[&2], d[&3], d[&4], d[&5]), (0, 1, 1, 2, 3));
        // a parent that is not drawn does not count
        assert_eq!(depths(&[(7, vec![3])])[&7], 0);
    }

    #[test]
    fn back_is_a_local_path() {
        assert!(safe_back("/jobs/12"));
        assert!(safe_back("/jobs/list?queue=emails&state=failed"));
        for bad in [
            "//evil.example/",
            "https://evil.example/",
            "/jobs\"><script>",
            "jobs",
        ] {
            assert!(!safe_back(bad), "{bad}");
        }
    }

    #[test]
    fn the_digest_names_the_set() {
        assert_eq!(digest(&[3, 2, 1]), digest(&[3, 2, 1]));
        assert_ne!(digest(&[3, 2, 1]), digest(&[3, 2]));
        assert_ne!(digest(&[12, 3]), digest(&[1, 23]));
    }

    #[test]
    fn filters_make_a_query_string() {
        let f = Filter {
            queue: Some("a b".into()),
            state: Some("".into()),
            kind: None,
            q: Some("x&y".into()),
            before: Some(5),
        };
        assert_eq!(f.query(), "queue=a%20b&q=x%26y");
    }
}
