//! Segment files: `{base:020}.log` in the log directory, where `base` is the log position of
//! the file's first byte. A segment is *active* (the writer appends to it with positioned
//! writes) or *sealed* (fsynced, immutable, memory-mapped for reads).
//!
//! Recovery ([`Segment::recover`]) scans a segment's batches from its header and truncates at
//! the first batch whose frame or CRC is wrong: a torn write from a crash is cut, never served.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use silt_types::LogPosition;

use crate::error::{Error, Result};
use crate::format::{self, FRAME_LEN, SEGMENT_HEADER_LEN};

#[derive(Debug)]
pub(crate) struct Segment {
    pub base: LogPosition,
    pub path: PathBuf,
    file: File,
    /// Bytes in the file that readers may see (the header included).
    len: AtomicU64,
    sealed: AtomicBool,
    map: OnceLock<Bytes>,
}

/// What recovery found in a segment.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    pub batches: u64,
    pub cut_bytes: u64,
    pub reason: Option<String>,
}

pub(crate) fn file_name(base: LogPosition) -> String {
    format!("{:020}.log", base.get())
}

/// Parses a segment file name back into its base position.
pub(crate) fn parse_file_name(name: &str) -> Option<LogPosition> {
    let digits = name.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(LogPosition)
}

/// Fsyncs a directory, making file creations and deletions in it durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(Error::io("fsync directory", dir))
}

/// Whether the segment file at `path` never got its header: no longer than a header and not
/// starting with a valid one (a crash inside [`Segment::create`]). Such a file holds no data.
pub fn is_unborn(path: &Path) -> Result<bool> {
    let len = std::fs::metadata(path).map_err(Error::io("stat segment", path))?.len();
    if len > SEGMENT_HEADER_LEN {
        return Ok(false);
    }
    let bytes = std::fs::read(path).map_err(Error::io("read segment", path))?;
    Ok(bytes.len() < SEGMENT_HEADER_LEN as usize || format::check_segment_header(&bytes).is_err())
}

impl Segment {
    /// Creates a new, empty segment file holding only the header, durably.
    pub fn create(dir: &Path, base: LogPosition) -> Result<Segment> {
        let path = dir.join(file_name(base));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(Error::io("create segment", &path))?;
        file.write_all_at(&format::segment_header(), 0).map_err(Error::io("write segment header", &path))?;
        file.sync_all().map_err(Error::io("fsync segment", &path))?;
        sync_dir(dir)?;
        Ok(Segment {
            base,
            path,
            file,
            len: AtomicU64::new(SEGMENT_HEADER_LEN),
            sealed: AtomicBool::new(false),
            map: OnceLock::new(),
        })
    }

    /// Opens an existing segment. Sealed segments are trusted to their length (they were
    /// fsynced before sealing); the last segment is recovered with [`Segment::recover`].
    pub fn open(path: PathBuf, base: LogPosition, sealed: bool) -> Result<Segment> {
        let file =
            OpenOptions::new().read(true).write(!sealed).open(&path).map_err(Error::io("open segment", &path))?;
        let len = file.metadata().map_err(Error::io("stat segment", &path))?.len();
        let mut header = [0u8; SEGMENT_HEADER_LEN as usize];
        if len >= SEGMENT_HEADER_LEN {
            file.read_exact_at(&mut header, 0).map_err(Error::io("read segment header", &path))?;
        }
        format::check_segment_header(&header).map_err(|source| Error::Corrupt { position: base.get(), source })?;
        Ok(Segment {
            base,
            path,
            file,
            len: AtomicU64::new(len),
            sealed: AtomicBool::new(sealed),
            map: OnceLock::new(),
        })
    }

