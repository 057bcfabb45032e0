//! What happens to a job the log handed out: completion through done rows
//! (with the outputs), progress rows, heartbeats of claims, and `to_side`, which copies claimed jobs into
//! pgque.jobs (as running, under the claim's token and lease) so that fail,
//! snooze, cancel and the lease rescue act on them with pgque.jobs' own
//! statements. Every entry point takes the claims' locks first (mod.rs).
use super::stmt::{prepared, run_int, ty, with_generic_plans};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::HashMap;

/// $1 claim ids: each active claim among them with its jobs (done NULL),
/// and every done row of them (jobs NULL). Two index probes per claim; the
/// pairs are matched by `accepted`, not in SQL (a statement that unnested,
/// joined and regrouped the pairs spent more time starting its plan and
/// sorting than reading).
const CLAIM_STATE_SQL: &str = r#"
SELECT c.claim_id, c.job_ids, NULL::bigint[] AS done FROM pgque.job_claims c
WHERE c.claim_id = ANY ($1::bigint[]) AND c.state::text = 'a'
UNION ALL
SELECT d.claim_id, NULL::bigint[], d.job_ids FROM pgque.job_done d
WHERE d.claim_id = ANY ($1::bigint[])
"#;

/// $1 claim ids, $2 job ids, $3 and $4 the first and last position in $2 of
/// each claim's jobs, $5 the outputs aligned with $2 (NULL: none): one done
/// row (kind c) per claim.
const DONE_SQL: &str = concat!(
    r#"
INSERT INTO pgque.job_done (seg, claim_id, kind, job_ids, at, outputs)
SELECT "#,
    crate::cur_seg!(),
    r#", x.claim_id, 'c', ($2::bigint[])[x.lo:x.hi], now(), ($5::jsonb[])[x.lo:x.hi]
FROM unnest($1::bigint[], $3::int[], $4::int[]) AS x(claim_id, lo, hi)
"#
);

/// $1 claim, $2 job ids in order, $3 their outputs (NULL: none): when they
/// are all the jobs of the active claim and none is finished yet (the
/// common completion: a worker completes what one dispatch gave it), the
/// claim's done row. Returns the number of jobs, or no row (nothing
/// written: `complete` then matches the pairs one by one).
const WHOLE_CLAIM_SQL: &str = concat!(
    r#"
INSERT INTO pgque.job_done (seg, claim_id, kind, job_ids, at, outputs)
SELECT "#,
    crate::cur_seg!(),
    r#", c.claim_id, 'c', c.job_ids, now(), $3::jsonb[]
FROM pgque.job_claims c
WHERE c.claim_id = $1 AND c.state::text = 'a' AND c.job_ids = $2::bigint[]
  AND NOT EXISTS (SELECT 1 FROM pgque.job_done d WHERE d.claim_id = $1)
RETURNING cardinality(job_ids)
"#
);

/// The pairs to complete, grouped by claim: each distinct pair whose token
/// is an active claim (`claims`: token -> its jobs) holding the job, which
/// no done row of the claim (`done`) has finished yet. Claims in token
/// order, jobs in id order. Sorts the lists of `claims` and `done` in place
/// (a claim can hold 10,000 jobs: looked up by binary search).
pub fn accepted(
    ids: &[i64],
    tokens: &[i64],
    claims: &mut HashMap<i64, Vec<i64>>,
    done: &mut HashMap<i64, Vec<i64>>,
) -> Vec<(i64, Vec<i64>)> {
    for v in claims.values_mut().chain(done.values_mut()) {
        v.sort_unstable();
    }
    let mut pairs: Vec<(i64, i64)> = tokens.iter().copied().zip(ids.iter().copied()).collect();
    pairs.sort_unstable();
    pairs.dedup();
    let mut out: Vec<(i64, Vec<i64>)> = Vec::new();
    for (token, id) in pairs {
        let Some(jobs) = claims.get(&token) else {
            continue;
        };
        if jobs.binary_search(&id).is_err()
            || done
                .get(&token)
                .is_some_and(|d| d.binary_search(&id).is_ok())
        {
            continue;
        }
        match out.last_mut() {
            Some((t, v)) if *t == token => v.push(id),
            _ => out.push((token, vec![id])),
        }
    }
    out
}

