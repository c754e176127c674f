//! Linearizability of the real `broker-server`: concurrent clients run random operations, each
//! call's invocation (just before its request is sent) and response (just after its answer
//! arrives) are recorded, and stateright's `LinearizabilityTester` searches for a sequential
//! order, consistent with real time, in which the core (`BrokerState::apply` on a clone) gives
//! every recorded answer.
//!
//! Clients meet every [`BURST`] calls, and a third of the calls describe the whole broker: both
//! keep stateright's search (depth-first over orders, without memoization) from exploding.
//! Each round starts a fresh server. Small in CI: 3 rounds of 4 clients making 40 calls each
//! (well under a second). Larger on demand, with more rounds: each round's search stays small
//! up to 4 clients (300 rounds of 4 clients x 60 calls took 27 s in release mode); with 5 or
//! more, now and then a round's search runs for minutes and the round ends as inconclusive.
//!
//! ```sh
//! LINEARIZABILITY_ROUNDS=2000 LINEARIZABILITY_CLIENTS=4 LINEARIZABILITY_CALLS=60 \
//!     cargo test --release -p broker-server --test linearizability -- --nocapture
//! ```
//!
//! `LINEARIZABILITY_SEED` fixes the first round's seed (every round prints its own; the
//! calls depend on it, their interleaving on the machine). `LINEARIZABILITY_CHECK_SECS`
//! (default 120) bounds one round's search: past it the round fails as inconclusive.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_core::{Assignor, BrokerState, Command, KeyHash, Outcome};
use broker_proto::{
    ClientCodec, ClientHandshakeCodec, Decoded, ErrorReply, Hello, HelloReply, RequestFrame,
};
use broker_testkit::{process::ServerProcess, rng::env_or, rng::Rng};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};
use tokio::net::TcpStream;
use tokio::sync::Barrier;
use tokio_util::codec::Framed;

/// Records each partition retains: small, so that partitions fill up and refuse.
const CAPACITY: i32 = 4;
const TOPICS: [&str; 2] = ["t0", "t1"];
const GROUPS: [&str; 2] = ["g0", "g1"];
const MEMBERS: [&str; 3] = ["m0", "m1", "m2"];
/// Calls each client makes between two meeting points of all clients. The calls of a burst
/// overlap freely; bursts follow each other in real time. Without them every call overlaps
/// every other client's neighbouring calls, and the checker's search (a depth-first search
/// over orders, exponential when an order that looks right fails many calls later) can take
/// minutes.
const BURST: usize = 4;

/// The sequential specification: the core itself, applied to a clone of its state.
#[derive(Clone, Debug)]
struct Broker(BrokerState);

impl SequentialSpec for Broker {
    type Op = Command;
    type Ret = Result<Outcome, ErrorReply>;

    fn invoke(&mut self, op: &Command) -> Self::Ret {
        self.0.apply(op.clone()).map_err(ErrorReply::from)
    }
}

fn fresh_spec() -> Broker {
    // As the server builds it: the capacity and the default memory budget.
    let budget = broker_server::Config::default().max_memory;
    Broker(
        BrokerState::new(CAPACITY)
            .unwrap()
            .with_memory_budget(Some(budget)),
    )
}

type Tester = LinearizabilityTester<usize, Broker>;

