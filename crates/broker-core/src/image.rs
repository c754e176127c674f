//! The broker's state as plain data: what a snapshot stores.
//!
//! [`StateImage`] is the whole state of a [`crate::BrokerState`] in a fixed, documented shape
//! that does not follow the state's own (private, free to change) representation:
//! [`crate::BrokerState::to_image`] makes one, [`crate::BrokerState::from_image`] rebuilds the
//! state from one and checks every invariant first. A storage layer encodes images; renaming or
//! reorganising the state's internals can never change what it writes or reads, only the
//! conversion here.
//!
//! Every shape an image ever had stays readable: [`v1`] is the first (snapshots of data
//! directory format 1), [`v2`] the second (format 2), [`v3`] the third (format 3), [`v4`] the
//! fourth (format 4), this module's types are the current one (format 5). A change to the
//! shape is a new version with types of their own.
//!
//! # Layout, version 5
//!
//! Encoded with serde in field order, as bincode 2.0.1 with fixed-width little-endian integers
//! encodes it (`u64` lengths before every sequence and string, a `u8` tag before an `Option`):
//!
//! ```text
//! StateImage     capacity u64, clock_ms i64, next_topic_id u64,
//!                topics Vec<(name String, TopicImage)>, memory_budget Option<u64>,
//!                retained_bytes u64, max_topics u64, max_partitions u64,
//!                max_groups_per_topic u64, max_members_per_group u64
//! TopicImage     id u64, key_hash u32 (0 murmur2, 1 fnv1a), retention u32 (0 interest, 1 limits),
//!                max_records Option<u64>, max_bytes Option<u64>, max_age_ms Option<u64>,
//!                discard u32 (0 new, 1 old), next_keyless u64, partitions Vec<PartitionImage>,
//!                groups Vec<(name String, GroupImage)>, producers Vec<ProducerImage>
//! ProducerImage  id u64, last_seen_ms i64, partitions Vec<SequencesImage>
//! SequencesImage partition u64, next u64, recent Vec<(first u64, offsets Vec<i64>)>
//! PartitionImage base i64, cold_end i64, cold_bytes u64, first_timestamp_ms i64,
//!                last_timestamp_ms i64, records Vec<RecordImage>, retained_bytes u64
//! RecordImage    key Option<bytes>, payload bytes, headers Vec<HeaderImage>, timestamp_ms i64
//! HeaderImage    name String, value Option<bytes>
//! GroupImage     assignor u32 (0 round-robin, 1 range), start_at u32 (0 earliest, 1 latest),
//!                ack_timeout_ms Option<u64>, max_deliveries Option<u32>,
//!                dead_letter Option<String>, members Vec<MemberImage>,
//!                partitions Vec<GroupPartitionImage>
//! MemberImage    id String, partitions Vec<i32>
//! GroupPartitionImage  owner Option<u64> (index into members), committed i64, position i64,
//!                      in_flight Option<i64>, delivered_at_ms i64, deliveries u32, skipped u64,
//!                      has_commit bool (0 or 1)
//! ```

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The whole broker state, version 5: see the module documentation for the layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateImage {
    /// Records each partition of an interest-retention topic keeps at most by default.
    pub capacity: u64,
    /// The broker's clock, in milliseconds since the Unix epoch.
    pub clock_ms: i64,
    /// The id the next topic created gets (ids are never reused).
    pub next_topic_id: u64,
    /// Every topic with its name (written sorted by name).
    pub topics: Vec<(String, TopicImage)>,
    /// The memory budget in retained bytes, if any.
    pub memory_budget: Option<u64>,
    /// Bytes retained across every partition (their sum, checked on load).
    pub retained_bytes: u64,
    /// Most topics.
    pub max_topics: u64,
    /// Most partitions per topic.
    pub max_partitions: u64,
    /// Most groups per topic.
    pub max_groups_per_topic: u64,
    /// Most members per group.
    pub max_members_per_group: u64,
}

