//! Decode and encode errors, and the one function that maps a decode error to the reason code
//! the broker sends back.
//!
//! "Incomplete" is not an error: [`crate::decode`] returns `Ok(None)` for it. Every
//! `DecodeError` means the connection must be closed (after a CONNACK or DISCONNECT carrying
//! [`DecodeError::reason_code`] for MQTT 5.0 peers). The split between [`DecodeError::Malformed`]
//! and [`DecodeError::ProtocolError`] follows the spec's own wording for each rule.

use thiserror::Error;

use crate::property::PropertyId;
use crate::reason::ReasonCode;
use crate::types::{PacketType, ProtocolVersion};

/// Why a packet could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The bytes do not form a valid packet (spec: "is a Malformed Packet").
    #[error("malformed packet: {0}")]
    Malformed(#[from] Malformed),
    /// The packet is well formed but breaks a protocol rule (spec: "is a Protocol Error").
    #[error("protocol error: {0}")]
    ProtocolError(#[from] ProtocolViolation),
    /// The fixed header announces a packet larger than the configured maximum; detected
    /// before the body is awaited or buffered.
    #[error("packet of {size} bytes exceeds the maximum packet size of {max} bytes")]
    PacketTooLarge {
        /// Total packet size (fixed header included) announced by the header.
        size: u64,
        /// The limit in force.
        max: u32,
    },
    /// The CONNECT names a protocol name or level this codec does not speak.
    #[error("unsupported protocol {name:?} level {level}")]
    UnsupportedProtocolVersion {
        /// Protocol name from the CONNECT.
        name: String,
        /// Protocol level from the CONNECT.
        level: u8,
    },
}

impl DecodeError {
    /// The MQTT 5.0 reason code for the CONNACK or DISCONNECT that reports this error.
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            Self::Malformed(_) => ReasonCode::MalformedPacket,
            Self::ProtocolError(ProtocolViolation::WildcardInTopicName) => ReasonCode::TopicNameInvalid,
            Self::ProtocolError(ProtocolViolation::InvalidPropertyValue(PropertyId::TopicAlias)) => {
                ReasonCode::TopicAliasInvalid
            }
            Self::ProtocolError(_) => ReasonCode::ProtocolError,
            Self::PacketTooLarge { .. } => ReasonCode::PacketTooLarge,
            Self::UnsupportedProtocolVersion { .. } => ReasonCode::UnsupportedProtocolVersion,
        }
    }
}

/// A failed first packet: the error, and the protocol version when the CONNECT got far enough
/// to name one the codec speaks, so the broker knows how to encode its refusing CONNACK
/// (MQTT 3.x has no CONNACK code for a malformed CONNECT; the connection is just closed).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("CONNECT rejected: {error}")]
pub struct ConnectError {
    /// The version the CONNECT declared, if it is one this codec speaks.
    pub version: Option<ProtocolVersion>,
    /// What went wrong.
    pub error: DecodeError,
}

impl ConnectError {
    /// Shorthand for [`DecodeError::reason_code`].
    pub fn reason_code(&self) -> ReasonCode {
        self.error.reason_code()
    }
}

