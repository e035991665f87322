//! The one append path of every protocol: an MQTT publish and a Kafka produce reach the
//! commitlog through [`Appender::submit`], which applies what the records' topics ask for
//! before and after the write:
//!
//! - the stream of each record is registered (partitions fixed at creation) in the same batch,
//!   and records that follow the routing rule get their partition from their key;
//! - `tier = "memory"` topics' records (and `$SYS` figures, which tiering always puts there)
//!   are volatile (acknowledged without an fsync);
//! - a retained record (`attrs::RETAIN`) is followed in the batch by its pointer (volatile
//!   when the record is), and the retained index points at it once the batch is durable;
//! - when the caller waits for an acknowledgement and a record's topic has
//!   `ack = "object"`, the acknowledgement also waits until the object store holds the batch.
//!
//! Guarantees: the returned future resolves `Ok` only once the whole batch is durable under
//! the log's fsync policy (and in the bucket when the policy says so). Batches submitted one
//! after another by one task are written in that order. Not guaranteed: anything about
//! indexing — a consumer sees the records once the dispatcher has indexed them.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use silt_storage::{Appended, IndexEntry, Record, Storage};
use silt_types::{LogPosition, Partition, Timestamp};

use crate::attrs;
use crate::internal;
use crate::murmur2::partition_for_key;
use crate::rule;
use crate::streams::{STREAMS_STREAM, Streams};

/// Resolves once a submitted batch is acknowledged (see [`Appender::submit`]).
pub type AckFuture = Pin<Box<dyn Future<Output = silt_storage::Result<Appended>> + Send>>;

/// What tiering decides for a topic's records (one policy lookup per record).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierDecision {
    /// `tier = "memory"`: volatile, acknowledged without an fsync, gone after a restart.
    pub memory: bool,
    /// `ack = "object"`: acknowledged once the object store holds the data.
    pub object_ack: bool,
}

/// Tiering's per-topic decisions.
pub trait TopicTiers: Send + Sync + 'static {
    fn decide(&self, topic: &str) -> TierDecision;
    /// Resolves once the log up to `end` is in the object store.
    fn wait(&self, end: LogPosition) -> Pin<Box<dyn Future<Output = silt_storage::Result<()>> + Send>>;
}

/// The retained-message index (the MQTT broker's): what a retained record's pointer is, and
/// where the index should point once it is durable.
pub trait RetainedIndex: Send + Sync + 'static {
    /// The pointer record that follows `message` in its batch.
    fn pointer(&self, message: &Record, now: Timestamp) -> Record;
    /// Points `topic` at `entry` (`None`: clears it).
    fn set(&self, topic: &str, entry: Option<IndexEntry>);
    /// A batch with retained messages is about to be handed to the log; their [`Self::set`]s
    /// follow its acknowledgement, then [`Self::end`] with what this returned (also when the
    /// append fails or its acknowledgement is dropped). A new subscription's lookup can wait
    /// for every batch begun before it, whose messages it may not get live.
    fn begin(&self) -> u64;
    fn end(&self, ticket: u64);
}

/// Ends a [`RetainedIndex::begin`] when dropped: after the batch's `set`s, or when it failed.
struct RetainedTicket(Arc<dyn RetainedIndex>, u64);

impl Drop for RetainedTicket {
    fn drop(&mut self) {
        self.0.end(self.1);
    }
}

/// The partitions a new stream gets (the policy's `partitions`).
pub type DefaultPartitions = Box<dyn Fn(&str) -> u32 + Send + Sync>;

/// How the records of a submission get their partitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assign {
    /// By key, with Kafka's default partitioner (MQTT publishes: the key is the topic).
    ByKey,
    /// As given (a Kafka producer chose them; the caller checked them against the stream).
    Given,
}

pub struct Appender {
    storage: Arc<Storage>,
    streams: Arc<Streams>,
    default_partitions: DefaultPartitions,
    tiers: OnceLock<Arc<dyn TopicTiers>>,
    retained: OnceLock<Arc<dyn RetainedIndex>>,
}

impl Appender {
    pub fn new(storage: Arc<Storage>, streams: Arc<Streams>, default_partitions: DefaultPartitions) -> Self {
        Self { storage, streams, default_partitions, tiers: OnceLock::new(), retained: OnceLock::new() }
    }

