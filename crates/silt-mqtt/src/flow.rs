//! Per-connection protocol state that needs no I/O, shared by both ends of a connection:
//! packet identifiers and the outbound in-flight window ([`Outbound`]), topic aliases
//! ([`InboundAliases`], [`OutboundAliases`]) and the keep-alive deadline.
//!
//! Sans-I/O like the codec: methods take the event (an acknowledgement arrived, a message is
//! to be sent) and return what the caller must do; time is passed in. The server connection
//! ([`crate::server::Connection`]) owns one of each; a client can use them the same way.
//!
//! Invariants: a packet id is in use by at most one in-flight message; ids are allocated
//! round-robin from 1 and never 0; a QoS 2 message completes only by PUBCOMP after its PUBREC
//! (or by an error PUBREC).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::reason::ReasonCode;
use crate::types::{PacketId, QoS};

struct Slot<T> {
    qos: QoS,
    /// PUBREC received, PUBREL sent (QoS 2).
    released: bool,
    data: T,
}

/// What a PUBREC means for the sender.
#[derive(Debug, PartialEq, Eq)]
pub enum PubRecOutcome<T> {
    /// Send PUBREL for the id; the message completes on PUBCOMP.
    Release,
    /// The receiver refused it (error reason code): the message is done.
    Refused(T),
    /// No QoS 2 message is in flight under that id: answer PUBREL with 0x92.
    Unknown,
}

/// Outbound QoS 1/2 messages awaiting acknowledgement, within a window (the peer's Receive
/// Maximum, capped by our own limit). `T` is whatever the caller settles on completion.
pub struct Outbound<T> {
    /// Hashed (a message's insert and removal are on every QoS 1/2 delivery: cheaper than a
    /// B-tree's node walks) with a fixed seed: the ids are ours, allocated here or restored
    /// from our own records, and a peer's id is only looked up.
    inflight: HashMap<u16, Slot<T>, foldhash::fast::FixedState>,
    next_id: u16,
    window: usize,
}

impl<T> Outbound<T> {
    pub fn new(window: u16) -> Self {
        Self { inflight: HashMap::default(), next_id: 1, window: usize::from(window.max(1)) }
    }

    /// How many more QoS 1/2 messages may be sent now.
    pub fn room(&self) -> usize {
        self.window.saturating_sub(self.inflight.len())
    }

    pub fn len(&self) -> usize {
        self.inflight.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inflight.is_empty()
    }

    /// Allocates a packet id for a QoS 1/2 message and records it as in flight.
    pub fn send(&mut self, qos: QoS, data: T) -> PacketId {
        let id = self.free_id();
        self.send_as(id, qos, data);
        id
    }

    /// The id [`Outbound::send`] would allocate now, for a caller that encodes the packet
    /// before it knows it will be sent (then [`Outbound::send_as`]). Needs room.
    pub fn free_id(&self) -> PacketId {
        let mut id = self.next_id;
        while self.inflight.contains_key(&id) {
            id = next(id);
        }
        PacketId::new(id).expect("invariant: ids start at 1 and skip 0")
    }

    /// Records as in flight a message sent under `id`, which [`Outbound::free_id`] gave.
    pub fn send_as(&mut self, id: PacketId, qos: QoS, data: T) {
        debug_assert!(!self.inflight.contains_key(&id.get()), "packet id {id:?} in flight twice");
        self.next_id = next(id.get());
        self.inflight.insert(id.get(), Slot { qos, released: false, data });
    }

    /// Records a message resent under its original id (a restored session).
    pub fn restore(&mut self, id: PacketId, qos: QoS, data: T) {
        self.inflight.insert(id.get(), Slot { qos, released: false, data });
    }

    /// Records a QoS 2 message whose PUBREL was already sent (a restored session): it
    /// completes on PUBCOMP; its PUBLISH is never sent again.
    pub fn restore_released(&mut self, id: PacketId, data: T) {
        self.inflight.insert(id.get(), Slot { qos: QoS::ExactlyOnce, released: true, data });
    }

    /// PUBACK: completes a QoS 1 message.
    pub fn on_puback(&mut self, id: PacketId) -> Option<T> {
        self.complete(id, QoS::AtLeastOnce, false)
    }

