//! Silt's tiering: sealed commitlog segments go to an object store (S3, MinIO, SeaweedFS or a
//! local directory), which is the durable store; the local disk becomes a cache of it.
//!
//! - [`store`]: the store named by a URL, and retries with backoff and jitter.
//! - [`counted`]: the store's requests counted as stores bill them.
//! - [`footer`]: segment objects carry a footer index (topic and partition → byte ranges).
//! - [`manifest`]: which objects hold which positions (segment objects, and tail objects of the
//!   active segment), versioned with conditional creates as deltas against periodic
//!   checkpoints; a node's epoch fences the nodes before it.
//! - [`cold`]: reads of evicted segments through ranged GETs, background read-ahead and a
//!   block cache.
//! - [`multipart`]: incomplete multipart uploads, listed by hand (S3 ListMultipartUploads) and
//!   aborted by the orphan sweep.
//! - [`sizes`]: each stream's bytes on the local disk and in the bucket, from the manifest.
//! - [`Tiering`]: the uploader, the `ack = "object"` window (tail uploads), hot-cache
//!   eviction, retention, the sweep of orphan objects, and recovery of an empty data directory
//!   from the bucket.
//!
//! Guarantees: an object is named by the manifest only after it is wholly in the store, and
//! `wait_uploaded(p)` resolves only once a committed manifest covers `p` — an `object` topic
//! is never acknowledged before the bucket holds its data. A fenced node stops writing and
//! refuses appends. Retention deletes objects only after a manifest without them is committed.
//! Uploads never stop for good: a segment is checked (and repaired, see
//! `silt_storage`'s `repair` module) before it is scanned, its quarantined ranges are named in
//! its footer and manifest entry, and any other local failure is logged and retried with
//! backoff; only a fence or shutdown ends the uploader.

pub mod cold;
pub mod config;
pub mod counted;
pub mod footer;
pub mod manifest;
pub mod multipart;
mod recovery;
mod retention;
pub mod sizes;
pub mod store;
mod upload;

use std::collections::HashMap;
use std::path::Path as FsPath;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use silt_storage::{QueueName, SealedSegment, Storage};
use silt_types::{LogPosition, Offset, Timestamp};
use tokio::sync::{Notify, watch};

use crate::cold::{ColdStats, ColdStore, ObjectRef};
pub use crate::config::{AckDurability, Policies, TableSources, TieringConfig, TopicPolicy, TopicRule};
use crate::footer::Footer;
use crate::manifest::{Commit, Manifest, ManifestLog, ObjectEntry, TailEntry};
use crate::multipart::Multipart;
use crate::recovery::{read_footer, restore_local};
use crate::store::{Backoff, LOCAL_SEGMENT, StoreUrl, retry};

/// How long the uploader keeps its scans' read buffers once it has nothing to upload.
const CHUNKS_IDLE: Duration = Duration::from_secs(30);

/// The scan's chunks an upload can hold at once: the multipart buffer and the two parts it
/// lets run (see `upload::put_object`), the runs queued between the scan and the store, and
/// the chunk being read.
fn chunks_in_flight(part_bytes: u64) -> usize {
    let per_part = (part_bytes as usize).div_ceil(footer::CHUNK);
    3 * per_part + 4 + 1
}

/// The broker's view on its internal streams (sessions, retained pointers, checkpoints), which
/// share segments with messages: retention may delete a segment only when the broker no
/// longer needs the internal records in it.
pub trait InternalState: Send + Sync + 'static {
    /// No internal record below this position is still needed.
    fn floor(&self) -> LogPosition;
    /// Asked when retention is held back by the floor: write the live state anew (a dump), so
    /// the floor can move past `target`.
    fn compact(&self, target: LogPosition);
    /// The lowest log position a reader inside the node still has to read (the lakehouse's
    /// table writers): no object holding it or anything after it expires. A reader that falls
    /// too far behind lets go of it itself.
    fn hold(&self) -> LogPosition {
        LogPosition(u64::MAX)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Config(String),
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("storage: {0}")]
    Storage(#[from] silt_storage::Error),
    #[error("{0}")]
    Recovery(String),
    #[error("fenced: a newer node (epoch {epoch}, {writer}) writes to this object-store prefix")]
    Fenced { epoch: u64, writer: String },
}

