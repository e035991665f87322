//! SUBSCRIBE (spec §3.8): a packet identifier and one or more (topic filter, options) pairs.
//!
//! Checked here: at least one filter (Protocol Error), reserved option bits and QoS 3
//! (Malformed), retain handling 3 (Protocol Error). Not checked: filter syntax (`+`/`#`
//! placement, shared-subscription form), which the broker answers per filter in the SUBACK.
//! Before MQTT 5.0 the options byte holds only the QoS; the other options are not sent.

use crate::error::{DecodeError, EncodeError, Malformed, ProtocolViolation};
use crate::packet::read_packet_id;
use crate::properties::SubscribeProperties;
use crate::property::PropertySet;
use crate::types::{PacketId, PacketType, ProtocolVersion, QoS};
use crate::wire::{Reader, Sink, put_string};

/// What the server does with retained messages when the subscription is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RetainHandling {
    /// 0: send retained messages at subscribe time.
    #[default]
    SendAtSubscribe = 0,
    /// 1: send them only if the subscription did not already exist.
    SendAtSubscribeIfNew = 1,
    /// 2: do not send them.
    DoNotSend = 2,
}

/// Subscription options byte (spec §3.8.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SubscriptionOptions {
    pub qos: QoS,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub retain_handling: RetainHandling,
}

impl SubscriptionOptions {
    fn decode(byte: u8, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let reserved = if version.is_v5() { 0xC0 } else { 0xFC };
        if byte & reserved != 0 {
            return Err(Malformed::InvalidSubscriptionOptions(byte).into());
        }
        let qos = QoS::from_u8(byte & 0b11).ok_or(Malformed::InvalidQos)?;
        let retain_handling = match (byte >> 4) & 0b11 {
            0 => RetainHandling::SendAtSubscribe,
            1 => RetainHandling::SendAtSubscribeIfNew,
            2 => RetainHandling::DoNotSend,
            _ => return Err(ProtocolViolation::InvalidRetainHandling.into()),
        };
        Ok(Self { qos, no_local: byte & 0x04 != 0, retain_as_published: byte & 0x08 != 0, retain_handling })
    }

    fn encode(self, version: ProtocolVersion) -> u8 {
        if !version.is_v5() {
            return self.qos.as_u8();
        }
        self.qos.as_u8()
            | (u8::from(self.no_local) << 2)
            | (u8::from(self.retain_as_published) << 3)
            | ((self.retain_handling as u8) << 4)
    }
}

/// One requested subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub filter: String,
    pub options: SubscriptionOptions,
}

/// A SUBSCRIBE packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    pub packet_id: PacketId,
    /// Never empty.
    pub subscriptions: Vec<Subscription>,
    /// Always empty before MQTT 5.0.
    pub properties: SubscribeProperties,
}

impl Subscribe {
    pub(crate) fn decode(mut r: Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let packet_id = read_packet_id(&mut r)?;
        let properties =
            if version.is_v5() { SubscribeProperties::read(&mut r)? } else { SubscribeProperties::default() };
        let mut subscriptions = Vec::new();
        while !r.is_empty() {
            let filter = r.string("topic filter")?;
            let options = SubscriptionOptions::decode(r.u8("subscription options")?, version)?;
            subscriptions.push(Subscription { filter, options });
        }
        if subscriptions.is_empty() {
            return Err(ProtocolViolation::NoTopicFilters(PacketType::Subscribe).into());
        }
        Ok(Self { packet_id, subscriptions, properties })
    }

    pub(crate) fn write(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError> {
        if self.subscriptions.is_empty() {
            return Err(EncodeError::Invalid("SUBSCRIBE without a topic filter"));
        }
        s.put_u16(self.packet_id.get());
        if version.is_v5() {
            self.properties.write_block(s)?;
        }
        for sub in &self.subscriptions {
            put_string(s, &sub.filter, "topic filter")?;
            s.put_u8(sub.options.encode(version));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn decode(body: &'static [u8], version: ProtocolVersion) -> Result<Subscribe, DecodeError> {
        Subscribe::decode(Reader::new(Bytes::from_static(body)), version)
    }

    #[test]
    fn subscribe_without_filters_is_a_protocol_error() {
        assert_eq!(
            decode(&[0, 1], ProtocolVersion::V3_1_1),
            Err(ProtocolViolation::NoTopicFilters(PacketType::Subscribe).into())
        );
    }

    #[test]
    fn v311_reserved_option_bits_are_malformed() {
        assert_eq!(
            decode(&[0, 1, 0, 1, b'a', 0x04], ProtocolVersion::V3_1_1),
            Err(Malformed::InvalidSubscriptionOptions(4).into())
        );
    }

    #[test]
    fn v5_options_decode_every_field() {
        let s = decode(&[0, 1, 0, 0, 1, b'a', 0b0010_1110], ProtocolVersion::V5).expect("valid");
        let options = s.subscriptions[0].options;
        assert_eq!(options.qos, QoS::ExactlyOnce);
        assert!(options.no_local);
        assert!(options.retain_as_published);
        assert_eq!(options.retain_handling, RetainHandling::DoNotSend);
    }

    #[test]
    fn retain_handling_three_is_a_protocol_error() {
        assert_eq!(
            decode(&[0, 1, 0, 0, 1, b'a', 0x30], ProtocolVersion::V5),
            Err(ProtocolViolation::InvalidRetainHandling.into())
        );
    }

    #[test]
    fn option_qos_three_is_malformed() {
        assert_eq!(decode(&[0, 1, 0, 0, 1, b'a', 0x03], ProtocolVersion::V5), Err(Malformed::InvalidQos.into()));
    }

    #[test]
    fn filter_without_options_byte_is_malformed() {
        assert_eq!(
            decode(&[0, 1, 0, 1, b'a'], ProtocolVersion::V3_1_1),
            Err(Malformed::Truncated("subscription options").into())
        );
    }
}
