//! Crash tests: acknowledged records survive SIGKILL, and a damaged tail is cut back to the last
//! valid batch, never served.
//!
//! The kill test re-runs this test binary as a child (`crash_child`, ignored unless
//! `SILT_CRASH_CHILD_DIR` is set) that appends from several threads under `fsync = "always"` and
//! prints each acknowledged position. The parent SIGKILLs it at a random moment, reopens the
//! storage and checks every acknowledged record, 20 times over the same directory.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use rand::{Rng, SeedableRng};
use silt_storage::{FsyncPolicy, Record, Storage, StorageConfig};
use silt_types::{LogPosition, Offset};

const THREADS: usize = 4;

/// The value appender `thread` writes as its `seq`-th record of cycle `cycle`: content the parent
/// can recompute, of varying length.
fn value(cycle: u32, thread: usize, seq: u64) -> Bytes {
    let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(cycle) << 40 ^ (thread as u64) << 32 ^ seq);
    let len = rng.random_range(1..3000);
    let mut v = format!("{cycle}/{thread}/{seq}:").into_bytes();
    v.extend((0..len).map(|_| rng.random::<u8>()));
    Bytes::from(v)
}

fn topic_of(cycle: u32, thread: usize) -> String {
    format!("crash/c{cycle}/t{thread}")
}

#[test]
#[ignore = "child process of acknowledged_records_survive_sigkill"]
fn crash_child() {
    let Ok(dir) = std::env::var("SILT_CRASH_CHILD_DIR") else { return };
    let cycle: u32 = std::env::var("SILT_CRASH_CYCLE").unwrap().parse().unwrap();
    let storage = std::sync::Arc::new(open_with_fsync(Path::new(&dir), FsyncPolicy::Always));
    let (tx, rx) = mpsc::channel::<String>();
    for t in 0..THREADS {
        let (s, tx) = (storage.clone(), tx.clone());
        std::thread::spawn(move || {
            for seq in 0.. {
                let r = record("crash", t as u32, &topic_of(cycle, t), value(cycle, t, seq));
                let a = s.append_blocking(&[r]).expect("append");
                tx.send(format!("ACK {t} {seq} {}", a.positions[0])).unwrap();
            }
        });
    }
    drop(tx);
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY").unwrap();
    out.flush().unwrap();
    for line in rx {
        writeln!(out, "{line}").unwrap();
        out.flush().unwrap();
    }
}

/// Checks every cycle so far: each topic queue holds seq 0, 1, 2, ... with no gap, its values
/// byte-identical, containing at least every acknowledged seq at the acknowledged position.
fn verify(s: &Storage, acked: &[HashMap<(usize, u64), LogPosition>]) {
    for (cycle, acks) in acked.iter().enumerate() {
        for t in 0..THREADS {
            let recs: Vec<Record> = queue(s, &topic(&topic_of(cycle as u32, t)));
            let id = s.queue_id(&topic(&topic_of(cycle as u32, t))).unwrap();
            let entries = match id {
                Some(id) => s.read_index(id, Offset(0), usize::MAX).unwrap(),
                None => Vec::new(),
            };
            for (seq, r) in recs.iter().enumerate() {
                assert_eq!(r.value, value(cycle as u32, t, seq as u64), "cycle {cycle} thread {t} seq {seq}");
            }
            let max_acked = acks.keys().filter(|(th, _)| *th == t).map(|(_, s)| *s).max();
            if let Some(m) = max_acked {
                assert!(recs.len() as u64 > m, "cycle {cycle} thread {t}: acked seq {m} lost ({} kept)", recs.len());
            }
            for ((th, seq), pos) in acks.iter().filter(|((th, _), _)| *th == t) {
                assert_eq!(entries[*seq as usize].1.position, *pos, "cycle {cycle} thread {th} seq {seq} moved");
            }
        }
    }
}

#[test]
fn acknowledged_records_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let seed: u64 = std::env::var("SILT_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("crash test seed {seed} (set SILT_CRASH_SEED to repeat)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let exe = std::env::current_exe().unwrap();
    let mut acked: Vec<HashMap<(usize, u64), LogPosition>> = Vec::new();
    for cycle in 0..20u32 {
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("SILT_CRASH_CHILD_DIR", dir.path())
            .env("SILT_CRASH_CYCLE", cycle.to_string())
            .env("RUST_LOG", "off")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(l) if l.ends_with("READY") => break,
                Ok(_) => {}
                Err(e) => panic!("child never became ready: {e}"),
            }
            assert!(Instant::now() < deadline);
        }
        // Kill at a random moment after the first acknowledgement (on a loaded machine the
        // appenders may need a while to get going).
        let first_ack = loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(l) if l.starts_with("ACK") => break l,
                Ok(_) => {}
                Err(e) => panic!("cycle {cycle}: the child acknowledged nothing: {e}"),
            }
        };
        std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        let mut acks = HashMap::new();
        for line in std::iter::once(first_ack).chain(rx.try_iter()) {
            let parts: Vec<&str> = line.split(' ').collect();
            if let ["ACK", t, seq, pos] = parts[..] {
                acks.insert((t.parse().unwrap(), seq.parse().unwrap()), LogPosition(pos.parse().unwrap()));
            }
        }
        assert!(!acks.is_empty(), "cycle {cycle}: the child acknowledged nothing before the kill");
        acked.push(acks);
        let s = open(dir.path());
        s.wait_dispatched_blocking(s.stats().log_end).unwrap();
        verify(&s, &acked);
    }
}

