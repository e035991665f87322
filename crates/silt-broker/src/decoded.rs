//! Messages decoded once for every subscriber that receives them.
//!
//! A record delivered to many subscribers (fan-out: one message to a fleet's topic) was
//! decoded by each of them: its record, then its MQTT message, half a dozen allocations per
//! delivery. The second subscriber to decode a record leaves the message here, and the ones
//! after it share that copy.
//!
//! A direct-mapped table of [`SLOTS`] slots by log position (a record never changes, so a slot
//! holding the position holds its message); a slot is replaced by the next position that maps
//! to it. A record read once (fan-in: one subscriber) only marks its slot, so a lone
//! subscriber pays a short lock, not a copy. Bounded: only messages whose payload and
//! correlation data are at most [`MAX_PAYLOAD`] bytes are kept, copied out of the log's
//! buffers (a payload is a slice of its batch, which may be 16 MiB that the tail cache has
//! already let go of), so the table holds at most about `SHARDS × SLOTS × MAX_PAYLOAD` bytes
//! (8 MiB).
//!
//! One table per runtime thread ([`SHARDS`] of them, a thread's chosen once): a slot's lock and
//! a kept message's reference count are written by every subscriber that reads it, and with
//! one table shared by all threads those cache lines moved between cores on every delivery (in
//! a profile of fan-out QoS 1, 70 % of this function's samples sat on those two atomic
//! instructions). A message is decoded once per thread that reads it, not once in all.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use silt_types::LogPosition;

use crate::message::Message;

/// Slots of each thread's table (a power of two).
const SLOTS: usize = 512;
/// Tables; threads beyond this many share them round-robin.
const SHARDS: usize = 4;
/// Largest payload kept.
const MAX_PAYLOAD: usize = 4096;

enum Slot {
    Empty,
    /// Decoded once, not kept.
    Seen(LogPosition),
    Kept(LogPosition, Arc<Message>),
}

pub(crate) struct Decoded {
    slots: Box<[Mutex<Slot>]>,
}

impl Default for Decoded {
    fn default() -> Self {
        Self { slots: (0..SHARDS * SLOTS).map(|_| Mutex::new(Slot::Empty)).collect() }
    }
}

/// The table of the calling thread, chosen at its first lookup.
fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static SHARD: Cell<Option<usize>> = const { Cell::new(None) });
    SHARD.with(|s| {
        *s.get().get_or_insert_with(|| {
            let shard = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
            s.set(Some(shard));
            shard
        })
    })
}

impl Decoded {
    fn slot(&self, pos: LogPosition) -> &Mutex<Slot> {
        // Fibonacci hashing: records a few hundred bytes apart land in different slots.
        let h = pos.get().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOTS.trailing_zeros());
        &self.slots[shard() * SLOTS + h as usize]
    }

    /// The message of the record at `pos`, shared if another subscriber decoded it before;
    /// else `decode()`'s (`None` passes through: the record is not in memory).
    pub fn get_or<E>(
        &self,
        pos: LogPosition,
        decode: impl FnOnce() -> Option<Result<Message, E>>,
    ) -> Option<Result<Arc<Message>, E>> {
        let seen = {
            let slot = self.slot(pos).lock().expect("invariant: lock not poisoned");
            match &*slot {
                Slot::Kept(p, m) if *p == pos => return Some(Ok(m.clone())),
                Slot::Seen(p) => *p == pos,
                _ => false,
            }
        };
        let m = match decode()? {
            Ok(m) => m,
            Err(e) => return Some(Err(e)),
        };
        let keep = seen
            && m.payload.len() <= MAX_PAYLOAD
            && m.correlation_data.as_ref().is_none_or(|c| c.len() <= MAX_PAYLOAD);
        let m = if keep {
            Arc::new(Message {
                payload: Bytes::copy_from_slice(&m.payload),
                correlation_data: m.correlation_data.as_deref().map(Bytes::copy_from_slice),
                ..m
            })
        } else {
            Arc::new(m)
        };
        let mut slot = self.slot(pos).lock().expect("invariant: lock not poisoned");
        *slot = if keep { Slot::Kept(pos, m.clone()) } else { Slot::Seen(pos) };
        Some(Ok(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: usize) -> Message {
        Message { topic: "t".into(), payload: Bytes::from(vec![7u8; payload]), ..Message::default() }
    }

    #[test]
    fn a_record_is_decoded_twice_at_most_and_then_shared() {
        let d = Decoded::default();
        let decodes = std::cell::Cell::new(0);
        let read = |pos: u64| {
            d.get_or::<()>(LogPosition(pos), || {
                decodes.set(decodes.get() + 1);
                Some(Ok(message(10)))
            })
            .unwrap()
            .unwrap()
        };
        let first = read(100);
        let second = read(100);
        let third = read(100);
        assert_eq!(decodes.get(), 2);
        assert!(Arc::ptr_eq(&second, &third), "the third reader shares the second's copy");
        assert_eq!(*first, *third);
        // Another position is decoded on its own.
        assert_eq!(read(5_000).payload, message(10).payload);
        assert_eq!(decodes.get(), 3);
    }

    #[test]
    fn each_thread_shares_its_own_copy() {
        let d = Decoded::default();
        let decodes = AtomicUsize::new(0);
        let read = || {
            d.get_or::<()>(LogPosition(42), || {
                decodes.fetch_add(1, Ordering::Relaxed);
                Some(Ok(message(10)))
            })
            .unwrap()
            .unwrap()
        };
        let (a, b) = (read(), read());
        assert!(Arc::ptr_eq(&b, &read()));
        // A thread with another table decodes again, and gets the same message. (Threads
        // take tables round-robin, other tests' threads too: one of the next SHARDS threads
        // has another.)
        let mine = shard();
        let (c, d2) = std::thread::scope(|s| {
            (0..=SHARDS)
                .find_map(|_| s.spawn(|| (shard() != mine).then(|| (read(), read()))).join().unwrap())
                .expect("a thread with another table")
        });
        assert!(!Arc::ptr_eq(&b, &d2));
        assert_eq!((*a).clone(), *c);
        assert_eq!(*b, *d2);
        assert_eq!(decodes.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn large_payloads_are_never_kept_and_errors_pass_through() {
        let d = Decoded::default();
        let mut decodes = 0;
        for _ in 0..3 {
            d.get_or::<()>(LogPosition(7), || {
                decodes += 1;
                Some(Ok(message(MAX_PAYLOAD + 1)))
            });
        }
        assert_eq!(decodes, 3);
        assert!(d.get_or::<&str>(LogPosition(8), || Some(Err("gone"))).unwrap().is_err());
        assert!(d.get_or::<()>(LogPosition(9), || None).is_none());
    }

    #[test]
    fn a_kept_message_no_longer_shares_the_log_buffer() {
        let d = Decoded::default();
        let frame = Bytes::from(vec![1u8; 1 << 20]);
        let m = || Some(Ok::<_, ()>(Message { payload: frame.slice(10..20), ..message(0) }));
        d.get_or(LogPosition(1), m);
        let kept = d.get_or(LogPosition(1), m).unwrap().unwrap();
        assert_eq!(kept.payload.as_ref(), &[1u8; 10]);
        // The 1 MiB frame is referenced by `frame` alone again once the decodes are dropped.
        let frame = frame.try_into_mut().expect("the table holds no slice of the frame");
        assert_eq!(frame.len(), 1 << 20);
    }
}
