//! The group-commit writer: one thread that takes every batch waiting (up to
//! `max_write_bytes`), writes them with one positioned vectored write (no copy into a joint
//! buffer) and — under `fsync = "always"` — one fsync, then acknowledges them all. Under
//! `interval` it acknowledges after the write and fsyncs on a timer; under `never` only at
//! seal and shutdown. Volatile (`tier = "memory"`) batches are answered right after the write.
//!
//! A failed write or fsync (a full disk, an I/O error) fails only the appends of that group,
//! none of which was acknowledged: the active segment is cut back to its length before the
//! group (`set_len` and fsync) and the writer goes on, so appends succeed again once the disk
//! has room, without a restart. If the cut itself fails, appends are refused with a clear error
//! and the cut is retried every second until it works. When volatile batches of the group were
//! already answered, the group's other batches are overwritten with gap batches instead, so
//! no answered position is ever reused. A roll creates the next segment before it seals the
//! active one, so a failed roll leaves the active segment active. Nothing here stops the log
//! for good.
//!
//! Under `always` a second thread, `silt-log-zeros`, writes zeros ahead of the active segment's
//! end (`preallocate_bytes` at a time, see `segment`), so the group's fsync finds its blocks
//! allocated and the file's size unchanged.
//!
//! Not guaranteed (fsyncgate): after a failed fsync Linux may drop the dirty pages and report
//! the next fsync clean. Under `fsync = "interval"` (and `never`) data acknowledged since the
//! last good fsync may be lost in a machine crash after such a failure; it is logged. Under
//! `always` nothing acknowledged depends on a failed fsync.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use silt_types::LogPosition;
use tokio::sync::oneshot;

use crate::config::{FsyncPolicy, StorageConfig};
use crate::error::{Error, Result};
use crate::format::{self, SEGMENT_HEADER_LEN};
use crate::log::{Appended, LogShared, PendingAppend, SealedSegment, WriterMsg};
use crate::segment::{self, Segment};
use crate::throttle::Throttle;

/// How often a failed cut-back or roll is tried again.
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// Repeated failures of one kind are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// An append's answer channel (taken once answered), where it landed, and whether it is
/// volatile.
/// An append's answer channel, what it is answered with, whether it is volatile, and when it
/// was submitted (for the append latency).
type Ack = (Option<oneshot::Sender<Result<Appended>>>, Appended, bool, Instant);

/// The group-commit writer. Runs on its own thread until it receives `Shutdown`.
pub(crate) struct Writer {
    shared: Arc<LogShared>,
    rx: Receiver<WriterMsg>,
    active: Arc<Segment>,
    active_since: Instant,
    dirty: bool,
    last_sync: Instant,
    /// A failed write could not be cut back: the length to cut the active segment back to,
    /// and why. Appends are refused until the cut succeeds.
    broken: Option<(u64, String)>,
    /// No roll is tried before this (after a failed one).
    roll_after: Instant,
    write_failures: Throttle,
    sync_failures: Throttle,
    roll_failures: Throttle,
    /// The thread writing zeros ahead of the active segment, under `fsync = "always"`.
    zeros: Option<(Arc<Zeroer>, std::thread::JoinHandle<()>)>,
}

/// What the writer and the `silt-log-zeros` thread share: the segment to write zeros ahead of
/// (`None` tells the thread to end), and its wake-up.
struct Zeroer {
    target: Mutex<Option<Arc<Segment>>>,
    wake: Condvar,
    /// Bytes of zeros written at a time, and kept ahead of the end at least.
    chunk: u64,
    /// No zeros past this file size (the segment size).
    cap: u64,
}

impl Zeroer {
    fn run(&self) {
        let mut failures = Throttle::new(LOG_EVERY);
        let mut target = self.target.lock().expect("invariant: lock not poisoned");
        while let Some(seg) = target.clone() {
            if !seg.wants_zeros(self.chunk, self.cap) {
                // Woken when the writer nears the zeroed end or rolls; the timeout only bounds
                // a wake-up lost between the check and the wait.
                target =
                    self.wake.wait_timeout(target, Duration::from_millis(100)).expect("invariant: lock not poisoned").0;
                continue;
            }
            drop(target);
            let wrote = seg.zero_ahead(self.chunk, self.cap);
            match &wrote {
                Ok(_) => {
                    if failures.recovered() {
                        tracing::info!("commitlog preallocation works again");
                    }
                }
                Err(e) => {
                    if let Some(n) = failures.failed() {
                        tracing::warn!(error = %e, failures = n, "commitlog preallocation failed (appends go on, with slower fsyncs); retrying");
                    }
                }
            }
            target = self.target.lock().expect("invariant: lock not poisoned");
            if !matches!(wrote, Ok(true)) && target.as_ref().is_some_and(|t| Arc::ptr_eq(t, &seg)) {
                // Failed, or the segment takes no more zeros: wait for a roll (or a second).
                target = self.wake.wait_timeout(target, RETRY_EVERY).expect("invariant: lock not poisoned").0;
            }
        }
    }

