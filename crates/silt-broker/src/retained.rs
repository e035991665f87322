//! Retained messages: the last retained message per topic, found for a new subscription by
//! walking a trie of topic names along the filter's levels (never a scan of every topic).
//!
//! Durability: a retained PUBLISH is appended as its record followed, in the same batch, by a
//! pointer record in the internal stream `__silt_retained` (key: topic; value: the byte size of
//! the message record just before it, or empty to delete). At start-up the pointer queue is
//! replayed, so retained messages come back from the commitlog alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use silt_dataset::RetainedIndex;
use silt_storage::{IndexEntry, Record, Storage};
use silt_types::{LogPosition, Partition, Timestamp, TopicFilter};

use crate::message::Message;

/// Internal stream of retained-message pointers.
pub const RETAINED_STREAM: &str = "__silt_retained";

/// Internal stream of retained messages copied forward out of old segments, so a retained
/// message that is never replaced does not hold retention back. A copy has no MQTT topic (so
/// nobody is notified of it); its key is the topic.
pub const RETAINED_COPY_STREAM: &str = "__silt_retained_copies";

#[derive(Debug, Default)]
struct Node {
    children: HashMap<String, Node>,
    entry: Option<IndexEntry>,
}

impl Drop for Node {
    /// Iterative: a retained topic may be 32,768 levels deep.
    fn drop(&mut self) {
        let mut doomed: Vec<Node> = self.children.drain().map(|(_, n)| n).collect();
        while let Some(mut n) = doomed.pop() {
            doomed.extend(n.children.drain().map(|(_, c)| c));
        }
    }
}

impl Node {
    fn is_empty(&self) -> bool {
        self.entry.is_none() && self.children.is_empty()
    }
}

#[derive(Debug, Default)]
pub struct RetainedStore {
    root: Node,
    len: usize,
}

impl RetainedStore {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets (or with `None`, clears) the retained message of `topic`.
    pub fn set(&mut self, topic: &str, entry: Option<IndexEntry>) {
        let levels: Vec<&str> = topic.split('/').collect();
        match entry {
            Some(e) => {
                let mut node = &mut self.root;
                for l in levels {
                    node = node.children.entry(l.to_owned()).or_default();
                }
                if node.entry.replace(e).is_none() {
                    self.len += 1;
                }
            }
            None => {
                if remove(&mut self.root, &levels) {
                    self.len -= 1;
                }
            }
        }
    }

    /// Clears every retained message below the first level `level` (`"$SYS"`: every
    /// `$SYS/...` topic; a topic named `level` alone stays). Returns how many were cleared.
    pub fn clear_below(&mut self, level: &str) -> usize {
        let Some(node) = self.root.children.get_mut(level) else { return 0 };
        let mut cleared = Vec::new();
        for (_, child) in node.children.drain() {
            collect_all(&child, &mut cleared);
        }
        if node.is_empty() {
            self.root.children.remove(level);
        }
        self.len -= cleared.len();
        cleared.len()
    }

    /// `(topic, entry)` of every retained message below the first level `level`.
    pub fn entries_below(&self, level: &str) -> Vec<(String, IndexEntry)> {
        let mut out = Vec::new();
        let Some(top) = self.root.children.get(level) else { return out };
        // (node, its topic); explicit stack, as everywhere here that follows topic levels.
        let mut stack: Vec<(&Node, String)> = top.children.iter().map(|(n, c)| (c, format!("{level}/{n}"))).collect();
        while let Some((node, topic)) = stack.pop() {
            stack.extend(node.children.iter().map(|(n, c)| (c, format!("{topic}/{n}"))));
            if let Some(e) = node.entry {
                out.push((topic, e));
            }
        }
        out
    }

    /// The retained message of one topic.
    pub fn get(&self, topic: &str) -> Option<IndexEntry> {
        let filter = silt_types::TopicFilter::new(topic.to_owned()).ok()?;
        let levels: Vec<&str> = filter.levels().collect();
        let mut out = Vec::new();
        walk(&self.root, &levels, &mut out);
        out.pop()
    }

