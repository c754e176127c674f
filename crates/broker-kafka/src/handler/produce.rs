//! Produce, InitProducerId and DescribeProducers: record batches decoded within one request's
//! limits and published to their partitions, idempotent producers' batches stored once, and
//! what each partition remembers of its producers.

use std::collections::{BTreeSet, HashMap, HashSet};

use broker_core::{
    Command, CommandKind, Discard, Outcome, PartitionBatch, ProducerState, PublishRecord,
    Retention, TopicSettings, MAX_BATCH_RECORDS,
};
use broker_proto::ErrorReply;
use kafka_protocol::messages::describe_producers_response::{
    self, PartitionResponse, TopicResponse,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    DescribeProducersRequest, DescribeProducersResponse, InitProducerIdRequest,
    InitProducerIdResponse, ProduceRequest, ProduceResponse, ProducerId, TopicName,
};
use kafka_protocol::ResponseError;

use crate::ids::new_producer_id;
use crate::records::{decode_produced, Limits, Produced, RecordsError};
use crate::Backend;

use super::{in_turns, message, refused, topic_name, unexpected, Handler};

/// Why DescribeProducers is not answered while a node of the cluster runs an earlier release.
const EARLIER_RELEASE: &str = "a node of the cluster runs a release that cannot list \
    producers: every node must run this release or a later one first";

/// How many times the largest frame a produced batch may decompress to.
const INFLATE_FACTOR: usize = 4;

