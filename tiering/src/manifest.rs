//! The manifest: which objects hold which log positions, and whose epoch may write.
//!
//! Each version is its own object, `manifest/{version:020}.json`, written with a conditional
//! create (S3 `If-None-Match: *`; an atomic hard link on a local directory). Two writers that
//! both try to publish version N+1 cannot both succeed: the loser reads the winner's version,
//! sees a newer epoch and stops writing (it is fenced). A node takes ownership at start by
//! publishing a version with the next epoch, which fences whoever wrote before it.
//!
//! Most versions are deltas: the objects added since a checkpoint (a full version written every
//! `CHECKPOINT_EVERY` commits), the current start, queue floors changed since, and the tails.
//! So a commit writes a few KB however many objects the prefix holds; the full list is written
//! once per checkpoint. A delta names its checkpoint (`base`); the manifest it stands for is the
//! checkpoint's objects from `start` on, then its own.
//!
//! `manifest.json` is a copy of the newest checkpoint; it is a hint for finding the head
//! without LIST: readers start from its version and probe the versions after it until one is
//! missing. A stale hint costs probes, never correctness. Versions older than the newest
//! checkpoint (but the last few) are deleted when a checkpoint is written.
//!
//! `tails` name the acknowledged part of the active segment for `ack = "object"` topics: raw
//! log bytes, back to back from the end of the last segment object (the first starts with the
//! segment's header). When the segment is sealed and uploaded as an object, the commit that
//! names it drops its tails, and their objects are deleted.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::store::retry;

const HINT: &str = "manifest.json";
/// Versions kept before the newest checkpoint (for readers still probing from an older hint).
const KEEP_VERSIONS: u64 = 10;
/// A full version every this many commits.
const CHECKPOINT_EVERY: u64 = 64;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub version: u64,
    /// The epoch of the node that wrote this version; only it may write the next one.
    pub epoch: u64,
    pub writer: String,
    /// The first log position still held (retention moves it forward).
    pub start: u64,
    /// Segment objects, in log order, back to back from `start`'s object on.
    pub objects: Vec<ObjectEntry>,
    /// Next offset of each queue whose entries retention deleted entirely, so a rebuilt index
    /// continues its numbering (queues with entries in `objects` are in their footers).
    #[serde(default)]
    pub queue_floors: std::collections::BTreeMap<String, u64>,
    /// Pieces of the active segment uploaded for object acknowledgements, in order, from
    /// [`Manifest::end`] on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tails: Vec<TailEntry>,
    /// Set in a stored delta: the checkpoint version it extends (see the module doc). A
    /// manifest handed out by [`ManifestLog`] is always whole, with no `base`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<u64>,
}

/// Log bytes `[base, end)` of the active segment, stored as they are in the segment file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TailEntry {
    pub key: String,
    pub base: u64,
    pub end: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectEntry {
    /// Key relative to the store's prefix.
    pub key: String,
    /// Log positions `[base, end)`.
    pub base: u64,
    pub end: u64,
    /// Object size, footer included.
    pub size: u64,
    pub min_ts: i64,
    pub max_ts: i64,
    /// Log positions `[start, end)` of bytes quarantined before the upload (their records are
    /// lost): also in the object's footer, named here so the gap shows without reading it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<(u64, u64)>,
    /// Record bytes per stream (Kafka topic, first MQTT topic level), from the footer's
    /// partition spans: what `silt streams` and `silt_stream_bytes` show. Record bytes, not
    /// object bytes (no batch framing, no footer). Empty in objects uploaded by versions
    /// before this field (their streams' sizes are then not known).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub streams: std::collections::BTreeMap<String, u64>,
}

impl ObjectEntry {
    /// Per-stream record bytes of a footer's partition spans (`stream/partition`).
    pub fn stream_bytes(partitions: &[crate::footer::Span]) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        for s in partitions {
            let stream = s.name.rsplit_once('/').map_or(s.name.as_str(), |(stream, _)| stream);
            *out.entry(stream.to_owned()).or_insert(0) += s.bytes;
        }
        out
    }
}

impl Manifest {
    /// Decodes a stored version (JSON, as [`ManifestLog::commit`] writes it; a delta stays a
    /// delta). The bytes come from the object store: nothing in them is trusted.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The log position just past the last segment object (where the active segment starts
    /// once every sealed segment is uploaded).
    pub fn end(&self) -> u64 {
        self.objects.last().map_or(self.start, |o| o.end)
    }

