//! The offline index check (`silt fsck`): clean on what the engine wrote, and each kind of
//! disagreement between the index and the log named — an index from another log, a log that
//! lost its tail under its index, a missing index.

mod common;

use std::path::Path;

use common::{open, record, small_config};
use silt_storage::{IndexCheck, check_index};
use silt_types::TopicFilter;

fn check(dir: &Path) -> IndexCheck {
    check_index(dir, &small_config(), &|_| {}).expect("check runs")
}

/// Records in two streams, several topics and a wildcard filter registered half-way, across
/// several segments (64 KiB each); `salt` changes the record sizes.
fn fill(dir: &Path, salt: usize) {
    let s = open(dir);
    for i in 0..300usize {
        let value = "v".repeat(500 + (i * 7 + salt) % 97);
        let r = record(if i % 3 == 0 { "plant" } else { "fleet" }, (i % 2) as u32, &format!("site/{}/t", i % 5), value);
        s.append_blocking(&[r]).unwrap();
        if i == 150 {
            s.register_filter_blocking(&TopicFilter::new("site/+/t").unwrap()).unwrap();
        }
    }
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    assert!(s.stats().segments >= 3, "the records span several segments");
    s.close().unwrap();
}

#[test]
fn an_index_the_engine_wrote_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 0);
    let got = check(dir.path());
    assert!(got.clean(), "{:?}", got.problems);
    assert!(!got.missing);
    // Four partitions, five topics, one filter.
    assert_eq!(got.queues, 10);
    // Each record is in its partition and its topic queue; the 149 after the filter also in it.
    assert_eq!(got.entries, 300 * 2 + 149);
}

#[test]
fn an_index_from_another_log_is_named_queue_by_queue() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fill(a.path(), 0);
    fill(b.path(), 13);
    std::fs::remove_dir_all(a.path().join("index")).unwrap();
    copy_dir(&b.path().join("index"), &a.path().join("index"));
    let got = check(a.path());
    assert!(!got.clean());
    let text = got.problems.join("\n");
    assert!(text.contains("stream plant partition 0") && text.contains("topic site/"), "{text}");
}

#[test]
fn a_log_that_lost_its_tail_under_its_index_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 0);
    let log = dir.path().join("log");
    let mut segments: Vec<_> = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    let newest = segments.last().unwrap();
    let len = std::fs::metadata(newest).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(newest).unwrap().set_len(len / 2).unwrap();
    let got = check(dir.path());
    let text = got.problems.join("\n");
    assert!(text.contains("the index covers the log up to position"), "{text}");
    assert!(text.contains("past the end of the log"), "{text}");
}

#[test]
fn a_missing_index_is_said_and_is_no_problem() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 0);
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let got = check(dir.path());
    assert!(got.missing && got.clean(), "{got:?}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() && e.file_name() != "LOCK" {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}
