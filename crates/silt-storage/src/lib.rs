//! Silt's storage engine: the node's commitlog and the consume-queue index over it.
//!
//! - [`format`]: the versioned on-disk format of segments, batches and records (no I/O).
//! - `segment`, `tail`, `log`, `writer`: segment files (recovery of a torn tail), the
//!   in-memory tail cache, the state readers share, and the group-commit writer, which
//!   recovers from a failed write or a full disk by itself.
//! - `repair`: checked reads of segment files; a batch that fails its checks is healed from a
//!   good copy (the tail cache, the object store) or quarantined behind a gap batch.
//! - `throttle`: one log line per interval for a failure that repeats.
//! - `index`: consume queues in RocksDB (entries, queue registry, checkpoint).
//! - `dispatch`: the thread that follows the log and writes index entries, with wildcard
//!   multi-dispatch into filter queues; `recent`: the newest entries of recently written
//!   queues in memory, for readers that keep up.
//! - [`check_index`]: the offline check of the index against the log (`silt fsck`).
//! - [`Storage`]: the handle the broker uses.
//! - [`StorageConfig`]: settings, with defaults for a single VM.
//!
//! Guarantees: `Ok` from [`Storage::append`] means the batch is in the local log and, under
//! `fsync = "always"`, fsynced: it survives a kill -9 and a power cut. It does not mean the
//! batch is in the object store. Recovery keeps every valid batch (a bad one followed by valid
//! ones is quarantined, a bad one at the end is a torn write and cut), and no read serves
//! bytes that failed their CRC: they are healed or quarantined, counted and logged. The index
//! can always be rebuilt from the log.

mod check;
mod config;
mod dispatch;
mod engine;
mod error;
pub mod format;
mod index;
mod log;
mod recent;
mod repair;
mod restore;
mod segment;
mod tail;
mod throttle;
mod writer;

pub use check::{IndexCheck, check_index};
pub use config::{FsyncPolicy, StorageConfig};
pub use dispatch::{DispatchListener, Dispatched};
pub use engine::{PendingAppendAck, Storage, StorageStats};
pub use error::{Error, ErrorKind, Result};
pub use format::{Producer, Record};
pub use index::{IndexEntry, QueueName};
pub use log::{Appended, ColdReader, SealedSegment, check_segment_file, segment_files};
#[doc(hidden)]
pub use log::{SegmentRecovery, recover_segment_file};
pub use restore::{install_segment_file, log_dir, staging_path, start_segment};
pub use segment::Inspected;
