//! One table's writer: every `commit_interval_ms`, the rows its sources gained (see
//! [`crate::read`]), as Parquet data files (one per day partition, sorted by topic), appended
//! in one snapshot whose summary records the next offset of every stream partition read
//! (`silt.offsets`) and the node's epoch (`silt.epoch`).
//!
//! Exactly once: a writer starts from the offsets of the table's current snapshot, so what a
//! crash (or an empty data directory) lost since the last commit is written again, and what
//! was committed never is. A commit is based on one snapshot and lands only if `main` is still
//! there; when another commit won, the writer re-reads the table: a newer epoch means a newer
//! node owns the prefix and this writer stops; otherwise it retries on the new snapshot only
//! if the table's offsets are still the ones it read from, else it drops its files and goes on
//! from the table's offsets. A commit whose outcome is unknown (the catalog failed to answer)
//! is looked for in the table before anything else is written.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use iceberg::io::FileIO;
use iceberg::spec::{DataFile, DataFileFormat, Literal, PartitionKey, Struct, TableMetadata};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{DefaultFileNameGenerator, DefaultLocationGenerator};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::file::properties::WriterProperties;
use silt_tiering::TableSources;
use silt_types::LogPosition;

use crate::catalog::{Catalog, CatalogError, Loaded};
use crate::read::{self, Source, Sources, Visibility};
use crate::rows::{self, Row};
use crate::snapshot;
use crate::{LakehouseConfig, schema};

/// Summary keys this writer owns.
pub const OFFSETS: &str = "silt.offsets";
pub const EPOCH: &str = "silt.epoch";

/// What a table's writer reports (for `$SYS` and retention).
#[derive(Default)]
pub struct TableStats {
    pub commits: AtomicU64,
    pub commit_failures: AtomicU64,
    pub rows: AtomicU64,
    pub files: AtomicU64,
    pub compactions: AtomicU64,
    /// Age (ms) of the oldest message not in the table yet, at the last look.
    pub lag_ms: AtomicU64,
    /// The log position retention must keep (`u64::MAX`: nothing pending).
    pub floor: AtomicU64,
    /// Retention is held back for this table.
    pub holding: AtomicBool,
    pub fenced: AtomicBool,
}

/// The offsets a table's snapshot recorded, and the epoch that wrote it.
pub fn recorded(metadata: &TableMetadata) -> (BTreeMap<Source, u64>, u64) {
    let Some(s) = metadata.current_snapshot() else { return (BTreeMap::new(), 0) };
    let props = &s.summary().additional_properties;
    let epoch = props.get(EPOCH).and_then(|e| e.parse().ok()).unwrap_or(0);
    let offsets = props
        .get(OFFSETS)
        .and_then(|o| serde_json::from_str::<BTreeMap<String, u64>>(o).ok())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| {
            let (stream, p) = k.rsplit_once('/')?;
            Some(((stream.to_owned(), p.parse().ok()?), v))
        })
        .collect();
    (offsets, epoch)
}

fn encode_offsets(offsets: &BTreeMap<Source, u64>) -> String {
    let m: BTreeMap<String, u64> = offsets.iter().map(|((s, p), v)| (format!("{s}/{p}"), *v)).collect();
    serde_json::to_string(&m).expect("invariant: a map of numbers serializes")
}

/// How long a commit waits for the object store to hold its rows' records before it reports a
/// failure (and tries again).
const UPLOAD_WAIT: Duration = Duration::from_secs(15);

/// A commit sent whose outcome is not known.
struct Unsure {
    snapshot_id: i64,
    files: Vec<String>,
}

