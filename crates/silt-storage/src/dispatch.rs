//! The dispatcher: follows the commitlog and writes each record's index entries into its
//! consume queues.
//!
//! One thread, reading the log from the index checkpoint in log order (from the tail cache
//! while it keeps up). For each record it appends an entry to the record's stream-partition
//! queue, its MQTT topic queue, and every registered filter queue whose filter matches the topic
//! (found through a topic trie, never by scanning filters). A round's entries, new queues and
//! the new checkpoint go into RocksDB as one `WriteBatch`.
//!
//! Dispatch is deterministic: the same log yields the same queue ids and offsets, so a
//! re-dispatch after a crash (or into an empty index) reproduces the index exactly. Control
//! records in the log register and drop filter queues, which is why a filter queue created at
//! position P indexes only records after P, however often the log is replayed.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use lru::LruCache;
use silt_types::{LogPosition, Offset, QueueId, TopicFilter, TopicTrie};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::format::{self, RecordHead};
use crate::index::{Index, IndexBatch, IndexEntry, QueueMeta, QueueName};
use crate::log::LogShared;

/// Control record operations (first byte of a control record's value).
pub(crate) const OP_REGISTER_FILTER: u8 = 1;
pub(crate) const OP_DROP_FILTER: u8 = 2;

/// Most records indexed in one round (one RocksDB write).
const MAX_ROUND_RECORDS: usize = 16_384;

/// What one dispatch round indexed: told to [`DispatchListener`]s after it is committed.
#[derive(Debug, Default)]
pub struct Dispatched {
    /// The log is indexed up to here.
    pub end: LogPosition,
    /// Queues that received entries.
    pub queues: Vec<QueueId>,
    /// MQTT topics of the records indexed, each once.
    pub topics: Vec<String>,
}

/// Told after each dispatch round (the broker's notify path). Called on the dispatcher thread:
/// must not block.
pub trait DispatchListener: Send + Sync + 'static {
    fn dispatched(&self, event: &Dispatched);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FilterQueue {
    id: QueueId,
    since: LogPosition,
}

#[derive(Clone, Copy, Debug)]
struct QueueState {
    id: QueueId,
    next: Offset,
}

pub(crate) struct Dispatcher {
    log: Arc<LogShared>,
    index: Arc<Index>,
    cursor: LogPosition,
    cache: LruCache<Vec<u8>, QueueState>,
    filters: TopicTrie<FilterQueue>,
    next_queue_id: u64,
    listeners: Vec<Arc<dyn DispatchListener>>,
    progress: watch::Sender<LogPosition>,
}

/// Per-round state: queues touched and changed, committed together.
struct Round<'a> {
    batch: IndexBatch<'a>,
    touched: HashMap<Vec<u8>, QueueState>,
    dropped: Vec<Vec<u8>>,
    queues: Vec<QueueId>,
    topics: Vec<String>,
    ids_changed: bool,
}

impl Dispatcher {
    pub fn new(
        log: Arc<LogShared>,
        index: Arc<Index>,
        cursor: LogPosition,
        cache_entries: usize,
        listeners: Vec<Arc<dyn DispatchListener>>,
        progress: watch::Sender<LogPosition>,
    ) -> Result<Self> {
        let mut filters = TopicTrie::new();
        for (f, meta) in index.filters()? {
            let filter = TopicFilter::new(f).map_err(|e| Error::Invalid(format!("stored filter: {e}")))?;
            filters.insert(&filter, FilterQueue { id: meta.id, since: meta.since });
        }
        let next_queue_id = index.next_queue_id()?;
        let cache = LruCache::new(NonZeroUsize::new(cache_entries).expect("invariant: validated > 0"));
        Ok(Self { log, index, cursor, cache, filters, next_queue_id, listeners, progress })
    }

