//! Tiering against a real object store implementation (`object_store`'s local filesystem
//! store; the S3 path is covered end to end against SeaweedFS in tests/tiering/).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use silt_storage::{QueueName, Record, Storage, StorageConfig};
use silt_tiering::config::Tier;
use silt_tiering::manifest::Manifest;
use silt_tiering::{AckDurability, Policies, Tiering, TieringConfig, TopicPolicy, TopicRule};
use silt_types::{Partition, Timestamp};

fn record(topic: &str, value: Vec<u8>, ts: Timestamp) -> Record {
    Record {
        timestamp: ts,
        stream: topic.split('/').next().unwrap().into(),
        partition: Partition(0),
        topic: topic.into(),
        value: Bytes::from(value),
        ..Record::default()
    }
}

fn cfg(store: &Path) -> TieringConfig {
    TieringConfig {
        object_store: Some(format!("file://{}", store.display())),
        retention_check_interval_ms: 50,
        fence_check_interval_ms: 50,
        object_ack_window_ms: 20,
        ..TieringConfig::default()
    }
}

fn storage_cfg() -> StorageConfig {
    // A small tail cache, so reads of older data go to segments (or the store).
    StorageConfig { segment_bytes: 64 << 10, tail_cache_bytes: 64 << 10, ..StorageConfig::default() }
}

struct Node {
    tiering: Arc<Tiering>,
    storage: Arc<Storage>,
}

fn start(dir: &Path, cfg: TieringConfig, policies: Policies) -> Node {
    let tiering = Arc::new(Tiering::prepare(cfg, policies, dir, storage_cfg().max_batch_bytes).unwrap());
    let storage = Arc::new(Storage::open_seeded(dir, storage_cfg(), Vec::new(), tiering.seeds()).unwrap());
    tiering.attach(storage.clone()).unwrap();
    storage.wait_dispatched_blocking(storage.stats().log_end).unwrap();
    Node { tiering, storage }
}

fn rule(pattern: &str) -> TopicRule {
    TopicRule { pattern: pattern.into(), ..TopicRule::default() }
}

fn default_policies() -> Policies {
    Policies::new(TopicPolicy::default(), &[]).unwrap()
}

impl Node {
    fn stop(self) {
        self.tiering.shutdown();
        self.storage.close().unwrap();
    }

    fn topic(&self, topic: &str) -> Vec<(u64, Bytes)> {
        self.queue(&QueueName::Topic(topic.into()))
    }

    fn queue(&self, name: &QueueName) -> Vec<(u64, Bytes)> {
        let id = self.storage.queue_id(name).unwrap().unwrap_or_else(|| panic!("no queue {name:?}"));
        let (first, next) = self.storage.queue_bounds(id).unwrap();
        let got = self.storage.read_queue(id, first, (next.get() - first.get()) as usize).unwrap();
        got.into_iter().map(|(o, r)| (o.get(), r.value)).collect()
    }
}

/// The head manifest of a store, read as a starting node reads it (hint, then the versions
/// after it, deltas applied).
fn manifest(store: &Path) -> Manifest {
    let fs = object_store::local::LocalFileSystem::new_with_prefix(store).unwrap();
    let log = silt_tiering::manifest::ManifestLog::new(Arc::new(fs));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(log.latest()).unwrap().expect("a manifest")
}

