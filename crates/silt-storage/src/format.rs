//! The commitlog's on-disk format, version 1. Pure encoding and decoding: no I/O.
//!
//! Both readers of the log shape it: Kafka fetch wants a partition's records with key, value,
//! headers and timestamp; MQTT delivery wants the topic, payload and properties. A record keeps
//! all of them, self-contained, so a consume-queue entry can point at one record and a reader
//! decodes it alone, slicing key, value and header values out of the buffer without copying.
//!
//! ```text
//! segment file := header batch*
//! header       := magic "SILTLOG\0" (8) | version u16 = 1 | reserved (6 zero bytes)
//! batch        := len u32 | crc u32 | body            (crc = CRC32C of body, len = |body|)
//! body         := version u8 = 1 | attributes u8 (bit 0: GAP) | reserved u16 = 0 | count u32
//!                 | record*count
//! record       := len u32 (whole record, this field included)
//!                 | flags u8 (bit 0: control record, bit 1: withheld, bit 2: volatile,
//!                   bit 3: producer)
//!                 | reserved u8 | attrs u16
//!                 | timestamp i64 (ms since epoch) | partition u32
//!                 | stream: u16 len, UTF-8 | topic: u16 len, UTF-8 (empty: none)
//!                 | key: u32 len (0xFFFF_FFFF: null), bytes | value: u32 len, bytes
//!                 | headers: u16 count, (name: u16 len UTF-8, value: u32 len (0xFFFF_FFFF: null), bytes)*count
//!                 | [producer: id i64 | epoch i16 | sequence i32]   (flag bit 3 only)
//! ```
//!
//! A null header value (a Kafka header may have one) came after the first files of version 1
//! were written; no earlier record can hold a 4 GiB header value, so every earlier file reads
//! the same, while a binary from before it refuses a record with a null header value as
//! truncated.
//!
//! The *producer* trailer is a Kafka producer's identity and sequence number for the record
//! (idempotent and transactional producers), which a fetch hands back in the record's batch.
//!
//! A *withheld* record is a copy whose key, value and headers were replaced by zeros of the same
//! total length (`value` holds them; no headers): the object-store copy of a record whose topic
//! is kept off the store (`tier = "local"`). Positions, lengths and queue offsets stay those of
//! the original; readers treat it as data that is gone.
//!
//! A *volatile* record belongs to a `tier = "memory"` topic: it lives for the life of the
//! process that wrote it. Its append is acknowledged without waiting for an fsync, its
//! object-store copy is withheld, and after a restart readers treat it as gone.
//!
//! A *gap* batch (attribute bit 0 set, count 0) stands where a batch's original bytes failed
//! their checks and were quarantined (copied aside, see the `repair` module): its body is
//! padding and holds no records. It keeps the log walkable and every position after it where it
//! was, so readers, dispatch and uploads treat it as a valid batch without records. A bad range
//! longer than the largest batch is covered by several gap batches back to back ([`gap_sizes`]).
//!
//! All integers are little-endian. A batch is the unit of atomicity and of the CRC: recovery
//! keeps whole batches only. `attrs` belongs to the protocol layer (MQTT QoS, retain, payload
//! format) and is opaque here. Decoding never trusts a length: every length is checked against
//! the bytes present before anything is sliced or allocated.

use bytes::{BufMut, Bytes};
use silt_types::{Partition, Timestamp};

/// Magic bytes at the start of every segment file.
pub const SEGMENT_MAGIC: &[u8; 8] = b"SILTLOG\0";
/// Current segment and batch format version.
pub const FORMAT_VERSION: u16 = 1;
/// Size of the segment file header; the first batch of a segment starts here.
pub const SEGMENT_HEADER_LEN: u64 = 16;
/// Size of a batch's frame (len + crc).
pub const FRAME_LEN: usize = 8;
/// Size of a batch body's header (version, attributes, reserved, count).
pub const BODY_HEADER_LEN: usize = 8;
/// Smallest possible batch frame: frame header and body header, no records.
pub const MIN_FRAME_LEN: usize = FRAME_LEN + BODY_HEADER_LEN;
/// Body attribute: the batch is a gap (see the module documentation).
pub const ATTR_GAP: u8 = 0x01;
/// Fixed part of a record before its variable fields.
const RECORD_FIXED_LEN: usize = 4 + 1 + 1 + 2 + 8 + 4;

