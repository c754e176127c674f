//! What each Kafka request does: the broker's commands it runs through the [`Backend`], and the
//! Kafka response built from their outcomes.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use broker_core::{
    Command, KeyHash, Outcome, PartitionBatch, PartitionRead, PublishRecord, TopicDescription,
    TopicSettings, MAX_BATCH_RECORDS, MAX_FETCH_RECORDS,
};
use broker_proto::ErrorReply;
use bytes::Bytes;
use futures::future::{join_all, select_all};
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteRecordsRequest,
    DeleteRecordsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, FetchRequest, FetchResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, HeartbeatResponse, InitProducerIdRequest,
    InitProducerIdResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, ListOffsetsRequest,
    ListOffsetsResponse, MetadataRequest, MetadataResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, ProduceRequest, ProduceResponse,
    ProducerId, RequestKind, ResponseKind, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::apis::api_versions;
use crate::configs;
use crate::elsewhere::refuse_group_request;
use crate::errors::{code, coordinator_error, kafka_error};
use crate::groups::{Coordinator, Join, DEAD};
use crate::ids::new_producer_id;
use crate::records::{decode_produced, encode_fetched, Limits, Produced, RecordsError};
use crate::{Backend, KafkaSettings};

/// The `timestamp` of a ListOffsets partition that asks for the end offset.
const LATEST: i64 = -1;
/// The `timestamp` of a ListOffsets partition that asks for the earliest retained offset.
const EARLIEST: i64 = -2;

/// The `key_type` of FindCoordinator that asks for a group's coordinator (1 asks for a
/// transaction's).
const GROUP_KEY: i8 = 0;

/// The session timeouts a member may ask for, in milliseconds: 1 s to 30 min (a rebalance
/// waits at most as long).
const SESSION_TIMEOUT_MS: std::ops::RangeInclusive<i32> = 1_000..=1_800_000;

/// Whether `group` names a group the broker can keep: 1 to 64 ASCII letters, digits, `_` and
/// `-`, the rule of every identifier of the broker (topic names included).
fn is_group_id(group: &str) -> bool {
    broker_core::TopicName::new(group).is_ok()
}

/// `ms` milliseconds (never negative).
fn millis(ms: i32) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Bytes of a fetch answer besides its record batches: headers, topics and partitions.
const FETCH_ANSWER_OVERHEAD: usize = 256 * 1024;

/// The state Kafka gives a group with committed offsets and no members.
const EMPTY: &str = "Empty";

/// The protocol type of Kafka's consumer groups.
const CONSUMER: &str = "consumer";

/// How many times the largest frame a produced batch may decompress to.
const INFLATE_FACTOR: usize = 4;

/// Where clients reach this listener: the host and port Metadata answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// Host name or address.
    pub(crate) host: String,
    /// Port.
    pub(crate) port: i32,
}

/// Which nodes clients are sent to, as Metadata and FindCoordinator answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    /// Every node with its listener's address.
    brokers: Vec<(BrokerId, Endpoint)>,
    /// The node that serves every partition and coordinates every group, if one is known.
    leader: Option<BrokerId>,
    /// The nodes that hold a copy of every partition.
    replicas: Vec<BrokerId>,
}

/// What a request is answered with.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Its response (boxed: some responses are large).
    Response(Box<ResponseKind>),
    /// Nothing: a produce with `acks=0`.
    Nothing,
    /// Nothing, and the connection closes: a produce with `acks=0` that was refused, as
    /// Kafka's brokers do, since the closing is the client's only sign that it should ask for
    /// metadata again (a partition's leader moved, say).
    Close,
    /// Its correlation id and this error alone: a request of an API the listener does not
    /// handle.
    Refused(ResponseError),
}

/// Answers the requests of one connection.
pub(crate) struct Handler<'a, B> {
    pub(crate) backend: &'a B,
    pub(crate) settings: &'a KafkaSettings,
    pub(crate) coordinator: &'a Coordinator,
    /// Where the connection's client is told the listener is.
    pub(crate) endpoint: Endpoint,
    /// Where the connection comes from, as DescribeGroups shows a member's host.
    pub(crate) client_host: String,
}

impl<B: Backend> Handler<'_, B> {
    /// Answers one request of `version`, from the client that `client_id` names.
    pub(crate) async fn handle(
        &self,
        version: i16,
        client_id: &str,
        request: RequestKind,
    ) -> Answer {
        if !self.backend.coordinates_groups() {
            if let Some(refused) = refuse_group_request(&request, ResponseError::NotCoordinator) {
                return Answer::Response(Box::new(refused));
            }
        }
        Answer::Response(Box::new(match request {
            RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(api_versions(0)),
            RequestKind::Metadata(request) => {
                ResponseKind::Metadata(self.metadata(request, version).await)
            }
            RequestKind::Produce(request) => {
                let acks = request.acks;
                let response = self.produce(request).await;
                if acks == 0 {
                    let refused = response
                        .responses
                        .iter()
                        .flat_map(|topic| &topic.partition_responses)
                        .any(|partition| partition.error_code != 0);
                    return if refused {
                        Answer::Close
                    } else {
                        Answer::Nothing
                    };
                }
                ResponseKind::Produce(response)
            }
            RequestKind::Fetch(request) => ResponseKind::Fetch(self.fetch(request).await),
            RequestKind::ListOffsets(request) => {
                ResponseKind::ListOffsets(self.list_offsets(request).await)
            }
            RequestKind::CreateTopics(request) => {
                ResponseKind::CreateTopics(self.create_topics(request).await)
            }
            RequestKind::DeleteTopics(request) => {
                ResponseKind::DeleteTopics(self.delete_topics(request).await)
            }
            RequestKind::InitProducerId(request) => {
                ResponseKind::InitProducerId(init_producer_id(&request))
            }
            RequestKind::FindCoordinator(request) => {
                ResponseKind::FindCoordinator(self.find_coordinator(&request))
            }
            RequestKind::JoinGroup(request) => {
                ResponseKind::JoinGroup(self.join_group(request, client_id).await)
            }
            RequestKind::SyncGroup(request) => {
                ResponseKind::SyncGroup(self.sync_group(request).await)
            }
            RequestKind::Heartbeat(request) => ResponseKind::Heartbeat(
                HeartbeatResponse::default().with_error_code(code(
                    self.coordinator
                        .heartbeat(
                            request.group_id.as_str(),
                            request.member_id.as_str(),
                            request.generation_id,
                        )
                        .err(),
                )),
            ),
            RequestKind::LeaveGroup(request) => {
                ResponseKind::LeaveGroup(self.leave_group(&request))
            }
            RequestKind::OffsetCommit(request) => {
                ResponseKind::OffsetCommit(self.offset_commit(request).await)
            }
            RequestKind::OffsetFetch(request) => {
                ResponseKind::OffsetFetch(self.offset_fetch(request).await)
            }
            RequestKind::DescribeGroups(request) => {
                ResponseKind::DescribeGroups(self.describe_groups(&request).await)
            }
            RequestKind::ListGroups(request) => {
                ResponseKind::ListGroups(self.list_groups(&request).await)
            }
            RequestKind::DeleteRecords(request) => {
                ResponseKind::DeleteRecords(self.delete_records(request).await)
            }
            RequestKind::DescribeConfigs(request) => {
                let topics = self
                    .backend
                    .topics()
                    .await
                    .map_err(|refusal| refused(&refusal));
                ResponseKind::DescribeConfigs(configs::describe_configs(&request, &topics))
            }
            // `frame::parse` lets through only the APIs `apis::supported_apis` lists, each
            // handled above.
            _ => return Answer::Refused(ResponseError::UnsupportedVersion),
        }))
    }
}

/// A topic name as the broker sees it.
fn topic_name(name: &TopicName) -> String {
    name.as_str().to_owned()
}

fn kafka_topic(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_owned()))
}

fn message(text: String) -> Option<StrBytes> {
    Some(StrBytes::from_string(text))
}

