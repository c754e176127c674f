//! How records, descriptions and lag are printed: readable tables or JSON.

use broker_client::{
    duration_text, Assignor, BrokerDescription, BrokerRecord, GroupDescription, GroupSetting,
    KafkaGroupDescription, KafkaMemberDescription, KeyHash, PartitionLag, ProducerState, Retention,
    StartAt, TopicDescription, TopicSetting,
};
use comfy_table::{presets::NOTHING, Table};
use serde_json::json;

/// A record as one line of text: `[partition@offset key] payload`.
pub fn record_line(record: &BrokerRecord) -> String {
    let payload = String::from_utf8_lossy(&record.payload);
    match &record.key {
        Some(key) => format!(
            "[{}@{} {}] {payload}",
            record.partition,
            record.offset,
            String::from_utf8_lossy(key)
        ),
        None => format!("[{}@{}] {payload}", record.partition, record.offset),
    }
}

/// A record as one JSON object (key, payload and header values as UTF-8, invalid sequences
/// replaced; the time in milliseconds since the Unix epoch).
pub fn record_json(record: &BrokerRecord) -> serde_json::Value {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    json!({
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "key": record.key.as_deref().map(text),
        "payload": text(&record.payload),
        "timestamp_ms": record.timestamp_ms,
        "headers": record
            .headers
            .iter()
            .map(|header| json!({"name": header.name, "value": header.value.as_deref().map(text)}))
            .collect::<Vec<_>>(),
        "delivery_count": record.delivery_count,
    })
}

/// A topic's retention settings in words: `interest retention, max 10 records, max age 1h`;
/// `interest retention` for an empty list (the defaults).
pub fn settings_text(settings: &[TopicSetting]) -> String {
    if settings.is_empty() {
        return "interest retention".to_owned();
    }
    let words: Vec<String> = settings
        .iter()
        .map(|setting| match setting {
            TopicSetting::Retention(Retention::Interest) => "interest retention".to_owned(),
            TopicSetting::Retention(Retention::Limits) => "limits retention".to_owned(),
            TopicSetting::MaxRecords(1) => "max 1 record".to_owned(),
            TopicSetting::MaxRecords(max) => format!("max {max} records"),
            TopicSetting::MaxBytes(1) => "max 1 byte".to_owned(),
            TopicSetting::MaxBytes(max) => format!("max {max} bytes"),
            TopicSetting::MaxAgeMs(age) => format!("max age {}", duration_text(*age)),
            TopicSetting::Discard(discard) => format!("discard {}", discard.name()),
        })
        .collect();
    words.join(", ")
}

/// A group's settings in words, or an empty string for the defaults.
fn group_settings_text(settings: &[GroupSetting]) -> String {
    settings
        .iter()
        .map(|setting| match setting {
            GroupSetting::StartAt(StartAt::Earliest) => "; started at the earliest".to_owned(),
            GroupSetting::StartAt(StartAt::Latest) => "; started at the end".to_owned(),
            GroupSetting::AckTimeoutMs(ms) => format!("; ack timeout {}", duration_text(*ms)),
            GroupSetting::MaxDeliveries(1) => "; at most 1 delivery".to_owned(),
            GroupSetting::MaxDeliveries(max) => format!("; at most {max} deliveries"),
            GroupSetting::DeadLetter(topic) => format!(", then to dead-letter topic {topic}"),
        })
        .collect()
}

/// A group's settings in words, as `broker describe` shows them (`ack timeout 30s; at most 5
/// deliveries, then to dead-letter topic orders-dlq`), or `the defaults`.
pub fn group_settings_words(settings: &[GroupSetting]) -> String {
    let text = group_settings_text(settings);
    match text.strip_prefix("; ") {
        Some(words) => words.to_owned(),
        None if text.is_empty() => "the defaults".to_owned(),
        None => text,
    }
}

/// A time in milliseconds since the Unix epoch as RFC 3339 (`2026-12-01T09:00:00.000Z`).
pub fn time_text(ms: i64) -> String {
    let time = u64::try_from(ms)
        .ok()
        .and_then(|ms| std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_millis(ms)));
    match time {
        Some(time) => humantime::format_rfc3339_millis(time).to_string(),
        None => format!("{ms} ms"),
    }
}

