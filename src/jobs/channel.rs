//! The NOTIFY channel of a job queue, `pgque.job_channel(queue_name)`.
//!
//! Queue names take up to 57 bytes (PgQue's limit: an event queue's channel
//! `pgque_<queue>` then fits NAMEDATALEN - 1 = 63 bytes). A job queue's
//! channel has the longer prefix `pgque_jobs_`, which fits names up to 52
//! bytes; a longer name's channel is the prefix and the name's md5 in hex:
//!
//! - up to 52 bytes: `pgque_jobs_<queue>`
//! - 53..57 bytes:   `pgque_jobs_<md5(queue)>` (43 bytes)
//!
//! Clients never compute this: they call `pgque.job_channel(queue)` and
//! LISTEN on the result. pgque's own job NOTIFY statements (enqueue,
//! lifecycle, sweeps) spell the same rule as the SQL expression
//! `(CASE WHEN octet_length(q) <= 52 THEN 'pgque_jobs_' || q ELSE
//! 'pgque_jobs_' || md5(q) END)` rather than calling this function, so they
//! also work between installing a new library and `ALTER EXTENSION pgque
//! UPDATE` (the function does not exist yet then); the tests hold the two to
//! the same result (`job_channel_matches_the_notify_expression`, and
//! pg_test's `unusual_valid_names_work_end_to_end` LISTENs on it).
use crate::error::{self, MAX_QUEUE_NAME};
use pgrx::prelude::*;

/// The prefix of every job queue channel.
pub const PREFIX: &str = "pgque_jobs_";
/// Longest NOTIFY channel: NAMEDATALEN - 1.
pub const MAX_CHANNEL: usize = 63;

/// The channel of job queue `queue` (a valid queue name), given the md5 of
/// the name in hex (PostgreSQL's `md5(text)`).
pub fn channel_with(queue: &str, md5_hex: impl FnOnce(&str) -> String) -> String {
    if PREFIX.len() + queue.len() <= MAX_CHANNEL {
        format!("{PREFIX}{queue}")
    } else {
        format!("{PREFIX}{}", md5_hex(queue))
    }
}

/// PostgreSQL's md5(text) of `s`, in hex.
fn md5_hex(s: &str) -> String {
    unsafe { pgrx::direct_function_call::<String>(pg_sys::md5_text, &[s.into_datum()]) }
        .expect("md5 of a text is never NULL")
}

/// job_channel(queue_name) → the NOTIFY channel of that job queue (LISTEN on
/// it to wake when a job becomes ready). A pure function of the name, so it
/// works before the queue exists; name errors as for any queue (22004,
/// 42602, 42622). No SECURITY DEFINER and no settings: it reads nothing.
#[pg_extern(immutable, parallel_safe)]
fn job_channel(queue_name: Option<&str>) -> String {
    let q = error::valid_name(queue_name, "queue_name", MAX_QUEUE_NAME);
    channel_with(q, md5_hex)
}

/// Lock class of a NOTIFY channel while a queue that would use it is made:
/// an event queue `jobs_x` and a job queue `x` made at the same moment
/// take the same lock, so one of them sees the other.
const CHANNEL_LOCK_CLASS: i32 = 0x6A6F_626E; // "jobn"

