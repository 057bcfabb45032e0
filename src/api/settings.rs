//! Queue settings (`set_queue_config`, PgQ's `set_queue_config` and
//! `register_consumer_at`'s settings): parsed into pure data, then stored in
//! the queue's row. Both the PgQue API (admin.rs) and the PgQ compatibility
//! layer (pgq_compat.rs) use them, so they live below both.
use crate::log;
use pgrx::spi::SpiClient;

/// A queue setting and the value to store, as validated pure data.
#[derive(Debug, PartialEq)]
pub enum Setting {
    MaxCount(i32),
    MaxLagMs(f64),
    IdleMs(f64),
    Paused(bool),
    RotationMs(f64),
    MaxRetries(i32),
}

pub fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "t" | "true" | "on" | "yes" | "y" | "1" => Some(true),
        "f" | "false" | "off" | "no" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// Parses a duration: `90`, `90s`, `1.5 min`, `2 hours 30 minutes`,
/// `00:01:30`, `500ms`. A bare number is seconds. Negative is refused.
pub fn parse_duration_ms(v: &str) -> Option<f64> {
    let v = v.trim().to_ascii_lowercase();
    if v.is_empty() {
        return None;
    }
    if v.contains(':') {
        let parts: Vec<&str> = v.split(':').collect();
        if parts.len() != 3 {
            return None;
        }
        let h: f64 = parts[0].parse().ok()?;
        let m: f64 = parts[1].parse().ok()?;
        let s: f64 = parts[2].parse().ok()?;
        if h < 0.0 || !(0.0..60.0).contains(&m) || !(0.0..60.0).contains(&s) {
            return None;
        }
        return Some((h * 3600.0 + m * 60.0 + s) * 1000.0);
    }
    // Tokens: numbers and unit words, possibly glued ("90s").
    let mut total = 0.0;
    let mut any = false;
    let mut rest = v.as_str();
    while !rest.trim_start().is_empty() {
        rest = rest.trim_start();
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = rest[num_len..].trim_start();
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let mult = match unit {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1000.0,
            "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => 1.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000.0,
            "d" | "day" | "days" => 86_400_000.0,
            _ => return None,
        };
        if unit.is_empty() && !rest.trim().is_empty() {
            return None;
        }
        total += n * mult;
        any = true;
    }
    any.then_some(total)
}

/// Longest queue duration setting: 100 years (365-day years).
pub const MAX_DURATION_MS: f64 = 100.0 * 365.0 * 86_400_000.0;

/// Validates (param, value); value None means "reset to the default".
pub fn parse_setting(param: &str, value: Option<&str>) -> Result<Setting, String> {
    let p = param.trim().to_ascii_lowercase();
    let p = p.strip_prefix("queue_").unwrap_or(&p);
    let dur = |d: &str| {
        let v = value.unwrap_or(d);
        // Past MAX_DURATION_MS the value no longer fits an interval column.
        parse_duration_ms(v)
            .filter(|ms| *ms <= MAX_DURATION_MS)
            .ok_or_else(|| {
                format!("{p} must be a duration like '3 seconds' (at most 100 years), not {v:?}")
            })
    };
    match p {
        "ticker_max_count" => {
            let v = value.unwrap_or("500");
            match v.trim().parse::<i32>() {
                Ok(n) if n >= 1 => Ok(Setting::MaxCount(n)),
                _ => Err(format!(
                    "ticker_max_count must be an integer >= 1, not {v:?}"
                )),
            }
        }
        "ticker_max_lag" => dur("3 seconds").map(Setting::MaxLagMs),
        "ticker_idle_period" => dur("1 minute").map(Setting::IdleMs),
        "rotation_period" => dur("2 hours").map(Setting::RotationMs),
        "ticker_paused" => {
            let v = value.unwrap_or("false");
            parse_bool(v)
                .map(Setting::Paused)
                .ok_or_else(|| format!("ticker_paused must be a boolean, not {v:?}"))
        }
        "max_retries" => {
            let v = value.unwrap_or("5");
            match v.trim().parse::<i32>() {
                Ok(n) if n >= 0 => Ok(Setting::MaxRetries(n)),
                _ => Err(format!("max_retries must be an integer >= 0, not {v:?}")),
            }
        }
        _ => Err(format!(
            "unknown queue setting {param:?}; known: ticker_max_count, ticker_max_lag, \
             ticker_idle_period, ticker_paused, rotation_period, max_retries"
        )),
    }
}

