//! What passes between the [`Coordinator`](super::Coordinator) and its driver.

use kafka_protocol::messages::ResponseKind;
use kafka_protocol::protocol::StrBytes;

use super::record::Record;

/// Names a request in flight; the driver picks it (unique among its requests in flight) and
/// finds its connection, correlation id and version again by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestToken(pub u64);

/// Names a batch of records to make durable ([`Event::Persist`]). Ids grow: a later batch has a
/// larger id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PersistId(pub u64);

/// Who sent a request, as Kafka keeps it for members (DescribeGroups shows it; member ids
/// start with the client id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client<'a> {
    /// The request header's client id.
    pub client_id: &'a str,
    /// The peer address as Kafka prints it (`/127.0.0.1`).
    pub client_host: &'a str,
}

/// What the driver is to do.
#[derive(Debug)]
pub enum Event {
    /// Answer request `token` with `response` (already shaped for the request's version:
    /// encode it as it is).
    Respond { token: RequestToken, response: Box<ResponseKind> },
    /// Make `records` durable, after every batch raised before, then call
    /// [`handle_persisted`](super::Coordinator::handle_persisted) (or
    /// [`handle_persist_failed`](super::Coordinator::handle_persist_failed)) with `id`. A batch
    /// from offset retention carries no answer; the others hold an OffsetCommit or DeleteGroups
    /// answer until then.
    Persist { id: PersistId, records: Vec<Record> },
}

/// A group's state, with Kafka's names (DescribeGroups, ListGroups).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupState {
    /// No members (possibly committed offsets).
    Empty,
    /// Waiting for the members to (re)join.
    PreparingRebalance,
    /// Waiting for the leader's assignment.
    CompletingRebalance,
    Stable,
    /// Reported for a group that does not exist.
    Dead,
}

impl GroupState {
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }

    pub(super) fn str_bytes(self) -> StrBytes {
        StrBytes::from_static_str(self.name())
    }
}
