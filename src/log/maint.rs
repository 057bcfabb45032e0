//! Periodic duties: retry redelivery, event-table rotation (both steps) and
//! metadata rotation. Each call does what is due and returns quickly; every
//! TRUNCATE first tries its lock without waiting (a few short attempts), so a
//! reader holding a lock delays the duty to the next call instead of stalling
//! the worker. All of it works the same when called by hand.
use super::queue::event_table;
use super::spi::{col, exec, first_row, run_once};
use pgrx::pg_sys;
use pgrx::spi::SpiClient;

/// Moves due retries back into their queues' current event tables (same
/// event id and headers, ev_owner = the consumer, ev_retry = the count).
/// Returns the count.
pub fn retry_events(client: &mut SpiClient<'_>) -> i64 {
    let t = exec(
        client,
        "SELECT DISTINCT r.ev_queue, q.queue_cur_table FROM pgque.retry_queue r \
           JOIN pgque.queue q ON q.queue_id = r.ev_queue \
          WHERE r.ev_retry_after <= now()",
        &[],
    );
    let queues: Vec<(i32, i32)> = t
        .map(|r| (col(&r, 1).unwrap(), col(&r, 2).unwrap()))
        .collect();
    let mut moved = 0i64;
    for (qid, cur) in queues {
        let sql = format!(
            "WITH due AS ( \
               DELETE FROM pgque.retry_queue WHERE ev_queue = $1 AND ev_retry_after <= now() \
               RETURNING ev_id, ev_time, ev_owner, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4{h}), \
             ins AS (INSERT INTO {} (ev_id, ev_time, ev_owner, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4{h}) \
               SELECT ev_id, ev_time, ev_owner, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4{h} FROM due \
               ORDER BY ev_id RETURNING 1) \
             SELECT count(*) FROM ins",
            event_table(qid, cur),
            h = super::schema::headers_col()
        );
        let t = exec(client, &sql, &[qid.into()]);
        let n: i64 = col(&first_row(t).unwrap(), 1).unwrap();
        moved += n;
        if n > 0 {
            tick_after_reinsert(client, qid);
        }
    }
    if moved > 0 {
        crate::wake::at_commit();
    }
    moved
}

/// After events were put back into a queue's event table with their old
/// ids (retries, a paused key's held events): those take no sequence value,
/// so the ticker would not see them as new. Leaves a pending tick (its
/// snapshot cannot cover this still-running transaction), so the first
/// ticker() after this commits -- the worker's, woken at commit -- ticks
/// again.
pub fn tick_after_reinsert(client: &mut SpiClient<'_>, qid: i32) {
    let t = exec(
        client,
        "SELECT queue_name, coalesce(pg_sequence_last_value(queue_event_seq::regclass), 0) \
           FROM pgque.queue WHERE queue_id = $1",
        &[qid.into()],
    );
    let r = first_row(t).unwrap();
    let (name, seq): (String, i64) = (col(&r, 1).unwrap(), col(&r, 2).unwrap());
    super::tick::try_insert_tick(client, qid, &name, seq, super::tick::Pending::New, false);
    crate::wake::at_commit();
}

/// Takes AccessExclusiveLock on `rel` without queueing behind readers: a
/// few conditional attempts over at most ~20 ms.
fn try_lock_exclusive(client: &mut SpiClient<'_>, rel: &str) -> bool {
    let t = exec(client, "SELECT to_regclass($1)::oid", &[rel.into()]);
    let Some(oid) = first_row(t).and_then(|r| col::<pg_sys::Oid>(&r, 1)) else {
        return false;
    };
    for _ in 0..10 {
        let ok = unsafe {
            pg_sys::ConditionalLockRelationOid(oid, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE)
        };
        if ok {
            return true;
        }
        unsafe { pg_sys::pg_usleep(2_000) };
    }
    false
}

/// Rotation step 2: records the first transaction after a switch (all
/// transactions that could still write the old table are older than it).
pub fn rotate_step2(client: &mut SpiClient<'_>) -> i64 {
    // Look first: the UPDATE would take a transaction id every call.
    let t = exec(
        client,
        "SELECT EXISTS (SELECT 1 FROM pgque.queue WHERE queue_switch_step2 IS NULL)",
        &[],
    );
    let due: bool = col(&first_row(t).unwrap(), 1).unwrap();
    if !due {
        return 0;
    }
    let t = exec(
        client,
        "WITH u AS (UPDATE pgque.queue SET queue_switch_step2 = pg_current_xact_id() \
                     WHERE queue_id IN (SELECT queue_id FROM pgque.queue \
                                         WHERE queue_switch_step2 IS NULL \
                                           AND queue_switch_step1 <> pg_current_xact_id() \
                                           FOR NO KEY UPDATE SKIP LOCKED) \
                     RETURNING 1) SELECT count(*) FROM u",
        &[],
    );
    col(&first_row(t).unwrap(), 1).unwrap()
}

