//! The `pause` failure policy of partitioned consumers (src/log/pause.rs)
//! with real sessions: a nacked key's later events wait for its redelivery
//! (or its dead letter and release), other keys never wait, and under
//! random nacks and sessions killed mid-batch every key's acked sequence is
//! exactly its send order, none lost, none twice.
mod slots_util;
use pgque_pg_test::postgres::Client;
use slots_util::*;

/// nack_partitioned of one delivered message (by its id and batch).
fn nack(c: &mut Client, q: &str, slot: i32, n: i32, w: &str, m: &Msg, after: &str) -> i32 {
    c.query_one(
        "SELECT pgque.nack_partitioned($1, 'c', $2, $3, $4, \
             ROW($5, $6, 't', NULL, NULL, now(), NULL, NULL, NULL, NULL)::pgque.message, \
             $7::text::interval, 'test')",
        &[&q, &slot, &n, &w, &m.id, &m.batch, &after],
    )
    .unwrap()
    .get(0)
}

fn send(c: &mut Client, q: &str, key: &str, payload: &str) {
    c.execute(
        "SELECT pgque.send($1, 't', $2::text, $3::text)",
        &[&q, &payload, &key],
    )
    .unwrap();
}

fn payloads(ms: &[Msg]) -> Vec<String> {
    ms.iter().map(|m| m.payload.clone().unwrap()).collect()
}

fn blocked(c: &mut Client) -> String {
    c.query_one(
        "SELECT coalesce(string_agg(partition_key || ':' || state || ':' || held_events, ',' \
                ORDER BY partition_key), '') FROM pgque.partition_blocked_keys",
        &[],
    )
    .unwrap()
    .get(0)
}

/// One slot, keys a and b, ticks by hand: a's later events wait for its
/// failed event; b never waits; held events come back in order, then a's
/// newer ones, without counting retries.
#[test]
fn pause_holds_a_nacked_keys_later_events_until_its_redelivery_is_acked() {
    let db = manual_db("slots_pause_basic");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('pq'); \
         SELECT pgque.subscribe_partitioned('pq', 'c', 1, failure_policy => 'pause');",
    )
    .unwrap();
    assert_eq!(claim(&mut c, "pq", "c", 0, "w", "5 minutes"), Some(1));
    for (k, p) in [
        ("a", "a1"),
        ("b", "b1"),
        ("a", "a2"),
        ("b", "b2"),
        ("a", "a3"),
    ] {
        send(&mut c, "pq", k, p);
    }
    tick(&mut c, "pq");
    let got = recv_slot(&mut c, "pq", "c", 0, 1, "w", 100).unwrap();
    assert_eq!(payloads(&got), ["a1", "b1", "a2", "b2", "a3"]);
    // a1 fails: a2 and a3 (this batch) are parked; the client skips them.
    assert_eq!(nack(&mut c, "pq", 0, 1, "w", &got[0], "0 seconds"), 1);
    assert_eq!(blocked(&mut c), "a:retry:2");
    // A re-read of the open batch (a crash, a takeover) shows b1, b2 only.
    let again = recv_slot(&mut c, "pq", "c", 0, 1, "w", 100).unwrap();
    assert_eq!(payloads(&again), ["b1", "b2"]);
    // Nacking a parked event schedules nothing.
    assert_eq!(nack(&mut c, "pq", 0, 1, "w", &got[2], "0 seconds"), 0);
    assert_eq!(ack_slot(&mut c, "pq", "c", 0, 1, "w").unwrap(), 1);
    // New events: b4 flows, a4 waits.
    send(&mut c, "pq", "a", "a4");
    send(&mut c, "pq", "b", "b3");
    tick(&mut c, "pq");
    let got = recv_slot(&mut c, "pq", "c", 0, 1, "w", 100).unwrap();
    assert_eq!(payloads(&got), ["b3"]);
    assert_eq!(ack_slot(&mut c, "pq", "c", 0, 1, "w").unwrap(), 1);
    assert_eq!(blocked(&mut c), "a:retry:3");
    // a1 comes back, alone.
    assert_eq!(i64s(&mut c, "SELECT pgque.maint_retry_events()::int8"), 1);
    tick(&mut c, "pq");
    let got = recv_slot(&mut c, "pq", "c", 0, 1, "w", 100).unwrap();
    assert_eq!(payloads(&got), ["a1"]);
    assert_eq!(got[0].retry, Some(1));
    assert_eq!(ack_slot(&mut c, "pq", "c", 0, 1, "w").unwrap(), 1);
    // Released: a2, a3, a4 are put back; a5, sent meanwhile, waits for them.
    assert_eq!(blocked(&mut c), "a:release:0");
    send(&mut c, "pq", "a", "a5");
    tick(&mut c, "pq");
    let got = recv_slot(&mut c, "pq", "c", 0, 1, "w", 100).unwrap();
    assert_eq!(payloads(&got), ["a2", "a3", "a4"]);
    assert!(got.iter().all(|m| m.retry == Some(0)), "{got:?}");
    assert_eq!(ack_slot(&mut c, "pq", "c", 0, 1, "w").unwrap(), 1);
    tick(&mut c, "pq");
    let got = recv_slot(&mut c, "pq", "c", 0, 1, "w", 100).unwrap();
    assert_eq!(payloads(&got), ["a5"]);
    assert_eq!(ack_slot(&mut c, "pq", "c", 0, 1, "w").unwrap(), 1);
    assert_eq!(blocked(&mut c), "");
    // a flows again.
    send(&mut c, "pq", "a", "a6");
    tick(&mut c, "pq");
    let got = recv_slot(&mut c, "pq", "c", 0, 1, "w", 100).unwrap();
    assert_eq!(payloads(&got), ["a6"]);
    assert_eq!(got[0].retry, None);
    assert_eq!(ack_slot(&mut c, "pq", "c", 0, 1, "w").unwrap(), 1);
    assert_eq!(i64s(&mut c, "SELECT count(*) FROM pgque.partition_held"), 0);
}

