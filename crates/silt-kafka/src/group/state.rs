//! A group and its members, as Kafka's `ClassicGroup` and `ClassicGroupMember` keep them, and the
//! rules that need nothing but the group: which protocols it supports, which one it selects,
//! whether a member id (and instance id) names a member.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::protocol::StrBytes;
use silt_types::Timestamp;

use super::event::{GroupState, RequestToken};
use super::record::CommittedOffset;

/// A parked request: its token (gone once the connection closed) and version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waiting {
    pub token: Option<RequestToken>,
    pub version: i16,
}

/// A protocol a member offers (JoinGroup), in the member's order of preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Protocol {
    pub name: StrBytes,
    pub metadata: Bytes,
}

pub(super) struct Member {
    pub id: StrBytes,
    pub instance_id: Option<StrBytes>,
    pub client_id: StrBytes,
    pub client_host: StrBytes,
    pub rebalance_timeout: Duration,
    pub session_timeout: Duration,
    pub protocols: Vec<Protocol>,
    pub assignment: Bytes,
    pub awaiting_join: Option<Waiting>,
    pub awaiting_sync: Option<Waiting>,
    /// Joined and not yet through a join phase: its session cannot have started, so a pending
    /// JoinGroup does not keep it alive (Kafka's `isNew`).
    pub is_new: bool,
    /// Session (or new-member join) deadline.
    pub deadline: Option<Instant>,
    /// Order of first join, kept through a static replacement.
    pub seq: u64,
}

impl Member {
    /// Whether a member counts as alive without a heartbeat: one waiting in a JoinGroup or
    /// SyncGroup is (unless it is new).
    pub fn has_satisfied_heartbeat(&self) -> bool {
        !self.is_new && (self.awaiting_join.is_some() || self.awaiting_sync.is_some())
    }

    pub fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|p| *p.name == *protocol).map(|p| p.metadata.clone()).unwrap_or_default()
    }

    /// Its first protocol among `candidates`.
    fn vote<'a>(&'a self, candidates: &HashSet<&str>) -> Option<&'a StrBytes> {
        self.protocols.iter().map(|p| &p.name).find(|n| candidates.contains(n.as_str()))
    }
}

/// How a join phase ends when its deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JoinKind {
    /// The group was empty: wait `delay` more while members keep arriving, `remaining` at most.
    Initial { delay: Duration, remaining: Duration },
    /// Complete with whoever rejoined.
    Rebalance,
}

pub(super) struct Group {
    pub id: StrBytes,
    /// Tells this group apart from an earlier one of the same id that was deleted.
    pub incarnation: u64,
    pub state: GroupState,
    pub previous_state: GroupState,
    /// Wall clock at the last state change (offset retention counts from it).
    pub state_since: Timestamp,
    pub protocol_type: Option<StrBytes>,
    pub protocol_name: Option<StrBytes>,
    pub generation: i32,
    pub leader: Option<StrBytes>,
    pub members: HashMap<StrBytes, Member>,
    /// Group instance id → member id.
    pub static_members: HashMap<StrBytes, StrBytes>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, with their deadline to rejoin.
    pub pending: HashMap<StrBytes, Instant>,
    /// Members with a JoinGroup parked.
    pub awaiting_join: usize,
    /// Protocol name → members offering it.
    pub supported: HashMap<StrBytes, usize>,
    /// Members expected to send SyncGroup in this generation.
    pub pending_sync: HashSet<StrBytes>,
    /// A member joined during the initial delay: extend it.
    pub new_member_added: bool,
    pub join_deadline: Option<Instant>,
    pub join_kind: JoinKind,
    pub sync_deadline: Option<Instant>,
    pub sync_generation: i32,
    /// Durable committed offsets: topic → partition → offset.
    pub offsets: BTreeMap<StrBytes, BTreeMap<i32, CommittedOffset>>,
    /// Persist batches of this group not yet answered: offset retention leaves it alone.
    pub pending_persists: usize,
    /// Rebuilt from persisted offsets: its protocol type is unknown, and retention counts from
    /// the restart.
    pub restored: bool,
}

impl Group {
    pub fn new(id: StrBytes, incarnation: u64, wall: Timestamp) -> Self {
        Self {
            id,
            incarnation,
            state: GroupState::Empty,
            previous_state: GroupState::Dead,
            state_since: wall,
            protocol_type: None,
            protocol_name: None,
            generation: 0,
            leader: None,
            members: HashMap::new(),
            static_members: HashMap::new(),
            pending: HashMap::new(),
            awaiting_join: 0,
            supported: HashMap::new(),
            pending_sync: HashSet::new(),
            new_member_added: false,
            join_deadline: None,
            join_kind: JoinKind::Rebalance,
            sync_deadline: None,
            sync_generation: 0,
            offsets: BTreeMap::new(),
            pending_persists: 0,
            restored: false,
        }
    }