    fn retarget(&self, seg: Option<Arc<Segment>>) {
        *self.target.lock().expect("invariant: lock not poisoned") = seg;
        self.wake.notify_one();
    }
}

impl Writer {
    pub fn new(shared: Arc<LogShared>, active: Arc<Segment>, rx: Receiver<WriterMsg>) -> Self {
        let now = Instant::now();
        let cfg = &shared.config;
        let zeros = (cfg.fsync == FsyncPolicy::Always && cfg.preallocate_bytes > 0)
            .then(|| {
                let z = Arc::new(Zeroer {
                    target: Mutex::new(Some(active.clone())),
                    wake: Condvar::new(),
                    chunk: cfg.preallocate_bytes,
                    cap: cfg.segment_bytes,
                });
                let thread = z.clone();
                match std::thread::Builder::new().name("silt-log-zeros".into()).spawn(move || thread.run()) {
                    Ok(handle) => Some((z, handle)),
                    Err(e) => {
                        tracing::warn!(error = %e, "commitlog preallocation thread not started; fsyncs will be slower");
                        None
                    }
                }
            })
            .flatten();
        Self {
            zeros,
            shared,
            rx,
            active,
            active_since: now,
            dirty: false,
            last_sync: now,
            broken: None,
            roll_after: now,
            write_failures: Throttle::new(LOG_EVERY),
            sync_failures: Throttle::new(LOG_EVERY),
            roll_failures: Throttle::new(LOG_EVERY),
        }
    }

