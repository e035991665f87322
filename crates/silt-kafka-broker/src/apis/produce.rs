//! Produce: each partition's batches become one batch of log records, appended through the
//! shared path (the same as an MQTT publish: tiers, retained records, `ack = "object"`), and
//! answered with the offset the first record got.
//!
//! acks: 0 answers nothing; 1 and all (-1) answer once the batch is durable under the topic's
//! policy (on one node there is no replica to wait for, so "all" is the policy's durability:
//! `ack = "object"` means the bucket holds it). A batch not acknowledged within the request's
//! `timeout_ms` is answered REQUEST_TIMED_OUT (it may still be written, as in Kafka).
//!
//! Idempotent producers' batches are checked first (`crate::txns`): a retry is answered with
//! the offset of the batch it repeats and not written again; a gap is
//! OUT_OF_ORDER_SEQUENCE_NUMBER. A transactional batch needs its partition added to the
//! producer's open transaction; its records are the Kafka view's only (no MQTT topic).
//!
//! ACLs: each record is written to the MQTT topic its key names (see `silt_dataset::rule`),
//! so a client needs write access to it, as an MQTT publisher would. A topic it may write none
//! of is refused before anything is decoded (and never auto-created); a partition's batch
//! with one record it may not write is refused whole: TOPIC_AUTHORIZATION_FAILED, nothing of
//! it written. A transactional produce needs the transactional id.

use std::time::Duration;

use silt_dataset::{AckFuture, Assign, attrs, rule};
use silt_kafka::kafka_protocol::ResponseError;
use silt_kafka::kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use silt_kafka::kafka_protocol::messages::{ProduceRequest, ProduceResponse, ResponseKind, TopicName};
use silt_kafka::kafka_protocol::protocol::StrBytes;
use silt_kafka::producer::{At, Check};

use silt_auth::{Access, Reach};

use super::{Ctx, Outcome, offset_of, respond, storage_error};
use crate::node::Kafka;
use crate::records::{self, ProduceError, ProducedBatch};

fn refused(index: i32, code: i16, message: Option<String>) -> PartitionProduceResponse {
    PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(code)
        .with_base_offset(-1)
        .with_error_message(message.map(StrBytes::from_string))
}

/// A partition's batch on its way: appended, or answered already.
enum Slot {
    Answered(PartitionProduceResponse),
    Appended { ack: AckFuture, batches: Vec<ProducedBatch> },
}

