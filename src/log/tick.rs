//! Ticks: (tick id, time, pg_current_snapshot(), last event id) per queue.
//!
//! The ticker is adaptive: a queue whose event sequence moved since its last
//! tick is ticked at once (the worker calls `ticker()` right after a send
//! commits, and every `pgque.tick_period_ms`); an idle queue is ticked only
//! every `ticker_idle_period`. Detecting new events reads the sequence's
//! last value (`pg_sequence_last_value`), never the event table.
//!
//! A sequence moves when ids are *taken*, before the sender commits: a tick
//! taken between a sender's nextval and its commit records the new sequence
//! value but cannot see the event. Such a tick is "pending" (tick_pending =
//! its snapshot's xmax); the ticker ticks again once every transaction that
//! was running then has finished (snapshot xmin >= tick_pending), or at the
//! latest after ticker_max_lag, so the event is delivered without waiting for
//! the idle period.
use super::spi::{col, exec, first_row};
use pgrx::spi::SpiClient;

#[derive(Debug, Clone)]
pub struct TickRow {
    pub id: i64,
}

/// How the new tick's `tick_pending` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending {
    None,
    /// This tick took new event ids: pending until its snapshot's xmax.
    New,
    /// Carry the previous, unresolved, pending xid (text form of xid8).
    Keep(String),
}

/// What the ticker knows about a queue when deciding to tick.
#[derive(Debug, Clone, Default)]
pub struct TickState {
    pub paused: bool,
    pub has_last: bool,
    pub seq_now: i64,
    pub last_seq: i64,
    pub lag_ms: f64,
    pub max_count: i64,
    pub max_lag_ms: f64,
    pub idle_ms: f64,
    pub pending: bool,
    pub pending_resolved: bool,
}

/// The tick decision, as pure logic. Returns the pending mode of the tick to
/// make, or None for "no tick".
pub fn decide(s: &TickState, force: bool) -> Option<Pending> {
    let new_ids = s.has_last && s.seq_now > s.last_seq;
    let pending_mode = || {
        if new_ids {
            Pending::New
        } else if s.pending && !s.pending_resolved {
            Pending::Keep(String::new())
        } else {
            Pending::None
        }
    };
    if force {
        return Some(pending_mode());
    }
    if s.paused {
        return None;
    }
    if !s.has_last {
        return Some(Pending::None);
    }
    // New event ids since the last tick: tick now (ticker_max_count and
    // ticker_max_lag are upper bounds on how long events wait; ticking at
    // once is within both).
    if new_ids {
        return Some(Pending::New);
    }
    if s.pending && (s.pending_resolved || s.lag_ms >= s.max_lag_ms) {
        return Some(pending_mode());
    }
    if s.lag_ms >= s.idle_ms {
        return Some(pending_mode());
    }
    None
}

/// The queue's latest tick.
pub fn last_tick(client: &mut SpiClient<'_>, qid: i32) -> Option<TickRow> {
    let t = exec(
        client,
        "SELECT tick_id FROM pgque.tick WHERE tick_queue = $1 ORDER BY tick_id DESC LIMIT 1",
        &[qid.into()],
    );
    first_row(t).map(|r| TickRow {
        id: col(&r, 1).unwrap(),
    })
}

/// A tick's snapshot (text form), if the tick exists.
pub fn tick_snapshot(client: &mut SpiClient<'_>, qid: i32, tick_id: i64) -> Option<String> {
    let t = exec(
        client,
        "SELECT tick_snapshot::text FROM pgque.tick WHERE tick_queue = $1 AND tick_id = $2 LIMIT 1",
        &[qid.into(), tick_id.into()],
    );
    first_row(t).map(|r| col(&r, 1).unwrap())
}

/// The snapshots (text form) of two ticks of a queue, each None when that
/// tick does not exist; one statement.
pub fn tick_snapshots(
    client: &mut SpiClient<'_>,
    qid: i32,
    a: i64,
    b: i64,
) -> (Option<String>, Option<String>) {
    let t = exec(
        client,
        "SELECT (SELECT tick_snapshot::text FROM pgque.tick WHERE tick_queue = $1 AND tick_id = $2 LIMIT 1), \
                (SELECT tick_snapshot::text FROM pgque.tick WHERE tick_queue = $1 AND tick_id = $3 LIMIT 1)",
        &[qid.into(), a.into(), b.into()],
    );
    let r = first_row(t).expect("one row");
    (col(&r, 1), col(&r, 2))
}

/// Inserts a tick now and NOTIFYs `pgque_<queue>` with its id.
pub fn insert_tick(
    client: &mut SpiClient<'_>,
    qid: i32,
    qname: &str,
    seq: i64,
    pending: Pending,
) -> i64 {
    try_insert_tick(client, qid, qname, seq, pending, true)
        .expect("tick after waiting for the lock")
}

