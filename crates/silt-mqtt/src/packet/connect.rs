//! CONNECT (spec §3.1): the first packet of every connection, and the one that names the
//! protocol version all later packets are decoded with.
//!
//! Checked here: protocol name/level (unsupported → [`DecodeError::UnsupportedProtocolVersion`]),
//! the reserved flag bit and will flags without a will (Malformed), will QoS 3 (Malformed), a
//! password without a user name before MQTT 5.0 (Protocol Error), wildcards in the will topic.
//! Not checked: client identifier length or characters, keep-alive policy, authentication —
//! those are the broker's decisions, answered with a CONNACK.

use bytes::Bytes;

use crate::error::{ConnectError, DecodeError, EncodeError, Malformed, ProtocolViolation};
use crate::packet::check_topic_name;
use crate::properties::{ConnectProperties, WillProperties};
use crate::property::PropertySet;
use crate::types::{ProtocolVersion, QoS};
use crate::wire::{Reader, Sink, put_binary, put_string};

const RESERVED: u8 = 0x01;
const CLEAN_START: u8 = 0x02;
const WILL: u8 = 0x04;
const WILL_RETAIN: u8 = 0x20;
const PASSWORD: u8 = 0x40;
const USERNAME: u8 = 0x80;

/// A CONNECT packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// The version this CONNECT declares; the connection speaks it from then on.
    pub protocol_version: ProtocolVersion,
    /// "Clean Session" in MQTT 3.x, "Clean Start" in 5.0.
    pub clean_start: bool,
    /// Seconds; 0 disables keep-alive.
    pub keep_alive: u16,
    /// May be empty (the server then assigns one, or refuses).
    pub client_id: String,
    pub will: Option<Will>,
    pub username: Option<String>,
    pub password: Option<Bytes>,
    /// Always empty before MQTT 5.0.
    pub properties: ConnectProperties,
}

/// The will message a CONNECT registers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Will {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// Always empty before MQTT 5.0.
    pub properties: WillProperties,
}

impl Connect {
    /// A CONNECT with a clean start, no will, no credentials and no properties.
    pub fn new(protocol_version: ProtocolVersion, client_id: impl Into<String>, keep_alive: u16) -> Self {
        Self {
            protocol_version,
            clean_start: true,
            keep_alive,
            client_id: client_id.into(),
            will: None,
            username: None,
            password: None,
            properties: ConnectProperties::default(),
        }
    }

    pub(crate) fn decode(mut r: Reader) -> Result<Self, ConnectError> {
        let name = r.string("protocol name").map_err(|error| ConnectError { version: None, error })?;
        let level = r.u8("protocol level").map_err(|error| ConnectError { version: None, error })?;
        let Some(version) = ProtocolVersion::from_name_and_level(&name, level) else {
            return Err(ConnectError { version: None, error: DecodeError::UnsupportedProtocolVersion { name, level } });
        };
        Self::decode_rest(r, version).map_err(|error| ConnectError { version: Some(version), error })
    }

    fn decode_rest(mut r: Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let flags = r.u8("connect flags")?;
        if flags & RESERVED != 0 {
            return Err(Malformed::ConnectReservedFlag.into());
        }
        let will_flag = flags & WILL != 0;
        let will_qos = (flags >> 3) & 0b11;
        let will_retain = flags & WILL_RETAIN != 0;
        if !will_flag && (will_qos != 0 || will_retain) {
            return Err(Malformed::WillFlagsWithoutWill.into());
        }
        let will_qos = QoS::from_u8(will_qos).ok_or(Malformed::InvalidQos)?;
        let has_username = flags & USERNAME != 0;
        let has_password = flags & PASSWORD != 0;
        if has_password && !has_username && !version.is_v5() {
            return Err(ProtocolViolation::PasswordWithoutUsername.into());
        }
        let keep_alive = r.u16("keep alive")?;
        let properties = if version.is_v5() { ConnectProperties::read(&mut r)? } else { ConnectProperties::default() };
        let client_id = r.string("client identifier")?;
        let will = if will_flag {
            let properties = if version.is_v5() { WillProperties::read(&mut r)? } else { WillProperties::default() };
            let topic = r.string("will topic")?;
            check_topic_name(&topic, false)?;
            let payload = r.binary("will payload")?;
            Some(Will { topic, payload, qos: will_qos, retain: will_retain, properties })
        } else {
            None
        };
        let username = if has_username { Some(r.string("user name")?) } else { None };
        let password = if has_password { Some(r.binary("password")?) } else { None };
        r.finish()?;
        Ok(Self {
            protocol_version: version,
            clean_start: flags & CLEAN_START != 0,
            keep_alive,
            client_id,
            will,
            username,
            password,
            properties,
        })
    }

