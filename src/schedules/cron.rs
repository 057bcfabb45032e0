//! The cron grammar and its slot arithmetic, in plain Rust (no server needed,
//! tested with plain `#[test]`s).
//!
//! Grammar (docs/schedules.md): 5 fields `minute hour day-of-month month
//! day-of-week`, or 6 with seconds first; each field a `*`, a value, a range
//! `a-b`, a step `*/n`, `a-b/n` or `a/n`, or a comma list of those; months and
//! weekdays also by name (`JAN`..`DEC`, `SUN`..`SAT`, any case); weekday 0 and
//! 7 are Sunday; `?` is `*` in the day fields; and the aliases `@yearly`
//! (`@annually`), `@monthly`, `@weekly`, `@daily` (`@midnight`), `@hourly`.
//!
//! Day-of-month and day-of-week combine as in Vixie cron: when both fields are
//! restricted a day matches if EITHER matches; a field that starts with `*`
//! (also `*/2`) counts as unrestricted, and then only the other field decides.
//!
//! Slots are wall-clock times in the schedule's time zone, mapped to instants:
//! - a wall-clock time that does not exist (skipped by a spring-forward
//!   change) fires once, shifted forward by the length of the gap (02:30 on a
//!   day the clocks go from 02:00 to 03:00 fires at 03:30 new time: what
//!   PostgreSQL's `timestamp AT TIME ZONE` gives for it too); two slots that
//!   land on one instant fire once;
//! - a wall-clock time that occurs twice (a fall-back change) fires once, at
//!   its first occurrence.
//!
//! Instants are whole seconds since the Unix epoch (`i64`), always UTC.
use chrono::{
    DateTime, Datelike, Duration, LocalResult, NaiveDate, NaiveDateTime, Offset, TimeZone,
    Timelike, Utc,
};
use chrono_tz::Tz;

/// A parsed cron expression: one bit per allowed value of each field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    seconds: u64,
    minutes: u64,
    hours: u32,
    /// bits 1..=31
    dom: u32,
    /// bits 1..=12
    months: u16,
    /// bits 0..=6, Sunday = 0
    dow: u8,
    dom_star: bool,
    dow_star: bool,
}

/// How far ahead a slot is looked for before an expression is declared to
/// never fire (`0 0 30 2 *`). Nine years cover every leap day, also across
/// a century year that is not a leap year.
const HORIZON_YEARS: i32 = 9;

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

struct Field {
    what: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
    /// first value the names stand for (JAN = 1, SUN = 0)
    names_base: u32,
}

const SECOND: Field = Field {
    what: "second",
    min: 0,
    max: 59,
    names: &[],
    names_base: 0,
};
const MINUTE: Field = Field {
    what: "minute",
    min: 0,
    max: 59,
    names: &[],
    names_base: 0,
};
const HOUR: Field = Field {
    what: "hour",
    min: 0,
    max: 23,
    names: &[],
    names_base: 0,
};
const DOM: Field = Field {
    what: "day of month",
    min: 1,
    max: 31,
    names: &[],
    names_base: 0,
};
const MONTH: Field = Field {
    what: "month",
    min: 1,
    max: 12,
    names: &MONTHS,
    names_base: 1,
};
// 7 is accepted as a second Sunday and folded onto 0.
const DOW: Field = Field {
    what: "day of week",
    min: 0,
    max: 7,
    names: &DAYS,
    names_base: 0,
};

fn value(f: &Field, s: &str) -> Result<u32, String> {
    if let Some(i) = f.names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
        return Ok(i as u32 + f.names_base);
    }
    let v: u32 = s
        .parse()
        .map_err(|_| format!("{} field: {s:?} is not a number{}", f.what, name_hint(f)))?;
    if v < f.min || v > f.max {
        return Err(format!(
            "{} field: {v} is out of range {}-{}",
            f.what, f.min, f.max
        ));
    }
    Ok(v)
}

fn name_hint(f: &Field) -> &'static str {
    if f.names.is_empty() {
        ""
    } else if f.names_base == 1 {
        " or a month name (JAN..DEC)"
    } else {
        " or a day name (SUN..SAT)"
    }
}

