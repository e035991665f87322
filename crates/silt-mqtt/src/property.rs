//! MQTT 5.0 properties (spec §2.2.2): identifiers, reading one property with its spec type,
//! and the plumbing the typed per-packet property sets in [`crate::properties`] share.
//!
//! Rules enforced here: an unknown identifier, or one not valid for the packet, is Malformed;
//! a property that may appear once but appears twice is a Protocol Error; values the spec
//! forbids (a 0/1 byte holding 2, Receive Maximum 0, Maximum Packet Size 0, Topic Alias 0,
//! Subscription Identifier 0, Maximum QoS 2) are Protocol Errors.

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError, Malformed, ProtocolViolation};
use crate::types::QoS;
use crate::wire::{Reader, Sink, measure, put_binary, put_len, put_string, put_var_int};

/// A user property: a name/value pair that may repeat and whose order is kept.
pub type UserProperty = (String, String);

/// Property identifiers defined by MQTT 5.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PropertyId {
    PayloadFormatIndicator = 0x01,
    MessageExpiryInterval = 0x02,
    ContentType = 0x03,
    ResponseTopic = 0x08,
    CorrelationData = 0x09,
    SubscriptionIdentifier = 0x0B,
    SessionExpiryInterval = 0x11,
    AssignedClientIdentifier = 0x12,
    ServerKeepAlive = 0x13,
    AuthenticationMethod = 0x15,
    AuthenticationData = 0x16,
    RequestProblemInformation = 0x17,
    WillDelayInterval = 0x18,
    RequestResponseInformation = 0x19,
    ResponseInformation = 0x1A,
    ServerReference = 0x1C,
    ReasonString = 0x1F,
    ReceiveMaximum = 0x21,
    TopicAliasMaximum = 0x22,
    TopicAlias = 0x23,
    MaximumQos = 0x24,
    RetainAvailable = 0x25,
    UserProperty = 0x26,
    MaximumPacketSize = 0x27,
    WildcardSubscriptionAvailable = 0x28,
    SubscriptionIdentifierAvailable = 0x29,
    SharedSubscriptionAvailable = 0x2A,
}

impl PropertyId {
    fn from_u32(value: u32) -> Option<Self> {
        use PropertyId::*;
        Some(match value {
            0x01 => PayloadFormatIndicator,
            0x02 => MessageExpiryInterval,
            0x03 => ContentType,
            0x08 => ResponseTopic,
            0x09 => CorrelationData,
            0x0B => SubscriptionIdentifier,
            0x11 => SessionExpiryInterval,
            0x12 => AssignedClientIdentifier,
            0x13 => ServerKeepAlive,
            0x15 => AuthenticationMethod,
            0x16 => AuthenticationData,
            0x17 => RequestProblemInformation,
            0x18 => WillDelayInterval,
            0x19 => RequestResponseInformation,
            0x1A => ResponseInformation,
            0x1C => ServerReference,
            0x1F => ReasonString,
            0x21 => ReceiveMaximum,
            0x22 => TopicAliasMaximum,
            0x23 => TopicAlias,
            0x24 => MaximumQos,
            0x25 => RetainAvailable,
            0x26 => UserProperty,
            0x27 => MaximumPacketSize,
            0x28 => WildcardSubscriptionAvailable,
            0x29 => SubscriptionIdentifierAvailable,
            0x2A => SharedSubscriptionAvailable,
            _ => return None,
        })
    }
}

/// One decoded property, its value already in the spec's data type and range-checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Property {
    /// Byte properties whose only values are 0 and 1.
    Flag(PropertyId, bool),
    MaximumQos(QoS),
    U16(PropertyId, u16),
    U32(PropertyId, u32),
    SubscriptionIdentifier(u32),
    String(PropertyId, String),
    Binary(PropertyId, Bytes),
    User(UserProperty),
}

