//! The consumer-group coordinator of the classic group protocol (`group.protocol=classic`, the
//! one librdkafka, kafka-python, aiokafka and the Java client speak) as a sans-I/O state
//! machine: what Kafka's GroupCoordinator decides for JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups and DeleteGroups, with no
//! socket, runtime, clock or storage. This node coordinates every group.
//!
//! A driver owns one [`Coordinator`] and moves data in and out (quinn's model):
//! - in: requests, each with the time, a [`RequestToken`] of the driver's choosing (unique among
//!   the requests in flight) and the request's version (`handle_*`); the time alone
//!   ([`Coordinator::handle_timeout`]); durability answers ([`Coordinator::handle_persisted`],
//!   [`Coordinator::handle_persist_failed`]); closed connections ([`Coordinator::cancel`]); and
//!   at start-up the persisted records ([`Coordinator::restore`]);
//! - out: Heartbeat, LeaveGroup, OffsetFetch, DescribeGroups and ListGroups answers are returned
//!   at once; JoinGroup, SyncGroup, OffsetCommit and DeleteGroups answers, immediate or not,
//!   leave through [`Coordinator::poll_event`] as [`Event::Respond`], next to the records to
//!   make durable ([`Event::Persist`]); [`Coordinator::poll_timeout`] says when to call
//!   `handle_timeout` next.
//!
//! Responses are `kafka-protocol`'s structs, already shaped for the request's version (null
//! protocol names as Kafka writes them before JoinGroup v7, LeaveGroup before v3 answered with
//! one top-level error): the driver only encodes them.
//!
//! Modules: `settings` (the limits and Kafka's timing settings), `event` (the types at the
//! boundary), `state` (a group and its members, protocol selection), `rebalance` (the join and
//! sync phases, session and rebalance deadlines), `join`, `sync`, `membership` (Heartbeat and
//! LeaveGroup), `offsets` (OffsetCommit, OffsetFetch, durability, retention), `admin`
//! (DescribeGroups, ListGroups, DeleteGroups, the views for metrics), `record` (the persisted
//! encoding), `timer` (the deadline index).
//!
//! Invariants:
//! - An OffsetCommit is answered only after [`Event::Persist`] of its records was answered with
//!   [`Coordinator::handle_persisted`], and OffsetFetch shows only offsets made durable: a
//!   commit acknowledged to a client survives kill -9. Likewise a DeleteGroups answer waits for
//!   its tombstone.
//! - Persist batches must become durable in the order they were raised, and their outcomes be
//!   reported in that order (an append-only log does both); replaying every record persisted,
//!   in that order, through [`Coordinator::restore`] rebuilds the offsets held in memory, even
//!   across failed batches.
//! - Every token handed in is answered at most once, and never after [`Coordinator::cancel`].
//!   A JoinGroup or SyncGroup that the same member's next one supersedes is not answered, as in
//!   Kafka. Like Kafka, which mutes a connection while its request is in the works, a driver
//!   reads no further request from a connection while one is parked, so that answers keep the
//!   order of the requests.
//! - Every count and length a client controls is checked against [`Settings`] before it is
//!   kept, and what is kept is copied out of the request frame (a kept slice would pin the
//!   whole frame in memory).
//!
//! Not kept, unlike Kafka: group membership and assignments are not persisted. After a restart
//! every group is Empty with its committed offsets, and its members rejoin (their next request
//! gets UNKNOWN_MEMBER_ID, as after a Kafka coordinator failover that lost the group). Not
//! decided here: ACLs and which topic-partitions exist (the driver checks them, see
//! [`Coordinator::handle_offset_commit`]), group lag (the driver knows the log end offsets), and
//! transactional offset commits.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::StrBytes;
use silt_types::Timestamp;

mod admin;
mod event;
mod join;
mod membership;
mod offsets;
mod rebalance;
mod record;
mod settings;
mod state;
mod sync;
mod timer;

#[cfg(test)]
mod tests;

pub use admin::{GroupView, MemberView};
pub use event::{Client, Event, GroupState, PersistId, RequestToken};
pub use record::{CommittedOffset, Record, RecordError};
pub use settings::{Settings, SettingsError};

use offsets::PendingPersist;
use state::Group;
use timer::{Timer, Timers};

/// The APIs and versions the coordinator answers: (API, lowest, highest), for
/// [`versions::SUPPORTED`](crate::versions::SUPPORTED). Above these, JoinGroup 8+ and
/// OffsetCommit 9+ come with KIP-848's consumer protocol, OffsetFetch 8+ batches groups,
/// LeaveGroup 5+ carries reasons.
pub const SERVED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DeleteGroups, 0, 2),
];

/// The group coordinator. See the module documentation.
pub struct Coordinator {
    groups: HashMap<StrBytes, Group>,
    core: Core,
}

/// Everything but the groups, so that a group and the coordinator's queues can be borrowed
/// mutably at once.
struct Core {
    settings: Settings,
    events: VecDeque<Event>,
    timers: Timers,
    /// Requests parked in the coordinator, to find them again on [`Coordinator::cancel`].
    waiting: HashMap<RequestToken, Waiter>,
    /// Persist batches raised and not yet answered, oldest first.
    persists: VecDeque<PendingPersist>,
    /// Groups deleted whose tombstone is not durable yet, by incarnation.
    deleting: HashMap<u64, Group>,
    next_persist: u64,
    /// Wall clock at `started`: commit timestamps are wall-clock milliseconds, time flows as
    /// `Instant`s.
    started: Instant,
    started_wall: Timestamp,
    /// splitmix64 state for member ids.
    rng: u64,
    /// Tells a group apart from an earlier one of the same id that was deleted.
    next_incarnation: u64,
    /// Orders members by when they first joined (leader succession, member lists).
    next_seq: u64,
    /// Members and pending members over all groups.
    member_count: usize,
}

