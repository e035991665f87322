//! Committed offsets: OffsetCommit (v2–v8) and OffsetFetch (v1–v7) as Kafka's
//! `OffsetMetadataManager` answers them, their durability, offset retention, and restoring
//! them at start-up.
//!
//! A commit is validated against the group (its generation and member; an empty group takes
//! "simple" commits with generation -1, creating the group if need be), its records go out in
//! an [`Event::Persist`](super::Event::Persist), and only once the driver reports them durable
//! are they applied and the OffsetCommit answered. OffsetFetch therefore never shows an offset
//! a crash could take back.
//!
//! Ordering: memory is always what replaying the log would give. A commit's records are
//! applied when durable, so a group deleted (or its offsets expired) after the commit was
//! raised must not see it applied to what came after: a deleted group is set aside until its
//! tombstone is durable (a commit of it still in flight lands there, and goes with it), a group
//! of the same id created meanwhile is another incarnation, and retention leaves groups with
//! commits in flight alone.

use std::collections::HashMap;
use std::time::Instant;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{OffsetFetchResponsePartition, OffsetFetchResponseTopic};
use kafka_protocol::messages::{
    DeleteGroupsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    ResponseKind,
};
use kafka_protocol::protocol::StrBytes;
use silt_types::Timestamp;

use super::event::{Event, GroupState, PersistId, RequestToken};
use super::record::{CommittedOffset, Record};
use super::state::Group;
use super::{Coordinator, Core, Waiter, own};

/// A batch of records raised and not yet reported durable.
pub(super) struct PendingPersist {
    pub id: PersistId,
    /// The request answered once the batch is durable (gone if its connection closed).
    pub token: Option<RequestToken>,
    pub answer: Answer,
    /// The group whose commits these are: (id, incarnation).
    pub group: Option<(StrBytes, u64)>,
    /// Offsets to apply once durable: topic, partition, offset.
    pub commits: Vec<(StrBytes, i32, CommittedOffset)>,
    /// Incarnations of the groups this batch deletes (kept aside in [`Core::deleting`] until
    /// it is durable).
    pub deleted: Vec<u64>,
}

pub(super) enum Answer {
    None,
    /// The response, and the (topic, partition) positions in it the coordinator decided: they
    /// get the error if the batch fails (as Kafka answers a failed write).
    Commit(OffsetCommitResponse, Vec<(usize, usize)>),
    /// The response, and the positions of the groups deleted.
    Delete(DeleteGroupsResponse, Vec<usize>),
}

impl Coordinator {
    /// Handles an OffsetCommit of `version`. `check` is asked about each topic-partition first
    /// and may refuse it with an error (UNKNOWN_TOPIC_OR_PARTITION for one that does not exist,
    /// TOPIC_AUTHORIZATION_FAILED): what Kafka's KafkaApis checks before the coordinator. The
    /// answer comes as [`Event::Respond`] for `token`: at once when nothing is to be persisted,
    /// otherwise after [`Coordinator::handle_persisted`].
    pub fn handle_offset_commit(
        &mut self,
        now: Instant,
        token: RequestToken,
        version: i16,
        r: &OffsetCommitRequest,
        check: impl FnMut(&str, i32) -> Option<ResponseError>,
    ) {
        self.commit(now, token, version, r, check, false);
    }

    /// Applies the offsets a committed transaction staged (TxnOffsetCommit) to the group `r`
    /// names, whatever its generation now (they were checked when staged, and the transaction
    /// is decided): as Kafka writes a transaction's offsets when its commit marker lands. The
    /// answer, like an OffsetCommit's, comes for `token` once the records are durable.
    pub fn handle_transaction_offsets(&mut self, now: Instant, token: RequestToken, r: &OffsetCommitRequest) {
        self.commit(now, token, 8, r, |_, _| None, true);
    }

