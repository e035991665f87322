//! The storage engine through its public API: appends, consume queues, multi-dispatch,
//! restarts, segment rolls and index rebuilds.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use proptest::prelude::*;
use silt_storage::{ErrorKind, FsyncPolicy, QueueName, Record, Storage, StorageConfig};
use silt_types::{Partition, TopicFilter, filter_matches};

#[test]
fn appended_records_read_back_by_stream_topic_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let recs = vec![record("sensors", 0, "sensors/a/temp", "21.5"), record("sensors", 1, "sensors/b/temp", "19")];
    let a = s.append_blocking(&recs).unwrap();
    assert_eq!(a.positions.len(), 2);
    s.wait_dispatched_blocking(a.end).unwrap();
    assert_eq!(queue(&s, &topic("sensors/a/temp")), vec![recs[0].clone()]);
    let p1 = QueueName::Partition { stream: "sensors".into(), partition: Partition(1) };
    assert_eq!(queue(&s, &p1), vec![recs[1].clone()]);
    let id = s.queue_id(&topic("sensors/b/temp")).unwrap().unwrap();
    let (_, entry) = s.read_index(id, silt_types::Offset(0), 1).unwrap()[0];
    assert_eq!(entry.position, a.positions[1]);
}

#[test]
fn offsets_stay_dense_across_restarts_and_segment_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected = Vec::new();
    for round in 0..3 {
        let s = open(dir.path());
        for i in 0..400 {
            let r = record("s", 0, "a/b", format!("{round}-{i}-{}", "x".repeat(200)));
            s.append_blocking(std::slice::from_ref(&r)).unwrap();
            expected.push(r);
        }
        s.close().unwrap();
    }
    let s = open(dir.path());
    assert!(s.sealed_segments().len() >= 3, "rolled at 64 KiB");
    assert_eq!(queue(&s, &topic("a/b")), expected);
    let p = QueueName::Partition { stream: "s".into(), partition: Partition(0) };
    assert_eq!(queue(&s, &p), expected);
}

#[test]
fn a_roll_with_nothing_after_it_is_fully_indexed_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let r = record("s", 0, "a/b", "v");
    s.append_blocking(std::slice::from_ref(&r)).unwrap();
    let sealed = block_on_rt(s.roll()).unwrap();
    assert_eq!(s.sealed_segments().last().unwrap().end, sealed);
    s.close().unwrap();
    let s = open(dir.path());
    // The log now ends on the empty segment's header; waiting for it must not hang.
    let end = s.stats().log_end;
    let (tx, rx) = std::sync::mpsc::channel();
    let s = Arc::new(s);
    let s2 = s.clone();
    std::thread::spawn(move || tx.send(s2.wait_dispatched_blocking(end)).unwrap());
    rx.recv_timeout(std::time::Duration::from_secs(10)).expect("dispatch reached the end of the log").unwrap();
    assert_eq!(queue(&s, &topic("a/b")), vec![r]);
}

fn block_on_rt<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
}

#[test]
fn concurrent_appenders_share_group_commits_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(open_with_fsync(dir.path(), FsyncPolicy::Always));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                (0..200)
                    .map(|i| s.append_blocking(&[record("s", 0, &format!("t/{t}"), format!("{t}:{i}"))]).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut positions: Vec<_> = threads.into_iter().flat_map(|h| h.join().unwrap()).map(|a| a.positions[0]).collect();
    let end = s.stats().log_end;
    s.wait_dispatched_blocking(end).unwrap();
    positions.sort();
    positions.dedup();
    assert_eq!(positions.len(), 1600);
    for t in 0..8 {
        let got: Vec<Bytes> = queue(&s, &topic(&format!("t/{t}"))).into_iter().map(|r| r.value).collect();
        let want: Vec<Bytes> = (0..200).map(|i| Bytes::from(format!("{t}:{i}"))).collect();
        assert_eq!(got, want, "per-appender order is kept");
    }
}

