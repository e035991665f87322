//! Segment objects in the object store (`silt_tiering::footer`): the scan that checks a sealed
//! segment and builds its footer (`build`, which recovery also runs on every downloaded
//! object), and the footer decoders a reader runs on an object's tail (`footer_range`,
//! `decode`), on bytes a bad disk or a bad bucket could hold.
//!
//! Besides "never panic": the scan accepts exactly the segments whose frames all check and
//! whose records all decode, and its footer stays inside the segment (byte ranges, counts,
//! timestamps); an object's tail decodes only from inside the object; and a footer written
//! with `encode_tail` decodes back to itself from the object's end.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use silt_storage::format::{self, Record, SEGMENT_HEADER_LEN};
use silt_tiering::footer::{self, Footer, TRAILER_LEN};
use silt_types::{Partition, Timestamp};

#[derive(Arbitrary, Debug)]
enum Input {
    /// These bytes as a sealed segment (after a valid header, or as the whole file).
    Segment { base: u32, max: u16, header: bool, bytes: Vec<u8> },
    /// A segment of batches the log encodes: (stream, topic, timestamp, volatile) per record.
    Batches { base: u32, batches: Vec<Vec<(u8, u8, i64, bool)>> },
    /// These bytes as a whole object: segment bytes, footer, trailer.
    Object(Vec<u8>),
}

const NAMES: [&str; 4] = ["", "a", "b/c", "__silt_sessions"];

fuzz_target!(|input: Input| match input {
    Input::Segment { base, max, header, bytes } => {
        let max = 1024 + usize::from(max);
        let file = if header { [&format::segment_header()[..], &bytes].concat() } else { bytes };
        let file = Bytes::from(file);
        let built = footer::build(u64::from(base), &file, max);
        match (&built, log_accepts(&file, max)) {
            (Ok(f), true) => check_footer(f, u64::from(base), &file),
            (Err(_), false) => {}
            (Ok(_), false) => panic!("the scan accepted a segment the log rejects"),
            (Err(e), true) => panic!("the scan rejected a segment the log accepts: {e}"),
        }
    }
    Input::Batches { base, batches } => {
        let mut file = format::segment_header().to_vec();
        let mut expected = 0u64;
        for batch in batches {
            let records: Vec<Record> = batch
                .into_iter()
                .map(|(s, t, ts, volatile)| Record {
                    timestamp: Timestamp(ts),
                    stream: NAMES[usize::from(s) % 4].into(),
                    partition: Partition(u32::from(s)),
                    topic: NAMES[usize::from(t) % 4].into(),
                    value: Bytes::from_static(b"v"),
                    volatile,
                    ..Record::default()
                })
                .collect();
            let enc = format::encode_batch(&records, 1 << 20).expect("small records encode");
            expected += records.len() as u64;
            file.extend_from_slice(&enc.frame);
        }
        let file = Bytes::from(file);
        let f = footer::build(u64::from(base), &file, 1 << 20).expect("a segment the log wrote scans");
        assert_eq!(f.records, expected);
        check_footer(&f, u64::from(base), &file);
    }
    Input::Object(object) => {
        let size = object.len() as u64;
        let Some(trailer) = object.len().checked_sub(TRAILER_LEN).map(|at| &object[at..]) else { return };
        if let Ok(range) = footer::footer_range(size, trailer) {
            assert!(range.start <= range.end && range.end + TRAILER_LEN as u64 == size, "{range:?} of {size}");
            if let Ok(f) = footer::decode(&object[range.start as usize..range.end as usize]) {
                round_trip(&f);
            }
        }
    }
});

/// Whether the log takes `file` as a valid segment whose records all decode (what an upload
/// or a restore must be able to scan).
fn log_accepts(file: &Bytes, max: usize) -> bool {
    if format::check_segment_header(file).is_err() {
        return false;
    }
    let mut at = SEGMENT_HEADER_LEN as usize;
    while at < file.len() {
        let Ok(Some(total)) = format::peek_frame(&file[at..], max) else { return false };
        if at + total > file.len() {
            return false;
        }
        let Ok(view) = format::check_batch(file.slice(at..at + total), max) else { return false };
        if (0..view.records.len()).any(|i| view.record(i).is_err()) {
            return false;
        }
        at += total;
    }
    true
}

/// The footer of a segment of `file.len()` bytes at `base` stays inside it.
fn check_footer(f: &Footer, base: u64, file: &Bytes) {
    let len = file.len() as u64;
    assert_eq!((f.base, f.end), (base, base + len));
    assert!(f.records == 0 || f.min_ts <= f.max_ts);
    assert!(f.withheld + f.volatile <= f.records);
    for spans in [&f.topics, &f.partitions] {
        let mut total = 0;
        for s in spans {
            total += s.records;
            assert!(s.records > 0 && s.min_ts <= s.max_ts && s.min_ts >= f.min_ts && s.max_ts <= f.max_ts);
            let mut prev = SEGMENT_HEADER_LEN;
            for &(start, end) in &s.ranges {
                assert!(prev <= start && start < end && end <= len, "span {} range {start}..{end} of {len}", s.name);
                prev = end;
            }
        }
        assert!(total <= f.records);
    }
    let mut prev = SEGMENT_HEADER_LEN;
    for &(start, end) in &f.gaps {
        assert!(prev <= start && start < end && end <= len, "gap {start}..{end} of {len}");
        prev = end;
    }
    round_trip(f);
}

/// A footer written after some segment bytes decodes back to itself from the object's end.
fn round_trip(f: &Footer) {
    let object = [&b"segment bytes"[..], &footer::encode_tail(f)].concat();
    let size = object.len() as u64;
    let range = footer::footer_range(size, &object[object.len() - TRAILER_LEN..]).expect("an encoded trailer decodes");
    let back = footer::decode(&object[range.start as usize..range.end as usize]).expect("an encoded footer decodes");
    assert_eq!(&back, f);
}
