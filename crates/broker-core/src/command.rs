//! Commands in, outcomes out: every broker call as a value.
//!
//! [`crate::BrokerState::apply`] applies one [`Command`] and returns its [`Outcome`]. The server
//! decodes commands from the wire and applies them; a write-ahead log can store the same values
//! and replay them through the same function, so the rules have one implementation.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{Assignor, BrokerDescription, BrokerRecord, KeyHash, PartitionLag, PublishRecord};

/// One broker call with its arguments. Each variant mirrors the [`crate::EventBroker`] method of
/// the same name, which documents its rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
        /// Offsets to store; `None` stores the member's current fetch positions.
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

impl Command {
    /// Whether applying the command can never change broker state, so a write-ahead log need not
    /// record it. `Poll` and `Fetch` do change state (deliveries and positions).
    pub fn is_read_only(&self) -> bool {
        matches!(
            self,
            Command::Assignment { .. }
                | Command::Committed { .. }
                | Command::EndOffset { .. }
                | Command::Lag { .. }
                | Command::Describe { .. }
        )
    }

    /// The topic the command names, if it names one.
    pub fn topic(&self) -> Option<&str> {
        match self {
            Command::Create { topic, .. }
            | Command::Join { topic, .. }
            | Command::Leave { topic, .. }
            | Command::Publish { topic, .. }
            | Command::PublishKeyed { topic, .. }
            | Command::Poll { topic, .. }
            | Command::Ack { topic, .. }
            | Command::Retry { topic, .. }
            | Command::Fetch { topic, .. }
            | Command::Commit { topic, .. }
            | Command::Assignment { topic, .. }
            | Command::Committed { topic, .. }
            | Command::EndOffset { topic, .. }
            | Command::Lag { topic, .. }
            | Command::PublishBatch { topic, .. }
            | Command::AckAndPoll { topic, .. }
            | Command::Redeliver { topic, .. } => Some(topic),
            Command::Describe { topic } => topic.as_deref(),
        }
    }
}

/// What a successfully applied [`Command`] returned, one variant per kind of result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
