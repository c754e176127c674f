//! Commands in, outcomes out: every broker call as a value.
//!
//! [`crate::BrokerState::apply`] applies one [`Command`] and returns its [`Outcome`]. The server
//! decodes commands from the wire and applies them; a write-ahead log can store the same values
//! and replay them through the same function, so the rules have one implementation.
//!
//! Everything a server or a log needs to know about a command (is it read-only, must its
//! outcome be logged, whose waiting polls may it wake, which member does it name, may it wait)
//! is decided here, each in one `match` without a wildcard arm: a new command does not compile
//! until every property is decided for it.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strum::{EnumCount, EnumDiscriminants, EnumIter, IntoStaticStr};

use crate::image::RecordImage;
use crate::{
    Assignor, BrokerDescription, BrokerMetadata, BrokerRecord, ClusterMember, ClusterStatus,
    GroupSetting, GroupStatus, Header, KafkaGroupDescription, KeyHash, PartitionBatch,
    PartitionLag, PartitionRead, ProducerState, PublishRecord, ResetTo, TopicSetting,
};

/// One broker call with its arguments. Each variant mirrors the [`crate::EventBroker`] method of
/// the same name, which documents its rules.
///
/// [`CommandKind`] names the variants without their arguments, with
/// [`CommandKind::iter`](strum::IntoEnumIterator::iter) over all of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, EnumDiscriminants)]
#[strum_discriminants(name(CommandKind), derive(Hash, EnumIter, EnumCount, IntoStaticStr))]
#[strum_discriminants(doc = "A [`Command`] without its arguments: what kind of call it is.")]
pub enum Command {
    /// [`crate::EventBroker::create_topic`].
    Create {
        /// Topic identifier.
        topic: String,
        /// Number of partitions, 1 to the broker's limit (64 by default).
        partition_count: i32,
        /// How keyed publishes pick a partition.
        key_hash: KeyHash,
        /// How its partitions retain records ([`crate::TopicSettings`]); empty for the
        /// defaults (interest retention, the broker's capacity).
        settings: Vec<TopicSetting>,
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
        /// The settings a new group gets ([`crate::GroupSettings`]); an existing group must
        /// already have them. Empty accepts the group's own.
        settings: Vec<GroupSetting>,
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
    /// [`crate::EventBroker::add_partitions`].
    AddPartitions {
        /// Topic identifier.
        topic: String,
        /// The number of partitions the topic is to have (never fewer than it has).
        partition_count: i32,
    },
    /// [`crate::EventBroker::delete_topic`].
    DeleteTopic {
        /// Topic identifier.
        topic: String,
    },
    /// [`crate::EventBroker::delete_group`].
    DeleteGroup {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
    },
    /// [`crate::EventBroker::purge`].
    Purge {
        /// Topic identifier.
        topic: String,
        /// Partition.
        partition: i32,
        /// Records below this offset leave.
        before: i64,
    },
    /// [`crate::EventBroker::reset_group`].
    ResetGroup {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// The partitions to reset; `None` resets every partition.
        partitions: Option<Vec<i32>>,
        /// Where to.
        to: ResetTo,
    },
    /// [`crate::EventBroker::offset_for_time`].
    OffsetForTime {
        /// Topic identifier.
        topic: String,
        /// Partition.
        partition: i32,
        /// Milliseconds since the Unix epoch.
        timestamp_ms: i64,
    },
    /// [`crate::EventBroker::publish_idempotent`].
    PublishIdempotent {
        /// Topic identifier.
        topic: String,
        /// The producer's id: chosen at random by the producer, kept for its life.
        producer: u64,
        /// One batch per partition, each partition named once.
        batches: Vec<PartitionBatch>,
    },
    /// [`crate::BrokerState::retry_after`]: a retry whose record is delivered again no earlier
    /// than `delay_ms` from now (protocol version 4).
    RetryAfter {
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
        /// How long the record is held back, in milliseconds.
        delay_ms: u64,
    },
    /// [`crate::BrokerState::configure_group`]: replaces a group's settings (protocol version
    /// 4).
    ConfigureGroup {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// The group's settings from now on; where it starts cannot change.
        settings: Vec<GroupSetting>,
    },
    /// What the node asked knows of its cluster: its role, term and log, and every member
    /// (protocol version 5). Answered by the server about itself, never by the broker's state
    /// ([`Scope::Cluster`]).
    ClusterStatus,
    /// Adds a node to the cluster: it catches up with the leader's log, then votes (protocol
    /// version 5). Answered by the leader once the node is a voter.
    AddNode {
        /// The new node's id (one no node of the cluster has, nor had).
        node_id: u64,
        /// The address the other members reach it on.
        peer_addr: String,
        /// The address clients reach it on.
        client_addr: String,
    },
    /// Removes a node from the cluster (protocol version 5). Answered by the leader once the
    /// cluster no longer counts it.
    RemoveNode {
        /// The node's id.
        node_id: u64,
    },
    /// Where clients find the topics: the nodes of the cluster and the node serving each topic
    /// (protocol version 5).
    Metadata {
        /// One topic, or `None` for every topic.
        topic: Option<String>,
    },
    /// [`crate::EventBroker::read`]: records of one partition from an offset, without a group
    /// (protocol version 6).
    Read {
        /// Topic identifier.
        topic: String,
        /// Partition.
        partition: i32,
        /// The first offset wanted.
        offset: i64,
        /// Most records to return, 1 to [`crate::MAX_FETCH_RECORDS`].
        max_records: i32,
        /// Byte budget, as for [`Command::Poll`].
        max_bytes: Option<u64>,
    },
    /// [`crate::EventBroker::commit_group`]: a group's committed offsets stored from outside
    /// its members (protocol version 6).
    CommitGroup {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// The offsets to store, as (partition, offset), each partition once.
        offsets: Vec<(i32, i64)>,
    },
    /// Hands the leadership of the cluster over to a voter (protocol version 7). Answered by
    /// the old leader once it follows the new one, with what it knows of the cluster then.
    TransferLeadership {
        /// The voter that is to lead.
        node_id: u64,
    },
    /// [`crate::EventBroker::publish_until_full`] (protocol version 8).
    PublishUntilFull {
        /// Topic identifier.
        topic: String,
        /// The records, published in this order.
        records: Vec<PublishRecord>,
    },
    /// [`crate::BrokerState::configure_topic`]: changes the settings of an existing topic
    /// (protocol version 9).
    ConfigureTopic {
        /// Topic identifier.
        topic: String,
        /// The settings to change; those not named stay as they are, and the retention
        /// cannot change.
        settings: Vec<TopicSetting>,
    },
    /// What the node asked knows of each Raft group it hosts, in a cluster that spreads its
    /// topics over several (protocol version 10): as [`Command::ClusterStatus`] for each, with
    /// the topics each holds. Answered by the server about itself ([`Scope::Cluster`]).
    GroupsStatus,
    /// Moves a topic, with its records, consumer groups, offsets and idempotent producers, to
    /// another Raft group of a cluster that spreads its topics over several (protocol version
    /// 13). Answered once the topic is served from that group, with where clients find it
    /// ([`Outcome::Metadata`] of the topic). Answered by the server ([`Scope::Cluster`]).
    MoveTopic {
        /// Topic identifier.
        topic: String,
        /// The group it is to live in (1 is the first group).
        group: u32,
    },
    /// [`crate::EventBroker::producers`] (protocol version 14).
    Producers {
        /// Topic identifier.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// [`crate::EventBroker::stored_offsets`] (protocol version 14).
    StoredOffsets {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
    },
    /// [`crate::EventBroker::delete_offsets`] (protocol version 14).
    DeleteOffsets {
        /// Topic identifier.
        topic: String,
        /// Group identifier.
        group: String,
        /// The partitions whose offsets are deleted.
        partitions: Vec<i32>,
    },
    /// The consumer groups of Kafka's clients, with their members and assignments, as the
    /// server's Kafka listener coordinates them (protocol version 15; none when the listener
    /// is off). In a cluster, answered by the node that coordinates them, the first group's
    /// leader. Answered by the server ([`Scope::Server`]).
    KafkaGroups,
}

/// What answers a command ([`CommandKind::scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The broker's state: [`crate::BrokerState::apply`] applies it.
    Broker,
    /// The server, about the cluster it is a node of: the broker's state refuses it.
    Cluster,
    /// The server, about what it holds beside the broker's state (the groups of its Kafka
    /// listener): the broker's state refuses it.
    Server,
}

/// How a command changes the membership of the group it names ([`CommandKind::membership`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// The member it names joined (or was already a member).
    Joins,
    /// The member it names left (or was not a member).
    Leaves,
    /// Membership is as it was.
    Unchanged,
}

