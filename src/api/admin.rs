#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
//! Administration (queues, config, ticker, maintenance), cooperative
//! consumers and dead letters.
use super::members::{find_group_member, member_by_name, member_name, unregister_member};
use super::settings::{apply_setting, parse_setting};
use super::srf::{Messages, MessagesWithHeaders};
use super::{deliver, max_return_arg};
use crate::datum::interval_ms;
use crate::error::{self, raise, required};
use crate::log::{self, batch, maint, tick};
use pgrx::datum::Interval;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

/// create_queue(queue_name) → 1 created, 0 existed.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn create_queue(queue_name: Option<&str>) -> i32 {
    let name = error::valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    crate::jobs::channel::refuse_shared_channel(name, true);
    Spi::connect_mut(|c| log::create_queue(c, name) as i32)
}

fn do_drop(queue_name: Option<&str>, force: bool) -> i32 {
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        log::drop_queue(c, &q, force);
        1
    })
}

/// drop_queue(queue_name): refuses a queue that still has consumers (55000).
#[pg_extern(name = "drop_queue", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn drop_queue1(queue_name: Option<&str>) -> i32 {
    do_drop(queue_name, false)
}

/// drop_queue(queue_name, force): force drops consumers too.
#[pg_extern(name = "drop_queue", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn drop_queue2(queue_name: Option<&str>, force: Option<bool>) -> i32 {
    do_drop(queue_name, force.unwrap_or(false))
}

/// set_queue_config(queue_name, param, value); NULL value resets the default.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn set_queue_config(queue_name: Option<&str>, param: Option<&str>, value: Option<&str>) -> i32 {
    let param = required(param, "param");
    let setting =
        parse_setting(param, value).unwrap_or_else(|m| raise(error::INVALID_PARAMETER_VALUE, m));
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        apply_setting(c, &q, setting);
        1
    })
}

/// ticker(): ticks every queue that needs it; returns the number of queues
/// ticked (one tick each).
#[pg_extern(name = "ticker", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn ticker_all() -> i64 {
    Spi::connect_mut(|c| tick::run_ticker(c, None, false).len() as i64)
}

/// ticker(queue_name): ticks that queue if it needs it; the new tick id or NULL.
#[pg_extern(name = "ticker", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn ticker_one(queue_name: Option<&str>) -> Option<i64> {
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        tick::run_ticker(c, Some(q.id), false).first().map(|t| t.1)
    })
}

/// Ticks the queue now (also when paused) and returns that tick's id, which
/// is then the queue's last tick. PgQue's force_next_tick only makes the
/// *next* ticker() tick the queue, and its clients call ticker() right after
/// it and count that queue: the forced tick is left pending with a marker
/// that every later ticker() sees as resolved (tick.rs run_ticker), so the
/// next ticker() ticks the queue once more (unless it is paused).
fn force(queue_name: Option<&str>) -> i64 {
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        tick::run_ticker(c, Some(q.id), true)
            .first()
            .map(|t| t.1)
            .expect("a forced tick")
    })
}

/// force_next_tick(queue_name): ticks now (also when paused); the tick id.
/// The next ticker() ticks the queue again (unless paused), as in PgQue.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn force_next_tick(queue_name: Option<&str>) -> i64 {
    force(queue_name)
}

/// force_tick(queue_name): alias of force_next_tick.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn force_tick(queue_name: Option<&str>) -> i64 {
    force(queue_name)
}

/// maint(): every periodic event-queue duty that is due; the number of steps done.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn maint() -> i32 {
    Spi::connect_mut(|c| {
        let mut n = maint::retry_events(c);
        n += maint::rotate_step2(c);
        n += maint::rotate_step1(c);
        n += maint::rotate_metadata(c, crate::gucs::metadata_rotation_period_ms());
        n += super::idem::gc(c, crate::gucs::ledger_rotation_period_s());
        n += super::delayed::promote(c, crate::gucs::ledger_rotation_period_s());
        n as i32
    })
}

/// maint_retry_events(): moves due retries back into their queues.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn maint_retry_events() -> i32 {
    Spi::connect_mut(|c| maint::retry_events(c) as i32)
}

/// maint_operations(): the maintenance operations maint() runs, as PgQ
/// lists them for an external maintenance loop (which calls func_name with
/// func_arg, or with no argument when it is NULL): retry events, rotation
/// step 1 per queue, step 2 once. Every function named exists.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn maint_operations(
) -> TableIterator<'static, (name!(func_name, String), name!(func_arg, Option<String>))> {
    let queues: Vec<String> = Spi::connect_mut(|c| {
        let t = log::exec(
            c,
            "SELECT queue_name FROM pgque.queue ORDER BY queue_name",
            &[],
        );
        t.map(|r| log::col(&r, 1).unwrap()).collect()
    });
    let mut ops = vec![("pgque.maint_retry_events".to_string(), None)];
    for q in queues {
        ops.push(("pgque.maint_rotate_tables_step1".to_string(), Some(q)));
    }
    ops.push(("pgque.maint_rotate_tables_step2".to_string(), None));
    TableIterator::new(ops)
}

