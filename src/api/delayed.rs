//! Delayed delivery: send_at, and the promotion of due events (DESIGN.md
//! sections 1 and 6). Storage and its bloat-free rotation: sql/21_delayed.sql.
//!
//! A delayed event's id is reserved from its queue's sequence at send_at, so
//! the caller gets the id consumers will see. Promotion appends due events to
//! their queue in (deliver_at, id) order; consumers read a batch in id order,
//! so delayed events come out in deliver_at order across promotion runs, and
//! in id order among those one run promotes together (due within the same
//! `pgque.delayed_period_ms`, or during a worker outage).
use crate::datum::JsonbText;
use crate::error::{self, raise, required};
use crate::log::{self, col, exec, first_row};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::JsonB;

extension_sql_file!(
    "../../sql/21_delayed.sql",
    name = "delayed",
    requires = ["event_log"]
);

fn send_at_impl(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    deliver_at: Option<TimestampWithTimeZone>,
    partition_key: Option<&str>,
    headers: Option<JsonB>,
) -> i64 {
    let deliver_at = required(deliver_at, "deliver_at");
    if deliver_at.is_infinity() || deliver_at.is_neg_infinity() {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "deliver_at must be a finite time",
        );
    }
    error::check_partition_key(partition_key);
    let ev_type = super::send::type_arg(type_name);
    let headers = super::send::headers_arg(headers);
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        let t = exec(
            c,
            "SELECT $1 <= clock_timestamp(), cur_piece FROM pgque.delayed_state",
            &[deliver_at.into()],
        );
        let r = first_row(t).expect("pgque.delayed_state has its row");
        let due: bool = col(&r, 1).unwrap();
        let piece: i16 = col(&r, 2).unwrap();
        if due {
            // A past deliver_at is an ordinary send.
            return log::insert_event(
                c,
                &q,
                &log::NewEvent {
                    ev_type: Some(ev_type),
                    ev_data: payload,
                    extra: [partition_key, None, None, None],
                    headers,
                },
            );
        }
        // An idle worker must learn when it comes due (it does not wake for it).
        crate::wake::recheck_at_commit();
        let mut args = vec![
            q.id.into(),
            deliver_at.into(),
            ev_type.into(),
            payload.into(),
            partition_key.into(),
        ];
        // an untraced send_at runs the statement it ran before headers existed
        let (hcol, hval) = match headers {
            Some(h) => {
                args.push(h.into());
                (", ev_headers", ", $6")
            }
            None => ("", ""),
        };
        let sql = format!(
            "INSERT INTO pgque.delayed_event_p{piece} \
                    (ev_queue, ev_id, deliver_at, ev_type, ev_data, ev_extra1, piece{hcol}) \
             VALUES ($1, nextval('{}'), $2, $3, $4, $5, {piece}{hval}) RETURNING ev_id",
            log::event_seq(q.id)
        );
        let t = exec(c, &sql, &args);
        col(&first_row(t).expect("INSERT RETURNING"), 1).unwrap()
    })
}

/// send_at(queue_name, type_name, payload jsonb, deliver_at, partition_key
/// default NULL, headers default NULL) → the event id. The event reaches
/// consumers at or after deliver_at (within pgque.delayed_period_ms plus a
/// tick); a past deliver_at sends at once. Writes one row of
/// pgque.delayed_event (or the event table), with the trace-context headers
/// (checked as send's), which promotion carries into the event table.
#[pg_extern(name = "send_at", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn send_at_headers_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<JsonbText>,
    deliver_at: Option<TimestampWithTimeZone>,
    partition_key: default!(Option<&str>, "NULL"),
    headers: default!(Option<JsonB>, "NULL"),
) -> i64 {
    let payload = payload.map(|p| p.0);
    send_at_impl(
        queue_name,
        type_name,
        payload.as_deref(),
        deliver_at,
        partition_key,
        headers,
    )
}

/// send_at with a text payload; otherwise as the jsonb form.
#[pg_extern(name = "send_at", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn send_at_headers_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    deliver_at: Option<TimestampWithTimeZone>,
    partition_key: default!(Option<&str>, "NULL"),
    headers: default!(Option<JsonB>, "NULL"),
) -> i64 {
    send_at_impl(
        queue_name,
        type_name,
        payload,
        deliver_at,
        partition_key,
        headers,
    )
}