/// A consumer-group member as a command names it, borrowed from the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemberName<'a> {
    /// Topic identifier.
    pub topic: &'a str,
    /// Group identifier.
    pub group: &'a str,
    /// Member identifier.
    pub member: &'a str,
}

impl CommandKind {
    /// What answers a command of this kind: the broker's state, or the server about its
    /// cluster.
    pub fn scope(self) -> Scope {
        match self {
            CommandKind::ClusterStatus
            | CommandKind::GroupsStatus
            | CommandKind::AddNode
            | CommandKind::RemoveNode
            | CommandKind::TransferLeadership
            | CommandKind::MoveTopic
            | CommandKind::Metadata => Scope::Cluster,
            CommandKind::KafkaGroups => Scope::Server,
            CommandKind::Create
            | CommandKind::Join
            | CommandKind::Leave
            | CommandKind::Publish
            | CommandKind::PublishKeyed
            | CommandKind::PublishBatch
            | CommandKind::PublishUntilFull
            | CommandKind::PublishIdempotent
            | CommandKind::Poll
            | CommandKind::Ack
            | CommandKind::AckAndPoll
            | CommandKind::Retry
            | CommandKind::RetryAfter
            | CommandKind::Redeliver
            | CommandKind::Fetch
            | CommandKind::Commit
            | CommandKind::Assignment
            | CommandKind::Committed
            | CommandKind::EndOffset
            | CommandKind::Lag
            | CommandKind::Describe
            | CommandKind::OffsetForTime
            | CommandKind::Read
            | CommandKind::CommitGroup
            | CommandKind::AddPartitions
            | CommandKind::DeleteTopic
            | CommandKind::DeleteGroup
            | CommandKind::ConfigureGroup
            | CommandKind::ConfigureTopic
            | CommandKind::Purge
            | CommandKind::ResetGroup
            | CommandKind::Producers
            | CommandKind::StoredOffsets
            | CommandKind::DeleteOffsets => Scope::Broker,
        }
    }

    /// Whether a command of this kind never changes the state: it is never logged, and is served
    /// even while the log cannot take entries. (`Poll` and `Fetch` change deliveries and
    /// positions, so they are not read-only.)
    pub fn is_read_only(self) -> bool {
        match self {
            CommandKind::Assignment
            | CommandKind::Committed
            | CommandKind::EndOffset
            | CommandKind::Lag
            | CommandKind::Describe
            | CommandKind::OffsetForTime
            | CommandKind::Read
            | CommandKind::ClusterStatus
            | CommandKind::GroupsStatus
            | CommandKind::KafkaGroups
            | CommandKind::AddNode
            | CommandKind::RemoveNode
            | CommandKind::TransferLeadership
            | CommandKind::MoveTopic
            | CommandKind::Metadata
            | CommandKind::Producers
            | CommandKind::StoredOffsets => true,
            CommandKind::PublishIdempotent
            | CommandKind::CommitGroup
            | CommandKind::AddPartitions
            | CommandKind::DeleteTopic
            | CommandKind::DeleteGroup
            | CommandKind::DeleteOffsets
            | CommandKind::ConfigureGroup
            | CommandKind::ConfigureTopic
            | CommandKind::Purge
            | CommandKind::ResetGroup
            | CommandKind::Create
            | CommandKind::Join
            | CommandKind::Leave
            | CommandKind::Publish
            | CommandKind::PublishKeyed
            | CommandKind::PublishBatch
            | CommandKind::PublishUntilFull
            | CommandKind::Poll
            | CommandKind::Ack
            | CommandKind::AckAndPoll
            | CommandKind::Retry
            | CommandKind::RetryAfter
            | CommandKind::Redeliver
            | CommandKind::Fetch
            | CommandKind::Commit => false,
        }
    }

