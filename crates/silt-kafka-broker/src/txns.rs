//! The driver of producer ids, idempotence and transactions (`silt_kafka::producer`,
//! `silt_kafka::txn`): their durable records, the markers that end a transaction, and what a
//! read-committed fetch needs of each partition.
//!
//! Durable state, in internal streams replayed at start-up:
//! - `__silt_txn`: producer-id blocks and every transactional id's state, written by one task
//!   in the order they were decided, each before the request it belongs to is answered;
//! - `__silt_txn_aborted`: the offset ranges of aborted transactions per partition (what a
//!   read-committed fetch lists for the client to skip).
//!
//! A transaction is ended by writing a control record (Kafka's commit or abort marker) into
//! each partition it wrote, then (on commit) applying its staged offsets to their groups, then
//! recording it complete. A transaction left open by a crash or a restart is aborted before the
//! Kafka listener serves anyone. The last stable offset of a partition is the first offset of
//! its oldest open transaction (its high watermark when none is open).
//!
//! Idempotence state lives in memory; after a restart, a producer's last batches in a partition
//! are found in the partition's last records (they carry producer and sequence), so a retry
//! across the restart is still written once (see `LOOK_BACK`).
//!
//! Not provided: records written inside a transaction are not delivered over MQTT (MQTT has no
//! notion of an uncommitted message, and an aborted one must never reach a subscriber); they
//! are the Kafka view's.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use silt_dataset::{Assign, attrs, internal};
use silt_kafka::producer::{At, Check, ProducerStates, Written};
use silt_kafka::txn::{Ending, TxnRecord, Txns};
use silt_storage::{Producer, QueueName, Record, Storage};
use silt_types::{Offset, Partition, Timestamp};
use tokio::sync::{mpsc, oneshot};

use crate::node::Kafka;

/// Internal stream of producer-id blocks and transaction states.
pub const TXN_STREAM: &str = "__silt_txn";
/// Internal stream of aborted transactions' offset ranges.
pub const ABORTED_STREAM: &str = "__silt_txn_aborted";
/// Records looked at, from a partition's end, for a producer's last batches after a restart.
const LOOK_BACK: u64 = 2_000;
/// Idempotence entries kept (producer and partition pairs).
const MAX_PRODUCER_ENTRIES: usize = 100_000;

/// An aborted transaction's records in one partition: `[first, last]`, `last` its marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Aborted {
    pub producer_id: i64,
    pub first: i64,
    pub last: i64,
}

#[derive(Serialize, Deserialize)]
struct AbortedRecord {
    topic: String,
    partition: i32,
    range: Aborted,
}

type PartitionKey = (String, i32);

struct Inner {
    txns: Txns,
    producers: ProducerStates,
    /// Open transactions per partition: producer id → first offset.
    open: HashMap<PartitionKey, BTreeMap<i64, i64>>,
    aborted: HashMap<PartitionKey, Vec<Aborted>>,
}

type Done = oneshot::Sender<silt_storage::Result<()>>;

/// The persister's work, done in the order queued.
enum Job {
    /// Records to append, and who waits for them.
    Append(Vec<Record>, Done),
    /// Full dumps of both streams, taken under the state lock when queued: written behind
    /// everything decided before and ahead of everything decided after, so a replay from its
    /// checkpoint sees no older state after a newer one.
    Dump { txns: Vec<Record>, aborted: HashMap<PartitionKey, Vec<Aborted>>, done: Done },
}

pub struct Transactions {
    inner: Mutex<Inner>,
    persist: mpsc::UnboundedSender<Job>,
    persist_rx: Mutex<Option<mpsc::UnboundedReceiver<Job>>>,
}

fn internal_record(stream: &str, key: &str, value: Vec<u8>) -> Record {
    Record {
        timestamp: Timestamp::now(),
        stream: stream.into(),
        partition: Partition(0),
        key: Some(Bytes::copy_from_slice(key.as_bytes())),
        value: Bytes::from(value),
        ..Record::default()
    }
}

