//! Tiering settings and per-topic policies: serde data, validated once at start-up.

use std::collections::BTreeMap;
use std::sync::Arc;

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
    /// that one log orders every topic; the log's page cache holds them. The broker's `$SYS`
    /// figures always live here, whatever the policies say (see [`Policies::memory`]).
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
    /// The Iceberg table the topic's messages are written to, if any (set by `[[topics]]`
    /// entries only).
    #[serde(skip)]
    pub lakehouse: Option<Arc<TablePolicy>>,
}

impl Default for TopicPolicy {
    fn default() -> Self {
        Self {
            tier: Tier::Object,
            ack: AckDurability::Local,
            retention_ms: 0,
            retention_bytes: 0,
            partitions: 1,
            lakehouse: None,
        }
    }
}

/// `lakehouse = ...` of a `[[topics]]` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LakehouseFormat {
    /// Written to an Apache Iceberg table.
    Iceberg,
    /// Not written to a table (to exempt topics a later, broader entry would write).
    Off,
}

/// The type of a column projected from a top-level JSON field of the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    Boolean,
    Int,
    Long,
    Float,
    Double,
    String,
    Timestamp,
}

/// The Iceberg table a topic is written to.
#[derive(Clone, Debug, PartialEq)]
pub struct TablePolicy {
    /// The table's name in the lakehouse namespace.
    pub table: String,
    /// How often the table is committed (ms).
    pub commit_interval_ms: u64,
    /// Typed columns projected from top-level JSON fields of the payload, by name.
    pub columns: BTreeMap<String, ColumnType>,
}

/// Every table, with what feeds it: the filters of the `[[topics]]` entries that name it, their
/// columns together and the shortest commit interval among them.
#[derive(Clone, Debug, PartialEq)]
pub struct TableSources {
    pub filters: Vec<String>,
    pub columns: BTreeMap<String, ColumnType>,
    pub commit_interval_ms: u64,
}

/// The envelope columns every table has; projected columns may not take these names.
pub const ENVELOPE_COLUMNS: [&str; 10] =
    ["topic", "topic_levels", "stream", "partition", "offset", "timestamp", "key", "payload", "qos", "properties"];

/// The default table name for a filter: its literal levels joined by `_` (`plant/#` -> `plant`,
/// `factory/+/temp` -> `factory_temp`), lowercased, other characters as `_`; `all` for `#`.
pub fn table_name_for(filter: &str) -> String {
    let literal: Vec<String> = filter
        .split('/')
        .filter(|l| !matches!(*l, "+" | "#" | ""))
        .map(|l| l.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect())
        .collect();
    let name = literal.join("_");
    match name.chars().next() {
        None => "all".into(),
        Some(c) if c.is_ascii_digit() => format!("t_{name}"),
        Some(_) => name,
    }
}

fn identifier_error(name: &str) -> Option<&'static str> {
    let mut chars = name.chars();
    match chars.next() {
        None => Some("must not be empty"),
        _ if name.len() > 128 => Some("must be at most 128 characters"),
        Some(c) if !(c.is_ascii_alphabetic() || c == '_') => Some("must start with a letter or '_'"),
        _ if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') => {
            Some("may hold only ASCII letters, digits and '_'")
        }
        _ => None,
    }
}

/// One `[[topics]]` entry: a topic filter and the keys it overrides.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
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
    /// `"iceberg"`: the matching topics are written to an Iceberg table.
    pub lakehouse: Option<LakehouseFormat>,
    /// The table's name (default: derived from the filter, see [`table_name_for`]).
    pub table: Option<String>,
    /// How often the table is committed (ms; default 10000).
    pub commit_interval_ms: Option<u64>,
    /// Typed columns projected from top-level JSON fields of the payload.
    pub columns: Option<BTreeMap<String, ColumnType>>,
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
    tables: BTreeMap<String, TableSources>,
}