#[test]
fn filter_queue_holds_exactly_the_matching_records_after_registration() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    s.append_blocking(&[record("d", 0, "devices/1/telemetry", "before")]).unwrap();
    let f = TopicFilter::new("devices/+/telemetry").unwrap();
    let id = s.register_filter_blocking(&f).unwrap();
    assert_eq!(s.register_filter_blocking(&f).unwrap(), id, "registration is idempotent");
    let a = s
        .append_blocking(&[
            record("d", 0, "devices/1/telemetry", "one"),
            record("d", 0, "devices/2/status", "not matched"),
            record("d", 0, "devices/2/telemetry", "two"),
        ])
        .unwrap();
    s.wait_dispatched_blocking(a.end).unwrap();
    let got: Vec<Bytes> = queue(&s, &filter("devices/+/telemetry")).into_iter().map(|r| r.value).collect();
    assert_eq!(got, vec![Bytes::from("one"), Bytes::from("two")]);

    s.drop_filter_blocking(&f).unwrap();
    assert_eq!(s.queue_id(&filter("devices/+/telemetry")).unwrap(), None);
    let a = s.append_blocking(&[record("d", 0, "devices/3/telemetry", "after drop")]).unwrap();
    s.wait_dispatched_blocking(a.end).unwrap();
    assert_eq!(s.queue_id(&filter("devices/+/telemetry")).unwrap(), None);
}

/// Keeps the topics and filters each dispatch round names.
#[derive(Default)]
struct Rounds(std::sync::Mutex<Vec<(Vec<String>, Vec<String>)>>);

impl silt_storage::DispatchListener for Rounds {
    fn dispatched(&self, event: &silt_storage::Dispatched) {
        self.0.lock().unwrap().push((event.topics.clone(), event.filters.clone()));
    }
}

impl Rounds {
    /// The topics and the filters named so far, sorted, each once; waits (up to 10 s) until
    /// `done` holds of them, as listeners are told just after a round's progress is announced.
    fn until(&self, done: impl Fn(&[String], &[String]) -> bool) -> (Vec<String>, Vec<String>) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let (mut topics, mut filters) = (Vec::new(), Vec::new());
            for (t, f) in self.0.lock().unwrap().iter() {
                let mut unique = f.clone();
                unique.sort();
                unique.dedup();
                assert_eq!(&unique, f, "a round names each filter once");
                topics.extend(t.iter().cloned());
                filters.extend(f.iter().cloned());
            }
            for v in [&mut topics, &mut filters] {
                v.sort();
                v.dedup();
            }
            if done(&topics, &filters) || std::time::Instant::now() > deadline {
                return (topics, filters);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

#[test]
fn a_round_names_the_filters_whose_queues_it_added_to_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let rounds = Arc::new(Rounds::default());
    let s = Storage::open_with(dir.path(), small_config(), vec![rounds.clone()]).unwrap();
    for f in ["devices/+/telemetry", "devices/#", "other/#"] {
        s.register_filter_blocking(&TopicFilter::new(f).unwrap()).unwrap();
    }
    // A registration names its filter (a record in the same round may have gone to it).
    let (_, filters) = rounds.until(|_, f| f.len() == 3);
    assert_eq!(filters, ["devices/#", "devices/+/telemetry", "other/#"]);
    rounds.0.lock().unwrap().clear();
    s.append_blocking(&[
        record("d", 0, "devices/1/telemetry", "one"),
        record("d", 0, "devices/2/status", "two"),
        record("d", 0, "devices/3/telemetry", "three"),
    ])
    .unwrap();
    let (topics, filters) = rounds.until(|t, _| t.len() == 3);
    assert_eq!(topics, ["devices/1/telemetry", "devices/2/status", "devices/3/telemetry"]);
    assert_eq!(filters, ["devices/#", "devices/+/telemetry"], "other/# received nothing");
}

#[test]
fn deleted_index_is_rebuilt_identically_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let names = [topic("a/x"), topic("b/y"), filter("a/#"), filter("+/y"), filter("#")];
    let before: Vec<Vec<Record>> = {
        let s = open(dir.path());
        s.append_blocking(&[record("a", 0, "a/x", "early")]).unwrap();
        for f in ["a/#", "+/y", "#"] {
            s.register_filter_blocking(&TopicFilter::new(f).unwrap()).unwrap();
        }
        for i in 0..1000 {
            let t = if i % 3 == 0 { "b/y" } else { "a/x" };
            s.append_blocking(&[record(&t[..1], i % 4, t, format!("{i}{}", "p".repeat(100)))]).unwrap();
        }
        s.drop_filter_blocking(&TopicFilter::new("#").unwrap()).unwrap();
        s.append_blocking(&[record("a", 0, "a/x", "late")]).unwrap();
        s.close().unwrap();
        let s = open(dir.path());
        names.iter().map(|n| queue(&s, n)).collect()
    };
    assert!(before[2].len() > 600 && before[4].is_empty());
    let ids: Vec<_> = {
        let s = open(dir.path());
        names.iter().map(|n| s.queue_id(n).unwrap()).collect()
    };
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let s = open(dir.path());
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    let after: Vec<Vec<Record>> = names.iter().map(|n| queue(&s, n)).collect();
    assert_eq!(after, before);
    let ids_after: Vec<_> = names.iter().map(|n| s.queue_id(n).unwrap()).collect();
    assert_eq!(ids_after, ids, "queue ids are deterministic");
}

