//! Silt's Kafka protocol core, without sockets, runtime, clocks or storage: what a Kafka
//! broker decides from the bytes a client sends and the state it keeps, for a driver
//! (`silt-kafka-broker`) to execute against the log.
//!
//! Module map:
//! - [`codec`]: frames (length-prefixed, size checked first), request decoding with Kafka's
//!   version rules, response encoding (header versions, ApiVersions' v0 header).
//! - [`versions`]: the APIs and versions served, and the ApiVersions response.
//! - [`producer`]: idempotent producers' sequence checks (retries written once).
//! - [`txn`]: producer ids and the transaction coordinator.
//! - [`group`]: the consumer-group coordinator (classic protocol): rebalances, sessions,
//!   committed offsets and what to persist of them.
//!
//! Messages are `kafka-protocol`'s, generated from Kafka's own schemas.

pub mod codec;
pub mod group;
pub mod producer;
pub mod txn;
pub mod versions;

pub use kafka_protocol;
