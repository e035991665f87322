//! CONNECT to CONNACK: how an undecodable CONNECT is answered, the client identifier and
//! will rules, the session expiry and keep alive granted, and the CONNACK's announcements.
//!
//! The order of checks decides which refusal a client with several faults gets, and follows
//! the broker's: credentials first (the broker's [`Event::Authenticate`]), then the client
//! identifier, the will topic, and the broker's policy on the will ([`Event::Open`]).

use std::time::Instant;

use crate::error::ConnectError;
use crate::flow::{InboundAliases, Outbound, OutboundAliases};
use crate::packet::{ConnAck, Connect, Packet};
use crate::reason::ReasonCode;
use crate::types::{PacketId, ProtocolVersion};

use super::{Close, Connection, Credentials, Event, OpenRequest, Phase, Refusal, valid_topic_name};

/// A CONNECT between its arrival and the CONNACK.
pub(super) struct Handshake {
    connect: Connect,
    nonce: u64,
    /// The identifier the server assigned (an empty one was sent).
    assigned: Option<String>,
    session_expiry: u32,
}

impl<T> Connection<T> {
    pub(super) fn on_connect(&mut self, mut connect: Connect, nonce: u64) {
        self.version = connect.protocol_version;
        if connect.properties.authentication_method.is_some() {
            // No extended authentication method is supported (MQTT 5.0 §4.12): refused before
            // the credentials are even looked at (MQTT-4.12.0-1).
            self.phase =
                Phase::Authenticating(Box::new(Handshake { connect, nonce, assigned: None, session_expiry: 0 }));
            return self.refuse_with(ReasonCode::BadAuthenticationMethod);
        }
        let credentials = Credentials { username: connect.username.take(), password: connect.password.take() };
        self.phase = Phase::Authenticating(Box::new(Handshake { connect, nonce, assigned: None, session_expiry: 0 }));
        self.events.push_back(Event::Authenticate(credentials));
    }

    /// A first packet that is not a valid CONNECT. Only a peer that named a version we speak
    /// gets a CONNACK; 3.x has no code for a malformed CONNECT but "unsupported version".
    pub(super) fn refuse_undecodable(&mut self, e: ConnectError) {
        let code = e.reason_code();
        let answer_in = match e.version {
            Some(v) if v.is_v5() || code == ReasonCode::UnsupportedProtocolVersion => Some(v),
            Some(_) => None,
            None if code == ReasonCode::UnsupportedProtocolVersion => Some(ProtocolVersion::V3_1_1),
            None => None,
        };
        if let Some(v) = answer_in {
            self.version = v;
            self.queue_explained(&Packet::ConnAck(Box::new(ConnAck::refused(code))), Some(e.error.to_string()));
        }
        self.close(Close::Malformed(e.error));
    }

    /// The broker's verdict on the credentials of [`Event::Authenticate`].
    pub fn handle_authenticated(&mut self, verdict: Result<(), Refusal>) {
        let Phase::Authenticating(_) = self.phase else { return };
        let Phase::Authenticating(mut hs) = std::mem::replace(&mut self.phase, Phase::Closed) else {
            unreachable!("invariant: matched above")
        };
        if let Err(refusal) = verdict {
            return self.refuse_with(refusal.reason_code());
        }
        let v = self.version;
        let c = &mut hs.connect;
        if c.client_id.starts_with("$share/") {
            // Reserved: shared-subscription groups are stored under these names.
            return self.refuse_with(ReasonCode::ClientIdentifierNotValid);
        }
        if c.client_id.is_empty() {
            // MQTT 3.1.1 assigns an identifier only to a session that ends with the connection.
            if !v.is_v5() && !c.clean_start {
                return self.refuse_with(ReasonCode::ClientIdentifierNotValid);
            }
            c.client_id = format!("silt-{:016x}", hs.nonce);
            hs.assigned = Some(c.client_id.clone());
        }
        let requested = c.properties.session_expiry_interval.unwrap_or(0);
        hs.session_expiry = if v.is_v5() {
            requested.min(self.settings.max_session_expiry)
        } else if c.clean_start {
            0
        } else {
            u32::MAX
        };
        self.connect_expiry_zero = requested == 0;
        if let Some(w) = &c.will
            && (!valid_topic_name(&w.topic) || self.too_deep(&w.topic))
        {
            return self.refuse_with(if v.is_v5() {
                ReasonCode::TopicNameInvalid
            } else {
                ReasonCode::UnspecifiedError
            });
        }
        let request = OpenRequest {
            client_id: c.client_id.clone(),
            clean_start: c.clean_start,
            session_expiry: hs.session_expiry,
            will_topic: c.will.as_ref().map(|w| w.topic.clone()),
        };
        self.phase = Phase::Opening(hs);
        self.events.push_back(Event::Open(Box::new(request)));
    }

