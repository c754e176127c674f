//! A minimal client over the protocol's codec: hello, then requests and responses one frame
//! at a time, for tests of the wire itself (ordering, bad input, limits). Also builders for the
//! commands such tests send most.

use std::net::SocketAddr;

use broker_core::{Command, KeyHash, Outcome};
use broker_proto::{
    v1, ClientCodec, ClientHandshakeCodec, Codec, ErrorReply, Hello, HelloReply, RequestFrame,
    ResponseFrame, PROTOCOL_VERSION,
};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

/// A connection speaking the protocol through its codec, with nothing in between.
pub type RawClient = Framed<TcpStream, ClientCodec>;

/// A connection speaking protocol version 1, as a client written for it does.
pub type RawClientV1 = Framed<TcpStream, Codec<v1::ResponseFrame, v1::RequestFrame>>;

/// Connects, says hello and checks the welcome.
pub async fn connect(addr: SocketAddr) -> RawClient {
    hello(addr, PROTOCOL_VERSION).await
}

/// Connects with a hello of protocol version 1 and checks the welcome is in version 1.
pub async fn connect_v1(addr: SocketAddr) -> RawClientV1 {
    hello(addr, 1).await
}

/// Connects, says hello in `version` and checks the server welcomes that version.
async fn hello<In, Out>(addr: SocketAddr, version: u16) -> Framed<TcpStream, Codec<In, Out>> {
    let stream = broker_net::connect(addr).await.unwrap();
    let mut framed = Framed::new(stream, ClientHandshakeCodec::new(64 * 1024 * 1024));
    let hello = Hello {
        version,
        ..Hello::new("test", None)
    };
    framed.send(hello).await.unwrap();
    match framed.next().await.unwrap().unwrap() {
        broker_proto::Decoded::Message(HelloReply::Welcome {
            version: welcomed, ..
        }) => {
            assert_eq!(welcomed, version, "welcomed in another version");
        }
        other => panic!("unexpected hello reply {other:?}"),
    }
    framed.map_codec(|codec| codec.retype())
}

/// Sends one request without waiting for its response.
pub async fn send(client: &mut RawClient, correlation_id: u64, max_wait_ms: u32, command: Command) {
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
pub async fn recv(client: &mut RawClient) -> ResponseFrame {
    match client.next().await.unwrap().unwrap() {
        broker_proto::Decoded::Message(response) => response,
        other => panic!("undecodable response {other:?}"),
    }
}

/// Whether the server closed the connection (clean end of stream, or a reset).
pub async fn is_closed(client: &mut RawClient) -> bool {
    !matches!(client.next().await, Some(Ok(_)))
}

/// One request, one response, checked to carry the request's id.
pub async fn call(client: &mut RawClient, command: Command) -> Result<Outcome, ErrorReply> {
    send(client, 7, 0, command).await;
    let response = recv(client).await;
    assert_eq!(response.correlation_id, 7);
    response.result
}

/// `Create` of `topic` with `partition_count` partitions and the default key hash.
pub fn create(topic: &str, partition_count: i32) -> Command {
    Command::Create {
        topic: topic.into(),
        partition_count,
        key_hash: KeyHash::default(),
        settings: Vec::new(),
    }
}

/// `Publish` of `payload` to `partition` of `topic`.
pub fn publish(topic: &str, partition: i32, payload: &'static str) -> Command {
    Command::Publish {
        topic: topic.into(),
        partition,
        payload: Bytes::from_static(payload.as_bytes()),
    }
}

/// `Join` of `member` to `group` on `topic`, with the group's own assignor.
pub fn join(topic: &str, group: &str, member: &str) -> Command {
    Command::Join {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
        assignor: None,
        settings: Vec::new(),
    }
}

/// `Poll` of up to `max_records` records, without a byte budget.
pub fn poll(topic: &str, group: &str, member: &str, max_records: i32) -> Command {
    Command::Poll {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
        max_records,
        max_bytes: None,
    }
}

/// `Redeliver` of up to `max_records` records, without a byte budget.
pub fn redeliver(topic: &str, group: &str, member: &str, max_records: i32) -> Command {
    Command::Redeliver {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
        max_records,
        max_bytes: None,
    }
}

/// `Leave` of `member` from `group` on `topic`.
pub fn leave(topic: &str, group: &str, member: &str) -> Command {
    Command::Leave {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
    }
}

/// The offset in flight for `group` on partition 0 of the only topic, read through `client`.
pub async fn in_flight(client: &mut RawClient, group: &str) -> Option<i64> {
    match call(client, describe()).await {
        Ok(Outcome::Description(description)) => description.topics[0]
            .groups
            .iter()
            .find(|g| g.name == group)
            .and_then(|g| g.partitions[0].in_flight),
        other => panic!("expected a description, got {other:?}"),
    }
}

/// `Ack` of the delivery at `partition`, `offset`.
pub fn ack(topic: &str, group: &str, member: &str, partition: i32, offset: i64) -> Command {
    Command::Ack {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
        partition,
        offset,
    }
}

/// `Retry` of the delivery at `partition`, `offset`.
pub fn retry(topic: &str, group: &str, member: &str, partition: i32, offset: i64) -> Command {
    Command::Retry {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
        partition,
        offset,
    }
}

/// `Assignment` of `member`.
pub fn assignment(topic: &str, group: &str, member: &str) -> Command {
    Command::Assignment {
        topic: topic.into(),
        group: group.into(),
        member: member.into(),
    }
}

/// `Describe` of every topic.
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
