//! The tiering manifest's decoders: a stored version as the object store hands it back
//! (`Manifest::decode`, arbitrary bytes), and a stored delta resolved against its checkpoint
//! (`ManifestLog::resolve`).
//!
//! Besides "never panic": whatever decodes encodes (compact and pretty, as `commit` writes it)
//! and decodes back to itself; and for a manifest that grew from a checkpoint the way writers
//! grow it (retention moves the start, objects are appended, queue floors are added or raised,
//! tails change), the stored form written against that checkpoint decodes and resolves to the
//! manifest itself.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use silt_tiering::manifest::{Manifest, ManifestLog, ObjectEntry, TailEntry};

#[derive(Arbitrary, Debug)]
enum Input {
    Bytes(Vec<u8>),
    Grown(Grown),
}

#[derive(Arbitrary, Debug)]
struct Grown {
    checkpoint: ArbManifest,
    /// Versions after the checkpoint's.
    later: u8,
    /// How many of the checkpoint's objects retention drops.
    dropped: u8,
    /// Objects appended after the checkpoint's end: (length, gap lengths).
    added: Vec<(u16, Vec<u8>)>,
    floors: Vec<(String, u64)>,
    tails: Vec<(String, u16)>,
    epoch: u64,
}

#[derive(Arbitrary, Debug)]
struct ArbManifest {
    version: u32,
    epoch: u64,
    writer: String,
    start: u32,
    objects: Vec<(String, u16, i64, i64)>,
    floors: Vec<(String, u64)>,
}

fn objects_from(start: u64, specs: impl IntoIterator<Item = (String, u16, i64, i64)>) -> Vec<ObjectEntry> {
    let mut at = start;
    specs
        .into_iter()
        .map(|(key, len, min_ts, max_ts)| {
            let base = at;
            at += u64::from(len) + 1;
            ObjectEntry { key, base, end: at, size: at - base + 12, min_ts, max_ts, gaps: Vec::new(), streams: Default::default() }
        })
        .collect()
}

fn check_round_trip(m: &Manifest) {
    let compact = serde_json::to_vec(m).expect("a manifest serializes");
    assert_eq!(Manifest::decode(&compact).as_ref().ok(), Some(m), "compact JSON did not round-trip");
    let pretty = serde_json::to_vec_pretty(m).expect("a manifest serializes");
    assert_eq!(Manifest::decode(&pretty).as_ref().ok(), Some(m), "pretty JSON did not round-trip");
}

fuzz_target!(|input: Input| match input {
    Input::Bytes(bytes) => {
        if let Ok(m) = Manifest::decode(&bytes) {
            check_round_trip(&m);
            // A stored version resolved against itself or nothing never panics.
            let _ = ManifestLog::resolve(m.clone(), Some(&m));
            let _ = ManifestLog::resolve(m.clone(), None);
        }
    }
    Input::Grown(g) => {
        let c = g.checkpoint;
        let cp = Manifest {
            format: 1,
            version: u64::from(c.version),
            epoch: c.epoch,
            writer: c.writer,
            start: u64::from(c.start),
            objects: objects_from(u64::from(c.start), c.objects),
            queue_floors: c.floors.into_iter().collect(),
            tails: Vec::new(),
            base: None,
        };
        check_round_trip(&cp);
        let mut m = cp.clone();
        m.version = cp.version + 1 + u64::from(g.later);
        m.epoch = g.epoch;
        let dropped = usize::from(g.dropped).min(m.objects.len());
        m.objects.drain(..dropped);
        m.start = m.objects.first().map_or(cp.end(), |o| o.base);
        let mut end = cp.end();
        for (len, gaps) in g.added {
            let base = end;
            end += u64::from(len) + 1;
            let mut at = base;
            let gaps = gaps
                .into_iter()
                .filter_map(|n| {
                    let s = at;
                    at += u64::from(n);
                    (at < end).then_some((s, at))
                })
                .collect();
            m.objects.push(ObjectEntry {
                key: format!("segments/{base:020}"),
                base,
                end,
                size: end - base + 12,
                min_ts: 0,
                max_ts: 0,
                gaps,
                streams: Default::default(),
            });
        }
        let floors: BTreeMap<String, u64> = g.floors.into_iter().collect();
        for (k, v) in floors {
            let e = m.queue_floors.entry(k).or_default();
            *e = (*e).max(v);
        }
        let mut t = m.end();
        m.tails = g
            .tails
            .into_iter()
            .map(|(key, n)| {
                let base = t;
                t += u64::from(n);
                TailEntry { key, base, end: t }
            })
            .collect();
        check_round_trip(&m);

        let stored = ManifestLog::stored_form(&m, Some(&cp));
        check_round_trip(&stored);
        let bytes = serde_json::to_vec_pretty(&stored).expect("a manifest serializes");
        let back = Manifest::decode(&bytes).expect("a stored form decodes");
        assert_eq!(
            ManifestLog::resolve(back, Some(&cp)).as_ref(),
            Some(&m),
            "the stored form resolved to another manifest"
        );
    }
});