/// Figures for `$SYS` and logs.
#[derive(Clone, Debug, Default)]
pub struct TieringStats {
    /// Log bytes written locally but not yet in the object store.
    pub upload_lag_bytes: u64,
    /// How long some written data has been waiting for upload.
    pub upload_lag_seconds: u64,
    /// Segment objects uploaded, and their bytes.
    pub puts: u64,
    pub put_bytes: u64,
    /// Block fetches of cold reads.
    pub gets: u64,
    /// Requests sent to the store, as stores bill them (see [`counted::Requests`]).
    pub write_requests: u64,
    pub read_requests: u64,
    pub cache_hit_ratio: f64,
    pub objects: u64,
    pub deleted_objects: u64,
    /// Incomplete multipart uploads of earlier nodes aborted at start-up.
    pub aborted_uploads: u64,
    /// Segment uploads that failed locally (a segment that could not be read) and were
    /// retried.
    pub upload_failures: u64,
    /// Quarantined ranges in the segments uploaded since start (named in footers and the
    /// manifest), and their bytes.
    pub uploaded_gaps: u64,
    pub uploaded_gap_bytes: u64,
    pub fenced: bool,
    pub epoch: u64,
}

struct Inner {
    cfg: TieringConfig,
    store: Arc<dyn ObjectStore>,
    log: ManifestLog,
    manifest: tokio::sync::Mutex<Manifest>,
    /// The committed manifest's per-object sizes, for [`Tiering::stream_sizes`] off the runtime.
    sizes: Mutex<Arc<Vec<sizes::ObjectSizes>>>,
    epoch: u64,
    /// This node's name in the manifest (`writer`).
    writer: String,
    policies: Arc<Policies>,
    storage: OnceLock<Arc<Storage>>,
    internal: OnceLock<Arc<dyn InternalState>>,
    cold: Arc<ColdStore>,
    cold_stats: Arc<ColdStats>,
    /// End of the data named by the committed manifest.
    uploaded: watch::Sender<u64>,
    fenced: AtomicBool,
    /// Highest position an `ack = "object"` publisher waits for.
    want: AtomicU64,
    want_notify: Notify,
    footers: Mutex<HashMap<u64, Arc<Footer>>>,
    /// Read buffers of the uploads' scans (see [`footer::ChunkPool`]).
    chunks: Arc<footer::ChunkPool>,
    lag_since: Mutex<Option<Instant>>,
    puts: AtomicU64,
    put_bytes: AtomicU64,
    deleted: AtomicU64,
    requests: Arc<counted::Requests>,
    multipart: Multipart,
    aborted: AtomicU64,
    upload_failures: AtomicU64,
    uploaded_gaps: AtomicU64,
    uploaded_gap_bytes: AtomicU64,
}

/// Tiering for one node. Created by [`Tiering::prepare`] before the storage engine opens (it
/// may fill an empty data directory from the bucket), then [`Tiering::attach`]ed to it.
pub struct Tiering {
    /// Base offsets for a rebuilt index (see `Storage::open_seeded`).
    seeds: Vec<(QueueName, Offset)>,
    rt: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    inner: Arc<Inner>,
    url: StoreUrl,
}