impl Property {
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        use PropertyId::*;
        let raw = r.var_int("property identifier")?;
        let id = PropertyId::from_u32(raw).ok_or(Malformed::UnknownProperty(raw))?;
        let invalid = || DecodeError::from(ProtocolViolation::InvalidPropertyValue(id));
        Ok(match id {
            PayloadFormatIndicator
            | RequestProblemInformation
            | RequestResponseInformation
            | RetainAvailable
            | WildcardSubscriptionAvailable
            | SubscriptionIdentifierAvailable
            | SharedSubscriptionAvailable => match r.u8("property value")? {
                0 => Property::Flag(id, false),
                1 => Property::Flag(id, true),
                _ => return Err(invalid()),
            },
            MaximumQos => match r.u8("property value")? {
                0 => Property::MaximumQos(QoS::AtMostOnce),
                1 => Property::MaximumQos(QoS::AtLeastOnce),
                _ => return Err(invalid()),
            },
            ServerKeepAlive | ReceiveMaximum | TopicAliasMaximum | TopicAlias => {
                let value = r.u16("property value")?;
                if value == 0 && matches!(id, ReceiveMaximum | TopicAlias) {
                    return Err(invalid());
                }
                Property::U16(id, value)
            }
            MessageExpiryInterval | SessionExpiryInterval | WillDelayInterval | MaximumPacketSize => {
                let value = r.u32("property value")?;
                if value == 0 && id == MaximumPacketSize {
                    return Err(invalid());
                }
                Property::U32(id, value)
            }
            SubscriptionIdentifier => match r.var_int("subscription identifier")? {
                0 => return Err(invalid()),
                value => Property::SubscriptionIdentifier(value),
            },
            ContentType
            | ResponseTopic
            | AssignedClientIdentifier
            | AuthenticationMethod
            | ResponseInformation
            | ServerReference
            | ReasonString => Property::String(id, r.string("property value")?),
            CorrelationData | AuthenticationData => Property::Binary(id, r.binary("property value")?),
            UserProperty => {
                let name = r.string("user property name")?;
                let value = r.string("user property value")?;
                Property::User((name, value))
            }
        })
    }

    pub(crate) fn id(&self) -> PropertyId {
        match self {
            Property::Flag(id, _)
            | Property::U16(id, _)
            | Property::U32(id, _)
            | Property::String(id, _)
            | Property::Binary(id, _) => *id,
            Property::MaximumQos(_) => PropertyId::MaximumQos,
            Property::SubscriptionIdentifier(_) => PropertyId::SubscriptionIdentifier,
            Property::User(_) => PropertyId::UserProperty,
        }
    }
}

/// A typed set of the properties one packet may carry.
pub(crate) trait PropertySet: Default {
    /// Packet name for "not allowed in" errors.
    const CONTEXT: &'static str;

    /// Stores one property, or rejects it as not allowed here or duplicated.
    fn apply(&mut self, property: Property) -> Result<(), DecodeError>;

    /// Writes every present property, without the length prefix.
    fn write(&self, sink: &mut impl Sink) -> Result<(), EncodeError>;

    /// Cross-property rules checked once all are read.
    fn validate(&self) -> Result<(), DecodeError> {
        Ok(())
    }

    /// Reads a property block: length prefix, then properties until it is used up.
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let len = r.var_int("property length")?;
        let len = usize::try_from(len).map_err(|_| Malformed::Truncated("properties"))?;
        let mut block = r.sub(len, "properties")?;
        let mut set = Self::default();
        while !block.is_empty() {
            set.apply(Property::read(&mut block)?)?;
        }
        set.validate()?;
        Ok(set)
    }

    /// Writes the length prefix and the properties.
    fn write_block(&self, sink: &mut impl Sink) -> Result<(), EncodeError> {
        let len = measure(|c| self.write(c))?;
        put_len(sink, len, "property length")?;
        self.write(sink)
    }
}

/// The error for a property this packet may not carry.
pub(crate) fn not_allowed<P: PropertySet>(property: &Property) -> DecodeError {
    Malformed::PropertyNotAllowed { property: property.id(), packet: P::CONTEXT }.into()
}

/// Stores a property that may appear at most once.
pub(crate) fn once<T>(slot: &mut Option<T>, value: T, id: PropertyId) -> Result<(), DecodeError> {
    if slot.is_some() {
        return Err(ProtocolViolation::DuplicateProperty(id).into());
    }
    *slot = Some(value);
    Ok(())
}

