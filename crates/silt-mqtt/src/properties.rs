//! Typed MQTT 5.0 property sets, one per packet family. Each field is `Option` (absent means
//! "use the spec default"), except user properties and PUBLISH subscription identifiers, which
//! repeat and keep their wire order.
//!
//! Decoding rejects properties the packet may not carry (Malformed) and duplicates of
//! properties allowed once (Protocol Error). Encoding writes fields in the spec's table order
//! and rejects values decoding would refuse (zero Receive Maximum, Maximum QoS 2, ...).
//! These sets are ignored when encoding for MQTT 3.x, which has no properties.

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError, ProtocolViolation};
use crate::property::{
    Property, PropertyId as Id, PropertySet, UserProperty, nonzero, not_allowed, once, put_bin, put_flag, put_str,
    put_sub_id, put_u16, put_u32, put_users,
};
use crate::types::QoS;
use crate::wire::Sink;

fn has_wildcard(topic: &str) -> bool {
    topic.contains(['+', '#'])
}

/// CONNECT properties (spec §3.1.2.11).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    pub maximum_packet_size: Option<u32>,
    pub topic_alias_maximum: Option<u16>,
    pub request_response_information: Option<bool>,
    pub request_problem_information: Option<bool>,
    pub user_properties: Vec<UserProperty>,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
}

impl PropertySet for ConnectProperties {
    const CONTEXT: &'static str = "CONNECT";

    fn apply(&mut self, p: Property) -> Result<(), DecodeError> {
        match p {
            Property::U32(id @ Id::SessionExpiryInterval, v) => once(&mut self.session_expiry_interval, v, id),
            Property::U16(id @ Id::ReceiveMaximum, v) => once(&mut self.receive_maximum, v, id),
            Property::U32(id @ Id::MaximumPacketSize, v) => once(&mut self.maximum_packet_size, v, id),
            Property::U16(id @ Id::TopicAliasMaximum, v) => once(&mut self.topic_alias_maximum, v, id),
            Property::Flag(id @ Id::RequestResponseInformation, v) => {
                once(&mut self.request_response_information, v, id)
            }
            Property::Flag(id @ Id::RequestProblemInformation, v) => once(&mut self.request_problem_information, v, id),
            Property::User(pair) => {
                self.user_properties.push(pair);
                Ok(())
            }
            Property::String(id @ Id::AuthenticationMethod, v) => once(&mut self.authentication_method, v, id),
            Property::Binary(id @ Id::AuthenticationData, v) => once(&mut self.authentication_data, v, id),
            other => Err(not_allowed::<Self>(&other)),
        }
    }

    fn validate(&self) -> Result<(), DecodeError> {
        if self.authentication_data.is_some() && self.authentication_method.is_none() {
            return Err(ProtocolViolation::AuthDataWithoutMethod.into());
        }
        Ok(())
    }

    fn write(&self, s: &mut impl Sink) -> Result<(), EncodeError> {
        if self.authentication_data.is_some() && self.authentication_method.is_none() {
            return Err(EncodeError::Invalid("authentication data without authentication method"));
        }
        put_u32(s, Id::SessionExpiryInterval, self.session_expiry_interval);
        put_u16(s, Id::ReceiveMaximum, nonzero(self.receive_maximum, "receive maximum 0")?);
        put_u32(s, Id::MaximumPacketSize, nonzero(self.maximum_packet_size, "maximum packet size 0")?);
        put_u16(s, Id::TopicAliasMaximum, self.topic_alias_maximum);
        put_flag(s, Id::RequestResponseInformation, self.request_response_information);
        put_flag(s, Id::RequestProblemInformation, self.request_problem_information);
        put_users(s, &self.user_properties)?;
        put_str(s, Id::AuthenticationMethod, self.authentication_method.as_deref())?;
        put_bin(s, Id::AuthenticationData, self.authentication_data.as_ref())
    }
}

/// Will properties carried in the CONNECT payload (spec §3.1.3.2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WillProperties {
    pub will_delay_interval: Option<u32>,
    pub payload_format_indicator: Option<bool>,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: Vec<UserProperty>,
}

impl PropertySet for WillProperties {
    const CONTEXT: &'static str = "will properties";