    /// `(topic, entry)` of every retained message stored below `pos`.
    pub fn older_than(&self, pos: LogPosition) -> Vec<(String, IndexEntry)> {
        self.dump()
            .into_iter()
            .filter_map(|r| {
                let topic = String::from_utf8(r.key?.to_vec()).ok()?;
                let at = LogPosition(u64::from_be_bytes(r.value.get(..8)?.try_into().ok()?));
                let size = u32::from_be_bytes(r.value.get(8..12)?.try_into().ok()?);
                (at < pos).then_some((topic, IndexEntry { position: at, size, timestamp: r.timestamp }))
            })
            .collect()
    }

    /// Every retained message whose topic matches `filter`.
    pub fn matching(&self, filter: &TopicFilter) -> Vec<IndexEntry> {
        let levels: Vec<&str> = filter.levels().collect();
        let mut out = Vec::new();
        walk(&self.root, &levels, &mut out);
        out.sort_by_key(|e| e.position);
        out
    }

    /// The pointer record that follows a retained message in its batch.
    pub fn pointer(message: &Record, now: Timestamp) -> Record {
        let value = if message.value.is_empty() {
            Bytes::new()
        } else {
            Bytes::copy_from_slice(&(message.encoded_len() as u32).to_be_bytes())
        };
        Record {
            timestamp: now,
            stream: RETAINED_STREAM.into(),
            partition: Partition(0),
            key: Some(Bytes::copy_from_slice(message.topic.as_bytes())),
            value,
            ..Record::default()
        }
    }

    /// Rebuilds the store from the pointer stream, from its newest dump on. Returns the store
    /// and how many pointers were replayed. Topics with more than `max_levels` levels (stored
    /// before the limit was set, or under a higher one) are skipped and logged: nobody could
    /// subscribe to them now, and they are dropped at the next dump.
    pub fn load(storage: &Storage, max_levels: usize) -> silt_storage::Result<(RetainedStore, u64)> {
        let mut store = RetainedStore::default();
        let from = silt_dataset::internal::checkpoint(storage, RETAINED_STREAM)?;
        let mut skipped = 0u64;
        // Where each topic's newest live pointer (a set or a clear) sits in the log. A dump's
        // absolute pointer can land after a live pointer that replaced it (the dump's snapshot
        // was taken before that publish was applied): it loses to anything newer than its
        // message.
        let mut live: HashMap<String, LogPosition> = HashMap::new();
        let replayed = silt_dataset::internal::scan(storage, RETAINED_STREAM, from, |e, r| {
            let topic = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
            if silt_types::level_count(&topic) > max_levels {
                if skipped == 0 {
                    tracing::warn!(
                        levels = silt_types::level_count(&topic),
                        max_topic_levels = max_levels,
                        topic_start = %crate::log_prefix(&topic),
                        "retained message deeper than mqtt.max_topic_levels skipped"
                    );
                }
                skipped += 1;
                return;
            }
            let entry = match r.value.len() {
                // A live clear.
                0 => {
                    live.insert(topic.clone(), e.position);
                    None
                }
                // Relative: the message record sits just before this pointer, in its batch.
                4 => {
                    let size = u32::from_be_bytes(r.value[..4].try_into().expect("invariant: 4 bytes"));
                    let position = LogPosition(e.position.get() - u64::from(size));
                    live.insert(topic.clone(), position);
                    Some(IndexEntry { position, size, timestamp: r.timestamp })
                }
                // Absolute (written by a dump): position and size.
                12 => {
                    let position =
                        LogPosition(u64::from_be_bytes(r.value[..8].try_into().expect("invariant: 8 bytes")));
                    if live.get(&topic).is_some_and(|&at| at > position) {
                        return;
                    }
                    Some(IndexEntry {
                        position,
                        size: u32::from_be_bytes(r.value[8..].try_into().expect("invariant: 4 bytes")),
                        timestamp: r.timestamp,
                    })
                }
                _ => return,
            };
            store.set(&topic, entry);
        })?;
        if skipped > 1 {
            tracing::warn!(pointers = skipped, "retained pointers deeper than mqtt.max_topic_levels skipped");
        }
        Ok((store, replayed))
    }

    /// Absolute pointers for every retained message: a full dump of the store.
    pub fn dump(&self) -> Vec<Record> {
        let mut out = Vec::with_capacity(self.len);
        dump_node(&self.root, &mut out);
        out
    }
}

