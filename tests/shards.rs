//! A single broker of several shards (`--shards`), end to end through the real binary and
//! client: topics spread over the shards' directories, every call about a topic keeps its
//! meaning, a crash loses nothing of any shard, a directory reopens with its shards (and is
//! never started with fewer), and a group's dead-letter topic stays with its topic.
//!
//! The rest of the end-to-end suites run against shards too: `BROKER_SHARDS=3 cargo test
//! -p broker-server --test e2e_client ...` (see `.ci/run`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use broker_client::{Client, GroupSetting, TopicName};
use broker_testkit::files::every_file;
use broker_testkit::http::get as http_get;
use broker_testkit::process::{refused_start, ServerProcess};

const PATIENCE: Duration = Duration::from_secs(20);

async fn connect(server: &ServerProcess) -> Client {
    Client::connect(server.addr_string())
        .await
        .expect("connect to broker-server")
}

/// A server on the data directory `data`, with `extra` flags.
fn start(data: &Path, extra: &[&str]) -> ServerProcess {
    let mut flags = vec!["--data-dir", data.to_str().unwrap()];
    flags.extend_from_slice(extra);
    ServerProcess::start(&flags)
}

/// Starts a server on the data directory `data` with `flags`, which must be refused saying
/// `why` and change no file; the refusal's standard error.
fn refused_unchanged(data: &Path, flags: &[&str], why: &str) -> String {
    let before = every_file(data);
    let mut args = vec!["--data-dir", data.to_str().unwrap()];
    args.extend_from_slice(flags);
    let refusal = refused_start(&args, PATIENCE);
    assert!(!refusal.status.success(), "{}", refusal.stderr);
    assert!(refusal.stderr.contains(why), "{}", refusal.stderr);
    assert_eq!(every_file(data), before, "a refused start changed files");
    refusal.stderr
}

/// The partitions with records on disk in each shard's directory: the record segment
/// directories of `records/` (a start's checkpoint moves every record there).
fn partitions_on_disk(data: &Path, shards: usize) -> Vec<usize> {
    (0..shards)
        .map(|shard| {
            let dir = match shard {
                0 => data.to_owned(),
                _ => data.join("shards").join(shard.to_string()),
            };
            std::fs::read_dir(dir.join("records"))
                .map(|entries| entries.count())
                .unwrap_or(0)
        })
        .collect()
}

/// Every record of `topic` a new group reads from the start, as (partition, offset, payload).
async fn read_all(client: &Client, topic: &str) -> Vec<(i32, i64, String)> {
    client.join(topic, "reader", "r").await.unwrap();
    let mut read = Vec::new();
    loop {
        let records = client.fetch(topic, "reader", "r", 1000).await.unwrap();
        if records.is_empty() {
            break;
        }
        read.extend(records.into_iter().map(|record| {
            let payload = String::from_utf8(record.payload.to_vec()).unwrap();
            (record.partition, record.offset, payload)
        }));
    }
    client.leave(topic, "reader", "r").await.unwrap();
    read
}

/// Three topics of one partition go to three shards, each with its own files; the calls about
/// each keep their meaning; after a kill -9 the directory reopens (without `--shards`: as many
/// as it holds) with every acknowledged record, offset and group of every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_spread_over_shards_and_come_back_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), &["--shards", "3", "--fsync", "always"]);
    let client = connect(&server).await;
    let topics = ["orders", "payments", "audit"];
    for topic in topics {
        assert!(client.create(topic, 1).await.unwrap());
        for n in 0..20 {
            let offset = client
                .publish(topic, 0, format!("{topic} {n}"))
                .await
                .unwrap();
            assert_eq!(offset, n);
        }
        client.join(topic, "workers", "w1").await.unwrap();
        let polled = client.poll(topic, "workers", "w1", 5).await.unwrap();
        assert_eq!(polled.len(), 1, "one record in flight per partition");
        assert!(client
            .ack(topic, "workers", "w1", 0, polled[0].offset)
            .await
            .unwrap());
        // A new group starts at the oldest record retained: the one acknowledged left.
        client.join(topic, "audit-log", "a1").await.unwrap();
        let fetched = client.fetch(topic, "audit-log", "a1", 7).await.unwrap();
        assert_eq!(fetched.first().map(|record| record.offset), Some(1));
        assert_eq!(fetched.len(), 7);
        client.commit(topic, "audit-log", "a1", None).await.unwrap();
    }
    let described = client.describe().await.unwrap();
    let names: Vec<_> = described.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["audit", "orders", "payments"], "gathered, sorted");
    drop(client);
    server.kill();

    // Reopened without --shards: the directory's three.
    let mut server = start(dir.path(), &[]);
    let client = connect(&server).await;
    assert_eq!(client.describe().await.unwrap(), described);
    for topic in topics {
        assert_eq!(client.committed(topic, "audit-log", 0).await.unwrap(), 8);
        let next = client.fetch(topic, "audit-log", "a1", 1).await.unwrap();
        assert_eq!(next[0].offset, 8, "{topic}");
        let records = read_all(&client, topic).await;
        let expected: Vec<_> = (0..20)
            .map(|n| (0, n, format!("{topic} {n}")))
            .filter(|(_, n, _)| *n >= 1) // the acknowledged record left (interest retention)
            .collect();
        assert_eq!(records, expected, "{topic}");
    }
    drop(client);
    server.terminate(PATIENCE);
    // The start's checkpoint put each topic's records in its own shard's segment files.
    assert_eq!(partitions_on_disk(dir.path(), 3), [1, 1, 1]);
}

