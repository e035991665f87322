//! The rebalance protocol of a group, as Kafka's `GroupMetadataManager` runs it for classic
//! groups: members join (a join phase, PreparingRebalance), a generation forms and the leader
//! gets the member list (CompletingRebalance), the leader's assignment reaches every member
//! through SyncGroup (Stable). Deadlines: the initial delay of a new group, the rebalance
//! timeout of the join and sync phases, each member's session.
//!
//! Every parked JoinGroup and SyncGroup is answered exactly once: by the phase completing, by an
//! error when a rebalance cuts it short, or with UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID when
//! its member goes.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{JoinGroupResponse, ResponseKind, SyncGroupResponse};
use kafka_protocol::protocol::StrBytes;

use super::event::{Event, GroupState, RequestToken};
use super::state::{Group, JoinKind, Member, Protocol, Waiting};
use super::timer::Timer;
use super::{Core, Waiter};

impl Core {
    /// Answers a JoinGroup (if its connection is still there).
    pub(super) fn answer_join(&mut self, w: Waiting, response: JoinGroupResponse) {
        if let Some(token) = w.token {
            self.waiting.remove(&token);
            self.respond(token, ResponseKind::JoinGroup(join_for_version(w.version, response)));
        }
    }

    pub(super) fn answer_sync(&mut self, w: Waiting, response: SyncGroupResponse) {
        if let Some(token) = w.token {
            self.waiting.remove(&token);
            self.respond(token, ResponseKind::SyncGroup(response));
        }
    }

    pub(super) fn respond(&mut self, token: RequestToken, response: ResponseKind) {
        self.events.push_back(Event::Respond { token, response: Box::new(response) });
    }

    /// Notes where a parked request waits, for [`Coordinator::cancel`](super::Coordinator::cancel).
    pub(super) fn park(&mut self, w: Waiting, waiter: Waiter) {
        if let Some(token) = w.token {
            let earlier = self.waiting.insert(token, waiter);
            debug_assert!(earlier.is_none(), "invariant: tokens are unique among requests in flight");
        }
    }
}

/// A JoinGroup response as Kafka shapes it for `version`: before v7 a missing protocol name is
/// written as "", from v7 an empty one as null.
pub(super) fn join_for_version(version: i16, mut r: JoinGroupResponse) -> JoinGroupResponse {
    if version < 7 && r.protocol_name.is_none() {
        r.protocol_name = Some(StrBytes::default());
    } else if version >= 7 && r.protocol_name.as_deref() == Some("") {
        r.protocol_name = None;
    }
    r
}

/// A JoinGroup error response.
pub(super) fn join_error(member_id: StrBytes, error: ResponseError) -> JoinGroupResponse {
    JoinGroupResponse::default().with_member_id(member_id).with_error_code(error.code()).with_protocol_name(None)
}

pub(super) fn sync_error(error: ResponseError) -> SyncGroupResponse {
    SyncGroupResponse::default().with_error_code(error.code())
}

impl Group {
    fn heartbeat_timer(&self, member: &StrBytes) -> Timer {
        Timer::Heartbeat(self.id.clone(), member.clone())
    }

    /// Restarts `member`'s session deadline at `now + timeout`.
    pub(super) fn reschedule_heartbeat(&mut self, core: &mut Core, now: Instant, member: &StrBytes, timeout: Duration) {
        let timer = self.heartbeat_timer(member);
        if let Some(m) = self.members.get_mut(member.as_bytes()) {
            core.timers.reschedule(&mut m.deadline, now + timeout, timer);
        }
    }

    /// The session deadline of `member`, restarted at `now` (its own session timeout).
    pub(super) fn touch(&mut self, core: &mut Core, now: Instant, member: &StrBytes) {
        if let Some(timeout) = self.members.get(member.as_bytes()).map(|m| m.session_timeout) {
            self.reschedule_heartbeat(core, now, member, timeout);
        }
    }

