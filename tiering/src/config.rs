//! Tiering settings and per-topic policies: serde data, validated once at start-up.

use serde::{Deserialize, Serialize};
use silt_types::{TopicFilter, TopicTrie};

/// `[tiering]`: where sealed segments go and how the local disk caches them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TieringConfig {
    /// `s3://bucket/prefix` (credentials, region and endpoint from the `AWS_*` environment or
    /// the instance role) or `file:///path`. Unset: `file://DATA_DIR/objects`.
    pub object_store: Option<String>,
    /// Group window for `ack = "object"` topics (ms): at most this often, the active segment's
    /// new bytes are uploaded as a tail object for the pending acknowledgements, answered once
    /// the manifest names it.
    pub object_ack_window_ms: u64,
    /// Bytes of uploaded segments kept on the local disk; older ones are evicted and read back
    /// through ranged GETs.
    pub hot_cache_bytes: u64,
    /// Memory for blocks read from the object store (bytes).
    pub block_cache_bytes: u64,
    /// Size of one cached block, and of the read-ahead unit (bytes).
    pub block_bytes: u64,
    /// Blocks fetched by one GET after a cache miss (read-ahead).
    pub read_ahead_blocks: u64,
    /// Segments larger than this are uploaded in parts of this size (multipart upload). Each
    /// part is a PUT request; an upload holds up to three parts in memory.
    pub multipart_part_bytes: u64,
    /// How often retention looks for expired objects (ms).
    pub retention_check_interval_ms: u64,
    /// How often a node checks that no newer node took its prefix over (ms); it also finds out
    /// at its next manifest commit.
    pub fence_check_interval_ms: u64,
    /// On SIGTERM, how long to keep trying to upload what is pending before exiting anyway (ms).
    /// What is left is uploaded on the next start.
    pub shutdown_upload_timeout_ms: u64,
}

impl Default for TieringConfig {
    fn default() -> Self {
        Self {
            object_store: None,
            object_ack_window_ms: 100,
            hot_cache_bytes: 1 << 30,
            block_cache_bytes: 64 << 20,
            block_bytes: 1 << 20,
            read_ahead_blocks: 4,
            // 32 MiB: a default 128 MiB segment is 4 part PUTs + 2 for the upload + 2 for the
            // manifest, under 3 write requests/s at 50 MB/s (16 MiB parts made 4.5/s).
            multipart_part_bytes: 32 << 20,
            retention_check_interval_ms: 60_000,
            fence_check_interval_ms: 5_000,
            shutdown_upload_timeout_ms: 30_000,
        }
    }
}

impl TieringConfig {
    pub fn validate(&self) -> Result<(), String> {
        let bad = |key: &str, why: &str| Err(format!("tiering.{key}: {why}"));
        if let Some(url) = &self.object_store {
            crate::store::StoreUrl::parse(url).map_err(|e| format!("tiering.object_store: {e}"))?;
        }
        if !(1..=60_000).contains(&self.object_ack_window_ms) {
            return bad("object_ack_window_ms", "must be between 1 and 60000");
        }
        if self.block_bytes < 4096 {
            return bad("block_bytes", "must be at least 4096");
        }
        if self.block_cache_bytes < self.block_bytes {
            return bad("block_cache_bytes", "must be at least block_bytes");
        }
        if self.read_ahead_blocks == 0 {
            return bad("read_ahead_blocks", "must be at least 1");
        }
        if self.multipart_part_bytes < 5 << 20 {
            return bad("multipart_part_bytes", "must be at least 5242880 (the S3 minimum part size)");
        }
        if self.retention_check_interval_ms == 0 {
            return bad("retention_check_interval_ms", "must be greater than 0");
        }
        if self.fence_check_interval_ms == 0 {
            return bad("fence_check_interval_ms", "must be greater than 0");
        }
        Ok(())
    }
}

/// When a publish to a topic is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AckDurability {
    /// After the commitlog write (and fsync, per `storage.fsync`).
    #[default]
    Local,
    /// After the object store holds the data.
    Object,
}

/// Where a topic's messages live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// The object store is the durable copy; the local disk caches it.
    #[default]
    Object,
    /// Only the local disk: the object-store copy of a segment withholds these messages
    /// (same-length stand-ins keep positions and offsets), and segments holding them are never
    /// evicted. Losing the disk loses them; retention still deletes them.
    Local,
    /// The process's memory: acknowledged without waiting for an fsync, never uploaded (the
    /// object-store copy holds stand-ins), delivered while the broker runs and gone after a
    /// restart, like a broker without persistence. Their bytes pass through the commitlog so
    /// that one log orders every topic; the log's page cache holds them.
    Memory,
}

