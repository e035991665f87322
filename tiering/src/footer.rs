//! Segment objects: the sealed segment's bytes followed by a footer index, so a reader that
//! wants one stream or topic fetches only the byte ranges that hold it.
//!
//! Layout of an object: `segment bytes ‖ footer (JSON) ‖ footer length (u32 LE) ‖ "SILTFTR1"`.
//! Byte ranges in the footer are relative to the object start, which is the segment's base
//! position: log position `p` lives at object offset `p - base`.
//!
//! A gap batch (bytes that failed their checks locally and were quarantined, see
//! `silt_storage::format`) is a valid batch without records: the scan passes it through and
//! names it in [`Footer::gaps`]. A quarantined range the local copy could not be overwritten
//! in (it is then known to the storage engine only) is passed through as it is, unparsed, and
//! named there too; readers of the object never read inside a gap.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use silt_storage::QueueName;
use silt_storage::format::{self, RecordHead, SEGMENT_HEADER_LEN};
use silt_types::Partition;

pub const FOOTER_MAGIC: &[u8; 8] = b"SILTFTR1";
pub const TRAILER_LEN: usize = 12;

/// What one segment object holds, per topic and per stream partition.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Footer {
    pub format: u32,
    pub base: u64,
    pub end: u64,
    pub records: u64,
    pub min_ts: i64,
    pub max_ts: i64,
    /// MQTT topics (topic queues).
    pub topics: Vec<Span>,
    /// Stream partitions (`stream/partition`): the Kafka view and the internal streams.
    pub partitions: Vec<Span>,
    /// Where each consume queue's entries in this object start, so offsets survive the
    /// deletion of older objects (filled in by the uploader from the index).
    #[serde(default)]
    pub queues: Vec<QueueSpan>,
    /// Records whose content was kept off the object store (`tier = "local"` topics): the
    /// local segment is their only copy, so it is never evicted.
    #[serde(default)]
    pub withheld: u64,
    /// Records of `tier = "memory"` topics, also kept off the object store (as stand-ins like
    /// withheld ones) but gone after a restart anyway: they never hold a segment back.
    #[serde(default)]
    pub volatile: u64,
    /// Object byte ranges `[start, end)` of quarantined bytes (gap batches): their records were
    /// lost on the local disk before the upload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<(u64, u64)>,
}

/// A consume queue's entries in one object: offsets `[first, first + count)`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueSpan {
    /// `t:{topic}`, `p:{stream}/{partition}` or `f:{filter}`.
    pub name: String,
    pub first: u64,
    pub count: u64,
}

/// A queue's name in footers and the manifest.
pub fn queue_key(q: &QueueName) -> String {
    match q {
        QueueName::Topic(t) => format!("t:{t}"),
        QueueName::Partition { stream, partition } => format!("p:{stream}/{}", partition.get()),
        QueueName::Filter(f) => format!("f:{f}"),
    }
}

pub fn parse_queue_key(s: &str) -> Option<QueueName> {
    let (kind, rest) = s.split_at_checked(2)?;
    match kind {
        "t:" => Some(QueueName::Topic(rest.to_owned())),
        "f:" => Some(QueueName::Filter(rest.to_owned())),
        "p:" => {
            let (stream, p) = rest.rsplit_once('/')?;
            Some(QueueName::Partition { stream: stream.to_owned(), partition: Partition(p.parse().ok()?) })
        }
        _ => None,
    }
}

/// One queue's records in the object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub name: String,
    pub records: u64,
    pub bytes: u64,
    pub min_ts: i64,
    pub max_ts: i64,
    /// Object byte ranges `[start, end)` of the batches holding the queue's records.
    pub ranges: Vec<(u64, u64)>,
}

impl Span {
    fn add(&mut self, batch: (u64, u64), bytes: u64, ts: i64) {
        if self.records == 0 {
            self.min_ts = ts;
            self.max_ts = ts;
        }
        self.records += 1;
        self.bytes += bytes;
        self.min_ts = self.min_ts.min(ts);
        self.max_ts = self.max_ts.max(ts);
        match self.ranges.last_mut() {
            Some(last) if last.1 >= batch.0 => last.1 = last.1.max(batch.1),
            _ => self.ranges.push(batch),
        }
    }
}

