//! The API keys and versions the listener speaks, and its answer to `ApiVersions`.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

/// One Kafka API the listener answers, with the versions it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SupportedApi {
    /// The API.
    pub key: ApiKey,
    /// The oldest version answered.
    pub min_version: i16,
    /// The newest version answered.
    pub max_version: i16,
}

/// Every API the listener answers, as `ApiVersions` advertises them. Versions that name
/// topics by id instead of by name (Fetch 13 and later, DeleteTopics 6) are left out: clients
/// then use the versions that name them.
pub fn supported_apis() -> &'static [SupportedApi] {
    const fn api(key: ApiKey, min_version: i16, max_version: i16) -> SupportedApi {
        SupportedApi {
            key,
            min_version,
            max_version,
        }
    }
    const SUPPORTED: &[SupportedApi] = &[
        api(ApiKey::Produce, 3, 9),
        api(ApiKey::Fetch, 4, 12),
        api(ApiKey::ListOffsets, 1, 7),
        api(ApiKey::Metadata, 0, 12),
        api(ApiKey::ApiVersions, 0, 3),
        api(ApiKey::CreateTopics, 2, 7),
        api(ApiKey::DeleteTopics, 1, 5),
        api(ApiKey::InitProducerId, 0, 4),
        api(ApiKey::FindCoordinator, 0, 3),
        api(ApiKey::JoinGroup, 0, 5),
        api(ApiKey::SyncGroup, 0, 3),
        api(ApiKey::Heartbeat, 0, 3),
        api(ApiKey::LeaveGroup, 0, 3),
        api(ApiKey::OffsetCommit, 2, 7),
        api(ApiKey::OffsetFetch, 1, 7),
        api(ApiKey::DescribeGroups, 0, 4),
        api(ApiKey::ListGroups, 0, 4),
        api(ApiKey::DeleteRecords, 0, 2),
        api(ApiKey::DescribeConfigs, 1, 4),
        api(ApiKey::AlterConfigs, 0, 2),
        api(ApiKey::IncrementalAlterConfigs, 0, 1),
        api(ApiKey::CreatePartitions, 0, 3),
        api(ApiKey::DeleteGroups, 0, 2),
        api(ApiKey::OffsetDelete, 0, 0),
        api(ApiKey::DescribeCluster, 0, 2),
        api(ApiKey::DescribeLogDirs, 1, 4),
        api(ApiKey::DescribeProducers, 0, 0),
        // Version 1 sends the mechanism's bytes in SaslAuthenticate, version 0 outside Kafka's
        // framing, which the listener does not read: a version 0 handshake is answered
        // UNSUPPORTED_VERSION (see `sasl`). Advertised from 0 all the same, as Kafka's brokers
        // do: librdkafka before 2.x (Debian's kcat) turns its SASL handshake on only when
        // version 0 is in the range.
        api(ApiKey::SaslHandshake, 0, 1),
        api(ApiKey::SaslAuthenticate, 0, 2),
    ];
    SUPPORTED
}

/// Whether the listener answers `key` in `version`.
pub(crate) fn is_supported(key: ApiKey, version: i16) -> bool {
    supported_apis()
        .iter()
        .any(|api| api.key == key && (api.min_version..=api.max_version).contains(&version))
}

/// The answer to `ApiVersions`: every supported API with its versions, and `error_code` (0, or
/// `UNSUPPORTED_VERSION` for a request of a version the listener does not speak, which is
/// answered in version 0 so that the client can read it and ask again).
pub(crate) fn api_versions(error_code: i16) -> ApiVersionsResponse {
    let api_keys = supported_apis()
        .iter()
        .map(|api| {
            ApiVersion::default()
                .with_api_key(api.key as i16)
                .with_min_version(api.min_version)
                .with_max_version(api.max_version)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(error_code)
        .with_api_keys(api_keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_advertised_version_is_one_the_codec_speaks() {
        for api in supported_apis() {
            let codec = api.key.valid_versions();
            assert!(
                codec.min <= api.min_version && api.max_version <= codec.max,
                "{:?} {}..={} is outside the codec's {}..={}",
                api.key,
                api.min_version,
                api.max_version,
                codec.min,
                codec.max
            );
            assert!(is_supported(api.key, api.max_version));
            assert!(!is_supported(api.key, api.max_version + 1));
        }
    }
}
