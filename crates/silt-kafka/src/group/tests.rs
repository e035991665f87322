//! Conversations with the coordinator in virtual time: clients made of request structs, a
//! driver that runs deadlines, answers persists and keeps a log of what it persisted, no
//! sockets and no sleeps. Every request goes through the wire encoding of its version before
//! the coordinator sees it, and every answer through its encoder and decoder before a test
//! does: what a test reads is what a client of that version would read.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use silt_types::Timestamp;

use super::*;

mod bounds;
mod conversation;
mod errors;
mod offsets;
mod random;
mod static_members;

pub const GROUP: &str = "g";
pub const SESSION: Duration = Duration::from_secs(10);
pub const REBALANCE: Duration = Duration::from_secs(30);
/// Wall clock at the start of every world.
pub const EPOCH_MS: i64 = 1_700_000_000_000;

pub fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

/// `r` as the coordinator receives it from a client of `version`: fields the version lacks are
/// lost on the way, as on the wire.
pub fn wire<R: Encodable + Decodable>(r: &R, version: i16) -> R {
    let mut b = BytesMut::new();
    r.encode(&mut b, version).expect("requests of the tests encode");
    R::decode(&mut b.freeze(), version).expect("and decode")
}

/// Settings that reach their limits quickly; no initial delay unless a test sets one.
pub fn settings() -> Settings {
    Settings { initial_rebalance_delay: Duration::ZERO, ..Settings::default() }
}

/// A client of the group, as a consumer keeps its state.
#[derive(Debug, Clone)]
pub struct Consumer {
    pub client_id: String,
    pub version: i16,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub generation: i32,
    pub protocols: Vec<(String, Bytes)>,
    pub session: Duration,
    pub rebalance: Duration,
}

impl Consumer {
    pub fn new(client_id: &str) -> Self {
        Self {
            client_id: client_id.into(),
            version: 7,
            member_id: String::new(),
            instance_id: None,
            generation: -1,
            protocols: vec![("range".into(), Bytes::from(format!("sub:t;{client_id}")))],
            session: SESSION,
            rebalance: REBALANCE,
        }
    }

    pub fn version(mut self, v: i16) -> Self {
        self.version = v;
        self
    }

    pub fn instance(mut self, id: &str) -> Self {
        self.instance_id = Some(id.into());
        self
    }

    pub fn protocols(mut self, names: &[&str]) -> Self {
        self.protocols = names.iter().map(|n| ((*n).into(), Bytes::from(format!("{n}:{}", self.client_id)))).collect();
        self
    }

    pub fn join_request(&self) -> JoinGroupRequest {
        JoinGroupRequest::default()
            .with_group_id(GroupId(s(GROUP)))
            .with_session_timeout_ms(self.session.as_millis() as i32)
            .with_rebalance_timeout_ms(self.rebalance.as_millis() as i32)
            .with_member_id(s(&self.member_id))
            .with_group_instance_id(self.instance_id.as_deref().map(s))
            .with_protocol_type(s("consumer"))
            .with_protocols(
                self.protocols
                    .iter()
                    .map(|(n, m)| JoinGroupRequestProtocol::default().with_name(s(n)).with_metadata(m.clone()))
                    .collect(),
            )
    }

    pub fn sync_request(&self, assignments: &[(&str, &[u8])]) -> SyncGroupRequest {
        SyncGroupRequest::default()
            .with_group_id(GroupId(s(GROUP)))
            .with_generation_id(self.generation)
            .with_member_id(s(&self.member_id))
            .with_group_instance_id(self.instance_id.as_deref().map(s))
            .with_protocol_type(Some(s("consumer")))
            .with_protocol_name(Some(s(&self.protocols[0].0)))
            .with_assignments(
                assignments
                    .iter()
                    .map(|(m, a)| {
                        SyncGroupRequestAssignment::default()
                            .with_member_id(s(m))
                            .with_assignment(Bytes::copy_from_slice(a))
                    })
                    .collect(),
            )
    }

    pub fn heartbeat_request(&self) -> HeartbeatRequest {
        HeartbeatRequest::default()
            .with_group_id(GroupId(s(GROUP)))
            .with_generation_id(self.generation)
            .with_member_id(s(&self.member_id))
            .with_group_instance_id(self.instance_id.as_deref().map(s))
    }

    pub fn commit_request(&self, offsets: &[(&str, i32, i64)]) -> OffsetCommitRequest {
        commit_request(self.generation, &self.member_id, self.instance_id.as_deref(), offsets)
    }
}

