//! The `Producer` against a real server: records sent from many tasks at once are stored once
//! each, in order per partition, through connections cut under them and across a server
//! restart; a full partition is retried until the delivery timeout; a refusal comes at once.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use broker_client::{
    Client, KeyHash, Producer, ProducerError, PublishRecord, Retention, Stored, TopicSetting,
};
use broker_server::Config;
use broker_testkit::in_process::TestServer;
use broker_testkit::process::ServerProcess;
use broker_testkit::proxy::Proxy;
use futures::future::join_all;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Every record of `topic`, by partition, in offset order, as `(offset, payload)`.
async fn read_all(client: &Client, topic: &str) -> BTreeMap<i32, Vec<(i64, String)>> {
    client.join(topic, "reader", "r").await.unwrap();
    let mut read: BTreeMap<i32, Vec<(i64, String)>> = BTreeMap::new();
    loop {
        let records = client.fetch(topic, "reader", "r", 10_000).await.unwrap();
        if records.is_empty() {
            return read;
        }
        for record in records {
            let payload = String::from_utf8(record.payload.to_vec()).unwrap();
            read.entry(record.partition)
                .or_default()
                .push((record.offset, payload));
        }
    }
}

/// Checks that each `(payload, stored)` answered is stored exactly there, that nothing else
/// was stored, and that the records of each sender (`"<sender>-<i>"`) are in order on their
/// partition.
fn check_stored_once_in_order(
    answered: &[(String, Stored)],
    read: &BTreeMap<i32, Vec<(i64, String)>>,
) {
    let mut at: HashMap<(i32, i64), &str> = HashMap::new();
    for (partition, records) in read {
        for (offset, payload) in records {
            at.insert((*partition, *offset), payload);
        }
    }
    assert_eq!(at.len(), answered.len(), "records stored twice or lost");
    let mut last: HashMap<&str, (i32, i64, u64)> = HashMap::new();
    for (payload, stored) in answered {
        assert_eq!(
            at.get(&(stored.partition, stored.offset)).copied(),
            Some(payload.as_str()),
            "{stored:?}"
        );
    }
    for (partition, records) in read {
        for (offset, payload) in records {
            let (sender, index) = payload.split_once('-').unwrap();
            let index: u64 = index.parse().unwrap();
            if let Some((earlier_partition, _, earlier)) =
                last.insert(sender, (*partition, *offset, index))
            {
                assert_eq!(earlier_partition, *partition, "one key, one partition");
                assert!(earlier < index, "{sender}: {earlier} stored before {index}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_from_many_tasks_are_stored_once_in_order_through_cut_connections() {
    let server = TestServer::with_capacity(100_000).await;
    let proxy = Proxy::start(server.addr).await;
    let client = Client::connect(proxy.addr).await.unwrap();
    client.create("t", 4).await.unwrap();
    let producer = Producer::builder()
        .linger(Duration::from_millis(2))
        .batch_records(50)
        .build(client.clone());
    let senders = (0..8).map(|sender| {
        let producer = producer.clone();
        tokio::spawn(async move {
            let key = format!("key-{sender}");
            let sends: Vec<_> = (0..400)
                .map(|i| {
                    let payload = format!("s{sender}-{i}");
                    let sent = producer.send(
                        "t",
                        PublishRecord::keyed(Some(key.as_bytes()), payload.clone()),
                    );
                    async move { (payload, sent.await) }
                })
                .collect();
            join_all(sends).await
        })
    });
    let cutter = tokio::spawn({
        async move {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(15)).await;
                proxy.cut();
            }
            proxy
        }
    });
    let mut answered = Vec::new();
    for sender in join_all(senders).await {
        for (payload, stored) in sender.unwrap() {
            answered.push((payload, stored.unwrap()));
        }
    }
    let _proxy = cutter.await.unwrap();
    producer.flush().await;
    let read = read_all(&server.client().await, "t").await;
    check_stored_once_in_order(&answered, &read);
    assert_eq!(answered.len(), 3_200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_stored_once_across_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--capacity",
        "100000",
    ];
    let mut first = ServerProcess::start(&args);
    let proxy = Proxy::start(first.addr).await;
    let client = Client::connect(proxy.addr).await.unwrap();
    client.create("t", 3).await.unwrap();
    let producer = Producer::builder()
        .delivery_timeout(Duration::from_secs(30))
        .build(client.clone());
    let sending = {
        let producer = producer.clone();
        tokio::spawn(async move {
            let mut answered = Vec::new();
            for round in 0..40 {
                let sends: Vec<_> = (0..25)
                    .map(|i| {
                        let payload = format!("p{}-{}", i % 5, round * 25 + i);
                        let key = format!("{}", i % 5);
                        let sent = producer.send(
                            "t",
                            PublishRecord::keyed(Some(key.as_bytes()), payload.clone()),
                        );
                        async move { (payload, sent.await.unwrap()) }
                    })
                    .collect();
                answered.extend(join_all(sends).await);
            }
            answered
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.kill();
    let second = ServerProcess::start(&args);
    proxy.set_backend(second.addr);
    proxy.cut();
    let answered = sending.await.unwrap();
    let read = read_all(&Client::connect(second.addr).await.unwrap(), "t").await;
    check_stored_once_in_order(&answered, &read);
    assert_eq!(answered.len(), 1_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sent_again_after_a_timeout_is_stored_once() {
    let server = TestServer::with_capacity(100).await;
    let proxy = Proxy::start(server.addr).await;
    let client = Client::builder()
        .request_timeout(Duration::from_millis(100))
        .connect(proxy.addr)
        .await
        .unwrap();
    client.create("t", 1).await.unwrap();
    let producer = Producer::builder().build(client.clone());
    let before = proxy.bytes_to_server();
    let first = producer.send("t", PublishRecord::keyed(None, "warm"));
    assert_eq!(first.await.unwrap().offset, 0);
    let one_batch = proxy.bytes_to_server() - before;
    // The server's answers are held: the batch times out and is sent again, three times over.
    proxy.hold_replies();
    let start = proxy.bytes_to_server();
    let sent = tokio::spawn(producer.send("t", PublishRecord::keyed(None, "once")));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while proxy.bytes_to_server() < start + 3 * one_batch {
        assert!(tokio::time::Instant::now() < deadline, "no resends");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.release_replies();
    let stored = sent.await.unwrap().unwrap();
    assert_eq!(
        stored,
        Stored {
            partition: 0,
            offset: 1
        }
    );
    assert_eq!(server.client().await.end_offset("t", 0).await.unwrap(), 2);
}

#[tokio::test]
async fn a_full_partition_is_retried_until_the_delivery_timeout_then_reported() {
    let server = TestServer::with_capacity(2).await;
    let client = server.client().await;
    client.create("full", 1).await.unwrap();
    let producer = Producer::builder()
        .delivery_timeout(Duration::from_millis(300))
        .build(client.clone());
    for payload in ["a", "b"] {
        producer
            .send("full", PublishRecord::keyed(None, payload))
            .await
            .unwrap();
    }
    match producer.send("full", PublishRecord::keyed(None, "c")).await {
        Err(ProducerError::Full { topic, partition }) => {
            assert_eq!((topic.as_str(), partition), ("full", 0))
        }
        other => panic!("{other:?}"),
    }
    // Room made while it is retried: it is stored.
    client.join("full", "g", "m").await.unwrap();
    let patient = Producer::builder()
        .delivery_timeout(Duration::from_secs(20))
        .build(client.clone());
    let (stored, ()) = tokio::join!(
        patient.send("full", PublishRecord::keyed(None, "d")),
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let records = client.poll("full", "g", "m", 1).await.unwrap();
            assert!(client
                .ack("full", "g", "m", 0, records[0].offset)
                .await
                .unwrap());
        }
    );
    assert_eq!(
        stored.unwrap(),
        Stored {
            partition: 0,
            offset: 2
        }
    );
}

#[tokio::test]
async fn a_refused_record_fails_at_once() {
    let server = TestServer::with_capacity(10).await;
    let client = server.client().await;
    let producer = Producer::builder().build(client.clone());
    let unknown = producer.send("nope", PublishRecord::keyed(None, "x")).await;
    assert!(
        matches!(unknown, Err(ProducerError::Refused(_))),
        "{unknown:?}"
    );
    client.create("t", 2).await.unwrap();
    let no_partition = producer
        .send("t", PublishRecord::to_partition(5, "x"))
        .await;
    assert!(
        matches!(no_partition, Err(ProducerError::Refused(_))),
        "{no_partition:?}"
    );
    let stored = producer
        .send("t", PublishRecord::to_partition(1, "x"))
        .await
        .unwrap();
    assert_eq!(
        stored,
        Stored {
            partition: 1,
            offset: 0
        }
    );
    // Larger than a partition of its topic keeps: never stored, so not retried as if full
    // (the delivery timeout is two minutes).
    let settings = [
        TopicSetting::Retention(Retention::Limits),
        TopicSetting::MaxBytes(10),
    ];
    client
        .create_topic("small", 1, KeyHash::default(), &settings)
        .await
        .unwrap();
    let refused = tokio::time::timeout(
        Duration::from_secs(10),
        producer.send("small", PublishRecord::keyed(None, "0123456789x")),
    )
    .await
    .unwrap();
    match refused {
        Err(ProducerError::Refused(error)) => {
            assert!(error.to_string().contains("at most 10 bytes"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    let fits = producer.send("small", PublishRecord::keyed(None, "0123456789"));
    assert_eq!(fits.await.unwrap().offset, 0);
}

#[tokio::test]
async fn flush_waits_for_records_whose_send_was_dropped() {
    let server = TestServer::with_capacity(1_000).await;
    let client = server.client().await;
    client.create("t", 3).await.unwrap();
    let producer = Producer::builder().build(client.clone());
    for i in 0..300 {
        // Sent, never awaited: still stored, and still waited for by flush.
        drop(producer.send("t", PublishRecord::keyed(None, format!("r{i}"))));
    }
    tokio::time::timeout(Duration::from_secs(30), producer.flush())
        .await
        .expect("flush returned");
    let mut stored = 0;
    for partition in 0..3 {
        stored += client.end_offset("t", partition).await.unwrap();
    }
    assert_eq!(stored, 300);
}

#[tokio::test]
async fn records_sent_before_the_producer_is_dropped_go_at_once() {
    let server = TestServer::with_capacity(1_000).await;
    let client = server.client().await;
    client.create("t", 3).await.unwrap();
    // A linger far past the test's patience: only the producer's end sends them early.
    let producer = Producer::builder()
        .linger(Duration::from_secs(600))
        .build(client.clone());
    let sends: Vec<_> = (0..300)
        .map(|i| producer.send("t", PublishRecord::keyed(None, format!("r{i}"))))
        .collect();
    // Time to look the topic up and queue them on their partitions, where they linger.
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(producer);
    let answers = tokio::time::timeout(Duration::from_secs(30), join_all(sends))
        .await
        .expect("the records were sent when the producer was dropped");
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let mut stored = 0;
    for partition in 0..3 {
        stored += client.end_offset("t", partition).await.unwrap();
    }
    assert_eq!(stored, 300);
}

#[tokio::test]
async fn records_sent_with_a_report_are_each_reported_once_into_the_channel() {
    let server = TestServer::with_capacity(1_000).await;
    let client = server.client().await;
    client.create("t", 3).await.unwrap();
    let producer = Producer::builder().build(client.clone());
    let (deliveries, mut reports) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..300 {
        let record = PublishRecord::keyed(None, format!("r{i}"));
        producer.send_reported("t", record, i, &deliveries);
    }
    // A refusal is reported too, with its tag.
    producer.send_reported("nope", PublishRecord::keyed(None, "x"), 1_000, &deliveries);
    drop(deliveries);
    // flush waits for reported records as for awaited ones.
    tokio::time::timeout(Duration::from_secs(30), producer.flush())
        .await
        .expect("flush returned");
    let mut stored = BTreeMap::new();
    let mut refused = Vec::new();
    while let Some(report) = reports.recv().await {
        match report.result {
            Ok(at) => assert!(stored.insert(report.tag, at).is_none(), "reported twice"),
            Err(ProducerError::Refused(_)) => refused.push(report.tag),
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(refused, [1_000]);
    assert_eq!(stored.len(), 300);
    let read = read_all(&client, "t").await;
    for (tag, at) in &stored {
        let on_partition = &read[&at.partition];
        let found = on_partition.iter().find(|(offset, _)| *offset == at.offset);
        assert_eq!(
            found.map(|(_, payload)| payload.clone()),
            Some(format!("r{tag}"))
        );
    }
}

#[tokio::test]
async fn a_producers_error_is_the_crates_one_error_through_question_mark() {
    async fn send(producer: &Producer) -> Result<Stored, broker_client::Error> {
        Ok(producer
            .send("nope", PublishRecord::keyed(None, "x"))
            .await?)
    }
    let server = TestServer::with_capacity(10).await;
    let producer = Producer::builder().build(server.client().await);
    match send(&producer).await {
        Err(broker_client::Error::Producer(error)) => {
            assert!(matches!(*error, ProducerError::Refused(_)), "{error:?}");
            assert!(error.to_string().contains("nope"), "{error}");
        }
        other => panic!("{other:?}"),
    }
}
/// A burst to 16 partitions: each request holds the batches of as many partitions as fit in
/// the server's 10,000 records, the rest go in the next one (one request of 16,000 was
/// refused whole).
#[tokio::test]
async fn a_burst_over_many_partitions_goes_in_requests_the_server_takes() {
    let server = TestServer::with_capacity(100_000).await;
    let client = server.client().await;
    client.create("wide", 16).await.unwrap();
    let producer = Producer::builder().build(client.clone());
    let sends: Vec<_> = (0..16_000)
        .map(|i| producer.send("wide", PublishRecord::keyed(None, format!("r{i}"))))
        .collect();
    let results = join_all(sends).await;
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 16000 records refused; first: {}",
        failed.len(),
        failed[0]
    );
}

/// One record over the server's payload limit is refused alone, not with the records sent
/// beside it in the same request.
#[tokio::test]
async fn a_record_over_the_payload_limit_is_refused_alone() {
    let server = TestServer::start(Config {
        max_payload_bytes: 1000,
        ..Config::default()
    })
    .await;
    let client = server.client().await;
    client.create("t", 4).await.unwrap();
    let producer = Producer::builder().build(client.clone());
    let big = producer.send("t", PublishRecord::to_partition(0, vec![0u8; 2000]));
    let small: Vec<_> = (0..8)
        .map(|i| {
            producer.send(
                "t",
                PublishRecord::to_partition(i % 4, format!("small {i}")),
            )
        })
        .collect();
    assert!(big.await.is_err(), "the big one is refused, rightly");
    for (i, sent) in join_all(small).await.into_iter().enumerate() {
        assert!(sent.is_ok(), "small record {i}: {sent:?}");
    }
}

/// Serves `listener` in this process until the sender is used or dropped.
async fn serve(listener: TcpListener) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        broker_server::run(listener, Config::default(), async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (stop, task)
}

/// A server without a data directory restarts (a container restart): it no longer knows the
/// producer's numbering and refuses its next request whole; the producer numbers the
/// partitions anew under a new id and sends it again, and every later record is stored.
#[tokio::test]
async fn a_producer_numbers_anew_when_a_restarted_server_no_longer_knows_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, first) = serve(listener).await;
    let client = Client::connect(addr).await.unwrap();
    client.create("t", 1).await.unwrap();
    let producer = Producer::builder()
        .delivery_timeout(Duration::from_secs(20))
        .build(client.clone());
    for i in 0..3 {
        producer
            .send("t", PublishRecord::to_partition(0, format!("before {i}")))
            .await
            .unwrap();
    }
    stop.send(()).unwrap();
    first.await.unwrap();
    let listener = TcpListener::bind(addr).await.unwrap();
    let (_stop, _second) = serve(listener).await;
    let mut created = None;
    for _ in 0..10 {
        match client.create("t", 1).await {
            Ok(c) => {
                created = Some(c);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(created, Some(true));
    for i in 0..3 {
        let sent = producer
            .send("t", PublishRecord::to_partition(0, format!("after {i}")))
            .await;
        assert!(sent.is_ok(), "record {i} after the restart: {sent:?}");
    }
}

/// A proxy to `backend` whose first connection loses the answer to its first publish (its
/// third frame from the server) and closes, whose second refuses the hello, and whose later
/// ones pass everything.
async fn lossy_then_refusing_proxy(backend: std::net::SocketAddr) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::codec::Encoder;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut accepted = 0;
        loop {
            let (mut client, _) = listener.accept().await.unwrap();
            accepted += 1;
            match accepted {
                2 => {
                    let mut hello = vec![0u8; 4];
                    client.read_exact(&mut hello).await.unwrap();
                    let len = u32::from_be_bytes(hello[..4].try_into().unwrap()) as usize;
                    let mut body = vec![0u8; len];
                    client.read_exact(&mut body).await.unwrap();
                    let mut out = bytes::BytesMut::new();
                    broker_proto::ServerHandshakeCodec::new(65536)
                        .encode(
                            broker_proto::HelloReply::Refused(
                                broker_proto::ErrorReply::Unauthenticated("token rotated".into()),
                            ),
                            &mut out,
                        )
                        .unwrap();
                    client.write_all(&out).await.unwrap();
                    drop(client);
                }
                n => {
                    let server = tokio::net::TcpStream::connect(backend).await.unwrap();
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    });
                    tokio::spawn(async move {
                        let mut frames = 0;
                        loop {
                            let mut head = [0u8; 4];
                            if sr.read_exact(&mut head).await.is_err() {
                                break;
                            }
                            let len = u32::from_be_bytes(head) as usize;
                            let mut body = vec![0u8; len];
                            if sr.read_exact(&mut body).await.is_err() {
                                break;
                            }
                            frames += 1;
                            if n == 1 && frames == 3 {
                                // The publish's answer: lost with the connection.
                                break;
                            }
                            if cw.write_all(&head).await.is_err()
                                || cw.write_all(&body).await.is_err()
                            {
                                break;
                            }
                        }
                        up.abort();
                    });
                }
            }
        }
    });
    addr
}

/// A publish applied but whose answer was lost, then a reconnection refused: the request's fate
/// is unknown, so the refusal does not say its record was not stored; it is sent again until
/// answered (as a repeat, at the offset it got), and the next record is stored after it.
/// (It was answered refused, and its numbers used again: the next record was taken for a
/// repeat of it, answered "stored" and never stored.)
#[tokio::test]
async fn a_refusal_after_a_lost_answer_does_not_say_the_record_was_not_stored() {
    let server = TestServer::with_capacity(1000).await;
    let direct = server.client().await;
    direct.create("t", 1).await.unwrap();
    let proxy = lossy_then_refusing_proxy(server.addr).await;
    let client = Client::connect(proxy).await.unwrap();
    let producer = Producer::builder().build(client);
    let first = producer
        .send("t", PublishRecord::to_partition(0, "A"))
        .await
        .unwrap();
    let second = producer
        .send("t", PublishRecord::to_partition(0, "B"))
        .await
        .unwrap();
    assert_eq!((first.offset, second.offset), (0, 1));
    let stored: Vec<(i64, String)> = direct
        .read("t", 0, 0, 100, Duration::ZERO)
        .await
        .unwrap()
        .records
        .into_iter()
        .map(|r| (r.offset, String::from_utf8_lossy(&r.payload).into_owned()))
        .collect();
    assert_eq!(stored, [(0, "A".to_owned()), (1, "B".to_owned())]);
}

/// "Never give up" (`Duration::MAX`, as Kafka users set `delivery.timeout.ms`) is taken.
#[tokio::test]
async fn an_unbounded_delivery_timeout_is_taken() {
    let server = TestServer::with_capacity(1000).await;
    let client = server.client().await;
    client.create("t", 1).await.unwrap();
    let producer = Producer::builder()
        .delivery_timeout(Duration::MAX)
        .build(client);
    let sent = tokio::spawn(async move {
        producer
            .send("t", PublishRecord::to_partition(0, "x"))
            .await
    })
    .await;
    assert!(matches!(sent, Ok(Ok(_))), "{sent:?}");
}

/// A connect timeout of `Duration::MAX` ("never") is taken.
#[tokio::test]
async fn an_unbounded_connect_timeout_is_taken() {
    let server = TestServer::with_capacity(1000).await;
    let addr = server.addr;
    let connected = tokio::spawn(async move {
        Client::builder()
            .connect_timeout(Duration::MAX)
            .connect(addr)
            .await
            .map(drop)
    })
    .await;
    assert!(matches!(connected, Ok(Ok(()))), "{connected:?}");
}
