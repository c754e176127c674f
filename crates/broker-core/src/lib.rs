//! The broker as a deterministic state machine: partitioned topics, consumer groups,
//! acknowledgements, retries, rebalancing and Kafka-style fetch and commit, with no I/O.
//!
//! [`EventBroker`] is the thread-safe face: share it through an `Arc`, call it from any thread,
//! and every call takes effect atomically (the calls are linearizable). Underneath,
//! [`BrokerState`] holds the rules and [`Command`] / [`Outcome`] describe every call as a value,
//! so a server can apply decoded requests and a log can replay them through the same code.
//!
//! ```
//! use broker_core::{BrokerRecord, EventBroker};
//!
//! let broker = EventBroker::new(2)?;
//! assert!(broker.create("orders", 1)?);
//! assert_eq!(broker.publish("orders", 0, "a")?, 0);
//! assert_eq!(broker.join("orders", "billing", "m1")?, vec![0]);
//! let records = broker.poll("orders", "billing", "m1", 2)?;
//! assert_eq!(records[0].payload, "a");
//! assert!(broker.ack("orders", "billing", "m1", 0, 0)?);
//! # Ok::<(), broker_core::BrokerError>(())
//! ```

mod byte_fields;
mod cluster;
pub mod cold;
mod command;
mod describe;
mod duration;
mod error;
pub mod hash;
pub mod image;
mod revision;
mod settings;
mod state;
mod types;
pub mod v1;
mod validate;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;

pub use cluster::{
    BrokerMetadata, ClusterMember, ClusterStatus, GroupStatus, NodeAddress, NodeRole,
    TopicPlacement,
};
pub use command::{
    AnswerBudget, Command, CommandKind, MemberName, Membership, Outcome, OutcomeKind, RecordCounts,
    RecordParts, Scope,
};
pub use describe::{
    BrokerDescription, GroupDescription, GroupPartitionDescription, KafkaGroupDescription,
    KafkaMemberDescription, MemberDescription, PartitionDescription, TopicDescription,
    TopicPartitions,
};
pub use duration::{duration_text, parse_duration, DurationError, MAX_DURATION};
pub use error::BrokerError;
pub use revision::{Revision, HEADER_WIRE_BYTES, RECORD_OVERHEAD_BYTES};
pub use settings::{
    Discard, GroupSetting, GroupSettings, Retention, StartAt, TopicName, TopicSetting,
    TopicSettings,
};
pub use state::{
    BrokerState, ColdReads, DeadLetterReason, DeadLettered, Limits, PendingRead, ReadAhead,
    ReadAheadAt, TopicExport, DEAD_LETTER_HEADER_BYTES, MAX_PRODUCERS, RECENT_BATCHES,
};
/// Iterating over every [`CommandKind`] (`CommandKind::iter()`).
pub use strum::IntoEnumIterator;
pub use types::{
    Assignor, BrokerRecord, Header, KeyHash, PartitionBatch, PartitionLag, PartitionRead,
    ProducerState, PublishRecord, ResetTo,
};
pub use validate::{
    check_headers, companions_of, NameRules, MAX_ACKS, MAX_BATCH_RECORDS, MAX_CAPACITY,
    MAX_FETCH_RECORDS, MAX_HEADERS, MAX_HEADER_NAME_LEN, MAX_IDENTIFIER_LEN, MAX_KAFKA_NAME_LEN,
    MAX_MOVE_BYTES, MAX_PARTITIONS, MAX_PARTITIONS_LIMIT, MAX_POLL_RECORDS, MAX_PRODUCT_CAPACITY,
};

/// A bounded in-memory broker shared by many threads.
///
/// Every method takes `&self` and is atomic: it locks the whole state once, applies the call and
/// releases the lock, so concurrent calls behave as if run one at a time in some order that
/// respects each thread's program order. No method waits for a record, a member or capacity;
/// they only wait for the lock. A `std::sync::Mutex` (not an async one) is right here because
/// the critical sections are short, never block on I/O, and never span an `.await`.
///
/// Errors are [`BrokerError`]s and mean the call changed nothing.
#[derive(Debug)]
pub struct EventBroker {
    state: Mutex<BrokerState>,
}

