//! MQTT broker settings (the `[mqtt]` table of `silt.toml`).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    /// TCP listener address (`silt serve --mqtt ADDR` overrides it).
    pub listen: String,
    /// Largest packet accepted from a client, in bytes (checked before the body is read).
    pub max_packet_size: u32,
    /// Largest CONNECT accepted, in bytes: a connection that has not authenticated yet holds
    /// at most this much (a will payload included).
    pub max_connect_size: u32,
    /// Most levels a topic name or filter may have (`a/b/c` has 3): PUBLISH, SUBSCRIBE and
    /// will topics deeper than this are refused, and retained messages or subscriptions
    /// deeper than this are skipped when the broker starts.
    pub max_topic_levels: u16,
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
    /// Connections whose CONNECT was accepted, at once; more CONNECTs are refused with
    /// Quota exceeded (0x97).
    pub max_connections: usize,
    /// Connections not yet through their CONNECT (TLS/WebSocket handshake, CONNECT,
    /// credentials) at once. When full, the oldest still sending its handshake is closed to
    /// make room, so idle sockets cannot keep clients out.
    pub max_pending_connections: usize,
    /// Subscriptions one session may hold (its own filters and shared-group memberships): each
    /// is durable state (a consume queue for a wildcard, a record in the session's snapshot).
    /// A SUBSCRIBE to a new filter beyond it is refused for that filter (SUBACK 0x97 in 5.0,
    /// 0x80 in 3.1.1); replacing one the session holds is not.
    pub max_subscriptions_per_session: usize,
    /// Passwords, ACLs and anonymous access (`[mqtt.auth]`).
    pub auth: crate::auth::AuthConfig,
    /// Seconds between `$SYS/` statistics publications (0: off).
    pub sys_interval_secs: u64,
    /// MQTT over TLS (`[mqtt.tls]`; `--mqtt-tls ADDR`). Off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsListenerConfig>,
    /// MQTT over WebSocket (`[mqtt.websocket]`; `--mqtt-ws ADDR`). Off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub websocket: Option<WsListenerConfig>,
    /// MQTT over WebSocket over TLS (`[mqtt.websocket_tls]`; `--mqtt-wss ADDR`). Off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub websocket_tls: Option<WssListenerConfig>,
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:1883".into(),
            max_packet_size: 1 << 20,
            max_connect_size: 64 << 10,
            max_topic_levels: 128,
            max_inflight: 64,
            receive_maximum: 256,
            topic_alias_maximum: 64,
            max_session_expiry_secs: u32::MAX,
            server_keep_alive_secs: 0,
            cursor_commit_ms: 500,
            max_connections: 100_000,
            max_pending_connections: 1024,
            max_subscriptions_per_session: 1000,
            auth: crate::auth::AuthConfig::default(),
            sys_interval_secs: 10,
            tls: None,
            websocket: None,
            websocket_tls: None,
        }
    }
}

impl MqttConfig {
    /// The largest CONNECT read before authentication: `max_connect_size`, never above
    /// `max_packet_size`.
    pub fn connect_limit(&self) -> u32 {
        self.max_connect_size.min(self.max_packet_size)
    }

    pub fn validate(&self) -> Result<(), String> {
        let bad = |k: &str, why: &str| Err(format!("mqtt.{k}: {why}"));
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return bad("listen", "must be an address such as 127.0.0.1:1883");
        }
        if self.max_packet_size < 64 {
            return bad("max_packet_size", "must be at least 64");
        }
        // Above max_packet_size it is simply max_packet_size (see `connect_limit`): lowering
        // the packet size alone must not make the default CONNECT bound an error.
        if self.max_connect_size < 64 {
            return bad("max_connect_size", "must be at least 64");
        }
        if self.max_topic_levels == 0 || usize::from(self.max_topic_levels) > silt_types::topic::MAX_TOPIC_LEVELS {
            return bad("max_topic_levels", "must be between 1 and 32768");
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
        if self.max_pending_connections == 0 {
            return bad("max_pending_connections", "must be at least 1");
        }
        if self.max_subscriptions_per_session == 0 {
            return bad("max_subscriptions_per_session", "must be at least 1");
        }
        self.auth.validate()?;
        if let Some(t) = &self.tls {
            check_listener("mqtt.tls", &t.listen, None, Some((&t.cert_file, &t.key_file)))?;
        }
        if let Some(w) = &self.websocket {
            check_listener("mqtt.websocket", &w.listen, Some(&w.path), None)?;
        }
        if let Some(w) = &self.websocket_tls {
            check_listener("mqtt.websocket_tls", &w.listen, Some(&w.path), Some((&w.cert_file, &w.key_file)))?;
        }
        Ok(())
    }
}