    fn commit(
        &mut self,
        now: Instant,
        token: RequestToken,
        version: i16,
        r: &OffsetCommitRequest,
        mut check: impl FnMut(&str, i32) -> Option<ResponseError>,
        transactional: bool,
    ) {
        let mut response = OffsetCommitResponse::default();
        // Positions that passed `check`, for the coordinator to decide.
        let mut accepted = Vec::new();
        for (t, topic) in r.topics.iter().enumerate() {
            let mut partitions = Vec::with_capacity(topic.partitions.len());
            for (p, partition) in topic.partitions.iter().enumerate() {
                let error = check(&topic.name.0, partition.partition_index);
                if error.is_none() {
                    accepted.push((t, p));
                }
                partitions.push(
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(partition.partition_index)
                        .with_error_code(error.map_or(0, |e| e.code())),
                );
            }
            response
                .topics
                .push(OffsetCommitResponseTopic::default().with_name(topic.name.clone()).with_partitions(partitions));
        }
        if accepted.is_empty() {
            return self.core.respond(token, ResponseKind::OffsetCommit(response));
        }
        let fail = |mut response: OffsetCommitResponse, e: ResponseError| {
            for &(t, p) in &accepted {
                response.topics[t].partitions[p].error_code = e.code();
            }
            ResponseKind::OffsetCommit(response)
        };
        let created = !self.groups.contains_key(r.group_id.0.as_bytes());
        let core = &mut self.core;
        let group = match commit_target(&mut self.groups, core, now, r, transactional) {
            Ok(group) => group,
            Err(e) => return core.respond(token, fail(response, e)),
        };
        // Commits keep a member alive while the group is Stable or rebalancing.
        if matches!(group.state, GroupState::Stable | GroupState::PreparingRebalance)
            && let Some(id) = group.members.get(r.member_id.as_bytes()).map(|m| m.id.clone())
        {
            group.touch(core, now, &id);
        }
        let wall = core.wall(now);
        // v2–v4 may carry a retention of their own (-1: the broker's).
        let expire_timestamp =
            (version <= 4 && r.retention_time_ms != -1).then(|| Timestamp(wall.0.saturating_add(r.retention_time_ms)));
        let mut commits = Vec::new();
        let mut records = Vec::new();
        for &(t, p) in &accepted {
            let topic = &r.topics[t];
            let partition = &topic.partitions[p];
            let metadata = partition.committed_metadata.as_deref().unwrap_or("");
            if metadata.len() > core.settings.max_offset_metadata_bytes {
                response.topics[t].partitions[p].error_code = ResponseError::OffsetMetadataTooLarge.code();
                continue;
            }
            let offset = CommittedOffset {
                offset: partition.committed_offset,
                leader_epoch: partition.committed_leader_epoch,
                metadata: metadata.to_owned(),
                commit_timestamp: wall,
                expire_timestamp,
            };
            records.push(Record::Commit {
                group: group.id.to_string(),
                topic: topic.name.0.to_string(),
                partition: partition.partition_index,
                offset: offset.clone(),
            });
            commits.push((own(&topic.name.0), partition.partition_index, offset));
        }
        if records.is_empty() {
            core.respond(token, ResponseKind::OffsetCommit(response));
            if created {
                self.drop_if_unused(r.group_id.0.as_bytes());
            }
            return;
        }
        group.pending_persists += 1;
        let mut p = PendingPersist::new(Some(token), Answer::Commit(response, accepted));
        p.group = Some((group.id.clone(), group.incarnation));
        p.commits = commits;
        core.persist(p, records);
    }