/// Builds the footer of a sealed segment (`bytes` = the whole file, header included).
pub fn build(base: u64, bytes: &Bytes, max_batch_bytes: usize) -> Result<Footer, String> {
    let mut source = &bytes[..];
    let read = move |buf: &mut [u8]| -> Result<usize, String> {
        let n = buf.len().min(source.len());
        buf[..n].copy_from_slice(&source[..n]);
        source = &source[n..];
        Ok(n)
    };
    let len = bytes.len() as u64;
    scan(base, len, max_batch_bytes, &[], Chunks::new(read, ChunkPool::new(CHUNK, 0)), &|_, _| false, &mut |_| Ok(()))
}

/// Scans the sealed segment file at `path` (`len` bytes) once: checks every batch, builds the
/// footer, and hands the object's bytes to `emit` in order: the batches as stored, or, when
/// one of a batch's records is volatile or `withhold(topic, stream)` says so, that batch
/// re-encoded with those records replaced by same-length stand-ins (`Record::withhold`).
/// Reads [`CHUNK`] bytes at a time, and batches stored as they are leave in runs of up to
/// [`EMIT`] bytes (slices of the chunk, not copies), so memory stays at a chunk or two plus
/// what `emit`'s receiver holds, whatever the segment size. `gaps` are quarantined ranges
/// (object offsets) known from elsewhere, passed through unparsed.
#[allow(clippy::too_many_arguments)]
pub fn scan_file(
    path: &std::path::Path,
    base: u64,
    len: u64,
    max_batch_bytes: usize,
    gaps: &[(u64, u64)],
    pool: &Arc<ChunkPool>,
    withhold: &dyn Fn(&str, &str) -> bool,
    emit: &mut dyn FnMut(Bytes) -> Result<(), String>,
) -> Result<Footer, String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let read = |buf: &mut [u8]| file.read(buf).map_err(|e| format!("{}: {e}", path.display()));
    scan(base, len, max_batch_bytes, gaps, Chunks::new(read, pool.clone()), withhold, emit)
        .map_err(|e| if e == ENDS_EARLY { format!("{}: ends early", path.display()) } else { e })
}

/// Bytes read from a segment file at a time.
pub const CHUNK: usize = 4 << 20;
/// Most bytes handed to `emit` at once.
const EMIT: usize = 1 << 20;
const ENDS_EARLY: &str = "the segment ends early";

/// A segment's bytes read in chunks: a batch is a slice of the current chunk (one that
/// straddles two reads is copied once, into the next chunk), and the batches passed on as
/// they are leave as runs, slices of the chunk: one `emit` per run, not per batch (a segment
/// of small batches holds half a million).
struct Chunks<R> {
    read: R,
    /// Where chunk buffers come from and go back to.
    pool: Arc<ChunkPool>,
    cur: Bytes,
    /// Where the next batch starts in `cur`, and where the run not yet emitted starts.
    pos: usize,
    run: usize,
}

impl<R: FnMut(&mut [u8]) -> Result<usize, String>> Chunks<R> {
    fn new(read: R, pool: Arc<ChunkPool>) -> Self {
        Self { read, pool, cur: Bytes::new(), pos: 0, run: 0 }
    }

    /// The next `n` bytes, without taking them: emits the run first if it must read.
    fn peek(&mut self, n: usize, emit: &mut dyn FnMut(Bytes) -> Result<(), String>) -> Result<&[u8], String> {
        if self.cur.len() - self.pos < n {
            self.flush(emit)?;
            let mut next = self.pool.take(n);
            let carried = self.cur.len() - self.pos;
            next[..carried].copy_from_slice(&self.cur[self.pos..]);
            let mut filled = carried;
            while filled < n {
                let got = (self.read)(&mut next[filled..])?;
                if got == 0 {
                    return Err(ENDS_EARLY.into());
                }
                filled += got;
            }
            self.cur = Bytes::from_owner(Chunk { buf: next, len: filled, pool: self.pool.clone() });
            (self.pos, self.run) = (0, 0);
        }
        Ok(&self.cur[self.pos..self.pos + n])
    }