/// `[mqtt.tls]`: MQTT over TLS. The certificate and key are PEM files read at start-up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsListenerConfig {
    /// Address bound, exactly as given.
    pub listen: String,
    /// Certificate chain, leaf first (`--tls-cert FILE` overrides it).
    pub cert_file: std::path::PathBuf,
    /// Private key: PKCS#8, PKCS#1 or SEC1 (`--tls-key FILE` overrides it).
    pub key_file: std::path::PathBuf,
}

impl Default for TlsListenerConfig {
    fn default() -> Self {
        Self { listen: "127.0.0.1:8883".into(), cert_file: Default::default(), key_file: Default::default() }
    }
}

/// `[mqtt.websocket]`: MQTT over WebSocket, subprotocol `mqtt`, on one HTTP path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WsListenerConfig {
    /// Address bound, exactly as given.
    pub listen: String,
    /// The only path upgraded; other paths get 404.
    pub path: String,
}

impl Default for WsListenerConfig {
    fn default() -> Self {
        Self { listen: "127.0.0.1:8083".into(), path: "/mqtt".into() }
    }
}

/// `[mqtt.websocket_tls]`: MQTT over WebSocket over TLS.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WssListenerConfig {
    /// Address bound, exactly as given.
    pub listen: String,
    /// The only path upgraded; other paths get 404.
    pub path: String,
    /// As in `[mqtt.tls]` (`--tls-cert FILE` overrides it).
    pub cert_file: std::path::PathBuf,
    /// As in `[mqtt.tls]` (`--tls-key FILE` overrides it).
    pub key_file: std::path::PathBuf,
}

impl Default for WssListenerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8084".into(),
            path: "/mqtt".into(),
            cert_file: Default::default(),
            key_file: Default::default(),
        }
    }
}

/// Checks one extra listener's settings; `table` names it in the error (`mqtt.tls`).
fn check_listener(
    table: &str,
    listen: &str,
    path: Option<&str>,
    pem: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<(), String> {
    if listen.parse::<std::net::SocketAddr>().is_err() {
        return Err(format!("{table}.listen: must be an address such as 127.0.0.1:8883, not {listen:?}"));
    }
    if let Some(path) = path
        && !path.starts_with('/')
    {
        return Err(format!("{table}.path: must start with '/', not {path:?}"));
    }
    if let Some((cert, key)) = pem {
        if cert.as_os_str().is_empty() {
            return Err(format!("{table}.cert_file: required (a PEM file; or --tls-cert FILE)"));
        }
        if key.as_os_str().is_empty() {
            return Err(format!("{table}.key_file: required (a PEM file; or --tls-key FILE)"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod listener_tests {
    use super::*;

    #[test]
    fn listener_errors_name_the_key() {
        let mut c = MqttConfig { tls: Some(TlsListenerConfig::default()), ..MqttConfig::default() };
        assert!(c.validate().unwrap_err().starts_with("mqtt.tls.cert_file: required"));
        c.tls = Some(TlsListenerConfig { listen: "nowhere".into(), ..TlsListenerConfig::default() });
        assert!(c.validate().unwrap_err().starts_with("mqtt.tls.listen:"));
        c.tls = None;
        c.websocket = Some(WsListenerConfig { path: "mqtt".into(), ..WsListenerConfig::default() });
        assert!(c.validate().unwrap_err().starts_with("mqtt.websocket.path:"));
        c.websocket = Some(WsListenerConfig::default());
        c.websocket_tls = Some(WssListenerConfig { cert_file: "c.pem".into(), ..WssListenerConfig::default() });
        assert!(c.validate().unwrap_err().starts_with("mqtt.websocket_tls.key_file: required"));
        c.websocket_tls = None;
        assert_eq!(c.validate(), Ok(()));
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn a_small_max_packet_size_also_bounds_connect() {
        let c = MqttConfig { max_packet_size: 1024, ..MqttConfig::default() };
        assert_eq!(c.validate(), Ok(()), "the default max_connect_size must not make a small packet size an error");
        assert_eq!(c.connect_limit(), 1024);
        let c = MqttConfig { max_connect_size: 4096, ..MqttConfig::default() };
        assert_eq!(c.connect_limit(), 4096);
        let c = MqttConfig { max_connect_size: 10, ..MqttConfig::default() };
        assert!(c.validate().unwrap_err().starts_with("mqtt.max_connect_size:"));
    }
}
