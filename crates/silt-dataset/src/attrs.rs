//! The record attribute bits (`Record::attrs`, opaque to storage), allocated here for every
//! protocol at once: a record published over MQTT is fetched over Kafka and the other way
//! round, so one protocol's bits must never mean something else to the other.

/// MQTT QoS the message was published with (bits 0–1).
pub const QOS_MASK: u16 = 0b11;
/// MQTT retained message.
pub const RETAIN: u16 = 1 << 2;
/// MQTT 5 Payload Format Indicator: the payload is UTF-8.
pub const UTF8_PAYLOAD: u16 = 1 << 3;
/// Kafka: the value is null (a tombstone), not empty.
pub const NULL_VALUE: u16 = 1 << 4;
/// Kafka: part of a transaction.
pub const TRANSACTIONAL: u16 = 1 << 5;
/// Kafka: a control record (a transaction's commit or abort marker); no MQTT topic.
pub const KAFKA_CONTROL: u16 = 1 << 6;