fn txn_log(records: &[TxnRecord]) -> Vec<Record> {
    records
        .iter()
        .map(|r| {
            let key = match r {
                TxnRecord::PidBlock { .. } => "",
                TxnRecord::State(t) => t.id.as_str(),
            };
            internal_record(TXN_STREAM, key, r.encode())
        })
        .collect()
}

/// Kafka's control record for a transaction marker: key (version 0, type 0 abort / 1 commit),
/// value (version 0, coordinator epoch).
fn marker(topic: &str, partition: i32, e: &Ending) -> Record {
    let mut key = BytesMut::with_capacity(4);
    key.put_i16(0);
    key.put_i16(i16::from(e.commit));
    let mut value = BytesMut::with_capacity(6);
    value.put_i16(0);
    value.put_i32(0);
    Record {
        timestamp: Timestamp::now(),
        stream: topic.to_owned(),
        partition: Partition(partition as u32),
        key: Some(key.freeze()),
        value: value.freeze(),
        attrs: attrs::TRANSACTIONAL | attrs::KAFKA_CONTROL,
        producer: Some(Producer { id: e.producer_id, epoch: e.epoch, sequence: -1 }),
        ..Record::default()
    }
}

/// The persister's half of [`Transactions::dump`]. Aborted ranges wholly below their
/// partition's log start are left out (no fetch can reach them) and forgotten in memory.
async fn write_dump(
    storage: &Arc<Storage>,
    owner: &std::sync::Weak<Transactions>,
    txns: Vec<Record>,
    aborted: HashMap<PartitionKey, Vec<Aborted>>,
) -> silt_storage::Result<()> {
    let s = storage.clone();
    let (txn_start, aborted_start, starts, aborted) = tokio::task::spawn_blocking(move || {
        let mut starts = HashMap::new();
        for (topic, partition) in aborted.keys() {
            let name = QueueName::Partition { stream: topic.clone(), partition: Partition(*partition as u32) };
            let start = match s.queue_id(&name)? {
                Some(id) => s.queue_bounds(id)?.0.get() as i64,
                None => 0,
            };
            starts.insert((topic.clone(), *partition), start);
        }
        let (txn_end, aborted_end) = (internal::stream_end(&s, TXN_STREAM)?, internal::stream_end(&s, ABORTED_STREAM)?);
        Ok::<_, silt_storage::Error>((txn_end, aborted_end, starts, aborted))
    })
    .await
    .map_err(|_| silt_storage::Error::Closed)??;
    let mut kept = Vec::new();
    for ((topic, partition), ranges) in &aborted {
        let start = starts.get(&(topic.clone(), *partition)).copied().unwrap_or(0);
        for range in ranges.iter().filter(|r| r.last >= start) {
            let rec = AbortedRecord { topic: topic.clone(), partition: *partition, range: *range };
            let value = serde_json::to_vec(&rec).expect("invariant: plain data serializes");
            kept.push(internal_record(ABORTED_STREAM, topic, value));
        }
    }
    for chunk in txns.chunks(1000) {
        storage.append(chunk).await?;
    }
    storage.append(&[internal::checkpoint_record(TXN_STREAM, txn_start)]).await?;
    for chunk in kept.chunks(1000) {
        storage.append(chunk).await?;
    }
    storage.append(&[internal::checkpoint_record(ABORTED_STREAM, aborted_start)]).await?;
    if let Some(t) = owner.upgrade() {
        let mut inner = t.lock();
        for (key, start) in starts {
            if let Some(v) = inner.aborted.get_mut(&key) {
                v.retain(|r| r.last >= start);
                if v.is_empty() {
                    inner.aborted.remove(&key);
                }
            }
        }
    }
    Ok(())
}

