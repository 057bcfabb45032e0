//! The worker pool: any number of databases served by a bounded number of
//! worker processes (`pgque.max_workers`, or as many as PostgreSQL's
//! `max_worker_processes` leaves), as autovacuum's launcher serves every
//! database with `autovacuum_max_workers`.
//!
//! A database holds a process only while it has work. A worker that has
//! been idle for `pgque.worker_idle_exit`, or is idle while another
//! database waits for a process, parks: it writes the time its next duty is
//! due (pgque.duty_due()) into the demand table and exits. A busy worker
//! whose database has had its process for `pgque.worker_turn` while
//! another database *with work* waits (a producer committed there, or its
//! consumers claim jobs) parks too, asking to come back at once, so busy
//! databases take turns rather than starve. A database that is only due
//! (housekeeping, an idle tick, the launcher's first look at a database
//! that may not even have pgque) never takes a busy database's process: it
//! waits for an idle one or a free slot. A producer's commit in a database
//! without a process asks for one (shmem::want_worker) and sets the
//! launcher's latch; the launcher starts workers for the databases that
//! want one, the longest-waiting first, then for those whose due time has
//! come, within the bound.
//!
//! This module holds the demand table's rules, kept apart from shared
//! memory and processes so they are tested as plain functions.

/// One database without a worker process that will want one. Times are
/// TimestampTz (microseconds since 2000-01-01); 0 = not set.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// 0 = free entry.
    pub db_oid: u32,
    /// Wants a worker now, since this time (a producer's commit, a busy
    /// database's turn, start()). The launcher's first look at a database
    /// is a due time of now instead: no wait for an extension to appear.
    pub wanted_since: i64,
    /// Wants one at this time (its next duty, as its last worker read it).
    pub due_at: i64,
    /// When the launcher last asked PostgreSQL for a worker for it.
    pub starting_at: i64,
    /// Put here by a worker that parked (shmem::park_worker): the worker
    /// started for its due time only runs what is due and parks again. Any
    /// other entry (the launcher's first look at a database, after a server
    /// start or a crash has rebuilt shared memory) gets a resident worker.
    pub parked: bool,
}

impl Demand {
    pub const EMPTY: Demand = Demand {
        db_oid: 0,
        wanted_since: 0,
        due_at: 0,
        starting_at: 0,
        parked: false,
    };

