//! [`Storage`]: the commitlog and its consume-queue index behind one handle.
//!
//! Layout of a data directory: `log/` (segment files) and `index/` (RocksDB). Opening recovers
//! the log tail, then resumes indexing from the index's checkpoint — or rebuilds the index from
//! the log when the checkpoint is missing (a deleted index) or lies past the recovered end of
//! the log (a machine crash under `fsync = "never"` lost a tail the index had seen).
//!
//! Threads: one writer (group commit), one dispatcher. Every method is safe to call from any
//! thread; the `async` ones never block a runtime thread, the `*_blocking` ones must not be
//! called from inside one.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::Bytes;
use silt_types::latency::HistogramSnapshot;
use silt_types::{LogPosition, Offset, QueueId, Timestamp, TopicFilter};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use crate::config::StorageConfig;
use crate::dispatch::{
    DispatchListener, Dispatcher, OP_DROP_FILTER, OP_DROP_PARTITION, OP_REGISTER_FILTER, SharedFilters,
};
use crate::error::{Error, Result};
use crate::format::{self, Record};
use crate::index::{Index, IndexEntry, QueueName};
use crate::log::{Appended, ColdReader, LogShared, PendingAppend, SealedSegment, WriterMsg};
use crate::recent::RecentEntries;
use crate::writer::Writer;

/// Resolves when a submitted batch is durable (see [`Storage::submit`]).
#[must_use = "the append is acknowledged only when this resolves"]
pub struct PendingAppendAck(oneshot::Receiver<Result<Appended>>);

impl Future for PendingAppendAck {
    type Output = Result<Appended>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|r| r.map_err(|_| Error::Closed).and_then(|r| r))
    }
}

/// Figures for stats pages and benchmarks.
#[derive(Clone, Debug, Default)]
pub struct StorageStats {
    pub log_start: LogPosition,
    pub log_end: LogPosition,
    pub dispatched: LogPosition,
    pub segments: usize,
    pub tail_cache_bytes: u64,
    pub index_sst_bytes: u64,
    pub index_memtable_bytes: u64,
    /// Fsyncs of the commitlog since it was opened.
    pub fsyncs: u64,
    /// Batches that failed their checks and were rewritten from a good copy (the tail cache
    /// or the object store), since the log was opened.
    pub healed_batches: u64,
    /// Bad ranges with no good copy: copied to `log/quarantine/` and replaced by gap batches
    /// (their records are lost), and their bytes.
    pub quarantined_batches: u64,
    pub quarantined_bytes: u64,
    /// Records in valid batches that dispatch could not index (skipped with a warning).
    pub skipped_records: u64,
    /// Submission to answer of each append, and each fsync of the commitlog.
    pub append_latency: HistogramSnapshot,
    pub fsync_latency: HistogramSnapshot,
}

pub struct Storage {
    log: Arc<LogShared>,
    /// Taken at close so the RocksDB lock is released and the directory can be reopened.
    index: std::sync::RwLock<Option<Arc<Index>>>,
    /// The newest entries of recently written queues (see the `recent` module).
    recent: Arc<RecentEntries>,
    /// The dispatcher's filter trie.
    filters: SharedFilters,
    writer_tx: Sender<WriterMsg>,
    pending: Arc<Semaphore>,
    progress: watch::Receiver<LogPosition>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    closed: AtomicBool,
    /// The log's end when this process opened it: volatile records below it were written by
    /// an earlier process and are gone.
    opened_at: LogPosition,
}

impl Storage {
    /// Opens (creating if needed) the storage engine in `dir`.
    pub fn open(dir: &Path, config: StorageConfig) -> Result<Storage> {
        Self::open_with(dir, config, Vec::new())
    }

    /// Opens the engine with listeners told after each dispatch round.
    pub fn open_with(dir: &Path, config: StorageConfig, listeners: Vec<Arc<dyn DispatchListener>>) -> Result<Storage> {
        Self::open_seeded(dir, config, listeners, &[])
    }

