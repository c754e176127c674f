//! Property tests: random sequences of every broker call, applied both to [`EventBroker`] and
//! to a small model written to be obviously correct (plain maps and vectors, assignments
//! recomputed from scratch on every call, retention recomputed from the committed offsets after
//! every call). Every return value and, after every step, the whole `describe()` snapshot must
//! agree. Identifier alphabets are tiny so that collisions happen, and invalid inputs (bad
//! identifiers, unknown topics, bad partitions, negative offsets, out-of-range counts) are in the
//! mix; an invalid call must leave `describe()` unchanged.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use broker_core::{
    hash, Assignor, BrokerDescription, BrokerError, BrokerRecord, Command, EventBroker,
    GroupDescription, GroupPartitionDescription, KeyHash, MemberDescription, Outcome,
    PartitionDescription, PartitionLag, PublishRecord, TopicDescription,
};
use bytes::Bytes;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// The model.

/// A call's result with the error message dropped: the contract fixes the kind, not the text.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Ok(Outcome),
    Invalid,
    NotAssigned(i32),
}

impl From<Result<Outcome, BrokerError>> for Answer {
    fn from(result: Result<Outcome, BrokerError>) -> Self {
        match result {
            Ok(outcome) => Answer::Ok(outcome),
            Err(BrokerError::InvalidArgument(_)) => Answer::Invalid,
            Err(BrokerError::NotAssigned { partition }) => Answer::NotAssigned(partition),
            Err(other) => panic!("an error the contract does not name: {other:?}"),
        }
    }
}

#[derive(Debug, Clone)]
struct Model {
    capacity: usize,
    topics: BTreeMap<String, ModelTopic>,
}

#[derive(Debug, Clone)]
struct ModelTopic {
    key_hash: KeyHash,
    /// How many keyless publishes the topic has seen: the next one goes to this modulo n.
    keyless_publishes: usize,
    logs: Vec<ModelLog>,
    groups: BTreeMap<String, ModelGroup>,
}

#[derive(Debug, Clone, Default)]
struct ModelLog {
    /// Offset of `records[0]`.
    base: i64,
    records: Vec<(Option<Bytes>, Bytes)>,
}

#[derive(Debug, Clone)]
struct ModelGroup {
    assignor: Assignor,
    members: BTreeSet<String>,
    committed: Vec<i64>,
    position: Vec<i64>,
    in_flight: Vec<Option<i64>>,
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn size(record: &(Option<Bytes>, Bytes)) -> u64 {
    (record.0.as_ref().map_or(0, Bytes::len) + record.1.len()) as u64
}

impl ModelLog {
    fn end(&self) -> i64 {
        self.base + self.records.len() as i64
    }

    fn get(&self, offset: i64) -> &(Option<Bytes>, Bytes) {
        &self.records[(offset - self.base) as usize]
    }
}

/// Each partition's owner, recomputed from the sorted member set.
fn owners(
    assignor: Assignor,
    members: &BTreeSet<String>,
    partitions: usize,
) -> Vec<Option<String>> {
    let members: Vec<&String> = members.iter().collect();
    let k = members.len();
    if k == 0 {
        return vec![None; partitions];
    }
    match assignor {
        Assignor::RoundRobin => (0..partitions)
            .map(|p| Some(members[p % k].clone()))
            .collect(),
        Assignor::Range => {
            let mut out = Vec::new();
            for (i, member) in members.iter().enumerate() {
                let count = partitions / k + usize::from(i < partitions % k);
                for _ in 0..count {
                    out.push(Some((*member).clone()));
                }
            }
            out
        }
    }
}

impl ModelGroup {
    fn owners(&self) -> Vec<Option<String>> {
        owners(self.assignor, &self.members, self.committed.len())
    }

    fn assignment(&self, member: &str) -> Vec<i32> {
        self.owners()
            .iter()
            .enumerate()
            .filter(|(_, owner)| owner.as_deref() == Some(member))
            .map(|(p, _)| p as i32)
            .collect()
    }

    fn owns(&self, member: &str, partition: usize) -> bool {
        self.owners()[partition].as_deref() == Some(member)
    }

    /// Applies a membership change: moved partitions lose their delivery, every position
    /// restarts at the committed offset.
    fn change_members(&mut self, change: impl FnOnce(&mut BTreeSet<String>)) {
        let before = self.owners();
        change(&mut self.members);
        let after = self.owners();
        for p in 0..before.len() {
            if before[p] != after[p] {
                self.in_flight[p] = None;
            }
        }
        self.position = self.committed.clone();
    }
}

/// The byte budget of a poll or fetch: the first record always fits; later ones fit while
/// some of `max_bytes` is left and their size is at most what is left.
fn fits(taken: usize, bytes_taken: u64, size: u64, max_bytes: Option<u64>) -> bool {
    match max_bytes {
        None => true,
        Some(max) => taken == 0 || (bytes_taken < max && size <= max - bytes_taken),
    }
}

impl Model {
    fn new(capacity: usize) -> Self {
        Model {
            capacity,
            topics: BTreeMap::new(),
        }
    }