    /// Refuses the CONNECT after [`Event::Authenticate`] or [`Event::Open`] (policy said no,
    /// for instance to the will topic).
    pub fn refuse(&mut self, refusal: Refusal) {
        if matches!(self.phase, Phase::Authenticating(_) | Phase::Opening(_)) {
            self.refuse_with(refusal.reason_code());
        }
    }

    fn refuse_with(&mut self, code: ReasonCode) {
        self.queue(&Packet::ConnAck(Box::new(ConnAck::refused(code))));
        self.phase = Phase::Closing(Close::Refused(code));
        self.finish_closing();
    }

    /// Accepts the CONNECT of [`Event::Open`] at `now`: the session is open (`session_present`
    /// if it existed), and these inbound QoS 2 ids of it still await PUBREL. Queues the
    /// CONNACK; packets that arrived behind the CONNECT can be fed from now on.
    pub fn accept(
        &mut self,
        now: Instant,
        session_present: bool,
        awaiting_release: impl IntoIterator<Item = PacketId>,
    ) {
        let Phase::Opening(_) = self.phase else { return };
        let Phase::Opening(hs) = std::mem::replace(&mut self.phase, Phase::Open) else {
            unreachable!("invariant: matched above")
        };
        let Handshake { connect, assigned, session_expiry, .. } = *hs;
        let s = self.settings;
        let v = self.version;
        // A maximum, as mosquitto's max_keepalive: a 5.0 client asking for more (or for none)
        // is lowered through Server Keep Alive; one asking for less keeps its own (a short keep
        // alive is how a device gets its will published soon). 3.1.1 cannot be told.
        let max = s.server_keep_alive;
        let wanted = connect.keep_alive;
        let server_keep_alive = (max > 0 && v.is_v5() && (wanted == 0 || wanted > max)).then_some(max);
        let mut ack = ConnAck::accepted(session_present);
        if v.is_v5() {
            let p = &mut ack.properties;
            p.receive_maximum = Some(s.receive_maximum);
            p.maximum_packet_size = Some(s.max_packet_size);
            p.topic_alias_maximum = Some(s.topic_alias_maximum);
            p.assigned_client_identifier = assigned;
            p.server_keep_alive = server_keep_alive;
            p.retain_available = Some(true);
            p.wildcard_subscription_available = Some(true);
            p.subscription_identifiers_available = Some(true);
            p.shared_subscription_available = Some(true);
            if session_expiry != connect.properties.session_expiry_interval.unwrap_or(0) {
                p.session_expiry_interval = Some(session_expiry);
            }
        }
        self.queue(&Packet::ConnAck(Box::new(ack)));
        let cp = &connect.properties;
        self.keep_alive = server_keep_alive.unwrap_or(connect.keep_alive);
        self.last_input = now;
        self.inbound_aliases = InboundAliases::new(super::inbound_alias_max(v, &s));
        self.inflight = Outbound::new(cp.receive_maximum.map_or(s.max_inflight, |r| r.min(s.max_inflight)));
        self.client_max_packet = cp.maximum_packet_size.unwrap_or(u32::MAX);
        self.problem_information = cp.request_problem_information.unwrap_or(true);
        self.outbound_aliases = OutboundAliases::new(cp.topic_alias_maximum.unwrap_or(0));
        self.session_expiry = session_expiry;
        self.will = connect.will.map(Box::new);
        self.awaiting_release = awaiting_release.into_iter().map(PacketId::get).collect();
        self.opened = true;
        // The handshake's requests are answered: an idle connection keeps no event queue.
        self.events.shrink_to_fit();
    }
}
