//! The disk's own sync latency, the floor under a broker that syncs before it acknowledges.
//!
//! With fsync always, a QoS 1 PUBACK waits for the log's `fdatasync`: a paced scenario's p99 and
//! maximum cannot be lower than those of the disk under it. This writes `size` bytes and calls
//! `fdatasync` every `interval` for `duration`, from one thread, into a file in `dir` (put it on
//! the broker's data directory's filesystem), and reports the latency of each write and sync.
//! The file is filled with zeros and synced first and then overwritten in place, as a log whose
//! files are zeroed ahead of the writer is; it is removed at the end.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::histogram::{Histogram, Summary};

/// Largest file written: the writes wrap around in it.
const MAX_FILE: u64 = 64 << 20;

#[derive(Clone, Debug)]
pub struct DiskSyncConfig {
    pub dir: PathBuf,
    pub size: usize,
    pub interval: Duration,
    pub duration: Duration,
}

impl DiskSyncConfig {
    pub fn case(&self) -> String {
        format!("{} B write + fdatasync every {} µs", self.size, self.interval.as_micros())
    }
}

#[derive(Debug, Serialize)]
pub struct DiskSyncReport {
    pub scenario: &'static str,
    pub case: String,
    pub broker: &'static str,
    pub syncs: u64,
    pub syncs_per_s: f64,
    pub sync_latency_us: Option<Summary>,
    pub sync_p999_us: u64,
    /// Syncs that took longer than 10 ms (the paced scenario's goal for a maximum).
    pub syncs_over_10ms: u64,
}

pub fn run(c: &DiskSyncConfig) -> anyhow::Result<DiskSyncReport> {
    anyhow::ensure!(c.size > 0 && c.size as u64 <= MAX_FILE, "--size must be 1..={MAX_FILE} bytes");
    let path = c.dir.join(format!("silt-loadgen-disk-sync.{}", std::process::id()));
    let result = measure(c, &path);
    let _ = std::fs::remove_file(&path);
    result
}

fn measure(c: &DiskSyncConfig, path: &Path) -> anyhow::Result<DiskSyncReport> {
    let file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    let writes = (c.duration.as_secs_f64() / c.interval.as_secs_f64().max(1e-6)).ceil() as u64 + 1;
    let len = (writes.saturating_mul(c.size as u64)).clamp(c.size as u64, MAX_FILE / c.size as u64 * c.size as u64);
    zero_fill(&file, len).with_context(|| format!("filling {}", path.display()))?;

    let block = vec![0x5a_u8; c.size];
    let mut latency = Histogram::default();
    let mut over = 0;
    let mut syncs = 0u64;
    let mut offset = 0;
    let start = Instant::now();
    while start.elapsed() < c.duration {
        let due = start + c.interval.mul_f64(syncs as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let t = Instant::now();
        file.write_all_at(&block, offset)?;
        file.sync_data()?;
        let us = t.elapsed().as_micros() as u64;
        latency.record(us);
        over += u64::from(us > 10_000);
        syncs += 1;
        offset = (offset + c.size as u64) % len;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(DiskSyncReport {
        scenario: "disk-sync",
        case: c.case(),
        broker: "disk",
        syncs,
        syncs_per_s: syncs as f64 / secs,
        sync_latency_us: latency.summary(),
        sync_p999_us: latency.quantile(0.999),
        syncs_over_10ms: over,
    })
}

/// Writes `len` bytes of zeros and syncs them, so that the timed writes change no extent.
fn zero_fill(file: &File, len: u64) -> std::io::Result<()> {
    let chunk = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(chunk.len() as u64) as usize;
        file.write_all_at(&chunk[..n], at)?;
        at += n as u64;
    }
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sync_is_counted_and_the_file_is_removed() {
        let dir = std::env::temp_dir().join(format!("silt-loadgen-disk-test.{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = DiskSyncConfig {
            dir: dir.clone(),
            size: 4096,
            interval: Duration::from_millis(10),
            duration: Duration::from_millis(200),
        };
        let r = run(&c).unwrap();
        // Paced at 10 ms for 200 ms: about 20 syncs, never more than the ticks allow.
        assert!((5..=21).contains(&r.syncs), "{} syncs", r.syncs);
        let s = r.sync_latency_us.expect("latencies recorded");
        assert_eq!(s.count, r.syncs);
        assert!(s.p50 <= s.p99 && s.p99 <= r.sync_p999_us && r.sync_p999_us <= s.max);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the probe file is removed");
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_the_file() {
        let c = DiskSyncConfig {
            dir: PathBuf::from("/nonexistent/silt-loadgen"),
            size: 4096,
            interval: Duration::from_millis(1),
            duration: Duration::from_millis(10),
        };
        let e = run(&c).unwrap_err();
        assert!(format!("{e:#}").contains("/nonexistent/silt-loadgen"), "{e:#}");
    }
}
