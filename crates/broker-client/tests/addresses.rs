//! A client given several addresses, as a cluster's clients are: an address that fails, or
//! that accepts connections but never answers (a frozen node), does not keep the client from
//! the next; when every address fails, the error says why the most telling one did.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use broker_client::{Client, Error, ErrorReply};
use broker_server::{AuthToken, Config};
use broker_testkit::in_process::TestServer;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;

/// A listener that accepts connections and keeps them open without ever answering, as the
/// kernel of a stopped (SIGSTOP) or hung node does; and the task holding them.
async fn frozen_node() -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let holding = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (addr, holding)
}

/// An address nothing listens on, held (bound, not listening) so that no other test takes it:
/// connecting is refused at once.
fn closed_port() -> (SocketAddr, TcpSocket) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    (socket.local_addr().unwrap(), socket)
}

async fn connect(addrs: &[SocketAddr], timeout: Duration) -> Result<Client, Error> {
    let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    Client::builder()
        .connect_timeout(timeout)
        .connect(list.join(",").as_str())
        .await
}

#[tokio::test]
async fn a_node_that_accepts_but_never_answers_does_not_keep_the_client_from_the_next() {
    let server = TestServer::with_capacity(10).await;
    let (frozen, holding) = frozen_node().await;
    // The frozen node is first: its connection is accepted, its hello never answered. The
    // client tries the next address beside it and is welcomed there, long before the timeout
    // (a quarter of a second after the first attempt, on an idle machine).
    let timeout = Duration::from_secs(20);
    let began = Instant::now();
    let client = connect(&[frozen, server.addr], timeout).await.unwrap();
    assert!(began.elapsed() < timeout / 2, "{:?}", began.elapsed());
    assert!(client.create("t", 1).await.unwrap());
    assert_eq!(client.publish("t", 0, b"x".to_vec()).await.unwrap(), 0);
    holding.abort();
}

#[tokio::test]
async fn refused_addresses_are_passed_and_the_first_that_welcomes_is_used() {
    let server = TestServer::with_capacity(10).await;
    let ((first, _held_first), (second, _held_second)) = (closed_port(), closed_port());
    let client = connect(&[first, second, server.addr], Duration::from_secs(20))
        .await
        .unwrap();
    assert!(client.create("t", 1).await.unwrap());
}

#[tokio::test]
async fn a_refusal_is_reported_even_when_another_node_outlasts_the_timeout() {
    let server = TestServer::start(Config {
        auth_token: Some(AuthToken::new("right").unwrap()),
        ..Config::default()
    })
    .await;
    let (frozen, holding) = frozen_node().await;
    let list = format!("{},{frozen}", server.addr);
    let error = Client::builder()
        .auth_token("wrong")
        .connect_timeout(Duration::from_millis(800))
        .connect(list.as_str())
        .await
        .err()
        .unwrap();
    assert!(
        matches!(error, Error::Refused(ErrorReply::Unauthenticated(_))),
        "{error:?}"
    );
    holding.abort();
}

#[tokio::test]
async fn when_every_address_fails_the_error_is_the_most_telling() {
    // Something that answers in HTTP: a protocol error, which says more than a refused port
    // tried after it.
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_addr = http.local_addr().unwrap();
    let answering = tokio::spawn(async move {
        while let Ok((mut stream, _)) = http.accept().await {
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                .await;
        }
    });
    let (closed, _held) = closed_port();
    let error = connect(&[http_addr, closed], Duration::from_secs(20))
        .await
        .err()
        .unwrap();
    assert!(matches!(error, Error::Protocol(_)), "{error:?}");
    assert!(
        error.to_string().contains(&http_addr.to_string()),
        "{error}"
    );
    // Only refused ports: the I/O error names every address and why it failed.
    let (other, _held_other) = closed_port();
    let error = connect(&[closed, other], Duration::from_secs(20))
        .await
        .err()
        .unwrap();
    assert!(matches!(error, Error::Io(_)), "{error:?}");
    assert!(error.to_string().contains(&other.to_string()), "{error}");
    assert!(error.to_string().contains(&closed.to_string()), "{error}");
    // Only a frozen node: the connect timeout ends the wait.
    let (frozen, holding) = frozen_node().await;
    let error = connect(&[frozen], Duration::from_millis(600))
        .await
        .err()
        .unwrap();
    assert!(error.to_string().contains("connect timeout"), "{error}");
    holding.abort();
    answering.abort();
}