    /// The log position just past the last byte in the store, tails included.
    pub fn covered_end(&self) -> u64 {
        self.tails.last().map_or(self.end(), |t| t.end)
    }
}

/// What a commit found.
#[derive(Debug)]
pub enum Commit {
    Done,
    /// Another writer published this version first; here is the newest manifest.
    Lost(Box<Manifest>),
}

pub struct ManifestLog {
    store: Arc<dyn ObjectStore>,
    /// The newest checkpoint this writer knows (written or read), and the lowest version not
    /// yet deleted.
    state: tokio::sync::Mutex<(Option<Manifest>, u64)>,
}

fn version_path(v: u64) -> Path {
    Path::from(format!("manifest/{v:020}.json"))
}

impl ManifestLog {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store, state: tokio::sync::Mutex::new((None, 1)) }
    }

    /// A stored version as written (a delta stays a delta).
    async fn get_raw(&self, path: &Path) -> Result<Option<Manifest>, object_store::Error> {
        let got = retry("read manifest", || async { self.store.get(path).await?.bytes().await }).await;
        match got {
            Ok(b) => Manifest::decode(&b)
                .map(Some)
                .map_err(|e| object_store::Error::Generic { store: "manifest", source: format!("{path}: {e}").into() }),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The manifest a stored version stands for, given the checkpoint it may extend. Public
    /// for the fuzz target only, with [`ManifestLog::stored_form`].
    #[doc(hidden)]
    pub fn resolve(stored: Manifest, checkpoint: Option<&Manifest>) -> Option<Manifest> {
        let Some(base) = stored.base else { return Some(stored) };
        let cp = checkpoint.filter(|c| c.version == base)?;
        let mut m = stored;
        let mut objects: Vec<ObjectEntry> = cp.objects.iter().filter(|o| o.base >= m.start).cloned().collect();
        objects.extend(m.objects.drain(..).filter(|o| o.base >= m.start));
        m.objects = objects;
        let mut floors = cp.queue_floors.clone();
        floors.append(&mut m.queue_floors);
        m.queue_floors = floors;
        m.base = None;
        Some(m)
    }

    /// The newest manifest, or `None` for an empty prefix.
    pub async fn latest(&self) -> Result<Option<Manifest>, object_store::Error> {
        // A writer may delete the checkpoint a probe started from; start again from the hint.
        for _ in 0..5 {
            let mut checkpoint = self.get_raw(&Path::from(HINT)).await?;
            let mut head = checkpoint.clone();
            let mut next = head.as_ref().map_or(1, |m| m.version + 1);
            let mut broken = false;
            while let Some(stored) = self.get_raw(&version_path(next)).await? {
                if stored.base.is_none() {
                    checkpoint = Some(stored.clone());
                } else if checkpoint.as_ref().map(|c| c.version) != stored.base {
                    let base = stored.base.unwrap_or_default();
                    checkpoint = self.get_raw(&version_path(base)).await?;
                }
                match Self::resolve(stored, checkpoint.as_ref()) {
                    Some(m) => head = Some(m),
                    None => {
                        broken = true;
                        break;
                    }
                }
                next += 1;
            }
            // A writer moves the hint before it deletes old versions: a hint at or past the
            // version found missing means this probe ran into deleted ones, not the head.
            if !broken && self.get_raw(&Path::from(HINT)).await?.is_some_and(|h| h.version >= next) {
                broken = true;
            }
            if !broken {
                let mut state = self.state.lock().await;
                if let Some(c) = checkpoint.filter(|c| c.base.is_none()) {
                    state.1 = state.1.max(c.version.saturating_sub(KEEP_VERSIONS + CHECKPOINT_EVERY)).max(1);
                    state.0 = Some(c);
                }
                return Ok(head);
            }
        }
        Err(object_store::Error::Generic {
            store: "manifest",
            source: "a delta's checkpoint kept disappearing while reading; is another writer busy?".into(),
        })
    }

    /// The version after `version`, if someone published it (one GET; no LIST). Only its
    /// header (version, epoch, writer) is meaningful: it may be a delta.
    pub async fn successor(&self, version: u64) -> Result<Option<Manifest>, object_store::Error> {
        match self.store.get(&version_path(version + 1)).await {
            Ok(r) => {
                let b = r.bytes().await?;
                Manifest::decode(&b).map(Some).map_err(|e| object_store::Error::Generic {
                    store: "manifest",
                    source: format!("version {}: {e}", version + 1).into(),
                })
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// What to store for `m`: a delta against the known checkpoint, or (every
    /// `CHECKPOINT_EVERY` versions, or with no checkpoint known) `m` whole.
    #[doc(hidden)]
    pub fn stored_form(m: &Manifest, checkpoint: Option<&Manifest>) -> Manifest {
        match checkpoint {
            Some(cp) if m.version > cp.version && m.version - cp.version < CHECKPOINT_EVERY => {
                let cp_end = cp.end();
                let floors = m
                    .queue_floors
                    .iter()
                    .filter(|(k, v)| cp.queue_floors.get(*k) != Some(*v))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                Manifest {
                    objects: m.objects.iter().filter(|o| o.base >= cp_end).cloned().collect(),
                    queue_floors: floors,
                    base: Some(cp.version),
                    ..m.clone()
                }
            }
            _ => Manifest { base: None, ..m.clone() },
        }
    }

    /// Publishes `m` as version `m.version`, unless someone else did first.
    pub async fn commit(&self, m: &Manifest) -> Result<Commit, object_store::Error> {
        let mut state = self.state.lock().await;
        let stored = Self::stored_form(m, state.0.as_ref());
        let body = Bytes::from(serde_json::to_vec_pretty(&stored).expect("invariant: the manifest serializes"));
        let path = version_path(m.version);
        let opts = || PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        let put =
            retry("write manifest", || self.store.put_opts(&path, PutPayload::from_bytes(body.clone()), opts())).await;
        match put {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                // Our own earlier attempt may have landed before its response was lost.
                drop(state);
                let newest = self.latest().await?.unwrap_or_default();
                if newest.version == m.version && newest.epoch == m.epoch && newest.writer == m.writer {
                    return Ok(Commit::Done);
                }
                return Ok(Commit::Lost(Box::new(newest)));
            }
            Err(e) => return Err(e),
        }
        if stored.base.is_none() {
            if let Err(e) = self.store.put(&Path::from(HINT), PutPayload::from_bytes(body)).await {
                tracing::warn!(error = %e, "manifest hint not updated; readers will probe forward");
            }
            let keep_from = m.version.saturating_sub(KEEP_VERSIONS);
            for v in state.1..keep_from {
                let _ = self.store.delete(&version_path(v)).await;
            }
            state.1 = state.1.max(keep_from);
            state.0 = Some(stored);
        }
        Ok(Commit::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::local::LocalFileSystem;

    fn store() -> (tempfile::TempDir, Arc<dyn ObjectStore>) {
        let d = tempfile::tempdir().unwrap();
        let s: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(d.path()).unwrap());
        (d, s)
    }

    fn object(base: u64) -> ObjectEntry {
        ObjectEntry {
            key: format!("segments/{base:020}"),
            base,
            end: base + 100,
            size: 120,
            min_ts: 0,
            max_ts: 0,
            gaps: Vec::new(),
            streams: Default::default(),
        }
    }

    /// A writer commits 200 versions (objects added, retention moving the start, queue floors,
    /// tails): a reader starting cold finds each head whole; stored versions are deltas but for
    /// one checkpoint every 64; old versions are deleted.
    #[tokio::test]
    async fn deltas_and_checkpoints_give_back_the_whole_manifest() {
        let (d, s) = store();
        let writer = ManifestLog::new(s.clone());
        let mut m = Manifest { format: 1, epoch: 1, writer: "w".into(), ..Manifest::default() };
        for v in 1..=200u64 {
            m.version = v;
            m.objects.push(object(v * 100));
            if v % 30 == 0 {
                // Retention: the oldest ten objects go, and a queue's floor is recorded.
                m.start = m.objects[10].base;
                m.objects.drain(..10);
                m.queue_floors.insert(format!("t:gone/{v}"), v);
            }
            m.tails = if v % 2 == 0 {
                vec![TailEntry { key: format!("tails/{v}"), base: m.end(), end: m.end() + 7 }]
            } else {
                vec![]
            };
            assert!(matches!(writer.commit(&m).await.unwrap(), Commit::Done));
            if v % 37 == 0 || v == 200 {
                let reader = ManifestLog::new(s.clone());
                assert_eq!(reader.latest().await.unwrap().as_ref(), Some(&m), "version {v}");
            }
        }
        let stored: Vec<Manifest> = std::fs::read_dir(d.path().join("manifest"))
            .unwrap()
            .map(|e| serde_json::from_slice(&std::fs::read(e.unwrap().path()).unwrap()).unwrap())
            .collect();
        assert!(stored.len() <= (KEEP_VERSIONS + CHECKPOINT_EVERY) as usize, "{} versions kept", stored.len());
        let full = stored.iter().filter(|v| v.base.is_none()).count();
        assert!((1..=2).contains(&full), "{full} full versions among {}", stored.len());
        let biggest_delta = stored.iter().filter(|v| v.base.is_some()).map(|v| v.objects.len()).max().unwrap();
        assert!(biggest_delta < CHECKPOINT_EVERY as usize, "a delta lists {biggest_delta} objects");
        // The writer's next start reads the same head and writes deltas against it.
        let restarted = ManifestLog::new(s.clone());
        let head = restarted.latest().await.unwrap().unwrap();
        m.version = 201;
        m.epoch = 2;
        assert_eq!(head.version, 200);
        assert!(matches!(restarted.commit(&m).await.unwrap(), Commit::Done));
        assert_eq!(ManifestLog::new(s).latest().await.unwrap(), Some(m));
    }

    #[tokio::test]
    async fn versions_are_created_once_and_the_head_is_found_past_a_stale_hint() {
        let (_d, s) = store();
        let log = ManifestLog::new(s.clone());
        assert_eq!(log.latest().await.unwrap(), None);
        let mut m = Manifest { format: 1, version: 1, epoch: 1, writer: "a".into(), ..Manifest::default() };
        assert!(matches!(log.commit(&m).await.unwrap(), Commit::Done));
        m.version = 2;
        assert!(matches!(log.commit(&m).await.unwrap(), Commit::Done));
        // A second writer racing for version 2 loses and learns the head.
        let other = Manifest { format: 1, version: 2, epoch: 2, writer: "b".into(), ..Manifest::default() };
        match log.commit(&other).await.unwrap() {
            Commit::Lost(head) => assert_eq!((head.version, head.epoch), (2, 1)),
            Commit::Done => panic!("a second writer published the same version"),
        }
        // A stale hint: version 3 lands but the hint still says 2.
        let v3 = Manifest { version: 3, epoch: 3, writer: "c".into(), ..m.clone() };
        s.put_opts(
            &version_path(3),
            PutPayload::from(serde_json::to_vec(&v3).unwrap()),
            PutOptions { mode: PutMode::Create, ..Default::default() },
        )
        .await
        .unwrap();
        assert_eq!(log.latest().await.unwrap().unwrap().epoch, 3);
    }

    /// Manifests written before per-stream sizes still read (their objects' streams empty),
    /// and the figures survive a round trip.
    #[test]
    fn object_stream_bytes_default_when_absent_and_round_trip() {
        let old = br#"{"format":1,"version":3,"epoch":1,"writer":"n","start":0,
            "objects":[{"key":"segments/0","base":0,"end":100,"size":120,"min_ts":0,"max_ts":0}]}"#;
        let m = Manifest::decode(old).unwrap();
        assert!(m.objects[0].streams.is_empty());
        let spans = [
            crate::footer::Span { name: "alpha/0".into(), bytes: 300, ..Default::default() },
            crate::footer::Span { name: "alpha/1".into(), bytes: 200, ..Default::default() },
            crate::footer::Span { name: "a/b/2".into(), bytes: 7, ..Default::default() },
        ];
        let mut o = object(0);
        o.streams = ObjectEntry::stream_bytes(&spans);
        assert_eq!(o.streams, [("a/b".to_owned(), 7), ("alpha".to_owned(), 500)].into_iter().collect());
        let m = Manifest { objects: vec![o], ..Manifest::default() };
        assert_eq!(Manifest::decode(&serde_json::to_vec(&m).unwrap()).unwrap(), m);
    }
}
