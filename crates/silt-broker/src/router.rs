//! The subscription router: the connections subscribed through each filter, woken after each
//! dispatch round that indexed something for that filter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

use silt_storage::{DispatchListener, Dispatched};
use silt_types::TopicFilter;

use crate::session::ClientId;

/// Identifies one network connection.
pub type ConnId = u64;

/// How a connection is told to act: wake up for new messages, or close because another
/// connection took its client id over, an operator closed it or the server is shutting down.
/// One waker serves every reason, so an idle connection waits on one thing (its memory is most
/// of what an idle connection costs); the reason to close rides beside it.
///
/// One task waits on a signal, its connection's: an [`AtomicWaker`] and a flag are all it
/// needs (a `Notify` keeps a list of waiters, and each wait a node of 64 bytes in the
/// waiting future).
///
/// The signal also carries its connection's client id: the connection reads it from here, so
/// its task (resting ones' too) keeps no copy of the pointer (16 bytes), and the allocation
/// every connection has anyway takes it in its padding's size class (see
/// `the_connection_future_stays_small`).
#[derive(Default)]
pub struct Signal {
    waker: AtomicWaker,
    client_id: ClientId,
    /// Woken since the connection last looked ([`Signal::poll_woken`]).
    woken: AtomicBool,
    kick: AtomicU8,
}

/// Why a connection is told to close (see [`Signal::kick`]); the higher wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kick {
    Shutdown = 1,
    TakenOver = 2,
    Operator = 3,
}

impl Signal {
    /// The signal of a connection of `client_id`.
    pub fn new(client_id: ClientId) -> Self {
        Signal { client_id, ..Signal::default() }
    }

    /// The client id of the signal's connection.
    pub fn client_id(&self) -> &ClientId {
        &self.client_id
    }

    /// Something may be there to pull.
    pub fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Tells the connection to close, and why.
    pub fn kick(&self, why: Kick) {
        self.kick.fetch_max(why as u8, Ordering::Release);
        self.wake();
    }

    /// Whether the connection was told to close, and why.
    pub fn kicked(&self) -> Option<Kick> {
        match self.kick.load(Ordering::Acquire) {
            0 => None,
            1 => Some(Kick::Shutdown),
            2 => Some(Kick::TakenOver),
            _ => Some(Kick::Operator),
        }
    }

    /// Ready once a [`wake`](Self::wake) or [`kick`](Self::kick) came since the last time it
    /// was ready (and takes it); otherwise the task of `cx` is woken at the next one.
    pub fn poll_woken(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.woken.swap(false, Ordering::Acquire) {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // A wake between the check and the registration found no waker to wake: look again.
        if self.woken.swap(false, Ordering::Acquire) { Poll::Ready(()) } else { Poll::Pending }
    }

    /// Completes at the next [`wake`](Self::wake) or [`kick`](Self::kick), or at once when
    /// one came since the last wait.
    pub fn notified(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| self.poll_woken(cx))
    }
}

/// Wakes connections whose subscriptions received something in a dispatch round. Runs on the
/// dispatcher thread: a short lock and [`Signal::wake`] only.
///
/// Matching is the dispatcher's: every wildcard subscription reads its filter's queue, and a
/// round names the topics and the filters whose queues it added to ([`Dispatched`]), so the
/// router finds each subscription by exact name. A second filter trie here cost every
/// persistent wildcard another path of nodes (0.16 KiB of broker memory per connection with its
/// own wildcard, measured) and every round a walk per topic, to learn what the dispatcher
/// already knew.
#[derive(Default)]
pub struct Router {
    inner: Mutex<RouterInner>,
}

#[derive(Default)]
struct RouterInner {
    /// The connections subscribed through each filter (a topic, for a filter without
    /// wildcards), each once.
    routes: HashMap<Box<str>, Vec<ConnId>>,
    conns: HashMap<ConnId, Arc<Signal>>,
    /// How many more of a connection's subscriptions route through a filter it is already
    /// routed by (a plain and a shared subscription may share one); the route goes when the
    /// last of them does. Only those extra routes have an entry: the usual filter, routed once,
    /// costs no more than its route.
    extra: HashMap<(ConnId, String), usize>,
}

impl RouterInner {
    fn release(&mut self, conn: ConnId, filter: &TopicFilter) {
        if !self.extra.is_empty() {
            let key = (conn, filter.as_str().to_owned());
            if let Some(n) = self.extra.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.extra.remove(&key);
                }
                return;
            }
        }
        if let Some(conns) = self.routes.get_mut(filter.as_str()) {
            conns.retain(|c| *c != conn);
            if conns.is_empty() {
                self.routes.remove(filter.as_str());
            }
        }
    }

    fn wake(&self, name: &str) {
        for conn in self.routes.get(name).into_iter().flatten() {
            if let Some(n) = self.conns.get(conn) {
                n.wake();
            }
        }
    }
}

