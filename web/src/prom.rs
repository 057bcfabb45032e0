//! The Prometheus text exposition format (version 0.0.4) of pgque.metrics()
//! rows: one `# HELP` and `# TYPE` per metric name, then its samples.
use crate::db::Metric;
use std::fmt::Write;

/// Content-Type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What each exported name means. A name pgque.metrics() returns that is not
/// listed here (a newer extension than this binary) is still exported, as an
/// untyped metric.
pub const KNOWN: &[(&str, &str, &str)] = &[
    (
        "pgque_event_queue_pending_events",
        "gauge",
        "Events of the queue its slowest consumer has not consumed yet (0 without consumers).",
    ),
    (
        "pgque_event_queue_unticked_events",
        "gauge",
        "Events sent since the queue's last tick (not yet in any batch).",
    ),
    (
        "pgque_event_queue_last_tick_age_seconds",
        "gauge",
        "Seconds since the queue's last tick.",
    ),
    (
        "pgque_event_queue_events_per_second",
        "gauge",
        "Events per second over the ticks the queue keeps.",
    ),
    (
        "pgque_event_queue_ticker_paused",
        "gauge",
        "1 when the queue's ticker is paused.",
    ),
    (
        "pgque_event_queue_consumers",
        "gauge",
        "Consumers subscribed to the queue.",
    ),
    (
        "pgque_dead_letters",
        "gauge",
        "Dead letters held for the queue.",
    ),
    (
        "pgque_consumer_lag_seconds",
        "gauge",
        "Age of the tick the consumer's position is at.",
    ),
    (
        "pgque_consumer_pending_events",
        "gauge",
        "Events after the consumer's position.",
    ),
    (
        "pgque_consumer_last_seen_seconds",
        "gauge",
        "Seconds since the consumer last opened a batch.",
    ),
    (
        "pgque_consumer_batch_open",
        "gauge",
        "1 while the consumer has an open batch.",
    ),
    (
        "pgque_partition_slot_pending_events",
        "gauge",
        "Unconsumed events of one partition slot (and its scheduled retries).",
    ),
    (
        "pgque_partition_slot_oldest_pending_age_seconds",
        "gauge",
        "Age of the slot's oldest unconsumed event.",
    ),
    (
        "pgque_partition_slot_leased",
        "gauge",
        "1 while a worker holds the slot's lease.",
    ),
    ("pgque_jobs", "gauge", "Jobs of the queue by state."),
    (
        "pgque_job_oldest_ready_age_seconds",
        "gauge",
        "Seconds the oldest ready job of the queue has been due (0 when none is ready).",
    ),
    (
        "pgque_job_queue_paused",
        "gauge",
        "1 when dispatch from the job queue is paused.",
    ),
    (
        "pgque_preloaded",
        "gauge",
        "1 when pgque is in shared_preload_libraries (background worker mode).",
    ),
    (
        "pgque_in_recovery",
        "gauge",
        "1 on a hot standby: no worker runs there and the queue figures are what was replicated.",
    ),
    (
        "pgque_job_log_truncation_blocked_seconds",
        "gauge",
        "How long the job log's due truncation has waited on other sessions' locks (0: not held back; pgque.job_log_blockers() names them).",
    ),
    (
        "pgque_job_log_truncation_blockers",
        "gauge",
        "Sessions whose locks hold back the job log's due truncation.",
    ),
    (
        "pgque_worker_enabled",
        "gauge",
        "1 when the database's worker is switched on (pgque.start()).",
    ),
    (
        "pgque_worker_up",
        "gauge",
        "1 when the database's background worker runs, or is parked by the worker pool (started again when a duty is due).",
    ),
    (
        "pgque_worker_parked",
        "gauge",
        "1 while the worker pool has parked the database's worker (no process; nothing due).",
    ),
    (
        "pgque_worker_pool_short",
        "gauge",
        "1 while databases of this server wait for a worker process the pool cannot start (raise max_worker_processes).",
    ),
    (
        "pgque_worker_pool_waiting_databases",
        "gauge",
        "Databases of this server waiting for a worker process.",
    ),
    (
        "pgque_waiting_consumers",
        "gauge",
        "Backends of the database sleeping in a waiting receive or next_batch_wait now.",
    ),
    (
        "pgque_worker_start_time_seconds",
        "gauge",
        "Unix time the running worker started.",
    ),
    (
        "pgque_duty_runs_total",
        "counter",
        "Runs of the worker duty since the worker started.",
    ),
    (
        "pgque_duty_failures_total",
        "counter",
        "Failed runs of the worker duty since the worker started.",
    ),
    (
        "pgque_duty_consecutive_failures",
        "gauge",
        "Failed runs of the duty since its last success.",
    ),
    (
        "pgque_duty_last_duration_seconds",
        "gauge",
        "Duration of the duty's last run.",
    ),
    (
        "pgque_duty_last_run_timestamp_seconds",
        "gauge",
        "Unix time of the duty's last run.",
    ),
    (
        "pgque_duty_last_success_timestamp_seconds",
        "gauge",
        "Unix time of the duty's last successful run.",
    ),
];