#[test]
fn sealed_segments_are_announced() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let mut rx = s.subscribe_sealed();
    for i in 0..100 {
        s.append_blocking(&[record("s", 0, "t", vec![i as u8; 2000])]).unwrap();
    }
    let mut sealed = Vec::new();
    while let Ok(seg) = rx.try_recv() {
        sealed.push(seg);
    }
    assert!(sealed.len() >= 2, "200 KB over 64 KiB segments");
    for w in sealed.windows(2) {
        assert_eq!(w[0].end, w[1].base, "segments are contiguous");
    }
    for seg in &sealed {
        let len = std::fs::metadata(&seg.path).unwrap().len();
        assert_eq!(seg.base.get() + len, seg.end.get(), "announced end is the file's end");
    }
}

#[test]
fn segments_seal_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(dir.path(), StorageConfig { segment_max_age_ms: 50, ..small_config() }).unwrap();
    let mut rx = s.subscribe_sealed();
    s.append_blocking(&[record("s", 0, "t", "x")]).unwrap();
    let seg = rx.blocking_recv().expect("sealed by age");
    assert!(seg.end > seg.base);
}

#[test]
fn oversized_batch_is_refused_as_invalid_input() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(dir.path(), StorageConfig { max_batch_bytes: 4096, ..small_config() }).unwrap();
    let err = s.append_blocking(&[record("s", 0, "t", vec![0u8; 8192])]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    s.append_blocking(&[record("s", 0, "t", "fine")]).unwrap();
}

#[test]
fn appends_after_close_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    s.close().unwrap();
    assert_eq!(s.append_blocking(&[record("s", 0, "t", "x")]).unwrap_err().kind(), ErrorKind::Closed);
}

#[test]
fn every_fsync_policy_keeps_what_it_acknowledged_over_a_clean_restart() {
    for policy in [FsyncPolicy::Always, FsyncPolicy::Interval, FsyncPolicy::Never] {
        let dir = tempfile::tempdir().unwrap();
        let s = open_with_fsync(dir.path(), policy);
        let recs: Vec<_> = (0..50).map(|i| record("s", 0, "t", format!("{i}"))).collect();
        for r in &recs {
            s.append_blocking(std::slice::from_ref(r)).unwrap();
        }
        drop(s);
        let s = open_with_fsync(dir.path(), policy);
        assert_eq!(queue(&s, &topic("t")), recs, "{policy:?}");
    }
}

/// Valid MQTT topic names (never empty) over a small alphabet, so filters often match.
fn topic_strategy() -> impl Strategy<Value = String> {
    prop::collection::vec(prop_oneof![Just("a"), Just("b"), Just(""), Just("$s")], 1..4)
        .prop_map(|l| l.join("/"))
        .prop_filter("a topic name is not empty", |t| !t.is_empty())
}

