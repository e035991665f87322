//! What passes between a [`Connection`](super::Connection) and its driver: the settings it
//! starts with, the [`Event`]s it raises (requests to the broker), the answers the driver
//! feeds back, and why a connection ended ([`Close`]).
//!
//! Every request that needs an answer carries a [`Token`]; the driver answers each one
//! exactly once, in any order (the connection restores the order the protocol needs).

use std::time::Duration;

use bytes::Bytes;
use silt_types::TopicFilter;

use crate::error::DecodeError;
use crate::packet::{Publish, SubscriptionOptions, Will};
use crate::reason::ReasonCode;
use crate::types::{PacketId, QoS};

/// The server's limits and announcements, the same for every connection of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Largest packet accepted from the client, fixed header included.
    pub max_packet_size: u32,
    /// QoS 1/2 PUBLISHes the client may have unacknowledged (our Receive Maximum); one more
    /// is DISCONNECT 0x93.
    pub receive_maximum: u16,
    /// Outbound QoS 1/2 messages in flight at most; the client's Receive Maximum may lower it.
    pub max_inflight: u16,
    /// Highest topic alias accepted from an MQTT 5.0 client.
    pub topic_alias_maximum: u16,
    /// Longest keep alive an MQTT 5.0 client keeps (longer ones and 0 are lowered to it by
    /// Server Keep Alive), seconds; 0 leaves every client's own.
    pub server_keep_alive: u16,
    /// Largest session expiry interval granted, seconds.
    pub max_session_expiry: u32,
    /// How long a client has to send its CONNECT.
    pub connect_timeout: Duration,
    /// Largest CONNECT accepted, fixed header included: kept well below `max_packet_size`,
    /// since a connection that has not authenticated yet should cost little.
    pub max_connect_size: u32,
    /// Most levels a topic name or filter may have (`a/b/c` has 3). A client chooses how deep
    /// its topics go, and every level costs the broker memory and work; deeper topics are
    /// refused with Topic Name invalid (0x90) or Topic Filter invalid (0x8F).
    pub max_topic_levels: u16,
}

/// Names a request the connection awaits an answer to: a store, a SUBSCRIBE, an UNSUBSCRIBE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub(crate) u32);

/// A request from the connection to the broker, or news the broker must act on.
#[derive(Debug)]
pub enum Event<T> {
    /// A CONNECT arrived: check these credentials and answer with
    /// [`handle_authenticated`](super::Connection::handle_authenticated).
    Authenticate(Credentials),
    /// The CONNECT passed every protocol check: apply policy to the will topic, take the
    /// session over (or create it) and answer with [`accept`](super::Connection::accept) or
    /// [`refuse`](super::Connection::refuse).
    Open(Box<OpenRequest>),
    /// Store an application message (its topic already resolved from any alias). With a
    /// token (QoS 1/2) answer with [`handle_stored`](super::Connection::handle_stored); a QoS 0
    /// message is nobody's concern once handed over.
    Publish { token: Option<Token>, publish: Publish },
    /// A QoS 2 message was stored and its PUBREC queued: the session must remember the id
    /// until PUBREL, so that a resend after a reconnect is not stored twice.
    Qos2Received(PacketId),
    /// PUBREL released a QoS 2 id the session remembered.
    Qos2Released(PacketId),
    /// Make these subscriptions; answer with [`handle_subscribed`](super::Connection::handle_subscribed).
    Subscribe(SubscribeRequest),
    /// Remove these subscriptions; answer with
    /// [`handle_unsubscribed`](super::Connection::handle_unsubscribed).
    Unsubscribe(UnsubscribeRequest),
    /// Send the retained messages matching `filter` (a subscription was just made), at most
    /// at `qos`, tagged with the subscription identifier.
    Retained { filter: TopicFilter, qos: QoS, subscription_id: Option<u32> },
    /// The client received outbound QoS 2 message `id` (PUBREC) and PUBREL is queued: from now
    /// on a reconnect resends the PUBREL, never the PUBLISH (MQTT 4.3.3). Record it with the
    /// session before the PUBREL goes out.
    OutboundReleased(PacketId),
    /// An outbound message is complete (PUBACK, PUBCOMP, or a refusing PUBREC): settle it.
    Delivered { id: PacketId, qos: QoS, data: T },
    /// The client set a new session expiry interval (seconds, already capped) on DISCONNECT.
    SessionExpiry(u32),
    /// The connection ended with this message unacknowledged: it is to be sent again (by the
    /// next connection of the session, or to another member of a shared group).
    Undelivered(T),
    /// The connection is over. Write out what [`poll_transmit`](super::Connection::poll_transmit)
    /// holds, close the transport, then publish the will, if any. The last event.
    Closed { reason: Close, will: Option<DelayedWill> },
}

/// A will to publish once `delay` has passed, unless the client comes back first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayedWill {
    pub will: Box<Will>,
    pub delay: Duration,
}

/// The credentials of a CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: Option<String>,
    pub password: Option<Bytes>,
}

/// An authenticated CONNECT the broker is to open a session for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRequest {
    /// As sent, or assigned by the server for an empty one.
    pub client_id: String,
    /// Discard any existing session.
    pub clean_start: bool,
    /// Seconds the session outlives the connection (`u32::MAX`: never expires).
    pub session_expiry: u32,
    /// The will's topic, for the broker to authorize.
    pub will_topic: Option<String>,
}

/// Why the broker refuses a CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Unknown user or wrong password.
    BadCredentials,
    /// Authenticated, but not allowed (to connect, to use that will topic, or to take over
    /// a session another user owns).
    NotAuthorized,
    /// The server cannot check the credentials now (its verifiers are saturated): try again
    /// later. MQTT 5.0 Server busy (0x89); 3.1.1 Server unavailable (3).
    ServerBusy,
    /// The server holds as many connections as it is configured for. MQTT 5.0 Quota exceeded
    /// (0x97); 3.1.1 Server unavailable (3).
    QuotaExceeded,
}