    fn apply(&mut self, p: Property) -> Result<(), DecodeError> {
        match p {
            Property::U32(id @ Id::WillDelayInterval, v) => once(&mut self.will_delay_interval, v, id),
            Property::Flag(id @ Id::PayloadFormatIndicator, v) => once(&mut self.payload_format_indicator, v, id),
            Property::U32(id @ Id::MessageExpiryInterval, v) => once(&mut self.message_expiry_interval, v, id),
            Property::String(id @ Id::ContentType, v) => once(&mut self.content_type, v, id),
            Property::String(id @ Id::ResponseTopic, v) => once(&mut self.response_topic, v, id),
            Property::Binary(id @ Id::CorrelationData, v) => once(&mut self.correlation_data, v, id),
            Property::User(pair) => {
                self.user_properties.push(pair);
                Ok(())
            }
            other => Err(not_allowed::<Self>(&other)),
        }
    }

    fn validate(&self) -> Result<(), DecodeError> {
        if self.response_topic.as_deref().is_some_and(has_wildcard) {
            return Err(ProtocolViolation::WildcardInTopicName.into());
        }
        Ok(())
    }

    fn write(&self, s: &mut impl Sink) -> Result<(), EncodeError> {
        put_u32(s, Id::WillDelayInterval, self.will_delay_interval);
        put_flag(s, Id::PayloadFormatIndicator, self.payload_format_indicator);
        put_u32(s, Id::MessageExpiryInterval, self.message_expiry_interval);
        put_str(s, Id::ContentType, self.content_type.as_deref())?;
        put_str(s, Id::ResponseTopic, self.response_topic.as_deref())?;
        put_bin(s, Id::CorrelationData, self.correlation_data.as_ref())?;
        put_users(s, &self.user_properties)
    }
}

/// CONNACK properties (spec §3.2.2.3).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnAckProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    /// Only QoS 0 or 1 may be sent; absence means QoS 2 is supported.
    pub maximum_qos: Option<QoS>,
    pub retain_available: Option<bool>,
    pub maximum_packet_size: Option<u32>,
    pub assigned_client_identifier: Option<String>,
    pub topic_alias_maximum: Option<u16>,
    pub reason_string: Option<String>,
    pub user_properties: Vec<UserProperty>,
    pub wildcard_subscription_available: Option<bool>,
    pub subscription_identifiers_available: Option<bool>,
    pub shared_subscription_available: Option<bool>,
    pub server_keep_alive: Option<u16>,
    pub response_information: Option<String>,
    pub server_reference: Option<String>,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
}

impl PropertySet for ConnAckProperties {
    const CONTEXT: &'static str = "CONNACK";

    fn apply(&mut self, p: Property) -> Result<(), DecodeError> {
        match p {
            Property::U32(id @ Id::SessionExpiryInterval, v) => once(&mut self.session_expiry_interval, v, id),
            Property::U16(id @ Id::ReceiveMaximum, v) => once(&mut self.receive_maximum, v, id),
            Property::MaximumQos(v) => once(&mut self.maximum_qos, v, Id::MaximumQos),
            Property::Flag(id @ Id::RetainAvailable, v) => once(&mut self.retain_available, v, id),
            Property::U32(id @ Id::MaximumPacketSize, v) => once(&mut self.maximum_packet_size, v, id),
            Property::String(id @ Id::AssignedClientIdentifier, v) => once(&mut self.assigned_client_identifier, v, id),
            Property::U16(id @ Id::TopicAliasMaximum, v) => once(&mut self.topic_alias_maximum, v, id),
            Property::String(id @ Id::ReasonString, v) => once(&mut self.reason_string, v, id),
            Property::User(pair) => {
                self.user_properties.push(pair);
                Ok(())
            }
            Property::Flag(id @ Id::WildcardSubscriptionAvailable, v) => {
                once(&mut self.wildcard_subscription_available, v, id)
            }
            Property::Flag(id @ Id::SubscriptionIdentifierAvailable, v) => {
                once(&mut self.subscription_identifiers_available, v, id)
            }
            Property::Flag(id @ Id::SharedSubscriptionAvailable, v) => {
                once(&mut self.shared_subscription_available, v, id)
            }
            Property::U16(id @ Id::ServerKeepAlive, v) => once(&mut self.server_keep_alive, v, id),
            Property::String(id @ Id::ResponseInformation, v) => once(&mut self.response_information, v, id),
            Property::String(id @ Id::ServerReference, v) => once(&mut self.server_reference, v, id),
            Property::String(id @ Id::AuthenticationMethod, v) => once(&mut self.authentication_method, v, id),
            Property::Binary(id @ Id::AuthenticationData, v) => once(&mut self.authentication_data, v, id),
            other => Err(not_allowed::<Self>(&other)),
        }
    }

