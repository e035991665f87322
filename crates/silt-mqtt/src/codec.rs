//! Framing: check-then-parse decoding of whole packets from a connection's read buffer, and
//! encoding with the fixed header.
//!
//! Invariants:
//! - `Ok(None)` means "need more bytes" and leaves the buffer untouched.
//! - The packet type, fixed-header flags, the remaining-length varint (at most four bytes)
//!   and the total size against `max_packet_size` are all checked from the first bytes,
//!   before the body is awaited, so a peer cannot make the broker buffer an oversized packet.
//! - A decoded packet's `Bytes` fields (payloads, binary properties) share the frame's
//!   allocation; nothing is copied except strings.
//! - On `Err`, the connection is to be closed; how much of the buffer was consumed is
//!   unspecified.
//! - Encoding validates the whole packet before writing; on `Err` the buffer is unchanged.

use bytes::{BufMut, BytesMut};

use crate::error::{ConnectError, DecodeError, EncodeError, Malformed, ProtocolViolation};
use crate::packet::{Connect, Packet};
use crate::types::{PacketType, ProtocolVersion};
use crate::wire::{MAX_VAR_INT, Reader, Sink, VarInt, measure, parse_var_int, put_len, var_int_len};

/// Where the body of a complete frame starts and ends.
struct Frame {
    header_len: usize,
    total_len: usize,
}

/// Validates the fixed header at the front of `buf` and returns the frame bounds once every
/// byte of the frame is buffered.
fn frame(buf: &[u8], max_packet_size: u32) -> Result<Option<Frame>, DecodeError> {
    let (remaining, len_bytes) = match parse_var_int(buf.get(1..).unwrap_or(&[])) {
        VarInt::Incomplete => return Ok(None),
        VarInt::TooLong => return Err(Malformed::RemainingLengthTooLong.into()),
        VarInt::Value { value, len } => (value, len),
    };
    let header_len = 1 + len_bytes;
    let size = header_len as u64 + u64::from(remaining);
    if size > u64::from(max_packet_size) {
        return Err(DecodeError::PacketTooLarge { size, max: max_packet_size });
    }
    // `size` is at most 5 + 268_435_455 and at most `max_packet_size`, so it fits a usize on
    // every platform with 32-bit or wider pointers.
    let total_len = usize::try_from(size).map_err(|_| DecodeError::PacketTooLarge { size, max: max_packet_size })?;
    if buf.len() < total_len {
        return Ok(None);
    }
    Ok(Some(Frame { header_len, total_len }))
}

/// The packet type and flags of a first byte, validated for `version`.
fn packet_type(byte: u8, version: ProtocolVersion) -> Result<(PacketType, u8), DecodeError> {
    let nibble = byte >> 4;
    let flags = byte & 0x0F;
    let ty = PacketType::from_nibble(nibble, version).ok_or(Malformed::ReservedPacketType(nibble))?;
    if let Some(required) = ty.required_flags()
        && flags != required
    {
        return Err(Malformed::InvalidFlags { packet: ty, flags }.into());
    }
    Ok((ty, flags))
}

/// Decodes the next packet of a connection that speaks `version`.
///
/// Returns `Ok(None)`, consuming nothing, until a whole packet is buffered. Packets larger
/// than `max_packet_size` bytes (fixed header included) are refused with
/// [`DecodeError::PacketTooLarge`] as soon as their fixed header is readable.
pub fn decode(
    buf: &mut BytesMut,
    version: ProtocolVersion,
    max_packet_size: u32,
) -> Result<Option<Packet>, DecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let (ty, flags) = packet_type(first, version)?;
    let Some(frame) = frame(buf, max_packet_size)? else {
        return Ok(None);
    };
    let body = buf.split_to(frame.total_len).freeze().slice(frame.header_len..);
    Packet::decode_body(ty, flags, Reader::new(body), version).map(Some)
}

