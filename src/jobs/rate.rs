//! Rate limits: token buckets per queue and per actor, enforced by dispatch
//! (DESIGN.md section 13, docs/rate-limits.md; tables in
//! sql/33_rate_limits.sql).
//!
//! A bucket holds up to `burst` tokens and gains `jobs` per `per`; every job
//! dispatch starts takes one whole token. The stored state is the tokens left
//! at `refilled_at`; the refill since then is computed when the bucket is
//! read (REFILL), so a bucket is written only when jobs are taken from it.
//! Every read is of a row locked FOR UPDATE (read in its latest committed
//! version) and the debit comes in the same transaction, so concurrent
//! dispatchers serialise per bucket and never take more than it holds. The
//! refill is computed at statement_timestamp(), which for a dispatcher that
//! waited for the lock can be before the holder's `refilled_at`: the refill
//! is then 0 and `refilled_at` never moves back, so no interval is credited
//! twice (at worst a waiter sees a little less than the bucket holds).
//!
//! - per queue (pgque.job_rate_limits): LOCK_LANES_SQL, dispatch's first
//!   statement for every call, also locks the call's buckets in queue order
//!   and returns the whole tokens of the emptiest one; dispatch lowers its
//!   limit to that (both stores: the job log and pgque.jobs take their first
//!   `limit` jobs in order, so jobs held back keep theirs) and, only when a
//!   queue of the call has a bucket, DEBIT_SQL takes what was claimed. A call
//!   over queues without a limit runs no extra statement.
//! - per actor (columns of pgque.job_actors): DISPATCH_SQL's actor_locks
//!   step reads the tokens of the rows it already locks, admission takes
//!   min(capacity left, tokens) per actor, and its `act` step debits what it
//!   claimed (the same HOT update that raises `running`). Jobs with an actor
//!   live in pgque.jobs only (the job log stores actorless jobs).
use super::args::check_positive_interval;
use crate::error::{self, raise, required, valid_name};
use pgrx::datum::Interval;
use pgrx::pg_sys;
use pgrx::prelude::*;

extension_sql_file!(
    "../../sql/33_rate_limits.sql",
    name = "rate_limits",
    requires = ["job_log"]
);

/// $1 the ctids of the buckets LOCK_LANES_SQL locked in this transaction
/// (as text), $2 the jobs claimed from each: takes them out. The rows are
/// locked by this transaction, so their versions stay where they were found:
/// a TID scan, O(buckets of the call) under any plan.
pub const DEBIT_SQL: &str = concat!(
    "UPDATE pgque.job_rate_limits b SET tokens = GREATEST(0, ",
    crate::refill!(b, jobs, per, burst),
    " - ($2::int[])[pg_catalog.array_position($1::text[], b.ctid::text)]),
     refilled_at = GREATEST(b.refilled_at, statement_timestamp())
     WHERE b.ctid = ANY ($1::text[]::tid[])"
);

/// Whether the installed schema has the rate-limit tables (0.7.0 on): a
/// library newer than the schema (before ALTER EXTENSION UPDATE) dispatches
/// with the statements that do without them. Two syscache lookups, no
/// statement.
pub fn schema_has_rate_limits() -> bool {
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"pgque".as_ptr(), true);
        ns != pg_sys::InvalidOid
            && pg_sys::get_relname_relid(c"job_rate_limits".as_ptr(), ns) != pg_sys::InvalidOid
    }
}

/// Checks a rate limit's arguments; returns (jobs, per, burst) or None for
/// "remove the limit" (jobs NULL).
fn check_limit(
    jobs: Option<i32>,
    per: Option<Interval>,
    burst: Option<i32>,
) -> Option<(i32, Interval, i32)> {
    let jobs = jobs?;
    if jobs < 1 {
        raise(
            error::OUT_OF_RANGE,
            format!("jobs must be >= 1 (or NULL for no limit), not {jobs}"),
        );
    }
    let per = required(per, "per");
    check_positive_interval(&per, "per");
    let burst = burst.unwrap_or(jobs);
    if burst < 1 {
        raise(
            error::OUT_OF_RANGE,
            format!("burst must be >= 1, not {burst}"),
        );
    }
    Some((jobs, per, burst))
}

