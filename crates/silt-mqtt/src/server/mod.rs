//! The server side of one MQTT connection as a sans-I/O state machine: every protocol
//! decision between the client's bytes and the broker's answers, with no socket, runtime,
//! clock or storage.
//!
//! A driver owns a [`Connection`] and moves data in and out (quinn's model):
//! - in: bytes read from the client ([`Connection::handle_input`]), the time
//!   ([`Connection::handle_timeout`]), the broker's answers (`handle_authenticated`,
//!   `accept` / `refuse`, `handle_stored`, `handle_subscribed`, `handle_unsubscribed`), the
//!   messages to push ([`Connection::send`], [`Connection::resend`]) and closes it notices
//!   itself ([`Connection::close`]);
//! - out: bytes to write ([`Connection::poll_transmit`]), the next deadline
//!   ([`Connection::poll_timeout`]) and requests to the broker ([`Connection::poll_event`]).
//!
//! `T` is whatever the driver needs back when an outbound message completes (which cursors
//! it settles); the connection only stores it.
//!
//! Modules, one per concern: `handshake` (CONNECT to CONNACK), `inbound` (PUBLISH and PUBREL
//! from the client, acknowledged in arrival order once stored), `outbound` (PUBLISH to the
//! client within its window, and its acknowledgements), `subscribe` (SUBSCRIBE and
//! UNSUBSCRIBE), `event` (the types at the boundary).
//!
//! Invariants:
//! - PUBACKs and PUBRECs leave in the order their PUBLISHes arrived, whatever order the broker
//!   answers in (refusals included); a QoS 2 message is handed to the broker once, however
//!   often it is resent.
//! - QoS 1/2 PUBLISHes awaiting an answer plus QoS 2 ids awaiting PUBREL never exceed our
//!   Receive Maximum: one more closes the connection with 0x93.
//! - At most the client's Receive Maximum (capped by ours) outbound QoS 1/2 messages are in
//!   flight; none larger than its Maximum Packet Size is sent.
//! - [`Event::Closed`] comes once, last, and only after every store request was answered, so
//!   that publishes already handed to the broker are still acknowledged.
//!
//! Not decided here: authentication and authorization, sessions and what to deliver (the
//! broker's), and when bytes actually leave (the driver's).

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::codec::{decode, decode_connect};
use crate::flow::{AliasMap, InboundAliases, Outbound, OutboundAliases, keep_alive_deadline};
use crate::packet::{Disconnect, Packet, Will};
use crate::reason::ReasonCode;
use crate::types::{PacketType, ProtocolVersion};

mod event;
mod handshake;
mod inbound;
mod outbound;
mod subscribe;

pub use event::{
    Close, Credentials, DelayedWill, Event, OpenRequest, Refusal, Sent, Settings, Stored, SubscribeFilter,
    SubscribeRequest, Subscribed, SubscriptionFilter, Token, UnsubscribeFilter, UnsubscribeRequest,
};

use handshake::Handshake;
use inbound::PendingStore;
use subscribe::{PendingSubscribe, PendingUnsubscribe};

/// An output buffer that grew past this is given back once written, not kept for the next
/// burst: an idle connection should cost little.
const TRANSMIT_KEEP: usize = 256 * 1024;

enum Phase {
    /// Waiting for the CONNECT until the deadline; `nonce` seeds an assigned client id.
    Connecting {
        deadline: Instant,
        nonce: u64,
    },
    /// CONNECT received; the broker checks the credentials ([`Event::Authenticate`]).
    Authenticating(Box<Handshake>),
    /// The broker opens the session ([`Event::Open`]).
    Opening(Box<Handshake>),
    Open,
    /// No more input; waiting for the answers to stores already requested.
    Closing(Close),
    Closed,
}

