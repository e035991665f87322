//! A session's subscriptions and delivery cursors, and how they are persisted.
//!
//! Sessions hold cursors, never copies: each subscription reads one consume queue (the topic
//! queue for a plain filter, the filter queue for a wildcard one) from its cursor. Delivery
//! merges the session's queues in log order, so a message matching several subscriptions is
//! sent once, at the highest QoS granted among them.
//!
//! Invariants:
//! - A subscription's `cursor` is the lowest offset not yet acknowledged (QoS 1/2) or sent
//!   (QoS 0); everything below it is done. Offsets above it that are done too (acknowledged
//!   out of order, or sent at QoS 0 while an earlier message waits for its acknowledgement)
//!   are kept as ranges (`settled`), in memory and in snapshots. On resume, delivery restarts
//!   at the cursor and skips the settled offsets, so what is in flight at a disconnect or
//!   crash is sent again (with DUP set where known) and nothing completed is: a QoS 2 message
//!   is never delivered twice and a QoS 0 one never more than once.
//! - Only entries below the storage's dispatched position are merged: every queue is complete
//!   up to there, so no message is missed by one subscription and duplicated by another.
//! - A pull reads only memory (the index's newest entries, the log's tail cache), so it can
//!   run under the session's lock on the async runtime. What memory does not hold (a queue
//!   behind, a record no longer in the tail cache) comes back as [`Reads`], which the caller
//!   runs off the runtime without the lock ([`Reads::run`]) and hands back
//!   ([`Subscriptions::supply`]) before pulling again. Until then the merge stops: it never
//!   passes a subscription whose next entry it does not know.
//!
//! Snapshots of persistent sessions are appended to the internal stream `__silt_sessions`
//! (key: client id; an empty value deletes), so they live in the commitlog with everything
//! else and survive deletion of the index. The last snapshot per client id wins at start-up.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use silt_storage::{IndexEntry, QueueName, Record, Storage};
use silt_types::{LogPosition, Offset, Partition, QueueId, Timestamp, TopicFilter};
use smallvec::SmallVec;

use crate::message::Message;

mod pending;
mod sparse;
mod submap;
use pending::Pending;
pub use sparse::Sparse;
pub use submap::SubMap;

/// Internal stream of session snapshots.
pub const SESSIONS_STREAM: &str = "__silt_sessions";

/// Entries fetched per queue per pull.
const FETCH: usize = 256;
/// Records read ahead off the runtime at most at once, and their bytes (at least one record).
const READ_AHEAD: usize = 256;
const READ_AHEAD_BYTES: u64 = 8 << 20;

/// The (filter, offset) pairs a delivery settles when it is acknowledged: one for most
/// messages, kept inline. The filter names are the subscriptions' own, shared: a delivery
/// copies no string.
pub type Settles = SmallVec<[(Arc<str>, Offset); 1]>;

/// A subscription as persisted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionState {
    /// Shared with the subscription's key in its session (and the broker's count of
    /// subscriptions per filter): one copy of the filter per subscription.
    #[serde(with = "arc_str_serde")]
    pub filter: Arc<str>,
    pub qos: u8,
    #[serde(default)]
    pub no_local: bool,
    #[serde(default)]
    pub retain_as_published: bool,
    #[serde(default)]
    pub subscription_id: Option<u32>,
    /// Lowest offset of the subscription's queue not yet acknowledged.
    pub cursor: u64,
    /// Highest offset ever sent + 1, to set DUP on redelivery.
    #[serde(default)]
    pub sent: u64,
    /// Offsets above the cursor already done, as half-open ranges `[start, end)` in order.
    /// Empty in a live [`Subscription`] (its `done` set holds them), so a boxed slice: 8 bytes
    /// less than a `Vec` keeps a subscription in the 224-byte size class, not the 256 one.
    #[serde(default, skip_serializing_if = "<[_]>::is_empty")]
    pub settled: Box<[(u64, u64)]>,
}

/// A persistent session as stored in `__silt_sessions`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSnapshot {
    pub client_id: String,
    /// Session expiry interval in seconds (`u32::MAX`: never).
    pub expiry_secs: u32,
    pub subscriptions: Vec<SubscriptionState>,
    /// Inbound QoS 2 packet ids received (PUBREC sent) and not yet released by PUBREL.
    #[serde(default)]
    pub inbound_qos2: Vec<u16>,
    /// When the client disconnected (ms since epoch), while it is offline.
    #[serde(default)]
    pub disconnected_at: Option<i64>,
    /// Outbound QoS 2 messages sent with a packet id and not yet completed (PUBCOMP).
    #[serde(default)]
    pub outbound_qos2: Vec<OutboundQos2>,
    /// Shared subscriptions (`$share/{group}/{filter}`) this session is a member of.
    #[serde(default)]
    pub shared: Vec<SharedMembership>,
    /// The user the session belongs to (absent in snapshots written before sessions had
    /// owners: the next user to connect claims it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<SessionOwner>,
}