/// Decodes the first packet of a connection, which must be a CONNECT; its
/// [`Connect::protocol_version`] is the `version` for every later [`decode`].
///
/// Same framing contract as [`decode`]. The error tells the version when the CONNECT got
/// far enough to name one, so the broker can answer in kind.
pub fn decode_connect(buf: &mut BytesMut, max_packet_size: u32) -> Result<Option<Connect>, ConnectError> {
    let fail = |error: DecodeError| ConnectError { version: None, error };
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let (ty, _) = packet_type(first, ProtocolVersion::V5).map_err(fail)?;
    if ty != PacketType::Connect {
        return Err(fail(ProtocolViolation::FirstPacketNotConnect(ty).into()));
    }
    // A CONNECT refused for its size still gets a CONNACK in its version when the first
    // bytes name one.
    let too_large = |error: DecodeError| ConnectError { version: peek_connect_version(buf), error };
    let Some(frame) = frame(buf, max_packet_size).map_err(too_large)? else {
        return Ok(None);
    };
    let body = buf.split_to(frame.total_len).freeze().slice(frame.header_len..);
    Connect::decode(Reader::new(body)).map(Some)
}

/// A packet's body, written by [`encode_with`] twice: once to measure it, once into the buffer.
pub(crate) trait Body {
    fn write_body(&self, version: ProtocolVersion, s: &mut impl Sink) -> Result<(), EncodeError>;
}

/// Appends a packet: `first_byte`, the remaining length, then `body`. On error `buf` is
/// unchanged.
pub(crate) fn encode_with(
    first_byte: u8,
    body: &impl Body,
    version: ProtocolVersion,
    buf: &mut BytesMut,
) -> Result<(), EncodeError> {
    let remaining = remaining_len(body, version)?;
    let start = buf.len();
    buf.reserve(1 + var_int_len(remaining as u32) + remaining);
    BufMut::put_u8(buf, first_byte);
    let written = put_len(buf, remaining, "remaining length").and_then(|()| body.write_body(version, buf));
    if let Err(e) = written {
        buf.truncate(start);
        return Err(e);
    }
    Ok(())
}

fn remaining_len(body: &impl Body, version: ProtocolVersion) -> Result<usize, EncodeError> {
    let remaining = measure(|c| body.write_body(version, c))?;
    if remaining > MAX_VAR_INT as usize {
        return Err(EncodeError::PacketTooLarge(remaining));
    }
    Ok(remaining)
}

/// The protocol version a CONNECT's first bytes name, if enough of them are buffered.
fn peek_connect_version(buf: &[u8]) -> Option<ProtocolVersion> {
    let VarInt::Value { len, .. } = parse_var_int(buf.get(1..)?) else { return None };
    let rest = buf.get(1 + len..)?;
    let name_len = usize::from(u16::from_be_bytes([*rest.first()?, *rest.get(1)?]));
    let name = std::str::from_utf8(rest.get(2..2 + name_len)?).ok()?;
    ProtocolVersion::from_name_and_level(name, *rest.get(2 + name_len)?)
}

impl Packet {
    /// Appends the encoded packet to `buf`. On error `buf` is unchanged.
    ///
    /// Fields that `version` cannot carry are dropped silently (properties and reason codes
    /// for MQTT 3.x), so a message from a 5.0 publisher can be forwarded to a 3.1.1
    /// subscriber as is. Packets that do not exist in `version` (AUTH before 5.0) are errors.
    pub fn encode(&self, version: ProtocolVersion, buf: &mut BytesMut) -> Result<(), EncodeError> {
        encode_with(self.first_byte(), self, version, buf)
    }