    /// Loads the stream registry from `storage` (blocking: call it before a runtime serves
    /// clients), compacting `__silt_streams` when its replay was much longer than what lives.
    pub fn open(storage: Arc<Storage>, default_partitions: DefaultPartitions) -> silt_storage::Result<Self> {
        storage.wait_dispatched_blocking(storage.stats().log_end)?;
        let (streams, replayed) = Streams::load(&storage)?;
        if internal::worth_compacting(replayed, streams.len()) {
            let start = crate::streams::end(&storage)?;
            for chunk in streams.dump().chunks(1000) {
                storage.append_blocking(chunk)?;
            }
            storage.append_blocking(&[internal::checkpoint_record(STREAMS_STREAM, start)])?;
            tracing::info!(replayed, live = streams.len(), "stream registrations compacted");
        }
        Ok(Self::new(storage, Arc::new(streams), default_partitions))
    }

    /// Writes a full dump of the stream registry and marks it, so the internal floor can move
    /// past older registrations (retention asks for it).
    pub async fn dump_streams(&self) -> silt_storage::Result<()> {
        let start = crate::streams::end(&self.storage)?;
        for chunk in self.streams.dump().chunks(1000) {
            self.storage.append(chunk).await?;
        }
        self.storage.append(&[internal::checkpoint_record(STREAMS_STREAM, start)]).await.map(|_| ())
    }

    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    pub fn streams(&self) -> &Arc<Streams> {
        &self.streams
    }

    /// Applies tiering's decisions from now on.
    pub fn set_tiers(&self, tiers: Arc<dyn TopicTiers>) {
        let _ = self.tiers.set(tiers);
    }

    /// What tiering decides for `topic` (the default, durable and acknowledged locally, until
    /// tiering is set): callers that gather records into one batch keep to one decision per
    /// batch, since a batch is acknowledged as a whole.
    pub fn decide(&self, topic: &str) -> TierDecision {
        self.tiers.get().map(|t| t.decide(topic)).unwrap_or_default()
    }

    /// Keeps the retained index of retained records from now on.
    pub fn set_retained(&self, retained: Arc<dyn RetainedIndex>) {
        let _ = self.retained.set(retained);
    }

    /// The partitions a stream has, or would get if a record for it came now.
    pub fn partitions_of(&self, stream: &str) -> u32 {
        self.streams.get(stream).map_or_else(|| (self.default_partitions)(stream).max(1), |m| m.partitions)
    }

    /// Creates `stream` with `partitions` (the policy's when `None`) and waits until its
    /// registration is durable. `Err(meta)`: it exists already, with `meta`.
    pub async fn create_stream(
        &self,
        stream: &str,
        partitions: Option<u32>,
    ) -> silt_storage::Result<Result<crate::StreamMeta, crate::StreamMeta>> {
        let n = partitions.unwrap_or_else(|| (self.default_partitions)(stream));
        let record = match self.streams.create(stream, n) {
            Ok(r) => r,
            Err(existing) => return Ok(Err(existing)),
        };
        match self.storage.append(std::slice::from_ref(&record)).await {
            Ok(_) => {
                self.streams.confirm(stream);
                Ok(Ok(self.streams.get(stream).expect("invariant: just created")))
            }
            Err(e) => {
                self.streams.forget(stream);
                Err(e)
            }
        }
    }

    /// Deletes `stream`: its registration, and its partitions' queues (the records stay in
    /// the log, and its MQTT topics' queues keep them). A later record creates it anew.
    /// Returns whether it existed.
    pub async fn delete_stream(&self, stream: &str) -> silt_storage::Result<bool> {
        let Some(meta) = self.streams.get(stream) else { return Ok(false) };
        let Some(tombstone) = self.streams.forget(stream) else { return Ok(false) };
        self.storage.append(std::slice::from_ref(&tombstone)).await?;
        for p in 0..meta.partitions {
            let name = silt_storage::QueueName::Partition { stream: stream.to_owned(), partition: Partition(p) };
            self.storage.drop_partition(&name).await?;
        }
        Ok(true)
    }

