//! The [`Packet`] enum, one module per packet type, and the helpers they share.
//!
//! Each packet module decodes a body (the bytes after the fixed header) from a [`Reader`] and
//! writes a body into a [`Sink`]; [`crate::codec`] adds the fixed header and the framing.

mod auth;
mod connack;
mod connect;
mod disconnect;
mod pub_response;
mod publish;
mod suback;
mod subscribe;
mod unsuback;
mod unsubscribe;

pub use auth::Auth;
pub use connack::ConnAck;
pub use connect::{Connect, Will};
pub use disconnect::Disconnect;
pub use pub_response::PubResponse;
pub use publish::{Publish, PublishView};
pub use suback::SubAck;
pub use subscribe::{RetainHandling, Subscribe, Subscription, SubscriptionOptions};
pub use unsuback::UnsubAck;
pub use unsubscribe::Unsubscribe;

use crate::error::{DecodeError, EncodeError, Malformed, ProtocolViolation};
use crate::property::PropertySet;
use crate::reason::ReasonCode;
use crate::types::{PacketId, PacketType, ProtocolVersion};
use crate::wire::{Reader, Sink};

/// Any MQTT control packet. Rarely sent, large packets are boxed to keep the enum small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Connect(Box<Connect>),
    ConnAck(Box<ConnAck>),
    Publish(Publish),
    PubAck(PubResponse),
    PubRec(PubResponse),
    PubRel(PubResponse),
    PubComp(PubResponse),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(UnsubAck),
    PingReq,
    PingResp,
    Disconnect(Disconnect),
    /// MQTT 5.0 only. Boxed, as rare as it is large (112 bytes, the largest variant after
    /// PUBLISH's properties went out of line).
    Auth(Box<Auth>),
}

impl Packet {
    /// The control packet type.
    pub fn packet_type(&self) -> PacketType {
        match self {
            Packet::Connect(_) => PacketType::Connect,
            Packet::ConnAck(_) => PacketType::ConnAck,
            Packet::Publish(_) => PacketType::Publish,
            Packet::PubAck(_) => PacketType::PubAck,
            Packet::PubRec(_) => PacketType::PubRec,
            Packet::PubRel(_) => PacketType::PubRel,
            Packet::PubComp(_) => PacketType::PubComp,
            Packet::Subscribe(_) => PacketType::Subscribe,
            Packet::SubAck(_) => PacketType::SubAck,
            Packet::Unsubscribe(_) => PacketType::Unsubscribe,
            Packet::UnsubAck(_) => PacketType::UnsubAck,
            Packet::PingReq => PacketType::PingReq,
            Packet::PingResp => PacketType::PingResp,
            Packet::Disconnect(_) => PacketType::Disconnect,
            Packet::Auth(_) => PacketType::Auth,
        }
    }

    /// First byte of the fixed header.
    pub(crate) fn first_byte(&self) -> u8 {
        let ty = self.packet_type();
        let flags = match self {
            Packet::Publish(p) => p.flags(),
            _ => ty.required_flags().unwrap_or(0),
        };
        ((ty as u8) << 4) | flags
    }

    /// Decodes a body whose fixed header has already been validated.
    pub(crate) fn decode_body(
        ty: PacketType,
        flags: u8,
        r: Reader,
        version: ProtocolVersion,
    ) -> Result<Self, DecodeError> {
        Ok(match ty {
            PacketType::Connect => Packet::Connect(Box::new(Connect::decode(r).map_err(|e| e.error)?)),
            PacketType::ConnAck => Packet::ConnAck(Box::new(ConnAck::decode(r, version)?)),
            PacketType::Publish => Packet::Publish(Publish::decode(flags, r, version)?),
            PacketType::PubAck => Packet::PubAck(PubResponse::decode(ty, r, version)?),
            PacketType::PubRec => Packet::PubRec(PubResponse::decode(ty, r, version)?),
            PacketType::PubRel => Packet::PubRel(PubResponse::decode(ty, r, version)?),
            PacketType::PubComp => Packet::PubComp(PubResponse::decode(ty, r, version)?),
            PacketType::Subscribe => Packet::Subscribe(Subscribe::decode(r, version)?),
            PacketType::SubAck => Packet::SubAck(SubAck::decode(r, version)?),
            PacketType::Unsubscribe => Packet::Unsubscribe(Unsubscribe::decode(r, version)?),
            PacketType::UnsubAck => Packet::UnsubAck(UnsubAck::decode(r, version)?),
            PacketType::PingReq => {
                r.finish()?;
                Packet::PingReq
            }
            PacketType::PingResp => {
                r.finish()?;
                Packet::PingResp
            }
            PacketType::Disconnect => Packet::Disconnect(Disconnect::decode(r, version)?),
            PacketType::Auth => {
                // `PacketType::from_nibble` only yields Auth for 5.0; re-check so the body
                // decoder never depends on that.
                if !version.is_v5() {
                    return Err(Malformed::ReservedPacketType(PacketType::Auth as u8).into());
                }
                Packet::Auth(Box::new(Auth::decode(r)?))
            }
        })
    }
}