/// The server side of one MQTT connection. See the module documentation.
pub struct Connection<T> {
    settings: Settings,
    phase: Phase,
    /// Placeholder (3.1.1) until the CONNECT names it.
    version: ProtocolVersion,
    /// Whether the CONNACK accepted the connection (a session, a will, DISCONNECT on close).
    opened: bool,
    /// Seconds; 0: off.
    keep_alive: u16,
    /// When bytes last arrived from the client.
    last_input: Instant,
    transmit: BytesMut,
    events: VecDeque<Event<T>>,
    /// Tokens need only be unique among requests awaiting an answer: they wrap.
    next_token: u32,
    inbound_aliases: InboundAliases,
    /// Inbound QoS 1/2 PUBLISHes not yet acknowledged, in arrival order.
    stores: VecDeque<PendingStore>,
    /// Entries of `stores` that count against our Receive Maximum (resends do not).
    stores_counted: u16,
    /// Inbound QoS 2 ids stored and acknowledged by PUBREC, awaiting PUBREL.
    awaiting_release: BTreeSet<u16>,
    inflight: Outbound<T>,
    outbound_aliases: OutboundAliases,
    /// The client's Maximum Packet Size.
    client_max_packet: u32,
    /// The client's Request Problem Information (MQTT 5.0): Reason Strings on acknowledgements.
    problem_information: bool,
    /// Seconds, as granted.
    session_expiry: u32,
    /// The CONNECT asked for a session that ends with the connection (MQTT 5.0 forbids
    /// extending it on DISCONNECT).
    connect_expiry_zero: bool,
    will: Option<Box<Will>>,
    subscribes: Vec<PendingSubscribe>,
    unsubscribes: Vec<PendingUnsubscribe>,
}

/// An open connection at rest, in a few dozen bytes where its working form takes hundreds:
/// nothing in flight either way, no request to the broker unanswered, nothing left to write.
/// A driver with many idle connections keeps them so ([`Connection::park`], then
/// [`Connection::unpark`] when the connection has work again). It holds what the protocol
/// remembers across the quiet time: the version, keep alive and the last input, the client's
/// limits and topic aliases in both directions, the will, the session expiry, the next packet
/// id.
pub struct Parked {
    last_input: Instant,
    will: Option<Box<Will>>,
    /// The topic alias maps without their structs' padding: 64 bytes, not 80. The inbound
    /// maximum is our setting ([`inbound_alias_max`]); the outbound one is the client's.
    inbound_aliases: AliasMap<u16, String>,
    outbound_aliases: AliasMap<String, u16>,
    client_max_packet: u32,
    session_expiry: u32,
    next_token: u32,
    /// The outbound window's next packet id and size ([`Outbound::at_rest`]).
    window: (u16, u16),
    keep_alive: u16,
    outbound_alias_max: u16,
    version: ProtocolVersion,
    problem_information: bool,
    connect_expiry_zero: bool,
}

/// The Topic Alias Maximum we announce: aliases are MQTT 5.0's.
fn inbound_alias_max(version: ProtocolVersion, settings: &Settings) -> u16 {
    if version.is_v5() { settings.topic_alias_maximum } else { 0 }
}

impl Parked {
    /// When keep alive closes the connection unless the client sends something first
    /// ([`Connection::poll_timeout`] of the working form).
    pub fn poll_timeout(&self) -> Option<Instant> {
        keep_alive_deadline(self.last_input, Duration::from_secs(u64::from(self.keep_alive)))
    }
}

impl<T> Connection<T> {
    /// The connection at rest ([`Parked`]), or itself back when it is not: it must be open,
    /// with nothing in flight in either direction (no QoS 2 id awaiting its PUBREL either), no
    /// request to the broker unread or unanswered, and nothing left to write.
    #[allow(clippy::result_large_err, reason = "called once per idle spell; the connection comes back as it was")]
    pub fn park(self) -> Result<Parked, Self> {
        let Some(window) = self.inflight.at_rest().filter(|_| self.is_at_rest()) else {
            return Err(self);
        };
        debug_assert_eq!(self.stores_counted, 0, "invariant: counted stores are in `stores`");
        // Every field named: one added to the connection must be decided on here.
        let Self {
            settings: _,
            phase: _,
            version,
            opened: _,
            keep_alive,
            last_input,
            transmit: _,
            events: _,
            next_token,
            inbound_aliases,
            stores: _,
            stores_counted: _,
            awaiting_release: _,
            inflight: _,
            outbound_aliases,
            client_max_packet,
            problem_information,
            session_expiry,
            connect_expiry_zero,
            will,
            subscribes: _,
            unsubscribes: _,
        } = self;
        let (inbound_aliases, _) = inbound_aliases.into_parts();
        let (outbound_aliases, outbound_alias_max) = outbound_aliases.into_parts();
        Ok(Parked {
            last_input,
            will,
            inbound_aliases,
            outbound_aliases,
            outbound_alias_max,
            client_max_packet,
            session_expiry,
            next_token,
            window,
            keep_alive,
            version,
            problem_information,
            connect_expiry_zero,
        })
    }