impl Tiering {
    /// Opens the store, recovers an empty data directory from the newest manifest and takes
    /// ownership of the prefix with a new epoch (fencing the node that wrote before).
    pub fn prepare(
        cfg: TieringConfig,
        policies: Policies,
        data_dir: &FsPath,
        max_batch: u32,
    ) -> Result<Tiering, Error> {
        cfg.validate().map_err(Error::Config)?;
        let url = match &cfg.object_store {
            Some(u) => StoreUrl::parse(u).map_err(|e| Error::Config(format!("tiering.object_store: {e}")))?,
            None => StoreUrl::default_for(data_dir),
        };
        let requests = Arc::new(counted::Requests::default());
        let (raw, multipart) =
            url.open_with_multipart().map_err(|e| Error::Config(format!("tiering.object_store: {e}")))?;
        let store: Arc<dyn ObjectStore> = Arc::new(counted::Counted::new(raw, requests.clone()));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("silt-tiering")
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("tiering runtime: {e}")))?;
        let log = ManifestLog::new(store.clone());
        // Claim the prefix before restoring from it: once our epoch is in the manifest, the
        // node before us is fenced and can add nothing we would miss. A node still uploading
        // can win the version we try; read the head again and retry.
        let writer = node_id();
        let mut tries = 0;
        let mine = loop {
            let latest = rt.block_on(log.latest())?.unwrap_or(Manifest { format: 1, ..Manifest::default() });
            let mine = Manifest {
                format: 1,
                version: latest.version + 1,
                epoch: latest.epoch + 1,
                writer: writer.clone(),
                ..latest
            };
            match rt.block_on(log.commit(&mine))? {
                Commit::Done => break mine,
                Commit::Lost(head) if tries < 20 => {
                    tries += 1;
                    tracing::info!(version = mine.version, epoch = head.epoch, writer = %head.writer,
                        "another node committed the manifest version we claimed; reading it again");
                }
                Commit::Lost(head) => return Err(Error::Fenced { epoch: head.epoch, writer: head.writer }),
            }
        };
        let seeds = rt.block_on(restore_local(&store, &mine, data_dir, max_batch))?;
        tracing::info!(
            store = %url.describe(), epoch = mine.epoch, objects = mine.objects.len(), uploaded_end = mine.covered_end(),
            "object store ready; this node owns the prefix"
        );
        let cold_stats = Arc::new(ColdStats::default());
        let cold = Arc::new(ColdStore::new(
            store.clone(),
            rt.handle().clone(),
            cfg.block_cache_bytes,
            cfg.block_bytes,
            cfg.read_ahead_blocks,
            cold_stats.clone(),
        ));
        for o in &mine.objects {
            cold.add(ObjectRef { base: o.base, end: o.end, key: o.key.clone(), gaps: o.gaps.clone() });
        }
        for t in &mine.tails {
            cold.add_tail(ObjectRef { base: t.base, end: t.end, key: t.key.clone(), gaps: Vec::new() });
        }
        let (uploaded, _) = watch::channel(mine.covered_end());
        let chunks = footer::ChunkPool::new(footer::CHUNK, chunks_in_flight(cfg.multipart_part_bytes));
        let inner = Arc::new(Inner {
            cfg,
            store,
            log,
            epoch: mine.epoch,
            writer: mine.writer.clone(),
            sizes: Mutex::new(Arc::new(sizes::of_manifest(&mine))),
            manifest: tokio::sync::Mutex::new(mine),

            policies: Arc::new(policies),
            storage: OnceLock::new(),
            internal: OnceLock::new(),
            cold,
            cold_stats,
            uploaded,
            fenced: AtomicBool::new(false),
            want: AtomicU64::new(0),
            want_notify: Notify::new(),
            footers: Mutex::new(HashMap::new()),
            chunks,
            lag_since: Mutex::new(None),
            puts: AtomicU64::new(0),
            put_bytes: AtomicU64::new(0),
            deleted: AtomicU64::new(0),
            requests,
            multipart,
            aborted: AtomicU64::new(0),
            upload_failures: AtomicU64::new(0),
            uploaded_gaps: AtomicU64::new(0),
            uploaded_gap_bytes: AtomicU64::new(0),
        });
        Ok(Tiering { handle: rt.handle().clone(), rt: Mutex::new(Some(rt)), inner, url, seeds })
    }

    /// Queue base offsets the storage engine must start from if it rebuilds its index:
    /// pass them to `Storage::open_seeded`. Empty unless retention deleted history.
    pub fn seeds(&self) -> &[(QueueName, Offset)] {
        &self.seeds
    }

    pub fn policies(&self) -> Arc<Policies> {
        self.inner.policies.clone()
    }

    /// The object store (rooted at the node's prefix), for others that keep files in the
    /// bucket (the lakehouse's tables).
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.inner.store.clone()
    }

    /// This node's epoch: newer nodes on the prefix have higher ones.
    pub fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    /// This node's name in the manifest (host, process and a random part), beside its epoch.
    pub fn node_id(&self) -> &str {
        &self.inner.writer
    }

    /// Whether a newer node took the prefix over.
    pub fn is_fenced(&self) -> bool {
        self.inner.fenced.load(Ordering::Acquire)
    }

    /// [`Tiering::is_fenced`], for a task that outlives a borrow of `self`.
    pub fn fence_probe(&self) -> Arc<dyn Fn() -> bool + Send + Sync> {
        let inner = self.inner.clone();
        Arc::new(move || inner.fenced.load(Ordering::Acquire))
    }

    pub fn describe(&self) -> String {
        self.url.describe()
    }

    fn rt(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Starts uploading the storage engine's sealed segments (those the manifest lacks first),
    /// serving its cold reads, evicting, and enforcing retention.
    pub fn attach(&self, storage: Arc<Storage>) -> Result<(), Error> {
        let inner = self.inner.clone();
        let (start, end) = {
            let m = self.rt().block_on(inner.manifest.lock());
            (m.start, m.end())
        };
        if start > 0 {
            storage.truncate_before(LogPosition(start))?;
        }
        storage.set_cold_reader(inner.cold.clone());
        let mut sealed = storage.subscribe_sealed();
        let mut backlog: Vec<SealedSegment> =
            storage.sealed_segments().into_iter().filter(|s| s.base.get() >= end).collect();
        backlog.sort_by_key(|s| s.base);
        if !backlog.is_empty() {
            tracing::info!(segments = backlog.len(), "uploading sealed segments the object store lacks");
        }
        let _ = inner.storage.set(storage);
        let up = inner.clone();
        self.rt().spawn(async move {
            let mut next_base = 0u64;
            let mut queue = std::collections::VecDeque::from(backlog);
            loop {
                let next = match queue.pop_front() {
                    Some(s) => Some(s),
                    // Idle a while: the scans' buffers go back to the allocator until the
                    // next upload.
                    None => match tokio::time::timeout(CHUNKS_IDLE, sealed.recv()).await {
                        Ok(next) => next,
                        Err(_) => {
                            up.chunks.clear();
                            sealed.recv().await
                        }
                    },
                };
                let Some(seg) = next else { return };
                let objects_end = up.manifest.lock().await.end();
                if seg.base.get() < next_base.max(objects_end) {
                    continue; // listed and announced both; uploaded once
                }
                // Only local trouble fails an upload (the store's own errors are retried): the
                // segment is checked afresh and the upload retried, never given up.
                let mut backoff = Backoff::new();
                let mut failures = 0u64;
                loop {
                    if up.fenced.load(Ordering::Acquire) {
                        return;
                    }
                    match up.upload(&seg, failures > 0).await {
                        Ok(()) => {
                            if failures > 0 {
                                tracing::info!(base = %seg.base, failures, "segment uploaded after failures");
                            }
                            next_base = seg.end.get();
                            break;
                        }
                        Err(e @ Error::Fenced { .. }) => {
                            up.fence(&e);
                            return;
                        }
                        Err(e) => {
                            failures += 1;
                            up.upload_failures.fetch_add(1, Ordering::Relaxed);
                            if failures == 1 || failures.is_multiple_of(20) {
                                tracing::error!(error = %e, base = %seg.base, failures, "segment upload failed; retrying");
                            }
                            tokio::time::sleep(backoff.next_delay()).await;
                        }
                    }
                }
                up.evict().await;
            }
        });
        // Tails go up for object acknowledgements and for the lakehouse writers, which commit
        // only what the bucket holds.
        if inner.policies.any_object_ack() || !inner.policies.tables().is_empty() {
            let w = inner.clone();
            self.rt().spawn(async move { w.ack_window().await });
        }
        let r = inner.clone();
        self.rt().spawn(async move { r.retention_loop().await });
        let f = inner.clone();
        self.rt().spawn(async move { f.fence_loop().await });
        let o = inner.clone();
        self.rt().spawn(async move { o.sweep_orphans().await });
        Ok(())
    }

    /// Tells retention how to see the broker's internal state.
    pub fn set_internal_state(&self, state: Arc<dyn InternalState>) {
        let _ = self.inner.internal.set(state);
    }

    /// Whether publishes to `topic` wait for the object store.
    pub fn object_ack(&self, topic: &str) -> bool {
        self.inner.policies.for_topic(topic).ack == AckDurability::Object
    }

    /// Resolves once the log up to `end` is in the object store and named by the manifest.
    /// Fails if this node is fenced first.
    pub fn wait_uploaded(&self, end: LogPosition) -> impl Future<Output = Result<(), Error>> + Send + 'static {
        wait_uploaded(self.inner.clone(), end)
    }

    /// [`Self::wait_uploaded`] for readers that outlive a borrow (the lakehouse writers: a
    /// table never holds a row the bucket does not).
    pub fn upload_waiter(&self) -> UploadWaiter {
        let inner = self.inner.clone();
        Arc::new(move |end| Box::pin(wait_uploaded(inner.clone(), end)))
    }

    pub fn stats(&self) -> TieringStats {
        self.inner.stats()
    }

    /// Each stream's bytes on the local disk and in the bucket (see [`sizes`] for what they
    /// count). No I/O: from the committed manifest and the storage engine's segment list.
    pub fn stream_sizes(&self) -> sizes::StreamSizes {
        let objects = self.inner.sizes.lock().expect("invariant: lock not poisoned").clone();
        match self.inner.storage.get() {
            Some(s) => sizes::compute(&objects, &s.sealed_segments(), s.active_span()),
            None => sizes::compute(&objects, &[], (LogPosition(0), LogPosition(0))),
        }
    }

    /// Seals the active segment and waits (up to `shutdown_upload_timeout_ms`) until every
    /// sealed segment is in the store. What is left is uploaded on the next start.
    pub fn shutdown(&self) {
        let inner = self.inner.clone();
        let timeout = Duration::from_millis(inner.cfg.shutdown_upload_timeout_ms);
        if let Some(storage) = inner.storage.get().cloned()
            && !inner.fenced.load(Ordering::Acquire)
        {
            let done = self.rt().block_on(async {
                let end = storage.roll().await?;
                // Segment objects, not tails: the next start then has nothing to replace.
                let mut rx = inner.uploaded.subscribe();
                let stored = async {
                    while end.get() > 0 && inner.manifest.lock().await.end() < end.get() {
                        let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
                    }
                };
                Ok::<_, silt_storage::Error>(tokio::time::timeout(timeout, stored).await.is_ok())
            });
            match done {
                Ok(true) => tracing::info!("every sealed segment is in the object store"),
                Ok(false) => tracing::warn!(
                    lag_bytes = inner.stats().upload_lag_bytes,
                    "object store did not take everything before the shutdown timeout; the rest is uploaded on the next start"
                ),
                Err(e) => tracing::warn!(error = %e, "final seal failed; the rest is uploaded on the next start"),
            }
        }
        if let Some(rt) = self.rt.lock().expect("invariant: lock not poisoned").take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

impl Drop for Tiering {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.lock().expect("invariant: lock not poisoned").take() {
            rt.shutdown_background();
        }
    }
}

