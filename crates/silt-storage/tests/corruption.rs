//! Bad disks: bytes flipped in segment files are detected on read, quarantined when no good
//! copy exists, never returned; recovery keeps what follows a corrupt batch and still cuts a
//! torn tail; dispatch goes on past a quarantined batch; the writer recovers from a full disk.
//!
//! The object store's side (healing from a segment or tail object) is tested in
//! `tiering/tests/`, against a real store.

mod common;

use std::path::Path;

use bytes::Bytes;
use common::*;
use proptest::prelude::*;
use silt_storage::{ErrorKind, FsyncPolicy, QueueName, Record, Storage, StorageConfig};
use silt_types::{Partition, TopicFilter};

/// Small segments, no tail cache: every read goes to the segment files.
fn cfg() -> StorageConfig {
    StorageConfig { segment_bytes: 4096, tail_cache_bytes: 0, ..small_config() }
}

/// Distinct, recognisable values of about 150 bytes.
fn value(i: usize) -> Bytes {
    Bytes::from(format!("value {i:04} {}", "v".repeat(140)))
}

/// `n` records on topic `t`, one batch each; closes cleanly (the index covers them all).
fn write_log(dir: &Path, n: usize, config: StorageConfig) -> Vec<Record> {
    let s = Storage::open(dir, config).unwrap();
    let recs: Vec<Record> = (0..n).map(|i| record("s", 0, "t", value(i))).collect();
    for r in &recs {
        s.append_blocking(std::slice::from_ref(r)).unwrap();
    }
    s.close().unwrap();
    recs
}

fn quarantine_files(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir.join("log/quarantine")).map(|rd| rd.map(|e| e.unwrap().path()).collect()).unwrap_or_default()
}

/// The record values a subscriber gets from topic `t`, and how many entries were lost.
fn readable(s: &Storage) -> (Vec<Bytes>, usize) {
    let mut got = Vec::new();
    let mut lost = 0;
    for e in entries(s, &topic("t")) {
        match e {
            Ok(r) => got.push(r.value),
            Err(kind) => {
                assert_eq!(kind, ErrorKind::Expired, "a lost record reads as gone, nothing else");
                lost += 1;
            }
        }
    }
    (got, lost)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_flipped_bit_in_a_sealed_segment_is_detected_on_read_and_never_returned(
        which in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let recs = write_log(dir.path(), 60, cfg());
        let segs = segment_files(dir.path());
        prop_assert!(segs.len() >= 3);
        let sealed = &segs[..segs.len() - 1];
        let seg = &sealed[which.index(sealed.len())];
        let len = std::fs::metadata(seg).unwrap().len();
        let off = 16 + at.index((len - 16) as usize) as u64;
        flip(seg, off, bit);

        let s = open_alone(dir.path(), cfg());
        let (got, lost) = readable(&s);
        let want: Vec<Bytes> = recs.iter().map(|r| r.value.clone()).collect();
        // Every record returned is byte for byte one that was written, in order.
        let mut it = want.iter();
        for g in &got {
            prop_assert!(it.any(|w| w == g), "a record that was never written was returned");
        }
        prop_assert!(lost >= 1, "the flipped bit went unnoticed");
        prop_assert_eq!(got.len() + lost, want.len());
        let stats = s.stats();
        prop_assert!(stats.quarantined_batches >= 1 && stats.quarantined_bytes > 0);
        prop_assert!(!quarantine_files(dir.path()).is_empty());
        // Lost records all lie in the damaged segment.
        let base = segment_base(seg);
        let id = s.queue_id(&topic("t")).unwrap().unwrap();
        for (_, e) in s.read_index(id, silt_types::Offset(0), usize::MAX).unwrap() {
            if s.read_record(&e).is_err() {
                prop_assert!(e.position.get() >= base && e.position.get() < base + len);
            }
        }
    }
}

