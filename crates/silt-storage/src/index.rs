//! The consume-queue index in RocksDB.
//!
//! Column families:
//! - `meta`: `dispatched` → the log position up to which every batch is indexed (u64 BE);
//!   `next_queue_id` → u64 BE.
//! - `registry`: encoded [`QueueName`] → queue id (u64 BE) ‖ since (u64 BE): the log position of
//!   the record that created the queue (filter queues index only records after it).
//! - `cq`: queue id (u64 BE) ‖ first offset (u64 BE) → a *block*: the entries of consecutive
//!   offsets from there, each position (u64 LE) ‖ size (u32 LE) ‖ timestamp (i64 LE), at most
//!   [`BLOCK_ENTRIES`] of them. Big-endian keys make a queue one contiguous, ordered range; a
//!   reader finds the block holding an offset with one seek back from it. The dispatcher
//!   writes one block per queue per round instead of one key per entry: a busy queue (a
//!   wildcard filter under fan-in, a stream partition) gets one memtable insert, one key to
//!   flush and compact, per round of up to [`BLOCK_ENTRIES`] records. An index written one
//!   entry per key (before blocks) is read as blocks of one.
//!
//! Everything here is derived from the commitlog, which is the write-ahead log: writes go with
//! RocksDB's WAL disabled, and `atomic_flush` keeps the checkpoint and the entries it covers
//! in step across column families. After a crash the index resumes from the last flushed
//! checkpoint; deleting the directory costs a rebuild, never data.
//!
//! A full disk: a flush that fails with ENOSPC puts RocksDB in a background-error state that
//! refuses writes. Its default `SstFileManager` resumes them by itself (checking every 5 s)
//! once the free space reaches the largest write buffer (`index_write_buffer_bytes`, 64 MiB
//! by default); until then the dispatcher's rounds fail and are retried. Not guaranteed: on a
//! disk that frees less than that, dispatch stays stopped until a restart. Neither rust-rocksdb
//! 0.25 nor RocksDB's C API exposes `DB::Resume()`, which could resume sooner.

use std::path::Path;

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, ReadOptions,
    SliceTransform, WriteBatch, WriteOptions,
};
use silt_types::{LogPosition, Offset, Partition, QueueId, Timestamp};

use crate::config::StorageConfig;
use crate::error::Result;

const CF_META: &str = "meta";
const CF_REGISTRY: &str = "registry";
const CF_CQ: &str = "cq";
const KEY_DISPATCHED: &[u8] = b"dispatched";
const KEY_NEXT_QUEUE: &[u8] = b"next_queue_id";

/// A queue's durable name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QueueName {
    /// A stream partition: the Kafka view.
    Partition { stream: String, partition: Partition },
    /// Every message published to one MQTT topic.
    Topic(String),
    /// Every message matching an MQTT wildcard filter held by a persistent subscription.
    Filter(String),
}

impl QueueName {
    /// The inverse of [`Self::encode`].
    pub(crate) fn decode(k: &[u8]) -> Option<QueueName> {
        let (kind, rest) = k.split_first()?;
        match kind {
            b'p' => {
                let len = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?) as usize;
                let stream = std::str::from_utf8(rest.get(2..2 + len)?).ok()?.to_owned();
                let p = u32::from_be_bytes(rest.get(2 + len..2 + len + 4)?.try_into().ok()?);
                Some(QueueName::Partition { stream, partition: Partition(p) })
            }
            b't' => Some(QueueName::Topic(std::str::from_utf8(rest).ok()?.to_owned())),
            b'f' => Some(QueueName::Filter(std::str::from_utf8(rest).ok()?.to_owned())),
            _ => None,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut k = Vec::new();
        match self {
            QueueName::Partition { stream, partition } => Self::partition_key_into(&mut k, stream, *partition),
            QueueName::Topic(t) => Self::key_into(&mut k, b't', t),
            QueueName::Filter(f) => Self::key_into(&mut k, b'f', f),
        }
        k
    }

    /// [`Self::encode`] of a stream partition's queue into `k` (cleared first).
    pub(crate) fn partition_key_into(k: &mut Vec<u8>, stream: &str, partition: Partition) {
        k.clear();
        k.push(b'p');
        k.extend_from_slice(&(stream.len() as u16).to_be_bytes());
        k.extend_from_slice(stream.as_bytes());
        k.extend_from_slice(&partition.get().to_be_bytes());
    }

