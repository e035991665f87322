//! Fetch long polls woken by dispatch, not by polling: a fetch that found too few bytes
//! registers interest in its partitions' queues and sleeps until the dispatcher indexes
//! entries into one of them (or its `max_wait_ms` passes). A partition without a queue yet (no
//! record ever) waits for any dispatch round instead.
//!
//! Runs on the dispatcher thread: a short lock and `Notify::notify_waiters` only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use silt_storage::{DispatchListener, Dispatched};
use silt_types::QueueId;
use tokio::sync::Notify;

#[derive(Default)]
pub struct Wakers {
    queues: Mutex<HashMap<QueueId, Weak<Notify>>>,
    /// Woken by every round (for partitions whose queue does not exist yet).
    any: Notify,
}

impl Wakers {
    /// The notifier of `queue`, shared by every fetch waiting on it.
    pub fn queue(&self, queue: QueueId) -> Arc<Notify> {
        let mut map = self.queues.lock().expect("invariant: lock not poisoned");
        if let Some(n) = map.get(&queue).and_then(Weak::upgrade) {
            return n;
        }
        if map.len() > 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let n = Arc::new(Notify::new());
        map.insert(queue, Arc::downgrade(&n));
        n
    }

    /// Notified after every dispatch round.
    pub fn any(&self) -> &Notify {
        &self.any
    }
}

impl DispatchListener for Wakers {
    fn dispatched(&self, event: &Dispatched) {
        {
            let map = self.queues.lock().expect("invariant: lock not poisoned");
            if !map.is_empty() {
                for q in &event.queues {
                    if let Some(n) = map.get(q).and_then(Weak::upgrade) {
                        n.notify_waiters();
                    }
                }
            }
        }
        self.any.notify_waiters();
    }
}
