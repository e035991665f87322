//! Shared vocabulary of Silt's crates: identifiers and positions as newtypes, and MQTT topic
//! names, filters and the topic trie that routes by them.
//!
//! - [`ids`]: `LogPosition`, `QueueId`, `Offset`, `Partition`, `Timestamp`.
//! - [`topic`]: validated `TopicName` / `TopicFilter` and the spec matcher.
//! - [`trie`]: `TopicTrie`, which finds every filter matching a topic without scanning them all.
//! - [`log_limit`]: one log line per interval for what a peer can repeat at will.
//! - [`latency`]: lock-free latency histograms for `/metrics`.
//! - [`lru`]: bounded LRU caches whose tables grow with what they hold.
//!
//! This crate has no I/O and no runtime dependency; everything in it but [`log_limit`] (which
//! reads the monotonic clock) is deterministic.

pub mod ids;
pub mod latency;
pub mod log_limit;
pub mod lru;
pub mod topic;
pub mod trie;

pub use ids::{LogPosition, Offset, Partition, QueueId, Timestamp};
pub use topic::{TopicError, TopicFilter, TopicName, filter_matches, level_count};
pub use trie::TopicTrie;
