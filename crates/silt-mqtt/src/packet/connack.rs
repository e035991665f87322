//! CONNACK (spec §3.2). MQTT 3.x return codes are mapped to and from [`ReasonCode`] so the
//! broker uses one vocabulary: 1 ↔ Unsupported protocol version, 2 ↔ Client identifier not
//! valid, 3 ↔ Server unavailable, 4 ↔ Bad user name or password, 5 ↔ Not authorized. Encoding a
//! 5.0-only failure for a 3.x client sends the nearest 3.x code (Server unavailable by default).
//! MQTT 3.1 has no Session Present flag; it is sent as 0 and read as `false`.

use crate::error::{DecodeError, EncodeError, Malformed};
use crate::packet::{check_reason, read_reason};
use crate::properties::ConnAckProperties;
use crate::property::PropertySet;
use crate::reason::ReasonCode;
use crate::types::{PacketType, ProtocolVersion};
use crate::wire::{Reader, Sink};

/// A CONNACK packet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnAck {
    pub session_present: bool,
    pub reason_code: ReasonCode,
    /// Always empty before MQTT 5.0.
    pub properties: ConnAckProperties,
}

fn from_return_code(code: u8) -> Option<ReasonCode> {
    Some(match code {
        0 => ReasonCode::Success,
        1 => ReasonCode::UnsupportedProtocolVersion,
        2 => ReasonCode::ClientIdentifierNotValid,
        3 => ReasonCode::ServerUnavailable,
        4 => ReasonCode::BadUserNameOrPassword,
        5 => ReasonCode::NotAuthorized,
        _ => return None,
    })
}

/// The MQTT 3.x CONNACK return code that best reports `code`.
pub(crate) fn to_return_code(code: ReasonCode) -> u8 {
    match code {
        ReasonCode::Success => 0,
        ReasonCode::UnsupportedProtocolVersion => 1,
        ReasonCode::ClientIdentifierNotValid => 2,
        ReasonCode::BadUserNameOrPassword | ReasonCode::BadAuthenticationMethod => 4,
        ReasonCode::NotAuthorized | ReasonCode::Banned => 5,
        _ => 3,
    }
}

impl ConnAck {
    /// A successful CONNACK.
    pub fn accepted(session_present: bool) -> Self {
        Self { session_present, ..Self::default() }
    }

    /// A refusing CONNACK with `reason_code`.
    pub fn refused(reason_code: ReasonCode) -> Self {
        Self { reason_code, ..Self::default() }
    }

    pub(crate) fn decode(mut r: Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let flags = r.u8("acknowledge flags")?;
        let session_present = match version {
            ProtocolVersion::V3_1 => false,
            _ if flags & 0xFE != 0 => return Err(Malformed::InvalidConnAckFlags(flags).into()),
            _ => flags & 0x01 != 0,
        };
        let (reason_code, properties) = if version.is_v5() {
            let code = read_reason(&mut r, PacketType::ConnAck)?;
            (code, ConnAckProperties::read(&mut r)?)
        } else {
            let raw = r.u8("return code")?;
            (from_return_code(raw).ok_or(Malformed::InvalidReturnCode(raw))?, ConnAckProperties::default())
        };
        r.finish()?;
        Ok(Self { session_present, reason_code, properties })
    }

    pub(crate) fn write(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError> {
        let present = self.session_present && version != ProtocolVersion::V3_1;
        s.put_u8(u8::from(present));
        if version.is_v5() {
            check_reason(self.reason_code, PacketType::ConnAck)?;
            s.put_u8(self.reason_code.as_u8());
            self.properties.write_block(s)
        } else {
            s.put_u8(to_return_code(self.reason_code));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::wire::Counter;

    fn decode(body: &'static [u8], version: ProtocolVersion) -> Result<ConnAck, DecodeError> {
        ConnAck::decode(Reader::new(Bytes::from_static(body)), version)
    }

    #[test]
    fn v311_return_codes_map_to_reason_codes() {
        assert_eq!(decode(&[1, 0], ProtocolVersion::V3_1_1), Ok(ConnAck::accepted(true)));
        assert_eq!(
            decode(&[0, 4], ProtocolVersion::V3_1_1).map(|c| c.reason_code),
            Ok(ReasonCode::BadUserNameOrPassword)
        );
        assert_eq!(decode(&[0, 6], ProtocolVersion::V3_1_1), Err(Malformed::InvalidReturnCode(6).into()));
    }

    #[test]
    fn reserved_acknowledge_flags_are_malformed() {
        assert_eq!(decode(&[2, 0], ProtocolVersion::V3_1_1), Err(Malformed::InvalidConnAckFlags(2).into()));
    }

    #[test]
    fn v5_only_failures_become_server_unavailable_for_v3_clients() {
        assert_eq!(to_return_code(ReasonCode::QuotaExceeded), 3);
        assert_eq!(to_return_code(ReasonCode::Banned), 5);
    }

    #[test]
    fn v5_connack_may_not_carry_a_suback_code() {
        let connack = ConnAck::refused(ReasonCode::GrantedQoS1);
        assert!(connack.write(ProtocolVersion::V5, &mut Counter::default()).is_err());
    }
}