    /// Whether a command of this kind is answered with a list that grows with the state, not
    /// with the request, up to a megabyte or more: a row per topic, group, producer or node the
    /// broker holds, or per partition of a topic (up to 65,536 rows of about 30 bytes). A
    /// request of a few bytes may ask for that much. (Answers with records are bounded by the
    /// request's own byte budget; a member's partitions take 4 bytes each, 256 KiB at most.)
    pub fn answer_grows_with_state(self) -> bool {
        match self {
            CommandKind::Describe
            | CommandKind::Metadata
            | CommandKind::ClusterStatus
            | CommandKind::GroupsStatus
            | CommandKind::KafkaGroups
            | CommandKind::Producers
            | CommandKind::Lag
            | CommandKind::ResetGroup
            | CommandKind::StoredOffsets => true,
            CommandKind::Create
            | CommandKind::Join
            | CommandKind::Leave
            | CommandKind::Publish
            | CommandKind::PublishKeyed
            | CommandKind::PublishBatch
            | CommandKind::PublishUntilFull
            | CommandKind::PublishIdempotent
            | CommandKind::Poll
            | CommandKind::Ack
            | CommandKind::AckAndPoll
            | CommandKind::Retry
            | CommandKind::RetryAfter
            | CommandKind::Redeliver
            | CommandKind::Fetch
            | CommandKind::Commit
            | CommandKind::Assignment
            | CommandKind::Committed
            | CommandKind::EndOffset
            | CommandKind::OffsetForTime
            | CommandKind::Read
            | CommandKind::CommitGroup
            | CommandKind::AddPartitions
            | CommandKind::DeleteTopic
            | CommandKind::DeleteGroup
            | CommandKind::ConfigureGroup
            | CommandKind::ConfigureTopic
            | CommandKind::Purge
            | CommandKind::DeleteOffsets
            | CommandKind::AddNode
            | CommandKind::RemoveNode
            | CommandKind::TransferLeadership
            | CommandKind::MoveTopic => false,
        }
    }

    /// Whether a command of this kind that succeeded with `outcome` changed the state, so that a
    /// write-ahead log must record it. Outcomes that the rules guarantee changed nothing need
    /// no entry: a poll, fetch or redelivery that returned nothing (waiting requests retry them
    /// often), a create of an existing topic, a leave by a non-member, an ack or retry that did
    /// not match, an ack-and-poll that matched nothing and polled nothing. (A publish answered
    /// `-1` is logged: a keyless one still advances the topic's round-robin.) A command during
    /// which a record went past its last delivery changed the state whatever its outcome (see
    /// [`crate::BrokerState::dead_letter_events`]).
    pub fn changed_state(self, outcome: &Outcome) -> bool {
        // Not the outcome of these kinds (`None`): log it rather than guess.
        let took_records = || outcome.records().is_none_or(|records| !records.is_empty());
        match self {
            CommandKind::Assignment
            | CommandKind::Committed
            | CommandKind::EndOffset
            | CommandKind::Lag
            | CommandKind::Describe
            | CommandKind::OffsetForTime
            | CommandKind::Read
            | CommandKind::ClusterStatus
            | CommandKind::GroupsStatus
            | CommandKind::KafkaGroups
            | CommandKind::AddNode
            | CommandKind::RemoveNode
            | CommandKind::TransferLeadership
            | CommandKind::MoveTopic
            | CommandKind::Metadata
            | CommandKind::Producers
            | CommandKind::StoredOffsets => false,
            CommandKind::DeleteTopic | CommandKind::DeleteGroup => {
                !matches!(outcome, Outcome::Deleted(false))
            }
            CommandKind::PublishIdempotent
            | CommandKind::CommitGroup
            | CommandKind::AddPartitions
            | CommandKind::Purge
            | CommandKind::ResetGroup
            | CommandKind::DeleteOffsets
            | CommandKind::Join
            | CommandKind::Publish
            | CommandKind::PublishKeyed
            | CommandKind::PublishBatch
            | CommandKind::PublishUntilFull
            | CommandKind::ConfigureGroup
            | CommandKind::ConfigureTopic
            | CommandKind::Commit => true,
            CommandKind::Create => !matches!(outcome, Outcome::Created(false)),
            CommandKind::Leave => !matches!(outcome, Outcome::Left(false)),
            CommandKind::Ack => !matches!(outcome, Outcome::Acked(false)),
            CommandKind::Retry | CommandKind::RetryAfter => {
                !matches!(outcome, Outcome::Retried(false))
            }
            CommandKind::Poll | CommandKind::Fetch | CommandKind::Redeliver => took_records(),
            CommandKind::AckAndPoll => !matches!(
                outcome,
                Outcome::AckedAndPolled { acked, records }
                    if records.is_empty() && !acked.contains(&true)
            ),
        }
    }

    /// Whether a change of this kind is one an operator reconstructs the broker's history
    /// from: topics created, grown, configured, purged and deleted; members joining and
    /// leaving; groups reset, configured and deleted. A server logs each one that changed the
    /// state at info level.
    pub fn is_administrative(self) -> bool {
        match self {
            CommandKind::Create
            | CommandKind::AddPartitions
            | CommandKind::DeleteTopic
            | CommandKind::Purge
            | CommandKind::Join
            | CommandKind::Leave
            | CommandKind::ResetGroup
            | CommandKind::DeleteGroup
            | CommandKind::DeleteOffsets
            | CommandKind::ConfigureGroup
            | CommandKind::ConfigureTopic => true,
            CommandKind::Publish
            | CommandKind::PublishKeyed
            | CommandKind::PublishBatch
            | CommandKind::PublishUntilFull
            | CommandKind::PublishIdempotent
            | CommandKind::Poll
            | CommandKind::Ack
            | CommandKind::AckAndPoll
            | CommandKind::Retry
            | CommandKind::RetryAfter
            | CommandKind::Redeliver
            | CommandKind::Fetch
            | CommandKind::Commit
            | CommandKind::Assignment
            | CommandKind::Committed
            | CommandKind::EndOffset
            | CommandKind::Lag
            | CommandKind::Describe
            | CommandKind::OffsetForTime
            | CommandKind::Read
            | CommandKind::CommitGroup
            | CommandKind::ClusterStatus
            | CommandKind::GroupsStatus
            | CommandKind::KafkaGroups
            | CommandKind::AddNode
            | CommandKind::RemoveNode
            | CommandKind::TransferLeadership
            | CommandKind::MoveTopic
            | CommandKind::Metadata
            | CommandKind::Producers
            | CommandKind::StoredOffsets => false,
        }
    }

