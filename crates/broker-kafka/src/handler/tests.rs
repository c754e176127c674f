//! The listener's answers to each API, against the broker in memory.

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

use std::time::Duration;

use broker_core::{Command, KeyHash, Outcome, TopicDescription, MAX_BATCH_RECORDS};
use broker_proto::ErrorReply;
use bytes::Bytes;
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{
    BrokerId, DeleteRecordsRequest, DescribeGroupsRequest, FetchRequest, FindCoordinatorRequest,
    GroupId, ListGroupsRequest, MetadataRequest, OffsetCommitRequest, ProduceRequest, ProducerId,
    RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::batch::sequence_after;
use crate::{Backend, KafkaSettings, KafkaState};

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
        max_partitions: 64,
        log_dir: "/var/lib/broker".into(),
        auto_create_partitions: None,
        names: broker_core::NameRules::Broker,
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

async fn ask<B: Backend>(broker: &B, version: i16, request: RequestKind) -> Option<ResponseKind> {
    match answer(broker, version, request).await {
        Answer::Response(response) => Some(*response),
        Answer::Nothing | Answer::Close => None,
        Answer::Refused(error) => panic!("refused: {error:?}"),
    }
}

async fn answer<B: Backend>(broker: &B, version: i16, request: RequestKind) -> Answer {
    answer_with(broker, &settings(), version, request).await
}

async fn answer_with<B: Backend>(
    broker: &B,
    settings: &KafkaSettings,
    version: i16,
    request: RequestKind,
) -> Answer {
    let state = KafkaState::default();
    let handler = Handler {
        backend: broker,
        settings,
        state: &state,
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
fn batch_of(count: i64, producer: Option<(i64, i16, i32)>, value: impl Fn(i64) -> Bytes) -> Bytes {
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
            sequence: producer.map_or(-1, |(_, _, first)| sequence_after(first, i as i32)),
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

/// The broker in memory, its idempotent producers' sequence numbers given as `shift` more than
/// they are: a producer that starts there stands where a producer of `shift` records would.
struct Shifted {
    broker: EventBroker,
    shift: u64,
}

impl Backend for Shifted {
    async fn call(&self, command: Command, max_wait: Duration) -> Result<Outcome, ErrorReply> {
        let command = match command {
            Command::PublishIdempotent {
                topic,
                producer,
                mut batches,
            } => {
                for batch in &mut batches {
                    batch.sequence = batch.sequence.checked_sub(self.shift).ok_or_else(|| {
                        ErrorReply::InvalidArgument("sequence below the shift".into())
                    })?;
                }
                Command::PublishIdempotent {
                    topic,
                    producer,
                    batches,
                }
            }
            other => other,
        };
        self.broker.call(command, max_wait).await
    }

    crate::testing::alone_in_memory!();
}

/// The answer of `handler` to a produce of `count` records of producer 7 to partition 0 of
/// topic "t", numbered from `first`.
async fn send_idempotent<B: Backend>(
    handler: &Handler<'_, B>,
    count: i64,
    first: i32,
) -> PartitionProduceResponse {
    let request = produce(-1, "t", 0, batch(count, Some((7, first))));
    match handler.handle(9, "test", request).await {
        Answer::Response(response) => produced(Some(*response)),
        other => panic!("unexpected {other:?}"),
    }
}

/// A handler of `backend` with its own `state`.
fn handler_of<'a, B: Backend>(
    backend: &'a B,
    settings: &'a KafkaSettings,
    state: &'a KafkaState,
) -> Handler<'a, B> {
    Handler {
        backend,
        settings,
        state,
        endpoint: endpoint(),
        client_host: "/127.0.0.1".into(),
    }
}

#[tokio::test]
async fn an_idempotent_producer_goes_on_past_the_wrap_of_its_sequence_numbers() {
    // The producer starts 8 records short of the wrap, as after 2^31 - 8 records.
    let start = i32::MAX - 7;
    let backend = Shifted {
        broker: broker(100),
        shift: u64::from(start.unsigned_abs()),
    };
    let (settings, state) = (settings(), KafkaState::default());
    let handler = handler_of(&backend, &settings, &state);
    let answers = [
        send_idempotent(&handler, 6, start).await,
        // Its numbers run to i32::MAX within this batch, then from 0.
        send_idempotent(&handler, 5, start + 6).await,
        send_idempotent(&handler, 3, 3).await,
        // Each batch sent again is answered with its offsets, stored once.
        send_idempotent(&handler, 5, start + 6).await,
        send_idempotent(&handler, 3, 3).await,
        send_idempotent(&handler, 6, start).await,
    ];
    let stored: Vec<(i16, i64)> = answers
        .iter()
        .map(|answer| (answer.error_code, answer.base_offset))
        .collect();
    assert_eq!(stored, [(0, 0), (0, 6), (0, 11), (0, 6), (0, 11), (0, 0)]);
    assert_eq!(backend.broker.end_offset("t", 0).unwrap(), 14);
    // A gap past the wrap is still one.
    let ahead = send_idempotent(&handler, 1, 9).await;
    let out_of_order = ResponseError::OutOfOrderSequenceNumber.code();
    assert_eq!(ahead.error_code, out_of_order);
    assert_eq!(backend.broker.end_offset("t", 0).unwrap(), 14);
    // A server that does not know where the producer stands (restarted, say) refuses its next
    // batch past the wrap, and stores nothing of it; the client starts again under a new id.
    let (restarted, fresh) = (KafkaState::default(), KafkaState::default());
    let after_restart = handler_of(&backend, &settings, &restarted);
    let refused = send_idempotent(&after_restart, 2, 6).await;
    assert_eq!(refused.error_code, out_of_order);
    let refused_again = send_idempotent(&handler_of(&backend, &settings, &fresh), 2, 6).await;
    assert_eq!(refused_again.error_code, out_of_order);
    assert_eq!(backend.broker.end_offset("t", 0).unwrap(), 14);
}

#[tokio::test]
async fn a_batch_of_more_records_than_one_command_takes_crosses_the_wrap() {
    let count = MAX_BATCH_RECORDS as i64 + 10;
    // The batch's numbers run past i32::MAX half way through its first command's records.
    let start = i32::MAX - 4_999;
    // Limits retention: the partition keeps its last 1,000 records, the offsets go on.
    let broker = EventBroker::new(1_000).unwrap();
    let limits = [broker_core::TopicSetting::Retention(
        broker_core::Retention::Limits,
    )];
    broker
        .create_topic("t", 1, KeyHash::default(), &limits)
        .unwrap();
    let backend = Shifted {
        broker,
        shift: u64::from(start.unsigned_abs()),
    };
    let (settings, state) = (settings(), KafkaState::default());
    let handler = handler_of(&backend, &settings, &state);
    let first = send_idempotent(&handler, count, start).await;
    assert_eq!((first.error_code, first.base_offset), (0, 0));
    let next = sequence_after(start, count as i32);
    assert_eq!(next, MAX_BATCH_RECORDS as i32 + 10 - 5_000);
    let then = send_idempotent(&handler, 3, next).await;
    assert_eq!((then.error_code, then.base_offset), (0, count));
    let again = send_idempotent(&handler, count, start).await;
    assert_eq!((again.error_code, again.base_offset), (0, 0));
    assert_eq!(backend.broker.end_offset("t", 0).unwrap(), count + 3);
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
    assert_eq!(
        produced(ask(&broker, 9, produce(1, "t", 0, batch(1, None))).await).error_code,
        0
    );
    let full = produced(ask(&broker, 9, produce(1, "t", 0, batch(2, None))).await);
    assert_eq!(full.error_code, ResponseError::NotEnoughReplicas.code());
    assert!(ResponseError::NotEnoughReplicas.is_retriable());
    assert!(full.error_message.unwrap().contains("is full"));
}

/// A batch of more records than a partition keeps can never be stored whole: answered with an
/// error the client does not retry, so that a producer without idempotence does not store its
/// first records again at each try until its timeout.
#[tokio::test]
async fn a_batch_larger_than_a_partition_keeps_is_refused_for_good() {
    let broker = broker(2);
    let refused = produced(ask(&broker, 9, produce(1, "t", 0, batch(3, None))).await);
    assert_eq!(refused.error_code, ResponseError::RecordListTooLarge.code());
    assert!(!ResponseError::RecordListTooLarge.is_retriable());
    let message = refused.error_message.unwrap();
    assert!(
        message.contains("keeps at most 2 records") && message.contains("first 2 were stored"),
        "{message}"
    );
    assert_eq!(broker.end_offset("t", 0).unwrap(), 2);
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

/// The broker in memory behind a backend the tests can watch: as node 0 of a cluster of nodes
/// 0 and 2 when `cluster` is set (`Some(leader)`: the node that leads, if one does), alone
/// otherwise; counting the bytes of the records its reads return.
struct TestNode {
    broker: Local,
    cluster: Option<Option<i32>>,
    /// Topics served by a leader of their own, as in a cluster of several groups.
    topic_leaders: std::collections::BTreeMap<String, Option<i32>>,
    /// The nodes holding a copy of such topics, where not every node does.
    topic_replicas: std::collections::BTreeMap<String, Vec<i32>>,
    read_bytes: std::sync::atomic::AtomicUsize,
    /// How many `Describe` commands it answered.
    describes: std::sync::atomic::AtomicUsize,
}

impl TestNode {
    /// Node 0 of a cluster where `leader` leads.
    fn in_cluster(broker: Local, leader: Option<i32>) -> TestNode {
        TestNode {
            broker,
            cluster: Some(leader),
            topic_leaders: Default::default(),
            topic_replicas: Default::default(),
            read_bytes: Default::default(),
            describes: Default::default(),
        }
    }

    /// A server that runs alone.
    fn alone(broker: Local) -> TestNode {
        TestNode {
            broker,
            cluster: None,
            topic_leaders: Default::default(),
            topic_replicas: Default::default(),
            read_bytes: Default::default(),
            describes: Default::default(),
        }
    }
}

impl Backend for TestNode {
    async fn call(&self, command: Command, max_wait: Duration) -> Result<Outcome, ErrorReply> {
        if matches!(command, Command::Describe { .. }) {
            self.describes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
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
        self.cluster.map(|leader| crate::ClusterView {
            brokers: vec![(0, "node-0".into(), 9093), (2, "node-2".into(), 9093)],
            leader,
            replicas: vec![0, 2],
            topic_leaders: self.topic_leaders.clone(),
            topic_replicas: self.topic_replicas.clone(),
            new_topic_copies: 2,
        })
    }

    /// A node of a cluster coordinates while it leads (it is node 0, the test settings' node
    /// id); a server alone always does.
    fn coordinates_groups(&self) -> bool {
        self.cluster.is_none_or(|leader| leader == Some(0))
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
    let node = TestNode::in_cluster(broker(100), Some(2));
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
        let electing = TestNode::in_cluster(broker(100), leader);
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
async fn a_topic_with_a_leader_of_its_own_is_listed_with_it() {
    let local = broker(100);
    local.create("elsewhere", 2).unwrap();
    local.create("electing", 1).unwrap();
    let mut node = TestNode::in_cluster(local, Some(0));
    node.topic_leaders.insert("elsewhere".to_owned(), Some(2));
    node.topic_leaders.insert("electing".to_owned(), None);
    node.topic_replicas.insert("elsewhere".to_owned(), vec![2]);
    let listed = match ask(
        &node,
        12,
        RequestKind::Metadata(MetadataRequest::default().with_topics(None)),
    )
    .await
    {
        Some(ResponseKind::Metadata(response)) => response,
        other => panic!("unexpected {other:?}"),
    };
    let leaders: Vec<(String, Vec<(i16, i32)>)> = listed
        .topics
        .iter()
        .map(|topic| {
            let partitions = topic
                .partitions
                .iter()
                .map(|partition| (partition.error_code, partition.leader_id.0))
                .collect();
            (topic.name.as_ref().unwrap().as_str().to_owned(), partitions)
        })
        .collect();
    let not_available = ResponseError::LeaderNotAvailable.code();
    assert_eq!(
        leaders,
        vec![
            ("electing".to_owned(), vec![(not_available, -1)]),
            ("elsewhere".to_owned(), vec![(0, 2), (0, 2)]),
            ("t".to_owned(), vec![(0, 0), (0, 0)]),
        ]
    );
    // Each partition's replicas: its group's voters where they are not every node.
    let replicas: Vec<(&str, Vec<i32>)> = listed
        .topics
        .iter()
        .flat_map(|topic| {
            let name = topic.name.as_ref().unwrap().as_str();
            let replicas = topic.partitions.iter();
            replicas.map(move |partition| {
                (
                    name,
                    partition.replica_nodes.iter().map(|id| id.0).collect(),
                )
            })
        })
        .collect();
    assert_eq!(
        replicas,
        vec![
            ("electing", vec![0, 2]),
            ("elsewhere", vec![2]),
            ("elsewhere", vec![2]),
            ("t", vec![0, 2]),
            ("t", vec![0, 2]),
        ]
    );
    // The controller and the coordinator stay the leader.
    assert_eq!(listed.controller_id, BrokerId(0));
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
    // A name asked for again is answered once, as Kafka's brokers do.
    assert_eq!(
        names(ask(&broker, 12, asking(Some(vec!["u", "t", "u", "u", "t"]))).await),
        vec![("u".to_owned(), 0), ("t".to_owned(), 0)]
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
        ApiKey::FindCoordinator => RequestKind::FindCoordinator(FindCoordinatorRequest::default()),
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
        ApiKey::DescribeConfigs => {
            RequestKind::DescribeConfigs(DescribeConfigsRequest::default().with_resources(vec![
                describe_configs_request::DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(StrBytes::from_static_str("t")),
            ]))
        }
        // A topic's config set, so that the answer is a change (of nothing new).
        ApiKey::AlterConfigs => {
            RequestKind::AlterConfigs(AlterConfigsRequest::default().with_resources(vec![
                alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(StrBytes::from_static_str("t"))
                    .with_configs(vec![alter_configs_request::AlterableConfig::default()
                        .with_name(StrBytes::from_static_str("broker.max.records"))
                        .with_value(Some(StrBytes::from_static_str("100")))]),
            ]))
        }
        ApiKey::IncrementalAlterConfigs => RequestKind::IncrementalAlterConfigs(
            IncrementalAlterConfigsRequest::default().with_resources(vec![
                incremental_alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(StrBytes::from_static_str("t"))
                    .with_configs(vec![
                        incremental_alter_configs_request::AlterableConfig::default()
                            .with_name(StrBytes::from_static_str("broker.max.records"))
                            .with_value(Some(StrBytes::from_static_str("100"))),
                    ]),
            ]),
        ),
        ApiKey::CreatePartitions => {
            RequestKind::CreatePartitions(CreatePartitionsRequest::default().with_topics(vec![
                create_partitions_request::CreatePartitionsTopic::default()
                    .with_name(kafka_topic("t"))
                    .with_count(3),
            ]))
        }
        ApiKey::DeleteGroups => RequestKind::DeleteGroups(
            DeleteGroupsRequest::default()
                .with_groups_names(vec![GroupId(StrBytes::from_static_str("g"))]),
        ),
        ApiKey::OffsetDelete => RequestKind::OffsetDelete(
            kafka_protocol::messages::OffsetDeleteRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("g"))),
        ),
        ApiKey::DescribeLogDirs => RequestKind::DescribeLogDirs(DescribeLogDirsRequest::default()),
        ApiKey::DescribeCluster => {
            RequestKind::DescribeCluster(DescribeClusterRequest::default().with_endpoint_type(1))
        }
        ApiKey::DescribeProducers => RequestKind::DescribeProducers(
            kafka_protocol::messages::DescribeProducersRequest::default().with_topics(vec![
                kafka_protocol::messages::describe_producers_request::TopicRequest::default()
                    .with_name(kafka_topic("t"))
                    .with_partition_indexes(vec![0, 7]),
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
            // Its errors are counted in the server's metrics.
            assert!(
                crate::errors::error_codes(&response).is_some(),
                "{:?}: add its answer to errors::error_codes",
                api.key
            );
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

#[tokio::test]
async fn a_fetch_reads_no_more_than_its_answer_holds_and_a_partition_named_twice_once() {
    let reads = TestNode::alone(broker(1000));
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
    // No offset is negative: refused too, not stored as 0.
    assert_eq!(
        commit_from_outside(&broker, &[(0, -1)]).await,
        vec![out_of_range]
    );
    assert_eq!(broker.committed("t", "g", 0).unwrap(), 50);
    // A partition the topic does not have is refused alone (the topic has two).
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    assert_eq!(
        commit_from_outside(&broker, &[(1, 0), (5, 0), (-1, 0)]).await,
        vec![0, unknown, unknown]
    );
    assert_eq!(broker.committed("t", "g", 1).unwrap(), 0);
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

/// Heartbeats naming members of groups the coordinator does not hold (as every member sends
/// after a restart, or a client making names up) share looks at the broker's groups: a
/// thousand of them cost one description of the broker, not a thousand, and the look still
/// keeps members of a group with native members out.
#[tokio::test(start_paused = true)]
async fn heartbeats_of_groups_the_coordinator_does_not_hold_share_one_look_at_the_broker() {
    let node = TestNode::alone(broker(100));
    node.broker.join("t", "native", "n").unwrap();
    let (settings, state) = (settings(), KafkaState::default());
    let handler = handler_of(&node, &settings, &state);
    let heartbeat = |group: String| {
        kafka_protocol::messages::HeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group)))
            .with_member_id(StrBytes::from_static_str("member-1"))
            .with_generation_id(1)
    };
    let made_up: Vec<_> = (0..1000)
        .map(|i| heartbeat(format!("made-up-{i}")))
        .collect();
    let answers =
        futures::future::join_all(made_up.iter().map(|request| handler.heartbeat(request))).await;
    assert!(answers
        .iter()
        .all(|answer| answer.error_code == ResponseError::RebalanceInProgress.code()));
    let native = handler.heartbeat(&heartbeat("native".into())).await;
    assert_eq!(native.error_code, ResponseError::UnknownMemberId.code());
    assert_eq!(node.describes.load(std::sync::atomic::Ordering::Relaxed), 1);
    // A look older than a second is made anew.
    tokio::time::advance(Duration::from_millis(1001)).await;
    handler.heartbeat(&heartbeat("later".into())).await;
    assert_eq!(node.describes.load(std::sync::atomic::Ordering::Relaxed), 2);
}

/// A backend that notes, when the broker is described, whether the server would refuse a
/// native join to group "g" then (the coordinator says it has Kafka members).
struct WatchingJoins<'a> {
    broker: Local,
    state: &'a KafkaState,
    refused_at_look: std::sync::atomic::AtomicBool,
}

impl Backend for WatchingJoins<'_> {
    async fn call(&self, command: Command, max_wait: Duration) -> Result<Outcome, ErrorReply> {
        if matches!(command, Command::Describe { .. }) {
            self.refused_at_look.store(
                self.state.groups.has_members("g"),
                std::sync::atomic::Ordering::SeqCst,
            );
        }
        self.broker.call(command, max_wait).await
    }

    crate::testing::alone_in_memory!();
}

/// A Kafka member claims its group's name before it looks for native members: a native join
/// applied while it looks is refused by the server (it asks the coordinator under its lock),
/// and one applied before is seen by the look, so the two protocols never share a group.
#[tokio::test]
async fn a_kafka_join_claims_its_group_before_it_looks_for_native_members() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::JoinGroupRequest;
    let state = KafkaState::default();
    let backend = WatchingJoins {
        broker: broker(100),
        state: &state,
        refused_at_look: Default::default(),
    };
    let settings = settings();
    let handler = handler_of(&backend, &settings, &state);
    let request = JoinGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("g")))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_protocol_type(StrBytes::from_static_str("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(StrBytes::from_static_str("range"))
            .with_metadata(Bytes::from_static(b"meta"))]);
    let joined = handler.join_group(request.clone(), "client").await;
    assert_eq!(joined.error_code, 0);
    assert!(backend
        .refused_at_look
        .load(std::sync::atomic::Ordering::SeqCst));
    // With native members the join is refused, and claims nothing after.
    let native = WatchingJoins {
        broker: broker(100),
        state: &state,
        refused_at_look: Default::default(),
    };
    native.broker.join("t", "h", "n").unwrap();
    let handler = handler_of(&native, &settings, &state);
    let refused = handler
        .join_group(
            request.with_group_id(GroupId(StrBytes::from_static_str("h"))),
            "client",
        )
        .await;
    assert_eq!(
        refused.error_code,
        ResponseError::InconsistentGroupProtocol.code()
    );
    assert!(!state.groups.has_members("h"));
}

/// What the broker holds of `topic`.
fn described(broker: &Local, topic: &str) -> TopicDescription {
    broker
        .describe()
        .topics
        .into_iter()
        .find(|described| described.name == topic)
        .unwrap()
}

#[tokio::test]
async fn partitions_are_added_and_never_removed() {
    use kafka_protocol::messages::create_partitions_request::{
        CreatePartitionsAssignment, CreatePartitionsTopic,
    };
    use kafka_protocol::messages::CreatePartitionsRequest;
    let broker = broker(100);
    broker.publish("t", 0, "kept").unwrap();
    let grow = |topic: &str, count: i32, validate_only: bool| {
        RequestKind::CreatePartitions(
            CreatePartitionsRequest::default()
                .with_validate_only(validate_only)
                .with_topics(vec![CreatePartitionsTopic::default()
                    .with_name(kafka_topic(topic))
                    .with_count(count)]),
        )
    };
    let code = |response: Option<ResponseKind>| match response {
        Some(ResponseKind::CreatePartitions(response)) => response.results[0].error_code,
        other => panic!("unexpected {other:?}"),
    };
    // Validated only: nothing changes.
    assert_eq!(code(ask(&broker, 3, grow("t", 4, true)).await), 0);
    assert_eq!(described(&broker, "t").partitions.len(), 2);
    assert_eq!(code(ask(&broker, 3, grow("t", 4, false)).await), 0);
    assert_eq!(described(&broker, "t").partitions.len(), 4);
    assert_eq!(broker.end_offset("t", 0).unwrap(), 1, "records stay");
    for (topic, count, error) in [
        ("t", 4, ResponseError::InvalidPartitions),
        ("t", 2, ResponseError::InvalidPartitions),
        ("nosuch", 4, ResponseError::UnknownTopicOrPartition),
        // Past the broker's partition limit (64 in these tests).
        ("t", 65, ResponseError::InvalidPartitions),
    ] {
        for validate_only in [false, true] {
            assert_eq!(
                code(ask(&broker, 3, grow(topic, count, validate_only)).await),
                error.code(),
                "{topic} to {count}, validate only: {validate_only}"
            );
        }
    }
    let assigned = RequestKind::CreatePartitions(CreatePartitionsRequest::default().with_topics(
        vec![CreatePartitionsTopic::default()
            .with_name(kafka_topic("t"))
            .with_count(5)
            .with_assignments(Some(vec![CreatePartitionsAssignment::default()]))],
    ));
    assert_eq!(
        code(ask(&broker, 3, assigned).await),
        ResponseError::InvalidReplicaAssignment.code()
    );
}

#[tokio::test]
async fn groups_without_members_are_deleted_and_others_refused_as_kafka_does() {
    use kafka_protocol::messages::DeleteGroupsRequest;
    let broker = broker(100);
    broker.create("u", 1).unwrap();
    broker.commit_group("t", "done", &[(0, 0)]).unwrap();
    broker.commit_group("u", "done", &[(0, 0)]).unwrap();
    broker.join("t", "busy", "m").unwrap();
    let delete = |groups: &[&str]| {
        RequestKind::DeleteGroups(
            DeleteGroupsRequest::default().with_groups_names(
                groups
                    .iter()
                    .map(|group| GroupId(StrBytes::from_string((*group).to_owned())))
                    .collect(),
            ),
        )
    };
    let codes = |response: Option<ResponseKind>| match response {
        Some(ResponseKind::DeleteGroups(response)) => response
            .results
            .iter()
            .map(|result| result.error_code)
            .collect::<Vec<_>>(),
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(
        codes(ask(&broker, 2, delete(&["done", "busy", "never", "not.valid"])).await),
        [
            0,
            ResponseError::NonEmptyGroup.code(),
            ResponseError::GroupIdNotFound.code(),
            ResponseError::InvalidGroupId.code()
        ]
    );
    for topic in ["t", "u"] {
        let groups = &described(&broker, topic).groups;
        assert!(groups.iter().all(|group| group.name != "done"), "{topic}");
    }
    assert!(described(&broker, "t")
        .groups
        .iter()
        .any(|group| group.name == "busy"));
}

#[tokio::test]
async fn offsets_are_deleted_from_groups_without_members_as_kafka_does() {
    use broker_core::{Retention, TopicSetting};
    use kafka_protocol::messages::offset_delete_request::{
        OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
    };
    use kafka_protocol::messages::OffsetDeleteRequest;
    let broker = broker(100);
    broker.create("u", 1).unwrap();
    // Limits retention: records stay whatever the groups consumed, so the earliest is 0.
    let limits = [TopicSetting::Retention(Retention::Limits)];
    broker
        .create_topic("k", 2, KeyHash::Murmur2, &limits)
        .unwrap();
    for partition in 0..2 {
        for _ in 0..5 {
            broker.publish("k", partition, "x").unwrap();
        }
    }
    broker.commit_group("k", "g", &[(0, 3), (1, 4)]).unwrap();
    broker.commit_group("k", "h", &[(0, 2)]).unwrap();
    broker.join("t", "busy", "m").unwrap();
    let delete = |group: &str, topics: &[(&str, &[i32])]| {
        RequestKind::OffsetDelete(
            OffsetDeleteRequest::default()
                .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
                .with_topics(
                    topics
                        .iter()
                        .map(|(topic, partitions)| {
                            OffsetDeleteRequestTopic::default()
                                .with_name(kafka_topic(topic))
                                .with_partitions(
                                    partitions
                                        .iter()
                                        .map(|&partition| {
                                            OffsetDeleteRequestPartition::default()
                                                .with_partition_index(partition)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                ),
        )
    };
    // The top-level error, then each partition's, in the order asked.
    let codes = |response: Option<ResponseKind>| match response {
        Some(ResponseKind::OffsetDelete(response)) => (
            response.error_code,
            response
                .topics
                .iter()
                .flat_map(|topic| topic.partitions.iter().map(|p| p.error_code))
                .collect::<Vec<_>>(),
        ),
        other => panic!("unexpected {other:?}"),
    };
    let committed = |topic: &str, group: &str| -> Option<Vec<i64>> {
        let described = described(&broker, topic);
        let group = described.groups.iter().find(|g| g.name == group)?;
        Some(group.partitions.iter().map(|p| p.committed).collect())
    };
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    // Some partitions: back to the earliest record, where an uncommitted one starts, with no
    // offset stored (OffsetFetch answers -1 there); a partition past the topic's and a topic
    // that does not exist are unknown.
    assert_eq!(
        codes(ask(&broker, 0, delete("g", &[("k", &[1, 7]), ("nosuch", &[0])])).await),
        (0, vec![0, unknown, unknown])
    );
    assert_eq!(committed("k", "g"), Some(vec![3, 0]));
    assert_eq!(broker.stored_offsets("k", "g").unwrap(), [Some(3), None]);
    // Every partition of the topic: the group leaves the topic.
    assert_eq!(
        codes(ask(&broker, 0, delete("g", &[("k", &[0, 1, 0])])).await),
        (0, vec![0, 0, 0])
    );
    assert_eq!(committed("k", "g"), None);
    // A topic the group never committed on has nothing to delete; its other topics keep theirs.
    assert_eq!(
        codes(ask(&broker, 0, delete("h", &[("u", &[0])])).await),
        (0, vec![0])
    );
    assert_eq!(committed("k", "h"), Some(vec![2, 0]));
    // A group with members keeps its offsets; a group that committed nothing is not found.
    assert_eq!(
        codes(ask(&broker, 0, delete("busy", &[("t", &[0])])).await),
        (0, vec![ResponseError::GroupSubscribedToTopic.code()])
    );
    assert!(committed("t", "busy").is_some());
    // A topic named twice is one deletion: here of both its partitions.
    assert_eq!(
        codes(ask(&broker, 0, delete("h", &[("k", &[0]), ("k", &[1])])).await),
        (0, vec![0, 0])
    );
    assert_eq!(committed("k", "h"), None);
    for (group, error) in [
        ("g", ResponseError::GroupIdNotFound),
        ("not.valid", ResponseError::InvalidGroupId),
    ] {
        assert_eq!(
            codes(ask(&broker, 0, delete(group, &[("k", &[0])])).await),
            (error.code(), vec![]),
            "{group}"
        );
    }
}

/// A member that joins between OffsetDelete's reading of the groups and its change keeps the
/// group's offsets: the change is refused as a whole, and the partitions answer that the group
/// is subscribed.
#[tokio::test]
async fn offsets_deleted_while_a_member_joins_stay_where_the_member_has_them() {
    use broker_core::{Retention, TopicSetting};
    let broker = broker(100);
    let limits = [TopicSetting::Retention(Retention::Limits)];
    broker
        .create_topic("k", 2, KeyHash::Murmur2, &limits)
        .unwrap();
    for _ in 0..5 {
        broker.publish("k", 0, "x").unwrap();
    }
    broker.commit_group("k", "g", &[(0, 4)]).unwrap();
    // What OffsetDelete read, then a member joins.
    let stale = described(&broker, "k");
    broker.join("k", "g", "m").unwrap();
    let state = KafkaState::default();
    let settings = settings();
    let handler = Handler {
        backend: &broker,
        settings: &settings,
        state: &state,
        endpoint: endpoint(),
        client_host: "/127.0.0.1".into(),
    };
    for named in [&[0][..], &[0, 1][..]] {
        assert_eq!(
            handler.delete_offsets("g", &stale, false, named).await,
            vec![Some(ResponseError::GroupSubscribedToTopic); named.len()],
            "{named:?}"
        );
        let group = described(&broker, "k");
        let group = group.groups.iter().find(|g| g.name == "g").unwrap();
        assert_eq!(group.partitions[0].committed, 4, "{named:?}");
    }
}

#[tokio::test]
async fn the_cluster_is_described_with_its_brokers_and_controller() {
    use kafka_protocol::messages::DescribeClusterRequest;
    let broker = broker(100);
    let describe = |endpoint_type: i8| {
        RequestKind::DescribeCluster(
            DescribeClusterRequest::default().with_endpoint_type(endpoint_type),
        )
    };
    let Some(ResponseKind::DescribeCluster(response)) = ask(&broker, 1, describe(1)).await else {
        panic!("no answer");
    };
    assert_eq!(response.error_code, 0);
    assert_eq!(response.controller_id, BrokerId(0));
    assert_eq!(response.cluster_id.as_str(), "test");
    let brokers: Vec<(i32, &str, i32)> = response
        .brokers
        .iter()
        .map(|broker| (broker.broker_id.0, broker.host.as_str(), broker.port))
        .collect();
    assert_eq!(brokers, [(0, endpoint().host.as_str(), endpoint().port)]);
    let Some(ResponseKind::DescribeCluster(response)) = ask(&broker, 1, describe(2)).await else {
        panic!("no answer");
    };
    assert_eq!(
        response.error_code,
        ResponseError::UnsupportedEndpointType.code()
    );
}

#[tokio::test]
async fn topics_asked_for_are_created_only_when_the_listener_and_the_client_allow_it() {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    let broker = broker(100);
    let ask_for = |names: &[&str], allow: bool| {
        RequestKind::Metadata(
            MetadataRequest::default()
                .with_allow_auto_topic_creation(allow)
                .with_topics(Some(
                    names
                        .iter()
                        .map(|name| {
                            MetadataRequestTopic::default().with_name(Some(kafka_topic(name)))
                        })
                        .collect(),
                )),
        )
    };
    let codes = |answer: Answer| match answer {
        Answer::Response(response) => match *response {
            ResponseKind::Metadata(response) => response
                .topics
                .iter()
                .map(|topic| (topic.error_code, topic.partitions.len()))
                .collect::<Vec<_>>(),
            other => panic!("unexpected {other:?}"),
        },
        other => panic!("unexpected {other:?}"),
    };
    // Off by default.
    assert_eq!(
        codes(answer(&broker, 9, ask_for(&["fresh"], true)).await),
        [(ResponseError::UnknownTopicOrPartition.code(), 0)]
    );
    let creating = KafkaSettings {
        auto_create_partitions: Some(3),
        ..settings()
    };
    // The client does not allow it.
    assert_eq!(
        codes(answer_with(&broker, &creating, 9, ask_for(&["fresh"], false)).await),
        [(ResponseError::UnknownTopicOrPartition.code(), 0)]
    );
    assert_eq!(
        codes(
            answer_with(
                &broker,
                &creating,
                9,
                ask_for(&["fresh", "t", "bad.name"], true)
            )
            .await
        ),
        [
            (0, 3),
            (0, 2),
            (ResponseError::InvalidTopicException.code(), 0)
        ]
    );
    let fresh = described(&broker, "fresh");
    assert_eq!(fresh.partitions.len(), 3);
    assert!(
        !fresh.settings.is_empty(),
        "Kafka's retention: {:?}",
        fresh.settings
    );
}

#[tokio::test]
async fn the_log_directory_lists_each_partition_with_the_bytes_it_retains() {
    use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
    use kafka_protocol::messages::DescribeLogDirsRequest;
    let broker = broker(100);
    broker.publish("t", 1, "twelve bytes").unwrap();
    let sizes = |response: Option<ResponseKind>| match response {
        Some(ResponseKind::DescribeLogDirs(response)) => {
            assert_eq!(response.results.len(), 1);
            assert_eq!(response.results[0].log_dir.as_str(), "/var/lib/broker");
            response.results[0]
                .topics
                .iter()
                .flat_map(|topic| {
                    topic.partitions.iter().map(|partition| {
                        (
                            topic.name.as_str().to_owned(),
                            partition.partition_index,
                            partition.partition_size,
                        )
                    })
                })
                .collect::<Vec<_>>()
        }
        other => panic!("unexpected {other:?}"),
    };
    let every = RequestKind::DescribeLogDirs(DescribeLogDirsRequest::default().with_topics(None));
    assert_eq!(
        sizes(ask(&broker, 4, every).await),
        [("t".to_owned(), 0, 0), ("t".to_owned(), 1, 12)]
    );
    let one = RequestKind::DescribeLogDirs(DescribeLogDirsRequest::default().with_topics(Some(
        vec![DescribableLogDirTopic::default()
            .with_topic(kafka_topic("t"))
            .with_partitions(vec![1])],
    )));
    assert_eq!(sizes(ask(&broker, 1, one).await), [("t".to_owned(), 1, 12)]);
}

#[tokio::test]
async fn a_topic_creation_validated_only_is_refused_as_the_creation_would_be() {
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::CreateTopicsRequest;
    let broker = broker(100);
    let create = |name: &str, partitions: i32| {
        RequestKind::CreateTopics(
            CreateTopicsRequest::default()
                .with_validate_only(true)
                .with_topics(vec![CreatableTopic::default()
                    .with_name(kafka_topic(name))
                    .with_num_partitions(partitions)
                    .with_replication_factor(1)]),
        )
    };
    let code = |response: Option<ResponseKind>| match response {
        Some(ResponseKind::CreateTopics(response)) => response.topics[0].error_code,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(code(ask(&broker, 5, create("fresh", 3)).await), 0);
    assert_eq!(
        code(ask(&broker, 5, create("t", 3)).await),
        ResponseError::TopicAlreadyExists.code()
    );
    assert_eq!(
        code(ask(&broker, 5, create("fresh", 65)).await),
        ResponseError::InvalidPartitions.code()
    );
    assert!(described_topics(&broker).iter().all(|name| name != "fresh"));
}

/// A replication factor is taken up to the copies every new topic gets (those of the group it
/// goes to: here 2, in a cluster of two nodes), and answered as kept; a larger one is refused,
/// as is any above 1 on a single broker.
#[tokio::test]
async fn a_replication_factor_is_taken_up_to_the_copies_a_topic_gets() {
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::CreateTopicsRequest;
    let create = |factor: i16| {
        RequestKind::CreateTopics(
            CreateTopicsRequest::default()
                .with_validate_only(true)
                .with_topics(vec![CreatableTopic::default()
                    .with_name(kafka_topic("fresh"))
                    .with_num_partitions(1)
                    .with_replication_factor(factor)]),
        )
    };
    let answered = |response: Option<ResponseKind>| match response {
        Some(ResponseKind::CreateTopics(response)) => (
            response.topics[0].error_code,
            response.topics[0].replication_factor,
        ),
        other => panic!("unexpected {other:?}"),
    };
    let refused = ResponseError::InvalidReplicationFactor.code();
    let alone = broker(100);
    assert_eq!(answered(ask(&alone, 5, create(1)).await), (0, 1));
    assert_eq!(answered(ask(&alone, 5, create(-1)).await), (0, 1));
    assert_eq!(answered(ask(&alone, 5, create(2)).await).0, refused);
    let node = TestNode::in_cluster(broker(100), Some(0));
    for factor in [-1, 1, 2] {
        assert_eq!(
            answered(ask(&node, 5, create(factor)).await),
            (0, 2),
            "{factor}"
        );
    }
    for factor in [0, 3, -2] {
        assert_eq!(
            answered(ask(&node, 5, create(factor)).await).0,
            refused,
            "{factor}"
        );
    }
}

fn described_topics(broker: &Local) -> Vec<String> {
    broker
        .describe()
        .topics
        .into_iter()
        .map(|topic| topic.name)
        .collect()
}

/// A config to change: its name, the incremental operation (ignored by AlterConfigs) and the
/// value.
type ConfigChange<'a> = (&'a str, i8, &'a str);

/// An AlterConfigs or IncrementalAlterConfigs request of one resource per `(type, name,
/// configs)`.
fn alter(
    incremental: bool,
    validate_only: bool,
    resources: &[(i8, &str, &[ConfigChange<'_>])],
) -> RequestKind {
    use kafka_protocol::messages::{
        alter_configs_request as plain, incremental_alter_configs_request as incr,
        AlterConfigsRequest, IncrementalAlterConfigsRequest,
    };
    let text = |text: &str| StrBytes::from_string(text.to_owned());
    if incremental {
        let resources = resources
            .iter()
            .map(|(kind, name, configs)| {
                incr::AlterConfigsResource::default()
                    .with_resource_type(*kind)
                    .with_resource_name(text(name))
                    .with_configs(
                        configs
                            .iter()
                            .map(|(config, operation, value)| {
                                incr::AlterableConfig::default()
                                    .with_name(text(config))
                                    .with_config_operation(*operation)
                                    .with_value(Some(text(value)))
                            })
                            .collect(),
                    )
            })
            .collect();
        return RequestKind::IncrementalAlterConfigs(
            IncrementalAlterConfigsRequest::default()
                .with_validate_only(validate_only)
                .with_resources(resources),
        );
    }
    let resources = resources
        .iter()
        .map(|(kind, name, configs)| {
            plain::AlterConfigsResource::default()
                .with_resource_type(*kind)
                .with_resource_name(text(name))
                .with_configs(
                    configs
                        .iter()
                        .map(|(config, _, value)| {
                            plain::AlterableConfig::default()
                                .with_name(text(config))
                                .with_value(Some(text(value)))
                        })
                        .collect(),
                )
        })
        .collect();
    RequestKind::AlterConfigs(
        AlterConfigsRequest::default()
            .with_validate_only(validate_only)
            .with_resources(resources),
    )
}

/// Each resource's error code in an AlterConfigs or IncrementalAlterConfigs answer.
fn alter_codes(response: Option<ResponseKind>) -> Vec<i16> {
    match response {
        Some(ResponseKind::AlterConfigs(response)) => {
            response.responses.iter().map(|r| r.error_code).collect()
        }
        Some(ResponseKind::IncrementalAlterConfigs(response)) => {
            response.responses.iter().map(|r| r.error_code).collect()
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// A broker with topic `t` (interest retention) and `logs` (limits retention, one partition,
/// five records of 4 bytes).
fn broker_with_a_log() -> Local {
    use broker_core::{Retention, TopicSetting};
    let broker = broker(100);
    let limits = [TopicSetting::Retention(Retention::Limits)];
    broker
        .create_topic("logs", 1, KeyHash::Murmur2, &limits)
        .unwrap();
    for _ in 0..5 {
        broker.publish("logs", 0, "abcd").unwrap();
    }
    broker
}

#[tokio::test]
async fn alter_configs_change_the_settings_they_name_at_once_and_validate_only_changes_nothing() {
    use broker_core::{Retention, TopicSetting};
    for incremental in [false, true] {
        let broker = broker_with_a_log();
        let version = if incremental { 1 } else { 2 };
        let configs: &[ConfigChange<'_>] =
            &[("retention.bytes", 0, "8"), ("retention.ms", 0, "60000")];
        let checked = alter(incremental, true, &[(2, "logs", configs)]);
        assert_eq!(alter_codes(ask(&broker, version, checked).await), [0]);
        assert_eq!(
            described(&broker, "logs").settings,
            [TopicSetting::Retention(Retention::Limits)],
            "validate_only changes nothing"
        );
        let changed = alter(incremental, false, &[(2, "logs", configs)]);
        assert_eq!(alter_codes(ask(&broker, version, changed).await), [0]);
        let logs = described(&broker, "logs");
        assert_eq!(
            logs.settings,
            [
                TopicSetting::Retention(Retention::Limits),
                TopicSetting::MaxBytes(8),
                TopicSetting::MaxAgeMs(60_000)
            ]
        );
        assert_eq!(
            (
                logs.partitions[0].earliest_offset,
                logs.partitions[0].end_offset
            ),
            (3, 5),
            "the oldest records left at once"
        );
        // The broker's own names, and configs every topic has anyway.
        let own: &[ConfigChange<'_>] = &[
            ("broker.max.records", 0, "1"),
            ("broker.discard", 0, "new"),
            ("cleanup.policy", 0, "delete"),
        ];
        let changed = alter(incremental, false, &[(2, "logs", own)]);
        assert_eq!(alter_codes(ask(&broker, version, changed).await), [0]);
        let logs = described(&broker, "logs");
        assert!(logs.settings.contains(&TopicSetting::MaxRecords(1)));
        assert_eq!(logs.partitions[0].records, 2, "discard new loses nothing");
    }
}

#[tokio::test]
async fn alter_configs_refuse_each_resource_they_cannot_change_and_change_the_others() {
    let broker = broker_with_a_log();
    for incremental in [false, true] {
        let version = if incremental { 1 } else { 0 };
        let request = alter(
            incremental,
            false,
            &[
                (2, "logs", &[("segment.bytes", 0, "1024")]),
                (2, "logs", &[("retention.ms", 0, "-1")]),
                (2, "logs", &[("broker.retention", 0, "interest")]),
                (2, "t", &[("broker.discard", 0, "old")]),
                (2, "nosuch", &[("retention.ms", 0, "1000")]),
                (4, "0", &[("log.retention.ms", 0, "1000")]),
                (2, "logs", &[("broker.max.records", 0, "3")]),
            ],
        );
        assert_eq!(
            alter_codes(ask(&broker, version, request).await),
            [
                ResponseError::InvalidConfig.code(),
                ResponseError::InvalidConfig.code(),
                ResponseError::InvalidConfig.code(),
                ResponseError::InvalidConfig.code(),
                ResponseError::UnknownTopicOrPartition.code(),
                ResponseError::InvalidRequest.code(),
                0,
            ]
        );
        assert_eq!(described(&broker, "logs").partitions[0].records, 3);
    }
}

#[tokio::test]
async fn incremental_alter_configs_set_and_refuse_delete_append_and_subtract() {
    let broker = broker_with_a_log();
    let request = alter(
        true,
        false,
        &[
            (2, "logs", &[("retention.ms", 1, "")]),
            (2, "logs", &[("cleanup.policy", 2, "compact")]),
            (2, "logs", &[("cleanup.policy", 3, "delete")]),
            // A resource with a refused operation changes none of its configs.
            (
                2,
                "logs",
                &[("broker.max.records", 0, "1"), ("retention.bytes", 1, "")],
            ),
        ],
    );
    let response = ask(&broker, 1, request).await;
    let Some(ResponseKind::IncrementalAlterConfigs(answer)) = &response else {
        panic!("unexpected {response:?}");
    };
    assert!(answer.responses[0]
        .error_message
        .as_ref()
        .unwrap()
        .contains("cannot be removed"));
    assert_eq!(
        alter_codes(response),
        [ResponseError::InvalidConfig.code(); 4]
    );
    assert_eq!(described(&broker, "logs").partitions[0].records, 5);
}

/// CreatePartitions naming a topic twice is refused for that topic (as Kafka refuses it) and
/// changes nothing; AlterConfigs applies a topic's changes in order and describes it once
/// however many times it names it, and so does ListOffsets.
#[tokio::test]
async fn a_topic_named_many_times_is_refused_or_described_once() {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{CreatePartitionsRequest, ListOffsetsRequest};
    let node = TestNode::alone(broker_with_a_log());
    let grow = |topic: &str| {
        CreatePartitionsTopic::default()
            .with_name(kafka_topic(topic))
            .with_count(4)
    };
    let request =
        RequestKind::CreatePartitions(CreatePartitionsRequest::default().with_topics(vec![
            grow("t"),
            grow("logs"),
            grow("t"),
        ]));
    let Some(ResponseKind::CreatePartitions(response)) = ask(&node, 3, request).await else {
        panic!("no answer");
    };
    let codes: Vec<i16> = response.results.iter().map(|r| r.error_code).collect();
    let invalid = ResponseError::InvalidRequest.code();
    assert_eq!(codes, [invalid, 0, invalid]);
    assert_eq!(described(&node.broker, "t").partitions.len(), 2);
    // Changes of one topic apply one after another, the last one last; a topic named many
    // times is described once (and again only after a change of it).
    for incremental in [false, true] {
        let twice = alter(
            incremental,
            false,
            &[
                (2, "logs", &[("retention.ms", 0, "60000")]),
                (2, "logs", &[("retention.ms", 0, "1000")]),
            ],
        );
        assert_eq!(alter_codes(ask(&node, 0, twice).await), [0, 0]);
        assert!(described(&node.broker, "logs")
            .settings
            .contains(&broker_core::TopicSetting::MaxAgeMs(1000)));
        let refused: &[ConfigChange<'_>] = &[("broker.retention", 0, "interest")];
        let often: Vec<_> = (0..100).map(|_| (2, "logs", refused)).collect();
        node.describes
            .store(0, std::sync::atomic::Ordering::Relaxed);
        let codes = alter_codes(ask(&node, 0, alter(incremental, false, &often)).await);
        assert!(codes
            .iter()
            .all(|&code| code == ResponseError::InvalidConfig.code()));
        assert_eq!(node.describes.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
    let often = (0..1000).map(|_| {
        ListOffsetsTopic::default()
            .with_name(kafka_topic("logs"))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(-1)])
    });
    let request =
        RequestKind::ListOffsets(ListOffsetsRequest::default().with_topics(often.collect()));
    node.describes
        .store(0, std::sync::atomic::Ordering::Relaxed);
    let Some(ResponseKind::ListOffsets(response)) = ask(&node, 4, request).await else {
        panic!("no answer");
    };
    assert_eq!(response.topics.len(), 1000);
    assert!(response.topics.iter().all(|t| t.partitions[0].offset == 5));
    assert_eq!(node.describes.load(std::sync::atomic::Ordering::Relaxed), 1);
}

/// Once a fetch's answer is full, the partitions after the reads under way (one chunk of 32)
/// are answered with their bounds and no record: none of theirs is read only to be dropped.
#[tokio::test]
async fn a_full_fetch_answer_reads_no_record_of_the_partitions_after_it() {
    let node = TestNode::alone(broker(100));
    // Two topics of 64 partitions (the broker's limit), each partition with a record.
    let mut topics = Vec::new();
    for topic in ["wide", "wider"] {
        node.broker.create(topic, 64).unwrap();
        for partition in 0..64 {
            node.broker
                .publish(topic, partition, vec![b'x'; 1000])
                .unwrap();
        }
        let partitions = (0..64)
            .map(|partition| {
                FetchPartition::default()
                    .with_partition(partition)
                    .with_partition_max_bytes(1 << 20)
            })
            .collect();
        topics.push(
            FetchTopic::default()
                .with_topic(kafka_topic(topic))
                .with_partitions(partitions),
        );
    }
    let request = RequestKind::Fetch(
        FetchRequest::default()
            .with_max_bytes(1500)
            .with_topics(topics),
    );
    let Some(ResponseKind::Fetch(response)) = ask(&node, 12, request).await else {
        panic!("no fetch answer");
    };
    let answered: Vec<_> = response
        .responses
        .iter()
        .flat_map(|topic| &topic.partitions)
        .collect();
    assert_eq!(answered.len(), 128);
    assert!(answered
        .iter()
        .all(|p| p.high_watermark == 1 && p.log_start_offset == 0 && p.error_code == 0));
    let read = node.read_bytes.load(std::sync::atomic::Ordering::Relaxed);
    assert!(read <= 32 * 1000, "read {read} bytes for an answer of 1500");
}

#[tokio::test]
async fn describe_producers_lists_each_partitions_idempotent_producers() {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    use kafka_protocol::messages::DescribeProducersRequest;
    let broker = broker(100);
    broker.advance_clock(5_000).unwrap();
    let stored = produced(ask(&broker, 9, produce(-1, "t", 0, batch(3, Some((42, 0))))).await);
    assert_eq!(stored.error_code, 0);
    // The same producer at epoch 1 is another of the broker's producers, listed under the
    // number the broker keeps it by (its id with the epoch in its top bits) at epoch 0.
    let bumped = || produce(-1, "t", 1, batch_at_epoch(2, Some((42, 1, 0))));
    assert_eq!(produced(ask(&broker, 9, bumped()).await).error_code, 0);
    let topic = |name: &'static str, partitions: Vec<i32>| {
        TopicRequest::default()
            .with_name(kafka_topic(name))
            .with_partition_indexes(partitions)
    };
    // Topic t named twice and its partition 0 three times: each answered once, in the order
    // first named.
    let request = DescribeProducersRequest::default().with_topics(vec![
        topic("t", vec![0, 1, 0]),
        topic("none", vec![0]),
        topic("t", vec![5, 0]),
    ]);
    let Some(ResponseKind::DescribeProducers(response)) =
        ask(&broker, 0, RequestKind::DescribeProducers(request)).await
    else {
        panic!("no answer");
    };
    assert_eq!(response.topics.len(), 2);
    let t = &response.topics[0];
    assert_eq!(t.name.as_str(), "t");
    let indexes: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
    assert_eq!(indexes, [0, 1, 5]);
    assert_eq!(t.partitions[0].error_code, 0);
    let producers = &t.partitions[0].active_producers;
    assert_eq!(producers.len(), 1);
    assert_eq!(producers[0].producer_id, ProducerId(42));
    assert_eq!(producers[0].producer_epoch, 0);
    assert_eq!(producers[0].last_sequence, 2);
    assert_eq!(producers[0].last_timestamp, 5_000);
    assert_eq!(producers[0].coordinator_epoch, -1);
    assert_eq!(producers[0].current_txn_start_offset, -1);
    assert_eq!(t.partitions[1].error_code, 0);
    let bumped = &t.partitions[1].active_producers;
    assert_eq!(bumped.len(), 1);
    assert_eq!(bumped[0].producer_id, ProducerId(42 | (1 << 48)));
    assert_eq!((bumped[0].producer_epoch, bumped[0].last_sequence), (0, 1));
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    assert_eq!(t.partitions[2].error_code, unknown);
    assert!(t.partitions[2].error_message.is_some());
    assert_eq!(response.topics[1].partitions[0].error_code, unknown);
}

#[test]
fn a_listed_producers_last_sequence_wraps_as_kafkas_and_its_id_keeps_its_bits() {
    use broker_core::ProducerState;
    let state = |producer: u64, next_sequence: u64| ProducerState {
        producer,
        next_sequence,
        last_offset: None,
        last_seen_ms: 0,
    };
    let listed = |state| super::produce::kafka_producer(&state);
    assert_eq!(listed(state(7, 0)).last_sequence, -1);
    assert_eq!(listed(state(7, 1)).last_sequence, 0);
    assert_eq!(listed(state(7, 1 << 31)).last_sequence, i32::MAX);
    assert_eq!(listed(state(7, (1 << 31) + 6)).last_sequence, 5);
    assert_eq!(listed(state(7, 1)).producer_id, ProducerId(7));
    assert_eq!(listed(state(u64::MAX, 1)).producer_id, ProducerId(-1));
}

/// OffsetFetch (version 7) of group `g` on `topics` (`None`: every topic it committed on):
/// each topic's name with each partition's committed offset.
async fn offsets_fetched<B: Backend>(
    broker: &B,
    topics: Option<Vec<i32>>,
) -> Vec<(String, Vec<(i32, i64)>)> {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::OffsetFetchRequest;
    let request = OffsetFetchRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("g")))
        .with_topics(topics.map(|partitions| {
            vec![OffsetFetchRequestTopic::default()
                .with_name(kafka_topic("t"))
                .with_partition_indexes(partitions)]
        }));
    match ask(broker, 7, RequestKind::OffsetFetch(request)).await {
        Some(ResponseKind::OffsetFetch(response)) => {
            assert_eq!(response.error_code, 0);
            response
                .topics
                .iter()
                .map(|topic| {
                    let partitions = topic
                        .partitions
                        .iter()
                        .map(|p| (p.partition_index, p.committed_offset))
                        .collect();
                    (topic.name.to_string(), partitions)
                })
                .collect()
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn offset_fetch_answers_minus_one_where_the_group_never_committed() {
    let broker = broker(100);
    for _ in 0..3 {
        broker.publish("t", 0, "x").unwrap();
        broker.publish("t", 1, "y").unwrap();
    }
    assert_eq!(
        offsets_fetched(&broker, Some(vec![0, 1])).await,
        [("t".to_owned(), vec![(0, -1), (1, -1)])]
    );
    assert_eq!(offsets_fetched(&broker, None).await, []);
    // A commit on partition 1 alone: partition 0 still has none, though the broker's group
    // starts there at its earliest record.
    assert_eq!(commit_from_outside(&broker, &[(1, 2)]).await, [0]);
    assert_eq!(broker.committed("t", "g", 0).unwrap(), 0);
    assert_eq!(
        offsets_fetched(&broker, Some(vec![0, 1])).await,
        [("t".to_owned(), vec![(0, -1), (1, 2)])]
    );
    // Asked for every topic: only the partitions committed on.
    assert_eq!(
        offsets_fetched(&broker, None).await,
        [("t".to_owned(), vec![(1, 2)])]
    );
    // A commit at the earliest record is a commit.
    assert_eq!(commit_from_outside(&broker, &[(0, 0)]).await, [0]);
    assert_eq!(
        offsets_fetched(&broker, Some(vec![0, 1, 9])).await,
        [("t".to_owned(), vec![(0, 0), (1, 2), (9, -1)])]
    );
}

/// Version 1 of OffsetFetch has no error of the whole answer: a refusal is on every partition
/// asked for, so that an old client does not take it for "nothing committed".
#[tokio::test]
async fn an_offset_fetch_refused_carries_its_error_on_every_partition() {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::OffsetFetchRequest;
    let broker = broker(100);
    let request = OffsetFetchRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("")))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(kafka_topic("t"))
            .with_partition_indexes(vec![0, 1])]));
    let refused = ResponseError::InvalidGroupId.code();
    match ask(&broker, 1, RequestKind::OffsetFetch(request)).await {
        Some(ResponseKind::OffsetFetch(response)) => {
            let partitions: Vec<(i32, i16)> = response.topics[0]
                .partitions
                .iter()
                .map(|p| (p.partition_index, p.error_code))
                .collect();
            assert_eq!(partitions, [(0, refused), (1, refused)]);
            assert_eq!(response.error_code, refused);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn while_a_node_runs_an_earlier_release_offsets_are_answered_as_it_did() {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    use kafka_protocol::messages::DescribeProducersRequest;
    let older = crate::testing::Shaped::before(broker(100), 14);
    for _ in 0..3 {
        older.broker.publish("t", 0, "x").unwrap();
        older.broker.publish("t", 1, "y").unwrap();
    }
    assert_eq!(commit_from_outside(&older.broker, &[(1, 2)]).await, [0]);
    // OffsetFetch: the group's offset on every partition of the topic, as before, asked for
    // by name or not.
    assert_eq!(
        offsets_fetched(&older, Some(vec![0, 1])).await,
        [("t".to_owned(), vec![(0, 0), (1, 2)])]
    );
    assert_eq!(
        offsets_fetched(&older, None).await,
        [("t".to_owned(), vec![(0, 0), (1, 2)])]
    );
    // OffsetDelete of some partitions: committed at the earliest record retained, as before.
    {
        use broker_core::{Retention, TopicSetting};
        use kafka_protocol::messages::offset_delete_request::{
            OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
        };
        use kafka_protocol::messages::OffsetDeleteRequest;
        let limits = [TopicSetting::Retention(Retention::Limits)];
        older
            .broker
            .create_topic("k", 2, KeyHash::Murmur2, &limits)
            .unwrap();
        for partition in 0..2 {
            older.broker.publish("k", partition, "x").unwrap();
            older.broker.publish("k", partition, "x").unwrap();
        }
        older
            .broker
            .commit_group("k", "g", &[(0, 1), (1, 2)])
            .unwrap();
        let request = OffsetDeleteRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_topics(vec![OffsetDeleteRequestTopic::default()
                .with_name(kafka_topic("k"))
                .with_partitions(vec![
                    OffsetDeleteRequestPartition::default().with_partition_index(1)
                ])]);
        let Some(ResponseKind::OffsetDelete(response)) =
            ask(&older, 0, RequestKind::OffsetDelete(request)).await
        else {
            panic!("no answer");
        };
        assert_eq!(response.topics[0].partitions[0].error_code, 0);
        assert_eq!(
            older.broker.stored_offsets("k", "g").unwrap(),
            [Some(1), Some(0)]
        );
    }
    // DescribeProducers: refused on each partition, saying why.
    let request = DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
        .with_name(kafka_topic("t"))
        .with_partition_indexes(vec![0])]);
    let Some(ResponseKind::DescribeProducers(response)) =
        ask(&older, 0, RequestKind::DescribeProducers(request)).await
    else {
        panic!("no answer");
    };
    let partition = &response.topics[0].partitions[0];
    assert_eq!(
        partition.error_code,
        ResponseError::UnknownServerError.code()
    );
    assert!(partition
        .error_message
        .as_deref()
        .is_some_and(|m| m.contains("release")));
}

/// The broker in memory, counting the calls in progress (each waits a turn of the runtime
/// first, so that calls created together are all in progress together), and holding each
/// `CommitGroup` until the test lets it go on.
struct Instrumented {
    broker: EventBroker,
    in_progress: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    /// A permit for each `CommitGroup` allowed to go on.
    commits_allowed: tokio::sync::Semaphore,
    /// Notified when a `CommitGroup` arrives.
    commit_arrived: tokio::sync::Notify,
}

impl Instrumented {
    /// The broker of [`broker`], `CommitGroup`s held when `hold_commits`.
    fn new(hold_commits: bool) -> Instrumented {
        let permits = if hold_commits {
            0
        } else {
            tokio::sync::Semaphore::MAX_PERMITS
        };
        Instrumented {
            broker: broker(100),
            in_progress: Default::default(),
            most: Default::default(),
            commits_allowed: tokio::sync::Semaphore::new(permits),
            commit_arrived: tokio::sync::Notify::new(),
        }
    }
}

impl Backend for Instrumented {
    async fn call(&self, command: Command, max_wait: Duration) -> Result<Outcome, ErrorReply> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.in_progress.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        tokio::task::yield_now().await;
        if matches!(command, Command::CommitGroup { .. }) {
            self.commit_arrived.notify_one();
            self.commits_allowed.acquire().await.unwrap().forget();
        }
        let outcome = self.broker.call(command, max_wait).await;
        self.in_progress.fetch_sub(1, SeqCst);
        outcome
    }

    crate::testing::alone_in_memory!();
}

#[tokio::test]
async fn a_request_naming_many_partitions_runs_a_bounded_number_of_calls_at_once() {
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    let backend = Instrumented::new(false);
    backend.broker.publish("t", 0, "r").unwrap();
    // Two topics of 1,000 partitions each ("t" has two, "u" none: each is still a call).
    let topic = |name: &'static str| {
        DeleteRecordsTopic::default()
            .with_name(TopicName(StrBytes::from_static_str(name)))
            .with_partitions(
                (0..1000)
                    .map(|index| {
                        DeleteRecordsPartition::default()
                            .with_partition_index(index)
                            .with_offset(-1)
                    })
                    .collect(),
            )
    };
    let request = DeleteRecordsRequest::default().with_topics(vec![topic("t"), topic("u")]);
    let Some(ResponseKind::DeleteRecords(response)) =
        ask(&backend, 2, RequestKind::DeleteRecords(request)).await
    else {
        panic!("no DeleteRecords answer");
    };
    let answers: Vec<(i32, i16)> = response
        .topics
        .iter()
        .flat_map(|topic| {
            topic
                .partitions
                .iter()
                .map(|p| (p.partition_index, p.error_code))
        })
        .collect();
    assert_eq!(answers.len(), 2000);
    assert_eq!(answers[..2], [(0, 0), (1, 0)]);
    assert!(answers[2..].iter().all(|&(_, code)| code != 0));
    let most = backend.most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        most <= super::AT_ONCE * super::AT_ONCE,
        "{most} calls were in progress at once"
    );
}

#[tokio::test]
async fn no_member_joins_while_a_checked_commit_is_on_its_way() {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    let backend = Instrumented::new(true);
    backend.broker.publish("t", 0, "r").unwrap();
    let state = KafkaState::default();
    let settings = settings();
    let handler = Handler {
        backend: &backend,
        settings: &settings,
        state: &state,
        endpoint: endpoint(),
        client_host: "/127.0.0.1".into(),
    };
    let join = || crate::groups::tests::join("");
    let (first, round) = state.groups.join("g", join()).await.unwrap();
    state
        .groups
        .sync("g", &first, round.generation, Vec::new())
        .await
        .unwrap();
    let commit = handler.offset_commit(
        OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_member_id(StrBytes::from_string(first.clone()))
            .with_generation_id_or_member_epoch(round.generation)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(1)])]),
    );
    let second = state.groups.join("g", join());
    tokio::pin!(commit, second);
    // The commit was checked against the generation and is on its way to the broker.
    tokio::select! {
        _ = &mut commit => panic!("the commit went through while held"),
        () = backend.commit_arrived.notified() => {}
    }
    // A second member asks to join: it must wait, or the rebalance it starts could give the
    // partition to a new owner whose commit lands before this one.
    tokio::select! {
        _ = &mut second => panic!("the second member's join was answered"),
        () = tokio::time::sleep(Duration::from_millis(50)) => {}
    }
    assert_eq!(state.groups.describe("g").members.len(), 1);
    backend.commits_allowed.add_permits(1);
    let committed = commit.await;
    assert_eq!(committed.topics[0].partitions[0].error_code, 0);
    tokio::select! {
        _ = &mut second => panic!("the second member's join was answered"),
        () = tokio::time::sleep(Duration::from_millis(50)) => {}
    }
    assert_eq!(state.groups.describe("g").members.len(), 2);
}

#[tokio::test]
async fn list_offsets_finds_the_record_with_the_largest_time() {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::ListOffsetsRequest;
    let broker = broker(100);
    for i in 0..3 {
        broker.publish("t", 0, format!("r{i}")).unwrap();
    }
    let ask_max = |partition: i32| {
        RequestKind::ListOffsets(ListOffsetsRequest::default().with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_timestamp(-3)]),
        ]))
    };
    let answer = |response: Option<ResponseKind>| match response {
        Some(ResponseKind::ListOffsets(mut response)) => {
            let answer = response.topics.remove(0).partitions.remove(0);
            (answer.error_code, answer.offset, answer.timestamp)
        }
        other => panic!("unexpected {other:?}"),
    };
    let last = broker.read("t", 0, 2, 1, None).unwrap().records[0].timestamp_ms;
    assert_eq!(answer(ask(&broker, 7, ask_max(0)).await), (0, 2, last));
    // An empty partition has no such record.
    assert_eq!(answer(ask(&broker, 7, ask_max(1)).await), (0, -1, -1));
}
