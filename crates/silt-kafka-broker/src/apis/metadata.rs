//! Metadata and FindCoordinator: one broker, leader of every partition of every stream that is
//! a Kafka topic; internal streams and names Kafka cannot carry are left out.
//!
//! ACLs: a topic the client can neither read nor write any of is left out of a full listing
//! and answered TOPIC_AUTHORIZATION_FAILED when named (and not auto-created); a coordinator is
//! found only for a group or transactional id the client may use.

use silt_auth::{Access, Reach};
use silt_dataset::rule;
use silt_kafka::kafka_protocol::ResponseError;
use silt_kafka::kafka_protocol::messages::find_coordinator_response::Coordinator;
use silt_kafka::kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use silt_kafka::kafka_protocol::messages::{
    BrokerId, FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, MetadataResponse, TopicName,
};
use silt_kafka::kafka_protocol::protocol::StrBytes;

use super::Ctx;
use crate::node::{Kafka, NODE_ID};

fn topic_entry(name: &str, partitions: Result<u32, i16>) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default().with_name(Some(TopicName(StrBytes::from_string(name.to_owned()))));
    match partitions {
        Ok(n) => {
            t.partitions = (0..n as i32)
                .map(|p| {
                    MetadataResponsePartition::default()
                        .with_partition_index(p)
                        .with_leader_id(BrokerId(NODE_ID))
                        .with_leader_epoch(0)
                        .with_replica_nodes(vec![BrokerId(NODE_ID)])
                        .with_isr_nodes(vec![BrokerId(NODE_ID)])
                })
                .collect();
        }
        Err(code) => t.error_code = code,
    }
    t
}

pub async fn metadata(kafka: &Kafka, ctx: &Ctx, req: MetadataRequest) -> MetadataResponse {
    let (host, port) = kafka.advertised_for(ctx.tls);
    let broker = MetadataResponseBroker::default()
        .with_node_id(BrokerId(NODE_ID))
        .with_host(StrBytes::from_string(host))
        .with_port(i32::from(port));
    let topics = match req.topics {
        // All topics.
        None => kafka
            .appender
            .streams()
            .list()
            .into_iter()
            .filter(|(name, _)| rule::is_kafka_topic(name) && ctx.may_describe(kafka, name))
            .map(|(name, meta)| topic_entry(&name, Ok(meta.partitions)))
            .collect(),
        Some(wanted) => {
            let mut out = Vec::with_capacity(wanted.len());
            for t in wanted {
                let Some(name) = t.name else {
                    // Topics by id only: Silt has no topic ids.
                    out.push(MetadataResponseTopic::default().with_error_code(ResponseError::UnknownTopicId.code()));
                    continue;
                };
                if rule::kafka_topic_error(&name).is_none() && !ctx.may_describe(kafka, &name) {
                    out.push(topic_entry(&name, Err(ResponseError::TopicAuthorizationFailed.code())));
                    continue;
                }
                let create = req.allow_auto_topic_creation && ctx.reach(kafka, Access::Write, &name) != Reach::None;
                let found = kafka.topic(&name, create).await.map(|m| m.partitions);
                out.push(topic_entry(&name, found));
            }
            out
        }
    };
    MetadataResponse::default()
        .with_brokers(vec![broker])
        .with_cluster_id(Some(StrBytes::from_string(kafka.cluster_id.clone())))
        .with_controller_id(BrokerId(NODE_ID))
        .with_topics(topics)
}

/// Every group and transaction is coordinated by this node.
pub fn find_coordinator(
    kafka: &Kafka,
    ctx: &Ctx,
    req: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let (host, port) = kafka.advertised_for(ctx.tls);
    let host = StrBytes::from_string(host);
    // key_type 0: a group; 1: a transactional id.
    let refusal = |key: &str| match req.key_type {
        1 if !ctx.may_use_transactional_id(kafka, key) => Some(ResponseError::TransactionalIdAuthorizationFailed),
        0 if !ctx.may_use_group(kafka, key) => Some(ResponseError::GroupAuthorizationFailed),
        _ => None,
    };
    let mut resp = FindCoordinatorResponse::default();
    if version >= 4 {
        resp.coordinators = req
            .coordinator_keys
            .iter()
            .map(|key| {
                let c = Coordinator::default().with_key(key.clone());
                match refusal(key.as_str()) {
                    Some(e) => c.with_error_code(e.code()).with_node_id(BrokerId(-1)).with_port(-1),
                    None => c.with_node_id(BrokerId(NODE_ID)).with_host(host.clone()).with_port(i32::from(port)),
                }
            })
            .collect();
    } else if let Some(e) = refusal(req.key.as_str()) {
        resp.error_code = e.code();
        resp.node_id = BrokerId(-1);
        resp.port = -1;
    } else {
        resp.node_id = BrokerId(NODE_ID);
        resp.host = host;
        resp.port = i32::from(port);
    }
    resp
}
