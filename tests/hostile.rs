//! Greedy clients against the real `broker-server` binary, with its memory measured from
//! `/proc/<pid>/status`: maximum-size frames sent again and again, and publishes past the
//! memory budget, leave the server's peak memory bounded.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use broker_core::{Command, KeyHash, Outcome};
use broker_proto::{
    ClientCodec, ClientHandshakeCodec, Decoded, ErrorReply, Hello, HelloReply, RequestFrame,
    ResponseFrame,
};
use broker_testkit::process::ServerProcess;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

const MIB: u64 = 1024 * 1024;

type Client = Framed<TcpStream, ClientCodec>;

async fn connect(server: &ServerProcess) -> Client {
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let mut framed = Framed::new(stream, ClientHandshakeCodec::new(64 << 20));
    framed.send(Hello::new("hostile", None)).await.unwrap();
    match framed.next().await.unwrap().unwrap() {
        Decoded::Message(HelloReply::Welcome { .. }) => {}
        other => panic!("unexpected hello reply {other:?}"),
    }
    framed.map_codec(|codec| codec.retype())
}

async fn call(client: &mut Client, command: Command) -> Result<Outcome, ErrorReply> {
    client
        .send(RequestFrame {
            correlation_id: 1,
            max_wait_ms: 0,
            command,
        })
        .await
        .unwrap();
    match client.next().await.unwrap().unwrap() {
        Decoded::Message(ResponseFrame { result, .. }) => result,
        other => panic!("undecodable response {other:?}"),
    }
}

fn publish(payload: Bytes) -> Command {
    Command::Publish {
        topic: "t".into(),
        partition: 0,
        payload,
    }
}

#[tokio::test]
async fn maximum_frames_again_and_again_do_not_grow_memory() {
    let frame_limit = 3 * MIB;
    let server = ServerProcess::start(&[
        "--max-payload-bytes",
        &MIB.to_string(),
        "--max-frame-bytes",
        &frame_limit.to_string(),
        "--max-memory",
        &(4 * MIB).to_string(),
    ]);
    let mut client = connect(&server).await;
    let created = call(
        &mut client,
        Command::Create {
            topic: "t".into(),
            partition_count: 1,
            key_hash: KeyHash::default(),
            settings: Vec::new(),
        },
    )
    .await;
    assert_eq!(created, Ok(Outcome::Created(true)));
    let baseline = server.status_bytes("VmRSS");

    // 100 frames just under the frame limit (300 MiB in all), each a publish whose payload is
    // over the payload limit: refused, nothing kept.
    let oversized = Bytes::from(vec![7u8; (frame_limit - 1024) as usize]);
    for _ in 0..100 {
        let result = call(&mut client, publish(oversized.clone())).await;
        assert!(
            matches!(result, Err(ErrorReply::TooLarge { ref what, .. }) if what == "payload"),
            "{result:?}"
        );
    }
    // 50 maximal payloads: the first four fill the 4 MiB budget, the rest are refused as full.
    let largest = Bytes::from(vec![8u8; MIB as usize]);
    let mut offsets = Vec::new();
    for _ in 0..50 {
        match call(&mut client, publish(largest.clone())).await {
            Ok(Outcome::Published(offset)) => offsets.push(offset),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(offsets[..5], [0, 1, 2, 3, -1]);
    assert!(offsets[4..].iter().all(|&offset| offset == -1));

    let peak = server.status_bytes("VmHWM");
    eprintln!(
        "baseline RSS {} KiB, peak {} KiB",
        baseline / 1024,
        peak / 1024
    );
    // 350 MiB went through; the server keeps the 4 MiB budget plus a few frames in buffers.
    assert!(
        peak < baseline + 48 * MIB,
        "peak {peak} bytes, baseline {baseline} bytes"
    );
}