    /// Takes the next `n` bytes (peeked before) into the run: they leave as they are.
    fn keep(&mut self, n: usize, emit: &mut dyn FnMut(Bytes) -> Result<(), String>) -> Result<(), String> {
        self.pos += n;
        if self.pos - self.run >= EMIT {
            self.flush(emit)?;
        }
        Ok(())
    }

    /// The next `n` bytes (peeked before), taken out of the run: the caller emits something
    /// in their place.
    fn take(&mut self, n: usize, emit: &mut dyn FnMut(Bytes) -> Result<(), String>) -> Result<Bytes, String> {
        self.flush(emit)?;
        let out = self.cur.slice(self.pos..self.pos + n);
        self.pos += n;
        self.run = self.pos;
        Ok(out)
    }

    /// Emits the run.
    fn flush(&mut self, emit: &mut dyn FnMut(Bytes) -> Result<(), String>) -> Result<(), String> {
        if self.pos > self.run {
            emit(self.cur.slice(self.run..self.pos))?;
            self.run = self.pos;
        }
        Ok(())
    }
}

/// Read buffers for segment scans ([`CHUNK`] bytes each, for uploads), given back when the last slice of a
/// chunk is dropped (its bytes written to the store) and taken again for the next chunk.
///
/// Why: a scan's chunks live until the store has taken their bytes (up to a multipart part
/// and the parts in flight), and allocated afresh each time they came back as fresh pages:
/// in a profile of `fan-in --qos 1` under the default embedded config, their page faults (the
/// kernel zeroing each page before the scan wrote it) were 73 % of the broker's minor faults
/// and about 5 % of its CPU samples. Buffers kept here stay mapped. At most `keep` are kept;
/// [`ChunkPool::clear`] gives them all back (the uploader does once it has been idle a while).
#[derive(Debug)]
pub struct ChunkPool {
    free: std::sync::Mutex<Vec<Vec<u8>>>,
    size: usize,
    keep: usize,
}

impl ChunkPool {
    /// A pool of chunks of `size` bytes that keeps up to `keep` free ones.
    pub fn new(size: usize, keep: usize) -> Arc<Self> {
        Arc::new(Self { free: std::sync::Mutex::new(Vec::new()), size, keep })
    }

    /// A buffer of at least `n` bytes (of the pool's size unless `n` is larger): a kept one
    /// when there is one. Its bytes are whatever was there: the scan reads over them.
    fn take(&self, n: usize) -> Vec<u8> {
        if n <= self.size
            && let Some(buf) = self.free.lock().expect("invariant: lock not poisoned").pop()
        {
            return buf;
        }
        vec![0; self.size.max(n)]
    }

    fn give_back(&self, buf: Vec<u8>) {
        if buf.len() != self.size {
            return;
        }
        let mut free = self.free.lock().expect("invariant: lock not poisoned");
        if free.len() < self.keep {
            free.push(buf);
        }
    }

    /// Frees every kept buffer.
    pub fn clear(&self) {
        let kept = std::mem::take(&mut *self.free.lock().expect("invariant: lock not poisoned"));
        drop(kept);
    }

    /// Buffers kept now.
    pub fn kept(&self) -> usize {
        self.free.lock().expect("invariant: lock not poisoned").len()
    }
}

