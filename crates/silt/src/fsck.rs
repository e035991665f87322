//! `silt fsck DATA_DIR`: an offline check of a stopped node's commitlog. Every batch of every
//! segment file is read and its CRC and framing checked, opened read only: nothing is changed
//! (the next `silt serve` heals or quarantines what this finds, from the bucket where it can).
//! Names each bad range by segment and log position; exit code 1 when anything is bad.
//!
//! Then the consume-queue index is checked against the log (`silt_storage::check_index`):
//! every entry of the local segments' range must name its queue's next record, at dense
//! offsets, and the index must not cover more log than there is. A missing index is no
//! problem (the next start builds it from the log).

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};

/// What was found, for the summary and the exit code.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub segments: u64,
    pub bytes: u64,
    pub batches: u64,
    pub gaps: u64,
    /// The index check, when the data directory has an index.
    pub index: Option<silt_storage::IndexCheck>,
    /// Human-readable lines, one per bad range or index disagreement.
    pub problems: Vec<String>,
}

pub fn run(data_dir: &Path, config: &silt_storage::StorageConfig) -> anyhow::Result<Summary> {
    let max_batch_bytes = config.max_batch_bytes as usize;
    let log_dir = silt_storage::log_dir(data_dir);
    if !log_dir.is_dir() {
        anyhow::bail!("{} has no commitlog (no {})", data_dir.display(), log_dir.display());
    }
    let files = silt_storage::segment_files(&log_dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let sizes: Vec<u64> = files.iter().map(|(_, p)| std::fs::metadata(p).map_or(0, |m| m.len())).collect();
    let total: u64 = sizes.iter().sum();
    // Drawn on a terminal only; a script sees the summary alone.
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{spinner} checking {msg} {bar:30} {bytes}/{total_bytes} ({eta} left)")
            .expect("invariant: a valid template"),
    );
    let mut s = Summary::default();
    let newest = files.last().map(|(base, _)| *base);
    for ((base, path), size) in files.iter().zip(sizes) {
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        bar.set_message(name.clone());
        let found = silt_storage::check_segment_file(path, max_batch_bytes);
        bar.inc(size);
        s.segments += 1;
        s.bytes += size;
        let found = match found {
            Ok(f) => f,
            Err(e) => {
                s.problems.push(format!("segment {name}: cannot be read: {e}"));
                continue;
            }
        };
        s.batches += found.batches;
        s.gaps += found.gaps;
        for (start, end, why) in &found.bad {
            s.problems.push(format!(
                "segment {name}: bad batch at log position {} ({} bytes, valid batches follow): {why}",
                base.get() + start,
                end - start
            ));
        }
        if found.zeros > 0 && Some(*base) != newest {
            // The newest segment's are preallocated space; a sealed one is cut to its data.
            s.problems.push(format!("segment {name}: {} bytes of zeros at the end of a sealed segment", found.zeros));
        }
        if let Some((start, why)) = &found.bad_end {
            let what = if Some(*base) == newest {
                "a torn write at the end of the newest segment (cut at the next start)"
            } else {
                "bad bytes to the end of a sealed segment"
            };
            s.problems.push(format!(
                "segment {name}: {what}, from log position {} ({} bytes): {why}",
                base.get() + start,
                size.saturating_sub(*start)
            ));
        }
    }
    bar.finish_and_clear();

    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{spinner} checking the index against the log {bar:30} {bytes}/{total_bytes} ({eta} left)",
        )
        .expect("invariant: a valid template"),
    );
    let index = silt_storage::check_index(data_dir, config, &|read| bar.set_position(read))
        .map_err(|e| anyhow::anyhow!("the index could not be read: {e}"))?;
    bar.finish_and_clear();
    if !index.missing {
        s.problems.extend(index.problems.iter().map(|p| format!("index: {p}")));
        if index.more_problems > 0 {
            s.problems.push(format!("index: {} more problems", index.more_problems));
        }
        s.index = Some(index);
    }
    Ok(s)
}
