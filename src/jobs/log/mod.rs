//! The job log (sql/31_job_log.sql, docs/design/job-log.md): ordinary jobs
//! stored one row per enqueue batch, handed out one claim row per dispatch and
//! lane, completed one done row per claim; no per-job row, no update, no
//! delete on the hot path.
//!
//! - `enqueue`  the batch row (enqueue_ready_rows' path for eligible batches)
//! - `dispatch` the lane windows, the claim rows, and the spill of a window
//!   into pgque.jobs when a dispatch has to merge both stores
//! - `dispatch_one` the dispatch of a call with one lane, its rows cut out
//!   of the log rows' arrays in Rust
//! - `release`  completion through done rows, heartbeats of claims, and
//!   `to_side`: a claimed job copied into pgque.jobs (fail, snooze, cancel)
//! - `rotate`   the segment ring: settling and rescuing claims whose lease is
//!   over, evacuating running claims, truncating old segments
//!
//! Concurrency, in one place:
//! - producers take ids under the lane's enqueue lock (LANE_LOCK_CLASS, held
//!   to commit), so each snapshot sees a prefix of every lane;
//! - dispatchers of a lane serialise on the lane's dispatch lock
//!   (DISPATCH_LOCK_CLASS, held to commit), taken in its own statement so the
//!   next statement reads the cursor in a snapshot taken after the previous
//!   holder committed (READ COMMITTED; dispatch refuses other levels when it
//!   reads the log, see `dispatch::require_read_committed`);
//! - every transaction that reads a lane's cursor to act on it (dispatch,
//!   the cancel of a ready log job, a switch to round_robin) first takes
//!   the database's rotation barrier shared (ROTATION_BARRIER_CLASS, held to
//!   commit), before any statement of it reads the log; the rotation takes
//!   it exclusively to truncate a segment and raise the lanes' floors
//!   (rotate.rs says why that is enough and why it cannot starve);
//! - a claim is looked up by its claim_id, and its state is then compared as
//!   text (`state::text = 'a'`): every claim stays active until its lease is
//!   over, so the partial index of active claims (for the rescue) holds
//!   throughput x lease rows, and a plain `state = 'a'` let the planner walk
//!   it instead of probing the claim_id index (measured: 2,900 buffers per
//!   complete_many with two workers after a few seconds);
//! - everything that changes what a claim's jobs are (complete, fail, snooze,
//!   cancel, heartbeat, rescue, evacuation) takes the claim's lock
//!   (CLAIM_LOCK_CLASS) in its own statement first, for the same reason.
pub mod dispatch;
pub mod dispatch_one;
pub mod enqueue;
pub mod fragments;
pub mod jobrows;
pub mod outcomes;
pub mod release;
pub mod rotate;
pub mod stmt;

use pgrx::pg_sys;
use stmt::{run_int, ty};

/// Advisory-lock class of a claim (two-key form: class, hashint8(claim id)).
pub const CLAIM_LOCK_CLASS: i32 = 0x6A6F_6263; // "jobc"
/// Advisory-lock class of a lane's dispatchers (class, lane_id).
pub const DISPATCH_LOCK_CLASS: i32 = 0x6A6F_6264; // "jobd"

/// Advisory-lock class of the job log's rotation barrier (class, key 0):
/// one lock per database, whatever the number of lanes.
pub const ROTATION_BARRIER_CLASS: i32 = 0x6A6F_6272; // "jobr"

/// Takes the rotation barrier shared (waits while a rotation truncates).
/// Before the first statement that reads the log: that statement's
/// snapshot, and its locks on the log's partitions, come after it.
pub fn enter_log() {
    crate::locks::lock_shared(ROTATION_BARRIER_CLASS, 0);
}

/// `enter_log` for the worker's duties, which never wait: false while a
/// rotation holds (or waits for) the barrier.
pub fn try_enter_log() -> bool {
    crate::locks::try_lock_shared(ROTATION_BARRIER_CLASS, 0)
}

/// The current segment, as every insert into the log tables reads it.
#[macro_export]
macro_rules! cur_seg {
    () => {
        "(SELECT s.seg FROM pgque.job_log_segments s WHERE s.opened_at IS NOT NULL AND s.sealed_at IS NULL)"
    };
}