/// Rotation step 1: for each queue whose rotation period is over and whose
/// consumers have all passed the last switch, TRUNCATE the table that becomes
/// current (the oldest) and switch to it.
pub fn rotate_step1(client: &mut SpiClient<'_>) -> i64 {
    rotate_step1_of(client, None)
}

/// [`rotate_step1`] for one queue (`Some(queue_id)`) or all of them.
pub fn rotate_step1_of(client: &mut SpiClient<'_>, queue_id: Option<i32>) -> i64 {
    let t = exec(
        client,
        "SELECT q.queue_id, q.queue_cur_table, q.queue_ntables FROM pgque.queue q \
          WHERE ($1::int4 IS NULL OR q.queue_id = $1) \
            AND q.queue_switch_step2 IS NOT NULL \
            AND q.queue_switch_time + q.queue_rotation_period <= now() \
            AND NOT EXISTS ( \
                SELECT 1 FROM pgque.consumer_position p \
                  LEFT JOIN LATERAL (SELECT t.tick_snapshot FROM pgque.tick t \
                                      WHERE t.tick_queue = q.queue_id AND t.tick_id = p.pos_tick LIMIT 1) t ON true \
                 WHERE p.sub_queue = q.queue_id \
                   AND (t.tick_snapshot IS NULL OR pg_snapshot_xmin(t.tick_snapshot) < q.queue_switch_step2))",
        &[queue_id.into()],
    );
    let due: Vec<(i32, i32, i32)> = t
        .map(|r| {
            (
                col(&r, 1).unwrap(),
                col(&r, 2).unwrap(),
                col(&r, 3).unwrap(),
            )
        })
        .collect();
    let mut n = 0;
    for (qid, cur, ntables) in due {
        let next = (cur + 1) % ntables;
        let tbl = event_table(qid, next);
        // The queue row first, without waiting (a transaction holding it,
        // e.g. a manual force_tick left open, postpones this queue only).
        let row = exec(
            client,
            "SELECT 1 FROM pgque.queue WHERE queue_id = $1 FOR NO KEY UPDATE SKIP LOCKED",
            &[qid.into()],
        );
        if row.is_empty() || !try_lock_exclusive(client, &tbl) {
            continue;
        }
        run_once(client, &format!("TRUNCATE {tbl}"));
        exec(
            client,
            "UPDATE pgque.queue SET queue_cur_table = $2, queue_switch_time = now(), \
                    queue_switch_step1 = pg_current_xact_id(), queue_switch_step2 = NULL \
              WHERE queue_id = $1",
            &[qid.into(), next.into()],
        );
        n += 1;
    }
    n
}

/// Ticks ahead of a queue's slowest consumer that metadata rotation keeps
/// whole; beyond them it keeps one tick per `pgque.batch_max_events` events.
const TICKS_AHEAD: i64 = 100_000;