/// 42710 when the NOTIFY channel of a queue about to be made is the channel
/// of an existing queue of the other kind: an event queue's is
/// `pgque_<queue>` (PgQue's, which its clients LISTEN on), a job queue's
/// `pgque_jobs_<queue>` or its hashed form, so event queue `jobs_x` and job
/// queue `x` would wake each other's listeners with each other's traffic.
/// `event_queue`: the name is an event queue's (else a job queue's). Runs
/// in the creating transaction, as the schema's owner.
pub fn refuse_shared_channel(name: &str, event_queue: bool) {
    let channel = if event_queue {
        format!("pgque_{name}")
    } else {
        channel_with(name, md5_hex)
    };
    if !channel.starts_with(PREFIX) {
        // no job queue's channel starts otherwise
        return;
    }
    Spi::run_with_args(
        crate::locks::sql("SELECT pgque.xact_lock($1, pg_catalog.hashtext($2))"),
        &[CHANNEL_LOCK_CLASS.into(), channel.as_str().into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
    let other = if event_queue {
        // the job queue whose channel this is: named by the rest of it, or
        // a long name whose md5 it is
        Spi::get_one_with_args::<String>(
            "SELECT j.queue_name FROM pgque.job_queues j
              WHERE j.queue_name OPERATOR(pg_catalog.=) pg_catalog.substr($1, 12)
                 OR (pg_catalog.octet_length(j.queue_name) > 52
                     AND pg_catalog.md5(j.queue_name) OPERATOR(pg_catalog.=) pg_catalog.substr($1, 12))
              LIMIT 1",
            &[channel.as_str().into()],
        )
    } else {
        Spi::get_one_with_args::<String>(
            "SELECT q.queue_name FROM pgque.queue q
              WHERE q.queue_name OPERATOR(pg_catalog.=) pg_catalog.substr($1, 7)",
            &[channel.as_str().into()],
        )
    }
    .unwrap_or(None);
    if let Some(other) = other {
        let (kind, other_kind) = if event_queue {
            ("event queue", "job queue")
        } else {
            ("job queue", "event queue")
        };
        error::raise_detail(
            error::DUPLICATE_OBJECT,
            format!("{kind} {name:?} would share the NOTIFY channel {channel:?} with {other_kind} {other:?}"),
            "Each queue's listeners are woken by its own channel only; choose another name.",
        );
    }
}

#[cfg(test)]
mod pure_tests {
    use super::*;

    fn fake_md5(_: &str) -> String {
        "0123456789abcdef0123456789abcdef".to_string()
    }

    #[test]
    fn short_names_keep_the_plain_channel() {
        assert_eq!(channel_with("jq", fake_md5), "pgque_jobs_jq");
        let q52 = "q".repeat(52);
        assert_eq!(channel_with(&q52, fake_md5), format!("pgque_jobs_{q52}"));
        assert_eq!(channel_with(&q52, fake_md5).len(), 63);
        // 26 two-byte letters are 52 bytes: still the plain form.
        let u = "ж".repeat(26);
        assert_eq!(channel_with(&u, fake_md5), format!("pgque_jobs_{u}"));
    }

    #[test]
    fn long_names_get_the_hashed_channel() {
        for n in 53..=MAX_QUEUE_NAME {
            let ch = channel_with(&"x".repeat(n), fake_md5);
            assert_eq!(ch, "pgque_jobs_0123456789abcdef0123456789abcdef");
            assert!(ch.len() <= MAX_CHANNEL);
        }
        let u = "ж".repeat(27); // 54 bytes
        assert!(channel_with(&u, fake_md5).starts_with(PREFIX));
        assert_eq!(channel_with(&u, fake_md5).len(), 43);
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// pgque.job_channel and the expression pgque's NOTIFY statements use
    /// give the same channel for short, longest, and multibyte names.
    #[pg_test]
    fn job_channel_matches_the_notify_expression() {
        let names = [
            "jq".to_string(),
            "q".repeat(52),
            "q".repeat(53),
            "q".repeat(57),
            "ж".repeat(26),
            "ж".repeat(28),
        ];
        for q in names {
            let (f, e) = Spi::get_two_with_args::<String, String>(
                "SELECT pgque.job_channel($1), \
                        (CASE WHEN octet_length($1) <= 52 THEN 'pgque_jobs_' || $1 ELSE 'pgque_jobs_' || md5($1) END)",
                &[q.as_str().into()],
            )
            .unwrap();
            assert_eq!(f, e, "{q}");
            let f = f.unwrap();
            assert!(f.len() <= 63, "{f}");
            if q.len() > 52 {
                assert_eq!(f.len(), 43, "{f}");
            }
        }
    }
}
