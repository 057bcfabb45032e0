//! What the schedule tests share: the fired slots read back from the jobs.
#![allow(dead_code)]
use pgque_pg_test::postgres::Client;
use std::collections::BTreeMap;

/// Per kind: the slot times (Unix seconds) of its jobs, in job id order.
pub fn slots_by_kind(c: &mut Client) -> BTreeMap<String, Vec<i64>> {
    let mut m: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in c
        .query(
            "SELECT kind, extract(epoch FROM (args->>'scheduled_for')::timestamptz)::bigint
               FROM pgque.all_jobs ORDER BY id",
            &[],
        )
        .unwrap()
    {
        m.entry(r.get(0)).or_default().push(r.get(1));
    }
    m
}

/// Asserts `slots` are exactly every second from its first to its last, in
/// order: none twice, none missing.
pub fn assert_every_second_once(kind: &str, slots: &[i64]) {
    assert!(!slots.is_empty(), "{kind}: no job fired");
    for w in slots.windows(2) {
        assert!(
            w[1] == w[0] + 1,
            "{kind}: slot {} followed by {} (a duplicate or a gap): {slots:?}",
            w[0],
            w[1]
        );
    }
}
