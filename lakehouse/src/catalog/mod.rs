//! Where a table's current metadata is kept, and how a writer changes it: load, create, and a
//! commit that applies Iceberg table updates only if the table is still at the version the
//! writer based them on (else [`CatalogError::Conflict`]: the writer re-reads the table and
//! decides what to do; nothing here retries or re-applies on its own).
//!
//! - [`embedded`]: the metadata files in the node's object store (`catalog = "object_store"`).
//! - [`rest`]: an Iceberg REST catalog (`catalog = "rest"`).
//!
//! Not iceberg's `Catalog` trait: its commits go through `TableCommit`, which only iceberg's own
//! transaction actions can build, and `Transaction::commit` reloads and re-applies on its own
//! after a conflict, which for an append of offsets would write rows twice.

pub mod embedded;
pub mod rest;

use async_trait::async_trait;
use iceberg::spec::TableMetadata;
use iceberg::{TableCreation, TableRequirement, TableUpdate};

/// A table's metadata and the file (or catalog version) it was read from.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub metadata: TableMetadata,
    /// The metadata file's URI (what readers open).
    pub location: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The table changed since it was loaded (another commit won).
    #[error("commit conflict: {0}")]
    Conflict(String),
    /// Anything else; worth retrying later (the catalog or the store may be down).
    #[error("{0}")]
    Failed(String),
}

impl From<iceberg::Error> for CatalogError {
    fn from(e: iceberg::Error) -> Self {
        CatalogError::Failed(format!("{e:#}"))
    }
}

pub type Result<T> = std::result::Result<T, CatalogError>;

#[async_trait]
pub trait Catalog: Send + Sync {
    /// Describes the catalog for logs.
    fn describe(&self) -> String;

    /// Creates the namespace if it is not there.
    async fn ensure_namespace(&self, namespace: &str) -> Result<()>;

    /// The table, if it exists.
    async fn load(&self, namespace: &str, table: &str) -> Result<Option<Loaded>>;

    /// Creates the table (or returns it, if another writer created it first).
    async fn create(&self, namespace: &str, creation: TableCreation) -> Result<Loaded>;

    /// Applies `updates` to `base` if the table is still `base` and `requirements` hold.
    async fn commit(
        &self,
        namespace: &str,
        table: &str,
        base: &Loaded,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<Loaded>;

    /// The tables of `namespace` (for the catalog the node serves).
    async fn list(&self, namespace: &str) -> Result<Vec<String>>;
}

/// The metadata `updates` make of `base` (checked against `requirements` first).
pub fn apply(base: &Loaded, requirements: &[TableRequirement], updates: Vec<TableUpdate>) -> Result<TableMetadata> {
    for r in requirements {
        r.check(Some(&base.metadata)).map_err(|e| CatalogError::Conflict(format!("{e}")))?;
    }
    let mut builder = base.metadata.clone().into_builder(Some(base.location.clone()));
    for u in updates {
        builder = u.apply(builder)?;
    }
    Ok(builder.build()?.metadata)
}