fn filter_strategy() -> impl Strategy<Value = String> {
    (prop::collection::vec(prop_oneof![Just("a"), Just("b"), Just(""), Just("+"), Just("$s")], 1..4), any::<bool>())
        .prop_map(|(mut l, h)| {
            if h {
                l.push("#");
            }
            l.join("/")
        })
        .prop_filter("a filter is not empty", |f| !f.is_empty())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn any_append_sequence_reads_back_identically(
        batches in prop::collection::vec(
            prop::collection::vec((0u32..3, topic_strategy(), prop::collection::vec(any::<u8>(), 0..600)), 1..6),
            1..30),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let mut by_partition: BTreeMap<u32, Vec<Record>> = BTreeMap::new();
        for b in &batches {
            let recs: Vec<_> = b.iter().map(|(p, t, v)| record("s", *p, t, v.clone())).collect();
            let a = s.append_blocking(&recs).unwrap();
            for (r, pos) in recs.iter().zip(&a.positions) {
                prop_assert!(pos < &a.end);
                by_partition.entry(r.partition.get()).or_default().push(r.clone());
            }
        }
        s.close().unwrap();
        let s = open(dir.path());
        for (p, want) in by_partition {
            let got = queue(&s, &QueueName::Partition { stream: "s".into(), partition: Partition(p) });
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn wildcard_multi_dispatch_equals_brute_force_matching(
        filters in prop::collection::btree_set(filter_strategy(), 1..8),
        topics in prop::collection::vec(topic_strategy(), 1..60),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        for f in &filters {
            s.register_filter_blocking(&TopicFilter::new(f.clone()).unwrap()).unwrap();
        }
        let recs: Vec<_> = topics.iter().enumerate().map(|(i, t)| record("s", 0, t, format!("{i}"))).collect();
        let a = s.append_blocking(&recs).unwrap();
        s.wait_dispatched_blocking(a.end).unwrap();
        for f in &filters {
            let want: Vec<Bytes> = recs.iter().filter(|r| filter_matches(f, &r.topic)).map(|r| r.value.clone()).collect();
            let got: Vec<Bytes> = queue(&s, &filter(f)).into_iter().map(|r| r.value).collect();
            prop_assert_eq!(got, want, "filter {:?}", f);
        }
        // The filters matching a set of topics (what a segment upload names) are those a
        // brute-force check finds, also for a subset of the topics.
        for some in [&topics[..], &topics[..topics.len() / 2]] {
            let want: Vec<String> =
                filters.iter().filter(|f| some.iter().any(|t| filter_matches(f, t))).cloned().collect();
            prop_assert_eq!(s.filters_matching(some.iter().map(String::as_str)), want);
        }
    }
}

#[test]
fn filters_matching_follows_registrations_drops_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let topics = ["devices/1/telemetry", "devices/2/status", "$SYS/broker/uptime"];
    assert!(s.filters_matching(topics).is_empty());
    for f in ["devices/+/telemetry", "devices/#", "#", "other/#", "$SYS/#"] {
        s.register_filter_blocking(&TopicFilter::new(f).unwrap()).unwrap();
    }
    let all = ["#", "$SYS/#", "devices/#", "devices/+/telemetry"];
    assert_eq!(s.filters_matching(topics), all, "each matching filter once, `other/#` not");
    assert_eq!(s.filters_matching(["devices/2/status"]), ["#", "devices/#"]);
    s.drop_filter_blocking(&TopicFilter::new("devices/#").unwrap()).unwrap();
    assert_eq!(s.filters_matching(["devices/2/status"]), ["#"], "a dropped filter is gone at once");
    s.close().unwrap();
    let s = open(dir.path());
    assert_eq!(s.filters_matching(topics), ["#", "$SYS/#", "devices/+/telemetry"], "loaded from the index on open");
}

#[test]
fn pipelined_submits_are_written_in_submission_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let rt = tokio_runtime();
    let positions = rt.block_on(async {
        let mut acks = Vec::new();
        for i in 0..100 {
            acks.push(s.submit(&[record("s", 0, "t", format!("{i}"))]).await.unwrap());
        }
        let mut out = Vec::new();
        for a in acks {
            out.push(a.await.unwrap().positions[0]);
        }
        out
    });
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "log order follows submission order");
    let want: Vec<Bytes> = (0..100).map(|i| Bytes::from(format!("{i}"))).collect();
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    assert_eq!(queue(&s, &topic("t")).into_iter().map(|r| r.value).collect::<Vec<_>>(), want);
}

#[test]
fn control_records_cannot_be_appended_from_outside() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let r = Record { control: true, ..record("s", 0, "t", "x") };
    assert_eq!(s.append_blocking(&[r]).unwrap_err().kind(), ErrorKind::InvalidInput);
}

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().unwrap()
}

