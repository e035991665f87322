//! Bad disks with a real object store (`object_store`'s local filesystem store): a corrupt local
//! copy of an uploaded segment is healed from its object; a corrupt segment not yet uploaded
//! is quarantined (by the upload itself when nothing read it first) and uploaded with the gap
//! named in its footer and the manifest, and the rest recovers from the bucket; incomplete
//! multipart uploads of earlier nodes are aborted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use silt_storage::{QueueName, Record, Storage, StorageConfig};
use silt_tiering::manifest::Manifest;
use silt_tiering::{Policies, Tiering, TieringConfig, TopicPolicy};
use silt_types::{Partition, Timestamp};

fn cfg(store: &Path) -> TieringConfig {
    TieringConfig {
        object_store: Some(format!("file://{}", store.display())),
        retention_check_interval_ms: 50,
        fence_check_interval_ms: 50,
        ..TieringConfig::default()
    }
}

/// Small segments and no tail cache: reads go to the segment files.
fn storage_cfg() -> StorageConfig {
    StorageConfig { segment_bytes: 64 << 10, tail_cache_bytes: 0, ..StorageConfig::default() }
}

struct Node {
    tiering: Arc<Tiering>,
    storage: Arc<Storage>,
}

fn start(dir: &Path, store: &Path) -> Node {
    let policies = Policies::new(TopicPolicy::default(), &[]).unwrap();
    let tiering = Arc::new(Tiering::prepare(cfg(store), policies, dir, storage_cfg().max_batch_bytes).unwrap());
    let storage = Arc::new(Storage::open_seeded(dir, storage_cfg(), Vec::new(), tiering.seeds()).unwrap());
    tiering.attach(storage.clone()).unwrap();
    storage.wait_dispatched_blocking(storage.stats().log_end).unwrap();
    Node { tiering, storage }
}

impl Node {
    fn stop(self) {
        self.tiering.shutdown();
        self.storage.close().unwrap();
    }
}

/// What a subscriber of `topic` gets: the values read, and how many entries were gone.
fn read_topic(s: &Storage, topic: &str) -> (Vec<Bytes>, usize) {
    let id = s.queue_id(&QueueName::Topic(topic.into())).unwrap().unwrap();
    let (first, next) = s.queue_bounds(id).unwrap();
    let mut got = Vec::new();
    let mut gone = 0;
    for (_, e) in s.read_index(id, first, (next.get() - first.get()) as usize).unwrap() {
        match s.read_record(&e) {
            Ok(r) => got.push(r.value),
            Err(err) => {
                assert_eq!(err.kind(), silt_storage::ErrorKind::Expired, "{err}");
                gone += 1;
            }
        }
    }
    (got, gone)
}

fn value(i: usize) -> Bytes {
    Bytes::from((0..1000).map(|j| (i * 31 + j) as u8).chain(i.to_be_bytes()).collect::<Vec<u8>>())
}

/// `n` records of about 1 KiB on topic `dev/t`, one batch each.
fn fill(s: &Storage, n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| {
            let r = Record {
                timestamp: Timestamp::now(),
                stream: "dev".into(),
                partition: Partition(0),
                topic: "dev/t".into(),
                value: value(i),
                ..Record::default()
            };
            s.append_blocking(&[r]).unwrap();
            value(i)
        })
        .collect()
}

fn manifest(store: &Path) -> Manifest {
    let fs = object_store::local::LocalFileSystem::new_with_prefix(store).unwrap();
    let log = silt_tiering::manifest::ManifestLog::new(Arc::new(fs));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(log.latest()).unwrap().expect("a manifest")
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    v.sort();
    v
}

fn base_of(p: &Path) -> u64 {
    p.file_stem().unwrap().to_str().unwrap().parse().unwrap()
}

/// Flips a bit in the payload of the `nth` batch of a segment file; returns the batch's range.
fn flip_in_batch(path: &Path, nth: usize) -> (u64, u64) {
    let mut bytes = std::fs::read(path).unwrap();
    let mut at = 16usize;
    for _ in 0..nth {
        at += u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize + 8;
    }
    let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize + 8;
    bytes[at + len - 100] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
    (at as u64, len as u64)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(60), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_flipped_byte_in_an_uploaded_segment_is_healed_from_its_object() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let node = start(a.path(), store.path());
    let values = fill(&node.storage, 300);
    node.stop();
    let m = manifest(store.path());
    let seg = segments(a.path())[1].clone();
    let object = m.objects.iter().find(|o| o.base == base_of(&seg)).expect("the segment was uploaded");
    flip_in_batch(&seg, 10);

    let node = start(a.path(), store.path());
    assert_eq!(read_topic(&node.storage, "dev/t"), (values, 0), "every record, byte for byte");
    assert_eq!(node.storage.stats().healed_batches, 1);
    assert_eq!(node.storage.stats().quarantined_batches, 0);
    let local = std::fs::read(&seg).unwrap();
    let uploaded = std::fs::read(store.path().join(&object.key)).unwrap();
    assert_eq!(&uploaded[..local.len()], &local[..], "the local copy matches the object again");
    node.stop();
}