const FLAG_CONTROL: u8 = 1;
const FLAG_WITHHELD: u8 = 2;
const FLAG_VOLATILE: u8 = 4;
const FLAG_PRODUCER: u8 = 8;
/// Bytes of the producer trailer.
const PRODUCER_LEN: usize = 8 + 2 + 4;
/// The length that stands for a null key or a null header value.
const NULL_LEN: u32 = u32::MAX;

/// Why bytes are not a valid batch or record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("need {needed} bytes, have {have}")]
    Truncated { needed: usize, have: usize },
    #[error("batch length {0} exceeds the maximum")]
    TooLarge(u64),
    #[error("CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
    #[error("unknown format version {0}")]
    Version(u16),
    #[error("malformed record: {0}")]
    Malformed(&'static str),
    #[error("bad segment header")]
    SegmentHeader,
}

/// One message as stored in the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub timestamp: Timestamp,
    /// The stream (Kafka topic) the record belongs to; empty when it belongs to none.
    pub stream: String,
    pub partition: Partition,
    /// The MQTT topic name; empty when the record has none.
    pub topic: String,
    pub key: Option<Bytes>,
    pub value: Bytes,
    /// Header names and values; a Kafka header's value may be null (`None`).
    pub headers: Vec<(String, Option<Bytes>)>,
    /// Protocol attributes (MQTT QoS, retain, payload format), opaque to storage.
    pub attrs: u16,
    /// The log's internal records (queue registrations). Never set by callers: `append`
    /// refuses such records; readers of a queue never see them.
    pub control: bool,
    /// A stand-in for a record whose content was kept off the object store (see the module
    /// documentation). Never set by callers.
    pub withheld: bool,
    /// Lives only as long as the process that appended it (a `tier = "memory"` topic; see the
    /// module documentation).
    pub volatile: bool,
    /// The Kafka producer that wrote it, with the record's sequence number (idempotent and
    /// transactional producers only).
    pub producer: Option<Producer>,
}

/// A Kafka producer's identity and a record's sequence number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Producer {
    pub id: i64,
    pub epoch: i16,
    pub sequence: i32,
}

impl Record {
    /// Encoded size of this record.
    pub fn encoded_len(&self) -> usize {
        RECORD_FIXED_LEN
            + 2
            + self.stream.len()
            + 2
            + self.topic.len()
            + 4
            + self.key.as_ref().map_or(0, Bytes::len)
            + 4
            + self.value.len()
            + 2
            + self.headers.iter().map(|(k, v)| 2 + k.len() + 4 + v.as_ref().map_or(0, Bytes::len)).sum::<usize>()
            + if self.producer.is_some() { PRODUCER_LEN } else { 0 }
    }

