//! Latency samples and their percentiles, as the chaos harness and the
//! benchmark print them. Nearest-rank percentiles: every number printed is
//! one that was actually measured.

use std::time::Duration;

/// A set of measured durations.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    values: Vec<Duration>,
}

impl Samples {
    /// No samples yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one measurement.
    pub fn push(&mut self, value: Duration) {
        self.values.push(value);
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The nearest-rank `p`-th percentile (`p` in 0..=100), `None` when empty.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        if self.values.is_empty() {
            return None;
        }
        let mut sorted = self.values.clone();
        sorted.sort();
        let p = p.clamp(0.0, 100.0);
        // Rank = ceil(p/100 * n), at least 1: the first rank that reaches it.
        let n = sorted.len();
        let target = (p / 100.0) * n as f64;
        let rank = (1..=n).find(|&r| r as f64 >= target).unwrap_or(n);
        sorted.get(rank - 1).copied()
    }

    /// The median.
    pub fn p50(&self) -> Option<Duration> {
        self.percentile(50.0)
    }

    /// The 95th percentile.
    pub fn p95(&self) -> Option<Duration> {
        self.percentile(95.0)
    }

    /// The largest.
    pub fn max(&self) -> Option<Duration> {
        self.values.iter().max().copied()
    }

    /// The smallest.
    pub fn min(&self) -> Option<Duration> {
        self.values.iter().min().copied()
    }
}

/// Milliseconds as printed in summaries (`-` when there is no value).
pub fn ms(value: Option<Duration>) -> String {
    match value {
        Some(d) => d.as_millis().to_string(),
        None => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(ms: &[u64]) -> Samples {
        let mut s = Samples::new();
        for &m in ms {
            s.push(Duration::from_millis(m));
        }
        s
    }

    #[test]
    fn nearest_rank_percentiles() {
        let s = samples(&[50, 10, 40, 20, 30]);
        assert_eq!(s.p50(), Some(Duration::from_millis(30)));
        assert_eq!(s.p95(), Some(Duration::from_millis(50)));
        assert_eq!(s.percentile(0.0), Some(Duration::from_millis(10)));
        assert_eq!(s.max(), Some(Duration::from_millis(50)));
        assert_eq!(s.min(), Some(Duration::from_millis(10)));
    }

    #[test]
    fn twenty_samples_p95_is_the_nineteenth() {
        let s = samples(&(1..=20).collect::<Vec<_>>());
        assert_eq!(s.p95(), Some(Duration::from_millis(19)));
    }

    #[test]
    fn empty_has_no_percentiles() {
        assert_eq!(Samples::new().p50(), None);
        assert_eq!(ms(None), "-");
        assert_eq!(ms(Some(Duration::from_millis(7))), "7");
    }
}
