//! Giving one event of an open batch back: scheduled for redelivery to its
//! consumer (pgque.retry_queue, moved back by maint at ev_retry_after), or
//! dead-lettered once its retries reached the queue's max_retries. nack,
//! event_retry and batch_retry (api/consume.rs), slot nacks (api/slots.rs),
//! unregistering with a batch open (api/admin.rs) and the pause policy
//! (pause.rs) all give events back through here.
use super::batch::Batch;
use super::events::Event;
use super::queue::Queue;
use super::schema::dead_letter_store_installed;
use super::spi::exec;
use pgrx::datum::Interval;
use pgrx::spi::SpiClient;

/// Schedules one event of an open batch for redelivery to its consumer, or
/// dead-letters it once its retries reached the queue's max_retries.
#[allow(clippy::too_many_arguments)]
pub fn retry_event(
    c: &mut SpiClient<'_>,
    q: &Queue,
    b: &Batch,
    consumer: &str,
    ev: &Event,
    retry_after: &Interval,
    reason: Option<&str>,
    dead_letter: bool,
) -> i32 {
    // maint moves it back at ev_retry_after: an idle worker must learn that time.
    crate::wake::recheck_at_commit();
    let count = ev.retry.unwrap_or(0);
    let [e1, e2, e3, e4] = &ev.extra;
    // The 0.7.0 schema records the event's transaction id (NULL where it was
    // not read: 0); an older schema, between a library install and ALTER
    // EXTENSION UPDATE, has no such column.
    let with_txid = dead_letter_store_installed();
    // 0.8.0 on, the event's headers go along (ev_headers, the last argument)
    let with_headers = crate::headers::events_have_headers();
    if dead_letter && count >= q.max_retries {
        // Once per (consumer, event): a repeated nack of a dead-lettered
        // event adds no second row (PgQue's contract), and still returns 1.
        let sql = if with_headers {
            "INSERT INTO pgque.dead_letter_store (dl_queue, dl_consumer, dl_owner, dl_reason, ev_id, ev_time, ev_retry, \
                                                  ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_txid, \
                                                  ev_headers) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, nullif($14, 0)::text::xid8, $15 \
              WHERE NOT EXISTS (SELECT 1 FROM pgque.dead_letter_store d WHERE d.dl_owner = $3 AND d.ev_id = $5)"
        } else if with_txid {
            "INSERT INTO pgque.dead_letter_store (dl_queue, dl_consumer, dl_owner, dl_reason, ev_id, ev_time, ev_retry, \
                                                  ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_txid) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, nullif($14, 0)::text::xid8 \
              WHERE NOT EXISTS (SELECT 1 FROM pgque.dead_letter_store d WHERE d.dl_owner = $3 AND d.ev_id = $5)"
        } else {
            "INSERT INTO pgque.dead_letter (dl_queue, dl_consumer, dl_owner, dl_reason, ev_id, ev_time, ev_retry, \
                                            ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 \
              WHERE $14::int8 IS NOT NULL \
                AND NOT EXISTS (SELECT 1 FROM pgque.dead_letter d WHERE d.dl_owner = $3 AND d.ev_id = $5)"
        };
        let mut args = vec![
            q.id.into(),
            consumer.into(),
            b.sub_id.into(),
            reason.into(),
            ev.id.into(),
            ev.time.into(),
            ev.retry.into(),
            ev.ev_type.into(),
            ev.data.into(),
            (*e1).into(),
            (*e2).into(),
            (*e3).into(),
            (*e4).into(),
            ev.txid.into(),
        ];
        if with_headers {
            args.push(headers_arg(ev));
        }
        exec(c, sql, &args);
        return 1;
    }
    let sql = if with_headers {
        "INSERT INTO pgque.retry_queue (ev_retry_after, ev_queue, ev_owner, ev_id, ev_time, ev_retry, \
                                        ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_txid, \
                                        ev_headers) \
         VALUES (now() + $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, nullif($13, 0)::text::xid8, $14) \
         ON CONFLICT (ev_owner, ev_id) DO NOTHING RETURNING 1"
    } else if with_txid {
        "INSERT INTO pgque.retry_queue (ev_retry_after, ev_queue, ev_owner, ev_id, ev_time, ev_retry, \
                                        ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_txid) \
         VALUES (now() + $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, nullif($13, 0)::text::xid8) \
         ON CONFLICT (ev_owner, ev_id) DO NOTHING RETURNING 1"
    } else {
        "INSERT INTO pgque.retry_queue (ev_retry_after, ev_queue, ev_owner, ev_id, ev_time, ev_retry, \
                                        ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4) \
         SELECT now() + $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 WHERE $13::int8 IS NOT NULL \
         ON CONFLICT (ev_owner, ev_id) DO NOTHING RETURNING 1"
    };
    let mut args = vec![
        (*retry_after).into(),
        q.id.into(),
        b.sub_id.into(),
        ev.id.into(),
        ev.time.into(),
        (count + 1).into(),
        ev.ev_type.into(),
        ev.data.into(),
        (*e1).into(),
        (*e2).into(),
        (*e3).into(),
        (*e4).into(),
        ev.txid.into(),
    ];
    if with_headers {
        args.push(headers_arg(ev));
    }
    let t = exec(c, sql, &args);
    t.len() as i32
}

/// An event's headers as a statement argument (jsonb, NULL when none).
fn headers_arg(ev: &Event) -> pgrx::datum::DatumWithOid<'static> {
    match ev.headers {
        Some(h) => h.into(),
        None => pgrx::datum::DatumWithOid::null_oid(pgrx::pg_sys::JSONBOID),
    }
}