    /// Runs until `stop` says so and the log is fully indexed, then flushes the index.
    ///
    /// The index is also flushed every `index_flush_interval_ms` while it changes: with the
    /// RocksDB WAL off, the flushed checkpoint is where dispatch resumes after a crash, so this
    /// bounds the re-dispatch work on restart.
    pub fn run(mut self, stop: Arc<std::sync::atomic::AtomicBool>) {
        use std::sync::atomic::Ordering;
        let flush_every = Duration::from_millis(self.log.config.index_flush_interval_ms);
        let mut last_flush = std::time::Instant::now();
        let mut unflushed = false;
        loop {
            let stopping = stop.load(Ordering::Acquire);
            if unflushed && last_flush.elapsed() >= flush_every {
                if let Err(e) = self.index.flush(false) {
                    tracing::warn!(error = %e, "periodic index flush failed");
                }
                last_flush = std::time::Instant::now();
                unflushed = false;
            }
            let end = self.log.wait_end_past(self.cursor, Duration::from_millis(100));
            match self.round(end) {
                Ok(true) => {
                    unflushed = true;
                    continue;
                }
                Ok(false) if stopping => break,
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(error = %e, position = %self.cursor, "dispatch failed; index stops here");
                    self.log.fail();
                    return;
                }
            }
        }
        if let Err(e) = self.index.flush(true) {
            tracing::error!(error = %e, "index flush at shutdown failed; the next start re-dispatches");
        }
    }

    /// Indexes from the cursor towards `end`. Returns whether anything was indexed.
    pub fn round(&mut self, end: LogPosition) -> Result<bool> {
        let mut cursor = self.log.normalize(self.cursor);
        if cursor >= end {
            if cursor != self.cursor {
                // Only segment headers lay between: nothing to index, but the log is indexed
                // up to here (a roll with nothing after it must not leave waiters behind).
                self.cursor = cursor;
                self.progress.send_replace(cursor);
            }
            return Ok(false);
        }
        let index = self.index.clone();
        let mut round = Round {
            batch: index.batch(),
            touched: HashMap::new(),
            dropped: Vec::new(),
            queues: Vec::new(),
            topics: Vec::new(),
            ids_changed: false,
        };
        let max = self.log.config.max_batch_bytes as usize;
        let mut records = 0usize;
        while cursor < end && records < MAX_ROUND_RECORDS {
            let frame = self.log.read_frame(cursor)?;
            let frame_len = frame.len() as u64;
            let view =
                format::check_batch(frame, max).map_err(|source| Error::Corrupt { position: cursor.get(), source })?;
            for &(off, len) in &view.records {
                let pos = cursor.add(u64::from(off));
                let bytes = &view.frame[off as usize..(off + len) as usize];
                let head =
                    RecordHead::decode(bytes).map_err(|source| Error::Corrupt { position: pos.get(), source })?;
                self.dispatch_record(&mut round, pos, len, &head)?;
                records += 1;
            }
            cursor = self.log.normalize(cursor.add(frame_len));
        }
        let Round { batch, touched, dropped, mut queues, mut topics, ids_changed } = round;
        let mut batch = batch;
        if ids_changed {
            batch.put_next_queue_id(self.next_queue_id);
        }
        batch.commit(cursor)?;
        for key in dropped {
            self.cache.pop(&key);
        }
        for (k, s) in touched {
            self.cache.put(k, s);
        }
        self.cursor = cursor;
        self.progress.send_replace(cursor);
        if !self.listeners.is_empty() {
            queues.sort_unstable();
            queues.dedup();
            topics.sort_unstable();
            topics.dedup();
            let event = Dispatched { end: cursor, queues, topics };
            for l in &self.listeners {
                l.dispatched(&event);
            }
        }
        Ok(true)
    }

    fn dispatch_record(
        &mut self,
        round: &mut Round<'_>,
        pos: LogPosition,
        len: u32,
        head: &RecordHead<'_>,
    ) -> Result<()> {
        if head.control {
            return self.control(round, pos, head.value);
        }
        let entry = IndexEntry { position: pos, size: len, timestamp: head.timestamp };
        if !head.stream.is_empty() {
            let key = QueueName::Partition { stream: head.stream.to_owned(), partition: head.partition }.encode();
            self.push(round, key, pos, &entry)?;
        }
        if !head.topic.is_empty() {
            self.push(round, QueueName::Topic(head.topic.to_owned()).encode(), pos, &entry)?;
            let mut matched = Vec::new();
            self.filters.for_each_match(head.topic, |filter, q| {
                if q.since < pos {
                    matched.push(filter.to_owned());
                }
            });
            for f in matched {
                self.push(round, QueueName::Filter(f).encode(), pos, &entry)?;
            }
            if !self.listeners.is_empty() {
                round.topics.push(head.topic.to_owned());
            }
        }
        Ok(())
    }

    /// Appends `entry` to the queue named by `key`, creating the queue (topics and partitions
    /// only) when it does not exist yet.
    fn push(&mut self, round: &mut Round<'_>, key: Vec<u8>, pos: LogPosition, entry: &IndexEntry) -> Result<()> {
        let state = match round.touched.get_mut(&key) {
            Some(s) => s,
            None => {
                let s = match self.cache.get(&key) {
                    Some(s) => *s,
                    None => match self.index.lookup_key(&key)? {
                        Some(meta) => QueueState {
                            id: meta.id,
                            next: self.index.last_offset(meta.id)?.map_or(Offset(0), Offset::next),
                        },
                        None if key.first() == Some(&b'f') => {
                            return Err(Error::Invalid("filter queue matched but not registered".into()));
                        }
                        None => {
                            let id = self.allocate(round);
                            round.batch.put_queue(&key, &QueueMeta { id, since: pos });
                            QueueState { id, next: Offset(0) }
                        }
                    },
                };
                round.touched.entry(key).or_insert(s)
            }
        };
        round.batch.put_entry(state.id, state.next, entry);
        state.next = state.next.next();
        if !self.listeners.is_empty() {
            round.queues.push(state.id);
        }
        Ok(())
    }

    fn allocate(&mut self, round: &mut Round<'_>) -> QueueId {
        let id = QueueId(self.next_queue_id);
        self.next_queue_id += 1;
        round.ids_changed = true;
        id
    }

    fn control(&mut self, round: &mut Round<'_>, pos: LogPosition, value: &[u8]) -> Result<()> {
        let (op, rest) = value.split_first().ok_or(Error::Invalid("empty control record".into()))?;
        let filter = std::str::from_utf8(rest)
            .ok()
            .and_then(|s| TopicFilter::new(s).ok())
            .ok_or(Error::Invalid("control record with an invalid filter".into()))?;
        let key = QueueName::Filter(filter.as_str().to_owned()).encode();
        let existing = match round.touched.get(&key) {
            Some(s) => Some(s.id),
            None => self.index.lookup_key(&key)?.map(|m| m.id),
        };
        match (*op, existing) {
            (OP_REGISTER_FILTER, None) => {
                let id = self.allocate(round);
                round.batch.put_queue(&key, &QueueMeta { id, since: pos });
                self.filters.insert(&filter, FilterQueue { id, since: pos });
                round.touched.insert(key, QueueState { id, next: Offset(0) });
            }
            (OP_DROP_FILTER, Some(id)) => {
                round.batch.delete_queue(&key, id);
                let held = self.filters.get(&filter).iter().find(|q| q.id == id).copied();
                if let Some(q) = held {
                    self.filters.remove(&filter, &q);
                }
                round.touched.remove(&key);
                round.dropped.push(key);
            }
            (OP_REGISTER_FILTER | OP_DROP_FILTER, _) => {} // already in the wanted state
            (other, _) => tracing::warn!(op = other, position = %pos, "unknown control record skipped"),
        }
        Ok(())
    }
}
