//! SUBACK (spec §3.9): one reason code per requested filter, in request order.
//!
//! Before MQTT 5.0 the codes are 0, 1, 2 (granted QoS) and 0x80 (failure); encoding any 5.0
//! failure code for a 3.x client sends 0x80, and decoding 0x80 yields Unspecified error.

use crate::error::{DecodeError, EncodeError, Malformed};
use crate::packet::{check_reason, read_packet_id, read_reason};
use crate::properties::AckProperties;
use crate::property::PropertySet;
use crate::reason::ReasonCode;
use crate::types::{PacketId, PacketType, ProtocolVersion};
use crate::wire::{Reader, Sink};

/// A SUBACK packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubAck {
    pub packet_id: PacketId,
    pub reason_codes: Vec<ReasonCode>,
    /// Always empty before MQTT 5.0.
    pub properties: AckProperties,
}

impl SubAck {
    pub(crate) fn decode(mut r: Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let packet_id = read_packet_id(&mut r)?;
        let properties = if version.is_v5() { AckProperties::read(&mut r)? } else { AckProperties::default() };
        let mut reason_codes = Vec::with_capacity(r.remaining());
        while !r.is_empty() {
            let code = if version.is_v5() {
                read_reason(&mut r, PacketType::SubAck)?
            } else {
                match r.u8("return code")? {
                    0 => ReasonCode::GRANTED_QOS_0,
                    1 => ReasonCode::GrantedQoS1,
                    2 => ReasonCode::GrantedQoS2,
                    0x80 => ReasonCode::UnspecifiedError,
                    other => return Err(Malformed::InvalidReturnCode(other).into()),
                }
            };
            reason_codes.push(code);
        }
        Ok(Self { packet_id, reason_codes, properties })
    }

    pub(crate) fn write(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError> {
        s.put_u16(self.packet_id.get());
        if version.is_v5() {
            self.properties.write_block(s)?;
        }
        for &code in &self.reason_codes {
            check_reason(code, PacketType::SubAck)?;
            let byte = match code {
                ReasonCode::Success | ReasonCode::GrantedQoS1 | ReasonCode::GrantedQoS2 => code.as_u8(),
                _ if version.is_v5() => code.as_u8(),
                _ => 0x80,
            };
            s.put_u8(byte);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};

    use super::*;

    #[test]
    fn v5_failure_codes_collapse_to_0x80_for_v311() {
        let ack = SubAck {
            packet_id: PacketId::new(3).expect("non-zero"),
            reason_codes: vec![ReasonCode::GrantedQoS1, ReasonCode::WildcardSubscriptionsNotSupported],
            properties: AckProperties::default(),
        };
        let mut buf = BytesMut::new();
        ack.write(ProtocolVersion::V3_1_1, &mut buf).expect("encodable");
        assert_eq!(&buf[..], &[0, 3, 1, 0x80]);
        let back = SubAck::decode(Reader::new(buf.freeze()), ProtocolVersion::V3_1_1).expect("decodable");
        assert_eq!(back.reason_codes, [ReasonCode::GrantedQoS1, ReasonCode::UnspecifiedError]);
    }

    #[test]
    fn v311_reserved_return_code_is_malformed() {
        let r = SubAck::decode(Reader::new(Bytes::from_static(&[0, 3, 0x81])), ProtocolVersion::V3_1_1);
        assert_eq!(r, Err(Malformed::InvalidReturnCode(0x81).into()));
    }
}
