//! Every typed call through the client against an in-process `broker-server`: the contract's worked
//! examples, validation errors as `Error::Broker`, keyed publishing, fetch/commit/lag, describe,
//! and the waiting variants of poll and fetch.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use broker_client::{Assignor, BrokerError, Error, ErrorReply, KeyHash, PartitionLag};
use broker_server::Config;
use broker_testkit::in_process::TestServer;
use broker_testkit::records::record;

#[tokio::test]
async fn capacity_2_worked_example() {
    let server = TestServer::with_capacity(2).await;
    let client = server.client().await;
    assert!(client.create("orders", 1).await.unwrap());
    assert_eq!(client.publish("orders", 0, "a").await.unwrap(), 0);
    assert_eq!(client.publish("orders", 0, "b").await.unwrap(), 1);
    assert_eq!(client.join("orders", "billing", "m1").await.unwrap(), [0]);
    let a = vec![record("orders", 0, 0, "a")];
    assert_eq!(client.poll("orders", "billing", "m1", 2).await.unwrap(), a);
    assert!(client.retry("orders", "billing", "m1", 0, 0).await.unwrap());
    assert_eq!(client.poll("orders", "billing", "m1", 2).await.unwrap(), a);
    assert!(client.ack("orders", "billing", "m1", 0, 0).await.unwrap());
    assert_eq!(
        client.poll("orders", "billing", "m1", 2).await.unwrap(),
        [record("orders", 0, 1, "b")]
    );
    // The acknowledged "a" left the partition, so "c" fits; then it is full, and "d" is refused
    // with -1, consuming no offset.
    assert!(!client.create("orders", 1).await.unwrap());
    assert_eq!(client.publish("orders", 0, "c").await.unwrap(), 2);
    assert_eq!(client.publish("orders", 0, "d").await.unwrap(), -1);
    assert_eq!(client.end_offset("orders", 0).await.unwrap(), 3);
}

#[tokio::test]
async fn rebalance_worked_example() {
    let server = TestServer::with_capacity(10).await;
    let client = server.client().await;
    client.create("t", 3).await.unwrap();
    assert_eq!(client.join("t", "g", "a").await.unwrap(), [0, 1, 2]);
    client.publish("t", 1, "x").await.unwrap();
    assert_eq!(
        client.poll("t", "g", "a", 3).await.unwrap(),
        [record("t", 1, 0, "x")]
    );
    assert_eq!(client.join("t", "g", "b").await.unwrap(), [1]);
    assert_eq!(client.assignment("t", "g", "a").await.unwrap(), [0, 2]);
    assert_eq!(
        client.poll("t", "g", "b", 3).await.unwrap(),
        [record("t", 1, 0, "x")]
    );
    assert!(!client.ack("t", "g", "a", 1, 0).await.unwrap());
    assert!(client.ack("t", "g", "b", 1, 0).await.unwrap());
    assert!(client.leave("t", "g", "b").await.unwrap());
    assert!(!client.leave("t", "g", "b").await.unwrap());
}

#[tokio::test]
async fn validation_errors_arrive_as_broker_invalid_argument() {
    let server = TestServer::with_capacity(2).await;
    let client = server.client().await;
    client.create("t", 2).await.unwrap();
    let long = "x".repeat(65);
    let results = [
        client.create("bad topic", 1).await.map(|_| ()),
        client.create("", 1).await.map(|_| ()),
        client.create(&long, 1).await.map(|_| ()),
        client.create("u", 0).await.map(|_| ()),
        client.create("u", 65).await.map(|_| ()),
        client.join("missing", "g", "m").await.map(|_| ()),
        client.publish("t", 2, "x").await.map(|_| ()),
        client.publish("t", -1, "x").await.map(|_| ()),
        client.poll("t", "g", "m", 0).await.map(|_| ()),
        client.poll("t", "g", "m", 65).await.map(|_| ()),
        client.ack("t", "g", "m", 0, -1).await.map(|_| ()),
        client.retry("t", "g", "m", 0, -1).await.map(|_| ()),
        client.end_offset("t", 5).await.map(|_| ()),
        client.describe_topic("missing").await.map(|_| ()),
    ];
    for (index, result) in results.into_iter().enumerate() {
        assert!(
            matches!(result, Err(Error::Broker(BrokerError::InvalidArgument(_)))),
            "case {index}: {result:?}"
        );
    }
    // An invalid call changed nothing.
    assert_eq!(client.end_offset("t", 0).await.unwrap(), 0);
    assert_eq!(client.describe().await.unwrap().topics.len(), 1);
}