impl<B: Backend> Handler<'_, B> {
    /// What the batches of one produce request may hold: records up to the server's payload
    /// limit, decompressing to four times the largest frame in all, room for anything a client
    /// compresses in one request, and as many records as take that much memory once decoded.
    fn produce_limits(&self) -> Limits {
        let budget = self.settings.max_frame_bytes.saturating_mul(INFLATE_FACTOR);
        Limits {
            record_bytes: self.settings.max_record_bytes,
            inflate_left: budget,
            records_left: budget,
        }
    }

    pub(super) async fn produce(&self, request: ProduceRequest) -> ProduceResponse {
        let refusal = if request.transactional_id.is_some() {
            Some((
                ResponseError::TransactionalIdAuthorizationFailed,
                "transactions are not supported by this broker".to_owned(),
            ))
        } else if !matches!(request.acks, -1..=1) {
            Some((
                ResponseError::InvalidRequiredAcks,
                format!("acks must be -1, 0 or 1, got {}", request.acks),
            ))
        } else {
            None
        };
        // Every batch is read before any is published, with one budget for the request.
        let mut limits = self.produce_limits();
        let topics: Vec<_> = request
            .topic_data
            .into_iter()
            .map(|topic| {
                let batches = match &refusal {
                    Some((error, text)) => Err(topic
                        .partition_data
                        .iter()
                        .map(|data| refused_partition(data.index, *error, text.clone()))
                        .collect()),
                    None => Ok(topic
                        .partition_data
                        .into_iter()
                        .map(|data| {
                            let records = match data.records {
                                Some(bytes) => decode_produced(data.index, bytes, &mut limits),
                                None => Err(RecordsError::Corrupt("no records".to_owned())),
                            };
                            (data.index, records)
                        })
                        .collect()),
                };
                (topic.name, batches)
            })
            .collect();
        let topics = topics.into_iter().map(|(kafka_name, batches)| async move {
            let partitions = match batches {
                Err(refused) => refused,
                Ok(batches) => self.publish(&topic_name(&kafka_name), batches).await,
            };
            TopicProduceResponse::default()
                .with_name(kafka_name)
                .with_partition_responses(partitions)
        });
        ProduceResponse::default().with_responses(in_turns(topics).await)
    }

    /// Publishes the records of each partition of one topic, in order, and answers each
    /// partition, in the request's order: its first record's offset, or why it was refused.
    async fn publish(
        &self,
        topic: &str,
        batches: Vec<(i32, Result<Produced, RecordsError>)>,
    ) -> Vec<PartitionProduceResponse> {
        let mut answers: Vec<Option<PartitionProduceResponse>> =
            (0..batches.len()).map(|_| None).collect();
        let mut plain = Vec::new();
        let mut idempotent = Vec::new();
        // Each slot's largest record and its number of records, to tell a batch refused for
        // now from one that can never be stored whole.
        let mut largest = vec![0_u64; batches.len()];
        let mut counts = vec![0_u64; batches.len()];
        for (slot, (partition, batch)) in batches.into_iter().enumerate() {
            if let Ok(produced) = &batch {
                let sizes = produced.records.iter().map(|record| record.size() as u64);
                largest[slot] = sizes.max().unwrap_or(0);
                counts[slot] = produced.records.len() as u64;
            }
            match batch {
                // A record over the server's limit was refused as its batch was read, alone, so
                // that the request's other partitions are stored.
                Err(error) => {
                    let kafka = match error {
                        RecordsError::Corrupt(_) => ResponseError::CorruptMessage,
                        RecordsError::Transactional | RecordsError::Invalid(_) => {
                            ResponseError::InvalidRecord
                        }
                        RecordsError::TooLarge(_) => ResponseError::MessageTooLarge,
                    };
                    answers[slot] = Some(refused_partition(partition, kafka, error.to_string()));
                }
                Ok(Produced {
                    idempotent: Some((producer, sequence)),
                    records,
                }) => idempotent.push((slot, partition, producer, sequence, records)),
                Ok(Produced {
                    idempotent: None,
                    records,
                }) => plain.push((slot, partition, records)),
            }
        }
        let idempotent = in_turns(idempotent.into_iter().map(
            |(slot, partition, producer, sequence, records)| async move {
                let offsets = self
                    .publish_idempotent(topic, partition, producer, sequence, records)
                    .await;
                (slot, partition, offsets)
            },
        ));
        let (plain, idempotent) = futures::join!(self.publish_plain(topic, plain), idempotent);
        let stored: Vec<(usize, i32, Vec<Stored>)> = plain.into_iter().chain(idempotent).collect();
        // A partition refuses a record larger than it keeps for ever, not until consumers catch
        // up, and a batch of more records than it keeps: a refused batch of either is answered
        // so, and the client fails it at once instead of retrying until its timeout (a producer
        // without idempotence would store its first records again at each try).
        let refused = |offsets: &[Stored]| offsets.iter().any(|offset| matches!(offset, Ok(-1)));
        let limits = match stored.iter().any(|(_, _, offsets)| refused(offsets)) {
            true => self.partition_limits(topic).await,
            false => PartitionLimits::default(),
        };
        for (slot, partition, offsets) in stored {
            let too_large = Some(largest[slot])
                .zip(limits.max_bytes)
                .filter(|&(size, max)| size > max && refused(&offsets));
            let too_many = Some(counts[slot])
                .zip(limits.max_records)
                .filter(|&(count, max)| count > max && refused(&offsets));
            let stored_first = offsets
                .iter()
                .take_while(|o| matches!(o, Ok(o) if *o >= 0))
                .count();
            answers[slot] = Some(match (too_large, too_many) {
                (Some((size, max)), _) => refused_partition(
                    partition,
                    ResponseError::MessageTooLarge,
                    format!(
                        "a record of {size} bytes (value, key and headers) can never be stored: \
                         a partition of topic {topic:?} keeps at most {max} bytes"
                    ),
                ),
                (None, Some((count, max))) => refused_partition(
                    partition,
                    ResponseError::RecordListTooLarge,
                    format!(
                        "a batch of {count} records can never be stored whole: a partition of \
                         topic {topic:?} keeps at most {max} records (the batch's first \
                         {stored_first} were stored); send smaller batches, or give the topic a \
                         larger --max-records"
                    ),
                ),
                (None, None) => partition_answer(topic, partition, &offsets),
            });
        }
        answers.into_iter().flatten().collect()
    }

    /// What a partition of `topic` keeps at most, as far as it refuses what is past it (none
    /// known when it cannot be described).
    pub(super) async fn partition_limits(&self, topic: &str) -> PartitionLimits {
        let Ok(Outcome::Description(described)) = self
            .call(Command::Describe {
                topic: Some(topic.to_owned()),
            })
            .await
        else {
            return PartitionLimits::default();
        };
        let Some(settings) = described
            .topics
            .first()
            .and_then(|topic| TopicSettings::from_list(&topic.settings).ok())
        else {
            return PartitionLimits::default();
        };
        // Past its record limit a partition refuses new records only when it discards new
        // ones (with the old discarded, the oldest leave instead).
        let max_records = match (settings.discard, settings.retention) {
            (Discard::New, Retention::Interest) => Some(
                settings
                    .max_records
                    .unwrap_or(described.capacity_per_partition.max(1) as u64),
            ),
            (Discard::New, Retention::Limits) => settings.max_records,
            (Discard::Old, _) => None,
        };
        PartitionLimits {
            max_bytes: settings.max_bytes,
            max_records,
        }
    }

    /// Publishes the records of the partitions of a producer without idempotence, all in one
    /// publish that stops at each partition's first refusal (a few when there are very many
    /// records), so that a partition never stores a record after one it refused: the client
    /// sends the refused batch again, whose first records may then be stored twice but never
    /// out of order. Each partition's answer with its slot.
    async fn publish_plain(
        &self,
        topic: &str,
        partitions: Vec<(usize, i32, Vec<PublishRecord>)>,
    ) -> Vec<(usize, i32, Vec<Stored>)> {
        let mut records = Vec::new();
        let mut placed = Vec::with_capacity(partitions.len());
        for (slot, partition, batch) in partitions {
            let start = records.len();
            records.extend(batch);
            placed.push((slot, partition, start..records.len()));
        }
        // Each record's offset (`-1` when refused), or the refusal of its chunk.
        let mut offsets: Vec<Stored> = Vec::with_capacity(records.len());
        // Partitions that did not store a record of an earlier chunk (refused as full, or the
        // chunk refused whole): their later records are not sent, so that none is stored
        // after one that was not.
        let mut refusing: BTreeSet<i32> = BTreeSet::new();
        // Moved, not copied, a chunk at a time.
        let mut rest = records.into_iter();
        loop {
            let chunk: Vec<PublishRecord> = rest.by_ref().take(MAX_BATCH_RECORDS).collect();
            if chunk.is_empty() {
                break;
            }
            let mut chunk_offsets: Vec<Stored> = vec![Ok(-1); chunk.len()];
            let mut indexes = Vec::with_capacity(chunk.len());
            let mut sent = Vec::with_capacity(chunk.len());
            for (index, record) in chunk.into_iter().enumerate() {
                if record
                    .partition
                    .is_none_or(|partition| !refusing.contains(&partition))
                {
                    indexes.push(index);
                    sent.push(record);
                }
            }
            let partitions: Vec<Option<i32>> = sent.iter().map(|record| record.partition).collect();
            let command = Command::PublishUntilFull {
                topic: topic.to_owned(),
                records: sent,
            };
            let result = self
                .call_here(command)
                .await
                .map_err(|refusal| refused(&refusal));
            for ((index, offset), partition) in indexes
                .into_iter()
                .zip(placed_offsets(result, partitions.len()))
                .zip(partitions)
            {
                if let Some(partition) = partition.filter(|_| !matches!(offset, Ok(0..))) {
                    refusing.insert(partition);
                }
                chunk_offsets[index] = offset;
            }
            offsets.extend(chunk_offsets);
        }
        // Each partition's offsets split off the end, last partition first: moved, not cloned.
        placed
            .into_iter()
            .rev()
            .map(|(slot, partition, range)| (slot, partition, offsets.split_off(range.start)))
            .collect()
    }

    /// Publishes the records of an idempotent producer to one partition, numbered from
    /// Kafka's `sequence` (the broker's number for it: see [`crate::ProducerSequences`]): a
    /// batch sent again is answered with the offsets it got the first time. Each record's
    /// offset (`-1` when full), or why it was refused.
    async fn publish_idempotent(
        &self,
        topic: &str,
        partition: i32,
        producer: u64,
        sequence: i32,
        records: Vec<PublishRecord>,
    ) -> Vec<Stored> {
        let mut offsets = Vec::with_capacity(records.len());
        let sequences = &self.state.sequences;
        let mut first = sequences.broker_sequence(producer, topic, partition, sequence);
        for chunk in records.chunks(MAX_BATCH_RECORDS) {
            let command = Command::PublishIdempotent {
                topic: topic.to_owned(),
                producer,
                batches: vec![PartitionBatch {
                    partition,
                    sequence: first,
                    records: chunk.to_vec(),
                }],
            };
            let result = self
                .call_here(command)
                .await
                .map_err(|refusal| match refusal {
                    // The topic and partition exist (the producer found them in the metadata),
                    // so the broker refused the sequence numbers: ahead of what it expects, or
                    // of a batch too old to answer again. Kafka's clients then start their
                    // sequences afresh.
                    ErrorReply::InvalidArgument(text) if text.contains("sequence") => {
                        (ResponseError::OutOfOrderSequenceNumber, text)
                    }
                    refusal => refused(&refusal),
                });
            first += chunk.len() as u64;
            if result.is_ok() {
                sequences.stored(producer, topic, partition, first);
            }
            offsets.extend(placed_offsets(result, chunk.len()));
        }
        offsets
    }
}

