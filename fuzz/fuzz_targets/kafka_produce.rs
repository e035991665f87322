//! The produce path's decoders (`silt_kafka_broker`): the record batches of one partition of a
//! Produce request, as a client sent them (`decode_produced`: batch framing, CRC, bounded
//! inflation, records, headers), and the bounded decompression alone (`decompress`, every
//! codec), reached without a broker.
//!
//! Besides "never panic": no batch inflates beyond its limit and decoding holds memory in
//! proportion to the input and that limit; batches a Kafka client encodes (every codec, keys,
//! null values, headers, producer ids) decode to records that keep what was produced.
#![no_main]

#[path = "common/alloc.rs"]
mod alloc;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use silt_dataset::attrs;
use silt_kafka::kafka_protocol::protocol::StrBytes;
use silt_kafka::kafka_protocol::records::{
    Compression, NO_PRODUCER_ID, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use silt_kafka_broker::{RETAIN_HEADER, decode_produced, decompress};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// `kafka.max_message_bytes` and what a batch may inflate to, small so the limits are hit.
const MAX_MESSAGE: usize = 16 << 10;
const MAX_INFLATED: usize = 16 << 10;
/// The smallest record batch (v2): its header with no records.
const MIN_BATCH: usize = 61;
/// Memory a decode may hold per byte of input and of inflated output (a record of a few bytes
/// becomes a Kafka record and a log record of a few hundred), and beyond that.
const PER_BYTE: usize = 256;
const SLACK: usize = 1 << 20;

#[derive(Arbitrary, Debug)]
enum Input {
    /// These bytes as the records of one partition.
    Records(Vec<u8>),
    /// These bytes inflated with codec `codec` (modulo 5).
    Compressed { codec: u8, limit: u16, data: Vec<u8> },
    /// Batches as a client encodes them.
    Batches(Vec<ArbBatch>),
}

#[derive(Arbitrary, Debug)]
struct ArbBatch {
    codec: u8,
    /// Producer id, epoch and first sequence; none for a plain producer.
    producer: Option<(u32, u16, u16)>,
    transactional: bool,
    records: Vec<ArbRecord>,
}

#[derive(Arbitrary, Debug)]
struct ArbRecord {
    /// Milliseconds since the epoch, within a few decades of it.
    timestamp: u32,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

fn codec(c: u8) -> Compression {
    match c % 5 {
        0 => Compression::None,
        1 => Compression::Gzip,
        2 => Compression::Snappy,
        3 => Compression::Lz4,
        _ => Compression::Zstd,
    }
}

fuzz_target!(|input: Input| match input {
    Input::Records(bytes) => {
        let len = bytes.len();
        let raw = Bytes::from(bytes);
        let (decoded, peak) = alloc::peak(|| decode_produced("t", 0, &raw, MAX_MESSAGE, MAX_INFLATED));
        let batches = len / MIN_BATCH + 1;
        assert!(
            peak <= PER_BYTE * (len + batches * MAX_INFLATED) + SLACK,
            "decoding {len} bytes of records held {peak} bytes"
        );
        if let Ok(p) = decoded {
            assert_eq!(p.batches.iter().map(|b| b.count).sum::<usize>(), p.records.len());
            for r in &p.records {
                assert!(r.value.len() <= MAX_INFLATED && r.key.as_ref().is_none_or(|k| k.len() <= MAX_INFLATED));
            }
        }
    }
    Input::Compressed { codec: c, limit, data } => {
        let limit = usize::from(limit);
        let len = data.len();
        let (out, peak) = alloc::peak(|| decompress(&mut Bytes::from(data), codec(c), limit));
        if let Ok(out) = out {
            assert!(out.len() <= limit || codec(c) == Compression::None, "inflated {} bytes, limit {limit}", out.len());
        }
        assert!(peak <= 4 * (len + limit) + SLACK, "inflating {len} bytes (limit {limit}) held {peak} bytes");
    }
    Input::Batches(batches) => {
        let mut raw = BytesMut::new();
        let mut produced: Vec<Record> = Vec::new();
        for b in batches {
            let (producer_id, producer_epoch, first) = match b.producer {
                Some((id, epoch, seq)) => (i64::from(id), epoch as i16 & i16::MAX, i32::from(seq)),
                None => (NO_PRODUCER_ID, -1, -1),
            };
            let records: Vec<Record> = b
                .records
                .into_iter()
                .enumerate()
                .map(|(i, r)| Record {
                    transactional: b.transactional && producer_id != NO_PRODUCER_ID,
                    control: false,
                    delete_horizon: false,
                    partition_leader_epoch: 0,
                    producer_id,
                    producer_epoch,
                    timestamp_type: TimestampType::Creation,
                    offset: i as i64,
                    sequence: if first < 0 { -1 } else { first + i as i32 },
                    timestamp: i64::from(r.timestamp),
                    key: r.key.map(Bytes::from),
                    value: r.value.map(Bytes::from),
                    headers: r
                        .headers
                        .into_iter()
                        .map(|(k, v)| (StrBytes::from_string(k), v.map(Bytes::from)))
                        .collect::<Vec<_>>(),
                })
                .collect();
            if records.is_empty() {
                continue;
            }
            let options = RecordEncodeOptions { version: 2, compression: codec(b.codec) };
            RecordBatchEncoder::encode(&mut raw, &records, &options).expect("a client's batch encodes");
            produced.extend(records);
        }
        let raw = raw.freeze();
        let decoded = match decode_produced("t", 3, &raw, 1 << 30, 1 << 30) {
            Ok(d) => d,
            Err(e) => panic!("a batch a client encodes does not decode: {e}"),
        };
        assert_eq!(decoded.records.len(), produced.len());
        for (got, want) in decoded.records.iter().zip(&produced) {
            assert_eq!((&got.stream[..], got.partition.get()), ("t", 3));
            assert_eq!(got.timestamp.get(), want.timestamp);
            assert_eq!(got.key, want.key);
            assert_eq!(got.value, want.value.clone().unwrap_or_default());
            assert_eq!(got.attrs & attrs::NULL_VALUE != 0, want.value.is_none());
            assert_eq!(got.attrs & attrs::TRANSACTIONAL != 0, want.transactional);
            let retain = want
                .headers
                .iter()
                .any(|(k, v)| k.as_str() == RETAIN_HEADER && matches!(v.as_deref(), Some(b"true" | b"1")));
            assert_eq!(got.attrs & attrs::RETAIN != 0, retain);
            let headers: Vec<(String, Bytes)> = want
                .headers
                .iter()
                .filter(|(k, _)| k.as_str() != RETAIN_HEADER)
                .map(|(k, v)| (k.to_string(), v.clone().unwrap_or_default()))
                .collect();
            assert_eq!(got.headers, headers);
            match got.producer {
                Some(p) => {
                    assert_eq!((p.id, p.epoch, p.sequence), (want.producer_id, want.producer_epoch, want.sequence))
                }
                None => assert_eq!(want.producer_id, NO_PRODUCER_ID),
            }
        }
    }
});
