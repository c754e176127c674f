//! Three nodes in one process on loopback ports: replication, a leader's loss, a node restarted
//! from its files, and a node that comes back empty and catches up from a snapshot.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_core::image::StateImage;
use broker_core::{BrokerState, Command, KeyHash, Outcome};
use openraft::network::{RaftNetwork, RaftNetworkFactory};
use tokio::net::TcpListener;

use super::*;

/// A broker in memory, as the server's replica is without its sessions and signals.
struct Memory {
    state: Mutex<BrokerState>,
}

impl Memory {
    fn new() -> Arc<Memory> {
        Arc::new(Memory {
            state: Mutex::new(BrokerState::new(1_000).unwrap()),
        })
    }

    fn image(&self) -> StateImage {
        self.state.lock().unwrap().to_image()
    }
}

impl Replica for Memory {
    fn apply(&self, proposal: Proposal) -> Applied {
        let mut state = self.state.lock().unwrap();
        match proposal {
            Proposal::Commands { now_ms, commands } => Applied {
                results: commands
                    .into_iter()
                    .map(|command| state.apply_at(now_ms, command))
                    .collect(),
                changed: Vec::new(),
            },
            Proposal::Tick { now_ms } => Applied {
                results: Vec::new(),
                changed: state.advance_clock(now_ms).unwrap_or_default(),
            },
        }
    }

    fn image(&self) -> StateImage {
        Memory::image(self)
    }

    fn restore(&self, image: StateImage) -> Result<(), String> {
        *self.state.lock().unwrap() = BrokerState::from_image(image, None)?;
        Ok(())
    }
}

struct Node {
    cluster: Cluster,
    replica: Arc<Memory>,
}

