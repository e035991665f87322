//! Record batches (format v2, "magic 2") as a fetch returns them, written here rather than by
//! `kafka-protocol`'s encoder: that one takes headers as a map, so an MQTT message's repeated
//! user properties (`a=1`, `a=3`, both meaningful) would collapse into one. The layout is
//! Kafka's (`DefaultRecordBatch`); batches are uncompressed.
//!
//! ```text
//! batch  := baseOffset i64 | length i32 | partitionLeaderEpoch i32 | magic i8 = 2 | crc u32
//!           | attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64
//!           | producerId i64 | producerEpoch i16 | baseSequence i32 | count i32 | record*
//! record := length varint | attributes i8 | timestampDelta varlong | offsetDelta varint
//!           | key varint-len bytes (-1: null) | value varint-len bytes (-1: null)
//!           | headers varint count, (key varint-len, value varint-len (-1: null))*
//! ```
//! The CRC (CRC-32C) covers everything from `attributes` on; varints are zigzag.

use bytes::{BufMut, Bytes, BytesMut};

/// Batch attribute bits.
const TRANSACTIONAL: i16 = 1 << 4;
const CONTROL: i16 = 1 << 5;

/// One record of a fetched batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutRecord {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// What all records of one batch share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchMeta {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// The first record's sequence number (-1: none).
    pub base_sequence: i32,
    pub transactional: bool,
    pub control: bool,
}

impl Default for BatchMeta {
    fn default() -> Self {
        Self { producer_id: -1, producer_epoch: -1, base_sequence: -1, transactional: false, control: false }
    }
}

fn put_varint(out: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

fn put_bytes(out: &mut BytesMut, b: Option<&[u8]>) {
    match b {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, b.len() as i64);
            out.put_slice(b);
        }
    }
}

/// Appends one batch of `records` (offsets ascending, not empty) to `out`.
pub fn encode(out: &mut BytesMut, meta: BatchMeta, records: &[OutRecord]) {
    let (Some(first), Some(last)) = (records.first(), records.last()) else { return };
    encode_range(out, meta, first.offset, last.offset, records);
}

/// Appends a batch covering offsets `base_offset..=last_offset` that holds `records` (maybe
/// none, all inside the range): offsets in the range without a record are skipped by the
/// consumer, which continues after `last_offset` (as after compaction). An empty batch is
/// how a consumer is moved past records it may not see.
pub fn encode_range(out: &mut BytesMut, meta: BatchMeta, base_offset: i64, last_offset: i64, records: &[OutRecord]) {
    debug_assert!(records.iter().all(|r| (base_offset..=last_offset).contains(&r.offset)));
    let now = records.first().map_or(0, |r| r.timestamp);
    let base_ts = records.iter().map(|r| r.timestamp).min().unwrap_or(now);
    let max_ts = records.iter().map(|r| r.timestamp).max().unwrap_or(now);
    let start = out.len();
    out.put_i64(base_offset);
    out.put_i32(0); // length, filled in below
    out.put_i32(-1); // partition leader epoch
    out.put_i8(2);
    out.put_u32(0); // crc, filled in below
    let crc_from = out.len();
    let mut attributes = 0i16;
    if meta.transactional {
        attributes |= TRANSACTIONAL;
    }
    if meta.control {
        attributes |= CONTROL;
    }
    out.put_i16(attributes);
    out.put_i32((last_offset - base_offset) as i32);
    out.put_i64(base_ts);
    out.put_i64(max_ts);
    out.put_i64(meta.producer_id);
    out.put_i16(meta.producer_epoch);
    out.put_i32(meta.base_sequence);
    out.put_i32(records.len() as i32);
    let mut body = BytesMut::new();
    for r in records {
        body.clear();
        body.put_i8(0);
        put_varint(&mut body, r.timestamp - base_ts);
        put_varint(&mut body, r.offset - base_offset);
        put_bytes(&mut body, r.key.as_deref());
        put_bytes(&mut body, r.value.as_deref());
        put_varint(&mut body, r.headers.len() as i64);
        for (k, v) in &r.headers {
            put_bytes(&mut body, Some(k.as_bytes()));
            put_bytes(&mut body, v.as_deref());
        }
        put_varint(out, body.len() as i64);
        out.put_slice(&body);
    }
    let length = (out.len() - start - 12) as i32;
    out[start + 8..start + 12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&out[crc_from..]);
    out[crc_from - 4..crc_from].copy_from_slice(&crc.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use silt_kafka::kafka_protocol::records::RecordBatchDecoder;

    use super::*;

    #[test]
    fn kafkas_decoder_reads_what_we_write_repeated_headers_and_nulls_included() {
        let records = vec![
            OutRecord {
                offset: 40,
                timestamp: 1_000,
                key: Some(Bytes::from_static(b"factory/line1/temp")),
                value: Some(Bytes::from_static(b"21.5")),
                headers: vec![
                    ("a".into(), Some(Bytes::from_static(b"1"))),
                    ("b".into(), Some(Bytes::new())),
                    ("c".into(), None),
                ],
            },
            OutRecord { offset: 42, timestamp: 990, key: None, value: None, headers: Vec::new() },
        ];
        let mut out = BytesMut::new();
        let meta =
            BatchMeta { producer_id: 7, producer_epoch: 2, base_sequence: 10, transactional: true, control: false };
        encode(&mut out, meta, &records);
        let mut buf = out.freeze();
        let sets = RecordBatchDecoder::decode_all(&mut buf).expect("a valid batch, CRC included");
        let got = &sets[0].records;
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].offset, got[1].offset), (40, 42));
        assert_eq!((got[0].timestamp, got[1].timestamp), (1_000, 990));
        assert_eq!(got[0].key.as_deref(), Some(&b"factory/line1/temp"[..]));
        assert_eq!(got[1].value, None);
        assert_eq!((got[0].producer_id, got[0].producer_epoch, got[0].transactional), (7, 2, true));
        let headers: Vec<_> = got[0].headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
        assert_eq!(headers, [("a", Some(&b"1"[..])), ("b", Some(&b""[..])), ("c", None)]);
    }

    #[test]
    fn a_batch_may_cover_offsets_it_holds_no_record_of() {
        let r = OutRecord { offset: 11, timestamp: 5, key: None, value: Some(Bytes::new()), headers: Vec::new() };
        let mut out = BytesMut::new();
        encode_range(&mut out, BatchMeta::default(), 10, 19, std::slice::from_ref(&r));
        encode_range(&mut out, BatchMeta::default(), 20, 29, &[]);
        let mut buf = out.freeze();
        let mut sets = Vec::new();
        while !buf.is_empty() {
            sets.push(RecordBatchDecoder::decode(&mut buf).expect("valid batches, the empty one too"));
        }
        assert_eq!(sets[0].records.iter().map(|r| r.offset).collect::<Vec<_>>(), [11]);
        assert!(sets[1].records.is_empty());
    }

    #[test]
    fn repeated_header_names_stay_two_headers_on_the_wire() {
        let r = OutRecord {
            offset: 0,
            timestamp: 0,
            key: None,
            value: Some(Bytes::new()),
            headers: vec![("a".into(), Some(Bytes::from_static(b"1"))), ("a".into(), Some(Bytes::from_static(b"3")))],
        };
        let mut out = BytesMut::new();
        encode(&mut out, BatchMeta::default(), &[r]);
        let wire = out.freeze();
        // headers: count 2 (zigzag 4), then "a"="1", "a"="3"
        let tail = &wire[wire.len() - 9..];
        assert_eq!(tail, &[4, 2, b'a', 2, b'1', 2, b'a', 2, b'3']);
    }
}