/// One topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicImage {
    /// The topic's id, unique among every topic the broker ever had: what names its logs in a
    /// cold store.
    pub id: u64,
    /// The key hash code: 0 is murmur2, 1 is FNV-1a.
    pub key_hash: u32,
    /// The retention code: 0 is interest, 1 is limits.
    pub retention: u32,
    /// Records a partition keeps at most, if the topic says.
    pub max_records: Option<u64>,
    /// Bytes a partition keeps at most, if the topic says.
    pub max_bytes: Option<u64>,
    /// The longest a record is kept, in milliseconds, if the topic says.
    pub max_age_ms: Option<u64>,
    /// The discard code: 0 refuses new records at a limit, 1 discards old ones.
    pub discard: u32,
    /// The partition the next keyless publish goes to.
    pub next_keyless: u64,
    /// The partitions' logs, by partition number.
    pub partitions: Vec<PartitionImage>,
    /// The consumer groups with their names (written sorted by name).
    pub groups: Vec<(String, GroupImage)>,
    /// The idempotent producers it remembers (written sorted by id).
    pub producers: Vec<ProducerImage>,
}

/// What a topic remembers of one idempotent producer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerImage {
    /// The producer's id.
    pub id: u64,
    /// The broker's clock when it last published.
    pub last_seen_ms: i64,
    /// Its progress on each partition it published to (sorted by partition).
    pub partitions: Vec<SequencesImage>,
}

/// An idempotent producer's progress on one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequencesImage {
    /// The partition.
    pub partition: u64,
    /// The sequence number its next new record must have.
    pub next: u64,
    /// Its last batches, oldest first: the first sequence number and the offsets stored.
    pub recent: Vec<(u64, Vec<i64>)>,
}

/// One partition's retained records: offsets `base..cold_end` held by a cold store (see
/// [`crate::cold`]), then `records` in memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionImage {
    /// The offset of the oldest retained record.
    pub base: i64,
    /// The offset of the first record of `records`; `base` when none is in a cold store.
    pub cold_end: i64,
    /// The payload, key and header bytes of the records in a cold store.
    pub cold_bytes: u64,
    /// The time of the record at `base` (0 when none is retained).
    pub first_timestamp_ms: i64,
    /// The time of the last record ever appended.
    pub last_timestamp_ms: i64,
    /// The records at offsets `cold_end`, `cold_end + 1`, ...
    pub records: Vec<RecordImage>,
    /// The payload, key and header bytes of every retained record (checked on load).
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
    /// The headers, in order.
    pub headers: Vec<HeaderImage>,
    /// The record's time.
    pub timestamp_ms: i64,
}

impl RecordImage {
    /// Payload, key and header bytes: what the record counts against budgets and limits.
    pub fn size(&self) -> u64 {
        let headers: usize = self
            .headers
            .iter()
            .map(|header| header.name.len() + header.value.as_ref().map_or(0, Bytes::len))
            .sum();
        (self.payload.len() + self.key.as_ref().map_or(0, Bytes::len) + headers) as u64
    }
}

/// One header of a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderImage {
    /// The header's name.
    pub name: String,
    /// Its value, if it has one.
    #[serde(default, deserialize_with = "crate::byte_fields::optional_bytes")]
    pub value: Option<Bytes>,
}

/// One consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupImage {
    /// The assignor code: 0 is round-robin, 1 is range.
    pub assignor: u32,
    /// Where the group started: 0 is the earliest record, 1 the end.
    pub start_at: u32,
    /// The acknowledgement timeout in milliseconds, if any.
    pub ack_timeout_ms: Option<u64>,
    /// The most deliveries of a record before it goes to the dead-letter topic, if any.
    pub max_deliveries: Option<u32>,
    /// The dead-letter topic, with `max_deliveries`.
    pub dead_letter: Option<String>,
    /// The members, sorted by id.
    pub members: Vec<v1::MemberImage>,
    /// The group's progress on each partition, by partition number.
    pub partitions: Vec<GroupPartitionImage>,
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
    /// When the delivery in flight was made.
    pub delivered_at_ms: i64,
    /// How many times the record at `committed` was delivered.
    pub deliveries: u32,
    /// Records the group skipped because they left before it consumed them.
    pub skipped: u64,
    /// Whether the group stored `committed` (a commit, an acknowledgement, a reset, or a record
    /// moved to its dead-letter topic), rather than only starting there: Kafka's OffsetFetch
    /// answers `-1` where it did not.
    pub has_commit: bool,
}

