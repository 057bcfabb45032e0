//! Argument checks shared by several job entry points (enqueue, flows,
//! dispatch, fail / snooze, rate limits): each raises a clear error with its
//! SQLSTATE (src/error.rs) and changes nothing. Every module that takes such
//! an argument imports its check from here, not from another entry point,
//! and the limits the checks enforce live here with them.
use crate::error::{self, raise, raise_detail};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;

/// Priorities accepted (lower runs first).
pub const MIN_PRIORITY: i16 = -1000;
pub const MAX_PRIORITY: i16 = 1000;
/// The most attempts a job may be given (a queue's max_attempts, a job's).
pub const MAX_MAX_ATTEMPTS: i32 = 1000;

/// 22003 unless `p` is a priority (MIN_PRIORITY..=MAX_PRIORITY).
pub fn check_priority(p: i32) {
    if !(MIN_PRIORITY as i32..=MAX_PRIORITY as i32).contains(&p) {
        raise(
            error::OUT_OF_RANGE,
            format!("priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}, not {p}"),
        );
    }
}

/// 22003 unless `n` is an attempt count (1..=MAX_MAX_ATTEMPTS).
pub fn check_max_attempts(n: i32) {
    if !(1..=MAX_MAX_ATTEMPTS).contains(&n) {
        raise(
            error::OUT_OF_RANGE,
            format!(
                "max_attempts must be between 1 and {}, not {n}",
                MAX_MAX_ATTEMPTS
            ),
        );
    }
}

/// 22023 for a run_at that is not finite (a job never promoted, or one
/// whose age no status view can compute).
pub fn check_run_at(t: TimestampWithTimeZone) {
    if t.is_infinity() || t.is_neg_infinity() {
        raise(error::INVALID_PARAMETER_VALUE, "run_at must be finite");
    }
}

/// Raises 22023 unless `v` is a positive, finite interval.
pub fn check_positive_interval(v: &Interval, what: &str) {
    let ok = Spi::get_one_with_args::<bool>(
        "SELECT $1 > interval '0' AND $1 < interval '1000 years'",
        &[(*v).into()],
    )
    .ok()
    .flatten()
    .unwrap_or(false);
    if !ok {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!("{what} must be a positive, finite interval"),
        );
    }
}

/// Refuses a depends_on with NULL elements (22004).
pub fn check_depends_on(d: &[Option<i64>]) -> Vec<i64> {
    if d.iter().any(Option::is_none) {
        raise_detail(
            error::NULL_VALUE_NOT_ALLOWED,
            "depends_on must not contain NULL",
            "Pass the ids of the jobs this one waits for.",
        );
    }
    d.iter().flatten().copied().collect()
}