/// A chunk's bytes, shared by the slices made of it; back to its pool when the last is gone.
struct Chunk {
    buf: Vec<u8>,
    len: usize,
    pool: Arc<ChunkPool>,
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

/// The scan behind [`build`] and [`scan_file`].
fn scan<R: FnMut(&mut [u8]) -> Result<usize, String>>(
    base: u64,
    len: u64,
    max_batch_bytes: usize,
    gaps: &[(u64, u64)],
    mut src: Chunks<R>,
    withhold: &dyn Fn(&str, &str) -> bool,
    emit: &mut dyn FnMut(Bytes) -> Result<(), String>,
) -> Result<Footer, String> {
    let mut topics: BTreeMap<String, Span> = BTreeMap::new();
    // By stream, then partition: no name is formatted per record.
    let mut partitions: BTreeMap<String, BTreeMap<u32, Span>> = BTreeMap::new();
    let mut footer = Footer { format: 1, base, end: base + len, ..Footer::default() };
    let mut first = true;
    if len < SEGMENT_HEADER_LEN {
        return Err(format!("segment at {base} is shorter than its header"));
    }
    let header = src.peek(SEGMENT_HEADER_LEN as usize, emit)?;
    format::check_segment_header(header).map_err(|e| format!("segment at {base}: {e}"))?;
    src.keep(SEGMENT_HEADER_LEN as usize, emit)?;
    let mut at = SEGMENT_HEADER_LEN;
    while at < len {
        if let Some(&(_, end)) = gaps.iter().find(|(s, e)| *s == at && *e > at && *e <= len) {
            push_gap(&mut footer.gaps, (at, end));
            while at < end {
                let n = (EMIT as u64).min(end - at) as usize;
                src.peek(n, emit)?;
                src.keep(n, emit)?;
                at += n as u64;
            }
            continue;
        }
        let head = src.peek((format::FRAME_LEN as u64).min(len - at) as usize, emit)?;
        let total = format::peek_frame(head, max_batch_bytes)
            .map_err(|e| format!("segment at {base}, offset {at}: {e}"))?
            .ok_or_else(|| format!("segment at {base}: partial frame at offset {at}"))? as u64;
        if at + total > len {
            return Err(format!("segment at {base}: batch at offset {at} runs past the end"));
        }
        src.peek(total as usize, emit)?;
        let frame = src.cur.slice(src.pos..src.pos + total as usize);
        let view =
            format::check_batch(frame, max_batch_bytes).map_err(|e| format!("segment at {base}, offset {at}: {e}"))?;
        let range = (at, at + total);
        if view.gap {
            push_gap(&mut footer.gaps, range);
            src.keep(total as usize, emit)?;
            at += total;
            continue;
        }
        let mut withheld = Vec::new();
        for (i, &(off, rlen)) in view.records.iter().enumerate() {
            let rec = &view.frame[off as usize..(off + rlen) as usize];
            let head = RecordHead::decode(rec).map_err(|e| format!("segment at {base}: {e}"))?;
            if head.control {
                continue;
            }
            if head.volatile {
                withheld.push(i);
                footer.volatile += 1;
            } else if withhold(head.topic, head.stream) {
                withheld.push(i);
                footer.withheld += 1;
            }
            let ts = head.timestamp.get();
            if first {
                footer.min_ts = ts;
                footer.max_ts = ts;
                first = false;
            }
            footer.records += 1;
            footer.min_ts = footer.min_ts.min(ts);
            footer.max_ts = footer.max_ts.max(ts);
            if !head.topic.is_empty() {
                span(&mut topics, head.topic).add(range, u64::from(rlen), ts);
            }
            if !head.stream.is_empty() {
                let by_partition = match partitions.get_mut(head.stream) {
                    Some(p) => p,
                    None => partitions.entry(head.stream.to_owned()).or_default(),
                };
                by_partition
                    .entry(head.partition.get())
                    .or_insert_with(|| Span {
                        name: format!("{}/{}", head.stream, head.partition.get()),
                        ..Span::default()
                    })
                    .add(range, u64::from(rlen), ts);
            }
        }
        if withheld.is_empty() {
            src.keep(total as usize, emit)?;
        } else {
            src.take(total as usize, emit)?;
            emit(withhold_records(&view, &withheld, max_batch_bytes, base)?)?;
        }
        at += total;
    }
    src.flush(emit)?;
    footer.topics = topics.into_values().collect();
    footer.partitions = partitions.into_values().flat_map(BTreeMap::into_values).collect();
    footer.partitions.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(footer)
}

/// The batch re-encoded with records `which` withheld: same length, same record offsets.
fn withhold_records(view: &format::BatchView, which: &[usize], max: usize, base: u64) -> Result<Bytes, String> {
    let mut records = Vec::with_capacity(view.records.len());
    for i in 0..view.records.len() {
        let r = view.record(i).map_err(|e| format!("segment at {base}: {e}"))?;
        records.push(if which.contains(&i) { r.withhold() } else { r });
    }
    let enc = format::encode_batch(&records, max).map_err(|e| format!("segment at {base}: {e}"))?;
    if enc.frame.len() != view.frame.len() || enc.records != view.records {
        return Err(format!("segment at {base}: a withheld batch would change its layout"));
    }
    Ok(Bytes::from(enc.frame))
}

/// Adds a gap range, merging it with the previous one when they touch.
fn push_gap(gaps: &mut Vec<(u64, u64)>, range: (u64, u64)) {
    match gaps.last_mut() {
        Some(last) if last.1 == range.0 => last.1 = range.1,
        _ => gaps.push(range),
    }
}

fn span<'m>(map: &'m mut BTreeMap<String, Span>, name: &str) -> &'m mut Span {
    if !map.contains_key(name) {
        map.insert(name.to_owned(), Span { name: name.to_owned(), ..Span::default() });
    }
    map.get_mut(name).expect("invariant: inserted above")
}

