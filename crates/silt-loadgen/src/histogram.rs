//! A fixed-size log-linear latency histogram in microseconds.
//!
//! Values below 128 µs get a bucket each; above, every power of two is split into 64 buckets,
//! so a reported percentile is within 1/64 (about 1.6 %) of the true value. The maximum is
//! kept exactly. Recording is a shift and an increment: cheap enough for every message.

use serde::Serialize;

/// Values below this have a bucket of their own.
const LINEAR: u64 = 128;
/// Buckets per power of two above [`LINEAR`].
const SUB: u64 = 64;
const BUCKETS: usize = (LINEAR + (64 - 7) * SUB) as usize;

#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    max: u64,
}

/// Percentiles of a histogram, as reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { counts: vec![0; BUCKETS].into_boxed_slice(), total: 0, max: 0 }
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let msb = 63 - u64::from(v.leading_zeros());
    let shift = msb - 6;
    let sub = v >> shift;
    (LINEAR + (shift - 1) * SUB + (sub - SUB)) as usize
}

/// The middle of the bucket at `idx`.
fn value_at(idx: usize) -> u64 {
    let idx = idx as u64;
    if idx < LINEAR {
        return idx;
    }
    let k = idx - LINEAR;
    let shift = k / SUB + 1;
    let low = (k % SUB + SUB) << shift;
    low + (1 << shift) / 2
}

impl Histogram {
    pub fn record(&mut self, micros: u64) {
        self.counts[index(micros)] += 1;
        self.total += 1;
        self.max = self.max.max(micros);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    /// The value below which a fraction `q` (0..=1) of the samples fall; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return value_at(i).min(self.max);
            }
        }
        self.max
    }

    /// `None` when nothing was recorded.
    pub fn summary(&self) -> Option<Summary> {
        (self.total > 0).then(|| Summary {
            count: self.total,
            p50: self.quantile(0.5),
            p99: self.quantile(0.99),
            max: self.max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact() {
        let mut h = Histogram::default();
        for v in 0..100 {
            h.record(v);
        }
        assert_eq!(h.quantile(0.5), 49);
        assert_eq!(h.quantile(0.99), 98);
        assert_eq!(h.summary().map(|s| s.max), Some(99));
    }

    #[test]
    fn large_values_are_within_two_percent() {
        for v in [128, 129, 1_000, 65_537, 3_000_000, 1 << 40, u64::MAX / 3] {
            let mut h = Histogram::default();
            h.record(v);
            h.record(0);
            let got = h.quantile(1.0) as f64;
            assert!((got - v as f64).abs() / v as f64 <= 1.0 / 64.0, "{v} reported as {got}");
        }
    }

    #[test]
    fn buckets_grow_with_the_value() {
        let mut values: Vec<u64> =
            (0..64).flat_map(|s| [1u64 << s, (1u64 << s) + 1, (1u64 << s) | ((1u64 << s) >> 1)]).collect();
        values.push(u64::MAX);
        values.sort_unstable();
        let mut last = 0;
        for v in values {
            let i = index(v);
            assert!(i < BUCKETS && i >= last, "{v} -> {i}");
            last = i;
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn merge_adds_counts_and_keeps_the_max() {
        let mut a = Histogram::default();
        let mut b = Histogram::default();
        a.record(10);
        b.record(20);
        b.record(5_000);
        a.merge(&b);
        assert_eq!(a.summary().map(|s| s.count), Some(3));
        assert_eq!(a.quantile(0.5), 20);
        assert_eq!(a.summary().map(|s| s.max), Some(5_000));
    }

    #[test]
    fn empty_histogram_has_no_summary() {
        assert_eq!(Histogram::default().summary(), None);
    }
}
