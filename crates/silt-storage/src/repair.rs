//! Checked reads of segment files, and the repair of a batch that fails its checks.
//!
//! A read from a segment file first makes sure the batches covering it were checked (CRC,
//! framing), walking forward from the segment's checked watermark (see `segment`). A batch
//! that fails is repaired by one mechanism, whoever found it (a reader, the dispatcher, the
//! uploader, recovery):
//!
//! 1. *Healed*: a good copy of the batch at the same position — the writer's own buffer in the
//!    tail cache, else the object store's copy (a segment or tail object) — is checked and
//!    written over the local bytes (positioned write, fsync). The store's copy of a record of
//!    a `tier = "local"` or volatile topic is a withheld stand-in: such records read as gone
//!    afterwards.
//! 2. *Quarantined* when no good copy exists: the bad bytes are copied to
//!    `log/quarantine/{segment base}-{position}.bad` (fsynced), and the range is overwritten
//!    by gap batches of the same total length. Readers get [`Error::Quarantined`] (of kind
//!    `Expired`: the records are gone, skipped like expired ones), dispatch indexes nothing.
//! 3. *Deferred* when the store holds the batch but cannot be reached (or is not attached yet,
//!    for a short grace after start): a retryable error, never a quarantine.
//!
//! The end of a bad range: where its own length field points, if a valid batch is there; else
//! the next offset, at least one minimal frame on, that holds a valid batch (a resync: a cheap
//! header filter, then the CRC); else the end of the readable bytes.
//!
//! Invariants: one walk or repair per segment at a time (the segment's checking lock); nothing
//! is written at or past `limit`, the end of what the writer has made readable. Not guaranteed:
//! a resync can be fooled by a payload that is itself a valid batch, when the bad batch's own
//! length field is damaged; gap batches cannot stand in for a bad range shorter than a minimal
//! frame, which is then skipped in memory only (and found again after a restart).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use silt_types::LogPosition;

use crate::error::{Error, ErrorKind, Result};
use crate::format::{self, FRAME_LEN, FrameKind, MIN_FRAME_LEN};
use crate::log::ColdReader;
use crate::segment::{self, Segment, Window};
use crate::tail::TailCache;

/// A walk checks at least this far past what a read needs, so sequential readers walk (and
/// leave the runtime thread) once per this many bytes, not once per batch.
const CHECK_AHEAD: u64 = 256 << 10;

/// Counters of repairs since the log was opened.
#[derive(Debug, Default)]
pub(crate) struct RepairStats {
    pub healed_batches: AtomicU64,
    pub quarantined_batches: AtomicU64,
    pub quarantined_bytes: AtomicU64,
    /// Records inside valid batches that dispatch could not index (a head that does not
    /// decode, a control record with an invalid filter).
    pub skipped_records: AtomicU64,
}

impl RepairStats {
    pub fn count(&self, q: &Quarantined) {
        self.quarantined_batches.fetch_add(1, Ordering::Relaxed);
        self.quarantined_bytes.fetch_add(q.len, Ordering::Relaxed);
    }
}

/// One quarantined range (logged where it is quarantined).
#[derive(Debug)]
pub(crate) struct Quarantined {
    pub len: u64,
}

/// What a checked frame at an offset is.
pub(crate) enum Found {
    Batch(u64),
    Gap(u64),
}

/// What a walk needs besides the segment.
pub(crate) struct Ctx<'a> {
    pub quarantine_dir: &'a Path,
    pub max_batch: usize,
    pub tail: &'a Mutex<TailCache>,
    pub cold: Option<&'a dyn ColdReader>,
    /// No cold reader yet, but one is expected shortly (just after the log opened).
    pub cold_pending: bool,
    pub stats: &'a RepairStats,
}

/// The directory quarantined bytes go to.
pub(crate) fn quarantine_dir(log_dir: &Path) -> PathBuf {
    log_dir.join("quarantine")
}

