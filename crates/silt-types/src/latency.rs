//! Latency histograms the hot paths fill and `/metrics` reads: one relaxed atomic add per
//! observation (plus one for the sum), no lock and no allocation, so a PUBACK or an fsync can
//! be timed on every message. The bucket bounds are fixed, the same for every histogram, and
//! span what a broker's latencies span: 100 µs (a memory-tier ack) to 10 s (a stalled disk or
//! bucket); slower observations land in the `+Inf` bucket.
//!
//! Hand-written rather than `prometheus-client`'s `Histogram` because that one takes a lock per
//! observation and would make every crate that records depend on the metrics library; this
//! module stays in the dependency-free vocabulary crate and the admin listener converts.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds (the last bucket, `+Inf`, is implied).
pub const BOUNDS_SECONDS: [f64; 16] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

const BOUNDS_NANOS: [u64; 16] = {
    let mut out = [0u64; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = (BOUNDS_SECONDS[i] * 1e9) as u64;
        i += 1;
    }
    out
};

/// A latency histogram with the fixed buckets of [`BOUNDS_SECONDS`].
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    buckets: [AtomicU64; 17],
    sum_nanos: AtomicU64,
}

/// A histogram as read at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    pub sum_seconds: f64,
    pub count: u64,
    /// `(upper bound in seconds, observations in this bucket)`, not cumulative, ending with
    /// `(f64::INFINITY, _)`.
    pub buckets: Vec<(f64, u64)>,
}

impl HistogramSnapshot {
    /// Two histograms of the same buckets, added.
    pub fn merged(&self, b: &HistogramSnapshot) -> HistogramSnapshot {
        let a = self;
        if a.buckets.is_empty() {
            return b.clone();
        }
        HistogramSnapshot {
            sum_seconds: a.sum_seconds + b.sum_seconds,
            count: a.count + b.count,
            buckets: a.buckets.iter().zip(&b.buckets).map(|(x, y)| (x.0, x.1 + y.1)).collect(),
        }
    }

    /// The observations in this snapshot that the earlier `before` lacks.
    pub fn since(&self, before: &HistogramSnapshot) -> HistogramSnapshot {
        let now = self;
        if before.buckets.len() != now.buckets.len() {
            return now.clone();
        }
        HistogramSnapshot {
            sum_seconds: (now.sum_seconds - before.sum_seconds).max(0.0),
            count: now.count.saturating_sub(before.count),
            buckets: now.buckets.iter().zip(&before.buckets).map(|(x, y)| (x.0, x.1.saturating_sub(y.1))).collect(),
        }
    }

    /// The `q` quantile (0..=1) in seconds, interpolated linearly inside its bucket (as
    /// Prometheus' `histogram_quantile` does); `None` without observations. In the last, unbounded
    /// bucket the answer is the highest finite bound: an estimate from below.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let h = self;
        let total: u64 = h.buckets.iter().map(|b| b.1).sum();
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let (mut below, mut lower) = (0u64, 0.0f64);
        for &(upper, n) in &h.buckets {
            if n > 0 && (below + n) as f64 >= rank {
                if upper.is_infinite() {
                    return Some(lower);
                }
                let within = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
                return Some(lower + (upper - lower) * within);
            }
            below += n;
            if upper.is_finite() {
                lower = upper;
            }
        }
        Some(lower)
    }
}

impl LatencyHistogram {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        self.observe_n(d, 1);
    }

    /// Records `n` observations of the same duration (the messages of one group commit) in
    /// two atomic additions, not two per message: the counters are shared by every
    /// connection, and each addition moves their cache line between cores.
    pub fn observe_n(&self, d: Duration, n: u64) {
        if n == 0 {
            return;
        }
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = BOUNDS_NANOS.partition_point(|&b| b < nanos);
        self.buckets[i].fetch_add(n, Relaxed);
        self.sum_nanos.fetch_add(nanos.saturating_mul(n), Relaxed);
    }

    /// The counts so far. Taken bucket by bucket while others may record: the count is the sum
    /// of the buckets read, so the snapshot is consistent with itself.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<(f64, u64)> = BOUNDS_SECONDS
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.buckets.iter().map(|b| b.load(Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        HistogramSnapshot { sum_seconds: self.sum_nanos.load(Relaxed) as f64 / 1e9, count, buckets }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_bucket_whose_bound_is_at_or_above_them() {
        let h = LatencyHistogram::new();
        h.observe(Duration::from_micros(50)); // ≤ 100 µs
        h.observe(Duration::from_micros(100)); // exactly on a bound: that bucket (le = 0.0001)
        h.observe(Duration::from_micros(101)); // ≤ 250 µs
        h.observe(Duration::from_millis(3)); // ≤ 5 ms
        h.observe(Duration::from_secs(60)); // +Inf
        let s = h.snapshot();
        assert_eq!(s.count, 5);
        assert_eq!(s.buckets.len(), 17);
        assert_eq!(s.buckets[0], (0.0001, 2));
        assert_eq!(s.buckets[1], (0.00025, 1));
        assert_eq!(s.buckets[5], (0.005, 1));
        assert_eq!(s.buckets[16], (f64::INFINITY, 1));
        assert!((s.sum_seconds - (60.0 + 0.003 + 0.000_251)).abs() < 1e-9, "{}", s.sum_seconds);
    }

    #[test]
    fn a_group_of_observations_counts_each_of_them() {
        let h = LatencyHistogram::new();
        h.observe_n(Duration::from_micros(200), 3);
        h.observe_n(Duration::from_millis(3), 0);
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets[1], (0.00025, 3));
        assert!((s.sum_seconds - 0.0006).abs() < 1e-12, "{}", s.sum_seconds);
    }

    #[test]
    fn an_empty_histogram_reads_zero() {
        let s = LatencyHistogram::new().snapshot();
        assert_eq!(s.count, 0);
        assert_eq!(s.sum_seconds, 0.0);
        assert!(s.buckets.iter().all(|(_, n)| *n == 0));
    }

    fn hist(buckets: &[(f64, u64)]) -> HistogramSnapshot {
        HistogramSnapshot { sum_seconds: 0.0, count: buckets.iter().map(|b| b.1).sum(), buckets: buckets.to_vec() }
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let h = hist(&[(0.001, 0), (0.002, 10), (0.004, 10), (f64::INFINITY, 0)]);
        let p50 = h.quantile(0.5).expect("observations");
        assert!((p50 - 0.002).abs() < 1e-12, "{p50}");
        let p75 = h.quantile(0.75).expect("observations");
        assert!((p75 - 0.003).abs() < 1e-12, "{p75}");
        assert_eq!(hist(&[(0.001, 0), (f64::INFINITY, 0)]).quantile(0.99), None);
    }

    #[test]
    fn a_quantile_in_the_unbounded_bucket_is_the_highest_bound() {
        let h = hist(&[(0.001, 1), (1.0, 0), (f64::INFINITY, 99)]);
        assert_eq!(h.quantile(0.99), Some(1.0));
    }

    #[test]
    fn an_interval_counts_only_its_own_observations() {
        let before = hist(&[(0.001, 3), (f64::INFINITY, 1)]);
        let now = hist(&[(0.001, 5), (f64::INFINITY, 1)]);
        let d = now.since(&before);
        assert_eq!(d.count, 2);
        assert_eq!(d.buckets, vec![(0.001, 2), (f64::INFINITY, 0)]);
        assert_eq!(HistogramSnapshot::default().merged(&now), now);
    }
}
