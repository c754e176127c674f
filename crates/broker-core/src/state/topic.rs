//! Topics and publishing: creating a topic (with its retention), giving it more partitions,
//! deleting it, purging a partition; placing a record on a partition (explicitly, by key or
//! round-robin) and appending it within the topic's limits and the memory budget.

use std::collections::HashMap;

use bytes::Bytes;

use super::group::{Group, GroupPartition};
use super::idempotence::Producer;
use super::log::{PartitionLog, StoredRecord};
use super::memory::{Held, Memory};
use super::{topic_in, BrokerState};
use crate::cold::{Appended, LogId};
use crate::image::RecordImage;
use crate::validate::{
    check_batch_len, check_headers, check_offset, check_partition_count, NameRules,
};
use crate::{
    hash, BrokerError, Discard, KeyHash, PublishRecord, Retention, TopicSetting, TopicSettings,
};

/// A topic: its partitions' logs and its consumer groups.
#[derive(Debug, Clone)]
pub(super) struct Topic {
    /// Unique among every topic the broker ever had: names its logs in a cold store.
    pub(super) id: u64,
    pub(super) key_hash: KeyHash,
    /// How its partitions retain records.
    pub(super) settings: TopicSettings,
    /// Where the next keyless publish goes; advances on every keyless publish, full or not.
    pub(super) next_keyless: usize,
    pub(super) partitions: Vec<PartitionLog>,
    pub(super) groups: HashMap<String, Group>,
    /// The idempotent producers that published to it, by id.
    pub(super) producers: HashMap<u64, Producer>,
}

impl Topic {
    /// `partition` as an index, if the topic has it.
    #[inline]
    pub(super) fn partition(&self, partition: i32) -> Result<usize, BrokerError> {
        if partition >= 0 && (partition as usize) < self.partitions.len() {
            Ok(partition as usize)
        } else {
            Err(BrokerError::invalid(format!(
                "partition {partition} does not exist: the topic has partitions 0 to {}",
                self.partitions.len() - 1
            )))
        }
    }

    /// Appends `record` to `partition` within the topic's retention at `now_ms` (its time is
    /// the producer's or `now_ms`, never later than `now_ms` nor earlier than the last
    /// record's): the new offset, or `-1` when the record cannot be kept (the partition is full
    /// and refuses new records, the record is larger than the partition's byte limit, or it
    /// would take `memory` past its budget). Records too old for the topic leave first; with
    /// limits retention the oldest leave to make room. A record that every group has already
    /// committed past (a group may commit up to the end) is consumed as soon as it exists, so it
    /// is released at once. With `appended` (see [`BrokerState::record_appends`]) the record is
    /// noted there with its offset.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if evicted records had to be read and could not be.
    pub(super) fn append(
        &mut self,
        partition: usize,
        default_capacity: u64,
        memory: &mut Memory,
        now_ms: i64,
        mut record: StoredRecord,
        appended: &mut Option<Vec<Appended>>,
    ) -> Result<i64, BrokerError> {
        memory.remove(self.expire(partition, now_ms)?);
        let settings = self.settings;
        let capacity = match settings.retention {
            Retention::Interest => Some(settings.max_records.unwrap_or(default_capacity)),
            Retention::Limits => settings.max_records,
        };
        let size = record.size();
        let discard_makes_room = memory.rules.discard_makes_room;
        if settings.max_bytes.is_some_and(|max| size > max)
            || (!discard_makes_room && !memory.fits(size, Held::default()))
        {
            return Ok(-1);
        }
        let log = &self.partitions[partition];
        let over_count = capacity.is_some_and(|capacity| log.len() >= capacity);
        let over_bytes = settings
            .max_bytes
            .is_some_and(|max| log.retained_bytes() + size > max);
        let mut keep_from = None;
        if over_count || over_bytes {
            if settings.discard == Discard::New {
                return Ok(-1);
            }
            // The oldest records leave: as many as the count and the bytes need to make room
            // for this one (a capacity is at least 1, and `size` is within the byte limit).
            keep_from = Some(self.first_to_keep(
                partition,
                capacity.map(|capacity| capacity - 1),
                settings.max_bytes.map(|max| max - size),
            )?);
        }
        if discard_makes_room {
            // Within the budget once the records that make room have left: a discard that
            // cannot make enough room takes nothing away.
            let leaving = match keep_from {
                Some(keep_from) => self.partitions[partition].held_below(keep_from)?,
                None => Held::default(),
            };
            if !memory.fits(size, leaving) {
                return Ok(-1);
            }
        }
        if let Some(keep_from) = keep_from {
            memory.remove(self.discard_below(partition, keep_from)?);
        }
        let log = &mut self.partitions[partition];
        record.timestamp_ms = log.next_timestamp(record.timestamp_ms, now_ms);
        memory.add(Held {
            bytes: size,
            records: 1,
        });
        let noted = appended.is_some().then(|| RecordImage::from(&record));
        let offset = log.push(record, size);
        if let (Some(appended), Some(record)) = (appended, noted) {
            appended.push(Appended {
                log: LogId {
                    topic: self.id,
                    partition: partition as u32,
                },
                offset,
                record,
            });
        }
        if !self.groups.is_empty() {
            memory.remove(self.release(partition)?);
        }
        Ok(offset)
    }