    /// Hands `records` to the log as one batch (see the module docs) and returns a future
    /// that resolves when it is acknowledged, with the positions of `records` (in order; the
    /// registrations and pointers added to the batch are left out). `acked`: the caller waits for the
    /// acknowledgement (QoS 1/2, acks ≥ 1), so `ack = "object"` applies.
    pub async fn submit(&self, records: Vec<Record>, assign: Assign, acked: bool) -> silt_storage::Result<AckFuture> {
        self.submit_as(records, assign, acked, None).await
    }

    /// [`Self::submit`] of records the caller has taken one tiering decision for (with
    /// [`Self::decide`]), so it is not taken again for each record.
    pub async fn submit_decided(
        &self,
        records: Vec<Record>,
        assign: Assign,
        acked: bool,
        decision: TierDecision,
    ) -> silt_storage::Result<AckFuture> {
        self.submit_as(records, assign, acked, Some(decision)).await
    }

    async fn submit_as(
        &self,
        records: Vec<Record>,
        assign: Assign,
        acked: bool,
        decided: Option<TierDecision>,
    ) -> silt_storage::Result<AckFuture> {
        let tiers = self.tiers.get();
        let retained = self.retained.get();
        let now = Timestamp::now();
        let mut batch = Vec::with_capacity(records.len() + 1);
        let mut registered: Vec<String> = Vec::new();
        // (topic, index of the message in `batch`, its size, whether it clears)
        let mut pointers: Vec<(String, usize, u32, bool)> = Vec::new();
        let mut object_ack = false;
        // Where the caller's own records sit in `batch` (registrations and pointers are ours).
        let mut theirs = Vec::with_capacity(records.len());
        for mut r in records {
            if !r.stream.is_empty() && !rule::is_internal(&r.stream) {
                let (meta, registration) = self.streams.ensure(&r.stream, (self.default_partitions)(&r.stream));
                if let Some(reg) = registration
                    && !registered.contains(&r.stream)
                {
                    registered.push(r.stream.clone());
                    batch.push(reg);
                }
                if assign == Assign::ByKey {
                    let key = r.key.as_deref().unwrap_or(r.topic.as_bytes());
                    r.partition = Partition(partition_for_key(key, meta.partitions));
                }
            }
            let decision = decided.unwrap_or_else(|| {
                let topic = if r.topic.is_empty() { r.stream.as_str() } else { r.topic.as_str() };
                tiers.map(|t| t.decide(topic)).unwrap_or_default()
            });
            r.volatile |= decision.memory;
            object_ack |= decision.object_ack;
            let retain = r.attrs & attrs::RETAIN != 0 && !r.topic.is_empty();
            theirs.push(batch.len());
            match retained.filter(|_| retain) {
                Some(index) => {
                    // A volatile message's pointer is volatile too: it means nothing once the
                    // message is gone, and a durable one would make the batch wait for an fsync.
                    let pointer = Record { volatile: r.volatile, ..index.pointer(&r, now) };
                    pointers.push((r.topic.clone(), batch.len(), r.encoded_len() as u32, r.value.is_empty()));
                    batch.push(r);
                    batch.push(pointer);
                }
                None => batch.push(r),
            }
        }
        let ticket = retained.filter(|_| !pointers.is_empty()).map(|r| RetainedTicket(r.clone(), r.begin()));
        let ack = self.storage.submit(&batch).await?;
        let timestamps: Vec<Timestamp> = pointers.iter().map(|(_, i, _, _)| batch[*i].timestamp).collect();
        let streams = self.streams.clone();
        let retained = retained.cloned();
        let gate = tiers.filter(|_| acked && object_ack).cloned();
        Ok(Box::pin(async move {
            let appended = ack.await?;
            for s in registered {
                streams.confirm(&s);
            }
            if let Some(index) = retained {
                for ((topic, at, size, clear), timestamp) in pointers.into_iter().zip(timestamps) {
                    let entry = (!clear).then(|| IndexEntry { position: appended.positions[at], size, timestamp });
                    index.set(&topic, entry);
                }
            }
            drop(ticket);
            if let Some(gate) = gate {
                gate.wait(appended.end).await?;
            }
            let positions = theirs.into_iter().map(|i| appended.positions[i]).collect();
            Ok(Appended { positions, end: appended.end })
        }))
    }
}
