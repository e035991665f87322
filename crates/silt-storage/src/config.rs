//! Storage settings: serde data, validated once at start-up. Defaults suit a single VM.

use serde::{Deserialize, Serialize};

/// When the commitlog calls fsync, and so when `append` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FsyncPolicy {
    /// `append` returns after the write is fsynced (group commit: concurrent appends share
    /// one write and one fsync). Survives a crash of the process and of the machine.
    #[default]
    Always,
    /// `append` returns after the write; the log is fsynced every `fsync_interval_ms`.
    /// Survives a crash of the process; a machine crash loses at most the last interval.
    Interval,
    /// `append` returns after the write; fsync only when a segment is sealed and at shutdown.
    Never,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// A segment is sealed and a new one started once it reaches this many bytes.
    pub segment_bytes: u64,
    /// A non-empty segment is sealed once it is this old (milliseconds), so that tiering
    /// uploads even a quiet log.
    pub segment_max_age_ms: u64,
    pub fsync: FsyncPolicy,
    /// Period of the background fsync under `fsync = "interval"`.
    pub fsync_interval_ms: u64,
    /// Under `fsync = "always"`, zeros are written (and fsynced) this many bytes at a time
    /// ahead of the active segment's end, so each append's fsync has only data to write, no
    /// file size to commit (about half the latency and CPU of an fsync on ext4). 0 turns it
    /// off (e.g. on a copy-on-write file system, where overwriting gains nothing).
    pub preallocate_bytes: u64,
    /// Bytes of the log's tail kept in memory so live readers don't touch the disk.
    pub tail_cache_bytes: u64,
    /// Largest batch one append may carry (bytes, encoded).
    pub max_batch_bytes: u32,
    /// Largest single write of the group-commit loop (bytes); more waiting appends go into the
    /// next write.
    pub max_write_bytes: u32,
    /// Appended bytes waiting for the writer before `append` waits (backpressure).
    pub max_pending_bytes: u64,
    /// Consume-queue states (id, next offset) kept in memory by the dispatcher.
    pub queue_cache_entries: usize,
    /// RocksDB block cache for the index (bytes).
    pub index_block_cache_bytes: u64,
    /// RocksDB memtable size for the index (bytes). After a full disk, index writes resume
    /// by themselves once at least this much space is free again.
    pub index_write_buffer_bytes: u64,
    /// How often the index is flushed while it changes (ms): after a crash, dispatch resumes
    /// from the last flush.
    pub index_flush_interval_ms: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 128 << 20,
            segment_max_age_ms: 10 * 60 * 1000,
            fsync: FsyncPolicy::Always,
            fsync_interval_ms: 50,
            preallocate_bytes: 4 << 20,
            tail_cache_bytes: 64 << 20,
            max_batch_bytes: 16 << 20,
            max_write_bytes: 4 << 20,
            max_pending_bytes: 64 << 20,
            queue_cache_entries: 100_000,
            index_block_cache_bytes: 64 << 20,
            index_write_buffer_bytes: 64 << 20,
            index_flush_interval_ms: 10_000,
        }
    }
}

impl StorageConfig {
    /// Checks every setting; the error names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |key: &str, why: &str| Err(format!("storage.{key}: {why}"));
        if self.segment_bytes < 4096 {
            return bad("segment_bytes", "must be at least 4096");
        }
        if self.segment_max_age_ms == 0 {
            return bad("segment_max_age_ms", "must be greater than 0");
        }
        if self.fsync == FsyncPolicy::Interval && self.fsync_interval_ms == 0 {
            return bad("fsync_interval_ms", "must be greater than 0 with fsync = \"interval\"");
        }
        if self.max_batch_bytes < 1024 {
            return bad("max_batch_bytes", "must be at least 1024");
        }
        if self.max_write_bytes < 4096 {
            return bad("max_write_bytes", "must be at least 4096");
        }
        if self.max_pending_bytes < u64::from(self.max_batch_bytes) {
            return bad("max_pending_bytes", "must be at least max_batch_bytes");
        }
        if self.index_flush_interval_ms == 0 {
            return bad("index_flush_interval_ms", "must be greater than 0");
        }
        if self.queue_cache_entries == 0 {
            return bad("queue_cache_entries", "must be greater than 0");
        }
        Ok(())
    }
}
