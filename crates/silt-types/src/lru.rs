//! Bounded LRU caches whose tables grow with what they hold.

use std::hash::Hash;
use std::num::NonZeroUsize;

/// An LRU cache of at most `cap` entries whose hash table grows by doubling. `lru`'s
/// `LruCache::new` allocates the table for all `cap` entries at once, and its pages become
/// resident one by one as entries hash into them: a few thousand entries made nearly all of a
/// 100,000-entry table resident (2 MB for the first 5,000 subscriptions' filter queues).
pub fn growing<K: Hash + Eq, V>(cap: NonZeroUsize) -> ::lru::LruCache<K, V> {
    let mut c = ::lru::LruCache::unbounded();
    c.resize(cap);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_growing_cache_keeps_its_bound_and_evicts_the_least_recent() {
        let mut c = growing::<u32, u32>(NonZeroUsize::new(3).unwrap());
        for i in 0..3 {
            assert!(c.push(i, i).is_none());
        }
        c.get(&0);
        assert_eq!(c.push(3, 3), Some((1, 1)), "the least recently used goes");
        assert_eq!(c.len(), 3);
        assert_eq!(c.cap().get(), 3);
    }
}
