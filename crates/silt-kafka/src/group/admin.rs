//! DescribeGroups (v0–v5), ListGroups (v0–v4, with the states filter from v4) and DeleteGroups
//! (v0–v2), as Kafka's `GroupMetadataManager` and `GroupCoordinatorShard` answer them, and the
//! views the driver's metrics and admin API read.

use std::collections::HashSet;
use std::time::Instant;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse, GroupId,
    ListGroupsRequest, ListGroupsResponse, ResponseKind,
};

use super::Coordinator;
use super::event::{GroupState, RequestToken};
use super::offsets::{Answer, PendingPersist};
use super::record::{CommittedOffset, Record};
use super::state::Group;

const STATES: [GroupState; 5] = [
    GroupState::Empty,
    GroupState::PreparingRebalance,
    GroupState::CompletingRebalance,
    GroupState::Stable,
    GroupState::Dead,
];

/// A group as the driver's metrics and admin API see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView<'a> {
    pub id: &'a str,
    pub state: GroupState,
    /// "consumer" for consumer groups; None for a group that never had members.
    pub protocol_type: Option<&'a str>,
    /// The assignor selected (e.g. "range"), while the group has members.
    pub protocol: Option<&'a str>,
    pub generation: i32,
    pub leader: Option<&'a str>,
    pub members: Vec<MemberView<'a>>,
}

/// A member of a [`GroupView`], in join order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView<'a> {
    pub member_id: &'a str,
    pub group_instance_id: Option<&'a str>,
    pub client_id: &'a str,
    pub client_host: &'a str,
    /// The assignment the leader gave it (opaque to the coordinator; the consumer protocol's
    /// encoding for consumer groups).
    pub assignment: &'a [u8],
}

impl Coordinator {
    /// Handles a DescribeGroups. A group that does not exist is reported Dead, as Kafka does.
    /// A group named twice is described once. `authorized_operations` is left for the driver
    /// (Kafka fills it from ACLs when asked, v3+).
    pub fn handle_describe_groups(&self, _version: i16, r: &DescribeGroupsRequest) -> DescribeGroupsResponse {
        let mut seen = HashSet::new();
        let groups = r
            .groups
            .iter()
            .filter(|id| seen.insert(id.0.as_bytes()))
            .map(|id| match self.groups.get(id.0.as_bytes()) {
                Some(g) => describe(g),
                None => {
                    DescribedGroup::default().with_group_id(id.clone()).with_group_state(GroupState::Dead.str_bytes())
                }
            })
            .collect();
        DescribeGroupsResponse::default().with_groups(groups)
    }

    /// Handles a ListGroups: every group, or (v4+) those whose state is in the filter (Kafka
    /// compares names case-insensitively; an unknown name matches nothing).
    pub fn handle_list_groups(&self, _version: i16, r: &ListGroupsRequest) -> ListGroupsResponse {
        // As a set of states: the filter's length is the client's, the work per group is not.
        let states: HashSet<GroupState> = r
            .states_filter
            .iter()
            .filter_map(|name| {
                let name = name.trim();
                STATES.into_iter().find(|s| s.name().eq_ignore_ascii_case(name))
            })
            .collect();
        let filtered = !r.states_filter.is_empty();
        let mut groups: Vec<ListedGroup> = self
            .groups
            .values()
            .filter(|g| !filtered || states.contains(&g.state))
            .map(|g| {
                ListedGroup::default()
                    .with_group_id(GroupId(g.id.clone()))
                    .with_protocol_type(g.protocol_type.clone().unwrap_or_default())
                    .with_group_state(g.state.str_bytes())
            })
            .collect();
        groups.sort_unstable_by(|a, b| a.group_id.0.cmp(&b.group_id.0));
        ListGroupsResponse::default().with_groups(groups)
    }