pub fn commit_request(
    generation: i32,
    member: &str,
    instance: Option<&str>,
    offsets: &[(&str, i32, i64)],
) -> OffsetCommitRequest {
    let mut topics: Vec<OffsetCommitRequestTopic> = Vec::new();
    for &(topic, partition, offset) in offsets {
        let p = OffsetCommitRequestPartition::default()
            .with_partition_index(partition)
            .with_committed_offset(offset)
            .with_committed_metadata(Some(s("meta")));
        match topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
            Some(t) => t.partitions.push(p),
            None => {
                topics.push(OffsetCommitRequestTopic::default().with_name(TopicName(s(topic))).with_partitions(vec![p]))
            }
        }
    }
    OffsetCommitRequest::default()
        .with_group_id(GroupId(s(GROUP)))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(s(member))
        .with_group_instance_id(instance.map(s))
        .with_topics(topics)
}

pub fn fetch_request(topics: Option<&[(&str, &[i32])]>) -> OffsetFetchRequest {
    OffsetFetchRequest::default().with_group_id(GroupId(s(GROUP))).with_topics(topics.map(|ts| {
        ts.iter()
            .map(|(t, ps)| {
                OffsetFetchRequestTopic::default().with_name(TopicName(s(t))).with_partition_indexes(ps.to_vec())
            })
            .collect()
    }))
}

/// A LeaveGroup as a client of `version` sends it: one member id before v3, a batch from v3.
pub fn leave_request(version: i16, members: &[(&str, Option<&str>)]) -> LeaveGroupRequest {
    let r = LeaveGroupRequest::default().with_group_id(GroupId(s(GROUP)));
    if version < 3 {
        return r.with_member_id(s(members.first().map_or("", |m| m.0)));
    }
    r.with_members(
        members
            .iter()
            .map(|(m, i)| MemberIdentity::default().with_member_id(s(m)).with_group_instance_id(i.map(s)))
            .collect(),
    )
}

/// The coordinator and a driver, in virtual time.
pub struct World {
    pub c: Coordinator,
    pub now: Instant,
    next_token: u64,
    /// Requests in flight: API and version, to encode their answers.
    in_flight: HashMap<RequestToken, (ApiKey, i16)>,
    answers: HashMap<RequestToken, ResponseKind>,
    /// Persist batches not yet answered (only while `hold_persists`).
    pub persists: VecDeque<(PersistId, Vec<Record>)>,
    /// Every record made durable, encoded, in order.
    pub log: Vec<Bytes>,
    pub hold_persists: bool,
    /// Requests arriving "at once": deadlines due now wait until it is cleared.
    pub hold_timers: bool,
}

impl World {
    pub fn new() -> Self {
        Self::with(settings())
    }

    pub fn with(settings: Settings) -> Self {
        settings.validate().expect("test settings are valid");
        let now = Instant::now();
        Self {
            c: Coordinator::new(settings, now, Timestamp(EPOCH_MS), 7),
            now,
            next_token: 0,
            in_flight: HashMap::new(),
            answers: HashMap::new(),
            persists: VecDeque::new(),
            log: Vec::new(),
            hold_persists: false,
            hold_timers: false,
        }
    }

    /// A coordinator restarted on this world's log, at this world's time.
    pub fn restarted(&self) -> World {
        let settings = *self.c.settings();
        let mut w = World::with(settings);
        w.now = self.now;
        w.c = Coordinator::new(settings, self.now, self.c.core.wall(self.now), 8);
        for bytes in &self.log {
            w.c.restore(Record::decode(bytes).expect("the log holds records"));
        }
        w.log = self.log.clone();
        w
    }

    pub fn token(&mut self, key: ApiKey, version: i16) -> RequestToken {
        self.next_token += 1;
        let t = RequestToken(self.next_token);
        self.in_flight.insert(t, (key, version));
        t
    }

    /// Runs what is due now: deadlines, events, persists (unless held).
    pub fn run(&mut self) {
        loop {
            let due = !self.hold_timers && self.c.poll_timeout().is_some_and(|t| t <= self.now);
            if due {
                self.c.handle_timeout(self.now);
            }
            let mut progressed = false;
            while let Some(e) = self.c.poll_event() {
                progressed = true;
                match e {
                    Event::Respond { token, response } => self.deliver(token, *response),
                    Event::Persist { id, records } => self.persists.push_back((id, records)),
                }
            }
            if !self.hold_persists && !self.persists.is_empty() {
                self.persist_all();
                progressed = true;
            }
            if !progressed && (self.hold_timers || self.c.poll_timeout().is_none_or(|t| t > self.now)) {
                break;
            }
        }
        self.check_invariants();
    }