/// A directory of three shards is refused with fewer (its topics would be lost), and the
/// refusal changes no file; with more, the new shards start empty and take new topics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_never_starts_with_fewer_shards_than_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), &["--shards", "3"]);
    let client = connect(&server).await;
    for topic in ["a", "b", "c"] {
        client.create(topic, 1).await.unwrap();
        client.publish(topic, 0, topic.to_owned()).await.unwrap();
    }
    drop(client);
    server.terminate(PATIENCE);
    let refused = refused_unchanged(
        dir.path(),
        &["--shards", "2"],
        "holds topics in 3 shards, more than --shards 2",
    );
    assert!(refused.contains("--shards 3 or more"), "{refused}");

    let mut server = start(dir.path(), &["--shards", "4"]);
    let client = connect(&server).await;
    // The new shard holds no partition: the next topic goes there.
    client.create("d", 1).await.unwrap();
    client.publish("d", 0, "d".to_owned()).await.unwrap();
    for topic in ["a", "b", "c", "d"] {
        let records = read_all(&client, topic).await;
        assert_eq!(records, [(0, 0, topic.to_owned())]);
    }
    drop(client);
    server.terminate(PATIENCE);
    let server = start(dir.path(), &[]);
    drop(server);
    assert_eq!(partitions_on_disk(dir.path(), 4), [1, 1, 1, 1]);
}

/// A group's dead-letter topic is held by its topic's shard: one named after the topic goes
/// there when created, one that does not exist yet is created there by the first record that
/// moves, and naming one that another shard holds is refused with the way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_topic_is_held_with_its_groups_topic() {
    let server = ServerProcess::start(&["--shards", "2"]);
    let client = connect(&server).await;
    client.create("jobs", 1).await.unwrap();
    client.create("elsewhere", 1).await.unwrap();
    client.create("jobs-dlq", 1).await.unwrap();
    let dead_letter = |topic: &str| {
        vec![
            GroupSetting::MaxDeliveries(1),
            GroupSetting::DeadLetter(TopicName::new(topic).unwrap()),
        ]
    };
    // "elsewhere" went to the other shard.
    let refused = client
        .join_group("jobs", "workers", "w1", None, &dead_letter("elsewhere"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("must be in its topic's shard"),
        "{refused}"
    );
    assert!(refused.contains("\"jobs-dlq\""), "{refused}");
    assert!(client
        .describe_topic("jobs")
        .await
        .unwrap()
        .groups
        .is_empty());

    for (group, dead_letters) in [("workers", "jobs-dlq"), ("others", "jobs-failed")] {
        client
            .join_group("jobs", group, "w1", None, &dead_letter(dead_letters))
            .await
            .unwrap();
    }
    let offset = client.publish("jobs", 0, "bad".to_owned()).await.unwrap();
    for (group, dead_letters) in [("workers", "jobs-dlq"), ("others", "jobs-failed")] {
        let polled = client.poll("jobs", group, "w1", 1).await.unwrap();
        assert_eq!(polled[0].offset, offset);
        // Its one delivery is used up: the retry moves it to the dead-letter topic.
        assert!(client.retry("jobs", group, "w1", 0, offset).await.unwrap());
        let moved = read_all(&client, dead_letters).await;
        assert_eq!(moved.len(), 1, "{dead_letters}");
        assert_eq!(moved[0].2, "bad");
    }
    // The topic the broker created is where the placement says: a create of it answers that
    // it exists.
    assert!(!client.create("jobs-failed", 1).await.unwrap());
}