/// Runs `f`, which may block on the disk or the object store, through `block_in_place` when
/// called on a multi-threaded runtime's worker, so the worker's other tasks move elsewhere.
pub(crate) fn off_runtime<T>(f: impl FnOnce() -> T) -> T {
    let on_worker = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if on_worker { tokio::task::block_in_place(f) } else { f() }
}

/// Makes sure `[off, off + len)` of `seg` is checked (repairing what fails). `Err(Quarantined)`
/// when the range touches a gap, unless `gaps_ok` (then the gap batches' bytes may be read as
/// they are: an upload copies the log as it is). `slow` gives the readable length and what a
/// walk needs; the fast path (the range was checked before) does not call it.
pub(crate) fn ensure<'c>(
    seg: &Segment,
    off: u64,
    len: u64,
    gaps_ok: bool,
    slow: impl FnOnce() -> (u64, Ctx<'c>),
) -> Result<()> {
    let covered = || match seg.checked(off, len) {
        Err(Error::Quarantined(_)) if gaps_ok => Ok(true),
        r => r,
    };
    if covered()? {
        return Ok(());
    }
    let (limit, ctx) = slow();
    if off + len > limit {
        return Err(Error::NotFound(seg.base.get() + off));
    }
    // Twice at most: a fresh check of the whole segment (the uploader's, after a failed
    // upload) may reset the watermark between the walk and the look.
    for _ in 0..2 {
        off_runtime(|| {
            let guard = seg.lock_walk();
            walk(seg, &guard, off + len, (off + len + CHECK_AHEAD).min(limit), limit, &ctx)
        })?;
        if covered()? {
            return Ok(());
        }
    }
    Err(Error::NotFound(seg.base.get() + off))
}

/// Checks (and repairs) every batch of `seg` up to `limit`; returns its gaps.
pub(crate) fn ensure_all(seg: &Segment, limit: u64, fresh: bool, ctx: &Ctx<'_>) -> Result<Vec<(u64, u64)>> {
    let guard = seg.lock_walk();
    if fresh {
        seg.reset_checks(&guard);
    }
    walk(seg, &guard, limit, limit, limit, ctx)?;
    Ok(seg.gaps())
}

/// Walks from the watermark: every batch before `need` is checked or repaired; batches
/// between `need` and `ahead` are checked while they pass.
fn walk(seg: &Segment, guard: &MutexGuard<'_, ()>, need: u64, ahead: u64, limit: u64, ctx: &Ctx<'_>) -> Result<()> {
    let mut at = seg.upto();
    let mut window = seg.window(limit);
    while at < ahead.max(need) {
        match check_at(&mut window, at, limit, ctx.max_batch)? {
            Ok(Found::Batch(total)) => at += total,
            Ok(Found::Gap(total)) => {
                seg.add_gap(guard, at, at + total);
                at += total;
            }
            Err(_) if at >= need => break, // not needed yet: repaired when a read needs it
            Err(reason) => {
                at = repair(&mut window, guard, at, limit, ctx, &reason)?;
                window.forget();
            }
        }
        seg.set_upto(guard, at);
    }
    Ok(())
}

/// Checks the frame at file offset `at`, `limit` being the readable length. The inner result
/// says why the bytes are not a valid frame; the outer one is an I/O error.
pub(crate) fn check_at(
    seg: &mut Window<'_>,
    at: u64,
    limit: u64,
    max: usize,
) -> Result<std::result::Result<Found, String>> {
    if limit - at < FRAME_LEN as u64 {
        return Ok(Err("partial frame header".into()));
    }
    let head = seg.copy_at(at, FRAME_LEN as u64)?;
    let total = match format::peek_frame(&head, max) {
        Err(e) => return Ok(Err(e.to_string())),
        Ok(None) => return Ok(Err("partial frame header".into())),
        Ok(Some(t)) => t as u64,
    };
    if at + total > limit {
        return Ok(Err("batch extends past the end of the segment".into()));
    }
    let frame = seg.copy_at(at, total)?;
    Ok(match format::check_frame(&frame, max) {
        Ok(FrameKind::Records(_)) => Ok(Found::Batch(total)),
        Ok(FrameKind::Gap) => Ok(Found::Gap(total)),
        Err(e) => Err(e.to_string()),
    })
}