    /// Number of bytes [`Packet::encode`] would append, fixed header included: what the broker
    /// compares with a client's Maximum Packet Size before sending.
    pub fn encoded_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        let remaining = remaining_len(self, version)?;
        Ok(1 + var_int_len(remaining as u32) + remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: ProtocolVersion = ProtocolVersion::V3_1_1;

    #[test]
    fn incomplete_header_or_body_consumes_nothing() {
        for partial in [&[][..], &[0x30], &[0x30, 0x80], &[0x30, 0x05, 0x00, 0x01]] {
            let mut buf = BytesMut::from(partial);
            assert_eq!(decode(&mut buf, V4, 1024), Ok(None));
            assert_eq!(&buf[..], partial);
        }
    }

    #[test]
    fn oversized_packet_is_refused_from_its_header_alone() {
        // Announces about 200 MB with only the header buffered.
        let mut buf = BytesMut::from(&[0x30, 0x80, 0x80, 0xE0, 0x5F][..]);
        let announced = (0x60 << 14) + (0x5F << 21) + 5;
        assert_eq!(decode(&mut buf, V4, 1 << 20), Err(DecodeError::PacketTooLarge { size: announced, max: 1 << 20 }));
    }

    #[test]
    fn max_packet_size_counts_the_fixed_header() {
        let mut buf = BytesMut::from(&[0xC0, 0x00][..]);
        assert_eq!(decode(&mut buf, V4, 1), Err(DecodeError::PacketTooLarge { size: 2, max: 1 }));
        assert_eq!(decode(&mut buf, V4, 2), Ok(Some(Packet::PingReq)));
    }

    #[test]
    fn five_byte_remaining_length_is_malformed() {
        let mut buf = BytesMut::from(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01][..]);
        assert_eq!(decode(&mut buf, V4, u32::MAX), Err(Malformed::RemainingLengthTooLong.into()));
    }

    #[test]
    fn reserved_type_and_flags_are_rejected_before_the_body_arrives() {
        let mut buf = BytesMut::from(&[0x00][..]);
        assert_eq!(decode(&mut buf, V4, 1024), Err(Malformed::ReservedPacketType(0).into()));
        let mut buf = BytesMut::from(&[0xF0][..]);
        assert_eq!(decode(&mut buf, V4, 1024), Err(Malformed::ReservedPacketType(15).into()));
        let mut buf = BytesMut::from(&[0x60][..]);
        assert_eq!(
            decode(&mut buf, V4, 1024),
            Err(Malformed::InvalidFlags { packet: PacketType::PubRel, flags: 0 }.into())
        );
    }

    #[test]
    fn first_packet_must_be_connect() {
        let mut buf = BytesMut::from(&[0xC0, 0x00][..]);
        let err = decode_connect(&mut buf, 1024).expect_err("PINGREQ first");
        assert_eq!(err.error, ProtocolViolation::FirstPacketNotConnect(PacketType::PingReq).into());
    }

    #[test]
    fn two_packets_in_one_buffer_decode_in_order() {
        let mut buf = BytesMut::from(&[0xC0, 0x00, 0xD0, 0x00, 0xE0][..]);
        assert_eq!(decode(&mut buf, V4, 1024), Ok(Some(Packet::PingReq)));
        assert_eq!(decode(&mut buf, V4, 1024), Ok(Some(Packet::PingResp)));
        assert_eq!(decode(&mut buf, V4, 1024), Ok(None));
        assert_eq!(&buf[..], &[0xE0]);
    }

    #[test]
    fn publish_payload_shares_the_read_buffer() {
        let mut buf = BytesMut::from(&b"\x30\x0a\x00\x01tpayload"[..]);
        let start = buf.as_ptr() as usize;
        let Ok(Some(Packet::Publish(p))) = decode(&mut buf, V4, 1024) else { panic!("a PUBLISH") };
        assert_eq!(&p.payload[..], b"payload");
        assert_eq!(p.payload.as_ptr() as usize, start + 5, "payload points into the original allocation");
    }

    #[test]
    fn failed_encode_leaves_the_buffer_unchanged() {
        let mut buf = BytesMut::from(&b"keep"[..]);
        let auth = Packet::Auth(Box::default());
        assert!(auth.encode(V4, &mut buf).is_err());
        assert_eq!(&buf[..], b"keep");
    }

    #[test]
    fn encoded_len_matches_encode() {
        let p = Packet::Publish(crate::packet::Publish::new("t", vec![0u8; 300]));
        let mut buf = BytesMut::new();
        p.encode(V4, &mut buf).expect("encodable");
        assert_eq!(p.encoded_len(V4), Ok(buf.len()));
        // 303 bytes of body: two-byte remaining length 0xAF 0x02.
        assert_eq!(&buf[..4], &[0x30, 0xAF, 0x02, 0x00]);
    }
}
