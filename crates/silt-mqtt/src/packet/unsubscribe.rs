//! UNSUBSCRIBE (spec §3.10): a packet identifier and one or more topic filters.
//! A packet without filters is a Protocol Error.

use crate::error::{DecodeError, EncodeError, ProtocolViolation};
use crate::packet::read_packet_id;
use crate::properties::UnsubscribeProperties;
use crate::property::PropertySet;
use crate::types::{PacketId, PacketType, ProtocolVersion};
use crate::wire::{Reader, Sink, put_string};

/// An UNSUBSCRIBE packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    pub packet_id: PacketId,
    /// Never empty.
    pub filters: Vec<String>,
    /// Always empty before MQTT 5.0.
    pub properties: UnsubscribeProperties,
}

impl Unsubscribe {
    pub(crate) fn decode(mut r: Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let packet_id = read_packet_id(&mut r)?;
        let properties =
            if version.is_v5() { UnsubscribeProperties::read(&mut r)? } else { UnsubscribeProperties::default() };
        let mut filters = Vec::new();
        while !r.is_empty() {
            filters.push(r.string("topic filter")?);
        }
        if filters.is_empty() {
            return Err(ProtocolViolation::NoTopicFilters(PacketType::Unsubscribe).into());
        }
        Ok(Self { packet_id, filters, properties })
    }

    pub(crate) fn write(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError> {
        if self.filters.is_empty() {
            return Err(EncodeError::Invalid("UNSUBSCRIBE without a topic filter"));
        }
        s.put_u16(self.packet_id.get());
        if version.is_v5() {
            self.properties.write_block(s)?;
        }
        for filter in &self.filters {
            put_string(s, filter, "topic filter")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn unsubscribe_without_filters_is_a_protocol_error() {
        let r = Unsubscribe::decode(Reader::new(Bytes::from_static(&[0, 1, 0])), ProtocolVersion::V5);
        assert_eq!(r, Err(ProtocolViolation::NoTopicFilters(PacketType::Unsubscribe).into()));
    }
}