impl Inner {
    fn storage(&self) -> &Arc<Storage> {
        self.storage.get().expect("invariant: attached before use")
    }

    fn fence(&self, e: &Error) {
        if !self.fenced.swap(true, Ordering::AcqRel) {
            tracing::error!(error = %e, "tiering: this node is fenced; it stops uploading and refuses writes");
            if let Some(s) = self.storage.get() {
                s.fence();
            }
            self.uploaded.send_modify(|_| {}); // wake waiters so they see the fence
        }
    }

    fn set_sizes(&self, m: &Manifest) {
        *self.sizes.lock().expect("invariant: lock not poisoned") = Arc::new(sizes::of_manifest(m));
    }

    /// Publishes the next manifest version with `change` applied.
    async fn commit(&self, change: impl FnOnce(&mut Manifest)) -> Result<(), Error> {
        let mut m = self.manifest.lock().await;
        let mut next = m.clone();
        next.version += 1;
        change(&mut next);
        match self.log.commit(&next).await? {
            Commit::Done => {
                *m = next;
                self.set_sizes(&m);
                Ok(())
            }
            Commit::Lost(head) => {
                let e = Error::Fenced { epoch: head.epoch, writer: head.writer.clone() };
                *m = *head;
                self.set_sizes(&m);
                Err(e)
            }
        }
    }

