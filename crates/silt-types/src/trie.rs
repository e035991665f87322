//! A trie of topic filters, one node per level, so finding the filters that match a topic costs
//! time in the topic's depth and the number of matches, not in the number of filters held.
//!
//! Each node keeps the values of the filters that end there, the values of the filter that is
//! its `/#` child, and its children by literal level and `+`. Matching follows the spec (see
//! [`crate::topic`]): `#` matches the parent level too, and a wildcard in the first level never
//! matches a `$` topic. A property test checks it against [`crate::filter_matches`].

use std::collections::HashMap;

use crate::topic::TopicFilter;

#[derive(Debug)]
struct Node<V> {
    /// Values of filters ending at this node.
    values: Vec<V>,
    /// Values of the filter `<this node>/#`.
    hash: Vec<V>,
    /// Children by level; `+` is stored under the key `"+"`.
    children: HashMap<Box<str>, Node<V>>,
}

impl<V> Default for Node<V> {
    fn default() -> Self {
        Self { values: Vec::new(), hash: Vec::new(), children: HashMap::new() }
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
            node = node.children.entry(level.into()).or_default();
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

    /// Removes the pair (`filter`, `value`). Returns whether it was present.
    pub fn remove(&mut self, filter: &TopicFilter, value: &V) -> bool {
        let levels: Vec<&str> = filter.levels().collect();
        let removed = remove_at(&mut self.root, &levels, value);
        if removed {
            self.len -= 1;
        }
        removed
    }

    /// Calls `f` with every value whose filter matches the topic `name` (a valid topic name).
    /// A value held under several matching filters is reported once per filter.
    pub fn for_each_match<'a>(&'a self, name: &str, mut f: impl FnMut(&str, &'a V)) {
        let levels: Vec<&str> = name.split('/').collect();
        let dollar = name.starts_with('$');
        walk(&self.root, &levels, 0, dollar, &mut String::new(), &mut |filter, v| f(filter, v));
    }

    /// Collects the matches of [`Self::for_each_match`] as `(filter, value)` pairs.
    pub fn matches(&self, name: &str) -> Vec<(String, &V)> {
        let mut out = Vec::new();
        let levels: Vec<&str> = name.split('/').collect();
        let dollar = name.starts_with('$');
        walk(&self.root, &levels, 0, dollar, &mut String::new(), &mut |filter, v| out.push((filter.to_owned(), v)));
        out
    }
}

fn push_unique<V: PartialEq>(vals: &mut Vec<V>, value: V, len: &mut usize) -> bool {
    if vals.contains(&value) {
        return false;
    }
    vals.push(value);
    *len += 1;
    true
}

fn remove_value<V: PartialEq>(vals: &mut Vec<V>, value: &V) -> bool {
    match vals.iter().position(|v| v == value) {
        Some(i) => {
            vals.swap_remove(i);
            true
        }
        None => false,
    }
}

fn remove_at<V: PartialEq>(node: &mut Node<V>, levels: &[&str], value: &V) -> bool {
    match levels {
        [] => unreachable!("invariant: a valid filter has at least one level"),
        ["#"] => remove_value(&mut node.hash, value),
        [level, rest @ ..] => {
            let Some(child) = node.children.get_mut(*level) else {
                return false;
            };
            let removed =
                if rest.is_empty() { remove_value(&mut child.values, value) } else { remove_at(child, rest, value) };
            if removed && child.is_empty() {
                node.children.remove(*level);
            }
            removed
        }
    }
}

/// Depth-first walk. `path` accumulates the filter text of the node being visited so callers can
/// tell which filter matched.
fn walk<'a, V>(
    node: &'a Node<V>,
    levels: &[&str],
    depth: usize,
    dollar: bool,
    path: &mut String,
    f: &mut dyn FnMut(&str, &'a V),
) {
    // `#` at this node matches the remaining levels, including none (the parent itself) —
    // except at the root of a `$` topic.
    let wildcard_allowed = depth > 0 || !dollar;
    if wildcard_allowed && !node.hash.is_empty() {
        let len = path.len();
        path.push_str(if depth == 0 { "#" } else { "/#" });
        for v in &node.hash {
            f(path, v);
        }
        path.truncate(len);
    }
    let Some((level, rest)) = levels.split_first() else {
        for v in &node.values {
            f(path, v);
        }
        return;
    };
    let mut visit = |key: &str, child: &'a Node<V>, path: &mut String| {
        let len = path.len();
        if depth > 0 {
            path.push('/');
        }
        path.push_str(key);
        walk(child, rest, depth + 1, dollar, path, f);
        path.truncate(len);
    };
    if let Some(child) = node.children.get(*level) {
        visit(level, child, path);
    }
    if *level != "+"
        && wildcard_allowed
        && let Some(child) = node.children.get("+")
    {
        visit("+", child, path);
    }
}

#[cfg(test)]
mod tests;
