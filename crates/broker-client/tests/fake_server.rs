//! The client against a scripted server speaking the protocol from `broker_proto`: response
//! matching, refused and odd handshakes, timeouts, undecodable or unexpected responses, lost
//! connections and reconnection, without depending on `broker-server`'s behaviour.

#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use broker_client::{Client, Error, ErrorReply, Outcome, ServerLimits};
use broker_core::Command;
use broker_proto::{
    Decoded, Hello, HelloReply, RequestFrame, ResponseFrame, ServerCodec, ServerHandshakeCodec,
    PROTOCOL_VERSION,
};
use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::{Decoder, Encoder};

const LIMITS: ServerLimits = ServerLimits {
    max_frame_bytes: 1024 * 1024,
    max_payload_bytes: 1024,
    max_in_flight: 64,
    max_wait_ms: 1000,
    session_timeout_ms: 30_000,
};

fn welcome(limits: ServerLimits) -> HelloReply {
    HelloReply::Welcome {
        version: PROTOCOL_VERSION,
        server: "fake-server/1".into(),
        limits,
    }
}

/// One accepted connection of the fake server, after the hello.
struct Peer {
    stream: TcpStream,
    buffer: BytesMut,
}

impl Peer {
    /// Reads the hello and answers it with `reply`.
    async fn accept(listener: &TcpListener, reply: HelloReply) -> (Peer, Hello) {
        let (stream, _) = listener.accept().await.unwrap();
        let mut peer = Peer {
            stream,
            buffer: BytesMut::new(),
        };
        let mut codec = ServerHandshakeCodec::new(1024 * 1024);
        let hello = match peer.read(&mut codec).await.unwrap() {
            Decoded::Message(hello) => hello,
            Decoded::Malformed { reason, .. } => panic!("bad hello: {reason}"),
        };
        let mut out = BytesMut::new();
        codec.encode(reply, &mut out).unwrap();
        peer.stream.write_all(&out).await.unwrap();
        (peer, hello)
    }

    async fn read<D: Decoder<Error = broker_proto::ProtocolError>>(
        &mut self,
        codec: &mut D,
    ) -> Option<D::Item> {
        loop {
            if let Some(item) = codec.decode(&mut self.buffer).unwrap() {
                return Some(item);
            }
            if self.stream.read_buf(&mut self.buffer).await.unwrap() == 0 {
                return None;
            }
        }
    }

    async fn request(&mut self) -> RequestFrame {
        match self
            .read(&mut ServerCodec::new(1024 * 1024, PROTOCOL_VERSION))
            .await
            .unwrap()
        {
            Decoded::Message(request) => request,
            Decoded::Malformed { reason, .. } => panic!("bad request: {reason}"),
        }
    }

    async fn respond(&mut self, correlation_id: u64, result: Result<Outcome, ErrorReply>) {
        let mut out = BytesMut::new();
        ServerCodec::new(1024 * 1024, PROTOCOL_VERSION)
            .encode(
                ResponseFrame {
                    correlation_id,
                    result,
                },
                &mut out,
            )
            .unwrap();
        self.stream.write_all(&out).await.unwrap();
    }
}

/// A fake server on an ephemeral port running `script` on its listener.
async fn fake<F, Fut>(script: F) -> SocketAddr
where
    F: FnOnce(TcpListener) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(script(listener));
    addr
}

fn end_offset(partition: i32) -> Command {
    Command::EndOffset {
        topic: "t".into(),
        partition,
    }
}