/// The entry point of 0.7.0's `send_at(..., partition_key)` with a jsonb
/// payload (C symbol send_at_jsonb_wrapper, no headers), kept out of this
/// version's SQL: a database still at 0.7.0 runs this library's send_at
/// through it until ALTER EXTENSION pgque UPDATE.
#[pg_extern(sql = false, security_definer)]
fn send_at_jsonb(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<JsonbText>,
    deliver_at: Option<TimestampWithTimeZone>,
    partition_key: Option<&str>,
) -> i64 {
    send_at_headers_jsonb(
        queue_name,
        type_name,
        payload,
        deliver_at,
        partition_key,
        None,
    )
}

/// 0.7.0's text-payload send_at (C symbol send_at_text_wrapper), as
/// send_at_jsonb above.
#[pg_extern(sql = false, security_definer)]
fn send_at_text(
    queue_name: Option<&str>,
    type_name: Option<&str>,
    payload: Option<&str>,
    deliver_at: Option<TimestampWithTimeZone>,
    partition_key: Option<&str>,
) -> i64 {
    send_at_headers_text(
        queue_name,
        type_name,
        payload,
        deliver_at,
        partition_key,
        None,
    )
}

/// Rows a run with snapshot $1 and horizon $2 promotes, given the last run's
/// snapshot $3 and horizon $4: due by now and committed now, but not both at
/// the last run. The last line repeats that as index conditions.
const PROMOTABLE: &str = "d.deliver_at <= $2 \
     AND pg_visible_in_snapshot(d.ev_txid, $1::pg_snapshot) \
     AND NOT (d.deliver_at <= $4 AND pg_visible_in_snapshot(d.ev_txid, $3::pg_snapshot)) \
     AND (d.deliver_at > $4 OR d.ev_txid >= pg_snapshot_xmin($3::pg_snapshot))";

struct State {
    cur: i16,
    switch_due: bool,
    stale: bool,
    last_snap: String,
    last_horizon: TimestampWithTimeZone,
    snap: String,
    horizon: TimestampWithTimeZone,
}

fn read_state(c: &mut SpiClient<'_>, period_s: i32, lock: bool) -> Option<State> {
    let sql = format!(
        "SELECT cur_piece, switched_at <= now() - $1 * interval '1 second', \
                switched_at <= now() - 4 * $1 * interval '1 second', \
                last_snapshot::text, last_horizon, pg_current_snapshot()::text, clock_timestamp() \
           FROM pgque.delayed_state{}",
        if lock { " FOR UPDATE SKIP LOCKED" } else { "" }
    );
    let t = exec(c, &sql, &[period_s.into()]);
    let r = first_row(t)?;
    Some(State {
        cur: col(&r, 1).unwrap(),
        switch_due: col(&r, 2).unwrap(),
        stale: col(&r, 3).unwrap(),
        last_snap: col(&r, 4).unwrap(),
        last_horizon: col(&r, 5).unwrap(),
        snap: col(&r, 6).unwrap(),
        horizon: col(&r, 7).unwrap(),
    })
}

fn args(s: &State) -> [pgrx::datum::DatumWithOid<'static>; 4] {
    [
        s.snap.clone().into(),
        s.horizon.into(),
        s.last_snap.clone().into(),
        s.last_horizon.into(),
    ]
}

