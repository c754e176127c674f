//! What the console's API answers, built from the broker's descriptions: pure functions, so
//! that each page's figures can be checked against the state they come from.

use std::collections::BTreeMap;
use std::fmt::Write;

use broker_core::{
    BrokerRecord, GroupDescription, GroupPartitionDescription, GroupSettings,
    KafkaGroupDescription, MemberDescription, PartitionDescription, TopicDescription,
    TopicSettings,
};
use bytes::Bytes;
use serde::Serialize;

use super::history::TopicHistory;

/// Rows of a page given when none is asked for.
pub(crate) const DEFAULT_PER_PAGE: usize = 50;

/// Most rows a page gives.
pub(crate) const MAX_PER_PAGE: usize = 500;

/// Most bytes of a payload, key or header value shown: the rest is left out, and the record
/// says so.
pub(crate) const SHOWN_BYTES: usize = 4096;

/// One page of a list: which rows of how many match.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct Page<T> {
    /// Rows matching the search, on every page.
    pub(crate) total: usize,
    /// This page's number, from 1.
    pub(crate) page: usize,
    /// Rows a page holds.
    pub(crate) per_page: usize,
    /// This page's rows.
    pub(crate) items: Vec<T>,
}

/// Most characters of a search: longer ones are cut (no name is longer).
const MAX_SEARCH_CHARS: usize = 256;

/// Which rows of a list are wanted: those whose name holds the search (ignoring case), page
/// `page` (from 1) of pages of `per_page` rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// The search, in lower case.
    search: String,
    pub(crate) page: usize,
    pub(crate) per_page: usize,
}

impl Wanted {
    /// Rows whose name holds `search` (its first [`MAX_SEARCH_CHARS`] characters), on page
    /// `page` of pages of `per_page` rows.
    pub(crate) fn new(search: &str, page: usize, per_page: usize) -> Wanted {
        Wanted {
            search: search
                .chars()
                .take(MAX_SEARCH_CHARS)
                .collect::<String>()
                .to_lowercase(),
            page,
            per_page,
        }
    }

    /// Whether `name` holds the search.
    fn matches(&self, name: &str) -> bool {
        self.search.is_empty() || name.to_lowercase().contains(&self.search)
    }

    /// The wanted page of `rows`, those `name` says match.
    fn page_of<T>(&self, rows: impl Iterator<Item = T>, name: impl Fn(&T) -> String) -> Page<T> {
        let per_page = self.per_page.clamp(1, MAX_PER_PAGE);
        let page = self.page.max(1);
        let mut total = 0;
        let skip = (page - 1).saturating_mul(per_page);
        let mut items = Vec::new();
        for row in rows.filter(|row| self.matches(&name(row))) {
            if total >= skip && items.len() < per_page {
                items.push(row);
            }
            total += 1;
        }
        Page {
            total,
            page,
            per_page,
            items,
        }
    }
}

/// A topic in the list of topics.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct TopicRow {
    pub(crate) name: String,
    pub(crate) partitions: usize,
    /// Its retention and limits, as `broker describe` says them.
    pub(crate) settings: String,
    /// Records retained over every partition.
    pub(crate) records: u64,
    /// Payload, key and header bytes retained.
    pub(crate) bytes: u64,
    pub(crate) groups: usize,
    /// The sum of its groups' lag.
    pub(crate) lag: i64,
    /// The groups (as `topic/group`) whose dead-letter topic it is.
    pub(crate) dead_letter_for: Vec<String>,
}

/// A group of a topic in the list of groups.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct GroupRow {
    pub(crate) topic: String,
    pub(crate) group: String,
    pub(crate) members: usize,
    /// Its lag over the topic's partitions.
    pub(crate) lag: i64,
    /// Records delivered and not acknowledged yet.
    pub(crate) in_flight: usize,
    /// Where records go after their last delivery, if anywhere.
    pub(crate) dead_letter: Option<String>,
}

/// One topic, whole: its partitions, its groups and its history.
#[derive(Debug, Serialize)]
pub(crate) struct TopicPage {
    pub(crate) name: String,
    pub(crate) key_hash: String,
    pub(crate) settings: String,
    pub(crate) retained_bytes: u64,
    pub(crate) partitions: Vec<PartitionDescription>,
    pub(crate) groups: Vec<GroupView>,
    pub(crate) dead_letter_for: Vec<String>,
    pub(crate) history: TopicHistory,
    /// How often the history samples, in milliseconds.
    pub(crate) sampled_every_ms: u64,
}

