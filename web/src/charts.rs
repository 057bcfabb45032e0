//! The history charts of the events and jobs pages: throughput, depth and
//! lag of each queue over a time range (1 h, 6 h, 24 h), from the minute
//! rollup the worker keeps in the database (pgque.read_history, db.rs), so
//! a restarted or second pgque-web draws the same hours at once. SVG with
//! a time axis (UTC clock times), a value axis with its unit, a line and a
//! legend entry per queue.
use crate::db::HistRow;
use crate::html::{esc, num};
use std::fmt::Write;

/// The ranges the picker offers: (name, seconds). The first is the default.
pub const RANGES: &[(&str, i64)] = &[("1h", 3600), ("6h", 6 * 3600), ("24h", 24 * 3600)];

/// The range a query string names (the default for none or an unknown one).
pub fn range(name: Option<&str>) -> (&'static str, i64) {
    RANGES
        .iter()
        .copied()
        .find(|(n, _)| Some(*n) == name)
        .unwrap_or(RANGES[0])
}

/// The picker: a link per range, the current one marked.
pub fn picker(path: &str, current: &str) -> String {
    let mut o = String::from("<nav class=\"range\" id=\"range\">range: ");
    for (n, _) in RANGES {
        let _ = write!(
            o,
            "<a href=\"{path}?range={n}\" data-range=\"{n}\"{}>{n}</a> ",
            if *n == current { " class=\"on\"" } else { "" }
        );
    }
    o.push_str("</nav>");
    o
}

/// HH:MM (UTC) of a Unix time.
fn clock(t: f64) -> String {
    let s = (t.max(0.0) as i64).rem_euclid(86400);
    format!("{:02}:{:02}", s / 3600, (s % 3600) / 60)
}

/// A chart of one value of each queue over [t0, t1]: the time axis with
/// five clock labels, the value axis from 0 to the top value with `unit`.
/// Each line carries its queue and point count (data-series, data-n).
pub fn time_chart(
    series: &[(String, Vec<(f64, f64)>)],
    title: &str,
    unit: &str,
    id: &str,
    t0: f64,
    t1: f64,
) -> String {
    const W: f64 = 640.0;
    const H: f64 = 180.0;
    const L: f64 = 56.0;
    const R: f64 = 120.0;
    const B: f64 = 22.0;
    const T: f64 = 18.0;
    const COLORS: &[&str] = &[
        "#3b6fd8", "#d8573b", "#2f9e5a", "#9b4dca", "#c29b00", "#1aa3b8",
    ];
    let max = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(0.0_f64, f64::max);
    let top = if max > 0.0 { max * 1.1 } else { 1.0 };
    let span = (t1 - t0).max(1.0);
    let x = |t: f64| L + ((t - t0) / span).clamp(0.0, 1.0) * (W - L - R);
    let y = |v: f64| T + (1.0 - v / top) * (H - B - T);
    let mut o = format!(
        "<svg class=\"chart\" id=\"{id}\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" \
aria-label=\"{t}\" data-unit=\"{u}\"><title>{t}</title><text x=\"{L}\" y=\"12\">{t} ({u})</text>",
        t = esc(title),
        u = esc(unit),
    );
    // value axis: 0, half, top
    for f in [0.0, 0.5, 1.0] {
        let v = top * f;
        let _ = write!(
            o,
            "<line x1=\"{L}\" y1=\"{yy:.1}\" x2=\"{xe}\" y2=\"{yy:.1}\" stroke=\"#e3e6ec\"/>\
<text x=\"{tx}\" y=\"{ty:.1}\" text-anchor=\"end\">{} {}</text>",
            num((v * 100.0).round() / 100.0),
            esc(unit),
            yy = y(v),
            xe = W - R,
            tx = L - 4.0,
            ty = y(v) + 3.0,
        );
    }
    // time axis: five clock labels
    let yb = H - B;
    let _ = write!(
        o,
        "<line x1=\"{L}\" y1=\"{yb}\" x2=\"{xe}\" y2=\"{yb}\" stroke=\"#9aa3b2\"/>\
<line x1=\"{L}\" y1=\"{T}\" x2=\"{L}\" y2=\"{yb}\" stroke=\"#9aa3b2\"/>",
        xe = W - R
    );
    for i in 0..5 {
        let t = t0 + span * i as f64 / 4.0;
        let _ = write!(
            o,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" class=\"tick\">{}</text>",
            x(t),
            H - 6.0,
            clock(t)
        );
    }
    let _ = write!(
        o,
        "<text x=\"{}\" y=\"{}\">UTC</text>",
        W - R + 24.0,
        H - 6.0
    );
    let mut drawn = 0;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut p = String::new();
        for (t, v) in pts {
            let _ = write!(p, "{:.1},{:.1} ", x(*t), y(*v));
        }
        if pts.len() == 1 {
            // one minute: a dot, so a lone point shows
            let _ = write!(
                o,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"{color}\"/>",
                x(pts[0].0),
                y(pts[0].1)
            );
        }
        let _ = write!(
            o,
            "<polyline points=\"{p}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.6\" data-series=\"{n}\" \
data-n=\"{}\"><title>{n}</title></polyline><text x=\"{lx}\" y=\"{ly}\" fill=\"{color}\">{n}</text>",
            pts.len(),
            n = esc(name),
            lx = W - R + 6.0,
            ly = T + 10.0 + 12.0 * i as f64,
        );
        drawn += pts.len();
    }
    if drawn == 0 {
        let _ = write!(
            o,
            "<text x=\"{}\" y=\"{}\" class=\"muted\">no history in this range yet (the worker writes a row per queue each minute)</text>",
            L + 10.0,
            H / 2.0
        );
    }
    o.push_str("</svg>");
    o
}