    /// The first offset of `partition` to keep so that at most `records` records and `bytes`
    /// bytes remain (`None`: no such limit).
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the sizes of evicted records cannot be read.
    fn first_to_keep(
        &self,
        partition: usize,
        records: Option<u64>,
        bytes: Option<u64>,
    ) -> Result<i64, BrokerError> {
        let log = &self.partitions[partition];
        let mut keep_from = log.base;
        if let Some(records) = records {
            let records = i64::try_from(records).unwrap_or(i64::MAX);
            keep_from = keep_from.max(log.end().saturating_sub(records));
        }
        if let Some(bytes) = bytes {
            keep_from = keep_from.max(log.first_within_bytes(bytes)?);
        }
        Ok(keep_from)
    }

    /// Brings `partition` within the topic's settings at `now_ms`, as they are after a change:
    /// records past the maximum age leave, and with limits retention that discards old records
    /// the oldest leave until the count and byte limits hold. Otherwise a partition past a
    /// lowered limit keeps its records and refuses new ones until consumers (or age) make
    /// room. Returns what left.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the times or sizes of evicted records cannot be read.
    fn enforce_settings(&mut self, partition: usize, now_ms: i64) -> Result<Held, BrokerError> {
        let mut freed = self.expire(partition, now_ms)?;
        let settings = self.settings;
        if settings.retention == Retention::Limits && settings.discard == Discard::Old {
            let keep_from =
                self.first_to_keep(partition, settings.max_records, settings.max_bytes)?;
            freed += self.discard_below(partition, keep_from)?;
        }
        Ok(freed)
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
}

impl BrokerState {
    /// See [`crate::EventBroker::create_topic`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::create_topic`], with the broker's own partition limit
    /// ([`super::Limits::max_partitions`]).
    pub fn create(
        &mut self,
        topic: &str,
        partition_count: i32,
        key_hash: KeyHash,
        settings: &[TopicSetting],
    ) -> Result<bool, BrokerError> {
        self.create_named(self.names, topic, partition_count, key_hash, settings)
    }

