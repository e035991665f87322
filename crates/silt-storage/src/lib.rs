//! Silt's storage engine: the node's commitlog and the consume-queue index over it.
//!
//! - [`format`]: the versioned on-disk format of segments, batches and records (no I/O).
//! - `segment`, `tail`, `log`: segment files, the in-memory tail cache, and the group-commit
//!   writer with recovery of a torn tail.
//! - `index`: consume queues in RocksDB (entries, queue registry, checkpoint).
//! - `dispatch`: the thread that follows the log and writes index entries, with wildcard
//!   multi-dispatch into filter queues.
//! - [`Storage`]: the handle the broker uses.
//! - [`StorageConfig`]: settings, with defaults for a single VM.
//!
//! Guarantees: `Ok` from [`Storage::append`] means the batch is in the local log and, under
//! `fsync = "always"`, fsynced: it survives a kill -9 and a power cut. It does not mean the
//! batch is in the object store. Recovery keeps whole batches up to the first invalid one and
//! never serves bytes that failed their CRC. The index can always be rebuilt from the log.

mod config;
mod dispatch;
mod engine;
mod error;
pub mod format;
mod index;
mod log;
mod restore;
mod segment;
mod tail;

pub use config::{FsyncPolicy, StorageConfig};
pub use dispatch::{DispatchListener, Dispatched};
pub use engine::{PendingAppendAck, Storage, StorageStats};
pub use error::{Error, ErrorKind, Result};
pub use format::Record;
pub use index::{IndexEntry, QueueName};
pub use log::{Appended, ColdReader, SealedSegment};
pub use restore::{install_segment_file, log_dir, staging_path, start_segment};
