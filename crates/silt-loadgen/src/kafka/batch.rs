//! Record batches (v2) as the generator writes and reads them, on `kafka_protocol::records`.
//!
//! Writing: one uncompressed batch per Produce request, every record a value of the configured
//! size whose first bytes are a [`Stamp`] (send time, producer, sequence), no key unless one
//! is given, no headers, not idempotent (producer id -1). Values that carry no stamp share one
//! buffer, so a batch costs the encoder's copy and its CRC, not an allocation per record.
//!
//! Reading: a Fetch response's `records` are split into whole batches by their length fields;
//! a trailing partial batch (a broker may cut one at `partition_max_bytes`) is left for the
//! next fetch. Each whole batch is CRC-checked by the decoder, and the consumer's next offset
//! comes from the batch header's last offset delta, so gaps in offsets are followed.

use anyhow::{Context, ensure};
use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, Record, RecordBatchDecoder,
    RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use crate::payload::{HEADER_LEN, Stamp};

/// Base offset (8) and batch length (4): the bytes before the length counts.
const LOG_OVERHEAD: usize = 12;
/// Where a batch's last offset delta starts: base offset 8, length 4, leader epoch 4, magic 1,
/// CRC 4, attributes 2.
const LAST_OFFSET_DELTA_AT: usize = 23;
/// Where the record count starts (the last field of the 61-byte header).
const RECORD_COUNT_AT: usize = 57;
const HEADER_BYTES: usize = 61;

/// Encodes one record batch of `values` (offsets 0.., one timestamp) with an optional key.
pub fn encode(values: &[Bytes], key: Option<&Bytes>, timestamp_ms: i64) -> anyhow::Result<Bytes> {
    ensure!(!values.is_empty(), "a batch needs a record");
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder keeps records in one batch while offset − sequence is constant, and
            // derives the base sequence from the first: -1 (none) for offset 0.
            sequence: i as i32 - 1,
            timestamp: timestamp_ms,
            key: key.cloned(),
            value: Some(v.clone()),
            headers: Vec::new(),
        })
        .collect();
    let size: usize = values.iter().map(|v| v.len() + 16).sum::<usize>() + HEADER_BYTES;
    let mut out = BytesMut::with_capacity(size);
    let options = RecordEncodeOptions { version: 2, compression: Compression::None };
    RecordBatchEncoder::encode(&mut out, records.iter(), &options).context("encode record batch")?;
    Ok(out.freeze())
}

/// A value of `size` bytes starting with `stamp` (zero padding).
pub fn stamped_value(size: usize, stamp: &Stamp) -> Bytes {
    let mut v = vec![0u8; size.max(HEADER_LEN)];
    stamp.write(&mut v);
    Bytes::from(v)
}

/// One whole batch of a fetch response, header read, records not decoded yet.
#[derive(Clone, Debug)]
pub struct RawBatch {
    pub base_offset: i64,
    pub last_offset: i64,
    pub record_count: i32,
    pub bytes: Bytes,
}

impl RawBatch {
    /// The values of the records at or after `from`, CRC checked.
    pub fn values(&self, from: i64) -> anyhow::Result<Vec<Bytes>> {
        let mut buf = self.bytes.clone();
        let set = RecordBatchDecoder::decode(&mut buf).context("decode record batch")?;
        Ok(set.records.into_iter().filter(|r| r.offset >= from).filter_map(|r| r.value).collect())
    }

    /// Checks the CRC and the header without decoding records (for counting at speed).
    pub fn verify(&self) -> anyhow::Result<()> {
        let mut buf = self.bytes.clone();
        let info = RecordBatchDecoder::decode_batch_info(&mut buf).context("record batch header")?;
        ensure!(info.len() == 1, "one batch expected, {} decoded", info.len());
        Ok(())
    }

    /// Records at or after `from`, assuming dense offsets inside the batch.
    pub fn count_from(&self, from: i64) -> u64 {
        if from <= self.base_offset {
            self.record_count.max(0) as u64
        } else {
            (self.last_offset - from + 1).clamp(0, i64::from(self.record_count.max(0))) as u64
        }
    }
}

/// Splits `records` into whole v2 batches; a partial batch at the end is dropped.
pub fn split(records: &Bytes) -> anyhow::Result<Vec<RawBatch>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while records.len() - at >= LOG_OVERHEAD {
        let b = &records[at..];
        let len = i32::from_be_bytes(b[8..12].try_into().expect("invariant: four bytes"));
        ensure!(len >= 0, "negative batch length {len}");
        let whole = LOG_OVERHEAD + len as usize;
        if b.len() < whole {
            break;
        }
        ensure!(whole >= HEADER_BYTES, "batch of {whole} bytes is shorter than its header");
        ensure!(b[16] == 2, "record batch magic {} (only v2 is read)", b[16]);
        let base_offset = i64::from_be_bytes(b[..8].try_into().expect("invariant: eight bytes"));
        let delta = i32::from_be_bytes(
            b[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4].try_into().expect("invariant: four bytes"),
        );
        let record_count =
            i32::from_be_bytes(b[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].try_into().expect("invariant: four bytes"));
        out.push(RawBatch {
            base_offset,
            last_offset: base_offset + i64::from(delta),
            record_count,
            bytes: records.slice(at..at + whole),
        });
        at += whole;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(seq: u64) -> Stamp {
        Stamp { sent_ns: 1_000 + seq, publisher: 3, seq }
    }

    #[test]
    fn a_batch_holds_every_record_in_one_v2_batch_that_decodes_back() {
        let values: Vec<Bytes> = (0..100).map(|i| stamped_value(1024, &stamp(i))).collect();
        let encoded = encode(&values, None, 1_700_000_000_000).unwrap();
        let batches = split(&encoded).unwrap();
        assert_eq!(batches.len(), 1, "one batch, not one per record");
        let b = &batches[0];
        assert_eq!((b.base_offset, b.last_offset, b.record_count), (0, 99, 100));
        b.verify().unwrap();
        let got = b.values(0).unwrap();
        assert_eq!(got, values);
        assert_eq!(Stamp::read(&got[42]), Some(stamp(42)));
        let mut info = encoded.clone();
        let info = RecordBatchDecoder::decode_batch_info(&mut info).unwrap();
        assert_eq!((info[0].producer_id, info[0].base_sequence), (-1, -1));
    }

    #[test]
    fn split_leaves_a_partial_batch_and_follows_base_offsets() {
        let one = encode(&[Bytes::from_static(b"0123456789abcdefghij")], None, 5).unwrap();
        let mut two = BytesMut::from(&one[..]);
        // A second batch at base offset 7 (the CRC covers what follows the CRC field, not the
        // base offset, so it stays valid).
        let mut second = BytesMut::from(&one[..]);
        second[..8].copy_from_slice(&7i64.to_be_bytes());
        two.extend_from_slice(&second);
        two.extend_from_slice(&one[..one.len() - 3]);
        let batches = split(&two.freeze()).unwrap();
        assert_eq!(batches.iter().map(|b| b.base_offset).collect::<Vec<_>>(), vec![0, 7]);
        batches[1].verify().unwrap();
        assert_eq!(batches[1].count_from(7), 1);
        assert_eq!(batches[1].count_from(8), 0);
    }

    #[test]
    fn a_corrupt_batch_fails_its_check() {
        let encoded = encode(&[stamped_value(64, &stamp(1))], None, 5).unwrap();
        let mut bad = BytesMut::from(&encoded[..]);
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let batches = split(&bad.freeze()).unwrap();
        assert!(batches[0].verify().is_err());
        assert!(batches[0].values(0).is_err());
    }
}