/// `accepted` over the claims of `distinct` (the distinct tokens) as they
/// are now (CLAIM_STATE_SQL; the caller holds their claim locks).
fn accepted_now(
    client: &mut pgrx::spi::SpiClient<'_>,
    ids: &[i64],
    tokens: &[i64],
    distinct: Vec<i64>,
) -> Vec<(i64, Vec<i64>)> {
    let stmt = prepared(client, CLAIM_STATE_SQL, &[ty(pg_sys::INT8ARRAYOID)]);
    let mut claims: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut done: HashMap<i64, Vec<i64>> = HashMap::new();
    for row in client
        .update(stmt, None, &[distinct.into()])
        .unwrap_or_else(|e| pgrx::error!("{e}"))
    {
        let Some(claim) = row.get::<i64>(1).ok().flatten() else {
            continue;
        };
        if let Some(jobs) = row.get::<Vec<i64>>(2).ok().flatten() {
            claims.insert(claim, jobs);
        } else if let Some(d) = row.get::<Vec<i64>>(3).ok().flatten() {
            done.entry(claim).or_default().extend(d);
        }
    }
    if claims.is_empty() {
        return Vec::new();
    }
    accepted(ids, tokens, &mut claims, &mut done)
}

/// The output of each (token, job) pair, the first one given for it.
fn output_of(
    ids: &[i64],
    tokens: &[i64],
    outputs: &[Option<pg_sys::Datum>],
) -> HashMap<(i64, i64), Option<pg_sys::Datum>> {
    let mut m = HashMap::with_capacity(ids.len());
    for ((&id, &t), &o) in ids.iter().zip(tokens).zip(outputs) {
        m.entry((t, id)).or_insert(o);
    }
    m
}

/// Completes the pairs that belong to the log (the caller holds their claim
/// locks): one done row per claim, holding the outputs (`outputs`, aligned
/// with `ids`; None: no output given, the statements then get a NULL
/// array). Returns how many pairs (distinct) it completed. A whole claim is
/// one statement (WHOLE_CLAIM_SQL); anything else reads the claims
/// (CLAIM_STATE_SQL), matches here and writes (DONE_SQL).
pub fn complete(ids: &[i64], tokens: &[i64], outputs: Option<&[Option<pg_sys::Datum>]>) -> i32 {
    let mut distinct = tokens.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let by_pair = outputs.map(|o| output_of(ids, tokens, o));
    let outs = |pairs: &mut dyn Iterator<Item = (i64, i64)>| match &by_pair {
        None => DatumWithOid::null_oid(pg_sys::JSONBARRAYOID),
        Some(m) => {
            let v: Vec<Option<pg_sys::Datum>> =
                pairs.map(|p| m.get(&p).copied().flatten()).collect();
            crate::datum::jsonb_array_arg(&v)
        }
    };
    with_generic_plans(|| {
        Spi::connect_mut(|client| {
            if let [token] = distinct[..] {
                let mut jobs = ids.to_vec();
                jobs.sort_unstable();
                jobs.dedup();
                let o = outs(&mut jobs.iter().map(|&id| (token, id)));
                let whole = prepared(
                    client,
                    WHOLE_CLAIM_SQL,
                    &[
                        ty(pg_sys::INT8OID),
                        ty(pg_sys::INT8ARRAYOID),
                        ty(pg_sys::JSONBARRAYOID),
                    ],
                );
                let n = client
                    .update(whole, None, &[token.into(), jobs.into(), o])
                    .unwrap_or_else(|e| pgrx::error!("{e}"))
                    .next()
                    .and_then(|r| r.get::<i32>(1).ok().flatten());
                if let Some(n) = n {
                    return n;
                }
            }
            let groups = accepted_now(client, ids, tokens, distinct);
            if groups.is_empty() {
                return 0;
            }
            let o = outs(
                &mut groups
                    .iter()
                    .flat_map(|(claim, jobs)| jobs.iter().map(move |&id| (*claim, id))),
            );
            let (mut cl, mut all, mut lo, mut hi) = (vec![], vec![], vec![], vec![]);
            for (claim, jobs) in groups {
                cl.push(claim);
                lo.push(all.len() as i32 + 1);
                all.extend(jobs);
                hi.push(all.len() as i32);
            }
            let n = all.len() as i32;
            let ins = prepared(
                client,
                DONE_SQL,
                &[
                    ty(pg_sys::INT8ARRAYOID),
                    ty(pg_sys::INT8ARRAYOID),
                    ty(pg_sys::INT4ARRAYOID),
                    ty(pg_sys::INT4ARRAYOID),
                    ty(pg_sys::JSONBARRAYOID),
                ],
            );
            client
                .update(ins, None, &[cl.into(), all.into(), lo.into(), hi.into(), o])
                .unwrap_or_else(|e| pgrx::error!("{e}"));
            n
        })
    })
}