    /// How a successful command of this kind changes group membership, which a server mirrors
    /// in its member sessions.
    pub fn membership(self) -> Membership {
        match self {
            CommandKind::Join => Membership::Joins,
            CommandKind::Leave => Membership::Leaves,
            CommandKind::Create
            | CommandKind::Publish
            | CommandKind::PublishKeyed
            | CommandKind::PublishBatch
            | CommandKind::PublishUntilFull
            | CommandKind::Poll
            | CommandKind::Ack
            | CommandKind::AckAndPoll
            | CommandKind::Retry
            | CommandKind::RetryAfter
            | CommandKind::Redeliver
            | CommandKind::Fetch
            | CommandKind::Commit
            | CommandKind::Assignment
            | CommandKind::Committed
            | CommandKind::EndOffset
            | CommandKind::Lag
            | CommandKind::Describe
            | CommandKind::AddPartitions
            | CommandKind::DeleteTopic
            | CommandKind::DeleteGroup
            | CommandKind::ConfigureGroup
            | CommandKind::ConfigureTopic
            | CommandKind::Purge
            | CommandKind::ResetGroup
            | CommandKind::OffsetForTime
            | CommandKind::ClusterStatus
            | CommandKind::GroupsStatus
            | CommandKind::KafkaGroups
            | CommandKind::AddNode
            | CommandKind::RemoveNode
            | CommandKind::TransferLeadership
            | CommandKind::MoveTopic
            | CommandKind::Metadata
            | CommandKind::Read
            | CommandKind::CommitGroup
            | CommandKind::PublishIdempotent
            | CommandKind::Producers
            | CommandKind::StoredOffsets
            | CommandKind::DeleteOffsets => Membership::Unchanged,
        }
    }

    /// The protocol version that added this kind of command: a connection of an older version
    /// cannot send it (it is a malformed request there).
    pub fn since_version(self) -> u16 {
        match self {
            CommandKind::Create
            | CommandKind::Join
            | CommandKind::Leave
            | CommandKind::Publish
            | CommandKind::PublishKeyed
            | CommandKind::Poll
            | CommandKind::Ack
            | CommandKind::Retry
            | CommandKind::Fetch
            | CommandKind::Commit
            | CommandKind::Assignment
            | CommandKind::Committed
            | CommandKind::EndOffset
            | CommandKind::Lag
            | CommandKind::Describe
            | CommandKind::PublishBatch
            | CommandKind::AckAndPoll
            | CommandKind::Redeliver => 1,
            CommandKind::AddPartitions
            | CommandKind::DeleteTopic
            | CommandKind::DeleteGroup
            | CommandKind::Purge
            | CommandKind::ResetGroup
            | CommandKind::OffsetForTime => 2,
            CommandKind::PublishIdempotent => 3,
            CommandKind::RetryAfter | CommandKind::ConfigureGroup => 4,
            CommandKind::ClusterStatus
            | CommandKind::AddNode
            | CommandKind::RemoveNode
            | CommandKind::Metadata => 5,
            CommandKind::Read | CommandKind::CommitGroup => 6,
            CommandKind::TransferLeadership => 7,
            CommandKind::PublishUntilFull => 8,
            CommandKind::ConfigureTopic => 9,
            CommandKind::GroupsStatus => 10,
            CommandKind::MoveTopic => 13,
            CommandKind::Producers | CommandKind::StoredOffsets | CommandKind::DeleteOffsets => 14,
            CommandKind::KafkaGroups => 15,
        }
    }

    /// The kind's name, as in [`Command`] (`"PublishBatch"`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl Command {
    /// What kind of call this is.
    pub fn kind(&self) -> CommandKind {
        self.into()
    }

    /// The protocol version a connection must speak to send this command: its kind's
    /// ([`CommandKind::since_version`]), or a later one if it carries a group setting a later
    /// version added.
    pub fn since_version(&self) -> u16 {
        let settings = match self {
            Command::Join { settings, .. } => settings
                .iter()
                .map(crate::GroupSetting::since_version)
                .max()
                .unwrap_or(0),
            _ => 0,
        };
        self.kind().since_version().max(settings)
    }