pub mod v4 {
    //! The state image of version 4, frozen: the snapshots of data directory format 4 and the
    //! cluster's snapshots and moves before version 5. Its groups did not say which partitions
    //! they stored an offset on; everything else is the current shape.
    //!
    //! # Layout, version 4
    //!
    //! As version 5, except that `GroupPartitionImage` has no `has_commit`. It shares
    //! `PartitionImage`, `ProducerImage` and `v1::MemberImage` with the current version (and
    //! the cluster's logs hold version 4 topic images): a change to any of them freezes its
    //! version 4 shape here first.

    use serde::{Deserialize, Serialize};

    use super::{v1, PartitionImage, ProducerImage};

    /// The whole broker state, version 4.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct StateImage {
        /// As in the current [`super::StateImage`].
        pub capacity: u64,
        /// As in the current [`super::StateImage`].
        pub clock_ms: i64,
        /// As in the current [`super::StateImage`].
        pub next_topic_id: u64,
        /// As in the current [`super::StateImage`].
        pub topics: Vec<(String, TopicImage)>,
        /// As in the current [`super::StateImage`].
        pub memory_budget: Option<u64>,
        /// As in the current [`super::StateImage`].
        pub retained_bytes: u64,
        /// As in the current [`super::StateImage`].
        pub max_topics: u64,
        /// As in the current [`super::StateImage`].
        pub max_partitions: u64,
        /// As in the current [`super::StateImage`].
        pub max_groups_per_topic: u64,
        /// As in the current [`super::StateImage`].
        pub max_members_per_group: u64,
    }

    /// One topic, version 4.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct TopicImage {
        /// As in the current [`super::TopicImage`].
        pub id: u64,
        /// As in the current [`super::TopicImage`].
        pub key_hash: u32,
        /// As in the current [`super::TopicImage`].
        pub retention: u32,
        /// As in the current [`super::TopicImage`].
        pub max_records: Option<u64>,
        /// As in the current [`super::TopicImage`].
        pub max_bytes: Option<u64>,
        /// As in the current [`super::TopicImage`].
        pub max_age_ms: Option<u64>,
        /// As in the current [`super::TopicImage`].
        pub discard: u32,
        /// As in the current [`super::TopicImage`].
        pub next_keyless: u64,
        /// As in the current [`super::TopicImage`].
        pub partitions: Vec<PartitionImage>,
        /// As in the current [`super::TopicImage`].
        pub groups: Vec<(String, GroupImage)>,
        /// As in the current [`super::TopicImage`].
        pub producers: Vec<ProducerImage>,
    }

    /// One consumer group, version 4.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct GroupImage {
        /// As in the current [`super::GroupImage`].
        pub assignor: u32,
        /// As in the current [`super::GroupImage`].
        pub start_at: u32,
        /// As in the current [`super::GroupImage`].
        pub ack_timeout_ms: Option<u64>,
        /// As in the current [`super::GroupImage`].
        pub max_deliveries: Option<u32>,
        /// As in the current [`super::GroupImage`].
        pub dead_letter: Option<String>,
        /// As in the current [`super::GroupImage`].
        pub members: Vec<v1::MemberImage>,
        /// As in the current [`super::GroupImage`].
        pub partitions: Vec<GroupPartitionImage>,
    }

    /// A group's progress on one partition, version 4.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct GroupPartitionImage {
        /// As in the current [`super::GroupPartitionImage`].
        pub owner: Option<u64>,
        /// As in the current [`super::GroupPartitionImage`].
        pub committed: i64,
        /// As in the current [`super::GroupPartitionImage`].
        pub position: i64,
        /// As in the current [`super::GroupPartitionImage`].
        pub in_flight: Option<i64>,
        /// As in the current [`super::GroupPartitionImage`].
        pub delivered_at_ms: i64,
        /// As in the current [`super::GroupPartitionImage`].
        pub deliveries: u32,
        /// As in the current [`super::GroupPartitionImage`].
        pub skipped: u64,
    }

    impl From<StateImage> for super::StateImage {
        /// The same state in the current shape: every offset its groups hold counts as stored,
        /// as the releases of version 4 answered.
        fn from(image: StateImage) -> super::StateImage {
            super::StateImage {
                capacity: image.capacity,
                clock_ms: image.clock_ms,
                next_topic_id: image.next_topic_id,
                topics: image
                    .topics
                    .into_iter()
                    .map(|(name, topic)| (name, topic.into()))
                    .collect(),
                memory_budget: image.memory_budget,
                retained_bytes: image.retained_bytes,
                max_topics: image.max_topics,
                max_partitions: image.max_partitions,
                max_groups_per_topic: image.max_groups_per_topic,
                max_members_per_group: image.max_members_per_group,
            }
        }
    }

    impl From<TopicImage> for super::TopicImage {
        /// The same topic in the current shape (see the state's conversion).
        fn from(topic: TopicImage) -> super::TopicImage {
            super::TopicImage {
                id: topic.id,
                key_hash: topic.key_hash,
                retention: topic.retention,
                max_records: topic.max_records,
                max_bytes: topic.max_bytes,
                max_age_ms: topic.max_age_ms,
                discard: topic.discard,
                next_keyless: topic.next_keyless,
                partitions: topic.partitions,
                groups: topic
                    .groups
                    .into_iter()
                    .map(|(name, group)| (name, group.into()))
                    .collect(),
                producers: topic.producers,
            }
        }
    }

    impl From<GroupImage> for super::GroupImage {
        /// The same group in the current shape: every offset it holds counts as stored.
        fn from(group: GroupImage) -> super::GroupImage {
            super::GroupImage {
                assignor: group.assignor,
                start_at: group.start_at,
                ack_timeout_ms: group.ack_timeout_ms,
                max_deliveries: group.max_deliveries,
                dead_letter: group.dead_letter,
                members: group.members,
                partitions: group
                    .partitions
                    .into_iter()
                    .map(|state| super::GroupPartitionImage {
                        owner: state.owner,
                        committed: state.committed,
                        position: state.position,
                        in_flight: state.in_flight,
                        delivered_at_ms: state.delivered_at_ms,
                        deliveries: state.deliveries,
                        skipped: state.skipped,
                        has_commit: true,
                    })
                    .collect(),
            }
        }
    }
}