pub(crate) fn put_flag(sink: &mut impl Sink, id: PropertyId, value: Option<bool>) {
    if let Some(v) = value {
        sink.put_u8(id as u8);
        sink.put_u8(u8::from(v));
    }
}

pub(crate) fn put_u16(sink: &mut impl Sink, id: PropertyId, value: Option<u16>) {
    if let Some(v) = value {
        sink.put_u8(id as u8);
        sink.put_u16(v);
    }
}

pub(crate) fn put_u32(sink: &mut impl Sink, id: PropertyId, value: Option<u32>) {
    if let Some(v) = value {
        sink.put_u8(id as u8);
        sink.put_u32(v);
    }
}

pub(crate) fn put_str(sink: &mut impl Sink, id: PropertyId, value: Option<&str>) -> Result<(), EncodeError> {
    if let Some(v) = value {
        sink.put_u8(id as u8);
        put_string(sink, v, "string property")?;
    }
    Ok(())
}

pub(crate) fn put_bin(sink: &mut impl Sink, id: PropertyId, value: Option<&Bytes>) -> Result<(), EncodeError> {
    if let Some(v) = value {
        sink.put_u8(id as u8);
        put_binary(sink, v, "binary property")?;
    }
    Ok(())
}

pub(crate) fn put_sub_id(sink: &mut impl Sink, value: u32) -> Result<(), EncodeError> {
    if value == 0 {
        return Err(EncodeError::Invalid("subscription identifier 0"));
    }
    sink.put_u8(PropertyId::SubscriptionIdentifier as u8);
    put_var_int(sink, value, "subscription identifier")
}

pub(crate) fn put_users(sink: &mut impl Sink, users: &[UserProperty]) -> Result<(), EncodeError> {
    for (name, value) in users {
        sink.put_u8(PropertyId::UserProperty as u8);
        put_string(sink, name, "user property name")?;
        put_string(sink, value, "user property value")?;
    }
    Ok(())
}

/// Rejects zero where the spec forbids it, so encode never produces what decode refuses.
pub(crate) fn nonzero<T: PartialEq + Default + Copy>(
    value: Option<T>,
    what: &'static str,
) -> Result<Option<T>, EncodeError> {
    match value {
        Some(v) if v == T::default() => Err(EncodeError::Invalid(what)),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &'static [u8]) -> Result<Property, DecodeError> {
        Property::read(&mut Reader::new(Bytes::from_static(bytes)))
    }

    #[test]
    fn unknown_identifier_is_malformed() {
        assert_eq!(read(&[0x04, 0]), Err(Malformed::UnknownProperty(4).into()));
        // A two-byte identifier encoding 0x81 names no property.
        assert_eq!(read(&[0x81, 0x01, 0]), Err(Malformed::UnknownProperty(0x81).into()));
    }

    #[test]
    fn forbidden_values_are_protocol_errors() {
        let invalid = |id| Err(ProtocolViolation::InvalidPropertyValue(id).into());
        assert_eq!(read(&[0x01, 2]), invalid(PropertyId::PayloadFormatIndicator));
        assert_eq!(read(&[0x21, 0, 0]), invalid(PropertyId::ReceiveMaximum));
        assert_eq!(read(&[0x27, 0, 0, 0, 0]), invalid(PropertyId::MaximumPacketSize));
        assert_eq!(read(&[0x23, 0, 0]), invalid(PropertyId::TopicAlias));
        assert_eq!(read(&[0x0B, 0]), invalid(PropertyId::SubscriptionIdentifier));
        assert_eq!(read(&[0x24, 2]), invalid(PropertyId::MaximumQos));
    }

    #[test]
    fn subscription_identifier_is_a_var_int() {
        assert_eq!(read(&[0x0B, 0x80, 0x01]), Ok(Property::SubscriptionIdentifier(128)));
    }

    #[test]
    fn user_property_reads_name_then_value() {
        assert_eq!(read(&[0x26, 0, 1, b'k', 0, 1, b'v']), Ok(Property::User(("k".into(), "v".into()))));
    }
}
