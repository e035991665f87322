//! Rate-limited logging of a failure that repeats (a full disk, an index that refuses writes):
//! one line per interval with the count of failures since the last line, never one per retry.

use std::time::{Duration, Instant};

/// Counts failures of one kind and says when to log them.
#[derive(Debug)]
pub(crate) struct Throttle {
    every: Duration,
    last: Option<Instant>,
    /// Failures since the last logged line (that one included).
    count: u64,
}

impl Throttle {
    pub fn new(every: Duration) -> Self {
        Self { every, last: None, count: 0 }
    }

    /// Records one failure; returns how many happened since the last line when a line is due
    /// now (the first failure is always logged).
    pub fn failed(&mut self) -> Option<u64> {
        self.count += 1;
        let due = self.last.is_none_or(|t| t.elapsed() >= self.every);
        if !due {
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.count))
    }

    /// Records a success; returns whether failures were logged since the last success (for a
    /// "recovered" line).
    pub fn recovered(&mut self) -> bool {
        let was = self.last.is_some();
        self.last = None;
        self.count = 0;
        was
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_first_failure_then_once_per_interval_with_a_count() {
        let mut t = Throttle::new(Duration::from_secs(3600));
        assert_eq!(t.failed(), Some(1));
        assert_eq!(t.failed(), None);
        assert_eq!(t.failed(), None);
        assert!(t.recovered());
        assert!(!t.recovered());
        let mut t = Throttle::new(Duration::ZERO);
        assert_eq!(t.failed(), Some(1));
        assert_eq!(t.failed(), Some(1));
    }
}