impl EventBroker {
    /// An empty broker whose partitions each retain at most `capacity_per_partition` records.
    ///
    /// # Errors
    /// `InvalidArgument` unless the capacity is 1 to 1,000.
    pub fn new(capacity_per_partition: i32) -> Result<EventBroker, BrokerError> {
        Ok(Self::from_state(BrokerState::with_contract_capacity(
            capacity_per_partition,
        )?))
    }

    /// A broker serving an existing state (for example one rebuilt from a log).
    pub fn from_state(state: BrokerState) -> EventBroker {
        EventBroker {
            state: Mutex::new(state),
        }
    }

    /// Runs `f` with the state locked: one lock acquisition for any number of commands, as a
    /// server applying a batch of pipelined requests wants. Never call back into `self` from `f`.
    pub fn with_state<R>(&self, f: impl FnOnce(&mut BrokerState) -> R) -> R {
        f(&mut self.lock())
    }

    /// Applies one [`Command`] atomically.
    ///
    /// # Errors
    /// As the method the command names.
    pub fn apply(&self, command: Command) -> Result<Outcome, BrokerError> {
        self.lock().apply(command)
    }

    fn lock(&self) -> MutexGuard<'_, BrokerState> {
        // Every state method validates before it mutates and has no panicking path on any
        // input, so a poisoned lock can only follow a bug elsewhere in the panicking thread; the
        // state itself is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates `topic` with `partition_count` empty partitions and the default key hash
    /// (Kafka's murmur2). Returns `false`, keeping the existing topic, on a duplicate.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier or a partition count outside 1 to 64.
    pub fn create(&self, topic: &str, partition_count: i32) -> Result<bool, BrokerError> {
        self.create_with(topic, partition_count, KeyHash::default())
    }

    /// [`EventBroker::create`] with a chosen key hash for keyed publishes.
    ///
    /// # Errors
    /// As [`EventBroker::create`].
    pub fn create_with(
        &self,
        topic: &str,
        partition_count: i32,
        key_hash: KeyHash,
    ) -> Result<bool, BrokerError> {
        self.lock().create(topic, partition_count, key_hash, &[])
    }

    /// [`EventBroker::create_with`] with how the topic's partitions retain records:
    /// [`TopicSettings`] as a list ([`TopicSettings::to_list`]). Interest retention (the
    /// default) keeps a record until every group consumed it, up to the broker's capacity per
    /// partition (or the topic's `max_records`), refusing records past it; limits retention keeps
    /// records up to the topic's limits, consumed or not, discarding the oldest (or refusing new
    /// ones) at a limit. Either may have a maximum age. A duplicate keeps the existing topic and
    /// its settings.
    ///
    /// # Errors
    /// As [`EventBroker::create`], and `InvalidArgument` for settings that make no sense
    /// ([`TopicSettings::check`]) or a setting given twice.
    pub fn create_topic(
        &self,
        topic: &str,
        partition_count: i32,
        key_hash: KeyHash,
        settings: &[TopicSetting],
    ) -> Result<bool, BrokerError> {
        self.lock()
            .create(topic, partition_count, key_hash, settings)
    }

    /// Gives `topic` `partition_count` partitions in all, adding empty ones (never fewer: a
    /// partition is never removed), and rebalances its groups; returns the count. Keys move: a
    /// key that hashed to one partition may hash to another now, as in Kafka, so order per key
    /// holds only among records published after the change.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic, or a count below the topic's or
    /// above the broker's limit.
    pub fn add_partitions(&self, topic: &str, partition_count: i32) -> Result<i32, BrokerError> {
        self.lock().add_partitions(topic, partition_count)
    }

    /// Deletes `topic`, its records and its groups; `false` if there was no such topic.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier.
    pub fn delete_topic(&self, topic: &str) -> Result<bool, BrokerError> {
        self.lock().delete_topic(topic)
    }

    /// Deletes `group` of `topic` and its committed offsets; `false` if there was no such group.
    /// With interest retention, the records it alone had not consumed leave.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic, or a group that still has
    /// members (they leave first, or their sessions time out).
    pub fn delete_group(&self, topic: &str, group: &str) -> Result<bool, BrokerError> {
        self.lock().delete_group(topic, group)
    }

    /// Removes the records of `partition` below `before` (up to the end), consumed or not, as
    /// Kafka's delete-records does; groups that had not consumed them skip them. Returns the
    /// partition's earliest retained offset now.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic, a partition it does not have, or a
    /// negative offset.
    pub fn purge(&self, topic: &str, partition: i32, before: i64) -> Result<i64, BrokerError> {
        self.lock().purge(topic, partition, before)
    }

