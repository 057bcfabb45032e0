//! The last few minutes of pgque.metrics(), sampled by a background task, for
//! the charts and the throughput figures (rates need two points in time;
//! PostgreSQL keeps counts, not histories).
use crate::db::Metric;
use std::collections::{BTreeMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

/// (metric name, labels) as one key.
pub type Key = (String, BTreeMap<String, String>);

pub struct Sample {
    /// Unix seconds.
    pub at: f64,
    pub values: BTreeMap<Key, f64>,
}

pub struct History {
    cap: usize,
    samples: VecDeque<Sample>,
}

pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

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
    pub fn new(cap: usize) -> History {
        History {
            cap: cap.max(2),
            samples: VecDeque::new(),
        }
    }

    pub fn push(&mut self, at: f64, metrics: &[Metric]) {
        let values = metrics
            .iter()
            .map(|m| ((m.name.clone(), m.labels.clone()), m.value))
            .collect();
        if self.samples.len() == self.cap {
            self.samples.pop_front();
        }
        self.samples.push_back(Sample { at, values });
    }

    /// The values of one series, oldest first (missing samples skipped).
    pub fn series(&self, k: &Key) -> Vec<(f64, f64)> {
        self.samples
            .iter()
            .filter_map(|s| s.values.get(k).map(|v| (s.at, *v)))
            .collect()
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
        let mut h = History::new(3);
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
}
