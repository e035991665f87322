//! Small value types shared by every packet: protocol version, QoS, packet identifier and
//! packet type.
//!
//! Invariants: a [`PacketId`] is never zero (the spec forbids 0 wherever an identifier is
//! carried), and a [`QoS`] is only ever 0, 1 or 2.

use std::fmt;
use std::num::NonZeroU16;

/// The MQTT protocol revision a connection speaks, fixed by its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProtocolVersion {
    /// MQTT 3.1: protocol name `MQIsdp`, level 3.
    V3_1,
    /// MQTT 3.1.1: protocol name `MQTT`, level 4.
    V3_1_1,
    /// MQTT 5.0: protocol name `MQTT`, level 5.
    V5,
}

impl ProtocolVersion {
    /// The protocol level byte of the CONNECT variable header.
    pub const fn level(self) -> u8 {
        match self {
            Self::V3_1 => 3,
            Self::V3_1_1 => 4,
            Self::V5 => 5,
        }
    }

    /// The protocol name string of the CONNECT variable header.
    pub const fn protocol_name(self) -> &'static str {
        match self {
            Self::V3_1 => "MQIsdp",
            Self::V3_1_1 | Self::V5 => "MQTT",
        }
    }

    /// Whether packets carry reason codes and properties (MQTT 5.0).
    pub const fn is_v5(self) -> bool {
        matches!(self, Self::V5)
    }

    /// The version named by a CONNECT's protocol name and level, if Silt speaks it.
    pub fn from_name_and_level(name: &str, level: u8) -> Option<Self> {
        match (name, level) {
            ("MQIsdp", 3) => Some(Self::V3_1),
            ("MQTT", 4) => Some(Self::V3_1_1),
            ("MQTT", 5) => Some(Self::V5),
            _ => None,
        }
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V3_1 => "MQTT 3.1",
            Self::V3_1_1 => "MQTT 3.1.1",
            Self::V5 => "MQTT 5.0",
        })
    }
}

/// Quality of service of a PUBLISH or a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum QoS {
    /// QoS 0: fire and forget.
    #[default]
    AtMostOnce = 0,
    /// QoS 1: acknowledged by PUBACK.
    AtLeastOnce = 1,
    /// QoS 2: PUBREC / PUBREL / PUBCOMP handshake.
    ExactlyOnce = 2,
}

impl QoS {
    /// Parses the two-bit wire value; 3 is not a QoS.
    pub const fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(Self::AtMostOnce),
            1 => Some(Self::AtLeastOnce),
            2 => Some(Self::ExactlyOnce),
            _ => None,
        }
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }
}

/// A non-zero 16-bit packet identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PacketId(NonZeroU16);

impl PacketId {
    /// `None` for 0, which is never a valid packet identifier.
    pub const fn new(value: u16) -> Option<Self> {
        match NonZeroU16::new(value) {
            Some(v) => Some(Self(v)),
            None => None,
        }
    }

    /// The wire value.
    pub const fn get(self) -> u16 {
        self.0.get()
    }
}

impl fmt::Display for PacketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The control packet type from the high nibble of the first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketType {
    Connect = 1,
    ConnAck = 2,
    Publish = 3,
    PubAck = 4,
    PubRec = 5,
    PubRel = 6,
    PubComp = 7,
    Subscribe = 8,
    SubAck = 9,
    Unsubscribe = 10,
    UnsubAck = 11,
    PingReq = 12,
    PingResp = 13,
    Disconnect = 14,
    /// MQTT 5.0 only; type 15 is reserved in 3.1 and 3.1.1.
    Auth = 15,
}

impl PacketType {
    /// Parses the high nibble; 0 is reserved and 15 exists only in MQTT 5.0.
    pub const fn from_nibble(value: u8, version: ProtocolVersion) -> Option<Self> {
        Some(match value {
            1 => Self::Connect,
            2 => Self::ConnAck,
            3 => Self::Publish,
            4 => Self::PubAck,
            5 => Self::PubRec,
            6 => Self::PubRel,
            7 => Self::PubComp,
            8 => Self::Subscribe,
            9 => Self::SubAck,
            10 => Self::Unsubscribe,
            11 => Self::UnsubAck,
            12 => Self::PingReq,
            13 => Self::PingResp,
            14 => Self::Disconnect,
            15 if version.is_v5() => Self::Auth,
            _ => return None,
        })
    }

    /// The fixed-header flag nibble the spec requires, or `None` for PUBLISH whose flags carry
    /// DUP, QoS and RETAIN.
    pub const fn required_flags(self) -> Option<u8> {
        match self {
            Self::Publish => None,
            Self::PubRel | Self::Subscribe | Self::Unsubscribe => Some(0b0010),
            _ => Some(0),
        }
    }
}

impl fmt::Display for PacketType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Connect => "CONNECT",
            Self::ConnAck => "CONNACK",
            Self::Publish => "PUBLISH",
            Self::PubAck => "PUBACK",
            Self::PubRec => "PUBREC",
            Self::PubRel => "PUBREL",
            Self::PubComp => "PUBCOMP",
            Self::Subscribe => "SUBSCRIBE",
            Self::SubAck => "SUBACK",
            Self::Unsubscribe => "UNSUBSCRIBE",
            Self::UnsubAck => "UNSUBACK",
            Self::PingReq => "PINGREQ",
            Self::PingResp => "PINGRESP",
            Self::Disconnect => "DISCONNECT",
            Self::Auth => "AUTH",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_id_zero_is_not_representable() {
        assert_eq!(PacketId::new(0), None);
        assert_eq!(PacketId::new(7).map(PacketId::get), Some(7));
    }

    #[test]
    fn auth_type_exists_only_in_v5() {
        assert_eq!(PacketType::from_nibble(15, ProtocolVersion::V5), Some(PacketType::Auth));
        assert_eq!(PacketType::from_nibble(15, ProtocolVersion::V3_1_1), None);
        assert_eq!(PacketType::from_nibble(0, ProtocolVersion::V5), None);
    }

    #[test]
    fn versions_are_named_by_name_and_level() {
        assert_eq!(ProtocolVersion::from_name_and_level("MQIsdp", 3), Some(ProtocolVersion::V3_1));
        assert_eq!(ProtocolVersion::from_name_and_level("MQTT", 4), Some(ProtocolVersion::V3_1_1));
        assert_eq!(ProtocolVersion::from_name_and_level("MQTT", 5), Some(ProtocolVersion::V5));
        assert_eq!(ProtocolVersion::from_name_and_level("MQTT", 3), None);
        assert_eq!(ProtocolVersion::from_name_and_level("MQIsdp", 4), None);
    }
}
