//! Kafka records and the log's records, both ways (DESIGN.md point 6, `silt_dataset::rule`):
//!
//! - produced: the stream is the Kafka topic, the partition the producer's; the MQTT topic is
//!   the one the key names under the stream (else the stream's own), so MQTT subscribers get
//!   the record at QoS 1 with its headers as user properties. A header `mqtt.retain` of `true`
//!   or `1` asks for the record to be retained for MQTT (the header itself is not kept). Key,
//!   value (a null value is kept as null), headers and timestamp are kept as produced; an
//!   idempotent or transactional producer's id, epoch and sequence go with each record.
//! - fetched: records come back with their offsets, in batches of consecutive records that
//!   share a producer (a batch names one), as the consumer would have seen them from Kafka.
//!
//! Not kept: header names repeated within one produced record (the decoder keeps the last),
//! and the timestamp type (LogAppendTime batches get the broker's time as CreateTime).

use bytes::Bytes;
use silt_dataset::{attrs, rule};
use silt_kafka::kafka_protocol::records::{Compression, NO_PRODUCER_ID, RecordBatchDecoder, TimestampType};
use silt_storage::{Producer, Record};
use silt_types::{Partition, Timestamp};

use crate::batch::{BatchMeta, OutRecord};
use crate::inflate;

/// The header with which a Kafka producer asks for MQTT retention.
pub const RETAIN_HEADER: &str = "mqtt.retain";

/// Why a produced batch is refused (each maps to a Kafka error code in `apis::produce`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProduceError {
    #[error("the records do not decode: {0}")]
    Corrupt(String),
    #[error("a batch of {size} bytes exceeds the limit of {max} (kafka.max_message_bytes)")]
    TooLarge { size: usize, max: usize },
    #[error("clients may not produce control batches")]
    Control,
}

/// What one produced batch says about its producer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducedBatch {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub count: usize,
    pub transactional: bool,
}

/// The records of one partition of a produce request.
#[derive(Debug, Default)]
pub struct Produced {
    pub records: Vec<Record>,
    pub batches: Vec<ProducedBatch>,
}

/// Decodes the raw batches a producer sent for `stream`/`partition` into log records.
/// `max_message` bounds each batch as sent, `max_inflated` what it inflates to.
pub fn decode(
    stream: &str,
    partition: u32,
    raw: &Bytes,
    max_message: usize,
    max_inflated: usize,
) -> Result<Produced, ProduceError> {
    let mut buf = raw.clone();
    let mut out = Produced::default();
    let now = Timestamp::now();
    while !buf.is_empty() {
        // The batch's own length (bytes 8..12) says how large it is before it is decoded.
        let size = batch_size(&buf).ok_or_else(|| ProduceError::Corrupt("truncated batch header".into()))?;
        if size > buf.len() {
            return Err(ProduceError::Corrupt(format!("a batch of {size} bytes in {} bytes of records", buf.len())));
        }
        if size > max_message {
            return Err(ProduceError::TooLarge { size, max: max_message });
        }
        let decompress = |b: &mut Bytes, c: Compression| inflate::decompress(b, c, max_inflated);
        let set = RecordBatchDecoder::decode_with_custom_compression(&mut buf, Some(decompress))
            .map_err(|e| ProduceError::Corrupt(e.to_string()))?;
        let Some(first) = set.records.first() else { continue };
        if first.control {
            return Err(ProduceError::Control);
        }
        out.batches.push(ProducedBatch {
            producer_id: first.producer_id,
            producer_epoch: first.producer_epoch,
            base_sequence: first.sequence,
            count: set.records.len(),
            transactional: first.transactional,
        });
        for r in set.records {
            let mut a = attrs::QOS_MASK & 1;
            let mut headers = Vec::with_capacity(r.headers.len());
            for (k, v) in r.headers {
                if k.as_str() == RETAIN_HEADER {
                    if matches!(v.as_deref(), Some(b"true" | b"1")) {
                        a |= attrs::RETAIN;
                    }
                    continue;
                }
                headers.push((k.to_string(), v));
            }
            if r.value.is_none() {
                a |= attrs::NULL_VALUE;
            }
            if r.transactional {
                a |= attrs::TRANSACTIONAL;
            }
            let timestamp = match r.timestamp_type {
                TimestampType::Creation if r.timestamp >= 0 => Timestamp(r.timestamp),
                _ => now,
            };
            out.records.push(Record {
                timestamp,
                stream: stream.to_owned(),
                partition: Partition(partition),
                topic: rule::mqtt_topic_for(stream, r.key.as_deref()),
                key: r.key,
                value: r.value.unwrap_or_default(),
                headers,
                attrs: a,
                producer: (r.producer_id != NO_PRODUCER_ID).then_some(Producer {
                    id: r.producer_id,
                    epoch: r.producer_epoch,
                    sequence: r.sequence,
                }),
                ..Record::default()
            });
        }
    }
    Ok(out)
}

