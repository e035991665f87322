//! Helpers shared by the storage integration tests.
#![allow(dead_code)]

use std::path::Path;

use bytes::Bytes;
use silt_storage::{FsyncPolicy, QueueName, Record, Storage, StorageConfig};
use silt_types::{Offset, Partition, Timestamp};

pub fn small_config() -> StorageConfig {
    StorageConfig {
        segment_bytes: 64 * 1024,
        tail_cache_bytes: 256 * 1024,
        index_block_cache_bytes: 1 << 20,
        index_write_buffer_bytes: 1 << 20,
        queue_cache_entries: 64,
        ..StorageConfig::default()
    }
}

pub fn open(dir: &Path) -> Storage {
    Storage::open(dir, small_config()).expect("open storage")
}

pub fn open_with_fsync(dir: &Path, fsync: FsyncPolicy) -> Storage {
    Storage::open(dir, StorageConfig { fsync, ..small_config() }).expect("open storage")
}

pub fn record(stream: &str, partition: u32, topic: &str, value: impl Into<Bytes>) -> Record {
    Record {
        timestamp: Timestamp(1_700_000_000_000),
        stream: stream.into(),
        partition: Partition(partition),
        topic: topic.into(),
        key: Some(Bytes::copy_from_slice(topic.as_bytes())),
        value: value.into(),
        headers: vec![("content-type".into(), Bytes::from_static(b"text/plain"))],
        attrs: 1,
        ..Record::default()
    }
}

/// Every record of a queue, in order, checking offsets are dense from the first.
pub fn queue(storage: &Storage, name: &QueueName) -> Vec<Record> {
    let Some(id) = storage.queue_id(name).expect("lookup") else {
        return Vec::new();
    };
    let (first, next) = storage.queue_bounds(id).expect("bounds");
    let all = storage.read_queue(id, first, usize::MAX).expect("read queue");
    assert_eq!(all.len() as u64, next.get() - first.get(), "queue {name:?} has holes");
    for (i, (off, _)) in all.iter().enumerate() {
        assert_eq!(*off, Offset(first.get() + i as u64), "queue {name:?} offsets not dense");
    }
    all.into_iter().map(|(_, r)| r).collect()
}

pub fn topic(t: &str) -> QueueName {
    QueueName::Topic(t.into())
}

pub fn filter(f: &str) -> QueueName {
    QueueName::Filter(f.into())
}
