//! The `[kafka]` settings.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Serve the Kafka protocol at all.
    pub enabled: bool,
    /// Address bound, exactly as given (`silt serve --kafka ADDR` overrides it).
    pub listen: String,
    /// `host:port` that Metadata names for this broker; default: the bound address.
    pub advertised: Option<String>,
    /// Largest request frame read (bytes), checked before the body is read. Kafka's
    /// `socket.request.max.bytes`.
    pub max_request_bytes: usize,
    /// Largest record batch accepted as produced (bytes): larger ones get MESSAGE_TOO_LARGE.
    /// Reported as `message.max.bytes` by DescribeConfigs.
    pub max_message_bytes: usize,
    /// Largest a produced batch may inflate to (bytes); a batch that would inflate beyond it
    /// is refused as corrupt, so a small compressed batch cannot take the broker's memory.
    pub max_inflated_bytes: usize,
    /// Create a topic when a producer writes to it or a client asks for its metadata, as
    /// Kafka's `auto.create.topics.enable` does.
    pub auto_create_topics: bool,
    /// Kafka connections open at once; more are closed at once.
    pub max_connections: usize,
    /// Longest a fetch may wait for data (ms), whatever the client asks.
    pub max_fetch_wait_ms: u64,
    /// How long a new group waits for more members before its first generation (ms); each
    /// joining member extends it (Kafka's `group.initial.rebalance.delay.ms`).
    pub group_initial_rebalance_delay_ms: u64,
    /// Session timeouts a consumer may ask for (ms): shorter or longer ones are refused with
    /// INVALID_SESSION_TIMEOUT (`group.min.session.timeout.ms`, `group.max.session.timeout.ms`).
    pub group_min_session_timeout_ms: u64,
    pub group_max_session_timeout_ms: u64,
    /// Members per group; one more gets GROUP_MAX_SIZE_REACHED (`group.max.size`).
    pub group_max_size: usize,
    /// How long committed offsets outlive their group's last member (minutes;
    /// `offsets.retention.minutes`).
    pub offsets_retention_minutes: u64,
    /// SASL mechanisms offered when `mqtt.auth.password_file` is set (the Kafka listener
    /// authenticates against the same users): any of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512.
    pub sasl_mechanisms: Vec<String>,
    /// How long a connection that must authenticate may take to (ms); then it is closed.
    pub auth_timeout_ms: u64,
    /// A connection with no request for this long is closed (ms; Kafka's
    /// `connections.max.idle.ms`).
    pub connections_max_idle_ms: u64,
    /// Kafka over TLS (`[kafka.tls]`), a second listener; off when absent.
    pub tls: Option<KafkaTlsConfig>,
}

/// The `[kafka.tls]` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaTlsConfig {
    /// Address bound, exactly as given.
    pub listen: String,
    /// `host:port` that Metadata names to clients of this listener; default: the bound address.
    #[serde(default)]
    pub advertised: Option<String>,
    /// Certificate chain, leaf first (PEM).
    pub cert_file: std::path::PathBuf,
    /// Private key: PKCS#8, PKCS#1 or SEC1 (PEM).
    pub key_file: std::path::PathBuf,
}

/// The SASL mechanisms a Kafka client may use.
pub const SASL_MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: "127.0.0.1:9092".into(),
            advertised: None,
            max_request_bytes: 100 << 20,
            max_message_bytes: 2 << 20,
            max_inflated_bytes: 64 << 20,
            auto_create_topics: true,
            max_connections: 10_000,
            max_fetch_wait_ms: 30_000,
            group_initial_rebalance_delay_ms: 3000,
            group_min_session_timeout_ms: 6000,
            group_max_session_timeout_ms: 1_800_000,
            group_max_size: 10_000,
            offsets_retention_minutes: 10_080,
            sasl_mechanisms: SASL_MECHANISMS.iter().map(|m| m.to_string()).collect(),
            auth_timeout_ms: 10_000,
            connections_max_idle_ms: 600_000,
            tls: None,
        }
    }
}

impl KafkaConfig {
    pub fn validate(&self) -> Result<(), String> {
        let bad = |k: &str, why: &str| Err(format!("kafka.{k}: {why}"));
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return bad("listen", "must be an address such as 127.0.0.1:9092");
        }
        let host_port = |a: &str| a.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if self.advertised.as_deref().is_some_and(|a| !host_port(a)) {
            return bad("advertised", "must be host:port");
        }
        if let Some(t) = &self.tls {
            if t.listen.parse::<std::net::SocketAddr>().is_err() {
                return bad("tls.listen", "must be an address such as 127.0.0.1:9093");
            }
            if t.advertised.as_deref().is_some_and(|a| !host_port(a)) {
                return bad("tls.advertised", "must be host:port");
            }
            if t.cert_file.as_os_str().is_empty() || t.key_file.as_os_str().is_empty() {
                return bad("tls", "cert_file and key_file are required (PEM files)");
            }
        }
        if let Some(m) = self.sasl_mechanisms.iter().find(|m| !SASL_MECHANISMS.contains(&m.as_str())) {
            return bad("sasl_mechanisms", &format!("{m:?} is not one of {SASL_MECHANISMS:?}"));
        }
        if self.auth_timeout_ms == 0 {
            return bad("auth_timeout_ms", "must be greater than 0");
        }
        if self.connections_max_idle_ms == 0 {
            return bad("connections_max_idle_ms", "must be greater than 0");
        }
        if self.max_message_bytes < 1024 || self.max_message_bytes > self.max_request_bytes {
            return bad("max_message_bytes", "must be at least 1024 and at most max_request_bytes");
        }
        if self.max_inflated_bytes < self.max_message_bytes {
            return bad("max_inflated_bytes", "must be at least max_message_bytes");
        }
        if self.max_request_bytes > i32::MAX as usize {
            return bad("max_request_bytes", "must fit a Kafka frame (2 GiB)");
        }
        if self.max_connections == 0 {
            return bad("max_connections", "must be at least 1");
        }
        if let Err(e) = self.group_settings().validate() {
            return Err(format!("kafka.group_*: {e}"));
        }
        Ok(())
    }

    /// The group coordinator's settings.
    pub fn group_settings(&self) -> silt_kafka::group::Settings {
        use std::time::Duration;
        silt_kafka::group::Settings {
            initial_rebalance_delay: Duration::from_millis(self.group_initial_rebalance_delay_ms),
            min_session_timeout: Duration::from_millis(self.group_min_session_timeout_ms),
            max_session_timeout: Duration::from_millis(self.group_max_session_timeout_ms),
            max_group_size: self.group_max_size,
            offsets_retention: Duration::from_secs(self.offsets_retention_minutes.saturating_mul(60)),
            ..silt_kafka::group::Settings::default()
        }
    }
}
