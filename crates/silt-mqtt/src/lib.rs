//! Sans-I/O MQTT 3.1, 3.1.1 and 5.0: the codec (bytes in, typed packets out, and back) and
//! the server side of a connection as a state machine ([`server::Connection`]). No sockets,
//! no runtime, no clocks: time is passed in, and the broker's connection task is the driver
//! that owns the socket and executes the connection's requests.
//!
//! Module map (all private; the public surface is the re-export list below):
//! - `codec`: framing — [`decode_connect`] for a connection's first packet, [`decode`] for the
//!   rest, [`Packet::encode`] / [`Packet::encoded_len`] for output.
//! - `packet`: [`Packet`] and one file per packet type (CONNECT, CONNACK, PUBLISH,
//!   PUBACK/PUBREC/PUBREL/PUBCOMP, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH).
//! - `properties`: typed MQTT 5.0 property sets, one per packet family.
//! - `property`: property identifiers and reading/writing a single property.
//! - `reason`: [`ReasonCode`], every MQTT 5.0 reason code, and which packet may carry it.
//! - `error`: [`DecodeError`] (Malformed vs Protocol Error, with [`DecodeError::reason_code`]),
//!   [`ConnectError`], [`EncodeError`].
//! - `types`: [`ProtocolVersion`], [`QoS`], [`PacketId`], [`PacketType`].
//! - `wire`: bounds-checked reader, byte/count sinks, variable byte integers, strings.
//! - `flow`: per-connection state without I/O — packet ids and the in-flight window
//!   ([`Outbound`]), topic aliases both ways, the keep-alive deadline (time passed in).
//! - [`server`]: one connection's protocol decisions, from CONNECT to DISCONNECT: input via
//!   `handle_*`, output via `poll_transmit` / `poll_timeout` / `poll_event` (quinn's model).
//!
//! What the codec checks: everything the spec decides from one packet alone (fixed-header
//! flags, lengths, UTF-8 and U+0000, duplicate or misplaced properties, property values,
//! reason codes per packet, wildcards in topic names). What it leaves to [`server`]: rules
//! that need connection state (topic alias ranges, receive maximum, packet identifier reuse,
//! a second CONNECT, which side may send which packet, client identifier rules, topic filter
//! syntax). What `server` leaves to the broker: policy (credentials, ACLs) and sessions.
//!
//! Decoding by hand (what [`server::Connection::handle_input`] does for a connection):
//!
//! ```
//! use bytes::BytesMut;
//! use silt_mqtt::{ConnAck, Packet, ProtocolVersion, decode, decode_connect};
//!
//! let mut input = BytesMut::from(&b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c\xc0\x00"[..]);
//! let connect = decode_connect(&mut input, 1 << 20).unwrap().expect("a whole CONNECT");
//! let version = connect.protocol_version;
//! assert_eq!(version, ProtocolVersion::V3_1_1);
//! assert_eq!(decode(&mut input, version, 1 << 20).unwrap(), Some(Packet::PingReq));
//!
//! let mut output = BytesMut::new();
//! Packet::from(ConnAck::accepted(false)).encode(version, &mut output).unwrap();
//! assert_eq!(&output[..], b"\x20\x02\x00\x00");
//! ```

mod codec;
mod error;
mod flow;
mod packet;
mod properties;
mod property;
mod reason;
pub mod server;
mod types;
mod wire;

pub use codec::{decode, decode_connect};
pub use error::{ConnectError, DecodeError, EncodeError, Malformed, ProtocolViolation};
pub use flow::{InboundAliases, Outbound, OutboundAliases, PubRecOutcome, keep_alive_deadline};
pub use packet::{
    Auth, ConnAck, Connect, Disconnect, Packet, PubResponse, Publish, PublishView, RetainHandling, SubAck, Subscribe,
    Subscription, SubscriptionOptions, UnsubAck, Unsubscribe, Will,
};
pub use properties::{
    AckProperties, AuthProperties, ConnAckProperties, ConnectProperties, DisconnectProperties, PublishProperties,
    PublishProps, SubscribeProperties, UnsubscribeProperties, WillProperties,
};
pub use property::{PropertyId, UserProperty};
pub use reason::ReasonCode;
pub use types::{PacketId, PacketType, ProtocolVersion, QoS};
