//! The job log's maintenance: claims whose lease is over, and the segment ring.
//!
//! - `rescue_claims` (part of rescue_expired_leases): an active claim whose
//!   lease expired is settled ('d') when all its jobs finished, else its
//!   unfinished jobs move to pgque.jobs as running with the expired lease
//!   ('r'), where pgque.jobs' rescue puts them back to ready or fails them.
//! - `rotate_job_log()`: switches the current segment when it is older than
//!   pgque.job_log_rotation_period and the next one is empty, and truncates
//!   the oldest sealed segment once (a) every job in it was handed out,
//!   (b) none of them still runs from it (running claims are evacuated to
//!   pgque.jobs first, keeping their token and lease) and (c) it was sealed
//!   pgque.completed_job_retention ago.
//!
//! The truncation's barrier is one lock per database, not one per lane: the
//! rotation barrier (ROTATION_BARRIER_CLASS, log/mod.rs), which every
//! transaction that reads a lane's cursor to act on it takes shared before
//! its first statement that reads the log (dispatch, the cancel of a ready
//! log job, a switch to round_robin), and which the rotation takes
//! exclusively, then an ACCESS EXCLUSIVE lock on the segment's four
//! partitions (log, claims, done rows, progress rows), held to commit with
//! the floors it raises and the TRUNCATE. Why that is enough, reader by
//! reader:
//! - cursor readers (above): each took the barrier before the snapshot of
//!   every statement that reads the log, so it either ended before the
//!   rotation got the barrier or reads after the rotation committed, with
//!   the new floors and the emptied partitions; never the emptied
//!   partitions with the old floors (a lowered cursor: jobs handed out
//!   twice). That is what every lane's lock gave, at one lock;
//! - everything else that reads the segment's rows (complete, fail,
//!   heartbeat, the rescue, the status views, the explorer) reads
//!   job_claims / job_done / job_log through their parents, which locks
//!   every partition: none runs while the rotation holds the segment's
//!   partitions, and what ran before has ended;
//! - producers insert into the current segment only (never a sealed one).
//!
//! Neither lock is only tried: a try-lock fails whenever one holder is in
//! flight, so under constant dispatch it failed on every run. Both are
//! waited for, for at most ROTATION_WAIT (`locks::within`): a queued
//! exclusive request is granted as soon as the transactions it waits for
//! end, and new requesters queue behind it meanwhile, so a stream of short
//! dispatches cannot starve it and waits behind it for at most
//! ROTATION_WAIT plus the truncation itself. A transaction that holds the
//! log's partitions and then asks for the barrier (a dispatch after a
//! complete in one transaction) while the rotation waits for the
//! partitions is a deadlock: the rotation's timeout (below the server's
//! deadlock_timeout) ends it, the rotation reports busy and tries again on
//! its next run.
use super::release::to_side;
use crate::gucs;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// Up to $1 active claims whose lease expired, oldest first: those whose jobs
/// all finished are settled ('d') in this statement; returns the others' ids.
/// A claim's jobs all finished when its done rows name as many jobs as it
/// has: done rows only ever name unfinished members of their claim, once. No
/// claim lock is needed to settle: a claim with nothing left to finish cannot
/// change any more. A claim whose lane is gone (its queue was dropped, by a
/// dispatch that ran beside the drop or before 0.5.0, which left them
/// active) is settled too: there is nowhere to rescue its jobs to, and left
/// active it would come first in every later run.
const SETTLE_EXPIRED_SQL: &str = r#"
WITH exp AS MATERIALIZED (
    SELECT c.claim_id, c.lane_id, c.job_ids FROM pgque.job_claims c
    WHERE c.state = 'a' AND c.lease_until < pg_catalog.clock_timestamp()
    ORDER BY c.lease_until
    LIMIT $1
),
fin AS MATERIALIZED (
    SELECT e.claim_id FROM exp e
    WHERE cardinality(e.job_ids) = (SELECT COALESCE(sum(cardinality(d.job_ids)), 0)
                                    FROM pgque.job_done d WHERE d.claim_id = e.claim_id)
       OR NOT EXISTS (SELECT 1 FROM pgque.job_lanes l WHERE l.lane_id = e.lane_id)
),
upd AS (
    UPDATE pgque.job_claims c SET state = 'd'
    WHERE c.claim_id = ANY (ARRAY(SELECT f.claim_id FROM fin f)) AND c.state::text = 'a'
)
SELECT e.claim_id FROM exp e WHERE e.claim_id NOT IN (SELECT f.claim_id FROM fin f)
"#;

