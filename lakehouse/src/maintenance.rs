//! Keeping a table fast to read and its bucket tidy, between the writer's commits (so they
//! never race it): small files of a day partition are merged into files of about
//! `target_file_size_bytes` (a replace snapshot: the same rows, fewer files, one manifest),
//! snapshots older than `snapshot_max_age_ms` are expired (the newest `min_snapshots_to_keep`
//! stay), and the files only expired snapshots used are deleted.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;
use bytes::Bytes;
use iceberg::io::FileIO;
use iceberg::spec::{DataFile, DataFileFormat, ManifestList, ManifestStatus, PartitionKey, TableMetadata};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{DefaultFileNameGenerator, DefaultLocationGenerator};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{TableRequirement, TableUpdate};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::properties::WriterProperties;

use crate::LakehouseConfig;
use crate::catalog::{Catalog, CatalogError, Loaded};
use crate::snapshot::{self, LiveFile};

/// Bytes rewritten by one compaction at most (more waits for the next one).
const MAX_REWRITE_BYTES: u64 = 1 << 30;

pub struct Maintenance<'a> {
    pub table: &'a str,
    pub namespace: &'a str,
    pub catalog: &'a dyn Catalog,
    pub io: &'a FileIO,
    pub cfg: &'a LakehouseConfig,
    pub epoch: u64,
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e:#}")
}

