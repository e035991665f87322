//! SyncGroup (v0–v5), as Kafka's `classicGroupSyncToClassicGroup` answers it: followers wait
//! for the leader's assignment; the leader's SyncGroup hands every member its part (an empty
//! one for a member the leader left out) and makes the group Stable.
//!
//! Kafka persists the group's assignment before answering; Silt keeps membership in memory only
//! (see the module documentation of [`group`](super)), so the assignment takes effect at once.

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{SyncGroupRequest, SyncGroupResponse};

use super::event::{GroupState, RequestToken};
use super::rebalance::sync_error;
use super::state::{Group, Waiting};
use super::timer::Timer;
use super::{Coordinator, Core, Waiter};

impl Coordinator {
    /// Handles a SyncGroup of `version`. The answer comes as [`Event::Respond`] for `token`, at
    /// once or when the leader's assignment arrives.
    ///
    /// [`Event::Respond`]: super::Event::Respond
    pub fn handle_sync_group(&mut self, now: Instant, token: RequestToken, version: i16, request: &SyncGroupRequest) {
        let w = Waiting { token: Some(token), version };
        let core = &mut self.core;
        // From v5 both fields are mandatory (Kafka's KafkaApis).
        if version >= 5 && (request.protocol_type.is_none() || request.protocol_name.is_none()) {
            return core.answer_sync(w, sync_error(ResponseError::InconsistentGroupProtocol));
        }
        let group_id = &request.group_id.0;
        if group_id.is_empty() || group_id.len() > core.settings.max_group_id_bytes {
            return core.answer_sync(w, sync_error(ResponseError::InvalidGroupId));
        }
        match self.groups.get_mut(group_id.as_bytes()) {
            Some(group) if !group.is(GroupState::Empty) => group.sync(core, now, w, request),
            _ => core.answer_sync(w, sync_error(ResponseError::UnknownMemberId)),
        }
    }
}

impl Group {
    fn sync(&mut self, core: &mut Core, now: Instant, w: Waiting, r: &SyncGroupRequest) {
        if let Err(e) = self.validate_sync(r) {
            return core.answer_sync(w, sync_error(e));
        }
        let Some(member_id) = self.members.get(r.member_id.as_bytes()).map(|m| m.id.clone()) else {
            return core.answer_sync(w, sync_error(ResponseError::UnknownMemberId));
        };
        match self.state {
            GroupState::PreparingRebalance => core.answer_sync(w, sync_error(ResponseError::RebalanceInProgress)),
            GroupState::CompletingRebalance => {
                let is_leader = self.is_leader(member_id.as_bytes());
                // The leader's assignments are checked before anything changes: one too large
                // fails the leader's SyncGroup, and the others go on waiting (until the sync
                // deadline, as if the leader had not sent it).
                if is_leader && r.assignments.iter().any(|a| a.assignment.len() > core.settings.max_assignment_bytes) {
                    return core.answer_sync(w, sync_error(ResponseError::InvalidRequest));
                }
                if let Some(m) = self.members.get_mut(member_id.as_bytes()) {
                    if let Some(earlier) = m.awaiting_sync.replace(w).and_then(|e| e.token) {
                        core.waiting.remove(&earlier);
                    }
                    core.park(w, Waiter::Sync { group: self.id.clone(), member: member_id.clone() });
                }
                self.remove_pending_sync(core, member_id.as_bytes());
                if is_leader {
                    // Members the leader left out get an empty assignment; entries for
                    // non-members are dropped. Copies: the request frame is not kept.
                    let mut given: HashMap<&[u8], &Bytes> = HashMap::new();
                    for a in &r.assignments {
                        given.insert(a.member_id.as_bytes(), &a.assignment);
                    }
                    for m in self.members.values_mut() {
                        m.assignment =
                            given.get(m.id.as_bytes()).map(|b| Bytes::copy_from_slice(b)).unwrap_or_default();
                    }
                    self.propagate_assignment(core, now, None);
                    self.transition(GroupState::Stable, core.wall(now));
                }
            }
            GroupState::Stable => {
                self.remove_pending_sync(core, member_id.as_bytes());
                let assignment = self.members.get(member_id.as_bytes()).map(|m| m.assignment.clone());
                let response = SyncGroupResponse::default()
                    .with_protocol_type(self.protocol_type.clone())
                    .with_protocol_name(self.protocol_name.clone())
                    .with_assignment(assignment.unwrap_or_default());
                core.answer_sync(w, response);
            }
            GroupState::Empty | GroupState::Dead => core.answer_sync(w, sync_error(ResponseError::UnknownMemberId)),
        }
    }

    /// Kafka's `validateSyncGroup`.
    fn validate_sync(&self, r: &SyncGroupRequest) -> Result<(), ResponseError> {
        self.validate_member(&r.member_id, r.group_instance_id.as_deref())?;
        if r.generation_id != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        let inconsistent = |given: Option<&str>, ours: Option<&str>| given.zip(ours).is_some_and(|(g, o)| g != o);
        if inconsistent(r.protocol_type.as_deref(), self.protocol_type.as_deref())
            || inconsistent(r.protocol_name.as_deref(), self.protocol_name.as_deref())
        {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        Ok(())
    }

    /// Kafka's `removePendingSyncMember`: the wait for SyncGroups ends once every member sent
    /// one.
    fn remove_pending_sync(&mut self, core: &mut Core, member: &[u8]) {
        self.pending_sync.remove(member);
        if self.pending_sync.is_empty() {
            core.timers.clear(&mut self.sync_deadline, Timer::Sync(self.id.clone()));
        }
    }
}
