//! The offline check of the consume-queue index against the commitlog (`silt fsck`).
//!
//! The index is derived from the log, so the check derives it again and compares: the log's
//! local segments are read in order, up to the index's checkpoint, and each record is looked
//! up in every queue dispatch puts it in (its stream partition, its MQTT topic, and each
//! registered wildcard filter it matches and that existed before it). Each queue's entries
//! must name exactly those records, in log order, at dense offsets, with the records' sizes.
//! Entries of segments no longer on this disk (evicted to the bucket) are not read; entries
//! of the local range that point at no record of their queue, and a checkpoint past the end
//! of the log, are reported too. Both are opened read only: nothing is changed (the next
//! start rebuilds an index that is ahead of its log; a deleted index is rebuilt from the log).
//!
//! Memory: one cursor per queue met, and the registered filters' trie.

use std::collections::HashMap;
use std::path::Path;

use silt_types::{LogPosition, Offset, QueueId, TopicFilter, TopicTrie};

use crate::config::StorageConfig;
use crate::error::Result;
use crate::format::{self, RecordHead, SEGMENT_HEADER_LEN};
use crate::index::{Index, QueueMeta, QueueName};
use crate::repair::{self, Found};
use crate::segment::Segment;

/// At most this many problems are described one by one; the rest are counted.
const MAX_PROBLEMS: usize = 1000;

/// What the check found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct IndexCheck {
    /// The data directory has no index (the next start builds it from the log).
    pub missing: bool,
    /// Queues registered, and the entries compared with a record of the log.
    pub queues: u64,
    pub entries: u64,
    /// Human-readable lines, one per problem (at most [`MAX_PROBLEMS`]), and how many more.
    pub problems: Vec<String>,
    pub more_problems: u64,
}

impl IndexCheck {
    fn problem(&mut self, line: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(line);
        } else {
            self.more_problems += 1;
        }
    }

    pub fn clean(&self) -> bool {
        self.problems.is_empty() && self.more_problems == 0
    }
}

/// Where one queue's comparison stands.
struct Cursor {
    id: QueueId,
    /// The offset whose entry should name the queue's next record in the log.
    next: Offset,
}

fn describe(key: &[u8]) -> String {
    match QueueName::decode(key) {
        Some(QueueName::Partition { stream, partition }) => format!("stream {stream} partition {partition}"),
        Some(QueueName::Topic(t)) => format!("topic {t}"),
        Some(QueueName::Filter(f)) => format!("filter {f}"),
        None => format!("queue {key:?}"),
    }
}

