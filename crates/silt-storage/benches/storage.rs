//! Storage engine benchmarks. `cargo bench -p silt-storage --bench storage`; results and their
//! interpretation are in BENCHMARKS.md.
//!
//! - `raw_disk/*`: the disk's own sequential write bandwidth with fsync, measured in the same
//!   run as the reference for `append/*`: into files deleted at once (`write_1MiB_fsync_50ms`,
//!   pages reused) and into files kept like segments (`..._kept`, the reference for batches).
//! - `append/{fsync}/{size}B/{appenders}`: records/s through `Storage::append`, one record per
//!   call, from N threads (group commit shares writes and fsyncs among them).
//! - `append_batched/{fsync}/1000x1024B/{appenders}`: bytes/s with producer-sized batches.
//! - `dispatch/{1_queue,1m_queues}`: index entries/s when the dispatcher rebuilds the index
//!   from an existing log; also prints the disk and memory the index of 1,000,000 queues takes.
//! - `read/{tail,disk}`: records/s read back through a topic queue.
//! - `read/disk_first_pass`: the same from sealed segments just opened, so every batch read is
//!   CRC-checked on the way (the checked-read walk; `read/disk` reads batches checked before).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use silt_storage::{FsyncPolicy, QueueName, Record, Storage, StorageConfig};
use silt_types::{Offset, Partition, Timestamp};

fn record(topic: &str, size: usize) -> Record {
    Record {
        timestamp: Timestamp(1_700_000_000_000),
        stream: "bench".into(),
        partition: Partition(0),
        topic: topic.into(),
        value: Bytes::from(vec![0x5a; size]),
        ..Record::default()
    }
}

fn config(fsync: FsyncPolicy) -> StorageConfig {
    StorageConfig { fsync, ..StorageConfig::default() }
}

/// Writes 64 × `chunk` (1 MiB) to a new file at `path`, fsyncing every 50 ms and at the end:
/// what `fsync = "interval"` asks of the disk. Returns the time it took.
fn write_64_mib(path: &Path, chunk: &[u8]) -> Duration {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let start = Instant::now();
    let mut last = Instant::now();
    for _ in 0..64 {
        f.write_all(chunk).unwrap();
        if last.elapsed() >= Duration::from_millis(50) {
            f.sync_data().unwrap();
            last = Instant::now();
        }
    }
    f.sync_data().unwrap();
    start.elapsed()
}

fn raw_disk(c: &mut Criterion) {
    use std::io::Write;
    let mut g = c.benchmark_group("raw_disk");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    let dir = tempfile::tempdir_in(".").unwrap();
    // Sequential 1 MiB writes with an fsync every 50 ms, each file deleted at once.
    let chunk = vec![0x5au8; 1 << 20];
    g.throughput(Throughput::Bytes(64 << 20));
    g.bench_function("write_1MiB_fsync_50ms", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                let path = dir.path().join(format!("raw{i}"));
                total += write_64_mib(&path, &chunk);
                std::fs::remove_file(path).unwrap();
            }
            total
        })
    });
    // The same writes into files kept until the benchmark ends, as the log keeps its
    // segments: every write lands in page-cache pages the kernel has to allocate, where the
    // one above rewrites pages just freed by the file it deleted. On a VM whose free memory
    // goes back to the host (free page reporting, e.g. Firecracker) the difference is 3-8x,
    // so this is the reference `append_batched` is compared with.
    let mut kept = Vec::new();
    g.bench_function("write_1MiB_fsync_50ms_kept", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let path = dir.path().join(format!("kept{}", kept.len()));
                total += write_64_mib(&path, &chunk);
                kept.push(path);
            }
            total
        })
    });
    for path in kept {
        std::fs::remove_file(path).unwrap();
    }
    // One fsync per small write: the floor under `fsync = "always"` with one appender.
    for size in [128usize, 4096] {
        let buf = vec![0x5au8; size];
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new("write_fsync_each", size), |b| {
            let path = dir.path().join("raw_each");
            let mut f = std::fs::File::create(&path).unwrap();
            b.iter(|| {
                f.write_all(&buf).unwrap();
                f.sync_data().unwrap();
            })
        });
    }
    g.finish();
}

fn append(c: &mut Criterion) {
    let mut g = c.benchmark_group("append");
    g.sample_size(10).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    for fsync in [FsyncPolicy::Always, FsyncPolicy::Interval, FsyncPolicy::Never] {
        for size in [100usize, 1024] {
            for appenders in [1usize, 8, 64] {
                let dir = tempfile::tempdir_in(".").unwrap();
                let storage = Arc::new(Storage::open(dir.path(), config(fsync)).unwrap());
                let per_thread = 256usize;
                g.throughput(Throughput::Elements((per_thread * appenders) as u64));
                let id = BenchmarkId::new(format!("{fsync:?}/{size}B").to_lowercase(), appenders);
                g.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        let start = Instant::now();
                        for _ in 0..iters {
                            std::thread::scope(|s| {
                                for t in 0..appenders {
                                    let storage = storage.clone();
                                    s.spawn(move || {
                                        let r = [record(&format!("bench/{t}"), size)];
                                        for _ in 0..per_thread {
                                            storage.append_blocking(&r).unwrap();
                                        }
                                    });
                                }
                            });
                        }
                        start.elapsed()
                    })
                });
                storage.close().unwrap();
            }
        }
    }
    g.finish();
}