/// Every retained message below `root`, as dump records. Walks with an explicit stack (like
/// everything here that follows topic levels: a client chooses how deep they go).
fn dump_node(root: &Node, out: &mut Vec<Record>) {
    let mut path: Vec<&str> = Vec::new();
    // (node, its depth, its level name)
    let mut stack: Vec<(&Node, usize, &str)> = vec![(root, 0, "")];
    while let Some((node, depth, name)) = stack.pop() {
        if depth > 0 {
            path.truncate(depth - 1);
            path.push(name);
        }
        if let Some(e) = node.entry {
            let mut value = Vec::with_capacity(12);
            value.extend_from_slice(&e.position.get().to_be_bytes());
            value.extend_from_slice(&e.size.to_be_bytes());
            out.push(Record {
                timestamp: e.timestamp,
                stream: RETAINED_STREAM.into(),
                partition: Partition(0),
                key: Some(Bytes::from(path.join("/"))),
                value: Bytes::from(value),
                ..Record::default()
            });
        }
        stack.extend(node.children.iter().map(|(n, c)| (c, depth + 1, n.as_str())));
    }
}

/// Clears the entry at `levels` and prunes the nodes left empty. Returns whether it was set.
fn remove(root: &mut Node, levels: &[&str]) -> bool {
    // The deepest node that stays whatever happens below it (see `TopicTrie::remove`).
    let mut keep = 0;
    let mut node = &mut *root;
    for (depth, level) in levels.iter().enumerate() {
        if node.entry.is_some() || node.children.len() > 1 {
            keep = depth;
        }
        match node.children.get_mut(*level) {
            Some(child) => node = child,
            None => return false,
        }
    }
    if node.entry.take().is_none() {
        return false;
    }
    if !node.is_empty() || levels.is_empty() {
        return true;
    }
    let mut node = root;
    for level in &levels[..keep] {
        node = node.children.get_mut(*level).expect("invariant: the path was just walked");
    }
    node.children.remove(levels[keep]);
    true
}

/// Every entry at or below `node`.
fn collect_all<'a>(node: &'a Node, out: &mut Vec<IndexEntry>) {
    let mut stack: Vec<&'a Node> = vec![node];
    while let Some(n) = stack.pop() {
        out.extend(n.entry);
        stack.extend(n.children.values());
    }
}

/// The entries whose topics match the filter `levels`.
fn walk(root: &Node, levels: &[&str], out: &mut Vec<IndexEntry>) {
    // Wildcards at the first level never match `$` topics.
    let visible = |depth: usize, name: &str| !(depth == 0 && name.starts_with('$'));
    // (node, depth in the filter)
    let mut stack: Vec<(&Node, usize)> = vec![(root, 0)];
    while let Some((node, depth)) = stack.pop() {
        let Some(level) = levels.get(depth) else {
            out.extend(node.entry);
            continue;
        };
        match *level {
            "#" => {
                if depth > 0 {
                    out.extend(node.entry); // `a/#` matches `a`
                }
                for (name, c) in &node.children {
                    if visible(depth, name) {
                        collect_all(c, out);
                    }
                }
            }
            "+" => stack.extend(node.children.iter().filter(|(n, _)| visible(depth, n)).map(|(_, c)| (c, depth + 1))),
            l => stack.extend(node.children.get(l).map(|c| (c, depth + 1))),
        }
    }
}

/// The retained messages `entries` point at, oldest first: from the tail cache when it holds
/// them; otherwise the reads (segment files, the object store) go to the blocking pool, off
/// the caller's runtime thread. Messages gone (expired) or unreadable are left out.
pub(crate) async fn read_messages(storage: &Arc<Storage>, entries: Vec<IndexEntry>) -> Vec<Message> {
    let cached: Vec<Option<silt_storage::Result<Record>>> =
        entries.iter().map(|e| storage.read_record_cached(e)).collect();
    let records: Vec<silt_storage::Result<Record>> = if cached.iter().all(Option::is_some) {
        cached.into_iter().flatten().collect()
    } else {
        let storage = Arc::clone(storage);
        let read = tokio::task::spawn_blocking(move || {
            entries.iter().zip(cached).map(|(e, c)| c.unwrap_or_else(|| storage.read_record(e))).collect()
        });
        match read.await {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "reading retained messages failed");
                return Vec::new();
            }
        }
    };
    records
        .into_iter()
        .filter_map(|r| match r {
            Ok(r) => {
                // A copied-forward message carries its topic only in the key.
                let key = r.key.clone().filter(|_| r.topic.is_empty());
                let mut m = Message::from_record(r);
                if let Some(k) = key {
                    m.topic = String::from_utf8_lossy(&k).into_owned();
                }
                Some(m)
            }
            Err(err) if err.kind() == silt_storage::ErrorKind::Expired => None, // gone: no longer retained
            Err(err) => {
                tracing::warn!(error = %err, "retained message unreadable");
                None
            }
        })
        .collect()
}

