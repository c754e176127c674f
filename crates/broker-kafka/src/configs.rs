//! Kafka's topic configs and the broker's topic settings: the settings a topic created through
//! Kafka gets from its configs, the settings `AlterConfigs` and `IncrementalAlterConfigs`
//! change, and the configs `DescribeConfigs` shows for a topic.

use broker_core::{Discard, Retention, TopicDescription, TopicSetting, TopicSettings};
use kafka_protocol::messages::create_topics_request::CreatableTopicConfig;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

/// Kafka's default retention of a topic: seven days.
const DEFAULT_RETENTION_MS: u64 = 7 * 24 * 60 * 60 * 1000;

/// Kafka's resource type of a topic in `DescribeConfigs` and `AlterConfigs`.
pub(crate) const TOPIC: i8 = 2;
/// Kafka's resource type of a broker in `DescribeConfigs` and `AlterConfigs`.
pub(crate) const BROKER: i8 = 4;

/// `IncrementalAlterConfigs`'s operation that sets a config (the others delete one, or append
/// to or subtract from a list).
pub(crate) const OP_SET: i8 = 0;
/// `IncrementalAlterConfigs`'s operation that deletes a config (back to its default).
pub(crate) const OP_DELETE: i8 = 1;

/// Where a config's value comes from, as Kafka numbers it: set for the topic.
const SOURCE_TOPIC: i8 = 1;
/// Where a config's value comes from, as Kafka numbers it: the default.
const SOURCE_DEFAULT: i8 = 5;

/// Kafka's config types (`DescribeConfigs` version 3 and later).
const TYPE_STRING: i8 = 2;
const TYPE_LONG: i8 = 5;
const TYPE_LIST: i8 = 7;

/// The settings of a topic created through Kafka: limits retention, as Kafka's topics have,
/// for seven days unless `retention.ms` says otherwise (`-1`: forever), and up to
/// `retention.bytes` per partition when given. Other configs are refused, naming them.
pub(crate) fn topic_settings(
    configs: &[CreatableTopicConfig],
) -> Result<Vec<TopicSetting>, String> {
    let mut max_age_ms = Some(DEFAULT_RETENTION_MS);
    let mut max_bytes = None;
    for config in configs {
        let name = config.name.as_str();
        let value = config.value.as_ref().map(|value| value.as_str());
        match name {
            // What every topic of the broker does anyway.
            _ if is_what_every_topic_does(name, value) => {}
            "retention.ms" => max_age_ms = limit(name, value)?,
            "retention.bytes" => max_bytes = limit(name, value)?,
            other => {
                return Err(format!(
                    "topic config {other}={} is not supported (supported: retention.ms, \
                     retention.bytes, cleanup.policy=delete, min.insync.replicas=1)",
                    value.unwrap_or("null")
                ))
            }
        }
    }
    let mut settings = vec![
        TopicSetting::Retention(Retention::Limits),
        TopicSetting::Discard(Discard::Old),
    ];
    settings.extend(max_age_ms.map(TopicSetting::MaxAgeMs));
    settings.extend(max_bytes.map(TopicSetting::MaxBytes));
    Ok(settings)
}

/// Whether config `name` set to `value` asks for what every topic of the broker does anyway:
/// `cleanup.policy=delete` and `min.insync.replicas=1`.
fn is_what_every_topic_does(name: &str, value: Option<&str>) -> bool {
    matches!(
        (name, value),
        ("cleanup.policy", Some("delete")) | ("min.insync.replicas", Some("1"))
    )
}

/// A limit config's value: a positive number, or `-1` for none (`None`).
fn limit(name: &str, value: Option<&str>) -> Result<Option<u64>, String> {
    let number = value
        .and_then(|value| value.parse::<i64>().ok())
        .ok_or_else(|| {
            format!(
                "{name} must be a whole number, got {:?}",
                value.unwrap_or("null")
            )
        })?;
    match number {
        -1 => Ok(None),
        positive if positive > 0 => Ok(Some(positive as u64)),
        other => Err(format!("{name} must be -1 or positive, got {other}")),
    }
}

