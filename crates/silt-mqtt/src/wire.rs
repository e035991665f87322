//! Wire primitives shared by every packet: a bounds-checked reader over a frozen frame, and a
//! [`Sink`] that either writes bytes or only counts them.
//!
//! Invariants: the reader never panics and never reads past its slice; strings it returns are
//! valid UTF-8 without U+0000; binary fields are zero-copy slices of the frame. Encoding runs
//! each packet body twice, once into a [`Counter`] (which validates everything and yields the
//! remaining length) and once into the output buffer, so the two can never disagree.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError, Malformed};

/// Largest value of a variable byte integer (four bytes of seven bits).
pub(crate) const MAX_VAR_INT: u32 = 268_435_455;

/// Bounds-checked cursor over one packet body (or a property block inside it).
#[derive(Debug)]
pub(crate) struct Reader {
    buf: Bytes,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Self {
        Self { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn need(&self, n: usize, field: &'static str) -> Result<(), DecodeError> {
        if self.buf.len() < n { Err(Malformed::Truncated(field).into()) } else { Ok(()) }
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        self.need(1, field)?;
        Ok(self.buf.get_u8())
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        self.need(2, field)?;
        Ok(self.buf.get_u16())
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.need(4, field)?;
        Ok(self.buf.get_u32())
    }

    /// A variable byte integer (spec §1.5.5). Non-minimal encodings are accepted: the spec
    /// obliges senders to be minimal but gives receivers no rule.
    pub(crate) fn var_int(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        match parse_var_int(&self.buf) {
            VarInt::Value { value, len } => {
                self.buf.advance(len);
                Ok(value)
            }
            VarInt::Incomplete => Err(Malformed::Truncated(field).into()),
            VarInt::TooLong => Err(Malformed::VarIntTooLong(field).into()),
        }
    }

    /// Takes the next `n` bytes without copying.
    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<Bytes, DecodeError> {
        self.need(n, field)?;
        Ok(self.buf.split_to(n))
    }

    /// A sub-reader over the next `n` bytes (a property block).
    pub(crate) fn sub(&mut self, n: usize, field: &'static str) -> Result<Reader, DecodeError> {
        Ok(Reader::new(self.take(n, field)?))
    }

    /// Binary data: two-byte length then that many bytes, zero-copy.
    pub(crate) fn binary(&mut self, field: &'static str) -> Result<Bytes, DecodeError> {
        let len = self.u16(field)?;
        self.take(usize::from(len), field)
    }

    /// A UTF-8 encoded string (spec §1.5.4): valid UTF-8 (which excludes surrogates) and no
    /// U+0000.
    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let raw = self.binary(field)?;
        let s = std::str::from_utf8(&raw).map_err(|_| Malformed::InvalidUtf8(field))?;
        if s.contains('\0') {
            return Err(Malformed::NullCharacter(field).into());
        }
        Ok(s.to_owned())
    }

    /// Everything left, zero-copy.
    pub(crate) fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.buf)
    }

    /// Fails if any byte is left unread.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() { Ok(()) } else { Err(Malformed::TrailingBytes(self.buf.len()).into()) }
    }
}

/// Outcome of parsing a variable byte integer from the front of a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VarInt {
    Value {
        value: u32,
        len: usize,
    },
    /// The slice ends before the last byte of the integer.
    Incomplete,
    /// The fourth byte still has its continuation bit set.
    TooLong,
}

pub(crate) fn parse_var_int(bytes: &[u8]) -> VarInt {
    let mut value: u32 = 0;
    for i in 0..4 {
        let Some(&byte) = bytes.get(i) else {
            return VarInt::Incomplete;
        };
        value |= u32::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            return VarInt::Value { value, len: i + 1 };
        }
    }
    VarInt::TooLong
}

pub(crate) fn var_int_len(value: u32) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Destination of encoded bytes: the output buffer, or a [`Counter`].
pub(crate) trait Sink {
    fn put_slice(&mut self, bytes: &[u8]);

    fn put_u8(&mut self, value: u8) {
        self.put_slice(&[value]);
    }

    fn put_u16(&mut self, value: u16) {
        self.put_slice(&value.to_be_bytes());
    }

    fn put_u32(&mut self, value: u32) {
        self.put_slice(&value.to_be_bytes());
    }
}

impl Sink for BytesMut {
    fn put_slice(&mut self, bytes: &[u8]) {
        BufMut::put_slice(self, bytes);
    }
}

/// A sink that only counts.
#[derive(Debug, Default)]
pub(crate) struct Counter(pub(crate) usize);

