#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
//! The rest of PgQue's documented SQL API (DESIGN.md section 11) that the
//! other API modules do not cover: event_dead, insert_event_bulk, the
//! 4-argument cooperative registration with `convert_normal`,
//! unsubscribe_subconsumer, the cooperative next_batch_custom, the
//! 3-argument unsubscribe_slot, create_queue with options, pause/resume,
//! set_tick_period_ms, ticker_loop, uninstall, maint_idem(queue),
//! maint_deliver_delayed and the rotation steps maint_rotate_tables_step1/2.
//!
//! Thin wrappers: validation, then the engine (`crate::log`) or the other API
//! modules. Errors go through `crate::error` like everywhere else.
use super::members::{do_register, register_member};
use super::settings::{apply_setting, parse_setting, Setting};
use crate::datum::{interval_ms, JsonbText, TextArray};
use crate::error::{self, raise, required};
use crate::log::{self, batch, slots};
use pgrx::callconv::{Arg, ArgAbi};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::{impl_sql_translatable, pg_sys};

/// An `xid8` argument (PgQ's full transaction id), as its 64-bit value.
#[derive(Debug, Clone, Copy)]
pub struct Xid8(pub u64);

impl FromDatum for Xid8 {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Xid8> {
        (!is_null).then(|| Xid8(datum.value() as u64))
    }
}

unsafe impl<'fcx> ArgAbi<'fcx> for Xid8 {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        unsafe { arg.unbox_arg_using_from_datum() }.expect("xid8 argument must not be NULL")
    }
    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
        unsafe { arg.unbox_arg_using_from_datum::<Xid8>() }.into()
    }
}

impl_sql_translatable!(Xid8, arg_only = "xid8");

// ---- dead letters -------------------------------------------------------------

/// event_dead(batch_id, event_id, reason, ev_time, ev_txid, ev_retry, ev_type,
/// ev_data, ev_extra1..4 default NULL) → 1 when the event was dead-lettered,
/// 0 when that consumer already has it in the dead-letter queue (idempotent
/// per (queue, consumer, event)). The batch must be open (42704 / 55000); the
/// row is written with the caller's fields, as PgQue's. ev_txid is accepted
/// for PgQue's signature and not stored (the row's ev_txid stays NULL); the
/// "already there?" probe is one lookup in dead_letter_owner_ev_idx.
/// Touches pgque.dead_letter_store; serialized per consumer on its subscription row.
#[allow(clippy::too_many_arguments)]
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn event_dead(
    batch_id: Option<i64>,
    event_id: Option<i64>,
    reason: Option<&str>,
    ev_time: Option<TimestampWithTimeZone>,
    ev_txid: Option<Xid8>,
    ev_retry: Option<i32>,
    ev_type: Option<&str>,
    ev_data: Option<&str>,
    ev_extra1: default!(Option<&str>, "NULL"),
    ev_extra2: default!(Option<&str>, "NULL"),
    ev_extra3: default!(Option<&str>, "NULL"),
    ev_extra4: default!(Option<&str>, "NULL"),
) -> i32 {
    let event_id = required(event_id, "event_id");
    let ev_time = required(ev_time, "ev_time");
    if ev_time.is_infinity() || ev_time.is_neg_infinity() {
        raise(error::INVALID_PARAMETER_VALUE, "ev_time must be finite");
    }
    let _ = ev_txid;
    if ev_retry.is_some_and(|r| r < 0) {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "ev_retry must not be negative",
        );
    }
    Spi::connect_mut(|c| {
        let (b, q, consumer) = batch::plain_open_batch(c, batch_id);
        batch::lock_sub(c, b.sub_id);
        let t = log::exec(
            c,
            "INSERT INTO pgque.dead_letter_store (dl_queue, dl_consumer, dl_owner, dl_reason, ev_id, ev_time, ev_retry, \
                                            ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 \
              WHERE NOT EXISTS (SELECT 1 FROM pgque.dead_letter_store d WHERE d.dl_owner = $3 AND d.ev_id = $5) \
             RETURNING 1",
            &[
                q.id.into(),
                consumer.as_str().into(),
                b.sub_id.into(),
                reason.into(),
                event_id.into(),
                ev_time.into(),
                ev_retry.into(),
                ev_type.into(),
                ev_data.into(),
                ev_extra1.into(),
                ev_extra2.into(),
                ev_extra3.into(),
                ev_extra4.into(),
            ],
        );
        t.len() as i32
    })
}