/// One group of a topic.
#[derive(Debug, Serialize)]
pub(crate) struct GroupView {
    pub(crate) name: String,
    pub(crate) assignor: String,
    pub(crate) settings: String,
    /// Where records go after their last delivery, if anywhere.
    pub(crate) dead_letter: Option<String>,
    pub(crate) members: Vec<MemberDescription>,
    pub(crate) partitions: Vec<GroupPartitionDescription>,
}

/// A dead-letter topic: where records go after their last delivery.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct DeadLetterRow {
    pub(crate) topic: String,
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    /// The groups (as `topic/group`) that send records there.
    pub(crate) groups: Vec<String>,
}

/// Bytes as the console shows them: as hex, and as text when they are UTF-8.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct Shown {
    /// The first [`SHOWN_BYTES`] bytes, in hex.
    pub(crate) hex: String,
    /// The same bytes as text, when they are UTF-8 (cut at a character's boundary).
    pub(crate) text: Option<String>,
    /// How many bytes there are in all.
    pub(crate) size: usize,
    /// Whether only the first [`SHOWN_BYTES`] are shown.
    pub(crate) cut: bool,
}

/// A header as shown.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct ShownHeader {
    pub(crate) name: String,
    pub(crate) value: Option<Shown>,
}

/// A record as shown.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct RecordView {
    pub(crate) offset: i64,
    pub(crate) timestamp_ms: i64,
    pub(crate) key: Option<Shown>,
    pub(crate) payload: Shown,
    pub(crate) headers: Vec<ShownHeader>,
}

/// A partition's latest records.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct RecordsPage {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) start_offset: i64,
    pub(crate) end_offset: i64,
    /// Oldest first.
    pub(crate) records: Vec<RecordView>,
}

/// For each topic that is some group's dead-letter topic, those groups as `topic/group`.
fn dead_letter_senders(topics: &[TopicDescription]) -> BTreeMap<String, Vec<String>> {
    let mut senders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for topic in topics {
        for group in &topic.groups {
            if let Some(target) = dead_letter_of(&group.settings) {
                senders
                    .entry(target)
                    .or_default()
                    .push(format!("{}/{}", topic.name, group.name));
            }
        }
    }
    senders
}

/// The dead-letter topic a group's settings name, if any.
fn dead_letter_of(settings: &[broker_core::GroupSetting]) -> Option<String> {
    GroupSettings::from_list(settings)
        .ok()?
        .dead_letter
        .map(|topic| topic.to_string())
}

/// A topic's settings as `broker describe` says them.
fn topic_settings(topic: &TopicDescription) -> String {
    TopicSettings::from_list(&topic.settings).map_or_else(
        |_| "(settings this console cannot read)".to_owned(),
        |settings| settings.to_string(),
    )
}

/// The wanted page of the list of `topics` (sorted by name).
pub(crate) fn topic_rows(topics: &[TopicDescription], wanted: &Wanted) -> Page<TopicRow> {
    let mut senders = dead_letter_senders(topics);
    let page = wanted.page_of(topics.iter(), |topic| topic.name.clone());
    Page {
        total: page.total,
        page: page.page,
        per_page: page.per_page,
        items: page
            .items
            .into_iter()
            .map(|topic| TopicRow {
                name: topic.name.clone(),
                partitions: topic.partitions.len(),
                settings: topic_settings(topic),
                records: topic.records(),
                bytes: topic.retained_bytes,
                groups: topic.groups.len(),
                lag: topic.groups.iter().map(GroupDescription::lag).sum(),
                dead_letter_for: senders.remove(&topic.name).unwrap_or_default(),
            })
            .collect(),
    }
}

/// The consumer group of Kafka's clients (one of `kafka`, the groups this server's Kafka
/// listener coordinates) that `group` of `topic` stands for: a group of the broker with no
/// members of its own and the same name. With its words for the group's kind (`Kafka
/// consumer group, range, generation 3, Stable`) and its members as the topic's: those
/// assigned partitions of it, each with them, or every member with none while it rebalances.
fn kafka_view(
    kafka: &[KafkaGroupDescription],
    topic: &str,
    group: &GroupDescription,
) -> Option<(String, Vec<MemberDescription>)> {
    if !group.members.is_empty() {
        return None;
    }
    let kafka_group = kafka.iter().find(|kafka| kafka.name == group.name)?;
    let members = match kafka_group.is_rebalancing() {
        true => kafka_group
            .members
            .iter()
            .map(|member| MemberDescription {
                member: member.member.clone(),
                partitions: Vec::new(),
            })
            .collect(),
        false => kafka_group
            .assigned_on(topic)
            .into_iter()
            .map(|(member, partitions)| MemberDescription {
                member: member.member.clone(),
                partitions: partitions.to_vec(),
            })
            .collect(),
    };
    Some((kafka_group.kind(), members))
}