    /// [`Self::encode`] of a topic (`kind` `t`) or filter (`f`) queue into `k` (cleared first).
    pub(crate) fn key_into(k: &mut Vec<u8>, kind: u8, name: &str) {
        k.clear();
        k.push(kind);
        k.extend_from_slice(name.as_bytes());
    }
}

/// One consume-queue entry: where a record is in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub position: LogPosition,
    pub size: u32,
    pub timestamp: Timestamp,
}

impl IndexEntry {
    pub(crate) const LEN: usize = 20;

    pub(crate) fn encode(&self) -> [u8; Self::LEN] {
        let mut v = [0u8; Self::LEN];
        v[..8].copy_from_slice(&self.position.get().to_le_bytes());
        v[8..12].copy_from_slice(&self.size.to_le_bytes());
        v[12..].copy_from_slice(&self.timestamp.get().to_le_bytes());
        v
    }

    fn decode(v: &[u8]) -> Option<Self> {
        if v.len() != Self::LEN {
            return None;
        }
        Some(Self {
            position: LogPosition(u64::from_le_bytes(v[..8].try_into().ok()?)),
            size: u32::from_le_bytes(v[8..12].try_into().ok()?),
            timestamp: Timestamp(i64::from_le_bytes(v[12..].try_into().ok()?)),
        })
    }
}

/// A registered queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueMeta {
    pub id: QueueId,
    pub since: LogPosition,
}

impl QueueMeta {
    pub fn encode(&self) -> [u8; 16] {
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&self.id.get().to_be_bytes());
        v[8..].copy_from_slice(&self.since.get().to_be_bytes());
        v
    }

    fn decode(v: &[u8]) -> Option<Self> {
        Some(Self {
            id: QueueId(u64::from_be_bytes(v.get(..8)?.try_into().ok()?)),
            since: LogPosition(u64::from_be_bytes(v.get(8..16)?.try_into().ok()?)),
        })
    }
}

/// Most entries in one block (5 KiB): a reader of one entry reads its whole block.
pub(crate) const BLOCK_ENTRIES: usize = 256;

/// The offset a `cq` key names.
fn key_offset(k: &[u8]) -> Offset {
    Offset(u64::from_be_bytes(k[8..16].try_into().expect("invariant: 16-byte key")))
}

/// Whether `k` is a `cq` key of queue `id`.
fn in_queue(k: &[u8], id: QueueId) -> bool {
    k.len() == 16 && k[..8] == id.get().to_be_bytes()
}

/// How many entries a block holds; `None` for a value that is not one.
fn block_len(v: &[u8]) -> Option<usize> {
    (!v.is_empty() && v.len().is_multiple_of(IndexEntry::LEN)).then_some(v.len() / IndexEntry::LEN)
}

/// The entries of a block, one per offset from its key's; `None` for a value that is not one.
fn block_entries(v: &[u8]) -> Option<impl Iterator<Item = IndexEntry> + '_> {
    block_len(v)?;
    Some(v.chunks_exact(IndexEntry::LEN).map(|c| IndexEntry::decode(c).expect("invariant: a whole entry")))
}

pub(crate) fn cq_key(id: QueueId, offset: Offset) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&id.get().to_be_bytes());
    k[8..].copy_from_slice(&offset.get().to_be_bytes());
    k
}

pub(crate) struct Index {
    db: DB,
}

impl Index {
    pub fn open(path: &Path, config: &StorageConfig) -> Result<Index> {
        let (opts, cfs) = Self::options(config);
        let db = DB::open_cf_descriptors(&opts, path, cfs)?;
        Ok(Index { db })
    }

    /// Opens an existing index without writing to it or taking its lock (`silt fsck`).
    pub fn open_read_only(path: &Path, config: &StorageConfig) -> Result<Index> {
        let (mut opts, cfs) = Self::options(config);
        opts.create_if_missing(false);
        opts.create_missing_column_families(false);
        let db = DB::open_cf_descriptors_read_only(&opts, path, cfs, false)?;
        Ok(Index { db })
    }

