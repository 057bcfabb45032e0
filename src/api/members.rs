//! The members of a cooperative consumer (PgQ's subconsumers): registering
//! one (PgQue's `register_subconsumer`, PgQ's `register_consumer_at` family)
//! and unregistering it with what to do about its open batch. Both the
//! PgQue API (admin.rs) and the PgQ compatibility layer (pgq_compat.rs) go
//! through here.
use crate::error::{self, raise, required};
use crate::log::{self, batch};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

pub fn member_name(sub: Option<&str>) -> &str {
    error::valid_name(sub, "subconsumer", error::MAX_CONSUMER_NAME)
}

pub fn find_member(c: &mut SpiClient<'_>, parent: i32, name: &str) -> Option<i32> {
    let t = log::exec(
        c,
        "SELECT sub_id FROM pgque.subscription WHERE sub_parent = $1 AND sub_consumer = $2",
        &[parent.into(), name.into()],
    );
    log::first_row(t).map(|r| log::col(&r, 1).unwrap())
}

pub fn member_by_name(c: &mut SpiClient<'_>, parent: &log::Sub, name: &str) -> i32 {
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

/// unregister_subconsumer's body (also unsubscribe_subconsumer's).
pub fn unregister_member(
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
                crate::log::retry::retry_event(
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
pub fn find_group_member(
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

/// Registers `subconsumer` under `consumer` (creating the consumer when it is
/// new). A consumer that already exists without members is a normal consumer:
/// it becomes cooperative only with `convert_normal` (else 55000), and not
/// while it has an open batch (55000). Returns (1 new / 0 existed, the
/// consumer's subscription, the member's).
pub fn register_member(
    c: &mut SpiClient<'_>,
    q: &log::Queue,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    convert_normal: bool,
) -> (i32, log::Sub, i32) {
    let cname = log::valid_consumer(consumer, "consumer");
    let mname = error::valid_name(subconsumer, "subconsumer", error::MAX_CONSUMER_NAME);
    let parent = match log::find_sub(c, q, cname) {
        None => {
            log::register(c, q, cname, None);
            log::sub_by_name(c, q, Some(cname))
        }
        Some(p) => {
            let t = log::exec(
                c,
                "SELECT EXISTS (SELECT 1 FROM pgque.subscription WHERE sub_parent = $1)",
                &[p.id.into()],
            );
            let cooperative: bool = log::col(&log::first_row(t).unwrap(), 1).unwrap();
            if !cooperative {
                if !convert_normal {
                    raise(
                        error::WRONG_STATE,
                        format!(
                            "consumer {cname:?} on queue {:?} is already a normal consumer; \
                             pass convert_normal => true to make it cooperative",
                            q.name
                        ),
                    );
                }
                batch::lock_sub(c, p.id);
                if batch::latest_batch(c, p.id).is_some_and(|b| !b.done) {
                    raise(
                        error::WRONG_STATE,
                        format!(
                            "consumer {cname:?} on queue {:?} has an open batch; finish it before converting",
                            q.name
                        ),
                    );
                }
            }
            p
        }
    };
    let found = |c: &mut SpiClient<'_>| -> Option<i32> {
        let t = log::exec(
            c,
            "SELECT sub_id FROM pgque.subscription WHERE sub_parent = $1 AND sub_consumer = $2",
            &[parent.id.into(), mname.into()],
        );
        log::first_row(t).map(|r| log::col(&r, 1).unwrap())
    };
    if let Some(m) = found(c) {
        return (0, parent, m);
    }
    log::check_consumer_room(c, q, 1);
    log::exec(
        c,
        "INSERT INTO pgque.subscription (sub_queue, sub_consumer, sub_parent, sub_start_tick) \
         SELECT $1, $2, $3, sub_start_tick FROM pgque.subscription WHERE sub_id = $3 \
         ON CONFLICT DO NOTHING",
        &[q.id.into(), mname.into(), parent.id.into()],
    );
    let m = found(c).expect("the member just registered");
    (1, parent, m)
}

pub fn do_register(
    queue_name: Option<&str>,
    consumer: Option<&str>,
    subconsumer: Option<&str>,
    convert_normal: Option<bool>,
) -> i32 {
    let convert = required(convert_normal, "convert_normal");
    Spi::connect_mut(|c| {
        let q = log::queue_by_name(c, queue_name);
        register_member(c, &q, consumer, subconsumer, convert).0
    })
}