/// `[topic_defaults]`: the policy of topics no `[[topics]]` entry matches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopicPolicy {
    pub tier: Tier,
    pub ack: AckDurability,
    /// Messages older than this are deleted (ms); 0 keeps them forever.
    pub retention_ms: u64,
    /// Per topic, bytes kept beyond which the oldest are deleted; 0 = no limit.
    pub retention_bytes: u64,
    /// Partitions a stream (Kafka topic) gets when it is created, by its first record or by
    /// CreateTopics without a count; fixed from then on. Looked up by the stream's name.
    pub partitions: u32,
}

impl Default for TopicPolicy {
    fn default() -> Self {
        Self { tier: Tier::Object, ack: AckDurability::Local, retention_ms: 0, retention_bytes: 0, partitions: 1 }
    }
}

/// One `[[topics]]` entry: a topic filter and the keys it overrides.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicRule {
    /// MQTT topic filter (`+` and `#` wildcards) matched against topic names.
    #[serde(rename = "match")]
    pub pattern: String,
    pub tier: Option<Tier>,
    pub ack: Option<AckDurability>,
    pub retention_ms: Option<u64>,
    pub retention_bytes: Option<u64>,
    pub partitions: Option<u32>,
}

/// Topic policies resolved through a topic trie: the first matching rule (in file order) wins;
/// keys it leaves unset come from the defaults.
pub struct Policies {
    default: TopicPolicy,
    rules: Vec<TopicPolicy>,
    trie: TopicTrie<usize>,
    any_object_ack: bool,
    any_local_tier: bool,
    any_memory_tier: bool,
}

impl Policies {
    pub fn new(default: TopicPolicy, rules: &[TopicRule]) -> Result<Policies, String> {
        let consistent = |p: &TopicPolicy, key: &str| {
            if p.ack == AckDurability::Object && p.tier != Tier::Object {
                return Err(format!(
                    "{key}: ack = \"object\" needs tier = \"object\" (a {} topic never reaches the bucket)",
                    if p.tier == Tier::Local { "local" } else { "memory" }
                ));
            }
            if !(1..=10_000).contains(&p.partitions) {
                return Err(format!("{key}.partitions: must be between 1 and 10000"));
            }
            Ok(())
        };
        consistent(&default, "topic_defaults")?;
        let mut trie = TopicTrie::new();
        let mut resolved = Vec::with_capacity(rules.len());
        for (i, r) in rules.iter().enumerate() {
            let filter = TopicFilter::new(r.pattern.clone()).map_err(|e| format!("topics[{i}].match: {e}"))?;
            trie.insert(&filter, i);
            let p = TopicPolicy {
                tier: r.tier.unwrap_or(default.tier),
                ack: r.ack.unwrap_or(default.ack),
                retention_ms: r.retention_ms.unwrap_or(default.retention_ms),
                retention_bytes: r.retention_bytes.unwrap_or(default.retention_bytes),
                partitions: r.partitions.unwrap_or(default.partitions),
            };
            consistent(&p, &format!("topics[{i}]"))?;
            resolved.push(p);
        }
        let any = |f: &dyn Fn(&TopicPolicy) -> bool| f(&default) || resolved.iter().any(f);
        let any_object_ack = any(&|p| p.ack == AckDurability::Object);
        let any_local_tier = any(&|p| p.tier == Tier::Local);
        let any_memory_tier = any(&|p| p.tier == Tier::Memory);
        Ok(Policies { default, rules: resolved, trie, any_object_ack, any_local_tier, any_memory_tier })
    }

    /// The policy of `topic`.
    pub fn for_topic(&self, topic: &str) -> &TopicPolicy {
        let mut first: Option<usize> = None;
        self.trie.for_each_match(topic, |_, i| first = Some(first.map_or(*i, |f| f.min(*i))));
        first.map_or(&self.default, |i| &self.rules[i])
    }

    /// Whether any topic may need `ack = "object"` (so the ack window runs at all).
    pub fn any_object_ack(&self) -> bool {
        self.any_object_ack
    }

    /// Whether any topic is kept off the object store.
    pub fn any_local_tier(&self) -> bool {
        self.any_local_tier
    }

    /// Whether any topic lives in memory only.
    pub fn any_memory_tier(&self) -> bool {
        self.any_memory_tier
    }

    /// `(memory, object_ack)` for a publish to `topic`, with one lookup: whether it lives in
    /// memory only (see [`Policies::memory`]) and whether its acknowledgement waits for the
    /// object store.
    pub fn decide(&self, topic: &str) -> (bool, bool) {
        if !self.any_memory_tier && !self.any_object_ack {
            return (false, false);
        }
        let p = self.for_topic(topic);
        (self.any_memory_tier && !topic.starts_with("$SYS/") && p.tier == Tier::Memory, p.ack == AckDurability::Object)
    }

