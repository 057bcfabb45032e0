#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
//! Administration (queues, config, ticker, maintenance), cooperative
//! consumers and dead letters.
use super::srf::{Messages, MessagesWithHeaders};
use super::types::interval_ms;
use super::{deliver, max_return_arg};
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

/// A queue setting and the value to store, as validated pure data.
#[derive(Debug, PartialEq)]
pub enum Setting {
    MaxCount(i32),
    MaxLagMs(f64),
    IdleMs(f64),
    Paused(bool),
    RotationMs(f64),
    MaxRetries(i32),
}

pub fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "t" | "true" | "on" | "yes" | "y" | "1" => Some(true),
        "f" | "false" | "off" | "no" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// Parses a duration: `90`, `90s`, `1.5 min`, `2 hours 30 minutes`,
/// `00:01:30`, `500ms`. A bare number is seconds. Negative is refused.
pub fn parse_duration_ms(v: &str) -> Option<f64> {
    let v = v.trim().to_ascii_lowercase();
    if v.is_empty() {
        return None;
    }
    if v.contains(':') {
        let parts: Vec<&str> = v.split(':').collect();
        if parts.len() != 3 {
            return None;
        }
        let h: f64 = parts[0].parse().ok()?;
        let m: f64 = parts[1].parse().ok()?;
        let s: f64 = parts[2].parse().ok()?;
        if h < 0.0 || !(0.0..60.0).contains(&m) || !(0.0..60.0).contains(&s) {
            return None;
        }
        return Some((h * 3600.0 + m * 60.0 + s) * 1000.0);
    }
    // Tokens: numbers and unit words, possibly glued ("90s").
    let mut total = 0.0;
    let mut any = false;
    let mut rest = v.as_str();
    while !rest.trim_start().is_empty() {
        rest = rest.trim_start();
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = rest[num_len..].trim_start();
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let mult = match unit {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1000.0,
            "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => 1.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000.0,
            "d" | "day" | "days" => 86_400_000.0,
            _ => return None,
        };
        if unit.is_empty() && !rest.trim().is_empty() {
            return None;
        }
        total += n * mult;
        any = true;
    }
    any.then_some(total)
}

/// Longest queue duration setting: 100 years (365-day years).
pub const MAX_DURATION_MS: f64 = 100.0 * 365.0 * 86_400_000.0;

