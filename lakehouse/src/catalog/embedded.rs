//! The embedded catalog: each table's metadata beside its data in the node's object store, at
//! `lakehouse/<namespace>/<table>/metadata/v<N>.metadata.json`, the newest named by
//! `metadata/version-hint.text` (just `N`, no newline: what DuckDB's `iceberg_scan` and
//! pyiceberg's `StaticTable` read), so readers need nothing else running.
//!
//! A commit writes `v<N+1>.metadata.json` with a conditional create: of two writers on one
//! version, one wins and the other gets a conflict (the object store's atomic create is the
//! lock). The hint is written after; a reader that meets a stale hint sees the version before,
//! and a writer finds the newest by looking past the hint.

use async_trait::async_trait;
use bytes::Bytes;
use iceberg::TableCreation;
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::{TableRequirement, TableUpdate};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::{Catalog, CatalogError, Loaded, Result, apply};
use crate::io::Store;

pub struct EmbeddedCatalog {
    store: Store,
}

fn failed(what: &str, e: impl std::fmt::Display) -> CatalogError {
    CatalogError::Failed(format!("{what}: {e}"))
}

impl EmbeddedCatalog {
    pub fn new(store: Store) -> EmbeddedCatalog {
        EmbeddedCatalog { store }
    }

    fn table_key(namespace: &str, table: &str) -> String {
        format!("lakehouse/{namespace}/{table}")
    }

    fn metadata_key(namespace: &str, table: &str, version: u64) -> Path {
        Path::from(format!("{}/metadata/v{version}.metadata.json", Self::table_key(namespace, table)))
    }

    fn hint_key(namespace: &str, table: &str) -> Path {
        Path::from(format!("{}/metadata/version-hint.text", Self::table_key(namespace, table)))
    }

    async fn get(&self, key: &Path) -> Result<Option<Bytes>> {
        match self.store.store.get(key).await {
            Ok(g) => Ok(Some(g.bytes().await.map_err(|e| failed("read", e))?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(failed(&format!("read {key}"), e)),
        }
    }

    /// The newest version: from the hint on (a crash may have left the hint one behind), or
    /// by listing when there is no hint.
    async fn newest(&self, namespace: &str, table: &str) -> Result<Option<u64>> {
        let hinted = match self.get(&Self::hint_key(namespace, table)).await? {
            Some(b) => std::str::from_utf8(&b).ok().and_then(|s| s.trim().parse::<u64>().ok()),
            None => None,
        };
        let mut newest = match hinted {
            Some(v) => Some(v),
            None => self.listed_newest(namespace, table).await?,
        };
        while let Some(v) = newest {
            match self.store.store.head(&Self::metadata_key(namespace, table, v + 1)).await {
                Ok(_) => newest = Some(v + 1),
                Err(object_store::Error::NotFound { .. }) => break,
                Err(e) => return Err(failed("look for a newer version", e)),
            }
        }
        Ok(newest)
    }

    async fn listed_newest(&self, namespace: &str, table: &str) -> Result<Option<u64>> {
        use futures::StreamExt;
        let prefix = Path::from(format!("{}/metadata", Self::table_key(namespace, table)));
        let mut listed = self.store.store.list(Some(&prefix));
        let mut newest = None;
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(|e| failed("list metadata", e))?;
            let name = meta.location.filename().unwrap_or_default();
            if let Some(v) = name.strip_prefix('v').and_then(|n| n.strip_suffix(".metadata.json"))
                && let Ok(v) = v.parse::<u64>()
            {
                newest = newest.max(Some(v));
            }
        }
        Ok(newest)
    }

    async fn read_version(&self, namespace: &str, table: &str, version: u64) -> Result<Loaded> {
        let key = Self::metadata_key(namespace, table, version);
        let bytes = self.get(&key).await?.ok_or_else(|| failed(key.as_ref(), "missing"))?;
        let metadata: TableMetadata = serde_json::from_slice(&bytes).map_err(|e| failed(key.as_ref(), e))?;
        Ok(Loaded { metadata, location: self.store.uri(key.as_ref()) })
    }

    /// Writes version `version` if no writer did; then the hint.
    async fn put_version(&self, namespace: &str, table: &str, version: u64, metadata: &TableMetadata) -> Result<()> {
        let key = Self::metadata_key(namespace, table, version);
        let body = serde_json::to_vec(metadata).map_err(|e| failed("encode metadata", e))?;
        let opts = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        match self.store.store.put_opts(&key, PutPayload::from(body), opts).await {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {
                return Err(CatalogError::Conflict(format!("{key} was written by another commit")));
            }
            Err(e) => return Err(failed(&format!("write {key}"), e)),
        }
        let hint = PutPayload::from(version.to_string().into_bytes());
        if let Err(e) = self.store.store.put(&Self::hint_key(namespace, table), hint).await {
            // The version is committed; readers see it once a later hint is written.
            tracing::warn!(table = %table, error = %e, "version-hint.text not updated");
        }
        // Old versions go, as Iceberg's write.metadata.previous-versions-max (100) does: else
        // the folder grows by a file per commit forever. Far more are kept than a writer can
        // fall behind before it is fenced (commits are at least 100 ms apart, fencing is found
        // within seconds), so a stale writer's next version still exists and conflicts.
        if let Some(old) = version.checked_sub(KEPT_VERSIONS).filter(|v| *v > 0) {
            let key = Self::metadata_key(namespace, table, old);
            match self.store.store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => tracing::debug!(table = %table, error = %e, "an old metadata version was not deleted"),
            }
        }
        Ok(())
    }
}