fn partition_of(request: &RequestFrame) -> i32 {
    match request.command {
        Command::EndOffset { partition, .. } => partition,
        ref other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn responses_in_reverse_order_reach_their_callers() {
    let addr = fake(|listener| async move {
        let (mut peer, hello) = Peer::accept(&listener, welcome(LIMITS)).await;
        assert_eq!(hello.client, "matching-test");
        let mut requests = Vec::new();
        for _ in 0..3 {
            requests.push(peer.request().await);
        }
        for request in requests.iter().rev() {
            let offset = i64::from(partition_of(request)) * 10;
            peer.respond(request.correlation_id, Ok(Outcome::Offset(offset)))
                .await;
        }
        // Keep the connection open until the client goes.
        let _ = peer
            .read(&mut ServerCodec::new(1024, PROTOCOL_VERSION))
            .await;
    })
    .await;
    let client = Client::builder()
        .client_name("matching-test")
        .connect(addr)
        .await
        .unwrap();
    assert_eq!(client.server_name(), "fake-server/1");
    assert_eq!(client.server_limits(), LIMITS);
    let calls: Vec<_> = (0..3)
        .map(|partition| {
            let client = client.clone();
            tokio::spawn(async move { client.end_offset("t", partition).await })
        })
        .collect();
    for (partition, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap().unwrap(), partition as i64 * 10);
    }
}

#[tokio::test]
async fn a_refused_hello_is_error_refused() {
    let addr = fake(|listener| async move {
        let reply = HelloReply::Refused(ErrorReply::Unauthenticated("no token".into()));
        let _ = Peer::accept(&listener, reply).await;
    })
    .await;
    assert!(matches!(
        Client::connect(addr).await,
        Err(Error::Refused(ErrorReply::Unauthenticated(_)))
    ));
}

#[tokio::test]
async fn a_welcome_for_another_protocol_version_is_a_protocol_error() {
    let addr = fake(|listener| async move {
        let reply = HelloReply::Welcome {
            version: PROTOCOL_VERSION + 1,
            server: "future".into(),
            limits: LIMITS,
        };
        let _ = Peer::accept(&listener, reply).await;
    })
    .await;
    assert!(matches!(
        Client::connect(addr).await,
        Err(Error::Protocol(_))
    ));
}

/// A server of protocol `version` that answers `requests` requests as a server of that version
/// would decode them: `Offset(7)` to those it decodes, `MalformedRequest` to the others.
async fn older_server(version: u16, requests: usize) -> SocketAddr {
    fake(move |listener| async move {
        let reply = HelloReply::Welcome {
            version,
            server: "older".into(),
            limits: LIMITS,
        };
        let (mut peer, hello) = Peer::accept(&listener, reply).await;
        assert_eq!(hello.version, PROTOCOL_VERSION);
        let mut codec = ServerCodec::new(1024 * 1024, version);
        for _ in 0..requests {
            match peer.read(&mut codec).await.unwrap() {
                Decoded::Message(request) => {
                    let outcome = Outcome::Offset(7);
                    peer.respond(request.correlation_id, Ok(outcome)).await;
                }
                Decoded::Malformed {
                    leading_u64,
                    reason,
                } => {
                    let reply = ErrorReply::MalformedRequest(reason);
                    peer.respond(leading_u64.unwrap(), Err(reply)).await;
                }
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_server_of_version_2_serves_every_call_but_the_version_3_ones() {
    let addr = older_server(2, 2).await;
    let client = Client::connect(addr).await.unwrap();
    assert_eq!(client.end_offset("t", 0).await.unwrap(), 7);
    match client.publish_idempotent("t", 1, vec![]).await {
        Err(Error::Server(ErrorReply::MalformedRequest(_))) => {}
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_server_of_version_8_refuses_a_change_of_topic_settings_naming_version_9() {
    let addr = older_server(8, 1).await;
    let client = Client::connect(addr).await.unwrap();
    let settings = [broker_client::TopicSetting::MaxRecords(5)];
    match client.configure_topic("t", &settings).await {
        Err(Error::Server(ErrorReply::MalformedRequest(reason))) => {
            assert!(reason.contains("protocol version 9"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_auth_token_travels_in_the_hello() {
    let addr = fake(|listener| async move {
        let (mut peer, hello) = Peer::accept(&listener, welcome(LIMITS)).await;
        assert_eq!(hello.auth_token.as_deref(), Some("secret"));
        let request = peer.request().await;
        peer.respond(request.correlation_id, Ok(Outcome::Offset(1)))
            .await;
        let _ = peer
            .read(&mut ServerCodec::new(1024, PROTOCOL_VERSION))
            .await;
    })
    .await;
    let client = Client::builder()
        .auth_token("secret")
        .connect(addr)
        .await
        .unwrap();
    assert_eq!(client.end_offset("t", 0).await.unwrap(), 1);
}

#[tokio::test]
async fn a_closed_port_is_an_io_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    assert!(matches!(Client::connect(addr).await, Err(Error::Io(_))));
}

#[tokio::test]
async fn a_server_that_never_welcomes_hits_the_connect_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let result = Client::builder()
        .connect_timeout(Duration::from_millis(100))
        .connect(addr)
        .await;
    assert!(
        matches!(&result, Err(Error::Io(error)) if error.kind() == std::io::ErrorKind::TimedOut),
        "{result:?}"
    );
    drop(listener);
}

#[tokio::test]
async fn an_unanswered_call_times_out_and_its_late_answer_is_ignored() {
    let addr = fake(|listener| async move {
        let (mut peer, _) = Peer::accept(&listener, welcome(LIMITS)).await;
        let ignored = peer.request().await;
        let second = peer.request().await;
        // Answer the second call, then the first one late, then a third call.
        peer.respond(second.correlation_id, Ok(Outcome::Offset(2)))
            .await;
        peer.respond(ignored.correlation_id, Ok(Outcome::Offset(1)))
            .await;
        let third = peer.request().await;
        peer.respond(third.correlation_id, Ok(Outcome::Offset(3)))
            .await;
        let _ = peer
            .read(&mut ServerCodec::new(1024, PROTOCOL_VERSION))
            .await;
    })
    .await;
    let client = Client::builder()
        .request_timeout(Duration::from_millis(200))
        .connect(addr)
        .await
        .unwrap();
    assert!(matches!(
        client.end_offset("t", 1).await,
        Err(Error::Timeout)
    ));
    assert_eq!(client.end_offset("t", 2).await.unwrap(), 2);
    assert_eq!(client.end_offset("t", 3).await.unwrap(), 3);
}

#[tokio::test]
async fn a_waiting_call_gets_its_max_wait_on_top_of_the_request_timeout() {
    let addr = fake(|listener| async move {
        let (mut peer, _) = Peer::accept(&listener, welcome(LIMITS)).await;
        let request = peer.request().await;
        assert_eq!(request.max_wait_ms, 300);
        // Never answer: the call must give up after 50 + 300 ms, not after 50.
        let _ = peer
            .read(&mut ServerCodec::new(1024, PROTOCOL_VERSION))
            .await;
    })
    .await;
    let client = Client::builder()
        .request_timeout(Duration::from_millis(50))
        .connect(addr)
        .await
        .unwrap();
    let start = Instant::now();
    let result = client
        .fetch_wait("t", "g", "m", 1, Duration::from_millis(300))
        .await;
    assert!(matches!(result, Err(Error::Timeout)), "{result:?}");
    assert!(start.elapsed() >= Duration::from_millis(350));
}

#[tokio::test]
async fn an_undecodable_response_fails_only_its_call() {
    let addr = fake(|listener| async move {
        let (mut peer, _) = Peer::accept(&listener, welcome(LIMITS)).await;
        let first = peer.request().await;
        let mut frame = BytesMut::new();
        frame.put_u32(8 + 4);
        frame.put_u64_le(first.correlation_id);
        frame.put_u32_le(9); // neither Ok (0) nor Err (1)
        peer.stream.write_all(&frame).await.unwrap();
        let second = peer.request().await;
        peer.respond(second.correlation_id, Ok(Outcome::Offset(5)))
            .await;
        let _ = peer
            .read(&mut ServerCodec::new(1024, PROTOCOL_VERSION))
            .await;
    })
    .await;
    let client = Client::connect(addr).await.unwrap();
    assert!(matches!(
        client.end_offset("t", 0).await,
        Err(Error::Protocol(_))
    ));
    assert_eq!(client.end_offset("t", 0).await.unwrap(), 5);
}

#[tokio::test]
async fn an_outcome_of_the_wrong_kind_is_a_protocol_error() {
    let addr = fake(|listener| async move {
        let (mut peer, _) = Peer::accept(&listener, welcome(LIMITS)).await;
        let request = peer.request().await;
        peer.respond(request.correlation_id, Ok(Outcome::Acked(true)))
            .await;
        let _ = peer
            .read(&mut ServerCodec::new(1024, PROTOCOL_VERSION))
            .await;
    })
    .await;
    let client = Client::connect(addr).await.unwrap();
    assert!(matches!(
        client.publish("t", 0, "x").await,
        Err(Error::Protocol(message)) if message.contains("Acked")
    ));
}

#[tokio::test]
async fn a_request_over_the_announced_frame_limit_fails_without_being_sent() {
    let limits = ServerLimits {
        max_frame_bytes: 256,
        ..LIMITS
    };
    let addr = fake(move |listener| async move {
        let (mut peer, _) = Peer::accept(&listener, welcome(limits)).await;
        let request = peer.request().await;
        assert!(matches!(request.command, Command::EndOffset { .. }));
        peer.respond(request.correlation_id, Ok(Outcome::Offset(0)))
            .await;
        let _ = peer
            .read(&mut ServerCodec::new(1024, PROTOCOL_VERSION))
            .await;
    })
    .await;
    let client = Client::connect(addr).await.unwrap();
    assert!(matches!(
        client.publish("t", 0, vec![0u8; 1000]).await,
        Err(Error::Server(ErrorReply::TooLarge { limit: 256, .. }))
    ));
    assert_eq!(client.end_offset("t", 0).await.unwrap(), 0);
}

#[tokio::test]
async fn a_closed_connection_fails_outstanding_calls_and_the_next_call_reconnects() {
    let addr = fake(|listener| async move {
        let (mut first, _) = Peer::accept(&listener, welcome(LIMITS)).await;
        first.request().await;
        first.request().await;
        drop(first);
        let (mut second, _) = Peer::accept(&listener, welcome(LIMITS)).await;
        let request = second.request().await;
        second
            .respond(request.correlation_id, Ok(Outcome::Offset(42)))
            .await;
        let _ = second
            .read(&mut ServerCodec::new(1024, PROTOCOL_VERSION))
            .await;
    })
    .await;
    let client = Client::connect(addr).await.unwrap();
    let (one, two) = tokio::join!(client.end_offset("t", 0), client.end_offset("t", 1));
    assert!(matches!(one, Err(Error::ConnectionLost(_))), "{one:?}");
    assert!(matches!(two, Err(Error::ConnectionLost(_))), "{two:?}");
    assert_eq!(client.end_offset("t", 0).await.unwrap(), 42);
}

#[tokio::test]
async fn a_response_with_correlation_id_zero_ends_the_connection() {
    let addr = fake(|listener| async move {
        let (mut peer, _) = Peer::accept(&listener, welcome(LIMITS)).await;
        peer.request().await;
        peer.respond(0, Err(ErrorReply::MalformedRequest("garbage".into())))
            .await;
        let _ = peer
            .read(&mut ServerCodec::new(1024, PROTOCOL_VERSION))
            .await;
    })
    .await;
    let client = Client::connect(addr).await.unwrap();
    assert!(matches!(
        client.end_offset("t", 0).await,
        Err(Error::ConnectionLost(reason)) if reason.contains("garbage")
    ));
}

#[tokio::test]
async fn raw_send_returns_the_outcome_and_sends_the_max_wait() {
    let addr = fake(|listener| async move {
        let (mut peer, _) = Peer::accept(&listener, welcome(LIMITS)).await;
        let request = peer.request().await;
        assert_eq!(request.max_wait_ms, 0);
        assert_eq!(request.command, end_offset(4));
        peer.respond(request.correlation_id, Ok(Outcome::Offset(9)))
            .await;
        let _ = peer
            .read(&mut ServerCodec::new(1024, PROTOCOL_VERSION))
            .await;
    })
    .await;
    let client = Client::connect(addr).await.unwrap();
    assert_eq!(
        client.send(end_offset(4), Duration::ZERO).await.unwrap(),
        Outcome::Offset(9)
    );
}

#[tokio::test]
async fn callers_waiting_for_a_failed_reconnection_share_its_failure() {
    let addr = fake(|listener| async move {
        let (mut peer, _) = Peer::accept(&listener, welcome(LIMITS)).await;
        peer.request().await;
        drop(peer);
        // Keep listening without ever answering a hello: reconnections time out.
        let mut silent = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            silent.push(stream);
        }
    })
    .await;
    let client = Client::builder()
        .connect_timeout(Duration::from_millis(200))
        .connect(addr)
        .await
        .unwrap();
    assert!(matches!(
        client.end_offset("t", 0).await,
        Err(Error::ConnectionLost(_))
    ));
    let start = Instant::now();
    // All four find the connection dead; the first reconnects (and times out), the others wait
    // for it and share its failure instead of spending a connect timeout each.
    let (first, second, third, fourth) = tokio::join!(
        client.end_offset("t", 0),
        client.end_offset("t", 1),
        client.end_offset("t", 2),
        client.end_offset("t", 3)
    );
    assert!(
        matches!(&first, Err(Error::Io(error)) if error.kind() == std::io::ErrorKind::TimedOut),
        "{first:?}"
    );
    for result in [second, third, fourth] {
        assert!(
            matches!(&result, Err(Error::ConnectionLost(reason)) if reason.starts_with("reconnecting failed")),
            "{result:?}"
        );
    }
    // The errors above show one attempt was made; this only bounds the whole, loosely.
    assert!(start.elapsed() < Duration::from_secs(5));
}
