//! A queue and its consumers as the engine knows them: the rows of
//! pgque.queue and pgque.subscription looked up by name, and the names of a
//! queue's event tables.
use super::spi::{col, exec, first_row};
use crate::error::{self, raise};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

/// What the engine knows about a queue for sending and consuming.
#[derive(Debug, Clone)]
pub struct Queue {
    pub id: i32,
    pub name: String,
    pub cur_table: i32,
    pub ntables: i32,
    pub max_retries: i32,
    /// The queue's event id sequence (send_batch draws its ids from it).
    pub seq: pg_sys::Oid,
}

impl Queue {
    pub fn parent_table(&self) -> String {
        event_parent(self.id)
    }
    pub fn current_table(&self) -> String {
        event_table(self.id, self.cur_table)
    }
}

pub fn event_parent(qid: i32) -> String {
    format!("pgque.event_{qid}")
}

pub fn event_table(qid: i32, n: i32) -> String {
    format!("pgque.event_{qid}_{n}")
}

pub fn event_seq(qid: i32) -> String {
    format!("pgque.event_{qid}_id_seq")
}

/// Looks a queue up by name: 22004 for NULL, 42602/42622 for a bad name,
/// 42704 when there is no such queue.
pub fn queue_by_name(client: &mut SpiClient<'_>, name: Option<&str>) -> Queue {
    let name = error::valid_name(name, "queue_name", error::MAX_QUEUE_NAME);
    find_queue(client, name).unwrap_or_else(|| {
        raise(
            error::UNDEFINED_OBJECT,
            format!("queue not found: {name:?}"),
        )
    })
}

pub fn find_queue(client: &mut SpiClient<'_>, name: &str) -> Option<Queue> {
    let t = exec(
        client,
        "SELECT queue_id, queue_cur_table, queue_ntables, queue_max_retries, \
                queue_event_seq::pg_catalog.oid \
           FROM pgque.queue WHERE queue_name OPERATOR(pg_catalog.=) $1",
        &[name.into()],
    );
    first_row(t).map(|r| Queue {
        id: col(&r, 1).unwrap(),
        name: name.to_string(),
        cur_table: col(&r, 2).unwrap(),
        ntables: col(&r, 3).unwrap(),
        max_retries: col(&r, 4).unwrap(),
        seq: col(&r, 5).unwrap(),
    })
}

/// A consumer's subscription row.
#[derive(Debug, Clone)]
pub struct Sub {
    pub id: i32,
    pub name: String,
}

/// Checks a plain consumer name: like any name, and no `#` (it separates
/// slot and subconsumer names).
pub fn valid_consumer<'a>(name: Option<&'a str>, what: &str) -> &'a str {
    let name = error::valid_name(name, what, error::MAX_CONSUMER_NAME);
    if name.contains('#') {
        raise(
            error::INVALID_NAME,
            format!("{what} {name:?} must not contain '#'"),
        );
    }
    name
}

pub fn find_sub(client: &mut SpiClient<'_>, q: &Queue, consumer: &str) -> Option<Sub> {
    let t = exec(
        client,
        "SELECT sub_id FROM pgque.subscription \
          WHERE sub_queue = $1 AND sub_parent IS NULL AND sub_consumer = $2",
        &[q.id.into(), consumer.into()],
    );
    first_row(t).map(|r| Sub {
        id: col(&r, 1).unwrap(),
        name: consumer.to_string(),
    })
}

pub fn sub_by_name(client: &mut SpiClient<'_>, q: &Queue, consumer: Option<&str>) -> Sub {
    let consumer = valid_consumer(consumer, "consumer");
    find_sub(client, q, consumer).unwrap_or_else(|| {
        raise(
            error::UNDEFINED_OBJECT,
            format!(
                "consumer not registered: {consumer:?} on queue {:?}",
                q.name
            ),
        )
    })
}

/// 54000 unless queue `q` has room for `adding` more consumers (rows of
/// pgque.subscription: plain consumers, slots, cooperative members) under
/// pgque.max_consumers_per_queue. Registration is rare; the count reads the
/// queue's subscriptions, which the bound keeps few.
pub fn check_consumer_room(client: &mut SpiClient<'_>, q: &Queue, adding: i64) {
    let t = exec(
        client,
        "SELECT count(*) FROM pgque.subscription WHERE sub_queue = $1",
        &[q.id.into()],
    );
    let have: i64 = first_row(t).and_then(|r| col(&r, 1)).unwrap_or(0);
    let max = crate::gucs::max_consumers_per_queue();
    if have + adding > max {
        error::raise_detail(
            error::LIMIT_EXCEEDED,
            format!(
                "queue {:?} has {have} consumers; {adding} more would pass pgque.max_consumers_per_queue ({max})",
                q.name
            ),
            "Each slot of a partitioned consumer and each cooperative member counts. Unregister unused consumers, or have a superuser raise the setting.",
        );
    }
}
