//! Rate-limited log lines for what a peer can repeat as fast as it can connect (refused
//! connections, full slots, wrong passwords): one line per interval, carrying how many were
//! left out since the previous one, so an attacker cannot fill the disk with the log.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One call site's limit; keep it in a `static`.
pub struct LogLimit {
    every_ms: u64,
    /// Milliseconds since [`epoch`] when the next line may be written.
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl LogLimit {
    pub const fn new(every: Duration) -> Self {
        Self { every_ms: every.as_millis() as u64, next_ms: AtomicU64::new(0), suppressed: AtomicU64::new(0) }
    }

    /// `Some(n)` when a line is due now: `n` lines were left out since the last one. `None`:
    /// leave this one out (it is counted).
    pub fn check(&self) -> Option<u64> {
        let now = epoch().elapsed().as_millis() as u64;
        let next = self.next_ms.load(Ordering::Acquire);
        if now >= next
            && self.next_ms.compare_exchange(next, now + self.every_ms, Ordering::AcqRel, Ordering::Acquire).is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::AcqRel));
        }
        self.suppressed.fetch_add(1, Ordering::AcqRel);
        None
    }
}

/// The interval of the broker's rate-limited lines.
pub const EVERY: Duration = Duration::from_secs(10);

/// The start of a client-chosen string for a log line (a topic may be 64 KiB long): at most
/// 120 bytes, cut at a character boundary.
pub fn prefix(s: &str) -> &str {
    let mut end = s.len().min(120);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_left_out() {
        let limit = LogLimit::new(Duration::from_secs(3600));
        assert_eq!(limit.check(), Some(0));
        for _ in 0..1000 {
            assert_eq!(limit.check(), None);
        }
        limit.next_ms.store(0, Ordering::Release); // the interval passed
        assert_eq!(limit.check(), Some(1000));
        assert_eq!(limit.check(), None);
    }
}