pub mod v3 {
    //! The state image of version 3, frozen: the snapshots of data directory format 3. Its
    //! groups had no maximum of deliveries and no dead-letter topic; everything else is
    //! version 4's shape.
    //!
    //! # Layout, version 3
    //!
    //! As version 4, except that `GroupImage` has no `max_deliveries` and no `dead_letter`.

    use serde::{Deserialize, Serialize};

    use super::v4::{self, GroupPartitionImage};
    use super::{v1, PartitionImage, ProducerImage};

    /// The whole broker state, version 3.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct StateImage {
        /// As in the current [`super::StateImage`].
        pub capacity: u64,
        /// As in the current [`super::StateImage`].
        pub clock_ms: i64,
        /// As in the current [`super::StateImage`].
        pub next_topic_id: u64,
        /// As in the current [`super::StateImage`].
        pub topics: Vec<(String, TopicImage)>,
        /// As in the current [`super::StateImage`].
        pub memory_budget: Option<u64>,
        /// As in the current [`super::StateImage`].
        pub retained_bytes: u64,
        /// As in the current [`super::StateImage`].
        pub max_topics: u64,
        /// As in the current [`super::StateImage`].
        pub max_partitions: u64,
        /// As in the current [`super::StateImage`].
        pub max_groups_per_topic: u64,
        /// As in the current [`super::StateImage`].
        pub max_members_per_group: u64,
    }

    /// One topic, version 3.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct TopicImage {
        /// As in the current [`super::TopicImage`].
        pub id: u64,
        /// As in the current [`super::TopicImage`].
        pub key_hash: u32,
        /// As in the current [`super::TopicImage`].
        pub retention: u32,
        /// As in the current [`super::TopicImage`].
        pub max_records: Option<u64>,
        /// As in the current [`super::TopicImage`].
        pub max_bytes: Option<u64>,
        /// As in the current [`super::TopicImage`].
        pub max_age_ms: Option<u64>,
        /// As in the current [`super::TopicImage`].
        pub discard: u32,
        /// As in the current [`super::TopicImage`].
        pub next_keyless: u64,
        /// As in the current [`super::TopicImage`].
        pub partitions: Vec<PartitionImage>,
        /// As in the current [`super::TopicImage`].
        pub groups: Vec<(String, GroupImage)>,
        /// As in the current [`super::TopicImage`].
        pub producers: Vec<ProducerImage>,
    }

    /// One consumer group, version 3.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct GroupImage {
        /// As in the current [`super::GroupImage`].
        pub assignor: u32,
        /// As in the current [`super::GroupImage`].
        pub start_at: u32,
        /// As in the current [`super::GroupImage`].
        pub ack_timeout_ms: Option<u64>,
        /// As in the current [`super::GroupImage`].
        pub members: Vec<v1::MemberImage>,
        /// As in the current [`super::GroupImage`].
        pub partitions: Vec<GroupPartitionImage>,
    }

    impl From<StateImage> for v4::StateImage {
        /// The same state in the shape of version 4: its groups have no maximum of deliveries.
        fn from(image: StateImage) -> v4::StateImage {
            v4::StateImage {
                capacity: image.capacity,
                clock_ms: image.clock_ms,
                next_topic_id: image.next_topic_id,
                topics: image
                    .topics
                    .into_iter()
                    .map(|(name, topic)| (name, topic.into()))
                    .collect(),
                memory_budget: image.memory_budget,
                retained_bytes: image.retained_bytes,
                max_topics: image.max_topics,
                max_partitions: image.max_partitions,
                max_groups_per_topic: image.max_groups_per_topic,
                max_members_per_group: image.max_members_per_group,
            }
        }
    }

    impl From<TopicImage> for v4::TopicImage {
        fn from(topic: TopicImage) -> v4::TopicImage {
            v4::TopicImage {
                id: topic.id,
                key_hash: topic.key_hash,
                retention: topic.retention,
                max_records: topic.max_records,
                max_bytes: topic.max_bytes,
                max_age_ms: topic.max_age_ms,
                discard: topic.discard,
                next_keyless: topic.next_keyless,
                partitions: topic.partitions,
                groups: topic
                    .groups
                    .into_iter()
                    .map(|(name, group)| {
                        let group = v4::GroupImage {
                            assignor: group.assignor,
                            start_at: group.start_at,
                            ack_timeout_ms: group.ack_timeout_ms,
                            max_deliveries: None,
                            dead_letter: None,
                            members: group.members,
                            partitions: group.partitions,
                        };
                        (name, group)
                    })
                    .collect(),
                producers: topic.producers,
            }
        }
    }
}

