//! Lost connections against the in-process server: a cut connection fails every outstanding
//! call with `ConnectionLost` at once, a server shutdown fails the calls it never read, and the
//! next call reconnects, also to a server restarted on another listener.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use broker_client::{Client, Error};
use broker_server::Config;
use broker_testkit::in_process::TestServer;
use broker_testkit::proxy::Proxy;

#[tokio::test]
async fn a_cut_connection_fails_outstanding_calls_at_once_and_the_next_call_reconnects() {
    let server = TestServer::with_capacity(10).await;
    let proxy = Proxy::start(server.addr).await;
    let client = Client::connect(proxy.addr).await.unwrap();
    client.create("t", 1).await.unwrap();
    client.join("t", "g", "m").await.unwrap();
    let long = Duration::from_secs(60);
    let start = Instant::now();
    // `join!` polls the branches in order: the waiting polls are sent before the end_offset
    // call, so once that is answered the server has parked them.
    let (first, second, third, ()) = tokio::join!(
        client.poll_wait("t", "g", "m", 1, long),
        client.fetch_wait("t", "g", "m", 1, long),
        client.poll_wait("t", "g", "m", 1, long),
        async {
            client.end_offset("t", 0).await.unwrap();
            proxy.cut();
        }
    );
    for result in [first, second, third] {
        assert!(
            matches!(result, Err(Error::ConnectionLost(_))),
            "{result:?}"
        );
    }
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(proxy.accepted(), 1);
    // The next call opens a new connection to the same address; the server's state is intact.
    assert!(!client.create("t", 1).await.unwrap());
    assert_eq!(proxy.accepted(), 2);
    // Membership survived on the server (it is the server's); a re-join is harmless.
    assert_eq!(client.join("t", "g", "m").await.unwrap(), [0]);
}

#[tokio::test]
async fn server_shutdown_fails_the_calls_it_never_read_with_connection_lost() {
    // One request in flight per connection: a parked poll stops the server reading more.
    let server = TestServer::start(Config {
        capacity: 10,
        max_in_flight: 1,
        ..Config::default()
    })
    .await;
    let client = server.client().await;
    client.create("t", 1).await.unwrap();
    client.join("t", "g", "m").await.unwrap();
    let (parked, unread_one, unread_two, stopped) = tokio::join!(
        client.poll_wait("t", "g", "m", 1, Duration::from_secs(60)),
        client.end_offset("t", 0),
        client.publish("t", 0, "never read"),
        server.stop()
    );
    stopped.unwrap();
    // Shutdown answers a parked poll at once with what it has, or closes before reading it.
    assert!(
        matches!(parked, Ok(ref records) if records.is_empty())
            || matches!(parked, Err(Error::ConnectionLost(_))),
        "{parked:?}"
    );
    assert!(
        matches!(unread_one, Err(Error::ConnectionLost(_))),
        "{unread_one:?}"
    );
    assert!(
        matches!(unread_two, Err(Error::ConnectionLost(_))),
        "{unread_two:?}"
    );
    // Nothing listens any more: the reconnection the next call attempts fails.
    assert!(matches!(
        client.end_offset("t", 0).await,
        Err(Error::Io(_) | Error::ConnectionLost(_))
    ));
}

#[tokio::test]
async fn the_next_call_after_a_restart_reaches_the_new_server() {
    let first = TestServer::with_capacity(10).await;
    let proxy = Proxy::start(first.addr).await;
    let client = Client::connect(proxy.addr).await.unwrap();
    assert!(client.create("t", 1).await.unwrap());
    first.stop().await.unwrap();

    // The old server is gone: a call fails (the dead connection, or a failed reconnection).
    let result = client.end_offset("t", 0).await;
    assert!(
        matches!(result, Err(Error::ConnectionLost(_) | Error::Io(_))),
        "{result:?}"
    );

    // A new server on a new listener, behind the same address.
    let second = TestServer::with_capacity(10).await;
    proxy.set_backend(second.addr);
    // A fresh broker: the topic does not exist yet, so this call really reached it.
    assert!(client.create("t", 1).await.unwrap());
    assert_eq!(client.publish("t", 0, "x").await.unwrap(), 0);
    assert!(proxy.accepted() >= 2);
    second.stop().await.unwrap();
}

#[tokio::test]
async fn clones_share_one_connection_and_reconnect_once() {
    let server = TestServer::with_capacity(10).await;
    let proxy = Proxy::start(server.addr).await;
    let client = Client::connect(proxy.addr).await.unwrap();
    let clones: Vec<Client> = (0..8).map(|_| client.clone()).collect();
    for clone in &clones {
        clone.create("t", 1).await.unwrap();
    }
    assert_eq!(proxy.accepted(), 1);
    // Learn that the connection died: one call fails, or already reconnects.
    proxy.cut();
    let mut tasks = tokio::task::JoinSet::new();
    for clone in clones {
        tasks.spawn(async move {
            loop {
                match clone.end_offset("t", 0).await {
                    Ok(end) => return end,
                    Err(Error::ConnectionLost(_)) => continue,
                    Err(other) => panic!("{other:?}"),
                }
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        assert_eq!(task.unwrap(), 0);
    }
    // Eight callers found the connection dead; one reconnection served them all.
    assert_eq!(proxy.accepted(), 2);
}
