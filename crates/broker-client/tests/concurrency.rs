//! Many callers at once: tasks sharing one client, thousands of pipelined requests in flight on
//! one connection with every answer checked against its question, and many clients at once.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};

use broker_client::Client;
use broker_testkit::in_process::TestServer;
use tokio::task::JoinSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_tasks_share_one_client() {
    let server = TestServer::with_capacity(100).await;
    let client = server.client().await;
    client.create("shared", 50).await.unwrap();
    let mut tasks = JoinSet::new();
    for partition in 0..50 {
        let client = client.clone();
        tasks.spawn(async move {
            for expected in 0..20 {
                let offset = client
                    .publish("shared", partition, format!("{partition}:{expected}"))
                    .await
                    .unwrap();
                assert_eq!(offset, expected);
                assert_eq!(
                    client.end_offset("shared", partition).await.unwrap(),
                    expected + 1
                );
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.unwrap();
    }
    client.join("shared", "g", "m").await.unwrap();
    let records = client.fetch("shared", "g", "m", 1000).await.unwrap();
    assert_eq!(records.len(), 1000);
    for record in records {
        assert_eq!(
            record.payload,
            format!("{}:{}", record.partition, record.offset)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_reads_in_flight_each_get_their_own_answer() {
    let server = TestServer::with_capacity(100).await;
    let client = Client::builder()
        .max_in_flight(10_000)
        .connect(server.addr)
        .await
        .unwrap();
    client.create("shape", 64).await.unwrap();
    // Partition p holds p records, so each end offset names its partition.
    for partition in 1..64 {
        for _ in 0..partition {
            client.publish("shape", partition, "x").await.unwrap();
        }
    }
    let mut calls = JoinSet::new();
    for i in 0..10_000 {
        let client = client.clone();
        let partition = i % 64;
        calls.spawn(async move {
            let end = client.end_offset("shape", partition).await.unwrap();
            (partition, end)
        });
    }
    let mut answered = 0;
    while let Some(call) = calls.join_next().await {
        let (partition, end) = call.unwrap();
        assert_eq!(end, i64::from(partition));
        answered += 1;
    }
    assert_eq!(answered, 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_publishes_in_flight_land_where_their_answers_say() {
    let server = TestServer::with_capacity(1000).await;
    let client = Client::builder()
        .max_in_flight(10_000)
        .connect(server.addr)
        .await
        .unwrap();
    client.create("bulk", 10).await.unwrap();
    let mut calls = JoinSet::new();
    for i in 0..10_000_i32 {
        let client = client.clone();
        calls.spawn(async move {
            let partition = i % 10;
            let offset = client
                .publish("bulk", partition, i.to_string())
                .await
                .unwrap();
            ((partition, offset), i)
        });
    }
    let mut sent: HashMap<(i32, i64), i32> = HashMap::new();
    while let Some(call) = calls.join_next().await {
        let (place, i) = call.unwrap();
        assert!(sent.insert(place, i).is_none(), "{place:?} answered twice");
    }
    // Every partition got exactly offsets 0..1000.
    for partition in 0..10 {
        let offsets: BTreeSet<i64> = sent
            .keys()
            .filter(|(p, _)| *p == partition)
            .map(|(_, offset)| *offset)
            .collect();
        assert_eq!(offsets, (0..1000).collect());
    }
    // The record at each answered place holds the payload of the call that got that answer.
    client.join("bulk", "g", "m").await.unwrap();
    let mut fetched = 0;
    while fetched < 10_000 {
        let records = client.fetch("bulk", "g", "m", 1000).await.unwrap();
        assert!(!records.is_empty());
        for record in records {
            let i = sent[&(record.partition, record.offset)];
            assert_eq!(record.payload, i.to_string());
            fetched += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_at_once() {
    let server = TestServer::with_capacity(100).await;
    let mut tasks = JoinSet::new();
    for n in 0..32 {
        let addr = server.addr;
        tasks.spawn(async move {
            let client = Client::connect(addr).await.unwrap();
            let created = client.create("crowd", 8).await.unwrap();
            let member = format!("m{n:02}");
            client.join("crowd", "g", &member).await.unwrap();
            let mut offsets = Vec::new();
            for _ in 0..10 {
                offsets.push(client.publish("crowd", n % 8, "x").await.unwrap());
            }
            (created, offsets)
        });
    }
    let mut creators = 0;
    let mut offsets_seen = 0;
    while let Some(task) = tasks.join_next().await {
        let (created, offsets) = task.unwrap();
        creators += usize::from(created);
        assert!(offsets.windows(2).all(|pair| pair[0] < pair[1]));
        offsets_seen += offsets.len();
    }
    assert_eq!(creators, 1);
    assert_eq!(offsets_seen, 320);
    let client = server.client().await;
    let description = client.describe_topic("crowd").await.unwrap();
    assert_eq!(description.groups[0].members.len(), 32);
    for partition in 0..8 {
        assert_eq!(client.end_offset("crowd", partition).await.unwrap(), 40);
    }
}
