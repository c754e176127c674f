//! Topics and publishing: creating a topic, placing a record on a partition (explicitly, by
//! key or round-robin) and appending it within the partition's capacity and the memory budget.

use std::collections::HashMap;

use bytes::Bytes;

use super::group::Group;
use super::log::{PartitionLog, StoredRecord};
use super::retention::Memory;
use super::{topic_in, BrokerState};
use crate::validate::{check_batch_len, check_identifier, check_partition_count};
use crate::{hash, BrokerError, KeyHash, PublishRecord};

/// A topic: its partitions' logs and its consumer groups.
#[derive(Debug, Clone)]
pub(super) struct Topic {
    pub(super) key_hash: KeyHash,
    /// Where the next keyless publish goes; advances on every keyless publish, full or not.
    pub(super) next_keyless: usize,
    pub(super) partitions: Vec<PartitionLog>,
    pub(super) groups: HashMap<String, Group>,
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
        let size = record.size();
        memory.retained += size;
        let offset = log.push(record, size);
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
}

impl BrokerState {
    /// See [`crate::EventBroker::create_with`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::create`].
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
        let topic = topic_in(&mut self.topics, topic)?;
        let partition = topic.partition(partition)?;
        Ok(topic.append(
            partition,
            self.capacity,
            &mut self.memory,
            StoredRecord { key: None, payload },
        ))
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

    /// See [`crate::EventBroker::publish_batch`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::publish_batch`].
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
}