/// Where a parked request waits.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Waiter {
    Join { group: StrBytes, member: StrBytes },
    Sync { group: StrBytes, member: StrBytes },
    Persist(PersistId),
}

impl Coordinator {
    /// A coordinator with no groups, at `now`, when the wall clock reads `wall`. `seed` seeds
    /// the member ids it assigns (take it from a random source: ids must not repeat across
    /// restarts). Settings are validated by [`Settings::validate`] first.
    pub fn new(settings: Settings, now: Instant, wall: Timestamp, seed: u64) -> Self {
        let mut timers = Timers::default();
        timers.schedule(now + settings.offsets_retention_check_interval, Timer::Cleanup);
        Self {
            groups: HashMap::new(),
            core: Core {
                settings,
                events: VecDeque::new(),
                timers,
                waiting: HashMap::new(),
                persists: VecDeque::new(),
                deleting: HashMap::new(),
                next_persist: 0,
                started: now,
                started_wall: wall,
                rng: seed,
                next_incarnation: 0,
                next_seq: 0,
                member_count: 0,
            },
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.core.settings
    }

    /// The next answer or persist request.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.core.events.pop_front()
    }

    /// When [`Coordinator::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.core.timers.next()
    }

    /// Runs every deadline due at `now`: initial and rebalance delays, session timeouts,
    /// pending SyncGroups, offset retention.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(timer) = self.core.timers.pop_due(now) {
            match timer {
                Timer::Cleanup => {
                    self.expire_offsets(now);
                    let next = now + self.core.settings.offsets_retention_check_interval;
                    self.core.timers.schedule(next, Timer::Cleanup);
                }
                Timer::Join(group) => {
                    if let Some(g) = self.groups.get_mut(group.as_bytes()) {
                        g.on_join_timer(&mut self.core, now);
                    }
                }
                Timer::Sync(group) => {
                    if let Some(g) = self.groups.get_mut(group.as_bytes()) {
                        g.on_sync_timer(&mut self.core, now);
                    }
                }
                Timer::Heartbeat(group, member) => {
                    if let Some(g) = self.groups.get_mut(group.as_bytes()) {
                        g.on_heartbeat_timer(&mut self.core, now, &member);
                    }
                }
            }
        }
    }

    /// Forgets request `token` (its connection closed): it will not be answered. Members are
    /// not affected: one whose JoinGroup or SyncGroup is forgotten stays in the group until its
    /// session times out, as in Kafka; an OffsetCommit's records are still persisted.
    pub fn cancel(&mut self, token: RequestToken) {
        let Some(waiter) = self.core.waiting.remove(&token) else { return };
        match waiter {
            Waiter::Join { group, member } | Waiter::Sync { group, member } => {
                let Some(m) = self.groups.get_mut(group.as_bytes()).and_then(|g| g.members.get_mut(member.as_bytes()))
                else {
                    return;
                };
                for w in [&mut m.awaiting_join, &mut m.awaiting_sync].into_iter().flatten() {
                    if w.token == Some(token) {
                        w.token = None;
                    }
                }
            }
            Waiter::Persist(id) => {
                if let Some(p) = self.core.persists.iter_mut().find(|p| p.id == id)
                    && p.token == Some(token)
                {
                    p.token = None;
                }
            }
        }
    }
}

impl Coordinator {
    /// Removes group `id` if it holds nothing: a request that created it and then failed leaves
    /// no group behind (Kafka keeps such a group until the next retention check; here a flood
    /// of failing requests must not fill `max_groups`).
    fn drop_if_unused(&mut self, id: &[u8]) {
        let unused = self.groups.get(id).is_some_and(|g| {
            g.is(GroupState::Empty)
                && g.members.is_empty()
                && g.pending.is_empty()
                && g.offsets.is_empty()
                && g.pending_persists == 0
        });
        if unused && let Some(mut g) = self.groups.remove(id) {
            g.cancel_timers(&mut self.core);
        }
    }
}

impl Core {
    /// The wall clock at `now`.
    fn wall(&self, now: Instant) -> Timestamp {
        let elapsed = now.saturating_duration_since(self.started).as_millis();
        Timestamp(self.started_wall.0.saturating_add(i64::try_from(elapsed).unwrap_or(i64::MAX)))
    }

    /// A fresh `{prefix}-{uuid}` member id, as Kafka makes them (`UUID.randomUUID()`, here from
    /// a seeded generator).
    fn member_id(&mut self, prefix: &str) -> StrBytes {
        let (a, b) = (self.next_random(), self.next_random());
        // Version 4, variant 1, like a random UUID.
        let a = (a & !0xf000) | 0x4000;
        let b = (b & !(0xc << 60)) | (0x8 << 60);
        StrBytes::from_string(format!(
            "{prefix}-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xffff,
            b >> 48,
            b & 0xffff_ffff_ffff
        ))
    }

    fn next_random(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn incarnation(&mut self) -> u64 {
        self.next_incarnation += 1;
        self.next_incarnation
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }
}

/// A copy of `s` that owns its bytes: a `StrBytes` from a decoded request shares the frame's
/// buffer, and keeping it would keep the whole frame.
fn own(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