#[test]
fn a_corrupt_batch_in_the_middle_of_the_active_segment_keeps_every_batch_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let big = StorageConfig { tail_cache_bytes: 0, ..small_config() };
    let recs = write_log(dir.path(), 20, big.clone());
    let segs = segment_files(dir.path());
    assert_eq!(segs.len(), 1, "one active segment");
    let frames = frames(&segs[0]);
    let (start, len) = frames[5];
    let original = std::fs::read(&segs[0]).unwrap()[start as usize..(start + len) as usize].to_vec();
    flip(&segs[0], start + len - 20, 3); // inside the record's payload
    let damaged = std::fs::read(&segs[0]).unwrap()[start as usize..(start + len) as usize].to_vec();
    assert_ne!(original, damaged);

    let s = open_alone(dir.path(), big.clone());
    let (got, lost) = readable(&s);
    let mut want: Vec<Bytes> = recs.iter().map(|r| r.value.clone()).collect();
    want.remove(5);
    assert_eq!(got, want, "every batch after the bad one is still there");
    assert_eq!(lost, 1);
    let stats = s.stats();
    assert_eq!((stats.quarantined_batches, stats.quarantined_bytes), (1, len));
    let q = quarantine_files(dir.path());
    assert_eq!(q.len(), 1);
    assert_eq!(std::fs::read(&q[0]).unwrap(), damaged, "the quarantine file holds the bad bytes");
    let more = record("s", 0, "t", "after recovery");
    s.append_blocking(std::slice::from_ref(&more)).unwrap();
    s.close().unwrap();

    // The gap batch is a valid batch: nothing is quarantined again, and a rebuilt index
    // simply lacks the lost record.
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let s = open_alone(dir.path(), big);
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    want.push(more.value.clone());
    assert_eq!(readable(&s), (want, 0));
    assert_eq!(s.stats().quarantined_batches, 0);
}

#[test]
fn a_corrupt_length_field_is_resynced_to_the_next_batch() {
    for (bogus, what) in [(1u32 << 20, "past the end"), (100, "inside the batch"), (3, "below a body header")] {
        let dir = tempfile::tempdir().unwrap();
        let big = StorageConfig { tail_cache_bytes: 0, ..small_config() };
        let recs = write_log(dir.path(), 12, big.clone());
        let seg = &segment_files(dir.path())[0];
        let (start, len) = frames(seg)[4];
        let mut bytes = std::fs::read(seg).unwrap();
        bytes[start as usize..start as usize + 4].copy_from_slice(&bogus.to_le_bytes());
        std::fs::write(seg, bytes).unwrap();
        std::fs::remove_dir_all(dir.path().join("index")).unwrap();

        let s = open_alone(dir.path(), big);
        s.wait_dispatched_blocking(s.stats().log_end).unwrap();
        let mut want: Vec<Bytes> = recs.iter().map(|r| r.value.clone()).collect();
        want.remove(4);
        assert_eq!(readable(&s), (want, 0), "length field {what}");
        assert_eq!(s.stats().quarantined_bytes, len, "exactly the bad batch is quarantined ({what})");
    }
}

#[test]
fn a_corrupt_length_field_in_a_sealed_segment_is_resynced_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let recs = write_log(dir.path(), 60, cfg());
    let seg = &segment_files(dir.path())[1];
    let (start, len) = frames(seg)[2];
    let mut bytes = std::fs::read(seg).unwrap();
    bytes[start as usize + 1] ^= 0x40;
    std::fs::write(seg, bytes).unwrap();

    let s = open_alone(dir.path(), cfg());
    let (got, lost) = readable(&s);
    assert_eq!((got.len(), lost), (recs.len() - 1, 1));
    assert_eq!(s.stats().quarantined_bytes, len);
}

#[test]
fn a_torn_tail_after_a_corrupt_batch_is_still_cut() {
    let dir = tempfile::tempdir().unwrap();
    let big = StorageConfig { tail_cache_bytes: 0, ..small_config() };
    let recs = write_log(dir.path(), 10, big.clone());
    let seg = &segment_files(dir.path())[0];
    let (start, len) = frames(seg)[3];
    flip(seg, start + len / 2, 0);
    let file_len = std::fs::metadata(seg).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(seg).unwrap().set_len(file_len - 7).unwrap();
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();

    let s = open_alone(dir.path(), big);
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    let want: Vec<Bytes> =
        recs.iter().enumerate().filter(|(i, _)| *i != 3 && *i != 9).map(|(_, r)| r.value.clone()).collect();
    assert_eq!(readable(&s), (want, 0), "the corrupt batch is quarantined, the torn last one cut");
    assert_eq!(s.stats().quarantined_batches, 1);
}