    /// Whether the command never changes the state; see [`CommandKind::is_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.kind().is_read_only()
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
            | Command::RetryAfter { topic, .. }
            | Command::Fetch { topic, .. }
            | Command::Commit { topic, .. }
            | Command::Assignment { topic, .. }
            | Command::Committed { topic, .. }
            | Command::EndOffset { topic, .. }
            | Command::Lag { topic, .. }
            | Command::PublishBatch { topic, .. }
            | Command::PublishUntilFull { topic, .. }
            | Command::AckAndPoll { topic, .. }
            | Command::Redeliver { topic, .. }
            | Command::AddPartitions { topic, .. }
            | Command::DeleteTopic { topic }
            | Command::DeleteGroup { topic, .. }
            | Command::ConfigureGroup { topic, .. }
            | Command::ConfigureTopic { topic, .. }
            | Command::Purge { topic, .. }
            | Command::ResetGroup { topic, .. }
            | Command::OffsetForTime { topic, .. }
            | Command::Read { topic, .. }
            | Command::CommitGroup { topic, .. }
            | Command::PublishIdempotent { topic, .. }
            | Command::MoveTopic { topic, .. }
            | Command::Producers { topic, .. }
            | Command::StoredOffsets { topic, .. }
            | Command::DeleteOffsets { topic, .. } => Some(topic),
            Command::Describe { topic } | Command::Metadata { topic } => topic.as_deref(),
            Command::ClusterStatus
            | Command::GroupsStatus
            | Command::KafkaGroups
            | Command::AddNode { .. }
            | Command::RemoveNode { .. }
            | Command::TransferLeadership { .. } => None,
        }
    }

    /// The topic whose waiting polls and fetches may find records once this command succeeded:
    /// it published records, settled or released deliveries, moved committed offsets, changed
    /// an assignment, or changed settings (a record in flight that a lowered limit removed
    /// frees its partition). `None` for commands that can make nothing eligible.
    pub fn wakes(&self) -> Option<&str> {
        match self {
            Command::Join { topic, .. }
            | Command::Leave { topic, .. }
            | Command::Publish { topic, .. }
            | Command::PublishKeyed { topic, .. }
            | Command::PublishBatch { topic, .. }
            | Command::PublishUntilFull { topic, .. }
            | Command::Ack { topic, .. }
            | Command::AckAndPoll { topic, .. }
            | Command::Retry { topic, .. }
            | Command::RetryAfter { topic, .. }
            | Command::Redeliver { topic, .. }
            | Command::Commit { topic, .. }
            | Command::CommitGroup { topic, .. }
            | Command::AddPartitions { topic, .. }
            | Command::DeleteTopic { topic }
            | Command::Purge { topic, .. }
            | Command::ResetGroup { topic, .. }
            | Command::DeleteOffsets { topic, .. }
            | Command::ConfigureGroup { topic, .. }
            | Command::ConfigureTopic { topic, .. }
            | Command::PublishIdempotent { topic, .. } => Some(topic),
            Command::Create { .. }
            | Command::Poll { .. }
            | Command::Fetch { .. }
            | Command::Assignment { .. }
            | Command::Committed { .. }
            | Command::EndOffset { .. }
            | Command::Lag { .. }
            | Command::Describe { .. }
            | Command::DeleteGroup { .. }
            | Command::OffsetForTime { .. }
            | Command::Read { .. }
            | Command::ClusterStatus
            | Command::GroupsStatus
            | Command::KafkaGroups
            | Command::AddNode { .. }
            | Command::RemoveNode { .. }
            | Command::TransferLeadership { .. }
            | Command::MoveTopic { .. }
            | Command::Metadata { .. }
            | Command::Producers { .. }
            | Command::StoredOffsets { .. } => None,
        }
    }

    /// The group member the command is made by or for (its session is kept alive by it), if
    /// it names one.
    pub fn member(&self) -> Option<MemberName<'_>> {
        match self {
            Command::Join {
                topic,
                group,
                member,
                ..
            }
            | Command::Leave {
                topic,
                group,
                member,
            }
            | Command::Poll {
                topic,
                group,
                member,
                ..
            }
            | Command::Ack {
                topic,
                group,
                member,
                ..
            }
            | Command::AckAndPoll {
                topic,
                group,
                member,
                ..
            }
            | Command::Redeliver {
                topic,
                group,
                member,
                ..
            }
            | Command::Retry {
                topic,
                group,
                member,
                ..
            }
            | Command::RetryAfter {
                topic,
                group,
                member,
                ..
            }
            | Command::Fetch {
                topic,
                group,
                member,
                ..
            }
            | Command::Commit {
                topic,
                group,
                member,
                ..
            }
            | Command::Assignment {
                topic,
                group,
                member,
            } => Some(MemberName {
                topic,
                group,
                member,
            }),
            Command::Create { .. }
            | Command::Publish { .. }
            | Command::PublishKeyed { .. }
            | Command::PublishBatch { .. }
            | Command::PublishUntilFull { .. }
            | Command::Committed { .. }
            | Command::EndOffset { .. }
            | Command::Lag { .. }
            | Command::Describe { .. }
            | Command::AddPartitions { .. }
            | Command::DeleteTopic { .. }
            | Command::DeleteGroup { .. }
            | Command::ConfigureGroup { .. }
            | Command::ConfigureTopic { .. }
            | Command::Purge { .. }
            | Command::ResetGroup { .. }
            | Command::OffsetForTime { .. }
            | Command::ClusterStatus
            | Command::GroupsStatus
            | Command::KafkaGroups
            | Command::AddNode { .. }
            | Command::RemoveNode { .. }
            | Command::TransferLeadership { .. }
            | Command::MoveTopic { .. }
            | Command::Metadata { .. }
            | Command::Read { .. }
            | Command::CommitGroup { .. }
            | Command::PublishIdempotent { .. }
            | Command::Producers { .. }
            | Command::StoredOffsets { .. }
            | Command::DeleteOffsets { .. } => None,
        }
    }

    /// The command to retry while a request of this command waits for records it did not find
    /// at first, or `None` for a command that never waits. A poll, fetch or read retries itself; an
    /// ack-and-poll or a redelivery retries its poll alone (its acknowledgements or releases
    /// take effect once, before the wait).
    pub fn waiting_retry(&self) -> Option<Command> {
        match self {
            Command::Poll { .. } | Command::Fetch { .. } | Command::Read { .. } => {
                Some(self.clone())
            }
            Command::AckAndPoll {
                topic,
                group,
                member,
                max_records,
                max_bytes,
                ..
            }
            | Command::Redeliver {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => Some(Command::Poll {
                topic: topic.clone(),
                group: group.clone(),
                member: member.clone(),
                max_records: *max_records,
                max_bytes: *max_bytes,
            }),
            Command::Create { .. }
            | Command::Join { .. }
            | Command::Leave { .. }
            | Command::Publish { .. }
            | Command::PublishKeyed { .. }
            | Command::PublishBatch { .. }
            | Command::PublishUntilFull { .. }
            | Command::Ack { .. }
            | Command::Retry { .. }
            | Command::RetryAfter { .. }
            | Command::Commit { .. }
            | Command::Assignment { .. }
            | Command::Committed { .. }
            | Command::EndOffset { .. }
            | Command::Lag { .. }
            | Command::Describe { .. }
            | Command::AddPartitions { .. }
            | Command::DeleteTopic { .. }
            | Command::DeleteGroup { .. }
            | Command::ConfigureGroup { .. }
            | Command::ConfigureTopic { .. }
            | Command::Purge { .. }
            | Command::ResetGroup { .. }
            | Command::OffsetForTime { .. }
            | Command::ClusterStatus
            | Command::GroupsStatus
            | Command::KafkaGroups
            | Command::AddNode { .. }
            | Command::RemoveNode { .. }
            | Command::TransferLeadership { .. }
            | Command::MoveTopic { .. }
            | Command::Metadata { .. }
            | Command::CommitGroup { .. }
            | Command::PublishIdempotent { .. }
            | Command::Producers { .. }
            | Command::StoredOffsets { .. }
            | Command::DeleteOffsets { .. } => None,
        }
    }

    /// The payload plus key bytes of the largest record the command publishes, if it publishes
    /// any: what a server holds against its payload limit.
    pub fn largest_record(&self) -> Option<usize> {
        match self {
            Command::Publish { payload, .. } => Some(payload.len()),
            Command::PublishKeyed { key, payload, .. } => {
                Some(payload.len() + key.as_ref().map_or(0, Bytes::len))
            }
            Command::PublishBatch { records, .. } | Command::PublishUntilFull { records, .. } => {
                records.iter().map(PublishRecord::size).max()
            }
            Command::PublishIdempotent { batches, .. } => batches
                .iter()
                .flat_map(|batch| &batch.records)
                .map(PublishRecord::size)
                .max(),
            Command::Create { .. }
            | Command::Join { .. }
            | Command::Leave { .. }
            | Command::Poll { .. }
            | Command::Ack { .. }
            | Command::AckAndPoll { .. }
            | Command::Retry { .. }
            | Command::RetryAfter { .. }
            | Command::Redeliver { .. }
            | Command::Fetch { .. }
            | Command::Commit { .. }
            | Command::Assignment { .. }
            | Command::Committed { .. }
            | Command::EndOffset { .. }
            | Command::Lag { .. }
            | Command::Describe { .. }
            | Command::AddPartitions { .. }
            | Command::DeleteTopic { .. }
            | Command::DeleteGroup { .. }
            | Command::ConfigureGroup { .. }
            | Command::ConfigureTopic { .. }
            | Command::Purge { .. }
            | Command::ResetGroup { .. }
            | Command::OffsetForTime { .. }
            | Command::ClusterStatus
            | Command::GroupsStatus
            | Command::KafkaGroups
            | Command::AddNode { .. }
            | Command::RemoveNode { .. }
            | Command::TransferLeadership { .. }
            | Command::MoveTopic { .. }
            | Command::Metadata { .. }
            | Command::Read { .. }
            | Command::CommitGroup { .. }
            | Command::Producers { .. }
            | Command::StoredOffsets { .. }
            | Command::DeleteOffsets { .. } => None,
        }
    }

    /// The records the command publishes, in order, each as the parts it is stored with (key,
    /// payload, headers): a storage layer that keeps each stored record in one place only may
    /// take them out of a command it logs ([`RecordParts::take`]) and put them back before it
    /// replays it ([`RecordParts::put`]). Empty for a command that publishes nothing.
    pub fn published_records_mut(&mut self) -> Vec<RecordParts<'_>> {
        fn of(record: &mut PublishRecord) -> RecordParts<'_> {
            RecordParts {
                key: Some(&mut record.key),
                payload: &mut record.payload,
                headers: Some(&mut record.headers),
            }
        }
        match self {
            Command::Publish { payload, .. } => vec![RecordParts {
                key: None,
                payload,
                headers: None,
            }],
            Command::PublishKeyed { key, payload, .. } => vec![RecordParts {
                key: Some(key),
                payload,
                headers: None,
            }],
            Command::PublishBatch { records, .. } | Command::PublishUntilFull { records, .. } => {
                records.iter_mut().map(of).collect()
            }
            Command::PublishIdempotent { batches, .. } => batches
                .iter_mut()
                .flat_map(|batch| &mut batch.records)
                .map(of)
                .collect(),
            Command::Create { .. }
            | Command::Join { .. }
            | Command::Leave { .. }
            | Command::Poll { .. }
            | Command::Ack { .. }
            | Command::AckAndPoll { .. }
            | Command::Retry { .. }
            | Command::RetryAfter { .. }
            | Command::Redeliver { .. }
            | Command::Fetch { .. }
            | Command::Commit { .. }
            | Command::Assignment { .. }
            | Command::Committed { .. }
            | Command::EndOffset { .. }
            | Command::Lag { .. }
            | Command::Describe { .. }
            | Command::AddPartitions { .. }
            | Command::DeleteTopic { .. }
            | Command::DeleteGroup { .. }
            | Command::ConfigureGroup { .. }
            | Command::ConfigureTopic { .. }
            | Command::Purge { .. }
            | Command::ResetGroup { .. }
            | Command::OffsetForTime { .. }
            | Command::ClusterStatus
            | Command::GroupsStatus
            | Command::KafkaGroups
            | Command::AddNode { .. }
            | Command::RemoveNode { .. }
            | Command::TransferLeadership { .. }
            | Command::MoveTopic { .. }
            | Command::Metadata { .. }
            | Command::Read { .. }
            | Command::CommitGroup { .. }
            | Command::Producers { .. }
            | Command::StoredOffsets { .. }
            | Command::DeleteOffsets { .. } => Vec::new(),
        }
    }

    /// Where each record the command publishes (in [`Command::published_records_mut`]'s order)
    /// went, by the command's `outcome`: its partition and offset, the offset `-1` when it was
    /// not stored. The offset of a record an idempotent producer sent again is the one it was
    /// stored at the first time. `None` when the outcome is not a publish's.
    pub fn placements(&self, outcome: &Outcome) -> Option<Vec<(i32, i64)>> {
        match (self, outcome) {
            (Command::Publish { partition, .. }, Outcome::Published(offset)) => {
                Some(vec![(*partition, *offset)])
            }
            (Command::PublishKeyed { .. }, Outcome::PublishedKeyed { partition, offset }) => {
                Some(vec![(*partition, *offset)])
            }
            (
                Command::PublishBatch { .. }
                | Command::PublishUntilFull { .. }
                | Command::PublishIdempotent { .. },
                Outcome::PublishedBatch(placed),
            ) => Some(placed.clone()),
            _ => None,
        }
    }

    /// For a command whose answer carries records: the most records it asks for, its topic's
    /// name (each record carries it) and its byte budget, which a server lowers so that the
    /// answer fits in one frame.
    pub fn answer_budget(&mut self) -> Option<AnswerBudget<'_>> {
        match self {
            Command::Poll {
                topic,
                max_records,
                max_bytes,
                ..
            }
            | Command::Fetch {
                topic,
                max_records,
                max_bytes,
                ..
            }
            | Command::AckAndPoll {
                topic,
                max_records,
                max_bytes,
                ..
            }
            | Command::Redeliver {
                topic,
                max_records,
                max_bytes,
                ..
            }
            | Command::Read {
                topic,
                max_records,
                max_bytes,
                ..
            } => Some(AnswerBudget {
                topic,
                max_records: *max_records,
                max_bytes,
            }),
            Command::Create { .. }
            | Command::Join { .. }
            | Command::Leave { .. }
            | Command::Publish { .. }
            | Command::PublishKeyed { .. }
            | Command::PublishBatch { .. }
            | Command::PublishUntilFull { .. }
            | Command::Ack { .. }
            | Command::Retry { .. }
            | Command::RetryAfter { .. }
            | Command::Commit { .. }
            | Command::Assignment { .. }
            | Command::Committed { .. }
            | Command::EndOffset { .. }
            | Command::Lag { .. }
            | Command::Describe { .. }
            | Command::AddPartitions { .. }
            | Command::DeleteTopic { .. }
            | Command::DeleteGroup { .. }
            | Command::ConfigureGroup { .. }
            | Command::ConfigureTopic { .. }
            | Command::Purge { .. }
            | Command::ResetGroup { .. }
            | Command::OffsetForTime { .. }
            | Command::ClusterStatus
            | Command::GroupsStatus
            | Command::KafkaGroups
            | Command::AddNode { .. }
            | Command::RemoveNode { .. }
            | Command::TransferLeadership { .. }
            | Command::MoveTopic { .. }
            | Command::Metadata { .. }
            | Command::CommitGroup { .. }
            | Command::PublishIdempotent { .. }
            | Command::Producers { .. }
            | Command::StoredOffsets { .. }
            | Command::DeleteOffsets { .. } => None,
        }
    }
}