/// Where the bad range starting at `at` ends (see the module documentation).
pub(crate) fn bad_end(seg: &mut Window<'_>, at: u64, limit: u64, max: usize) -> Result<u64> {
    if limit - at >= FRAME_LEN as u64 {
        let head = seg.copy_at(at, FRAME_LEN as u64)?;
        if let Ok(Some(total)) = format::peek_frame(&head, max) {
            let next = at + total as u64;
            if next < limit && check_at(seg, next, limit, max)?.is_ok() {
                return Ok(next);
            }
        }
    }
    // A length field pointing exactly at the end is no evidence either way (a damaged one may
    // too): a valid batch found before the end wins.
    Ok(resync(seg.segment(), at + MIN_FRAME_LEN as u64, limit, max)?.unwrap_or(limit))
}

/// The first offset in `[from, limit)` holding a valid batch.
fn resync(seg: &Segment, from: u64, limit: u64, max: usize) -> Result<Option<u64>> {
    const WINDOW: u64 = 1 << 20;
    const HEAD: u64 = MIN_FRAME_LEN as u64 + 4;
    let mut p = from;
    while p + (MIN_FRAME_LEN as u64) <= limit {
        let n = (WINDOW + HEAD).min(limit - p);
        let w = seg.copy_at(p, n)?;
        let scan = if p + n == limit { n } else { n - HEAD };
        for i in 0..scan {
            let head = &w[i as usize..(i + HEAD).min(n) as usize];
            let Some(total) = format::frame_candidate(head, max, limit - (p + i)) else { continue };
            let total = total as u64;
            let frame =
                if i + total <= n { w.slice(i as usize..(i + total) as usize) } else { seg.copy_at(p + i, total)? };
            if format::check_frame(&frame, max).is_ok() {
                return Ok(Some(p + i));
            }
        }
        p += scan;
    }
    Ok(None)
}

/// Repairs the bad batch at `at`; returns the offset just past the repaired range.
fn repair(
    window: &mut Window<'_>,
    guard: &MutexGuard<'_, ()>,
    at: u64,
    limit: u64,
    ctx: &Ctx<'_>,
    reason: &str,
) -> Result<u64> {
    let seg = window.segment();
    let pos = seg.base.add(at);
    let room = limit - at;
    let good = match from_tail(ctx, pos, room) {
        Some(frame) => Some((frame, "the tail cache")),
        None => match ctx.cold {
            Some(cold) => match from_store(cold, pos, room, ctx.max_batch) {
                Ok(frame) => frame.map(|f| (f, "the object store")),
                Err(e) => {
                    return Err(Error::Unavailable(format!(
                        "the batch at {pos} failed its checks ({reason}); the object store holds a copy but cannot be read now: {e}"
                    )));
                }
            },
            None if ctx.cold_pending => {
                return Err(Error::Unavailable(format!(
                    "the batch at {pos} failed its checks ({reason}); waiting for the object store to be attached"
                )));
            }
            None => None,
        },
    };
    if let Some((frame, from)) = good {
        seg.patch(guard, at, &frame, true)
            .map_err(|e| Error::Unavailable(format!("the batch at {pos} could be healed but not written: {e}")))?;
        ctx.stats.healed_batches.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            segment = %seg.path.display(), position = %pos, len = frame.len(), reason, from,
            "a batch failed its checks; healed from a good copy"
        );
        return Ok(at + frame.len() as u64);
    }
    let end = bad_end(window, at, limit, ctx.max_batch)?;
    let q = quarantine(seg, guard, at, end, ctx.max_batch, ctx.quarantine_dir, reason)?;
    ctx.stats.count(&q);
    Ok(end)
}

