//! Silt's MQTT broker core on the storage engine.
//!
//! - [`admission`]: connection slots, pending (before CONNACK) apart from open ones.
//! - [`auth`]: the `silt-auth` crate (shared with the Kafka view): argon2 password file with
//!   a bounded verifier pool, mosquitto-style ACLs, session ownership, anonymous policy.
//! - [`message`]: an MQTT message as a log record (routing: first level = stream) and back.
//! - [`session`]: subscriptions with cursors over consume queues; log-order merge; snapshots.
//! - `decoded`: messages decoded once for every subscriber a record is delivered to.
//! - [`retained`]: retained messages, a topic trie walked by filter, persisted in the log.
//! - [`broker`]: the session registry, the dispatch-driven router, publish path, expiry.
//! - `connection`: one MQTT connection (3.1, 3.1.1, 5.0): the tokio driver of the sans-I/O
//!   `silt_mqtt::server::Connection`, executing its requests against the broker and a session.
//! - [`server`]: accept loops and housekeeping tasks.
//! - [`listeners`]: the transports: TCP, TLS, WebSocket, WebSocket over TLS.
//! - `sys`: `$SYS/broker/...` statistics.
//! - [`MqttConfig`]: the `[mqtt]` settings.
//!
//! Guarantees: a QoS 1/2 PUBLISH is acknowledged only once its record is durable under the
//! log's fsync policy. Offline sessions keep cursors, not copies: their backlog is bounded by
//! retention, never by a message count.

pub mod admission;
pub use silt_auth as auth;
pub mod broker;
mod config;
mod connection;
mod decoded;
mod keep_alive;
pub mod listeners;
pub mod message;
pub mod retained;
mod router;
pub mod server;
pub mod session;
mod sys;

/// The start of a client-chosen string for a log line: a topic may be 64 KiB long.
pub(crate) fn log_prefix(s: &str) -> &str {
    silt_types::log_limit::prefix(s)
}

pub use broker::{Broker, DeleteRefused, ExtraStats, Router, SessionView};
pub use config::{MqttConfig, TlsListenerConfig, WsListenerConfig, WssListenerConfig};
pub use message::Message;
pub use silt_dataset::{AckFuture, TierDecision, TopicTiers};
