//! Kafka's clients against the real `broker-server` with `--kafka-listen`: `kcat` and
//! librdkafka (through confluent-kafka) and kafka-python produce and consume, and what they
//! store is read back through the broker's own client with the same keys, payloads, headers and
//! times, and the other way round. Malformed Kafka frames are answered, never a crash.
//!
//! The clients come from the package registries (`.ci/run` installs them): without them these
//! tests say so and pass, unless `BROKER_REQUIRE_KAFKA_CLIENTS` is set, as CI sets it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use broker_client::{
    BrokerRecord, Client, Discard, GroupSetting, Header, KeyHash, NameRules, PublishRecord,
    Retention, TopicName, TopicSetting,
};
use broker_testkit::cluster::Nodes;
use broker_testkit::process::ServerProcess;
use serde_json::Value;

const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/kafka/clients.py");

/// Whether the Kafka clients can run here: `python3` with confluent-kafka and kafka-python,
/// and `kcat`. Without them the caller skips, unless `BROKER_REQUIRE_KAFKA_CLIENTS` is set.
fn clients_installed() -> bool {
    let python = Command::new("python3")
        .args(["-c", "import confluent_kafka, kafka, aiokafka"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    let kcat = Command::new("kcat")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if python && kcat {
        return true;
    }
    assert!(
        std::env::var_os("BROKER_REQUIRE_KAFKA_CLIENTS").is_none(),
        "the Kafka clients are required (BROKER_REQUIRE_KAFKA_CLIENTS): python3 with \
         confluent-kafka, kafka-python and aiokafka: {python}, kcat: {kcat}"
    );
    eprintln!(
        "skipped: install tests/kafka/requirements.txt (pip) and kcat (apt) to run the Kafka \
         client tests"
    );
    false
}

/// A server with a Kafka listener, and a native client of it.
async fn server() -> (ServerProcess, String, Client) {
    let server = ServerProcess::start(&["--kafka-listen", "127.0.0.1:0"]);
    let kafka = server.kafka_addr.expect("the kafka address").to_string();
    let client = Client::connect(server.addr_string()).await.unwrap();
    (server, kafka, client)
}

/// Runs a scenario of `tests/kafka/clients.py`; its JSON report.
fn python(args: &[&str]) -> Value {
    let output = Command::new("python3")
        .arg(CLIENTS)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run python3");
    assert!(
        output.status.success(),
        "clients.py {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "clients.py {args:?} printed no JSON ({error}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Runs `kcat` with `args` and `input` on its standard input; its standard output.
fn kcat(args: &[&str], input: &str) -> String {
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kcat");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "kcat {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Every record of `partition` of `topic`, read natively.
async fn read_all(client: &Client, topic: &str, partition: i32) -> Vec<BrokerRecord> {
    let mut records = Vec::new();
    loop {
        let offset = records.last().map_or(0, |r: &BrokerRecord| r.offset + 1);
        let read = client
            .read(topic, partition, offset, 1000, Duration::ZERO)
            .await
            .unwrap();
        if read.records.is_empty() {
            return records;
        }
        records.extend(read.records);
    }
}

/// `record` for `partition`.
fn on(partition: i32, record: PublishRecord) -> PublishRecord {
    PublishRecord {
        partition: Some(partition),
        ..record
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn the_native_client_pointed_at_the_kafka_listener_is_told_so() {
    let (_server, kafka, _client) = server().await;
    let error = Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .connect(kafka.as_str())
        .await
        .unwrap_err();
    assert!(
        error.to_string().starts_with(
            "protocol error: this port does not speak the broker's protocol: it answers as a \
             Kafka listener does (a broker's --kafka-listen?)"
        ),
        "{error}"
    );
}

#[tokio::test]
async fn kcat_lists_metadata_and_round_trips_keyed_records_with_headers() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    client.create("orders", 2).await.unwrap();
    let metadata = kcat(&["-b", &kafka, "-L"], "");
    assert!(
        metadata.contains("topic \"orders\" with 2 partitions"),
        "{metadata}"
    );
    assert!(
        metadata.contains(&format!("broker 0 at {kafka}")),
        "{metadata}"
    );
    kcat(
        &[
            "-b",
            &kafka,
            "-P",
            "-t",
            "orders",
            "-p",
            "1",
            "-K",
            ":",
            "-H",
            "trace=abc",
            "-H",
            "dup=a",
            "-H",
            "dup=b",
        ],
        "k1:first\nk2:second\n",
    );
    // Read natively: the same key, payload and headers (a repeated name keeps every value, in
    // order), and a time of now.
    let records = read_all(&client, "orders", 1).await;
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].key.as_deref(), Some(&b"k1"[..]));
    assert_eq!(records[1].payload, "second");
    assert_eq!(
        records[0].headers,
        vec![
            Header::new("trace", "abc"),
            Header::new("dup", "a"),
            Header::new("dup", "b")
        ]
    );
    assert!(records[0].timestamp_ms > 1_700_000_000_000);
    // And back through kcat, with a record published natively.
    client
        .publish_batch(
            "orders",
            vec![on(
                1,
                PublishRecord::keyed(Some(b"nk"), "native").with_headers(vec![
                    Header::new("from", "native"),
                    Header::new("from", "again"),
                ]),
            )],
        )
        .await
        .unwrap();
    let consumed = kcat(
        &[
            "-b",
            &kafka,
            "-C",
            "-t",
            "orders",
            "-p",
            "1",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%k=%s @%o %h\n",
        ],
        "",
    );
    assert_eq!(
        consumed,
        "k1=first @0 trace=abc,dup=a,dup=b\nk2=second @1 trace=abc,dup=a,dup=b\n\
         nk=native @2 from=native,from=again\n"
    );
}

#[tokio::test]
async fn confluent_kafka_records_are_read_natively_with_their_fields() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    client.create("events", 3).await.unwrap();
    let report = python(&["produce", &kafka, "events", "150"]);
    let first_timestamp = report["first_timestamp"].as_i64().unwrap();
    let delivered = report["delivered"].as_array().unwrap();
    assert_eq!(delivered.len(), 150);
    let mut native = Vec::new();
    for partition in 0..3 {
        native.extend(read_all(&client, "events", partition).await);
    }
    assert_eq!(native.len(), 150, "every record stored once");
    for record in &native {
        let key = text(record.key.as_deref().unwrap());
        let index: i64 = key.strip_prefix("key-").unwrap().parse().unwrap();
        let reported = delivered.iter().find(|d| d["key"] == key.as_str()).unwrap();
        assert_eq!(reported["partition"], record.partition);
        assert_eq!(reported["offset"], record.offset);
        assert_eq!(record.payload, format!("value-{index}"));
        assert_eq!(record.timestamp_ms, first_timestamp + index);
        assert_eq!(
            record.headers,
            vec![
                Header::new("index", index.to_string()),
                Header {
                    name: "empty".into(),
                    value: None
                }
            ]
        );
    }
}

#[tokio::test]
async fn native_records_are_consumed_by_confluent_kafka_with_their_fields() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    client.create("native", 2).await.unwrap();
    let records = (0..40)
        .map(|i| {
            on(
                (i % 2) as i32,
                PublishRecord::keyed(Some(format!("n{i}").as_bytes()), format!("payload {i}"))
                    .with_headers(vec![Header::new("i", i.to_string())])
                    .with_timestamp(1_700_000_000_000 + i),
            )
        })
        .collect();
    client.publish_batch("native", records).await.unwrap();
    let report = python(&["consume", &kafka, "native", "2", "40"]);
    let consumed = report["records"].as_array().unwrap();
    assert_eq!(consumed.len(), 40);
    for record in consumed {
        let i: i64 = record["key"].as_str().unwrap()[1..].parse().unwrap();
        assert_eq!(record["partition"], i % 2);
        assert_eq!(record["offset"], i / 2);
        assert_eq!(record["value"], format!("payload {i}"));
        assert_eq!(record["headers"], serde_json::json!([["i", i.to_string()]]));
        assert_eq!(record["timestamp"], 1_700_000_000_000 + i);
    }
}

#[tokio::test]
async fn kafka_python_produces_and_consumes() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    client.create("py", 2).await.unwrap();
    let report = python(&["python-roundtrip", &kafka, "py", "20"]);
    let records = report["records"].as_array().unwrap();
    assert_eq!(records.len(), 20);
    for partition in 0..2 {
        let native = read_all(&client, "py", partition).await;
        assert_eq!(native.len(), 10);
        for record in native {
            let key = text(record.key.as_deref().unwrap());
            let i: i64 = key[1..].parse().unwrap();
            assert_eq!(i % 2, i64::from(partition));
            assert_eq!(record.payload, format!("v{i}"));
            assert_eq!(record.headers, vec![Header::new("n", i.to_string())]);
        }
    }
    // Its group consumer too, alone in its group with the default settings; its commits
    // release the records (interest retention).
    let grouped = python(&["python-group", &kafka, "py", "py-group", "20"]);
    assert_eq!(grouped["records"].as_array().unwrap().len(), 20);
    let lag = client.lag("py", "py-group").await.unwrap();
    assert!(
        lag.iter().all(|row| row.lag == 0 && row.committed == 10),
        "{lag:?}"
    );
}

#[tokio::test]
async fn aiokafka_produces_idempotently_and_consumes_in_a_group() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    // A log, as Kafka's topics are: the records stay once the group committed them.
    client
        .create_topic(
            "aio",
            2,
            KeyHash::Murmur2,
            &[broker_client::TopicSetting::Retention(
                broker_client::Retention::Limits,
            )],
        )
        .await
        .unwrap();
    let report = python(&["aio-roundtrip", &kafka, "aio", "aio-group", "20"]);
    let first_timestamp = report["first_timestamp"].as_i64().unwrap();
    let sent = report["sent"].as_array().unwrap();
    for (i, sent) in sent.iter().enumerate() {
        assert_eq!(sent["partition"], i % 2);
        assert_eq!(sent["offset"], i / 2);
    }
    // Stored as the native fields, each record once.
    for partition in 0..2 {
        let native = read_all(&client, "aio", partition).await;
        assert_eq!(native.len(), 10);
        for (index, record) in native.iter().enumerate() {
            let i = 2 * index as i64 + i64::from(partition);
            assert_eq!(record.key.as_deref(), Some(format!("k{i}").as_bytes()));
            assert_eq!(record.payload, format!("v{i}"));
            assert_eq!(record.headers, vec![Header::new("n", i.to_string())]);
            assert_eq!(record.timestamp_ms, first_timestamp + i);
        }
    }
    // Its group consumed them with their fields, and committed them.
    let records = report["records"].as_array().unwrap();
    assert_eq!(records.len(), 20);
    for record in records {
        let i: i64 = record["key"].as_str().unwrap()[1..].parse().unwrap();
        assert_eq!(record["partition"], i % 2);
        assert_eq!(record["timestamp"], first_timestamp + i);
        assert_eq!(record["headers"], serde_json::json!([["n", i.to_string()]]));
    }
    let lag = client.lag("aio", "aio-group").await.unwrap();
    assert!(
        lag.iter().all(|row| row.lag == 0 && row.committed == 10),
        "{lag:?}"
    );
    // Kafka's DescribeProducers lists the producer on each partition with the last sequence
    // number it sent there, and the broker's own call the number it expects next.
    let listed = describe_producers(&kafka, "aio", &[0, 1]);
    assert_eq!(listed.len(), 2);
    let producer = listed[0].active_producers[0].producer_id;
    assert!(producer.0 >= 0, "{listed:?}");
    for partition in &listed {
        assert_eq!(partition.error_code, 0, "{listed:?}");
        assert_eq!(partition.active_producers.len(), 1, "{listed:?}");
        let state = &partition.active_producers[0];
        assert_eq!((state.producer_id, state.last_sequence), (producer, 9));
        assert!(state.last_timestamp >= first_timestamp, "{listed:?}");
        let native = client
            .producers("aio", partition.partition_index)
            .await
            .unwrap();
        assert_eq!(native.len(), 1);
        assert_eq!(native[0].next_sequence, 10);
        assert_eq!(native[0].last_offset, Some(9));
    }
}

/// Kafka's DescribeProducers (version 0) of `partitions` of `topic`, asked of the listener at
/// `kafka`: each partition's answer.
fn describe_producers(
    kafka: &str,
    topic: &str,
    partitions: &[i32],
) -> Vec<kafka_protocol::messages::describe_producers_response::PartitionResponse> {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
    let request = DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
        .with_name(kafka_protocol::messages::TopicName(StrBytes::from_string(
            topic.to_owned(),
        )))
        .with_partition_indexes(partitions.to_vec())]);
    // A flexible request: its header ends with an empty set of tagged fields.
    let mut body = bytes::BytesMut::from(&[0_u8][..]);
    request.encode(&mut body, 0).unwrap();
    let mut stream = TcpStream::connect(kafka).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write_request(&mut stream, 61, 0, 1, &body);
    let (id, answer) = read_response(&mut stream);
    assert_eq!(id, 1);
    // The response header's tagged fields, then the answer.
    let mut answer = bytes::Bytes::from(answer).slice(1..);
    let mut response = DescribeProducersResponse::decode(&mut answer, 0).unwrap();
    response.topics.remove(0).partitions
}

