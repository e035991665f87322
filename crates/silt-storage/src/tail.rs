//! The tail cache: the most recent batches of the log, kept in memory as the very buffers the
//! appenders encoded and the writer wrote, so live readers (dispatch, subscribers that keep
//! up) never touch the disk.
//!
//! Each entry is one batch frame, so a batch never straddles entries. Bounded by bytes:
//! the oldest writes are dropped first (readers then go to the segment files).

use std::collections::BTreeMap;

use bytes::Bytes;
use silt_types::LogPosition;

#[derive(Debug)]
pub(crate) struct TailCache {
    chunks: BTreeMap<u64, Bytes>,
    bytes: u64,
    capacity: u64,
}

impl TailCache {
    pub fn new(capacity: u64) -> Self {
        Self { chunks: BTreeMap::new(), bytes: 0, capacity }
    }

    pub fn insert(&mut self, at: LogPosition, chunk: Bytes) {
        if self.capacity == 0 {
            return;
        }
        self.bytes += chunk.len() as u64;
        self.chunks.insert(at.get(), chunk);
        while self.bytes > self.capacity && self.chunks.len() > 1 {
            let (_, old) = self.chunks.pop_first().expect("invariant: more than one chunk");
            self.bytes -= old.len() as u64;
        }
    }

    /// The bytes `[pos, pos + len)` when one cached write holds all of them.
    pub fn get(&self, pos: LogPosition, len: usize) -> Option<Bytes> {
        let (&start, chunk) = self.chunks.range(..=pos.get()).next_back()?;
        let off = (pos.get() - start) as usize;
        (off + len <= chunk.len()).then(|| chunk.slice(off..off + len))
    }

    /// The bytes from `pos` to the end of the cached write holding `pos`.
    pub fn get_from(&self, pos: LogPosition) -> Option<Bytes> {
        let (&start, chunk) = self.chunks.range(..=pos.get()).next_back()?;
        let off = (pos.get() - start) as usize;
        (off < chunk.len()).then(|| chunk.slice(off..))
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_oldest_writes_beyond_capacity() {
        let mut t = TailCache::new(10);
        t.insert(LogPosition(0), Bytes::from_static(b"abcdef"));
        t.insert(LogPosition(6), Bytes::from_static(b"ghijkl"));
        assert_eq!(t.get(LogPosition(0), 2), None);
        assert_eq!(t.get(LogPosition(7), 3).as_deref(), Some(&b"hij"[..]));
        assert_eq!(t.get(LogPosition(10), 3), None, "past the end of the chunk");
        assert_eq!(t.bytes(), 6);
    }
}
