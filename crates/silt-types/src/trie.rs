//! A trie of topic filters, one node per level, so finding the filters that match a topic costs
//! time in the topic's depth and the number of matches, not in the number of filters held.
//!
//! Each node keeps the values of the filters that end there, the values of the filter that is
//! its `/#` child, and its children by literal level and `+`. Matching follows the spec (see
//! [`crate::topic`]): `#` matches the parent level too, and a wildcard in the first level never
//! matches a `$` topic. A property test checks it against [`crate::filter_matches`].

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::topic::TopicFilter;

#[derive(Debug)]
///
/// Its lists are boxed slices of exactly their length (16 bytes each, nothing allocated when
/// empty), not `Vec`s: a node is 48 bytes, so a boxed node and a short list's entry (a key and
/// a node, 64 bytes) each fill an allocator size class instead of spilling into the next (72
/// and 88 bytes with `Vec`s, in the 80- and 96-byte classes). Per-device filters add two nodes
/// each to the dispatcher's trie. A list changes only when a filter is added or removed, and
/// is reallocated then.
struct Node<V> {
    /// Values of filters ending at this node.
    values: Box<[V]>,
    /// Values of the filter `<this node>/#`.
    hash: Box<[V]>,
    /// Children by level; `+` is stored under the key `"+"`.
    children: Children<V>,
}

impl<V> Default for Node<V> {
    fn default() -> Self {
        Self { values: Box::default(), hash: Box::default(), children: Children::default() }
    }
}

impl<V> Drop for Node<V> {
    /// Without this, dropping a chain of 10,000 nested nodes would recurse 10,000 deep.
    fn drop(&mut self) {
        let mut doomed: Vec<Node<V>> = std::mem::take(&mut self.children).into_nodes();
        while let Some(mut n) = doomed.pop() {
            doomed.extend(std::mem::take(&mut n.children).into_nodes());
        }
    }
}

/// Most children per node kept in a list scanned in place; beyond, a hash map.
const FEW: usize = 8;

/// A node's children. Most nodes have one or a few (in a tree of per-device filters such as
/// `site/devices/{id}/cmd/#`, every level below the device's has one): a short list costs
/// exactly its entries and a scan of a few keys, where a hash map would allocate room for
/// several entries and hash every level looked up. A node with many children (the device
/// level) gets the hash map, boxed, with its nodes boxed: a slot of the map is then a key and a
/// pointer (24 bytes) instead of a key and a whole node (112 bytes before the box made nodes 72),
/// and its unused slots (up to half of them after a growth) cost as little. With per-device
/// filters that is about a hundred bytes less per filter held in the dispatcher's trie.
#[derive(Debug)]
enum Children<V> {
    Few(Box<[(Box<str>, Node<V>)]>),
    #[allow(clippy::box_collection, reason = "keeps every node's `Children` at the size of the `Few` list")]
    Many(Box<HashMap<Box<str>, Box<Node<V>>>>),
}

impl<V> Default for Children<V> {
    fn default() -> Self {
        Self::Few(Box::default())
    }
}

