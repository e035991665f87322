//! The group APIs, answered by the coordinator (`crate::groups`): JoinGroup, SyncGroup,
//! OffsetCommit and DeleteGroups wait for it; Heartbeat, LeaveGroup, OffsetFetch,
//! DescribeGroups and ListGroups are answered at once. An OffsetCommit for a topic-partition
//! that does not exist is refused for that partition (UNKNOWN_TOPIC_OR_PARTITION), as Kafka
//! checks before the coordinator.
//!
//! ACLs (with an ACL file): a group needs a `group` rule naming it, else
//! GROUP_AUTHORIZATION_FAILED; committing or fetching offsets of a topic needs read access to
//! some of it, else TOPIC_AUTHORIZATION_FAILED for its partitions (and a fetch of all of a
//! group's offsets leaves such topics out). ListGroups lists only the groups the client may use.

use silt_auth::{Access, Reach};
use silt_kafka::group::Client;
use silt_kafka::kafka_protocol::ResponseError;
use silt_kafka::kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use silt_kafka::kafka_protocol::messages::describe_groups_response::DescribedGroup;
use silt_kafka::kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use silt_kafka::kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use silt_kafka::kafka_protocol::messages::{
    GroupId, HeartbeatResponse, JoinGroupResponse, LeaveGroupResponse, OffsetCommitResponse, OffsetFetchResponse,
    RequestKind, ResponseKind, SyncGroupResponse,
};

use super::{Ctx, Outcome, respond};
use crate::node::Kafka;

pub async fn handle(kafka: &Kafka, ctx: &Ctx, version: i16, body: RequestKind) -> Outcome {
    let groups = &kafka.groups;
    let host = format!("/{}", ctx.peer.ip());
    let client = Client { client_id: &ctx.client_id, client_host: &host };
    if let Some(denied) = group_denied(kafka, ctx, &body) {
        return respond(denied);
    }
    let readable = |topic: &str| ctx.reach(kafka, Access::Read, topic) != Reach::None;
    let parked = match body {
        RequestKind::JoinGroup(r) => groups.parked(|c, now, t| c.handle_join_group(now, t, version, client, &r)).await,
        RequestKind::SyncGroup(r) => groups.parked(|c, now, t| c.handle_sync_group(now, t, version, &r)).await,
        RequestKind::OffsetCommit(r) => {
            let streams = kafka.appender.streams().clone();
            let denied: Vec<String> =
                r.topics.iter().map(|t| t.name.as_str()).filter(|t| !readable(t)).map(str::to_owned).collect();
            let check = move |topic: &str, partition: i32| match streams.get(topic) {
                _ if denied.iter().any(|d| d == topic) => Some(ResponseError::TopicAuthorizationFailed),
                Some(m) if partition >= 0 && (partition as u32) < m.partitions => None,
                _ => Some(ResponseError::UnknownTopicOrPartition),
            };
            groups.parked(|c, now, t| c.handle_offset_commit(now, t, version, &r, check)).await
        }
        RequestKind::DeleteGroups(mut r) => {
            let denied: Vec<_> = r.groups_names.extract_if(.., |g| !ctx.may_use_group(kafka, g.as_str())).collect();
            let mut answer = groups.parked(|c, now, t| c.handle_delete_groups(now, t, version, &r)).await;
            if let Some(ResponseKind::DeleteGroups(resp)) = answer.as_deref_mut() {
                resp.results.extend(
                    denied
                        .into_iter()
                        .map(|g| DeletableGroupResult::default().with_group_id(g).with_error_code(GROUP_DENIED.code())),
                );
            }
            answer
        }
        RequestKind::Heartbeat(r) => {
            return respond(groups.now(|c, now| c.handle_heartbeat(now, version, &r)).into());
        }
        RequestKind::LeaveGroup(r) => {
            return respond(groups.now(|c, now| c.handle_leave_group(now, version, &r)).into());
        }
        RequestKind::OffsetFetch(r) => {
            let mut resp = groups.now(|c, _| c.handle_offset_fetch(version, &r));
            if r.topics.is_none() {
                resp.topics.retain(|t| readable(t.name.as_str()));
            }
            for t in resp.topics.iter_mut().filter(|t| !readable(t.name.as_str())) {
                for p in &mut t.partitions {
                    p.committed_offset = -1;
                    p.metadata = None;
                    p.error_code = ResponseError::TopicAuthorizationFailed.code();
                }
            }
            return respond(resp.into());
        }
        RequestKind::DescribeGroups(mut r) => {
            let denied: Vec<_> = r.groups.extract_if(.., |g| !ctx.may_use_group(kafka, g.as_str())).collect();
            let mut resp = groups.now(|c, _| c.handle_describe_groups(version, &r));
            resp.groups.extend(
                denied
                    .into_iter()
                    .map(|g| DescribedGroup::default().with_group_id(g).with_error_code(GROUP_DENIED.code())),
            );
            return respond(resp.into());
        }
        RequestKind::ListGroups(r) => {
            let mut resp = groups.now(|c, _| c.handle_list_groups(version, &r));
            resp.groups.retain(|g| ctx.may_use_group(kafka, g.group_id.as_str()));
            return respond(resp.into());
        }
        other => return Outcome::Close(format!("not a group request: {:?}", std::mem::discriminant(&other))),
    };
    match parked {
        Some(response) => Outcome::Respond(response),
        // Superseded by the same member's next request (Kafka leaves it unanswered too; the
        // client has moved on).
        None => Outcome::Silent,
    }
}

const GROUP_DENIED: ResponseError = ResponseError::GroupAuthorizationFailed;

/// The answer to a request about one group the client may not use.
fn group_denied(kafka: &Kafka, ctx: &Ctx, body: &RequestKind) -> Option<ResponseKind> {
    let code = GROUP_DENIED.code();
    let denied = |g: &GroupId| !ctx.may_use_group(kafka, g.as_str());
    Some(match body {
        RequestKind::JoinGroup(r) if denied(&r.group_id) => {
            JoinGroupResponse::default().with_error_code(code).with_member_id(r.member_id.clone()).into()
        }
        RequestKind::SyncGroup(r) if denied(&r.group_id) => SyncGroupResponse::default().with_error_code(code).into(),
        RequestKind::Heartbeat(r) if denied(&r.group_id) => HeartbeatResponse::default().with_error_code(code).into(),
        RequestKind::LeaveGroup(r) if denied(&r.group_id) => LeaveGroupResponse::default().with_error_code(code).into(),
        RequestKind::OffsetCommit(r) if denied(&r.group_id) => {
            let topics = r
                .topics
                .iter()
                .map(|t| {
                    let parts = t
                        .partitions
                        .iter()
                        .map(|p| {
                            OffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code)
                        })
                        .collect();
                    OffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(parts)
                })
                .collect();
            OffsetCommitResponse::default().with_topics(topics).into()
        }
        RequestKind::OffsetFetch(r) if denied(&r.group_id) => {
            let topics = r
                .topics
                .iter()
                .flatten()
                .map(|t| {
                    let parts = t
                        .partition_indexes
                        .iter()
                        .map(|&p| {
                            OffsetFetchResponsePartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(-1)
                                .with_error_code(code)
                        })
                        .collect();
                    OffsetFetchResponseTopic::default().with_name(t.name.clone()).with_partitions(parts)
                })
                .collect();
            OffsetFetchResponse::default().with_error_code(code).with_topics(topics).into()
        }
        _ => return None,
    })
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