    /// PUBREC: moves a QoS 2 message to its second phase, or ends it if refused.
    pub fn on_pubrec(&mut self, id: PacketId, reason: ReasonCode) -> PubRecOutcome<T> {
        match self.inflight.get_mut(&id.get()) {
            Some(s) if s.qos == QoS::ExactlyOnce => {
                if reason.is_error() {
                    let s = self.inflight.remove(&id.get()).expect("invariant: present");
                    PubRecOutcome::Refused(s.data)
                } else {
                    s.released = true;
                    PubRecOutcome::Release
                }
            }
            _ => PubRecOutcome::Unknown,
        }
    }

    /// PUBCOMP: completes a QoS 2 message whose PUBREC was seen.
    pub fn on_pubcomp(&mut self, id: PacketId) -> Option<T> {
        self.complete(id, QoS::ExactlyOnce, true)
    }

    fn complete(&mut self, id: PacketId, qos: QoS, needs_release: bool) -> Option<T> {
        let ok = self.inflight.get(&id.get()).is_some_and(|s| s.qos == qos && (!needs_release || s.released));
        ok.then(|| self.inflight.remove(&id.get()).expect("invariant: present").data)
    }

    /// Everything still in flight (the connection is ending), in packet id order.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + use<T> {
        let mut all: Vec<(u16, Slot<T>)> = std::mem::take(&mut self.inflight).into_iter().collect();
        all.sort_unstable_by_key(|(id, _)| *id);
        all.into_iter().map(|(_, s)| s.data)
    }
}

/// The packet id after `id`, round-robin, skipping 0.
fn next(id: u16) -> u16 {
    if id == u16::MAX { 1 } else { id + 1 }
}

/// Topic aliases a peer set on its PUBLISHes (MQTT 5.0 §3.3.2.3.4).
#[derive(Default)]
pub struct InboundAliases {
    map: HashMap<u16, String>,
    max: u16,
}

impl InboundAliases {
    /// `max` is the Topic Alias Maximum we announced (0: aliases not accepted).
    pub fn new(max: u16) -> Self {
        Self { map: HashMap::new(), max }
    }

    /// Fills in the topic of a PUBLISH carrying `topic` and maybe `alias` (in place: a PUBLISH
    /// without an alias costs nothing), or returns the reason to disconnect.
    pub fn resolve(&mut self, alias: Option<u16>, topic: &mut String) -> Result<(), ReasonCode> {
        match alias {
            Some(0) => Err(ReasonCode::TopicAliasInvalid),
            Some(a) if a > self.max => Err(ReasonCode::TopicAliasInvalid),
            Some(a) if topic.is_empty() => {
                let known = self.map.get(&a).ok_or(ReasonCode::ProtocolError)?;
                topic.push_str(known);
                Ok(())
            }
            Some(a) => {
                self.map.insert(a, topic.clone());
                Ok(())
            }
            None if topic.is_empty() => Err(ReasonCode::ProtocolError),
            None => Ok(()),
        }
    }
}

/// Topic aliases we assign on PUBLISHes to a peer, up to its Topic Alias Maximum: the first
/// PUBLISH on a topic carries topic and alias, later ones the alias alone.
#[derive(Default)]
pub struct OutboundAliases {
    map: HashMap<String, u16>,
    max: u16,
}

impl OutboundAliases {
    pub fn new(max: u16) -> Self {
        Self { map: HashMap::new(), max }
    }

    /// `(alias, send the topic name too)` for a PUBLISH on `topic`. A new alias is only
    /// offered: it is defined by [`OutboundAliases::define`] once that PUBLISH is sent.
    pub fn lookup(&self, topic: &str) -> (Option<u16>, bool) {
        if let Some(&a) = self.map.get(topic) {
            return (Some(a), false);
        }
        if self.map.len() < usize::from(self.max) {
            return (Some(self.map.len() as u16 + 1), true);
        }
        (None, true)
    }

    /// Records the alias [`OutboundAliases::lookup`] offered for `topic`: the PUBLISH that
    /// carries both went out.
    pub fn define(&mut self, topic: &str, alias: u16) {
        self.map.insert(topic.to_owned(), alias);
    }
}