    /// Checks the lengths the format can represent.
    pub fn validate(&self) -> Result<(), FormatError> {
        let short = |s: &str| s.len() <= u16::MAX as usize;
        if !short(&self.stream) || !short(&self.topic) {
            return Err(FormatError::Malformed("stream or topic longer than 65535 bytes"));
        }
        if self.headers.len() > u16::MAX as usize || !self.headers.iter().all(|(k, _)| short(k)) {
            return Err(FormatError::Malformed("too many headers or header name too long"));
        }
        if self.key.as_ref().is_some_and(|k| k.len() >= NULL_LEN as usize)
            || self.value.len() > u32::MAX as usize
            || self.headers.iter().any(|(_, v)| v.as_ref().is_some_and(|v| v.len() >= NULL_LEN as usize))
        {
            return Err(FormatError::Malformed("field longer than 4 GiB"));
        }
        Ok(())
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        let len = self.encoded_len();
        out.reserve(len);
        out.put_u32_le(len as u32);
        out.put_u8(
            if self.control { FLAG_CONTROL } else { 0 }
                | if self.withheld { FLAG_WITHHELD } else { 0 }
                | if self.volatile { FLAG_VOLATILE } else { 0 }
                | if self.producer.is_some() { FLAG_PRODUCER } else { 0 },
        );
        out.put_u8(0);
        out.put_u16_le(self.attrs);
        out.put_i64_le(self.timestamp.get());
        out.put_u32_le(self.partition.get());
        out.put_u16_le(self.stream.len() as u16);
        out.put_slice(self.stream.as_bytes());
        out.put_u16_le(self.topic.len() as u16);
        out.put_slice(self.topic.as_bytes());
        match &self.key {
            Some(k) => {
                out.put_u32_le(k.len() as u32);
                out.put_slice(k);
            }
            None => out.put_u32_le(NULL_LEN),
        }
        out.put_u32_le(self.value.len() as u32);
        out.put_slice(&self.value);
        out.put_u16_le(self.headers.len() as u16);
        for (k, v) in &self.headers {
            out.put_u16_le(k.len() as u16);
            out.put_slice(k.as_bytes());
            match v {
                Some(v) => {
                    out.put_u32_le(v.len() as u32);
                    out.put_slice(v);
                }
                None => out.put_u32_le(NULL_LEN),
            }
        }
        if let Some(p) = &self.producer {
            out.put_i64_le(p.id);
            out.put_i16_le(p.epoch);
            out.put_i32_le(p.sequence);
        }
    }

    /// Decodes one record from `buf`, which must hold exactly that record. Key, value and
    /// header values are slices of `buf`.
    pub fn decode(buf: &Bytes) -> Result<Record, FormatError> {
        let mut r = Reader { buf, pos: 0 };
        let len = r.u32()? as usize;
        if len != buf.len() {
            return Err(FormatError::Malformed("record length does not match its frame"));
        }
        let flags = r.u8()?;
        r.u8()?;
        let attrs = r.u16()?;
        let timestamp = Timestamp(r.u64()? as i64);
        let partition = Partition(r.u32()?);
        let stream = r.string16()?;
        let topic = r.string16()?;
        let key_len = r.u32()?;
        let key = if key_len == NULL_LEN { None } else { Some(r.bytes(key_len as usize)?) };
        let value_len = r.u32()? as usize;
        let value = r.bytes(value_len)?;
        let header_count = r.u16()?;
        let mut headers = Vec::with_capacity(usize::from(header_count).min(buf.len() / 6));
        for _ in 0..header_count {
            let name = r.string16()?;
            let vlen = r.u32()?;
            headers.push((name, if vlen == NULL_LEN { None } else { Some(r.bytes(vlen as usize)?) }));
        }
        let producer = if flags & FLAG_PRODUCER != 0 {
            Some(Producer { id: r.u64()? as i64, epoch: r.u16()? as i16, sequence: r.u32()? as i32 })
        } else {
            None
        };
        if r.pos != buf.len() {
            return Err(FormatError::Malformed("trailing bytes after record"));
        }
        Ok(Record {
            timestamp,
            stream,
            partition,
            topic,
            key,
            value,
            headers,
            attrs,
            control: flags & FLAG_CONTROL != 0,
            withheld: flags & FLAG_WITHHELD != 0,
            volatile: flags & FLAG_VOLATILE != 0,
            producer,
        })
    }

