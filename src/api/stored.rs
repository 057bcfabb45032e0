#![allow(clippy::type_complexity)] // pgrx needs TableIterator row types spelled out inline
//! pgque.all_events(queue): the events a server stores for a queue, for
//! inspection and for checking where a sharded cluster put each event
//! (docs/scale-out.md).
use crate::log;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

/// all_events(queue_name) → (ev_id, ev_type, ev_data, ev_extra1..4, ev_time),
/// PgQ's column names, of every event now in the queue's event tables
/// (all of them, read or not, until rotation truncates their table), in
/// event-id order. Reads only; pgque_admin. The whole result is built in
/// memory: an inspection tool, not a consumer.
#[pg_extern(stable, security_definer)]
#[search_path(pg_catalog, pgque, pg_temp)]
fn all_events(
    queue_name: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(ev_id, i64),
        name!(ev_type, Option<String>),
        name!(ev_data, Option<String>),
        name!(ev_extra1, Option<String>),
        name!(ev_extra2, Option<String>),
        name!(ev_extra3, Option<String>),
        name!(ev_extra4, Option<String>),
        name!(ev_time, TimestampWithTimeZone),
    ),
> {
    let rows = Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        let sql = format!(
            "SELECT ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_time \
               FROM {} ORDER BY ev_id",
            q.parent_table()
        );
        log::exec_read(c, &sql, &[])
            .map(|r| {
                (
                    log::col::<i64>(&r, 1).unwrap(),
                    log::col::<String>(&r, 2),
                    log::col::<String>(&r, 3),
                    log::col::<String>(&r, 4),
                    log::col::<String>(&r, 5),
                    log::col::<String>(&r, 6),
                    log::col::<String>(&r, 7),
                    log::col::<TimestampWithTimeZone>(&r, 8).unwrap(),
                )
            })
            .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}