    /// Whether `topic`'s messages live in memory only (`$SYS` figures never do: they are
    /// the broker's and follow its own rules).
    pub fn memory(&self, topic: &str) -> bool {
        self.any_memory_tier && !topic.starts_with("$SYS/") && self.for_topic(topic).tier == Tier::Memory
    }

    /// Whether a record of `topic` (or, without a topic, of `stream`) is kept off the store.
    /// The broker's internal streams always go to the store.
    pub fn withholds(&self, topic: &str, stream: &str) -> bool {
        if !self.any_local_tier {
            return false;
        }
        match (topic.is_empty(), stream.starts_with("__silt_")) {
            (false, _) => !topic.starts_with("$SYS/") && self.for_topic(topic).tier == Tier::Local,
            (true, true) => false,
            (true, false) => self.for_topic(stream).tier == Tier::Local,
        }
    }

    /// Whether any policy limits a topic's bytes.
    pub fn any_retention_bytes(&self) -> bool {
        self.default.retention_bytes > 0 || self.rules.iter().any(|p| p.retention_bytes > 0)
    }

    /// Whether any policy deletes data.
    pub fn any_retention(&self) -> bool {
        let deletes = |p: &TopicPolicy| p.retention_ms > 0 || p.retention_bytes > 0;
        deletes(&self.default) || self.rules.iter().any(deletes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_matching_rule_wins_and_unset_keys_fall_back() {
        let default = TopicPolicy { retention_ms: 7, ..TopicPolicy::default() };
        let rule = |pattern: &str| TopicRule {
            pattern: pattern.into(),
            tier: None,
            ack: None,
            retention_ms: None,
            retention_bytes: None,
            partitions: None,
        };
        let rules = [
            TopicRule { ack: Some(AckDurability::Object), retention_bytes: Some(5), ..rule("a/+/x") },
            TopicRule { retention_ms: Some(1), tier: Some(Tier::Local), partitions: Some(3), ..rule("a/#") },
        ];
        let p = Policies::new(default.clone(), &rules).unwrap();
        let object = TopicPolicy {
            tier: Tier::Object,
            ack: AckDurability::Object,
            retention_ms: 7,
            retention_bytes: 5,
            partitions: 1,
        };
        assert_eq!(p.for_topic("a/b/x"), &object);
        let local = TopicPolicy {
            tier: Tier::Local,
            ack: AckDurability::Local,
            retention_ms: 1,
            retention_bytes: 0,
            partitions: 3,
        };
        assert_eq!(p.for_topic("a/b/y"), &local);
        assert_eq!(p.for_topic("a"), &local);
        assert_eq!(p.for_topic("b"), &default);
        assert!(p.any_object_ack() && p.any_local_tier());
        assert!(p.withholds("a/b", "a") && !p.withholds("b", "b") && !p.withholds("", "__silt_sessions"));
        assert!(Policies::new(default.clone(), &[rule("a/#/b")]).is_err());
        let contradiction = TopicRule { tier: Some(Tier::Local), ack: Some(AckDurability::Object), ..rule("c") };
        assert!(Policies::new(default.clone(), &[contradiction]).err().unwrap().contains("topics[0]"));
        let contradiction = TopicRule { tier: Some(Tier::Memory), ack: Some(AckDurability::Object), ..rule("c") };
        assert!(Policies::new(default.clone(), &[contradiction]).err().unwrap().contains("memory topic"));
        let none = TopicRule { partitions: Some(0), ..rule("d") };
        assert!(Policies::new(default, &[none]).err().unwrap().contains("topics[0].partitions"));
    }

    #[test]
    fn memory_topics_are_named_by_policy_and_sys_figures_never_are() {
        let rules = [TopicRule {
            pattern: "#".into(),
            tier: Some(Tier::Memory),
            ack: None,
            retention_ms: None,
            retention_bytes: None,
            partitions: None,
        }];
        let p = Policies::new(TopicPolicy::default(), &rules).unwrap();
        assert!(p.any_memory_tier() && p.memory("fast/1") && !p.memory("$SYS/broker/uptime"));
        assert_eq!((p.decide("fast/1"), p.decide("$SYS/broker/uptime")), ((true, false), (false, false)));
        let none = Policies::new(TopicPolicy::default(), &[]).unwrap();
        assert!(!none.any_memory_tier() && !none.memory("fast/1"));
    }
}
