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
//! So memory before authentication is bounded by `max_pending_connections ×
//! max_connect_size` plus the transports' buffers — except WebSocket, whose messages
//! tungstenite assembles whole (up to `max_packet_size`) before Silt sees them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

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
    open: Arc<Semaphore>,
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
            open: Arc::new(Semaphore::new(max_open)),
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
        let slot = PendingSlot { admission: self.clone(), id, evict };
        if evicted { Arrival::Evicted(slot) } else { Arrival::Admitted(slot) }
    }

    /// An open slot for a connection whose CONNECT is being accepted, if one is left.
    pub fn open(&self) -> Option<OwnedSemaphorePermit> {
        self.open.clone().try_acquire_owned().ok()
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

impl Drop for PendingSlot {
    fn drop(&mut self) {
        self.admission.lock().entries.remove(&self.id);
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
}
