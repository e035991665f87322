//! What Silt's protocols share on their way to the one dataset (DESIGN.md points 2, 3 and 6),
//! so that an MQTT publish and a Kafka produce become records the same way:
//!
//! - [`rule`]: MQTT topic ↔ stream (Kafka topic) and record key; which names are Kafka topics.
//! - [`murmur2`]: Kafka's default partitioner, for the partition of a key.
//! - [`attrs`]: the record attribute bits, allocated for all protocols at once.
//! - [`streams`]: the stream registry (partitions fixed at creation), durable in the log.
//! - [`append`]: the tier- and retain-aware append path every protocol submits through.
//! - [`internal`]: helpers for the internal streams that hold broker state in the log.
//! - [`log_limit`] (from `silt-types`): one log line per interval for what a peer can repeat
//!   at will.

pub mod append;
pub mod attrs;
pub mod internal;
pub use silt_types::log_limit;
pub mod murmur2;
pub mod rule;
pub mod streams;

pub use append::{AckFuture, Appender, Assign, DefaultPartitions, RetainedIndex, TierDecision, TopicTiers};
pub use streams::{StreamMeta, Streams};
