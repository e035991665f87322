//! The node's side of `silt export` (the admin API's `Export`): the MQTT topic queues matching
//! a filter, each read from the first record at or after `since` to the first at or after
//! `until`, streamed as batches.
//!
//! Order: topic by topic, in topic (byte) order; within a topic, in queue-offset order, which
//! is publish order. Records of different topics are not interleaved by time.
//!
//! All reads (the queue registry, seeks by time, records; a cold read of a segment no longer on
//! local disk goes to the object store) run on one blocking-pool thread, which hands batches to
//! the response through a bounded channel: a slow client pauses the reader, memory stays at a
//! few batches. A client that goes away stops the reader at its next batch.
//!
//! Not guaranteed: a snapshot. Records published while an export runs are included when they
//! are before `until` and their topic existed at the start; a topic created later is not.
//! Records a tier keeps off the object store (`tier = "local"`, restored) or that expired
//! (`tier = "memory"` from an earlier process) are skipped: the plan's count is an upper bound.

use std::pin::Pin;
use std::sync::Arc;

use silt_storage::{ErrorKind, Storage};
use silt_types::{Offset, QueueId, Timestamp, TopicFilter, filter_matches};
use tokio::sync::mpsc;
use tonic::Status;
use tonic::codegen::tokio_stream::Stream;

use crate::grpc::pb;

/// Records per batch when the caller asks for none.
pub const DEFAULT_BATCH: u32 = 500;
/// The most records per batch a caller can ask for (a batch is one gRPC message).
pub const MAX_BATCH: u32 = 10_000;
/// Payload bytes after which a batch is sent even if it has fewer records (gRPC's default
/// message limit is 4 MiB on the client).
pub const BATCH_BYTES: usize = 1 << 20;
/// The most topics one export may match; a wider filter is refused, naming the count.
pub const MAX_TOPICS: usize = 100_000;
/// Batches in flight between the reader and the response.
const CHANNEL: usize = 4;

pub type ExportStream = Pin<Box<dyn Stream<Item = Result<pb::ExportChunk, Status>> + Send>>;

/// The validated request.
#[derive(Debug)]
pub struct Plan {
    pub filter: TopicFilter,
    pub since: Timestamp,
    pub until: Timestamp,
    pub batch: usize,
}

impl Plan {
    /// Checks a request; `now` stands in for `until_ms = 0`.
    pub fn new(r: &pb::ExportRequest, now: Timestamp) -> Result<Plan, Status> {
        let filter = TopicFilter::new(r.filter.clone()).map_err(|e| {
            Status::invalid_argument(format!("filter {:?} is not a valid MQTT topic filter: {e}", r.filter))
        })?;
        if r.since_ms < 0 {
            return Err(Status::invalid_argument(format!("since_ms must be >= 0, not {}", r.since_ms)));
        }
        let until = if r.until_ms == 0 { now } else { Timestamp(r.until_ms) };
        if until.get() < r.since_ms {
            return Err(Status::invalid_argument(format!("until ({}) is before since ({})", until.get(), r.since_ms)));
        }
        let batch = match r.batch_records {
            0 => DEFAULT_BATCH,
            n => n.min(MAX_BATCH),
        } as usize;
        Ok(Plan { filter, since: Timestamp(r.since_ms), until, batch })
    }
}

/// The topics of `all` (as the registry lists them) that `filter` matches, refused beyond
/// `max`.
pub fn matching<T: Clone>(filter: &TopicFilter, all: &[(String, T)], max: usize) -> Result<Vec<(String, T)>, Status> {
    let out: Vec<(String, T)> = all.iter().filter(|(t, _)| filter_matches(filter.as_str(), t)).cloned().collect();
    if out.len() > max {
        return Err(Status::invalid_argument(format!(
            "filter {:?} matches {} topics, more than the {max} one export may read; narrow it",
            filter.as_str(),
            out.len()
        )));
    }
    Ok(out)
}

fn storage_status(e: silt_storage::Error) -> Status {
    match e {
        silt_storage::Error::Closed => Status::unavailable("the node is stopping"),
        e => Status::internal(e.to_string()),
    }
}

/// A topic's offsets `[first, end)` in the plan's time range.
fn range(storage: &Storage, id: QueueId, plan: &Plan) -> silt_storage::Result<(Offset, Offset)> {
    let (first, next) = storage.queue_bounds(id)?;
    let from = storage.offset_for_time(id, first, plan.since)?.unwrap_or(next);
    let end = storage.offset_for_time(id, from, plan.until)?.unwrap_or(next);
    Ok((from, end))
}

/// Starts the reader; the stream is its output.
pub fn start(storage: Arc<Storage>, plan: Plan) -> ExportStream {
    let (tx, rx) = mpsc::channel(CHANNEL);
    tokio::task::spawn_blocking(move || {
        if let Err(status) = read(&storage, &plan, &tx) {
            let _ = tx.blocking_send(Err(status));
        }
    });
    Box::pin(Chunks(rx))
}