impl<B: Backend> Handler<'_, B> {
    async fn call(&self, command: Command) -> Result<Outcome, ErrorReply> {
        self.backend.call(command, Duration::ZERO).await
    }

    async fn describe(&self, topic: Option<String>) -> Result<Vec<TopicDescription>, ErrorReply> {
        match self.call(Command::Describe { topic }).await? {
            Outcome::Description(description) => Ok(description.topics),
            other => Err(unexpected(&other)),
        }
    }

    /// What the batches of one produce request may hold: records up to the server's payload
    /// limit, decompressing to four times the largest frame in all, room for anything a client
    /// compresses in one request.
    fn produce_limits(&self) -> Limits {
        Limits {
            record_bytes: self.settings.max_record_bytes,
            inflate_left: self.settings.max_frame_bytes.saturating_mul(INFLATE_FACTOR),
        }
    }

    /// The bytes of records a fetch answer may carry: the frame limit, less room for the rest
    /// of the answer.
    fn frame_room(&self) -> u64 {
        (self
            .settings
            .max_frame_bytes
            .saturating_sub(FETCH_ANSWER_OVERHEAD)) as u64
    }

    fn node_id(&self) -> BrokerId {
        BrokerId(self.settings.node_id)
    }

    /// Where clients are sent: this listener alone for a server that runs alone (at the
    /// address the connection came in on, or the advertised one), every node of a cluster with
    /// the leader serving every partition and group.
    fn placement(&self) -> Placement {
        match self.backend.cluster() {
            None => Placement {
                brokers: vec![(self.node_id(), self.endpoint.clone())],
                leader: Some(self.node_id()),
                replicas: vec![self.node_id()],
            },
            Some(view) => Placement {
                // A leader whose address this node has not learned yet (it started a moment
                // ago) is no leader to clients, who would not know where to go: they ask again.
                leader: view
                    .leader
                    .filter(|leader| view.brokers.iter().any(|(id, _, _)| id == leader))
                    .map(BrokerId),
                brokers: view
                    .brokers
                    .into_iter()
                    .map(|(id, host, port)| {
                        let port = i32::from(port);
                        (BrokerId(id), Endpoint { host, port })
                    })
                    .collect(),
                replicas: view.replicas.into_iter().map(BrokerId).collect(),
            },
        }
    }

    async fn metadata(&self, request: MetadataRequest, version: i16) -> MetadataResponse {
        let wanted: Option<Vec<String>> = request.topics.map(|topics| {
            topics
                .iter()
                .filter_map(|topic| topic.name.as_ref().map(topic_name))
                .collect()
        });
        let placement = self.placement();
        let mut response = MetadataResponse::default()
            .with_brokers(
                placement
                    .brokers
                    .iter()
                    .map(|(id, endpoint)| {
                        MetadataResponseBroker::default()
                            .with_node_id(*id)
                            .with_host(StrBytes::from_string(endpoint.host.clone()))
                            .with_port(endpoint.port)
                    })
                    .collect(),
            )
            .with_cluster_id(Some(StrBytes::from_string(
                self.settings.cluster_id.clone(),
            )))
            .with_controller_id(placement.leader.unwrap_or(BrokerId(-1)));
        let described = match self.backend.topics().await {
            Ok(topics) => topics,
            Err(refusal) => {
                let error = kafka_error(&refusal);
                response.topics = wanted
                    .unwrap_or_default()
                    .iter()
                    .map(|name| {
                        MetadataResponseTopic::default()
                            .with_name(Some(kafka_topic(name)))
                            .with_error_code(error.code())
                    })
                    .collect();
                return response;
            }
        };
        let described: BTreeMap<&str, &TopicDescription> = described
            .iter()
            .map(|topic| (topic.name.as_str(), topic))
            .collect();
        let names: Vec<String> = match wanted {
            // Version 0 asks for every topic with an empty list, later versions with none (an
            // empty list there asks for no topic).
            Some(names) if !(names.is_empty() && version == 0) => names,
            _ => described.keys().map(|name| (*name).to_owned()).collect(),
        };
        response.topics = names
            .iter()
            .map(|name| match described.get(name.as_str()) {
                Some(topic) => MetadataResponseTopic::default()
                    .with_name(Some(kafka_topic(name)))
                    .with_partitions(
                        (0..topic.partitions.len() as i32)
                            .map(|partition| {
                                MetadataResponsePartition::default()
                                    .with_partition_index(partition)
                                    .with_error_code(code(
                                        placement
                                            .leader
                                            .is_none()
                                            .then_some(ResponseError::LeaderNotAvailable),
                                    ))
                                    .with_leader_id(placement.leader.unwrap_or(BrokerId(-1)))
                                    .with_leader_epoch(0)
                                    .with_replica_nodes(placement.replicas.clone())
                                    .with_isr_nodes(placement.replicas.clone())
                            })
                            .collect(),
                    ),
                None => MetadataResponseTopic::default()
                    .with_name(Some(kafka_topic(name)))
                    .with_error_code(ResponseError::UnknownTopicOrPartition.code()),
            })
            .collect();
        response
    }

    async fn produce(&self, request: ProduceRequest) -> ProduceResponse {
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
        ProduceResponse::default().with_responses(join_all(topics).await)
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
        // Each slot's largest record, to tell a batch refused for now from one that can never
        // be stored whole.
        let mut largest = vec![0_u64; batches.len()];
        for (slot, (partition, batch)) in batches.into_iter().enumerate() {
            if let Ok(produced) = &batch {
                let sizes = produced.records.iter().map(|record| record.size() as u64);
                largest[slot] = sizes.max().unwrap_or(0);
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
        let idempotent = join_all(idempotent.into_iter().map(
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
        // up: a refused batch holding one is answered so, and the client fails it at once
        // instead of retrying until its timeout.
        let refused = |offsets: &[Stored]| offsets.iter().any(|offset| matches!(offset, Ok(-1)));
        let max_bytes = match stored.iter().any(|(_, _, offsets)| refused(offsets)) {
            true => self.max_bytes(topic).await,
            false => None,
        };
        for (slot, partition, offsets) in stored {
            let too_large = Some(largest[slot])
                .zip(max_bytes)
                .filter(|&(size, max)| size > max && refused(&offsets));
            answers[slot] = Some(match too_large {
                Some((size, max)) => refused_partition(
                    partition,
                    ResponseError::MessageTooLarge,
                    format!(
                        "a record of {size} bytes (value, key and headers) can never be stored: \
                         a partition of topic {topic:?} keeps at most {max} bytes"
                    ),
                ),
                None => partition_answer(topic, partition, &offsets),
            });
        }
        answers.into_iter().flatten().collect()
    }

    /// The most bytes a partition of `topic` keeps, if it has such a limit and can be
    /// described.
    async fn max_bytes(&self, topic: &str) -> Option<u64> {
        let described = self.describe(Some(topic.to_owned())).await.ok()?;
        let settings = TopicSettings::from_list(&described.first()?.settings).ok()?;
        settings.max_bytes
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
        let mut rest = records;
        while !rest.is_empty() {
            let later = rest.split_off(rest.len().min(MAX_BATCH_RECORDS));
            let chunk = std::mem::replace(&mut rest, later);
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
                .call(command)
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
    /// `sequence`: a batch sent again is answered with the offsets it got the first time.
    /// Each record's offset (`-1` when full), or why it was refused.
    async fn publish_idempotent(
        &self,
        topic: &str,
        partition: i32,
        producer: u64,
        sequence: i32,
        records: Vec<PublishRecord>,
    ) -> Vec<Stored> {
        let mut offsets = Vec::with_capacity(records.len());
        for (index, chunk) in records.chunks(MAX_BATCH_RECORDS).enumerate() {
            let first = i64::from(sequence) + (index * MAX_BATCH_RECORDS) as i64;
            let command = Command::PublishIdempotent {
                topic: topic.to_owned(),
                producer,
                batches: vec![PartitionBatch {
                    partition,
                    sequence: first.unsigned_abs(),
                    records: chunk.to_vec(),
                }],
            };
            let result = self.call(command).await.map_err(|refusal| match refusal {
                // The topic and partition exist (the producer found them in the metadata),
                // so the broker refused the sequence numbers: ahead of what it expects, or
                // of a batch too old to answer again. Kafka's clients then start their
                // sequences afresh.
                ErrorReply::InvalidArgument(text) if text.contains("sequence") => {
                    (ResponseError::OutOfOrderSequenceNumber, text)
                }
                refusal => refused(&refusal),
            });
            offsets.extend(placed_offsets(result, chunk.len()));
        }
        offsets
    }

    /// Reads the partitions one after another, each within what the answer has room for, so
    /// that what the request holds in memory is bounded by its answer: a partition named twice
    /// is read once (as Kafka does, at the place it was first named, from the offset it was
    /// last given).
    async fn fetch(&self, request: FetchRequest) -> FetchResponse {
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
        for partition in &wanted {
            // At most what is left: a read always gets its first record, whatever its size.
            let result = self.read(partition, room.left, Duration::ZERO).await;
            found_nothing &= matches!(&result, Ok(outcome) if outcome.found_no_records());
            answers.push(self.partition_data(partition, result, &mut room).await);
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
            max_bytes: Some(wanted.max_bytes.min(limit).min(self.frame_room() / 2)),
        };
        self.backend.call(command, wait).await
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
                    .call(Command::EndOffset {
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

    async fn list_offsets(&self, request: ListOffsetsRequest) -> ListOffsetsResponse {
        let topics = request.topics.into_iter().map(|topic| async move {
            let name = topic_name(&topic.name);
            let described = self.describe(Some(name.clone())).await;
            let mut partitions = Vec::with_capacity(topic.partitions.len());
            for wanted in &topic.partitions {
                let answer = ListOffsetsPartitionResponse::default()
                    .with_partition_index(wanted.partition_index)
                    .with_timestamp(-1)
                    .with_offset(-1);
                let bounds = match &described {
                    Ok(described) => described.first().and_then(|topic| {
                        usize::try_from(wanted.partition_index)
                            .ok()
                            .and_then(|index| topic.partitions.get(index))
                    }),
                    Err(_) => None,
                };
                let Some(bounds) = bounds else {
                    let error = match &described {
                        Err(refusal) => kafka_error(refusal),
                        Ok(_) => ResponseError::UnknownTopicOrPartition,
                    };
                    partitions.push(answer.with_error_code(error.code()));
                    continue;
                };
                let found = match wanted.timestamp {
                    LATEST => Ok((bounds.end_offset, -1)),
                    EARLIEST => Ok((bounds.earliest_offset, -1)),
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
        ListOffsetsResponse::default().with_topics(join_all(topics).await)
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
            .call(Command::OffsetForTime {
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
        let read = Command::Read {
            topic: topic.to_owned(),
            partition,
            offset,
            max_records: 1,
            max_bytes: Some(0),
        };
        match self.call(read).await {
            Ok(Outcome::Read(read)) => Ok(read
                .records
                .first()
                .map_or((-1, -1), |record| (record.offset, record.timestamp_ms))),
            Ok(other) => Err(kafka_error(&unexpected(&other))),
            Err(refusal) => Err(kafka_error(&refusal)),
        }
    }

    async fn create_topics(&self, request: CreateTopicsRequest) -> CreateTopicsResponse {
        let validate_only = request.validate_only;
        let topics = request.topics.into_iter().map(|topic| async move {
            let name = topic_name(&topic.name);
            let answer = CreatableTopicResult::default().with_name(topic.name.clone());
            let refused = |error: ResponseError, text: String| {
                answer
                    .clone()
                    .with_error_code(error.code())
                    .with_error_message(message(text))
            };
            if let Err(error) = broker_core::TopicName::new(&name) {
                return refused(ResponseError::InvalidTopicException, error.to_string());
            }
            let partition_count = match topic.num_partitions {
                -1 => 1,
                count if count >= 1 => count,
                count => {
                    return refused(
                        ResponseError::InvalidPartitions,
                        format!("a topic needs at least one partition, not {count}"),
                    )
                }
            };
            if !matches!(topic.replication_factor, -1 | 1) {
                return refused(
                    ResponseError::InvalidReplicationFactor,
                    format!(
                        "replication factor {} is not supported: every node of the broker \
                         keeps every partition (use -1 or 1)",
                        topic.replication_factor
                    ),
                );
            }
            if !topic.assignments.is_empty() {
                return refused(
                    ResponseError::InvalidReplicaAssignment,
                    "replica assignments are not supported: every node keeps every partition"
                        .to_owned(),
                );
            }
            let settings = match configs::topic_settings(&topic.configs) {
                Ok(settings) => settings,
                Err(text) => return refused(ResponseError::InvalidConfig, text),
            };
            if validate_only {
                return answer
                    .with_num_partitions(partition_count)
                    .with_replication_factor(1);
            }
            let command = Command::Create {
                topic: name,
                partition_count,
                key_hash: KeyHash::Murmur2,
                settings,
            };
            match self.call(command).await {
                Ok(Outcome::Created(true)) => answer
                    .with_num_partitions(partition_count)
                    .with_replication_factor(1),
                Ok(Outcome::Created(false)) => refused(
                    ResponseError::TopicAlreadyExists,
                    format!("topic {:?} already exists", topic.name.as_str()),
                ),
                Ok(other) => {
                    let refusal = unexpected(&other);
                    refused(kafka_error(&refusal), refusal.to_string())
                }
                Err(ErrorReply::InvalidArgument(text)) => {
                    refused(ResponseError::PolicyViolation, text)
                }
                Err(refusal) => refused(kafka_error(&refusal), refusal.to_string()),
            }
        });
        CreateTopicsResponse::default().with_topics(join_all(topics).await)
    }

    fn find_coordinator(&self, request: &FindCoordinatorRequest) -> FindCoordinatorResponse {
        let response = FindCoordinatorResponse::default();
        if request.key_type != GROUP_KEY {
            // Not `COORDINATOR_NOT_AVAILABLE`, which the clients retry until their timeout: a
            // transactional producer gives up at once on this one.
            return response
                .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
                .with_node_id(BrokerId(-1))
                .with_port(-1)
                .with_error_message(message(
                    "transactions are not supported by this broker".to_owned(),
                ));
        }
        let placement = self.placement();
        let coordinator = placement
            .leader
            .and_then(|leader| placement.brokers.into_iter().find(|(id, _)| *id == leader));
        match coordinator {
            Some((id, endpoint)) => response
                .with_node_id(id)
                .with_host(StrBytes::from_string(endpoint.host))
                .with_port(endpoint.port),
            // An election under way, or the leader's Kafka address not heard yet: the client
            // asks again.
            None => response
                .with_error_code(ResponseError::CoordinatorNotAvailable.code())
                .with_node_id(BrokerId(-1))
                .with_port(-1),
        }
    }

    async fn join_group(&self, request: JoinGroupRequest, client_id: &str) -> JoinGroupResponse {
        let group = request.group_id.as_str().to_owned();
        let refused = |error: ResponseError| {
            JoinGroupResponse::default()
                .with_error_code(error.code())
                .with_generation_id(-1)
                .with_member_id(request.member_id.clone())
        };
        if !is_group_id(&group) {
            return refused(ResponseError::InvalidGroupId);
        }
        if !SESSION_TIMEOUT_MS.contains(&request.session_timeout_ms) {
            return refused(ResponseError::InvalidSessionTimeout);
        }
        // A group name is used by one protocol at a time.
        match self.has_native_members(&group).await {
            Ok(false) => {}
            Ok(true) => return refused(ResponseError::InconsistentGroupProtocol),
            Err(refusal) => return refused(coordinator_error(&refusal)),
        }
        let session_timeout = millis(request.session_timeout_ms);
        // Version 0 has no rebalance timeout: it is the session timeout.
        let rebalance_timeout = match request.rebalance_timeout_ms {
            timeout if timeout > 0 => millis(timeout.min(*SESSION_TIMEOUT_MS.end())),
            _ => session_timeout,
        };
        let join = Join {
            member_id: request.member_id.as_str().to_owned(),
            client_id: client_id.to_owned(),
            client_host: self.client_host.clone(),
            protocol_type: request.protocol_type.as_str().to_owned(),
            protocols: request
                .protocols
                .iter()
                .map(|protocol| (protocol.name.as_str().to_owned(), protocol.metadata.clone()))
                .collect(),
            session_timeout,
            rebalance_timeout,
        };
        match self.coordinator.join(&group, join).await {
            Ok((member_id, round)) => {
                let leads = round.leader == member_id;
                JoinGroupResponse::default()
                    .with_generation_id(round.generation)
                    .with_protocol_type(Some(request.protocol_type))
                    .with_protocol_name(Some(StrBytes::from_string(round.protocol)))
                    .with_leader(StrBytes::from_string(round.leader))
                    .with_member_id(StrBytes::from_string(member_id))
                    .with_members(if leads {
                        round
                            .members
                            .into_iter()
                            .map(|(id, metadata)| {
                                JoinGroupResponseMember::default()
                                    .with_member_id(StrBytes::from_string(id))
                                    .with_metadata(metadata)
                            })
                            .collect()
                    } else {
                        Vec::new()
                    })
            }
            Err(error) => refused(error),
        }
    }

    /// Whether a group of the broker named `group` has members that joined natively, on any
    /// topic.
    async fn has_native_members(&self, group: &str) -> Result<bool, ErrorReply> {
        Ok(self.describe(None).await?.iter().any(|topic| {
            topic
                .groups
                .iter()
                .any(|described| described.name == group && !described.members.is_empty())
        }))
    }

    async fn sync_group(&self, request: SyncGroupRequest) -> SyncGroupResponse {
        let assignments = request
            .assignments
            .into_iter()
            .map(|assignment| {
                (
                    assignment.member_id.as_str().to_owned(),
                    assignment.assignment,
                )
            })
            .collect();
        let synced = self
            .coordinator
            .sync(
                request.group_id.as_str(),
                request.member_id.as_str(),
                request.generation_id,
                assignments,
            )
            .await;
        match synced {
            Ok(assignment) => SyncGroupResponse::default().with_assignment(assignment),
            Err(error) => SyncGroupResponse::default().with_error_code(error.code()),
        }
    }

    fn leave_group(&self, request: &LeaveGroupRequest) -> LeaveGroupResponse {
        // Up to version 2 one member leaves; from version 3 a batch of them.
        let leaving: Vec<String> = if request.members.is_empty() {
            vec![request.member_id.as_str().to_owned()]
        } else {
            request
                .members
                .iter()
                .map(|member| member.member_id.as_str().to_owned())
                .collect()
        };
        let answers = self.coordinator.leave(request.group_id.as_str(), &leaving);
        let first_error = answers.iter().find_map(|answer| answer.err());
        LeaveGroupResponse::default()
            .with_error_code(code(if request.members.is_empty() {
                first_error
            } else {
                None
            }))
            .with_members(
                request
                    .members
                    .iter()
                    .zip(&answers)
                    .map(|(member, answer)| {
                        MemberResponse::default()
                            .with_member_id(member.member_id.clone())
                            .with_error_code(code(answer.err()))
                    })
                    .collect(),
            )
    }

    async fn offset_commit(&self, request: OffsetCommitRequest) -> OffsetCommitResponse {
        let group = request.group_id.as_str();
        let allowed = if is_group_id(group) {
            self.coordinator.may_commit(
                group,
                request.member_id.as_str(),
                request.generation_id_or_member_epoch,
            )
        } else {
            Err(ResponseError::InvalidGroupId)
        };
        let topics = request.topics.into_iter().map(|topic| async move {
            let offsets: Vec<(i32, i64)> = topic
                .partitions
                .iter()
                .map(|p| (p.partition_index, p.committed_offset.max(0)))
                .collect();
            let errors = match allowed {
                Err(error) => vec![Some(error); offsets.len()],
                Ok(()) => {
                    self.commit_offsets(group, topic_name(&topic.name), &offsets)
                        .await
                }
            };
            OffsetCommitResponseTopic::default()
                .with_name(topic.name)
                .with_partitions(
                    offsets
                        .iter()
                        .zip(errors)
                        .map(|(&(partition, _), error)| {
                            OffsetCommitResponsePartition::default()
                                .with_partition_index(partition)
                                .with_error_code(code(error))
                        })
                        .collect(),
                )
        });
        OffsetCommitResponse::default().with_topics(join_all(topics).await)
    }

    /// Stores `group`'s committed `offsets` (partition, offset) on `topic`; each one's error,
    /// if any. An offset past its partition's end is refused with `OFFSET_OUT_OF_RANGE` and the
    /// others are stored: the broker keeps no committed offset past the end (it would store
    /// the end), and a consumer that resumed from the end would read nothing where Kafka's
    /// consumer resumes from its `auto.offset.reset`.
    async fn commit_offsets(
        &self,
        group: &str,
        topic: String,
        offsets: &[(i32, i64)],
    ) -> Vec<Option<ResponseError>> {
        // The group's lag gives every partition's end offset in one call. Offsets only grow, so
        // an offset within the end when read is still within it when stored.
        let lag = Command::Lag {
            topic: topic.clone(),
            group: group.to_owned(),
        };
        let ends = match self.call(lag).await {
            Ok(Outcome::Lag(rows)) => rows,
            Ok(other) => return vec![Some(coordinator_error(&unexpected(&other))); offsets.len()],
            Err(refusal) => return vec![Some(coordinator_error(&refusal)); offsets.len()],
        };
        // One row per partition, in order.
        let past_end = |&(partition, offset): &(i32, i64)| {
            usize::try_from(partition)
                .ok()
                .and_then(|index| ends.get(index))
                .is_some_and(|row| offset > row.end_offset)
        };
        let stored: Vec<(i32, i64)> = offsets.iter().copied().filter(|o| !past_end(o)).collect();
        let error = if stored.is_empty() {
            None
        } else {
            let command = Command::CommitGroup {
                topic,
                group: group.to_owned(),
                offsets: stored,
            };
            match self.call(command).await {
                Ok(_) => None,
                // The broker's group has members of its own: as in Kafka, only a group's
                // members commit while it has some.
                Err(ErrorReply::InvalidArgument(text)) if text.contains("members of its own") => {
                    Some(ResponseError::UnknownMemberId)
                }
                Err(refusal) => Some(coordinator_error(&refusal)),
            }
        };
        offsets
            .iter()
            .map(|offset| {
                if past_end(offset) {
                    Some(ResponseError::OffsetOutOfRange)
                } else {
                    error
                }
            })
            .collect()
    }

    async fn offset_fetch(&self, request: OffsetFetchRequest) -> OffsetFetchResponse {
        let group = request.group_id.as_str();
        if !is_group_id(group) {
            return OffsetFetchResponse::default()
                .with_error_code(ResponseError::InvalidGroupId.code());
        }
        let described = match self.describe(None).await {
            Ok(topics) => topics,
            Err(refusal) => {
                return OffsetFetchResponse::default()
                    .with_error_code(coordinator_error(&refusal).code())
            }
        };
        // What the group committed on each partition of each topic it has a group of the
        // broker on; -1 where it committed nothing (the client then applies its reset policy).
        let committed = |topic: &str, partition: i32| -> i64 {
            described
                .iter()
                .find(|described| described.name == topic)
                .and_then(|described| described.groups.iter().find(|g| g.name == group))
                .and_then(|g| {
                    usize::try_from(partition)
                        .ok()
                        .and_then(|p| g.partitions.get(p))
                })
                .map_or(-1, |progress| progress.committed)
        };
        let wanted: Vec<(String, Vec<i32>)> = match request.topics {
            Some(topics) => topics
                .iter()
                .map(|topic| (topic_name(&topic.name), topic.partition_indexes.clone()))
                .collect(),
            // Every topic the group committed on.
            None => described
                .iter()
                .filter_map(|topic| {
                    let g = topic.groups.iter().find(|g| g.name == group)?;
                    Some((topic.name.clone(), (0..g.partitions.len() as i32).collect()))
                })
                .collect(),
        };
        OffsetFetchResponse::default().with_topics(
            wanted
                .into_iter()
                .map(|(topic, partitions)| {
                    let answers = partitions
                        .iter()
                        .map(|&partition| {
                            OffsetFetchResponsePartition::default()
                                .with_partition_index(partition)
                                .with_committed_offset(committed(&topic, partition))
                                .with_metadata(Some(StrBytes::default()))
                        })
                        .collect();
                    OffsetFetchResponseTopic::default()
                        .with_name(kafka_topic(&topic))
                        .with_partitions(answers)
                })
                .collect(),
        )
    }

    /// The names of the broker's groups that have no members of their own: groups Kafka's
    /// clients committed offsets for (or native groups all of whose members left), which Kafka
    /// shows as `Empty` groups.
    async fn memberless_groups(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .describe(None)
            .await
            .unwrap_or_default()
            .iter()
            .flat_map(|topic| &topic.groups)
            .filter(|group| group.members.is_empty())
            .map(|group| group.name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    async fn describe_groups(&self, request: &DescribeGroupsRequest) -> DescribeGroupsResponse {
        let memberless = self.memberless_groups().await;
        DescribeGroupsResponse::default().with_groups(
            request
                .groups
                .iter()
                .map(|group| {
                    let mut described = self.coordinator.describe(group.as_str());
                    if described.state == DEAD
                        && memberless.iter().any(|name| name == group.as_str())
                    {
                        described.state = EMPTY;
                        described.protocol_type = CONSUMER.to_owned();
                    }
                    DescribedGroup::default()
                        .with_group_id(group.clone())
                        .with_group_state(StrBytes::from_static_str(described.state))
                        .with_protocol_type(StrBytes::from_string(described.protocol_type))
                        .with_protocol_data(StrBytes::from_string(described.protocol))
                        .with_members(
                            described
                                .members
                                .into_iter()
                                .map(|(id, client_id, host, metadata, assignment)| {
                                    DescribedGroupMember::default()
                                        .with_member_id(StrBytes::from_string(id))
                                        .with_client_id(StrBytes::from_string(client_id))
                                        .with_client_host(StrBytes::from_string(host))
                                        .with_member_metadata(metadata)
                                        .with_member_assignment(assignment)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
    }

    /// Every group, with members or with committed offsets, in the states asked for (every
    /// state when none is).
    async fn list_groups(&self, request: &ListGroupsRequest) -> ListGroupsResponse {
        let mut listed = self.coordinator.list();
        for name in self.memberless_groups().await {
            if !listed.iter().any(|(group, _, _)| *group == name) {
                listed.push((name, CONSUMER.to_owned(), EMPTY));
            }
        }
        let wanted = &request.states_filter;
        listed.retain(|(_, _, state)| {
            wanted.is_empty() || wanted.iter().any(|asked| asked.eq_ignore_ascii_case(state))
        });
        listed.sort();
        ListGroupsResponse::default().with_groups(
            listed
                .into_iter()
                .map(|(group, protocol_type, state)| {
                    ListedGroup::default()
                        .with_group_id(GroupId(StrBytes::from_string(group)))
                        .with_protocol_type(StrBytes::from_string(protocol_type))
                        .with_group_state(StrBytes::from_static_str(state))
                })
                .collect(),
        )
    }

    async fn delete_records(&self, request: DeleteRecordsRequest) -> DeleteRecordsResponse {
        let topics = request.topics.into_iter().map(|topic| async move {
            let name = topic_name(&topic.name);
            let partitions = topic.partitions.iter().map(|wanted| {
                let name = name.clone();
                async move {
                    let answer = DeleteRecordsPartitionResult::default()
                        .with_partition_index(wanted.partition_index)
                        .with_low_watermark(-1);
                    if wanted.offset < -1 {
                        return answer.with_error_code(ResponseError::OffsetOutOfRange.code());
                    }
                    let end = match self
                        .call(Command::EndOffset {
                            topic: name.clone(),
                            partition: wanted.partition_index,
                        })
                        .await
                    {
                        Ok(Outcome::Offset(end)) => end,
                        Ok(other) => {
                            return answer.with_error_code(kafka_error(&unexpected(&other)).code())
                        }
                        Err(refusal) => {
                            return answer.with_error_code(kafka_error(&refusal).code())
                        }
                    };
                    // -1 deletes up to the end. Past the end, Kafka refuses and deletes
                    // nothing (offsets only grow, so what was past the end when read could
                    // only have become valid later).
                    let before = match wanted.offset {
                        -1 => end,
                        offset if offset <= end => offset,
                        _ => return answer.with_error_code(ResponseError::OffsetOutOfRange.code()),
                    };
                    let command = Command::Purge {
                        topic: name,
                        partition: wanted.partition_index,
                        before,
                    };
                    match self.call(command).await {
                        Ok(Outcome::Offset(earliest)) => answer.with_low_watermark(earliest),
                        Ok(other) => {
                            answer.with_error_code(kafka_error(&unexpected(&other)).code())
                        }
                        Err(refusal) => answer.with_error_code(kafka_error(&refusal).code()),
                    }
                }
            });
            DeleteRecordsTopicResult::default()
                .with_name(topic.name.clone())
                .with_partitions(join_all(partitions).await)
        });
        DeleteRecordsResponse::default().with_topics(join_all(topics).await)
    }

    async fn delete_topics(&self, request: DeleteTopicsRequest) -> DeleteTopicsResponse {
        let topics = request.topic_names.into_iter().map(|name| async move {
            let answer = DeletableTopicResult::default().with_name(Some(name.clone()));
            let command = Command::DeleteTopic {
                topic: topic_name(&name),
            };
            let error = match self.call(command).await {
                Ok(Outcome::Deleted(true)) => None,
                Ok(Outcome::Deleted(false)) | Err(ErrorReply::InvalidArgument(_)) => {
                    Some(ResponseError::UnknownTopicOrPartition)
                }
                Ok(other) => Some(kafka_error(&unexpected(&other))),
                Err(refusal) => Some(kafka_error(&refusal)),
            };
            answer.with_error_code(code(error))
        });
        DeleteTopicsResponse::default().with_responses(join_all(topics).await)
    }
}

/// A new producer id for an idempotent producer (epoch 0), or a refusal for a transactional
/// one. A producer that asks again with its id and epoch (after an error it cannot recover its
/// sequences from) gets a new id, so that its sequences start afresh; one that bumps its epoch
/// itself is a new producer too (see `records::native_producer`).
fn init_producer_id(request: &InitProducerIdRequest) -> InitProducerIdResponse {
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

/// What became of one produced record: its offset (`-1` when its partition was full), or the
/// Kafka error that refused it and why.
type Stored = Result<i64, (ResponseError, String)>;

/// A refusal of the broker as a Kafka error and its message.
fn refused(refusal: &ErrorReply) -> (ResponseError, String) {
    (kafka_error(refusal), refusal.to_string())
}

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

/// An outcome no command of the listener can have had: a bug, answered as the server's error.
#[cold]
fn unexpected(outcome: &Outcome) -> ErrorReply {
    ErrorReply::Storage(format!("unexpected outcome {}", outcome.name()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use broker_core::EventBroker;
    use bytes::BytesMut;
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    use kafka_protocol::messages::ApiKey;

    use super::*;

    /// The broker in memory, as a backend: what the server does, without the network.
    type Local = EventBroker;

    fn settings() -> KafkaSettings {
        KafkaSettings {
            node_id: 0,
            cluster_id: "test".into(),
            advertise: None,
            max_frame_bytes: 1 << 20,
            max_record_bytes: 1 << 16,
            idle_timeout: Duration::from_secs(60),
            read_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(60),
        }
    }

    fn endpoint() -> Endpoint {
        Endpoint {
            host: "127.0.0.1".into(),
            port: 9093,
        }
    }

    async fn ask<B: Backend>(
        broker: &B,
        version: i16,
        request: RequestKind,
    ) -> Option<ResponseKind> {
        match answer(broker, version, request).await {
            Answer::Response(response) => Some(*response),
            Answer::Nothing | Answer::Close => None,
            Answer::Refused(error) => panic!("refused: {error:?}"),
        }
    }

    async fn answer<B: Backend>(broker: &B, version: i16, request: RequestKind) -> Answer {
        let settings = settings();
        let coordinator = Coordinator::default();
        let handler = Handler {
            backend: broker,
            settings: &settings,
            coordinator: &coordinator,
            endpoint: endpoint(),
            client_host: "/127.0.0.1".into(),
        };
        handler.handle(version, "test", request).await
    }

    /// A record batch of `count` records, of `producer` (at epoch 0) from `sequence` when
    /// given.
    fn batch(count: i64, producer: Option<(i64, i32)>) -> Bytes {
        batch_at_epoch(count, producer.map(|(id, first)| (id, 0, first)))
    }

    /// A record batch of `count` records, of `producer` at `epoch` from `sequence` when given.
    fn batch_at_epoch(count: i64, producer: Option<(i64, i16, i32)>) -> Bytes {
        batch_of(count, producer, |i| Bytes::from(format!("r{i}")))
    }

    /// A batch of `count` records of `producer` (as [`batch_at_epoch`]), record `i`'s value
    /// `value(i)`.
    fn batch_of(
        count: i64,
        producer: Option<(i64, i16, i32)>,
        value: impl Fn(i64) -> Bytes,
    ) -> Bytes {
        let records: Vec<Record> = (0..count)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: producer.map_or(-1, |(id, _, _)| id),
                producer_epoch: producer.map_or(-1, |(_, epoch, _)| epoch),
                timestamp_type: TimestampType::Creation,
                offset: i,
                sequence: producer.map_or(-1, |(_, _, first)| first + i as i32),
                timestamp: 1_000 + i,
                key: None,
                value: Some(value(i)),
                headers: Default::default(),
            })
            .collect();
        let mut buffer = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut buffer, &records, &options).unwrap();
        buffer.freeze()
    }

    fn produce(acks: i16, topic: &str, partition: i32, records: Bytes) -> RequestKind {
        RequestKind::Produce(ProduceRequest::default().with_acks(acks).with_topic_data(
            vec![TopicProduceData::default()
                    .with_name(kafka_topic(topic))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(records))])],
        ))
    }

    /// The one partition answer of a produce.
    fn produced(response: Option<ResponseKind>) -> PartitionProduceResponse {
        match response {
            Some(ResponseKind::Produce(mut response)) => {
                response.responses.remove(0).partition_responses.remove(0)
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn fetch(topic: &str, partition: i32, offset: i64) -> RequestKind {
        RequestKind::Fetch(
            FetchRequest::default().with_topics(vec![FetchTopic::default()
                .with_topic(kafka_topic(topic))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(1 << 20)])]),
        )
    }

    /// The one partition answer of a fetch.
    fn fetched(response: Option<ResponseKind>) -> PartitionData {
        match response {
            Some(ResponseKind::Fetch(mut response)) => {
                response.responses.remove(0).partitions.remove(0)
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn broker(capacity: i32) -> Local {
        let broker = EventBroker::new(capacity).unwrap();
        broker.create("t", 2).unwrap();
        broker
    }

    #[tokio::test]
    async fn an_idempotent_batch_sent_twice_is_stored_once() {
        let broker = broker(100);
        let first = produced(ask(&broker, 9, produce(-1, "t", 1, batch(3, Some((7, 0))))).await);
        assert_eq!((first.error_code, first.base_offset), (0, 0));
        let again = produced(ask(&broker, 9, produce(-1, "t", 1, batch(3, Some((7, 0))))).await);
        assert_eq!((again.error_code, again.base_offset), (0, 0));
        assert_eq!(broker.end_offset("t", 1).unwrap(), 3);
        let next = produced(ask(&broker, 9, produce(-1, "t", 1, batch(2, Some((7, 3))))).await);
        assert_eq!(next.base_offset, 3);
        // A gap in the sequence numbers.
        let ahead = produced(ask(&broker, 9, produce(-1, "t", 1, batch(1, Some((7, 9))))).await);
        assert_eq!(
            ahead.error_code,
            ResponseError::OutOfOrderSequenceNumber.code()
        );
        assert_eq!(broker.end_offset("t", 1).unwrap(), 5);
        // The producer bumps its epoch (as librdkafka does when it cannot tell what became
        // of a batch) and numbers its batches from zero again: stored, and de-duplicated.
        let bumped = || produce(-1, "t", 1, batch_at_epoch(2, Some((7, 1, 0))));
        let after_bump = produced(ask(&broker, 9, bumped()).await);
        assert_eq!((after_bump.error_code, after_bump.base_offset), (0, 5));
        let retried = produced(ask(&broker, 9, bumped()).await);
        assert_eq!((retried.error_code, retried.base_offset), (0, 5));
        assert_eq!(broker.end_offset("t", 1).unwrap(), 7);
    }

    #[tokio::test]
    async fn acks_0_is_stored_and_answered_by_nothing() {
        let broker = broker(100);
        assert!(matches!(
            answer(&broker, 9, produce(0, "t", 0, batch(2, None))).await,
            Answer::Nothing
        ));
        assert_eq!(broker.end_offset("t", 0).unwrap(), 2);
        // Refused (a partition it does not have): the connection closes, so that the client
        // asks for metadata again.
        assert!(matches!(
            answer(&broker, 9, produce(0, "t", 7, batch(2, None))).await,
            Answer::Close
        ));
        let bad = produced(ask(&broker, 9, produce(5, "t", 0, batch(1, None))).await);
        assert_eq!(bad.error_code, ResponseError::InvalidRequiredAcks.code());
    }

    #[tokio::test]
    async fn a_full_partition_answers_a_retriable_error() {
        let broker = broker(2);
        let full = produced(ask(&broker, 9, produce(1, "t", 0, batch(3, None))).await);
        assert_eq!(full.error_code, ResponseError::NotEnoughReplicas.code());
        assert!(ResponseError::NotEnoughReplicas.is_retriable());
        assert!(full.error_message.unwrap().contains("is full"));
    }

    #[tokio::test]
    async fn a_partition_full_within_a_batch_of_many_chunks_takes_nothing_after_it() {
        use broker_core::{Discard, Retention, TopicSetting};
        // The first chunk's small records fill the partition but for a few bytes, and its last
        // record, larger, is refused; the next chunk's small records would fit.
        let last_of_first_chunk = MAX_BATCH_RECORDS as i64 - 1;
        let broker = broker(100);
        let settings = [
            TopicSetting::Retention(Retention::Limits),
            TopicSetting::MaxBytes(last_of_first_chunk as u64 + 5),
            TopicSetting::Discard(Discard::New),
        ];
        broker
            .create_topic("big", 1, KeyHash::default(), &settings)
            .unwrap();
        let records = batch_of(last_of_first_chunk + 10, None, |i| match i {
            i if i == last_of_first_chunk => Bytes::from(vec![b'L'; 1000]),
            _ => Bytes::from_static(b"s"),
        });
        let full = produced(ask(&broker, 9, produce(1, "big", 0, records)).await);
        assert_eq!(full.error_code, ResponseError::NotEnoughReplicas.code());
        assert_eq!(broker.end_offset("big", 0).unwrap(), last_of_first_chunk);
    }

    #[tokio::test]
    async fn unknown_topics_and_transactional_producers_are_refused() {
        let broker = broker(100);
        let unknown = produced(ask(&broker, 9, produce(1, "nope", 0, batch(1, None))).await);
        assert_eq!(
            unknown.error_code,
            ResponseError::UnknownTopicOrPartition.code()
        );
        let transactional = RequestKind::Produce(match produce(1, "t", 0, batch(1, None)) {
            RequestKind::Produce(request) => {
                request.with_transactional_id(Some(StrBytes::from_static_str("tx").into()))
            }
            _ => unreachable!(),
        });
        let refused = produced(ask(&broker, 9, transactional).await);
        assert_eq!(
            refused.error_code,
            ResponseError::TransactionalIdAuthorizationFailed.code()
        );
        assert_eq!(broker.end_offset("t", 0).unwrap(), 0);
        // A transactional producer asks for its coordinator first: refused so, its client
        // gives up at once (it would retry `COORDINATOR_NOT_AVAILABLE` until its timeout).
        let coordinator = RequestKind::FindCoordinator(
            FindCoordinatorRequest::default()
                .with_key(StrBytes::from_static_str("tx"))
                .with_key_type(1),
        );
        match ask(&broker, 3, coordinator).await {
            Some(ResponseKind::FindCoordinator(found)) => assert_eq!(
                found.error_code,
                ResponseError::TransactionalIdAuthorizationFailed.code()
            ),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_record_over_the_servers_limit_fails_its_partition_alone() {
        let broker = broker(100);
        let limit = settings().max_record_bytes as usize;
        let oversized = batch_of(3, None, |i| match i {
            1 => Bytes::from(vec![b'x'; limit + 1]),
            _ => Bytes::from(format!("r{i}")),
        });
        let request = ProduceRequest::default()
            .with_acks(-1)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(kafka_topic("t"))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(oversized)),
                    PartitionProduceData::default()
                        .with_index(1)
                        .with_records(Some(batch(2, None))),
                ])]);
        let answers = match ask(&broker, 9, RequestKind::Produce(request)).await {
            Some(ResponseKind::Produce(mut response)) => {
                response.responses.remove(0).partition_responses
            }
            other => panic!("unexpected {other:?}"),
        };
        let codes: Vec<(i32, i16)> = answers.iter().map(|a| (a.index, a.error_code)).collect();
        assert_eq!(codes, [(0, ResponseError::MessageTooLarge.code()), (1, 0)]);
        assert_eq!(broker.end_offset("t", 0).unwrap(), 0);
        assert_eq!(broker.end_offset("t", 1).unwrap(), 2);
    }

    #[tokio::test]
    async fn deleting_records_past_the_end_is_refused_and_deletes_nothing() {
        use kafka_protocol::messages::delete_records_request::{
            DeleteRecordsPartition, DeleteRecordsTopic,
        };
        let broker = broker(100);
        for i in 0..4 {
            broker.publish("t", 0, format!("r{i}")).unwrap();
        }
        let delete = |offset: i64| {
            RequestKind::DeleteRecords(DeleteRecordsRequest::default().with_topics(vec![
                DeleteRecordsTopic::default()
                    .with_name(TopicName(StrBytes::from_static_str("t")))
                    .with_partitions(vec![DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(offset)]),
            ]))
        };
        let deleted = |response: Option<ResponseKind>| match response {
            Some(ResponseKind::DeleteRecords(mut response)) => {
                let answer = response.topics.remove(0).partitions.remove(0);
                (answer.error_code, answer.low_watermark)
            }
            other => panic!("unexpected {other:?}"),
        };
        let out_of_range = ResponseError::OffsetOutOfRange.code();
        assert_eq!(
            deleted(ask(&broker, 2, delete(5)).await),
            (out_of_range, -1)
        );
        assert_eq!(
            deleted(ask(&broker, 2, delete(-2)).await),
            (out_of_range, -1)
        );
        // Nothing was deleted: purging below offset 0 answers the earliest offset.
        assert_eq!(broker.purge("t", 0, 0).unwrap(), 0);
        assert_eq!(deleted(ask(&broker, 2, delete(2)).await), (0, 2));
        assert_eq!(deleted(ask(&broker, 2, delete(4)).await), (0, 4));
        broker.publish("t", 0, "r4").unwrap();
        assert_eq!(deleted(ask(&broker, 2, delete(-1)).await), (0, 5));
    }

    #[tokio::test]
    async fn fetches_outside_the_retained_records_are_out_of_range() {
        let broker = broker(100);
        for i in 0..4 {
            broker.publish("t", 0, format!("r{i}")).unwrap();
        }
        broker.purge("t", 0, 2).unwrap();
        let below = fetched(ask(&broker, 12, fetch("t", 0, 1)).await);
        assert_eq!(below.error_code, ResponseError::OffsetOutOfRange.code());
        assert_eq!((below.log_start_offset, below.high_watermark), (2, 4));
        let past = fetched(ask(&broker, 12, fetch("t", 0, 9)).await);
        assert_eq!(past.error_code, ResponseError::OffsetOutOfRange.code());
        let unknown = fetched(ask(&broker, 12, fetch("t", 5, 0)).await);
        assert_eq!(
            unknown.error_code,
            ResponseError::UnknownTopicOrPartition.code()
        );
        let at = fetched(ask(&broker, 12, fetch("t", 0, 2)).await);
        assert_eq!(at.error_code, 0);
        let mut records = at.records.unwrap();
        let sets = kafka_protocol::records::RecordBatchDecoder::decode_all(&mut records).unwrap();
        let offsets: Vec<i64> = sets
            .iter()
            .flat_map(|s| &s.records)
            .map(|r| r.offset)
            .collect();
        assert_eq!(offsets, vec![2, 3]);
    }

    /// Node 0 of a cluster of nodes 0 and 2, where `leader` leads: the broker in memory as
    /// such a node sees it.
    struct ClusterNode {
        broker: Local,
        leader: Option<i32>,
    }

    impl Backend for ClusterNode {
        async fn call(&self, command: Command, max_wait: Duration) -> Result<Outcome, ErrorReply> {
            self.broker.call(command, max_wait).await
        }

        async fn topics(&self) -> Result<Vec<TopicDescription>, ErrorReply> {
            self.broker.topics().await
        }

        fn cluster(&self) -> Option<crate::ClusterView> {
            Some(crate::ClusterView {
                brokers: vec![(0, "node-0".into(), 9093), (2, "node-2".into(), 9093)],
                leader: self.leader,
                replicas: vec![0, 2],
            })
        }

        /// The node asked is node 0 (the test settings' node id).
        fn coordinates_groups(&self) -> bool {
            self.leader == Some(0)
        }

        fn requires_authentication(&self) -> bool {
            false
        }

        fn authenticate(&self, _password: &str) -> bool {
            true
        }
    }

    #[tokio::test]
    async fn a_cluster_node_lists_every_node_and_sends_clients_to_the_leader() {
        let node = ClusterNode {
            broker: broker(100),
            leader: Some(2),
        };
        let metadata = |response: Option<ResponseKind>| match response {
            Some(ResponseKind::Metadata(response)) => response,
            other => panic!("unexpected {other:?}"),
        };
        let listed = metadata(
            ask(
                &node,
                12,
                RequestKind::Metadata(MetadataRequest::default().with_topics(None)),
            )
            .await,
        );
        let brokers: Vec<(i32, &str)> = listed
            .brokers
            .iter()
            .map(|broker| (broker.node_id.0, broker.host.as_str()))
            .collect();
        assert_eq!(brokers, vec![(0, "node-0"), (2, "node-2")]);
        assert_eq!(listed.controller_id, BrokerId(2));
        let partition = &listed.topics[0].partitions[0];
        assert_eq!(
            (partition.error_code, partition.leader_id),
            (0, BrokerId(2))
        );
        assert_eq!(partition.replica_nodes, vec![BrokerId(0), BrokerId(2)]);
        let find = RequestKind::FindCoordinator(
            FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("g")),
        );
        match ask(&node, 3, find.clone()).await {
            Some(ResponseKind::FindCoordinator(found)) => {
                assert_eq!((found.error_code, found.node_id), (0, BrokerId(2)));
                assert_eq!(found.host.as_str(), "node-2");
            }
            other => panic!("unexpected {other:?}"),
        }
        // Group requests go to the leader; this node coordinates none.
        let heartbeat = RequestKind::Heartbeat(
            kafka_protocol::messages::HeartbeatRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("g"))),
        );
        match ask(&node, 3, heartbeat).await {
            Some(ResponseKind::Heartbeat(answer)) => {
                assert_eq!(answer.error_code, ResponseError::NotCoordinator.code());
            }
            other => panic!("unexpected {other:?}"),
        }
        // While no node leads, or while the leader's address is not known yet, clients are
        // told to ask again.
        for leader in [None, Some(1)] {
            let electing = ClusterNode {
                broker: broker(100),
                leader,
            };
            let listed = metadata(
                ask(
                    &electing,
                    12,
                    RequestKind::Metadata(MetadataRequest::default().with_topics(None)),
                )
                .await,
            );
            assert_eq!(listed.controller_id, BrokerId(-1));
            let partition = &listed.topics[0].partitions[0];
            assert_eq!(
                partition.error_code,
                ResponseError::LeaderNotAvailable.code()
            );
            match ask(&electing, 3, find.clone()).await {
                Some(ResponseKind::FindCoordinator(found)) => assert_eq!(
                    found.error_code,
                    ResponseError::CoordinatorNotAvailable.code()
                ),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn metadata_lists_every_topic_or_those_asked() {
        let broker = broker(100);
        broker.create("u", 1).unwrap();
        let names = |response: Option<ResponseKind>| match response {
            Some(ResponseKind::Metadata(response)) => response
                .topics
                .iter()
                .map(|t| (t.name.as_ref().unwrap().as_str().to_owned(), t.error_code))
                .collect::<Vec<_>>(),
            other => panic!("unexpected {other:?}"),
        };
        let asking = |topics: Option<Vec<&str>>| {
            RequestKind::Metadata(MetadataRequest::default().with_topics(topics.map(|topics| {
                topics
                    .into_iter()
                    .map(|name| MetadataRequestTopic::default().with_name(Some(kafka_topic(name))))
                    .collect()
            })))
        };
        let all = vec![("t".to_owned(), 0), ("u".to_owned(), 0)];
        assert_eq!(names(ask(&broker, 12, asking(None)).await), all);
        // Version 0 asks for every topic with an empty list; later versions for none.
        assert_eq!(names(ask(&broker, 0, asking(Some(vec![]))).await), all);
        assert!(names(ask(&broker, 1, asking(Some(vec![]))).await).is_empty());
        assert_eq!(
            names(ask(&broker, 12, asking(Some(vec!["u", "zz"]))).await),
            vec![
                ("u".to_owned(), 0),
                (
                    "zz".to_owned(),
                    ResponseError::UnknownTopicOrPartition.code()
                )
            ]
        );
    }

    /// A request of `key` with every field at its default.
    fn default_request(key: ApiKey) -> RequestKind {
        use kafka_protocol::messages::*;
        match key {
            ApiKey::Produce => RequestKind::Produce(ProduceRequest::default().with_acks(1)),
            ApiKey::Fetch => RequestKind::Fetch(FetchRequest::default()),
            ApiKey::ListOffsets => RequestKind::ListOffsets(ListOffsetsRequest::default()),
            ApiKey::Metadata => RequestKind::Metadata(MetadataRequest::default().with_topics(None)),
            ApiKey::ApiVersions => RequestKind::ApiVersions(ApiVersionsRequest::default()),
            ApiKey::CreateTopics => RequestKind::CreateTopics(CreateTopicsRequest::default()),
            ApiKey::DeleteTopics => RequestKind::DeleteTopics(DeleteTopicsRequest::default()),
            ApiKey::InitProducerId => RequestKind::InitProducerId(InitProducerIdRequest::default()),
            ApiKey::FindCoordinator => {
                RequestKind::FindCoordinator(FindCoordinatorRequest::default())
            }
            ApiKey::JoinGroup => RequestKind::JoinGroup(JoinGroupRequest::default()),
            ApiKey::SyncGroup => RequestKind::SyncGroup(SyncGroupRequest::default()),
            ApiKey::Heartbeat => RequestKind::Heartbeat(HeartbeatRequest::default()),
            ApiKey::LeaveGroup => RequestKind::LeaveGroup(LeaveGroupRequest::default()),
            ApiKey::OffsetCommit => RequestKind::OffsetCommit(OffsetCommitRequest::default()),
            ApiKey::OffsetFetch => RequestKind::OffsetFetch(OffsetFetchRequest::default()),
            ApiKey::DescribeGroups => RequestKind::DescribeGroups(DescribeGroupsRequest::default()),
            ApiKey::ListGroups => RequestKind::ListGroups(ListGroupsRequest::default()),
            ApiKey::DeleteRecords => RequestKind::DeleteRecords(DeleteRecordsRequest::default()),
            // A topic's configs, so that the answer has some to encode.
            ApiKey::DescribeConfigs => RequestKind::DescribeConfigs(
                DescribeConfigsRequest::default().with_resources(vec![
                    describe_configs_request::DescribeConfigsResource::default()
                        .with_resource_type(2)
                        .with_resource_name(StrBytes::from_static_str("t")),
                ]),
            ),
            other => panic!("{other:?} is not supported: add it here"),
        }
    }

    #[tokio::test]
    async fn every_answer_encodes_in_every_advertised_version() {
        let broker = broker(100);
        for api in crate::supported_apis() {
            if matches!(api.key, ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) {
                continue; // answered by the authentication, tested there
            }
            for version in api.min_version..=api.max_version {
                let Some(response) = ask(&broker, version, default_request(api.key)).await else {
                    continue;
                };
                crate::frame::encode_response(api.key, version, 1, &response)
                    .unwrap_or_else(|error| panic!("{:?} v{version}: {error}", api.key));
            }
        }
    }

    #[tokio::test]
    async fn a_fetch_stops_adding_partitions_at_its_byte_limit() {
        let broker = broker(100);
        for partition in 0..2 {
            broker.publish("t", partition, "0123456789").unwrap();
        }
        let request = |max_bytes| {
            RequestKind::Fetch(
                FetchRequest::default()
                    .with_max_bytes(max_bytes)
                    .with_topics(vec![FetchTopic::default()
                        .with_topic(kafka_topic("t"))
                        .with_partitions(
                            (0..2)
                                .map(|partition| {
                                    FetchPartition::default()
                                        .with_partition(partition)
                                        .with_partition_max_bytes(1 << 20)
                                })
                                .collect(),
                        )]),
            )
        };
        let with_records = |response: Option<ResponseKind>| match response {
            Some(ResponseKind::Fetch(response)) => response.responses[0]
                .partitions
                .iter()
                .map(|p| p.records.as_ref().is_some_and(|r| !r.is_empty()))
                .collect::<Vec<_>>(),
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(
            with_records(ask(&broker, 12, request(5)).await),
            vec![true, false]
        );
        assert_eq!(
            with_records(ask(&broker, 12, request(0)).await),
            vec![true, true]
        );
        assert_eq!(
            with_records(ask(&broker, 12, request(1000)).await),
            vec![true, true]
        );
    }

    /// The broker in memory, counting the bytes of the records its reads return.
    struct CountingReads {
        broker: Local,
        read_bytes: std::sync::atomic::AtomicUsize,
    }

    impl Backend for CountingReads {
        async fn call(&self, command: Command, max_wait: Duration) -> Result<Outcome, ErrorReply> {
            let outcome = self.broker.call(command, max_wait).await;
            if let Ok(Outcome::Read(read)) = &outcome {
                let bytes = read.records.iter().map(|r| r.payload.len()).sum::<usize>();
                self.read_bytes
                    .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
            }
            outcome
        }

        async fn topics(&self) -> Result<Vec<TopicDescription>, ErrorReply> {
            self.broker.topics().await
        }

        fn cluster(&self) -> Option<crate::ClusterView> {
            None
        }

        fn coordinates_groups(&self) -> bool {
            true
        }

        fn requires_authentication(&self) -> bool {
            false
        }

        fn authenticate(&self, _password: &str) -> bool {
            true
        }
    }

    #[tokio::test]
    async fn a_fetch_reads_no_more_than_its_answer_holds_and_a_partition_named_twice_once() {
        let reads = CountingReads {
            broker: broker(1000),
            read_bytes: Default::default(),
        };
        for partition in 0..2 {
            for _ in 0..100 {
                reads
                    .broker
                    .publish("t", partition, vec![b'x'; 1000])
                    .unwrap();
            }
        }
        // Partition 0 named 50 times, from offset 0 and last from offset 90, then partition 1.
        let mut partitions: Vec<FetchPartition> = (0..50)
            .map(|time| {
                FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(if time == 49 { 90 } else { 0 })
                    .with_partition_max_bytes(1 << 20)
            })
            .collect();
        partitions.push(
            FetchPartition::default()
                .with_partition(1)
                .with_partition_max_bytes(1 << 20),
        );
        let request = |max_bytes| {
            RequestKind::Fetch(
                FetchRequest::default()
                    .with_max_bytes(max_bytes)
                    .with_topics(vec![FetchTopic::default()
                        .with_topic(kafka_topic("t"))
                        .with_partitions(partitions.clone())]),
            )
        };
        let Some(ResponseKind::Fetch(response)) = ask(&reads, 12, request(1 << 20)).await else {
            panic!("no fetch answer");
        };
        let answered: Vec<(i32, usize)> = response.responses[0]
            .partitions
            .iter()
            .map(|p| {
                let mut records = p.records.clone().unwrap();
                let sets =
                    kafka_protocol::records::RecordBatchDecoder::decode_all(&mut records).unwrap();
                (
                    p.partition_index,
                    sets.iter().map(|s| s.records.len()).sum(),
                )
            })
            .collect();
        assert_eq!(answered, [(0, 10), (1, 100)]);
        let read = reads
            .read_bytes
            .swap(0, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(read, 110 * 1000);
        // An answer of 5 kB: partition 0 fills it; partition 1's read takes one record.
        let Some(ResponseKind::Fetch(_)) = ask(&reads, 12, request(5000)).await else {
            panic!("no fetch answer");
        };
        let read = reads.read_bytes.load(std::sync::atomic::Ordering::Relaxed);
        assert!(read <= 6000, "read {read} bytes for an answer of 5000");
    }

    #[tokio::test]
    async fn groups_with_committed_offsets_and_no_members_are_listed_as_empty() {
        let broker = broker(100);
        broker.commit_group("t", "kafka-app", &[(0, 0)]).unwrap();
        let list = |states: &[&'static str]| {
            let request = ListGroupsRequest::default().with_states_filter(
                states
                    .iter()
                    .map(|state| StrBytes::from_static_str(state))
                    .collect(),
            );
            let broker = &broker;
            async move {
                match ask(broker, 4, RequestKind::ListGroups(request)).await {
                    Some(ResponseKind::ListGroups(response)) => response.groups,
                    other => panic!("unexpected {other:?}"),
                }
            }
        };
        for states in [&[][..], &["Empty"], &["Stable", "empty"]] {
            let listed = list(states).await;
            assert_eq!(listed.len(), 1, "{states:?}");
            assert_eq!(listed[0].group_id.as_str(), "kafka-app");
            assert_eq!(listed[0].group_state.as_str(), "Empty");
        }
        assert!(list(&["Stable"]).await.is_empty());
        let request = DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(StrBytes::from_static_str("kafka-app"))]);
        let described = match ask(&broker, 4, RequestKind::DescribeGroups(request)).await {
            Some(ResponseKind::DescribeGroups(response)) => response.groups,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(described[0].group_state.as_str(), "Empty");
    }

    /// A commit of group `g` from outside its members (generation -1, no member id) of
    /// `offsets` (partition, offset) on topic `t`: each partition's error code.
    async fn commit_from_outside(broker: &Local, offsets: &[(i32, i64)]) -> Vec<i16> {
        use kafka_protocol::messages::offset_commit_request::{
            OffsetCommitRequestPartition, OffsetCommitRequestTopic,
        };
        let partitions = offsets
            .iter()
            .map(|&(partition, offset)| {
                OffsetCommitRequestPartition::default()
                    .with_partition_index(partition)
                    .with_committed_offset(offset)
            })
            .collect();
        let request = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(partitions)]);
        match ask(broker, 2, RequestKind::OffsetCommit(request)).await {
            Some(ResponseKind::OffsetCommit(mut response)) => response
                .topics
                .remove(0)
                .partitions
                .iter()
                .map(|partition| partition.error_code)
                .collect(),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_commit_past_a_partitions_end_is_refused_and_the_others_are_stored() {
        let broker = broker(100);
        for i in 0..50 {
            broker.publish("t", 0, format!("r{i}")).unwrap();
        }
        let out_of_range = ResponseError::OffsetOutOfRange.code();
        assert_eq!(
            commit_from_outside(&broker, &[(0, 5000), (1, 0)]).await,
            vec![out_of_range, 0]
        );
        assert_eq!(broker.committed("t", "g", 0).unwrap(), 0);
        assert_eq!(commit_from_outside(&broker, &[(0, 50)]).await, vec![0]);
        assert_eq!(
            commit_from_outside(&broker, &[(0, 51)]).await,
            vec![out_of_range]
        );
        assert_eq!(broker.committed("t", "g", 0).unwrap(), 50);
    }

    #[tokio::test]
    async fn a_commit_from_outside_a_group_with_native_members_is_from_an_unknown_member() {
        let broker = broker(100);
        broker.join("t", "g", "native").unwrap();
        assert_eq!(
            commit_from_outside(&broker, &[(0, 0)]).await,
            vec![ResponseError::UnknownMemberId.code()]
        );
    }
}
