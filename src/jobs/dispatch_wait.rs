//! `dispatch_wait`: dispatch that waits inside the server for a job
//! (src/waiters.rs, docs/waits.md).
//!
//! dispatch takes a transaction id even when it finds nothing (its lane
//! locks are writes), and a sleeping call must hold none. So the wait is a
//! read-only probe, READY_SQL, looked at until it says a queue of the call
//! may have a job; dispatch then runs once and its result is returned.
//!
//! The probe is dispatch's own test of whether a lane can have a ready job
//! (READY_LANES_SQL: a log row above the lane's cursor) or pgque.jobs has a
//! ready one. It cannot see why dispatch might still hand out nothing (an
//! actor at capacity, an identity running, a rate limit without tokens), so
//! after a dispatch that found nothing where the probe saw work, this
//! backend trusts the probe again only after DISTRUST (or a wake-up): a
//! worker looping on a blocked queue costs one dispatch per DISTRUST, not a
//! busy loop.
use super::dispatch::Call;
use super::log::jobrows::JobRows;
use super::log::stmt::{prepared, ty, with_generic_plans};
use crate::waiters::{self, Look};
use pgrx::datum::Interval;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// How long a probe that saw work dispatch could not take is not trusted.
const DISTRUST: Duration = Duration::from_millis(50);

thread_local! {
    /// Until when this backend's probe is not trusted (see the module comment).
    static DISTRUST_UNTIL: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Whether queues $1 may have a job dispatch can hand out: a lane with a
/// log row above its cursor, or a ready job in pgque.jobs. Read-only; one
/// index probe per lane and per queue (lanes found per queue by their
/// index, as LOCK_LANES_SQL finds them).
const READY_SQL: &str = r#"
SELECT EXISTS (
         SELECT 1 FROM unnest($1::text[]) AS n(name)
         CROSS JOIN LATERAL (SELECT l.lane_id, l.cursor_floor FROM pgque.job_lanes l
                             WHERE l.queue = n.name) l
         WHERE EXISTS (SELECT 1 FROM pgque.job_log r
                       WHERE r.lane_id = l.lane_id
                         AND r.id_hi > GREATEST(l.cursor_floor,
                                                (SELECT c.hi FROM pgque.job_claims c
                                                 WHERE c.lane_id = l.lane_id
                                                 ORDER BY c.hi DESC LIMIT 1))))
    OR EXISTS (SELECT 1 FROM unnest($1::text[]) AS q(name) CROSS JOIN LATERAL (
                   SELECT 1 FROM pgque.jobs j
                   WHERE j.queue = q.name AND j.state = 'ready'
                   ORDER BY j.priority, j.ready_seq LIMIT 1) s)
"#;

fn probe(names: &[String]) -> bool {
    with_generic_plans(|| {
        Spi::connect(|client| {
            let stmt = prepared(client, READY_SQL, &[ty(pg_sys::TEXTARRAYOID)]);
            client
                .select(stmt, None, &[names.to_vec().into()])
                .unwrap_or_else(|e| pgrx::error!("{e}"))
                .first()
                .get::<bool>(1)
                .ok()
                .flatten()
                .unwrap_or(true)
        })
    })
}

/// dispatch_wait(queues, limit, worker, wait, lease default NULL,
/// oversample default 2) → dispatch's rows: dispatch that waits inside the
/// server, for at most `wait` (capped by pgque.max_wait), until a queue of
/// the call has a job; empty at the end of the wait. Woken by the commit of
/// an enqueue into one of the queues (and of whatever makes jobs ready
/// again: the worker's promotions and rescues, a flow's released
/// children), and it looks again at least once a second. Returns at once,
/// as dispatch, in a transaction that has written or in REPEATABLE READ /
/// SERIALIZABLE. Errors as dispatch's, and 22004 / 22023 for `wait`; an
/// unknown queue is 42704 before any wait.
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn dispatch_wait(
    queues: Option<Vec<Option<String>>>,
    limit: Option<i32>,
    worker: Option<&str>,
    wait: Option<Interval>,
    lease: default!(Option<Interval>, "NULL"),
    oversample: default!(Option<i32>, 2),
) -> JobRows {
    let call = Call::new(queues, limit, worker, lease, oversample);
    let wait = waiters::wait_arg(wait);
    let keys: Vec<waiters::Key> = call
        .names
        .iter()
        .map(|n| waiters::job_queue_key(n))
        .collect();
    let mut checked = false;
    let found = waiters::wait_for(
        wait,
        || {
            let until = DISTRUST_UNTIL.with(|d| d.get());
            let distrusted = until.is_some_and(|t| Instant::now() < t);
            if !distrusted && probe(&call.names) {
                return Look::Found(());
            }
            if !checked {
                // before the first sleep: a typo must not look like an idle queue
                super::dispatch::check_queues_exist(&call.names);
                checked = true;
            }
            match until.filter(|_| distrusted) {
                Some(t) => Look::Retry(keys.clone(), t.saturating_duration_since(Instant::now())),
                None => Look::Wait(keys.clone()),
            }
        },
        |_| {},
    );
    if found.is_none() && waiters::may_sleep() {
        return JobRows(vec![]);
    }
    let rows = call.run();
    if found.is_some() && rows.is_empty() {
        DISTRUST_UNTIL.with(|d| d.set(Some(Instant::now() + DISTRUST)));
    } else if !rows.is_empty() {
        DISTRUST_UNTIL.with(|d| d.set(None));
    }
    JobRows(rows)
}