/// The broker's retained store as the append path sees it.
pub(crate) struct RetainedHandle(pub(crate) Arc<RwLock<RetainedStore>>, pub(crate) Arc<RetainedInFlight>);

impl RetainedIndex for RetainedHandle {
    fn pointer(&self, message: &Record, now: Timestamp) -> Record {
        RetainedStore::pointer(message, now)
    }

    fn set(&self, topic: &str, entry: Option<IndexEntry>) {
        self.0.write().expect("invariant: lock not poisoned").set(topic, entry);
    }

    fn begin(&self) -> u64 {
        let mut s = self.1.state.lock().expect("invariant: lock not poisoned");
        s.0 += 1;
        let ticket = s.0;
        s.1.insert(ticket);
        ticket
    }

    fn end(&self, ticket: u64) {
        self.1.state.lock().expect("invariant: lock not poisoned").1.remove(&ticket);
        self.1.ended.notify_waiters();
    }
}

/// Batches with retained messages handed to the log whose messages are not in the retained
/// index yet: it is set when a batch is acknowledged, by the task that submitted it, so a
/// message can be in the log (and past the point a new subscription's queue starts at) a
/// while before the index names it. A new subscription's lookup waits for the batches begun
/// before it ([`Broker::retained_for`](crate::broker::Broker::retained_for)); without that, a retained message published as the
/// subscription was made reached it neither live nor retained.
#[derive(Default)]
pub(crate) struct RetainedInFlight {
    /// The last ticket given, and the tickets not ended.
    state: Mutex<(u64, std::collections::BTreeSet<u64>)>,
    ended: tokio::sync::Notify,
}

