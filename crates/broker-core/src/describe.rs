//! A read-only snapshot of the broker for admin tools: topics, partitions, groups.

use serde::{Deserialize, Serialize};

use crate::{Assignor, GroupSetting, KeyHash, TopicSetting};

/// Every described topic, sorted by name.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BrokerDescription {
    /// The per-partition capacity the broker was created with.
    pub capacity_per_partition: i32,
    /// The topics, sorted by name.
    pub topics: Vec<TopicDescription>,
}

/// One topic: its partitions' logs and its consumer groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicDescription {
    /// Topic identifier.
    pub name: String,
    /// How keyed publishes pick a partition.
    pub key_hash: KeyHash,
    /// How its partitions retain records: the retention and every limit set.
    #[serde(default)]
    pub settings: Vec<TopicSetting>,
    /// Payload, key and header bytes retained across all partitions.
    pub retained_bytes: u64,
    /// One entry per partition, ascending.
    pub partitions: Vec<PartitionDescription>,
    /// The topic's consumer groups, sorted by name.
    pub groups: Vec<GroupDescription>,
}

impl TopicDescription {
    /// Records retained over every partition.
    pub fn records(&self) -> u64 {
        self.partitions
            .iter()
            .map(|partition| partition.records)
            .sum()
    }

    /// The sum of its partitions' end offsets: how many records were ever published to it.
    pub fn end_offsets(&self) -> i64 {
        self.partitions
            .iter()
            .map(|partition| partition.end_offset)
            .sum()
    }
}

/// One partition's retained log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionDescription {
    /// Partition number.
    pub partition: i32,
    /// Offset of the oldest retained record (equal to `end_offset` when empty).
    pub earliest_offset: i64,
    /// Offset the next published record will get.
    pub end_offset: i64,
    /// Retained records: `end_offset - earliest_offset`.
    pub records: u64,
    /// Payload, key and header bytes retained.
    pub retained_bytes: u64,
    /// The time of the oldest retained record, if any.
    #[serde(default)]
    pub earliest_timestamp_ms: Option<i64>,
}

/// One consumer group of a topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDescription {
    /// Group identifier.
    pub name: String,
    /// The group's assignor, fixed when the group was created.
    pub assignor: Assignor,
    /// The settings the group was created with, where they differ from the defaults.
    #[serde(default)]
    pub settings: Vec<GroupSetting>,
    /// Members sorted by id, each with its partitions.
    pub members: Vec<MemberDescription>,
    /// The group's state on each partition, ascending.
    pub partitions: Vec<GroupPartitionDescription>,
}

impl GroupDescription {
    /// Its lag over every partition of the topic.
    pub fn lag(&self) -> i64 {
        self.partitions.iter().map(|partition| partition.lag).sum()
    }

    /// How many of its partitions have a delivery in flight (ack mode).
    pub fn in_flight(&self) -> usize {
        self.partitions
            .iter()
            .filter(|partition| partition.in_flight.is_some())
            .count()
    }
}

/// A consumer group of Kafka's clients, as the server's Kafka listener coordinates it
/// ([`crate::Command::KafkaGroups`], protocol version 15). Its committed offsets are those of
/// the broker's group of the same name on each topic, which a [`GroupDescription`] shows
/// without members: its members joined through the Kafka listener, and are these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaGroupDescription {
    /// Group identifier.
    pub name: String,
    /// Its state, as Kafka names it: `PreparingRebalance`, `CompletingRebalance`, `Stable`
    /// or `Empty`.
    pub state: String,
    /// The generation of its last rebalance (0 before the first).
    pub generation: i32,
    /// The protocol its members agreed on at the last rebalance: for Kafka's consumers, the
    /// partition assignor (`range`, `roundrobin`, `cooperative-sticky`, ...); empty before
    /// the first.
    pub protocol: String,
    /// Its members, sorted by id.
    pub members: Vec<KafkaMemberDescription>,
}

impl KafkaGroupDescription {
    /// The group's kind as tools show it beside its name: `Kafka consumer group, range,
    /// generation 3, Stable` (the assignor and generation once it has had a rebalance).
    pub fn kind(&self) -> String {
        let mut words = vec!["Kafka consumer group".to_owned()];
        words.extend((!self.protocol.is_empty()).then(|| self.protocol.clone()));
        words.extend((self.generation > 0).then(|| format!("generation {}", self.generation)));
        words.push(self.state.clone());
        words.join(", ")
    }

    /// Whether it has members whose partitions a rebalance is deciding (none is assigned any
    /// meanwhile).
    pub fn is_rebalancing(&self) -> bool {
        !self.members.is_empty() && self.state != "Stable"
    }

    /// Its members assigned partitions of `topic`, each with those partitions, in member order.
    pub fn assigned_on(&self, topic: &str) -> Vec<(&KafkaMemberDescription, &[i32])> {
        self.members
            .iter()
            .filter_map(|member| {
                let assigned = member
                    .assignment
                    .iter()
                    .find(|assigned| assigned.topic == topic)?;
                Some((member, assigned.partitions.as_slice()))
            })
            .collect()
    }
}

/// One member of a consumer group of Kafka's clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaMemberDescription {
    /// The member id the coordinator gave it.
    pub member: String,
    /// The client id its client connected with.
    pub client_id: String,
    /// Where its client connected from, as Kafka shows it (`/127.0.0.1`).
    pub client_host: String,
    /// The partitions its group's leader assigned it, by topic (sorted by name, each topic's
    /// partitions ascending): empty while a rebalance runs, and for members whose assignment
    /// is not a Kafka consumer's or is over 1 MiB.
    pub assignment: Vec<TopicPartitions>,
}

/// Partitions of one topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicPartitions {
    /// Topic identifier.
    pub topic: String,
    /// The partitions, ascending.
    pub partitions: Vec<i32>,
}

/// One member of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberDescription {
    /// Member identifier.
    pub member: String,
    /// The member's partitions, ascending.
    pub partitions: Vec<i32>,
}

/// A group's state on one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPartitionDescription {
    /// Partition number.
    pub partition: i32,
    /// The member that owns the partition, if the group has members.
    pub owner: Option<String>,
    /// The group's committed offset.
    pub committed: i64,
    /// The owner's fetch position (where its next `fetch` starts).
    pub position: i64,
    /// The offset delivered by `poll` and not yet acknowledged or retried.
    pub in_flight: Option<i64>,
    /// `end_offset - committed`, never negative.
    pub lag: i64,
    /// In ack mode, how many times the record at `committed` has been delivered (0 before its
    /// first delivery).
    #[serde(default)]
    pub deliveries: u32,
    /// Records the group never consumed because they left the partition first.
    #[serde(default)]
    pub skipped: u64,
}
