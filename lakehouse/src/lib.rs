//! Silt's lakehouse view: topics written as Apache Iceberg tables (Parquet data files and
//! Iceberg commits) into the node's bucket, so SQL engines (DuckDB, Trino, Spark) query the
//! history with nothing between them and the data.
//!
//! - A `[[topics]]` entry with `lakehouse = "iceberg"` sends its topics to a table (`table`,
//!   `commit_interval_ms`, typed `columns` projected from JSON payloads: `silt_tiering`'s
//!   `TablePolicy`); `[lakehouse]` ([`LakehouseConfig`]) picks the catalog and maintenance.
//! - [`writer`]: one task per table, reading the log behind ingestion (never holding an
//!   acknowledgement back) and committing exactly once (the offsets are in the snapshots).
//! - [`catalog`]: the embedded catalog (metadata files in the bucket) or a REST catalog.
//! - [`snapshot`], [`schema`], [`rows`], [`read`]: the pieces of a commit.
//! - [`maintenance`]: compaction of small files, snapshot expiry, deleting what nothing uses.
//! - [`io`]: iceberg's file I/O through the node's `object_store`.
//! - [`serve`]: the read side of the Iceberg REST catalog protocol, for the admin listener.
//!
//! The writers run on a runtime of their own (Parquet encoding is CPU work): client
//! connections never wait for them. Retention keeps what a table has not written yet
//! ([`Lakehouse::floor`]), within `max_lag_ms`.

pub mod catalog;
pub mod config;
pub mod io;
pub mod maintenance;
pub mod read;
pub mod rows;
pub mod schema;
pub mod serve;
pub mod snapshot;
pub mod writer;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use silt_dataset::Streams;
use silt_storage::Storage;
use silt_tiering::{Policies, Tiering};
use silt_types::LogPosition;

pub use config::{CatalogKind, LakehouseConfig};
pub use read::Visibility;

use crate::catalog::Catalog;
use crate::writer::{Handles, TableStats, TableWriter};

/// The lakehouse of one node: its table writers.
pub struct Lakehouse {
    rt: Mutex<Option<tokio::runtime::Runtime>>,
    tables: Vec<(String, Arc<TableStats>)>,
    catalog: Arc<dyn Catalog>,
    namespace: String,
}

/// A table's figures, at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableFigures {
    pub name: String,
    pub commits: u64,
    pub commit_failures: u64,
    pub rows: u64,
    pub files: u64,
    pub compactions: u64,
    pub lag_ms: u64,
    pub holding_retention: bool,
    pub fenced: bool,
}

impl Lakehouse {
    /// Starts a writer per table the policies name; `None` when they name none.
    pub fn start(
        cfg: LakehouseConfig,
        tiering: &Tiering,
        storage: Arc<Storage>,
        streams: Arc<Streams>,
        policies: Arc<Policies>,
        visibility: Option<Arc<dyn Visibility>>,
    ) -> Result<Option<Arc<Lakehouse>>, String> {
        cfg.validate()?;
        if policies.tables().is_empty() {
            return Ok(None);
        }
        let store = io::Store::new(tiering.store(), &tiering.describe());
        let catalog: Arc<dyn Catalog> = match cfg.catalog {
            CatalogKind::ObjectStore => Arc::new(catalog::embedded::EmbeddedCatalog::new(store.clone())),
            CatalogKind::Rest => {
                let credential = cfg.catalog_credential.clone().or_else(|| {
                    let id = std::env::var("AWS_ACCESS_KEY_ID").ok()?;
                    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").ok()?;
                    Some(format!("{id}:{secret}"))
                });
                let uri = cfg.catalog_uri.as_deref().expect("invariant: validated");
                Arc::new(
                    catalog::rest::RestCatalog::new(uri, cfg.warehouse.clone(), credential, cfg.catalog_token.clone())
                        .map_err(|e| format!("lakehouse.catalog_uri: {e}"))?,
                )
            }
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("silt-lakehouse")
            .enable_all()
            .build()
            .map_err(|e| format!("lakehouse runtime: {e}"))?;
        let fenced_tiering = tiering.fence_probe();
        let handles = Handles {
            catalog: catalog.clone(),
            io: store.file_io(),
            cfg: Arc::new(cfg.clone()),
            epoch: tiering.epoch(),
            read: Arc::new(read::Sources { storage, streams, policies: policies.clone() }),
            visibility,
            fenced: fenced_tiering,
            uploaded: tiering.upload_waiter(),
        };
        let mut tables = Vec::new();
        for (name, sources) in policies.tables() {
            let w = TableWriter::new(name, sources.clone(), &handles);
            tables.push((name.clone(), w.stats.clone()));
            tracing::info!(table = %name, filters = ?sources.filters, catalog = %catalog.describe(),
                commit_interval_ms = sources.commit_interval_ms, "lakehouse table writer started");
            rt.spawn(w.run());
        }
        Ok(Some(Arc::new(Lakehouse { rt: Mutex::new(Some(rt)), tables, catalog, namespace: cfg.namespace })))
    }

    /// The lowest log position a table still has to write (retention keeps it).
    pub fn floor(&self) -> LogPosition {
        LogPosition(self.tables.iter().map(|(_, s)| s.floor.load(Ordering::Relaxed)).min().unwrap_or(u64::MAX))
    }

    pub fn figures(&self) -> Vec<TableFigures> {
        self.tables
            .iter()
            .map(|(name, s)| TableFigures {
                name: name.clone(),
                commits: s.commits.load(Ordering::Relaxed),
                commit_failures: s.commit_failures.load(Ordering::Relaxed),
                rows: s.rows.load(Ordering::Relaxed),
                files: s.files.load(Ordering::Relaxed),
                compactions: s.compactions.load(Ordering::Relaxed),
                lag_ms: s.lag_ms.load(Ordering::Relaxed),
                holding_retention: s.holding.load(Ordering::Relaxed),
                fenced: s.fenced.load(Ordering::Relaxed),
            })
            .collect()
    }

    pub fn catalog(&self) -> Arc<dyn Catalog> {
        self.catalog.clone()
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Runs `f` on the lakehouse's own runtime, where its catalog's clients live (`None` once
    /// shut down).
    pub async fn on_runtime<F>(&self, f: F) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = self.rt.lock().expect("invariant: lock not poisoned").as_ref()?.handle().clone();
        handle.spawn(f).await.ok()
    }

    /// Stops the writers (what they had not committed is written by the next start).
    pub fn shutdown(&self) {
        if let Some(rt) = self.rt.lock().expect("invariant: lock not poisoned").take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(5));
        }
    }
}
