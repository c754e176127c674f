//! A bounded load and soak test of the real `broker-server` on loopback: many connections (one
//! `broker_client::Client` each) mix every call for a fixed time against a server whose memory
//! budget producers keep running into. At the end it reports throughput, the calls made by
//! kind, the error count (which must be zero: a full partition's `-1` and an `ack` answering
//! `false` are answers, not errors) and the server's peak resident memory (`VmHWM` in
//! `/proc/<pid>/status`), which must stay within the budget plus the overhead BENCHMARKS.md
//! documents.
//!
//! In `cargo test` it runs small (2 seconds, 32 connections, 16 MiB budget). `tests/soak.sh`
//! runs it large on a release build; or set the sizes:
//!
//! ```sh
//! SOAK_SECS=60 SOAK_CONNECTIONS=300 SOAK_MAX_MEMORY=67108864 \
//!     cargo test --release -p broker-server --test soak -- --nocapture
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use broker_client::{Client, PublishRecord};
use broker_testkit::{process::ServerProcess, rng::env_or, rng::Rng};
use bytes::Bytes;

const MIB: u64 = 1024 * 1024;
const TOPICS: [&str; 4] = ["soak-a", "soak-b", "soak-c", "soak-d"];
const GROUPS: [&str; 3] = ["ack", "fetch", "mixed"];
const PARTITIONS: i32 = 8;
/// Every call a connection makes, by name, for the report.
const CALLS: [&str; 16] = [
    "create",
    "join",
    "leave",
    "publish",
    "publish_keyed",
    "publish_batch",
    "poll",
    "ack",
    "retry",
    "fetch",
    "commit",
    "assignment",
    "committed",
    "end_offset",
    "lag",
    "describe",
];

/// Resident memory the server may use beyond its memory budget: the binary, the runtime and
/// per-connection buffers (a read buffer and a write buffer each, plus the socket's). See
/// BENCHMARKS.md.
fn allowed_overhead(connections: u64) -> u64 {
    64 * MIB + connections * 512 * 1024
}

/// What one connection did.
#[derive(Debug, Default)]
struct Tally {
    calls: [u64; CALLS.len()],
    errors: u64,
    first_error: Option<String>,
    refused_full: u64,
}

impl Tally {
    fn record<T>(&mut self, call: usize, result: Result<T, broker_client::Error>) -> Option<T> {
        self.calls[call] += 1;
        match result {
            Ok(value) => Some(value),
            Err(error) => {
                self.errors += 1;
                self.first_error
                    .get_or_insert_with(|| format!("{}: {error}", CALLS[call]));
                None
            }
        }
    }
}

fn payload(rng: &mut Rng) -> Bytes {
    // Mostly small records, now and then a 64 KiB one.
    let size = if rng.below(50) == 0 {
        64 * 1024
    } else {
        20 + rng.below(1000) as usize
    };
    Bytes::from(vec![b'x'; size])
}