/// Who created a session: a username, or an anonymous client (`user: None`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOwner {
    pub user: Option<String>,
}

/// A session's membership in a shared-subscription group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedMembership {
    /// The full `$share/{group}/{filter}` string.
    pub key: String,
    pub qos: u8,
    #[serde(default)]
    pub subscription_id: Option<u32>,
}

/// Splits `$share/{group}/{filter}` into group and filter; `None` if it is not a valid shared
/// subscription (empty group, wildcard in the group name, invalid filter).
pub fn parse_shared(s: &str) -> Option<(&str, TopicFilter)> {
    let rest = s.strip_prefix("$share/")?;
    let (group, filter) = rest.split_once('/')?;
    if group.is_empty() || group.contains(['+', '#']) {
        return None;
    }
    Some((group, TopicFilter::new(filter).ok()?))
}

/// An outbound QoS 1/2 delivery in flight, kept with the session so that a reconnect resends
/// it under the same packet id (MQTT-4.4.0-1), and a QoS 2 one whose PUBREL went out as a
/// PUBREL. QoS 2 entries are persisted before their PUBLISH (and again when released), so a
/// restart (kill -9 included) never resends one as a new message; QoS 1 entries are persisted
/// with the cursors (a crash may resend one under a new id, never lose it). QoS 2 deliveries
/// from a shared group are kept too; QoS 1 ones go back to the group when the member leaves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundQos2 {
    pub packet_id: u16,
    /// 1 or 2 (entries written before QoS 1 was tracked are QoS 2).
    #[serde(default = "qos_two")]
    pub qos: u8,
    /// PUBREC received and PUBREL sent (QoS 2).
    #[serde(default)]
    pub released: bool,
    /// The record (log position, size, timestamp).
    pub position: u64,
    pub size: u32,
    pub timestamp: i64,
    /// (filter, offset) pairs it settles; persisted as `[filter, offset]` pairs.
    #[serde(with = "settles_serde")]
    pub settles: Settles,
    /// Subscription identifiers it was sent with.
    #[serde(default)]
    pub subscription_ids: Vec<u32>,
    /// The shared group (`$share/{group}/{filter}`) whose cursor it settles, for a QoS 2
    /// delivery to a group member: completed with this member only (MQTT-4.8.2-4), or dropped
    /// if the member's session ends first (MQTT-4.8.2-5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

fn qos_two() -> u8 {
    2
}

impl OutboundQos2 {
    pub fn entry(&self) -> IndexEntry {
        IndexEntry { position: LogPosition(self.position), size: self.size, timestamp: Timestamp(self.timestamp) }
    }
}

/// An `Arc<str>` as a plain string (serde's own needs its `rc` feature, which would rebuild
/// every crate that uses serde).
mod arc_str_serde {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
        String::deserialize(d).map(Arc::from)
    }
}

/// [`Settles`] as `[filter, offset]` pairs, the form snapshots have always had.
mod settles_serde {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(settles: &Settles, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(settles.iter().map(|(f, o)| (&**f, o.get())))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Settles, D::Error> {
        let pairs = Vec::<(String, u64)>::deserialize(d)?;
        Ok(pairs.into_iter().map(|(f, o)| (Arc::from(f), Offset(o))).collect())
    }
}

impl SessionSnapshot {
    pub fn to_record(&self, now: Timestamp) -> Record {
        Record {
            timestamp: now,
            stream: SESSIONS_STREAM.into(),
            partition: Partition(0),
            key: Some(Bytes::copy_from_slice(self.client_id.as_bytes())),
            value: Bytes::from(serde_json::to_vec(self).expect("invariant: snapshot serializes")),
            ..Record::default()
        }
    }

    pub fn tombstone(client_id: &str, now: Timestamp) -> Record {
        Record {
            timestamp: now,
            stream: SESSIONS_STREAM.into(),
            partition: Partition(0),
            key: Some(Bytes::copy_from_slice(client_id.as_bytes())),
            ..Record::default()
        }
    }