/// The settings an `AlterConfigs` or `IncrementalAlterConfigs` SET of `configs` (name and
/// value) changes on an existing topic: `retention.ms` (its maximum age), `retention.bytes`
/// (its byte limit), and the broker's own `broker.max.records`, `broker.discard` (`old` or
/// `new`) and `broker.retention` (which the broker refuses to change, but accepts as it is).
/// `cleanup.policy=delete` and `min.insync.replicas=1` change nothing. A limit cannot be
/// removed (`-1`), and other configs are refused, naming them.
pub(crate) fn changed_settings<'a>(
    configs: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> Result<Vec<TopicSetting>, String> {
    let mut settings = Vec::new();
    for (name, value) in configs {
        let setting = match name {
            _ if is_what_every_topic_does(name, value) => continue,
            "retention.ms" | "retention.bytes" | "broker.max.records" => {
                let Some(limit) = limit(name, value)? else {
                    return Err(cannot_remove(name));
                };
                match name {
                    "retention.ms" => TopicSetting::MaxAgeMs(limit),
                    "retention.bytes" => TopicSetting::MaxBytes(limit),
                    _ => TopicSetting::MaxRecords(limit),
                }
            }
            "broker.discard" => match value {
                Some("old") => TopicSetting::Discard(Discard::Old),
                Some("new") => TopicSetting::Discard(Discard::New),
                other => {
                    return Err(format!(
                        "broker.discard must be old or new, got {:?}",
                        other.unwrap_or("null")
                    ))
                }
            },
            "broker.retention" => match value {
                Some("interest") => TopicSetting::Retention(Retention::Interest),
                Some("limits") => TopicSetting::Retention(Retention::Limits),
                other => {
                    return Err(format!(
                        "broker.retention must be interest or limits, got {:?}",
                        other.unwrap_or("null")
                    ))
                }
            },
            other => {
                return Err(format!(
                    "topic config {other}={} cannot change (supported: retention.ms, \
                     retention.bytes, broker.max.records, broker.discard)",
                    value.unwrap_or("null")
                ))
            }
        };
        settings.push(setting);
    }
    Ok(settings)
}

/// Why config `name` cannot go back to "no limit".
pub(crate) fn cannot_remove(name: &str) -> String {
    format!(
        "{name} cannot be removed or set to -1: the broker cannot remove a topic's limit (set a \
         larger one instead)"
    )
}

