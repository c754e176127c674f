//! The `Consumer` against a real server: it consumes every record through connections cut under
//! it and across a server restart (at least once, nothing lost), reports its assignment as the
//! group rebalances, commits in fetch mode on close, and leaves its group when dropped.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use broker_client::{Client, ConsumeMode, Consumer, PublishRecord};
use broker_testkit::in_process::TestServer;
use broker_testkit::process::ServerProcess;
use broker_testkit::proxy::Proxy;
use futures::StreamExt;

/// Publishes `count` records to `topic` (payloads `"0"`, `"1"`, ...), round-robin.
async fn publish(client: &Client, topic: &str, count: usize) {
    let records: Vec<PublishRecord> = (0..count)
        .map(|i| PublishRecord::keyed(None, i.to_string()))
        .collect();
    for chunk in records.chunks(1_000) {
        let placed = client.publish_batch(topic, chunk.to_vec()).await.unwrap();
        assert!(placed.iter().all(|(_, offset)| *offset >= 0));
    }
}

/// Takes records from `consumer` (acknowledging each in ack mode) until every payload below
/// `count` was seen, failing after `limit`.
async fn consume_all(consumer: &mut Consumer, count: usize, limit: Duration) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + limit;
    while seen.len() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {count} records consumed",
            seen.len()
        );
        for delivery in consumer.next_batch().await.unwrap() {
            seen.insert(
                std::str::from_utf8(&delivery.payload)
                    .unwrap()
                    .parse()
                    .unwrap(),
            );
            delivery.ack().await.unwrap();
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_mode_consumes_everything_through_cut_connections() {
    let server = TestServer::with_capacity(10_000).await;
    let proxy = Proxy::start(server.addr).await;
    let admin = server.client().await;
    admin.create("t", 4).await.unwrap();
    let mut consumer = Consumer::builder("t", "g")
        .max_wait(Duration::from_millis(100))
        .start(Client::connect(proxy.addr).await.unwrap())
        .await
        .unwrap();
    assert_eq!(consumer.status().borrow().assignment, vec![0, 1, 2, 3]);
    publish(&admin, "t", 2_000).await;
    let cutter = tokio::spawn(async move {
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(40)).await;
            proxy.cut();
        }
        proxy
    });
    let seen = consume_all(&mut consumer, 2_000, Duration::from_secs(60)).await;
    assert_eq!(seen.len(), 2_000);
    let proxy = cutter.await.unwrap();
    assert!(proxy.accepted() >= 2, "the connection was cut");
    // Whatever was delivered twice, every record is acknowledged in the end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let lag = admin.lag("t", "g").await.unwrap();
        if lag.iter().all(|row| row.lag == 0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{lag:?}");
        for delivery in consumer.next_batch().await.unwrap() {
            delivery.ack().await.unwrap();
        }
    }
    consumer.close().await.unwrap();
    let group = &admin.describe_topic("t").await.unwrap().groups[0];
    assert!(group.members.is_empty(), "{group:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_resumes_after_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--capacity",
        "10000",
    ];
    let mut first = ServerProcess::start(&args);
    let proxy = Proxy::start(first.addr).await;
    let admin = Client::connect(first.addr).await.unwrap();
    admin.create("t", 2).await.unwrap();
    publish(&admin, "t", 300).await;
    let mut consumer = Consumer::builder("t", "g")
        .member("m1")
        .max_wait(Duration::from_millis(200))
        .start(Client::connect(proxy.addr).await.unwrap())
        .await
        .unwrap();
    let mut seen = consume_all(&mut consumer, 100, Duration::from_secs(30)).await;
    first.kill();
    // While there is no server, the consumer says it is reconnecting.
    let mut status = consumer.status();
    let reconnecting = tokio::time::timeout(Duration::from_secs(10), async {
        while status.borrow_and_update().reconnecting.is_none() {
            status.changed().await.unwrap();
        }
    });
    tokio::select! {
        taken = consumer.next_batch() => panic!("records without a server: {taken:?}"),
        waited = reconnecting => waited.unwrap(),
    }
    let second = ServerProcess::start(&args);
    proxy.set_backend(second.addr);
    let admin = Client::connect(second.addr).await.unwrap();
    publish(&admin, "t", 300).await;
    // Payloads 0..300 were published twice (before and after the restart): 600 records.
    let mut records = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while admin
        .lag("t", "g")
        .await
        .unwrap()
        .iter()
        .any(|row| row.lag > 0)
    {
        assert!(tokio::time::Instant::now() < deadline);
        for delivery in consumer.next_batch().await.unwrap() {
            seen.insert(
                std::str::from_utf8(&delivery.payload)
                    .unwrap()
                    .parse()
                    .unwrap(),
            );
            records += 1;
            delivery.ack().await.unwrap();
        }
    }
    assert_eq!(seen.len(), 300);
    assert!(records >= 500, "{records}");
    assert!(
        proxy.accepted() >= 2,
        "the consumer connected to the new server"
    );
    let status = consumer.status().borrow().clone();
    assert_eq!((status.rejoins, status.reconnecting), (1, None));
    let group = &admin.describe_topic("t").await.unwrap().groups[0];
    assert_eq!(group.members.len(), 1, "{group:?}");
}