    /// The coordinator's bookkeeping agrees with its groups: counts, the deadline index (one
    /// entry per live deadline), the parked requests (only requests still in flight).
    fn check_invariants(&self) {
        let core = &self.c.core;
        let mut members = 0;
        let mut deadlines = 1; // the retention check
        for g in self.c.groups.values() {
            members += g.members.len() + g.pending.len();
            deadlines +=
                usize::from(g.join_deadline.is_some()) + usize::from(g.sync_deadline.is_some()) + g.pending.len();
            deadlines += g.members.values().filter(|m| m.deadline.is_some()).count();
            assert_eq!(
                g.awaiting_join,
                g.members.values().filter(|m| m.awaiting_join.is_some()).count(),
                "awaiting count"
            );
            let mut supported: HashMap<&str, usize> = HashMap::new();
            for p in g.members.values().flat_map(|m| &m.protocols) {
                *supported.entry(p.name.as_str()).or_default() += 1;
            }
            let counted: HashMap<&str, usize> = g.supported.iter().map(|(n, c)| (n.as_str(), *c)).collect();
            assert_eq!(counted, supported, "protocol counts");
            assert!(
                g.leader.is_none() == g.members.is_empty() || g.is(GroupState::Empty),
                "a group with members has a leader"
            );
            if let Some(l) = &g.leader {
                assert!(g.members.contains_key(l.as_bytes()), "the leader is a member");
            }
            for (instance, id) in &g.static_members {
                assert_eq!(g.members.get(id.as_bytes()).and_then(|m| m.instance_id.as_ref()), Some(instance));
            }
            assert!(g.pending_sync.iter().all(|id| g.members.contains_key(id.as_bytes())));
        }
        assert_eq!(core.member_count, members, "member count");
        assert_eq!(core.timers.len(), deadlines, "one index entry per live deadline");
        for token in core.waiting.keys() {
            assert!(self.in_flight.contains_key(token), "a parked request is one in flight");
        }
    }

    /// Makes the oldest held batch durable, and tells the coordinator.
    pub fn persist_first(&mut self) {
        let Some((id, records)) = self.persists.pop_front() else { return };
        self.log.extend(records.iter().map(|r| r.encode().expect("records encode")));
        self.c.handle_persisted(id);
        self.run_events();
    }

    /// Makes every held batch durable, and tells the coordinator.
    pub fn persist_all(&mut self) {
        let Some(&(last, _)) = self.persists.back() else { return };
        for (_, records) in self.persists.drain(..) {
            self.log.extend(records.iter().map(|r| r.encode().expect("records encode")));
        }
        self.c.handle_persisted(last);
        self.run_events();
    }

    fn run_events(&mut self) {
        while let Some(e) = self.c.poll_event() {
            match e {
                Event::Respond { token, response } => self.deliver(token, *response),
                Event::Persist { id, records } => self.persists.push_back((id, records)),
            }
        }
    }

    /// Encodes the answer at its request's version and decodes it as a client would.
    fn deliver(&mut self, token: RequestToken, response: ResponseKind) {
        let (key, version) = self.in_flight.remove(&token).expect("answered once, and only requests in flight");
        let frame = crate::codec::encode_response(key, version, 1, &response).expect("answers encode");
        let mut body = frame.slice(4..);
        ResponseHeader::decode(&mut body, key.response_header_version(version)).expect("header");
        let decoded = ResponseKind::decode(key, &mut body, version).expect("answers decode");
        assert!(body.is_empty(), "{key:?} v{version}: bytes left after the answer");
        assert!(self.answers.insert(token, decoded).is_none());
    }

    pub fn advance(&mut self, d: Duration) {
        // Step through every deadline on the way, as a driver's timer would fire them.
        let end = self.now + d;
        while let Some(t) = self.c.poll_timeout().filter(|&t| t <= end) {
            self.now = self.now.max(t);
            self.run();
        }
        self.now = end;
        self.run();
    }

    pub fn answered(&self, token: RequestToken) -> bool {
        self.answers.contains_key(&token)
    }

    pub fn take(&mut self, token: RequestToken) -> Option<ResponseKind> {
        self.answers.remove(&token)
    }

    pub fn in_flight(&self, token: RequestToken) -> bool {
        self.in_flight.contains_key(&token)
    }

