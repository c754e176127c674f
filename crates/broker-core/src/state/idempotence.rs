//! Idempotent publishing: a producer numbers its records per partition, and a record it sends
//! again (after a timeout or a lost connection) is answered with the offset it got the first
//! time instead of being stored twice, as Kafka's idempotent producer and NATS's message ids
//! de-duplicate.
//!
//! Per topic and producer, per partition, the state keeps the next sequence number it expects
//! and where the producer's last [`RECENT_BATCHES`] batches there were stored, which answers a
//! repeated batch: a batch's records are stored at consecutive offsets, so a batch is three
//! numbers whatever its size. A producer sends its batches of one partition in order, at most
//! that many at once. The topic keeps at most [`MAX_PRODUCERS`] producers: past it, the one that
//! published least recently is forgotten (its next batch starts afresh, as a new producer's
//! would).

use std::collections::{BTreeMap, VecDeque};

use super::log::StoredRecord;
use super::{topic_in, BrokerState};
use crate::validate::{check_batch_len, check_headers};
use crate::{BrokerError, PartitionBatch, ProducerState, PublishRecord};

/// How many of a producer's batches per partition can be answered again.
pub const RECENT_BATCHES: usize = 5;

/// How many producers a topic remembers.
pub const MAX_PRODUCERS: usize = 10_000;

/// What a topic remembers of one producer.
#[derive(Debug, Clone, Default)]
pub(super) struct Producer {
    /// The broker's clock when it last published.
    pub(super) last_seen_ms: i64,
    /// By partition index. A B-tree: a publish looks up every partition it names, and
    /// comparing a few integers costs less than hashing one.
    pub(super) partitions: BTreeMap<usize, Sequences>,
}

/// A producer's progress on one partition.
#[derive(Debug, Clone, Default)]
pub(super) struct Sequences {
    /// The sequence number its next new record must have.
    pub(super) next: u64,
    /// Its last batches that stored records, oldest first.
    pub(super) recent: VecDeque<RecentBatch>,
}

/// Where one batch of a producer's records was stored on a partition: its records (numbered
/// from `first_sequence`) at the `stored` consecutive offsets from `first_offset`. Records of a
/// batch refused because the partition was full are not part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RecentBatch {
    pub(super) first_sequence: u64,
    pub(super) first_offset: i64,
    pub(super) stored: u64,
}

impl RecentBatch {
    /// The offset of the record numbered `sequence`, if it is one of this batch's.
    fn offset_of(&self, sequence: u64) -> Option<i64> {
        let index = sequence.checked_sub(self.first_sequence)?;
        if index >= self.stored {
            return None;
        }
        self.first_offset.checked_add(i64::try_from(index).ok()?)
    }

    /// The offset of its last record (`None` for a batch that stored none).
    fn last_offset(&self) -> Option<i64> {
        let last = i64::try_from(self.stored.checked_sub(1)?).ok()?;
        self.first_offset.checked_add(last)
    }

    /// The offset of each of its records, in order.
    pub(super) fn offsets(self) -> impl Iterator<Item = i64> {
        let stored = i64::try_from(self.stored).unwrap_or(i64::MAX);
        (0..stored).map_while(move |index| self.first_offset.checked_add(index))
    }
}

impl Sequences {
    /// The offset the record of sequence number `sequence` was stored at, if it is one of the
    /// recent batches'.
    fn offset_of(&self, sequence: u64) -> Option<i64> {
        self.recent
            .iter()
            .find_map(|batch| batch.offset_of(sequence))
    }
}

/// What checking one batch of an idempotent publish found: its partition's index, and the
/// offsets of its records that were stored before.
struct Checked {
    index: usize,
    repeated: Vec<(i32, i64)>,
}