impl Refusal {
    pub(crate) fn reason_code(self) -> ReasonCode {
        match self {
            Refusal::BadCredentials => ReasonCode::BadUserNameOrPassword,
            Refusal::NotAuthorized => ReasonCode::NotAuthorized,
            Refusal::ServerBusy => ReasonCode::ServerBusy,
            Refusal::QuotaExceeded => ReasonCode::QuotaExceeded,
        }
    }
}

/// The broker's answer to [`Event::Publish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Durable: acknowledge it.
    Durable,
    /// The client may not publish there: acknowledge with 0x87 and drop it (MQTT 3.1.1 cannot
    /// say no, so the message is acknowledged and dropped, as mosquitto does).
    NotAuthorized,
    /// It could not be stored: 0x80 in MQTT 5.0; MQTT 3.1.1 has no negative acknowledgement,
    /// so the connection closes and the client resends after reconnecting.
    Failed,
}

/// One filter of a SUBSCRIBE, checked and ready for the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeFilter {
    pub filter: SubscriptionFilter,
    /// MQTT 5.0 options are cleared for earlier versions, whose options byte holds only QoS.
    pub options: SubscriptionOptions,
}

/// A filter to subscribe to or unsubscribe from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriptionFilter {
    Plain(TopicFilter),
    /// `$share/{group}/{filter}`: `key` is the whole string, `filter` its filter part.
    Shared {
        key: String,
        filter: TopicFilter,
    },
}

/// The filters of a SUBSCRIBE that need the broker, in packet order (those refused by the
/// protocol alone are answered by the connection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeRequest {
    pub token: Token,
    pub subscription_id: Option<u32>,
    pub filters: Vec<SubscribeFilter>,
}

/// The broker's answer for one [`SubscribeFilter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subscribed {
    /// Made (or replaced: `existed`), at the QoS asked for.
    Granted {
        existed: bool,
    },
    NotAuthorized,
    /// The session holds as many subscriptions as the broker allows (SUBACK 0x97 in 5.0, 0x80
    /// in 3.1.1).
    QuotaExceeded,
    Failed,
}

/// The filters of an UNSUBSCRIBE that need the broker, in packet order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsubscribeRequest {
    pub token: Token,
    pub filters: Vec<UnsubscribeFilter>,
}

/// A filter to unsubscribe from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnsubscribeFilter {
    Plain(TopicFilter),
    /// Anything starting with `$share/`, as sent: the broker knows whether it is a member.
    Shared(String),
}

/// What became of an outbound message handed to [`send`](super::Connection::send).
#[derive(Debug, PartialEq, Eq)]
pub enum Sent<T> {
    /// Queued for transmission; a QoS 1/2 message is in flight under this id until the client
    /// completes it ([`Event::Delivered`]).
    Queued(Option<PacketId>),
    /// Larger than the client's Maximum Packet Size: discarded as if delivered (MQTT 5.0
    /// §3.1.2.11.4). Settle it.
    TooLarge(T),
    /// Not sent: the in-flight window is full, or the connection is not open. Offer it again.
    NoRoom(T),
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Close {
    /// The client sent DISCONNECT; reason 0x04 asks for the will to be published.
    Client { with_will: bool },
    /// The transport closed or failed; or an MQTT 3.1.1 publish could not be stored.
    Lost,
    /// Nothing from the client for one and a half keep-alive intervals.
    KeepAliveTimeout,
    /// A packet could not be decoded (malformed, a protocol error, too large).
    Malformed(DecodeError),
    /// A well-formed packet broke a rule that needs connection state, or the server failed:
    /// DISCONNECT with this reason (MQTT 5.0), and the explanation as its Reason String.
    Error(ReasonCode, &'static str),
    /// Another connection took the client identifier over.
    TakenOver,
    /// The server is shutting down; no will is published.
    Shutdown,
    /// No CONNECT within the connect timeout.
    ConnectTimeout,
    /// The CONNECT was refused with this code (a CONNACK carries it if the client can read one).
    Refused(ReasonCode),
}

impl Close {
    /// The reason code of the DISCONNECT an MQTT 5.0 client gets, if any. A decode error
    /// whose code a DISCONNECT may not carry (0x84 for a second CONNECT naming an unknown
    /// version, say) is reported as a protocol error.
    pub fn disconnect_reason(&self) -> Option<ReasonCode> {
        let code = match self {
            Close::KeepAliveTimeout => ReasonCode::KeepAliveTimeout,
            Close::Malformed(e) => e.reason_code(),
            Close::Error(code, _) => *code,
            Close::TakenOver => ReasonCode::SessionTakenOver,
            Close::Shutdown => ReasonCode::ServerShuttingDown,
            Close::Client { .. } | Close::Lost | Close::ConnectTimeout | Close::Refused(_) => return None,
        };
        Some(if code.allowed_in(crate::types::PacketType::Disconnect) { code } else { ReasonCode::ProtocolError })
    }

    /// The Reason String of the DISCONNECT: what went wrong, as precisely as known.
    pub fn explanation(&self) -> Option<String> {
        match self {
            Close::Malformed(e) => Some(e.to_string()),
            Close::Error(_, why) => Some((*why).to_owned()),
            _ => self.disconnect_reason().and_then(ReasonCode::explanation).map(str::to_owned),
        }
    }

    /// Whether the will is published (MQTT §3.1.2.5: on any close but a normal DISCONNECT).
    pub fn publishes_will(&self) -> bool {
        match self {
            Close::Client { with_will } => *with_will,
            Close::Shutdown => false,
            _ => true,
        }
    }
}
