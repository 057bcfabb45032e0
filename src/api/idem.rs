//! Producer idempotency: send_idem (DESIGN.md section 4).
//!
//! At most one event per (queue, idem_key) while the key's window is live.
//! The claim lives in the rotating key ledger of sql/20_idempotency.sql and
//! is written in the same transaction as the event, so a rolled-back send
//! leaves no claim. Concurrent producers with one key meet at the ledger's
//! unique index: the second waits for the first to commit, then returns the
//! first's event id with deduped = true. No advisory locks.
//!
//! Keys must name the effect ("migrate:tenant-42:v7"), not the entity
//! ("tenant-42"): see docs/event-queues.md.
use crate::datum::JsonbText;
use crate::error::{self, raise, required};
use crate::log::{self, col, exec, first_row, Queue};
use pgrx::datum::Interval;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::JsonB;

extension_sql_file!(
    "../../sql/20_idempotency.sql",
    name = "idempotency",
    requires = ["event_log"]
);

/// Longest idempotency key, in bytes (it is a btree key).
pub const MAX_IDEM_KEY: usize = 1024;

/// Why a ttl was refused, as data (tested without a server).
#[derive(Debug, PartialEq, Eq)]
pub enum TtlProblem {
    Infinite,
    NotPositive,
}

/// A ttl must be finite and positive (PgQue accepted infinite ones: a key
/// that never expires is a leak). Months count as 30 days, as PostgreSQL's
/// interval comparison does.
pub fn check_ttl(months: i32, days: i32, micros: i64) -> Result<(), TtlProblem> {
    // PostgreSQL 17+ represents +/-infinity with every field at its extreme.
    if months == i32::MAX || months == i32::MIN {
        return Err(TtlProblem::Infinite);
    }
    let total = (months as i128 * 30 + days as i128) * 86_400_000_000 + micros as i128;
    if total <= 0 {
        return Err(TtlProblem::NotPositive);
    }
    Ok(())
}

fn valid_ttl(ttl: Option<Interval>) -> Interval {
    let ttl = required(ttl, "ttl");
    match check_ttl(ttl.months(), ttl.days(), ttl.micros()) {
        Ok(()) => ttl,
        Err(TtlProblem::Infinite) => raise(error::INVALID_PARAMETER_VALUE, "ttl must be finite"),
        Err(TtlProblem::NotPositive) => {
            raise(error::INVALID_PARAMETER_VALUE, "ttl must be positive")
        }
    }
}

fn valid_key(key: Option<&str>) -> &str {
    let key = required(key, "idem_key");
    if key.is_empty() {
        raise(error::INVALID_PARAMETER_VALUE, "idem_key must not be empty");
    }
    if key.len() > MAX_IDEM_KEY {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!(
                "idem_key is {} bytes long; the limit is {MAX_IDEM_KEY}",
                key.len()
            ),
        );
    }
    key
}

/// The live claim of `key` in either ledger piece, if any.
fn live_claim(c: &mut SpiClient<'_>, q: &Queue, key: &str) -> Option<i64> {
    let t = exec(
        c,
        "SELECT event_id FROM pgque.idem_key \
          WHERE queue_id = $1 AND idem_key = $2 AND expires_at > clock_timestamp()",
        &[q.id.into(), key.into()],
    );
    first_row(t).and_then(|r| col::<i64>(&r, 1))
}