/// The wanted page of every group of every topic, by topic then group; the search matches
/// either name. A group of Kafka's clients (one of `kafka`) counts its members.
pub(crate) fn group_rows(
    topics: &[TopicDescription],
    kafka: &[KafkaGroupDescription],
    wanted: &Wanted,
) -> Page<GroupRow> {
    let rows = topics.iter().flat_map(|topic| {
        topic.groups.iter().map(|group| GroupRow {
            topic: topic.name.clone(),
            group: group.name.clone(),
            members: kafka_view(kafka, &topic.name, group)
                .map_or(group.members.len(), |(_, members)| members.len()),
            lag: group.lag(),
            in_flight: group.in_flight(),
            dead_letter: dead_letter_of(&group.settings),
        })
    });
    wanted.page_of(rows, |row| format!("{} {}", row.topic, row.group))
}

/// Every dead-letter topic that exists, with the groups that send records there.
pub(crate) fn dead_letter_rows(topics: &[TopicDescription]) -> Vec<DeadLetterRow> {
    let senders = dead_letter_senders(topics);
    senders
        .into_iter()
        .filter_map(|(target, groups)| {
            let topic = topics.iter().find(|topic| topic.name == target)?;
            Some(DeadLetterRow {
                topic: target,
                records: topic.records(),
                bytes: topic.retained_bytes,
                groups,
            })
        })
        .collect()
}

/// `topic`, whole, with its `history`; `every` names the topics that may send it records. A
/// group of Kafka's clients (one of `kafka`) is shown with its kind and its members, who own
/// the partitions assigned them.
pub(crate) fn topic_page(
    topic: TopicDescription,
    every: &[TopicDescription],
    kafka: &[KafkaGroupDescription],
    history: TopicHistory,
    sampled_every_ms: u64,
) -> TopicPage {
    let dead_letter_for = dead_letter_senders(every)
        .remove(&topic.name)
        .unwrap_or_default();
    TopicPage {
        key_hash: topic.key_hash.to_string(),
        settings: topic_settings(&topic),
        retained_bytes: topic.retained_bytes,
        groups: topic
            .groups
            .into_iter()
            .map(|mut group| {
                let kafka_group = kafka_view(kafka, &topic.name, &group);
                if let Some((_, members)) = &kafka_group {
                    for partition in &mut group.partitions {
                        partition.owner = members
                            .iter()
                            .find(|member| member.partitions.contains(&partition.partition))
                            .map(|member| member.member.clone());
                    }
                }
                let (assignor, members) = match kafka_group {
                    Some((words, members)) => (words, members),
                    None => (group.assignor.to_string(), group.members),
                };
                GroupView {
                    assignor,
                    settings: GroupSettings::from_list(&group.settings).map_or_else(
                        |_| "(settings this console cannot read)".to_owned(),
                        |settings| settings.to_string(),
                    ),
                    dead_letter: dead_letter_of(&group.settings),
                    name: group.name,
                    members,
                    partitions: group.partitions,
                }
            })
            .collect(),
        partitions: topic.partitions,
        name: topic.name,
        dead_letter_for,
        history,
        sampled_every_ms,
    }
}

/// `bytes` as shown: the first [`SHOWN_BYTES`] as hex, and as text if they are UTF-8.
pub(crate) fn shown(bytes: &Bytes) -> Shown {
    let head = &bytes[..bytes.len().min(SHOWN_BYTES)];
    let text = match std::str::from_utf8(head) {
        Ok(text) => Some(text.to_owned()),
        // Cut inside a character at the limit: the text up to it.
        Err(error) if error.error_len().is_none() && head.len() < bytes.len() => {
            std::str::from_utf8(&head[..error.valid_up_to()])
                .ok()
                .map(str::to_owned)
        }
        Err(_) => None,
    };
    Shown {
        hex: hex(head),
        text,
        size: bytes.len(),
        cut: head.len() < bytes.len(),
    }
}

