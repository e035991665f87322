//! The records the coordinator asks to persist, and their encoding.
//!
//! Replaying every record persisted, in the order the coordinator raised them, restores the
//! committed offsets: a [`Record::Commit`] sets one partition's offset, a
//! [`Record::OffsetTombstone`] removes one (offset retention), a [`Record::GroupTombstone`]
//! removes a group with all its offsets (DeleteGroups). A key-value store can apply them as
//! put, delete and delete-prefix on (group, topic, partition).
//!
//! Encoding (big-endian), version 1:
//! ```text
//! u8 version = 1 | u8 kind (1 commit, 2 offset tombstone, 3 group tombstone) | str16 group
//! kinds 1, 2:  str16 topic | i32 partition
//! kind 1:      i64 offset | i32 leader epoch (-1: none) | str32 metadata
//!              | i64 commit timestamp (ms) | u8 has expiry | [i64 expire timestamp (ms)]
//! ```
//! `str16`/`str32` are a u16/u32 byte length and that much UTF-8. A record is exactly its
//! bytes: [`Record::decode`] refuses trailing bytes, and returns an error for anything it cannot
//! read, never panicking and never allocating more than its input.

use bytes::{BufMut, Bytes, BytesMut};
use silt_types::Timestamp;

const VERSION: u8 = 1;
const COMMIT: u8 = 1;
const OFFSET_TOMBSTONE: u8 = 2;
const GROUP_TOMBSTONE: u8 = 3;

/// A committed offset, as OffsetFetch reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    /// -1: none given.
    pub leader_epoch: i32,
    /// As committed; a null is kept as "" (Kafka does the same).
    pub metadata: String,
    /// Wall clock at the commit.
    pub commit_timestamp: Timestamp,
    /// From an OffsetCommit v2–v4 `retention_time_ms`; otherwise the group's retention applies.
    pub expire_timestamp: Option<Timestamp>,
}

/// A record to persist. Group, topic and partition are Kafka's (a partition is the wire's i32).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Commit { group: String, topic: String, partition: i32, offset: CommittedOffset },
    OffsetTombstone { group: String, topic: String, partition: i32 },
    GroupTombstone { group: String },
}

/// Why bytes are not a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("group record truncated")]
    Truncated,
    #[error("group record of unknown version {0}")]
    UnknownVersion(u8),
    #[error("group record of unknown kind {0}")]
    UnknownKind(u8),
    #[error("group record with a string that is not UTF-8")]
    NotUtf8,
    #[error("group record with expiry flag {0}, neither 0 nor 1")]
    BadFlag(u8),
    #[error("group record with {0} bytes after its end")]
    TrailingBytes(usize),
    #[error("group record with a {what} of {len} bytes, above the u16 length of its encoding")]
    TooLong { what: &'static str, len: usize },
}

impl Record {
    pub fn group(&self) -> &str {
        match self {
            Record::Commit { group, .. } | Record::OffsetTombstone { group, .. } | Record::GroupTombstone { group } => {
                group
            }
        }
    }

    /// The record's bytes. Fails only for a group id or topic over 65,535 bytes, which the
    /// coordinator never produces (its limits are far lower).
    pub fn encode(&self) -> Result<Bytes, RecordError> {
        let mut out = BytesMut::with_capacity(64);
        out.put_u8(VERSION);
        match self {
            Record::Commit { group, topic, partition, offset } => {
                out.put_u8(COMMIT);
                put_str16(&mut out, "group", group)?;
                put_str16(&mut out, "topic", topic)?;
                out.put_i32(*partition);
                out.put_i64(offset.offset);
                out.put_i32(offset.leader_epoch);
                let len = u32::try_from(offset.metadata.len())
                    .map_err(|_| RecordError::TooLong { what: "metadata", len: offset.metadata.len() })?;
                out.put_u32(len);
                out.put_slice(offset.metadata.as_bytes());
                out.put_i64(offset.commit_timestamp.0);
                match offset.expire_timestamp {
                    Some(t) => {
                        out.put_u8(1);
                        out.put_i64(t.0);
                    }
                    None => out.put_u8(0),
                }
            }
            Record::OffsetTombstone { group, topic, partition } => {
                out.put_u8(OFFSET_TOMBSTONE);
                put_str16(&mut out, "group", group)?;
                put_str16(&mut out, "topic", topic)?;
                out.put_i32(*partition);
            }
            Record::GroupTombstone { group } => {
                out.put_u8(GROUP_TOMBSTONE);
                put_str16(&mut out, "group", group)?;
            }
        }
        Ok(out.freeze())
    }

