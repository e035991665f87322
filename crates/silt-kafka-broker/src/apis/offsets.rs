//! ListOffsets: the earliest offset (-2: the log start, moved by retention), the latest (-1:
//! the high watermark; under READ_COMMITTED the last stable offset), the one with the largest timestamp (-3), or the first at or after a
//! time. Offsets are the partition queue's; a partition with nothing yet answers 0. A topic
//! the client may read none of is TOPIC_AUTHORIZATION_FAILED.

use silt_dataset::Streams;
use silt_kafka::kafka_protocol::ResponseError;
use silt_kafka::kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use silt_kafka::kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use silt_storage::{QueueName, Storage};
use silt_types::{Offset, Partition, Timestamp};

use super::{Ctx, storage_error};
use crate::node::Kafka;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;

pub async fn list_offsets(kafka: &Kafka, ctx: &Ctx, req: ListOffsetsRequest) -> ListOffsetsResponse {
    let (storage, streams) = (kafka.storage().clone(), kafka.appender.streams().clone());
    // isolation_level 1: what a read_committed consumer may read ends at the first open
    // transaction's first record.
    let txns = (req.isolation_level == 1).then(|| kafka.txns.clone());
    let readable: Vec<bool> = req
        .topics
        .iter()
        .map(|t| ctx.reach(kafka, silt_auth::Access::Read, t.name.as_str()) != silt_auth::Reach::None)
        .collect();
    let answered = tokio::task::spawn_blocking(move || {
        req.topics
            .into_iter()
            .zip(readable)
            .map(|(t, readable)| {
                let parts = t
                    .partitions
                    .iter()
                    .map(|p| match readable {
                        true => {
                            let mut r = one(&storage, &streams, t.name.as_str(), p.partition_index, p.timestamp);
                            if let Some(txns) = &txns
                                && p.timestamp == LATEST
                                && r.error_code == 0
                            {
                                r.offset =
                                    txns.read_committed(t.name.as_str(), p.partition_index, r.offset, r.offset).0;
                            }
                            r
                        }
                        false => ListOffsetsPartitionResponse::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(ResponseError::TopicAuthorizationFailed.code()),
                    })
                    .collect();
                ListOffsetsTopicResponse::default().with_name(t.name).with_partitions(parts)
            })
            .collect()
    })
    .await;
    match answered {
        Ok(topics) => ListOffsetsResponse::default().with_topics(topics),
        Err(e) => {
            tracing::error!(error = %e, "list offsets task failed");
            ListOffsetsResponse::default()
        }
    }
}

fn one(storage: &Storage, streams: &Streams, topic: &str, partition: i32, ts: i64) -> ListOffsetsPartitionResponse {
    let mut r = ListOffsetsPartitionResponse::default().with_partition_index(partition);
    let Some(meta) = streams.get(topic) else {
        return r.with_error_code(ResponseError::UnknownTopicOrPartition.code());
    };
    if partition < 0 || partition as u32 >= meta.partitions {
        return r.with_error_code(ResponseError::UnknownTopicOrPartition.code());
    }
    let name = QueueName::Partition { stream: topic.to_owned(), partition: Partition(partition as u32) };
    let found = (|| {
        let Some(id) = storage.queue_id(&name)? else {
            // Nothing written yet: every bound is 0, and no record is late enough.
            return Ok((if ts >= 0 { None } else { Some(0) }, -1));
        };
        let (start, end) = storage.queue_bounds(id)?;
        Ok::<_, silt_storage::Error>(match ts {
            LATEST => (Some(end.get()), -1),
            EARLIEST => (Some(start.get()), -1),
            MAX_TIMESTAMP => {
                // The last entry carries the partition's largest timestamp (a running maximum):
                // the record holding it is the first entry that reaches it.
                let last = end.get().checked_sub(1).filter(|last| *last >= start.get());
                let max = match last {
                    Some(last) => storage.read_index(id, Offset(last), 1)?.first().map(|(_, e)| e.timestamp),
                    None => None,
                };
                match (last, max) {
                    (Some(last), Some(max)) => {
                        let at = storage.offset_for_time(id, start, max)?.map_or(last, |o| o.get());
                        (Some(at), max.get())
                    }
                    _ => (Some(end.get()), -1),
                }
            }
            t if t >= 0 => match storage.offset_for_time(id, start, Timestamp(t))? {
                Some(o) => {
                    let ts = storage.read_index(id, o, 1)?.first().map_or(-1, |(_, e)| e.timestamp.get());
                    (Some(o.get()), ts)
                }
                None => (None, -1),
            },
            _ => return Err(silt_storage::Error::Invalid(format!("timestamp {ts}"))),
        })
    })();
    match found {
        Ok((Some(offset), timestamp)) => {
            r.offset = offset as i64;
            r.timestamp = timestamp;
            r
        }
        // No record that late: Kafka answers offset -1.
        Ok((None, _)) => r,
        Err(silt_storage::Error::Invalid(_)) => r.with_error_code(ResponseError::InvalidRequest.code()),
        Err(e) => r.with_error_code(storage_error(&e)),
    }
}