#[test]
fn dispatch_goes_past_a_quarantined_batch_and_a_rebuild_is_identical() {
    let dir = tempfile::tempdir().unwrap();
    let names = [
        topic("a/x"),
        topic("b/y"),
        QueueName::Partition { stream: "a".into(), partition: Partition(1) },
        filter("a/#"),
        filter("+/y"),
    ];
    let written = {
        let s = Storage::open(dir.path(), cfg()).unwrap();
        for f in ["a/#", "+/y"] {
            s.register_filter_blocking(&TopicFilter::new(f).unwrap()).unwrap();
        }
        let mut all = Vec::new();
        for i in 0..120 {
            let t = if i % 3 == 0 { "b/y" } else { "a/x" };
            let r = record(&t[..1], (i % 2) as u32, t, value(i));
            s.append_blocking(std::slice::from_ref(&r)).unwrap();
            all.push(r);
        }
        s.close().unwrap();
        all
    };
    let segs = segment_files(dir.path());
    let (start, len) = frames(&segs[2])[1];
    flip(&segs[2], start + len - 30, 6);
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();

    let snapshot = |s: &Storage| -> Vec<(Option<silt_types::QueueId>, Vec<Record>)> {
        s.wait_dispatched_blocking(s.stats().log_end).unwrap();
        names.iter().map(|n| (s.queue_id(n).unwrap(), queue(s, n))).collect()
    };
    // The dispatcher's first round may run before the cold reader is attached: it waits.
    let s = open_alone(dir.path(), cfg());
    let first = snapshot(&s);
    assert_eq!(s.stats().quarantined_batches, 1);
    s.close().unwrap();
    let lost: Vec<&Record> = written.iter().filter(|r| !first[0].1.contains(r) && !first[1].1.contains(r)).collect();
    assert_eq!(lost.len(), 1, "exactly the bad batch's record is missing");
    let a1: Vec<Record> = written
        .iter()
        .filter(|r| r.stream == "a" && r.partition == Partition(1) && !lost.contains(r))
        .cloned()
        .collect();
    assert_eq!(first[2].1, a1);

    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let s = open_alone(dir.path(), cfg());
    assert_eq!(snapshot(&s), first, "re-dispatch gives the same queue ids and offsets");
    assert_eq!(s.stats().quarantined_batches, 0, "the gap batch is found, not a new corruption");
}

#[test]
fn the_writer_recovers_from_a_full_disk_without_a_restart() {
    if !can_mount_or_rerun("the_writer_recovers_from_a_full_disk_without_a_restart") {
        return;
    }
    let disk = Tmpfs::mount("24m");
    let dir = disk.path().join("data");
    let config = StorageConfig {
        segment_bytes: 64 << 10,
        fsync: FsyncPolicy::Always,
        index_flush_interval_ms: 3_600_000,
        ..small_config()
    };
    let s = Storage::open(&dir, config.clone()).unwrap();
    let mut acked = Vec::new();
    for i in 0..200 {
        let r = record("s", 0, "t", value(i));
        s.append_blocking(std::slice::from_ref(&r)).unwrap();
        acked.push(r);
    }
    let filler = disk.fill();
    let mut refused = 0;
    for i in 200..400 {
        let r = record("s", 0, "t", value(i));
        match s.append_blocking(std::slice::from_ref(&r)) {
            Ok(_) => acked.push(r),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Retryable, "{e}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "the disk was full, yet every append was stored");
    std::fs::remove_file(filler).unwrap();
    for i in 400..600 {
        let r = record("s", 0, "t", value(i));
        s.append_blocking(std::slice::from_ref(&r)).expect("appends succeed again once there is room");
        acked.push(r);
    }
    assert!(!s.has_failed());
    s.close().expect("a clean close after the disk was full");
    let s = Storage::open(&dir, config).unwrap();
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    assert_eq!(queue(&s, &topic("t")), acked, "every acknowledged record is there, nothing else");
}