    /// Handles an OffsetFetch of `version` (1–7): the group's durable offsets for the
    /// partitions named, or for all it has (`topics` null, v2+); -1 where none is committed.
    pub fn handle_offset_fetch(&self, _version: i16, r: &OffsetFetchRequest) -> OffsetFetchResponse {
        let group = self.groups.get(r.group_id.0.as_bytes());
        let partition = |index: i32, c: Option<&CommittedOffset>| {
            let none = OffsetFetchResponsePartition::default().with_partition_index(index).with_committed_offset(-1);
            match c {
                None => none,
                Some(c) => none
                    .with_committed_offset(c.offset)
                    .with_committed_leader_epoch(c.leader_epoch)
                    .with_metadata(Some(StrBytes::from_string(c.metadata.clone()))),
            }
        };
        let topics = match &r.topics {
            Some(topics) => topics
                .iter()
                .map(|t| {
                    let committed = group.and_then(|g| g.offsets.get(t.name.0.as_bytes()));
                    let partitions =
                        t.partition_indexes.iter().map(|&i| partition(i, committed.and_then(|c| c.get(&i)))).collect();
                    OffsetFetchResponseTopic::default().with_name(t.name.clone()).with_partitions(partitions)
                })
                .collect(),
            None => group
                .into_iter()
                .flat_map(|g| &g.offsets)
                .map(|(topic, committed)| {
                    let partitions = committed.iter().map(|(&i, c)| partition(i, Some(c))).collect();
                    OffsetFetchResponseTopic::default().with_name(topic.clone().into()).with_partitions(partitions)
                })
                .collect(),
        };
        OffsetFetchResponse::default().with_topics(topics)
    }

    /// The records of batch `id` and of every batch raised before it are durable: their offsets
    /// are applied and their requests answered, in order. Outcomes are reported in the order the
    /// batches were raised (as an append-only log learns them): a batch that failed is reported
    /// ([`Coordinator::handle_persist_failed`]) before any later one is reported durable.
    pub fn handle_persisted(&mut self, id: PersistId) {
        while self.core.persists.front().is_some_and(|p| p.id <= id) {
            let Some(p) = self.core.persists.pop_front() else { break };
            if let Some(group) = self.commit_group(&p) {
                group.pending_persists -= 1;
                for (topic, partition, offset) in p.commits {
                    group.offsets.entry(topic).or_default().insert(partition, offset);
                }
            }
            for incarnation in &p.deleted {
                self.core.deleting.remove(incarnation);
            }
            self.core.answer_persist(p.token, p.answer, None);
        }
    }

    /// Batch `id`, the oldest not yet answered, could not be made durable: its requests are
    /// answered COORDINATOR_NOT_AVAILABLE (clients retry), as Kafka answers a failed write, and
    /// memory stays what replaying the log gives: its offsets are not applied, and a group it
    /// deleted comes back (its offsets merged under any group of the same id created since,
    /// which win where both have one).
    pub fn handle_persist_failed(&mut self, id: PersistId) {
        debug_assert!(
            self.core.persists.front().is_none_or(|p| p.id == id),
            "persist outcomes are reported in the order the batches were raised"
        );
        let Some(at) = self.core.persists.iter().position(|p| p.id == id) else { return };
        let Some(p) = self.core.persists.remove(at) else { return };
        if let Some(group) = self.commit_group(&p) {
            group.pending_persists -= 1;
        }
        for incarnation in &p.deleted {
            let Some(old) = self.core.deleting.remove(incarnation) else { continue };
            // Its offsets are in the log, and stay there until the next tombstone of that id:
            // that of the next deletion of the id, which is still set aside (outcomes come in
            // order). They merge into that group, and go or come back with it; with no later
            // deletion, into the group in place. No commit of its own is still in flight: those
            // were raised before this batch, and are answered by now.
            let next = self
                .core
                .deleting
                .values()
                .filter(|g| g.id == old.id && g.incarnation > old.incarnation)
                .map(|g| g.incarnation)
                .min();
            let latest = match next {
                Some(next) => self.core.deleting.get_mut(&next),
                None => self.groups.get_mut(old.id.as_bytes()),
            };
            let Some(latest) = latest else {
                self.groups.insert(old.id.clone(), old);
                continue;
            };
            for (topic, partitions) in old.offsets {
                let merged = latest.offsets.entry(topic).or_default();
                for (partition, offset) in partitions {
                    merged.entry(partition).or_insert(offset);
                }
            }
        }
        self.core.answer_persist(p.token, p.answer, Some(ResponseError::CoordinatorNotAvailable));
    }

