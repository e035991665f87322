//! PUBLISH (spec §3.3). The payload is a zero-copy slice of the received frame.
//!
//! Checked here: QoS 3 (Malformed), DUP on QoS 0 and packet identifier 0 (Protocol Error),
//! wildcards in the topic name, and an empty topic name without a Topic Alias. Not checked:
//! whether a Topic Alias is within the negotiated maximum, whether a client may send
//! Subscription Identifiers, payload format — all need connection state the codec lacks.

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError, Malformed, ProtocolViolation};
use crate::packet::{check_topic_name, read_packet_id};
use crate::properties::{PublishProperties, PublishProps};
use crate::property::PropertySet;
use crate::types::{PacketId, ProtocolVersion, QoS};
use crate::wire::{Reader, Sink, put_string};

/// A PUBLISH packet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Publish {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// Empty only in MQTT 5.0 with a Topic Alias in the properties.
    pub topic: String,
    /// `Some` exactly when `qos` is 1 or 2.
    pub packet_id: Option<PacketId>,
    /// Always empty before MQTT 5.0.
    pub properties: PublishProps,
    pub payload: Bytes,
}

impl Publish {
    /// A QoS 0, non-retained PUBLISH.
    pub fn new(topic: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self { topic: topic.into(), payload: payload.into(), ..Self::default() }
    }

    pub(crate) fn flags(&self) -> u8 {
        self.view().flags()
    }

    /// This PUBLISH, borrowed (for [`crate::server::Connection::send`]).
    pub fn view(&self) -> PublishView<'_> {
        PublishView {
            dup: self.dup,
            qos: self.qos,
            retain: self.retain,
            topic: &self.topic,
            packet_id: self.packet_id,
            properties: &self.properties,
            payload: &self.payload,
        }
    }

    pub(crate) fn decode(flags: u8, mut r: Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let qos = QoS::from_u8((flags >> 1) & 0b11).ok_or(Malformed::InvalidQos)?;
        let dup = flags & 0b1000 != 0;
        if dup && qos == QoS::AtMostOnce {
            return Err(ProtocolViolation::DupWithQos0.into());
        }
        let topic = r.string("topic name")?;
        let packet_id = if qos == QoS::AtMostOnce { None } else { Some(read_packet_id(&mut r)?) };
        let properties =
            if version.is_v5() { PublishProperties::read(&mut r)?.into() } else { PublishProps::default() };
        check_topic_name(&topic, properties.topic_alias.is_some())?;
        Ok(Self { dup, qos, retain: flags & 1 != 0, topic, packet_id, properties, payload: r.rest() })
    }

    pub(crate) fn write(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError> {
        crate::codec::Body::write_body(&self.view(), version, s)
    }
}

/// A PUBLISH whose topic, properties and payload are borrowed: how a broker sends one message
/// to many subscribers, encoding each copy straight from the message they share instead of
/// cloning its topic (an allocation) and payload (a reference count every subscriber's core
/// touches) into a [`Publish`] per delivery.
#[derive(Debug, Clone, Copy)]
pub struct PublishView<'a> {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    pub topic: &'a str,
    pub packet_id: Option<PacketId>,
    pub properties: &'a PublishProperties,
    pub payload: &'a [u8],
}

impl PublishView<'_> {
    pub(crate) fn flags(&self) -> u8 {
        (u8::from(self.dup) << 3) | (self.qos.as_u8() << 1) | u8::from(self.retain)
    }

    /// Appends the encoded PUBLISH to `buf`, as [`crate::Packet::encode`] would that of the
    /// [`Publish`] holding the same fields. On error `buf` is unchanged.
    pub fn encode(&self, version: ProtocolVersion, buf: &mut bytes::BytesMut) -> Result<(), EncodeError> {
        crate::codec::encode_with(0x30 | self.flags(), self, version, buf)
    }
}

