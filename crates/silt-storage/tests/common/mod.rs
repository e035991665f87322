//! Helpers shared by the storage integration tests.
#![allow(dead_code)]

use std::path::Path;

use bytes::Bytes;
use silt_storage::{FsyncPolicy, QueueName, Record, Storage, StorageConfig};
use silt_types::{Offset, Partition, Timestamp};

pub fn small_config() -> StorageConfig {
    StorageConfig {
        segment_bytes: 64 * 1024,
        tail_cache_bytes: 256 * 1024,
        index_block_cache_bytes: 1 << 20,
        index_write_buffer_bytes: 1 << 20,
        queue_cache_entries: 64,
        ..StorageConfig::default()
    }
}

pub fn open(dir: &Path) -> Storage {
    Storage::open(dir, small_config()).expect("open storage")
}

pub fn open_with_fsync(dir: &Path, fsync: FsyncPolicy) -> Storage {
    Storage::open(dir, StorageConfig { fsync, ..small_config() }).expect("open storage")
}

pub fn record(stream: &str, partition: u32, topic: &str, value: impl Into<Bytes>) -> Record {
    Record {
        timestamp: Timestamp(1_700_000_000_000),
        stream: stream.into(),
        partition: Partition(partition),
        topic: topic.into(),
        key: Some(Bytes::copy_from_slice(topic.as_bytes())),
        value: value.into(),
        headers: vec![("content-type".into(), Some(Bytes::from_static(b"text/plain")))],
        attrs: 1,
        ..Record::default()
    }
}

/// Every record of a queue, in order, checking offsets are dense from the first.
pub fn queue(storage: &Storage, name: &QueueName) -> Vec<Record> {
    let Some(id) = storage.queue_id(name).expect("lookup") else {
        return Vec::new();
    };
    let (first, next) = storage.queue_bounds(id).expect("bounds");
    let all = storage.read_queue(id, first, usize::MAX).expect("read queue");
    assert_eq!(all.len() as u64, next.get() - first.get(), "queue {name:?} has holes");
    for (i, (off, _)) in all.iter().enumerate() {
        assert_eq!(*off, Offset(first.get() + i as u64), "queue {name:?} offsets not dense");
    }
    all.into_iter().map(|(_, r)| r).collect()
}

pub fn topic(t: &str) -> QueueName {
    QueueName::Topic(t.into())
}

pub fn filter(f: &str) -> QueueName {
    QueueName::Filter(f.into())
}

/// A cold reader for a node whose object store holds nothing: every bad batch it is asked
/// about has no copy there (the standalone engine's situation, told explicitly so repairs do
/// not wait for a store to be attached).
pub struct NothingUploaded;

impl silt_storage::ColdReader for NothingUploaded {
    fn read(&self, pos: silt_types::LogPosition, _len: usize) -> silt_storage::Result<Bytes> {
        Err(silt_storage::Error::NotFound(pos.get()))
    }
}

/// Opens storage and at once tells it nothing is uploaded.
pub fn open_alone(dir: &Path, config: StorageConfig) -> Storage {
    let s = Storage::open(dir, config).expect("open storage");
    assert!(s.set_cold_reader(std::sync::Arc::new(NothingUploaded)));
    s
}

/// Each entry of a queue, read one by one: the record, or the kind of error its read gave.
pub fn entries(storage: &Storage, name: &QueueName) -> Vec<Result<Record, silt_storage::ErrorKind>> {
    let Some(id) = storage.queue_id(name).expect("lookup") else {
        return Vec::new();
    };
    let (first, next) = storage.queue_bounds(id).expect("bounds");
    let index = storage.read_index(id, first, (next.get() - first.get()) as usize).expect("read index");
    index.into_iter().map(|(_, e)| storage.read_record(&e).map_err(|e| e.kind())).collect()
}

/// The segment files of a data directory, oldest first.
pub fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    v.sort();
    v
}

/// The segment's base position, from its file name.
pub fn segment_base(path: &Path) -> u64 {
    path.file_stem().unwrap().to_str().unwrap().parse().unwrap()
}

/// Flips one bit of a file.
pub fn flip(path: &Path, at: u64, bit: u8) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 1 << bit;
    std::fs::write(path, bytes).unwrap();
}

/// `(start, len)` of every batch frame of a segment file, from its header on.
pub fn frames(path: &Path) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(path).unwrap();
    let mut at = 16usize;
    let mut out = Vec::new();
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize + 8;
        out.push((at as u64, len as u64));
        at += len;
    }
    out
}

/// Whether this process may mount filesystems (root, or inside `unshare -rm`). When it may not,
/// runs the test `name` of this test binary again under `unshare -rm` (a user and mount
/// namespace where it may) and returns false: the caller returns, the child did the work.
/// Fails with a clear message when neither works; never skips silently.
pub fn can_mount_or_rerun(name: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("SILT_TEST_UNSHARED").is_none(),
        "{name}: not root even inside unshare -rm; cannot mount a tmpfs"
    );
    let exe = std::env::current_exe().unwrap();
    let status = std::process::Command::new("unshare")
        .args(["-rm"])
        .arg(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("SILT_TEST_UNSHARED", "1")
        .status();
    match status {
        Ok(s) => assert!(s.success(), "{name} failed inside unshare -rm ({s})"),
        Err(e) => panic!("{name} needs to mount a tmpfs: run it as root, or install unshare (util-linux): {e}"),
    }
    false
}

/// A small tmpfs mounted on a fresh temporary directory (a disk that fills up for real),
/// unmounted on drop.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status();
        assert!(
            status.as_ref().is_ok_and(|s| s.success()),
            "mounting a tmpfs on {} failed ({status:?}): run the test as root or under unshare -rm",
            dir.path().display()
        );
        Tmpfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a filler file until the disk is full; returns its path.
    pub fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5Au8; 64 << 10];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        // The last page-sized crumbs too, so even a 16-byte header write fails.
        while f.write(&[0x5A]).is_ok_and(|n| n > 0) {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}
