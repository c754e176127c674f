//! The shapes of version 1, frozen: the wire protocol's version 1 and the log entries of data
//! directory format 1 encode these types, byte for byte, whatever the current types become.
//!
//! A connection that says version 1 in its hello is decoded and answered in these shapes, and a
//! log segment of format 1 is replayed from them; [`From`] turns a version 1 command into a
//! current one, and [`TryFrom`] a current outcome into a version 1 one. Nothing
//! here may change: a new field or variant goes into the current types and a new version.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strum::IntoStaticStr;

use crate::{Assignor, KeyHash, MemberDescription};

/// A command of version 1 (fields as documented in proto.md, version 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr)]
pub enum Command {
    /// [`crate::EventBroker::create_with`].
    Create {
        /// Topic identifier.
        topic: String,
        /// Number of partitions, 1 to 64.
        partition_count: i32,
        /// How keyed publishes pick a partition.
        key_hash: KeyHash,
    },
    /// [`crate::EventBroker::join_with`], or [`crate::EventBroker::join`] when `assignor` is
    /// `None`.
    Join {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// Member identifier.
        member: String,
        /// The assignor the group must use; `None` accepts the group's own.
        assignor: Option<Assignor>,
    },
    /// [`crate::EventBroker::leave`].
    Leave {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// Member identifier.
        member: String,
    },
    /// [`crate::EventBroker::publish`].
    Publish {
        /// Topic identifier.
        topic: String,
        /// Target partition.
        partition: i32,
        /// Record bytes.
        #[serde(deserialize_with = "crate::byte_fields::bytes")]
        payload: Bytes,
    },
    /// [`crate::EventBroker::publish_keyed`].
    PublishKeyed {
        /// Topic identifier.
        topic: String,
        /// Partitioning key; `None` publishes round-robin.
        #[serde(default, deserialize_with = "crate::byte_fields::optional_bytes")]
        key: Option<Bytes>,
        /// Record bytes.
        #[serde(deserialize_with = "crate::byte_fields::bytes")]
        payload: Bytes,
    },
    /// [`crate::EventBroker::poll_limited`].
    Poll {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// Member identifier.
        member: String,
        /// Most records to reserve, 1 to 64.
        max_records: i32,
        /// Stop adding records once this many payload and key bytes are taken (at least one
        /// record is always returned when one is eligible); `None` for no byte limit.
        max_bytes: Option<u64>,
    },
    /// [`crate::EventBroker::ack`].
    Ack {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// Member identifier.
        member: String,
        /// Partition of the delivery.
        partition: i32,
        /// Offset of the delivery.
        offset: i64,
    },
    /// [`crate::EventBroker::retry`].
    Retry {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// Member identifier.
        member: String,
        /// Partition of the delivery.
        partition: i32,
        /// Offset of the delivery.
        offset: i64,
    },
    /// [`crate::EventBroker::fetch_limited`].
    Fetch {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// Member identifier.
        member: String,
        /// Most records to return, 1 to [`crate::MAX_FETCH_RECORDS`].
        max_records: i32,
        /// Byte budget, as for [`Command::Poll`].
        max_bytes: Option<u64>,
    },
    /// [`crate::EventBroker::commit`].
    Commit {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// Member identifier.
        member: String,
        /// Offsets to store by partition; `None` stores the member's current fetch positions.
        /// Partitions strictly ascend in the encoding (a map encoded otherwise does not decode).
        #[serde(
            default,
            deserialize_with = "crate::byte_fields::optional_ascending_offsets"
        )]
        offsets: Option<BTreeMap<i32, i64>>,
    },
    /// [`crate::EventBroker::assignment`].
    Assignment {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// Member identifier.
        member: String,
    },
    /// [`crate::EventBroker::committed`].
    Committed {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// Partition.
        partition: i32,
    },
    /// [`crate::EventBroker::end_offset`].
    EndOffset {
        /// Topic identifier.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// [`crate::EventBroker::lag`].
    Lag {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
    },
    /// [`crate::EventBroker::describe`].
    Describe {
        /// Describe only this topic; `None` describes every topic.
        topic: Option<String>,
    },
    /// [`crate::EventBroker::publish_batch`].
    PublishBatch {
        /// Topic identifier.
        topic: String,
        /// The records, published in this order.
        records: Vec<PublishRecord>,
    },
    /// [`crate::EventBroker::ack_and_poll`] (with a byte budget, as [`Command::Poll`]).
    AckAndPoll {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// Member identifier.
        member: String,
        /// Deliveries to acknowledge first, as (partition, offset), at most [`crate::MAX_ACKS`].
        acks: Vec<(i32, i64)>,
        /// Most records to reserve afterwards, 1 to 64.
        max_records: i32,
        /// Byte budget, as for [`Command::Poll`].
        max_bytes: Option<u64>,
    },
    /// [`crate::EventBroker::redeliver`] (with a byte budget, as [`Command::Poll`]).
    Redeliver {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// Member identifier.
        member: String,
        /// Most records to reserve, 1 to 64.
        max_records: i32,
        /// Byte budget, as for [`Command::Poll`].
        max_bytes: Option<u64>,
    },
}