/// Appends two batches, closes, then lets `damage` hurt the last segment file.
fn damaged_log(damage: impl FnOnce(&Path, u64)) -> (tempfile::TempDir, Vec<Record>) {
    let dir = tempfile::tempdir().unwrap();
    let first = vec![record("s", 0, "t", "first"), record("s", 0, "t", "second")];
    let last_start;
    {
        let s = open(dir.path());
        s.append_blocking(&first).unwrap();
        let a = s.append_blocking(&[record("s", 0, "t", "third, the last batch")]).unwrap();
        last_start = a.positions[0].get();
        s.close().unwrap();
    }
    let seg = std::fs::read_dir(dir.path().join("log")).unwrap().map(|e| e.unwrap().path()).max().unwrap();
    damage(&seg, last_start);
    (dir, first)
}

fn patch(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(path).unwrap();
    f(&mut bytes);
    std::fs::write(path, bytes).unwrap();
}

fn assert_recovers_to(dir: &Path, want: &[Record]) {
    let s = open(dir);
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    assert_eq!(queue(&s, &topic("t")), want);
    // The log keeps working after the cut, and the new record is readable after a restart.
    let extra = record("s", 0, "t", "after recovery");
    s.append_blocking(std::slice::from_ref(&extra)).unwrap();
    drop(s);
    let s = open(dir);
    let mut all = want.to_vec();
    all.push(extra);
    assert_eq!(queue(&s, &topic("t")), all);
}

#[test]
fn truncated_tail_is_cut_to_the_last_whole_batch() {
    let (dir, first) = damaged_log(|seg, _| patch(seg, |b| b.truncate(b.len() - 5)));
    assert_recovers_to(dir.path(), &first);
}

#[test]
fn garbage_tail_is_cut() {
    let (dir, _) = damaged_log(|seg, _| patch(seg, |b| b.extend_from_slice(&[0xAB; 1000])));
    let s = open(dir.path());
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    assert_eq!(queue(&s, &topic("t")).len(), 3, "valid batches kept, garbage after them cut");
    drop(s);
    let (dir, _) = damaged_log(|seg, _| patch(seg, |b| b.extend_from_slice(&[0; 64])));
    let s = open(dir.path());
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    assert_eq!(queue(&s, &topic("t")).len(), 3, "a zero-filled tail (preallocated, never written) is cut");
}

#[test]
fn flipped_byte_in_the_last_batch_cuts_that_batch() {
    let (dir, first) = damaged_log(|seg, rec_pos| {
        let seg_base: u64 = seg.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        patch(seg, |b| {
            let at = (rec_pos - seg_base) as usize + 30; // inside the last record
            b[at] ^= 0x01;
        })
    });
    assert_recovers_to(dir.path(), &first);
}

#[test]
fn index_ahead_of_a_cut_log_is_rebuilt() {
    // The index saw the last batch (clean close); then the log loses it, as after a machine
    // crash under fsync = "never". The index must not point past the log.
    let (dir, first) = damaged_log(|seg, _| patch(seg, |b| b.truncate(b.len() - 1)));
    let s = open(dir.path());
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    assert_eq!(queue(&s, &topic("t")), first);
    let a = s.append_blocking(&[record("s", 0, "t", "new")]).unwrap();
    s.wait_dispatched_blocking(a.end).unwrap();
    assert_eq!(queue(&s, &topic("t")).len(), 3);
}

/// A crash inside a segment roll, after the next segment's file was created and before its
/// header was written (or reached the disk): the log opens, keeps everything, and goes on in
/// that segment. Found by `acknowledged_records_survive_sigkill` (the open failed with a
/// corrupt segment header).
#[test]
fn a_segment_file_left_without_its_header_by_a_crash_is_started_again() {
    for unborn in [&b""[..], &b"SILT"[..], &[0u8; 16][..]] {
        let (dir, _) = damaged_log(|_, _| {});
        let all = {
            let s = open(dir.path());
            s.wait_dispatched_blocking(s.stats().log_end).unwrap();
            queue(&s, &topic("t"))
        };
        let log = dir.path().join("log");
        let last = std::fs::read_dir(&log).unwrap().map(|e| e.unwrap().path()).max().unwrap();
        let seg_base: u64 = last.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        let end = seg_base + std::fs::metadata(&last).unwrap().len();
        std::fs::write(log.join(format!("{end:020}.log")), unborn).unwrap();
        assert_recovers_to(dir.path(), &all);
    }
    // A file longer than a header without a valid one is not a crash artefact: still refused.
    let (dir, _) = damaged_log(|seg, _| patch(seg, |b| b[0] ^= 0xFF));
    assert!(Storage::open(dir.path(), StorageConfig::default()).is_err());
}