/// Producer-style appends: 1,000 records of 1 KiB per call (a Kafka producer batch), which is
/// what shows the write path against the disk's bandwidth rather than per-call overhead.
fn append_batched(c: &mut Criterion) {
    let mut g = c.benchmark_group("append_batched");
    g.sample_size(10).measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    for fsync in [FsyncPolicy::Always, FsyncPolicy::Interval, FsyncPolicy::Never] {
        for appenders in [1usize, 8] {
            let dir = tempfile::tempdir_in(".").unwrap();
            let storage = Arc::new(Storage::open(dir.path(), config(fsync)).unwrap());
            let batch: Vec<Record> = (0..1000).map(|i| record(&format!("bench/{}", i % 10), 1024)).collect();
            let per_thread = 16usize;
            let bytes = (per_thread * appenders * batch.len() * 1024) as u64;
            g.throughput(Throughput::Bytes(bytes));
            let id = BenchmarkId::new(format!("{fsync:?}/1000x1024B").to_lowercase(), appenders);
            g.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        std::thread::scope(|s| {
                            for _ in 0..appenders {
                                let (storage, batch) = (storage.clone(), &batch);
                                s.spawn(move || {
                                    for _ in 0..per_thread {
                                        storage.append_blocking(batch).unwrap();
                                    }
                                });
                            }
                        });
                    }
                    start.elapsed()
                })
            });
            storage.close().unwrap();
        }
    }
    g.finish();
}

/// Writes `n` records spread over `topics` topics, then closes.
fn write_log(dir: &Path, n: usize, topics: usize) {
    let s = Storage::open(dir, config(FsyncPolicy::Never)).unwrap();
    let mut batch = Vec::with_capacity(1000);
    for i in 0..n {
        batch.push(record(&format!("devices/{}/telemetry", i % topics), 64));
        if batch.len() == 1000 {
            s.append_blocking(&batch).unwrap();
            batch.clear();
        }
    }
    if !batch.is_empty() {
        s.append_blocking(&batch).unwrap();
    }
    s.close().unwrap();
}

fn dir_size(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| {
                    let m = e.metadata().unwrap();
                    if m.is_dir() { dir_size(&e.path()) } else { m.len() }
                })
                .sum()
        })
        .unwrap_or(0)
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    g.sample_size(10).measurement_time(Duration::from_secs(20)).warm_up_time(Duration::from_millis(1));
    let n = 1_000_000usize;
    for (name, topics) in [("1_queue", 1usize), ("1m_queues", 1_000_000)] {
        let dir = tempfile::tempdir_in(".").unwrap();
        write_log(dir.path(), n, topics);
        // Each record gets two entries: its topic queue and its stream partition queue.
        g.throughput(Throughput::Elements(2 * n as u64));
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    std::fs::remove_dir_all(dir.path().join("index")).ok();
                    let rss0 = rss_bytes();
                    let start = Instant::now();
                    let s = Storage::open(dir.path(), config(FsyncPolicy::Never)).unwrap();
                    s.wait_dispatched_blocking(s.stats().log_end).unwrap();
                    total += start.elapsed();
                    let rss1 = rss_bytes();
                    s.close().unwrap();
                    let idx = dir_size(&dir.path().join("index"));
                    eprintln!(
                        "dispatch/{name}: {} queues, index on disk {:.1} MiB, RSS growth while open {:.1} MiB",
                        topics + 1,
                        idx as f64 / (1 << 20) as f64,
                        rss1.saturating_sub(rss0) as f64 / (1 << 20) as f64
                    );
                }
                total
            })
        });
    }
    g.finish();
}

fn read(c: &mut Criterion) {
    let mut g = c.benchmark_group("read");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    let n = 50_000usize;
    for (name, tail) in [("tail", 256u64 << 20), ("disk", 0)] {
        let dir = tempfile::tempdir_in(".").unwrap();
        let cfg = StorageConfig { tail_cache_bytes: tail, segment_bytes: 8 << 20, ..config(FsyncPolicy::Never) };
        let s = Storage::open(dir.path(), cfg.clone()).unwrap();
        let batch: Vec<Record> = (0..1000).map(|_| record("r/t", 1024)).collect();
        for _ in 0..n / 1000 {
            s.append_blocking(&batch).unwrap();
        }
        s.wait_dispatched_blocking(s.stats().log_end).unwrap();
        let id = s.queue_id(&QueueName::Topic("r/t".into())).unwrap().unwrap();
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut from = Offset(0);
                let mut bytes = 0usize;
                while from.get() < n as u64 {
                    let recs = s.read_queue(id, from, 1000).unwrap();
                    bytes += recs.iter().map(|(_, r)| r.value.len()).sum::<usize>();
                    from = Offset(from.get() + recs.len() as u64);
                }
                bytes
            })
        });
        s.close().unwrap();
        if name == "disk" {
            // Reopened for each pass: the first read of each batch checks its CRC.
            g.bench_function("disk_first_pass", |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let s = Storage::open(dir.path(), cfg.clone()).unwrap();
                        let start = Instant::now();
                        let mut from = Offset(0);
                        while from.get() < n as u64 {
                            let recs = s.read_queue(id, from, 1000).unwrap();
                            from = Offset(from.get() + recs.len() as u64);
                        }
                        total += start.elapsed();
                        s.close().unwrap();
                    }
                    total
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, raw_disk, append, append_batched, dispatch, read);
criterion_main!(benches);
