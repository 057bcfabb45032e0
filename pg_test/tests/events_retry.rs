//! Event queues: nack / retries to one consumer only, dead letters, replay, purge.
mod events_util;
use events_util::*;
use pgque_pg_test::*;

fn msgs(
    c: &mut pgque_pg_test::postgres::Client,
    q: &str,
    cn: &str,
) -> Vec<(i64, i64, Option<i32>)> {
    c.query(
        "SELECT msg_id, batch_id, retry_count FROM pgque.receive($1, $2, 100)",
        &[&q, &cn],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// nack of the first message of the consumer's batch, then ack.
fn nack_first(
    c: &mut pgque_pg_test::postgres::Client,
    q: &str,
    cn: &str,
    after: &str,
) -> (i64, Option<i32>) {
    let r = c
        .query_one(
            "WITH m AS (SELECT * FROM pgque.receive($1, $2, 100) LIMIT 1) \
             SELECT (m).msg_id, (m).batch_id, (m).retry_count, pgque.nack((m).batch_id, m, $3::text::interval, 'boom') \
               FROM m",
            &[&q, &cn, &after],
        )
        .unwrap();
    let (id, b, rc, n): (i64, i64, Option<i32>, i32) = (r.get(0), r.get(1), r.get(2), r.get(3));
    assert_eq!(n, 1);
    ack(c, b);
    (id, rc)
}

#[test]
fn nack_redelivers_to_that_consumer_then_dead_letters() {
    let db = manual_db("ev_retry");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('r'); SELECT pgque.subscribe('r', 'c1'); \
         SELECT pgque.subscribe('r', 'c2'); SELECT pgque.set_queue_config('r', 'max_retries', '2')",
    )
    .unwrap();
    let id = send(&mut c, "r", "work");
    tick(&mut c, "r");
    // c2 consumes normally.
    assert_eq!(drain(&mut c, "r", "c2", 100), vec![id]);
    // c1 nacks with a retry in the future: nothing comes back yet.
    let (got, rc) = nack_first(&mut c, "r", "c1", "1 hour");
    assert_eq!((got, rc), (id, None));
    assert_eq!(i64s(&mut c, "SELECT pgque.maint_retry_events()::int8"), 0);
    assert_eq!(drain(&mut c, "r", "c1", 100), Vec::<i64>::new());
    // Make it due now, redeliver: c1 sees it with retry_count 1; c2 does not.
    c.batch_execute("UPDATE pgque.retry_queue SET ev_retry_after = now()")
        .unwrap();
    assert_eq!(i64s(&mut c, "SELECT pgque.maint_retry_events()::int8"), 1);
    tick(&mut c, "r");
    assert_eq!(drain(&mut c, "r", "c2", 100), Vec::<i64>::new());
    let m = msgs(&mut c, "r", "c1");
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].0, m[0].2), (id, Some(1)));
    // nack again with retry_after 0: retry_count 2 next time.
    let (_, rc) = nack_first(&mut c, "r", "c1", "0");
    assert_eq!(rc, Some(1));
    c.query_one("SELECT pgque.maint()", &[]).unwrap();
    tick(&mut c, "r");
    let m = msgs(&mut c, "r", "c1");
    assert_eq!((m[0].0, m[0].2), (id, Some(2)));
    // retries reached max_retries (2): this nack dead-letters it.
    let (_, rc) = nack_first(&mut c, "r", "c1", "0");
    assert_eq!(rc, Some(2));
    c.query_one("SELECT pgque.maint()", &[]).unwrap();
    assert_eq!(drain(&mut c, "r", "c1", 100), Vec::<i64>::new());
    let dl = c
        .query(
            "SELECT d.dl_id, c.co_name, d.ev_id, d.ev_data, d.ev_retry, d.dl_reason \
               FROM pgque.dlq_inspect('r') d JOIN pgque.consumer c ON c.co_id = d.dl_consumer_id",
            &[],
        )
        .unwrap();
    assert_eq!(dl.len(), 1);
    let dl_id: i64 = dl[0].get(0);
    assert_eq!(dl[0].get::<_, String>(1), "c1");
    assert_eq!(dl[0].get::<_, i64>(2), id);
    assert_eq!(dl[0].get::<_, String>(3), "work");
    assert_eq!(dl[0].get::<_, Option<i32>>(4), Some(2));
    assert_eq!(dl[0].get::<_, String>(5), "boom");
    // Replay puts it back to c1 (only).
    let replayed: i64 = c
        .query_one("SELECT pgque.dlq_replay($1)", &[&dl_id])
        .unwrap()
        .get(0);
    assert_eq!(replayed, id);
    assert_eq!(
        sqlstate(c.query_one("SELECT pgque.dlq_replay($1)", &[&dl_id])),
        "42704"
    );
    c.query_one("SELECT pgque.maint()", &[]).unwrap();
    assert_eq!(drain(&mut c, "r", "c2", 100), Vec::<i64>::new());
    tick(&mut c, "r");
    let m = msgs(&mut c, "r", "c1");
    assert_eq!((m[0].0, m[0].2), (id, Some(0)));
    // Dead-letter it again and purge.
    c.batch_execute("SELECT pgque.set_queue_config('r', 'max_retries', '0')")
        .unwrap();
    let (_, _) = nack_first(&mut c, "r", "c1", "0");
    assert_eq!(
        i64s(&mut c, "SELECT count(*) FROM pgque.dlq_inspect('r', 10)"),
        1
    );
    assert_eq!(i64s(&mut c, "SELECT pgque.dlq_purge('r', '1 hour')"), 0);
    assert_eq!(i64s(&mut c, "SELECT pgque.dlq_purge('r', '0 seconds')"), 1);
    assert_eq!(
        i64s(&mut c, "SELECT count(*) FROM pgque.dlq_inspect('r')"),
        0
    );
    // replay_all on an empty dead-letter queue.
    assert_eq!(i64s(&mut c, "SELECT pgque.dlq_replay_all('r')"), 0);
}

