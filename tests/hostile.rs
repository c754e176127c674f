//! Greedy clients against the real `broker-server` binary, with its memory measured from
//! `/proc/<pid>/status`: maximum-size frames sent again and again, publishes past the memory
//! budget, a Kafka fetch naming one partition hundreds of times, a Kafka produce of batches
//! that decompress to gigabytes and many connections sending large frames at once leave the
//! server's peak memory bounded.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::time::Duration;

use broker_core::{Command, KeyHash, Outcome};
use broker_proto::{
    ClientCodec, ClientHandshakeCodec, Decoded, ErrorReply, Hello, HelloReply, RequestFrame,
    ResponseFrame,
};
use broker_testkit::http::sample;
use broker_testkit::process::ServerProcess;
use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, ProduceRequest, ProduceResponse, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::codec::{Encoder, Framed};

const MIB: u64 = 1024 * 1024;

type Client = Framed<TcpStream, ClientCodec>;

async fn connect(server: &ServerProcess) -> Client {
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let mut framed = Framed::new(stream, ClientHandshakeCodec::new(64 << 20));
    framed.send(Hello::new("hostile", None)).await.unwrap();
    match framed.next().await.unwrap().unwrap() {
        Decoded::Message(HelloReply::Welcome { .. }) => {}
        other => panic!("unexpected hello reply {other:?}"),
    }
    framed.map_codec(|codec| codec.retype())
}

async fn call(client: &mut Client, command: Command) -> Result<Outcome, ErrorReply> {
    client
        .send(RequestFrame {
            correlation_id: 1,
            max_wait_ms: 0,
            command,
        })
        .await
        .unwrap();
    match client.next().await.unwrap().unwrap() {
        Decoded::Message(ResponseFrame { result, .. }) => result,
        other => panic!("undecodable response {other:?}"),
    }
}

/// Creates `topic`, of one partition.
/// A read of partition 0 of topic `t`.
fn read_t(offset: i64, max_records: i32, max_bytes: Option<u64>) -> Command {
    Command::Read {
        topic: "t".into(),
        partition: 0,
        offset,
        max_records,
        max_bytes,
    }
}

/// Creates topic `t` and publishes `count` records of 250,000 bytes to it.
async fn create_with_large_records(client: &mut Client, count: usize) {
    create(client, "t").await;
    let payload = Bytes::from(vec![7u8; 250_000]);
    for _ in 0..count {
        assert!(matches!(
            call(client, publish(payload.clone())).await,
            Ok(Outcome::Published(_))
        ));
    }
}

async fn create(client: &mut Client, topic: &str) {
    let created = call(
        client,
        Command::Create {
            topic: topic.into(),
            partition_count: 1,
            key_hash: KeyHash::default(),
            settings: Vec::new(),
        },
    )
    .await;
    assert_eq!(created, Ok(Outcome::Created(true)));
}

fn publish(payload: Bytes) -> Command {
    Command::Publish {
        topic: "t".into(),
        partition: 0,
        payload,
    }
}

