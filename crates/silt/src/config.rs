//! `silt.toml`: every setting of the server, loaded and validated once at start-up.
//! `config/silt.toml` in the repository documents each key with its default.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use silt_broker::MqttConfig;
use silt_kafka_broker::KafkaConfig;
use silt_lakehouse::LakehouseConfig;
use silt_storage::StorageConfig;
use silt_tiering::{Policies, TieringConfig, TopicPolicy, TopicRule};

/// `[admin]`: the listener for operators and tools: `/metrics` (Prometheus), `/healthz`,
/// `/readyz`, the status page, the Iceberg REST catalog of the node's tables at `/iceberg`, and
/// the gRPC admin API (`silt status`, `silt sessions`, ...).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    pub enabled: bool,
    /// Address bound, exactly as given (`silt serve --admin ADDR` overrides it).
    pub listen: String,
    /// A file holding the bearer token `/api/` and the gRPC API then require. Required when
    /// `listen` is not a loopback address.
    pub token_file: Option<PathBuf>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self { enabled: true, listen: "127.0.0.1:8080".into(), token_file: None }
    }
}

impl AdminConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        let Ok(addr) = self.listen.parse::<std::net::SocketAddr>() else {
            anyhow::bail!("admin.listen: must be an address such as 127.0.0.1:8080, not {:?}", self.listen);
        };
        if self.token_file.as_ref().is_some_and(|f| f.as_os_str().is_empty()) {
            anyhow::bail!("admin.token_file: must not be empty");
        }
        if self.enabled && !addr.ip().is_loopback() && self.token_file.is_none() {
            anyhow::bail!(
                "admin.token_file: required when admin.listen ({}) is not a loopback address: the admin API \
                 can disconnect clients and delete sessions",
                self.listen
            );
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SiltConfig {
    /// Where the commitlog and the index live.
    pub data_dir: PathBuf,
    pub storage: StorageConfig,
    pub mqtt: MqttConfig,
    pub kafka: KafkaConfig,
    pub tiering: TieringConfig,
    pub lakehouse: LakehouseConfig,
    pub admin: AdminConfig,
    /// The policy of topics no `[[topics]]` entry matches.
    pub topic_defaults: TopicPolicy,
    /// Per-topic policies, matched by MQTT topic filter; the first match wins.
    pub topics: Vec<TopicRule>,
}

impl Default for SiltConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            storage: StorageConfig::default(),
            mqtt: MqttConfig::default(),
            kafka: KafkaConfig::default(),
            tiering: TieringConfig::default(),
            lakehouse: LakehouseConfig::default(),
            admin: AdminConfig::default(),
            topic_defaults: TopicPolicy::default(),
            topics: Vec::new(),
        }
    }
}

impl SiltConfig {
    /// Reads and validates a config file. Errors name the file and the offending key.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read config file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let cfg: SiltConfig = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.data_dir.as_os_str().is_empty() {
            anyhow::bail!("data_dir: must not be empty");
        }
        self.storage.validate().map_err(|e| anyhow::anyhow!(e))?;
        self.mqtt.validate().map_err(|e| anyhow::anyhow!(e))?;
        self.kafka.validate().map_err(|e| anyhow::anyhow!(e))?;
        self.tiering.validate().map_err(|e| anyhow::anyhow!(e))?;
        self.lakehouse.validate().map_err(|e| anyhow::anyhow!(e))?;
        self.admin.validate()?;
        self.policies().map(|_| ())
    }

    /// The per-topic policies, resolved.
    pub fn policies(&self) -> anyhow::Result<Policies> {
        Policies::new(self.topic_defaults.clone(), &self.topics).map_err(|e| anyhow::anyhow!(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_config_parses_to_the_defaults() {
        let text = include_str!("../../../config/silt.toml");
        assert_eq!(SiltConfig::parse(text).unwrap(), SiltConfig::default());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = SiltConfig::parse("[storage]\nsegment_byts = 5\n").unwrap_err().to_string();
        assert!(err.contains("segment_byts"), "{err}");
    }

    #[test]
    fn topic_policies_and_tiering_keys_are_checked() {
        let cfg = SiltConfig::parse(
            "[tiering]\nobject_store = \"s3://b/p\"\n[topic_defaults]\nretention_ms = 5\n\
             [[topics]]\nmatch = \"a/#\"\nack = \"object\"\n",
        )
        .unwrap();
        let p = cfg.policies().unwrap();
        assert_eq!(p.for_topic("a/b").ack, silt_tiering::AckDurability::Object);
        assert_eq!(p.for_topic("a/b").retention_ms, 5);
        let err = SiltConfig::parse("[[topics]]\nmatch = \"a/#/b\"\n").unwrap_err().to_string();
        assert!(err.contains("topics[0].match"), "{err}");
        let err = SiltConfig::parse("[[topics]]\nmatch = \"a\"\nack = \"bucket\"\n").unwrap_err().to_string();
        assert!(err.contains("bucket"), "{err}");
        let err = SiltConfig::parse("[tiering]\nobject_store = \"gs://x\"\n").unwrap_err().to_string();
        assert!(err.contains("tiering.object_store"), "{err}");
    }

    #[test]
    fn an_admin_listener_off_loopback_needs_a_token_file() {
        let err = SiltConfig::parse("[admin]\nlisten = \"0.0.0.0:8080\"\n").unwrap_err().to_string();
        assert!(err.contains("admin.token_file"), "{err}");
        SiltConfig::parse("[admin]\nlisten = \"0.0.0.0:8080\"\ntoken_file = \"/etc/silt/token\"\n").unwrap();
        SiltConfig::parse("[admin]\nlisten = \"[::1]:8080\"\n").unwrap();
        SiltConfig::parse("[admin]\nenabled = false\nlisten = \"0.0.0.0:8080\"\n").unwrap();
    }

    #[test]
    fn invalid_value_is_named() {
        let err = SiltConfig::parse("[storage]\nsegment_bytes = 5\n").unwrap_err().to_string();
        assert!(err.contains("storage.segment_bytes"), "{err}");
        let err = SiltConfig::parse("[storage]\nfsync = \"sometimes\"\n").unwrap_err().to_string();
        assert!(err.contains("fsync") && err.contains("sometimes"), "{err}");
    }
}
