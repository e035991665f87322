//! Idempotent producers: what Kafka's ProducerStateManager decides about a produced batch from
//! its producer id, epoch and sequence numbers, so a producer's retries are written once and a
//! gap or reordering is caught.
//!
//! Per (producer id, topic, partition) this keeps the epoch and the sequence ranges of the last
//! five batches written (a producer has at most five in flight), with the offset each got:
//! - a batch whose first sequence follows the last one (wrapping after `i32::MAX`) is written;
//! - one equal to a remembered batch is a retry: answered with that batch's offset, not
//!   written again (DUPLICATE in Kafka's terms, a success for the client);
//! - any other sequence is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is
//!   INVALID_PRODUCER_EPOCH; a newer epoch starts over at sequence 0.
//!
//! State for a partition the producer has not written to since start-up is [`Check::Unknown`]:
//! the driver looks for the producer's last batches at the partition's end (its records carry
//! their producer and sequence) and [`ProducerStates::hydrate`]s them, so a retry across a
//! broker restart is still recognised. Not guaranteed: a retry older than the records looked
//! at (the driver bounds the look-back) is written again. Memory is bounded: the least recently
//! used entries beyond `max_entries` are forgotten (their producers then count as unknown).

use std::collections::VecDeque;
use std::num::NonZeroUsize;

/// Batches remembered per producer and partition (Kafka's `max.in.flight` bound).
pub const REMEMBERED: usize = 5;

/// One written batch: sequences `[first, last]`, at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub first: i32,
    pub last: i32,
    pub offset: u64,
}

#[derive(Debug)]
struct Entry {
    epoch: i16,
    batches: VecDeque<Written>,
}

/// What to do with a produced batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Write it.
    Append,
    /// A retry of a batch already written at this offset: answer with it, write nothing.
    Duplicate { offset: u64 },
    /// OUT_OF_ORDER_SEQUENCE_NUMBER.
    OutOfOrder,
    /// INVALID_PRODUCER_EPOCH: a newer epoch of this producer has written here.
    StaleEpoch,
    /// Nothing known of this producer here: hydrate from the log, then check again.
    Unknown,
}

type Key = (i64, String, u32);

/// A producer in a partition: what its state is kept by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At<'a> {
    pub pid: i64,
    pub topic: &'a str,
    pub partition: u32,
}

impl At<'_> {
    fn key(&self) -> Key {
        (self.pid, self.topic.to_owned(), self.partition)
    }
}

pub struct ProducerStates {
    map: lru::LruCache<Key, Entry>,
}

/// The sequence after `s`, as Kafka wraps it.
fn next_seq(s: i32) -> i32 {
    if s == i32::MAX { 0 } else { s + 1 }
}

/// The last sequence of a batch of `count` records starting at `first`.
pub fn last_seq(first: i32, count: usize) -> i32 {
    let span = (count.max(1) - 1) as i64;
    let last = i64::from(first) + span;
    if last > i64::from(i32::MAX) { (last - i64::from(i32::MAX) - 1) as i32 } else { last as i32 }
}

impl ProducerStates {
    pub fn new(max_entries: usize) -> Self {
        Self { map: silt_types::lru::growing(NonZeroUsize::new(max_entries.max(1)).expect("invariant: at least 1")) }
    }

    /// Decides about a batch of `count` records from producer `pid`/`epoch` whose first
    /// sequence is `first`.
    pub fn check(&mut self, at: At<'_>, epoch: i16, first: i32, count: usize) -> Check {
        let key = at.key();
        let Some(e) = self.map.get(&key) else { return Check::Unknown };
        if epoch < e.epoch {
            return Check::StaleEpoch;
        }
        if epoch > e.epoch {
            return if first == 0 { Check::Append } else { Check::OutOfOrder };
        }
        let last = last_seq(first, count);
        if let Some(w) = e.batches.iter().find(|w| w.first == first && w.last == last) {
            return Check::Duplicate { offset: w.offset };
        }
        match e.batches.back() {
            Some(w) if first == next_seq(w.last) => Check::Append,
            // Hydrated without batches (nothing of this producer found): any start is new.
            None => Check::Append,
            Some(_) => Check::OutOfOrder,
        }
    }

