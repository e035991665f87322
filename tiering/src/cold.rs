//! Cold reads: log bytes whose segment was evicted from the local disk, read from the segment
//! object with ranged GETs through a block cache (moka) with read-ahead.
//!
//! Reads fetch whole windows of `read_ahead` blocks with one GET, and a read in window `w`
//! starts background GETs of windows `w + 1 ..= w + PREFETCH_WINDOWS`, so a sequential reader
//! (an offline session draining its backlog) finds the next bytes fetched while it consumes
//! these. Windows read ahead wait outside the cache until first read, and a reader that needs
//! one still in flight waits for that GET instead of issuing its own.
//!
//! The storage engine's read path is synchronous; a read here hands the GET to the tiering
//! runtime and waits for it. On a broker runtime thread the wait goes through
//! `block_in_place`, so other connections keep running while one waits on the store.
//!
//! Quarantined ranges named by the manifest (bytes lost locally before the upload) are never
//! read: a read touching one is `Error::Quarantined`, which readers skip as gone. For repairs
//! of a bad local copy, [`ColdReader::read_uploaded`] reads the uploaded bytes of positions
//! still on the local disk, from segment objects and tail objects, with one attempt (the
//! client's own short retries), so an outage defers the repair instead of stalling it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use bytes::{Bytes, BytesMut};
use moka::sync::Cache;
use object_store::ObjectStore;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use silt_storage::{ColdReader, Error};
use silt_types::LogPosition;

use crate::store::retry;

/// A segment or tail object: where its positions live.
#[derive(Clone, Debug, Default)]
pub struct ObjectRef {
    pub base: u64,
    pub end: u64,
    pub key: String,
    /// Quarantined log ranges `[start, end)` in it.
    pub gaps: Vec<(u64, u64)>,
}

#[derive(Default)]
pub struct ColdStats {
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

/// Windows fetched ahead of the one a read is in.
const PREFETCH_WINDOWS: u64 = 2;

/// Windows read ahead and not yet reached, by `(object base, window)`. Kept out of the block
/// cache until first read: an LRU would evict them first, since a reader keeps touching the
/// blocks it is in, and TinyLFU would refuse them. Bounded by `max_bytes`: past it, nothing
/// more is read ahead until readers catch up.
#[derive(Default)]
struct Ahead {
    inflight: HashSet<(u64, u64)>,
    landed: HashMap<(u64, u64), Bytes>,
    bytes: u64,
}

pub struct ColdStore {
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Handle,
    objects: RwLock<BTreeMap<u64, ObjectRef>>,
    /// Tail objects (pieces of the active segment), by base.
    tails: RwLock<BTreeMap<u64, ObjectRef>>,
    cache: Cache<(u64, u64), Bytes>,
    block: u64,
    read_ahead: u64,
    ahead: Arc<(Mutex<Ahead>, Condvar)>,
    /// Bytes read ahead and not yet reached, at most.
    ahead_max: u64,
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
        // LRU: a reader scanning a backlog touches each block a few times in a row, then never
        // again; TinyLFU's admission would favour old blocks over new ones.
        let cache = Cache::builder()
            .weigher(|_: &(u64, u64), v: &Bytes| u32::try_from(v.len()).unwrap_or(u32::MAX))
            .max_capacity(cache_bytes)
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .support_invalidation_closures()
            .build();
        Self {
            store,
            rt,
            objects: RwLock::new(BTreeMap::new()),
            tails: RwLock::new(BTreeMap::new()),
            cache,
            block,
            read_ahead: read_ahead.max(1),
            ahead: Arc::new((Mutex::new(Ahead::default()), Condvar::new())),
            ahead_max: cache_bytes / 2,
            stats,
        }
    }

    pub fn add(&self, o: ObjectRef) {
        self.objects.write().expect("invariant: lock not poisoned").insert(o.base, o);
    }

    /// A tail object the manifest now names.
    pub fn add_tail(&self, t: ObjectRef) {
        self.tails.write().expect("invariant: lock not poisoned").insert(t.base, t);
    }

    /// Forgets the tail objects below `end` (a segment object covers them now).
    pub fn remove_tails_below(&self, end: u64) {
        self.tails.write().expect("invariant: lock not poisoned").retain(|_, t| t.base >= end);
    }

    /// Forgets objects wholly below `pos` (deleted by retention).
    pub fn remove_below(&self, pos: u64) {
        let mut objects = self.objects.write().expect("invariant: lock not poisoned");
        let doomed: Vec<u64> = objects.values().filter(|o| o.end <= pos).map(|o| o.base).collect();
        let mut ahead = self.ahead.0.lock().expect("invariant: lock not poisoned");
        for b in doomed {
            objects.remove(&b);
            let gone: Vec<(u64, u64)> = ahead.landed.keys().filter(|k| k.0 == b).copied().collect();
            for k in gone {
                let len = ahead.landed.remove(&k).map_or(0, |v| v.len() as u64);
                ahead.bytes -= len;
            }
            if let Err(e) = self.cache.invalidate_entries_if(move |k, _| k.0 == b) {
                tracing::debug!(error = %e, "block cache invalidation failed; entries age out");
            }
        }
    }