/// Label values escape backslash, double quote and newline.
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// HELP text escapes backslash and newline.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A sample value as the format spells it (Go's float syntax, +Inf/-Inf/NaN).
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

/// A metric or label name is [a-zA-Z_:][a-zA-Z0-9_:]* (labels: no colon).
fn valid_name(n: &str, colon: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic() || c == '_' || (colon && c == ':') || (!first && c.is_ascii_digit())
    };
    let mut it = n.chars();
    matches!(it.next(), Some(c) if ok(c, true)) && it.all(|c| ok(c, false))
}

/// The exposition of `metrics`, samples of one name kept together in the
/// order given (pgque.metrics() orders by name). Rows with an invalid metric
/// or label name are skipped rather than breaking the whole scrape.
pub fn render(metrics: &[Metric]) -> String {
    let mut out = String::new();
    let mut current: Option<&str> = None;
    for m in metrics {
        if !valid_name(&m.name, true) || !m.labels.keys().all(|k| valid_name(k, false)) {
            continue;
        }
        if current != Some(m.name.as_str()) {
            let (kind, help) = KNOWN
                .iter()
                .find(|(n, _, _)| *n == m.name)
                .map(|(_, k, h)| (*k, *h))
                .unwrap_or(("untyped", "Reported by pgque.metrics()."));
            let _ = writeln!(out, "# HELP {} {}", m.name, escape_help(help));
            let _ = writeln!(out, "# TYPE {} {}", m.name, kind);
            current = Some(m.name.as_str());
        }
        out.push_str(&m.name);
        if !m.labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in m.labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{k}=\"{}\"", escape_label(v));
            }
            out.push('}');
        }
        out.push(' ');
        out.push_str(&format_value(m.value));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn m(name: &str, labels: &[(&str, &str)], value: f64) -> Metric {
        Metric {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            value,
        }
    }

    #[test]
    fn groups_samples_under_one_help_and_type() {
        let out = render(&[
            m("pgque_jobs", &[("queue", "a"), ("state", "ready")], 3.0),
            m("pgque_jobs", &[("queue", "a"), ("state", "failed")], 0.5),
            m("pgque_duty_runs_total", &[("duty", "ticker")], 12.0),
            m("pgque_worker_up", &[], 1.0),
        ]);
        assert_eq!(
            out,
            "# HELP pgque_jobs Jobs of the queue by state.\n\
             # TYPE pgque_jobs gauge\n\
             pgque_jobs{queue=\"a\",state=\"ready\"} 3\n\
             pgque_jobs{queue=\"a\",state=\"failed\"} 0.5\n\
             # HELP pgque_duty_runs_total Runs of the worker duty since the worker started.\n\
             # TYPE pgque_duty_runs_total counter\n\
             pgque_duty_runs_total{duty=\"ticker\"} 12\n\
             # HELP pgque_worker_up 1 when the database's background worker runs, or is parked by the worker pool (started again when a duty is due).\n\
             # TYPE pgque_worker_up gauge\n\
             pgque_worker_up 1\n"
        );
    }

    #[test]
    fn escapes_label_values_and_spells_special_floats() {
        let out = render(&[m("pgque_x", &[("queue", "a\"b\\c\nd")], f64::INFINITY)]);
        assert!(
            out.contains("pgque_x{queue=\"a\\\"b\\\\c\\nd\"} +Inf\n"),
            "{out}"
        );
        assert!(out.contains("# TYPE pgque_x untyped\n"));
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(-0.25), "-0.25");
        assert_eq!(format_value(1e21), "1000000000000000000000");
    }

    #[test]
    fn skips_rows_with_names_the_format_cannot_carry() {
        let out = render(&[
            m("bad name", &[], 1.0),
            m("pgque_ok", &[("bad-label", "x")], 1.0),
            m("pgque_ok2", &[("queue", "q")], 2.0),
        ]);
        assert!(!out.contains("bad"));
        assert!(out.contains("pgque_ok2{queue=\"q\"} 2\n"));
    }

    #[test]
    fn every_known_name_is_valid_and_counters_end_in_total() {
        for (n, kind, help) in KNOWN {
            assert!(valid_name(n, true), "{n}");
            assert_eq!(*kind == "counter", n.ends_with("_total"), "{n}");
            assert!(!help.is_empty());
        }
    }
}
