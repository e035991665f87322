//! Shared vocabulary of Silt's crates: identifiers and positions as newtypes, and MQTT topic
//! names, filters and the topic trie that routes by them.
//!
//! - [`ids`]: `LogPosition`, `QueueId`, `Offset`, `Partition`, `Timestamp`.
//! - [`topic`]: validated `TopicName` / `TopicFilter` and the spec matcher.
//! - [`trie`]: `TopicTrie`, which finds every filter matching a topic without scanning them all.
//!
//! This crate has no I/O and no runtime dependency; everything in it is deterministic.

pub mod ids;
pub mod topic;
pub mod trie;

pub use ids::{LogPosition, Offset, Partition, QueueId, Timestamp};
pub use topic::{TopicError, TopicFilter, TopicName, filter_matches, level_count};
pub use trie::TopicTrie;