pub async fn produce(kafka: &Kafka, ctx: &Ctx, req: ProduceRequest) -> Outcome {
    let received = std::time::Instant::now();
    let txn_id = req.transactional_id.as_ref().map(|t| t.0.as_str().to_owned());
    let refusal = if !(-1..=1).contains(&req.acks) {
        Some(ResponseError::InvalidRequiredAcks)
    } else if txn_id.as_deref().is_some_and(|id| !ctx.may_use_transactional_id(kafka, id)) {
        Some(ResponseError::TransactionalIdAuthorizationFailed)
    } else {
        None
    };
    if let Some(refusal) = refusal {
        let code = refusal.code();
        let responses = req
            .topic_data
            .into_iter()
            .map(|t| {
                let parts = t.partition_data.iter().map(|p| refused(p.index, code, None)).collect();
                TopicProduceResponse::default().with_name(t.name).with_partition_responses(parts)
            })
            .collect();
        return respond(ResponseKind::Produce(ProduceResponse::default().with_responses(responses)));
    }
    let acked = req.acks != 0;
    let timeout = Duration::from_millis(u64::try_from(req.timeout_ms).unwrap_or(0).clamp(1, 300_000));
    // Submit every partition's batch first (in order), then wait for them together.
    let mut pending: Vec<(TopicName, i32, Slot)> = Vec::new();
    for t in req.topic_data {
        let reach = ctx.reach(kafka, Access::Write, t.name.as_str());
        let meta = match reach {
            Reach::None if rule::kafka_topic_error(t.name.as_str()).is_none() => {
                Err(ResponseError::TopicAuthorizationFailed.code())
            }
            _ => kafka.topic(t.name.as_str(), true).await,
        };
        for p in t.partition_data {
            let slot = match &meta {
                Err(code) => Slot::Answered(refused(p.index, *code, None)),
                Ok(m) if p.index < 0 || p.index as u32 >= m.partitions => {
                    Slot::Answered(refused(p.index, ResponseError::UnknownTopicOrPartition.code(), None))
                }
                Ok(_) => {
                    let raw = p.records.clone().unwrap_or_default();
                    let check = (reach == Reach::Some).then_some(ctx);
                    let at = (t.name.as_str(), p.index);
                    partition(kafka, check, at, &raw, txn_id.as_deref(), acked).await
                }
            };
            pending.push((t.name.clone(), p.index, slot));
        }
    }
    if !acked {
        // Nobody waits; the appends still happen, in order.
        for (_, _, slot) in pending {
            if let Slot::Appended { ack, .. } = slot {
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
            Slot::Answered(r) => r,
            Slot::Appended { ack, batches } => match tokio::time::timeout(timeout, ack).await {
                Err(_) => refused(index, ResponseError::RequestTimedOut.code(), None),
                Ok(Err(e)) => refused(index, storage_error(&e), Some(e.to_string())),
                Ok(Ok(appended)) => answered(kafka, name.as_str(), index, appended, &batches, txn_id.as_deref()).await,
            },
        };
        match topics.last_mut() {
            Some(t) if t.name == name => t.partition_responses.push(part),
            _ => topics.push(TopicProduceResponse::default().with_name(name).with_partition_responses(vec![part])),
        }
    }
    kafka.stats.produce_latency.observe(received.elapsed());
    respond(ResponseKind::Produce(ProduceResponse::default().with_responses(topics)))
}

/// Decodes, checks and submits one partition's batches; `acl`: the client whose write access
/// each record's MQTT topic needs (`None`: it may write the whole topic).
async fn partition(
    kafka: &Kafka,
    acl: Option<&Ctx>,
    (topic, index): (&str, i32),
    raw: &bytes::Bytes,
    txn: Option<&str>,
    acked: bool,
) -> Slot {
    let cfg = &kafka.config;
    let produced = match records::decode(topic, index as u32, raw, cfg.max_message_bytes, cfg.max_inflated_bytes) {
        Ok(p) if p.records.is_empty() => {
            return Slot::Answered(refused(index, ResponseError::InvalidRecord.code(), Some("no records".into())));
        }
        Ok(p) => p,
        Err(e) => {
            let code = match e {
                ProduceError::TooLarge { .. } => ResponseError::MessageTooLarge.code(),
                ProduceError::Corrupt(_) => ResponseError::CorruptMessage.code(),
                ProduceError::Control => ResponseError::InvalidRecord.code(),
            };
            return Slot::Answered(refused(index, code, Some(e.to_string())));
        }
    };
    let mut records = produced.records;
    if let Some(ctx) = acl
        && let Some(r) = records.iter().find(|r| !ctx.may(kafka, Access::Write, &r.topic))
    {
        let why = format!("not authorized to write MQTT topic {:?}", silt_types::log_limit::prefix(&r.topic));
        return Slot::Answered(refused(index, ResponseError::TopicAuthorizationFailed.code(), Some(why)));
    }
    for b in &produced.batches {
        if b.producer_id < 0 {
            if b.transactional {
                return Slot::Answered(refused(
                    index,
                    ResponseError::InvalidRecord.code(),
                    Some("a transactional batch without a producer id".into()),
                ));
            }
            continue;
        }
        if b.transactional {
            let Some(id) = txn else {
                return Slot::Answered(refused(
                    index,
                    ResponseError::InvalidTxnState.code(),
                    Some("a transactional batch outside a transaction".into()),
                ));
            };
            if let Err(code) = kafka.txns.may_produce(id, b.producer_id, b.producer_epoch, topic, index) {
                return Slot::Answered(refused(index, code, None));
            }
        }
        let (storage, txns, t) = (kafka.storage().clone(), kafka.txns.clone(), topic.to_owned());
        let b2 = *b;
        let check = tokio::task::spawn_blocking(move || {
            let at = At { pid: b2.producer_id, topic: &t, partition: index as u32 };
            txns.check(&storage, at, b2.producer_epoch, b2.base_sequence, b2.count)
        })
        .await
        .unwrap_or(Check::OutOfOrder);
        match check {
            Check::Append => {}
            // One batch per partition is what producers send; a retry of it is answered with
            // its first write.
            Check::Duplicate { offset } if produced.batches.len() == 1 => {
                return Slot::Answered(
                    PartitionProduceResponse::default().with_index(index).with_base_offset(offset as i64),
                );
            }
            Check::Duplicate { .. } | Check::OutOfOrder | Check::Unknown => {
                return Slot::Answered(refused(index, ResponseError::OutOfOrderSequenceNumber.code(), None));
            }
            Check::StaleEpoch => {
                return Slot::Answered(refused(index, ResponseError::InvalidProducerEpoch.code(), None));
            }
        }
    }
    for r in &mut records {
        if r.attrs & attrs::TRANSACTIONAL != 0 {
            r.topic.clear(); // not delivered over MQTT (see `crate::txns`)
        }
    }
    // Before the append: once it is dispatched, a read_committed fetch may run before the
    // acknowledgement reaches `answered`.
    if produced.batches.iter().any(|b| b.transactional && b.producer_id >= 0) {
        let end = super::log_end(kafka, topic, index as u32).await;
        for b in produced.batches.iter().filter(|b| b.transactional && b.producer_id >= 0) {
            kafka.txns.landing(b.producer_id, topic, index, end);
        }
    }
    let (count, size) = (records.len() as u64, raw.len() as u64);
    match kafka.appender.submit(records, Assign::Given, acked).await {
        Ok(ack) => {
            kafka.stats.records_received.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
            kafka.stats.bytes_received.fetch_add(size, std::sync::atomic::Ordering::Relaxed);
            Slot::Appended { ack, batches: produced.batches }
        }
        Err(e) => Slot::Answered(refused(index, storage_error(&e), Some(e.to_string()))),
    }
}

/// The response for a durable batch: the offset its first record got, once indexed; the
/// producer's sequences and its transaction's first offset recorded on the way.
async fn answered(
    kafka: &Kafka,
    topic: &str,
    index: i32,
    appended: silt_storage::Appended,
    batches: &[ProducedBatch],
    txn: Option<&str>,
) -> PartitionProduceResponse {
    let base = match offset_of(kafka, topic, index as u32, appended.positions[0]).await {
        Ok(o) => o,
        Err(code) => return refused(index, code, None),
    };
    let mut at = base;
    for b in batches {
        if b.producer_id >= 0 {
            let who = At { pid: b.producer_id, topic, partition: index as u32 };
            kafka.txns.record(who, b.producer_epoch, b.base_sequence, b.count, at as u64);
            if b.transactional
                && let Some(id) = txn
                && let Err(code) = kafka.txns.landed(id, b.producer_id, topic, index, at).await
            {
                return refused(index, code, None);
            }
        }
        at += b.count as i64;
    }
    let start = super::log_start(kafka, topic, index as u32).await;
    PartitionProduceResponse::default().with_index(index).with_base_offset(base).with_log_start_offset(start)
}