/// on_dead_letter 'block': a dead-lettered key stays blocked until an
/// administrator releases it; 'resume' lets its held events go at the ack.
#[test]
fn pause_after_a_dead_letter_blocks_or_resumes_as_chosen() {
    let db = manual_db("slots_pause_dead");
    let mut c = db.connect();
    c.batch_execute(
        "SELECT pgque.create_queue('pd'); \
         SELECT pgque.set_queue_config('pd', 'max_retries', '0'); \
         SELECT pgque.subscribe_partitioned('pd', 'c', 1, 'pause', on_dead_letter => 'block');",
    )
    .unwrap();
    claim(&mut c, "pd", "c", 0, "w", "5 minutes").unwrap();
    for p in ["k1", "k2"] {
        send(&mut c, "pd", "k", p);
    }
    tick(&mut c, "pd");
    let got = recv_slot(&mut c, "pd", "c", 0, 1, "w", 100).unwrap();
    assert_eq!(payloads(&got), ["k1", "k2"]);
    assert_eq!(nack(&mut c, "pd", 0, 1, "w", &got[0], "0 seconds"), 1);
    assert_eq!(i64s(&mut c, "SELECT count(*) FROM pgque.dead_letter"), 1);
    assert_eq!(ack_slot(&mut c, "pd", "c", 0, 1, "w").unwrap(), 1);
    assert_eq!(blocked(&mut c), "k:dead:1");
    send(&mut c, "pd", "k", "k3");
    send(&mut c, "pd", "other", "o1");
    tick(&mut c, "pd");
    let got = recv_slot(&mut c, "pd", "c", 0, 1, "w", 100).unwrap();
    assert_eq!(payloads(&got), ["o1"]);
    assert_eq!(ack_slot(&mut c, "pd", "c", 0, 1, "w").unwrap(), 1);
    // Still blocked after more ticks; then released by hand.
    tick(&mut c, "pd");
    assert!(recv_slot(&mut c, "pd", "c", 0, 1, "w", 100)
        .unwrap()
        .is_empty());
    assert_eq!(blocked(&mut c), "k:dead:2");
    let r: bool = c
        .query_one("SELECT pgque.release_partition_key('pd', 'c', 'k')", &[])
        .unwrap()
        .get(0);
    assert!(r);
    let r: bool = c
        .query_one("SELECT pgque.release_partition_key('pd', 'c', 'nope')", &[])
        .unwrap()
        .get(0);
    assert!(!r);
    tick(&mut c, "pd");
    let got = recv_slot(&mut c, "pd", "c", 0, 1, "w", 100).unwrap();
    assert_eq!(payloads(&got), ["k2", "k3"]);
    assert_eq!(ack_slot(&mut c, "pd", "c", 0, 1, "w").unwrap(), 1);
    assert_eq!(blocked(&mut c), "");

    // 'resume': the dead letter lets the held events go at the ack.
    c.batch_execute(
        "SELECT pgque.subscribe_partitioned('pd', 'r', 1, 'pause', 'resume'); \
         SELECT pgque.claim_slot('pd', 'r', 0, 'w');",
    )
    .unwrap();
    for p in ["r1", "r2", "r3"] {
        send(&mut c, "pd", "k", p);
    }
    tick(&mut c, "pd");
    let rows = c
        .query(
            "SELECT msg_id, batch_id, payload FROM pgque.receive_partitioned('pd', 'r', 0, 1, 'w')",
            &[],
        )
        .unwrap();
    let ids: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(rows.len(), 3);
    let n: i32 = c
        .query_one(
            "SELECT pgque.nack_partitioned('pd', 'r', 0, 1, 'w', \
               ROW($1, $2, 't', NULL, NULL, now(), NULL, NULL, NULL, NULL)::pgque.message)",
            &[&ids[0].0, &ids[0].1],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let ack: i32 = c
        .query_one("SELECT pgque.ack_partitioned('pd', 'r', 0, 1, 'w')", &[])
        .unwrap()
        .get(0);
    assert_eq!(ack, 1);
    tick(&mut c, "pd");
    let got: Vec<String> = c
        .query(
            "SELECT payload FROM pgque.receive_partitioned('pd', 'r', 0, 1, 'w')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, ["r2", "r3"]);
}