    /// Reads the snapshots from the newest dump on; the last one per key wins. Returns them
    /// and how many records were replayed.
    pub fn load_all(storage: &Storage) -> silt_storage::Result<(HashMap<String, SessionSnapshot>, u64)> {
        let from = silt_dataset::internal::checkpoint(storage, SESSIONS_STREAM)?;
        let mut out = HashMap::new();
        let replayed = silt_dataset::internal::scan(storage, SESSIONS_STREAM, from, |_, r| {
            let key = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
            if r.value.is_empty() {
                out.remove(&key);
                return;
            }
            match serde_json::from_slice::<SessionSnapshot>(&r.value) {
                Ok(s) => {
                    out.insert(key, s);
                }
                Err(e) => tracing::warn!(client_id = %key, error = %e, "unreadable session snapshot skipped"),
            }
        })?;
        Ok((out, replayed))
    }
}

/// The queue a subscription reads, by its filter (a valid one: a session's key, or a
/// [`TopicFilter`]'s string). Built when a read needs it rather than kept with each
/// subscription, whose key already holds the filter.
pub fn queue_for(filter: &str) -> QueueName {
    if filter.contains(['+', '#']) { QueueName::Filter(filter.to_owned()) } else { QueueName::Topic(filter.to_owned()) }
}

/// A subscription with its live delivery state.
#[derive(Debug)]
pub struct Subscription {
    pub state: SubscriptionState,
    queue_id: Option<QueueId>,
    /// Next offset to fetch from the index.
    read: Offset,
    buf: VecDeque<(Offset, IndexEntry)>,
    /// Sent, not yet acknowledged (with the entry, to put it back if released).
    pending: Pending,
    /// Done before the pull reached them (settled before a reconnect or restart, or restored
    /// in-flight deliveries completed early): skipped when the pull gets there, never sent
    /// again.
    done: OffsetSet,
    /// Known without reading the index: the queue was missing while the storage had forgotten
    /// that many created queues' names (`absent`), or had nothing past `read` (the offset here)
    /// while it had forgotten that many entries (`quiet`).
    absent: Option<u64>,
    quiet: Option<(Offset, u64)>,
}

impl Subscription {
    pub fn new(mut state: SubscriptionState) -> Self {
        let read = Offset(state.cursor);
        let mut done = OffsetSet::default();
        for (start, end) in std::mem::take(&mut state.settled).into_vec() {
            done.insert_range(start.max(state.cursor + 1), end);
        }
        Self {
            state,
            queue_id: None,
            read,
            buf: VecDeque::new(),
            pending: Pending::default(),
            done,
            absent: None,
            quiet: None,
        }
    }

    /// The offsets above the cursor that are done: those the pull passed that are neither in
    /// flight nor waiting in the buffer, and those settled ahead of it.
    fn settled(&self) -> OffsetSet {
        let mut out = self.done.clone();
        let holes: BTreeSet<u64> = self
            .pending
            .offsets()
            .map(|o| o.get())
            .chain(self.buf.iter().map(|(o, _)| o.get()).filter(|o| !self.done.contains(*o)))
            .collect();
        let mut at = self.state.cursor;
        for hole in holes.into_iter().chain(std::iter::once(self.read.get())) {
            if hole > at {
                out.insert_range(at.max(self.state.cursor + 1), hole.min(self.read.get()));
            }
            at = at.max(hole + 1);
        }
        out.remove_below(self.state.cursor + 1);
        out
    }

    /// The persisted state, with the settled ranges.
    fn snapshot_state(&self) -> SubscriptionState {
        SubscriptionState { settled: self.settled().ranges().collect(), ..self.state.clone() }
    }

    fn recompute_cursor(&mut self) {
        let next_undelivered = self.buf.front().map_or(self.read, |(o, _)| *o);
        let first_pending = self.pending.first();
        self.state.cursor = first_pending.map_or(next_undelivered, |p| p.min(next_undelivered)).get();
    }

    /// Fills an empty buffer from memory; the read it needs when memory cannot tell (`filter`
    /// is the subscription's key).
    fn fetch(&mut self, filter: &Arc<str>, storage: &Storage, limit: LogPosition) -> Option<QueueRead> {
        if !self.buf.is_empty() {
            return None;
        }
        let read =
            |s: &Self| QueueRead { filter: Arc::clone(filter), name: queue_for(filter), id: s.queue_id, from: s.read };
        if self.queue_id.is_none() {
            self.queue_id = storage.created_queue_id(&queue_for(filter));
        }
        let Some(id) = self.queue_id else {
            return (self.absent != Some(storage.created_forgotten())).then(|| read(self));
        };
        match storage.read_index_cached(id, self.read, FETCH) {
            Some(entries) => {
                self.take(entries, limit);
                None
            }
            None if self.quiet == Some((self.read, storage.recent_forgotten())) && !storage.holds_recent(id) => None,
            None => Some(read(self)),
        }
    }

