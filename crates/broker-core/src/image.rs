//! The broker's state as plain data: what a snapshot stores.
//!
//! [`StateImage`] is the whole state of a [`crate::BrokerState`] in a fixed, documented shape
//! that does not follow the state's own (private, free to change) representation:
//! [`crate::BrokerState::to_image`] makes one, [`crate::BrokerState::from_image`] rebuilds the
//! state from one and checks every invariant first. A storage layer encodes images; renaming or
//! reorganising the state's internals can never change what it writes or reads, only the
//! conversion here.
//!
//! # Layout, version 1
//!
//! Encoded with serde in field order, as bincode 2.0.1 with fixed-width little-endian integers
//! encodes it (`u64` lengths before every sequence and string, a `u8` tag before an `Option`):
//!
//! ```text
//! StateImage     capacity u64, topics Vec<(name String, TopicImage)>, memory_budget Option<u64>,
//!                retained_bytes u64, max_topics u64, max_groups_per_topic u64,
//!                max_members_per_group u64
//! TopicImage     key_hash u32 (0 murmur2, 1 fnv1a), next_keyless u64,
//!                partitions Vec<PartitionImage>, groups Vec<(name String, GroupImage)>
//! PartitionImage base i64, records Vec<RecordImage>, retained_bytes u64
//! RecordImage    key Option<bytes>, payload bytes
//! GroupImage     assignor u32 (0 round-robin, 1 range), members Vec<MemberImage>,
//!                partitions Vec<GroupPartitionImage>
//! MemberImage    id String, partitions Vec<i32>
//! GroupPartitionImage  owner Option<u64> (index into members), committed i64, position i64,
//!                      in_flight Option<i64>
//! ```
//!
//! These are exactly the bytes snapshots of format version 1 hold (written before this type
//! existed, from the state's own serde encoding), so those snapshots read back unchanged. A
//! change to the shape is a new version with a type of its own, and the old one stays readable.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The whole broker state, version 1: see the module documentation for the layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateImage {
    /// Records each partition retains at most, 1 to 1,000.
    pub capacity: u64,
    /// Every topic with its name (written sorted by name).
    pub topics: Vec<(String, TopicImage)>,
    /// The memory budget in payload and key bytes, if any.
    pub memory_budget: Option<u64>,
    /// Payload and key bytes retained across every partition (their sum, checked on load).
    pub retained_bytes: u64,
    /// Most topics.
    pub max_topics: u64,
    /// Most groups per topic.
    pub max_groups_per_topic: u64,
    /// Most members per group.
    pub max_members_per_group: u64,
}

/// One topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicImage {
    /// The key hash code: 0 is murmur2, 1 is FNV-1a.
    pub key_hash: u32,
    /// The partition the next keyless publish goes to.
    pub next_keyless: u64,
    /// The partitions' logs, by partition number.
    pub partitions: Vec<PartitionImage>,
    /// The consumer groups with their names (written sorted by name).
    pub groups: Vec<(String, GroupImage)>,
}

/// One partition's retained records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionImage {
    /// The offset of the first record of `records`.
    pub base: i64,
    /// The records at offsets `base`, `base + 1`, ...
    pub records: Vec<RecordImage>,
    /// Their payload and key bytes (checked on load).
    pub retained_bytes: u64,
}

/// One retained record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordImage {
    /// The key, if it was published with one.
    #[serde(default, deserialize_with = "crate::byte_fields::optional_bytes")]
    pub key: Option<Bytes>,
    /// The payload.
    #[serde(deserialize_with = "crate::byte_fields::bytes")]
    pub payload: Bytes,
}

/// One consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupImage {
    /// The assignor code: 0 is round-robin, 1 is range.
    pub assignor: u32,
    /// The members, sorted by id.
    pub members: Vec<MemberImage>,
    /// The group's progress on each partition, by partition number.
    pub partitions: Vec<GroupPartitionImage>,
}

/// One member of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberImage {
    /// The member id.
    pub id: String,
    /// The partitions it owns, ascending.
    pub partitions: Vec<i32>,
}

/// A group's progress on one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPartitionImage {
    /// The owner, as an index into the group's members.
    pub owner: Option<u64>,
    /// The next offset the group has yet to consume.
    pub committed: i64,
    /// Where the owner's next fetch starts.
    pub position: i64,
    /// The offset delivered by a poll and not yet acknowledged or retried.
    pub in_flight: Option<i64>,
}