    fn object_for(&self, pos: u64) -> Option<ObjectRef> {
        let objects = self.objects.read().expect("invariant: lock not poisoned");
        objects.range(..=pos).next_back().map(|(_, o)| o.clone()).filter(|o| pos < o.end)
    }

    /// The GET of blocks `first..first+n` of an object (clamped to its data), run on the
    /// tiering runtime.
    fn get(
        &self,
        o: &ObjectRef,
        first: u64,
        n: u64,
    ) -> impl std::future::Future<Output = Result<Bytes, Error>> + 'static {
        let len = o.end - o.base;
        let (start, stop) = (first * self.block, ((first + n) * self.block).min(len));
        let (store, stats) = (self.store.clone(), self.stats.clone());
        let (path, key) = (Path::from(o.key.as_str()), o.key.clone());
        async move {
            let bytes = retry("read segment object", || store.get_range(&path, start..stop))
                .await
                .map_err(|e| Error::Remote(format!("{key}: {e}")))?;
            stats.gets.fetch_add(1, Ordering::Relaxed);
            stats.get_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            Ok(bytes)
        }
    }

    /// Puts the bytes of blocks from `first` on into the cache.
    fn insert_blocks(&self, base: u64, first: u64, bytes: &Bytes) {
        let (mut at, mut b) = (0usize, first);
        while at < bytes.len() {
            let n = (self.block as usize).min(bytes.len() - at);
            self.cache.insert((base, b), bytes.slice(at..at + n));
            at += n;
            b += 1;
        }
    }

    /// Waits for `f` on the calling thread (through `block_in_place` on a runtime worker).
    fn wait<T>(f: impl FnOnce() -> T) -> T {
        let on_worker = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if on_worker { tokio::task::block_in_place(f) } else { f() }
    }

    /// Fetches blocks `first..first+n` with one GET, waits for it and caches them.
    fn fetch(&self, o: &ObjectRef, first: u64, n: u64) -> Result<(), Error> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let get = self.get(o, first, n);
        self.rt.spawn(async move {
            let _ = tx.send(get.await);
        });
        let bytes = Self::wait(|| rx.recv()).map_err(|_| Error::Remote("tiering runtime stopped".into()))??;
        self.insert_blocks(o.base, first, &bytes);
        Ok(())
    }

    /// Makes window `w` of an object cached: moves it in from the read-ahead buffer, waits
    /// for its read-ahead GET, or fetches it. Returns whether the caller waited for a GET.
    fn window(&self, o: &ObjectRef, w: u64) -> Result<bool, Error> {
        let key = (o.base, w);
        let (lock, landed) = &*self.ahead;
        let (ready, waited) = Self::wait(|| {
            let mut a = lock.lock().expect("invariant: lock not poisoned");
            let waited = a.inflight.contains(&key);
            a = landed.wait_while(a, |a| a.inflight.contains(&key)).expect("invariant: lock not poisoned");
            let ready = a.landed.remove(&key);
            if let Some(b) = &ready {
                a.bytes -= b.len() as u64;
            }
            (ready, waited)
        });
        match ready {
            Some(bytes) => {
                self.insert_blocks(o.base, w * self.read_ahead, &bytes);
                Ok(waited)
            }
            None => self.fetch(o, w * self.read_ahead, self.read_ahead).map(|()| true),
        }
    }

    /// Starts read-ahead GETs of the windows after `w` that are neither cached, read ahead
    /// nor in flight, while the read-ahead buffer has room.
    fn prefetch(&self, o: &ObjectRef, w: u64) {
        let windows = (o.end - o.base).div_ceil(self.block * self.read_ahead);
        for next in (w + 1..=w + PREFETCH_WINDOWS).take_while(|n| *n < windows) {
            let key = (o.base, next);
            if self.cache.contains_key(&(o.base, next * self.read_ahead)) {
                continue;
            }
            {
                let mut a = self.ahead.0.lock().expect("invariant: lock not poisoned");
                let room = a.bytes + a.inflight.len() as u64 * self.block * self.read_ahead < self.ahead_max;
                if !room || a.landed.contains_key(&key) || !a.inflight.insert(key) {
                    continue;
                }
            }
            let (get, ahead) = (self.get(o, next * self.read_ahead, self.read_ahead), self.ahead.clone());
            self.rt.spawn(async move {
                let got = get.await;
                let mut a = ahead.0.lock().expect("invariant: lock not poisoned");
                a.inflight.remove(&key);
                match got {
                    Ok(bytes) => {
                        a.bytes += bytes.len() as u64;
                        a.landed.insert(key, bytes);
                    }
                    Err(e) => tracing::debug!(error = %e, "read-ahead failed; the reader fetches it itself"),
                }
                ahead.1.notify_all();
            });
        }
    }

    fn block(&self, o: &ObjectRef, b: u64) -> Result<Bytes, Error> {
        let w = b / self.read_ahead;
        if let Some(v) = self.cache.get(&(o.base, b)) {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            // Once per window, as a reader enters it, not on every record read.
            if b.is_multiple_of(self.read_ahead) {
                self.prefetch(o, w);
            }
            return Ok(v);
        }
        // A hit if the read-ahead had it ready, a miss if this read waited for the store.
        let waited = self.window(o, w)?;
        let counter = if waited { &self.stats.misses } else { &self.stats.hits };
        counter.fetch_add(1, Ordering::Relaxed);
        self.prefetch(o, w);
        // A block just cached can be evicted at once only under extreme cache pressure: then
        // this block alone, once more.
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
        if o.gaps.iter().any(|&(s, e)| s < end && p < e) {
            return Err(Error::Quarantined(p));
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

    fn gap_at(&self, pos: LogPosition) -> Option<(LogPosition, LogPosition)> {
        let o = self.object_for(pos.get())?;
        o.gaps.iter().find(|&&(s, e)| s <= pos.get() && pos.get() < e).map(|&(s, e)| (LogPosition(s), LogPosition(e)))
    }

    fn read_uploaded(&self, pos: LogPosition, len: usize) -> Result<Option<Bytes>, Error> {
        let (p, end) = (pos.get(), pos.get() + len as u64);
        if let Some(o) = self.object_for(p) {
            if end > o.end {
                return Ok(None);
            }
            return self.get_once(&o.key, p - o.base..end - o.base, p).map(Some);
        }
        // Tails: consecutive pieces of the active segment; a batch may straddle two.
        let pieces: Vec<ObjectRef> = {
            let tails = self.tails.read().expect("invariant: lock not poisoned");
            let mut out = Vec::new();
            let mut at = p;
            for (_, t) in tails.range(..=p).next_back().into_iter().chain(tails.range(p + 1..)) {
                if at >= end {
                    break;
                }
                if t.base > at || t.end <= at {
                    return Ok(None); // not uploaded (or a hole between tails)
                }
                out.push(t.clone());
                at = t.end;
            }
            if at < end {
                return Ok(None);
            }
            out
        };
        let mut buf = BytesMut::with_capacity(len);
        for t in pieces {
            let (from, to) = (p.max(t.base), end.min(t.end));
            buf.extend_from_slice(&self.get_once(&t.key, from - t.base..to - t.base, from)?);
        }
        Ok(Some(buf.freeze()))
    }
}

impl ColdStore {
    /// One ranged GET (the client's own short retries only), waited for on the calling
    /// thread. A missing object is `NotFound`; anything else is `Remote` (retryable).
    fn get_once(&self, key: &str, range: std::ops::Range<u64>, pos: u64) -> Result<Bytes, Error> {
        let (store, path, want) = (self.store.clone(), Path::from(key), range.end - range.start);
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.rt.spawn(async move {
            let _ = tx.send(store.get_range(&path, range).await);
        });
        match Self::wait(|| rx.recv()).map_err(|_| Error::Remote("tiering runtime stopped".into()))? {
            Ok(b) if b.len() as u64 == want => {
                self.stats.gets.fetch_add(1, Ordering::Relaxed);
                Ok(b)
            }
            Ok(b) => Err(Error::Remote(format!("{key}: got {} bytes, expected {want}", b.len()))),
            Err(object_store::Error::NotFound { .. }) => Err(Error::NotFound(pos)),
            Err(e) => Err(Error::Remote(format!("{key}: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;

    /// A sequential reader costs one GET per window, fetched ahead of it, and never the same
    /// bytes twice, also when it reads more than the cache holds.
    #[test]
    fn a_sequential_reader_gets_each_window_once_and_ahead() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let data: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
        rt.block_on(store.put(&Path::from("o"), PutPayload::from(data.clone()))).unwrap();
        let stats = Arc::new(ColdStats::default());
        // An 8 MiB cache for 16 MiB: what was read ahead is still admitted.
        let cold = ColdStore::new(store, rt.handle().clone(), 8 << 20, 1 << 20, 2, stats.clone());
        cold.add(ObjectRef { base: 1000, end: 1000 + data.len() as u64, key: "o".into(), gaps: Vec::new() });
        let mut at = 0usize;
        while at < data.len() {
            let n = (16 << 10).min(data.len() - at);
            let got = cold.read(LogPosition(1000 + at as u64), n).unwrap();
            assert_eq!(&got[..], &data[at..at + n]);
            at += n;
        }
        // Read-aheads that were still in flight would be counted late.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(stats.gets.load(Ordering::Relaxed), 8, "16 MiB in 2 MiB windows");
        assert_eq!(stats.get_bytes.load(Ordering::Relaxed), 16 << 20);
    }
}