/// What follows the segment bytes in the object: the footer and the trailer.
pub fn encode_tail(footer: &Footer) -> Bytes {
    let mut out = serde_json::to_vec(footer).expect("invariant: the footer serializes");
    let n = out.len() as u32;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(FOOTER_MAGIC);
    Bytes::from(out)
}

/// Parses the trailer (the last [`TRAILER_LEN`] bytes of an object): the footer's length.
pub fn footer_len(trailer: &[u8]) -> Result<usize, String> {
    if trailer.len() != TRAILER_LEN || &trailer[4..] != FOOTER_MAGIC {
        return Err("object has no Silt footer".into());
    }
    Ok(u32::from_le_bytes(trailer[..4].try_into().expect("invariant: 4 bytes")) as usize)
}

/// Where the footer of an object of `object_size` bytes lies, given its trailer (the last
/// [`TRAILER_LEN`] bytes): the object byte range to fetch and [`decode`]. A length that does
/// not fit in the object before the trailer is refused: the object's bytes are not trusted.
pub fn footer_range(object_size: u64, trailer: &[u8]) -> Result<std::ops::Range<u64>, String> {
    let n = footer_len(trailer)? as u64;
    let end = object_size.checked_sub(TRAILER_LEN as u64).ok_or("object shorter than its trailer")?;
    let start = end.checked_sub(n).ok_or_else(|| format!("a footer of {n} bytes in an object of {object_size}"))?;
    Ok(start..end)
}