#[tokio::test]
async fn maximum_frames_again_and_again_do_not_grow_memory() {
    let frame_limit = 3 * MIB;
    let server = ServerProcess::start(&[
        "--max-payload-bytes",
        &MIB.to_string(),
        "--max-frame-bytes",
        &frame_limit.to_string(),
        "--max-memory",
        // Four records of 1 MiB, each with what the budget counts for the record itself.
        &(4 * (MIB + broker_core::RECORD_OVERHEAD_BYTES)).to_string(),
    ]);
    let mut client = connect(&server).await;
    create(&mut client, "t").await;
    let baseline = server.status_bytes("VmRSS");

    // 100 frames just under the frame limit (300 MiB in all), each a publish whose payload is
    // over the payload limit: refused, nothing kept.
    let oversized = Bytes::from(vec![7u8; (frame_limit - 1024) as usize]);
    for _ in 0..100 {
        let result = call(&mut client, publish(oversized.clone())).await;
        assert!(
            matches!(result, Err(ErrorReply::TooLarge { ref what, .. }) if what == "payload"),
            "{result:?}"
        );
    }
    // 50 maximal payloads: the first four fill the 4 MiB budget, the rest are refused as full.
    let largest = Bytes::from(vec![8u8; MIB as usize]);
    let mut offsets = Vec::new();
    for _ in 0..50 {
        match call(&mut client, publish(largest.clone())).await {
            Ok(Outcome::Published(offset)) => offsets.push(offset),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(offsets[..5], [0, 1, 2, 3, -1]);
    assert!(offsets[4..].iter().all(|&offset| offset == -1));

    // 350 MiB went through; the server keeps the 4 MiB budget plus a few frames in buffers.
    assert_peak_within(&server, baseline, 48 * MIB);
}

/// Fails unless the server's peak resident memory (`VmHWM`) stayed below `baseline` plus
/// `growth` bytes; prints both.
fn assert_peak_within(server: &ServerProcess, baseline: u64, growth: u64) {
    let peak = server.status_bytes("VmHWM");
    eprintln!(
        "baseline RSS {} KiB, peak {} KiB",
        baseline / 1024,
        peak / 1024
    );
    assert!(
        peak < baseline + growth,
        "peak {peak} bytes, baseline {baseline} bytes"
    );
}

/// Sends `request` (of `version`) on a Kafka connection and reads its answer's body (after
/// the correlation id).
/// Waits until the request memory holds nothing. The server gives an answer's room back once
/// its write is done, which may be a moment after the client has read it: the gauge reaches
/// zero soon after the last answer, not necessarily before the client's next look.
async fn request_memory_drains(metrics: std::net::SocketAddr) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, _, text) = broker_testkit::http::get(metrics, "/metrics", "");
        if sample(&text, "broker_request_memory_bytes") == 0.0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the request memory still holds room 10 s after the last answer: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kafka_call<R: Encodable + HeaderVersion>(
    stream: &mut std::net::TcpStream,
    key: ApiKey,
    version: i16,
    request: &R,
) -> Bytes {
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7);
    let mut frame = BytesMut::new();
    header
        .encode(&mut frame, R::header_version(version))
        .unwrap();
    request.encode(&mut frame, version).unwrap();
    stream
        .write_all(&(frame.len() as u32).to_be_bytes())
        .unwrap();
    stream.write_all(&frame).unwrap();
    let mut length = [0; 4];
    stream.read_exact(&mut length).unwrap();
    let mut body = vec![0; u32::from_be_bytes(length) as usize];
    stream.read_exact(&mut body).unwrap();
    assert_eq!(body[..4], 7_i32.to_be_bytes());
    Bytes::from(body).slice(4..)
}

fn kafka_connect(server: &ServerProcess) -> std::net::TcpStream {
    let stream = std::net::TcpStream::connect(server.kafka_addr.unwrap()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream
}

fn topic(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_owned()))
}

#[tokio::test]
async fn a_kafka_fetch_naming_a_partition_hundreds_of_times_reads_it_once() {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&[
        "--kafka-listen",
        "127.0.0.1:0",
        "--data-dir",
        data.path().to_str().unwrap(),
        "--capacity",
        "10000",
    ]);
    let mut client = connect(&server).await;
    create(&mut client, "t").await;
    // 4 MB of records.
    for _ in 0..4000 {
        let published = call(&mut client, publish(Bytes::from(vec![9u8; 1000]))).await;
        assert!(
            matches!(published, Ok(Outcome::Published(_))),
            "{published:?}"
        );
    }
    let baseline = server.status_bytes("VmRSS");
    // The same partition named 200 times, 4 MiB from each: a request of 3 kB.
    let partitions = (0..200)
        .map(|_| {
            FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(4 << 20)
        })
        .collect();
    let request = FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_wait_ms(0)
        .with_max_bytes(50 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic("t"))
            .with_partitions(partitions)]);
    let mut stream = kafka_connect(&server);
    let mut body = kafka_call(&mut stream, ApiKey::Fetch, 4, &request);
    let response = FetchResponse::decode(&mut body, 4).unwrap();
    let answered = &response.responses[0].partitions;
    assert_eq!(answered.len(), 1, "one answer for the partition");
    assert_eq!(answered[0].error_code, 0);
    let records = answered[0].records.as_ref().map_or(0, Bytes::len);
    assert!(records > 3_000_000, "{records} bytes of records");
    // An answer of 4 MB, read once: a few answers' worth of memory at most.
    assert_peak_within(&server, baseline, 48 * MIB);
}