    pub fn is(&self, state: GroupState) -> bool {
        self.state == state
    }

    pub fn transition(&mut self, state: GroupState, wall: Timestamp) {
        self.previous_state = self.state;
        self.state = state;
        self.state_since = wall;
    }

    /// Kafka's `canRebalance`: the states PreparingRebalance may follow.
    pub fn can_rebalance(&self) -> bool {
        matches!(self.state, GroupState::Stable | GroupState::CompletingRebalance | GroupState::Empty)
    }

    pub fn is_leader(&self, member: &[u8]) -> bool {
        self.leader.as_ref().is_some_and(|l| l.as_bytes() == member)
    }

    pub fn has_all_members_joined(&self) -> bool {
        self.members.len() == self.awaiting_join && self.pending.is_empty()
    }

    /// The group's rebalance timeout: the longest of its members'.
    pub fn rebalance_timeout(&self) -> Duration {
        self.members.values().map(|m| m.rebalance_timeout).max().unwrap_or_default()
    }

    /// Whether a member of `protocol_type` offering `protocols` may join: an empty group takes
    /// any non-empty type with at least one protocol, any other group its own type with a
    /// protocol every member offers.
    pub fn supports_protocols<'a>(&self, protocol_type: &str, mut protocols: impl Iterator<Item = &'a str>) -> bool {
        if self.is(GroupState::Empty) {
            return !protocol_type.is_empty() && protocols.next().is_some();
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols.any(|name| self.supported.get(name.as_bytes()) == Some(&self.members.len()))
    }

    /// Kafka's rule: among the protocols every member offers, each member votes for the one it
    /// prefers most, and the most votes win. A tie goes to the protocol the earliest member
    /// prefers (Kafka leaves it to hash order).
    pub fn select_protocol(&self) -> Option<StrBytes> {
        let all = self.members.len();
        let candidates: HashSet<&str> =
            self.supported.iter().filter(|&(_, &n)| n == all).map(|(name, _)| name.as_str()).collect();
        let mut votes: HashMap<&StrBytes, (usize, u64)> = HashMap::new();
        for m in self.members.values() {
            if let Some(name) = m.vote(&candidates) {
                let v = votes.entry(name).or_insert((0, u64::MAX));
                v.0 += 1;
                v.1 = v.1.min(m.seq);
            }
        }
        // Most votes; among equals, the one whose earliest voter joined first.
        votes.into_iter().max_by_key(|&(_, (n, seq))| (n, std::cmp::Reverse(seq))).map(|(name, _)| name.clone())
    }

    /// Kafka's `validateMember`: a static member must be the instance's current member (else
    /// FENCED_INSTANCE_ID), and the member must exist (else UNKNOWN_MEMBER_ID).
    pub fn validate_member(&self, member: &str, instance: Option<&str>) -> Result<(), ResponseError> {
        if let Some(instance) = instance {
            match self.static_members.get(instance.as_bytes()) {
                None => return Err(ResponseError::UnknownMemberId),
                Some(current) if **current != *member => return Err(ResponseError::FencedInstanceId),
                Some(_) => {}
            }
        }
        if !self.members.contains_key(member.as_bytes()) {
            return Err(ResponseError::UnknownMemberId);
        }
        Ok(())
    }

    /// Members in the order they first joined.
    pub fn members_in_order(&self) -> Vec<&Member> {
        let mut members: Vec<&Member> = self.members.values().collect();
        members.sort_unstable_by_key(|m| m.seq);
        members
    }

    /// The member list a leader's JoinGroup response carries: each member with its metadata for
    /// the selected protocol.
    pub fn join_members(&self) -> Vec<JoinGroupResponseMember> {
        let protocol = self.protocol_name.as_deref().unwrap_or("");
        self.members_in_order()
            .into_iter()
            .map(|m| {
                JoinGroupResponseMember::default()
                    .with_member_id(m.id.clone())
                    .with_group_instance_id(m.instance_id.clone())
                    .with_metadata(m.metadata(protocol))
            })
            .collect()
    }

    pub fn add_supported(&mut self, protocols: &[Protocol]) {
        for p in protocols {
            *self.supported.entry(p.name.clone()).or_default() += 1;
        }
    }

    pub fn remove_supported(&mut self, protocols: &[Protocol]) {
        for p in protocols {
            if let Some(n) = self.supported.get_mut(p.name.as_bytes()) {
                *n -= 1;
                if *n == 0 {
                    self.supported.remove(p.name.as_bytes());
                }
            }
        }
    }
}