    fn options(config: &StorageConfig) -> (Options, Vec<ColumnFamilyDescriptor>) {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        // The checkpoint in `meta` must never be flushed without the entries it covers.
        opts.set_atomic_flush(true);
        opts.set_max_background_jobs(2);
        opts.set_keep_log_file_num(4);
        let cache = Cache::new_lru_cache(config.index_block_cache_bytes as usize);

        let mut cq = Options::default();
        cq.set_compression_type(rocksdb::DBCompressionType::Lz4);
        cq.set_bottommost_compression_type(rocksdb::DBCompressionType::Zstd);
        cq.set_write_buffer_size(config.index_write_buffer_bytes as usize);
        cq.set_prefix_extractor(SliceTransform::create_fixed_prefix(8));
        cq.set_memtable_prefix_bloom_ratio(0.05);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        table.set_bloom_filter(10.0, false);
        table.set_whole_key_filtering(false);
        cq.set_block_based_table_factory(&table);

        let mut registry = Options::default();
        registry.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let mut rtable = BlockBasedOptions::default();
        rtable.set_block_cache(&cache);
        rtable.set_bloom_filter(10.0, false);
        registry.set_block_based_table_factory(&rtable);

        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_META, Options::default()),
            ColumnFamilyDescriptor::new(CF_REGISTRY, registry),
            ColumnFamilyDescriptor::new(CF_CQ, cq),
        ];
        (opts, cfs)
    }

    fn cf(&self, name: &str) -> &ColumnFamily {
        self.db.cf_handle(name).expect("invariant: column families are created at open")
    }

    fn get_u64(&self, key: &[u8]) -> Result<Option<u64>> {
        let v = self.db.get_cf(self.cf(CF_META), key)?;
        Ok(v.and_then(|v| v.as_slice().try_into().ok().map(u64::from_be_bytes)))
    }

    /// Position up to which the log is indexed, if the index was ever written.
    pub fn checkpoint(&self) -> Result<Option<LogPosition>> {
        Ok(self.get_u64(KEY_DISPATCHED)?.map(LogPosition))
    }

    pub fn next_queue_id(&self) -> Result<u64> {
        Ok(self.get_u64(KEY_NEXT_QUEUE)?.unwrap_or(0))
    }

    pub fn lookup(&self, name: &QueueName) -> Result<Option<QueueMeta>> {
        self.lookup_key(&name.encode())
    }

    pub fn lookup_key(&self, key: &[u8]) -> Result<Option<QueueMeta>> {
        Ok(self.db.get_pinned_cf(self.cf(CF_REGISTRY), key)?.and_then(|v| QueueMeta::decode(&v)))
    }

    /// Every registered queue: its encoded name and meta.
    pub fn registry(&self) -> Result<Vec<(Vec<u8>, QueueMeta)>> {
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(CF_REGISTRY), IteratorMode::Start) {
            let (k, v) = item?;
            if let Some(m) = QueueMeta::decode(&v) {
                out.push((k.to_vec(), m));
            }
        }
        Ok(out)
    }

    /// Every registered MQTT topic queue, in topic order.
    pub fn topics(&self) -> Result<Vec<(String, QueueMeta)>> {
        self.registered(b't')
    }

    /// Every registered filter queue.
    pub fn filters(&self) -> Result<Vec<(String, QueueMeta)>> {
        self.registered(b'f')
    }

    /// The registered queues whose registry key starts with `kind`, by name, in name order.
    fn registered(&self, kind: u8) -> Result<Vec<(String, QueueMeta)>> {
        let mut out = Vec::new();
        let it = self.db.iterator_cf(self.cf(CF_REGISTRY), IteratorMode::From(&[kind], Direction::Forward));
        for item in it {
            let (k, v) = item?;
            if k.first() != Some(&kind) {
                break;
            }
            if let (Ok(name), Some(m)) = (std::str::from_utf8(&k[1..]), QueueMeta::decode(&v)) {
                out.push((name.to_owned(), m));
            }
        }
        Ok(out)
    }

    /// Offset of the last entry of a queue, if it has any.
    pub fn last_offset(&self, id: QueueId) -> Result<Option<Offset>> {
        let mut ro = ReadOptions::default();
        ro.set_prefix_same_as_start(true);
        let mut it = self.db.raw_iterator_cf_opt(self.cf(CF_CQ), ro);
        it.seek_for_prev(cq_key(id, Offset(u64::MAX)));
        it.status()?;
        let (Some(k), Some(v)) = (it.key(), it.value()) else { return Ok(None) };
        if !in_queue(k, id) {
            return Ok(None);
        }
        let count = block_len(v).unwrap_or(0) as u64;
        Ok(count.checked_sub(1).map(|last| Offset(key_offset(k).get() + last)))
    }

    /// Offset of the first entry of a queue, if it has any.
    pub fn first_offset(&self, id: QueueId) -> Result<Option<Offset>> {
        Ok(self.read(id, Offset(0), 1)?.first().map(|(o, _)| *o))
    }

    /// Up to `max` entries of queue `id` from offset `from`, in order.
    pub fn read(&self, id: QueueId, from: Offset, max: usize) -> Result<Vec<(Offset, IndexEntry)>> {
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(cq_key(QueueId(id.get().saturating_add(1)), Offset(0)).to_vec());
        ro.set_prefix_same_as_start(true);
        let mut it = self.db.raw_iterator_cf_opt(self.cf(CF_CQ), ro);
        // The block holding `from` starts at or before it; none does if `from` lies before
        // the queue's first entry.
        it.seek_for_prev(cq_key(id, from));
        if !it.key().is_some_and(|k| in_queue(k, id)) {
            it.seek(cq_key(id, from));
        }
        let mut out = Vec::with_capacity(max.min(1024));
        while it.valid() && out.len() < max {
            let (Some(k), Some(v)) = (it.key(), it.value()) else { break };
            if !in_queue(k, id) {
                break;
            }
            let first = key_offset(k).get();
            if let Some(entries) = block_entries(v) {
                let skip = from.get().saturating_sub(first) as usize;
                let entries = entries.enumerate().skip(skip).take(max - out.len());
                out.extend(entries.map(|(i, e)| (Offset(first + i as u64), e)));
            }
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    /// A write batch under construction by the dispatcher.
    pub fn batch(&self) -> IndexBatch<'_> {
        IndexBatch { index: self, wb: WriteBatch::default() }
    }

    /// Flushes memtables so a restart resumes from here without re-dispatching. `wait: false`
    /// schedules the (atomic, all-column-family) flush in the background, so dispatch does not
    /// stall on it; shutdown waits.
    pub fn flush(&self, wait: bool) -> Result<()> {
        let cfs = [self.cf(CF_META), self.cf(CF_REGISTRY), self.cf(CF_CQ)];
        let mut opts = rocksdb::FlushOptions::default();
        opts.set_wait(wait);
        self.db.flush_cfs_opt(&cfs, &opts)?;
        Ok(())
    }

    /// Approximate bytes of SST files and live memtables, for measurements.
    pub fn approximate_sizes(&self) -> (u64, u64) {
        let prop = |name: &str| {
            [CF_META, CF_REGISTRY, CF_CQ]
                .iter()
                .filter_map(|cf| self.db.property_int_value_cf(self.cf(cf), name).ok().flatten())
                .sum::<u64>()
        };
        (prop("rocksdb.total-sst-files-size"), prop("rocksdb.cur-size-all-mem-tables"))
    }
}

