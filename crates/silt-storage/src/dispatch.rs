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
//!
//! Dispatch never stops for good. A batch that fails its checks is repaired by the read path
//! (healed, or quarantined behind a gap batch, which indexes as nothing); a record head that
//! does not decode inside a valid batch, or a control record with an invalid filter, is
//! skipped with a warning and counted. A round that fails otherwise (an unreachable object
//! store holding a bad batch's copy, a RocksDB write refused on a full disk) is retried with
//! capped backoff (100 ms to 5 s) after the in-memory state (filter trie, next queue id, queue
//! cache) is reloaded from the index, so nothing a failed round changed leaks into the retry;
//! repeated failures are logged once per interval with a count. Not guaranteed: offsets after a
//! quarantined batch differ from those a dispatch of the original bytes gave (its records are
//! gone), so a cursor saved before the corruption may skip or repeat a few messages.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use lru::LruCache;
use silt_types::{LogPosition, Offset, QueueId, Timestamp, TopicFilter, TopicTrie};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::format::RecordHead;
use crate::index::{Index, IndexBatch, IndexEntry, QueueMeta, QueueName};
use crate::log::{Batch, LogShared};
use crate::recent::RecentEntries;
use crate::throttle::Throttle;

/// Control record operations (first byte of a control record's value).
pub(crate) const OP_REGISTER_FILTER: u8 = 1;
pub(crate) const OP_DROP_FILTER: u8 = 2;
/// Drops a stream-partition queue (a deleted Kafka topic); the value is the queue's key.
pub(crate) const OP_DROP_PARTITION: u8 = 3;

/// Most records indexed in one round (one RocksDB write).
const MAX_ROUND_RECORDS: usize = 16_384;
/// Backoff between failed rounds.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What one dispatch round indexed: told to [`DispatchListener`]s after it is committed.
#[derive(Debug, Default)]
pub struct Dispatched {
    /// The log is indexed up to here.
    pub end: LogPosition,
    /// Queues that received entries.
    pub queues: Vec<QueueId>,
    /// MQTT topics of the records indexed, each once.
    pub topics: Vec<String>,
    /// Wildcard filters whose queues received entries, each once: with `topics`, a listener
    /// knows every subscription with something new by exact name, matching nothing itself.
    pub filters: Vec<String>,
}

/// Told after each dispatch round (the broker's notify path). Called on the dispatcher thread:
/// must not block.
pub trait DispatchListener: Send + Sync + 'static {
    fn dispatched(&self, event: &Dispatched);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FilterQueue {
    id: QueueId,
    since: LogPosition,
}

/// The registered filter queues as a trie: the dispatcher's, shared with readers that need the
/// filters matching a topic (the segment upload naming the queues a segment holds) so they walk
/// the trie instead of scanning every filter. Written only by the dispatcher (filter
/// registrations and drops, a reload after a failed round); read once per dispatched record.
pub(crate) type SharedFilters = Arc<RwLock<TopicTrie<FilterQueue>>>;

#[derive(Clone, Copy, Debug)]
struct QueueState {
    id: QueueId,
    next: Offset,
    /// The largest record timestamp the queue holds so far. A stream partition's entries
    /// carry it instead of their own record's (Kafka's time index does the same): the
    /// timestamps of a partition are its producers' CreateTime, in any order, and a binary
    /// search over a running maximum finds the first record at or after a time exactly.
    max_ts: Timestamp,
}

/// No record yet: below every timestamp.
const NO_TIME: Timestamp = Timestamp(i64::MIN);

pub(crate) struct Dispatcher {
    log: Arc<LogShared>,
    index: Arc<Index>,
    cursor: LogPosition,
    cache: LruCache<Vec<u8>, QueueState>,
    filters: SharedFilters,
    next_queue_id: u64,
    listeners: Vec<Arc<dyn DispatchListener>>,
    progress: watch::Sender<LogPosition>,
    recent: Arc<RecentEntries>,
    /// Scratch space of `dispatch_record`: a queue's name, and the filters a topic matched.
    key: Vec<u8>,
    matched: (Vec<u8>, Vec<usize>),
}

