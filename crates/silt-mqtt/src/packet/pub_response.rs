//! PUBACK, PUBREC, PUBREL and PUBCOMP (spec §3.4–3.7): a packet identifier and, in MQTT 5.0, a
//! reason code and properties.
//!
//! MQTT 5.0 short forms: remaining length 2 means reason Success with no properties; length 3
//! means a reason code with no properties. The encoder always picks the shortest form. Before
//! 5.0 the reason code and properties are not sent.

use crate::error::{DecodeError, EncodeError};
use crate::packet::{read_packet_id, read_reason_tail, write_reason_tail};
use crate::properties::AckProperties;
use crate::reason::ReasonCode;
use crate::types::{PacketId, PacketType, ProtocolVersion};
use crate::wire::{Reader, Sink};

/// The body shared by PUBACK, PUBREC, PUBREL and PUBCOMP; the [`crate::Packet`] variant says
/// which one it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubResponse {
    pub packet_id: PacketId,
    pub reason_code: ReasonCode,
    /// Always empty before MQTT 5.0.
    pub properties: AckProperties,
}

impl PubResponse {
    /// A successful response for `packet_id`.
    pub fn new(packet_id: PacketId) -> Self {
        Self { packet_id, reason_code: ReasonCode::Success, properties: AckProperties::default() }
    }

    pub(crate) fn decode(packet: PacketType, mut r: Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let packet_id = read_packet_id(&mut r)?;
        let (reason_code, properties) = if version.is_v5() {
            read_reason_tail(&mut r, packet)?
        } else {
            (ReasonCode::Success, AckProperties::default())
        };
        r.finish()?;
        Ok(Self { packet_id, reason_code, properties })
    }

    pub(crate) fn write(
        &self,
        packet: PacketType,
        version: ProtocolVersion,
        s: &mut impl Sink,
    ) -> Result<(), EncodeError> {
        s.put_u16(self.packet_id.get());
        if version.is_v5() {
            write_reason_tail(s, self.reason_code, &self.properties, packet)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};

    use super::*;
    use crate::error::{Malformed, ProtocolViolation};

    fn decode(packet: PacketType, body: &'static [u8]) -> Result<PubResponse, DecodeError> {
        PubResponse::decode(packet, Reader::new(Bytes::from_static(body)), ProtocolVersion::V5)
    }

    fn pid(n: u16) -> PacketId {
        PacketId::new(n).expect("non-zero")
    }

    #[test]
    fn two_byte_form_means_success_without_properties() {
        assert_eq!(decode(PacketType::PubAck, &[0, 9]), Ok(PubResponse::new(pid(9))));
    }

    #[test]
    fn three_byte_form_carries_a_reason_and_no_properties() {
        let r = decode(PacketType::PubRec, &[0, 9, 0x10]).expect("valid");
        assert_eq!(r.reason_code, ReasonCode::NoMatchingSubscribers);
        assert!(r.properties.is_empty());
    }

    #[test]
    fn full_form_carries_a_reason_string() {
        let r = decode(PacketType::PubAck, &[0, 9, 0x87, 5, 0x1F, 0, 2, b'n', b'o']).expect("valid");
        assert_eq!(r.reason_code, ReasonCode::NotAuthorized);
        assert_eq!(r.properties.reason_string.as_deref(), Some("no"));
    }

    #[test]
    fn pubrel_with_a_puback_reason_is_a_protocol_error() {
        assert_eq!(
            decode(PacketType::PubRel, &[0, 9, 0x10]),
            Err(ProtocolViolation::ReasonCodeNotAllowed {
                code: ReasonCode::NoMatchingSubscribers,
                packet: PacketType::PubRel
            }
            .into())
        );
        assert_eq!(decode(PacketType::PubRel, &[0, 9, 0x03]), Err(Malformed::InvalidReasonCode(3).into()));
    }

    #[test]
    fn encoder_picks_the_shortest_form() {
        let mut r = PubResponse::new(pid(1));
        let mut buf = BytesMut::new();
        r.write(PacketType::PubAck, ProtocolVersion::V5, &mut buf).expect("encodable");
        assert_eq!(&buf[..], &[0, 1]);
        r.reason_code = ReasonCode::QuotaExceeded;
        buf.clear();
        r.write(PacketType::PubAck, ProtocolVersion::V5, &mut buf).expect("encodable");
        assert_eq!(&buf[..], &[0, 1, 0x97]);
        buf.clear();
        r.write(PacketType::PubAck, ProtocolVersion::V3_1_1, &mut buf).expect("encodable");
        assert_eq!(&buf[..], &[0, 1]);
    }

    #[test]
    fn v311_ack_with_extra_bytes_is_malformed() {
        let r = PubResponse::decode(
            PacketType::PubAck,
            Reader::new(Bytes::from_static(&[0, 1, 0])),
            ProtocolVersion::V3_1_1,
        );
        assert_eq!(r, Err(Malformed::TrailingBytes(1).into()));
    }
}
