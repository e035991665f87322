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

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::reason::ReasonCode;
use crate::types::{PacketId, QoS};

struct Slot<T> {
    qos: QoS,
    /// PUBREC received, PUBREL sent (QoS 2).
    released: bool,
    /// Recorded by `restore*` under an id this window did not allocate.
    restored: bool,
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
    /// The ids in flight, in send order, and their messages beside them (same index). A
    /// peer acknowledges QoS 1 messages in the order it received them (MQTT-4.6.0-2), so an
    /// acknowledgement matches the front: one look at a line in cache, where a hash map's
    /// lookup lands anywhere in a table (with hundreds of subscribers, a cache miss on every
    /// delivery). The ids are kept apart so that a search scans two bytes per message.
    ids: VecDeque<u16>,
    slots: VecDeque<Slot<T>>,
    /// Messages restored under ids of an earlier connection (see `free_id`).
    restored: usize,
    next_id: u16,
    window: usize,
}

impl<T> Outbound<T> {
    pub fn new(window: u16) -> Self {
        Self {
            ids: VecDeque::new(),
            slots: VecDeque::new(),
            restored: 0,
            next_id: 1,
            window: usize::from(window.max(1)),
        }
    }

    /// How many more QoS 1/2 messages may be sent now.
    pub fn room(&self) -> usize {
        self.window.saturating_sub(self.ids.len())
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn position(&self, id: u16) -> Option<usize> {
        self.ids.iter().position(|&i| i == id)
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
        // Ids are allocated round-robin and pushed in send order, so without restored ones the
        // ids in flight lie in the circular range from the front's to the last allocated, and
        // the next id is taken only when that range has come full circle to the front's.
        if self.restored > 0 || self.ids.front() == Some(&id) {
            while self.position(id).is_some() {
                id = next(id);
            }
        }
        PacketId::new(id).expect("invariant: ids start at 1 and skip 0")
    }

    /// Records as in flight a message sent under `id`, which [`Outbound::free_id`] gave.
    pub fn send_as(&mut self, id: PacketId, qos: QoS, data: T) {
        debug_assert!(self.position(id.get()).is_none(), "packet id {id:?} in flight twice");
        self.next_id = next(id.get());
        self.ids.push_back(id.get());
        self.slots.push_back(Slot { qos, released: false, restored: false, data });
    }

    /// Records a message resent under its original id (a restored session).
    pub fn restore(&mut self, id: PacketId, qos: QoS, data: T) {
        self.put_restored(id, Slot { qos, released: false, restored: true, data });
    }

    /// Records a QoS 2 message whose PUBREL was already sent (a restored session): it
    /// completes on PUBCOMP; its PUBLISH is never sent again.
    pub fn restore_released(&mut self, id: PacketId, data: T) {
        self.put_restored(id, Slot { qos: QoS::ExactlyOnce, released: true, restored: true, data });
    }

    fn put_restored(&mut self, id: PacketId, slot: Slot<T>) {
        match self.position(id.get()) {
            Some(at) => {
                self.restored += usize::from(!self.slots[at].restored);
                self.slots[at] = slot;
            }
            None => {
                self.restored += 1;
                self.ids.push_back(id.get());
                self.slots.push_back(slot);
            }
        }
    }

    fn remove(&mut self, at: usize) -> T {
        self.ids.remove(at);
        let slot = self.slots.remove(at).expect("invariant: ids and slots have the same length");
        self.restored -= usize::from(slot.restored);
        slot.data
    }

    /// PUBACK: completes a QoS 1 message.
    pub fn on_puback(&mut self, id: PacketId) -> Option<T> {
        self.complete(id, QoS::AtLeastOnce, false)
    }

    /// PUBREC: moves a QoS 2 message to its second phase, or ends it if refused.
    pub fn on_pubrec(&mut self, id: PacketId, reason: ReasonCode) -> PubRecOutcome<T> {
        match self.position(id.get()) {
            Some(at) if self.slots[at].qos == QoS::ExactlyOnce => {
                if reason.is_error() {
                    PubRecOutcome::Refused(self.remove(at))
                } else {
                    self.slots[at].released = true;
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
        let at = self.position(id.get())?;
        let s = &self.slots[at];
        (s.qos == qos && (!needs_release || s.released)).then(|| self.remove(at))
    }

    /// The window's next packet id and its size when nothing is in flight: all a window at
    /// rest must remember ([`Outbound::resume`]).
    pub fn at_rest(&self) -> Option<(u16, u16)> {
        debug_assert!(!self.ids.is_empty() || self.restored == 0, "invariant: restored ones are in flight");
        let window = u16::try_from(self.window).expect("invariant: made from a u16");
        self.ids.is_empty().then_some((self.next_id, window))
    }

    /// An empty window that goes on from [`Outbound::at_rest`].
    pub fn resume((next_id, window): (u16, u16)) -> Self {
        Self { next_id, ..Self::new(window) }
    }

    /// Everything still in flight (the connection is ending), in packet id order.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + use<T> {
        self.restored = 0;
        let mut all: Vec<(u16, Slot<T>)> =
            std::mem::take(&mut self.ids).into_iter().zip(std::mem::take(&mut self.slots)).collect();
        all.sort_unstable_by_key(|(id, _)| *id);
        all.into_iter().map(|(_, s)| s.data)
    }
}

/// The packet id after `id`, round-robin, skipping 0.
fn next(id: u16) -> u16 {
    if id == u16::MAX { 1 } else { id + 1 }
}

/// A topic alias map, boxed and made at its first alias: most clients never set one, and
/// every connection keeps the field.
#[allow(clippy::box_collection, reason = "8 bytes when unused, where an empty map is 48")]
pub(crate) type AliasMap<K, V> = Option<Box<HashMap<K, V>>>;

/// Topic aliases a peer set on its PUBLISHes (MQTT 5.0 §3.3.2.3.4). The map is boxed and made
/// at the first alias: most clients never set one, and every connection keeps this.
#[derive(Default)]
pub struct InboundAliases {
    map: AliasMap<u16, String>,
    max: u16,
}

impl InboundAliases {
    /// `max` is the Topic Alias Maximum we announced (0: aliases not accepted).
    pub fn new(max: u16) -> Self {
        Self { map: None, max }
    }

    /// The aliases apart, map and maximum: kept so by a parked connection, which saves the
    /// padding the struct has around its `u16` (see [`crate::server::Parked`]).
    pub(crate) fn into_parts(self) -> (AliasMap<u16, String>, u16) {
        (self.map, self.max)
    }

    pub(crate) fn from_parts(map: AliasMap<u16, String>, max: u16) -> Self {
        Self { map, max }
    }

    /// Fills in the topic of a PUBLISH carrying `topic` and maybe `alias` (in place: a PUBLISH
    /// without an alias costs nothing), or returns the reason to disconnect.
    pub fn resolve(&mut self, alias: Option<u16>, topic: &mut String) -> Result<(), ReasonCode> {
        match alias {
            Some(0) => Err(ReasonCode::TopicAliasInvalid),
            Some(a) if a > self.max => Err(ReasonCode::TopicAliasInvalid),
            Some(a) if topic.is_empty() => {
                let known = self.map.as_ref().and_then(|m| m.get(&a)).ok_or(ReasonCode::ProtocolError)?;
                topic.push_str(known);
                Ok(())
            }
            Some(a) => {
                self.map.get_or_insert_default().insert(a, topic.clone());
                Ok(())
            }
            None if topic.is_empty() => Err(ReasonCode::ProtocolError),
            None => Ok(()),
        }
    }
}

/// Topic aliases we assign on PUBLISHes to a peer, up to its Topic Alias Maximum: the first
/// PUBLISH on a topic carries topic and alias, later ones the alias alone. The map is boxed
/// and made at the first alias defined (see [`InboundAliases`]).
#[derive(Default)]
pub struct OutboundAliases {
    map: AliasMap<String, u16>,
    max: u16,
}

impl OutboundAliases {
    pub fn new(max: u16) -> Self {
        Self { map: None, max }
    }

    /// The aliases apart (see [`InboundAliases::into_parts`]).
    pub(crate) fn into_parts(self) -> (AliasMap<String, u16>, u16) {
        (self.map, self.max)
    }

    pub(crate) fn from_parts(map: AliasMap<String, u16>, max: u16) -> Self {
        Self { map, max }
    }

    /// `(alias, send the topic name too)` for a PUBLISH on `topic`. A new alias is only
    /// offered: it is defined by [`OutboundAliases::define`] once that PUBLISH is sent.
    pub fn lookup(&self, topic: &str) -> (Option<u16>, bool) {
        if self.max == 0 {
            return (None, true);
        }
        let map = self.map.as_deref();
        if let Some(&a) = map.and_then(|m| m.get(topic)) {
            return (Some(a), false);
        }
        let len = map.map_or(0, HashMap::len);
        if len < usize::from(self.max) {
            return (Some(len as u16 + 1), true);
        }
        (None, true)
    }

    /// Records the alias [`OutboundAliases::lookup`] offered for `topic`: the PUBLISH that
    /// carries both went out.
    pub fn define(&mut self, topic: &str, alias: u16) {
        self.map.get_or_insert_default().insert(topic.to_owned(), alias);
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

    /// One message left unacknowledged while 65,535 others come and go: after a full circle
    /// its id is skipped, without any restored message to force a search.
    #[test]
    fn a_message_in_flight_for_a_whole_circle_keeps_its_id() {
        let mut o = Outbound::new(u16::MAX);
        let stuck = o.send(QoS::AtLeastOnce, 0u32);
        let mut last = stuck;
        for n in 1..u32::from(u16::MAX) {
            last = o.send(QoS::AtLeastOnce, n);
            assert_ne!(last, stuck);
            assert_eq!(o.on_puback(last), Some(n), "acknowledged in order");
        }
        assert_eq!(last, id(u16::MAX));
        assert_eq!(o.send(QoS::AtLeastOnce, 7), id(2), "wrapped, and 1 is still in flight");
        assert_eq!(o.on_puback(stuck), Some(0));
        assert_eq!(o.send(QoS::AtLeastOnce, 8), id(3));
        // Out of order: the middle one goes first.
        assert_eq!(o.on_puback(id(3)), Some(8));
        assert_eq!(o.on_puback(id(2)), Some(7));
        assert!(o.is_empty());
    }

    /// A restored id stays skipped until it completes, also when restored twice; then ids
    /// run on in order.
    #[test]
    fn restored_ids_are_skipped_until_they_complete() {
        let mut o = Outbound::new(10);
        o.restore(id(2), QoS::AtLeastOnce, 20);
        o.restore_released(id(2), 21);
        assert_eq!(o.len(), 1);
        assert_eq!(o.send(QoS::AtLeastOnce, 1), id(1));
        assert_eq!(o.send(QoS::AtLeastOnce, 3), id(3), "2 is restored and in flight");
        assert_eq!(o.on_puback(id(2)), None, "restored as released QoS 2");
        assert_eq!(o.on_pubcomp(id(2)), Some(21));
        assert_eq!(o.restored, 0);
        assert_eq!(o.send(QoS::AtLeastOnce, 4), id(4));
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
