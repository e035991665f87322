//! InitProducerId and the transaction APIs (AddPartitionsToTxn, AddOffsetsToTxn,
//! TxnOffsetCommit, EndTxn), decided by the transaction coordinator (`silt_kafka::txn`) and
//! made durable before they are answered (`crate::txns`). EndTxn writes the markers before it
//! answers, so a read-committed consumer sees the transaction's records right after.
//!
//! ACLs: each needs the transactional id (a `transactional_id` rule, with an ACL file);
//! AddPartitionsToTxn also write access to some of each topic; AddOffsetsToTxn and
//! TxnOffsetCommit the group, and TxnOffsetCommit read access to some of each topic.

use silt_kafka::kafka_protocol::ResponseError;
use silt_kafka::kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use silt_kafka::kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use silt_kafka::kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse,
    EndTxnRequest, EndTxnResponse, InitProducerIdRequest, InitProducerIdResponse, ProducerId, TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
};
use silt_kafka::txn::StagedOffset;
use silt_types::Timestamp;

use silt_auth::{Access, Reach};

use super::Ctx;
use crate::node::Kafka;

const TXN_DENIED: ResponseError = ResponseError::TransactionalIdAuthorizationFailed;

pub async fn init_producer_id(
    kafka: &Kafka,
    ctx: &Ctx,
    r: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let id = r.transactional_id.as_ref().map(|t| t.0.as_str().to_owned());
    if id.as_deref().is_some_and(|id| !ctx.may_use_transactional_id(kafka, id)) {
        return InitProducerIdResponse::default().with_error_code(TXN_DENIED.code()).with_producer_id(ProducerId(-1));
    }
    let given = (version >= 3 && r.producer_id.0 >= 0).then_some((r.producer_id.0, r.producer_epoch));
    let now = Timestamp::now().get();
    let decided = kafka.txns.decide(|t| t.init(id.as_deref(), r.transaction_timeout_ms, given, now)).await;
    let (pid, epoch, abort) = match decided {
        Ok(v) => v,
        Err(code) => return InitProducerIdResponse::default().with_error_code(code).with_producer_id(ProducerId(-1)),
    };
    if let Some(e) = abort {
        // The fenced producer's open transaction is aborted before the new one may begin.
        if let Err(code) = kafka.txns.finish(kafka, &e).await {
            return InitProducerIdResponse::default().with_error_code(code).with_producer_id(ProducerId(-1));
        }
    }
    InitProducerIdResponse::default().with_producer_id(ProducerId(pid)).with_producer_epoch(epoch)
}

pub async fn add_partitions(
    kafka: &Kafka,
    ctx: &Ctx,
    r: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    // v0-3 carry one transaction in the top-level fields; v4 (not served) batches them.
    debug_assert!(version <= 3);
    let id = r.v3_and_below_transactional_id.0.as_str().to_owned();
    let (pid, epoch) = (r.v3_and_below_producer_id.0, r.v3_and_below_producer_epoch);
    let mut parts = Vec::new();
    // Partitions refused, with why: unknown, or not writable.
    let mut unknown = Vec::new();
    let mut failure = ResponseError::UnknownTopicOrPartition.code();
    let id_denied = !ctx.may_use_transactional_id(kafka, &id);
    for t in &r.v3_and_below_topics {
        let exists = kafka.appender.streams().get(t.name.as_str());
        let writable = ctx.reach(kafka, Access::Write, t.name.as_str()) != Reach::None;
        for p in &t.partitions {
            match exists {
                _ if !writable => {
                    failure = ResponseError::TopicAuthorizationFailed.code();
                    unknown.push((t.name.clone(), *p));
                }
                Some(m) if *p >= 0 && (*p as u32) < m.partitions => parts.push((t.name.as_str().to_owned(), *p)),
                _ => unknown.push((t.name.clone(), *p)),
            }
        }
    }
    let now = Timestamp::now().get();
    let code = if id_denied {
        TXN_DENIED.code()
    } else if unknown.is_empty() {
        match kafka.txns.decide(|t| t.add_partitions(&id, pid, epoch, &parts, now)).await {
            Ok(()) => 0,
            Err(c) => c,
        }
    } else {
        failure
    };
    // Every partition of the request gets the one outcome (OPERATION_NOT_ATTEMPTED for the good
    // ones when others were refused, as Kafka answers).
    let results = r
        .v3_and_below_topics
        .iter()
        .map(|t| {
            let per = t
                .partitions
                .iter()
                .map(|p| {
                    let c = if !id_denied && !unknown.is_empty() && !unknown.iter().any(|(n, q)| n == &t.name && q == p)
                    {
                        ResponseError::OperationNotAttempted.code()
                    } else {
                        code
                    };
                    AddPartitionsToTxnPartitionResult::default().with_partition_index(*p).with_partition_error_code(c)
                })
                .collect();
            AddPartitionsToTxnTopicResult::default().with_name(t.name.clone()).with_results_by_partition(per)
        })
        .collect();
    AddPartitionsToTxnResponse::default()
        .with_results_by_topic_v3_and_below(results)
        .with_results_by_transaction(Vec::<AddPartitionsToTxnResult>::new())
}