/// Under `fsync = "always"` the active segment holds fsynced zeros past its data (see
/// `preallocate_bytes`). A crash leaves them there: the next start cuts them as free space, not
/// as a torn write, keeps every record, and appends go on where the data ended. A clean close
/// cuts them itself, and a sealed segment never holds any.
#[test]
fn preallocated_zeros_left_by_a_crash_are_cut_and_every_record_kept() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let config = StorageConfig { segment_bytes: 1 << 20, preallocate_bytes: 64 << 10, ..small_config() };
    let log = |d: &Path| d.join("log");
    let segments = |d: &Path| {
        let mut v: Vec<_> = std::fs::read_dir(log(d)).unwrap().map(|e| e.unwrap().path()).collect();
        v.sort();
        v
    };
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    let base = |p: &Path| -> u64 { p.file_stem().unwrap().to_str().unwrap().parse().unwrap() };
    let mut want = Vec::new();
    {
        let s = Storage::open(dir.path(), config.clone()).unwrap();
        // Past one roll (1 MiB segments), so a sealed segment exists too.
        for i in 0..1200 {
            let r = record("s", 0, "t", Bytes::from(vec![b'a' + (i % 26) as u8; 1000]));
            s.append_blocking(std::slice::from_ref(&r)).unwrap();
            want.push(r);
        }
        let end = s.stats().log_end.get();
        let active = segments(dir.path()).pop().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while base(&active) + size(&active) <= end {
            assert!(Instant::now() < deadline, "no zeros were written ahead of the active segment's end");
            std::thread::sleep(Duration::from_millis(10));
        }
        for sealed in &segments(dir.path())[..segments(dir.path()).len() - 1] {
            let found = silt_storage::check_segment_file(sealed, 1 << 20).unwrap();
            assert_eq!((found.zeros, found.bad_end), (0, None), "a sealed segment ends with its data");
        }
        // The files as a crash leaves them (every append returned, so its bytes were fsynced).
        std::fs::create_dir_all(log(crashed.path())).unwrap();
        for p in segments(dir.path()) {
            std::fs::copy(&p, log(crashed.path()).join(p.file_name().unwrap())).unwrap();
        }
        let image = segments(crashed.path()).pop().unwrap();
        let found = silt_storage::check_segment_file(&image, 1 << 20).unwrap();
        assert!(found.zeros > 0 && found.bad_end.is_none(), "zeros at the end are not a torn write: {found:?}");
        s.close().unwrap();
        let active = segments(dir.path()).pop().unwrap();
        assert_eq!(base(&active) + size(&active), end, "a clean close cuts the zeros off");
    }
    // The crash image (its index is gone too: the log is dispatched again from the start),
    // opened without preallocation so the file shows what recovery left.
    let s = Storage::open(crashed.path(), StorageConfig { preallocate_bytes: 0, ..config }).unwrap();
    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
    assert_eq!(queue(&s, &topic("t")), want);
    let active = segments(crashed.path()).pop().unwrap();
    assert_eq!(base(&active) + size(&active), s.stats().log_end.get(), "the zeros were cut at the start");
    let extra = record("s", 0, "t", "after the crash");
    s.append_blocking(std::slice::from_ref(&extra)).unwrap();
    want.push(extra);
    s.close().unwrap();
    let s = open(crashed.path());
    assert_eq!(queue(&s, &topic("t")), want);
}

/// A torn batch with preallocated zeros after it is still a torn write: cut, never served.
#[test]
fn a_torn_batch_before_preallocated_zeros_is_cut() {
    let (dir, first) = damaged_log(|seg, rec_pos| {
        let seg_base: u64 = seg.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        patch(seg, |b| {
            // The last batch lost its end, and zeros follow where the rest would have been.
            let start = (rec_pos - seg_base) as usize;
            b.truncate(start + 20);
            b.resize(b.len() + (64 << 10), 0);
        })
    });
    let seg = std::fs::read_dir(dir.path().join("log")).unwrap().map(|e| e.unwrap().path()).max().unwrap();
    let found = silt_storage::check_segment_file(&seg, 1 << 20).unwrap();
    assert!(found.bad_end.is_some(), "a partial batch then zeros is a torn write: {found:?}");
    assert_recovers_to(dir.path(), &first);
}