    /// Records a batch written at `offset` (after [`Check::Append`]).
    pub fn record(&mut self, at: At<'_>, epoch: i16, first: i32, count: usize, offset: u64) {
        let key = at.key();
        let e = self.map.get_or_insert_mut(key, || Entry { epoch, batches: VecDeque::new() });
        if epoch > e.epoch {
            e.epoch = epoch;
            e.batches.clear();
        }
        e.batches.push_back(Written { first, last: last_seq(first, count), offset });
        while e.batches.len() > REMEMBERED {
            e.batches.pop_front();
        }
    }

    /// What the log says of a producer at a partition's end: its epoch and last batches
    /// (oldest first, at most [`REMEMBERED`] kept). With `None` the producer is known to have
    /// no batches there: its next batch is accepted whatever its sequence.
    pub fn hydrate(&mut self, at: At<'_>, found: Option<(i16, Vec<Written>)>) {
        let key = at.key();
        let (epoch, batches) = found.unwrap_or((i16::MIN, Vec::new()));
        let mut batches: VecDeque<Written> = batches.into();
        while batches.len() > REMEMBERED {
            batches.pop_front();
        }
        self.map.put(key, Entry { epoch, batches });
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(pid: i64, topic: &str, partition: u32) -> At<'_> {
        At { pid, topic, partition }
    }

    #[test]
    fn retries_are_recognised_gaps_refused_and_old_epochs_fenced() {
        let mut s = ProducerStates::new(100);
        assert_eq!(s.check(at(7, "t", 0), 0, 0, 3), Check::Unknown);
        s.hydrate(at(7, "t", 0), None);
        assert_eq!(s.check(at(7, "t", 0), 0, 0, 3), Check::Append);
        s.record(at(7, "t", 0), 0, 0, 3, 100);
        assert_eq!(s.check(at(7, "t", 0), 0, 3, 2), Check::Append);
        s.record(at(7, "t", 0), 0, 3, 2, 103);
        assert_eq!(s.check(at(7, "t", 0), 0, 0, 3), Check::Duplicate { offset: 100 }, "a retry of the first");
        assert_eq!(s.check(at(7, "t", 0), 0, 3, 2), Check::Duplicate { offset: 103 });
        assert_eq!(s.check(at(7, "t", 0), 0, 6, 1), Check::OutOfOrder, "sequence 5 is missing");
        assert_eq!(s.check(at(7, "t", 1), 0, 0, 1), Check::Unknown, "per partition");
        assert_eq!(s.check(at(7, "t", 0), 1, 3, 1), Check::OutOfOrder, "a new epoch starts at 0");
        assert_eq!(s.check(at(7, "t", 0), 1, 0, 1), Check::Append);
        s.record(at(7, "t", 0), 1, 0, 1, 105);
        assert_eq!(s.check(at(7, "t", 0), 0, 5, 1), Check::StaleEpoch);
    }

    #[test]
    fn sequences_wrap_like_kafkas() {
        assert_eq!(last_seq(i32::MAX - 1, 3), 0);
        let mut s = ProducerStates::new(10);
        s.hydrate(at(1, "t", 0), Some((0, vec![Written { first: i32::MAX - 1, last: i32::MAX, offset: 9 }])));
        assert_eq!(s.check(at(1, "t", 0), 0, 0, 1), Check::Append);
    }

    #[test]
    fn only_the_last_five_batches_are_remembered_and_entries_are_bounded() {
        let mut s = ProducerStates::new(2);
        s.hydrate(at(1, "t", 0), None);
        for i in 0..10 {
            s.record(at(1, "t", 0), 0, i, 1, u64::try_from(i).unwrap());
        }
        assert_eq!(s.check(at(1, "t", 0), 0, 5, 1), Check::Duplicate { offset: 5 });
        assert_eq!(s.check(at(1, "t", 0), 0, 4, 1), Check::OutOfOrder, "older than the five remembered");
        s.hydrate(at(2, "t", 0), None);
        s.hydrate(at(3, "t", 0), None);
        assert_eq!(s.len(), 2);
        assert_eq!(s.check(at(1, "t", 0), 0, 10, 1), Check::Unknown, "the least recently used went");
    }
}
