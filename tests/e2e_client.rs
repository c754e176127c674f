//! The whole contract through `broker_client::Client` against the real `broker-server` binary:
//! the contract's worked examples and validation rules, the Kafka-style scenarios,
//! concurrency (tasks sharing a client, many clients, thousands of pipelined requests),
//! long-poll wake-ups, consumer liveness (session timeout, leave on disconnect) and graceful
//! shutdown on SIGTERM.
//!
//! Nothing here sleeps to wait for readiness or ordering: the harness reads the server's
//! `listening on` line, a parked waiting call is proved parked by the answer to a later request
//! on the same connection, and the only timed waits are loops bounded by a deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker_client::{
    Assignor, BrokerDescription, BrokerError, BrokerRecord, Client, Error, ErrorReply, KeyHash,
    PartitionLag, PublishRecord,
};
use broker_testkit::process::ServerProcess;
use broker_testkit::records::record;
use bytes::Bytes;

/// How long a test waits for something that should happen at once before it fails.
const PATIENCE: Duration = Duration::from_secs(5);

/// The `(partition, offset)` of each record, in the order given.
fn positions(records: &[BrokerRecord]) -> Vec<(i32, i64)> {
    records.iter().map(|r| (r.partition, r.offset)).collect()
}

async fn connect(server: &ServerProcess) -> Client {
    Client::connect(server.addr_string())
        .await
        .expect("connect to broker-server")
}

