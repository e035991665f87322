//! The manifest: which objects hold which log positions, and whose epoch may write.
//!
//! Each version is its own object, `manifest/{version:020}.json`, written with a conditional
//! create (S3 `If-None-Match: *`; an atomic hard link on a local directory). Two writers that
//! both try to publish version N+1 cannot both succeed: the loser reads the winner's version,
//! sees a newer epoch and stops writing (it is fenced). A node takes ownership at start by
//! publishing a version with the next epoch, which fences whoever wrote before it.
//!
//! `manifest.json` is a copy of the newest version, rewritten after each successful commit; it
//! is a hint for finding the head without LIST: readers start from its version and probe the
//! versions after it until one is missing. A stale hint costs a probe, never correctness.
//! Old versions are deleted a few commits later.
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
const KEEP_VERSIONS: u64 = 10;

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
}

impl Manifest {
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
}

fn version_path(v: u64) -> Path {
    Path::from(format!("manifest/{v:020}.json"))
}

impl ManifestLog {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    async fn get(&self, path: &Path) -> Result<Option<Manifest>, object_store::Error> {
        let got = retry("read manifest", || async { self.store.get(path).await?.bytes().await }).await;
        match got {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| object_store::Error::Generic { store: "manifest", source: format!("{path}: {e}").into() }),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The newest manifest, or `None` for an empty prefix.
    pub async fn latest(&self) -> Result<Option<Manifest>, object_store::Error> {
        let mut head = self.get(&Path::from(HINT)).await?;
        let mut next = head.as_ref().map_or(1, |m| m.version + 1);
        while let Some(m) = self.get(&version_path(next)).await? {
            next = m.version + 1;
            head = Some(m);
        }
        Ok(head)
    }

    /// The version after `version`, if someone published it (one GET; no LIST).
    pub async fn successor(&self, version: u64) -> Result<Option<Manifest>, object_store::Error> {
        match self.store.get(&version_path(version + 1)).await {
            Ok(r) => {
                let b = r.bytes().await?;
                serde_json::from_slice(&b).map(Some).map_err(|e| object_store::Error::Generic {
                    store: "manifest",
                    source: format!("version {}: {e}", version + 1).into(),
                })
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Publishes `m` as version `m.version`, unless someone else did first.
    pub async fn commit(&self, m: &Manifest) -> Result<Commit, object_store::Error> {
        let body = Bytes::from(serde_json::to_vec_pretty(m).expect("invariant: the manifest serializes"));
        let path = version_path(m.version);
        let opts = || PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        let put =
            retry("write manifest", || self.store.put_opts(&path, PutPayload::from_bytes(body.clone()), opts())).await;
        match put {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                // Our own earlier attempt may have landed before its response was lost.
                let newest = self.latest().await?.unwrap_or_default();
                if newest.version == m.version && newest.epoch == m.epoch && newest.writer == m.writer {
                    return Ok(Commit::Done);
                }
                return Ok(Commit::Lost(Box::new(newest)));
            }
            Err(e) => return Err(e),
        }
        if let Err(e) = self.store.put(&Path::from(HINT), PutPayload::from_bytes(body)).await {
            tracing::warn!(error = %e, "manifest hint not updated; readers will probe forward");
        }
        if m.version > KEEP_VERSIONS {
            let _ = self.store.delete(&version_path(m.version - KEEP_VERSIONS)).await;
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
}