    fn write(&self, s: &mut impl Sink) -> Result<(), EncodeError> {
        put_u32(s, Id::SessionExpiryInterval, self.session_expiry_interval);
        put_u16(s, Id::ReceiveMaximum, nonzero(self.receive_maximum, "receive maximum 0")?);
        if let Some(qos) = self.maximum_qos {
            if qos == QoS::ExactlyOnce {
                return Err(EncodeError::Invalid("maximum QoS 2 must be sent as an absent property"));
            }
            s.put_u8(Id::MaximumQos as u8);
            s.put_u8(qos.as_u8());
        }
        put_flag(s, Id::RetainAvailable, self.retain_available);
        put_u32(s, Id::MaximumPacketSize, nonzero(self.maximum_packet_size, "maximum packet size 0")?);
        put_str(s, Id::AssignedClientIdentifier, self.assigned_client_identifier.as_deref())?;
        put_u16(s, Id::TopicAliasMaximum, self.topic_alias_maximum);
        put_str(s, Id::ReasonString, self.reason_string.as_deref())?;
        put_users(s, &self.user_properties)?;
        put_flag(s, Id::WildcardSubscriptionAvailable, self.wildcard_subscription_available);
        put_flag(s, Id::SubscriptionIdentifierAvailable, self.subscription_identifiers_available);
        put_flag(s, Id::SharedSubscriptionAvailable, self.shared_subscription_available);
        put_u16(s, Id::ServerKeepAlive, self.server_keep_alive);
        put_str(s, Id::ResponseInformation, self.response_information.as_deref())?;
        put_str(s, Id::ServerReference, self.server_reference.as_deref())?;
        put_str(s, Id::AuthenticationMethod, self.authentication_method.as_deref())?;
        put_bin(s, Id::AuthenticationData, self.authentication_data.as_ref())
    }
}

/// PUBLISH properties (spec §3.3.2.3).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishProperties {
    pub payload_format_indicator: Option<bool>,
    pub message_expiry_interval: Option<u32>,
    pub topic_alias: Option<u16>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: Vec<UserProperty>,
    /// Server to client only; may repeat, one per matching subscription.
    pub subscription_identifiers: Vec<u32>,
    pub content_type: Option<String>,
}

impl PropertySet for PublishProperties {
    const CONTEXT: &'static str = "PUBLISH";

    fn apply(&mut self, p: Property) -> Result<(), DecodeError> {
        match p {
            Property::Flag(id @ Id::PayloadFormatIndicator, v) => once(&mut self.payload_format_indicator, v, id),
            Property::U32(id @ Id::MessageExpiryInterval, v) => once(&mut self.message_expiry_interval, v, id),
            Property::U16(id @ Id::TopicAlias, v) => once(&mut self.topic_alias, v, id),
            Property::String(id @ Id::ResponseTopic, v) => once(&mut self.response_topic, v, id),
            Property::Binary(id @ Id::CorrelationData, v) => once(&mut self.correlation_data, v, id),
            Property::User(pair) => {
                self.user_properties.push(pair);
                Ok(())
            }
            Property::SubscriptionIdentifier(v) => {
                self.subscription_identifiers.push(v);
                Ok(())
            }
            Property::String(id @ Id::ContentType, v) => once(&mut self.content_type, v, id),
            other => Err(not_allowed::<Self>(&other)),
        }
    }

    fn validate(&self) -> Result<(), DecodeError> {
        if self.response_topic.as_deref().is_some_and(has_wildcard) {
            return Err(ProtocolViolation::WildcardInTopicName.into());
        }
        Ok(())
    }

    fn write(&self, s: &mut impl Sink) -> Result<(), EncodeError> {
        put_flag(s, Id::PayloadFormatIndicator, self.payload_format_indicator);
        put_u32(s, Id::MessageExpiryInterval, self.message_expiry_interval);
        put_u16(s, Id::TopicAlias, nonzero(self.topic_alias, "topic alias 0")?);
        put_str(s, Id::ResponseTopic, self.response_topic.as_deref())?;
        put_bin(s, Id::CorrelationData, self.correlation_data.as_ref())?;
        put_users(s, &self.user_properties)?;
        for &id in &self.subscription_identifiers {
            put_sub_id(s, id)?;
        }
        put_str(s, Id::ContentType, self.content_type.as_deref())
    }
}