pub struct TableWriter {
    pub name: String,
    namespace: String,
    sources: TableSources,
    catalog: Arc<dyn Catalog>,
    io: FileIO,
    cfg: Arc<LakehouseConfig>,
    epoch: u64,
    read: Arc<Sources>,
    visibility: Option<Arc<dyn Visibility>>,
    fenced: Arc<dyn Fn() -> bool + Send + Sync>,
    uploaded: silt_tiering::UploadWaiter,
    /// Whether `offsets` are the table's (loaded once at least): until then retention holds
    /// everything.
    loaded: bool,
    pub stats: Arc<TableStats>,
    table: Option<Loaded>,
    offsets: BTreeMap<Source, u64>,
    unsure: Option<Unsure>,
    last_maintenance: Instant,
    lag_warned: Option<Instant>,
}

pub struct Handles {
    pub catalog: Arc<dyn Catalog>,
    pub io: FileIO,
    pub cfg: Arc<LakehouseConfig>,
    pub epoch: u64,
    pub read: Arc<Sources>,
    pub visibility: Option<Arc<dyn Visibility>>,
    pub fenced: Arc<dyn Fn() -> bool + Send + Sync>,
    pub uploaded: silt_tiering::UploadWaiter,
}

impl TableWriter {
    pub fn new(name: &str, sources: TableSources, h: &Handles) -> TableWriter {
        TableWriter {
            name: name.to_owned(),
            namespace: h.cfg.namespace.clone(),
            sources,
            catalog: h.catalog.clone(),
            io: h.io.clone(),
            cfg: h.cfg.clone(),
            epoch: h.epoch,
            read: h.read.clone(),
            visibility: h.visibility.clone(),
            fenced: h.fenced.clone(),
            uploaded: h.uploaded.clone(),
            loaded: false,
            stats: Arc::new(TableStats {
                floor: AtomicU64::new(0),
                holding: AtomicBool::new(true),
                ..TableStats::default()
            }),
            table: None,
            offsets: BTreeMap::new(),
            unsure: None,
            last_maintenance: Instant::now(),
            lag_warned: None,
        }
    }