    /// Kafka's `addMemberThenRebalanceOrCompleteJoin`.
    pub(super) fn add_member(
        &mut self,
        core: &mut Core,
        now: Instant,
        mut member: Member,
        protocol_type: StrBytes,
        w: Waiting,
    ) {
        member.is_new = true;
        if self.members.is_empty() {
            self.protocol_type = Some(protocol_type);
        }
        if self.is(GroupState::PreparingRebalance) && self.previous_state == GroupState::Empty {
            self.new_member_added = true;
        }
        let id = member.id.clone();
        if let Some(instance) = &member.instance_id {
            self.static_members.insert(instance.clone(), id.clone());
        }
        if self.leader.is_none() {
            self.leader = Some(id.clone());
        }
        self.add_supported(&member.protocols);
        match self.pending.remove(id.as_bytes()) {
            // A pending member becomes a member: its deadline to rejoin goes.
            Some(at) => core.timers.cancel(at, self.heartbeat_timer(&id)),
            None => core.member_count += 1,
        }
        member.awaiting_join = Some(w);
        self.awaiting_join += 1;
        core.park(w, Waiter::Join { group: self.id.clone(), member: id.clone() });
        self.members.insert(id.clone(), member);
        // Its session cannot start before its JoinGroup is answered; bound the wait instead.
        self.reschedule_heartbeat(core, now, &id, core.settings.new_member_join_timeout);
        self.maybe_prepare_rebalance_or_complete_join(core, now);
    }

    /// Kafka's `updateMember`: new protocols and timeouts, and the JoinGroup now parked (a
    /// JoinGroup parked before is forgotten, unanswered, as in Kafka).
    pub(super) fn update_member(
        &mut self,
        core: &mut Core,
        id: &StrBytes,
        protocols: Vec<Protocol>,
        rebalance_timeout: Duration,
        session_timeout: Duration,
        w: Option<Waiting>,
    ) {
        let Some(m) = self.members.get_mut(id.as_bytes()) else { return };
        let old = std::mem::replace(&mut m.protocols, protocols);
        m.rebalance_timeout = rebalance_timeout;
        m.session_timeout = session_timeout;
        let was_awaiting = m.awaiting_join.is_some();
        if let Some(earlier) = m.awaiting_join.take().and_then(|e| e.token) {
            core.waiting.remove(&earlier);
        }
        m.awaiting_join = w;
        let new = m.protocols.clone();
        self.remove_supported(&old);
        self.add_supported(&new);
        match (was_awaiting, w) {
            (false, Some(_)) => self.awaiting_join += 1,
            (true, None) => self.awaiting_join -= 1,
            _ => {}
        }
        if let Some(w) = w {
            core.park(w, Waiter::Join { group: self.id.clone(), member: id.clone() });
        }
    }

    /// Kafka's `replaceStaticMember`: the instance's member id becomes `new_id`; requests parked
    /// by the old id are answered FENCED_INSTANCE_ID.
    pub(super) fn replace_static_member(
        &mut self,
        core: &mut Core,
        instance: &StrBytes,
        old_id: &StrBytes,
        new_id: StrBytes,
    ) {
        let Some(mut old) = self.members.remove(old_id.as_bytes()) else { return };
        if let Some(w) = old.awaiting_join.take() {
            self.awaiting_join -= 1;
            core.answer_join(w, join_error(old_id.clone(), ResponseError::FencedInstanceId));
        }
        if let Some(w) = old.awaiting_sync.take() {
            core.answer_sync(w, sync_error(ResponseError::FencedInstanceId));
        }
        core.timers.clear(&mut old.deadline, self.heartbeat_timer(old_id));
        if self.is_leader(old_id.as_bytes()) {
            self.leader = Some(new_id.clone());
        }
        // Kafka leaves the old id among the pending SyncGroups, where it later forces a
        // rebalance no one asked for; the new id takes its place instead.
        if self.pending_sync.remove(old_id.as_bytes()) {
            self.pending_sync.insert(new_id.clone());
        }
        self.static_members.insert(instance.clone(), new_id.clone());
        let member = Member { id: new_id.clone(), awaiting_join: None, awaiting_sync: None, is_new: false, ..old };
        self.members.insert(new_id, member);
    }