    /// Evicts uploaded local segments beyond the hot-cache size, oldest first — except those
    /// holding withheld (`tier = "local"`) records, whose local copy is the only one.
    async fn evict(&self) {
        let storage = self.storage().clone();
        let uploaded = self.manifest.lock().await.end(); // segment objects only, not tails
        let mut segs: Vec<SealedSegment> =
            storage.sealed_segments().into_iter().filter(|s| s.end.get() <= uploaded).collect();
        segs.sort_by_key(|s| std::cmp::Reverse(s.base));
        let mut held = 0u64;
        let mut candidates = Vec::new();
        for s in segs {
            held += s.end.get() - s.base.get();
            if held > self.cfg.hot_cache_bytes {
                candidates.push(s);
            }
        }
        let mut evictable = Vec::with_capacity(candidates.len());
        for s in candidates {
            let entry = self.manifest.lock().await.objects.iter().find(|o| o.base == s.base.get()).cloned();
            let Some(entry) = entry else { continue }; // retention is deleting it
            match self.footer(&entry).await {
                Ok(f) if f.withheld == 0 => evictable.push(s),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, base = %s.base, "footer unreadable; segment kept"),
            }
        }
        let result = tokio::task::spawn_blocking(move || {
            let mut evicted = 0;
            for s in evictable {
                if storage.evict_segment(&s)? {
                    evicted += 1;
                }
            }
            Ok::<_, silt_storage::Error>(evicted)
        })
        .await;
        match result {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::debug!(segments = n, "evicted uploaded segments from the local disk"),
            Ok(Err(e)) => tracing::warn!(error = %e, "eviction failed"),
            // Cancelled: the runtime is shutting down (a clean stop), nothing to report.
            Err(e) if e.is_cancelled() => tracing::debug!("eviction cancelled by shutdown"),
            Err(e) => tracing::warn!(error = %e, "eviction task failed"),
        }
    }

    /// Uploads what `object` publishers wait for at most once per window: the written part
    /// of the active segment not yet in the store, as tail objects the manifest names. Sealed
    /// segments the uploader has not stored yet go first (the tails continue from them). So
    /// object acknowledgements cost a small PUT and a manifest version per window, and leave
    /// segments, local and uploaded, at their configured size.
    async fn ack_window(self: Arc<Self>) {
        let window = Duration::from_millis(self.cfg.object_ack_window_ms);
        loop {
            let covered = *self.uploaded.borrow();
            if self.want.load(Ordering::Acquire) <= covered {
                self.want_notify.notified().await;
                continue;
            }
            // Gather the window's publishers, then upload once for all of them.
            tokio::time::sleep(window).await;
            if self.fenced.load(Ordering::Acquire) {
                return;
            }
            match self.upload_tail().await {
                Ok(()) => {}
                Err(e @ Error::Fenced { .. }) => return self.fence(&e),
                Err(e) => {
                    tracing::warn!(error = %e, "uploading for object acknowledgements failed");
                    tokio::time::sleep(window).await;
                }
            }
        }
    }

    /// One round of [`Self::ack_window`]: waits for the sealed segments to be stored, then
    /// uploads the active segment's new bytes (in pieces of at most `multipart_part_bytes`).
    async fn upload_tail(&self) -> Result<(), Error> {
        let storage = self.storage().clone();
        let (active, written) = storage.active_span();
        let objects_end = self.manifest.lock().await.end();
        if objects_end < active.get() {
            // Sealed segments are still on their way; the uploader's commits wake us.
            let mut rx = self.uploaded.subscribe();
            let _ = tokio::time::timeout(Duration::from_secs(1), rx.wait_for(|u| *u >= active.get())).await;
            return Ok(());
        }
        let mut from = {
            let m = self.manifest.lock().await;
            m.tails.last().map_or(active.get(), |t| t.end)
        };
        while from < written.get() {
            let to = written.get().min(from + self.cfg.multipart_part_bytes);
            let s = storage.clone();
            let bytes =
                tokio::task::spawn_blocking(move || s.read_log_for_upload(LogPosition(from), (to - from) as usize))
                    .await
                    .map_err(|e| Error::Recovery(e.to_string()))??;
            let key = format!("tails/{:020}-{from:020}-{:08}.bin", active.get(), self.epoch);
            let path = Path::from(key.as_str());
            retry("upload tail", || self.store.put(&path, PutPayload::from(bytes.clone()))).await?;
            self.puts.fetch_add(1, Ordering::Relaxed);
            self.put_bytes.fetch_add(to - from, Ordering::Relaxed);
            let entry = TailEntry { key: key.clone(), base: from, end: to };
            let mut stale = false;
            self.commit(|m| {
                // The segment may have been sealed and stored meanwhile: then this tail is not
                // needed, and is not named.
                let next = m.tails.last().map_or(m.end(), |t| t.end);
                stale = entry.base != next;
                if !stale {
                    m.tails.push(entry.clone());
                }
            })
            .await?;
            if stale {
                let _ = self.store.delete(&path).await;
                return Ok(());
            }
            self.cold.add_tail(ObjectRef { base: from, end: to, key, gaps: Vec::new() });
            self.uploaded.send_replace(to);
            from = to;
        }
        Ok(())
    }

    fn stats(&self) -> TieringStats {
        let uploaded = *self.uploaded.borrow();
        let lag = match self.storage.get() {
            Some(s) => {
                let end = s.stats().log_end;
                end.get().saturating_sub(s.normalize(LogPosition(uploaded)).get())
            }
            None => 0,
        };
        let lag_seconds = {
            let mut since = self.lag_since.lock().expect("invariant: lock not poisoned");
            match (lag, *since) {
                (0, _) => {
                    *since = None;
                    0
                }
                (_, None) => {
                    *since = Some(Instant::now());
                    0
                }
                (_, Some(t)) => t.elapsed().as_secs(),
            }
        };
        let (hits, misses) =
            (self.cold_stats.hits.load(Ordering::Relaxed), self.cold_stats.misses.load(Ordering::Relaxed));
        let objects = self.manifest.try_lock().map(|m| m.objects.len() as u64).unwrap_or(0);
        TieringStats {
            upload_lag_bytes: lag,
            upload_lag_seconds: lag_seconds,
            puts: self.puts.load(Ordering::Relaxed),
            put_bytes: self.put_bytes.load(Ordering::Relaxed),
            gets: self.cold_stats.gets.load(Ordering::Relaxed),
            write_requests: self.requests.writes.load(Ordering::Relaxed),
            read_requests: self.requests.reads.load(Ordering::Relaxed),
            cache_hit_ratio: if hits + misses == 0 { 1.0 } else { hits as f64 / (hits + misses) as f64 },
            objects,
            deleted_objects: self.deleted.load(Ordering::Relaxed),
            aborted_uploads: self.aborted.load(Ordering::Relaxed),
            upload_failures: self.upload_failures.load(Ordering::Relaxed),
            uploaded_gaps: self.uploaded_gaps.load(Ordering::Relaxed),
            uploaded_gap_bytes: self.uploaded_gap_bytes.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Acquire),
            epoch: self.epoch,
        }
    }

    /// Looks for a manifest version after ours: a newer node took the prefix over. Found
    /// within `fence_check_interval_ms` even when this node has nothing to upload.
    async fn fence_loop(self: Arc<Self>) {
        let every = Duration::from_millis(self.cfg.fence_check_interval_ms);
        loop {
            tokio::time::sleep(every).await;
            if self.fenced.load(Ordering::Acquire) {
                return;
            }
            // Holding the lock: our own commits move the version, never a race with them.
            let m = self.manifest.lock().await;
            match self.log.successor(m.version).await {
                Ok(Some(next)) if next.epoch != m.epoch || next.writer != m.writer => {
                    let e = Error::Fenced { epoch: next.epoch, writer: next.writer };
                    drop(m);
                    self.fence(&e);
                    return;
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "fence check failed; retrying"),
            }
        }
    }

    /// The footer of an object: from memory, else from the object's tail (two ranged GETs).
    async fn footer(&self, o: &ObjectEntry) -> Result<Arc<Footer>, Error> {
        if let Some(f) = self.footers.lock().expect("invariant: lock not poisoned").get(&o.base) {
            return Ok(f.clone());
        }
        let f = Arc::new(read_footer(&self.store, o).await?);
        self.footers.lock().expect("invariant: lock not poisoned").insert(o.base, f.clone());
        Ok(f)
    }
}

/// Waits for what `upload_waiter` callers wait for.
pub type UploadWaiter =
    Arc<dyn Fn(LogPosition) -> std::pin::Pin<Box<dyn Future<Output = Result<(), Error>> + Send>> + Send + Sync>;

/// Resolves once the log up to `end` is in the object store and named by the manifest; fails
/// if the node is fenced first.
async fn wait_uploaded(inner: Arc<Inner>, end: LogPosition) -> Result<(), Error> {
    inner.want.fetch_max(end.get(), Ordering::AcqRel);
    inner.want_notify.notify_one();
    let mut rx = inner.uploaded.subscribe();
    loop {
        if inner.fenced.load(Ordering::Acquire) {
            let m = inner.manifest.lock().await;
            return Err(Error::Fenced { epoch: m.epoch, writer: m.writer.clone() });
        }
        if *rx.borrow_and_update() >= end.get() {
            return Ok(());
        }
        // Woken by uploads; the timeout re-checks fencing.
        let _ = tokio::time::timeout(Duration::from_millis(500), rx.changed()).await;
    }
}

/// A name for this node in the manifest: host, process and a random part.
fn node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "node".into());
    format!("{}-{}-{:08x}", host.trim(), std::process::id(), rand::random::<u32>())
}