#[tokio::test]
async fn committing_a_partition_the_member_does_not_own_is_not_assigned() {
    let server = TestServer::with_capacity(10).await;
    let client = server.client().await;
    client.create("t", 2).await.unwrap();
    client.join("t", "g", "a").await.unwrap();
    assert_eq!(client.join("t", "g", "b").await.unwrap(), [1]);
    let offsets = BTreeMap::from([(0, 0), (1, 0)]);
    assert!(matches!(
        client.commit("t", "g", "b", Some(offsets)).await,
        Err(Error::Broker(BrokerError::NotAssigned { partition: 0 }))
    ));
    assert!(matches!(
        client
            .commit("t", "g", "b", Some(BTreeMap::from([(1, -1)])))
            .await,
        Err(Error::Broker(BrokerError::InvalidArgument(_)))
    ));
}

#[tokio::test]
async fn keyed_publish_uses_kafkas_partitioner_and_round_robin_without_a_key() {
    let server = TestServer::with_capacity(100).await;
    let client = server.client().await;
    client.create("k", 16).await.unwrap();
    // murmur2("21") = -973932308; (h & 0x7fffffff) % 16.
    let expected = (-973_932_308_i32 & 0x7fff_ffff) % 16;
    let (partition, offset) = client.publish_keyed("k", Some(b"21"), "v").await.unwrap();
    assert_eq!((partition, offset), (expected, 0));
    assert_eq!(
        client.publish_keyed("k", Some(b"21"), "w").await.unwrap(),
        (expected, 1)
    );
    let mut seen: Vec<i32> = Vec::new();
    for _ in 0..16 {
        seen.push(client.publish_keyed("k", None, "x").await.unwrap().0);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..16).collect::<Vec<_>>());

    client.create_with("f", 4, KeyHash::Fnv1a).await.unwrap();
    let (partition, _) = client.publish_keyed("f", Some(b"key"), "v").await.unwrap();
    assert!((0..4).contains(&partition));
    client.join("k", "g", "m").await.unwrap();
    let records = client.fetch("k", "g", "m", 1000).await.unwrap();
    let keyed = records.iter().find(|r| r.partition == expected).unwrap();
    assert_eq!(keyed.key.as_deref(), Some(&b"21"[..]));
}

#[tokio::test]
async fn fetch_commit_committed_and_lag() {
    let server = TestServer::with_capacity(100).await;
    let client = server.client().await;
    client.create("t", 2).await.unwrap();
    for i in 0..3 {
        client.publish("t", 0, format!("p0-{i}")).await.unwrap();
    }
    client.publish("t", 1, "p1-0").await.unwrap();
    assert_eq!(
        client
            .join_with("t", "g", "m", Assignor::Range)
            .await
            .unwrap(),
        [0, 1]
    );
    assert!(matches!(
        client.join_with("t", "g", "n", Assignor::RoundRobin).await,
        Err(Error::Broker(BrokerError::InvalidArgument(_)))
    ));
    let first = client.fetch("t", "g", "m", 2).await.unwrap();
    assert_eq!(
        first
            .iter()
            .map(|r| (r.partition, r.offset))
            .collect::<Vec<_>>(),
        [(0, 0), (0, 1)]
    );
    client.commit("t", "g", "m", None).await.unwrap();
    assert_eq!(client.committed("t", "g", 0).await.unwrap(), 2);
    assert_eq!(client.committed("t", "g", 1).await.unwrap(), 0);
    assert_eq!(client.end_offset("t", 0).await.unwrap(), 3);
    assert_eq!(
        client.lag("t", "g").await.unwrap(),
        [
            PartitionLag {
                partition: 0,
                committed: 2,
                end_offset: 3,
                lag: 1,
                skipped: 0,
            },
            PartitionLag {
                partition: 1,
                committed: 0,
                end_offset: 1,
                lag: 1,
                skipped: 0,
            },
        ]
    );
    client
        .commit("t", "g", "m", Some(BTreeMap::from([(1, 1)])))
        .await
        .unwrap();
    assert_eq!(client.committed("t", "g", 1).await.unwrap(), 1);
    // The commit freed (1, 0) for retention (the only group consumed it), so the fetch position
    // left behind on partition 1 finds nothing there.
    let rest = client.fetch("t", "g", "m", 10).await.unwrap();
    assert_eq!(
        rest.iter()
            .map(|r| (r.partition, r.offset))
            .collect::<Vec<_>>(),
        [(0, 2)]
    );

    let topic = client.describe_topic("t").await.unwrap();
    assert_eq!(topic.name, "t");
    assert_eq!(topic.partitions.len(), 2);
    assert_eq!(topic.groups[0].assignor, Assignor::Range);
    assert_eq!(topic.groups[0].members[0].member, "m");
    let all = client.describe().await.unwrap();
    assert_eq!(all.capacity_per_partition, 100);
    assert_eq!(all.topics, [topic]);
}

