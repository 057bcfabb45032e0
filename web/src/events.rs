//! The page of one event queue: the events its consumers have still to
//! process, the open batch of each consumer and the dead letters (their
//! payloads, headers and reasons for an admin login only: redact_event), a
//! page at a time (pgque.browse_events, get_consumer_info,
//! get_batch_info, pgque.browse_dead_letters: sql/35_event_browser.sql);
//! and replaying or purging selected dead letters (admin) behind a
//! confirmation of their count, through pgque.dlq_replay and the
//! pgque.dead_letter view, each all or nothing.
use crate::db::DbError;
use crate::html::{esc, pretty, text, urlenc, when, Ctx, Row};
use deadpool_postgres::Pool;
use serde_json::Value;
use std::fmt::Write;

/// Rows per page of events and of dead letters.
pub const PAGE_SIZE: i64 = 50;
/// Most dead letters one replay or purge takes (a page's worth of ticks).
pub const SELECT_MAX: usize = 1000;
/// Payload characters shown per row (the rest behind the row's title).
const PAYLOAD_SHOWN: usize = 240;

/// Where a page of the queue's page starts: the events' cursor
/// (transaction, id) and the dead letters' (below this id).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cursor {
    pub after: Option<(i64, i64)>,
    pub dl_before: Option<i64>,
}

impl Cursor {
    /// From the query string (after_txid, after_id, dl_before). Err: a
    /// value that is not a number.
    pub fn from_query(q: &[(String, String)]) -> Result<Cursor, String> {
        let num = |k: &str| -> Result<Option<i64>, String> {
            match crate::html::field(q, k)
                .map(str::trim)
                .filter(|s| !s.is_empty())
            {
                None => Ok(None),
                Some(s) => s
                    .parse::<i64>()
                    .map(Some)
                    .map_err(|_| format!("{k} must be a number")),
            }
        };
        let after = match (num("after_txid")?, num("after_id")?) {
            (Some(t), Some(i)) => Some((t, i)),
            (None, None) => None,
            _ => return Err("after_txid and after_id go together".into()),
        };
        Ok(Cursor {
            after,
            dl_before: num("dl_before")?,
        })
    }
}

/// What the page shows: a page of each list, and whether more follow.
pub struct QueueData {
    pub events: Vec<Row>,
    pub events_more: bool,
    pub consumers: Vec<Row>,
    pub dead: Vec<Row>,
    pub dead_more: bool,
    /// The queue's partition keys blocked by a `pause` consumer (at most
    /// PAGE_SIZE, longest blocked first); empty on a schema before 0.8.0.
    pub blocked: Vec<Row>,
}

