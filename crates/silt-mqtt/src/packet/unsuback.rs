//! UNSUBACK (spec §3.11). Before MQTT 5.0 it carries only the packet identifier, so reason
//! codes are not sent and decode as an empty list.

use crate::error::{DecodeError, EncodeError};
use crate::packet::{check_reason, read_packet_id, read_reason};
use crate::properties::AckProperties;
use crate::property::PropertySet;
use crate::reason::ReasonCode;
use crate::types::{PacketId, PacketType, ProtocolVersion};
use crate::wire::{Reader, Sink};

/// An UNSUBACK packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsubAck {
    pub packet_id: PacketId,
    /// One per filter in MQTT 5.0; always empty before.
    pub reason_codes: Vec<ReasonCode>,
    /// Always empty before MQTT 5.0.
    pub properties: AckProperties,
}

impl UnsubAck {
    pub(crate) fn decode(mut r: Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let packet_id = read_packet_id(&mut r)?;
        let mut ack = Self { packet_id, reason_codes: Vec::new(), properties: AckProperties::default() };
        if version.is_v5() {
            ack.properties = AckProperties::read(&mut r)?;
            while !r.is_empty() {
                ack.reason_codes.push(read_reason(&mut r, PacketType::UnsubAck)?);
            }
        }
        r.finish()?;
        Ok(ack)
    }

    pub(crate) fn write(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError> {
        s.put_u16(self.packet_id.get());
        if version.is_v5() {
            self.properties.write_block(s)?;
            for &code in &self.reason_codes {
                check_reason(code, PacketType::UnsubAck)?;
                s.put_u8(code.as_u8());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn v5_unsuback_lists_a_code_per_filter() {
        let r = UnsubAck::decode(Reader::new(Bytes::from_static(&[0, 2, 0, 0x00, 0x11])), ProtocolVersion::V5)
            .expect("valid");
        assert_eq!(r.reason_codes, [ReasonCode::Success, ReasonCode::NoSubscriptionExisted]);
    }
}