/// Validates (param, value); value None means "reset to the default".
pub fn parse_setting(param: &str, value: Option<&str>) -> Result<Setting, String> {
    let p = param.trim().to_ascii_lowercase();
    let p = p.strip_prefix("queue_").unwrap_or(&p);
    let dur = |d: &str| {
        let v = value.unwrap_or(d);
        // Past MAX_DURATION_MS the value no longer fits an interval column.
        parse_duration_ms(v)
            .filter(|ms| *ms <= MAX_DURATION_MS)
            .ok_or_else(|| {
                format!("{p} must be a duration like '3 seconds' (at most 100 years), not {v:?}")
            })
    };
    match p {
        "ticker_max_count" => {
            let v = value.unwrap_or("500");
            match v.trim().parse::<i32>() {
                Ok(n) if n >= 1 => Ok(Setting::MaxCount(n)),
                _ => Err(format!(
                    "ticker_max_count must be an integer >= 1, not {v:?}"
                )),
            }
        }
        "ticker_max_lag" => dur("3 seconds").map(Setting::MaxLagMs),
        "ticker_idle_period" => dur("1 minute").map(Setting::IdleMs),
        "rotation_period" => dur("2 hours").map(Setting::RotationMs),
        "ticker_paused" => {
            let v = value.unwrap_or("false");
            parse_bool(v)
                .map(Setting::Paused)
                .ok_or_else(|| format!("ticker_paused must be a boolean, not {v:?}"))
        }
        "max_retries" => {
            let v = value.unwrap_or("5");
            match v.trim().parse::<i32>() {
                Ok(n) if n >= 0 => Ok(Setting::MaxRetries(n)),
                _ => Err(format!("max_retries must be an integer >= 0, not {v:?}")),
            }
        }
        _ => Err(format!(
            "unknown queue setting {param:?}; known: ticker_max_count, ticker_max_lag, \
             ticker_idle_period, ticker_paused, rotation_period, max_retries"
        )),
    }
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

/// Stores one validated queue setting (UPDATE of the queue's row).
pub(crate) fn apply_setting(c: &mut SpiClient<'_>, q: &log::Queue, setting: Setting) {
    let ms = |v: f64| v;
    match setting {
        Setting::MaxCount(n) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_ticker_max_count = $2 WHERE queue_id = $1",
            &[q.id.into(), n.into()],
        ),
        Setting::MaxRetries(n) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_max_retries = $2 WHERE queue_id = $1",
            &[q.id.into(), n.into()],
        ),
        Setting::Paused(b) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_ticker_paused = $2 WHERE queue_id = $1",
            &[q.id.into(), b.into()],
        ),
        Setting::MaxLagMs(v) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_ticker_max_lag = $2 * interval '1 millisecond' WHERE queue_id = $1",
            &[q.id.into(), ms(v).into()],
        ),
        Setting::IdleMs(v) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_ticker_idle_period = $2 * interval '1 millisecond' WHERE queue_id = $1",
            &[q.id.into(), ms(v).into()],
        ),
        Setting::RotationMs(v) => log::exec(
            c,
            "UPDATE pgque.queue SET queue_rotation_period = $2 * interval '1 millisecond' WHERE queue_id = $1",
            &[q.id.into(), ms(v).into()],
        ),
    };
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

fn member_name(sub: Option<&str>) -> &str {
    error::valid_name(sub, "subconsumer", error::MAX_CONSUMER_NAME)
}

fn find_member(c: &mut SpiClient<'_>, parent: i32, name: &str) -> Option<i32> {
    let t = log::exec(
        c,
        "SELECT sub_id FROM pgque.subscription WHERE sub_parent = $1 AND sub_consumer = $2",
        &[parent.into(), name.into()],
    );
    log::first_row(t).map(|r| log::col(&r, 1).unwrap())
}

fn member_by_name(c: &mut SpiClient<'_>, parent: &log::Sub, name: &str) -> i32 {
    find_member(c, parent.id, name).unwrap_or_else(|| {
        raise(
            error::UNDEFINED_OBJECT,
            format!(
                "consumer not found: subconsumer {name:?} of consumer {:?}",
                parent.name
            ),
        )
    })
}

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
    super::pgq_compat::do_register(queue_name, consumer, subconsumer, Some(true))
}

/// Pre-0.7.0 subscribe_subconsumer(queue_name, consumer, subconsumer) (no SQL).
#[pg_extern(sql = false)]
fn subscribe_subconsumer(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
) -> i32 {
    super::pgq_compat::do_register(queue_name, consumer, subconsumer, Some(true))
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

/// unregister_subconsumer's body (also unsubscribe_subconsumer's).
pub(crate) fn unregister_member(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    batch_handling: Option<i32>,
) -> i32 {
    let handling = required(batch_handling, "batch_handling");
    if !(0..=1).contains(&handling) {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "batch_handling must be 0 or 1",
        );
    }
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        let Some((parent, m)) = find_group_member(c, &q, consumer, subconsumer) else {
            return 0;
        };
        batch::lock_sub(c, parent.id);
        if let Some(b) = batch::member_open_batch(c, parent.id, m) {
            if handling == 0 {
                raise(
                    error::WRONG_STATE,
                    "the subconsumer has an open batch; finish it or pass batch_handling = 1",
                );
            }
            // PgQue's batch_handling = 1: event_retry(batch, event, 60) for
            // each event, event_dead past max_retries; then the batch is done.
            let after = super::consume::seconds_interval(c, 60);
            for ev in batch::batch_events(c, &q, &b, true) {
                super::consume::retry_event(
                    c,
                    &q,
                    &b,
                    &parent.name,
                    &ev,
                    &after,
                    Some("subconsumer unregistered"),
                    true,
                );
            }
            batch::mark_done(c, b.batch_id, false);
        }
        log::exec(
            c,
            "DELETE FROM pgque.subscription WHERE sub_id = $1",
            &[m.into()],
        );
        1
    })
}

