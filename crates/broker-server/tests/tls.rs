//! TLS on the server, in-process with tokio's paused clock: a connection that never completes
//! its TLS handshake is closed after the handshake timeout, and meanwhile holds up no one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use broker_server::{Config, ServerTls};
use broker_testkit::certs::TestPki;
use broker_testkit::in_process::TestServer;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn a_stalled_tls_handshake_is_closed_after_ten_seconds_and_stalls_no_one() {
    let pki = TestPki::new(&["127.0.0.1"]);
    let tls = ServerTls::from_pem(pki.cert_pem.as_bytes(), pki.key_pem.as_bytes()).unwrap();
    let server = TestServer::start(Config {
        tls: Some(tls),
        ..Config::default()
    })
    .await;
    let start = Instant::now();
    let mut stalled = TcpStream::connect(server.addr).await.unwrap();

    // Others get in and are served while the stalled connection sends nothing.
    let client = broker_client::Client::builder()
        .tls_ca_file(&pki.ca_file)
        .connect(server.addr)
        .await
        .unwrap();
    assert!(client.create("t", 1).await.unwrap());
    assert_eq!(client.publish("t", 0, "x").await.unwrap(), 0);

    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(60), stalled.read(&mut byte))
        .await
        .expect("the server closes a stalled handshake");
    assert_eq!(read.unwrap(), 0, "closed without a word");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
        "{waited:?}"
    );
    assert_eq!(client.end_offset("t", 0).await.unwrap(), 1);
    drop(client);
    server.stop().await.unwrap();
}