/// Limits dispatch from `queue_name` to `jobs` per `per`, in bursts of up to
/// `burst` (default `jobs`); NULL `jobs` removes the limit. A new bucket
/// starts full; a changed one keeps its tokens (refilled at the old rate up
/// to now), capped at the new burst. Touches pgque.job_rate_limits.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn set_rate_limit(
    queue_name: Option<&str>,
    jobs: Option<i32>,
    per: Option<Interval>,
    burst: default!(Option<i32>, "NULL"),
) {
    let queue = valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    let limit = check_limit(jobs, per, burst);
    let exists = Spi::get_one_with_args::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pgque.job_queues WHERE queue_name = $1)",
        &[queue.into()],
    )
    .ok()
    .flatten()
    .unwrap_or(false);
    if !exists {
        raise(
            error::UNDEFINED_OBJECT,
            format!("job queue {queue:?} does not exist"),
        );
    }
    match limit {
        None => Spi::run_with_args(
            "DELETE FROM pgque.job_rate_limits WHERE queue_name = $1",
            &[queue.into()],
        ),
        Some((jobs, per, burst)) => Spi::run_with_args(
            concat!(
                "INSERT INTO pgque.job_rate_limits AS b
                     (queue_name, jobs, per, burst, tokens, refilled_at)
                 VALUES ($1, $2, $3, $4, $4, statement_timestamp())
                 ON CONFLICT (queue_name) DO UPDATE
                 SET jobs = excluded.jobs, per = excluded.per, burst = excluded.burst,
                     tokens = LEAST(excluded.burst, ",
                crate::refill!(b, jobs, per, burst),
                "), refilled_at = GREATEST(b.refilled_at, statement_timestamp())"
            ),
            &[queue.into(), jobs.into(), per.into(), burst.into()],
        ),
    }
    .unwrap_or_else(|e| pgrx::error!("{e}"));
}

/// Limits how many of `actor`'s jobs dispatch starts (across all queues and
/// dispatchers) to `jobs` per `per`, in bursts of up to `burst` (default
/// `jobs`); NULL `jobs` removes the limit. Composes with
/// set_actor_capacity: a dispatch admits min(capacity left, tokens). Touches
/// the actor's pgque.job_actors row (created if new).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn set_actor_rate_limit(
    actor: Option<&str>,
    jobs: Option<i32>,
    per: Option<Interval>,
    burst: default!(Option<i32>, "NULL"),
) {
    let actor = required(actor, "actor");
    if actor.is_empty() {
        raise(error::INVALID_NAME, "actor must not be empty");
    }
    let limit = check_limit(jobs, per, burst);
    let (jobs, per, burst) = match limit {
        Some((j, p, b)) => (Some(j), Some(p), Some(b)),
        None => (None, None, None),
    };
    Spi::run_with_args(
        concat!(
            "INSERT INTO pgque.job_actors AS b (actor, rate_jobs, rate_per, rate_burst, tokens,
                                               refilled_at)
             VALUES ($1, $2, $3, $4, $4, CASE WHEN $2 IS NOT NULL THEN statement_timestamp() END)
             ON CONFLICT (actor) DO UPDATE
             SET rate_jobs = excluded.rate_jobs, rate_per = excluded.rate_per,
                 rate_burst = excluded.rate_burst,
                 tokens = CASE WHEN excluded.rate_jobs IS NULL THEN NULL
                               WHEN b.rate_jobs IS NULL THEN excluded.rate_burst
                               ELSE LEAST(excluded.rate_burst, ",
            crate::refill!(b, rate_jobs, rate_per, rate_burst),
            ") END,
                 refilled_at = CASE WHEN excluded.rate_jobs IS NULL THEN NULL
                                    WHEN b.rate_jobs IS NULL THEN statement_timestamp()
                                    ELSE GREATEST(b.refilled_at, statement_timestamp()) END"
        ),
        &[actor.into(), jobs.into(), per.into(), burst.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
}

/// After a dispatch with `limited`, the queues of the call that have a
/// bucket (locked, their rows at `tids`): takes the jobs claimed from each
/// (`out`'s rows, whose column 2 is the queue) out of its bucket, in one
/// statement; none when no limited queue's job was claimed.
pub fn debit(
    client: &mut pgrx::spi::SpiClient<'_>,
    limited: &[String],
    tids: &[String],
    out: &[super::log::jobrows::RawRow],
) {
    let (tids, counts): (Vec<String>, Vec<i32>) = limited
        .iter()
        .zip(tids)
        .map(|(q, t)| (t.clone(), count_of(q, out)))
        .filter(|(_, n)| *n > 0)
        .unzip();
    if tids.is_empty() {
        return;
    }
    let stmt = super::log::stmt::prepared(
        client,
        DEBIT_SQL,
        &[
            super::log::stmt::ty(pg_sys::TEXTARRAYOID),
            super::log::stmt::ty(pg_sys::INT4ARRAYOID),
        ],
    );
    client
        .update(stmt, None, &[tids.into(), counts.into()])
        .unwrap_or_else(|e| pgrx::error!("{e}"));
}

/// How many of `out`'s rows are jobs of `queue`.
fn count_of(queue: &str, out: &[super::log::jobrows::RawRow]) -> i32 {
    out.iter()
        .filter(|r| {
            !r.1[1] && unsafe { <&str as FromDatum>::from_datum(r.0[1], false) } == Some(queue)
        })
        .count() as i32
}