    fn topic(&mut self, topic: &str) -> Result<&mut ModelTopic, Answer> {
        if !valid_id(topic) {
            return Err(Answer::Invalid);
        }
        self.topics.get_mut(topic).ok_or(Answer::Invalid)
    }

    /// Shared retention, from scratch: a record stays while some group has not consumed it.
    fn retain(&mut self) {
        for topic in self.topics.values_mut() {
            for (p, log) in topic.logs.iter_mut().enumerate() {
                let Some(consumed) = topic.groups.values().map(|g| g.committed[p]).min() else {
                    continue;
                };
                while log.base < consumed && !log.records.is_empty() {
                    log.records.remove(0);
                    log.base += 1;
                }
            }
        }
    }

    fn apply(&mut self, command: &Command) -> Answer {
        let answer = match self.answer(command) {
            Ok(outcome) => Answer::Ok(outcome),
            Err(answer) => answer,
        };
        self.retain();
        answer
    }

    fn answer(&mut self, command: &Command) -> Result<Outcome, Answer> {
        let ids = |ids: &[&str]| {
            if ids.iter().all(|id| valid_id(id)) {
                Ok(())
            } else {
                Err(Answer::Invalid)
            }
        };
        let partition_of = |topic: &ModelTopic, partition: i32| {
            if partition >= 0 && (partition as usize) < topic.logs.len() {
                Ok(partition as usize)
            } else {
                Err(Answer::Invalid)
            }
        };
        let capacity = self.capacity;
        match command {
            Command::Create {
                topic,
                partition_count,
                key_hash,
            } => {
                ids(&[topic])?;
                if !(1..=64).contains(partition_count) {
                    return Err(Answer::Invalid);
                }
                if self.topics.contains_key(topic) {
                    return Ok(Outcome::Created(false));
                }
                self.topics.insert(
                    topic.clone(),
                    ModelTopic {
                        key_hash: *key_hash,
                        keyless_publishes: 0,
                        logs: vec![ModelLog::default(); *partition_count as usize],
                        groups: BTreeMap::new(),
                    },
                );
                Ok(Outcome::Created(true))
            }
            Command::Join {
                topic,
                group,
                member,
                assignor,
            } => {
                ids(&[group, member])?;
                let t = self.topic(topic)?;
                if let (Some(existing), Some(wanted)) = (t.groups.get(group), assignor) {
                    if existing.assignor != *wanted {
                        return Err(Answer::Invalid);
                    }
                }
                let bases: Vec<i64> = t.logs.iter().map(|l| l.base).collect();
                let g = t.groups.entry(group.clone()).or_insert_with(|| ModelGroup {
                    assignor: assignor.unwrap_or(Assignor::RoundRobin),
                    members: BTreeSet::new(),
                    committed: bases.clone(),
                    position: bases.clone(),
                    in_flight: vec![None; bases.len()],
                });
                if !g.members.contains(member) {
                    g.change_members(|members| {
                        members.insert(member.clone());
                    });
                }
                Ok(Outcome::Partitions(g.assignment(member)))
            }
            Command::Leave {
                topic,
                group,
                member,
            } => {
                ids(&[group, member])?;
                let t = self.topic(topic)?;
                let Some(g) = t.groups.get_mut(group) else {
                    return Ok(Outcome::Left(false));
                };
                if !g.members.contains(member) {
                    return Ok(Outcome::Left(false));
                }
                g.change_members(|members| {
                    members.remove(member);
                });
                Ok(Outcome::Left(true))
            }
            Command::Publish {
                topic,
                partition,
                payload,
            } => {
                let t = self.topic(topic)?;
                let p = partition_of(t, *partition)?;
                let log = &mut t.logs[p];
                if log.records.len() >= capacity {
                    return Ok(Outcome::Published(-1));
                }
                log.records.push((None, payload.clone()));
                Ok(Outcome::Published(log.end() - 1))
            }
            Command::PublishKeyed {
                topic,
                key,
                payload,
            } => {
                let t = self.topic(topic)?;
                let n = t.logs.len();
                let p = match key {
                    Some(key) => match t.key_hash {
                        KeyHash::Murmur2 => (hash::murmur2(key) & 0x7fff_ffff) as usize % n,
                        KeyHash::Fnv1a => hash::fnv1a(key) as usize % n,
                    },
                    None => {
                        t.keyless_publishes += 1;
                        (t.keyless_publishes - 1) % n
                    }
                };
                let log = &mut t.logs[p];
                let offset = if log.records.len() >= capacity {
                    -1
                } else {
                    log.records.push((key.clone(), payload.clone()));
                    log.end() - 1
                };
                Ok(Outcome::PublishedKeyed {
                    partition: p as i32,
                    offset,
                })
            }
            Command::PublishBatch { topic, records } => {
                let t = self.topic(topic)?;
                for record in records {
                    if let Some(p) = record.partition {
                        partition_of(t, p)?;
                    }
                }
                let mut placed = Vec::new();
                for record in records {
                    let Some(p) = record.partition else {
                        let keyed = Command::PublishKeyed {
                            topic: topic.clone(),
                            key: record.key.clone(),
                            payload: record.payload.clone(),
                        };
                        if let Ok(Outcome::PublishedKeyed { partition, offset }) =
                            self.answer(&keyed)
                        {
                            placed.push((partition, offset));
                        }
                        // Each record is consumed at once by groups already past it.
                        self.retain();
                        continue;
                    };
                    let log = &mut self.topic(topic)?.logs[p as usize];
                    let offset = if log.records.len() >= capacity {
                        -1
                    } else {
                        log.records
                            .push((record.key.clone(), record.payload.clone()));
                        log.end() - 1
                    };
                    self.retain();
                    placed.push((p, offset));
                }
                Ok(Outcome::PublishedBatch(placed))
            }
            Command::Poll {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => {
                if !(1..=64).contains(max_records) {
                    return Err(Answer::Invalid);
                }
                ids(&[group, member])?;
                let t = self.topic(topic)?;
                let Some(g) = t
                    .groups
                    .get_mut(group)
                    .filter(|g| g.members.contains(member))
                else {
                    return Ok(Outcome::Records(Vec::new()));
                };
                let mut out = Vec::new();
                let mut bytes_taken = 0;
                for p in g.assignment(member) {
                    let p = p as usize;
                    let log = &t.logs[p];
                    let next = g.committed[p].max(log.base);
                    if g.in_flight[p].is_some() || next >= log.end() {
                        continue;
                    }
                    let record = log.get(next);
                    if out.len() == *max_records as usize
                        || !fits(out.len(), bytes_taken, size(record), *max_bytes)
                    {
                        break;
                    }
                    bytes_taken += size(record);
                    g.in_flight[p] = Some(next);
                    out.push(to_record(topic, p, next, record));
                }
                Ok(Outcome::Records(out))
            }
            Command::Redeliver {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => {
                if !(1..=64).contains(max_records) {
                    return Err(Answer::Invalid);
                }
                ids(&[group, member])?;
                let t = self.topic(topic)?;
                if let Some(g) = t
                    .groups
                    .get_mut(group)
                    .filter(|g| g.members.contains(member))
                {
                    for p in g.assignment(member) {
                        g.in_flight[p as usize] = None;
                    }
                }
                self.answer(&Command::Poll {
                    topic: topic.clone(),
                    group: group.clone(),
                    member: member.clone(),
                    max_records: *max_records,
                    max_bytes: *max_bytes,
                })
            }
            Command::AckAndPoll {
                topic,
                group,
                member,
                acks,
                max_records,
                max_bytes,
            } => {
                if acks.len() > 64 || !(1..=64).contains(max_records) {
                    return Err(Answer::Invalid);
                }
                ids(&[group, member])?;
                let t = self.topic(topic)?;
                for &(partition, offset) in acks {
                    partition_of(t, partition)?;
                    if offset < 0 {
                        return Err(Answer::Invalid);
                    }
                }
                let mut acked = Vec::new();
                for &(partition, offset) in acks {
                    let ack = Command::Ack {
                        topic: topic.clone(),
                        group: group.clone(),
                        member: member.clone(),
                        partition,
                        offset,
                    };
                    acked.push(matches!(self.answer(&ack)?, Outcome::Acked(true)));
                }
                let poll = Command::Poll {
                    topic: topic.clone(),
                    group: group.clone(),
                    member: member.clone(),
                    max_records: *max_records,
                    max_bytes: *max_bytes,
                };
                let Outcome::Records(records) = self.answer(&poll)? else {
                    unreachable!("a poll answers records");
                };
                Ok(Outcome::AckedAndPolled { acked, records })
            }
            Command::Ack {
                topic,
                group,
                member,
                partition,
                offset,
            }
            | Command::Retry {
                topic,
                group,
                member,
                partition,
                offset,
            } => {
                let is_ack = matches!(command, Command::Ack { .. });
                let done = |hit| {
                    if is_ack {
                        Outcome::Acked(hit)
                    } else {
                        Outcome::Retried(hit)
                    }
                };
                if *offset < 0 {
                    return Err(Answer::Invalid);
                }
                ids(&[group, member])?;
                let t = self.topic(topic)?;
                let p = partition_of(t, *partition)?;
                let Some(g) = t.groups.get_mut(group) else {
                    return Ok(done(false));
                };
                if !g.owns(member, p) || g.in_flight[p] != Some(*offset) {
                    return Ok(done(false));
                }
                g.in_flight[p] = None;
                if is_ack {
                    g.committed[p] = offset + 1;
                    g.position[p] = g.position[p].max(offset + 1);
                }
                Ok(done(true))
            }
            Command::Fetch {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => {
                if !(1..=broker_core::MAX_FETCH_RECORDS).contains(max_records) {
                    return Err(Answer::Invalid);
                }
                ids(&[group, member])?;
                let t = self.topic(topic)?;
                let Some(g) = t
                    .groups
                    .get_mut(group)
                    .filter(|g| g.members.contains(member))
                else {
                    return Ok(Outcome::Records(Vec::new()));
                };
                let mut out = Vec::new();
                let mut bytes_taken = 0;
                'partitions: for p in g.assignment(member) {
                    let p = p as usize;
                    let log = &t.logs[p];
                    // Released records are skipped; the position moves only past records taken.
                    let mut next = g.position[p].max(log.base);
                    while next < log.end() {
                        let record = log.get(next);
                        if out.len() == *max_records as usize
                            || !fits(out.len(), bytes_taken, size(record), *max_bytes)
                        {
                            break 'partitions;
                        }
                        bytes_taken += size(record);
                        out.push(to_record(topic, p, next, record));
                        next += 1;
                        g.position[p] = next;
                    }
                }
                Ok(Outcome::Records(out))
            }
            Command::Commit {
                topic,
                group,
                member,
                offsets,
            } => {
                ids(&[group, member])?;
                let t = self.topic(topic)?;
                if let Some(offsets) = offsets {
                    for (&p, &o) in offsets {
                        partition_of(t, p)?;
                        if o < 0 {
                            return Err(Answer::Invalid);
                        }
                    }
                    for &p in offsets.keys() {
                        let owned = t
                            .groups
                            .get(group)
                            .is_some_and(|g| g.owns(member, p as usize));
                        if !owned {
                            return Err(Answer::NotAssigned(p));
                        }
                    }
                }
                let Some(g) = t
                    .groups
                    .get_mut(group)
                    .filter(|g| g.members.contains(member))
                else {
                    return Ok(Outcome::Committed);
                };
                let stores: Vec<(usize, i64)> = match offsets {
                    Some(offsets) => offsets.iter().map(|(&p, &o)| (p as usize, o)).collect(),
                    None => g
                        .assignment(member)
                        .into_iter()
                        .map(|p| (p as usize, g.position[p as usize]))
                        .collect(),
                };
                for (p, o) in stores {
                    if g.committed[p] != o {
                        g.in_flight[p] = None;
                        g.committed[p] = o;
                    }
                }
                Ok(Outcome::Committed)
            }
            Command::Assignment {
                topic,
                group,
                member,
            } => {
                ids(&[group, member])?;
                let t = self.topic(topic)?;
                Ok(Outcome::Partitions(
                    t.groups
                        .get(group)
                        .map(|g| g.assignment(member))
                        .unwrap_or_default(),
                ))
            }
            Command::Committed {
                topic,
                group,
                partition,
            } => {
                ids(&[group])?;
                let t = self.topic(topic)?;
                let p = partition_of(t, *partition)?;
                Ok(Outcome::Offset(committed(t, group, p)))
            }
            Command::EndOffset { topic, partition } => {
                let t = self.topic(topic)?;
                let p = partition_of(t, *partition)?;
                Ok(Outcome::Offset(t.logs[p].end()))
            }
            Command::Lag { topic, group } => {
                ids(&[group])?;
                let t = self.topic(topic)?;
                Ok(Outcome::Lag(
                    (0..t.logs.len())
                        .map(|p| {
                            let committed = committed(t, group, p);
                            let end_offset = t.logs[p].end();
                            PartitionLag {
                                partition: p as i32,
                                committed,
                                end_offset,
                                lag: (end_offset - committed).max(0),
                            }
                        })
                        .collect(),
                ))
            }
            Command::Describe { topic } => {
                let mut description = self.describe();
                if let Some(topic) = topic {
                    self.topic(topic)?;
                    description.topics.retain(|t| &t.name == topic);
                }
                Ok(Outcome::Description(description))
            }
        }
    }

    fn describe(&self) -> BrokerDescription {
        BrokerDescription {
            capacity_per_partition: self.capacity as i32,
            topics: self
                .topics
                .iter()
                .map(|(name, t)| {
                    let partitions: Vec<PartitionDescription> = t
                        .logs
                        .iter()
                        .enumerate()
                        .map(|(p, log)| PartitionDescription {
                            partition: p as i32,
                            earliest_offset: log.base,
                            end_offset: log.end(),
                            records: log.records.len() as u64,
                            retained_bytes: log.records.iter().map(size).sum(),
                        })
                        .collect();
                    TopicDescription {
                        name: name.clone(),
                        key_hash: t.key_hash,
                        retained_bytes: partitions.iter().map(|p| p.retained_bytes).sum(),
                        partitions,
                        groups: t
                            .groups
                            .iter()
                            .map(|(group_name, g)| describe_group(t, group_name, g))
                            .collect(),
                    }
                })
                .collect(),
        }
    }
}

fn committed(topic: &ModelTopic, group: &str, partition: usize) -> i64 {
    topic
        .groups
        .get(group)
        .map_or(topic.logs[partition].base, |g| g.committed[partition])
}

fn to_record(
    topic: &str,
    partition: usize,
    offset: i64,
    record: &(Option<Bytes>, Bytes),
) -> BrokerRecord {
    BrokerRecord {
        topic: topic.to_owned(),
        partition: partition as i32,
        offset,
        key: record.0.clone(),
        payload: record.1.clone(),
    }
}

fn describe_group(topic: &ModelTopic, name: &str, g: &ModelGroup) -> GroupDescription {
    let owners = g.owners();
    GroupDescription {
        name: name.to_owned(),
        assignor: g.assignor,
        members: g
            .members
            .iter()
            .map(|m| MemberDescription {
                member: m.clone(),
                partitions: g.assignment(m),
            })
            .collect(),
        partitions: (0..owners.len())
            .map(|p| GroupPartitionDescription {
                partition: p as i32,
                owner: owners[p].clone(),
                committed: g.committed[p],
                position: g.position[p],
                in_flight: g.in_flight[p],
                lag: (topic.logs[p].end() - g.committed[p]).max(0),
            })
            .collect(),
    }
}

// ---------------------------------------------------------------------------------------------
// Driving the broker through its methods (and sometimes through `apply`).

fn call(broker: &EventBroker, command: &Command, via_apply: bool) -> Result<Outcome, BrokerError> {
    if via_apply {
        return broker.apply(command.clone());
    }
    match command.clone() {
        Command::Create {
            topic,
            partition_count,
            key_hash: KeyHash::Murmur2,
        } => broker.create(&topic, partition_count).map(Outcome::Created),
        Command::Create {
            topic,
            partition_count,
            key_hash,
        } => broker
            .create_with(&topic, partition_count, key_hash)
            .map(Outcome::Created),
        Command::Join {
            topic,
            group,
            member,
            assignor: None,
        } => broker
            .join(&topic, &group, &member)
            .map(Outcome::Partitions),
        Command::Join {
            topic,
            group,
            member,
            assignor: Some(assignor),
        } => broker
            .join_with(&topic, &group, &member, assignor)
            .map(Outcome::Partitions),
        Command::Leave {
            topic,
            group,
            member,
        } => broker.leave(&topic, &group, &member).map(Outcome::Left),
        Command::Publish {
            topic,
            partition,
            payload,
        } => broker
            .publish(&topic, partition, payload)
            .map(Outcome::Published),
        Command::PublishKeyed {
            topic,
            key,
            payload,
        } => broker
            .publish_keyed(&topic, key.as_deref(), payload)
            .map(|(partition, offset)| Outcome::PublishedKeyed { partition, offset }),
        Command::PublishBatch { topic, records } => broker
            .publish_batch(&topic, records)
            .map(Outcome::PublishedBatch),
        Command::AckAndPoll {
            topic,
            group,
            member,
            acks,
            max_records,
            max_bytes: None,
        } => broker
            .ack_and_poll(&topic, &group, &member, &acks, max_records)
            .map(|(acked, records)| Outcome::AckedAndPolled { acked, records }),
        Command::AckAndPoll { .. } => broker.apply(command.clone()),
        Command::Redeliver {
            topic,
            group,
            member,
            max_records,
            max_bytes: None,
        } => broker
            .redeliver(&topic, &group, &member, max_records)
            .map(Outcome::Records),
        Command::Redeliver { .. } => broker.apply(command.clone()),
        Command::Poll {
            topic,
            group,
            member,
            max_records,
            max_bytes: None,
        } => broker
            .poll(&topic, &group, &member, max_records)
            .map(Outcome::Records),
        Command::Poll {
            topic,
            group,
            member,
            max_records,
            max_bytes,
        } => broker
            .poll_limited(&topic, &group, &member, max_records, max_bytes)
            .map(Outcome::Records),
        Command::Ack {
            topic,
            group,
            member,
            partition,
            offset,
        } => broker
            .ack(&topic, &group, &member, partition, offset)
            .map(Outcome::Acked),
        Command::Retry {
            topic,
            group,
            member,
            partition,
            offset,
        } => broker
            .retry(&topic, &group, &member, partition, offset)
            .map(Outcome::Retried),
        Command::Fetch {
            topic,
            group,
            member,
            max_records,
            max_bytes: None,
        } => broker
            .fetch(&topic, &group, &member, max_records)
            .map(Outcome::Records),
        Command::Fetch {
            topic,
            group,
            member,
            max_records,
            max_bytes,
        } => broker
            .fetch_limited(&topic, &group, &member, max_records, max_bytes)
            .map(Outcome::Records),
        Command::Commit {
            topic,
            group,
            member,
            offsets,
        } => broker
            .commit(&topic, &group, &member, offsets)
            .map(|()| Outcome::Committed),
        Command::Assignment {
            topic,
            group,
            member,
        } => broker
            .assignment(&topic, &group, &member)
            .map(Outcome::Partitions),
        Command::Committed {
            topic,
            group,
            partition,
        } => broker
            .committed(&topic, &group, partition)
            .map(Outcome::Offset),
        Command::EndOffset { topic, partition } => {
            broker.end_offset(&topic, partition).map(Outcome::Offset)
        }
        Command::Lag { topic, group } => broker.lag(&topic, &group).map(Outcome::Lag),
        Command::Describe { topic: None } => Ok(Outcome::Description(broker.describe())),
        describe @ Command::Describe { .. } => broker.apply(describe),
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies: tiny alphabets, so that names collide, plus some invalid values.

fn topic_id() -> impl Strategy<Value = String> {
    prop_oneof![
        20 => Just("t0".to_owned()),
        20 => Just("t1".to_owned()),
        1 => Just(String::new()),
        1 => Just("t 1".to_owned()),
    ]
}

fn group_id() -> impl Strategy<Value = String> {
    prop_oneof![
        15 => Just("g0".to_owned()),
        15 => Just("g1".to_owned()),
        15 => Just("G0".to_owned()),
        1 => Just(String::new()),
        1 => Just("g.0".to_owned()),
    ]
}

fn member_id() -> impl Strategy<Value = String> {
    prop_oneof![
        15 => Just("m0".to_owned()),
        15 => Just("m1".to_owned()),
        15 => Just("M2".to_owned()),
        15 => Just("_3".to_owned()),
        1 => Just("m\u{e9}".to_owned()),
        1 => Just("m".repeat(65)),
    ]
}

fn partition() -> impl Strategy<Value = i32> {
    prop_oneof![25 => 0..3_i32, 1 => Just(-1), 1 => Just(64)]
}

fn offset() -> impl Strategy<Value = i64> {
    prop_oneof![25 => 0..6_i64, 1 => Just(-1), 1 => Just(i64::MIN)]
}

fn bytes(max_len: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..=max_len).prop_map(Bytes::from)
}

fn max_records() -> impl Strategy<Value = i32> {
    prop_oneof![40 => 1..4_i32, 4 => Just(64), 1 => Just(0), 1 => Just(-3), 1 => Just(65)]
}

fn max_bytes() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![3 => Just(None), 1 => (0..6_u64).prop_map(Some)]
}

fn assignor() -> impl Strategy<Value = Option<Assignor>> {
    prop_oneof![
        2 => Just(None),
        1 => Just(Some(Assignor::RoundRobin)),
        1 => Just(Some(Assignor::Range)),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    let who = || (topic_id(), group_id(), member_id());
    prop_oneof![
        2 => (
            topic_id(),
            prop_oneof![8 => 1..5_i32, 1 => Just(0), 1 => Just(65)],
            prop_oneof![Just(KeyHash::Murmur2), Just(KeyHash::Fnv1a)],
        )
            .prop_map(|(topic, partition_count, key_hash)| Command::Create {
                topic,
                partition_count,
                key_hash,
            }),
        5 => (who(), assignor()).prop_map(|((topic, group, member), assignor)| Command::Join {
            topic,
            group,
            member,
            assignor,
        }),
        2 => who().prop_map(|(topic, group, member)| Command::Leave { topic, group, member }),
        12 => (topic_id(), partition(), bytes(3)).prop_map(|(topic, partition, payload)| {
            Command::Publish { topic, partition, payload }
        }),
        4 => (topic_id(), proptest::option::of(bytes(2)), bytes(3)).prop_map(
            |(topic, key, payload)| Command::PublishKeyed { topic, key, payload }
        ),
        3 => (
            topic_id(),
            proptest::collection::vec(
                (proptest::option::of(partition()), proptest::option::of(bytes(2)), bytes(3)),
                0..4,
            ),
        )
            .prop_map(|(topic, records)| Command::PublishBatch {
                topic,
                records: records
                    .into_iter()
                    .map(|(partition, key, payload)| PublishRecord { partition, key, payload })
                    .collect(),
            }),
        8 => (who(), max_records(), max_bytes()).prop_map(
            |((topic, group, member), max_records, max_bytes)| Command::Poll {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            }
        ),
        3 => (who(), partition(), offset()).prop_map(
            |((topic, group, member), partition, offset)| Command::Ack {
                topic,
                group,
                member,
                partition,
                offset,
            }
        ),
        2 => (
            who(),
            proptest::collection::vec((partition(), offset()), 0..3),
            max_records(),
            max_bytes(),
        )
            .prop_map(|((topic, group, member), acks, max_records, max_bytes)| {
                Command::AckAndPoll { topic, group, member, acks, max_records, max_bytes }
            }),
        1 => (who(), max_records(), max_bytes()).prop_map(
            |((topic, group, member), max_records, max_bytes)| Command::Redeliver {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            }
        ),
        1 => (who(), partition(), offset()).prop_map(
            |((topic, group, member), partition, offset)| Command::Retry {
                topic,
                group,
                member,
                partition,
                offset,
            }
        ),
        5 => (who(), max_records(), max_bytes()).prop_map(
            |((topic, group, member), max_records, max_bytes)| Command::Fetch {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            }
        ),
        5 => (
            who(),
            proptest::option::of(proptest::collection::btree_map(partition(), offset(), 0..3)),
        )
            .prop_map(|((topic, group, member), offsets)| Command::Commit {
                topic,
                group,
                member,
                offsets,
            }),
        1 => who().prop_map(|(topic, group, member)| Command::Assignment { topic, group, member }),
        1 => (topic_id(), group_id(), partition()).prop_map(|(topic, group, partition)| {
            Command::Committed { topic, group, partition }
        }),
        1 => (topic_id(), partition())
            .prop_map(|(topic, partition)| Command::EndOffset { topic, partition }),
        1 => (topic_id(), group_id()).prop_map(|(topic, group)| Command::Lag { topic, group }),
        1 => proptest::option::of(topic_id()).prop_map(|topic| Command::Describe { topic }),
    ]
}

/// One generated step: a command as generated, or an ack or retry of the delivery the model
/// has in flight at that moment (random acks would almost never match one).
#[derive(Debug, Clone)]
enum Step {
    Raw(Command),
    Settle {
        pick: usize,
        ack: bool,
    },
    /// `action` (0 poll, 1 fetch, 2 commit positions, 3 leave, 4 ack everything the member has
    /// in flight and poll) by an existing member.
    Member {
        pick: usize,
        action: u8,
        max_records: i32,
        max_bytes: Option<u64>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => command().prop_map(Step::Raw),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, ack)| Step::Settle { pick, ack }),
        2 => (any::<usize>(), 0..6_u8, max_records(), max_bytes()).prop_map(
            |(pick, action, max_records, max_bytes)| Step::Member {
                pick,
                action,
                max_records,
                max_bytes,
            }
        ),
    ]
}

/// The command a step stands for in the model's current state.
fn resolve(model: &Model, step: Step) -> Command {
    let (pick, ack) = match step {
        Step::Raw(command) => return command,
        Step::Settle { pick, ack } => (pick, ack),
        Step::Member {
            pick,
            action,
            max_records,
            max_bytes,
        } => return member_action(model, pick, action, max_records, max_bytes),
    };
    let mut deliveries = Vec::new();
    for (topic_name, topic) in &model.topics {
        for (group_name, group) in &topic.groups {
            let owners = group.owners();
            for (p, in_flight) in group.in_flight.iter().enumerate() {
                if let (Some(offset), Some(owner)) = (in_flight, &owners[p]) {
                    deliveries.push((topic_name, group_name, owner.clone(), p as i32, *offset));
                }
            }
        }
    }
    let (topic, group, member, partition, offset) = match deliveries.len() {
        0 => (&"t0".to_owned(), &"g0".to_owned(), "m0".to_owned(), 0, 0),
        n => deliveries.swap_remove(pick % n),
    };
    let (topic, group) = (topic.clone(), group.clone());
    if ack {
        Command::Ack {
            topic,
            group,
            member,
            partition,
            offset,
        }
    } else {
        Command::Retry {
            topic,
            group,
            member,
            partition,
            offset,
        }
    }
}

fn member_action(
    model: &Model,
    pick: usize,
    action: u8,
    max_records: i32,
    max_bytes: Option<u64>,
) -> Command {
    let mut members = Vec::new();
    for (topic_name, topic) in &model.topics {
        for (group_name, group) in &topic.groups {
            for member in &group.members {
                members.push((topic_name.clone(), group_name.clone(), member.clone()));
            }
        }
    }
    let (topic, group, member) = match members.len() {
        0 => ("t0".to_owned(), "g0".to_owned(), "m0".to_owned()),
        n => members.swap_remove(pick % n),
    };
    match action {
        0 => Command::Poll {
            topic,
            group,
            member,
            max_records,
            max_bytes,
        },
        1 => Command::Fetch {
            topic,
            group,
            member,
            max_records,
            max_bytes,
        },
        2 => Command::Commit {
            topic,
            group,
            member,
            offsets: None,
        },
        3 => Command::Leave {
            topic,
            group,
            member,
        },
        4 => Command::Redeliver {
            topic,
            group,
            member,
            max_records,
            max_bytes,
        },
        _ => {
            let acks = in_flight_of(model, &topic, &group, &member);
            Command::AckAndPoll {
                topic,
                group,
                member,
                acks,
                max_records,
                max_bytes,
            }
        }
    }
}

/// The deliveries `member` has in flight, as (partition, offset).
fn in_flight_of(model: &Model, topic: &str, group: &str, member: &str) -> Vec<(i32, i64)> {
    let Some(group) = model.topics.get(topic).and_then(|t| t.groups.get(group)) else {
        return Vec::new();
    };
    let owners = group.owners();
    group
        .in_flight
        .iter()
        .enumerate()
        .filter(|(p, _)| owners[*p].as_deref() == Some(member))
        .filter_map(|(p, in_flight)| in_flight.map(|offset| (p as i32, offset)))
        .collect()
}

/// Two topics created up front, so that most generated calls reach real state.
fn setup() -> Vec<Command> {
    vec![
        Command::Create {
            topic: "t0".to_owned(),
            partition_count: 3,
            key_hash: KeyHash::Murmur2,
        },
        Command::Create {
            topic: "t1".to_owned(),
            partition_count: 2,
            key_hash: KeyHash::Fnv1a,
        },
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn broker_agrees_with_the_model_on_every_call(
        capacity in 1..=5_i32,
        pre_create in any::<bool>(),
        steps in proptest::collection::vec((step(), any::<bool>()), 1..80),
    ) {
        let broker = EventBroker::new(capacity).unwrap();
        let mut model = Model::new(capacity as usize);
        let setup = if pre_create { setup() } else { Vec::new() };
        let steps = setup.into_iter().map(|c| (Step::Raw(c), false)).chain(steps);
        for (index, (step, via_apply)) in steps.enumerate() {
            let command = resolve(&model, step);
            let before = broker.describe();
            let expected = model.apply(&command);
            let actual = Answer::from(call(&broker, &command, via_apply));
            prop_assert_eq!(&actual, &expected, "step {}: {:?}", index, command);
            if !matches!(actual, Answer::Ok(_)) || command.is_read_only() {
                prop_assert_eq!(&broker.describe(), &before, "step {}: an error or a read changed state", index);
            }
            prop_assert_eq!(broker.describe(), model.describe(), "step {}: {:?}", index, command);
            // What a snapshot's loader checks holds after every call.
            let consistent = broker.with_state(|state| state.check_consistency());
            prop_assert_eq!(consistent, Ok(()), "step {}: {:?}", index, command);
        }
    }
}

#[test]
fn the_model_rejects_what_the_contract_rejects() {
    // A sanity check of the model itself, so that agreement above means something.
    let mut model = Model::new(2);
    for command in setup() {
        assert_eq!(model.apply(&command), Answer::Ok(Outcome::Created(true)));
    }
    let bad_topic = Command::Publish {
        topic: "nope".to_owned(),
        partition: 0,
        payload: Bytes::new(),
    };
    assert_eq!(model.apply(&bad_topic), Answer::Invalid);
    let join = Command::Join {
        topic: "t0".to_owned(),
        group: "g".to_owned(),
        member: "b".to_owned(),
        assignor: Some(Assignor::Range),
    };
    assert_eq!(
        model.apply(&join),
        Answer::Ok(Outcome::Partitions(vec![0, 1, 2]))
    );
    let join = Command::Join {
        topic: "t0".to_owned(),
        group: "g".to_owned(),
        member: "a".to_owned(),
        assignor: None,
    };
    assert_eq!(
        model.apply(&join),
        Answer::Ok(Outcome::Partitions(vec![0, 1]))
    );
    let commit = Command::Commit {
        topic: "t0".to_owned(),
        group: "g".to_owned(),
        member: "a".to_owned(),
        offsets: Some(BTreeMap::from([(0, 0), (2, 0)])),
    };
    assert_eq!(model.apply(&commit), Answer::NotAssigned(2));
}

/// The generated sequences reach the interesting cases often enough: successful acks and
/// retries, canceled deliveries, full partitions, released records, `NotAssigned`, invalid calls.
/// Without this, agreement with the model could hide behind sequences that never do anything.
#[test]
fn generated_sequences_reach_every_interesting_case() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = proptest::collection::vec(step(), 60);
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for _ in 0..100 {
        let steps = strategy.new_tree(&mut runner).unwrap().current();
        let mut model = Model::new(3);
        for command in setup() {
            model.apply(&command);
        }
        for step in steps {
            let command = resolve(&model, step);
            let released_before: i64 = model
                .topics
                .values()
                .flat_map(|t| &t.logs)
                .map(|l| l.base)
                .sum();
            let in_flight_before: usize = in_flight_count(&model);
            let answer = model.apply(&command);
            let released_after: i64 = model
                .topics
                .values()
                .flat_map(|t| &t.logs)
                .map(|l| l.base)
                .sum();
            let kind = match (&command, &answer) {
                (_, Answer::Invalid) => "invalid",
                (_, Answer::NotAssigned(_)) => "not assigned",
                (Command::Ack { .. }, Answer::Ok(Outcome::Acked(true))) => "ack",
                (Command::Retry { .. }, Answer::Ok(Outcome::Retried(true))) => "retry",
                (Command::AckAndPoll { .. }, Answer::Ok(Outcome::AckedAndPolled { acked, .. }))
                    if acked.contains(&true) =>
                {
                    "ack and poll"
                }
                (_, Answer::Ok(Outcome::Published(-1))) => "full",
                (Command::Poll { .. }, Answer::Ok(Outcome::Records(r))) if !r.is_empty() => "poll",
                (Command::Redeliver { .. }, Answer::Ok(Outcome::Records(r))) if !r.is_empty() => {
                    "redeliver"
                }
                (Command::Fetch { .. }, Answer::Ok(Outcome::Records(r))) if !r.is_empty() => {
                    "fetch"
                }
                (
                    Command::Commit {
                        offsets: Some(_), ..
                    },
                    Answer::Ok(_),
                ) => "commit",
                (Command::Leave { .. }, Answer::Ok(Outcome::Left(true))) => "leave",
                _ => "other",
            };
            *seen.entry(kind).or_default() += 1;
            if released_after > released_before {
                *seen.entry("released").or_default() += 1;
            }
            if matches!(command, Command::Join { .. } | Command::Leave { .. })
                && in_flight_count(&model) < in_flight_before
            {
                *seen.entry("canceled by rebalance").or_default() += 1;
            }
        }
    }
    for kind in [
        "invalid",
        "not assigned",
        "ack",
        "retry",
        "ack and poll",
        "full",
        "poll",
        "redeliver",
        "fetch",
        "commit",
        "leave",
        "released",
        "canceled by rebalance",
    ] {
        assert!(
            seen.get(kind).copied().unwrap_or(0) >= 10,
            "{kind} too rare: {seen:?}"
        );
    }
}

fn in_flight_count(model: &Model) -> usize {
    model
        .topics
        .values()
        .flat_map(|t| t.groups.values())
        .flat_map(|g| &g.in_flight)
        .filter(|f| f.is_some())
        .count()
}