#[tokio::test]
async fn admin_clients_describe_a_topics_settings_as_configs() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    client
        .create_topic(
            "configured",
            1,
            KeyHash::Murmur2,
            &[
                broker_client::TopicSetting::Retention(broker_client::Retention::Limits),
                broker_client::TopicSetting::MaxAgeMs(3_600_000),
                broker_client::TopicSetting::MaxRecords(1000),
            ],
        )
        .await
        .unwrap();
    let described = python(&["configs", &kafka, "configured"]);
    let expected = serde_json::json!({
        "cleanup.policy": "delete",
        "retention.ms": "3600000",
        "retention.bytes": "-1",
        "broker.retention": "limits",
        "broker.max.records": "1000",
        "broker.discard": "old",
    });
    assert_eq!(described["confluent"], expected, "{described}");
    assert_eq!(described["python"], expected, "{described}");
}

#[tokio::test]
async fn the_admin_client_changes_a_topics_configs_and_the_broker_refuses_what_it_cannot_change() {
    use broker_client::{Retention, TopicSetting};
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    let limits = [TopicSetting::Retention(Retention::Limits)];
    client
        .create_topic("altered", 1, KeyHash::Murmur2, &limits)
        .await
        .unwrap();
    for _ in 0..5 {
        client.publish("altered", 0, "abcd").await.unwrap();
    }
    let report = python(&["alter-configs", &kafka, "altered"]);
    assert_eq!(
        report,
        serde_json::json!({
            "validated": null,
            "incremental": null,
            "alter": null,
            "deleted": "INVALID_CONFIG",
            "unknown": "INVALID_CONFIG",
            "broker": "INVALID_REQUEST",
        }),
        "{report}"
    );
    // The changes made, and only those: validate_only changed nothing, and the lowered limits
    // removed the oldest records at once.
    let described = client.describe_topic("altered").await.unwrap();
    assert_eq!(
        described.settings,
        [
            TopicSetting::Retention(Retention::Limits),
            TopicSetting::MaxRecords(2),
            TopicSetting::MaxBytes(8),
        ]
    );
    let partition = &described.partitions[0];
    assert_eq!((partition.earliest_offset, partition.end_offset), (3, 5));
}

#[tokio::test]
async fn every_compression_codec_is_stored_as_plain_records() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        client.create(codec, 1).await.unwrap();
        python(&["produce", &kafka, codec, "30", "--compression", codec]);
        let records = read_all(&client, codec, 0).await;
        assert_eq!(records.len(), 30, "{codec}");
        assert_eq!(records[29].payload, "value-29", "{codec}");
    }
}

#[tokio::test]
async fn keyed_records_land_where_the_native_publish_keyed_puts_them() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    // librdkafka's murmur2_random is the Java client's default partitioner.
    client
        .create_topic("keyed", 6, KeyHash::Murmur2, &[])
        .await
        .unwrap();
    let report = python(&[
        "produce",
        &kafka,
        "keyed",
        "60",
        "--partitioner",
        "murmur2_random",
    ]);
    for delivered in report["delivered"].as_array().unwrap() {
        let key = delivered["key"].as_str().unwrap();
        let (partition, _) = client
            .publish_keyed("keyed", Some(key.as_bytes()), "native")
            .await
            .unwrap();
        assert_eq!(delivered["partition"], partition, "key {key}");
    }
}

#[tokio::test]
async fn offsets_reset_as_the_client_says_are_found_by_time_and_records_are_deleted() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    client.create("reset", 1).await.unwrap();
    let records = (0..10)
        .map(|i| {
            on(
                0,
                PublishRecord::keyed(None, format!("r{i}")).with_timestamp(1_000 * (i + 1)),
            )
        })
        .collect();
    client.publish_batch("reset", records).await.unwrap();
    client.purge("reset", 0, 4).await.unwrap();
    // Offset 0 has left: the fetch answers OFFSET_OUT_OF_RANGE and the client resets.
    let earliest = python(&[
        "consume", &kafka, "reset", "1", "6", "--start", "stored", "--reset", "earliest",
    ]);
    assert_eq!(earliest["records"][0]["offset"], 4);
    let latest = python(&[
        "consume", &kafka, "reset", "1", "0", "--start", "stored", "--reset", "latest",
    ]);
    assert_eq!(latest["records"], serde_json::json!([]));
    // ListOffsets: by time, and the watermarks.
    let found = python(&["offsets-for-time", &kafka, "reset", "0", "7500"]);
    assert_eq!(found["offset"], 7);
    assert_eq!(
        (found["low"].as_i64(), found["high"].as_i64()),
        (Some(4), Some(10))
    );
    let past = python(&["offsets-for-time", &kafka, "reset", "0", "99000"]);
    assert_eq!(past["offset"], -1, "no record at or after the time");
    // DeleteRecords: the records below an offset leave.
    let deleted = python(&["delete-records", &kafka, "reset", "0", "8"]);
    assert_eq!(deleted["low_watermark"], 8);
    let read = client
        .read("reset", 0, 0, 10, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(read.start_offset, 8);
    assert_eq!(read.records[0].payload, "r8");
}

/// The payloads of partition 0 of `topic`, read natively.
async fn payloads(client: &Client, topic: &str) -> Vec<String> {
    let records = read_all(client, topic, 0).await;
    records.iter().map(|record| text(&record.payload)).collect()
}