    /// Buffers `entries` (from `read` on) up to `limit`; whether all of them were below it.
    fn take(&mut self, entries: Vec<(Offset, IndexEntry)>, limit: LogPosition) -> bool {
        for (off, e) in entries {
            if e.position >= limit {
                return false;
            }
            self.read = off.next();
            self.buf.push_back((off, e));
        }
        true
    }

    /// What [`backlog`] needs to count this subscription's backlog, taken from memory.
    pub fn backlog_cursor(&self, filter: &str) -> BacklogCursor {
        BacklogCursor { queue: queue_for(filter), id: self.queue_id, cursor: self.state.cursor }
    }
}

/// One message chosen for delivery, with the queue offsets it settles when acknowledged.
#[derive(Debug)]
pub struct Outgoing {
    /// Shared with the other subscribers it goes to.
    pub message: Arc<Message>,
    pub position: LogPosition,
    pub entry: IndexEntry,
    pub qos: u8,
    pub retain: bool,
    pub dup: bool,
    pub subscription_ids: Vec<u32>,
    /// (filter, offset) pairs acknowledged together with this message.
    pub settles: Settles,
}

/// Subscriptions of a session and their merge.
#[derive(Debug, Default)]
pub struct Subscriptions {
    /// By filter, in filter order. Boxed: a subscription's state is a few hundred bytes, and
    /// inserts move the entries after them. The key is shared with every delivery's
    /// [`Settles`].
    pub subs: SubMap,
    /// Records read off the runtime for buffered entries, by position, until merged.
    prefetched: BTreeMap<LogPosition, silt_storage::Result<Record>>,
}

/// The subscriptions whose next entry is the record a pull is at: filter, subscription,
/// offset, entry.
type Matched<'a> = SmallVec<[(&'a Arc<str>, &'a mut Subscription, Offset, IndexEntry); 2]>;

/// What one pull chose, and what it could not read from memory.
#[derive(Debug)]
pub struct Pulled {
    pub out: Vec<Outgoing>,
    pub reads: Option<Reads>,
}

/// Index and log reads a pull needs: RocksDB, the disk, possibly the object store. Run them
/// off the async runtime and without the session's lock, then [`Subscriptions::supply`].
#[derive(Debug, Default)]
pub struct Reads {
    queues: Vec<QueueRead>,
    records: Vec<IndexEntry>,
}

#[derive(Debug)]
struct QueueRead {
    filter: Arc<str>,
    name: QueueName,
    id: Option<QueueId>,
    from: Offset,
}

/// What [`Reads::run`] read.
#[derive(Debug)]
pub struct ReadsDone {
    /// The dispatched position and the storage's forgotten counts before reading.
    limit: LogPosition,
    created_forgotten: u64,
    forgotten: u64,
    queues: Vec<QueueDone>,
    records: Vec<(LogPosition, silt_storage::Result<Record>)>,
}

#[derive(Debug)]
struct QueueDone {
    filter: Arc<str>,
    from: Offset,
    id: Option<QueueId>,
    entries: Vec<(Offset, IndexEntry)>,
    /// The queue's next offset before the read.
    end: Offset,
}

impl Reads {
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty() && self.records.is_empty()
    }

    /// Blocks on RocksDB, the disk and possibly the object store. A record that cannot be
    /// read is handed back as its error (a gone one is skipped by the merge, any other fails
    /// the pull); a failed index read fails here.
    pub fn run(self, storage: &Storage) -> silt_storage::Result<ReadsDone> {
        let limit = storage.dispatched();
        let created_forgotten = storage.created_forgotten();
        let forgotten = storage.recent_forgotten();
        let mut queues = Vec::with_capacity(self.queues.len());
        for q in self.queues {
            let id = match q.id {
                Some(id) => Some(id),
                None => storage.queue_id(&q.name)?,
            };
            let (entries, end) = match id {
                Some(id) => {
                    // The end first: if nothing at or after `from` is held, everything up to
                    // it is gone (retention) and the reader moves past it.
                    let end = storage.queue_bounds(id)?.1;
                    (storage.read_index(id, q.from, FETCH)?, end)
                }
                None => (Vec::new(), q.from),
            };
            queues.push(QueueDone { filter: q.filter, from: q.from, id, entries, end });
        }
        let records = self.records.iter().map(|e| (e.position, storage.read_record(e))).collect();
        Ok(ReadsDone { limit, created_forgotten, forgotten, queues, records })
    }
}