#[tokio::test]
async fn a_kafka_produce_of_batches_that_inflate_to_gigabytes_is_refused_within_one_budget() {
    let server = ServerProcess::start(&["--kafka-listen", "127.0.0.1:0"]);
    let mut client = connect(&server).await;
    create(&mut client, "inflating").await;
    // 31 records of a megabyte and a byte of zeros each, gzipped: 32 MB inflated per batch.
    let records: Vec<Record> = (0..31)
        .map(|offset| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: -1,
            timestamp: 0,
            key: None,
            value: Some(Bytes::from(vec![0; (1 << 20) + 1])),
            headers: Default::default(),
        })
        .collect();
    let mut batch = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::Gzip,
    };
    RecordBatchEncoder::encode(&mut batch, &records, &options).unwrap();
    let batch = batch.freeze();
    assert!(batch.len() < 100_000, "{} bytes compressed", batch.len());
    let mut stream = kafka_connect(&server);
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic("inflating"))
            .with_partition_data(
                (0..100)
                    .map(|_| {
                        PartitionProduceData::default()
                            .with_index(0)
                            .with_records(Some(batch.clone()))
                    })
                    .collect(),
            )]);
    let baseline = server.status_bytes("VmRSS");
    let mut body = kafka_call(&mut stream, ApiKey::Produce, 3, &request);
    let response = ProduceResponse::decode(&mut body, 3).unwrap();
    let codes: Vec<i16> = response.responses[0]
        .partition_responses
        .iter()
        .map(|partition| partition.error_code)
        .collect();
    assert_eq!(codes.len(), 100);
    // MESSAGE_TOO_LARGE: each record is larger than the server accepts.
    assert!(codes.iter().all(|&code| code == 10), "{codes:?}");
    assert_peak_within(&server, baseline, 64 * MIB);
}