/// Parses one field into a bit set; returns it with whether the field starts
/// with `*` (or is `?`), which the day-of-month / day-of-week rule needs.
fn field(f: &Field, text: &str, question_ok: bool) -> Result<(u64, bool), String> {
    let star = text.starts_with('*') || (question_ok && text == "?");
    let mut bits = 0u64;
    for part in text.split(',') {
        if part.is_empty() {
            return Err(format!("{} field: empty list element in {text:?}", f.what));
        }
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s
                    .parse()
                    .map_err(|_| format!("{} field: step {s:?} is not a number", f.what))?;
                if step == 0 || step > f.max {
                    return Err(format!(
                        "{} field: step {step} must be between 1 and {}",
                        f.what, f.max
                    ));
                }
                (r, Some(step))
            }
            None => (part, None),
        };
        let (lo, hi) = if range == "*" || (question_ok && range == "?") {
            (f.min, f.max)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (value(f, a)?, value(f, b)?);
            if a > b {
                return Err(format!("{} field: range {range:?} runs backwards", f.what));
            }
            (a, b)
        } else {
            let a = value(f, range)?;
            // `a/n` means a, a+n, ... up to the field's maximum
            (a, if step.is_some() { f.max } else { a })
        };
        let mut v = lo;
        while v <= hi {
            bits |= 1u64 << v;
            v += step.unwrap_or(1);
        }
    }
    Ok((bits, star))
}

impl Cron {
    /// Parses a cron expression (see the module comment); the error says
    /// which field is wrong and why.
    pub fn parse(text: &str) -> Result<Cron, String> {
        let text = text.trim();
        let expanded = match text.to_ascii_lowercase().as_str() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            a if a.starts_with('@') => {
                return Err(format!(
                    "unknown alias {text:?}; known are @yearly @annually @monthly @weekly @daily @midnight @hourly"
                ))
            }
            _ => text,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let (sec, rest) = match fields.len() {
            5 => ("0", &fields[..]),
            6 => (fields[0], &fields[1..]),
            n => {
                return Err(format!(
                    "a cron expression has 5 fields (minute hour day month weekday) or 6 (seconds first), not {n}"
                ))
            }
        };
        let (seconds, _) = field(&SECOND, sec, false)?;
        let (minutes, _) = field(&MINUTE, rest[0], false)?;
        let (hours, _) = field(&HOUR, rest[1], false)?;
        let (dom, dom_star) = field(&DOM, rest[2], true)?;
        let (months, _) = field(&MONTH, rest[3], false)?;
        let (dow, dow_star) = field(&DOW, rest[4], true)?;
        let dow = (dow | (dow >> 7)) & 0x7F; // 7 is Sunday too
        Ok(Cron {
            seconds,
            minutes,
            hours: hours as u32,
            dom: dom as u32,
            months: months as u16,
            dow: dow as u8,
            dom_star,
            dow_star,
        })
    }

    fn day_matches(&self, d: NaiveDate) -> bool {
        let by_dom = self.dom & (1 << d.day()) != 0;
        let by_dow = self.dow & (1 << d.weekday().num_days_from_sunday()) != 0;
        // Vixie cron: OR when both are restricted, else AND (a plain `*`
        // then has every bit, so the other field alone decides)
        if self.dom_star || self.dow_star {
            by_dom && by_dow
        } else {
            by_dom || by_dow
        }
    }