/// Writes the body (everything after the fixed header).
impl crate::codec::Body for Packet {
    fn write_body(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError> {
        let ty = self.packet_type();
        match self {
            Packet::Connect(p) => p.write(version, s),
            Packet::ConnAck(p) => p.write(version, s),
            Packet::Publish(p) => p.write(version, s),
            Packet::PubAck(p) | Packet::PubRec(p) | Packet::PubRel(p) | Packet::PubComp(p) => p.write(ty, version, s),
            Packet::Subscribe(p) => p.write(version, s),
            Packet::SubAck(p) => p.write(version, s),
            Packet::Unsubscribe(p) => p.write(version, s),
            Packet::UnsubAck(p) => p.write(version, s),
            Packet::PingReq | Packet::PingResp => Ok(()),
            Packet::Disconnect(p) => p.write(version, s),
            Packet::Auth(p) => p.write(version, s),
        }
    }
}

macro_rules! impl_from {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        $(impl From<$ty> for Packet {
            fn from(p: $ty) -> Self {
                Packet::$variant(p)
            }
        })*
    };
}

impl_from!(Publish(Publish), Subscribe(Subscribe), SubAck(SubAck), Unsubscribe(Unsubscribe), UnsubAck(UnsubAck));
impl_from!(Disconnect(Disconnect));

impl From<Auth> for Packet {
    fn from(p: Auth) -> Self {
        Packet::Auth(Box::new(p))
    }
}

impl From<Connect> for Packet {
    fn from(p: Connect) -> Self {
        Packet::Connect(Box::new(p))
    }
}

impl From<ConnAck> for Packet {
    fn from(p: ConnAck) -> Self {
        Packet::ConnAck(Box::new(p))
    }
}

/// A two-byte packet identifier; 0 is a Protocol Error.
pub(crate) fn read_packet_id(r: &mut Reader) -> Result<PacketId, DecodeError> {
    PacketId::new(r.u16("packet identifier")?).ok_or_else(|| ProtocolViolation::ZeroPacketId.into())
}

/// A topic name must not contain wildcards and must not be empty unless a Topic Alias
/// stands in for it.
pub(crate) fn check_topic_name(topic: &str, has_alias: bool) -> Result<(), DecodeError> {
    if topic.contains(['+', '#']) {
        return Err(ProtocolViolation::WildcardInTopicName.into());
    }
    if topic.is_empty() && !has_alias {
        return Err(ProtocolViolation::EmptyTopicName.into());
    }
    Ok(())
}

/// A reason code byte: undefined values are Malformed, values the packet may not carry are
/// Protocol Errors.
pub(crate) fn read_reason(r: &mut Reader, packet: PacketType) -> Result<ReasonCode, DecodeError> {
    let byte = r.u8("reason code")?;
    let code = ReasonCode::from_u8(byte).ok_or(Malformed::InvalidReasonCode(byte))?;
    if !code.allowed_in(packet) {
        return Err(ProtocolViolation::ReasonCodeNotAllowed { code, packet }.into());
    }
    Ok(code)
}

pub(crate) fn check_reason(code: ReasonCode, packet: PacketType) -> Result<(), EncodeError> {
    if code.allowed_in(packet) { Ok(()) } else { Err(EncodeError::Invalid("reason code not allowed in this packet")) }
}

/// The optional "reason code, then optional properties" tail of PUBACK-family, DISCONNECT and
/// AUTH packets: absent means Success without properties.
pub(crate) fn read_reason_tail<P: PropertySet>(
    r: &mut Reader,
    packet: PacketType,
) -> Result<(ReasonCode, P), DecodeError> {
    if r.is_empty() {
        return Ok((ReasonCode::Success, P::default()));
    }
    let code = read_reason(r, packet)?;
    let properties = if r.is_empty() { P::default() } else { P::read(r)? };
    Ok((code, properties))
}

/// Writes the shortest tail that [`read_reason_tail`] reads back as `(code, properties)`.
pub(crate) fn write_reason_tail<P: PropertySet + PartialEq>(
    s: &mut impl Sink,
    code: ReasonCode,
    properties: &P,
    packet: PacketType,
) -> Result<(), EncodeError> {
    check_reason(code, packet)?;
    let no_properties = *properties == P::default();
    if code == ReasonCode::Success && no_properties {
        return Ok(());
    }
    s.put_u8(code.as_u8());
    if no_properties { Ok(()) } else { properties.write_block(s) }
}