    pub fn run(mut self) {
        let cfg = self.shared.config.clone();
        let max_age = Duration::from_millis(cfg.segment_max_age_ms);
        let interval = Duration::from_millis(cfg.fsync_interval_ms);
        let mut shutdown = false;
        while !shutdown {
            let mut wait = max_age.saturating_sub(self.active_since.elapsed());
            wait = wait.max(self.roll_after.saturating_duration_since(Instant::now()));
            if cfg.fsync == FsyncPolicy::Interval && self.dirty {
                wait = wait.min(interval.saturating_sub(self.last_sync.elapsed()));
            }
            if self.broken.is_some() {
                wait = wait.min(RETRY_EVERY);
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
            self.retry_cut();
            let synced = self.step(appends, &cfg, !syncs.is_empty() || shutdown);
            for tx in syncs {
                let _ = tx.send(synced.as_ref().map(|_| ()).map_err(|e| Error::Unavailable(e.to_string())));
            }
            if shutdown && let Err(e) = &synced {
                tracing::error!(error = %e, "the final fsync at shutdown failed; data written since the last good fsync may be lost in a machine crash");
                self.shared.unclean.store(true, Ordering::Release);
            }
            if !rolls.is_empty() {
                let rolled = if self.active.len() > SEGMENT_HEADER_LEN { self.roll() } else { Ok(()) };
                let answer = rolled.map(|_| self.active.base);
                for tx in rolls {
                    let _ = tx.send(answer.as_ref().map(|p| *p).map_err(|e| Error::Unavailable(e.to_string())));
                }
            }
            if !shutdown && self.active_since.elapsed() >= max_age && Instant::now() >= self.roll_after {
                if self.active.len() > SEGMENT_HEADER_LEN {
                    let _ = self.roll();
                } else {
                    // Nothing to seal: the age counts from now, so an idle writer sleeps.
                    self.active_since = Instant::now();
                }
            }
        }
        // Everything sent before `Shutdown` has been written and, by the forced sync, fsynced.
        self.fail_remaining();
        if let Some((z, handle)) = self.zeros.take() {
            z.retarget(None);
            let _ = handle.join();
            // The file ends where its data does again (a crash would have cut the zeros too).
            if let Err(e) = self.active.finish_zeroing().and_then(|()| self.active.sync()) {
                tracing::warn!(error = %e, "cutting the preallocated zeros off the active segment failed; the next start cuts them");
            }
        }
    }

    /// Writes one group of appends, fsyncs as the policy says, and answers them. Returns the
    /// outcome of the fsync when one was forced (`force_sync`) or due.
    fn step(&mut self, appends: Vec<PendingAppend>, cfg: &StorageConfig, force_sync: bool) -> Result<()> {
        if let Some((_, why)) = &self.broken {
            let refused = format!(
                "the commitlog refuses appends until a failed write is cut back ({why}); retrying every second"
            );
            for p in appends {
                let _ = p.done.send(Err(Error::Unavailable(refused.clone())));
            }
            return if force_sync { Err(Error::Unavailable(refused)) } else { Ok(()) };
        }
        if !appends.is_empty() {
            self.write_group(appends, cfg);
            if let Some((z, _)) = &self.zeros
                && self.active.wants_zeros(z.chunk, z.cap)
            {
                z.wake.notify_one();
            }
        }
        let interval_due = cfg.fsync == FsyncPolicy::Interval
            && self.last_sync.elapsed() >= Duration::from_millis(cfg.fsync_interval_ms);
        if self.dirty && (force_sync || interval_due) {
            if let Err(e) = self.sync() {
                if let Some(n) = self.sync_failures.failed() {
                    tracing::error!(
                        error = %e, failures = n,
                        "commitlog fsync failed; data acknowledged since the last good fsync may be lost in a machine crash"
                    );
                }
                return Err(e);
            }
            if self.sync_failures.recovered() {
                tracing::info!("commitlog fsync works again");
            }
        }
        Ok(())
    }

    /// One group: write, fsync under `always`, publish, answer. On failure the group's appends
    /// are refused and the segment is cut back (see the module documentation).
    fn write_group(&mut self, appends: Vec<PendingAppend>, cfg: &StorageConfig) {
        let bytes: u64 = appends.iter().map(|p| p.batch.frame.len() as u64).sum();
        if self.active.len() > SEGMENT_HEADER_LEN
            && self.active.len() + bytes > cfg.segment_bytes
            && Instant::now() >= self.roll_after
        {
            // On failure the group goes into the current segment, which grows past its size.
            let _ = self.roll();
        }
        let base = self.active.end();
        let start_len = self.active.len();
        let mut frames = Vec::with_capacity(appends.len());
        let mut acks: Vec<Ack> = Vec::with_capacity(appends.len());
        let mut written = 0u64;
        for p in appends {
            let at = base.add(written);
            let frame = Bytes::from(p.batch.frame);
            written += frame.len() as u64;
            let positions = p.batch.records.iter().map(|(off, _)| at.add(u64::from(*off))).collect();
            acks.push((Some(p.done), Appended { positions, end: base.add(written) }, p.volatile, p.queued));
            frames.push(frame);
        }
        if let Err(e) = self.active.append_frames(&frames) {
            let why = e.to_string();
            if let Some(n) = self.write_failures.failed() {
                tracing::error!(error = %why, failures = n, "commitlog write failed; its appends are refused, the writer goes on");
            }
            refuse(&mut acks, &format!("commitlog write failed ({why}); the append was not stored"));
            self.cut_back(start_len, why);
            return;
        }
        if self.write_failures.recovered() {
            tracing::info!("commitlog writes work again");
        }
        self.dirty = true;
        // Volatile batches promise nothing past the process: answered before the fsync, and a
        // group of them alone needs none (the next durable group's covers them).
        let mut answered_early = false;
        for (tx, appended, volatile, queued) in acks.iter_mut() {
            if *volatile && let Some(tx) = tx.take() {
                self.shared.append_latency.observe(queued.elapsed());
                let _ = tx.send(Ok(appended.clone()));
                answered_early = true;
            }
        }
        let durable = acks.iter().any(|(_, _, v, _)| !v);
        if cfg.fsync == FsyncPolicy::Always
            && durable
            && let Err(e) = self.sync()
        {
            let why = e.to_string();
            if let Some(n) = self.sync_failures.failed() {
                tracing::error!(error = %why, failures = n, "commitlog fsync failed; its appends are refused, the writer goes on");
            }
            refuse(&mut acks, &format!("commitlog fsync failed ({why}); the append was not stored"));
            if answered_early {
                self.void_durable(base, frames, &acks, start_len, why);
            } else {
                self.cut_back(start_len, why);
            }
            return;
        }
        self.publish(base, frames);
        for (tx, appended, _, queued) in acks {
            if let Some(tx) = tx {
                self.shared.append_latency.observe(queued.elapsed());
                let _ = tx.send(Ok(appended));
            }
        }
    }

    /// Makes the bytes of a group visible to readers and the dispatcher.
    fn publish(&mut self, base: LogPosition, frames: Vec<Bytes>) {
        let mut at = base;
        {
            let mut tail = self.shared.tail.lock().expect("invariant: lock not poisoned");
            for f in frames {
                let len = f.len() as u64;
                tail.insert(at, f);
                at = at.add(len);
            }
        }
        *self.shared.end.lock().expect("invariant: lock not poisoned") = at;
        self.shared.end_moved.notify_all();
    }

    /// After a failed fsync of a group whose volatile batches were already answered: the
    /// other batches become gap batches (they were refused), the volatile ones stay, and the
    /// group is published, so no answered position is reused. Falls back to cutting back.
    fn void_durable(&mut self, base: LogPosition, frames: Vec<Bytes>, acks: &[Ack], start_len: u64, why: String) {
        let guard = self.active.lock_walk();
        let mut off = start_len;
        let mut result = Ok(());
        let mut kept = Vec::with_capacity(frames.len());
        for (frame, (_, _, volatile, _)) in frames.into_iter().zip(acks) {
            let len = frame.len() as u64;
            if *volatile {
                kept.push(frame);
            } else {
                let gap = Bytes::from(format::encode_gap(frame.len()));
                if result.is_ok() {
                    // No fsync: the refused batches must not be served now; after a crash they were
                    // never acknowledged either way.
                    result = self.active.patch(&guard, off, &gap, false);
                }
                kept.push(gap);
            }
            off += len;
        }
        drop(guard);
        match result {
            Ok(()) => self.publish(base, kept),
            Err(e) => {
                tracing::error!(error = %e, "voiding refused batches failed; volatile records answered in that group are lost");
                self.cut_back(start_len, why);
            }
        }
    }

    /// Cuts the active segment back to `len` after a failed write; on failure appends are
    /// refused until [`Self::retry_cut`] succeeds.
    fn cut_back(&mut self, len: u64, why: String) {
        match self.active.truncate_to(len) {
            Ok(()) => {
                tracing::debug!(segment = %self.active.path.display(), len, "commitlog cut back after a failed write; appends go on")
            }
            Err(e) => {
                tracing::error!(error = %e, "cutting back a failed write failed; appends are refused until it works (retried every second)");
                self.broken = Some((len, why));
            }
        }
    }

    fn retry_cut(&mut self) {
        let Some((len, _)) = &self.broken else { return };
        let len = *len;
        match self.active.truncate_to(len) {
            Ok(()) => {
                tracing::info!(segment = %self.active.path.display(), len, "failed write cut back; the commitlog accepts appends again");
                self.broken = None;
            }
            Err(e) => tracing::debug!(error = %e, "cutting back a failed write failed again"),
        }
    }

    fn sync(&mut self) -> Result<()> {
        let started = Instant::now();
        self.active.sync()?;
        self.shared.fsync_latency.observe(started.elapsed());
        self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.dirty = false;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Starts the next segment at the active one's end, then seals the active one. On failure
    /// the active segment stays active (and unsealed) and no roll is tried for a second.
    fn roll(&mut self) -> Result<()> {
        if self.broken.is_some() {
            return Err(Error::Unavailable("no roll while a failed write is not cut back".into()));
        }
        let result = self.try_roll();
        match &result {
            Ok(()) => {
                if self.roll_failures.recovered() {
                    tracing::info!("commitlog segments roll again");
                }
            }
            Err(e) => {
                self.roll_after = Instant::now() + RETRY_EVERY;
                if let Some(n) = self.roll_failures.failed() {
                    tracing::error!(error = %e, failures = n, "commitlog roll failed; the active segment stays active, retrying");
                }
            }
        }
        result
    }

    fn try_roll(&mut self) -> Result<()> {
        let dir = self.shared.dir.clone();
        let end = self.active.end();
        // The active segment ends where its data does, durably, before a next one exists: a
        // crash then never leaves zeros at the end of a segment opened as sealed.
        self.active.finish_zeroing()?;
        self.active.sync()?;
        let next = match Segment::create(&dir, end) {
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {
                // Left by a roll whose cleanup failed: it holds nothing yet.
                let path = dir.join(segment::file_name(end));
                if !segment::is_unborn(&path)? {
                    return Err(Error::Invalid(format!("{} exists and holds data", path.display())));
                }
                std::fs::remove_file(&path).map_err(Error::io("remove unborn segment", &path))?;
                Segment::create(&dir, end)?
            }
            other => other?,
        };
        self.active.mark_sealed();
        let next = Arc::new(next);
        let sealed = SealedSegment { base: self.active.base, end, path: self.active.path.clone() };
        self.shared.segments.write().expect("invariant: lock not poisoned").insert(next.base.get(), next.clone());
        tracing::debug!(base = %sealed.base, end = %sealed.end, "segment sealed");
        self.active = next;
        self.active_since = Instant::now();
        self.dirty = false;
        // The new segment starts on its header; readers skip it with `normalize`.
        *self.shared.end.lock().expect("invariant: lock not poisoned") = self.active.end();
        self.shared.end_moved.notify_all();
        self.shared.publish_sealed(sealed);
        if let Some((z, _)) = &self.zeros {
            z.retarget(Some(self.active.clone()));
        }
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

/// Answers every append of a group not answered yet with a refusal.
fn refuse(acks: &mut [Ack], why: &str) {
    for (tx, _, _, _) in acks.iter_mut() {
        if let Some(tx) = tx.take() {
            let _ = tx.send(Err(Error::Unavailable(why.to_owned())));
        }
    }
}
