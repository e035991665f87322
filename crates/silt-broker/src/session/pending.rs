//! A subscription's offsets sent and not yet acknowledged.
//!
//! Every QoS 1/2 delivery adds one and its acknowledgement removes it, so this is on the
//! per-message path. A pull hands out offsets above all those already pending, and clients
//! acknowledge mostly in the order they received, so the set is a deque sorted by offset:
//! added at the back, removed at the front, in constant time. An acknowledgement out of order
//! (a client is free to send them so) shifts the shorter side of the deque, at most half of
//! what is in flight, which the connection's window bounds (`max_inflight`).

use std::collections::VecDeque;

use silt_storage::IndexEntry;
use silt_types::Offset;

#[derive(Debug, Default)]
pub(super) struct Pending(VecDeque<(Offset, IndexEntry)>);

impl Pending {
    fn find(&self, off: Offset) -> Result<usize, usize> {
        match self.0.back() {
            Some((last, _)) if *last < off => Err(self.0.len()), // the usual insert
            _ => self.0.binary_search_by_key(&off, |(o, _)| *o),
        }
    }

    pub(super) fn contains(&self, off: Offset) -> bool {
        self.find(off).is_ok()
    }

    /// Adds `off` (replacing its entry if it was pending already).
    pub(super) fn insert(&mut self, off: Offset, entry: IndexEntry) {
        match self.find(off) {
            Ok(at) => self.0[at].1 = entry,
            Err(at) => self.0.insert(at, (off, entry)),
        }
    }

    pub(super) fn remove(&mut self, off: Offset) -> Option<IndexEntry> {
        if self.0.front().is_some_and(|(o, _)| *o == off) {
            return self.0.pop_front().map(|(_, e)| e); // the usual acknowledgement
        }
        let at = self.find(off).ok()?;
        self.0.remove(at).map(|(_, e)| e)
    }

    /// The lowest offset pending.
    pub(super) fn first(&self) -> Option<Offset> {
        self.0.front().map(|(o, _)| *o)
    }

    /// The offsets pending, in order.
    pub(super) fn offsets(&self) -> impl Iterator<Item = Offset> + '_ {
        self.0.iter().map(|(o, _)| *o)
    }

    pub(super) fn clear(&mut self) {
        self.0.clear();
    }
}

#[cfg(test)]
mod tests {
    use silt_types::{LogPosition, Timestamp};

    use super::*;

    fn entry(n: u64) -> IndexEntry {
        IndexEntry { position: LogPosition(n * 100), size: 10, timestamp: Timestamp(0) }
    }

    #[test]
    fn offsets_stay_sorted_whatever_the_order_of_inserts_and_removals() {
        let mut p = Pending::default();
        for n in [5, 6, 7, 8, 2, 9, 7] {
            p.insert(Offset(n), entry(n));
        }
        assert_eq!(p.offsets().map(|o| o.get()).collect::<Vec<_>>(), [2, 5, 6, 7, 8, 9]);
        assert_eq!(p.remove(Offset(2)), Some(entry(2)), "the front");
        assert_eq!(p.remove(Offset(8)), Some(entry(8)), "out of order");
        assert_eq!(p.remove(Offset(8)), None, "removed already");
        assert_eq!(p.remove(Offset(100)), None, "never pending");
        assert!(p.contains(Offset(9)) && !p.contains(Offset(8)) && !p.contains(Offset(1)));
        assert_eq!(p.first(), Some(Offset(5)));
        assert_eq!(p.offsets().map(|o| o.get()).collect::<Vec<_>>(), [5, 6, 7, 9]);
        p.clear();
        assert_eq!(p.first(), None);
    }
}
