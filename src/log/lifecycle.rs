//! Making and removing queues and consumers: create_queue / drop_queue (the
//! queue's row, sequence and event tables) and register / unregister (a
//! consumer's subscription, within pgque.max_consumers_per_queue).
use super::queue::{
    check_consumer_room, event_parent, event_seq, event_table, find_sub, Queue, Sub,
};
use super::schema::dead_letter_table;
use super::spi::{col, exec, first_row, run_once};
use super::{slots, tick};
use crate::error::{self, raise};
use pgrx::spi::SpiClient;

/// Creates a queue with its event tables and first tick; false if it exists.
pub fn create_queue(client: &mut SpiClient<'_>, name: &str) -> bool {
    let t = exec(
        client,
        "INSERT INTO pgque.queue (queue_name, queue_event_seq) VALUES ($1, 0) \
         ON CONFLICT (queue_name) DO NOTHING RETURNING queue_id, queue_ntables",
        &[name.into()],
    );
    let Some(r) = first_row(t) else {
        return false;
    };
    let qid: i32 = col(&r, 1).unwrap();
    let ntables: i32 = col(&r, 2).unwrap();
    let parent = event_parent(qid);
    let seq = event_seq(qid);
    // Objects of this id can only be leftovers of an earlier installation
    // (DROP EXTENSION leaves the tables create_queue made): remove them.
    let t = exec(
        client,
        "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL",
        &[parent.as_str().into(), seq.as_str().into()],
    );
    let r = first_row(t).unwrap();
    let (old_tables, old_seq): (bool, bool) = (col(&r, 1).unwrap(), col(&r, 2).unwrap());
    if old_tables {
        run_once(client, &format!("DROP TABLE {parent} CASCADE"));
    }
    if old_seq {
        run_once(client, &format!("DROP SEQUENCE {seq}"));
    }
    run_once(client, &format!("CREATE SEQUENCE {seq}"));
    run_once(
        client,
        &format!(
            "CREATE TABLE {parent} (
                ev_id     bigint NOT NULL,
                ev_time   timestamptz NOT NULL DEFAULT now(),
                ev_txid   xid8 NOT NULL DEFAULT pg_current_xact_id(),
                ev_owner  int4,
                ev_retry  int4,
                ev_type   text,
                ev_data   text,
                ev_extra1 text,
                ev_extra2 text,
                ev_extra3 text,
                ev_extra4 text,
                ev_headers jsonb)"
        ),
    );
    for n in 0..ntables {
        let child = event_table(qid, n);
        run_once(
            client,
            &format!("CREATE TABLE {child} () INHERITS ({parent}) WITH (fillfactor = 100)"),
        );
        run_once(
            client,
            &format!("CREATE INDEX event_{qid}_{n}_txid_idx ON {child} (ev_txid)"),
        );
    }
    exec(
        client,
        "UPDATE pgque.queue SET queue_event_seq = $2::regclass::oid WHERE queue_id = $1",
        &[qid.into(), seq.as_str().into()],
    );
    tick::insert_tick(client, qid, name, 0, tick::Pending::None);
    true
}

/// Drops a queue, its tables and its metadata.
pub fn drop_queue(client: &mut SpiClient<'_>, q: &Queue, force: bool) {
    let t = exec(
        client,
        "SELECT count(*) FROM pgque.subscription WHERE sub_queue = $1",
        &[q.id.into()],
    );
    let subs: i64 = col(&first_row(t).unwrap(), 1).unwrap();
    // Lock order, before anything is deleted: the queue row, as the ticker
    // and the maintenance duties take it (they skip a locked queue), then
    // the event tables through their parent, parent first and children
    // after, as every reader through the parent locks them. Dropping the
    // children first instead deadlocked with a worker duty that had locked
    // the parent and was expanding to the children (seen in benches w12).
    exec(
        client,
        "SELECT 1 FROM pgque.queue WHERE queue_id = $1 FOR NO KEY UPDATE",
        &[q.id.into()],
    );
    run_once(
        client,
        &format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", event_parent(q.id)),
    );
    if subs > 0 && !force {
        raise(
            error::WRONG_STATE,
            format!(
                "queue {:?} has {subs} consumer(s); unsubscribe them or call drop_queue(queue_name, true)",
                q.name
            ),
        );
    }
    exec(
        client,
        "DELETE FROM pgque.batch WHERE sub_id IN (SELECT sub_id FROM pgque.subscription WHERE sub_queue = $1)",
        &[q.id.into()],
    );
    exec(
        client,
        "DELETE FROM pgque.tick WHERE tick_queue = $1",
        &[q.id.into()],
    );
    exec(
        client,
        "DELETE FROM pgque.retry_queue WHERE ev_queue = $1",
        &[q.id.into()],
    );
    exec(
        client,
        &format!("DELETE FROM {} WHERE dl_queue = $1", dead_letter_table()),
        &[q.id.into()],
    );
    exec(
        client,
        "DELETE FROM pgque.queue WHERE queue_id = $1",
        &[q.id.into()],
    );
    // Children first, then the parent: no CASCADE, no NOTICE.
    let children: Vec<String> = (0..q.ntables).map(|n| event_table(q.id, n)).collect();
    run_once(
        client,
        &format!("DROP TABLE {}, {}", children.join(", "), event_parent(q.id)),
    );
    run_once(client, &format!("DROP SEQUENCE {}", event_seq(q.id)));
}

/// Registers a consumer at `tick` (default: the queue's last tick).
/// Returns false when it was registered already.
pub fn register(
    client: &mut SpiClient<'_>,
    q: &Queue,
    consumer: &str,
    at_tick: Option<i64>,
) -> bool {
    if find_sub(client, q, consumer).is_some() {
        return false;
    }
    if slots::consumer_n(client, q, consumer).is_some() {
        raise(
            error::DUPLICATE_OBJECT,
            format!(
                "{consumer:?} is a partitioned consumer of queue {:?}; a plain consumer needs its own name",
                q.name
            ),
        );
    }
    check_consumer_room(client, q, 1);
    let tick = match at_tick {
        Some(t) => {
            if tick::tick_snapshot(client, q.id, t).is_none() {
                raise(
                    error::UNDEFINED_OBJECT,
                    format!("tick {t} of queue {:?} does not exist (any more)", q.name),
                );
            }
            t
        }
        None => tick::last_tick(client, q.id)
            .map(|t| t.id)
            .unwrap_or_else(|| tick::insert_tick(client, q.id, &q.name, 0, tick::Pending::None)),
    };
    exec(
        client,
        "INSERT INTO pgque.subscription (sub_queue, sub_consumer, sub_start_tick) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
        &[q.id.into(), consumer.into(), tick.into()],
    );
    true
}

/// Removes a consumer (with its cooperative members and pending retries).
pub fn unregister(client: &mut SpiClient<'_>, q: &Queue, sub: &Sub) {
    exec(
        client,
        "DELETE FROM pgque.retry_queue WHERE ev_owner = $1",
        &[sub.id.into()],
    );
    exec(
        client,
        "DELETE FROM pgque.subscription WHERE sub_id = $1 OR sub_parent = $1",
        &[sub.id.into()],
    );
    let _ = q;
}