async fn rows(
    c: &deadpool_postgres::Object,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Row>, DbError> {
    Ok(c.query(sql, params)
        .await?
        .iter()
        .filter_map(|r| match r.get::<_, Option<Value>>(0) {
            Some(Value::Object(o)) => Some(o),
            _ => None,
        })
        .collect())
}

/// Takes the contents (payload, headers, and a dead letter's reason: the
/// consumer's error text) out of a row of browse_events or
/// browse_dead_letters for a viewer who may not see them
/// (pages::Ctx::contents). pgque leaves them out itself for a role without
/// pgque_admin, but the dashboard's role is often pgque_admin while its
/// viewer has a read login.
pub fn redact_event(r: &mut Row, contents: bool) {
    if !contents {
        for k in ["ev_data", "headers", "dl_reason"] {
            r.remove(k);
        }
    }
}

/// Reads the queue's page from `at`: one call of each function (a page
/// and one row more, to know whether another page follows), without what
/// the viewer may not see (redact_event).
pub async fn queue(
    pool: &Pool,
    name: &str,
    at: Cursor,
    contents: bool,
) -> Result<QueueData, DbError> {
    let c = pool.get().await?;
    let (t, i) = (at.after.map(|a| a.0), at.after.map(|a| a.1));
    let more = PAGE_SIZE as i32 + 1;
    let mut events = rows(
        &c,
        "SELECT pg_catalog.to_jsonb(e) FROM pgque.browse_events($1, NULL, $2, $3, $4) e",
        &[&name, &t, &i, &more],
    )
    .await?;
    let consumers = rows(
        &c,
        "SELECT pg_catalog.to_jsonb(ci) OPERATOR(pg_catalog.||)
                CASE WHEN ci.current_batch IS NULL THEN '{}'::pg_catalog.jsonb ELSE
                (SELECT pg_catalog.jsonb_build_object('batch_start', b.batch_start, 'batch_end', b.batch_end,
                                           'prev_tick_id', b.prev_tick_id, 'tick_id', b.tick_id)
                   FROM pgque.get_batch_info(ci.current_batch) b) END
           FROM pgque.get_consumer_info($1) ci",
        &[&name],
    )
    .await?;
    let mut dead = rows(
        &c,
        "SELECT pg_catalog.to_jsonb(d) FROM pgque.browse_dead_letters($1, $2, $3) d",
        &[&name, &at.dl_before, &more],
    )
    .await?;
    // Blocked keys are few by nature (one per failing key of a `pause`
    // consumer); the view reads them through the markers, not the events.
    let blocked = match rows(
        &c,
        "SELECT pg_catalog.to_jsonb(b) FROM pgque.partition_blocked_keys b
          WHERE b.queue_name OPERATOR(pg_catalog.=) $1::pg_catalog.text ORDER BY b.blocked_since, b.consumer, b.partition_key LIMIT $2",
        &[&name, &PAGE_SIZE],
    )
    .await
    {
        Ok(b) => b,
        Err(e) if e.0.contains("SQLSTATE 42P01") => Vec::new(),
        Err(e) => return Err(e),
    };
    for r in events.iter_mut().chain(dead.iter_mut()) {
        redact_event(r, contents);
    }
    let events_more = events.len() > PAGE_SIZE as usize;
    events.truncate(PAGE_SIZE as usize);
    let dead_more = dead.len() > PAGE_SIZE as usize;
    dead.truncate(PAGE_SIZE as usize);
    Ok(QueueData {
        events,
        events_more,
        consumers,
        dead,
        dead_more,
        blocked,
    })
}

/// The link to the page of queue `name`.
pub fn href(name: &str) -> String {
    format!("/events/q/{}", urlenc(name))
}

fn payload_cell(ctx: &Ctx, r: &Row, k: &str) -> String {
    if !ctx.contents {
        return format!(
            "<td class=\"payload\">{}</td>",
            crate::html::hidden_short(ctx)
        );
    }
    let p = text(r, k);
    if p.chars().count() <= PAYLOAD_SHOWN {
        return format!("<td class=\"payload\"><code>{}</code></td>", esc(&p));
    }
    let short: String = p.chars().take(PAYLOAD_SHOWN).collect();
    format!(
        "<td class=\"payload\" title=\"{}\"><code>{}</code>…</td>",
        esc(&p),
        esc(&short)
    )
}

/// The trace context an event carries (docs/tracing.md, "Events"), as the
/// job page shows a job's: pretty JSON, escaped. Empty when it has none,
/// and on a 0.7.0 schema, whose browse_* return no `headers` column (the
/// rows are `to_jsonb` objects, so the key is simply absent).
fn headers_cell(ctx: &Ctx, r: &Row) -> String {
    if !ctx.contents {
        return format!(
            "<td class=\"headers\">{}</td>",
            crate::html::hidden_short(ctx)
        );
    }
    match r.get("headers").filter(|v| !v.is_null()) {
        None => "<td class=\"headers\"></td>".into(),
        Some(h) => format!(
            "<td class=\"headers\"><pre>{}</pre></td>",
            esc(&pretty(Some(h)))
        ),
    }
}

/// The queue's page content.
pub fn queue_page(ctx: &Ctx, name: &str, at: Cursor, d: &QueueData) -> String {
    let base = href(name);
    let mut o = format!(
        "<p><a href=\"/events\">← all event queues</a> · the events queue <b id=\"queue-name\">{}</b>'s \
consumers have still to process, their open batches and its dead letters.</p>",
        esc(name)
    );
    o.push_str("<h2>Open batches</h2><table id=\"open-batches\"><thead><tr><th>consumer</th><th>open batch</th>\
<th>ticks</th><th>batch from</th><th>batch to</th><th>lag</th><th>pending events</th></tr></thead><tbody>");
    if d.consumers.is_empty() {
        o.push_str(
            "<tr><td colspan=\"7\" class=\"muted\">no consumers (pgque.subscribe)</td></tr>",
        );
    }
    for r in &d.consumers {
        let batch = text(r, "current_batch");
        let _ = write!(
            o,
            "<tr data-consumer=\"{c}\" data-batch=\"{b}\"><td>{c}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
<td>{}</td><td class=\"n\">{}</td></tr>",
            if batch.is_empty() { "<span class=\"muted\">none</span>".into() } else { esc(&batch) },
            if batch.is_empty() {
                String::new()
            } else {
                format!("{} → {}", esc(&text(r, "prev_tick_id")), esc(&text(r, "tick_id")))
            },
            esc(&when(r, "batch_start")),
            esc(&when(r, "batch_end")),
            esc(&text(r, "lag")),
            esc(&text(r, "pending_events")),
            c = esc(&text(r, "consumer_name")),
            b = esc(&batch),
        );
    }
    o.push_str("</tbody></table>");

    o.push_str(
        "<h2>Waiting events</h2><p class=\"muted\">Committed after the furthest-behind consumer's position, \
in transaction order, a page at a time.</p><table id=\"waiting-events\"><thead><tr><th>event id</th><th>type</th>\
<th>partition key</th><th>sent at</th><th>retries</th><th>for consumer</th><th>payload</th><th>headers</th></tr></thead><tbody>",
    );
    if d.events.is_empty() {
        o.push_str("<tr><td colspan=\"8\" class=\"muted\">no event waits</td></tr>");
    }
    for r in &d.events {
        let _ = write!(
            o,
            "<tr data-ev=\"{}\"><td class=\"n\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td>{}{}</tr>",
            esc(&text(r, "ev_id")),
            esc(&text(r, "ev_id")),
            esc(&text(r, "ev_type")),
            esc(&text(r, "partition_key")),
            esc(&when(r, "ev_time")),
            esc(&text(r, "ev_retry")),
            esc(&text(r, "for_consumer")),
            payload_cell(ctx, r, "ev_data"),
            headers_cell(ctx, r),
        );
    }
    o.push_str("</tbody></table><div class=\"pager\">");
    if at.after.is_some() {
        let _ = write!(o, "<a href=\"{base}\" id=\"events-first\">first events</a>");
    }
    if let (true, Some(last)) = (d.events_more, d.events.last()) {
        let _ = write!(
            o,
            "<a id=\"events-next\" href=\"{base}?after_txid={}&amp;after_id={}\">next events →</a>",
            urlenc(&text(last, "ev_txid")),
            urlenc(&text(last, "ev_id"))
        );
    }
    o.push_str("</div>");

    blocked_keys(&mut o, ctx, name, &base, &d.blocked);

    o.push_str("<h2>Dead letters</h2>");
    let admin = ctx.admin && !d.dead.is_empty();
    if admin {
        let _ = write!(
            o,
            "<form method=\"post\" action=\"/events/confirm\" id=\"dead-form\">\
<input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"queue\" value=\"{}\">\
<div class=\"bulk\"><button type=\"submit\" name=\"op\" value=\"replay\" id=\"dead-replay\">Replay selected…</button>\
<button type=\"submit\" name=\"op\" value=\"purge\" id=\"dead-purge\">Purge selected…</button></div>",
            esc(ctx.csrf),
            esc(name)
        );
    }
    o.push_str("<table id=\"dead-letters\"><thead><tr>");
    if admin {
        o.push_str("<th></th>");
    }
    o.push_str("<th>id</th><th>consumer</th><th>failed at</th><th>reason</th><th>event id</th><th>type</th>\
<th>partition key</th><th>retries</th><th>payload</th><th>headers</th></tr></thead><tbody>");
    if d.dead.is_empty() {
        o.push_str("<tr><td colspan=\"10\" class=\"muted\" id=\"no-dead-letters\">no dead letters</td></tr>");
    }
    for r in &d.dead {
        let id = esc(&text(r, "dl_id"));
        let _ = write!(o, "<tr data-dl=\"{id}\">");
        if admin {
            let _ = write!(
                o,
                "<td><input type=\"checkbox\" name=\"ids\" value=\"{id}\" aria-label=\"select dead letter {id}\"></td>"
            );
        }
        let _ = write!(
            o,
            "<td class=\"n\">{id}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td>\
<td class=\"n\">{}</td>{}{}</tr>",
            esc(&text(r, "consumer")),
            esc(&when(r, "dl_time")),
            if ctx.contents {
                esc(&text(r, "dl_reason"))
            } else {
                crate::html::hidden_short(ctx)
            },
            esc(&text(r, "ev_id")),
            esc(&text(r, "ev_type")),
            esc(&text(r, "partition_key")),
            esc(&text(r, "ev_retry")),
            payload_cell(ctx, r, "ev_data"),
            headers_cell(ctx, r),
        );
    }
    o.push_str("</tbody></table>");
    if admin {
        o.push_str("</form>");
    }
    o.push_str("<div class=\"pager\">");
    if at.dl_before.is_some() {
        let _ = write!(
            o,
            "<a href=\"{base}\" id=\"dead-first\">newest dead letters</a>"
        );
    }
    if let (true, Some(last)) = (d.dead_more, d.dead.last()) {
        let _ = write!(
            o,
            "<a id=\"dead-next\" href=\"{base}?dl_before={}\">older dead letters →</a>",
            urlenc(&text(last, "dl_id"))
        );
    }
    o.push_str("</div>");
    o
}

/// The section of keys a `pause` consumer holds back, with a Release
/// button each for an admin login (POST /action/release_key, CSRF).
fn blocked_keys(o: &mut String, ctx: &Ctx, name: &str, base: &str, blocked: &[Row]) {
    o.push_str(
        "<h2>Blocked partition keys</h2><p class=\"muted\">Keys of consumers with the <code>pause</code> \
failure policy whose later events wait until the failed one is acked or dead-lettered \
(docs/partition-keys.md).</p><table id=\"blocked-keys\"><thead><tr><th>consumer</th><th>slot</th>\
<th>partition key</th><th>state</th><th>failed event</th><th>blocked since</th><th>held events</th>",
    );
    if ctx.admin {
        o.push_str("<th></th>");
    }
    o.push_str("</tr></thead><tbody>");
    if blocked.is_empty() {
        o.push_str("<tr><td colspan=\"8\" class=\"muted\" id=\"no-blocked-keys\">no blocked keys</td></tr>");
    }
    for r in blocked {
        let key = text(r, "partition_key");
        let consumer = text(r, "consumer");
        let _ = write!(
            o,
            "<tr data-key=\"{}\"><td>{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td>\
<td>{}</td><td class=\"n\">{}</td>",
            esc(&key),
            esc(&consumer),
            esc(&text(r, "slot")),
            esc(&key),
            esc(&text(r, "state")),
            esc(&text(r, "failed_event")),
            esc(&when(r, "blocked_since")),
            esc(&text(r, "held_events")),
        );
        if ctx.admin {
            let _ = write!(
                o,
                "<td><form method=\"post\" action=\"/action/release_key\">\
<input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"back\" value=\"{}\">\
<input type=\"hidden\" name=\"queue\" value=\"{}\"><input type=\"hidden\" name=\"consumer\" value=\"{}\">\
<input type=\"hidden\" name=\"key\" value=\"{}\"><button type=\"submit\" class=\"release-key\">Release</button>\
</form></td>",
                esc(ctx.csrf),
                esc(base),
                esc(name),
                esc(&consumer),
                esc(&key),
            );
        }
        o.push_str("</tr>");
    }
    o.push_str("</tbody></table>");
}

/// Releases a key blocked by a `pause` consumer (pgque.release_partition_key);
/// returns the message for the page. The caller checked the admin login
/// and the CSRF token.
pub async fn release_key(
    pool: &Pool,
    queue: &str,
    consumer: &str,
    key: &str,
) -> Result<String, DbError> {
    let c = pool.get().await?;
    let released: bool = c
        .query_one(
            "SELECT pgque.release_partition_key($1, $2, $3)",
            &[&queue, &consumer, &key],
        )
        .await?
        .get(0);
    Ok(if released {
        format!("released key {key} of {consumer}")
    } else {
        format!("key {key} of {consumer} was not blocked")
    })
}

/// What a replay or purge of selected dead letters does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeadOp {
    Replay,
    Purge,
}