impl Subscriptions {
    /// Picks up to `max` messages in log order across all subscriptions, from memory only
    /// (see the module doc): what it could not read is in [`Pulled::reads`]. Messages that need
    /// no acknowledgement (QoS 0) settle at once; others settle on [`Self::settle`].
    pub fn pull(
        &mut self,
        storage: &Storage,
        client_id: &str,
        now: Timestamp,
        max: usize,
    ) -> silt_storage::Result<Pulled> {
        self.pull_shared(storage, None, client_id, now, max)
    }

    /// [`Self::pull`], sharing the messages it decodes with other subscribers through
    /// `decoded` (see the `decoded` module).
    pub(crate) fn pull_shared(
        &mut self,
        storage: &Storage,
        decoded: Option<&crate::decoded::Decoded>,
        client_id: &str,
        now: Timestamp,
        max: usize,
    ) -> silt_storage::Result<Pulled> {
        let limit = storage.dispatched();
        let mut out = Vec::new();
        let mut reads = Reads::default();
        while out.len() < max {
            reads.queues.extend(self.subs.iter_mut().filter_map(|(f, s)| s.fetch(f, storage, limit)));
            if !reads.queues.is_empty() {
                break;
            }
            let Some(entry) =
                self.subs.values().filter_map(|s| s.buf.front().map(|(_, e)| *e)).min_by_key(|e| e.position)
            else {
                break;
            };
            let head = entry.position;
            while let Some(first) = self.prefetched.first_entry()
                && *first.key() < head
            {
                drop(first.remove()); // read for entries given back or skipped meanwhile
            }
            let read = match self.prefetched.remove(&head) {
                Some(r) => r.map(|r| Arc::new(Message::from_record(r))),
                None => {
                    let from_memory = || storage.read_record_cached(&entry).map(|r| r.map(Message::from_record));
                    let read = match decoded {
                        Some(d) => d.get_or(head, from_memory),
                        None => from_memory().map(|r| r.map(Arc::new)),
                    };
                    match read {
                        Some(r) => r,
                        None => {
                            reads.records = self.uncached(storage);
                            break;
                        }
                    }
                }
            };
            let mut matched: Matched<'_> = SmallVec::new();
            for (f, s) in self.subs.iter_mut() {
                if s.buf.front().is_some_and(|(_, e)| e.position == head) {
                    let (o, e) = s.buf.pop_front().expect("invariant: front exists");
                    matched.push((f, s, o, e));
                }
            }
            // Gone records (retention raced the read, or a `tier = "local"` message lost with
            // the disk) are skipped like expired ones: the cursors move past them.
            let (message, gone) = match read {
                Ok(m) => (m, false),
                Err(e) if e.kind() == silt_storage::ErrorKind::Expired => (Arc::new(Message::default()), true),
                Err(e) => return Err(e),
            };
            let expired = gone || message.remaining_expiry(now) == Some(0);
            let mut qos = 0u8;
            let mut retain = false;
            let mut dup = false;
            let mut ids = Vec::new();
            let mut settles = Settles::new();
            for (f, s, o, _) in matched.iter_mut() {
                if s.pending.contains(*o) {
                    continue; // held by a restored in-flight delivery
                }
                if s.done.remove(o.get()) {
                    s.recompute_cursor(); // a restored delivery completed before the pull got here
                    continue;
                }
                let own = s.state.no_local && message.publisher.as_deref() == Some(client_id.as_bytes());
                if expired || own {
                    s.recompute_cursor();
                    continue;
                }
                qos = qos.max(s.state.qos);
                retain |= s.state.retain_as_published && message.retain;
                dup |= o.get() < s.state.sent;
                ids.extend(s.state.subscription_id);
                settles.push((Arc::clone(f), *o));
            }
            if settles.is_empty() {
                continue;
            }
            let qos = qos.min(message.qos);
            for (f, s, o, e) in matched {
                if !settles.iter().any(|(g, off)| Arc::ptr_eq(f, g) && *off == o) {
                    continue;
                }
                s.state.sent = s.state.sent.max(o.get() + 1);
                if qos > 0 {
                    s.pending.insert(o, e);
                }
                s.recompute_cursor();
            }
            out.push(Outgoing {
                message,
                position: head,
                entry,
                qos,
                retain,
                dup: dup && qos > 0,
                subscription_ids: ids,
                settles,
            });
        }
        Ok(Pulled { out, reads: (!reads.is_empty()).then_some(reads) })
    }