/// Asserts that `result` is the network form of the core's invalid-argument error.
#[track_caller]
fn assert_invalid<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) {
    match result {
        Err(Error::Broker(BrokerError::InvalidArgument(message))) => {
            assert!(!message.is_empty(), "{what}: empty message");
        }
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

/// Calls `assignment` until it returns `expected` or `PATIENCE` runs out; returns how long it
/// took. Each call also keeps `member` alive on the server.
async fn wait_for_assignment(
    client: &Client,
    (topic, group, member): (&str, &str, &str),
    expected: &[i32],
) -> Duration {
    let start = Instant::now();
    loop {
        let now = client.assignment(topic, group, member).await.unwrap();
        if now == expected {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < PATIENCE,
            "{member} still owns {now:?} after {PATIENCE:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The core contract

#[tokio::test]
async fn capacity_2_worked_example() {
    let server = ServerProcess::start(&["--capacity", "2"]);
    let client = connect(&server).await;
    assert!(client.create("orders", 1).await.unwrap());
    assert_eq!(client.publish("orders", 0, "a").await.unwrap(), 0);
    assert_eq!(client.publish("orders", 0, "b").await.unwrap(), 1);
    // Not in the worked example: the partition is now full, and a refused publish uses no offset.
    assert_eq!(client.publish("orders", 0, "c").await.unwrap(), -1);
    assert_eq!(client.end_offset("orders", 0).await.unwrap(), 2);
    assert_eq!(client.join("orders", "billing", "m1").await.unwrap(), [0]);
    assert_eq!(
        client.poll("orders", "billing", "m1", 2).await.unwrap(),
        [record("orders", 0, 0, "a")]
    );
    assert!(client.retry("orders", "billing", "m1", 0, 0).await.unwrap());
    assert_eq!(
        client.poll("orders", "billing", "m1", 2).await.unwrap(),
        [record("orders", 0, 0, "a")]
    );
    assert!(client.ack("orders", "billing", "m1", 0, 0).await.unwrap());
    assert_eq!(
        client.poll("orders", "billing", "m1", 2).await.unwrap(),
        [record("orders", 0, 1, "b")]
    );
    // The only group acknowledged "a", so it left and made room for one more record.
    assert_eq!(client.publish("orders", 0, "c").await.unwrap(), 2);
    assert_eq!(client.publish("orders", 0, "d").await.unwrap(), -1);
    // Any mismatch is false: the acknowledged offset again, a wrong member, a wrong offset.
    assert!(!client.ack("orders", "billing", "m1", 0, 0).await.unwrap());
    assert!(!client.ack("orders", "billing", "m2", 0, 1).await.unwrap());
    assert!(!client.retry("orders", "billing", "m1", 0, 2).await.unwrap());
    // A duplicate create is false and keeps the topic as it is.
    assert!(!client.create("orders", 5).await.unwrap());
    assert_eq!(
        client
            .describe_topic("orders")
            .await
            .unwrap()
            .partitions
            .len(),
        1
    );
}

#[tokio::test]
async fn three_partition_rebalance_example() {
    let server = ServerProcess::start(&["--capacity", "10"]);
    let client = connect(&server).await;
    client.create("t", 3).await.unwrap();
    for partition in 0..3 {
        client.publish("t", partition, "x").await.unwrap();
    }
    assert_eq!(client.join("t", "g", "a").await.unwrap(), [0, 1, 2]);
    let delivered = client.poll("t", "g", "a", 10).await.unwrap();
    assert_eq!(positions(&delivered), [(0, 0), (1, 0), (2, 0)]);

    assert_eq!(client.join("t", "g", "b").await.unwrap(), [1]);
    assert_eq!(client.assignment("t", "g", "a").await.unwrap(), [0, 2]);
    // a's delivery from partition 1 was canceled: b gets the same offset.
    assert_eq!(
        client.poll("t", "g", "b", 10).await.unwrap(),
        [record("t", 1, 0, "x")]
    );
    assert!(!client.ack("t", "g", "a", 1, 0).await.unwrap());
    assert!(client.ack("t", "g", "b", 1, 0).await.unwrap());
    // Partitions that stayed with a keep their in-flight deliveries.
    assert!(client.ack("t", "g", "a", 0, 0).await.unwrap());
    assert!(client.ack("t", "g", "a", 2, 0).await.unwrap());

    // Repeated joins and absent leaves change nothing; the group outlives its last member.
    assert_eq!(client.join("t", "g", "b").await.unwrap(), [1]);
    assert!(!client.leave("t", "g", "nobody").await.unwrap());
    assert!(client.leave("t", "g", "a").await.unwrap());
    assert!(client.leave("t", "g", "b").await.unwrap());
    let lag = client.lag("t", "g").await.unwrap();
    assert_eq!(
        lag.iter().map(|l| l.committed).collect::<Vec<_>>(),
        [1, 1, 1]
    );
}

#[tokio::test]
async fn invalid_arguments_are_refused_and_change_nothing() {
    let server = ServerProcess::start(&["--capacity", "10"]);
    let client = connect(&server).await;
    client.create("t", 2).await.unwrap();
    client.publish("t", 0, "p0").await.unwrap();
    client.publish("t", 1, "p1").await.unwrap();
    client.join("t", "g", "m").await.unwrap();
    assert_eq!(client.poll("t", "g", "m", 1).await.unwrap().len(), 1);
    client
        .join_with("t", "fetchers", "f", Assignor::Range)
        .await
        .unwrap();
    assert_eq!(
        client.fetch("t", "fetchers", "f", 1).await.unwrap().len(),
        1
    );
    let before: BrokerDescription = client.describe().await.unwrap();

    let long = "x".repeat(65);
    // Identifiers: empty, too long, spaces (untrimmed), punctuation, non-ASCII.
    for bad in [
        "",
        long.as_str(),
        " t",
        "t ",
        "a.b",
        "a/b",
        "tópico",
        "a\0b",
    ] {
        assert_invalid(&format!("create {bad:?}"), client.create(bad, 1).await);
        assert_invalid(
            &format!("join topic {bad:?}"),
            client.join(bad, "g", "m").await,
        );
        assert_invalid(
            &format!("join group {bad:?}"),
            client.join("t", bad, "m").await,
        );
        assert_invalid(
            &format!("join member {bad:?}"),
            client.join("t", "g", bad).await,
        );
        assert_invalid(
            &format!("leave group {bad:?}"),
            client.leave("t", bad, "m").await,
        );
        assert_invalid(
            &format!("poll member {bad:?}"),
            client.poll("t", "g", bad, 1).await,
        );
        assert_invalid(
            &format!("ack group {bad:?}"),
            client.ack("t", bad, "m", 0, 0).await,
        );
    }
    // Partition counts outside 1..=64.
    for count in [0, -1, 65, i32::MIN, i32::MAX] {
        assert_invalid(
            &format!("create count {count}"),
            client.create("new", count).await,
        );
    }
    // Unknown topics (case-sensitive) on every method but create.
    for unknown in ["T", "nope"] {
        assert_invalid("join", client.join(unknown, "g", "m").await);
        assert_invalid(
            "join_with",
            client.join_with(unknown, "g", "m", Assignor::Range).await,
        );
        assert_invalid("leave", client.leave(unknown, "g", "m").await);
        assert_invalid("publish", client.publish(unknown, 0, "x").await);
        assert_invalid(
            "publish_keyed",
            client.publish_keyed(unknown, Some(b"k"), "x").await,
        );
        assert_invalid(
            "publish_keyed",
            client.publish_keyed(unknown, None, "x").await,
        );
        assert_invalid("poll", client.poll(unknown, "g", "m", 1).await);
        assert_invalid("ack", client.ack(unknown, "g", "m", 0, 0).await);
        assert_invalid("retry", client.retry(unknown, "g", "m", 0, 0).await);
        assert_invalid("fetch", client.fetch(unknown, "g", "m", 1).await);
        assert_invalid("commit", client.commit(unknown, "g", "m", None).await);
        assert_invalid("assignment", client.assignment(unknown, "g", "m").await);
        assert_invalid("committed", client.committed(unknown, "g", 0).await);
        assert_invalid("end_offset", client.end_offset(unknown, 0).await);
        assert_invalid("lag", client.lag(unknown, "g").await);
    }
    // Partitions the topic does not have.
    for partition in [-1, 2, 64, i32::MAX] {
        assert_invalid("publish", client.publish("t", partition, "x").await);
        assert_invalid("ack", client.ack("t", "g", "m", partition, 0).await);
        assert_invalid("retry", client.retry("t", "g", "m", partition, 0).await);
        assert_invalid("committed", client.committed("t", "g", partition).await);
        assert_invalid("end_offset", client.end_offset("t", partition).await);
    }
    // Negative offsets.
    assert_invalid("ack -1", client.ack("t", "g", "m", 0, -1).await);
    assert_invalid("retry -1", client.retry("t", "g", "m", 0, -1).await);
    assert_invalid(
        "commit -1",
        client
            .commit("t", "fetchers", "f", Some(BTreeMap::from([(0, -1)])))
            .await,
    );
    // max_records outside 1..=64 for poll; fetch needs at least 1.
    for max in [0, -1, 65, i32::MIN] {
        assert_invalid(
            &format!("poll max {max}"),
            client.poll("t", "g", "m", max).await,
        );
    }
    assert_invalid("fetch max 0", client.fetch("t", "fetchers", "f", 0).await);
    assert_invalid("fetch max -1", client.fetch("t", "fetchers", "f", -1).await);
    // A group's assignor is fixed by the join that created it.
    assert_invalid(
        "join_with another assignor",
        client.join_with("t", "g", "m2", Assignor::Range).await,
    );
    assert_invalid(
        "join_with another assignor",
        client
            .join_with("t", "fetchers", "f2", Assignor::RoundRobin)
            .await,
    );

    assert_eq!(
        client.describe().await.unwrap(),
        before,
        "an invalid call changed state"
    );
    // The connection is still fine, and so is the state: the in-flight record is still there.
    assert!(client.ack("t", "g", "m", 0, 0).await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// Kafka style

#[tokio::test]
async fn range_assignor_gives_6_partitions_over_a_b_c_two_each_and_idles_extra_members() {
    let server = ServerProcess::start(&[]);
    let client = connect(&server).await;
    client.create("six", 6).await.unwrap();
    // Join order does not matter: members are sorted by id.
    client
        .join_with("six", "g", "C", Assignor::Range)
        .await
        .unwrap();
    client.join("six", "g", "A").await.unwrap(); // the group's assignor: range
    client
        .join_with("six", "g", "B", Assignor::Range)
        .await
        .unwrap();
    assert_eq!(client.assignment("six", "g", "A").await.unwrap(), [0, 1]);
    assert_eq!(client.assignment("six", "g", "B").await.unwrap(), [2, 3]);
    assert_eq!(client.assignment("six", "g", "C").await.unwrap(), [4, 5]);
    assert!(client
        .assignment("six", "g", "nobody")
        .await
        .unwrap()
        .is_empty());
    // 6 over 4: the first two get one extra.
    client.join("six", "g", "D").await.unwrap();
    let all: Vec<Vec<i32>> = futures::future::try_join_all(
        ["A", "B", "C", "D"].map(|m| client.assignment("six", "g", m)),
    )
    .await
    .unwrap();
    assert_eq!(all, [vec![0, 1], vec![2, 3], vec![4], vec![5]]);

    // Members past the partition count get nothing.
    client.create("two", 2).await.unwrap();
    for member in ["x", "y", "z"] {
        client
            .join_with("two", "g", member, Assignor::Range)
            .await
            .unwrap();
    }
    assert_eq!(client.assignment("two", "g", "x").await.unwrap(), [0]);
    assert_eq!(client.assignment("two", "g", "y").await.unwrap(), [1]);
    assert!(client.assignment("two", "g", "z").await.unwrap().is_empty());
    // Round-robin for comparison: p mod n over sorted members.
    client.join("six", "rr", "b").await.unwrap();
    client.join("six", "rr", "a").await.unwrap();
    assert_eq!(
        client.assignment("six", "rr", "a").await.unwrap(),
        [0, 2, 4]
    );
    assert_eq!(
        client.assignment("six", "rr", "b").await.unwrap(),
        [1, 3, 5]
    );
}

#[tokio::test]
async fn four_partition_rebalance_resumes_every_partition_from_the_committed_offset() {
    let server = ServerProcess::start(&["--capacity", "100"]);
    let client = connect(&server).await;
    client.create("orders", 4).await.unwrap();
    for partition in 0..4 {
        for i in 0..3 {
            client
                .publish("orders", partition, format!("{partition}-{i}"))
                .await
                .unwrap();
        }
    }
    assert_eq!(
        client
            .join_with("orders", "g", "m1", Assignor::Range)
            .await
            .unwrap(),
        [0, 1, 2, 3]
    );
    // Ascending partitions, offsets in order, cut short at the lowest partitions first.
    let first = client.fetch("orders", "g", "m1", 5).await.unwrap();
    assert_eq!(positions(&first), [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]);
    assert_eq!(first[3].payload, Bytes::from("1-0"));
    client.commit("orders", "g", "m1", None).await.unwrap();
    // Fetched but not committed: lost on the next rebalance.
    let second = client.fetch("orders", "g", "m1", 4).await.unwrap();
    assert_eq!(positions(&second), [(1, 2), (2, 0), (2, 1), (2, 2)]);
    assert_eq!(
        client.lag("orders", "g").await.unwrap(),
        [
            PartitionLag {
                partition: 0,
                committed: 3,
                end_offset: 3,
                lag: 0,
                skipped: 0
            },
            PartitionLag {
                partition: 1,
                committed: 2,
                end_offset: 3,
                lag: 1,
                skipped: 0
            },
            PartitionLag {
                partition: 2,
                committed: 0,
                end_offset: 3,
                lag: 3,
                skipped: 0
            },
            PartitionLag {
                partition: 3,
                committed: 0,
                end_offset: 3,
                lag: 3,
                skipped: 0
            },
        ]
    );

    assert_eq!(
        client.join("orders", "g", "m2").await.unwrap(),
        [2, 3],
        "range over sorted members: m1 [0, 1], m2 [2, 3]"
    );
    assert_eq!(
        client.assignment("orders", "g", "m1").await.unwrap(),
        [0, 1]
    );
    // m2 starts at the group's committed offsets of 2 and 3 as m1 left them.
    let taken_over = client.fetch("orders", "g", "m2", 100).await.unwrap();
    assert_eq!(
        positions(&taken_over),
        [(2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2)]
    );
    // Every position of the group was reset: m1 replays partition 1 from its commit.
    assert_eq!(
        positions(&client.fetch("orders", "g", "m1", 100).await.unwrap()),
        [(1, 2)]
    );
    // m2 commits only partition 2 explicitly, then crashes (leaves) before committing 3.
    client
        .commit("orders", "g", "m2", Some(BTreeMap::from([(2, 3)])))
        .await
        .unwrap();
    assert_eq!(client.committed("orders", "g", 2).await.unwrap(), 3);
    assert_eq!(client.committed("orders", "g", 3).await.unwrap(), 0);
    assert!(client.leave("orders", "g", "m2").await.unwrap());
    // m1 owns everything again and replays from the last commit: partition 3 from 0.
    assert_eq!(
        client.assignment("orders", "g", "m1").await.unwrap(),
        [0, 1, 2, 3]
    );
    assert_eq!(
        positions(&client.fetch("orders", "g", "m1", 100).await.unwrap()),
        [(1, 2), (3, 0), (3, 1), (3, 2)]
    );
}

#[tokio::test]
async fn committing_a_partition_the_member_does_not_own_is_not_assigned_and_stores_nothing() {
    let server = ServerProcess::start(&[]);
    let client = connect(&server).await;
    client.create("t", 4).await.unwrap();
    for partition in 0..4 {
        client.publish("t", partition, "x").await.unwrap();
    }
    client
        .join_with("t", "g", "a", Assignor::Range)
        .await
        .unwrap();
    client
        .join_with("t", "g", "b", Assignor::Range)
        .await
        .unwrap(); // a [0, 1], b [2, 3]
    let not_assigned = |result: Result<(), Error>, expected: i32| match result {
        Err(Error::Broker(BrokerError::NotAssigned { partition })) => {
            assert_eq!(partition, expected);
        }
        other => panic!("expected NotAssigned {{ partition: {expected} }}, got {other:?}"),
    };
    // One foreign partition among owned ones: the whole commit is refused.
    not_assigned(
        client
            .commit("t", "g", "a", Some(BTreeMap::from([(0, 1), (2, 1)])))
            .await,
        2,
    );
    // A non-member, and an absent group.
    not_assigned(
        client
            .commit("t", "g", "stranger", Some(BTreeMap::from([(0, 1)])))
            .await,
        0,
    );
    not_assigned(
        client
            .commit("t", "absent", "a", Some(BTreeMap::from([(3, 1)])))
            .await,
        3,
    );
    // commit(None) by a non-member succeeds and stores nothing.
    client.commit("t", "g", "stranger", None).await.unwrap();
    for partition in 0..4 {
        assert_eq!(client.committed("t", "g", partition).await.unwrap(), 0);
    }
    assert!(client
        .describe_topic("t")
        .await
        .unwrap()
        .groups
        .iter()
        .all(|g| g.name != "absent"));
    // The owner may commit its own.
    client
        .commit("t", "g", "b", Some(BTreeMap::from([(2, 1), (3, 1)])))
        .await
        .unwrap();
    assert_eq!(client.committed("t", "g", 2).await.unwrap(), 1);
    // A fetch by a non-member or on an absent group is empty.
    assert!(client
        .fetch("t", "g", "stranger", 10)
        .await
        .unwrap()
        .is_empty());
    assert!(client
        .fetch("t", "absent", "a", 10)
        .await
        .unwrap()
        .is_empty());
}

/// Kafka's `murmur2` of some keys, as signed 32-bit values: the cases of Kafka's own
/// `UtilsTest.testMurmur2`, so this test does not trust any implementation of ours.
const KAFKA_MURMUR2: [(&str, i32); 6] = [
    ("21", -973_932_308),
    ("foobar", -790_332_482),
    ("a-little-bit-long-string", -985_981_536),
    ("a-little-bit-longer-string", -1_486_304_829),
    (
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
        -58_897_971,
    ),
    ("abc", 479_470_107),
];

/// 32-bit FNV-1a, as the broker defines it.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[tokio::test]
async fn keyed_publish_lands_where_kafkas_murmur2_says_or_fnv1a_when_chosen() {
    let server = ServerProcess::start(&["--capacity", "2"]);
    let client = connect(&server).await;
    for n in [3, 7, 64] {
        let topic = format!("murmur-{n}");
        client.create(&topic, n).await.unwrap();
        for (key, hash) in KAFKA_MURMUR2 {
            let expected = (hash & 0x7fff_ffff) % n;
            let (partition, _) = client
                .publish_keyed(&topic, Some(key.as_bytes()), key)
                .await
                .unwrap();
            assert_eq!(partition, expected, "key {key:?} over {n} partitions");
        }
    }
    // "21" over 7 partitions is partition 3; the record carries its key.
    client.join("murmur-7", "g", "m").await.unwrap();
    let records = client.fetch("murmur-7", "g", "m", 100).await.unwrap();
    let twenty_one = records.iter().find(|r| r.payload == "21").unwrap();
    assert_eq!(twenty_one.partition, 3);
    assert_eq!(twenty_one.key.as_deref(), Some(&b"21"[..]));

    client.create_with("fnv", 7, KeyHash::Fnv1a).await.unwrap();
    for (key, _) in KAFKA_MURMUR2 {
        let expected = i32::try_from(fnv1a(key.as_bytes()) % 7).unwrap();
        let (partition, _) = client
            .publish_keyed("fnv", Some(key.as_bytes()), "v")
            .await
            .unwrap();
        assert_eq!(partition, expected, "fnv1a key {key:?}");
    }

    // No key: consecutive partitions, so every n publishes cover all n.
    client.create("rr", 5).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(client.publish_keyed("rr", None, "v").await.unwrap().0);
    }
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2, 3, 4]);

    // A full partition (capacity 2, no group consumes): offset -1, no offset used.
    client.create("full", 3).await.unwrap();
    let offsets: Vec<(i32, i64)> = futures::future::try_join_all(
        (0..3).map(|_| client.publish_keyed("full", Some(b"21"), "v")),
    )
    .await
    .unwrap();
    let mut offsets_only: Vec<i64> = offsets.iter().map(|&(_, o)| o).collect();
    offsets_only.sort_unstable();
    assert_eq!(offsets_only, [-1, 0, 1]);
    assert!(offsets.iter().all(|&(p, _)| p == 0), "{offsets:?}");
    assert_eq!(client.end_offset("full", 0).await.unwrap(), 2);
}

// ---------------------------------------------------------------------------------------------
// Concurrency

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_share_one_client() {
    const TASKS: i32 = 32;
    const PER_TASK: i64 = 50;
    const CONSUMERS: usize = 8;
    let server = ServerProcess::start(&["--capacity", "1000"]);
    let client = connect(&server).await;
    client.create("shared", TASKS).await.unwrap();

    // Each task publishes to its own partition, one call after the other: offsets in order.
    let producers: Vec<_> = (0..TASKS)
        .map(|partition| {
            let client = client.clone();
            tokio::spawn(async move {
                for i in 0..PER_TASK {
                    let offset = client
                        .publish("shared", partition, format!("{partition}:{i}"))
                        .await
                        .unwrap();
                    assert_eq!(offset, i);
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }

    // Consumers of one group, all on the same connection: join, then wait for each other so
    // no rebalance resets a position mid-way, then fetch until each has its share.
    let barrier = Arc::new(tokio::sync::Barrier::new(CONSUMERS));
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|i| {
            let client = client.clone();
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                let member = format!("w{i}");
                client.join("shared", "workers", &member).await.unwrap();
                barrier.wait().await;
                let mine = client
                    .assignment("shared", "workers", &member)
                    .await
                    .unwrap();
                let mut got = Vec::new();
                let deadline = Instant::now() + PATIENCE;
                while got.len() < mine.len() * PER_TASK as usize {
                    assert!(Instant::now() < deadline, "{member} got only {}", got.len());
                    got.extend(
                        client
                            .fetch("shared", "workers", &member, 17)
                            .await
                            .unwrap(),
                    );
                }
                client
                    .commit("shared", "workers", &member, None)
                    .await
                    .unwrap();
                (mine, got)
            })
        })
        .collect();
    let mut owned = Vec::new();
    for consumer in consumers {
        let (mine, got) = consumer.await.unwrap();
        let expected: Vec<(i32, i64)> = mine
            .iter()
            .flat_map(|&p| (0..PER_TASK).map(move |o| (p, o)))
            .collect();
        let mut got_positions = positions(&got);
        got_positions.sort_unstable();
        assert_eq!(got_positions, expected, "exactly its partitions, once each");
        for r in &got {
            assert_eq!(r.payload, format!("{}:{}", r.partition, r.offset));
        }
        owned.extend(mine);
    }
    owned.sort_unstable();
    assert_eq!(owned, (0..TASKS).collect::<Vec<_>>());
    assert!(client
        .lag("shared", "workers")
        .await
        .unwrap()
        .iter()
        .all(|l| l.lag == 0 && l.committed == PER_TASK));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_clients_at_once() {
    const CLIENTS: usize = 50;
    const PER_CLIENT: usize = 20;
    let server = ServerProcess::start(&["--capacity", "1000"]);
    let admin = connect(&server).await;
    admin.create("many", 8).await.unwrap();
    let clients =
        futures::future::try_join_all((0..CLIENTS).map(|_| Client::connect(server.addr_string())))
            .await
            .unwrap();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, client)| {
            tokio::spawn(async move {
                let key = format!("client-{i}");
                let mut last: Option<(i32, i64)> = None;
                for n in 0..PER_CLIENT {
                    let (partition, offset) = client
                        .publish_keyed("many", Some(key.as_bytes()), format!("{key}/{n}"))
                        .await
                        .unwrap();
                    assert!(offset >= 0);
                    if let Some((p, o)) = last {
                        assert_eq!(partition, p, "one key, one partition");
                        assert!(offset > o);
                    }
                    last = Some((partition, offset));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let mut total = 0;
    for partition in 0..8 {
        total += admin.end_offset("many", partition).await.unwrap();
    }
    assert_eq!(total, (CLIENTS * PER_CLIENT) as i64);
    // One consumer reads everything; each key's records come in the order they were sent.
    admin.join("many", "reader", "r").await.unwrap();
    let all = admin.fetch("many", "reader", "r", 10_000).await.unwrap();
    assert_eq!(all.len(), CLIENTS * PER_CLIENT);
    let mut next = BTreeMap::<String, usize>::new();
    for r in &all {
        let payload = std::str::from_utf8(&r.payload).unwrap();
        let (key, n) = payload.split_once('/').unwrap();
        let expected = next.entry(key.to_owned()).or_insert(0);
        assert_eq!(n.parse::<usize>().unwrap(), *expected, "{payload}");
        *expected += 1;
    }
    assert_eq!(next.len(), CLIENTS);
}

#[tokio::test]
async fn pipelining_thousands_of_requests_in_flight_on_one_client() {
    const REQUESTS: i32 = 5_000;
    const PARTITIONS: i32 = 8;
    let server = ServerProcess::start(&["--capacity", "1000"]);
    let client = Client::builder()
        .max_in_flight(10_000)
        .connect(server.addr_string())
        .await
        .unwrap();
    client.create("pipe", PARTITIONS).await.unwrap();
    let start = Instant::now();
    // Every request is issued before any answer is awaited: one connection, 5,000 publishes
    // interleaved with reads.
    let publishes = (0..REQUESTS).map(|i| client.publish("pipe", i % PARTITIONS, format!("{i}")));
    let reads = (0..REQUESTS / 10).map(|i| client.end_offset("pipe", i % PARTITIONS));
    let (offsets, ends) = tokio::join!(
        futures::future::try_join_all(publishes),
        futures::future::try_join_all(reads)
    );
    let offsets = offsets.unwrap();
    assert!(ends.unwrap().iter().all(|&e| (0..=625).contains(&e)));
    // Each partition got offsets 0..625, each exactly once, and each answer went to its caller.
    for partition in 0..PARTITIONS {
        let mut mine: Vec<i64> = offsets
            .iter()
            .enumerate()
            .filter(|&(i, _)| i as i32 % PARTITIONS == partition)
            .map(|(_, &o)| o)
            .collect();
        mine.sort_unstable();
        assert_eq!(
            mine,
            (0..625).collect::<Vec<i64>>(),
            "partition {partition}"
        );
    }
    client.join("pipe", "g", "m").await.unwrap();
    let records = client.fetch("pipe", "g", "m", 10_000).await.unwrap();
    assert_eq!(records.len(), REQUESTS as usize);
    for r in &records {
        let sent: usize = std::str::from_utf8(&r.payload).unwrap().parse().unwrap();
        assert_eq!(
            offsets[sent], r.offset,
            "record {sent} is where its answer said"
        );
        assert_eq!(sent as i32 % PARTITIONS, r.partition);
    }
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// Waiting polls

#[tokio::test]
async fn a_parked_poll_wakes_on_a_publish_from_another_client() {
    let server = ServerProcess::start(&[]);
    let consumer = connect(&server).await;
    let producer = connect(&server).await;
    consumer.create("live", 2).await.unwrap();
    consumer.join("live", "g", "m").await.unwrap();
    let start = Instant::now();
    let mut poll = std::pin::pin!(consumer.poll_wait("live", "g", "m", 8, Duration::from_secs(30)));
    // Polling the call once queues its request; requests on one connection are applied in
    // order, so once a later request on the consumer's connection is answered, the poll has
    // been applied, found nothing, and is parked.
    assert!(futures::poll!(poll.as_mut()).is_pending());
    consumer.end_offset("live", 1).await.unwrap();
    assert!(
        futures::poll!(poll.as_mut()).is_pending(),
        "the poll answered before any record existed"
    );
    assert_eq!(producer.publish("live", 1, "now").await.unwrap(), 0);
    let records = tokio::time::timeout(PATIENCE, poll).await.unwrap().unwrap();
    assert_eq!(records, [record("live", 1, 0, "now")]);
    assert!(start.elapsed() < PATIENCE);
}

#[tokio::test]
async fn a_parked_fetch_wakes_on_a_publish() {
    let server = ServerProcess::start(&[]);
    let client = connect(&server).await;
    client.create("live", 1).await.unwrap();
    client.join("live", "g", "m").await.unwrap();
    // `join!` polls its branches in order: the fetch is queued before the end_offset.
    let (records, ()) = tokio::time::timeout(PATIENCE, async {
        tokio::join!(
            client.fetch_wait("live", "g", "m", 10, Duration::from_secs(30)),
            async {
                client.end_offset("live", 0).await.unwrap();
                client.publish("live", 0, "one").await.unwrap();
            }
        )
    })
    .await
    .expect("the fetch was not woken");
    assert_eq!(records.unwrap(), [record("live", 0, 0, "one")]);
}

#[tokio::test]
async fn a_parked_poll_wakes_when_the_in_flight_record_is_acknowledged() {
    let server = ServerProcess::start(&[]);
    let client = connect(&server).await;
    let other = connect(&server).await;
    client.create("live", 1).await.unwrap();
    client.publish("live", 0, "first").await.unwrap();
    client.publish("live", 0, "second").await.unwrap();
    client.join("live", "g", "m").await.unwrap();
    assert_eq!(
        client.poll("live", "g", "m", 1).await.unwrap(),
        [record("live", 0, 0, "first")]
    );
    // "second" is not eligible while "first" is in flight: the poll parks until the ack, which
    // comes over another connection.
    let (records, ()) = tokio::time::timeout(PATIENCE, async {
        tokio::join!(
            client.poll_wait("live", "g", "m", 1, Duration::from_secs(30)),
            async {
                client.end_offset("live", 0).await.unwrap();
                assert!(other.ack("live", "g", "m", 0, 0).await.unwrap());
            }
        )
    })
    .await
    .expect("the poll was not woken by the ack");
    assert_eq!(records.unwrap(), [record("live", 0, 1, "second")]);
}

#[tokio::test]
async fn ack_and_poll_settles_a_round_and_takes_the_next_in_one_request() {
    let server = ServerProcess::start(&[]);
    let client = connect(&server).await;
    client.create("rounds", 2).await.unwrap();
    for (partition, payload) in [(0, "a0"), (0, "a1"), (1, "b0")] {
        client.publish("rounds", partition, payload).await.unwrap();
    }
    client.join("rounds", "g", "m").await.unwrap();
    let (acked, first) = client
        .ack_and_poll("rounds", "g", "m", &[], 64)
        .await
        .unwrap();
    assert!(acked.is_empty());
    assert_eq!(
        first,
        [record("rounds", 0, 0, "a0"), record("rounds", 1, 0, "b0")]
    );
    // One bad ack refuses the whole request: the good one beside it is not applied either.
    assert_invalid(
        "an ack of a partition the topic lacks",
        client
            .ack_and_poll("rounds", "g", "m", &[(0, 0), (9, 0)], 64)
            .await,
    );
    assert_eq!(client.committed("rounds", "g", 0).await.unwrap(), 0);
    let (acked, second) = client
        .ack_and_poll("rounds", "g", "m", &[(0, 0), (1, 0), (1, 7)], 64)
        .await
        .unwrap();
    assert_eq!(acked, [true, true, false]);
    assert_eq!(second, [record("rounds", 0, 1, "a1")]);
    assert_eq!(client.committed("rounds", "g", 0).await.unwrap(), 1);
    assert_eq!(client.committed("rounds", "g", 1).await.unwrap(), 1);
}

#[tokio::test]
async fn a_waiting_ack_and_poll_acknowledges_at_once_and_answers_with_the_next_record() {
    let server = ServerProcess::start(&[]);
    let client = connect(&server).await;
    let other = connect(&server).await;
    client.create("live", 1).await.unwrap();
    client.publish("live", 0, "first").await.unwrap();
    client.join("live", "g", "m").await.unwrap();
    assert_eq!(
        client.poll("live", "g", "m", 1).await.unwrap(),
        [record("live", 0, 0, "first")]
    );
    let mut call = std::pin::pin!(client.ack_and_poll_wait(
        "live",
        "g",
        "m",
        &[(0, 0)],
        1,
        Duration::from_secs(30)
    ));
    assert!(futures::poll!(call.as_mut()).is_pending());
    // Answered in order after the ack-and-poll was applied: it is parked, its ack applied.
    client.end_offset("live", 0).await.unwrap();
    assert!(futures::poll!(call.as_mut()).is_pending());
    assert_eq!(other.committed("live", "g", 0).await.unwrap(), 1);
    assert_eq!(other.publish("live", 0, "second").await.unwrap(), 1);
    let (acked, records) = tokio::time::timeout(PATIENCE, call)
        .await
        .expect("the ack-and-poll was not woken")
        .unwrap();
    assert_eq!(acked, [true]);
    assert_eq!(records, [record("live", 0, 1, "second")]);
}

#[tokio::test]
async fn a_waiting_poll_with_nothing_to_take_times_out_empty_at_the_servers_limit() {
    let server = ServerProcess::start(&["--max-wait-ms", "200"]);
    let client = connect(&server).await;
    client.create("quiet", 1).await.unwrap();
    client.join("quiet", "g", "m").await.unwrap();
    let start = Instant::now();
    let records = client
        .poll_wait("quiet", "g", "m", 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(records.is_empty());
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
    assert!(waited < PATIENCE, "{waited:?}");
}

// ---------------------------------------------------------------------------------------------
// Consumer liveness

#[tokio::test]
async fn a_silent_member_is_removed_after_the_session_timeout_and_the_others_take_over() {
    // Long enough that a loaded CI machine never stalls `a` (which calls every few ms) past it.
    let server = ServerProcess::start(&["--session-timeout-ms", "1500"]);
    let a = connect(&server).await;
    let b = connect(&server).await;
    a.create("t", 4).await.unwrap();
    a.publish("t", 1, "x").await.unwrap();
    assert_eq!(a.join("t", "g", "a").await.unwrap(), [0, 1, 2, 3]);
    assert_eq!(b.join("t", "g", "b").await.unwrap(), [1, 3]);
    // b takes a record and goes silent without acknowledging it.
    assert_eq!(
        positions(&b.poll("t", "g", "b", 8).await.unwrap()),
        [(1, 0)]
    );
    let silent_since = Instant::now();
    // a keeps calling (every call naming it refreshes its session) and sees the rebalance.
    wait_for_assignment(&a, ("t", "g", "a"), &[0, 1, 2, 3]).await;
    let took = silent_since.elapsed();
    assert!(
        took >= Duration::from_millis(1_250),
        "b was removed after only {took:?}"
    );
    // b's delivery was canceled with the move: a gets the record.
    assert_eq!(
        a.poll("t", "g", "a", 8).await.unwrap(),
        [record("t", 1, 0, "x")]
    );
    let group = &a.describe_topic("t").await.unwrap().groups[0];
    let members: Vec<&str> = group.members.iter().map(|m| m.member.as_str()).collect();
    assert_eq!(members, ["a"]);
    // b's ack is refused now; b may join again.
    assert!(!b.ack("t", "g", "b", 1, 0).await.unwrap());
    assert_eq!(b.join("t", "g", "b").await.unwrap(), [1, 3]);
}

#[tokio::test]
async fn leave_on_disconnect_rebalances_as_soon_as_the_connection_closes() {
    // The session timeout is far longer than the test may take: only the disconnect counts.
    let server = ServerProcess::start(&["--leave-on-disconnect", "--session-timeout-ms", "600000"]);
    let a = connect(&server).await;
    let b = connect(&server).await;
    a.create("t", 4).await.unwrap();
    assert_eq!(a.join("t", "g", "a").await.unwrap(), [0, 1, 2, 3]);
    assert_eq!(b.join("t", "g", "b").await.unwrap(), [1, 3]);
    assert_eq!(a.assignment("t", "g", "a").await.unwrap(), [0, 2]);
    drop(b);
    wait_for_assignment(&a, ("t", "g", "a"), &[0, 1, 2, 3]).await;
    // a's connection is still open, so a stays.
    let group = &a.describe_topic("t").await.unwrap().groups[0];
    assert_eq!(group.members.len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Shutdown

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_a_parked_poll_and_exits_0_quickly() {
    let mut server = ServerProcess::start(&[]);
    let client = connect(&server).await;
    client.create("t", 1).await.unwrap();
    client.join("t", "g", "m").await.unwrap();
    let mut poll = std::pin::pin!(client.poll_wait("t", "g", "m", 1, Duration::from_secs(30)));
    assert!(futures::poll!(poll.as_mut()).is_pending());
    client.end_offset("t", 0).await.unwrap();
    assert!(
        futures::poll!(poll.as_mut()).is_pending(),
        "the poll answered before shutdown"
    );
    let start = Instant::now();
    let (server, status) = tokio::task::spawn_blocking(move || {
        let status = server.terminate(PATIENCE);
        (server, status)
    })
    .await
    .unwrap();
    assert!(status.success(), "broker-server exited with {status:?}");
    let records = tokio::time::timeout(PATIENCE, poll)
        .await
        .expect("the parked poll was never answered")
        .expect("the parked poll got an error instead of an empty answer");
    assert!(records.is_empty());
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    drop(server);
}

// ---------------------------------------------------------------------------------------------
// Batch publish

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_publish_places_records_like_single_publishes_and_refuses_oversized_ones() {
    let server = ServerProcess::start(&["--capacity", "2", "--max-payload-bytes", "8"]);
    let client = connect(&server).await;
    client.create("t", 7).await.unwrap();
    let placed = client
        .publish_batch(
            "t",
            vec![
                PublishRecord::to_partition(6, "a"),
                PublishRecord::to_partition(6, "b"),
                PublishRecord::to_partition(6, "full"),
                PublishRecord::keyed(Some(b"21"), "keyed"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(placed, [(6, 0), (6, 1), (6, -1), (3, 0)]);
    let before = client.describe().await.unwrap();
    let oversized = client
        .publish_batch(
            "t",
            vec![
                PublishRecord::to_partition(0, "ok"),
                PublishRecord::to_partition(0, "nine byte"),
            ],
        )
        .await;
    assert!(
        matches!(oversized, Err(Error::Server(ErrorReply::TooLarge { .. }))),
        "{oversized:?}"
    );
    assert!(matches!(
        client
            .publish_batch("t", vec![PublishRecord::to_partition(7, "x")])
            .await,
        Err(Error::Broker(BrokerError::InvalidArgument(_)))
    ));
    assert_eq!(
        client.describe().await.unwrap(),
        before,
        "nothing was stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_topic_group_and_member_limits_refuse_more_and_change_nothing() {
    let server = ServerProcess::start(&[
        "--max-topics",
        "1",
        "--max-groups-per-topic",
        "1",
        "--max-members-per-group",
        "1",
    ]);
    let client = connect(&server).await;
    assert!(client.create("t", 1).await.unwrap());
    client.join("t", "g", "m").await.unwrap();
    let before = client.describe().await.unwrap();
    for refused in [
        client.create("u", 1).await.map(drop),
        client.join("t", "h", "m").await.map(drop),
        client.join("t", "g", "n").await.map(drop),
    ] {
        assert!(
            matches!(refused, Err(Error::Broker(BrokerError::InvalidArgument(_)))),
            "{refused:?}"
        );
    }
    assert_eq!(client.describe().await.unwrap(), before);
}

/// A group with an acknowledgement timeout: a record polled and never acknowledged comes back
/// by itself, counted as a second delivery, to a poll that waits for it. Without a timeout
/// (the default) it would stay in flight for as long as the member lives.
#[tokio::test]
async fn an_unacknowledged_delivery_comes_back_after_the_groups_ack_timeout() {
    use broker_client::GroupSetting;
    let server = ServerProcess::start(&[]);
    let client = connect(&server).await;
    client.create("slow", 1).await.unwrap();
    client.publish("slow", 0, "work").await.unwrap();
    let settings = [GroupSetting::AckTimeoutMs(300)];
    client
        .join_group("slow", "g", "m", None, &settings)
        .await
        .unwrap();
    let first = client.poll("slow", "g", "m", 1).await.unwrap();
    assert_eq!(first, [record("slow", 0, 0, "work")]);
    assert_eq!(first[0].delivery_count, 1);
    // Not acknowledged: the next poll waits, and gets it again once the timeout passed.
    let again = tokio::time::timeout(
        PATIENCE,
        client.poll_wait("slow", "g", "m", 1, Duration::from_secs(15)),
    )
    .await
    .expect("the delivery was not released")
    .unwrap();
    assert_eq!(again, [record("slow", 0, 0, "work")]);
    assert_eq!(again[0].delivery_count, 2);
    let described = client.describe_topic("slow").await.unwrap();
    assert_eq!(described.groups[0].settings, settings);
    assert_eq!(described.groups[0].partitions[0].deliveries, 2);
    // Joining with other settings is refused; without settings, the group's own apply.
    let other = [GroupSetting::AckTimeoutMs(5)];
    assert_invalid(
        "other settings",
        client.join_group("slow", "g", "n", None, &other).await,
    );
    client.join("slow", "g", "m").await.unwrap();
}

/// Deleting a topic answers the requests waiting on it at once (with the error a call on a
/// topic that does not exist gets), and its name can be used again, from offset 0.
#[tokio::test]
async fn deleting_a_topic_answers_its_waiting_consumers_and_frees_its_name() {
    let server = ServerProcess::start(&[]);
    let client = connect(&server).await;
    let admin = connect(&server).await;
    client.create("gone", 1).await.unwrap();
    client.publish("gone", 0, "old").await.unwrap();
    client.join("gone", "g", "m").await.unwrap();
    client.poll("gone", "g", "m", 1).await.unwrap();
    let started = Instant::now();
    let (waiting, ()) = tokio::time::timeout(PATIENCE, async {
        tokio::join!(
            client.poll_wait("gone", "g", "m", 1, Duration::from_secs(30)),
            async {
                admin.end_offset("gone", 0).await.unwrap();
                assert!(admin.delete_topic("gone").await.unwrap());
            }
        )
    })
    .await
    .expect("the waiting poll was not answered");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_invalid("a deleted topic", waiting);
    assert!(!admin.delete_topic("gone").await.unwrap());
    assert!(admin.create("gone", 2).await.unwrap());
    assert_eq!(admin.publish("gone", 1, "new").await.unwrap(), 0);
    assert!(admin
        .describe_topic("gone")
        .await
        .unwrap()
        .groups
        .is_empty());
}

/// Limits retention with a maximum age, over the network: records leave when they are too old,
/// whether consumed or not, and a group that had not read them skips them, counted; a reset by
/// time replays from a time.
#[tokio::test]
async fn records_older_than_the_topics_age_leave_and_groups_count_what_they_skipped() {
    use broker_client::{Retention, TopicSetting};
    let server = ServerProcess::start(&[]);
    let client = connect(&server).await;
    let settings = [
        TopicSetting::Retention(Retention::Limits),
        TopicSetting::MaxAgeMs(400),
    ];
    client
        .create_topic("aged", 1, KeyHash::Murmur2, &settings)
        .await
        .unwrap();
    client.join("aged", "slow", "m").await.unwrap();
    let before = client.offset_for_time("aged", 0, 0).await.unwrap();
    assert_eq!(before, 0);
    for payload in ["a", "b", "c"] {
        client.publish("aged", 0, payload).await.unwrap();
    }
    let deadline = Instant::now() + PATIENCE;
    let lag = loop {
        let lag = client.lag("aged", "slow").await.unwrap();
        if lag[0].skipped == 3 || Instant::now() > deadline {
            break lag;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        lag,
        [PartitionLag {
            partition: 0,
            committed: 3,
            end_offset: 3,
            lag: 0,
            skipped: 3,
        }]
    );
    let partition = client.describe_topic("aged").await.unwrap().partitions[0];
    assert_eq!(
        (partition.records, partition.earliest_timestamp_ms),
        (0, None)
    );
    // A new record, then a reset to an hour ago starts at the oldest one kept.
    client.publish("aged", 0, "d").await.unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let rows = client
        .reset_group(
            "aged",
            "slow",
            None,
            broker_client::ResetTo::Timestamp(now_ms - 3_600_000),
        )
        .await
        .unwrap();
    assert_eq!((rows[0].committed, rows[0].lag), (3, 1));
    let replayed = client.fetch("aged", "slow", "m", 10).await.unwrap();
    assert_eq!(replayed, [record("aged", 0, 3, "d")]);
    assert!(replayed[0].timestamp_ms > now_ms - 60_000);
}

/// Reading a partition from an offset without a group: what is there, the partition's bounds,
/// a wait at the end answered by the next publish, and an offset past the end refused.
#[tokio::test]
async fn read_replays_a_partition_from_an_offset_and_waits_at_its_end() {
    let server = ServerProcess::start(&[]);
    let client = Arc::new(connect(&server).await);
    client.create("replay", 1).await.unwrap();
    for payload in ["a", "b", "c"] {
        client.publish("replay", 0, payload).await.unwrap();
    }
    let read = client
        .read("replay", 0, 1, 10, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(positions(&read.records), vec![(0, 1), (0, 2)]);
    assert_eq!(read.records[1].payload, "c");
    assert_eq!((read.start_offset, read.end_offset), (0, 3));
    // No group saw it: nothing to commit, no group created.
    assert!(client
        .describe_topic("replay")
        .await
        .unwrap()
        .groups
        .is_empty());
    let waiting = tokio::spawn({
        let client = Arc::clone(&client);
        async move {
            client
                .read("replay", 0, 3, 10, Duration::from_secs(30))
                .await
        }
    });
    tokio::task::yield_now().await;
    let started = Instant::now();
    assert_eq!(client.publish("replay", 0, "d").await.unwrap(), 3);
    let woken = tokio::time::timeout(PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < PATIENCE);
    assert_eq!(positions(&woken.records), vec![(0, 3)]);
    assert_eq!(woken.end_offset, 4);
    assert_invalid(
        "past the end",
        client.read("replay", 0, 5, 10, Duration::ZERO).await,
    );
}