/// A random call; acks and retries usually name a record this client was delivered.
fn random_command(rng: &mut Rng, delivered: &[(String, String, String, i32, i64)]) -> Command {
    let topic = rng.pick(&TOPICS).to_owned();
    let group = rng.pick(&GROUPS).to_owned();
    let member = rng.pick(&MEMBERS).to_owned();
    let partition = rng.below(3) as i32;
    if rng.below(3) == 0 {
        // The whole state: a call whose hidden effects (a commit, a rebalance's reset
        // positions) the other answers do not show is pinned down by the next describe, which
        // keeps the checker's search from exploring long wrong orders.
        return Command::Describe { topic: None };
    }
    match rng.below(16) {
        0 => Command::Create {
            topic,
            partition_count: 2,
            key_hash: KeyHash::Murmur2,
            settings: Vec::new(),
        },
        1 => Command::Join {
            topic,
            group,
            member,
            assignor: rng.pick(&[None, Some(Assignor::RoundRobin), Some(Assignor::Range)]),
            settings: Vec::new(),
        },
        2 => Command::Leave {
            topic,
            group,
            member,
        },
        3 | 4 => Command::Publish {
            topic,
            partition,
            payload: Bytes::from(format!("p{}", rng.below(1000))),
        },
        5 => Command::PublishKeyed {
            topic,
            key: rng.pick(&[
                None,
                Some(Bytes::from_static(b"k1")),
                Some(Bytes::from_static(b"k2")),
            ]),
            payload: Bytes::from(format!("k{}", rng.below(1000))),
        },
        6 | 7 => Command::Poll {
            topic,
            group,
            member,
            max_records: rng.pick(&[1, 2, 64]),
            max_bytes: None,
        },
        8 | 9 if !delivered.is_empty() => {
            let (topic, group, member, partition, offset) =
                delivered[rng.below(delivered.len() as u64) as usize].clone();
            match rng.below(3) {
                0 => Command::Retry {
                    topic,
                    group,
                    member,
                    partition,
                    offset,
                },
                1 => Command::AckAndPoll {
                    topic,
                    group,
                    member,
                    acks: vec![(partition, offset)],
                    max_records: rng.pick(&[1, 64]),
                    max_bytes: None,
                },
                _ => Command::Ack {
                    topic,
                    group,
                    member,
                    partition,
                    offset,
                },
            }
        }
        8 | 9 => Command::Ack {
            topic,
            group,
            member,
            partition,
            offset: rng.below(4) as i64,
        },
        10 => Command::Fetch {
            topic,
            group,
            member,
            max_records: rng.pick(&[1, 3, 100]),
            max_bytes: None,
        },
        11 => Command::Commit {
            topic,
            group,
            member,
            offsets: match rng.below(2) {
                0 => None,
                _ => Some(BTreeMap::from([(partition, rng.below(5) as i64)])),
            },
        },
        12 => Command::Lag { topic, group },
        13 => Command::Committed {
            topic,
            group,
            partition,
        },
        14 => Command::EndOffset { topic, partition },
        _ => Command::Describe {
            topic: rng.pick(&[None, Some(topic)]),
        },
    }
}

type Connection = Framed<TcpStream, ClientCodec>;

async fn connect(server: &ServerProcess) -> Connection {
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let mut framed = Framed::new(stream, ClientHandshakeCodec::new(64 << 20));
    framed
        .send(Hello::new("linearizability", None))
        .await
        .unwrap();
    match framed.next().await.unwrap().unwrap() {
        Decoded::Message(HelloReply::Welcome { .. }) => {}
        other => panic!("unexpected hello reply {other:?}"),
    }
    framed.map_codec(|codec| codec.retype())
}

