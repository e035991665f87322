//! The APIs and versions this broker speaks, and the ApiVersions response that announces them.
//!
//! Ranges stop where a version needs something Silt does not have: Fetch 13+ and DeleteTopics
//! 6+ address topics by id, Produce 10+, EndTxn 4+ and InitProducerId 5+ are KIP-890's second
//! transaction protocol, JoinGroup 8+ and OffsetCommit 9+ come with KIP-848's consumer
//! protocol. Clients pick the highest version both sides speak.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

/// (API, lowest, highest version served). Only what the driver serves is announced: an API
/// joins this list with its handler.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 1, 12),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 5),
    (ApiKey::DescribeConfigs, 1, 4),
    // After a v0 handshake the SASL tokens come raw, without a request header (Kafka < 1.0);
    // librdkafka 2.0 insists on v0 being announced, then uses v1 and SaslAuthenticate.
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
];

/// The versions of `key` this broker speaks, if any.
pub fn supported(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED.iter().find(|(k, _, _)| *k == key).map(|&(_, min, max)| (min, max))
}

/// The ApiVersions response: every API served, with `error_code` (0, or UNSUPPORTED_VERSION
/// when the request's own version was not).
pub fn api_versions(error_code: i16) -> ApiVersionsResponse {
    let api_keys = SUPPORTED
        .iter()
        .map(|&(k, min, max)| ApiVersion::default().with_api_key(k as i16).with_min_version(min).with_max_version(max))
        .collect();
    ApiVersionsResponse::default().with_error_code(error_code).with_api_keys(api_keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_apis_are_announced_as_the_coordinator_answers_them() {
        for &(key, min, max) in crate::group::SERVED {
            assert_eq!(supported(key), Some((min, max)), "{key:?}");
        }
    }

    #[test]
    fn every_range_served_is_one_the_codec_knows() {
        for &(key, min, max) in SUPPORTED {
            let known = key.valid_versions();
            assert!(min <= max && min >= known.min && max <= known.max, "{key:?} {min}..={max} vs {known:?}");
        }
    }
}