impl Sink for Counter {
    fn put_slice(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

/// Length in bytes of whatever `write` produces.
pub(crate) fn measure(write: impl FnOnce(&mut Counter) -> Result<(), EncodeError>) -> Result<usize, EncodeError> {
    let mut counter = Counter::default();
    write(&mut counter)?;
    Ok(counter.0)
}

pub(crate) fn put_var_int(sink: &mut impl Sink, value: u32, field: &'static str) -> Result<(), EncodeError> {
    if value > MAX_VAR_INT {
        return Err(EncodeError::VarIntTooLarge(field));
    }
    let mut rest = value;
    loop {
        let mut byte = (rest & 0x7F) as u8;
        rest >>= 7;
        if rest > 0 {
            byte |= 0x80;
        }
        sink.put_u8(byte);
        if rest == 0 {
            return Ok(());
        }
    }
}

/// `usize` to variable byte integer, for lengths.
pub(crate) fn put_len(sink: &mut impl Sink, len: usize, field: &'static str) -> Result<(), EncodeError> {
    let value = u32::try_from(len).map_err(|_| EncodeError::VarIntTooLarge(field))?;
    put_var_int(sink, value, field)
}

pub(crate) fn put_binary(sink: &mut impl Sink, value: &[u8], field: &'static str) -> Result<(), EncodeError> {
    let len = u16::try_from(value.len()).map_err(|_| EncodeError::FieldTooLong(field))?;
    sink.put_u16(len);
    sink.put_slice(value);
    Ok(())
}

pub(crate) fn put_string(sink: &mut impl Sink, value: &str, field: &'static str) -> Result<(), EncodeError> {
    if value.contains('\0') {
        return Err(EncodeError::NullCharacter(field));
    }
    put_binary(sink, value.as_bytes(), field)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode_var_int(value: u32) -> Vec<u8> {
        let mut buf = BytesMut::new();
        put_var_int(&mut buf, value, "test").expect("in range");
        buf.to_vec()
    }

    #[test]
    fn var_int_boundaries_match_the_spec_table() {
        // Spec §1.5.5 table of one- to four-byte boundaries.
        let table: [(u32, &[u8]); 8] = [
            (0, &[0x00]),
            (127, &[0x7F]),
            (128, &[0x80, 0x01]),
            (16_383, &[0xFF, 0x7F]),
            (16_384, &[0x80, 0x80, 0x01]),
            (2_097_151, &[0xFF, 0xFF, 0x7F]),
            (2_097_152, &[0x80, 0x80, 0x80, 0x01]),
            (268_435_455, &[0xFF, 0xFF, 0xFF, 0x7F]),
        ];
        for (value, bytes) in table {
            assert_eq!(encode_var_int(value), bytes);
            assert_eq!(var_int_len(value), bytes.len());
            assert_eq!(parse_var_int(bytes), VarInt::Value { value, len: bytes.len() });
        }
    }

    #[test]
    fn var_int_with_fifth_byte_is_too_long() {
        assert_eq!(parse_var_int(&[0xFF, 0xFF, 0xFF, 0xFF, 0x01]), VarInt::TooLong);
        assert_eq!(parse_var_int(&[0xFF, 0xFF]), VarInt::Incomplete);
        assert!(put_var_int(&mut Counter::default(), MAX_VAR_INT + 1, "x").is_err());
    }

    #[test]
    fn string_with_null_or_bad_utf8_is_malformed() {
        let mut r = Reader::new(Bytes::from_static(&[0, 3, b'a', 0, b'b']));
        assert_eq!(r.string("s"), Err(Malformed::NullCharacter("s").into()));
        let mut r = Reader::new(Bytes::from_static(&[0, 2, 0xC0, 0x80]));
        assert_eq!(r.string("s"), Err(Malformed::InvalidUtf8("s").into()));
        // An encoded surrogate (U+D800) is not valid UTF-8 either.
        let mut r = Reader::new(Bytes::from_static(&[0, 3, 0xED, 0xA0, 0x80]));
        assert_eq!(r.string("s"), Err(Malformed::InvalidUtf8("s").into()));
    }

    #[test]
    fn reader_reports_truncation_instead_of_panicking() {
        let mut r = Reader::new(Bytes::from_static(&[0, 5, b'a']));
        assert_eq!(r.binary("b"), Err(Malformed::Truncated("b").into()));
        let mut r = Reader::new(Bytes::new());
        assert!(r.u32("u").is_err());
        assert!(r.var_int("v").is_err());
    }
}