/// Metadata rotation. Ticks, batches and batch completions are append-only
/// in two pieces; every `pgque.metadata_rotation_period` the current piece
/// switches (step A), and once no transaction can still write the old piece,
/// the rows still needed (every consumer's latest and open batches, the ticks
/// they reference, each queue's last tick, the ticks consumers have yet to
/// read) are copied forward and the old piece is TRUNCATEd (step B). Returns
/// the number of steps done.
pub fn rotate_metadata(client: &mut SpiClient<'_>, period_ms: i64) -> i64 {
    let t = exec(
        client,
        "SELECT cur_piece, old_pending, \
                coalesce(switch_xid < pg_snapshot_xmin(pg_current_snapshot()), false), \
                (extract(epoch FROM now() - switched_at) * 1000)::int8 \
           FROM pgque.meta_state",
        &[],
    );
    let r = first_row(t).expect("meta_state row");
    let cur: i16 = col(&r, 1).unwrap();
    let old_pending: bool = col(&r, 2).unwrap();
    let switch_settled: bool = col(&r, 3).unwrap();
    let age_ms: i64 = col(&r, 4).unwrap();
    drop(r);
    if old_pending {
        if !switch_settled {
            return 0;
        }
        let old = 1 - cur;
        let cuts = crate::log::schema::cuts_installed();
        let mut rels = vec![
            format!("pgque.tick_p{old}"),
            format!("pgque.batch_p{old}"),
            format!("pgque.batch_done_p{old}"),
        ];
        if cuts {
            rels.push(format!("pgque.batch_cut_p{old}"));
        }
        for rel in &rels {
            if !try_lock_exclusive(client, rel) {
                return 0;
            }
        }
        // Copy forward: each consumer's latest batch and every open batch.
        exec(
            client,
            &format!(
                "INSERT INTO pgque.batch (batch_id, sub_id, member_id, prev_tick_id, tick_id, ev_floor, ev_ceiling, opened_at, piece) \
                 SELECT b.batch_id, b.sub_id, b.member_id, b.prev_tick_id, b.tick_id, b.ev_floor, b.ev_ceiling, b.opened_at, {cur} \
                   FROM pgque.batch_p{old} b \
                  WHERE EXISTS (SELECT 1 FROM pgque.subscription s WHERE s.sub_id = b.sub_id) AND \
                    (NOT EXISTS (SELECT 1 FROM pgque.batch_done d WHERE d.batch_id = b.batch_id) \
                     OR b.batch_id = (SELECT b2.batch_id FROM pgque.batch b2 WHERE b2.sub_id = b.sub_id \
                                       ORDER BY b2.tick_id DESC, b2.ev_floor DESC, b2.batch_id DESC LIMIT 1))"
            ),
            &[],
        );
        exec(
            client,
            &format!(
                "INSERT INTO pgque.batch_done (batch_id, done_at, abandoned, piece) \
                 SELECT d.batch_id, d.done_at, d.abandoned, {cur} FROM pgque.batch_done_p{old} d \
                  WHERE EXISTS (SELECT 1 FROM pgque.batch_p{cur} b WHERE b.batch_id = d.batch_id)"
            ),
            &[],
        );
        // The stored cuts of the ranges a kept batch is in (the next cut of
        // a consumer mid-range reads them).
        if cuts {
            exec(
                client,
                &format!(
                    "INSERT INTO pgque.batch_cut (sub_id, prev_tick_id, tick_id, base, first_id, last_id, ids, tids, tbls, piece) \
                     SELECT c.sub_id, c.prev_tick_id, c.tick_id, c.base, c.first_id, c.last_id, c.ids, c.tids, c.tbls, {cur} \
                       FROM pgque.batch_cut_p{old} c \
                      WHERE EXISTS (SELECT 1 FROM pgque.batch_p{cur} b WHERE b.sub_id = c.sub_id \
                                       AND b.prev_tick_id = c.prev_tick_id AND b.tick_id = c.tick_id)"
                ),
                &[],
            );
        }
        // The ticks still referenced, each queue's last tick, and the ticks
        // a consumer has yet to read: those after the oldest position of the
        // queue's consumers (a cooperative consumer's batches are its
        // parent subscription's; its members have none of their own). Without them a consumer that fell behind by more
        // than a rotation period saw one tick range up to the head, cut by
        // event id into `limit`-sized batches each of which re-read the whole
        // range: a drain quadratic in the backlog. The first TICKS_AHEAD of
        // them are kept as they are; further ahead (a consumer days behind),
        // one tick per batch_max_events events, which bounds the rows copied
        // forward on every rotation.
        exec(
            client,
            &format!(
                "WITH pos AS MATERIALIZED ( \
                     SELECT s.sub_queue AS queue, \
                            min(coalesce((SELECT b.tick_id FROM pgque.batch b WHERE b.sub_id = s.sub_id \
                                           ORDER BY b.tick_id DESC LIMIT 1), \
                                         s.sub_start_tick)) AS tick_id \
                       FROM pgque.subscription s WHERE s.sub_parent IS NULL GROUP BY s.sub_queue), \
                 ahead AS MATERIALIZED ( \
                     SELECT t.tick_id, \
                            row_number() OVER w AS rn, \
                            t.tick_event_seq / $1 AS bucket, \
                            lag(t.tick_event_seq / $1) OVER w AS prev_bucket \
                       FROM pgque.tick_p{old} t JOIN pos ON pos.queue = t.tick_queue AND t.tick_id > pos.tick_id \
                     WINDOW w AS (PARTITION BY t.tick_queue ORDER BY t.tick_id)) \
                 INSERT INTO pgque.tick (tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq, tick_pending, piece) \
                 SELECT t.tick_queue, t.tick_id, t.tick_time, t.tick_snapshot, t.tick_event_seq, t.tick_pending, {cur} \
                   FROM pgque.tick_p{old} t \
                  WHERE t.tick_id IN (SELECT prev_tick_id FROM pgque.batch_p{cur} \
                                      UNION SELECT tick_id FROM pgque.batch_p{cur} \
                                      UNION SELECT sub_start_tick FROM pgque.subscription) \
                     OR t.tick_id = (SELECT max(t2.tick_id) FROM pgque.tick t2 WHERE t2.tick_queue = t.tick_queue) \
                     OR t.tick_id IN (SELECT a.tick_id FROM ahead a \
                                       WHERE a.rn <= $2 OR a.bucket IS DISTINCT FROM a.prev_bucket)"
            ),
            &[
                crate::gucs::batch_max_events().max(1).into(),
                TICKS_AHEAD.into(),
            ],
        );
        for rel in &rels {
            run_once(client, &format!("TRUNCATE {rel}"));
        }
        exec(
            client,
            "UPDATE pgque.meta_state SET old_pending = false, switch_xid = NULL",
            &[],
        );
        return 1;
    }
    if age_ms >= period_ms {
        exec(
            client,
            "UPDATE pgque.meta_state SET cur_piece = 1 - cur_piece, switched_at = now(), \
                    switch_xid = pg_current_xact_id(), old_pending = true",
            &[],
        );
        return 1;
    }
    0
}