/// $1 claim, $2 job, $3 progress: one appended progress row.
const PROGRESS_SQL: &str = concat!(
    r#"
INSERT INTO pgque.job_progress (seg, id, claim_id, job_id, progress, at)
SELECT "#,
    crate::cur_seg!(),
    r#", pg_catalog.nextval('pgque.job_progress_id_seq'), $1, $2, $3::jsonb, now()
"#
);

/// Records the progress of job `id` of claim `token` (the caller holds the
/// claim's lock) when the claim is active and the job unfinished in it:
/// one appended row of pgque.job_progress. Returns whether it did.
pub fn set_progress(id: i64, token: i64, progress: DatumWithOid<'_>) -> bool {
    with_generic_plans(|| {
        Spi::connect_mut(|client| {
            if accepted_now(client, &[id], &[token], vec![token]).is_empty() {
                return false;
            }
            let stmt = prepared(
                client,
                PROGRESS_SQL,
                &[
                    ty(pg_sys::INT8OID),
                    ty(pg_sys::INT8OID),
                    ty(pg_sys::JSONBOID),
                ],
            );
            client
                .update(stmt, None, &[token.into(), id.into(), progress])
                .unwrap_or_else(|e| pgrx::error!("{e}"));
            true
        })
    })
}

/// $1 claims, $2 extend: the active ones get lease_until = now + extend.
const EXTEND_SQL: &str = r#"
UPDATE pgque.job_claims c SET lease_until = pg_catalog.clock_timestamp() + $2::interval
WHERE c.claim_id = ANY ($1::bigint[]) AND c.state::text = 'a'
RETURNING c.claim_id, c.lease_until
"#;

/// Extends the lease of every active claim holding an unfinished job of the
/// pairs (the caller holds their claim locks). Returns (job id, lease_until)
/// per such pair, in job id order.
pub fn heartbeat(
    ids: &[i64],
    tokens: &[i64],
    extend: pgrx::datum::Interval,
) -> Vec<(i64, TimestampWithTimeZone)> {
    let mut distinct = tokens.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    with_generic_plans(|| {
        Spi::connect_mut(|client| {
            let groups = accepted_now(client, ids, tokens, distinct);
            if groups.is_empty() {
                return Vec::new();
            }
            let claims: Vec<i64> = groups.iter().map(|g| g.0).collect();
            let stmt = prepared(
                client,
                EXTEND_SQL,
                &[ty(pg_sys::INT8ARRAYOID), ty(pg_sys::INTERVALOID)],
            );
            let until: HashMap<i64, TimestampWithTimeZone> = client
                .update(stmt, None, &[claims.into(), extend.into()])
                .unwrap_or_else(|e| pgrx::error!("{e}"))
                .filter_map(|r| Some((r.get::<i64>(1).ok()??, r.get(2).ok()??)))
                .collect();
            let mut out: Vec<(i64, TimestampWithTimeZone)> = groups
                .iter()
                .flat_map(|(claim, jobs)| jobs.iter().map(move |&id| (id, claim)))
                .filter_map(|(id, claim)| Some((id, *until.get(claim)?)))
                .collect();
            out.sort_by_key(|o| o.0);
            out
        })
    })
}

