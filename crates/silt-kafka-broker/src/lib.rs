//! Silt's Kafka view: stock Kafka producers, consumers and groups on the one dataset. The
//! thin tokio driver of the sans-I/O core in `silt-kafka`: it owns the sockets and runs the
//! requests against the log through the append path MQTT uses too (`silt-dataset`).
//!
//! Module map:
//! - [`server`]: the listeners (TCP, and TLS with `[kafka.tls]`); [`connection`]: one
//!   connection, requests in order; `sasl`: who it is (SASL PLAIN/SCRAM, or anonymous).
//!   Topic ACLs (`silt-auth`, the MQTT rules applied to each record's MQTT topic) are checked
//!   by every API that touches a topic, group or transactional id.
//! - `apis`: one module per API family (metadata and coordinator lookup, produce, fetch,
//!   offsets, topics and configs), and the mapping of engine errors to Kafka error codes.
//! - `records`: Kafka records ↔ log records (the routing rule both ways); `batch`: record
//!   batches as fetched; `inflate`: bounded decompression of produced batches.
//! - `groups`: the group coordinator's driver (clock, parked requests, durable offsets).
//! - `txns`: producer ids, idempotence and transactions (markers, aborted ranges, the last
//!   stable offset).
//! - [`wake`]: fetch long polls woken by dispatch.
//! - [`KafkaConfig`]: the `[kafka]` settings.
//!
//! Guarantees: a produce with acks ≥ 1 is answered only once its records are durable under
//! the topic's policy, with the offset the first one got; offsets are the partition's consume
//! queue's, dense, the same whichever protocol wrote the records.

mod apis;
mod batch;
mod config;
pub mod connection;
mod groups;
mod inflate;
mod node;
mod records;
mod sasl;
pub mod server;
mod txns;
pub mod wake;

pub use config::{KafkaConfig, KafkaTlsConfig};
pub use node::{GroupLag, Kafka, NODE_ID};

// The produce path's decoders, for the fuzz targets (`fuzz/`): no broker needed.
#[doc(hidden)]
pub use inflate::decompress;
#[doc(hidden)]
pub use records::{ProduceError, Produced, ProducedBatch, RETAIN_HEADER, decode as decode_produced};
