//! Fetch: a partition's records from its consume queue, from the tail cache, the disk or the
//! object store (the storage engine's read path, run off the runtime's threads), in batches
//! with their offsets; a long poll woken by dispatch until `min_bytes` are there or
//! `max_wait_ms` passes.
//!
//! Offsets are the queue's: dense, starting at the log start offset (retention moves it;
//! OFFSET_OUT_OF_RANGE below it or above the high watermark). Records that are gone
//! (withheld, quarantined, volatile from before a restart) are skipped: the consumer sees a
//! gap in the offsets, as after compaction. At least one record is returned when there is one,
//! however large (KIP-74), so a consumer never gets stuck behind a big record.
//!
//! ACLs: a record is returned only if the client may read its MQTT topic, as an MQTT
//! subscriber would receive it; records left out (and records that are gone) are covered by
//! the batch around them or an empty batch, so the consumer moves past them. A topic it may
//! read none of is TOPIC_AUTHORIZATION_FAILED. The records looked at per partition and fetch
//! are bounded (`MAX_SKIPPED_BYTES`), however few are readable.
//!
//! Fetch sessions (KIP-227) are not kept: every response has session id 0, which tells the
//! client to send full fetch requests.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use silt_dataset::Streams;
use silt_kafka::kafka_protocol::ResponseError;
use silt_kafka::kafka_protocol::messages::fetch_request::FetchPartition;
use silt_kafka::kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
use silt_kafka::kafka_protocol::messages::{FetchRequest, FetchResponse, ProducerId, TopicName};
use silt_storage::{ErrorKind, QueueName, Storage};
use silt_types::{Offset, Partition, QueueId};
use tokio::time::Instant;

use silt_auth::{Access, Reach};
use silt_dataset::rule;

use super::{Ctx, storage_error};
use crate::batch::{self, BatchMeta, OutRecord};
use crate::node::Kafka;
use crate::records;
use crate::txns::Transactions;

/// Index entries read per step.
const STEP: usize = 256;
/// Bytes of records left out (not readable, or gone) looked at per partition and fetch at most.
const MAX_SKIPPED_BYTES: usize = 4 << 20;

/// Whose read access each record's MQTT topic is checked against.
pub struct ReadAcl {
    auth: Arc<silt_auth::Auth>,
    user: Option<String>,
    client_id: String,
}

impl ReadAcl {
    fn reach(&self, topic: &str) -> Reach {
        self.auth.reach(self.user.as_deref(), &self.client_id, Access::Read, topic)
    }

    fn allows(&self, r: &silt_storage::Record) -> bool {
        let topic: std::borrow::Cow<'_, str> = if r.topic.is_empty() {
            // A transactional record keeps no MQTT topic; its key still names one.
            rule::mqtt_topic_for(&r.stream, r.key.as_deref()).into()
        } else {
            r.topic.as_str().into()
        };
        self.auth.allows_topic(self.user.as_deref(), &self.client_id, Access::Read, &topic)
    }
}

pub async fn fetch(kafka: &Kafka, ctx: &Ctx, req: FetchRequest, _version: i16) -> FetchResponse {
    let acl = kafka.auth.has_acl().then(|| {
        Arc::new(ReadAcl { auth: kafka.auth.clone(), user: ctx.user.clone(), client_id: ctx.client_id.clone() })
    });
    let wait = Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0).min(kafka.config.max_fetch_wait_ms));
    let deadline = Instant::now() + wait;
    let min_bytes = usize::try_from(req.min_bytes).unwrap_or(0);
    let max_bytes = usize::try_from(req.max_bytes).unwrap_or(usize::MAX).max(1);
    let wanted: Arc<Vec<(TopicName, Vec<FetchPartition>)>> =
        Arc::new(req.topics.into_iter().map(|t| (t.topic, t.partitions)).collect());
    let committed = (req.isolation_level == 1).then(|| kafka.txns.clone());
    loop {
        let before = kafka.storage().dispatched();
        let (storage, streams, w) = (kafka.storage().clone(), kafka.appender.streams().clone(), wanted.clone());
        let (c, a) = (committed.clone(), acl.clone());
        let read = tokio::task::spawn_blocking(move || {
            read_all(&storage, &streams, &w, max_bytes, c.as_deref(), a.as_deref())
        })
        .await;
        let (topics, sent, queues, missing) = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "fetch read task failed");
                return FetchResponse::default().with_error_code(ResponseError::UnknownServerError.code());
            }
        };
        let now = Instant::now();
        if sent.bytes >= min_bytes.max(1) || now >= deadline || topics_have_errors(&topics) {
            kafka.stats.bytes_sent.fetch_add(sent.bytes as u64, std::sync::atomic::Ordering::Relaxed);
            kafka.stats.records_sent.fetch_add(sent.records, std::sync::atomic::Ordering::Relaxed);
            return FetchResponse::default().with_responses(topics);
        }
        // Not enough yet: sleep until the dispatcher indexes into one of these queues. The
        // waits are registered before the dispatched position is looked at again, so an
        // entry indexed in between is not missed.
        let notifies: Vec<_> = queues.iter().map(|q| kafka.wakers.queue(*q)).collect();
        let mut waits: Vec<_> = notifies.iter().map(|n| Box::pin(n.notified())).collect();
        let mut any = Box::pin(kafka.wakers.any().notified());
        for w in &mut waits {
            w.as_mut().enable();
        }
        any.as_mut().enable();
        if kafka.storage().dispatched() != before {
            continue; // something was indexed since the read: read again
        }
        let woken = async {
            if missing || waits.is_empty() {
                any.await;
            } else {
                futures_select(waits).await;
            }
        };
        if tokio::time::timeout_at(deadline, woken).await.is_err() {
            // One last read at the deadline: what arrived meanwhile is answered now.
            continue;
        }
    }
}

