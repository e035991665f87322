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
                if value == 0 && zero_forbidden(id).is_some() {
                    return Err(invalid());
                }
                Property::U16(id, value)
            }
            MessageExpiryInterval | SessionExpiryInterval | WillDelayInterval | MaximumPacketSize => {
                let value = r.u32("property value")?;
                if value == 0 && zero_forbidden(id).is_some() {
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

    /// Cross-property rules checked before writing.
    fn check(&self) -> Result<(), EncodeError> {
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

    /// Checks the set, then writes the length prefix and the properties.
    fn write_block(&self, sink: &mut impl Sink) -> Result<(), EncodeError> {
        self.check()?;
        let len = measure(|c| self.write(c))?;
        put_len(sink, len, "property length")?;
        self.write(sink)
    }
}

/// The error for a property this packet may not carry.
pub(crate) fn not_allowed<P: PropertySet>(id: PropertyId) -> DecodeError {
    Malformed::PropertyNotAllowed { property: id, packet: P::CONTEXT }.into()
}

/// Stores a decoded property in its field of set `P`: the once-only check for an `Option`
/// field, appended in wire order for a `Vec` field.
pub(crate) fn store<P: PropertySet, K: Kind>(slot: &mut impl Slot<K>, property: Property) -> Result<(), DecodeError> {
    let id = property.id();
    // `Property::read` picks the kind from the identifier, so a field declared with that
    // identifier always gets its kind; refuse rather than panic should the two ever disagree.
    let value = K::take(property).ok_or_else(|| not_allowed::<P>(id))?;
    slot.store(value, id)
}

/// Writes a field of a property set: each value it holds, with its identifier.
pub(crate) fn put<K: Kind>(sink: &mut impl Sink, id: PropertyId, slot: &impl Slot<K>) -> Result<(), EncodeError> {
    slot.each(|value| K::put(sink, id, value))
}

/// How a property set holds one property: `Option` for one allowed at most once, `Vec` for
/// one that may repeat (user properties, PUBLISH subscription identifiers).
pub(crate) trait Slot<K: Kind> {
    fn store(&mut self, value: K::Value, id: PropertyId) -> Result<(), DecodeError>;

    fn each(&self, f: impl FnMut(&K::Value) -> Result<(), EncodeError>) -> Result<(), EncodeError>;
}

impl<K: Kind> Slot<K> for Option<K::Value> {
    fn store(&mut self, value: K::Value, id: PropertyId) -> Result<(), DecodeError> {
        if self.is_some() {
            return Err(ProtocolViolation::DuplicateProperty(id).into());
        }
        *self = Some(value);
        Ok(())
    }

    fn each(&self, f: impl FnMut(&K::Value) -> Result<(), EncodeError>) -> Result<(), EncodeError> {
        self.iter().try_for_each(f)
    }
}

impl<K: Kind> Slot<K> for Vec<K::Value> {
    fn store(&mut self, value: K::Value, _: PropertyId) -> Result<(), DecodeError> {
        self.push(value);
        Ok(())
    }

    fn each(&self, f: impl FnMut(&K::Value) -> Result<(), EncodeError>) -> Result<(), EncodeError> {
        self.iter().try_for_each(f)
    }
}

/// A property value type on the wire (spec §2.2.2.2), with the Rust type a set stores it as.
pub(crate) trait Kind {
    type Value;

    /// The value of a decoded property, if it is of this kind.
    fn take(property: Property) -> Option<Self::Value>;

    /// Writes the identifier and the value, refusing values decoding would refuse.
    fn put(sink: &mut impl Sink, id: PropertyId, value: &Self::Value) -> Result<(), EncodeError>;
}

/// The value kinds property sets declare their fields with.
pub(crate) mod kind {
    use super::*;

    /// A byte that is 0 or 1.
    pub(crate) struct Flag;
    /// The Maximum QoS byte: 0 or 1 (2 is said by leaving it out).
    pub(crate) struct Qos;
    /// A two byte integer.
    pub(crate) struct U16;
    /// A four byte integer.
    pub(crate) struct U32;
    /// A variable byte integer (only the Subscription Identifier has this kind).
    pub(crate) struct VarInt;
    /// A UTF-8 encoded string.
    pub(crate) struct Utf8;
    /// Binary data.
    pub(crate) struct Binary;
    /// A UTF-8 string pair (only the User Property has this kind).
    pub(crate) struct Pair;

    impl Kind for Flag {
        type Value = bool;

        fn take(property: Property) -> Option<bool> {
            if let Property::Flag(_, v) = property { Some(v) } else { None }
        }

        fn put(sink: &mut impl Sink, id: PropertyId, value: &bool) -> Result<(), EncodeError> {
            sink.put_u8(id as u8);
            sink.put_u8(u8::from(*value));
            Ok(())
        }
    }

    impl Kind for Qos {
        type Value = QoS;

        fn take(property: Property) -> Option<QoS> {
            if let Property::MaximumQos(v) = property { Some(v) } else { None }
        }

        fn put(sink: &mut impl Sink, id: PropertyId, value: &QoS) -> Result<(), EncodeError> {
            if *value == QoS::ExactlyOnce {
                return Err(EncodeError::Invalid("maximum QoS 2 must be sent as an absent property"));
            }
            sink.put_u8(id as u8);
            sink.put_u8(value.as_u8());
            Ok(())
        }
    }

    impl Kind for U16 {
        type Value = u16;

        fn take(property: Property) -> Option<u16> {
            if let Property::U16(_, v) = property { Some(v) } else { None }
        }

        fn put(sink: &mut impl Sink, id: PropertyId, value: &u16) -> Result<(), EncodeError> {
            nonzero(id, *value == 0)?;
            sink.put_u8(id as u8);
            sink.put_u16(*value);
            Ok(())
        }
    }

    impl Kind for U32 {
        type Value = u32;

        fn take(property: Property) -> Option<u32> {
            if let Property::U32(_, v) = property { Some(v) } else { None }
        }

        fn put(sink: &mut impl Sink, id: PropertyId, value: &u32) -> Result<(), EncodeError> {
            nonzero(id, *value == 0)?;
            sink.put_u8(id as u8);
            sink.put_u32(*value);
            Ok(())
        }
    }

    impl Kind for VarInt {
        type Value = u32;

        fn take(property: Property) -> Option<u32> {
            if let Property::SubscriptionIdentifier(v) = property { Some(v) } else { None }
        }

        fn put(sink: &mut impl Sink, id: PropertyId, value: &u32) -> Result<(), EncodeError> {
            nonzero(id, *value == 0)?;
            sink.put_u8(id as u8);
            put_var_int(sink, *value, "subscription identifier")
        }
    }

    impl Kind for Utf8 {
        type Value = String;

        fn take(property: Property) -> Option<String> {
            if let Property::String(_, v) = property { Some(v) } else { None }
        }

        fn put(sink: &mut impl Sink, id: PropertyId, value: &String) -> Result<(), EncodeError> {
            sink.put_u8(id as u8);
            put_string(sink, value, "string property")
        }
    }

    impl Kind for Binary {
        type Value = Bytes;

        fn take(property: Property) -> Option<Bytes> {
            if let Property::Binary(_, v) = property { Some(v) } else { None }
        }

        fn put(sink: &mut impl Sink, id: PropertyId, value: &Bytes) -> Result<(), EncodeError> {
            sink.put_u8(id as u8);
            put_binary(sink, value, "binary property")
        }
    }

    impl Kind for Pair {
        type Value = UserProperty;

        fn take(property: Property) -> Option<UserProperty> {
            if let Property::User(v) = property { Some(v) } else { None }
        }

        fn put(sink: &mut impl Sink, id: PropertyId, (name, value): &UserProperty) -> Result<(), EncodeError> {
            sink.put_u8(id as u8);
            put_string(sink, name, "user property name")?;
            put_string(sink, value, "user property value")
        }
    }
}

/// Properties whose value may not be 0, with the encode error for it. Decoding refuses the
/// same zeros, so encode never produces what decode refuses.
fn zero_forbidden(id: PropertyId) -> Option<&'static str> {
    match id {
        PropertyId::ReceiveMaximum => Some("receive maximum 0"),
        PropertyId::MaximumPacketSize => Some("maximum packet size 0"),
        PropertyId::TopicAlias => Some("topic alias 0"),
        PropertyId::SubscriptionIdentifier => Some("subscription identifier 0"),
        _ => None,
    }
}

fn nonzero(id: PropertyId, is_zero: bool) -> Result<(), EncodeError> {
    match zero_forbidden(id) {
        Some(what) if is_zero => Err(EncodeError::Invalid(what)),
        _ => Ok(()),
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