/// Sends the plan, then the batches. `Ok` also when the client went away.
fn read(storage: &Storage, plan: &Plan, tx: &mpsc::Sender<Result<pb::ExportChunk, Status>>) -> Result<(), Status> {
    let topics = matching(&plan.filter, &storage.topics().map_err(storage_status)?, MAX_TOPICS)?;
    let mut ranges = Vec::with_capacity(topics.len());
    for (topic, id) in topics {
        let (from, end) = range(storage, id, plan).map_err(storage_status)?;
        ranges.push((topic, id, from, end));
    }
    let records = ranges.iter().map(|(_, _, from, end)| end.get().saturating_sub(from.get())).sum();
    let head = pb::ExportPlan {
        topics: ranges.iter().map(|(t, ..)| t.clone()).collect(),
        records,
        until_ms: plan.until.get(),
    };
    if tx.blocking_send(Ok(chunk(pb::export_chunk::Part::Plan(head)))).is_err() {
        return Ok(());
    }
    let mut batch = Vec::new();
    let mut bytes = 0usize;
    for (topic, id, from, end) in ranges {
        let mut at = from;
        while at < end {
            let want = plan.batch.min(usize::try_from(end.get() - at.get()).unwrap_or(usize::MAX));
            let entries = storage.read_index(id, at, want).map_err(storage_status)?;
            let Some((last, _)) = entries.last() else { break };
            at = last.next();
            for (offset, entry) in entries {
                if offset >= end {
                    break;
                }
                let r = match storage.read_record(&entry) {
                    Ok(r) => r,
                    Err(e) if e.kind() == ErrorKind::Expired => continue,
                    Err(e) => return Err(storage_status(e)),
                };
                bytes += r.value.len();
                batch.push(pb::ExportRecord {
                    topic: topic.clone(),
                    offset: offset.get(),
                    timestamp_ms: r.timestamp.get(),
                    payload: r.value.to_vec(),
                    attrs: u32::from(r.attrs),
                    key: r.key.map(|k| k.to_vec()),
                    headers: r
                        .headers
                        .into_iter()
                        .map(|(name, v)| pb::Header { name, value: v.map(|v| v.to_vec()) })
                        .collect(),
                    stream: r.stream,
                    partition: r.partition.get(),
                });
                if batch.len() >= plan.batch || bytes >= BATCH_BYTES {
                    let records = std::mem::take(&mut batch);
                    bytes = 0;
                    if tx.blocking_send(Ok(chunk(pb::export_chunk::Part::Batch(pb::ExportBatch { records })))).is_err()
                    {
                        return Ok(());
                    }
                }
            }
        }
    }
    if !batch.is_empty() {
        let _ = tx.blocking_send(Ok(chunk(pb::export_chunk::Part::Batch(pb::ExportBatch { records: batch }))));
    }
    Ok(())
}

fn chunk(part: pb::export_chunk::Part) -> pb::ExportChunk {
    pb::ExportChunk { part: Some(part) }
}

/// The receiving end as a `Stream`.
struct Chunks(mpsc::Receiver<Result<pb::ExportChunk, Status>>);

impl Stream for Chunks {
    type Item = Result<pb::ExportChunk, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(names: &[&str]) -> Vec<(String, u32)> {
        names.iter().map(|n| ((*n).to_owned(), 0)).collect()
    }

    fn names(v: Vec<(String, u32)>) -> Vec<String> {
        v.into_iter().map(|(t, _)| t).collect()
    }

    #[test]
    fn a_filter_selects_matching_topics_and_dollar_topics_only_explicitly() {
        let all = topics(&["$SYS/broker/load", "a/1/t", "a/2/t", "a/2/u", "a/t", "b/1/t"]);
        let f = |s: &str| TopicFilter::new(s).unwrap();
        assert_eq!(names(matching(&f("a/+/t"), &all, 10).unwrap()), ["a/1/t", "a/2/t"]);
        assert_eq!(names(matching(&f("#"), &all, 10).unwrap()), ["a/1/t", "a/2/t", "a/2/u", "a/t", "b/1/t"]);
        assert_eq!(names(matching(&f("+/broker/#"), &all, 10).unwrap()), Vec::<String>::new());
        assert_eq!(names(matching(&f("$SYS/#"), &all, 10).unwrap()), ["$SYS/broker/load"]);
    }

    #[test]
    fn a_filter_matching_too_many_topics_is_refused() {
        let all = topics(&["a/1", "a/2", "a/3"]);
        let e = matching(&TopicFilter::new("a/#").unwrap(), &all, 2).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("matches 3 topics"), "{}", e.message());
    }

    #[test]
    fn a_bad_filter_or_range_is_invalid_argument() {
        let req = |filter: &str, since_ms, until_ms| pb::ExportRequest {
            filter: filter.to_owned(),
            since_ms,
            until_ms,
            batch_records: 0,
        };
        let e = Plan::new(&req("a/#/b", 0, 0), Timestamp(10)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("\"a/#/b\""), "{}", e.message());
        assert_eq!(Plan::new(&req("a", 20, 10), Timestamp(10)).unwrap_err().code(), tonic::Code::InvalidArgument);
        let p = Plan::new(&req("a", 5, 0), Timestamp(10)).unwrap();
        assert_eq!((p.since, p.until, p.batch), (Timestamp(5), Timestamp(10), DEFAULT_BATCH as usize));
        let big = pb::ExportRequest { batch_records: u32::MAX, ..req("a", 0, 0) };
        assert_eq!(Plan::new(&big, Timestamp(1)).unwrap().batch, MAX_BATCH as usize);
    }
}
