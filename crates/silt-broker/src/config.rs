//! MQTT broker settings (the `[mqtt]` table of `silt.toml`).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    /// TCP listener address (`silt serve --mqtt ADDR` overrides it).
    pub listen: String,
    /// Largest packet accepted from a client, in bytes (checked before the body is read).
    pub max_packet_size: u32,
    /// QoS 1/2 messages the broker keeps in flight to one client, unless the client asks for
    /// fewer (MQTT 5 Receive Maximum).
    pub max_inflight: u16,
    /// QoS 1/2 publishes a client may have unacknowledged towards the broker (our Receive
    /// Maximum). A client that exceeds it is disconnected with 0x93.
    pub receive_maximum: u16,
    /// Highest topic alias the broker accepts from a client.
    pub topic_alias_maximum: u16,
    /// Largest session expiry interval granted, in seconds.
    pub max_session_expiry_secs: u32,
    /// Keep alive imposed when a client asks for none or more (MQTT 5 Server Keep Alive);
    /// 0 leaves the client's choice.
    pub server_keep_alive_secs: u16,
    /// How often a connected session's cursors are persisted while messages flow (ms).
    pub cursor_commit_ms: u64,
    /// Connections accepted at once; more are refused.
    pub max_connections: usize,
    /// Passwords, ACLs and anonymous access (`[mqtt.auth]`).
    pub auth: crate::auth::AuthConfig,
    /// Seconds between `$SYS/` statistics publications (0: off).
    pub sys_interval_secs: u64,
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:1883".into(),
            max_packet_size: 1 << 20,
            max_inflight: 64,
            receive_maximum: 256,
            topic_alias_maximum: 64,
            max_session_expiry_secs: u32::MAX,
            server_keep_alive_secs: 0,
            cursor_commit_ms: 500,
            max_connections: 100_000,
            auth: crate::auth::AuthConfig::default(),
            sys_interval_secs: 10,
        }
    }
}

impl MqttConfig {
    pub fn validate(&self) -> Result<(), String> {
        let bad = |k: &str, why: &str| Err(format!("mqtt.{k}: {why}"));
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return bad("listen", "must be an address such as 127.0.0.1:1883");
        }
        if self.max_packet_size < 64 {
            return bad("max_packet_size", "must be at least 64");
        }
        if self.max_inflight == 0 {
            return bad("max_inflight", "must be at least 1");
        }
        if self.receive_maximum == 0 {
            return bad("receive_maximum", "must be at least 1");
        }
        if self.cursor_commit_ms == 0 {
            return bad("cursor_commit_ms", "must be greater than 0");
        }
        if self.max_connections == 0 {
            return bad("max_connections", "must be at least 1");
        }
        Ok(())
    }
}