/// What bounds the records of one answer; see [`Command::answer_budget`].
#[derive(Debug)]
pub struct AnswerBudget<'a> {
    /// The topic the records come from.
    pub topic: &'a str,
    /// The most records asked for (as the request gave it, not yet validated).
    pub max_records: i32,
    /// The byte budget of payloads and keys, to lower as needed.
    pub max_bytes: &'a mut Option<u64>,
}

/// What a successfully applied [`Command`] returned, one variant per kind of result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoStaticStr, EnumDiscriminants)]
#[strum_discriminants(name(OutcomeKind), derive(Hash, EnumIter, IntoStaticStr))]
#[strum_discriminants(doc = "An [`Outcome`] without its values: what kind of result it is.")]
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
    /// `committed`, `end_offset`, `offset_for_time` and `purge`: an offset.
    Offset(i64),
    /// `lag` and `reset_group`: one row per partition, ascending.
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
    /// `delete_topic` and `delete_group`: `true` if it existed and is gone.
    Deleted(bool),
    /// `add_partitions`: the topic's partition count now.
    PartitionCount(i32),
    /// `configure_group`: the group's settings now.
    GroupSettings(Vec<GroupSetting>),
    /// [`Command::ClusterStatus`]: what the node asked knows of its cluster.
    ClusterStatus(ClusterStatus),
    /// [`Command::AddNode`] and [`Command::RemoveNode`]: the cluster's members now.
    Members(Vec<ClusterMember>),
    /// [`Command::Metadata`]: the nodes and the node serving each topic.
    Metadata(BrokerMetadata),
    /// [`Command::Read`]: the records read and the partition's bounds.
    Read(PartitionRead),
    /// [`Command::ConfigureTopic`]: the topic's settings now, as
    /// [`crate::TopicSettings::to_list`] gives them.
    TopicSettings(Vec<TopicSetting>),
    /// [`Command::GroupsStatus`]: each group the node asked hosts, by ascending id.
    GroupsStatus(Vec<GroupStatus>),
    /// [`Command::Producers`]: the idempotent producers the partition remembers, by ascending
    /// id.
    Producers(Vec<ProducerState>),
    /// [`Command::StoredOffsets`]: by partition, the offset the group stored there, if it did.
    StoredOffsets(Vec<Option<i64>>),
    /// [`Command::KafkaGroups`]: the groups of Kafka's clients, sorted by name.
    KafkaGroups(Vec<KafkaGroupDescription>),
}