/// `tier = "memory"` records: readable while the process that wrote them runs, acknowledged
/// without an fsync of their own, gone after a restart, with offsets that keep counting.
#[test]
fn volatile_records_live_until_a_restart_and_need_no_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let s = open_with_fsync(dir.path(), FsyncPolicy::Always);
    let volatile = |v: &str| Record { volatile: true, ..record("m", 0, "m/t", v.to_owned()) };
    let before = s.stats().fsyncs;
    let mut end = silt_types::LogPosition(0);
    for i in 0..20 {
        end = s.append_blocking(&[volatile(&format!("v{i}"))]).unwrap().end;
    }
    assert_eq!(s.stats().fsyncs, before, "volatile appends alone never wait for an fsync");
    let durable = record("m", 0, "m/t", "durable");
    end = end.max(s.append_blocking(std::slice::from_ref(&durable)).unwrap().end);
    assert_eq!(s.stats().fsyncs, before + 1, "a durable append is fsynced");
    s.wait_dispatched_blocking(end).unwrap();
    let values: Vec<Bytes> = queue(&s, &topic("m/t")).into_iter().map(|r| r.value).collect();
    assert_eq!(values.len(), 21);
    assert_eq!((&values[0][..], &values[20][..]), (&b"v0"[..], &b"durable"[..]));
    s.close().unwrap();

    let s = open_with_fsync(dir.path(), FsyncPolicy::Always);
    let id = s.queue_id(&topic("m/t")).unwrap().unwrap();
    let entries = s.read_index(id, silt_types::Offset(0), 100).unwrap();
    assert_eq!(entries.len(), 21, "the index keeps their places");
    for (_, e) in &entries[..20] {
        let err = s.read_record(e).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Expired, "{err}");
    }
    assert_eq!(s.read_record(&entries[20].1).unwrap().value, durable.value);
    let a = s.append_blocking(&[volatile("after")]).unwrap();
    s.wait_dispatched_blocking(a.end).unwrap();
    let (_, next) = s.queue_bounds(id).unwrap();
    assert_eq!(next.get(), 22, "offsets keep counting");
    let last = s.read_index(id, silt_types::Offset(21), 1).unwrap();
    assert_eq!(s.read_record(&last[0].1).unwrap().value, Bytes::from_static(b"after"));
    s.close().unwrap();
}

/// What a Kafka produce response and ListOffsets need: the offset of the record at a position,
/// and the first offset at or after a time.
#[test]
fn offsets_are_found_by_position_and_by_time() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let mut positions = Vec::new();
    for i in 0..100i64 {
        let mut r = record("k", 0, "k/x", format!("v{i}"));
        r.timestamp = silt_types::Timestamp(1_000 + i * 10);
        positions.push(s.append_blocking(std::slice::from_ref(&r)).unwrap().positions[0]);
    }
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    let p = QueueName::Partition { stream: "k".into(), partition: Partition(0) };
    let id = s.queue_id(&p).unwrap().unwrap();
    for (i, pos) in positions.iter().enumerate() {
        assert_eq!(s.offset_of(id, *pos).unwrap(), Some(silt_types::Offset(i as u64)));
    }
    assert_eq!(s.offset_of(id, silt_types::LogPosition(positions[3].get() + 1)).unwrap(), None);
    let at = |ts: i64| s.offset_for_time(id, silt_types::Offset(0), silt_types::Timestamp(ts)).unwrap();
    assert_eq!(at(0), Some(silt_types::Offset(0)));
    assert_eq!(at(1_000), Some(silt_types::Offset(0)));
    assert_eq!(at(1_001), Some(silt_types::Offset(1)));
    assert_eq!(at(1_500), Some(silt_types::Offset(50)));
    assert_eq!(at(1_990), Some(silt_types::Offset(99)));
    assert_eq!(at(1_991), None, "nothing that late");
}