/// Resolves when the first of `waits` does.
async fn futures_select<F: std::future::Future<Output = ()> + Unpin>(mut waits: Vec<F>) {
    std::future::poll_fn(|cx| {
        for w in waits.iter_mut() {
            if std::pin::Pin::new(w).poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await
}

fn topics_have_errors(topics: &[FetchableTopicResponse]) -> bool {
    topics.iter().any(|t| t.partitions.iter().any(|p| p.error_code != 0))
}

/// Reads every partition asked for (blocking: RocksDB and the log). Returns the topics, the
/// record bytes in them, the queues read, and whether a partition has no queue yet.
fn read_all(
    storage: &Storage,
    streams: &Streams,
    wanted: &[(TopicName, Vec<FetchPartition>)],
    max_bytes: usize,
    committed: Option<&Transactions>,
    acl: Option<&ReadAcl>,
) -> (Vec<FetchableTopicResponse>, Totals, Vec<QueueId>, bool) {
    let mut sum = Totals::default();
    let mut total = 0usize;
    let mut queues = Vec::new();
    let mut missing = false;
    let mut out = Vec::with_capacity(wanted.len());
    for (name, parts) in wanted {
        let mut t = FetchableTopicResponse::default().with_topic(name.clone());
        let reach = acl.map_or(Reach::All, |a| a.reach(name.as_str()));
        for p in parts {
            if reach == Reach::None {
                let denied = PartitionData::default()
                    .with_partition_index(p.partition)
                    .with_error_code(ResponseError::TopicAuthorizationFailed.code());
                t.partitions.push(denied);
                continue;
            }
            let check = if reach == Reach::Some { acl } else { None };
            let budget = usize::try_from(p.partition_max_bytes).unwrap_or(0).min(max_bytes.saturating_sub(total));
            // The first data of the response may exceed every limit (one record at least).
            let read = Read { budget, first: total == 0, committed, acl: check };
            let (data, n, queue) = read_partition(storage, streams, name.as_str(), p, read);
            total += n.bytes;
            sum.records += n.records;
            match queue {
                Some(q) => queues.push(q),
                None => missing = true,
            }
            t.partitions.push(data);
        }
        out.push(t);
    }
    sum.bytes = total;
    (out, sum, queues, missing)
}

/// What a read answers: the bytes of its record batches and the records in them.
#[derive(Clone, Copy, Default)]
struct Totals {
    bytes: usize,
    records: u64,
}

/// How one partition is read.
struct Read<'a> {
    /// Record bytes wanted at most.
    budget: usize,
    /// The response's first partition with data: one record at least, however large.
    first: bool,
    /// Read committed, with the transactions' state.
    committed: Option<&'a Transactions>,
    /// Check each record's MQTT topic (`None`: the client may read the whole topic).
    acl: Option<&'a ReadAcl>,
}

fn read_partition(
    storage: &Storage,
    streams: &Streams,
    topic: &str,
    p: &FetchPartition,
    read: Read<'_>,
) -> (PartitionData, Totals, Option<QueueId>) {
    let Read { budget, first, committed, acl } = read;
    let mut data = PartitionData::default().with_partition_index(p.partition);
    let fail = |mut d: PartitionData, code: i16| {
        d.error_code = code;
        (d, Totals::default(), None)
    };
    let Some(meta) = streams.get(topic) else {
        return fail(data, ResponseError::UnknownTopicOrPartition.code());
    };
    if p.partition < 0 || p.partition as u32 >= meta.partitions {
        return fail(data, ResponseError::UnknownTopicOrPartition.code());
    }
    let name = QueueName::Partition { stream: topic.to_owned(), partition: Partition(p.partition as u32) };
    let id = match storage.queue_id(&name) {
        Ok(Some(id)) => id,
        Ok(None) => {
            // Nothing was ever written: an empty partition at offset 0.
            data = data.with_high_watermark(0).with_last_stable_offset(0).with_log_start_offset(0);
            if p.fetch_offset != 0 {
                data.error_code = ResponseError::OffsetOutOfRange.code();
            }
            data.records = Some(Bytes::new());
            return (data, Totals::default(), None);
        }
        Err(e) => return fail(data, storage_error(&e)),
    };
    let (start, end) = match storage.queue_bounds(id) {
        Ok(b) => b,
        Err(e) => return fail(data, storage_error(&e)),
    };
    // Read committed: nothing at or past the oldest open transaction, and the aborted
    // transactions in range listed for the consumer to skip.
    let (lso, aborted) = match committed {
        Some(t) => t.read_committed(topic, p.partition, p.fetch_offset, end.get() as i64),
        None => (end.get() as i64, Vec::new()),
    };
    data = data
        .with_high_watermark(end.get() as i64)
        .with_last_stable_offset(lso)
        .with_log_start_offset(start.get() as i64);
    if committed.is_some() {
        data.aborted_transactions = Some(
            aborted
                .iter()
                .map(|a| {
                    AbortedTransaction::default().with_producer_id(ProducerId(a.producer_id)).with_first_offset(a.first)
                })
                .collect(),
        );
    }
    if p.fetch_offset < start.get() as i64 || p.fetch_offset > end.get() as i64 {
        data.error_code = ResponseError::OffsetOutOfRange.code();
        return (data, Totals::default(), Some(id));
    }
    let end = Offset(lso.max(0) as u64);
    let mut out = BytesMut::new();
    let mut group: Vec<OutRecord> = Vec::new();
    let mut group_meta = BatchMeta::default();
    let mut at = Offset(p.fetch_offset as u64);
    let mut bytes = 0usize;
    let mut records = 0u64;
    // Offsets looked at: the first, and the last (included or left out).
    let mut scanned: Option<(i64, i64)> = None;
    let mut skipped_bytes = 0usize;
    'read: while at < end {
        let entries = match storage.read_index(id, at, STEP) {
            Ok(e) => e,
            Err(e) => return fail(data, storage_error(&e)),
        };
        let Some((last, _)) = entries.last() else { break };
        at = last.next();
        for (offset, entry) in entries {
            if offset >= end {
                break 'read;
            }
            // Over the budget: stop, unless this is the response's very first record.
            if bytes + entry.size as usize > budget && (bytes > 0 || !first) {
                break 'read;
            }
            if skipped_bytes > MAX_SKIPPED_BYTES {
                break 'read; // covered so far; the consumer asks again from there
            }
            let o = offset.get() as i64;
            let record = match storage.read_record(&entry) {
                Ok(r) if acl.is_none_or(|a| a.allows(&r)) => r,
                Ok(_) => {
                    skipped_bytes += entry.size as usize;
                    scanned = Some((scanned.map_or(o, |s| s.0), o));
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::Expired => {
                    scanned = Some((scanned.map_or(o, |s| s.0), o));
                    continue;
                }
                Err(e) => {
                    if bytes > 0 {
                        break 'read; // answer what was read; the next fetch meets the error
                    }
                    return fail(data, storage_error(&e));
                }
            };
            scanned = Some((scanned.map_or(o, |s| s.0), o));
            bytes += entry.size as usize;
            records += 1;
            let (meta, rec) = records::fetched(offset.get(), record);
            if !group.is_empty() && !records::same_batch(&group_meta, &meta, group.len()) {
                batch::encode(&mut out, group_meta, &group);
                group.clear();
            }
            if group.is_empty() {
                group_meta = meta;
            }
            group.push(rec);
        }
    }
    // The last batch reaches over what was left out after it; with nothing readable at all,
    // an empty batch covers what was looked at.
    match (group.first(), scanned) {
        (Some(head), Some((_, last))) => batch::encode_range(&mut out, group_meta, head.offset, last, &group),
        (None, Some((first, last))) => batch::encode_range(&mut out, BatchMeta::default(), first, last, &[]),
        _ => {}
    }
    let n = Totals { bytes: out.len(), records };
    data.records = Some(out.freeze());
    (data, n, Some(id))
}