/// $1 claim, $2 jobs (NULL: every unfinished job of the claim), $3 the
/// claim's new state (NULL: unchanged), $4 true: the jobs leave the claim by
/// a done row of kind 'o' (one job failing, snoozing, cancelled), false: the
/// claim's state says where they went (rescue, evacuation); $5 true: only
/// if the claim's lease is over (the rescue, re-checking under the lock).
/// The jobs become pgque.jobs rows in state running with the claim's token,
/// lease, worker and dispatch time, attempt 1, in their place (ready_seq =
/// id), with their last progress. Only an active claim's unfinished jobs
/// move. Returns how many moved. `$h`: the log rows' headers array, `$c`,
/// `$v`: pgque.jobs' headers column and its value (`NULL::jsonb[]`, "", ""
/// on a schema from before 0.8.0; dispatch::fit picks).
macro_rules! to_side_sql {
    ($h:expr, $c:expr, $v:expr) => {
        concat!(
            r#"
WITH c AS MATERIALIZED (
    SELECT c.claim_id, c.lane_id, c.job_ids, c.worker, c.dispatched_at, c.lease_until,
           l.queue, l.priority, l.shard, jq.mode
    FROM pgque.job_claims c
    JOIN pgque.job_lanes l ON l.lane_id = c.lane_id
    LEFT JOIN pgque.job_queues jq ON jq.queue_name = l.queue
    WHERE c.claim_id = $1 AND c.state::text = 'a'
      AND (NOT $5 OR c.lease_until < pg_catalog.clock_timestamp())
),
done AS MATERIALIZED (
    SELECT m.id FROM pgque.job_done d CROSS JOIN LATERAL unnest(d.job_ids) AS m(id)
    WHERE d.claim_id = $1
),
todo AS MATERIALIZED (
    SELECT m.id FROM c CROSS JOIN LATERAL unnest(c.job_ids) AS m(id)
    WHERE ($2::bigint[] IS NULL OR m.id = ANY ($2::bigint[]))
      AND NOT EXISTS (SELECT 1 FROM done WHERE done.id = m.id)
),
-- the log rows holding them: the lane's rows from the first one on, at most
-- one more row than the claim has jobs (a claim is a run of its lane)
src AS MATERIALIZED (
    SELECT COALESCE(r.ids[u.ord], r.id_lo + u.ord - 1) AS id, u.kind, u.args,
           COALESCE(u.run_at, r.enqueued_at) AS run_at, COALESCE(u.ma, r.max_attempts) AS ma,
           u.fk, r.enqueued_at, u.h
    FROM c
    CROSS JOIN LATERAL (
        SELECT r.* FROM pgque.job_log r
        WHERE r.lane_id = c.lane_id AND r.id_hi >= (SELECT min(t.id) FROM todo t)
        ORDER BY r.id_hi
        LIMIT cardinality(c.job_ids) + 1) r
    CROSS JOIN LATERAL unnest(r.kinds, r.args, r.run_ats, r.job_max_attempts, r.fairness_keys,
                              "#,
            $h,
            r#")
         WITH ORDINALITY AS u(kind, args, run_at, ma, fk, h, ord)
),
ins AS (
    INSERT INTO pgque.jobs (id, queue, kind, args, priority, shard, state, ready_seq, run_at,
                            attempt, max_attempts, fairness_key, rr_key, enqueued_at, worker,
                            lease_token, lease_until, dispatched_at, progress"#,
            $c,
            r#")
    SELECT s.id, c.queue, s.kind, s.args, c.priority, c.shard, 'running', s.id, s.run_at,
           1, s.ma, s.fk, CASE WHEN c.mode = 'round_robin' THEN COALESCE(s.fk, '') END,
           s.enqueued_at, c.worker, c.claim_id, c.lease_until, c.dispatched_at,
           -- the job's last progress goes with it (its log rows may be truncated)
           (SELECT p.progress FROM pgque.job_progress p
            WHERE p.job_id = s.id AND p.claim_id = c.claim_id ORDER BY p.id DESC LIMIT 1)"#,
            $v,
            r#"
    FROM src s CROSS JOIN c
    WHERE s.id IN (SELECT t.id FROM todo t)
    ORDER BY s.id
    RETURNING id
),
out AS (
    INSERT INTO pgque.job_done (seg, claim_id, kind, job_ids, at)
    SELECT "#,
            crate::cur_seg!(),
            r#", $1, 'o', array_agg(i.id ORDER BY i.id), now()
    FROM ins i
    WHERE $4
    HAVING count(*) > 0
),
st AS (
    UPDATE pgque.job_claims c SET state = $3
    WHERE c.claim_id = $1 AND c.state::text = 'a' AND $3 IS NOT NULL
      AND EXISTS (SELECT 1 FROM ins)
)
SELECT count(*)::int FROM ins
"#
        )
    };
}

pub const TO_SIDE_SQL: &str = to_side_sql!("r.headers", ", headers", ", s.h");
/// TO_SIDE_SQL for a schema from before 0.8.0.
pub const TO_SIDE_SQL_V07: &str = to_side_sql!("NULL::jsonb[]", "", "");

/// Runs TO_SIDE_SQL (the caller holds the claim's lock).
pub fn to_side(
    claim: i64,
    jobs: Option<&[i64]>,
    new_state: Option<&str>,
    leave: bool,
    expired_only: bool,
) -> i32 {
    let state: Option<i8> = new_state.map(|s| s.as_bytes()[0] as i8);
    run_int(
        super::dispatch::fit(TO_SIDE_SQL, TO_SIDE_SQL_V07),
        &[
            ty(pg_sys::INT8OID),
            ty(pg_sys::INT8ARRAYOID),
            ty(pg_sys::CHAROID),
            ty(pg_sys::BOOLOID),
            ty(pg_sys::BOOLOID),
        ],
        vec![
            claim.into(),
            jobs.map(|j| j.to_vec()).into(),
            state.into(),
            leave.into(),
            expired_only.into(),
        ],
    )
}

/// One job of a claim into pgque.jobs, leaving the claim (fail, snooze): a
/// no-op unless `token` is an active claim holding the unfinished job `id`.
/// Takes the claim's lock.
pub fn leave_claim(id: i64, token: i64) -> bool {
    super::claims_locked(&[token], "a call about a job of the job log")
        && to_side(token, Some(&[id]), None, true, false) > 0
}

/// Where job `id` is in the log: its lane, when a log row holds it.
const FIND_SQL: &str = r#"
SELECT l.lane_id FROM pgque.job_lanes l
CROSS JOIN LATERAL (
    SELECT r.id_lo, r.ids FROM pgque.job_log r
    WHERE r.lane_id = l.lane_id AND r.id_hi >= $1
    ORDER BY r.id_hi LIMIT 1) r
WHERE r.id_lo <= $1 AND (r.ids IS NULL OR $1 = ANY (r.ids))
LIMIT 1
"#;

/// $1 lane, $2 job: the claim that handed the job out, if it is active and
/// the job unfinished in it (claims tile their lane: it is the first whose
/// last job is at or after the job).
const RUNNING_CLAIM_SQL: &str = r#"
SELECT c.claim_id FROM (
    SELECT c.* FROM pgque.job_claims c WHERE c.lane_id = $1 AND c.hi >= $2
    ORDER BY c.hi LIMIT 1) c
WHERE c.state = 'a' AND $2 = ANY (c.job_ids)
  AND NOT EXISTS (SELECT 1 FROM pgque.job_done d WHERE d.claim_id = c.claim_id AND $2 = ANY (d.job_ids))
"#;

/// $1 lane, $2 job: a job still above its lane's cursor becomes a ready row
/// of pgque.jobs in its place, and a hole of the lane (dispatch passes over
/// it). Returns 1, or 0 when the job is not above the cursor. `$h`, `$c`,
/// `$v` as in to_side_sql!.
macro_rules! ready_to_side_sql {
    ($h:expr, $c:expr, $v:expr) => {
        concat!(
            r#"
WITH l AS MATERIALIZED (
    SELECT l.*, jq.mode,
           GREATEST(l.cursor_floor, (SELECT max(c.hi) FROM pgque.job_claims c WHERE c.lane_id = l.lane_id)) AS cur
    FROM pgque.job_lanes l LEFT JOIN pgque.job_queues jq ON jq.queue_name = l.queue
    WHERE l.lane_id = $1
),
src AS MATERIALIZED (
    SELECT x.* FROM (
        SELECT COALESCE(r.ids[u.ord], r.id_lo + u.ord - 1) AS id, u.kind, u.args,
               COALESCE(u.run_at, r.enqueued_at) AS run_at, COALESCE(u.ma, r.max_attempts) AS ma,
               u.fk, r.enqueued_at, u.h
        FROM l
        CROSS JOIN LATERAL (
            SELECT r.* FROM pgque.job_log r WHERE r.lane_id = $1 AND r.id_hi >= $2
            ORDER BY r.id_hi LIMIT 1) r
        CROSS JOIN LATERAL unnest(r.kinds, r.args, r.run_ats, r.job_max_attempts, r.fairness_keys,
                                  "#,
            $h,
            r#")
             WITH ORDINALITY AS u(kind, args, run_at, ma, fk, h, ord)) x
    WHERE x.id = $2 AND x.id > (SELECT l.cur FROM l)
      AND NOT EXISTS (SELECT 1 FROM pgque.jobs j WHERE j.id = $2)
),
ins AS (
    INSERT INTO pgque.jobs (id, queue, kind, args, priority, shard, state, ready_seq, run_at,
                            max_attempts, fairness_key, rr_key, enqueued_at"#,
            $c,
            r#")
    SELECT s.id, l.queue, s.kind, s.args, l.priority, l.shard, 'ready', s.id, s.run_at, s.ma,
           s.fk, CASE WHEN l.mode = 'round_robin' THEN COALESCE(s.fk, '') END, s.enqueued_at"#,
            $v,
            r#"
    FROM src s CROSS JOIN l
    RETURNING id
),
h AS (
    INSERT INTO pgque.job_log_holes (lane_id, job_id) SELECT $1, i.id FROM ins i
)
SELECT count(*)::int FROM ins
"#
        )
    };
}

const READY_TO_SIDE_SQL: &str = ready_to_side_sql!("r.headers", ", headers", ", s.h");
/// READY_TO_SIDE_SQL for a schema from before 0.8.0.
const READY_TO_SIDE_SQL_V07: &str = ready_to_side_sql!("NULL::jsonb[]", "", "");

/// Brings job `id` of the log into pgque.jobs for an admin action on one job
/// (cancel): a ready job in its place (and a hole in its lane), a running one
/// out of its claim. Returns whether the job is in the log at all (a
/// completed log job is, and stays there). Waits for the lane's and the
/// claim's locks.
pub fn job_to_side(id: i64) -> bool {
    move_to_side(id, true).unwrap_or(true)
}

/// As `job_to_side`, for the worker's duties, which never wait on a lock a
/// caller's transaction can hold: the lane's and the claim's locks are only
/// tried. None when one of them is held (nothing moved: try again later).
pub fn try_job_to_side(id: i64) -> Option<bool> {
    move_to_side(id, false)
}

fn move_to_side(id: i64, wait: bool) -> Option<bool> {
    // no rotation raises the lane's floor meanwhile: the barrier before the
    // first statement that reads the log (log/mod.rs)
    if wait {
        super::enter_log();
    } else if !super::try_enter_log() {
        return None;
    }
    let lane = with_generic_plans(|| {
        Spi::connect(|client| {
            let stmt = prepared(client, FIND_SQL, &[ty(pg_sys::INT8OID)]);
            client
                .select(stmt, None, &[id.into()])
                .ok()
                .and_then(|t| t.first().get::<i32>(1).ok().flatten())
        })
    });
    let Some(lane) = lane else {
        return Some(false);
    };
    // (wait: an admin's cancel; the worker always reads committed)
    super::require_read_committed("cancel");
    // no dispatcher of the lane moves its cursor meanwhile
    if wait {
        Spi::run_with_args(
            crate::locks::sql("SELECT pgque.xact_lock(1785684580, $1)"),
            &[lane.into()],
        )
        .unwrap_or_else(|e| pgrx::error!("{e}"));
    } else if !crate::locks::try_lock(1785684580, lane as i64) {
        return None;
    }
    let args = [lane.into(), id.into()];
    let ready_sql = super::dispatch::fit(READY_TO_SIDE_SQL, READY_TO_SIDE_SQL_V07);
    let moved = Spi::get_one_with_args::<i32>(ready_sql, &args)
        .ok()
        .flatten()
        .unwrap_or(0);
    if moved == 0 {
        let claim = Spi::get_one_with_args::<i64>(RUNNING_CLAIM_SQL, &args)
            .ok()
            .flatten();
        if let Some(claim) = claim {
            if wait {
                super::lock_claims(&[claim]);
            } else if !super::try_lock_claim(claim) {
                return None;
            }
            to_side(claim, Some(&[id]), None, true, false);
        }
    }
    Some(true)
}

#[cfg(test)]
mod pure_tests {
    use super::accepted;
    use std::collections::HashMap;

    #[test]
    fn accepted_keeps_the_unfinished_jobs_of_active_claims_once() {
        let mut claims = HashMap::from([(7, vec![12, 10, 11]), (9, vec![20, 21])]);
        let mut done = HashMap::from([(7, vec![11])]);
        // 11 is done, 99 is not 7's, token 8 is no active claim, 10 twice
        let ids = [10, 11, 99, 10, 5, 21, 12, 20];
        let tokens = [7, 7, 7, 7, 8, 9, 7, 9];
        assert_eq!(
            accepted(&ids, &tokens, &mut claims, &mut done),
            vec![(7, vec![10, 12]), (9, vec![20, 21])]
        );
        assert!(accepted(&[1], &[8], &mut claims, &mut done).is_empty());
    }
}