impl<V> Children<V> {
    fn len(&self) -> usize {
        match self {
            Self::Few(v) => v.len(),
            Self::Many(m) => m.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get_key_value(&self, level: &str) -> Option<(&str, &Node<V>)> {
        match self {
            Self::Few(v) => v.iter().find(|(k, _)| &**k == level).map(|(k, n)| (&**k, n)),
            Self::Many(m) => m.get_key_value(level).map(|(k, n)| (&**k, &**n)),
        }
    }

    fn get(&self, level: &str) -> Option<&Node<V>> {
        self.get_key_value(level).map(|(_, n)| n)
    }

    fn get_mut(&mut self, level: &str) -> Option<&mut Node<V>> {
        match self {
            Self::Few(v) => v.iter_mut().find(|(k, _)| &**k == level).map(|(_, n)| n),
            Self::Many(m) => m.get_mut(level).map(|n| &mut **n),
        }
    }

    /// The child under `level`, added empty if missing.
    fn get_or_insert(&mut self, level: &str) -> &mut Node<V> {
        if let Self::Few(v) = self
            && v.len() == FEW
            && !v.iter().any(|(k, _)| &**k == level)
        {
            *self =
                Self::Many(Box::new(std::mem::take(v).into_vec().into_iter().map(|(k, n)| (k, Box::new(n))).collect()));
        }
        match self {
            Self::Few(v) => {
                let i = match v.iter().position(|(k, _)| &**k == level) {
                    Some(i) => i,
                    None => {
                        // Exactly one more: a list of one child costs one entry, not four.
                        push_exact(v, (level.into(), Node::default()));
                        v.len() - 1
                    }
                };
                &mut v[i].1
            }
            Self::Many(m) => m.entry(level.into()).or_default(),
        }
    }

    fn remove(&mut self, level: &str) -> Option<Node<V>> {
        match self {
            Self::Few(v) => {
                let i = v.iter().position(|(k, _)| &**k == level)?;
                let mut list = std::mem::take(v).into_vec();
                let (_, node) = list.swap_remove(i);
                *v = list.into_boxed_slice();
                Some(node)
            }
            Self::Many(m) => m.remove(level).map(|n| *n),
        }
    }

    fn into_nodes(self) -> Vec<Node<V>> {
        match self {
            Self::Few(v) => v.into_vec().into_iter().map(|(_, n)| n).collect(),
            Self::Many(m) => m.into_values().map(|n| *n).collect(),
        }
    }
}

impl<V> Node<V> {
    fn is_empty(&self) -> bool {
        self.values.is_empty() && self.hash.is_empty() && self.children.is_empty()
    }
}

/// Topic filters with one or more values each (a value is typically a subscriber or a queue).
#[derive(Debug)]
pub struct TopicTrie<V> {
    root: Node<V>,
    len: usize,
}

impl<V> Default for TopicTrie<V> {
    fn default() -> Self {
        Self { root: Node::default(), len: 0 }
    }
}

impl<V: PartialEq> TopicTrie<V> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of (filter, value) pairs held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `value` under `filter`. Returns false (and changes nothing) when that exact pair is
    /// already present.
    pub fn insert(&mut self, filter: &TopicFilter, value: V) -> bool {
        let mut node = &mut self.root;
        let mut levels = filter.levels().peekable();
        while let Some(level) = levels.next() {
            if level == "#" {
                // The validator guarantees '#' is last.
                return push_unique(&mut node.hash, value, &mut self.len);
            }
            node = node.children.get_or_insert(level);
            if levels.peek().is_none() {
                return push_unique(&mut node.values, value, &mut self.len);
            }
        }
        unreachable!("invariant: a valid filter has at least one level")
    }

    /// The values held under exactly `filter`.
    pub fn get(&self, filter: &TopicFilter) -> &[V] {
        let mut node = &self.root;
        let mut levels = filter.levels().peekable();
        while let Some(level) = levels.next() {
            if level == "#" {
                return &node.hash;
            }
            match node.children.get(level) {
                Some(child) => node = child,
                None => return &[],
            }
            if levels.peek().is_none() {
                return &node.values;
            }
        }
        &[]
    }

    /// Removes the pair (`filter`, `value`). Returns whether it was present. Nodes left
    /// empty are pruned.
    pub fn remove(&mut self, filter: &TopicFilter, value: &V) -> bool {
        let levels: Vec<&str> = filter.levels().collect();
        // The node holding the value sits at depth `last`: a trailing `#` lives in its parent.
        let (last, in_hash) = match levels.last() {
            Some(&"#") => (levels.len() - 1, true),
            _ => (levels.len(), false),
        };
        // Descend, noting the deepest node that stays whatever happens below it: below that
        // one, the path is a chain of nodes that hold nothing but the next node of the path.
        let mut keep = 0;
        let mut node = &mut self.root;
        for (depth, level) in levels[..last].iter().enumerate() {
            if !node.values.is_empty() || !node.hash.is_empty() || node.children.len() > 1 {
                keep = depth;
            }
            match node.children.get_mut(level) {
                Some(child) => node = child,
                None => return false,
            }
        }
        let vals = if in_hash { &mut node.hash } else { &mut node.values };
        if !remove_value(vals, value) {
            return false;
        }
        self.len -= 1;
        if last == 0 || !node.is_empty() {
            return true;
        }
        let mut node = &mut self.root;
        for level in &levels[..keep] {
            node = node.children.get_mut(level).expect("invariant: the path was just walked");
        }
        // Drops the chain that held only this pair (`Node`'s drop is iterative).
        node.children.remove(levels[keep]);
        true
    }

    /// Calls `f` with every value whose filter matches the topic `name` (a valid topic name).
    /// A value held under several matching filters is reported once per filter.
    pub fn for_each_match<'a>(&'a self, name: &str, mut f: impl FnMut(&str, &'a V)) {
        walk(&self.root, name, &mut f);
    }

    /// Collects the matches of [`Self::for_each_match`] as `(filter, value)` pairs.
    pub fn matches(&self, name: &str) -> Vec<(String, &V)> {
        let mut out = Vec::new();
        walk(&self.root, name, &mut |filter, v| out.push((filter.to_owned(), v)));
        out
    }
}

/// Appends to a boxed slice, reallocated to exactly its new length.
fn push_exact<T>(list: &mut Box<[T]>, item: T) {
    let mut v = std::mem::take(list).into_vec();
    v.reserve_exact(1);
    v.push(item);
    *list = v.into_boxed_slice();
}

fn push_unique<V: PartialEq>(vals: &mut Box<[V]>, value: V, len: &mut usize) -> bool {
    if vals.contains(&value) {
        return false;
    }
    push_exact(vals, value);
    *len += 1;
    true
}

fn remove_value<V: PartialEq>(vals: &mut Box<[V]>, value: &V) -> bool {
    match vals.iter().position(|v| v == value) {
        Some(i) => {
            let mut v = std::mem::take(vals).into_vec();
            v.swap_remove(i);
            *vals = v.into_boxed_slice();
            true
        }
        None => false,
    }
}

/// A node to visit: the node, its depth, the length of its parent's path, its level key, and
/// the topic's levels below it (`None` past the last).
type Visit<'a, 'n, V> = (&'a Node<V>, usize, usize, &'a str, Option<&'n str>);

/// Depth-first walk with an explicit stack: a topic has up to 32,768 levels, and a client
/// chooses them, so the depth must never be the call stack's. `path` holds the filter text of
/// the node being visited, so callers can tell which filter matched.
fn walk<'a, V>(root: &'a Node<V>, name: &str, f: &mut dyn FnMut(&str, &'a V)) {
    let dollar = name.starts_with('$');
    let mut path = String::with_capacity(name.len() + 2);
    // On the stack for the depths topics have: one walk per dispatched record per trie, so
    // no allocation but the path's.
    let mut stack: SmallVec<[Visit<'a, '_, V>; 16]> = SmallVec::new();
    stack.push((root, 0, 0, "", Some(name)));
    while let Some((node, depth, parent_len, key, rest)) = stack.pop() {
        // Every node visited since this one was pushed lies below its parent, so the buffer
        // still starts with the parent's path.
        path.truncate(parent_len);
        if depth > 1 {
            path.push('/');
        }
        path.push_str(key);
        // `#` at this node matches the remaining levels, including none (the parent itself) —
        // except at the root of a `$` topic.
        let wildcard_allowed = depth > 0 || !dollar;
        if wildcard_allowed && !node.hash.is_empty() {
            let len = path.len();
            path.push_str(if depth == 0 { "#" } else { "/#" });
            for v in &node.hash {
                f(&path, v);
            }
            path.truncate(len);
        }
        let Some(rest) = rest else {
            for v in &node.values {
                f(&path, v);
            }
            continue;
        };
        let (level, below) = match rest.split_once('/') {
            Some((level, below)) => (level, Some(below)),
            None => (rest, None),
        };
        let here = path.len();
        // Pushed in reverse of the visiting order: the literal child first, then `+`.
        if level != "+"
            && wildcard_allowed
            && let Some((k, child)) = node.children.get_key_value("+")
        {
            stack.push((child, depth + 1, here, k, below));
        }
        if let Some((k, child)) = node.children.get_key_value(level) {
            stack.push((child, depth + 1, here, k, below));
        }
    }
}

#[cfg(test)]
mod tests;