    /// The buffered entries whose records memory does not hold, in log order, up to the
    /// read-ahead bounds.
    fn uncached(&self, storage: &Storage) -> Vec<IndexEntry> {
        let mut entries: Vec<IndexEntry> = self.subs.values().flat_map(|s| s.buf.iter().map(|(_, e)| *e)).collect();
        entries.sort_unstable_by_key(|e| e.position);
        entries.dedup_by_key(|e| e.position);
        let mut bytes = 0u64;
        let mut out = Vec::new();
        for e in entries {
            if out.len() == READ_AHEAD || (!out.is_empty() && bytes + u64::from(e.size) > READ_AHEAD_BYTES) {
                break;
            }
            if self.prefetched.contains_key(&e.position) || storage.read_record_cached(&e).is_some() {
                continue;
            }
            bytes += u64::from(e.size);
            out.push(e);
        }
        out
    }

    /// Takes in what [`Reads::run`] read. A subscription that moved meanwhile (given entries
    /// back, or gone) ignores its part and the next pull asks again; one rewound to where the
    /// read began takes it (entries and records never change).
    pub fn supply(&mut self, done: ReadsDone) {
        for q in done.queues {
            let Some(s) = self.subs.get_mut(&q.filter) else { continue };
            if s.read != q.from || !s.buf.is_empty() {
                continue;
            }
            let Some(id) = q.id else {
                s.absent = Some(done.created_forgotten);
                continue;
            };
            s.queue_id = Some(id);
            let full = q.entries.len() == FETCH;
            if q.entries.is_empty() && q.end > s.read {
                // Every entry up to the end is below the retention floor: gone, skipped like
                // an expired message.
                s.read = q.end;
                s.recompute_cursor();
            }
            if s.take(q.entries, done.limit) && !full {
                s.quiet = Some((s.read, done.forgotten));
            }
        }
        for (pos, r) in done.records {
            self.prefetched.insert(pos, r);
        }
    }

    /// [`Self::pull`] with its reads done on this thread: for callers off the async runtime.
    pub fn pull_blocking(
        &mut self,
        storage: &Storage,
        client_id: &str,
        now: Timestamp,
        max: usize,
    ) -> silt_storage::Result<Vec<Outgoing>> {
        let mut out = Vec::new();
        // Bounded, should a read ever bring nothing new.
        for _ in 0..max.saturating_add(64) {
            if out.len() == max {
                break;
            }
            let p = self.pull(storage, client_id, now, max - out.len())?;
            out.extend(p.out);
            match p.reads {
                Some(reads) => self.supply(reads.run(storage)?),
                None => break,
            }
        }
        Ok(out)
    }

    /// Marks the offsets of an acknowledged message done and advances cursors.
    pub fn settle(&mut self, settles: &[(Arc<str>, Offset)]) {
        for (filter, off) in settles {
            if let Some(s) = self.subs.get_mut(filter) {
                s.pending.remove(*off);
                // A restored delivery can complete before the pull has passed its offset.
                // (An offset the pull passed lies below the buffer; the buffer is in order.)
                let unpulled = *off >= s.read
                    || (s.buf.front().is_some_and(|(o, _)| o <= off)
                        && s.buf.binary_search_by_key(off, |(o, _)| *o).is_ok());
                if unpulled {
                    s.done.insert_range(off.get(), off.get() + 1);
                }
                s.recompute_cursor();
            }
        }
    }

    /// Marks offsets as in flight (restored QoS 2 deliveries), so pulls skip them and cursors
    /// wait for them.
    pub fn hold(&mut self, settles: &[(Arc<str>, Offset)], entry: IndexEntry) {
        for (filter, off) in settles {
            if let Some(s) = self.subs.get_mut(filter) {
                s.pending.insert(*off, entry);
                s.recompute_cursor();
            }
        }
    }

    /// Gives sent-but-unacknowledged offsets back for delivery (a shared-subscription member
    /// left with them in flight: another member gets them).
    pub fn release(&mut self, settles: &[(Arc<str>, Offset)]) {
        for (filter, off) in settles {
            if let Some(s) = self.subs.get_mut(filter)
                && let Some(e) = s.pending.remove(*off)
            {
                let at = s.buf.partition_point(|(o, _)| o < off);
                s.buf.insert(at, (*off, e));
                s.recompute_cursor();
            }
        }
    }

    /// Forgets in-flight state so delivery restarts at the cursors (after a reconnect); what
    /// was settled above them stays settled.
    pub fn rewind(&mut self) {
        self.prefetched.clear();
        for s in self.subs.values_mut() {
            let settled = s.settled();
            s.pending.clear();
            s.buf.clear();
            s.done = settled;
            s.read = Offset(s.state.cursor);
        }
    }

    pub fn states(&self) -> Vec<SubscriptionState> {
        self.subs.values().map(|s| s.snapshot_state()).collect()
    }
}

