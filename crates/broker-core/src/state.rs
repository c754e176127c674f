//! The broker's state and every rule that changes it.
//!
//! [`BrokerState`] is a plain, single-threaded value: each method validates its arguments
//! completely before it mutates anything, so a call that returns an error changes nothing.
//! [`crate::EventBroker`] wraps it in a mutex to make each call atomic.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::describe::{
    BrokerDescription, GroupDescription, GroupPartitionDescription, MemberDescription,
    PartitionDescription, TopicDescription,
};
use crate::validate::{
    check_acks_len, check_batch_len, check_capacity, check_fetch_max_records, check_identifier,
    check_offset, check_partition_count, check_poll_max_records,
};
use crate::{
    hash, Assignor, BrokerError, BrokerRecord, Command, KeyHash, Outcome, PartitionLag,
    PublishRecord,
};

/// The whole broker: its topics, their partition logs and their consumer groups.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BrokerState {
    capacity: usize,
    topics: HashMap<String, Topic>,
    memory: Memory,
    #[serde(default)]
    limits: Limits,
}

/// How many topics, groups and members the broker holds at most, so that no client can grow
/// its metadata (which the memory budget does not count) without bound. A call that would pass
/// a limit is refused with `InvalidArgument` and changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Topics in the broker.
    pub max_topics: usize,
    /// Consumer groups of one topic.
    pub max_groups_per_topic: usize,
    /// Members of one group.
    pub max_members_per_group: usize,
}

impl Default for Limits {
    /// 10,000 topics, 1,000 groups per topic, 1,000 members per group: far above seed 000's
    /// test sizes (32, 128, 64).
    fn default() -> Self {
        Limits {
            max_topics: 10_000,
            max_groups_per_topic: 1_000,
            max_members_per_group: 1_000,
        }
    }
}

/// Payload and key bytes retained across the broker, and the optional budget they must stay
/// within.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Memory {
    /// Past this many retained bytes, publishes answer "full" (`-1`); `None` for no budget.
    budget: Option<u64>,
    /// The sum of every partition's `retained_bytes`.
    retained: u64,
}

