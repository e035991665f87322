//! The broker: the session registry, the subscription router that turns dispatch events into
//! wake-ups, retained messages, and the publish path into the storage engine.
//!
//! Lock order (never take an earlier one while holding a later one):
//! `State` (std mutex, held briefly, never across `.await`) → a `Session` (tokio mutex) →
//! `Router` (std mutex, also taken by the dispatcher thread) → `RetainedStore` (std rwlock).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use silt_storage::{Appended, IndexEntry, QueueName, Record, Storage};
use silt_types::{LogPosition, Offset, Timestamp, TopicFilter};
use tokio::sync::Notify;

use crate::config::MqttConfig;
use crate::message::Message;
use crate::retained::{RETAINED_COPY_STREAM, RETAINED_STREAM, RetainedHandle, RetainedInFlight, RetainedStore};
pub use crate::router::{ConnId, Kick, Router, Signal};
use crate::session::{
    ClientId, SESSIONS_STREAM, SessionOwner, SessionSnapshot, SharedMembership, Subscription, SubscriptionState,
    Subscriptions, parse_shared, queue_for,
};
pub use crate::session::{GroupRef, Session, SessionRef, SharedGroup};
use silt_dataset::{AckFuture, Appender, Assign, TopicTiers, internal};

/// A held per-filter lock ([`Broker::lock_filter`]).
struct FilterLock<'a> {
    broker: &'a Broker,
    filter: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for FilterLock<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // Clones are taken under the map's lock: a count of one is the map's own reference.
        let mut locks = self.broker.filter_locks.lock().expect("invariant: lock not poisoned");
        if locks.get(&self.filter).is_some_and(|l| Arc::strong_count(l) == 1) {
            locks.remove(&self.filter);
        }
    }
}

struct Owner {
    conn: ConnId,
    signal: Arc<Signal>,
}

#[derive(Default)]
struct State {
    sessions: HashMap<ClientId, SessionRef>,
    owners: HashMap<ClientId, Owner>,
    /// Subscriptions (and shared groups) per filter queue: the queue is dropped with the last.
    /// Keyed by a session's own key for the filter where one holds it, not a further copy.
    filter_refs: HashMap<Arc<str>, usize>,
    /// Delayed wills waiting to be published, by client id.
    wills: HashMap<String, Arc<Notify>>,
    /// Shared-subscription groups by `$share/{group}/{filter}`.
    groups: HashMap<String, GroupRef>,
    /// Client ids whose session the admin API is ending: a CONNECT waits until its tombstone
    /// is in the log, so the tombstone can never land after the new session's first state.
    ending: std::collections::HashSet<String>,
}

pub struct Broker {
    pub storage: Arc<Storage>,
    pub config: Arc<MqttConfig>,
    pub auth: Arc<crate::auth::Auth>,
    pub stats: Stats,
    router: Arc<Router>,
    state: Mutex<State>,
    /// Shared with the retained index the append path keeps (see [`RetainedHandle`]).
    retained: Arc<RwLock<RetainedStore>>,
    /// The append path every protocol submits through.
    appender: Arc<Appender>,
    next_conn: AtomicU64,
    /// One lock per filter in use, serializing that filter's reference changes (and shared
    /// group creation and removal) with its queue's registration in storage. Filters differ
    /// per device in many fleets (`devices/{id}/cmd/#`): their registrations run concurrently
    /// and share the log's group commits.
    filter_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per-session backlogs last published under `$SYS/broker/sessions/`.
    pub(crate) sys_backlogs: Mutex<HashMap<String, u64>>,
    /// `$SYS/broker/...` figures as last published.
    pub(crate) sys_figures: Mutex<HashMap<String, String>>,
    /// Extra `$SYS/broker/...` figures (name, value), e.g. tiering's.
    pub(crate) extra_stats: OnceLock<ExtraStats>,
    /// Serializes dumps of the internal streams.
    dump_lock: tokio::sync::Mutex<()>,
    /// Messages decoded for one subscriber, shared with the others.
    pub(crate) decoded: crate::decoded::Decoded,
    /// Resting connections' keep alive deadlines.
    pub(crate) keep_alive: Arc<crate::keep_alive::KeepAlive>,
    retained_in_flight: Arc<RetainedInFlight>,
}

/// Extra `$SYS/broker/{name}` figures, produced on each statistics tick.
pub type ExtraStats = Box<dyn Fn() -> Vec<(String, String)> + Send + Sync>;

/// Why [`Broker::connect`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectRefused {
    /// The session belongs to another user (CONNACK 0x87).
    NotOwner,
}

/// What [`Broker::connect`] decided.
pub struct Connected {
    pub session: SessionRef,
    pub session_present: bool,
    pub conn: ConnId,
    /// Wakes the connection for new messages, and tells it to close when another connection
    /// takes its client id over or an operator closes it. It carries the client id, the one
    /// copy the session and the broker's maps share.
    pub signal: Arc<Signal>,
}