/// Whether any segment object in the store holds `needle`.
fn store_holds(store: &Path, needle: &[u8]) -> bool {
    std::fs::read_dir(store.join("segments"))
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .any(|object| object.windows(needle.len()).any(|w| w == needle))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Appends `n` records of about 1 KiB over 3 topics; returns what each topic holds.
fn fill(s: &Storage, n: usize) -> Vec<Vec<u8>> {
    let mut values = Vec::new();
    for i in 0..n {
        let v: Vec<u8> = (0..1000).map(|j| (i * 31 + j) as u8).chain(i.to_be_bytes()).collect();
        s.append_blocking(&[record(&format!("dev/{}", i % 3), v.clone(), Timestamp::now())]).unwrap();
        values.push(v);
    }
    values
}

fn expected(values: &[Vec<u8>], t: usize) -> Vec<(u64, Bytes)> {
    values.iter().skip(t).step_by(3).enumerate().map(|(o, v)| (o as u64, Bytes::from(v.clone()))).collect()
}

#[test]
fn an_empty_data_directory_recovers_every_record_and_offset_from_the_store() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let node = start(a.path(), cfg(store.path()), default_policies());
    let values = fill(&node.storage, 600); // ~600 KiB: about ten 64 KiB segments
    let end = node.storage.stats().log_end;
    node.stop();
    let m = manifest(store.path());
    assert!(m.objects.len() >= 8, "{} objects", m.objects.len());
    assert!(m.end() >= end.get() - 16, "the shutdown sealed and uploaded the tail");

    let b = tempfile::tempdir().unwrap();
    let node = start(b.path(), cfg(store.path()), default_policies());
    for t in 0..3 {
        assert_eq!(node.topic(&format!("dev/{t}")), expected(&values, t), "topic dev/{t}");
    }
    assert_eq!(manifest(store.path()).epoch, m.epoch + 1);
    // The log continues where the bucket ends: new records neither overlap nor reuse offsets.
    let appended = node.storage.append_blocking(&[record("dev/0", b"new".to_vec(), Timestamp::now())]).unwrap();
    assert!(appended.positions[0].get() >= m.end());
    node.storage.wait_dispatched_blocking(appended.end).unwrap();
    assert_eq!(node.topic("dev/0").last().unwrap(), &(200, Bytes::from_static(b"new")));
    node.stop();
}

#[test]
fn evicted_segments_are_read_back_through_ranged_gets() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let node = start(a.path(), TieringConfig { hot_cache_bytes: 0, ..cfg(store.path()) }, default_policies());
    let values = fill(&node.storage, 600);
    let end = node.storage.stats().log_end;
    node.storage.wait_dispatched_blocking(end).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(node.storage.roll()).unwrap();
    let log_files = || std::fs::read_dir(a.path().join("log")).unwrap().count();
    wait_until("eviction", || log_files() <= 2);
    for t in 0..3 {
        assert_eq!(node.topic(&format!("dev/{t}")), expected(&values, t), "topic dev/{t}");
    }
    let stats = node.tiering.stats();
    assert!(stats.gets > 0);
    // 600 KiB in 1 MiB blocks with read-ahead: a handful of GETs, not one per record.
    assert!(stats.gets < 50, "{} GETs", stats.gets);
    node.stop();
}

#[test]
fn a_second_node_on_the_same_prefix_fences_the_first() {
    let store = tempfile::tempdir().unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = start(a.path(), cfg(store.path()), default_policies());
    fill(&first.storage, 100);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sealed = rt.block_on(first.storage.roll()).unwrap();
    rt.block_on(first.tiering.wait_uploaded(sealed)).unwrap();

    let second = start(b.path(), cfg(store.path()), default_policies());
    assert_eq!(second.topic("dev/0").len(), 34, "the second node serves what the first uploaded");
    // The first node finds out by itself (fence check), before it has anything to upload.
    wait_until("the fence check", || first.tiering.stats().fenced);
    assert!(first.storage.append_blocking(&[record("dev/0", b"x".to_vec(), Timestamp::now())]).is_err());
    let err = rt.block_on(first.tiering.wait_uploaded(sealed.add(1))).unwrap_err();
    assert!(err.to_string().contains("fenced"), "{err}");
    let m = manifest(store.path());
    assert_eq!(m.epoch, second.tiering.stats().epoch);
    second.stop();
    first.stop();
    assert_eq!(manifest(store.path()).epoch, m.epoch, "the fenced node never wrote again");
}

#[test]
fn object_acks_wait_until_the_store_holds_the_data() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let rules = [TopicRule { ack: Some(AckDurability::Object), ..rule("dev/#") }];
    let node = start(a.path(), cfg(store.path()), Policies::new(TopicPolicy::default(), &rules).unwrap());
    assert!(node.tiering.object_ack("dev/1") && !node.tiering.object_ack("other"));
    let appended = node.storage.append_blocking(&[record("dev/1", b"v".to_vec(), Timestamp::now())]).unwrap();
    assert!(manifest(store.path()).covered_end() < appended.end.get(), "nothing was uploaded yet");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(node.tiering.wait_uploaded(appended.end)).unwrap();
    assert!(manifest(store.path()).covered_end() >= appended.end.get(), "acknowledged only once the manifest names it");
    node.stop();
}

