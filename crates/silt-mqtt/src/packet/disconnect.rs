//! DISCONNECT (spec §3.14). Remaining length 0 means Normal disconnection without properties;
//! length 1 means a reason code without properties. Before MQTT 5.0 it has no body at all.

use crate::error::{DecodeError, EncodeError};
use crate::packet::{read_reason_tail, write_reason_tail};
use crate::properties::DisconnectProperties;
use crate::reason::ReasonCode;
use crate::types::{PacketType, ProtocolVersion};
use crate::wire::{Reader, Sink};

/// A DISCONNECT packet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Disconnect {
    pub reason_code: ReasonCode,
    /// Always empty before MQTT 5.0.
    pub properties: DisconnectProperties,
}

impl Disconnect {
    /// A DISCONNECT with `reason_code` and no properties.
    pub fn new(reason_code: ReasonCode) -> Self {
        Self { reason_code, properties: DisconnectProperties::default() }
    }

    pub(crate) fn decode(mut r: Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let (reason_code, properties) = if version.is_v5() {
            read_reason_tail(&mut r, PacketType::Disconnect)?
        } else {
            (ReasonCode::NORMAL_DISCONNECTION, DisconnectProperties::default())
        };
        r.finish()?;
        Ok(Self { reason_code, properties })
    }

    pub(crate) fn write(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError> {
        if version.is_v5() {
            write_reason_tail(s, self.reason_code, &self.properties, PacketType::Disconnect)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::error::Malformed;

    fn decode(body: &'static [u8], version: ProtocolVersion) -> Result<Disconnect, DecodeError> {
        Disconnect::decode(Reader::new(Bytes::from_static(body)), version)
    }

    #[test]
    fn empty_body_is_normal_disconnection() {
        assert_eq!(decode(&[], ProtocolVersion::V5), Ok(Disconnect::default()));
    }

    #[test]
    fn reason_only_and_session_expiry_forms_decode() {
        assert_eq!(decode(&[0x04], ProtocolVersion::V5), Ok(Disconnect::new(ReasonCode::DisconnectWithWillMessage)));
        let d = decode(&[0x00, 5, 0x11, 0, 0, 0, 0], ProtocolVersion::V5).expect("valid");
        assert_eq!(d.properties.session_expiry_interval, Some(0));
    }

    #[test]
    fn v311_disconnect_with_body_is_malformed() {
        assert_eq!(decode(&[0], ProtocolVersion::V3_1_1), Err(Malformed::TrailingBytes(1).into()));
    }
}