/// Inserts a tick; with `wait` false, skips the queue (None) when another
/// transaction holds its row lock (an open transaction that ticked it by
/// hand must not stall the worker's ticker for every queue).
pub fn try_insert_tick(
    client: &mut SpiClient<'_>,
    qid: i32,
    qname: &str,
    seq: i64,
    pending: Pending,
    wait: bool,
) -> Option<i64> {
    // Ticks of one queue are serialized on its row, so tick ids and
    // snapshots grow together even when the worker and a manual ticker()
    // run at once (the INSERT below takes its snapshot after this lock).
    let locked = if wait {
        exec(
            client,
            "SELECT 1 FROM pgque.queue WHERE queue_id = $1 FOR NO KEY UPDATE",
            &[qid.into()],
        )
    } else {
        exec(
            client,
            "SELECT 1 FROM pgque.queue WHERE queue_id = $1 FOR NO KEY UPDATE SKIP LOCKED",
            &[qid.into()],
        )
    };
    if locked.is_empty() {
        return None;
    }
    let (mode, keep): (i32, Option<String>) = match pending {
        Pending::None => (0, None),
        Pending::New => (1, None),
        Pending::Keep(x) => (2, Some(x)),
    };
    // The tick's snapshot must count this transaction as still running:
    // pg_current_snapshot() leaves the current xid out of its xip list, so
    // once any later xid has committed (xmax beyond ours) our own events
    // would look committed "before" this tick, and the next batch (which
    // takes what the previous tick could not see) would skip them for good.
    // That hit create_queue + send in one transaction, a manual tick after a
    // send, and maint_retry_events' tick after moving retries back.
    let t = exec(
        client,
        "WITH s AS ( \
           SELECT CASE WHEN x IS NULL OR x >= pg_snapshot_xmax(c) \
                            OR x IN (SELECT pg_snapshot_xip(c)) THEN c \
                       ELSE (CASE WHEN x < pg_snapshot_xmin(c) THEN x ELSE pg_snapshot_xmin(c) END::text \
                             || ':' || pg_snapshot_xmax(c)::text || ':' || \
                             array_to_string(ARRAY(SELECT u FROM (SELECT pg_snapshot_xip(c) AS u UNION SELECT x) z \
                                                   ORDER BY u), ','))::pg_snapshot \
                  END AS snap \
             FROM (SELECT pg_current_snapshot() AS c, pg_current_xact_id_if_assigned() AS x) v), \
         t AS ( \
           INSERT INTO pgque.tick (tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq, tick_pending, piece) \
           SELECT $1, nextval('pgque.tick_id_seq'), now(), s.snap, $2, \
                  CASE $3 WHEN 1 THEN pg_snapshot_xmax(s.snap) \
                          WHEN 2 THEN $4::xid8 END, \
                  (SELECT cur_piece FROM pgque.meta_state) \
             FROM s \
           RETURNING tick_id) \
         SELECT tick_id, pg_notify('pgque_' || $5, tick_id::text) FROM t",
        &[
            qid.into(),
            seq.into(),
            mode.into(),
            keep.into(),
            qname.into(),
        ],
    );
    // Consumers waiting in receive(q, c, n, wait) look again at the commit.
    crate::wake::ticked_at_commit(qid);
    col(&first_row(t).expect("tick"), 1)
}

thread_local! {
    /// When this backend last probed each queue (milliseconds since epoch).
    static PROBED: std::cell::RefCell<std::collections::HashMap<i32, u128>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// At most one probe per queue per ticker_max_lag in this backend.
fn probe_due(qid: i32, max_lag_ms: f64) -> bool {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    PROBED.with(|m| {
        let mut m = m.borrow_mut();
        let last = m.get(&qid).copied().unwrap_or(0);
        if now.saturating_sub(last) as f64 >= max_lag_ms.max(1.0) {
            m.insert(qid, now);
            true
        } else {
            false
        }
    })
}

/// True when a committed event exists that `snapshot` (the last tick's)
/// does not cover.
pub fn uncovered_events(client: &mut SpiClient<'_>, qid: i32, snapshot: &str) -> bool {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM {t} WHERE ev_txid >= pg_snapshot_xmax($1::pg_snapshot)) \
             OR EXISTS (SELECT 1 FROM {t} WHERE ev_txid = ANY (ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot))))",
        t = super::queue::event_parent(qid)
    );
    let t = exec(client, &sql, &[snapshot.into()]);
    col(&first_row(t).unwrap(), 1).unwrap_or(false)
}

const STATE_SQL: &str = "SELECT q.queue_id, q.queue_name, q.queue_ticker_paused, \
        q.queue_ticker_max_count::int8, \
        (extract(epoch FROM q.queue_ticker_max_lag) * 1000)::float8, \
        (extract(epoch FROM q.queue_ticker_idle_period) * 1000)::float8, \
        coalesce(pg_sequence_last_value(q.queue_event_seq::regclass), 0), \
        t.tick_id IS NOT NULL, coalesce(t.tick_event_seq, 0), \
        coalesce((extract(epoch FROM now() - t.tick_time) * 1000)::float8, 0), \
        t.tick_pending IS NOT NULL, \
        coalesce(pg_snapshot_xmin(pg_current_snapshot()) >= t.tick_pending, false), \
        t.tick_pending::text, t.tick_snapshot::text \
   FROM pgque.queue q \
   LEFT JOIN LATERAL (SELECT * FROM pgque.tick t WHERE t.tick_queue = q.queue_id \
                      ORDER BY t.tick_id DESC LIMIT 1) t ON true";