/// Topics created and deleted on one connection while another pipelines publishes to a topic
/// of another shard: placing a topic never waits for a shard's lock while routing waits for
/// the placement (a server that did would stop answering altogether).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_topics_while_another_shard_is_busy_never_stalls() {
    let server = ServerProcess::start(&["--shards", "2", "--capacity", "100000"]);
    let publisher = connect(&server).await;
    let admin = connect(&server).await;
    publisher.create("busy", 4).await.unwrap();
    let publishing = async {
        for round in 0..200 {
            let sends = (0..32).map(|n| publisher.publish("busy", n % 4, format!("{round}/{n}")));
            for sent in futures::future::join_all(sends).await {
                sent.unwrap();
            }
        }
    };
    let placing = async {
        for round in 0..200 {
            let topic = format!("busy-{round}");
            assert!(admin.create(&topic, 1).await.unwrap());
            assert!(admin.delete_topic(&topic).await.unwrap());
        }
    };
    tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(publishing, placing)
    })
    .await
    .expect("the server stopped answering");
    let published: i64 = publisher
        .describe_topic("busy")
        .await
        .unwrap()
        .partitions
        .iter()
        .map(|partition| partition.end_offset)
        .sum();
    assert_eq!(published, 200 * 32);
}

/// A directory whose shards both hold a topic of the same name (a shard's files copied into
/// another) is refused before anything is written, and before a new shard is added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_holding_the_same_topic_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), &["--shards", "2"]);
    let client = connect(&server).await;
    client.create("a", 1).await.unwrap();
    client.publish("a", 0, "x".to_owned()).await.unwrap();
    drop(client);
    server.terminate(PATIENCE);
    let copy = dir.path().join("shards/1");
    std::fs::remove_dir_all(&copy).unwrap();
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() && path.file_name().is_some_and(|name| name != "LOCK") {
            std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
        }
    }
    refused_unchanged(
        dir.path(),
        &["--shards", "3"],
        "shards 0 and 1 both hold a topic named \"a\"",
    );
    assert!(!dir.path().join("shards/2").exists(), "a shard was added");
}

/// The metrics endpoint covers the topics of every shard, and says which shard holds each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_cover_every_shard_and_name_each_topics_shard() {
    let server = ServerProcess::start(&["--shards", "2", "--metrics-listen", "127.0.0.1:0"]);
    let client = connect(&server).await;
    for topic in ["a", "b"] {
        client.create(topic, 1).await.unwrap();
        client.publish(topic, 0, topic.to_owned()).await.unwrap();
    }
    let (_, _, text) = http_get(server.metrics_addr.unwrap(), "/metrics", "");
    for line in [
        "broker_topic_shard{topic=\"a\"} 0",
        "broker_topic_shard{topic=\"b\"} 1",
        "broker_partition_end_offset{topic=\"a\",partition=\"0\"} 1",
        "broker_partition_end_offset{topic=\"b\",partition=\"0\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from:\n{text}"
        );
    }
}

/// A shard whose storage failed (a damaged record read) refuses the calls about its topics
/// until the restart, and only those: the other shards' topics stay listed and served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shard_leaves_the_others_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), &["--shards", "2"]);
    let client = connect(&server).await;
    for topic in ["x", "y"] {
        client.create(topic, 1).await.unwrap();
        for n in 0..10 {
            client
                .publish(topic, 0, format!("{topic} {n}"))
                .await
                .unwrap();
        }
    }
    drop(client);
    server.terminate(PATIENCE);
    // The start's checkpoint put the records in segment files; damage y's (shard 1).
    let mut server = start(dir.path(), &[]);
    let records = dir.path().join("shards/1/records");
    let segment = std::fs::read_dir(&records)
        .unwrap()
        .flat_map(|log| std::fs::read_dir(log.unwrap().path()).unwrap())
        .map(|file| file.unwrap().path())
        .find(|path| path.extension().is_some_and(|ext| ext == "rec"))
        .expect("y's record segment");
    let mut bytes = std::fs::read(&segment).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0xff;
    std::fs::write(&segment, bytes).unwrap();
    let client = connect(&server).await;
    client.join("y", "g", "m").await.unwrap();
    let failed = client
        .fetch("y", "g", "m", 100)
        .await
        .unwrap_err()
        .to_string();
    assert!(failed.contains("corrupt"), "{failed}");
    assert!(client.end_offset("y", 0).await.is_err(), "shard 1 refuses");
    // Shard 0 serves on, and a listing of every topic has its topics.
    let described = client.describe().await.unwrap();
    let names: Vec<_> = described.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["x"]);
    let metadata = client.metadata(None).await.unwrap();
    let placed: Vec<_> = metadata.topics.iter().map(|t| t.topic.as_str()).collect();
    assert_eq!(placed, ["x"], "metadata lists what the serving shards hold");
    assert_eq!(client.describe_topic("x").await.unwrap().name, "x");
    assert_eq!(client.publish("x", 0, "more".to_owned()).await.unwrap(), 10);
    drop(client);
    server.terminate(PATIENCE);
}