    /// Since when this database waits for a worker at `now`; None: it does not.
    pub fn waiting_since(&self, now: i64) -> Option<i64> {
        if self.db_oid == 0 {
            return None;
        }
        let due = (self.due_at != 0 && self.due_at <= now).then_some(self.due_at);
        let wanted = (self.wanted_since != 0).then_some(self.wanted_since);
        match (wanted, due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the launcher asked for a worker for it within `grace` of `now`
    /// (the worker has not taken its slot yet: asking again would start a
    /// second one, which would only see the slot taken and leave).
    pub fn starting(&self, now: i64, grace: i64) -> bool {
        self.starting_at != 0 && now - self.starting_at < grace
    }

    /// Whether the worker that takes this entry is a due start (runs what
    /// is due, parks again when idle): only for a database its last worker
    /// parked, not wanted since. A database the launcher only looked at
    /// (new to this shared memory: after a restart or a crash every
    /// database is) gets a worker that stays, as after CREATE EXTENSION.
    pub fn due_only(&self) -> bool {
        self.db_oid != 0 && self.parked && self.wanted_since == 0
    }
}

/// How long the launcher waits for a worker it started to take its slot
/// before it asks again (a worker that failed to start, say).
pub const START_GRACE_US: i64 = 5_000_000;

/// Records `db_oid`'s demand: due at `due_at` (0: keep what is known) and,
/// with `wanted`, wanted since then (an earlier request is kept). False when
/// the table is full.
pub fn put(table: &mut [Demand], db_oid: u32, due_at: i64, wanted: Option<i64>) -> bool {
    let idx = match table.iter().position(|d| d.db_oid == db_oid) {
        Some(i) => i,
        None => match table.iter().position(|d| d.db_oid == 0) {
            Some(i) => {
                table[i] = Demand {
                    db_oid,
                    ..Demand::EMPTY
                };
                i
            }
            None => return false,
        },
    };
    let d = &mut table[idx];
    if due_at != 0 {
        d.due_at = due_at;
    }
    if let Some(t) = wanted {
        if d.wanted_since == 0 {
            d.wanted_since = t;
        }
    }
    true
}

/// Whether `db_oid` has a pending request for a worker now.
pub fn is_wanted(table: &[Demand], db_oid: u32) -> bool {
    table
        .iter()
        .any(|d| d.db_oid == db_oid && d.wanted_since != 0)
}

/// Drops `db_oid`'s entry: its worker took its slot, or it is gone.
/// Returns the entry as it was (None: there was none).
pub fn forget(table: &mut [Demand], db_oid: u32) -> Option<Demand> {
    let mut was = None;
    for d in table.iter_mut().filter(|d| d.db_oid == db_oid) {
        was = Some(*d);
        *d = Demand::EMPTY;
    }
    was
}

/// The databases to start a worker for at `now`: those wanted now (a
/// commit, a turn) the longest-waiting first, then those only due, the
/// longest-due first; at most `room` of them, each with whether it is
/// wanted. Databases being started are skipped.
pub fn pick(table: &[Demand], now: i64, room: usize) -> Vec<(u32, bool)> {
    let mut waiting: Vec<(bool, i64, u32)> = table
        .iter()
        .filter(|d| !d.starting(now, START_GRACE_US))
        .filter_map(|d| {
            d.waiting_since(now)
                .map(|since| (d.wanted_since == 0, since, d.db_oid))
        })
        .collect();
    waiting.sort_unstable();
    waiting
        .into_iter()
        .take(room)
        .map(|(due_only, _, oid)| (oid, !due_only))
        .collect()
}

/// How many databases wait at `now` with no worker being started for them,
/// and how many of those are wanted (have work now).
pub fn waiting_counts(table: &[Demand], now: i64) -> (usize, usize) {
    table
        .iter()
        .filter(|d| !d.starting(now, START_GRACE_US) && d.waiting_since(now).is_some())
        .fold((0, 0), |(n, w), d| {
            (n + 1, w + (d.wanted_since != 0) as usize)
        })
}

/// Whether some database waits at `now` with no worker being started for it.
pub fn any_waiting(table: &[Demand], now: i64) -> bool {
    table
        .iter()
        .any(|d| !d.starting(now, START_GRACE_US) && d.waiting_since(now).is_some())
}

/// The earliest future due time in the table (when the launcher must look
/// again without being signalled).
pub fn next_due(table: &[Demand], now: i64) -> Option<i64> {
    table
        .iter()
        .filter(|d| d.db_oid != 0 && d.due_at > now)
        .map(|d| d.due_at)
        .min()
}

/// How many more workers the pool may start: None when pgque sets no bound
/// (PostgreSQL's worker slots do); `starting` counts those asked for but not
/// yet running.
pub fn room(max_workers: Option<usize>, running: usize, starting: usize) -> usize {
    match max_workers {
        None => usize::MAX,
        Some(max) => max.saturating_sub(running + starting),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<Demand> {
        vec![Demand::EMPTY; 4]
    }

    #[test]
    fn a_request_keeps_its_first_time_and_a_due_time_is_updated() {
        let mut t = table();
        assert!(put(&mut t, 7, 0, Some(100)));
        assert!(put(&mut t, 7, 0, Some(200)));
        assert!(put(&mut t, 7, 5_000, None));
        let d = t.iter().find(|d| d.db_oid == 7).unwrap();
        assert_eq!((d.wanted_since, d.due_at), (100, 5_000));
        assert!(is_wanted(&t, 7));
        assert!(!is_wanted(&t, 8));
        assert!(forget(&mut t, 7).is_some());
        assert!(t.iter().all(|d| d.db_oid == 0));
        assert_eq!(forget(&mut t, 7), None);
    }

    #[test]
    fn only_a_parked_database_not_wanted_since_gets_a_due_start() {
        let mut t = table();
        // the launcher's first look (server start, crash restart): resident
        put(&mut t, 1, 500, None);
        assert!(!t[0].due_only());
        // a worker parked with its next due time: due start
        put(&mut t, 2, 900, None);
        t[1].parked = true;
        assert!(t[1].due_only());
        // ... until a producer commits there: resident again
        put(&mut t, 2, 0, Some(950));
        assert!(!t[1].due_only());
    }

    #[test]
    fn a_full_table_refuses_a_new_database_but_updates_a_known_one() {
        let mut t = table();
        for oid in 1..=4 {
            assert!(put(&mut t, oid, 10, None));
        }
        assert!(!put(&mut t, 5, 10, None));
        assert!(put(&mut t, 3, 20, None));
    }

    #[test]
    fn only_wanted_or_due_databases_wait() {
        let mut t = table();
        put(&mut t, 1, 1_000, None); // due later
        put(&mut t, 2, 500, None); // due now
        put(&mut t, 3, 0, Some(900)); // wanted
        assert_eq!(t[0].waiting_since(600), None);
        assert_eq!(t[1].waiting_since(600), Some(500));
        assert_eq!(t[2].waiting_since(600), Some(900));
        // the wanted one first, though the due one waits longer
        assert_eq!(pick(&t, 600, 10), vec![(3, true), (2, false)]);
        assert_eq!(waiting_counts(&t, 600), (2, 1));
        assert_eq!(next_due(&t, 600), Some(1_000));
        assert!(any_waiting(&t, 600));
    }

    #[test]
    fn wanted_databases_start_first_then_due_ones_each_longest_waiting_first() {
        let mut t = table();
        put(&mut t, 1, 0, Some(300));
        put(&mut t, 2, 0, Some(100));
        put(&mut t, 3, 200, None);
        put(&mut t, 4, 150, None);
        assert_eq!(pick(&t, 1_000, 2), vec![(2, true), (1, true)]);
        assert_eq!(
            pick(&t, 1_000, 4),
            vec![(2, true), (1, true), (4, false), (3, false)]
        );
        assert_eq!(pick(&t, 1_000, 0), vec![]);
    }

    #[test]
    fn a_database_being_started_is_not_started_twice_until_the_grace_passes() {
        let mut t = table();
        put(&mut t, 1, 0, Some(100));
        t[0].starting_at = 1_000;
        assert_eq!(pick(&t, 2_000, 5), vec![]);
        assert!(!any_waiting(&t, 2_000));
        assert_eq!(pick(&t, 1_000 + START_GRACE_US, 5), vec![(1, true)]);
    }

    #[test]
    fn room_follows_the_bound() {
        assert_eq!(room(None, 50, 3), usize::MAX);
        assert_eq!(room(Some(4), 2, 1), 1);
        assert_eq!(room(Some(4), 4, 1), 0);
    }
}