/// One promotion run plus the piece GC. Idle, it makes three index probes and
/// writes nothing. Returns the number of events promoted.
pub fn promote(c: &mut SpiClient<'_>, period_s: i32) -> i64 {
    let Some(s) = read_state(c, period_s, false) else {
        return 0;
    };
    let old = 1 - s.cur;
    let t = exec(
        c,
        &format!("SELECT EXISTS (SELECT 1 FROM pgque.delayed_event d WHERE {PROMOTABLE})"),
        &args(&s),
    );
    let promotable: bool = first_row(t).and_then(|r| col(&r, 1)).unwrap_or(false);
    let t = exec(
        c,
        &format!("SELECT EXISTS (SELECT 1 FROM pgque.delayed_event_p{old})"),
        &[],
    );
    let old_nonempty: bool = first_row(t).and_then(|r| col(&r, 1)).unwrap_or(false);
    if !promotable && !old_nonempty && !s.switch_due {
        return 0;
    }
    // One promoter at a time; a busy state row means another run is at work.
    let Some(s) = read_state(c, period_s, true) else {
        return 0;
    };
    let mut promoted = 0i64;
    let t = exec(
        c,
        &format!(
            "SELECT DISTINCT q.queue_id, q.queue_cur_table \
               FROM pgque.delayed_event d JOIN pgque.queue q ON q.queue_id = d.ev_queue \
              WHERE {PROMOTABLE}"
        ),
        &args(&s),
    );
    let queues: Vec<(i32, i32)> = t
        .map(|r| (col(&r, 1).unwrap(), col(&r, 2).unwrap()))
        .collect();
    for &(qid, cur_table) in &queues {
        let sql = format!(
            "WITH ins AS (INSERT INTO {} (ev_id, ev_time, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4{h}) \
               SELECT ev_id, ev_time, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4{h} \
                 FROM pgque.delayed_event d WHERE d.ev_queue = {qid} AND {PROMOTABLE} \
                ORDER BY d.deliver_at, d.ev_id RETURNING 1) \
             SELECT count(*) FROM ins",
            log::event_table(qid, cur_table),
            h = log::headers_col()
        );
        let t = exec(c, &sql, &args(&s));
        promoted += first_row(t).and_then(|r| col::<i64>(&r, 1)).unwrap_or(0);
    }
    if promoted > 0 {
        exec(
            c,
            "UPDATE pgque.delayed_state SET last_snapshot = $1::pg_snapshot, last_horizon = $2",
            &[s.snap.clone().into(), s.horizon.into()],
        );
        // Their ids were taken at send_at, so the ticker's test for new ids
        // since the last tick cannot see them: take one more id per queue (a
        // harmless gap) so the next tick, after this commits, covers them,
        // and wake the worker to make it at once.
        for &(qid, _) in &queues {
            exec(
                c,
                &format!("SELECT nextval('{}')", log::event_seq(qid)),
                &[],
            );
        }
        crate::wake::at_commit();
    }
    gc_old_piece(c, &s, old);
    promoted
}

/// TRUNCATEs the non-current piece once all its rows are promoted (copying
/// forward far-future rows once it is stale); then switches when due.
fn gc_old_piece(c: &mut SpiClient<'_>, s: &State, old: i16) {
    let t = exec(
        c,
        &format!("SELECT EXISTS (SELECT 1 FROM pgque.delayed_event_p{old})"),
        &[],
    );
    let nonempty: bool = first_row(t).and_then(|r| col(&r, 1)).unwrap_or(false);
    if nonempty {
        // Waits for nobody: an in-flight send_at into it keeps the piece.
        if !log::try_lock_exclusive(&format!("delayed_event_p{old}")) {
            return;
        }
        // With the lock, every row there is committed: any due one this run
        // did not see (committed after its snapshot) waits for the next run.
        let t = exec(
            c,
            &format!(
                "SELECT EXISTS (SELECT 1 FROM pgque.delayed_event_p{old} d \
                                 WHERE d.deliver_at <= $2 AND d.ev_txid >= pg_snapshot_xmin($1::pg_snapshot) \
                                   AND NOT pg_visible_in_snapshot(d.ev_txid, $1::pg_snapshot)), \
                        EXISTS (SELECT 1 FROM pgque.delayed_event_p{old} d WHERE d.deliver_at > $2)"
            ),
            &[s.snap.clone().into(), s.horizon.into()],
        );
        let r = first_row(t).unwrap();
        let unpromoted_due: bool = col(&r, 1).unwrap();
        let future: bool = col(&r, 2).unwrap();
        if unpromoted_due || (future && !s.stale) {
            return;
        }
        if future {
            let cur = s.cur;
            exec(
                c,
                &format!(
                    "INSERT INTO pgque.delayed_event_p{cur} \
                            (ev_queue, ev_id, deliver_at, ev_time, ev_type, ev_data, \
                             ev_extra1, ev_extra2, ev_extra3, ev_extra4, piece{h}) \
                     SELECT ev_queue, ev_id, deliver_at, ev_time, ev_type, ev_data, \
                            ev_extra1, ev_extra2, ev_extra3, ev_extra4, {cur}{h} \
                       FROM pgque.delayed_event_p{old} WHERE deliver_at > $1",
                    h = log::headers_col()
                ),
                &[s.horizon.into()],
            );
        }
        log::run_once(c, &format!("TRUNCATE pgque.delayed_event_p{old}"));
    }
    if s.switch_due {
        exec(
            c,
            "UPDATE pgque.delayed_state SET cur_piece = $1, switched_at = now()",
            &[old.into()],
        );
    }
}

/// maint_delayed(): promotes due delayed events into their queues and
/// rotates the delayed-event storage. Returns the number promoted. The
/// worker runs it every pgque.delayed_period_ms; maint() runs it too.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn maint_delayed() -> i64 {
    Spi::connect_mut(|c| promote(c, crate::gucs::ledger_rotation_period_s()))
}
