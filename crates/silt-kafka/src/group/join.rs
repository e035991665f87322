//! JoinGroup (v0–v7), as Kafka's `GroupCoordinatorService.joinGroup` and
//! `GroupMetadataManager.classicGroupJoinToClassicGroup` answer it.
//!
//! From v4 a dynamic member's first JoinGroup (no member id) is answered MEMBER_ID_REQUIRED with
//! the id it must rejoin with; that pending member holds the join phase up until it rejoins or
//! its session timeout passes. A static member (`group.instance.id`, v5+) that rejoins without
//! a member id takes over its instance's place under a new id: without a rebalance if the group
//! is Stable and the selected protocol stays the same, the old id fenced.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{JoinGroupRequest, JoinGroupResponse};
use kafka_protocol::protocol::StrBytes;

use super::event::{Client, GroupState, RequestToken};
use super::rebalance::join_error;
use super::state::{Group, Member, Protocol, Waiting};
use super::timer::Timer;
use super::{Coordinator, Core, own, truncate};

/// A JoinGroup's fields, checked against the bounds and copied out of the frame.
struct Join {
    member_id: StrBytes,
    instance_id: Option<StrBytes>,
    protocol_type: StrBytes,
    protocols: Vec<Protocol>,
    session_timeout: Duration,
    rebalance_timeout: Duration,
}

impl Coordinator {
    /// Handles a JoinGroup of `version` from `client`. The answer comes as [`Event::Respond`]
    /// for `token`, at once or when the join phase ends.
    ///
    /// [`Event::Respond`]: super::Event::Respond
    pub fn handle_join_group(
        &mut self,
        now: Instant,
        token: RequestToken,
        version: i16,
        client: Client<'_>,
        request: &JoinGroupRequest,
    ) {
        let w = Waiting { token: Some(token), version };
        let join = match self.check_join(version, request) {
            Ok(join) => join,
            Err(e) => return self.core.answer_join(w, join_error(request.member_id.clone(), e)),
        };
        let group_id = request.group_id.0.as_str();
        let created = !self.groups.contains_key(group_id.as_bytes());
        if created {
            // A JoinGroup with a member id for a group that does not exist is answered as
            // Kafka answers it; only a new member creates a group.
            if !join.member_id.is_empty() {
                return self.core.answer_join(w, join_error(join.member_id, ResponseError::UnknownMemberId));
            }
            if self.groups.len() >= self.core.settings.max_groups {
                return self.core.answer_join(w, join_error(join.member_id, ResponseError::CoordinatorNotAvailable));
            }
            let id = own(group_id);
            let group = Group::new(id.clone(), self.core.incarnation(), self.core.wall(now));
            self.groups.insert(id, group);
        }
        let group = self.groups.get_mut(group_id.as_bytes()).expect("invariant: inserted above");
        let core = &mut self.core;
        if !accept_joining_member(group, core, &join) {
            group.remove_member(core, join.member_id.as_bytes());
            return core.answer_join(w, join_error(StrBytes::default(), ResponseError::GroupMaxSizeReached));
        }
        if join.member_id.is_empty() {
            group.join_new_member(core, now, w, client, join);
        } else {
            group.join_existing_member(core, now, w, client, join);
        }
        if created {
            self.drop_if_unused(group_id.as_bytes());
        }
    }