/// How many records an [`Outcome`] stored, handed out, acknowledged or released: what a server
/// counts for its metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecordCounts {
    /// Records stored by a publish (a refused `-1` is not counted).
    pub published: u64,
    /// Records a publish refused (`-1`: a full partition, the memory budget, a byte limit).
    pub refused: u64,
    /// Records handed to a consumer by a poll, fetch or redelivery.
    pub delivered: u64,
    /// Deliveries acknowledged.
    pub acknowledged: u64,
    /// Deliveries released for redelivery by a retry.
    pub retried: u64,
}

impl Outcome {
    /// How many records this outcome stored, handed out, acknowledged or released.
    pub fn record_counts(&self) -> RecordCounts {
        let stored = |offset: i64| u64::from(offset >= 0);
        match self {
            Outcome::Published(offset) | Outcome::PublishedKeyed { offset, .. } => RecordCounts {
                published: stored(*offset),
                refused: 1 - stored(*offset),
                ..RecordCounts::default()
            },
            Outcome::PublishedBatch(placed) => {
                let published = placed.iter().map(|&(_, offset)| stored(offset)).sum();
                RecordCounts {
                    published,
                    refused: placed.len() as u64 - published,
                    ..RecordCounts::default()
                }
            }
            Outcome::Records(records) | Outcome::Read(PartitionRead { records, .. }) => {
                RecordCounts {
                    delivered: records.len() as u64,
                    ..RecordCounts::default()
                }
            }
            Outcome::AckedAndPolled { acked, records } => RecordCounts {
                delivered: records.len() as u64,
                acknowledged: acked.iter().filter(|&&matched| matched).count() as u64,
                ..RecordCounts::default()
            },
            Outcome::Acked(matched) => RecordCounts {
                acknowledged: u64::from(*matched),
                ..RecordCounts::default()
            },
            Outcome::Retried(matched) => RecordCounts {
                retried: u64::from(*matched),
                ..RecordCounts::default()
            },
            Outcome::Created(_)
            | Outcome::Partitions(_)
            | Outcome::Left(_)
            | Outcome::Committed
            | Outcome::Offset(_)
            | Outcome::Lag(_)
            | Outcome::Description(_)
            | Outcome::Deleted(_)
            | Outcome::PartitionCount(_)
            | Outcome::GroupSettings(_)
            | Outcome::TopicSettings(_)
            | Outcome::ClusterStatus(_)
            | Outcome::GroupsStatus(_)
            | Outcome::KafkaGroups(_)
            | Outcome::Producers(_)
            | Outcome::StoredOffsets(_)
            | Outcome::Members(_)
            | Outcome::Metadata(_) => RecordCounts::default(),
        }
    }