    /// The group batch `p` commits to: the one of its incarnation, in place or set aside by a
    /// deletion not yet durable. None if it was deleted since.
    fn commit_group(&mut self, p: &PendingPersist) -> Option<&mut Group> {
        let (id, incarnation) = p.group.as_ref()?;
        match self.groups.get_mut(id.as_bytes()) {
            Some(g) if g.incarnation == *incarnation => Some(g),
            _ => self.core.deleting.get_mut(incarnation),
        }
    }

    /// Replays one persisted record, in the order they were persisted (start-up). Groups
    /// restored are Empty, of unknown protocol type, and their offsets' retention counts from
    /// now: after a restart an offset never expires sooner than Kafka would expire it.
    pub fn restore(&mut self, record: Record) {
        match record {
            Record::Commit { group, topic, partition, offset } => {
                let id = StrBytes::from_string(group);
                if !self.groups.contains_key(id.as_bytes()) {
                    let mut g = Group::new(id.clone(), self.core.incarnation(), self.core.started_wall);
                    g.restored = true;
                    self.groups.insert(id.clone(), g);
                }
                let g = self.groups.get_mut(id.as_bytes()).expect("invariant: present or inserted above");
                g.offsets.entry(StrBytes::from_string(topic)).or_default().insert(partition, offset);
            }
            Record::OffsetTombstone { group, topic, partition } => {
                let Some(g) = self.groups.get_mut(group.as_bytes()) else { return };
                let emptied = g.offsets.get_mut(topic.as_bytes()).is_some_and(|t| {
                    t.remove(&partition);
                    t.is_empty()
                });
                if emptied {
                    g.offsets.remove(topic.as_bytes());
                }
                // A restored group is its offsets: without them it is gone (retention removed
                // it in the run that wrote the tombstones).
                if g.offsets.is_empty()
                    && let Some(mut g) = self.groups.remove(group.as_bytes())
                {
                    g.cancel_timers(&mut self.core);
                }
            }
            Record::GroupTombstone { group } => {
                if let Some(mut g) = self.groups.remove(group.as_bytes()) {
                    g.cancel_timers(&mut self.core);
                }
            }
        }
    }

    /// Every committed offset held, as records: persisted alone, in place of all records before
    /// them, they restore the same offsets (for the driver to compact its log).
    pub fn snapshot(&self) -> impl Iterator<Item = Record> + '_ {
        self.groups.values().flat_map(|g| {
            g.offsets.iter().flat_map(move |(topic, partitions)| {
                partitions.iter().map(move |(&partition, offset)| Record::Commit {
                    group: g.id.to_string(),
                    topic: topic.to_string(),
                    partition,
                    offset: offset.clone(),
                })
            })
        })
    }

    /// Offset retention (Kafka's `cleanupGroupMetadata`): offsets of an empty group expire
    /// `offsets_retention` after it became empty (a group that never had members: after each
    /// commit; an explicit expiry from OffsetCommit v2–v4 wins), and an empty group left without
    /// offsets goes. Groups with commits in flight wait for the next round. Kafka also expires,
    /// in a Stable consumer group, offsets of topics no member subscribes to; Silt does not read
    /// subscriptions and keeps them.
    pub(super) fn expire_offsets(&mut self, now: Instant) {
        let wall = self.core.wall(now);
        let retention = i64::try_from(self.core.settings.offsets_retention.as_millis()).unwrap_or(i64::MAX);
        let mut records = Vec::new();
        let mut gone = Vec::new();
        for g in self.groups.values_mut() {
            if !g.is(GroupState::Empty) || g.pending_persists > 0 {
                continue;
            }
            // A group that had members counts from when it became empty; so does a restored
            // one (whose history is unknown), from the restart.
            let since_empty = (g.protocol_type.is_some() || g.restored).then_some(g.state_since);
            for (topic, partitions) in g.offsets.iter_mut() {
                partitions.retain(|&partition, c| {
                    let expired = match c.expire_timestamp {
                        Some(at) => wall.0 >= at.0,
                        None => wall.0.saturating_sub(since_empty.unwrap_or(c.commit_timestamp).0) >= retention,
                    };
                    if expired {
                        let (group, topic) = (g.id.to_string(), topic.to_string());
                        records.push(Record::OffsetTombstone { group, topic, partition });
                    }
                    !expired
                });
            }
            g.offsets.retain(|_, partitions| !partitions.is_empty());
            if g.offsets.is_empty() {
                gone.push(g.id.clone());
            }
        }
        for id in gone {
            if let Some(mut g) = self.groups.remove(id.as_bytes()) {
                g.cancel_timers(&mut self.core);
            }
        }
        if !records.is_empty() {
            self.core.persist(PendingPersist::new(None, Answer::None), records);
        }
    }
}

