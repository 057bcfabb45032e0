//! Event consumers against a real server.
mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pgque_client::*;
use serde_json::json;

async fn slots(c: &tokio_postgres::Client, q: &str) -> Vec<(i32, i64, i64, Option<String>)> {
    c.query(
        "SELECT slot, pending_events, last_tick, lease_owner FROM pgque.partition_slot_status \
         WHERE queue_name = $1 AND consumer = 'pc' ORDER BY slot",
        &[&q],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

async fn last_tick(c: &tokio_postgres::Client, q: &str) -> i64 {
    c.query_one("SELECT last_tick_id FROM pgque.get_queue_info($1)", &[&q])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_handles_and_nacks() {
    let (dsn, c) = test_db("consumer_plain").await;
    c.batch_execute("SELECT pgque.create_queue('ev')").await.unwrap();
    let payloads: Vec<serde_json::Value> = (0..30).map(|i| json!({ "i": i })).collect();
    type Seen = Arc<Mutex<Vec<(i64, Option<i32>)>>>;
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let consumer = Consumer::new(&dsn, "ev", "c1", move |m: Message| {
        let s = s.clone();
        async move {
            if m.json()?["i"] == 3 && m.retry_count.is_none() {
                return Err("first delivery of 3 fails".into());
            }
            s.lock().unwrap().push((m.msg_id, m.retry_count));
            Ok(())
        }
    })
    .unwrap()
    .poll_interval(Duration::from_millis(200))
    .retry_after(Duration::ZERO);
    // run() subscribes it; the test sends once that is done.
    let sd = Shutdown::new();
    let consumer = Arc::new(consumer);
    let h = tokio::spawn({
        let (sd, consumer) = (sd.clone(), consumer.clone());
        async move { consumer.run(sd).await }
    });
    wait_until(10, "subscribed", || async {
        c.query_opt("SELECT 1 FROM pgque.get_consumer_info('ev', 'c1')", &[])
            .await
            .map(|r| r.is_some())
            .unwrap_or(false)
    })
    .await;
    let ids = send_batch(&c, "ev", "t", &payloads, None).await.unwrap();
    wait_until(30, "every event handled", || async { seen.lock().unwrap().len() == 30 }).await;
    sd.trigger();
    h.await.unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();
    let first: Vec<i64> = seen.iter().filter(|s| s.1.is_none()).map(|s| s.0).collect();
    let expect: Vec<i64> = ids.iter().copied().filter(|&i| i != ids[3]).collect();
    assert_eq!(first, expect);
    assert!(seen.contains(&(ids[3], Some(1))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_fewer_workers_than_slots_polls_every_slot() {
    let (dsn, c) = test_db("consumer_slots").await;
    c.batch_execute("SELECT pgque.create_queue('ev'); SELECT pgque.subscribe_partitioned('ev', 'pc', 8)")
        .await
        .unwrap();
    let keys: Vec<String> = (0..40).map(|k| format!("key-{k}")).collect();
    let mut sent: HashMap<String, Vec<i64>> = HashMap::new();
    for r in 0..5 {
        let payloads: Vec<serde_json::Value> = keys.iter().map(|k| json!({"r": r, "k": k})).collect();
        let kref: Vec<Option<&str>> = keys.iter().map(|k| Some(k.as_str())).collect();
        let ids = send_batch(&c, "ev", "t", &payloads, Some(&kref)).await.unwrap();
        for (k, id) in keys.iter().zip(ids) {
            sent.entry(k.clone()).or_default().push(id);
        }
    }
    let got: Arc<Mutex<HashMap<String, Vec<i64>>>> = Arc::default();
    let g = got.clone();
    let pc = Arc::new(
        PartitionedConsumer::new(&dsn, "ev", "pc", 8, move |m: Message| {
            let g = g.clone();
            async move {
                g.lock()
                    .unwrap()
                    .entry(m.partition_key().unwrap().to_string())
                    .or_default()
                    .push(m.msg_id);
                Ok(())
            }
        })
        .unwrap()
        .workers(3)
        .poll_interval(Duration::from_millis(300)),
    );
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let (sd, pc) = (sd.clone(), pc.clone());
        async move { pc.run(sd).await }
    });
    c.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    let t1 = last_tick(&c, "ev").await;
    wait_until(60, "pending of every slot at 0", || async {
        slots(&c, "ev").await.iter().all(|s| s.1 == 0 && s.2 >= t1)
    })
    .await;
    c.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    let t2 = last_tick(&c, "ev").await;
    wait_until(30, "every slot polled", || async {
        slots(&c, "ev").await.iter().all(|s| s.2 >= t2)
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();
    assert_eq!(slots(&c, "ev").await.len(), 8);
    assert_eq!(*got.lock().unwrap(), sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_worker_that_loses_its_lease_stops_processing_the_slot() {
    let (dsn, c) = test_db("consumer_lease").await;
    c.batch_execute("SELECT pgque.create_queue('ev'); SELECT pgque.subscribe_partitioned('ev', 'pc', 1)")
        .await
        .unwrap();
    let payloads: Vec<serde_json::Value> = (0..5).map(|i| json!({ "i": i })).collect();
    let ids = send_batch(&c, "ev", "t", &payloads, Some(&[Some("k"); 5]))
        .await
        .unwrap();
    let handled: Arc<Mutex<Vec<i64>>> = Arc::default();
    let go_on = Arc::new(tokio::sync::Notify::new());
    let (h2, g2) = (handled.clone(), go_on.clone());
    let pc = Arc::new(
        PartitionedConsumer::new(&dsn, "ev", "pc", 1, move |m: Message| {
            let (h2, g2) = (h2.clone(), g2.clone());
            async move {
                let first = {
                    let mut h = h2.lock().unwrap();
                    h.push(m.msg_id);
                    h.len() == 1
                };
                if first {
                    g2.notified().await; // past the 1 s lease, without renewing it
                }
                Ok(())
            }
        })
        .unwrap()
        .ttl(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(200))
        .worker_id("A"),
    );
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let (sd, pc) = (sd.clone(), pc.clone());
        async move { pc.run(sd).await }
    });
    c.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    wait_until(20, "the first event in hand", || async {
        handled.lock().unwrap().len() == 1
    })
    .await;
    wait_until(10, "A's lease to lapse", || async {
        slots(&c, "ev").await[0].3.is_none()
    })
    .await;
    let epoch: Option<i64> = c
        .query_one("SELECT pgque.claim_slot('ev', 'pc', 0, 'thief', '60 seconds')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(epoch.is_some());
    go_on.notify_one();
    wait_until(10, "A to notice", || async {
        pc.stats().lost_slots.load(std::sync::atomic::Ordering::Relaxed) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(*handled.lock().unwrap(), vec![ids[0]]);
    let rows = c
        .query(
            "SELECT msg_id FROM pgque.receive_partitioned('ev', 'pc', 0, 1, 'thief', 100)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), ids);
    sd.trigger();
    h.await.unwrap().unwrap();
    assert_eq!(*handled.lock().unwrap(), vec![ids[0]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_pause_keeps_a_failed_keys_order() {
    let (dsn, c) = test_db("consumer_pause").await;
    c.batch_execute(
        "SELECT pgque.create_queue('ev'); \
         SELECT pgque.subscribe_partitioned('ev', 'pp', 1, failure_policy => 'pause')",
    )
    .await
    .unwrap();
    let keys = ["a", "b", "a", "b", "a", "a"];
    let payloads: Vec<serde_json::Value> = (0..keys.len()).map(|i| json!({ "i": i })).collect();
    let kref: Vec<Option<&str>> = keys.iter().map(|k| Some(*k)).collect();
    let ids = send_batch(&c, "ev", "t", &payloads, Some(&kref)).await.unwrap();
    type Done = Arc<Mutex<Vec<(String, i64)>>>;
    let done: Done = Arc::default();
    let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (d, f, first) = (done.clone(), failed_once.clone(), ids[0]);
    let pc = Arc::new(
        PartitionedConsumer::new(&dsn, "ev", "pp", 1, move |m: Message| {
            let (d, f) = (d.clone(), f.clone());
            async move {
                if m.msg_id == first && !f.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    return Err("a's first event fails once".into());
                }
                d.lock()
                    .unwrap()
                    .push((m.partition_key().unwrap().to_string(), m.msg_id));
                Ok(())
            }
        })
        .unwrap()
        .failure_policy("pause", "resume")
        .poll_interval(Duration::from_millis(200))
        .retry_after(Duration::ZERO),
    );
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let (sd, pc) = (sd.clone(), pc.clone());
        async move { pc.run(sd).await }
    });
    c.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    wait_until(30, "every event handled", || async {
        done.lock().unwrap().len() == keys.len()
    })
    .await;
    sd.trigger();
    h.await.unwrap().unwrap();
    let done = done.lock().unwrap().clone();
    let of = |k: &str| -> Vec<i64> { done.iter().filter(|d| d.0 == k).map(|d| d.1).collect() };
    assert_eq!(of("a"), vec![ids[0], ids[2], ids[4], ids[5]]);
    assert_eq!(of("b"), vec![ids[1], ids[3]]);
    // The policy is the consumer's: a skip consumer of that name is refused.
    let skip = Arc::new(PartitionedConsumer::new(&dsn, "ev", "pp", 1, |_m: Message| async { Ok(()) }).unwrap());
    let err = skip.run(Shutdown::new()).await.unwrap_err();
    assert!(
        format!("{err:?}").contains("22023") || format!("{err}").contains("policy"),
        "{err:?}"
    );
}

/// An operator's online resize: begin, wait until every old slot drained, complete.
async fn resize(c: &tokio_postgres::Client, q: &str, new_n: i32) {
    c.execute("SELECT pgque.begin_resize($1, 'pc', $2)", &[&q, &new_n])
        .await
        .unwrap();
    wait_until(60, "the old slots to drain", || async {
        c.query_one("SELECT bool_and(ready) FROM pgque.resize_ready($1, 'pc')", &[&q])
            .await
            .unwrap()
            .get::<_, bool>(0)
    })
    .await;
    let n: i32 = c
        .query_one("SELECT pgque.complete_resize($1, 'pc')", &[&q])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, new_n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_follows_an_online_resize_without_a_restart() {
    let (dsn, c) = test_db("consumer_resize").await;
    c.batch_execute("SELECT pgque.create_queue('ev'); SELECT pgque.subscribe_partitioned('ev', 'pc', 4)")
        .await
        .unwrap();
    let keys: Vec<String> = (0..30).map(|k| format!("key-{k}")).collect();
    let sent: Arc<Mutex<HashMap<String, Vec<i64>>>> = Arc::default();
    let send_round = |r: i32| {
        let (keys, sent, c) = (keys.clone(), sent.clone(), &c);
        async move {
            let payloads: Vec<serde_json::Value> = keys.iter().map(|k| json!({"r": r, "k": k})).collect();
            let kref: Vec<Option<&str>> = keys.iter().map(|k| Some(k.as_str())).collect();
            let ids = send_batch(c, "ev", "t", &payloads, Some(&kref)).await.unwrap();
            let mut s = sent.lock().unwrap();
            for (k, id) in keys.iter().zip(ids) {
                s.entry(k.clone()).or_default().push(id);
            }
        }
    };
    let got: Arc<Mutex<HashMap<String, Vec<i64>>>> = Arc::default();
    let g = got.clone();
    let pc = Arc::new(
        PartitionedConsumer::new(&dsn, "ev", "pc", 4, move |m: Message| {
            let g = g.clone();
            async move {
                g.lock()
                    .unwrap()
                    .entry(m.partition_key().unwrap().to_string())
                    .or_default()
                    .push(m.msg_id);
                Ok(())
            }
        })
        .unwrap()
        .workers(3)
        .poll_interval(Duration::from_millis(200)),
    );
    let sd = Shutdown::new();
    let h = tokio::spawn({
        let (sd, pc) = (sd.clone(), pc.clone());
        async move { pc.run(sd).await }
    });
    let all_handled = || async {
        let n: usize = got.lock().unwrap().values().map(Vec::len).sum();
        let m: usize = sent.lock().unwrap().values().map(Vec::len).sum();
        n == m
    };
    for r in 0..3 {
        send_round(r).await;
    }
    resize(&c, "ev", 8).await; // grow while the events before the seal are consumed
    for r in 3..6 {
        send_round(r).await;
    }
    c.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    wait_until(60, "every event handled after the grow", all_handled).await;
    assert_eq!(pc.n(), 8);
    for r in 6..9 {
        send_round(r).await;
    }
    resize(&c, "ev", 2).await; // shrink
    send_round(9).await;
    c.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    wait_until(60, "every event handled after the shrink", all_handled).await;
    assert_eq!(pc.n(), 2);
    sd.trigger();
    h.await.unwrap().unwrap();
    assert_eq!(slots(&c, "ev").await.len(), 2);
    assert_eq!(
        *got.lock().unwrap(),
        *sent.lock().unwrap(),
        "every key in send order, none lost or twice"
    );
}

/// Two members of one cooperative consumer (`Consumer::cooperative`,
/// `pgque.receive_coop`) share its stream: every event handled once by one
/// of them, a nack redelivered, and a normal consumer beside them still
/// gets every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cooperative_members_share_the_stream() {
    let (dsn, c) = test_db("consumer_coop").await;
    c.batch_execute("SELECT pgque.create_queue('ev'); SELECT pgque.subscribe('ev', 'all')")
        .await
        .unwrap();
    type Seen = Arc<Mutex<Vec<(String, i64, Option<i32>)>>>;
    let seen: Seen = Arc::default();
    let member = |name: &str| {
        let (s, sub, name) = (seen.clone(), name.to_string(), name.to_string());
        Arc::new(
            Consumer::new(&dsn, "ev", "group", move |m: Message| {
                let (s, name) = (s.clone(), name.clone());
                async move {
                    if m.json()?["i"] == 7 && m.retry_count.is_none() {
                        return Err("first delivery of 7 fails".into());
                    }
                    s.lock().unwrap().push((name, m.msg_id, m.retry_count));
                    // a slow handler, so the other member gets batches too
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(())
                }
            })
            .unwrap()
            .cooperative(sub)
            .batch_size(5)
            .poll_interval(Duration::from_millis(100))
            .retry_after(Duration::ZERO),
        )
    };
    let (m1, m2) = (member("m1"), member("m2"));
    let sd = Shutdown::new();
    let runs: Vec<_> = [m1, m2]
        .into_iter()
        .map(|m| {
            let sd = sd.clone();
            tokio::spawn(async move { m.run(sd).await })
        })
        .collect();
    wait_until(10, "both members registered", || async {
        c.query_one("SELECT count(*) FROM pgque.get_consumer_info('ev')", &[])
            .await
            .map(|r| r.get::<_, i64>(0) >= 2)
            .unwrap_or(false)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut ids = Vec::new();
    for r in 0..8 {
        let payloads: Vec<serde_json::Value> = (0..5).map(|i| json!({ "i": r * 5 + i })).collect();
        ids.extend(send_batch(&c, "ev", "t", &payloads, None).await.unwrap());
        c.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    }
    wait_until(60, "every event handled", || async { seen.lock().unwrap().len() == 40 }).await;
    sd.trigger();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    let mut handled: Vec<i64> = seen.iter().map(|s| s.1).collect();
    handled.sort();
    assert_eq!(handled, ids, "each event handled exactly once by the group");
    assert!(seen.contains(&("m1".into(), ids[7], Some(1))) || seen.contains(&("m2".into(), ids[7], Some(1))));
    let by = |n: &str| seen.iter().filter(|s| s.0 == n).count();
    assert!(
        by("m1") > 0 && by("m2") > 0,
        "both members got batches: m1 {} m2 {}",
        by("m1"),
        by("m2")
    );
    // the normal consumer beside the group still has all 40 waiting
    c.execute("SELECT pgque.force_tick('ev')", &[]).await.unwrap();
    let mut all = 0;
    loop {
        let rows = c
            .query("SELECT batch_id FROM pgque.receive('ev', 'all', 1000)", &[])
            .await
            .unwrap();
        if rows.is_empty() {
            break;
        }
        all += rows.len();
        c.execute("SELECT pgque.ack($1)", &[&rows[0].get::<_, i64>(0)])
            .await
            .unwrap();
    }
    assert!(all >= 40, "the normal consumer got {all}");
}
