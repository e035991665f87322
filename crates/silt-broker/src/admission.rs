//! Admission of connections, in two pools of slots, so that sockets that have not
//! authenticated can never keep authenticated clients out:
//!
//! - *pending* slots (`mqtt.max_pending_connections`): a connection holds one from `accept`
//!   through its TLS or WebSocket handshake, its CONNECT and the check of its credentials.
//!   When they are all taken, the oldest connection still sending its handshake or CONNECT
//!   is closed to make room — an attacker re-opening idle sockets only evicts its own older
//!   ones, while a client that sends its CONNECT at once is through in a round trip. Those
//!   waiting for the broker (credentials being verified, bounded by the verifier's own
//!   queue and timeout) are never evicted; with every slot held by such, a new socket is
//!   closed at once.
//! - *open* slots (`mqtt.max_connections`): taken when the CONNECT is accepted, held for the
//!   life of the connection. With none left, the CONNECT is refused with Quota exceeded
//!   (0x97; 3.1.1: server unavailable), before any session is touched.
//!
//! A connection holds one slot or the other from its arrival to its end (the open slot is taken
//! before the pending one is given back), so the slots also count the connections still
//! running: [`Admission::drained`] is the servers' wait for them at shutdown, with no entry
//! per connection and nothing in its task's future.
//!
//! So memory before authentication is bounded by `max_pending_connections ×
//! max_connect_size` plus the transports' buffers — except WebSocket, whose messages
//! tungstenite assembles whole (up to `max_packet_size`) before Silt sees them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, Semaphore};

struct Entry {
    evict: Arc<Notify>,
    /// Waiting for the broker (credentials): not evictable.
    waiting: bool,
}

#[derive(Default)]
struct Pending {
    next_id: u64,
    /// By arrival: the first entry is the oldest.
    entries: BTreeMap<u64, Entry>,
}

pub struct Admission {
    max_pending: usize,
    pending: Mutex<Pending>,
    open: Semaphore,
    /// Slots held, pending or open: the connections still running.
    held: AtomicUsize,
    /// Told when the last slot is given back.
    drained: Notify,
}

/// What [`Admission::arrive`] did to make room.
pub enum Arrival {
    Admitted(PendingSlot),
    /// Admitted, and an older connection still in its handshake was evicted for it.
    Evicted(PendingSlot),
    /// No slot, and none could be freed.
    Full,
}

impl Admission {
    pub fn new(max_pending: usize, max_open: usize) -> Arc<Admission> {
        Arc::new(Admission {
            max_pending,
            pending: Mutex::new(Pending::default()),
            open: Semaphore::new(max_open),
            held: AtomicUsize::new(0),
            drained: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().expect("invariant: lock not poisoned")
    }

    /// A pending slot for a connection just accepted.
    pub fn arrive(self: &Arc<Self>) -> Arrival {
        let mut p = self.lock();
        let mut evicted = false;
        if p.entries.len() >= self.max_pending {
            let oldest = p.entries.iter().find(|(_, e)| !e.waiting).map(|(id, _)| *id);
            let Some(id) = oldest else { return Arrival::Full };
            let e = p.entries.remove(&id).expect("invariant: just found");
            e.evict.notify_one();
            evicted = true;
        }
        let id = p.next_id;
        p.next_id += 1;
        let evict = Arc::new(Notify::new());
        p.entries.insert(id, Entry { evict: evict.clone(), waiting: false });
        self.held.fetch_add(1, Ordering::AcqRel);
        let slot = PendingSlot { admission: self.clone(), id, evict };
        if evicted { Arrival::Evicted(slot) } else { Arrival::Admitted(slot) }
    }

    /// An open slot for a connection whose CONNECT is being accepted, if one is left.
    pub fn open(self: &Arc<Self>) -> Option<OpenSlot> {
        self.open.try_acquire().ok()?.forget();
        self.held.fetch_add(1, Ordering::AcqRel);
        Some(OpenSlot(self.clone()))
    }

    /// Resolves once every slot is given back: every connection admitted has ended.
    pub async fn drained(&self) {
        loop {
            let mut told = std::pin::pin!(self.drained.notified());
            told.as_mut().enable();
            if self.held.load(Ordering::Acquire) == 0 {
                return;
            }
            told.await;
        }
    }

    fn release(&self) {
        if self.held.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.drained.notify_waiters();
        }
    }

    /// Connections holding a pending slot.
    pub fn pending(&self) -> usize {
        self.lock().entries.len()
    }
}

/// A connection's pending slot; dropped (given back) when the CONNECT is answered or the
/// connection ends.
pub struct PendingSlot {
    admission: Arc<Admission>,
    id: u64,
    evict: Arc<Notify>,
}

impl PendingSlot {
    /// Resolves when the slot was taken away: the connection is to close.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }

    /// The connection now waits for the broker (its credentials): it is not evicted.
    pub fn waiting(&self) {
        if let Some(e) = self.admission.lock().entries.get_mut(&self.id) {
            e.waiting = true;
        }
    }
}

/// A connection's open slot, held for its life and given back when dropped. One pointer, where
/// tokio's owned permit is two words: every connection keeps it, resting ones too (see
/// `the_connection_future_stays_small`).
pub struct OpenSlot(Arc<Admission>);

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.0.open.add_permits(1);
        self.0.release();
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        self.admission.lock().entries.remove(&self.id);
        self.admission.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(a: &Arc<Admission>) -> PendingSlot {
        match a.arrive() {
            Arrival::Admitted(s) | Arrival::Evicted(s) => s,
            Arrival::Full => panic!("full"),
        }
    }

    #[test]
    fn a_full_pending_pool_evicts_its_oldest_connection_still_in_its_handshake() {
        let a = Admission::new(2, 10);
        let first = slot(&a);
        let second = slot(&a);
        first.waiting();
        // The oldest evictable one is `second`: `first` waits for the broker.
        let third = match a.arrive() {
            Arrival::Evicted(s) => s,
            _ => panic!("room is made by eviction"),
        };
        assert_eq!(a.pending(), 2);
        {
            let notified = std::pin::pin!(second.evicted());
            assert!(futures_util::FutureExt::now_or_never(notified).is_some(), "second was told to close");
        }
        third.waiting();
        assert!(matches!(a.arrive(), Arrival::Full), "nothing evictable: the newcomer is refused");
        drop(second);
        assert_eq!(a.pending(), 2, "an evicted slot was already given back");
        drop(first);
        assert_eq!(a.pending(), 1);
    }

    #[test]
    fn open_slots_are_a_separate_count() {
        let a = Admission::new(1, 1);
        let held = a.open().expect("one open slot");
        assert!(a.open().is_none());
        let _pending = slot(&a);
        drop(held);
        assert!(a.open().is_some());
    }

    /// A connection counts from its arrival to its end, across the hand-over from its pending
    /// slot to its open one, evicted or not: the wait at shutdown ends with the last of them.
    #[test]
    fn drained_waits_for_every_connection_admitted() {
        use futures_util::FutureExt;
        let a = Admission::new(1, 4);
        assert!(a.drained().now_or_never().is_some(), "nothing admitted: drained");
        let evicted = slot(&a);
        let accepted = slot(&a);
        assert_eq!(a.pending(), 1, "the first was evicted for the second");
        let open = a.open().expect("an open slot");
        drop(accepted);
        let mut drained = std::pin::pin!(a.drained());
        assert!(drained.as_mut().now_or_never().is_none(), "the open connection still runs");
        drop(open);
        assert!(drained.as_mut().now_or_never().is_none(), "the evicted one has not ended yet");
        drop(evicted);
        assert!(drained.now_or_never().is_some(), "every slot given back");
    }
}