    /// The first wall-clock time strictly after `after` (second precision)
    /// that the expression names, within HORIZON_YEARS; None if none.
    pub fn next_local(&self, after: NaiveDateTime) -> Option<NaiveDateTime> {
        let limit_year = after.year() + HORIZON_YEARS;
        let mut t = after.with_nanosecond(0)? + Duration::seconds(1);
        loop {
            if t.year() > limit_year {
                return None;
            }
            let date = t.date();
            if self.months & (1 << t.month()) == 0 {
                // first day of the next month
                let (y, m) = if t.month() == 12 {
                    (t.year() + 1, 1)
                } else {
                    (t.year(), t.month() + 1)
                };
                t = NaiveDate::from_ymd_opt(y, m, 1)?.and_hms_opt(0, 0, 0)?;
                continue;
            }
            if !self.day_matches(date) {
                t = date.succ_opt()?.and_hms_opt(0, 0, 0)?;
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = date.and_hms_opt(t.hour(), 0, 0)? + Duration::hours(1);
                continue;
            }
            if self.minutes & (1 << t.minute()) == 0 {
                t = date.and_hms_opt(t.hour(), t.minute(), 0)? + Duration::minutes(1);
                continue;
            }
            // the next allowed second in this minute, if any
            let rest = self.seconds >> t.second();
            if rest == 0 {
                t = date.and_hms_opt(t.hour(), t.minute(), 0)? + Duration::minutes(1);
                continue;
            }
            return t.with_second(t.second() + rest.trailing_zeros());
        }
    }
}

/// Parses an IANA time-zone name (`UTC`, `Europe/Berlin`).
pub fn zone(name: &str) -> Result<Tz, String> {
    name.parse::<Tz>().map_err(|_| {
        format!("unknown time zone {name:?} (an IANA name such as 'Europe/Berlin' or 'UTC')")
    })
}

/// The instant of wall-clock time `t` in `tz`: the first occurrence of a
/// repeated time; a skipped time shifted forward by its gap.
pub fn instant(tz: &Tz, t: NaiveDateTime) -> i64 {
    match tz.from_local_datetime(&t) {
        LocalResult::Single(d) => d.timestamp(),
        LocalResult::Ambiguous(a, b) => a.timestamp().min(b.timestamp()),
        LocalResult::None => {
            // In a gap: read t with the offset in force before it (found by
            // stepping back to a wall-clock time that exists; gaps are at
            // most a day long, so 15-minute steps find one quickly).
            let mut probe = t;
            for _ in 0..200 {
                probe -= Duration::minutes(15);
                match tz.from_local_datetime(&probe) {
                    LocalResult::Single(d) | LocalResult::Ambiguous(d, _) => {
                        let off = d.offset().fix().local_minus_utc() as i64;
                        return t.and_utc().timestamp() - off;
                    }
                    LocalResult::None => {}
                }
            }
            t.and_utc().timestamp()
        }
    }
}

/// The first slot of `cron` in `tz` strictly after instant `after`, or None
/// if the expression names no time within HORIZON_YEARS.
pub fn next_after(cron: &Cron, tz: &Tz, after: i64) -> Option<i64> {
    let utc = DateTime::<Utc>::from_timestamp(after, 0)?;
    let mut local = utc.with_timezone(tz).naive_local();
    // A wall-clock time of a fall-back hour may map to an instant at or
    // before `after` (its first occurrence passed already): skip it. Bounded:
    // a repeated stretch is at most a few hours of slots.
    for _ in 0..100_000 {
        let cand = cron.next_local(local)?;
        let at = instant(tz, cand);
        if at > after {
            return Some(at);
        }
        local = cand;
    }
    None
}

/// Most missed slots one schedule enqueues after an outage under misfire
/// `catch_up`: the latest CATCH_UP_MAX slots are enqueued, older ones are
/// dropped (docs/schedules.md).
pub const CATCH_UP_MAX: usize = 1000;

/// The latest `keep` slots in `[first, now]`, ascending, where `first` is
/// the schedule's next_run_at (itself a slot, or the instant it was due).
/// The work is bounded by the slots in a window only a few times larger than
/// the one holding `keep` slots, not by the length of the outage: a
/// per-second schedule that was down for a month costs a few thousand steps.
pub fn due_slots(cron: &Cron, tz: &Tz, first: i64, now: i64, keep: usize) -> Vec<i64> {
    if first > now || keep == 0 {
        return Vec::new();
    }
    let collect = |from_excl: i64| -> Vec<i64> {
        // ring of the latest `keep` slots after from_excl up to now
        let mut out: std::collections::VecDeque<i64> = std::collections::VecDeque::new();
        let mut t = from_excl;
        while let Some(s) = next_after(cron, tz, t) {
            if s > now {
                break;
            }
            if out.len() == keep {
                out.pop_front();
            }
            out.push_back(s);
            t = s;
        }
        out.into()
    };
    // the common case: few slots due since `first`
    let mut count = 0usize;
    let mut t = first - 1;
    while let Some(s) = next_after(cron, tz, t) {
        if s > now {
            return collect(first - 1);
        }
        count += 1;
        if count > keep {
            break;
        }
        t = s;
    }
    // many slots due: look back from now over growing windows
    let mut window: i64 = 60;
    loop {
        let from = (now - window).max(first - 1);
        let slots = collect(from);
        if slots.len() >= keep || from == first - 1 {
            return slots;
        }
        window = window.saturating_mul(4);
    }
}