pub mod v2 {
    //! The state image of version 2, frozen: the snapshots of data directory format 2. Its
    //! topics had no idempotent producers; everything else is the current shape.
    //!
    //! # Layout, version 2
    //!
    //! As version 3, except that `TopicImage` ends with `groups` (no `producers`).

    use serde::{Deserialize, Serialize};

    use super::v3::GroupImage;
    use super::PartitionImage;

    /// The whole broker state, version 2.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct StateImage {
        /// As in the current [`super::StateImage`].
        pub capacity: u64,
        /// As in the current [`super::StateImage`].
        pub clock_ms: i64,
        /// As in the current [`super::StateImage`].
        pub next_topic_id: u64,
        /// As in the current [`super::StateImage`].
        pub topics: Vec<(String, TopicImage)>,
        /// As in the current [`super::StateImage`].
        pub memory_budget: Option<u64>,
        /// As in the current [`super::StateImage`].
        pub retained_bytes: u64,
        /// As in the current [`super::StateImage`].
        pub max_topics: u64,
        /// As in the current [`super::StateImage`].
        pub max_partitions: u64,
        /// As in the current [`super::StateImage`].
        pub max_groups_per_topic: u64,
        /// As in the current [`super::StateImage`].
        pub max_members_per_group: u64,
    }

    /// One topic, version 2.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct TopicImage {
        /// As in the current [`super::TopicImage`].
        pub id: u64,
        /// As in the current [`super::TopicImage`].
        pub key_hash: u32,
        /// As in the current [`super::TopicImage`].
        pub retention: u32,
        /// As in the current [`super::TopicImage`].
        pub max_records: Option<u64>,
        /// As in the current [`super::TopicImage`].
        pub max_bytes: Option<u64>,
        /// As in the current [`super::TopicImage`].
        pub max_age_ms: Option<u64>,
        /// As in the current [`super::TopicImage`].
        pub discard: u32,
        /// As in the current [`super::TopicImage`].
        pub next_keyless: u64,
        /// As in the current [`super::TopicImage`].
        pub partitions: Vec<PartitionImage>,
        /// As in the current [`super::TopicImage`].
        pub groups: Vec<(String, GroupImage)>,
    }

    impl From<StateImage> for super::v3::StateImage {
        /// The same state in the shape of version 3: its topics remember no producer.
        fn from(image: StateImage) -> super::v3::StateImage {
            super::v3::StateImage {
                capacity: image.capacity,
                clock_ms: image.clock_ms,
                next_topic_id: image.next_topic_id,
                topics: image
                    .topics
                    .into_iter()
                    .map(|(name, topic)| {
                        let topic = super::v3::TopicImage {
                            id: topic.id,
                            key_hash: topic.key_hash,
                            retention: topic.retention,
                            max_records: topic.max_records,
                            max_bytes: topic.max_bytes,
                            max_age_ms: topic.max_age_ms,
                            discard: topic.discard,
                            next_keyless: topic.next_keyless,
                            partitions: topic.partitions,
                            groups: topic.groups,
                            producers: Vec::new(),
                        };
                        (name, topic)
                    })
                    .collect(),
                memory_budget: image.memory_budget,
                retained_bytes: image.retained_bytes,
                max_topics: image.max_topics,
                max_partitions: image.max_partitions,
                max_groups_per_topic: image.max_groups_per_topic,
                max_members_per_group: image.max_members_per_group,
            }
        }
    }
}

pub mod v1 {
    //! The state image of version 1, frozen: the snapshots of data directory format 1.
    //!
    //! # Layout, version 1
    //!
    //! ```text
    //! StateImage     capacity u64, topics Vec<(name String, TopicImage)>,
    //!                memory_budget Option<u64>, retained_bytes u64, max_topics u64,
    //!                max_groups_per_topic u64, max_members_per_group u64
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
    //! These are exactly the bytes snapshots of format version 1 hold (written by the first
    //! releases, from the state's own serde encoding), so those snapshots read back unchanged.

    use bytes::Bytes;
    use serde::{Deserialize, Serialize};

    /// The whole broker state, version 1.
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
}