// ---- publishing -----------------------------------------------------------------

/// insert_event_bulk(queue_name, ev_type, ev_data_list text[]) → the event
/// ids, aligned with the input (`{}` for an empty array). PgQue's internal
/// primitive behind send_batch: granted to no role, so only the owner or a
/// superuser may call it. Appends to the queue's current event table.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn insert_event_bulk(
    queue_name: Option<&str>,
    ev_type: Option<&str>,
    ev_data_list: Option<TextArray>,
) -> Vec<i64> {
    let ev_type = required(ev_type, "ev_type");
    let list = required(ev_data_list, "ev_data_list").0;
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        log::insert_events(c, &q, ev_type, &list, None, None)
    })
}

// ---- cooperative consumers ----------------------------------------------------

/// register_subconsumer(queue_name, consumer, subconsumer, convert_normal
/// default false) → 1 new / 0 existed. Touches pgque.subscription.
#[pg_extern(name = "register_subconsumer", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn register_subconsumer4(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    convert_normal: default!(Option<bool>, false),
) -> i32 {
    do_register(queue_name, consumer, subconsumer, convert_normal)
}

/// subscribe_subconsumer: PgQue's alias of register_subconsumer.
#[pg_extern(name = "subscribe_subconsumer", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn subscribe_subconsumer4(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    convert_normal: default!(Option<bool>, false),
) -> i32 {
    do_register(queue_name, consumer, subconsumer, convert_normal)
}

/// unsubscribe_subconsumer(queue_name, consumer, subconsumer, batch_handling
/// default 0): PgQue's alias of unregister_subconsumer (same results and
/// errors; batch_handling = 1 retries the open batch's events).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn unsubscribe_subconsumer(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    batch_handling: default!(Option<i32>, 0),
) -> i32 {
    super::members::unregister_member(queue_name, consumer, subconsumer, batch_handling)
}

/// Whether next_batch_custom's conditions let a new batch open: the lag of
/// the queue's last tick, and the events / time between the consumer's
/// frontier and that tick (two index probes on pgque.tick).
fn conditions_hold(
    c: &mut SpiClient<'_>,
    q: &log::Queue,
    sub_id: i32,
    min_lag: Option<&Interval>,
    min_count: Option<i32>,
    min_interval: Option<&Interval>,
) -> bool {
    if min_lag.is_none() && min_count.is_none() && min_interval.is_none() {
        return true;
    }
    let from = match batch::latest_batch(c, sub_id) {
        Some(b) if b.ceiling.is_none() => b.tick,
        Some(b) => b.prev_tick,
        None => {
            let t = log::exec(
                c,
                "SELECT sub_start_tick FROM pgque.subscription WHERE sub_id = $1",
                &[sub_id.into()],
            );
            log::col(&log::first_row(t).unwrap(), 1).unwrap()
        }
    };
    let t = log::exec(
        c,
        "SELECT (extract(epoch FROM now() - l.tick_time) * 1000)::float8, \
                l.tick_event_seq - p.tick_event_seq, \
                (extract(epoch FROM l.tick_time - p.tick_time) * 1000)::float8 \
           FROM (SELECT * FROM pgque.tick WHERE tick_queue = $1 AND tick_id = $2 LIMIT 1) p, \
                (SELECT * FROM pgque.tick WHERE tick_queue = $1 ORDER BY tick_id DESC LIMIT 1) l",
        &[q.id.into(), from.into()],
    );
    let Some(r) = log::first_row(t) else {
        return true;
    };
    let lag: f64 = log::col(&r, 1).unwrap_or(0.0);
    let count: i64 = log::col(&r, 2).unwrap_or(0);
    let span: f64 = log::col(&r, 3).unwrap_or(0.0);
    !(min_lag.is_some_and(|m| lag < interval_ms(m))
        || min_count.is_some_and(|m| count < m as i64)
        || min_interval.is_some_and(|m| span < interval_ms(m)))
}