/// An instant as RFC 3339 in UTC (`2026-03-08T07:30:00Z`): the
/// `scheduled_for` of a fired job, the same whatever the session's TimeZone.
pub fn rfc3339(at: i64) -> String {
    DateTime::<Utc>::from_timestamp(at, 0)
        .map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> i64 {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp()
    }
    fn slots(cron: &str, tz: &str, from: &str, n: usize) -> Vec<String> {
        let c = Cron::parse(cron).unwrap();
        let z = zone(tz).unwrap();
        let mut t = utc(from);
        let mut out = vec![];
        for _ in 0..n {
            t = next_after(&c, &z, t).unwrap();
            out.push(rfc3339(t));
        }
        out
    }

    #[test]
    fn five_fields_every_minute_and_fixed_times() {
        assert_eq!(
            slots("* * * * *", "UTC", "2026-01-01T10:00:30Z", 2),
            ["2026-01-01T10:01:00Z", "2026-01-01T10:02:00Z"]
        );
        assert_eq!(
            slots("30 2 * * *", "UTC", "2026-01-01T03:00:00Z", 2),
            ["2026-01-02T02:30:00Z", "2026-01-03T02:30:00Z"]
        );
    }

    #[test]
    fn six_fields_put_seconds_first() {
        assert_eq!(
            slots("*/20 * * * * *", "UTC", "2026-01-01T10:00:00Z", 4),
            [
                "2026-01-01T10:00:20Z",
                "2026-01-01T10:00:40Z",
                "2026-01-01T10:01:00Z",
                "2026-01-01T10:01:20Z"
            ]
        );
        assert_eq!(
            slots("15 0 12 * * *", "UTC", "2026-01-01T00:00:00Z", 1),
            ["2026-01-01T12:00:15Z"]
        );
    }

    #[test]
    fn ranges_steps_and_lists() {
        assert_eq!(
            slots("0 9-17/4 * * *", "UTC", "2026-01-01T00:00:00Z", 4),
            [
                "2026-01-01T09:00:00Z",
                "2026-01-01T13:00:00Z",
                "2026-01-01T17:00:00Z",
                "2026-01-02T09:00:00Z"
            ]
        );
        assert_eq!(
            slots("5,10,50 * * * *", "UTC", "2026-01-01T00:07:00Z", 3),
            [
                "2026-01-01T00:10:00Z",
                "2026-01-01T00:50:00Z",
                "2026-01-01T01:05:00Z"
            ]
        );
        // a/n: from a to the maximum by n
        assert_eq!(
            slots("50/5 * * * *", "UTC", "2026-01-01T00:00:00Z", 3),
            [
                "2026-01-01T00:50:00Z",
                "2026-01-01T00:55:00Z",
                "2026-01-01T01:50:00Z"
            ]
        );
    }

    #[test]
    fn month_and_day_names_any_case() {
        let a = Cron::parse("0 0 * JAN,jul mon-FRI").unwrap();
        let b = Cron::parse("0 0 * 1,7 1-5").unwrap();
        assert_eq!(a, b);
        // 2026-07-04 is a Saturday: the next weekday of July is the 6th
        assert_eq!(
            slots("0 8 * JUL MON-FRI", "UTC", "2026-07-04T00:00:00Z", 1),
            ["2026-07-06T08:00:00Z"]
        );
        // 7 is Sunday as 0 is
        assert_eq!(
            Cron::parse("0 0 * * 7").unwrap(),
            Cron::parse("0 0 * * SUN").unwrap()
        );
    }

    #[test]
    fn aliases() {
        assert_eq!(
            Cron::parse("@yearly").unwrap(),
            Cron::parse("0 0 1 1 *").unwrap()
        );
        assert_eq!(
            Cron::parse("@annually").unwrap(),
            Cron::parse("0 0 1 1 *").unwrap()
        );
        assert_eq!(
            Cron::parse("@monthly").unwrap(),
            Cron::parse("0 0 1 * *").unwrap()
        );
        assert_eq!(
            Cron::parse("@weekly").unwrap(),
            Cron::parse("0 0 * * 0").unwrap()
        );
        assert_eq!(
            Cron::parse("@daily").unwrap(),
            Cron::parse("0 0 * * *").unwrap()
        );
        assert_eq!(
            Cron::parse("@HOURLY").unwrap(),
            Cron::parse("0 * * * *").unwrap()
        );
        assert_eq!(
            slots("@weekly", "UTC", "2026-12-01T00:00:00Z", 1),
            ["2026-12-06T00:00:00Z"]
        );
    }

    #[test]
    fn day_of_month_or_day_of_week_when_both_are_restricted() {
        // the 13th, or any Friday: 2026-02-06 is a Friday, the 13th is one too
        assert_eq!(
            slots("0 0 13 * FRI", "UTC", "2026-02-01T00:00:00Z", 4),
            [
                "2026-02-06T00:00:00Z",
                "2026-02-13T00:00:00Z",
                "2026-02-20T00:00:00Z",
                "2026-02-27T00:00:00Z"
            ]
        );
        assert_eq!(
            slots("0 0 1 * MON", "UTC", "2026-06-01T00:00:00Z", 3),
            // June 1st 2026 is a Monday; then the 8th; July 1st is a Wednesday
            [
                "2026-06-08T00:00:00Z",
                "2026-06-15T00:00:00Z",
                "2026-06-22T00:00:00Z"
            ]
        );
        // one side starting with '*' leaves the other to decide alone
        assert_eq!(
            slots("0 0 * * FRI", "UTC", "2026-02-01T00:00:00Z", 1),
            ["2026-02-06T00:00:00Z"]
        );
        assert_eq!(
            slots("0 0 */10 * MON", "UTC", "2026-02-01T00:00:00Z", 2),
            // */10 starts with '*': AND, as Vixie cron has it: Mondays
            // that are the 1st, 11th, 21st or 31st
            ["2026-05-11T00:00:00Z", "2026-06-01T00:00:00Z"]
        );
    }

    #[test]
    fn leap_day_and_never() {
        assert_eq!(
            slots("0 0 29 2 *", "UTC", "2026-01-01T00:00:00Z", 1),
            ["2028-02-29T00:00:00Z"]
        );
        let c = Cron::parse("0 0 30 2 *").unwrap();
        assert_eq!(
            next_after(&c, &zone("UTC").unwrap(), utc("2026-01-01T00:00:00Z")),
            None
        );
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        for (e, needle) in [
            ("", "5 fields"),
            ("* * * *", "5 fields"),
            ("* * * * * * *", "5 fields"),
            ("60 * * * *", "minute field: 60 is out of range"),
            ("* 24 * * *", "hour field"),
            ("* * 0 * *", "day of month field"),
            ("* * * 13 *", "month field"),
            ("* * * * 8", "day of week field"),
            ("*/0 * * * *", "step 0"),
            ("5-1 * * * *", "backwards"),
            ("a * * * *", "not a number"),
            ("1,,2 * * * *", "empty list element"),
            ("* * * FOO *", "month name"),
            ("@reboot", "unknown alias"),
            ("61 * * * * *", "second field"),
        ] {
            let err = Cron::parse(e).unwrap_err();
            assert!(err.contains(needle), "{e:?}: {err}");
        }
        assert!(zone("Mars/Olympus").is_err());
        assert!(zone("Europe/Berlin").is_ok());
    }

    // America/New_York: 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST.

    #[test]
    fn spring_forward_gap_fires_once_shifted_by_the_gap() {
        // 02:30 does not exist on 2026-03-08: fires once, at 03:30 EDT (07:30Z)
        assert_eq!(
            slots("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 3),
            [
                "2026-03-08T07:30:00Z",
                "2026-03-09T06:30:00Z",
                "2026-03-10T06:30:00Z"
            ]
        );
        // slots of the gap that land on an instant that also is a slot fire once
        assert_eq!(
            slots(
                "0,30 2,3 * * *",
                "America/New_York",
                "2026-03-08T06:00:00Z",
                3
            ),
            // 01:00 EST = 06:00Z; then 02:00->03:00 EDT (07:00Z), 02:30 and 03:30 -> 07:30Z once, 03:00 == 07:00Z once
            [
                "2026-03-08T07:00:00Z",
                "2026-03-08T07:30:00Z",
                "2026-03-09T06:00:00Z"
            ]
        );
        // a 02:30 job in Europe/Berlin (02:00 CET -> 03:00 CEST on 2026-03-29)
        assert_eq!(
            slots("30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", 2),
            ["2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"]
        );
    }

    #[test]
    fn fall_back_repeat_fires_once_at_the_first_occurrence() {
        // 01:30 happens twice on 2026-11-01 (EDT 05:30Z, then EST 06:30Z): once, at 05:30Z
        assert_eq!(
            slots("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 3),
            [
                "2026-11-01T05:30:00Z",
                "2026-11-02T06:30:00Z",
                "2026-11-03T06:30:00Z"
            ]
        );
        // asked from inside the repeated hour (after the first 01:30): next day
        assert_eq!(
            slots("30 1 * * *", "America/New_York", "2026-11-01T06:10:00Z", 1),
            ["2026-11-02T06:30:00Z"]
        );
        // the 02:30 job of the issue on fall-back day: 02:30 exists once (EST)
        assert_eq!(
            slots("30 2 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2),
            ["2026-11-01T07:30:00Z", "2026-11-02T07:30:00Z"]
        );
    }

    #[test]
    fn hourly_across_both_changes_has_no_duplicates() {
        let c = Cron::parse("@hourly").unwrap();
        let z = zone("America/New_York").unwrap();
        for from in ["2026-03-07T12:00:00Z", "2026-10-31T12:00:00Z"] {
            let mut t = utc(from);
            let mut prev = t;
            for _ in 0..48 {
                t = next_after(&c, &z, t).unwrap();
                assert!(t > prev);
                assert_eq!(t % 1800, 0);
                prev = t;
            }
        }
    }

    #[test]
    fn due_slots_skip_keeps_the_latest_and_catch_up_keeps_all_up_to_the_cap() {
        let c = Cron::parse("* * * * *").unwrap();
        let z = zone("UTC").unwrap();
        let first = utc("2026-01-01T10:00:00Z");
        let now = utc("2026-01-01T10:05:30Z");
        assert_eq!(
            due_slots(&c, &z, first, now, 1),
            vec![utc("2026-01-01T10:05:00Z")]
        );
        let all = due_slots(&c, &z, first, now, CATCH_UP_MAX);
        assert_eq!(all.len(), 6);
        assert_eq!(all[0], first);
        assert_eq!(due_slots(&c, &z, now + 10, now, 5), Vec::<i64>::new());
        // a per-second schedule down for 30 days: the latest 1000, in order
        let s = Cron::parse("* * * * * *").unwrap();
        let now = first + 30 * 86_400;
        let v = due_slots(&s, &z, first, now, CATCH_UP_MAX);
        assert_eq!(v.len(), CATCH_UP_MAX);
        assert_eq!(*v.last().unwrap(), now);
        assert_eq!(v[0], now - CATCH_UP_MAX as i64 + 1);
        assert_eq!(due_slots(&s, &z, first, now, 1), vec![now]);
        // a yearly schedule down for three years
        let y = Cron::parse("@yearly").unwrap();
        let v = due_slots(
            &y,
            &z,
            utc("2024-01-01T00:00:00Z"),
            utc("2026-06-01T00:00:00Z"),
            100,
        );
        assert_eq!(
            v,
            vec![
                utc("2024-01-01T00:00:00Z"),
                utc("2025-01-01T00:00:00Z"),
                utc("2026-01-01T00:00:00Z")
            ]
        );
    }
}