/// When a connection whose last packet arrived at `last` has missed its keep alive: one and a
/// half times the interval (MQTT §3.1.2.10). `None` when keep alive is off.
pub fn keep_alive_deadline(last: Instant, keep_alive: Duration) -> Option<Instant> {
    (!keep_alive.is_zero()).then(|| last + keep_alive + keep_alive / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u16) -> PacketId {
        PacketId::new(n).unwrap()
    }

    #[test]
    fn window_limits_and_ids_are_reused_only_when_free() {
        let mut o = Outbound::new(2);
        let a = o.send(QoS::AtLeastOnce, "a");
        let b = o.send(QoS::ExactlyOnce, "b");
        assert_eq!((a, b, o.room()), (id(1), id(2), 0));
        assert_eq!(o.on_puback(b), None, "a PUBACK does not complete a QoS 2 message");
        assert_eq!(o.on_puback(a), Some("a"));
        assert_eq!(o.room(), 1);
        assert_eq!(o.on_pubcomp(b), None, "PUBCOMP before PUBREC does not complete");
        assert_eq!(o.on_pubrec(b, ReasonCode::Success), PubRecOutcome::Release);
        assert_eq!(o.on_pubcomp(b), Some("b"));
        assert_eq!(o.on_pubrec(id(9), ReasonCode::Success), PubRecOutcome::Unknown);
    }

    #[test]
    fn ids_wrap_and_skip_those_in_flight() {
        let mut o = Outbound::new(10);
        o.restore(id(1), QoS::AtLeastOnce, 0);
        o.next_id = u16::MAX;
        assert_eq!(o.send(QoS::AtLeastOnce, 1), id(u16::MAX));
        assert_eq!(o.send(QoS::AtLeastOnce, 2), id(2), "wraps past 0 and skips 1, still in flight");
    }

    #[test]
    fn what_is_still_in_flight_drains_in_id_order() {
        let mut o = Outbound::new(100);
        for n in [40, 3, 17, 9] {
            o.restore(id(n), QoS::AtLeastOnce, n);
        }
        assert_eq!(o.send(QoS::AtLeastOnce, 100), id(1));
        assert_eq!(o.on_puback(id(17)), Some(17));
        assert_eq!(o.drain().collect::<Vec<_>>(), vec![100, 3, 9, 40]);
        assert!(o.is_empty() && o.room() == 100);
    }

    #[test]
    fn refused_pubrec_ends_the_message() {
        let mut o = Outbound::new(5);
        let x = o.send(QoS::ExactlyOnce, "x");
        assert_eq!(o.on_pubrec(x, ReasonCode::QuotaExceeded), PubRecOutcome::Refused("x"));
        assert!(o.is_empty());
    }

    #[test]
    fn inbound_aliases_follow_the_spec() {
        let mut a = InboundAliases::new(4);
        let mut resolve = |alias, topic: &str| {
            let mut topic = topic.to_owned();
            a.resolve(alias, &mut topic).map(|()| topic)
        };
        assert_eq!(resolve(Some(2), "a/b"), Ok("a/b".to_owned()));
        assert_eq!(resolve(Some(2), ""), Ok("a/b".to_owned()));
        assert_eq!(resolve(Some(3), ""), Err(ReasonCode::ProtocolError));
        assert_eq!(resolve(Some(0), "x"), Err(ReasonCode::TopicAliasInvalid));
        assert_eq!(resolve(Some(5), "x"), Err(ReasonCode::TopicAliasInvalid));
        assert_eq!(resolve(None, ""), Err(ReasonCode::ProtocolError));
    }

    #[test]
    fn outbound_aliases_send_the_topic_once() {
        let mut a = OutboundAliases::new(1);
        assert_eq!(a.lookup("t/1"), (Some(1), true));
        assert_eq!(a.lookup("t/1"), (Some(1), true), "offered, not defined until sent");
        a.define("t/1", 1);
        assert_eq!(a.lookup("t/1"), (Some(1), false));
        assert_eq!(a.lookup("t/2"), (None, true), "beyond the peer's maximum: plain topic");
    }

    #[test]
    fn keep_alive_allows_one_and_a_half_intervals() {
        let t0 = Instant::now();
        assert_eq!(keep_alive_deadline(t0, Duration::from_secs(10)), Some(t0 + Duration::from_secs(15)));
        assert_eq!(keep_alive_deadline(t0, Duration::ZERO), None);
    }
}