    /// Runs until the node is fenced (or the task is dropped).
    pub async fn run(mut self) {
        let interval = Duration::from_millis(self.sources.commit_interval_ms);
        let mut backoff = Duration::ZERO;
        loop {
            if (self.fenced)() {
                self.stop_fenced("the node was fenced");
                return;
            }
            let started = Instant::now();
            let more = match self.cycle().await {
                Ok(more) => {
                    backoff = Duration::ZERO;
                    more
                }
                Err(Stop::Fenced(why)) => {
                    self.stop_fenced(&why);
                    return;
                }
                Err(Stop::Failed(why)) => {
                    self.stats.commit_failures.fetch_add(1, Ordering::Relaxed);
                    // Retention keeps holding what the table has not written while it fails.
                    self.track_floor(None).await;
                    backoff = (backoff * 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
                    tracing::warn!(table = %self.name, error = %why, retry_in_ms = backoff.as_millis() as u64,
                        "lakehouse commit failed");
                    tokio::time::sleep(backoff).await;
                    continue;
                }
            };
            if self.last_maintenance.elapsed() >= Duration::from_millis(self.cfg.compaction_interval_ms) {
                self.last_maintenance = Instant::now();
                if let Err(e) = self.maintain().await {
                    tracing::warn!(table = %self.name, error = %e, "lakehouse maintenance failed; tried again later");
                }
            }
            if !more {
                tokio::time::sleep(interval.saturating_sub(started.elapsed())).await;
            }
        }
    }

    fn stop_fenced(&self, why: &str) {
        self.stats.fenced.store(true, Ordering::Relaxed);
        self.stats.floor.store(u64::MAX, Ordering::Relaxed);
        tracing::error!(table = %self.name, reason = why, "lakehouse writer stopped: another node writes this table");
    }

    /// The table, loaded (and created, or evolved to the configured columns) once.
    async fn table(&mut self) -> Result<Loaded, Stop> {
        if let Some(t) = &self.table {
            return Ok(t.clone());
        }
        self.catalog.ensure_namespace(&self.namespace).await.map_err(Stop::from)?;
        let mut t = match self.catalog.load(&self.namespace, &self.name).await.map_err(Stop::from)? {
            Some(t) => t,
            None => {
                let creation = schema::creation(&self.name, &self.sources.columns).map_err(Stop::failed)?;
                let t = self.catalog.create(&self.namespace, creation).await.map_err(Stop::from)?;
                tracing::info!(table = %self.name, catalog = %self.catalog.describe(), location = %t.metadata.location(),
                    "lakehouse table created");
                t
            }
        };
        let (offsets, epoch) = recorded(&t.metadata);
        if epoch > self.epoch {
            return Err(Stop::Fenced(format!(
                "the table was last written by epoch {epoch}, this node is {}",
                self.epoch
            )));
        }
        let m = &t.metadata;
        let next_schema = m.schemas_iter().map(|s| s.schema_id()).max().unwrap_or(0) + 1;
        let evolve =
            schema::evolution(&self.name, m.current_schema(), m.last_column_id(), next_schema, &self.sources.columns)
                .map_err(Stop::failed)?;
        if !evolve.is_empty() {
            t = self.catalog.commit(&self.namespace, &self.name, &t, Vec::new(), evolve).await.map_err(Stop::from)?;
            tracing::info!(table = %self.name, schema_id = t.metadata.current_schema_id(), "lakehouse table schema evolved");
        }
        self.offsets = offsets;
        self.loaded = true;
        self.table = Some(t.clone());
        Ok(t)
    }

    /// Looks for a commit whose answer was lost: kept if the table has it, else its files go.
    async fn settle(&mut self) -> Result<(), Stop> {
        let Some(u) = self.unsure.take() else { return Ok(()) };
        self.table = None;
        let t = self.table().await?;
        if t.metadata.snapshot_by_id(u.snapshot_id).is_some() {
            tracing::info!(table = %self.name, "a commit whose answer was lost had landed");
        } else {
            self.delete(&u.files).await;
        }
        Ok(())
    }

    async fn delete(&self, files: &[String]) {
        for f in files {
            if let Err(e) = self.io.delete(f).await {
                tracing::debug!(table = %self.name, file = %f, error = %e, "an unused data file was not deleted");
            }
        }
    }

    /// One read-write-commit; `Ok(true)` when more rows wait.
    async fn cycle(&mut self) -> Result<bool, Stop> {
        self.settle().await?;
        let base = self.table().await?;
        let (read, max_rows) = (self.read.clone(), self.cfg.max_rows_per_commit);
        let (name, filters, offsets) = (self.name.clone(), self.sources.filters.clone(), self.offsets.clone());
        let visibility = self.visibility.clone();
        let got = tokio::task::spawn_blocking(move || {
            let want = read::Want { table: &name, filters: &filters, offsets: &offsets, max_rows };
            read::read(&read, visibility.as_deref(), want)
        })
        .await
        .map_err(|e| Stop::Failed(format!("read task: {e}")))?
        .map_err(|e| Stop::Failed(format!("read: {e}")))?;
        for ((stream, p), from, to) in &got.lost {
            tracing::warn!(table = %self.name, stream = %stream, partition = p, from, to,
                "messages deleted by retention before the table wrote them");
        }
        let more = got.more;
        if got.rows.is_empty() {
            self.offsets = got.offsets;
            self.track_floor(got.oldest_pending).await;
            return Ok(more);
        }
        // The rows' records must be in the bucket first: a table never holds what a node taking
        // the prefix over (or this one, on an empty disk) would not find in its log.
        self.track_floor(None).await;
        match tokio::time::timeout(UPLOAD_WAIT, (self.uploaded)(LogPosition(got.end))).await {
            Ok(Ok(())) => {}
            Ok(Err(e @ silt_tiering::Error::Fenced { .. })) => return Err(Stop::Fenced(e.to_string())),
            Ok(Err(e)) => return Err(Stop::Failed(format!("waiting for the upload of the rows' records: {e}"))),
            // Reported like a failed commit (and retried): the store is down or slow.
            Err(_) => {
                return Err(Stop::Failed(format!(
                    "the object store has not taken the rows' records after {} s",
                    UPLOAD_WAIT.as_secs()
                )));
            }
        }
        let rows = got.rows;
        let n = rows.len() as u64;
        let files = self.write_files(&base.metadata, rows).await?;
        let paths: Vec<String> = files.iter().map(|f| f.file_path().to_owned()).collect();
        let mut props = HashMap::new();
        props.insert(OFFSETS.to_owned(), encode_offsets(&got.offsets));
        props.insert(EPOCH.to_owned(), self.epoch.to_string());
        let mut base = base;
        loop {
            let c =
                snapshot::append(&self.io, &base.metadata, files.clone(), props.clone()).await.map_err(Stop::failed)?;
            match self.catalog.commit(&self.namespace, &self.name, &base, c.requirements, c.updates).await {
                Ok(t) => {
                    self.table = Some(t);
                    self.offsets = got.offsets;
                    self.stats.commits.fetch_add(1, Ordering::Relaxed);
                    self.stats.rows.fetch_add(n, Ordering::Relaxed);
                    self.stats.files.fetch_add(paths.len() as u64, Ordering::Relaxed);
                    tracing::info!(table = %self.name, rows = n, files = paths.len(), "lakehouse commit");
                    break;
                }
                Err(CatalogError::Conflict(why)) => {
                    self.table = None;
                    let before = self.offsets.clone();
                    let fresh = self.table().await?;
                    if self.offsets == before {
                        tracing::info!(table = %self.name, reason = %why, "lakehouse commit lost a race to a change without rows; retrying on it");
                        base = fresh;
                        continue;
                    }
                    tracing::warn!(table = %self.name, "another writer committed these rows; going on from its offsets");
                    self.delete(&paths).await;
                    break;
                }
                Err(CatalogError::Failed(why)) => {
                    self.unsure = Some(Unsure { snapshot_id: c.snapshot_id, files: paths });
                    return Err(Stop::Failed(why));
                }
            }
        }
        self.track_floor(got.oldest_pending).await;
        Ok(more)
    }

    /// Writes `rows` as one Parquet file per day, each sorted by topic.
    async fn write_files(&self, metadata: &TableMetadata, mut rows: Vec<Row>) -> Result<Vec<DataFile>, Stop> {
        rows.sort_by(|a, b| {
            (a.day(), &a.topic, &a.stream, a.partition, a.offset).cmp(&(
                b.day(),
                &b.topic,
                &b.stream,
                b.partition,
                b.offset,
            ))
        });
        let schema = metadata.current_schema().clone();
        let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).map_err(Stop::failed)?);
        let projected: BTreeMap<String, silt_tiering::config::ColumnType> = schema
            .as_struct()
            .fields()
            .iter()
            .filter(|f| !silt_tiering::config::ENVELOPE_COLUMNS.contains(&f.name.as_str()))
            .filter_map(|f| schema::column_type(&f.field_type).map(|t| (f.name.clone(), t)))
            .collect();
        let spec = metadata.default_partition_spec().as_ref().clone();
        let mut out = Vec::new();
        let mut start = 0;
        while start < rows.len() {
            let day = rows[start].day();
            let end = start + rows[start..].iter().take_while(|r| r.day() == day).count();
            let batch = rows::batch(&arrow, &projected, &rows[start..end]).map_err(Stop::Failed)?;
            let key = PartitionKey::new(spec.clone(), schema.clone(), Struct::from_iter([Some(Literal::date(day))]));
            let props = WriterProperties::builder()
                .set_compression(parquet::basic::Compression::ZSTD(parquet::basic::ZstdLevel::default()))
                .build();
            let location = DefaultLocationGenerator::new(metadata).map_err(Stop::failed)?;
            let names = DefaultFileNameGenerator::new(
                format!("{}-{}", self.epoch, uuid::Uuid::new_v4()),
                None,
                DataFileFormat::Parquet,
            );
            let rolling = RollingFileWriterBuilder::new(
                ParquetWriterBuilder::new(props, schema.clone()),
                self.cfg.target_file_size_bytes as usize,
                self.io.clone(),
                location,
                names,
            );
            let mut w = DataFileWriterBuilder::new(rolling).build(Some(key)).await.map_err(Stop::failed)?;
            w.write(batch).await.map_err(Stop::failed)?;
            out.extend(w.close().await.map_err(Stop::failed)?);
            start = end;
        }
        Ok(out)
    }

    /// What retention must keep for this table: the oldest unwritten message, unless the
    /// table lags more than `max_lag_ms` behind it.
    async fn track_floor(&mut self, pending_beyond_limit: Option<(LogPosition, i64)>) {
        if !self.loaded {
            // The table's offsets are not known yet: keep everything.
            self.stats.floor.store(0, Ordering::Relaxed);
            self.stats.holding.store(true, Ordering::Relaxed);
            return;
        }
        let (storage, streams) = (self.read.storage.clone(), self.read.streams.clone());
        let (offsets, filters) = (self.offsets.clone(), self.sources.filters.clone());
        let found = tokio::task::spawn_blocking(move || {
            let mut oldest: Option<(LogPosition, i64)> = None;
            // Every partition the filters reach, written to before or not (then from 0).
            for (stream, partitions) in read::streams_for(&filters, &streams) {
                for p in 0..partitions {
                    let source = (stream.clone(), p);
                    let next = offsets.get(&source).copied().unwrap_or(0);
                    if let Ok(Some(found)) = read::pending(&storage, &source, next) {
                        oldest = Some(oldest.map_or(found, |o| o.min(found)));
                    }
                }
            }
            oldest
        })
        .await
        .ok()
        .flatten();
        let oldest = match (found, pending_beyond_limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let now = chrono::Utc::now().timestamp_millis();
        let Some((position, ts)) = oldest else {
            self.stats.lag_ms.store(0, Ordering::Relaxed);
            self.stats.floor.store(u64::MAX, Ordering::Relaxed);
            self.stats.holding.store(false, Ordering::Relaxed);
            return;
        };
        let lag = now.saturating_sub(ts).max(0) as u64;
        self.stats.lag_ms.store(lag, Ordering::Relaxed);
        if lag > self.cfg.max_lag_ms {
            if self.lag_warned.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                self.lag_warned = Some(Instant::now());
                tracing::warn!(table = %self.name, lag_ms = lag, max_lag_ms = self.cfg.max_lag_ms,
                    "the table lags more than lakehouse.max_lag_ms: retention no longer waits for it");
            }
            self.stats.floor.store(u64::MAX, Ordering::Relaxed);
            self.stats.holding.store(false, Ordering::Relaxed);
        } else {
            self.stats.floor.store(position.get(), Ordering::Relaxed);
            self.stats.holding.store(true, Ordering::Relaxed);
        }
    }

    async fn maintain(&mut self) -> Result<(), String> {
        let Some(base) = self.table.clone() else { return Ok(()) };
        let m = crate::maintenance::Maintenance {
            table: &self.name,
            namespace: &self.namespace,
            catalog: self.catalog.as_ref(),
            io: &self.io,
            cfg: &self.cfg,
            epoch: self.epoch,
        };
        match m.run(base).await {
            Ok(Some(t)) => {
                self.table = Some(t);
                self.stats.compactions.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => {
                self.table = None; // re-read before the next commit
                Err(e)
            }
        }
    }
}

pub enum Stop {
    Fenced(String),
    Failed(String),
}

impl Stop {
    fn failed(e: impl std::fmt::Display) -> Stop {
        Stop::Failed(format!("{e:#}"))
    }
}

impl From<CatalogError> for Stop {
    fn from(e: CatalogError) -> Self {
        Stop::Failed(e.to_string())
    }
}