impl<B: Backend> Handler<'_, B> {
    /// What each partition named remembers of the idempotent producers that published to it,
    /// as Kafka's DescribeProducers: asked of the partition's leader (another node answers
    /// `NOT_LEADER_OR_FOLLOWER`, and the client asks the leader); an unknown topic or partition
    /// is `UNKNOWN_TOPIC_OR_PARTITION`. Each partition is answered once however many times the
    /// request names it (an answer can list thousands of producers).
    pub(super) async fn describe_producers(
        &self,
        request: DescribeProducersRequest,
    ) -> DescribeProducersResponse {
        let speaks = self
            .backend
            .speaks(CommandKind::Producers.since_version())
            .await;
        // Each topic once and each of its partitions once, in the order first named.
        let mut asked: Vec<(String, TopicName, Vec<i32>)> = Vec::new();
        let mut places: HashMap<String, usize> = HashMap::new();
        let mut named: HashSet<(usize, i32)> = HashSet::new();
        for topic in request.topics {
            let name = topic_name(&topic.name);
            let place = *places.entry(name.clone()).or_insert_with(|| {
                asked.push((name, topic.name, Vec::new()));
                asked.len() - 1
            });
            for partition in topic.partition_indexes {
                if named.insert((place, partition)) {
                    asked[place].2.push(partition);
                }
            }
        }
        let topics = asked
            .into_iter()
            .map(|(name, kafka_name, partitions)| async move {
                let partitions = partitions.into_iter().map(|partition| {
                    let command = Command::Producers {
                        topic: name.clone(),
                        partition,
                    };
                    async move {
                        let answer = PartitionResponse::default().with_partition_index(partition);
                        if !speaks {
                            return answer
                                .with_error_code(ResponseError::UnknownServerError.code())
                                .with_error_message(message(EARLIER_RELEASE.to_owned()));
                        }
                        // No topic has such a partition: answered without asking the broker,
                        // so that a request naming thousands of them makes no more calls than
                        // the partitions a topic can have.
                        if !(0..self.settings.max_partitions).contains(&partition) {
                            return answer
                                .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                                .with_error_message(message(format!(
                                    "no topic has a partition {partition}"
                                )));
                        }
                        let refusal = match self.call_here(command).await {
                            Ok(Outcome::Producers(states)) => {
                                return answer.with_active_producers(
                                    states.iter().map(kafka_producer).collect(),
                                )
                            }
                            Ok(other) => refused(&unexpected(&other)),
                            Err(refusal) => refused(&refusal),
                        };
                        answer
                            .with_error_code(refusal.0.code())
                            .with_error_message(message(refusal.1))
                    }
                });
                TopicResponse::default()
                    .with_name(kafka_name)
                    .with_partitions(in_turns(partitions).await)
            });
        DescribeProducersResponse::default().with_topics(in_turns(topics).await)
    }
}