    /// Whether [`Connection::park`] would take the connection (see there).
    pub fn is_at_rest(&self) -> bool {
        matches!(self.phase, Phase::Open)
            && self.transmit.is_empty()
            && self.events.is_empty()
            && self.stores.is_empty()
            && self.awaiting_release.is_empty()
            && self.inflight.is_empty()
            && self.subscribes.is_empty()
            && self.unsubscribes.is_empty()
    }

    /// A parked connection in its working form again, with the settings it was made with.
    pub fn unpark(p: Parked, settings: Settings) -> Self {
        Self {
            settings,
            phase: Phase::Open,
            version: p.version,
            opened: true,
            keep_alive: p.keep_alive,
            last_input: p.last_input,
            transmit: BytesMut::new(),
            events: VecDeque::new(),
            next_token: p.next_token,
            inbound_aliases: InboundAliases::from_parts(p.inbound_aliases, inbound_alias_max(p.version, &settings)),
            stores: VecDeque::new(),
            stores_counted: 0,
            awaiting_release: BTreeSet::new(),
            inflight: Outbound::resume(p.window),
            outbound_aliases: OutboundAliases::from_parts(p.outbound_aliases, p.outbound_alias_max),
            client_max_packet: p.client_max_packet,
            problem_information: p.problem_information,
            session_expiry: p.session_expiry,
            connect_expiry_zero: p.connect_expiry_zero,
            will: p.will,
            subscribes: Vec::new(),
            unsubscribes: Vec::new(),
        }
    }

    /// A connection just accepted at `now`, waiting for its CONNECT. `nonce` seeds the
    /// identifier assigned to a client that sends an empty one.
    pub fn new(now: Instant, settings: Settings, nonce: u64) -> Self {
        Self {
            settings,
            phase: Phase::Connecting { deadline: now + settings.connect_timeout, nonce },
            version: ProtocolVersion::V3_1_1,
            opened: false,
            keep_alive: 0,
            last_input: now,
            transmit: BytesMut::new(),
            events: VecDeque::new(),
            next_token: 0,
            inbound_aliases: InboundAliases::new(0),
            stores: VecDeque::new(),
            stores_counted: 0,
            awaiting_release: BTreeSet::new(),
            inflight: Outbound::new(1),
            outbound_aliases: OutboundAliases::new(0),
            client_max_packet: u32::MAX,
            problem_information: true,
            session_expiry: 0,
            connect_expiry_zero: true,
            will: None,
            subscribes: Vec::new(),
            unsubscribes: Vec::new(),
        }
    }

    /// The protocol version the CONNECT named (3.1.1 before it arrives).
    pub fn version(&self) -> ProtocolVersion {
        self.version
    }

