//! Who may come in, through the client against an in-process server: the auth token (right,
//! wrong, missing) and TLS (a round trip, an untrusted CA, a wrong server name, plain and TLS
//! mixed up, reconnection over TLS). Certificates are made by rcgen when the tests run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use broker_client::{Client, Error, ErrorReply};
use broker_proto::{ClientHandshakeCodec, Decoded, Hello, HelloReply};
use broker_server::{AuthToken, Config, ServerTls};
use broker_testkit::certs::TestPki;
use broker_testkit::in_process::TestServer;
use broker_testkit::proxy::Proxy;
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::{Decoder, Encoder};

const TOKEN: &str = "correct horse battery staple";

fn with_token() -> Config {
    Config {
        auth_token: Some(AuthToken::new(TOKEN).unwrap()),
        ..Config::default()
    }
}

fn with_tls(pki: &TestPki) -> Config {
    Config {
        tls: Some(ServerTls::from_pem(pki.cert_pem.as_bytes(), pki.key_pem.as_bytes()).unwrap()),
        ..Config::default()
    }
}

/// Publishes one record and reads it back: the connection really works.
async fn round_trip(client: &Client) {
    client.create("secure", 1).await.unwrap();
    let offset = client.publish("secure", 0, "secret payload").await.unwrap();
    let records = client.fetch("secure", "g", "m", 10).await.unwrap();
    assert!(records.is_empty(), "not a member yet");
    client.join("secure", "g", "m").await.unwrap();
    let records = client.fetch("secure", "g", "m", 10).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].offset, offset);
    assert_eq!(&records[0].payload[..], b"secret payload");
}

#[tokio::test]
async fn the_right_token_gets_in() {
    let server = TestServer::start(with_token()).await;
    let client = Client::builder()
        .auth_token(TOKEN)
        .connect(server.addr)
        .await
        .unwrap();
    round_trip(&client).await;
}

#[tokio::test]
async fn a_wrong_or_missing_token_is_refused_as_unauthenticated() {
    let server = TestServer::start(with_token()).await;
    for builder in [
        Client::builder(),
        Client::builder().auth_token("wrong"),
        Client::builder().auth_token(""),
        Client::builder().auth_token(format!("{TOKEN} ")),
    ] {
        let refused = builder.connect(server.addr).await;
        assert!(
            matches!(refused, Err(Error::Refused(ErrorReply::Unauthenticated(_)))),
            "{refused:?}"
        );
    }
    // Refusals change nothing for a client that has the token.
    let client = Client::builder()
        .auth_token(TOKEN)
        .connect(server.addr)
        .await
        .unwrap();
    round_trip(&client).await;
}

#[tokio::test]
async fn a_server_without_a_token_ignores_one() {
    let server = TestServer::start(Config::default()).await;
    let client = Client::builder()
        .auth_token("anything")
        .connect(server.addr)
        .await
        .unwrap();
    round_trip(&client).await;
}

/// Speaks the hello by hand: the refusal is code 6 and the server then closes the connection.
#[tokio::test]
async fn the_server_closes_the_connection_after_refusing_a_token() {
    let server = TestServer::start(with_token()).await;
    for token in [None, Some("wrong".to_owned())] {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        let mut codec = ClientHandshakeCodec::new(64 * 1024);
        let mut buffer = BytesMut::new();
        codec
            .encode(&Hello::new("raw", token), &mut buffer)
            .unwrap();
        stream.write_all(&buffer).await.unwrap();
        let mut answer = BytesMut::new();
        let reply = loop {
            if let Some(reply) = codec.decode(&mut answer).unwrap() {
                break reply;
            }
            assert_ne!(stream.read_buf(&mut answer).await.unwrap(), 0, "no reply");
        };
        assert!(
            matches!(
                reply,
                Decoded::Message(HelloReply::Refused(ErrorReply::Unauthenticated(_)))
            ),
            "{reply:?}"
        );
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest))
            .await
            .expect("the server closes the connection");
        assert_eq!(closed.unwrap(), 0, "nothing follows the refusal");
    }
}