#[tokio::test]
async fn refused_records_fail_their_batch_without_gaps_duplicates_past_it_or_endless_retries() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    let limited = |max_bytes| {
        [
            TopicSetting::Retention(Retention::Limits),
            TopicSetting::MaxBytes(max_bytes),
            TopicSetting::Discard(Discard::New),
        ]
    };
    // Full after the first record: the records after the refused one are not stored either,
    // however small, so the partition never holds a later record without an earlier one. The
    // client retries the batch until its timeout: only the first record can be stored again.
    client
        .create_topic("full", 1, KeyHash::default(), &limited(10))
        .await
        .unwrap();
    let report = python(&[
        "refusals",
        &kafka,
        "full",
        "--payloads",
        "aaaaa",
        "bbbbbbbb",
        "cc",
    ]);
    // The record that never fits times out; nothing the client was told failed is stored
    // after it, and whatever it was told was delivered is stored. (librdkafka usually sends
    // the three in one batch, which then times out whole with only "aaaaa" stored; now and
    // then it sends a record in a batch of its own, which is stored and answered on its own:
    // the rule within one batch is the handler's `a_partition_full_within_a_batch_...` test.)
    assert_eq!(report["errors"]["bbbbbbbb"], "_MSG_TIMED_OUT", "{report}");
    let stored = payloads(&client, "full").await;
    assert!(
        !stored.is_empty() && !stored.iter().any(|payload| payload == "bbbbbbbb"),
        "{stored:?}"
    );
    for payload in ["aaaaa", "cc"] {
        if report["errors"][payload].is_null() {
            assert!(
                stored.iter().any(|kept| kept == payload),
                "{report} {stored:?}"
            );
        } else {
            assert_eq!(report["errors"][payload], "_MSG_TIMED_OUT", "{report}");
        }
    }

    // A record larger than a partition keeps fails its batch at once, not at the timeout; the
    // records before it were stored, none after it.
    client
        .create_topic("small", 1, KeyHash::default(), &limited(1000))
        .await
        .unwrap();
    let large = "x".repeat(1100);
    let report = python(&[
        "refusals",
        &kafka,
        "small",
        "--timeout-ms",
        "60000",
        "--payloads",
        "a1",
        "a2",
        &large,
        "a4",
    ]);
    assert_eq!(
        report["errors"][large.as_str()],
        "MSG_SIZE_TOO_LARGE",
        "{report}"
    );
    assert!(report["seconds"].as_f64().unwrap() < 30.0, "{report}");
    // In one batch (as librdkafka usually sends them) the records before the large one are
    // stored and none after it; a record the client sent in a batch of its own was answered
    // on its own.
    let stored = payloads(&client, "small").await;
    assert!(
        stored.starts_with(&["a1".to_owned(), "a2".to_owned()]),
        "{stored:?}"
    );
    assert!(!stored.contains(&large), "{stored:?}");
    if report["errors"]["a4"] == "MSG_SIZE_TOO_LARGE" {
        assert_eq!(stored, ["a1", "a2"], "{report}");
    } else {
        assert!(report["errors"]["a4"].is_null(), "{report}");
        assert_eq!(stored, ["a1", "a2", "a4"], "{report}");
    }

    // Headers the broker cannot store fail their batch at once, and nothing of it is stored.
    client.create("headers", 1).await.unwrap();
    let report = python(&[
        "refusals",
        &kafka,
        "headers",
        "--timeout-ms",
        "60000",
        "--headers",
        "70",
        "--payloads",
        "h1",
        "h2",
    ]);
    for payload in ["h1", "h2"] {
        assert_eq!(report["errors"][payload], "INVALID_RECORD", "{report}");
    }
    assert!(report["seconds"].as_f64().unwrap() < 30.0, "{report}");
    assert!(payloads(&client, "headers").await.is_empty());
}

#[tokio::test]
async fn a_transactional_producer_is_refused_at_once_as_fatal() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, _client) = server().await;
    let report = python(&["transactional", &kafka]);
    assert_eq!(
        report["error"], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "{report}"
    );
    assert_eq!(report["fatal"], true, "{report}");
    assert!(report["seconds"].as_f64().unwrap() < 10.0, "{report}");
}

#[tokio::test]
async fn the_admin_client_creates_topics_with_kafkas_retention() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    let created = python(&["create", &kafka, "made-by-kafka", "4"]);
    assert_eq!(created["errors"], serde_json::json!({}));
    assert_eq!(created["partitions"], 4);
    assert_eq!(created["brokers"], serde_json::json!([kafka]));
    let described = client.describe_topic("made-by-kafka").await.unwrap();
    assert_eq!(described.partitions.len(), 4);
    assert!(
        described
            .settings
            .contains(&broker_client::TopicSetting::MaxAgeMs(7 * 24 * 3600 * 1000)),
        "{:?}",
        described.settings
    );
    let again = python(&["create", &kafka, "made-by-kafka", "4"]);
    assert!(
        again["errors"]["made-by-kafka"]
            .as_str()
            .unwrap()
            .contains("TOPIC_ALREADY_EXISTS"),
        "{again}"
    );
}

/// Writes a request frame: length, API key, version, correlation id, no client id, `body`.
fn write_request(stream: &mut TcpStream, key: i16, version: i16, correlation_id: i32, body: &[u8]) {
    let mut frame = Vec::new();
    frame.extend_from_slice(&key.to_be_bytes());
    frame.extend_from_slice(&version.to_be_bytes());
    frame.extend_from_slice(&correlation_id.to_be_bytes());
    frame.extend_from_slice(&(-1_i16).to_be_bytes());
    frame.extend_from_slice(body);
    stream
        .write_all(&(frame.len() as u32).to_be_bytes())
        .unwrap();
    stream.write_all(&frame).unwrap();
}

/// Reads one response frame: its correlation id and the rest.
fn read_response(stream: &mut TcpStream) -> (i32, Vec<u8>) {
    let mut length = [0; 4];
    stream.read_exact(&mut length).unwrap();
    let mut body = vec![0; u32::from_be_bytes(length) as usize];
    stream.read_exact(&mut body).unwrap();
    let correlation_id = i32::from_be_bytes(body[..4].try_into().unwrap());
    (correlation_id, body[4..].to_vec())
}

#[test]
fn malformed_kafka_frames_are_answered_and_the_server_keeps_serving() {
    let server = ServerProcess::start(&["--kafka-listen", "127.0.0.1:0"]);
    let kafka = server.kafka_addr.unwrap();
    let mut stream = TcpStream::connect(kafka).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // An unknown API key and an unsupported version: UNSUPPORTED_VERSION (35).
    write_request(&mut stream, 999, 0, 1, &[]);
    assert_eq!(
        read_response(&mut stream),
        (1, 35_i16.to_be_bytes().to_vec())
    );
    write_request(&mut stream, 0, 99, 2, &[]);
    assert_eq!(
        read_response(&mut stream),
        (2, 35_i16.to_be_bytes().to_vec())
    );
    // A truncated body: INVALID_REQUEST (42).
    write_request(&mut stream, 3, 1, 3, &[0, 0]);
    assert_eq!(
        read_response(&mut stream),
        (3, 42_i16.to_be_bytes().to_vec())
    );
    // ApiVersions of a version it does not speak: version 0, UNSUPPORTED_VERSION, the ranges.
    write_request(&mut stream, 18, 42, 4, &[]);
    let (id, body) = read_response(&mut stream);
    assert_eq!(id, 4);
    assert_eq!(body[..2], 35_i16.to_be_bytes());
    // A produce API entry among the ranges: key 0 from 3 to 9.
    assert!(body.windows(6).any(|w| w == [0, 0, 0, 3, 0, 9]), "{body:?}");
    // Still served: a good ApiVersions v0.
    write_request(&mut stream, 18, 0, 5, &[]);
    let (id, body) = read_response(&mut stream);
    assert_eq!((id, &body[..2]), (5, &[0_u8, 0][..]));
    // A length past the limit closes this connection, and only it.
    stream.write_all(&u32::MAX.to_be_bytes()).unwrap();
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    let mut again = TcpStream::connect(kafka).unwrap();
    again
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write_request(&mut again, 18, 0, 6, &[]);
    assert_eq!(read_response(&mut again).0, 6);
    assert!(Path::new(CLIENTS).exists());
}

