//! Fetch and ListOffsets: records read from the log within the answer's room, and the
//! offsets a consumer resets to.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use broker_core::{Command, Outcome, PartitionRead, TopicDescription, MAX_FETCH_RECORDS};
use broker_proto::ErrorReply;
use bytes::Bytes;
use futures::future::{join_all, select_all};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{
    FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
};
use kafka_protocol::ResponseError;

use crate::errors::kafka_error;
use crate::records::encode_fetched;
use crate::Backend;

use super::{in_turns, kafka_topic, topic_name, unexpected, Handler};

/// The `timestamp` of a ListOffsets partition that asks for the end offset.
const LATEST: i64 = -1;

/// The `timestamp` of a ListOffsets partition that asks for the earliest retained offset.
const EARLIEST: i64 = -2;

/// The `timestamp` of a ListOffsets partition (version 7 and later) that asks for the record
/// with the largest time: a partition's times never decrease, so its last record.
const MAX_TIMESTAMP: i64 = -3;

/// How many partitions of a fetch are read at once: enough that a fetch of many partitions
/// takes few round trips (in a cluster each read is an entry of the replicated log), few enough
/// that the records read past the answer's room (a read always returns its first record, which
/// the answer may then have no room for) stay a handful.
const READS_AT_ONCE: usize = 32;

/// Bytes of a fetch answer besides its record batches: headers, topics and partitions.
const FETCH_ANSWER_OVERHEAD: usize = 256 * 1024;