/// Producer timestamps in any order: a stream partition's entries carry the running maximum
/// (as Kafka's time index does), so the first record at or after a time is found exactly, also
/// across a restart; a topic queue keeps each record's own time (MQTT expiry reads it).
#[test]
fn offset_for_time_finds_the_first_record_at_or_after_a_time_in_any_order() {
    let dir = tempfile::tempdir().unwrap();
    let p = QueueName::Partition { stream: "k".into(), partition: Partition(0) };
    let append = |s: &silt_storage::Storage, ts: i64| {
        let mut r = record("k", 0, "k/x", "v");
        r.timestamp = silt_types::Timestamp(ts);
        s.append_blocking(&[r]).unwrap();
        s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    };
    let at = |s: &silt_storage::Storage, ts: i64| {
        let id = s.queue_id(&p).unwrap().unwrap();
        s.offset_for_time(id, silt_types::Offset(0), silt_types::Timestamp(ts)).unwrap().map(|o| o.get())
    };
    {
        let s = open(dir.path());
        for ts in [1000, 5000, 2000, 3000, 6000, 4000] {
            append(&s, ts);
        }
        assert_eq!(at(&s, 500), Some(0));
        assert_eq!(at(&s, 1500), Some(1), "5000 is the first at or after 1500, not 2000");
        assert_eq!(at(&s, 2500), Some(1));
        assert_eq!(at(&s, 5500), Some(4));
        assert_eq!(at(&s, 7000), None);
        let topic = s.queue_id(&QueueName::Topic("k/x".into())).unwrap().unwrap();
        let own: Vec<i64> =
            s.read_index(topic, silt_types::Offset(0), 10).unwrap().iter().map(|(_, e)| e.timestamp.get()).collect();
        assert_eq!(own, [1000, 5000, 2000, 3000, 6000, 4000]);
        s.close().unwrap();
    }
    // The maximum carries on from the index after a restart.
    let s = open(dir.path());
    append(&s, 7000);
    append(&s, 500);
    assert_eq!(at(&s, 6500), Some(6));
    assert_eq!(at(&s, 7001), None, "500 after 7000 is no later than 7000");
    assert_eq!(at(&s, 100), Some(0));
}

/// A deleted Kafka topic: its partition queue goes, a later record starts it at offset 0, and
/// a rebuilt index agrees (the drop is a record in the log, replayed like the data).
#[test]
fn a_dropped_partition_starts_again_at_zero_also_after_an_index_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let p = QueueName::Partition { stream: "gone".into(), partition: Partition(0) };
    {
        let s = open(dir.path());
        for i in 0..5 {
            s.append_blocking(&[record("gone", 0, "gone/x", format!("old{i}"))]).unwrap();
        }
        block_on_rt(s.drop_partition(&p)).unwrap();
        assert_eq!(s.queue_id(&p).unwrap(), None);
        assert!(block_on_rt(s.drop_partition(&topic("gone/x"))).is_err(), "only partition queues");
        let r = record("gone", 0, "gone/x", "new");
        let a = s.append_blocking(std::slice::from_ref(&r)).unwrap();
        s.wait_dispatched_blocking(a.end).unwrap();
        assert_eq!(queue(&s, &p), vec![r]);
        s.close().unwrap();
    }
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let s = open(dir.path());
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    let id = s.queue_id(&p).unwrap().unwrap();
    let got = s.read_queue(id, silt_types::Offset(0), 10).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0, &got[0].1.value[..]), (silt_types::Offset(0), &b"new"[..]));
    assert_eq!(queue(&s, &topic("gone/x")).len(), 6, "the MQTT topic's queue keeps every record");
}