/// Per-round state: queues touched and changed, committed together.
struct Round<'a> {
    batch: IndexBatch<'a>,
    /// Hashed with foldhash, as the queue cache is (the `lru` crate's default): SipHash was
    /// 5 % of the dispatcher's CPU. Keys are client-chosen names; the hasher is seeded per process.
    touched: HashMap<Vec<u8>, QueueState, foldhash::fast::RandomState>,
    dropped: Vec<Vec<u8>>,
    /// Queues created (`Some`) and dropped (`None`), queues dropped, and the entries appended,
    /// in log order (for the recent-entries cache; written to the index at commit).
    names: Vec<(Vec<u8>, Option<QueueId>)>,
    /// Ids in `names` of filter queues that existed already, named because a registration
    /// met them (so readers find them in memory): they get no empty run.
    registered_again: Vec<QueueId>,
    dropped_ids: Vec<QueueId>,
    appended: Vec<(QueueId, Offset, IndexEntry)>,
    queues: Vec<QueueId>,
    topics: Vec<String>,
    filters: Vec<String>,
    ids_changed: bool,
    /// Records skipped (counted once the round is committed).
    skipped: u64,
}

impl Dispatcher {
    pub fn new(
        log: Arc<LogShared>,
        index: Arc<Index>,
        cursor: LogPosition,
        cache_entries: usize,
        listeners: Vec<Arc<dyn DispatchListener>>,
        progress: watch::Sender<LogPosition>,
        recent: Arc<RecentEntries>,
    ) -> Result<Self> {
        let filters = Arc::new(RwLock::new(load_filters(&index)?));
        let next_queue_id = index.next_queue_id()?;
        let cache = silt_types::lru::growing(NonZeroUsize::new(cache_entries).expect("invariant: validated > 0"));
        Ok(Self {
            log,
            index,
            cursor,
            cache,
            filters,
            next_queue_id,
            listeners,
            progress,
            recent,
            key: Vec::new(),
            matched: (Vec::new(), Vec::new()),
        })
    }

    /// The filter trie, shared with readers (see [`SharedFilters`]).
    pub fn shared_filters(&self) -> SharedFilters {
        self.filters.clone()
    }