/// Cooperative next_batch_custom(queue_name, consumer, subconsumer, min_lag,
/// min_count, min_interval, dead_interval default NULL) → (batch_id,
/// prev_tick_id, next_tick_id), all NULL when there is nothing to read.
/// Registers the member when it is new (as PgQue does). The member's open
/// batch is returned as it is; a dead member's batch is taken over (with
/// dead_interval); a new range opens only once the conditions hold.
#[allow(clippy::too_many_arguments)]
#[pg_extern(name = "next_batch_custom", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn next_batch_custom_coop(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    min_lag: Option<Interval>,
    min_count: Option<i32>,
    min_interval: Option<Interval>,
    dead_interval: default!(Option<Interval>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(batch_id, Option<i64>),
        name!(prev_tick_id, Option<i64>),
        name!(next_tick_id, Option<i64>),
    ),
> {
    for (iv, what) in [
        (&min_lag, "min_lag"),
        (&min_interval, "min_interval"),
        (&dead_interval, "dead_interval"),
    ] {
        if let Some(iv) = iv {
            crate::datum::check_nonnegative_interval(iv, what);
        }
    }
    if min_count.is_some_and(|n| n < 0) {
        raise(
            error::INVALID_PARAMETER_VALUE,
            "min_count must not be negative",
        );
    }
    let limit = crate::gucs::batch_max_events();
    let row = Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        let (_, parent, member) = register_member(c, &q, consumer, subconsumer, false);
        let open_new = conditions_hold(
            c,
            &q,
            parent.id,
            min_lag.as_ref(),
            min_count,
            min_interval.as_ref(),
        );
        let dead_ms = dead_interval.as_ref().map(interval_ms);
        batch::next_batch_coop_gated(c, &q, parent.id, member, dead_ms, limit, open_new).map(|o| {
            (
                Some(o.batch.batch_id),
                Some(o.batch.prev_tick),
                Some(o.batch.tick),
            )
        })
    });
    TableIterator::once(row.unwrap_or((None, None, None)))
}

// ---- partition keys -----------------------------------------------------------

/// unsubscribe_slot(queue_name, consumer, slot): PgQue's 3-argument form;
/// N is the consumer's persisted slot count. Removes that slot's
/// subscription and retries (the consumer is forgotten with its last slot).
#[pg_extern(name = "unsubscribe_slot", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn unsubscribe_slot3(queue_name: Option<&str>, consumer: Option<&str>, slot: Option<i32>) {
    let k = required(slot, "slot");
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        let consumer = log::valid_consumer(consumer, "consumer");
        let n = slots::require_n(c, &q, consumer);
        if !(0..n).contains(&k) {
            raise(
                error::OUT_OF_RANGE,
                format!("slot must be between 0 and {} (n = {n}), not {k}", n - 1),
            );
        }
        slots::unsubscribe_slots(c, &q, consumer, k, k);
        slots::forget_if_empty(c, &q, consumer);
    })
}

// ---- administration -------------------------------------------------------------

/// One option of create_queue: its key, jsonb_typeof of its value and the
/// value as text (`value #>> '{}'`, NULL for a JSON null).
type OptionKv = (String, String, Option<String>);

/// The settings of create_queue's options, validated before anything is
/// written: keys are set_queue_config's parameters, values strings, numbers,
/// booleans or null (null = the default).
fn parse_options(options: &[OptionKv]) -> Result<Vec<Setting>, String> {
    let mut out = Vec::with_capacity(options.len());
    for (k, kind, v) in options {
        let text = match kind.as_str() {
            "null" => None,
            "string" | "number" | "boolean" => v.clone(),
            other => return Err(format!("option {k:?} must be a scalar, not a JSON {other}")),
        };
        out.push(parse_setting(k, text.as_deref())?);
    }
    Ok(out)
}

/// create_queue(queue_name, options jsonb) → 1 created / 0 existed; then sets
/// each option as set_queue_config does (keys max_retries, rotation_period,
/// ticker_max_count, ticker_max_lag, ticker_idle_period, ticker_paused; an
/// unknown key, a bad value or options that are not a JSON object are 22023,
/// and nothing is created).
#[pg_extern(name = "create_queue", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn create_queue_options(queue_name: Option<&str>, options: Option<JsonbText>) -> i32 {
    let name = error::valid_name(queue_name, "queue_name", error::MAX_QUEUE_NAME);
    let options = required(options, "options").0;
    Spi::connect_mut(|c| {
        let t = log::exec(
            c,
            "SELECT jsonb_typeof($1::jsonb)",
            &[options.as_str().into()],
        );
        let kind: String = log::col(&log::first_row(t).unwrap(), 1).unwrap();
        if kind != "object" {
            raise(
                error::INVALID_PARAMETER_VALUE,
                format!("options must be a JSON object, not a JSON {kind}"),
            );
        }
        let t = log::exec(
            c,
            "SELECT key, jsonb_typeof(value), value #>> '{}' FROM jsonb_each($1::jsonb)",
            &[options.as_str().into()],
        );
        let kvs: Vec<OptionKv> = t
            .map(|r| {
                (
                    log::col(&r, 1).unwrap(),
                    log::col(&r, 2).unwrap(),
                    log::col(&r, 3),
                )
            })
            .collect();
        let settings =
            parse_options(&kvs).unwrap_or_else(|m| raise(error::INVALID_PARAMETER_VALUE, m));
        let created = log::create_queue(c, name) as i32;
        let q = log::queue_by_name(c, Some(name));
        for s in settings {
            apply_setting(c, &q, s);
        }
        created
    })
}

