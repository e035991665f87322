//! MQTT 5.0 reason codes (spec §2.4) and which packet may carry which code.
//!
//! One enum holds every value the spec defines. Value 0x00 has three spec names (Success,
//! Normal disconnection, Granted QoS 0); the enum has one variant and the other names are
//! associated constants. MQTT 3.x return codes are mapped onto these in the CONNACK and SUBACK
//! codecs, so the broker works with one vocabulary.

use std::fmt;

use crate::types::PacketType;

/// Every reason code defined by MQTT 5.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum ReasonCode {
    /// 0x00: Success, Normal disconnection, Granted QoS 0.
    #[default]
    Success = 0x00,
    GrantedQoS1 = 0x01,
    GrantedQoS2 = 0x02,
    DisconnectWithWillMessage = 0x04,
    NoMatchingSubscribers = 0x10,
    NoSubscriptionExisted = 0x11,
    ContinueAuthentication = 0x18,
    ReAuthenticate = 0x19,
    UnspecifiedError = 0x80,
    MalformedPacket = 0x81,
    ProtocolError = 0x82,
    ImplementationSpecificError = 0x83,
    UnsupportedProtocolVersion = 0x84,
    ClientIdentifierNotValid = 0x85,
    BadUserNameOrPassword = 0x86,
    NotAuthorized = 0x87,
    ServerUnavailable = 0x88,
    ServerBusy = 0x89,
    Banned = 0x8A,
    ServerShuttingDown = 0x8B,
    BadAuthenticationMethod = 0x8C,
    KeepAliveTimeout = 0x8D,
    SessionTakenOver = 0x8E,
    TopicFilterInvalid = 0x8F,
    TopicNameInvalid = 0x90,
    PacketIdentifierInUse = 0x91,
    PacketIdentifierNotFound = 0x92,
    ReceiveMaximumExceeded = 0x93,
    TopicAliasInvalid = 0x94,
    PacketTooLarge = 0x95,
    MessageRateTooHigh = 0x96,
    QuotaExceeded = 0x97,
    AdministrativeAction = 0x98,
    PayloadFormatInvalid = 0x99,
    RetainNotSupported = 0x9A,
    QoSNotSupported = 0x9B,
    UseAnotherServer = 0x9C,
    ServerMoved = 0x9D,
    SharedSubscriptionsNotSupported = 0x9E,
    ConnectionRateExceeded = 0x9F,
    MaximumConnectTime = 0xA0,
    SubscriptionIdentifiersNotSupported = 0xA1,
    WildcardSubscriptionsNotSupported = 0xA2,
}

/// Every defined reason code, in wire order.
pub(crate) const ALL: [ReasonCode; 43] = {
    use ReasonCode::*;
    [
        Success,
        GrantedQoS1,
        GrantedQoS2,
        DisconnectWithWillMessage,
        NoMatchingSubscribers,
        NoSubscriptionExisted,
        ContinueAuthentication,
        ReAuthenticate,
        UnspecifiedError,
        MalformedPacket,
        ProtocolError,
        ImplementationSpecificError,
        UnsupportedProtocolVersion,
        ClientIdentifierNotValid,
        BadUserNameOrPassword,
        NotAuthorized,
        ServerUnavailable,
        ServerBusy,
        Banned,
        ServerShuttingDown,
        BadAuthenticationMethod,
        KeepAliveTimeout,
        SessionTakenOver,
        TopicFilterInvalid,
        TopicNameInvalid,
        PacketIdentifierInUse,
        PacketIdentifierNotFound,
        ReceiveMaximumExceeded,
        TopicAliasInvalid,
        PacketTooLarge,
        MessageRateTooHigh,
        QuotaExceeded,
        AdministrativeAction,
        PayloadFormatInvalid,
        RetainNotSupported,
        QoSNotSupported,
        UseAnotherServer,
        ServerMoved,
        SharedSubscriptionsNotSupported,
        ConnectionRateExceeded,
        MaximumConnectTime,
        SubscriptionIdentifiersNotSupported,
        WildcardSubscriptionsNotSupported,
    ]
};