/// An outcome of version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr)]
pub enum Outcome {
    /// `create`: `true` if the topic was created, `false` if it already existed.
    Created(bool),
    /// `join` and `assignment`: the member's partitions, ascending.
    Partitions(Vec<i32>),
    /// `leave`: `true` if the member was removed.
    Left(bool),
    /// `publish`: the record's offset, or `-1` when the partition is full.
    Published(i64),
    /// `publish_keyed`: the partition chosen and the offset there (`-1` when full).
    PublishedKeyed {
        /// The partition the key (or round-robin) chose.
        partition: i32,
        /// The record's offset, or `-1` when that partition is full.
        offset: i64,
    },
    /// `poll`, `fetch` and `redeliver`: the records, by ascending partition then offset.
    Records(Vec<BrokerRecord>),
    /// `ack`: `true` if the exact delivery was acknowledged.
    Acked(bool),
    /// `retry`: `true` if the exact delivery was released for redelivery.
    Retried(bool),
    /// `commit`: the offsets were stored.
    Committed,
    /// `committed` and `end_offset`: an offset.
    Offset(i64),
    /// `lag`: one row per partition, ascending.
    Lag(Vec<PartitionLag>),
    /// `describe`: the topics and their groups.
    Description(BrokerDescription),
    /// `publish_batch`: each record's partition and offset (`-1` where full), in batch order.
    PublishedBatch(Vec<(i32, i64)>),
    /// `ack_and_poll`: whether each acknowledgement matched, in request order, then the records
    /// polled, as [`Outcome::Records`].
    AckedAndPolled {
        /// One entry per acknowledgement asked for: `true` if it matched its delivery.
        acked: Vec<bool>,
        /// The records reserved by the poll that followed.
        records: Vec<BrokerRecord>,
    },
}

/// A delivered record of version 1: no timestamp, headers or delivery count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRecord {
    /// The topic the record was published to.
    #[serde(deserialize_with = "crate::byte_fields::string")]
    pub topic: String,
    /// The partition of that topic that holds the record.
    pub partition: i32,
    /// The record's offset, local to its partition: 0 for the first record ever published
    /// there, counting up by one.
    pub offset: i64,
    /// The key the record was published with, if any (keyed publishes only).
    #[serde(default, deserialize_with = "crate::byte_fields::optional_bytes")]
    pub key: Option<Bytes>,
    /// The record's bytes. Empty payloads are valid.
    #[serde(deserialize_with = "crate::byte_fields::bytes")]
    pub payload: Bytes,
}

/// A record to publish, version 1: no headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishRecord {
    /// The partition to append to; `None` lets the key (or round-robin, without a key) choose.
    pub partition: Option<i32>,
    /// The record's key, stored with it; it picks the partition only when `partition` is `None`.
    #[serde(default, deserialize_with = "crate::byte_fields::optional_bytes")]
    pub key: Option<Bytes>,
    /// The record's bytes.
    #[serde(deserialize_with = "crate::byte_fields::bytes")]
    pub payload: Bytes,
}

