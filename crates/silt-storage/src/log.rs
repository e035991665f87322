//! The commitlog: one append-only log per node, shared by every stream, in segment files.
//!
//! Appenders encode and checksum their batch on their own thread, then hand it to the single
//! writer thread (`writer`), which group-commits them. This module holds what the writer,
//! the dispatcher and readers share: the segments, the tail cache, the written end.
//!
//! Invariants:
//! - Positions only grow. A batch never spans two segments; a segment holds whole batches.
//! - `Ok` from an append means: written (and fsynced under `always`) to the local disk. It does
//!   not mean uploaded to the object store.
//! - Readers see bytes only once they are written ([`LogShared::end`]), and bytes from a segment
//!   file only once their batch passed its checks (see `repair`): a bad batch is healed from a
//!   good copy or quarantined, never served.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use silt_types::LogPosition;
use silt_types::latency::LatencyHistogram;
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};

use crate::config::StorageConfig;
use crate::error::{Error, Result};
use crate::format::{self, BatchView, EncodedBatch, FRAME_LEN, SEGMENT_HEADER_LEN};
use crate::repair::{self, RepairStats};
use crate::segment::{self, Segment};
use crate::tail::TailCache;

/// How long after opening a bad batch waits for a cold reader (tiering attaches one right
/// after the engine opens) before it is judged without one, so a batch the store holds is not
/// quarantined by the dispatcher's first round.
const COLD_READER_GRACE: Duration = Duration::from_secs(10);

/// Announced when a segment is sealed: its bytes `[base, end)` will never change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedSegment {
    pub base: LogPosition,
    pub end: LogPosition,
    pub path: PathBuf,
}

/// Where an append landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Appended {
    /// Position of each record, in the order given.
    pub positions: Vec<LogPosition>,
    /// Position just past the batch.
    pub end: LogPosition,
}

pub(crate) struct PendingAppend {
    pub batch: EncodedBatch,
    /// Every record is volatile: acknowledged once written, before any fsync.
    pub volatile: bool,
    pub done: oneshot::Sender<Result<Appended>>,
    pub _permit: OwnedSemaphorePermit,
    /// When the append was submitted (before waiting for room), for the append latency.
    pub queued: Instant,
}

pub(crate) enum WriterMsg {
    Append(PendingAppend),
    /// Fsync now and answer.
    Sync(oneshot::Sender<Result<()>>),
    /// Seal the active segment if it holds anything; answer with the position everything
    /// sealed ends at.
    Roll(oneshot::Sender<Result<LogPosition>>),
    Shutdown,
}

/// Reads log bytes that are no longer on the local disk (evicted after upload): the tiering
/// layer's ranged reads from the object store. Called from any thread, blocking.
pub trait ColdReader: Send + Sync + 'static {
    fn read(&self, pos: LogPosition, len: usize) -> Result<Bytes>;

    /// The object store's copy of `[pos, pos + len)` whether or not the local segment still
    /// exists (to repair a bad local copy): `Ok(None)` when no uploaded object covers it. An
    /// error of kind `Retryable` means the store holds it but cannot be read now.
    fn read_uploaded(&self, pos: LogPosition, len: usize) -> Result<Option<Bytes>> {
        let _ = (pos, len);
        Ok(None)
    }

    /// The quarantined range `[start, end)` (log positions) holding `pos`, if the store names
    /// one there ([`ColdReader::read`] refuses such positions).
    fn gap_at(&self, pos: LogPosition) -> Option<(LogPosition, LogPosition)> {
        let _ = pos;
        None
    }
}

/// A batch as the dispatcher reads it.
#[derive(Debug)]
pub(crate) enum Batch {
    Records(BatchView),
    /// A quarantined range of this many bytes from the position asked for: nothing to index.
    Gap(u64),
}

