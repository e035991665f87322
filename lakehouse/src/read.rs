//! Reading what a table has not written yet: the stream partitions its filters can reach,
//! from the offsets its last snapshot recorded, in offset order, through the storage engine's
//! read path (tail cache, disk, object store). Blocking: run it off the runtime's threads.
//!
//! A record is the table's if its MQTT topic's policy names the table (the first matching
//! `[[topics]]` entry decides, as for everything else). Kafka control records are never rows;
//! records of a transaction are rows only once it committed (reading stops at a partition's
//! last stable offset and skips aborted ranges, as a read_committed consumer does).

use std::collections::BTreeMap;
use std::sync::Arc;

use silt_dataset::{Streams, attrs, rule};
use silt_storage::{ErrorKind, QueueName, Storage};
use silt_tiering::Policies;
use silt_types::{LogPosition, Offset, Partition};

use crate::rows::Row;

/// A stream partition: `(stream, partition)`.
pub type Source = (String, u32);

/// What a read-committed reader needs of a partition.
pub trait Visibility: Send + Sync {
    /// The partition's last stable offset when its end is `end`, and the aborted ranges
    /// `(producer id, first, last)` overlapping `[from, lso)`.
    fn stable(&self, stream: &str, partition: u32, from: u64, end: u64) -> (u64, Vec<(i64, u64, u64)>);
}

/// One read's outcome.
#[derive(Default)]
pub struct Read {
    pub rows: Vec<Row>,
    /// The next offset of every partition looked at (records that are not the table's count as
    /// read).
    pub offsets: BTreeMap<Source, u64>,
    /// Partitions whose next unread record is older than retention kept: `(source, from, to)`,
    /// offsets lost before `to`.
    pub lost: Vec<(Source, u64, u64)>,
    /// The log position and time (ms) of the oldest record not read yet (more were waiting).
    pub oldest_pending: Option<(LogPosition, i64)>,
    /// Whether the read stopped at its row limit (more to read at once).
    pub more: bool,
    /// One past the log position of the last record read (0: none): what the bucket must
    /// hold before these offsets are committed.
    pub end: u64,
}

/// The streams a table's filters can reach now (all of them when a filter starts with a
/// wildcard).
pub fn streams_for(filters: &[String], streams: &Streams) -> Vec<(String, u32)> {
    let all = filters.iter().any(|f| matches!(f.split('/').next(), Some("+" | "#")));
    streams
        .list()
        .into_iter()
        .filter(|(name, _)| !rule::is_internal(name))
        .filter(|(name, _)| all || filters.iter().any(|f| f.split('/').next() == Some(name.as_str())))
        .map(|(name, meta)| (name, meta.partitions))
        .collect()
}

const STEP: usize = 512;

/// What a table's read asks for.
pub struct Want<'a> {
    pub table: &'a str,
    pub filters: &'a [String],
    pub offsets: &'a BTreeMap<Source, u64>,
    pub max_rows: usize,
}

/// Reads at most `max_rows` rows for `table` from `offsets` on.
pub fn read(src: &Sources, visibility: Option<&dyn Visibility>, want: Want<'_>) -> silt_storage::Result<Read> {
    let Want { table, filters, offsets, max_rows } = want;
    let (storage, streams, policies) = (&*src.storage, &*src.streams, &*src.policies);
    let mut out = Read { offsets: offsets.clone(), ..Read::default() };
    for (stream, partitions) in streams_for(filters, streams) {
        for p in 0..partitions {
            let source = (stream.clone(), p);
            let name = QueueName::Partition { stream: stream.clone(), partition: Partition(p) };
            let Some(id) = storage.queue_id(&name)? else { continue };
            let (start, end) = storage.queue_bounds(id)?;
            let mut at = offsets.get(&source).copied().unwrap_or(0);
            if at > end.get() {
                // The stream was deleted and made anew: its offsets start over.
                tracing::warn!(table, stream = %stream, partition = p, was = at, end = end.get(),
                    "a stream partition starts over below the table's offset; reading it from its start");
                at = 0;
            }
            if at < start.get() {
                out.lost.push((source.clone(), at, start.get()));
                at = start.get();
            }
            let (stop, aborted) = match visibility {
                Some(v) => v.stable(&stream, p, at, end.get()),
                None => (end.get(), Vec::new()),
            };
            while at < stop {
                if out.rows.len() >= max_rows {
                    out.more = true;
                    if let Some((_, e)) = storage.read_index(id, Offset(at), 1)?.first() {
                        let pending = (e.position, e.timestamp.get());
                        out.oldest_pending = Some(out.oldest_pending.map_or(pending, |o| o.min(pending)));
                    }
                    break;
                }
                let entries = storage.read_index(id, Offset(at), STEP.min(max_rows - out.rows.len()).max(1))?;
                let Some((last, _)) = entries.last() else { break };
                let next = last.next().get();
                for (offset, entry) in entries {
                    if offset.get() >= stop {
                        break;
                    }
                    let o = offset.get();
                    at = o + 1;
                    out.end = out.end.max(entry.position.get() + 1);
                    let record = match storage.read_record(&entry) {
                        Ok(r) => r,
                        Err(e) if e.kind() == ErrorKind::Expired => continue,
                        Err(e) => return Err(e),
                    };
                    if record.attrs & attrs::KAFKA_CONTROL != 0 {
                        continue;
                    }
                    if record.attrs & attrs::TRANSACTIONAL != 0 {
                        let pid = record.producer.map_or(-1, |p| p.id);
                        if aborted.iter().any(|&(a, first, last)| a == pid && (first..=last).contains(&o)) {
                            continue;
                        }
                    }
                    let topic = if record.topic.is_empty() {
                        rule::mqtt_topic_for(&record.stream, record.key.as_deref())
                    } else {
                        record.topic.clone()
                    };
                    // The first matching entry names the table: one of this table's filters.
                    let mine = policies.for_topic(&topic).lakehouse.as_ref().is_some_and(|t| t.table == table);
                    if !mine {
                        continue;
                    }
                    let properties = record
                        .headers
                        .iter()
                        .map(|(k, v)| {
                            (k.clone(), String::from_utf8_lossy(v.as_deref().unwrap_or_default()).into_owned())
                        })
                        .collect();
                    out.rows.push(Row {
                        topic,
                        stream: record.stream.clone(),
                        partition: p as i32,
                        offset: o as i64,
                        timestamp_ms: record.timestamp.get(),
                        key: record.key.clone(),
                        payload: record.value.clone(),
                        qos: i32::from(record.attrs & attrs::QOS_MASK),
                        properties,
                    });
                }
                at = at.max(next.min(stop));
            }
            out.offsets.insert(source, at);
        }
    }
    Ok(out)
}

/// Where `source`'s next unread record is, and its time (ms), if any.
pub fn pending(storage: &Storage, source: &Source, next: u64) -> silt_storage::Result<Option<(LogPosition, i64)>> {
    let name = QueueName::Partition { stream: source.0.clone(), partition: Partition(source.1) };
    let Some(id) = storage.queue_id(&name)? else { return Ok(None) };
    Ok(storage.read_index(id, Offset(next), 1)?.first().map(|(_, e)| (e.position, e.timestamp.get())))
}

/// Shared handles a table's reads need.
pub struct Sources {
    pub storage: Arc<Storage>,
    pub streams: Arc<Streams>,
    pub policies: Arc<Policies>,
}
