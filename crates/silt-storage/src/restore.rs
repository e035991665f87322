//! Filling an empty data directory from elsewhere (the object store) before [`Storage`] opens
//! it: sealed segments are staged, checked and renamed into place, then an empty active
//! segment is started where they end, so the log continues at the same positions and the
//! index rebuild replays them.
//!
//! [`Storage`]: crate::Storage

use std::path::{Path, PathBuf};

use silt_types::LogPosition;

use crate::error::{Error, Result};
use crate::format::{self, SEGMENT_HEADER_LEN};
use crate::segment::{self, Segment};

/// The commitlog directory inside a data directory.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("log")
}

/// Where to write a segment's bytes before [`install_segment_file`] moves them into place.
pub fn staging_path(log_dir: &Path, base: LogPosition) -> PathBuf {
    log_dir.join(segment::file_name(base)).with_extension("part")
}

/// Installs a segment written (and checked by the caller) at [`staging_path`]: fsync, header
/// check, rename, directory fsync.
pub fn install_segment_file(log_dir: &Path, base: LogPosition) -> Result<()> {
    use std::io::Read;
    let tmp = staging_path(log_dir, base);
    let mut f = std::fs::File::open(&tmp).map_err(Error::io("open staged segment", &tmp))?;
    let mut header = [0u8; SEGMENT_HEADER_LEN as usize];
    f.read_exact(&mut header).map_err(Error::io("read staged segment", &tmp))?;
    if header != format::segment_header() {
        return Err(Error::Invalid(format!("segment at {base} has no valid header")));
    }
    f.sync_all().map_err(Error::io("fsync segment", &tmp))?;
    let path = log_dir.join(segment::file_name(base));
    std::fs::rename(&tmp, &path).map_err(Error::io("rename segment", &path))?;
    segment::sync_dir(log_dir)
}

/// Starts an empty active segment at `base` (where the installed segments end).
pub fn start_segment(log_dir: &Path, base: LogPosition) -> Result<()> {
    std::fs::create_dir_all(log_dir).map_err(Error::io("create log directory", log_dir))?;
    Segment::create(log_dir, base).map(|_| ())
}