/// Per partition, the first offset at or after a time (rows of `partition`, `offset`,
/// `end_offset`).
pub fn offsets_text(topic: &str, at: i64, rows: &[serde_json::Value]) -> String {
    let mut table = table(&["PARTITION", "OFFSET", "END"]);
    for row in rows {
        table.add_row(vec![
            row["partition"].to_string(),
            row["offset"].to_string(),
            row["end_offset"].to_string(),
        ]);
    }
    format!(
        "{topic}: first records at or after {}\n{table}\n",
        time_text(at)
    )
}

/// Each partition's idempotent producers, one row each.
pub fn producers_text(topic: &str, rows: &[(i32, ProducerState)]) -> String {
    if rows.is_empty() {
        return format!(
            "{topic}: no idempotent producers (the Rust client's Producer and Kafka's \
             idempotent producers are listed once they publish)\n"
        );
    }
    let mut table = table(&[
        "PARTITION",
        "PRODUCER",
        "NEXT SEQUENCE",
        "LAST OFFSET",
        "LAST SEEN ON TOPIC",
    ]);
    for (partition, state) in rows {
        table.add_row(vec![
            partition.to_string(),
            state.producer.to_string(),
            state.next_sequence.to_string(),
            state
                .last_offset
                .map_or_else(|| "-".to_owned(), |offset| offset.to_string()),
            time_text(state.last_seen_ms),
        ]);
    }
    format!("{topic}: idempotent producers\n{table}\n")
}

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header(header.to_vec());
    table
}

/// The description as tables: per topic its partitions, then each group's state.
/// The broker's topics as `broker describe` prints them; a group whose members are Kafka's
/// consumers (one of `kafka`, the groups of the server's Kafka listener) with those members.
pub fn description_text(
    description: &BrokerDescription,
    kafka: &[KafkaGroupDescription],
) -> String {
    if description.topics.is_empty() {
        return "no topics (create one with `broker create TOPIC --partitions N`)\n".to_owned();
    }
    description
        .topics
        .iter()
        .map(|topic| topic_text(topic, kafka))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Kafka's consumers of a topic, each with its partitions there.
pub type KafkaMembers<'a> = Vec<(&'a KafkaMemberDescription, &'a [i32])>;

/// The consumer group of Kafka's clients that `group` of `topic` stands for: a group of the
/// broker with no members of its own, named as one of `kafka`, and those of its members that
/// were assigned partitions of `topic`, each with them.
pub fn kafka_group_of<'a>(
    kafka: &'a [KafkaGroupDescription],
    topic: &str,
    group: &GroupDescription,
) -> Option<(&'a KafkaGroupDescription, KafkaMembers<'a>)> {
    if !group.members.is_empty() {
        return None;
    }
    let kafka_group = kafka.iter().find(|kafka| kafka.name == group.name)?;
    Some((kafka_group, kafka_group.assigned_on(topic)))
}

/// How many of a Kafka group's members consume a topic, as `broker top` counts them: while
/// the group rebalances every member (the partitions are not assigned yet), otherwise those
/// assigned some of the topic's (`members`, from [`kafka_group_of`]).
pub fn kafka_member_count(group: &KafkaGroupDescription, members: &KafkaMembers<'_>) -> usize {
    match group.is_rebalancing() {
        true => group.members.len(),
        false => members.len(),
    }
}

/// A Kafka group's members as `broker describe` shows them with a topic's group: those
/// assigned its partitions, each with them; every member while the group rebalances.
fn kafka_members_words(group: &KafkaGroupDescription, members: &KafkaMembers<'_>) -> String {
    if group.members.is_empty() {
        return "no members".to_owned();
    }
    if group.is_rebalancing() {
        let joining: Vec<String> = group
            .members
            .iter()
            .map(|member| {
                format!(
                    "{} ({} from {})",
                    member.member, member.client_id, member.client_host
                )
            })
            .collect();
        return format!(
            "rebalancing, partitions not assigned yet: {}",
            joining.join(", ")
        );
    }
    match members.is_empty() {
        true => "no member consumes this topic".to_owned(),
        false => kafka_members_text(members),
    }
}