/// Checks the index of `data_dir` against its commitlog; `progress` is told the log bytes
/// read so far.
pub fn check_index(data_dir: &Path, config: &StorageConfig, progress: &dyn Fn(u64)) -> Result<IndexCheck> {
    let mut out = IndexCheck::default();
    let index_dir = data_dir.join("index");
    if !index_dir.join("CURRENT").is_file() {
        out.missing = true;
        return Ok(out);
    }
    let index = Index::open_read_only(&index_dir, config)?;
    let registry = index.registry()?;
    out.queues = registry.len() as u64;
    let metas: HashMap<Vec<u8>, QueueMeta> = registry.iter().cloned().collect();
    let mut filters: TopicTrie<QueueMeta> = TopicTrie::default();
    for (key, meta) in &registry {
        if let Some(QueueName::Filter(f)) = QueueName::decode(key)
            && let Ok(filter) = TopicFilter::new(&f)
        {
            filters.insert(&filter, *meta);
        }
    }
    let Some(checkpoint) = index.checkpoint()? else {
        if !registry.is_empty() {
            out.problem("the index has queues but no checkpoint (the next start rebuilds it)".into());
        }
        return Ok(out);
    };

    let files = crate::log::segment_files(&data_dir.join("log"))?;
    let max = config.max_batch_bytes as usize;
    let local_start = files.first().map_or(checkpoint, |(base, _)| *base);
    let mut log_end = local_start;
    let mut cursors: HashMap<Vec<u8>, Cursor> = HashMap::new();
    let mut read = 0u64;
    let mut keys: Vec<Vec<u8>> = Vec::new();
    // Bad ranges (the batch check reports them): entries into them are not held against the
    // index.
    let mut bad: Vec<(LogPosition, LogPosition)> = Vec::new();
    'segments: for (base, path) in &files {
        let seg = Segment::open(path.clone(), *base, true)?;
        let len = seg.len();
        let mut window = seg.window(len);
        let mut at = SEGMENT_HEADER_LEN;
        while at < len {
            let pos = base.add(at);
            if pos >= checkpoint {
                log_end = log_end.max(pos);
                break 'segments;
            }
            let total = match repair::check_at(&mut window, at, len, max)? {
                Ok(Found::Batch(total)) => total,
                Ok(Found::Gap(total)) => {
                    at += total;
                    continue;
                }
                // A bad range (the batch check names it): what follows is checked on.
                Err(_) => {
                    let end = repair::bad_end(&mut window, at, len, max)?.max(at + 1);
                    bad.push((pos, base.add(end)));
                    at = end;
                    continue;
                }
            };
            if let Ok(view) = format::check_batch(window.copy_at(at, total)?, max) {
                for &(off, rlen) in &view.records {
                    let rpos = pos.add(u64::from(off));
                    let bytes = &view.frame[off as usize..(off + rlen) as usize];
                    let Ok(head) = RecordHead::decode(bytes) else { continue };
                    if head.control {
                        continue;
                    }
                    keys.clear();
                    if !head.stream.is_empty() {
                        keys.push(
                            QueueName::Partition { stream: head.stream.to_owned(), partition: head.partition }.encode(),
                        );
                    }
                    if !head.topic.is_empty() {
                        keys.push(QueueName::Topic(head.topic.to_owned()).encode());
                        filters.for_each_match(head.topic, |f, m| {
                            if m.since < rpos {
                                keys.push(QueueName::Filter(f.to_owned()).encode());
                            }
                        });
                    }
                    for key in keys.drain(..) {
                        // Not registered (a deleted topic), or created after this record.
                        let Some(meta) = metas.get(&key).filter(|m| m.since <= rpos) else { continue };
                        let cursor = match cursors.get_mut(&key) {
                            Some(c) => c,
                            None => {
                                let next = first_at_or_after(&index, meta.id, rpos)?;
                                cursors.entry(key.clone()).or_insert(Cursor { id: meta.id, next })
                            }
                        };
                        compare(&index, &mut out, &key, cursor, rpos, rlen, &bad)?;
                    }
                }
            }
            at += total;
            read += total;
            progress(read);
        }
        log_end = log_end.max(base.add(len));
    }
    if checkpoint > log_end {
        out.problem(format!(
            "the index covers the log up to position {checkpoint} but the log ends at {log_end} (the next start rebuilds the index)"
        ));
    }
    // Entries left over: they name local positions that hold no record of their queue, or
    // positions past the end of the log.
    for (key, meta) in &metas {
        let from = match cursors.get(key) {
            Some(c) => c.next,
            None => first_at_or_after(&index, meta.id, local_start)?,
        };
        if let Some((o, e)) = index.read(meta.id, from, 1)?.first()
            && e.position < checkpoint
            && !in_bad(&bad, e.position)
        {
            let what =
                if e.position >= log_end { "past the end of the log" } else { "where the log holds no record of it" };
            out.problem(format!("{}: offset {o} names log position {} {what}", describe(key), e.position));
        }
    }
    Ok(out)
}

/// The first offset of queue `id` whose entry lies at or after `pos` (entries' positions grow
/// with their offsets), or the queue's next offset.
fn first_at_or_after(index: &Index, id: QueueId, pos: LogPosition) -> Result<Offset> {
    let first = index.first_offset(id)?;
    let next = index.last_offset(id)?.map_or(Offset(0), Offset::next);
    let (mut lo, mut hi) = (first.unwrap_or(next).get(), next.get());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match index.read(id, Offset(mid), 1)?.first() {
            Some((o, e)) if e.position < pos => lo = o.get() + 1,
            Some((o, _)) => hi = o.get().min(mid),
            None => hi = mid,
        }
    }
    Ok(Offset(lo))
}

/// Compares the queue's entry at its cursor with the record at `pos` (`len` bytes) that the
/// queue should hold next.
fn in_bad(bad: &[(LogPosition, LogPosition)], pos: LogPosition) -> bool {
    bad.iter().any(|(from, to)| (*from..*to).contains(&pos))
}

fn compare(
    index: &Index,
    out: &mut IndexCheck,
    key: &[u8],
    c: &mut Cursor,
    pos: LogPosition,
    len: u32,
    bad: &[(LogPosition, LogPosition)],
) -> Result<()> {
    loop {
        let Some((o, e)) = index.read(c.id, c.next, 1)?.first().copied() else {
            out.problem(format!(
                "{}: no entry for the record at log position {pos} (offset {})",
                describe(key),
                c.next
            ));
            return Ok(());
        };
        if o != c.next {
            out.problem(format!("{}: offsets {} to {} are missing", describe(key), c.next, Offset(o.get() - 1)));
            c.next = o;
        }
        if e.position > pos {
            out.problem(format!(
                "{}: no entry for the record at log position {pos} (offset {o} names {})",
                describe(key),
                e.position
            ));
            return Ok(());
        }
        if e.position < pos && in_bad(bad, e.position) {
            c.next = o.next();
            continue;
        }
        if e.position < pos {
            out.problem(format!(
                "{}: offset {o} names log position {} where the log holds no record of it",
                describe(key),
                e.position
            ));
            c.next = o.next();
            continue;
        }
        if e.size != len {
            out.problem(format!(
                "{}: offset {o} gives the record at log position {pos} {} bytes; the log holds {len}",
                describe(key),
                e.size
            ));
        }
        out.entries += 1;
        c.next = o.next();
        return Ok(());
    }
}