    /// Reads a record written by [`Record::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Record, RecordError> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != VERSION {
            return Err(RecordError::UnknownVersion(version));
        }
        let kind = r.u8()?;
        let record = match kind {
            COMMIT => {
                let group = r.str16()?;
                let topic = r.str16()?;
                let partition = r.i32()?;
                let offset = r.i64()?;
                let leader_epoch = r.i32()?;
                let len = r.u32()? as usize;
                let metadata = r.str(len)?;
                let commit_timestamp = Timestamp(r.i64()?);
                let expire_timestamp = match r.u8()? {
                    0 => None,
                    1 => Some(Timestamp(r.i64()?)),
                    flag => return Err(RecordError::BadFlag(flag)),
                };
                let offset = CommittedOffset { offset, leader_epoch, metadata, commit_timestamp, expire_timestamp };
                Record::Commit { group, topic, partition, offset }
            }
            OFFSET_TOMBSTONE => {
                let group = r.str16()?;
                let topic = r.str16()?;
                Record::OffsetTombstone { group, topic, partition: r.i32()? }
            }
            GROUP_TOMBSTONE => Record::GroupTombstone { group: r.str16()? },
            other => return Err(RecordError::UnknownKind(other)),
        };
        if !r.0.is_empty() {
            return Err(RecordError::TrailingBytes(r.0.len()));
        }
        Ok(record)
    }
}

fn put_str16(out: &mut BytesMut, what: &'static str, s: &str) -> Result<(), RecordError> {
    let len = u16::try_from(s.len()).map_err(|_| RecordError::TooLong { what, len: s.len() })?;
    out.put_u16(len);
    out.put_slice(s.as_bytes());
    Ok(())
}

/// Reads from the front of a slice; every read checks the length first.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or(RecordError::Truncated)?;
        self.0 = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, RecordError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    fn i32(&mut self) -> Result<i32, RecordError> {
        Ok(i32::from_be_bytes(self.take()?))
    }

    fn i64(&mut self) -> Result<i64, RecordError> {
        Ok(i64::from_be_bytes(self.take()?))
    }

    fn str16(&mut self) -> Result<String, RecordError> {
        let len = u16::from_be_bytes(self.take()?) as usize;
        self.str(len)
    }

    /// `len` bytes of UTF-8; the length is checked against what is left before anything is
    /// allocated.
    fn str(&mut self, len: usize) -> Result<String, RecordError> {
        if self.0.len() < len {
            return Err(RecordError::Truncated);
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        std::str::from_utf8(head).map(str::to_owned).map_err(|_| RecordError::NotUtf8)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn committed() -> impl Strategy<Value = CommittedOffset> {
        (any::<i64>(), any::<i32>(), ".{0,40}", any::<i64>(), proptest::option::of(any::<i64>())).prop_map(
            |(offset, leader_epoch, metadata, ts, exp)| CommittedOffset {
                offset,
                leader_epoch,
                metadata,
                commit_timestamp: Timestamp(ts),
                expire_timestamp: exp.map(Timestamp),
            },
        )
    }

    fn record() -> impl Strategy<Value = Record> {
        prop_oneof![
            (".{0,30}", ".{0,30}", any::<i32>(), committed())
                .prop_map(|(group, topic, partition, offset)| Record::Commit { group, topic, partition, offset }),
            (".{0,30}", ".{0,30}", any::<i32>()).prop_map(|(group, topic, partition)| Record::OffsetTombstone {
                group,
                topic,
                partition
            }),
            ".{0,30}".prop_map(|group| Record::GroupTombstone { group }),
        ]
    }

    proptest! {
        #[test]
        fn every_record_round_trips(r in record()) {
            let bytes = r.encode().unwrap();
            prop_assert_eq!(Record::decode(&bytes), Ok(r));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Record::decode(&bytes);
        }

        #[test]
        fn a_record_with_a_byte_changed_or_cut_never_panics(r in record(), at in any::<prop::sample::Index>(), x in any::<u8>()) {
            let mut bytes = r.encode().unwrap().to_vec();
            let i = at.index(bytes.len());
            bytes[i] ^= x | 1;
            let _ = Record::decode(&bytes);
            let _ = Record::decode(&bytes[..i]);
        }

        #[test]
        fn a_cut_record_is_refused(r in record(), at in any::<prop::sample::Index>()) {
            let bytes = r.encode().unwrap();
            let i = at.index(bytes.len());
            prop_assert!(Record::decode(&bytes[..i]).is_err());
        }
    }

    #[test]
    fn refusals_name_the_fault() {
        let r = Record::GroupTombstone { group: "g".into() };
        let mut bytes = r.encode().unwrap().to_vec();
        bytes.push(0);
        assert_eq!(Record::decode(&bytes), Err(RecordError::TrailingBytes(1)));
        assert_eq!(Record::decode(&[2, 3]), Err(RecordError::UnknownVersion(2)));
        assert_eq!(Record::decode(&[1, 9]), Err(RecordError::UnknownKind(9)));
        assert_eq!(Record::decode(&[1, 3, 0, 1, 0xff]), Err(RecordError::NotUtf8));
        // A length far beyond the input allocates nothing and is refused.
        assert_eq!(Record::decode(&[1, 3, 0xff, 0xff]), Err(RecordError::Truncated));
        let long = Record::GroupTombstone { group: "x".repeat(70_000) };
        assert!(matches!(long.encode(), Err(RecordError::TooLong { what: "group", .. })));
    }
}