    /// Forgets the in-memory state a failed round may have changed, reloading it from what the
    /// index committed.
    fn reload(&mut self) -> Result<()> {
        *self.filters.write().expect("invariant: lock not poisoned") = load_filters(&self.index)?;
        self.next_queue_id = self.index.next_queue_id()?;
        self.cache.clear();
        Ok(())
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
        let mut backoff = FIRST_BACKOFF;
        let mut failures = Throttle::new(Duration::from_secs(10));
        let mut flush_failures = Throttle::new(Duration::from_secs(10));
        loop {
            let stopping = stop.load(Ordering::Acquire);
            if unflushed && last_flush.elapsed() >= flush_every {
                match self.index.flush(false) {
                    Ok(()) => {
                        flush_failures.recovered();
                    }
                    Err(e) => {
                        if let Some(n) = flush_failures.failed() {
                            tracing::warn!(error = %e, failures = n, "periodic index flush failed");
                        }
                    }
                }
                last_flush = std::time::Instant::now();
                unflushed = false;
            }
            let end = self.log.wait_end_past(self.cursor, Duration::from_millis(100));
            match self.round(end) {
                Ok(true) => {
                    if failures.recovered() {
                        tracing::info!(position = %self.cursor, "dispatch goes on");
                    }
                    backoff = FIRST_BACKOFF;
                    unflushed = true;
                    continue;
                }
                Ok(false) if stopping => break,
                Ok(false) => {}
                Err(e) if stopping => {
                    tracing::error!(error = %e, position = %self.cursor, "dispatch failed at shutdown; the next start re-dispatches from the checkpoint");
                    break;
                }
                Err(e) => {
                    if let Some(n) = failures.failed() {
                        tracing::warn!(error = %e, position = %self.cursor, failures = n, "dispatch round failed; retrying");
                    }
                    if let Err(e) = self.reload() {
                        tracing::warn!(error = %e, "reloading the dispatcher's state from the index failed; retrying");
                    }
                    sleep_unless(&stop, backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
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
            touched: HashMap::default(),
            dropped: Vec::new(),
            names: Vec::new(),
            registered_again: Vec::new(),
            dropped_ids: Vec::new(),
            appended: Vec::new(),
            queues: Vec::new(),
            topics: Vec::new(),
            filters: Vec::new(),
            ids_changed: false,
            skipped: 0,
        };
        let start = cursor;
        let mut records = 0usize;
        while cursor < end && records < MAX_ROUND_RECORDS {
            let view = match self.log.read_batch(cursor) {
                Ok(Batch::Records(view)) => view,
                Ok(Batch::Gap(len)) => {
                    cursor = self.log.normalize(cursor.add(len));
                    continue;
                }
                // What was indexed before is committed; the next round meets the error again.
                Err(_) if cursor > start => break,
                Err(e) => return Err(e),
            };
            for &(off, len) in &view.records {
                let pos = cursor.add(u64::from(off));
                let bytes = &view.frame[off as usize..(off + len) as usize];
                match RecordHead::decode(bytes) {
                    Ok(head) => self.dispatch_record(&mut round, pos, len, &head)?,
                    Err(e) => {
                        tracing::warn!(position = %pos, error = %e, "a record in a valid batch does not decode; skipped");
                        round.skipped += 1;
                    }
                }
                records += 1;
            }
            cursor = self.log.normalize(cursor.add(view.frame.len() as u64));
        }
        let Round {
            batch,
            touched,
            dropped,
            names,
            registered_again,
            dropped_ids,
            appended,
            mut queues,
            mut topics,
            mut filters,
            ids_changed,
            skipped,
        } = round;
        let mut batch = batch;
        if ids_changed {
            batch.put_next_queue_id(self.next_queue_id);
        }
        // The entries in key order (queue, then offset), so that RocksDB's memtable inserts
        // each next entry just after the one before and takes its skiplist's sequential-insert
        // shortcut; in log order the queues of a round interleave and every insert searched
        // from the top (a tenth of the broker's CPU under fan-in). A queue dropped in this
        // round had its entries deleted with it: none are written.
        let mut sorted: Vec<&(QueueId, Offset, IndexEntry)> =
            appended.iter().filter(|(id, _, _)| !dropped_ids.contains(id)).collect();
        sorted.sort_unstable_by_key(|(id, off, _)| (*id, *off));
        batch.put_entries(sorted.into_iter().map(|(id, off, e)| (*id, *off, e)));
        batch.commit(cursor)?;
        // Committed: readers may now be served these entries from memory, before the new
        // position is announced.
        self.recent.start_runs(names.iter().filter_map(|(_, id)| *id).filter(|id| !registered_again.contains(id)));
        self.recent.extend(appended);
        for id in dropped_ids {
            self.recent.remove(id);
        }
        if !names.is_empty() {
            self.recent.name_queues(names);
        }
        self.log.repairs.skipped_records.fetch_add(skipped, std::sync::atomic::Ordering::Relaxed);
        for key in dropped {
            self.cache.pop(&key);
        }
        // The cache is for queues being written. A queue still empty (a filter queue just
        // registered, nothing matched yet) stays out: with a persistent wildcard per device,
        // caching each would hold an entry and a key (about 140 bytes) per subscription until
        // evicted, to save two index reads on the first message the filter ever matches.
        for (k, s) in touched {
            if s.next > Offset(0) {
                self.cache.put(k, s);
            }
        }
        self.cursor = cursor;
        self.progress.send_replace(cursor);
        if !self.listeners.is_empty() {
            queues.sort_unstable();
            queues.dedup();
            topics.sort_unstable();
            topics.dedup();
            filters.sort_unstable();
            filters.dedup();
            let event = Dispatched { end: cursor, queues, topics, filters };
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
        // Queue names are built in one reused buffer: a record's lookups allocate nothing
        // (a round allocates a name only for a queue it touches first).
        let mut key = std::mem::take(&mut self.key);
        let pushed = (|| {
            if !head.stream.is_empty() {
                QueueName::partition_key_into(&mut key, head.stream, head.partition);
                self.push(round, &key, pos, &entry)?;
            }
            if !head.topic.is_empty() {
                QueueName::key_into(&mut key, b't', head.topic);
                self.push(round, &key, pos, &entry)?;
                // The matching filters' queue names, back to back, and where each ends.
                let (mut names, mut ends) = std::mem::take(&mut self.matched);
                names.clear();
                ends.clear();
                self.filters.read().expect("invariant: lock not poisoned").for_each_match(head.topic, |filter, q| {
                    if q.since < pos {
                        names.push(b'f');
                        names.extend_from_slice(filter.as_bytes());
                        ends.push(names.len());
                    }
                });
                let mut pushed = Ok(());
                let mut start = 0;
                for &end in &ends {
                    pushed = self.push(round, &names[start..end], pos, &entry);
                    if pushed.is_err() {
                        break;
                    }
                    start = end;
                }
                self.matched = (names, ends);
                pushed?;
                // Consecutive records of one topic (a producer's batch) name it once.
                if !self.listeners.is_empty() && round.topics.last().is_none_or(|t| t != head.topic) {
                    round.topics.push(head.topic.to_owned());
                }
            }
            Ok(())
        })();
        self.key = key;
        pushed
    }

    /// Appends `entry` to the queue named by `key`, creating the queue (topics and partitions
    /// only) when it does not exist yet.
    fn push(&mut self, round: &mut Round<'_>, key: &[u8], pos: LogPosition, entry: &IndexEntry) -> Result<()> {
        let key_is_partition = key.first() == Some(&b'p');
        let state = match round.touched.get_mut(key) {
            Some(s) => s,
            None => {
                let s = match self.cache.get(key) {
                    Some(s) => *s,
                    None => match self.index.lookup_key(key)? {
                        Some(meta) => {
                            let last = self.index.last_offset(meta.id)?;
                            let max_ts = match last {
                                Some(o) if key_is_partition => {
                                    self.index.read(meta.id, o, 1)?.first().map_or(NO_TIME, |(_, e)| e.timestamp)
                                }
                                _ => NO_TIME,
                            };
                            QueueState { id: meta.id, next: last.map_or(Offset(0), Offset::next), max_ts }
                        }
                        None if key.first() == Some(&b'f') => {
                            return Err(Error::Invalid("filter queue matched but not registered".into()));
                        }
                        None => {
                            let id = self.allocate(round);
                            round.batch.put_queue(key, &QueueMeta { id, since: pos });
                            round.names.push((key.to_vec(), Some(id)));
                            QueueState { id, next: Offset(0), max_ts: NO_TIME }
                        }
                    },
                };
                // A filter queue's first entry of the round names the filter to listeners (a
                // queue registered in this round was named by its registration).
                if !self.listeners.is_empty()
                    && let Some((b'f', filter)) = key.split_first()
                {
                    round.filters.push(String::from_utf8_lossy(filter).into_owned());
                }
                round.touched.entry(key.to_vec()).or_insert(s)
            }
        };
        let written = if key_is_partition {
            state.max_ts = state.max_ts.max(entry.timestamp);
            IndexEntry { timestamp: state.max_ts, ..*entry }
        } else {
            *entry
        };
        round.appended.push((state.id, state.next, written));
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
        let Some((op, rest)) = value.split_first() else {
            tracing::warn!(position = %pos, "an empty control record; skipped");
            round.skipped += 1;
            return Ok(());
        };
        if *op == OP_DROP_PARTITION {
            return self.drop_partition(round, pos, rest);
        }
        let Some(filter) = std::str::from_utf8(rest).ok().and_then(|s| TopicFilter::new(s).ok()) else {
            tracing::warn!(position = %pos, "a control record with an invalid filter; skipped");
            round.skipped += 1;
            return Ok(());
        };
        let key = QueueName::Filter(filter.as_str().to_owned()).encode();
        let existing = match round.touched.get(&key) {
            Some(s) => Some(s.id),
            None => self.index.lookup_key(&key)?.map(|m| m.id),
        };
        match (*op, existing) {
            (OP_REGISTER_FILTER, None) => {
                let id = self.allocate(round);
                round.batch.put_queue(&key, &QueueMeta { id, since: pos });
                round.names.push((key.clone(), Some(id)));
                self.filters
                    .write()
                    .expect("invariant: lock not poisoned")
                    .insert(&filter, FilterQueue { id, since: pos });
                if !self.listeners.is_empty() {
                    round.filters.push(filter.as_str().to_owned());
                }
                round.touched.insert(key, QueueState { id, next: Offset(0), max_ts: NO_TIME });
            }
            (OP_DROP_FILTER, Some(id)) => {
                round.batch.delete_queue(&key, id);
                round.dropped_ids.push(id);
                round.names.push((key.clone(), None));
                let mut filters = self.filters.write().expect("invariant: lock not poisoned");
                let held = filters.get(&filter).iter().find(|q| q.id == id).copied();
                if let Some(q) = held {
                    filters.remove(&filter, &q);
                }
                round.touched.remove(&key);
                round.dropped.push(key);
            }
            (OP_REGISTER_FILTER, Some(id)) => {
                // Already registered: named in memory all the same, so the subscriber that
                // registered it finds its id without reading the index.
                round.names.push((key, Some(id)));
                round.registered_again.push(id);
            }
            (OP_DROP_FILTER, None) => {} // already in the wanted state
            (other, _) => tracing::warn!(op = other, position = %pos, "unknown control record skipped"),
        }
        Ok(())
    }

    /// Drops the stream-partition queue whose key is `key`, with its entries: the next record
    /// of that partition starts a new queue at offset 0.
    fn drop_partition(&mut self, round: &mut Round<'_>, pos: LogPosition, key: &[u8]) -> Result<()> {
        if key.first() != Some(&b'p') {
            tracing::warn!(position = %pos, "a partition drop naming no partition queue; skipped");
            round.skipped += 1;
            return Ok(());
        }
        let existing = match round.touched.get(key) {
            Some(s) => Some(s.id),
            None => self.index.lookup_key(key)?.map(|m| m.id),
        };
        if let Some(id) = existing {
            round.batch.delete_queue(key, id);
            round.dropped_ids.push(id);
            round.names.push((key.to_vec(), None));
            round.touched.remove(key);
            round.dropped.push(key.to_vec());
        }
        Ok(())
    }
}

/// The filter queues the index holds, as a trie. A stored filter that does not parse (it
/// cannot be there: control records with invalid filters are skipped) is left out.
fn load_filters(index: &Index) -> Result<TopicTrie<FilterQueue>> {
    let mut filters = TopicTrie::new();
    for (f, meta) in index.filters()? {
        match TopicFilter::new(f.as_str()) {
            Ok(filter) => {
                filters.insert(&filter, FilterQueue { id: meta.id, since: meta.since });
            }
            Err(e) => tracing::warn!(filter = %f, error = %e, "a stored filter queue does not parse; ignored"),
        }
    }
    Ok(filters)
}

/// Sleeps for `d`, waking early when `stop` is set.
fn sleep_unless(stop: &std::sync::atomic::AtomicBool, d: Duration) {
    let until = std::time::Instant::now() + d;
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}
