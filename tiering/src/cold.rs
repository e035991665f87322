//! Cold reads: log bytes whose segment was evicted from the local disk, read from the segment
//! object with ranged GETs through a block cache (moka) with read-ahead.
//!
//! The storage engine's read path is synchronous; a read here hands the GET to the tiering
//! runtime and waits for it. On a broker runtime thread the wait goes through
//! `block_in_place`, so other connections keep running while one waits on the store.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use bytes::{Bytes, BytesMut};
use moka::sync::Cache;
use object_store::ObjectStore;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use silt_storage::{ColdReader, Error};
use silt_types::LogPosition;

use crate::store::retry;

/// A segment object: where its positions live.
#[derive(Clone, Debug)]
pub struct ObjectRef {
    pub base: u64,
    pub end: u64,
    pub key: String,
}

#[derive(Default)]
pub struct ColdStats {
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

pub struct ColdStore {
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Handle,
    objects: RwLock<BTreeMap<u64, ObjectRef>>,
    cache: Cache<(u64, u64), Bytes>,
    block: u64,
    read_ahead: u64,
    pub stats: Arc<ColdStats>,
}

impl ColdStore {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        rt: tokio::runtime::Handle,
        cache_bytes: u64,
        block: u64,
        read_ahead: u64,
        stats: Arc<ColdStats>,
    ) -> Self {
        let cache = Cache::builder()
            .weigher(|_: &(u64, u64), v: &Bytes| u32::try_from(v.len()).unwrap_or(u32::MAX))
            .max_capacity(cache_bytes)
            .support_invalidation_closures()
            .build();
        Self { store, rt, objects: RwLock::new(BTreeMap::new()), cache, block, read_ahead, stats }
    }

    pub fn add(&self, o: ObjectRef) {
        self.objects.write().expect("invariant: lock not poisoned").insert(o.base, o);
    }

    /// Forgets objects wholly below `pos` (deleted by retention).
    pub fn remove_below(&self, pos: u64) {
        let mut objects = self.objects.write().expect("invariant: lock not poisoned");
        let doomed: Vec<u64> = objects.values().filter(|o| o.end <= pos).map(|o| o.base).collect();
        for b in doomed {
            objects.remove(&b);
            if let Err(e) = self.cache.invalidate_entries_if(move |k, _| k.0 == b) {
                tracing::debug!(error = %e, "block cache invalidation failed; entries age out");
            }
        }
    }

    fn object_for(&self, pos: u64) -> Option<ObjectRef> {
        let objects = self.objects.read().expect("invariant: lock not poisoned");
        objects.range(..=pos).next_back().map(|(_, o)| o.clone()).filter(|o| pos < o.end)
    }

    /// Fetches blocks `first..first+n` of an object (clamped to its data) with one GET.
    fn fetch(&self, o: &ObjectRef, first: u64, n: u64) -> Result<(), Error> {
        let len = o.end - o.base;
        let start = first * self.block;
        let stop = ((first + n) * self.block).min(len);
        let store = self.store.clone();
        let path = Path::from(o.key.as_str());
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.rt.spawn(async move {
            let r = retry("read segment object", || store.get_range(&path, start..stop)).await;
            let _ = tx.send(r);
        });
        let wait = || rx.recv().map_err(|_| Error::Remote("tiering runtime stopped".into()));
        let on_worker = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let got = if on_worker { tokio::task::block_in_place(wait)? } else { wait()? };
        let bytes = got.map_err(|e| Error::Remote(format!("{}: {e}", o.key)))?;
        self.stats.gets.fetch_add(1, Ordering::Relaxed);
        self.stats.get_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let mut at = 0usize;
        let mut b = first;
        while at < bytes.len() {
            let n = (self.block as usize).min(bytes.len() - at);
            self.cache.insert((o.base, b), bytes.slice(at..at + n));
            at += n;
            b += 1;
        }
        Ok(())
    }

    fn block(&self, o: &ObjectRef, b: u64) -> Result<Bytes, Error> {
        if let Some(v) = self.cache.get(&(o.base, b)) {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(v);
        }
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        self.fetch(o, b, self.read_ahead)?;
        // A block just fetched can be evicted at once only under extreme cache pressure.
        match self.cache.get(&(o.base, b)) {
            Some(v) => Ok(v),
            None => {
                self.fetch(o, b, 1)?;
                self.cache.get(&(o.base, b)).ok_or_else(|| Error::Remote("block cache too small".into()))
            }
        }
    }
}

impl ColdReader for ColdStore {
    fn read(&self, pos: LogPosition, len: usize) -> Result<Bytes, Error> {
        let p = pos.get();
        let o = self.object_for(p).ok_or(Error::NotFound(p))?;
        let end = p + len as u64;
        if end > o.end {
            return Err(Error::NotFound(p));
        }
        let (first, last) = ((p - o.base) / self.block, (end - 1 - o.base) / self.block);
        if first == last {
            let b = self.block(&o, first)?;
            let at = ((p - o.base) % self.block) as usize;
            return Ok(b.slice(at..at + len));
        }
        let mut out = BytesMut::with_capacity(len);
        for blk in first..=last {
            let b = self.block(&o, blk)?;
            let blk_start = o.base + blk * self.block;
            let from = p.max(blk_start) - blk_start;
            let to = end.min(blk_start + b.len() as u64) - blk_start;
            out.extend_from_slice(&b[from as usize..to as usize]);
        }
        Ok(out.freeze())
    }
}