    /// [`BrokerState::create`] with the topic's name checked by `names` rather than the
    /// state's own rules.
    pub(super) fn create_named(
        &mut self,
        names: NameRules,
        topic: &str,
        partition_count: i32,
        key_hash: KeyHash,
        settings: &[TopicSetting],
    ) -> Result<bool, BrokerError> {
        names.check("topic", topic)?;
        check_partition_count(partition_count, self.limits.max_partitions)?;
        let settings = TopicSettings::from_list(settings)?;
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
                id: self.next_topic_id,
                key_hash,
                settings,
                next_keyless: 0,
                partitions: vec![PartitionLog::default(); partition_count as usize],
                groups: HashMap::new(),
                producers: HashMap::new(),
            },
        );
        self.next_topic_id += 1;
        Ok(true)
    }

    /// Changes the settings of an existing `topic`: those `settings` names, the others as they
    /// are ([`TopicSettings::changed`]); its retention, interest or limits, cannot change.
    /// The new settings hold at once: records past a lowered maximum age leave now, and with
    /// limits retention that discards old records, the oldest leave until a lowered count or
    /// byte limit holds (groups that had not consumed them skip them). With interest retention
    /// or discard new, a partition past a lowered limit loses nothing: it refuses new records
    /// until consumers (or age) make room. Returns the topic's settings now.
    ///
    /// # Errors
    /// `InvalidArgument` for an unknown topic or settings [`TopicSettings::changed`] refuses;
    /// [`BrokerError::Storage`] if evicted records had to be read and could not be.
    pub fn configure_topic(
        &mut self,
        topic: &str,
        settings: &[TopicSetting],
    ) -> Result<Vec<TopicSetting>, BrokerError> {
        let now = self.clock_ms;
        let existing = topic_in(&mut self.topics, self.names, topic)?;
        let wanted = existing.settings.changed(settings)?;
        existing.settings = wanted;
        for partition in 0..existing.partitions.len() {
            self.memory
                .remove(existing.enforce_settings(partition, now)?);
        }
        Ok(wanted.to_list())
    }

    /// See [`crate::EventBroker::add_partitions`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::add_partitions`].
    pub fn add_partitions(
        &mut self,
        topic: &str,
        partition_count: i32,
    ) -> Result<i32, BrokerError> {
        let max = self.limits.max_partitions;
        let topic_name = topic;
        let topic = topic_in(&mut self.topics, self.names, topic)?;
        check_partition_count(partition_count, max)?;
        let current = topic.partitions.len();
        let wanted = partition_count as usize;
        if wanted < current {
            return Err(BrokerError::invalid(format!(
                "the topic has {current} partitions; partitions are never removed"
            )));
        }
        if wanted == current {
            return Ok(partition_count);
        }
        topic.partitions.resize_with(wanted, PartitionLog::default);
        for group in topic.groups.values_mut() {
            let previous = group.owner_ids();
            group
                .partitions
                .resize_with(wanted, || GroupPartition::starting_at(0));
            let mut previous = previous;
            previous.resize(wanted, None);
            group.rebalance(&previous);
        }
        if self.rules.exhausted_on_every_release {
            // A partition that changed owner released its delivery, as when members change.
            let mut groups: Vec<String> = self.topics[topic_name].groups.keys().cloned().collect();
            // In name order, the same on every replica.
            groups.sort_unstable();
            for group in groups {
                self.dead_letter_group(topic_name, &group)?;
            }
        }
        Ok(partition_count)
    }

    /// See [`crate::EventBroker::delete_topic`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::delete_topic`].
    pub fn delete_topic(&mut self, topic: &str) -> Result<bool, BrokerError> {
        self.names.check("topic", topic)?;
        let Some(removed) = self.topics.remove(topic) else {
            return Ok(false);
        };
        for log in &removed.partitions {
            self.memory.remove(Held {
                bytes: log.retained_bytes(),
                records: log.len(),
            });
        }
        Ok(true)
    }

    /// See [`crate::EventBroker::purge`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::purge`].
    pub fn purge(&mut self, topic: &str, partition: i32, before: i64) -> Result<i64, BrokerError> {
        check_offset(before)?;
        let topic = topic_in(&mut self.topics, self.names, topic)?;
        let partition = topic.partition(partition)?;
        let end = topic.partitions[partition].end();
        let freed = topic.discard_below(partition, before.min(end))?;
        self.memory.remove(freed);
        Ok(topic.partitions[partition].base)
    }

    /// See [`crate::EventBroker::publish`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::publish`].
    pub fn publish(
        &mut self,
        topic: &str,
        partition: i32,
        payload: Bytes,
    ) -> Result<i64, BrokerError> {
        let now = self.clock_ms;
        let topic = topic_in(&mut self.topics, self.names, topic)?;
        let partition = topic.partition(partition)?;
        topic.append(
            partition,
            self.capacity,
            &mut self.memory,
            now,
            StoredRecord::new(None, payload, Vec::new(), now),
            &mut self.appended,
        )
    }

    /// See [`crate::EventBroker::publish_keyed`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::publish_keyed`].
    pub fn publish_keyed(
        &mut self,
        topic: &str,
        key: Option<Bytes>,
        payload: Bytes,
    ) -> Result<(i32, i64), BrokerError> {
        let now = self.clock_ms;
        let topic = topic_in(&mut self.topics, self.names, topic)?;
        let partition = topic.partition_for_key(key.as_ref());
        let offset = topic.append(
            partition,
            self.capacity,
            &mut self.memory,
            now,
            StoredRecord::new(key, payload, Vec::new(), now),
            &mut self.appended,
        )?;
        Ok((partition as i32, offset))
    }

    /// See [`crate::EventBroker::publish_batch`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::publish_batch`].
    pub fn publish_batch(
        &mut self,
        topic: &str,
        records: Vec<PublishRecord>,
    ) -> Result<Vec<(i32, i64)>, BrokerError> {
        self.publish_records(topic, records, false)
    }

    /// See [`crate::EventBroker::publish_until_full`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::publish_batch`].
    pub fn publish_until_full(
        &mut self,
        topic: &str,
        records: Vec<PublishRecord>,
    ) -> Result<Vec<(i32, i64)>, BrokerError> {
        self.publish_records(topic, records, true)
    }

    /// Publishes `records` in order, each on its own, or with `until_full` none after the
    /// first its partition refused.
    fn publish_records(
        &mut self,
        topic: &str,
        records: Vec<PublishRecord>,
        until_full: bool,
    ) -> Result<Vec<(i32, i64)>, BrokerError> {
        check_batch_len(records.len())?;
        self.reserve_appended(records.len());
        let now = self.clock_ms;
        let topic = topic_in(&mut self.topics, self.names, topic)?;
        for record in &records {
            if let Some(partition) = record.partition {
                topic.partition(partition)?;
            }
            check_headers(&record.headers)?;
        }
        // With `until_full`, whether each partition refused a record of this batch.
        let mut refused = match until_full {
            true => vec![false; topic.partitions.len()],
            false => Vec::new(),
        };
        records
            .into_iter()
            .map(
                |PublishRecord {
                     partition,
                     key,
                     payload,
                     headers,
                     timestamp_ms,
                 }| {
                    let partition = match partition {
                        Some(partition) => partition as usize,
                        None => topic.partition_for_key(key.as_ref()),
                    };
                    if refused.get(partition).copied().unwrap_or(false) {
                        return Ok((partition as i32, -1));
                    }
                    let stored =
                        StoredRecord::new(key, payload, headers, timestamp_ms.unwrap_or(now));
                    let offset = topic.append(
                        partition,
                        self.capacity,
                        &mut self.memory,
                        now,
                        stored,
                        &mut self.appended,
                    )?;
                    if offset < 0 {
                        if let Some(refused) = refused.get_mut(partition) {
                            *refused = true;
                        }
                    }
                    Ok((partition as i32, offset))
                },
            )
            .collect()
    }
}