/// A client id, one shared copy: the session, its connection and the broker's maps keep it.
pub type ClientId = Arc<str>;

/// A session: subscriptions with cursors, and what survives a reconnect.
#[derive(Debug)]
pub struct Session {
    pub client_id: ClientId,
    /// The connection attached to the session (set under this lock together with the rewind
    /// of a takeover): a connection taken over may still be finishing a delivery, and must
    /// not pull for the session any more. Connection ids start at 1: the niche keeps the
    /// session (with its lock and count) within 256 bytes, one allocator size class lower.
    conn: Option<std::num::NonZeroU64>,
    /// Session expiry interval in seconds; 0 means the session ends with the connection.
    pub expiry_secs: u32,
    pub subs: Subscriptions,
    /// Inbound QoS 2 packet ids awaiting PUBREL.
    pub inbound_qos2: Sparse<BTreeSet<u16>>,
    pub disconnected_at: Option<Timestamp>,
    /// Cursors moved since the last snapshot.
    pub dirty: bool,
    /// Outbound QoS 1/2 deliveries not yet completed (see [`OutboundInFlight`]).
    pub outbound_qos2: OutboundInFlight,
    /// Shared-subscription memberships by `$share/{group}/{filter}`.
    pub shared: Sparse<BTreeMap<String, SharedMembership>>,
    /// Who the session belongs to; `None` only for a session restored from a snapshot that
    /// predates owners.
    pub owner: Option<SessionOwner>,
}

/// A shared-subscription group: one cursor over the filter's queue for all its members, so
/// each message goes to one member; with every member offline the cursor keeps the backlog.
#[derive(Debug)]
pub struct SharedGroup {
    pub key: String,
    pub subs: Subscriptions,
    /// Sessions (online or offline) that are members.
    pub members: usize,
    pub dirty: bool,
}

pub type GroupRef = Arc<tokio::sync::Mutex<SharedGroup>>;

impl SharedGroup {
    pub(crate) fn snapshot(&self) -> SessionSnapshot {
        SessionSnapshot {
            client_id: self.key.clone(),
            expiry_secs: u32::MAX,
            subscriptions: self.subs.states(),
            ..SessionSnapshot::default()
        }
    }
}

impl Session {
    /// The connection attached to the session, if one ever was.
    pub fn conn(&self) -> Option<crate::router::ConnId> {
        self.conn.map(std::num::NonZeroU64::get)
    }

    /// Attaches `conn` (an id from the broker's count, which starts at 1).
    pub(crate) fn attach(&mut self, conn: crate::router::ConnId) {
        self.conn = Some(std::num::NonZeroU64::new(conn).expect("invariant: connection ids start at 1"));
    }

    pub(crate) fn new(client_id: ClientId, expiry_secs: u32) -> Self {
        Self {
            client_id,
            conn: None,
            expiry_secs,
            subs: Subscriptions::default(),
            inbound_qos2: Sparse::default(),
            disconnected_at: None,
            dirty: false,
            outbound_qos2: OutboundInFlight::default(),
            shared: Sparse::default(),
            owner: None,
        }
    }

    pub fn persistent(&self) -> bool {
        self.expiry_secs > 0
    }

    pub fn snapshot(&self) -> SessionSnapshot {
        SessionSnapshot {
            client_id: self.client_id.to_string(),
            expiry_secs: self.expiry_secs,
            subscriptions: self.subs.states(),
            inbound_qos2: self.inbound_qos2.iter().copied().collect(),
            disconnected_at: self.disconnected_at.map(Timestamp::get),
            outbound_qos2: self.outbound_in_order(),
            shared: self.shared.values().cloned().collect(),
            owner: self.owner.clone(),
        }
    }

    /// The outbound QoS 1/2 deliveries in flight, by packet id.
    pub fn outbound_in_order(&self) -> Vec<OutboundQos2> {
        let mut list: Vec<OutboundQos2> = self.outbound_qos2.iter().cloned().collect();
        list.sort_unstable_by_key(|o| o.packet_id);
        list
    }

    /// Whether the session keeps the shared group `key`'s in-flight delivery of `settles` (a
    /// QoS 2 one, to be completed with this member).
    pub fn holds_shared(&self, key: &str, settles: &[(Arc<str>, Offset)]) -> bool {
        self.outbound_qos2.iter().any(|o| {
            o.group.as_deref() == Some(key)
                && o.settles.len() == settles.len()
                && o.settles.iter().zip(settles).all(|((f, off), (g, o))| f == g && off == o)
        })
    }