/// A subscriber learns a filter queue's id and end from memory after registering it, whether
/// the registration created the queue or met it (after a restart), and memory never claims
/// entries it does not hold.
#[test]
fn a_registered_filter_is_named_in_memory_with_its_end() {
    use silt_types::Offset;
    let dir = tempfile::tempdir().unwrap();
    let f = TopicFilter::new("devices/+/t").unwrap();
    let name = filter("devices/+/t");
    let id = {
        let s = open(dir.path());
        assert_eq!(s.created_queue_id(&name), None);
        block_on_rt(s.add_filter(&f)).unwrap();
        let id = s.created_queue_id(&name).expect("a new filter queue is named in memory");
        assert_eq!(s.queue_end_cached(id), Some(Offset(0)), "a new queue is empty");
        let a =
            s.append_blocking(&[record("d", 0, "devices/1/t", "one"), record("d", 0, "devices/2/t", "two")]).unwrap();
        s.wait_dispatched_blocking(a.end).unwrap();
        assert_eq!(s.queue_end_cached(id), Some(Offset(2)));
        assert_eq!(s.queue_end_cached(id), Some(s.queue_bounds(id).unwrap().1));
        assert_eq!(s.queue_end(id).unwrap(), Offset(2));
        block_on_rt(s.add_filter(&f)).unwrap();
        assert_eq!(s.created_queue_id(&name), Some(id), "registering again keeps the queue");
        assert_eq!(s.queue_end_cached(id), Some(Offset(2)));
        s.close().unwrap();
        id
    };
    let s = open(dir.path());
    assert_eq!(s.created_queue_id(&name), None, "memory starts empty");
    block_on_rt(s.add_filter(&f)).unwrap();
    assert_eq!(s.created_queue_id(&name), Some(id), "a registration names an existing queue");
    // Its entries are in the index only: memory must not answer for them (nor claim it empty).
    assert_eq!(s.queue_end_cached(id), None);
    assert_eq!(s.read_index_cached(id, Offset(0), 10), None);
    assert_eq!(s.queue_bounds(id).unwrap().1, Offset(2));
    assert_eq!(s.queue_end(id).unwrap(), Offset(2), "the end from the index when memory has none");
    let got: Vec<Bytes> = queue(&s, &name).into_iter().map(|r| r.value).collect();
    assert_eq!(got, vec![Bytes::from("one"), Bytes::from("two")]);
}

/// Readers that keep up get the newest entries from memory (no RocksDB read); every answer
/// given that way is the index's own, across queues dropped and created again. Compared with a
/// reopened engine, which starts with nothing in memory and reads the index.
#[test]
fn entries_served_from_memory_are_the_index_entries() {
    use silt_types::Offset;
    let dir = tempfile::tempdir().unwrap();
    let f = TopicFilter::new("m/+").unwrap();
    let p0 = QueueName::Partition { stream: "m".into(), partition: Partition(0) };
    let names = [topic("m/0"), topic("m/1"), topic("m/2"), p0.clone(), filter("m/+")];
    let mut answers = Vec::new();
    let mut dropped = Vec::new();
    {
        let s = open(dir.path());
        s.register_filter_blocking(&f).unwrap();
        for i in 0..300u32 {
            let drop_queue = |name: &QueueName, dropped: &mut Vec<_>| {
                let id = s.queue_id(name).unwrap().unwrap();
                assert!(s.read_index_cached(id, Offset(0), 1).is_some());
                dropped.push(id);
            };
            match i {
                150 => {
                    drop_queue(&p0, &mut dropped);
                    block_on_rt(s.drop_partition(&p0)).unwrap();
                }
                200 => {
                    drop_queue(&filter("m/+"), &mut dropped);
                    s.drop_filter_blocking(&f).unwrap();
                }
                220 => drop(s.register_filter_blocking(&f).unwrap()),
                _ => {}
            }
            for id in &dropped {
                assert_eq!(s.read_index_cached(*id, Offset(0), 1), None, "a dropped queue's entries are not served");
            }
            let a = s.append_blocking(&[record("m", i % 2, &format!("m/{}", i % 3), format!("v{i}"))]).unwrap();
            s.wait_dispatched_blocking(a.end).unwrap();
            // Ask from where a reader that keeps up would: at and just below each queue's end.
            for name in &names {
                let Some(id) = s.queue_id(name).unwrap() else { continue };
                let (_, next) = s.queue_bounds(id).unwrap();
                for from in [next.get().saturating_sub(3), next.get().saturating_sub(1), next.get()] {
                    if let Some(got) = s.read_index_cached(id, Offset(from), 2) {
                        answers.push((id, from, got));
                    }
                }
            }
        }
        s.close().unwrap();
    }
    assert!(answers.iter().any(|(_, _, got)| !got.is_empty()), "entries were served from memory");
    let s = open(dir.path());
    assert_eq!(dropped.len(), 2);
    for (id, from, got) in answers.into_iter().filter(|(id, _, _)| !dropped.contains(id)) {
        // An answer from memory stops at the end as it was then; the index may hold more now.
        let now = s.read_index(id, Offset(from), got.len()).unwrap();
        assert_eq!(got, now, "queue {id:?} from {from}");
    }
}