/// A lag row of version 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionLag {
    /// The partition this row describes.
    pub partition: i32,
    /// The group's committed offset: the next offset the group will consume.
    pub committed: i64,
    /// The offset the next record published to the partition will get.
    pub end_offset: i64,
    /// `end_offset - committed`: how many records the group has yet to consume (0, never
    /// negative, when the group committed past the end).
    pub lag: i64,
}

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
    /// Payload and key bytes retained across all partitions.
    pub retained_bytes: u64,
    /// One entry per partition, ascending.
    pub partitions: Vec<PartitionDescription>,
    /// The topic's consumer groups, sorted by name.
    pub groups: Vec<GroupDescription>,
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
    /// Payload and key bytes retained.
    pub retained_bytes: u64,
}

/// One consumer group of a topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDescription {
    /// Group identifier.
    pub name: String,
    /// The group's assignor, fixed when the group was created.
    pub assignor: Assignor,
    /// Members sorted by id, each with its partitions.
    pub members: Vec<MemberDescription>,
    /// The group's state on each partition, ascending.
    pub partitions: Vec<GroupPartitionDescription>,
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
}

impl Command {
    /// The variant's name, as in proto.md (`"Publish"`).
    pub fn name(&self) -> &'static str {
        self.into()
    }
}

impl Outcome {
    /// The variant's name, as in proto.md (`"Records"`).
    pub fn name(&self) -> &'static str {
        self.into()
    }
}

