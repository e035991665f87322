//! Internal streams: records in the commitlog that carry broker state rather than
//! messages, so that state lives (and is recovered) exactly like the data.
//!
//! - `__silt_sessions`: session and shared-group snapshots, last one per key wins.
//! - `__silt_retained`: retained-message pointers, last one per topic wins.
//! - `__silt_checkpoints`: markers saying "a full dump of stream X starts at offset N", so
//!   start-up replays from the newest dump instead of from the beginning of time. A dump is
//!   written at clean shutdown and whenever start-up had to replay much more than the live
//!   state; the replay is then bounded by a few times the live state.

use bytes::Bytes;
use silt_storage::{IndexEntry, QueueName, Record, Storage};
use silt_types::{LogPosition, Offset, Partition, Timestamp};

/// Internal stream of checkpoint markers (key: the stream dumped, value: u64 BE offset).
pub const CHECKPOINT_STREAM: &str = "__silt_checkpoints";

fn partition0(stream: &str) -> QueueName {
    QueueName::Partition { stream: stream.into(), partition: Partition(0) }
}

/// The offset the next record of `stream` will get.
pub fn stream_end(storage: &Storage, stream: &str) -> silt_storage::Result<Offset> {
    match storage.queue_id(&partition0(stream))? {
        Some(id) => Ok(storage.queue_bounds(id)?.1),
        None => Ok(Offset(0)),
    }
}

/// Calls `f` for every record of `stream` from `from` on, in order; returns how many.
pub fn scan(
    storage: &Storage,
    stream: &str,
    from: Offset,
    mut f: impl FnMut(IndexEntry, Record),
) -> silt_storage::Result<u64> {
    let Some(id) = storage.queue_id(&partition0(stream))? else { return Ok(0) };
    let (first, end) = storage.queue_bounds(id)?;
    let mut at = from.max(first);
    let mut n = 0;
    while at < end {
        let batch = storage.read_index(id, at, 1024)?;
        let Some((last, _)) = batch.last() else { break };
        at = last.next();
        for (_, e) in batch {
            match storage.read_record(&e) {
                Ok(r) => f(e, r),
                // Internal records are never kept off the store (`tier = "local"`), so this is
                // a volatile one from an earlier process: the pointer of a memory-tier retained
                // message, gone with it by design. Counted: replaying it cost a read, and
                // enough of them call for a compaction.
                Err(silt_storage::Error::Withheld(_)) => {}
                // A batch that failed its checks with no good copy (a bad disk, before the
                // upload) is lost, its internal records with it: start-up goes on with the
                // state before them (an older snapshot, offsets committed earlier) rather
                // than refusing to start. Storage has logged the quarantine as an error.
                Err(err) if err.kind() == silt_storage::ErrorKind::Expired => {
                    tracing::error!(stream, position = e.position.get(), error = %err, "internal record lost, skipped");
                    continue;
                }
                Err(err) => return Err(err),
            }
            n += 1;
        }
    }
    Ok(n)
}

/// Where the newest full dump of `stream` starts (0 if there is none).
pub fn checkpoint(storage: &Storage, stream: &str) -> silt_storage::Result<Offset> {
    Ok(newest_marker(storage, stream)?.map_or(Offset(0), |(start, _)| start))
}

/// The newest checkpoint marker of `stream`: the dump's start offset and the marker's position.
fn newest_marker(storage: &Storage, stream: &str) -> silt_storage::Result<Option<(Offset, LogPosition)>> {
    let mut found = None;
    scan(storage, CHECKPOINT_STREAM, Offset(0), |e, r| {
        if r.key.as_deref() == Some(stream.as_bytes())
            && let Ok(b) = <[u8; 8]>::try_from(r.value.as_ref())
        {
            found = Some((Offset(u64::from_be_bytes(b)), e.position));
        }
    })?;
    Ok(found)
}

/// The lowest log position start-up still reads for `stream`: its newest dump (and the
/// marker naming it), or its first record when it was never dumped. `None`: nothing needed.
pub fn floor(storage: &Storage, stream: &str) -> silt_storage::Result<Option<LogPosition>> {
    let Some(id) = storage.queue_id(&partition0(stream))? else { return Ok(None) };
    let (first, end) = storage.queue_bounds(id)?;
    let (from, marker) = match newest_marker(storage, stream)? {
        Some((start, at)) => (start.max(first), Some(at)),
        None => (first, None),
    };
    let dump = if from < end { storage.read_index(id, from, 1)?.first().map(|(_, e)| e.position) } else { None };
    Ok(match (dump, marker) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

/// The marker saying a full dump of `stream` starts at `start`.
pub fn checkpoint_record(stream: &str, start: Offset) -> Record {
    Record {
        timestamp: Timestamp::now(),
        stream: CHECKPOINT_STREAM.into(),
        partition: Partition(0),
        key: Some(Bytes::copy_from_slice(stream.as_bytes())),
        value: Bytes::copy_from_slice(&start.get().to_be_bytes()),
        ..Record::default()
    }
}

/// Whether a replay of `replayed` records for `live` live items is long enough to dump anew.
pub fn worth_compacting(replayed: u64, live: usize) -> bool {
    replayed > 2 * live as u64 + 1000
}
