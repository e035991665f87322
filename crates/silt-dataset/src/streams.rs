//! The stream registry: which streams (Kafka topics) exist and how many partitions each has,
//! fixed when the stream is created — by its first record (an MQTT publish or a Kafka produce
//! that auto-creates it, with the policy's `partitions`) or by CreateTopics.
//!
//! Durability: registrations live in the internal stream `__silt_streams` (key: stream name;
//! value: JSON, or empty for a deletion), replayed at start-up like the other internal
//! streams. A new stream's registration is appended in the same batch as its first record,
//! and in every batch for it until one such batch is durable, so no durable record ever
//! belongs to a stream the registry could forget.

use std::collections::HashMap;
use std::sync::RwLock;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use silt_storage::{Record, Storage};
use silt_types::{Offset, Partition, Timestamp};

use crate::internal;

/// Internal stream of stream registrations.
pub const STREAMS_STREAM: &str = "__silt_streams";

/// Most partitions a stream may have.
pub const MAX_PARTITIONS: u32 = 10_000;

/// A registered stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMeta {
    pub partitions: u32,
    /// When it was created (ms since epoch).
    pub created_ms: i64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    meta: StreamMeta,
    /// A batch carrying the registration is known durable.
    durable: bool,
}

#[derive(Debug, Default)]
pub struct Streams {
    map: RwLock<HashMap<String, Entry>>,
}

impl Streams {
    /// Replays `__silt_streams`. Returns the registry and how many records were replayed.
    pub fn load(storage: &Storage) -> silt_storage::Result<(Streams, u64)> {
        let mut map = HashMap::new();
        let from = internal::checkpoint(storage, STREAMS_STREAM)?;
        let replayed = internal::scan(storage, STREAMS_STREAM, from, |_, r| {
            let Some(name) = r.key.as_deref().and_then(|k| std::str::from_utf8(k).ok()) else { return };
            if r.value.is_empty() {
                map.remove(name);
                return;
            }
            match serde_json::from_slice::<StreamMeta>(&r.value) {
                Ok(meta) if (1..=MAX_PARTITIONS).contains(&meta.partitions) => {
                    map.insert(name.to_owned(), Entry { meta, durable: true });
                }
                _ => tracing::warn!(stream = %name, "unreadable stream registration skipped"),
            }
        })?;
        Ok((Streams { map: RwLock::new(map) }, replayed))
    }

    pub fn get(&self, stream: &str) -> Option<StreamMeta> {
        self.map.read().expect("invariant: lock not poisoned").get(stream).map(|e| e.meta)
    }

