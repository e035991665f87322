//! The Kafka side of the generator, on the `kafka-protocol` crate's codecs (the broker's own).
//!
//! - `client`: one connection, version negotiation, pipelined typed requests; the Produce,
//!   Fetch, Metadata, ListOffsets and CreateTopics requests the scenarios send.
//! - `batch`: record batches v2, encoded for producers and split and checked for consumers.
//! - `produce`: N producers, each its own connection, a window of batches in flight.
//! - `consume`: a backlog read from the earliest offsets, and a consumer tailing producers
//!   (throughput, and produce→consume latency when paced).
//! - `mqtt`: MQTT publishers read back by a Kafka consumer (Silt's one dataset).
//!
//! Every scenario prints one JSON line like the MQTT ones, with the broker's CPU per record.

pub mod batch;
pub mod client;
pub mod consume;
pub mod mqtt;
pub mod produce;
#[cfg(test)]
mod tests;