    /// The withheld stand-in of this record: same stream, topic, partition, timestamp and
    /// encoded length; key, value and headers replaced by zeros.
    pub fn withhold(&self) -> Record {
        let content =
            self.encoded_len() - (RECORD_FIXED_LEN + 2 + self.stream.len() + 2 + self.topic.len() + 4 + 4 + 2);
        Record {
            timestamp: self.timestamp,
            stream: self.stream.clone(),
            partition: self.partition,
            topic: self.topic.clone(),
            key: None,
            value: Bytes::from(vec![0u8; content]),
            headers: Vec::new(),
            attrs: self.attrs,
            control: self.control,
            withheld: true,
            volatile: self.volatile,
            producer: None,
        }
    }

    /// True for the log's internal records, which readers of a queue never see.
    pub fn is_control(&self) -> bool {
        self.control
    }
}

/// The fields dispatch needs, read without allocating or slicing the payload.
#[derive(Debug)]
pub struct RecordHead<'a> {
    pub control: bool,
    /// A `tier = "memory"` record.
    pub volatile: bool,
    pub timestamp: Timestamp,
    pub partition: Partition,
    pub stream: &'a str,
    pub topic: &'a str,
    /// The value, for control records.
    pub value: &'a [u8],
}

impl<'a> RecordHead<'a> {
    /// Decodes the head of one record occupying all of `buf`.
    pub fn decode(buf: &'a [u8]) -> Result<RecordHead<'a>, FormatError> {
        let mut pos = 0usize;
        let mut take = |n: usize| -> Result<&'a [u8], FormatError> {
            let have = buf.len() - pos;
            if n > have {
                return Err(FormatError::Truncated { needed: n, have });
            }
            pos += n;
            Ok(&buf[pos - n..pos])
        };
        let le16 = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]) as usize;
        let le32 = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let fixed = take(RECORD_FIXED_LEN)?;
        if le32(&fixed[..4]) as usize != buf.len() {
            return Err(FormatError::Malformed("record length does not match its frame"));
        }
        let control = fixed[4] & FLAG_CONTROL != 0;
        let volatile = fixed[4] & FLAG_VOLATILE != 0;
        let timestamp = Timestamp(i64::from_le_bytes(fixed[8..16].try_into().expect("invariant: 8 bytes")));
        let partition = Partition(le32(&fixed[16..20]));
        let utf8 = |b: &'a [u8]| std::str::from_utf8(b).map_err(|_| FormatError::Malformed("string is not UTF-8"));
        let n = le16(take(2)?);
        let stream = utf8(take(n)?)?;
        let n = le16(take(2)?);
        let topic = utf8(take(n)?)?;
        let key_len = le32(take(4)?);
        if key_len != NULL_LEN {
            take(key_len as usize)?;
        }
        let n = le32(take(4)?) as usize;
        let value = take(n)?;
        Ok(RecordHead { control, volatile, timestamp, partition, stream, topic, value })
    }
}

struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<std::ops::Range<usize>, FormatError> {
        let have = self.buf.len() - self.pos;
        if n > have {
            return Err(FormatError::Truncated { needed: n, have });
        }
        let r = self.pos..self.pos + n;
        self.pos += n;
        Ok(r)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let r = self.take(N)?;
        Ok(self.buf[r].try_into().expect("invariant: range has length N"))
    }
    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn bytes(&mut self, n: usize) -> Result<Bytes, FormatError> {
        let r = self.take(n)?;
        Ok(self.buf.slice(r))
    }
    fn string16(&mut self) -> Result<String, FormatError> {
        let n = self.u16()? as usize;
        let r = self.take(n)?;
        std::str::from_utf8(&self.buf[r]).map(str::to_owned).map_err(|_| FormatError::Malformed("string is not UTF-8"))
    }
}

/// A batch encoded and checksummed by the appending thread, ready for the writer to place.
#[derive(Debug)]
pub struct EncodedBatch {
    /// The whole frame: len, crc, body.
    pub frame: Vec<u8>,
    /// Offset of each record from the start of the frame, and its length.
    pub records: Vec<(u32, u32)>,
}