fn set_paused(queue_name: Option<&str>, paused: bool) {
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        apply_setting(c, &q, Setting::Paused(paused));
    })
}

/// pause_queue(queue_name): set_queue_config(queue, 'ticker_paused', 'true').
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn pause_queue(queue_name: Option<&str>) {
    set_paused(queue_name, true)
}

/// resume_queue(queue_name): set_queue_config(queue, 'ticker_paused', 'false').
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn resume_queue(queue_name: Option<&str>) {
    set_paused(queue_name, false)
}

/// Whether `ms` is a tick period set_tick_period_ms accepts: a divisor of
/// 1000 in 1..=1000 (so ticks line up with seconds, as PgQue requires).
pub fn valid_tick_period(ms: i32) -> bool {
    (1..=1000).contains(&ms) && 1000 % ms == 0
}

/// set_tick_period_ms(ms) → ms: the worker's tick period for this database
/// (persisted in pgque.worker_config; it overrides pgque.tick_period_ms here
/// and applies within a second). ticker_loop() uses it too. 22023 for a value
/// that is not a divisor of 1000 in 1..1000, 22004 for NULL.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn set_tick_period_ms(ms: Option<i32>) -> i32 {
    let ms = required(ms, "ms");
    if !valid_tick_period(ms) {
        raise(
            error::INVALID_PARAMETER_VALUE,
            format!("ms must be a divisor of 1000 between 1 and 1000, not {ms}"),
        );
    }
    Spi::connect_mut(|c| {
        log::exec(
            c,
            "UPDATE pgque.worker_config SET tick_period_ms = $1, changed_at = now()",
            &[ms.into()],
        );
    });
    ms
}

/// ticker_loop_tick() → seconds ticker_loop() sleeps before its next round:
/// ticks every queue that needs it (as ticker()) and returns the database's
/// tick period (set_tick_period_ms, else pgque.tick_period_ms) in seconds.
/// ticker_loop()'s whole work is this call: a procedure that commits may
/// carry no SET clause, so its body must not evaluate anything that resolves
/// through the caller's search_path (pg_cron runs it as a superuser), and
/// as SECURITY DEFINER it reads worker_config for a pgque_admin that may not.
/// Touches the ticks of the queues it ticks.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn ticker_loop_tick() -> f64 {
    Spi::connect_mut(|c| {
        crate::log::tick::run_ticker(c, None, false);
        let ms = log::exec(c, "SELECT w.tick_period_ms FROM pgque.worker_config w", &[])
            .first()
            .get_one::<i32>()
            .ok()
            .flatten()
            .filter(|ms| valid_tick_period(*ms));
        let period = ms.map_or(crate::gucs::tick_period(), |ms| {
            std::time::Duration::from_millis(ms as u64)
        });
        period.as_secs_f64()
    })
}

extension_sql!(
    r#"
-- ticker_loop(): PgQue's sub-second tick driver, for setups that drive the
-- ticker themselves (pg_cron, or no shared_preload_libraries). Ticks every
-- queue that needs it, commits, sleeps the database's tick period
-- (set_tick_period_ms, else pgque.tick_period_ms), until cancelled. With the
-- background worker running it is not needed: the worker does exactly this.
-- PL/pgSQL because only a procedure may COMMIT between iterations, and a
-- procedure that commits may carry no SET clause: so the body evaluates
-- nothing but schema-qualified calls (no operator, no cast, no unqualified
-- type), and the work is in ticker_loop_tick(), which pins its own path.
CREATE PROCEDURE pgque.ticker_loop()
LANGUAGE plpgsql
AS $body$
DECLARE
    period_s pg_catalog.float8;
BEGIN
    LOOP
        period_s := pgque.ticker_loop_tick();
        COMMIT;
        PERFORM pg_catalog.pg_sleep(period_s);
    END LOOP;
END
$body$;
"#,
    name = "ticker_loop",
    requires = ["bootstrap", ticker_loop_tick]
);