/// Locks those of `tokens` that are claims (the claim lock, in hash order,
/// so two callers never deadlock on each other). Returns how many locks it
/// took: 0 when no token is a claim (a job of pgque.jobs).
const LOCK_CLAIMS_SQL: &str = "SELECT count(pgque.xact_lock(1785684579, x.h))::int
FROM (SELECT DISTINCT pg_catalog.hashint8(c.claim_id) AS h FROM pgque.job_claims c
      WHERE c.claim_id = ANY ($1::bigint[]) ORDER BY 1) x";

pub fn lock_claims(tokens: &[i64]) -> i32 {
    run_int(
        LOCK_CLAIMS_SQL,
        &[ty(pg_sys::INT8ARRAYOID)],
        vec![tokens.to_vec().into()],
    )
}

/// Most tokens `lock_tokens` locks without looking them up (a completion
/// names one claim, or a few).
pub const BLIND_LOCKS: usize = 16;

/// Takes the claim lock of every token in `tokens`, whether or not it is a
/// claim, without a statement: the key is computed here, as LOCK_CLAIMS_SQL
/// computes it (hashint8), and the locks are taken in the same order (by key,
/// as a signed int4), so this and every SQL locker of claims never wait on
/// each other in a cycle. A token that is not a claim (a job of pgque.jobs)
/// only costs a lock no one else asks for, or waits for a claim whose key it
/// shares. Saves the lookup statement of `lock_claims` where the caller runs
/// the log's statement anyway (completion, READ COMMITTED only: the next
/// statement's snapshot is taken after these locks).
/// Beyond BLIND_LOCKS distinct tokens, only the tokens that are claims are
/// locked (`lock_claims`, one lookup statement): a made-up token then costs
/// no lock, so one call cannot fill the server's shared lock table.
pub fn lock_tokens(tokens: &[i64]) {
    // a complete_many of one claim passes its token once per job
    let mut distinct = tokens.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() > BLIND_LOCKS {
        lock_claims(&distinct);
        return;
    }
    let mut keys: Vec<i32> = distinct.iter().map(|t| claim_key(*t)).collect();
    keys.sort_unstable();
    keys.dedup();
    for k in keys {
        // as pgque.xact_lock(class, int4 key) takes it: the key sign-extended
        crate::locks::lock(CLAIM_LOCK_CLASS, k as i64);
    }
}

/// The claim lock's key of token `t`: hashint8(t), as LOCK_CLAIMS_SQL computes it.
fn claim_key(t: i64) -> i32 {
    unsafe {
        let d = pg_sys::OidFunctionCall1Coll(
            pg_sys::Oid::from(pg_sys::F_HASHINT8),
            pg_sys::InvalidOid,
            pg_sys::Datum::from(t),
        );
        d.value() as u32 as i32
    }
}

/// Takes the lock of claim `claim` if no one holds it (false: busy). For
/// the worker's duties, which never wait on a claim a caller's transaction
/// holds: they leave it for their next run.
pub fn try_lock_claim(claim: i64) -> bool {
    crate::locks::try_lock(CLAIM_LOCK_CLASS, claim_key(claim) as i64)
}

/// Locks the claims among `tokens` and checks the isolation level; false
/// when none is a claim (nothing for the log to do).
pub fn claims_locked(tokens: &[i64], what: &str) -> bool {
    if lock_claims(tokens) == 0 {
        return false;
    }
    require_read_committed(what);
    true
}

/// True when the transaction reads with one snapshot for all its statements
/// (REPEATABLE READ, SERIALIZABLE): the lock-then-read protocol above needs a
/// fresh snapshot per statement.
pub fn xact_snapshot() -> bool {
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// Raises 0A000 when the log must be read with a per-statement snapshot and
/// the transaction has one snapshot for all.
pub fn require_read_committed(what: &str) {
    if xact_snapshot() {
        crate::error::raise(
            crate::error::FEATURE_NOT_SUPPORTED,
            format!("{what} must run at READ COMMITTED isolation when the job log is involved"),
        );
    }
}

#[cfg(any(test, feature = "pg_test"))]
mod tests;
