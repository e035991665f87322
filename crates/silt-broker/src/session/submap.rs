//! A session's subscriptions by filter, in filter order, in a sorted vector.
//!
//! Most sessions hold one subscription or a few: a `BTreeMap` allocated a leaf with room for
//! eleven entries for the first (about 280 bytes per session), where the vector holds exactly
//! one (24 bytes), and the pull, which walks every subscription on each delivery, walks a slice.
//! A lookup is a binary search. An insert or a removal moves the entries after it, 24 bytes
//! each: less than the same change already costs, since the session's snapshot, which lists
//! every subscription with its filter, is written again once it changed, and a new filter is a
//! durable commitlog append (its filter queue's registration).

use std::sync::Arc;

use super::Subscription;

#[derive(Debug, Default)]
pub struct SubMap(Vec<(Arc<str>, Box<Subscription>)>);

impl SubMap {
    fn find(&self, filter: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| (**k).cmp(filter))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, filter: &str) -> Option<&Subscription> {
        self.find(filter).ok().map(|i| &*self.0[i].1)
    }

    pub fn get_mut(&mut self, filter: &str) -> Option<&mut Subscription> {
        self.find(filter).ok().map(|i| &mut *self.0[i].1)
    }

    pub fn contains_key(&self, filter: &str) -> bool {
        self.find(filter).is_ok()
    }

    /// Adds or replaces the subscription of `filter`; returns the one it replaced.
    pub fn insert(&mut self, filter: Arc<str>, sub: Box<Subscription>) -> Option<Box<Subscription>> {
        match self.find(&filter) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, sub)),
            Err(i) => {
                if self.0.is_empty() {
                    // Room for exactly one, not the four a first push makes.
                    self.0.reserve_exact(1);
                }
                self.0.insert(i, (filter, sub));
                None
            }
        }
    }

    pub fn remove(&mut self, filter: &str) -> Option<Box<Subscription>> {
        self.find(filter).ok().map(|i| self.0.remove(i).1)
    }

    pub fn keys(&self) -> impl Iterator<Item = &Arc<str>> {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn into_keys(self) -> impl Iterator<Item = Arc<str>> {
        self.0.into_iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &Subscription> {
        self.0.iter().map(|(_, s)| &**s)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Subscription> {
        self.0.iter_mut().map(|(_, s)| &mut **s)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Subscription)> {
        self.0.iter().map(|(k, s)| (k, &**s))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&Arc<str>, &mut Subscription)> {
        self.0.iter_mut().map(|(k, s)| (&*k, &mut **s))
    }
}

impl std::ops::Index<&str> for SubMap {
    type Output = Subscription;

    fn index(&self, filter: &str) -> &Subscription {
        self.get(filter).expect("invariant: indexed by a filter the session holds")
    }
}