#[tokio::test]
async fn tls_round_trip_verifies_the_server() {
    let pki = TestPki::new(&["localhost", "127.0.0.1"]);
    let server = TestServer::start(with_tls(&pki)).await;
    // The server name defaults to the host part of the address: an IP address here...
    let client = Client::builder()
        .tls_ca_file(&pki.ca_file)
        .connect(server.addr)
        .await
        .unwrap();
    round_trip(&client).await;
    // ...a DNS name here.
    let by_name = Client::builder()
        .tls_ca_file(&pki.ca_file)
        .connect(format!("localhost:{}", server.addr.port()))
        .await
        .unwrap();
    assert_eq!(by_name.end_offset("secure", 0).await.unwrap(), 1);
}

#[tokio::test]
async fn tls_and_a_token_together() {
    let pki = TestPki::new(&["localhost"]);
    let config = Config {
        auth_token: with_token().auth_token,
        ..with_tls(&pki)
    };
    let server = TestServer::start(config).await;
    let refused = Client::builder()
        .tls_ca_file(&pki.ca_file)
        .tls_server_name("localhost")
        .connect(server.addr)
        .await;
    assert!(
        matches!(refused, Err(Error::Refused(ErrorReply::Unauthenticated(_)))),
        "{refused:?}"
    );
    let client = Client::builder()
        .tls_ca_file(&pki.ca_file)
        .tls_server_name("localhost")
        .auth_token(TOKEN)
        .connect(server.addr)
        .await
        .unwrap();
    round_trip(&client).await;
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused_clearly() {
    let pki = TestPki::new(&["localhost", "127.0.0.1"]);
    let stranger = TestPki::new(&["localhost", "127.0.0.1"]);
    let server = TestServer::start(with_tls(&pki)).await;
    let refused = Client::builder()
        .tls_ca_file(&stranger.ca_file)
        .connect(server.addr)
        .await;
    match refused {
        Err(Error::Tls(why)) => assert!(why.contains("certificate"), "{why}"),
        other => panic!("expected a TLS error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused_clearly() {
    let pki = TestPki::new(&["localhost"]);
    let server = TestServer::start(with_tls(&pki)).await;
    for builder in [
        // The default name, the IP address, is not in the certificate.
        Client::builder().tls_ca_file(&pki.ca_file),
        Client::builder()
            .tls_ca_file(&pki.ca_file)
            .tls_server_name("broker.example"),
    ] {
        match builder.connect(server.addr).await {
            Err(Error::Tls(why)) => assert!(why.contains("not valid for"), "{why}"),
            other => panic!("expected a TLS error, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn unusable_tls_settings_are_tls_errors() {
    let pki = TestPki::new(&["localhost"]);
    let server = TestServer::start(with_tls(&pki)).await;
    let not_pem = pki.path("not-pem");
    std::fs::write(&not_pem, "hello").unwrap();
    for builder in [
        Client::builder().tls_ca_file(pki.path("missing.pem")),
        Client::builder().tls_ca_file(&not_pem),
        Client::builder()
            .tls_ca_file(&pki.ca_file)
            .tls_server_name("not a name"),
    ] {
        let refused = builder.connect(server.addr).await;
        assert!(matches!(refused, Err(Error::Tls(_))), "{refused:?}");
    }
}

#[tokio::test]
async fn a_plain_client_fails_cleanly_and_the_tls_server_keeps_serving() {
    let pki = TestPki::new(&["127.0.0.1"]);
    let server = TestServer::start(with_tls(&pki)).await;
    let tls_client = Client::builder()
        .tls_ca_file(&pki.ca_file)
        .connect(server.addr)
        .await
        .unwrap();
    let plain = Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .connect(server.addr)
        .await;
    match plain {
        Err(Error::Tls(why)) => assert!(why.contains("TLS"), "{why}"),
        other => panic!("expected a TLS error, got {other:?}"),
    }
    // The connection opened before, and a new one, both still work.
    round_trip(&tls_client).await;
    let again = Client::builder()
        .tls_ca_file(&pki.ca_file)
        .connect(server.addr)
        .await
        .unwrap();
    assert_eq!(again.end_offset("secure", 0).await.unwrap(), 1);
}

#[tokio::test]
async fn a_tls_client_against_a_plain_server_fails_cleanly() {
    let pki = TestPki::new(&["127.0.0.1"]);
    let server = TestServer::start(Config::default()).await;
    let refused = Client::builder()
        .tls_ca_file(&pki.ca_file)
        .connect(server.addr)
        .await;
    assert!(matches!(refused, Err(Error::Tls(_))), "{refused:?}");
    round_trip(&server.client().await).await;
}

#[tokio::test]
async fn reconnection_works_over_tls() {
    let pki = TestPki::new(&["localhost"]);
    let server = TestServer::start(Config {
        auth_token: with_token().auth_token,
        ..with_tls(&pki)
    })
    .await;
    let proxy = Proxy::start(server.addr).await;
    let client = Client::builder()
        .tls_ca_file(&pki.ca_file)
        .tls_server_name("localhost")
        .auth_token(TOKEN)
        .connect(proxy.addr)
        .await
        .unwrap();
    client.create("secure", 1).await.unwrap();
    client.join("secure", "g", "m").await.unwrap();
    let long = Duration::from_secs(60);
    let (waiting, ()) = tokio::join!(client.poll_wait("secure", "g", "m", 1, long), async {
        client.end_offset("secure", 0).await.unwrap();
        proxy.cut();
    });
    assert!(
        matches!(waiting, Err(Error::ConnectionLost(_))),
        "{waiting:?}"
    );
    // The next call opens a new connection, with TLS and the token again.
    assert!(!client.create("secure", 1).await.unwrap());
    assert_eq!(proxy.accepted(), 2);
}

#[tokio::test]
async fn many_pipelined_calls_flow_over_tls() {
    let pki = TestPki::new(&["127.0.0.1"]);
    let server = TestServer::start(Config {
        capacity: 1000,
        ..with_tls(&pki)
    })
    .await;
    let client = Client::builder()
        .tls_ca_file(&pki.ca_file)
        .connect(server.addr)
        .await
        .unwrap();
    client.create("bulk", 4).await.unwrap();
    let payload = bytes::Bytes::from(vec![7u8; 4096]);
    let mut calls = tokio::task::JoinSet::new();
    for index in 0..2000 {
        let (client, payload) = (client.clone(), payload.clone());
        calls.spawn(async move { client.publish("bulk", index % 4, payload).await });
    }
    let mut stored = 0;
    while let Some(offset) = calls.join_next().await {
        if offset.unwrap().unwrap() >= 0 {
            stored += 1;
        }
    }
    assert_eq!(stored, 2000);
}

/// A port that accepts and closes at once (a load balancer whose backend is down, a server
/// going away): the connection failing under the TLS handshake is as passing as it is over
/// plain TCP, so that a Consumer or Producer tries again with TLS on too. A certificate the
/// client refuses stays final.
#[tokio::test]
async fn a_connection_closed_during_the_tls_handshake_is_tried_again() {
    let pki = TestPki::new(&["localhost", "127.0.0.1"]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            drop(socket);
        }
    });
    let plain = Client::connect(addr).await.unwrap_err();
    let tls = Client::builder()
        .tls_ca_file(&pki.ca_file)
        .connect(addr)
        .await
        .unwrap_err();
    assert!(plain.is_retriable(), "{plain}");
    assert!(tls.is_retriable(), "{tls}");
    // A server whose certificate another authority signed is refused for good.
    let other = TestPki::new(&["localhost", "127.0.0.1"]);
    let server = TestServer::start(with_tls(&pki)).await;
    let refused = Client::builder()
        .tls_ca_file(&other.ca_file)
        .connect(server.addr)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, Error::Tls(_)) && !refused.is_retriable(),
        "{refused}"
    );
}
