//! The commitlog's batch and record decoders (`silt_storage::format`) on bytes a bad disk or a
//! bad object-store copy could hold: raw frames, frames whose CRC is made to match (so the
//! fuzzer gets past it to the record framing), and batches the log encoded, damaged in one byte.
//!
//! Besides "never panic": `check_frame` and `check_batch` agree, the record table covers the
//! body exactly, the resync filter (`frame_candidate`) never rejects a frame that checks, a
//! record's head agrees with its full decode, whatever decodes re-encodes and decodes back to
//! itself, and a damaged byte never passes the checks.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use silt_storage::format::{self, BODY_HEADER_LEN, FRAME_LEN, FrameKind, MIN_FRAME_LEN, Producer, Record, RecordHead};
use silt_types::{Partition, Timestamp};

#[derive(Arbitrary, Debug)]
enum Input {
    /// Bytes taken as a whole frame.
    Raw { max: u16, frame: Vec<u8> },
    /// Bytes taken as a batch body, framed with the right length and CRC.
    Body { max: u16, body: Vec<u8> },
    /// Records the log encodes; then one byte of the frame is damaged, if `damage` says so.
    Records { records: Vec<ArbRecord>, damage: Option<(u16, u8)> },
}

#[derive(Arbitrary, Debug)]
struct ArbRecord {
    timestamp: i64,
    stream: String,
    partition: u32,
    topic: String,
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
    attrs: u16,
    volatile: bool,
    producer: Option<(i64, i16, i32)>,
}

impl From<ArbRecord> for Record {
    fn from(a: ArbRecord) -> Record {
        Record {
            timestamp: Timestamp(a.timestamp),
            stream: a.stream,
            partition: Partition(a.partition),
            topic: a.topic,
            key: a.key.map(Bytes::from),
            value: Bytes::from(a.value),
            headers: a.headers.into_iter().map(|(k, v)| (k, Bytes::from(v))).collect(),
            attrs: a.attrs,
            volatile: a.volatile,
            producer: a.producer.map(|(id, epoch, sequence)| Producer { id, epoch, sequence }),
            ..Record::default()
        }
    }
}

/// A batch limit from the input: from the smallest frame up, as the settings allow any.
fn limit(max: u16) -> usize {
    BODY_HEADER_LEN + usize::from(max)
}

fuzz_target!(|input: Input| match input {
    Input::Raw { max, frame } => check_any(&frame, limit(max)),
    Input::Body { max, body } => {
        let mut frame = Vec::with_capacity(FRAME_LEN + body.len());
        frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        frame.extend_from_slice(&body);
        check_any(&frame, limit(max));
    }
    Input::Records { records, damage } => {
        let records: Vec<Record> = records.into_iter().map(Record::from).collect();
        let Ok(enc) = format::encode_batch(&records, 1 << 24) else {
            assert!(records.iter().any(|r| r.validate().is_err()), "a valid batch under the limit did not encode");
            return;
        };
        let mut frame = enc.frame;
        match damage {
            None => {
                let view = format::check_batch(Bytes::from(frame.clone()), 1 << 24).expect("an encoded batch checks");
                assert_eq!(view.records, enc.records);
                for (i, r) in records.iter().enumerate() {
                    assert_eq!(&view.record(i).expect("an encoded record decodes"), r);
                }
                check_any(&frame, 1 << 24);
            }
            Some((at, xor)) => {
                let at = usize::from(at) % frame.len();
                frame[at] ^= xor.max(1);
                assert!(format::check_frame(&frame, 1 << 24).is_err(), "a damaged byte at {at} passed the checks");
                check_any(&frame, 1 << 24);
            }
        }
    }
});

/// What must hold for any bytes taken as a frame.
fn check_any(frame: &[u8], max: usize) {
    if let Ok(Some(total)) = format::peek_frame(frame, max) {
        assert!((MIN_FRAME_LEN..=FRAME_LEN + max).contains(&total), "peek_frame said {total}");
    }
    let checked = format::check_frame(frame, max);
    let view = format::check_batch(Bytes::copy_from_slice(frame), max);
    let view = match (checked, view) {
        (Ok(kind), Ok(view)) => {
            assert_eq!(kind == FrameKind::Gap, view.gap);
            if let FrameKind::Records(n) = kind {
                assert_eq!(n as usize, view.records.len());
            }
            view
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "check_frame and check_batch disagree");
            return;
        }
        (a, b) => panic!("check_frame and check_batch disagree: {a:?} vs {:?}", b.map(|v| v.records)),
    };
    let head = &frame[..(MIN_FRAME_LEN + 4).min(frame.len())];
    assert_eq!(
        format::frame_candidate(head, max, frame.len() as u64),
        Some(frame.len()),
        "the resync filter rejects a frame that checks"
    );
    // The record table covers the body exactly, in order.
    let mut at = MIN_FRAME_LEN;
    for &(off, len) in &view.records {
        assert_eq!(off as usize, at);
        at += len as usize;
    }
    assert!(view.gap && view.records.is_empty() || at == frame.len());

    let mut decoded = Vec::with_capacity(view.records.len());
    for (i, &(off, len)) in view.records.iter().enumerate() {
        let bytes = &frame[off as usize..(off + len) as usize];
        let head = RecordHead::decode(bytes);
        match view.record(i) {
            Ok(r) => {
                let h = head.expect("the head of a record that decodes decodes");
                assert_eq!(
                    (h.control, h.volatile, h.timestamp, h.partition, h.stream, h.topic),
                    (r.control, r.volatile, r.timestamp, r.partition, &r.stream[..], &r.topic[..])
                );
                assert_eq!(h.value, &r.value[..]);
                assert_eq!(r.encoded_len(), len as usize);
                decoded.push(r);
            }
            Err(_) => return,
        }
    }
    // Whatever decodes re-encodes (flags, lengths and all) and decodes back to itself.
    let again = format::encode_batch(&decoded, max).expect("decoded records re-encode within the same limit");
    assert_eq!(again.records, view.records);
    let back = format::check_batch(Bytes::from(again.frame), max).expect("re-encoded batch checks");
    for (i, r) in decoded.iter().enumerate() {
        assert_eq!(&back.record(i).expect("re-encoded record decodes"), r);
    }
}
