//! The segment scan that opening the log runs on its newest segment file
//! (`silt_storage::recover_segment_file`: check every batch, quarantine a bad range that valid
//! batches follow, cut a torn end), on a file a bad disk or a crash left: arbitrary bytes after
//! the header (or instead of it), or a segment the log wrote with one byte damaged or its end
//! torn off.
//!
//! Besides "never panic": after recovery the file is the header and whole frames that pass
//! their checks, to its end; the valid batches it started with are still there byte for byte
//! (all of them when only one was damaged and it was not the last one: a bad batch with valid
//! ones after it is corruption, not a torn write); and recovering again changes nothing.
//! Temporary files go to `TMPDIR` (`run.sh` points it at a memory file system when there is
//! one: recovery fsyncs).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use silt_storage::format::{self, FrameKind, Record, SEGMENT_HEADER_LEN};
use silt_types::{Partition, Timestamp};

#[derive(Arbitrary, Debug)]
enum Input {
    /// These bytes after a valid header, or as the whole file.
    Raw { max: u16, header: bool, bytes: Vec<u8> },
    /// Batches the log encodes (each of `n` records with these values), then `damage`.
    Batches { max: u16, batches: Vec<(u8, Vec<u8>)>, damage: Damage },
}

#[derive(Arbitrary, Debug)]
enum Damage {
    None,
    /// One byte of batch `batch` (counted modulo the batches) changed.
    Byte {
        batch: u8,
        at: u16,
        xor: u8,
    },
    /// The file cut this many bytes before its end.
    Torn(u16),
}

/// A batch limit from the input, at least the 1 KiB the storage settings require.
fn limit(max: u16) -> usize {
    1024 + usize::from(max)
}

fuzz_target!(|input: Input| {
    let (bytes, max, frames, damaged) = match input {
        Input::Raw { max, header, bytes } => {
            let file = if header { [&format::segment_header()[..], &bytes].concat() } else { bytes };
            (file, limit(max), Vec::new(), None)
        }
        Input::Batches { max, batches, damage } => {
            let max = limit(max);
            let mut file = format::segment_header().to_vec();
            let mut frames = Vec::new();
            for (n, value) in batches {
                let records: Vec<Record> = (0..n % 8)
                    .map(|i| Record {
                        timestamp: Timestamp(i64::from(i)),
                        stream: "s".into(),
                        partition: Partition(u32::from(i)),
                        topic: "a/b".into(),
                        value: Bytes::from(value.clone()),
                        ..Record::default()
                    })
                    .collect();
                let Ok(enc) = format::encode_batch(&records, max) else { continue };
                frames.push((file.len(), enc.frame.len()));
                file.extend_from_slice(&enc.frame);
            }
            let damaged = match damage {
                Damage::Byte { batch, at, xor } if !frames.is_empty() => {
                    let k = usize::from(batch) % frames.len();
                    let (start, len) = frames[k];
                    file[start + usize::from(at) % len] ^= xor.max(1);
                    Some(k)
                }
                Damage::Torn(n) if !frames.is_empty() => {
                    let n = usize::from(n).min(frames[frames.len() - 1].1 - 1);
                    file.truncate(file.len() - n.max(1));
                    Some(frames.len() - 1)
                }
                _ => None,
            };
            (file, max, frames, damaged)
        }
    };

    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(format!("{:020}.log", 0));
    let quarantine = dir.path().join("quarantine");
    std::fs::write(&path, &bytes).expect("the segment file is written");
    let prefix = valid_prefix(&bytes, max);

    let first = match silt_storage::recover_segment_file(&path, max, &quarantine) {
        Ok(r) => r,
        Err(e) => {
            assert!(
                format::check_segment_header(&bytes).is_err(),
                "recovery failed on a segment with a valid header: {e}"
            );
            return;
        }
    };
    let after = std::fs::read(&path).expect("the segment file is read");
    assert_eq!(after.len() as u64 + first.cut_bytes, bytes.len() as u64);
    assert_eq!(&after[..prefix], &bytes[..prefix], "recovery changed valid batches at the start");

    // The header and whole frames that check, to the end; gap batches where recovery says.
    let mut at = SEGMENT_HEADER_LEN as usize;
    let mut batches = 0u64;
    let mut gaps = Vec::new();
    while at < after.len() {
        let total = format::peek_frame(&after[at..], max)
            .ok()
            .flatten()
            .filter(|t| at + t <= after.len())
            .unwrap_or_else(|| panic!("after recovery no whole frame at offset {at} of {}", after.len()));
        match format::check_frame(&after[at..at + total], max) {
            Ok(FrameKind::Records(_)) => batches += 1,
            Ok(FrameKind::Gap) => match gaps.last_mut() {
                Some((_, end)) if *end == at as u64 => *end = (at + total) as u64,
                _ => gaps.push((at as u64, (at + total) as u64)),
            },
            Err(e) => panic!("after recovery the frame at offset {at} does not check: {e}"),
        }
        at += total;
    }
    assert_eq!(batches, first.batches, "recovery counted other batches than the file holds");
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for &(s, e) in &first.gaps {
        match merged.last_mut() {
            Some((_, end)) if *end == s => *end = e,
            _ => merged.push((s, e)),
        }
    }
    assert_eq!(merged, gaps, "recovery's gaps are not the file's gap batches");

    // The log's own batches, one of them damaged: every other one is still in place.
    if !frames.is_empty() {
        let last = frames.len() - 1;
        for (i, &(start, len)) in frames.iter().enumerate() {
            if Some(i) == damaged {
                continue;
            }
            assert_eq!(
                after.get(start..start + len),
                Some(&bytes[start..start + len]),
                "batch {i} of {} lost",
                last + 1
            );
        }
        if damaged.is_some_and(|k| k < last) {
            assert_eq!(first.cut_bytes, 0, "a bad batch with valid ones after it was cut as a torn end");
        }
    }

    // Recovering again finds nothing to do.
    let again = silt_storage::recover_segment_file(&path, max, &quarantine).expect("a recovered segment recovers");
    assert_eq!((again.batches, again.cut_bytes, again.quarantined), (first.batches, 0, 0));
    assert_eq!(std::fs::read(&path).expect("the segment file is read"), after, "a second recovery changed the file");
});

/// Length of the header and the whole valid frames that follow it.
fn valid_prefix(bytes: &[u8], max: usize) -> usize {
    if format::check_segment_header(bytes).is_err() {
        return 0;
    }
    let mut at = SEGMENT_HEADER_LEN as usize;
    while let Ok(Some(total)) = format::peek_frame(&bytes[at..], max) {
        if at + total > bytes.len() || format::check_frame(&bytes[at..at + total], max).is_err() {
            break;
        }
        at += total;
    }
    at
}
