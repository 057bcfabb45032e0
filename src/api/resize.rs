//! Online resize of a partitioned consumer's N (src/log/resize.rs;
//! docs/partition-keys.md, "Resizing N online"): begin_resize,
//! resize_ready, complete_resize, abort_resize. An administrator's calls,
//! except resize_ready (a status, for readers too).
//!
//! Bad input changes nothing: NULL 22004, names 42602/42622, new_n outside
//! 1..256 22003, new_n equal to N 22023, an unknown queue or a consumer that
//! is not partitioned 42704, a second begin / a complete before every old
//! slot drained / a complete or abort with no resize 55000.
#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
use crate::error::{self, raise, required};
use crate::log::slot::MAX_SLOTS;
use crate::log::{self, resize};
use pgrx::prelude::*;

fn queue_consumer<'a>(
    c: &mut pgrx::spi::SpiClient<'_>,
    queue_name: Option<&str>,
    consumer: Option<&'a str>,
) -> (log::Queue, &'a str) {
    let q = log::queue_by_name(c, queue_name);
    let consumer = log::valid_consumer(consumer, "consumer");
    (q, consumer)
}

/// begin_resize(queue_name, consumer, new_n) → the seal tick: starts a
/// resize of the consumer's N to new_n. The old slots deliver up to the
/// seal, the new slots (subscribed at it) everything after, once
/// complete_resize has cut over. Producers are not involved.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn begin_resize(queue_name: Option<&str>, consumer: Option<&str>, new_n: Option<i32>) -> i64 {
    let new_n = required(new_n, "new_n");
    if !(1..=MAX_SLOTS).contains(&new_n) {
        raise(
            error::OUT_OF_RANGE,
            format!("new_n must be between 1 and {MAX_SLOTS}, not {new_n}"),
        );
    }
    Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        resize::begin(c, &q, consumer, new_n)
    })
}

/// resize_ready(queue_name, consumer) → one row per old slot: where it
/// stands in the drain (its tick vs the seal, an open batch) and what the
/// cutover will move with its keys (scheduled retries, blocked keys, held
/// events, dead letters). complete_resize succeeds when every row is
/// `ready`. 55000 when no resize is in progress.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn resize_ready(
    queue_name: Option<&str>,
    consumer: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(slot, i32),
        name!(n, i32),
        name!(new_n, i32),
        name!(seal_tick, i64),
        name!(last_tick, i64),
        name!(open_batch, bool),
        name!(ready, bool),
        name!(retry_events, i64),
        name!(blocked_keys, i64),
        name!(held_events, i64),
        name!(dead_letters, i64),
    ),
> {
    let rows = Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        resize::require_installed();
        let n = log::slots::require_n(c, &q, consumer);
        let r = resize::require_current(c, &q, consumer);
        resize::states(c, &q, consumer, r.tick)
            .into_iter()
            .map(|s| {
                (
                    s.slot,
                    n,
                    r.n,
                    r.tick,
                    s.tick,
                    s.open_batch,
                    s.drained,
                    s.retries,
                    s.blocked_keys,
                    s.held_events,
                    s.dead_letters,
                )
            })
            .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}

/// complete_resize(queue_name, consumer) → the new N: the cutover, once
/// every old slot has drained to the seal (55000 naming the slots still
/// draining otherwise, nothing changed). Retries, blocked keys, held events
/// and dead letters move with their keys to the new slots; every lease
/// ends, and workers of the old slots are refused (22023: not the
/// consumer's N) until they claim again with the new N.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn complete_resize(queue_name: Option<&str>, consumer: Option<&str>) -> i32 {
    Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        resize::complete(c, &q, consumer)
    })
}

/// abort_resize(queue_name, consumer) → N (kept): drops the new slots
/// (they delivered nothing) and the seal; the old slots go on past it.
/// Loss-free at any point before complete_resize. 55000 with no resize.
#[pg_extern(security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn abort_resize(queue_name: Option<&str>, consumer: Option<&str>) -> i32 {
    Spi::connect_mut(|c| {
        let (q, consumer) = queue_consumer(c, queue_name, consumer);
        resize::abort(c, &q, consumer)
    })
}
