//! The subscription router: a topic trie of connections, woken after each dispatch round whose
//! topics match their filters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use silt_storage::{DispatchListener, Dispatched};
use silt_types::{TopicFilter, TopicTrie};
use tokio::sync::Notify;

/// Identifies one network connection.
pub type ConnId = u64;

/// Wakes connections whose subscriptions match a dispatched topic. Runs on the dispatcher
/// thread: a short lock and `Notify::notify_one` only.
#[derive(Default)]
pub struct Router {
    inner: Mutex<RouterInner>,
}

#[derive(Default)]
struct RouterInner {
    trie: TopicTrie<ConnId>,
    conns: HashMap<ConnId, Arc<Notify>>,
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
    pub(crate) fn add(&self, conn: ConnId, notify: &Arc<Notify>, filter: &TopicFilter) {
        let mut r = self.inner.lock().expect("invariant: lock not poisoned");
        r.conns.entry(conn).or_insert_with(|| notify.clone());
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
                n.notify_one();
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
                    n.notify_one();
                }
            });
        }
    }
}
