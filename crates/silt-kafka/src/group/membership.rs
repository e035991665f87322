//! Heartbeat (v0–v4) and LeaveGroup (v0–v4; a batch of members from v3), as Kafka's
//! `classicGroupHeartbeatToClassicGroup` and `classicGroupLeaveToClassicGroup` answer them.
//! Both answer at once; a LeaveGroup may also end a join phase and so answer other members'
//! parked JoinGroups (as events).

use std::time::Instant;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse, LeaveGroupRequest, LeaveGroupResponse};

use super::Coordinator;
use super::event::GroupState;

impl Coordinator {
    /// Handles a Heartbeat: the member's session restarts; during a rebalance it is told
    /// REBALANCE_IN_PROGRESS, so that it rejoins.
    pub fn handle_heartbeat(&mut self, now: Instant, _version: i16, r: &HeartbeatRequest) -> HeartbeatResponse {
        let answer = |e: ResponseError| HeartbeatResponse::default().with_error_code(e.code());
        let group_id = &r.group_id.0;
        if group_id.is_empty() || group_id.len() > self.core.settings.max_group_id_bytes {
            return answer(ResponseError::InvalidGroupId);
        }
        let Some(group) = self.groups.get_mut(group_id.as_bytes()) else {
            return answer(ResponseError::UnknownMemberId);
        };
        if let Err(e) = group.validate_member(&r.member_id, r.group_instance_id.as_deref()) {
            return answer(e);
        }
        if r.generation_id != group.generation {
            return answer(ResponseError::IllegalGeneration);
        }
        let Some(member) = group.members.get(r.member_id.as_bytes()).map(|m| m.id.clone()) else {
            return answer(ResponseError::UnknownMemberId);
        };
        match group.state {
            GroupState::Empty | GroupState::Dead => answer(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => {
                group.touch(&mut self.core, now, &member);
                answer(ResponseError::RebalanceInProgress)
            }
            // A member may heartbeat between its JoinGroup and SyncGroup answers.
            GroupState::CompletingRebalance | GroupState::Stable => {
                group.touch(&mut self.core, now, &member);
                HeartbeatResponse::default()
            }
        }
    }

    /// Handles a LeaveGroup: each member named leaves (a static one may be named by instance id
    /// alone, as admin tools do), and the group rebalances. Before v3 the request names one
    /// member and the answer carries its error at the top.
    pub fn handle_leave_group(&mut self, now: Instant, version: i16, r: &LeaveGroupRequest) -> LeaveGroupResponse {
        let members: Vec<MemberIdentity> = if version >= 3 {
            r.members.clone()
        } else {
            vec![MemberIdentity::default().with_member_id(r.member_id.clone())]
        };
        let response = self.leave(now, &r.group_id.0, &members);
        if version >= 3 {
            return response;
        }
        let code = match response.error_code {
            0 => response.members.iter().map(|m| m.error_code).find(|&c| c != 0).unwrap_or(0),
            top => top,
        };
        LeaveGroupResponse::default().with_error_code(code)
    }

    fn leave(&mut self, now: Instant, group_id: &str, members: &[MemberIdentity]) -> LeaveGroupResponse {
        if group_id.is_empty() || group_id.len() > self.core.settings.max_group_id_bytes {
            return LeaveGroupResponse::default().with_error_code(ResponseError::InvalidGroupId.code());
        }
        let answer = |m: &MemberIdentity, e: Option<ResponseError>| {
            MemberResponse::default()
                .with_member_id(m.member_id.clone())
                .with_group_instance_id(m.group_instance_id.clone())
                .with_error_code(e.map_or(0, |e| e.code()))
        };
        let Some(group) = self.groups.get_mut(group_id.as_bytes()) else {
            let all = members.iter().map(|m| answer(m, Some(ResponseError::UnknownMemberId))).collect();
            return LeaveGroupResponse::default().with_members(all);
        };
        let core = &mut self.core;
        let mut left = false;
        let mut responses = Vec::with_capacity(members.len());
        for m in members {
            let outcome = if m.member_id.is_empty() {
                // By instance id alone.
                let current =
                    m.group_instance_id.as_ref().and_then(|i| group.static_members.get(i.as_bytes())).cloned();
                match current {
                    Some(id) => {
                        group.remove_member(core, id.as_bytes());
                        Ok(())
                    }
                    None => Err(ResponseError::UnknownMemberId),
                }
            } else if group.pending.contains_key(m.member_id.as_bytes()) {
                group.remove_member(core, m.member_id.as_bytes());
                Ok(())
            } else {
                group.validate_member(&m.member_id, m.group_instance_id.as_deref()).map(|()| {
                    group.remove_member(core, m.member_id.as_bytes());
                })
            };
            left |= outcome.is_ok();
            responses.push(answer(m, outcome.err()));
        }
        if left {
            match group.state {
                GroupState::Stable | GroupState::CompletingRebalance => {
                    group.maybe_prepare_rebalance_or_complete_join(core, now)
                }
                GroupState::PreparingRebalance => group.maybe_complete_join_phase(core, now),
                GroupState::Empty | GroupState::Dead => {}
            }
        }
        LeaveGroupResponse::default().with_members(responses)
    }
}