    pub(crate) fn write(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError> {
        if version != self.protocol_version {
            return Err(EncodeError::VersionMismatch { connect: self.protocol_version, requested: version });
        }
        if self.password.is_some() && self.username.is_none() && !version.is_v5() {
            return Err(EncodeError::Invalid("a password without a user name needs MQTT 5.0"));
        }
        put_string(s, version.protocol_name(), "protocol name")?;
        s.put_u8(version.level());
        let mut flags = 0;
        if self.clean_start {
            flags |= CLEAN_START;
        }
        if let Some(will) = &self.will {
            flags |= WILL | (will.qos.as_u8() << 3);
            if will.retain {
                flags |= WILL_RETAIN;
            }
        }
        if self.password.is_some() {
            flags |= PASSWORD;
        }
        if self.username.is_some() {
            flags |= USERNAME;
        }
        s.put_u8(flags);
        s.put_u16(self.keep_alive);
        if version.is_v5() {
            self.properties.write_block(s)?;
        }
        put_string(s, &self.client_id, "client identifier")?;
        if let Some(will) = &self.will {
            if version.is_v5() {
                will.properties.write_block(s)?;
            }
            put_string(s, &will.topic, "will topic")?;
            put_binary(s, &will.payload, "will payload")?;
        }
        if let Some(username) = &self.username {
            put_string(s, username, "user name")?;
        }
        if let Some(password) = &self.password {
            put_binary(s, password, "password")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(body: &'static [u8]) -> Result<Connect, ConnectError> {
        Connect::decode(Reader::new(Bytes::from_static(body)))
    }

    #[test]
    fn unknown_level_is_unsupported_version() {
        let err = decode(b"\x00\x04MQTT\x06\x02\x00\x3c\x00\x00").expect_err("level 6");
        assert_eq!(err.version, None);
        assert_eq!(err.error, DecodeError::UnsupportedProtocolVersion { name: "MQTT".into(), level: 6 });
    }

    #[test]
    fn reserved_connect_flag_is_malformed_and_reports_the_version() {
        let err = decode(b"\x00\x04MQTT\x05\x03\x00\x3c\x00\x00\x00").expect_err("reserved bit");
        assert_eq!(err.version, Some(ProtocolVersion::V5));
        assert_eq!(err.error, Malformed::ConnectReservedFlag.into());
    }

    #[test]
    fn will_qos_without_will_flag_is_malformed() {
        let err = decode(b"\x00\x04MQTT\x04\x0a\x00\x3c\x00\x00").expect_err("will qos 1, no will");
        assert_eq!(err.error, Malformed::WillFlagsWithoutWill.into());
    }

    #[test]
    fn will_qos_three_is_malformed() {
        let err = decode(b"\x00\x04MQTT\x04\x1e\x00\x3c\x00\x00").expect_err("will qos 3");
        assert_eq!(err.error, Malformed::InvalidQos.into());
    }

    #[test]
    fn password_without_username_is_allowed_only_in_v5() {
        let err = decode(b"\x00\x04MQTT\x04\x42\x00\x3c\x00\x00\x00\x01p").expect_err("3.1.1");
        assert_eq!(err.error, ProtocolViolation::PasswordWithoutUsername.into());
        let ok = decode(b"\x00\x04MQTT\x05\x42\x00\x3c\x00\x00\x00\x00\x01p").expect("5.0");
        assert_eq!(ok.password.as_deref(), Some(&b"p"[..]));
        assert_eq!(ok.username, None);
    }

    #[test]
    fn trailing_bytes_after_payload_are_malformed() {
        let err = decode(b"\x00\x04MQTT\x04\x02\x00\x3c\x00\x00!").expect_err("trailing");
        assert_eq!(err.error, Malformed::TrailingBytes(1).into());
    }

    #[test]
    fn encoding_under_another_version_is_refused() {
        let connect = Connect::new(ProtocolVersion::V5, "c", 10);
        let err = connect.write(ProtocolVersion::V3_1_1, &mut crate::wire::Counter::default());
        assert!(matches!(err, Err(EncodeError::VersionMismatch { .. })));
    }
}
