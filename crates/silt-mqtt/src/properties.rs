//! Typed MQTT 5.0 property sets, one per packet family. Each field is `Option` (absent means
//! "use the spec default"), except user properties and PUBLISH subscription identifiers, which
//! repeat and keep their wire order.
//!
//! Decoding rejects properties the packet may not carry (Malformed) and duplicates of
//! properties allowed once (Protocol Error). Encoding writes fields in the spec's table order
//! and rejects values decoding would refuse (zero Receive Maximum, Maximum QoS 2, ...).
//! These sets are ignored when encoding for MQTT 3.x, which has no properties.
//!
//! Each set is declared once with `property_set!`: per field its property identifier and
//! value kind ([`crate::property::kind`]); decoding, encoding and so the encoded length follow
//! from that declaration.

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError, ProtocolViolation};
use crate::property::{Property, PropertyId as Id, PropertySet, UserProperty, kind, not_allowed, put, store};
use crate::types::QoS;
use crate::wire::Sink;

/// Declares a property set: the struct with, per field, the property's identifier and value
/// kind (`Option` field: allowed once; `Vec` field: may repeat, wire order kept), and its
/// [`PropertySet`] impl. Decoding stores each property in the field declared with its
/// identifier and refuses any other; encoding writes the fields in declaration order, which is
/// the spec's table order. Whatever follows the struct (the `validate` and `check` rules) goes
/// into the impl as it is. A kind whose value type is not the field's does not compile; an
/// identifier declared twice in one set is an unreachable match arm (denied by clippy's
/// `-D warnings`).
macro_rules! property_set {
    (
        $(#[$meta:meta])*
        pub struct $name:ident in $context:literal {
            $(
                $(#[$field_meta:meta])*
                pub $field:ident: $ty:ty = $id:ident as $kind:ident,
            )+
        }
        $($rules:tt)*
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct $name {
            $($(#[$field_meta])* pub $field: $ty,)+
        }

        impl PropertySet for $name {
            const CONTEXT: &'static str = $context;

            fn apply(&mut self, property: Property) -> Result<(), DecodeError> {
                match property.id() {
                    $(Id::$id => store::<Self, kind::$kind>(&mut self.$field, property),)+
                    other => Err(not_allowed::<Self>(other)),
                }
            }

            fn write(&self, sink: &mut impl Sink) -> Result<(), EncodeError> {
                $(put::<kind::$kind>(sink, Id::$id, &self.$field)?;)+
                Ok(())
            }

            $($rules)*
        }
    };
}

/// A Response Topic is a topic name, so it may not hold wildcards.
fn check_response_topic(topic: Option<&str>) -> Result<(), DecodeError> {
    if topic.is_some_and(|t| t.contains(['+', '#'])) {
        return Err(ProtocolViolation::WildcardInTopicName.into());
    }
    Ok(())
}

property_set! {
    /// CONNECT properties (spec §3.1.2.11).
    pub struct ConnectProperties in "CONNECT" {
        pub session_expiry_interval: Option<u32> = SessionExpiryInterval as U32,
        pub receive_maximum: Option<u16> = ReceiveMaximum as U16,
        pub maximum_packet_size: Option<u32> = MaximumPacketSize as U32,
        pub topic_alias_maximum: Option<u16> = TopicAliasMaximum as U16,
        pub request_response_information: Option<bool> = RequestResponseInformation as Flag,
        pub request_problem_information: Option<bool> = RequestProblemInformation as Flag,
        pub user_properties: Vec<UserProperty> = UserProperty as Pair,
        pub authentication_method: Option<String> = AuthenticationMethod as Utf8,
        pub authentication_data: Option<Bytes> = AuthenticationData as Binary,
    }

    fn validate(&self) -> Result<(), DecodeError> {
        if self.authentication_data.is_some() && self.authentication_method.is_none() {
            return Err(ProtocolViolation::AuthDataWithoutMethod.into());
        }
        Ok(())
    }

    fn check(&self) -> Result<(), EncodeError> {
        if self.authentication_data.is_some() && self.authentication_method.is_none() {
            return Err(EncodeError::Invalid("authentication data without authentication method"));
        }
        Ok(())
    }
}

property_set! {
    /// Will properties carried in the CONNECT payload (spec §3.1.3.2).
    pub struct WillProperties in "will properties" {
        pub will_delay_interval: Option<u32> = WillDelayInterval as U32,
        pub payload_format_indicator: Option<bool> = PayloadFormatIndicator as Flag,
        pub message_expiry_interval: Option<u32> = MessageExpiryInterval as U32,
        pub content_type: Option<String> = ContentType as Utf8,
        pub response_topic: Option<String> = ResponseTopic as Utf8,
        pub correlation_data: Option<Bytes> = CorrelationData as Binary,
        pub user_properties: Vec<UserProperty> = UserProperty as Pair,
    }

    fn validate(&self) -> Result<(), DecodeError> {
        check_response_topic(self.response_topic.as_deref())
    }
}

property_set! {
    /// CONNACK properties (spec §3.2.2.3).
    pub struct ConnAckProperties in "CONNACK" {
        pub session_expiry_interval: Option<u32> = SessionExpiryInterval as U32,
        pub receive_maximum: Option<u16> = ReceiveMaximum as U16,
        /// Only QoS 0 or 1 may be sent; absence means QoS 2 is supported.
        pub maximum_qos: Option<QoS> = MaximumQos as Qos,
        pub retain_available: Option<bool> = RetainAvailable as Flag,
        pub maximum_packet_size: Option<u32> = MaximumPacketSize as U32,
        pub assigned_client_identifier: Option<String> = AssignedClientIdentifier as Utf8,
        pub topic_alias_maximum: Option<u16> = TopicAliasMaximum as U16,
        pub reason_string: Option<String> = ReasonString as Utf8,
        pub user_properties: Vec<UserProperty> = UserProperty as Pair,
        pub wildcard_subscription_available: Option<bool> = WildcardSubscriptionAvailable as Flag,
        pub subscription_identifiers_available: Option<bool> = SubscriptionIdentifierAvailable as Flag,
        pub shared_subscription_available: Option<bool> = SharedSubscriptionAvailable as Flag,
        pub server_keep_alive: Option<u16> = ServerKeepAlive as U16,
        pub response_information: Option<String> = ResponseInformation as Utf8,
        pub server_reference: Option<String> = ServerReference as Utf8,
        pub authentication_method: Option<String> = AuthenticationMethod as Utf8,
        pub authentication_data: Option<Bytes> = AuthenticationData as Binary,
    }
}

property_set! {
    /// PUBLISH properties (spec §3.3.2.3).
    pub struct PublishProperties in "PUBLISH" {
        pub payload_format_indicator: Option<bool> = PayloadFormatIndicator as Flag,
        pub message_expiry_interval: Option<u32> = MessageExpiryInterval as U32,
        pub topic_alias: Option<u16> = TopicAlias as U16,
        pub response_topic: Option<String> = ResponseTopic as Utf8,
        pub correlation_data: Option<Bytes> = CorrelationData as Binary,
        pub user_properties: Vec<UserProperty> = UserProperty as Pair,
        /// Server to client only; may repeat, one per matching subscription.
        pub subscription_identifiers: Vec<u32> = SubscriptionIdentifier as VarInt,
        pub content_type: Option<String> = ContentType as Utf8,
    }

    fn validate(&self) -> Result<(), DecodeError> {
        check_response_topic(self.response_topic.as_deref())
    }
}

/// A PUBLISH's properties, kept out of line: most PUBLISH packets carry none, and a PUBLISH
/// is moved several times between the socket and the log (decoded into a packet, queued as an
/// event, grouped), as is every packet: inline, the 144-byte set made [`crate::Packet`] 208
/// bytes, a PUBACK included. Reads (through `Deref`) see the empty set when there is none; the
/// first write (through `DerefMut`) allocates it.
#[derive(Clone, Default)]
pub struct PublishProps(Option<Box<PublishProperties>>);

/// What [`PublishProps`] reads as when it holds nothing.
const NO_PUBLISH_PROPERTIES: &PublishProperties = &PublishProperties {
    payload_format_indicator: None,
    message_expiry_interval: None,
    topic_alias: None,
    response_topic: None,
    correlation_data: None,
    user_properties: Vec::new(),
    subscription_identifiers: Vec::new(),
    content_type: None,
};

impl PublishProps {
    /// The set, moved out (the empty set when there is none).
    pub fn into_inner(self) -> PublishProperties {
        self.0.map(|b| *b).unwrap_or_default()
    }

    /// Whether no property is set.
    pub fn is_empty(&self) -> bool {
        **self == *NO_PUBLISH_PROPERTIES
    }
}

impl From<PublishProperties> for PublishProps {
    /// Allocates only for a set that holds something.
    fn from(p: PublishProperties) -> Self {
        if p == *NO_PUBLISH_PROPERTIES { Self(None) } else { Self(Some(Box::new(p))) }
    }
}

impl std::ops::Deref for PublishProps {
    type Target = PublishProperties;

    fn deref(&self) -> &PublishProperties {
        self.0.as_deref().unwrap_or(NO_PUBLISH_PROPERTIES)
    }
}

impl std::ops::DerefMut for PublishProps {
    fn deref_mut(&mut self) -> &mut PublishProperties {
        self.0.get_or_insert_default()
    }
}

impl PartialEq for PublishProps {
    /// Equal when the sets are: an allocated empty set equals none.
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for PublishProps {}

impl std::fmt::Debug for PublishProps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

property_set! {
    /// Properties of PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK and UNSUBACK: a reason string and
    /// user properties.
    pub struct AckProperties in "an acknowledgement" {
        pub reason_string: Option<String> = ReasonString as Utf8,
        pub user_properties: Vec<UserProperty> = UserProperty as Pair,
    }
}

impl AckProperties {
    /// Whether no property is set (allows the short packet forms).
    pub fn is_empty(&self) -> bool {
        self.reason_string.is_none() && self.user_properties.is_empty()
    }
}

property_set! {
    /// SUBSCRIBE properties (spec §3.8.2.1).
    pub struct SubscribeProperties in "SUBSCRIBE" {
        pub subscription_identifier: Option<u32> = SubscriptionIdentifier as VarInt,
        pub user_properties: Vec<UserProperty> = UserProperty as Pair,
    }
}

property_set! {
    /// UNSUBSCRIBE properties (spec §3.10.2.1): user properties only.
    pub struct UnsubscribeProperties in "UNSUBSCRIBE" {
        pub user_properties: Vec<UserProperty> = UserProperty as Pair,
    }
}

property_set! {
    /// DISCONNECT properties (spec §3.14.2.2).
    pub struct DisconnectProperties in "DISCONNECT" {
        pub session_expiry_interval: Option<u32> = SessionExpiryInterval as U32,
        pub reason_string: Option<String> = ReasonString as Utf8,
        pub user_properties: Vec<UserProperty> = UserProperty as Pair,
        pub server_reference: Option<String> = ServerReference as Utf8,
    }
}

impl DisconnectProperties {
    /// Whether no property is set (allows the short packet forms).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

property_set! {
    /// AUTH properties (spec §3.15.2.2).
    pub struct AuthProperties in "AUTH" {
        pub authentication_method: Option<String> = AuthenticationMethod as Utf8,
        pub authentication_data: Option<Bytes> = AuthenticationData as Binary,
        pub reason_string: Option<String> = ReasonString as Utf8,
        pub user_properties: Vec<UserProperty> = UserProperty as Pair,
    }
}

impl AuthProperties {
    /// Whether no property is set (allows the zero-length AUTH).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;

    use super::*;
    use crate::error::Malformed;
    use crate::wire::Reader;

    #[test]
    fn publish_properties_are_allocated_only_when_set() {
        let none = PublishProps::from(PublishProperties::default());
        assert!(none.0.is_none() && none.is_empty());
        assert_eq!(none.topic_alias, None);
        let mut set = PublishProps::from(PublishProperties { topic_alias: Some(3), ..Default::default() });
        assert!(set.0.is_some() && !set.is_empty());
        assert_eq!(set.topic_alias, Some(3));
        // An allocated set emptied again equals none, and moves out whole.
        set.topic_alias = None;
        assert_eq!(set, none);
        let mut written = PublishProps::default();
        written.content_type.replace("text/plain".into()); // a write through `DerefMut`
        assert_eq!(written.into_inner().content_type.as_deref(), Some("text/plain"));
        // What the boxing is for: every decoded packet is moved by value several times.
        assert!(std::mem::size_of::<crate::Packet>() <= 96, "{}", std::mem::size_of::<crate::Packet>());
    }

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
    fn duplicate_subscription_identifier_in_subscribe_is_a_protocol_error() {
        assert_eq!(
            read::<SubscribeProperties>(&[4, 0x0B, 1, 0x0B, 2]),
            Err(ProtocolViolation::DuplicateProperty(Id::SubscriptionIdentifier).into())
        );
    }

    #[test]
    fn values_decoding_refuses_are_not_encodable() {
        let invalid = |what| Err(EncodeError::Invalid(what));
        let connect = ConnectProperties { receive_maximum: Some(0), ..Default::default() };
        assert_eq!(connect.write_block(&mut BytesMut::new()), invalid("receive maximum 0"));
        let connack = ConnAckProperties { maximum_packet_size: Some(0), ..Default::default() };
        assert_eq!(connack.write_block(&mut BytesMut::new()), invalid("maximum packet size 0"));
        let publish = PublishProperties { subscription_identifiers: vec![3, 0], ..Default::default() };
        assert_eq!(publish.write_block(&mut BytesMut::new()), invalid("subscription identifier 0"));
        let connect = ConnectProperties { authentication_data: Some(Bytes::new()), ..Default::default() };
        assert_eq!(
            connect.write_block(&mut BytesMut::new()),
            invalid("authentication data without authentication method")
        );
        // Zero is fine where the spec allows it.
        let connack =
            ConnAckProperties { topic_alias_maximum: Some(0), server_keep_alive: Some(0), ..Default::default() };
        assert!(connack.write_block(&mut BytesMut::new()).is_ok());
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