    /// Its subscriptions' cursors, for [`backlog`] to count off the session's lock.
    pub fn backlog_cursors(&self) -> Vec<BacklogCursor> {
        self.subs.subs.iter().map(|(f, s)| s.backlog_cursor(f)).collect()
    }
}

pub type SessionRef = Arc<tokio::sync::Mutex<Session>>;

/// A subscription's queue and cursor, copied out of its session.
#[derive(Clone, Debug)]
pub struct BacklogCursor {
    queue: QueueName,
    /// The queue's id when the subscription knew it.
    id: Option<QueueId>,
    cursor: u64,
}

/// Messages waiting between `cursors` and the end of their queues. Blocking: reads the index
/// for a queue whose newest entries memory does not hold (call it on the blocking pool,
/// holding no session's lock). `$SYS` counts every session's backlog each interval: with the
/// end from memory, an idle broker's count opens no RocksDB iterator for the queues written
/// since it started.
pub fn backlog(storage: &Storage, cursors: &[BacklogCursor]) -> u64 {
    cursors
        .iter()
        .filter_map(|c| {
            let id = match c.id {
                Some(id) => id,
                None => storage.queue_id(&c.queue).ok().flatten()?,
            };
            let next = storage.queue_end(id).ok()?;
            Some(next.get().saturating_sub(c.cursor))
        })
        .sum()
}

/// A session's outbound QoS 1/2 deliveries in flight, in the order they were added. One is
/// added per QoS 1/2 delivery and removed at its acknowledgement; the connection allocates
/// packet ids in sending order and clients acknowledge mostly in that order, so the one to
/// remove is nearly always the oldest: a deque finds it at the front without hashing and
/// removes it without shifting the others (a hash map of 112-byte entries spent a tenth of
/// fan-out's CPU probing and rehashing under this churn; a B-tree shifted its leaves). A
/// packet id is in it at most once: the connection never allocates an id still in flight.
#[derive(Debug, Default)]
pub struct OutboundInFlight(VecDeque<OutboundQos2>);

impl OutboundInFlight {
    pub fn insert(&mut self, o: OutboundQos2) {
        debug_assert!(self.get(o.packet_id).is_none(), "packet id {} in flight twice", o.packet_id);
        self.0.push_back(o);
    }

    pub fn remove(&mut self, packet_id: u16) -> Option<OutboundQos2> {
        let at = self.0.iter().position(|o| o.packet_id == packet_id)?;
        self.0.remove(at)
    }

    pub fn get(&self, packet_id: u16) -> Option<&OutboundQos2> {
        self.0.iter().find(|o| o.packet_id == packet_id)
    }

    pub fn get_mut(&mut self, packet_id: u16) -> Option<&mut OutboundQos2> {
        self.0.iter_mut().find(|o| o.packet_id == packet_id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &OutboundQos2> {
        self.0.iter()
    }

    /// Takes every entry out.
    pub fn take(&mut self) -> Vec<OutboundQos2> {
        std::mem::take(&mut self.0).into()
    }
}

/// Offsets as disjoint, non-adjacent half-open ranges `[start, end)`, keyed by start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OffsetSet(BTreeMap<u64, u64>);

impl OffsetSet {
    pub fn contains(&self, o: u64) -> bool {
        self.0.range(..=o).next_back().is_some_and(|(_, &end)| o < end)
    }

    /// Adds `[start, end)`, merging with the ranges it overlaps or touches.
    pub fn insert_range(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.0.range(..=start).next_back()
            && e >= start
        {
            start = s;
            end = end.max(e);
        }
        let covered: Vec<u64> = self.0.range(start..=end).map(|(&s, _)| s).collect();
        for s in covered {
            let e = self.0.remove(&s).expect("invariant: listed above");
            end = end.max(e);
        }
        self.0.insert(start, end);
    }

    /// Removes `o`; returns whether it was there.
    pub fn remove(&mut self, o: u64) -> bool {
        let Some((&start, &end)) = self.0.range(..=o).next_back().filter(|(_, e)| o < **e) else {
            return false;
        };
        self.0.remove(&start);
        if start < o {
            self.0.insert(start, o);
        }
        if o + 1 < end {
            self.0.insert(o + 1, end);
        }
        true
    }

    /// Drops every offset below `o`.
    pub fn remove_below(&mut self, o: u64) {
        let below: Vec<(u64, u64)> = self.0.range(..o).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in below {
            self.0.remove(&s);
            if e > o {
                self.0.insert(o, e);
            }
        }
    }

    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().map(|(&s, &e)| (s, e))
    }
}

#[cfg(test)]
mod tests;
