//! CreateTopics, DeleteTopics and DescribeConfigs. A topic is a stream; its partition count
//! is fixed at creation. One node: a replication factor other than 1 (or -1, the default) is
//! INVALID_REPLICATION_FACTOR. Deleting a topic drops its partition queues (a new topic of the
//! same name starts at offset 0); the records stay in the log for the MQTT topics they belong
//! to. DescribeConfigs reports the settings clients look for (`message.max.bytes` and the
//! retention the topic's policy gives).
//!
//! ACLs: creating or deleting a topic needs write access to all of it (every MQTT topic
//! under its name); describing one, read or write access to some of it.

use silt_kafka::kafka_protocol::ResponseError;
use silt_kafka::kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use silt_kafka::kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use silt_kafka::kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use silt_kafka::kafka_protocol::messages::{
    CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeConfigsRequest,
    DescribeConfigsResponse, TopicName,
};
use silt_kafka::kafka_protocol::protocol::StrBytes;

use silt_auth::{Access, Reach};

use super::{Ctx, storage_error};
use crate::node::Kafka;

/// DescribeConfigs resource types.
const TOPIC: i8 = 2;
const BROKER: i8 = 4;

pub async fn create(kafka: &Kafka, ctx: &Ctx, req: CreateTopicsRequest) -> CreateTopicsResponse {
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let mut r = CreatableTopicResult::default().with_name(t.name.clone());
        let name = t.name.as_str();
        let code = if let Some(why) = silt_dataset::rule::kafka_topic_error(name) {
            r.error_message = Some(StrBytes::from_static_str(why));
            ResponseError::InvalidTopicException.code()
        } else if ctx.reach(kafka, Access::Write, name) != Reach::All {
            ResponseError::TopicAuthorizationFailed.code()
        } else if !matches!(t.replication_factor, -1 | 1) {
            ResponseError::InvalidReplicationFactor.code()
        } else if t.num_partitions == 0
            || t.num_partitions < -1
            || t.num_partitions as i64 > i64::from(silt_dataset::streams::MAX_PARTITIONS)
        {
            ResponseError::InvalidPartitions.code()
        } else if !t.assignments.is_empty() {
            ResponseError::InvalidReplicaAssignment.code()
        } else if req.validate_only {
            if kafka.appender.streams().get(name).is_some() { ResponseError::TopicAlreadyExists.code() } else { 0 }
        } else {
            let n = (t.num_partitions > 0).then_some(t.num_partitions as u32);
            match kafka.appender.create_stream(name, n).await {
                Ok(Ok(meta)) => {
                    r.num_partitions = meta.partitions as i32;
                    r.replication_factor = 1;
                    tracing::info!(topic = %name, partitions = meta.partitions, "topic created");
                    0
                }
                Ok(Err(_)) => ResponseError::TopicAlreadyExists.code(),
                Err(e) => storage_error(&e),
            }
        };
        r.error_code = code;
        topics.push(r);
    }
    CreateTopicsResponse::default().with_topics(topics)
}

pub async fn delete(kafka: &Kafka, ctx: &Ctx, req: DeleteTopicsRequest) -> DeleteTopicsResponse {
    // v0-5 name topics in `topic_names`; v6+ in `topics`.
    let names: Vec<TopicName> = if req.topic_names.is_empty() {
        req.topics.into_iter().filter_map(|t| t.name).collect()
    } else {
        req.topic_names
    };
    let mut responses = Vec::with_capacity(names.len());
    for name in names {
        let code = if silt_dataset::rule::kafka_topic_error(name.as_str()).is_some() {
            ResponseError::UnknownTopicOrPartition.code()
        } else if ctx.reach(kafka, Access::Write, name.as_str()) != Reach::All {
            ResponseError::TopicAuthorizationFailed.code()
        } else {
            match kafka.appender.delete_stream(name.as_str()).await {
                Ok(true) => {
                    tracing::info!(topic = %name.as_str(), "topic deleted");
                    0
                }
                Ok(false) => ResponseError::UnknownTopicOrPartition.code(),
                Err(e) => storage_error(&e),
            }
        };
        responses.push(DeletableTopicResult::default().with_name(Some(name)).with_error_code(code));
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

pub fn describe_configs(kafka: &Kafka, ctx: &Ctx, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let max_message = kafka.config.max_message_bytes.to_string();
    let results = req
        .resources
        .into_iter()
        .map(|res| {
            let mut r = DescribeConfigsResult::default()
                .with_resource_type(res.resource_type)
                .with_resource_name(res.resource_name.clone());
            let entries: Vec<(&str, String)> = match res.resource_type {
                TOPIC if !ctx.may_describe(kafka, res.resource_name.as_str()) => {
                    r.error_code = ResponseError::TopicAuthorizationFailed.code();
                    Vec::new()
                }
                TOPIC if kafka.appender.streams().get(res.resource_name.as_str()).is_none() => {
                    r.error_code = ResponseError::UnknownTopicOrPartition.code();
                    Vec::new()
                }
                TOPIC => {
                    let mut v = vec![
                        ("message.max.bytes", max_message.clone()),
                        ("max.message.bytes", max_message.clone()),
                        ("cleanup.policy", "delete".into()),
                        ("min.insync.replicas", "1".into()),
                    ];
                    v.extend(kafka.topic_configs(res.resource_name.as_str()));
                    v
                }
                BROKER => vec![
                    ("message.max.bytes", max_message.clone()),
                    ("auto.create.topics.enable", kafka.config.auto_create_topics.to_string()),
                    ("num.partitions", kafka.appender.partitions_of("").to_string()),
                ],
                _ => {
                    r.error_code = ResponseError::InvalidRequest.code();
                    Vec::new()
                }
            };
            let keys = res.configuration_keys;
            r.configs = entries
                .into_iter()
                .filter(|(k, _)| keys.as_ref().is_none_or(|ks| ks.iter().any(|w| w.as_str() == *k)))
                .map(|(k, v)| {
                    DescribeConfigsResourceResult::default()
                        .with_name(StrBytes::from_static_str(k))
                        .with_value(Some(StrBytes::from_string(v)))
                        .with_read_only(true)
                        .with_config_source(4) // STATIC_BROKER_CONFIG: the config file, or its defaults
                })
                .collect();
            r
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}