async fn listeners(count: usize) -> Vec<TcpListener> {
    let mut listeners = Vec::new();
    for _ in 0..count {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    listeners
}

fn members(listeners: &[TcpListener]) -> BTreeMap<NodeId, ClusterNode> {
    listeners
        .iter()
        .enumerate()
        .map(|(index, listener)| {
            let addr = listener.local_addr().unwrap().to_string();
            let node = ClusterNode {
                raft_addr: addr.clone(),
                client_addr: format!("client-of-{addr}"),
            };
            (index as NodeId + 1, node)
        })
        .collect()
}

fn config(id: NodeId, members: &BTreeMap<NodeId, ClusterNode>, dir: &Path) -> ClusterConfig {
    ClusterConfig {
        heartbeat: Duration::from_millis(50),
        election_timeout: Duration::from_millis(250),
        snapshot_every: 50,
        sync: LogSync::Never,
        token: Some("secret".to_owned()),
        ..ClusterConfig::new(id, members.clone(), dir.join(format!("node-{id}")))
    }
}

async fn start(
    id: NodeId,
    members: &BTreeMap<NodeId, ClusterNode>,
    dir: &Path,
    listener: TcpListener,
) -> Node {
    let replica = Memory::new();
    let cluster = Cluster::start(config(id, members, dir), listener, Arc::clone(&replica))
        .await
        .unwrap();
    Node { cluster, replica }
}

/// Waits until one of `nodes` leads and every other knows it; returns its position.
async fn leader(nodes: &[&Node]) -> usize {
    for _ in 0..200 {
        let leaders: Vec<usize> = (0..nodes.len())
            .filter(|&at| nodes[at].cluster.is_leader())
            .collect();
        if let [only] = leaders[..] {
            let id = nodes[only].cluster.node_id();
            if nodes
                .iter()
                .all(|node| node.cluster.leader().map(|(leader, _)| leader) == Some(id))
            {
                return only;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no leader elected in 5 s");
}

/// Waits until every node's state equals the first's and has `records` records in topic t.
async fn converged(nodes: &[&Node], records: i64) {
    for _ in 0..200 {
        let images: Vec<StateImage> = nodes.iter().map(|node| node.replica.image()).collect();
        let end = {
            let state = nodes[0].replica.state.lock().unwrap();
            state.end_offset("t", 0).unwrap_or(-1)
        };
        if end == records && images.iter().all(|image| *image == images[0]) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the nodes did not converge on {records} records");
}

fn publish(index: usize) -> Command {
    Command::Publish {
        topic: "t".into(),
        partition: 0,
        payload: format!("record {index}").into_bytes().into(),
    }
}

async fn propose_publishes(node: &Node, range: std::ops::Range<usize>) {
    for index in range {
        let applied = node
            .cluster
            .propose(Proposal::Commands {
                now_ms: 1_000 + index as i64,
                commands: vec![publish(index)],
            })
            .await
            .unwrap();
        assert_eq!(applied.results, vec![Ok(Outcome::Published(index as i64))]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_survive_a_leader_loss_and_catch_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut bound = listeners(3).await;
    let members = members(&bound);
    let mut nodes = Vec::new();
    for (index, listener) in bound.drain(..).enumerate() {
        nodes.push(Some(
            start(index as NodeId + 1, &members, dir.path(), listener).await,
        ));
    }
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    let first = leader(&all).await;
    let create = Command::Create {
        topic: "t".into(),
        partition_count: 1,
        key_hash: KeyHash::default(),
        settings: Vec::new(),
    };
    let applied = all[first]
        .cluster
        .propose(Proposal::Commands {
            now_ms: 1_000,
            commands: vec![create],
        })
        .await
        .unwrap();
    assert_eq!(applied.results, vec![Ok(Outcome::Created(true))]);
    propose_publishes(all[first], 0..120).await;
    converged(&all, 120).await;

    // A follower refuses and names the leader.
    let follower = (first + 1) % 3;
    let refused = all[follower]
        .cluster
        .propose(Proposal::Tick { now_ms: 2_000 })
        .await
        .unwrap_err();
    let leader_id = all[first].cluster.node_id();
    assert_eq!(
        refused,
        ProposeError::NotLeader {
            leader: Some((leader_id, members[&leader_id].clone()))
        }
    );

    // The leader goes away: the other two elect one and go on.
    let gone = nodes[first].take().unwrap();
    gone.cluster.shutdown().await;
    let rest: Vec<&Node> = nodes.iter().flatten().collect();
    let second = leader(&rest).await;
    propose_publishes(rest[second], 120..150).await;
    converged(&rest, 150).await;
    // The new leader knows the old one does not answer.
    assert!(rest[second]
        .cluster
        .status()
        .unreachable
        .contains(&leader_id));

    // The old leader comes back from its files and catches up.
    let listener = TcpListener::bind(&members[&leader_id].raft_addr)
        .await
        .unwrap();
    nodes[first] = Some(start(leader_id, &members, dir.path(), listener).await);
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    converged(&all, 150).await;

    // A node whose files are lost comes back empty and catches up from a snapshot (the log
    // before the last snapshot is gone from the others).
    let lost = (leader(&all).await + 1) % 3;
    let lost_id = all[lost].cluster.node_id();
    let node = nodes[lost].take().unwrap();
    node.cluster.shutdown().await;
    std::fs::remove_dir_all(dir.path().join(format!("node-{lost_id}"))).unwrap();
    let rest: Vec<&Node> = nodes.iter().flatten().collect();
    let third = leader(&rest).await;
    propose_publishes(rest[third], 150..260).await;
    let listener = TcpListener::bind(&members[&lost_id].raft_addr)
        .await
        .unwrap();
    nodes[lost] = Some(start(lost_id, &members, dir.path(), listener).await);
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    converged(&all, 260).await;
    for node in all {
        node.cluster.shutdown().await;
    }
    // It caught up from a snapshot: its log starts after the entries it never saw.
    let rejoined = LogStore::open(
        &dir.path().join(format!("node-{lost_id}")),
        lost_id,
        LogSync::Never,
    )
    .unwrap();
    let first_entry = rejoined.files().entries.keys().next().copied();
    assert!(first_entry > Some(2), "the log starts at {first_entry:?}");
}

/// Why node 1 at `to` refuses a vote request from node 2 holding `token`.
async fn vote_refusal(token: &str, to: &ClusterNode) -> String {
    let mut link = Network::new(2, Some(token.to_owned()), None)
        .new_client(1, to)
        .await;
    let vote = openraft::raft::VoteRequest::new(openraft::Vote::new(9, 2), None);
    let option = openraft::network::RPCOption::new(Duration::from_secs(2));
    link.vote(vote, option).await.unwrap_err().to_string()
}

#[tokio::test]
async fn a_peer_with_the_wrong_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let members = members(std::slice::from_ref(&listener));
    let node = start(1, &members, dir.path(), listener).await;
    let refused = vote_refusal("wrong", &members[&1]).await;
    assert!(refused.contains("cluster token"), "{refused}");
    node.cluster.shutdown().await;

    // A node without the token is refused by one that has it, the other way round too.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let others = crate::tests::members(std::slice::from_ref(&listener));
    let open = ClusterConfig {
        token: None,
        ..config(1, &others, &dir.path().join("open"))
    };
    let open = Cluster::start(open, listener, Memory::new()).await.unwrap();
    let refused = vote_refusal("secret", &others[&1]).await;
    assert!(
        refused.contains("does not hold this cluster's token"),
        "{refused}"
    );
    open.shutdown().await;
}

/// Bytes that are not a peer's hello (a forged length, an oversized frame) close the connection
/// and change nothing: the node goes on serving.
#[tokio::test]
async fn forged_hellos_are_refused_without_harm() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let members = members(std::slice::from_ref(&listener));
    let node = start(1, &members, dir.path(), listener).await;
    let mut forged_length = Vec::new();
    forged_length.extend_from_slice(&2u64.to_le_bytes());
    // The protocol's name claims 2^60 bytes.
    forged_length.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let oversized = vec![0u8; 100 * 1024];
    for body in [forged_length, oversized] {
        let mut stream = tokio::net::TcpStream::connect(&members[&1].raft_addr)
            .await
            .unwrap();
        let mut frame = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        // The node may close the connection before it has read everything.
        let _ = stream.write_all(&frame).await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
            .await
            .expect("the connection was left open");
        assert!(read.is_err() || answer.is_empty(), "answered {answer:?}");
    }
    let first = leader(&[&node]).await;
    assert_eq!(first, 0);
    node.cluster
        .propose(Proposal::Tick { now_ms: 1 })
        .await
        .expect("the node still serves");
    node.cluster.shutdown().await;
}