impl BrokerState {
    /// See [`crate::EventBroker::producers`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::producers`].
    pub fn producers(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Vec<ProducerState>, BrokerError> {
        let topic = self.topic(topic)?;
        let index = topic.partition(partition)?;
        let mut producers: Vec<ProducerState> = topic
            .producers
            .iter()
            .filter_map(|(&producer, state)| {
                let sequences = state.partitions.get(&index)?;
                Some(ProducerState {
                    producer,
                    next_sequence: sequences.next,
                    last_offset: sequences
                        .recent
                        .back()
                        .and_then(|batch| batch.last_offset()),
                    last_seen_ms: state.last_seen_ms,
                })
            })
            .collect();
        producers.sort_unstable_by_key(|state| state.producer);
        Ok(producers)
    }

    /// See [`crate::EventBroker::publish_idempotent`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::publish_idempotent`].
    pub fn publish_idempotent(
        &mut self,
        topic: &str,
        producer: u64,
        batches: Vec<PartitionBatch>,
    ) -> Result<Vec<(i32, i64)>, BrokerError> {
        let records = batches.iter().map(|batch| batch.records.len()).sum();
        check_batch_len(records)?;
        self.reserve_appended(records);
        let now = self.clock_ms;
        let capacity = self.capacity;
        let topic = topic_in(&mut self.topics, self.names, topic)?;
        // Every batch is checked before anything is published: all or nothing.
        let mut checked: Vec<Checked> = Vec::with_capacity(batches.len());
        let mut named = vec![false; topic.partitions.len()];
        let known = topic.producers.get(&producer);
        for batch in &batches {
            let index = topic.partition(batch.partition)?;
            if std::mem::replace(&mut named[index], true) {
                return Err(BrokerError::invalid(format!(
                    "partition {} is named twice",
                    batch.partition
                )));
            }
            checked.push(Checked {
                index,
                repeated: check_batch(known, producer, index, batch)?,
            });
        }
        if batches.is_empty() {
            // Nothing to store: nothing changes, and no other producer is forgotten for it.
            return Ok(Vec::new());
        }
        if !topic.producers.contains_key(&producer) && topic.producers.len() >= MAX_PRODUCERS {
            // Forget the producer that published least recently (ties: the smallest id).
            let oldest = topic
                .producers
                .iter()
                .min_by_key(|(id, state)| (state.last_seen_ms, **id))
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                topic.producers.remove(&oldest);
            }
        }
        let mut placed = Vec::with_capacity(batches.iter().map(|batch| batch.records.len()).sum());
        // The producer's state is taken out of the topic while its batches are appended (one
        // lookup per publish, not one per batch), and put back whatever happens: every batch
        // begun, even one whose append failed, is remembered in it.
        let mut state = topic.producers.remove(&producer).unwrap_or_default();
        let append_all = || -> Result<(), BrokerError> {
            for (batch, Checked { index, repeated }) in batches.into_iter().zip(checked) {
                let partition = batch.partition;
                let stored_before = repeated.len();
                placed.extend(repeated);
                // Where the new records went: consecutive offsets from the first one's.
                let mut first_offset = None;
                let mut appended = 0;
                let mut refused = false;
                for record in batch.records.into_iter().skip(stored_before) {
                    if refused {
                        // Sequence numbers stay consecutive: after a refused record, none is
                        // stored.
                        placed.push((partition, -1));
                        continue;
                    }
                    let PublishRecord {
                        key,
                        payload,
                        headers,
                        timestamp_ms,
                        ..
                    } = record;
                    let stored =
                        StoredRecord::new(key, payload, headers, timestamp_ms.unwrap_or(now));
                    let offset = match topic.append(
                        index,
                        capacity,
                        &mut self.memory,
                        now,
                        stored,
                        &mut self.appended,
                    ) {
                        Ok(offset) => offset,
                        Err(error) => {
                            // What was stored stays stored: its sequence numbers are
                            // remembered, so that a retry is answered, not stored again.
                            state.remember(index, first_offset, appended, now);
                            return Err(error);
                        }
                    };
                    refused = offset < 0;
                    if !refused {
                        let first = *first_offset.get_or_insert(offset);
                        debug_assert_eq!(offset, first + appended as i64, "consecutive offsets");
                        appended += 1;
                    }
                    placed.push((partition, offset));
                }
                state.remember(index, first_offset, appended, now);
            }
            Ok(())
        };
        let appended = append_all();
        topic.producers.insert(producer, state);
        appended.map(|()| placed)
    }
}

impl Producer {
    /// Remembers that a batch stored `stored` records on the partition `index`, at consecutive
    /// offsets from `first_offset` (`None`: none, the partition was full), at `now`.
    fn remember(&mut self, index: usize, first_offset: Option<i64>, stored: u64, now: i64) {
        self.last_seen_ms = now;
        let sequences = self.partitions.entry(index).or_default();
        let Some(first_offset) = first_offset.filter(|_| stored > 0) else {
            return;
        };
        sequences.recent.push_back(RecentBatch {
            first_sequence: sequences.next,
            first_offset,
            stored,
        });
        sequences.next += stored;
        while sequences.recent.len() > RECENT_BATCHES {
            sequences.recent.pop_front();
        }
    }
}

/// Checks one batch of an idempotent publish against what `known` (the producer, if the topic
/// remembers it) stored on the partition `index`, and returns the offsets of its records that
/// were stored before.
fn check_batch(
    known: Option<&Producer>,
    producer: u64,
    index: usize,
    batch: &PartitionBatch,
) -> Result<Vec<(i32, i64)>, BrokerError> {
    let PartitionBatch {
        partition,
        sequence,
        ref records,
    } = *batch;
    for record in records {
        if let Some(own) = record.partition.filter(|&own| own != partition) {
            return Err(BrokerError::invalid(format!(
                "a record of an idempotent batch for partition {partition} names partition {own}"
            )));
        }
        check_headers(&record.headers)?;
    }
    let known = known.and_then(|state| state.partitions.get(&index));
    let next = known.map_or(0, |sequences| sequences.next);
    if sequence > next {
        return Err(BrokerError::invalid(format!(
            "producer {producer:016x} sent sequence {sequence} on partition {partition}, but \
             expects {next}: the records between were never stored"
        )));
    }
    // Records already stored are answered with their offsets; the rest are new.
    let stored_before = (next - sequence).min(records.len() as u64);
    (sequence..sequence + stored_before)
        .map(
            |repeated| match known.and_then(|sequences| sequences.offset_of(repeated)) {
                Some(offset) => Ok((partition, offset)),
                None => Err(BrokerError::invalid(format!(
                    "producer {producer:016x} sent sequence {repeated} on partition {partition} \
                     again, longer ago than the last {RECENT_BATCHES} batches it sent: its \
                     offset is no longer known"
                ))),
            },
        )
        .collect()
}