/// Encodes `records` as one framed batch. Fails when a record cannot be represented or the
/// batch exceeds `max_batch_bytes`.
pub fn encode_batch(records: &[Record], max_batch_bytes: usize) -> Result<EncodedBatch, FormatError> {
    let mut body_len = BODY_HEADER_LEN;
    for r in records {
        r.validate()?;
        body_len += r.encoded_len();
    }
    if body_len > max_batch_bytes || records.len() > u32::MAX as usize {
        return Err(FormatError::TooLarge(body_len as u64));
    }
    let mut frame = Vec::with_capacity(FRAME_LEN + body_len);
    frame.put_u32_le(body_len as u32);
    frame.put_u32_le(0); // CRC, filled in below
    frame.put_u8(FORMAT_VERSION as u8);
    frame.put_u8(0);
    frame.put_u16_le(0);
    frame.put_u32_le(records.len() as u32);
    let mut offsets = Vec::with_capacity(records.len());
    for r in records {
        let start = frame.len();
        r.encode_into(&mut frame);
        offsets.push((start as u32, (frame.len() - start) as u32));
    }
    let crc = crc32c::crc32c(&frame[FRAME_LEN..]);
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(EncodedBatch { frame, records: offsets })
}

/// What the frame header at the start of `buf` says, without checking the body.
/// `Ok(None)` means `buf` is too short to hold a frame header.
pub fn peek_frame(buf: &[u8], max_batch_bytes: usize) -> Result<Option<usize>, FormatError> {
    if buf.len() < FRAME_LEN {
        return Ok(None);
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().expect("invariant: 4 bytes")) as usize;
    if len < BODY_HEADER_LEN || len > max_batch_bytes {
        return Err(FormatError::TooLarge(len as u64));
    }
    Ok(Some(FRAME_LEN + len))
}

/// A checked batch: the records it holds, as (offset in frame, length) pairs.
#[derive(Debug)]
pub struct BatchView {
    pub frame: Bytes,
    pub records: Vec<(u32, u32)>,
    /// A gap batch: padding where quarantined bytes were, no records.
    pub gap: bool,
}

impl BatchView {
    /// Decodes the record at index `i`.
    pub fn record(&self, i: usize) -> Result<Record, FormatError> {
        let (off, len) = self.records[i];
        Record::decode(&self.frame.slice(off as usize..(off + len) as usize))
    }
}

/// What a checked frame holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A batch of this many records.
    Records(u32),
    /// A gap batch.
    Gap,
}

/// Verifies a whole frame (length, CRC, version, attributes, record framing) without
/// allocating.
pub fn check_frame(frame: &[u8], max_batch_bytes: usize) -> Result<FrameKind, FormatError> {
    walk_frame(frame, max_batch_bytes, |_, _| {})
}

fn walk_frame(
    frame: &[u8],
    max_batch_bytes: usize,
    mut record: impl FnMut(u32, u32),
) -> Result<FrameKind, FormatError> {
    let total = match peek_frame(frame, max_batch_bytes)? {
        Some(n) => n,
        None => return Err(FormatError::Truncated { needed: FRAME_LEN, have: frame.len() }),
    };
    if frame.len() != total {
        return Err(FormatError::Truncated { needed: total, have: frame.len() });
    }
    let stored = u32::from_le_bytes(frame[4..8].try_into().expect("invariant: 4 bytes"));
    let computed = crc32c::crc32c(&frame[FRAME_LEN..]);
    if stored != computed {
        return Err(FormatError::Crc { stored, computed });
    }
    let body = &frame[FRAME_LEN..];
    let version = u16::from(body[0]);
    if version != FORMAT_VERSION {
        return Err(FormatError::Version(version));
    }
    if body[1] & !ATTR_GAP != 0 || body[2..4] != [0, 0] {
        return Err(FormatError::Malformed("unknown batch attributes"));
    }
    let count = u32::from_le_bytes(body[4..8].try_into().expect("invariant: 4 bytes"));
    if body[1] & ATTR_GAP != 0 {
        if count != 0 {
            return Err(FormatError::Malformed("a gap batch with records"));
        }
        return Ok(FrameKind::Gap);
    }
    let mut pos = FRAME_LEN + BODY_HEADER_LEN;
    for _ in 0..count {
        if frame.len() - pos < 4 {
            return Err(FormatError::Malformed("record count exceeds batch"));
        }
        let len = u32::from_le_bytes(frame[pos..pos + 4].try_into().expect("invariant: 4 bytes")) as usize;
        if len < RECORD_FIXED_LEN || len > frame.len() - pos {
            return Err(FormatError::Malformed("record length out of bounds"));
        }
        record(pos as u32, len as u32);
        pos += len;
    }
    if pos != frame.len() {
        return Err(FormatError::Malformed("bytes after the last record"));
    }
    Ok(FrameKind::Records(count))
}

