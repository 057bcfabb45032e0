//! Errors with SQLSTATEs, and the validation of names that every API shares.
//!
//! Every user-facing failure goes through `raise` with a specific code, so a
//! client can branch on SQLSTATE instead of parsing messages. The codes used:
//!
//! | situation                                   | SQLSTATE | name                        |
//! |---------------------------------------------|----------|-----------------------------|
//! | a required argument is NULL                 | 22004    | null_value_not_allowed      |
//! | a name is empty or has forbidden characters | 42602    | invalid_name                |
//! | a name is too long                          | 42622    | name_too_long               |
//! | unknown queue / consumer / batch / job      | 42704    | undefined_object            |
//! | the object exists already                   | 42710    | duplicate_object            |
//! | a parameter value is not acceptable         | 22023    | invalid_parameter_value     |
//! | a number is out of range                    | 22003    | numeric_value_out_of_range  |
//! | state forbids it (lease lost, batch open)   | 55000    | object_not_in_prerequisite_state |
//! | not JSON where JSON is required             | 22P02    | invalid_text_representation |
//! | a log job handled at REPEATABLE READ or above | 0A000  | feature_not_supported       |
//! | an administrator's step by another role     | 42501    | insufficient_privilege      |
//! | an array or count beyond its documented cap | 54000    | program_limit_exceeded      |
//! | a job output or progress over its size cap  | 54000    | program_limit_exceeded      |
//! | a partition key over 1 kB                   | 54000    | program_limit_exceeded      |
//! | an unknown field in a flow's job            | 42703    | undefined_column            |
//! | a dependency cycle in a flow                | 42P19    | invalid_recursion           |
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::PgLogLevel;

pub use PgSqlErrorCode::{
    ERRCODE_DUPLICATE_OBJECT as DUPLICATE_OBJECT,
    ERRCODE_FEATURE_NOT_SUPPORTED as FEATURE_NOT_SUPPORTED,
    ERRCODE_INSUFFICIENT_PRIVILEGE as INSUFFICIENT_PRIVILEGE, ERRCODE_INVALID_NAME as INVALID_NAME,
    ERRCODE_INVALID_PARAMETER_VALUE as INVALID_PARAMETER_VALUE,
    ERRCODE_INVALID_RECURSION as INVALID_RECURSION,
    ERRCODE_INVALID_TEXT_REPRESENTATION as INVALID_TEXT_REPRESENTATION,
    ERRCODE_NAME_TOO_LONG as NAME_TOO_LONG,
    ERRCODE_NULL_VALUE_NOT_ALLOWED as NULL_VALUE_NOT_ALLOWED,
    ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE as OUT_OF_RANGE,
    ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE as WRONG_STATE,
    ERRCODE_PROGRAM_LIMIT_EXCEEDED as LIMIT_EXCEEDED, ERRCODE_UNDEFINED_COLUMN as UNDEFINED_COLUMN,
    ERRCODE_UNDEFINED_OBJECT as UNDEFINED_OBJECT,
};