/// The consumer and member named, when both exist (names validated).
fn find_group_member(
    c: &mut SpiClient<'_>,
    q: &log::Queue,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
) -> Option<(log::Sub, i32)> {
    let cname = log::valid_consumer(consumer, "consumer");
    let mname = member_name(subconsumer);
    let parent = log::find_sub(c, q, cname)?;
    let m = find_member(c, parent.id, mname)?;
    Some((parent, m))
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
        super::types::check_nonnegative_interval(iv, "dead_interval");
    }
    let q = log::queue_by_name(c, queue_name);
    // PgQue's receive_coop / cooperative next_batch register the consumer
    // and the member on first use: a worker needs no setup call.
    let (parent, m) = match find_group_member(c, &q, consumer, subconsumer) {
        Some(found) => found,
        None => {
            super::pgq_compat::register_member(c, &q, consumer, subconsumer, false);
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
) -> Option<(i64, Vec<batch::Event>)> {
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
    crate::worker::wake::recheck_at_commit();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("3 seconds"), Some(3000.0));
        assert_eq!(parse_duration_ms("90"), Some(90_000.0));
        assert_eq!(parse_duration_ms("500ms"), Some(500.0));
        assert_eq!(parse_duration_ms("1 minute"), Some(60_000.0));
        assert_eq!(parse_duration_ms("2 hours 30 minutes"), Some(9_000_000.0));
        assert_eq!(parse_duration_ms("00:01:30"), Some(90_000.0));
        assert_eq!(parse_duration_ms("0"), Some(0.0));
        assert_eq!(parse_duration_ms("-1 s"), None);
        assert_eq!(parse_duration_ms("soon"), None);
        assert_eq!(parse_duration_ms(""), None);
        assert_eq!(parse_duration_ms("5 fortnights"), None);
    }

    #[test]
    fn settings() {
        assert_eq!(
            parse_setting("ticker_max_count", Some("10")),
            Ok(Setting::MaxCount(10))
        );
        assert_eq!(
            parse_setting("queue_ticker_max_count", None),
            Ok(Setting::MaxCount(500))
        );
        assert!(parse_setting("ticker_max_count", Some("0")).is_err());
        assert!(parse_setting("ticker_max_count", Some("x")).is_err());
        assert_eq!(
            parse_setting("ticker_paused", Some("on")),
            Ok(Setting::Paused(true))
        );
        assert_eq!(
            parse_setting("ticker_paused", None),
            Ok(Setting::Paused(false))
        );
        assert_eq!(
            parse_setting("max_retries", None),
            Ok(Setting::MaxRetries(5))
        );
        assert!(parse_setting("max_retries", Some("-1")).is_err());
        assert_eq!(
            parse_setting("rotation_period", None),
            Ok(Setting::RotationMs(7_200_000.0))
        );
        assert_eq!(
            parse_setting("ticker_max_lag", None),
            Ok(Setting::MaxLagMs(3000.0))
        );
        assert_eq!(
            parse_setting("ticker_idle_period", None),
            Ok(Setting::IdleMs(60_000.0))
        );
        assert!(parse_setting("bogus", Some("1")).is_err());
        assert!(parse_setting("rotation_period", Some("36500 days")).is_ok());
        assert!(parse_setting("rotation_period", Some("99999999999999999999 days")).is_err());
    }
}