    /// Verifies every batch after the header and truncates the file after the last valid one.
    pub fn recover(&self, max_batch_bytes: usize) -> Result<Recovered> {
        let file_len = self.len();
        let mut pos = SEGMENT_HEADER_LEN;
        let mut out = Recovered::default();
        let mut header = [0u8; FRAME_LEN];
        while pos < file_len {
            let reason = if file_len - pos < FRAME_LEN as u64 {
                Some("partial frame header".to_string())
            } else {
                self.file.read_exact_at(&mut header, pos).map_err(Error::io("read segment", &self.path))?;
                match format::peek_frame(&header, max_batch_bytes) {
                    Err(e) => Some(e.to_string()),
                    Ok(None) => Some("partial frame header".to_string()),
                    Ok(Some(total)) if pos + total as u64 > file_len => Some("batch extends past end of file".into()),
                    Ok(Some(total)) => {
                        let mut frame = vec![0u8; total];
                        self.file.read_exact_at(&mut frame, pos).map_err(Error::io("read segment", &self.path))?;
                        match format::check_batch(Bytes::from(frame), max_batch_bytes) {
                            Ok(_) => {
                                pos += total as u64;
                                out.batches += 1;
                                None
                            }
                            Err(e) => Some(e.to_string()),
                        }
                    }
                }
            };
            if let Some(reason) = reason {
                out.cut_bytes = file_len - pos;
                out.reason = Some(reason);
                self.file.set_len(pos).map_err(Error::io("truncate segment", &self.path))?;
                self.file.sync_all().map_err(Error::io("fsync segment", &self.path))?;
                self.len.store(pos, Ordering::Release);
                break;
            }
        }
        Ok(out)
    }

    /// Bytes in the file, header included.
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    /// Position just past the last byte readers may see.
    pub fn end(&self) -> LogPosition {
        self.base.add(self.len())
    }

    pub fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }

    /// Appends `frames` back to back with positioned vectored writes (no concatenation copy)
    /// and makes them visible to readers.
    pub fn append_frames(&self, frames: &[Bytes]) -> Result<()> {
        use std::os::fd::AsRawFd;
        const IOV_MAX: usize = 1024;
        let start = self.len();
        let mut at = start;
        let mut rest: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).filter(|f| !f.is_empty()).collect();
        let mut first = 0usize;
        while first < rest.len() {
            let chunk = &rest[first..(first + IOV_MAX).min(rest.len())];
            let iov: Vec<libc::iovec> = chunk
                .iter()
                .map(|b| libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() })
                .collect();
            // SAFETY: every iovec points into a live slice borrowed from `frames` for the
            // duration of the call; the fd is owned by `self.file`.
            let n = unsafe { libc::pwritev(self.file.as_raw_fd(), iov.as_ptr(), iov.len() as i32, at as libc::off_t) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::Io { op: "write segment", path: self.path.clone(), source: e });
            }
            let mut n = n as usize;
            at += n as u64;
            // Skip what was written, possibly ending inside a slice (a short write).
            while n > 0 {
                let len = rest[first].len();
                if n >= len {
                    n -= len;
                    first += 1;
                } else {
                    rest[first] = &rest[first][n..];
                    n = 0;
                }
            }
        }
        self.len.store(at, Ordering::Release);
        debug_assert_eq!(at - start, frames.iter().map(|f| f.len() as u64).sum::<u64>());
        Ok(())
    }

    pub fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(Error::io("fsync segment", &self.path))
    }

    /// Fsyncs and marks the segment immutable.
    pub fn seal(&self) -> Result<()> {
        self.sync()?;
        self.sealed.store(true, Ordering::Release);
        Ok(())
    }

    /// Reads `len` bytes at log position `pos`. Sealed segments are served from a memory map
    /// without copying; the active one with a positioned read.
    pub fn read(&self, pos: LogPosition, len: usize) -> Result<Bytes> {
        let off = pos.get().checked_sub(self.base.get()).ok_or(Error::NotFound(pos.get()))?;
        if off + len as u64 > self.len() {
            return Err(Error::NotFound(pos.get()));
        }
        if self.is_sealed() {
            let map = self.mapped()?;
            return Ok(map.slice(off as usize..off as usize + len));
        }
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, off).map_err(Error::io("read segment", &self.path))?;
        Ok(Bytes::from(buf))
    }

    fn mapped(&self) -> Result<&Bytes> {
        if let Some(m) = self.map.get() {
            return Ok(m);
        }
        // SAFETY: a sealed segment is never written again by this process (the writer only
        // appends to the active segment, and recovery truncates only the last segment before
        // any reader exists). Retention may unlink the file; the mapping stays valid on Unix.
        let map = unsafe { memmap2::Mmap::map(&self.file) }.map_err(Error::io("mmap segment", &self.path))?;
        let _ = self.map.set(Bytes::from_owner(map));
        Ok(self.map.get().expect("invariant: set above"))
    }
}
