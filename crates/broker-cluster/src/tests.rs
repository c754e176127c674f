//! Three nodes in one process on loopback ports: replication, a leader's loss, a node restarted
//! from its files, and a node that comes back empty and catches up from a snapshot.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker_core::cold::{ColdStore, LogId};
use broker_core::image::{StateImage, TopicImage};
use broker_core::{BrokerError, BrokerState, Command, KeyHash, Outcome};
use openraft::network::{RaftNetwork, RaftNetworkFactory};
use tokio::net::TcpListener;

use super::*;
use crate::types::{Entry, StorageError};

/// A broker, as the server's replica is without its sessions and signals.
struct Memory {
    state: Mutex<BrokerState>,
    records: Mutex<Option<Arc<dyn ColdStore>>>,
}

impl Memory {
    fn new() -> Arc<Memory> {
        Arc::new(Memory {
            state: Mutex::new(BrokerState::new(1_000).unwrap()),
            records: Mutex::new(None),
        })
    }

    fn image(&self) -> StateImage {
        self.state.lock().unwrap().to_image()
    }

    /// The state's image with every record in memory, read back from the segments where the
    /// node put them: equal on every node that applied the same entries, whenever each took
    /// its snapshots.
    fn contents(&self) -> StateImage {
        let mut image = self.image();
        let records = self.records.lock().unwrap().clone().unwrap();
        for (_, topic) in &mut image.topics {
            for (number, partition) in topic.partitions.iter_mut().enumerate() {
                let log = LogId {
                    topic: topic.id,
                    partition: number as u32,
                };
                let mut all = records
                    .read(log, partition.base..partition.cold_end, None)
                    .unwrap();
                all.append(&mut partition.records);
                partition.records = all;
                partition.cold_end = partition.base;
                partition.cold_bytes = 0;
            }
        }
        image
    }

    /// How many records of the state are on disk (in the record segments).
    fn on_disk(&self) -> i64 {
        self.image()
            .topics
            .iter()
            .flat_map(|(_, topic)| &topic.partitions)
            .map(|partition| partition.cold_end - partition.base)
            .sum()
    }
}

impl Replica for Memory {
    fn apply(&self, change: BrokerChange) -> Applied {
        let mut state = self.state.lock().unwrap();
        match change {
            BrokerChange::Commands {
                now_ms,
                names,
                revision,
                commands,
            } => {
                state.set_names(names);
                state.set_revision(revision);
                Applied {
                    results: commands
                        .into_iter()
                        .map(|command| state.apply_at(now_ms, command))
                        .collect(),
                    ..Applied::default()
                }
            }
            BrokerChange::Tick { now_ms, revision } => {
                state.set_revision(revision);
                Applied {
                    changed: state.advance_clock(now_ms).unwrap_or_default(),
                    ..Applied::default()
                }
            }
            BrokerChange::Budget { bytes } => {
                state.set_memory_budget(bytes);
                Applied::default()
            }
        }
    }

    fn holds_topic(&self, topic: &str) -> bool {
        self.state.lock().unwrap().holds_topic(topic)
    }

    fn image(&self) -> StateImage {
        Memory::image(self)
    }

    fn restore(&self, image: StateImage, records: Arc<dyn ColdStore>) -> Result<(), String> {
        *self.state.lock().unwrap() = BrokerState::from_image(image, Some(Arc::clone(&records)))?;
        *self.records.lock().unwrap() = Some(records);
        Ok(())
    }

    fn evict(&self, written: &[(LogId, i64)]) {
        self.state.lock().unwrap().evict(written);
    }

    fn import_topic(&self, topic: &str, image: TopicImage) -> Result<(), BrokerError> {
        self.state.lock().unwrap().import_topic(topic, image)
    }

    fn dead_letter_ties(&self, topic: &str) -> Vec<String> {
        self.state.lock().unwrap().dead_letter_ties(topic)
    }

    fn drop_topic(&self, topic: &str) -> bool {
        let delete = Command::DeleteTopic {
            topic: topic.to_owned(),
        };
        let mut state = self.state.lock().unwrap();
        let now_ms = state.clock_ms();
        matches!(state.apply_at(now_ms, delete), Ok(Outcome::Deleted(true)))
    }