    /// Handles a DeleteGroups: each empty group named goes with its offsets (NON_EMPTY_GROUP if
    /// it has members, GROUP_ID_NOT_FOUND if there is none). The answer comes as
    /// [`Event::Respond`](super::Event::Respond) for `token`, once the tombstones are durable.
    pub fn handle_delete_groups(&mut self, _now: Instant, token: RequestToken, _version: i16, r: &DeleteGroupsRequest) {
        // Kafka's KafkaApis drops repeated names.
        let mut seen = HashSet::new();
        let mut results = Vec::new();
        let mut deleted = Vec::new();
        let mut incarnations = Vec::new();
        let mut records = Vec::new();
        for id in r.groups_names.iter().filter(|id| seen.insert(id.0.as_bytes())) {
            let error = match self.groups.get(id.0.as_bytes()).map(|g| g.state) {
                None => Some(ResponseError::GroupIdNotFound),
                Some(GroupState::Empty) => None,
                Some(_) => Some(ResponseError::NonEmptyGroup),
            };
            if error.is_none()
                && let Some(mut g) = self.groups.remove(id.0.as_bytes())
            {
                // Gone for every request from now on, but kept aside until the tombstone is
                // durable, to come back if it cannot be.
                g.cancel_timers(&mut self.core);
                deleted.push(results.len());
                records.push(Record::GroupTombstone { group: g.id.to_string() });
                incarnations.push(g.incarnation);
                self.core.deleting.insert(g.incarnation, g);
            }
            results.push(
                DeletableGroupResult::default()
                    .with_group_id(id.clone())
                    .with_error_code(error.map_or(0, |e| e.code())),
            );
        }
        let response = DeleteGroupsResponse::default().with_results(results);
        if records.is_empty() {
            return self.core.respond(token, ResponseKind::DeleteGroups(response));
        }
        let mut p = PendingPersist::new(Some(token), Answer::Delete(response, deleted));
        p.deleted = incarnations;
        self.core.persist(p, records);
    }

    /// Every group, in no particular order.
    pub fn groups(&self) -> impl Iterator<Item = GroupView<'_>> + '_ {
        self.groups.values().map(view)
    }

    pub fn group(&self, id: &str) -> Option<GroupView<'_>> {
        self.groups.get(id.as_bytes()).map(view)
    }

    /// A group's durable committed offsets: topic, partition, offset, by topic and partition.
    pub fn committed_offsets(&self, group: &str) -> impl Iterator<Item = (&str, i32, &CommittedOffset)> + '_ {
        self.groups.get(group.as_bytes()).into_iter().flat_map(|g| {
            g.offsets
                .iter()
                .flat_map(|(topic, partitions)| partitions.iter().map(move |(&p, c)| (topic.as_str(), p, c)))
        })
    }

    /// Members over all groups, members told MEMBER_ID_REQUIRED included.
    pub fn member_count(&self) -> usize {
        self.core.member_count
    }
}

fn describe(g: &Group) -> DescribedGroup {
    // Member metadata only while Stable, as Kafka does.
    let protocol = g.protocol_name.as_ref().filter(|_| g.is(GroupState::Stable));
    let members = g
        .members_in_order()
        .into_iter()
        .map(|m| {
            DescribedGroupMember::default()
                .with_member_id(m.id.clone())
                .with_group_instance_id(m.instance_id.clone())
                .with_client_id(m.client_id.clone())
                .with_client_host(m.client_host.clone())
                .with_member_assignment(m.assignment.clone())
                .with_member_metadata(protocol.map(|p| m.metadata(p)).unwrap_or_default())
        })
        .collect();
    DescribedGroup::default()
        .with_group_id(GroupId(g.id.clone()))
        .with_group_state(g.state.str_bytes())
        .with_protocol_type(g.protocol_type.clone().unwrap_or_default())
        .with_protocol_data(protocol.cloned().unwrap_or_default())
        .with_members(members)
}

fn view(g: &Group) -> GroupView<'_> {
    GroupView {
        id: &g.id,
        state: g.state,
        protocol_type: g.protocol_type.as_deref(),
        protocol: g.protocol_name.as_deref(),
        generation: g.generation,
        leader: g.leader.as_deref(),
        members: g
            .members_in_order()
            .into_iter()
            .map(|m| MemberView {
                member_id: &m.id,
                group_instance_id: m.instance_id.as_deref(),
                client_id: &m.client_id,
                client_host: &m.client_host,
                assignment: &m.assignment,
            })
            .collect(),
    }
}