    /// Moves `group`'s committed offsets on `partitions` (every partition with `None`) to
    /// `to`, all at once: its members' fetch positions follow and its deliveries in flight
    /// there are cancelled; members stay. A target outside the retained records is moved to
    /// the nearest end of them. Returns the group's new progress on each partition reset.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic or group, a partition the
    /// topic does not have or named twice, or a negative offset.
    pub fn reset_group(
        &self,
        topic: &str,
        group: &str,
        partitions: Option<&[i32]>,
        to: ResetTo,
    ) -> Result<Vec<PartitionLag>, BrokerError> {
        self.lock().reset_group(topic, group, partitions, to)
    }

    /// Deletes `group`'s stored offsets on `partitions`, as Kafka's OffsetDelete does: each goes
    /// back to where the group starts (its earliest retained record, or the end for a group
    /// that starts at the end), stored no more ([`EventBroker::stored_offsets`] answers `None`
    /// there), as on a partition the group never committed on. Returns the group's new progress
    /// on each partition. The group and its offsets elsewhere stay (deleting the group deletes
    /// them all).
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic or group, a group with
    /// members (they commit its offsets), or a partition the topic does not have or named
    /// twice.
    pub fn delete_offsets(
        &self,
        topic: &str,
        group: &str,
        partitions: &[i32],
    ) -> Result<Vec<PartitionLag>, BrokerError> {
        self.lock().delete_offsets(topic, group, partitions)
    }

    /// The first offset of `partition` whose record's time is at or after `timestamp_ms`
    /// (milliseconds since the Unix epoch): where a consumer replaying from that time starts.
    /// The end offset when every retained record is older.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic or a partition it does not have.
    pub fn offset_for_time(
        &self,
        topic: &str,
        partition: i32,
        timestamp_ms: i64,
    ) -> Result<i64, BrokerError> {
        self.lock().offset_for_time(topic, partition, timestamp_ms)
    }

    /// Stores `group`'s committed offsets on the partitions of `offsets` (partition, offset),
    /// from outside the group's members: for a group whose consumers keep their own assignment
    /// and offsets, as Kafka's consumer groups do. A group that does not exist is created, with
    /// no members (round-robin, from the earliest record), so that its offsets count for
    /// interest retention and `lag` and `describe` show them. An offset outside the retained
    /// records is moved to the nearest end of them; the group's fetch positions follow.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic, a partition it does not
    /// have or named twice, a negative offset, a group that has members of its own (they
    /// commit its offsets), or a new group past the topic's maximum of groups.
    pub fn commit_group(
        &self,
        topic: &str,
        group: &str,
        offsets: &[(i32, i64)],
    ) -> Result<(), BrokerError> {
        self.lock().commit_group(topic, group, offsets)
    }