#[tokio::test]
async fn frames_wait_for_room_in_the_request_memory_which_a_stalled_frame_gives_back() {
    let frame_limit = 3 * MIB;
    let budget = frame_limit + MIB / 2;
    let server = ServerProcess::start(&[
        "--max-payload-bytes",
        &MIB.to_string(),
        "--max-frame-bytes",
        &frame_limit.to_string(),
        "--max-request-memory",
        &budget.to_string(),
        "--read-timeout-ms",
        "3000",
        "--kafka-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let metrics = server.metrics_addr.unwrap();
    let mut client = connect(&server).await;
    create(&mut client, "t").await;
    let baseline = server.status_bytes("VmRSS");

    // Sixteen connections each send all but the last kilobyte of a frame just under the frame
    // limit (a publish over the payload limit, refused), then, a second later, the rest. The
    // server reads one at a time as the budget allows: it never holds the sixteen frames'
    // 48 MiB at once, which it would without a budget (in trials, 70 MiB more at the peak
    // than before without one, 17 MiB with it).
    let oversized = Bytes::from(vec![7u8; (frame_limit - 1024) as usize]);
    let rest_at = tokio::time::Instant::now() + Duration::from_secs(1);
    let slow_senders = (0..16).map(|_| {
        let oversized = oversized.clone();
        let server = &server;
        async move {
            let mut client = connect(server).await;
            let mut bytes = BytesMut::new();
            let frame = RequestFrame {
                correlation_id: 1,
                max_wait_ms: 0,
                command: publish(oversized),
            };
            client.codec_mut().encode(frame, &mut bytes).unwrap();
            let (first, rest) = bytes.split_at(bytes.len() - 1024);
            let stream = client.get_mut();
            stream.write_all(first).await.unwrap();
            tokio::time::sleep_until(rest_at).await;
            stream.write_all(rest).await.unwrap();
            match client.next().await.unwrap().unwrap() {
                Decoded::Message(ResponseFrame {
                    result: Err(ErrorReply::TooLarge { what, .. }),
                    ..
                }) if what == "payload" => {}
                other => panic!("{other:?}"),
            }
        }
    });
    futures::future::join_all(slow_senders).await;
    // The budget, each connection's read buffer, a frame being decoded and what the
    // allocator keeps for a while.
    assert_peak_within(&server, baseline, budget + 24 * MIB);
    // Sixteen connections then each pipeline eight such frames (384 MiB in all) without waiting
    // for answers: the server reads them as the budget allows and answers every one.
    let senders = (0..16).map(|_| {
        let oversized = oversized.clone();
        let server = &server;
        async move {
            let mut client = connect(server).await;
            for id in 0..8 {
                let frame = RequestFrame {
                    correlation_id: id,
                    max_wait_ms: 0,
                    command: publish(oversized.clone()),
                };
                client.feed(frame).await.unwrap();
            }
            SinkExt::<RequestFrame>::flush(&mut client).await.unwrap();
            for id in 0..8 {
                match client.next().await.unwrap().unwrap() {
                    Decoded::Message(ResponseFrame {
                        correlation_id,
                        result: Err(ErrorReply::TooLarge { what, .. }),
                    }) if correlation_id == id && what == "payload" => {}
                    other => panic!("{other:?}"),
                }
            }
        }
    });
    futures::future::join_all(senders).await;
    let (_, _, text) = broker_testkit::http::get(metrics, "/metrics", "");
    assert!(
        sample(&text, "broker_request_memory_waits_total") >= 1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "broker_request_memory_limit_bytes"),
        budget as f64
    );

    // A Kafka client that announces a frame of 3 MiB and sends a little of it holds that much
    // room: a publish of 2 MiB on the broker's port waits, and goes through once the read
    // timeout has closed the stalled connection and given its room back.
    let mut stalled = kafka_connect(&server);
    stalled
        .write_all(&((frame_limit - 16) as u32).to_be_bytes())
        .unwrap();
    stalled.write_all(&[0; 1024]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, _, text) = broker_testkit::http::get(metrics, "/metrics", "");
        if sample(&text, "broker_request_memory_bytes") >= (frame_limit - 16) as f64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stalled frame never got room: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let payload = Bytes::from(vec![9u8; 600 * 1024]);
    let waiting = tokio::spawn(async move { call(&mut client, publish(payload)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "a publish was read with no room for it"
    );
    let mut rest = Vec::new();
    // The stalled connection is closed by the read timeout (a reset or an end of stream).
    let closed = stalled.read_to_end(&mut rest);
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    let published = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiting publishes went through once room was given back")
        .unwrap();
    assert_eq!(published, Ok(Outcome::Published(0)));
    request_memory_drains(metrics).await;
}

/// A client that pipelines hundreds of descriptions of every topic (a few dozen bytes each,
/// answered with about a megabyte) and reads none of the answers: the server builds them one at
/// a time (without that bound it built every one it had in flight, 1,024 a connection), and
/// answers every one, in order, once the client reads.
#[tokio::test]
async fn descriptions_nobody_reads_are_built_one_at_a_time() {
    let server = ServerProcess::start(&[]);
    let mut client = connect(&server).await;
    let topics = 2_000u64;
    for id in 0..topics {
        let frame = RequestFrame {
            correlation_id: id,
            max_wait_ms: 0,
            command: Command::Create {
                topic: format!("described-topic-{id:05}"),
                partition_count: 16,
                key_hash: KeyHash::default(),
                settings: Vec::new(),
            },
        };
        client.feed(frame).await.unwrap();
    }
    SinkExt::<RequestFrame>::flush(&mut client).await.unwrap();
    for id in 0..topics {
        match client.next().await.unwrap().unwrap() {
            Decoded::Message(ResponseFrame {
                correlation_id,
                result: Ok(Outcome::Created(true)),
            }) if correlation_id == id => {}
            other => panic!("{other:?}"),
        }
    }
    let describe = || Command::Describe { topic: None };
    let answer = call(&mut client, describe()).await.unwrap();
    let answer_bytes = broker_proto::outcome_bytes(&answer);
    assert!(answer_bytes > MIB / 2, "{answer_bytes}");
    let baseline = server.status_bytes("VmRSS");

    let descriptions = 200;
    for id in 0..descriptions {
        let frame = RequestFrame {
            correlation_id: id,
            max_wait_ms: 0,
            command: describe(),
        };
        client.feed(frame).await.unwrap();
    }
    SinkExt::<RequestFrame>::flush(&mut client).await.unwrap();
    // Time for the server to build whatever it would.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // What the sockets' buffers hold, a few answers, and what the allocator keeps for a while:
    // far below the 200 answers asked for.
    assert_peak_within(&server, baseline, 64 * MIB);
    for id in 0..descriptions {
        match client.next().await.unwrap().unwrap() {
            Decoded::Message(ResponseFrame {
                correlation_id,
                result: Ok(described),
            }) if correlation_id == id => assert_eq!(described, answer, "description {id}"),
            other => panic!("{other:?}"),
        }
    }
}

/// A client that pipelines hundreds of reads, each a few dozen bytes asking for megabytes of
/// records on disk (or for none: the first record comes whatever the budget), and reads none
/// of the answers: the server builds only the answers the request memory has room for
/// (without that bound it built them all, up to 3 MiB each), and answers every read once the
/// client reads, each with at least its first record.
#[tokio::test]
async fn answers_to_reads_nobody_reads_take_room_in_the_request_memory() {
    let frame_limit = 3 * MIB;
    let budget = 4 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let (payload_limit, frame_limit_text, budget_text) = (
        (256 * 1024).to_string(),
        frame_limit.to_string(),
        budget.to_string(),
    );
    let args = [
        "--max-payload-bytes",
        &payload_limit,
        "--max-frame-bytes",
        &frame_limit_text,
        "--max-request-memory",
        &budget_text,
        "--metrics-listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
        // A checkpoint after every entry: the records go to segment files, and a read of them
        // after the restart builds its answer from the disk.
        "--snapshot-log-bytes",
        "1",
    ];
    let mut server = ServerProcess::start(&args);
    let mut client = connect(&server).await;
    create_with_large_records(&mut client, 100).await;
    drop(client);
    assert!(server.terminate(Duration::from_secs(30)).success());
    let server = ServerProcess::start(&args);
    let mut client = connect(&server).await;
    let baseline = server.status_bytes("VmRSS");

    // 800 reads of one record each asking for no bytes (the record, 250,000 bytes, comes
    // anyway), then a hundred of up to 3 MiB.
    let reads = 900;
    for id in 0..reads {
        let (max_records, max_bytes) = if id < 800 { (1, Some(0)) } else { (100, None) };
        let frame = RequestFrame {
            correlation_id: id,
            max_wait_ms: 0,
            command: read_t((id % 100) as i64, max_records, max_bytes),
        };
        client.feed(frame).await.unwrap();
    }
    SinkExt::<RequestFrame>::flush(&mut client).await.unwrap();
    // Time for the server to build whatever it would.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The budget, what the sockets' buffers hold, and what the allocator keeps for a while:
    // far below the 500 MiB of answers asked for.
    assert_peak_within(&server, baseline, budget + 48 * MIB);
    let mut records = 0;
    for id in 0..reads {
        match client.next().await.unwrap().unwrap() {
            Decoded::Message(ResponseFrame {
                correlation_id,
                result: Ok(Outcome::Read(read)),
            }) if correlation_id == id => {
                assert!(!read.records.is_empty(), "read {id} answered no record");
                records += read.records.len();
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(records >= reads as usize, "{records}");
    let (_, _, text) = broker_testkit::http::get(server.metrics_addr.unwrap(), "/metrics", "");
    assert!(
        sample(&text, "broker_request_memory_waits_total") >= 1.0,
        "{text}"
    );
    request_memory_drains(server.metrics_addr.unwrap()).await;
}

/// A client that pipelines hundreds of reads of megabytes and reads none of the answers holds
/// its connection's share of the request memory (a quarter of it here), not all of it: another
/// client's read is answered meanwhile, where without a share it waited for the first one's
/// write timeout (a minute here) to give the room back.
#[tokio::test]
async fn a_client_that_reads_no_answers_holds_only_its_share_of_the_request_memory() {
    let frame_limit = 3 * MIB;
    let budget = 12 * MIB;
    let (frame_limit_text, budget_text) = (frame_limit.to_string(), budget.to_string());
    let server = ServerProcess::start(&[
        "--max-payload-bytes",
        "262144",
        "--max-frame-bytes",
        &frame_limit_text,
        "--max-request-memory",
        &budget_text,
        "--write-timeout-ms",
        "60000",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let mut greedy = connect(&server).await;
    create_with_large_records(&mut greedy, 40).await;
    // 300 reads of up to 3 MiB each (900 MiB of answers), none of them read.
    for id in 0..300 {
        let frame = RequestFrame {
            correlation_id: id,
            max_wait_ms: 0,
            command: read_t(0, 40, None),
        };
        greedy.feed(frame).await.unwrap();
    }
    SinkExt::<RequestFrame>::flush(&mut greedy).await.unwrap();
    // Until its answers fill the sockets' buffers and its share: it then waits for room.
    let metrics = server.metrics_addr.unwrap();
    let mut waited = false;
    for _ in 0..200 {
        let (_, _, text) = broker_testkit::http::get(metrics, "/metrics", "");
        if sample(&text, "broker_request_memory_waits_total") >= 1.0 {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(waited, "the greedy client never waited for room");
    let (_, _, text) = broker_testkit::http::get(metrics, "/metrics", "");
    assert!(
        sample(&text, "broker_request_memory_bytes") <= (budget / 4 + 64 * 1024) as f64,
        "{text}"
    );
    // Another client reads a record, its answer taking room of its own.
    let mut other = connect(&server).await;
    let read = read_t(0, 4, None);
    let answered = tokio::time::timeout(Duration::from_secs(20), call(&mut other, read)).await;
    match answered {
        Ok(Ok(Outcome::Read(read))) => assert_eq!(read.records.len(), 4),
        other => panic!("the other client was not answered: {other:?}"),
    }
    drop(greedy);
}

/// Connections that say nothing hold every connection slot (on both listeners): each new
/// client displaces the oldest of them, and is served at once, where it waited in the listen
/// backlog until one of them timed out (10 s without a hello). Connections that said who they
/// are are never displaced.
#[tokio::test]
async fn connections_that_say_nothing_give_their_slots_to_new_ones() {
    let server = ServerProcess::start(&[
        "--max-connections",
        "5",
        "--kafka-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let kafka = server.kafka_addr.unwrap();
    let metrics = server.metrics_addr.unwrap();
    // One client that said hello, then four that say nothing, oldest first: two on each port.
    let mut first = connect(&server).await;
    create(&mut first, "t").await;
    let mut silent = Vec::new();
    for addr in [server.addr, kafka, server.addr, kafka] {
        silent.push(TcpStream::connect(addr).await.unwrap());
        // In this order: each is accepted before the next connects.
        for _ in 0..100 {
            let (_, _, text) = broker_testkit::http::get(metrics, "/metrics", "");
            let open = sample(&text, "broker_connections_open{listener=\"broker\"}")
                + sample(&text, "broker_connections_open{listener=\"kafka\"}");
            if open as usize == silent.len() + 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Two new clients: each displaces the oldest silent one.
    for _ in 0..2 {
        let mut client = tokio::time::timeout(Duration::from_secs(5), connect(&server))
            .await
            .expect("a new client waited for a slot");
        let described = call(
            &mut client,
            Command::EndOffset {
                topic: "t".into(),
                partition: 0,
            },
        )
        .await;
        assert_eq!(described, Ok(Outcome::Offset(0)));
        // It keeps its slot: the next one displaces a silent one, not this one.
        std::mem::forget(client);
    }
    for (index, stream) in silent.iter_mut().enumerate() {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(
            Duration::from_millis(500),
            tokio::io::AsyncReadExt::read(stream, &mut byte),
        )
        .await;
        match index {
            // Closed by the server.
            0 | 1 => assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{index}: {read:?}"),
            // Still open, waiting.
            _ => assert!(read.is_err(), "{index}: {read:?}"),
        }
    }
    // The client that said hello first was never displaced.
    let offset = call(&mut first, publish(Bytes::from_static(b"x"))).await;
    assert_eq!(offset, Ok(Outcome::Published(0)));
    let (_, _, text) = broker_testkit::http::get(metrics, "/metrics", "");
    assert_eq!(
        sample(
            &text,
            "broker_connections_refused_total{reason=\"displaced\"}"
        ),
        2.0
    );
}
