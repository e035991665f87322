//! Filling an empty data directory from elsewhere (the object store) before [`Storage`] opens
//! it: sealed segments are installed as files, then an empty active segment is started where
//! they end, so the log continues at the same positions and the index rebuild replays them.
//!
//! [`Storage`]: crate::Storage

use std::io::Write;
use std::path::{Path, PathBuf};

use silt_types::LogPosition;

use crate::error::{Error, Result};
use crate::format::{self, SEGMENT_HEADER_LEN};
use crate::segment::{self, Segment};

/// The commitlog directory inside a data directory.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("log")
}

/// Writes the bytes of a sealed segment (header included) as the segment file at `base`,
/// atomically (temporary file, fsync, rename, directory fsync). The header is checked.
pub fn install_segment(log_dir: &Path, base: LogPosition, bytes: &[u8]) -> Result<()> {
    std::fs::create_dir_all(log_dir).map_err(Error::io("create log directory", log_dir))?;
    if bytes.len() < SEGMENT_HEADER_LEN as usize || bytes[..SEGMENT_HEADER_LEN as usize] != format::segment_header() {
        return Err(Error::Invalid(format!("segment at {base} has no valid header")));
    }
    let path = log_dir.join(segment::file_name(base));
    let tmp = path.with_extension("part");
    let mut f = std::fs::File::create(&tmp).map_err(Error::io("create segment", &tmp))?;
    f.write_all(bytes).map_err(Error::io("write segment", &tmp))?;
    f.sync_all().map_err(Error::io("fsync segment", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(Error::io("rename segment", &path))?;
    segment::sync_dir(log_dir)
}

/// Starts an empty active segment at `base` (where the installed segments end).
pub fn start_segment(log_dir: &Path, base: LogPosition) -> Result<()> {
    std::fs::create_dir_all(log_dir).map_err(Error::io("create log directory", log_dir))?;
    Segment::create(log_dir, base).map(|_| ())
}