impl ReasonCode {
    /// 0x00 as named in DISCONNECT.
    pub const NORMAL_DISCONNECTION: Self = Self::Success;
    /// 0x00 as named in SUBACK.
    pub const GRANTED_QOS_0: Self = Self::Success;

    /// Parses a wire byte; `None` for values the spec does not define.
    pub fn from_u8(value: u8) -> Option<Self> {
        ALL.iter().copied().find(|code| code.as_u8() == value)
    }

    /// The wire byte.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Whether this code reports a failure (0x80 and above).
    pub const fn is_error(self) -> bool {
        self.as_u8() >= 0x80
    }

    /// Whether the spec lets `packet` carry this code (MQTT 5.0 §2.4 and each packet's
    /// reason-code table).
    pub fn allowed_in(self, packet: PacketType) -> bool {
        use ReasonCode::*;
        match packet {
            PacketType::ConnAck => matches!(
                self,
                Success
                    | UnspecifiedError
                    | MalformedPacket
                    | ProtocolError
                    | ImplementationSpecificError
                    | UnsupportedProtocolVersion
                    | ClientIdentifierNotValid
                    | BadUserNameOrPassword
                    | NotAuthorized
                    | ServerUnavailable
                    | ServerBusy
                    | Banned
                    | BadAuthenticationMethod
                    | TopicNameInvalid
                    | PacketTooLarge
                    | QuotaExceeded
                    | PayloadFormatInvalid
                    | RetainNotSupported
                    | QoSNotSupported
                    | UseAnotherServer
                    | ServerMoved
                    | ConnectionRateExceeded
            ),
            PacketType::PubAck | PacketType::PubRec => matches!(
                self,
                Success
                    | NoMatchingSubscribers
                    | UnspecifiedError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | TopicNameInvalid
                    | PacketIdentifierInUse
                    | QuotaExceeded
                    | PayloadFormatInvalid
            ),
            PacketType::PubRel | PacketType::PubComp => matches!(self, Success | PacketIdentifierNotFound),
            PacketType::SubAck => matches!(
                self,
                Success
                    | GrantedQoS1
                    | GrantedQoS2
                    | UnspecifiedError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | TopicFilterInvalid
                    | PacketIdentifierInUse
                    | QuotaExceeded
                    | SharedSubscriptionsNotSupported
                    | SubscriptionIdentifiersNotSupported
                    | WildcardSubscriptionsNotSupported
            ),
            PacketType::UnsubAck => matches!(
                self,
                Success
                    | NoSubscriptionExisted
                    | UnspecifiedError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | TopicFilterInvalid
                    | PacketIdentifierInUse
            ),
            PacketType::Disconnect => matches!(
                self,
                Success
                    | DisconnectWithWillMessage
                    | UnspecifiedError
                    | MalformedPacket
                    | ProtocolError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | ServerBusy
                    | ServerShuttingDown
                    | KeepAliveTimeout
                    | SessionTakenOver
                    | TopicFilterInvalid
                    | TopicNameInvalid
                    | ReceiveMaximumExceeded
                    | TopicAliasInvalid
                    | PacketTooLarge
                    | MessageRateTooHigh
                    | QuotaExceeded
                    | AdministrativeAction
                    | PayloadFormatInvalid
                    | RetainNotSupported
                    | QoSNotSupported
                    | UseAnotherServer
                    | ServerMoved
                    | SharedSubscriptionsNotSupported
                    | ConnectionRateExceeded
                    | MaximumConnectTime
                    | SubscriptionIdentifiersNotSupported
                    | WildcardSubscriptionsNotSupported
            ),
            PacketType::Auth => matches!(self, Success | ContinueAuthentication | ReAuthenticate),
            _ => false,
        }
    }
}