/// A forced tick's tick_pending: FirstNormalTransactionId, which every
/// snapshot's xmin has passed, so the next ticker() finds the pending tick
/// resolved and ticks the queue again (force_next_tick's contract). Events of
/// senders still running then are found by the ticker's probe at the latest
/// after ticker_max_lag, as for any tick.
const FORCED_PENDING: &str = "3";

/// Ticks every queue that needs it (or only `only`, or forced); returns the
/// ticks made as (queue_id, tick_id).
pub fn run_ticker(client: &mut SpiClient<'_>, only: Option<i32>, force: bool) -> Vec<(i32, i64)> {
    let sql_all = format!("{STATE_SQL} ORDER BY q.queue_id");
    let sql_one = format!("{STATE_SQL} WHERE q.queue_id = $1");
    let t = match only {
        Some(qid) => exec(client, &sql_one, &[qid.into()]),
        None => exec(client, &sql_all, &[]),
    };
    let mut todo = vec![];
    let mut probes = vec![];
    for r in t {
        let st = TickState {
            paused: col(&r, 3).unwrap(),
            max_count: col(&r, 4).unwrap(),
            max_lag_ms: col(&r, 5).unwrap(),
            idle_ms: col(&r, 6).unwrap(),
            seq_now: col(&r, 7).unwrap(),
            has_last: col(&r, 8).unwrap(),
            last_seq: col(&r, 9).unwrap(),
            lag_ms: col(&r, 10).unwrap(),
            pending: col(&r, 11).unwrap(),
            pending_resolved: col(&r, 12).unwrap(),
        };
        let qid: i32 = col(&r, 1).unwrap();
        if let Some(mut p) = decide(&st, force) {
            if force {
                p = Pending::Keep(FORCED_PENDING.to_string());
            } else if let Pending::Keep(ref mut x) = p {
                *x = col::<String>(&r, 13).unwrap_or_default();
            }
            let name: String = col(&r, 2).unwrap();
            todo.push((qid, name, st.seq_now, p));
        } else if !st.paused
            && st.has_last
            && st.lag_ms >= st.max_lag_ms
            && probe_due(qid, st.max_lag_ms)
        {
            // Events that took no new sequence value (retries moved back by
            // maint) or whose id was taken just before the last tick's
            // snapshot but committed after its follow-up: look for committed
            // events the last tick does not cover (an index probe).
            if let Some(snap) = col::<String>(&r, 14) {
                probes.push((qid, col::<String>(&r, 2).unwrap(), st.seq_now, snap));
            }
        }
    }
    for (qid, name, seq, snap) in probes {
        if uncovered_events(client, qid, &snap) {
            todo.push((qid, name, seq, Pending::None));
        }
    }
    todo.into_iter()
        .filter_map(|(qid, name, seq, p)| {
            try_insert_tick(client, qid, &name, seq, p, force).map(|t| (qid, t))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> TickState {
        TickState {
            has_last: true,
            seq_now: 10,
            last_seq: 10,
            lag_ms: 50.0,
            max_count: 500,
            max_lag_ms: 3000.0,
            idle_ms: 60000.0,
            ..Default::default()
        }
    }

    #[test]
    fn idle_queue_is_not_ticked_until_idle_period() {
        assert_eq!(decide(&base(), false), None);
        let s = TickState {
            lag_ms: 60000.0,
            ..base()
        };
        assert_eq!(decide(&s, false), Some(Pending::None));
    }

    #[test]
    fn new_events_tick_at_once_and_mark_pending() {
        let s = TickState {
            seq_now: 11,
            lag_ms: 1.0,
            ..base()
        };
        assert_eq!(decide(&s, false), Some(Pending::New));
    }

    #[test]
    fn paused_queue_is_ticked_only_by_force() {
        let s = TickState {
            paused: true,
            seq_now: 99,
            ..base()
        };
        assert_eq!(decide(&s, false), None);
        assert_eq!(decide(&s, true), Some(Pending::New));
    }

    #[test]
    fn pending_tick_is_followed_up_when_resolved_or_after_max_lag() {
        let unresolved = TickState {
            pending: true,
            ..base()
        };
        assert_eq!(decide(&unresolved, false), None);
        let resolved = TickState {
            pending_resolved: true,
            ..unresolved.clone()
        };
        assert_eq!(decide(&resolved, false), Some(Pending::None));
        let late = TickState {
            lag_ms: 3000.0,
            ..unresolved
        };
        assert_eq!(decide(&late, false), Some(Pending::Keep(String::new())));
    }

    #[test]
    fn first_tick_is_always_made() {
        let s = TickState {
            has_last: false,
            ..base()
        };
        assert_eq!(decide(&s, false), Some(Pending::None));
    }
}