#[test]
fn a_flipped_byte_in_a_segment_not_yet_uploaded_is_quarantined_and_the_rest_uploaded() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    // Written without tiering: nothing is in the store yet.
    let values = {
        let s = Storage::open(a.path(), storage_cfg()).unwrap();
        let v = fill(&s, 300);
        s.close().unwrap();
        v
    };
    let seg = segments(a.path())[2].clone();
    let (off, len) = flip_in_batch(&seg, 7);
    let gap = (base_of(&seg) + off, base_of(&seg) + off + len);

    let node = start(a.path(), store.path());
    let (got, gone) = read_topic(&node.storage, "dev/t");
    assert_eq!(gone, 1);
    let mut want = values.clone();
    want.retain(|v| got.contains(v));
    assert_eq!((got.len(), want.len()), (values.len() - 1, values.len() - 1));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sealed = rt.block_on(node.storage.roll()).unwrap();
    rt.block_on(node.tiering.wait_uploaded(sealed)).expect("everything after the gap is uploaded");
    let m = manifest(store.path());
    let entry = m.objects.iter().find(|o| o.base == base_of(&seg)).expect("the damaged segment was uploaded");
    assert_eq!(entry.gaps, vec![gap], "the manifest names the gap");
    assert!(m.objects.iter().filter(|o| o.base != entry.base).all(|o| o.gaps.is_empty()));
    let stats = node.tiering.stats();
    assert_eq!((stats.uploaded_gaps, stats.uploaded_gap_bytes), (1, len));
    assert_eq!(node.storage.stats().quarantined_batches, 1);
    let object = std::fs::read(store.path().join(&entry.key)).unwrap();
    let trailer = &object[object.len() - 12..];
    let n = silt_tiering::footer::footer_len(trailer).unwrap();
    let footer = silt_tiering::footer::decode(&object[object.len() - 12 - n..object.len() - 12]).unwrap();
    assert_eq!(footer.gaps, vec![(off, off + len)], "the footer names the gap");
    node.stop();

    // A node with an empty disk restores the rest from the bucket, the gap included.
    let b = tempfile::tempdir().unwrap();
    let node = start(b.path(), store.path());
    assert_eq!(read_topic(&node.storage, "dev/t"), (got, 0));
    node.stop();
}

/// Nothing reads the damaged segment before its upload: the upload's own scan finds the bad
/// batch, and the same upload repairs the segment and goes on (no failed attempt, no retry
/// after a back-off).
#[test]
fn a_flipped_byte_found_by_the_upload_scan_is_quarantined_in_the_same_upload() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let values = {
        let s = Storage::open(a.path(), storage_cfg()).unwrap();
        let v = fill(&s, 300);
        s.close().unwrap();
        v
    };
    let seg = segments(a.path())[1].clone();
    let (off, len) = flip_in_batch(&seg, 4);
    let gap = (base_of(&seg) + off, base_of(&seg) + off + len);

    let node = start(a.path(), store.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sealed = rt.block_on(node.storage.roll()).unwrap();
    rt.block_on(node.tiering.wait_uploaded(sealed)).expect("every segment is uploaded");
    let m = manifest(store.path());
    let entry = m.objects.iter().find(|o| o.base == base_of(&seg)).expect("the damaged segment was uploaded");
    assert_eq!(entry.gaps, vec![gap], "the manifest names the gap");
    assert!(m.objects.iter().filter(|o| o.base != entry.base).all(|o| o.gaps.is_empty()));
    let stats = node.tiering.stats();
    assert_eq!((stats.uploaded_gaps, stats.uploaded_gap_bytes), (1, len));
    assert_eq!(stats.upload_failures, 0, "repaired within the upload, not after a failed one");
    assert_eq!(node.storage.stats().quarantined_batches, 1);
    let (got, gone) = read_topic(&node.storage, "dev/t");
    assert_eq!((got.len(), gone), (values.len() - 1, 1), "all but the damaged record");
    assert!(got.iter().all(|v| values.contains(v)));
    node.stop();
}

#[test]
fn incomplete_multipart_uploads_of_earlier_nodes_are_aborted_at_start() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let node = start(a.path(), store.path());
    fill(&node.storage, 10);
    let epoch = node.tiering.stats().epoch;
    node.stop();
    // What `LocalFileSystem::put_multipart` leaves when the process dies mid-upload.
    let segs = store.path().join("segments");
    let stale = segs.join(format!("{:020}-{epoch:08}.seg#1", 1u64 << 40));
    std::fs::write(&stale, b"half an upload").unwrap();

    let node = start(a.path(), store.path());
    wait_until("the abort", || !stale.exists());
    assert_eq!(node.tiering.stats().aborted_uploads, 1);
    node.stop();
}
