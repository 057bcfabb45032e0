//! The last few minutes of pgque.metrics(), sampled by a background task, for
//! the charts and the throughput figures (rates need two points in time;
//! PostgreSQL keeps counts, not histories).
use crate::db::Metric;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

/// (metric name, labels) as one key.
pub type Key = (String, BTreeMap<String, String>);

/// One series: its points inside the window, and the sample it was last in.
struct Series {
    points: VecDeque<(f64, f64)>,
    last_seen: u64,
}

/// The last `cap` samples of at most `max_series` series. Each consumer,
/// queue, slot and duty is a series, and consumers are created by any
/// pgque_reader: past `max_series`, a new series takes the place of the one
/// seen least recently that is gone from the newest sample, and when every
/// kept series is still live the new one is not charted (counted in
/// `dropped`). Live charts keep their history through a flood of new names.
pub struct History {
    cap: usize,
    max_series: usize,
    times: VecDeque<f64>,
    seq: u64,
    series: HashMap<Key, Series>,
    dropped: u64,
}

/// The wall clock in Unix seconds: samples' time stamps.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The key of a series: a metric name and its labels.
pub fn key(name: &str, labels: &[(&str, &str)]) -> Key {
    (
        name.to_string(),
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

impl History {
    /// Keeps `cap` samples (at least 2) of at most `max_series` series (at
    /// least 1).
    pub fn new(cap: usize, max_series: usize) -> History {
        History {
            cap: cap.max(2),
            max_series: max_series.max(1),
            times: VecDeque::new(),
            seq: 0,
            series: HashMap::new(),
            dropped: 0,
        }
    }

    /// Adds a sample taken at `at`: the oldest sample leaves the window,
    /// series with no point left in it are forgotten, and new series are
    /// admitted up to the cap (above).
    pub fn push(&mut self, at: f64, metrics: &[Metric]) {
        self.seq += 1;
        let seq = self.seq;
        self.times.push_back(at);
        while self.times.len() > self.cap {
            self.times.pop_front();
        }
        let oldest = self.times.front().copied().unwrap_or(at);
        let mut new = Vec::new();
        for m in metrics {
            let k = (m.name.clone(), m.labels.clone());
            match self.series.get_mut(&k) {
                Some(s) => {
                    s.points.push_back((at, m.value));
                    s.last_seen = seq;
                }
                None => new.push((k, m.value)),
            }
        }
        for s in self.series.values_mut() {
            while s.points.front().is_some_and(|p| p.0 < oldest) {
                s.points.pop_front();
            }
        }
        self.series.retain(|_, s| !s.points.is_empty());
        let room = self.max_series.saturating_sub(self.series.len());
        if new.len() > room {
            // Make room from series absent from this sample, least recent first.
            let mut gone: Vec<(u64, Key)> = self
                .series
                .iter()
                .filter(|(_, s)| s.last_seen < seq)
                .map(|(k, s)| (s.last_seen, k.clone()))
                .collect();
            gone.sort();
            for (_, k) in gone.into_iter().take(new.len() - room) {
                self.series.remove(&k);
            }
        }
        let room = self.max_series.saturating_sub(self.series.len());
        if new.len() > room {
            self.dropped += (new.len() - room) as u64;
            new.truncate(room);
        }
        for (k, v) in new {
            self.series.insert(
                k,
                Series {
                    points: VecDeque::from([(at, v)]),
                    last_seen: seq,
                },
            );
        }
    }

    /// How many series are kept.
    pub fn kept(&self) -> usize {
        self.series.len()
    }

    /// New series left out since start because `max_series` live ones
    /// were kept (a count of sample-series, not of names).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The values of one series, oldest first (missing samples skipped).
    pub fn series(&self, k: &Key) -> Vec<(f64, f64)> {
        self.series
            .get(k)
            .map(|s| s.points.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Per-second increase of a count between successive samples, oldest
    /// first. A count that fell (rows pruned by retention) counts as 0.
    pub fn rates(&self, k: &Key) -> Vec<(f64, f64)> {
        let s = self.series(k);
        s.windows(2)
            .map(|w| {
                let dt = w[1].0 - w[0].0;
                let dv = w[1].1 - w[0].1;
                (w[1].0, if dt > 0.0 && dv > 0.0 { dv / dt } else { 0.0 })
            })
            .collect()
    }

    /// The per-second increase over the whole window kept (None: fewer
    /// than two samples).
    pub fn rate(&self, k: &Key) -> Option<f64> {
        let r = self.rates(k);
        if r.is_empty() {
            return None;
        }
        let s = self.series(k);
        let span = s.last()?.0 - s.first()?.0;
        if span <= 0.0 {
            return None;
        }
        let total: f64 = self
            .series(k)
            .windows(2)
            .map(|w| (w[1].1 - w[0].1).max(0.0))
            .sum();
        Some(total / span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, q: &str, v: f64) -> Metric {
        Metric {
            name: name.into(),
            labels: [("queue".to_string(), q.to_string())].into_iter().collect(),
            value: v,
        }
    }

    #[test]
    fn keeps_the_newest_samples_and_computes_rates() {
        let mut h = History::new(3, 100);
        let k = key("c", &[("queue", "a")]);
        h.push(10.0, &[m("c", "a", 0.0)]);
        h.push(12.0, &[m("c", "a", 10.0)]);
        assert_eq!(h.rate(&k), Some(5.0));
        h.push(14.0, &[m("c", "a", 4.0)]); // pruned: falls, counts as 0
        h.push(16.0, &[m("c", "a", 12.0)]);
        assert_eq!(h.series(&k), vec![(12.0, 10.0), (14.0, 4.0), (16.0, 12.0)]);
        assert_eq!(h.rates(&k), vec![(14.0, 0.0), (16.0, 4.0)]);
        assert_eq!(h.rate(&k), Some(2.0));
        assert_eq!(h.rate(&key("c", &[("queue", "b")])), None);
    }

    #[test]
    fn series_are_capped_and_live_ones_kept() {
        let mut h = History::new(4, 3);
        h.push(1.0, &[m("c", "a", 1.0), m("c", "b", 1.0)]);
        h.push(2.0, &[m("c", "a", 2.0), m("c", "b", 2.0), m("c", "c", 2.0)]);
        assert_eq!(h.kept(), 3);
        // A flood of new names while a, b, c are live: none of them is kept.
        let flood: Vec<Metric> = (0..100)
            .map(|i| m("c", &format!("new{i}"), 0.0))
            .chain([m("c", "a", 3.0), m("c", "b", 3.0), m("c", "c", 3.0)])
            .collect();
        h.push(3.0, &flood);
        assert_eq!(h.kept(), 3);
        assert_eq!(h.dropped(), 100);
        assert_eq!(h.series(&key("c", &[("queue", "a")])).len(), 3);
        assert!(h.series(&key("c", &[("queue", "new0")])).is_empty());
        // Once c is gone from the samples, a new series takes its place
        // (the least recently seen goes first).
        h.push(4.0, &[m("c", "a", 4.0), m("c", "b", 4.0), m("c", "d", 4.0)]);
        assert_eq!(h.kept(), 3);
        assert!(h.series(&key("c", &[("queue", "c")])).is_empty());
        assert_eq!(h.series(&key("c", &[("queue", "d")])), vec![(4.0, 4.0)]);
        // A series absent for the whole window is forgotten without a cap.
        let mut w = History::new(2, 10);
        w.push(1.0, &[m("c", "x", 1.0)]);
        w.push(2.0, &[m("c", "y", 1.0)]);
        w.push(3.0, &[m("c", "y", 2.0)]);
        assert_eq!(w.kept(), 1);
    }
}