pub fn decode(json: &[u8]) -> Result<Footer, String> {
    serde_json::from_slice(json).map_err(|e| format!("footer: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use silt_storage::Record;
    use silt_types::Timestamp;

    #[test]
    fn queue_keys_round_trip() {
        for q in [
            QueueName::Topic("a/b".into()),
            QueueName::Filter("a/+/#".into()),
            QueueName::Partition { stream: "__silt_sessions".into(), partition: Partition(3) },
        ] {
            assert_eq!(parse_queue_key(&queue_key(&q)), Some(q));
        }
        assert_eq!(parse_queue_key("x:y"), None);
    }

    fn rec(stream: &str, topic: &str, ts: i64, v: &str) -> Record {
        Record {
            timestamp: Timestamp(ts),
            stream: stream.into(),
            partition: Partition(0),
            topic: topic.into(),
            value: Bytes::copy_from_slice(v.as_bytes()),
            ..Record::default()
        }
    }

    #[test]
    fn footer_indexes_topics_and_partitions_with_byte_ranges() {
        let mut seg = format::segment_header().to_vec();
        let b1 = format::encode_batch(&[rec("a", "a/1", 10, "x"), rec("a", "a/2", 11, "y")], 1 << 20).unwrap();
        let b2 = format::encode_batch(&[rec("b", "b/1", 5, "z")], 1 << 20).unwrap();
        let b3 = format::encode_batch(&[rec("a", "a/1", 20, "w")], 1 << 20).unwrap();
        let (l1, l2, l3) = (b1.frame.len() as u64, b2.frame.len() as u64, b3.frame.len() as u64);
        seg.extend_from_slice(&b1.frame);
        seg.extend_from_slice(&b2.frame);
        seg.extend_from_slice(&b3.frame);
        let f = build(1000, &Bytes::from(seg), 1 << 20).unwrap();
        assert_eq!((f.base, f.end, f.records, f.min_ts, f.max_ts), (1000, 1000 + 16 + l1 + l2 + l3, 4, 5, 20));
        let a1 = f.topics.iter().find(|s| s.name == "a/1").unwrap();
        assert_eq!(a1.records, 2);
        assert_eq!(a1.ranges, vec![(16, 16 + l1), (16 + l1 + l2, 16 + l1 + l2 + l3)]);
        let pa = f.partitions.iter().find(|s| s.name == "a/0").unwrap();
        assert_eq!((pa.records, pa.min_ts, pa.max_ts), (3, 10, 20));
        let pb = f.partitions.iter().find(|s| s.name == "b/0").unwrap();
        assert_eq!(pb.ranges, vec![(16 + l1, 16 + l1 + l2)]);

        let all: Vec<u8> = [b"seg".as_slice(), &encode_tail(&f)].concat();
        let n = footer_len(&all[all.len() - TRAILER_LEN..]).unwrap();
        let json = &all[all.len() - TRAILER_LEN - n..all.len() - TRAILER_LEN];
        assert_eq!(decode(json).unwrap(), f);
        assert!(footer_len(b"not a trailer").is_err());
    }

    /// A segment of many small batches, one in ten holding a record of the withheld topic
    /// `secret/x`: the file's bytes and what the object must hold.
    fn segment_with_secrets(batches: usize) -> (Vec<u8>, Vec<u8>) {
        let mut file = format::segment_header().to_vec();
        let mut object = file.clone();
        for i in 0..batches {
            let topic = if i % 10 == 3 { "secret/x" } else { "open/x" };
            let b = format::encode_batch(&[rec("s", topic, i as i64, "payload")], 1 << 20).unwrap();
            file.extend_from_slice(&b.frame);
            let view = format::check_batch(Bytes::from(b.frame), 1 << 20).unwrap();
            match topic {
                "secret/x" => object.extend_from_slice(&withhold_records(&view, &[0], 1 << 20, 0).unwrap()),
                _ => object.extend_from_slice(&view.frame),
            }
        }
        (file, object)
    }

    fn scan_in_chunks(file: &[u8], chunk: usize) -> (Footer, Vec<Bytes>) {
        scan_with(file, &ChunkPool::new(chunk, 0))
    }

    fn scan_with(file: &[u8], pool: &Arc<ChunkPool>) -> (Footer, Vec<Bytes>) {
        let mut source = file;
        let read = |buf: &mut [u8]| -> Result<usize, String> {
            let n = buf.len().min(source.len());
            buf[..n].copy_from_slice(&source[..n]);
            source = &source[n..];
            Ok(n)
        };
        let mut emitted = Vec::new();
        let withhold = |topic: &str, _: &str| topic.starts_with("secret/");
        let footer = scan(0, file.len() as u64, 1 << 20, &[], Chunks::new(read, pool.clone()), &withhold, &mut |b| {
            emitted.push(b);
            Ok(())
        })
        .unwrap();
        (footer, emitted)
    }

    #[test]
    fn the_object_holds_every_batch_with_withheld_records_replaced_whatever_the_chunk_size() {
        let (file, object) = segment_with_secrets(500);
        let whole = build(0, &Bytes::from(file.clone()), 1 << 20).unwrap();
        // Chunks smaller than a batch, not a multiple of it, and larger than the file.
        for chunk in [7, 100, 1000, 4096, 1 << 20] {
            let (footer, emitted) = scan_in_chunks(&file, chunk);
            assert_eq!(emitted.concat(), object, "chunk {chunk}");
            assert_eq!((footer.records, footer.withheld), (500, 50), "chunk {chunk}");
            assert_eq!(footer.topics, whole.topics, "chunk {chunk}");
            assert_eq!(footer.partitions, whole.partitions, "chunk {chunk}");
        }
    }

    #[test]
    fn reused_chunk_buffers_never_show_their_old_bytes() {
        // A pool of small chunks keeping three: the emitted bytes are copied out and dropped
        // at once, so each chunk goes back and the next read lands in a buffer that still
        // holds an earlier chunk's bytes, mid-batch straddles included.
        let (file, object) = segment_with_secrets(500);
        let plain: Vec<u8> = [format::segment_header().to_vec()]
            .into_iter()
            .chain((0..300).map(|i| format::encode_batch(&[rec("s", "open/y", i, "other")], 1 << 20).unwrap().frame))
            .collect::<Vec<Vec<u8>>>()
            .concat();
        for chunk in [100, 1000, 4096] {
            let pool = ChunkPool::new(chunk, 3);
            for (file, object) in [(&file, &object), (&plain, &plain), (&file, &object)] {
                let mut source = &file[..];
                let read = |buf: &mut [u8]| -> Result<usize, String> {
                    let n = buf.len().min(source.len());
                    buf[..n].copy_from_slice(&source[..n]);
                    source = &source[n..];
                    Ok(n)
                };
                let mut copied = Vec::new();
                let withhold = |topic: &str, _: &str| topic.starts_with("secret/");
                scan(0, file.len() as u64, 1 << 20, &[], Chunks::new(read, pool.clone()), &withhold, &mut |b| {
                    copied.extend_from_slice(&b);
                    Ok(())
                })
                .unwrap();
                assert_eq!(&copied, object, "chunk {chunk}");
                assert!((1..=3).contains(&pool.kept()), "chunk {chunk}: {} kept", pool.kept());
            }
            pool.clear();
            assert_eq!(pool.kept(), 0);
        }
    }

    #[test]
    fn a_pool_keeps_no_more_buffers_than_asked_and_none_of_another_size() {
        let (file, object) = segment_with_secrets(500);
        let pool = ChunkPool::new(100, 4);
        // Held, as an upload holds them until the store has them: every chunk is out at once.
        let (_, emitted) = scan_with(&file, &pool);
        assert_eq!(pool.kept(), 0);
        assert_eq!(emitted.concat(), object);
        drop(emitted);
        assert_eq!(pool.kept(), 4);
        // A batch larger than a chunk gets a buffer of its own size, not kept after.
        let big = format::encode_batch(&[rec("s", "open/z", 1, &"v".repeat(500))], 1 << 20).unwrap().frame;
        let file = [format::segment_header().to_vec(), big].concat();
        pool.clear();
        let (_, emitted) = scan_with(&file, &pool);
        assert_eq!(emitted.concat(), file);
        drop(emitted);
        assert!(pool.kept() <= 1, "{} kept", pool.kept());
    }

    #[test]
    fn batches_stored_as_they_are_leave_in_runs_not_one_by_one() {
        let (file, object) = segment_with_secrets(500);
        let (_, emitted) = scan_in_chunks(&file, CHUNK);
        assert_eq!(emitted.concat(), object);
        // Each withheld batch is emitted alone and splits the run around it: 50 of them, so
        // 101 pieces, where one per batch would be 501.
        assert_eq!(emitted.len(), 101);
        // Without withheld records the whole segment (under 1 MiB) is one piece.
        let plain: Vec<u8> = [format::segment_header().to_vec()]
            .into_iter()
            .chain((0..500).map(|i| format::encode_batch(&[rec("s", "open/x", i, "p")], 1 << 20).unwrap().frame))
            .collect::<Vec<Vec<u8>>>()
            .concat();
        let (_, emitted) = scan_in_chunks(&plain, CHUNK);
        assert_eq!(emitted, vec![Bytes::from(plain)]);
    }

    #[test]
    fn a_partition_span_is_named_stream_slash_partition_and_listed_in_name_order() {
        let mut seg = format::segment_header().to_vec();
        for p in [10u32, 2, 1] {
            let r = Record { partition: Partition(p), ..rec("a", "a/x", 1, "v") };
            seg.extend_from_slice(&format::encode_batch(&[r], 1 << 20).unwrap().frame);
        }
        let f = build(0, &Bytes::from(seg), 1 << 20).unwrap();
        let names: Vec<&str> = f.partitions.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a/1", "a/10", "a/2"]);
    }
}