    /// The checks Kafka makes before the group (`GroupCoordinatorService.joinGroup`), and the
    /// bounds on what the member makes the coordinator keep.
    fn check_join(&self, version: i16, r: &JoinGroupRequest) -> Result<Join, ResponseError> {
        let s = &self.core.settings;
        if r.group_id.0.is_empty() || r.group_id.0.len() > s.max_group_id_bytes {
            return Err(ResponseError::InvalidGroupId);
        }
        let session = u64::try_from(r.session_timeout_ms).map(Duration::from_millis).unwrap_or_default();
        if r.session_timeout_ms < 0 || session < s.min_session_timeout || session > s.max_session_timeout {
            return Err(ResponseError::InvalidSessionTimeout);
        }
        // v0 has no rebalance timeout: the session timeout serves (Kafka's JoinGroupRequest).
        let rebalance_ms = if version == 0 { r.session_timeout_ms } else { r.rebalance_timeout_ms };
        let rebalance = Duration::from_millis(u64::try_from(rebalance_ms).unwrap_or(0));
        let names_too_long = r.protocol_type.len() > s.max_name_bytes
            || r.group_instance_id.as_ref().is_some_and(|i| i.len() > s.max_name_bytes)
            || r.protocols.iter().any(|p| p.name.len() > s.max_name_bytes);
        let metadata: usize = r.protocols.iter().map(|p| p.metadata.len()).sum();
        if names_too_long || r.protocols.len() > s.max_protocols || metadata > s.max_member_metadata_bytes {
            return Err(ResponseError::InvalidRequest);
        }
        // A protocol named twice would count twice towards "every member supports it".
        if r.protocols.iter().enumerate().any(|(i, p)| r.protocols[..i].iter().any(|q| q.name == p.name)) {
            return Err(ResponseError::InvalidRequest);
        }
        Ok(Join {
            member_id: r.member_id.clone(),
            instance_id: r.group_instance_id.as_deref().map(own),
            protocol_type: own(&r.protocol_type),
            protocols: r
                .protocols
                .iter()
                .map(|p| Protocol { name: own(&p.name), metadata: Bytes::copy_from_slice(&p.metadata) })
                .collect(),
            session_timeout: session,
            rebalance_timeout: rebalance,
        })
    }
}

/// Kafka's `acceptJoiningMember`, with Silt's bound on members over all groups (which a member
/// already counted, and a static member taking its instance's place back, pass).
fn accept_joining_member(group: &Group, core: &Core, join: &Join) -> bool {
    let max = core.settings.max_group_size;
    let member_id = &join.member_id;
    let known = group.members.get(member_id.as_bytes());
    let accepted = match group.state {
        GroupState::Empty | GroupState::Dead => true,
        // The awaiting count, not the size: the group may be over a lowered limit, and the last
        // to rejoin are the ones left out.
        GroupState::PreparingRebalance => known.is_some_and(|m| m.awaiting_join.is_some()) || group.awaiting_join < max,
        GroupState::CompletingRebalance | GroupState::Stable => known.is_some() || group.members.len() < max,
    };
    let counted = known.is_some()
        || group.pending.contains_key(member_id.as_bytes())
        || join.instance_id.as_ref().is_some_and(|i| group.static_members.contains_key(i.as_bytes()));
    accepted && (counted || core.member_count < core.settings.max_members)
}

impl Group {
    /// Kafka's `classicGroupJoinNewMember`.
    fn join_new_member(&mut self, core: &mut Core, now: Instant, w: Waiting, client: Client<'_>, join: Join) {
        if !self.supports_protocols(&join.protocol_type, join.protocols.iter().map(|p| p.name.as_str())) {
            return core.answer_join(w, join_error(StrBytes::default(), ResponseError::InconsistentGroupProtocol));
        }
        let prefix = match &join.instance_id {
            Some(instance) => instance.as_str(),
            None => truncate(client.client_id, core.settings.max_name_bytes),
        };
        let new_id = core.member_id(prefix);
        if let Some(instance) = join.instance_id.clone() {
            match self.static_members.get(instance.as_bytes()).cloned() {
                Some(old_id) => self.rejoin_static_member(core, now, w, &instance, &old_id, new_id, join),
                None => {
                    let protocol_type = join.protocol_type.clone();
                    let member = new_member(core, new_id, client, join);
                    self.add_member(core, now, member, protocol_type, w)
                }
            }
        } else if w.version >= 4 {
            // The member must rejoin with this id; until then it holds the join phase up, for
            // its session timeout at most.
            if self.pending.len() + self.members.len() >= core.settings.max_group_size {
                return core.answer_join(w, join_error(StrBytes::default(), ResponseError::GroupMaxSizeReached));
            }
            let at = now + join.session_timeout;
            core.timers.schedule(at, Timer::Heartbeat(self.id.clone(), new_id.clone()));
            self.pending.insert(new_id.clone(), at);
            core.member_count += 1;
            core.answer_join(w, join_error(new_id, ResponseError::MemberIdRequired));
        } else {
            let protocol_type = join.protocol_type.clone();
            let member = new_member(core, new_id, client, join);
            self.add_member(core, now, member, protocol_type, w);
        }
    }

