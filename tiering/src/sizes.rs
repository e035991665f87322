//! Per-stream sizes, on the local disk and in the bucket, from the manifest's per-object
//! figures.
//!
//! Each segment object's manifest entry names its record bytes per stream
//! ([`ObjectEntry::streams`], from the footer the uploader builds anyway), so nothing on the
//! append path counts. A stream's bucket size is the sum over the manifest's objects (retention
//! drops them); its local size the sum over those objects whose segment is still on the local
//! disk (not evicted). Both survive a restart and a recovery from the bucket.
//!
//! Not guaranteed: the figures are record bytes. What no stream is named for is counted as
//! `other`: batch framing, segment headers and footers, objects uploaded before entries carried
//! per-stream figures, and, locally, the tail not yet uploaded (sealed segments waiting for the
//! uploader, and the active segment) — counted whole as local log bytes, not scanned. Tail
//! objects of `ack = "object"` topics are not in the bucket figures (the segment object that
//! replaces them is).

use std::collections::{BTreeMap, HashSet};

use silt_storage::SealedSegment;
use silt_types::LogPosition;

use crate::manifest::{Manifest, ObjectEntry};

/// One stream's record bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamBytes {
    pub local: u64,
    pub bucket: u64,
}

/// Every stream's record bytes, and the bytes held that no stream is named for (see the module
/// doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamSizes {
    pub streams: BTreeMap<String, StreamBytes>,
    pub other: StreamBytes,
}

/// What [`compute`] needs of a manifest entry, kept beside the manifest after each commit.
#[derive(Clone, Debug)]
pub(crate) struct ObjectSizes {
    base: u64,
    end: u64,
    size: u64,
    streams: BTreeMap<String, u64>,
}

pub(crate) fn of_manifest(m: &Manifest) -> Vec<ObjectSizes> {
    m.objects.iter().map(of_entry).collect()
}

fn of_entry(o: &ObjectEntry) -> ObjectSizes {
    ObjectSizes { base: o.base, end: o.end, size: o.size, streams: o.streams.clone() }
}

/// The sizes, given the manifest's objects, the sealed segments on the local disk and the
/// active segment's span (`[base, written end)`).
pub(crate) fn compute(
    objects: &[ObjectSizes],
    local: &[SealedSegment],
    active: (LogPosition, LogPosition),
) -> StreamSizes {
    let on_disk: HashSet<u64> = local.iter().map(|s| s.base.get()).collect();
    let mut out = StreamSizes::default();
    let mut uploaded = HashSet::with_capacity(objects.len());
    for o in objects {
        uploaded.insert(o.base);
        let here = on_disk.contains(&o.base);
        let mut named = 0;
        for (name, &bytes) in &o.streams {
            let e = out.streams.entry(name.clone()).or_default();
            e.bucket += bytes;
            if here {
                e.local += bytes;
            }
            named += bytes;
        }
        out.other.bucket += o.size.saturating_sub(named);
        if here {
            out.other.local += (o.end - o.base).saturating_sub(named);
        }
    }
    for s in local.iter().filter(|s| !uploaded.contains(&s.base.get())) {
        out.other.local += s.end.get() - s.base.get();
    }
    out.other.local += active.1.get().saturating_sub(active.0.get());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(base: u64, end: u64, streams: &[(&str, u64)]) -> ObjectSizes {
        let streams = streams.iter().map(|&(n, b)| (n.to_owned(), b)).collect();
        ObjectSizes { base, end, size: end - base + 10, streams }
    }

    fn segment(base: u64, end: u64) -> SealedSegment {
        SealedSegment { base: LogPosition(base), end: LogPosition(end), path: Default::default() }
    }

    /// An evicted object counts in the bucket only; an uploaded one still on disk in both; a
    /// sealed segment not yet uploaded and the active segment count as local `other` bytes.
    #[test]
    fn evicted_objects_count_in_the_bucket_and_the_tail_as_other_local_bytes() {
        let objects = [object(0, 100, &[("a", 60), ("b", 20)]), object(100, 200, &[("a", 50)]), object(200, 300, &[])];
        let local = [segment(100, 200), segment(200, 300), segment(300, 400)];
        let s = compute(&objects, &local, (LogPosition(400), LogPosition(450)));
        assert_eq!(s.streams["a"], StreamBytes { local: 50, bucket: 110 });
        assert_eq!(s.streams["b"], StreamBytes { local: 0, bucket: 20 });
        // Bucket: 30 + 60 + 110 unnamed; local: 50 + 100 (an old object) + 100 (not uploaded) + 50.
        assert_eq!(s.other, StreamBytes { local: 300, bucket: 200 });
    }
}