    /// Whether the connection is accepted and not closing: packets are read, messages sent.
    pub fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open)
    }

    /// Handles the next whole packet in `buf`, the bytes read from the client, and consumes
    /// it. Call it after each read at `now` (any bytes, even part of a packet, count as
    /// activity for keep alive), and again while it returns `true`; `false` means `buf` holds
    /// no whole packet, or the connection reads no more for now (it awaits the broker during
    /// the handshake, or is closing). Execute the events of one packet before feeding the
    /// next: a store requested counts against the client's Receive Maximum until answered.
    pub fn handle_input(&mut self, now: Instant, buf: &mut BytesMut) -> bool {
        if !buf.is_empty() {
            // Any bytes count as activity, even a packet still incomplete.
            self.last_input = now;
        }
        match self.phase {
            Phase::Connecting { nonce, .. } => match decode_connect(buf, self.settings.max_connect_size) {
                Ok(None) => false,
                Ok(Some(connect)) => {
                    self.on_connect(connect, nonce);
                    true
                }
                Err(e) => {
                    self.refuse_undecodable(e);
                    true
                }
            },
            Phase::Open => match decode(buf, self.version, self.settings.max_packet_size) {
                Ok(None) => false,
                Ok(Some(packet)) => {
                    self.dispatch(packet);
                    true
                }
                Err(e) => {
                    self.close(Close::Malformed(e));
                    true
                }
            },
            _ => false,
        }
    }

    /// Handles a packet already decoded (the client's bytes at `now`).
    pub fn handle_packet(&mut self, now: Instant, packet: Packet) {
        self.last_input = now;
        match (&self.phase, packet) {
            (&Phase::Connecting { nonce, .. }, Packet::Connect(c)) => self.on_connect(*c, nonce),
            (Phase::Connecting { .. }, p) => {
                let e = crate::error::ProtocolViolation::FirstPacketNotConnect(p.packet_type());
                self.close(Close::Malformed(e.into()));
            }
            (Phase::Open, p) => self.dispatch(p),
            _ => {}
        }
    }

    /// Checks the deadlines at `now`: the CONNECT's, then keep alive.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.poll_timeout() {
            Some(deadline) if now >= deadline => {}
            _ => return,
        }
        match self.phase {
            Phase::Connecting { .. } => self.close(Close::ConnectTimeout),
            Phase::Open => self.close(Close::KeepAliveTimeout),
            _ => {}
        }
    }

    /// When [`Connection::handle_timeout`] is next due, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Connecting { deadline, .. } => Some(deadline),
            Phase::Open => keep_alive_deadline(self.last_input, Duration::from_secs(u64::from(self.keep_alive))),
            _ => None,
        }
    }

    /// Everything queued for the client since the last call, as one buffer to write.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        if self.transmit.is_empty() {
            return None;
        }
        if self.transmit.capacity() > TRANSMIT_KEEP {
            return Some(std::mem::take(&mut self.transmit).freeze());
        }
        Some(self.transmit.split().freeze())
    }

    /// The next request to the broker.
    pub fn poll_event(&mut self) -> Option<Event<T>> {
        self.events.pop_front()
    }

    /// Whether a request to the broker is waiting for [`Connection::poll_event`].
    pub fn has_event(&self) -> bool {
        !self.events.is_empty()
    }

    /// Gives back the queues' memory kept from past traffic, where nothing is queued. Call it
    /// now and then, not per packet: an idle connection should cost little, and a busy one
    /// would only allocate again.
    pub fn shrink_idle(&mut self) {
        if self.events.is_empty() {
            self.events = VecDeque::new();
        }
        if self.stores.is_empty() {
            self.stores = VecDeque::new();
        }
    }

    /// Ends the connection for a reason found outside it (the transport closed, the session
    /// was taken over, the server shuts down, a server-side failure). The first reason wins.
    /// Stores already requested are still answered and acknowledged before
    /// [`Event::Closed`].
    pub fn close(&mut self, reason: Close) {
        if matches!(self.phase, Phase::Closing(_) | Phase::Closed) {
            return;
        }
        self.phase = Phase::Closing(reason);
        self.finish_closing();
    }

    /// Completes a close once no store is awaited: DISCONNECT (5.0), the in-flight messages
    /// handed back, the will released.
    fn finish_closing(&mut self) {
        if !matches!(self.phase, Phase::Closing(_)) || !self.stores.is_empty() {
            return;
        }
        let Phase::Closing(reason) = std::mem::replace(&mut self.phase, Phase::Closed) else {
            unreachable!("invariant: checked above")
        };
        let mut will = None;
        if self.opened {
            self.events.extend(self.inflight.drain().map(Event::Undelivered));
            if let Some(code) = reason.disconnect_reason()
                && self.version.is_v5()
            {
                self.queue_explained(&Packet::Disconnect(Disconnect::new(code)), reason.explanation());
            }
            if reason.publishes_will() {
                will = self.will.take().map(|will| {
                    let delay = will.properties.will_delay_interval.unwrap_or(0);
                    // The will waits no longer than the session lives.
                    let delay = if self.session_expiry == 0 { 0 } else { delay.min(self.session_expiry) };
                    DelayedWill { will, delay: Duration::from_secs(u64::from(delay)) }
                });
            }
        }
        self.events.push_back(Event::Closed { reason, will });
    }

    /// Routes a packet of an open connection.
    fn dispatch(&mut self, packet: Packet) {
        match packet {
            Packet::Publish(p) => self.on_publish(p),
            Packet::PubAck(r) => self.on_puback(r),
            Packet::PubRec(r) => self.on_pubrec(r),
            Packet::PubComp(r) => self.on_pubcomp(r),
            Packet::PubRel(r) => self.on_pubrel(r),
            Packet::Subscribe(s) => self.on_subscribe(s),
            Packet::Unsubscribe(u) => self.on_unsubscribe(u),
            Packet::PingReq => self.queue(&Packet::PingResp),
            Packet::Disconnect(d) => self.on_disconnect(d),
            // 0x8C is no DISCONNECT code: an AUTH where no method was agreed is a protocol
            // error (MQTT 5.0 §4.12).
            Packet::Auth(_) => self
                .close(Close::Error(ReasonCode::ProtocolError, "AUTH without an authentication method in the CONNECT")),
            // A second CONNECT, or a packet only a server sends.
            Packet::Connect(_) | Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp => {
                self.close(Close::Error(ReasonCode::ProtocolError, "a second CONNECT, or a packet only a server sends"))
            }
        }
    }

    fn on_disconnect(&mut self, d: Disconnect) {
        if self.version.is_v5()
            && let Some(e) = d.properties.session_expiry_interval
        {
            // MQTT-3.14.2-2: a session the CONNECT asked to end with the connection stays so
            // (what the CONNECT asked, not what we granted: a server cap of 0 is no reason).
            if self.connect_expiry_zero && e > 0 {
                return self.close(Close::Error(
                    ReasonCode::ProtocolError,
                    "a session that ends with the connection cannot be given an expiry on DISCONNECT",
                ));
            }
            self.session_expiry = e.min(self.settings.max_session_expiry);
            self.events.push_back(Event::SessionExpiry(self.session_expiry));
        }
        self.close(Close::Client { with_will: d.reason_code == ReasonCode::DisconnectWithWillMessage })
    }

    fn token(&mut self) -> Token {
        self.next_token = self.next_token.wrapping_add(1);
        Token(self.next_token)
    }

    /// Encodes a packet for the client. Everything queued is built here from checked parts, so
    /// encoding cannot fail; were it to, the packet is dropped rather than the connection.
    fn queue(&mut self, packet: &Packet) {
        if self.version.is_v5() && error_code(packet).is_some() {
            return self.queue_explained(packet, None);
        }
        let encoded = packet.encode(self.version, &mut self.transmit);
        debug_assert!(encoded.is_ok(), "invariant: queued packets encode: {encoded:?} for {packet:?}");
    }

    /// Queues an MQTT 5.0 packet with an error code, with a Reason String: `detail` or the
    /// code's explanation. Acknowledgements carry one only if the client did not turn Request
    /// Problem Information off (MQTT-3.1.2-29); a packet the Reason String would make larger
    /// than the client's Maximum Packet Size goes without it (MQTT-3.2.2-19 and the like).
    fn queue_explained(&mut self, packet: &Packet, detail: Option<String>) {
        let allowed = self.problem_information || matches!(packet, Packet::ConnAck(_) | Packet::Disconnect(_));
        let explained = error_code(packet).filter(|_| allowed && self.version.is_v5()).and_then(|code| {
            let text = detail.or_else(|| explanation(packet.packet_type(), code).map(str::to_owned))?;
            let mut p = packet.clone();
            *reason_string_mut(&mut p)? = Some(text);
            p.encoded_len(self.version).is_ok_and(|n| n as u64 <= u64::from(self.client_max_packet)).then_some(p)
        });
        let packet = explained.as_ref().unwrap_or(packet);
        let encoded = packet.encode(self.version, &mut self.transmit);
        debug_assert!(encoded.is_ok(), "invariant: queued packets encode: {encoded:?} for {packet:?}");
    }
}