    pub fn client(id: &str) -> Client<'_> {
        Client { client_id: id, client_host: "/127.0.0.1" }
    }

    /// Sends a JoinGroup from `c` (at its version); returns its token.
    pub fn send_join(&mut self, c: &Consumer) -> RequestToken {
        let t = self.token(ApiKey::JoinGroup, c.version);
        let r = wire(&c.join_request(), c.version);
        self.c.handle_join_group(self.now, t, c.version, World::client(&c.client_id), &r);
        self.run();
        t
    }

    /// The JoinGroup answer for `t`, if it came; `c` takes its member id and generation.
    pub fn join_answer(&mut self, t: RequestToken, c: &mut Consumer) -> Option<JoinGroupResponse> {
        let Some(ResponseKind::JoinGroup(r)) = self.take(t) else { return None };
        if r.error_code == 0 || r.error_code == ResponseError::MemberIdRequired.code() {
            c.member_id = r.member_id.to_string();
        }
        if r.error_code == 0 {
            c.generation = r.generation_id;
        }
        if r.error_code == ResponseError::UnknownMemberId.code() {
            c.member_id.clear();
            c.generation = -1;
        }
        Some(r)
    }

    /// A JoinGroup as a client makes it: again with the assigned id after MEMBER_ID_REQUIRED.
    /// Returns the token of the JoinGroup that may still be parked.
    pub fn join(&mut self, c: &mut Consumer) -> RequestToken {
        let t = self.send_join(c);
        if let Some(r) = self.peek_join(t)
            && r.error_code == ResponseError::MemberIdRequired.code()
        {
            self.join_answer(t, c);
            return self.send_join(c);
        }
        t
    }

    pub fn peek_join(&self, t: RequestToken) -> Option<&JoinGroupResponse> {
        match self.answers.get(&t) {
            Some(ResponseKind::JoinGroup(r)) => Some(r),
            _ => None,
        }
    }

    pub fn send_sync(&mut self, c: &Consumer, assignments: &[(&str, &[u8])]) -> RequestToken {
        let t = self.token(ApiKey::SyncGroup, c.version.min(5));
        let r = wire(&c.sync_request(assignments), c.version.min(5));
        self.c.handle_sync_group(self.now, t, c.version.min(5), &r);
        self.run();
        t
    }

    pub fn sync_answer(&mut self, t: RequestToken) -> Option<SyncGroupResponse> {
        match self.take(t) {
            Some(ResponseKind::SyncGroup(r)) => Some(r),
            None => None,
            Some(other) => panic!("not a SyncGroup answer: {other:?}"),
        }
    }

    pub fn heartbeat(&mut self, c: &Consumer) -> i16 {
        let v = c.version.min(4);
        let r = wire(&c.heartbeat_request(), v);
        let answer = self.c.handle_heartbeat(self.now, v, &r);
        self.run();
        answer.error_code
    }

    /// LeaveGroup at `version`; the answer as a client of that version decodes it.
    pub fn leave(&mut self, version: i16, members: &[(&str, Option<&str>)]) -> LeaveGroupResponse {
        let r = wire(&leave_request(version, members), version);
        let answer = self.c.handle_leave_group(self.now, version, &r);
        self.run();
        roundtrip(ApiKey::LeaveGroup, version, ResponseKind::LeaveGroup(answer))
    }

    pub fn send_commit(&mut self, version: i16, r: &OffsetCommitRequest) -> RequestToken {
        let t = self.token(ApiKey::OffsetCommit, version);
        let r = wire(r, version);
        self.c.handle_offset_commit(self.now, t, version, &r, |topic, partition| {
            (topic == "unknown" || partition < 0).then_some(ResponseError::UnknownTopicOrPartition)
        });
        self.run();
        t
    }

    /// Commits and returns each partition's error code, in request order.
    pub fn commit(&mut self, version: i16, r: &OffsetCommitRequest) -> Vec<i16> {
        let t = self.send_commit(version, r);
        self.commit_codes(t).expect("the commit is answered")
    }

    pub fn commit_codes(&mut self, t: RequestToken) -> Option<Vec<i16>> {
        match self.take(t)? {
            ResponseKind::OffsetCommit(r) => {
                Some(r.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code)).collect())
            }
            other => panic!("not an OffsetCommit answer: {other:?}"),
        }
    }

    pub fn fetch(&mut self, version: i16, topics: Option<&[(&str, &[i32])]>) -> OffsetFetchResponse {
        let r = wire(&fetch_request(topics), version);
        let answer = self.c.handle_offset_fetch(version, &r);
        roundtrip(ApiKey::OffsetFetch, version, ResponseKind::OffsetFetch(answer))
    }

    /// The committed offset of one partition as OffsetFetch v7 reports it.
    pub fn committed(&mut self, topic: &str, partition: i32) -> i64 {
        let r = self.fetch(7, Some(&[(topic, &[partition])]));
        r.topics[0].partitions[0].committed_offset
    }

    pub fn describe(&mut self, version: i16) -> DescribedGroup {
        let r = wire(&DescribeGroupsRequest::default().with_groups(vec![GroupId(s(GROUP))]), version);
        let answer = self.c.handle_describe_groups(version, &r);
        let r: DescribeGroupsResponse =
            roundtrip(ApiKey::DescribeGroups, version, ResponseKind::DescribeGroups(answer));
        r.groups.into_iter().next().expect("one group described")
    }

    pub fn state(&mut self) -> String {
        self.describe(5).group_state.to_string()
    }

    pub fn send_delete(&mut self, version: i16, groups: &[&str]) -> RequestToken {
        let t = self.token(ApiKey::DeleteGroups, version);
        let r = DeleteGroupsRequest::default().with_groups_names(groups.iter().map(|g| GroupId(s(g))).collect());
        self.c.handle_delete_groups(self.now, t, version, &wire(&r, version));
        self.run();
        t
    }

    pub fn delete(&mut self, groups: &[&str]) -> Vec<i16> {
        let t = self.send_delete(2, groups);
        match self.take(t) {
            Some(ResponseKind::DeleteGroups(r)) => r.results.iter().map(|r| r.error_code).collect(),
            other => panic!("not a DeleteGroups answer: {other:?}"),
        }
    }

    /// JoinGroups from all of `consumers` at the same instant (the driver reads them all before
    /// it runs deadlines), then the answers once the join phase ended.
    pub fn join_all(&mut self, consumers: &mut [Consumer]) -> Vec<JoinGroupResponse> {
        self.hold_timers = true;
        let tokens: Vec<RequestToken> = consumers.iter_mut().map(|c| self.join(c)).collect();
        self.hold_timers = false;
        self.advance(Duration::ZERO);
        consumers.iter_mut().zip(tokens).map(|(c, t)| self.join_answer(t, c).expect("the join phase ended")).collect()
    }

    /// Forms a group of `consumers` (all joining now), the leader giving member i the
    /// assignment `p{i}`; returns once every member has its assignment.
    pub fn form(&mut self, consumers: &mut [Consumer]) {
        let answers = self.join_all(consumers);
        let leader = answers.iter().find(|r| r.leader == r.member_id).expect("one member leads");
        assert!(answers.iter().all(|r| r.error_code == 0), "{answers:?}");
        let parts: Vec<(String, Vec<u8>)> = leader
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.member_id.to_string(), format!("p{i}").into_bytes()))
            .collect();
        let assignments: Vec<(&str, &[u8])> = parts.iter().map(|(m, a)| (m.as_str(), a.as_slice())).collect();
        let mut syncs = Vec::new();
        for c in consumers.iter() {
            syncs.push(self.send_sync(c, if self.is_leader(c) { &assignments } else { &[] }));
        }
        for t in syncs {
            let r = self.sync_answer(t).expect("every member gets its assignment");
            assert_eq!(r.error_code, 0);
        }
    }

    pub fn is_leader(&self, c: &Consumer) -> bool {
        self.c.group(GROUP).and_then(|g| g.leader.map(str::to_owned)) == Some(c.member_id.clone())
    }
}