/// Kafka's consumers as `broker describe` lists them: `ID (CLIENT from HOST) [0, 1], ...`.
fn kafka_members_text(members: &[(&KafkaMemberDescription, &[i32])]) -> String {
    members
        .iter()
        .map(|(member, partitions)| {
            format!(
                "{} ({} from {}) {partitions:?}",
                member.member, member.client_id, member.client_host
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn topic_text(topic: &TopicDescription, kafka: &[KafkaGroupDescription]) -> String {
    let retention = settings_text(&topic.settings);
    let mut out = format!(
        "topic {}: {} partition{}, key hash {}, {retention}, {} bytes retained\n",
        topic.name,
        topic.partitions.len(),
        if topic.partitions.len() == 1 { "" } else { "s" },
        KeyHash::name(topic.key_hash),
        topic.retained_bytes
    );
    // The time of the oldest record matters where records leave by age.
    let aged = topic
        .settings
        .iter()
        .any(|setting| matches!(setting, TopicSetting::MaxAgeMs(_)));
    let mut header = vec!["PARTITION", "EARLIEST", "END", "RECORDS", "BYTES"];
    if aged {
        header.push("OLDEST RECORD");
    }
    let mut partitions = table(&header);
    for p in &topic.partitions {
        let mut cells = vec![
            p.partition.to_string(),
            p.earliest_offset.to_string(),
            p.end_offset.to_string(),
            p.records.to_string(),
            p.retained_bytes.to_string(),
        ];
        if aged {
            cells.push(
                p.earliest_timestamp_ms
                    .map_or_else(|| "-".to_owned(), time_text),
            );
        }
        partitions.add_row(cells);
    }
    out.push_str(&format!("{partitions}\n"));
    // Kafka's consumer groups that consume the topic and have committed nothing on it yet:
    // the broker holds no group of theirs there.
    let uncommitted: Vec<_> = kafka
        .iter()
        .filter(|kafka_group| {
            !topic
                .groups
                .iter()
                .any(|group| group.name == kafka_group.name)
        })
        .map(|kafka_group| (kafka_group, kafka_group.assigned_on(&topic.name)))
        .filter(|(_, members)| !members.is_empty())
        .collect();
    if topic.groups.is_empty() && uncommitted.is_empty() {
        out.push_str("  no consumer groups\n");
    }
    for (kafka_group, members) in &uncommitted {
        out.push_str(&format!(
            "\n  group {} ({}): {}; no offsets committed yet\n",
            kafka_group.name,
            kafka_group.kind(),
            kafka_members_text(members)
        ));
    }
    for group in &topic.groups {
        let kafka_group = kafka_group_of(kafka, &topic.name, group);
        let (kind, members) = match &kafka_group {
            Some((kafka_group, members)) => (
                kafka_group.kind(),
                kafka_members_words(kafka_group, members),
            ),
            None => (
                format!(
                    "{}{}",
                    Assignor::name(group.assignor),
                    group_settings_text(&group.settings)
                ),
                match group.members.is_empty() {
                    true => "no members".to_owned(),
                    false => group
                        .members
                        .iter()
                        .map(|m| format!("{} {:?}", m.member, m.partitions))
                        .collect::<Vec<_>>()
                        .join(", "),
                },
            ),
        };
        out.push_str(&format!("\n  group {} ({kind}): {members}\n", group.name));
        // Kafka's members own the partitions their group's leader assigned them.
        let kafka_owner = |partition: i32| {
            kafka_group.as_ref().and_then(|(_, members)| {
                members
                    .iter()
                    .find(|(_, partitions)| partitions.contains(&partition))
                    .map(|(member, _)| member.member.clone())
            })
        };
        // Redeliveries and skipped records get columns once there are any.
        let redelivered = group.partitions.iter().any(|p| p.deliveries > 1);
        let skipped = group.partitions.iter().any(|p| p.skipped > 0);
        let mut header = vec![
            "PARTITION",
            "OWNER",
            "COMMITTED",
            "POSITION",
            "IN-FLIGHT",
            "LAG",
        ];
        header.extend(redelivered.then_some("DELIVERIES"));
        header.extend(skipped.then_some("SKIPPED"));
        let mut rows = table(&header);
        for p in &group.partitions {
            let mut cells = vec![
                p.partition.to_string(),
                p.owner
                    .clone()
                    .or_else(|| kafka_owner(p.partition))
                    .unwrap_or_else(|| "-".to_owned()),
                p.committed.to_string(),
                p.position.to_string(),
                p.in_flight
                    .map_or_else(|| "-".to_owned(), |o| o.to_string()),
                p.lag.to_string(),
            ];
            cells.extend(redelivered.then(|| p.deliveries.to_string()));
            cells.extend(skipped.then(|| p.skipped.to_string()));
            rows.add_row(cells);
        }
        out.push_str(&format!("{rows}\n"));
    }
    out
}

/// A group's lag as a table with a total line.
pub fn lag_text(topic: &str, group: &str, lag: &[PartitionLag]) -> String {
    let skipped = lag.iter().any(|row| row.skipped > 0);
    let mut header = vec!["PARTITION", "COMMITTED", "END", "LAG"];
    if skipped {
        header.push("SKIPPED");
    }
    let mut rows = table(&header);
    for row in lag {
        let mut cells = vec![
            row.partition.to_string(),
            row.committed.to_string(),
            row.end_offset.to_string(),
            row.lag.to_string(),
        ];
        if skipped {
            cells.push(row.skipped.to_string());
        }
        rows.add_row(cells);
    }
    let total: i64 = lag.iter().map(|row| row.lag).sum();
    format!("group {group} on topic {topic}: total lag {total}\n{rows}\n")
}

/// "s" for a count other than one.
pub fn plural<T: PartialEq + From<u8>>(count: T) -> &'static str {
    if count == T::from(1) {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use bytes::Bytes;

    /// A Kafka group `g` in `state` whose members `a` and `b` hold partitions 0 and 1 of `t`
    /// (while stable).
    fn kafka_group(state: &str) -> KafkaGroupDescription {
        let stable = state == "Stable";
        let member = |id: &str, partition: i32| KafkaMemberDescription {
            member: id.into(),
            client_id: "rdkafka".into(),
            client_host: "/127.0.0.1".into(),
            assignment: match stable {
                true => vec![broker_client::TopicPartitions {
                    topic: "t".into(),
                    partitions: vec![partition],
                }],
                false => Vec::new(),
            },
        };
        KafkaGroupDescription {
            name: "g".into(),
            state: state.into(),
            generation: 3,
            protocol: if stable {
                "range".into()
            } else {
                String::new()
            },
            members: vec![member("a", 0), member("b", 1)],
        }
    }

    #[test]
    fn kafka_groups_show_their_members_and_say_when_a_rebalance_decides_their_partitions() {
        let group: GroupDescription = serde_json::from_value(json!({
            "name": "g", "assignor": "round-robin", "settings": [], "members": [],
            "partitions": []
        }))
        .unwrap();
        for (state, words, count) in [
            (
                "Stable",
                "a (rdkafka from /127.0.0.1) [0], b (rdkafka from /127.0.0.1) [1]",
                2,
            ),
            (
                "PreparingRebalance",
                "rebalancing, partitions not assigned yet: a (rdkafka from /127.0.0.1), b \
                 (rdkafka from /127.0.0.1)",
                2,
            ),
        ] {
            let kafka = [kafka_group(state)];
            let (kafka_group, members) = kafka_group_of(&kafka, "t", &group).unwrap();
            assert_eq!(kafka_members_words(kafka_group, &members), words);
            assert_eq!(kafka_member_count(kafka_group, &members), count);
        }
        let mut empty = kafka_group("Empty");
        empty.members.clear();
        let kafka = [empty];
        let (kafka_group, members) = kafka_group_of(&kafka, "t", &group).unwrap();
        assert_eq!(kafka_members_words(kafka_group, &members), "no members");
        assert_eq!(
            kafka_group.kind(),
            "Kafka consumer group, generation 3, Empty"
        );
    }

    fn record(key: Option<&'static str>) -> BrokerRecord {
        BrokerRecord {
            topic: "orders".into(),
            partition: 2,
            offset: 7,
            key: key.map(|k| Bytes::from_static(k.as_bytes())),
            payload: Bytes::from_static(b"hello"),
            timestamp_ms: 1_700_000_000_000,
            headers: Vec::new(),
            delivery_count: 0,
        }
    }

    #[test]
    fn records_print_partition_offset_key_and_payload() {
        assert_eq!(record_line(&record(None)), "[2@7] hello");
        assert_eq!(record_line(&record(Some("k"))), "[2@7 k] hello");
        let json = record_json(&record(Some("k")));
        assert_eq!(json["partition"], 2);
        assert_eq!(json["offset"], 7);
        assert_eq!(json["key"], "k");
        assert_eq!(json["payload"], "hello");
    }

    #[test]
    fn lag_table_has_a_total() {
        let lag = [
            PartitionLag {
                partition: 0,
                committed: 1,
                end_offset: 4,
                lag: 3,
                skipped: 0,
            },
            PartitionLag {
                partition: 1,
                committed: 0,
                end_offset: 2,
                lag: 2,
                skipped: 0,
            },
        ];
        let text = lag_text("orders", "billing", &lag);
        assert!(
            text.starts_with("group billing on topic orders: total lag 5"),
            "{text}"
        );
    }
}