/// The writer's own copy of the batch at `pos`, if the tail cache still holds it and it checks.
fn from_tail(ctx: &Ctx<'_>, pos: LogPosition, room: u64) -> Option<Bytes> {
    let tail = ctx.tail.lock().expect("invariant: lock not poisoned");
    let head = tail.get(pos, FRAME_LEN)?;
    let total = format::peek_frame(&head, ctx.max_batch).ok().flatten()?;
    let frame = tail.get(pos, total).filter(|_| total as u64 <= room)?;
    format::check_frame(&frame, ctx.max_batch).is_ok().then_some(frame)
}

/// The object store's copy of the batch at `pos`: `Ok(None)` when the store holds none or a
/// bad one too; `Err` when it holds one that cannot be read now.
fn from_store(cold: &dyn ColdReader, pos: LogPosition, room: u64, max: usize) -> Result<Option<Bytes>> {
    let transient = |e: Error| if e.kind() == ErrorKind::Retryable { Err(e) } else { Ok(None) };
    let head = match cold.read_uploaded(pos, FRAME_LEN) {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(None),
        Err(e) => return transient(e),
    };
    let total = match format::peek_frame(&head, max) {
        Ok(Some(t)) if t as u64 <= room => t,
        _ => {
            tracing::warn!(position = %pos, "the object store's copy of a bad batch is bad too");
            return Ok(None);
        }
    };
    let frame = match cold.read_uploaded(pos, total) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(None),
        Err(e) => return transient(e),
    };
    if let Err(e) = format::check_frame(&frame, max) {
        tracing::warn!(position = %pos, error = %e, "the object store's copy of a bad batch is bad too");
        return Ok(None);
    }
    Ok(Some(frame))
}

/// Copies `[start, end)` of `seg` to the quarantine directory and overwrites it with gap
/// batches; records the gap. When the copy cannot be made the bytes stay where they are and
/// the gap is kept in memory only.
pub(crate) fn quarantine(
    seg: &Segment,
    guard: &MutexGuard<'_, ()>,
    start: u64,
    end: u64,
    max: usize,
    dir: &Path,
    reason: &str,
) -> Result<Quarantined> {
    let position = seg.base.add(start);
    let len = end - start;
    let file = match copy_aside(seg, start, end, dir) {
        Ok(path) => Some(path),
        Err(e) => {
            tracing::error!(segment = %seg.path.display(), position = %position, error = %e, "quarantine copy failed; the bad bytes stay in place");
            None
        }
    };
    let patched = match (&file, format::gap_sizes(len, max)) {
        (Some(_), Some(sizes)) => {
            let mut at = start;
            let mut result = Ok(());
            for size in sizes {
                result = seg.patch(guard, at, &format::encode_gap(size as usize), true);
                if result.is_err() {
                    break;
                }
                at += size;
            }
            result.map_err(|e| tracing::error!(segment = %seg.path.display(), error = %e, "writing a gap batch failed; the gap is kept in memory"))
                .is_ok()
        }
        _ => false,
    };
    seg.add_gap(guard, start, end);
    tracing::error!(
        segment = %seg.path.display(), position = %position, len, reason,
        quarantine_file = %file.as_ref().map_or_else(|| "none".into(), |p| p.display().to_string()),
        gap_batch = patched,
        "a batch failed its checks and no good copy exists; quarantined, its records are lost"
    );
    Ok(Quarantined { len })
}

/// Writes the bytes `[start, end)` to `{dir}/{segment base}-{position}.bad`, fsynced.
fn copy_aside(seg: &Segment, start: u64, end: u64, dir: &Path) -> Result<PathBuf> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(Error::io("create quarantine directory", dir))?;
    let path = dir.join(format!("{:020}-{:020}.bad", seg.base.get(), seg.base.get() + start));
    let mut f = std::fs::File::create(&path).map_err(Error::io("create quarantine file", &path))?;
    let mut at = start;
    while at < end {
        let n = (4u64 << 20).min(end - at);
        f.write_all(&seg.copy_at(at, n)?).map_err(Error::io("write quarantine file", &path))?;
        at += n;
    }
    f.sync_all().map_err(Error::io("fsync quarantine file", &path))?;
    segment::sync_dir(dir)?;
    Ok(path)
}