/// uninstall(): removes pgque from this database, as PgQue's drops its
/// schema: DROP EXTENSION pgque CASCADE, then DROP SCHEMA pgque CASCADE
/// (every queue, event table and job with it; the roles stay). Granted to no role: only
/// the extension's owner or a superuser can run it. Runs as the caller (not
/// SECURITY DEFINER), so DROP EXTENSION checks the caller's own rights.
#[pg_extern]
#[search_path(pg_catalog, pgque, pg_temp)]
fn uninstall() {
    Spi::run("DROP EXTENSION pgque CASCADE; DROP SCHEMA IF EXISTS pgque CASCADE")
        .unwrap_or_else(|e| raise(error::WRONG_STATE, format!("uninstall failed: {e}")));
}

/// maint_idem(queue_name) → expired idempotency claims removed. pgque keeps
/// one ledger for all queues, rotated as a whole, so this checks the queue
/// exists (42704) and runs the ledger's collection (maint_idem()).
#[pg_extern(name = "maint_idem", security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn maint_idem_queue(queue_name: Option<&str>) -> i64 {
    Spi::connect_mut(|c| {
        log::queue_by_name(c, queue_name);
        super::idem::gc(c, crate::gucs::ledger_rotation_period_s())
    })
}

/// maint_rotate_tables_step1(queue_name) → 0 (PgQ's contract: maintenance
/// functions return 1 only to be called again at once). Event-table rotation
/// step 1 for one queue: when its rotation period is over and every consumer
/// is past the last switch, TRUNCATEs the oldest event table and switches
/// inserts to it (maint() does this for every queue). 42704 for an unknown
/// queue. Touches pgque.queue and the queue's event tables.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn maint_rotate_tables_step1(queue_name: Option<&str>) -> i32 {
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        crate::log::maint::rotate_step1_of(c, Some(q.id));
    });
    0
}

/// maint_rotate_tables_step2() → 0 (PgQ's contract, as step 1). Rotation
/// step 2 of every queue whose table switch is pending: records the first
/// transaction after the switch (`queue_switch_step2`), which step 1 of the
/// next rotation waits for. Must run in a later transaction than the step 1
/// that switched (in the same one it does nothing for that queue, as PgQ
/// asks); maint() runs both, and PgQue's maintenance loops call this on its
/// own. Touches pgque.queue (one UPDATE per switched queue, none otherwise).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn maint_rotate_tables_step2() -> i32 {
    Spi::connect_mut(|c| {
        crate::log::maint::rotate_step2(c);
    });
    0
}

/// maint_deliver_delayed() → delayed events promoted: PgQue's name of
/// maint_delayed() (the worker runs it every pgque.delayed_period_ms).
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn maint_deliver_delayed() -> i64 {
    Spi::connect_mut(|c| super::delayed::promote(c, crate::gucs::ledger_rotation_period_s()))
}

#[cfg(test)]
mod pure_tests {
    use super::*;

    #[test]
    fn tick_periods_are_divisors_of_a_second() {
        for ok in [
            1, 2, 4, 5, 8, 10, 20, 25, 40, 50, 100, 125, 200, 250, 500, 1000,
        ] {
            assert!(valid_tick_period(ok), "{ok}");
        }
        for bad in [0, -1, 3, 7, 30, 300, 999, 1001, 2000] {
            assert!(!valid_tick_period(bad), "{bad}");
        }
    }

