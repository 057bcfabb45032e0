//! A consumer that fell behind reads batches that follow ticks: each batch
//! reaches the furthest tick within max_return events, so no tick range is
//! re-read for every capped cut of it.
mod events_util;
use events_util::*;
use pgque_pg_test::*;

#[test]
fn lagging_consumer_reads_tick_aligned_batches() {
    let db = manual_db("ev_ranges");
    let mut c = db.connect();
    c.batch_execute("SELECT pgque.create_queue('q'); SELECT pgque.subscribe('q', 'c')")
        .unwrap();
    // Three ticks of 40 events each.
    for _ in 0..3 {
        c.execute(
            "SELECT pgque.send_batch('q', array_fill('x'::text, ARRAY[40]))",
            &[],
        )
        .unwrap();
        tick(&mut c, "q");
    }
    // 100 fits two ticks (80 events), not three: the batch ends at a tick.
    let (b1, ids1) = recv(&mut c, "q", "c", 100);
    assert_eq!(ids1.len(), 80);
    let ceiling: Option<i64> = c
        .query_one(
            "SELECT ev_ceiling FROM pgque.batch WHERE batch_id = $1",
            &[&b1.unwrap()],
        )
        .unwrap()
        .get(0);
    assert_eq!(ceiling, None, "a tick-aligned batch needs no id cut");
    ack(&mut c, b1.unwrap());
    let (b2, ids2) = recv(&mut c, "q", "c", 100);
    assert_eq!(ids2.len(), 40);
    ack(&mut c, b2.unwrap());
    // One tick bigger than max_return is still cut by id: 40 = 30 + 10.
    c.execute(
        "SELECT pgque.send_batch('q', array_fill('y'::text, ARRAY[40]))",
        &[],
    )
    .unwrap();
    tick(&mut c, "q");
    let (b3, ids3) = recv(&mut c, "q", "c", 30);
    assert_eq!(ids3.len(), 30);
    ack(&mut c, b3.unwrap());
    let (b4, ids4) = recv(&mut c, "q", "c", 30);
    assert_eq!(ids4.len(), 10);
    ack(&mut c, b4.unwrap());
    let mut all = [ids1, ids2, ids3, ids4].concat();
    let n = all.len();
    all.dedup();
    assert_eq!(all.len(), n, "no event twice");
    assert!(all.windows(2).all(|w| w[0] < w[1]), "in id order");
    assert_eq!(recv(&mut c, "q", "c", 100), (None, vec![]));
}