/// The error reason code of a packet the server sends, if it carries one (a SUBACK or UNSUBACK:
/// the first failing filter's).
fn error_code(packet: &Packet) -> Option<ReasonCode> {
    let code = match packet {
        Packet::ConnAck(a) => a.reason_code,
        Packet::Disconnect(d) => d.reason_code,
        Packet::PubAck(r) | Packet::PubRec(r) | Packet::PubRel(r) | Packet::PubComp(r) => r.reason_code,
        Packet::SubAck(a) => a.reason_codes.iter().copied().find(|c| c.is_error())?,
        Packet::UnsubAck(a) => a.reason_codes.iter().copied().find(|c| c.is_error())?,
        _ => return None,
    };
    code.is_error().then_some(code)
}

fn reason_string_mut(packet: &mut Packet) -> Option<&mut Option<String>> {
    Some(match packet {
        Packet::ConnAck(a) => &mut a.properties.reason_string,
        Packet::Disconnect(d) => &mut d.properties.reason_string,
        Packet::PubAck(r) | Packet::PubRec(r) | Packet::PubRel(r) | Packet::PubComp(r) => {
            &mut r.properties.reason_string
        }
        Packet::SubAck(a) => &mut a.properties.reason_string,
        Packet::UnsubAck(a) => &mut a.properties.reason_string,
        _ => return None,
    })
}