/// Verifies a whole frame (see [`check_frame`]) and indexes its records.
pub fn check_batch(frame: Bytes, max_batch_bytes: usize) -> Result<BatchView, FormatError> {
    let mut records = Vec::new();
    let kind = walk_frame(&frame, max_batch_bytes, |off, len| records.push((off, len)))?;
    Ok(BatchView { frame, records, gap: kind == FrameKind::Gap })
}

/// Gap batches covering exactly `total_len` bytes, each no longer than a batch may be
/// (`max_batch_bytes` of body, at least 1024 as the storage settings require), written back to
/// back. `None` when `total_len` is shorter than [`MIN_FRAME_LEN`] (no frame is that short).
pub fn gap_sizes(total_len: u64, max_batch_bytes: usize) -> Option<Vec<u64>> {
    let min = MIN_FRAME_LEN as u64;
    let max = (max_batch_bytes.max(BODY_HEADER_LEN) + FRAME_LEN) as u64;
    if total_len < min {
        return None;
    }
    let mut sizes = Vec::new();
    let mut left = total_len;
    while left > max {
        // Never leave a remainder too short to be a frame of its own.
        let take = if left - max < min { left - min } else { max };
        sizes.push(take);
        left -= take;
    }
    sizes.push(left);
    Some(sizes)
}

/// One gap batch of exactly `total_len` bytes (at least [`MIN_FRAME_LEN`]): a valid frame whose
/// CRC covers its zero padding.
pub fn encode_gap(total_len: usize) -> Vec<u8> {
    assert!(total_len >= MIN_FRAME_LEN, "invariant: a gap batch holds at least its headers");
    let mut frame = vec![0u8; total_len];
    frame[0..4].copy_from_slice(&((total_len - FRAME_LEN) as u32).to_le_bytes());
    frame[FRAME_LEN] = FORMAT_VERSION as u8;
    frame[FRAME_LEN + 1] = ATTR_GAP;
    let crc = crc32c::crc32c(&frame[FRAME_LEN..]);
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
    frame
}

/// Whether `head` (the bytes at some offset, at least [`MIN_FRAME_LEN`] of them, or fewer at
/// the end of the data) could start a batch with `room` bytes left before the end: the cheap
/// header filter a resync applies before it checks a CRC. Returns the frame's total length.
pub fn frame_candidate(head: &[u8], max_batch_bytes: usize, room: u64) -> Option<usize> {
    if head.len() < MIN_FRAME_LEN {
        return None;
    }
    let body = &head[FRAME_LEN..];
    if u16::from(body[0]) != FORMAT_VERSION || body[1] & !ATTR_GAP != 0 || body[2..4] != [0, 0] {
        return None;
    }
    let len = u32::from_le_bytes(head[0..4].try_into().expect("invariant: 4 bytes")) as usize;
    if len < BODY_HEADER_LEN || len > max_batch_bytes || (FRAME_LEN + len) as u64 > room {
        return None;
    }
    let count = u32::from_le_bytes(body[4..8].try_into().expect("invariant: 4 bytes")) as usize;
    if body[1] & ATTR_GAP != 0 {
        return (count == 0).then_some(FRAME_LEN + len);
    }
    if count > (len - BODY_HEADER_LEN) / RECORD_FIXED_LEN {
        return None;
    }
    if count > 0 && head.len() >= MIN_FRAME_LEN + 4 {
        let first = u32::from_le_bytes(head[MIN_FRAME_LEN..MIN_FRAME_LEN + 4].try_into().expect("invariant: 4 bytes"));
        if (first as usize) < RECORD_FIXED_LEN || first as usize > len - BODY_HEADER_LEN {
            return None;
        }
    }
    if count == 0 && len != BODY_HEADER_LEN {
        return None;
    }
    Some(FRAME_LEN + len)
}