/// Raises an ERROR with `code`; never returns. The current transaction (or
/// subtransaction) is aborted by PostgreSQL, so nothing done so far persists.
pub fn raise(code: PgSqlErrorCode, msg: impl Into<String>) -> ! {
    ErrorReport::new(code, msg.into(), "pgque").report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

/// Like `raise`, with a DETAIL line.
pub fn raise_detail(code: PgSqlErrorCode, msg: impl Into<String>, detail: impl Into<String>) -> ! {
    ErrorReport::new(code, msg.into(), "pgque")
        .set_detail(detail.into())
        .report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

/// Unwraps a required argument or raises 22004 naming it.
pub fn required<T>(value: Option<T>, arg: &str) -> T {
    match value {
        Some(v) => v,
        None => raise(NULL_VALUE_NOT_ALLOWED, format!("{arg} must not be NULL")),
    }
}

/// Why a name was refused, as pure data so it can be tested without a server.
#[derive(Debug, PartialEq, Eq)]
pub enum NameProblem {
    Empty,
    TooLong { max: usize },
    BadChar(char),
}

/// Longest queue name, PgQue's: an event queue's NOTIFY channel
/// `pgque_<queue>` must fit in NAMEDATALEN - 1 = 63 bytes. Job queues take
/// the same names; their channel (`pgque.job_channel`, src/jobs/channel.rs)
/// is `pgque_jobs_<queue>` up to 52 bytes and a hashed form beyond.
pub const MAX_QUEUE_NAME: usize = 57;
/// Longest consumer / worker name.
pub const MAX_CONSUMER_NAME: usize = 200;

/// Most events one call returns (`max_return` of the receive functions,
/// `get_batch_cursor`'s quick limit) and one batch holds
/// (`pgque.batch_max_events`): a call materializes its events in the
/// backend's memory, so an unbounded count was a way to exhaust it.
pub const MAX_RETURN: i32 = 100_000;
/// Most elements of an array argument that a call checks, looks up or locks
/// one by one (complete_many, heartbeat): each element can cost a lock in
/// the server's shared lock table, so an unbounded array was a way to fill
/// it for every database.
pub const MAX_ARRAY: usize = 10_000;

/// Longest partition key (an event's ev_extra1), in bytes. Under the pause
/// policy a key is a btree key (the blocked-key markers, partition_held),
/// and a btree entry holds at most ~2.7 kB: a longer key could be sent, but
/// its event could then never be nacked and its slot's batch never moved
/// on. 1 kB, as an idempotency key.
pub const MAX_PARTITION_KEY: usize = 1024;

/// 54000 when a partition key (ev_extra1) is longer than MAX_PARTITION_KEY
/// bytes; `len` is its length in bytes.
pub fn check_partition_key_len(len: usize) {
    if len > MAX_PARTITION_KEY {
        raise(
            LIMIT_EXCEEDED,
            format!("partition key is {len} bytes long; the limit is {MAX_PARTITION_KEY}"),
        );
    }
}

/// [`check_partition_key_len`] of an optional key.
pub fn check_partition_key(key: Option<&str>) {
    if let Some(k) = key {
        check_partition_key_len(k.len());
    }
}

/// 54000 when `what` has more than `max` elements.
pub fn check_len(n: usize, what: &str, max: usize) {
    if n > max {
        raise(
            LIMIT_EXCEEDED,
            format!("{what} has {n} elements; at most {max} are accepted in one call"),
        );
    }
}

/// 54000 when a count of events to return is above MAX_RETURN.
pub fn check_return_count(n: i32, what: &str) {
    if n > MAX_RETURN {
        raise(
            LIMIT_EXCEEDED,
            format!("{what} is {n}; at most {MAX_RETURN} events are returned by one call"),
        );
    }
}

/// Checks a queue, consumer or other object name. Names are data, never SQL:
/// every statement passes them as parameters or quotes them as identifiers
/// (cursor names, LISTEN channels), so any printable text is a name, as in
/// PgQue (whose clients put spaces and quotes in queue names). Refused are
/// only what would corrupt the places names are shown: control characters
/// (a newline splits a log line or a Prometheus sample) and the Unicode
/// bidirectional controls, which make a name display as a different one.
/// `#` is further restricted for plain consumers by the callers, since it
/// separates slot and subconsumer names.
pub fn check_name(name: &str, max: usize) -> Result<(), NameProblem> {
    if name.is_empty() {
        return Err(NameProblem::Empty);
    }
    if name.len() > max {
        return Err(NameProblem::TooLong { max });
    }
    for c in name.chars() {
        if c.is_control() || is_bidi_control(c) {
            return Err(NameProblem::BadChar(c));
        }
    }
    Ok(())
}

/// The Unicode bidirectional formatting characters (embeddings, overrides,
/// isolates and the two marks): invisible, and able to reorder what follows.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `check_name` that raises: 22004 for NULL, 42602 for empty or bad characters,
/// 42622 for too long. Returns the name for chaining.
pub fn valid_name<'a>(name: Option<&'a str>, what: &str, max: usize) -> &'a str {
    let name = required(name, what);
    match check_name(name, max) {
        Ok(()) => name,
        Err(NameProblem::Empty) => raise(INVALID_NAME, format!("{what} must not be empty")),
        Err(NameProblem::TooLong { max }) => raise(
            NAME_TOO_LONG,
            format!("{what} is {} bytes long; the limit is {max}", name.len()),
        ),
        Err(NameProblem::BadChar(c)) => raise(
            INVALID_NAME,
            format!(
                "{what} {name:?} contains {c:?}: control and bidirectional formatting characters are not allowed in names"
            ),
        ),
    }
}