/// `ack = "object"` uploads the active segment's new bytes as tail objects: segments keep
/// their size (no seal per window), an empty data directory recovers the acknowledged records
/// from the tails, and once the segment is sealed and stored its tails go.
#[test]
fn object_acks_upload_tails_that_recover_and_give_way_to_the_sealed_segment() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let rules = [TopicRule { ack: Some(AckDurability::Object), ..rule("dev/#") }];
    let policies = || Policies::new(TopicPolicy::default(), &rules).unwrap();
    let node = start(a.path(), cfg(store.path()), policies());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut values = Vec::new();
    for i in 0..5u8 {
        let v = vec![i; 3000];
        let appended = node.storage.append_blocking(&[record("dev/1", v.clone(), Timestamp::now())]).unwrap();
        rt.block_on(node.tiering.wait_uploaded(appended.end)).unwrap();
        values.push(v);
    }
    let m = manifest(store.path());
    assert!(m.objects.is_empty() && m.tails.len() >= 2, "tails, not sealed segments: {m:?}");
    assert_eq!(std::fs::read_dir(a.path().join("log")).unwrap().count(), 1, "one segment, never sealed per window");

    // A node on an empty directory (a lost VM) gets every acknowledged record from the tails.
    let b = tempfile::tempdir().unwrap();
    let second = start(b.path(), cfg(store.path()), policies());
    let got: Vec<Vec<u8>> = second.topic("dev/1").into_iter().map(|(_, v)| v.to_vec()).collect();
    assert_eq!(got, values);
    // It writes on where the tails end, and its own acknowledgements work the same way.
    let more = second.storage.append_blocking(&[record("dev/1", b"after".to_vec(), Timestamp::now())]).unwrap();
    rt.block_on(second.tiering.wait_uploaded(more.end)).unwrap();
    assert_eq!(second.topic("dev/1").last().unwrap().0, 5);

    // Sealed and stored: the segment object replaces the tails, whose objects are deleted.
    let sealed = rt.block_on(second.storage.roll()).unwrap();
    wait_until("the sealed segment's object", || manifest(store.path()).end() >= sealed.get());
    let m = manifest(store.path());
    assert!(m.tails.is_empty() && m.objects.len() == 1, "{m:?}");
    let tails_left = || std::fs::read_dir(store.path().join("tails")).map_or(0, |d| d.count());
    wait_until("replaced tail objects deleted", || tails_left() == 0);
    second.stop();
    drop(node); // fenced by the second node
}

/// Objects an earlier node uploaded but no manifest names (an upload cut short by a fence) are
/// deleted when a node takes the prefix; named objects and the new node's own stay.
#[test]
fn a_new_node_deletes_the_objects_earlier_nodes_left_unnamed() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let first = start(a.path(), cfg(store.path()), default_policies());
    fill(&first.storage, 20);
    first.stop(); // seals and uploads: epoch 1's named segment object
    let named = manifest(store.path()).objects[0].key.clone();
    for stray in
        ["segments/00000000000099999999-00000001.seg", "tails/00000000000099999999-00000000000099999999-00000001.bin"]
    {
        let path = store.path().join(stray);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"orphan").unwrap();
    }
    let mine = store.path().join("segments/00000000000088888888-00000002.seg");
    std::fs::write(&mine, b"in flight").unwrap();

    let b = tempfile::tempdir().unwrap();
    let second = start(b.path(), cfg(store.path()), default_policies()); // epoch 2
    let exists = |k: &str| store.path().join(k).exists();
    wait_until("orphans deleted", || {
        !exists("segments/00000000000099999999-00000001.seg")
            && !exists("tails/00000000000099999999-00000000000099999999-00000001.bin")
    });
    assert!(exists(&named), "a named object stays");
    assert!(mine.exists(), "an object of the current epoch stays");
    second.stop();
}

