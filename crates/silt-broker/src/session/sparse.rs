//! A collection every session has but few use, kept out of line and only while it holds
//! something: 8 bytes in the session instead of the collection's 24. Two of them (inbound
//! QoS 2 ids, shared memberships) keep a session with its lock and count in 224 bytes, a
//! jemalloc size class, where it was 256: 32 bytes on every connection.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;

use super::SharedMembership;

/// Reads see the collection (an empty one when there is none); changes go through
/// [`Sparse::modify`], which frees it when they leave it empty.
#[derive(Debug, Default)]
pub struct Sparse<T>(Option<Box<T>>);

/// A collection with a shared empty instance to read when there is none.
pub trait Collection: Default + 'static {
    fn empty() -> &'static Self;
    fn is_empty(&self) -> bool;
}

impl Collection for BTreeSet<u16> {
    fn empty() -> &'static Self {
        static EMPTY: BTreeSet<u16> = BTreeSet::new();
        &EMPTY
    }
    fn is_empty(&self) -> bool {
        BTreeSet::is_empty(self)
    }
}

impl Collection for BTreeMap<String, SharedMembership> {
    fn empty() -> &'static Self {
        static EMPTY: BTreeMap<String, SharedMembership> = BTreeMap::new();
        &EMPTY
    }
    fn is_empty(&self) -> bool {
        BTreeMap::is_empty(self)
    }
}

impl<T: Collection> Sparse<T> {
    /// Applies `f` to the collection, and frees it if `f` left it empty. Without one, `f`
    /// gets an empty collection, boxed only if `f` fills it (a removal allocates nothing).
    pub fn modify<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> R {
        match &mut self.0 {
            Some(c) => {
                let r = f(c);
                if c.is_empty() {
                    self.0 = None;
                }
                r
            }
            None => {
                let mut c = T::default();
                let r = f(&mut c);
                if !c.is_empty() {
                    self.0 = Some(Box::new(c));
                }
                r
            }
        }
    }

    /// The collection, leaving none.
    pub fn take(&mut self) -> T {
        self.0.take().map(|b| *b).unwrap_or_default()
    }
}

impl<T: Collection> Deref for Sparse<T> {
    type Target = T;
    fn deref(&self) -> &T {
        match &self.0 {
            Some(c) => c,
            None => T::empty(),
        }
    }
}

impl<T: Collection + FromIterator<A>, A> FromIterator<A> for Sparse<T> {
    fn from_iter<I: IntoIterator<Item = A>>(iter: I) -> Self {
        let mut s = Self::default();
        s.modify(|c| *c = iter.into_iter().collect());
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collection_is_held_only_while_it_holds_something() {
        let mut ids: Sparse<BTreeSet<u16>> = Sparse::default();
        assert!(ids.0.is_none() && ids.is_empty() && !ids.contains(&1));
        assert!(ids.modify(|s| s.insert(1)));
        assert!(ids.modify(|s| s.insert(2)));
        assert!(ids.contains(&1) && ids.len() == 2);
        assert!(ids.modify(|s| s.remove(&1)));
        assert!(ids.0.is_some(), "2 is still held");
        assert!(!ids.modify(|s| s.remove(&7)), "nothing to remove");
        assert!(ids.modify(|s| s.remove(&2)));
        assert!(ids.0.is_none(), "freed once empty");
        let collected: Sparse<BTreeSet<u16>> = [3, 4].into_iter().collect();
        assert_eq!(collected.iter().copied().collect::<Vec<_>>(), [3, 4]);
        let none: Sparse<BTreeSet<u16>> = std::iter::empty().collect();
        assert!(none.0.is_none());
    }
}
