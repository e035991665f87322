//! What a load-generator payload carries, and the clock its timestamps come from.
//!
//! Layout (little-endian), padded with zeros to the configured size:
//! `[0..8)` send time in ns since the run's [`Clock`] epoch, `[8..12)` publisher index,
//! `[12..20)` sequence number of that publisher. Publisher and subscribers live in one
//! process, so a monotonic clock is enough and no clock skew enters the latency.

use std::time::{Duration, Instant};

/// Smallest payload that holds the header.
pub const HEADER_LEN: usize = 20;

/// A monotonic clock with a fixed epoch, shared by every task of a run.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    epoch: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self { epoch: Instant::now() }
    }
}

impl Clock {
    /// Nanoseconds since the epoch.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn instant(&self, ns: u64) -> Instant {
        self.epoch + Duration::from_nanos(ns)
    }
}

/// The decoded header of a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub sent_ns: u64,
    pub publisher: u32,
    pub seq: u64,
}

impl Stamp {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `payload`.
    pub fn write(&self, payload: &mut [u8]) {
        payload[0..8].copy_from_slice(&self.sent_ns.to_le_bytes());
        payload[8..12].copy_from_slice(&self.publisher.to_le_bytes());
        payload[12..20].copy_from_slice(&self.seq.to_le_bytes());
    }

    /// `None` for a payload too short to be ours.
    pub fn read(payload: &[u8]) -> Option<Self> {
        let header = payload.get(..HEADER_LEN)?;
        let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("invariant: 8 bytes"));
        Some(Self {
            sent_ns: u64_at(0),
            publisher: u32::from_le_bytes(header[8..12].try_into().expect("invariant: 4 bytes")),
            seq: u64_at(12),
        })
    }

    /// Microseconds from the send time to `now_ns` (0 if the clock reads earlier).
    pub fn latency_us(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.sent_ns) / 1_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_round_trips_through_a_padded_payload() {
        let s = Stamp { sent_ns: 123_456_789, publisher: 7, seq: u64::MAX - 1 };
        let mut payload = vec![0xAA; 64];
        s.write(&mut payload);
        assert_eq!(Stamp::read(&payload), Some(s));
        assert_eq!(s.latency_us(123_456_789 + 2_500), 2);
    }

    #[test]
    fn short_payload_is_not_ours() {
        assert_eq!(Stamp::read(&[0; HEADER_LEN - 1]), None);
    }
}