/// The table a `[[topics]]` entry names, validated; errors name the key.
fn table_policy(r: &TopicRule, key: &str) -> Result<Option<TablePolicy>, String> {
    if r.lakehouse != Some(LakehouseFormat::Iceberg) {
        let stray = [
            ("table", r.table.is_some()),
            ("commit_interval_ms", r.commit_interval_ms.is_some()),
            ("columns", r.columns.is_some()),
        ];
        if let Some((k, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(format!("{key}.{k}: set without lakehouse = \"iceberg\""));
        }
        return Ok(None);
    }
    let table = r.table.clone().unwrap_or_else(|| table_name_for(&r.pattern));
    if let Some(why) = identifier_error(&table) {
        return Err(format!("{key}.table: {table:?} {why}"));
    }
    let commit_interval_ms = r.commit_interval_ms.unwrap_or(10_000);
    if !(100..=86_400_000).contains(&commit_interval_ms) {
        return Err(format!("{key}.commit_interval_ms: must be between 100 and 86400000"));
    }
    let columns = r.columns.clone().unwrap_or_default();
    for name in columns.keys() {
        if let Some(why) = identifier_error(name) {
            return Err(format!("{key}.columns.{name}: {why}"));
        }
        if ENVELOPE_COLUMNS.contains(&name.as_str()) {
            return Err(format!("{key}.columns.{name}: an envelope column has that name"));
        }
    }
    Ok(Some(TablePolicy { table, commit_interval_ms, columns }))
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
                lakehouse: table_policy(r, &format!("topics[{i}]"))?.map(Arc::new),
            };
            consistent(&p, &format!("topics[{i}]"))?;
            if p.lakehouse.is_some() && p.tier != Tier::Object {
                return Err(format!(
                    "topics[{i}].lakehouse: needs tier = \"object\" (a table in the bucket would keep what the tier keeps off it)"
                ));
            }
            resolved.push(p);
        }
        let mut tables: BTreeMap<String, TableSources> = BTreeMap::new();
        for (i, (r, p)) in rules.iter().zip(&resolved).enumerate() {
            let Some(t) = &p.lakehouse else { continue };
            let entry = tables.entry(t.table.clone()).or_insert_with(|| TableSources {
                filters: Vec::new(),
                columns: BTreeMap::new(),
                commit_interval_ms: t.commit_interval_ms,
            });
            entry.filters.push(r.pattern.clone());
            entry.commit_interval_ms = entry.commit_interval_ms.min(t.commit_interval_ms);
            for (name, ty) in &t.columns {
                match entry.columns.insert(name.clone(), *ty) {
                    Some(other) if other != *ty => {
                        return Err(format!(
                            "topics[{i}].columns.{name}: {ty:?} here, {other:?} in another entry of table {:?}",
                            t.table
                        ));
                    }
                    _ => {}
                }
            }
        }
        let any = |f: &dyn Fn(&TopicPolicy) -> bool| f(&default) || resolved.iter().any(f);
        let any_object_ack = any(&|p| p.ack == AckDurability::Object);
        let any_local_tier = any(&|p| p.tier == Tier::Local);
        let any_memory_tier = any(&|p| p.tier == Tier::Memory);
        Ok(Policies { default, rules: resolved, trie, any_object_ack, any_local_tier, any_memory_tier, tables })
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

    /// Whether any policy puts topics in memory only (`$SYS` figures always live there, see
    /// [`Policies::memory`], whatever this says).
    pub fn any_memory_tier(&self) -> bool {
        self.any_memory_tier
    }

    /// `(memory, object_ack)` for a publish to `topic`, with one lookup: whether it lives in
    /// memory only (see [`Policies::memory`]) and whether its acknowledgement waits for the
    /// object store. Without memory or `ack = "object"` policies, an ordinary topic costs a
    /// prefix check and no lookup.
    pub fn decide(&self, topic: &str) -> (bool, bool) {
        if is_sys(topic) {
            return (true, false);
        }
        if !self.any_memory_tier && !self.any_object_ack {
            return (false, false);
        }
        let p = self.for_topic(topic);
        (self.any_memory_tier && p.tier == Tier::Memory, p.ack == AckDurability::Object)
    }

    /// Whether `topic`'s messages live in memory only: a `tier = "memory"` topic's, and the
    /// broker's `$SYS` figures whatever the policies say. The figures are the broker's, current
    /// only while it runs, and republished at its first statistics tick after a start: writing
    /// them to the disk and the bucket every few seconds would cost requests and bytes for
    /// nothing.
    pub fn memory(&self, topic: &str) -> bool {
        is_sys(topic) || (self.any_memory_tier && self.for_topic(topic).tier == Tier::Memory)
    }

    /// Whether a record of `topic` (or, without a topic, of `stream`) is kept off the store.
    /// The broker's internal streams always go to the store.
    pub fn withholds(&self, topic: &str, stream: &str) -> bool {
        if !self.any_local_tier {
            return false;
        }
        match (topic.is_empty(), stream.starts_with("__silt_")) {
            // `$SYS` records are volatile (memory tier), and withheld as such.
            (false, _) => !is_sys(topic) && self.for_topic(topic).tier == Tier::Local,
            (true, true) => false,
            (true, false) => self.for_topic(stream).tier == Tier::Local,
        }
    }

    /// Every Iceberg table the policies name, with what feeds it.
    pub fn tables(&self) -> &BTreeMap<String, TableSources> {
        &self.tables
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

/// A `$SYS/...` topic: the broker's own figures, in the memory tier whatever the policies say.
fn is_sys(topic: &str) -> bool {
    topic.starts_with("$SYS/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_matching_rule_wins_and_unset_keys_fall_back() {
        let default = TopicPolicy { retention_ms: 7, ..TopicPolicy::default() };
        let rule = |pattern: &str| TopicRule { pattern: pattern.into(), ..TopicRule::default() };
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
            lakehouse: None,
        };
        assert_eq!(p.for_topic("a/b/x"), &object);
        let local = TopicPolicy {
            tier: Tier::Local,
            ack: AckDurability::Local,
            retention_ms: 1,
            retention_bytes: 0,
            partitions: 3,
            lakehouse: None,
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
    fn memory_topics_are_named_by_policy_and_sys_figures_always_are() {
        let rules = [TopicRule { pattern: "#".into(), tier: Some(Tier::Memory), ..TopicRule::default() }];
        let p = Policies::new(TopicPolicy::default(), &rules).unwrap();
        assert!(p.any_memory_tier() && p.memory("fast/1") && p.memory("$SYS/broker/uptime"));
        assert_eq!((p.decide("fast/1"), p.decide("$SYS/broker/uptime")), ((true, false), (true, false)));

        // No policy names the memory tier: ordinary topics are durable, `$SYS` figures are not.
        let none = Policies::new(TopicPolicy::default(), &[]).unwrap();
        assert!(!none.any_memory_tier() && !none.memory("fast/1"));
        assert!(none.memory("$SYS/broker/version") && none.memory("$SYS/broker/sessions/c%2F1/backlog"));
        assert_eq!((none.decide("fast/1"), none.decide("$SYS/broker/version")), ((false, false), (true, false)));
        // A topic named like `$SYS` without its separator is an ordinary one.
        assert_eq!(none.decide("$SYSTEM/x"), (false, false));

        // Everything in the bucket, even acknowledged from it, or everything local: `$SYS`
        // still lives in memory, is acknowledged without the store, and is not "local".
        for tier in [Tier::Object, Tier::Local] {
            let ack = (tier == Tier::Object).then_some(AckDurability::Object);
            let rules = [TopicRule { pattern: "#".into(), tier: Some(tier), ack, ..TopicRule::default() }];
            let p = Policies::new(TopicPolicy::default(), &rules).unwrap();
            assert!(!p.any_memory_tier() && !p.memory("a/b") && p.memory("$SYS/broker/version"), "{tier:?}");
            assert_eq!(p.decide("$SYS/broker/version"), (true, false), "{tier:?}");
            assert_eq!(p.decide("a/b"), (false, tier == Tier::Object), "{tier:?}");
            assert!(!p.withholds("$SYS/broker/version", "$SYS"), "{tier:?}");
            assert_eq!(p.withholds("a/b", "a"), tier == Tier::Local, "{tier:?}");
        }
    }

    #[test]
    fn tables_are_named_by_their_entries_and_fed_by_all_of_them() {
        let iceberg = |pattern: &str| TopicRule {
            pattern: pattern.into(),
            lakehouse: Some(LakehouseFormat::Iceberg),
            ..TopicRule::default()
        };
        let cols = |c: &[(&str, ColumnType)]| Some(c.iter().map(|(n, t)| (n.to_string(), *t)).collect());
        let rules = [
            TopicRule { lakehouse: Some(LakehouseFormat::Off), ..iceberg("plant/test/#") },
            TopicRule { columns: cols(&[("temp", ColumnType::Double)]), ..iceberg("plant/#") },
            TopicRule {
                table: Some("plant".into()),
                commit_interval_ms: Some(500),
                columns: cols(&[("unit", ColumnType::String)]),
                ..iceberg("+/status")
            },
            iceberg("factory/+/temp"),
        ];
        let p = Policies::new(TopicPolicy::default(), &rules).unwrap();
        assert_eq!(p.for_topic("plant/test/x").lakehouse, None, "an earlier entry turns it off");
        assert_eq!(p.for_topic("plant/a").lakehouse.as_ref().unwrap().table, "plant");
        assert_eq!(p.for_topic("door/status").lakehouse.as_ref().unwrap().table, "plant");
        assert_eq!(p.for_topic("factory/l1/temp").lakehouse.as_ref().unwrap().table, "factory_temp");
        assert_eq!(p.for_topic("other").lakehouse, None);
        let plant = &p.tables()["plant"];
        assert_eq!(plant.filters, ["plant/#", "+/status"]);
        assert_eq!(plant.commit_interval_ms, 500);
        assert_eq!(plant.columns.keys().collect::<Vec<_>>(), ["temp", "unit"]);
        assert_eq!(p.tables()["factory_temp"].commit_interval_ms, 10_000);
        assert_eq!(
            (table_name_for("#"), table_name_for("9lives/+"), table_name_for("a-b/c")),
            ("all".into(), "t_9lives".into(), "a_b_c".into())
        );

        let err = |r: TopicRule| Policies::new(TopicPolicy::default(), &[r]).err().unwrap();
        assert!(
            err(TopicRule { pattern: "a".into(), table: Some("x".into()), ..TopicRule::default() })
                .contains("topics[0].table: set without")
        );
        assert!(err(TopicRule { table: Some("x-y".into()), ..iceberg("a") }).contains("topics[0].table"));
        assert!(
            err(TopicRule { columns: cols(&[("payload", ColumnType::String)]), ..iceberg("a") }).contains("envelope")
        );
        assert!(err(TopicRule { commit_interval_ms: Some(1), ..iceberg("a") }).contains("commit_interval_ms"));
        let clash = [
            TopicRule { columns: cols(&[("t", ColumnType::Double)]), ..iceberg("a/#") },
            TopicRule { table: Some("a".into()), columns: cols(&[("t", ColumnType::Long)]), ..iceberg("b/#") },
        ];
        assert!(Policies::new(TopicPolicy::default(), &clash).err().unwrap().contains("topics[1].columns.t"));
    }
}