/// How long a retained lookup waits for batches in flight (an fsync that stalls on a bad disk
/// must not hold every new subscription's retained messages back for longer).
pub(crate) const RETAINED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl RetainedInFlight {
    /// Waits until every batch begun by now has ended (at most [`RETAINED_WAIT`]).
    pub(crate) async fn settled(&self) {
        let wait = async {
            let target = self.state.lock().expect("invariant: lock not poisoned").0;
            loop {
                let ended = self.ended.notified();
                let mut ended = std::pin::pin!(ended);
                ended.as_mut().enable();
                let oldest = self.state.lock().expect("invariant: lock not poisoned").1.first().copied();
                if oldest.is_none_or(|t| t > target) {
                    return;
                }
                ended.await;
            }
        };
        if tokio::time::timeout(RETAINED_WAIT, wait).await.is_err() {
            tracing::warn!(
                "retained messages published before a subscription were not acknowledged within 5 s; looked up without them"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use silt_types::filter_matches;

    fn e(p: u64) -> IndexEntry {
        IndexEntry { position: LogPosition(p), size: 1, timestamp: Timestamp(0) }
    }

    #[test]
    fn matching_agrees_with_the_spec_matcher() {
        let topics = ["a", "a/b", "a/b/c", "a//c", "/a", "$SYS/x", "b/b", "a/c"];
        let mut s = RetainedStore::default();
        for (i, t) in topics.iter().enumerate() {
            s.set(t, Some(e(i as u64)));
        }
        for f in ["#", "+", "a/#", "a/+", "+/b", "+/+/c", "$SYS/#", "+/x", "a/b/c/#", "/+", "a//+"] {
            let filter = TopicFilter::new(f).unwrap();
            let got: Vec<u64> = s.matching(&filter).iter().map(|e| e.position.get()).collect();
            let want: Vec<u64> =
                topics.iter().enumerate().filter(|(_, t)| filter_matches(f, t)).map(|(i, _)| i as u64).collect();
            assert_eq!(got, want, "filter {f}");
        }
    }

    /// 32,768 levels (a 65,535-byte topic) on a small stack: nothing here recurses per level.
    #[test]
    fn the_deepest_possible_topic_is_stored_matched_dumped_and_cleared_without_recursion() {
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(|| {
                let deep = vec!["x"; silt_types::topic::MAX_TOPIC_LEVELS].join("/");
                let mut s = RetainedStore::default();
                s.set(&deep, Some(e(1)));
                s.set("x/y", Some(e(2)));
                let all = |f: &str| s.matching(&TopicFilter::new(f).unwrap()).len();
                assert_eq!(all("#"), 2);
                assert_eq!(all("x/#"), 2);
                assert_eq!(all("+/+"), 1, "x/y only");
                assert_eq!(s.get(&deep), Some(e(1)));
                assert_eq!(s.dump().len(), 2);
                s.set(&deep, None);
                assert_eq!(s.len(), 1);
                assert_eq!(s.root.children["x"].children.len(), 1, "the deep chain was pruned");
                let mut t = RetainedStore::default();
                t.set(&deep, Some(e(3)));
                drop(t);
            })
            .unwrap()
            .join()
            .expect("no stack overflow");
    }

    #[test]
    fn clearing_removes_and_prunes() {
        let mut s = RetainedStore::default();
        s.set("a/b", Some(e(1)));
        s.set("a/b", Some(e(2)));
        assert_eq!(s.len(), 1);
        s.set("a/b", None);
        assert!(s.is_empty() && s.root.children.is_empty());
    }

    /// A dump is a snapshot written after it was taken: a publish or a clear applied in
    /// between lands in the log before the dump's stale pointer, and must still win.
    #[test]
    fn a_dump_never_undoes_a_newer_live_pointer() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(dir.path(), silt_storage::StorageConfig::default()).unwrap();
        let message = |topic: &str, v: &'static str| Record {
            timestamp: Timestamp::now(),
            stream: "t".into(),
            topic: topic.into(),
            value: Bytes::from_static(v.as_bytes()),
            ..Record::default()
        };
        let publish = |m: Record| {
            let pointer = RetainedStore::pointer(&m, Timestamp::now());
            let at = storage.append_blocking(&[m.clone(), pointer]).unwrap();
            IndexEntry { position: at.positions[0], size: m.encoded_len() as u32, timestamp: m.timestamp }
        };
        let mut store = RetainedStore::default();
        for (topic, v) in [("t/a", "old"), ("t/c", "cleared"), ("t/k", "kept")] {
            store.set(topic, Some(publish(message(topic, v))));
        }
        let start = silt_dataset::internal::stream_end(&storage, RETAINED_STREAM).unwrap();
        let dump = store.dump();
        // Applied after the snapshot, written before the dump.
        let newer = publish(message("t/a", "new"));
        publish(message("t/c", ""));
        storage.append_blocking(&dump).unwrap();
        storage.append_blocking(&[silt_dataset::internal::checkpoint_record(RETAINED_STREAM, start)]).unwrap();
        // As at start-up (`Broker::new`): the index holds everything written before the load.
        storage.wait_dispatched_blocking(storage.stats().log_end).unwrap();

        let (loaded, _) = RetainedStore::load(&storage, 128).unwrap();
        assert_eq!(loaded.get("t/a"), Some(newer));
        assert_eq!(loaded.get("t/c"), None);
        assert_eq!(loaded.get("t/k"), store.get("t/k"));
    }

    #[test]
    fn sys_figures_are_listed_and_cleared_apart_from_every_other_retained_message() {
        let now = Timestamp::now();
        let e = |p: u64| IndexEntry { position: LogPosition(p), size: 1, timestamp: now };
        let mut store = RetainedStore::default();
        for (i, t) in ["$SYS/broker/version", "$SYS/broker/sessions/c/backlog", "$SYS", "a/b", "$share-like/x"]
            .into_iter()
            .enumerate()
        {
            store.set(t, Some(e(i as u64)));
        }
        let mut below = store.entries_below("$SYS");
        below.sort_by_key(|(_, e)| e.position);
        assert_eq!(
            below,
            [("$SYS/broker/version".to_owned(), e(0)), ("$SYS/broker/sessions/c/backlog".to_owned(), e(1))]
        );
        assert_eq!(store.clear_below("$SYS"), 2);
        assert_eq!(store.len(), 3);
        assert_eq!(store.get("$SYS/broker/version"), None);
        assert_eq!((store.get("$SYS"), store.get("a/b")), (Some(e(2)), Some(e(3))));
        assert_eq!(store.clear_below("$SYS"), 0);
        assert_eq!(store.dump().len(), 3);
    }
}