/// Stores one validated queue setting (UPDATE of the queue's row).
pub fn apply_setting(c: &mut SpiClient<'_>, q: &log::Queue, setting: Setting) {
    let ms = |v: f64| v;
    match setting {
        Setting::MaxCount(n) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_ticker_max_count = $2 WHERE queue_id = $1",
            &[q.id.into(), n.into()],
        ),
        Setting::MaxRetries(n) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_max_retries = $2 WHERE queue_id = $1",
            &[q.id.into(), n.into()],
        ),
        Setting::Paused(b) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_ticker_paused = $2 WHERE queue_id = $1",
            &[q.id.into(), b.into()],
        ),
        Setting::MaxLagMs(v) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_ticker_max_lag = $2 * interval '1 millisecond' WHERE queue_id = $1",
            &[q.id.into(), ms(v).into()],
        ),
        Setting::IdleMs(v) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_ticker_idle_period = $2 * interval '1 millisecond' WHERE queue_id = $1",
            &[q.id.into(), ms(v).into()],
        ),
        Setting::RotationMs(v) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_rotation_period = $2 * interval '1 millisecond' WHERE queue_id = $1",
            &[q.id.into(), ms(v).into()],
        ),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("3 seconds"), Some(3000.0));
        assert_eq!(parse_duration_ms("90"), Some(90_000.0));
        assert_eq!(parse_duration_ms("500ms"), Some(500.0));
        assert_eq!(parse_duration_ms("1 minute"), Some(60_000.0));
        assert_eq!(parse_duration_ms("2 hours 30 minutes"), Some(9_000_000.0));
        assert_eq!(parse_duration_ms("00:01:30"), Some(90_000.0));
        assert_eq!(parse_duration_ms("0"), Some(0.0));
        assert_eq!(parse_duration_ms("-1 s"), None);
        assert_eq!(parse_duration_ms("soon"), None);
        assert_eq!(parse_duration_ms(""), None);
        assert_eq!(parse_duration_ms("5 fortnights"), None);
    }

    #[test]
    fn settings() {
        assert_eq!(
            parse_setting("ticker_max_count", Some("10")),
            Ok(Setting::MaxCount(10))
        );
        assert_eq!(
            parse_setting("queue_ticker_max_count", None),
            Ok(Setting::MaxCount(500))
        );
        assert!(parse_setting("ticker_max_count", Some("0")).is_err());
        assert!(parse_setting("ticker_max_count", Some("x")).is_err());
        assert_eq!(
            parse_setting("ticker_paused", Some("on")),
            Ok(Setting::Paused(true))
        );
        assert_eq!(
            parse_setting("ticker_paused", None),
            Ok(Setting::Paused(false))
        );
        assert_eq!(
            parse_setting("max_retries", None),
            Ok(Setting::MaxRetries(5))
        );
        assert!(parse_setting("max_retries", Some("-1")).is_err());
        assert_eq!(
            parse_setting("rotation_period", None),
            Ok(Setting::RotationMs(7_200_000.0))
        );
        assert_eq!(
            parse_setting("ticker_max_lag", None),
            Ok(Setting::MaxLagMs(3000.0))
        );
        assert_eq!(
            parse_setting("ticker_idle_period", None),
            Ok(Setting::IdleMs(60_000.0))
        );
        assert!(parse_setting("bogus", Some("1")).is_err());
        assert!(parse_setting("rotation_period", Some("36500 days")).is_ok());
        assert!(parse_setting("rotation_period", Some("99999999999999999999 days")).is_err());
    }
}