    /// Kafka's `classicGroupJoinExistingMember`.
    fn join_existing_member(&mut self, core: &mut Core, now: Instant, w: Waiting, client: Client<'_>, join: Join) {
        let id = join.member_id.clone();
        if !self.supports_protocols(&join.protocol_type, join.protocols.iter().map(|p| p.name.as_str())) {
            return core.answer_join(w, join_error(id, ResponseError::InconsistentGroupProtocol));
        }
        if self.pending.contains_key(id.as_bytes()) {
            if join.instance_id.is_some() {
                // Kafka fails the operation here (a pending member is never static).
                return core.answer_join(w, join_error(id, ResponseError::UnknownServerError));
            }
            let protocol_type = join.protocol_type.clone();
            let member = new_member(core, own(&id), client, join);
            return self.add_member(core, now, member, protocol_type, w);
        }
        if let Err(e) = self.validate_member(&id, join.instance_id.as_deref()) {
            return core.answer_join(w, join_error(id, e));
        }
        let Some(m) = self.members.get(id.as_bytes()) else {
            return core.answer_join(w, join_error(id, ResponseError::UnknownMemberId));
        };
        let matches = m.protocols == join.protocols;
        let member_id = m.id.clone();
        let update = match self.state {
            GroupState::PreparingRebalance => true,
            GroupState::CompletingRebalance => !matches,
            // The leader's JoinGroup always rebalances (it may have seen topic metadata change).
            GroupState::Stable => self.is_leader(id.as_bytes()) || !matches,
            GroupState::Empty | GroupState::Dead => {
                return core.answer_join(w, join_error(id, ResponseError::UnknownMemberId));
            }
        };
        if update {
            self.update_member(core, &member_id, join.protocols, join.rebalance_timeout, join.session_timeout, Some(w));
            return self.maybe_prepare_rebalance_or_complete_join(core, now);
        }
        // Same metadata (its last response may have been lost): the current generation again,
        // with the member list for the leader.
        let members = if self.is_leader(id.as_bytes()) { self.join_members() } else { Vec::new() };
        let response = self.current_generation(member_id).with_members(members);
        core.answer_join(w, response);
    }

    /// Kafka's `updateStaticMemberThenRebalanceOrCompleteJoin`: `old_id`'s instance rejoined
    /// without a member id.
    #[allow(clippy::too_many_arguments)]
    fn rejoin_static_member(
        &mut self,
        core: &mut Core,
        now: Instant,
        w: Waiting,
        instance: &StrBytes,
        old_id: &StrBytes,
        new_id: StrBytes,
        join: Join,
    ) {
        let current_leader = self.leader.clone();
        self.replace_static_member(core, instance, old_id, new_id.clone());
        self.touch(core, now, &new_id);
        self.update_member(core, &new_id, join.protocols, join.rebalance_timeout, join.session_timeout, Some(w));
        match self.state {
            GroupState::Stable if self.select_protocol() == self.protocol_name => {
                // No rebalance. Before JoinGroup v9 the response names the leader as it was,
                // so that a leader coming back acts as a follower and keeps the assignment.
                let response = self.current_generation(new_id.clone()).with_leader(current_leader.unwrap_or_default());
                if let Some(m) = self.members.get_mut(new_id.as_bytes())
                    && let Some(w) = m.awaiting_join.take()
                {
                    self.awaiting_join -= 1;
                    core.answer_join(w, response);
                }
            }
            GroupState::Stable => self.maybe_prepare_rebalance_or_complete_join(core, now),
            // The leader may already have assigned under the old id: rebalance.
            GroupState::CompletingRebalance => self.prepare_rebalance(core, now),
            _ => self.maybe_complete_join_phase(core, now),
        }
    }

    /// A JoinGroup response for the current generation (no members).
    fn current_generation(&self, member_id: StrBytes) -> JoinGroupResponse {
        JoinGroupResponse::default()
            .with_member_id(member_id)
            .with_generation_id(self.generation)
            .with_protocol_name(self.protocol_name.clone())
            .with_protocol_type(self.protocol_type.clone())
            .with_leader(self.leader.clone().unwrap_or_default())
    }
}

fn new_member(core: &mut Core, id: StrBytes, client: Client<'_>, join: Join) -> Member {
    let max = core.settings.max_name_bytes;
    Member {
        id,
        instance_id: join.instance_id,
        client_id: own(truncate(client.client_id, max)),
        client_host: own(truncate(client.client_host, max)),
        rebalance_timeout: join.rebalance_timeout,
        session_timeout: join.session_timeout,
        protocols: join.protocols,
        assignment: Bytes::new(),
        awaiting_join: None,
        awaiting_sync: None,
        is_new: true,
        deadline: None,
        seq: core.seq(),
    }
}