/// The whole size of the batch at the front of `buf` (its length field plus the 12 bytes
/// before it), if the header is there.
fn batch_size(buf: &[u8]) -> Option<usize> {
    let len = i32::from_be_bytes(buf.get(8..12)?.try_into().ok()?);
    usize::try_from(len).ok().map(|l| l + 12)
}

/// A record as a fetch returns it at `offset`, with what its batch must say.
pub fn fetched(offset: u64, r: Record) -> (BatchMeta, OutRecord) {
    let meta = match r.producer {
        Some(p) => BatchMeta {
            producer_id: p.id,
            producer_epoch: p.epoch,
            base_sequence: p.sequence,
            transactional: r.attrs & attrs::TRANSACTIONAL != 0,
            control: r.attrs & attrs::KAFKA_CONTROL != 0,
        },
        None => BatchMeta {
            transactional: r.attrs & attrs::TRANSACTIONAL != 0,
            control: r.attrs & attrs::KAFKA_CONTROL != 0,
            ..BatchMeta::default()
        },
    };
    let value = (r.attrs & attrs::NULL_VALUE == 0).then_some(r.value);
    let out = OutRecord { offset: offset as i64, timestamp: r.timestamp.get(), key: r.key, value, headers: r.headers };
    (meta, out)
}

/// Whether a record can join a batch that started with `meta` (one producer per batch, and
/// sequences consecutive within it).
pub fn same_batch(meta: &BatchMeta, next: &BatchMeta, records_so_far: usize) -> bool {
    meta.producer_id == next.producer_id
        && meta.producer_epoch == next.producer_epoch
        && meta.transactional == next.transactional
        && meta.control == next.control
        && (meta.base_sequence < 0 || next.base_sequence == meta.base_sequence.wrapping_add(records_so_far as i32))
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use silt_kafka::kafka_protocol::protocol::StrBytes;
    use silt_kafka::kafka_protocol::records::{self as kr, RecordBatchEncoder, RecordEncodeOptions};

    use super::*;

    fn produced(compression: Compression, records: &[kr::Record]) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(&mut buf, records, &RecordEncodeOptions { version: 2, compression }).unwrap();
        buf.freeze()
    }

    fn kafka_record(key: Option<&'static str>, value: Option<&'static [u8]>) -> kr::Record {
        let headers = vec![(StrBytes::from_static_str("h"), Some(Bytes::from_static(b"v")))];
        kr::Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: -1,
            timestamp: 1_700_000_000_000,
            key: key.map(|k| Bytes::from_static(k.as_bytes())),
            value: value.map(Bytes::from_static),
            headers,
        }
    }

    #[test]
    fn produced_records_keep_key_value_headers_and_time_and_find_their_mqtt_topic() {
        for codec in [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
            let raw = produced(
                codec,
                &[
                    kafka_record(Some("factory/line1/temp"), Some(b"21.5")),
                    kafka_record(None, None),
                    kafka_record(Some("elsewhere/x"), Some(b"")),
                ],
            );
            let p = decode("factory", 2, &raw, 1 << 20, 1 << 20).unwrap();
            let r = &p.records;
            assert_eq!(r.len(), 3, "{codec:?}");
            assert_eq!(r[0].topic, "factory/line1/temp");
            assert_eq!(r[1].topic, "factory");
            assert_eq!(r[2].topic, "factory");
            assert_eq!((&r[0].value[..], r[0].timestamp.get()), (&b"21.5"[..], 1_700_000_000_000));
            assert_eq!(r[0].headers, vec![("h".to_string(), Some(Bytes::from_static(b"v")))]);
            assert!(r[1].attrs & attrs::NULL_VALUE != 0 && r[1].key.is_none());
            assert!(r[2].attrs & attrs::NULL_VALUE == 0 && r[2].value.is_empty(), "empty is not null");
            assert_eq!(r[0].partition, Partition(2));
            let (_, back) = fetched(5, r[1].clone());
            assert_eq!((back.offset, back.value), (5, None));
        }
    }

    #[test]
    fn oversized_and_control_batches_are_refused() {
        let raw = produced(Compression::None, &[kafka_record(Some("k"), Some(&[0u8; 2000]))]);
        assert!(matches!(decode("t", 0, &raw, 1000, 1 << 20), Err(ProduceError::TooLarge { .. })));
        let zipped = produced(Compression::Gzip, &[kafka_record(Some("k"), Some(&[0u8; 200_000]))]);
        assert!(matches!(decode("t", 0, &zipped, 1 << 20, 100_000), Err(ProduceError::Corrupt(_))));
        let mut control = kafka_record(None, Some(b"x"));
        control.control = true;
        assert_eq!(
            decode("t", 0, &produced(Compression::None, &[control]), 1 << 20, 1 << 20).unwrap_err(),
            ProduceError::Control
        );
        assert!(matches!(
            decode("t", 0, &Bytes::from_static(b"garbage!garbage!"), 1 << 20, 1 << 20),
            Err(ProduceError::Corrupt(_))
        ));
    }

    /// A RecordBatch v2 holding `records` (already encoded), claiming `count` records, with
    /// its length and CRC right.
    fn raw_batch(count: i32, records: &[u8]) -> Bytes {
        let mut b = BytesMut::new();
        b.extend_from_slice(&0i64.to_be_bytes()); // base offset
        b.extend_from_slice(&((49 + records.len()) as i32).to_be_bytes()); // batch length
        b.extend_from_slice(&0i32.to_be_bytes()); // partition leader epoch
        b.extend_from_slice(&[2]); // magic
        b.extend_from_slice(&[0; 4]); // CRC, below
        b.extend_from_slice(&0i16.to_be_bytes()); // attributes
        b.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
        b.extend_from_slice(&0i64.to_be_bytes()); // base timestamp
        b.extend_from_slice(&0i64.to_be_bytes()); // max timestamp
        b.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
        b.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
        b.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
        b.extend_from_slice(&count.to_be_bytes());
        b.extend_from_slice(records);
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b.freeze()
    }

    #[test]
    fn counts_a_batch_cannot_hold_are_refused_without_allocating_for_them() {
        // A batch of 61 bytes claiming 2,147,483,647 records: decoded as counted, it reserved
        // ~300 GB up front and aborted the process.
        let err = decode("t", 0, &raw_batch(i32::MAX, &[]), 1 << 20, 1 << 20).unwrap_err();
        assert!(matches!(err, ProduceError::Corrupt(_)), "{err:?}");
        // One record (attributes, timestamp and offset deltas 0, null key and value) claiming
        // 2,147,483,647 headers (varint, zigzag): the same, for its header map.
        let record = [0x14, 0, 0, 0, 0x01, 0x01, 0xfe, 0xff, 0xff, 0xff, 0x0f];
        let err = decode("t", 0, &raw_batch(1, &record), 1 << 20, 1 << 20).unwrap_err();
        assert!(matches!(err, ProduceError::Corrupt(_)), "{err:?}");
    }

    #[test]
    fn a_retain_header_asks_for_mqtt_retention_and_is_not_kept() {
        let mut r = kafka_record(Some("status/door"), Some(b"open"));
        r.headers.push((StrBytes::from_static_str(RETAIN_HEADER), Some(Bytes::from_static(b"true"))));
        let p = decode("status", 0, &produced(Compression::None, &[r]), 1 << 20, 1 << 20).unwrap();
        assert!(p.records[0].attrs & attrs::RETAIN != 0);
        assert!(p.records[0].headers.iter().all(|(k, _)| k != RETAIN_HEADER));
    }
}