impl From<Command> for crate::Command {
    /// The same call in the current shape: no topic or group settings, no headers, records
    /// stamped with the broker's clock.
    fn from(command: Command) -> crate::Command {
        use crate::Command as Current;
        match command {
            Command::Create {
                topic,
                partition_count,
                key_hash,
            } => Current::Create {
                topic,
                partition_count,
                key_hash,
                settings: Vec::new(),
            },
            Command::Join {
                topic,
                group,
                member,
                assignor,
            } => Current::Join {
                topic,
                group,
                member,
                assignor,
                settings: Vec::new(),
            },
            Command::Leave {
                topic,
                group,
                member,
            } => Current::Leave {
                topic,
                group,
                member,
            },
            Command::Publish {
                topic,
                partition,
                payload,
            } => Current::Publish {
                topic,
                partition,
                payload,
            },
            Command::PublishKeyed {
                topic,
                key,
                payload,
            } => Current::PublishKeyed {
                topic,
                key,
                payload,
            },
            Command::Poll {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => Current::Poll {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            },
            Command::Ack {
                topic,
                group,
                member,
                partition,
                offset,
            } => Current::Ack {
                topic,
                group,
                member,
                partition,
                offset,
            },
            Command::Retry {
                topic,
                group,
                member,
                partition,
                offset,
            } => Current::Retry {
                topic,
                group,
                member,
                partition,
                offset,
            },
            Command::Fetch {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => Current::Fetch {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            },
            Command::Commit {
                topic,
                group,
                member,
                offsets,
            } => Current::Commit {
                topic,
                group,
                member,
                offsets,
            },
            Command::Assignment {
                topic,
                group,
                member,
            } => Current::Assignment {
                topic,
                group,
                member,
            },
            Command::Committed {
                topic,
                group,
                partition,
            } => Current::Committed {
                topic,
                group,
                partition,
            },
            Command::EndOffset { topic, partition } => Current::EndOffset { topic, partition },
            Command::Lag { topic, group } => Current::Lag { topic, group },
            Command::Describe { topic } => Current::Describe { topic },
            Command::PublishBatch { topic, records } => Current::PublishBatch {
                topic,
                records: records
                    .into_iter()
                    .map(|record| crate::PublishRecord {
                        partition: record.partition,
                        key: record.key,
                        payload: record.payload,
                        headers: Vec::new(),
                        timestamp_ms: None,
                    })
                    .collect(),
            },
            Command::AckAndPoll {
                topic,
                group,
                member,
                acks,
                max_records,
                max_bytes,
            } => Current::AckAndPoll {
                topic,
                group,
                member,
                acks,
                max_records,
                max_bytes,
            },
            Command::Redeliver {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => Current::Redeliver {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            },
        }
    }
}

/// A current outcome that version 1 has no shape for (it answers a command version 1 does not
/// have); carries the outcome's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the outcome {0} does not exist in version 1")]
pub struct NotInVersion1(pub &'static str);

impl TryFrom<crate::Outcome> for Outcome {
    type Error = NotInVersion1;

    /// The same outcome in version 1's shape: records without times, headers or delivery
    /// counts, lag rows without skipped counts, descriptions without settings.
    fn try_from(outcome: crate::Outcome) -> Result<Outcome, NotInVersion1> {
        use crate::Outcome as Current;
        let name = outcome.name();
        Ok(match outcome {
            Current::Created(created) => Outcome::Created(created),
            Current::Partitions(partitions) => Outcome::Partitions(partitions),
            Current::Left(left) => Outcome::Left(left),
            Current::Published(offset) => Outcome::Published(offset),
            Current::PublishedKeyed { partition, offset } => {
                Outcome::PublishedKeyed { partition, offset }
            }
            Current::Records(records) => Outcome::Records(records_v1(records)),
            Current::Acked(acked) => Outcome::Acked(acked),
            Current::Retried(retried) => Outcome::Retried(retried),
            Current::Committed => Outcome::Committed,
            Current::Offset(offset) => Outcome::Offset(offset),
            Current::Lag(rows) => Outcome::Lag(
                rows.into_iter()
                    .map(|row| PartitionLag {
                        partition: row.partition,
                        committed: row.committed,
                        end_offset: row.end_offset,
                        lag: row.lag,
                    })
                    .collect(),
            ),
            Current::Description(description) => Outcome::Description(description_v1(description)),
            Current::PublishedBatch(placed) => Outcome::PublishedBatch(placed),
            Current::AckedAndPolled { acked, records } => Outcome::AckedAndPolled {
                acked,
                records: records_v1(records),
            },
            Current::Deleted(_)
            | Current::PartitionCount(_)
            | Current::GroupSettings(_)
            | Current::TopicSettings(_)
            | Current::ClusterStatus(_)
            | Current::GroupsStatus(_)
            | Current::KafkaGroups(_)
            | Current::Producers(_)
            | Current::StoredOffsets(_)
            | Current::Members(_)
            | Current::Metadata(_)
            | Current::Read(_) => return Err(NotInVersion1(name)),
        })
    }
}

fn records_v1(records: Vec<crate::BrokerRecord>) -> Vec<BrokerRecord> {
    records
        .into_iter()
        .map(|record| BrokerRecord {
            topic: record.topic,
            partition: record.partition,
            offset: record.offset,
            key: record.key,
            payload: record.payload,
        })
        .collect()
}

fn description_v1(description: crate::BrokerDescription) -> BrokerDescription {
    BrokerDescription {
        capacity_per_partition: description.capacity_per_partition,
        topics: description
            .topics
            .into_iter()
            .map(|topic| TopicDescription {
                name: topic.name,
                key_hash: topic.key_hash,
                retained_bytes: topic.retained_bytes,
                partitions: topic
                    .partitions
                    .into_iter()
                    .map(|partition| PartitionDescription {
                        partition: partition.partition,
                        earliest_offset: partition.earliest_offset,
                        end_offset: partition.end_offset,
                        records: partition.records,
                        retained_bytes: partition.retained_bytes,
                    })
                    .collect(),
                groups: topic
                    .groups
                    .into_iter()
                    .map(|group| GroupDescription {
                        name: group.name,
                        assignor: group.assignor,
                        members: group.members,
                        partitions: group
                            .partitions
                            .into_iter()
                            .map(|partition| GroupPartitionDescription {
                                partition: partition.partition,
                                owner: partition.owner,
                                committed: partition.committed,
                                position: partition.position,
                                in_flight: partition.in_flight,
                                lag: partition.lag,
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
    }
}
