//! Identifier and position newtypes. A bare `u64` never crosses a crate boundary: a queue offset
//! and a commitlog byte position are different things and the compiler keeps them apart.

use std::fmt;

macro_rules! newtype {
    ($(#[$m:meta])* $name:ident($inner:ty)) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub $inner);

        impl $name {
            /// The raw value, for encoding.
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl From<$inner> for $name {
            fn from(v: $inner) -> Self {
                Self(v)
            }
        }
    };
}

newtype!(
    /// A byte position in the node's commitlog: segment base plus offset in the segment file.
    /// Positions only grow; a record's position never changes once acknowledged.
    LogPosition(u64)
);
newtype!(
    /// Identifies one consume queue (stream partition, MQTT topic or wildcard filter).
    QueueId(u64)
);
newtype!(
    /// A dense, per-queue index: the n-th entry of a queue has offset n.
    Offset(u64)
);
newtype!(
    /// A stream partition number (the Kafka view).
    Partition(u32)
);
newtype!(
    /// Milliseconds since the Unix epoch.
    Timestamp(i64)
);

impl LogPosition {
    /// The position `n` bytes further on.
    pub const fn add(self, n: u64) -> Self {
        Self(self.0 + n)
    }
}

impl Offset {
    /// The next offset.
    pub const fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

impl Timestamp {
    /// The wall-clock time now. Only edges (servers, tests) call this; cores take time as input.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Self(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}