pub(crate) struct IndexBatch<'a> {
    index: &'a Index,
    wb: WriteBatch,
}

impl IndexBatch<'_> {
    /// Puts consume-queue entries, given in key order (queue, then offset; the memtable inserts
    /// them cheapest so), as blocks: each run of consecutive offsets of one queue, up to
    /// [`BLOCK_ENTRIES`] at a time, becomes one key. A queue's entries already in the index
    /// must end just before its run (blocks never overlap).
    pub fn put_entries<'e>(&mut self, entries: impl IntoIterator<Item = (QueueId, Offset, &'e IndexEntry)>) {
        let cf = self.index.cf(CF_CQ);
        let mut block: Option<(QueueId, Offset)> = None;
        let mut value = Vec::with_capacity(BLOCK_ENTRIES * IndexEntry::LEN);
        for (id, offset, e) in entries {
            let continues = block.is_some_and(|(bid, first)| {
                bid == id && first.get() + (value.len() / IndexEntry::LEN) as u64 == offset.get()
            });
            if !continues || value.len() == BLOCK_ENTRIES * IndexEntry::LEN {
                if let Some((bid, first)) = block {
                    self.wb.put_cf(cf, cq_key(bid, first), &value);
                }
                block = Some((id, offset));
                value.clear();
            }
            value.extend_from_slice(&e.encode());
        }
        if let Some((bid, first)) = block {
            self.wb.put_cf(cf, cq_key(bid, first), &value);
        }
    }

    pub fn put_queue(&mut self, key: &[u8], meta: &QueueMeta) {
        self.wb.put_cf(self.index.cf(CF_REGISTRY), key, meta.encode());
    }

    pub fn delete_queue(&mut self, key: &[u8], id: QueueId) {
        self.wb.delete_cf(self.index.cf(CF_REGISTRY), key);
        self.wb.delete_range_cf(
            self.index.cf(CF_CQ),
            cq_key(id, Offset(0)),
            cq_key(QueueId(id.get().saturating_add(1)), Offset(0)),
        );
    }

    pub fn put_next_queue_id(&mut self, next: u64) {
        self.wb.put_cf(self.index.cf(CF_META), KEY_NEXT_QUEUE, next.to_be_bytes());
    }

    /// Commits the batch with the checkpoint `dispatched`, without the RocksDB WAL.
    pub fn commit(mut self, dispatched: LogPosition) -> Result<()> {
        self.wb.put_cf(self.index.cf(CF_META), KEY_DISPATCHED, dispatched.get().to_be_bytes());
        let mut wo = WriteOptions::default();
        wo.disable_wal(true);
        self.index.db.write_opt(self.wb, &wo)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u64) -> IndexEntry {
        IndexEntry { position: LogPosition(1000 + 7 * i), size: i as u32, timestamp: Timestamp(i as i64) }
    }

    #[test]
    fn blocks_answer_every_offset_as_one_entry_per_key_did() {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::open(dir.path(), &StorageConfig::default()).unwrap();
        let (a, b, c) = (QueueId(1), QueueId(2), QueueId(3));
        // Queue `a`: entries 0..3 one key each (as indexes before blocks hold them), then a
        // round of 600 (three blocks: 256, 256, 88), then a round of 5. Queue `b` between
        // them in key order, queue `c` empty.
        let mut raw = index.batch();
        for i in 0..3 {
            raw.wb.put_cf(index.cf(CF_CQ), cq_key(a, Offset(i)), entry(i).encode());
        }
        raw.commit(LogPosition(1)).unwrap();
        let round = |entries: Vec<(QueueId, u64)>| {
            let entries: Vec<(QueueId, Offset, IndexEntry)> =
                entries.into_iter().map(|(q, o)| (q, Offset(o), entry(o))).collect();
            let mut batch = index.batch();
            batch.put_entries(entries.iter().map(|(q, o, e)| (*q, *o, e)));
            batch.commit(LogPosition(2)).unwrap();
        };
        round((3..603).map(|o| (a, o)).chain((0..10).map(|o| (b, o))).collect());
        round((603..608).map(|o| (a, o)).collect());
        assert_eq!(index.last_offset(a).unwrap(), Some(Offset(607)));
        assert_eq!(index.first_offset(a).unwrap(), Some(Offset(0)));
        assert_eq!(index.last_offset(b).unwrap(), Some(Offset(9)));
        assert_eq!((index.last_offset(c).unwrap(), index.first_offset(c).unwrap()), (None, None));
        assert!(index.read(c, Offset(0), 10).unwrap().is_empty());
        for from in 0..612 {
            for max in [1, 2, 255, 300, 1000] {
                let got = index.read(a, Offset(from), max).unwrap();
                let want: Vec<(Offset, IndexEntry)> = (from..608).take(max).map(|o| (Offset(o), entry(o))).collect();
                assert_eq!(got, want, "from {from}, max {max}");
            }
        }
        assert_eq!(index.read(b, Offset(4), 100).unwrap().len(), 6);
        // A dropped queue's blocks go with it.
        let mut drop = index.batch();
        drop.delete_queue(b"ta", a);
        drop.commit(LogPosition(3)).unwrap();
        assert_eq!(index.last_offset(a).unwrap(), None);
        assert_eq!(index.read(b, Offset(0), 100).unwrap().len(), 10);
    }
}