    #[test]
    fn options_parse_as_settings_and_refuse_unknown_keys() {
        let kv =
            |k: &str, t: &str, v: Option<&str>| (k.to_string(), t.to_string(), v.map(String::from));
        let s = parse_options(&[
            kv("max_retries", "number", Some("3")),
            kv("ticker_paused", "boolean", Some("true")),
            kv("rotation_period", "string", Some("1 hour")),
            kv("ticker_max_lag", "null", None),
        ])
        .unwrap();
        assert_eq!(
            s,
            vec![
                Setting::MaxRetries(3),
                Setting::Paused(true),
                Setting::RotationMs(3_600_000.0),
                Setting::MaxLagMs(3000.0)
            ]
        );
        assert!(parse_options(&[kv("bogus", "number", Some("1"))]).is_err());
        assert!(parse_options(&[kv("max_retries", "number", Some("-1"))]).is_err());
        assert!(parse_options(&[kv("max_retries", "array", Some("[1]"))]).is_err());
        assert!(parse_options(&[]).unwrap().is_empty());
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn i64_of(sql: &str) -> Option<i64> {
        Spi::get_one::<i64>(sql).unwrap()
    }
    fn i32_of(sql: &str) -> Option<i32> {
        Spi::get_one::<i32>(sql).unwrap()
    }
    fn text_of(sql: &str) -> Option<String> {
        Spi::get_one::<String>(sql).unwrap()
    }

    /// "ok", or the SQLSTATE `sql` raised (in a subtransaction).
    fn state(sql: &str) -> String {
        Spi::run(
            "CREATE OR REPLACE FUNCTION pg_temp.state_of(q text) RETURNS text LANGUAGE plpgsql AS \
             $f$ BEGIN EXECUTE q; RETURN 'ok'; EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $f$",
        )
        .unwrap();
        Spi::get_one_with_args::<String>("SELECT pg_temp.state_of($1)", &[sql.into()])
            .unwrap()
            .unwrap()
    }

    #[pg_test]
    fn create_queue_with_options_sets_them_and_validates_first() {
        assert_eq!(
            i32_of(
                "SELECT pgque.create_queue('oq', '{\"max_retries\": 2, \"ticker_max_count\": \"10\", \
                 \"ticker_max_lag\": \"250ms\", \"ticker_idle_period\": 30, \"rotation_period\": \"1 hour\", \
                 \"ticker_paused\": true}'::jsonb)"
            ),
            Some(1)
        );
        assert_eq!(
            text_of(
                "SELECT concat_ws(',', queue_max_retries, queue_ticker_max_count, queue_ticker_max_lag, \
                        queue_ticker_idle_period, queue_rotation_period, queue_ticker_paused) \
                   FROM pgque.queue WHERE queue_name = 'oq'"
            )
            .as_deref(),
            Some("2,10,00:00:00.25,00:00:30,01:00:00,t")
        );
        // An existing queue: 0, and the options still apply (null = default).
        assert_eq!(
            i32_of("SELECT pgque.create_queue('oq', '{\"max_retries\": null, \"ticker_paused\": false}')"),
            Some(0)
        );
        assert_eq!(
            text_of("SELECT concat_ws(',', queue_max_retries, queue_ticker_paused) FROM pgque.queue WHERE queue_name = 'oq'")
                .as_deref(),
            Some("5,f")
        );
        // A bad option creates nothing.
        assert_eq!(
            state("SELECT pgque.create_queue('bad', '{\"max_retries\": 1, \"nope\": 1}')"),
            "22023"
        );
        assert_eq!(
            i64_of("SELECT count(*) FROM pgque.queue WHERE queue_name = 'bad'"),
            Some(0)
        );
        assert_eq!(state("SELECT pgque.create_queue('bad', '\"x\"')"), "22023");
    }

    #[pg_test]
    fn pause_and_resume_flip_ticker_paused() {
        Spi::run("SELECT pgque.create_queue('pq')").unwrap();
        Spi::run("SELECT pgque.pause_queue('pq')").unwrap();
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT queue_ticker_paused FROM pgque.queue WHERE queue_name = 'pq'"
            )
            .unwrap(),
            Some(true)
        );
        // Paused: ticker() skips it even with a new event.
        Spi::run("SELECT pgque.send('pq', 'x'::text)").unwrap();
        assert_eq!(i64_of("SELECT pgque.ticker('pq')"), None);
        Spi::run("SELECT pgque.resume_queue('pq')").unwrap();
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT queue_ticker_paused FROM pgque.queue WHERE queue_name = 'pq'"
            )
            .unwrap(),
            Some(false)
        );
        assert_eq!(state("SELECT pgque.pause_queue('nope')"), "42704");
    }

    #[pg_test]
    fn set_tick_period_ms_persists_divisors_of_a_second() {
        assert_eq!(i32_of("SELECT pgque.set_tick_period_ms(50)"), Some(50));
        assert_eq!(
            i32_of("SELECT tick_period_ms FROM pgque.worker_config"),
            Some(50)
        );
        assert_eq!(state("SELECT pgque.set_tick_period_ms(30)"), "22023");
        assert_eq!(
            i32_of("SELECT tick_period_ms FROM pgque.worker_config"),
            Some(50)
        );
        assert_eq!(i32_of("SELECT pgque.set_tick_period_ms(1000)"), Some(1000));
    }

    #[pg_test]
    fn register_subconsumer_converts_a_normal_consumer_only_when_asked() {
        Spi::run("SELECT pgque.create_queue('cq'); SELECT pgque.subscribe('cq', 'plain')").unwrap();
        assert_eq!(
            state("SELECT pgque.register_subconsumer('cq', 'plain', 'w1')"),
            "55000"
        );
        assert_eq!(
            state("SELECT pgque.subscribe_subconsumer('cq', 'plain', 'w1', false)"),
            "55000"
        );
        // An open batch blocks the conversion.
        Spi::run("SELECT pgque.force_tick('cq')").unwrap();
        let b = i64_of("SELECT pgque.next_batch('cq', 'plain')").expect("a batch");
        assert_eq!(
            state("SELECT pgque.register_subconsumer('cq', 'plain', 'w1', true)"),
            "55000"
        );
        Spi::run(&format!("SELECT pgque.ack({b})")).unwrap();
        assert_eq!(
            i32_of("SELECT pgque.register_subconsumer('cq', 'plain', 'w1', true)"),
            Some(1)
        );
        // Cooperative now: more members need no flag; a repeat is 0.
        assert_eq!(
            i32_of("SELECT pgque.subscribe_subconsumer('cq', 'plain', 'w2')"),
            Some(1)
        );
        assert_eq!(
            i32_of("SELECT pgque.register_subconsumer('cq', 'plain', 'w2')"),
            Some(0)
        );
        // A new consumer is created cooperative.
        assert_eq!(
            i32_of("SELECT pgque.register_subconsumer('cq', 'grp', 'm1')"),
            Some(1)
        );
        // unsubscribe_subconsumer is unregister_subconsumer.
        assert_eq!(
            i32_of("SELECT pgque.unsubscribe_subconsumer('cq', 'plain', 'w2')"),
            Some(1)
        );
        // a member that is not there: 0, as PgQue's unregister returns
        assert_eq!(
            i32_of("SELECT pgque.unsubscribe_subconsumer('cq', 'plain', 'w2')"),
            Some(0)
        );
        assert_eq!(
            i64_of("SELECT count(*) FROM pgque.subscription s JOIN pgque.subscription p ON p.sub_id = s.sub_parent \
                    WHERE p.sub_consumer = 'plain'"),
            Some(1)
        );
    }

    #[pg_test]
    fn coop_next_batch_custom_registers_gates_and_returns_the_open_batch() {
        Spi::run("SELECT pgque.create_queue('nq')").unwrap();
        // Registers grp/m1 (new), nothing to read yet past the first tick.
        let none = Spi::get_three::<i64, i64, i64>(
            "SELECT * FROM pgque.next_batch_custom('nq', 'grp', 'm1', NULL, NULL, NULL)",
        )
        .unwrap();
        assert_eq!(none, (None, None, None));
        assert_eq!(
            i64_of("SELECT count(*) FROM pgque.subscription WHERE sub_consumer IN ('grp', 'm1')"),
            Some(2)
        );
        Spi::run("SELECT pgque.force_tick('nq')").unwrap();
        // min_count not reached (no events between the ticks): no batch.
        let gated = Spi::get_three::<i64, i64, i64>(
            "SELECT * FROM pgque.next_batch_custom('nq', 'grp', 'm1', NULL, 1000, NULL)",
        )
        .unwrap();
        assert_eq!(gated.0, None);
        let (b, prev, next) = Spi::get_three::<i64, i64, i64>(
            "SELECT * FROM pgque.next_batch_custom('nq', 'grp', 'm1', NULL, NULL, NULL, '1 minute')",
        )
        .unwrap();
        let b = b.expect("a batch once the conditions are gone");
        assert!(prev.unwrap() < next.unwrap());
        // The open batch comes back whatever the conditions say.
        let again = Spi::get_three::<i64, i64, i64>(
            "SELECT * FROM pgque.next_batch_custom('nq', 'grp', 'm1', '1 day', 1000, '1 day')",
        )
        .unwrap();
        assert_eq!(again.0, Some(b));
    }

    #[pg_test]
    fn unsubscribe_slot_with_three_arguments_uses_the_persisted_n() {
        Spi::run(
            "SELECT pgque.create_queue('sq'); SELECT pgque.subscribe_partitioned('sq', 'pc', 4)",
        )
        .unwrap();
        Spi::run("SELECT pgque.unsubscribe_slot('sq', 'pc', 2)").unwrap();
        assert_eq!(
            i64_of("SELECT count(*) FROM pgque.partition_slot WHERE ps_consumer = 'pc' AND ps_sub IS NOT NULL"),
            Some(3)
        );
        assert_eq!(
            state("SELECT pgque.unsubscribe_slot('sq', 'pc', 4)"),
            "22003"
        );
        assert_eq!(
            state("SELECT pgque.unsubscribe_slot('sq', 'other', 0)"),
            "42704"
        );
        for k in [0, 1, 3] {
            Spi::run(&format!("SELECT pgque.unsubscribe_slot('sq', 'pc', {k})")).unwrap();
        }
        // The last slot gone, the consumer is forgotten.
        assert_eq!(
            i64_of("SELECT count(*) FROM pgque.partition_consumer"),
            Some(0)
        );
    }

    #[pg_test]
    fn insert_event_bulk_returns_aligned_ids() {
        Spi::run("SELECT pgque.create_queue('bq')").unwrap();
        let ids = Spi::get_one::<Vec<i64>>(
            "SELECT pgque.insert_event_bulk('bq', 'k', ARRAY['a', NULL, 'c'])",
        )
        .unwrap()
        .unwrap();
        assert_eq!(ids.len(), 3);
        let qid = i32_of("SELECT queue_id FROM pgque.queue WHERE queue_name = 'bq'").unwrap();
        for (i, want) in [Some("a"), None, Some("c")].iter().enumerate() {
            let got = Spi::get_one::<String>(&format!(
                "SELECT ev_data FROM pgque.event_{qid} WHERE ev_id = {} AND ev_type = 'k'",
                ids[i]
            ))
            .unwrap();
            assert_eq!(got.as_deref(), *want);
        }
        assert_eq!(
            Spi::get_one::<Vec<i64>>("SELECT pgque.insert_event_bulk('bq', 'k', '{}')").unwrap(),
            Some(vec![])
        );
    }

    #[pg_test]
    fn event_dead_is_idempotent_per_consumer_and_event() {
        Spi::run("SELECT pgque.create_queue('dq'); SELECT pgque.subscribe('dq', 'c'); SELECT pgque.subscribe('dq', 'c2')")
            .unwrap();
        Spi::run("SELECT pgque.force_tick('dq')").unwrap();
        let b = i64_of("SELECT pgque.next_batch('dq', 'c')").unwrap();
        let b2 = i64_of("SELECT pgque.next_batch('dq', 'c2')").unwrap();
        let dead = |batch: i64| {
            i32_of(&format!(
                "SELECT pgque.event_dead({batch}, 77, 'boom', now(), '5'::xid8, 5, 't', 'payload', 'e1')"
            ))
        };
        assert_eq!(dead(b), Some(1));
        assert_eq!(dead(b), Some(0), "the same consumer and event: once");
        assert_eq!(dead(b2), Some(1), "another consumer has its own");
        assert_eq!(
            text_of(
                "SELECT string_agg(concat_ws(',', dl_consumer, dl_reason, ev_id, ev_retry, ev_type, ev_data, ev_extra1), ';' \
                        ORDER BY dl_consumer) FROM pgque.dead_letter_store"
            )
            .as_deref(),
            Some("c,boom,77,5,t,payload,e1;c2,boom,77,5,t,payload,e1")
        );
        Spi::run(&format!("SELECT pgque.ack({b})")).unwrap();
        assert_eq!(
            state(&format!(
                "SELECT pgque.event_dead({b}, 78, 'x', now(), '5'::xid8, 0, 't', 'd')"
            )),
            "55000"
        );
    }

    #[pg_test]
    fn maint_idem_of_an_unknown_queue_is_refused() {
        Spi::run("SELECT pgque.create_queue('mq')").unwrap();
        assert_eq!(state("SELECT pgque.maint_idem('mq')"), "ok");
        assert_eq!(state("SELECT pgque.maint_idem('nope')"), "42704");
        assert_eq!(state("SELECT pgque.maint_idem(NULL)"), "22004");
    }
}