/// Claims `key` for a new event and appends it, or returns the live claim's
/// event. Returns (event_id, deduped).
fn send_idem_impl(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    idem_key: Option<&str>,
    ttl: Option<Interval>,
    partition_key: Option<&str>,
    headers: Option<JsonB>,
) -> (i64, bool) {
    let key = valid_key(idem_key);
    let ttl = valid_ttl(ttl);
    error::check_partition_key(partition_key);
    let ev_type = super::send::type_arg(type_name);
    let headers = super::send::headers_arg(headers);
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        // Pins the current piece until commit: a switch waits for us.
        let t = exec(
            c,
            "SELECT cur_piece FROM pgque.idem_state FOR KEY SHARE",
            &[],
        );
        let piece: i16 = first_row(t)
            .and_then(|r| col(&r, 1))
            .expect("pgque.idem_state has its row");
        if let Some(id) = live_claim(c, &q, key) {
            return (id, true);
        }
        let t = exec(
            c,
            &format!("SELECT nextval('{}')", log::event_seq(q.id)),
            &[],
        );
        let id: i64 = first_row(t).and_then(|r| col(&r, 1)).expect("nextval");
        // An expired claim of the same key in this piece is taken over; a
        // live one (committed since we looked, or by a concurrent producer
        // we waited for) makes this a duplicate.
        let claim = format!(
            "INSERT INTO pgque.idem_key_p{piece} AS k \
                    (queue_id, idem_key, event_id, claimed_at, expires_at, piece) \
             VALUES ($1, $2, $3, clock_timestamp(), clock_timestamp() + $4, {piece}) \
             ON CONFLICT (queue_id, idem_key) DO UPDATE \
                SET event_id = EXCLUDED.event_id, claimed_at = EXCLUDED.claimed_at, \
                    expires_at = EXCLUDED.expires_at \
              WHERE k.expires_at <= clock_timestamp() \
             RETURNING event_id"
        );
        let t = exec(c, &claim, &[q.id.into(), key.into(), id.into(), ttl.into()]);
        if first_row(t).is_none() {
            let existing = live_claim(c, &q, key).unwrap_or_else(|| {
                raise(
                    error::WRONG_STATE,
                    format!("idem_key {key:?} is claimed by a transaction not visible to this one; retry"),
                )
            });
            return (existing, true);
        }
        let mut args = vec![
            id.into(),
            ev_type.into(),
            payload.into(),
            partition_key.into(),
        ];
        // an untraced send runs the statement it ran before headers existed
        let ins = match headers {
            Some(h) => {
                args.push(h.into());
                format!(
                    "INSERT INTO {} (ev_id, ev_type, ev_data, ev_extra1, ev_headers) \
                     VALUES ($1, $2, $3, $4, $5)",
                    q.current_table()
                )
            }
            None => format!(
                "INSERT INTO {} (ev_id, ev_type, ev_data, ev_extra1) VALUES ($1, $2, $3, $4)",
                q.current_table()
            ),
        };
        exec(c, &ins, &args);
        crate::wake::sent_at_commit(q.id);
        (id, false)
    })
}

/// send_idem(queue_name, type_name, payload jsonb, idem_key, ttl default
/// '1 hour', partition_key default NULL, headers default NULL) → (event_id,
/// deduped): sends once per live key; a duplicate gets the original event id
/// and deduped = true (its headers are the original's). Writes the event
/// (with its trace-context headers, checked as send's) and its claim in the
/// key ledger, atomically.
#[pg_extern(name = "send_idem", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn send_idem_headers_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<JsonbText>,
    idem_key: Option<&str>,
    ttl: default!(Option<Interval>, "'1 hour'"),
    partition_key: default!(Option<&str>, "NULL"),
    headers: default!(Option<JsonB>, "NULL"),
) -> TableIterator<'static, (name!(event_id, i64), name!(deduped, bool))> {
    let payload = payload.map(|p| p.0);
    let r = send_idem_impl(
        queue_name,
        type_name,
        payload.as_deref(),
        idem_key,
        ttl,
        partition_key,
        headers,
    );
    TableIterator::once(r)
}

/// send_idem with a text payload; otherwise as the jsonb form.
#[pg_extern(name = "send_idem", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn send_idem_headers_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    idem_key: Option<&str>,
    ttl: default!(Option<Interval>, "'1 hour'"),
    partition_key: default!(Option<&str>, "NULL"),
    headers: default!(Option<JsonB>, "NULL"),
) -> TableIterator<'static, (name!(event_id, i64), name!(deduped, bool))> {
    TableIterator::once(send_idem_impl(
        queue_name,
        type_name,
        payload,
        idem_key,
        ttl,
        partition_key,
        headers,
    ))
}

/// The entry point of 0.7.0's `send_idem(..., partition_key)` with a jsonb
/// payload (C symbol send_idem_jsonb_wrapper, no headers), kept out of this
/// version's SQL: a database still at 0.7.0 runs this library's send_idem
/// through it until ALTER EXTENSION pgque UPDATE.
#[pg_extern(sql = false, security_definer)]
fn send_idem_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<JsonbText>,
    idem_key: Option<&str>,
    ttl: Option<Interval>,
    partition_key: Option<&str>,
) -> TableIterator<'static, (name!(event_id, i64), name!(deduped, bool))> {
    send_idem_headers_jsonb(
        queue_name,
        type_name,
        payload,
        idem_key,
        ttl,
        partition_key,
        None,
    )
}