impl ReasonCode {
    /// A short explanation of an error code for a Reason String (MQTT 5.0 §3.1.2.11.7), from
    /// the server's side; `None` for success codes.
    pub fn explanation(self) -> Option<&'static str> {
        use ReasonCode::*;
        Some(match self {
            UnspecifiedError => "the server could not complete the request; try again",
            MalformedPacket => "the packet could not be decoded",
            ProtocolError => "the packet breaks the MQTT protocol",
            ImplementationSpecificError => "the server refused the request",
            UnsupportedProtocolVersion => "this server speaks MQTT 3.1, 3.1.1 and 5.0",
            ClientIdentifierNotValid => "the client identifier is not valid",
            BadUserNameOrPassword => "bad user name or password",
            NotAuthorized => "not authorized",
            ServerUnavailable => "the server is not available",
            ServerBusy => "the server is busy; try again later",
            Banned => "this client is banned",
            ServerShuttingDown => "the server is shutting down",
            BadAuthenticationMethod => "this server supports no extended authentication method",
            KeepAliveTimeout => "nothing received within one and a half keep alive intervals",
            SessionTakenOver => "another connection took the session over (same client identifier)",
            TopicFilterInvalid => "the topic filter is not valid",
            TopicNameInvalid => "the topic name is not valid",
            PacketIdentifierInUse => "the packet identifier is in use",
            PacketIdentifierNotFound => "no message with this packet identifier awaits it",
            ReceiveMaximumExceeded => "more QoS 1/2 messages in flight than the server's Receive Maximum",
            TopicAliasInvalid => "the topic alias is not valid",
            PacketTooLarge => "the packet exceeds the maximum packet size",
            MessageRateTooHigh => "the message rate is too high",
            QuotaExceeded => "a quota was exceeded",
            AdministrativeAction => "disconnected by an administrator",
            PayloadFormatInvalid => "the payload does not match its payload format indicator",
            RetainNotSupported => "retained messages are not supported",
            QoSNotSupported => "this QoS is not supported",
            UseAnotherServer => "use another server",
            ServerMoved => "the server has moved",
            SharedSubscriptionsNotSupported => "shared subscriptions are not supported",
            ConnectionRateExceeded => "the connection rate is too high",
            MaximumConnectTime => "the maximum connection time was reached",
            SubscriptionIdentifiersNotSupported => "subscription identifiers are not supported",
            WildcardSubscriptionsNotSupported => "wildcard subscriptions are not supported",
            Success
            | GrantedQoS1
            | GrantedQoS2
            | DisconnectWithWillMessage
            | NoMatchingSubscribers
            | NoSubscriptionExisted
            | ContinueAuthentication
            | ReAuthenticate => return None,
        })
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?} (0x{:02X})", self.as_u8())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_defined_byte_round_trips_and_others_are_rejected() {
        let mut defined = 0;
        for byte in 0..=u8::MAX {
            if let Some(code) = ReasonCode::from_u8(byte) {
                assert_eq!(code.as_u8(), byte);
                defined += 1;
            }
        }
        assert_eq!(defined, ALL.len());
        assert_eq!(ReasonCode::from_u8(0x03), None);
        assert_eq!(ReasonCode::from_u8(0xA3), None);
    }

    #[test]
    fn pubrel_only_allows_success_and_identifier_not_found() {
        let allowed: Vec<_> = ALL.iter().filter(|c| c.allowed_in(PacketType::PubRel)).collect();
        assert_eq!(allowed, [&ReasonCode::Success, &ReasonCode::PacketIdentifierNotFound]);
    }

    #[test]
    fn disconnect_allows_will_but_connack_does_not() {
        assert!(ReasonCode::DisconnectWithWillMessage.allowed_in(PacketType::Disconnect));
        assert!(!ReasonCode::DisconnectWithWillMessage.allowed_in(PacketType::ConnAck));
    }
}