#[test]
fn pgq_event_retry_and_batch_retry() {
    let db = manual_db("ev_retry_pgq");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('r'); SELECT pgque.register_consumer('r', 'c')")
        .unwrap();
    let ids = send_many(&mut c, "r", 3);
    tick(&mut c, "r");
    let b: i64 = c
        .query_one("SELECT pgque.next_batch('r', 'c')", &[])
        .unwrap()
        .get(0);
    let n: i32 = c
        .query_one("SELECT pgque.event_retry($1, $2, 0)", &[&b, &ids[0]])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    assert_eq!(
        sqlstate(c.query_one("SELECT pgque.event_retry($1, 123456789::bigint, 0)", &[&b])),
        "42704"
    );
    c.query_one("SELECT pgque.finish_batch($1)", &[&b]).unwrap();
    c.query_one("SELECT pgque.maint_retry_events()", &[])
        .unwrap();
    tick(&mut c, "r");
    let b: i64 = c
        .query_one("SELECT pgque.next_batch('r', 'c')", &[])
        .unwrap()
        .get(0);
    let rows = c
        .query(
            "SELECT ev_id, ev_retry FROM pgque.get_batch_events($1)",
            &[&b],
        )
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].get::<_, i64>(0), rows[0].get::<_, Option<i32>>(1)),
        (ids[0], Some(1))
    );
    let n: i32 = c
        .query_one("SELECT pgque.batch_retry($1, 0)", &[&b])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    c.query_one("SELECT pgque.finish_batch($1)", &[&b]).unwrap();
    c.query_one("SELECT pgque.maint_retry_events()", &[])
        .unwrap();
    tick(&mut c, "r");
    let b: i64 = c
        .query_one("SELECT pgque.next_batch('r', 'c')", &[])
        .unwrap()
        .get(0);
    let rows = c
        .query(
            "SELECT ev_id, ev_retry FROM pgque.get_batch_events($1)",
            &[&b],
        )
        .unwrap();
    assert_eq!(
        (rows[0].get::<_, i64>(0), rows[0].get::<_, Option<i32>>(1)),
        (ids[0], Some(2))
    );
}

#[test]
fn moved_retries_are_ticked_with_the_move() {
    let db = manual_db("ev_retry_tick");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('rt'); SELECT pgque.subscribe('rt', 'c')")
        .unwrap();
    let id = send(&mut c, "rt", "again");
    tick(&mut c, "rt");
    let (_, rc) = nack_first(&mut c, "rt", "c", "0");
    assert_eq!(rc, None);
    assert_eq!(i64s(&mut c, "SELECT pgque.maint_retry_events()::int8"), 1);
    // No force_tick: plain ticker() calls tick the queue, although the retry
    // took no new event id (as soon as the transactions running at the move
    // have ended -- a parallel test's may delay it, hence the wide bound).
    let ticked = wait_until(std::time::Duration::from_secs(30), || {
        i64s(&mut c, "SELECT pgque.ticker()") >= 1
    });
    assert!(ticked, "the moved retry was never ticked");
    let m = msgs(&mut c, "rt", "c");
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].0, m[0].2), (id, Some(1)));
}

#[test]
fn ticker_finds_committed_events_the_sequence_does_not_show() {
    // An event whose id was taken before a tick but whose row was written and
    // committed after the follow-up tick: the sequence shows nothing new, the
    // ticker's probe (at most every ticker_max_lag) finds it.
    let db = manual_db("ev_probe");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('pr'); SELECT pgque.subscribe('pr', 'c'); \
         SELECT pgque.set_queue_config('pr', 'ticker_max_lag', '200ms')",
    )
    .unwrap();
    let mut late = db.connect();
    late.batch_execute("BEGIN").unwrap();
    let id: i64 = late
        .query_one("SELECT nextval('pgque.event_1_id_seq')", &[])
        .unwrap()
        .get(0);
    // The ticker sees the new id and ticks; then (nothing in flight holds an
    // xid) the follow-up; then nothing more.
    let mut ticks = 0;
    for _ in 0..3 {
        ticks += i64s(&mut c, "SELECT pgque.ticker()");
    }
    assert!(ticks >= 1);
    late.execute(
        "INSERT INTO pgque.event_1_0 (ev_id, ev_type, ev_data) VALUES ($1, 'default', 'late')",
        &[&id],
    )
    .unwrap();
    late.batch_execute("COMMIT").unwrap();
    assert_eq!(drain_no_tick(&mut c), Vec::<i64>::new());
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(i64s(&mut c, "SELECT pgque.ticker()"), 1, "the probe ticks");
    assert_eq!(drain_no_tick(&mut c), vec![id]);
}

fn drain_no_tick(c: &mut pgque_pg_test::postgres::Client) -> Vec<i64> {
    let mut all = vec![];
    loop {
        let (b, ids) = recv(c, "pr", "c", 100);
        match b {
            Some(b) => {
                all.extend(ids);
                ack(c, b);
            }
            None => return all,
        }
    }
}