    /// Kafka's `ClassicGroup.remove` (of a member or a pending member), answering whatever the
    /// member had parked with UNKNOWN_MEMBER_ID (Kafka's callers answer the JoinGroup so; a
    /// parked SyncGroup it would leave unanswered).
    pub(super) fn remove_member(&mut self, core: &mut Core, id: &[u8]) {
        if let Some((pending, at)) = self.pending.remove_entry(id) {
            core.timers.cancel(at, Timer::Heartbeat(self.id.clone(), pending));
            core.member_count -= 1;
        }
        let Some(mut m) = self.members.remove(id) else { return };
        core.member_count -= 1;
        self.remove_supported(&m.protocols);
        if let Some(w) = m.awaiting_join.take() {
            self.awaiting_join -= 1;
            core.answer_join(w, join_error(StrBytes::default(), ResponseError::UnknownMemberId));
        }
        if let Some(w) = m.awaiting_sync.take() {
            core.answer_sync(w, sync_error(ResponseError::UnknownMemberId));
        }
        if let Some(instance) = &m.instance_id {
            self.static_members.remove(instance.as_bytes());
        }
        core.timers.clear(&mut m.deadline, self.heartbeat_timer(&m.id));
        self.pending_sync.remove(id);
        if self.is_leader(id) {
            self.leader = self.members.values().min_by_key(|m| m.seq).map(|m| m.id.clone());
        }
    }

    /// Kafka's `maybePrepareRebalanceOrCompleteJoin`.
    pub(super) fn maybe_prepare_rebalance_or_complete_join(&mut self, core: &mut Core, now: Instant) {
        if self.can_rebalance() {
            self.prepare_rebalance(core, now);
        } else {
            self.maybe_complete_join_phase(core, now);
        }
    }

    /// Kafka's `maybeCompleteJoinPhase`: ends the join phase once every member rejoined, except
    /// in a new group's initial delay.
    pub(super) fn maybe_complete_join_phase(&mut self, core: &mut Core, now: Instant) {
        if self.is(GroupState::PreparingRebalance)
            && self.previous_state != GroupState::Empty
            && self.has_all_members_joined()
        {
            self.complete_join(core, now);
        }
    }

    /// Kafka's `prepareRebalance`: members waiting for their assignment are told
    /// REBALANCE_IN_PROGRESS, and the join phase starts (with the initial delay for a group
    /// that was empty).
    pub(super) fn prepare_rebalance(&mut self, core: &mut Core, now: Instant) {
        if self.is(GroupState::CompletingRebalance) {
            self.reset_and_propagate_assignment(core, now, ResponseError::RebalanceInProgress);
        }
        self.remove_sync_expiration(core);
        let initial = self.is(GroupState::Empty);
        if initial {
            let delay = core.settings.initial_rebalance_delay;
            let remaining = self.rebalance_timeout().saturating_sub(delay);
            self.join_kind = JoinKind::Initial { delay, remaining };
            core.timers.reschedule(&mut self.join_deadline, now + delay, Timer::Join(self.id.clone()));
        }
        self.transition(GroupState::PreparingRebalance, core.wall(now));
        if !initial {
            if self.has_all_members_joined() {
                self.complete_join(core, now);
            } else {
                self.join_kind = JoinKind::Rebalance;
                let at = now + self.rebalance_timeout();
                core.timers.reschedule(&mut self.join_deadline, at, Timer::Join(self.id.clone()));
            }
        }
    }

