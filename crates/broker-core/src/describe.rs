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