#[test]
fn retention_deletes_expired_objects_and_the_manifest_stops_naming_them() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let rules = [TopicRule { retention_ms: Some(60_000), ..rule("old/#") }];
    let node = start(a.path(), cfg(store.path()), Policies::new(TopicPolicy::default(), &rules).unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let hour_ago = Timestamp(Timestamp::now().get() - 3_600_000);
    // A wildcard filter queue (a persistent session's) over both topics: the footers name it
    // with its first offset, found through the dispatcher's filter trie at each upload.
    let old_filter = QueueName::Filter("old/#".into());
    node.storage.register_filter_blocking(&silt_types::TopicFilter::new("old/#").unwrap()).unwrap();
    for i in 0..200u32 {
        node.storage.append_blocking(&[record("old/a", vec![i as u8; 1000], hour_ago)]).unwrap();
    }
    // A topic whose every message expires.
    for i in 0..7u8 {
        node.storage.append_blocking(&[record("old/gone", vec![i; 100], hour_ago)]).unwrap();
    }
    let sealed = rt.block_on(node.storage.roll()).unwrap();
    rt.block_on(node.tiering.wait_uploaded(sealed)).unwrap();
    // A fresh record keeps its object (and every later one) alive.
    let fresh = node.storage.append_blocking(&[record("old/a", b"fresh".to_vec(), Timestamp::now())]).unwrap();
    let sealed = rt.block_on(node.storage.roll()).unwrap();
    rt.block_on(node.tiering.wait_uploaded(sealed)).unwrap();
    node.storage.wait_dispatched_blocking(fresh.end).unwrap();

    wait_until("retention", || manifest(store.path()).objects.len() == 1);
    let m = manifest(store.path());
    assert!(m.start > 0 && m.objects[0].base == m.start);
    // The manifest is committed before the objects it dropped are deleted: wait for the deletes.
    let on_disk = || -> Vec<String> {
        std::fs::read_dir(store.path().join("segments"))
            .unwrap()
            .map(|e| format!("segments/{}", e.unwrap().file_name().to_string_lossy()))
            .collect()
    };
    wait_until("expired objects deleted from the store", || on_disk() == vec![m.objects[0].key.clone()]);
    // Readers skip what retention deleted.
    let got = node.topic("old/a");
    assert_eq!(got, vec![(200, Bytes::from_static(b"fresh"))]);
    assert_eq!(node.queue(&old_filter), vec![(207, Bytes::from_static(b"fresh"))]);
    node.stop();

    // A restart on an empty directory starts at the manifest's start and keeps every queue's
    // numbering, including a queue whose every entry was deleted.
    let b = tempfile::tempdir().unwrap();
    let node = start(b.path(), cfg(store.path()), default_policies());
    assert_eq!(node.storage.floor().get(), m.start);
    assert_eq!(node.topic("old/a"), vec![(200, Bytes::from_static(b"fresh"))]);
    let more = node.storage.append_blocking(&[record("old/gone", b"back".to_vec(), Timestamp::now())]).unwrap();
    node.storage.wait_dispatched_blocking(more.end).unwrap();
    assert_eq!(node.topic("old/gone"), vec![(7, Bytes::from_static(b"back"))]);
    // The filter queue keeps its numbering too: seeded from the footer that first names it.
    let back = [(207, Bytes::from_static(b"fresh")), (208, Bytes::from_static(b"back"))];
    assert_eq!(node.queue(&old_filter), back);
    node.stop();
}

#[test]
fn memory_tier_records_stay_off_the_store_and_hold_no_segment_back() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let node = start(a.path(), TieringConfig { hot_cache_bytes: 0, ..cfg(store.path()) }, default_policies());
    let secret = b"memory-only-payload-0123456789".to_vec();
    for i in 0..3u8 {
        let volatile =
            Record { volatile: true, ..record("mem/x", [secret.clone(), vec![i]].concat(), Timestamp::now()) };
        node.storage.append_blocking(&[volatile]).unwrap();
        node.storage.append_blocking(&[record("dev/0", format!("shared-{i}").into_bytes(), Timestamp::now())]).unwrap();
    }
    let end = node.storage.stats().log_end;
    node.storage.wait_dispatched_blocking(end).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sealed = rt.block_on(node.storage.roll()).unwrap();
    rt.block_on(node.tiering.wait_uploaded(sealed)).unwrap();
    let has = |needle: &[u8]| store_holds(store.path(), needle);
    assert!(has(b"shared-1") && !has(&secret), "the object carries stand-ins for memory records");
    // Unlike `tier = "local"`, the segment is evicted (its memory records die with the process
    // anyway); the shared records are read back from the store.
    let log_files = || std::fs::read_dir(a.path().join("log")).unwrap().count();
    wait_until("eviction", || log_files() <= 2);
    assert_eq!(node.topic("dev/0").len(), 3);
    node.stop();
}