/// 0.7.0's text-payload send_idem (C symbol send_idem_text_wrapper), as
/// send_idem_jsonb above.
#[pg_extern(sql = false, security_definer)]
fn send_idem_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    idem_key: Option<&str>,
    ttl: Option<Interval>,
    partition_key: Option<&str>,
) -> TableIterator<'static, (name!(event_id, i64), name!(deduped, bool))> {
    send_idem_headers_text(
        queue_name,
        type_name,
        payload,
        idem_key,
        ttl,
        partition_key,
        None,
    )
}

/// Garbage-collects the key ledger without DELETEs: TRUNCATEs the piece that
/// is not current once all its keys have expired (or, once it is older than
/// four rotation periods, after copying its few live keys forward), then makes
/// it current when the current one is older than `pgque.ledger_rotation_period`.
/// Skips the round rather than wait when a producer or reader is in the way.
/// Returns the number of ledger rows removed. Called by maint().
pub fn gc(c: &mut SpiClient<'_>, period_s: i32) -> i64 {
    let t = exec(
        c,
        "SELECT cur_piece, switched_at <= now() - $1 * interval '1 second', \
                switched_at <= now() - 4 * $1 * interval '1 second' \
           FROM pgque.idem_state FOR UPDATE SKIP LOCKED",
        &[period_s.into()],
    );
    let Some(r) = first_row(t) else { return 0 };
    let cur: i16 = col(&r, 1).unwrap();
    let switch_due: bool = col(&r, 2).unwrap();
    let stale: bool = col(&r, 3).unwrap();
    let old = 1 - cur;
    // One backward index probe each, whatever the piece holds.
    let t = exec(
        c,
        &format!(
            "SELECT coalesce(max(expires_at) > clock_timestamp(), false), max(expires_at) IS NOT NULL \
               FROM pgque.idem_key_p{old}"
        ),
        &[],
    );
    let r = first_row(t).unwrap();
    let has_live: bool = col(&r, 1).unwrap();
    let nonempty: bool = col(&r, 2).unwrap();
    let mut removed = 0;
    if nonempty {
        if has_live && !stale {
            return 0;
        }
        // TRUNCATE needs an exclusive lock: take it only if it is free now.
        if !log::try_lock_exclusive(&format!("idem_key_p{old}")) {
            return 0;
        }
        let mut copied = 0;
        if has_live {
            let t = exec(
                c,
                &format!(
                    "WITH moved AS (INSERT INTO pgque.idem_key_p{cur} \
                     SELECT queue_id, idem_key, event_id, claimed_at, expires_at, {cur} \
                       FROM pgque.idem_key_p{old} WHERE expires_at > clock_timestamp() \
                     ON CONFLICT (queue_id, idem_key) DO NOTHING RETURNING 1) \
                     SELECT count(*) FROM moved"
                ),
                &[],
            );
            copied = first_row(t).and_then(|r| col::<i64>(&r, 1)).unwrap_or(0);
        }
        // Once per rotation: the size of the piece being emptied.
        let t = exec(
            c,
            &format!("SELECT count(*) FROM pgque.idem_key_p{old}"),
            &[],
        );
        let total: i64 = first_row(t).and_then(|r| col(&r, 1)).unwrap_or(0);
        log::run_once(c, &format!("TRUNCATE pgque.idem_key_p{old}"));
        removed = total - copied;
    }
    if switch_due {
        exec(
            c,
            "UPDATE pgque.idem_state SET cur_piece = $1, switched_at = now()",
            &[old.into()],
        );
    }
    removed
}

