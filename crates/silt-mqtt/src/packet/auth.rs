//! AUTH (spec §3.15), MQTT 5.0 only: extended authentication exchanges. Remaining length 0
//! means Success without properties. Encoding AUTH for MQTT 3.x is an error.

use crate::error::{DecodeError, EncodeError};
use crate::packet::{read_reason_tail, write_reason_tail};
use crate::properties::AuthProperties;
use crate::reason::ReasonCode;
use crate::types::{PacketType, ProtocolVersion};
use crate::wire::{Reader, Sink};

/// An AUTH packet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    pub reason_code: ReasonCode,
    pub properties: AuthProperties,
}

impl Auth {
    pub(crate) fn decode(mut r: Reader) -> Result<Self, DecodeError> {
        let (reason_code, properties) = read_reason_tail(&mut r, PacketType::Auth)?;
        r.finish()?;
        Ok(Self { reason_code, properties })
    }

    pub(crate) fn write(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError> {
        if !version.is_v5() {
            return Err(EncodeError::NotInVersion { packet: PacketType::Auth, version });
        }
        write_reason_tail(s, self.reason_code, &self.properties, PacketType::Auth)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::error::ProtocolViolation;

    #[test]
    fn continue_authentication_carries_method_and_data() {
        let body = &[0x18, 9, 0x15, 0, 3, b'x', b'y', b'z', 0x16, 0, 1, 7][..];
        let mut bytes = body.to_vec();
        bytes[1] = (bytes.len() - 2) as u8;
        let auth = Auth::decode(Reader::new(Bytes::from(bytes))).expect("valid");
        assert_eq!(auth.reason_code, ReasonCode::ContinueAuthentication);
        assert_eq!(auth.properties.authentication_method.as_deref(), Some("xyz"));
        assert_eq!(auth.properties.authentication_data.as_deref(), Some(&[7][..]));
    }

    #[test]
    fn auth_with_a_disconnect_reason_is_a_protocol_error() {
        let r = Auth::decode(Reader::new(Bytes::from_static(&[0x8E])));
        assert_eq!(
            r,
            Err(ProtocolViolation::ReasonCodeNotAllowed {
                code: ReasonCode::SessionTakenOver,
                packet: PacketType::Auth
            }
            .into())
        );
    }

    #[test]
    fn auth_does_not_exist_before_v5() {
        let r = Auth::default().write(ProtocolVersion::V3_1_1, &mut crate::wire::Counter::default());
        assert!(matches!(r, Err(EncodeError::NotInVersion { .. })));
    }
}