/// Kafka's `validateOffsetCommit`: the group the commit goes to, created for a simple commit
/// (generation < 0) if it does not exist.
fn commit_target<'a>(
    groups: &'a mut HashMap<StrBytes, Group>,
    core: &mut Core,
    now: Instant,
    r: &OffsetCommitRequest,
    transactional: bool,
) -> Result<&'a mut Group, ResponseError> {
    // Only a null group id is refused by Kafka (v2–v8 cannot send one); "" is a group.
    let group_id = &r.group_id.0;
    if group_id.len() > core.settings.max_group_id_bytes {
        return Err(ResponseError::InvalidGroupId);
    }
    let generation = r.generation_id_or_member_epoch;
    if !groups.contains_key(group_id.as_bytes()) {
        if generation >= 0 && !transactional {
            // Kafka answers v9+ GROUP_ID_NOT_FOUND; v2–v8 (all served here) get this.
            return Err(ResponseError::IllegalGeneration);
        }
        if groups.len() >= core.settings.max_groups {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        let group = Group::new(own(group_id), core.incarnation(), core.wall(now));
        groups.insert(group.id.clone(), group);
    }
    let group = groups.get_mut(group_id.as_bytes()).expect("invariant: present or inserted above");
    if transactional {
        return Ok(group);
    }
    let instance = r.group_instance_id.as_deref();
    if generation < 0 && group.is(GroupState::Empty) {
        return Ok(group);
    }
    if generation >= 0 || !r.member_id.is_empty() || instance.is_some() {
        group.validate_member(&r.member_id, instance)?;
        if generation != group.generation {
            return Err(ResponseError::IllegalGeneration);
        }
    } else if !group.is(GroupState::Empty) {
        // No member id and no generation: only an empty group takes it.
        return Err(ResponseError::UnknownMemberId);
    }
    if group.is(GroupState::CompletingRebalance) {
        // Its member and generation are right, but its assignment is not out yet.
        return Err(ResponseError::RebalanceInProgress);
    }
    Ok(group)
}

impl PendingPersist {
    pub(super) fn new(token: Option<RequestToken>, answer: Answer) -> Self {
        Self { id: PersistId(0), token, answer, group: None, commits: Vec::new(), deleted: Vec::new() }
    }
}

impl Core {
    /// Raises persist batch `p` (its id is given here) of `records`.
    pub(super) fn persist(&mut self, mut p: PendingPersist, records: Vec<Record>) {
        self.next_persist += 1;
        p.id = PersistId(self.next_persist);
        if let Some(token) = p.token {
            let earlier = self.waiting.insert(token, Waiter::Persist(p.id));
            debug_assert!(earlier.is_none(), "invariant: tokens are unique among requests in flight");
        }
        self.events.push_back(Event::Persist { id: p.id, records });
        self.persists.push_back(p);
    }

    fn answer_persist(&mut self, token: Option<RequestToken>, answer: Answer, error: Option<ResponseError>) {
        let Some(token) = token else { return };
        self.waiting.remove(&token);
        let code = error.map_or(0, |e| e.code());
        let response = match answer {
            Answer::None => return,
            Answer::Commit(mut r, persisted) => {
                for (t, p) in persisted {
                    r.topics[t].partitions[p].error_code = code;
                }
                ResponseKind::OffsetCommit(r)
            }
            Answer::Delete(mut r, deleted) => {
                for i in deleted {
                    r.results[i].error_code = code;
                }
                ResponseKind::DeleteGroups(r)
            }
        };
        self.respond(token, response);
    }
}