impl Broker {
    /// The router must be the dispatch listener the appender's storage was opened with.
    /// Blocks until the index has caught up with the log (session and retained state are read
    /// through it), so call it before the runtime serves clients. From now on the appender
    /// keeps the broker's retained index of every retained record, whichever protocol it
    /// came by.
    pub fn new(
        appender: Arc<Appender>,
        router: Arc<Router>,
        config: MqttConfig,
        auth: crate::auth::Auth,
    ) -> silt_storage::Result<Arc<Broker>> {
        let storage = appender.storage().clone();
        storage.wait_dispatched_blocking(storage.stats().log_end)?;
        let max_levels = usize::from(config.max_topic_levels);
        let (mut retained, retained_replayed) = RetainedStore::load(&storage, max_levels)?;
        // `$SYS` figures live in memory (tiering puts them there): what an earlier process's
        // dumps still point at is gone, or (written before they lived there) stale. The first
        // statistics tick publishes them all again (`sys_figures` starts empty).
        let stale = retained.clear_below("$SYS");
        if stale > 0 {
            tracing::debug!(stale, "retained $SYS figures of an earlier process dropped");
        }
        if internal::worth_compacting(retained_replayed, retained.len()) {
            let start = internal::stream_end(&storage, RETAINED_STREAM)?;
            storage.append_blocking(&retained.dump())?;
            storage.append_blocking(&[internal::checkpoint_record(RETAINED_STREAM, start)])?;
            tracing::info!(replayed = retained_replayed, live = retained.len(), "retained pointers compacted");
        }
        let (snapshots, sessions_replayed) = SessionSnapshot::load_all(&storage)?;
        if internal::worth_compacting(sessions_replayed, snapshots.len()) {
            let start = internal::stream_end(&storage, SESSIONS_STREAM)?;
            let now = Timestamp::now();
            let dump: Vec<_> = snapshots.values().map(|s| s.to_record(now)).collect();
            for chunk in dump.chunks(1000) {
                storage.append_blocking(chunk)?;
            }
            storage.append_blocking(&[internal::checkpoint_record(SESSIONS_STREAM, start)])?;
            tracing::info!(replayed = sessions_replayed, live = snapshots.len(), "session snapshots compacted");
        }
        let mut state = State::default();
        let now = Timestamp::now();
        let (group_snaps, snapshots): (Vec<_>, Vec<_>) =
            snapshots.into_iter().partition(|(id, _)| id.starts_with("$share/"));
        let too_deep = |filter: &str| {
            let deep = silt_types::level_count(filter) > max_levels;
            if deep {
                tracing::warn!(
                    levels = silt_types::level_count(filter),
                    max_topic_levels = max_levels,
                    filter_start = %crate::log_prefix(filter),
                    "subscription deeper than mqtt.max_topic_levels dropped"
                );
            }
            deep
        };
        for (key, snap) in group_snaps {
            if too_deep(&key) {
                continue;
            }
            let mut subs = Subscriptions::default();
            for st in snap.subscriptions {
                if TopicFilter::new(&*st.filter).is_err() {
                    continue;
                }
                subs.subs.insert(st.filter.clone(), Box::new(Subscription::new(st)));
            }
            if let Some((_, f)) = parse_shared(&key) {
                *state.filter_refs.entry(f.as_str().into()).or_default() += 1;
            }
            let group = SharedGroup { key: key.clone(), subs, members: 0, dirty: false };
            state.groups.insert(key, Arc::new(tokio::sync::Mutex::new(group)));
        }
        for (id, snap) in snapshots {
            let id = ClientId::from(id);
            let mut s = Session::new(id.clone(), snap.expiry_secs);
            s.owner = snap.owner;
            for m in snap.shared.into_iter().filter(|m| !too_deep(&m.key)) {
                match state.groups.get(&m.key) {
                    Some(g) => {
                        g.try_lock().expect("invariant: no other user at start-up").members += 1;
                        s.shared.modify(|sh| sh.insert(m.key.clone(), m));
                    }
                    None => tracing::warn!(key = %m.key, "membership of an unknown shared group dropped"),
                }
            }
            s.inbound_qos2 = snap.inbound_qos2.into_iter().collect();
            for o in snap.outbound_qos2 {
                if let Some(key) = &o.group {
                    // A shared group's QoS 2 delivery in flight to this member: the group holds
                    // it for the member; a group that no longer exists has nothing to hold.
                    let Some(g) = state.groups.get(key) else { continue };
                    g.try_lock().expect("invariant: no other user at start-up").subs.hold(&o.settles, o.entry());
                }
                s.outbound_qos2.insert(o);
            }
            // A session that was connected when the broker stopped is offline from now on.
            s.disconnected_at = Some(snap.disconnected_at.map_or(now, Timestamp));
            for st in snap.subscriptions.into_iter().filter(|st| !too_deep(&st.filter)) {
                if TopicFilter::new(&*st.filter).is_err() {
                    continue;
                }
                let key = st.filter.clone();
                *state.filter_refs.entry(key.clone()).or_default() += 1;
                s.subs.subs.insert(key, Box::new(Subscription::new(st)));
            }
            state.sessions.insert(id, Arc::new(tokio::sync::Mutex::new(s)));
        }
        // Groups no session is a member of any more end here, with their filter reference.
        let memberless: Vec<String> = state
            .groups
            .iter()
            .filter(|(_, g)| g.try_lock().is_ok_and(|g| g.members == 0))
            .map(|(k, _)| k.clone())
            .collect();
        for key in memberless {
            state.groups.remove(&key);
            if let Some((_, f)) = parse_shared(&key)
                && let Some(n) = state.filter_refs.get_mut(f.as_str())
            {
                *n -= 1;
                if *n == 0 {
                    state.filter_refs.remove(f.as_str());
                }
            }
        }
        // Filter queues nobody subscribes through any more (their subscriptions were dropped
        // above, or a crash came between the last unsubscribe and the drop) would be
        // dispatched into forever.
        let mut dropped = 0usize;
        for f in storage.filters()? {
            if state.filter_refs.contains_key(f.as_str()) {
                continue;
            }
            if let Ok(filter) = TopicFilter::new(f) {
                storage.drop_filter_blocking(&filter)?;
                dropped += 1;
            }
        }
        if dropped > 0 {
            tracing::info!(filters = dropped, "filter queues without subscriptions dropped");
        }
        tracing::info!(
            sessions = state.sessions.len(),
            groups = state.groups.len(),
            retained = retained.len(),
            "broker state recovered"
        );
        let retained = Arc::new(RwLock::new(retained));
        let retained_in_flight = Arc::new(RetainedInFlight::default());
        appender.set_retained(Arc::new(RetainedHandle(retained.clone(), retained_in_flight.clone())));
        Ok(Arc::new(Broker {
            storage,
            config: Arc::new(config),
            auth: Arc::new(auth),
            stats: Stats::default(),
            router,
            state: Mutex::new(state),
            retained,
            appender,
            next_conn: AtomicU64::new(1),
            filter_locks: Mutex::new(HashMap::new()),
            sys_backlogs: Mutex::new(HashMap::new()),
            sys_figures: Mutex::new(HashMap::new()),
            extra_stats: OnceLock::new(),
            dump_lock: tokio::sync::Mutex::new(()),
            decoded: Default::default(),
            keep_alive: Default::default(),
            retained_in_flight,
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("invariant: lock not poisoned")
    }

    /// Attaches a connection of `user` to the session of `client_id`, taking it over from any
    /// other connection. `clean_start` discards an existing session. With verified usernames
    /// (a password file), a session another user created is refused — its connection is not
    /// even disturbed — unless an ACL `takeover` rule lets `user` have it.
    pub async fn connect(
        &self,
        client_id: &str,
        user: Option<&str>,
        clean_start: bool,
        expiry_secs: u32,
    ) -> Result<Connected, ConnectRefused> {
        let owner = SessionOwner { user: user.map(str::to_owned) };
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (existing, old_owner, signal) = loop {
            if self.state().ending.contains(client_id) {
                // An admin delete of this session is writing its tombstone (milliseconds).
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                continue;
            }
            let checked = self.state().sessions.get_key_value(client_id).map(|(k, s)| (k.clone(), s.clone()));
            if let Some((_, s)) = &checked
                && self.auth.usernames_verified()
            {
                let theirs = s.lock().await.owner.clone();
                if theirs.is_some_and(|o| o != owner) && !self.auth.allows_takeover(user, client_id) {
                    return Err(ConnectRefused::NotOwner);
                }
            }
            let mut st = self.state();
            // The session checked must still be the one there (none, or the same), and no
            // delete may have begun meanwhile.
            let now = st.sessions.get(client_id);
            if now.map(Arc::as_ptr) != checked.as_ref().map(|(_, s)| Arc::as_ptr(s)) || st.ending.contains(client_id) {
                continue;
            }
            // One copy of the client id for the maps, the session and the connection.
            let (id, checked) = match checked {
                Some((id, s)) => (id, Some(s)),
                None => (ClientId::from(client_id), None),
            };
            let signal = Arc::new(Signal::new(id));
            let old = st.owners.insert(signal.client_id().clone(), Owner { conn, signal: signal.clone() });
            break (checked, old, signal);
        };
        let client_id = signal.client_id().clone();
        if let Some(old) = old_owner {
            old.signal.kick(Kick::TakenOver);
        }
        let (session, present) = match existing {
            Some(s) if !clean_start => {
                {
                    let mut g = s.lock().await;
                    g.expiry_secs = expiry_secs;
                    g.disconnected_at = None;
                    g.subs.rewind();
                    g.attach(conn);
                }
                (s, true)
            }
            Some(s) => {
                self.end_session(&s).await;
                (self.new_session(client_id.clone(), expiry_secs), false)
            }
            None => (self.new_session(client_id.clone(), expiry_secs), false),
        };
        // A new session is this user's; one taken over (an ACL `takeover`) stays its creator's.
        {
            let mut g = session.lock().await;
            g.owner.get_or_insert(owner);
            g.attach(conn);
        }
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        self.stats.connects.fetch_add(1, Ordering::Relaxed);
        Ok(Connected { session, session_present: present, conn, signal })
    }

    fn new_session(&self, client_id: ClientId, expiry_secs: u32) -> SessionRef {
        let s = Arc::new(tokio::sync::Mutex::new(Session::new(client_id.clone(), expiry_secs)));
        self.state().sessions.insert(client_id, s.clone());
        s
    }

    /// Routes the session's subscriptions to `conn` (after a resume).
    pub fn route_all(&self, conn: ConnId, signal: &Arc<Signal>, session: &Session) {
        for f in session.subs.subs.keys() {
            if let Ok(f) = TopicFilter::new(&**f) {
                self.router.add(conn, signal, &f);
            }
        }
        for key in session.shared.keys() {
            if let Some((_, f)) = parse_shared(key) {
                self.router.add(conn, signal, &f);
            }
        }
        signal.wake();
    }

    /// The group of a shared subscription, if it exists.
    pub fn group(&self, key: &str) -> Option<GroupRef> {
        self.state().groups.get(key).cloned()
    }

    /// The end of `filter`'s queue (where a new subscription starts), registering a wildcard
    /// filter's queue first when it has none; 0 for a topic nobody published to yet. Memory
    /// answers for queues created or registered since the start; otherwise the index is read
    /// on the blocking pool: a SUBSCRIBE never holds a runtime thread on RocksDB. A wildcard
    /// filter memory does not name is registered (appended) without a lookup first: that is
    /// needed for a new filter anyway, and an existing one is named by it from then on.
    async fn subscribe_queue(&self, filter: &TopicFilter) -> silt_storage::Result<Offset> {
        let queue = queue_for(filter.as_str());
        let read_index = |queue: QueueName| {
            let storage = self.storage.clone();
            async move {
                tokio::task::spawn_blocking(move || -> silt_storage::Result<Option<Offset>> {
                    match storage.queue_id(&queue)? {
                        Some(id) => Ok(Some(storage.queue_bounds(id)?.1)),
                        None => Ok(None),
                    }
                })
                .await
                .map_err(|e| silt_storage::Error::Unavailable(format!("index read failed: {e}")))?
            }
        };
        let from_memory = || {
            let id = self.storage.created_queue_id(&queue)?;
            Some(self.storage.queue_end_cached(id))
        };
        if filter.has_wildcard() && from_memory().is_none() {
            self.storage.add_filter(filter).await?;
        }
        if let Some(Some(end)) = from_memory() {
            return Ok(end);
        }
        match read_index(queue).await? {
            Some(end) => Ok(end),
            None if filter.has_wildcard() => {
                Err(silt_storage::Error::Invalid(format!("filter {filter} was dropped while registering")))
            }
            None => Ok(Offset(0)),
        }
    }

    /// Wakes the online members of the shared group `key`, after messages went back to it.
    pub fn wake_group(&self, key: &str) {
        if let Some((_, filter)) = parse_shared(key) {
            self.router.wake(&filter);
        }
    }

    /// Joins `session` to the shared group `key` (creating the group at the end of its queue).
    pub async fn subscribe_shared(
        &self,
        conn: ConnId,
        signal: &Arc<Signal>,
        session: &mut Session,
        key: &str,
        membership: SharedMembership,
    ) -> silt_storage::Result<()> {
        let Some((_, filter)) = parse_shared(key) else {
            return Err(silt_storage::Error::Invalid(format!("not a shared subscription: {key}")));
        };
        let filter_lock = self.lock_filter(&filter).await;
        let existing = self.group(key);
        let group = match existing {
            Some(g) => g,
            None => {
                let end = self.subscribe_queue(&filter).await?;
                let state = SubscriptionState {
                    filter: filter.as_str().into(),
                    qos: 2,
                    no_local: false,
                    retain_as_published: false,
                    subscription_id: None,
                    cursor: end.get(),
                    sent: end.get(),
                    settled: Box::default(),
                };
                let mut subs = Subscriptions::default();
                subs.subs.insert(state.filter.clone(), Box::new(Subscription::new(state)));
                let g = Arc::new(tokio::sync::Mutex::new(SharedGroup {
                    key: key.to_owned(),
                    subs,
                    members: 0,
                    dirty: true,
                }));
                let mut st = self.state();
                *st.filter_refs.entry(filter.as_str().into()).or_default() += 1;
                st.groups.entry(key.to_owned()).or_insert(g).clone()
            }
        };
        let joined = session.shared.modify(|sh| sh.insert(key.to_owned(), membership)).is_none();
        if joined {
            group.lock().await.members += 1;
        }
        drop(filter_lock);
        self.persist_group(&group).await?;
        if joined {
            self.router.add(conn, signal, &filter);
        }
        session.dirty = true;
        Ok(())
    }

    /// Leaves a shared group; the last member to leave ends the group.
    pub async fn unsubscribe_shared(&self, conn: ConnId, session: &mut Session, key: &str) -> bool {
        if session.shared.modify(|sh| sh.remove(key)).is_none() {
            return false;
        }
        if let Some((_, f)) = parse_shared(key) {
            self.router.remove(conn, &f);
        }
        self.leave_group(key).await;
        session.dirty = true;
        true
    }

    async fn leave_group(&self, key: &str) {
        // Under the filter's lock, so that a member joining concurrently either finds the group
        // still alive or creates a new one after this one is gone.
        let Some((_, filter)) = parse_shared(key) else { return };
        let _lock = self.lock_filter(&filter).await;
        let Some(group) = self.group(key) else { return };
        let empty = {
            let mut g = group.lock().await;
            g.members = g.members.saturating_sub(1);
            g.members == 0
        };
        if !empty {
            return;
        }
        self.state().groups.remove(key);
        let _ = self.storage.append(&[SessionSnapshot::tombstone(key, Timestamp::now())]).await;
        self.release_filter_locked(&filter).await;
    }

    /// Takes `filter`'s lock (see `filter_locks`); the entry goes when nobody holds or awaits it.
    async fn lock_filter(&self, filter: &TopicFilter) -> FilterLock<'_> {
        let lock = {
            let mut locks = self.filter_locks.lock().expect("invariant: lock not poisoned");
            locks.entry(filter.as_str().to_owned()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
        FilterLock { broker: self, filter: filter.as_str().to_owned(), guard: Some(guard) }
    }

    /// Persists a group's cursor.
    pub async fn persist_group(&self, group: &GroupRef) -> silt_storage::Result<()> {
        let record = {
            let mut g = group.lock().await;
            g.dirty = false;
            g.snapshot().to_record(Timestamp::now())
        };
        self.storage.append(&[record]).await.map(|_| ())
    }

    /// Adds or replaces a subscription. New subscriptions start at the end of their queue.
    pub async fn subscribe(
        &self,
        conn: ConnId,
        signal: &Arc<Signal>,
        session: &mut Session,
        filter: &TopicFilter,
        mut state: SubscriptionState,
    ) -> silt_storage::Result<()> {
        if let Some(existing) = session.subs.subs.get_mut(filter.as_str()) {
            // Replacing keeps the cursor: no message is lost or repeated.
            state.cursor = existing.state.cursor;
            state.sent = existing.state.sent;
            state.filter = existing.state.filter.clone();
            existing.state = state;
        } else {
            // Taking a reference and registering happen under the filter's lock, so a concurrent
            // release of the last reference cannot drop the queue from under this subscription.
            let _lock = self.lock_filter(filter).await;
            let end = self.subscribe_queue(filter).await?;
            // Counted only once registration succeeded, so a failed SUBSCRIBE leaks no reference.
            let key = state.filter.clone();
            *self.state().filter_refs.entry(key.clone()).or_default() += 1;
            state.cursor = end.get();
            state.sent = end.get();
            session.subs.subs.insert(key, Box::new(Subscription::new(state)));
            // A replaced subscription is already routed; routing it again would count it twice.
            self.router.add(conn, signal, filter);
        }
        session.dirty = true;
        Ok(())
    }

    /// Removes a subscription; returns whether it existed.
    pub async fn unsubscribe(&self, conn: ConnId, session: &mut Session, filter: &TopicFilter) -> bool {
        if session.subs.subs.remove(filter.as_str()).is_none() {
            return false;
        }
        self.router.remove(conn, filter);
        self.release_filter(filter).await;
        session.dirty = true;
        true
    }

    async fn release_filter(&self, filter: &TopicFilter) {
        // Held until the queue is dropped: see `subscribe`.
        let _lock = self.lock_filter(filter).await;
        self.release_filter_locked(filter).await;
    }

    /// [`Self::release_filter`] for a caller that holds the filter's lock.
    async fn release_filter_locked(&self, filter: &TopicFilter) {
        let last = {
            let mut st = self.state();
            match st.filter_refs.get_mut(filter.as_str()) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    st.filter_refs.remove(filter.as_str());
                    true
                }
                None => false,
            }
        };
        if last
            && filter.has_wildcard()
            && let Err(e) = self.storage.drop_filter(filter).await
        {
            tracing::warn!(filter = %filter, error = %e, "dropping an unused filter queue failed");
        }
    }

    /// Drops every subscription of a session and forgets it (with a tombstone if persistent).
    async fn end_session(&self, session: &SessionRef) {
        let (client_id, filters, persistent, shared, held) = {
            let mut g = session.lock().await;
            let filters: Vec<String> = std::mem::take(&mut g.subs.subs).into_keys().map(|f| f.to_string()).collect();
            let shared: Vec<String> = g.shared.take().into_keys().collect();
            let mut held: Vec<_> = g.outbound_qos2.take().into_iter().filter(|o| o.group.is_some()).collect();
            held.sort_unstable_by_key(|o| o.packet_id);
            (g.client_id.clone(), filters, g.persistent(), shared, held)
        };
        // A shared group's QoS 2 deliveries in flight to this member are never given to
        // another member (MQTT-4.8.2-5): the group counts them done.
        for o in held {
            if let Some(g) = o.group.as_deref().and_then(|k| self.group(k)) {
                let mut g = g.lock().await;
                g.subs.settle(&o.settles);
                g.dirty = true;
            }
        }
        for key in shared {
            self.leave_group(&key).await;
        }
        {
            let mut st = self.state();
            if st.sessions.get(&client_id).is_some_and(|s| Arc::ptr_eq(s, session)) {
                st.sessions.remove(&client_id);
            }
        }
        for f in filters {
            if let Ok(f) = TopicFilter::new(f) {
                self.release_filter(&f).await;
            }
        }
        if persistent {
            let _ = self.storage.append(&[SessionSnapshot::tombstone(&client_id, Timestamp::now())]).await;
        }
    }

    /// Tells every connection to close, and why: the server's shutdown reaches resting
    /// connections this way (they wait on their signal only). A connection that registers after
    /// this call sees the shutdown in its own loop, before it could rest.
    pub(crate) fn kick_all(&self, why: Kick) {
        for owner in self.state().owners.values() {
            owner.signal.kick(why);
        }
    }

    /// Called when a connection ends. Persistent sessions stay (offline) with their cursors.
    pub async fn disconnect(&self, conn: ConnId, session: &SessionRef) {
        let (client_id, filters) = {
            let g = session.lock().await;
            let mut filters: Vec<String> = g.subs.subs.keys().map(|f| f.to_string()).collect();
            filters.extend(g.shared.keys().filter_map(|k| parse_shared(k).map(|(_, f)| f.as_str().to_owned())));
            (g.client_id.clone(), filters)
        };
        self.router.drop_conn(conn, filters.into_iter().filter_map(|f| TopicFilter::new(f).ok()));
        let still_owner = {
            let mut st = self.state();
            let mine = st.owners.get(&client_id).is_some_and(|o| o.conn == conn);
            if mine {
                st.owners.remove(&client_id);
            }
            mine
        };
        self.stats.connections.fetch_sub(1, Ordering::Relaxed);
        if !still_owner {
            return; // taken over: the new connection owns the session now
        }
        let persistent = {
            let mut g = session.lock().await;
            g.disconnected_at = Some(Timestamp::now());
            g.persistent()
        };
        if persistent {
            if let Err(e) = self.persist(session).await {
                tracing::warn!(client_id = %client_id, error = %e, "session snapshot at disconnect failed");
            }
        } else {
            self.end_session(session).await;
        }
    }

    /// Appends the session's snapshot (durable under the log's fsync policy).
    pub async fn persist(&self, session: &SessionRef) -> silt_storage::Result<()> {
        self.persist_with_group(session, None).await
    }

    /// Persists the session and, in the same batch (so a crash keeps both or neither), the
    /// shared group a delivery to it came from: a QoS 2 completion is recorded in both.
    pub async fn persist_with_group(&self, session: &SessionRef, group: Option<&GroupRef>) -> silt_storage::Result<()> {
        let mut records = Vec::with_capacity(2);
        if let Some(group) = group {
            let mut g = group.lock().await;
            g.dirty = false;
            records.push(g.snapshot().to_record(Timestamp::now()));
        }
        {
            let mut g = session.lock().await;
            if g.persistent() {
                g.dirty = false;
                records.push(g.snapshot().to_record(Timestamp::now()));
            }
        }
        if records.is_empty() {
            return Ok(());
        }
        self.storage.append(&records).await.map(|_| ())
    }

    /// Ends offline sessions whose expiry interval has passed.
    pub async fn expire_sessions(&self) {
        let now = Timestamp::now();
        let candidates: Vec<SessionRef> = {
            let st = self.state();
            st.sessions.iter().filter(|(id, _)| !st.owners.contains_key(*id)).map(|(_, s)| s.clone()).collect()
        };
        for s in candidates {
            let expired = {
                let g = s.lock().await;
                match g.disconnected_at {
                    Some(at) if g.expiry_secs != u32::MAX => now.get() - at.get() >= i64::from(g.expiry_secs) * 1000,
                    _ => false,
                }
            };
            if expired {
                tracing::debug!("session expired");
                self.end_session(&s).await;
            }
        }
    }

    /// Persists every session and group and marks that as a full dump, so the next start
    /// replays only these snapshots (at shutdown, with no client left to change them).
    pub async fn persist_all(&self) {
        let start = internal::stream_end(&self.storage, SESSIONS_STREAM);
        self.persist_each().await;
        let marked = match start {
            Ok(s) => self.storage.append(&[internal::checkpoint_record(SESSIONS_STREAM, s)]).await.map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = marked {
            tracing::warn!(error = %e, "session checkpoint at shutdown failed; the next start replays more");
        }
    }

    async fn persist_each(&self) {
        let groups: Vec<GroupRef> = self.state().groups.values().cloned().collect();
        for g in groups {
            if let Err(e) = self.persist_group(&g).await {
                tracing::warn!(error = %e, "shared group snapshot at shutdown failed");
            }
        }
        let sessions: Vec<SessionRef> = self.state().sessions.values().cloned().collect();
        for s in sessions {
            if let Err(e) = self.persist(&s).await {
                tracing::warn!(error = %e, "session snapshot at shutdown failed");
            }
        }
    }

    /// Appends a message (and its retained pointer) and returns once it is durable under the
    /// log's fsync policy.
    pub async fn publish(self: &Arc<Self>, message: &Message) -> silt_storage::Result<Appended> {
        self.submit(message).await?.await
    }

    /// Hands a message to the log in order and returns a future that resolves once it is
    /// durable (and, for a retained message, once the retained index points at it), through
    /// the append path every protocol shares.
    pub async fn submit(self: &Arc<Self>, message: &Message) -> silt_storage::Result<AckFuture> {
        let tier = self.appender.decide(&message.topic);
        self.submit_records(vec![message.to_record()], message.qos > 0, tier).await
    }

    /// Hands publishes of one client to the log as one batch (see the connection's `Group`),
    /// all under one tiering decision: `acked` when any of them waits for its acknowledgement
    /// (QoS 1/2).
    pub(crate) async fn submit_records(
        self: &Arc<Self>,
        records: Vec<Record>,
        acked: bool,
        decision: silt_dataset::TierDecision,
    ) -> silt_storage::Result<AckFuture> {
        self.stats.messages_received.fetch_add(records.len() as u64, Ordering::Relaxed);
        self.appender.submit_decided(records, Assign::ByKey, acked, decision).await
    }

    /// [`Broker::submit`] for the node's own messages (`$SYS`): not counted as received
    /// from clients.
    pub(crate) async fn submit_uncounted(self: &Arc<Self>, message: &Message) -> silt_storage::Result<AckFuture> {
        // QoS 0 has no acknowledgement to hold back.
        self.appender.submit(vec![message.to_record()], Assign::ByKey, message.qos > 0).await
    }

    /// Applies tiering's per-topic decisions to publishes from now on.
    pub fn set_tiers(&self, tiers: Arc<dyn TopicTiers>) {
        self.appender.set_tiers(tiers);
    }

    /// The append path (shared with the other protocols).
    pub fn appender(&self) -> &Arc<Appender> {
        &self.appender
    }

    /// Adds figures to `$SYS/broker/`.
    pub fn set_extra_stats(&self, stats: ExtraStats) {
        let _ = self.extra_stats.set(stats);
    }

    /// The lowest log position holding internal state the broker still needs: the newest
    /// dumps of sessions and retained pointers, and the records retained messages point at.
    /// Retention may delete only below it.
    pub fn internal_floor(&self) -> silt_storage::Result<LogPosition> {
        let mut floor = self.storage.stats().log_end;
        for stream in [SESSIONS_STREAM, RETAINED_STREAM, silt_dataset::streams::STREAMS_STREAM] {
            if let Some(p) = internal::floor(&self.storage, stream)? {
                floor = floor.min(p);
            }
        }
        let retained = self.retained.read().expect("invariant: lock not poisoned").dump();
        for r in retained {
            if let Ok(b) = <[u8; 8]>::try_from(&r.value[..8.min(r.value.len())]) {
                floor = floor.min(LogPosition(u64::from_be_bytes(b)));
            }
        }
        Ok(floor)
    }

    /// Writes fresh dumps of the sessions and retained pointers, and copies retained messages
    /// stored below `target` forward, so the internal floor moves past `target`.
    pub async fn dump_internal(&self, target: LogPosition) -> silt_storage::Result<()> {
        let _guard = self.dump_lock.lock().await;
        let old = self.retained.read().expect("invariant: lock not poisoned").older_than(target);
        let copied = old.len();
        for (topic, entry) in old {
            let original = match self.storage.read_record(&entry) {
                Ok(r) => r,
                Err(e) if e.kind() == silt_storage::ErrorKind::Expired => {
                    let mut retained = self.retained.write().expect("invariant: lock not poisoned");
                    if retained.get(&topic) == Some(entry) {
                        retained.set(&topic, None); // its record is gone
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            let copy = Record {
                stream: RETAINED_COPY_STREAM.into(),
                partition: silt_types::Partition(0),
                topic: String::new(),
                key: Some(bytes::Bytes::copy_from_slice(topic.as_bytes())),
                ..original
            };
            let size = copy.encoded_len() as u32;
            let appended = self.storage.append(std::slice::from_ref(&copy)).await?;
            let moved = IndexEntry { position: appended.positions[0], size, timestamp: entry.timestamp };
            let mut retained = self.retained.write().expect("invariant: lock not poisoned");
            // A publish that replaced the message meanwhile wins.
            if retained.get(&topic) == Some(entry) {
                retained.set(&topic, Some(moved));
            }
        }
        if copied > 0 {
            tracing::info!(copied, "old retained messages copied forward for retention");
        }
        let start = internal::stream_end(&self.storage, RETAINED_STREAM)?;
        let dump = self.retained.read().expect("invariant: lock not poisoned").dump();
        for chunk in dump.chunks(1000) {
            self.storage.append(chunk).await?;
        }
        self.storage.append(&[internal::checkpoint_record(RETAINED_STREAM, start)]).await?;
        self.appender.dump_streams().await?;
        self.persist_all().await;
        Ok(())
    }

    /// Publishes `will` for `client_id` after `delay`, unless the client reconnects first.
    pub fn schedule_will(self: &Arc<Self>, client_id: &str, will: Message, delay: std::time::Duration) {
        let cancel = Arc::new(Notify::new());
        self.state().wills.insert(client_id.to_owned(), cancel.clone());
        let broker = self.clone();
        let client_id = client_id.to_owned();
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.notified() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            {
                let mut st = broker.state();
                if st.wills.get(&client_id).is_some_and(|c| Arc::ptr_eq(c, &cancel)) {
                    st.wills.remove(&client_id);
                } else {
                    return;
                }
            }
            if let Err(e) = broker.publish(&will).await {
                tracing::warn!(client_id = %client_id, error = %e, "will message could not be published");
            }
        });
    }

    /// Cancels a pending delayed will (the client came back).
    pub fn cancel_will(&self, client_id: &str) {
        if let Some(c) = self.state().wills.remove(client_id) {
            c.notify_one();
        }
    }

    /// Retained messages matching `filter`, oldest first, once every retained message handed to
    /// the log before the call is in the index (see [`RetainedInFlight`]).
    pub async fn retained_for(&self, filter: &TopicFilter) -> Vec<Message> {
        self.retained_in_flight.settled().await;
        let entries = self.retained.read().expect("invariant: lock not poisoned").matching(filter);
        crate::retained::read_messages(&self.storage, entries).await
    }

    /// The `$SYS/...` topics whose retained figure the local log still holds. The figures are
    /// volatile (memory tier): once the segment holding one is evicted from the disk (the
    /// object-store copy holds a stand-in), or retention's copy-forward found it gone, it is
    /// not retained any more until it is published again.
    pub(crate) fn sys_retained_locally(&self) -> std::collections::HashSet<String> {
        let entries = self.retained.read().expect("invariant: lock not poisoned").entries_below("$SYS");
        if entries.is_empty() {
            return Default::default();
        }
        let (active, _) = self.storage.active_span();
        let sealed: Vec<(LogPosition, LogPosition)> =
            self.storage.sealed_segments().into_iter().map(|s| (s.base, s.end)).collect();
        let local = |p: LogPosition| p >= active || sealed.iter().any(|&(base, end)| base <= p && p < end);
        entries.into_iter().filter(|(_, e)| local(e.position)).map(|(topic, _)| topic).collect()
    }

    pub fn retained_count(&self) -> usize {
        self.retained.read().expect("invariant: lock not poisoned").len()
    }

    pub fn session_count(&self) -> usize {
        self.state().sessions.len()
    }
}

mod admin;
pub use admin::{DeleteRefused, SessionView};
mod stats;
pub use stats::Stats;

#[cfg(test)]
mod tests;