/// One producer as DescribeProducers lists it. The broker keeps a Kafka producer by its id at
/// epoch 0 (see `records::native_producer`), which is listed as it is; one that bumped its
/// epoch, and a native producer, are listed under the number the broker keeps them by (its
/// 64 bits as Kafka's signed id) at epoch 0. The last sequence number is Kafka's, which wraps
/// past 2^31 - 1 (-1 before the producer stored anything there); no transaction is ever open.
pub(super) fn kafka_producer(state: &ProducerState) -> describe_producers_response::ProducerState {
    let last_sequence = state
        .next_sequence
        .checked_sub(1)
        .map_or(-1, |last| (last % (1 << 31)) as i32);
    describe_producers_response::ProducerState::default()
        .with_producer_id(ProducerId(i64::from_ne_bytes(state.producer.to_ne_bytes())))
        .with_producer_epoch(0)
        .with_last_sequence(last_sequence)
        .with_last_timestamp(state.last_seen_ms)
        .with_coordinator_epoch(-1)
        .with_current_txn_start_offset(-1)
}

/// A new producer id for an idempotent producer (epoch 0), or a refusal for a transactional
/// one. A producer that asks again with its id and epoch (after an error it cannot recover its
/// sequences from) gets a new id, so that its sequences start afresh; one that bumps its epoch
/// itself is a new producer too (see `records::native_producer`).
pub(super) fn init_producer_id(request: &InitProducerIdRequest) -> InitProducerIdResponse {
    if request.transactional_id.is_some() {
        return InitProducerIdResponse::default()
            .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    InitProducerIdResponse::default()
        .with_producer_id(ProducerId(new_producer_id()))
        .with_producer_epoch(0)
}

/// What a partition of a topic keeps at most, where it refuses what is past it.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct PartitionLimits {
    /// Its byte limit: a record larger is never stored.
    max_bytes: Option<u64>,
    /// Its record limit, when it discards new records past it: a batch of more is never
    /// stored whole.
    max_records: Option<u64>,
}