// ---- cooperative consumers ------------------------------------------------

// register_subconsumer / subscribe_subconsumer (4 arguments, convert_normal)
// are in pgq_compat.rs. The 3-argument C symbols stay exported without SQL:
// the frozen install scripts of 0.6.0 and older name them, and a database
// still at such a version runs them against this library until it is
// updated. They register as those versions did (a normal consumer becomes
// cooperative), except that a consumer with an open batch is not converted.

/// Pre-0.7.0 register_subconsumer(queue_name, consumer, subconsumer) (no SQL).
#[pg_extern(sql = false)]
fn register_subconsumer(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
) -> i32 {
    super::members::do_register(queue_name, consumer, subconsumer, Some(true))
}

/// Pre-0.7.0 subscribe_subconsumer(queue_name, consumer, subconsumer) (no SQL).
#[pg_extern(sql = false)]
fn subscribe_subconsumer(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
) -> i32 {
    super::members::do_register(queue_name, consumer, subconsumer, Some(true))
}

/// unregister_subconsumer(queue_name, consumer, subconsumer, batch_handling
/// default 0) → 1 removed, 0 when there is no such member (PgQue's contract):
/// with an open batch, 0 refuses (55000) and 1 routes the batch's events
/// through retry as PgQue does (each due again in 60 s, or dead-lettered
/// once its retries reached the queue's max_retries) and finishes the
/// batch. Touches pgque.subscription, retry_queue, dead_letter_store, batch_done.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn unregister_subconsumer(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    batch_handling: default!(Option<i32>, 0),
) -> i32 {
    unregister_member(queue_name, consumer, subconsumer, batch_handling)
}

/// touch_subconsumer(queue_name, consumer, subconsumer): marks it alive;
/// the number of members touched (1, or 0 when it is not registered: PgQue's
/// contract, it creates nothing).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn touch_subconsumer(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
) -> i32 {
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        let Some((_, m)) = find_group_member(c, &q, consumer, subconsumer) else {
            return 0;
        };
        log::exec(
            c,
            "UPDATE pgque.subscription SET sub_active = now() WHERE sub_id = $1",
            &[m.into()],
        );
        1
    })
}

fn coop_open(
    c: &mut SpiClient<'_>,
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    dead: Option<&Interval>,
    limit: i64,
) -> (log::Queue, Option<batch::Opened>) {
    if let Some(iv) = dead {
        crate::datum::check_nonnegative_interval(iv, "dead_interval");
    }
    let q = log::queue_by_name(c, queue_name);
    // PgQue's receive_coop / cooperative next_batch register the consumer
    // and the member on first use: a worker needs no setup call.
    let (parent, m) = match find_group_member(c, &q, consumer, subconsumer) {
        Some(found) => found,
        None => {
            super::members::register_member(c, &q, consumer, subconsumer, false);
            let parent = log::sub_by_name(c, &q, consumer);
            let m = member_by_name(c, &parent, member_name(subconsumer));
            (parent, m)
        }
    };
    let dead_ms = dead.map(interval_ms);
    let opened = batch::next_batch_coop(c, &q, parent.id, m, dead_ms, limit);
    (q, opened)
}

/// PgQ coop: next_batch(queue_name, consumer, subconsumer) → batch id or NULL.
#[pg_extern(name = "next_batch", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn next_batch_coop3(
    i_queue_name: Option<&str>,
    i_consumer_name: Option<&str>,
    i_subconsumer_name: Option<&str>,
) -> Option<i64> {
    next_batch_coop4(i_queue_name, i_consumer_name, i_subconsumer_name, None)
}

/// PgQ coop: next_batch(queue_name, consumer, subconsumer, dead_interval):
/// also takes over the open batch of a member idle longer than dead_interval.
#[pg_extern(name = "next_batch", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn next_batch_coop4(
    i_queue_name: Option<&str>,
    i_consumer_name: Option<&str>,
    i_subconsumer_name: Option<&str>,
    i_dead_interval: Option<Interval>,
) -> Option<i64> {
    let limit = crate::gucs::batch_max_events();
    Spi::connect_mut(|c| {
        let (_, o) = coop_open(
            c,
            i_queue_name,
            i_consumer_name,
            i_subconsumer_name,
            i_dead_interval.as_ref(),
            limit,
        );
        o.map(|o| o.batch.batch_id)
    })
}

/// receive_coop(queue_name, consumer, subconsumer, max_return default 100,
/// dead_interval default NULL) → setof pgque.message: like receive, but the
/// consumer's stream is shared by its members; no event goes to two members.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn receive_coop(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    max_return: default!(Option<i32>, 100),
    dead_interval: default!(Option<Interval>, "NULL"),
) -> Messages {
    Messages::new(coop_batch(
        queue_name,
        consumer,
        subconsumer,
        max_return,
        dead_interval,
    ))
}