    /// The outcome's name, as in [`Outcome`] (`"Records"`).
    pub fn name(&self) -> &'static str {
        self.into()
    }

    /// The records the outcome delivers, for the outcomes that deliver records (an empty slice
    /// when it delivered none); `None` for the others.
    pub fn records(&self) -> Option<&[BrokerRecord]> {
        match self {
            Outcome::Records(records)
            | Outcome::AckedAndPolled { records, .. }
            | Outcome::Read(PartitionRead { records, .. }) => Some(records),
            Outcome::Created(_)
            | Outcome::Partitions(_)
            | Outcome::Left(_)
            | Outcome::Published(_)
            | Outcome::PublishedKeyed { .. }
            | Outcome::Acked(_)
            | Outcome::Retried(_)
            | Outcome::Committed
            | Outcome::Offset(_)
            | Outcome::Lag(_)
            | Outcome::Description(_)
            | Outcome::PublishedBatch(_)
            | Outcome::Deleted(_)
            | Outcome::PartitionCount(_)
            | Outcome::GroupSettings(_)
            | Outcome::TopicSettings(_)
            | Outcome::ClusterStatus(_)
            | Outcome::GroupsStatus(_)
            | Outcome::KafkaGroups(_)
            | Outcome::Producers(_)
            | Outcome::StoredOffsets(_)
            | Outcome::Members(_)
            | Outcome::Metadata(_) => None,
        }
    }

    /// Whether the outcome delivers records and delivered none: the answer of a request that
    /// may wait for records instead.
    pub fn found_no_records(&self) -> bool {
        self.records().is_some_and(<[BrokerRecord]>::is_empty)
    }

    /// The answer of a request that waited: the outcome it had before it waited, with the
    /// records its retry found (`retried`, the retry's outcome) in place of the records it
    /// delivers. A read answers what its retry found, with the partition's bounds then.
    /// Outcomes that deliver no records are returned as they are.
    pub fn after_wait(self, retried: Outcome) -> Outcome {
        if let Outcome::Read(_) = self {
            return retried;
        }
        let records = retried.into_records().unwrap_or_default();
        match self {
            Outcome::Records(_) => Outcome::Records(records),
            Outcome::AckedAndPolled { acked, .. } => Outcome::AckedAndPolled { acked, records },
            unchanged @ (Outcome::Created(_)
            | Outcome::Partitions(_)
            | Outcome::Left(_)
            | Outcome::Published(_)
            | Outcome::PublishedKeyed { .. }
            | Outcome::Acked(_)
            | Outcome::Retried(_)
            | Outcome::Committed
            | Outcome::Offset(_)
            | Outcome::Lag(_)
            | Outcome::Description(_)
            | Outcome::PublishedBatch(_)
            | Outcome::Deleted(_)
            | Outcome::PartitionCount(_)
            | Outcome::GroupSettings(_)
            | Outcome::TopicSettings(_)
            | Outcome::ClusterStatus(_)
            | Outcome::GroupsStatus(_)
            | Outcome::KafkaGroups(_)
            | Outcome::Producers(_)
            | Outcome::StoredOffsets(_)
            | Outcome::Members(_)
            | Outcome::Metadata(_)
            | Outcome::Read(_)) => unchanged,
        }
    }

    /// The records the outcome delivers, taken out of it; `None` for outcomes that deliver
    /// none.
    fn into_records(self) -> Option<Vec<BrokerRecord>> {
        match self {
            Outcome::Records(records)
            | Outcome::AckedAndPolled { records, .. }
            | Outcome::Read(PartitionRead { records, .. }) => Some(records),
            _ => None,
        }
    }
}

/// The stored parts of one record a command publishes (see
/// [`Command::published_records_mut`]); a command whose records have no key or no headers
/// gives `None` for them.
#[derive(Debug)]
pub struct RecordParts<'a> {
    key: Option<&'a mut Option<Bytes>>,
    payload: &'a mut Bytes,
    headers: Option<&'a mut Vec<Header>>,
}

impl RecordParts<'_> {
    /// Empties the record's key, payload and headers in the command.
    pub fn take(&mut self) {
        if let Some(key) = &mut self.key {
            **key = None;
        }
        *self.payload = Bytes::new();
        if let Some(headers) = &mut self.headers {
            headers.clear();
        }
    }

    /// Puts `record`'s key, payload and headers back into the command; `false` (changing
    /// nothing) when the command's record cannot have them (a key or headers where it has
    /// none).
    pub fn put(&mut self, record: RecordImage) -> bool {
        let RecordImage {
            key,
            payload,
            headers,
            ..
        } = record;
        if (self.key.is_none() && key.is_some()) || (self.headers.is_none() && !headers.is_empty())
        {
            return false;
        }
        if let Some(slot) = &mut self.key {
            **slot = key;
        }
        *self.payload = payload;
        if let Some(slot) = &mut self.headers {
            **slot = headers.into_iter().map(Header::from).collect();
        }
        true
    }
}