    /// Kafka's `completeClassicGroupJoin`: dynamic members that did not rejoin are gone, the next
    /// generation forms with the protocol the members select, every parked JoinGroup is
    /// answered (the leader's with the member list) and the wait for SyncGroups starts.
    pub(super) fn complete_join(&mut self, core: &mut Core, now: Instant) {
        core.timers.clear(&mut self.join_deadline, Timer::Join(self.id.clone()));
        let gone: Vec<StrBytes> = self
            .members
            .values()
            .filter(|m| m.awaiting_join.is_none() && m.instance_id.is_none())
            .map(|m| m.id.clone())
            .collect();
        for id in gone {
            self.remove_member(core, id.as_bytes());
        }
        if !self.maybe_elect_new_joined_leader() && !self.members.is_empty() {
            // Nobody rejoined (only static members are left): wait another rebalance timeout,
            // until sessions remove them.
            self.join_kind = JoinKind::Rebalance;
            let at = now + self.rebalance_timeout();
            core.timers.reschedule(&mut self.join_deadline, at, Timer::Join(self.id.clone()));
            return;
        }
        self.generation = self.generation.wrapping_add(1);
        self.pending_sync.clear();
        if self.members.is_empty() {
            self.protocol_name = None;
            self.transition(GroupState::Empty, core.wall(now));
            return;
        }
        self.protocol_name = self.select_protocol();
        self.transition(GroupState::CompletingRebalance, core.wall(now));
        let leader_members = self.join_members();
        let base = JoinGroupResponse::default()
            .with_generation_id(self.generation)
            .with_protocol_name(self.protocol_name.clone())
            .with_protocol_type(self.protocol_type.clone())
            .with_leader(self.leader.clone().unwrap_or_default());
        let ids: Vec<StrBytes> = self.members_in_order().into_iter().map(|m| m.id.clone()).collect();
        for id in ids {
            let members = if self.is_leader(id.as_bytes()) { leader_members.clone() } else { Vec::new() };
            let response = base.clone().with_member_id(id.clone()).with_members(members);
            let Some(m) = self.members.get_mut(id.as_bytes()) else { continue };
            m.is_new = false;
            if let Some(w) = m.awaiting_join.take() {
                self.awaiting_join -= 1;
                core.answer_join(w, response);
            }
            self.touch(core, now, &id);
            self.pending_sync.insert(id);
        }
        self.sync_generation = self.generation;
        let at = now + self.rebalance_timeout();
        core.timers.reschedule(&mut self.sync_deadline, at, Timer::Sync(self.id.clone()));
    }

    /// Kafka's `maybeElectNewJoinedLeader`: a leader that did not rejoin hands over to a member
    /// that did. False when nobody rejoined.
    fn maybe_elect_new_joined_leader(&mut self) -> bool {
        let Some(leader) = &self.leader else { return false };
        if self.members.get(leader.as_bytes()).is_some_and(|m| m.awaiting_join.is_some()) {
            return true;
        }
        let next = self.members_in_order().into_iter().find(|m| m.awaiting_join.is_some()).map(|m| m.id.clone());
        match next {
            Some(id) => {
                self.leader = Some(id);
                true
            }
            None => false,
        }
    }

    /// Kafka's `resetAndPropagateAssignmentWithError`.
    pub(super) fn reset_and_propagate_assignment(&mut self, core: &mut Core, now: Instant, error: ResponseError) {
        for m in self.members.values_mut() {
            m.assignment = Bytes::new();
        }
        self.propagate_assignment(core, now, Some(error));
    }

    /// Kafka's `propagateAssignment`: every parked SyncGroup gets its member's assignment (or
    /// `error`), and that member's session restarts.
    pub(super) fn propagate_assignment(&mut self, core: &mut Core, now: Instant, error: Option<ResponseError>) {
        let (protocol_type, protocol_name) = match error {
            None => (self.protocol_type.clone(), self.protocol_name.clone()),
            Some(_) => (None, None),
        };
        let code = error.map_or(0, |e| e.code());
        let parked: Vec<StrBytes> =
            self.members.values().filter(|m| m.awaiting_sync.is_some()).map(|m| m.id.clone()).collect();
        for id in parked {
            let Some(m) = self.members.get_mut(id.as_bytes()) else { continue };
            let Some(w) = m.awaiting_sync.take() else { continue };
            let response = SyncGroupResponse::default()
                .with_error_code(code)
                .with_protocol_type(protocol_type.clone())
                .with_protocol_name(protocol_name.clone())
                .with_assignment(m.assignment.clone());
            core.answer_sync(w, response);
            self.touch(core, now, &id);
        }
    }