/// Properties of PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK and UNSUBACK: a reason string and
/// user properties.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckProperties {
    pub reason_string: Option<String>,
    pub user_properties: Vec<UserProperty>,
}

impl AckProperties {
    /// Whether no property is set (allows the short packet forms).
    pub fn is_empty(&self) -> bool {
        self.reason_string.is_none() && self.user_properties.is_empty()
    }
}

impl PropertySet for AckProperties {
    const CONTEXT: &'static str = "an acknowledgement";

    fn apply(&mut self, p: Property) -> Result<(), DecodeError> {
        match p {
            Property::String(id @ Id::ReasonString, v) => once(&mut self.reason_string, v, id),
            Property::User(pair) => {
                self.user_properties.push(pair);
                Ok(())
            }
            other => Err(not_allowed::<Self>(&other)),
        }
    }

    fn write(&self, s: &mut impl Sink) -> Result<(), EncodeError> {
        put_str(s, Id::ReasonString, self.reason_string.as_deref())?;
        put_users(s, &self.user_properties)
    }
}

/// SUBSCRIBE properties (spec §3.8.2.1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscribeProperties {
    pub subscription_identifier: Option<u32>,
    pub user_properties: Vec<UserProperty>,
}

impl PropertySet for SubscribeProperties {
    const CONTEXT: &'static str = "SUBSCRIBE";

    fn apply(&mut self, p: Property) -> Result<(), DecodeError> {
        match p {
            Property::SubscriptionIdentifier(v) => {
                once(&mut self.subscription_identifier, v, Id::SubscriptionIdentifier)
            }
            Property::User(pair) => {
                self.user_properties.push(pair);
                Ok(())
            }
            other => Err(not_allowed::<Self>(&other)),
        }
    }

    fn write(&self, s: &mut impl Sink) -> Result<(), EncodeError> {
        if let Some(id) = self.subscription_identifier {
            put_sub_id(s, id)?;
        }
        put_users(s, &self.user_properties)
    }
}

/// UNSUBSCRIBE properties (spec §3.10.2.1): user properties only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnsubscribeProperties {
    pub user_properties: Vec<UserProperty>,
}

impl PropertySet for UnsubscribeProperties {
    const CONTEXT: &'static str = "UNSUBSCRIBE";

    fn apply(&mut self, p: Property) -> Result<(), DecodeError> {
        match p {
            Property::User(pair) => {
                self.user_properties.push(pair);
                Ok(())
            }
            other => Err(not_allowed::<Self>(&other)),
        }
    }

    fn write(&self, s: &mut impl Sink) -> Result<(), EncodeError> {
        put_users(s, &self.user_properties)
    }
}

/// DISCONNECT properties (spec §3.14.2.2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DisconnectProperties {
    pub session_expiry_interval: Option<u32>,
    pub reason_string: Option<String>,
    pub user_properties: Vec<UserProperty>,
    pub server_reference: Option<String>,
}

impl DisconnectProperties {
    /// Whether no property is set (allows the short packet forms).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl PropertySet for DisconnectProperties {
    const CONTEXT: &'static str = "DISCONNECT";

    fn apply(&mut self, p: Property) -> Result<(), DecodeError> {
        match p {
            Property::U32(id @ Id::SessionExpiryInterval, v) => once(&mut self.session_expiry_interval, v, id),
            Property::String(id @ Id::ReasonString, v) => once(&mut self.reason_string, v, id),
            Property::User(pair) => {
                self.user_properties.push(pair);
                Ok(())
            }
            Property::String(id @ Id::ServerReference, v) => once(&mut self.server_reference, v, id),
            other => Err(not_allowed::<Self>(&other)),
        }
    }

    fn write(&self, s: &mut impl Sink) -> Result<(), EncodeError> {
        put_u32(s, Id::SessionExpiryInterval, self.session_expiry_interval);
        put_str(s, Id::ReasonString, self.reason_string.as_deref())?;
        put_users(s, &self.user_properties)?;
        put_str(s, Id::ServerReference, self.server_reference.as_deref())
    }
}

/// AUTH properties (spec §3.15.2.2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthProperties {
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
    pub reason_string: Option<String>,
    pub user_properties: Vec<UserProperty>,
}

impl AuthProperties {
    /// Whether no property is set (allows the zero-length AUTH).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl PropertySet for AuthProperties {
    const CONTEXT: &'static str = "AUTH";