    /// Up to `max_records` records of `partition` from `offset`, without a group: a replay
    /// (what a Kafka consumer's fetch does) that changes nothing and is seen by no group.
    /// Records below the partition's earliest retained offset have left, so a read below it
    /// starts there; the answer gives the partition's start and end offsets, so the caller can
    /// tell. Once `max_bytes` of payload, key and header bytes are taken no more records are
    /// added (the first always is). An empty answer at the end offset means no record is there
    /// yet.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic, a partition it does not have, a
    /// negative offset or one past the partition's end, or `max_records` outside 1 to
    /// [`MAX_FETCH_RECORDS`]; [`BrokerError::Storage`] if records on disk cannot be read.
    pub fn read(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<PartitionRead, BrokerError> {
        self.lock()
            .read(topic, partition, offset, max_records, max_bytes)
    }

    /// Publishes each of `batches` to its partition for `producer`, in one atomic call,
    /// storing each record at most once however often it is sent. A batch's records are
    /// numbered from its `sequence`: those whose numbers were already stored are answered with
    /// the offsets they got then (from the producer's last [`RECENT_BATCHES`] batches on the
    /// partition), the others are appended in order as [`EventBroker::publish_batch`] would,
    /// and after one is refused (`-1`, a full partition) the rest of its batch are refused too,
    /// so that the numbers stay consecutive. Returns each record's partition and offset, batch
    /// after batch, in order. A producer chooses a random `producer` id, numbers each
    /// partition's records from 0, and sends a partition's batches in order (retrying a batch
    /// whole, or its refused rest with the numbers they had). A topic remembers at most
    /// [`MAX_PRODUCERS`] producers, forgetting the one that published least recently.
    ///
    /// # Errors
    /// As [`EventBroker::publish_batch`] (for all the records together), and
    /// `InvalidArgument` for a partition named twice, a record naming another partition than
    /// its batch's, a `sequence` past the producer's next one on its partition (records
    /// before it were never stored), or one repeated from longer ago than its last batches;
    /// nothing is published then.
    pub fn publish_idempotent(
        &self,
        topic: &str,
        producer: u64,
        batches: Vec<PartitionBatch>,
    ) -> Result<Vec<(i32, i64)>, BrokerError> {
        self.lock().publish_idempotent(topic, producer, batches)
    }

    /// The idempotent producers `partition` of `topic` remembers (see
    /// [`EventBroker::publish_idempotent`]), by ascending id: at most [`MAX_PRODUCERS`].
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic or a partition it does not have.
    pub fn producers(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Vec<ProducerState>, BrokerError> {
        self.lock().producers(topic, partition)
    }

    /// Moves the broker's clock to `now_ms` (milliseconds since the Unix epoch) if that is later
    /// than it, and applies what the passing of time does: records older than their topic's
    /// maximum age leave, and deliveries older than their group's acknowledgement timeout are
    /// released. The broker reads no clock itself; records are stamped with this clock (0 until
    /// it is set). Returns the topics where something changed.
    ///
    /// # Errors
    /// `Storage` if records held on disk cannot be read (never for a broker in memory).
    pub fn advance_clock(&self, now_ms: i64) -> Result<Vec<String>, BrokerError> {
        self.lock().advance_clock(now_ms)
    }

    /// Adds `member` to `group` (creating the group, round-robin, if absent), rebalances if the
    /// membership changed, and returns the member's partitions in ascending order. A repeated
    /// join changes nothing.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier or an unknown topic.
    pub fn join(&self, topic: &str, group: &str, member: &str) -> Result<Vec<i32>, BrokerError> {
        self.lock().join(topic, group, member, None, &[])
    }

    /// [`EventBroker::join`] naming the group's assignor: a new group uses it, an existing
    /// group must already use it.
    ///
    /// # Errors
    /// As [`EventBroker::join`], and `InvalidArgument` if the group uses another assignor.
    pub fn join_with(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        assignor: Assignor,
    ) -> Result<Vec<i32>, BrokerError> {
        self.lock().join(topic, group, member, Some(assignor), &[])
    }

    /// [`EventBroker::join_with`] (or [`EventBroker::join`], with no assignor) with the settings
    /// a new group gets ([`GroupSettings`] as a list): where it starts and how long a delivery
    /// may stay unacknowledged. An existing group must already have these settings; an empty
    /// list accepts the group's own.
    ///
    /// # Errors
    /// As [`EventBroker::join_with`], and `InvalidArgument` for settings given twice, an
    /// acknowledgement timeout of 0, or settings other than the existing group's.
    pub fn join_group(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        assignor: Option<Assignor>,
        settings: &[GroupSetting],
    ) -> Result<Vec<i32>, BrokerError> {
        self.lock().join(topic, group, member, assignor, settings)
    }

    /// Removes `member` and rebalances; `false` when the group or member is absent. Partitions
    /// that change owner lose their in-flight delivery and keep their committed offset; the group
    /// remains after its last member leaves.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier or an unknown topic.
    pub fn leave(&self, topic: &str, group: &str, member: &str) -> Result<bool, BrokerError> {
        self.lock().leave(topic, group, member)
    }

    /// Appends `payload` to `partition` and returns its offset, or `-1` when the partition is
    /// full (no offset is consumed). Empty payloads are valid.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic or a partition it does not have.
    pub fn publish(
        &self,
        topic: &str,
        partition: i32,
        payload: impl Into<Bytes>,
    ) -> Result<i64, BrokerError> {
        let payload = payload.into();
        self.lock().publish(topic, partition, payload)
    }

    /// Publishes by key: `(murmur2(key) & 0x7fffffff) % partitions` (or the topic's FNV-1a),
    /// the partition Kafka's Java client picks; without a key, the next partition in round-robin
    /// order. Returns the partition and the offset (`-1` when that partition is full).
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic.
    pub fn publish_keyed(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: impl Into<Bytes>,
    ) -> Result<(i32, i64), BrokerError> {
        let key = key.map(Bytes::copy_from_slice);
        let payload = payload.into();
        self.lock().publish_keyed(topic, key, payload)
    }

    /// Publishes many records in one atomic call, each as [`EventBroker::publish`] (explicit
    /// partition) or [`EventBroker::publish_keyed`] (key or round-robin) would, in order.
    /// Returns each record's partition and offset, `-1` where the partition was full.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic, more than [`MAX_BATCH_RECORDS`]
    /// records, or an explicit partition the topic does not have; nothing is published then.
    pub fn publish_batch(
        &self,
        topic: &str,
        records: Vec<PublishRecord>,
    ) -> Result<Vec<(i32, i64)>, BrokerError> {
        self.lock().publish_batch(topic, records)
    }

    /// [`EventBroker::publish_batch`], except that once a partition refuses one of the records
    /// (it is full), the records after it for that partition are refused too, without trying
    /// them: each partition stores a prefix of its records, in order, with no gap where one was
    /// refused. Sending the refused ones again later, in order, keeps the partition's order.
    /// Returns each record's partition and offset, `-1` where it was refused.
    ///
    /// # Errors
    /// As [`EventBroker::publish_batch`]; nothing is published then.
    pub fn publish_until_full(
        &self,
        topic: &str,
        records: Vec<PublishRecord>,
    ) -> Result<Vec<(i32, i64)>, BrokerError> {
        self.lock().publish_until_full(topic, records)
    }

    /// Reserves, from each of the member's partitions with nothing in flight, the record after
    /// the group's committed offset, in ascending partition order, up to `max_records`. Each
    /// reserved record stays in flight until acknowledged or retried. `[]` for an absent group
    /// or member, or when nothing is eligible.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic or `max_records` outside
    /// 1 to 64.
    pub fn poll(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
    ) -> Result<Vec<BrokerRecord>, BrokerError> {
        self.poll_limited(topic, group, member, max_records, None)
    }

    /// [`EventBroker::poll`] that also stops once `max_bytes` of payload and key bytes are
    /// taken (the first record is always taken).
    ///
    /// # Errors
    /// As [`EventBroker::poll`].
    pub fn poll_limited(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<Vec<BrokerRecord>, BrokerError> {
        self.lock()
            .poll(topic, group, member, max_records, max_bytes)
    }

    /// Acknowledges the exact in-flight delivery: the group's committed offset on `partition`
    /// becomes `offset + 1`, and records every group of the topic has consumed leave memory.
    /// `false`, changing nothing, when the member does not own the partition or `offset` is not
    /// the delivery in flight there.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic, a partition the topic does
    /// not have or a negative offset.
    pub fn ack(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        partition: i32,
        offset: i64,
    ) -> Result<bool, BrokerError> {
        self.lock().ack(topic, group, member, partition, offset)
    }

    /// Acknowledges `acks` (partition, offset) in order, as [`EventBroker::ack`] each, then
    /// polls as [`EventBroker::poll`], all in one atomic step: the records a consumer took in its
    /// last round are settled and the next round taken in one call (one round trip over the
    /// network). Returns whether each acknowledgement matched, in `acks` order, and the records.
    ///
    /// # Errors
    /// Anything [`EventBroker::ack`] refuses for one of `acks` or [`EventBroker::poll`] refuses,
    /// or more than [`MAX_ACKS`] acknowledgements; nothing is acknowledged then.
    pub fn ack_and_poll(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        acks: &[(i32, i64)],
        max_records: i32,
    ) -> Result<(Vec<bool>, Vec<BrokerRecord>), BrokerError> {
        self.lock()
            .ack_and_poll(topic, group, member, acks, max_records, None)
    }

    /// Clears the exact in-flight delivery without committing it, so the next poll delivers the
    /// same record again. `false`, changing nothing, on any mismatch.
    ///
    /// # Errors
    /// As [`EventBroker::ack`].
    pub fn retry(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        partition: i32,
        offset: i64,
    ) -> Result<bool, BrokerError> {
        self.lock().retry(topic, group, member, partition, offset)
    }

    /// Releases every delivery in flight to `member` and polls again, atomically: the way to get
    /// back records whose poll answer was lost (a connection reset, a client timeout). The
    /// released records are the next records of their partitions, so they come first, each
    /// delivered anew (but for one that had its group's last delivery, which goes to the
    /// group's dead-letter topic); other partitions are polled as [`EventBroker::poll`] would.
    /// `[]` for an absent group or member, or when nothing is in flight or eligible.
    ///
    /// # Errors
    /// As [`EventBroker::poll`].
    pub fn redeliver(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
    ) -> Result<Vec<BrokerRecord>, BrokerError> {
        self.lock()
            .redeliver(topic, group, member, max_records, None)
    }

    /// Returns up to `max_records` records from the member's partitions, ascending by partition
    /// then offset, starting at the member's fetch positions and advancing them. Commits
    /// nothing. Positions start at the group's committed offsets and are reset to them on every
    /// rebalance. `[]` for an absent group or member.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic, or `max_records` outside
    /// 1 to [`MAX_FETCH_RECORDS`].
    pub fn fetch(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
    ) -> Result<Vec<BrokerRecord>, BrokerError> {
        self.fetch_limited(topic, group, member, max_records, None)
    }

    /// [`EventBroker::fetch`] that also stops once `max_bytes` of payload and key bytes are
    /// taken (the first record is always taken).
    ///
    /// # Errors
    /// As [`EventBroker::fetch`].
    pub fn fetch_limited(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<Vec<BrokerRecord>, BrokerError> {
        self.lock()
            .fetch(topic, group, member, max_records, max_bytes)
    }

    /// Stores the group's committed offsets: the member's fetch positions on all its partitions
    /// (`None`; a non-member stores nothing), or exactly `offsets`. All or nothing. Committed
    /// offsets belong to the group and free records for shared retention like acknowledgements.
    /// An explicit commit does not move the member's fetch positions. A commit that changes a
    /// partition's committed offset cancels that partition's in-flight `poll` delivery (it was
    /// delivered from the old offset); records below every group's committed offset, including
    /// ones published later, leave memory at once.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic, a partition the topic
    /// does not have or a negative offset; `NotAssigned` naming the first partition in `offsets`
    /// the member does not own.
    pub fn commit(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        offsets: Option<BTreeMap<i32, i64>>,
    ) -> Result<(), BrokerError> {
        self.lock().commit(topic, group, member, offsets.as_ref())
    }

    /// The member's partitions in ascending order; `[]` for an unknown group or member.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier or an unknown topic.
    pub fn assignment(
        &self,
        topic: &str,
        group: &str,
        member: &str,
    ) -> Result<Vec<i32>, BrokerError> {
        self.lock().assignment(topic, group, member)
    }

    /// The group's committed offset on `partition`: the next offset it will consume. A group
    /// that does not exist answers the partition's earliest retained offset.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic or a partition it does not
    /// have.
    pub fn committed(&self, topic: &str, group: &str, partition: i32) -> Result<i64, BrokerError> {
        self.lock().committed(topic, group, partition)
    }

    /// The group's committed offset on each partition of the topic, by partition, where the
    /// group stored one (a commit, an acknowledgement, a reset, or a record moved to its
    /// dead-letter topic), and `None` where it holds only where it started: the committed
    /// offsets as Kafka's OffsetFetch answers them. Every partition is `None` for a group that
    /// does not exist on the topic. [`EventBroker::committed`] gives the group's start there
    /// instead.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier or an unknown topic.
    pub fn stored_offsets(
        &self,
        topic: &str,
        group: &str,
    ) -> Result<Vec<Option<i64>>, BrokerError> {
        self.lock().stored_offsets(topic, group)
    }

    /// The offset the next record published to `partition` will get.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic or a partition it does not have.
    pub fn end_offset(&self, topic: &str, partition: i32) -> Result<i64, BrokerError> {
        self.lock().end_offset(topic, partition)
    }

    /// `end_offset - committed` for every partition of the topic, ascending (0 where the group
    /// committed past the end).
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier or an unknown topic.
    pub fn lag(&self, topic: &str, group: &str) -> Result<Vec<PartitionLag>, BrokerError> {
        self.lock().lag(topic, group)
    }

    /// A snapshot of every topic (partitions, offsets, retained bytes) and its groups
    /// (assignor, members, assignments, committed offsets, in-flight deliveries, lag).
    pub fn describe(&self) -> BrokerDescription {
        self.lock().describe_all()
    }
}

#[cfg(test)]
mod tests;