impl crate::codec::Body for PublishView<'_> {
    fn write_body(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError> {
        if self.dup && self.qos == QoS::AtMostOnce {
            return Err(EncodeError::Invalid("DUP set on a QoS 0 PUBLISH"));
        }
        put_string(s, self.topic, "topic name")?;
        match (self.qos, self.packet_id) {
            (QoS::AtMostOnce, None) => {}
            (QoS::AtMostOnce, Some(_)) => return Err(EncodeError::Invalid("packet identifier on a QoS 0 PUBLISH")),
            (_, Some(id)) => s.put_u16(id.get()),
            (_, None) => return Err(EncodeError::Invalid("QoS 1 or 2 PUBLISH without a packet identifier")),
        }
        if version.is_v5() {
            self.properties.write_block(s)?;
        }
        s.put_slice(self.payload);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(flags: u8, body: &'static [u8], version: ProtocolVersion) -> Result<Publish, DecodeError> {
        Publish::decode(flags, Reader::new(Bytes::from_static(body)), version)
    }

    #[test]
    fn qos_three_is_malformed() {
        assert_eq!(decode(0b0110, b"\x00\x01a\x00\x01", ProtocolVersion::V3_1_1), Err(Malformed::InvalidQos.into()));
    }

    #[test]
    fn zero_packet_id_is_a_protocol_error() {
        assert_eq!(
            decode(0b0010, b"\x00\x01a\x00\x00", ProtocolVersion::V3_1_1),
            Err(ProtocolViolation::ZeroPacketId.into())
        );
    }

    #[test]
    fn dup_on_qos0_is_a_protocol_error() {
        assert_eq!(decode(0b1000, b"\x00\x01a", ProtocolVersion::V3_1_1), Err(ProtocolViolation::DupWithQos0.into()));
    }

    #[test]
    fn wildcard_topic_is_rejected() {
        assert_eq!(
            decode(0, b"\x00\x03a/#", ProtocolVersion::V3_1_1),
            Err(ProtocolViolation::WildcardInTopicName.into())
        );
    }

    #[test]
    fn empty_topic_needs_a_topic_alias() {
        assert_eq!(decode(0, b"\x00\x00\x00", ProtocolVersion::V5), Err(ProtocolViolation::EmptyTopicName.into()));
        let aliased = decode(0, b"\x00\x00\x03\x23\x00\x07hi", ProtocolVersion::V5).expect("alias 7");
        assert_eq!(aliased.properties.topic_alias, Some(7));
        assert_eq!(aliased.payload, Bytes::from_static(b"hi"));
    }

    #[test]
    fn payload_may_be_empty() {
        let p = decode(1, b"\x00\x01a", ProtocolVersion::V3_1_1).expect("valid");
        assert!(p.retain);
        assert!(p.payload.is_empty());
    }

    #[test]
    fn a_view_encodes_as_its_packet_does() {
        let mut p = Publish::new("a/b", "payload");
        p.qos = QoS::AtLeastOnce;
        p.packet_id = PacketId::new(9);
        p.retain = true;
        p.dup = true;
        let plain = p.clone();
        p.properties.content_type.replace("text/plain".into());
        p.properties.subscription_identifiers.push(4);
        for p in [plain, p] {
            for version in [ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
                let (mut viewed, mut packet) = (bytes::BytesMut::new(), bytes::BytesMut::new());
                p.view().encode(version, &mut viewed).unwrap();
                crate::Packet::Publish(p.clone()).encode(version, &mut packet).unwrap();
                assert_eq!(viewed, packet);
                let back = crate::decode(&mut viewed, version, 1 << 20).unwrap();
                assert!(matches!(back, Some(crate::Packet::Publish(b)) if b.topic == "a/b" && b.payload == "payload"));
            }
        }
    }

    #[test]
    fn qos_and_packet_id_must_agree_when_encoding() {
        let mut p = Publish::new("a", "x");
        p.qos = QoS::AtLeastOnce;
        assert!(p.write(ProtocolVersion::V5, &mut crate::wire::Counter::default()).is_err());
        p.qos = QoS::AtMostOnce;
        p.packet_id = PacketId::new(1);
        assert!(p.write(ProtocolVersion::V5, &mut crate::wire::Counter::default()).is_err());
    }
}