impl DeadOp {
    pub fn parse(s: &str) -> Option<DeadOp> {
        match s {
            "replay" => Some(DeadOp::Replay),
            "purge" => Some(DeadOp::Purge),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DeadOp::Replay => "replay",
            DeadOp::Purge => "purge",
        }
    }
    fn done(self) -> &'static str {
        match self {
            DeadOp::Replay => "replayed",
            DeadOp::Purge => "purged",
        }
    }
}

/// Of `ids`, those that are dead letters of queue `queue`, ascending.
async fn found<C: tokio_postgres::GenericClient>(
    c: &C,
    queue: &str,
    ids: &[i64],
) -> Result<Vec<i64>, DbError> {
    Ok(c.query(
        "SELECT d.dl_id FROM pgque.dead_letter d
          WHERE d.dl_queue_id OPERATOR(pg_catalog.=)
                (SELECT q.queue_id FROM pgque.queue q
                  WHERE q.queue_name OPERATOR(pg_catalog.=) $1::pg_catalog.text)
            AND d.dl_id OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.int8[]) ORDER BY d.dl_id",
        &[&queue, &ids],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect())
}

/// The confirmation page of a replay or purge of the selected `ids`: how
/// many of them are dead letters of the queue, and the form that acts on
/// exactly those. Changes nothing.
pub async fn confirm(
    pool: &Pool,
    ctx: &Ctx<'_>,
    op: DeadOp,
    queue: &str,
    ids: &[i64],
) -> Result<String, DbError> {
    if ids.is_empty() {
        return Ok(format!(
            "<p id=\"confirm-none\">No dead letter was selected. <a href=\"{}\">Back</a></p>",
            href(queue)
        ));
    }
    if ids.len() > SELECT_MAX {
        return Err(DbError(format!(
            "{} dead letters selected: at most {SELECT_MAX} at a time",
            ids.len()
        )));
    }
    let c = pool.get().await?;
    let got = found(&**c, queue, ids).await?;
    let list = got.iter().map(|i| i.to_string()).collect::<Vec<_>>();
    let mut o = format!(
        "<p id=\"confirm-count\" data-count=\"{n}\">{what} <b>{n}</b> dead letter{s} of queue <b>{q}</b>: {}.</p>",
        esc(&list.join(", ")),
        what = match op {
            DeadOp::Replay => "Replay (redeliver to its consumer)",
            DeadOp::Purge => "Purge (delete for good)",
        },
        n = got.len(),
        s = if got.len() == 1 { "" } else { "s" },
        q = esc(queue),
    );
    if got.len() < ids.len() {
        let _ = write!(
            o,
            "<p class=\"warn\" id=\"confirm-gone\">{} of the {} selected are no longer dead letters of this queue.</p>",
            ids.len() - got.len(),
            ids.len()
        );
    }
    if got.is_empty() {
        let _ = write!(o, "<p><a href=\"{}\">Back</a></p>", href(queue));
        return Ok(o);
    }
    let _ = write!(
        o,
        "<form method=\"post\" action=\"/action/dead_{op}\" id=\"confirm-form\">\
<input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"queue\" value=\"{}\">\
<input type=\"hidden\" name=\"selected\" value=\"{}\"><input type=\"hidden\" name=\"count\" value=\"{}\">\
<input type=\"hidden\" name=\"back\" value=\"{}\">\
<button type=\"submit\" id=\"confirm\">{} {} dead letter{}</button> <a href=\"{}\">Cancel</a></form>",
        esc(ctx.csrf),
        esc(queue),
        list.join(","),
        got.len(),
        esc(&href(queue)),
        if op == DeadOp::Replay { "Replay" } else { "Purge" },
        got.len(),
        if got.len() == 1 { "" } else { "s" },
        esc(&href(queue)),
        op = op.name(),
    );
    Ok(o)
}

