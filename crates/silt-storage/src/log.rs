//! The commitlog: one append-only log per node, shared by every stream, in segment files.
//!
//! Appenders encode and checksum their batch on their own thread, then hand it to the single
//! writer thread. The writer takes every batch waiting (up to `max_write_bytes`), writes them
//! with one positioned vectored write (no copy into a joint buffer) and — under `fsync = "always"` — one fsync, then acknowledges them
//! all: group commit. Under `interval` the writer acknowledges after the write and fsyncs on a
//! timer; under `never` only at seal and shutdown.
//!
//! Invariants:
//! - Positions only grow. A batch never spans two segments; a segment holds whole batches.
//! - `Ok` from an append means: written (and fsynced under `always`) to the local disk. It does
//!   not mean uploaded to the object store.
//! - After a write error the writer stops and fails every later append; it never guesses what
//!   reached the disk.
//! - Readers see bytes only once they are written ([`LogShared::end`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use silt_types::LogPosition;
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};

use crate::config::{FsyncPolicy, StorageConfig};
use crate::error::{Error, Result};
use crate::format::{self, EncodedBatch, FRAME_LEN, SEGMENT_HEADER_LEN};
use crate::segment::{self, Segment};
use crate::tail::TailCache;

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
}

/// State shared by the writer, the dispatcher and readers.
pub(crate) struct LogShared {
    pub dir: PathBuf,
    pub config: StorageConfig,
    segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
    tail: Mutex<TailCache>,
    /// Written end of the log; the condvar wakes the dispatcher when it moves.
    end: Mutex<LogPosition>,
    end_moved: Condvar,
    failed: AtomicBool,
    sealed_subscribers: Mutex<Vec<mpsc::UnboundedSender<SealedSegment>>>,
    /// Another node owns the log's object-store prefix: appends are refused.
    fenced: AtomicBool,
    /// Positions below this are gone (retention): reads of them fail with `Expired`.
    floor: AtomicU64,
    cold: OnceLock<Arc<dyn ColdReader>>,
    /// Fsyncs of the active segment since the log was opened.
    pub fsyncs: AtomicU64,
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
                let r = seg.recover(config.max_batch_bytes as usize)?;
                if let Some(reason) = &r.reason {
                    tracing::warn!(
                        segment = %seg.path.display(),
                        valid_batches = r.batches,
                        cut_bytes = r.cut_bytes,
                        reason = %reason,
                        "commitlog recovery cut a torn or corrupt tail"
                    );
                } else {
                    tracing::info!(segment = %seg.path.display(), batches = r.batches, "commitlog tail verified");
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
            tail: Mutex::new(TailCache::new(config.tail_cache_bytes)),
            config,
            end: Mutex::new(active.end()),
            end_moved: Condvar::new(),
            segments: RwLock::new(segments),
            failed: AtomicBool::new(false),
            sealed_subscribers: Mutex::new(Vec::new()),
            fenced: AtomicBool::new(false),
            floor: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            cold: OnceLock::new(),
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

    /// Stops the log after a fatal error elsewhere (the dispatcher): appends are refused.
    pub fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }

    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
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
    /// segment file.
    pub fn read(&self, pos: LogPosition, len: usize) -> Result<Bytes> {
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
            Some(seg) => seg.read(pos, len),
            None => self.cold.get().ok_or(Error::NotFound(pos.get()))?.read(pos, len),
        }
    }

    /// Reads the whole batch frame starting at `pos` (a normalized batch position below the end).
    pub fn read_frame(&self, pos: LogPosition) -> Result<Bytes> {
        let max = self.config.max_batch_bytes as usize;
        let corrupt = |source| Error::Corrupt { position: pos.get(), source };
        if let Some(chunk) = self.tail.lock().expect("invariant: lock not poisoned").get_from(pos) {
            let total = format::peek_frame(&chunk, max).map_err(corrupt)?;
            if let Some(total) = total.filter(|t| *t <= chunk.len()) {
                return Ok(chunk.slice(..total));
            }
        }
        let header = self.read(pos, FRAME_LEN)?;
        let total = format::peek_frame(&header, max).map_err(corrupt)?.expect("invariant: FRAME_LEN bytes were read");
        self.read(pos, total)
    }

    fn publish_sealed(&self, s: SealedSegment) {
        let mut subs = self.sealed_subscribers.lock().expect("invariant: lock not poisoned");
        subs.retain(|tx| tx.send(s.clone()).is_ok());
    }
}