/// `bytes` in lower-case hex, two digits a byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// `records` of `partition` of `topic` as shown.
pub(crate) fn records_page(
    topic: &str,
    partition: i32,
    start_offset: i64,
    end_offset: i64,
    records: &[BrokerRecord],
) -> RecordsPage {
    RecordsPage {
        topic: topic.to_owned(),
        partition,
        start_offset,
        end_offset,
        records: records
            .iter()
            .map(|record| RecordView {
                offset: record.offset,
                timestamp_ms: record.timestamp_ms,
                key: record.key.as_ref().map(shown),
                payload: shown(&record.payload),
                headers: record
                    .headers
                    .iter()
                    .map(|header| ShownHeader {
                        name: header.name.clone(),
                        value: header.value.as_ref().map(shown),
                    })
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use broker_core::{EventBroker, GroupSetting, TopicName};

    fn wanted(search: &str, page: usize, per_page: usize) -> Wanted {
        Wanted::new(search, page, per_page)
    }

    #[test]
    fn lists_are_searched_and_paged() {
        let broker = EventBroker::new(100).unwrap();
        for name in ["alpha", "beta", "Gamma", "delta", "epsilon"] {
            broker.create(name, 1).unwrap();
        }
        let topics = broker.describe().topics;
        let names = |page: Page<TopicRow>| -> (usize, Vec<String>) {
            (page.total, page.items.into_iter().map(|t| t.name).collect())
        };
        assert_eq!(
            names(topic_rows(&topics, &wanted("", 1, 2))),
            (5, vec!["Gamma".to_owned(), "alpha".to_owned()])
        );
        assert_eq!(
            names(topic_rows(&topics, &wanted("", 3, 2))),
            (5, vec!["epsilon".to_owned()])
        );
        assert_eq!(names(topic_rows(&topics, &wanted("", 4, 2))), (5, vec![]));
        // Ignoring case.
        assert_eq!(
            names(topic_rows(&topics, &wanted("GA", 1, 50))),
            (1, vec!["Gamma".to_owned()])
        );
        assert_eq!(
            names(topic_rows(&topics, &wanted("ta", 1, 50))),
            (2, vec!["beta".to_owned(), "delta".to_owned()])
        );
        // Out of range asks are brought within it.
        let page = topic_rows(&topics, &wanted("", 0, 100_000));
        assert_eq!(
            (page.page, page.per_page, page.items.len()),
            (1, MAX_PER_PAGE, 5)
        );
    }

    #[test]
    fn rows_add_up_what_the_topics_and_groups_hold() {
        let broker = EventBroker::new(100).unwrap();
        broker.create("orders", 2).unwrap();
        broker.create("orders-dead", 1).unwrap();
        for partition in [0, 0, 1] {
            broker.publish("orders", partition, "order").unwrap();
        }
        broker.publish("orders-dead", 0, "late").unwrap();
        let dead_letter = vec![
            GroupSetting::MaxDeliveries(3),
            GroupSetting::DeadLetter(TopicName::new("orders-dead").unwrap()),
        ];
        broker
            .join_group("orders", "billing", "m1", None, &dead_letter)
            .unwrap();
        broker.join("orders", "audit", "m2").unwrap();
        let delivered = broker.poll("orders", "billing", "m1", 1).unwrap();
        broker
            .ack("orders", "billing", "m1", 0, delivered[0].offset)
            .unwrap();
        broker.poll("orders", "billing", "m1", 1).unwrap();
        let topics = broker.describe().topics;
        let rows = topic_rows(&topics, &wanted("", 1, 50)).items;
        assert_eq!(rows[0].name, "orders");
        assert_eq!(
            (
                rows[0].partitions,
                rows[0].records,
                rows[0].groups,
                rows[0].lag
            ),
            (2, 3, 2, 2 + 3)
        );
        assert_eq!(rows[0].bytes, 15);
        assert!(rows[0].dead_letter_for.is_empty());
        assert_eq!(rows[1].dead_letter_for, ["orders/billing"]);
        let groups = group_rows(&topics, &[], &wanted("bill", 1, 50));
        assert_eq!(
            groups.items,
            [GroupRow {
                topic: "orders".to_owned(),
                group: "billing".to_owned(),
                members: 1,
                lag: 2,
                in_flight: 1,
                dead_letter: Some("orders-dead".to_owned()),
            }]
        );
        assert_eq!(
            dead_letter_rows(&topics),
            [DeadLetterRow {
                topic: "orders-dead".to_owned(),
                records: 1,
                bytes: 4,
                groups: vec!["orders/billing".to_owned()],
            }]
        );
    }

    /// A group of the broker whose members are Kafka's consumers is shown with its kind, its
    /// members (those assigned the topic's partitions, or every member while it rebalances)
    /// and their partitions' owners; a group with native members as it is.
    #[test]
    fn kafka_groups_are_shown_with_their_members_and_owners() {
        use broker_core::{KafkaMemberDescription, TopicPartitions};
        let broker = EventBroker::new(10).unwrap();
        broker.create("orders", 2).unwrap();
        broker.join("orders", "native", "n").unwrap();
        let mut topics = broker.describe().topics;
        // A group with no members of its own, as a Kafka consumer's first commit makes one.
        let mut kafka = topics[0].groups[0].clone();
        kafka.name = "kafka".to_owned();
        kafka.members.clear();
        for partition in &mut kafka.partitions {
            partition.owner = None;
        }
        topics[0].groups.push(kafka);
        let no_history = || super::super::history::History::new(1).of("orders");
        let kafka_group = |state: &str, assigned: bool| KafkaGroupDescription {
            name: "kafka".to_owned(),
            state: state.to_owned(),
            generation: 2,
            protocol: if assigned {
                "range".to_owned()
            } else {
                String::new()
            },
            members: vec![KafkaMemberDescription {
                member: "consumer-1".to_owned(),
                client_id: "rdkafka".to_owned(),
                client_host: "/127.0.0.1".to_owned(),
                assignment: match assigned {
                    true => vec![TopicPartitions {
                        topic: "orders".to_owned(),
                        partitions: vec![1],
                    }],
                    false => Vec::new(),
                },
            }],
        };
        let stable = [kafka_group("Stable", true)];
        let page = topic_page(topics[0].clone(), &topics, &stable, no_history(), 1000);
        let shown = page
            .groups
            .iter()
            .find(|group| group.name == "kafka")
            .unwrap();
        assert_eq!(
            shown.assignor,
            "Kafka consumer group, range, generation 2, Stable"
        );
        assert_eq!(shown.members[0].member, "consumer-1");
        assert_eq!(shown.members[0].partitions, [1]);
        let owners: Vec<Option<&str>> = shown
            .partitions
            .iter()
            .map(|partition| partition.owner.as_deref())
            .collect();
        assert_eq!(owners, [None, Some("consumer-1")]);
        let native = page
            .groups
            .iter()
            .find(|group| group.name == "native")
            .unwrap();
        assert_eq!(native.members[0].member, "n");
        let rows = group_rows(&topics, &stable, &wanted("kafka", 1, 50)).items;
        assert_eq!(rows[0].members, 1);
        let rebalancing = [kafka_group("PreparingRebalance", false)];
        let page = topic_page(topics[0].clone(), &topics, &rebalancing, no_history(), 1000);
        let shown = page
            .groups
            .iter()
            .find(|group| group.name == "kafka")
            .unwrap();
        assert_eq!(
            shown.assignor,
            "Kafka consumer group, generation 2, PreparingRebalance"
        );
        assert_eq!(shown.members[0].partitions, Vec::<i32>::new());
    }

    #[test]
    fn bytes_are_shown_as_hex_and_as_text_when_they_are_text() {
        assert_eq!(
            shown(&Bytes::from_static(b"hi")),
            Shown {
                hex: "6869".to_owned(),
                text: Some("hi".to_owned()),
                size: 2,
                cut: false,
            }
        );
        let binary = shown(&Bytes::from_static(&[0xff, 0x00]));
        assert_eq!((binary.hex.as_str(), binary.text), ("ff00", None));
        // Past the limit: cut, at a character's boundary for the text.
        let mut long = vec![b'a'; SHOWN_BYTES - 1];
        long.extend("é and more".as_bytes());
        let long = shown(&Bytes::from(long));
        assert_eq!((long.size, long.cut), (SHOWN_BYTES + 10, true));
        assert_eq!(long.hex.len(), 2 * SHOWN_BYTES);
        assert_eq!(long.text.map(|text| text.len()), Some(SHOWN_BYTES - 1));
    }
}