/// What made a packet malformed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Malformed {
    #[error("remaining length is longer than four bytes")]
    RemainingLengthTooLong,
    #[error("reserved packet type {0}")]
    ReservedPacketType(u8),
    #[error("invalid fixed header flags {flags:#06b} for {packet}")]
    InvalidFlags { packet: PacketType, flags: u8 },
    #[error("QoS 3 is not a QoS")]
    InvalidQos,
    #[error("packet ends inside {0}")]
    Truncated(&'static str),
    #[error("{0} trailing bytes after the end of the packet")]
    TrailingBytes(usize),
    #[error("{0} is not valid UTF-8")]
    InvalidUtf8(&'static str),
    #[error("{0} contains U+0000")]
    NullCharacter(&'static str),
    #[error("variable byte integer in {0} is longer than four bytes")]
    VarIntTooLong(&'static str),
    #[error("unknown property identifier {0:#04x}")]
    UnknownProperty(u32),
    #[error("property {property:?} is not allowed in {packet}")]
    PropertyNotAllowed { property: PropertyId, packet: &'static str },
    #[error("reserved CONNECT flag bit is set")]
    ConnectReservedFlag,
    #[error("will QoS or will retain set without the will flag")]
    WillFlagsWithoutWill,
    #[error("reserved CONNACK acknowledge flags {0:#04x}")]
    InvalidConnAckFlags(u8),
    #[error("undefined CONNACK return code {0}")]
    InvalidReturnCode(u8),
    #[error("undefined reason code {0:#04x}")]
    InvalidReasonCode(u8),
    #[error("reserved subscription option bits set in {0:#04x}")]
    InvalidSubscriptionOptions(u8),
}

/// Which protocol rule a well-formed packet breaks.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolViolation {
    #[error("packet identifier 0")]
    ZeroPacketId,
    #[error("property {0:?} appears more than once")]
    DuplicateProperty(PropertyId),
    #[error("property {0:?} has a value the spec forbids")]
    InvalidPropertyValue(PropertyId),
    #[error("reason code {code} is not allowed in {packet}")]
    ReasonCodeNotAllowed { code: ReasonCode, packet: PacketType },
    #[error("{0} carries no topic filter")]
    NoTopicFilters(PacketType),
    #[error("retain handling 3 is reserved")]
    InvalidRetainHandling,
    #[error("DUP set on a QoS 0 PUBLISH")]
    DupWithQos0,
    #[error("topic name contains a wildcard")]
    WildcardInTopicName,
    #[error("empty topic name without a topic alias")]
    EmptyTopicName,
    #[error("password flag set without user name flag")]
    PasswordWithoutUsername,
    #[error("authentication data without authentication method")]
    AuthDataWithoutMethod,
    #[error("first packet is {0}, not CONNECT")]
    FirstPacketNotConnect(PacketType),
}

/// Why a packet could not be encoded. Encoding checks everything before writing, so on error
/// the output buffer is left as it was.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    #[error("{0} is longer than 65535 bytes")]
    FieldTooLong(&'static str),
    #[error("{0} contains U+0000")]
    NullCharacter(&'static str),
    #[error("{0} exceeds 268435455")]
    VarIntTooLarge(&'static str),
    #[error("remaining length {0} exceeds 268435455 bytes")]
    PacketTooLarge(usize),
    #[error("{packet} does not exist in {version}")]
    NotInVersion { packet: PacketType, version: ProtocolVersion },
    #[error("CONNECT says {connect} but is being encoded as {requested}")]
    VersionMismatch { connect: ProtocolVersion, requested: ProtocolVersion },
    #[error("{0}")]
    Invalid(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_kind_maps_to_its_v5_reason_code() {
        assert_eq!(DecodeError::from(Malformed::InvalidQos).reason_code(), ReasonCode::MalformedPacket);
        assert_eq!(DecodeError::from(ProtocolViolation::ZeroPacketId).reason_code(), ReasonCode::ProtocolError);
        assert_eq!(DecodeError::PacketTooLarge { size: 10, max: 5 }.reason_code(), ReasonCode::PacketTooLarge);
        let unsupported = DecodeError::UnsupportedProtocolVersion { name: "MQTT".into(), level: 9 };
        assert_eq!(unsupported.reason_code(), ReasonCode::UnsupportedProtocolVersion);
        assert_eq!(
            DecodeError::from(ProtocolViolation::WildcardInTopicName).reason_code(),
            ReasonCode::TopicNameInvalid
        );
        assert_eq!(
            DecodeError::from(ProtocolViolation::InvalidPropertyValue(PropertyId::TopicAlias)).reason_code(),
            ReasonCode::TopicAliasInvalid
        );
    }
}