    fn failure(&self) -> Option<String> {
        self.state.lock().unwrap().failure().map(str::to_owned)
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
        // Every entry but the last read back from the disk: the path of a follower catching up.
        cached_log_bytes: 0,
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
        let images: Vec<StateImage> = nodes.iter().map(|node| node.replica.contents()).collect();
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

/// Three nodes of a new cluster in `dir`, started; with the members they form.
async fn start_three(dir: &Path) -> (BTreeMap<NodeId, ClusterNode>, Vec<Option<Node>>) {
    let mut bound = listeners(3).await;
    let members = members(&bound);
    let mut nodes = Vec::new();
    for (index, listener) in bound.drain(..).enumerate() {
        nodes.push(Some(
            start(index as NodeId + 1, &members, dir, listener).await,
        ));
    }
    (members, nodes)
}

/// Creates the topic `t` of one partition the tests publish to.
fn create_topic() -> Command {
    Command::Create {
        topic: "t".into(),
        partition_count: 1,
        key_hash: KeyHash::default(),
        settings: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_survive_a_leader_loss_and_catch_up() {
    let dir = tempfile::tempdir().unwrap();
    let (members, mut nodes) = start_three(dir.path()).await;
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    let first = leader(&all).await;
    let create = create_topic();
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

    // A node whose files are lost is refused when it comes back empty under its id.
    let leading = leader(&all).await;
    let leading_id = all[leading].cluster.node_id();
    let lost = (leading + 1) % 3;
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
    let restarted = Cluster::start(
        config(lost_id, &members, dir.path()),
        listener,
        Memory::new(),
    )
    .await;
    // Only the leader that replicated to the node knows it held entries: after an election
    // (on a busy machine one may come meanwhile) nothing tells it from a new node.
    match restarted {
        Err(ClusterError::LogLost { node, .. }) => assert_eq!(node, lost_id),
        Ok(cluster) if rest[third].cluster.node_id() != leading_id => cluster.shutdown().await,
        other => panic!("a node that lost its log started: {:?}", other.err()),
    }

    // Removed, it is replaced by a new node, which catches up from a snapshot (the log before
    // the last snapshot is gone from the others).
    rest[third]
        .cluster
        .remove_node(lost_id, Duration::from_secs(10))
        .await
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let new_node = ClusterNode {
        raft_addr: addr.clone(),
        client_addr: format!("client-of-{addr}"),
    };
    let mut with_new = members.clone();
    with_new.insert(4, new_node.clone());
    let replica = Memory::new();
    let joining = ClusterConfig {
        join: true,
        ..config(4, &with_new, dir.path())
    };
    let cluster = Cluster::start(joining, listener, Arc::clone(&replica))
        .await
        .unwrap();
    let leading = leader(&rest).await;
    rest[leading]
        .cluster
        .add_node(4, new_node, Duration::from_secs(10))
        .await
        .unwrap();
    nodes[lost] = Some(Node { cluster, replica });
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    converged(&all, 260).await;
    // Snapshots moved the records to segment files on every node; the new node's came with
    // the snapshot it was sent.
    for node in &all {
        assert!(node.replica.on_disk() > 0, "records on disk");
    }
    for node in all {
        node.cluster.shutdown().await;
    }
    // It caught up from a snapshot: its log starts after the entries it never saw.
    let rejoined = LogStore::open(&dir.path().join("node-4"), 4, LogSync::Never).unwrap();
    let first_entry = rejoined.last_index().and_then(|last| {
        let files = rejoined.files();
        files
            .entries(..=last)
            .ok()?
            .first()
            .map(|entry| entry.log_id.index)
    });
    assert!(first_entry > Some(2), "the log starts at {first_entry:?}");
}

/// A follower keeps its connection to the leader it forwards proposals to. When that leader
/// restarts and leads again, the kept connection is closed: the next proposal is sent on a new
/// one, not answered "may or may not have been applied".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_forwarded_to_a_leader_that_restarted_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (members, mut nodes) = start_three(dir.path()).await;
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    let first = leader(&all).await;
    let leader_id = all[first].cluster.node_id();
    let follower = (first + 1) % 3;
    let forward = |commands: Vec<Command>| Proposal::Commands {
        now_ms: 1_000,
        commands,
    };
    let applied = all[follower]
        .cluster
        .propose_via_leader(forward(vec![create_topic()]))
        .await
        .unwrap();
    assert_eq!(applied.results, vec![Ok(Outcome::Created(true))]);

    // The leader restarts from its files, and leads again.
    let gone = nodes[first].take().unwrap();
    gone.cluster.shutdown().await;
    let listener = TcpListener::bind(&members[&leader_id].raft_addr)
        .await
        .unwrap();
    nodes[first] = Some(start(leader_id, &members, dir.path(), listener).await);
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    let elected = leader(&all).await;
    if elected != first {
        all[elected]
            .cluster
            .transfer_leadership(leader_id, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(leader(&all).await, first);
    }

    let applied = all[follower]
        .cluster
        .propose_via_leader(forward(vec![publish(0)]))
        .await
        .unwrap();
    assert_eq!(applied.results, vec![Ok(Outcome::Published(0))]);
    for node in nodes.iter().flatten() {
        node.cluster.shutdown().await;
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_a_new_cluster_given_another_members_list_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut bound = listeners(3).await;
    let members = members(&bound);
    let third = bound.pop().unwrap();
    let mut nodes = Vec::new();
    for (index, listener) in bound.into_iter().enumerate() {
        nodes.push(start(index as NodeId + 1, &members, dir.path(), listener).await);
    }
    // Node 3 is given node 1's client address wrong: it would propose a membership of its own.
    // Its list also names a node 4 that accepts connections and never answers, so that its
    // check takes a while, long enough for the others' leader to send it their log.
    let mut other = members.clone();
    other.get_mut(&1).unwrap().client_addr = "elsewhere:9092".to_owned();
    let frozen = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let frozen_addr = frozen.local_addr().unwrap().to_string();
    other.insert(4, ClusterNode::new(&frozen_addr, "frozen:9092").unwrap());
    let refused = Cluster::start(config(3, &other, dir.path()), third, Memory::new()).await;
    let Err(refusal @ ClusterError::MembersDiffer { .. }) = refused else {
        panic!("started: {refused:?}");
    };
    let said = refusal.to_string();
    assert!(said.contains("must be given the same list"), "{said}");
    assert!(said.contains("elsewhere:9092"), "{said}");
    // The other two formed the cluster meanwhile, whose leader sent node 3 its log: refused,
    // node 3 took none of it, so that a second start with the wrong list is refused again.
    let [first, second] = &nodes[..] else {
        unreachable!()
    };
    leader(&[first, second]).await;
    let third_dir = dir.path().join("node-3");
    assert!(LogStore::holds_no_entries(&third_dir).unwrap());
    let listener = TcpListener::bind(&members[&3].raft_addr).await.unwrap();
    let again = Cluster::start(config(3, &other, dir.path()), listener, Memory::new()).await;
    assert!(
        matches!(again, Err(ClusterError::MembersDiffer { .. })),
        "{again:?}"
    );
    assert!(LogStore::holds_no_entries(&third_dir).unwrap());
    // Started with the same list, it joins the cluster.
    let listener = TcpListener::bind(&members[&3].raft_addr).await.unwrap();
    let third = start(3, &members, dir.path(), listener).await;
    leader(&[first, second, &third]).await;
    for node in [first, second, &third] {
        node.cluster.shutdown().await;
    }
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

/// Applies `proposals` to `machine` as entries of term 1 from index `first`.
async fn apply_all(
    machine: &mut StateMachine<Memory>,
    first: u64,
    proposals: Vec<Proposal>,
) -> Vec<Applied> {
    use openraft::storage::RaftStateMachine;
    let entries: Vec<Entry> = proposals
        .into_iter()
        .enumerate()
        .map(|(at, proposal)| Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), first + at as u64),
            payload: openraft::EntryPayload::Normal(proposal),
        })
        .collect();
    machine.apply(entries).await.unwrap()
}

fn create_and_publish(range: std::ops::Range<usize>) -> Vec<Proposal> {
    std::iter::once(create_topic())
        .chain(range.map(publish))
        .map(|command| Proposal::Commands {
            now_ms: 1_000,
            commands: vec![command],
        })
        .collect()
}

/// Builds a snapshot of `machine` now, as the consensus engine asks it to.
async fn take_snapshot(
    machine: &mut StateMachine<Memory>,
) -> openraft::storage::Snapshot<TypeConfig> {
    use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
    machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap()
}

/// The bytes of `machine`'s current snapshot as it sends them.
async fn sent_bytes(machine: &mut StateMachine<Memory>) -> (SnapshotMeta, Vec<u8>) {
    use openraft::storage::RaftStateMachine;
    use tokio::io::AsyncReadExt;
    let mut snapshot = machine.get_current_snapshot().await.unwrap().unwrap();
    let mut bytes = Vec::new();
    snapshot.snapshot.read_to_end(&mut bytes).await.unwrap();
    (snapshot.meta, bytes)
}

type SnapshotMeta = openraft::SnapshotMeta<NodeId, ClusterNode>;

/// Receives `bytes` into `machine` in chunks, as the consensus engine does, and installs them.
async fn receive(
    machine: &mut StateMachine<Memory>,
    meta: &SnapshotMeta,
    bytes: &[u8],
) -> Result<(), StorageError> {
    use openraft::storage::RaftStateMachine;
    use tokio::io::AsyncWriteExt;
    let mut stream = machine.begin_receiving_snapshot().await.unwrap();
    for chunk in bytes.chunks(1_000) {
        stream.write_all(chunk).await.unwrap();
    }
    machine.install_snapshot(meta, stream).await
}

fn record_payloads(image: &StateImage) -> Vec<String> {
    image.topics[0].1.partitions[0]
        .records
        .iter()
        .map(|record| String::from_utf8(record.payload.to_vec()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_put_records_on_disk_and_travel_with_their_segments() {
    let dir = tempfile::tempdir().unwrap();
    let leader_dir = dir.path().join("leader");
    let replica = Memory::new();
    // Small segments: the records span several files.
    let mut machine = StateMachine::open(&leader_dir, Arc::clone(&replica), 4096).unwrap();
    assert!(!machine.has_snapshot());
    apply_all(&mut machine, 1, create_and_publish(0..300)).await;
    let snapshot = take_snapshot(&mut machine).await;
    assert_eq!(snapshot.meta.last_log_id.map(|id| id.index), Some(301));
    assert_eq!(replica.on_disk(), 300, "every record moved to segments");
    let at_snapshot = replica.contents();
    let segments = std::fs::read_dir(leader_dir.join("store-0/records"))
        .unwrap()
        .flat_map(|log| std::fs::read_dir(log.unwrap().path()).unwrap())
        .count();
    assert!(segments > 2, "{segments} segment files");
    apply_all(
        &mut machine,
        302,
        create_and_publish(300..310)[1..].to_vec(),
    )
    .await;
    assert_eq!(replica.on_disk(), 300, "later records stay in memory");

    // A restart reads the snapshot and its segments.
    drop(machine);
    let reopened = Memory::new();
    let mut machine = StateMachine::open(&leader_dir, Arc::clone(&reopened), 4096).unwrap();
    assert!(machine.has_snapshot());
    assert_eq!(reopened.contents(), at_snapshot);
    assert_eq!(
        record_payloads(&at_snapshot)[299],
        "record 299",
        "the records themselves"
    );

    // Sent to another node in chunks, the snapshot brings the segments along.
    let (meta, bytes) = sent_bytes(&mut machine).await;
    let follower = Memory::new();
    let follower_dir = dir.path().join("follower");
    let mut other = StateMachine::open(&follower_dir, Arc::clone(&follower), 4096).unwrap();
    receive(&mut other, &meta, &bytes).await.unwrap();
    assert_eq!(follower.contents(), at_snapshot);
    assert_eq!(follower.on_disk(), 300);
    assert!(follower_dir.join("store-1/records").is_dir());
    assert!(
        !follower_dir.join("store-0").exists(),
        "the replaced store went"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&follower_dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("incoming") || name.starts_with("outgoing"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let (_, again) = sent_bytes(&mut other).await;
    assert_eq!(again, bytes, "the follower sends what it received");
    drop(other);
    let restarted = Memory::new();
    let other = StateMachine::open(&follower_dir, Arc::clone(&restarted), 4096).unwrap();
    assert!(other.has_snapshot());
    assert_eq!(restarted.contents(), at_snapshot);

    // A leader of an earlier version sends the whole image, records included: it installs.
    let mut whole = reopened.contents();
    whole.topics[0].1.partitions[0].records.truncate(7);
    let partition = &mut whole.topics[0].1.partitions[0];
    partition.retained_bytes = partition.records.iter().map(|record| record.size()).sum();
    whole.retained_bytes = partition.retained_bytes;
    let sent_whole = crate::codec::encode(&whole).unwrap();
    let upgraded = Memory::new();
    let mut machine =
        StateMachine::open(&dir.path().join("upgraded"), Arc::clone(&upgraded), 4096).unwrap();
    receive(&mut machine, &meta, &sent_whole).await.unwrap();
    assert_eq!(upgraded.contents(), whole);
    assert_eq!(upgraded.on_disk(), 0, "in memory until its next snapshot");

    // A damaged or cut transfer is refused and changes nothing.
    for (what, damaged) in [
        ("cut short", bytes[..bytes.len() - 10].to_vec()),
        ("with more after it", [&bytes[..], b"extra"].concat()),
        ("a flipped checkpoint byte", {
            let mut flipped = bytes.clone();
            flipped[30] ^= 1;
            flipped
        }),
        ("not a snapshot", b"hello".to_vec()),
    ] {
        let untouched = Memory::new();
        let untouched_dir = dir.path().join("untouched");
        let mut machine = StateMachine::open(&untouched_dir, Arc::clone(&untouched), 4096).unwrap();
        let before = untouched.image();
        let refused = receive(&mut machine, &meta, &damaged).await;
        assert!(refused.is_err(), "{what}");
        assert_eq!(untouched.image(), before, "{what}");
        drop(machine);
        // What it left is cleaned up at the next start.
        StateMachine::open(&untouched_dir, Memory::new(), 4096).unwrap();
        let names: Vec<_> = std::fs::read_dir(&untouched_dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["store-0".to_owned()], "{what}");
    }
}

/// The snapshot file of `tests/fixtures/cluster-v1` (made by `tests/fixtures/make-cluster-v1.sh`
/// with a release whose snapshots held every record, format 1) opens with its records in
/// memory; the next snapshot moves them to segment files, and the state reads the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_format_1_opens_and_the_next_moves_its_records_to_disk() {
    use openraft::storage::RaftStateMachine;
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/cluster-v1/raft/snapshot");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&fixture, dir.path().join("snapshot")).unwrap();
    let replica = Memory::new();
    let mut machine = StateMachine::open(dir.path(), Arc::clone(&replica), 4096).unwrap();
    assert!(machine.has_snapshot());
    let (applied, membership) = machine.applied_state().await.unwrap();
    assert!(applied.is_some_and(|id| id.index >= 19_000), "{applied:?}");
    assert!(membership.membership().get_node(&1).is_some());
    let opened = replica.contents();
    let names: Vec<&str> = opened
        .topics
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(
        names.contains(&"orders") && names.contains(&"events"),
        "{names:?}"
    );
    let retained: i64 = opened
        .topics
        .iter()
        .flat_map(|(_, topic)| &topic.partitions)
        .map(|partition| partition.records.len() as i64)
        .sum();
    assert!(retained > 50, "{retained} records");
    assert_eq!(
        replica.on_disk(),
        0,
        "format 1 holds its records in the snapshot"
    );

    take_snapshot(&mut machine).await;
    assert_eq!(replica.on_disk(), retained);
    assert_eq!(replica.contents(), opened);
    let written = std::fs::read(dir.path().join("snapshot")).unwrap();
    assert_eq!(&written[8..12], &5u32.to_le_bytes(), "written in format 5");
    drop(machine);
    let reopened = Memory::new();
    StateMachine::open(dir.path(), Arc::clone(&reopened), 4096).unwrap();
    assert_eq!(reopened.contents(), opened);
}

/// A follower whose log lost its last entries after it had answered for them (a power loss
/// with `--fsync batch` or `never`) comes back with the shorter log: the leader sends those
/// entries again instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_log_went_back_is_sent_the_entries_again() {
    let dir = tempfile::tempdir().unwrap();
    let (members, mut nodes) = start_three(dir.path()).await;
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    let first = leader(&all).await;
    let create = create_topic();
    all[first]
        .cluster
        .propose(Proposal::Commands {
            now_ms: 1_000,
            commands: vec![create],
        })
        .await
        .unwrap();
    propose_publishes(all[first], 0..30).await;
    converged(&all, 30).await;

    let follower = (first + 1) % 3;
    let id = all[follower].cluster.node_id();
    let node = nodes[follower].take().unwrap();
    node.cluster.shutdown().await;
    drop(node);
    {
        let log =
            LogStore::open(&dir.path().join(format!("node-{id}")), id, LogSync::Never).unwrap();
        let last = log.last_index().unwrap();
        log.files().truncate(last - 4).unwrap();
    }
    let listener = TcpListener::bind(&members[&id].raft_addr).await.unwrap();
    nodes[follower] = Some(start(id, &members, dir.path(), listener).await);
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    let leading = leader(&all).await;
    propose_publishes(all[leading], 30..40).await;
    converged(&all, 40).await;
    for node in all {
        node.cluster.shutdown().await;
    }
}

/// Every file and directory under `dir` (which may not exist), with the bytes of each file.
fn every_file(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                found.insert(path.clone(), None);
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                found.insert(path, Some(bytes));
            }
        }
    }
    found
}

/// The paths `before` and `after` (from [`every_file`]) disagree on: created, removed or
/// changed.
fn changed(
    before: &BTreeMap<PathBuf, Option<Vec<u8>>>,
    after: &BTreeMap<PathBuf, Option<Vec<u8>>>,
) -> Vec<PathBuf> {
    let paths: std::collections::BTreeSet<_> = before.keys().chain(after.keys()).collect();
    paths
        .into_iter()
        .filter(|path| before.get(*path) != after.get(*path))
        .cloned()
        .collect()
}

/// Appends `bytes` to the file at `path`.
fn append_to(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}

/// The first bytes of a record that a crash cut short: a length no entry has (so that no
/// record appended after a repair starts the same way), and one byte of the checksum.
const TORN_RECORD: [u8; 5] = [0xff, 0xff, 0xff, 0xff, 1];

/// A node's directory (`node-1` under `dir`) as a crash in the middle of a snapshot leaves
/// it: a snapshot with records in segment files, the log after it with a torn last record,
/// records appended to a segment after what the snapshot names, and files of a transfer and
/// of a store no snapshot names. Returns the node's members, its directory, its last log
/// segment as it was before it was torn, and the record segment with its length before.
async fn crashed_node(
    dir: &Path,
) -> (
    BTreeMap<NodeId, ClusterNode>,
    PathBuf,
    (PathBuf, Vec<u8>),
    (PathBuf, u64),
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let members = members(std::slice::from_ref(&listener));
    let node = start(1, &members, dir, listener).await;
    leader(&[&node]).await;
    node.cluster
        .propose(Proposal::Commands {
            now_ms: 1_000,
            commands: vec![create_topic()],
        })
        .await
        .unwrap();
    propose_publishes(&node, 0..80).await;
    for _ in 0..200 {
        if node.replica.on_disk() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(node.replica.on_disk() > 0, "no snapshot in 5 s");
    node.cluster.shutdown().await;
    let node_dir = dir.join("node-1");
    let log = node_dir.join("raft-log");
    let whole_log = std::fs::read(&log).unwrap();
    append_to(&log, &TORN_RECORD);
    let records = every_file(&node_dir.join("store-0"))
        .into_keys()
        .find(|path| path.extension().is_some_and(|ext| ext == "rec"))
        .unwrap();
    let records_len = std::fs::metadata(&records).unwrap().len();
    append_to(&records, b"records of a snapshot that did not finish");
    std::fs::write(
        node_dir.join("incoming-9"),
        b"half a snapshot from the leader",
    )
    .unwrap();
    std::fs::create_dir_all(node_dir.join("store-7/records")).unwrap();
    (members, node_dir, (log, whole_log), (records, records_len))
}

/// A replica that refuses every image it is given, as the broker refuses an inconsistent one.
struct Refusing;

impl Replica for Refusing {
    fn apply(&self, _: BrokerChange) -> Applied {
        Applied::default()
    }

    fn holds_topic(&self, _: &str) -> bool {
        false
    }

    fn image(&self) -> StateImage {
        Memory::new().image()
    }

    fn restore(&self, _: StateImage, _: Arc<dyn ColdStore>) -> Result<(), String> {
        Err("an inconsistent image".to_owned())
    }

    fn evict(&self, _: &[(LogId, i64)]) {}

    fn import_topic(&self, topic: &str, _: TopicImage) -> Result<(), BrokerError> {
        Err(BrokerError::InvalidArgument(format!(
            "no room for {topic:?}"
        )))
    }

    fn drop_topic(&self, _: &str) -> bool {
        false
    }

    fn dead_letter_ties(&self, _: &str) -> Vec<String> {
        Vec::new()
    }

    fn failure(&self) -> Option<String> {
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_start_leaves_every_file_of_the_node_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (members, node_dir, (log, _), (records, records_len)) = crashed_node(dir.path()).await;
    let snapshot = node_dir.join("snapshot");
    let mut flipped_snapshot = std::fs::read(&snapshot).unwrap();
    let middle = flipped_snapshot.len() / 2;
    flipped_snapshot[middle] ^= 0x5a;
    let index = records.with_extension("idx");
    let mut short_index = std::fs::read(&index).unwrap();
    short_index.pop();
    // The first record's body: whole records and the torn one follow it.
    let mut flipped_log = std::fs::read(&log).unwrap();
    flipped_log[40] ^= 0x5a;
    // Each damage on top of the crash's leftovers, with what the refusal says.
    let damages: [(&str, &Path, Vec<u8>, &str); 3] = [
        (
            "a damaged snapshot",
            &snapshot,
            flipped_snapshot,
            "checksum",
        ),
        (
            "a record segment shorter than the snapshot says",
            &index,
            short_index,
            "the file ends at byte",
        ),
        (
            "a damaged record in the middle of the log",
            &log,
            flipped_log,
            "a damaged record before the end",
        ),
    ];
    for (what, path, damaged, said) in damages {
        let undamaged = std::fs::read(path).unwrap();
        std::fs::write(path, &damaged).unwrap();
        let before = every_file(&node_dir);
        let listener = TcpListener::bind(&members[&1].raft_addr).await.unwrap();
        let refused =
            Cluster::start(config(1, &members, dir.path()), listener, Memory::new()).await;
        let Err(refusal) = refused else {
            panic!("started with {what}");
        };
        assert!(refusal.to_string().contains(said), "{what}: {refusal}");
        assert_eq!(
            changed(&before, &every_file(&node_dir)),
            Vec::<PathBuf>::new(),
            "{what}"
        );
        std::fs::write(path, undamaged).unwrap();
    }
    // Refused by the broker when it takes the snapshot's state.
    let before = every_file(&node_dir);
    let listener = TcpListener::bind(&members[&1].raft_addr).await.unwrap();
    let refused = Cluster::start(
        config(1, &members, dir.path()),
        listener,
        Arc::new(Refusing),
    )
    .await;
    let refusal = refused.unwrap_err().to_string();
    assert!(refusal.contains("an inconsistent image"), "{refusal}");
    assert_eq!(
        changed(&before, &every_file(&node_dir)),
        Vec::<PathBuf>::new()
    );
    // What the crash left was there all along.
    assert!(std::fs::metadata(&records).unwrap().len() > records_len);
    assert!(node_dir.join("incoming-9").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_goes_ahead_repairs_what_the_crash_left() {
    let dir = tempfile::tempdir().unwrap();
    let (members, node_dir, (log, whole_log), (records, records_len)) =
        crashed_node(dir.path()).await;
    let listener = TcpListener::bind(&members[&1].raft_addr).await.unwrap();
    let node = start(1, &members, dir.path(), listener).await;
    // The torn record is cut before anything is appended: what follows the whole records is
    // a record the node appended since.
    let now = std::fs::read(&log).unwrap();
    assert_eq!(now[..whole_log.len()], whole_log[..]);
    assert_ne!(
        now.get(whole_log.len()..whole_log.len() + 4),
        Some(&TORN_RECORD[..4])
    );
    assert_eq!(std::fs::metadata(&records).unwrap().len(), records_len);
    assert!(!node_dir.join("incoming-9").exists());
    assert!(!node_dir.join("store-7").exists());
    leader(&[&node]).await;
    propose_publishes(&node, 80..90).await;
    node.cluster.shutdown().await;
    // Appended after a torn record, the entries would be damage before the end of the log.
    let reopened = LogStore::open(&node_dir, 1, LogSync::Never).unwrap();
    assert!(reopened.last_index() > Some(90));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_node_refused_for_its_members_list_leaves_its_directory_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let mut bound = listeners(2).await;
    let members = members(&bound);
    let second = bound.pop().unwrap();
    let first = start(1, &members, dir.path(), bound.pop().unwrap()).await;
    let mut other = members.clone();
    other.get_mut(&1).unwrap().client_addr = "elsewhere:9092".to_owned();
    // Node 2 stopped while it wrote its first record, and while it received a snapshot.
    let node_dir = dir.path().join("node-2");
    std::fs::create_dir_all(&node_dir).unwrap();
    let mut log = b"BRKRAFTL".to_vec();
    log.extend_from_slice(&1u32.to_le_bytes());
    log.extend_from_slice(&TORN_RECORD);
    std::fs::write(node_dir.join("raft-log"), log).unwrap();
    std::fs::write(
        node_dir.join("incoming-0"),
        b"half a snapshot from the leader",
    )
    .unwrap();
    let mut listener = second;
    // Refused twice: with what the crash left, then with no directory at all.
    for _ in 0..2 {
        let before = every_file(&node_dir);
        let refused = Cluster::start(config(2, &other, dir.path()), listener, Memory::new()).await;
        assert!(
            matches!(refused, Err(ClusterError::MembersDiffer { .. })),
            "{refused:?}"
        );
        assert_eq!(
            changed(&before, &every_file(&node_dir)),
            Vec::<PathBuf>::new()
        );
        if node_dir.exists() {
            std::fs::remove_dir_all(&node_dir).unwrap();
        }
        listener = TcpListener::bind(&members[&2].raft_addr).await.unwrap();
    }
    assert!(!node_dir.exists(), "a refused start created the directory");
    let second = start(2, &members, dir.path(), listener).await;
    leader(&[&first, &second]).await;
    for node in [first, second] {
        node.cluster.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_lost_its_first_entries_is_refused_before_anything_changes() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let members = members(std::slice::from_ref(&listener));
    let node = start(1, &members, dir.path(), listener).await;
    leader(&[&node]).await;
    // Too few for a snapshot: the log holds every entry from the first.
    for now_ms in 1..=5 {
        node.cluster
            .propose(Proposal::Tick { now_ms })
            .await
            .unwrap();
    }
    node.cluster.shutdown().await;
    // The first record goes, as if the segment holding it had; the last is torn.
    let node_dir = dir.path().join("node-1");
    let log = node_dir.join("raft-log");
    let mut bytes = std::fs::read(&log).unwrap();
    let first_length = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    bytes.drain(12..20 + first_length);
    bytes.extend_from_slice(&TORN_RECORD);
    std::fs::write(&log, bytes).unwrap();
    let before = every_file(&node_dir);
    let listener = TcpListener::bind(&members[&1].raft_addr).await.unwrap();
    let refused = Cluster::start(config(1, &members, dir.path()), listener, Memory::new()).await;
    let refusal = refused.unwrap_err().to_string();
    assert!(refusal.contains("where entry 0 should be"), "{refusal}");
    assert_eq!(
        changed(&before, &every_file(&node_dir)),
        Vec::<PathBuf>::new()
    );
}

/// Node `node`'s part in group `group` of `voters`, its files in the node's `group-<id>`.
async fn host(
    node: &Node,
    group: GroupId,
    voters: &BTreeMap<NodeId, ClusterNode>,
    dir: &Path,
) -> Node {
    let id = node.cluster.node_id();
    let config = GroupConfig {
        sync: LogSync::Never,
        snapshot_every: 50,
        cached_log_bytes: 0,
        ..GroupConfig::new(dir.join(format!("node-{id}/group-{group}")), voters.clone())
    };
    let replica = Memory::new();
    let cluster = node
        .cluster
        .host_group(group, config, Arc::clone(&replica))
        .await
        .unwrap();
    Node { cluster, replica }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_given_other_shared_settings_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut bound = listeners(3).await;
    let members = members(&bound);
    let mut nodes = Vec::new();
    for (index, listener) in bound.drain(..).enumerate() {
        let id = index as NodeId + 1;
        let replicas = if id == 3 { 2 } else { 3 };
        let config = ClusterConfig {
            shared_settings: vec![format!("cluster-replicas={replicas}"), "same=1".to_owned()],
            ..config(id, &members, dir.path())
        };
        let replica = Memory::new();
        let cluster = Cluster::start(config, listener, Arc::clone(&replica))
            .await
            .unwrap();
        nodes.push(Node { cluster, replica });
    }
    let all: Vec<&Node> = nodes.iter().collect();
    leader(&all).await;
    let (two, three) = (
        "cluster-replicas=2".to_owned(),
        "cluster-replicas=3".to_owned(),
    );
    assert_eq!(
        nodes[0].cluster.settings_apart().await,
        [(3, two.clone(), three.clone())]
    );
    assert_eq!(
        nodes[2].cluster.settings_apart().await,
        [(1, three.clone(), two.clone()), (2, three, two)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_holding_no_copy_of_a_group_finds_its_leader_through_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let (members, nodes) = start_three(dir.path()).await;
    let first: Vec<&Node> = nodes.iter().flatten().collect();
    leader(&first).await;
    // Group 2's voters are nodes 1 and 2; node 3 hosts it without a copy.
    let voters: BTreeMap<NodeId, ClusterNode> = members
        .iter()
        .filter(|(id, _)| **id != 3)
        .map(|(id, node)| (*id, node.clone()))
        .collect();
    let mut second = Vec::new();
    for node in &first {
        second.push(host(node, 2, &voters, dir.path()).await);
    }
    let two: Vec<&Node> = second[..2].iter().collect();
    let at = leader(&two).await;
    let (leader_id, leader_node) = (
        two[at].cluster.node_id(),
        members[&two[at].cluster.node_id()].clone(),
    );
    assert!(second[0].cluster.is_member() && second[1].cluster.is_member());
    let outsider = &second[2].cluster;
    assert!(!outsider.is_member());
    // It knows no leader by itself; its peers name it, and it tells its callers.
    assert_eq!(
        outsider.find_leader().await,
        Some((leader_id, leader_node.clone()))
    );
    assert_eq!(outsider.status().leader, Some(leader_id));
    let refused = outsider
        .propose(Proposal::Commands {
            now_ms: 1_000,
            commands: vec![create_topic()],
        })
        .await;
    assert!(
        matches!(&refused, Err(ProposeError::NotLeader { leader: Some((id, _)) }) if *id == leader_id),
        "{refused:?}"
    );
    // A proposal it forwards is applied by the leader; it cannot read a copy it does not hold.
    let applied = outsider
        .propose_via_leader(Proposal::Commands {
            now_ms: 1_000,
            commands: vec![create_topic()],
        })
        .await
        .unwrap();
    assert_eq!(applied.results, vec![Ok(Outcome::Created(true))]);
    let unread = outsider.read_barrier_anywhere().await;
    assert!(
        matches!(unread, Err(ProposeError::Unavailable(_))),
        "{unread:?}"
    );
    assert!(second[2].replica.image().topics.is_empty());
    // Holding nothing of the group, it grants no vote, whatever the candidate's term: a node
    // that dropped a copy the group gave up must not elect a voter that missed the changes.
    let mut link = Network::new(2, Some("secret".to_owned()), None)
        .for_group(2)
        .new_client(3, &members[&3])
        .await;
    let vote = openraft::raft::VoteRequest::new(openraft::Vote::new(99, 2), None);
    let option = openraft::network::RPCOption::new(Duration::from_secs(2));
    let answer = link.vote(vote, option).await.unwrap();
    assert!(!answer.vote_granted, "{answer:?}");
    assert!(answer.vote.leader_id().term < 99, "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_hosted_by_the_same_nodes_replicate_and_elect_apart() {
    let dir = tempfile::tempdir().unwrap();
    let (members, nodes) = start_three(dir.path()).await;
    let first: Vec<&Node> = nodes.iter().flatten().collect();
    let first_leader = leader(&first).await;
    let first_leader_id = first[first_leader].cluster.node_id();
    // The first group records that group 2 exists and holds topic t, on every node.
    let add = ClusterChange::AddGroup {
        group: 2,
        voters: members.keys().copied().collect(),
    };
    let follower = (first_leader + 1) % 3;
    let refused = first[follower].cluster.change_cluster(add.clone()).await;
    assert!(
        matches!(refused, Err(ProposeError::NotLeader { .. })),
        "{refused:?}"
    );
    // (Requests of the first group a follower forwards travel untagged.)
    let forwarded = first[follower]
        .cluster
        .propose_via_leader(Proposal::Tick { now_ms: 1_500 })
        .await
        .unwrap();
    assert!(forwarded.results.is_empty());
    first[follower]
        .cluster
        .read_barrier_anywhere()
        .await
        .unwrap();
    let leading = &first[first_leader].cluster;
    assert_eq!(leading.change_cluster(add).await.unwrap(), 2);
    let place = ClusterChange::Place {
        topic: "t".to_owned(),
        group: 2,
    };
    assert_eq!(leading.change_cluster(place).await.unwrap(), 2);
    for node in &first {
        let mut watched = node.cluster.cluster_state();
        let placed = watched.wait_for(|state| state.group_of("t") == 2);
        tokio::time::timeout(Duration::from_secs(5), placed)
            .await
            .unwrap()
            .unwrap();
    }

    // Group 2 on nodes 1 and 2 now, node 3 later: the two elect a leader and commit.
    let mut second = Vec::new();
    for node in &first[..2] {
        second.push(Some(host(node, 2, &members, dir.path()).await));
    }
    let two: Vec<&Node> = second.iter().flatten().collect();
    let at = leader(&two).await;
    assert_eq!(two[at].cluster.group(), 2);
    let applied = two[at]
        .cluster
        .propose(Proposal::Commands {
            now_ms: 1_000,
            commands: vec![create_topic()],
        })
        .await
        .unwrap();
    assert_eq!(applied.results, vec![Ok(Outcome::Created(true))]);
    propose_publishes(two[at], 0..80).await;
    converged(&two, 80).await;
    // A follower of group 2 has its changes applied by the leader, and reads what it wrote.
    let follower = &two[1 - at];
    for index in 80..90 {
        let applied = follower
            .cluster
            .propose_via_leader(Proposal::Commands {
                now_ms: 2_000,
                commands: vec![publish(index)],
            })
            .await
            .unwrap();
        assert_eq!(applied.results, vec![Ok(Outcome::Published(index as i64))]);
        follower.cluster.read_barrier_anywhere().await.unwrap();
        let end = follower.replica.state.lock().unwrap().end_offset("t", 0);
        assert_eq!(end, Ok(index as i64 + 1), "a read after the write sees it");
    }
    converged(&two, 90).await;
    // Node 3, which hosted no group 2 meanwhile, catches up once it does (from a snapshot:
    // the log before entry 50 is gone).
    second.push(Some(host(first[2], 2, &members, dir.path()).await));
    let two: Vec<&Node> = second.iter().flatten().collect();
    converged(&two, 90).await;
    assert_eq!(first[2].cluster.hosted_groups(), [1, 2]);

    // The first group holds none of it, and its leader did not change.
    for node in &first {
        assert!(node.replica.image().topics.is_empty());
    }
    assert_eq!(leader(&first).await, first_leader);

    // Group 2's leadership moves to a node that does not lead group 1; group 1's stays.
    let at = leader(&two).await;
    let to = (1..=3)
        .find(|id| *id != first_leader_id && *id != two[at].cluster.node_id())
        .unwrap();
    two[at]
        .cluster
        .transfer_leadership(to, Duration::from_secs(5))
        .await
        .unwrap();
    let at = leader(&two).await;
    assert_eq!(two[at].cluster.node_id(), to);
    assert_eq!(leader(&first).await, first_leader);

    // Group 2 stops on its leader: the other two elect another and go on, and group 1 with
    // them; back from its files, the node catches up.
    let stopped = second[at].take().unwrap();
    stopped.cluster.shutdown().await;
    assert_eq!(first[at].cluster.hosted_groups(), [1]);
    let rest: Vec<&Node> = second.iter().flatten().collect();
    let now = leader(&rest).await;
    propose_publishes(rest[now], 90..100).await;
    converged(&rest, 100).await;
    first[first_leader]
        .cluster
        .propose(Proposal::Tick { now_ms: 5_000 })
        .await
        .unwrap();
    second[at] = Some(host(first[at], 2, &members, dir.path()).await);
    let two: Vec<&Node> = second.iter().flatten().collect();
    converged(&two, 100).await;
    assert!(dir.path().join(format!("node-{to}/group-2")).is_dir());

    // A group is hosted once.
    let again = first[0]
        .cluster
        .host_group(
            2,
            GroupConfig::new(dir.path().join("elsewhere"), members.clone()),
            Memory::new(),
        )
        .await
        .unwrap_err();
    assert!(
        again.to_string().contains("hosted by this node already"),
        "{again}"
    );

    // With a node down, the cluster's state takes changes still: every member was found able
    // to apply them before the first.
    let down = (first_leader + 1) % 3;
    second[down].take().unwrap().cluster.shutdown().await;
    first[down].cluster.shutdown().await;
    let place = ClusterChange::Place {
        topic: "u".to_owned(),
        group: 2,
    };
    // Whichever of the two running nodes leads now (the one that led may have lost an
    // election meanwhile): asked of another, the change is answered `NotLeader`, and tried
    // again at the leader.
    let running: Vec<&Node> = (0..3)
        .filter(|&at| at != down)
        .map(|at| first[at])
        .collect();
    let mut placed = None;
    for _ in 0..5 {
        let leading = &running[leader(&running).await].cluster;
        match leading.change_cluster(place.clone()).await {
            Err(ProposeError::NotLeader { .. }) => continue,
            result => {
                placed = Some(result.unwrap());
                break;
            }
        }
    }
    assert_eq!(placed, Some(2), "no leader took the change in five tries");

    for node in second.iter().flatten() {
        node.cluster.shutdown().await;
    }
    for node in &first {
        node.cluster.shutdown().await;
    }
}

/// The cluster's state changes by its entries, goes into snapshots (format 6, sent as stream
/// version 5) and comes back from them at a restart and on the node that receives one; a
/// cluster without groups writes and sends its checkpoint alone (format 5, stream version 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clusters_state_travels_with_snapshots_only_once_it_holds_something() {
    let dir = tempfile::tempdir().unwrap();
    let leader_dir = dir.path().join("leader");
    let mut machine = StateMachine::open(&leader_dir, Memory::new(), 4096).unwrap();
    apply_all(&mut machine, 1, create_and_publish(0..5)).await;
    take_snapshot(&mut machine).await;
    let format = |dir: &Path| {
        let bytes = std::fs::read(dir.join("snapshot")).unwrap();
        u32::from_le_bytes(bytes[8..12].try_into().unwrap())
    };
    assert_eq!(format(&leader_dir), 5, "no groups: a checkpoint alone");
    let (_, bytes) = sent_bytes(&mut machine).await;
    assert_eq!(
        bytes[8..12],
        4u32.to_le_bytes(),
        "sent as a checkpoint alone"
    );

    let changes = vec![
        Proposal::Cluster(ClusterChange::AddGroup {
            group: 2,
            voters: [1, 2, 3].into(),
        }),
        Proposal::Cluster(ClusterChange::Place {
            topic: "new".to_owned(),
            group: 2,
        }),
        // The first group's topic stays there.
        Proposal::Cluster(ClusterChange::Place {
            topic: "t".to_owned(),
            group: 2,
        }),
    ];
    let applied = apply_all(&mut machine, 7, changes).await;
    let answers: Vec<_> = applied.iter().map(|applied| applied.group).collect();
    assert_eq!(answers, [Some(2), Some(2), Some(FIRST_GROUP)]);
    let expected = ClusterState {
        departures: BTreeMap::new(),
        arrivals: BTreeMap::new(),
        groups: [(2, [1, 2, 3].into())].into(),
        placement: [("new".to_owned(), 2)].into(),
    };
    let watched = machine.cluster_state();
    assert_eq!(*watched.borrow(), expected);
    take_snapshot(&mut machine).await;
    assert_eq!(format(&leader_dir), 6);
    let (meta, bytes) = sent_bytes(&mut machine).await;
    assert_eq!(bytes[8..12], 5u32.to_le_bytes());

    // Back at a restart, and on a node that receives the snapshot.
    drop(machine);
    let mut machine = StateMachine::open(&leader_dir, Memory::new(), 4096).unwrap();
    assert_eq!(*machine.cluster_state().borrow(), expected);
    let follower_dir = dir.path().join("follower");
    let follower = Memory::new();
    let mut other = StateMachine::open(&follower_dir, Arc::clone(&follower), 4096).unwrap();
    let watched = other.cluster_state();
    receive(&mut other, &meta, &bytes).await.unwrap();
    assert_eq!(*watched.borrow(), expected);
    assert!(follower.state.lock().unwrap().holds_topic("t"));
    let (_, again) = sent_bytes(&mut other).await;
    assert_eq!(again, bytes, "the follower sends what it received");
    assert_eq!(sent_bytes(&mut machine).await.1, bytes);
}

/// Copies the directory `from` and everything under it to `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        match entry.file_type().unwrap().is_dir() {
            true => copy_tree(&entry.path(), &target),
            false => {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
}

/// The snapshot of `tests/fixtures/cluster-v2` (made by `tests/fixtures/make-cluster-v2.sh` with
/// a release from before the cluster's groups, format 2) opens with an empty cluster state; once
/// the cluster's state holds something, the next snapshot is written in format 6, and opens
/// with the same records and that state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_format_2_opens_and_takes_the_clusters_state_after_it() {
    use openraft::storage::RaftStateMachine;
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/cluster-v2/raft");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture.join("snapshot"), dir.path().join("snapshot")).unwrap();
    copy_tree(&fixture.join("store-0"), &dir.path().join("store-0"));
    let replica = Memory::new();
    let mut machine = StateMachine::open(dir.path(), Arc::clone(&replica), 4096).unwrap();
    assert!(machine.has_snapshot());
    assert!(machine.cluster_state().borrow().is_empty());
    let opened = replica.contents();
    assert!(
        replica.on_disk() > 0,
        "format 2 keeps its records in segments"
    );
    let (applied, _) = machine.applied_state().await.unwrap();
    let next = applied.unwrap().index + 1;
    let add = Proposal::Cluster(ClusterChange::AddGroup {
        group: 2,
        voters: [1].into(),
    });
    apply_all(&mut machine, next, vec![add]).await;
    take_snapshot(&mut machine).await;
    let written = std::fs::read(dir.path().join("snapshot")).unwrap();
    assert_eq!(&written[8..12], &6u32.to_le_bytes(), "written in format 6");
    drop(machine);
    let reopened = Memory::new();
    let machine = StateMachine::open(dir.path(), Arc::clone(&reopened), 4096).unwrap();
    assert_eq!(reopened.contents(), opened);
    assert_eq!(
        machine.cluster_state().borrow().groups,
        [(2, [1].into())].into()
    );
}

/// Three nodes of a new cluster in `dir`, with a follower of the first leader shut down: the
/// members, the nodes (`None` for the one down) and the index of the one down.
async fn three_with_a_follower_down(
    dir: &Path,
) -> (BTreeMap<NodeId, ClusterNode>, Vec<Option<Node>>, usize) {
    let (members, mut nodes) = start_three(dir).await;
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    let at = leader(&all).await;
    let down = (at + 1) % 3;
    nodes[down].take().unwrap().cluster.shutdown().await;
    (members, nodes, down)
}

/// The first change to the cluster's state waits until every member answers that it can apply
/// it (a node of an earlier release would stop at the entry): refused, naming the node, while
/// one is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_change_to_the_clusters_state_waits_for_every_member() {
    let dir = tempfile::tempdir().unwrap();
    let (members, mut nodes, down) = three_with_a_follower_down(dir.path()).await;
    let down_id = down as NodeId + 1;
    let rest: Vec<&Node> = nodes.iter().flatten().collect();
    let leading = &rest[leader(&rest).await].cluster;
    let add = ClusterChange::AddGroup {
        group: 2,
        voters: members.keys().copied().collect(),
    };
    match leading.change_cluster(add.clone()).await {
        Err(ProposeError::Refused(why)) => {
            assert!(why.contains(&format!("node {down_id} ")), "{why}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        leading.cluster_state().borrow().is_empty(),
        "nothing proposed"
    );
    let listener = TcpListener::bind(&members[&down_id].raft_addr)
        .await
        .unwrap();
    nodes[down] = Some(start(down_id, &members, dir.path(), listener).await);
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    let leading = &all[leader(&all).await].cluster;
    assert_eq!(leading.change_cluster(add).await.unwrap(), 2);
    for node in nodes.iter().flatten() {
        node.cluster.shutdown().await;
    }
}

/// In the place of `node`, a peer that reads what it is sent and closes the connection, as a
/// node of an earlier release does at a question it does not know; abort the task to stop it.
async fn answer_as_an_earlier_release(node: &ClusterNode) -> tokio::task::JoinHandle<()> {
    let earlier = TcpListener::bind(&node.raft_addr).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = earlier.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buffer = [0; 4096];
                let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buffer).await;
            });
        }
    })
}

/// The first entry of commands under other name rules waits for no member that cannot be
/// reached, but is refused, naming it, while a member closes the connection at the question,
/// as a node of an earlier release does (it would stop at the entry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_under_kafkas_names_are_refused_while_a_member_of_an_earlier_release_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (members, nodes, down) = three_with_a_follower_down(dir.path()).await;
    let down_id = down as NodeId + 1;
    let create = |topic: &str| {
        vec![Command::Create {
            topic: topic.to_owned(),
            partition_count: 1,
            key_hash: KeyHash::default(),
            settings: Vec::new(),
        }]
    };
    let named =
        |topic: &str| Proposal::commands(1_000, broker_core::NameRules::Kafka, create(topic));
    // In its place, a peer that reads what it is sent and closes the connection.
    let closing = answer_as_an_earlier_release(&members[&down_id]).await;
    let rest: Vec<&Node> = nodes.iter().flatten().collect();
    let leading = &rest[leader(&rest).await].cluster;
    match leading.propose(named("a.b")).await {
        Err(ProposeError::Refused(why)) => {
            assert!(why.contains(&format!("node {down_id} ")), "{why}");
        }
        other => panic!("unexpected {other:?}"),
    }
    // Nor the commands of protocol version 14, which a node of an earlier release could not
    // read either (the server asks before it proposes one), while the earlier ones go on.
    let stored = || {
        Proposal::commands(
            1_000,
            broker_core::NameRules::Broker,
            vec![Command::StoredOffsets {
                topic: "a".to_owned(),
                group: "g".to_owned(),
            }],
        )
    };
    match leading.check_commands(14).await {
        Err(ProposeError::Refused(why)) => {
            assert!(why.contains("protocol version 14"), "{why}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(leading.check_commands(13).await, Ok(()));
    let plain = Proposal::commands(1_000, broker_core::NameRules::Broker, create("a"));
    let applied = leading.propose(plain).await.unwrap();
    assert_eq!(applied.results, vec![Ok(Outcome::Created(true))]);
    // Nothing answers there any more: the member is not waited for.
    closing.abort();
    let _ = closing.await;
    let applied = leading.propose(named("a.b")).await.unwrap();
    assert_eq!(applied.results, vec![Ok(Outcome::Created(true))]);
    assert_eq!(leading.check_commands(14).await, Ok(()));
    let applied = leading.propose(stored()).await.unwrap();
    assert_eq!(
        applied.results,
        vec![Ok(Outcome::StoredOffsets(vec![None]))]
    );
    // A member that could not be reached is asked again a few seconds later, not at every
    // call (each would wait for it): an earlier release answering there meanwhile is heard
    // then.
    let closing = answer_as_an_earlier_release(&members[&down_id]).await;
    assert_eq!(leading.check_commands(14).await, Ok(()));
    tokio::time::sleep(crate::FEATURE_ASKED_AGAIN).await;
    match leading.check_commands(14).await {
        Err(ProposeError::Refused(why)) => {
            assert!(why.contains("protocol version 14"), "{why}");
        }
        other => panic!("unexpected {other:?}"),
    }
    closing.abort();
    for node in nodes.iter().flatten() {
        node.cluster.shutdown().await;
    }
}

/// The entries of `range`'s publishes to topic `t`, one per entry.
fn publish_entries(range: std::ops::Range<usize>) -> Vec<Proposal> {
    range
        .map(|index| Proposal::Commands {
            now_ms: 1_000,
            commands: vec![publish(index)],
        })
        .collect()
}

/// A topic leaving a group is refused every call from its departure on, goes into snapshots
/// with the departure (format 7, sent as stream version 6), arrives whole in another group's
/// state machine (once, however often the arrival is applied), and once gone stays refused in
/// the group it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_moves_to_another_groups_state_machine_whole_and_is_refused_where_it_left() {
    let dir = tempfile::tempdir().unwrap();
    let source_dir = dir.path().join("source");
    let source = Memory::new();
    let mut machine = StateMachine::open(&source_dir, Arc::clone(&source), 4096).unwrap();
    apply_all(&mut machine, 1, create_and_publish(0..5)).await;
    // Some of its records on disk, some in memory.
    take_snapshot(&mut machine).await;
    apply_all(&mut machine, 7, publish_entries(5..8)).await;
    assert!(source.on_disk() > 0);

    let depart = Proposal::Cluster(ClusterChange::Depart {
        topic: "t".to_owned(),
        to: 3,
    });
    let elsewhere = Proposal::Cluster(ClusterChange::Depart {
        topic: "t".to_owned(),
        to: 4,
    });
    let mut entries = vec![depart.clone(), elsewhere];
    entries.extend(publish_entries(8..9));
    let applied = apply_all(&mut machine, 10, entries).await;
    let answers: Vec<_> = applied.iter().map(|applied| applied.group).collect();
    assert_eq!(
        answers[..2],
        [Some(3), Some(3)],
        "it leaves for the first group named"
    );
    assert!(
        matches!(&applied[2].results[..], [Err(BrokerError::Moving { topic })] if topic == "t"),
        "{:?}",
        applied[2].results
    );
    let leaving = Departure { to: 3, gone: false };
    assert_eq!(
        machine.cluster_state().borrow().departures,
        [("t".to_owned(), leaving)].into()
    );

    // The departure goes into snapshots and comes back from them.
    take_snapshot(&mut machine).await;
    let written = std::fs::read(source_dir.join("snapshot")).unwrap();
    assert_eq!(&written[8..12], &7u32.to_le_bytes(), "written in format 7");
    let (_, sent) = sent_bytes(&mut machine).await;
    assert_eq!(sent[8..12], 6u32.to_le_bytes(), "sent as version 6");
    drop(machine);
    let mut machine = StateMachine::open(&source_dir, Arc::clone(&source), 4096).unwrap();
    assert_eq!(
        machine.cluster_state().borrow().departures,
        [("t".to_owned(), leaving)].into()
    );

    // Its records are staged in the other group piece by piece: a piece sent again is staged
    // once, a piece after a missing one or of an earlier sending is refused, a later sending
    // starts over; an arrival short of pieces is refused, one with all of them arrives, once.
    let image = source.state.lock().unwrap().export_topic("t").unwrap();
    assert_eq!(image.partitions[0].records.len(), 8);
    let mut bare = image.clone();
    let records = std::mem::take(&mut bare.partitions[0].records);
    let target = Memory::new();
    let target_dir = dir.path().join("target");
    let mut other = StateMachine::open(&target_dir, Arc::clone(&target), 4096).unwrap();
    let stage = |attempt, piece, records: &[broker_core::image::RecordImage]| {
        Proposal::Cluster(ClusterChange::Stage {
            topic: "t".to_owned(),
            attempt,
            piece,
            partition: 0,
            records: records.to_vec(),
        })
    };
    let arrive = |attempt| {
        Proposal::Cluster(ClusterChange::Arrive {
            topic: "t".to_owned(),
            attempt,
            image: Box::new(bare.clone()),
        })
    };
    let entries = vec![
        stage(5, 0, &records[..2]),
        stage(5, 2, &records[4..]),
        stage(5, 1, &records[2..4]),
        stage(5, 1, &records[2..4]),
        stage(4, 2, &records[4..]),
        // Short of a piece: refused, and what was staged is dropped.
        arrive(5),
        // A later sending starts over.
        stage(6, 0, &records[..4]),
    ];
    let applied = apply_all(&mut other, 1, entries).await;
    let results: Vec<_> = applied
        .iter()
        .map(|applied| applied.results.clone())
        .collect();
    let moving = || {
        Err(BrokerError::Moving {
            topic: "t".to_owned(),
        })
    };
    assert_eq!(
        results,
        [
            vec![Ok(Outcome::Offset(1))],
            vec![moving()],
            vec![Ok(Outcome::Offset(2))],
            vec![Ok(Outcome::Offset(2))],
            vec![moving()],
            vec![moving()],
            vec![Ok(Outcome::Offset(1))],
        ]
    );
    assert!(!target.holds_topic("t"));
    // Staged records go into snapshots (format 7) and come back from them.
    take_snapshot(&mut other).await;
    let written = std::fs::read(target_dir.join("snapshot")).unwrap();
    assert_eq!(&written[8..12], &7u32.to_le_bytes());
    drop(other);
    let mut other = StateMachine::open(&target_dir, Arc::clone(&target), 4096).unwrap();
    let staging = other.cluster_state().borrow().arrivals["t"].clone();
    assert_eq!((staging.attempt, staging.next_piece), (6, 1));
    assert_eq!(staging.partitions, [records[..4].to_vec()]);
    let entries = vec![stage(6, 1, &records[4..]), arrive(6), arrive(6)];
    let applied = apply_all(&mut other, 8, entries).await;
    let results: Vec<_> = applied
        .iter()
        .map(|applied| applied.results.clone())
        .collect();
    assert_eq!(
        results,
        [
            vec![Ok(Outcome::Offset(2))],
            vec![Ok(Outcome::Created(true))],
            vec![Ok(Outcome::Created(false))]
        ]
    );
    assert!(other.cluster_state().borrow().arrivals.is_empty());
    let mut arrived = target.state.lock().unwrap().export_topic("t").unwrap();
    arrived.id = image.id;
    assert_eq!(arrived, image);
    let applied = apply_all(&mut other, 11, publish_entries(8..9)).await;
    assert!(
        matches!(&applied[0].results[..], [Ok(Outcome::Published(8))]),
        "{:?}",
        applied[0].results
    );

    // Gone from the group it left, where calls are still refused; it stays gone.
    let departed = Proposal::Cluster(ClusterChange::Departed {
        topic: "t".to_owned(),
    });
    let stay = Proposal::Cluster(ClusterChange::Stay {
        topic: "t".to_owned(),
    });
    let mut entries = vec![departed.clone(), departed, stay];
    entries.extend(publish_entries(9..10));
    let applied = apply_all(&mut machine, 13, entries).await;
    let results: Vec<_> = applied[..2].iter().map(|a| a.results.clone()).collect();
    assert_eq!(
        results,
        [
            vec![Ok(Outcome::Deleted(true))],
            vec![Ok(Outcome::Deleted(false))]
        ]
    );
    assert!(matches!(
        &applied[3].results[..],
        [Err(BrokerError::Moving { .. })]
    ));
    assert!(!source.holds_topic("t"));
    assert_eq!(
        machine.cluster_state().borrow().departures,
        [("t".to_owned(), Departure { to: 3, gone: true })].into()
    );
}

/// A topic's arrival as a release before state images of version 5 proposed it
/// (`ClusterChange::ArriveImage4`, at the place `Arrive` had in those releases' logs) still
/// applies, as the same topic with every offset of its groups counted as stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arrival_logged_by_an_earlier_release_still_applies() {
    use broker_core::image::v4;
    let dir = tempfile::tempdir().unwrap();
    let source = Memory::new();
    let mut machine =
        StateMachine::open(&dir.path().join("source"), Arc::clone(&source), 4096).unwrap();
    apply_all(&mut machine, 1, create_and_publish(0..3)).await;
    let group = Command::CommitGroup {
        topic: "t".to_owned(),
        group: "g".to_owned(),
        offsets: vec![(0, 1)],
    };
    apply_all(
        &mut machine,
        5,
        vec![Proposal::Commands {
            now_ms: 1_000,
            commands: vec![group],
        }],
    )
    .await;
    let mut image = source.state.lock().unwrap().export_topic("t").unwrap();
    let records = std::mem::take(&mut image.partitions[0].records);
    let old = v4::TopicImage {
        id: image.id,
        key_hash: image.key_hash,
        retention: image.retention,
        max_records: image.max_records,
        max_bytes: image.max_bytes,
        max_age_ms: image.max_age_ms,
        discard: image.discard,
        next_keyless: image.next_keyless,
        partitions: image.partitions.clone(),
        groups: image
            .groups
            .iter()
            .map(|(name, group)| {
                let partitions = group
                    .partitions
                    .iter()
                    .map(|state| v4::GroupPartitionImage {
                        owner: state.owner,
                        committed: state.committed,
                        position: state.position,
                        in_flight: state.in_flight,
                        delivered_at_ms: state.delivered_at_ms,
                        deliveries: state.deliveries,
                        skipped: state.skipped,
                    })
                    .collect();
                let group = v4::GroupImage {
                    assignor: group.assignor,
                    start_at: group.start_at,
                    ack_timeout_ms: group.ack_timeout_ms,
                    max_deliveries: group.max_deliveries,
                    dead_letter: group.dead_letter.clone(),
                    members: group.members.clone(),
                    partitions,
                };
                (name.clone(), group)
            })
            .collect(),
        producers: image.producers.clone(),
    };
    let arrive = Proposal::Cluster(ClusterChange::ArriveImage4 {
        topic: "t".to_owned(),
        attempt: 1,
        image: Box::new(old),
    });
    let encoded = crate::codec::encode(&arrive).unwrap();
    assert_eq!(encoded[..4], 2u32.to_le_bytes(), "Proposal::Cluster");
    assert_eq!(encoded[4..8], 6u32.to_le_bytes(), "where Arrive was");
    let stage = Proposal::Cluster(ClusterChange::Stage {
        topic: "t".to_owned(),
        attempt: 1,
        piece: 0,
        partition: 0,
        records,
    });
    let target = Memory::new();
    let mut other =
        StateMachine::open(&dir.path().join("target"), Arc::clone(&target), 4096).unwrap();
    let applied = apply_all(&mut other, 1, vec![stage, arrive]).await;
    assert_eq!(applied[1].results, [Ok(Outcome::Created(true))]);
    let stored = target
        .state
        .lock()
        .unwrap()
        .stored_offsets("t", "g")
        .unwrap();
    assert!(stored.iter().all(Option::is_some), "{stored:?}");
    assert_eq!(stored[0], Some(1));
}

/// The entries of a member polling `topic`'s only record twice with a maximum of one
/// delivery: at `at_ms`, then 100 ms later, past the group's acknowledgement timeout of 10 ms
/// and before any tick. Under the original rules the second poll delivers the record again;
/// from revision 1 on it moves the record to `<topic>-dlq` instead.
fn poll_past_the_timeout(topic: &str, at_ms: i64) -> Vec<Proposal> {
    let settings = vec![
        broker_core::GroupSetting::MaxDeliveries(1),
        broker_core::GroupSetting::DeadLetter(
            broker_core::TopicName::new(&format!("{topic}-dlq")).unwrap(),
        ),
        broker_core::GroupSetting::AckTimeoutMs(10),
    ];
    let poll = Command::Poll {
        topic: topic.to_owned(),
        group: "g".to_owned(),
        member: "m".to_owned(),
        max_records: 1,
        max_bytes: None,
    };
    let setup = vec![
        Command::Create {
            topic: topic.to_owned(),
            partition_count: 1,
            key_hash: KeyHash::default(),
            settings: Vec::new(),
        },
        Command::Join {
            topic: topic.to_owned(),
            group: "g".to_owned(),
            member: "m".to_owned(),
            assignor: None,
            settings,
        },
        Command::Publish {
            topic: topic.to_owned(),
            partition: 0,
            payload: "x".into(),
        },
    ];
    vec![
        Proposal::Commands {
            now_ms: at_ms,
            commands: setup,
        },
        Proposal::Commands {
            now_ms: at_ms,
            commands: vec![poll.clone()],
        },
        Proposal::Commands {
            now_ms: at_ms + 100,
            commands: vec![poll],
        },
    ]
}

/// Proposes `entries` through `leading`; the delivery counts the last one's poll answered.
async fn delivery_counts(leading: &Cluster, entries: Vec<Proposal>) -> Vec<u32> {
    let mut last = None;
    for entry in entries {
        last = Some(leading.propose(entry).await.unwrap());
    }
    match last.map(|applied| applied.results) {
        Some(results) => match &results[..] {
            [Ok(Outcome::Records(records))] => {
                records.iter().map(|record| record.delivery_count).collect()
            }
            other => panic!("unexpected {other:?}"),
        },
        None => Vec::new(),
    }
}

/// Waits until every node's state equals the first's.
async fn same_state(nodes: &[&Node]) {
    for _ in 0..200 {
        let images: Vec<StateImage> = nodes.iter().map(|node| node.replica.contents()).collect();
        if images.iter().all(|image| *image == images[0]) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the nodes did not converge");
}

/// While a member closes the connection at the question, as a node of an earlier release
/// does, the leader's entries apply under the original rules, which that node applies too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_keep_the_original_rules_while_a_member_of_an_earlier_release_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (members, nodes, down) = three_with_a_follower_down(dir.path()).await;
    let down_id = down as NodeId + 1;
    let closing = answer_as_an_earlier_release(&members[&down_id]).await;
    let rest: Vec<&Node> = nodes.iter().flatten().collect();
    let at = leader(&rest).await;
    assert!(!rest[at].cluster.adopt_revision().await);
    let counts = delivery_counts(&rest[at].cluster, poll_past_the_timeout("a", 1_000)).await;
    assert_eq!(
        counts,
        [2],
        "delivered again, as every earlier release does"
    );
    same_state(&rest).await;
    assert!(rest.iter().all(|node| !node.replica.holds_topic("a-dlq")));
    closing.abort();
    let _ = closing.await;
    for node in nodes.iter().flatten() {
        node.cluster.shutdown().await;
    }
}

/// Once every member answers that it applies them, the leader's entries carry revision 1:
/// every replica applies them under it, so does a node that restarts from its log, and a
/// follower that applied them goes on proposing them when it leads, with a member down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_carry_the_newest_rules_once_every_member_applies_them() {
    let dir = tempfile::tempdir().unwrap();
    let (members, mut nodes) = start_three(dir.path()).await;
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    let at = leader(&all).await;
    // Before it asked, the leader's entries keep the original rules.
    let counts = delivery_counts(&all[at].cluster, poll_past_the_timeout("a", 1_000)).await;
    assert_eq!(counts, [2]);
    assert!(all[at].cluster.adopt_revision().await);
    let counts = delivery_counts(&all[at].cluster, poll_past_the_timeout("b", 2_000)).await;
    assert!(counts.is_empty(), "delivered past the maximum: {counts:?}");
    same_state(&all).await;
    for node in &all {
        assert!(!node.replica.holds_topic("a-dlq"));
        assert!(node.replica.holds_topic("b-dlq"));
    }
    // A follower restarts from its files: each entry applies again under its own revision.
    let follower = (at + 1) % 3;
    let before = all[follower].replica.contents();
    let id = follower as NodeId + 1;
    nodes[follower].take().unwrap().cluster.shutdown().await;
    let listener = TcpListener::bind(&members[&id].raft_addr).await.unwrap();
    nodes[follower] = Some(start(id, &members, dir.path(), listener).await);
    let all: Vec<&Node> = nodes.iter().flatten().collect();
    same_state(&all).await;
    assert_eq!(all[follower].replica.contents(), before);
    // The leader goes away: the next one cannot ask it, and keeps the group's rules.
    nodes[at].take().unwrap().cluster.shutdown().await;
    let rest: Vec<&Node> = nodes.iter().flatten().collect();
    let next = leader(&rest).await;
    let counts = delivery_counts(&rest[next].cluster, poll_past_the_timeout("c", 3_000)).await;
    assert!(counts.is_empty(), "delivered past the maximum: {counts:?}");
    same_state(&rest).await;
    assert!(rest.iter().all(|node| node.replica.holds_topic("c-dlq")));
    for node in nodes.iter().flatten() {
        node.cluster.shutdown().await;
    }
}

/// A node notes in its directory that it applied an entry of a later revision, and knows the
/// group's rules from that note after a restart, whatever its snapshot covers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_knows_after_a_restart_that_it_applied_revised_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node");
    let mut machine = StateMachine::open(&path, Memory::new(), 4096).unwrap();
    let flag = machine.revision_applied();
    apply_all(&mut machine, 1, vec![Proposal::Tick { now_ms: 1 }]).await;
    assert!(!flag.load(std::sync::atomic::Ordering::Acquire));
    assert!(!path.join("revision").exists());
    let revised = Proposal::Tick { now_ms: 2 }.revised(broker_core::Revision::Bounded);
    apply_all(&mut machine, 2, vec![revised]).await;
    assert!(flag.load(std::sync::atomic::Ordering::Acquire));
    assert_eq!(std::fs::read_to_string(path.join("revision")).unwrap(), "1");
    drop(machine);
    let reopened = StateMachine::open(&path, Memory::new(), 4096).unwrap();
    assert!(reopened
        .revision_applied()
        .load(std::sync::atomic::Ordering::Acquire));
    drop(reopened);
    // A note it cannot read is no note.
    std::fs::write(path.join("revision"), "soon").unwrap();
    let reopened = StateMachine::open(&path, Memory::new(), 4096).unwrap();
    assert!(!reopened
        .revision_applied()
        .load(std::sync::atomic::Ordering::Acquire));
}
