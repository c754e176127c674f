//! How records, descriptions and lag are printed: readable tables or JSON.

use broker_client::{
    Assignor, BrokerDescription, BrokerRecord, KeyHash, PartitionLag, TopicDescription,
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

/// A record as one JSON object (key and payload as UTF-8, invalid sequences replaced).
pub fn record_json(record: &BrokerRecord) -> serde_json::Value {
    json!({
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "key": record.key.as_ref().map(|key| String::from_utf8_lossy(key).into_owned()),
        "payload": String::from_utf8_lossy(&record.payload),
    })
}

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header(header.to_vec());
    table
}

/// The description as tables: per topic its partitions, then each group's state.
pub fn description_text(description: &BrokerDescription) -> String {
    if description.topics.is_empty() {
        return "no topics (create one with `broker create TOPIC --partitions N`)\n".to_owned();
    }
    description
        .topics
        .iter()
        .map(topic_text)
        .collect::<Vec<_>>()
        .join("\n")
}

fn topic_text(topic: &TopicDescription) -> String {
    let mut out = format!(
        "topic {}: {} partition{}, key hash {}, {} bytes retained\n",
        topic.name,
        topic.partitions.len(),
        if topic.partitions.len() == 1 { "" } else { "s" },
        KeyHash::name(topic.key_hash),
        topic.retained_bytes
    );
    let mut partitions = table(&["PARTITION", "EARLIEST", "END", "RECORDS", "BYTES"]);
    for p in &topic.partitions {
        partitions.add_row(vec![
            p.partition.to_string(),
            p.earliest_offset.to_string(),
            p.end_offset.to_string(),
            p.records.to_string(),
            p.retained_bytes.to_string(),
        ]);
    }
    out.push_str(&format!("{partitions}\n"));
    if topic.groups.is_empty() {
        out.push_str("  no consumer groups\n");
    }
    for group in &topic.groups {
        let members = if group.members.is_empty() {
            "no members".to_owned()
        } else {
            group
                .members
                .iter()
                .map(|m| format!("{} {:?}", m.member, m.partitions))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push_str(&format!(
            "\n  group {} ({}): {members}\n",
            group.name,
            Assignor::name(group.assignor)
        ));
        let mut rows = table(&[
            "PARTITION",
            "OWNER",
            "COMMITTED",
            "POSITION",
            "IN-FLIGHT",
            "LAG",
        ]);
        for p in &group.partitions {
            rows.add_row(vec![
                p.partition.to_string(),
                p.owner.clone().unwrap_or_else(|| "-".to_owned()),
                p.committed.to_string(),
                p.position.to_string(),
                p.in_flight
                    .map_or_else(|| "-".to_owned(), |o| o.to_string()),
                p.lag.to_string(),
            ]);
        }
        out.push_str(&format!("{rows}\n"));
    }
    out
}

/// A group's lag as a table with a total line.
pub fn lag_text(topic: &str, group: &str, lag: &[PartitionLag]) -> String {
    let mut rows = table(&["PARTITION", "COMMITTED", "END", "LAG"]);
    for row in lag {
        rows.add_row(vec![
            row.partition.to_string(),
            row.committed.to_string(),
            row.end_offset.to_string(),
            row.lag.to_string(),
        ]);
    }
    let total: i64 = lag.iter().map(|row| row.lag).sum();
    format!("group {group} on topic {topic}: total lag {total}\n{rows}\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use bytes::Bytes;

    fn record(key: Option<&'static str>) -> BrokerRecord {
        BrokerRecord {
            topic: "orders".into(),
            partition: 2,
            offset: 7,
            key: key.map(|k| Bytes::from_static(k.as_bytes())),
            payload: Bytes::from_static(b"hello"),
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
            },
            PartitionLag {
                partition: 1,
                committed: 0,
                end_offset: 2,
                lag: 2,
            },
        ];
        let text = lag_text("orders", "billing", &lag);
        assert!(
            text.starts_with("group billing on topic orders: total lag 5"),
            "{text}"
        );
    }
}
