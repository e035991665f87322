//! Produce: each partition's batches become one batch of log records, appended through the
//! shared path (the same as an MQTT publish: tiers, retained records, `ack = "object"`), and
//! answered with the offset the first record got.
//!
//! acks: 0 answers nothing; 1 and all (-1) answer once the batch is durable under the topic's
//! policy (on one node there is no replica to wait for, so "all" is the policy's durability:
//! `ack = "object"` means the bucket holds it). A batch not acknowledged within the request's
//! `timeout_ms` is answered REQUEST_TIMED_OUT (it may still be written, as in Kafka).

use std::time::Duration;

use silt_dataset::Assign;
use silt_kafka::kafka_protocol::ResponseError;
use silt_kafka::kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use silt_kafka::kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use silt_kafka::kafka_protocol::protocol::StrBytes;
use silt_storage::QueueName;
use silt_types::Partition;

use super::{Outcome, storage_error};
use crate::node::Kafka;
use crate::records::{self, ProduceError};

fn refused(index: i32, code: i16, message: Option<String>) -> PartitionProduceResponse {
    PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(code)
        .with_base_offset(-1)
        .with_error_message(message.map(StrBytes::from_string))
}

pub async fn produce(kafka: &Kafka, req: ProduceRequest) -> Outcome {
    if !(-1..=1).contains(&req.acks) {
        // Every partition of the request refused alike.
        let code = ResponseError::InvalidRequiredAcks.code();
        let responses = req
            .topic_data
            .into_iter()
            .map(|t| {
                let parts = t.partition_data.iter().map(|p| refused(p.index, code, None)).collect();
                TopicProduceResponse::default().with_name(t.name).with_partition_responses(parts)
            })
            .collect();
        return Outcome::Respond(Box::new(silt_kafka::kafka_protocol::messages::ResponseKind::Produce(
            ProduceResponse::default().with_responses(responses),
        )));
    }
    let acked = req.acks != 0;
    let timeout = Duration::from_millis(u64::try_from(req.timeout_ms).unwrap_or(0).clamp(1, 300_000));
    let cfg = &kafka.config;
    // Submit every partition's batch first (in order), then wait for them together.
    let mut pending = Vec::new();
    for t in req.topic_data {
        let meta = kafka.topic(&t.name, true).await;
        for p in t.partition_data {
            let slot = match &meta {
                Err(code) => Err(refused(p.index, *code, None)),
                Ok(m) if p.index < 0 || p.index as u32 >= m.partitions => {
                    Err(refused(p.index, ResponseError::UnknownTopicOrPartition.code(), None))
                }
                Ok(_) => {
                    let raw = p.records.clone().unwrap_or_default();
                    match records::decode(&t.name, p.index as u32, &raw, cfg.max_message_bytes, cfg.max_inflated_bytes)
                    {
                        Err(e) => {
                            let code = match e {
                                ProduceError::TooLarge { .. } => ResponseError::MessageTooLarge.code(),
                                ProduceError::Corrupt(_) => ResponseError::CorruptMessage.code(),
                                ProduceError::Control => ResponseError::InvalidRecord.code(),
                            };
                            Err(refused(p.index, code, Some(e.to_string())))
                        }
                        Ok(produced) if produced.records.is_empty() => {
                            Err(refused(p.index, ResponseError::InvalidRecord.code(), Some("no records".into())))
                        }
                        Ok(produced) => match kafka.appender.submit(produced.records, Assign::Given, acked).await {
                            Ok(ack) => Ok(ack),
                            Err(e) => Err(refused(p.index, storage_error(&e), Some(e.to_string()))),
                        },
                    }
                }
            };
            pending.push((t.name.clone(), p.index, slot));
        }
    }
    if !acked {
        // Nobody waits; the appends still happen, in order.
        for (_, _, slot) in pending {
            if let Ok(ack) = slot {
                tokio::spawn(async move {
                    let _ = ack.await;
                });
            }
        }
        return Outcome::Silent;
    }
    let mut topics: Vec<TopicProduceResponse> = Vec::new();
    for (name, index, slot) in pending {
        let part = match slot {
            Err(r) => r,
            Ok(ack) => match tokio::time::timeout(timeout, ack).await {
                Err(_) => refused(index, ResponseError::RequestTimedOut.code(), None),
                Ok(Err(e)) => refused(index, storage_error(&e), Some(e.to_string())),
                Ok(Ok(appended)) => answered(kafka, &name, index, appended).await,
            },
        };
        match topics.last_mut() {
            Some(t) if t.name == name => t.partition_responses.push(part),
            _ => topics.push(TopicProduceResponse::default().with_name(name).with_partition_responses(vec![part])),
        }
    }
    Outcome::Respond(Box::new(silt_kafka::kafka_protocol::messages::ResponseKind::Produce(
        ProduceResponse::default().with_responses(topics),
    )))
}

/// The response for a durable batch: the offset its first record got, once indexed.
async fn answered(
    kafka: &Kafka,
    topic: &str,
    index: i32,
    appended: silt_storage::Appended,
) -> PartitionProduceResponse {
    let storage = kafka.storage().clone();
    if let Err(e) = storage.wait_dispatched(appended.end).await {
        return refused(index, storage_error(&e), Some(e.to_string()));
    }
    let name = QueueName::Partition { stream: topic.to_owned(), partition: Partition(index as u32) };
    let first = appended.positions[0];
    let found = tokio::task::spawn_blocking(move || {
        let id = storage.queue_id(&name)?.ok_or(silt_storage::Error::NotFound(first.get()))?;
        let base = storage.offset_of(id, first)?;
        let start = storage.queue_bounds(id)?.0;
        Ok::<_, silt_storage::Error>((base, start))
    })
    .await;
    match found {
        Ok(Ok((Some(base), start))) => PartitionProduceResponse::default()
            .with_index(index)
            .with_base_offset(base.get() as i64)
            .with_log_start_offset(start.get() as i64),
        Ok(Ok((None, _))) => refused(index, ResponseError::KafkaStorageError.code(), Some("record not indexed".into())),
        Ok(Err(e)) => refused(index, storage_error(&e), Some(e.to_string())),
        Err(e) => refused(index, ResponseError::UnknownServerError.code(), Some(e.to_string())),
    }
}
