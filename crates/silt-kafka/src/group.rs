//! The consumer-group coordinator of the classic group protocol. So far: the records it asks
//! the driver to persist for committed offsets, and their encoding (`record`).

mod record;

pub use record::{CommittedOffset, Record, RecordError};