#[test]
fn local_tier_messages_stay_off_the_store_and_keep_their_offsets() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let policies = || Policies::new(TopicPolicy::default(), &[TopicRule { tier: Some(Tier::Local), ..rule("raw/#") }]);
    let cfg = TieringConfig { hot_cache_bytes: 0, ..cfg(store.path()) };
    let node = start(a.path(), cfg.clone(), policies().unwrap());
    let secret = b"local-only-payload-0123456789".to_vec();
    for i in 0..3u8 {
        node.storage.append_blocking(&[record("raw/x", [secret.clone(), vec![i]].concat(), Timestamp::now())]).unwrap();
        node.storage.append_blocking(&[record("dev/0", format!("shared-{i}").into_bytes(), Timestamp::now())]).unwrap();
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sealed = rt.block_on(node.storage.roll()).unwrap();
    rt.block_on(node.tiering.wait_uploaded(sealed)).unwrap();
    // The object holds the shared messages but not the local ones; the local segment, their
    // only copy, is not evicted even with no hot cache.
    let has = |needle: &[u8]| store_holds(store.path(), needle);
    assert!(has(b"shared-1") && !has(&secret));
    assert_eq!(node.topic("raw/x").len(), 3, "still served from the local disk");
    node.stop();

    // Without the disk they are gone, and the topic's numbering goes on where it was.
    let b = tempfile::tempdir().unwrap();
    let node = start(b.path(), cfg, policies().unwrap());
    let id = node.storage.queue_id(&QueueName::Topic("raw/x".into())).unwrap().unwrap();
    let entries = node.storage.read_index(id, silt_types::Offset(0), 10).unwrap();
    assert_eq!(entries.len(), 3);
    for (_, e) in &entries {
        assert_eq!(node.storage.read_record(e).unwrap_err().kind(), silt_storage::ErrorKind::Expired);
    }
    assert_eq!(node.topic("dev/0").len(), 3);
    let next = node.storage.append_blocking(&[record("raw/x", b"new".to_vec(), Timestamp::now())]).unwrap();
    node.storage.wait_dispatched_blocking(next.end).unwrap();
    assert_eq!(node.storage.queue_bounds(id).unwrap().1.get(), 4);
    node.stop();
}

#[test]
fn retention_by_size_keeps_the_newest_bytes_of_a_topic() {
    let store = tempfile::tempdir().unwrap();
    let a = tempfile::tempdir().unwrap();
    let rules = [TopicRule { retention_bytes: Some(100_000), ..rule("big/#") }];
    let node = start(a.path(), cfg(store.path()), Policies::new(TopicPolicy::default(), &rules).unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Ten objects of about 50 KB each.
    for seg in 0..10u8 {
        for i in 0..50u8 {
            node.storage.append_blocking(&[record("big/t", vec![seg ^ i; 1000], Timestamp::now())]).unwrap();
        }
        let sealed = rt.block_on(node.storage.roll()).unwrap();
        rt.block_on(node.tiering.wait_uploaded(sealed)).unwrap();
    }
    // Objects go while the newer ones still hold at least 100 KB of the topic: 2 or 3 remain.
    wait_until("retention by size", || manifest(store.path()).objects.len() <= 3);
    std::thread::sleep(Duration::from_millis(300)); // more rounds delete nothing more
    let kept = manifest(store.path()).objects.len();
    assert!((2..=3).contains(&kept), "{kept} objects kept");
    let held = node.topic("big/t");
    assert!(held.len() >= 100 && held.len() <= 150, "{} records held", held.len());
    assert_eq!(held.last().unwrap().0, 499, "offsets are unchanged");
    node.stop();
}

#[test]
fn a_fenced_node_learns_at_its_next_manifest_commit_too() {
    let store = tempfile::tempdir().unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let slow_check = TieringConfig { fence_check_interval_ms: 3_600_000, ..cfg(store.path()) };
    let first = start(a.path(), slow_check, default_policies());
    let second = start(b.path(), cfg(store.path()), default_policies());
    fill(&first.storage, 10);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sealed = rt.block_on(first.storage.roll()).unwrap();
    let err = rt.block_on(first.tiering.wait_uploaded(sealed)).unwrap_err();
    assert!(err.to_string().contains("fenced"), "{err}");
    assert!(first.storage.append_blocking(&[record("dev/0", b"x".to_vec(), Timestamp::now())]).is_err());
    assert_eq!(manifest(store.path()).epoch, second.tiering.stats().epoch);
    second.stop();
    first.stop();
}
