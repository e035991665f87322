//! The coordinator's settings: Kafka's group timing settings under their Kafka names, and the
//! bounds on everything a client makes the coordinator keep.

use std::time::Duration;

/// The coordinator's settings. [`Settings::default`] holds Kafka's defaults where Kafka has the
/// setting, and Silt's bounds where it has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `group.initial.rebalance.delay.ms` (3 s): how long a new group waits for more members
    /// before its first generation; each member joining meanwhile extends the wait by as much
    /// again, up to the rebalance timeout. Tests use 0.
    pub initial_rebalance_delay: Duration,
    /// `group.min.session.timeout.ms` (6 s): shorter session timeouts are refused with
    /// INVALID_SESSION_TIMEOUT.
    pub min_session_timeout: Duration,
    /// `group.max.session.timeout.ms` (30 min): longer ones likewise.
    pub max_session_timeout: Duration,
    /// How long a new member's JoinGroup may stay parked before the member is dropped (5 min;
    /// fixed in Kafka): its session timeout cannot run before it knows its member id.
    pub new_member_join_timeout: Duration,
    /// `group.max.size` (Kafka: unbounded; here 10,000): members (and members told
    /// MEMBER_ID_REQUIRED) per group; one more is refused with GROUP_MAX_SIZE_REACHED.
    pub max_group_size: usize,
    /// Members over all groups (1,000,000), so that many groups cannot add up to more than one
    /// node can hold; one more is refused with GROUP_MAX_SIZE_REACHED.
    pub max_members: usize,
    /// Groups held (100,000); a JoinGroup or simple OffsetCommit that would create one more is
    /// answered COORDINATOR_NOT_AVAILABLE, which clients retry: empty groups without offsets
    /// go at the next retention check.
    pub max_groups: usize,
    /// Longest group id (255 bytes): longer ones are INVALID_GROUP_ID.
    pub max_group_id_bytes: usize,
    /// Longest group instance id, protocol type and protocol name (255 bytes): longer ones are
    /// INVALID_REQUEST. Client ids and hosts are cut to this length where they are kept.
    pub max_name_bytes: usize,
    /// Protocols one JoinGroup may offer (16; clients send one to three): more is
    /// INVALID_REQUEST.
    pub max_protocols: usize,
    /// Protocol metadata of one member, summed over its protocols (1 MiB): more is
    /// INVALID_REQUEST.
    pub max_member_metadata_bytes: usize,
    /// One member's assignment in a SyncGroup (1 MiB): more is INVALID_REQUEST.
    pub max_assignment_bytes: usize,
    /// `offset.metadata.max.bytes` (4096): longer commit metadata is OFFSET_METADATA_TOO_LARGE
    /// for that partition.
    pub max_offset_metadata_bytes: usize,
    /// `offsets.retention.minutes` (7 days): how long offsets outlive a group's last member
    /// (or, for a group that never had members, their commit).
    pub offsets_retention: Duration,
    /// `offsets.retention.check.interval.ms` (10 min): how often expired offsets and empty
    /// groups without offsets are removed.
    pub offsets_retention_check_interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            initial_rebalance_delay: Duration::from_secs(3),
            min_session_timeout: Duration::from_secs(6),
            max_session_timeout: Duration::from_secs(30 * 60),
            new_member_join_timeout: Duration::from_secs(5 * 60),
            max_group_size: 10_000,
            max_members: 1_000_000,
            max_groups: 100_000,
            max_group_id_bytes: 255,
            max_name_bytes: 255,
            max_protocols: 16,
            max_member_metadata_bytes: 1 << 20,
            max_assignment_bytes: 1 << 20,
            max_offset_metadata_bytes: 4096,
            offsets_retention: Duration::from_secs(7 * 24 * 3600),
            offsets_retention_check_interval: Duration::from_secs(600),
        }
    }
}

/// A setting that cannot work, named by its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("group coordinator setting `{key}`: {reason}")]
pub struct SettingsError {
    pub key: &'static str,
    pub reason: &'static str,
}

impl Settings {
    /// Checks the settings once, at start-up.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let fail = |key, reason| Err(SettingsError { key, reason });
        if self.min_session_timeout > self.max_session_timeout {
            return fail("min_session_timeout", "is above max_session_timeout");
        }
        if self.max_session_timeout.as_millis() > i32::MAX as u128 {
            return fail("max_session_timeout", "exceeds what a request can carry (i32 milliseconds)");
        }
        for (key, n) in [
            ("max_group_size", self.max_group_size),
            ("max_members", self.max_members),
            ("max_groups", self.max_groups),
            ("max_group_id_bytes", self.max_group_id_bytes),
            ("max_name_bytes", self.max_name_bytes),
            ("max_protocols", self.max_protocols),
        ] {
            if n == 0 {
                return fail(key, "must be at least 1");
            }
        }
        if self.offsets_retention_check_interval.is_zero() {
            return fail("offsets_retention_check_interval", "must be above zero");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_kafkas_and_valid() {
        let s = Settings::default();
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.initial_rebalance_delay, Duration::from_millis(3000));
        assert_eq!(s.min_session_timeout, Duration::from_millis(6000));
        assert_eq!(s.max_session_timeout, Duration::from_millis(1_800_000));
        assert_eq!(s.max_offset_metadata_bytes, 4096);
    }

    #[test]
    fn a_bad_setting_is_named() {
        let s = Settings { min_session_timeout: Duration::from_secs(3600), ..Settings::default() };
        assert_eq!(s.validate().unwrap_err().key, "min_session_timeout");
        let s = Settings { max_group_size: 0, ..Settings::default() };
        assert_eq!(s.validate().unwrap_err().key, "max_group_size");
    }
}