/// State shared by the writer, the dispatcher and readers.
pub(crate) struct LogShared {
    pub dir: PathBuf,
    quarantine_dir: PathBuf,
    pub config: StorageConfig,
    pub(crate) segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
    pub(crate) tail: Mutex<TailCache>,
    /// Written end of the log; the condvar wakes the dispatcher when it moves.
    pub(crate) end: Mutex<LogPosition>,
    pub(crate) end_moved: Condvar,
    sealed_subscribers: Mutex<Vec<mpsc::UnboundedSender<SealedSegment>>>,
    /// Another node owns the log's object-store prefix: appends are refused.
    fenced: AtomicBool,
    /// Positions below this are gone (retention): reads of them fail with `Expired`.
    floor: AtomicU64,
    cold: OnceLock<Arc<dyn ColdReader>>,
    /// Fsyncs of the active segment since the log was opened.
    pub fsyncs: AtomicU64,
    /// Submission to answer of each append (its durability wait included), and each fsync.
    pub append_latency: LatencyHistogram,
    pub fsync_latency: LatencyHistogram,
    pub repairs: RepairStats,
    /// The final fsync at shutdown failed.
    pub unclean: AtomicBool,
    opened: Instant,
}

impl LogShared {
    /// Opens the log directory, recovering the last segment. Returns the shared state and the
    /// active segment.
    pub fn open(dir: &Path, config: StorageConfig) -> Result<(Arc<LogShared>, Arc<Segment>)> {
        std::fs::create_dir_all(dir).map_err(Error::io("create log directory", dir))?;
        let mut bases: Vec<(LogPosition, PathBuf)> = std::fs::read_dir(dir)
            .map_err(Error::io("list log directory", dir))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name();
                segment::parse_file_name(name.to_str()?).map(|b| (b, e.path()))
            })
            .collect();
        bases.sort();
        let mut segments = BTreeMap::new();
        let repairs = RepairStats::default();
        let quarantine_dir = repair::quarantine_dir(dir);
        let count = bases.len();
        for (i, (base, path)) in bases.into_iter().enumerate() {
            let last = i + 1 == count;
            if last && segment::is_unborn(&path)? {
                // A crash between creating the newest segment and fsyncing its header: it holds
                // nothing (appends start after `Segment::create` returns), so start it again.
                tracing::warn!(segment = %path.display(), "commitlog recovery: the newest segment had no header; recreated");
                std::fs::remove_file(&path).map_err(Error::io("remove unborn segment", &path))?;
                segments.insert(base.get(), Arc::new(Segment::create(dir, base)?));
                continue;
            }
            let seg = Segment::open(path, base, !last)?;
            if last {
                let r = seg.recover(config.max_batch_bytes as usize, &quarantine_dir)?;
                for q in &r.quarantined {
                    repairs.count(q);
                }
                if let Some(reason) = &r.reason {
                    tracing::warn!(
                        segment = %seg.path.display(),
                        valid_batches = r.batches,
                        cut_bytes = r.cut_bytes,
                        reason = %reason,
                        "commitlog recovery cut a torn or corrupt tail"
                    );
                } else {
                    tracing::info!(
                        segment = %seg.path.display(),
                        batches = r.batches,
                        preallocated_bytes_cut = r.zeros_cut,
                        "commitlog tail verified"
                    );
                }
            }
            segments.insert(base.get(), Arc::new(seg));
        }
        let active = match segments.last_key_value() {
            Some((_, s)) => s.clone(),
            None => {
                let s = Arc::new(Segment::create(dir, LogPosition(0))?);
                segments.insert(0, s.clone());
                s
            }
        };
        let shared = Arc::new(LogShared {
            dir: dir.to_path_buf(),
            quarantine_dir,
            tail: Mutex::new(TailCache::new(config.tail_cache_bytes)),
            config,
            end: Mutex::new(active.end()),
            end_moved: Condvar::new(),
            segments: RwLock::new(segments),
            sealed_subscribers: Mutex::new(Vec::new()),
            fenced: AtomicBool::new(false),
            floor: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            append_latency: LatencyHistogram::new(),
            fsync_latency: LatencyHistogram::new(),
            cold: OnceLock::new(),
            repairs,
            unclean: AtomicBool::new(false),
            opened: Instant::now(),
        });
        Ok((shared, active))
    }

    /// The written end of the log.
    pub fn end(&self) -> LogPosition {
        *self.end.lock().expect("invariant: lock not poisoned")
    }

    /// Position of the first batch in the log.
    pub fn start(&self) -> LogPosition {
        let segs = self.segments.read().expect("invariant: lock not poisoned");
        let (_, s) = segs.first_key_value().expect("invariant: the log always has a segment");
        s.base.add(SEGMENT_HEADER_LEN)
    }

    /// Waits until the end moves past `pos` or `timeout` passes; returns the end.
    pub fn wait_end_past(&self, pos: LogPosition, timeout: Duration) -> LogPosition {
        let guard = self.end.lock().expect("invariant: lock not poisoned");
        let (guard, _) =
            self.end_moved.wait_timeout_while(guard, timeout, |end| *end <= pos).expect("invariant: lock not poisoned");
        *guard
    }

    pub fn tail_bytes(&self) -> u64 {
        self.tail.lock().expect("invariant: lock not poisoned").bytes()
    }

    pub fn fence(&self) {
        self.fenced.store(true, Ordering::Release);
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    pub fn subscribe_sealed(&self) -> mpsc::UnboundedReceiver<SealedSegment> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.sealed_subscribers.lock().expect("invariant: lock not poisoned").push(tx);
        rx
    }

    /// The active segment's base and the log's written end, read together: the end lies in
    /// that segment (at its header's end right after a roll), or is where it was sealed.
    pub fn active_span(&self) -> (LogPosition, LogPosition) {
        let segs = self.segments.read().expect("invariant: lock not poisoned");
        let base = segs.last_key_value().map_or(LogPosition(0), |(_, s)| s.base);
        (base, self.end())
    }

    /// Sealed segments, oldest first (for tiering to catch up on start).
    pub fn sealed_segments(&self) -> Vec<SealedSegment> {
        let segs = self.segments.read().expect("invariant: lock not poisoned");
        segs.values()
            .filter(|s| s.is_sealed())
            .map(|s| SealedSegment { base: s.base, end: s.end(), path: s.path.clone() })
            .collect()
    }

    /// The local segment holding `pos`, if it is on this disk (not evicted).
    fn segment_for(&self, pos: LogPosition) -> Option<Arc<Segment>> {
        let segs = self.segments.read().expect("invariant: lock not poisoned");
        segs.range(..=pos.get()).next_back().filter(|(_, s)| pos < s.end() || !s.is_sealed()).map(|(_, s)| s.clone())
    }

    /// Positions below the returned one were deleted by retention.
    pub fn floor(&self) -> LogPosition {
        LogPosition(self.floor.load(Ordering::Acquire))
    }

    pub fn set_cold_reader(&self, reader: Arc<dyn ColdReader>) -> bool {
        self.cold.set(reader).is_ok()
    }

    /// Drops the local copy of a sealed segment (it lives on in the object store). Never the
    /// active segment. Returns whether a segment was removed.
    pub fn evict(&self, base: LogPosition) -> Result<bool> {
        let removed = {
            let mut segs = self.segments.write().expect("invariant: lock not poisoned");
            let last = segs.last_key_value().map(|(k, _)| *k);
            match segs.get(&base.get()) {
                Some(s) if s.is_sealed() && last != Some(base.get()) => segs.remove(&base.get()),
                _ => None,
            }
        };
        let Some(seg) = removed else { return Ok(false) };
        // Readers holding the segment keep their mapping; the file goes when they drop it.
        std::fs::remove_file(&seg.path).map_err(Error::io("remove evicted segment", &seg.path))?;
        Ok(true)
    }

    /// Retention: forgets every position below `pos` and deletes the local segments that end
    /// at or before it. Never moves backwards; never deletes the active segment.
    pub fn truncate_before(&self, pos: LogPosition) -> Result<usize> {
        self.floor.fetch_max(pos.get(), Ordering::AcqRel);
        let removed: Vec<Arc<Segment>> = {
            let mut segs = self.segments.write().expect("invariant: lock not poisoned");
            let last = segs.last_key_value().map(|(k, _)| *k);
            let doomed: Vec<u64> = segs
                .iter()
                .filter(|(k, s)| Some(**k) != last && s.is_sealed() && s.end() <= pos)
                .map(|(k, _)| *k)
                .collect();
            doomed.into_iter().filter_map(|k| segs.remove(&k)).collect()
        };
        for seg in &removed {
            std::fs::remove_file(&seg.path).map_err(Error::io("remove expired segment", &seg.path))?;
        }
        Ok(removed.len())
    }

    /// Moves a position that sits at the end of a sealed segment (or on a segment header) to the
    /// first batch of the next segment.
    pub fn normalize(&self, mut pos: LogPosition) -> LogPosition {
        let segs = self.segments.read().expect("invariant: lock not poisoned");
        loop {
            let Some((_, s)) = segs.range(..=pos.get()).next_back() else {
                return pos;
            };
            if pos < s.base.add(SEGMENT_HEADER_LEN) {
                return s.base.add(SEGMENT_HEADER_LEN);
            }
            if pos == s.end() && s.is_sealed() {
                match segs.range(pos.get()..).next() {
                    Some((_, next)) if next.base.get() > s.base.get() => {
                        pos = next.base.add(SEGMENT_HEADER_LEN);
                        continue;
                    }
                    _ => return pos,
                }
            }
            return pos;
        }
    }

    /// Reads `len` bytes at `pos`: from the tail cache when it holds them, else from the
    /// segment file once the batches holding them passed their checks (repairing what fails),
    /// else from the object store.
    pub fn read(&self, pos: LogPosition, len: usize) -> Result<Bytes> {
        self.read_checked(pos, len, false)
    }

    /// [`Self::read`] from the tail cache only: `None` when the bytes must come from a
    /// segment file or the object store.
    pub fn read_cached(&self, pos: LogPosition, len: usize) -> Option<Result<Bytes>> {
        if pos < self.floor() {
            return Some(Err(Error::Expired(pos.get())));
        }
        self.tail.lock().expect("invariant: lock not poisoned").get(pos, len).map(Ok)
    }

    /// Like [`Self::read`]; with `gaps_ok`, bytes of quarantined ranges are returned as they
    /// are on the disk (gap batches) instead of refused.
    pub fn read_checked(&self, pos: LogPosition, len: usize, gaps_ok: bool) -> Result<Bytes> {
        if pos < self.floor() {
            return Err(Error::Expired(pos.get()));
        }
        if let Some(b) = self.tail.lock().expect("invariant: lock not poisoned").get(pos, len) {
            return Ok(b);
        }
        if pos.add(len as u64) > self.end() {
            return Err(Error::NotFound(pos.get()));
        }
        match self.segment_for(pos) {
            Some(seg) => {
                let off = pos.get() - seg.base.get();
                repair::ensure(&seg, off, len as u64, gaps_ok, || (self.limit(&seg), self.repair_ctx()))?;
                seg.read(pos, len)
            }
            None => self.cold.get().ok_or(Error::NotFound(pos.get()))?.read(pos, len),
        }
    }

    /// The checked batch starting at `pos` (a normalized batch position below the end), or the
    /// rest of the quarantined range `pos` lies in.
    pub fn read_batch(&self, pos: LogPosition) -> Result<Batch> {
        let max = self.config.max_batch_bytes as usize;
        let corrupt = |source| Error::Corrupt { position: pos.get(), source };
        if let Some(chunk) = self.tail.lock().expect("invariant: lock not poisoned").get_from(pos) {
            // The writer's own buffer; it fails a check only if memory did.
            if let Some(total) = format::peek_frame(&chunk, max).ok().flatten().filter(|t| *t <= chunk.len())
                && let Ok(view) = format::check_batch(chunk.slice(..total), max)
            {
                return Ok(if view.gap { Batch::Gap(total as u64) } else { Batch::Records(view) });
            }
        }
        if let Some(seg) = self.segment_for(pos) {
            let off = pos.get() - seg.base.get();
            let limit = self.limit(&seg);
            if off >= limit {
                return Err(Error::NotFound(pos.get()));
            }
            match repair::ensure(&seg, off, 1, false, || (limit, self.repair_ctx())) {
                Ok(()) => {}
                Err(Error::Quarantined(_)) => {
                    let (_, end) = seg.gap_at(off, 1).expect("invariant: a quarantined read lies in a gap");
                    return Ok(Batch::Gap(end - off));
                }
                Err(e) => return Err(e),
            }
        }
        let header = match self.read(pos, FRAME_LEN) {
            Err(Error::Quarantined(_)) => {
                // An evicted segment's gap, as its object's manifest entry names it.
                let gap = self.cold.get().and_then(|c| c.gap_at(pos)).filter(|(_, end)| *end > pos);
                let (_, end) = gap.ok_or(Error::Quarantined(pos.get()))?;
                return Ok(Batch::Gap(end.get() - pos.get()));
            }
            r => r?,
        };
        let total = format::peek_frame(&header, max).map_err(corrupt)?.expect("invariant: FRAME_LEN bytes were read");
        let view = format::check_batch(self.read(pos, total)?, max).map_err(corrupt)?;
        Ok(if view.gap { Batch::Gap(total as u64) } else { Batch::Records(view) })
    }

    /// Checks (and repairs) every batch of the local sealed segment starting at `base`;
    /// `fresh` forgets what was checked before. Returns its gaps as `(position, length)`;
    /// nothing when the segment is not on this disk.
    pub fn check_segment(&self, base: LogPosition, fresh: bool) -> Result<Vec<(LogPosition, u64)>> {
        let seg = self.segments.read().expect("invariant: lock not poisoned").get(&base.get()).cloned();
        let Some(seg) = seg else { return Ok(Vec::new()) };
        let gaps = repair::ensure_all(&seg, self.limit(&seg), fresh, &self.repair_ctx())?;
        Ok(gaps.into_iter().map(|(s, e)| (base.add(s), e - s)).collect())
    }

    /// How far a walk may read `seg`: its length when sealed, else what the writer published.
    fn limit(&self, seg: &Segment) -> u64 {
        if seg.is_sealed() { seg.len() } else { self.end().get().saturating_sub(seg.base.get()).min(seg.len()) }
    }

    fn repair_ctx(&self) -> repair::Ctx<'_> {
        let cold = self.cold.get().map(|c| c.as_ref() as &dyn ColdReader);
        repair::Ctx {
            quarantine_dir: &self.quarantine_dir,
            max_batch: self.config.max_batch_bytes as usize,
            tail: &self.tail,
            cold,
            cold_pending: cold.is_none() && self.opened.elapsed() < COLD_READER_GRACE,
            stats: &self.repairs,
        }
    }

    pub(crate) fn publish_sealed(&self, s: SealedSegment) {
        let mut subs = self.sealed_subscribers.lock().expect("invariant: lock not poisoned");
        subs.retain(|tx| tx.send(s.clone()).is_ok());
    }
}