/// One client: `calls` random calls, one at a time, each recorded in `tester`, in bursts of
/// [`BURST`] calls after which every client waits for the others (`barrier`).
async fn client(
    server: Arc<ServerProcess>,
    id: usize,
    seed: u64,
    calls: usize,
    tester: Arc<Mutex<Tester>>,
    barrier: Arc<Barrier>,
) {
    let mut connection = connect(&server).await;
    let mut rng = Rng(seed ^ (id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut delivered = Vec::new();
    for call in 0..calls {
        if call % BURST == 0 {
            barrier.wait().await;
        }
        let command = random_command(&mut rng, &delivered);
        let poller = match &command {
            Command::Poll { group, member, .. } | Command::AckAndPoll { group, member, .. } => {
                Some((group.clone(), member.clone()))
            }
            _ => None,
        };
        tester
            .lock()
            .unwrap()
            .on_invoke(id, command.clone())
            .unwrap();
        connection
            .send(RequestFrame {
                correlation_id: call as u64,
                max_wait_ms: 0,
                command,
            })
            .await
            .unwrap();
        let response = match connection.next().await.unwrap().unwrap() {
            Decoded::Message(response) => response,
            other => panic!("undecodable response {other:?}"),
        };
        assert_eq!(response.correlation_id, call as u64);
        if let (
            Some((group, member)),
            Ok(Outcome::Records(records) | Outcome::AckedAndPolled { records, .. }),
        ) = (poller, &response.result)
        {
            // Remember deliveries, with the member that polled, for later acks and retries.
            delivered.extend(records.iter().map(|r| {
                (
                    r.topic.clone(),
                    group.clone(),
                    member.clone(),
                    r.partition,
                    r.offset,
                )
            }));
        }
        tester
            .lock()
            .unwrap()
            .on_return(id, without_times(response.result))
            .unwrap();
    }
}

/// `result` with every time as the checker's core (which is never given a clock) has it: the
/// server stamps records with its wall clock, and times are not what this test checks.
fn without_times(mut result: Result<Outcome, ErrorReply>) -> Result<Outcome, ErrorReply> {
    match &mut result {
        Ok(Outcome::Records(records) | Outcome::AckedAndPolled { records, .. }) => {
            for record in records {
                record.timestamp_ms = 0;
            }
        }
        Ok(Outcome::Description(description)) => {
            for topic in &mut description.topics {
                for partition in &mut topic.partitions {
                    partition.earliest_timestamp_ms = partition.earliest_timestamp_ms.map(|_| 0);
                }
            }
        }
        _ => {}
    }
    result
}

/// One round: a fresh server, `clients` concurrent clients of `calls` calls, one check.
async fn round(seed: u64, clients: usize, calls: usize) {
    let server = Arc::new(ServerProcess::start(&[
        "--capacity",
        &CAPACITY.to_string(),
        // No member may expire during the run: a leave the history does not show.
        "--session-timeout-ms",
        &u32::MAX.to_string(),
    ]));
    let tester = Arc::new(Mutex::new(Tester::new(fresh_spec())));
    let barrier = Arc::new(Barrier::new(clients));
    let tasks: Vec<_> = (0..clients)
        .map(|id| {
            tokio::spawn(client(
                Arc::clone(&server),
                id,
                seed,
                calls,
                Arc::clone(&tester),
                Arc::clone(&barrier),
            ))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let tester = tester.lock().unwrap().clone();
    assert_eq!(tester.len(), clients * calls);
    // The search runs on a thread of its own, so that one that explodes fails the test after
    // a bounded time instead of hanging it.
    let limit = Duration::from_secs(env_or("LINEARIZABILITY_CHECK_SECS", 120));
    let (done, checked) = std::sync::mpsc::channel();
    let history = tester.clone();
    std::thread::spawn(move || {
        let _ = done.send(history.serialized_history().is_some());
    });
    match checked.recv_timeout(limit) {
        Ok(linearizable) => {
            assert!(linearizable, "not linearizable (seed {seed}): {tester:#?}");
        }
        Err(_) => panic!(
            "inconclusive: the checker found no order within {limit:?} (seed {seed}); fewer \
             clients or calls keep its search small"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_see_a_linearizable_broker() {
    let clients = env_or("LINEARIZABILITY_CLIENTS", 4) as usize;
    let calls = env_or("LINEARIZABILITY_CALLS", 40) as usize;
    let rounds = env_or("LINEARIZABILITY_ROUNDS", 3);
    let first_seed = env_or(
        "LINEARIZABILITY_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    for round_index in 0..rounds {
        let seed = first_seed.wrapping_add(round_index);
        eprintln!("round {round_index}: seed {seed}, {clients} clients x {calls} calls");
        round(seed, clients, calls).await;
    }
}

#[test]
fn the_checker_rejects_a_history_the_core_cannot_produce() {
    let mut tester = Tester::new(fresh_spec());
    let create = Command::Create {
        topic: "t0".into(),
        partition_count: 1,
        key_hash: KeyHash::Murmur2,
        settings: Vec::new(),
    };
    let publish = Command::Publish {
        topic: "t0".into(),
        partition: 0,
        payload: Bytes::from_static(b"a"),
    };
    tester
        .on_invret(0, create, Ok(Outcome::Created(true)))
        .unwrap();
    // Two sequential publishes cannot both get offset 0.
    tester
        .on_invret(0, publish.clone(), Ok(Outcome::Published(0)))
        .unwrap();
    tester
        .on_invret(1, publish.clone(), Ok(Outcome::Published(0)))
        .unwrap();
    assert!(!tester.is_consistent());
    // Concurrent ones may come back in either order.
    let mut tester = Tester::new(fresh_spec());
    tester
        .on_invret(
            0,
            Command::Create {
                topic: "t0".into(),
                partition_count: 1,
                key_hash: KeyHash::Murmur2,
                settings: Vec::new(),
            },
            Ok(Outcome::Created(true)),
        )
        .unwrap();
    tester.on_invoke(0, publish.clone()).unwrap();
    tester.on_invoke(1, publish).unwrap();
    tester.on_return(1, Ok(Outcome::Published(0))).unwrap();
    tester.on_return(0, Ok(Outcome::Published(1))).unwrap();
    assert!(tester.is_consistent());
}
