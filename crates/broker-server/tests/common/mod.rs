//! Test helpers: an in-process server on 127.0.0.1:0 and a minimal client over `Framed`.

#![allow(clippy::unwrap_used, dead_code)]

use std::net::SocketAddr;

use broker_core::{Command, KeyHash, Outcome};
use broker_proto::{
    ClientCodec, ClientHandshakeCodec, ErrorReply, Hello, HelloReply, RequestFrame, ResponseFrame,
};
use broker_server::{Config, ServerError};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::codec::Framed;

/// A server running in this process.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: oneshot::Sender<()>,
    handle: JoinHandle<Result<(), ServerError>>,
}

impl TestServer {
    pub async fn start(config: Config) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(broker_server::run(listener, config, async move {
            let _ = stopped.await;
        }));
        TestServer { addr, stop, handle }
    }

    pub async fn stop(self) -> Result<(), ServerError> {
        self.stop.send(()).unwrap();
        self.handle.await.unwrap()
    }
}

pub type Client = Framed<TcpStream, ClientCodec>;

/// Connects, says hello and checks the welcome.
pub async fn connect(addr: SocketAddr) -> Client {
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut framed = Framed::new(stream, ClientHandshakeCodec::new(64 * 1024 * 1024));
    framed.send(Hello::new("test", None)).await.unwrap();
    match framed.next().await.unwrap().unwrap() {
        broker_proto::Decoded::Message(HelloReply::Welcome { .. }) => {}
        other => panic!("unexpected hello reply {other:?}"),
    }
    framed.map_codec(|codec| codec.retype())
}

/// Sends one request without waiting for its response.
pub async fn send(client: &mut Client, correlation_id: u64, max_wait_ms: u32, command: Command) {
    client
        .send(RequestFrame {
            correlation_id,
            max_wait_ms,
            command,
        })
        .await
        .unwrap();
}

/// Reads the next response.
pub async fn recv(client: &mut Client) -> ResponseFrame {
    match client.next().await.unwrap().unwrap() {
        broker_proto::Decoded::Message(response) => response,
        other => panic!("undecodable response {other:?}"),
    }
}

/// Whether the server closed the connection (clean end of stream, or a reset).
pub async fn is_closed(client: &mut Client) -> bool {
    !matches!(client.next().await, Some(Ok(_)))
}

/// One request, one response, checked to carry the request's id.
pub async fn call(client: &mut Client, command: Command) -> Result<Outcome, ErrorReply> {
    send(client, 7, 0, command).await;
    let response = recv(client).await;
    assert_eq!(response.correlation_id, 7);
    response.result
}

pub fn create(topic: &str, partition_count: i32) -> Command {
    Command::Create {
        topic: topic.into(),
        partition_count,
        key_hash: KeyHash::default(),
    }
}

pub fn publish(topic: &str, partition: i32, payload: &'static str) -> Command {
    Command::Publish {
        topic: topic.into(),
        partition,
        payload: Bytes::from_static(payload.as_bytes()),
    }
}

pub fn join(topic: &str, group: &str, member: &str) -> Command {
    Command::Join {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
        assignor: None,
    }
}

pub fn poll(topic: &str, group: &str, member: &str, max_records: i32) -> Command {
    Command::Poll {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
        max_records,
        max_bytes: None,
    }
}

pub fn redeliver(topic: &str, group: &str, member: &str, max_records: i32) -> Command {
    Command::Redeliver {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
        max_records,
        max_bytes: None,
    }
}

pub fn leave(topic: &str, group: &str, member: &str) -> Command {
    Command::Leave {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
    }
}

/// The offset in flight for `group` on partition 0 of the only topic, read through `client`.
pub async fn in_flight(client: &mut Client, group: &str) -> Option<i64> {
    match call(client, describe()).await {
        Ok(Outcome::Description(description)) => description.topics[0]
            .groups
            .iter()
            .find(|g| g.name == group)
            .and_then(|g| g.partitions[0].in_flight),
        other => panic!("expected a description, got {other:?}"),
    }
}

pub fn ack(topic: &str, group: &str, member: &str, partition: i32, offset: i64) -> Command {
    Command::Ack {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
        partition,
        offset,
    }
}

pub fn retry(topic: &str, group: &str, member: &str, partition: i32, offset: i64) -> Command {
    Command::Retry {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
        partition,
        offset,
    }
}

pub fn assignment(topic: &str, group: &str, member: &str) -> Command {
    Command::Assignment {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
    }
}

pub fn describe() -> Command {
    Command::Describe { topic: None }
}

/// The (partition, offset, payload) of each record of a records outcome.
pub fn records(result: Result<Outcome, ErrorReply>) -> Vec<(i32, i64, Bytes)> {
    match result {
        Ok(Outcome::Records(records)) => records
            .into_iter()
            .map(|record| (record.partition, record.offset, record.payload))
            .collect(),
        other => panic!("expected records, got {other:?}"),
    }
}