impl Memory {
    /// Whether a record of `size` bytes may be retained without exceeding the budget.
    fn fits(&self, size: u64) -> bool {
        self.budget
            .is_none_or(|budget| self.retained.saturating_add(size) <= budget)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Topic {
    key_hash: KeyHash,
    /// Where the next keyless publish goes; advances on every keyless publish, full or not.
    next_keyless: usize,
    partitions: Vec<PartitionLog>,
    groups: HashMap<String, Group>,
}

/// A bounded partition log holding offsets `base..base + records.len()`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct PartitionLog {
    base: i64,
    records: VecDeque<StoredRecord>,
    retained_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredRecord {
    #[serde(default, deserialize_with = "crate::byte_fields::optional_bytes")]
    key: Option<Bytes>,
    #[serde(deserialize_with = "crate::byte_fields::bytes")]
    payload: Bytes,
}

impl StoredRecord {
    fn size(&self) -> u64 {
        (self.payload.len() + self.key.as_ref().map_or(0, Bytes::len)) as u64
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Group {
    assignor: Assignor,
    /// Sorted by id, so an index into this vector is stable between membership changes.
    members: Vec<Member>,
    /// Indexed by partition number.
    partitions: Vec<GroupPartition>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Member {
    id: String,
    /// Ascending.
    partitions: Vec<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct GroupPartition {
    /// Index into [`Group::members`] of the owner; `None` when the group has no member for it.
    owner: Option<usize>,
    /// The next offset the group has yet to consume; every record below it is done.
    committed: i64,
    /// Where the owner's next `fetch` starts; reset to `committed` on every rebalance.
    position: i64,
    /// The offset `poll` delivered and that awaits `ack` or `retry`.
    in_flight: Option<i64>,
}

impl Group {
    /// [`BrokerState::check_consistency`] for one group of `topic`.
    fn check_consistency(&self, topic: &Topic) -> Result<(), String> {
        if self.partitions.len() != topic.partitions.len() {
            return Err("a state per partition expected".to_owned());
        }
        if !self.members.windows(2).all(|pair| pair[0].id < pair[1].id) {
            return Err("members not sorted by id".to_owned());
        }
        for (index, member) in self.members.iter().enumerate() {
            let owned = member.partitions.iter().all(|&partition| {
                usize::try_from(partition)
                    .ok()
                    .and_then(|partition| self.partitions.get(partition))
                    .is_some_and(|state| state.owner == Some(index))
            });
            if !owned || !member.partitions.windows(2).all(|pair| pair[0] < pair[1]) {
                return Err(format!("member {:?}: bad partitions", member.id));
            }
        }
        for (partition, state) in self.partitions.iter().enumerate() {
            let log = &topic.partitions[partition];
            let owner_ok = state.owner.is_none_or(|owner| {
                self.members
                    .get(owner)
                    .is_some_and(|member| member.partitions.contains(&(partition as i32)))
            });
            let in_flight_ok = state
                .in_flight
                .is_none_or(|offset| (log.base..log.end()).contains(&offset));
            // Offsets are never negative: lag and positions subtract them from log ends.
            let offsets_ok = state.committed >= 0 && state.position >= 0;
            if !owner_ok || !in_flight_ok || !offsets_ok {
                return Err(format!(
                    "partition {partition}: bad owner, delivery or offsets"
                ));
            }
        }
        Ok(())
    }
}

impl GroupPartition {
    /// Settles the delivery in flight, `offset`, as acknowledged: the group has consumed it.
    fn commit_delivery(&mut self, offset: i64) {
        self.in_flight = None;
        self.committed = offset + 1;
        self.position = self.position.max(offset + 1);
    }
}

impl PartitionLog {
    fn end(&self) -> i64 {
        self.base + self.records.len() as i64
    }

    /// The record at `offset`, which must be within `base..end()`.
    fn record(&self, offset: i64) -> &StoredRecord {
        &self.records[(offset - self.base) as usize]
    }

    /// The record at `offset` as delivered to a consumer of `topic`.
    fn deliver(&self, topic: &str, partition: usize, offset: i64) -> BrokerRecord {
        let stored = self.record(offset);
        BrokerRecord {
            topic: topic.to_owned(),
            partition: partition as i32,
            offset,
            key: stored.key.clone(),
            payload: stored.payload.clone(),
        }
    }

    /// Drops every record below `offset` (bounded by the end of the log); returns the bytes
    /// freed.
    fn trim_below(&mut self, offset: i64) -> u64 {
        let mut freed = 0;
        while self.base < offset {
            let Some(record) = self.records.pop_front() else {
                break;
            };
            self.retained_bytes -= record.size();
            freed += record.size();
            self.base += 1;
        }
        freed
    }
}

impl Topic {
    fn partition(&self, partition: i32) -> Result<usize, BrokerError> {
        if partition >= 0 && (partition as usize) < self.partitions.len() {
            Ok(partition as usize)
        } else {
            Err(BrokerError::invalid(format!(
                "partition {partition} does not exist: the topic has partitions 0 to {}",
                self.partitions.len() - 1
            )))
        }
    }

    /// Appends to a bounded partition log: the new offset, or `-1` when the log is at capacity
    /// or the record would take `memory` past its budget.
    /// A record that every group has already committed past (a group may commit offsets beyond
    /// the end) is consumed as soon as it exists, so it is released at once.
    fn append(
        &mut self,
        partition: usize,
        capacity: usize,
        memory: &mut Memory,
        record: StoredRecord,
    ) -> i64 {
        let log = &mut self.partitions[partition];
        if log.records.len() >= capacity || !memory.fits(record.size()) {
            return -1;
        }
        memory.retained += record.size();
        log.retained_bytes += record.size();
        log.records.push_back(record);
        let offset = log.end() - 1;
        if !self.groups.is_empty() {
            memory.retained -= self.release(partition);
        }
        offset
    }

    /// The partition a keyed publish goes to: the key's hash, or without a key the next
    /// partition in round-robin order (which this advances).
    fn partition_for_key(&mut self, key: Option<&Bytes>) -> usize {
        let count = self.partitions.len();
        match key {
            Some(key) => hash::partition_for(self.key_hash, key, count),
            None => {
                let partition = self.next_keyless % count;
                self.next_keyless = (partition + 1) % count;
                partition
            }
        }
    }

    /// Shared retention: drops the records of `partition` that every group has consumed, and
    /// returns the bytes freed. With no groups nothing is consumed, so nothing leaves.
    fn release(&mut self, partition: usize) -> u64 {
        let consumed_by_all = self
            .groups
            .values()
            .map(|group| group.partitions[partition].committed)
            .min();
        consumed_by_all.map_or(0, |offset| self.partitions[partition].trim_below(offset))
    }
}

impl Group {
    fn new(assignor: Assignor, partitions: &[PartitionLog]) -> Self {
        Group {
            assignor,
            members: Vec::new(),
            partitions: partitions
                .iter()
                .map(|log| GroupPartition {
                    owner: None,
                    committed: log.base,
                    position: log.base,
                    in_flight: None,
                })
                .collect(),
        }
    }

    fn member_index(&self, member: &str) -> Option<usize> {
        self.members
            .binary_search_by(|m| m.id.as_str().cmp(member))
            .ok()
    }

    fn owns(&self, member: usize, partition: usize) -> bool {
        self.partitions[partition].owner == Some(member)
    }

    /// Replaces the complete assignment after a membership change. `previous_owners` names each
    /// partition's owner before the change: a partition that changes hands loses its in-flight
    /// delivery. Every position restarts at the committed offset (an eager rebalance).
    fn rebalance(&mut self, previous_owners: &[Option<String>]) {
        let partition_count = self.partitions.len();
        let member_count = self.members.len();
        for member in &mut self.members {
            member.partitions.clear();
        }
        for (partition, state) in self.partitions.iter_mut().enumerate() {
            let owner = match (member_count, self.assignor) {
                (0, _) => None,
                (n, Assignor::RoundRobin) => Some(partition % n),
                (n, Assignor::Range) => Some(range_owner(partition, partition_count, n)),
            };
            let owner_id = owner.map(|index| self.members[index].id.as_str());
            if owner_id != previous_owners[partition].as_deref() {
                state.in_flight = None;
            }
            state.owner = owner;
            state.position = state.committed;
            if let Some(index) = owner {
                self.members[index].partitions.push(partition as i32);
            }
        }
    }

    fn owner_ids(&self) -> Vec<Option<String>> {
        self.partitions
            .iter()
            .map(|state| state.owner.map(|index| self.members[index].id.clone()))
            .collect()
    }
}

/// Kafka's range assignor for one topic: the first `partitions % members` members take
/// `partitions / members + 1` consecutive partitions, the rest `partitions / members`.
fn range_owner(partition: usize, partition_count: usize, member_count: usize) -> usize {
    let share = partition_count / member_count;
    let extra = partition_count % member_count;
    let boundary = extra * (share + 1);
    if partition < boundary {
        partition / (share + 1)
    } else {
        extra + (partition - boundary) / share
    }
}

impl BrokerState {
    /// An empty broker whose partitions each retain at most `capacity_per_partition` records.
    ///
    /// # Errors
    /// [`BrokerError::InvalidArgument`] unless the capacity is 1 to 1,000.
    pub fn new(capacity_per_partition: i32) -> Result<Self, BrokerError> {
        check_capacity(capacity_per_partition)?;
        Ok(BrokerState {
            capacity: capacity_per_partition as usize,
            topics: HashMap::new(),
            memory: Memory::default(),
            limits: Limits::default(),
        })
    }

    /// This state with other [`Limits`]. Topics, groups and members already present stay, even
    /// past lowered limits; only new ones are refused.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// This state with a memory budget: once the payload and key bytes retained across the
    /// whole broker would exceed `budget`, a publish answers `-1` (full), consuming no offset,
    /// as for a partition at capacity. `None` removes the budget.
    #[must_use]
    pub fn with_memory_budget(mut self, budget: Option<u64>) -> Self {
        self.set_memory_budget(budget);
        self
    }

    /// Sets or removes the memory budget (see [`BrokerState::with_memory_budget`]). Records
    /// already retained stay, even past a lowered budget; publishes are refused until enough
    /// of them are consumed.
    pub fn set_memory_budget(&mut self, budget: Option<u64>) {
        self.memory.budget = budget;
    }

    /// The memory budget in bytes, if there is one.
    pub fn memory_budget(&self) -> Option<u64> {
        self.memory.budget
    }

    /// Payload and key bytes retained across every partition of every topic: what the memory
    /// budget bounds.
    pub fn retained_bytes(&self) -> u64 {
        self.memory.retained
    }

    /// The payload and key bytes of the largest record retained anywhere (0 with none): a
    /// server must be able to deliver it, so its payload limit may not be below this.
    pub fn largest_retained_record(&self) -> u64 {
        self.topics
            .values()
            .flat_map(|topic| &topic.partitions)
            .flat_map(|log| &log.records)
            .map(StoredRecord::size)
            .max()
            .unwrap_or(0)
    }

    /// The per-partition capacity this broker was created with.
    pub fn capacity_per_partition(&self) -> i32 {
        self.capacity as i32
    }

    /// Checks the invariants every method relies on (the lengths and indexes that tie logs,
    /// groups and members together, and the byte accounting), for a state that did not come
    /// from this build's methods: one decoded from a snapshot. A state built by the methods
    /// always passes.
    ///
    /// # Errors
    /// A description of the first invariant broken.
    pub fn check_consistency(&self) -> Result<(), String> {
        if !(1..=crate::MAX_CAPACITY as usize).contains(&self.capacity) {
            return Err(format!("capacity {} out of range", self.capacity));
        }
        let mut retained = 0;
        for (name, topic) in &self.topics {
            check_identifier("topic", name).map_err(|error| error.to_string())?;
            let count = topic.partitions.len();
            if !(1..=crate::MAX_PARTITIONS as usize).contains(&count) {
                return Err(format!("topic {name:?} has {count} partitions"));
            }
            for (partition, log) in topic.partitions.iter().enumerate() {
                let bytes: u64 = log.records.iter().map(StoredRecord::size).sum();
                // `end()` must not overflow: offsets are added to, never wrapped.
                let ends = log.base.checked_add(log.records.len() as i64).is_some();
                if log.base < 0
                    || !ends
                    || log.records.len() > self.capacity
                    || bytes != log.retained_bytes
                {
                    return Err(format!("topic {name:?} partition {partition}: bad log"));
                }
                retained += bytes;
            }
            for (group_name, group) in &topic.groups {
                group
                    .check_consistency(topic)
                    .map_err(|why| format!("topic {name:?} group {group_name:?}: {why}"))?;
            }
        }
        if retained != self.memory.retained {
            return Err(format!(
                "{} retained bytes counted, {retained} held",
                self.memory.retained
            ));
        }
        Ok(())
    }

    /// Applies one command: the single entry point the server and a log replay use.
    ///
    /// # Errors
    /// As the method that `command` names.
    pub fn apply(&mut self, command: Command) -> Result<Outcome, BrokerError> {
        match command {
            Command::Create {
                topic,
                partition_count,
                key_hash,
            } => self
                .create(&topic, partition_count, key_hash)
                .map(Outcome::Created),
            Command::Join {
                topic,
                group,
                member,
                assignor,
            } => self
                .join(&topic, &group, &member, assignor)
                .map(Outcome::Partitions),
            Command::Leave {
                topic,
                group,
                member,
            } => self.leave(&topic, &group, &member).map(Outcome::Left),
            Command::Publish {
                topic,
                partition,
                payload,
            } => self
                .publish(&topic, partition, payload)
                .map(Outcome::Published),
            Command::PublishKeyed {
                topic,
                key,
                payload,
            } => self
                .publish_keyed(&topic, key, payload)
                .map(|(partition, offset)| Outcome::PublishedKeyed { partition, offset }),
            Command::PublishBatch { topic, records } => self
                .publish_batch(&topic, records)
                .map(Outcome::PublishedBatch),
            Command::Poll {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => self
                .poll(&topic, &group, &member, max_records, max_bytes)
                .map(Outcome::Records),
            Command::Ack {
                topic,
                group,
                member,
                partition,
                offset,
            } => self
                .ack(&topic, &group, &member, partition, offset)
                .map(Outcome::Acked),
            Command::AckAndPoll {
                topic,
                group,
                member,
                acks,
                max_records,
                max_bytes,
            } => self
                .ack_and_poll(&topic, &group, &member, &acks, max_records, max_bytes)
                .map(|(acked, records)| Outcome::AckedAndPolled { acked, records }),
            Command::Retry {
                topic,
                group,
                member,
                partition,
                offset,
            } => self
                .retry(&topic, &group, &member, partition, offset)
                .map(Outcome::Retried),
            Command::Redeliver {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => self
                .redeliver(&topic, &group, &member, max_records, max_bytes)
                .map(Outcome::Records),
            Command::Fetch {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => self
                .fetch(&topic, &group, &member, max_records, max_bytes)
                .map(Outcome::Records),
            Command::Commit {
                topic,
                group,
                member,
                offsets,
            } => self
                .commit(&topic, &group, &member, offsets.as_ref())
                .map(|()| Outcome::Committed),
            Command::Assignment {
                topic,
                group,
                member,
            } => self
                .assignment(&topic, &group, &member)
                .map(Outcome::Partitions),
            Command::Committed {
                topic,
                group,
                partition,
            } => self
                .committed(&topic, &group, partition)
                .map(Outcome::Offset),
            Command::EndOffset { topic, partition } => {
                self.end_offset(&topic, partition).map(Outcome::Offset)
            }
            Command::Lag { topic, group } => self.lag(&topic, &group).map(Outcome::Lag),
            Command::Describe { topic } => {
                self.describe(topic.as_deref()).map(Outcome::Description)
            }
        }
    }

    fn topic(&self, topic: &str) -> Result<&Topic, BrokerError> {
        check_identifier("topic", topic)?;
        self.topics
            .get(topic)
            .ok_or_else(|| BrokerError::invalid(format!("unknown topic {topic:?}")))
    }

    fn topic_mut(&mut self, topic: &str) -> Result<&mut Topic, BrokerError> {
        topic_in(&mut self.topics, topic)
    }

    /// Validates topic, group and member identifiers and looks up the topic.
    fn topic_for_member(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
    ) -> Result<&mut Topic, BrokerError> {
        check_identifier("group", group)?;
        check_identifier("member", member)?;
        self.topic_mut(topic)
    }

    /// Creates `topic` with `partition_count` empty partitions; `false` if it already exists
    /// (the existing topic is kept as it is).
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier or a partition count outside 1 to 64.
    pub fn create(
        &mut self,
        topic: &str,
        partition_count: i32,
        key_hash: KeyHash,
    ) -> Result<bool, BrokerError> {
        check_identifier("topic", topic)?;
        check_partition_count(partition_count)?;
        if self.topics.contains_key(topic) {
            return Ok(false);
        }
        if self.topics.len() >= self.limits.max_topics {
            return Err(BrokerError::invalid(format!(
                "the broker already holds its maximum of {} topics",
                self.limits.max_topics
            )));
        }
        self.topics.insert(
            topic.to_owned(),
            Topic {
                key_hash,
                next_keyless: 0,
                partitions: vec![PartitionLog::default(); partition_count as usize],
                groups: HashMap::new(),
            },
        );
        Ok(true)
    }

    /// Adds `member` to `group` (creating the group with `assignor`, or round-robin when `None`)
    /// and returns the member's partitions. A member already present changes nothing.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic, or an `assignor` that
    /// differs from the existing group's.
    pub fn join(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        assignor: Option<Assignor>,
    ) -> Result<Vec<i32>, BrokerError> {
        check_identifier("group", group)?;
        check_identifier("member", member)?;
        let limits = self.limits;
        let topic = self.topic_mut(topic)?;
        match topic.groups.get(group) {
            Some(existing) => {
                if let Some(wanted) = assignor.filter(|wanted| *wanted != existing.assignor) {
                    return Err(BrokerError::invalid(format!(
                        "group {group:?} uses the {:?} assignor, not {wanted:?}",
                        existing.assignor
                    )));
                }
                if existing.member_index(member).is_none()
                    && existing.members.len() >= limits.max_members_per_group
                {
                    return Err(BrokerError::invalid(format!(
                        "group {group:?} already has its maximum of {} members",
                        limits.max_members_per_group
                    )));
                }
            }
            None if topic.groups.len() >= limits.max_groups_per_topic => {
                return Err(BrokerError::invalid(format!(
                    "the topic already has its maximum of {} groups",
                    limits.max_groups_per_topic
                )));
            }
            None => {}
        }
        let partitions = &topic.partitions;
        let group = topic
            .groups
            .entry(group.to_owned())
            .or_insert_with(|| Group::new(assignor.unwrap_or_default(), partitions));
        let index = match group.member_index(member) {
            Some(index) => index,
            None => {
                let previous = group.owner_ids();
                let index = group.members.partition_point(|m| m.id.as_str() < member);
                group.members.insert(
                    index,
                    Member {
                        id: member.to_owned(),
                        partitions: Vec::new(),
                    },
                );
                group.rebalance(&previous);
                index
            }
        };
        Ok(group.members[index].partitions.clone())
    }

    /// Removes `member` from `group` and rebalances; `false` when either is absent. The group and
    /// its committed offsets stay after its last member leaves.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier or an unknown topic.
    pub fn leave(&mut self, topic: &str, group: &str, member: &str) -> Result<bool, BrokerError> {
        let topic = self.topic_for_member(topic, group, member)?;
        let Some(group) = topic.groups.get_mut(group) else {
            return Ok(false);
        };
        let Some(index) = group.member_index(member) else {
            return Ok(false);
        };
        let previous = group.owner_ids();
        group.members.remove(index);
        group.rebalance(&previous);
        Ok(true)
    }

    /// Appends `payload` to `partition`; its offset, or `-1` when the partition is full (no
    /// offset is consumed).
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic or a partition it does not have.
    pub fn publish(
        &mut self,
        topic: &str,
        partition: i32,
        payload: Bytes,
    ) -> Result<i64, BrokerError> {
        let topic = topic_in(&mut self.topics, topic)?;
        let partition = topic.partition(partition)?;
        Ok(topic.append(
            partition,
            self.capacity,
            &mut self.memory,
            StoredRecord { key: None, payload },
        ))
    }

    /// Appends `payload` to the partition its key hashes to (the topic's [`KeyHash`]), or to the
    /// next partition in round-robin order without a key. Returns the partition and the offset,
    /// `-1` when that partition is full.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic.
    pub fn publish_keyed(
        &mut self,
        topic: &str,
        key: Option<Bytes>,
        payload: Bytes,
    ) -> Result<(i32, i64), BrokerError> {
        let topic = topic_in(&mut self.topics, topic)?;
        let partition = topic.partition_for_key(key.as_ref());
        let offset = topic.append(
            partition,
            self.capacity,
            &mut self.memory,
            StoredRecord { key, payload },
        );
        Ok((partition as i32, offset))
    }

    /// Publishes many records to one topic in one call: each goes to its explicit partition, or
    /// else where its key hashes, or else round-robin, exactly as the same publishes one by one
    /// would. Returns each record's partition and offset (`-1` where its partition was full).
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic, more than
    /// [`crate::MAX_BATCH_RECORDS`] records, or an explicit partition the topic does not have;
    /// nothing is published then.
    pub fn publish_batch(
        &mut self,
        topic: &str,
        records: Vec<PublishRecord>,
    ) -> Result<Vec<(i32, i64)>, BrokerError> {
        check_batch_len(records.len())?;
        let topic = topic_in(&mut self.topics, topic)?;
        for record in &records {
            if let Some(partition) = record.partition {
                topic.partition(partition)?;
            }
        }
        Ok(records
            .into_iter()
            .map(
                |PublishRecord {
                     partition,
                     key,
                     payload,
                 }| {
                    let partition = match partition {
                        Some(partition) => partition as usize,
                        None => topic.partition_for_key(key.as_ref()),
                    };
                    let offset = topic.append(
                        partition,
                        self.capacity,
                        &mut self.memory,
                        StoredRecord { key, payload },
                    );
                    (partition as i32, offset)
                },
            )
            .collect())
    }

    /// Reserves the next record of each of the member's partitions that has none in flight, in
    /// ascending partition order, up to `max_records` (and `max_bytes`, past the first record).
    /// `[]` for an absent group or member.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic, or `max_records` outside
    /// 1 to 64.
    pub fn poll(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<Vec<BrokerRecord>, BrokerError> {
        check_poll_max_records(max_records)?;
        let topic_name = topic;
        let Topic {
            partitions, groups, ..
        } = self.topic_for_member(topic, group, member)?;
        let Some((group, member)) = member_of(groups, group, member) else {
            return Ok(Vec::new());
        };
        let mut budget = Budget::new(max_records, max_bytes);
        let mut delivered = Vec::new();
        for &partition in &group.members[member].partitions {
            let partition = partition as usize;
            let state = &mut group.partitions[partition];
            let log = &partitions[partition];
            let offset = state.committed.max(log.base);
            if state.in_flight.is_some() || offset >= log.end() {
                continue;
            }
            if !budget.take(log.record(offset).size()) {
                break;
            }
            state.in_flight = Some(offset);
            delivered.push(log.deliver(topic_name, partition, offset));
        }
        Ok(delivered)
    }

    /// Acknowledges the exact in-flight delivery (`partition`, `offset`) of `member`: the group's
    /// committed offset becomes `offset + 1` and records every group has consumed are released.
    /// `false`, with no change, on any mismatch.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic, a partition the topic does
    /// not have, or a negative offset.
    pub fn ack(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        partition: i32,
        offset: i64,
    ) -> Result<bool, BrokerError> {
        check_offset(offset)?;
        let topic = self.topic_for_member(topic, group, member)?;
        let partition = topic.partition(partition)?;
        let Some(state) = matching_delivery(&mut topic.groups, group, member, partition, offset)
        else {
            return Ok(false);
        };
        state.commit_delivery(offset);
        self.memory.retained -= topic.release(partition);
        Ok(true)
    }

    /// Acknowledges each of `acks` as [`BrokerState::ack`], in order, then polls as
    /// [`BrokerState::poll`]. Every argument is checked before anything changes.
    ///
    /// # Errors
    /// As [`BrokerState::ack`] for any of `acks` and [`BrokerState::poll`], or more than
    /// [`crate::MAX_ACKS`] acknowledgements; nothing is acknowledged then.
    pub fn ack_and_poll(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        acks: &[(i32, i64)],
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<(Vec<bool>, Vec<BrokerRecord>), BrokerError> {
        check_acks_len(acks.len())?;
        check_poll_max_records(max_records)?;
        check_identifier("group", group)?;
        check_identifier("member", member)?;
        let checked = topic_in(&mut self.topics, topic)?;
        for &(partition, offset) in acks {
            check_offset(offset)?;
            checked.partition(partition)?;
        }
        // What `ack` does for each, with the topic, group and member looked up once.
        let mut acked = vec![false; acks.len()];
        if let Some((group_state, member_index)) = member_of(&mut checked.groups, group, member) {
            for (hit, &(partition, offset)) in acked.iter_mut().zip(acks) {
                let state = &mut group_state.partitions[partition as usize];
                *hit = state.owner == Some(member_index) && state.in_flight == Some(offset);
                if *hit {
                    state.commit_delivery(offset);
                }
            }
        }
        for (&hit, &(partition, _)) in acked.iter().zip(acks) {
            if hit {
                self.memory.retained -= checked.release(partition as usize);
            }
        }
        let records = self.poll(topic, group, member, max_records, max_bytes)?;
        Ok((acked, records))
    }

    /// Releases the exact in-flight delivery (`partition`, `offset`) of `member` without
    /// committing it, so the next poll delivers the same record. `false` on any mismatch.
    ///
    /// # Errors
    /// As [`BrokerState::ack`].
    pub fn retry(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        partition: i32,
        offset: i64,
    ) -> Result<bool, BrokerError> {
        check_offset(offset)?;
        let topic = self.topic_for_member(topic, group, member)?;
        let partition = topic.partition(partition)?;
        let Some(state) = matching_delivery(&mut topic.groups, group, member, partition, offset)
        else {
            return Ok(false);
        };
        state.in_flight = None;
        Ok(true)
    }

    /// Releases every delivery in flight to `member` and polls again, in one step: the records
    /// that a poll whose answer never arrived had reserved come back first (each is the next
    /// record of its partition), delivered anew. `[]` for an absent group or member.
    ///
    /// # Errors
    /// As [`BrokerState::poll`].
    pub fn redeliver(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<Vec<BrokerRecord>, BrokerError> {
        check_poll_max_records(max_records)?;
        let checked = self.topic_for_member(topic, group, member)?;
        if let Some((group_state, member_index)) = member_of(&mut checked.groups, group, member) {
            for &partition in &group_state.members[member_index].partitions {
                group_state.partitions[partition as usize].in_flight = None;
            }
        }
        // Every released record is eligible again and the first is always taken, so a result
        // of `[]` means nothing was in flight and nothing changed.
        self.poll(topic, group, member, max_records, max_bytes)
    }

    /// Returns up to `max_records` records from the member's partitions, ascending by partition
    /// and offset, starting at the member's positions and advancing them. Commits nothing. `[]`
    /// for an absent group or member.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic, or `max_records` outside
    /// 1 to [`crate::MAX_FETCH_RECORDS`].
    pub fn fetch(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<Vec<BrokerRecord>, BrokerError> {
        check_fetch_max_records(max_records)?;
        let topic_name = topic;
        let Topic {
            partitions, groups, ..
        } = self.topic_for_member(topic, group, member)?;
        let Some((group, member)) = member_of(groups, group, member) else {
            return Ok(Vec::new());
        };
        let mut budget = Budget::new(max_records, max_bytes);
        let mut records = Vec::new();
        'partitions: for &partition in &group.members[member].partitions {
            let partition = partition as usize;
            let state = &mut group.partitions[partition];
            let log = &partitions[partition];
            // Records below the log's base were released by every group: skip to what remains.
            // The position moves only when a record is taken, so a fetch that returns nothing
            // changes nothing (a write-ahead log need not record it).
            let mut position = state.position.max(log.base);
            while position < log.end() {
                if !budget.take(log.record(position).size()) {
                    break 'partitions;
                }
                records.push(log.deliver(topic_name, partition, position));
                position += 1;
                state.position = position;
            }
        }
        Ok(records)
    }

    /// Stores committed offsets for the group: the member's fetch positions for all its
    /// partitions (`None`), or exactly `offsets`. All or nothing. Records every group has
    /// consumed are released.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic, a partition the topic
    /// does not have, or a negative offset; `NotAssigned` for the first partition of `offsets`
    /// that the member does not own (including when the member or group is absent).
    pub fn commit(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        offsets: Option<&BTreeMap<i32, i64>>,
    ) -> Result<(), BrokerError> {
        let topic = self.topic_for_member(topic, group, member)?;
        if let Some(offsets) = offsets {
            for (&partition, &offset) in offsets {
                topic.partition(partition)?;
                check_offset(offset)?;
            }
            let owner = topic
                .groups
                .get(group)
                .and_then(|g| Some((g, g.member_index(member)?)));
            if let Some(&partition) = offsets.keys().find(|&&partition| {
                !owner.is_some_and(|(g, member)| g.owns(member, partition as usize))
            }) {
                return Err(BrokerError::NotAssigned { partition });
            }
        }
        let Some((group, member)) = member_of(&mut topic.groups, group, member) else {
            // Only `offsets: None` gets here: a non-member has no positions to store.
            return Ok(());
        };
        let changed: Vec<(usize, i64)> = match offsets {
            Some(offsets) => offsets
                .iter()
                .map(|(&partition, &offset)| (partition as usize, offset))
                .collect(),
            None => group.members[member]
                .partitions
                .iter()
                .map(|&partition| {
                    let partition = partition as usize;
                    (partition, group.partitions[partition].position)
                })
                .collect(),
        };
        for &(partition, offset) in &changed {
            let state = &mut group.partitions[partition];
            if state.committed != offset {
                // A poll delivered the record at the old committed offset; progress now
                // restarts elsewhere, so that delivery can no longer be acknowledged.
                state.in_flight = None;
                state.committed = offset;
            }
        }
        let freed: u64 = changed
            .into_iter()
            .map(|(partition, _)| topic.release(partition))
            .sum();
        self.memory.retained -= freed;
        Ok(())
    }

    /// The member's partitions, ascending; `[]` for an absent group or member.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier or an unknown topic.
    pub fn assignment(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
    ) -> Result<Vec<i32>, BrokerError> {
        let topic = self.topic_for_member(topic, group, member)?;
        Ok(member_of(&mut topic.groups, group, member)
            .map(|(group, member)| group.members[member].partitions.clone())
            .unwrap_or_default())
    }

    /// The group's committed offset on `partition`; for a group that does not exist, the
    /// partition's earliest retained offset.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier, an unknown topic or a partition it does not
    /// have.
    pub fn committed(&self, topic: &str, group: &str, partition: i32) -> Result<i64, BrokerError> {
        check_identifier("group", group)?;
        let topic = self.topic(topic)?;
        let partition = topic.partition(partition)?;
        Ok(committed_offset(topic, group, partition))
    }

    /// The offset the next record published to `partition` will get.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic or a partition it does not have.
    pub fn end_offset(&self, topic: &str, partition: i32) -> Result<i64, BrokerError> {
        let topic = self.topic(topic)?;
        let partition = topic.partition(partition)?;
        Ok(topic.partitions[partition].end())
    }

    /// The group's lag on every partition of the topic, ascending.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed identifier or an unknown topic.
    pub fn lag(&self, topic: &str, group: &str) -> Result<Vec<PartitionLag>, BrokerError> {
        check_identifier("group", group)?;
        let topic = self.topic(topic)?;
        Ok((0..topic.partitions.len())
            .map(|partition| {
                let committed = committed_offset(topic, group, partition);
                let end_offset = topic.partitions[partition].end();
                PartitionLag {
                    partition: partition as i32,
                    committed,
                    end_offset,
                    lag: lag(end_offset, committed),
                }
            })
            .collect())
    }

    /// A snapshot of one topic (`Some`) or of every topic (`None`), sorted by name.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic.
    pub fn describe(&self, topic: Option<&str>) -> Result<BrokerDescription, BrokerError> {
        match topic {
            Some(name) => Ok(BrokerDescription {
                capacity_per_partition: self.capacity_per_partition(),
                topics: vec![describe_topic(name, self.topic(name)?)],
            }),
            None => Ok(self.describe_all()),
        }
    }

    /// A snapshot of every topic, sorted by name.
    pub fn describe_all(&self) -> BrokerDescription {
        let mut topics: Vec<TopicDescription> = self
            .topics
            .iter()
            .map(|(name, topic)| describe_topic(name, topic))
            .collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        BrokerDescription {
            capacity_per_partition: self.capacity_per_partition(),
            topics,
        }
    }
}

/// The topic named `topic`, validated.
fn topic_in<'a>(
    topics: &'a mut HashMap<String, Topic>,
    topic: &str,
) -> Result<&'a mut Topic, BrokerError> {
    check_identifier("topic", topic)?;
    topics
        .get_mut(topic)
        .ok_or_else(|| BrokerError::invalid(format!("unknown topic {topic:?}")))
}

/// The group and the member's index in it, when both exist.
fn member_of<'a>(
    groups: &'a mut HashMap<String, Group>,
    group: &str,
    member: &str,
) -> Option<(&'a mut Group, usize)> {
    let group = groups.get_mut(group)?;
    let member = group.member_index(member)?;
    Some((group, member))
}

/// The group's state on `partition` when `member` owns it and `offset` is the delivery in
/// flight there: the only case in which an ack or a retry takes effect.
fn matching_delivery<'a>(
    groups: &'a mut HashMap<String, Group>,
    group: &str,
    member: &str,
    partition: usize,
    offset: i64,
) -> Option<&'a mut GroupPartition> {
    let (group, member) = member_of(groups, group, member)?;
    let state = &mut group.partitions[partition];
    (state.owner == Some(member) && state.in_flight == Some(offset)).then_some(state)
}

/// Records a group has yet to consume: never negative, 0 when it committed past the end.
fn lag(end_offset: i64, committed: i64) -> i64 {
    (end_offset - committed).max(0)
}

fn committed_offset(topic: &Topic, group: &str, partition: usize) -> i64 {
    topic
        .groups
        .get(group)
        .map_or(topic.partitions[partition].base, |g| {
            g.partitions[partition].committed
        })
}

/// The record and byte limits of one poll or fetch. The first record always fits, so a record
/// larger than the byte budget can still be consumed.
struct Budget {
    records_left: usize,
    bytes_left: Option<u64>,
    taken: usize,
}

impl Budget {
    fn new(max_records: i32, max_bytes: Option<u64>) -> Self {
        Budget {
            records_left: max_records as usize,
            bytes_left: max_bytes,
            taken: 0,
        }
    }

    /// Takes one record of `size` bytes if it fits; `false` when the budget is spent.
    fn take(&mut self, size: u64) -> bool {
        if self.records_left == 0 {
            return false;
        }
        if let Some(bytes_left) = &mut self.bytes_left {
            if self.taken > 0 && (*bytes_left == 0 || size > *bytes_left) {
                return false;
            }
            *bytes_left = bytes_left.saturating_sub(size);
        }
        self.records_left -= 1;
        self.taken += 1;
        true
    }
}

fn describe_topic(name: &str, topic: &Topic) -> TopicDescription {
    let partitions: Vec<PartitionDescription> = topic
        .partitions
        .iter()
        .enumerate()
        .map(|(partition, log)| PartitionDescription {
            partition: partition as i32,
            earliest_offset: log.base,
            end_offset: log.end(),
            records: log.records.len() as u64,
            retained_bytes: log.retained_bytes,
        })
        .collect();
    let mut groups: Vec<GroupDescription> = topic
        .groups
        .iter()
        .map(|(group_name, group)| GroupDescription {
            name: group_name.clone(),
            assignor: group.assignor,
            members: group
                .members
                .iter()
                .map(|m| MemberDescription {
                    member: m.id.clone(),
                    partitions: m.partitions.clone(),
                })
                .collect(),
            partitions: group
                .partitions
                .iter()
                .enumerate()
                .map(|(partition, state)| GroupPartitionDescription {
                    partition: partition as i32,
                    owner: state.owner.map(|index| group.members[index].id.clone()),
                    committed: state.committed,
                    position: state.position,
                    in_flight: state.in_flight,
                    lag: lag(topic.partitions[partition].end(), state.committed),
                })
                .collect(),
        })
        .collect();
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    TopicDescription {
        name: name.to_owned(),
        key_hash: topic.key_hash,
        retained_bytes: partitions.iter().map(|p| p.retained_bytes).sum(),
        partitions,
        groups,
    }
}