    /// Every registered stream, by name.
    pub fn list(&self) -> Vec<(String, StreamMeta)> {
        let map = self.map.read().expect("invariant: lock not poisoned");
        let mut out: Vec<_> = map.iter().map(|(k, e)| (k.clone(), e.meta)).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    pub fn len(&self) -> usize {
        self.map.read().expect("invariant: lock not poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stream's partitions, registering it with `partitions` if it is new. The record
    /// returned, if any, must go in the same batch as the records for the stream; call
    /// [`Self::confirm`] once that batch is durable.
    pub fn ensure(&self, stream: &str, partitions: u32) -> (StreamMeta, Option<Record>) {
        if let Some(e) = self.map.read().expect("invariant: lock not poisoned").get(stream)
            && e.durable
        {
            return (e.meta, None);
        }
        let mut map = self.map.write().expect("invariant: lock not poisoned");
        let e = map.entry(stream.to_owned()).or_insert_with(|| Entry {
            meta: StreamMeta { partitions: partitions.clamp(1, MAX_PARTITIONS), created_ms: Timestamp::now().get() },
            durable: false,
        });
        (e.meta, (!e.durable).then(|| registration(stream, &e.meta)))
    }

    /// A batch carrying `stream`'s registration is durable.
    pub fn confirm(&self, stream: &str) {
        if let Some(e) = self.map.write().expect("invariant: lock not poisoned").get_mut(stream) {
            e.durable = true;
        }
    }

    /// Creates `stream` explicitly (CreateTopics). `Err` if it exists. The record must be
    /// appended (and be durable) before the stream is announced; on failure, [`Self::forget`].
    pub fn create(&self, stream: &str, partitions: u32) -> Result<Record, StreamMeta> {
        let mut map = self.map.write().expect("invariant: lock not poisoned");
        if let Some(e) = map.get(stream) {
            return Err(e.meta);
        }
        let meta = StreamMeta { partitions: partitions.clamp(1, MAX_PARTITIONS), created_ms: Timestamp::now().get() };
        map.insert(stream.to_owned(), Entry { meta, durable: false });
        Ok(registration(stream, &meta))
    }

    /// Removes `stream` (DeleteTopics, or a creation whose record failed). Returns the
    /// tombstone to append.
    pub fn forget(&self, stream: &str) -> Option<Record> {
        self.map.write().expect("invariant: lock not poisoned").remove(stream).map(|_| tombstone(stream))
    }

    /// Every registration, for a dump of `__silt_streams`.
    pub fn dump(&self) -> Vec<Record> {
        self.list().iter().map(|(name, meta)| registration(name, meta)).collect()
    }
}

fn registration(stream: &str, meta: &StreamMeta) -> Record {
    Record {
        timestamp: Timestamp::now(),
        stream: STREAMS_STREAM.into(),
        partition: Partition(0),
        key: Some(Bytes::copy_from_slice(stream.as_bytes())),
        value: Bytes::from(serde_json::to_vec(meta).expect("invariant: plain data serializes")),
        ..Record::default()
    }
}

fn tombstone(stream: &str) -> Record {
    Record {
        timestamp: Timestamp::now(),
        stream: STREAMS_STREAM.into(),
        partition: Partition(0),
        key: Some(Bytes::copy_from_slice(stream.as_bytes())),
        ..Record::default()
    }
}

/// Where a dump of the registry starts (for a checkpoint marker).
pub fn end(storage: &Storage) -> silt_storage::Result<Offset> {
    internal::stream_end(storage, STREAMS_STREAM)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn storage(dir: &std::path::Path) -> Storage {
        Storage::open(dir, silt_storage::StorageConfig::default()).unwrap()
    }

    #[test]
    fn registrations_survive_a_restart_and_deletions_too() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = storage(dir.path());
            let streams = Streams::load(&s).unwrap().0;
            let (meta, rec) = streams.ensure("factory", 3);
            assert_eq!(meta.partitions, 3);
            let rec = rec.expect("new: a registration to append");
            assert!(streams.ensure("factory", 9).1.is_some(), "not durable yet: every batch carries it");
            s.append_blocking(&[rec]).unwrap();
            streams.confirm("factory");
            assert!(streams.ensure("factory", 9).1.is_none());
            assert_eq!(streams.ensure("factory", 9).0.partitions, 3, "fixed at creation");
            let created = streams.create("orders", 2).unwrap();
            s.append_blocking(&[created]).unwrap();
            assert_eq!(streams.create("orders", 5).unwrap_err().partitions, 2);
            let gone = streams.forget("orders").unwrap();
            let a = s.append_blocking(&[gone]).unwrap();
            s.wait_dispatched_blocking(a.end).unwrap();
        }
        let s = storage(dir.path());
        let streams = Streams::load(&s).unwrap().0;
        assert_eq!(streams.get("factory").map(|m| m.partitions), Some(3));
        assert_eq!(streams.get("orders"), None);
    }
    /// A bad disk: the batch holding a registration fails its checks and no good copy exists
    /// (not uploaded yet). Start-up goes on without it instead of refusing to start.
    #[test]
    fn a_registration_lost_with_its_batch_is_skipped_and_the_rest_load() {
        let dir = tempfile::tempdir().unwrap();
        let config = silt_storage::StorageConfig {
            segment_bytes: 4096,
            tail_cache_bytes: 0,
            ..silt_storage::StorageConfig::default()
        };
        {
            let s = Storage::open(dir.path(), config.clone()).unwrap();
            let streams = Streams::load(&s).unwrap().0;
            s.append_blocking(&[streams.create("factory", 3).unwrap()]).unwrap();
            s.append_blocking(&[streams.create("orders", 2).unwrap()]).unwrap();
            s.append_blocking(&[streams.create("invoices", 4).unwrap()]).unwrap();
            // Filler in another stream until the registrations' segment is sealed.
            for i in 0..100 {
                let (_, r) = streams.ensure("filler", 1);
                let mut batch: Vec<_> = r.into_iter().collect();
                batch.push(silt_storage::Record {
                    stream: "filler".into(),
                    value: bytes::Bytes::from(vec![b'x'; 200 + i]),
                    ..silt_storage::Record::default()
                });
                s.append_blocking(&batch).unwrap();
                streams.confirm("filler");
            }
            s.close().unwrap();
        }
        let mut segments: Vec<_> = std::fs::read_dir(dir.path().join("log"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        segments.sort();
        assert!(segments.len() > 1, "the registrations' segment is sealed");
        let mut data = std::fs::read(&segments[0]).unwrap();
        let at = data.windows(6).position(|w| w == b"orders").expect("the registration is in the first segment");
        data[at + 8] ^= 0x10;
        std::fs::write(&segments[0], data).unwrap();

        /// An object store that holds no copy (the segment was never uploaded).
        struct Empty;
        impl silt_storage::ColdReader for Empty {
            fn read(&self, pos: silt_types::LogPosition, _: usize) -> silt_storage::Result<bytes::Bytes> {
                Err(silt_storage::Error::Unavailable(format!("nothing uploaded at {pos}")))
            }
        }
        let s = Storage::open(dir.path(), config).unwrap();
        s.set_cold_reader(std::sync::Arc::new(Empty));
        let streams = Streams::load(&s).expect("start-up goes on past a lost registration").0;
        assert_eq!(s.stats().quarantined_batches, 1);
        assert_eq!(streams.get("factory").map(|m| m.partitions), Some(3));
        assert_eq!(streams.get("invoices").map(|m| m.partitions), Some(4));
        assert_eq!(streams.get("orders"), None, "lost with its batch");
    }
}