/// What an error code means in the packet it answers, for its Reason String.
fn explanation(packet: PacketType, code: ReasonCode) -> Option<&'static str> {
    Some(match (packet, code) {
        (PacketType::PubAck | PacketType::PubRec, ReasonCode::NotAuthorized) => {
            "not authorized to publish to this topic"
        }
        (PacketType::PubAck | PacketType::PubRec, ReasonCode::UnspecifiedError) => {
            "the message could not be stored and was not accepted; publish it again"
        }
        (PacketType::SubAck, ReasonCode::NotAuthorized) => "not authorized to subscribe to a topic filter",
        (PacketType::SubAck, ReasonCode::TopicFilterInvalid) => "a topic filter or shared subscription is not valid",
        (PacketType::SubAck, ReasonCode::UnspecifiedError) => "a subscription could not be made",
        (PacketType::UnsubAck, ReasonCode::UnspecifiedError) => "an unsubscription could not be made",
        (PacketType::ConnAck, ReasonCode::NotAuthorized) => "not authorized to connect, or to use this will topic",
        _ => return code.explanation(),
    })
}

impl<T> Connection<T> {}

/// A topic name as MQTT §4.7.3 allows it (the rules of `silt_types::TopicName`, checked
/// without copying the name).
fn valid_topic_name(topic: &str) -> bool {
    !topic.is_empty() && topic.len() <= silt_types::topic::MAX_TOPIC_LEN && !topic.contains(['+', '#', '\0'])
}

impl<T> Connection<T> {
    /// Whether a topic name or filter has more levels than the server accepts.
    fn too_deep(&self, topic: &str) -> bool {
        silt_types::level_count(topic) > usize::from(self.settings.max_topic_levels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a driver keeps per idle connection: 64 bytes, a whole allocator size class, and
    /// the largest part of a resting connection's task (see silt-broker's
    /// `the_connection_future_stays_small`).
    #[test]
    fn a_parked_connection_fits_64_bytes() {
        assert_eq!(std::mem::size_of::<Parked>(), 64);
    }

    #[test]
    fn an_idle_connection_gives_its_queues_back() {
        let settings = Settings {
            max_packet_size: 1024,
            receive_maximum: 4,
            max_inflight: 4,
            topic_alias_maximum: 0,
            server_keep_alive: 0,
            max_session_expiry: 0,
            connect_timeout: Duration::from_secs(1),
            max_connect_size: 1024,
            max_topic_levels: 8,
        };
        let mut c: Connection<()> = Connection::new(Instant::now(), settings, 0);
        c.events.push_back(Event::SessionExpiry(1));
        c.shrink_idle();
        assert!(c.events.capacity() > 0, "a queued event stays");
        c.poll_event();
        c.shrink_idle();
        assert_eq!(c.events.capacity(), 0);
    }

    #[test]
    fn topic_names_follow_the_shared_rules() {
        for t in ["a", "a/b", "/", "a//b", "$SYS/x"] {
            assert_eq!(valid_topic_name(t), silt_types::TopicName::new(t).is_ok(), "{t}");
            assert!(valid_topic_name(t));
        }
        for t in ["", "a/+", "#", "a\0b"] {
            assert_eq!(valid_topic_name(t), silt_types::TopicName::new(t).is_ok(), "{t:?}");
        }
        let long = "x".repeat(silt_types::topic::MAX_TOPIC_LEN + 1);
        assert!(!valid_topic_name(&long));
    }
}
