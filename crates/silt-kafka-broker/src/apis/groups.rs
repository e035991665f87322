//! The group APIs, answered by the coordinator (`crate::groups`): JoinGroup, SyncGroup,
//! OffsetCommit and DeleteGroups wait for it; Heartbeat, LeaveGroup, OffsetFetch,
//! DescribeGroups and ListGroups are answered at once. An OffsetCommit for a topic-partition
//! that does not exist is refused for that partition (UNKNOWN_TOPIC_OR_PARTITION), as Kafka
//! checks before the coordinator.

use silt_kafka::group::Client;
use silt_kafka::kafka_protocol::ResponseError;
use silt_kafka::kafka_protocol::messages::RequestKind;

use super::{Ctx, Outcome, respond};
use crate::node::Kafka;

pub async fn handle(kafka: &Kafka, ctx: &Ctx, version: i16, body: RequestKind) -> Outcome {
    let groups = &kafka.groups;
    let host = format!("/{}", ctx.peer.ip());
    let client = Client { client_id: &ctx.client_id, client_host: &host };
    let parked = match body {
        RequestKind::JoinGroup(r) => groups.parked(|c, now, t| c.handle_join_group(now, t, version, client, &r)).await,
        RequestKind::SyncGroup(r) => groups.parked(|c, now, t| c.handle_sync_group(now, t, version, &r)).await,
        RequestKind::OffsetCommit(r) => {
            let streams = kafka.appender.streams().clone();
            let check = move |topic: &str, partition: i32| match streams.get(topic) {
                Some(m) if partition >= 0 && (partition as u32) < m.partitions => None,
                _ => Some(ResponseError::UnknownTopicOrPartition),
            };
            groups.parked(|c, now, t| c.handle_offset_commit(now, t, version, &r, check)).await
        }
        RequestKind::DeleteGroups(r) => groups.parked(|c, now, t| c.handle_delete_groups(now, t, version, &r)).await,
        RequestKind::Heartbeat(r) => {
            return respond(groups.now(|c, now| c.handle_heartbeat(now, version, &r)).into());
        }
        RequestKind::LeaveGroup(r) => {
            return respond(groups.now(|c, now| c.handle_leave_group(now, version, &r)).into());
        }
        RequestKind::OffsetFetch(r) => return respond(groups.now(|c, _| c.handle_offset_fetch(version, &r)).into()),
        RequestKind::DescribeGroups(r) => {
            return respond(groups.now(|c, _| c.handle_describe_groups(version, &r)).into());
        }
        RequestKind::ListGroups(r) => return respond(groups.now(|c, _| c.handle_list_groups(version, &r)).into()),
        other => return Outcome::Close(format!("not a group request: {:?}", std::mem::discriminant(&other))),
    };
    match parked {
        Some(response) => Outcome::Respond(response),
        // Superseded by the same member's next request (Kafka leaves it unanswered too; the
        // client has moved on).
        None => Outcome::Silent,
    }
}

/// Applies a committed transaction's staged offsets to their groups (durably), one
/// OffsetCommit-like batch per group.
pub async fn apply_transaction_offsets(
    kafka: &Kafka,
    offsets: &[(String, silt_kafka::txn::StagedOffset)],
) -> Result<(), i16> {
    use silt_kafka::kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use silt_kafka::kafka_protocol::messages::{GroupId, OffsetCommitRequest, ResponseKind, TopicName};
    use silt_kafka::kafka_protocol::protocol::StrBytes;
    let mut by_group: std::collections::BTreeMap<&str, Vec<&silt_kafka::txn::StagedOffset>> = Default::default();
    for (g, o) in offsets {
        by_group.entry(g.as_str()).or_default().push(o);
    }
    for (group, os) in by_group {
        let mut topics: Vec<OffsetCommitRequestTopic> = Vec::new();
        for o in os {
            let p = OffsetCommitRequestPartition::default()
                .with_partition_index(o.partition)
                .with_committed_offset(o.offset)
                .with_committed_leader_epoch(o.leader_epoch)
                .with_committed_metadata(Some(StrBytes::from_string(o.metadata.clone())));
            match topics.iter_mut().find(|t| t.name.as_str() == o.topic) {
                Some(t) => t.partitions.push(p),
                None => topics.push(
                    OffsetCommitRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_string(o.topic.clone())))
                        .with_partitions(vec![p]),
                ),
            }
        }
        let r = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(topics);
        let answer = kafka.groups.parked(|c, now, t| c.handle_transaction_offsets(now, t, &r)).await;
        let failed = match answer.as_deref() {
            Some(ResponseKind::OffsetCommit(resp)) => {
                resp.topics.iter().flat_map(|t| &t.partitions).find(|p| p.error_code != 0).map(|p| p.error_code)
            }
            _ => Some(ResponseError::CoordinatorNotAvailable.code()),
        };
        if let Some(code) = failed {
            return Err(code);
        }
    }
    Ok(())
}