pub async fn add_offsets(kafka: &Kafka, ctx: &Ctx, r: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse {
    let (id, group) = (r.transactional_id.0.as_str().to_owned(), r.group_id.0.as_str().to_owned());
    if !ctx.may_use_transactional_id(kafka, &id) {
        return AddOffsetsToTxnResponse::default().with_error_code(TXN_DENIED.code());
    }
    if !ctx.may_use_group(kafka, &group) {
        return AddOffsetsToTxnResponse::default().with_error_code(ResponseError::GroupAuthorizationFailed.code());
    }
    let now = Timestamp::now().get();
    let code = match kafka.txns.decide(|t| t.add_offsets(&id, r.producer_id.0, r.producer_epoch, &group, now)).await {
        Ok(()) => 0,
        Err(c) => c,
    };
    AddOffsetsToTxnResponse::default().with_error_code(code)
}

pub async fn txn_offset_commit(kafka: &Kafka, ctx: &Ctx, r: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse {
    let (id, group) = (r.transactional_id.0.as_str().to_owned(), r.group_id.0.as_str().to_owned());
    let refused = if !ctx.may_use_transactional_id(kafka, &id) {
        Some(TXN_DENIED.code())
    } else if !ctx.may_use_group(kafka, &group) {
        Some(ResponseError::GroupAuthorizationFailed.code())
    } else if r.topics.iter().any(|t| ctx.reach(kafka, Access::Read, t.name.as_str()) == Reach::None) {
        Some(ResponseError::TopicAuthorizationFailed.code())
    } else {
        None
    };
    let staged: Vec<StagedOffset> = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| StagedOffset {
                topic: t.name.as_str().to_owned(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: p.committed_leader_epoch,
                metadata: p.committed_metadata.as_deref().unwrap_or("").to_owned(),
            })
        })
        .collect();
    let code = match refused {
        Some(c) => c,
        None => {
            match kafka.txns.decide(|t| t.stage_offsets(&id, r.producer_id.0, r.producer_epoch, &group, staged)).await {
                Ok(()) => 0,
                Err(c) => c,
            }
        }
    };
    let topics = r
        .topics
        .iter()
        .map(|t| {
            let per = t
                .partitions
                .iter()
                .map(|p| {
                    TxnOffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                })
                .collect();
            TxnOffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(per)
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}

pub async fn end_txn(kafka: &Kafka, ctx: &Ctx, r: EndTxnRequest) -> EndTxnResponse {
    let id = r.transactional_id.0.as_str().to_owned();
    if !ctx.may_use_transactional_id(kafka, &id) {
        return EndTxnResponse::default().with_error_code(TXN_DENIED.code());
    }
    let decided = kafka.txns.decide(|t| t.end(&id, r.producer_id.0, r.producer_epoch, r.committed)).await;
    let code = match decided {
        Ok(None) => 0, // a retry of an ending already done
        Ok(Some(e)) => match kafka.txns.finish(kafka, &e).await {
            Ok(()) => 0,
            Err(c) => c,
        },
        Err(c) => c,
    };
    EndTxnResponse::default().with_error_code(code)
}