/// The group-commit writer. Runs on its own thread until it receives `Shutdown`.
pub(crate) struct Writer {
    shared: Arc<LogShared>,
    rx: Receiver<WriterMsg>,
    active: Arc<Segment>,
    active_since: Instant,
    dirty: bool,
    last_sync: Instant,
}

impl Writer {
    pub fn new(shared: Arc<LogShared>, active: Arc<Segment>, rx: Receiver<WriterMsg>) -> Self {
        Self { shared, rx, active, active_since: Instant::now(), dirty: false, last_sync: Instant::now() }
    }

    pub fn run(mut self) {
        let cfg = self.shared.config.clone();
        let max_age = Duration::from_millis(cfg.segment_max_age_ms);
        let interval = Duration::from_millis(cfg.fsync_interval_ms);
        let mut shutdown = false;
        while !shutdown {
            let mut wait = max_age.saturating_sub(self.active_since.elapsed());
            if cfg.fsync == FsyncPolicy::Interval && self.dirty {
                wait = wait.min(interval.saturating_sub(self.last_sync.elapsed()));
            }
            let first = match self.rx.recv_timeout(wait.max(Duration::from_millis(1))) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => Some(WriterMsg::Shutdown),
            };
            let mut appends = Vec::new();
            let mut syncs = Vec::new();
            let mut rolls = Vec::new();
            let mut bytes = 0usize;
            let mut next = first;
            while let Some(msg) = next.take() {
                match msg {
                    WriterMsg::Append(p) => {
                        bytes += p.batch.frame.len();
                        appends.push(p);
                    }
                    WriterMsg::Sync(tx) => syncs.push(tx),
                    WriterMsg::Roll(tx) => rolls.push(tx),
                    WriterMsg::Shutdown => {
                        shutdown = true;
                        break;
                    }
                }
                if bytes < cfg.max_write_bytes as usize {
                    next = self.rx.try_recv().ok();
                }
            }
            let result = self.step(appends, &cfg, !syncs.is_empty() || shutdown);
            for tx in syncs {
                let _ = tx.send(result.as_ref().map(|_| ()).map_err(|_| Error::Closed));
            }
            if let Err(e) = result {
                tracing::error!(error = %e, "commitlog writer failed; refusing further appends");
                self.shared.failed.store(true, Ordering::Release);
                self.fail_remaining();
                return;
            }
            if !rolls.is_empty() {
                let rolled = if self.active.len() > SEGMENT_HEADER_LEN { self.roll() } else { Ok(()) };
                let answer = rolled.as_ref().map(|_| self.active.base).map_err(|_| Error::Closed);
                for tx in rolls {
                    let _ = tx.send(answer.as_ref().map(|p| *p).map_err(|_| Error::Closed));
                }
                if let Err(e) = rolled {
                    tracing::error!(error = %e, "commitlog roll failed; refusing further appends");
                    self.shared.failed.store(true, Ordering::Release);
                    self.fail_remaining();
                    return;
                }
            }
            if !shutdown
                && self.active.len() > SEGMENT_HEADER_LEN
                && self.active_since.elapsed() >= max_age
                && let Err(e) = self.roll()
            {
                tracing::error!(error = %e, "commitlog roll failed; refusing further appends");
                self.shared.failed.store(true, Ordering::Release);
                self.fail_remaining();
                return;
            }
        }
        // Everything sent before `Shutdown` has been written and, by the forced sync, fsynced.
        self.fail_remaining();
    }

    /// Writes one group of appends, fsyncs as the policy says, and acknowledges them.
    fn step(&mut self, appends: Vec<PendingAppend>, cfg: &StorageConfig, force_sync: bool) -> Result<()> {
        if !appends.is_empty() {
            let bytes: usize = appends.iter().map(|p| p.batch.frame.len()).sum();
            if self.active.len() > SEGMENT_HEADER_LEN && self.active.len() + bytes as u64 > cfg.segment_bytes {
                self.roll()?;
            }
            let base = self.active.end();
            let mut frames = Vec::with_capacity(appends.len());
            let mut acks = Vec::with_capacity(appends.len());
            let mut written = 0u64;
            for p in appends {
                let at = base.add(written);
                let frame = Bytes::from(p.batch.frame);
                written += frame.len() as u64;
                let positions = p.batch.records.iter().map(|(off, _)| at.add(u64::from(*off))).collect();
                acks.push((p.done, Appended { positions, end: base.add(written) }, p.volatile));
                frames.push(frame);
            }
            if let Err(e) = self.active.append_frames(&frames) {
                for (tx, _, _) in acks {
                    let _ = tx.send(Err(Error::Closed));
                }
                return Err(e);
            }
            self.dirty = true;
            // Volatile batches promise nothing past the process: answered before the fsync,
            // and a group of them alone needs none (the next durable group's covers them).
            let (volatile, acks): (Vec<_>, Vec<_>) = acks.into_iter().partition(|(_, _, v)| *v);
            for (tx, appended, _) in volatile {
                let _ = tx.send(Ok(appended));
            }
            if (cfg.fsync == FsyncPolicy::Always && !acks.is_empty()) || force_sync {
                // On error the acknowledgements are dropped unanswered: their appenders see
                // `Closed`, never a false success.
                self.sync()?;
            }
            let end = base.add(written);
            {
                let mut tail = self.shared.tail.lock().expect("invariant: lock not poisoned");
                let mut at = base;
                for f in frames {
                    let len = f.len() as u64;
                    tail.insert(at, f);
                    at = at.add(len);
                }
            }
            *self.shared.end.lock().expect("invariant: lock not poisoned") = end;
            self.shared.end_moved.notify_all();
            for (tx, appended, _) in acks {
                let _ = tx.send(Ok(appended));
            }
        }
        let interval_due = cfg.fsync == FsyncPolicy::Interval
            && self.last_sync.elapsed() >= Duration::from_millis(cfg.fsync_interval_ms);
        if self.dirty && (force_sync || interval_due) {
            self.sync()?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        self.active.sync()?;
        self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.dirty = false;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Seals the active segment and starts the next one at its end.
    fn roll(&mut self) -> Result<()> {
        self.active.seal()?;
        let sealed = SealedSegment { base: self.active.base, end: self.active.end(), path: self.active.path.clone() };
        let next = Arc::new(Segment::create(&self.shared.dir, sealed.end)?);
        self.shared.segments.write().expect("invariant: lock not poisoned").insert(next.base.get(), next.clone());
        tracing::debug!(base = %sealed.base, end = %sealed.end, "segment sealed");
        self.active = next;
        self.active_since = Instant::now();
        self.dirty = false;
        // The new segment starts on its header; readers skip it with `normalize`.
        *self.shared.end.lock().expect("invariant: lock not poisoned") = self.active.end();
        self.shared.end_moved.notify_all();
        self.shared.publish_sealed(sealed);
        Ok(())
    }

    fn fail_remaining(&mut self) {
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                WriterMsg::Append(p) => {
                    let _ = p.done.send(Err(Error::Closed));
                }
                WriterMsg::Sync(tx) => {
                    let _ = tx.send(Err(Error::Closed));
                }
                WriterMsg::Roll(tx) => {
                    let _ = tx.send(Err(Error::Closed));
                }
                WriterMsg::Shutdown => {}
            }
        }
    }
}