/// The answer to `DescribeConfigs` from the topics as `topics` describes them (or the error
/// that kept them from being read): each topic's configs (those asked for, or all), read-only
/// but for those `AlterConfigs` changes; a broker has none to show; another resource type is
/// refused.
pub(crate) fn describe_configs(
    request: &DescribeConfigsRequest,
    topics: &Result<Vec<TopicDescription>, (ResponseError, String)>,
) -> DescribeConfigsResponse {
    // Each resource once: a request repeating a name must not make the answer as many times
    // larger.
    let mut seen = std::collections::HashSet::new();
    let results = request
        .resources
        .iter()
        .filter(|resource| seen.insert((resource.resource_type, resource.resource_name.as_str())))
        .map(|resource| {
            let result = DescribeConfigsResult::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone());
            let refused = |error: ResponseError, text: String| {
                result
                    .clone()
                    .with_error_code(error.code())
                    .with_error_message(Some(StrBytes::from_string(text)))
            };
            let configs = match resource.resource_type {
                TOPIC => {
                    let name = resource.resource_name.as_str();
                    let topics = match topics {
                        Ok(topics) => topics,
                        Err((error, text)) => return refused(*error, text.clone()),
                    };
                    match topics.iter().find(|topic| topic.name == name) {
                        Some(topic) => topic_configs(&topic.settings),
                        None => {
                            return refused(
                                ResponseError::UnknownTopicOrPartition,
                                format!("no topic {name:?}"),
                            )
                        }
                    }
                }
                BROKER => Vec::new(),
                other => {
                    return refused(
                        ResponseError::InvalidRequest,
                        format!("configs of resource type {other} are not kept by this broker"),
                    )
                }
            };
            let wanted = resource.configuration_keys.as_deref();
            result.with_configs(
                configs
                    .into_iter()
                    .filter(|config| wanted.is_none_or(|keys| keys.contains(&config.name)))
                    .collect(),
            )
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

/// A topic's settings as Kafka's configs, with the broker's own settings (retention, record
/// limit, discard) under names of their own, since Kafka has none for them.
fn topic_configs(list: &[TopicSetting]) -> Vec<DescribeConfigsResourceResult> {
    // A description's list is one the broker accepted.
    let settings = TopicSettings::from_list(list).unwrap_or_default();
    let limit = |name: &'static str, limit: Option<u64>| {
        let value = limit.map_or_else(|| "-1".to_owned(), |limit| limit.to_string());
        config(name, value, TYPE_LONG, limit.is_some()).with_read_only(false)
    };
    vec![
        config("cleanup.policy", "delete".to_owned(), TYPE_LIST, false),
        limit("retention.ms", settings.max_age_ms),
        limit("retention.bytes", settings.max_bytes),
        config(
            "broker.retention",
            settings.retention.name().to_owned(),
            TYPE_STRING,
            settings.retention != Retention::default(),
        ),
        limit("broker.max.records", settings.max_records),
        config(
            "broker.discard",
            settings.discard.name().to_owned(),
            TYPE_STRING,
            list.iter()
                .any(|setting| matches!(setting, TopicSetting::Discard(_))),
        )
        .with_read_only(false),
    ]
}

/// One read-only config (until told otherwise), `set` for the topic or the default.
fn config(name: &'static str, value: String, kind: i8, set: bool) -> DescribeConfigsResourceResult {
    DescribeConfigsResourceResult::default()
        .with_name(StrBytes::from_static_str(name))
        .with_value(Some(StrBytes::from_string(value)))
        .with_read_only(true)
        .with_config_source(if set { SOURCE_TOPIC } else { SOURCE_DEFAULT })
        .with_config_type(kind)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use broker_core::{EventBroker, KeyHash};
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;

    use super::*;

    fn resource(
        kind: i8,
        name: &'static str,
        keys: Option<&[&'static str]>,
    ) -> DescribeConfigsResource {
        DescribeConfigsResource::default()
            .with_resource_type(kind)
            .with_resource_name(StrBytes::from_static_str(name))
            .with_configuration_keys(keys.map(|keys| {
                keys.iter()
                    .map(|key| StrBytes::from_static_str(key))
                    .collect()
            }))
    }

    /// Each config's name, value and whether it is set for the topic.
    fn shown(result: &DescribeConfigsResult) -> Vec<(String, String, bool)> {
        result
            .configs
            .iter()
            .map(|config| {
                (
                    config.name.to_string(),
                    config.value.as_ref().unwrap().to_string(),
                    config.config_source == SOURCE_TOPIC,
                )
            })
            .collect()
    }

    #[test]
    fn a_topic_shows_its_settings_as_kafka_configs() {
        let broker = EventBroker::new(100).unwrap();
        let created = |configs: &[(&'static str, &'static str)]| {
            topic_settings(
                &configs
                    .iter()
                    .map(|(name, value)| {
                        CreatableTopicConfig::default()
                            .with_name(StrBytes::from_static_str(name))
                            .with_value(Some(StrBytes::from_static_str(value)))
                    })
                    .collect::<Vec<_>>(),
            )
            .unwrap()
        };
        let as_kafka = created(&[("retention.bytes", "5000")]);
        broker
            .create_topic("kafka", 1, KeyHash::Murmur2, &as_kafka)
            .unwrap();
        broker.create("native", 2).unwrap();
        let topics = Ok(broker.describe().topics);
        let request = DescribeConfigsRequest::default().with_resources(vec![
            resource(TOPIC, "kafka", None),
            resource(TOPIC, "native", Some(&["broker.retention", "retention.ms"])),
            resource(TOPIC, "missing", None),
            resource(BROKER, "0", None),
            resource(8, "0", None),
        ]);
        let results = describe_configs(&request, &topics).results;
        let owned = |rows: &[(&str, &str, bool)]| {
            rows.iter()
                .map(|(name, value, set)| (name.to_string(), value.to_string(), *set))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            shown(&results[0]),
            owned(&[
                ("cleanup.policy", "delete", false),
                ("retention.ms", "604800000", true),
                ("retention.bytes", "5000", true),
                ("broker.retention", "limits", true),
                ("broker.max.records", "-1", false),
                ("broker.discard", "old", false),
            ])
        );
        // Read-only, but for those AlterConfigs changes.
        let read_only: Vec<bool> = results[0].configs.iter().map(|c| c.read_only).collect();
        assert_eq!(read_only, [true, false, false, true, false, false]);
        // The keys asked for, in the broker's order.
        assert_eq!(
            shown(&results[1]),
            owned(&[
                ("retention.ms", "-1", false),
                ("broker.retention", "interest", false),
            ])
        );
        assert_eq!(results[1].configs[1].config_type, TYPE_STRING);
        assert_eq!(
            results[2].error_code,
            ResponseError::UnknownTopicOrPartition.code()
        );
        assert_eq!((results[3].error_code, results[3].configs.len()), (0, 0));
        assert_eq!(results[4].error_code, ResponseError::InvalidRequest.code());
        // Topics that could not be read: every topic resource says why.
        let unavailable = Err((ResponseError::NotLeaderOrFollower, "elsewhere".to_owned()));
        let results = describe_configs(&request, &unavailable).results;
        assert_eq!(
            results[0].error_code,
            ResponseError::NotLeaderOrFollower.code()
        );
        assert_eq!(results[3].error_code, 0);
    }
}
