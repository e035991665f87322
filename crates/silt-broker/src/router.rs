//! The subscription router: a topic trie of connections, woken after each dispatch round whose
//! topics match their filters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use silt_storage::{DispatchListener, Dispatched};
use silt_types::{TopicFilter, TopicTrie};
use tokio::sync::Notify;

/// Identifies one network connection.
pub type ConnId = u64;

/// How a connection is told to act: wake up for new messages, or close because another
/// connection took its client id over or an operator closed it. One `Notify` serves every
/// reason, so an idle connection waits on one thing (its memory is most of what an idle
/// connection costs); the reason to close rides beside it.
#[derive(Default)]
pub struct Signal {
    notify: Notify,
    kick: AtomicU8,
}

/// Why a connection is told to close (see [`Signal::kick`]); an operator's close wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kick {
    TakenOver = 1,
    Operator = 2,
}

impl Signal {
    /// Something may be there to pull.
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// Tells the connection to close, and why.
    pub fn kick(&self, why: Kick) {
        self.kick.fetch_max(why as u8, Ordering::Release);
        self.notify.notify_one();
    }

    /// Whether the connection was told to close, and why.
    pub fn kicked(&self) -> Option<Kick> {
        match self.kick.load(Ordering::Acquire) {
            0 => None,
            1 => Some(Kick::TakenOver),
            _ => Some(Kick::Operator),
        }
    }

    /// Completes at the next [`wake`](Self::wake) or [`kick`](Self::kick), or at once when
    /// one came since the last wait.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}

/// Wakes connections whose subscriptions match a dispatched topic. Runs on the dispatcher
/// thread: a short lock and [`Signal::wake`] only.
#[derive(Default)]
pub struct Router {
    inner: Mutex<RouterInner>,
}

#[derive(Default)]
struct RouterInner {
    trie: TopicTrie<ConnId>,
    conns: HashMap<ConnId, Arc<Signal>>,
    /// How many of a connection's subscriptions route through one filter (a plain and a
    /// shared subscription may share it); the trie entry goes when the count reaches 0.
    refs: HashMap<(ConnId, String), usize>,
}

impl RouterInner {
    fn release(&mut self, conn: ConnId, filter: &TopicFilter) {
        let key = (conn, filter.as_str().to_owned());
        match self.refs.get_mut(&key) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                self.refs.remove(&key);
                self.trie.remove(filter, &conn);
            }
            None => {}
        }
    }
}

impl Router {
    pub(crate) fn add(&self, conn: ConnId, signal: &Arc<Signal>, filter: &TopicFilter) {
        let mut r = self.inner.lock().expect("invariant: lock not poisoned");
        r.conns.entry(conn).or_insert_with(|| signal.clone());
        *r.refs.entry((conn, filter.as_str().to_owned())).or_default() += 1;
        r.trie.insert(filter, conn);
    }

    pub(crate) fn remove(&self, conn: ConnId, filter: &TopicFilter) {
        self.inner.lock().expect("invariant: lock not poisoned").release(conn, filter);
    }

    /// Wakes the connections subscribed through `filter` (a shared group's messages were given
    /// back: its online members pull them).
    pub(crate) fn wake(&self, filter: &TopicFilter) {
        let r = self.inner.lock().expect("invariant: lock not poisoned");
        for conn in r.trie.get(filter) {
            if let Some(n) = r.conns.get(conn) {
                n.wake();
            }
        }
    }

    pub(crate) fn drop_conn(&self, conn: ConnId, filters: impl Iterator<Item = TopicFilter>) {
        let mut r = self.inner.lock().expect("invariant: lock not poisoned");
        for f in filters {
            r.release(conn, &f);
        }
        r.conns.remove(&conn);
    }
}

impl DispatchListener for Router {
    fn dispatched(&self, event: &Dispatched) {
        let r = self.inner.lock().expect("invariant: lock not poisoned");
        for topic in &event.topics {
            r.trie.for_each_match(topic, |_, conn| {
                if let Some(n) = r.conns.get(conn) {
                    n.wake();
                }
            });
        }
    }
}