/// Marks an active claim as settled if nothing of it is left to finish.
fn settle(claim: i64) {
    Spi::run_with_args(
        "UPDATE pgque.job_claims c SET state = 'd'
         WHERE c.claim_id = $1 AND c.state::text = 'a'
           AND cardinality(c.job_ids) = (SELECT COALESCE(sum(cardinality(d.job_ids)), 0)
                                         FROM pgque.job_done d WHERE d.claim_id = $1)",
        &[claim.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
}

/// Settles the expired claims whose jobs all finished and rescues the
/// others (up to `max` claims). Returns how many jobs moved to pgque.jobs
/// (the caller's rescue then handles them).
pub fn rescue_claims(max: i32) -> i32 {
    if super::xact_snapshot() {
        // the claim protocol needs fresh snapshots; a duty runs at READ COMMITTED
        return 0;
    }
    let unfinished: Vec<i64> = Spi::connect_mut(|client| {
        client
            .update(SETTLE_EXPIRED_SQL, None, &[max.into()])
            .unwrap_or_else(|e| pgrx::error!("{e}"))
            .filter_map(|r| r.get::<i64>(1).ok().flatten())
            .collect()
    });
    let mut moved = 0;
    for claim in unfinished {
        // a duty never waits: a claim whose lock a completing (or any
        // other) transaction holds is rescued on the next run
        if !super::try_lock_claim(claim) {
            continue;
        }
        // under the lock: what is still unfinished moves (a completion that
        // committed meanwhile is seen here; a heartbeat that extended the
        // lease meanwhile keeps the claim); nothing left: settled
        let n = to_side(claim, None, Some("r"), false, true);
        if n == 0 {
            settle(claim);
        }
        moved += n;
    }
    moved
}

fn seg_relids(seg: i16) -> [pg_sys::Oid; 4] {
    ["job_log", "job_claims", "job_done", "job_progress"].map(|t| {
        Spi::get_one::<pg_sys::Oid>(&format!("SELECT 'pgque.{t}_{seg}'::regclass::oid"))
            .ok()
            .flatten()
            .unwrap_or_else(|| pgrx::error!("pgque: partition pgque.{t}_{seg} is missing"))
    })
}

const SWITCH_SQL: &str = r#"
WITH cur AS (
    SELECT s.seg FROM pgque.job_log_segments s
    WHERE s.opened_at IS NOT NULL AND s.sealed_at IS NULL
      AND s.opened_at <= now() - $1::interval
),
nxt AS (
    SELECT n.seg FROM pgque.job_log_segments n, cur
    WHERE n.seg = (cur.seg + 1) % 3 AND n.opened_at IS NULL
),
sealed AS (
    UPDATE pgque.job_log_segments s SET sealed_at = now()
    FROM cur WHERE s.seg = cur.seg AND EXISTS (SELECT 1 FROM nxt)
    RETURNING s.seg
)
UPDATE pgque.job_log_segments s SET opened_at = now()
FROM nxt WHERE s.seg = nxt.seg AND EXISTS (SELECT 1 FROM sealed)
RETURNING s.seg
"#;

/// The oldest sealed segment, if it was sealed $1 ago. Oldest in ring order
/// (the one after the current segment, else the one before it), not by
/// sealed_at: a claim's done rows are in its segment or a later one, so
/// segments must go in the order they were sealed, and sealed_at is wall-clock
/// time (a clock stepped back between two seals would make the later one look
/// older, and truncating it first would drop done rows of claims that stay).
const OLDEST_SEALED_SQL: &str = "SELECT o.seg FROM (
    SELECT s.seg, s.sealed_at FROM pgque.job_log_segments s,
         (SELECT c.seg FROM pgque.job_log_segments c
          WHERE c.opened_at IS NOT NULL AND c.sealed_at IS NULL) cur
    WHERE s.sealed_at IS NOT NULL
    ORDER BY (s.seg - cur.seg + 3) % 3 LIMIT 1) o
    WHERE o.sealed_at <= now() - $1::interval";

/// How long the rotation waits for its barrier and for the segment's
/// partitions (module comment): short against the worker's lock_timeout
/// (1 s) and the server's default deadlock_timeout (1 s), long against a
/// dispatch (about a millisecond).
const ROTATION_WAIT: &std::ffi::CStr = c"200ms";

/// Lanes with a job in segment $1 that was not handed out yet.
const UNDISPATCHED_SQL: &str = r#"
SELECT count(*)::int
FROM (SELECT r.lane_id, max(r.id_hi) AS top FROM pgque.job_log r WHERE r.seg = $1
      GROUP BY r.lane_id) x
JOIN pgque.job_lanes l ON l.lane_id = x.lane_id
WHERE x.top > GREATEST(l.cursor_floor, (SELECT max(c.hi) FROM pgque.job_claims c
                                        WHERE c.lane_id = x.lane_id))
"#;

/// Active claims holding a job of segment $1, or stored in it.
const RUNNING_IN_SQL: &str = r#"
SELECT c.claim_id
FROM pgque.job_claims c
JOIN (SELECT r.lane_id, max(r.id_hi) AS top FROM pgque.job_log r WHERE r.seg = $1
      GROUP BY r.lane_id) x ON x.lane_id = c.lane_id
WHERE c.state = 'a' AND c.job_ids[1] <= x.top
UNION
SELECT c.claim_id FROM pgque.job_claims c WHERE c.seg = $1 AND c.state = 'a'
"#;

const FLOORS_SQL: &str = r#"
UPDATE pgque.job_lanes l
SET cursor_floor = x.cur
FROM (SELECT l2.lane_id, (SELECT max(c.hi) FROM pgque.job_claims c WHERE c.lane_id = l2.lane_id) AS cur
      FROM pgque.job_lanes l2) x
WHERE l.lane_id = x.lane_id AND x.cur > l.cursor_floor
"#;

/// Runs one rotation step. Returns (switched, truncated segment or NULL,
/// claims evacuated, busy: the truncation was due but the log was in use).
pub fn rotate() -> (bool, Option<i16>, i32, bool) {
    let period = format!("{} seconds", gucs::job_log_rotation_period_s());
    let switched = Spi::connect_mut(|client| {
        !client
            .update(SWITCH_SQL, None, &[period.clone().into()])
            .unwrap_or_else(|e| pgrx::error!("{e}"))
            .is_empty()
    });
    let retention = format!("{} seconds", gucs::completed_job_retention().as_secs());
    let Some(seg) = Spi::get_one_with_args::<i16>(OLDEST_SEALED_SQL, &[retention.into()])
        .ok()
        .flatten()
    else {
        return (switched, None, 0, false);
    };
    let undispatched = || {
        Spi::get_one_with_args::<i32>(UNDISPATCHED_SQL, &[seg.into()])
            .ok()
            .flatten()
            .unwrap_or(0)
    };
    // A lane nobody dispatches holds the segment, as a lagging consumer
    // holds an event table. Checked first without the barrier, so that such
    // a lane makes no dispatch wait on every run: cursors only advance, so a
    // lane behind now was behind when the run began (checked again below).
    if undispatched() > 0 {
        return (switched, None, 0, false);
    }
    let rels = seg_relids(seg);
    let got = crate::locks::within(ROTATION_WAIT, || {
        crate::locks::lock(super::ROTATION_BARRIER_CLASS, 0);
        for rel in rels {
            unsafe {
                pg_sys::LockRelationOid(rel, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE)
            };
        }
    });
    if !got {
        return (switched, None, 0, true);
    }
    if undispatched() > 0 {
        return (switched, None, 0, false);
    }
    let running: Vec<i64> = Spi::connect(|client| {
        client
            .select(RUNNING_IN_SQL, None, &[seg.into()])
            .unwrap_or_else(|e| pgrx::error!("{e}"))
            .filter_map(|r| r.get::<i64>(1).ok().flatten())
            .collect()
    });
    // No claim locks here: every statement that reads or changes a claim
    // (complete, fail, heartbeat, rescue) reads job_claims / job_done
    // through their parents, which locks every partition, so none of them
    // runs while this transaction holds the segment's partitions exclusively;
    // and taking claim locks while holding those would invert the order the
    // callers take them in.
    let mut evacuated = 0;
    for &claim in &running {
        // the claims are all the active ones that reach into the segment;
        // only those with an unfinished job are evacuated (and counted)
        if to_side(claim, None, Some("e"), false, false) > 0 {
            evacuated += 1;
        } else {
            // every job finished: nothing to keep
            settle(claim);
        }
    }
    Spi::run(FLOORS_SQL).unwrap_or_else(|e| pgrx::error!("{e}"));
    Spi::run(&format!(
        "TRUNCATE pgque.job_log_{seg}, pgque.job_claims_{seg}, pgque.job_done_{seg}, pgque.job_progress_{seg}"
    ))
    .unwrap_or_else(|e| pgrx::error!("{e}"));
    Spi::run_with_args(
        "UPDATE pgque.job_log_segments SET opened_at = NULL, sealed_at = NULL WHERE seg = $1",
        &[seg.into()],
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
    Spi::run(
        "DELETE FROM pgque.job_log_holes h USING pgque.job_lanes l
         WHERE h.lane_id = l.lane_id AND h.job_id <= l.cursor_floor",
    )
    .unwrap_or_else(|e| pgrx::error!("{e}"));
    (switched, Some(seg), evacuated, false)
}

/// $1 retention: the oldest sealed segment whose truncation is due (as
/// OLDEST_SEALED_SQL), how long it has been due, and every other session
/// holding a lock on one of its four partitions, which keeps the
/// truncation's ACCESS EXCLUSIVE lock (taken without waiting) from ever
/// being granted. A reader's open transaction that read job_queue_status
/// (or a LOCK TABLE of it) holds such locks until it ends.
const BLOCKERS_SQL: &str = r#"
WITH cur AS (
    SELECT c.seg FROM pgque.job_log_segments c
    WHERE c.opened_at IS NOT NULL AND c.sealed_at IS NULL
),
due AS (
    SELECT s.seg, s.sealed_at + $1::pg_catalog.interval AS due_at
    FROM pgque.job_log_segments s, cur
    WHERE s.sealed_at IS NOT NULL
    ORDER BY (s.seg OPERATOR(pg_catalog.-) cur.seg OPERATOR(pg_catalog.+) 3) OPERATOR(pg_catalog.%) 3
    LIMIT 1
),
parts AS (
    SELECT due.seg, due.due_at,
           pg_catalog.to_regclass(pg_catalog.format('pgque.%s_%s', t.name, due.seg))::pg_catalog.oid AS rel
    FROM due, pg_catalog.unnest(ARRAY['job_log', 'job_claims', 'job_done', 'job_progress']) AS t(name)
    WHERE due.due_at <= pg_catalog.now()
)
SELECT DISTINCT p.seg,
       pg_catalog.date_part('epoch', pg_catalog.now() - p.due_at)::pg_catalog.float8,
       l.pid, a.usename::pg_catalog.text, a.application_name, a.state,
       pg_catalog.date_part('epoch', pg_catalog.now() - a.xact_start)::pg_catalog.float8
FROM parts p
JOIN pg_catalog.pg_locks l ON l.relation = p.rel AND l.granted AND l.pid <> pg_catalog.pg_backend_pid()
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
ORDER BY l.pid
"#;

/// One session keeping the job log's due truncation from running.
pub struct Blocker {
    pub seg: i16,
    pub due_for_s: f64,
    pub pid: i32,
    pub usename: Option<String>,
    pub application_name: Option<String>,
    pub state: Option<String>,
    pub xact_age_s: Option<f64>,
}

/// The sessions holding a lock on a partition of the oldest sealed segment
/// whose truncation is due (BLOCKERS_SQL), in pid order. A read: answers on
/// a standby too.
pub fn blockers() -> Vec<Blocker> {
    let retention = format!("{} seconds", gucs::completed_job_retention().as_secs());
    Spi::connect(|c| {
        c.select(BLOCKERS_SQL, None, &[retention.into()])
            .unwrap_or_else(|e| pgrx::error!("{e}"))
            .map(|r| Blocker {
                seg: r.get::<i16>(1).ok().flatten().unwrap_or_default(),
                due_for_s: r.get::<f64>(2).ok().flatten().unwrap_or_default(),
                pid: r.get::<i32>(3).ok().flatten().unwrap_or_default(),
                usename: r.get::<String>(4).ok().flatten(),
                application_name: r.get::<String>(5).ok().flatten(),
                state: r.get::<String>(6).ok().flatten(),
                xact_age_s: r.get::<f64>(7).ok().flatten(),
            })
            .collect()
    })
}

/// job_log_blockers(): the sessions that keep the job log's due truncation
/// from running, one row each: the segment, how long its truncation has
/// been due (s), the session's pid, user, application, state and how long
/// its transaction has been open (s). No row: nothing due is blocked. A
/// truncation that stays blocked keeps every job of that segment's rows on
/// disk (docs/operations.md, "Threat model"); status() and metrics() report
/// it. Reads pg_locks and pg_stat_activity; changes nothing.
#[allow(clippy::type_complexity)]
#[pg_extern(security_definer, parallel_safe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn job_log_blockers() -> TableIterator<
    'static,
    (
        name!(seg, i16),
        name!(due_for_s, f64),
        name!(pid, i32),
        name!(usename, Option<String>),
        name!(application_name, Option<String>),
        name!(state, Option<String>),
        name!(xact_age_s, Option<f64>),
    ),
> {
    let rows = blockers().into_iter().map(|b| {
        (
            b.seg,
            b.due_for_s,
            b.pid,
            b.usename,
            b.application_name,
            b.state,
            b.xact_age_s,
        )
    });
    TableIterator::new(rows)
}

/// One step of the job log's segment ring (the worker runs it every
/// pgque.job_maint_period_ms): switch the current segment when it is due,
/// truncate the oldest sealed one when it may go (module comment). Returns
/// one row: whether it switched, the segment truncated (NULL: none), the
/// claims evacuated to pgque.jobs, and `busy` when a truncation was due but
/// the log was in use (it is tried again on the next run).
#[pg_extern(security_definer, parallel_unsafe)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn rotate_job_log() -> TableIterator<
    'static,
    (
        name!(switched, bool),
        name!(truncated, Option<i16>),
        name!(evacuated, i32),
        name!(busy, bool),
    ),
> {
    TableIterator::once(rotate())
}
