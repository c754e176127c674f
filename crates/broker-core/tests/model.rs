//! Property tests: random sequences of every broker call, at times that move forward, applied
//! both to [`EventBroker`] and to a small model written to be obviously correct (plain maps and
//! vectors, assignments recomputed from scratch on every call, interest retention recomputed
//! from the committed offsets after every call, ages and acknowledgement deadlines checked
//! against the clock at every step). Every return value and, after every step, the whole
//! `describe()` snapshot must agree. Identifier alphabets are tiny so that collisions happen,
//! and invalid inputs (bad identifiers, unknown topics, bad partitions, negative offsets,
//! out-of-range counts, settings that make no sense) are in the mix; an invalid call must leave
//! `describe()` unchanged.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use broker_core::cold::{Appended, ColdError, ColdStore, LogId};
use broker_core::image::{RecordImage, StateImage};
use broker_core::{
    hash, Assignor, BrokerDescription, BrokerError, BrokerRecord, BrokerState, Command, Discard,
    EventBroker, GroupDescription, GroupPartitionDescription, GroupSetting, GroupSettings, Header,
    KeyHash, MemberDescription, Outcome, PartitionBatch, PartitionDescription, PartitionLag,
    PartitionRead, ProducerState, PublishRecord, ResetTo, Retention, StartAt, TopicDescription,
    TopicSetting, TopicSettings, HEADER_WIRE_BYTES,
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

/// The most partitions a topic may have (the default limits).
const MAX_PARTITIONS: i32 = 64;

#[derive(Debug, Clone)]
struct Model {
    capacity: u64,
    clock: i64,
    topics: BTreeMap<String, ModelTopic>,
}

#[derive(Debug, Clone)]
struct ModelTopic {
    key_hash: KeyHash,
    settings: TopicSettings,
    /// The partition the next keyless publish goes to (modulo the partitions, when it grew).
    next_keyless: usize,
    logs: Vec<ModelLog>,
    groups: BTreeMap<String, ModelGroup>,
    /// Every batch of records an idempotent producer stored, by producer and partition.
    batches: BTreeMap<(u64, usize), Vec<StoredBatch>>,
    /// Each idempotent producer's last publish: when, and every partition its batches named.
    producers: BTreeMap<u64, (i64, BTreeSet<usize>)>,
}

/// The sequence number and offset of each record of a batch an idempotent producer stored.
type StoredBatch = Vec<(u64, i64)>;

#[derive(Debug, Clone, Default)]
struct ModelLog {
    /// Offset of `records[0]`.
    base: i64,
    records: Vec<ModelRecord>,
    /// The time of the last record ever appended.
    last_time: i64,
}

#[derive(Debug, Clone)]
struct ModelRecord {
    key: Option<Bytes>,
    payload: Bytes,
    headers: Vec<Header>,
    time: i64,
}

impl ModelRecord {
    fn size(&self) -> u64 {
        (self.key.as_ref().map_or(0, Bytes::len)
            + self.payload.len()
            + self
                .headers
                .iter()
                .map(|h| h.name.len() + h.value.as_ref().map_or(0, Bytes::len))
                .sum::<usize>()) as u64
    }

    /// What the record counts against the byte budget of an answer: its size, and what each
    /// header's lengths take on the wire.
    fn answer_size(&self) -> u64 {
        self.size() + HEADER_WIRE_BYTES * self.headers.len() as u64
    }
}

#[derive(Debug, Clone)]
struct ModelGroup {
    assignor: Assignor,
    settings: GroupSettings,
    members: BTreeSet<String>,
    committed: Vec<i64>,
    position: Vec<i64>,
    in_flight: Vec<Option<i64>>,
    delivered_at: Vec<i64>,
    deliveries: Vec<u32>,
    skipped: Vec<u64>,
    /// A delayed retry: the offset it holds back and until when.
    held: Vec<Option<(i64, i64)>>,
    /// Whether the group stored its committed offset (a commit, an ack or a reset).
    stored: Vec<bool>,
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl ModelLog {
    fn end(&self) -> i64 {
        self.base + self.records.len() as i64
    }

    fn get(&self, offset: i64) -> &ModelRecord {
        &self.records[(offset - self.base) as usize]
    }

    fn bytes(&self) -> u64 {
        self.records.iter().map(ModelRecord::size).sum()
    }

    /// Removes the records below `offset`.
    fn trim(&mut self, offset: i64) {
        while self.base < offset && !self.records.is_empty() {
            self.records.remove(0);
            self.base += 1;
        }
    }

    /// The first offset whose time is at or after `time`, by a plain scan.
    fn first_at_or_after(&self, time: i64) -> i64 {
        for (index, record) in self.records.iter().enumerate() {
            if record.time >= time {
                return self.base + index as i64;
            }
        }
        self.end()
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
    fn new(assignor: Assignor, settings: GroupSettings, logs: &[ModelLog]) -> Self {
        let start: Vec<i64> = logs
            .iter()
            .map(|log| match settings.start_at {
                StartAt::Earliest => log.base,
                StartAt::Latest => log.end(),
            })
            .collect();
        let n = logs.len();
        ModelGroup {
            assignor,
            settings,
            members: BTreeSet::new(),
            committed: start.clone(),
            position: start,
            in_flight: vec![None; n],
            delivered_at: vec![0; n],
            deliveries: vec![0; n],
            skipped: vec![0; n],
            held: vec![None; n],
            stored: vec![false; n],
        }
    }

    /// Whether a delayed retry holds back the record at `next` of `p` at `now`.
    fn is_held(&self, p: usize, next: i64, now: i64) -> bool {
        self.held[p].is_some_and(|(offset, until)| offset == next && until > now)
    }

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

    /// Applies a membership change (or, with the same members, a change of partition count
    /// made before): moved partitions lose their delivery, every position restarts at the
    /// committed offset.
    fn change_members(&mut self, before: Vec<Option<String>>, change: impl FnOnce(&mut Self)) {
        change(self);
        let after = self.owners();
        for (p, owner) in after.iter().enumerate() {
            if before.get(p).cloned().flatten() != *owner {
                self.in_flight[p] = None;
            }
        }
        self.position = self.committed.clone();
    }

    /// Moves the committed offset of `p` to `offset` (a commit or a reset).
    fn move_committed(&mut self, p: usize, offset: i64) {
        self.stored[p] = true;
        if self.committed[p] != offset {
            self.in_flight[p] = None;
            self.deliveries[p] = 0;
            self.committed[p] = offset;
        }
    }

    /// The records of `p` below `base` left without the group: it skips what it had not
    /// consumed.
    fn skip_to(&mut self, p: usize, base: i64) {
        if self.committed[p] < base {
            self.skipped[p] += (base - self.committed[p]) as u64;
            self.in_flight[p] = None;
            self.deliveries[p] = 0;
            self.committed[p] = base;
        }
        self.position[p] = self.position[p].max(base);
    }

    fn overdue(&self, p: usize, now: i64) -> bool {
        self.settings
            .ack_timeout_ms
            .is_some_and(|timeout| (now - self.delivered_at[p]) as u128 >= u128::from(timeout))
    }
}

impl ModelTopic {
    /// Removes the records of `p` below `offset` whatever the groups consumed.
    fn discard_below(&mut self, p: usize, offset: i64) {
        self.logs[p].trim(offset);
        let base = self.logs[p].base;
        for group in self.groups.values_mut() {
            group.skip_to(p, base);
        }
    }

    /// The records of `p` too old at `now`.
    fn expire(&mut self, p: usize, now: i64) {
        if let Some(max_age) = self.settings.max_age_ms {
            let oldest_kept = now - max_age as i64;
            let keep_from = self.logs[p].first_at_or_after(oldest_kept);
            self.discard_below(p, keep_from);
        }
    }

    /// With limits retention that discards old records, the oldest records of `p` leave
    /// while the partition holds more than `extra_records` below its count limit or more than
    /// `extra_bytes` below its byte limit.
    fn discard_oldest(&mut self, p: usize, cap: Option<u64>, extra_records: u64, extra_bytes: u64) {
        let settings = self.settings;
        let over = |log: &ModelLog| {
            cap.is_some_and(|cap| log.records.len() as u64 + extra_records > cap)
                || settings
                    .max_bytes
                    .is_some_and(|max| log.bytes() + extra_bytes > max)
        };
        while over(&self.logs[p]) && !self.logs[p].records.is_empty() {
            let base = self.logs[p].base;
            self.logs[p].trim(base + 1);
        }
        let base = self.logs[p].base;
        for group in self.groups.values_mut() {
            group.skip_to(p, base);
        }
    }

    /// Appends a record within the topic's retention: its offset, or -1.
    fn append(&mut self, p: usize, capacity: u64, now: i64, mut record: ModelRecord) -> i64 {
        let settings = self.settings;
        let cap = match settings.retention {
            Retention::Interest => Some(settings.max_records.unwrap_or(capacity)),
            Retention::Limits => settings.max_records,
        };
        self.expire(p, now);
        let size = record.size();
        if settings.max_bytes.is_some_and(|max| size > max) {
            return -1;
        }
        let full = |log: &ModelLog| {
            cap.is_some_and(|cap| log.records.len() as u64 >= cap)
                || settings
                    .max_bytes
                    .is_some_and(|max| log.bytes() + size > max)
        };
        if full(&self.logs[p]) {
            if settings.discard == Discard::New {
                return -1;
            }
            self.discard_oldest(p, cap, 1, size);
        }
        let log = &mut self.logs[p];
        record.time = record.time.min(now).max(log.last_time);
        log.last_time = record.time;
        log.records.push(record);
        log.end() - 1
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
    fn new(capacity: u64) -> Self {
        Model {
            capacity,
            clock: 0,
            topics: BTreeMap::new(),
        }
    }

    fn topic(&mut self, topic: &str) -> Result<&mut ModelTopic, Answer> {
        if !valid_id(topic) {
            return Err(Answer::Invalid);
        }
        self.topics.get_mut(topic).ok_or(Answer::Invalid)
    }

    /// The clock moves to `now` (if later): old records leave, overdue deliveries are
    /// released. The topics where something changed.
    fn advance(&mut self, now: i64) -> Vec<String> {
        self.clock = self.clock.max(now);
        let now = self.clock;
        let mut changed = Vec::new();
        for (name, topic) in &mut self.topics {
            let mut touched = false;
            for p in 0..topic.logs.len() {
                let base = topic.logs[p].base;
                topic.expire(p, now);
                touched |= topic.logs[p].base != base;
            }
            for group in topic.groups.values_mut() {
                for p in 0..group.in_flight.len() {
                    if group.in_flight[p].is_some() && group.overdue(p, now) {
                        group.in_flight[p] = None;
                        touched = true;
                    }
                    // A delayed retry that has ended wakes the topic's waiting consumers, at the
                    // first tick after its end (whatever commands moved the clock meanwhile).
                    if let Some((offset, until)) = group.held[p] {
                        if until <= now {
                            group.held[p] = None;
                            touched |= group.in_flight[p].is_none() && offset == group.committed[p];
                        }
                    }
                }
            }
            if touched {
                changed.push(name.clone());
            }
        }
        changed
    }

    /// Interest retention, from scratch: a record stays while some group has not consumed it.
    fn retain(&mut self) {
        for topic in self.topics.values_mut() {
            if topic.settings.retention != Retention::Interest {
                continue;
            }
            for (p, log) in topic.logs.iter_mut().enumerate() {
                let Some(consumed) = topic.groups.values().map(|g| g.committed[p]).min() else {
                    continue;
                };
                log.trim(consumed);
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

    #[allow(clippy::too_many_lines)]
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
        let now = self.clock;
        match command {
            Command::Create {
                topic,
                partition_count,
                key_hash,
                settings,
            } => {
                ids(&[topic])?;
                if !(1..=MAX_PARTITIONS).contains(partition_count) {
                    return Err(Answer::Invalid);
                }
                let settings = TopicSettings::from_list(settings).map_err(|_| Answer::Invalid)?;
                if self.topics.contains_key(topic) {
                    return Ok(Outcome::Created(false));
                }
                self.topics.insert(
                    topic.clone(),
                    ModelTopic {
                        key_hash: *key_hash,
                        settings,
                        next_keyless: 0,
                        logs: vec![ModelLog::default(); *partition_count as usize],
                        groups: BTreeMap::new(),
                        batches: BTreeMap::new(),
                        producers: BTreeMap::new(),
                    },
                );
                Ok(Outcome::Created(true))
            }
            Command::Join {
                topic,
                group,
                member,
                assignor,
                settings,
            } => {
                let wanted = GroupSettings::from_list(settings).map_err(|_| Answer::Invalid)?;
                ids(&[group, member])?;
                let t = self.topic(topic)?;
                if let Some(existing) = t.groups.get(group) {
                    if assignor.is_some_and(|wanted| wanted != existing.assignor) {
                        return Err(Answer::Invalid);
                    }
                    if !settings.is_empty() && wanted != existing.settings {
                        return Err(Answer::Invalid);
                    }
                }
                let logs = t.logs.clone();
                let g = t.groups.entry(group.clone()).or_insert_with(|| {
                    ModelGroup::new(assignor.unwrap_or(Assignor::RoundRobin), wanted, &logs)
                });
                if !g.members.contains(member) {
                    let before = g.owners();
                    g.change_members(before, |g| {
                        g.members.insert(member.clone());
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
                let before = g.owners();
                g.change_members(before, |g| {
                    g.members.remove(member);
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
                let record = ModelRecord {
                    key: None,
                    payload: payload.clone(),
                    headers: Vec::new(),
                    time: now,
                };
                Ok(Outcome::Published(t.append(p, capacity, now, record)))
            }
            Command::PublishKeyed {
                topic,
                key,
                payload,
            } => {
                let t = self.topic(topic)?;
                let p = place(t, key.as_ref());
                let record = ModelRecord {
                    key: key.clone(),
                    payload: payload.clone(),
                    headers: Vec::new(),
                    time: now,
                };
                let offset = t.append(p, capacity, now, record);
                Ok(Outcome::PublishedKeyed {
                    partition: p as i32,
                    offset,
                })
            }
            Command::PublishBatch { topic, records }
            | Command::PublishUntilFull { topic, records } => {
                let until_full = matches!(command, Command::PublishUntilFull { .. });
                if records.len() > broker_core::MAX_BATCH_RECORDS {
                    return Err(Answer::Invalid);
                }
                let t = self.topic(topic)?;
                for record in records {
                    if let Some(p) = record.partition {
                        partition_of(t, p)?;
                    }
                    let names_ok = record
                        .headers
                        .iter()
                        .all(|h| (1..=broker_core::MAX_HEADER_NAME_LEN).contains(&h.name.len()));
                    if record.headers.len() > broker_core::MAX_HEADERS || !names_ok {
                        return Err(Answer::Invalid);
                    }
                }
                let mut placed: Vec<(i32, i64)> = Vec::new();
                for record in records {
                    let p = match record.partition {
                        Some(p) => p as usize,
                        None => place(t, record.key.as_ref()),
                    };
                    // Until full: a partition that refused a record takes none after it.
                    if until_full && placed.contains(&(p as i32, -1)) {
                        placed.push((p as i32, -1));
                        continue;
                    }
                    let stored = ModelRecord {
                        key: record.key.clone(),
                        payload: record.payload.clone(),
                        headers: record.headers.clone(),
                        time: record.timestamp_ms.unwrap_or(now),
                    };
                    placed.push((p as i32, t.append(p, capacity, now, stored)));
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
                Ok(Outcome::Records(poll(
                    t,
                    topic,
                    group,
                    member,
                    *max_records,
                    *max_bytes,
                    now,
                )))
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
                Ok(Outcome::Records(poll(
                    t,
                    topic,
                    group,
                    member,
                    *max_records,
                    *max_bytes,
                    now,
                )))
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
                self.retain();
                let t = self.topic(topic)?;
                let records = poll(t, topic, group, member, *max_records, *max_bytes, now);
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
            }
            | Command::RetryAfter {
                topic,
                group,
                member,
                partition,
                offset,
                ..
            } => {
                let is_ack = matches!(command, Command::Ack { .. });
                let delay = match command {
                    Command::RetryAfter { delay_ms, .. } => Some(*delay_ms),
                    _ => None,
                };
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
                    g.deliveries[p] = 0;
                    g.stored[p] = true;
                    g.committed[p] = offset + 1;
                    g.position[p] = g.position[p].max(offset + 1);
                }
                if let Some(delay) = delay {
                    let until = now.saturating_add(i64::try_from(delay).unwrap_or(i64::MAX));
                    g.held[p] = Some((*offset, until));
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
                            || !fits(out.len(), bytes_taken, record.answer_size(), *max_bytes)
                        {
                            break 'partitions;
                        }
                        bytes_taken += record.answer_size();
                        out.push(to_record(topic, p, next, record, 0));
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
                    for (&p, &o) in offsets {
                        if o > t.logs[p as usize].end() {
                            return Err(Answer::Invalid);
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
                    g.move_committed(p, o);
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
            Command::StoredOffsets { topic, group } => {
                ids(&[group])?;
                let t = self.topic(topic)?;
                Ok(Outcome::StoredOffsets(match t.groups.get(group) {
                    Some(g) => (0..t.logs.len())
                        .map(|p| g.stored[p].then_some(g.committed[p]))
                        .collect(),
                    None => vec![None; t.logs.len()],
                }))
            }
            Command::Producers { topic, partition } => {
                let t = self.topic(topic)?;
                let p = partition_of(t, *partition)?;
                let states = t
                    .producers
                    .iter()
                    .filter(|(_, (_, partitions))| partitions.contains(&p))
                    .map(|(&producer, &(last_seen_ms, _))| {
                        let stored = t.batches.get(&(producer, p));
                        ProducerState {
                            producer,
                            next_sequence: stored.map_or(0, |stored| {
                                stored.iter().map(Vec::len).sum::<usize>() as u64
                            }),
                            last_offset: stored
                                .and_then(|stored| stored.last()?.last())
                                .map(|&(_, offset)| offset),
                            last_seen_ms,
                        }
                    })
                    .collect();
                Ok(Outcome::Producers(states))
            }
            Command::Lag { topic, group } => {
                ids(&[group])?;
                let t = self.topic(topic)?;
                Ok(Outcome::Lag(
                    (0..t.logs.len()).map(|p| lag_row(t, group, p)).collect(),
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
            Command::AddPartitions {
                topic,
                partition_count,
            } => {
                let t = self.topic(topic)?;
                if !(1..=MAX_PARTITIONS).contains(partition_count) {
                    return Err(Answer::Invalid);
                }
                let wanted = *partition_count as usize;
                let current = t.logs.len();
                if wanted < current {
                    return Err(Answer::Invalid);
                }
                if wanted > current {
                    t.logs.resize(wanted, ModelLog::default());
                    for g in t.groups.values_mut() {
                        let before = g.owners();
                        g.change_members(before, |g| {
                            g.committed.resize(wanted, 0);
                            g.position.resize(wanted, 0);
                            g.in_flight.resize(wanted, None);
                            g.delivered_at.resize(wanted, 0);
                            g.deliveries.resize(wanted, 0);
                            g.skipped.resize(wanted, 0);
                            g.held.resize(wanted, None);
                            g.stored.resize(wanted, false);
                        });
                    }
                }
                Ok(Outcome::PartitionCount(*partition_count))
            }
            Command::DeleteTopic { topic } => {
                ids(&[topic])?;
                Ok(Outcome::Deleted(self.topics.remove(topic).is_some()))
            }
            Command::ConfigureGroup {
                topic,
                group,
                settings,
            } => {
                ids(&[group])?;
                let mut wanted = GroupSettings::from_list(settings).map_err(|_| Answer::Invalid)?;
                if wanted
                    .dead_letter
                    .is_some_and(|dead_letter| dead_letter.as_str() == topic)
                {
                    return Err(Answer::Invalid);
                }
                let t = self.topic(topic)?;
                let g = t.groups.get_mut(group).ok_or(Answer::Invalid)?;
                let names_start = settings
                    .iter()
                    .any(|setting| matches!(setting, GroupSetting::StartAt(_)));
                if names_start && wanted.start_at != g.settings.start_at {
                    return Err(Answer::Invalid);
                }
                wanted.start_at = g.settings.start_at;
                g.settings = wanted;
                Ok(Outcome::GroupSettings(g.settings.to_list()))
            }
            Command::ConfigureTopic { topic, settings } => {
                let now = self.clock;
                let t = self.topic(topic)?;
                let mut wanted = t.settings;
                let mut named = Vec::new();
                for setting in settings {
                    if named.contains(&setting.name()) {
                        return Err(Answer::Invalid);
                    }
                    named.push(setting.name());
                    match *setting {
                        TopicSetting::Retention(retention) if retention != wanted.retention => {
                            return Err(Answer::Invalid)
                        }
                        TopicSetting::Retention(_) => {}
                        TopicSetting::MaxRecords(max) => wanted.max_records = Some(max),
                        TopicSetting::MaxBytes(max) => wanted.max_bytes = Some(max),
                        TopicSetting::MaxAgeMs(max) => wanted.max_age_ms = Some(max),
                        TopicSetting::Discard(discard) => wanted.discard = discard,
                    }
                }
                wanted.check().map_err(|_| Answer::Invalid)?;
                t.settings = wanted;
                for p in 0..t.logs.len() {
                    t.expire(p, now);
                    if wanted.retention == Retention::Limits && wanted.discard == Discard::Old {
                        t.discard_oldest(p, wanted.max_records, 0, 0);
                    }
                }
                Ok(Outcome::TopicSettings(wanted.to_list()))
            }
            Command::DeleteGroup { topic, group } => {
                ids(&[group])?;
                let t = self.topic(topic)?;
                match t.groups.get(group) {
                    None => Ok(Outcome::Deleted(false)),
                    Some(g) if !g.members.is_empty() => Err(Answer::Invalid),
                    Some(_) => {
                        t.groups.remove(group);
                        Ok(Outcome::Deleted(true))
                    }
                }
            }
            Command::Purge {
                topic,
                partition,
                before,
            } => {
                if *before < 0 {
                    return Err(Answer::Invalid);
                }
                let t = self.topic(topic)?;
                let p = partition_of(t, *partition)?;
                let end = t.logs[p].end();
                t.discard_below(p, (*before).min(end));
                Ok(Outcome::Offset(t.logs[p].base))
            }
            Command::ResetGroup {
                topic,
                group,
                partitions,
                to,
            } => {
                if matches!(to, ResetTo::Offset(offset) if *offset < 0) {
                    ids(&[group])?;
                    self.topic(topic)?;
                    return Err(Answer::Invalid);
                }
                self.move_group(topic, group, partitions.as_deref(), Some(*to))
            }
            Command::DeleteOffsets {
                topic,
                group,
                partitions,
            } => self.move_group(topic, group, Some(partitions), None),
            Command::CommitGroup {
                topic,
                group,
                offsets,
            } => {
                ids(&[group])?;
                let t = self.topic(topic)?;
                let mut selected: Vec<(usize, i64)> = Vec::new();
                for &(p, offset) in offsets {
                    let p = partition_of(t, p)?;
                    if offset < 0 || selected.iter().any(|&(named, _)| named == p) {
                        return Err(Answer::Invalid);
                    }
                    selected.push((p, offset));
                }
                if t.groups.get(group).is_some_and(|g| !g.members.is_empty()) {
                    return Err(Answer::Invalid);
                }
                let logs = t.logs.clone();
                let g = t.groups.entry(group.clone()).or_insert_with(|| {
                    ModelGroup::new(Assignor::RoundRobin, GroupSettings::default(), &logs)
                });
                for &(p, offset) in &selected {
                    let log = &logs[p];
                    g.move_committed(p, offset.clamp(log.base, log.end()));
                    g.position[p] = g.committed[p];
                }
                self.retain();
                Ok(Outcome::Committed)
            }
            Command::OffsetForTime {
                topic,
                partition,
                timestamp_ms,
            } => {
                let t = self.topic(topic)?;
                let p = partition_of(t, *partition)?;
                Ok(Outcome::Offset(t.logs[p].first_at_or_after(*timestamp_ms)))
            }
            Command::Read {
                topic,
                partition,
                offset,
                max_records,
                max_bytes,
            } => {
                if *offset < 0 || !(1..=broker_core::MAX_FETCH_RECORDS).contains(max_records) {
                    return Err(Answer::Invalid);
                }
                let t = self.topic(topic)?;
                let p = partition_of(t, *partition)?;
                let log = &t.logs[p];
                if *offset > log.end() {
                    return Err(Answer::Invalid);
                }
                // Records below the base have left: a read starts at the base at the earliest.
                let mut records = Vec::new();
                let mut bytes_taken = 0;
                for next in (*offset).max(log.base)..log.end() {
                    let record = log.get(next);
                    if records.len() == *max_records as usize
                        || !fits(records.len(), bytes_taken, record.answer_size(), *max_bytes)
                    {
                        break;
                    }
                    bytes_taken += record.answer_size();
                    records.push(to_record(topic, p, next, record, 0));
                }
                Ok(Outcome::Read(PartitionRead {
                    records,
                    start_offset: log.base,
                    end_offset: log.end(),
                }))
            }
            // A server answers these about its cluster and its Kafka listener; the broker's
            // state refuses them.
            Command::ClusterStatus
            | Command::GroupsStatus
            | Command::KafkaGroups
            | Command::AddNode { .. }
            | Command::RemoveNode { .. }
            | Command::TransferLeadership { .. }
            | Command::MoveTopic { .. }
            | Command::Metadata { .. } => Err(Answer::Invalid),
            Command::PublishIdempotent {
                topic,
                producer,
                batches,
            } => {
                let total: usize = batches.iter().map(|batch| batch.records.len()).sum();
                if total > broker_core::MAX_BATCH_RECORDS {
                    return Err(Answer::Invalid);
                }
                let t = self.topic(topic)?;
                // All or nothing: every batch is checked first.
                let mut checked: Vec<(usize, Vec<(i32, i64)>)> = Vec::new();
                for batch in batches {
                    let p = partition_of(t, batch.partition)?;
                    if checked.iter().any(|(earlier, _)| *earlier == p) {
                        return Err(Answer::Invalid);
                    }
                    for record in &batch.records {
                        let names_ok = record.headers.iter().all(|h| {
                            (1..=broker_core::MAX_HEADER_NAME_LEN).contains(&h.name.len())
                        });
                        if record.partition.is_some_and(|own| own != batch.partition)
                            || record.headers.len() > broker_core::MAX_HEADERS
                            || !names_ok
                        {
                            return Err(Answer::Invalid);
                        }
                    }
                    let stored = t.batches.get(&(*producer, p)).cloned().unwrap_or_default();
                    let next = stored.iter().map(Vec::len).sum::<usize>() as u64;
                    if batch.sequence > next {
                        return Err(Answer::Invalid);
                    }
                    let recent =
                        &stored[stored.len().saturating_sub(broker_core::RECENT_BATCHES)..];
                    let mut repeated = Vec::new();
                    for sequence in batch.sequence..next {
                        if repeated.len() == batch.records.len() {
                            break;
                        }
                        let offset = recent
                            .iter()
                            .flatten()
                            .find(|(s, _)| *s == sequence)
                            .map(|(_, offset)| *offset)
                            .ok_or(Answer::Invalid)?;
                        repeated.push((batch.partition, offset));
                    }
                    checked.push((p, repeated));
                }
                if !batches.is_empty() {
                    let (last_seen, partitions) = t.producers.entry(*producer).or_default();
                    *last_seen = now;
                    partitions.extend(checked.iter().map(|(p, _)| *p));
                }
                let mut placed = Vec::new();
                for (batch, (p, repeated)) in batches.iter().zip(checked) {
                    let next = t.batches.get(&(*producer, p)).map_or(0, |stored| {
                        stored.iter().map(Vec::len).sum::<usize>() as u64
                    });
                    let mut stored = Vec::new();
                    let mut refused = false;
                    placed.extend(repeated.iter().copied());
                    for record in batch.records.iter().skip(repeated.len()) {
                        if refused {
                            placed.push((batch.partition, -1));
                            continue;
                        }
                        let offset = t.append(
                            p,
                            capacity,
                            now,
                            ModelRecord {
                                key: record.key.clone(),
                                payload: record.payload.clone(),
                                headers: record.headers.clone(),
                                time: record.timestamp_ms.unwrap_or(now),
                            },
                        );
                        refused = offset < 0;
                        if !refused {
                            stored.push((next + stored.len() as u64, offset));
                        }
                        placed.push((batch.partition, offset));
                    }
                    if !stored.is_empty() {
                        t.batches.entry((*producer, p)).or_default().push(stored);
                    }
                }
                Ok(Outcome::PublishedBatch(placed))
            }
        }
    }

    /// A reset of `group`'s offsets on `partitions` (every one with `None`) to `to`, or, with
    /// no `to`, their deletion: back to where the group starts, stored no more (a group with
    /// members refused).
    fn move_group(
        &mut self,
        topic: &str,
        group: &str,
        partitions: Option<&[i32]>,
        to: Option<ResetTo>,
    ) -> Result<Outcome, Answer> {
        if !valid_id(group) {
            return Err(Answer::Invalid);
        }
        let t = self.topic(topic)?;
        let selected: Vec<usize> = match partitions {
            Some(partitions) => {
                let mut selected = Vec::new();
                for &p in partitions {
                    if p < 0 || p as usize >= t.logs.len() || selected.contains(&(p as usize)) {
                        return Err(Answer::Invalid);
                    }
                    selected.push(p as usize);
                }
                selected.sort_unstable();
                selected
            }
            None => (0..t.logs.len()).collect(),
        };
        let logs = t.logs.clone();
        let Some(g) = t.groups.get_mut(group) else {
            return Err(Answer::Invalid);
        };
        if to.is_none() && !g.members.is_empty() {
            return Err(Answer::Invalid);
        }
        for &p in &selected {
            let log = &logs[p];
            let target = match to {
                Some(ResetTo::Earliest) => log.base,
                Some(ResetTo::Latest) => log.end(),
                Some(ResetTo::Offset(offset)) => offset,
                Some(ResetTo::Timestamp(time)) => log.first_at_or_after(time),
                Some(ResetTo::ShiftBy(shift)) => g.committed[p].saturating_add(shift),
                None => match g.settings.start_at {
                    StartAt::Earliest => log.base,
                    StartAt::Latest => log.end(),
                },
            };
            // Its delivery in flight there, and a delayed retry, are cancelled even where the
            // committed offset does not move.
            g.in_flight[p] = None;
            g.deliveries[p] = 0;
            g.held[p] = None;
            g.move_committed(p, target.clamp(log.base, log.end()));
            g.position[p] = g.committed[p];
            if to.is_none() {
                g.stored[p] = false;
            }
        }
        self.retain();
        let t = self.topic(topic)?;
        Ok(Outcome::Lag(
            selected.iter().map(|&p| lag_row(t, group, p)).collect(),
        ))
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
                            retained_bytes: log.bytes(),
                            earliest_timestamp_ms: log.records.first().map(|r| r.time),
                        })
                        .collect();
                    TopicDescription {
                        name: name.clone(),
                        key_hash: t.key_hash,
                        settings: t.settings.to_list(),
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

/// The partition a keyed publish goes to (advancing round-robin without a key).
fn place(t: &mut ModelTopic, key: Option<&Bytes>) -> usize {
    let n = t.logs.len();
    match key {
        Some(key) => match t.key_hash {
            KeyHash::Murmur2 => (hash::murmur2(key) & 0x7fff_ffff) as usize % n,
            KeyHash::Fnv1a => hash::fnv1a(key) as usize % n,
        },
        // Round-robin from the partition after the last one used, as it was numbered then: a
        // topic that grew goes on from where its cursor wrapped (the contract leaves growth
        // open; this is what the broker does).
        None => {
            let partition = t.next_keyless % n;
            t.next_keyless = (partition + 1) % n;
            partition
        }
    }
}

/// A poll of `member`: the next record of each of its partitions with nothing in flight (or an
/// overdue delivery), one per partition, ascending.
fn poll(
    t: &mut ModelTopic,
    topic: &str,
    group: &str,
    member: &str,
    max_records: i32,
    max_bytes: Option<u64>,
    now: i64,
) -> Vec<BrokerRecord> {
    let Some(g) = t
        .groups
        .get_mut(group)
        .filter(|g| g.members.contains(member))
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut bytes_taken = 0;
    for p in g.assignment(member) {
        let p = p as usize;
        let log = &t.logs[p];
        let next = g.committed[p].max(log.base);
        let busy = g.in_flight[p].is_some() && !g.overdue(p, now);
        let held = g.in_flight[p].is_none() && g.is_held(p, next, now);
        if busy || held || next >= log.end() {
            continue;
        }
        let record = log.get(next);
        if out.len() == max_records as usize
            || !fits(out.len(), bytes_taken, record.answer_size(), max_bytes)
        {
            break;
        }
        bytes_taken += record.answer_size();
        // Delivered: a delayed retry of it is over.
        g.held[p] = None;
        g.in_flight[p] = Some(next);
        g.delivered_at[p] = now;
        g.deliveries[p] += 1;
        out.push(to_record(topic, p, next, record, g.deliveries[p]));
    }
    out
}

fn committed(topic: &ModelTopic, group: &str, partition: usize) -> i64 {
    topic
        .groups
        .get(group)
        .map_or(topic.logs[partition].base, |g| g.committed[partition])
}

fn lag_row(t: &ModelTopic, group: &str, p: usize) -> PartitionLag {
    let committed = committed(t, group, p);
    let end_offset = t.logs[p].end();
    PartitionLag {
        partition: p as i32,
        committed,
        end_offset,
        lag: (end_offset - committed).max(0),
        skipped: t.groups.get(group).map_or(0, |g| g.skipped[p]),
    }
}

fn to_record(
    topic: &str,
    partition: usize,
    offset: i64,
    record: &ModelRecord,
    delivery_count: u32,
) -> BrokerRecord {
    BrokerRecord {
        topic: topic.to_owned(),
        partition: partition as i32,
        offset,
        key: record.key.clone(),
        payload: record.payload.clone(),
        timestamp_ms: record.time,
        headers: record.headers.clone(),
        delivery_count,
    }
}

fn describe_group(topic: &ModelTopic, name: &str, g: &ModelGroup) -> GroupDescription {
    let owners = g.owners();
    GroupDescription {
        name: name.to_owned(),
        assignor: g.assignor,
        settings: g.settings.to_list(),
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
                deliveries: g.deliveries[p],
                skipped: g.skipped[p],
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
            settings,
        } if settings.is_empty() => broker.create(&topic, partition_count).map(Outcome::Created),
        Command::Create {
            topic,
            partition_count,
            key_hash,
            settings,
        } if settings.is_empty() => broker
            .create_with(&topic, partition_count, key_hash)
            .map(Outcome::Created),
        Command::Create {
            topic,
            partition_count,
            key_hash,
            settings,
        } => broker
            .create_topic(&topic, partition_count, key_hash, &settings)
            .map(Outcome::Created),
        Command::Join {
            topic,
            group,
            member,
            assignor: None,
            settings,
        } if settings.is_empty() => broker
            .join(&topic, &group, &member)
            .map(Outcome::Partitions),
        Command::Join {
            topic,
            group,
            member,
            assignor: Some(assignor),
            settings,
        } if settings.is_empty() => broker
            .join_with(&topic, &group, &member, assignor)
            .map(Outcome::Partitions),
        Command::Join {
            topic,
            group,
            member,
            assignor,
            settings,
        } => broker
            .join_group(&topic, &group, &member, assignor, &settings)
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
        Command::PublishUntilFull { topic, records } => broker
            .publish_until_full(&topic, records)
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
        // No method of the trait: only through `apply`.
        retry_after @ Command::RetryAfter { .. } => broker.apply(retry_after),
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
        Command::Producers { topic, partition } => {
            broker.producers(&topic, partition).map(Outcome::Producers)
        }
        Command::StoredOffsets { topic, group } => broker
            .stored_offsets(&topic, &group)
            .map(Outcome::StoredOffsets),
        Command::Describe { topic: None } => Ok(Outcome::Description(broker.describe())),
        describe @ Command::Describe { .. } => broker.apply(describe),
        Command::AddPartitions {
            topic,
            partition_count,
        } => broker
            .add_partitions(&topic, partition_count)
            .map(Outcome::PartitionCount),
        Command::DeleteTopic { topic } => broker.delete_topic(&topic).map(Outcome::Deleted),
        Command::DeleteGroup { topic, group } => {
            broker.delete_group(&topic, &group).map(Outcome::Deleted)
        }
        // No method of the trait: only through `apply`.
        configure @ (Command::ConfigureGroup { .. } | Command::ConfigureTopic { .. }) => {
            broker.apply(configure)
        }
        Command::Purge {
            topic,
            partition,
            before,
        } => broker.purge(&topic, partition, before).map(Outcome::Offset),
        Command::ResetGroup {
            topic,
            group,
            partitions,
            to,
        } => broker
            .reset_group(&topic, &group, partitions.as_deref(), to)
            .map(Outcome::Lag),
        Command::DeleteOffsets {
            topic,
            group,
            partitions,
        } => broker
            .delete_offsets(&topic, &group, &partitions)
            .map(Outcome::Lag),
        Command::OffsetForTime {
            topic,
            partition,
            timestamp_ms,
        } => broker
            .offset_for_time(&topic, partition, timestamp_ms)
            .map(Outcome::Offset),
        Command::CommitGroup {
            topic,
            group,
            offsets,
        } => broker
            .commit_group(&topic, &group, &offsets)
            .map(|()| Outcome::Committed),
        Command::Read {
            topic,
            partition,
            offset,
            max_records,
            max_bytes,
        } => broker
            .read(&topic, partition, offset, max_records, max_bytes)
            .map(Outcome::Read),
        Command::ClusterStatus
        | Command::GroupsStatus
        | Command::KafkaGroups
        | Command::AddNode { .. }
        | Command::RemoveNode { .. }
        | Command::TransferLeadership { .. }
        | Command::MoveTopic { .. }
        | Command::Metadata { .. } => broker.apply(command.clone()),
        Command::PublishIdempotent {
            topic,
            producer,
            batches,
        } => broker
            .publish_idempotent(&topic, producer, batches)
            .map(Outcome::PublishedBatch),
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies: tiny alphabets, so that names collide, plus some invalid values.

fn topic_id() -> impl Strategy<Value = String> {
    prop_oneof![
        20 => Just("t0".to_owned()),
        20 => Just("t1".to_owned()),
        5 => Just("t2".to_owned()),
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

/// A topic's settings: mostly none, often limits with small limits, sometimes an age, now and
/// then something that makes no sense.
fn topic_settings() -> impl Strategy<Value = Vec<TopicSetting>> {
    prop_oneof![
        4 => Just(Vec::new()),
        3 => (
            proptest::option::of(1..4_u64),
            proptest::option::of(2..12_u64),
            proptest::option::of(1..6_u64),
            any::<bool>(),
        )
            .prop_map(|(records, bytes, age, refuse)| {
                let mut list = vec![TopicSetting::Retention(Retention::Limits)];
                list.extend(records.map(TopicSetting::MaxRecords));
                list.extend(bytes.map(TopicSetting::MaxBytes));
                list.extend(age.map(TopicSetting::MaxAgeMs));
                if refuse {
                    list.push(TopicSetting::Discard(Discard::New));
                }
                list
            }),
        2 => (1..6_u64, proptest::option::of(1..4_u64)).prop_map(|(age, records)| {
            let mut list = vec![TopicSetting::MaxAgeMs(age)];
            list.extend(records.map(TopicSetting::MaxRecords));
            list
        }),
        1 => prop_oneof![
            Just(vec![TopicSetting::Discard(Discard::Old)]),
            Just(vec![TopicSetting::MaxRecords(0)]),
            Just(vec![TopicSetting::MaxBytes(1), TopicSetting::MaxBytes(2)]),
        ],
    ]
}

/// A change of a topic's settings: small limits, now and then the retention (the topic's own
/// or the other) or something that makes no sense.
fn topic_change() -> impl Strategy<Value = Vec<TopicSetting>> {
    prop_oneof![
        4 => (
            proptest::option::of(1..4_u64),
            proptest::option::of(2..12_u64),
            proptest::option::of(1..6_u64),
            proptest::option::of(any::<bool>()),
        )
            .prop_map(|(records, bytes, age, discard_old)| {
                let mut list = Vec::new();
                list.extend(records.map(TopicSetting::MaxRecords));
                list.extend(bytes.map(TopicSetting::MaxBytes));
                list.extend(age.map(TopicSetting::MaxAgeMs));
                list.extend(discard_old.map(|old| {
                    TopicSetting::Discard(if old { Discard::Old } else { Discard::New })
                }));
                list
            }),
        1 => prop_oneof![
            Just(vec![TopicSetting::Retention(Retention::Limits)]),
            Just(vec![TopicSetting::Retention(Retention::Interest)]),
            Just(vec![TopicSetting::MaxRecords(0)]),
            Just(vec![TopicSetting::MaxAgeMs(1), TopicSetting::MaxAgeMs(2)]),
        ],
    ]
}

/// A group's settings: mostly none.
fn group_settings() -> impl Strategy<Value = Vec<GroupSetting>> {
    prop_oneof![
        6 => Just(Vec::new()),
        1 => Just(vec![GroupSetting::StartAt(StartAt::Latest)]),
        2 => (1..5_u64).prop_map(|timeout| vec![GroupSetting::AckTimeoutMs(timeout)]),
        1 => Just(vec![GroupSetting::AckTimeoutMs(0)]),
    ]
}

fn headers() -> impl Strategy<Value = Vec<Header>> {
    proptest::collection::vec(
        (
            // An empty name is refused.
            prop_oneof![4 => Just("h".to_owned()), 4 => Just("trace".to_owned()), 1 => Just(String::new())],
            proptest::option::of(bytes(2)),
        )
            .prop_map(|(name, value)| Header { name, value }),
        0..2,
    )
}

fn reset_to() -> impl Strategy<Value = ResetTo> {
    prop_oneof![
        Just(ResetTo::Earliest),
        Just(ResetTo::Latest),
        (-1..8_i64).prop_map(ResetTo::Offset),
        (0..40_i64).prop_map(ResetTo::Timestamp),
        (-4..4_i64).prop_map(ResetTo::ShiftBy),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    let who = || (topic_id(), group_id(), member_id());
    prop_oneof![
        2 => (
            topic_id(),
            prop_oneof![8 => 1..5_i32, 1 => Just(0), 1 => Just(65)],
            prop_oneof![Just(KeyHash::Murmur2), Just(KeyHash::Fnv1a)],
            topic_settings(),
        )
            .prop_map(|(topic, partition_count, key_hash, settings)| Command::Create {
                topic,
                partition_count,
                key_hash,
                settings,
            }),
        5 => (who(), assignor(), group_settings()).prop_map(
            |((topic, group, member), assignor, settings)| Command::Join {
                topic,
                group,
                member,
                assignor,
                settings,
            }
        ),
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
                (
                    proptest::option::of(partition()),
                    proptest::option::of(bytes(2)),
                    bytes(3),
                    headers(),
                    proptest::option::of(0..40_i64),
                ),
                0..4,
            ),
            proptest::bool::ANY,
        )
            .prop_map(|(topic, records, until_full)| {
                let records = records
                    .into_iter()
                    .map(|(partition, key, payload, headers, timestamp_ms)| PublishRecord {
                        partition,
                        key,
                        payload,
                        headers,
                        timestamp_ms,
                    })
                    .collect();
                match until_full {
                    false => Command::PublishBatch { topic, records },
                    true => Command::PublishUntilFull { topic, records },
                }
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
        1 => (topic_id(), partition())
            .prop_map(|(topic, partition)| Command::Producers { topic, partition }),
        3 => (topic_id(), group_id())
            .prop_map(|(topic, group)| Command::StoredOffsets { topic, group }),
        4 => (topic_id(), group_id(), proptest::collection::vec(partition(), 0..3)).prop_map(
            |(topic, group, partitions)| Command::DeleteOffsets { topic, group, partitions }
        ),
        1 => (topic_id(), prop_oneof![4 => 1..6_i32, 1 => Just(0), 1 => Just(65)]).prop_map(
            |(topic, partition_count)| Command::AddPartitions { topic, partition_count }
        ),
        1 => topic_id().prop_map(|topic| Command::DeleteTopic { topic }),
        1 => (topic_id(), group_id())
            .prop_map(|(topic, group)| Command::DeleteGroup { topic, group }),
        1 => (topic_id(), group_id(), group_settings()).prop_map(|(topic, group, settings)| {
            Command::ConfigureGroup { topic, group, settings }
        }),
        1 => (topic_id(), topic_change())
            .prop_map(|(topic, settings)| Command::ConfigureTopic { topic, settings }),
        2 => (topic_id(), partition(), offset()).prop_map(|(topic, partition, before)| {
            Command::Purge { topic, partition, before }
        }),
        2 => (
            topic_id(),
            group_id(),
            proptest::option::of(proptest::collection::vec(partition(), 0..3)),
            reset_to(),
        )
            .prop_map(|(topic, group, partitions, to)| Command::ResetGroup {
                topic,
                group,
                partitions,
                to,
            }),
        1 => (topic_id(), partition(), 0..40_i64).prop_map(|(topic, partition, timestamp_ms)| {
            Command::OffsetForTime { topic, partition, timestamp_ms }
        }),
        2 => (
            topic_id(),
            group_id(),
            proptest::collection::vec((partition(), offset()), 0..3)
        )
            .prop_map(|(topic, group, offsets)| Command::CommitGroup { topic, group, offsets }),
        2 => (topic_id(), partition(), offset(), max_records(), max_bytes()).prop_map(
            |(topic, partition, offset, max_records, max_bytes)| Command::Read {
                topic,
                partition,
                offset,
                max_records,
                max_bytes,
            }
        ),
    ]
}

/// One generated step: a command as generated, or an ack or retry of the delivery the model
/// has in flight at that moment (random acks would almost never match one).
#[derive(Debug, Clone)]
enum Step {
    Raw(Command),
    /// Settles the delivery `pick`: an ack, or a retry (delayed by `delay` ms, if given).
    Settle {
        pick: usize,
        ack: bool,
        delay: Option<u64>,
    },
    /// `action` (0 poll, 1 fetch, 2 commit positions, 3 leave, 4 redeliver, 5 ack everything
    /// the member has in flight and poll) by an existing member, or 6: delete a group whose
    /// members all left.
    Member {
        pick: usize,
        action: u8,
        max_records: i32,
        max_bytes: Option<u64>,
    },
    /// An idempotent publish of `producer` to `topic`: per `(partition, back, records)`, a
    /// batch numbered from the producer's next sequence number there less `back` (a repeat,
    /// or a sequence past the next when `back` is negative). A partition may come twice.
    Produce {
        topic: String,
        producer: u64,
        batches: Vec<(i32, i64, Vec<PublishRecord>)>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => command().prop_map(Step::Raw),
        2 => (
            topic_id(),
            1..4_u64,
            proptest::collection::vec(
                (
                    partition(),
                    prop_oneof![
                        4 => Just(0_i64),
                        2 => 1..4_i64,
                        1 => Just(-1_i64),
                        1 => Just(7_i64)
                    ],
                    proptest::collection::vec(
                        (bytes(3), headers()).prop_map(|(payload, headers)| {
                            PublishRecord::keyed(None, payload).with_headers(headers)
                        }),
                        0..4,
                    ),
                ),
                1..4,
            ),
        )
            .prop_map(|(topic, producer, batches)| Step::Produce {
                topic,
                producer,
                batches,
            }),
        2 => (
            any::<usize>(),
            any::<bool>(),
            prop_oneof![2 => Just(None), 1 => (0..6_u64).prop_map(Some)]
        )
            .prop_map(|(pick, ack, delay)| Step::Settle { pick, ack, delay }),
        2 => (any::<usize>(), 0..7_u8, max_records(), max_bytes()).prop_map(
            |(pick, action, max_records, max_bytes)| Step::Member {
                pick,
                action,
                max_records,
                max_bytes,
            }
        ),
    ]
}

/// How far the clock moves before a step, in milliseconds: mostly not at all or a little, so
/// that ages and deadlines are reached now and then.
fn advance() -> impl Strategy<Value = i64> {
    prop_oneof![6 => Just(0_i64), 4 => 1..3_i64, 1 => Just(8_i64)]
}

/// The command a step stands for in the model's current state.
fn resolve(model: &Model, step: Step) -> Command {
    let (pick, ack, delay) = match step {
        Step::Raw(command) => return command,
        Step::Produce {
            topic,
            producer,
            batches,
        } => {
            let batches = batches
                .into_iter()
                .map(|(partition, back, records)| {
                    let next = usize::try_from(partition)
                        .ok()
                        .and_then(|p| model.topics.get(&topic)?.batches.get(&(producer, p)))
                        .map_or(0, |batches| {
                            batches.iter().map(Vec::len).sum::<usize>() as i64
                        });
                    PartitionBatch {
                        partition,
                        sequence: (next - back).max(0) as u64,
                        records,
                    }
                })
                .collect();
            return Command::PublishIdempotent {
                topic,
                producer,
                batches,
            };
        }
        Step::Settle { pick, ack, delay } => (pick, ack, delay),
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
    match (ack, delay) {
        (true, _) => Command::Ack {
            topic,
            group,
            member,
            partition,
            offset,
        },
        (false, None) => Command::Retry {
            topic,
            group,
            member,
            partition,
            offset,
        },
        (false, Some(delay_ms)) => Command::RetryAfter {
            topic,
            group,
            member,
            partition,
            offset,
            delay_ms,
        },
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
    if action == 6 {
        // Groups whose members all left: the ones a deletion succeeds on.
        let mut empty: Vec<(String, String)> = model
            .topics
            .iter()
            .flat_map(|(topic_name, topic)| {
                topic
                    .groups
                    .iter()
                    .filter(|(_, group)| group.members.is_empty())
                    .map(move |(group_name, _)| (topic_name.clone(), group_name.clone()))
            })
            .collect();
        let (topic, group) = match empty.len() {
            0 => ("t0".to_owned(), "g0".to_owned()),
            n => empty.swap_remove(pick % n),
        };
        return Command::DeleteGroup { topic, group };
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

/// Three topics created up front, so that most generated calls reach real state: one with the
/// default interest retention, one of FNV-1a keys, one with limits retention and an age.
fn setup() -> Vec<Command> {
    vec![
        Command::Create {
            topic: "t0".to_owned(),
            partition_count: 3,
            key_hash: KeyHash::Murmur2,
            settings: Vec::new(),
        },
        Command::Create {
            topic: "t1".to_owned(),
            partition_count: 2,
            key_hash: KeyHash::Fnv1a,
            settings: Vec::new(),
        },
        Command::Create {
            topic: "t2".to_owned(),
            partition_count: 2,
            key_hash: KeyHash::Murmur2,
            settings: vec![
                TopicSetting::Retention(Retention::Limits),
                TopicSetting::MaxRecords(3),
                TopicSetting::MaxAgeMs(6),
            ],
        },
    ]
}

// ---------------------------------------------------------------------------------------------
// Records evicted from memory.

/// A cold store in memory: what a storage layer's segment files are to the broker. Records are
/// written into it as the state reports them appended ([`BrokerState::take_appended`]), as a
/// storage layer that writes each record once does, before the state evicts them.
#[derive(Debug, Default)]
struct MemoryColdStore {
    logs: Mutex<HashMap<LogId, BTreeMap<i64, RecordImage>>>,
    /// How many times records were read.
    reads: std::sync::atomic::AtomicUsize,
    /// Records that fail to decode when read (their sizes still read).
    damaged: Mutex<Vec<(LogId, i64)>>,
}

impl MemoryColdStore {
    /// The records of `range` in `log`; every one must be there.
    fn records(&self, log: LogId, range: Range<i64>) -> Vec<RecordImage> {
        let logs = self.logs.lock().unwrap();
        let records: Vec<RecordImage> = logs[&log]
            .range(range.clone())
            .map(|(_, r)| r.clone())
            .collect();
        assert_eq!(
            records.len() as i64,
            range.end - range.start,
            "{log:?} {range:?}"
        );
        records
    }

    /// Writes the records `state` appended since the last time into the store; each offset of
    /// a log is written once.
    fn write_appended(&self, state: &mut BrokerState) {
        let mut logs = self.logs.lock().unwrap();
        for Appended {
            log,
            offset,
            record,
        } in state.take_appended()
        {
            let earlier = logs.entry(log).or_default().insert(offset, record);
            assert_eq!(earlier, None, "offset {offset} of {log:?} appended twice");
        }
    }

    /// Checks that the store holds every record `broker` holds in memory, as it holds it (each
    /// was reported appended), then has the broker evict `share` of each partition's (0 none,
    /// 1 half, 2 all).
    fn evict_from(&self, broker: &EventBroker, share: u8) {
        broker.with_state(|state| {
            self.write_appended(state);
            let image = state.to_image();
            check_image_with_records_stored(state, &image);
            let mut evicted = Vec::new();
            let logs = self.logs.lock().unwrap();
            for (name, topic) in &image.topics {
                for (number, log) in topic.partitions.iter().enumerate() {
                    let id = LogId {
                        topic: topic.id,
                        partition: number as u32,
                    };
                    for (index, record) in log.records.iter().enumerate() {
                        let offset = log.cold_end + index as i64;
                        assert_eq!(
                            logs.get(&id).and_then(|stored| stored.get(&offset)),
                            Some(record),
                            "record {offset} of {name}/{number} was not reported appended as held"
                        );
                    }
                    let count = match share {
                        0 => 0,
                        1 => log.records.len() / 2,
                        _ => log.records.len(),
                    };
                    evicted.push((id, log.cold_end + count as i64));
                }
            }
            drop(logs);
            state.evict(&evicted);
        });
    }
}

impl ColdStore for MemoryColdStore {
    fn read(
        &self,
        log: LogId,
        range: Range<i64>,
        max_bytes: Option<u64>,
    ) -> Result<Vec<RecordImage>, ColdError> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut taken = 0;
        let start = range.start;
        let read: Vec<RecordImage> = self
            .records(log, range)
            .into_iter()
            .enumerate()
            .take_while(|(index, record)| {
                taken += record.size();
                *index == 0 || max_bytes.is_none_or(|max| taken <= max)
            })
            .map(|(_, record)| record)
            .collect();
        let damaged = self.damaged.lock().unwrap();
        match (start..start + read.len() as i64).find(|&at| damaged.contains(&(log, at))) {
            Some(at) => Err(ColdError(format!("record {at} of {log:?} is damaged"))),
            None => Ok(read),
        }
    }

    fn bytes(&self, log: LogId, range: Range<i64>) -> Result<u64, ColdError> {
        Ok(self.records(log, range).iter().map(RecordImage::size).sum())
    }

    fn timestamp(&self, log: LogId, offset: i64) -> Result<i64, ColdError> {
        Ok(self.records(log, offset..offset + 1)[0].timestamp_ms)
    }

    fn first_at_or_after(
        &self,
        log: LogId,
        range: Range<i64>,
        timestamp_ms: i64,
    ) -> Result<i64, ColdError> {
        let records = self.records(log, range.clone());
        Ok(range.start + records.partition_point(|r| r.timestamp_ms < timestamp_ms) as i64)
    }

    fn first_within_bytes(
        &self,
        log: LogId,
        range: Range<i64>,
        bytes: u64,
    ) -> Result<i64, ColdError> {
        let records = self.records(log, range.clone());
        let mut kept = 0;
        let mut start = range.end;
        for record in records.iter().rev() {
            kept += record.size();
            if kept > bytes {
                break;
            }
            start -= 1;
        }
        Ok(start)
    }

    fn largest(&self, log: LogId, range: Range<i64>) -> Result<u64, ColdError> {
        Ok(self
            .records(log, range)
            .iter()
            .map(RecordImage::size)
            .max()
            .unwrap_or(0))
    }
}

/// Checks that `state`'s image with its records counted as stored is `image` (its full image)
/// with every record held in memory moved to the cold store, and names exactly those records.
fn check_image_with_records_stored(state: &BrokerState, image: &StateImage) {
    let (stored, in_memory) = state.to_image_with_records_stored();
    let mut expected = image.clone();
    let mut expected_in_memory = Vec::new();
    for (_, topic) in &mut expected.topics {
        for (number, log) in topic.partitions.iter_mut().enumerate() {
            if log.records.is_empty() {
                continue;
            }
            let moved = std::mem::take(&mut log.records);
            let id = LogId {
                topic: topic.id,
                partition: number as u32,
            };
            let end = log.cold_end + moved.len() as i64;
            expected_in_memory.push((id, log.cold_end..end));
            log.cold_end = end;
            log.cold_bytes += moved.iter().map(RecordImage::size).sum::<u64>();
        }
    }
    assert_eq!(stored, expected);
    let sorted = |mut logs: Vec<(LogId, Range<i64>)>| {
        logs.sort_by_key(|(log, _)| (log.topic, log.partition));
        logs
    };
    assert_eq!(sorted(in_memory), sorted(expected_in_memory));
}

/// Replaces `state` by a new one (reading evicted records from `store`) holding each of its
/// topics through [`BrokerState::export_topic`] and [`BrokerState::import_topic`], checking
/// that each arrives as it left.
fn move_every_topic(state: &mut BrokerState, capacity: i32, store: &Arc<MemoryColdStore>) {
    let cold: Arc<dyn ColdStore> = store.clone();
    let mut moved = BrokerState::new(capacity).unwrap().with_cold_store(cold);
    moved.record_appends(true);
    moved.advance_clock(state.clock_ms()).unwrap();
    let names: Vec<String> = state.topic_names().map(str::to_owned).collect();
    for name in names {
        let image = state.export_topic(&name).unwrap();
        moved.import_topic(&name, image.clone()).unwrap();
        let mut arrived = moved.export_topic(&name).unwrap();
        arrived.id = image.id;
        assert_eq!(arrived, image, "topic {name:?} moved");
        assert!(moved.import_topic(&name, image).is_err(), "imported twice");
    }
    assert_eq!(
        moved.to_image().retained_bytes,
        state.to_image().retained_bytes
    );
    // The new state holds every record in memory and gives ids from 0 again, as a state of
    // another group with its own store would: the store starts over with what it appended.
    store.logs.lock().unwrap().clear();
    store.write_appended(&mut moved);
    *state = moved;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// With `cold`, the broker evicts records to a cold store now and then (`evictions` says
    /// how much before each step): which records are in memory must never change an answer.
    #[test]
    fn broker_agrees_with_the_model_on_every_call(
        capacity in 1..=5_i32,
        pre_create in any::<bool>(),
        cold in any::<bool>(),
        steps in proptest::collection::vec((step(), any::<bool>(), advance(), 0..4_u8, 0..12_u8), 1..80),
    ) {
        let store = Arc::new(MemoryColdStore::default());
        let broker = if cold {
            let mut state = BrokerState::new(capacity).unwrap().with_cold_store(store.clone());
            state.record_appends(true);
            EventBroker::from_state(state)
        } else {
            EventBroker::new(capacity).unwrap()
        };
        let mut model = Model::new(capacity as u64);
        let setup = if pre_create { setup() } else { Vec::new() };
        let steps = setup.into_iter().map(|c| (Step::Raw(c), false, 0, 0, 1)).chain(steps);
        let mut now = 0;
        for (index, (step, via_apply, advance, eviction, move_all)) in steps.enumerate() {
            if cold && eviction > 0 {
                store.evict_from(&broker, eviction - 1);
            }
            if move_all == 0 {
                // Every topic moves to a new state, as to another group of a cluster: no
                // answer may change.
                broker.with_state(|state| move_every_topic(state, capacity, &store));
            }
            now += advance;
            let woken = broker.advance_clock(now).unwrap();
            prop_assert_eq!(woken, model.advance(now), "step {}: the clock at {}", index, now);
            let command = resolve(&model, step);
            let before = broker.describe();
            let expected = model.apply(&command);
            // A delivery whose records are on the cold store has them read first, as a server
            // does before it takes the lock: its answer must not change, nor need the store.
            let ahead = broker
                .with_state(|state| state.cold_reads_of(&command))
                .map(|planned| planned.read());
            let read_ahead = ahead.as_ref().is_some_and(|ahead| !ahead.is_empty());
            let installed = ahead.map(|ahead| broker.with_state(|state| state.read_ahead(ahead)));
            // A waiting request is not tried again while the state says it would find nothing.
            let may_deliver = broker.with_state(|state| state.may_deliver(&command));
            let reads_before = store.reads.load(std::sync::atomic::Ordering::Relaxed);
            let actual = Answer::from(call(&broker, &command, via_apply));
            if !may_deliver {
                let delivered = matches!(&actual, Answer::Ok(outcome) if outcome.records().is_some_and(|records| !records.is_empty()));
                prop_assert!(!delivered, "step {}: {:?} delivered {:?} where nothing was to deliver", index, command, actual);
            }
            if read_ahead {
                let reads = store.reads.load(std::sync::atomic::Ordering::Relaxed) - reads_before;
                prop_assert_eq!(reads, 0, "step {}: {:?} read the store", index, command);
            }
            if let Some(installed) = installed {
                broker.with_state(|state| state.forget_read_ahead(installed));
            }
            prop_assert_eq!(&actual, &expected, "step {}: {:?}", index, command);
            let changed_nothing = match &actual {
                Answer::Ok(outcome) => !command.kind().changed_state(outcome),
                Answer::Invalid | Answer::NotAssigned(_) => true,
            };
            if changed_nothing {
                prop_assert_eq!(&broker.describe(), &before, "step {}: an error, a read or an outcome a log skips changed state", index);
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
        settings: Vec::new(),
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
        settings: Vec::new(),
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
    // Limits retention discards the oldest record of a full partition; the group skips it.
    for payload in ["a", "b", "c", "d"] {
        let publish = Command::Publish {
            topic: "t2".to_owned(),
            partition: 0,
            payload: Bytes::from(payload),
        };
        model.apply(&publish);
    }
    let log = &model.topics["t2"].logs[0];
    assert_eq!((log.base, log.records.len()), (1, 3));
}

/// The generated sequences reach the interesting cases often enough: successful acks and
/// retries, canceled deliveries, full partitions, released records, `NotAssigned`, invalid
/// calls, records discarded by limits and age, groups that skipped them, redeliveries, expired
/// deliveries, resets, purges and deletions. Without this, agreement with the model could hide
/// behind sequences that never do anything.
#[test]
fn generated_sequences_reach_every_interesting_case() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = proptest::collection::vec((step(), advance()), 60);
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for _ in 0..300 {
        let steps = strategy.new_tree(&mut runner).unwrap().current();
        let mut model = Model::new(3);
        for command in setup() {
            model.apply(&command);
        }
        let mut now = 0;
        for (step, advance) in steps {
            now += advance;
            let in_flight_before_clock = in_flight_count(&model);
            let expired_before: i64 = bases(&model);
            model.advance(now);
            if bases(&model) > expired_before {
                *seen.entry("expired").or_default() += 1;
            }
            if in_flight_count(&model) < in_flight_before_clock {
                *seen.entry("delivery timed out").or_default() += 1;
            }
            let command = resolve(&model, step);
            let ends_before = ends(&model);
            let released_before = bases(&model);
            let skipped_before = skipped(&model);
            let in_flight_before: usize = in_flight_count(&model);
            let answer = model.apply(&command);
            let kind = match (&command, &answer) {
                (_, Answer::Invalid) => "invalid",
                (_, Answer::NotAssigned(_)) => "not assigned",
                (Command::Ack { .. }, Answer::Ok(Outcome::Acked(true))) => "ack",
                (Command::Retry { .. }, Answer::Ok(Outcome::Retried(true))) => "retry",
                (Command::RetryAfter { delay_ms, .. }, Answer::Ok(Outcome::Retried(true)))
                    if *delay_ms > 0 =>
                {
                    "retry after a delay"
                }
                (Command::AckAndPoll { .. }, Answer::Ok(Outcome::AckedAndPolled { acked, .. }))
                    if acked.contains(&true) =>
                {
                    "ack and poll"
                }
                (_, Answer::Ok(Outcome::Published(-1))) => "full",
                (
                    Command::Poll { .. } | Command::Redeliver { .. },
                    Answer::Ok(Outcome::Records(r)),
                )
                | (
                    Command::AckAndPoll { .. },
                    Answer::Ok(Outcome::AckedAndPolled { records: r, .. }),
                ) if r.iter().any(|r| r.delivery_count > 1) => "delivered again",
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
                (Command::ResetGroup { .. }, Answer::Ok(_)) => "reset",
                (Command::DeleteOffsets { .. }, Answer::Ok(Outcome::Lag(rows)))
                    if !rows.is_empty() =>
                {
                    "offsets deleted"
                }
                (Command::Purge { .. }, Answer::Ok(_)) => "purge",
                (Command::DeleteTopic { .. }, Answer::Ok(Outcome::Deleted(true))) => {
                    "topic deleted"
                }
                (Command::DeleteGroup { .. }, Answer::Ok(Outcome::Deleted(true))) => {
                    "group deleted"
                }
                (Command::AddPartitions { .. }, Answer::Ok(_)) => "partitions added",
                (
                    Command::PublishIdempotent { .. },
                    Answer::Ok(Outcome::PublishedBatch(placed)),
                ) if !placed.is_empty() && ends(&model) == ends_before => "produced again",
                (
                    Command::PublishIdempotent { .. },
                    Answer::Ok(Outcome::PublishedBatch(placed)),
                ) if !placed.is_empty() => "produced",
                (Command::Producers { .. }, Answer::Ok(Outcome::Producers(states)))
                    if states.iter().any(|state| state.last_offset.is_some()) =>
                {
                    "producers listed"
                }
                (Command::StoredOffsets { .. }, Answer::Ok(Outcome::StoredOffsets(offsets)))
                    if offsets.iter().any(Option::is_some) =>
                {
                    "stored offsets listed"
                }
                _ => "other",
            };
            *seen.entry(kind).or_default() += 1;
            if bases(&model) > released_before {
                *seen.entry("released").or_default() += 1;
            }
            if skipped(&model) > skipped_before {
                *seen.entry("skipped").or_default() += 1;
            }
            if matches!(command, Command::Join { .. } | Command::Leave { .. })
                && in_flight_count(&model) < in_flight_before
            {
                *seen.entry("canceled by rebalance").or_default() += 1;
            }
        }
    }
    for (kind, at_least) in [
        ("invalid", 10),
        ("not assigned", 10),
        ("ack", 10),
        ("retry", 10),
        ("retry after a delay", 10),
        ("ack and poll", 10),
        ("full", 10),
        ("poll", 10),
        ("delivered again", 10),
        ("redeliver", 10),
        ("fetch", 10),
        ("commit", 10),
        ("leave", 10),
        ("released", 10),
        ("canceled by rebalance", 10),
        ("expired", 10),
        ("skipped", 10),
        ("delivery timed out", 5),
        ("reset", 10),
        ("purge", 10),
        ("topic deleted", 5),
        ("group deleted", 5),
        ("partitions added", 5),
        ("produced", 10),
        ("produced again", 10),
        ("producers listed", 5),
        ("stored offsets listed", 5),
        ("offsets deleted", 3),
    ] {
        assert!(
            seen.get(kind).copied().unwrap_or(0) >= at_least,
            "{kind} too rare: {seen:?}"
        );
    }
}

/// The sum of every partition's end offset.
fn ends(model: &Model) -> i64 {
    model
        .topics
        .values()
        .flat_map(|t| &t.logs)
        .map(ModelLog::end)
        .sum()
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

/// The sum of every partition's earliest retained offset: it grows when records leave.
fn bases(model: &Model) -> i64 {
    model
        .topics
        .values()
        .flat_map(|t| &t.logs)
        .map(|l| l.base)
        .sum()
}

/// Records skipped by every group.
fn skipped(model: &Model) -> u64 {
    model
        .topics
        .values()
        .flat_map(|t| t.groups.values())
        .flat_map(|g| &g.skipped)
        .sum()
}

/// A read begun with the state and finished without it answers as the read would have when
/// it began, whatever the state did meanwhile (more records, more of them evicted), records in
/// the cold store and in memory alike, within the byte budget.
#[test]
fn a_read_finished_after_the_state_changed_answers_as_when_it_began() {
    let store = Arc::new(MemoryColdStore::default());
    let broker = EventBroker::from_state(
        BrokerState::new(100)
            .unwrap()
            .with_cold_store(store.clone()),
    );
    broker
        .with_state(|state| {
            state.record_appends(true);
            let limits = [TopicSetting::Retention(Retention::Limits)];
            state.create("t", 1, KeyHash::default(), &limits)
        })
        .unwrap();
    for n in 0..10 {
        broker
            .publish("t", 0, format!("record {n}").into_bytes())
            .unwrap();
    }
    // Half of them on the cold store, half in memory.
    store.evict_from(&broker, 1);
    let begin = |offset| {
        broker
            .with_state(|state| state.begin_read("t", 0, offset, 10, None))
            .unwrap()
    };
    assert!(begin(4).reads_cold_store());
    assert!(!begin(5).reads_cold_store());
    for (offset, max_records, max_bytes) in
        [(0, 10, None), (2, 6, None), (7, 3, None), (1, 10, Some(20))]
    {
        let expected = broker
            .with_state(|state| state.read("t", 0, offset, max_records, max_bytes))
            .unwrap();
        let pending = broker
            .with_state(|state| state.begin_read("t", 0, offset, max_records, max_bytes))
            .unwrap();
        for n in 10..13 {
            broker
                .publish("t", 0, format!("record {n}").into_bytes())
                .unwrap();
        }
        store.evict_from(&broker, 2);
        assert_eq!(pending.finish().unwrap(), expected, "from {offset}");
    }
}

/// A broker of capacity 100 evicting to a cold store in memory, with a topic "t" of
/// `partitions` partitions under limits retention and member "m" of group "g".
fn cold_broker_with_member(partitions: i32) -> (Arc<MemoryColdStore>, EventBroker) {
    let store = Arc::new(MemoryColdStore::default());
    let broker = EventBroker::from_state(
        BrokerState::new(100)
            .unwrap()
            .with_cold_store(store.clone()),
    );
    broker
        .with_state(|state| {
            state.record_appends(true);
            let limits = [TopicSetting::Retention(Retention::Limits)];
            state.create("t", partitions, KeyHash::default(), &limits)?;
            state.join("t", "g", "m", None, &[]).map(drop)
        })
        .unwrap();
    (store, broker)
}

/// Records read ahead for a delivery are only a guess: when the state moved on before the
/// delivery is applied (another fetch took them, the topic moved to another state), the
/// delivery answers exactly as it would have without them, reading what it needs from the
/// cold store.
#[test]
fn deliveries_answer_the_same_whatever_was_read_ahead() {
    let (store, broker) = cold_broker_with_member(2);
    for n in 0..20 {
        broker
            .publish("t", n % 2, format!("record {n}").into_bytes())
            .unwrap();
    }
    store.evict_from(&broker, 1);
    let fetch = Command::Fetch {
        topic: "t".into(),
        group: "g".into(),
        member: "m".into(),
        max_records: 4,
        max_bytes: Some(40),
    };
    let reads = || store.reads.load(std::sync::atomic::Ordering::Relaxed);
    let read_ahead = || {
        broker
            .with_state(|state| state.cold_reads_of(&fetch))
            .expect("the next records are on the cold store")
            .read()
    };
    // Exact: the fetch takes every record from what was read ahead.
    let ahead = read_ahead();
    assert_eq!(ahead.len(), 4);
    let expected = broker.with_state(|state| state.clone().apply(fetch.clone()));
    let before = reads();
    let at = broker.with_state(|state| state.read_ahead(ahead));
    let fetched = broker.apply(fetch.clone());
    broker.with_state(|state| state.forget_read_ahead(at));
    assert_eq!(fetched, expected);
    assert_eq!(reads(), before);
    // Stale: another fetch took those records first; this one reads on from the store.
    let ahead = read_ahead();
    broker.apply(fetch.clone()).unwrap();
    let expected = broker.with_state(|state| state.clone().apply(fetch.clone()));
    let at = broker.with_state(|state| state.read_ahead(ahead));
    let before = reads();
    let fetched = broker.apply(fetch.clone());
    broker.with_state(|state| state.forget_read_ahead(at));
    assert_eq!(fetched, expected);
    assert!(reads() > before);
    // Moved: the topic's logs are new ones; what was read ahead of the old ones is dropped.
    let ahead = read_ahead();
    broker.with_state(|state| move_every_topic(state, 100, &store));
    let expected = broker.with_state(|state| state.clone().apply(fetch.clone()));
    let at = broker.with_state(|state| state.read_ahead(ahead));
    let fetched = broker.apply(fetch.clone());
    broker.with_state(|state| state.forget_read_ahead(at));
    assert_eq!(fetched, expected);
    // Nothing on the cold store: nothing to read ahead.
    store.evict_from(&broker, 0);
    broker.apply(fetch.clone()).unwrap();
    broker.apply(fetch.clone()).unwrap();
    assert!(broker
        .with_state(|state| state.cold_reads_of(&fetch))
        .is_none());
}

/// A read of records on the cold store can have them read ahead too (a cluster applies reads
/// from its log), and takes them from what was read, answering exactly as without.
#[test]
fn a_read_takes_its_records_from_what_was_read_ahead() {
    let (store, broker) = cold_broker_with_member(1);
    for n in 0..10 {
        broker
            .publish("t", 0, format!("record {n}").into_bytes())
            .unwrap();
    }
    store.evict_from(&broker, 2);
    let reads = || store.reads.load(std::sync::atomic::Ordering::Relaxed);
    for (offset, max_records, max_bytes) in [(0, 10, None), (3, 4, None), (0, 10, Some(30))] {
        let read = Command::Read {
            topic: "t".into(),
            partition: 0,
            offset,
            max_records,
            max_bytes,
        };
        let expected = broker.with_state(|state| state.clone().apply(read.clone()));
        let ahead = broker
            .with_state(|state| state.cold_reads_of(&read))
            .expect("the records are on the cold store")
            .read();
        assert!(!ahead.is_empty());
        let before = reads();
        let at = broker.with_state(|state| state.read_ahead(ahead));
        let answered = broker.apply(read.clone());
        broker.with_state(|state| state.forget_read_ahead(at));
        assert_eq!(answered, expected, "from {offset}");
        assert_eq!(reads(), before, "from {offset}: read from the store");
    }
    // Past the end, or a count the read refuses: nothing to read ahead.
    for (offset, max_records) in [(11, 10), (0, 0)] {
        let read = Command::Read {
            topic: "t".into(),
            partition: 0,
            offset,
            max_records,
            max_bytes: None,
        };
        assert!(broker
            .with_state(|state| state.cold_reads_of(&read))
            .is_none());
    }
}

/// A poll reads ahead only the records its byte budget takes (the first always, each whole),
/// not one per partition it owns: a poll of many partitions of large records with a small
/// budget reads one of them, and answers exactly as it would have.
#[test]
fn a_poll_reads_ahead_only_what_its_byte_budget_takes() {
    let (store, broker) = cold_broker_with_member(8);
    for partition in 0..8 {
        broker.publish("t", partition, vec![b'x'; 1000]).unwrap();
    }
    store.evict_from(&broker, 2);
    let poll = |max_bytes| Command::Poll {
        topic: "t".into(),
        group: "g".into(),
        member: "m".into(),
        max_records: 8,
        max_bytes,
    };
    for (max_bytes, records) in [(Some(10), 1), (Some(2100), 2), (Some(3200), 3), (None, 8)] {
        let poll = poll(max_bytes);
        let ahead = broker
            .with_state(|state| state.cold_reads_of(&poll))
            .expect("the next records are on the cold store")
            .read();
        assert_eq!(ahead.len(), records, "a budget of {max_bytes:?}");
        let expected = broker.with_state(|state| state.clone().apply(poll.clone()));
        let at = broker.with_state(|state| state.read_ahead(ahead));
        let polled = broker.with_state(|state| state.clone().apply(poll.clone()));
        broker.with_state(|state| state.forget_read_ahead(at));
        assert_eq!(polled, expected);
        assert_eq!(
            polled.unwrap().records().map(<[_]>::len),
            Some(records),
            "a budget of {max_bytes:?}"
        );
    }
}

/// A poll's records in memory spend its byte budget before those it would read ahead: with
/// its first record in memory, a record on the cold store its budget has no room for after it
/// is not read ahead (it is not the poll's first, which comes whatever the budget).
#[test]
fn a_polls_records_in_memory_spend_its_budget_before_those_read_ahead() {
    let (store, broker) = cold_broker_with_member(4);
    for partition in 1..4 {
        broker.publish("t", partition, vec![b'x'; 1000]).unwrap();
    }
    store.evict_from(&broker, 2);
    broker.publish("t", 0, vec![b'y'; 1000]).unwrap();
    let poll = |max_bytes| Command::Poll {
        topic: "t".into(),
        group: "g".into(),
        member: "m".into(),
        max_records: 4,
        max_bytes,
    };
    for (max_bytes, read_ahead, polled) in [(Some(10), 0, 1), (Some(2100), 1, 2), (None, 3, 4)] {
        let poll = poll(max_bytes);
        let ahead = broker
            .with_state(|state| state.cold_reads_of(&poll))
            .expect("records are on the cold store")
            .read();
        assert_eq!(ahead.len(), read_ahead, "a budget of {max_bytes:?}");
        let answered = broker.with_state(|state| state.clone().apply(poll.clone()));
        assert_eq!(
            answered.unwrap().records().map(<[_]>::len),
            Some(polled),
            "a budget of {max_bytes:?}"
        );
    }
}

/// A record just past a delivery's byte budget is never read, so its damage cannot fail the
/// delivery, with its records read ahead or not: reading ahead takes only its size.
#[test]
fn reading_ahead_never_reads_the_record_past_the_budget() {
    let (store, broker) = cold_broker_with_member(1);
    for n in 0..4 {
        broker
            .publish("t", 0, format!("record {n}").into_bytes())
            .unwrap();
    }
    store.evict_from(&broker, 2);
    let id = broker.with_state(|state| state.to_image().topics[0].1.id);
    let log = LogId {
        topic: id,
        partition: 0,
    };
    store.damaged.lock().unwrap().push((log, 1));
    // "record 0" takes 8 bytes: a budget of 10 takes it alone.
    let fetch = Command::Fetch {
        topic: "t".into(),
        group: "g".into(),
        member: "m".into(),
        max_records: 4,
        max_bytes: Some(10),
    };
    let without = broker.with_state(|state| state.clone().apply(fetch.clone()));
    assert!(matches!(&without, Ok(Outcome::Records(records)) if records.len() == 1));
    let ahead = broker
        .with_state(|state| state.cold_reads_of(&fetch))
        .unwrap()
        .read();
    assert_eq!(ahead.len(), 1);
    let reads = store.reads.load(std::sync::atomic::Ordering::Relaxed);
    let at = broker.with_state(|state| state.read_ahead(ahead));
    let fetched = broker.apply(fetch.clone());
    broker.with_state(|state| state.forget_read_ahead(at));
    assert_eq!(fetched, without);
    assert_eq!(
        store.reads.load(std::sync::atomic::Ordering::Relaxed),
        reads
    );
}