/// The three charts of one kind of queue ("event" or "job") over the range
/// ending `now`, with the picker above them.
pub fn history_section(
    kind: &str,
    rows: &Result<Vec<HistRow>, String>,
    path: &str,
    range_name: &str,
    range_s: i64,
    now: f64,
) -> String {
    let mut o = format!("<h2>History</h2>{}", picker(path, range_name));
    let rows = match rows {
        Ok(r) => r,
        Err(e) => {
            let _ = write!(
                o,
                "<p class=\"bad\" id=\"history-error\">history unavailable: {}</p>",
                esc(e)
            );
            return o;
        }
    };
    let t0 = now - range_s as f64;
    let pick = |f: fn(&HistRow) -> Option<f64>| -> Vec<(String, Vec<(f64, f64)>)> {
        let mut out: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for r in rows.iter().filter(|r| r.kind == kind && r.at >= t0 - 60.0) {
            let Some(v) = f(r) else { continue };
            match out.last_mut() {
                Some((q, pts)) if *q == r.queue => pts.push((r.at, v)),
                _ => out.push((r.queue.clone(), vec![(r.at, v)])),
            }
        }
        out
    };
    let (thr, depth, lag) = if kind == "event" {
        (
            "events sent per second",
            "events waiting",
            "furthest-behind consumer's lag",
        )
    } else {
        (
            "jobs completed per second",
            "jobs ready",
            "oldest ready job's wait",
        )
    };
    let unit = if kind == "event" { "events" } else { "jobs" };
    o.push_str(&time_chart(
        &pick(|r| r.per_second),
        thr,
        "/s",
        &format!("{kind}-throughput"),
        t0,
        now,
    ));
    o.push_str(&time_chart(
        &pick(|r| r.depth),
        depth,
        unit,
        &format!("{kind}-depth"),
        t0,
        now,
    ));
    o.push_str(&time_chart(
        &pick(|r| r.lag),
        lag,
        "s",
        &format!("{kind}-lag"),
        t0,
        now,
    ));
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(at: f64, q: &str, v: f64) -> HistRow {
        HistRow {
            at,
            kind: "job".into(),
            queue: q.into(),
            per_second: Some(v),
            depth: Some(v * 2.0),
            lag: None,
        }
    }

    #[test]
    fn charts_have_axes_units_and_a_line_per_queue() {
        let rows = Ok(vec![
            row(7200.0, "a", 1.0),
            row(7260.0, "a", 2.0),
            row(7260.0, "b", 4.0),
        ]);
        let h = history_section("job", &rows, "/jobs", "1h", 3600, 7300.0);
        assert_eq!(h.matches("<svg").count(), 3);
        assert!(
            h.contains("data-series=\"a\" data-n=\"2\"")
                && h.contains("data-series=\"b\" data-n=\"1\"")
        );
        assert!(h.contains("(/s)") && h.contains("jobs ready (jobs)"));
        // the time axis: 5 clock labels from 01:01 (7300 - 3600 s) to 02:01
        assert!(h.contains(">01:01<") && h.contains(">02:01<"), "{h}");
        // no lag figures: that chart says so
        assert!(h.contains("no history in this range yet"));
        assert!(
            h.contains("href=\"/jobs?range=6h\"") && h.contains("data-range=\"1h\" class=\"on\"")
        );
        assert_eq!(range(Some("24h")), ("24h", 86400));
        assert_eq!(range(Some("7d")), ("1h", 3600));
        let e = history_section("event", &Err("no <fn>".into()), "/events", "1h", 3600, 0.0);
        assert!(e.contains("history unavailable: no &lt;fn&gt;"));
    }
}
