//! The `[lakehouse]` settings (which catalog, table maintenance); what each table holds comes
//! from the `[[topics]]` policies (`silt_tiering::TablePolicy`).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CatalogKind {
    /// The tables' metadata in the node's object store, beside their data, with a
    /// `version-hint.text` (readers need nothing else running).
    #[default]
    ObjectStore,
    /// An Iceberg REST catalog (Polaris, Lakekeeper, Glue's REST endpoint, SeaweedFS).
    Rest,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LakehouseConfig {
    pub catalog: CatalogKind,
    /// The REST catalog's base URI (`catalog = "rest"`).
    pub catalog_uri: Option<String>,
    /// The warehouse the REST catalog is asked for.
    pub warehouse: Option<String>,
    /// OAuth2 client credentials `id:secret` for the REST catalog; default
    /// `AWS_ACCESS_KEY_ID:AWS_SECRET_ACCESS_KEY` when those are set.
    pub catalog_credential: Option<String>,
    /// A static bearer token for the REST catalog, instead of credentials.
    pub catalog_token: Option<String>,
    /// The namespace the tables are in.
    pub namespace: String,
    /// Data files aim at this size (bytes): compaction merges smaller ones up to it.
    pub target_file_size_bytes: u64,
    /// How often a table's small files are compacted and old snapshots expired (ms).
    pub compaction_interval_ms: u64,
    /// Snapshots older than this are expired (ms), keeping at least `min_snapshots_to_keep`.
    /// Every metadata version lists the snapshots kept: at a commit every 10 s an hour is 360
    /// of them (~300 KB a version), a day would be 8,640 (~7 MB written per commit).
    pub snapshot_max_age_ms: u64,
    pub min_snapshots_to_keep: usize,
    /// Retention waits for a table this far behind (ms of the oldest unwritten message); past
    /// it, retention goes on, the rows it deletes are never written, and a warning says so.
    pub max_lag_ms: u64,
    /// Rows written per commit at most (the rest go in the next one, at once).
    pub max_rows_per_commit: usize,
}

impl Default for LakehouseConfig {
    fn default() -> Self {
        Self {
            catalog: CatalogKind::ObjectStore,
            catalog_uri: None,
            warehouse: None,
            catalog_credential: None,
            catalog_token: None,
            namespace: "silt".into(),
            target_file_size_bytes: 128 << 20,
            compaction_interval_ms: 600_000,
            snapshot_max_age_ms: 3_600_000,
            min_snapshots_to_keep: 10,
            max_lag_ms: 86_400_000,
            max_rows_per_commit: 500_000,
        }
    }
}

impl LakehouseConfig {
    pub fn validate(&self) -> Result<(), String> {
        let bad = |k: &str, why: &str| Err(format!("lakehouse.{k}: {why}"));
        if self.catalog == CatalogKind::Rest {
            match &self.catalog_uri {
                None => return bad("catalog_uri", "required with catalog = \"rest\""),
                Some(u) if url::Url::parse(u).is_err() => return bad("catalog_uri", "must be a URL"),
                _ => {}
            }
            if self.catalog_credential.as_deref().is_some_and(|c| !c.contains(':')) {
                return bad("catalog_credential", "must be id:secret");
            }
        }
        let ns = &self.namespace;
        if ns.is_empty() || !ns.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return bad("namespace", "must be ASCII letters, digits and '_'");
        }
        if self.target_file_size_bytes < 1 << 20 {
            return bad("target_file_size_bytes", "must be at least 1048576");
        }
        if self.compaction_interval_ms < 1000 {
            return bad("compaction_interval_ms", "must be at least 1000");
        }
        if self.min_snapshots_to_keep == 0 {
            return bad("min_snapshots_to_keep", "must be at least 1");
        }
        if self.max_rows_per_commit == 0 {
            return bad("max_rows_per_commit", "must be at least 1");
        }
        Ok(())
    }
}