/// maint_idem(): one round of key-ledger GC (see `gc`); maint() runs it too.
/// Returns the number of expired claims removed.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn maint_idem() -> i64 {
    Spi::connect_mut(|c| gc(c, crate::gucs::ledger_rotation_period_s()))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    #[cfg(test)]
    use super::{check_ttl, TtlProblem};
    use pgrx::prelude::*;

    #[test]
    fn ttl_must_be_finite_and_positive() {
        assert_eq!(check_ttl(0, 0, 3_600_000_000), Ok(()));
        assert_eq!(check_ttl(1, 0, 0), Ok(()));
        assert_eq!(check_ttl(0, 0, 0), Err(TtlProblem::NotPositive));
        assert_eq!(check_ttl(0, 0, -1), Err(TtlProblem::NotPositive));
        // 1 day minus 25 hours is negative.
        assert_eq!(
            check_ttl(0, 1, -90_000_000_000),
            Err(TtlProblem::NotPositive)
        );
        assert_eq!(
            check_ttl(i32::MAX, i32::MAX, i64::MAX),
            Err(TtlProblem::Infinite)
        );
        assert_eq!(
            check_ttl(i32::MIN, i32::MIN, i64::MIN),
            Err(TtlProblem::Infinite)
        );
    }

    fn setup() {
        Spi::run("SELECT pgque.create_queue('iq'), pgque.create_queue('iq2')").unwrap();
    }

    fn send(key: &str, ttl: &str) -> (i64, bool) {
        Spi::get_two::<i64, bool>(&format!(
            "SELECT event_id, deduped FROM pgque.send_idem('iq', 't', '{{\"a\": 1}}'::jsonb, '{key}', '{ttl}')"
        ))
        .map(|(a, b)| (a.unwrap(), b.unwrap()))
        .unwrap()
    }

    #[pg_test]
    fn duplicate_gets_the_original_event() {
        setup();
        let (id, dup) = send("migrate:t1:v1", "1 hour");
        assert!(!dup);
        assert_eq!(send("migrate:t1:v1", "1 hour"), (id, true));
        let (other, dup) = send("migrate:t1:v2", "1 hour");
        assert!(!dup);
        assert_ne!(other, id);
        // The same key in another queue is another claim.
        let (_, dup) = Spi::get_two::<i64, bool>(
            "SELECT * FROM pgque.send_idem('iq2', 't', 'x'::text, 'migrate:t1:v1')",
        )
        .map(|(a, b)| (a.unwrap(), b.unwrap()))
        .unwrap();
        assert!(!dup);
        // One claim per key in the ledger.
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM pgque.idem_key").unwrap(),
            Some(3)
        );
    }

    #[pg_test]
    fn expired_key_can_be_claimed_again() {
        setup();
        let (first, _) = send("k", "20 milliseconds");
        Spi::run("SELECT pg_sleep(0.05)").unwrap();
        let (second, dup) = send("k", "1 hour");
        assert!(!dup);
        assert_ne!(first, second);
        assert_eq!(send("k", "1 hour"), (second, true));
    }

    #[pg_test]
    fn event_carries_payload_type_and_partition_key() {
        setup();
        let id = Spi::get_one::<i64>(
            "SELECT event_id FROM pgque.send_idem('iq', 'user.created', 'p1'::text, 'k-extra', '1 hour', 'tenant-7')",
        )
        .unwrap()
        .unwrap();
        let qid = Spi::get_one::<i32>("SELECT queue_id FROM pgque.queue WHERE queue_name = 'iq'")
            .unwrap()
            .unwrap();
        let row = Spi::get_three::<String, String, String>(&format!(
            "SELECT ev_type, ev_data, ev_extra1 FROM pgque.event_{qid} WHERE ev_id = {id}"
        ))
        .unwrap();
        assert_eq!(
            row,
            (
                Some("user.created".into()),
                Some("p1".into()),
                Some("tenant-7".into())
            )
        );
        // A deduplicated send appends nothing.
        Spi::run("SELECT * FROM pgque.send_idem('iq', 'user.created', 'p2'::text, 'k-extra')")
            .unwrap();
        let n = Spi::get_one::<i64>(&format!("SELECT count(*) FROM pgque.event_{qid}")).unwrap();
        assert_eq!(n, Some(1));
    }

    #[pg_test(error = "idem_key must not be NULL")]
    fn null_key_is_refused() {
        setup();
        Spi::run("SELECT * FROM pgque.send_idem('iq', 't', 'x'::text, NULL)").unwrap();
    }

    #[pg_test(error = "idem_key must not be empty")]
    fn empty_key_is_refused() {
        setup();
        Spi::run("SELECT * FROM pgque.send_idem('iq', 't', 'x'::text, '')").unwrap();
    }

    #[pg_test(error = "ttl must be positive")]
    fn zero_ttl_is_refused() {
        setup();
        Spi::run("SELECT * FROM pgque.send_idem('iq', 't', 'x'::text, 'k', '0 seconds')").unwrap();
    }

    #[pg_test(error = "ttl must be positive")]
    fn negative_ttl_is_refused() {
        setup();
        Spi::run("SELECT * FROM pgque.send_idem('iq', 't', 'x'::text, 'k', '-5 minutes')").unwrap();
    }

    #[pg_test(error = "queue not found: \"nope\"")]
    fn unknown_queue_is_refused() {
        Spi::run("SELECT * FROM pgque.send_idem('nope', 't', 'x'::text, 'k')").unwrap();
    }
}