/// Replays or purges the dead letters `ids` of queue `queue`, all or
/// nothing: when they are not all still dead letters of the queue, or not
/// `count` of them (what the confirmation said), nothing changes.
pub async fn apply(
    pool: &Pool,
    op: DeadOp,
    queue: &str,
    ids: &[i64],
    count: usize,
) -> Result<String, DbError> {
    if ids.is_empty() || ids.len() != count || ids.len() > SELECT_MAX {
        return Err(DbError(format!(
            "the request names {} dead letters, the confirmation {count}: nothing changed",
            ids.len()
        )));
    }
    let mut c = pool.get().await?;
    let tx = c.transaction().await?;
    let got = found(&*tx, queue, ids).await?;
    if got.len() != count {
        return Ok(format!(
            "nothing changed: {} of the {count} confirmed dead letters are still dead letters of {queue}",
            got.len()
        ));
    }
    let n: i64 = match op {
        DeadOp::Replay => {
            for id in &got {
                tx.execute("SELECT pgque.dlq_replay($1)", &[id]).await?;
            }
            got.len() as i64
        }
        DeadOp::Purge => {
            tx.execute(
                "DELETE FROM pgque.dead_letter d
                  WHERE d.dl_queue_id OPERATOR(pg_catalog.=)
                        (SELECT q.queue_id FROM pgque.queue q
                          WHERE q.queue_name OPERATOR(pg_catalog.=) $1::pg_catalog.text)
                    AND d.dl_id OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.int8[])",
                &[&queue, &got],
            )
            .await? as i64
        }
    };
    if n as usize != count {
        tx.rollback().await?;
        return Ok(format!(
            "nothing changed: {n} of the {count} confirmed dead letters could be {}",
            op.done()
        ));
    }
    tx.commit().await?;
    Ok(format!(
        "{n} dead letter{} of {queue} {}",
        if n == 1 { "" } else { "s" },
        op.done()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn cursors_come_from_the_query_string() {
        assert_eq!(Cursor::from_query(&[]).unwrap(), Cursor::default());
        let c = Cursor::from_query(&q(&[
            ("after_txid", "900"),
            ("after_id", "7"),
            ("dl_before", "12"),
        ]))
        .unwrap();
        assert_eq!(c.after, Some((900, 7)));
        assert_eq!(c.dl_before, Some(12));
        assert!(Cursor::from_query(&q(&[("after_txid", "900")])).is_err());
        assert!(Cursor::from_query(&q(&[("dl_before", "x")])).is_err());
    }

    #[test]
    fn read_only_pages_offer_no_selection_and_payloads_are_escaped() {
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
        let mut r = Row::new();
        r.insert("dl_id".into(), Value::from(5));
        r.insert("ev_data".into(), Value::from("<b>x</b>".repeat(100)));
        let mut k = Row::new();
        k.insert("partition_key".into(), Value::from("<k>"));
        k.insert("consumer".into(), Value::from("c"));
        let d = QueueData {
            events: vec![],
            events_more: false,
            consumers: vec![],
            dead: vec![r],
            dead_more: false,
            blocked: vec![k],
        };
        let p = queue_page(&ctx, "a&b", Cursor::default(), &d);
        assert!(!p.contains("<form") && !p.contains("checkbox"), "{p}");
        assert!(
            !p.contains("<k>") && p.contains("&lt;k&gt;"),
            "keys are escaped"
        );
        // without contents no payload, even one the rows still carried
        assert!(!p.contains("&lt;b&gt;x") && !p.contains("<b>x"), "{p}");
        assert!(p.contains("data-hidden=\"contents\""), "{p}");
        let reader = Ctx {
            contents: true,
            ..ctx
        };
        let p = queue_page(&reader, "a&b", Cursor::default(), &d);
        assert!(!p.contains("<b>x</b>") && p.contains("&lt;b&gt;x&lt;/b&gt;"));
        assert!(p.contains("…"), "a long payload is cut");
        let admin = Ctx {
            admin: true,
            contents: true,
            ..ctx
        };
        let p = queue_page(&admin, "a&b", Cursor::default(), &d);
        assert!(p.contains("name=\"ids\" value=\"5\"") && p.contains("value=\"tok\""));
        assert!(
            p.contains("action=\"/action/release_key\"")
                && p.contains("name=\"key\" value=\"&lt;k&gt;\"")
        );
        assert_eq!(href("a&b"), "/events/q/a%26b");
    }

    #[test]
    fn contents_leave_the_rows_of_a_viewer_without_them() {
        let mut r = Row::new();
        for (k, v) in [
            ("ev_id", "7"),
            ("ev_data", "secret"),
            ("headers", "{}"),
            ("dl_reason", "smtp said secret"),
        ] {
            r.insert(k.into(), Value::from(v));
        }
        let mut kept = r.clone();
        redact_event(&mut kept, true);
        assert_eq!(kept, r);
        redact_event(&mut r, false);
        assert_eq!(r.keys().collect::<Vec<_>>(), ["ev_id"]);
    }

    #[test]
    fn headers_show_escaped_and_nothing_without_them() {
        let ctx = Ctx {
            role: "r",
            database: "d",
            admin: false,
            csrf: "tok",
            refresh_ms: 2000,
            message: None,
            user: None,
            standby: false,
            contents: true,
        };
        let headers_cell = |r: &Row| headers_cell(&ctx, r);
        let mut r = Row::new();
        r.insert(
            "headers".into(),
            serde_json::json!({"traceparent": "00-ab-cd-01", "tracestate": "<x>"}),
        );
        let c = headers_cell(&r);
        assert!(
            c.contains("<pre>") && c.contains("&quot;traceparent&quot;: &quot;00-ab-cd-01&quot;"),
            "{c}"
        );
        assert!(!c.contains("<x>") && c.contains("&lt;x&gt;"), "{c}");
        // NULL headers, and a 0.7.0 row that has no headers column at all
        r.insert("headers".into(), Value::Null);
        assert_eq!(headers_cell(&r), "<td class=\"headers\"></td>");
        assert_eq!(headers_cell(&Row::new()), "<td class=\"headers\"></td>");
    }
}
