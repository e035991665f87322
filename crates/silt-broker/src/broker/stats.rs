//! The broker's counters.

use std::sync::atomic::AtomicU64;

/// Broker-wide counters for `$SYS/` and the stats page.
///
/// Every connection adds to them from whichever core it runs on: aligned to lines of their
/// own, so those additions do not evict the fields of [`Broker`](super::Broker) every message reads.
/// Connections add per write or per group, not per message (see `Conn::flush`).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Stats {
    /// Sessions connected now, and CONNECTs accepted since start.
    pub connections: AtomicU64,
    pub connects: AtomicU64,
    /// Connections resting now: idle, kept in their small form until they have work (of
    /// `connections`).
    pub resting: AtomicU64,
    pub messages_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    /// PUBLISH (QoS 1 and 2) received to stored as its topic's durability asks: when the
    /// PUBACK / PUBREC can go.
    pub ack_latency: silt_types::latency::LatencyHistogram,
}