    /// Kafka's `removeSyncExpiration`.
    fn remove_sync_expiration(&mut self, core: &mut Core) {
        self.pending_sync.clear();
        core.timers.clear(&mut self.sync_deadline, Timer::Sync(self.id.clone()));
    }

    /// Kafka's `removeMemberAndUpdateClassicGroup`: a member that failed (session timeout).
    fn remove_member_and_update(&mut self, core: &mut Core, now: Instant, id: &[u8]) {
        self.remove_member(core, id);
        if matches!(self.state, GroupState::Stable | GroupState::CompletingRebalance) {
            self.maybe_prepare_rebalance_or_complete_join(core, now);
        } else if self.is(GroupState::PreparingRebalance) && self.has_all_members_joined() {
            self.complete_join(core, now);
        }
    }

    /// The join phase's deadline passed: Kafka's `tryCompleteInitialRebalanceElseSchedule` for a
    /// new group, `completeClassicGroupJoin` otherwise.
    pub(super) fn on_join_timer(&mut self, core: &mut Core, now: Instant) {
        self.join_deadline = None;
        match self.join_kind {
            JoinKind::Initial { delay, remaining } if self.new_member_added && !remaining.is_zero() => {
                self.new_member_added = false;
                let next_delay = core.settings.initial_rebalance_delay.min(remaining);
                // Kafka subtracts the delay that just passed, not the next one.
                let next_remaining = remaining.saturating_sub(delay);
                self.join_kind = JoinKind::Initial { delay: next_delay, remaining: next_remaining };
                core.timers.reschedule(&mut self.join_deadline, now + next_delay, Timer::Join(self.id.clone()));
            }
            _ => self.complete_join(core, now),
        }
    }

    /// The wait for SyncGroups ended (Kafka's `expirePendingSync`): members of this generation
    /// that sent none are removed, and the group rebalances.
    pub(super) fn on_sync_timer(&mut self, core: &mut Core, now: Instant) {
        self.sync_deadline = None;
        if self.sync_generation != self.generation
            || !matches!(self.state, GroupState::CompletingRebalance | GroupState::Stable)
            || self.pending_sync.is_empty()
        {
            return;
        }
        let late: Vec<StrBytes> = self.pending_sync.drain().collect();
        for id in late {
            self.remove_member(core, id.as_bytes());
        }
        self.prepare_rebalance(core, now);
    }

    /// A session deadline passed (Kafka's `expireClassicGroupMemberHeartbeat`).
    pub(super) fn on_heartbeat_timer(&mut self, core: &mut Core, now: Instant, id: &StrBytes) {
        if self.pending.remove(id.as_bytes()).is_some() {
            core.member_count -= 1;
            if self.is(GroupState::PreparingRebalance) && self.has_all_members_joined() {
                self.complete_join(core, now);
            }
            return;
        }
        let Some(m) = self.members.get_mut(id.as_bytes()) else { return };
        m.deadline = None;
        // A member parked in a JoinGroup or SyncGroup is alive; the phase it waits for restarts
        // its session when it ends.
        if !m.has_satisfied_heartbeat() {
            self.remove_member_and_update(core, now, id.as_bytes());
        }
    }

    /// Drops every deadline of the group, before it goes.
    pub(super) fn cancel_timers(&mut self, core: &mut Core) {
        core.timers.clear(&mut self.join_deadline, Timer::Join(self.id.clone()));
        core.timers.clear(&mut self.sync_deadline, Timer::Sync(self.id.clone()));
        for (id, at) in self.pending.drain() {
            core.timers.cancel(at, Timer::Heartbeat(self.id.clone(), id));
            core.member_count -= 1;
        }
    }
}
