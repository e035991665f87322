//! The storage engine's error type.

use std::path::PathBuf;

use crate::format::FormatError;

/// What a caller may do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad input from the caller (a record too large, an invalid name).
    InvalidInput,
    /// Stored data failed its checks.
    Corrupt,
    /// The engine is shut down or has stopped after a fatal I/O error.
    Closed,
    /// The data is gone: deleted by retention, withheld, or lost to corruption.
    Expired,
    /// A transient failure (the object store unreachable, a full disk): the same call may
    /// succeed later.
    Retryable,
    /// An I/O or index failure.
    Internal,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: std::io::Error },
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("corrupt data at position {position}: {source}")]
    Corrupt { position: u64, source: FormatError },
    #[error("record format: {0}")]
    Format(#[from] FormatError),
    #[error("index: {0}")]
    Index(#[from] rocksdb::Error),
    #[error("position {0} is not in the log")]
    NotFound(u64),
    #[error("position {0} was deleted by retention")]
    Expired(u64),
    #[error("the record at {0} was kept off the object store (tier \"local\") and its local copy is gone")]
    Withheld(u64),
    #[error("the batch at position {0} failed its checks and was quarantined; its records are lost")]
    Quarantined(u64),
    #[error("object store: {0}")]
    Remote(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("another node owns this log's object-store prefix (fenced); writes are refused")]
    Fenced,
    #[error("storage is closed")]
    Closed,
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Invalid(_) | Error::Format(_) => ErrorKind::InvalidInput,
            Error::Corrupt { .. } => ErrorKind::Corrupt,
            Error::Closed | Error::Fenced => ErrorKind::Closed,
            Error::Expired(_) | Error::Withheld(_) | Error::Quarantined(_) => ErrorKind::Expired,
            Error::Remote(_) | Error::Unavailable(_) => ErrorKind::Retryable,
            Error::Io { .. } | Error::Index(_) | Error::NotFound(_) => ErrorKind::Internal,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
