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
    let mut source = bytes.clone();
    let len = bytes.len() as u64;
    let read = move |n: usize| -> Result<Bytes, String> {
        if n > source.len() {
            return Err("short read".into());
        }
        Ok(source.split_to(n))
    };
    scan(base, len, max_batch_bytes, &[], read, &|_, _| false, &mut |_| Ok(()))
}

/// Scans the sealed segment file at `path` (`len` bytes) once: checks every batch, builds the
/// footer, and hands the object's bytes to `emit` in order — each batch as stored, or, when
/// one of its records is volatile or `withhold(topic, stream)` says so, re-encoded with those
/// records replaced by same-length stand-ins (`Record::withhold`). Reads 4 MiB at a time, so memory
/// stays at one read plus one batch whatever the segment size. `gaps` are quarantined ranges
/// (object offsets) known from elsewhere, passed through unparsed.
pub fn scan_file(
    path: &std::path::Path,
    base: u64,
    len: u64,
    max_batch_bytes: usize,
    gaps: &[(u64, u64)],
    withhold: &dyn Fn(&str, &str) -> bool,
    emit: &mut dyn FnMut(Bytes) -> Result<(), String>,
) -> Result<Footer, String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut buf = bytes::BytesMut::new();
    let read = |n: usize| -> Result<Bytes, String> {
        while buf.len() < n {
            let want = (4usize << 20).max(n - buf.len());
            let start = buf.len();
            buf.resize(start + want, 0);
            let got = file.read(&mut buf[start..]).map_err(|e| format!("{}: {e}", path.display()))?;
            buf.truncate(start + got);
            if got == 0 {
                return Err(format!("{}: ends early", path.display()));
            }
        }
        Ok(buf.split_to(n).freeze())
    };
    scan(base, len, max_batch_bytes, gaps, read, withhold, emit)
}

/// The scan behind [`build`] and [`scan_file`]: `read(n)` returns the next `n` bytes.
fn scan(
    base: u64,
    len: u64,
    max_batch_bytes: usize,
    gaps: &[(u64, u64)],
    mut read: impl FnMut(usize) -> Result<Bytes, String>,
    withhold: &dyn Fn(&str, &str) -> bool,
    emit: &mut dyn FnMut(Bytes) -> Result<(), String>,
) -> Result<Footer, String> {
    let mut topics: BTreeMap<String, Span> = BTreeMap::new();
    let mut partitions: BTreeMap<String, Span> = BTreeMap::new();
    let mut footer = Footer { format: 1, base, end: base + len, ..Footer::default() };
    let mut first = true;
    if len < SEGMENT_HEADER_LEN {
        return Err(format!("segment at {base} is shorter than its header"));
    }
    let header = read(SEGMENT_HEADER_LEN as usize)?;
    format::check_segment_header(&header).map_err(|e| format!("segment at {base}: {e}"))?;
    emit(header)?;
    let mut at = SEGMENT_HEADER_LEN;
    while at < len {
        if let Some(&(_, end)) = gaps.iter().find(|(s, e)| *s == at && *e > at && *e <= len) {
            push_gap(&mut footer.gaps, (at, end));
            while at < end {
                let n = (4u64 << 20).min(end - at);
                emit(read(n as usize)?)?;
                at += n;
            }
            continue;
        }
        let head = read((format::FRAME_LEN as u64).min(len - at) as usize)?;
        let total = format::peek_frame(&head, max_batch_bytes)
            .map_err(|e| format!("segment at {base}, offset {at}: {e}"))?
            .ok_or_else(|| format!("segment at {base}: partial frame at offset {at}"))? as u64;
        if at + total > len {
            return Err(format!("segment at {base}: batch at offset {at} runs past the end"));
        }
        let rest = read((total - head.len() as u64) as usize)?;
        let frame = Bytes::from([head.as_ref(), rest.as_ref()].concat());
        let view =
            format::check_batch(frame, max_batch_bytes).map_err(|e| format!("segment at {base}, offset {at}: {e}"))?;
        let range = (at, at + total);
        if view.gap {
            push_gap(&mut footer.gaps, range);
            emit(view.frame)?;
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
                let name = format!("{}/{}", head.stream, head.partition.get());
                span(&mut partitions, &name).add(range, u64::from(rlen), ts);
            }
        }
        if withheld.is_empty() {
            emit(view.frame)?;
        } else {
            emit(withhold_records(&view, &withheld, max_batch_bytes, base)?)?;
        }
        at += total;
    }
    footer.topics = topics.into_values().collect();
    footer.partitions = partitions.into_values().collect();
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
}