/// One connection: the call mix until `deadline`.
async fn connection(addr: String, index: usize, deadline: Instant) -> Tally {
    let mut tally = Tally::default();
    let client = Client::connect(addr.as_str()).await.unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((index as u64 + 1) * 0x2545_F491));
    let topic = TOPICS[index % TOPICS.len()];
    let group = GROUPS[index % GROUPS.len()];
    let member = format!("member-{index}");
    tally.record(1, client.join(topic, group, &member).await);
    while Instant::now() < deadline {
        let partition = rng.below(PARTITIONS as u64) as i32;
        match rng.below(20) {
            0..=3 => {
                if let Some(offset) =
                    tally.record(3, client.publish(topic, partition, payload(&mut rng)).await)
                {
                    tally.refused_full += u64::from(offset < 0);
                }
            }
            4 => {
                let key = format!("key-{}", rng.below(100));
                if let Some((_, offset)) = tally.record(
                    4,
                    client
                        .publish_keyed(topic, Some(key.as_bytes()), payload(&mut rng))
                        .await,
                ) {
                    tally.refused_full += u64::from(offset < 0);
                }
            }
            5 => {
                let records = (0..8)
                    .map(|_| PublishRecord::to_partition(partition, payload(&mut rng)))
                    .collect();
                if let Some(placed) = tally.record(5, client.publish_batch(topic, records).await) {
                    tally.refused_full +=
                        placed.iter().filter(|(_, offset)| *offset < 0).count() as u64;
                }
            }
            6..=9 if group != "fetch" => {
                let records = tally.record(6, client.poll(topic, group, &member, 64).await);
                for record in records.unwrap_or_default() {
                    if rng.below(10) == 0 {
                        tally.record(
                            8,
                            client
                                .retry(topic, group, &member, record.partition, record.offset)
                                .await,
                        );
                    } else {
                        tally.record(
                            7,
                            client
                                .ack(topic, group, &member, record.partition, record.offset)
                                .await,
                        );
                    }
                }
            }
            6..=9 => {
                tally.record(9, client.fetch(topic, group, &member, 500).await);
                tally.record(10, client.commit(topic, group, &member, None).await);
            }
            10 => {
                tally.record(11, client.assignment(topic, group, &member).await);
            }
            11 => {
                tally.record(12, client.committed(topic, group, partition).await);
            }
            12 => {
                tally.record(13, client.end_offset(topic, partition).await);
            }
            13 => {
                tally.record(14, client.lag(topic, group).await);
            }
            14 => {
                tally.record(15, client.describe_topic(topic).await);
            }
            15 => {
                // Churn: leave and come back, so the group rebalances.
                tally.record(2, client.leave(topic, group, &member).await);
                tally.record(1, client.join(topic, group, &member).await);
            }
            16 => {
                tally.record(0, client.create(topic, PARTITIONS).await);
            }
            _ => {
                // The fetch group also commits explicit offsets it owns.
                let owned = tally
                    .record(11, client.assignment(topic, group, &member).await)
                    .unwrap_or_default();
                if let (Some(&first), "fetch") = (owned.first(), group) {
                    let position = tally
                        .record(12, client.committed(topic, group, first).await)
                        .unwrap_or(0);
                    let offsets = BTreeMap::from([(first, position)]);
                    let result = client.commit(topic, group, &member, Some(offsets)).await;
                    // A rebalance between the two calls may move the partition away.
                    let result = match result {
                        Err(broker_client::Error::Broker(
                            broker_client::BrokerError::NotAssigned { .. },
                        )) => Ok(()),
                        other => other,
                    };
                    tally.record(10, result);
                }
            }
        }
    }
    tally.record(2, client.leave(topic, group, &member).await);
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_mixing_every_call_stay_within_the_memory_budget() {
    let seconds = env_or("SOAK_SECS", 2);
    let connections = env_or("SOAK_CONNECTIONS", 32);
    let budget = env_or("SOAK_MAX_MEMORY", 16 * MIB);
    let server = ServerProcess::start(&[
        "--capacity",
        "1000",
        "--max-memory",
        &budget.to_string(),
        "--max-connections",
        &(connections + 16).to_string(),
    ]);
    let admin = Client::connect(server.addr_string().as_str())
        .await
        .unwrap();
    for topic in TOPICS {
        assert!(admin.create(topic, PARTITIONS).await.unwrap());
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..connections as usize)
        .map(|index| tokio::spawn(connection(server.addr_string(), index, deadline)))
        .collect();
    let mut total = Tally::default();
    for task in tasks {
        let tally = task.await.unwrap();
        for (sum, calls) in total.calls.iter_mut().zip(tally.calls) {
            *sum += calls;
        }
        total.errors += tally.errors;
        total.refused_full += tally.refused_full;
        if total.first_error.is_none() {
            total.first_error = tally.first_error;
        }
    }
    let elapsed = start.elapsed();
    let described = admin.describe().await.unwrap();
    let retained: u64 = described.topics.iter().map(|t| t.retained_bytes).sum();
    let peak = server.status_bytes("VmHWM");
    let calls: u64 = total.calls.iter().sum();
    println!(
        "soak: {connections} connections for {:.1} s: {calls} calls, {:.0} calls/s, {} errors, \
         {} publishes refused as full",
        elapsed.as_secs_f64(),
        calls as f64 / elapsed.as_secs_f64(),
        total.errors,
        total.refused_full
    );
    for (name, count) in CALLS.iter().zip(total.calls) {
        println!("  {name:>14}: {count}");
    }
    println!(
        "  retained at the end: {retained} bytes of a {budget}-byte budget; server peak \
         resident memory (VmHWM) {:.1} MiB = budget + {:.1} MiB (allowed overhead {:.1} MiB)",
        peak as f64 / MIB as f64,
        (peak as f64 - budget as f64) / MIB as f64,
        allowed_overhead(connections) as f64 / MIB as f64
    );
    assert_eq!(total.errors, 0, "first error: {:?}", total.first_error);
    assert!(
        total.calls.iter().all(|&count| count > 0),
        "a call was never made"
    );
    assert!(retained <= budget);
    assert!(
        peak <= budget + allowed_overhead(connections),
        "peak {peak} bytes over budget {budget} + overhead"
    );
}