/// What [`recover_segment_file`] found and did.
#[doc(hidden)]
#[derive(Debug)]
pub struct SegmentRecovery {
    /// Batches with records that passed their checks.
    pub batches: u64,
    /// Bytes cut off the end (a torn write).
    pub cut_bytes: u64,
    /// Bad ranges that valid batches follow, now gap batches.
    pub quarantined: u64,
    /// Gaps in the file after recovery, file offsets `[start, end)`, in order.
    pub gaps: Vec<(u64, u64)>,
}

/// Checks the segment file at `path` without changing it (`silt fsck`): opened read only.
pub fn check_segment_file(path: &Path, max_batch_bytes: usize) -> Result<crate::segment::Inspected> {
    let base = path.file_name().and_then(|n| segment::parse_file_name(n.to_str()?)).unwrap_or(LogPosition(0));
    Segment::open(path.to_path_buf(), base, true)?.check_only(max_batch_bytes)
}

/// The segment files of a log directory, oldest first, with their base positions.
pub fn segment_files(log_dir: &Path) -> Result<Vec<(LogPosition, std::path::PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(log_dir).map_err(Error::io("read log directory", log_dir))? {
        let e = e.map_err(Error::io("read log directory", log_dir))?;
        if let Some(base) = e.file_name().to_str().and_then(segment::parse_file_name) {
            out.push((base, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Recovers the segment file at `path` as opening the log recovers its newest segment: every
/// batch is checked, a bad range with valid batches after it is copied to `quarantine_dir` and
/// replaced by gap batches, a bad end is cut. The segment scan's entry point for the fuzz
/// target (`fuzz/fuzz_targets/log_segment.rs`); the broker goes through [`crate::Storage`].
#[doc(hidden)]
pub fn recover_segment_file(path: &Path, max_batch_bytes: usize, quarantine_dir: &Path) -> Result<SegmentRecovery> {
    let base = path.file_name().and_then(|n| segment::parse_file_name(n.to_str()?)).unwrap_or(LogPosition(0));
    let seg = Segment::open(path.to_path_buf(), base, false)?;
    let r = seg.recover(max_batch_bytes, quarantine_dir)?;
    Ok(SegmentRecovery {
        batches: r.batches,
        cut_bytes: r.cut_bytes,
        quarantined: r.quarantined.len() as u64,
        gaps: seg.gaps(),
    })
}