    fn apply(&mut self, p: Property) -> Result<(), DecodeError> {
        match p {
            Property::String(id @ Id::AuthenticationMethod, v) => once(&mut self.authentication_method, v, id),
            Property::Binary(id @ Id::AuthenticationData, v) => once(&mut self.authentication_data, v, id),
            Property::String(id @ Id::ReasonString, v) => once(&mut self.reason_string, v, id),
            Property::User(pair) => {
                self.user_properties.push(pair);
                Ok(())
            }
            other => Err(not_allowed::<Self>(&other)),
        }
    }

    fn write(&self, s: &mut impl Sink) -> Result<(), EncodeError> {
        put_str(s, Id::AuthenticationMethod, self.authentication_method.as_deref())?;
        put_bin(s, Id::AuthenticationData, self.authentication_data.as_ref())?;
        put_str(s, Id::ReasonString, self.reason_string.as_deref())?;
        put_users(s, &self.user_properties)
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;

    use super::*;
    use crate::error::Malformed;
    use crate::wire::Reader;

    fn read<P: PropertySet>(bytes: &'static [u8]) -> Result<P, DecodeError> {
        P::read(&mut Reader::new(Bytes::from_static(bytes)))
    }

    #[test]
    fn duplicate_single_use_property_is_a_protocol_error() {
        let bytes = &[10, 0x02, 0, 0, 0, 1, 0x02, 0, 0, 0, 2];
        assert_eq!(
            read::<PublishProperties>(bytes),
            Err(ProtocolViolation::DuplicateProperty(Id::MessageExpiryInterval).into())
        );
    }

    #[test]
    fn property_of_another_packet_is_malformed() {
        // Session Expiry Interval is not a PUBLISH property.
        assert_eq!(
            read::<PublishProperties>(&[5, 0x11, 0, 0, 0, 1]),
            Err(Malformed::PropertyNotAllowed { property: Id::SessionExpiryInterval, packet: "PUBLISH" }.into())
        );
    }

    #[test]
    fn repeated_user_properties_and_subscription_ids_keep_their_order() {
        let bytes = &[14, 0x26, 0, 1, b'b', 0, 0, 0x0B, 2, 0x26, 0, 1, b'a', 0, 0, 0x0B, 1][..];
        let mut fixed = bytes.to_vec();
        fixed[0] = (fixed.len() - 1) as u8;
        let props = PublishProperties::read(&mut Reader::new(Bytes::from(fixed))).expect("valid");
        assert_eq!(props.user_properties, [("b".into(), String::new()), ("a".into(), String::new())]);
        assert_eq!(props.subscription_identifiers, [2, 1]);
    }

    #[test]
    fn property_length_past_the_packet_end_is_malformed() {
        assert_eq!(read::<AckProperties>(&[9, 0x1F, 0, 1, b'x']), Err(Malformed::Truncated("properties").into()));
    }

    #[test]
    fn auth_data_without_method_is_a_protocol_error() {
        assert_eq!(
            read::<ConnectProperties>(&[4, 0x16, 0, 1, 9]),
            Err(ProtocolViolation::AuthDataWithoutMethod.into())
        );
    }

    #[test]
    fn maximum_qos_two_is_not_encodable() {
        let props = ConnAckProperties { maximum_qos: Some(QoS::ExactlyOnce), ..Default::default() };
        assert!(props.write_block(&mut BytesMut::new()).is_err());
    }

    #[test]
    fn connack_properties_round_trip() {
        let props = ConnAckProperties {
            session_expiry_interval: Some(30),
            receive_maximum: Some(10),
            maximum_qos: Some(QoS::AtLeastOnce),
            retain_available: Some(false),
            maximum_packet_size: Some(1 << 20),
            assigned_client_identifier: Some("auto-1".into()),
            topic_alias_maximum: Some(8),
            reason_string: Some("ok".into()),
            user_properties: vec![("k".into(), "v".into())],
            wildcard_subscription_available: Some(true),
            subscription_identifiers_available: Some(true),
            shared_subscription_available: Some(false),
            server_keep_alive: Some(60),
            response_information: Some("resp/".into()),
            server_reference: Some("other:1883".into()),
            authentication_method: Some("SCRAM".into()),
            authentication_data: Some(Bytes::from_static(b"\x01\x02")),
        };
        let mut buf = BytesMut::new();
        props.write_block(&mut buf).expect("encodable");
        let decoded = ConnAckProperties::read(&mut Reader::new(buf.freeze())).expect("decodable");
        assert_eq!(decoded, props);
    }
}