    /// Opens the engine; if the index is built from scratch, first gives each seeded queue its
    /// base offset. Seeds carry offsets across deleted history: when retention removed the
    /// start of the log, a rebuild would otherwise number a queue's surviving entries from 0.
    /// A seeded queue holds one placeholder entry at `base - 1` pointing at position 0, below
    /// the log's floor, so no reader ever sees it and its next entry gets `base`.
    pub fn open_seeded(
        dir: &Path,
        config: StorageConfig,
        listeners: Vec<Arc<dyn DispatchListener>>,
        seeds: &[(QueueName, Offset)],
    ) -> Result<Storage> {
        config.validate().map_err(Error::Invalid)?;
        let (log, active) = LogShared::open(&dir.join("log"), config.clone())?;
        let index_dir = dir.join("index");
        let mut index = Index::open(&index_dir, &config)?;
        let (start, end) = (log.start(), log.end());
        let cursor = match index.checkpoint()? {
            None => {
                if index.next_queue_id()? != 0 {
                    tracing::warn!("index has queues but no checkpoint; rebuilding");
                    index = rebuild(index, &index_dir, &config)?;
                } else if end > start {
                    tracing::info!(from = %start, to = %end, "building the index from the commitlog");
                }
                start
            }
            Some(c) if c > end => {
                tracing::warn!(
                    checkpoint = %c, log_end = %end,
                    "index is ahead of the recovered commitlog; rebuilding it from the log"
                );
                index = rebuild(index, &index_dir, &config)?;
                start
            }
            Some(c) => c,
        };
        if index.checkpoint()?.is_none() && !seeds.is_empty() {
            seed(&index, seeds, cursor)?;
        }
        let index = Arc::new(index);
        let (progress_tx, progress) = watch::channel(cursor);
        let recent = Arc::new(RecentEntries::default());
        let dispatcher = Dispatcher::new(
            log.clone(),
            index.clone(),
            cursor,
            config.queue_cache_entries,
            listeners,
            progress_tx,
            recent.clone(),
        )?;
        let filters = dispatcher.shared_filters();
        let (writer_tx, writer_rx) = std::sync::mpsc::channel();
        let writer = Writer::new(log.clone(), active, writer_rx);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(f).map_err(Error::io("spawn thread", PathBuf::new()))
        };
        let threads = vec![
            spawn("silt-log-writer", Box::new(move || writer.run()))?,
            spawn("silt-dispatch", Box::new(move || dispatcher.run(stop2)))?,
        ];
        let permits = config.max_pending_bytes.min(Semaphore::MAX_PERMITS as u64) as usize;
        Ok(Storage {
            log,
            index: std::sync::RwLock::new(Some(index)),
            recent,
            filters,
            writer_tx,
            pending: Arc::new(Semaphore::new(permits)),
            progress,
            stop,
            threads: Mutex::new(threads),
            closed: AtomicBool::new(false),
            opened_at: end,
        })
    }

    fn index(&self) -> Result<Arc<Index>> {
        self.index.read().expect("invariant: lock not poisoned").clone().ok_or(Error::Closed)
    }

    pub fn config(&self) -> &StorageConfig {
        &self.log.config
    }

    /// Appends `records` as one batch. Returns once the batch is written and, under
    /// `fsync = "always"`, fsynced. Concurrent appends share writes and fsyncs.
    pub async fn append(&self, records: &[Record]) -> Result<Appended> {
        self.submit(records).await?.await
    }

    /// Hands `records` to the writer and returns a future that resolves when they are durable.
    /// Batches submitted one after another (by one task) are written in that order, so a
    /// caller can pipeline appends and still acknowledge them in order. Waits only while the
    /// writer's queue is full (backpressure).
    pub async fn submit(&self, records: &[Record]) -> Result<PendingAppendAck> {
        if records.iter().any(|r| r.control || r.withheld) {
            return Err(Error::Invalid("control and withheld records are internal to the log".into()));
        }
        self.submit_any(records).await
    }

    async fn append_any(&self, records: &[Record]) -> Result<Appended> {
        self.submit_any(records).await?.await
    }

    async fn submit_any(&self, records: &[Record]) -> Result<PendingAppendAck> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if self.log.is_fenced() {
            return Err(Error::Fenced);
        }
        let queued = Instant::now();
        let batch = format::encode_batch(records, self.log.config.max_batch_bytes as usize)?;
        let volatile = records.iter().all(|r| r.volatile);
        let n = (batch.frame.len() as u64).min(self.log.config.max_pending_bytes) as u32;
        let permit = self.pending.clone().acquire_many_owned(n).await.map_err(|_| Error::Closed)?;
        let (done, rx) = oneshot::channel();
        self.writer_tx
            .send(WriterMsg::Append(PendingAppend { batch, volatile, done, _permit: permit, queued }))
            .map_err(|_| Error::Closed)?;
        Ok(PendingAppendAck(rx))
    }

    pub fn append_blocking(&self, records: &[Record]) -> Result<Appended> {
        block_on(self.append(records))
    }

    /// Fsyncs everything written so far (for `interval`/`never` callers that need a barrier).
    pub async fn sync(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.writer_tx.send(WriterMsg::Sync(tx)).map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// Waits until the log is indexed up to `pos`.
    pub async fn wait_dispatched(&self, pos: LogPosition) -> Result<()> {
        let mut rx = self.progress.clone();
        rx.wait_for(|p| *p >= pos).await.map(|_| ()).map_err(|_| Error::Closed)
    }

    pub fn wait_dispatched_blocking(&self, pos: LogPosition) -> Result<()> {
        block_on(self.wait_dispatched(pos))
    }

    /// The log is indexed up to here.
    pub fn dispatched(&self) -> LogPosition {
        *self.progress.borrow()
    }

    /// A receiver of dispatch progress, for async waiters.
    pub fn watch_dispatched(&self) -> watch::Receiver<LogPosition> {
        self.progress.clone()
    }

    /// Registers a wildcard filter queue (idempotent): from now on every record whose topic
    /// matches `filter` also gets an entry in it. Returns the queue's id once it is indexed.
    pub async fn register_filter(&self, filter: &TopicFilter) -> Result<QueueId> {
        if let Some(id) = self.queue_id(&QueueName::Filter(filter.as_str().to_owned()))? {
            return Ok(id);
        }
        self.add_filter(filter).await?;
        self.queue_id(&QueueName::Filter(filter.as_str().to_owned()))?
            .ok_or_else(|| Error::Invalid(format!("filter {filter} was dropped while registering")))
    }

    /// [`Self::register_filter`] without reading the index (for callers that keep RocksDB off
    /// their runtime): returns once the filter's queue exists in the index, unless a drop of
    /// it came in between, and memory names it ([`Self::created_queue_id`]) unless forgotten
    /// since. Registering a registered filter changes nothing in the index.
    pub async fn add_filter(&self, filter: &TopicFilter) -> Result<()> {
        let appended = self.append_any(&[control(OP_REGISTER_FILTER, filter)]).await?;
        self.wait_dispatched(appended.end).await
    }

    pub fn register_filter_blocking(&self, filter: &TopicFilter) -> Result<QueueId> {
        block_on(self.register_filter(filter))
    }

    /// Drops a filter queue and its entries (the records stay in the log).
    pub async fn drop_filter(&self, filter: &TopicFilter) -> Result<()> {
        let appended = self.append_any(&[control(OP_DROP_FILTER, filter)]).await?;
        self.wait_dispatched(appended.end).await
    }

    pub fn drop_filter_blocking(&self, filter: &TopicFilter) -> Result<()> {
        block_on(self.drop_filter(filter))
    }

    /// Drops a stream-partition queue and its entries (the records stay in the log): the
    /// partition's next record starts it again at offset 0 (a deleted Kafka topic).
    pub async fn drop_partition(&self, name: &QueueName) -> Result<()> {
        let QueueName::Partition { .. } = name else {
            return Err(Error::Invalid("only stream-partition queues are dropped this way".into()));
        };
        let key = name.encode();
        let mut value = Vec::with_capacity(1 + key.len());
        value.push(OP_DROP_PARTITION);
        value.extend_from_slice(&key);
        let record =
            Record { timestamp: Timestamp::now(), value: Bytes::from(value), control: true, ..Record::default() };
        let appended = self.append_any(&[record]).await?;
        self.wait_dispatched(appended.end).await
    }

    /// The offset of the record at `position` in queue `id`, if the queue holds it.
    pub fn offset_of(&self, id: QueueId, position: LogPosition) -> Result<Option<Offset>> {
        let index = self.index()?;
        let next = index.last_offset(id)?.map_or(Offset(0), Offset::next);
        let first = index.first_offset(id)?.unwrap_or(next);
        let at = first_held(&index, id, first, next, position)?;
        Ok(index.read(id, at, 1)?.first().filter(|(_, e)| e.position == position).map(|(o, _)| *o))
    }

    /// The first offset of queue `id` at or above `from` whose entry's timestamp is at least
    /// `ts`, if any (Kafka's ListOffsets by time). A stream partition's entries carry the
    /// running maximum of its record timestamps (see the dispatcher), so with producer
    /// timestamps in any order this is exactly the first record at or after `ts`, as Kafka
    /// answers. (Entries written before partitions kept the maximum carry their own record's
    /// time; over those the answer is one such offset, not necessarily the first.)
    pub fn offset_for_time(&self, id: QueueId, from: Offset, ts: Timestamp) -> Result<Option<Offset>> {
        let index = self.index()?;
        let next = index.last_offset(id)?.map_or(Offset(0), Offset::next);
        let (mut lo, mut hi) = (from.get(), next.get());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match index.read(id, Offset(mid), 1)?.first() {
                Some((o, e)) if e.timestamp < ts => lo = o.get() + 1,
                Some((o, _)) => hi = o.get().min(mid),
                None => hi = mid,
            }
        }
        Ok((lo < next.get()).then_some(Offset(lo)))
    }

    /// The id of a queue, if it exists.
    pub fn queue_id(&self, name: &QueueName) -> Result<Option<QueueId>> {
        Ok(self.index()?.lookup(name)?.map(|m| m.id))
    }

    /// `(first, next)`: the offset of a queue's first entry and the offset its next entry will
    /// get (equal when the queue is empty).
    pub fn queue_bounds(&self, id: QueueId) -> Result<(Offset, Offset)> {
        let index = self.index()?;
        let next = index.last_offset(id)?.map_or(Offset(0), Offset::next);
        let first = index.first_offset(id)?.unwrap_or(next);
        let floor = self.log.floor();
        if floor > LogPosition(0) && first < next {
            return Ok((first_held(&index, id, first, next, floor)?, next));
        }
        Ok((first, next))
    }

    /// The offset queue `id`'s next entry will get (`queue_bounds(id).1`): from memory when it
    /// holds the queue's newest entries, else from one index read (not the two and the
    /// retention check `queue_bounds` makes for the first entry). Blocking when memory does
    /// not answer.
    pub fn queue_end(&self, id: QueueId) -> Result<Offset> {
        if let Some(end) = self.queue_end_cached(id) {
            return Ok(end);
        }
        Ok(self.index()?.last_offset(id)?.map_or(Offset(0), Offset::next))
    }

    /// Up to `max` index entries of a queue from offset `from`. Entries that point below the
    /// retention floor are skipped: a reader behind retention continues at the first entry
    /// still held.
    pub fn read_index(&self, id: QueueId, from: Offset, max: usize) -> Result<Vec<(Offset, IndexEntry)>> {
        if let Some(out) = self.read_index_cached(id, from, max) {
            return Ok(out);
        }
        let index = self.index()?;
        let out = index.read(id, from, max)?;
        let floor = self.log.floor();
        match out.first() {
            Some((_, e)) if e.position < floor => {
                let next = index.last_offset(id)?.map_or(Offset(0), Offset::next);
                let first = first_held(&index, id, from, next, floor)?;
                index.read(id, first, max)
            }
            _ => Ok(out),
        }
    }

    /// [`Self::read_index`] answered from memory, without RocksDB, or `None` when only the
    /// index can answer (the reader is behind the newest entries kept, or the queue was not
    /// written to recently, or `from` lies below the retention floor). Never blocks on I/O:
    /// for async callers that do the rest off the runtime.
    pub fn read_index_cached(&self, id: QueueId, from: Offset, max: usize) -> Option<Vec<(Offset, IndexEntry)>> {
        self.recent.read(id, from, max, self.log.floor())
    }

    /// The id of a queue created since the engine opened (or a filter queue registered again
    /// since), from memory (no RocksDB read); `None` when memory does not name it: it may be
    /// older, or missing.
    pub fn created_queue_id(&self, name: &QueueName) -> Option<QueueId> {
        self.recent.created_id(&name.encode())
    }

    /// The end of queue `id` (the offset its next entry gets) from memory, when memory holds
    /// the queue's newest entries; `None` when only the index can tell. Never blocks on I/O.
    pub fn queue_end_cached(&self, id: QueueId) -> Option<Offset> {
        self.recent.end(id)
    }

    /// Moves whenever memory forgets a created queue's name: a queue [`Self::queue_id`] found
    /// missing is still missing while this has not moved and [`Self::created_queue_id`] does
    /// not name it.
    pub fn created_forgotten(&self) -> u64 {
        self.recent.created_forgotten()
    }

    /// Moves whenever entries left memory. A reader that read a queue to its end (every entry
    /// below the dispatched position it saw before reading) finds everything appended since in
    /// memory as long as this has not moved: while [`Self::holds_recent`] says no, nothing was.
    pub fn recent_forgotten(&self) -> u64 {
        self.recent.forgotten()
    }

    /// Whether memory holds queue `id`'s newest entries (see [`Self::recent_forgotten`]).
    pub fn holds_recent(&self, id: QueueId) -> bool {
        self.recent.holds(id)
    }

    /// [`Self::read_record`] when the tail cache holds the record's bytes, `None` when they
    /// must be read from a segment file or the object store. Never blocks on I/O.
    pub fn read_record_cached(&self, entry: &IndexEntry) -> Option<Result<Record>> {
        let bytes = self.log.read_cached(entry.position, entry.size as usize)?;
        Some(bytes.and_then(|b| self.record_from(entry, b)))
    }

    /// The record an index entry points at. Payload bytes are shared, not copied.
    /// A withheld record (a `tier = "local"` record restored from the object store) and a
    /// volatile one written before this process started (`tier = "memory"`) are gone:
    /// `Error::Withheld`, of kind `Expired`; so is a record of a batch that failed its checks
    /// with no good copy to heal it from (`Error::Quarantined`). A record is never returned
    /// from bytes that failed their CRC.
    pub fn read_record(&self, entry: &IndexEntry) -> Result<Record> {
        let bytes = self.log.read(entry.position, entry.size as usize)?;
        self.record_from(entry, bytes)
    }

    fn record_from(&self, entry: &IndexEntry, bytes: Bytes) -> Result<Record> {
        let r = Record::decode(&bytes).map_err(|source| Error::Corrupt { position: entry.position.get(), source })?;
        if r.withheld || (r.volatile && entry.position < self.opened_at) {
            return Err(Error::Withheld(entry.position.get()));
        }
        Ok(r)
    }

    /// Up to `max` records of a queue from offset `from`, with their offsets.
    pub fn read_queue(&self, id: QueueId, from: Offset, max: usize) -> Result<Vec<(Offset, Record)>> {
        self.read_index(id, from, max)?.into_iter().map(|(o, e)| Ok((o, self.read_record(&e)?))).collect()
    }

    /// The active segment's base and the log's written end (see `LogShared::active_span`).
    pub fn active_span(&self) -> (LogPosition, LogPosition) {
        self.log.active_span()
    }

    /// Raw bytes of the log (for tiering and tests), checked like every read: bytes of a
    /// quarantined range are refused (`Error::Quarantined`).
    pub fn read_log(&self, pos: LogPosition, len: usize) -> Result<Bytes> {
        self.log.read(pos, len)
    }

    /// Log bytes to upload as they are: checked like [`Self::read_log`], but a quarantined
    /// range comes back as its gap batches instead of an error.
    pub fn read_log_for_upload(&self, pos: LogPosition, len: usize) -> Result<Bytes> {
        self.log.read_checked(pos, len, true)
    }

    /// Checks every batch of a local sealed segment, healing or quarantining what fails (see
    /// the `repair` module), and returns its quarantined ranges as `(position, length)`. `fresh`
    /// checks batches checked before again. Blocks on the disk and possibly the object store:
    /// call it off the async runtime. Nothing when the segment is not on this disk.
    pub fn check_segment(&self, segment: &SealedSegment, fresh: bool) -> Result<Vec<(LogPosition, u64)>> {
        self.log.check_segment(segment.base, fresh)
    }

    /// Seals the active segment now if it holds anything. Returns the position every sealed
    /// segment ends at: everything appended before the call lies below it.
    pub async fn roll(&self) -> Result<LogPosition> {
        let (tx, rx) = oneshot::channel();
        self.writer_tx.send(WriterMsg::Roll(tx)).map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// Where reads of segments no longer on the local disk go (set once, by tiering).
    pub fn set_cold_reader(&self, reader: Arc<dyn ColdReader>) -> bool {
        self.log.set_cold_reader(reader)
    }

    /// Drops the local copy of a sealed segment that the object store holds. Refused (false)
    /// while a restart could still need to re-index it from the local file: the index is
    /// flushed first and must be past the segment's end.
    pub fn evict_segment(&self, segment: &SealedSegment) -> Result<bool> {
        let index = self.index()?;
        if self.dispatched() < segment.end {
            return Ok(false);
        }
        index.flush(true)?;
        if index.checkpoint()?.is_none_or(|c| c < segment.end) {
            return Ok(false);
        }
        self.log.evict(segment.base)
    }

    /// Retention: positions below `pos` are gone; local segments wholly below it are deleted.
    pub fn truncate_before(&self, pos: LogPosition) -> Result<usize> {
        self.log.truncate_before(pos)
    }

    /// Moves a position at the end of a sealed segment (or on a segment header) to the first
    /// batch of the next segment.
    pub fn normalize(&self, pos: LogPosition) -> LogPosition {
        self.log.normalize(pos)
    }

    /// `(first offset, count)` of the entries of queue `name` that lie in `[from, to)` (for
    /// the object footer), if it has any there.
    pub fn queue_span(&self, name: &QueueName, from: LogPosition, to: LogPosition) -> Result<Option<(Offset, u64)>> {
        let index = self.index()?;
        let Some(meta) = index.lookup(name)? else { return Ok(None) };
        let next = index.last_offset(meta.id)?.map_or(Offset(0), Offset::next);
        let first = index.first_offset(meta.id)?.unwrap_or(next);
        let lo = first_held(&index, meta.id, first, next, from)?;
        let hi = first_held(&index, meta.id, lo, next, to)?;
        Ok((hi > lo).then(|| (lo, hi.get() - lo.get())))
    }

    /// Every MQTT topic queue with its id, in topic order (`silt export`).
    pub fn topics(&self) -> Result<Vec<(String, QueueId)>> {
        Ok(self.index()?.topics()?.into_iter().map(|(t, m)| (t, m.id)).collect())
    }

    /// Every registered wildcard filter queue (a scan of the index: for startup and tools).
    pub fn filters(&self) -> Result<Vec<String>> {
        Ok(self.index()?.filters()?.into_iter().map(|(f, _)| f).collect())
    }

    /// The registered filters matching any of `topics`, each once, in filter order: a walk of
    /// the dispatcher's trie per topic, so the cost follows the topics and their matches, not
    /// the number of filters. The trie's lock is taken per topic, never across the whole walk,
    /// so a filter registration waits for one topic's walk at most.
    pub fn filters_matching<'a>(&self, topics: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let mut out = std::collections::BTreeSet::new();
        for topic in topics {
            let filters = self.filters.read().expect("invariant: lock not poisoned");
            filters.for_each_match(topic, |filter, _| {
                if !out.contains(filter) {
                    out.insert(filter.to_owned());
                }
            });
        }
        out.into_iter().collect()
    }

    /// Positions below this were deleted by retention.
    pub fn floor(&self) -> LogPosition {
        self.log.floor()
    }

    /// Stops accepting appends for good (another node owns the log's object-store prefix).
    pub fn fence(&self) {
        self.log.fence();
    }

    /// Whether appends are refused for good (another node owns the prefix). A failed write or
    /// a full disk never does that: the writer recovers by itself.
    pub fn has_failed(&self) -> bool {
        self.log.is_fenced()
    }

    /// Told of every segment sealed from now on.
    pub fn subscribe_sealed(&self) -> mpsc::UnboundedReceiver<SealedSegment> {
        self.log.subscribe_sealed()
    }

    /// Segments sealed so far.
    pub fn sealed_segments(&self) -> Vec<SealedSegment> {
        self.log.sealed_segments()
    }

    pub fn stats(&self) -> StorageStats {
        let (sst, mem) = self.index().map(|i| i.approximate_sizes()).unwrap_or_default();
        StorageStats {
            log_start: self.log.start(),
            log_end: self.log.end(),
            dispatched: self.dispatched(),
            segments: self.log.sealed_segments().len() + 1,
            tail_cache_bytes: self.log.tail_bytes(),
            index_sst_bytes: sst,
            index_memtable_bytes: mem,
            fsyncs: self.log.fsyncs.load(Ordering::Relaxed),
            healed_batches: self.log.repairs.healed_batches.load(Ordering::Relaxed),
            quarantined_batches: self.log.repairs.quarantined_batches.load(Ordering::Relaxed),
            quarantined_bytes: self.log.repairs.quarantined_bytes.load(Ordering::Relaxed),
            skipped_records: self.log.repairs.skipped_records.load(Ordering::Relaxed),
            append_latency: self.log.append_latency.snapshot(),
            fsync_latency: self.log.fsync_latency.snapshot(),
        }
    }

    /// Writes and fsyncs everything appended, indexes it, flushes the index and stops the
    /// threads. Appends after this fail with `Closed`.
    pub fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let _ = self.writer_tx.send(WriterMsg::Shutdown);
        let mut threads = std::mem::take(&mut *self.threads.lock().expect("invariant: lock not poisoned"));
        // Writer first: the dispatcher must see the final end of the log before it stops.
        if !threads.is_empty() {
            let writer = threads.remove(0);
            let _ = writer.join();
        }
        self.stop.store(true, Ordering::Release);
        for t in threads {
            let _ = t.join();
        }
        self.pending.close();
        self.index.write().expect("invariant: lock not poisoned").take();
        if self.log.unclean.load(Ordering::Acquire) {
            return Err(Error::Unavailable("the final fsync of the commitlog failed".into()));
        }
        Ok(())
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

