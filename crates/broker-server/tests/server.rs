//! In-process end-to-end tests of the server over real TCP on 127.0.0.1:0.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use broker_core::{Command, Outcome};
use broker_proto::{
    ClientCodec, ClientHandshakeCodec, ErrorReply, Hello, HelloReply, RequestFrame, MAGIC,
    OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use broker_server::Config;
use broker_testkit::in_process::TestServer;
use broker_testkit::raw::*;
use bytes::{BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::codec::{Encoder, Framed};

/// The server's reply to `hello`, and whether it closed the connection then (only asked of a
/// refusal: a welcomed connection stays open).
async fn hello_reply(server: &TestServer, hello: Hello) -> (HelloReply, bool) {
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let mut framed = Framed::new(stream, ClientHandshakeCodec::new(1 << 20));
    framed.send(hello).await.unwrap();
    let reply = match framed.next().await.unwrap().unwrap() {
        broker_proto::Decoded::Message(reply) => reply,
        other => panic!("unexpected {other:?}"),
    };
    let closed = match reply {
        HelloReply::Refused(_) => framed.next().await.is_none(),
        HelloReply::Welcome { .. } => false,
    };
    (reply, closed)
}

#[tokio::test]
async fn handshake_welcomes_a_good_hello() {
    let server = TestServer::start(Config::default()).await;
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let mut framed = Framed::new(stream, ClientHandshakeCodec::new(1 << 20));
    framed
        .send(Hello::new("test", Some("any token".into())))
        .await
        .unwrap();
    match framed.next().await.unwrap().unwrap() {
        broker_proto::Decoded::Message(HelloReply::Welcome {
            version,
            server: name,
            limits,
        }) => {
            assert_eq!(version, PROTOCOL_VERSION);
            assert!(name.starts_with("broker-server/"));
            assert_eq!(limits, Config::default().limits());
        }
        other => panic!("unexpected {other:?}"),
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn handshake_refuses_bad_magic_and_version_and_closes() {
    let server = TestServer::start(Config::default()).await;
    let bad_magic = Hello {
        magic: *b"KAFK",
        ..Hello::new("test", None)
    };
    let bad_version = Hello {
        version: 0,
        ..Hello::new("test", None)
    };
    for hello in [bad_magic, bad_version] {
        let (reply, closed) = hello_reply(&server, hello).await;
        assert!(
            matches!(
                reply,
                HelloReply::Refused(ErrorReply::UnsupportedProtocol(_))
            ),
            "{reply:?}"
        );
        assert!(closed);
    }
    assert_eq!(MAGIC, *b"BRKR");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn each_client_is_welcomed_in_its_version_and_a_newer_one_in_the_servers_newest() {
    let server = TestServer::start(Config::default()).await;
    for (asked, welcomed) in [
        (OLDEST_PROTOCOL_VERSION, OLDEST_PROTOCOL_VERSION),
        (PROTOCOL_VERSION, PROTOCOL_VERSION),
        (PROTOCOL_VERSION + 1, PROTOCOL_VERSION),
    ] {
        let hello = Hello {
            version: asked,
            ..Hello::new("test", None)
        };
        let (reply, _) = hello_reply(&server, hello).await;
        match reply {
            HelloReply::Welcome { version, .. } => assert_eq!(version, welcomed, "{asked}"),
            other => panic!("{asked}: {other:?}"),
        }
    }
    server.stop().await.unwrap();
}

/// A version 1 client and a version 2 client share one broker: each speaks its own version,
/// the version 1 client's records come without the fields version 2 added, and a command
/// version 1 does not have is malformed on its connection, which stays usable.
#[tokio::test]
async fn version_1_and_version_2_clients_share_a_broker() {
    let server = TestServer::start(Config::default()).await;
    let mut new = connect(server.addr).await;
    let mut old = connect_v1(server.addr).await;
    assert_eq!(
        call(&mut new, create("mixed", 1)).await,
        Ok(Outcome::Created(true))
    );
    let with_header = broker_core::PublishRecord {
        headers: vec![broker_core::Header {
            name: "trace".into(),
            value: Some(bytes::Bytes::from_static(b"t-1")),
        }],
        ..broker_core::PublishRecord::to_partition(0, "from v2")
    };
    let published = call(
        &mut new,
        broker_core::Command::PublishBatch {
            topic: "mixed".into(),
            records: vec![with_header],
        },
    )
    .await;
    assert_eq!(published, Ok(Outcome::PublishedBatch(vec![(0, 0)])));
    old.send(broker_proto::v1::RequestFrame {
        correlation_id: 3,
        max_wait_ms: 0,
        command: broker_core::v1::Command::Join {
            topic: "mixed".into(),
            group: "g".into(),
            member: "m".into(),
            assignor: None,
        },
    })
    .await
    .unwrap();
    old.send(broker_proto::v1::RequestFrame {
        correlation_id: 4,
        max_wait_ms: 0,
        command: broker_core::v1::Command::Poll {
            topic: "mixed".into(),
            group: "g".into(),
            member: "m".into(),
            max_records: 1,
            max_bytes: None,
        },
    })
    .await
    .unwrap();
    let mut answers = Vec::new();
    for _ in 0..2 {
        match old.next().await.unwrap().unwrap() {
            broker_proto::Decoded::Message(response) => answers.push(response),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        answers[1].result,
        Ok(broker_core::v1::Outcome::Records(vec![
            broker_core::v1::BrokerRecord {
                topic: "mixed".into(),
                partition: 0,
                offset: 0,
                key: None,
                payload: bytes::Bytes::from_static(b"from v2"),
            }
        ]))
    );
    // DeleteTopic is command 19, which version 1 does not have.
    let mut frame = bytes::BytesMut::new();
    frame.extend_from_slice(&5u64.to_le_bytes());
    frame.extend_from_slice(&0u32.to_le_bytes());
    frame.extend_from_slice(&19u32.to_le_bytes());
    frame.extend_from_slice(&5u64.to_le_bytes());
    frame.extend_from_slice(b"mixed");
    let stream = old.get_mut();
    stream
        .write_all(&(frame.len() as u32).to_be_bytes())
        .await
        .unwrap();
    stream.write_all(&frame).await.unwrap();
    match old.next().await.unwrap().unwrap() {
        broker_proto::Decoded::Message(response) => {
            assert_eq!(response.correlation_id, 5);
            assert!(
                matches!(response.result, Err(ErrorReply::MalformedRequest(_))),
                "{response:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    // The topic is still there, and version 2 can delete it.
    assert_eq!(
        call(
            &mut new,
            broker_core::Command::DeleteTopic {
                topic: "mixed".into()
            }
        )
        .await,
        Ok(Outcome::Deleted(true))
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn garbage_hello_is_refused() {
    let server = TestServer::start(Config::default()).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(&[0, 0, 0, 3, 1, 2, 3]).await.unwrap();
    let mut framed = Framed::new(stream, ClientHandshakeCodec::new(1 << 20));
    match framed.next().await.unwrap().unwrap() {
        broker_proto::Decoded::Message(HelloReply::Refused(ErrorReply::UnsupportedProtocol(_))) => {
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(framed.next().await.is_none());
    server.stop().await.unwrap();
}

#[tokio::test]
async fn create_publish_poll_ack_round_trip() {
    let server = TestServer::start(Config::default()).await;
    let mut client = connect(server.addr).await;
    assert_eq!(
        call(&mut client, create("orders", 2)).await,
        Ok(Outcome::Created(true))
    );
    assert_eq!(
        call(&mut client, publish("orders", 1, "a")).await,
        Ok(Outcome::Published(0))
    );
    assert_eq!(
        call(&mut client, join("orders", "billing", "m1")).await,
        Ok(Outcome::Partitions(vec![0, 1]))
    );
    let got = records(call(&mut client, poll("orders", "billing", "m1", 10)).await);
    assert_eq!(got, vec![(1, 0, Bytes::from_static(b"a"))]);
    assert_eq!(
        call(&mut client, ack("orders", "billing", "m1", 1, 0)).await,
        Ok(Outcome::Acked(true))
    );
    assert_eq!(
        call(&mut client, ack("orders", "billing", "m1", 1, 0)).await,
        Ok(Outcome::Acked(false))
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn validation_errors_come_back_as_invalid_argument() {
    let server = TestServer::start(Config::default()).await;
    let mut client = connect(server.addr).await;
    for command in [
        create("bad topic", 1),
        create("t", 0),
        publish("missing", 0, "x"),
        poll("missing", "g", "m", 1),
    ] {
        assert!(matches!(
            call(&mut client, command).await,
            Err(ErrorReply::InvalidArgument(_))
        ),);
    }
    // The connection is still fine.
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_thousand_pipelined_requests_are_all_answered() {
    let server = TestServer::start(Config::default()).await;
    let mut client = connect(server.addr).await;
    assert_eq!(
        call(&mut client, create("t", 4)).await,
        Ok(Outcome::Created(true))
    );
    for id in 1..=1000u64 {
        client
            .feed(RequestFrame {
                correlation_id: id,
                max_wait_ms: 0,
                command: Command::EndOffset {
                    topic: "t".into(),
                    partition: (id % 4) as i32,
                },
            })
            .await
            .unwrap();
    }
    SinkExt::<RequestFrame>::flush(&mut client).await.unwrap();
    for id in 1..=1000u64 {
        let response = recv(&mut client).await;
        assert_eq!(response.correlation_id, id);
        assert_eq!(response.result, Ok(Outcome::Offset(0)));
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn pipelining_past_the_in_flight_limit_is_throttled_not_refused() {
    let config = Config {
        max_in_flight: 3,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut client = connect(server.addr).await;
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    for id in 1..=200u64 {
        client
            .feed(RequestFrame {
                correlation_id: id,
                max_wait_ms: 0,
                command: publish("t", 0, "x"),
            })
            .await
            .unwrap();
    }
    SinkExt::<RequestFrame>::flush(&mut client).await.unwrap();
    for id in 1..=200u64 {
        let response = recv(&mut client).await;
        assert_eq!(response.correlation_id, id);
        let expected = if id <= 100 { id as i64 - 1 } else { -1 };
        assert_eq!(response.result, Ok(Outcome::Published(expected)));
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_batch_of_frames_in_one_write_is_answered_in_order() {
    let server = TestServer::start(Config::default()).await;
    let mut client = connect(server.addr).await;
    let mut codec = ClientCodec::new(1 << 20);
    let mut bytes = BytesMut::new();
    let commands = [create("t", 1), publish("t", 0, "a"), publish("t", 0, "b")];
    for (id, command) in (10u64..).zip(commands) {
        let frame = RequestFrame {
            correlation_id: id,
            max_wait_ms: 0,
            command,
        };
        codec.encode(frame, &mut bytes).unwrap();
    }
    client.get_mut().write_all(&bytes).await.unwrap();
    let expected = [
        Outcome::Created(true),
        Outcome::Published(0),
        Outcome::Published(1),
    ];
    for (id, outcome) in (10u64..).zip(expected) {
        let response = recv(&mut client).await;
        assert_eq!(response.correlation_id, id);
        assert_eq!(response.result, Ok(outcome));
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_malformed_body_is_answered_and_the_connection_continues() {
    let server = TestServer::start(Config::default()).await;
    let mut client = connect(server.addr).await;
    let mut frame = BytesMut::new();
    frame.put_u32(16);
    frame.put_u64_le(42); // correlation id
    frame.put_u32_le(0); // max_wait_ms
    frame.put_u32_le(9_999); // no such command
    client.get_mut().write_all(&frame).await.unwrap();
    let response = recv(&mut client).await;
    assert_eq!(response.correlation_id, 42);
    assert!(matches!(
        response.result,
        Err(ErrorReply::MalformedRequest(_))
    ));
    // A body too short for a correlation id is answered to id 0.
    client
        .get_mut()
        .write_all(&[0, 0, 0, 2, 1, 2])
        .await
        .unwrap();
    let response = recv(&mut client).await;
    assert_eq!(response.correlation_id, 0);
    assert!(matches!(
        response.result,
        Err(ErrorReply::MalformedRequest(_))
    ));
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn an_oversized_length_prefix_closes_only_that_connection() {
    let server = TestServer::start(Config::default()).await;
    let mut other = connect(server.addr).await;
    assert_eq!(
        call(&mut other, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    assert_eq!(
        call(&mut other, publish("t", 0, "a")).await,
        Ok(Outcome::Published(0))
    );
    let before = call(&mut other, describe()).await;

    let mut bad = connect(server.addr).await;
    bad.get_mut()
        .write_all(&[0xFF, 0xFF, 0xFF, 0xFF, 1, 2, 3])
        .await
        .unwrap();
    let response = recv(&mut bad).await;
    assert_eq!(response.correlation_id, 0);
    assert!(matches!(
        response.result,
        Err(ErrorReply::TooLarge { ref what, .. }) if what == "frame"
    ));
    assert!(is_closed(&mut bad).await);

    assert_eq!(call(&mut other, describe()).await, before);
    assert_eq!(
        call(&mut other, publish("t", 0, "b")).await,
        Ok(Outcome::Published(1))
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn truncated_frames_and_mid_frame_disconnects_affect_no_one_else() {
    let server = TestServer::start(Config::default()).await;
    let mut other = connect(server.addr).await;
    assert_eq!(
        call(&mut other, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    let before = call(&mut other, describe()).await;

    // Half a frame, then the write side closes: the server sees EOF inside a frame.
    let mut truncated = connect(server.addr).await;
    truncated
        .get_mut()
        .write_all(&[0, 0, 0, 100, 1, 2, 3])
        .await
        .unwrap();
    truncated.get_mut().shutdown().await.unwrap();
    assert!(is_closed(&mut truncated).await);

    // Half a frame, then the whole connection goes away.
    let mut gone = connect(server.addr).await;
    gone.get_mut()
        .write_all(&[0, 0, 0, 100, 1, 2, 3])
        .await
        .unwrap();
    drop(gone);

    // Half a hello, then gone.
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(&[0, 0, 0, 50, 1]).await.unwrap();
    drop(stream);

    assert_eq!(call(&mut other, describe()).await, before);
    assert_eq!(
        call(&mut other, publish("t", 0, "a")).await,
        Ok(Outcome::Published(0))
    );
    let mut fresh = connect(server.addr).await;
    assert_eq!(
        call(&mut fresh, publish("t", 0, "b")).await,
        Ok(Outcome::Published(1))
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_payload_over_the_limit_is_refused_and_not_applied() {
    let config = Config {
        max_payload_bytes: 4,
        max_frame_bytes: 4 + 2 * 1024 * 1024,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut client = connect(server.addr).await;
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    assert_eq!(
        call(&mut client, publish("t", 0, "12345")).await,
        Err(ErrorReply::TooLarge {
            what: "payload".into(),
            size: 5,
            limit: 4
        })
    );
    let keyed = Command::PublishKeyed {
        topic: "t".into(),
        key: Some(Bytes::from_static(b"kk")),
        payload: Bytes::from_static(b"ppp"),
    };
    assert!(matches!(
        call(&mut client, keyed).await,
        Err(ErrorReply::TooLarge { .. })
    ));
    assert_eq!(
        call(&mut client, publish("t", 0, "1234")).await,
        Ok(Outcome::Published(0))
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_waiting_poll_is_woken_by_a_publish_and_does_not_block_its_connection() {
    let server = TestServer::start(Config::default()).await;
    let mut consumer = connect(server.addr).await;
    let mut producer = connect(server.addr).await;
    assert_eq!(
        call(&mut consumer, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    assert!(call(&mut consumer, join("t", "g", "m")).await.is_ok());

    send(&mut consumer, 1, 60_000, poll("t", "g", "m", 1)).await;
    // A later request on the same connection is answered while the poll waits, which also
    // proves the poll is parked before the publish below.
    send(
        &mut consumer,
        2,
        0,
        Command::EndOffset {
            topic: "t".into(),
            partition: 0,
        },
    )
    .await;
    let response = recv(&mut consumer).await;
    assert_eq!(
        (response.correlation_id, response.result),
        (2, Ok(Outcome::Offset(0)))
    );

    assert_eq!(
        call(&mut producer, publish("t", 0, "hi")).await,
        Ok(Outcome::Published(0))
    );
    let response = recv(&mut consumer).await;
    assert_eq!(response.correlation_id, 1);
    assert_eq!(
        records(response.result),
        vec![(0, 0, Bytes::from_static(b"hi"))]
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_waiting_fetch_is_woken_by_a_keyed_publish() {
    let server = TestServer::start(Config::default()).await;
    let mut consumer = connect(server.addr).await;
    let mut producer = connect(server.addr).await;
    assert_eq!(
        call(&mut consumer, create("t", 2)).await,
        Ok(Outcome::Created(true))
    );
    assert!(call(&mut consumer, join("t", "g", "m")).await.is_ok());
    let fetch = Command::Fetch {
        topic: "t".into(),
        group: "g".into(),
        member: "m".into(),
        max_records: 100,
        max_bytes: None,
    };
    send(&mut consumer, 1, 60_000, fetch).await;
    send(&mut consumer, 2, 0, describe()).await;
    assert_eq!(recv(&mut consumer).await.correlation_id, 2);
    let keyed = Command::PublishKeyed {
        topic: "t".into(),
        key: None,
        payload: Bytes::from_static(b"k"),
    };
    assert!(call(&mut producer, keyed).await.is_ok());
    let response = recv(&mut consumer).await;
    assert_eq!(response.correlation_id, 1);
    assert_eq!(records(response.result).len(), 1);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_waiting_poll_is_woken_by_an_ack_or_a_retry() {
    let server = TestServer::start(Config::default()).await;
    let mut consumer = connect(server.addr).await;
    let mut other = connect(server.addr).await;
    assert_eq!(
        call(&mut consumer, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    assert!(call(&mut consumer, join("t", "g", "m")).await.is_ok());
    for payload in ["a", "b"] {
        assert!(call(&mut consumer, publish("t", 0, payload)).await.is_ok());
    }
    // Record 0 in flight: nothing else is eligible, so the next poll waits.
    assert_eq!(
        records(call(&mut consumer, poll("t", "g", "m", 1)).await).len(),
        1
    );
    send(&mut consumer, 1, 60_000, poll("t", "g", "m", 1)).await;
    send(&mut consumer, 2, 0, describe()).await;
    assert_eq!(recv(&mut consumer).await.correlation_id, 2);
    // A retry from another connection makes record 0 eligible again.
    assert_eq!(
        call(&mut other, retry("t", "g", "m", 0, 0)).await,
        Ok(Outcome::Retried(true))
    );
    let response = recv(&mut consumer).await;
    assert_eq!(response.correlation_id, 1);
    assert_eq!(
        records(response.result),
        vec![(0, 0, Bytes::from_static(b"a"))]
    );

    // Record 0 in flight again; an ack makes record 1 eligible.
    send(&mut consumer, 3, 60_000, poll("t", "g", "m", 1)).await;
    send(&mut consumer, 4, 0, describe()).await;
    assert_eq!(recv(&mut consumer).await.correlation_id, 4);
    assert_eq!(
        call(&mut other, ack("t", "g", "m", 0, 0)).await,
        Ok(Outcome::Acked(true))
    );
    let response = recv(&mut consumer).await;
    assert_eq!(response.correlation_id, 3);
    assert_eq!(
        records(response.result),
        vec![(0, 1, Bytes::from_static(b"b"))]
    );
    server.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_waiting_poll_times_out_with_no_records() {
    let server = TestServer::start(Config::default()).await;
    let mut client = connect(server.addr).await;
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    assert!(call(&mut client, join("t", "g", "m")).await.is_ok());
    let start = Instant::now();
    send(&mut client, 1, 5_000, poll("t", "g", "m", 1)).await;
    let response = recv(&mut client).await;
    assert_eq!(response.correlation_id, 1);
    assert_eq!(records(response.result), vec![]);
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(5), "{waited:?}");
    assert!(waited < Duration::from_secs(6), "{waited:?}");
    server.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_waiting_poll_is_capped_by_the_server_max_wait() {
    let config = Config {
        max_wait: Duration::from_secs(2),
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut client = connect(server.addr).await;
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    let start = Instant::now();
    send(&mut client, 1, u32::MAX, poll("t", "g", "m", 1)).await;
    assert_eq!(records(recv(&mut client).await.result), vec![]);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    server.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_silent_member_is_removed_after_the_session_timeout() {
    let config = Config {
        session_timeout: Duration::from_secs(10),
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut crashed = connect(server.addr).await;
    let mut alive = connect(server.addr).await;
    assert_eq!(
        call(&mut alive, create("t", 2)).await,
        Ok(Outcome::Created(true))
    );
    assert_eq!(
        call(&mut crashed, join("t", "g", "a")).await,
        Ok(Outcome::Partitions(vec![0, 1]))
    );
    assert_eq!(
        call(&mut alive, join("t", "g", "b")).await,
        Ok(Outcome::Partitions(vec![1]))
    );
    assert!(call(&mut alive, publish("t", 0, "for a")).await.is_ok());
    let start = Instant::now();
    // "b" waits on a poll (which keeps it alive) while "a" goes silent: once "a" times out, the
    // rebalance hands partition 0 to "b" and wakes its poll.
    send(&mut alive, 1, 60_000, poll("t", "g", "b", 10)).await;
    let response = recv(&mut alive).await;
    assert_eq!(response.correlation_id, 1);
    assert_eq!(
        records(response.result),
        vec![(0, 0, Bytes::from_static(b"for a"))]
    );
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(10), "{waited:?}");
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    assert_eq!(
        call(&mut alive, assignment("t", "g", "b")).await,
        Ok(Outcome::Partitions(vec![0, 1]))
    );
    assert_eq!(
        call(&mut alive, assignment("t", "g", "a")).await,
        Ok(Outcome::Partitions(vec![]))
    );
    server.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn requests_naming_a_member_keep_it_alive() {
    let config = Config {
        session_timeout: Duration::from_secs(10),
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut client = connect(server.addr).await;
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    assert!(call(&mut client, join("t", "g", "a")).await.is_ok());
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(
            call(&mut client, assignment("t", "g", "a")).await,
            Ok(Outcome::Partitions(vec![0]))
        );
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn members_leave_when_their_connection_closes_if_configured() {
    let config = Config {
        leave_on_disconnect: true,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut leaving = connect(server.addr).await;
    let mut staying = connect(server.addr).await;
    assert_eq!(
        call(&mut staying, create("t", 2)).await,
        Ok(Outcome::Created(true))
    );
    assert!(call(&mut leaving, join("t", "g", "a")).await.is_ok());
    assert_eq!(
        call(&mut staying, join("t", "g", "b")).await,
        Ok(Outcome::Partitions(vec![1]))
    );
    assert!(call(&mut staying, publish("t", 0, "for a")).await.is_ok());
    send(&mut staying, 1, 60_000, poll("t", "g", "b", 10)).await;
    send(&mut staying, 2, 0, describe()).await;
    assert_eq!(recv(&mut staying).await.correlation_id, 2);
    drop(leaving);
    let response = recv(&mut staying).await;
    assert_eq!(response.correlation_id, 1);
    assert_eq!(
        records(response.result),
        vec![(0, 0, Bytes::from_static(b"for a"))]
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn members_stay_when_their_connection_closes_by_default() {
    let server = TestServer::start(Config::default()).await;
    let mut leaving = connect(server.addr).await;
    let mut staying = connect(server.addr).await;
    assert_eq!(
        call(&mut staying, create("t", 2)).await,
        Ok(Outcome::Created(true))
    );
    assert!(call(&mut leaving, join("t", "g", "a")).await.is_ok());
    drop(leaving);
    // A new connection is served after the old one is gone; "a" is still a member.
    let mut again = connect(server.addr).await;
    assert_eq!(
        call(&mut again, assignment("t", "g", "a")).await,
        Ok(Outcome::Partitions(vec![0, 1]))
    );
    drop(staying);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn shutdown_answers_parked_polls_and_returns_ok() {
    let server = TestServer::start(Config::default()).await;
    let mut client = connect(server.addr).await;
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    assert!(call(&mut client, join("t", "g", "m")).await.is_ok());
    send(&mut client, 1, 60_000, poll("t", "g", "m", 1)).await;
    send(&mut client, 2, 0, describe()).await;
    assert_eq!(recv(&mut client).await.correlation_id, 2);
    let start = std::time::Instant::now();
    server.stop().await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    let response = recv(&mut client).await;
    assert_eq!(response.correlation_id, 1);
    assert_eq!(records(response.result), vec![]);
    assert!(is_closed(&mut client).await);
}

#[tokio::test]
async fn shutdown_with_idle_and_half_open_connections_returns_ok() {
    let server = TestServer::start(Config::default()).await;
    let _idle = connect(server.addr).await;
    let _no_hello = TcpStream::connect(server.addr).await.unwrap();
    let start = std::time::Instant::now();
    server.stop().await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn run_refuses_an_invalid_config() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = Config {
        capacity: 0,
        ..Config::default()
    };
    let result = broker_server::run(listener, config, std::future::pending()).await;
    assert!(matches!(
        result,
        Err(broker_server::ServerError::InvalidConfig(_))
    ));
}

#[tokio::test]
async fn requests_in_the_same_write_as_the_hello_are_served() {
    let server = TestServer::start(Config::default()).await;
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let mut bytes = BytesMut::new();
    ClientHandshakeCodec::new(1 << 20)
        .encode(Hello::new("eager", None), &mut bytes)
        .unwrap();
    ClientCodec::new(1 << 20)
        .encode(
            RequestFrame {
                correlation_id: 5,
                max_wait_ms: 0,
                command: create("t", 1),
            },
            &mut bytes,
        )
        .unwrap();
    let mut framed = Framed::new(stream, ClientHandshakeCodec::new(1 << 20));
    framed.get_mut().write_all(&bytes).await.unwrap();
    assert!(matches!(
        framed.next().await.unwrap().unwrap(),
        broker_proto::Decoded::Message(HelloReply::Welcome { .. })
    ));
    let mut client: RawClient = framed.map_codec(|codec| codec.retype());
    let response = recv(&mut client).await;
    assert_eq!(response.correlation_id, 5);
    assert_eq!(response.result, Ok(Outcome::Created(true)));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_response_too_large_for_a_frame_is_refused() {
    let config = Config {
        max_payload_bytes: 1,
        max_frame_bytes: 1 + 2 * 1024 * 1024,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut client = connect(server.addr).await;
    // 1,000 topics of 64 partitions describe to more than 2 MiB.
    for id in 0..1000u64 {
        client
            .feed(RequestFrame {
                correlation_id: id,
                max_wait_ms: 0,
                command: create(&format!("topic-{id}"), 64),
            })
            .await
            .unwrap();
    }
    SinkExt::<RequestFrame>::flush(&mut client).await.unwrap();
    for id in 0..1000u64 {
        let response = recv(&mut client).await;
        assert_eq!(
            (response.correlation_id, response.result),
            (id, Ok(Outcome::Created(true)))
        );
    }
    send(&mut client, 1, 0, describe()).await;
    let response = recv(&mut client).await;
    assert_eq!(response.correlation_id, 1);
    assert!(
        matches!(response.result, Err(ErrorReply::TooLarge { ref what, .. }) if what == "response"),
        "{:?}",
        response.result.map(|_| ())
    );
    // The connection goes on.
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    server.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_never_says_hello_is_closed_after_10_seconds() {
    let server = TestServer::start(Config::default()).await;
    let start = Instant::now();
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let mut framed = Framed::new(stream, ClientHandshakeCodec::new(1 << 20));
    assert!(framed.next().await.is_none());
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(10), "{waited:?}");
    assert!(waited < Duration::from_secs(11), "{waited:?}");
    server.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn connections_past_the_cap_wait_for_a_free_slot() {
    let config = Config {
        max_connections: 1,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut first = connect(server.addr).await;
    assert_eq!(
        call(&mut first, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let mut second = Framed::new(stream, ClientHandshakeCodec::new(1 << 20));
    second.send(Hello::new("second", None)).await.unwrap();
    // Not accepted while the first connection holds the only slot (the paused clock makes
    // this minute pass at once).
    assert!(tokio::time::timeout(Duration::from_secs(60), second.next())
        .await
        .is_err());
    drop(first);
    assert!(matches!(
        second.next().await.unwrap().unwrap(),
        broker_proto::Decoded::Message(HelloReply::Welcome { .. })
    ));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn an_oversized_hello_is_refused() {
    let server = TestServer::start(Config::default()).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(&[0, 0x10, 0, 0]).await.unwrap();
    let mut framed = Framed::new(stream, ClientHandshakeCodec::new(1 << 20));
    assert!(matches!(
        framed.next().await.unwrap().unwrap(),
        broker_proto::Decoded::Message(HelloReply::Refused(ErrorReply::TooLarge { .. }))
    ));
    assert!(framed.next().await.is_none());
    server.stop().await.unwrap();
}

/// A poll whose answer is lost (the connection is reset before it is read) leaves its record in
/// flight to the member: polling again never hands it back, and a repeated join changes nothing.
/// `redeliver` gets it back, and the partition moves on.
#[tokio::test]
async fn a_member_gets_back_the_records_of_a_lost_poll_answer() {
    let server = TestServer::start(Config::default()).await;
    let mut client = connect(server.addr).await;
    assert_eq!(
        call(&mut client, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    for payload in ["a", "b", "c"] {
        assert!(call(&mut client, publish("t", 0, payload)).await.is_ok());
    }
    assert!(call(&mut client, join("t", "g", "m1")).await.is_ok());
    let mut lost = connect(server.addr).await;
    send(&mut lost, 1, 0, poll("t", "g", "m1", 8)).await;
    // Once the server has reserved the record, the connection dies before the answer is read.
    while in_flight(&mut client, "g").await.is_none() {
        tokio::task::yield_now().await;
    }
    let stream = lost.into_inner();
    stream.set_zero_linger().unwrap();
    drop(stream);
    assert!(call(&mut client, join("t", "g", "m1")).await.is_ok());
    assert_eq!(
        records(call(&mut client, poll("t", "g", "m1", 8)).await),
        vec![]
    );
    assert_eq!(
        records(call(&mut client, redeliver("t", "g", "m1", 8)).await),
        vec![(0, 0, Bytes::from_static(b"a"))]
    );
    assert_eq!(
        call(&mut client, ack("t", "g", "m1", 0, 0)).await,
        Ok(Outcome::Acked(true))
    );
    assert_eq!(
        records(call(&mut client, poll("t", "g", "m1", 8)).await),
        vec![(0, 1, Bytes::from_static(b"b"))]
    );
    server.stop().await.unwrap();
}

/// A poll parked before its member left and joined again does not count for the new session:
/// when it ends (its connection is reset) the member's new parked poll still protects it.
/// (Real time, with a short session timeout: the paused clock would jump over the parked polls'
/// waits while the test waits for the server's answers.)
#[tokio::test]
async fn a_poll_parked_by_an_earlier_session_does_not_unprotect_the_member() {
    let timeout = Duration::from_millis(300);
    let config = Config {
        session_timeout: timeout,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut first = connect(server.addr).await;
    let mut second = connect(server.addr).await;
    assert_eq!(
        call(&mut first, create("t", 1)).await,
        Ok(Outcome::Created(true))
    );
    assert!(call(&mut first, join("t", "g", "m")).await.is_ok());
    send(&mut first, 1, 60_000, poll("t", "g", "m", 1)).await;
    // Answered in order after the parked poll's arrival: it is parked now.
    assert!(call(&mut first, describe()).await.is_ok());
    assert_eq!(
        call(&mut second, leave("t", "g", "m")).await,
        Ok(Outcome::Left(true))
    );
    assert!(call(&mut second, join("t", "g", "m")).await.is_ok());
    send(&mut second, 1, 60_000, poll("t", "g", "m", 1)).await;
    assert!(call(&mut second, describe()).await.is_ok());
    let stream = first.into_inner();
    stream.set_zero_linger().unwrap();
    drop(stream);
    // Well past the session timeout: the member is still there, kept by its parked poll.
    tokio::time::sleep(5 * timeout).await;
    let mut observer = connect(server.addr).await;
    assert_eq!(
        call(&mut observer, assignment("t", "g", "m")).await,
        Ok(Outcome::Partitions(vec![0]))
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_failed_announcement_stops_what_the_server_started() {
    let broker = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = metrics.local_addr().unwrap();
    let listeners = broker_server::Listeners {
        broker,
        metrics: Some(metrics),
        kafka: None,
        console: None,
    };
    // An announcement that fails (the binary's only logs that it cannot print its addresses).
    let announce = || Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
    let run = broker_server::run_announced(
        listeners,
        Config::default(),
        None,
        std::future::pending(),
        announce,
    );
    let outcome = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the server returned");
    assert!(
        matches!(outcome, Err(broker_server::ServerError::Io(_))),
        "{outcome:?}"
    );
    // Nothing it started serves on: its metrics endpoint is closed.
    TcpStream::connect(metrics_addr)
        .await
        .expect_err("the metrics listener is closed");
}

/// With shards, a name a group gives as its dead-letter topic counts against the broker's
/// maximum of topics before its topic exists; once no group gives it any more (the group was
/// reconfigured with another), it counts no more: creating a topic is not refused for names
/// nobody gives.
#[tokio::test]
async fn dead_letter_names_no_group_gives_any_more_do_not_use_up_the_topic_limit() {
    use broker_core::{GroupSetting, Limits, TopicName};
    let server = TestServer::start(Config {
        shards: Some(2),
        limits: Limits {
            max_topics: 3,
            ..Limits::default()
        },
        ..Config::default()
    })
    .await;
    let mut client = connect(server.addr).await;
    let dead_letter = |name: &str| {
        vec![
            GroupSetting::MaxDeliveries(2),
            GroupSetting::DeadLetter(TopicName::new(name).unwrap()),
        ]
    };
    assert_eq!(
        call(&mut client, create("orders", 1)).await,
        Ok(Outcome::Created(true))
    );
    let joined = call(
        &mut client,
        Command::Join {
            topic: "orders".into(),
            group: "g".into(),
            member: "m".into(),
            assignor: None,
            settings: dead_letter("dl0"),
        },
    )
    .await;
    assert!(joined.is_ok(), "{joined:?}");
    for i in 1..=3 {
        let configured = call(
            &mut client,
            Command::ConfigureGroup {
                topic: "orders".into(),
                group: "g".into(),
                settings: dead_letter(&format!("dl{i}")),
            },
        )
        .await;
        assert!(
            matches!(configured, Ok(Outcome::GroupSettings(_))),
            "{configured:?}"
        );
    }
    // One topic exists and the group gives one name (dl3): two of three.
    assert_eq!(
        call(&mut client, create("other", 1)).await,
        Ok(Outcome::Created(true))
    );
    // Three now: the next is refused.
    assert!(matches!(
        call(&mut client, create("third", 1)).await,
        Err(broker_proto::ErrorReply::InvalidArgument(_))
    ));
}