#[tokio::test]
async fn the_assignment_is_watched_as_the_group_rebalances() {
    let server = TestServer::with_capacity(100).await;
    let admin = server.client().await;
    admin.create("t", 4).await.unwrap();
    let builder = Consumer::builder("t", "g").max_wait(Duration::from_millis(50));
    let mut first = builder
        .clone()
        .member("a")
        .start(server.client().await)
        .await
        .unwrap();
    let mut status = first.status();
    assert_eq!(status.borrow_and_update().assignment, vec![0, 1, 2, 3]);
    let second = builder
        .member("b")
        .start(server.client().await)
        .await
        .unwrap();
    assert_eq!(second.status().borrow().assignment, vec![1, 3]);
    // The first member sees its share shrink while it waits for records.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while status.borrow().assignment != vec![0, 2] {
        assert!(tokio::time::Instant::now() < deadline);
        assert!(first.next_batch().await.unwrap().is_empty());
    }
    assert!(status.has_changed().unwrap());
    // Dropped, the second member leaves: the first gets everything back.
    drop(second);
    while status.borrow().assignment != vec![0, 1, 2, 3] {
        assert!(tokio::time::Instant::now() < deadline);
        assert!(first.next_batch().await.unwrap().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_mode_commits_on_close_and_refetches_after_a_cut() {
    let server = TestServer::with_capacity(10_000).await;
    let proxy = Proxy::start(server.addr).await;
    let admin = server.client().await;
    admin.create("t", 3).await.unwrap();
    publish(&admin, "t", 3_000).await;
    let builder = Consumer::builder("t", "g")
        .mode(ConsumeMode::Fetch)
        .max_records(100)
        .max_wait(Duration::from_millis(100))
        .auto_commit(Some(Duration::from_millis(20)));
    let mut consumer = builder
        .clone()
        .start(Client::connect(proxy.addr).await.unwrap())
        .await
        .unwrap();
    let cutter = tokio::spawn(async move {
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(30)).await;
            proxy.cut();
        }
        proxy
    });
    let mut seen = BTreeSet::new();
    let mut stream = consumer.stream();
    while seen.len() < 3_000 {
        let delivery = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(!delivery.ack().await.unwrap(), "fetch mode acks nothing");
        seen.insert(std::str::from_utf8(&delivery.payload).unwrap().to_owned());
    }
    drop(stream);
    let _proxy = cutter.await.unwrap();
    consumer.close().await.unwrap();
    let lag = admin.lag("t", "g").await.unwrap();
    assert!(lag.iter().all(|row| row.lag == 0), "{lag:?}");
    // Committed on close: a new member of the group gets nothing again.
    let mut again = builder.start(admin.clone()).await.unwrap();
    assert!(again.next_batch().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_consumer_refused_for_good_says_why() {
    let server = TestServer::with_capacity(100).await;
    let error = Consumer::builder("nope", "g")
        .start(server.client().await)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("nope"), "{error}");
    let client = server.client().await;
    client.create("t", 1).await.unwrap();
    let error = Consumer::builder("t", "g")
        .max_records(65)
        .start(client.clone())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("1 to 64"), "{error}");
}

#[tokio::test]
async fn a_consumer_taking_over_a_member_id_gets_the_records_it_left_in_flight() {
    let server = TestServer::with_capacity(100).await;
    let admin = server.client().await;
    admin.create("t", 2).await.unwrap();
    admin.join("t", "g", "m").await.unwrap();
    publish(&admin, "t", 4).await;
    // An earlier process of member m took two records and died without acknowledging them.
    let taken = admin.poll("t", "g", "m", 2).await.unwrap();
    assert_eq!(taken.len(), 2);
    let mut consumer = Consumer::builder("t", "g")
        .member("m")
        .start(server.client().await)
        .await
        .unwrap();
    let seen = consume_all(&mut consumer, 4, Duration::from_secs(10)).await;
    assert_eq!(seen, (0..4).collect());
}