impl Maintenance<'_> {
    /// Compacts, then expires; the table as it is after, if anything changed.
    pub async fn run(&self, base: Loaded) -> Result<Option<Loaded>, String> {
        let mut current = base;
        let mut changed = false;
        if let Some(t) = self.compact(&current).await? {
            current = t;
            changed = true;
        }
        if let Some(t) = self.expire(&current).await? {
            current = t;
            changed = true;
        }
        Ok(changed.then_some(current))
    }

    /// Groups of small files worth merging, per partition, packed up to the target size.
    fn plan(&self, live: &[LiveFile]) -> Vec<Vec<LiveFile>> {
        let target = self.cfg.target_file_size_bytes;
        let mut by_partition: BTreeMap<String, Vec<&LiveFile>> = BTreeMap::new();
        for f in live.iter().filter(|f| f.file.file_size_in_bytes() < target * 3 / 4) {
            by_partition.entry(format!("{:?}", f.file.partition())).or_default().push(f);
        }
        let mut bins = Vec::new();
        let mut budget = MAX_REWRITE_BYTES;
        for (_, mut files) in by_partition {
            files.sort_by_key(|f| std::cmp::Reverse(f.file.file_size_in_bytes()));
            let mut bin: Vec<LiveFile> = Vec::new();
            let mut size = 0;
            for f in files {
                let s = f.file.file_size_in_bytes();
                if size + s > target && !bin.is_empty() {
                    if bin.len() > 1 {
                        bins.push(std::mem::take(&mut bin));
                    }
                    bin.clear();
                    size = 0;
                }
                if s > budget {
                    break;
                }
                budget -= s;
                bin.push(f.clone());
                size += s;
            }
            if bin.len() > 1 {
                bins.push(bin);
            }
        }
        bins
    }

    async fn compact(&self, base: &Loaded) -> Result<Option<Loaded>, String> {
        let m = &base.metadata;
        let live = snapshot::live_files(self.io, m).await.map_err(|e| err("list files", e))?;
        let bins = self.plan(&live);
        if bins.is_empty() {
            return Ok(None);
        }
        let schema = m.current_schema().clone();
        let arrow: SchemaRef = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).map_err(|e| err("schema", e))?);
        let mut removed = HashSet::new();
        let mut added: Vec<DataFile> = Vec::new();
        for bin in &bins {
            let mut batches = Vec::new();
            for f in bin {
                let input = self.io.new_input(f.file.file_path()).map_err(|e| err("open", e))?;
                let bytes: Bytes = input.read().await.map_err(|e| err("read data file", e))?;
                let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                    .and_then(|b| b.build())
                    .map_err(|e| err(f.file.file_path(), e))?;
                for b in reader {
                    batches.push(conform(&arrow, &b.map_err(|e| err(f.file.file_path(), e))?)?);
                }
            }
            let all = arrow_select::concat::concat_batches(&arrow, &batches).map_err(|e| err("concat", e))?;
            let sorted = sort_by_topic(&all)?;
            let key = PartitionKey::new(
                m.default_partition_spec().as_ref().clone(),
                schema.clone(),
                bin[0].file.partition().clone(),
            );
            let files = self.write(m, sorted, key).await?;
            added.extend(files);
            removed.extend(bin.iter().map(|f| f.file.file_path().to_owned()));
        }
        let before = live.len();
        let after = before - removed.len() + added.len();
        let new_paths: Vec<String> = added.iter().map(|f| f.file_path().to_owned()).collect();
        let c = snapshot::replace(self.io, m, &live, &removed, added, "silt.")
            .await
            .map_err(|e| err("replace snapshot", e))?;
        match self.catalog.commit(self.namespace, self.table, base, c.requirements, c.updates).await {
            Ok(t) => {
                tracing::info!(table = %self.table, files_before = before, files_after = after, "lakehouse compaction");
                Ok(Some(t))
            }
            Err(e) => {
                if matches!(e, CatalogError::Conflict(_)) {
                    for p in &new_paths {
                        let _ = self.io.delete(p).await;
                    }
                }
                Err(err("compaction commit", e))
            }
        }
    }

    async fn write(&self, m: &TableMetadata, batch: RecordBatch, key: PartitionKey) -> Result<Vec<DataFile>, String> {
        let props = WriterProperties::builder()
            .set_compression(parquet::basic::Compression::ZSTD(parquet::basic::ZstdLevel::default()))
            .build();
        let location = DefaultLocationGenerator::new(m).map_err(|e| err("location", e))?;
        let names = DefaultFileNameGenerator::new(
            format!("{}-{}-c", self.epoch, uuid::Uuid::new_v4()),
            None,
            DataFileFormat::Parquet,
        );
        let rolling = RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(props, m.current_schema().clone()),
            self.cfg.target_file_size_bytes as usize,
            self.io.clone(),
            location,
            names,
        );
        let mut w = DataFileWriterBuilder::new(rolling).build(Some(key)).await.map_err(|e| err("writer", e))?;
        w.write(batch).await.map_err(|e| err("write", e))?;
        w.close().await.map_err(|e| err("close", e))
    }

    async fn expire(&self, base: &Loaded) -> Result<Option<Loaded>, String> {
        let m = &base.metadata;
        let Some(current) = m.current_snapshot_id() else { return Ok(None) };
        let mut snapshots: Vec<_> = m.snapshots().cloned().collect();
        snapshots.sort_by_key(|s| std::cmp::Reverse(s.timestamp_ms()));
        let cutoff = chrono::Utc::now().timestamp_millis() - self.cfg.snapshot_max_age_ms as i64;
        let (kept, expired): (Vec<_>, Vec<_>) = snapshots.into_iter().enumerate().partition(|(i, s)| {
            *i < self.cfg.min_snapshots_to_keep || s.snapshot_id() == current || s.timestamp_ms() >= cutoff
        });
        if expired.is_empty() {
            return Ok(None);
        }
        let ids: Vec<i64> = expired.iter().map(|(_, s)| s.snapshot_id()).collect();
        let updates = vec![TableUpdate::RemoveSnapshots { snapshot_ids: ids.clone() }];
        let requirements =
            vec![TableRequirement::RefSnapshotIdMatch { r#ref: "main".into(), snapshot_id: Some(current) }];
        let t = self
            .catalog
            .commit(self.namespace, self.table, base, requirements, updates)
            .await
            .map_err(|e| err("expire snapshots", e))?;
        // What only the expired snapshots reach goes; a failure to list leaves files, never
        // deletes one still used.
        let mut used = HashSet::new();
        // A kept snapshot's manifests name the files it removed too (entries with status
        // DELETED): those are not its files.
        for (_, s) in &kept {
            used.extend(self.reachable(m, s.manifest_list(), true).await?);
        }
        let mut gone = HashSet::new();
        for (_, s) in &expired {
            gone.extend(self.reachable(m, s.manifest_list(), false).await?);
        }
        let mut deleted = 0;
        for f in gone.difference(&used) {
            if self.io.delete(f).await.is_ok() {
                deleted += 1;
            }
        }
        tracing::info!(
            table = %self.table,
            snapshots = ids.len(),
            files_deleted = deleted,
            "lakehouse snapshots expired"
        );
        Ok(Some(t))
    }

    /// A snapshot's manifest list, its manifests and their data files (only the ones it holds
    /// with `live_only`, else also the ones it removed).
    async fn reachable(
        &self,
        m: &TableMetadata,
        manifest_list: &str,
        live_only: bool,
    ) -> Result<HashSet<String>, String> {
        let mut out = HashSet::from([manifest_list.to_owned()]);
        let bytes = match self.io.new_input(manifest_list).map_err(|e| err("open", e))?.read().await {
            Ok(b) => b,
            Err(e) => return Err(err(manifest_list, e)),
        };
        let list = ManifestList::parse_with_version(&bytes, m.format_version()).map_err(|e| err(manifest_list, e))?;
        for mf in list.entries() {
            out.insert(mf.manifest_path.clone());
            let manifest = mf.load_manifest(self.io).await.map_err(|e| err(&mf.manifest_path, e))?;
            out.extend(
                manifest
                    .entries()
                    .iter()
                    .filter(|e| !live_only || e.status() != ManifestStatus::Deleted)
                    .map(|e| e.data_file.file_path().to_owned()),
            );
        }
        Ok(out)
    }
}

/// A batch read from an older file, in the current schema's shape: columns by name, a column
/// the file lacks (added since) NULL.
fn conform(schema: &SchemaRef, b: &RecordBatch) -> Result<RecordBatch, String> {
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| match b.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Ok(c.clone()),
            Some(c) => arrow_cast::cast(c, f.data_type()).map_err(|e| err(f.name(), e)),
            None => Ok(arrow_array::new_null_array(f.data_type(), b.num_rows())),
        })
        .collect::<Result<_, _>>()?;
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| err("conform", e))
}

fn sort_by_topic(b: &RecordBatch) -> Result<RecordBatch, String> {
    let topic = b.column_by_name("topic").ok_or("no topic column")?;
    let indices = arrow_ord::sort::sort_to_indices(topic, None, None).map_err(|e| err("sort", e))?;
    arrow_select::take::take_record_batch(b, &indices).map_err(|e| err("take", e))
}
