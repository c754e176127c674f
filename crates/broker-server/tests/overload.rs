//! Slow and greedy clients against the in-process server, on tokio's paused clock: a client
//! that sends a frame a byte at a time, one that never reads its responses, one that connects
//! and says nothing. Each is disconnected after its timeout, and other clients are served
//! meanwhile. (The connection cap is in `server.rs`, `connections_past_the_cap_wait_for_a_free_
//! slot`; repeated maximum-size frames against the real binary in `tests/hostile.rs`.)

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use broker_core::Outcome;
use broker_proto::{ClientCodec, ClientHandshakeCodec, HelloReply, RequestFrame};
use broker_server::Config;
use broker_testkit::in_process::TestServer;
use broker_testkit::raw::*;
use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::codec::{Encoder, Framed};

/// The bytes of one request frame.
fn frame(correlation_id: u64, command: broker_core::Command) -> Vec<u8> {
    let mut codec = ClientCodec::new(1 << 20);
    let mut bytes = BytesMut::new();
    codec
        .encode(
            RequestFrame {
                correlation_id,
                max_wait_ms: 0,
                command,
            },
            &mut bytes,
        )
        .unwrap();
    bytes.to_vec()
}

#[tokio::test(start_paused = true)]
async fn a_frame_sent_a_byte_at_a_time_is_dropped_and_stalls_no_one() {
    let config = Config {
        read_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut other = connect(server.addr).await;
    let slow = connect(server.addr).await.into_inner();
    let (mut slow_read, mut slow_write) = slow.into_split();
    let start = Instant::now();
    let (started, has_started) = oneshot::channel();
    let sender = tokio::spawn(async move {
        let bytes = frame(1, create("slow", 1));
        let mut started = Some(started);
        for (sent, byte) in bytes.iter().enumerate() {
            if slow_write.write_all(&[*byte]).await.is_err() {
                return sent;
            }
            if sent == 2 {
                started.take().unwrap().send(()).unwrap();
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        bytes.len()
    });
    has_started.await.unwrap();
    let served = Instant::now();
    // Mid-frame on one connection; the other is served at once.
    assert_eq!(
        call(&mut other, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    assert_eq!(
        call(&mut other, publish("t", 0, "a")).await,
        Ok(Outcome::Published(0))
    );
    assert_eq!(served.elapsed(), Duration::ZERO, "the other client waited");
    let mut rest = Vec::new();
    slow_read.read_to_end(&mut rest).await.unwrap_or_default();
    assert!(rest.is_empty(), "the slow frame was answered");
    let dropped_after = start.elapsed();
    assert!(
        dropped_after >= Duration::from_secs(5) && dropped_after <= Duration::from_secs(11),
        "{dropped_after:?}"
    );
    let sent = sender.await.unwrap();
    assert!(
        sent < frame(1, create("slow", 1)).len(),
        "the whole frame got through"
    );
    // The partial frame changed nothing.
    match call(&mut other, describe()).await {
        Ok(Outcome::Description(description)) => assert_eq!(description.topics.len(), 1),
        other => panic!("{other:?}"),
    }
    server.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_client_that_never_reads_is_disconnected_and_others_are_served() {
    let config = Config {
        max_connections: 2,
        write_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut other = connect(server.addr).await;
    // Eight topics of 64 partitions: every describe answer is tens of kilobytes.
    for topic in 0..8 {
        assert_eq!(
            call(&mut other, create(&format!("topic-{topic}"), 64)).await,
            Ok(Outcome::Created(true))
        );
    }
    let mut greedy = connect(server.addr).await.into_inner();
    let mut requests = Vec::new();
    for id in 0..1000 {
        requests.extend(frame(id, describe()));
    }
    greedy.write_all(&requests).await.unwrap();
    let start = Instant::now();
    // The greedy client holds the second connection slot and reads nothing; the other client
    // is served all along.
    for _ in 0..10 {
        assert!(matches!(
            call(&mut other, describe()).await,
            Ok(Outcome::Description(_))
        ));
    }
    // A third client gets in only once the greedy one has been disconnected.
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let mut third = Framed::new(stream, ClientHandshakeCodec::new(1 << 20));
    third
        .send(broker_proto::Hello::new("third", None))
        .await
        .unwrap();
    assert!(matches!(
        third.next().await.unwrap().unwrap(),
        broker_proto::Decoded::Message(HelloReply::Welcome { .. })
    ));
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(5), "{waited:?}");
    assert!(waited < Duration::from_secs(60), "{waited:?}");
    // What the greedy client finally reads stops short of its thousand answers.
    let mut answered = Vec::new();
    let _ = greedy.read_to_end(&mut answered).await;
    assert!(answered.len() < 1000 * 20_000, "{} bytes", answered.len());
    assert!(matches!(
        call(&mut other, describe()).await,
        Ok(Outcome::Description(_))
    ));
    server.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_after_the_idle_timeout() {
    let config = Config {
        idle_timeout: Duration::from_secs(10),
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut client = connect(server.addr).await;
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    let start = Instant::now();
    assert!(is_closed(&mut client).await);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
        "{waited:?}"
    );
    server.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_connection_waiting_for_an_answer_is_not_idle() {
    let config = Config {
        idle_timeout: Duration::from_secs(10),
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut client = connect(server.addr).await;
    call(&mut client, create("t", 1)).await.unwrap();
    call(&mut client, join("t", "g", "m")).await.unwrap();
    let start = Instant::now();
    send(&mut client, 9, 30_000, poll("t", "g", "m", 1)).await;
    let response = recv(&mut client).await;
    assert_eq!(response.correlation_id, 9);
    assert_eq!(records(response.result), vec![]);
    assert_eq!(start.elapsed(), Duration::from_secs(30));
    // Idle from the answer on.
    assert!(is_closed(&mut client).await);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(40) && waited < Duration::from_secs(41),
        "{waited:?}"
    );
    server.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_client_closed_for_idleness_reconnects_on_its_next_call() {
    let config = Config {
        idle_timeout: Duration::from_secs(10),
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let client = broker_client::Client::connect(server.addr.to_string().as_str())
        .await
        .unwrap();
    assert!(client.create("t", 1).await.unwrap());
    // Past the idle timeout: the server has closed the connection.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(client.publish("t", 0, "a").await.unwrap(), 0);
    server.stop().await.unwrap();
}

/// A request the broker refuses anyway (a poll asking for `i32::MAX` records, in a frame over
/// 64 KiB for its long group name) takes no more room for its answer than a frame, and no
/// more than the request memory leaves beside its own frame: it never waits for room that
/// cannot be free, at the head of the queue that every reader of records waits in.
#[tokio::test]
async fn a_poll_asking_for_too_much_does_not_hold_back_other_readers() {
    let server = TestServer::start(Config::default()).await;
    let mut setup = connect(server.addr).await;
    assert_eq!(
        call(&mut setup, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    assert_eq!(
        call(&mut setup, publish("t", 0, "a")).await,
        Ok(Outcome::Published(0))
    );
    let read = || broker_core::Command::Read {
        topic: "t".into(),
        partition: 0,
        offset: 0,
        max_records: 1,
        max_bytes: None,
    };
    let mut greedy = connect(server.addr).await;
    let poll = broker_core::Command::Poll {
        topic: "t".into(),
        group: "g".repeat(70_000),
        member: "m".into(),
        max_records: i32::MAX,
        max_bytes: None,
    };
    // Refused (the group name is too long), not left waiting.
    let refused = tokio::time::timeout(Duration::from_secs(10), call(&mut greedy, poll)).await;
    assert!(
        matches!(
            refused,
            Ok(Err(broker_proto::ErrorReply::InvalidArgument(_)))
        ),
        "{refused:?}"
    );
    let mut other = connect(server.addr).await;
    let answered = tokio::time::timeout(Duration::from_secs(10), call(&mut other, read())).await;
    assert!(
        matches!(answered, Ok(Ok(Outcome::Read(_)))),
        "a one-record read on another connection: {answered:?}"
    );
}