impl Router {
    pub(crate) fn add(&self, conn: ConnId, signal: &Arc<Signal>, filter: &TopicFilter) {
        let mut guard = self.inner.lock().expect("invariant: lock not poisoned");
        let r = &mut *guard;
        r.conns.entry(conn).or_insert_with(|| signal.clone());
        let conns = match r.routes.get_mut(filter.as_str()) {
            Some(conns) => conns,
            // Room for exactly one connection: most filters have one subscriber.
            None => r.routes.entry(filter.as_str().into()).or_insert_with(|| Vec::with_capacity(1)),
        };
        if conns.contains(&conn) {
            *r.extra.entry((conn, filter.as_str().to_owned())).or_default() += 1;
        } else {
            conns.push(conn);
        }
    }

    pub(crate) fn remove(&self, conn: ConnId, filter: &TopicFilter) {
        self.inner.lock().expect("invariant: lock not poisoned").release(conn, filter);
    }

    /// Wakes the connections subscribed through `filter` (a shared group's messages were given
    /// back: its online members pull them).
    pub(crate) fn wake(&self, filter: &TopicFilter) {
        self.inner.lock().expect("invariant: lock not poisoned").wake(filter.as_str());
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
        for name in event.topics.iter().chain(&event.filters) {
            r.wake(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use silt_types::LogPosition;

    /// Whether `signal` was woken since it was last checked (takes the wake-up).
    fn woken(signal: &Signal) -> bool {
        signal.poll_woken(&mut Context::from_waker(std::task::Waker::noop())).is_ready()
    }

    /// A round that indexed `topics` into their queues and into the queues of `filters`.
    fn dispatch(router: &Router, topics: &[&str], filters: &[&str]) {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        router.dispatched(&Dispatched {
            end: LogPosition(0),
            queues: Vec::new(),
            topics: names(topics),
            filters: names(filters),
        });
    }

    fn filter(f: &str) -> TopicFilter {
        TopicFilter::new(f.to_owned()).unwrap()
    }

    #[test]
    fn a_round_wakes_the_subscribers_of_its_topics_and_filters_only() {
        let router = Router::default();
        let (plain, wild, other) =
            (Arc::new(Signal::default()), Arc::new(Signal::default()), Arc::new(Signal::default()));
        router.add(1, &plain, &filter("a/b"));
        router.add(2, &wild, &filter("a/+"));
        router.add(3, &other, &filter("c/#"));
        // A record of `a/b` went to its topic's queue and to the queue of `a/+`.
        dispatch(&router, &["a/b"], &["a/+"]);
        assert!(woken(&plain) && woken(&wild));
        assert!(!woken(&other), "nothing was indexed for c/#");
        // A topic matching `a/+` whose record did not go to that filter's queue (it was
        // registered after the record) wakes only its own subscribers.
        dispatch(&router, &["a/c"], &[]);
        assert!(!woken(&plain) && !woken(&wild) && !woken(&other));
        router.wake(&filter("c/#"));
        assert!(woken(&other), "a shared group's filter is woken by name");
    }

    #[test]
    fn a_filter_routed_twice_for_one_connection_stays_until_both_routes_go() {
        let router = Router::default();
        let signal = Arc::new(Signal::default());
        let f = filter("a/+");
        // A plain subscription and a shared one through the same filter.
        router.add(1, &signal, &f);
        router.add(1, &signal, &f);
        router.remove(1, &f);
        dispatch(&router, &["a/b"], &["a/+"]);
        assert!(woken(&signal), "one route is left: the connection must still be woken");
        router.remove(1, &f);
        dispatch(&router, &["a/b"], &["a/+"]);
        assert!(!woken(&signal), "both routes are gone");
        // Added again after going: routed once more, and gone with one removal.
        router.add(1, &signal, &f);
        dispatch(&router, &["a/b"], &["a/+"]);
        assert!(woken(&signal));
        router.remove(1, &f);
        dispatch(&router, &["a/b"], &["a/+"]);
        assert!(!woken(&signal));
    }

    #[test]
    fn dropping_a_connection_releases_each_of_its_routes() {
        let router = Router::default();
        let (one, two) = (Arc::new(Signal::default()), Arc::new(Signal::default()));
        let f = filter("a/#");
        router.add(1, &one, &f);
        router.add(1, &one, &f);
        router.add(2, &two, &f);
        router.drop_conn(1, [f.clone(), f.clone()].into_iter());
        dispatch(&router, &["a/b"], &["a/#"]);
        assert!(!woken(&one), "the dropped connection has no route left");
        assert!(woken(&two), "another connection's route through the same filter stays");
        router.remove(2, &f);
        let r = router.inner.lock().unwrap();
        assert!(r.routes.is_empty() && r.extra.is_empty() && r.conns.len() == 1, "only connection 2's signal is left");
    }
}