/// An immediate answer through the wire, as a client of `version` reads it.
pub fn roundtrip<T>(key: ApiKey, version: i16, response: ResponseKind) -> T
where
    ResponseKind: Unwrap<T>,
{
    let frame = crate::codec::encode_response(key, version, 1, &response).expect("answers encode");
    let mut body = frame.slice(4..);
    ResponseHeader::decode(&mut body, key.response_header_version(version)).expect("header");
    ResponseKind::decode(key, &mut body, version).expect("answers decode").unwrap_into()
}

pub trait Unwrap<T> {
    fn unwrap_into(self) -> T;
}

macro_rules! unwrap_kind {
    ($($variant:ident => $ty:ty),*) => {$(
        impl Unwrap<$ty> for ResponseKind {
            fn unwrap_into(self) -> $ty {
                match self {
                    ResponseKind::$variant(r) => r,
                    other => panic!("expected {}, got {other:?}", stringify!($variant)),
                }
            }
        }
    )*};
}

unwrap_kind!(
    LeaveGroup => LeaveGroupResponse,
    OffsetFetch => OffsetFetchResponse,
    DescribeGroups => DescribeGroupsResponse,
    ListGroups => ListGroupsResponse,
    Heartbeat => HeartbeatResponse
);

pub fn code(e: ResponseError) -> i16 {
    e.code()
}