#[tokio::test]
async fn acknowledgements_queued_with_ack_later_ride_on_the_next_poll_and_on_close() {
    let server = TestServer::with_capacity(1_000).await;
    let admin = server.client().await;
    admin.create("t", 2).await.unwrap();
    let mut consumer = Consumer::builder("t", "g")
        .start(server.client().await)
        .await
        .unwrap();
    publish(&admin, "t", 200).await;
    let mut seen = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < 200 {
        assert!(tokio::time::Instant::now() < deadline, "{}", seen.len());
        // One record in flight per partition: the next poll delivers more only if it carried
        // the acknowledgements of this batch.
        for delivery in consumer.next_batch().await.unwrap() {
            assert!(seen.insert(delivery.offset * 2 + i64::from(delivery.partition)));
            delivery.ack_later();
        }
    }
    // The last batch's acknowledgements go on close.
    consumer.close().await.unwrap();
    let lag = admin.lag("t", "g").await.unwrap();
    assert!(lag.iter().all(|row| row.lag == 0), "{lag:?}");
}

#[tokio::test]
async fn a_fetch_consumer_taking_over_a_member_id_starts_from_the_committed_offsets() {
    let server = TestServer::with_capacity(100).await;
    let admin = server.client().await;
    admin.create("t", 1).await.unwrap();
    admin.join("t", "g", "m").await.unwrap();
    publish(&admin, "t", 4).await;
    // An earlier process of member m fetched two records and died before committing them.
    assert_eq!(admin.fetch("t", "g", "m", 2).await.unwrap().len(), 2);
    let mut consumer = Consumer::builder("t", "g")
        .member("m")
        .mode(ConsumeMode::Fetch)
        .start(server.client().await)
        .await
        .unwrap();
    let offsets: Vec<i64> = consumer
        .next_batch()
        .await
        .unwrap()
        .iter()
        .map(|delivery| delivery.offset)
        .collect();
    assert_eq!(offsets, [0, 1, 2, 3]);
}