/// `python(["group", ...])`'s records as (consumer, partition, offset).
fn group_records(report: &Value) -> Vec<(i64, i64, i64)> {
    report["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["consumer"].as_i64().unwrap(),
                r["partition"].as_i64().unwrap(),
                r["offset"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_consumer_group_of_two_rebalances_commits_and_resumes_after_a_restart() {
    if !clients_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let flags = ["--kafka-listen", "127.0.0.1:0", "--data-dir", data_dir];
    let mut server = ServerProcess::start(&flags);
    let client = Client::connect(server.addr_string()).await.unwrap();
    client.create("grouped", 4).await.unwrap();
    let batch = |from: i64| {
        (from..from + 50)
            .map(|i| PublishRecord::keyed(None, format!("r{i}")))
            .collect::<Vec<_>>()
    };
    for from in [0, 50, 100, 150] {
        client.publish_batch("grouped", batch(from)).await.unwrap();
    }
    let kafka = server.kafka_addr.unwrap().to_string();
    let report = python(&["group", &kafka, "grouped", "workers", "200"]);
    let records = group_records(&report);
    let mut seen: Vec<(i64, i64)> = records.iter().map(|&(_, p, o)| (p, o)).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 200, "every record once");
    // The second consumer's arrival split the partitions: after it, each consumer's are its own.
    let events = report["events"].as_array().unwrap();
    let assigned = |consumer: &str| -> Vec<Vec<i64>> {
        events
            .iter()
            .filter(|e| e["consumer"] == consumer && e.get("assigned").is_some())
            .map(|e| {
                e["assigned"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p.as_i64().unwrap())
                    .collect()
            })
            .collect()
    };
    let (first, second) = (assigned("c0"), assigned("c1"));
    assert_eq!(first[0], vec![0, 1, 2, 3], "{events:?}");
    let (first_last, second_last) = (first.last().unwrap(), second.last().unwrap());
    assert_eq!(first_last.len() + second_last.len(), 4, "{events:?}");
    assert!(
        first_last.iter().all(|p| !second_last.contains(p)),
        "{events:?}"
    );
    // The group is the broker's: committed to the end, its records released.
    let lag = client.lag("grouped", "workers").await.unwrap();
    assert!(
        lag.iter().all(|row| row.lag == 0 && row.committed == 50),
        "{lag:?}"
    );
    let described = client.describe_topic("grouped").await.unwrap();
    assert!(described.partitions.iter().all(|p| p.records == 0));
    // After a restart, a consumer of the group resumes from the committed offsets.
    drop(client);
    server.terminate(Duration::from_secs(10));
    let server = ServerProcess::start_on(server.addr, &flags);
    let client = Client::connect(server.addr_string()).await.unwrap();
    client.publish_batch("grouped", batch(200)).await.unwrap();
    let kafka = server.kafka_addr.unwrap().to_string();
    let report = python(&[
        "group",
        &kafka,
        "grouped",
        "workers",
        "50",
        "--consumers",
        "1",
    ]);
    let records = group_records(&report);
    assert_eq!(records.len(), 50);
    assert!(
        records.iter().all(|&(_, _, offset)| offset >= 50),
        "{records:?}"
    );
}

#[tokio::test]
async fn consumers_whose_server_restarts_commit_what_they_consumed_and_read_nothing_twice() {
    if !clients_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let flags = ["--data-dir", data_dir, "--capacity", "1000"];
    let mut server =
        ServerProcess::start(&[&["--kafka-listen", "127.0.0.1:0"], &flags[..]].concat());
    let client = Client::connect(server.addr_string()).await.unwrap();
    client.create("steady", 2).await.unwrap();
    let records: Vec<PublishRecord> = (0..2_000)
        .map(|i| PublishRecord::keyed(None, format!("r{i}")))
        .collect();
    client.publish_batch("steady", records).await.unwrap();
    drop(client);
    let kafka = server.kafka_addr.unwrap().to_string();
    let mut consumer = Command::new("python3")
        .arg(CLIENTS)
        .args(["through-restart", &kafka, "steady", "steady", "2000", "200"])
        .args(["--consumers", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(consumer.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line.trim(), "consumed 200");
    // The server restarts while the consumers hold their partitions with nothing committed:
    // the restarted coordinator, which knows no member, takes each one back as it comes, so
    // that they commit what they consumed before giving their partitions up, rather than
    // losing them uncommitted and reading them again from the start.
    server.terminate(Duration::from_secs(10));
    let server = ServerProcess::start_on(
        server.addr,
        &[&["--kafka-listen", &kafka], &flags[..]].concat(),
    );
    consumer.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut report = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut report).unwrap();
    assert!(consumer.wait().unwrap().success(), "{report}");
    let report: Value = serde_json::from_str(&report).unwrap();
    let mut consumed: Vec<(i64, i64)> = report["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_i64().unwrap(), r[1].as_i64().unwrap()))
        .collect();
    let events = &report["events"];
    assert_eq!(consumed.len(), 2_000, "{events}");
    consumed.sort_unstable();
    consumed.dedup();
    assert_eq!(consumed.len(), 2_000, "nothing read twice: {events}");
    let revocations = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e.get("lost").is_some());
    assert!(revocations.clone().all(|e| e["lost"] == false), "{events}");
    assert!(revocations.count() >= 1, "{events}");
    let client = Client::connect(server.addr_string()).await.unwrap();
    let lag = client.lag("steady", "steady").await.unwrap();
    assert!(lag.iter().all(|row| row.lag == 0), "{lag:?}");
}

/// A confluent-kafka consumer of `group` on `topic` (of one partition), once it holds the
/// partition; it leaves when its standard input closes.
fn hold(kafka: &str, topic: &str, group: &str) -> std::process::Child {
    let mut holder = Command::new("python3")
        .arg(CLIENTS)
        .args(["hold", kafka, topic, group])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "assigned [0]");
    holder
}

#[tokio::test]
async fn a_commit_from_outside_a_group_moves_no_members_offsets_and_never_past_the_end() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    client.create("outside", 1).await.unwrap();
    let records: Vec<_> = (0..50)
        .map(|i| PublishRecord::keyed(None, format!("r{i}")))
        .collect();
    client.publish_batch("outside", records).await.unwrap();
    let commit = |group: &str, offset: i64| {
        python(&[
            "assigned-commit",
            &kafka,
            "outside",
            group,
            "0",
            &offset.to_string(),
        ])
    };
    // Past the end: refused, and nothing is stored (the group has no committed offset).
    let report = commit("solo", 5000);
    assert_eq!(report["error"], "OffsetOutOfRangeError", "{report}");
    assert_eq!(report["committed"], Value::Null, "{report}");
    // A partition the group never committed on has no committed offset, though the group
    // exists on the topic (it committed on another of its partitions).
    client.create("pair", 2).await.unwrap();
    let records = vec![
        on(0, PublishRecord::keyed(None, "a")),
        on(1, PublishRecord::keyed(None, "b")),
    ];
    client.publish_batch("pair", records).await.unwrap();
    let commit_on = |partition: &str, offset: &str| {
        python(&[
            "assigned-commit",
            &kafka,
            "pair",
            "pair-group",
            partition,
            offset,
        ])
    };
    assert_eq!(commit_on("0", "1")["committed"], 1);
    let report = commit_on("1", "5000");
    assert_eq!(report["error"], "OffsetOutOfRangeError", "{report}");
    assert_eq!(report["committed"], Value::Null, "{report}");
    // A group with no members takes a commit from outside it.
    let report = commit("held", 40);
    assert_eq!(report["error"], Value::Null, "{report}");
    assert_eq!(report["committed"], 40, "{report}");
    // While a member holds the partition, it does not: the member's offsets stay.
    let mut holder = hold(&kafka, "outside", "held");
    let report = commit("held", 3);
    assert_eq!(report["error"], "CommitFailedError", "{report}");
    // What the member committed itself, if anything (it commits as it consumes).
    assert!(report["committed"].as_i64() >= Some(40), "{report}");
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    // Nor while the group has native members.
    client.join("outside", "native", "m").await.unwrap();
    let report = commit("native", 3);
    assert_eq!(report["error"], "CommitFailedError", "{report}");
}

/// A consumer group of Kafka's clients is listed with its members and their partitions
/// (`Client::kafka_groups`), and `broker describe` and `broker top` show them beside the
/// broker's group of the same name, whose offsets they commit (it has no members of its own).
#[tokio::test]
async fn a_kafka_consumer_group_is_shown_with_its_members_and_their_partitions() {
    if !clients_installed() {
        return;
    }
    let (server, kafka, client) = server().await;
    client.create("watched", 1).await.unwrap();
    client.publish("watched", 0, "x").await.unwrap();
    assert_eq!(client.kafka_groups().await.unwrap(), []);
    let mut holder = hold(&kafka, "watched", "watchers");
    let broker = |args: &[&str]| {
        let output = Command::new(broker_testkit::process::binary("broker"))
            .args(["--addr", &server.addr_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(output.status.success(), "broker {args:?}: {output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    // It starts at the end (Kafka's default), and has committed nothing yet.
    let described = broker(&["describe", "watched"]);
    assert!(
        described.contains("group watchers (Kafka consumer group, ")
            && described.contains("[0]; no offsets committed yet"),
        "{described}"
    );
    let lag = Command::new(broker_testkit::process::binary("broker"))
        .args([
            "--addr",
            &server.addr_string(),
            "lag",
            "watched",
            "--group",
            "watchers",
        ])
        .output()
        .unwrap();
    assert!(
        !lag.status.success()
            && String::from_utf8_lossy(&lag.stderr).contains(
                "group watchers is a consumer group of Kafka's clients that has committed no \
                 offset on topic watched yet"
            ),
        "{lag:?}"
    );
    // Once it consumed a record it commits (every 5 s): the broker then holds the group on the
    // topic.
    client.publish("watched", 0, "y").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while client
        .describe_topic("watched")
        .await
        .unwrap()
        .groups
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the consumer never committed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let groups = client.kafka_groups().await.unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    let group = &groups[0];
    assert_eq!(
        (group.name.as_str(), group.state.as_str()),
        ("watchers", "Stable")
    );
    assert!(group.generation >= 1, "{group:?}");
    assert!(!group.protocol.is_empty(), "{group:?}");
    let member = &group.members[0];
    assert_eq!(member.client_host, "/127.0.0.1");
    assert_eq!(
        member.assignment,
        [broker_client::TopicPartitions {
            topic: "watched".into(),
            partitions: vec![0]
        }]
    );
    let described = broker(&["describe", "watched"]);
    let expected = format!(
        "group watchers (Kafka consumer group, {}, generation {}, Stable): {} ({} from /127.0.0.1) [0]",
        group.protocol, group.generation, member.member, member.client_id
    );
    assert!(described.contains(&expected), "{described}");
    // Its member owns the partition.
    assert!(
        described.lines().any(|line| line
            .split_whitespace()
            .take(2)
            .eq(["0", member.member.as_str()])),
        "{described}"
    );
    let json: Value = serde_json::from_str(&broker(&["describe", "--json"])).unwrap();
    assert_eq!(json["kafka_groups"][0]["name"], "watchers", "{json}");
    let top = broker(&["top", "--count", "1", "--interval", "200ms"]);
    assert!(
        top.lines().any(|line| line
            .split_whitespace()
            .take(3)
            .eq(["watched", "watchers", "1"])
            && line.contains("1 (Kafka)")),
        "{top}"
    );
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    // Empty once its last member left, as Kafka keeps it; the broker's group keeps its
    // offsets.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let generation = loop {
        let groups = client.kafka_groups().await.unwrap();
        if groups[0].state == "Empty" {
            assert!(groups[0].members.is_empty());
            break groups[0].generation;
        }
        assert!(std::time::Instant::now() < deadline, "{groups:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let described = broker(&["describe", "watched"]);
    assert!(
        described.contains(&format!(
            "group watchers (Kafka consumer group, generation {generation}, Empty): no members"
        )),
        "{described}"
    );
}

#[tokio::test]
async fn a_group_name_is_used_by_one_protocol_at_a_time() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    client.create("shared", 1).await.unwrap();
    client.join("shared", "native-group", "m").await.unwrap();
    client.publish("shared", 0, "x").await.unwrap();
    // A Kafka consumer cannot join a group with native members.
    let output = Command::new("python3")
        .arg(CLIENTS)
        .args([
            "group",
            &kafka,
            "shared",
            "native-group",
            "1",
            "--consumers",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("INCONSISTENT_GROUP_PROTOCOL"), "{stderr}");
    // Nor can a native member join a group whose members joined through Kafka.
    let mut holder = hold(&kafka, "shared", "kafka-group");
    // Kafka's admin clients list the groups Kafka's clients use (this one, and one with
    // offsets and no members), by state too, and describe this one with its member's
    // assignment. A group with native members is not listed: Kafka's clients cannot join it.
    client
        .commit_group("shared", "offsets-only", &[(0, 1)])
        .await
        .unwrap();
    let groups = python(&["groups", &kafka, "kafka-group"]);
    assert_eq!(
        groups["listed"],
        serde_json::json!([["kafka-group", "STABLE"], ["offsets-only", "EMPTY"]]),
        "{groups}"
    );
    assert_eq!(
        groups["stable"],
        serde_json::json!([["kafka-group", "STABLE"]])
    );
    assert_eq!(groups["state"], "STABLE");
    assert_eq!(groups["members"], serde_json::json!([[["shared", 0]]]));
    assert_eq!(
        groups["python_listed"],
        serde_json::json!([["kafka-group", "Stable"], ["offsets-only", "Empty"]])
    );
    assert_eq!(groups["python_stable"], serde_json::json!(["kafka-group"]));
    assert_eq!(groups["python_state"], "Stable");
    assert_eq!(
        groups["python_members"],
        serde_json::json!([[["shared", [0]]]])
    );
    let refused = client.join("shared", "kafka-group", "native").await;
    assert!(
        matches!(&refused, Err(broker_client::Error::Broker(broker_client::BrokerError::InvalidArgument(m))) if m.contains("Kafka")),
        "{refused:?}"
    );
    // Nor is it deleted or reset while its members consume (Kafka refuses both for a group
    // whose consumers run).
    let deleted = client.delete_group("shared", "kafka-group").await;
    assert!(
        matches!(&deleted, Err(broker_client::Error::Broker(broker_client::BrokerError::InvalidArgument(m))) if m.contains("cannot be deleted")),
        "{deleted:?}"
    );
    let reset = client
        .reset_group(
            "shared",
            "kafka-group",
            None,
            broker_client::ResetTo::Earliest,
        )
        .await;
    assert!(
        matches!(&reset, Err(broker_client::Error::Broker(broker_client::BrokerError::InvalidArgument(m))) if m.contains("over the change")),
        "{reset:?}"
    );
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    // Once they left, it may.
    client
        .join("shared", "kafka-group", "native")
        .await
        .unwrap();
}

#[tokio::test]
async fn sasl_plain_takes_the_token_as_password_and_tls_uses_the_servers_certificate() {
    if !clients_installed() {
        return;
    }
    const TOKEN: &str = "kafka-listener-token";
    let pki = broker_testkit::certs::TestPki::new(&["localhost"]);
    let token_file = pki.path("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let ca = pki.ca_file.to_str().unwrap();
    // A token alone: SASL/PLAIN over plain TCP.
    let server = ServerProcess::start_with(
        &[
            "--kafka-listen",
            "127.0.0.1:0",
            "--auth-token-file",
            token_file.to_str().unwrap(),
        ],
        &[],
        Stdio::inherit(),
    );
    let kafka = server.kafka_addr.unwrap().to_string();
    let client = Client::builder()
        .auth_token(TOKEN)
        .connect(server.addr_string())
        .await
        .unwrap();
    client.create("secret", 1).await.unwrap();
    let good = python(&[
        "secure",
        &kafka,
        "secret",
        "--protocol",
        "SASL_PLAINTEXT",
        "--password",
        TOKEN,
    ]);
    assert_eq!(
        good["values"],
        serde_json::json!(["secret 0", "secret 1", "secret 2"])
    );
    let wrong = python(&[
        "secure",
        &kafka,
        "secret",
        "--protocol",
        "SASL_PLAINTEXT",
        "--password",
        "wrong",
    ]);
    assert!(
        wrong["errors"].to_string().contains("AUTHENTICATION"),
        "{wrong}"
    );
    let none = python(&["secure", &kafka, "secret", "--protocol", "PLAINTEXT"]);
    assert!(none.get("errors").is_some(), "{none}");
    assert_eq!(
        client.end_offset("secret", 0).await.unwrap(),
        3,
        "nothing stored unauthenticated"
    );
    // kcat too (Debian's, on an older librdkafka that looks for SaslHandshake version 0 in the
    // versions the listener advertises before it authenticates).
    let password = format!("sasl.password={TOKEN}");
    kcat(
        &[
            "-b",
            &kafka,
            "-X",
            "security.protocol=SASL_PLAINTEXT",
            "-X",
            "sasl.mechanism=PLAIN",
            "-X",
            "sasl.username=anyone",
            "-X",
            &password,
            "-P",
            "-t",
            "secret",
            "-p",
            "0",
        ],
        "from kcat\n",
    );
    let read = client
        .read("secret", 0, 3, 10, Duration::ZERO)
        .await
        .unwrap();
    let payloads: Vec<&[u8]> = read.records.iter().map(|r| r.payload.as_ref()).collect();
    assert_eq!(payloads, [&b"from kcat"[..]]);
    drop(server);
    // TLS with the token: SASL_SSL.
    let server = ServerProcess::start(&[
        "--kafka-listen",
        "127.0.0.1:0",
        "--auth-token-file",
        token_file.to_str().unwrap(),
        "--tls-cert",
        pki.cert_file.to_str().unwrap(),
        "--tls-key",
        pki.key_file.to_str().unwrap(),
    ]);
    let kafka = server.kafka_addr.unwrap().to_string();
    let client = Client::builder()
        .auth_token(TOKEN)
        .tls_ca_file(&pki.ca_file)
        .connect(format!("localhost:{}", server.addr.port()))
        .await
        .unwrap();
    client.create("secret", 1).await.unwrap();
    let good = python(&[
        "secure",
        &kafka,
        "secret",
        "--protocol",
        "SASL_SSL",
        "--password",
        TOKEN,
        "--ca",
        ca,
    ]);
    assert_eq!(
        good["values"],
        serde_json::json!(["secret 0", "secret 1", "secret 2"])
    );
}

#[tokio::test]
async fn an_idempotent_producer_cut_off_mid_stream_stores_every_record_once() {
    if !clients_installed() {
        return;
    }
    // Kafka's clients reach the listener only through the proxy: it is what the metadata
    // advertises.
    let proxy = broker_testkit::proxy::Proxy::start("127.0.0.1:9".parse().unwrap()).await;
    let advertised = proxy.addr.to_string();
    let server = ServerProcess::start(&[
        "--kafka-listen",
        "127.0.0.1:0",
        "--kafka-advertise",
        &advertised,
    ]);
    proxy.set_backend(server.kafka_addr.unwrap());
    let client = Client::connect(server.addr_string()).await.unwrap();
    client
        .create_topic(
            "cut",
            2,
            KeyHash::Murmur2,
            &[broker_client::TopicSetting::Retention(
                broker_client::Retention::Limits,
            )],
        )
        .await
        .unwrap();
    let producing = tokio::task::spawn_blocking({
        let advertised = advertised.clone();
        move || {
            python(&[
                "produce",
                &advertised,
                "cut",
                "2000",
                "--idempotent",
                "--pace-ms",
                "10",
            ])
        }
    });
    // While it produces: replies lost on the way back (held, then the connections cut), so
    // that batches the broker stored are sent again.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.hold_replies();
        tokio::time::sleep(Duration::from_millis(200)).await;
        proxy.cut();
        proxy.release_replies();
    }
    let report = producing.await.unwrap();
    assert_eq!(report["delivered"].as_array().unwrap().len(), 2000);
    let mut payloads = Vec::new();
    for partition in 0..2 {
        payloads.extend(
            read_all(&client, "cut", partition)
                .await
                .into_iter()
                .map(|record| text(&record.payload)),
        );
    }
    assert_eq!(payloads.len(), 2000, "every record stored once");
    payloads.sort();
    payloads.dedup();
    assert_eq!(payloads.len(), 2000, "no record stored twice");
    assert!(
        proxy.accepted() > 1,
        "the connection was cut and opened again"
    );
}

/// Found by the `kafka` fuzz target: requests whose arrays claim two billion items. The codec
/// (kafka-protocol 0.18) reserves room for the claimed count before it reads one; the server's
/// allocator reserves such room without using memory, and the request, which holds nothing of
/// it, is refused.
#[test]
fn a_request_claiming_billions_of_items_is_refused_and_the_server_keeps_serving() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/kafka-huge-array-count.bin"
    );
    // The fuzz input's first byte chose the frame limit; the rest is what the client sent.
    let input = std::fs::read(fixture).unwrap();
    let server = ServerProcess::start(&["--kafka-listen", "127.0.0.1:0"]);
    let kafka = server.kafka_addr.unwrap();
    let mut stream = TcpStream::connect(kafka).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(&input[1..]).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answers = Vec::new();
    stream.read_to_end(&mut answers).unwrap();
    // Its first request, a Metadata claiming 2^31 - 1 topics, is refused: INVALID_REQUEST.
    assert_eq!(answers[4..10], [0, 0, 0, 1, 0, 42]);
    let mut again = TcpStream::connect(kafka).unwrap();
    again
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write_request(&mut again, 18, 0, 6, &[]);
    assert_eq!(read_response(&mut again).0, 6);
}

#[tokio::test]
async fn a_fetch_of_more_than_a_frame_is_answered_in_frames_the_server_may_send() {
    if !clients_installed() {
        return;
    }
    // The smallest frame limit the server takes; eight partitions of 600 kB are more than one
    // frame, which librdkafka asks for at once.
    let server = ServerProcess::start(&[
        "--kafka-listen",
        "127.0.0.1:0",
        "--max-frame-bytes",
        "3145728",
        "--capacity",
        "10000",
    ]);
    let kafka = server.kafka_addr.unwrap().to_string();
    let client = Client::connect(server.addr_string()).await.unwrap();
    client.create("big", 8).await.unwrap();
    for batch in 0..48 {
        let records = (0..1000)
            .map(|i| {
                on(
                    (batch * 1000 + i) % 8,
                    PublishRecord::keyed(None, vec![b'x'; 100]),
                )
            })
            .collect();
        client.publish_batch("big", records).await.unwrap();
    }
    let report = python(&["consume", &kafka, "big", "8", "48000"]);
    assert_eq!(report["records"].as_array().unwrap().len(), 48000);
}

/// Every broker and each partition's leader, as `kcat -L -J` lists them from `bootstrap`.
fn kcat_metadata(bootstrap: &str) -> Value {
    serde_json::from_str(&kcat(&["-b", bootstrap, "-L", "-J"], "")).unwrap()
}

#[tokio::test]
async fn a_cluster_sends_kafka_clients_to_its_leader_and_keeps_every_record_through_a_failover() {
    if !clients_installed() {
        return;
    }
    // Partitions that hold the second run (about 100 records each) while no group reads it.
    let mut nodes = Nodes::start_with(
        3,
        None,
        &["--kafka-listen", "127.0.0.1:0", "--capacity", "1000"],
    );
    let kafka_addr = |nodes: &Nodes, index: usize| {
        nodes.running[index]
            .as_ref()
            .and_then(|node| node.kafka_addr)
            .unwrap()
            .to_string()
    };
    let leader = nodes.leader().await;
    let follower = (leader + 1) % 3;
    let client = nodes.client().await;
    client.create("replicated", 3).await.unwrap();
    // A follower lists every node (each learns the others' Kafka addresses within seconds) and
    // the leader as every partition's leader, once it has applied the topic's creation.
    let follower_kafka = kafka_addr(&nodes, follower);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let metadata = loop {
        let metadata = kcat_metadata(&follower_kafka);
        let listed = metadata["topics"]
            .as_array()
            .is_some_and(|topics| topics.iter().any(|topic| topic["topic"] == "replicated"));
        if metadata["brokers"].as_array().unwrap().len() == 3 && listed {
            break metadata;
        }
        assert!(std::time::Instant::now() < deadline, "{metadata}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let leader_id = leader as i64 + 1;
    let brokers = metadata["brokers"].as_array().unwrap();
    assert!(
        brokers.iter().any(|broker| broker["id"] == leader_id
            && broker["name"] == kafka_addr(&nodes, leader).as_str()),
        "{metadata}"
    );
    let topic = metadata["topics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|topic| topic["topic"] == "replicated")
        .unwrap();
    for partition in topic["partitions"].as_array().unwrap() {
        assert_eq!(partition["leader"], leader_id, "{metadata}");
        assert_eq!(partition["replicas"].as_array().unwrap().len(), 3);
    }
    // Produced through the follower's address alone: the client is sent to the leader.
    let report = python(&[
        "produce",
        &follower_kafka,
        "replicated",
        "100",
        "--idempotent",
    ]);
    assert_eq!(report["delivered"].as_array().unwrap().len(), 100);
    // A group consumes them and commits, through the group's coordinator on the leader.
    let everyone = (0..3)
        .map(|index| kafka_addr(&nodes, index))
        .collect::<Vec<_>>()
        .join(",");
    let report = python(&[
        "group",
        &everyone,
        "replicated",
        "failover",
        "100",
        "--consumers",
        "1",
    ]);
    assert_eq!(group_records(&report).len(), 100);
    // A native client connected to a follower (the first node it is given) lists the groups
    // of Kafka's clients: the follower sends it to the leader, which coordinates them.
    client.create("held", 1).await.unwrap();
    let mut holder = hold(&everyone, "held", "holders");
    let via_follower = Client::connect(format!(
        "{},{}",
        nodes.client_addrs[follower], nodes.client_addrs[leader]
    ))
    .await
    .unwrap();
    // (The group that consumed before, whose members left, is listed empty.)
    let groups = via_follower.kafka_groups().await.unwrap();
    let listed: Vec<_> = groups
        .iter()
        .map(|group| {
            let topics: Vec<&str> = group
                .members
                .iter()
                .flat_map(|member| &member.assignment)
                .map(|assigned| assigned.topic.as_str())
                .collect();
            (group.name.as_str(), group.state.as_str(), topics)
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("failover", "Empty", vec![]),
            ("holders", "Stable", vec!["held"])
        ]
    );
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    // The leader is killed while an idempotent producer sends: every record is stored once.
    let producer = {
        let everyone = everyone.clone();
        std::thread::spawn(move || {
            python(&[
                "produce",
                &everyone,
                "replicated",
                "300",
                "--idempotent",
                "--pace-ms",
                "50",
            ])
        })
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    nodes.kill(leader);
    let report = producer.join().unwrap();
    assert_eq!(report["delivered"].as_array().unwrap().len(), 300);
    let new_leader = nodes.leader().await;
    assert_ne!(new_leader, leader);
    // The survivors stop listing the node that is down, as Kafka lists the brokers that are
    // up: clients that ask every broker (admin tools) do not wait on it. The new leader and
    // the follower alike (which exchanges no entries with the node that is down).
    for survivor in (0..3).filter(|index| *index != leader) {
        let survivor_kafka = kafka_addr(&nodes, survivor);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let metadata = kcat_metadata(&survivor_kafka);
            let brokers = metadata["brokers"].as_array().unwrap();
            if brokers.len() == 2 {
                assert!(
                    brokers.iter().all(|broker| broker["id"] != leader_id),
                    "{metadata}"
                );
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {survivor}: {metadata}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let client = nodes.client().await;
    // The first run's records, read by the only group, are no longer retained; the second
    // run's, keyed from key-0 on, each are once.
    let mut stored = std::collections::BTreeMap::new();
    for partition in 0..3 {
        for record in read_all(&client, "replicated", partition).await {
            *stored.entry(text(&record.key.unwrap())).or_insert(0) += 1;
        }
    }
    let expected: std::collections::BTreeMap<String, i32> =
        (0..300).map(|i| (format!("key-{i}"), 1)).collect();
    assert_eq!(stored, expected, "every record once");
    // The group resumes on the new leader from what it committed on the old one.
    let survivors = (0..3)
        .filter(|index| *index != leader)
        .map(|index| kafka_addr(&nodes, index))
        .collect::<Vec<_>>()
        .join(",");
    let report = python(&[
        "group",
        &survivors,
        "replicated",
        "failover",
        "300",
        "--consumers",
        "1",
    ]);
    let records = group_records(&report);
    assert_eq!(records.len(), 300);
    let lag = client.lag("replicated", "failover").await.unwrap();
    assert!(lag.iter().all(|row| row.lag == 0), "{lag:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_several_groups_sends_kafka_clients_to_each_topics_leader() {
    kafka_clients_follow_each_topics_group(3, 9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_clients_reach_every_topic_through_nodes_holding_no_copy_of_its_group() {
    // Four nodes, four groups of three replicas: each node lacks a copy of one group.
    kafka_clients_follow_each_topics_group(4, 3).await;
}

/// A cluster of `count` nodes and as many groups, each past the first with `replicas` voters
/// (every node when there are fewer): a topic in each group, listed by any node with its
/// group's leader and replicas, produced to through one node's address and read by one Kafka
/// group committing through its coordinator.
async fn kafka_clients_follow_each_topics_group(count: usize, replicas: usize) {
    if !clients_installed() {
        return;
    }
    let groups = count.to_string();
    let replicas_flag = replicas.to_string();
    let nodes = Nodes::start_with(
        count,
        None,
        &[
            "--kafka-listen",
            "127.0.0.1:0",
            "--cluster-data-groups",
            &groups,
            "--cluster-replicas",
            &replicas_flag,
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let leaders = nodes.spread(count, Duration::from_secs(60));
    let client = nodes.client().await;
    let topics = &["apples", "bananas", "cherries", "dates"][..count];
    for topic in topics {
        assert!(client.create(topic, 2).await.unwrap(), "{topic} created");
    }
    // Each topic's group's leader, by the metrics of a node holding a copy of every group
    // that has a topic (a topic's shard is its group less one).
    let placed: BTreeMap<String, i64> = (0..count)
        .flat_map(|index| nodes.samples(index, "topic_shard"))
        .collect();
    let expected: BTreeMap<&str, i64> = topics
        .iter()
        .map(|topic| (*topic, leaders[&(placed[*topic] + 1).to_string()]))
        .collect();
    let distinct: std::collections::BTreeSet<&i64> = expected.values().collect();
    assert_eq!(
        distinct.len(),
        count,
        "a topic in each group, each with its own leader: {expected:?}"
    );
    // How many nodes hold a copy of each topic: every node for the first group's.
    let copies: BTreeMap<&str, usize> = topics
        .iter()
        .map(|topic| match placed[*topic] {
            0 => (*topic, count),
            _ => (*topic, replicas.min(count)),
        })
        .collect();
    let kafka_addr = |index: usize| {
        nodes.running[index]
            .as_ref()
            .and_then(|node| node.kafka_addr)
            .unwrap()
            .to_string()
    };
    // Any node lists each topic's partitions with its group's leader and replicas, once it
    // applied them.
    for index in 0..count {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let metadata = kcat_metadata(&kafka_addr(index));
            let listed: BTreeMap<&str, Vec<(i64, usize)>> = metadata["topics"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|topic| {
                    let partitions = topic["partitions"].as_array()?.iter();
                    let partitions = partitions.filter_map(|partition| {
                        let replicas = partition["replicas"].as_array()?.len();
                        Some((partition["leader"].as_i64()?, replicas))
                    });
                    Some((topic["topic"].as_str()?, partitions.collect()))
                })
                .collect();
            let as_expected = expected.iter().all(|(topic, leader)| {
                let partition = (*leader, copies[topic]);
                listed.get(topic) == Some(&vec![partition, partition])
            });
            if as_expected && metadata["brokers"].as_array().unwrap().len() == count {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {}: {metadata}",
                index + 1
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let first = kafka_addr(0);
    // Produced through one node's address: each topic's records go to its own leader.
    for topic in topics {
        let report = python(&["produce", &first, topic, "100", "--idempotent"]);
        assert_eq!(
            report["delivered"].as_array().unwrap().len(),
            100,
            "{topic}"
        );
    }
    // One group reads the three topics, committing each record through its coordinator (the
    // first group's leader), which sends each commit to its topic's group.
    let everyone = (0..count).map(kafka_addr).collect::<Vec<_>>().join(",");
    let total = (100 * count).to_string();
    let report = python(&[
        "group",
        &everyone,
        &topics.join(","),
        "fruit",
        &total,
        "--consumers",
        "1",
    ]);
    let mut read: BTreeMap<String, usize> = BTreeMap::new();
    for record in report["records"].as_array().unwrap() {
        *read
            .entry(record["topic"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let hundred_each: BTreeMap<String, usize> = topics
        .iter()
        .map(|topic| ((*topic).to_owned(), 100))
        .collect();
    assert_eq!(read, hundred_each);
    // The commits are with each topic, where the native client sees them.
    for topic in topics {
        let lag = client.lag(topic, "fruit").await.unwrap();
        let committed: Vec<i64> = lag.iter().map(|row| row.committed).collect();
        let ends: Vec<i64> = lag.iter().map(|row| row.end_offset).collect();
        assert_eq!(committed, ends, "{topic}: {lag:?}");
        assert_eq!(ends.iter().sum::<i64>(), 100, "{topic}: {lag:?}");
    }
}

/// The value of `series` in the metrics text, or 0 when it is not there.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |value| value.parse().unwrap())
}

#[tokio::test]
async fn kafka_connections_bytes_requests_and_errors_are_counted_by_listener() {
    if !clients_installed() {
        return;
    }
    let server = ServerProcess::start(&[
        "--kafka-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let kafka = server.kafka_addr.unwrap().to_string();
    let client = Client::connect(server.addr_string()).await.unwrap();
    client.create("counted", 1).await.unwrap();
    let input: String = (0..100).map(|i| format!("record-{i}\n")).collect();
    kcat(&["-b", &kafka, "-P", "-t", "counted", "-p", "0"], &input);
    kcat(
        &[
            "-b", &kafka, "-C", "-t", "counted", "-p", "0", "-c", "100", "-e",
        ],
        "",
    );
    let (_, _, text) = broker_testkit::http::get(server.metrics_addr.unwrap(), "/metrics", "");
    assert!(
        metric(&text, "broker_received_bytes_total{listener=\"kafka\"}") > 1_000.0,
        "{text}"
    );
    assert!(metric(&text, "broker_sent_bytes_total{listener=\"kafka\"}") > 1_000.0);
    assert!(metric(&text, "broker_connections_total{listener=\"kafka\"}") >= 2.0);
    assert_eq!(
        metric(&text, "broker_connections_total{listener=\"broker\"}"),
        1.0
    );
    assert!(metric(&text, "broker_kafka_requests_total{api=\"produce\"}") >= 1.0);
    assert!(metric(&text, "broker_kafka_requests_total{api=\"fetch\"}") >= 1.0);
    assert!(metric(&text, "broker_kafka_requests_total{api=\"metadata\"}") >= 2.0);
    // A raw ListOffsets of a partition the topic does not have: UNKNOWN_TOPIC_OR_PARTITION.
    let mut stream = TcpStream::connect(&kafka).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // ListOffsets v1: replica -1, one topic "counted", partition 7, timestamp -1.
    let mut body = Vec::new();
    body.extend_from_slice(&(-1_i32).to_be_bytes());
    body.extend_from_slice(&1_i32.to_be_bytes());
    body.extend_from_slice(&7_i16.to_be_bytes());
    body.extend_from_slice(b"counted");
    body.extend_from_slice(&1_i32.to_be_bytes());
    body.extend_from_slice(&7_i32.to_be_bytes());
    body.extend_from_slice(&(-1_i64).to_be_bytes());
    write_request(&mut stream, 2, 1, 9, &body);
    assert_eq!(read_response(&mut stream).0, 9);
    let (_, _, text) = broker_testkit::http::get(server.metrics_addr.unwrap(), "/metrics", "");
    assert_eq!(
        metric(
            &text,
            "broker_kafka_errors_total{api=\"list_offsets\",error=\"unknown_topic_or_partition\"}"
        ),
        1.0,
        "{text}"
    );
}

#[tokio::test]
async fn the_admin_client_grows_topics_describes_the_cluster_and_deletes_groups_and_offsets() {
    if !clients_installed() {
        return;
    }
    let (_server, kafka, client) = server().await;
    // Limits retention: the record stays whatever the groups consume.
    client
        .create_topic(
            "grown",
            2,
            broker_client::KeyHash::default(),
            &[TopicSetting::Retention(Retention::Limits)],
        )
        .await
        .unwrap();
    client.publish("grown", 1, "hello").await.unwrap();
    client
        .commit_group("grown", "finished", &[(0, 0)])
        .await
        .unwrap();
    client.join("grown", "busy", "m").await.unwrap();
    client
        .commit_group("grown", "partial", &[(1, 1)])
        .await
        .unwrap();
    let report = python(&[
        "admin",
        &kafka,
        "grown",
        "--grow",
        "4",
        "3",
        "--delete-groups",
        "finished",
        "busy",
        "never",
        "--delete-offsets",
        "partial:1",
        "busy:0",
        "never:0",
    ]);
    assert_eq!(report["grown"]["4"], Value::Null, "{report}");
    assert_eq!(report["grown"]["3"], "INVALID_PARTITIONS", "{report}");
    assert_eq!(report["partitions"], 4, "{report}");
    assert_eq!(report["cluster_id"], "broker-server", "{report}");
    assert_eq!(report["controller"], 0, "{report}");
    assert_eq!(report["nodes"], serde_json::json!([kafka]), "{report}");
    assert_eq!(report["deleted"]["finished"], Value::Null, "{report}");
    assert_eq!(report["deleted"]["busy"], "NON_EMPTY_GROUP", "{report}");
    assert_eq!(report["deleted"]["never"], "GROUP_ID_NOT_FOUND", "{report}");
    // OffsetDelete: the partition goes back to where an uncommitted one starts; a group with
    // members keeps its offsets; a group that committed nothing is not found.
    assert_eq!(
        report["offsets_deleted"]["partial"]["1"],
        Value::Null,
        "{report}"
    );
    assert_eq!(
        report["offsets_deleted"]["busy"]["0"], "GroupSubscribedToTopicError",
        "{report}"
    );
    assert_eq!(
        report["offsets_deleted"]["never"], "GroupIdNotFoundError",
        "{report}"
    );
    // kafka-python's DescribeLogDirs: the one directory, each partition with its bytes.
    let log_dir = &report["log_dirs"][0]["log_dirs"][0];
    assert_eq!(log_dir["log_dir"], "(memory: no --data-dir)", "{report}");
    let sizes: Vec<(i64, i64)> = log_dir["topics"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["partition_index"].as_i64().unwrap(),
                p["partition_size"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(sizes, [(0, 0), (1, 5), (2, 0), (3, 0)], "{report}");
    let described = client.describe_topic("grown").await.unwrap();
    assert_eq!(described.partitions.len(), 4);
    let groups: Vec<&str> = described
        .groups
        .iter()
        .map(|group| group.name.as_str())
        .collect();
    assert_eq!(groups, ["busy", "partial"]);
    let partial = &described.groups[1];
    assert_eq!(partial.partitions[1].committed, 0, "{partial:?}");
}

#[test]
fn kcat_produces_to_a_topic_it_names_when_the_server_creates_topics() {
    if !clients_installed() {
        return;
    }
    let server = ServerProcess::start(&[
        "--kafka-listen",
        "127.0.0.1:0",
        "--kafka-auto-create-topics",
        "--kafka-auto-create-partitions",
        "2",
    ]);
    let kafka = server.kafka_addr.unwrap().to_string();
    kcat(
        &["-b", &kafka, "-P", "-t", "brandnew", "-p", "1"],
        "first\n",
    );
    let consumed = kcat(
        &[
            "-b", &kafka, "-C", "-t", "brandnew", "-p", "1", "-c", "1", "-e", "-f", "%s\n",
        ],
        "",
    );
    assert_eq!(consumed, "first\n");
    let metadata = kcat_metadata(&kafka);
    let topic = metadata["topics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|topic| topic["topic"] == "brandnew")
        .unwrap();
    assert_eq!(topic["partitions"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn kafkas_dotted_names_are_taken_on_every_listener_where_the_server_takes_them() {
    if !clients_installed() {
        return;
    }
    // By default a dotted name is refused, saying where such names are taken.
    let (_plain, plain_kafka, plain) = server().await;
    let refused = plain.create("orders.v1", 1).await.unwrap_err().to_string();
    assert!(refused.contains("Kafka's names"), "{refused}");
    let created = python(&["create", &plain_kafka, "orders.v1", "1"]);
    let error = created["errors"]["orders.v1"].as_str().unwrap();
    assert!(
        error.contains("TOPIC_EXCEPTION") && error.contains("Kafka's names"),
        "{created}"
    );

    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let flags = [
        "--kafka-listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir,
        "--names",
        "kafka",
    ];
    let mut server = ServerProcess::start(&flags);
    let kafka = server.kafka_addr.unwrap().to_string();
    let client = Client::connect(server.addr_string()).await.unwrap();
    // Kafka's admin client creates one; the native client another, as long as Kafka allows.
    let created = python(&["create", &kafka, "orders.v1", "2"]);
    assert_eq!(created["errors"], serde_json::json!({}));
    let long = format!("{}.end", "x".repeat(245));
    assert!(client.create(&long, 1).await.unwrap());
    kcat(
        &["-b", &kafka, "-P", "-t", "orders.v1", "-p", "0"],
        "first\nsecond\n",
    );
    assert_eq!(payloads(&client, "orders.v1").await, ["first", "second"]);
    // A group with a dotted name consumes through Kafka's group protocol and commits.
    let grouped = python(&["python-group", &kafka, "orders.v1", "billing.eu", "2"]);
    assert_eq!(grouped["records"].as_array().unwrap().len(), 2);
    let lag = client.lag("orders.v1", "billing.eu").await.unwrap();
    assert_eq!(lag[0].committed, 2, "{lag:?}");
    client.publish(&long, 0, "native").await.unwrap();

    // The names and what they hold survive a restart with the same rules.
    assert!(server.terminate(Duration::from_secs(10)).success());
    let mut server = ServerProcess::start(&flags);
    let client = Client::connect(server.addr_string()).await.unwrap();
    assert_eq!(payloads(&client, "orders.v1").await, ["first", "second"]);
    assert_eq!(payloads(&client, &long).await, ["native"]);
    let lag = client.lag("orders.v1", "billing.eu").await.unwrap();
    assert_eq!(lag[0].committed, 2, "{lag:?}");
    // A group whose dead-letter topic has a Kafka name, then a kill: the next start replays
    // these changes from the log.
    let dead_letter = TopicName::with_rules("orders.v1.dlq", NameRules::Kafka).unwrap();
    let settings = [
        GroupSetting::MaxDeliveries(2),
        GroupSetting::DeadLetter(dead_letter),
    ];
    client
        .join_group("orders.v1", "audit.eu", "a", None, &settings)
        .await
        .unwrap();
    client.publish("orders.v1", 0, "third").await.unwrap();
    server.kill();

    // Started with the broker's own rules, the server replays and keeps them (twice: the
    // second start reads them from the checkpoint the first wrote), but refuses calls naming
    // them.
    for _ in 0..2 {
        let narrower = ServerProcess::start(&flags[..4]);
        let client = Client::connect(narrower.addr_string()).await.unwrap();
        let described = client.describe().await.unwrap();
        let names: Vec<&str> = described.topics.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["orders.v1", long.as_str()]);
        assert_eq!(described.topics[0].partitions[0].end_offset, 3);
        let audit = described.topics[0]
            .groups
            .iter()
            .find(|g| g.name == "audit.eu");
        assert!(
            audit.is_some_and(|group| group.settings.contains(&settings[1])),
            "{:?}",
            described.topics[0].groups
        );
        let refused = client.publish("orders.v1", 0, "x").await.unwrap_err();
        assert!(refused.to_string().contains("Kafka's names"), "{refused}");
        // Kafka's clients are not told of a topic they could not use.
        let kafka = narrower.kafka_addr.unwrap().to_string();
        let listed = kcat_metadata(&kafka)["topics"].to_string();
        assert!(!listed.contains("orders.v1"), "{listed}");
    }
}

/// An idempotent Kafka producer (librdkafka) keeps producing to a topic while `broker cluster
/// move` moves it to another group: every record it was told was delivered is there once, at
/// the offset it was told, and a Kafka consumer group reads them all from the new group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_kafka_producer_follows_a_topic_moving_to_another_group() {
    if !clients_installed() {
        return;
    }
    let nodes = Nodes::start_with(
        3,
        None,
        &[
            "--kafka-listen",
            "127.0.0.1:0",
            "--cluster-data-groups",
            "3",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    nodes.spread(3, Duration::from_secs(60));
    let client = nodes.client().await;
    let limits = [TopicSetting::Retention(Retention::Limits)];
    let created = client
        .create_topic("moving", 2, KeyHash::default(), &limits)
        .await
        .unwrap();
    assert!(created);
    // Once node 1 has applied the create (its group's leader may be another node).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let from = loop {
        if let Some(shard) = nodes.samples(0, "topic_shard").get("moving") {
            break shard + 1;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node 1 never placed it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let to = u32::try_from(from % 3 + 1).unwrap();
    let everyone: Vec<String> = (0..3)
        .map(|index| {
            let node = nodes.running[index].as_ref().unwrap();
            node.kafka_addr.unwrap().to_string()
        })
        .collect();
    let bootstrap = everyone.join(",");
    // 1,000 records over about two seconds (a pause every 10), the move in the middle.
    let producing = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || {
            python(&[
                "produce",
                &bootstrap,
                "moving",
                "1000",
                "--idempotent",
                "--pace-ms",
                "20",
            ])
        }
    });
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let placed = client.move_topic("moving", to).await.unwrap();
    assert!(placed.topics[0].leader.is_some(), "{placed:?}");
    assert!(
        !producing.is_finished(),
        "the producer ran through the move"
    );
    let report = producing.await.unwrap();
    let delivered = report["delivered"].as_array().unwrap();
    assert_eq!(delivered.len(), 1_000);
    // Each delivery report's offset holds its record, and nothing else is there.
    let mut ends = [0_i64; 2];
    for record in delivered {
        let partition = usize::try_from(record["partition"].as_i64().unwrap()).unwrap();
        ends[partition] = ends[partition].max(record["offset"].as_i64().unwrap() + 1);
    }
    for (partition, end) in ends.iter().enumerate() {
        let partition = i32::try_from(partition).unwrap();
        assert_eq!(client.end_offset("moving", partition).await.unwrap(), *end);
    }
    assert_eq!(ends.iter().sum::<i64>(), 1_000, "no record stored twice");
    let report = python(&[
        "group",
        &bootstrap,
        "moving",
        "after-the-move",
        "1000",
        "--consumers",
        "1",
    ]);
    assert_eq!(group_records(&report).len(), 1_000);
    let lag = client.lag("moving", "after-the-move").await.unwrap();
    assert!(lag.iter().all(|row| row.lag == 0), "{lag:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while nodes.samples(1, "topic_shard").get("moving") != Some(&(i64::from(to) - 1)) {
        assert!(
            std::time::Instant::now() < deadline,
            "node 2 never placed it in group {to}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