#[tokio::test]
async fn a_publish_from_another_client_wakes_a_waiting_poll() {
    let server = TestServer::with_capacity(10).await;
    let consumer = server.client().await;
    let producer = server.client().await;
    consumer.create("live", 1).await.unwrap();
    consumer.join("live", "g", "m").await.unwrap();
    let start = Instant::now();
    // `join!` polls its branches in order, so the poll is sent before the end_offset call on the
    // same connection; once that is answered, the server has parked the poll.
    let (records, ()) = tokio::join!(
        consumer.poll_wait("live", "g", "m", 1, Duration::from_secs(30)),
        async {
            consumer.end_offset("live", 0).await.unwrap();
            producer.publish("live", 0, "now").await.unwrap();
        }
    );
    assert_eq!(records.unwrap(), [record("live", 0, 0, "now")]);
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn an_ack_wakes_a_waiting_poll_for_the_next_record() {
    let server = TestServer::with_capacity(10).await;
    let client = server.client().await;
    client.create("live", 1).await.unwrap();
    client.publish("live", 0, "first").await.unwrap();
    client.publish("live", 0, "second").await.unwrap();
    client.join("live", "g", "m").await.unwrap();
    let first = client.poll("live", "g", "m", 1).await.unwrap();
    assert_eq!(first, [record("live", 0, 0, "first")]);
    let start = Instant::now();
    // "second" is not eligible while "first" is in flight: the poll parks until the ack.
    let (records, ()) = tokio::join!(
        client.poll_wait("live", "g", "m", 1, Duration::from_secs(30)),
        async {
            client.end_offset("live", 0).await.unwrap();
            assert!(client.ack("live", "g", "m", 0, 0).await.unwrap());
        }
    );
    assert_eq!(records.unwrap(), [record("live", 0, 1, "second")]);
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_waiting_fetch_that_times_out_returns_nothing_within_the_servers_max_wait() {
    let server = TestServer::start(Config {
        capacity: 10,
        max_wait: Duration::from_millis(200),
        ..Config::default()
    })
    .await;
    let client = server.client().await;
    assert_eq!(client.server_limits().max_wait_ms, 200);
    client.create("quiet", 1).await.unwrap();
    client.join("quiet", "g", "m").await.unwrap();
    let start = Instant::now();
    // Asks for a minute; the server's 200 ms limit applies.
    let records = client
        .fetch_wait("quiet", "g", "m", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(records.is_empty());
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
    assert!(waited < Duration::from_secs(10), "{waited:?}");
}

#[tokio::test]
async fn a_waiting_poll_by_a_non_member_and_zero_wait_answer_at_once() {
    let server = TestServer::with_capacity(10).await;
    let client = server.client().await;
    client.create("t", 1).await.unwrap();
    let start = Instant::now();
    assert!(client
        .poll_wait("t", "g", "m", 1, Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
    assert!(client.fetch("t", "g", "m", 1).await.unwrap().is_empty());
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_payload_over_the_servers_limit_is_a_server_error_and_the_connection_goes_on() {
    let server = TestServer::start(Config {
        capacity: 10,
        max_payload_bytes: 16,
        max_frame_bytes: 16 + 2 * 1024 * 1024,
        ..Config::default()
    })
    .await;
    let client = server.client().await;
    assert_eq!(client.server_limits().max_payload_bytes, 16);
    client.create("t", 1).await.unwrap();
    assert!(matches!(
        client.publish("t", 0, vec![0u8; 17]).await,
        Err(Error::Server(ErrorReply::TooLarge { .. }))
    ));
    assert_eq!(client.publish("t", 0, vec![0u8; 16]).await.unwrap(), 0);
}

/// The client takes every address form the `broker` command takes: `:PORT` for this machine,
/// `HOST:PORT`, `[IPv6]:PORT`; a malformed one is refused before any connection.
#[tokio::test]
async fn every_address_form_of_the_command_line_connects() {
    let server = TestServer::with_capacity(10).await;
    let port = server.addr.port();
    for address in [
        format!(":{port}"),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
    ] {
        let client = broker_client::Client::connect(address.as_str())
            .await
            .unwrap();
        assert!(client.create("t", 1).await.is_ok(), "{address}");
    }
    let refused = broker_client::Client::connect("localhost:notaport").await;
    assert!(
        matches!(&refused, Err(Error::Io(error)) if error.to_string().contains("port")),
        "{refused:?}"
    );
}