#[tokio::test]
async fn commit_offsets_is_refused_in_ack_mode_and_moves_nothing() {
    let server = TestServer::with_capacity(100).await;
    let admin = server.client().await;
    admin.create("t", 1).await.unwrap();
    let mut consumer = Consumer::builder("t", "g")
        .member("a")
        .start(server.client().await)
        .await
        .unwrap();
    publish(&admin, "t", 5).await;
    let refused = consumer
        .commit_offsets(std::collections::BTreeMap::from([(0, 3)]))
        .await;
    match refused {
        Err(broker_client::Error::Broker(broker_client::BrokerError::InvalidArgument(why))) => {
            assert!(why.contains("fetch mode"), "{why}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(admin.committed("t", "g", 0).await.unwrap(), 0);
    consumer.close().await.unwrap();
}

/// The offsets of the records of the consumer's next batch.
async fn next_offsets(consumer: &mut Consumer) -> Vec<i64> {
    consumer
        .next_batch()
        .await
        .unwrap()
        .into_iter()
        .map(|delivery| delivery.offset)
        .collect()
}

/// A server whose topic `topic`, of one partition, holds `r0` to `r4`, and a client of it.
async fn five_records(topic: &str) -> (TestServer, Client) {
    let server = TestServer::with_capacity(1000).await;
    let client = server.client().await;
    client.create(topic, 1).await.unwrap();
    for i in 0..5 {
        client.publish(topic, 0, format!("r{i}")).await.unwrap();
    }
    (server, client)
}

/// A fetch-mode consumer, member `m1` of group `g` on `topic`, waiting `max_wait` for records
/// and committing by itself once an hour (so, in a test, only when told to or on close).
async fn fetch_consumer(client: &Client, topic: &str, max_wait: Duration) -> Consumer {
    Consumer::builder(topic, "g")
        .member("m1")
        .mode(ConsumeMode::Fetch)
        .max_wait(max_wait)
        .auto_commit(Some(Duration::from_secs(3600)))
        .start(client.clone())
        .await
        .unwrap()
}

/// Fetch mode: a `next_batch` given up on (a `select!` on a shutdown signal, a timeout) after
/// its fetch went out. The server moved the member's position past the records of that
/// answer; the next take gets the answer, and no commit moves past them meanwhile: every
/// record is handed out, once the consumer carries on.
#[tokio::test]
async fn fetch_mode_a_next_batch_given_up_on_loses_no_record() {
    let (_server, client) = five_records("t").await;
    let mut consumer = fetch_consumer(&client, "t", Duration::ZERO).await;
    // Polled once (its request goes out), then dropped: what a `select!` whose other branch
    // won does to it.
    let gave_up = futures::FutureExt::now_or_never(consumer.next_batch());
    assert!(gave_up.is_none());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut handed_out = Vec::new();
    for _ in 0..3 {
        handed_out.extend(next_offsets(&mut consumer).await);
    }
    consumer.close().await.unwrap();
    assert_eq!(handed_out, [0, 1, 2, 3, 4]);
}

/// Ack mode: a `next_batch` given up on leaves a record in flight to the member, which a poll
/// never hands to it again: the next take asks for it again (before, the partition stalled for
/// as long as the consumer lived).
#[tokio::test]
async fn ack_mode_a_next_batch_given_up_on_stalls_nothing() {
    let server = TestServer::with_capacity(1000).await;
    let client = server.client().await;
    client.create("a", 1).await.unwrap();
    for i in 0..3 {
        client.publish("a", 0, format!("r{i}")).await.unwrap();
    }
    let mut consumer = Consumer::builder("a", "g")
        .member("m1")
        .max_wait(Duration::ZERO)
        .start(client.clone())
        .await
        .unwrap();
    let first = consumer.next_batch().await.unwrap();
    assert_eq!(first.len(), 1);
    assert!(first[0].ack().await.unwrap());
    // Polled once (its request goes out), then dropped: what a `select!` whose other branch
    // won does to it.
    let gave_up = futures::FutureExt::now_or_never(consumer.next_batch());
    assert!(gave_up.is_none());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut later = Vec::new();
    for _ in 0..10 {
        for delivery in consumer.next_batch().await.unwrap() {
            later.push(delivery.offset);
            assert!(delivery.ack().await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(later, [1, 2]);
}

/// Ack mode: `Delivery::ack` cannot reach the server (three quick attempts) and answers
/// `false`, "it will be delivered again"; the server comes back before the consumer's next
/// request, which the client sends on a fresh connection without the consumer noticing a
/// loss. The record, still in flight to the member, is delivered again (before, its partition
/// never delivered again).
#[tokio::test]
async fn ack_mode_an_acknowledgement_not_reached_is_delivered_again() {
    let server = TestServer::with_capacity(1000).await;
    let direct = server.client().await;
    direct.create("s", 1).await.unwrap();
    for i in 0..3 {
        direct.publish("s", 0, format!("r{i}")).await.unwrap();
    }
    let proxy = Proxy::start(server.addr).await;
    let client = Client::connect(proxy.addr).await.unwrap();
    let mut consumer = Consumer::builder("s", "g")
        .member("m1")
        .max_wait(Duration::ZERO)
        .start(client)
        .await
        .unwrap();
    let first = consumer.next_batch().await.unwrap();
    assert_eq!(first.len(), 1);
    // The server goes away for a moment.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    proxy.set_backend(dead);
    proxy.cut();
    let acked = first[0].ack().await.unwrap();
    proxy.set_backend(server.addr);
    let mut later = Vec::new();
    for _ in 0..10 {
        later.extend(next_offsets(&mut consumer).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!acked);
    assert_eq!(later.first(), Some(&0), "{later:?}");
}

/// Fetch mode: a next_batch given up on while its fetch waits on the server (the usual case of a
/// `select!` against a shutdown signal or a timeout). The request stays on its way, and the
/// next take gets its answer: the record that arrives meanwhile is handed out. (A next take
/// that sent a request of its own left the first parked; it took the record, and its answer
/// was thrown away.)
#[tokio::test]
async fn fetch_mode_a_waiting_next_batch_given_up_on_loses_no_record() {
    let server = TestServer::with_capacity(1000).await;
    let client = server.client().await;
    client.create("t", 1).await.unwrap();
    let mut consumer = fetch_consumer(&client, "t", Duration::from_secs(2)).await;
    // Polled once (its waiting fetch goes out), then dropped.
    let gave_up = futures::FutureExt::now_or_never(consumer.next_batch());
    assert!(gave_up.is_none());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let publisher = {
        let client = client.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(600)).await;
            client.publish("t", 0, "r0").await.unwrap();
            tokio::time::sleep(Duration::from_millis(3000)).await;
            client.publish("t", 0, "r1").await.unwrap();
        })
    };
    let mut handed_out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(9);
    while std::time::Instant::now() < deadline && handed_out.len() < 2 {
        handed_out.extend(next_offsets(&mut consumer).await);
    }
    publisher.await.unwrap();
    consumer.close().await.unwrap();
    assert_eq!(handed_out, [0, 1], "record 0 was never handed out");
}

/// Fetch mode: after a next_batch given up on (`select!` on a shutdown signal, then `close`),
/// `close` commits what was handed out, and not past what the given-up take fetched.
#[tokio::test]
async fn fetch_mode_close_after_a_next_batch_given_up_on_commits_what_was_handed_out() {
    let (_server, client) = five_records("c").await;
    let mut consumer = fetch_consumer(&client, "c", Duration::ZERO).await;
    let mut handed_out = 0;
    while handed_out < 5 {
        handed_out += consumer.next_batch().await.unwrap().len();
    }
    // The shutdown signal wins the select!.
    let gave_up = futures::FutureExt::now_or_never(consumer.next_batch());
    assert!(gave_up.is_none());
    tokio::time::sleep(Duration::from_millis(200)).await;
    consumer.close().await.unwrap();
    assert_eq!(
        client.committed("c", "g", 0).await.unwrap(),
        5,
        "the records handed out are committed"
    );
}