/// Metadata versions kept beside the current one.
const KEPT_VERSIONS: u64 = 100;

fn version_of(location: &str) -> Option<u64> {
    let name = location.rsplit('/').next()?;
    name.strip_prefix('v')?.strip_suffix(".metadata.json")?.parse().ok()
}

#[async_trait]
impl Catalog for EmbeddedCatalog {
    fn describe(&self) -> String {
        format!("object store {}/lakehouse", self.store.base)
    }

    async fn ensure_namespace(&self, _namespace: &str) -> Result<()> {
        Ok(())
    }

    async fn load(&self, namespace: &str, table: &str) -> Result<Option<Loaded>> {
        match self.newest(namespace, table).await? {
            Some(v) => self.read_version(namespace, table, v).await.map(Some),
            None => Ok(None),
        }
    }

    async fn create(&self, namespace: &str, creation: TableCreation) -> Result<Loaded> {
        let name = creation.name.clone();
        let location = self.store.uri(&Self::table_key(namespace, &name));
        let creation = TableCreation { location: Some(location), ..creation };
        let metadata = TableMetadataBuilder::from_table_creation(creation)?.build()?.metadata;
        match self.put_version(namespace, &name, 1, &metadata).await {
            Ok(()) => self.read_version(namespace, &name, 1).await,
            Err(CatalogError::Conflict(_)) => {
                self.load(namespace, &name).await?.ok_or_else(|| failed(&name, "created and gone"))
            }
            Err(e) => Err(e),
        }
    }

    async fn commit(
        &self,
        namespace: &str,
        table: &str,
        base: &Loaded,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<Loaded> {
        let version = version_of(&base.location)
            .ok_or_else(|| failed(&base.location, "not a v<N>.metadata.json of this catalog"))?;
        let metadata = apply(base, &requirements, updates)?;
        self.put_version(namespace, table, version + 1, &metadata).await?;
        let key = Self::metadata_key(namespace, table, version + 1);
        Ok(Loaded { metadata, location: self.store.uri(key.as_ref()) })
    }

    async fn list(&self, namespace: &str) -> Result<Vec<String>> {
        let prefix = Path::from(format!("lakehouse/{namespace}"));
        let listed = self.store.store.list_with_delimiter(Some(&prefix)).await.map_err(|e| failed("list tables", e))?;
        let mut out = Vec::new();
        for dir in listed.common_prefixes {
            if let Some(name) = dir.filename()
                && self.newest(namespace, name).await?.is_some()
            {
                out.push(name.to_owned());
            }
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::TryStreamExt;
    use object_store::ObjectStore;

    use super::*;

    #[tokio::test]
    async fn only_the_last_versions_are_kept_and_the_next_one_still_conflicts() {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let catalog = EmbeddedCatalog::new(Store::new(mem.clone(), "memory:///lake"));
        let creation = crate::schema::creation("t", &Default::default()).unwrap();
        let mut t = catalog.create("silt", creation).await.unwrap();
        let mut behind = None;
        for i in 0..KEPT_VERSIONS + 5 {
            t = catalog.commit("silt", "t", &t, Vec::new(), Vec::new()).await.unwrap();
            if i == 10 {
                behind = Some(t.clone());
            }
        }
        let keys: Vec<String> = mem
            .list(Some(&Path::from("lakehouse/silt/t/metadata")))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        let versions: Vec<u64> = keys.iter().filter_map(|k| version_of(k)).collect();
        let newest = version_of(&t.location).unwrap();
        assert_eq!(versions.len() as u64, KEPT_VERSIONS, "{versions:?}");
        assert!(versions.iter().all(|v| *v > newest - KEPT_VERSIONS), "{versions:?}");
        // A writer many commits behind (less than the versions kept): its next version is
        // still there, so it conflicts instead of landing on an old table.
        let stale = catalog.commit("silt", "t", behind.as_ref().unwrap(), Vec::new(), Vec::new()).await;
        assert!(matches!(stale, Err(CatalogError::Conflict(_))), "{stale:?}");
    }
}