/// receive_coop_with_headers(queue_name, consumer, subconsumer, max_return
/// default 100, dead_interval default NULL) → receive_coop's rows with the
/// events' trace-context headers as a last column (`headers jsonb`).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn receive_coop_with_headers(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    max_return: default!(Option<i32>, 100),
    dead_interval: default!(Option<Interval>, "NULL"),
) -> MessagesWithHeaders {
    MessagesWithHeaders(Messages::new(coop_batch(
        queue_name,
        consumer,
        subconsumer,
        max_return,
        dead_interval,
    )))
}

/// What receive_coop returns: the member's open or next batch and its events.
fn coop_batch(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    max_return: Option<i32>,
    dead_interval: Option<Interval>,
) -> Option<(i64, Vec<crate::log::events::Event>)> {
    let limit = max_return_arg(max_return);
    Spi::connect_mut(|c| {
        let (q, o) = coop_open(
            c,
            queue_name,
            consumer,
            subconsumer,
            dead_interval.as_ref(),
            limit,
        );
        deliver(c, &q, o)
    })
}

// ---- dead letters -----------------------------------------------------------

/// Puts dead letters back: each is redelivered to its consumer (retry_count
/// restarts at 0, headers kept) by the next maint_retry_events() and tick.
fn replay(c: &mut SpiClient<'_>, filter_id: Option<i64>, filter_queue: Option<i32>) -> i64 {
    crate::wake::recheck_at_commit();
    let sql = format!(
        "WITH d AS (DELETE FROM {} dl \
                     WHERE ($1::int8 IS NULL OR dl.dl_id = $1) AND ($2::int4 IS NULL OR dl.dl_queue = $2) \
                       AND EXISTS (SELECT 1 FROM pgque.subscription s WHERE s.sub_id = dl.dl_owner) \
                    RETURNING *), \
              i AS (INSERT INTO pgque.retry_queue (ev_retry_after, ev_queue, ev_owner, ev_id, ev_time, ev_retry, \
                                                   ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4{h}) \
                    SELECT now(), dl_queue, dl_owner, ev_id, ev_time, 0, ev_type, ev_data, \
                           ev_extra1, ev_extra2, ev_extra3, ev_extra4{h} FROM d \
                    ON CONFLICT (ev_owner, ev_id) DO NOTHING RETURNING 1) \
         SELECT count(*) FROM d",
        log::dead_letter_table(),
        h = log::headers_col()
    );
    let t = log::exec(c, &sql, &[filter_id.into(), filter_queue.into()]);
    log::col(&log::first_row(t).unwrap(), 1).unwrap()
}

/// dlq_replay(dead_letter_id) → the event id, redelivered to its consumer.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn dlq_replay(dead_letter_id: Option<i64>) -> i64 {
    let id = required(dead_letter_id, "dead_letter_id");
    Spi::connect_mut(|c| {
        let sql = format!(
            "SELECT ev_id, EXISTS (SELECT 1 FROM pgque.subscription s WHERE s.sub_id = dl_owner) \
               FROM {} WHERE dl_id = $1",
            log::dead_letter_table()
        );
        let t = log::exec(c, &sql, &[id.into()]);
        let Some(r) = log::first_row(t) else {
            raise(
                error::UNDEFINED_OBJECT,
                format!("dead letter {id} does not exist"),
            );
        };
        let ev_id: i64 = log::col(&r, 1).unwrap();
        let subscribed: bool = log::col(&r, 2).unwrap();
        if !subscribed {
            raise(
                error::WRONG_STATE,
                format!("the consumer of dead letter {id} is no longer subscribed"),
            );
        }
        replay(c, Some(id), None);
        ev_id
    })
}

/// dlq_replay_all(queue_name) → the number of dead letters put back.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn dlq_replay_all(queue_name: Option<&str>) -> i64 {
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        replay(c, None, Some(q.id))
    })
}

/// dlq_purge(queue_name, older_than default '30 days') → rows removed.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn dlq_purge(queue_name: Option<&str>, older_than: default!(Option<Interval>, "'30 days'")) -> i64 {
    let older = required(older_than, "older_than");
    if interval_ms(&older) < 0.0 {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "older_than must not be negative",
        );
    }
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        let sql = format!(
            "WITH d AS (DELETE FROM {} WHERE dl_queue = $1 AND dl_time <= now() - $2 RETURNING 1) \
             SELECT count(*) FROM d",
            log::dead_letter_table()
        );
        let t = log::exec(c, &sql, &[q.id.into(), older.into()]);
        log::col(&log::first_row(t).unwrap(), 1).unwrap()
    })
}