/// What became of one produced record: its offset (`-1` when its partition was full), or the
/// Kafka error that refused it and why.
type Stored = Result<i64, (ResponseError, String)>;

/// What became of each of the `size` records of one publish answered `result`.
fn placed_offsets(result: Result<Outcome, (ResponseError, String)>, size: usize) -> Vec<Stored> {
    match result {
        Ok(Outcome::PublishedBatch(stored)) if stored.len() == size => {
            stored.into_iter().map(|(_, offset)| Ok(offset)).collect()
        }
        Ok(other) => vec![Err(refused(&unexpected(&other))); size],
        Err(refusal) => vec![Err(refusal); size],
    }
}

/// The answer for `partition` of `topic` whose records became `stored`: the first record's
/// offset, or the first refusal; a full partition is answered with a retriable error
/// (`NOT_ENOUGH_REPLICAS`: nothing of the batch past the full point was stored, and Kafka's
/// clients retry it after a back-off). The records before the full point were stored: an
/// idempotent producer's retry is answered with their offsets, but one without idempotence
/// stores them again.
fn partition_answer(topic: &str, partition: i32, stored: &[Stored]) -> PartitionProduceResponse {
    for result in stored {
        match result {
            Ok(-1) => {
                return refused_partition(
                    partition,
                    ResponseError::NotEnoughReplicas,
                    format!(
                        "partition {partition} of topic {topic:?} is full (its retention keeps \
                         no more records until consumers catch up); retry later"
                    ),
                )
            }
            Ok(_) => {}
            Err((error, text)) => return refused_partition(partition, *error, text.clone()),
        }
    }
    let base_offset = match stored.first() {
        Some(Ok(offset)) => *offset,
        _ => -1,
    };
    PartitionProduceResponse::default()
        .with_index(partition)
        .with_base_offset(base_offset)
}

/// A produce answer refusing `partition` with `error`, saying why.
fn refused_partition(
    partition: i32,
    error: ResponseError,
    text: String,
) -> PartitionProduceResponse {
    PartitionProduceResponse::default()
        .with_index(partition)
        .with_error_code(error.code())
        .with_base_offset(-1)
        .with_error_message(message(text))
}