/// The five-character SQLSTATE of an error code, e.g. "42704" (PostgreSQL
/// packs it six bits a character; this is its unpack_sql_state).
pub fn sqlstate(code: PgSqlErrorCode) -> String {
    let mut v = code as i32;
    let mut s = String::with_capacity(5);
    for _ in 0..5 {
        s.push(char::from(((v & 0x3F) as u8) + b'0'));
        v >>= 6;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_unpack() {
        assert_eq!(sqlstate(UNDEFINED_OBJECT), "42704");
        assert_eq!(sqlstate(NULL_VALUE_NOT_ALLOWED), "22004");
        assert_eq!(sqlstate(INVALID_TEXT_REPRESENTATION), "22P02");
    }

    #[test]
    fn accepts_ordinary_names() {
        assert_eq!(check_name("orders", MAX_QUEUE_NAME), Ok(()));
        assert_eq!(check_name("tenant-42.events_v2", MAX_QUEUE_NAME), Ok(()));
        assert_eq!(check_name("очередь", MAX_QUEUE_NAME), Ok(()));
        // PgQue's own test suite names queues after its test ids.
        assert_eq!(
            check_name("pyt_test_round_trip_\"just a st_0123abcd", MAX_QUEUE_NAME),
            Ok(())
        );
        assert_eq!(check_name("x';drop", 10), Ok(()));
        assert_eq!(check_name("🚀 q;", 10), Ok(()));
    }

    #[test]
    fn refuses_empty_long_and_unprintable_names() {
        assert_eq!(check_name("", 10), Err(NameProblem::Empty));
        assert_eq!(
            check_name("abcdefghijk", 10),
            Err(NameProblem::TooLong { max: 10 })
        );
        assert_eq!(check_name("a\nb", 10), Err(NameProblem::BadChar('\n')));
        assert_eq!(check_name("a\tb", 10), Err(NameProblem::BadChar('\t')));
        assert_eq!(
            check_name("a\u{7f}", 10),
            Err(NameProblem::BadChar('\u{7f}'))
        );
        assert_eq!(
            check_name("a\u{85}", 10),
            Err(NameProblem::BadChar('\u{85}'))
        );
        assert_eq!(
            check_name("ab\u{202E}cd", 10),
            Err(NameProblem::BadChar('\u{202E}'))
        );
        assert_eq!(
            check_name("a\u{2066}b", 10),
            Err(NameProblem::BadChar('\u{2066}'))
        );
    }

    #[test]
    fn limit_counts_bytes_not_chars() {
        // 28 two-byte letters = 56 bytes: fits; 29 = 58 bytes: does not.
        assert_eq!(check_name(&"ж".repeat(28), MAX_QUEUE_NAME), Ok(()));
        assert!(check_name(&"ж".repeat(29), MAX_QUEUE_NAME).is_err());
        assert_eq!(check_name(&"q".repeat(57), MAX_QUEUE_NAME), Ok(()));
        assert!(check_name(&"q".repeat(58), MAX_QUEUE_NAME).is_err());
    }
}