/// The 16-byte header every segment file starts with.
pub fn segment_header() -> [u8; SEGMENT_HEADER_LEN as usize] {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    h[..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h
}

/// Checks a segment file header.
pub fn check_segment_header(h: &[u8]) -> Result<(), FormatError> {
    if h.len() < SEGMENT_HEADER_LEN as usize || &h[..8] != SEGMENT_MAGIC {
        return Err(FormatError::SegmentHeader);
    }
    let v = u16::from_le_bytes([h[8], h[9]]);
    if v != FORMAT_VERSION {
        return Err(FormatError::Version(v));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn arb_record() -> impl Strategy<Value = Record> {
        (
            any::<i64>(),
            "[a-z]{0,8}",
            any::<u32>(),
            "[a-z/+]{0,12}",
            prop::option::of(prop::collection::vec(any::<u8>(), 0..16)),
            prop::collection::vec(any::<u8>(), 0..256),
            prop::collection::vec(("[a-z]{0,6}", prop::option::of(prop::collection::vec(any::<u8>(), 0..8))), 0..4),
            any::<u16>(),
            any::<bool>(),
            prop::option::of((any::<i64>(), any::<i16>(), any::<i32>())),
        )
            .prop_map(|(ts, stream, p, topic, key, value, headers, attrs, volatile, producer)| Record {
                timestamp: Timestamp(ts),
                stream,
                partition: Partition(p),
                topic,
                key: key.map(Bytes::from),
                value: Bytes::from(value),
                headers: headers.into_iter().map(|(k, v)| (k, v.map(Bytes::from))).collect(),
                attrs,
                control: false,
                withheld: false,
                volatile,
                producer: producer.map(|(id, epoch, sequence)| Producer { id, epoch, sequence }),
            })
    }

    proptest! {
        #[test]
        fn a_withheld_record_keeps_the_length_and_queue_fields_and_drops_the_content(r in arb_record()) {
            let w = r.withhold();
            prop_assert_eq!(w.encoded_len(), r.encoded_len());
            let enc = encode_batch(std::slice::from_ref(&w), 1 << 24).unwrap();
            let back = check_batch(Bytes::from(enc.frame), 1 << 24).unwrap().record(0).unwrap();
            prop_assert!(back.withheld);
            prop_assert_eq!((&back.stream, back.partition, &back.topic, back.timestamp), (&r.stream, r.partition, &r.topic, r.timestamp));
            prop_assert!(back.key.is_none() && back.headers.is_empty() && back.value.iter().all(|b| *b == 0));
        }

        #[test]
        fn batch_round_trips(records in prop::collection::vec(arb_record(), 0..20)) {
            let enc = encode_batch(&records, 1 << 24).unwrap();
            let view = check_batch(Bytes::from(enc.frame), 1 << 24).unwrap();
            prop_assert_eq!(&view.records, &enc.records);
            for (i, r) in records.iter().enumerate() {
                prop_assert_eq!(&view.record(i).unwrap(), r);
            }
        }

        #[test]
        fn decoding_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let b = Bytes::from(bytes);
            let _ = check_batch(b.clone(), 1 << 20);
            let _ = Record::decode(&b);
        }

        #[test]
        fn any_flipped_bit_is_detected(
            records in prop::collection::vec(arb_record(), 1..5),
            at in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let mut frame = encode_batch(&records, 1 << 24).unwrap().frame;
            let i = at.index(frame.len());
            frame[i] ^= 1 << bit;
            prop_assert!(check_batch(Bytes::from(frame), 1 << 24).is_err());
        }
    }

    proptest! {
        #[test]
        fn a_gap_batch_round_trips_as_a_valid_batch_without_records(len in MIN_FRAME_LEN..70_000usize) {
            let frame = encode_gap(len);
            prop_assert_eq!(frame.len(), len);
            prop_assert_eq!(check_frame(&frame, 1 << 20), Ok(FrameKind::Gap));
            prop_assert_eq!(frame_candidate(&frame, 1 << 20, len as u64), Some(len));
            let view = check_batch(Bytes::from(frame), 1 << 20).unwrap();
            prop_assert!(view.gap && view.records.is_empty());
        }

        #[test]
        fn gap_sizes_cover_the_range_with_valid_frames(total in 0u64..200_000, max in 1024usize..5000) {
            match gap_sizes(total, max) {
                None => prop_assert!(total < MIN_FRAME_LEN as u64),
                Some(sizes) => {
                    prop_assert_eq!(sizes.iter().sum::<u64>(), total);
                    for s in sizes {
                        prop_assert!(s >= MIN_FRAME_LEN as u64 && s <= (max + FRAME_LEN) as u64);
                        prop_assert_eq!(check_frame(&encode_gap(s as usize), max), Ok(FrameKind::Gap));
                    }
                }
            }
        }

        #[test]
        fn every_valid_batch_passes_the_resync_filter(records in prop::collection::vec(arb_record(), 0..6)) {
            let frame = encode_batch(&records, 1 << 24).unwrap().frame;
            prop_assert_eq!(frame_candidate(&frame, 1 << 24, frame.len() as u64), Some(frame.len()));
        }

        #[test]
        fn any_flipped_bit_in_a_gap_batch_is_detected(len in MIN_FRAME_LEN..2000usize, at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let mut frame = encode_gap(len);
            let i = at.index(frame.len());
            frame[i] ^= 1 << bit;
            prop_assert!(check_frame(&frame, 1 << 20).is_err());
        }
    }

    #[test]
    fn unknown_attributes_are_refused() {
        let mut frame = encode_batch(&[Record::default()], 1 << 20).unwrap().frame;
        frame[FRAME_LEN + 1] = 0x02;
        let crc = crc32c::crc32c(&frame[FRAME_LEN..]);
        frame[4..8].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(check_frame(&frame, 1 << 20), Err(FormatError::Malformed(_))));
    }

    #[test]
    fn head_agrees_with_full_decode() {
        let r = Record {
            timestamp: Timestamp(42),
            stream: "s".into(),
            partition: Partition(3),
            topic: "a/b".into(),
            key: Some(Bytes::from_static(b"k")),
            value: Bytes::from_static(b"v"),
            headers: vec![("h".into(), Some(Bytes::from_static(b"x"))), ("n".into(), None)],
            attrs: 7,
            control: true,
            withheld: false,
            volatile: true,
            producer: Some(Producer { id: 9, epoch: 1, sequence: 5 }),
        };
        let enc = encode_batch(std::slice::from_ref(&r), 1 << 20).unwrap();
        let (off, len) = enc.records[0];
        let h = RecordHead::decode(&enc.frame[off as usize..(off + len) as usize]).unwrap();
        assert!(h.control && h.volatile);
        assert_eq!(
            (h.timestamp, h.partition, h.stream, h.topic, h.value),
            (r.timestamp, r.partition, "s", "a/b", &b"v"[..])
        );
    }

    #[test]
    fn oversized_batch_is_refused() {
        let r = Record { value: Bytes::from(vec![0; 100]), ..Record::default() };
        assert!(matches!(encode_batch(&[r], 64), Err(FormatError::TooLarge(_))));
    }
}
