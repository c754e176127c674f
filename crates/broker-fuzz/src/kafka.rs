//! Fuzz target `kafka`: arbitrary bytes as a Kafka client's side of a connection to the Kafka
//! listener, served over the broker in memory (a topic `t` of two partitions, so that produce
//! and fetch reach the broker).
//!
//! The first byte picks the frame limit. Properties:
//!
//! - serving never panics, and the connection ends by itself once the client's bytes are
//!   exhausted (every request is answered or refused, none waits forever);
//! - what the listener writes is a sequence of whole frames, each a 4-byte big-endian length
//!   and that many bytes, starting with a correlation id (a response header).

use std::time::Duration;

use broker_core::EventBroker;
use broker_kafka::{serve_connection, KafkaSettings, KafkaState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::input::Input;

/// Frame limits the target picks from.
const LIMITS: [usize; 3] = [64, 4096, 1 << 20];

/// Serves `data` as a Kafka client's bytes; panics if a property in the module documentation
/// fails.
pub fn serve_kafka_bytes(data: &[u8]) {
    let mut input = Input::new(data);
    let limit = LIMITS[usize::from(input.byte()) % LIMITS.len()];
    let written = serve(limit, input.rest().to_vec());
    let mut rest = written.as_slice();
    while !rest.is_empty() {
        assert!(rest.len() >= 4, "a partial length at the end: {rest:?}");
        let length = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        assert!(
            length >= 4 && rest.len() >= 4 + length,
            "a frame of {length} bytes with {} left",
            rest.len() - 4
        );
        rest = &rest[4 + length..];
    }
}

/// What the listener writes to a client that sends `request_bytes` and closes, with frames of
/// at most `limit` bytes.
fn serve(limit: usize, request_bytes: Vec<u8>) -> Vec<u8> {
    // Time is virtual: the waits of a rebalance end as soon as nothing else can happen.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => panic!("cannot start a runtime: {error}"),
    };
    runtime.block_on(async move {
        let broker = match EventBroker::new(100) {
            Ok(broker) => broker,
            Err(error) => panic!("a broker of capacity 100: {error}"),
        };
        if let Err(error) = broker.create("t", 2) {
            panic!("creating t: {error}");
        }
        let backend = broker;
        let settings = KafkaSettings {
            node_id: 0,
            cluster_id: "fuzz".into(),
            advertise: Some(("127.0.0.1".into(), 9093)),
            max_frame_bytes: limit,
            max_record_bytes: (limit / 2) as u64,
            max_partitions: 64,
            log_dir: "/var/lib/broker".into(),
            auto_create_partitions: None,
            names: broker_core::NameRules::Broker,
            idle_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
        };
        let local = std::net::SocketAddr::from(([127, 0, 0, 1], 9093));
        let peer = std::net::SocketAddr::from(([127, 0, 0, 1], 50000));
        let state = KafkaState::default();
        let (client, server) = tokio::io::duplex(64 * 1024);
        let (mut client_read, mut client_write) = tokio::io::split(client);
        let writing = async move {
            // The listener may close first (a frame over the limit): the rest is not read.
            let _ = client_write.write_all(&request_bytes).await;
            let _ = client_write.shutdown().await;
        };
        let mut written = Vec::new();
        let reading = client_read.read_to_end(&mut written);
        let serving = serve_connection(
            server,
            (local, peer),
            &backend,
            &state,
            &settings,
            broker_net::RequestMemory::new(1 << 30),
            std::future::pending(),
        );
        // Longer than any wait a request can ask for (a rebalance waits 30 minutes at most).
        let served = tokio::time::timeout(Duration::from_secs(4 * 3600), async {
            let (_, served, _) = tokio::join!(writing, serving, reading);
            served
        })
        .await;
        assert!(
            served.is_ok(),
            "the connection did not end once the client's bytes ended"
        );
        written
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_answered_with_its_correlation_id() {
        // ApiVersions v0, correlation id 9, no client id.
        let request = [0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 9, 0xff, 0xff];
        let written = serve(1 << 20, request.to_vec());
        assert!(written.len() > 10, "{written:?}");
        assert_eq!(written[4..8], [0, 0, 0, 9]);
    }
}