impl Transactions {
    /// Replays the transaction streams (blocking: before a runtime serves clients).
    pub fn open(storage: &Storage) -> silt_storage::Result<Arc<Transactions>> {
        let mut txns = Txns::default();
        let from = internal::checkpoint(storage, TXN_STREAM)?;
        let replayed = internal::scan(storage, TXN_STREAM, from, |_, r| {
            if let Some(rec) = TxnRecord::decode(&r.value) {
                txns.restore(rec);
            }
        })?;
        let mut aborted: HashMap<PartitionKey, Vec<Aborted>> = HashMap::new();
        let from = internal::checkpoint(storage, ABORTED_STREAM)?;
        internal::scan(storage, ABORTED_STREAM, from, |_, r| {
            if let Ok(a) = serde_json::from_slice::<AbortedRecord>(&r.value) {
                aborted.entry((a.topic, a.partition)).or_default().push(a.range);
            }
        })?;
        if internal::worth_compacting(replayed, txns.len()) {
            let start = internal::stream_end(storage, TXN_STREAM)?;
            storage.append_blocking(&txn_log(&txns.dump()))?;
            storage.append_blocking(&[internal::checkpoint_record(TXN_STREAM, start)])?;
            tracing::info!(replayed, live = txns.len(), "transaction states compacted");
        }
        let (persist, rx) = mpsc::unbounded_channel();
        Ok(Arc::new(Transactions {
            inner: Mutex::new(Inner {
                txns,
                producers: ProducerStates::new(MAX_PRODUCER_ENTRIES),
                open: HashMap::new(),
                aborted,
            }),
            persist,
            persist_rx: Mutex::new(Some(rx)),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("invariant: lock not poisoned")
    }

    /// Starts the persister on the current runtime; it ends with the last handle.
    pub fn start(self: &Arc<Self>, storage: Arc<Storage>) {
        let Some(mut rx) = self.persist_rx.lock().expect("invariant: lock not poisoned").take() else { return };
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(job) = rx.recv().await {
                match job {
                    Job::Append(records, done) => {
                        let _ = done.send(storage.append(&records).await.map(|_| ()));
                    }
                    Job::Dump { txns, aborted, done } => {
                        let _ = done.send(write_dump(&storage, &weak, txns, aborted).await);
                    }
                }
            }
        });
    }

    /// Queues `records` behind everything queued before (call it under the state lock, so the
    /// order of the log is the order of the decisions) and returns the wait for them.
    fn queue(&self, records: Vec<Record>) -> oneshot::Receiver<silt_storage::Result<()>> {
        let (tx, rx) = oneshot::channel();
        if records.is_empty() {
            let _ = tx.send(Ok(()));
        } else {
            // Were the persister gone, the dropped sender answers the wait with an error.
            let _ = self.persist.send(Job::Append(records, tx));
        }
        rx
    }

    async fn durable(rx: oneshot::Receiver<silt_storage::Result<()>>) -> Result<(), i16> {
        match rx.await {
            Ok(Ok(())) => Ok(()),
            _ => Err(silt_kafka::kafka_protocol::ResponseError::CoordinatorNotAvailable.code()),
        }
    }

    /// Runs a decision of the transaction coordinator and waits until its records are durable.
    pub async fn decide<T>(&self, f: impl FnOnce(&mut Txns) -> silt_kafka::txn::Outcome<T>) -> Result<T, i16> {
        let (value, wait) = {
            let mut inner = self.lock();
            let (records, value) = f(&mut inner.txns)?;
            (value, self.queue(txn_log(&records)))
        };
        Self::durable(wait).await?;
        Ok(value)
    }

    /// The idempotence decision for a produced batch; [`Check::Unknown`] is resolved here by
    /// looking at the partition's last records.
    pub fn check(&self, storage: &Storage, at: At<'_>, epoch: i16, first: i32, count: usize) -> Check {
        let c = self.lock().producers.check(at, epoch, first, count);
        if c != Check::Unknown {
            return c;
        }
        let found = look_back(storage, at.pid, at.topic, at.partition);
        let mut inner = self.lock();
        inner.producers.hydrate(at, found);
        inner.producers.check(at, epoch, first, count)
    }

    pub fn record(&self, at: At<'_>, epoch: i16, first: i32, count: usize, offset: u64) {
        self.lock().producers.record(at, epoch, first, count, offset);
    }

    /// Whether a transactional batch may be written to a partition.
    pub fn may_produce(&self, id: &str, pid: i64, epoch: i16, topic: &str, partition: i32) -> Result<(), i16> {
        self.lock().txns.may_produce(id, pid, epoch, topic, partition)
    }

    /// A batch of `pid`'s transaction is about to be appended to a partition whose end is
    /// `end` (so it lands at `end` or later). Until the transaction ends the partition's last
    /// stable offset stays at or below `end`: a read_committed fetch woken by the append never
    /// sees the open transaction's records, whatever order the append's acknowledgement and
    /// the fetch run in. Conservative: records others append between `end` and the
    /// transaction's first record wait for its end too.
    pub fn landing(&self, pid: i64, topic: &str, partition: i32, end: i64) {
        let mut inner = self.lock();
        inner.open.entry((topic.to_owned(), partition)).or_default().entry(pid).or_insert(end);
    }

    /// The first record of `id`'s transaction in a partition is at `offset`: the partition's
    /// last stable offset stays below it until the transaction ends.
    pub async fn landed(&self, id: &str, pid: i64, topic: &str, partition: i32, offset: i64) -> Result<(), i16> {
        let wait = {
            let mut inner = self.lock();
            inner.open.entry((topic.to_owned(), partition)).or_default().entry(pid).or_insert(offset);
            let records = inner.txns.first_offset(id, topic, partition, offset);
            self.queue(txn_log(&records))
        };
        Self::durable(wait).await
    }

    /// The last stable offset of a partition whose high watermark is `hw`, and the aborted
    /// transactions overlapping `[from, lso)`.
    pub fn read_committed(&self, topic: &str, partition: i32, from: i64, hw: i64) -> (i64, Vec<Aborted>) {
        let inner = self.lock();
        let key = (topic.to_owned(), partition);
        let lso = inner.open.get(&key).and_then(|o| o.values().min().copied()).unwrap_or(hw).min(hw);
        let aborted = inner
            .aborted
            .get(&key)
            .map(|v| v.iter().filter(|a| a.last >= from && a.first < lso).copied().collect())
            .unwrap_or_default();
        (lso, aborted)
    }

    /// Ends a transaction: markers in every partition, staged offsets to their groups on
    /// commit, then the completion recorded. Errors are Kafka codes.
    pub async fn finish(&self, kafka: &Kafka, e: &Ending) -> Result<(), i16> {
        for ((topic, partition), first) in &e.partitions {
            let m = marker(topic, *partition, e);
            let ack = kafka
                .appender
                .submit(vec![m], Assign::Given, true)
                .await
                .map_err(|err| crate::apis::storage_error(&err))?;
            let appended = ack.await.map_err(|err| crate::apis::storage_error(&err))?;
            if !e.commit {
                let last = crate::apis::offset_of(kafka, topic, *partition as u32, appended.positions[0]).await?;
                let first = match first {
                    Some(f) => Some(*f),
                    None => {
                        let (s, t, p, pid) = (kafka.storage().clone(), topic.clone(), *partition as u32, e.producer_id);
                        tokio::task::spawn_blocking(move || first_of(&s, pid, &t, p, last)).await.ok().flatten()
                    }
                };
                if let Some(first) = first {
                    let range = Aborted { producer_id: e.producer_id, first, last };
                    let rec = AbortedRecord { topic: topic.clone(), partition: *partition, range };
                    let value = serde_json::to_vec(&rec).expect("invariant: plain data serializes");
                    let wait = {
                        let mut inner = self.lock();
                        inner.aborted.entry((topic.clone(), *partition)).or_default().push(range);
                        self.queue(vec![internal_record(ABORTED_STREAM, topic, value)])
                    };
                    Self::durable(wait).await?;
                }
            }
            if let Some(open) = self.lock().open.get_mut(&(topic.clone(), *partition)) {
                open.remove(&e.producer_id);
            }
        }
        if e.commit && !e.offsets.is_empty() {
            crate::apis::apply_transaction_offsets(kafka, &e.offsets).await?;
        }
        let wait = {
            let mut inner = self.lock();
            let records = inner.txns.completed(e);
            self.queue(txn_log(&records))
        };
        Self::durable(wait).await
    }

    /// Transactions a restart left open or half-ended, to finish before clients are served.
    pub fn unfinished(&self) -> Vec<Ending> {
        self.lock().txns.unfinished()
    }

    /// Open transactions past their timeout, aborted now (their records made durable first).
    pub async fn expired(&self) -> Vec<Ending> {
        let (endings, wait) = {
            let mut inner = self.lock();
            let (records, endings) = inner.txns.expire(Timestamp::now().get());
            (endings, self.queue(txn_log(&records)))
        };
        match Self::durable(wait).await {
            Ok(()) => endings,
            Err(_) => Vec::new(),
        }
    }

    /// Writes full dumps of `__silt_txn` and `__silt_txn_aborted` with their checkpoint
    /// markers, so retention may delete what came before. Returns once they are durable.
    pub async fn dump(&self) -> silt_storage::Result<()> {
        let (tx, rx) = oneshot::channel();
        {
            let inner = self.lock();
            let job = Job::Dump { txns: txn_log(&inner.txns.dump()), aborted: inner.aborted.clone(), done: tx };
            if self.persist.send(job).is_err() {
                return Err(silt_storage::Error::Closed);
            }
        }
        rx.await.unwrap_or(Err(silt_storage::Error::Closed))
    }
}

/// A producer's epoch and last batches in a partition, from its last `LOOK_BACK` records. The
/// records of one produced batch were appended as one log batch, so they sit back to back in
/// the log: a gap between two records of the producer starts another batch.
fn look_back(storage: &Storage, pid: i64, topic: &str, partition: u32) -> Option<(i16, Vec<Written>)> {
    let name = QueueName::Partition { stream: topic.to_owned(), partition: Partition(partition) };
    let id = storage.queue_id(&name).ok()??;
    let (start, end) = storage.queue_bounds(id).ok()?;
    let mut at = Offset(end.get().saturating_sub(LOOK_BACK).max(start.get()));
    let mut batches: Vec<Written> = Vec::new();
    let mut epoch: Option<i16> = None;
    // Where the producer's previous record ended in the log.
    let mut next_pos = None;
    while at < end {
        let entries = storage.read_index(id, at, 256).ok()?;
        let Some((last, _)) = entries.last() else { break };
        at = last.next();
        for (o, entry) in entries {
            let Ok(r) = storage.read_record(&entry) else { continue };
            let Some(p) = r.producer.filter(|p| p.id == pid && p.sequence >= 0) else {
                next_pos = None;
                continue;
            };
            if epoch.is_some_and(|e| p.epoch > e) {
                batches.clear();
            }
            epoch = Some(epoch.map_or(p.epoch, |e| e.max(p.epoch)));
            let adjacent = next_pos == Some(entry.position.get());
            match batches.last_mut() {
                Some(w) if adjacent => w.last = p.sequence,
                _ => batches.push(Written { first: p.sequence, last: p.sequence, offset: o.get() }),
            }
            next_pos = Some(entry.position.get() + u64::from(entry.size));
        }
    }
    epoch.map(|e| (e, batches))
}

/// The first offset of producer `pid`'s records in a partition below `before` (its abort
/// marker), looking back from it: a transaction whose first offset was never recorded.
fn first_of(storage: &Storage, pid: i64, topic: &str, partition: u32, before: i64) -> Option<i64> {
    let name = QueueName::Partition { stream: topic.to_owned(), partition: Partition(partition) };
    let id = storage.queue_id(&name).ok()??;
    let (start, _) = storage.queue_bounds(id).ok()?;
    let from = Offset((before as u64).saturating_sub(LOOK_BACK).max(start.get()));
    let records = storage.read_queue(id, from, (before as u64 - from.get()) as usize).ok()?;
    records
        .iter()
        .find(|(_, r)| r.producer.is_some_and(|p| p.id == pid) && r.attrs & attrs::KAFKA_CONTROL == 0)
        .map(|(o, _)| o.get() as i64)
}