fn control(op: u8, filter: &TopicFilter) -> Record {
    let mut value = Vec::with_capacity(1 + filter.as_str().len());
    value.push(op);
    value.extend_from_slice(filter.as_str().as_bytes());
    Record { timestamp: Timestamp::now(), value: Bytes::from(value), control: true, ..Record::default() }
}

/// Registers seeded queues in an empty index (see [`Storage::open_seeded`]).
fn seed(index: &Index, seeds: &[(QueueName, Offset)], cursor: LogPosition) -> Result<()> {
    let mut batch = index.batch();
    let mut next_id = index.next_queue_id()?;
    for (name, base) in seeds.iter().filter(|(_, b)| b.get() > 0) {
        let id = QueueId(next_id);
        next_id += 1;
        batch.put_queue(&name.encode(), &crate::index::QueueMeta { id, since: cursor });
        let placeholder = IndexEntry { position: LogPosition(0), size: 0, timestamp: Timestamp(0) };
        batch.put_entries([(id, Offset(base.get() - 1), &placeholder)]);
    }
    batch.put_next_queue_id(next_id);
    batch.commit(cursor)
}

/// The first offset in `[from, next)` whose entry lies at or above `floor` (offsets of a queue
/// are dense and their positions grow, so a binary search finds it).
fn first_held(index: &Index, id: QueueId, from: Offset, next: Offset, floor: LogPosition) -> Result<Offset> {
    let (mut lo, mut hi) = (from.get(), next.get());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match index.read(id, Offset(mid), 1)?.first() {
            Some((o, e)) if e.position < floor => lo = o.get() + 1,
            Some((o, _)) => hi = o.get().min(mid),
            None => hi = mid,
        }
    }
    Ok(Offset(lo))
}

/// Deletes the index directory and opens an empty one.
fn rebuild(index: Index, dir: &Path, config: &StorageConfig) -> Result<Index> {
    drop(index);
    std::fs::remove_dir_all(dir).map_err(Error::io("remove index", dir))?;
    Index::open(dir, config)
}

/// Runs a future to completion on the calling thread. The engine's futures only wait on tokio's
/// runtime-independent sync primitives, so no runtime is needed.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}