impl<B: Backend> Handler<'_, B> {
    /// The bytes of records a fetch answer may carry: the frame limit, less room for the rest
    /// of the answer.
    fn frame_room(&self) -> u64 {
        (self
            .settings
            .max_frame_bytes
            .saturating_sub(FETCH_ANSWER_OVERHEAD)) as u64
    }

    /// Reads the partitions in order, [`READS_AT_ONCE`] at a time, each within what the answer
    /// has room for after the partitions before it, so that what the request holds in memory
    /// is bounded by its answer (and a few records more): a partition named twice
    /// is read once (as Kafka does, at the place it was first named, from the offset it was
    /// last given).
    pub(super) async fn fetch(&self, request: FetchRequest) -> FetchResponse {
        let mut wanted: Vec<Wanted> = Vec::new();
        let mut places: HashMap<(&str, i32), usize> = HashMap::new();
        for topic in &request.topics {
            for partition in &topic.partitions {
                let read = Wanted {
                    topic: topic_name(&topic.topic),
                    partition: partition.partition,
                    offset: partition.fetch_offset,
                    max_bytes: u64::try_from(partition.partition_max_bytes).unwrap_or(0),
                };
                match places.entry((topic.topic.as_str(), partition.partition)) {
                    Entry::Occupied(place) => wanted[*place.get()] = read,
                    Entry::Vacant(place) => {
                        place.insert(wanted.len());
                        wanted.push(read);
                    }
                }
            }
        }
        // The whole answer's byte limit: the client's (version 3 on) within the server's frame
        // limit. Once the partitions' batches fill it, later partitions answer none (the first
        // batch always comes).
        let mut room = Room {
            left: u64::try_from(request.max_bytes)
                .ok()
                .filter(|&limit| limit > 0)
                .map_or(self.frame_room(), |limit| limit.min(self.frame_room())),
            taken: false,
        };
        let mut answers = Vec::with_capacity(wanted.len());
        let mut found_nothing = true;
        // Once the answer is full, the chunks after it are answered from their topics'
        // descriptions (each topic described once): no record of theirs is read to be dropped.
        // (A full answer found something: it does not wait.)
        let mut bounds: HashMap<String, Result<Vec<TopicDescription>, ErrorReply>> = HashMap::new();
        for chunk in wanted.chunks(READS_AT_ONCE) {
            if room.taken && room.left == 0 {
                for partition in chunk {
                    let result = self.bounds_only(partition, &mut bounds).await;
                    answers.push(self.partition_data(partition, result, &mut room).await);
                }
                continue;
            }
            // Each read of the chunk within what is left after the reads before it in the
            // chunk (a read always gets its first record, whatever its size).
            let mut left = room.left;
            let reads = chunk.iter().map(|partition| {
                let limit = left;
                left = left.saturating_sub(self.read_limit(partition, limit));
                self.read(partition, limit, Duration::ZERO)
            });
            let results = join_all(reads).await;
            for (partition, result) in chunk.iter().zip(results) {
                found_nothing &= matches!(&result, Ok(outcome) if outcome.found_no_records());
                answers.push(self.partition_data(partition, result, &mut room).await);
            }
        }
        let wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
        if found_nothing && !wait.is_zero() && !wanted.is_empty() {
            // Wait on every partition at once; the first to answer ends the fetch (the others'
            // waits end by themselves, answering nobody, and read nothing once this request
            // stops listening).
            let waits = wanted
                .iter()
                .map(|partition| Box::pin(self.read(partition, room.left, wait)));
            let (answer, index, _) = select_all(waits).await;
            answers[index] = self.partition_data(&wanted[index], answer, &mut room).await;
        }
        let mut topics: Vec<FetchableTopicResponse> = Vec::new();
        for (partition, data) in wanted.iter().zip(answers) {
            match topics.last_mut() {
                Some(topic) if topic.topic.as_str() == partition.topic => {
                    topic.partitions.push(data);
                }
                _ => topics.push(
                    FetchableTopicResponse::default()
                        .with_topic(kafka_topic(&partition.topic))
                        .with_partitions(vec![data]),
                ),
            }
        }
        FetchResponse::default().with_responses(topics)
    }

    /// The most bytes of records a read of `wanted` takes when the answer has `limit` left:
    /// within the partition's own limit and half a frame.
    fn read_limit(&self, wanted: &Wanted, limit: u64) -> u64 {
        wanted.max_bytes.min(limit).min(self.frame_room() / 2)
    }

    /// Reads `wanted`'s records, at most `limit` bytes of them (and at most half a frame, so
    /// that its batch, with its per-record overhead, always fits the answer), waiting up to
    /// `wait` for one.
    async fn read(
        &self,
        wanted: &Wanted,
        limit: u64,
        wait: Duration,
    ) -> Result<Outcome, ErrorReply> {
        let command = Command::Read {
            topic: wanted.topic.clone(),
            partition: wanted.partition,
            offset: wanted.offset,
            max_records: MAX_FETCH_RECORDS,
            max_bytes: Some(self.read_limit(wanted, limit)),
        };
        self.backend.call(command, wait).await
    }

    /// What a read of `wanted` would answer but its records: its bounds, from its topic's
    /// description in `described` (described now if it is not there yet). A partition the
    /// description does not have, or an offset past its end, is read as any other, so that it
    /// is refused as any other.
    async fn bounds_only(
        &self,
        wanted: &Wanted,
        described: &mut HashMap<String, Result<Vec<TopicDescription>, ErrorReply>>,
    ) -> Result<Outcome, ErrorReply> {
        if !described.contains_key(&wanted.topic) {
            let description = self.describe(Some(wanted.topic.clone())).await;
            described.insert(wanted.topic.clone(), description);
        }
        let partition = described
            .get(&wanted.topic)
            .and_then(|described| described.as_ref().ok())
            .and_then(|topics| topics.first())
            .and_then(|topic| {
                usize::try_from(wanted.partition)
                    .ok()
                    .and_then(|p| topic.partitions.get(p))
            });
        match partition {
            Some(bounds) if wanted.offset <= bounds.end_offset => {
                Ok(Outcome::Read(PartitionRead {
                    records: Vec::new(),
                    start_offset: bounds.earliest_offset,
                    end_offset: bounds.end_offset,
                }))
            }
            _ => self.read(wanted, 0, Duration::ZERO).await,
        }
    }

    /// One partition of a fetch answer from what its read found, its records only while the
    /// answer has `room` for them (taking theirs from it).
    async fn partition_data(
        &self,
        Wanted {
            topic,
            partition,
            offset,
            ..
        }: &Wanted,
        result: Result<Outcome, ErrorReply>,
        room: &mut Room,
    ) -> PartitionData {
        let data = PartitionData::default().with_partition_index(*partition);
        let read = match result {
            Ok(Outcome::Read(read)) => read,
            Ok(other) => return data.with_error_code(kafka_error(&unexpected(&other)).code()),
            Err(refusal @ ErrorReply::InvalidArgument(_)) => {
                // Past the end (the records there were deleted and the topic made anew, or the
                // client is confused): the client resets its offset as it is configured to.
                let end = self
                    .call_here(Command::EndOffset {
                        topic: topic.clone(),
                        partition: *partition,
                    })
                    .await;
                let error = match end {
                    Ok(Outcome::Offset(end)) if *offset > end => ResponseError::OffsetOutOfRange,
                    _ => kafka_error(&refusal),
                };
                return data.with_error_code(error.code());
            }
            Err(refusal) => return data.with_error_code(kafka_error(&refusal).code()),
        };
        let PartitionRead {
            records,
            start_offset,
            end_offset,
        } = read;
        let data = data
            .with_high_watermark(end_offset)
            .with_last_stable_offset(end_offset)
            .with_log_start_offset(start_offset);
        if *offset < start_offset {
            return data.with_error_code(ResponseError::OffsetOutOfRange.code());
        }
        if records.is_empty() {
            return data.with_records(Some(Bytes::new()));
        }
        match encode_fetched(&records) {
            Ok(batch) if room.take(batch.len() as u64) => data.with_records(Some(batch)),
            Ok(_) => data.with_records(Some(Bytes::new())),
            Err(error) => {
                tracing::error!(topic, partition, cause = %error, "cannot encode fetched records");
                data.with_error_code(ResponseError::UnknownServerError.code())
            }
        }
    }

    pub(super) async fn list_offsets(&self, request: ListOffsetsRequest) -> ListOffsetsResponse {
        // Each topic described once, however many times the request names it.
        let names: BTreeSet<String> = request
            .topics
            .iter()
            .map(|topic| topic_name(&topic.name))
            .collect();
        let descriptions: HashMap<String, Result<Vec<TopicDescription>, ErrorReply>> =
            in_turns(names.into_iter().map(|name| async move {
                let described = self.describe(Some(name.clone())).await;
                (name, described)
            }))
            .await
            .into_iter()
            .collect();
        let descriptions = &descriptions;
        let topics = request.topics.into_iter().map(|topic| async move {
            let name = topic_name(&topic.name);
            let described = descriptions.get(&name);
            let mut partitions = Vec::with_capacity(topic.partitions.len());
            for wanted in &topic.partitions {
                let answer = ListOffsetsPartitionResponse::default()
                    .with_partition_index(wanted.partition_index)
                    .with_timestamp(-1)
                    .with_offset(-1);
                let bounds = match described {
                    Some(Ok(described)) => described.first().and_then(|topic| {
                        usize::try_from(wanted.partition_index)
                            .ok()
                            .and_then(|index| topic.partitions.get(index))
                    }),
                    _ => None,
                };
                let Some(bounds) = bounds else {
                    let error = match described {
                        Some(Err(refusal)) => kafka_error(refusal),
                        _ => ResponseError::UnknownTopicOrPartition,
                    };
                    partitions.push(answer.with_error_code(error.code()));
                    continue;
                };
                let found = match wanted.timestamp {
                    LATEST => Ok((bounds.end_offset, -1)),
                    EARLIEST => Ok((bounds.earliest_offset, -1)),
                    MAX_TIMESTAMP if bounds.end_offset > bounds.earliest_offset => {
                        self.record_time(&name, wanted.partition_index, bounds.end_offset - 1)
                            .await
                    }
                    MAX_TIMESTAMP => Ok((-1, -1)),
                    time if time >= 0 => {
                        self.offset_for_time(&name, wanted.partition_index, time, bounds.end_offset)
                            .await
                    }
                    _ => Err(ResponseError::InvalidRequest),
                };
                partitions.push(match found {
                    Ok((offset, timestamp)) => answer.with_offset(offset).with_timestamp(timestamp),
                    Err(error) => answer.with_error_code(error.code()),
                });
            }
            ListOffsetsTopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions)
        });
        ListOffsetsResponse::default().with_topics(in_turns(topics).await)
    }

    /// The first offset at or after `time` and its record's time; `(-1, -1)` when every record
    /// is older, as Kafka answers.
    async fn offset_for_time(
        &self,
        topic: &str,
        partition: i32,
        time: i64,
        end: i64,
    ) -> Result<(i64, i64), ResponseError> {
        let offset = match self
            .call_here(Command::OffsetForTime {
                topic: topic.to_owned(),
                partition,
                timestamp_ms: time,
            })
            .await
        {
            Ok(Outcome::Offset(offset)) => offset,
            Ok(other) => return Err(kafka_error(&unexpected(&other))),
            Err(refusal) => return Err(kafka_error(&refusal)),
        };
        if offset >= end {
            return Ok((-1, -1));
        }
        self.record_time(topic, partition, offset).await
    }

    /// The record at `offset` and its time; `(-1, -1)` when it is no longer retained.
    async fn record_time(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(i64, i64), ResponseError> {
        let read = Command::Read {
            topic: topic.to_owned(),
            partition,
            offset,
            max_records: 1,
            max_bytes: Some(0),
        };
        match self.call_here(read).await {
            Ok(Outcome::Read(read)) => Ok(read
                .records
                .first()
                .map_or((-1, -1), |record| (record.offset, record.timestamp_ms))),
            Ok(other) => Err(kafka_error(&unexpected(&other))),
            Err(refusal) => Err(kafka_error(&refusal)),
        }
    }
}

/// What is left of a fetch answer's byte limit.
struct Room {
    left: u64,
    /// Whether a batch is in the answer already.
    taken: bool,
}

/// A partition a fetch reads.
struct Wanted {
    topic: String,
    partition: i32,
    /// Where the client reads from.
    offset: i64,
    /// The most bytes of records the client takes from this partition.
    max_bytes: u64,
}

impl Room {
    /// Takes room for a batch of `size` bytes, if it fits; the first batch always does.
    fn take(&mut self, size: u64) -> bool {
        if self.taken && size > self.left {
            self.left = 0;
            return false;
        }
        self.left = self.left.saturating_sub(size);
        self.taken = true;
        true
    }
}
